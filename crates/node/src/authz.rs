//! The one authorization point of a node: every entry point that authenticates callers by certificate asks
//! it, and it decides from the cluster's current state in the store, never from the certificate alone. A
//! caller's standing is read fresh for every request: the certificate must be of this cluster; a node
//! certificate's node must still exist and not be on the removed-node list (`Cluster.blacklisted_certificates`,
//! SwarmKit's); a manager certificate counts as a manager only while the node's desired role (its spec) is
//! manager, and as a Raft member only while its observed role is too (a demotion in progress); an operator
//! certificate (`shoal ca issue-client-cert`) must not be revoked (`shoal ca revoke-client-cert`: its serial on
//! the same list). Long-lived streams are re-checked whenever a node's role, a node's removal or the cluster
//! object changes (`Authorizer::changes`), and closed (gRPC: PERMISSION_DENIED in the trailers; HTTP: the body
//! ends) once the caller no longer passes.
//!
//! What each method or route needs is one table per listener kind: `RPC_ACCESS` for the remote gRPC port (a
//! method not in it is manager-only), `engine_api_access` for the Engine API over TCP. Every listener a
//! node opens registers here (`Authorizer::register`, with how it authenticates), and the control socket
//! lists them (`GET /shoal/v1/entry-points`), so a test can compare them with the sockets the daemon holds.
//!
//! Must not know what the services do; it sees only method paths, certificates and the store.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use hyper::body::{Body, Bytes, Frame, SizeHint};
use parking_lot::Mutex;
use rustls::pki_types::CertificateDer;
use shoal_api::NodeRole;
use shoal_ca::{NodeSubject, Role};
use shoal_manager::PeerIdentity;
use shoal_store::{ActionKind, MemoryStore, Object, Tables};
use tokio::sync::watch;
use tokio_stream::Stream;
use tonic::codegen::http;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::Status;

/// Who may call a method or route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Anyone, with or without a certificate (a joining node has none yet); removed nodes, revoked and
    /// foreign certificates are still refused.
    Anyone,
    /// Nodes of this cluster: workers and managers (a demoted manager too: it is a worker now).
    Nodes,
    /// Members of the Raft group: managers, and a demoted manager until it has left Raft (so that its removal
    /// from the group can complete, as in SwarmKit, whose Raft transport checks the removed list only).
    RaftMembers,
    /// Managers of this cluster only (desired role manager).
    Managers,
    /// The Engine API over TCP: managers and operators whose certificates are not revoked.
    ManagersAndOperators,
    /// Served on the local control socket only: refused to every certificate.
    ControlSocketOnly,
}

/// Every gRPC method Shoal serves, with who may call it. Keep it complete: a test fails when a method in
/// `crates/api/proto` is missing here. Modeled on SwarmKit's per-method `tls_authorization` options.
pub(crate) const RPC_ACCESS: &[(&str, Access)] = &[
    ("/docker.swarmkit.v1.CA/GetRootCACertificate", Access::Anyone),
    ("/docker.swarmkit.v1.NodeCA/IssueNodeCertificate", Access::Anyone),
    ("/docker.swarmkit.v1.NodeCA/NodeCertificateStatus", Access::Anyone),
    ("/docker.swarmkit.v1.Dispatcher/Session", Access::Nodes),
    ("/docker.swarmkit.v1.Dispatcher/Heartbeat", Access::Nodes),
    ("/docker.swarmkit.v1.Dispatcher/UpdateTaskStatus", Access::Nodes),
    ("/docker.swarmkit.v1.Dispatcher/Assignments", Access::Nodes),
    ("/docker.swarmkit.v1.Dispatcher/UpdateVolumeStatus", Access::Nodes),
    ("/docker.swarmkit.v1.LogBroker/ListenSubscriptions", Access::Nodes),
    ("/docker.swarmkit.v1.LogBroker/PublishLogs", Access::Nodes),
    ("/docker.swarmkit.v1.ResourceAllocator/AttachNetwork", Access::Nodes),
    ("/docker.swarmkit.v1.ResourceAllocator/DetachNetwork", Access::Nodes),
    ("/docker.swarmkit.v1.Logs/SubscribeLogs", Access::Managers),
    ("/docker.swarmkit.v1.Health/Check", Access::Managers),
    ("/docker.swarmkit.v1.Raft/ProcessRaftMessage", Access::RaftMembers),
    ("/docker.swarmkit.v1.Raft/StreamRaftMessage", Access::RaftMembers),
    ("/docker.swarmkit.v1.Raft/ResolveAddress", Access::RaftMembers),
    ("/docker.swarmkit.v1.RaftMembership/Join", Access::Managers),
    ("/docker.swarmkit.v1.RaftMembership/Leave", Access::RaftMembers),
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
    ("/docker.swarmkit.v1.Control/CreateVolume", Access::Managers),
    ("/docker.swarmkit.v1.Control/GetVolume", Access::Managers),
    ("/docker.swarmkit.v1.Control/UpdateVolume", Access::Managers),
    ("/docker.swarmkit.v1.Control/ListVolumes", Access::Managers),
    ("/docker.swarmkit.v1.Control/RemoveVolume", Access::Managers),
    ("/docker.swarmkit.v1.Watch/Watch", Access::Managers),
    // Shoal's own: each node's data-plane view, computed for the node of the caller's certificate.
    ("/shoal.v1.NetworkView/Watch", Access::Nodes),
];

