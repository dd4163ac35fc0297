//! One Shoal node: a manager (Raft, the leader-only subsystems, the dispatcher, the control API) and a worker
//! (the agent with its executor) in one process.
//!
//! `Node::start` opens or creates the state dir, starts Raft (recovering the store from snapshot + log),
//! bootstraps the cluster on first start, serves gRPC on the remote address and the Engine API on the control
//! socket, and runs the agent. `RunningNode::shutdown` stops everything in reverse order, so no task process
//! outlives the daemon. This crate does no argument parsing (that is the `shoal` binary).
//!
//! The facade: every module is internal; other crates use what this root declares and re-exports: the daemon
//! (`run_daemon`, `DaemonConfig` and its parts, `Node`, `RunningNode`, `NodeError`) and, with the `test-doors`
//! feature only, what the test crates reach a node's state dir and sockets with (grouped below).

mod api_tcp;
mod attach;
mod authz;
mod bootstrap;
mod config;
// The modules marked below hold items only the test doors re-export: without the feature those are `pub` but
// unreached (with it, as in any build of the whole workspace, `unreachable_pub` checks them).
#[cfg_attr(not(any(test, feature = "test-doors")), allow(unreachable_pub, reason = "test doors' items"))]
mod connection_caps;
pub(crate) mod control_socket;
mod csi_plugins;
mod external_ca;
mod gossip;
mod identity;
#[cfg_attr(not(any(test, feature = "test-doors")), allow(unreachable_pub, reason = "test doors' items"))]
mod join;
mod leader_logs;
mod lifecycle;
#[cfg_attr(not(any(test, feature = "test-doors")), allow(unreachable_pub, reason = "test doors' items"))]
mod lock;
mod locked;
mod manager_parts;
mod metrics_listener;
mod raft_member;
mod raft_status;
mod security;
mod services;
#[cfg_attr(not(any(test, feature = "test-doors")), allow(unreachable_pub, reason = "test doors' items"))]
mod socket_path_names;
mod source_limits;
#[cfg_attr(not(any(test, feature = "test-doors")), allow(unreachable_pub, reason = "test doors' items"))]
mod statedir;
mod swarmkit_socket;
#[cfg_attr(not(any(test, feature = "test-doors")), allow(unreachable_pub, reason = "test doors' items"))]
mod tls;
mod worker_node;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use shoal_agent::Executor;
use shoal_manager::DispatcherConfig;
use shoal_manager::{ClusterState, RandomIds};
use shoal_raft::RaftNode;
use tokio::sync::watch;

use manager_parts::{ManagerCore, Wiring};

use bootstrap::{default_cluster_spec, CLUSTER_NAME};

// The daemon: its settings (the `shoal daemon` flags) and its run; with `Node`, `RunningNode`, `NodeError` and
// `run_daemon` below, all the shipped binary uses of this crate.
pub use config::{DaemonConfig, ExecutorKind, JoinToken, UnlockKeyText};
pub use identity::NodeIdentity;

// The test doors (the `test-doors` feature): the harness's manager gRPC server without TLS, and what the test
// crates reach a daemon's state dir and sockets with (its certificates and TLS, its unlock, the remote port's
// connection caps, the `:authority` rewrite a grpc-go client needs on the SwarmKit socket).
#[cfg(any(test, feature = "test-doors"))]
pub use connection_caps::{RemoteCaps, FD_RESERVE, UNAUTHENTICATED_IDLE};
#[cfg(any(test, feature = "test-doors"))]
pub use join::{load_certs, NodeCerts};
#[cfg(any(test, feature = "test-doors"))]
pub use lock::unlock;
#[cfg(any(test, feature = "test-doors"))]
pub use services::start_manager_services;
#[cfg(any(test, feature = "test-doors"))]
pub use socket_path_names::{AuthorityFix, FixedAuthority};
#[cfg(any(test, feature = "test-doors"))]
pub use statedir::certs_dir;
#[cfg(any(test, feature = "test-doors"))]
pub use tls::{endpoint_trusting_root, local_socket_client_config, NodeTls};

