//! The manager's certificate authority: the `CA` and `NodeCA` gRPC services, the cluster's root CA material
//! (created with the cluster), join-token rotation, and the identity of an authenticated caller.
//!
//! Signing and token logic is `shoal-ca` (pure); this module is the shell around it: it reads the root CA
//! and tokens from the cluster object, writes `Node` objects with their issued certificate, and maps
//! outcomes to gRPC statuses. Certificates are signed synchronously inside `IssueNodeCertificate` (the
//! node then reads them with `NodeCertificateStatus`), so there is no pending queue to bound.
//!
//! Who may call what is decided before a handler runs (the node's authorization layer, which also puts the
//! caller's verified certificate subject in the request as `PeerIdentity`). Must not know TLS, HTTP or files.

pub(crate) mod rotation;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use shoal_api::ca_server::{Ca as CaRpc, CaServer};
use shoal_api::node_ca_server::{NodeCa as NodeCaRpc, NodeCaServer};
use shoal_api::{
    issuance_status, node_spec, Certificate, Cluster, GetRootCaCertificateRequest, GetRootCaCertificateResponse,
    IssuanceStatus, IssueNodeCertificateRequest, IssueNodeCertificateResponse, JoinTokens, Node,
    NodeCertificateStatusRequest, NodeCertificateStatusResponse, NodeRole, NodeSpec, NodeStatus, RootCa as RootCaProto,
};
use shoal_ca::{NodeSubject, Role, RootCa};
use shoal_raft::ProposeError;
use tonic::{Request, Response, Status};

use crate::state::{ClusterState, WriteError};

/// The verified subject of the caller's client certificate, put into each request's extensions by the
/// authorization layer after it checked the chain, the cluster and that the node still exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerIdentity(pub NodeSubject);

/// The caller's verified identity, if it presented a certificate.
pub(crate) fn peer_identity<T>(req: &Request<T>) -> Option<&NodeSubject> {
    req.extensions().get::<PeerIdentity>().map(|p| &p.0)
}

/// Most bytes of a CSR the CA accepts.
pub(crate) const MAX_CSR_BYTES: usize = 16 * 1024;
/// Most labels a joining node may ask for.
pub(crate) const MAX_JOIN_LABELS: usize = 64;

/// Root CA material for a new cluster: a fresh root and both join tokens, as stored in `Cluster.root_ca`.
pub fn new_root_ca(now: SystemTime) -> Result<RootCaProto, shoal_ca::CaError> {
    let mut rng = rand::rng();
    let root = RootCa::generate(now, &mut rng)?;
    let digest = root.digest();
    Ok(RootCaProto {
        ca_key: root.key_pem().as_bytes().to_vec(),
        ca_cert: root.cert_pem().as_bytes().to_vec(),
        ca_cert_hash: shoal_ca::ca_cert_hash(root.cert_pem().as_bytes()),
        join_tokens: Some(JoinTokens {
            worker: shoal_ca::generate_join_token(&digest, &mut rng),
            manager: shoal_ca::generate_join_token(&digest, &mut rng),
        }),
        root_rotation: None,
        last_forced_rotation: 0,
    })
}

/// Signs CSRs through external CAs (CFSSL's `/api/v1/cfssl/sign`). The node crate provides it: this crate
/// does not speak HTTP.
#[tonic::async_trait]
pub trait ExternalSigner: Send + Sync {
    /// Asks the signers at `urls` in turn, checking their TLS certificate against `trust_pem`, to sign
    /// `csr_pem` for `subject`. Returns the certificate (PEM, possibly with its chain), or why every signer
    /// failed.
    async fn sign(
        &self,
        urls: &[String],
        trust_pem: &str,
        csr_pem: &str,
        subject: &NodeSubject,
    ) -> Result<String, String>;
}

/// The one cluster object, if it exists.
pub fn cluster(state: &ClusterState) -> Option<Arc<Cluster>> {
    state.store.view(|t| t.clusters().iter().next().cloned())
}

/// The cluster's root CA, parsed.
pub fn root_ca_of(cluster: &Cluster) -> Result<RootCa, Status> {
    let rc = cluster.root_ca.as_ref().ok_or_else(|| Status::failed_precondition("the cluster has no root CA yet"))?;
    let cert =
        std::str::from_utf8(&rc.ca_cert).map_err(|_| Status::internal("stored root CA certificate is not PEM"))?;
    let key = std::str::from_utf8(&rc.ca_key).map_err(|_| Status::internal("stored root CA key is not PEM"))?;
    RootCa::from_pem(cert, key).map_err(|e| Status::internal(format!("stored root CA is unusable: {e}")))
}

