//! Root CA rotation, as pure functions (SwarmKit's design): checking a root given by the operator, the
//! cross-signed intermediate (the new root's subject and public key, signed by the old root's key) that lets
//! nodes trusting only the old root accept certificates from the new one, and who issued a certificate
//! (the issuer's raw subject and public key, as `NodeTLSInfo` carries them) so the cluster can tell which
//! nodes still hold a certificate from the old root.
//!
//! Only the first certificate of a PEM bundle is a node's own; the rest is its chain. Signatures are not
//! checked here: TLS checks chains, these functions only read what the certificates say.

use std::time::SystemTime;

use rand::{CryptoRng, Rng};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, DnValue, IsCa, Issuer, KeyIdMethod, KeyPair,
    PublicKeyData, SerialNumber,
};
use x509_parser::certificate::X509Certificate;
use x509_parser::der_parser::asn1_rs::Tag;
use x509_parser::extensions::ParsedExtension;

use crate::cert::{parse_cert_pem_chain, RootCa};
use crate::CaError;

/// Who signed a certificate: the issuer's distinguished name and public key (`SubjectPublicKeyInfo`), both
/// DER, as SwarmKit's `NodeTLSInfo.cert_issuer_subject` / `cert_issuer_public_key`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IssuerInfo {
    /// The issuer's raw subject.
    pub subject: Vec<u8>,
    /// The issuer's raw `SubjectPublicKeyInfo`.
    pub public_key: Vec<u8>,
}

fn parse(der: &[u8]) -> Result<X509Certificate<'_>, CaError> {
    x509_parser::parse_x509_certificate(der).map(|(_, c)| c).map_err(|e| CaError::BadCertificate(e.to_string()))
}

/// The issuer a root CA certificate stands for: its own subject and public key. A certificate the root (or
/// its cross-signed twin) signed names exactly this.
pub fn root_issuer_info(root_pem: &[u8]) -> Result<IssuerInfo, CaError> {
    let chain = parse_cert_pem_chain(root_pem)?;
    let root = parse(&chain[0])?;
    Ok(IssuerInfo { subject: root.subject().as_raw().to_vec(), public_key: root.public_key().raw.to_vec() })
}

fn subject_key_id(c: &X509Certificate<'_>) -> Option<Vec<u8>> {
    c.extensions().iter().find_map(|e| match e.parsed_extension() {
        ParsedExtension::SubjectKeyIdentifier(k) => Some(k.0.to_vec()),
        _ => None,
    })
}

fn authority_key_id(c: &X509Certificate<'_>) -> Option<Vec<u8>> {
    c.extensions().iter().find_map(|e| match e.parsed_extension() {
        ParsedExtension::AuthorityKeyIdentifier(a) => a.key_identifier.as_ref().map(|k| k.0.to_vec()),
        _ => None,
    })
}

/// Who issued the first certificate of `chain_pem`: the next certificate of the chain when there is one
/// (a cross-signed intermediate), else the certificate of `trust_pem` (the roots the node trusts) with the
/// issuer's subject and, when both say one, the matching key identifier.
pub fn cert_issuer_info(chain_pem: &[u8], trust_pem: &[u8]) -> Result<IssuerInfo, CaError> {
    let chain = parse_cert_pem_chain(chain_pem)?;
    let leaf = parse(&chain[0])?;
    let subject = leaf.issuer().as_raw().to_vec();
    if let Some(next) = chain.get(1) {
        let next = parse(next)?;
        return Ok(IssuerInfo { subject, public_key: next.public_key().raw.to_vec() });
    }
    let aki = authority_key_id(&leaf);
    let roots = parse_cert_pem_chain(trust_pem)?;
    let mut by_subject = None;
    for der in &roots {
        let root = parse(der)?;
        if root.subject().as_raw() != subject.as_slice() {
            continue;
        }
        let key = root.public_key().raw.to_vec();
        match (&aki, subject_key_id(&root)) {
            (Some(a), Some(s)) if *a == s => return Ok(IssuerInfo { subject, public_key: key }),
            (Some(_), Some(_)) => {}
            _ => {
                by_subject.get_or_insert(key);
            }
        }
    }
    by_subject.map(|public_key| IssuerInfo { subject, public_key }).ok_or_else(|| {
        CaError::BadCertificate("no trusted root issued this certificate (its issuer is not among the roots)".into())
    })
}

/// DER tag and length bytes of a `len`-byte value.
fn der_header(tag: u8, len: usize) -> Vec<u8> {
    let mut out = vec![tag];
    match u8::try_from(len) {
        Ok(short) if short < 0x80 => out.push(short),
        _ => {
            let bytes: Vec<u8> = len.to_be_bytes().into_iter().skip_while(|b| *b == 0).collect();
            out.push(0x80 | u8::try_from(bytes.len()).expect("a usize has at most 8 bytes"));
            out.extend(bytes);
        }
    }
    out
}