/// Why a node could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// A file or socket operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The state dir holds something unusable.
    #[error("state dir: {0}")]
    State(String),
    /// Raft could not start.
    #[error("raft: {0}")]
    Raft(#[from] shoal_raft::RaftError),
    /// The cluster could not be bootstrapped.
    #[error("cannot bootstrap the cluster: {0}")]
    Bootstrap(String),
    /// Joining a running cluster (`--join-addr`) failed.
    #[error("cannot join the cluster: {0}")]
    Join(String),
    /// The node's certificates or TLS could not be set up.
    #[error("node security: {0}")]
    Security(String),
    /// A setting cannot be honoured.
    #[error("{0}")]
    Config(String),
    /// An address or socket named by a flag cannot be listened on.
    #[error("cannot listen on {addr} ({flag}): {source}{hint}")]
    Listen {
        /// The daemon flag that names the address.
        flag: &'static str,
        /// The address or socket path.
        addr: String,
        /// The OS error.
        source: std::io::Error,
        /// What to do about it, when the error is a known one.
        hint: &'static str,
    },
}

impl NodeError {
    fn io(path: &Path, source: std::io::Error) -> NodeError {
        NodeError::Io { path: path.display().to_string(), source }
    }

    /// A failed bind of the address `flag` names.
    pub fn listen(flag: &'static str, addr: impl std::fmt::Display, source: std::io::Error) -> NodeError {
        let hint = match source.kind() {
            std::io::ErrorKind::AddrInUse => {
                "; another program (another shoal daemon?) listens there: stop it, or pick another address with this \
                 flag"
            }
            std::io::ErrorKind::AddrNotAvailable => "; the address is not one of this machine's: pick one it has",
            std::io::ErrorKind::PermissionDenied => {
                "; ports below 1024 need root, and a socket needs a writable \
                                                     directory"
            }
            _ => "",
        };
        NodeError::Listen { flag, addr: addr.to_string(), source, hint }
    }
}

/// A started node. Dropping it without `shutdown` aborts its tasks, but task processes still die with the
/// process (they are bound to it).
pub struct RunningNode {
    identity: NodeIdentity,
    cluster_id: String,
    raft: RaftNode,
    state: ClusterState,
    shutdown_tx: watch::Sender<bool>,
    tasks: Vec<Started>,
    /// The control socket when this node has its own (`Node::start`), closed last; a daemon's outlives its
    /// nodes (`run_daemon`).
    own_control: Option<control_socket::ControlSocket>,
    swarmkit_socket: Option<std::path::PathBuf>,
    remote_addr: std::net::SocketAddr,
    /// Set to the manager that issued this node a worker certificate once it is demoted.
    demoted: watch::Receiver<Option<String>>,
}

/// The engine labels a node's agent reports beside its executor's: its data path address, when it has one
/// (`shoal_api::SHOAL_DATA_PATH_ADDR_LABEL`: the managers' network view gives it to the other nodes as this
/// node's VXLAN endpoint).
pub(crate) fn data_path_label(cfg: &DaemonConfig) -> std::collections::HashMap<String, String> {
    cfg.data_path_addr.iter().map(|a| (shoal_api::SHOAL_DATA_PATH_ADDR_LABEL.to_string(), a.to_string())).collect()
}

fn machine_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// The node's data plane for the executor, or why it has none.
fn data_plane(cfg: &DaemonConfig) -> Result<Arc<shoal_agent::NetworkPlane>, String> {
    if !cfg.data_plane {
        return Err("the daemon was started with --no-data-plane".into());
    }
    let plane = shoal_agent::NetworkPlane::open(&cfg.state_dir);
    match &plane {
        Ok(_) => tracing::info!("data plane on: this node connects tasks to overlay networks"),
        Err(why) => tracing::warn!("data plane off: {why}; tasks with networks will not be placed on this node"),
    }
    plane
}

