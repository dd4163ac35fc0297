//! Node bootstrap over the network and certificate upkeep: joining a cluster with a token (download the
//! root CA and check it against the token's digest, make a key and CSR, have the CA issue the certificate),
//! the certificate files in the state dir, and renewal at a random point of the certificate's life.
//!
//! The files live in `<state dir>/certificates/`: `swarm-root-ca.crt`, `swarm-node.crt`, `swarm-node.key`,
//! each written atomically (tmp file, fsync, rename) with mode 0600. Nothing here logs key material or
//! tokens. Must not know the store or Raft: it speaks only the CA and NodeCA gRPC protocol.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rand::rngs::StdRng;
use rand::SeedableRng;
use shoal_api::ca_client::CaClient;
use shoal_api::node_ca_client::NodeCaClient;
use shoal_api::{
    issuance_status, GetRootCaCertificateRequest, IssueNodeCertificateRequest, NodeCertificateStatusRequest,
};
use tokio::sync::watch;
use tonic::transport::Endpoint;

use crate::statedir::certs_dir;
use crate::tls::{NodeTls, TlsError};

/// Attempts to read an issued certificate with NodeCertificateStatus before giving up.
pub(crate) const STATUS_ATTEMPTS: u32 = 20;
/// Pause between NodeCertificateStatus attempts.
pub(crate) const STATUS_RETRY: Duration = Duration::from_millis(250);
/// Shortest wait before retrying a failed renewal.
pub(crate) const RENEW_RETRY_MIN: Duration = Duration::from_secs(1);
/// Longest wait before retrying a failed renewal.
pub(crate) const RENEW_RETRY_MAX: Duration = Duration::from_secs(60);

/// Why joining or renewing failed.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// The token is malformed.
    #[error(transparent)]
    Token(shoal_ca::CaError),
    /// The manager's root CA is not the one the token names.
    #[error(
        "the root CA of the manager at {addr} does not match the join token (digest mismatch): the token is for \
         another cluster, or someone is impersonating the manager; check --join-addr and --join-token"
    )]
    CaMismatch {
        /// The manager address.
        addr: String,
    },
    /// Could not reach the manager.
    #[error("cannot reach the manager at {addr}: {reason}")]
    Connect {
        /// The address.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The manager refused or failed a call.
    #[error("{call} at {addr} failed: {message}")]
    Rpc {
        /// Which call.
        call: &'static str,
        /// The address.
        addr: String,
        /// The gRPC status code.
        code: tonic::Code,
        /// The manager's message.
        message: String,
    },
    /// The CA did not issue a certificate in time.
    #[error("the CA at {addr} did not issue a certificate for node {node_id} in time: {state}")]
    NotIssued {
        /// The address.
        addr: String,
        /// The node.
        node_id: String,
        /// Last seen issuance state.
        state: String,
    },
    /// Key or CSR generation, or the issued certificate, failed.
    #[error(transparent)]
    Ca(#[from] shoal_ca::CaError),
    /// The TLS material is unusable.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// Writing the certificate files failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// A node's certificate material, PEM.
#[derive(Clone)]
pub struct NodeCerts {
    /// The cluster root CA certificate.
    pub root_pem: String,
    /// The node certificate.
    pub cert_pem: String,
    /// The node's private key.
    pub key_pem: String,
}

impl std::fmt::Debug for NodeCerts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeCerts").finish_non_exhaustive()
    }
}

impl NodeCerts {
    /// The TLS identity made of these certificates.
    pub fn tls(&self) -> Result<NodeTls, TlsError> {
        NodeTls::new(&self.root_pem, &self.cert_pem, &self.key_pem)
    }
}

const ROOT_FILE: &str = "swarm-root-ca.crt";
const CERT_FILE: &str = "swarm-node.crt";
const KEY_FILE: &str = "swarm-node.key";

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> JoinError + '_ {
    move |source| JoinError::Io { path: path.display().to_string(), source }
}

/// Reads the certificate files, if the state dir has them (all three, or an error naming the missing one).
pub fn load_certs(state_dir: &Path) -> Result<Option<NodeCerts>, JoinError> {
    let dir = certs_dir(state_dir);
    let read = |name: &str| -> Result<Option<String>, JoinError> {
        let p = dir.join(name);
        match std::fs::read_to_string(&p) {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(&p)(e)),
        }
    };
    // The key may be wrapped with the autolock KEK (see `lock`); read it under the KEK table's lock.
    let table = crate::lock::key_table();
    match (read(ROOT_FILE)?, read(CERT_FILE)?, read(KEY_FILE)?) {
        (None, None, None) => Ok(None),
        (Some(root_pem), Some(cert_pem), Some(key_text)) => {
            let key_pem = table.node_key_from_disk(state_dir, &key_text).map_err(|reason| JoinError::Io {
                path: dir.join(KEY_FILE).display().to_string(),
                source: std::io::Error::other(reason),
            })?;
            Ok(Some(NodeCerts { root_pem, cert_pem, key_pem }))
        }
        _ => Err(JoinError::Io {
            path: dir.display().to_string(),
            source: std::io::Error::other(
                "some certificate files are missing (need swarm-root-ca.crt, swarm-node.crt, swarm-node.key); \
                 restore them or start with an empty state dir",
            ),
        }),
    }
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), JoinError> {
    crate::statedir::replace_private(path, "tmp", bytes).map_err(|(p, e)| io_err(&p)(e))
}

