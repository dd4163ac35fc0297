//! The agent's side of the data plane: `NetworkPlane` turns what the agent knows into the node's wanted
//! `shoal_netplane::NodeNetState` (`desired`) and applies it with `shoal_netplane::Executor::reconcile`, then
//! serves each task's names with the node's `shoal_netplane::Resolver`.
//!
//! Inputs, each bumping a generation: the tasks assigned to the node (`set_assigned`, from the worker), the
//! manager's view of the node's networks (`set_view`, from the `shoal.v1.NetworkView` stream that rides on the
//! session's connection, `follow_view`), and the task namespaces executors make and release
//! (`create_namespace`, `release`). One loop (`run`) applies the latest generation whenever it changed:
//! changes that arrive while a reconcile runs are coalesced into the next one, so there is at most one
//! reconcile in flight and one waiting. A failed reconcile is retried after `RETRY_AFTER_ERROR` (or at the
//! next change). A task's executor waits (`wait_plumbed`, bounded by `PLUMB_TIMEOUT`) until its namespace is
//! plumbed before starting the task.
//!
//! Only one daemon owns a network namespace's data plane (an exclusive lock on
//! `/run/shoal/netplane-<namespace inode>.lock`): the kernel objects are named by network, not by daemon.
//! `open` refuses (with the reason, which the executor then gives when it rejects a networked task) without
//! root, without the kernel's VXLAN and nftables NAT, or when another daemon holds the lock.
//!
//! Clean stop and restart: `clear` reconciles the empty state (every Shoal link, network namespace, entry, table
//! and iptables rule goes) and deletes the task namespaces this daemon made (`/run/netns/shl-task-<task id>`, each
//! recorded by a marker in `state_dir/task-netns/`, since `/run/netns` is shared by every daemon of the machine); the
//! agent calls it when it starts and stops with an executor whose tasks die with it. Everything else is rebuilt from
//! the inputs by the next reconcile, which observes before it plans.
//!
//! Tasks that outlive the agent (the docker executor's containers): nothing is cleared at a stop or a start.
//! A task's namespace is then its container's (`attach_namespace`: `ip netns attach` of the holder's PID
//! under the same name and marker), and at start `resume` holds every reconcile until the manager's view
//! arrived and each surviving task is registered again, so the links, tables and resolver they use are
//! not taken for stale ones (the resolver's sockets died with the agent and are made again by the first
//! reconcile). Who may delete a task namespace stays the same: the plane, for a task it registered.

pub(crate) mod desired;

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use shoal_api::shoal_v1::{network_view_client::NetworkViewClient, NetworkViewRequest, NodeNetworkView};
use shoal_api::Task;
use shoal_netplane::NodeNetState;
use tokio::sync::{watch, Notify};

use crate::assigned::AssignedTasks;
use desired::PlumbedTask;

/// Prefix of the task namespaces the agent makes (`ip netns` names, under `/run/netns`).
pub(crate) const TASK_NETNS_PREFIX: &str = "shl-task-";
/// Where `ip netns` keeps named namespaces.
pub(crate) const NETNS_DIR: &str = "/run/netns";
/// Longest wait for a task's namespace to be plumbed before its start fails.
pub(crate) const PLUMB_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for a released task's interfaces to be removed before its namespace is deleted anyway.
pub(crate) const RELEASE_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause before a failed reconcile is tried again (unless an input changes first).
pub(crate) const RETRY_AFTER_ERROR: Duration = Duration::from_secs(2);
/// Longest a stopping task waits to leave this node's VIPs before its stop signal.
pub(crate) const DRAIN_WAIT_MAX: Duration = Duration::from_secs(10);
/// Longest the plane waits, once the manager's first view arrived, for the tasks that outlived the agent to be
/// registered again before it reconciles anyway. (Before the first view it waits as long as it takes: without
/// a view it could carry nothing, and would only remove what the tasks use.)
pub(crate) const SURVIVOR_HOLD_MAX: Duration = Duration::from_secs(60);
/// Largest view message accepted from the manager.
pub(crate) const MAX_VIEW_BYTES: usize = 64 * 1024 * 1024;
/// Bounds of the pause before the view stream is opened again after it failed.
const VIEW_RETRY_MIN: Duration = Duration::from_millis(200);
const VIEW_RETRY_MAX: Duration = Duration::from_secs(5);
/// Longest an `ip netns` command may take.
const NETNS_COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// The plugin a node reports when it carries overlay networks (what the scheduler's PluginFilter looks for).
pub(crate) fn overlay_plugin() -> shoal_api::PluginDescription {
    network_plugin("overlay")
}

