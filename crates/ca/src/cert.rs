//! The root CA and node certificates: creating the root, making a node key + CSR, signing a CSR with the
//! subject and validity the CA decides, and reading a certificate's subject and validity back.
//!
//! The CA ignores everything in a CSR but its public key (and checks its signature): the node never
//! chooses its own ID, role or cluster.

use std::time::{Duration, SystemTime};

use rand::{CryptoRng, Rng};
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber, PKCS_ECDSA_P256_SHA256,
};
use sha2::{Digest, Sha256};

use crate::{CaError, Role};

/// The root certificate's common name.
pub const ROOT_CN: &str = "swarm-ca";
/// How long the root CA is valid.
pub const ROOT_CA_VALIDITY: Duration = Duration::from_secs(20 * 365 * 24 * 3600);
/// Shortest node certificate validity a cluster may configure.
pub const MIN_NODE_CERT_EXPIRY: Duration = Duration::from_secs(3600);
/// Node certificate validity when the cluster sets none.
pub const DEFAULT_NODE_CERT_EXPIRY: Duration = Duration::from_secs(90 * 24 * 3600);
/// How far `not_before` is set back from the signing time, so peers with a slow clock accept the cert.
pub const BACKDATE: Duration = Duration::from_secs(3600);

/// Who a node certificate names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSubject {
    /// The node ID (CN).
    pub node_id: String,
    /// The role (OU).
    pub role: Role,
    /// The cluster ID (O).
    pub cluster_id: String,
}

/// What a certificate says: its subject and validity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// CN, OU, O.
    pub subject: NodeSubject,
    /// Start of validity.
    pub not_before: SystemTime,
    /// End of validity.
    pub not_after: SystemTime,
}

/// A node's fresh private key and the CSR for it (both PEM). The key never leaves the node.
#[derive(Clone)]
pub struct NodeCsr {
    /// PKCS#8 PEM private key.
    pub key_pem: String,
    /// PEM certificate signing request.
    pub csr_pem: String,
}

impl std::fmt::Debug for NodeCsr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeCsr").field("key_pem", &"<redacted>").field("csr_pem", &self.csr_pem).finish()
    }
}

/// SHA-256 of a certificate's PEM bytes: what join tokens and `ca_cert_hash` carry.
pub fn cert_digest(cert_pem: &[u8]) -> [u8; 32] {
    Sha256::digest(cert_pem).into()
}

/// `sha256:<hex>` of a certificate's PEM bytes (the cluster object's `ca_cert_hash`).
pub fn ca_cert_hash(cert_pem: &[u8]) -> String {
    let hex: String = cert_digest(cert_pem).iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

fn offset(t: SystemTime) -> time::OffsetDateTime {
    time::OffsetDateTime::from(t)
}

fn random_serial(rng: &mut (impl Rng + CryptoRng)) -> SerialNumber {
    let mut bytes = [0u8; 16];
    rng.fill(&mut bytes);
    bytes[0] &= 0x7f; // positive
    bytes[0] |= 0x01; // no leading zero byte to strip
    SerialNumber::from_slice(&bytes)
}

/// The cluster's root CA: certificate and private key, both PEM.
#[derive(Clone)]
pub struct RootCa {
    cert_pem: String,
    key_pem: String,
}

impl std::fmt::Debug for RootCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RootCa").field("cert_hash", &ca_cert_hash(self.cert_pem.as_bytes())).finish_non_exhaustive()
    }
}

impl RootCa {
    /// Creates a new root CA valid from `now` for `ROOT_CA_VALIDITY` (backdated by `BACKDATE`).
    pub fn generate(now: SystemTime, rng: &mut (impl Rng + CryptoRng)) -> Result<RootCa, CaError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, ROOT_CN);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        params.not_before = offset(now - BACKDATE);
        params.not_after = offset(now + ROOT_CA_VALIDITY);
        params.serial_number = Some(random_serial(rng));
        let cert = params.self_signed(&key)?;
        Ok(RootCa { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }

    /// A root CA from stored PEM (the cluster object's `root_ca`). Checks that both parse.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<RootCa, CaError> {
        KeyPair::from_pem(key_pem)?;
        parse_cert_pem_chain(cert_pem.as_bytes())?;
        Ok(RootCa { cert_pem: cert_pem.to_string(), key_pem: key_pem.to_string() })
    }

    /// The root certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The root private key, PEM. Secret: store it only in the cluster object, never log it.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// SHA-256 of the root certificate's PEM bytes.
    pub fn digest(&self) -> [u8; 32] {
        cert_digest(self.cert_pem.as_bytes())
    }

    /// Signs `csr_pem` for `subject`, valid from `now - BACKDATE` to `now + validity`. Only the CSR's public
    /// key is used; its subject and extensions are replaced. The certificate carries DNS names for the role
    /// OU and the node ID (peers check a manager's certificate by the name `swarm-manager`), for a manager also
    /// `swarm-ca` (the name a Docker Engine's agent checks when it dials the CA service, as SwarmKit's signer
    /// adds it), and both TLS server and client usages.
    pub fn sign_csr(
        &self,
        csr_pem: &str,
        subject: &NodeSubject,
        validity: Duration,
        now: SystemTime,
        rng: &mut (impl Rng + CryptoRng),
    ) -> Result<String, CaError> {
        self.sign_csr_with_ips(csr_pem, subject, validity, now, &[], rng)
    }

    /// `sign_csr`, with `ips` added as IP address names (a server that clients reach by IP, such as the
    /// Engine API over TCP, whose clients check the address against the certificate).
    pub fn sign_csr_with_ips(
        &self,
        csr_pem: &str,
        subject: &NodeSubject,
        validity: Duration,
        now: SystemTime,
        ips: &[std::net::IpAddr],
        rng: &mut (impl Rng + CryptoRng),
    ) -> Result<String, CaError> {
        let mut csr = CertificateSigningRequestParams::from_pem(csr_pem).map_err(|e| CaError::BadCsr(e.to_string()))?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, subject.node_id.as_str());
        dn.push(DnType::OrganizationalUnitName, subject.role.ou());
        dn.push(DnType::OrganizationName, subject.cluster_id.as_str());
        params.distinguished_name = dn;
        let mut names = vec![subject.role.ou(), subject.node_id.as_str()];
        if subject.role == Role::Manager {
            names.push(ROOT_CN);
        }
        params.subject_alt_names = names
            .iter()
            .map(|n| {
                rcgen::string::Ia5String::try_from(*n)
                    .map(SanType::DnsName)
                    .map_err(|e| CaError::BadCsr(format!("name {n:?} is not a valid DNS name: {e}")))
            })
            .collect::<Result<_, _>>()?;
        params.subject_alt_names.extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        params.not_before = offset(now - BACKDATE);
        params.not_after = offset(now + validity);
        params.serial_number = Some(random_serial(rng));
        csr.params = params;
        let key = KeyPair::from_pem(&self.key_pem)?;
        let issuer = Issuer::from_ca_cert_pem(&self.cert_pem, key)?;
        Ok(csr.signed_by(&issuer)?.pem())
    }
}

