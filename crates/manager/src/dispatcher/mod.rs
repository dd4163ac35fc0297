//! The gRPC `docker.swarmkit.v1.Dispatcher` service: agent sessions, heartbeats, task assignments and task
//! status reports. The logic lives in sans-IO parts (`heartbeats`, `assignments`, `status`); this file is
//! the shell around them: RPC handlers, per-stream tasks, and the leader-only loop (`subsystem`) that
//! expires heartbeats (node DOWN) and flushes batched status updates as one store write per batch.
//!
//! It reads and writes only through `ClusterState`; it knows nothing of executors, HTTP or Raft internals.
//!
//! Bounds: each response stream has a channel of `STREAM_CHANNEL_MESSAGES` messages; an INCREMENTAL message
//! holds at most `ASSIGNMENT_BATCH_MAX_CHANGES` changes and about `ASSIGNMENT_BATCH_MAX_BYTES` bytes (commits
//! already queued are batched, no artificial delay); a COMPLETE message holds all of a node's tasks (the
//! protocol has no partial complete set) within `COMPLETE_MAX_BYTES` (48 MiB): past it without the node's
//! finished tasks, and a set still past it ends the stream with RESOURCE_EXHAUSTED naming the sizes; the status queue
//! holds at most `STATUS_QUEUE_REQUESTS` requests (callers wait when it is full); a request carries at most
//! `MAX_UPDATES_PER_REQUEST` updates; a batch at most `status_batch_max` updates (a single larger request forms its own
//! batch); a conflicting batch is retried `WRITE_ATTEMPTS` times.
//!
//! What a node reports is bounded before anything is written (`limits`): its description
//! (`MAX_NODE_DESCRIPTION_BYTES` and its parts' counts) and each task status (`MAX_TASK_STATUS_BYTES`); a
//! session writes the node only when its object would change, and at most as often as `registrations`
//! allows, so a worker re-registering in a loop cannot fill the Raft log.
//!
//! UpdateTaskStatus answers after the batch holding its updates is committed, so an error means the
//! agent should retry and success means the store has the statuses.

pub(crate) mod assignments;
mod fanout;
mod heartbeats;
mod managers;
pub(crate) mod registrations;
pub(crate) mod status;
pub(crate) mod volumes;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use shoal_api::dispatcher_server::{Dispatcher as DispatcherRpc, DispatcherServer};
use shoal_api::prost::Message;
use shoal_api::{
    assignments_message, node_spec, node_status, AssignmentsMessage, AssignmentsRequest, HeartbeatRequest,
    HeartbeatResponse, Node, NodeRole, NodeSpec, NodeStatus, SessionMessage, SessionRequest, UpdateTaskStatusRequest,
    UpdateTaskStatusResponse, UpdateVolumeStatusRequest, UpdateVolumeStatusResponse,
};
use shoal_raft::ProposeError;
use shoal_store::{ObjectKind, StoreError};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

#[cfg(test)]
pub(crate) use assignments::COMPLETE_MAX_BYTES;
pub(crate) use assignments::{AssignmentSet, CompleteTooLarge, Dependency};
pub(crate) use fanout::{Fanout, NodeWatchError};
pub(crate) use heartbeats::Heartbeats;
#[cfg(test)]
pub(crate) use managers::MANAGER_WEIGHT;
pub(crate) use managers::{SessionInfo, SessionRoot};
pub(crate) use status::{apply_updates, check_update, SkipReason, StatusUpdate};

use crate::ca::node_identity;
use crate::state::{ClusterState, WriteError};
use crate::subsystem::{stopped, Subsystem, SubsystemFuture};
use crate::write::chunk_actions;

/// gRPC metadata key carrying a caller's claimed node ID: read only by `insecure_identity_from_metadata`
/// (in-process tests); real nodes are identified by their certificate.
pub const NODE_ID_METADATA_KEY: &str = "x-shoal-node-id";
/// Messages buffered per response stream before the sender waits for the client.
pub(crate) const STREAM_CHANNEL_MESSAGES: usize = 16;
/// Most changes in one INCREMENTAL assignments message.
pub(crate) const ASSIGNMENT_BATCH_MAX_CHANGES: usize = 1000;
/// Queued commits are added to an INCREMENTAL message only while it holds less than this many encoded
/// bytes (each task carries its spec; agents decode messages of up to 64 MiB). One commit's changes always
/// go whole, and a commit holds at most 4 MiB of writes (`write::MAX_BYTES_PER_WRITE`).
pub(crate) const ASSIGNMENT_BATCH_MAX_BYTES: usize = 16 << 20;
/// Most status requests queued for the flusher; further callers wait.
pub(crate) const STATUS_QUEUE_REQUESTS: usize = 1024;
/// Most updates in one UpdateTaskStatus request.
pub(crate) const MAX_UPDATES_PER_REQUEST: usize = 10_000;
/// Attempts for one store write that keeps hitting version conflicts.
pub(crate) const WRITE_ATTEMPTS: usize = 5;
/// Longest the leader-only loop sleeps before it looks at the heartbeat deadlines again: a deadline set
/// meanwhile (a new session) or a clock that jumped is noticed within this.
pub(crate) const EXPIRY_RECHECK: Duration = Duration::from_secs(1);

/// Dispatcher settings.
#[derive(Clone, Debug)]
pub struct DispatcherConfig {
    /// Heartbeat period when the cluster object sets none, in milliseconds.
    pub heartbeat_period_ms_default: u64,
    /// A node is DOWN after this many periods without a heartbeat.
    pub missed_heartbeats_before_down: u32,
    /// Most task status updates per store write.
    pub status_batch_max: usize,
    /// Shortest time between two writes of queued status updates, in milliseconds: updates that arrive
    /// meanwhile join the next batch. An update that arrives after a quiet spell is written at once.
    pub status_flush_ms: u64,
    /// The address agents should use to reach this manager (sent in session messages).
    pub manager_addr: String,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        DispatcherConfig {
            heartbeat_period_ms_default: 5000,
            missed_heartbeats_before_down: 3,
            status_batch_max: 1000,
            status_flush_ms: 50,
            manager_addr: String::new(),
        }
    }
}