/// A network driver a node reports (`overlay`; `host` on every node, `bridge` where an engine runs tasks).
pub(crate) fn network_plugin(driver: &str) -> shoal_api::PluginDescription {
    shoal_api::PluginDescription { r#type: "Network".into(), name: driver.into() }
}

#[derive(Default)]
struct Inputs {
    generation: u64,
    view: Option<NodeNetworkView>,
    assigned: AssignedTasks,
    plumbed: BTreeMap<String, PlumbedTask>,
    /// Task namespaces an earlier run of the agent left plumbed for tasks that outlived it (containers), not
    /// registered again yet: until the view arrived and each is registered (`attach_namespace`) or given up
    /// (`forget_survivor`), nothing is reconciled, so their links are not taken for stale ones.
    survivors: BTreeSet<String>,
    /// Set by `resume` while the plane holds its reconciles for survivors.
    holding: bool,
    /// When the hold ends whatever is left: `SURVIVOR_HOLD_MAX` after the first view arrived.
    hold_until: Option<std::time::Instant>,
}

/// What the last reconcile achieved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// The input generation it applied.
    pub generation: u64,
    /// Tasks whose namespaces are plumbed.
    pub plumbed: BTreeSet<String>,
    /// Why it failed, if it did.
    pub error: Option<String>,
}

/// The node's data plane as the agent drives it (see the module doc).
pub struct NetworkPlane {
    inputs: Mutex<Inputs>,
    wake: Notify,
    applied: watch::Sender<Applied>,
    executor: shoal_netplane::Executor,
    resolver: shoal_netplane::Resolver,
    /// One empty file per task namespace this daemon made (`/run/netns` is shared by every daemon of the
    /// machine, whatever their network namespace: only these are ours to delete after a crash).
    markers: PathBuf,
    /// Set when the agent stops: stopping tasks then skip the drain out of the VIPs, and drains under way
    /// end (`stop_notify` wakes them).
    stopping: std::sync::atomic::AtomicBool,
    stop_notify: tokio::sync::Notify,
    /// Holds the namespace's data-plane lock while the plane lives (the file is removed with the plane).
    lock: (std::fs::File, PathBuf),
}

impl Drop for NetworkPlane {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.lock.1);
    }
}

impl std::fmt::Debug for NetworkPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetworkPlane").field("applied", &*self.applied.borrow()).finish()
    }
}

/// Runs `ip netns <args>`, bounded.
async fn ip_netns(args: &[&str]) -> Result<(), String> {
    let mut cmd = tokio::process::Command::new("ip");
    cmd.arg("netns").args(args).kill_on_drop(true);
    let line = format!("ip netns {}", args.join(" "));
    match tokio::time::timeout(NETNS_COMMAND_TIMEOUT, cmd.output()).await {
        Err(_) => Err(format!("`{line}` took longer than {NETNS_COMMAND_TIMEOUT:?}")),
        Ok(Err(e)) => Err(format!("cannot run `{line}`: {e} (the data plane needs iproute2)")),
        Ok(Ok(o)) if o.status.success() => Ok(()),
        Ok(Ok(o)) => Err(format!("`{line}` failed: {}", String::from_utf8_lossy(&o.stderr).trim())),
    }
}

/// The task IDs whose namespaces this daemon made and has not deleted (one marker file each).
fn marked(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect()
}