/// The engine the control socket relays the rest of the Docker Engine API to (`shoal_engine_api::relay`):
/// the docker executor's engine, none with the process executor. `executor` is the executor in use
/// (`Executor::name`), None before one is picked (a node in no swarm, a locked manager): then
/// `--executor auto` relays when the engine's socket exists. Containers created on attachable swarm networks
/// are the executor's `Attacher`'s to plumb (`attach::NodeAttach`), when it has one.
pub(crate) fn engine_relay(cfg: &DaemonConfig, picked: Option<&PickedExecutor>) -> shoal_engine_api::relay::Engine {
    use shoal_engine_api::relay::{Engine, PROCESS_EXECUTOR};
    let executor = picked.map(|p| &*p.executor);
    let docker = || {
        let e = Engine::docker(&cfg.engine_addr, &cfg.listen_control_api);
        match picked.and_then(|p| p.attacher.clone()) {
            Some(a) => e.with_attach(Ok(Arc::new(attach::NodeAttach(a)))),
            None => match executor.and_then(|x| x.data_plane_off()) {
                Some(why) => e.with_attach(Err(format!(
                    "this node cannot plumb a container of its engine into a swarm network: {why}"
                ))),
                None => e,
            },
        }
    };
    match (executor.map(|x| x.name()), cfg.executor) {
        (Some("docker"), _) | (None, ExecutorKind::Docker) => docker(),
        (None, ExecutorKind::Auto) => {
            let path = cfg.engine_addr.strip_prefix("unix://").unwrap_or(&cfg.engine_addr);
            if Path::new(path).exists() {
                docker()
            } else {
                Engine::absent(format!("this node has no container engine (none at {})", cfg.engine_addr))
            }
        }
        _ => Engine::absent(PROCESS_EXECUTOR),
    }
}

/// How long `--executor auto` waits for the Docker Engine to answer a ping before using processes.
pub const ENGINE_PING_WITHIN: Duration = Duration::from_secs(2);

/// The executor a node runs its tasks with and, for the docker executor with the data plane, its attacher
/// (what the Engine API's relay plumbs the engine's own containers on attachable networks through).
pub(crate) struct PickedExecutor {
    pub(crate) executor: Arc<dyn Executor>,
    pub(crate) attacher: Option<Arc<shoal_agent::Attacher>>,
}

impl PickedExecutor {
    fn docker(d: shoal_agent::DockerExecutor) -> PickedExecutor {
        PickedExecutor { attacher: d.attacher(), executor: Arc::new(d) }
    }
}

/// The data plane's probe (`data_plane`), running. It runs child processes (a network namespace, ip, nft:
/// ~10 ms) and blocks: on a blocking thread from its spawn on, so that what the caller runs beside it (the
/// node's identity, Raft's start, the certificates) and the Docker Engine's ping go on meanwhile. Every path
/// that spawned one awaits it (`result`), also when the start fails, so that it never outlives the start's
/// clean-up of a failed first start (it makes `task-netns` in the state dir).
pub(crate) struct PlaneProbe(tokio::task::JoinHandle<Result<Arc<shoal_agent::NetworkPlane>, String>>);

impl PlaneProbe {
    /// Starts the probe for `cfg`.
    pub(crate) fn spawn(cfg: &DaemonConfig) -> PlaneProbe {
        let cfg = cfg.clone();
        PlaneProbe(tokio::task::spawn_blocking(move || data_plane(&cfg)))
    }

    /// Waits for the probe's answer.
    pub(crate) async fn result(self) -> Result<Arc<shoal_agent::NetworkPlane>, String> {
        self.0.await.unwrap_or_else(|e| Err(format!("the data plane's probe failed: {e}")))
    }
}

async fn pick_executor(
    kind: ExecutorKind,
    cfg: &DaemonConfig,
    node_id: &str,
    hostname: &str,
    probe: PlaneProbe,
) -> Result<PickedExecutor, NodeError> {
    let plane = probe.result();
    let process = |plane| PickedExecutor {
        executor: Arc::new(
            shoal_agent::ProcessExecutor::new(&cfg.state_dir, hostname, Default::default())
                .with_files_root(shoal_agent::FilesRoot::new(shoal_agent::default_task_files_root(node_id)))
                .with_network(plane),
        ),
        attacher: None,
    };
    let docker = shoal_agent::DockerExecutor::connect(&cfg.engine_addr, node_id, ENGINE_PING_WITHIN);
    match kind {
        ExecutorKind::Process => Ok(process(plane.await)),
        ExecutorKind::Docker => match docker.await {
            Ok(d) => Ok(PickedExecutor::docker(d.with_network(plane.await).await)),
            Err(e) => {
                // The probe ends before the start fails (and its files are removed).
                drop(plane.await);
                Err(NodeError::Config(e.to_string()))
            }
        },
        ExecutorKind::Auto => match docker.await {
            Ok(d) => {
                tracing::info!(engine = %cfg.engine_addr, "--executor auto: using the docker executor (the Docker \
                                                           Engine answered)");
                Ok(PickedExecutor::docker(d.with_network(plane.await).await))
            }
            Err(e) => {
                tracing::info!("--executor auto: using the process executor: {e}");
                Ok(process(plane.await))
            }
        },
    }
}

