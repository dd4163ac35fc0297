//! What the CA reads from callers it does not trust yet: join tokens, unlock keys (`swarm/unlock`, the
//! daemon's `--unlock-key`), CSRs signed by the root CA (node joins, operator client certificates) and
//! certificates (the root CA a joining node downloads and checks).

use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use shoal_ca::{
    parse_cert, parse_cert_pem_chain, parse_join_token, token_matches, NodeSubject, Role, RootCa, UnlockKey,
};

/// Token prefixes and separators.
pub const TOKEN_DICT: &[&str] = &["SWMTKN-1-", "SWMKEY-1-", "-", "0", "z"];

/// PEM armour of CSRs and certificates.
pub const CSR_DICT: &[&str] = &[
    "-----BEGIN CERTIFICATE REQUEST-----\n",
    "-----END CERTIFICATE REQUEST-----\n",
    "-----BEGIN CERTIFICATE-----\n",
    "-----END CERTIFICATE-----\n",
    "MII",
    "\n",
];

/// `SWMTKN-1-<digest>-<secret>` parsing and the constant-time comparison of a candidate.
pub fn join_token(data: &[u8]) {
    let s = String::from_utf8_lossy(data);
    if let Ok(t) = parse_join_token(&s) {
        let _ = t;
    }
    let _ = token_matches(&s, "SWMTKN-1-3pu6hszjas19xyp7ghgosyx9k8atbfcr8p2is99znpy26u2lkl-1awxwuwd3z9j1z3puu7rcgdbx");
}

/// `SWMKEY-1-...` parsing and, for a key that parses, its KEK.
pub fn unlock_key(data: &[u8]) {
    let s = String::from_utf8_lossy(data);
    if let Ok(k) = UnlockKey::parse(&s) {
        let again = UnlockKey::parse(&k.to_human()).expect("a printed unlock key parses");
        assert_eq!(again.as_bytes(), k.as_bytes());
        let _ = k.kek();
    }
    let _ = UnlockKey::from_raw(data);
}

/// The root CA the CSR target signs with, made once.
fn root() -> &'static RootCa {
    static ROOT: OnceLock<RootCa> = OnceLock::new();
    ROOT.get_or_init(|| {
        RootCa::generate(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000), &mut rand::rng())
            .expect("a root CA")
    })
}

/// A CSR signed as the CA does for a joining worker; the certificate it issues must parse back with the
/// subject the CA chose. The first byte chooses the form: odd, the rest is PEM text as sent; even, the rest
/// is the DER the target wraps in PEM armour (so mutations reach the ASN.1 parser, not only base64).
pub fn csr(data: &[u8]) {
    let (sel, rest) = super::split_selector(data);
    let pem = if sel & 1 == 1 {
        String::from_utf8_lossy(rest).into_owned()
    } else {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD.encode(rest);
        format!("-----BEGIN CERTIFICATE REQUEST-----\n{b64}\n-----END CERTIFICATE REQUEST-----\n")
    };
    let subject = NodeSubject { node_id: "node1".into(), role: Role::Worker, cluster_id: "cluster1".into() };
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_100);
    if let Ok(cert) = root().sign_csr(&pem, &subject, Duration::from_secs(3600), now, &mut rand::rng()) {
        let ders = parse_cert_pem_chain(cert.as_bytes()).expect("an issued certificate is PEM");
        let info = parse_cert(&ders[0]).expect("an issued certificate parses");
        assert_eq!(info.subject, subject);
    }
}

/// Certificates: a PEM chain (what a joining node downloads as the root CA) and one DER certificate.
pub fn certificate(data: &[u8]) {
    if let Ok(ders) = parse_cert_pem_chain(data) {
        for der in ders.iter().take(4) {
            let _ = parse_cert(der);
        }
    }
    let _ = parse_cert(data);
    let _ = shoal_ca::ca_cert_hash(data);
}
