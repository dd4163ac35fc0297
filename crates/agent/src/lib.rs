//! The worker side of Shoal: the agent keeps a session with the dispatcher (heartbeats, assignments,
//! status reports), runs one task runner per assigned task, and drives each task through the `Executor`
//! seam. Executors: `process` (runs the container spec's command as a local process), `docker` (one
//! container per task through the local Docker Engine) and `testing`
//! (a scriptable fake for tests and benchmarks).
//!
//! The agent knows nothing of the store, Raft or the manager's internals: it talks to managers only over
//! the Dispatcher gRPC protocol.
//!
//! The facade: every module is internal; other crates use `Agent` and what this root re-exports, grouped
//! below (the seams, the session, the executors, what the agent holds and publishes). The one public module
//! is `testing`, the test doors' fake executor, built only with the `test-doors` feature.

mod assigned;
mod dependencies;
mod docker;
mod exec;
mod logs;
mod naming;
mod network;
mod process;
mod remotes;
mod rpc;
mod runner;
mod session;
mod task_files;
// The test doors' scriptable fake executor (the `test-doors` feature): a module of test fakes, used by name
// (`testing::FakeExecutor`) in every test crate.
#[cfg(any(test, feature = "test-doors"))]
pub mod testing;
mod volumes;
mod worker;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

// The agent's seams: the executor a node picks, and what it reports.
pub use exec::{BoxFuture, Controller, Executor, ExecutorError, ExitStatus};
pub use shoal_api::NodeDescription;
pub use worker::{HeldSink, LOST_TASK_MESSAGE};

// The session with the managers: reconnecting, the known managers (saved between runs), the TLS endpoints.
pub use remotes::{load as load_managers, save as save_managers, Remotes, MANAGERS_FILE};
pub use session::{Backoff, EndpointFactory, SessionError, MAX_MESSAGE_BYTES, NODE_ID_METADATA_KEY};

// The executors: local processes and the Docker Engine (with its attacher of the engine's own containers).
pub use docker::attach::{container_labels, AttachError, Attacher, HolderFacts};
pub use docker::holder::LABEL_HOLDER_TASK_ID;
pub use docker::{remove_node_containers, DockerExecutor, DEFAULT_ENGINE_ADDR};
pub use process::ProcessExecutor;
pub use task_files::{default_root as default_task_files_root, FilesRoot};

// What the agent holds and publishes: secrets and configs, the data plane, cluster volumes, task names.
pub use dependencies::{FileKind, Held};
pub use naming::{service_name, task_name};
pub use network::NetworkPlane;
pub use volumes::{NodeVolumes, Volumes};

use runner::StatusReporter;
use session::{run_session, SessionContext};
use tokio::sync::watch;
use worker::Worker;

/// The engine label naming the node's executor (`docker`, `process`), as `docker info` shows it.
pub const SHOAL_EXECUTOR_LABEL: &str = "shoal.executor";

/// Shortest wait before reconnecting to the manager, and the pause before trying the next manager within a round.
pub const RECONNECT_MIN: Duration = Duration::from_millis(100);
/// Most consecutive "go to the leader" redirects followed without a backoff pause.
pub const MAX_REDIRECTS_IN_A_ROW: u32 = 3;
/// Longest wait before reconnecting to the manager.
pub const RECONNECT_MAX: Duration = Duration::from_secs(5);
/// Longest reason the node reports for having no data plane (`shoal_api::SHOAL_NO_DATA_PLANE_LABEL`).
pub const MAX_NO_DATA_PLANE_BYTES: usize = 512;

/// Agent settings.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// This node's ID (sent on every RPC).
    pub node_id: String,
    /// The manager's dispatcher URI, e.g. "http://127.0.0.1:4242": the first one tried. Its scheme is used
    /// for every other manager the agent learns of.
    pub manager_addr: String,
    /// The hostname reported in the node description (the executor's when empty).
    pub hostname: String,
    /// The agent's state directory; task files live under `state_dir/tasks/<task id>/`.
    pub state_dir: PathBuf,
    /// Engine labels reported in the node description (added to the executor's).
    pub engine_labels: HashMap<String, String>,
    /// Generic resources this node offers (`--generic-node-resources`), reported in the node description.
    pub generic_resources: Vec<shoal_api::GenericResource>,
}