/// Picks the executor and starts the manager's core (Raft, the node's certificates) side by side: the
/// executor's probes (the data plane's child processes, the Docker Engine's ping) overlap Raft's first writes
/// and fsyncs instead of coming before them. A pick that fails stops the core again.
async fn start_executor_and_core(
    cfg: &DaemonConfig,
    identity: &mut NodeIdentity,
    ids: Arc<RandomIds>,
    hostname: &str,
    probe: PlaneProbe,
) -> Result<(PickedExecutor, ManagerCore), NodeError> {
    let node_id = identity.node_id.clone();
    let (picked, core) = tokio::join!(
        pick_executor(cfg.executor, cfg, &node_id, hostname, probe),
        ManagerCore::start(cfg, identity, ids)
    );
    match (picked, core) {
        (Ok(picked), Ok(core)) => Ok((picked, core)),
        (Err(e), Ok(core)) => {
            core.raft.shutdown().await;
            Err(e)
        }
        (_, Err(e)) => Err(e),
    }
}

/// Starting a node.
pub struct Node;

impl Node {
    /// Starts a node from `cfg`. Returns once the control socket answers.
    pub async fn start(cfg: DaemonConfig) -> Result<RunningNode, NodeError> {
        let control = control_socket::ControlSocket::new(&cfg.listen_control_api);
        let mut node = Self::start_in(cfg, &control, Default::default()).await?;
        node.own_control = Some(control);
        Ok(node)
    }

    /// `start`, on the daemon's `control` socket (bound here if it is not yet), with the node's swarm
    /// lifecycle for it (`/swarm/leave`).
    pub(crate) async fn start_in(
        cfg: DaemonConfig,
        control: &control_socket::ControlSocket,
        lifecycle: shoal_engine_api::lifecycle::LifecycleRef,
    ) -> Result<RunningNode, NodeError> {
        std::fs::create_dir_all(&cfg.state_dir).map_err(|e| NodeError::io(&cfg.state_dir, e))?;
        set_mode(&cfg.state_dir, 0o700)?;
        // The listeners first: an address that is taken stops the start before anything is written.
        let listener = tokio::net::TcpListener::bind(cfg.listen_remote_api)
            .await
            .map_err(|e| NodeError::listen("--listen-remote-api", cfg.listen_remote_api, e))?;
        let metrics = match cfg.listen_metrics {
            Some(addr) => Some(metrics_listener::bind(addr).await?),
            None => None,
        };
        control.bind()?;
        let swarmkit = match &cfg.listen_swarmkit_api {
            Some(path) => Some(swarmkit_socket::bind(path)?),
            None => None,
        };
        let first_start = identity::load(&cfg.state_dir)?.is_none() && !RaftNode::has_existing_state(&cfg.state_dir);
        let entries_before = first_start.then(|| state_dir_entries(&cfg.state_dir));
        let state_dir = cfg.state_dir.clone();
        let swarmkit_socket = cfg.listen_swarmkit_api.clone();
        let started = Self::start_with(cfg, listener, control, metrics, swarmkit, lifecycle).await;
        if started.is_err() {
            if let Some(path) = &swarmkit_socket {
                let _ = std::fs::remove_file(path);
            }
            if let Some(before) = entries_before {
                // A first start that failed was acknowledged to no one: remove what it wrote, so that the next
                // start is a first start again (and not "raft data but no node.json", or a half identity).
                for name in state_dir_entries(&state_dir).difference(&before) {
                    let path = state_dir.join(name);
                    let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
                }
            }
        }
        started
    }