/// Takes the data-plane lock of the caller's network namespace for the daemon of `state_dir` (the file then
/// holds `pid <pid>, state dir <path>`), or says who holds it.
#[allow(unsafe_code)]
fn lock_namespace(state_dir: &Path) -> Result<(std::fs::File, PathBuf), String> {
    use std::io::{Read, Seek, Write};
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata("/proc/self/ns/net").map_err(|e| format!("cannot read /proc/self/ns/net: {e}"))?.ino();
    let dir = Path::new("/run/shoal");
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let path = dir.join(format!("netplane-{ino}.lock"));
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    // SAFETY: flock on a file descriptor this function owns; no memory is shared with the kernel.
    let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r != 0 {
        let mut holder = String::new();
        let _ = file.read_to_string(&mut holder);
        let holder = holder.trim();
        let who = if holder.is_empty() { String::new() } else { format!(" ({holder})") };
        return Err(format!(
            "another Shoal daemon{who} carries this network namespace's data plane (it holds {}); run one daemon \
             per network namespace to connect networks",
            path.display()
        ));
    }
    let dir = std::path::absolute(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
    let written = file
        .set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| write!(file, "pid {}, state dir {}", std::process::id(), dir.display()));
    if let Err(e) = written {
        tracing::warn!(lock = %path.display(), "cannot record this daemon in the data-plane lock: {e}");
    }
    Ok((file, path))
}

/// Whether the daemon runs as root.
#[allow(unsafe_code)]
fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

impl NetworkPlane {
    /// The data plane of the caller's network namespace, or why this node cannot have one. `state_dir` is the
    /// agent's: the record of the task namespaces it made lives there.
    pub fn open(state_dir: &Path) -> Result<Arc<NetworkPlane>, String> {
        if !is_root() {
            return Err("the daemon does not run as root, which the data plane needs".into());
        }
        let caps = shoal_netplane::probe().map_err(|e| e.to_string())?;
        if !caps.vxlan || !caps.nft_nat {
            return Err(format!(
                "this kernel lacks what the data plane needs (measured: VXLAN devices {}, nftables NAT {})",
                caps.vxlan, caps.nft_nat
            ));
        }
        let lock = lock_namespace(state_dir)?;
        let markers = state_dir.join("task-netns");
        std::fs::create_dir_all(&markers).map_err(|e| format!("cannot create {}: {e}", markers.display()))?;
        let upstreams = std::fs::read_to_string("/etc/resolv.conf")
            .map(|t| shoal_netplane::upstreams_from_resolv_conf(&t))
            .unwrap_or_default();
        Ok(Arc::new(NetworkPlane {
            inputs: Mutex::new(Inputs::default()),
            wake: Notify::new(),
            applied: watch::channel(Applied::default()).0,
            executor: shoal_netplane::Executor::new(),
            resolver: shoal_netplane::Resolver::new(upstreams),
            markers,
            stopping: std::sync::atomic::AtomicBool::new(false),
            stop_notify: tokio::sync::Notify::new(),
            lock,
        }))
    }

    fn change(&self, f: impl FnOnce(&mut Inputs) -> bool) -> u64 {
        let mut i = self.inputs.lock();
        if f(&mut i) {
            i.generation += 1;
            self.wake.notify_one();
        }
        i.generation
    }

    /// The manager's latest view of this node's networks.
    pub fn set_view(&self, view: NodeNetworkView) {
        self.change(|i| {
            let changed = i.view.as_ref() != Some(&view);
            i.view = Some(view);
            changed
        });
    }

    /// The tasks assigned to this node now.
    pub fn set_assigned(&self, assigned: AssignedTasks) {
        self.change(|i| {
            let changed = !Arc::ptr_eq(&i.assigned, &assigned);
            i.assigned = assigned;
            changed
        });
    }