/// The agent: run it with `run`.
pub struct Agent {
    config: AgentConfig,
    executor: Arc<dyn Executor>,
    /// When set, the dispatcher URI to use for each new session (e.g. the Raft leader's); else
    /// `config.manager_addr`.
    manager_source: Option<watch::Receiver<String>>,
    /// When set, makes each session's endpoint (mutual TLS); else plain HTTP/2.
    endpoint_factory: Option<session::EndpointFactory>,
    /// When set, gets this node's Node object as the dispatcher sends it.
    node_sink: Option<watch::Sender<Option<shoal_api::Node>>>,
    /// More managers to try after `config.manager_addr` (e.g. the list saved by an earlier run).
    more_managers: Vec<String>,
    /// When set, the manager list is saved there whenever it changes (see `save_managers`).
    managers_file: Option<PathBuf>,
    /// When set, gets the cluster's managers as `(node ID, host:port)`, sorted, whenever a session message
    /// lists them.
    managers_sink: Option<watch::Sender<Vec<(String, String)>>>,
    /// When set, gets the address (`host:port`) of the manager each new session is open with.
    session_manager_sink: Option<watch::Sender<String>>,
    /// When set, gets the IDs and names (never the data) of the secrets and configs the agent holds.
    held_sink: Option<worker::HeldSink>,
    /// When set, the node's TLS information, sent in the description; a change opens a new session.
    tls_info: Option<watch::Receiver<shoal_api::NodeTlsInfo>>,
    /// When set, gets the roots to trust (`SessionMessage.RootCA`) whenever a session message carries them.
    roots_sink: Option<watch::Sender<Vec<u8>>>,
    /// When set, gets the cluster's network encryption keys as session messages bring them.
    network_keys_sink: Option<watch::Sender<Vec<shoal_api::EncryptionKey>>>,
    /// When set, the node's cluster volumes (its CSI plugins; what they say of the node, `NodeGetInfo`, is
    /// reported in the description).
    volumes: Option<volumes::Volumes>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent").field("config", &self.config).field("executor", &self.executor.name()).finish()
    }
}

impl Agent {
    /// An agent running tasks with `executor`.
    pub fn new(config: AgentConfig, executor: Arc<dyn Executor>) -> Agent {
        Agent {
            config,
            executor,
            manager_source: None,
            endpoint_factory: None,
            node_sink: None,
            more_managers: Vec::new(),
            managers_file: None,
            managers_sink: None,
            session_manager_sink: None,
            held_sink: None,
            tls_info: None,
            roots_sink: None,
            network_keys_sink: None,
            volumes: None,
        }
    }

    /// Publishes the cluster volumes assigned to this node through `volumes`, and reports what its plugins
    /// say of the node (`NodeGetInfo`, asked when the agent starts) in the node description.
    pub fn with_volumes(mut self, volumes: volumes::Volumes) -> Agent {
        self.volumes = Some(volumes);
        self
    }

    /// Reports `info` in the node description, and opens a new session whenever it changes (a renewed
    /// certificate, new trusted roots), as SwarmKit's agent does for a changed description.
    pub fn with_tls_info(mut self, info: watch::Receiver<shoal_api::NodeTlsInfo>) -> Agent {
        self.tls_info = Some(info);
        self
    }

    /// Publishes on `sink` the roots the managers say to trust (a root CA rotation changes them).
    pub fn with_roots_sink(mut self, sink: watch::Sender<Vec<u8>>) -> Agent {
        self.roots_sink = Some(sink);
        self
    }

    /// Knows `more` managers besides `config.manager_addr` (tried after it, in order), and keeps the list
    /// the dispatcher sends in `file` when set (read it back with `load_managers` on the next start).
    pub fn with_managers(mut self, more: Vec<String>, file: Option<PathBuf>) -> Agent {
        self.more_managers = more;
        self.managers_file = file;
        self
    }