/// Who may call `path` on the remote gRPC port (manager-only when the method is not in `RPC_ACCESS`).
pub(crate) fn access_for(path: &str) -> Access {
    RPC_ACCESS.iter().find(|(p, _)| *p == path).map(|(_, a)| *a).unwrap_or(Access::Managers)
}

/// Who may call `path` on the Engine API over TCP: managers and operators, except for the operator
/// certificate endpoints (`/shoal/v1/ca/...`, with or without a `/vN.NN` prefix), which only the local
/// control socket serves (a stolen operator certificate must not mint itself a successor).
pub(crate) fn engine_api_access(path: &str) -> Access {
    let unversioned = match path.strip_prefix("/v") {
        Some(rest) if rest.starts_with(|c: char| c.is_ascii_digit()) => {
            rest.find('/').map(|i| &rest[i..]).unwrap_or("/")
        }
        _ => path,
    };
    if unversioned.starts_with("/shoal/v1/ca/") {
        Access::ControlSocketOnly
    } else {
        Access::ManagersAndOperators
    }
}

/// The message of the 403 answer to a worker's certificate on the Engine API over TCP.
pub(crate) const FORBIDDEN: &str =
    "this certificate may not use the Engine API: it needs the manager role or a client \
certificate from `shoal ca issue-client-cert` (worker certificates are refused)";

/// A caller's verified client certificate: who it names, and its serial (by which an operator certificate
/// is revoked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PeerCert {
    /// CN (node ID or operator name), OU (role), O (cluster ID).
    pub subject: NodeSubject,
    /// The serial number, `shoal_ca::cert_serial_hex`.
    pub serial: String,
}

/// Why a certificate could not be taken for a caller's identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NotShoalCert;

impl PeerCert {
    /// The caller's certificate from a verified chain (the leaf first); `Ok(None)` for no certificate,
    /// `Err` for one Shoal did not issue (no role OU).
    pub(crate) fn from_chain(certs: &[CertificateDer<'_>]) -> Result<Option<PeerCert>, NotShoalCert> {
        let Some(leaf) = certs.first() else { return Ok(None) };
        let subject = shoal_ca::parse_cert(leaf).map_err(|_| NotShoalCert)?.subject;
        let serial = shoal_ca::cert_serial_hex(leaf).map_err(|_| NotShoalCert)?;
        Ok(Some(PeerCert { subject, serial }))
    }
}

/// What the store says about a certificate's holder, read for one decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Facts {
    /// The store holds a cluster object (false on a manager that is joining and has no snapshot yet: it
    /// cannot tell removed nodes apart, so it trusts the certificate's role until then).
    pub state_known: bool,
    /// The node was removed (its ID is on the removed-node list).
    pub removed: bool,
    /// The certificate's serial is on the revoked list.
    pub revoked: bool,
    /// The node object: (observed role, desired role); `None`: no such node.
    pub node: Option<(NodeRole, NodeRole)>,
}

/// What the store says about `cert`'s holder now.
pub(crate) fn facts_in(t: &Tables, cert: &PeerCert, now: SystemTime) -> Facts {
    let Some(cluster) = t.clusters().iter().min_by(|a, b| a.id.cmp(&b.id)).cloned() else {
        return Facts::default();
    };
    Facts {
        state_known: true,
        removed: shoal_manager::controlapi::is_blacklisted(&cluster, &cert.subject.node_id, now),
        revoked: shoal_manager::is_client_cert_revoked(&cluster, &cert.serial, now),
        node: t.nodes().get(&cert.subject.node_id).map(|n| {
            let desired = n.spec.as_ref().map(|s| s.desired_role()).unwrap_or(NodeRole::Worker);
            (n.role(), desired)
        }),
    }
}

/// A caller's standing in the cluster, from its certificate and the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    /// A manager (desired role manager: a promoted worker with its manager certificate counts, as it must
    /// join Raft).
    Manager,
    /// A manager certificate whose node was demoted but is still in the Raft group.
    LeavingManager,
    /// A worker; `demoted` when its certificate still says manager.
    Worker {
        /// The certificate says manager, the store says worker.
        demoted: bool,
    },
    /// An operator (a client certificate from `shoal ca issue-client-cert`, not revoked).
    Operator,
}

/// A refusal: UNAUTHENTICATED (no certificate) or PERMISSION_DENIED / 403, with a message that says why and
/// what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// No certificate at all (gRPC UNAUTHENTICATED); otherwise forbidden.
    pub unauthenticated: bool,
    /// Why, and what to do.
    pub message: String,
}

impl Refusal {
    fn denied(message: String) -> Refusal {
        Refusal { unauthenticated: false, message }
    }

    /// As a gRPC status.
    pub(crate) fn status(&self) -> Status {
        if self.unauthenticated {
            Status::unauthenticated(self.message.clone())
        } else {
            Status::permission_denied(self.message.clone())
        }
    }

    /// As the Engine API's JSON error: 403 `{"message": ...}`.
    pub(crate) fn http_response(&self) -> axum::response::Response {
        use axum::response::IntoResponse;
        let status =
            if self.unauthenticated { axum::http::StatusCode::UNAUTHORIZED } else { axum::http::StatusCode::FORBIDDEN };
        (status, axum::Json(serde_json::json!({ "message": self.message }))).into_response()
    }
}

