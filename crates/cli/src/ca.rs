//! `shoal ca issue-client-cert --name NAME --out DIR`: makes a key and CSR here, has the cluster's CA sign
//! it as an operator certificate (through the control socket's `POST /shoal/v1/ca/client-cert`), and writes
//! `DIR/key.pem` (0600), `DIR/cert.pem` and `DIR/ca.pem`: what `docker --tlsverify` reads from
//! `DOCKER_CERT_PATH` to talk to a manager's `--listen-api tcp://...`.
//!
//! `shoal ca revoke-client-cert --cert PATH` (or `--serial HEX`): has the cluster refuse that operator
//! certificate on every entry point from now on (`POST /shoal/v1/ca/revoke-client-cert`); prints its serial.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Subcommand;
use serde_json::Value;

use super::client::{CliError, Client};

/// `shoal ca ...`.
#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum CaCommand {
    /// Issue an operator client certificate for the Engine API over TCP.
    IssueClientCert {
        /// The client's name (the certificate's CN).
        #[arg(long, default_value = "admin")]
        name: String,
        /// Directory to write key.pem, cert.pem and ca.pem to (created if missing).
        #[arg(long)]
        out: PathBuf,
    },
    /// Revoke an operator client certificate: every manager refuses it from now on.
    RevokeClientCert {
        /// The certificate file (cert.pem as `issue-client-cert` wrote it).
        #[arg(long, conflicts_with = "serial", required_unless_present = "serial")]
        cert: Option<PathBuf>,
        /// Or its serial number, hex (`openssl x509 -serial -noout -in cert.pem`, or the daemon's log line
        /// "issued an operator client certificate").
        #[arg(long)]
        serial: Option<String>,
    },
}

fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), CliError> {
    use std::os::unix::fs::OpenOptionsExt;
    let err = |e: std::io::Error| CliError::Usage(format!("{}: {e}", path.display()));
    let mut f =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(mode).open(path).map_err(err)?;
    f.write_all(bytes).map_err(err)
}

/// Runs a ca command.
pub(super) fn run(c: &Client, cmd: CaCommand, out: &mut dyn Write) -> Result<(), CliError> {
    let (name, dir) = match cmd {
        CaCommand::IssueClientCert { name, out } => (name, out),
        CaCommand::RevokeClientCert { cert, serial } => return revoke(c, cert, serial, out),
    };
    let csr = key_and_csr(&name)?;
    let resp: Value = c.post("/shoal/v1/ca/client-cert", &serde_json::json!({ "Name": name, "CSR": csr.csr_pem }))?;
    let field =
        |k: &str| resp[k].as_str().map(str::to_string).ok_or_else(|| CliError::Api(format!("the answer has no {k}")));
    let (cert, root) = (field("Certificate")?, field("RootCA")?);
    std::fs::create_dir_all(&dir).map_err(|e| CliError::Usage(format!("{}: {e}", dir.display())))?;
    write_file(&dir.join("key.pem"), csr.key_pem.as_bytes(), 0o600)?;
    write_file(&dir.join("cert.pem"), cert.as_bytes(), 0o644)?;
    write_file(&dir.join("ca.pem"), root.as_bytes(), 0o644)?;
    writeln!(out, "{}", dir.display()).map_err(super::output::io)
}

/// A private key (P-256, as the cluster's node keys) and a certificate signing request for `name`, made here:
/// the key never leaves the machine. The CA sets the certificate's subject itself; the request's only proves
/// the key.
struct KeyAndCsr {
    key_pem: String,
    csr_pem: String,
}

fn key_and_csr(name: &str) -> Result<KeyAndCsr, CliError> {
    let failed = |e: rcgen::Error| CliError::Usage(format!("cannot make a key and a certificate request: {e}"));
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(failed)?;
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name.push(rcgen::DnType::CommonName, name);
    let csr = params.serialize_request(&key).map_err(failed)?;
    Ok(KeyAndCsr { key_pem: key.serialize_pem(), csr_pem: csr.pem().map_err(failed)? })
}

fn revoke(c: &Client, cert: Option<PathBuf>, serial: Option<String>, out: &mut dyn Write) -> Result<(), CliError> {
    let certificate = match &cert {
        Some(path) => std::fs::read_to_string(path).map_err(|e| CliError::Usage(format!("{}: {e}", path.display())))?,
        None => String::new(),
    };
    let body = serde_json::json!({ "Certificate": certificate, "Serial": serial.unwrap_or_default() });
    let resp: Value = c.post("/shoal/v1/ca/revoke-client-cert", &body)?;
    let serial = resp["Serial"].as_str().unwrap_or_default();
    writeln!(out, "revoked {serial}").map_err(super::output::io)
}
