//! Containers of the engine's own on attachable swarm networks (`docker run --network <attachable overlay>`
//! and `docker network connect` on the node's control socket), as dockerd gives them: the container gets an address
//! through SwarmKit's attachment path and the node's data plane plumbs it like a task.
//!
//! The path, in order:
//! 1. `Attacher::prepare_holder` makes a network-namespace holder (`holder`, the same `/pause` image and
//!    network mode `none`, with the container's hostname, the node's resolver and its extra hosts), named
//!    `shl-attach.<random>`, labelled `LABEL_ATTACH_HOLDS` and with the node's ID; the caller creates the
//!    container with network mode `container:<holder>` and the labels `container_labels` gives (the holder,
//!    the network, the aliases: what a restart of the node needs to find it all again).
//! 2. `Attacher::attach` calls `ResourceAllocator.AttachNetwork` on the session's connection (the agent's
//!    gRPC channel to its manager; a manager node's agent goes the same way): the manager writes a network
//!    attachment task for this node, the allocator gives it an address, and the dispatcher sends it here.
//!    A network that is not attachable is refused there, by the manager.
//! 3. The worker runs that task with an `AttachmentController` (the executor makes it): its prepare starts the
//!    holder and registers the holder's namespace with the data plane under the task's ID
//!    (`NetworkPlane::attach_namespace`), its start waits until the plane plumbed it (the veth, the address,
//!    the resolver at 127.0.0.11 with the network's service names and VIPs). The task then runs until it is
//!    removed; removing it releases the namespace's plumbing.
//! 4. `Attacher::before_start` (the control socket calls it before relaying a container's start) attaches a
//!    container of ours again when it holds no attachment (it stopped since), and waits until its namespace is
//!    plumbed, so the container's first instruction is connected.
//! 5. `Attacher::run` follows the engine's `die`, `stop` and `destroy` events of such containers and asks the
//!    engine what became of the container (`fate`): one that stopped for good is detached
//!    (`ResourceAllocator.DetachNetwork`: the task goes and its address returns to the pool), a removed one
//!    also loses its holder; one the engine restarts (its restart policy: the engine marks it restarting
//!    before its `die`) or that a `docker restart` through the control socket restarts
//!    (`restart_begins`/`restart_ended`) keeps its attachment, and comes back in the same plumbed namespace.
//!    The same loop reconciles whenever the node's assignments or its session change, which covers what
//!    happened while the daemon was down: attachments of this node whose container is gone or stopped for
//!    good are detached, and holders whose container is gone are removed.
//!
//! 6. `Attacher::connect` (`docker network connect <swarm network> <container>`) attaches a running container
//!    that has a namespace of its own (not `host`, `none` or `container:`) the same way, and its
//!    `AttachmentController` registers the container's own namespace (from its PID) as a joined one
//!    (`NetworkPlane::join_namespace`: a new `eth<N>`, the container's interfaces and routes untouched) and
//!    points its resolv.conf at the swarm's resolver (`joined_resolv_conf`, as dockerd rebuilds it; put
//!    back when the attachment goes). A restart (the engine's policy, or `docker restart` through the
//!    socket) keeps the attachment (`fate`) and its `start` event moves it into the new namespace
//!    (`rejoin`). `Attacher::disconnect` detaches it and waits until its interface is gone; stop and
//!    removal detach it as for a container created on the network.
//!
//! Bounds: `ATTACH_TIMEOUT` for the manager's answer, `PLUMB_TIMEOUT` (the plane's) for the plumbing; the
//! manager bounds the attachments per node. Must not depend on the Engine API's HTTP types (the node crate
//! wires this to the control socket).

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bollard::models::{ContainerCreateBody, HostConfig, RestartPolicy, RestartPolicyNameEnum};
use bollard::query_parameters::{CreateContainerOptionsBuilder, EventsOptionsBuilder, ListContainersOptionsBuilder};
use bollard::Docker;
use futures::StreamExt;
use parking_lot::Mutex;
use shoal_api::resource_allocator_client::ResourceAllocatorClient;
use shoal_api::{task_spec, AttachNetworkRequest, DetachNetworkRequest, NetworkAttachmentConfig, Task, TaskState};
use tokio::sync::watch;
use tonic::transport::Channel;

use super::{engine_message, engine_status, force_remove, holder, is_running, spec};
use crate::assigned::AssignedTasks;
use crate::exec::{BoxFuture, Controller, ExecutorError, ExitStatus};
use crate::network::NetworkPlane;

/// Label on a container of ours: its holder's container ID.
pub(crate) const LABEL_ATTACH_HOLDER: &str = "com.shoal.attach.holder";
/// Label on a container of ours: the swarm network it was created on (as the user named it).
pub(crate) const LABEL_ATTACH_NETWORK: &str = "com.shoal.attach.network";
/// Label on a container of ours: its aliases on that network, comma-separated.
pub(crate) const LABEL_ATTACH_ALIASES: &str = "com.shoal.attach.aliases";
/// Label on a holder of such a container.
pub(crate) const LABEL_ATTACH_HOLDS: &str = "com.shoal.attach.holds";
/// Prefix of the holders' names.
pub(crate) const HOLDER_PREFIX: &str = "shl-attach.";
/// Longest the manager may take to answer an attach or detach.
pub(crate) const ATTACH_TIMEOUT: Duration = Duration::from_secs(15);
/// Pause before the engine's event stream is opened again after it ended.
const EVENTS_RETRY: Duration = Duration::from_secs(1);

