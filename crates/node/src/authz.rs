//! Authorization of every gRPC call on the remote API port: one table says which callers each method
//! accepts (`RPC_ACCESS`; a method not in it is manager-only), and a tower layer in front of all services
//! checks the caller's verified client certificate against it, the cluster (O = this cluster's ID) and the
//! store (the node named by CN must still exist). An allowed call carries the caller's subject into the
//! handler as `shoal_manager::ca::PeerIdentity`; a refused one gets UNAUTHENTICATED (no certificate) or
//! PERMISSION_DENIED (wrong role, cluster or a removed node) with a message that says why, and never
//! reaches a handler.
//!
//! Must not know what the services do; it sees only method paths and certificates.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use shoal_api::NodeRole;
use shoal_ca::{NodeSubject, Role};
use shoal_manager::ca::PeerIdentity;
use shoal_store::MemoryStore;
use tonic::codegen::http;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::Status;

/// Who may call a method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone, with or without a certificate (a joining node has none yet).
    Anyone,
    /// Nodes of this cluster: workers and managers.
    Nodes,
    /// Managers of this cluster only.
    Managers,
}

/// Every gRPC method Shoal serves, with who may call it. Keep it complete: a test fails when a method in
/// `crates/api/proto` is missing here. Modeled on SwarmKit's per-method `tls_authorization` options.
pub const RPC_ACCESS: &[(&str, Access)] = &[
    ("/docker.swarmkit.v1.CA/GetRootCACertificate", Access::Anyone),
    ("/docker.swarmkit.v1.NodeCA/IssueNodeCertificate", Access::Anyone),
    ("/docker.swarmkit.v1.NodeCA/NodeCertificateStatus", Access::Anyone),
    ("/docker.swarmkit.v1.Dispatcher/Session", Access::Nodes),
    ("/docker.swarmkit.v1.Dispatcher/Heartbeat", Access::Nodes),
    ("/docker.swarmkit.v1.Dispatcher/UpdateTaskStatus", Access::Nodes),
    ("/docker.swarmkit.v1.Dispatcher/Assignments", Access::Nodes),
    ("/docker.swarmkit.v1.LogBroker/ListenSubscriptions", Access::Nodes),
    ("/docker.swarmkit.v1.LogBroker/PublishLogs", Access::Nodes),
    ("/docker.swarmkit.v1.ResourceAllocator/AttachNetwork", Access::Nodes),
    ("/docker.swarmkit.v1.ResourceAllocator/DetachNetwork", Access::Nodes),
    ("/docker.swarmkit.v1.Logs/SubscribeLogs", Access::Managers),
    ("/docker.swarmkit.v1.Health/Check", Access::Managers),
    ("/docker.swarmkit.v1.Raft/ProcessRaftMessage", Access::Managers),
    ("/docker.swarmkit.v1.Raft/StreamRaftMessage", Access::Managers),
    ("/docker.swarmkit.v1.Raft/ResolveAddress", Access::Managers),
    ("/docker.swarmkit.v1.RaftMembership/Join", Access::Managers),
    ("/docker.swarmkit.v1.RaftMembership/Leave", Access::Managers),
    ("/docker.swarmkit.v1.RaftProposals/ForwardProposal", Access::Managers),
    // SwarmKit's own API: served only on the local `--listen-swarmkit-api` socket (whose file mode is the
    // access control), never on the remote port; listed as SwarmKit's protos say (swarm-manager).
    ("/docker.swarmkit.v1.Control/GetNode", Access::Managers),
    ("/docker.swarmkit.v1.Control/ListNodes", Access::Managers),
    ("/docker.swarmkit.v1.Control/UpdateNode", Access::Managers),
    ("/docker.swarmkit.v1.Control/RemoveNode", Access::Managers),
    ("/docker.swarmkit.v1.Control/GetTask", Access::Managers),
    ("/docker.swarmkit.v1.Control/ListTasks", Access::Managers),
    ("/docker.swarmkit.v1.Control/GetService", Access::Managers),
    ("/docker.swarmkit.v1.Control/ListServices", Access::Managers),
    ("/docker.swarmkit.v1.Control/CreateService", Access::Managers),
    ("/docker.swarmkit.v1.Control/UpdateService", Access::Managers),
    ("/docker.swarmkit.v1.Control/RemoveService", Access::Managers),
    ("/docker.swarmkit.v1.Control/ListServiceStatuses", Access::Managers),
    ("/docker.swarmkit.v1.Control/GetNetwork", Access::Managers),
    ("/docker.swarmkit.v1.Control/ListNetworks", Access::Managers),
    ("/docker.swarmkit.v1.Control/CreateNetwork", Access::Managers),
    ("/docker.swarmkit.v1.Control/RemoveNetwork", Access::Managers),
    ("/docker.swarmkit.v1.Control/GetCluster", Access::Managers),
    ("/docker.swarmkit.v1.Control/ListClusters", Access::Managers),
    ("/docker.swarmkit.v1.Control/UpdateCluster", Access::Managers),
    ("/docker.swarmkit.v1.Control/GetSecret", Access::Managers),
    ("/docker.swarmkit.v1.Control/UpdateSecret", Access::Managers),
    ("/docker.swarmkit.v1.Control/ListSecrets", Access::Managers),
    ("/docker.swarmkit.v1.Control/CreateSecret", Access::Managers),
    ("/docker.swarmkit.v1.Control/RemoveSecret", Access::Managers),
    ("/docker.swarmkit.v1.Control/GetConfig", Access::Managers),
    ("/docker.swarmkit.v1.Control/UpdateConfig", Access::Managers),
    ("/docker.swarmkit.v1.Control/ListConfigs", Access::Managers),
    ("/docker.swarmkit.v1.Control/CreateConfig", Access::Managers),
    ("/docker.swarmkit.v1.Control/RemoveConfig", Access::Managers),
    ("/docker.swarmkit.v1.Watch/Watch", Access::Managers),
    // Shoal's own: each node's data-plane view, computed for the node of the caller's certificate.
    ("/shoal.v1.NetworkView/Watch", Access::Nodes),
];