/// The decision for one call of `what` needing `access`: the caller's certificate (if any), this cluster's ID,
/// and what the store says about its holder (`facts`, read only when there is a certificate). Pure.
pub(crate) fn decide(
    what: &str,
    access: Access,
    caller: Option<&PeerCert>,
    cluster_id: &str,
    facts: impl FnOnce(&PeerCert) -> Facts,
) -> Result<Option<Standing>, Refusal> {
    let Some(cert) = caller else {
        return match access {
            Access::Anyone => Ok(None),
            _ => Err(Refusal {
                unauthenticated: true,
                message: format!(
                    "{what} needs a client certificate of this cluster: connect with mutual TLS using the node \
                     certificate issued when the node joined"
                ),
            }),
        };
    };
    let s = &cert.subject;
    if s.cluster_id != cluster_id {
        return Err(Refusal::denied(format!(
            "the certificate is for cluster {:?}, not this cluster ({cluster_id}); join this cluster with its token",
            s.cluster_id
        )));
    }
    if access == Access::ControlSocketOnly {
        return Err(Refusal::denied(format!(
            "{what} is served on a manager's local control socket only, never to a certificate: run the command \
             there (e.g. `shoal -H unix:///run/shoal/control.sock ca ...`)"
        )));
    }
    let f = facts(cert);
    let standing = match s.role {
        Role::Admin if f.revoked => {
            return Err(Refusal::denied(format!(
                "operator certificate {:?} (serial {}) was revoked with `shoal ca revoke-client-cert`; have an \
                 operator issue a new one with `shoal ca issue-client-cert` on a manager's control socket",
                s.node_id, cert.serial
            )))
        }
        Role::Admin => Standing::Operator,
        Role::Manager | Role::Worker if !f.state_known => {
            if s.role == Role::Manager {
                Standing::Manager
            } else {
                Standing::Worker { demoted: false }
            }
        }
        Role::Manager | Role::Worker => match f.node {
            _ if f.removed => {
                return Err(Refusal::denied(format!(
                    "node {} was removed from the cluster; its certificate is no longer accepted (join again with a \
                     token)",
                    s.node_id
                )))
            }
            None => {
                return Err(Refusal::denied(format!(
                    "node {} is not in this cluster (removed, or never joined); its certificate is not accepted (join \
                     again with a token)",
                    s.node_id
                )))
            }
            Some(_) if s.role == Role::Worker => Standing::Worker { demoted: false },
            Some((_, NodeRole::Manager)) => Standing::Manager,
            Some((NodeRole::Manager, _)) => Standing::LeavingManager,
            Some(_) => Standing::Worker { demoted: true },
        },
    };
    let allowed = match access {
        Access::Anyone => true,
        Access::Nodes => !matches!(standing, Standing::Operator),
        Access::RaftMembers => matches!(standing, Standing::Manager | Standing::LeavingManager),
        Access::Managers => standing == Standing::Manager,
        Access::ManagersAndOperators => matches!(standing, Standing::Manager | Standing::Operator),
        Access::ControlSocketOnly => false,
    };
    if allowed {
        return Ok(Some(standing));
    }
    let who = match standing {
        Standing::Manager => "a manager",
        Standing::LeavingManager | Standing::Worker { demoted: true } => "a demoted manager (a worker now)",
        Standing::Worker { demoted: false } => "a worker",
        Standing::Operator => "an operator client certificate",
    };
    Err(Refusal::denied(match (access, standing) {
        (Access::ManagersAndOperators, Standing::Worker { demoted: false }) => FORBIDDEN.to_string(),
        (Access::ManagersAndOperators, _) => format!(
            "this certificate may not use the Engine API: node {} was demoted and is no longer a manager; use a \
             current manager's certificate or a client certificate from `shoal ca issue-client-cert`",
            s.node_id
        ),
        _ => format!(
            "{what} is for {}; this caller is {who} ({})",
            match access {
                Access::Managers => "managers only",
                Access::RaftMembers => "managers only (members of the Raft group)",
                _ => "cluster nodes only",
            },
            s.node_id
        ),
    }))
}

/// How a listener authenticates its callers, as `GET /shoal/v1/entry-points` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub(crate) enum Guard {
    /// Mutual TLS, every request decided by this module from the store.
    CertificateAndClusterState,
    /// A local unix socket whose file mode (0600, root) is the access control: its user is the operator.
    SocketFileMode,
    /// No authentication (`--listen-metrics`: metrics and the live page, no secrets or tokens; loopback is the
    /// documented address).
    None,
    /// The cluster's `networking:gossip` keys (the overlay gossip with Docker Engines, port 7946): a message
    /// that does not open with one is dropped unanswered. Every node of the cluster holds them, as in Docker's
    /// swarm; they rotate every 12 hours.
    GossipKey,
}

/// One listener a node opened.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct EntryPoint {
    /// What it serves (`remote-grpc`, `engine-api-tcp`, `control-socket`, `swarmkit-socket`, `metrics`).
    pub name: String,
    /// `IP:PORT` or a socket path.
    pub address: String,
    /// How it authenticates.
    pub guard: Guard,
}

/// The entry points a node opened, in the order they registered. Shared by every clone.
#[derive(Debug, Clone, Default)]
pub(crate) struct EntryPoints(Arc<Mutex<Vec<EntryPoint>>>);

impl EntryPoints {
    /// Records a listener (and logs it).
    pub(crate) fn register(&self, name: &str, address: impl std::fmt::Display, guard: Guard) {
        let e = EntryPoint { name: name.to_string(), address: address.to_string(), guard };
        tracing::info!(name = %e.name, address = %e.address, guard = ?e.guard, "entry point open");
        self.0.lock().push(e);
    }

    /// Every registered listener.
    pub(crate) fn list(&self) -> Vec<EntryPoint> {
        self.0.lock().clone()
    }

