//! `DockerExecutor`: runs each task as one container of the local Docker Engine (over bollard), as SwarmKit's
//! dockerapi executor does: the container is named `<service>.<slot>.<task id>` and carries the swarm labels
//! (`spec`), is created in `prepare` (the image must be on the node; a missing image is pulled once and
//! the task is rejected with the engine's reason when that fails), started in `start` (which returns only
//! once a container with a healthcheck is healthy, and fails the task if it turns unhealthy), waited on,
//! stopped with its stop signal and grace period, and force-removed.
//!
//! Secrets and configs: each file is written in `prepare` under the node's files root on a tmpfs
//! (`task_files`, named by its index there) and bind-mounted read-only into the container at its target
//! (`task_files::container_path`: `/run/secrets/<name>` for a relative secret target, `/<name>` for a
//! config); the files are removed with the container, and those of tasks no longer assigned are swept with
//! their containers.
//!
//! Containers outlive the agent: at connect the executor lists the containers labelled with this node's
//! ID; the worker adopts those whose task is still assigned, and the rest are removed once the first
//! complete assignment set is known.
//!
//! Networks: a task with attachments gets a holder container (`holder`, network mode `none`) in `prepare`,
//! whose namespace is named `shl-task-<task id>` (`NetworkPlane::attach_namespace`) and plumbed by the node's
//! data plane; the task's container is created with network mode `container:<holder>` and started only once
//! the plane reports the namespace plumbed. Its published ports are the data plane's to forward into that
//! namespace (the routing mesh, host-mode DNAT), never the engine's to bind. A task told to stop is drained
//! out of the VIPs first (as the process executor's). When the container exits or is removed, its namespace
//! is released and its holder removed. Holders outlive the agent with their containers: at connect they are listed too,
//! and the plane keeps their links (`NetworkPlane::resume`) until the worker adopts their tasks, whose namespaces are
//! then registered again; the holders of tasks not adopted are removed with the first complete assignment set.
//!
//! Bounds: one engine call at a time per controller; health is polled every `HEALTH_POLL`; a pull is
//! given `PULL_TIMEOUT`. Must not depend on the session or gRPC.

pub(crate) mod attach;
pub(crate) mod engine_network;
pub(crate) mod holder;
pub(crate) mod spec;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use bollard::errors::Error as BollardError;
use bollard::models::{ContainerCreateBody, ContainerInspectResponse, HealthStatusEnum};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, KillContainerOptionsBuilder,
    ListContainersOptionsBuilder, RemoveContainerOptionsBuilder, StopContainerOptionsBuilder,
    WaitContainerOptionsBuilder,
};
use bollard::Docker;
use futures::StreamExt;
use parking_lot::Mutex;
use shoal_api::{EngineDescription, NodeDescription, Platform, Resources, Task};

use crate::exec::{
    stop_grace_period, BoxFuture, Controller, Executor, ExecutorError, ExitStatus, RuntimeReport, TaskFiles,
};
use crate::network::NetworkPlane;
use crate::task_files::FilesRoot;

/// The engine address used when none is given.
pub const DEFAULT_ENGINE_ADDR: &str = "unix:///var/run/docker.sock";
/// How often a starting or running container's health is checked.
pub(crate) const HEALTH_POLL: Duration = Duration::from_millis(250);
/// The longest an image pull may take before the task is rejected.
pub(crate) const PULL_TIMEOUT: Duration = Duration::from_secs(300);
/// Timeout of one engine request (a stop waits up to the grace period, so this is generous).
pub(crate) const ENGINE_REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// Why the executor could not connect to the engine.
#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    /// The engine did not answer.
    #[error("cannot reach the Docker Engine at {addr}: {reason}; start dockerd or pass --engine-addr")]
    Unreachable {
        /// The engine address.
        addr: String,
        /// What went wrong.
        reason: String,
    },
    /// The engine answered with an error.
    #[error("the Docker Engine at {addr} failed to {what}: {reason}")]
    Engine {
        /// The engine address.
        addr: String,
        /// The call.
        what: &'static str,
        /// The engine's message.
        reason: String,
    },
}

/// Runs tasks as Docker containers.
pub struct DockerExecutor {
    docker: Docker,
    /// The engine's API version (major, minor), as negotiated at connect.
    engine_api: (usize, usize),
    node_id: String,
    description: NodeDescription,
    /// Containers of this node found at connect, by task ID; `None` once the first assignment set swept it.
    inventory: Mutex<Option<HashMap<String, String>>>,
    /// Where task secrets and configs are written, on a tmpfs.
    files_root: FilesRoot,
    /// The node's data plane, or why there is none (tasks with networks are then rejected with it).
    network: Result<Arc<NetworkPlane>, String>,
    /// Network-namespace holders found at connect, by task ID; `None` once the first assignment set swept it.
    holders: Mutex<Option<HashMap<String, String>>>,
    /// Set once the holder image is known to be in the engine.
    holder_image: Arc<tokio::sync::OnceCell<()>>,
    /// Container creations under way (see `Creations`).
    creations: Creations,
    /// This node's tasks on each of the engine's networks made for swarm networks (macvlan, ipvlan).
    engine_networks: engine_network::EngineNetworkUsers,
    /// Containers of the engine's own on attachable swarm networks (with the data plane only).
    attacher: Option<Arc<attach::Attacher>>,
}

/// Longest the agent's stop waits for the container creations under way (`Executor::settle`).
pub(crate) const CREATIONS_AT_STOP_MAX: Duration = Duration::from_secs(4);

/// The engine's container creations under way, each on a tokio task of its own: a runner aborted at the
/// agent's stop does not cut one off halfway, which the engine would finish after a `docker swarm leave`
/// listed the node's containers (leaving one in state `created`). The count is what `settle` waits for.
#[derive(Clone)]
struct Creations(Arc<tokio::sync::watch::Sender<usize>>);