    /// Publishes on `sink` the cluster's managers, `(node ID, host:port)` sorted, as the dispatcher lists them
    /// in its session messages (a worker's `GET /info` shows them).
    pub fn with_managers_sink(mut self, sink: watch::Sender<Vec<(String, String)>>) -> Agent {
        self.managers_sink = Some(sink);
        self
    }

    /// Publishes on `sink` the address (`host:port`) of the manager each session is open with (the node's
    /// certificate renewal goes there).
    pub fn with_session_manager_sink(mut self, sink: watch::Sender<String>) -> Agent {
        self.session_manager_sink = Some(sink);
        self
    }

    /// Publishes on `sink` the cluster's network encryption keys (the key manager's keyrings of the
    /// `networking:gossip` and `networking:ipsec` subsystems) whenever a session message brings a different
    /// set, as after a rotation: what the node's data plane encrypts with. Held in memory only, never logged.
    pub fn with_network_keys_sink(mut self, sink: watch::Sender<Vec<shoal_api::EncryptionKey>>) -> Agent {
        self.network_keys_sink = Some(sink);
        self
    }

    /// Tells `sink` the IDs and names of the secrets and configs the agent holds (never their data) whenever
    /// they change: the node's debug view (`GET /debug/dependencies` on a worker's control socket).
    pub fn with_held_sink(mut self, sink: worker::HeldSink) -> Agent {
        self.held_sink = Some(sink);
        self
    }

    /// Takes the dispatcher URI from `source` for every new session instead of `config.manager_addr`
    /// (a manager node points its agent at the current leader this way). A change wakes the agent from its
    /// reconnect backoff.
    pub fn with_manager_source(mut self, source: watch::Receiver<String>) -> Agent {
        self.manager_source = Some(source);
        self
    }

    /// Connects each session through `factory` (the node's mutual-TLS endpoints) instead of plain HTTP/2.
    pub fn with_endpoint_factory(mut self, factory: session::EndpointFactory) -> Agent {
        self.endpoint_factory = Some(factory);
        self
    }

    /// Publishes this node's Node object on `sink` whenever the dispatcher sends it (a worker learns of its
    /// promotion this way).
    pub fn with_node_sink(mut self, sink: watch::Sender<Option<shoal_api::Node>>) -> Agent {
        self.node_sink = Some(sink);
        self
    }

    /// The node description sent to the manager: the executor's, with the configured hostname and labels,
    /// the `shoal.agent` engine label (`shoal_api::SHOAL_AGENT_LABEL`) and `shoal.executor` (its name).
    pub fn description(&self) -> NodeDescription {
        let mut d = self.executor.describe();
        if !self.config.hostname.is_empty() {
            d.hostname = self.config.hostname.clone();
        }
        let engine = d.engine.get_or_insert_with(Default::default);
        for (k, v) in &self.config.engine_labels {
            engine.labels.insert(k.clone(), v.clone());
        }
        // Tells managers this node runs Shoal's agent, not a Docker Engine's (which may not be promoted).
        engine.labels.insert(shoal_api::SHOAL_AGENT_LABEL.to_string(), env!("CARGO_PKG_VERSION").to_string());
        if let Some(why) = self.executor.data_plane_off() {
            let mut why = why;
            if why.len() > MAX_NO_DATA_PLANE_BYTES {
                let mut end = MAX_NO_DATA_PLANE_BYTES;
                while !why.is_char_boundary(end) {
                    end -= 1;
                }
                why.truncate(end);
            }
            engine.labels.insert(shoal_api::SHOAL_NO_DATA_PLANE_LABEL.to_string(), why);
        }
        // Which executor runs its tasks, as `docker info` shows it: `--constraint
        // engine.labels.shoal.executor==docker`.
        engine.labels.insert(SHOAL_EXECUTOR_LABEL.to_string(), self.executor.name().to_string());
        if !self.config.generic_resources.is_empty() {
            d.resources.get_or_insert_with(Default::default).generic = self.config.generic_resources.clone();
        }
        d
    }