/// Why a container could not be put on a swarm network.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttachError {
    /// The swarm has no such network.
    #[error("{0}")]
    NotFound(String),
    /// The network exists but is not attachable (or the node may not attach).
    #[error("{0}")]
    Refused(String),
    /// The request cannot be honoured as given.
    #[error("{0}")]
    Invalid(String),
    /// The container is not in a state that allows it (a stopped container connected).
    #[error("{0}")]
    Conflict(String),
    /// No manager answered, or the plumbing did not finish in time.
    #[error("{0}")]
    Unavailable(String),
    /// The Docker Engine failed.
    #[error("{0}")]
    Engine(String),
}

/// What the holder of a container carries for it (Docker lets only a namespace's first container set these).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HolderFacts {
    /// The container's hostname (the engine's default when `None`).
    pub hostname: Option<String>,
    /// `--dns-search`.
    pub dns_search: Vec<String>,
    /// `--dns-option` (`ndots:0` is always set, as a task's).
    pub dns_options: Vec<String>,
    /// `--add-host`, as `host:ip`.
    pub extra_hosts: Vec<String>,
}

/// The labels a container created in `holder`'s namespace on `network` with `aliases` carries.
pub fn container_labels(holder: &str, network: &str, aliases: &[String]) -> HashMap<String, String> {
    let mut l = HashMap::from([
        (LABEL_ATTACH_HOLDER.to_string(), holder.to_string()),
        (LABEL_ATTACH_NETWORK.to_string(), network.to_string()),
    ]);
    if !aliases.is_empty() {
        l.insert(LABEL_ATTACH_ALIASES.to_string(), aliases.join(","));
    }
    l
}

/// The container an attachment task is for, when it is one.
pub(crate) fn attachment_container(t: &Task) -> Option<&str> {
    match t.spec.as_ref()?.runtime.as_ref()? {
        task_spec::Runtime::Attachment(a) if t.service_id.is_empty() => Some(a.container_id.as_str()),
        _ => None,
    }
}

fn holds(t: &Task) -> bool {
    let s = TaskState::from_wire(t.status.as_ref().map_or(0, |s| s.state));
    !s.is_terminal() && t.desired_state <= TaskState::Running as i32
}

/// What becomes of a container's attachments when something happened to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// They stay: the container runs on, is being restarted by the engine's restart policy (the engine
    /// marks it restarting before it sends the `die` event, moby's daemon/monitor.go), or by a restart
    /// through the control socket; or it is not started yet (created) or is being removed (a `destroy`
    /// follows).
    Keep,
    /// They are detached (their addresses go back to the pool): the container stopped for good.
    Detach,
    /// They are detached and the container's holder goes: the container is gone.
    Gone,
}

/// The fate of a container's attachments, from the container's status as the engine shows it now (`None`:
/// the engine has no such container) and whether a restart of it through the control socket is under way.
pub(crate) fn fate(status: Option<&str>, restarting_through_socket: bool) -> Fate {
    match status {
        None => Fate::Gone,
        Some(_) if restarting_through_socket => Fate::Keep,
        Some("exited" | "dead") => Fate::Detach,
        Some(_) => Fate::Keep,
    }
}

/// Why a container with network mode `mode` cannot be connected to a swarm network, in dockerd's words
/// (`None`: it can). A container sharing another's namespace (or the host's) has none of its own to join,
/// one with `none` networking stays without any.
pub(crate) fn mode_refusal(mode: &str) -> Option<&'static str> {
    if mode == "host" || mode.starts_with("container:") {
        Some(
            "container sharing network namespace with another container or host cannot be connected to any other \
              network",
        )
    } else if mode == "none" {
        Some("container cannot be connected to multiple networks with one of the networks in private (none) mode")
    } else {
        None
    }
}

/// The resolv.conf a connected container gets, from its current one (`None`: leave it): as dockerd rebuilds
/// it when the container joins a network with the embedded resolver (libnetwork's `rebuildDNS`), the
/// resolver at 127.0.0.11 is its only nameserver, its search domains and options stay, `ndots:0` is added
/// when it sets none. One already pointing at 127.0.0.11 alone (the engine's own embedded resolver, on a
/// user-defined network: it intercepts that address in the namespace) is left as it is.
pub(crate) fn joined_resolv_conf(current: &str) -> Option<String> {
    let servers: Vec<&str> =
        current.lines().filter_map(|l| l.trim().strip_prefix("nameserver")).map(str::trim).collect();
    if !servers.is_empty() && servers.iter().all(|s| *s == holder::RESOLVER) {
        return None;
    }
    let mut out = format!("nameserver {}\n", holder::RESOLVER);
    let mut ndots = false;
    for l in current.lines().map(str::trim) {
        if l.starts_with("search ") || l.starts_with("domain ") {
            out.push_str(l);
            out.push('\n');
        } else if let Some(opts) = l.strip_prefix("options ") {
            ndots |= opts.split_whitespace().any(|o| o.starts_with("ndots:"));
            out.push_str(l);
            out.push('\n');
        }
    }
    if !ndots {
        out.push_str("options ndots:0\n");
    }
    Some(out)
}

/// Rewrites the resolv.conf at `path` (the engine's file of a container, bind-mounted into it) as
/// `joined_resolv_conf` says, in place (the mount follows the file, not its name); returns what it held
/// when it was rewritten (to put back when the container leaves the network).
fn point_at_resolver(path: &Path) -> Result<Option<String>, String> {
    let current = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    match joined_resolv_conf(&current) {
        Some(new) => {
            std::fs::write(path, new).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            Ok(Some(current))
        }
        None => Ok(None),
    }
}