impl Default for Creations {
    fn default() -> Creations {
        Creations(Arc::new(tokio::sync::watch::channel(0).0))
    }
}

/// One creation under way: counted down when dropped.
struct Creating(Arc<tokio::sync::watch::Sender<usize>>);

impl Drop for Creating {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

impl Creations {
    /// `docker create --name <name>`, carried to its end even when the caller is dropped.
    async fn create(&self, docker: &Docker, name: &str, body: ContainerCreateBody) -> Result<(), BollardError> {
        self.0.send_modify(|n| *n += 1);
        let creating = Creating(self.0.clone());
        let (docker, opts) = (docker.clone(), CreateContainerOptionsBuilder::default().name(name).build());
        let job = tokio::spawn(async move {
            let _creating = creating;
            docker.create_container(Some(opts), body).await.map(|_| ())
        });
        job.await.unwrap_or_else(|e| Err(BollardError::IOError { err: std::io::Error::other(e.to_string()) }))
    }

    /// Waits until no creation is under way (at most `within`).
    async fn settle(&self, within: Duration) {
        let mut rx = self.0.subscribe();
        if tokio::time::timeout(within, rx.wait_for(|n| *n == 0)).await.is_err() {
            tracing::warn!(
                under_way = *rx.borrow(),
                "container creations did not finish within {within:?} of the agent's stop"
            );
        }
    }
}

impl std::fmt::Debug for DockerExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerExecutor").field("node_id", &self.node_id).finish()
    }
}