/// One open session: its ID and the handle whose drop ends its streams.
struct SessionEntry {
    session_id: String,
    /// Dropping this sender ends every stream of the session (replaced, expired).
    _alive: watch::Sender<()>,
    alive_rx: watch::Receiver<()>,
}

#[derive(Default)]
struct Registry {
    sessions: HashMap<String, SessionEntry>,
    heartbeats: Heartbeats,
    /// How often each node may write its node object from a session.
    registrations: registrations::Registrations,
}

/// A queued status request: its updates, and where to say that they were committed.
struct StatusRequest {
    updates: Vec<StatusUpdate>,
    done: oneshot::Sender<Result<(), Status>>,
}

/// The dispatcher: shared by the gRPC service and the leader-only loop.
pub struct Dispatcher {
    state: ClusterState,
    config: DispatcherConfig,
    /// Lock order: the store, then the registry. The registry is locked inside store views, so it is never
    /// held while the store is read or written.
    registry: Mutex<Registry>,
    status_tx: mpsc::Sender<StatusRequest>,
    status_rx: tokio::sync::Mutex<mpsc::Receiver<StatusRequest>>,
    /// Told after each status request is queued: the leader-only loop sleeps until then (or until the next
    /// heartbeat deadline) instead of polling.
    status_queued: tokio::sync::Notify,
    /// Store changes routed to the session and assignments streams by node.
    fanout: Fanout,
    /// What session messages carry besides the node (managers, network keys; see `managers`), kept
    /// current by one store watcher started with the first session.
    managers: Arc<watch::Sender<Arc<SessionInfo>>>,
    managers_watched: std::sync::atomic::AtomicBool,
    /// The cluster's root as session messages carry it (`managers::SessionRoot`), kept current like
    /// `managers`.
    root: Arc<watch::Sender<Arc<SessionRoot>>>,
    root_watched: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher").field("config", &self.config).finish()
    }
}

#[cfg(any(test, feature = "test-doors"))]
/// The interceptor type of `Dispatcher::grpc_service_trusting_metadata_for_tests`.
pub(crate) type MetadataInterceptor = fn(Request<()>) -> Result<Request<()>, Status>;

/// FOR IN-PROCESS TESTS ONLY: a tonic interceptor that believes the node ID a caller claims in the
/// `NODE_ID_METADATA_KEY` metadata and records it as the caller's identity (role worker, no cluster). It
/// authenticates nothing; a real node's gRPC server never installs it (identity comes from mTLS there), and
/// the shipped daemon does not have it (the `test-doors` feature).
#[cfg(any(test, feature = "test-doors"))]
pub(crate) fn insecure_identity_from_metadata(mut req: Request<()>) -> Result<Request<()>, Status> {
    let id = req.metadata().get(NODE_ID_METADATA_KEY).and_then(|v| v.to_str().ok()).unwrap_or("").trim().to_string();
    if !id.is_empty() {
        req.extensions_mut().insert(crate::ca::PeerIdentity(shoal_ca::NodeSubject {
            node_id: id,
            role: shoal_ca::Role::Worker,
            cluster_id: String::new(),
        }));
    }
    Ok(req)
}

fn write_status<E: std::fmt::Display>(e: WriteError<E>) -> Status {
    match e {
        WriteError::Propose(ProposeError::NotLeader { .. }) => not_leader(),
        other => Status::unavailable(format!("could not write to the cluster store: {other}; retry")),
    }
}

fn not_leader() -> Status {
    Status::unavailable("this manager is not the leader; reconnect to the current leader")
}

fn is_conflict<E>(e: &WriteError<E>) -> bool {
    matches!(e, WriteError::Propose(ProposeError::Store(StoreError::VersionConflict { .. })))
}

fn unknown_session(session_id: &str) -> Status {
    Status::not_found(format!(
        "session {session_id:?} is not open on this manager (it expired or was replaced): open a new session"
    ))
}

impl Dispatcher {
    /// A dispatcher over `state`.
    pub fn new(state: ClusterState, config: DispatcherConfig) -> Arc<Dispatcher> {
        let (status_tx, status_rx) = mpsc::channel(STATUS_QUEUE_REQUESTS);
        Arc::new(Dispatcher {
            config,
            registry: Mutex::new(Registry::default()),
            status_tx,
            status_rx: tokio::sync::Mutex::new(status_rx),
            status_queued: tokio::sync::Notify::new(),
            fanout: Fanout::new(state.store.clone()),
            managers: Arc::new(watch::channel(Arc::new(SessionInfo::default())).0),
            managers_watched: std::sync::atomic::AtomicBool::new(false),
            root: Arc::new(watch::channel(Arc::new(SessionRoot::default())).0),
            root_watched: std::sync::atomic::AtomicBool::new(false),
            state,
        })
    }

    /// The cluster state this dispatcher serves from (the other node-facing services share it).
    pub fn state(&self) -> &ClusterState {
        &self.state
    }

    /// The gRPC service to mount on the manager's server (behind the authorization layer, which supplies
    /// each caller's certificate identity).
    pub fn grpc_service(self: &Arc<Self>) -> DispatcherServer<impl DispatcherRpc> {
        DispatcherServer::new(DispatcherService(self.clone()))
    }