    async fn start_with(
        mut cfg: DaemonConfig,
        listener: tokio::net::TcpListener,
        control: &control_socket::ControlSocket,
        metrics: Option<tokio::net::TcpListener>,
        swarmkit: Option<tokio::net::UnixListener>,
        lifecycle: shoal_engine_api::lifecycle::LifecycleRef,
    ) -> Result<RunningNode, NodeError> {
        // The data plane's probe first: its child processes run while the identity is written (a first
        // start's fsyncs) and Raft starts.
        let probe = PlaneProbe::spawn(&cfg);
        let ids: Arc<RandomIds> = Arc::new(RandomIds::from_os());
        // The remote API listener's address is this manager's Raft address.
        let prepared = load_or_create_identity(&cfg.state_dir, &ids).and_then(|identity| {
            let remote_addr = listener.local_addr().map_err(|e| NodeError::io(Path::new("remote api"), e))?;
            Ok((identity, remote_addr))
        });
        let (mut identity, remote_addr) = match prepared {
            Ok(prepared) => prepared,
            Err(e) => {
                drop(probe.result().await);
                return Err(e);
            }
        };
        let hostname = cfg.hostname.clone().unwrap_or_else(machine_hostname);
        let advertised = cfg.advertise_remote_api.unwrap_or(remote_addr);
        cfg.advertise_remote_api = Some(advertised);
        let (picked, core) = start_executor_and_core(&cfg, &mut identity, ids, &hostname, probe).await?;
        let executor = picked.executor.clone();
        let mut description = executor.describe();
        description.hostname = hostname.clone();
        if !cfg.generic_node_resources.is_empty() {
            description.resources.get_or_insert_with(Default::default).generic = cfg.generic_node_resources.clone();
        }

        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        // gRPC (dispatcher, Raft) at once: a joining manager must answer the leader to get its snapshot.
        let dispatcher = shoal_manager::Dispatcher::new(
            core.state.clone(),
            DispatcherConfig { manager_addr: advertised.to_string(), ..DispatcherConfig::default() },
        );
        let grpc = services::serve_manager_grpc(
            &dispatcher,
            listener,
            Some(&core.raft),
            &core.remote_security,
            shutdown_rx.clone(),
        );
        let mut tasks = vec![("grpc", grpc)];
        if let Some(listener) = metrics {
            tasks.extend(core.serve_metrics(listener, &dispatcher, &identity.node_id, &shutdown_rx));
        }
        let cluster_id = match core.wait_cluster(&cfg, &identity, advertised, description).await {
            Ok(id) => id,
            Err(e) => {
                let _ = shutdown_tx.send(true);
                core.raft.shutdown().await;
                return Err(e);
            }
        };
        if let Some((_, certs)) = &core.mtls.pending {
            // The root CA is in the cluster object now: keep this manager's certificate.
            join::store_certs(&cfg.state_dir, certs).map_err(|e| NodeError::Security(e.to_string()))?;
        }

        // The parts that run once the cluster is ready (`manager_parts`).
        let (dispatcher_addr, dispatcher_addr_task) =
            raft_member::dispatcher_addr_watch(&core.raft, advertised.to_string(), shutdown_rx.clone());
        tasks.push(("dispatcher-address", dispatcher_addr_task));
        let wiring = Wiring {
            cfg: &cfg,
            node_id: &identity.node_id,
            advertised,
            state: &core.state,
            raft: &core.raft,
            dispatcher: &dispatcher,
            tls: &core.mtls.tls,
            remote_security: &core.remote_security,
            dispatcher_addr: &dispatcher_addr,
            shutdown: &shutdown_rx,
        };
        tasks.extend(wiring.start_parts());
        let ctx = wiring.api_context(executor.name(), &hostname, &core.channels, lifecycle);
        if let Some(addr) = cfg.listen_api_tcp {
            tasks.push(("engine-api-tcp", wiring.serve_api_tcp(addr, ctx.clone()).await?));
        }
        control.install(wiring.control_router(ctx, &picked))?;
        if let Some(listener) = swarmkit {
            tasks.push(("swarmkit-api", wiring.serve_swarmkit(listener)));
        }
        let (agent_parts, demoted) = wiring.start_agent(executor, hostname, remote_addr);
        tasks.extend(agent_parts);

        tracing::info!(node_id = %identity.node_id, %cluster_id, control = %control.path().display(),
            remote = %remote_addr, "node started");
        let swarmkit_socket = cfg.listen_swarmkit_api.clone();
        Ok(RunningNode {
            identity,
            cluster_id,
            raft: core.raft,
            state: core.state,
            shutdown_tx,
            tasks,
            own_control: None,
            swarmkit_socket,
            remote_addr,
            demoted,
        })
    }
}