/// Node certificate validity: the cluster's `ca_config.node_cert_expiry` (at least `MIN_NODE_CERT_EXPIRY`,
/// default `DEFAULT_NODE_CERT_EXPIRY`), unless `override_expiry` is set (tests with short-lived certs).
pub fn node_cert_expiry(cluster: &Cluster, override_expiry: Option<Duration>) -> Duration {
    if let Some(d) = override_expiry {
        return d;
    }
    cluster
        .spec
        .as_ref()
        .and_then(|s| s.ca_config.as_ref())
        .and_then(|c| c.node_cert_expiry.as_ref())
        .map(shoal_api::duration_from_proto)
        .filter(|d| !d.is_zero())
        .unwrap_or(shoal_ca::DEFAULT_NODE_CERT_EXPIRY)
        .max(shoal_ca::MIN_NODE_CERT_EXPIRY)
}

/// Which tokens to rotate.
#[derive(Debug, Clone, Copy, Default)]
pub struct RotateTokens {
    /// Replace the worker token.
    pub worker: bool,
    /// Replace the manager token.
    pub manager: bool,
}

/// Why a token rotation failed.
#[derive(Debug, thiserror::Error)]
pub enum RotateError {
    /// There is no cluster (or no root CA) yet.
    #[error("the cluster is not initialised yet; retry in a moment")]
    NoCluster,
    /// The write failed.
    #[error("could not write the new join tokens: {0}; retry")]
    Write(String),
}

/// Replaces the chosen join tokens with fresh ones (same root CA digest, new secrets). Nodes that already
/// joined are unaffected; the old token stops working at once.
pub async fn rotate_join_tokens(state: &ClusterState, which: RotateTokens) -> Result<(), RotateError> {
    if !which.worker && !which.manager {
        return Ok(());
    }
    let now = state.now();
    let res = state
        .write(|t, changes| {
            let c = t.clusters().iter().next().ok_or(RotateError::NoCluster)?;
            let mut c = (**c).clone();
            let rc = c.root_ca.as_mut().ok_or(RotateError::NoCluster)?;
            let digest = shoal_ca::cert_digest(&rc.ca_cert);
            let tokens = rc.join_tokens.get_or_insert_with(Default::default);
            let mut rng = rand::rng();
            if which.worker {
                tokens.worker = shoal_ca::generate_join_token(&digest, &mut rng);
            }
            if which.manager {
                tokens.manager = shoal_ca::generate_join_token(&digest, &mut rng);
            }
            c.meta.get_or_insert_with(Default::default).updated_at = Some(now);
            changes.update(c);
            Ok(())
        })
        .await;
    match res {
        Ok(_) => Ok(()),
        Err(WriteError::Rejected(e)) => Err(e),
        Err(WriteError::Propose(e)) => Err(RotateError::Write(e.to_string())),
    }
}

/// The CA and NodeCA services.
#[derive(Clone)]
pub struct CaService {
    state: ClusterState,
    expiry_override: Option<Duration>,
    external: Option<Arc<dyn ExternalSigner>>,
}

impl std::fmt::Debug for CaService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaService").field("expiry_override", &self.expiry_override).finish()
    }
}

fn write_status<E: std::fmt::Display>(e: WriteError<E>) -> Status {
    match e {
        WriteError::Rejected(e) => Status::failed_precondition(e.to_string()),
        WriteError::Propose(ProposeError::NotLeader { .. }) => {
            Status::unavailable("this manager is not the leader; retry against the leader")
        }
        WriteError::Propose(e) => Status::unavailable(format!("could not write to the cluster store: {e}; retry")),
    }
}

fn role_to_proto(role: Role) -> NodeRole {
    match role {
        Role::Manager => NodeRole::Manager,
        Role::Worker | Role::Admin => NodeRole::Worker,
    }
}

impl CaService {
    /// The services over `state`. `expiry_override` replaces the cluster's node certificate expiry (and its
    /// one-hour minimum): only for tests of renewal.
    pub fn new(state: ClusterState, expiry_override: Option<Duration>) -> CaService {
        CaService { state, expiry_override, external: None }
    }