    /// `GET /shoal/v1/entry-points`, for the control socket: the registered listeners as JSON.
    pub(crate) fn router(&self) -> axum::Router {
        let me = self.clone();
        axum::Router::new().route(
            "/shoal/v1/entry-points",
            axum::routing::get(move || {
                let list = me.list();
                async move { axum::Json(list) }
            }),
        )
    }
}

/// How often the change watcher looks for state it was not told about (a snapshot installed on this
/// manager replaces the store without per-object events) and whether its authorizer is gone.
pub(crate) const RECHECK_PERIOD: Duration = Duration::from_millis(500);

/// The authorization module of one manager: its store, its cluster's ID, the change signal long-lived
/// streams re-check on, and the entry-point registry. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Authorizer {
    store: Arc<MemoryStore>,
    cluster_id: Arc<str>,
    changes: Arc<watch::Sender<u64>>,
    entry_points: EntryPoints,
}

impl std::fmt::Debug for Authorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authorizer").field("cluster_id", &self.cluster_id).finish_non_exhaustive()
    }
}

/// Whether a commit can change someone's standing: a node removed, a node's role or desired role changed,
/// the cluster object (its removed and revoked lists) changed.
fn touches_standing(c: &shoal_store::Change) -> bool {
    match (&c.object, &c.old) {
        (Object::Cluster(_), _) => true,
        (Object::Node(_), _) if c.kind == ActionKind::Remove => true,
        (Object::Node(new), Some(Object::Node(old))) => {
            let desired = |n: &shoal_api::Node| n.spec.as_ref().map(|s| s.desired_role);
            new.role != old.role || desired(new) != desired(old)
        }
        _ => false,
    }
}

async fn watch_changes(store: Arc<MemoryStore>, changes: Weak<watch::Sender<u64>>) {
    let mut watch = store.watch();
    let mut seen = store.last_index();
    let mut tick = tokio::time::interval(RECHECK_PERIOD);
    loop {
        let bump = tokio::select! {
            c = watch.recv() => match c {
                Ok(c) => {
                    seen = seen.max(c.index);
                    c.changes.iter().any(touches_standing)
                }
                Err(shoal_store::WatchError::Lagged(_)) => true,
                Err(shoal_store::WatchError::Closed) => return,
            },
            _ = tick.tick() => {
                let now = store.last_index();
                std::mem::replace(&mut seen, now) < now
            }
        };
        let Some(tx) = changes.upgrade() else { return };
        if bump {
            tx.send_modify(|g| *g += 1);
        }
    }
}

impl Authorizer {
    /// The module for the cluster `cluster_id` whose state is `store`. Starts the change watcher (it ends
    /// when the last clone is dropped), so call it inside the runtime.
    pub(crate) fn new(store: Arc<MemoryStore>, cluster_id: &str) -> Authorizer {
        let changes = Arc::new(watch::channel(0).0);
        tokio::spawn(watch_changes(store.clone(), Arc::downgrade(&changes)));
        Authorizer { store, cluster_id: cluster_id.into(), changes, entry_points: EntryPoints::default() }
    }

    /// The registry of this node's entry points.
    pub(crate) fn entry_points(&self) -> &EntryPoints {
        &self.entry_points
    }

    /// Decides one call of `what` needing `access` by `caller`, from the store as it is now.
    pub(crate) fn check(
        &self,
        what: &str,
        access: Access,
        caller: Option<&PeerCert>,
    ) -> Result<Option<Standing>, Refusal> {
        let now = SystemTime::now();
        decide(what, access, caller, &self.cluster_id, |c| self.store.view(|t| facts_in(t, c, now)))
    }

    /// A signal that moves whenever someone's standing may have changed (see `touches_standing`).
    pub(crate) fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The gRPC layer for the remote port (registered as `remote-grpc` on `address`).
    pub(crate) fn grpc_layer(&self, address: impl std::fmt::Display) -> AuthzLayer {
        self.entry_points.register("remote-grpc", address, Guard::CertificateAndClusterState);
        AuthzLayer { mode: Mode::Mtls(self.clone()) }
    }

    /// The HTTP layer for one connection of the Engine API over TCP whose client presented `caller`:
    /// every request is decided by `engine_api_access`, and a streamed answer ends once the caller no
    /// longer passes. (The listener registers itself with `register`.)
    pub(crate) fn engine_api_gate(&self, caller: Option<PeerCert>) -> EngineApiGate {
        EngineApiGate { authz: self.clone(), caller: caller.map(Arc::new) }
    }

    /// A re-check of `caller` for `what` against the store, for a stream (`Revocable`).
    fn recheck(&self, what: String, access: Access, caller: Arc<PeerCert>) -> Recheck {
        let me = self.clone();
        Arc::new(move || me.check(&what, access, Some(&caller)).map(|_| ()))
    }
}

type Recheck = Arc<dyn Fn() -> Result<(), Refusal> + Send + Sync>;

/// What a revoked stream does at its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// A gRPC response: trailers with the refusal's status.
    GrpcTrailers,
    /// A gRPC request stream: an error the handler sees as the refusal's status.
    GrpcRequestError,
    /// An HTTP answer: the body just ends (the client sees the stream close).
    Stop,
}

/// A body that is re-checked whenever `Authorizer::changes` moves, and ends (see `End`) once the check
/// fails.
pub(crate) struct Revocable<B> {
    inner: B,
    changes: Option<tokio_stream::wrappers::WatchStream<u64>>,
    recheck: Recheck,
    end: End,
    ended: bool,
}