/// The HTTP status of an engine error, if it is one.
fn engine_status(e: &BollardError) -> Option<u16> {
    match e {
        BollardError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// Removes container `name` (by name or ID) whatever its state, with its anonymous volumes (as Docker's
/// executor: named volumes stay): whether it was there (one already gone is no error).
async fn force_remove(docker: &Docker, name: &str) -> Result<bool, BollardError> {
    let opts = RemoveContainerOptionsBuilder::default().force(true).v(true).build();
    match docker.remove_container(name, Some(opts)).await {
        Ok(()) => Ok(true),
        Err(e) if engine_status(&e) == Some(404) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The engine's message (without bollard's wrapping) when there is one.
fn engine_message(e: &BollardError) -> String {
    match e {
        BollardError::DockerResponseServerError { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

/// Connects to the engine at `addr` (`unix://PATH`, a socket path, or `tcp://HOST:PORT`).
pub(crate) fn client(addr: &str) -> Result<Docker, DockerError> {
    let unreachable = |e: BollardError| DockerError::Unreachable { addr: addr.to_string(), reason: e.to_string() };
    let secs = ENGINE_REQUEST_TIMEOUT.as_secs();
    let docker = if let Some(rest) = addr.strip_prefix("tcp://").or_else(|| addr.strip_prefix("http://")) {
        Docker::connect_with_http(&format!("http://{rest}"), secs, bollard::API_DEFAULT_VERSION)
    } else {
        Docker::connect_with_unix(addr.strip_prefix("unix://").unwrap_or(addr), secs, bollard::API_DEFAULT_VERSION)
    };
    docker.map_err(unreachable)
}

/// Force-removes every container of node `node_id` (its label) from the engine at `addr`: what
/// `docker swarm leave` does to the containers of a node that leaves its swarm. Returns how many it removed.
pub async fn remove_node_containers(addr: &str, node_id: &str) -> Result<usize, DockerError> {
    let docker = client(addr)?;
    let engine =
        |what| move |e: BollardError| DockerError::Engine { addr: addr.to_string(), what, reason: engine_message(&e) };
    let filters: HashMap<String, Vec<String>> =
        [("label".to_string(), vec![format!("{}={node_id}", spec::LABEL_NODE_ID)])].into();
    let found = docker
        .list_containers(Some(ListContainersOptionsBuilder::default().all(true).filters(&filters).build()))
        .await
        .map_err(engine("list this node's containers"))?;
    // Tasks' containers first, then the holders whose namespaces they share.
    let mut found = found;
    found.sort_by_key(|c| c.labels.as_ref().is_some_and(|l| l.contains_key(holder::LABEL_HOLDER_TASK_ID)));
    let mut removed = 0;
    for id in found.into_iter().filter_map(|c| c.id) {
        if force_remove(&docker, &id).await.map_err(engine("remove a container of this node"))? {
            removed += 1;
        }
    }
    Ok(removed)
}

impl DockerExecutor {
    /// Connects to the engine at `addr`, giving it `ping_within` to answer; reads the node description and
    /// lists the containers an earlier run of this node left.
    pub async fn connect(addr: &str, node_id: &str, ping_within: Duration) -> Result<DockerExecutor, DockerError> {
        let docker = client(addr)?;
        let unreachable = |reason: String| DockerError::Unreachable { addr: addr.to_string(), reason };
        match tokio::time::timeout(ping_within, docker.ping()).await {
            Err(_) => return Err(unreachable(format!("no answer within {ping_within:?}"))),
            Ok(Err(e)) => return Err(unreachable(e.to_string())),
            Ok(Ok(_)) => {}
        }
        let engine = |what| {
            move |e: BollardError| DockerError::Engine { addr: addr.to_string(), what, reason: engine_message(&e) }
        };
        let docker = docker.negotiate_version().await.map_err(engine("report its API version"))?;
        let info = docker.info().await.map_err(engine("describe itself (/info)"))?;
        // The engine's own networks a task can run on: `--network host` and `bridge`, and the swarm networks
        // of each node's engine (macvlan, ipvlan) when the engine has their drivers.
        let mut plugins = vec![crate::network::network_plugin("bridge"), crate::network::network_plugin("host")];
        let drivers = info.plugins.as_ref().and_then(|p| p.network.clone()).unwrap_or_default();
        plugins.extend(
            shoal_api::NODE_LOCAL_DRIVERS
                .iter()
                .filter(|d| drivers.iter().any(|have| have == *d))
                .map(|d| crate::network::network_plugin(d)),
        );
        let labels = info
            .labels
            .unwrap_or_default()
            .into_iter()
            .filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
            .collect();
        let description = NodeDescription {
            hostname: info.name.unwrap_or_default(),
            platform: Some(Platform {
                architecture: info.architecture.unwrap_or_else(|| crate::process::docker_arch().into()),
                os: info.os_type.unwrap_or_else(|| "linux".into()),
            }),
            resources: Some(Resources {
                nano_cpus: info.ncpu.unwrap_or(1) * 1_000_000_000,
                memory_bytes: info.mem_total.unwrap_or(0),
                generic: vec![],
            }),
            engine: Some(EngineDescription {
                engine_version: info.server_version.unwrap_or_default(),
                labels,
                plugins,
            }),
            ..Default::default()
        };
        let filters: HashMap<String, Vec<String>> =
            [("label".to_string(), vec![format!("{}={node_id}", spec::LABEL_NODE_ID)])].into();
        let found = docker
            .list_containers(Some(ListContainersOptionsBuilder::default().all(true).filters(&filters).build()))
            .await
            .map_err(engine("list this node's containers"))?;
        let labelled = |key: &str| -> HashMap<String, String> {
            found.iter().filter_map(|c| Some((c.labels.as_ref()?.get(key)?.clone(), c.id.clone()?))).collect()
        };
        let inventory = labelled(spec::LABEL_TASK_ID);
        let mut holders = labelled(holder::LABEL_HOLDER_TASK_ID);
        // A task's container in its holder's namespace whose holder is gone: the namespace lives on with the
        // container, and is found through it (see `adopt`).
        // (The engine records the joined container by ID, so the holder's name is not in the network mode.)
        for c in &found {
            let joined = c.host_config.as_ref().and_then(|h| h.network_mode.as_deref()).unwrap_or_default();
            if let Some(task) = c.labels.as_ref().and_then(|l| l.get(spec::LABEL_TASK_ID)) {
                if joined.starts_with("container:") {
                    holders.entry(task.clone()).or_insert_with(|| holder::name(task));
                }
            }
        }
        if !inventory.is_empty() {
            tracing::info!(
                containers = inventory.len(),
                holders = holders.len(),
                "found containers left by an earlier run of this node"
            );
        }
        let v = docker.client_version();
        Ok(DockerExecutor {
            engine_api: (v.major_version, v.minor_version),
            docker,
            node_id: node_id.to_string(),
            description,
            inventory: Mutex::new(Some(inventory)),
            files_root: FilesRoot::new(crate::task_files::default_root(node_id)),
            network: Err("the daemon was started without the data plane".into()),
            holders: Mutex::new(Some(holders)),
            holder_image: Arc::new(tokio::sync::OnceCell::new()),
            creations: Creations::default(),
            engine_networks: engine_network::EngineNetworkUsers::default(),
            attacher: None,
        })
    }

    /// Connects tasks to their networks through `plane` (`Err`: why this node has no data plane). The
    /// namespaces of tasks whose container and holder outlived an earlier run are kept for their adoption
    /// (`NetworkPlane::resume`); the rest of what that run made is deleted.
    pub async fn with_network(mut self, plane: Result<Arc<NetworkPlane>, String>) -> DockerExecutor {
        let plane = plane.and_then(|p| holder::supported().map(|()| p));
        if let Ok(p) = &plane {
            // Called before the agent runs, so nothing is swept yet: the tasks with a container and a holder.
            let survivors: std::collections::BTreeSet<String> = {
                let inventory = self.inventory.lock();
                let holders = self.holders.lock();
                match (inventory.as_ref(), holders.as_ref()) {
                    (Some(i), Some(h)) => h.keys().filter(|t| i.contains_key(*t)).cloned().collect(),
                    _ => Default::default(),
                }
            };
            p.resume(&survivors).await;
            let plugins = &mut self.description.engine.get_or_insert_with(Default::default).plugins;
            plugins.push(crate::network::overlay_plugin());
            self.attacher =
                Some(attach::Attacher::new(self.docker.clone(), p.clone(), &self.node_id, self.holder_image.clone()));
        }
        self.network = plane;
        self
    }

    /// The engine client.
    pub fn docker(&self) -> &Docker {
        &self.docker
    }

    /// Writes task secrets and configs under `root` (on a tmpfs) instead of the default
    /// (`task_files::default_root`).
    pub fn with_files_root(mut self, root: FilesRoot) -> DockerExecutor {
        self.files_root = root;
        self
    }

    fn new_controller(&self, task: &Task, files: TaskFiles) -> Result<DockerController, ExecutorError> {
        let network = if !task.on_overlay() {
            None
        } else {
            let plane = self.network.as_ref().map_err(|why| {
                ExecutorError::InvalidSpec(format!(
                    "this node cannot attach a task to a network: {why}; run it on a node with the overlay data plane"
                ))
            })?;
            plane.check_task(task).map_err(ExecutorError::InvalidSpec)?;
            Some(TaskNetwork {
                plane: plane.clone(),
                holder: holder::name(&task.id),
                holder_body: Arc::new(holder::create_body(task, &self.node_id)),
                holder_image: self.holder_image.clone(),
                task: Arc::new(task.clone()),
                creations: self.creations.clone(),
            })
        };
        spec::refuse_newer_than_engine(task, self.engine_api).map_err(ExecutorError::InvalidSpec)?;
        refuse_start_interval(task, self.engine_api).map_err(ExecutorError::InvalidSpec)?;
        let mut body = spec::create_body(task, &self.node_id, network.as_ref().map(|n| n.holder.as_str()))
            .map_err(ExecutorError::InvalidSpec)?;
        if !files.is_empty() {
            crate::task_files::check_in_memory(self.files_root.path()).map_err(ExecutorError::InvalidSpec)?;
            let host = body.host_config.get_or_insert_with(Default::default);
            let mounts = host.mounts.get_or_insert_with(Vec::new);
            for (i, f) in files.iter().enumerate() {
                let target = crate::task_files::container_path(f).map_err(ExecutorError::InvalidSpec)?;
                let source = self.files_root.kind_dir(&task.id, f.kind).join(docker_file_name(i));
                mounts.push(bollard::models::Mount {
                    target: Some(target),
                    source: Some(source.display().to_string()),
                    typ: Some(bollard::models::MountType::BIND),
                    read_only: Some(true),
                    ..Default::default()
                });
            }
        }
        Ok(DockerController {
            task_id: task.id.clone(),
            files_root: self.files_root.clone(),
            files,
            docker: self.docker.clone(),
            name: spec::task_name(task),
            image: body.image.clone().unwrap_or_default(),
            body: Arc::new(body),
            grace: stop_grace_period(task),
            registry_auth: registry_credentials(task),
            pid: 0,
            runtime: RuntimeReport::default(),
            healthcheck: false,
            network,
            engine_network: engine_network::EngineNetwork::of_task(task),
            engine_networks: self.engine_networks.clone(),
            holds_engine_network: false,
            creations: self.creations.clone(),
        })
    }
}

impl DockerExecutor {
    /// The node's side of containers of this engine's own on attachable swarm networks (with the data
    /// plane): what the Engine API's relay plumbs them through.
    pub fn attacher(&self) -> Option<Arc<attach::Attacher>> {
        self.attacher.clone()
    }
}

impl Executor for DockerExecutor {
    fn describe(&self) -> NodeDescription {
        self.description.clone()
    }

    fn controller(&self, task: &Task, files: TaskFiles) -> Result<Box<dyn Controller>, ExecutorError> {
        if attach::attachment_container(task).is_some() {
            let attacher = self.attacher.as_ref().ok_or_else(|| {
                ExecutorError::InvalidSpec(format!(
                    "this node cannot plumb a container into a swarm network: {}",
                    self.network.as_ref().err().map_or("it has no data plane", String::as_str)
                ))
            })?;
            return Ok(Box::new(attacher.controller(task)?));
        }
        Ok(Box::new(self.new_controller(task, files)?))
    }

    fn engine_attachments(&self) -> Option<Arc<dyn crate::exec::EngineAttachments>> {
        self.attacher.clone().map(|a| a as Arc<dyn crate::exec::EngineAttachments>)
    }

    fn name(&self) -> &'static str {
        "docker"
    }

    fn tasks_outlive_agent(&self) -> bool {
        true
    }

    fn adopt(&self, task: &Task) -> Option<Box<dyn Controller>> {
        if attach::attachment_container(task).is_some() {
            return self.attacher.as_ref()?.adopt(task).map(|c| Box::new(c) as Box<dyn Controller>);
        }
        self.inventory.lock().as_mut()?.remove(&task.id)?;
        let holder = self.holders.lock().as_mut().and_then(|h| h.remove(&task.id));
        // The container has its files mounted already (they stayed on the tmpfs); nothing is rewritten.
        match self.new_controller(task, Vec::new()) {
            Ok(c) => {
                if let Some(net) = &c.network {
                    // Its namespace is named and registered again (the plane kept its links meanwhile), from
                    // the holder's PID, or the container's if the holder is gone (the namespace is the same).
                    let holder = holder.unwrap_or_else(|| c.name.clone());
                    let (net, docker, task_id, container) =
                        (net.clone(), self.docker.clone(), task.id.clone(), c.name.clone());
                    tokio::spawn(async move {
                        let attached = match net.attach(&docker, &holder).await {
                            Err(_) if holder != container => net.attach(&docker, &container).await,
                            r => r,
                        };
                        match attached {
                            Ok(()) => tracing::info!(task = %task_id, "adopted the task's network namespace"),
                            Err(e) => {
                                net.plane.forget_survivor(&task_id);
                                tracing::warn!(task = %task_id, "cannot adopt the task's network namespace: {e}");
                            }
                        }
                    });
                }
                Some(Box::new(c))
            }
            Err(e) => {
                tracing::warn!(task = %task.id, "cannot adopt the task's container: {e}");
                None
            }
        }
    }

    fn network_plane(&self) -> Option<Arc<NetworkPlane>> {
        self.network.clone().ok()
    }

    fn data_plane_off(&self) -> Option<String> {
        self.network.as_ref().err().cloned()
    }

    fn settle(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.creations.settle(CREATIONS_AT_STOP_MAX))
    }

    fn logs(&self, task: &Task, options: &crate::exec::LogOptions) -> Result<crate::exec::LogStream, ExecutorError> {
        self.container_logs(task, options)
    }

    fn remove_unassigned(&self, assigned: &HashSet<String>) {
        let Some(inventory) = self.inventory.lock().take() else {
            return;
        };
        // Holders not adopted: their task is gone, or its container is (the task is then started afresh,
        // with a new holder of the same name, which the removal by ID does not touch).
        for (task_id, container) in self.holders.lock().take().unwrap_or_default() {
            let docker = self.docker.clone();
            let plane = self.network.clone().ok();
            let unassigned = !assigned.contains(&task_id);
            tokio::spawn(async move {
                tracing::info!(task = %task_id, %container, "removing a network-namespace holder left by an earlier \
                                                             run");
                if let Err(e) = force_remove(&docker, &container).await {
                    tracing::warn!(task = %task_id, %container, "cannot remove the holder: {}", engine_message(&e));
                }
                if let Some(plane) = plane {
                    plane.forget_survivor(&task_id);
                    if unassigned {
                        if let Err(e) = plane.release(&task_id).await {
                            tracing::warn!(task = %task_id, "{e}");
                        }
                    }
                }
            });
        }
        self.files_root.sweep(assigned);
        for (task_id, container) in inventory.into_iter().filter(|(t, _)| !assigned.contains(t)) {
            let docker = self.docker.clone();
            tokio::spawn(async move {
                tracing::info!(task = %task_id, %container, "removing the container of a task no longer assigned here");
                if let Err(e) = force_remove(&docker, &container).await {
                    tracing::warn!(task = %task_id, %container, "cannot remove the container: {}", engine_message(&e));
                }
            });
        }
    }
}

/// The registry credentials of a task (`PullOptions.RegistryAuth`: the client's `X-Registry-Auth`, base64url
/// JSON). Ones that do not decode are left out with a warning, and the pull goes without, as Docker's
/// executor does.
fn registry_credentials(task: &Task) -> Option<bollard::auth::DockerCredentials> {
    use base64::Engine as _;
    let auth = match task.spec.as_ref().and_then(|s| s.runtime.as_ref()) {
        Some(shoal_api::task_spec::Runtime::Container(c)) => &c.pull_options.as_ref()?.registry_auth,
        _ => return None,
    };
    if auth.is_empty() {
        return None;
    }
    let engines = [
        &base64::engine::general_purpose::URL_SAFE,
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        &base64::engine::general_purpose::STANDARD,
    ];
    let json = engines.iter().find_map(|e| e.decode(auth.trim()).ok());
    match json.map(|j| serde_json::from_slice::<bollard::auth::DockerCredentials>(&j)) {
        Some(Ok(creds)) => Some(creds),
        _ => {
            tracing::warn!(task = %task.id, "the service's registry credentials do not decode; pulling without them");
            None
        }
    }
}

/// The Engine API version that applies `HealthCheck.StartInterval` (an older engine ignores it silently).
const START_INTERVAL_API: (usize, usize) = (1, 44);

/// Refuses a healthcheck's `StartInterval` on an engine older than `START_INTERVAL_API`, naming both
/// versions: the container would be checked at its interval during the start period instead.
fn refuse_start_interval(task: &Task, engine_api: (usize, usize)) -> Result<(), String> {
    let health = match task.spec.as_ref().and_then(|s| s.runtime.as_ref()) {
        Some(shoal_api::task_spec::Runtime::Container(c)) => c.healthcheck.as_ref(),
        _ => None,
    };
    let set = health.and_then(|h| h.start_interval.as_ref()).is_some_and(|d| d.seconds != 0 || d.nanos != 0);
    if set && engine_api < START_INTERVAL_API {
        return Err(format!(
            "HealthCheck.StartInterval needs Docker Engine API {}.{} or later; this node's engine speaks API {}.{}: \
             leave it out (the interval then applies from the start), or run the task on a node with a newer engine",
            START_INTERVAL_API.0, START_INTERVAL_API.1, engine_api.0, engine_api.1
        ));
    }
    Ok(())
}

/// The name of a task's `i`-th file on the node (its target is where the container sees it).
fn docker_file_name(i: usize) -> String {
    format!("file-{i}")
}

/// Drives one task's container, found by its name.
struct DockerController {
    task_id: String,
    files_root: FilesRoot,
    /// The task's secrets and configs, written in `prepare` (empty for an adopted container).
    files: TaskFiles,
    docker: Docker,
    name: String,
    image: String,
    body: Arc<ContainerCreateBody>,
    grace: Duration,
    /// The credentials a missing image is pulled with (the service's `--with-registry-auth`).
    registry_auth: Option<bollard::auth::DockerCredentials>,
    pid: i32,
    /// Its ID and published ports, known once started.
    runtime: RuntimeReport,
    /// The container has a healthcheck (from the spec or the image), known after `start`.
    healthcheck: bool,
    /// For a task on networks: its holder and the data plane.
    network: Option<TaskNetwork>,
    /// For a task on a swarm network of the node's engine (macvlan, ipvlan): that network.
    engine_network: Option<engine_network::EngineNetwork>,
    engine_networks: engine_network::EngineNetworkUsers,
    /// This task counts among `engine_network`'s users (from its prepare to its removal).
    holds_engine_network: bool,
    creations: Creations,
}

/// What a task on networks needs besides its container (see the module doc).
#[derive(Clone)]
struct TaskNetwork {
    plane: Arc<NetworkPlane>,
    /// The holder's name.
    holder: String,
    holder_body: Arc<ContainerCreateBody>,
    holder_image: Arc<tokio::sync::OnceCell<()>>,
    /// The task as assigned (its attachments).
    task: Arc<Task>,
    creations: Creations,
}

impl TaskNetwork {
    /// Makes a fresh holder and has its namespace plumbed. A holder of the same name (an earlier prepare's,
    /// or left by an earlier run and being swept) is removed first: the task's container does not exist yet,
    /// so nothing is in that namespace, and what is swept is then never the holder made here.
    async fn prepare(&self, docker: &Docker) -> Result<(), ExecutorError> {
        let prep = ExecutorError::Prepare;
        self.holder_image.get_or_try_init(|| holder::ensure_image(docker)).await.map_err(prep)?;
        force_remove(docker, &self.holder).await.map_err(|e| {
            prep(format!("cannot replace the network-namespace holder {}: {}", self.holder, engine_message(&e)))
        })?;
        if let Err(e) = self.creations.create(docker, &self.holder, (*self.holder_body).clone()).await {
            return Err(prep(format!(
                "cannot create the network-namespace holder {}: {}",
                self.holder,
                engine_message(&e)
            )));
        }
        if let Err(e) = docker.start_container(&self.holder, None).await {
            return Err(prep(format!(
                "cannot start the network-namespace holder {}: {}",
                self.holder,
                engine_message(&e)
            )));
        }
        self.attach(docker, &self.holder).await.map_err(prep)
    }

    /// Names the namespace of the running holder `container` as the task's and registers it with the plane.
    async fn attach(&self, docker: &Docker, container: &str) -> Result<(), String> {
        let c = docker.inspect_container(container, None).await.map_err(|e| engine_message(&e))?;
        let pid = c.state.as_ref().and_then(|s| s.pid).filter(|p| *p > 0 && is_running(&c));
        let pid = pid.ok_or_else(|| format!("the network-namespace holder {container} is not running"))?;
        self.plane.attach_namespace(&self.task, host_pid(pid)?).await.map(|_| ())
    }

    /// Releases the task's namespace and removes its holder (once its container no longer runs).
    async fn teardown(&self, docker: &Docker) -> Result<(), ExecutorError> {
        let holder = force_remove(docker, &self.holder).await;
        holder.map_err(|e| runtime("cannot remove the network-namespace holder", &e))?;
        self.plane.release(&self.task.id).await.map_err(ExecutorError::Runtime)
    }
}

/// A pid the engine reported (an `i64`) as the host's: refused, not truncated, when out of range.
fn host_pid(pid: i64) -> Result<u32, String> {
    u32::try_from(pid).map_err(|_| format!("the engine reported pid {pid}, which is not a process id"))
}

/// An exit code the engine reported (an `i64`) as the executor's `i32`: an out-of-range one saturates
/// rather than wrapping into another code (a large positive one into 0, success).
fn exit_code(code: i64) -> i32 {
    i32::try_from(code).unwrap_or(if code < 0 { i32::MIN } else { i32::MAX })
}

fn runtime(what: &str, e: &BollardError) -> ExecutorError {
    ExecutorError::Runtime(format!("{what}: {}", engine_message(e)))
}

fn health_of(c: &ContainerInspectResponse) -> Option<HealthStatusEnum> {
    c.state.as_ref()?.health.as_ref()?.status
}

fn is_running(c: &ContainerInspectResponse) -> bool {
    c.state.as_ref().and_then(|s| s.running).unwrap_or(false)
}

fn has_healthcheck(c: &ContainerInspectResponse) -> bool {
    let test = c.config.as_ref().and_then(|c| c.healthcheck.as_ref()).and_then(|h| h.test.clone()).unwrap_or_default();
    !test.is_empty() && test[0] != "NONE"
}

/// The container's ID and its host-mode ports as bound: the engine's bindings off networks (a host port it
/// chose included, each once however many addresses it bound), the spec's on them (the data plane forwards
/// those numbers into the holder's namespace).
fn runtime_report(c: &ContainerInspectResponse, network: Option<&TaskNetwork>) -> RuntimeReport {
    use shoal_api::port_config::{Protocol, PublishMode};
    let ports = match network {
        Some(net) => crate::exec::host_mode_ports(&net.task),
        None => {
            let bound = c.network_settings.as_ref().and_then(|n| n.ports.as_ref());
            let mut ports = Vec::new();
            for (key, bindings) in bound.into_iter().flatten() {
                let (port, proto) = key.split_once('/').unwrap_or((key.as_str(), "tcp"));
                let Ok(target_port) = port.parse::<u32>() else { continue };
                let protocol = match proto {
                    "udp" => Protocol::Udp,
                    "sctp" => Protocol::Sctp,
                    _ => Protocol::Tcp,
                };
                for b in bindings.iter().flatten() {
                    let Some(published_port) = b.host_port.as_deref().and_then(|p| p.parse::<u32>().ok()) else {
                        continue;
                    };
                    let p = shoal_api::PortConfig {
                        protocol: protocol as i32,
                        target_port,
                        published_port,
                        publish_mode: PublishMode::Host as i32,
                        ..Default::default()
                    };
                    if !ports.contains(&p) {
                        ports.push(p);
                    }
                }
            }
            ports.sort_by_key(|p| (p.target_port, p.protocol, p.published_port));
            ports
        }
    };
    RuntimeReport { container_id: c.id.clone().unwrap_or_default(), ports }
}

fn last_health_output(c: &ContainerInspectResponse) -> String {
    let log = c.state.as_ref().and_then(|s| s.health.as_ref()).and_then(|h| h.log.as_ref());
    let Some(last) = log.and_then(|l| l.last()) else { return "no check result yet".into() };
    let output = last.output.as_deref().unwrap_or_default().trim();
    let code = last.exit_code.unwrap_or(-1);
    if output.is_empty() {
        format!("the health check exited with {code}")
    } else {
        format!("the health check exited with {code}: {output}")
    }
}

impl DockerController {
    async fn inspect(&self) -> Result<Option<ContainerInspectResponse>, BollardError> {
        match self.docker.inspect_container(&self.name, None).await {
            Ok(c) => Ok(Some(c)),
            Err(e) if engine_status(&e) == Some(404) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn ensure_image(&self) -> Result<(), ExecutorError> {
        match self.docker.inspect_image(&self.image).await {
            Ok(_) => return Ok(()),
            Err(e) if engine_status(&e) == Some(404) => {}
            Err(e) => {
                return Err(ExecutorError::Prepare(format!(
                    "cannot inspect image {}: {}",
                    self.image,
                    engine_message(&e)
                )))
            }
        }
        tracing::info!(image = %self.image, "image not on this node: pulling it");
        let opts = CreateImageOptionsBuilder::default().from_image(&self.image).build();
        let pull = async {
            let mut progress = self.docker.create_image(Some(opts), None, self.registry_auth.clone());
            while let Some(item) = progress.next().await {
                item.map_err(|e| engine_message(&e))?;
            }
            Ok::<(), String>(())
        };
        let reason = match tokio::time::timeout(PULL_TIMEOUT, pull).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(reason)) => reason,
            Err(_) => format!("no progress within {PULL_TIMEOUT:?}"),
        };
        Err(ExecutorError::Prepare(format!(
            "image {} is not on this node and pulling it failed: {reason}; load or build the image on the node",
            self.image
        )))
    }

    /// Kills the container, ignoring "not running" and "no such container".
    async fn kill(&self) -> Result<(), ExecutorError> {
        let opts = KillContainerOptionsBuilder::default().signal("SIGKILL").build();
        match self.docker.kill_container(&self.name, Some(opts)).await {
            Ok(()) => Ok(()),
            Err(e) if matches!(engine_status(&e), Some(404 | 409)) => Ok(()),
            Err(e) => Err(runtime("cannot kill the container", &e)),
        }
    }

    /// Resolves when the container turns unhealthy (never when it has no healthcheck).
    async fn unhealthy(&self) -> String {
        if !self.healthcheck {
            return std::future::pending().await;
        }
        loop {
            tokio::time::sleep(HEALTH_POLL).await;
            if let Ok(Some(c)) = self.inspect().await {
                if health_of(&c) == Some(HealthStatusEnum::UNHEALTHY) {
                    return last_health_output(&c);
                }
            }
        }
    }
}

impl Controller for DockerController {
    fn prepare(&mut self) -> BoxFuture<'_, Result<(), ExecutorError>> {
        Box::pin(async move {
            // First, so another task's removal never takes the network between this container's creation and its
            // start (an adopted container's network counts too).
            if let (Some(net), false) = (&self.engine_network, self.holds_engine_network) {
                self.engine_networks.hold(net, &self.docker).await.map_err(ExecutorError::Prepare)?;
                self.holds_engine_network = true;
            }
            if self.inspect().await.map_err(|e| ExecutorError::Prepare(engine_message(&e)))?.is_some() {
                return Ok(());
            }
            self.ensure_image().await?;
            if !self.files.is_empty() {
                self.files_root
                    .write(&self.task_id, &self.files, |i, _| Ok(docker_file_name(i).into()))
                    .map_err(ExecutorError::Prepare)?;
            }
            if let Some(net) = &self.network {
                net.prepare(&self.docker).await?;
            }
            match self.creations.create(&self.docker, &self.name, (*self.body).clone()).await {
                Ok(()) => Ok(()),
                // Created meanwhile (a retried prepare): the same container.
                Err(e) if engine_status(&e) == Some(409) => Ok(()),
                Err(e) => Err(ExecutorError::Prepare(format!(
                    "cannot create container {}: {}",
                    self.name,
                    engine_message(&e)
                ))),
            }
        })
    }

    fn start(&mut self) -> BoxFuture<'_, Result<i32, ExecutorError>> {
        Box::pin(async move {
            let start_err = |e: BollardError| ExecutorError::Start(engine_message(&e));
            let c = self.inspect().await.map_err(start_err)?.ok_or(ExecutorError::NotReady("created"))?;
            if !is_running(&c) {
                if let Some(net) = &self.network {
                    // No instruction of the app runs before its namespace is connected.
                    net.plane.wait_plumbed(&self.task_id).await.map_err(ExecutorError::Start)?;
                }
                match self.docker.start_container(&self.name, None).await {
                    Ok(()) => {}
                    Err(e) if engine_status(&e) == Some(304) => {}
                    Err(e) => return Err(start_err(e)),
                }
            }
            self.healthcheck = has_healthcheck(&c);
            // Running only once healthy: poll until the check passes, fails, or the container exits.
            loop {
                let c = self
                    .inspect()
                    .await
                    .map_err(start_err)?
                    .ok_or(ExecutorError::Start("the container was removed".into()))?;
                self.pid = c.state.as_ref().and_then(|s| s.pid).and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
                self.runtime = runtime_report(&c, self.network.as_ref());
                if !self.healthcheck || !is_running(&c) {
                    return Ok(self.pid);
                }
                match health_of(&c) {
                    Some(HealthStatusEnum::HEALTHY) => return Ok(self.pid),
                    Some(HealthStatusEnum::UNHEALTHY) => {
                        self.kill().await?;
                        return Err(ExecutorError::Start(format!("container unhealthy: {}", last_health_output(&c))));
                    }
                    _ => tokio::time::sleep(HEALTH_POLL).await,
                }
            }
        })
    }

    fn wait(&mut self) -> BoxFuture<'_, Result<ExitStatus, ExecutorError>> {
        Box::pin(async move {
            if self.pid == 0 {
                // Adopted after an agent restart: learn the container's pid and healthcheck.
                if let Ok(Some(c)) = self.inspect().await {
                    self.pid = c.state.as_ref().and_then(|s| s.pid).and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
                    self.healthcheck = has_healthcheck(&c);
                    self.runtime = runtime_report(&c, self.network.as_ref());
                }
            }
            let opts = WaitContainerOptionsBuilder::default().condition("not-running").build();
            let docker = self.docker.clone();
            let mut exits = docker.wait_container(&self.name, Some(opts));
            let pid = self.pid;
            let exit = tokio::select! {
                item = exits.next() => match item {
                    Some(Ok(r)) => Ok(ExitStatus { code: exit_code(r.status_code), pid }),
                    Some(Err(BollardError::DockerContainerWaitError { code,
                        .. })) => Ok(ExitStatus { code: exit_code(code), pid }),
                    Some(Err(e)) => Err(runtime("waiting for the container failed", &e)),
                    None => Err(ExecutorError::Runtime("the engine ended the container wait without an exit \
                                                        code".into())),
                },
                output = self.unhealthy() => {
                    self.kill().await?;
                    Err(ExecutorError::Runtime(format!("container unhealthy: {output}")))
                }
            };
            // A task's container never starts again: its namespace and holder go now (not with the task's
            // removal, which may come much later).
            if let (Some(net), Ok(_)) = (&self.network, &exit) {
                if let Err(e) = net.teardown(&self.docker).await {
                    tracing::warn!(task = %self.task_id, "{e}");
                }
            }
            exit
        })
    }

    fn shutdown(&mut self) -> BoxFuture<'_, Result<(), ExecutorError>> {
        Box::pin(async move {
            if let Some(net) = self.network.as_ref().filter(|n| !n.plane.is_stopping()) {
                // As the process executor: out of this node's VIPs first, then time for the other nodes.
                let running = self.inspect().await.ok().flatten().is_some_and(|c| is_running(&c));
                if running {
                    let addrs: Vec<std::net::Ipv4Addr> = crate::network::desired::attachments(&net.task)
                        .map(|a| a.into_iter().map(|(_, a)| a.address).collect())
                        .unwrap_or_default();
                    let drain = async {
                        net.plane.wait_out_of_vips(&addrs).await;
                        tokio::time::sleep(crate::process::NETWORK_DRAIN).await;
                    };
                    // The agent's stop ends a drain under way (the stop waits for removals, bounded).
                    tokio::select! {
                        _ = drain => {}
                        _ = net.plane.stopped() => {}
                    }
                }
            }
            let opts = StopContainerOptionsBuilder::default()
                .t(i32::try_from(self.grace.as_secs()).unwrap_or(i32::MAX))
                .build();
            match self.docker.stop_container(&self.name, Some(opts)).await {
                Ok(()) => Ok(()),
                Err(e) if matches!(engine_status(&e), Some(304 | 404)) => Ok(()),
                Err(e) => Err(runtime("cannot stop the container", &e)),
            }
        })
    }

    fn terminate(&mut self) -> BoxFuture<'_, Result<(), ExecutorError>> {
        Box::pin(self.kill())
    }

    fn remove(&mut self) -> BoxFuture<'_, Result<(), ExecutorError>> {
        Box::pin(async move {
            force_remove(&self.docker, &self.name).await.map_err(|e| runtime("cannot remove the container", &e))?;
            if let Some(net) = &self.network {
                net.teardown(&self.docker).await?;
            }
            if let Some(net) = &self.engine_network {
                self.engine_networks.let_go(net, &self.docker, std::mem::take(&mut self.holds_engine_network)).await;
            }
            self.files_root.remove(&self.task_id).map_err(ExecutorError::Runtime)
        })
    }

    fn report(&self) -> RuntimeReport {
        self.runtime.clone()
    }
}

