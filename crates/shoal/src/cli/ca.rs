//! `shoal ca issue-client-cert --name NAME --out DIR`: makes a key and CSR here, has the cluster's CA sign
//! it as an operator certificate (through the control socket's `POST /shoal/v1/ca/client-cert`), and writes
//! `DIR/key.pem` (0600), `DIR/cert.pem` and `DIR/ca.pem`: what `docker --tlsverify` reads from
//! `DOCKER_CERT_PATH` to talk to a manager's `--listen-api tcp://...`.

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
}

fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), CliError> {
    use std::os::unix::fs::OpenOptionsExt;
    let err = |e: std::io::Error| CliError::Usage(format!("{}: {e}", path.display()));
    let mut f =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(mode).open(path).map_err(err)?;
    f.write_all(bytes).map_err(err)
}

/// Runs a ca command.
pub fn run(c: &Client, cmd: CaCommand, out: &mut dyn Write) -> Result<(), CliError> {
    let CaCommand::IssueClientCert { name, out: dir } = cmd;
    let csr = shoal_ca::generate_node_key_and_csr().map_err(|e| CliError::Usage(e.to_string()))?;
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