    /// Signs through `signer` when the cluster's root is held by an external CA.
    pub fn with_external_signer(mut self, signer: Arc<dyn ExternalSigner>) -> CaService {
        self.external = Some(signer);
        self
    }

    /// The `CA` gRPC service.
    pub fn ca_server(&self) -> CaServer<CaService> {
        CaServer::new(self.clone())
    }

    /// The `NodeCA` gRPC service.
    pub fn node_ca_server(&self) -> NodeCaServer<CaService> {
        NodeCaServer::new(self.clone())
    }

    fn now(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(self.state.clock.now_unix_ms())
    }

    async fn sign(&self, cluster: &Cluster, csr: &[u8], subject: &NodeSubject) -> Result<Vec<u8>, Status> {
        let signer = rotation::signer_of(cluster)?;
        let csr = std::str::from_utf8(csr).map_err(|_| Status::invalid_argument("the CSR must be PEM text"))?;
        // The CSR must be well formed whoever signs it.
        shoal_ca::check_csr(csr).map_err(|e| Status::invalid_argument(e.to_string()))?;
        let leaf = if !signer.external_urls.is_empty() {
            let external = self.external.as_ref().ok_or_else(|| {
                Status::failed_precondition(
                    "the cluster's root CA is held by an external CA, and this manager has no client for it",
                )
            })?;
            external.sign(&signer.external_urls, &signer.trust_pem, csr, subject).await.map_err(|e| {
                Status::failed_precondition(format!(
                    "the external CA could not sign the certificate: {e}; start the signer, or point the cluster at a \
                     working one (docker swarm update --external-ca)"
                ))
            })?
        } else {
            let root = signer.local().ok_or_else(|| {
                Status::failed_precondition(
                    "the cluster holds no key for its root CA and no external CA is configured for it; add one with \
                     docker swarm update --external-ca protocol=cfssl,url=https://...",
                )
            })??;
            let validity = node_cert_expiry(cluster, self.expiry_override);
            root.sign_csr(csr, subject, validity, self.now(), &mut rand::rng())
                .map_err(|e| Status::invalid_argument(e.to_string()))?
        };
        let mut pem = leaf;
        if !signer.intermediates.is_empty() {
            if !pem.ends_with('\n') {
                pem.push('\n');
            }
            pem.push_str(&signer.intermediates);
        }
        Ok(pem.into_bytes())
    }

    fn issued(role: Role, csr: Vec<u8>, cert: Vec<u8>, node_id: &str) -> Certificate {
        Certificate {
            role: role_to_proto(role) as i32,
            csr,
            status: Some(IssuanceStatus { state: issuance_status::State::Issued as i32, err: String::new() }),
            certificate: cert,
            cn: node_id.to_string(),
        }
    }

    /// A new node: the token picks the role; the CA picks the node ID, signs, and creates the node object.
    async fn issue_for_new_node(
        &self,
        req: IssueNodeCertificateRequest,
    ) -> Result<IssueNodeCertificateResponse, Status> {
        let cluster =
            cluster(&self.state).ok_or_else(|| Status::unavailable("the cluster is not initialised yet; retry"))?;
        let tokens = cluster.root_ca.as_ref().and_then(|r| r.join_tokens.clone()).unwrap_or_default();
        let role = if shoal_ca::token_matches(&req.token, &tokens.manager) {
            Role::Manager
        } else if shoal_ca::token_matches(&req.token, &tokens.worker) {
            Role::Worker
        } else {
            return Err(Status::permission_denied(
                "invalid join token: it matches neither the worker nor the manager token of this cluster (it may \
                 have been rotated); get the current one with `docker swarm join-token worker|manager` on a manager",
            ));
        };
        if req.labels.len() > MAX_JOIN_LABELS {
            return Err(Status::invalid_argument(format!(
                "at most {MAX_JOIN_LABELS} node labels may be set when joining"
            )));
        }
        let node_id = self.state.ids.new_id();
        let subject = NodeSubject { node_id: node_id.clone(), role, cluster_id: cluster.id.clone() };
        let cert = self.sign(&cluster, &req.csr, &subject).await?;
        let now = self.state.now();
        let availability =
            node_spec::Availability::try_from(req.availability).unwrap_or(node_spec::Availability::Active);
        let node = Node {
            attachments: Vec::new(),
            id: node_id.clone(),
            meta: Some(shoal_api::Meta { version: None, created_at: Some(now), updated_at: Some(now) }),
            spec: Some(NodeSpec {
                annotations: Some(shoal_api::Annotations { labels: req.labels.clone(), ..Default::default() }),
                desired_role: role_to_proto(role) as i32,
                membership: node_spec::Membership::Accepted as i32,
                availability: availability as i32,
            }),
            description: None,
            status: Some(NodeStatus { state: shoal_api::node_status::State::Unknown as i32, ..Default::default() }),
            manager_status: None,
            certificate: Some(Self::issued(role, req.csr.clone(), cert, &node_id)),
            role: role_to_proto(role) as i32,
            vxlan_udp_port: cluster.vxlan_udp_port,
        };
        self.state
            .write(|_, changes| {
                changes.create(node);
                Ok::<(), std::convert::Infallible>(())
            })
            .await
            .map_err(write_status)?;
        tracing::info!(node = %node_id, role = %role, "issued a certificate to a joining node");
        Ok(IssueNodeCertificateResponse { node_id, node_membership: node_spec::Membership::Accepted as i32 })
    }