impl<B> Revocable<B> {
    fn new(inner: B, changes: watch::Receiver<u64>, recheck: Recheck, end: End) -> Revocable<B> {
        let changes = Some(tokio_stream::wrappers::WatchStream::from_changes(changes));
        Revocable { inner, changes, recheck, end, ended: false }
    }
}

/// The error a revoked gRPC request stream reports (`Into<BoxError>` for tonic).
trait FromRefusal {
    fn from_refusal(r: &Refusal) -> Option<Self>
    where
        Self: Sized;
}

impl FromRefusal for Status {
    fn from_refusal(r: &Refusal) -> Option<Status> {
        Some(r.status())
    }
}

impl FromRefusal for axum::Error {
    fn from_refusal(_: &Refusal) -> Option<axum::Error> {
        None
    }
}

impl<B> Body for Revocable<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: FromRefusal,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        if this.ended {
            return Poll::Ready(None);
        }
        while let Some(changes) = this.changes.as_mut() {
            match Pin::new(&mut *changes).poll_next(cx) {
                Poll::Ready(Some(_)) => {
                    if let Err(refusal) = (this.recheck)() {
                        tracing::info!(reason = %refusal.message, "a stream was closed: its caller no longer passes");
                        this.ended = true;
                        return Poll::Ready(match this.end {
                            End::GrpcTrailers => {
                                let status = refusal.status();
                                let mut trailers = http::HeaderMap::new();
                                trailers.insert("grpc-status", http::HeaderValue::from(status.code() as i32));
                                if let Ok(v) = http::HeaderValue::from_str(&percent_encode_message(status.message())) {
                                    trailers.insert("grpc-message", v);
                                }
                                Some(Ok(Frame::trailers(trailers)))
                            }
                            End::GrpcRequestError => B::Error::from_refusal(&refusal).map(Err),
                            End::Stop => None,
                        });
                    }
                }
                Poll::Ready(None) => this.changes = None,
                Poll::Pending => break,
            }
        }
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(None) = &polled {
            this.ended = true;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        // An answer of known length that is cut short makes hyper close the connection: the client sees it.
        self.inner.size_hint()
    }
}

/// `grpc-message` is percent-encoded (gRPC over HTTP/2: printable ASCII except '%' as is).
fn percent_encode_message(m: &str) -> String {
    let mut out = String::with_capacity(m.len());
    for b in m.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// How the gRPC layer identifies callers.
#[derive(Clone)]
enum Mode {
    /// By verified client certificate, decided by the module.
    Mtls(Authorizer),
    /// By the node ID a caller claims in metadata: in-process test harnesses only.
    #[cfg(any(test, feature = "test-doors"))]
    TrustMetadataForTests,
}

/// The authorization layer put in front of every gRPC service of a node's remote API.
#[derive(Clone)]
pub(crate) struct AuthzLayer {
    mode: Mode,
}

impl std::fmt::Debug for AuthzLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.mode {
            Mode::Mtls(a) => f.debug_struct("AuthzLayer").field("cluster_id", &a.cluster_id).finish(),
            #[cfg(any(test, feature = "test-doors"))]
            Mode::TrustMetadataForTests => f.write_str("AuthzLayer(trust metadata, tests only)"),
        }
    }
}

impl AuthzLayer {
    /// FOR IN-PROCESS TESTS ONLY (plain HTTP/2, no certificates): believes the node ID a caller claims in
    /// the `x-shoal-node-id` metadata and checks nothing. Never use it on a network; the shipped daemon does
    /// not have it (the `test-doors` feature).
    #[cfg(any(test, feature = "test-doors"))]
    pub(crate) fn trust_metadata_for_tests() -> AuthzLayer {
        AuthzLayer { mode: Mode::TrustMetadataForTests }
    }

    /// The caller's identity if the call may go on, with what a stream needs to re-check it.
    // Without the test doors the mode has one variant (mutual TLS), and the match is a plain destructuring.
    #[allow(clippy::type_complexity, clippy::infallible_destructuring_match)]
    fn check<B>(&self, req: &http::Request<B>) -> Result<(Option<NodeSubject>, Option<(Authorizer, Recheck)>), Status> {
        let authz = match &self.mode {
            Mode::Mtls(a) => a,
            #[cfg(any(test, feature = "test-doors"))]
            Mode::TrustMetadataForTests => {
                let claimed = req
                    .headers()
                    .get(shoal_manager::NODE_ID_METADATA_KEY)
                    .and_then(|v| v.to_str().ok())
                    .map(str::trim)
                    .filter(|s| !s.is_empty());
                let subject = claimed.map(|id| NodeSubject {
                    node_id: id.to_string(),
                    role: Role::Worker,
                    cluster_id: String::new(),
                });
                return Ok((subject, None));
            }
        };
        let certs = req.extensions().get::<TlsConnectInfo<TcpConnectInfo>>().and_then(|i| i.peer_certs());
        let cert = PeerCert::from_chain(certs.as_deref().map(|c| c.as_slice()).unwrap_or(&[])).map_err(|_| {
            Status::permission_denied("the client certificate was not issued to a Shoal node (no role OU)")
        })?;
        let path = req.uri().path();
        let access = access_for(path);
        authz.check(path, access, cert.as_ref()).map_err(|r| r.status())?;
        Ok(match cert {
            Some(c) => {
                let subject = c.subject.clone();
                let recheck = authz.recheck(path.to_string(), access, Arc::new(c));
                (Some(subject), Some((authz.clone(), recheck)))
            }
            None => (None, None),
        })
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
pub(crate) struct Authz<S> {
    inner: S,
    layer: AuthzLayer,
}

impl<S> tower::Service<http::Request<tonic::body::Body>> for Authz<S>
where
    S: tower::Service<http::Request<tonic::body::Body>, Response = http::Response<tonic::body::Body>> + Send,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        match self.layer.check(&req) {
            Ok((subject, recheck)) => {
                let (mut parts, body) = req.into_parts();
                // The node ID metadata a handler reads (Raft's membership calls) is the verified one, never
                // the caller's claim.
                let claimed = http::HeaderName::from_static(shoal_raft::grpc::NODE_ID_METADATA);
                parts.headers.remove(&claimed);
                if let Some(s) = subject {
                    if let Ok(v) = http::HeaderValue::from_str(&s.node_id) {
                        parts.headers.insert(claimed, v);
                    }
                    parts.extensions.insert(PeerIdentity(s));
                }
                let Some((authz, recheck)) = recheck else {
                    return Box::pin(self.inner.call(http::Request::from_parts(parts, body)));
                };
                // Both directions of a stream end once the caller no longer passes.
                let body = tonic::body::Body::new(Revocable::new(
                    body,
                    authz.changes(),
                    recheck.clone(),
                    End::GrpcRequestError,
                ));
                let call = self.inner.call(http::Request::from_parts(parts, body));
                Box::pin(async move {
                    let resp = call.await?;
                    Ok(resp.map(|b| {
                        tonic::body::Body::new(Revocable::new(b, authz.changes(), recheck, End::GrpcTrailers))
                    }))
                })
            }
            Err(status) => {
                tracing::debug!(path = %req.uri().path(), reason = %status.message(), "gRPC call refused");
                Box::pin(std::future::ready(Ok(status.into_http())))
            }
        }
    }
}