/// This node's identity from the state dir, or a new one (stored) on a first start; refuses a state dir with
/// Raft data but no identity.
fn load_or_create_identity(state_dir: &Path, ids: &RandomIds) -> Result<NodeIdentity, NodeError> {
    if let Some(id) = identity::load(state_dir)? {
        return Ok(id);
    }
    if RaftNode::has_existing_state(state_dir) {
        return Err(NodeError::State(format!(
            "{} has raft data but no node.json; restore node.json or start with an empty state dir",
            state_dir.display()
        )));
    }
    let id = NodeIdentity { node_id: shoal_store::IdSource::new_id(ids), raft_id: random_raft_id() };
    identity::store(state_dir, &id)?;
    Ok(id)
}

impl RunningNode {
    /// This node's identity.
    pub fn identity(&self) -> &NodeIdentity {
        &self.identity
    }
    /// The cluster's ID.
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }
    /// The cluster state handles (store, proposer, clock, IDs).
    pub fn state(&self) -> &ClusterState {
        &self.state
    }
    /// The bound gRPC address.
    pub fn remote_addr(&self) -> std::net::SocketAddr {
        self.remote_addr
    }

    /// Resolves once this manager was demoted and holds a worker certificate, with the address of the manager
    /// that issued it; never if it is not demoted.
    pub async fn demoted(&self) -> String {
        let mut rx = self.demoted.clone();
        let via = rx.wait_for(Option::is_some).await.map(|via| via.clone().unwrap_or_default());
        match via {
            Ok(via) => via,
            Err(_) => std::future::pending().await,
        }
    }

    /// Stops the node: the agent first (so every task process is stopped), then the servers and the
    /// leader-only subsystems, then Raft. Bounded: each part gets `grace` to finish before it is aborted.
    pub async fn shutdown(mut self, grace: Duration) {
        let own_control = self.own_control.take();
        self.shutdown_parts(grace).await;
        if let Some(control) = own_control {
            if tokio::time::timeout(grace, control.close()).await.is_err() {
                tracing::warn!(part = "engine-api", "did not stop in time");
            }
        }
    }

    /// Stops everything as `shutdown` does but a daemon's control socket, which outlives the node (a leave
    /// is answered through it once the node is inactive).
    pub(crate) async fn shutdown_parts(self, grace: Duration) {
        let _ = self.shutdown_tx.send(true);
        stop_parts(self.tasks, grace).await;
        self.raft.shutdown().await;
        if let Some(path) = &self.swarmkit_socket {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A started part of a node: its name (in logs and at shutdown) and its task.
pub(crate) type Started = (&'static str, tokio::task::JoinHandle<()>);

/// Waits for each of `parts` (told to stop) in turn, aborting one that does not end within `grace`.
pub(crate) async fn stop_parts(parts: Vec<Started>, grace: Duration) {
    for (name, handle) in parts {
        let abort = handle.abort_handle();
        if tokio::time::timeout(grace, handle).await.is_err() {
            tracing::warn!(part = name, "did not stop in time; aborting");
            abort.abort();
        }
    }
}

/// Takes the state dir for this process: one daemon per state dir (a second one would take over its control
/// socket and write the same Raft log). The lock is the OS's (`flock`), so it goes with the process, even on
/// `kill -9`; the file holds the owner's PID for the message.
fn lock_state_dir(dir: &Path) -> Result<std::fs::File, NodeError> {
    use std::io::{Read, Seek, Write};
    std::fs::create_dir_all(dir).map_err(|e| NodeError::io(dir, e))?;
    set_mode(dir, 0o700)?;
    let path = dir.join(STATE_DIR_LOCK);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| NodeError::io(&path, e))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            return Err(NodeError::State(format!(
                "{} is in use by another shoal daemon (pid {}): stop it, or give this one another --state-dir",
                dir.display(),
                pid.trim()
            )));
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(NodeError::io(&path, e)),
    }
    file.set_len(0)
        .and_then(|_| file.rewind())
        .and_then(|_| write!(file, "{}", std::process::id()))
        .map_err(|e| NodeError::io(&path, e))?;
    Ok(file)
}

/// The state dir's lock file (see [`lock_state_dir`]).
pub const STATE_DIR_LOCK: &str = "shoal.lock";

/// The names in the state dir's top level.
fn state_dir_entries(dir: &Path) -> std::collections::BTreeSet<std::ffi::OsString> {
    std::fs::read_dir(dir).map(|rd| rd.filter_map(|e| e.ok().map(|e| e.file_name())).collect()).unwrap_or_default()
}

pub(crate) async fn wait_true(mut rx: watch::Receiver<bool>) {
    shoal_manager::stopped(&mut rx).await
}

fn random_raft_id() -> u64 {
    use rand::Rng;
    rand::rng().random_range(1..u64::MAX)
}

pub(crate) fn set_mode(path: &Path, mode: u32) -> Result<(), NodeError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|e| NodeError::io(path, e))
}