/// The node's side of containers on attachable swarm networks (see the module doc).
pub struct Attacher {
    docker: Docker,
    /// Weak: the plane (and its lock on the namespace's data plane) goes with the agent and executor that
    /// own it, even while a control-socket router still holds this attacher (an open keep-alive connection,
    /// after a `docker swarm leave`, which removes the data plane through a new `NetworkPlane`).
    plane: std::sync::Weak<NetworkPlane>,
    node_id: String,
    holder_image: Arc<tokio::sync::OnceCell<()>>,
    /// The current session's connection to a manager (None between sessions).
    channel: watch::Sender<Option<Channel>>,
    /// The tasks assigned to this node (its attachment tasks among them).
    assigned: watch::Sender<AssignedTasks>,
    /// Holders made whose container is being created (not swept meanwhile).
    creating: Mutex<BTreeSet<String>>,
    /// The attachment made for each container by this run, until detached (the task reaches the node's
    /// assignments a little later; a start in between must not attach it twice).
    made: Mutex<HashMap<String, String>>,
    /// Containers connected to a swarm network by this run (`connect`), by ID: the network as the user
    /// named it and the attachment (until detached; after a restart of the daemon the assigned tasks say it).
    joined: Mutex<HashMap<String, (String, String)>>,
    /// Containers being restarted through the control socket (`docker restart`), by ID, with how many such
    /// restarts are under way: the stop such a restart makes keeps their attachments.
    restarts: Mutex<HashMap<String, usize>>,
}

impl std::fmt::Debug for Attacher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attacher").field("node_id", &self.node_id).finish()
    }
}

fn status_error(network: &str, s: tonic::Status) -> AttachError {
    let why = format!("Could not attach to network {network}: {}", s.message());
    match s.code() {
        tonic::Code::NotFound => AttachError::NotFound(why),
        tonic::Code::PermissionDenied => AttachError::Refused(why),
        tonic::Code::InvalidArgument | tonic::Code::ResourceExhausted => AttachError::Invalid(why),
        _ => AttachError::Unavailable(why),
    }
}

impl Attacher {
    /// The node's data plane, while its agent runs.
    fn plane(&self) -> Result<Arc<NetworkPlane>, String> {
        self.plane
            .upgrade()
            .ok_or_else(|| "the node's data plane has stopped (the node is stopping or left the swarm)".into())
    }

    /// The attacher of the node `node_id`, over its engine and data plane.
    pub fn new(
        docker: Docker,
        plane: Arc<NetworkPlane>,
        node_id: &str,
        holder_image: Arc<tokio::sync::OnceCell<()>>,
    ) -> Arc<Attacher> {
        Arc::new(Attacher {
            docker,
            plane: Arc::downgrade(&plane),
            node_id: node_id.to_string(),
            holder_image,
            channel: watch::channel(None).0,
            assigned: watch::channel(AssignedTasks::default()).0,
            creating: Mutex::new(BTreeSet::new()),
            made: Mutex::new(HashMap::new()),
            restarts: Mutex::new(HashMap::new()),
            joined: Mutex::new(HashMap::new()),
        })
    }

    /// The connection of the session just opened (the agent calls this).
    pub fn set_channel(&self, channel: Option<Channel>) {
        self.channel.send_replace(channel);
    }

    /// The tasks assigned to this node now (the agent calls this).
    pub fn set_assigned(&self, assigned: AssignedTasks) {
        self.assigned.send_replace(assigned);
    }

    fn client(&self) -> Result<ResourceAllocatorClient<Channel>, AttachError> {
        let ch = self.channel.borrow().clone().ok_or_else(|| {
            AttachError::Unavailable(
                "this node has no session with a manager right now (it is connecting): retry shortly".into(),
            )
        })?;
        Ok(ResourceAllocatorClient::new(ch))
    }