/// Parses the RFC 3339 UTC timestamp (`2006-01-02T15:04:05.999999999Z`) the engine puts before each log
/// line when asked for timestamps.
fn parse_engine_timestamp(s: &str) -> Option<std::time::SystemTime> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.splitn(3, ':').map(|p| p.parse::<i64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    let nanos: u32 = if frac.is_empty() { 0 } else { format!("{frac:0<9}").get(..9)?.parse().ok()? };
    // Days from 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hh * 3600 + mm * 60 + ss;
    let secs = u64::try_from(secs).ok()?;
    Some(std::time::UNIX_EPOCH + Duration::new(secs, nanos))
}

/// Turns one engine log frame (`<timestamp> <line>\n`) into a log line.
fn engine_log_line(frame: &[u8], stderr: bool) -> Option<crate::exec::LogLine> {
    let sp = frame.iter().position(|b| *b == b' ')?;
    let ts = parse_engine_timestamp(std::str::from_utf8(&frame[..sp]).ok()?)?;
    let mut data = frame[sp + 1..].to_vec();
    if data.last() == Some(&b'\n') {
        data.pop();
    }
    Some(crate::exec::LogLine { timestamp: ts, stderr, data })
}

impl DockerExecutor {
    /// The container logs of `task` through the engine.
    fn container_logs(
        &self,
        task: &Task,
        opts: &crate::exec::LogOptions,
    ) -> Result<crate::exec::LogStream, ExecutorError> {
        use bollard::container::LogOutput;
        let both = !opts.stdout && !opts.stderr;
        let since = opts.since;
        let since_secs = since
            .and_then(|s| s.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| i32::try_from(d.as_secs()).unwrap_or(i32::MAX));
        let query = bollard::query_parameters::LogsOptionsBuilder::default()
            .follow(opts.follow)
            .stdout(both || opts.stdout)
            .stderr(both || opts.stderr)
            .timestamps(true)
            .since(since_secs)
            .tail(&opts.tail.map_or_else(|| "all".to_string(), |n| n.to_string()))
            .build();
        let name = spec::task_name(task);
        let frames = self.docker.logs(&name, Some(query));
        let lines = frames.filter_map(move |item| {
            let out = match item {
                Ok(LogOutput::StdOut { message }) | Ok(LogOutput::Console { message }) => {
                    engine_log_line(&message, false).map(Ok)
                }
                Ok(LogOutput::StdErr { message }) => engine_log_line(&message, true).map(Ok),
                Ok(LogOutput::StdIn { .. }) => None,
                Err(e) => Some(Err(runtime("reading the container's logs failed", &e))),
            };
            let out = out.filter(|l| match (l, since) {
                (Ok(l), Some(s)) => l.timestamp > s,
                _ => true,
            });
            std::future::ready(out)
        });
        Ok(Box::pin(lines))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_timestamps_parse_to_unix_time() {
        let t = parse_engine_timestamp("2024-02-29T12:34:56.123456789Z").unwrap();
        let d = t.duration_since(std::time::UNIX_EPOCH).unwrap();
        assert_eq!((d.as_secs(), d.subsec_nanos()), (1_709_210_096, 123_456_789));
        let short = parse_engine_timestamp("1970-01-01T00:00:01.5Z").unwrap();
        assert_eq!(short.duration_since(std::time::UNIX_EPOCH).unwrap(), Duration::from_millis(1500));
        assert!(parse_engine_timestamp("yesterday").is_none());
        let l = engine_log_line(b"2024-02-29T12:34:56Z hello world\n", true).unwrap();
        assert_eq!((l.data.as_slice(), l.stderr), (&b"hello world"[..], true));
    }
}