    /// Renewal: a node with a valid certificate gets a new one for its current role, or for the manager role
    /// once it is promoted.
    async fn renew(&self, caller: &NodeSubject, csr: Vec<u8>) -> Result<IssueNodeCertificateResponse, Status> {
        let cluster =
            cluster(&self.state).ok_or_else(|| Status::unavailable("the cluster is not initialised yet; retry"))?;
        let node = self.state.store.view(|t| t.nodes().get(&caller.node_id).cloned()).ok_or_else(|| {
            Status::permission_denied(format!("node {} was removed from the cluster", caller.node_id))
        })?;
        let role = if caller.role == Role::Admin {
            return Err(Status::permission_denied(
                "client certificates cannot be renewed through the NodeCA; issue a new one",
            ));
        } else if node.role == NodeRole::Manager as i32
            || node.spec.as_ref().is_some_and(|s| s.desired_role() == NodeRole::Manager)
        {
            // A promoted worker (desired role manager) gets its manager certificate now: it needs one to
            // join Raft, after which its role becomes manager.
            Role::Manager
        } else {
            Role::Worker
        };
        let subject = NodeSubject { node_id: node.id.clone(), role, cluster_id: cluster.id.clone() };
        let cert = self.sign(&cluster, &csr, &subject).await?;
        let now = self.state.now();
        let mut updated = (*node).clone();
        updated.certificate = Some(Self::issued(role, csr, cert, &node.id));
        updated.meta.get_or_insert_with(Default::default).updated_at = Some(now);
        self.state
            .write(|_, changes| {
                changes.update(updated);
                Ok::<(), std::convert::Infallible>(())
            })
            .await
            .map_err(write_status)?;
        tracing::debug!(node = %node.id, role = %role, "renewed a node certificate");
        let membership = node.spec.as_ref().map(|s| s.membership).unwrap_or_default();
        Ok(IssueNodeCertificateResponse { node_id: node.id.clone(), node_membership: membership })
    }
}

#[tonic::async_trait]
impl CaRpc for CaService {
    async fn get_root_ca_certificate(
        &self,
        _req: Request<GetRootCaCertificateRequest>,
    ) -> Result<Response<GetRootCaCertificateResponse>, Status> {
        let cluster =
            cluster(&self.state).ok_or_else(|| Status::unavailable("the cluster is not initialised yet; retry"))?;
        let rc =
            cluster.root_ca.as_ref().ok_or_else(|| Status::unavailable("the cluster has no root CA yet; retry"))?;
        Ok(Response::new(GetRootCaCertificateResponse { certificate: rc.ca_cert.clone() }))
    }
}

#[tonic::async_trait]
impl NodeCaRpc for CaService {
    async fn issue_node_certificate(
        &self,
        req: Request<IssueNodeCertificateRequest>,
    ) -> Result<Response<IssueNodeCertificateResponse>, Status> {
        let caller = peer_identity(&req).cloned();
        let req = req.into_inner();
        if req.csr.is_empty() || req.csr.len() > MAX_CSR_BYTES {
            return Err(Status::invalid_argument(format!("a CSR of 1 to {MAX_CSR_BYTES} bytes is required")));
        }
        let resp = match (req.token.is_empty(), caller) {
            (false, _) => self.issue_for_new_node(req).await?,
            (true, Some(caller)) => self.renew(&caller, req.csr).await?,
            (true, None) => return Err(Status::unauthenticated(
                "a join token is required to get a first certificate (or call with a valid node certificate to renew)",
            )),
        };
        Ok(Response::new(resp))
    }

