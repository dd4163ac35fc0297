//! Where a node's TLS identity comes from on each start, and the glue that hands it to the other parts:
//! the certificate files of an earlier start; a certificate the CA issued for a join token; or, for the
//! first manager of a new cluster, a root CA made here and a manager certificate signed with it locally
//! (the root is written to the cluster object by the bootstrap, and the files only after that write, so a
//! crash in between is repaired from the store on the next start). Also the `ChannelFactory` that gives
//! Raft's gRPC clients mutual TLS, and the remote API server (TLS listener + authorization layer + CA
//! services).
//!
//! Must not log key material or tokens.

use std::sync::Arc;
use std::time::SystemTime;

use shoal_ca::{NodeSubject, Role, RootCa};
use shoal_manager::ClusterState;
use shoal_raft::grpc::{ChannelError, ChannelFactory};
use shoal_store::MemoryStore;
use tonic::transport::Endpoint;

use crate::join::{self, NodeCerts};
use crate::tls::NodeTls;
use crate::{NodeError, CLUSTER_NAME};

impl ChannelFactory for NodeTls {
    fn endpoint(&self, addr: &str) -> Result<Endpoint, ChannelError> {
        NodeTls::endpoint(self, addr).map_err(|e| ChannelError { addr: addr.to_string(), reason: e.to_string() })
    }
}

/// A root CA and cluster ID made for a cluster that has none yet; `bootstrap::ensure_cluster` writes them.
#[derive(Clone)]
pub(crate) struct PendingRoot {
    /// The cluster ID to create the cluster with (the existing one for a cluster without a root CA).
    pub cluster_id: String,
    /// The root CA material and join tokens.
    pub root_ca: shoal_api::RootCa,
}

impl std::fmt::Debug for PendingRoot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingRoot").field("cluster_id", &self.cluster_id).finish_non_exhaustive()
    }
}

/// A manager's TLS identity for this start, and what must still be written.
pub(crate) struct ManagerTls {
    pub tls: NodeTls,
    /// Set for a new root: write it with the cluster, then `certs` to disk.
    pub pending: Option<(PendingRoot, NodeCerts)>,
}

fn sign_locally(root: &RootCa, subject: &NodeSubject, validity: std::time::Duration) -> Result<NodeCerts, NodeError> {
    let csr = shoal_ca::generate_node_key_and_csr().map_err(|e| NodeError::Security(e.to_string()))?;
    let cert_pem = root
        .sign_csr(&csr.csr_pem, subject, validity, SystemTime::now(), &mut rand::rng())
        .map_err(|e| NodeError::Security(e.to_string()))?;
    Ok(NodeCerts { root_pem: root.cert_pem().to_string(), cert_pem, key_pem: csr.key_pem })
}