    /// The LogBroker gRPC service of this manager's log broker, served next to the dispatcher.
    pub fn log_broker_service(&self) -> crate::logrpc::LogBrokerServer {
        crate::logrpc::LogBrokerService::server(self.state.logs.clone())
    }

    /// The Logs gRPC service (`SubscribeLogs`, how follower managers read the leader's logs), served next
    /// to the dispatcher.
    pub fn logs_service(&self) -> crate::logrpc::LogsServer {
        crate::logrpc::LogsService::new(self.state.clone()).server()
    }

    /// Shoal's own `shoal.v1.NetworkView` service over this manager's store (`netview`), served next to the
    /// dispatcher.
    pub fn network_view_service(&self) -> crate::netview::NetworkViewServer<crate::netview::NetworkViewService> {
        crate::netview::NetworkViewService::new(self.state.clone()).server()
    }

    /// FOR IN-PROCESS TESTS ONLY: the service behind `insecure_identity_from_metadata`, which believes the
    /// node ID a caller claims in gRPC metadata. Never serve this on a network.
    #[cfg(any(test, feature = "test-doors"))]
    pub fn grpc_service_trusting_metadata_for_tests(
        self: &Arc<Self>,
    ) -> tonic::service::interceptor::InterceptedService<DispatcherServer<impl DispatcherRpc>, MetadataInterceptor>
    {
        DispatcherServer::with_interceptor(
            DispatcherService(self.clone()),
            insecure_identity_from_metadata as MetadataInterceptor,
        )
    }