    /// Makes (not starts) the holder of a container to be created on a swarm network; returns its ID.
    pub async fn prepare_holder(&self, facts: &HolderFacts) -> Result<String, AttachError> {
        holder::supported().map_err(AttachError::Invalid)?;
        self.holder_image.get_or_try_init(|| holder::ensure_image(&self.docker)).await.map_err(AttachError::Engine)?;
        let name = format!("{HOLDER_PREFIX}{:016x}", rand::random::<u64>());
        let mut options = vec!["ndots:0".to_string()];
        options.extend(facts.dns_options.iter().filter(|o| !o.starts_with("ndots:")).cloned());
        let body = ContainerCreateBody {
            image: Some(holder::HOLDER_IMAGE.to_string()),
            cmd: Some(vec!["/pause".to_string()]),
            hostname: facts.hostname.clone().filter(|h| !h.is_empty()),
            labels: Some(HashMap::from([
                (spec::LABEL_NODE_ID.to_string(), self.node_id.clone()),
                (LABEL_ATTACH_HOLDS.to_string(), "1".to_string()),
            ])),
            host_config: Some(HostConfig {
                network_mode: Some("none".into()),
                dns: Some(vec![holder::RESOLVER.to_string()]),
                dns_search: (!facts.dns_search.is_empty()).then(|| facts.dns_search.clone()),
                dns_options: Some(options),
                extra_hosts: (!facts.extra_hosts.is_empty()).then(|| facts.extra_hosts.clone()),
                restart_policy: Some(RestartPolicy {
                    name: Some(RestartPolicyNameEnum::NO),
                    maximum_retry_count: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        self.creating.lock().insert(name.clone());
        let opts = CreateContainerOptionsBuilder::default().name(&name).build();
        match self.docker.create_container(Some(opts), body).await {
            Ok(r) => {
                let mut c = self.creating.lock();
                c.remove(&name);
                c.insert(r.id.clone());
                Ok(r.id)
            }
            Err(e) => {
                self.creating.lock().remove(&name);
                Err(AttachError::Engine(format!("cannot create the network-namespace holder: {}", engine_message(&e))))
            }
        }
    }

    /// Removes holder `holder`, whose container was not created.
    pub async fn abandon(&self, holder: &str) {
        if let Err(e) = force_remove(&self.docker, holder).await {
            tracing::warn!(%holder, "cannot remove an unused network-namespace holder: {}", engine_message(&e));
        }
        self.creating.lock().remove(holder);
    }

    /// Attaches `container` (created with `container_labels`) to its network; returns the attachment's ID.
    pub async fn attach(&self, container: &str) -> Result<String, AttachError> {
        let c = self.docker.inspect_container(container, None).await.map_err(|e| match engine_status(&e) {
            Some(404) => AttachError::NotFound(format!("No such container: {container}")),
            _ => AttachError::Engine(engine_message(&e)),
        })?;
        let labels = c.config.as_ref().and_then(|c| c.labels.clone()).unwrap_or_default();
        if let Some(h) = labels.get(LABEL_ATTACH_HOLDER) {
            self.creating.lock().remove(h);
        }
        let network = labels.get(LABEL_ATTACH_NETWORK).cloned().ok_or_else(|| {
            AttachError::Invalid(format!("container {container} was not created on a swarm network through Shoal"))
        })?;
        let aliases: Vec<String> = labels
            .get(LABEL_ATTACH_ALIASES)
            .map(|a| a.split(',').filter(|s| !s.is_empty()).map(str::to_string).collect())
            .unwrap_or_default();
        let id = c.id.clone().unwrap_or_else(|| container.to_string());
        self.request_attachment(&id, &network, aliases).await
    }

    /// Asks the manager for an attachment of container `id` (its full ID) to `network`, with `aliases`.
    async fn request_attachment(&self, id: &str, network: &str, aliases: Vec<String>) -> Result<String, AttachError> {
        let mut client = self.client()?;
        let req = crate::rpc::req(
            &self.node_id,
            AttachNetworkRequest {
                config: Some(NetworkAttachmentConfig { target: network.to_string(), aliases, ..Default::default() }),
                container_id: id.to_string(),
            },
            Some(ATTACH_TIMEOUT),
        );
        let r = client.attach_network(req).await.map_err(|s| status_error(network, s))?;
        let attachment = r.into_inner().attachment_id;
        self.made.lock().insert(id.to_string(), attachment.clone());
        tracing::info!(container = %id, %network, %attachment, "container attached to a swarm network");
        Ok(attachment)
    }

    /// The swarm network container `id` is connected to (`connect`), if it is: as the user named it at the
    /// connect, or (after a restart of the daemon) the assigned attachment task's network, by ID and name.
    fn connected_to(&self, id: &str) -> Option<Vec<String>> {
        if let Some((network, _)) = self.joined.lock().get(id) {
            return Some(vec![network.clone()]);
        }
        let a = self.assigned.borrow();
        let t = a.values().find(|t| attachment_container(t) == Some(id) && holds(t))?;
        let n = t.networks.first().and_then(|n| n.network.as_ref());
        let name = n.and_then(|n| n.spec.as_ref()?.annotations.as_ref()).map(|a| a.name.clone());
        Some(n.map(|n| n.id.clone()).into_iter().chain(name).collect())
    }

    /// Connects running container `container` to swarm network `network` (`docker network connect`), as
    /// dockerd does: an attachment from the manager (refused there when the network is not attachable), its
    /// interface and address plumbed into the container's own namespace (a new `eth<N>`; the container's
    /// interfaces and routes stay) with the network's resolver at 127.0.0.11 (`joined_resolv_conf`).
    /// Returns once it is plumbed, with the attachment's ID.
    pub async fn connect(&self, container: &str, network: &str, aliases: &[String]) -> Result<String, AttachError> {
        let c = self.docker.inspect_container(container, None).await.map_err(|e| match engine_status(&e) {
            Some(404) => AttachError::NotFound(format!("No such container: {container}")),
            _ => AttachError::Engine(engine_message(&e)),
        })?;
        let id = c.id.clone().unwrap_or_else(|| container.to_string());
        let name = c.name.as_deref().unwrap_or(container).trim_start_matches('/').to_string();
        let labels = c.config.as_ref().and_then(|c| c.labels.clone()).unwrap_or_default();
        let on = labels.get(LABEL_ATTACH_NETWORK).map(|n| vec![n.clone()]).or_else(|| self.connected_to(&id));
        if let Some(on) = on {
            return Err(if on.iter().any(|n| n == network) {
                AttachError::Refused(format!("endpoint with name {name} already exists in network {network}"))
            } else {
                AttachError::Invalid(format!(
                    "container {name} is on swarm network {} already, and a container joins one swarm network on this \
                     node: disconnect it first (docker network disconnect {} {name})",
                    on.last().map_or("", String::as_str),
                    on.last().map_or("", String::as_str),
                ))
            });
        }
        let mode = c.host_config.as_ref().and_then(|h| h.network_mode.clone()).unwrap_or_default();
        if let Some(why) = mode_refusal(&mode) {
            return Err(AttachError::Invalid(why.to_string()));
        }
        let status = c.state.as_ref().and_then(|s| s.status).map(|s| s.to_string()).unwrap_or_default();
        if !matches!(status.as_str(), "running" | "paused") {
            return Err(AttachError::Conflict(format!(
                "container {name} is {status}: Shoal connects a running container to swarm network {network} (its \
                 network namespace exists only while it runs); start it, then connect it"
            )));
        }
        let attachment = self.request_attachment(&id, network, aliases.to_vec()).await?;
        self.joined.lock().insert(id.clone(), (network.to_string(), attachment.clone()));
        let plumbed = match self.plane() {
            Ok(plane) => plane.wait_plumbed(&attachment).await,
            Err(e) => Err(e),
        };
        if let Err(e) = plumbed {
            // Not left holding an address it cannot use.
            let _ = self.detach(&attachment).await;
            return Err(AttachError::Unavailable(format!("container {name} was not connected to {network}: {e}")));
        }
        Ok(attachment)
    }

    /// Disconnects container `container` from swarm network `network` (`docker network disconnect`): its
    /// attachment is detached (the address goes back to the pool) and its interface leaves the container.
    /// A container created on the network (`docker run --network`) stays on it while it exists.
    pub async fn disconnect(&self, container: &str, network: &str, force: bool) -> Result<(), AttachError> {
        let c = match self.docker.inspect_container(container, None).await {
            Ok(c) => c,
            Err(e) if engine_status(&e) == Some(404) && force => return Ok(()),
            Err(e) if engine_status(&e) == Some(404) => {
                return Err(AttachError::NotFound(format!("No such container: {container}")))
            }
            Err(e) => return Err(AttachError::Engine(engine_message(&e))),
        };
        let id = c.id.clone().unwrap_or_else(|| container.to_string());
        let name = c.name.as_deref().unwrap_or(container).trim_start_matches('/').to_string();
        let labels = c.config.as_ref().and_then(|c| c.labels.clone()).unwrap_or_default();
        if labels.get(LABEL_ATTACH_NETWORK).is_some_and(|n| n == network) {
            return Err(AttachError::Invalid(format!(
                "container {name} was created on swarm network {network} (docker run --network {network}) and stays \
                 on it while it exists: remove it (docker rm -f {name}) to give its address back"
            )));
        }
        let connected = self.connected_to(&id).is_some_and(|on| on.iter().any(|n| n == network));
        let attachments = self.attachments_of(&id);
        if !connected || attachments.is_empty() {
            if force {
                return Ok(());
            }
            return Err(AttachError::Invalid(format!("container {id} is not connected to network {network}")));
        }
        for a in &attachments {
            self.detach(a).await?;
        }
        if let Ok(plane) = self.plane() {
            for a in &attachments {
                plane.wait_released(a).await;
            }
        }
        Ok(())
    }

    /// Detaches attachment `attachment` (one already gone is no error).
    pub async fn detach(&self, attachment: &str) -> Result<(), AttachError> {
        let mut client = self.client()?;
        let req = crate::rpc::req(
            &self.node_id,
            DetachNetworkRequest { attachment_id: attachment.to_string() },
            Some(ATTACH_TIMEOUT),
        );
        let r = client.detach_network(req).await;
        if matches!(&r, Err(s) if s.code() == tonic::Code::NotFound) || r.is_ok() {
            self.made.lock().retain(|_, a| a != attachment);
            self.joined.lock().retain(|_, (_, a)| a != attachment);
        }
        match r {
            Ok(_) => {
                tracing::info!(%attachment, "network attachment detached");
                Ok(())
            }
            Err(s) if s.code() == tonic::Code::NotFound => Ok(()),
            Err(s) => Err(AttachError::Unavailable(format!("cannot detach attachment {attachment}: {}", s.message()))),
        }
    }

    /// The live attachments of `container` on this node: those made by this run, and the tasks assigned here.
    fn attachments_of(&self, container: &str) -> Vec<String> {
        let mut out: BTreeSet<String> = self.made.lock().get(container).cloned().into_iter().collect();
        let a = self.assigned.borrow();
        out.extend(a.values().filter(|t| attachment_container(t) == Some(container) && holds(t)).map(|t| t.id.clone()));
        out.into_iter().collect()
    }

    /// Before container `container` starts (see the module doc): nothing when it is not one of ours.
    pub async fn before_start(&self, container: &str) -> Result<(), AttachError> {
        let c = match self.docker.inspect_container(container, None).await {
            Ok(c) => c,
            // The engine answers the start itself.
            Err(_) => return Ok(()),
        };
        let ours =
            c.config.as_ref().and_then(|c| c.labels.as_ref()).is_some_and(|l| l.contains_key(LABEL_ATTACH_NETWORK));
        if !ours || is_running(&c) {
            return Ok(());
        }
        let id = c.id.clone().unwrap_or_else(|| container.to_string());
        let attachment = match self.attachments_of(&id).into_iter().next() {
            Some(a) => a,
            None => self.attach(&id).await?,
        };
        let plumbed = match self.plane() {
            Ok(plane) => plane.wait_plumbed(&attachment).await,
            Err(e) => Err(e),
        };
        if let Err(e) = plumbed {
            // Not left holding an address it cannot use.
            let _ = self.detach(&attachment).await;
            return Err(AttachError::Unavailable(e));
        }
        Ok(())
    }

    /// Before container `container` is restarted through the control socket (`docker restart`): when it is
    /// one with an attachment and runs, the stop the restart makes keeps its attachment (its ID is returned,
    /// for `restart_ended`); when it does not run, the restart is a start (`before_start`).
    pub async fn restart_begins(&self, container: &str) -> Result<Option<String>, AttachError> {
        let Ok(c) = self.docker.inspect_container(container, None).await else { return Ok(None) };
        let id = c.id.clone().unwrap_or_else(|| container.to_string());
        if !is_running(&c) {
            self.before_start(&id).await?;
            return Ok(None);
        }
        if self.attachments_of(&id).is_empty() {
            return Ok(None);
        }
        *self.restarts.lock().entry(id.clone()).or_default() += 1;
        Ok(Some(id))
    }

    /// The restart of container `id` that `restart_begins` marked is answered (whatever the answer).
    pub fn restart_ended(&self, id: &str) {
        let mut r = self.restarts.lock();
        if let Some(n) = r.get_mut(id) {
            *n -= 1;
            if *n == 0 {
                r.remove(id);
            }
        }
    }

    /// Follows the engine's events and the node's assignments (see the module doc) until `shutdown`.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let (mut assigned, mut channel) = (self.assigned.subscribe(), self.channel.subscribe());
        loop {
            // Every container's (a connected one carries no label of ours): those without an attachment
            // here are passed over at once.
            let filters: HashMap<&str, Vec<&str>> =
                HashMap::from([("type", vec!["container"]), ("event", vec!["start", "die", "stop", "destroy"])]);
            let mut events = self.docker.events(Some(EventsOptionsBuilder::default().filters(&filters).build()));
            // Whatever happened while no stream was open.
            self.reconcile().await;
            loop {
                tokio::select! {
                    e = events.next() => match e {
                        Some(Ok(ev)) => {
                            let actor = ev.actor.unwrap_or_default();
                            let id = actor.id.unwrap_or_default();
                            let holder = actor.attributes.unwrap_or_default().remove(LABEL_ATTACH_HOLDER);
                            if ev.action.as_deref() == Some("start") {
                                // A connected container's new run has a new namespace: the attachment moves there.
                                if holder.is_none() && !self.attachments_of(&id).is_empty() {
                                    self.rejoin(&id).await;
                                }
                            } else if holder.is_some() || !self.attachments_of(&id).is_empty() {
                                self.settle(&id, holder.as_deref()).await;
                            }
                        }
                        Some(Err(e)) => {
                            tracing::warn!("the engine's event stream failed: {}", engine_message(&e));
                            break;
                        }
                        None => break,
                    },
                    r = assigned.changed() => {
                        if r.is_err() { return }
                        self.reconcile().await;
                    }
                    r = channel.changed() => {
                        if r.is_err() { return }
                        self.reconcile().await;
                    }
                    r = shutdown.changed() => if r.is_err() || *shutdown.borrow() { return },
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(EVENTS_RETRY) => {}
                r = shutdown.changed() => if r.is_err() || *shutdown.borrow() { return },
            }
        }
    }

    /// Connected container `id` started again (its restart policy, or a restart through the socket, kept its
    /// attachment): each attachment task of it assigned here is plumbed into its new namespace, as dockerd
    /// joins a restarted container's networks again. (One not assigned yet is plumbed there by its
    /// controller.)
    async fn rejoin(&self, id: &str) {
        let tasks: Vec<Task> = {
            let a = self.assigned.borrow();
            a.values().filter(|t| attachment_container(t) == Some(id) && holds(t)).map(|t| (**t).clone()).collect()
        };
        let Ok(plane) = self.plane() else { return };
        for t in tasks {
            let c = AttachmentController {
                docker: self.docker.clone(),
                plane: plane.clone(),
                task: Arc::new(t),
                container: id.to_string(),
                resolv_was: Arc::default(),
            };
            match c.register(true).await {
                Ok(()) => {
                    tracing::info!(container = %id, attachment = %c.task.id, "restarted container connected again")
                }
                Err(e) => {
                    tracing::warn!(container = %id, attachment = %c.task.id, "cannot connect the restarted container \
                                                                              again: {e}")
                }
            }
        }
    }

    /// The fate of container `id`'s attachments, from the engine's view of it now.
    async fn fate_of(&self, id: &str) -> Result<Fate, AttachError> {
        let status = match self.docker.inspect_container(id, None).await {
            Ok(c) => Some(c.state.as_ref().and_then(|s| s.status).map(|s| s.to_string()).unwrap_or_default()),
            Err(e) if engine_status(&e) == Some(404) => None,
            Err(e) => return Err(AttachError::Engine(engine_message(&e))),
        };
        Ok(fate(status.as_deref(), self.restarts.lock().contains_key(id)))
    }

    /// Something happened to container `id` (it died, was stopped or removed): its attachments are
    /// detached unless it runs on or the engine restarts it (`fate`), and a removed container's holder goes.
    async fn settle(&self, id: &str, holder: Option<&str>) {
        let f = match self.fate_of(id).await {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(container = %id, "cannot inspect the container: {e}; the next reconcile looks again");
                return;
            }
        };
        if f == Fate::Keep {
            tracing::debug!(container = %id, "the container runs on or is restarting: its attachment stays");
            return;
        }
        for a in self.attachments_of(id) {
            if let Err(e) = self.detach(&a).await {
                tracing::warn!(container = %id, "{e}; the next reconcile tries again");
            }
        }
        if let (Fate::Gone, Some(h)) = (f, holder) {
            self.abandon(h).await;
        }
    }

    /// Detaches this node's attachments whose container is gone or stopped for good (`fate`); removes holders
    /// whose container is gone.
    async fn reconcile(&self) {
        let mine: Vec<(String, String)> = {
            let a = self.assigned.borrow();
            a.values()
                .filter(|t| t.node_id == self.node_id && holds(t))
                .filter_map(|t| Some((t.id.clone(), attachment_container(t)?.to_string())))
                .collect()
        };
        for (attachment, container) in mine {
            if matches!(self.fate_of(&container).await, Ok(Fate::Detach | Fate::Gone)) {
                tracing::info!(%attachment, %container, "the attachment's container is stopped or gone: detaching");
                if let Err(e) = self.detach(&attachment).await {
                    tracing::debug!(%attachment, "{e}");
                }
            }
        }
        // Holders whose container is gone (removed while the daemon was down, or a create that failed).
        let list = |label: String| {
            let filters: HashMap<String, Vec<String>> = HashMap::from([("label".to_string(), vec![label])]);
            self.docker
                .list_containers(Some(ListContainersOptionsBuilder::default().all(true).filters(&filters).build()))
        };
        let (Ok(holders), Ok(users)) =
            (list(format!("{LABEL_ATTACH_HOLDS}=1")).await, list(LABEL_ATTACH_HOLDER.to_string()).await)
        else {
            return;
        };
        let used: BTreeSet<String> =
            users.iter().filter_map(|c| c.labels.as_ref()?.get(LABEL_ATTACH_HOLDER).cloned()).collect();
        for h in holders {
            let mine = h.labels.as_ref().and_then(|l| l.get(spec::LABEL_NODE_ID)) == Some(&self.node_id);
            let Some(id) = h.id.filter(|id| mine && !used.contains(id)) else { continue };
            if self.creating.lock().contains(&id) {
                continue;
            }
            tracing::info!(holder = %id, "removing a network-namespace holder whose container is gone");
            self.abandon(&id).await;
        }
    }

    /// The controller of attachment task `task` (its container's namespace, plumbed).
    pub fn controller(&self, task: &Task) -> Result<AttachmentController, ExecutorError> {
        let container = attachment_container(task)
            .filter(|c| !c.is_empty())
            .ok_or_else(|| ExecutorError::InvalidSpec("the network attachment names no container".into()))?;
        let plane = self.plane().map_err(ExecutorError::Runtime)?;
        plane.check_task(task).map_err(ExecutorError::InvalidSpec)?;
        Ok(AttachmentController {
            docker: self.docker.clone(),
            plane,
            task: Arc::new(task.clone()),
            container: container.to_string(),
            resolv_was: Arc::default(),
        })
    }

    /// The controller of attachment task `task` after the agent restarted, its namespace registered again,
    /// when its container still runs (`None`: it does not; the task is then lost and detached).
    pub fn adopt(&self, task: &Task) -> Option<AttachmentController> {
        let state = TaskState::from_wire(task.status.as_ref().map_or(0, |s| s.state));
        if (state as i32) < TaskState::Starting as i32 || state.is_terminal() {
            return None;
        }
        let c = self.controller(task).ok()?;
        let adopted = c.clone();
        tokio::spawn(async move {
            if let Err(e) = adopted.register(true).await {
                tracing::warn!(task = %adopted.task.id, "cannot adopt the attachment's network namespace: {e}");
            }
        });
        Some(c)
    }
}

/// Runs one network attachment task: the container's holder namespace (or, connected, its own), plumbed
/// while the task lives.
#[derive(Clone)]
pub struct AttachmentController {
    docker: Docker,
    plane: Arc<NetworkPlane>,
    task: Arc<Task>,
    container: String,
    /// A connected container's resolv.conf as it was before it pointed at the swarm's resolver (its path
    /// and content): put back when the attachment goes, since the resolver goes with it.
    resolv_was: Arc<Mutex<Option<(std::path::PathBuf, String)>>>,
}

impl AttachmentController {
    /// Registers the holder's namespace with the plane (starting the holder unless `adopting`).
    async fn register(&self, adopting: bool) -> Result<(), String> {
        let c = self.docker.inspect_container(&self.container, None).await.map_err(|e| engine_message(&e))?;
        if adopting && !is_running(&c) {
            return Err(format!("container {} no longer runs", self.container));
        }
        let holder =
            c.config.as_ref().and_then(|c| c.labels.as_ref()).and_then(|l| l.get(LABEL_ATTACH_HOLDER).cloned());
        let Some(holder) = holder else {
            // Connected (`docker network connect`): the container's own namespace, while it runs.
            let pid = c.state.as_ref().and_then(|s| s.pid).filter(|p| *p > 0 && is_running(&c));
            let pid = pid
                .ok_or_else(|| format!("container {} is not running: connect it again once it runs", self.container))?;
            if let Some(path) = c.resolv_conf_path.as_deref().filter(|p| !p.is_empty()) {
                match point_at_resolver(Path::new(path)) {
                    Ok(Some(was)) => *self.resolv_was.lock() = Some((path.into(), was)),
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(container = %self.container, "its names are not resolved by the swarm's \
                                                                     resolver: {e}")
                    }
                }
            }
            return self.plane.join_namespace(&self.task, super::host_pid(pid)?).await.map(|_| ());
        };
        let mut h = self.docker.inspect_container(&holder, None).await.map_err(|e| engine_message(&e))?;
        if !is_running(&h) {
            match self.docker.start_container(&holder, None).await {
                Ok(()) => {}
                Err(e) if engine_status(&e) == Some(304) => {}
                Err(e) => return Err(format!("cannot start the network-namespace holder: {}", engine_message(&e))),
            }
            h = self.docker.inspect_container(&holder, None).await.map_err(|e| engine_message(&e))?;
        }
        let pid = h.state.as_ref().and_then(|s| s.pid).filter(|p| *p > 0 && is_running(&h));
        let pid = pid.ok_or_else(|| format!("the network-namespace holder {holder} is not running"))?;
        self.plane.attach_namespace(&self.task, super::host_pid(pid)?).await.map(|_| ())
    }
}

impl Controller for AttachmentController {
    fn prepare(&mut self) -> BoxFuture<'_, Result<(), ExecutorError>> {
        Box::pin(async move { self.register(false).await.map_err(ExecutorError::Prepare) })
    }

    fn start(&mut self) -> BoxFuture<'_, Result<i32, ExecutorError>> {
        Box::pin(async move {
            self.plane.wait_plumbed(&self.task.id).await.map_err(ExecutorError::Start)?;
            Ok(0)
        })
    }

    fn wait(&mut self) -> BoxFuture<'_, Result<ExitStatus, ExecutorError>> {
        // The attachment lasts until it is detached (the task is then removed), whatever its container does.
        Box::pin(std::future::pending())
    }