/// Makes a node's private key (ECDSA P-256, from the OS CSPRNG) and a CSR for it. The CSR's subject is a
/// placeholder: the CA decides the real one.
pub fn generate_node_key_and_csr() -> Result<NodeCsr, CaError> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "shoal-node");
    params.distinguished_name = dn;
    let csr = params.serialize_request(&key)?;
    Ok(NodeCsr { key_pem: key.serialize_pem(), csr_pem: csr.pem()? })
}

fn first_attr(name: &x509_parser::x509::X509Name<'_>, oid: &x509_parser::der_parser::oid::Oid<'_>) -> Option<String> {
    name.iter_by_oid(oid).next().and_then(|a| a.as_str().ok()).map(str::to_string)
}

/// Reads subject (CN, OU, O) and validity from a DER certificate. Does not verify the signature: callers
/// use it on certificates TLS already verified, or on their own.
pub fn parse_cert(der: &[u8]) -> Result<CertInfo, CaError> {
    use x509_parser::oid_registry::{OID_X509_COMMON_NAME, OID_X509_ORGANIZATIONAL_UNIT, OID_X509_ORGANIZATION_NAME};
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| CaError::BadCertificate(e.to_string()))?;
    let subject = cert.subject();
    let cn = first_attr(subject, &OID_X509_COMMON_NAME).unwrap_or_default();
    let ou = first_attr(subject, &OID_X509_ORGANIZATIONAL_UNIT).unwrap_or_default();
    let o = first_attr(subject, &OID_X509_ORGANIZATION_NAME).unwrap_or_default();
    let role = Role::from_ou(&ou).ok_or_else(|| CaError::BadCertificate(format!("unknown role OU {ou:?}")))?;
    let to_system = |t: x509_parser::time::ASN1Time| {
        let secs = t.timestamp();
        if secs >= 0 {
            SystemTime::UNIX_EPOCH + Duration::from_secs(secs as u64)
        } else {
            SystemTime::UNIX_EPOCH
        }
    };
    Ok(CertInfo {
        subject: NodeSubject { node_id: cn, role, cluster_id: o },
        not_before: to_system(cert.validity().not_before),
        not_after: to_system(cert.validity().not_after),
    })
}

/// A certificate's serial number as lowercase hex without separators or leading zero bytes (what
/// `openssl x509 -serial` prints, lowercased): the ID by which an operator certificate is revoked.
pub fn cert_serial_hex(der: &[u8]) -> Result<String, CaError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| CaError::BadCertificate(e.to_string()))?;
    let hex: String = cert.raw_serial().iter().map(|b| format!("{b:02x}")).collect();
    Ok(normalize_serial_hex(&hex).unwrap_or_else(|| "0".to_string()))
}

/// `serial` (hex, any case, with or without `:` separators) in the form `cert_serial_hex` gives, or `None`
/// when it is not hex or is empty.
pub fn normalize_serial_hex(serial: &str) -> Option<String> {
    let digits: String = serial.chars().filter(|c| *c != ':').collect::<String>().to_ascii_lowercase();
    if digits.is_empty() || digits.len() > 64 || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let trimmed = digits.trim_start_matches('0');
    Some(if trimmed.is_empty() { "0".to_string() } else { trimmed.to_string() })
}

/// The DER certificates in a PEM bundle, in order. Errors on an empty bundle or a broken block.
pub fn parse_cert_pem_chain(pem: &[u8]) -> Result<Vec<Vec<u8>>, CaError> {
    let mut out = Vec::new();
    for item in x509_parser::pem::Pem::iter_from_buffer(pem) {
        let item = item.map_err(|e| CaError::BadCertificate(e.to_string()))?;
        if item.label == "CERTIFICATE" {
            item.parse_x509().map_err(|e| CaError::BadCertificate(e.to_string()))?;
            out.push(item.contents);
        }
    }
    if out.is_empty() {
        return Err(CaError::BadCertificate("no PEM certificate found".into()));
    }
    Ok(out)
}