    /// Serves [`Self::grpc_service_trusting_metadata_for_tests`] over plain TCP on `listener` in a new task,
    /// until that task is aborted (tests only).
    #[cfg(any(test, feature = "test-doors"))]
    pub fn serve_trusting_metadata_for_tests(
        self: &Arc<Self>,
        listener: tokio::net::TcpListener,
    ) -> tokio::task::JoinHandle<()> {
        let svc = self.grpc_service_trusting_metadata_for_tests();
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .expect("the test dispatcher's gRPC server");
        })
    }

    /// The leader-only loop: heartbeat expiry (node DOWN) and the status-update flusher.
    pub fn subsystem(self: &Arc<Self>) -> Box<dyn Subsystem> {
        Box::new(DispatcherSubsystem(self.clone()))
    }

    fn check_leader(&self) -> Result<(), Status> {
        if self.state.leader_state().is_leader {
            Ok(())
        } else {
            let mut status = not_leader();
            if let Some(addr) = self.leader_addr().and_then(|a| a.parse().ok()) {
                status.metadata_mut().insert(shoal_raft::grpc::LEADER_ADDR_METADATA, addr);
            }
            Err(status)
        }
    }

    /// The Raft leader's remote address, from its node's manager status (which the leader keeps current),
    /// so an agent refused here can go to the leader.
    fn leader_addr(&self) -> Option<String> {
        let leader = self.state.leader_state().leader_id;
        if leader == 0 {
            return None;
        }
        self.state.store.view(|t| {
            t.nodes().iter().find_map(|n| {
                let m = n.manager_status.as_ref()?;
                (m.raft_id == leader && !m.addr.is_empty()).then(|| m.addr.clone())
            })
        })
    }

    /// Agent sessions open on this dispatcher now (for the metrics).
    pub fn session_count(&self) -> usize {
        self.registry.lock().sessions.len()
    }

    /// The heartbeat period: the cluster object's setting, else the configured default, in milliseconds.
    pub fn heartbeat_period_ms(&self) -> u64 {
        let from_cluster = self.state.store.view(|t| {
            t.clusters()
                .iter()
                .next()
                .and_then(|c| c.spec.as_ref()?.dispatcher.as_ref()?.heartbeat_period)
                .map(|d| u64::try_from(shoal_api::duration_from_proto(&d).as_millis()).unwrap_or(u64::MAX))
        });
        match from_cluster {
            Some(ms) if ms > 0 => ms,
            _ => self.config.heartbeat_period_ms_default.max(1),
        }
    }

    fn heartbeat_ttl_ms(&self) -> u64 {
        self.heartbeat_period_ms().saturating_mul(u64::from(self.config.missed_heartbeats_before_down.max(1)))
    }

    /// The alive-receiver of `node_id`'s session, if `session_id` is its current one.
    fn session_alive(&self, node_id: &str, session_id: &str) -> Result<watch::Receiver<()>, Status> {
        let reg = self.registry.lock();
        match reg.sessions.get(node_id) {
            Some(s) if s.session_id == session_id => Ok(s.alive_rx.clone()),
            _ => Err(unknown_session(session_id)),
        }
    }

    /// Registers the node (create, or update to READY with the description it reports). The description is
    /// checked against its bounds first (`limits::check_node_description`: INVALID_ARGUMENT naming the part);
    /// a node whose object would not change is not written at all; a write beyond the node's rate
    /// (`registrations`) is refused with RESOURCE_EXHAUSTED saying when to retry. Nothing is written on a
    /// refusal.
    async fn register_node(&self, node_id: &str, req: &SessionRequest, addr: String) -> Result<(), Status> {
        if let Some(d) = &req.description {
            crate::limits::check_node_description(d).map_err(|e| {
                tracing::warn!(node = %node_id, "session refused: {e}");
                Status::invalid_argument(e.to_string())
            })?;
        }
        let ttl = self.heartbeat_ttl_ms();
        for _ in 0..WRITE_ATTEMPTS {
            let now_ms = self.state.timer.now_ms();
            let mut took = false;
            let res = self
                .state
                .write(|t, changes| {
                    let status = NodeStatus {
                        state: node_status::State::Ready as i32,
                        message: String::new(),
                        addr: addr.clone(),
                    };
                    let (create, node) = match t.nodes().get(node_id) {
                        Some(existing) => {
                            let description = req.description.clone().or_else(|| existing.description.clone());
                            // Unchanged, and the node's heartbeat deadline has not passed: nothing to write. The
                            // deadline moves on under the same lock, so the expiry cannot mark the node down
                            // between this check and the new session's first beat. (An expired node is written
                            // READY again: that write is ordered after its DOWN write by the version check.)
                            if description == existing.description && existing.status.as_ref() == Some(&status) {
                                let mut reg = self.registry.lock();
                                if reg.heartbeats.is_tracked(node_id) {
                                    reg.heartbeats.beat(node_id, now_ms, ttl);
                                    return Ok::<(), u64>(());
                                }
                            }
                            let mut node = (**existing).clone();
                            node.description = description;
                            node.status = Some(status);
                            node.meta_mut_updated(self.state.now());
                            (false, node)
                        }
                        None => {
                            let now = self.state.now();
                            let node = Node {
                                attachments: Vec::new(),
                                id: node_id.to_string(),
                                meta: Some(shoal_api::Meta {
                                    version: None,
                                    created_at: Some(now),
                                    updated_at: Some(now),
                                }),
                                spec: Some(NodeSpec {
                                    annotations: None,
                                    desired_role: NodeRole::Worker as i32,
                                    membership: node_spec::Membership::Accepted as i32,
                                    availability: node_spec::Availability::Active as i32,
                                }),
                                description: req.description.clone(),
                                status: Some(status),
                                manager_status: None,
                                certificate: None,
                                role: NodeRole::Worker as i32,
                                vxlan_udp_port: t.clusters().iter().next().map_or(0, |c| c.vxlan_udp_port),
                            };
                            (true, node)
                        }
                    };
                    self.registry.lock().registrations.take(node_id, now_ms)?;
                    took = true;
                    if create {
                        changes.create(node);
                    } else {
                        changes.update(node);
                    }
                    Ok(())
                })
                .await;
            if res.is_err() && took {
                self.registry.lock().registrations.give_back(node_id, now_ms);
            }
            match res {
                Ok(_) => return Ok(()),
                Err(WriteError::Rejected(retry_ms)) => {
                    let msg = format!(
                        "node {node_id} has written its node object (a changed description, or READY again) too \
                         often: at most {} writes at once, then one every {} s; retry in {} s",
                        registrations::REGISTRATION_BURST,
                        registrations::REGISTRATION_REFILL_MS / 1000,
                        retry_ms.div_ceil(1000).max(1)
                    );
                    tracing::warn!(node = %node_id, "session refused: {msg}");
                    return Err(Status::resource_exhausted(msg));
                }
                Err(e) if is_conflict(&e) => continue,
                Err(WriteError::Propose(ProposeError::Store(StoreError::Exists {
                    kind: ObjectKind::Node, ..
                }))) => continue,
                Err(e) => return Err(write_status(e)),
            }
        }
        Err(Status::unavailable("the node object kept changing while registering it; retry"))
    }

    /// The managers and network keys agents are told about, kept current from the store from the first call
    /// on (one watcher per dispatcher; see `managers`). Must be called within a tokio runtime.
    fn manager_list(&self) -> watch::Receiver<Arc<SessionInfo>> {
        use std::sync::atomic::Ordering;
        if !self.managers_watched.swap(true, Ordering::SeqCst) {
            // The first list now, so the first session message has it; the watcher keeps it current.
            let own = self.config.manager_addr.clone();
            self.managers.send_replace(Arc::new(self.state.store.view(|t| managers::session_info(t, &own))));
            tokio::spawn(managers::run_session_info(self.state.store.clone(), own, Arc::downgrade(&self.managers)));
        }
        self.managers.subscribe()
    }

    /// The cluster's root as session messages carry it, kept current from the store from the first call on
    /// (see `manager_list`).
    fn session_root(&self) -> watch::Receiver<Arc<SessionRoot>> {
        use std::sync::atomic::Ordering;
        if !self.root_watched.swap(true, Ordering::SeqCst) {
            self.root.send_replace(Arc::new(self.state.store.view(managers::session_root)));
            tokio::spawn(managers::run_session_root(self.state.store.clone(), Arc::downgrade(&self.root)));
        }
        self.root.subscribe()
    }

    fn session_message(session_id: &str, node: Option<Node>, info: &SessionInfo, root: &SessionRoot) -> SessionMessage {
        SessionMessage {
            session_id: session_id.to_string(),
            node,
            managers: info.managers.clone(),
            network_bootstrap_keys: info.network_bootstrap_keys.clone(),
            root_ca: root.root_ca.clone(),
        }
    }

    async fn open_session(
        self: &Arc<Self>,
        node_id: String,
        peer: Option<SocketAddr>,
        req: SessionRequest,
    ) -> Result<ReceiverStream<Result<SessionMessage, Status>>, Status> {
        let addr = peer.map(|p| p.ip().to_string()).unwrap_or_default();
        let (session_id, alive_rx) = self.register_session(&node_id, &req, addr).await?;
        let (node, mut watch) =
            self.fanout.view_and_watch(&node_id, |t| t.nodes().get(&node_id).map(|n| (**n).clone()));
        let (tx, rx) = mpsc::channel(STREAM_CHANNEL_MESSAGES);
        let mut managers = self.manager_list();
        let mut root = self.session_root();
        let first =
            Self::session_message(&session_id, node.clone(), &managers.borrow_and_update(), &root.borrow_and_update());
        let mut last_node = node;
        tx.send(Ok(first)).await.map_err(|_| Status::cancelled("the agent went away"))?;
        let this = self.clone();
        let mut alive = alive_rx;
        let mut leadership = self.state.proposer.leadership();
        tokio::spawn(async move {
            loop {
                let node = tokio::select! {
                    r = watch.recv() => match r {
                        Ok(changes) => {
                            let mut latest = None;
                            for c in &changes {
                                if let shoal_store::Object::Node(n) = &c.object {
                                    if n.id == node_id && c.kind != shoal_store::ActionKind::Remove {
                                        latest = Some((**n).clone());
                                    }
                                }
                            }
                            match latest { Some(n) => Some(n), None => continue }
                        }
                        Err(NodeWatchError::Lagged) => {
                            let (node, w) = this.fanout.view_and_watch(&node_id,
                                |t| t.nodes().get(&node_id).map(|n| (**n).clone()));
                            watch = w;
                            match node { Some(n) => Some(n), None => continue }
                        }
                        Err(NodeWatchError::Closed) => break,
                    },
                    // The manager list or the network keys changed: resend them (with the node as last sent).
                    r = managers.changed() => if r.is_err() { break } else { last_node.clone() },
                    // The cluster's root CA changed (a root rotation started or ended): resend it.
                    r = root.changed() => if r.is_err() { break } else { last_node.clone() },
                    r = alive.changed() => { if r.is_err() { break } else { continue } }
                    r = leadership.changed() => {
                        if r.is_err() || !leadership.borrow_and_update().is_leader {
                            let _ = tx.send(Err(not_leader())).await;
                            break;
                        }
                        continue;
                    }
                    _ = tx.closed() => break,
                };
                if node.is_some() {
                    last_node = node.clone();
                }
                let msg =
                    Self::session_message(&session_id, node, &managers.borrow_and_update(), &root.borrow_and_update());
                if tx.send(Ok(msg)).await.is_err() {
                    break;
                }
            }
            let mut reg = this.registry.lock();
            if reg.sessions.get(&node_id).is_some_and(|s| s.session_id == session_id) {
                reg.sessions.remove(&node_id);
            }
            tracing::info!(node = %node_id, session = %session_id, "agent session closed");
        });
        Ok(ReceiverStream::new(rx))
    }

    /// The start of every session: registers the node READY, replaces any earlier session of the node
    /// (ending its streams) and counts it as a heartbeat. Returns the session ID and its alive-receiver.
    async fn register_session(
        &self,
        node_id: &str,
        req: &SessionRequest,
        addr: String,
    ) -> Result<(String, watch::Receiver<()>), Status> {
        self.register_node(node_id, req, addr).await?;
        let session_id = self.state.ids.new_id();
        let (alive_tx, alive_rx) = watch::channel(());
        // Read from the store before the registry is locked: the registry is taken inside store views
        // (`register_node`, `expire_heartbeats`), so a store read under the registry's lock deadlocks as soon
        // as a Raft apply waits for the write lock between the two (seen in `shoal-bench e2e`).
        let ttl = self.heartbeat_ttl_ms();
        {
            let mut reg = self.registry.lock();
            // Replacing the entry drops the old session's sender, which ends its streams.
            reg.sessions.insert(
                node_id.to_string(),
                SessionEntry { session_id: session_id.clone(), _alive: alive_tx, alive_rx: alive_rx.clone() },
            );
            reg.heartbeats.beat(node_id, self.state.timer.now_ms(), ttl);
        }
        tracing::info!(node = %node_id, session = %session_id, "agent session opened");
        Ok((session_id, alive_rx))
    }

    fn heartbeat(&self, node_id: &str, session_id: &str) -> Result<HeartbeatResponse, Status> {
        let period_ms = self.heartbeat_period_ms();
        let ttl = period_ms.saturating_mul(u64::from(self.config.missed_heartbeats_before_down.max(1)));
        let mut reg = self.registry.lock();
        match reg.sessions.get(node_id) {
            Some(s) if s.session_id == session_id => {}
            _ => return Err(unknown_session(session_id)),
        }
        reg.heartbeats.beat(node_id, self.state.timer.now_ms(), ttl);
        Ok(HeartbeatResponse { period: Some(shoal_api::duration_to_proto(Duration::from_millis(period_ms))) })
    }

    async fn update_task_status(&self, node_id: String, req: UpdateTaskStatusRequest) -> Result<(), Status> {
        self.session_alive(&node_id, &req.session_id)?;
        if req.updates.len() > MAX_UPDATES_PER_REQUEST {
            return Err(Status::invalid_argument(format!(
                "{} status updates in one request; send at most {MAX_UPDATES_PER_REQUEST} per request",
                req.updates.len()
            )));
        }
        // Every status within its bounds, or none of the request is taken.
        for u in &req.updates {
            if let Some(status) = &u.status {
                crate::limits::check_task_status(&u.task_id, status).map_err(|e| {
                    tracing::warn!(node = %node_id, "status updates refused: {e}");
                    Status::invalid_argument(e.to_string())
                })?;
            }
        }
        let mut updates = Vec::with_capacity(req.updates.len());
        for u in req.updates {
            let Some(status) = u.status else {
                tracing::warn!(node = %node_id, task = %u.task_id, "status update without a status: skipped");
                continue;
            };
            // Cheap pre-check against the current view; the flusher checks again at write time.
            let check = StatusUpdate { node_id: node_id.clone(), task_id: u.task_id, status };
            match self.state.store.view(|t| check_update(t.tasks().get(&check.task_id).map(|t| &**t), &check)) {
                Ok(()) => updates.push(check),
                Err(SkipReason::Unchanged { .. }) => {}
                Err(why) => tracing::warn!(node = %node_id, "status update skipped: {why}"),
            }
        }
        if updates.is_empty() {
            return Ok(());
        }
        let (done, wait) = oneshot::channel();
        self.status_tx
            .send(StatusRequest { updates, done })
            .await
            .map_err(|_| Status::unavailable("the status queue is closed; retry"))?;
        self.status_queued.notify_one();
        match wait.await {
            Ok(r) => r,
            Err(_) => Err(Status::unavailable("the status updates were not written (leadership changed?); retry")),
        }
    }

    /// `UpdateVolumeStatus` (see `volumes`): answers once the new states are committed.
    async fn update_volume_status(&self, node_id: String, req: UpdateVolumeStatusRequest) -> Result<(), Status> {
        self.session_alive(&node_id, &req.session_id)?;
        let ids = volumes::unpublished_ids(&req)?;
        if ids.is_empty() {
            return Ok(());
        }
        for _ in 0..WRITE_ATTEMPTS {
            let now = self.state.timer.now_ms();
            let written = self
                .state
                .write(|t, c| {
                    volumes::mark_unpublished(t, c, &node_id, &ids, now);
                    Ok::<(), std::convert::Infallible>(())
                })
                .await;
            match written {
                Ok(_) => return Ok(()),
                Err(WriteError::Propose(e)) if crate::write::is_conflict(&e) => continue,
                Err(e) => return Err(Status::unavailable(format!("the volume states were not written ({e}); retry"))),
            }
        }
        Err(Status::unavailable("the volumes kept changing while their states were written; retry"))
    }

    /// `UpdateVolumeStatus` in process (tests).
    pub async fn update_volume_status_in_process(
        &self,
        node_id: &str,
        req: UpdateVolumeStatusRequest,
    ) -> Result<(), Status> {
        self.check_leader()?;
        self.update_volume_status(node_id.to_string(), req).await
    }

    /// Writes queued status updates: at most one batch (`status_batch_max` updates, or one larger request).
    /// Returns the number of updates taken from the queue (written, or dropped as stale). Called by the
    /// leader-only loop; callable from tests.
    pub async fn flush_status_updates(&self) -> usize {
        let mut rx = self.status_rx.lock().await;
        let mut batch: Vec<StatusRequest> = Vec::new();
        let mut count = 0;
        while count < self.config.status_batch_max.max(1) {
            match rx.try_recv() {
                Ok(req) => {
                    count += req.updates.len();
                    batch.push(req);
                }
                Err(_) => break,
            }
        }
        drop(rx);
        if batch.is_empty() {
            return 0;
        }
        let updates: Vec<StatusUpdate> = batch.iter().flat_map(|r| r.updates.iter().cloned()).collect();
        let mut result = Err(Status::unavailable("the status batch kept conflicting with other writes; retry"));
        for _ in 0..WRITE_ATTEMPTS {
            let now = self.state.now();
            let changes = self.state.store.view(|t| {
                let (c, skipped) = apply_updates(t, &updates, &now);
                for why in skipped {
                    if !matches!(why, SkipReason::Unchanged { .. } | SkipReason::Backwards { .. }) {
                        tracing::warn!("status update skipped: {why}");
                    }
                }
                c
            });
            // Each task written carries its spec: a batch of big tasks is split to fit the proposal limit.
            // A chunk that conflicts makes the whole batch re-read; chunks already written are then unchanged.
            let mut res: Result<(), WriteError<std::convert::Infallible>> = Ok(());
            for chunk in chunk_actions(changes.into_actions(), usize::MAX) {
                if let Err(e) = self.state.propose(shoal_store::Changes::from(chunk)).await {
                    res = Err(WriteError::Propose(e));
                    break;
                }
            }
            match res {
                Ok(_) => {
                    result = Ok(());
                    break;
                }
                Err(e) if is_conflict(&e) => continue,
                Err(e) => {
                    result = Err(write_status(e));
                    break;
                }
            }
        }
        if let Err(e) = &result {
            tracing::warn!(updates = count, "status batch not written: {}", e.message());
        }
        for req in batch {
            let _ = req.done.send(result.clone());
        }
        count
    }

    /// Expires heartbeat deadlines at `now_ms` (the state's monotonic `timer`, as every deadline: a step of
    /// the wall clock must not mark every node down, as SwarmKit's timers do not): closes the sessions of
    /// late nodes and writes them DOWN ("heartbeat failure"). Returns the nodes marked down. Called by the
    /// leader-only loop.
    pub async fn expire_heartbeats(&self, now_ms: u64) -> Vec<String> {
        let expired = {
            let mut reg = self.registry.lock();
            let expired = reg.heartbeats.expire(now_ms);
            for node in &expired {
                reg.sessions.remove(node);
            }
            expired
        };
        if expired.is_empty() {
            return expired;
        }
        for _ in 0..WRITE_ATTEMPTS {
            let res = self
                .state
                .write(|t, changes| {
                    let reg = self.registry.lock();
                    let mut down = Vec::new();
                    for id in &expired {
                        // A node that came back (new session) since expiry stays up.
                        if reg.heartbeats.is_tracked(id) {
                            continue;
                        }
                        let Some(node) = t.nodes().get(id) else {
                            continue;
                        };
                        if node.status.as_ref().is_some_and(|s| s.state == node_status::State::Down as i32) {
                            continue;
                        }
                        let mut node = (**node).clone();
                        let addr = node.status.as_ref().map(|s| s.addr.clone()).unwrap_or_default();
                        node.status = Some(NodeStatus {
                            state: node_status::State::Down as i32,
                            message: "heartbeat failure".into(),
                            addr,
                        });
                        node.meta_mut_updated(self.state.now());
                        changes.update(node);
                        down.push(id.clone());
                    }
                    Ok::<_, std::convert::Infallible>(down)
                })
                .await;
            match res {
                Ok((down, _)) => {
                    for id in &down {
                        tracing::warn!(node = %id, "node missed its heartbeats: marked down");
                    }
                    return down;
                }
                Err(e) if is_conflict(&e) => continue,
                Err(e) => {
                    tracing::warn!("could not mark expired nodes down: {e}");
                    return Vec::new();
                }
            }
        }
        Vec::new()
    }

    /// Grace period on becoming leader: every READY node counts as having just sent a heartbeat, with twice
    /// the usual time to live, so agents have time to find the new leader before they are marked down.
    /// `now_ms` is the state's monotonic `timer`.
    pub fn grant_grace_period(&self, now_ms: u64) {
        let ttl = self.heartbeat_ttl_ms().saturating_mul(2);
        let ready: Vec<String> = self.state.store.view(|t| {
            t.nodes()
                .iter()
                .filter(|n| n.status.as_ref().is_some_and(|s| s.state == node_status::State::Ready as i32))
                .map(|n| n.id.clone())
                .collect()
        });
        let mut reg = self.registry.lock();
        for id in ready {
            reg.heartbeats.track_at_least(&id, now_ms.saturating_add(ttl));
        }
    }

    async fn open_assignments(
        self: &Arc<Self>,
        node_id: String,
        req: AssignmentsRequest,
    ) -> Result<ReceiverStream<Result<AssignmentsMessage, Status>>, Status> {
        let mut alive = self.session_alive(&node_id, &req.session_id)?;
        let (tx, rx) = mpsc::channel(STREAM_CHANNEL_MESSAGES);
        let this = self.clone();
        let mut leadership = self.state.proposer.leadership();
        tokio::spawn(async move {
            let mut set = AssignmentSet::new(&node_id);
            // A secret or config a task brings to the node is read when the task enters the set.
            let store = this.state.store.clone();
            let mut lookup = |d: &Dependency| store.view(|t| d.lookup(t));
            let mut sequence: u64 = 0;
            let (changes, mut watch) = this.fanout.view_and_watch(&node_id, |t| set.complete(t));
            let mut next = Some(complete_message(&mut sequence, changes));
            loop {
                if let Some(msg) = next.take() {
                    // A refused COMPLETE set ends the stream with its reason.
                    let end = msg.is_err();
                    if tx.send(msg).await.is_err() || end {
                        break;
                    }
                }
                tokio::select! {
                    r = watch.recv() => match r {
                        Ok(routed) => {
                            let mut changes = Vec::new();
                            for c in &routed {
                                set.on_change(c, &mut changes, &mut lookup);
                            }
                            let mut bytes: usize = changes.iter().map(|c| c.encoded_len()).sum();
                            // Batch what is already queued, up to the message bounds.
                            while changes.len() < ASSIGNMENT_BATCH_MAX_CHANGES && bytes < ASSIGNMENT_BATCH_MAX_BYTES {
                                match watch.try_recv() {
                                    Some(Ok(routed)) => {
                                        let before = changes.len();
                                        for c in &routed {
                                            set.on_change(c, &mut changes, &mut lookup);
                                        }
                                        bytes += changes[before..].iter().map(|c| c.encoded_len()).sum::<usize>();
                                    }
                                    Some(Err(NodeWatchError::Lagged)) => {
                                        let (c, w) = this.fanout.view_and_watch(&node_id, |t| set.complete(t));
                                        watch = w;
                                        next = Some(complete_message(&mut sequence, c));
                                        changes.clear();
                                        break;
                                    }
                                    Some(Err(NodeWatchError::Closed)) | None => break,
                                }
                            }
                            if next.is_none() && !changes.is_empty() {
                                let applies_to = sequence.to_string();
                                sequence += 1;
                                next = Some(Ok(AssignmentsMessage {
                                    r#type: assignments_message::Type::Incremental as i32,
                                    applies_to,
                                    results_in: sequence.to_string(),
                                    changes,
                                }));
                            }
                        }
                        Err(NodeWatchError::Lagged) => {
                            let (c, w) = this.fanout.view_and_watch(&node_id, |t| set.complete(t));
                            watch = w;
                            next = Some(complete_message(&mut sequence, c));
                        }
                        Err(NodeWatchError::Closed) => break,
                    },
                    r = alive.changed() => if r.is_err() { break },
                    r = leadership.changed() => {
                        if r.is_err() || !leadership.borrow_and_update().is_leader {
                            let _ = tx.send(Err(not_leader())).await;
                            break;
                        }
                    }
                    _ = tx.closed() => break,
                }
            }
        });
        Ok(ReceiverStream::new(rx))
    }
}