    fn shutdown(&mut self) -> BoxFuture<'_, Result<(), ExecutorError>> {
        Box::pin(async { Ok(()) })
    }

    fn terminate(&mut self) -> BoxFuture<'_, Result<(), ExecutorError>> {
        Box::pin(async { Ok(()) })
    }

    fn remove(&mut self) -> BoxFuture<'_, Result<(), ExecutorError>> {
        Box::pin(async move {
            self.plane.release(&self.task.id).await.map_err(ExecutorError::Runtime)?;
            let was = self.resolv_was.lock().take();
            if let Some((path, content)) = was {
                // (Gone with a removed container: nothing to put back.)
                if path.exists() {
                    if let Err(e) = std::fs::write(&path, content) {
                        tracing::warn!(container = %self.container, "cannot put its resolv.conf back: {e}");
                    }
                }
            }
            Ok(())
        })
    }
}

impl crate::exec::EngineAttachments for Attacher {
    fn set_assigned(&self, assigned: AssignedTasks) {
        Attacher::set_assigned(self, assigned);
    }

    fn set_channel(&self, channel: Option<Channel>) {
        Attacher::set_channel(self, channel);
    }

    fn run(self: Arc<Self>, shutdown: watch::Receiver<bool>) -> BoxFuture<'static, ()> {
        Box::pin(Attacher::run(self, shutdown))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_containers_labels_name_its_holder_network_and_aliases() {
        let l = container_labels("h1", "net", &["db".into(), "cache".into()]);
        assert_eq!(l[LABEL_ATTACH_HOLDER], "h1");
        assert_eq!(l[LABEL_ATTACH_NETWORK], "net");
        assert_eq!(l[LABEL_ATTACH_ALIASES], "db,cache");
        assert!(!container_labels("h1", "net", &[]).contains_key(LABEL_ATTACH_ALIASES));
    }