/// The TLS identity of a manager that did not join with a token (see the module doc). `store` is the
/// recovered store (Raft started).
pub(crate) fn manager_tls(
    state_dir: &std::path::Path,
    node_id: &str,
    store: &MemoryStore,
    expiry_override: Option<std::time::Duration>,
) -> Result<ManagerTls, NodeError> {
    if let Some(certs) = join::load_certs(state_dir).map_err(|e| NodeError::Security(e.to_string()))? {
        let tls = certs.tls().map_err(|e| NodeError::Security(e.to_string()))?;
        return Ok(ManagerTls { tls, pending: None });
    }
    let cluster = store.view(|t| t.clusters().by_name(CLUSTER_NAME).cloned());
    if let Some(c) = cluster.as_ref().filter(|c| c.root_ca.as_ref().is_some_and(|r| !r.ca_cert.is_empty())) {
        // The cluster has its root (an earlier start crashed before writing the files): sign from it.
        let root = shoal_manager::root_ca_of(c).map_err(|e| NodeError::Security(e.message().to_string()))?;
        let subject = NodeSubject { node_id: node_id.to_string(), role: Role::Manager, cluster_id: c.id.clone() };
        let certs = sign_locally(&root, &subject, shoal_manager::node_cert_expiry(c, expiry_override))?;
        join::store_certs(state_dir, &certs).map_err(|e| NodeError::Security(e.to_string()))?;
        let tls = certs.tls().map_err(|e| NodeError::Security(e.to_string()))?;
        return Ok(ManagerTls { tls, pending: None });
    }
    // A new cluster (or one from before TLS): a new root.
    let cluster_id = match &cluster {
        Some(c) => c.id.clone(),
        None => shoal_store::IdSource::new_id(&shoal_manager::RandomIds::from_os()),
    };
    let root_ca = shoal_manager::new_root_ca(SystemTime::now()).map_err(|e| NodeError::Security(e.to_string()))?;
    let root = RootCa::from_pem(
        std::str::from_utf8(&root_ca.ca_cert).expect("generated PEM"),
        std::str::from_utf8(&root_ca.ca_key).expect("generated PEM"),
    )
    .map_err(|e| NodeError::Security(e.to_string()))?;
    let subject = NodeSubject { node_id: node_id.to_string(), role: Role::Manager, cluster_id: cluster_id.clone() };
    let validity = expiry_override.unwrap_or(shoal_ca::DEFAULT_NODE_CERT_EXPIRY);
    let certs = sign_locally(&root, &subject, validity)?;
    let tls = certs.tls().map_err(|e| NodeError::Security(e.to_string()))?;
    Ok(ManagerTls { tls, pending: Some((PendingRoot { cluster_id, root_ca }, certs)) })
}

/// What a manager's remote API server needs for mutual TLS: its certificate material, the authorization
/// layer, and the CA services to mount.
#[derive(Clone)]
pub(crate) struct RemoteSecurity {
    /// The server's (and this node's client) certificate material.
    pub tls: NodeTls,
    /// The authorization module every certificate-authenticated entry point of this manager asks.
    pub authz: crate::authz::Authorizer,
    /// The CA and NodeCA services.
    pub ca: shoal_manager::CaService,
}

impl RemoteSecurity {
    /// Security for a manager of `cluster_id` over `state`.
    pub(crate) fn new(
        tls: NodeTls,
        state: &ClusterState,
        cluster_id: &str,
        expiry_override: Option<std::time::Duration>,
    ) -> RemoteSecurity {
        RemoteSecurity {
            tls,
            authz: crate::authz::Authorizer::new(state.store.clone(), cluster_id),
            ca: shoal_manager::CaService::new(state.clone(), expiry_override)
                .with_external_signer(Arc::new(crate::external_ca::CfsslSigner)),
        }
    }
}

impl std::fmt::Debug for RemoteSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteSecurity").field("tls", &self.tls).finish_non_exhaustive()
    }
}

/// A channel factory whose TLS material is set after Raft started (a manager's certificate can depend on
/// the recovered store). Until then every endpoint fails with "not ready", and Raft retransmits later.
#[derive(Clone, Default)]
pub(crate) struct LateTls(Arc<std::sync::OnceLock<NodeTls>>);

impl LateTls {
    /// With `tls` already set when it is known.
    pub(crate) fn new(tls: Option<NodeTls>) -> LateTls {
        let late = LateTls::default();
        if let Some(t) = tls {
            late.set(t);
        }
        late
    }

    /// Sets the material (once; later calls are ignored).
    pub(crate) fn set(&self, tls: NodeTls) {
        let _ = self.0.set(tls);
    }
}

impl ChannelFactory for LateTls {
    fn endpoint(&self, addr: &str) -> Result<Endpoint, ChannelError> {
        match self.0.get() {
            Some(tls) => ChannelFactory::endpoint(tls, addr),
            None => Err(ChannelError { addr: addr.to_string(), reason: "this node's TLS is not set up yet".into() }),
        }
    }
}

/// The node's certificate files as TLS material, if the state dir has them.
pub(crate) fn load_tls(state_dir: &std::path::Path) -> Result<Option<NodeTls>, NodeError> {
    match join::load_certs(state_dir).map_err(|e| NodeError::Security(e.to_string()))? {
        Some(certs) => Ok(Some(certs.tls().map_err(|e| NodeError::Security(e.to_string()))?)),
        None => Ok(None),
    }
}