/// The RPCs without their gRPC streams, for the deterministic simulation (`shoal-sim`), which runs agents
/// in the same process and computes their assignments itself with `AssignmentSet`. Each checks
/// leadership first, as the RPC handler does; the logic is the same functions the handlers call.
impl Dispatcher {
    /// `Session` without its stream: registers the node and opens a session. Returns the session ID.
    pub async fn open_session_in_process(&self, node_id: &str, req: &SessionRequest) -> Result<String, Status> {
        self.check_leader()?;
        Ok(self.register_session(node_id, req, String::new()).await?.0)
    }

    /// True while `session_id` is `node_id`'s current session (not replaced, not expired).
    pub fn session_is_current(&self, node_id: &str, session_id: &str) -> bool {
        self.session_alive(node_id, session_id).is_ok()
    }

    /// `Heartbeat`.
    pub fn heartbeat_in_process(&self, node_id: &str, session_id: &str) -> Result<HeartbeatResponse, Status> {
        self.check_leader()?;
        self.heartbeat(node_id, session_id)
    }

    /// `UpdateTaskStatus`: resolves once the batch holding the updates is committed.
    pub async fn update_task_status_in_process(
        &self,
        node_id: &str,
        req: UpdateTaskStatusRequest,
    ) -> Result<(), Status> {
        self.check_leader()?;
        self.update_task_status(node_id.to_string(), req).await
    }
}