/// Most of a refused request's body read before the refusal is sent (see `EngineApiGate::around`).
const REFUSED_BODY_DRAIN_BYTES: usize = 1024 * 1024;
/// Longest a refused request's body is waited for.
const REFUSED_BODY_DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(2);

/// The Engine API over TCP's gate for one connection: every request decided by the module, every answer
/// revocable (see `Authorizer::engine_api_gate`).
#[derive(Clone, Debug)]
pub(crate) struct EngineApiGate {
    authz: Authorizer,
    caller: Option<Arc<PeerCert>>,
}

impl EngineApiGate {
    /// Wraps `router` so that each request passes the gate first.
    pub(crate) fn around(self, router: axum::Router) -> axum::Router {
        router.layer(axum::middleware::from_fn(move |req: axum::extract::Request, next: axum::middleware::Next| {
            let gate = self.clone();
            async move {
                let path = req.uri().path().to_string();
                let access = engine_api_access(&path);
                let what = format!("{} {path}", req.method());
                if let Err(refusal) = gate.authz.check(&what, access, gate.caller.as_deref()) {
                    tracing::debug!(%what, reason = %refusal.message, "Engine API request refused");
                    // The request's body is read (bounded) before the refusal is sent: a connection closed with
                    // unread bytes is reset, and the reset can reach the client before the 403 (CI saw a
                    // refused POST come back as no answer at all).
                    let body = http_body_util::Limited::new(req.into_body(), REFUSED_BODY_DRAIN_BYTES);
                    let _ = tokio::time::timeout(REFUSED_BODY_DRAIN_TIME, http_body_util::BodyExt::collect(body)).await;
                    return refusal.http_response();
                }
                let resp = next.run(req).await;
                let Some(caller) = gate.caller.clone() else { return resp };
                let recheck = gate.authz.recheck(what, access, caller);
                let changes = gate.authz.changes();
                resp.map(|b| axum::body::Body::new(Revocable::new(b, changes, recheck, End::Stop)))
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    //! The role x RPC matrix: every method of every service in `crates/api/proto` against every kind of
    //! caller, with the expected decision; and the Engine API's table.

    use super::*;

    const CLUSTER: &str = "cluster1";

    /// Every `/package.Service/Method` declared in the proto files, but the CSI's (`csi.v1`): those are a
    /// volume plugin's services, which Shoal calls and never serves.
    fn methods_in_protos() -> Vec<String> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../api/proto");
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
            let package = text
                .lines()
                .find_map(|l| l.trim().strip_prefix("package ").map(|p| p.trim_end_matches(';').trim().to_string()))
                .unwrap_or_default();
            if package == "csi.v1" {
                continue;
            }
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

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Caller {
        Anonymous,
        Worker,
        Manager,
        Operator,
        RevokedOperator,
        OtherClusterManager,
        RemovedWorker,
        UnknownNode,
        /// Desired worker, still in Raft.
        LeavingManager,
        /// Desired and observed worker, certificate still says manager.
        DemotedManager,
        /// A worker certificate whose node was promoted (it must renew to a manager certificate first).
        PromotedWithWorkerCert,
    }

    const CALLERS: [Caller; 11] = [
        Caller::Anonymous,
        Caller::Worker,
        Caller::Manager,
        Caller::Operator,
        Caller::RevokedOperator,
        Caller::OtherClusterManager,
        Caller::RemovedWorker,
        Caller::UnknownNode,
        Caller::LeavingManager,
        Caller::DemotedManager,
        Caller::PromotedWithWorkerCert,
    ];

    fn cert(c: Caller) -> Option<PeerCert> {
        let s = |id: &str, role, cluster: &str| {
            Some(PeerCert {
                subject: NodeSubject { node_id: id.into(), role, cluster_id: cluster.into() },
                serial: format!("{id}-serial"),
            })
        };
        match c {
            Caller::Anonymous => None,
            Caller::Worker => s("w1", Role::Worker, CLUSTER),
            Caller::Manager => s("m1", Role::Manager, CLUSTER),
            Caller::Operator => s("ops", Role::Admin, CLUSTER),
            Caller::RevokedOperator => s("old-ops", Role::Admin, CLUSTER),
            Caller::OtherClusterManager => s("m1", Role::Manager, "cluster2"),
            Caller::RemovedWorker => s("gone", Role::Worker, CLUSTER),
            Caller::UnknownNode => s("never", Role::Manager, CLUSTER),
            Caller::LeavingManager => s("m2", Role::Manager, CLUSTER),
            Caller::DemotedManager => s("m3", Role::Manager, CLUSTER),
            Caller::PromotedWithWorkerCert => s("w2", Role::Worker, CLUSTER),
        }
    }

    fn facts(c: &PeerCert) -> Facts {
        use NodeRole::{Manager as M, Worker as W};
        let node = match c.subject.node_id.as_str() {
            "w1" => Some((W, W)),
            "m1" => Some((M, M)),
            "m2" => Some((M, W)),
            "m3" => Some((W, W)),
            "w2" => Some((W, M)),
            "gone" => Some((W, W)), // still in the store: the removed list alone refuses it
            _ => None,
        };
        Facts { state_known: true, removed: c.subject.node_id == "gone", revoked: c.serial == "old-ops-serial", node }
    }

    /// What each caller may do at each access level: Ok, or the refusal's kind (true: unauthenticated).
    fn expected(access: Access, caller: Caller) -> Result<(), bool> {
        use Caller::*;
        match (caller, access) {
            (Anonymous, Access::Anyone) => Ok(()),
            (Anonymous, _) => Err(true),
            // Wrong cluster, removed, unknown, revoked: refused everywhere, even the CA.
            (OtherClusterManager | RemovedWorker | UnknownNode | RevokedOperator, _) => Err(false),
            (_, Access::ControlSocketOnly) => Err(false),
            (_, Access::Anyone) => Ok(()),
            (Operator, Access::ManagersAndOperators) => Ok(()),
            (Operator, _) => Err(false),
            (Manager, _) => Ok(()),
            (Worker | LeavingManager | DemotedManager | PromotedWithWorkerCert, Access::Nodes) => Ok(()),
            (LeavingManager, Access::RaftMembers) => Ok(()),
            (Worker | LeavingManager | DemotedManager | PromotedWithWorkerCert, _) => Err(false),
        }
    }

    #[test]
    fn role_by_method_matrix() {
        let mut checked = 0;
        let mut calls: Vec<(String, Access)> = methods_in_protos()
            .into_iter()
            .map(|m| {
                let a = access_for(&m);
                (m, a)
            })
            .collect();
        // Not served: manager-only by default.
        calls.push((
            "/docker.swarmkit.v1.Control/ListNodes".into(),
            access_for("/docker.swarmkit.v1.Control/ListNodes"),
        ));
        for path in
            ["/swarm", "/v1.41/services/create", "/shoal/v1/ca/client-cert", "/v1.47/shoal/v1/ca/revoke-client-cert"]
        {
            calls.push((path.to_string(), engine_api_access(path)));
        }
        for (what, access) in &calls {
            for c in CALLERS {
                let got =
                    decide(what, *access, cert(c).as_ref(), CLUSTER, facts).map(|_| ()).map_err(|r| r.unauthenticated);
                assert_eq!(got, expected(*access, c), "{what} ({access:?}) called by {c:?}");
                checked += 1;
            }
        }
        // Spot checks of the tables themselves.
        assert_eq!(access_for("/docker.swarmkit.v1.Raft/ProcessRaftMessage"), Access::RaftMembers);
        assert_eq!(access_for("/docker.swarmkit.v1.RaftMembership/Join"), Access::Managers);
        assert_eq!(access_for("/docker.swarmkit.v1.RaftProposals/ForwardProposal"), Access::Managers);
        assert_eq!(access_for("/docker.swarmkit.v1.Dispatcher/Session"), Access::Nodes);
        assert_eq!(access_for("/docker.swarmkit.v1.NodeCA/IssueNodeCertificate"), Access::Anyone);
        assert_eq!(access_for("/docker.swarmkit.v1.CA/GetRootCACertificate"), Access::Anyone);
        assert_eq!(engine_api_access("/v1.47/swarm"), Access::ManagersAndOperators);
        assert_eq!(engine_api_access("/v1.47/shoal/v1/ca/client-cert"), Access::ControlSocketOnly);
        assert_eq!(engine_api_access("/shoal/v1/ca/revoke-client-cert"), Access::ControlSocketOnly);
        assert_eq!(engine_api_access("/shoal/v1/entry-points"), Access::ManagersAndOperators);
        assert_eq!(checked, calls.len() * CALLERS.len());
    }

    #[test]
    fn a_joining_manager_without_state_trusts_the_certificate_role() {
        let none = |_: &PeerCert| Facts::default();
        let m = cert(Caller::UnknownNode).unwrap();
        assert_eq!(decide("raft", Access::RaftMembers, Some(&m), CLUSTER, none), Ok(Some(Standing::Manager)));
        let w = cert(Caller::Worker).unwrap();
        assert!(decide("raft", Access::RaftMembers, Some(&w), CLUSTER, none).is_err());
    }

    #[test]
    fn refusals_say_why() {
        let msg =
            |c: Caller, access: Access| decide("/x.Y/Z", access, cert(c).as_ref(), CLUSTER, facts).unwrap_err().message;
        assert!(msg(Caller::Worker, Access::Managers).contains("managers only"));
        assert!(msg(Caller::Anonymous, Access::Nodes).contains("client certificate"));
        assert!(msg(Caller::OtherClusterManager, Access::Nodes).contains("cluster2"));
        assert!(msg(Caller::RemovedWorker, Access::Nodes).contains("removed"));
        assert!(msg(Caller::UnknownNode, Access::Nodes).contains("not in this cluster"));
        assert!(msg(Caller::RevokedOperator, Access::ManagersAndOperators).contains("revoked"));
        assert!(msg(Caller::Worker, Access::ManagersAndOperators).contains("worker certificates are refused"));
        assert!(msg(Caller::DemotedManager, Access::ManagersAndOperators).contains("demoted"));
        assert!(msg(Caller::LeavingManager, Access::Managers).contains("demoted manager"));
        assert!(msg(Caller::Operator, Access::ControlSocketOnly).contains("control socket"));
    }

    /// A body that yields one data frame, then stays open (a stream with nothing more to say yet).
    fn open_body() -> tonic::body::Body {
        use futures::StreamExt;
        let frames = futures::stream::iter([Ok::<_, Status>(Frame::data(Bytes::from_static(b"m1")))])
            .chain(futures::stream::pending());
        tonic::body::Body::new(http_body_util::StreamBody::new(frames))
    }

    /// A `Revocable` over `open_body` whose re-check fails once `revoked` is set; and the change signal.
    fn revocable(end: End) -> (Revocable<tonic::body::Body>, Arc<std::sync::atomic::AtomicBool>, watch::Sender<u64>) {
        let revoked = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = revoked.clone();
        let recheck: Recheck = Arc::new(move || {
            if flag.load(std::sync::atomic::Ordering::SeqCst) {
                Err(Refusal::denied("node n1 was removed from the cluster".into()))
            } else {
                Ok(())
            }
        });
        let (tx, rx) = watch::channel(0);
        (Revocable::new(open_body(), rx, recheck, end), revoked, tx)
    }

    async fn next_frame(b: &mut Revocable<tonic::body::Body>) -> Option<Result<Frame<Bytes>, Status>> {
        use http_body_util::BodyExt;
        tokio::time::timeout(Duration::from_secs(5), b.frame()).await.expect("a frame or the end within 5 s")
    }

    #[tokio::test]
    async fn a_stream_goes_on_through_changes_that_keep_its_caller_and_ends_once_it_is_refused() {
        for end in [End::GrpcTrailers, End::GrpcRequestError, End::Stop] {
            let (mut body, revoked, changes) = revocable(end);
            assert_eq!(next_frame(&mut body).await.unwrap().unwrap().into_data().unwrap(), "m1");
            // A change that leaves the caller standing: the stream stays open (nothing more to read).
            changes.send_modify(|g| *g += 1);
            use futures::FutureExt;
            use http_body_util::BodyExt;
            assert!(body.frame().now_or_never().is_none(), "{end:?}: the stream should stay open");
            // The caller is refused from the next change on.
            revoked.store(true, std::sync::atomic::Ordering::SeqCst);
            changes.send_modify(|g| *g += 1);
            match (end, next_frame(&mut body).await) {
                (End::GrpcTrailers, Some(Ok(f))) => {
                    let t = f.into_trailers().unwrap();
                    assert_eq!(t["grpc-status"], (tonic::Code::PermissionDenied as i32).to_string().as_str());
                    assert!(t["grpc-message"].to_str().unwrap().contains("removed"), "{t:?}");
                }
                (End::GrpcRequestError, Some(Err(s))) => {
                    assert_eq!(s.code(), tonic::Code::PermissionDenied);
                    assert!(s.message().contains("removed"), "{s:?}");
                }
                (End::Stop, None) => {}
                (end, got) => panic!("{end:?}: {got:?}"),
            }
            assert!(next_frame(&mut body).await.is_none(), "{end:?}: nothing after the end");
            assert!(body.is_end_stream());
        }
    }

    #[test]
    fn only_changes_that_can_move_a_standing_wake_the_streams() {
        use shoal_store::Change;
        let node = |role: NodeRole, desired: NodeRole| {
            let mut n = shoal_api::Node { id: "n1".into(), ..Default::default() };
            n.set_role(role);
            n.spec.get_or_insert_with(Default::default).set_desired_role(desired);
            Object::Node(Arc::new(n))
        };
        let update = |new: Object, old: Object| Change { kind: ActionKind::Update, object: new, old: Some(old) };
        let (m, w) = (NodeRole::Manager, NodeRole::Worker);
        assert!(touches_standing(&update(node(m, w), node(m, m))), "a demotion");
        assert!(touches_standing(&update(node(w, w), node(m, w))), "leaving Raft");
        assert!(!touches_standing(&update(node(m, m), node(m, m))), "a heartbeat's status write");
        let removed = Change { kind: ActionKind::Remove, object: node(w, w), old: None };
        assert!(touches_standing(&removed));
        let cluster = Object::Cluster(Arc::new(shoal_api::Cluster::default()));
        assert!(touches_standing(&Change { kind: ActionKind::Update, object: cluster.clone(), old: Some(cluster) }));
        let service = Object::Service(Arc::new(shoal_api::Service::default()));
        assert!(!touches_standing(&Change { kind: ActionKind::Create, object: service, old: None }));
    }

    #[test]
    fn grpc_messages_are_percent_encoded() {
        assert_eq!(percent_encode_message("a b%c\n"), "a b%25c%0A");
    }
}