/// The value of the DER element at the start of `der` and what follows it: `(tag, value, rest)`.
pub(crate) fn der_element(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (first as usize, rest)
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        (rest[..n].iter().fold(0usize, |acc, b| (acc << 8) | *b as usize), &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// An EC private key as PKCS#8 PEM (what the CA signs with): a PKCS#8 key (`PRIVATE KEY`) as given, a SEC1 one
/// (`EC PRIVATE KEY`, what `openssl ecparam -genkey` writes and Docker accepts for `--ca-key`) wrapped in a
/// PKCS#8 envelope naming its curve (its own `parameters`, P-256 when it names none).
pub fn key_pem_as_pkcs8(key_pem: &str) -> Result<String, CaError> {
    use base64::Engine as _;
    let bad = |m: &str| CaError::BadCertificate(format!("the root CA key is unusable: {m}"));
    let block = x509_parser::pem::Pem::iter_from_buffer(key_pem.as_bytes())
        .next()
        .ok_or_else(|| bad("no PEM block found"))?
        .map_err(|e| bad(&e.to_string()))?;
    if block.label != "EC PRIVATE KEY" {
        return Ok(key_pem.to_string());
    }
    const EC_PUBLIC_KEY_OID: &[u8] = &[0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
    const P256_OID: &[u8] = &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
    let sec1 = block.contents.as_slice();
    let malformed = || bad("the EC PRIVATE KEY block is not a SEC1 ECPrivateKey");
    let (tag, body, _) = der_element(sec1).ok_or_else(malformed)?;
    let (version_tag, _, body) = der_element(body).filter(|_| tag == 0x30).ok_or_else(malformed)?;
    let (key_tag, _, body) = der_element(body).filter(|_| version_tag == 0x02).ok_or_else(malformed)?;
    if key_tag != 0x04 {
        return Err(malformed());
    }
    // `[0] parameters`: the curve's OID element, when given.
    let curve = match der_element(body) {
        Some((0xa0, oid, _)) => oid,
        _ => P256_OID,
    };
    let mut alg = der_header(0x30, EC_PUBLIC_KEY_OID.len() + curve.len());
    alg.extend_from_slice(EC_PUBLIC_KEY_OID);
    alg.extend_from_slice(curve);
    let mut inner = vec![0x02, 0x01, 0x00];
    inner.extend(alg);
    inner.extend(der_header(0x04, sec1.len()));
    inner.extend_from_slice(sec1);
    let mut pkcs8 = der_header(0x30, inner.len());
    pkcs8.extend(inner);
    let b64 = base64::engine::general_purpose::STANDARD.encode(&pkcs8);
    let mut pem = String::from("-----BEGIN PRIVATE KEY-----\n");
    for line in b64.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
        pem.push('\n');
    }
    pem.push_str("-----END PRIVATE KEY-----\n");
    Ok(pem)
}

/// Checks a root CA the operator gave (`docker swarm ca --rotate --ca-cert [--ca-key]`): one certificate,
/// a CA, valid at `now`; and, when `key_pem` is given, a key (PKCS#8 or SEC1) whose public key is the
/// certificate's.
pub fn check_root(cert_pem: &str, key_pem: Option<&str>, now: SystemTime) -> Result<(), CaError> {
    let bad = |m: String| CaError::BadCertificate(m);
    let chain = parse_cert_pem_chain(cert_pem.as_bytes())?;
    if chain.len() != 1 {
        return Err(bad(format!("the root CA must be one certificate, the PEM holds {}", chain.len())));
    }
    let c = parse(&chain[0])?;
    if !c.is_ca() {
        return Err(bad("the certificate is not a CA certificate (basic constraints CA:TRUE)".into()));
    }
    let t = time::OffsetDateTime::from(now).unix_timestamp();
    let v = c.validity();
    if t < v.not_before.timestamp() || t >= v.not_after.timestamp() {
        return Err(bad("the root CA certificate is not valid now (check its notBefore and notAfter)".into()));
    }
    if let Some(key_pem) = key_pem {
        let key = KeyPair::from_pem(&key_pem_as_pkcs8(key_pem)?).map_err(|e| {
            bad(format!("the root CA key is unusable ({e}); give an unencrypted EC key in PEM (PKCS#8 or SEC1)"))
        })?;
        if key.subject_public_key_info() != c.public_key().raw {
            return Err(bad("the root CA key does not belong to the root CA certificate".into()));
        }
    }
    Ok(())
}

fn dn_of(c: &X509Certificate<'_>) -> Result<DistinguishedName, CaError> {
    let mut dn = DistinguishedName::new();
    for rdn in c.subject().iter() {
        let mut attrs = rdn.iter();
        let (Some(attr), None) = (attrs.next(), attrs.next()) else {
            return Err(CaError::BadCertificate("the root's subject has a multi-valued name part".into()));
        };
        let oid: Vec<u64> = attr
            .attr_type()
            .iter()
            .ok_or_else(|| CaError::BadCertificate("the root's subject has an unreadable name type".into()))?
            .collect();
        let text = std::str::from_utf8(attr.attr_value().data)
            .map_err(|_| CaError::BadCertificate("the root's subject is not text".into()))?;
        let value = match attr.attr_value().header.tag() {
            Tag::Utf8String => DnValue::Utf8String(text.to_string()),
            Tag::PrintableString => DnValue::PrintableString(text.try_into()?),
            Tag::Ia5String => DnValue::Ia5String(text.try_into()?),
            other => {
                return Err(CaError::BadCertificate(format!(
                    "the root's subject uses a string type Shoal cannot copy ({other:?})"
                )))
            }
        };
        dn.push(DnType::from_oid(&oid), value);
    }
    Ok(dn)
}

/// The new root, cross-signed: a CA certificate with `new_root_pem`'s subject, public key, key identifier and
/// validity, issued by `old`. Sent after every certificate the new root signs while the rotation lasts.
pub fn cross_sign(new_root_pem: &str, old: &RootCa, rng: &mut (impl Rng + CryptoRng)) -> Result<String, CaError> {
    let chain = parse_cert_pem_chain(new_root_pem.as_bytes())?;
    let new = parse(&chain[0])?;
    let mut params = CertificateParams::default();
    params.distinguished_name = dn_of(&new)?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    if let Some(ski) = subject_key_id(&new) {
        params.key_identifier_method = KeyIdMethod::PreSpecified(ski);
    }
    params.use_authority_key_identifier_extension = true;
    params.not_before = new.validity().not_before.to_datetime();
    params.not_after = new.validity().not_after.to_datetime();
    let mut serial = [0u8; 16];
    rng.fill(&mut serial);
    serial[0] = (serial[0] & 0x7f) | 0x01;
    params.serial_number = Some(SerialNumber::from_slice(&serial));
    let public = rcgen::SubjectPublicKeyInfo::from_der(new.public_key().raw)?;
    let key = KeyPair::from_pem(old.key_pem())?;
    let issuer = Issuer::from_ca_cert_pem(old.cert_pem(), key)?;
    let pem = params.signed_by(&public, &issuer)?.pem();
    // The intermediate must name the new root exactly, or chains through it would not be built.
    let der = parse_cert_pem_chain(pem.as_bytes())?;
    if parse(&der[0])?.subject().as_raw() != new.subject().as_raw() {
        return Err(CaError::BadCertificate("the new root's subject could not be copied byte for byte".into()));
    }
    Ok(pem)
}

/// Checks that `csr_pem` is a certificate signing request that parses (before it is sent to a signer).
pub fn check_csr(csr_pem: &str) -> Result<(), CaError> {
    rcgen::CertificateSigningRequestParams::from_pem(csr_pem).map(|_| ()).map_err(|e| CaError::BadCsr(e.to_string()))
}

/// Whether the DER certificate `child` carries a valid signature by the key of `issuer` (a DER certificate)
/// and names it as its issuer. ECDSA P-256/SHA-256 and P-384/SHA-384 only (what Shoal and CFSSL issue);
/// other algorithms answer false.
pub fn signed_by(child: &[u8], issuer: &[u8]) -> Result<bool, CaError> {
    use x509_parser::oid_registry::{OID_SIG_ECDSA_WITH_SHA256, OID_SIG_ECDSA_WITH_SHA384};
    let (c, i) = (parse(child)?, parse(issuer)?);
    if c.issuer().as_raw() != i.subject().as_raw() {
        return Ok(false);
    }
    let alg = &c.signature_algorithm.algorithm;
    let scheme: &dyn ring::signature::VerificationAlgorithm = if *alg == OID_SIG_ECDSA_WITH_SHA256 {
        &ring::signature::ECDSA_P256_SHA256_ASN1
    } else if *alg == OID_SIG_ECDSA_WITH_SHA384 {
        &ring::signature::ECDSA_P384_SHA384_ASN1
    } else {
        return Ok(false);
    };
    let key = ring::signature::UnparsedPublicKey::new(scheme, i.public_key().subject_public_key.data.as_ref());
    Ok(key.verify(c.tbs_certificate.as_ref(), c.signature_value.data.as_ref()).is_ok())
}