/// Who may call `path` (manager-only when the method is not in `RPC_ACCESS`).
pub fn access_for(path: &str) -> Access {
    RPC_ACCESS.iter().find(|(p, _)| *p == path).map(|(_, a)| *a).unwrap_or(Access::Managers)
}

/// The decision for one call: the method's access, the caller's certificate subject (if any), and what the
/// store says about the node the certificate names (`None`: no such node). Pure; the layer feeds it.
pub fn decide(
    path: &str,
    caller: Option<&NodeSubject>,
    cluster_id: &str,
    stored_role: impl FnOnce(&str) -> Option<NodeRole>,
) -> Result<(), Status> {
    let access = access_for(path);
    let Some(caller) = caller else {
        return match access {
            Access::Anyone => Ok(()),
            _ => Err(Status::unauthenticated(format!(
                "{path} needs a client certificate of this cluster: connect with mutual TLS using the node \
                 certificate issued when the node joined"
            ))),
        };
    };
    if caller.cluster_id != cluster_id {
        return Err(Status::permission_denied(format!(
            "the certificate is for cluster {:?}, not this cluster ({cluster_id}); join this cluster with its token",
            caller.cluster_id
        )));
    }
    let effective = match caller.role {
        Role::Admin => None,
        Role::Manager | Role::Worker => match stored_role(&caller.node_id) {
            None => {
                return Err(Status::permission_denied(format!(
                "node {} was removed from the cluster; its certificate is no longer accepted (join again with a token)",
                caller.node_id
            )))
            }
            // A certificate says manager only while the store agrees (a demoted node keeps its old
            // certificate until it renews).
            Some(NodeRole::Manager) if caller.role == Role::Manager => Some(Role::Manager),
            Some(_) => Some(Role::Worker),
        },
    };
    let allowed = match access {
        Access::Anyone => true,
        Access::Nodes => effective.is_some(),
        Access::Managers => effective == Some(Role::Manager),
    };
    if allowed {
        Ok(())
    } else {
        Err(Status::permission_denied(format!(
            "{path} is for {}; this caller is {} {}",
            if access == Access::Managers { "managers only" } else { "cluster nodes only" },
            caller.role,
            caller.node_id
        )))
    }
}