/// Runs a node until `stop` resolves, then shuts it down; in between it moves through the swarm lifecycle
/// (`lifecycle`): inactive until an init or join, a member (locked first when autolock sealed its keys; a
/// worker, restarted in-process as a manager when promoted; or a manager, restarted in-process as a worker
/// when demoted), and back to inactive on leave.
pub async fn run_daemon(cfg: DaemonConfig, stop: impl std::future::Future<Output = ()>) -> Result<(), NodeError> {
    // Before any listener: the remote port's connection caps are drawn from the limit (`connection_caps`).
    if let Err(e) = connection_caps::raise_nofile_limit() {
        tracing::warn!(error = %e, "could not raise the open-file limit (RLIMIT_NOFILE); the connection caps follow \
                                    the current one");
    }
    let _state_dir_lock = lock_state_dir(&cfg.state_dir)?;
    let control = control_socket::ControlSocket::new(&cfg.listen_control_api);
    let ran = run_states(cfg, &control, stop).await;
    control.close().await;
    ran
}

/// `run_daemon`'s moves between the lifecycle's states, on the daemon's one control socket.
async fn run_states(
    mut cfg: DaemonConfig,
    control: &control_socket::ControlSocket,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), NodeError> {
    let stop = std::pin::pin!(stop);
    let mut stop = stop;
    let (handle, mut requests) = lifecycle::channel();
    let mut pending: Option<lifecycle::Pending> = None;
    loop {
        if lifecycle::prepare_start(&mut cfg)? {
            match lifecycle::serve_inactive(&mut cfg, control, &handle, &mut requests, &mut pending, stop.as_mut())
                .await?
            {
                lifecycle::InactiveExit::Stopped => return Ok(()),
                lifecycle::InactiveExit::Start => {}
            }
        }
        let from_request = pending.is_some();
        let mut session =
            lifecycle::Session { handle: &handle, control, requests: &mut requests, pending: &mut pending };
        match run_member(&mut cfg, &mut session, stop.as_mut()).await {
            Ok(MemberExit::Stopped) => return Ok(()),
            Ok(MemberExit::Left(leave)) => {
                lifecycle::remove_containers(&cfg).await;
                lifecycle::clear_state(&cfg)?;
                tracing::info!("left the swarm: this node is in no swarm now");
                pending = Some(*leave);
            }
            Err(e) if from_request => {
                // An init or join that failed: nothing of it stays, and the error is the answer.
                tracing::warn!(error = %e, "docker swarm init/join failed");
                lifecycle::clear_state(&cfg)?;
                if let Some(p) = pending.as_mut() {
                    p.failure = Some(match e {
                        NodeError::Listen { .. } | NodeError::Config(_) => {
                            shoal_engine_api::ApiError::BadRequest(e.to_string())
                        }
                        other => shoal_engine_api::ApiError::Unavailable(other.to_string()),
                    });
                }
            }
            Err(e) => return Err(e),
        }
        cfg.join_addr = None;
        cfg.join_token = None;
    }
}