    async fn node_certificate_status(
        &self,
        req: Request<NodeCertificateStatusRequest>,
    ) -> Result<Response<NodeCertificateStatusResponse>, Status> {
        let node_id = req.into_inner().node_id;
        let node = self
            .state
            .store
            .view(|t| t.nodes().get(&node_id).cloned())
            .ok_or_else(|| Status::not_found(format!("node {node_id} not found")))?;
        let cert = node.certificate.clone().unwrap_or_default();
        Ok(Response::new(NodeCertificateStatusResponse { status: cert.status.clone(), certificate: Some(cert) }))
    }
}

/// Why an operator client certificate could not be issued.
#[derive(Debug, thiserror::Error)]
pub enum ClientCertError {
    /// There is no cluster (or no root CA) yet.
    #[error("the cluster is not initialised yet; retry in a moment")]
    NoCluster,
    /// The name or CSR is unusable.
    #[error("{0}")]
    BadRequest(String),
}

/// Signs `csr_pem` as an operator's client certificate (OU `shoal-admin`, CN `name`, O the cluster ID),
/// valid as long as node certificates. Returns the certificate and the root CA certificate, PEM. Such a
/// certificate opens the Engine API over TCP (`--listen-api`) and nothing else.
pub fn issue_client_cert(state: &ClusterState, name: &str, csr_pem: &str) -> Result<(String, String), ClientCertError> {
    if name.is_empty() || name.len() > 64 || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.') {
        return Err(ClientCertError::BadRequest(format!(
            "invalid client name {name:?}: use 1 to 64 letters, digits, '-' or '.'"
        )));
    }
    let cluster = cluster(state).ok_or(ClientCertError::NoCluster)?;
    let root = root_ca_of(&cluster).map_err(|_| ClientCertError::NoCluster)?;
    let subject = NodeSubject { node_id: name.to_string(), role: Role::Admin, cluster_id: cluster.id.clone() };
    let now = SystemTime::UNIX_EPOCH + Duration::from_millis(state.clock.now_unix_ms());
    let cert = root
        .sign_csr(csr_pem, &subject, node_cert_expiry(&cluster, None), now, &mut rand::rng())
        .map_err(|e| ClientCertError::BadRequest(e.to_string()))?;
    let serial = shoal_ca::parse_cert_pem_chain(cert.as_bytes())
        .and_then(|chain| shoal_ca::cert_serial_hex(&chain[0]))
        .unwrap_or_default();
    // The serial is what `shoal ca revoke-client-cert --serial` takes when the certificate file is lost.
    tracing::info!(name, serial, "issued an operator client certificate");
    Ok((cert, root.cert_pem().to_string()))
}

/// The key under which an operator certificate's revocation is kept in `Cluster.blacklisted_certificates`
/// (SwarmKit's map of removed nodes' certificates, keyed by node ID; node IDs never contain ':', so the
/// two kinds of entries cannot collide). `serial_hex` as `shoal_ca::cert_serial_hex` gives it.
pub(crate) fn client_cert_revocation_key(serial_hex: &str) -> String {
    format!("client-cert-serial:{serial_hex}")
}

/// Whether the operator certificate with serial `serial_hex` was revoked (and the entry has not expired).
pub fn is_client_cert_revoked(cluster: &Cluster, serial_hex: &str, now: SystemTime) -> bool {
    is_blacklisted(cluster, &client_cert_revocation_key(serial_hex), now)
}

/// An operator certificate revoked by `revoke_client_cert`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevokedClientCert {
    /// Its serial number (normalised hex).
    pub serial: String,
    /// Its name (CN), when the certificate itself was given.
    pub name: Option<String>,
    /// Until when the revocation is kept: the certificate's own expiry, or `None` (kept for good) when only
    /// the serial was given.
    pub until: Option<SystemTime>,
}