    /// Whether `task`'s networks can be carried here (`Err`: the reason, for the task's rejection).
    /// A network whose subnet holds a node's address (as the manager's latest view says) is refused here.
    pub fn check_task(&self, task: &Task) -> Result<(), String> {
        desired::task_support(task, false)?;
        match self.overlap(task) {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }

    /// Why one of `task`'s networks cannot be carried here because its subnet holds a node's address.
    fn overlap(&self, task: &Task) -> Option<String> {
        let i = self.inputs.lock();
        let view = i.view.as_ref()?;
        let underlay = view.node_addr.parse().ok();
        desired::attachments(task).ok()?.iter().find_map(|(n, _)| {
            let s = desired::network_state(n).ok()?;
            desired::overlap_reason(&s, underlay, view)
        })
    }

    /// Path of task `task_id`'s namespace.
    pub fn netns_path(task_id: &str) -> PathBuf {
        Path::new(NETNS_DIR).join(format!("{TASK_NETNS_PREFIX}{task_id}"))
    }

    /// Makes `task`'s network namespace (a leftover of the same name is replaced) and asks for it to be
    /// plumbed; returns its path.
    pub async fn create_namespace(&self, task: &Task) -> Result<PathBuf, String> {
        self.register_namespace(task, None, false).await
    }

    /// Names the network namespace of process `pid` (a container's, made by its runtime) as `task`'s
    /// (`ip netns attach`; a leftover of the same name is replaced) and asks for it to be plumbed; returns its
    /// path. For a task that outlived the agent, this registers it again (see `resume`).
    pub async fn attach_namespace(&self, task: &Task, pid: u32) -> Result<PathBuf, String> {
        let r = self.register_namespace(task, Some(pid), false).await;
        self.forget_survivor(&task.id);
        r
    }

    /// As `attach_namespace`, for the namespace of a running container that is not the task's own
    /// (`docker network connect`): it is plumbed as a joined one (`shoal_netplane::TaskState::joined`: the
    /// container's interfaces and routes stay), and what Shoal put in it goes when the task is released.
    /// Called again after the container restarted (a new process, a new namespace), it moves the task there.
    pub async fn join_namespace(&self, task: &Task, pid: u32) -> Result<PathBuf, String> {
        let r = self.register_namespace(task, Some(pid), true).await;
        self.forget_survivor(&task.id);
        r
    }

    async fn register_namespace(&self, task: &Task, pid: Option<u32>, joined: bool) -> Result<PathBuf, String> {
        let attachments = desired::attachments(task)?;
        let name = format!("{TASK_NETNS_PREFIX}{}", task.id);
        let path = Self::netns_path(&task.id);
        if path.exists() {
            self.change(|i| i.plumbed.remove(&task.id).is_some());
            ip_netns(&["delete", &name]).await?;
        }
        let marker = self.markers.join(&task.id);
        std::fs::write(&marker, b"").map_err(|e| format!("cannot write {}: {e}", marker.display()))?;
        match pid {
            None => ip_netns(&["add", &name]).await?,
            Some(pid) => ip_netns(&["attach", &name, &pid.to_string()]).await?,
        }
        self.change(|i| {
            i.plumbed.insert(task.id.clone(), PlumbedTask { netns: path.clone(), attachments, joined });
            true
        });
        Ok(path)
    }

    /// At start, when tasks outlive the agent: `survivors` are the tasks whose namespaces an earlier run left
    /// and whose runtime objects are still there. Every other namespace this daemon made is deleted; the plane
    /// reconciles nothing until the manager's view arrived and each survivor is registered again
    /// (`attach_namespace`) or given up (`forget_survivor`) (at most `SURVIVOR_HOLD_MAX` after the view), so
    /// that what they use stays in place meanwhile.
    pub async fn resume(&self, survivors: &BTreeSet<String>) {
        for id in marked(&self.markers).into_iter().filter(|id| !survivors.contains(id)) {
            if let Err(e) = self.delete_namespace(&id).await {
                tracing::warn!(task = %id, "cannot delete the network namespace of a task that is gone: {e}");
            }
        }
        if !survivors.is_empty() {
            tracing::info!(
                tasks = survivors.len(),
                "tasks outlived the agent: keeping their data plane until they are adopted"
            );
            let mut i = self.inputs.lock();
            i.survivors = survivors.clone();
            i.holding = true;
        }
    }

    /// Task `task_id` outlived the agent but will not be registered again (see `resume`).
    pub fn forget_survivor(&self, task_id: &str) {
        self.change(|i| i.survivors.remove(task_id));
    }

    /// Until when the plane holds its reconciles (see `resume`), if it does (it looks again at every change).
    fn held(&self) -> Option<std::time::Instant> {
        let mut i = self.inputs.lock();
        if !i.holding {
            return None;
        }
        let now = std::time::Instant::now();
        if i.view.is_none() {
            return Some(now + SURVIVOR_HOLD_MAX);
        }
        let until = *i.hold_until.get_or_insert(now + SURVIVOR_HOLD_MAX);
        if i.survivors.is_empty() {
            tracing::info!("every task that outlived the agent is adopted: reconciling the data plane");
        } else if now >= until {
            tracing::warn!(
                left = i.survivors.len(),
                "tasks that outlived the agent were not adopted within \
                                                      {SURVIVOR_HOLD_MAX:?} of the first view: reconciling without \
                                                      them"
            );
        } else {
            return Some(until);
        }
        i.holding = false;
        i.hold_until = None;
        i.survivors.clear();
        None
    }

    /// Waits until task `task_id`'s namespace is plumbed (at most `PLUMB_TIMEOUT`). Fails at once when the
    /// manager's view, arriving after the task, says one of its networks holds a node's address (`overlap`):
    /// that network is never carried here.
    pub async fn wait_plumbed(&self, task_id: &str) -> Result<(), String> {
        let task = self.inputs.lock().assigned.get(task_id).cloned();
        let wanted = self.inputs.lock().generation;
        let mut rx = self.applied.subscribe();
        let deadline = tokio::time::Instant::now() + PLUMB_TIMEOUT;
        loop {
            let done = {
                let a = rx.borrow_and_update();
                a.generation >= wanted && a.plumbed.contains(task_id)
            };
            if done {
                return Ok(());
            }
            // (Each change of the view is reconciled, so a view that names the overlap wakes this loop.)
            if let Some(why) = task.as_ref().and_then(|t| self.overlap(t)) {
                return Err(format!("the task's network namespace cannot be connected: {why}"));
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => continue,
                Ok(Err(_)) => return Err("the node's data plane stopped".into()),
                Err(_) => break,
            }
        }
        let a = self.applied.borrow().clone();
        let have_view = self.inputs.lock().view.is_some();
        let why = match (a.error, have_view) {
            (Some(e), _) => e,
            (None, false) => "no network view from the manager yet".into(),
            (None, true) => "the task's networks are not carried here".into(),
        };
        Err(format!("the task's network namespace was not connected within {PLUMB_TIMEOUT:?}: {why}"))
    }

    /// Stops plumbing task `task_id`: waits (at most `RELEASE_TIMEOUT`) for its interfaces and resolver
    /// sockets to go, then deletes its namespace.
    /// When the agent stops, the reconcile loop has stopped too (`clear` removes everything afterwards): the
    /// namespace goes without waiting (its veth goes with it), or a stopping task would wait out the whole
    /// `RELEASE_TIMEOUT` for a reconcile that never comes.
    /// A joined namespace (a running container's own) outlives the task: its interface goes with the
    /// reconcile (with the veth's other end), and Shoal's table in it (the VIPs) before it is let go.
    pub async fn release(&self, task_id: &str) -> Result<(), String> {
        let mut joined = false;
        let wanted = self.change(|i| match i.plumbed.remove(task_id) {
            Some(t) => {
                joined = t.joined;
                true
            }
            None => false,
        });
        let mut rx = self.applied.subscribe();
        tokio::select! {
            _ = tokio::time::timeout(RELEASE_TIMEOUT, rx.wait_for(|a| a.generation >= wanted)) => {}
            _ = self.stopped() => {}
        }
        let path = Self::netns_path(task_id);
        if joined && path.exists() {
            let exec = self.executor.clone();
            let cleared = tokio::task::spawn_blocking(move || exec.leave_joined(&path))
                .await
                .map_err(|e| format!("the data plane's cleanup panicked: {e}"))?;
            if let Err(e) = cleared {
                tracing::warn!(task = %task_id, "cannot remove Shoal's table from the container's namespace: {e}");
            }
        }
        self.delete_namespace(task_id).await
    }

    /// Waits (at most `RELEASE_TIMEOUT`) until task `task_id` is no longer plumbed: released, and a
    /// reconcile since has removed its interfaces.
    pub async fn wait_released(&self, task_id: &str) {
        let mut rx = self.applied.subscribe();
        let wait = async {
            loop {
                let (generation, registered) = {
                    let i = self.inputs.lock();
                    (i.generation, i.plumbed.contains_key(task_id))
                };
                let done = {
                    let a = rx.borrow_and_update();
                    !registered && a.generation >= generation && !a.plumbed.contains(task_id)
                };
                if done || rx.changed().await.is_err() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(RELEASE_TIMEOUT, wait).await;
    }

    /// Deletes task `task_id`'s namespace and its marker.
    async fn delete_namespace(&self, task_id: &str) -> Result<(), String> {
        if Self::netns_path(task_id).exists() {
            ip_netns(&["delete", &format!("{TASK_NETNS_PREFIX}{task_id}")]).await?;
        }
        match std::fs::remove_file(self.markers.join(task_id)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(format!("cannot remove a marker: {e}")),
            _ => Ok(()),
        }
    }

    /// Marks the agent as stopping: tasks stop without draining (the whole node's data plane goes).
    pub fn set_stopping(&self) {
        self.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
        self.stop_notify.notify_waiters();
    }

    /// Returns once the agent is stopping. A task draining out of the VIPs waits on this too: when the agent
    /// stops (on a one-node cluster, together with the manager whose view the drain waits for), no drain may
    /// hold the stop up.
    pub async fn stopped(&self) {
        // Made before the flag is read: `notify_waiters` wakes every `Notified` made before it, polled or not.
        let woken = self.stop_notify.notified();
        if self.is_stopping() {
            return;
        }
        woken.await;
    }

    /// Whether the agent is stopping.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Waits until no service of the manager's view lists any of `addrs` as a backend and a reconcile
    /// applied that view on this node (at most `DRAIN_WAIT_MAX`): the task has left the VIPs here; other nodes
    /// follow about as fast.
    pub async fn wait_out_of_vips(&self, addrs: &[Ipv4Addr]) {
        let listed = |i: &Inputs| {
            i.view
                .iter()
                .flat_map(|v| &v.networks)
                .flat_map(|n| &n.services)
                .flat_map(|s| &s.backends)
                .any(|b| b.parse::<Ipv4Addr>().is_ok_and(|b| addrs.contains(&b)))
        };
        let mut rx = self.applied.subscribe();
        let wait = async {
            loop {
                let (generation, still) = {
                    let i = self.inputs.lock();
                    (i.generation, listed(&i))
                };
                if !still && rx.borrow_and_update().generation >= generation {
                    return;
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(DRAIN_WAIT_MAX, wait).await;
    }

    /// The last reconcile's outcome.
    pub fn applied(&self) -> watch::Receiver<Applied> {
        self.applied.subscribe()
    }

    fn wanted(&self) -> (u64, NodeNetState) {
        let i = self.inputs.lock();
        let underlay: Option<Ipv4Addr> = i.view.as_ref().and_then(|v| v.node_addr.parse().ok());
        let empty = NodeNetworkView::default();
        let state = desired::desired(underlay, &i.plumbed, &i.assigned, i.view.as_ref().unwrap_or(&empty));
        (i.generation, state)
    }

    async fn apply(&self, state: NodeNetState) -> Result<(), String> {
        let exec = self.executor.clone();
        let s = state.clone();
        tokio::task::spawn_blocking(move || exec.reconcile(&s))
            .await
            .map_err(|e| format!("the data plane's reconcile panicked: {e}"))?
            .map_err(|e| e.to_string())?;
        for e in self.resolver.update(&state).await.map_err(|e| e.to_string())? {
            tracing::warn!("a connected container keeps its own resolver: {e}");
        }
        Ok(())
    }

    /// Applies the inputs whenever they change, until `shutdown` (see the module doc).
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut last: Option<NodeNetState> = None;
        let mut failed = false;
        loop {
            if let Some(until) = self.held() {
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = tokio::time::sleep_until(until.into()) => {}
                    r = shutdown.changed() => if r.is_err() || *shutdown.borrow() { return },
                }
                continue;
            }
            let (generation, state) = self.wanted();
            let outcome = if last.as_ref() == Some(&state) && !failed {
                Ok(())
            } else {
                let t0 = std::time::Instant::now();
                let r = self.apply(state.clone()).await;
                match &r {
                    Ok(()) => tracing::info!(
                        generation,
                        networks = state.networks.len(),
                        tasks = state.tasks.len(),
                        took_ms = u64::try_from(t0.elapsed().as_millis()).unwrap_or(u64::MAX),
                        "data plane reconciled"
                    ),
                    Err(e) => tracing::warn!(generation, "data plane reconcile failed (retrying): {e}"),
                }
                r
            };
            failed = outcome.is_err();
            let plumbed =
                if failed { BTreeSet::new() } else { state.tasks.iter().map(|t| t.task_id.clone()).collect() };
            if !failed {
                last = Some(state);
            }
            self.applied.send_replace(Applied { generation, plumbed, error: outcome.err() });
            let retry = async {
                if failed {
                    tokio::time::sleep(RETRY_AFTER_ERROR).await
                } else {
                    std::future::pending::<()>().await
                }
            };
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = retry => {}
                r = shutdown.changed() => if r.is_err() || *shutdown.borrow() { return },
            }
        }
    }

    /// When the agent stops and its tasks outlive it: deletes the namespaces this daemon made for tasks that
    /// will not be adopted (released or never registered, or assigned with a desired state of REMOVE: a
    /// removal the stop cut short), so that a stop leaves only what running containers use. The rest of
    /// such a task (its stopped container, its holder) goes at the next start, or with a leave.
    pub async fn release_unkept(&self) {
        let unkept: Vec<String> = {
            let i = self.inputs.lock();
            let going = |id: &String| {
                i.assigned.get(id).is_some_and(|t| t.desired_state >= shoal_api::TaskState::Remove as i32)
            };
            marked(&self.markers)
                .into_iter()
                .filter(|id| !i.survivors.contains(id) && (!i.plumbed.contains_key(id) || going(id)))
                .collect()
        };
        for id in unkept {
            self.change(|i| i.plumbed.remove(&id).is_some());
            match self.delete_namespace(&id).await {
                Ok(()) => tracing::info!(task = %id, "deleted the network namespace of a task on its way out"),
                Err(e) => tracing::warn!(task = %id, "cannot delete the task's network namespace: {e}"),
            }
        }
    }

    /// Removes everything this node's data plane made: every Shoal link, network namespace, entry, table and
    /// iptables rule, and the task namespaces. For a clean stop, and at start when no task survived the last run.
    pub async fn clear(&self) {
        let underlay = self.inputs.lock().view.as_ref().and_then(|v| v.node_addr.parse().ok());
        let empty = NodeNetState { underlay_ip: underlay, ..NodeNetState::new(Ipv4Addr::UNSPECIFIED) };
        if let Err(e) = self.apply(empty).await {
            tracing::warn!("cannot remove the data plane's links and rules: {e}");
        }
        for id in marked(&self.markers) {
            if let Err(e) = self.delete_namespace(&id).await {
                tracing::warn!(task = %id, "cannot delete the task's network namespace: {e}");
            }
        }
        self.change(|i| std::mem::take(&mut i.plumbed).into_iter().next().is_some());
    }
}

/// Follows the manager's `shoal.v1.NetworkView` stream on `channel` into `plane` until the task is dropped,
/// opening it again after a failure (bounded backoff).
pub(crate) async fn follow_view(channel: tonic::transport::Channel, node_id: String, plane: Arc<NetworkPlane>) {
    let mut client = NetworkViewClient::new(channel).max_decoding_message_size(MAX_VIEW_BYTES);
    let mut delay = VIEW_RETRY_MIN;
    loop {
        match client.watch(crate::rpc::req(&node_id, NetworkViewRequest {}, None)).await {
            Ok(resp) => {
                let mut stream = resp.into_inner();
                loop {
                    match stream.message().await {
                        Ok(Some(view)) => {
                            plane.set_view(view);
                            delay = VIEW_RETRY_MIN;
                        }
                        Ok(None) => break,
                        Err(status) => {
                            tracing::warn!(node = %node_id, "the network view stream ended: {status}");
                            break;
                        }
                    }
                }
            }
            Err(status) if status.code() == tonic::Code::Unimplemented => {
                tracing::warn!(node = %node_id, "the manager serves no network view (shoal.v1.NetworkView); this node \
                                                 cannot carry overlay networks through it");
            }
            Err(status) => tracing::warn!(node = %node_id, "cannot open the network view stream: {status}"),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(VIEW_RETRY_MAX);
    }
}