/// The COMPLETE message of a set, or the stream's end when the set is over its bound
/// (`assignments::COMPLETE_MAX_BYTES`: RESOURCE_EXHAUSTED, naming the sizes).
fn complete_message(
    sequence: &mut u64,
    changes: Result<Vec<shoal_api::AssignmentChange>, CompleteTooLarge>,
) -> Result<AssignmentsMessage, Status> {
    let changes = changes.map_err(|e| {
        tracing::error!("{e}");
        Status::resource_exhausted(e.to_string())
    })?;
    *sequence += 1;
    Ok(AssignmentsMessage {
        r#type: assignments_message::Type::Complete as i32,
        applies_to: String::new(),
        results_in: sequence.to_string(),
        changes,
    })
}

/// Sets `meta.updated_at` on a node about to be written.
trait TouchMeta {
    fn meta_mut_updated(&mut self, now: shoal_api::prost_types::Timestamp);
}

impl TouchMeta for Node {
    fn meta_mut_updated(&mut self, now: shoal_api::prost_types::Timestamp) {
        self.meta.get_or_insert_with(Default::default).updated_at = Some(now);
    }
}

/// The tonic service wrapper.
struct DispatcherService(Arc<Dispatcher>);

#[tonic::async_trait]
impl DispatcherRpc for DispatcherService {
    type SessionStream = ReceiverStream<Result<SessionMessage, Status>>;
    type AssignmentsStream = ReceiverStream<Result<AssignmentsMessage, Status>>;