/// The role the store grants a node for authorization: manager when it is one, or when it was promoted
/// (desired role manager) and must call `RaftMembership.Join` with its new manager certificate before Raft
/// makes it one; else worker.
pub fn role_for_access(node: &shoal_api::Node) -> NodeRole {
    let promoted = node.spec.as_ref().is_some_and(|s| s.desired_role() == NodeRole::Manager);
    if node.role == NodeRole::Manager as i32 || promoted {
        NodeRole::Manager
    } else {
        NodeRole::Worker
    }
}

/// How the layer identifies callers.
#[derive(Clone)]
enum Mode {
    /// By verified client certificate, checked against the store and the cluster ID.
    Mtls { store: Arc<MemoryStore>, cluster_id: Arc<str> },
    /// By the node ID a caller claims in metadata: in-process test harnesses only.
    TrustMetadataForTests,
}

/// The authorization layer put in front of every gRPC service of a node's remote API.
#[derive(Clone)]
pub struct AuthzLayer {
    mode: Mode,
}

impl std::fmt::Debug for AuthzLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.mode {
            Mode::Mtls { cluster_id, .. } => f.debug_struct("AuthzLayer").field("cluster_id", cluster_id).finish(),
            Mode::TrustMetadataForTests => f.write_str("AuthzLayer(trust metadata, tests only)"),
        }
    }
}

impl AuthzLayer {
    /// A layer for the cluster `cluster_id` whose nodes are in `store`: the caller is who its verified
    /// client certificate says, and `RPC_ACCESS` decides.
    pub fn new(store: Arc<MemoryStore>, cluster_id: &str) -> AuthzLayer {
        AuthzLayer { mode: Mode::Mtls { store, cluster_id: cluster_id.into() } }
    }

    /// FOR IN-PROCESS TESTS ONLY (plain HTTP/2, no certificates): believes the node ID a caller claims in
    /// the `x-shoal-node-id` metadata and checks nothing. Never use it on a network.
    pub fn trust_metadata_for_tests() -> AuthzLayer {
        AuthzLayer { mode: Mode::TrustMetadataForTests }
    }

    fn check<B>(&self, req: &http::Request<B>) -> Result<Option<NodeSubject>, Status> {
        let (store, cluster_id) = match &self.mode {
            Mode::Mtls { store, cluster_id } => (store, cluster_id),
            Mode::TrustMetadataForTests => {
                let claimed = req
                    .headers()
                    .get(shoal_manager::dispatcher::NODE_ID_METADATA_KEY)
                    .and_then(|v| v.to_str().ok())
                    .map(str::trim)
                    .filter(|s| !s.is_empty());
                return Ok(claimed.map(|id| NodeSubject {
                    node_id: id.to_string(),
                    role: Role::Worker,
                    cluster_id: String::new(),
                }));
            }
        };
        let certs = req.extensions().get::<TlsConnectInfo<TcpConnectInfo>>().and_then(|i| i.peer_certs());
        let subject = match certs.as_deref() {
            Some(certs) if !certs.is_empty() => Some(crate::tls::peer_subject(certs).ok_or_else(|| {
                Status::permission_denied("the client certificate was not issued to a Shoal node (no role OU)")
            })?),
            _ => None,
        };
        decide(req.uri().path(), subject.as_ref(), cluster_id, |id| {
            store.view(|t| {
                if t.clusters().is_empty() {
                    // A manager that is joining has no state yet (the leader's snapshot is on its way): it
                    // cannot tell removed nodes apart, so it trusts the certificate's role until then.
                    return subject.as_ref().map(|s| {
                        if s.role == Role::Manager {
                            NodeRole::Manager
                        } else {
                            NodeRole::Worker
                        }
                    });
                }
                let removed = t
                    .clusters()
                    .iter()
                    .any(|c| shoal_manager::controlapi::is_blacklisted(c, id, std::time::SystemTime::now()));
                if removed {
                    return None;
                }
                t.nodes().get(id).map(|n| role_for_access(n))
            })
        })?;
        Ok(subject)
    }
}

