//! Tests of the CA's pure functions: a root CA signs node certificates with the subject it chooses, tokens
//! pin the root's digest, and the renewal point stays within 50-80% of the issued life.

use std::time::{Duration, SystemTime};

use rand::rngs::StdRng;
use rand::SeedableRng;

use super::*;

fn t0() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

fn subject(role: Role) -> NodeSubject {
    NodeSubject { node_id: "node0000000000000000000001".into(), role, cluster_id: "cluster000000000000000001".into() }
}

#[test]
fn root_ca_is_swarm_ca_for_twenty_years() {
    let root = RootCa::generate(t0(), &mut rng(1)).unwrap();
    let der = parse_cert_pem_chain(root.cert_pem().as_bytes()).unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(&der[0]).unwrap();
    assert_eq!(cert.subject().iter_common_name().next().unwrap().as_str().unwrap(), ROOT_CN);
    assert!(cert.is_ca());
    let life = cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp();
    assert_eq!(life as u64, (ROOT_CA_VALIDITY + BACKDATE).as_secs());
    let reloaded = RootCa::from_pem(root.cert_pem(), root.key_pem()).unwrap();
    assert_eq!(reloaded.digest(), root.digest());
    assert!(!format!("{root:?}").contains("PRIVATE"), "Debug must not print the key");
}

#[test]
fn signed_node_cert_has_the_subject_the_ca_chose_and_chains_to_the_root() {
    let root = RootCa::generate(t0(), &mut rng(2)).unwrap();
    let csr = generate_node_key_and_csr().unwrap();
    for role in [Role::Manager, Role::Worker, Role::Admin] {
        let pem = root.sign_csr(&csr.csr_pem, &subject(role), Duration::from_secs(7200), t0(), &mut rng(3)).unwrap();
        let der = parse_cert_pem_chain(pem.as_bytes()).unwrap();
        let info = parse_cert(&der[0]).unwrap();
        assert_eq!(info.subject, subject(role));
        assert_eq!(info.not_before, t0() - BACKDATE);
        assert_eq!(info.not_after, t0() + Duration::from_secs(7200));
        // The signature verifies with the root's public key.
        let root_der = parse_cert_pem_chain(root.cert_pem().as_bytes()).unwrap();
        let (_, root_cert) = x509_parser::parse_x509_certificate(&root_der[0]).unwrap();
        let (_, node_cert) = x509_parser::parse_x509_certificate(&der[0]).unwrap();
        node_cert.verify_signature(Some(root_cert.public_key())).unwrap();
    }
}

#[test]
fn manager_certs_name_the_ca_role_as_swarmkit_does() {
    // A Docker Engine's agent dials the CA service under the server name `swarm-ca` and any manager serves it.
    let root = RootCa::generate(t0(), &mut rng(2)).unwrap();
    let csr = generate_node_key_and_csr().unwrap();
    for (role, want) in [
        (Role::Manager, vec!["swarm-manager", "node0000000000000000000001", "swarm-ca"]),
        (Role::Worker, vec!["swarm-worker", "node0000000000000000000001"]),
    ] {
        let pem = root.sign_csr(&csr.csr_pem, &subject(role), Duration::from_secs(7200), t0(), &mut rng(3)).unwrap();
        let der = parse_cert_pem_chain(pem.as_bytes()).unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(&der[0]).unwrap();
        let san = cert.subject_alternative_name().unwrap().expect("a SAN extension");
        let names: Vec<String> = san
            .value
            .general_names
            .iter()
            .filter_map(|n| match n {
                x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
                _ => None,
            })
            .collect();
        assert_eq!(names, want, "{role:?}");
    }
}

#[test]
fn a_foreign_root_does_not_verify_a_node_cert() {
    let root = RootCa::generate(t0(), &mut rng(4)).unwrap();
    let other = RootCa::generate(t0(), &mut rng(5)).unwrap();
    let csr = generate_node_key_and_csr().unwrap();
    let pem =
        root.sign_csr(&csr.csr_pem, &subject(Role::Worker), Duration::from_secs(7200), t0(), &mut rng(6)).unwrap();
    let der = parse_cert_pem_chain(pem.as_bytes()).unwrap();
    let other_der = parse_cert_pem_chain(other.cert_pem().as_bytes()).unwrap();
    let (_, other_cert) = x509_parser::parse_x509_certificate(&other_der[0]).unwrap();
    let (_, node_cert) = x509_parser::parse_x509_certificate(&der[0]).unwrap();
    assert!(node_cert.verify_signature(Some(other_cert.public_key())).is_err());
}