    async fn session(&self, request: Request<SessionRequest>) -> Result<Response<Self::SessionStream>, Status> {
        self.0.check_leader()?;
        let node_id = node_identity(&request)?;
        let peer = request.remote_addr();
        let stream = self.0.open_session(node_id, peer, request.into_inner()).await?;
        Ok(Response::new(stream))
    }

    async fn heartbeat(&self, request: Request<HeartbeatRequest>) -> Result<Response<HeartbeatResponse>, Status> {
        self.0.check_leader()?;
        let node_id = node_identity(&request)?;
        Ok(Response::new(self.0.heartbeat(&node_id, &request.get_ref().session_id)?))
    }

    async fn update_task_status(
        &self,
        request: Request<UpdateTaskStatusRequest>,
    ) -> Result<Response<UpdateTaskStatusResponse>, Status> {
        self.0.check_leader()?;
        let node_id = node_identity(&request)?;
        self.0.update_task_status(node_id, request.into_inner()).await?;
        Ok(Response::new(UpdateTaskStatusResponse {}))
    }

    async fn update_volume_status(
        &self,
        request: Request<UpdateVolumeStatusRequest>,
    ) -> Result<Response<UpdateVolumeStatusResponse>, Status> {
        self.0.check_leader()?;
        let node_id = node_identity(&request)?;
        self.0.update_volume_status(node_id, request.into_inner()).await?;
        Ok(Response::new(UpdateVolumeStatusResponse {}))
    }