/// Why a member stopped.
enum MemberExit {
    /// The daemon is stopping.
    Stopped,
    /// `docker swarm leave`: to answer once inactive.
    Left(Box<lifecycle::Pending>),
}

/// Runs this node as a member of its swarm (see `run_daemon`) until `stop` or a leave.
async fn run_member(
    cfg: &mut DaemonConfig,
    session: &mut lifecycle::Session<'_>,
    mut stop: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
) -> Result<MemberExit, NodeError> {
    const GRACE: Duration = Duration::from_secs(15);
    if lock::is_locked(&cfg.state_dir)? {
        match cfg.unlock_key.clone() {
            Some(key) => lock::unlock(&cfg.state_dir, &key.0).map_err(|e| {
                NodeError::Security(format!("cannot unlock this manager with the given unlock key: {e}"))
            })?,
            None => match locked::serve_until_unlocked(cfg, stop.as_mut(), session).await? {
                locked::LockedExit::Unlocked => {}
                locked::LockedExit::Stopped => return Ok(MemberExit::Stopped),
                locked::LockedExit::Left(p) => return Ok(MemberExit::Left(p)),
            },
        }
    }
    let availability =
        session.pending.as_ref().and_then(|p| p.join_availability).map(|a| a.to_api()).unwrap_or_default();
    // A worker, promoted, runs on as a manager; a manager, demoted, runs on as a worker; and so on.
    loop {
        if let worker_node::StartAs::Worker(w) = worker_node::prepare(cfg, availability).await? {
            lifecycle::record_member(cfg)?;
            match worker_node::run_worker(cfg.clone(), w, stop.as_mut(), GRACE, session).await? {
                worker_node::WorkerExit::Stopped => return Ok(MemberExit::Stopped),
                worker_node::WorkerExit::Left(p) => return Ok(MemberExit::Left(p)),
                // Promoted: the state dir now holds a manager certificate; start again as a manager that joins
                // Raft through the manager this worker's session was open with.
                worker_node::WorkerExit::Promoted { via } => cfg.join_addr = Some(via),
            }
        }
        let node = Node::start_in(cfg.clone(), session.control, session.handle.as_ref()).await?;
        // Only once started: a first start that fails leaves nothing behind.
        if let Err(e) = lifecycle::record_member(cfg) {
            node.shutdown(GRACE).await;
            return Err(e);
        }
        if let Some((spec, availability)) = session.pending.as_mut().and_then(|p| p.init.take()) {
            if let Err(e) = lifecycle::apply_init(node.state(), &node.identity().node_id, spec, availability).await {
                node.shutdown(GRACE).await;
                return Err(NodeError::Bootstrap(format!("cannot apply the init request's settings: {e}")));
            }
        }
        let node_id = node.identity().node_id.clone();
        session.started(&node_id).await;
        enum Why {
            Stopped,
            Leave(tokio::sync::oneshot::Sender<Result<(), shoal_engine_api::ApiError>>),
            Demoted(String),
        }
        let why = tokio::select! {
            _ = stop.as_mut() => Why::Stopped,
            reply = session.next_leave() => Why::Leave(reply),
            via = node.demoted() => Why::Demoted(via),
        };
        match why {
            Why::Stopped => {
                tracing::info!("shutting down");
                node.shutdown(GRACE).await;
                return Ok(MemberExit::Stopped);
            }
            Why::Leave(reply) => {
                tracing::info!("docker swarm leave: stopping this manager and leaving the swarm");
                node.shutdown_parts(GRACE).await;
                return Ok(MemberExit::Left(Box::new(lifecycle::Pending::leave(reply))));
            }
            Why::Demoted(via) => {
                // Its tasks stop with the manager's agent and start again under the worker's: never twice.
                tracing::info!(%via, "demoted to worker: stopping the manager parts to run this node as a worker");
                node.shutdown(GRACE).await;
                worker_node::forget_raft_state(&cfg.state_dir)?;
                cfg.join_addr = Some(via);
            }
        }
    }
}