impl<S> tower::Layer<S> for AuthzLayer {
    type Service = Authz<S>;
    fn layer(&self, inner: S) -> Authz<S> {
        Authz { inner, layer: self.clone() }
    }
}

/// The service `AuthzLayer` wraps around the gRPC routes.
#[derive(Clone, Debug)]
pub struct Authz<S> {
    inner: S,
    layer: AuthzLayer,
}

impl<S, B> tower::Service<http::Request<B>> for Authz<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>> + Send,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        match self.layer.check(&req) {
            Ok(subject) => {
                // The node ID metadata a handler reads (Raft's membership calls) is the verified one, never
                // the caller's claim.
                let claimed = http::HeaderName::from_static(shoal_raft::grpc::NODE_ID_METADATA);
                req.headers_mut().remove(&claimed);
                if let Some(s) = subject {
                    if let Ok(v) = http::HeaderValue::from_str(&s.node_id) {
                        req.headers_mut().insert(claimed, v);
                    }
                    req.extensions_mut().insert(PeerIdentity(s));
                }
                Box::pin(self.inner.call(req))
            }
            Err(status) => {
                tracing::debug!(path = %req.uri().path(), reason = %status.message(), "gRPC call refused");
                Box::pin(std::future::ready(Ok(status.into_http())))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The role x RPC matrix: every method of every service in `crates/api/proto` against every kind of
    //! caller, with the expected decision.

    use super::*;

    const CLUSTER: &str = "cluster1";

    /// Every `/package.Service/Method` declared in the proto files.
    fn methods_in_protos() -> Vec<String> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../api/proto");
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
            let package = text
                .lines()
                .find_map(|l| l.trim().strip_prefix("package ").map(|p| p.trim_end_matches(';').trim().to_string()))
                .unwrap_or_default();
            let mut service = None;
            for line in text.lines().map(str::trim) {
                if line.starts_with("//") {
                    continue;
                }
                if let Some(rest) = line.strip_prefix("service ") {
                    service = Some(rest.trim_end_matches('{').trim().to_string());
                } else if let (Some(svc), Some(rest)) = (&service, line.strip_prefix("rpc ")) {
                    let name = rest.split('(').next().unwrap().trim();
                    out.push(format!("/{package}.{svc}/{name}"));
                } else if line == "}" {
                    service = None;
                }
            }
        }
        out.sort();
        out
    }

    #[test]
    fn every_method_in_the_protos_states_who_may_call_it() {
        let methods = methods_in_protos();
        assert!(methods.len() >= 10, "parsed too few methods: {methods:?}");
        for m in &methods {
            assert!(RPC_ACCESS.iter().any(|(p, _)| p == m), "{m} is not in RPC_ACCESS: say which roles may call it");
        }
    }

    #[derive(Debug, Clone, Copy)]
    enum Caller {
        Anonymous,
        Worker,
        Manager,
        Admin,
        OtherClusterManager,
        RemovedWorker,
        DemotedManager,
    }

    fn subject(c: Caller) -> Option<NodeSubject> {
        let s = |id: &str, role, cluster: &str| NodeSubject { node_id: id.into(), role, cluster_id: cluster.into() };
        match c {
            Caller::Anonymous => None,
            Caller::Worker => Some(s("w1", Role::Worker, CLUSTER)),
            Caller::Manager => Some(s("m1", Role::Manager, CLUSTER)),
            Caller::Admin => Some(s("admin", Role::Admin, CLUSTER)),
            Caller::OtherClusterManager => Some(s("m1", Role::Manager, "cluster2")),
            Caller::RemovedWorker => Some(s("gone", Role::Worker, CLUSTER)),
            Caller::DemotedManager => Some(s("m2", Role::Manager, CLUSTER)),
        }
    }

    fn stored_role(id: &str) -> Option<NodeRole> {
        match id {
            "w1" => Some(NodeRole::Worker),
            "m1" => Some(NodeRole::Manager),
            "m2" => Some(NodeRole::Worker),
            _ => None,
        }
    }

    /// What each caller may do at each access level: (allowed, refusal code when not).
    fn expected(access: Access, caller: Caller) -> Result<(), tonic::Code> {
        use tonic::Code::{PermissionDenied as Denied, Unauthenticated};
        match (caller, access) {
            // Wrong cluster or removed: refused everywhere, even the CA.
            (Caller::OtherClusterManager | Caller::RemovedWorker, _) => Err(Denied),
            (_, Access::Anyone) => Ok(()),
            (Caller::Anonymous, _) => Err(Unauthenticated),
            (Caller::Worker | Caller::Manager | Caller::DemotedManager, Access::Nodes) => Ok(()),
            (Caller::Admin, Access::Nodes) => Err(Denied),
            (Caller::Manager, Access::Managers) => Ok(()),
            (Caller::Worker | Caller::DemotedManager | Caller::Admin, Access::Managers) => Err(Denied),
        }
    }

    #[test]
    fn a_promoted_worker_has_manager_access_and_a_plain_worker_does_not() {
        let mut node = shoal_api::Node { role: NodeRole::Worker as i32, ..Default::default() };
        assert_eq!(role_for_access(&node), NodeRole::Worker);
        node.spec.get_or_insert_with(Default::default).set_desired_role(NodeRole::Manager);
        assert_eq!(role_for_access(&node), NodeRole::Manager);
        // Demoted and out of Raft: a worker again.
        node.spec.get_or_insert_with(Default::default).set_desired_role(NodeRole::Worker);
        assert_eq!(role_for_access(&node), NodeRole::Worker);
        node.role = NodeRole::Manager as i32;
        assert_eq!(role_for_access(&node), NodeRole::Manager);
    }

    #[test]
    fn role_by_method_matrix() {
        let callers = [
            Caller::Anonymous,
            Caller::Worker,
            Caller::Manager,
            Caller::Admin,
            Caller::OtherClusterManager,
            Caller::RemovedWorker,
            Caller::DemotedManager,
        ];
        let mut methods = methods_in_protos();
        methods.push("/docker.swarmkit.v1.Control/ListNodes".into()); // not served: manager-only by default
        let mut checked = 0;
        for m in &methods {
            for c in callers {
                let got = decide(m, subject(c).as_ref(), CLUSTER, stored_role).map_err(|s| s.code());
                assert_eq!(got, expected(access_for(m), c), "{m} called by {c:?}");
                checked += 1;
            }
        }
        // Spot checks of the table itself.
        assert_eq!(access_for("/docker.swarmkit.v1.Raft/ProcessRaftMessage"), Access::Managers);
        assert_eq!(access_for("/docker.swarmkit.v1.RaftMembership/Join"), Access::Managers);
        assert_eq!(access_for("/docker.swarmkit.v1.Dispatcher/Session"), Access::Nodes);
        assert_eq!(access_for("/docker.swarmkit.v1.NodeCA/IssueNodeCertificate"), Access::Anyone);
        assert_eq!(access_for("/docker.swarmkit.v1.CA/GetRootCACertificate"), Access::Anyone);
        assert_eq!(checked, methods.len() * callers.len());
    }

    #[test]
    fn refusals_say_why() {
        let worker = subject(Caller::Worker).unwrap();
        let e = decide("/docker.swarmkit.v1.Raft/ProcessRaftMessage", Some(&worker), CLUSTER, stored_role).unwrap_err();
        assert!(e.message().contains("managers only"), "{}", e.message());
        let e = decide("/docker.swarmkit.v1.Dispatcher/Session", None, CLUSTER, stored_role).unwrap_err();
        assert!(e.message().contains("client certificate"), "{}", e.message());
        let other = subject(Caller::OtherClusterManager).unwrap();
        let e = decide("/docker.swarmkit.v1.Dispatcher/Session", Some(&other), CLUSTER, stored_role).unwrap_err();
        assert!(e.message().contains("cluster2"), "{}", e.message());
        let gone = subject(Caller::RemovedWorker).unwrap();
        let e = decide("/docker.swarmkit.v1.Dispatcher/Session", Some(&gone), CLUSTER, stored_role).unwrap_err();
        assert!(e.message().contains("removed"), "{}", e.message());
    }
}