    async fn assignments(
        &self,
        request: Request<AssignmentsRequest>,
    ) -> Result<Response<Self::AssignmentsStream>, Status> {
        self.0.check_leader()?;
        let node_id = node_identity(&request)?;
        let stream = self.0.open_assignments(node_id, request.into_inner()).await?;
        Ok(Response::new(stream))
    }
}

/// The leader-only loop around `expire_heartbeats` and `flush_status_updates`.
struct DispatcherSubsystem(Arc<Dispatcher>);

impl Subsystem for DispatcherSubsystem {
    fn name(&self) -> &'static str {
        "dispatcher"
    }

    fn run(&self, state: ClusterState, mut stop: watch::Receiver<bool>) -> SubsystemFuture {
        let d = self.0.clone();
        Box::pin(async move {
            d.grant_grace_period(state.timer.now_ms());
            // Wakes only for work: queued status updates, or the next heartbeat deadline (re-read at least
            // every EXPIRY_RECHECK). An idle cluster's dispatcher sleeps.
            // Times on `state.timer`, in ms.
            let flush_every = d.config.status_flush_ms.max(1);
            let mut last_flush = state.timer.now_ms().checked_sub(flush_every);
            let recheck_ms = u64::try_from(EXPIRY_RECHECK.as_millis()).expect("a constant of seconds");
            loop {
                let now = state.timer.now_ms();
                let expiry_in = d
                    .registry
                    .lock()
                    .heartbeats
                    .next_deadline()
                    .map_or(recheck_ms, |at| at.saturating_sub(now).min(recheck_ms));
                // Biased (stop, expiry, status) so that a simulation replays and a steady stream of status
                // updates cannot hold off the expiry (which fires at most every EXPIRY_RECHECK).
                tokio::select! {
                    biased;
                    _ = stopped(&mut stop) => break,
                    _ = state.sleep_ms(expiry_in) => {
                        d.expire_heartbeats(state.timer.now_ms()).await;
                    }
                    _ = d.status_queued.notified() => {
                        let wait = last_flush.map_or(0, |at| (at + flush_every).saturating_sub(state.timer.now_ms()));
                        tokio::select! {
                            biased;
                            _ = stopped(&mut stop) => break,
                            _ = state.sleep_ms(wait) => {}
                        }
                        // Keep writing while full batches are waiting.
                        while d.flush_status_updates().await >= d.config.status_batch_max.max(1) {
                            if *stop.borrow() { break; }
                        }
                        last_flush = Some(state.timer.now_ms());
                    }
                }
            }
            // Requests still queued are answered "unavailable" by dropping their reply senders.
            let mut rx = d.status_rx.lock().await;
            while rx.try_recv().is_ok() {}
        })
    }
}