/// Revokes an operator client certificate (`shoal ca revoke-client-cert`), given either its PEM
/// (`certificate`) or its serial number in hex (`serial`). From the commit on, every entry point that
/// authenticates by certificate refuses it. Refuses node certificates (remove the node instead) and
/// certificates of another cluster; changes nothing then.
pub async fn revoke_client_cert(
    state: &ClusterState,
    serial: Option<&str>,
    certificate: Option<&str>,
) -> Result<RevokedClientCert, crate::error::ControlError> {
    use crate::error::ControlError;
    let cluster =
        cluster(state).ok_or_else(|| ControlError::Unavailable("the cluster is not initialised yet; retry".into()))?;
    let revoked = match (serial.filter(|s| !s.is_empty()), certificate.filter(|c| !c.is_empty())) {
        (Some(s), None) => RevokedClientCert {
            serial: shoal_ca::normalize_serial_hex(s).ok_or_else(|| {
                ControlError::InvalidArgument(format!(
                    "Serial {s:?} is not a certificate serial number: give it in hex, as `openssl x509 -serial \
                     -noout` prints it"
                ))
            })?,
            name: None,
            until: None,
        },
        (None, Some(pem)) => {
            let bad = |e: shoal_ca::CaError| ControlError::InvalidArgument(format!("Certificate: {e}"));
            let chain = shoal_ca::parse_cert_pem_chain(pem.as_bytes()).map_err(bad)?;
            let info = shoal_ca::parse_cert(&chain[0]).map_err(bad)?;
            if info.subject.cluster_id != cluster.id {
                return Err(ControlError::InvalidArgument(format!(
                    "Certificate: it was issued for cluster {:?}, not this one ({}); nothing to revoke here",
                    info.subject.cluster_id, cluster.id
                )));
            }
            if info.subject.role != Role::Admin {
                return Err(ControlError::InvalidArgument(format!(
                    "Certificate: it is the {} certificate of node {}, not an operator certificate; remove the \
                     node with `docker node rm` (and demote it first if it is a manager) to refuse it",
                    info.subject.role, info.subject.node_id
                )));
            }
            RevokedClientCert {
                serial: shoal_ca::cert_serial_hex(&chain[0]).map_err(bad)?,
                name: Some(info.subject.node_id),
                until: Some(info.not_after),
            }
        }
        _ => {
            return Err(ControlError::InvalidArgument(
                "give exactly one of Serial (hex) and Certificate (PEM) of the operator certificate to revoke".into(),
            ))
        }
    };
    let now = SystemTime::UNIX_EPOCH + Duration::from_millis(state.clock.now_unix_ms());
    let key = client_cert_revocation_key(&revoked.serial);
    let entry = shoal_api::BlacklistedCertificate { expiry: revoked.until.map(Into::into) };
    state
        .write(|t, changes| {
            let Some(current) = t.clusters().iter().min_by(|a, b| a.id.cmp(&b.id)) else {
                return Err(ControlError::Unavailable("the cluster is not initialised yet; retry".into()));
            };
            if current.blacklisted_certificates.get(&key) == Some(&entry) {
                return Ok(());
            }
            let mut next = (**current).clone();
            next.blacklisted_certificates.retain(|id, _| is_blacklisted(current, id, now));
            next.blacklisted_certificates.insert(key.clone(), entry);
            changes.update(next);
            Ok(())
        })
        .await?;
    tracing::info!(serial = %revoked.serial, name = ?revoked.name, "revoked an operator client certificate");
    Ok(revoked)
}

/// Whether node `id`'s certificate is refused: the node was removed and its certificate has not expired.
pub fn is_blacklisted(cluster: &shoal_api::Cluster, id: &str, now: std::time::SystemTime) -> bool {
    cluster
        .blacklisted_certificates
        .get(id)
        .is_some_and(|b| b.expiry.and_then(|e| std::time::SystemTime::try_from(e).ok()).is_none_or(|e| e > now))
}

/// Extracts the caller's node ID: the CN of its verified client certificate, which the authorization layer
/// put in the request (`ca::PeerIdentity`). The one place that knows where a dispatcher caller's identity
/// comes from.
pub(crate) fn node_identity<T>(req: &Request<T>) -> Result<String, Status> {
    match peer_identity(req) {
        Some(subject) if !subject.node_id.is_empty() => Ok(subject.node_id.clone()),
        _ => Err(Status::unauthenticated(
            "no node identity: connect with mutual TLS and the node certificate issued when this node joined",
        )),
    }
}