    /// Runs until `shutdown` turns true: then stops every task it runs (executor shutdown with grace, then
    /// terminate) and returns. Reconnects with backoff (bounded, jittered) when the manager is unreachable,
    /// trying the known managers in turn (see `remotes`). While no session is open, its tasks keep running:
    /// only the managers' assignments (on the next session) stop them.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        if let Err(e) = std::fs::create_dir_all(self.config.state_dir.join("tasks")) {
            tracing::warn!(dir = %self.config.state_dir.display(), "cannot create the agent's task directory: {e}");
        }
        let reporter = Arc::new(StatusReporter::new());
        let mut description = self.description();
        if let Some(v) = &self.volumes {
            description.csi_info = v.node_info().await;
        }
        let mut worker = self.worker(&description, reporter.clone());
        let network = self.executor.network_plane();
        let attacher = self.executor.engine_attachments();
        let mut network_tasks = self.follow_assignments(&worker, network.as_ref(), attacher.as_ref(), &shutdown).await;
        if let Some(v) = &self.volumes {
            network_tasks.push(tokio::spawn(v.clone().run(shutdown.clone())));
            network_tasks.push(tokio::spawn(v.clone().refresh_node_info(shutdown.clone())));
        }
        let mut reconnect = Reconnect {
            backoff: Backoff::new(RECONNECT_MIN, RECONNECT_MAX),
            redirect: None,
            redirects_in_a_row: 0,
            stopped_as_removed: false,
            scheme: self.config.manager_addr.split_once("://").map_or("http", |(s, _)| s).to_string(),
            remotes: Remotes::new(
                std::iter::once(self.config.manager_addr.as_str()).chain(self.more_managers.iter().map(String::as_str)),
            ),
        };
        loop {
            if *shutdown.borrow() {
                break;
            }
            let manager_addr = match (reconnect.redirect.take(), &self.manager_source) {
                (Some(leader), _) => leader,
                (None, Some(rx)) => rx.borrow().clone(),
                (None, None) => reconnect
                    .remotes
                    .current()
                    .map(|m| reconnect.uri(m))
                    .unwrap_or_else(|| self.config.manager_addr.clone()),
            };
            let remotes = &mut reconnect.remotes;
            let mut on_message = |msg: &shoal_api::SessionMessage| self.publish(remotes, &manager_addr, msg);
            let mut description = description.clone();
            let tls_info = self.tls_info.clone().map(|mut rx| {
                description.tls_info = Some(rx.borrow_and_update().clone());
                rx
            });
            let csi_info = self.volumes.as_ref().map(|v| {
                let mut rx = v.node_info_changes();
                description.csi_info = rx.borrow_and_update().clone();
                rx
            });
            let ctx = SessionContext {
                manager_addr: &manager_addr,
                endpoint_factory: self.endpoint_factory.as_ref(),
                node_id: &self.config.node_id,
                description,
                tls_info,
                worker: &mut worker,
                reporter: reporter.clone(),
                backoff: &mut reconnect.backoff,
                node_sink: self.node_sink.as_ref(),
                on_message: &mut on_message,
                network: network.clone(),
                attacher: attacher.clone(),
                volumes: self.volumes.clone(),
                csi_info,
            };
            match run_session(ctx, &mut shutdown).await {
                Ok(()) => break,
                Err(SessionError::DescriptionChanged) => {
                    tracing::info!(node = %self.config.node_id, "this node's description changed (its certificate \
                        or what its CSI plugins say of it): opening a new session to report it");
                    reconnect.redirect = Some(manager_addr.clone());
                }
                Err(e) => {
                    if !self.after_session_error(e, &manager_addr, &mut reconnect, &mut worker, &mut shutdown).await {
                        break;
                    }
                }
            }
        }
        self.stop(worker, network, network_tasks).await;
    }

    /// The worker that runs this node's tasks, reporting through `reporter`.
    fn worker(&self, description: &NodeDescription, reporter: Arc<StatusReporter>) -> Worker {
        let platform = description.platform.clone().unwrap_or_default();
        let worker = Worker::new(self.executor.clone(), reporter).with_node(dependencies::NodeFacts {
            id: self.config.node_id.clone(),
            hostname: description.hostname.clone(),
            os: platform.os,
            architecture: platform.architecture,
        });
        let worker = match &self.volumes {
            Some(v) => worker.with_volumes(v.clone()),
            None => worker,
        };
        match &self.held_sink {
            Some(sink) => worker.with_held_sink(sink.clone()),
            None => worker,
        }
    }

    /// Starts the data plane (`network`) and the attacher of the engine's own containers on attachable
    /// networks (`attacher`; it also follows each session's connection, `SessionContext::attacher`), each
    /// following the worker's assignments; returns their tasks.
    async fn follow_assignments(
        &self,
        worker: &Worker,
        network: Option<&Arc<network::NetworkPlane>>,
        attacher: Option<&Arc<dyn exec::EngineAttachments>>,
        shutdown: &watch::Receiver<bool>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let mut tasks = Vec::new();
        if let Some(plane) = network {
            if !self.executor.tasks_outlive_agent() {
                // The tasks of an earlier run died with it: nothing of their data plane is kept.
                plane.clear().await;
            }
            tasks.push(tokio::spawn(plane.clone().run(shutdown.clone())));
            let plane = plane.clone();
            tasks.push(follow(worker.assigned(), move |now| plane.set_assigned(now)));
        }
        if let Some(att) = attacher {
            tasks.push(tokio::spawn(att.clone().run(shutdown.clone())));
            let att = att.clone();
            tasks.push(follow(worker.assigned(), move |now| att.set_assigned(now)));
        }
        tasks
    }

    /// Passes on what a session message tells (the root CA, the session's manager, the managers, the network
    /// keys) to the sinks that want it, and keeps the known managers (`remotes`, saved to the managers file
    /// when they change).
    fn publish(&self, remotes: &mut Remotes, manager_addr: &str, msg: &shoal_api::SessionMessage) {
        remotes.opened();
        if let Some(sink) = &self.roots_sink {
            if !msg.root_ca.is_empty() {
                sink.send_if_modified(|cur| {
                    let changed = *cur != msg.root_ca;
                    if changed {
                        cur.clone_from(&msg.root_ca);
                    }
                    changed
                });
            }
        }
        if let Some(sink) = &self.session_manager_sink {
            sink.send_if_modified(|cur| {
                let now = remotes::host_port(manager_addr);
                let changed = cur != now;
                if changed {
                    *cur = now.to_string();
                }
                changed
            });
        }
        if let Some(sink) = &self.managers_sink {
            let mut listed: Vec<(String, String)> = msg
                .managers
                .iter()
                .filter_map(|w| w.peer.as_ref())
                .map(|p| (p.node_id.clone(), remotes::host_port(&p.addr).to_string()))
                .filter(|(_, addr)| !addr.is_empty())
                .collect();
            listed.sort();
            if !listed.is_empty() {
                sink.send_if_modified(|cur| {
                    let changed = *cur != listed;
                    if changed {
                        *cur = listed;
                    }
                    changed
                });
            }
        }
        if let Some(sink) = &self.network_keys_sink {
            sink.send_if_modified(|cur| {
                let changed = *cur != msg.network_bootstrap_keys;
                if changed {
                    cur.clone_from(&msg.network_bootstrap_keys);
                }
                changed
            });
        }
        if remotes.observe(&msg.managers) {
            tracing::info!(node = %self.config.node_id, managers = ?remotes.addrs(), "the cluster's managers changed");
            if let Some(file) = &self.managers_file {
                if let Err(e) = remotes::save(file, remotes.addrs()) {
                    tracing::warn!(file = %file.display(), "cannot save the manager list: {e}");
                }
            }
        }
    }

    /// After the session with `manager_addr` ended with `e`: stops the tasks of a removed node, goes to the
    /// leader a refusal named, or waits (a short pause within a round of the known managers, the growing
    /// backoff once they all failed, less when the manager to talk to changes) before the next session.
    /// Returns false when `shutdown` ended the wait.
    async fn after_session_error(
        &self,
        e: SessionError,
        manager_addr: &str,
        reconnect: &mut Reconnect,
        worker: &mut Worker,
        shutdown: &mut watch::Receiver<bool>,
    ) -> bool {
        if e.node_removed() && !reconnect.stopped_as_removed {
            reconnect.stopped_as_removed = true;
            // As SwarmKit's agent: a removed node runs nothing (an empty complete assignment set).
            tracing::warn!(
                node = %self.config.node_id,
                "this node was removed from the swarm (docker node rm): stopping its tasks; its certificate is \
                 refused, so to take part again leave (docker swarm leave) and join with a join token"
            );
            worker.apply(shoal_api::AssignmentsMessage {
                r#type: shoal_api::assignments_message::Type::Complete as i32,
                ..Default::default()
            });
        }
        if let Some(leader) = e.leader_hint().filter(|_| reconnect.redirects_in_a_row < MAX_REDIRECTS_IN_A_ROW) {
            tracing::info!(node = %self.config.node_id, %leader, "the manager is not the leader; going to the leader");
            reconnect.remotes.redirected(&leader);
            reconnect.redirect = Some(reconnect.uri(&leader));
            reconnect.redirects_in_a_row += 1;
            return true;
        }
        reconnect.redirects_in_a_row = 0;
        // The next session goes to the next known manager: after a short pause within a round of
        // the known managers, after the (growing) backoff once they all failed.
        let round_over = reconnect.remotes.failed(manager_addr);
        let delay = if round_over || self.manager_source.is_some() {
            reconnect.backoff.next_delay(&mut rand::rng())
        } else {
            RECONNECT_MIN
        };
        tracing::warn!(node = %self.config.node_id, next = ?reconnect.remotes.current(), "session with the manager \
                                                                                          ended: {e}; retrying in \
                                                                                          {delay:?}");
        let mut source = self.manager_source.clone();
        let moved = async {
            match source.as_mut() {
                Some(rx) => {
                    rx.borrow_and_update();
                    if rx.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = moved => tracing::info!(node = %self.config.node_id, "the manager to talk to changed; reconnecting"),
            r = shutdown.changed() => if r.is_err() { return false },
        }
        true
    }

    /// Stops every task, the data plane's followers, and the data plane (cleared, or only what no kept task
    /// holds when tasks outlive the agent).
    async fn stop(
        &self,
        mut worker: Worker,
        network: Option<Arc<network::NetworkPlane>>,
        network_tasks: Vec<tokio::task::JoinHandle<()>>,
    ) {
        tracing::info!(node = %self.config.node_id, "agent stopping: stopping its tasks");
        if let Some(plane) = &network {
            plane.set_stopping();
        }
        worker.stop_all().await;
        for t in network_tasks {
            t.abort();
        }
        if let Some(plane) = &network {
            if !self.executor.tasks_outlive_agent() {
                tracing::info!(node = %self.config.node_id, "removing the node's data plane");
                plane.clear().await;
            } else {
                plane.release_unkept().await;
            }
        }
    }
}

/// Where the agent's next session goes, and how long it waits for it.
struct Reconnect {
    backoff: Backoff,
    /// Set when a manager refused because it is not the leader and named the leader: the next session
    /// goes there. At most `MAX_REDIRECTS_IN_A_ROW` such hops without a backoff pause.
    redirect: Option<String>,
    redirects_in_a_row: u32,
    /// Set once a refusal said this node was removed and its tasks were stopped.
    stopped_as_removed: bool,
    /// The scheme of the configured manager address, for the others.
    scheme: String,
    /// The known managers.
    remotes: Remotes,
}

impl Reconnect {
    /// The URI of manager `hostport`.
    fn uri(&self, hostport: &str) -> String {
        format!("{}://{}", self.scheme, remotes::host_port(hostport))
    }
}

/// Passes each value of `assigned` to `set`, the first at once, until the worker is gone.
fn follow(
    mut assigned: watch::Receiver<assigned::AssignedTasks>,
    set: impl Fn(assigned::AssignedTasks) + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let now = assigned.borrow_and_update().clone();
            set(now);
            if assigned.changed().await.is_err() {
                return;
            }
        }
    })
}