    #[test]
    fn an_attachment_goes_only_when_its_container_stopped_for_good() {
        for (status, restarting_here, want) in [
            // The engine's restart policy: `die` comes with the container already marked restarting.
            (Some("restarting"), false, Fate::Keep),
            (Some("running"), false, Fate::Keep),
            (Some("paused"), false, Fate::Keep),
            (Some("created"), false, Fate::Keep),
            (Some("removing"), false, Fate::Keep),
            (Some("exited"), false, Fate::Detach),
            (Some("dead"), false, Fate::Detach),
            // `docker restart` through the socket: the stop it makes keeps the attachment.
            (Some("exited"), true, Fate::Keep),
            (None, false, Fate::Gone),
            (None, true, Fate::Gone),
        ] {
            assert_eq!(fate(status, restarting_here), want, "{status:?} {restarting_here}");
        }
    }

    #[test]
    fn a_connected_container_resolves_through_the_swarms_resolver_keeping_its_search_and_options() {
        let check = |current: &str, want: Option<&str>| assert_eq!(joined_resolv_conf(current).as_deref(), want);
        // The default bridge's copy of the host's.
        check(
            "# Generated\nnameserver 10.0.0.2\nnameserver 8.8.8.8\nsearch corp.test\noptions edns0\n",
            Some("nameserver 127.0.0.11\nsearch corp.test\noptions edns0\noptions ndots:0\n"),
        );
        check("nameserver 1.1.1.1\noptions ndots:2\n", Some("nameserver 127.0.0.11\noptions ndots:2\n"));
        check("", Some("nameserver 127.0.0.11\noptions ndots:0\n"));
        // The engine's embedded resolver (a user-defined network) already answers there: left alone.
        check("nameserver 127.0.0.11\noptions ndots:0\n", None);
    }

    #[test]
    fn only_a_container_with_a_namespace_of_its_own_is_connected() {
        for mode in ["default", "bridge", "back", "", "0123abcd"] {
            assert_eq!(mode_refusal(mode), None, "{mode}");
        }
        for mode in ["host", "container:abc"] {
            assert!(mode_refusal(mode).is_some_and(|m| m.starts_with("container sharing network namespace")), "{mode}");
        }
        assert!(mode_refusal("none").is_some_and(|m| m.contains("private (none) mode")));
    }

    #[test]
    fn refusals_keep_the_managers_reason_and_name_the_network() {
        let e = status_error("closed", tonic::Status::permission_denied("network closed is not manually attachable"));
        assert!(
            matches!(&e, AttachError::Refused(m) if m.starts_with("Could not attach to network closed: network closed \
                                                                   is not"))
        );
        assert!(matches!(status_error("x", tonic::Status::not_found("network x not found")), AttachError::NotFound(_)));
        assert!(matches!(status_error("x", tonic::Status::unavailable("no leader")), AttachError::Unavailable(_)));
    }
}