#[test]
fn garbage_csr_is_refused() {
    let root = RootCa::generate(t0(), &mut rng(7)).unwrap();
    let err = root.sign_csr("not a csr", &subject(Role::Worker), Duration::from_secs(3600), t0(), &mut rng(8));
    assert!(matches!(err, Err(CaError::BadCsr(_))), "{err:?}");
}

#[test]
fn token_has_swarmkit_shape_and_pins_the_root_digest() {
    let root = RootCa::generate(t0(), &mut rng(9)).unwrap();
    let token = generate_join_token(&root.digest(), &mut rng(10));
    assert!(token.starts_with("SWMTKN-1-"), "{token}");
    let parts: Vec<&str> = token.split('-').collect();
    assert_eq!(parts.len(), 4, "{token}");
    assert_eq!(parts[2].len(), 50);
    assert_eq!(parts[3].len(), 25);
    assert!(token.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    assert_eq!(parse_join_token(&token).unwrap().ca_digest, root.digest());
    // Seeded: the same seed gives the same secret, another seed another.
    assert_eq!(token, generate_join_token(&root.digest(), &mut rng(10)));
    assert_ne!(token, generate_join_token(&root.digest(), &mut rng(11)));
}

#[test]
fn malformed_tokens_are_refused_with_a_reason() {
    let root = RootCa::generate(t0(), &mut rng(12)).unwrap();
    let good = generate_join_token(&root.digest(), &mut rng(13));
    let cases = [
        ("", "does not start"),
        ("SWMTKN-2-abc-def", "does not start"),
        ("SWMTKN-1-abc", "no secret"),
        ("SWMTKN-1-abc-def", "characters"),
        (&*format!("SWMTKN-1-!{}", &good[10..]), "base 36"),
    ];
    for (token, want) in cases {
        let err = parse_join_token(token).unwrap_err().to_string();
        assert!(err.contains(want), "{token:?}: {err}");
    }
}

#[test]
fn token_comparison() {
    assert!(token_matches("SWMTKN-1-a-b", "SWMTKN-1-a-b"));
    assert!(!token_matches("SWMTKN-1-a-c", "SWMTKN-1-a-b"));
    assert!(!token_matches("SWMTKN-1-a-bb", "SWMTKN-1-a-b"));
    assert!(!token_matches("", ""), "an unset token never matches");
}

#[test]
fn renewal_point_is_between_half_and_four_fifths_of_the_issued_life() {
    let issued_at = t0();
    let life = Duration::from_secs(3600);
    let info =
        CertInfo { subject: subject(Role::Worker), not_before: issued_at - BACKDATE, not_after: issued_at + life };
    let mut r = rng(14);
    let mut seen = Vec::new();
    for _ in 0..1000 {
        let d = renewal_delay(&info, issued_at, &mut r);
        assert!(d >= life.mul_f64(0.5) && d <= life.mul_f64(0.8), "{d:?}");
        seen.push(d);
    }
    seen.sort();
    assert!(seen[999] - seen[0] > life.mul_f64(0.25), "draws spread over the window");
    // Later: the delay shrinks with the clock; past the point it is zero.
    let d_later = renewal_delay(&info, issued_at + Duration::from_secs(1000), &mut rng(15));
    assert_eq!(d_later + Duration::from_secs(1000), renewal_delay(&info, issued_at, &mut rng(15)));
    assert_eq!(renewal_delay(&info, issued_at + life, &mut rng(16)), Duration::ZERO);
}

#[test]
fn a_cross_signed_new_root_chains_new_certificates_to_the_old_root() {
    let old = RootCa::generate(t0(), &mut rng(20)).unwrap();
    let new = RootCa::generate(t0(), &mut rng(21)).unwrap();
    let cross = cross_sign(new.cert_pem(), &old, &mut rng(22)).unwrap();
    let csr = generate_node_key_and_csr().unwrap();
    let leaf =
        new.sign_csr(&csr.csr_pem, &subject(Role::Worker), DEFAULT_NODE_CERT_EXPIRY, t0(), &mut rng(23)).unwrap();
    let der = |pem: &str| parse_cert_pem_chain(pem.as_bytes()).unwrap().remove(0);
    let (leaf_der, cross_der) = (der(&leaf), der(&cross));
    assert!(signed_by(&leaf_der, &cross_der).unwrap(), "the intermediate carries the new root's key and name");
    assert!(signed_by(&cross_der, &der(old.cert_pem())).unwrap(), "the intermediate is signed by the old root");
    assert!(signed_by(&leaf_der, &der(new.cert_pem())).unwrap());
    assert!(!signed_by(&leaf_der, &der(old.cert_pem())).unwrap(), "not by the old key");
    // Who issued it, as a node reports it: the new root, with or without the intermediate in the chain.
    let want = root_issuer_info(new.cert_pem().as_bytes()).unwrap();
    let chain = format!("{leaf}{cross}");
    assert_eq!(cert_issuer_info(chain.as_bytes(), old.cert_pem().as_bytes()).unwrap(), want);
    let both = format!("{}{}", old.cert_pem(), new.cert_pem());
    assert_eq!(cert_issuer_info(leaf.as_bytes(), both.as_bytes()).unwrap(), want, "picked by key identifier");
    assert_ne!(root_issuer_info(old.cert_pem().as_bytes()).unwrap(), want);
    assert!(cert_issuer_info(leaf.as_bytes(), old.cert_pem().as_bytes()).is_err(), "the old root did not issue it");
}

#[test]
fn an_operators_root_must_be_a_ca_valid_now_with_its_own_key() {
    let root = RootCa::generate(t0(), &mut rng(30)).unwrap();
    let other = RootCa::generate(t0(), &mut rng(31)).unwrap();
    check_root(root.cert_pem(), Some(root.key_pem()), t0()).unwrap();
    check_root(root.cert_pem(), None, t0()).unwrap();
    let e = check_root(root.cert_pem(), Some(other.key_pem()), t0()).unwrap_err();
    assert!(e.to_string().contains("does not belong"), "{e}");
    let e = check_root(root.cert_pem(), None, t0() + ROOT_CA_VALIDITY + Duration::from_secs(10)).unwrap_err();
    assert!(e.to_string().contains("not valid now"), "{e}");
    let csr = generate_node_key_and_csr().unwrap();
    let leaf =
        root.sign_csr(&csr.csr_pem, &subject(Role::Worker), DEFAULT_NODE_CERT_EXPIRY, t0(), &mut rng(32)).unwrap();
    let e = check_root(&leaf, None, t0()).unwrap_err();
    assert!(e.to_string().contains("not a CA"), "{e}");
    let e = check_root(&format!("{}{}", root.cert_pem(), other.cert_pem()), None, t0()).unwrap_err();
    assert!(e.to_string().contains("one certificate"), "{e}");
    let e =
        check_root(root.cert_pem(), Some("-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n"), t0())
            .unwrap_err();
    assert!(e.to_string().contains("not a SEC1 ECPrivateKey"), "{e}");
}

#[test]
fn a_sec1_key_is_wrapped_as_the_pkcs8_key_it_is() {
    use base64::Engine as _;
    let root = RootCa::generate(t0(), &mut rng(41)).unwrap();
    // The PKCS#8 envelope holds the SEC1 ECPrivateKey as its last element (an OCTET STRING).
    let block = x509_parser::pem::Pem::iter_from_buffer(root.key_pem().as_bytes()).next().unwrap().unwrap();
    let (_, body, _) = rotation::der_element(&block.contents).unwrap();
    let (_, _, body) = rotation::der_element(body).unwrap(); // version
    let (_, _, body) = rotation::der_element(body).unwrap(); // algorithm
    let (tag, sec1, _) = rotation::der_element(body).unwrap();
    assert_eq!(tag, 0x04);
    let b64 = base64::engine::general_purpose::STANDARD.encode(sec1);
    let pem = format!("-----BEGIN EC PRIVATE KEY-----\n{b64}\n-----END EC PRIVATE KEY-----\n");
    let wrapped = key_pem_as_pkcs8(&pem).unwrap();
    let again = x509_parser::pem::Pem::iter_from_buffer(wrapped.as_bytes()).next().unwrap().unwrap();
    assert_eq!(again.contents, block.contents, "the same PKCS#8 key");
    check_root(root.cert_pem(), Some(&pem), t0()).unwrap();
    assert_eq!(key_pem_as_pkcs8(root.key_pem()).unwrap(), root.key_pem(), "PKCS#8 is kept as given");
}