/// Writes the certificate files durably, mode 0600 in a 0700 directory. Each file is replaced atomically;
/// a crash between the key and the certificate leaves a pair that does not match, which `NodeTls::new`
/// refuses at the next start (the node must then join again).
pub(crate) fn store_certs(state_dir: &Path, certs: &NodeCerts) -> Result<(), JoinError> {
    use std::os::unix::fs::PermissionsExt;
    let dir = certs_dir(state_dir);
    std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(io_err(&dir))?;
    write_private(&dir.join(ROOT_FILE), certs.root_pem.as_bytes())?;
    // Wrapped with the autolock KEK when there is one; the table stays locked until the key is written.
    let table = crate::lock::key_table();
    write_private(&dir.join(KEY_FILE), table.node_key_to_disk(state_dir, &certs.key_pem).as_bytes())?;
    drop(table);
    write_private(&dir.join(CERT_FILE), certs.cert_pem.as_bytes())?;
    std::fs::File::open(&dir).and_then(|d| d.sync_all()).map_err(io_err(&dir))
}

async fn connect(endpoint: Result<Endpoint, TlsError>, addr: &str) -> Result<tonic::transport::Channel, JoinError> {
    let endpoint = endpoint?;
    endpoint.connect().await.map_err(|e| JoinError::Connect { addr: addr.to_string(), reason: error_chain(&e) })
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

fn rpc<'a>(call: &'static str, addr: &'a str) -> impl FnOnce(tonic::Status) -> JoinError + 'a {
    move |s| JoinError::Rpc { call, addr: addr.to_string(), code: s.code(), message: s.message().to_string() }
}

impl JoinError {
    /// Whether trying again later may succeed: the manager could not be reached, or answered that it is not
    /// ready (starting, no leader yet). A refused token, a root CA that does not match it and a bad answer
    /// are final.
    pub fn is_transient(&self) -> bool {
        match self {
            JoinError::Connect { .. } => true,
            JoinError::Rpc { code, .. } => matches!(code, tonic::Code::Unavailable | tonic::Code::DeadlineExceeded),
            _ => false,
        }
    }
}

/// The longest wait between two join attempts to a manager that cannot be reached yet.
pub(crate) const JOIN_RETRY_MAX: Duration = Duration::from_secs(5);
/// The first wait between two join attempts.
pub(crate) const JOIN_RETRY_MIN: Duration = Duration::from_millis(200);

/// `join`, retried while the manager cannot be reached yet (`JoinError::is_transient`) for up to
/// `retry_for`, with a delay doubling from `JOIN_RETRY_MIN` to `JOIN_RETRY_MAX`, each retry logged. A
/// final error, or a transient one once the time is up, is returned (the latter saying how long it tried).
pub(crate) async fn join_retrying(
    addr: &str,
    token: &str,
    state_dir: &Path,
    availability: shoal_api::node_spec::Availability,
    retry_for: Duration,
) -> Result<(String, NodeCerts), String> {
    let start = tokio::time::Instant::now();
    let mut delay = JOIN_RETRY_MIN;
    loop {
        match join(addr, token, state_dir, availability).await {
            Ok(r) => return Ok(r),
            Err(e) if e.is_transient() => {
                let waited = start.elapsed();
                if waited + delay > retry_for {
                    return Err(format!(
                        "{e} (tried for {}s; start the manager first, or check the address and the network)",
                        waited.as_secs()
                    ));
                }
                tracing::warn!(
                    manager = %addr,
                    error = %e,
                    "cannot join yet; retrying in {delay:?} (giving up after {}s)",
                    retry_for.as_secs()
                );
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(JOIN_RETRY_MAX);
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// Downloads the root CA from the manager at `addr` and returns it only if its digest is the one `token`
/// names.
pub(crate) async fn fetch_root_ca(addr: &str, token: &str) -> Result<String, JoinError> {
    let parsed = shoal_ca::parse_join_token(token).map_err(JoinError::Token)?;
    let channel = connect(crate::tls::bootstrap_endpoint(addr), addr).await?;
    let resp = CaClient::new(channel)
        .get_root_ca_certificate(GetRootCaCertificateRequest {})
        .await
        .map_err(rpc("GetRootCACertificate", addr))?
        .into_inner();
    if shoal_ca::cert_digest(&resp.certificate) != parsed.ca_digest {
        return Err(JoinError::CaMismatch { addr: addr.to_string() });
    }
    String::from_utf8(resp.certificate)
        .map_err(|_| JoinError::Ca(shoal_ca::CaError::BadCertificate("the root CA is not PEM text".into())))
}

/// Asks the CA over `channel` for a certificate for `csr_pem` (`token` empty = renewal with the node
/// certificate the channel presents), then reads it back. Returns the node ID and the certificate PEM.
async fn issue(
    channel: tonic::transport::Channel,
    addr: &str,
    csr_pem: &str,
    token: &str,
    availability: shoal_api::node_spec::Availability,
) -> Result<(String, String), JoinError> {
    let mut client = NodeCaClient::new(channel);
    let resp = client
        .issue_node_certificate(IssueNodeCertificateRequest {
            csr: csr_pem.as_bytes().to_vec(),
            token: token.to_string(),
            availability: availability as i32,
            ..Default::default()
        })
        .await
        .map_err(rpc("IssueNodeCertificate", addr))?
        .into_inner();
    let node_id = resp.node_id;
    let mut last_state = String::from("unknown");
    for _ in 0..STATUS_ATTEMPTS {
        let status = client
            .node_certificate_status(NodeCertificateStatusRequest { node_id: node_id.clone() })
            .await
            .map_err(rpc("NodeCertificateStatus", addr))?
            .into_inner();
        let cert = status.certificate.unwrap_or_default();
        let state = status.status.unwrap_or_default();
        if state.state == issuance_status::State::Issued as i32 && cert.csr == csr_pem.as_bytes() {
            let pem = String::from_utf8(cert.certificate)
                .map_err(|_| JoinError::Ca(shoal_ca::CaError::BadCertificate("not PEM text".into())))?;
            return Ok((node_id, pem));
        }
        if state.state == issuance_status::State::Failed as i32 {
            return Err(JoinError::NotIssued { addr: addr.to_string(), node_id, state: state.err });
        }
        last_state = format!("{:?}", issuance_status::State::try_from(state.state).unwrap_or_default());
        tokio::time::sleep(STATUS_RETRY).await;
    }
    Err(JoinError::NotIssued { addr: addr.to_string(), node_id, state: last_state })
}

/// Joins the cluster of the manager at `addr` with `token`: checks the root CA against the token, gets a
/// certificate (the role is the token's; the node object gets `availability`), writes the files, and
/// returns the node ID and the material.
pub(crate) async fn join(
    addr: &str,
    token: &str,
    state_dir: &Path,
    availability: shoal_api::node_spec::Availability,
) -> Result<(String, NodeCerts), JoinError> {
    let root_pem = fetch_root_ca(addr, token).await?;
    let csr = shoal_ca::generate_node_key_and_csr()?;
    let channel = connect(crate::tls::endpoint_trusting_root(addr, &root_pem), addr).await?;
    let (node_id, cert_pem) = issue(channel, addr, &csr.csr_pem, token, availability).await?;
    let certs = NodeCerts { root_pem, cert_pem, key_pem: csr.key_pem };
    certs.tls()?; // the certificate must match the key and chain to the root before it is kept
    store_certs(state_dir, &certs)?;
    Ok((node_id, certs))
}

/// Renews `tls`'s certificate through the CA at `addr` (mutual TLS, no token), stores and installs it.
pub(crate) async fn renew_once(addr: &str, tls: &NodeTls, state_dir: &Path) -> Result<(), JoinError> {
    let csr = shoal_ca::generate_node_key_and_csr()?;
    let channel = connect(tls.endpoint(addr), addr).await?;
    let (_, cert_pem) = issue(channel, addr, &csr.csr_pem, "", Default::default()).await?;
    let certs = NodeCerts { root_pem: tls.root_pem(), cert_pem, key_pem: csr.key_pem };
    certs.tls()?;
    store_certs(state_dir, &certs)?;
    tls.update(&certs.cert_pem, &certs.key_pem)?;
    Ok(())
}

/// Keeps `tls`'s certificate fresh until `shutdown`: sleeps until a random point between 50% and 80% of
/// the certificate's issued life, renews through `manager_addr()` (retrying with a doubling delay from
/// `RENEW_RETRY_MIN` to `RENEW_RETRY_MAX`), and starts over with the new certificate. Open connections
/// and running tasks are not touched.
pub(crate) async fn run_renewal(
    state_dir: PathBuf,
    tls: NodeTls,
    manager_addr: impl Fn() -> String + Send + 'static,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut rng = StdRng::from_os_rng();
    loop {
        let info =
            match shoal_ca::parse_cert_pem_chain(tls.cert_pem().as_bytes()).and_then(|c| shoal_ca::parse_cert(&c[0])) {
                Ok(i) => i,
                Err(e) => {
                    tracing::error!(error = %e, "cannot read the node certificate; renewal stopped");
                    return;
                }
            };
        let delay = shoal_ca::renewal_delay(&info, SystemTime::now(), &mut rng);
        tracing::debug!(?delay, "next certificate renewal");
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shoal_manager::stopped(&mut shutdown) => return,
        }
        let mut retry = RENEW_RETRY_MIN;
        loop {
            let addr = manager_addr();
            match renew_once(&addr, &tls, &state_dir).await {
                Ok(()) => {
                    tracing::info!(node = %tls.subject().node_id, not_after = ?tls.not_after(), "node certificate \
                                                                                                 renewed");
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "certificate renewal failed; retrying in {retry:?}");
                    tokio::select! {
                        _ = tokio::time::sleep(retry) => {}
                        _ = shoal_manager::stopped(&mut shutdown) => return,
                    }
                    retry = (retry * 2).min(RENEW_RETRY_MAX);
                }
            }
        }
    }
}

/// Follows a root CA rotation (SwarmKit's node): when the roots the managers say to trust (`roots`, from the
/// session messages) change, trusts them, writes them to the state dir and renews the certificate; when this
/// node's Node object (`node`) asks for a renewal (certificate status ROTATE), renews. Renewals go through
/// `manager_addr()` and are retried with a doubling delay from `RENEW_RETRY_MIN` to `RENEW_RETRY_MAX`. Open
/// connections and tasks are not touched. Returns on `shutdown`.
pub(crate) async fn follow_root_rotation(
    state_dir: PathBuf,
    tls: NodeTls,
    mut roots: watch::Receiver<Vec<u8>>,
    mut node: watch::Receiver<Option<shoal_api::Node>>,
    manager_addr: impl Fn() -> String + Send + 'static,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut retry = RENEW_RETRY_MIN;
    let mut renew = false;
    let mut check_node = true;
    loop {
        let wanted = roots.borrow_and_update().clone();
        if !wanted.is_empty() && wanted != tls.root_pem().as_bytes() {
            match String::from_utf8(wanted) {
                Ok(pem) => match tls.update_roots(&pem) {
                    Ok(()) => {
                        let certs = NodeCerts { root_pem: pem, cert_pem: tls.cert_pem(), key_pem: tls.key_pem() };
                        if let Err(e) = store_certs(&state_dir, &certs) {
                            tracing::warn!(error = %e, "cannot write the new trusted roots to the state dir");
                        }
                        tracing::info!(
                            roots = certs.root_pem.matches("BEGIN CERTIFICATE").count(),
                            "the cluster's \
                                                                                                     root CA changed: \
                                                                                                     trusting the \
                                                                                                     roots the \
                                                                                                     managers sent; \
                                                                                                     renewing the \
                                                                                                     certificate"
                        );
                        renew = true;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the managers sent roots that cannot be used; keeping the current \
                                                    ones")
                    }
                },
                Err(_) => tracing::warn!("the managers sent roots that are not PEM text; keeping the current ones"),
            }
        }
        if std::mem::take(&mut check_node) {
            let state = node
                .borrow_and_update()
                .as_ref()
                .and_then(|n| n.certificate.as_ref()?.status.as_ref().map(|s| s.state));
            if state == Some(issuance_status::State::Rotate as i32) {
                tracing::info!("the managers asked this node to renew its certificate (root CA rotation)");
                renew = true;
            }
        }
        if renew {
            let addr = manager_addr();
            match renew_once(&addr, &tls, &state_dir).await {
                Ok(()) => {
                    renew = false;
                    retry = RENEW_RETRY_MIN;
                    tracing::info!(node = %tls.subject().node_id, "node certificate renewed for the root CA rotation");
                }
                Err(e) => {
                    tracing::warn!(error = %e, "certificate renewal for the root CA rotation failed; retrying in \
                                                {retry:?}");
                    tokio::select! {
                        _ = tokio::time::sleep(retry) => {}
                        _ = shoal_manager::stopped(&mut shutdown) => return,
                    }
                    retry = (retry * 2).min(RENEW_RETRY_MAX);
                    continue;
                }
            }
        }
        tokio::select! {
            r = roots.changed() => if r.is_err() { return },
            r = node.changed() => if r.is_err() { return } else { check_node = true },
            _ = shoal_manager::stopped(&mut shutdown) => return,
        }
    }
}
