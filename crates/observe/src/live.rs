//! The live page's feed: one loop reads the store's watch queue and turns each commit into a delta of the
//! nodes, services and tasks the page shows; subscribers (Server-Sent Events, `http.rs`) get a snapshot from
//! a read view first, then the deltas after it.
//!
//! Bounds: at most `MAX_SUBSCRIBERS` pages at once (more get 503); the deltas wait for subscribers in one
//! broadcast queue of `DELTA_QUEUE` commits (each at most the store's 1000 actions per write), so a subscriber
//! that falls further behind is not buffered for: it is resynced with a fresh snapshot. When the loop itself
//! lags the store's watch queue, every subscriber is resynced. A snapshot carries at most
//! `SNAPSHOT_MAX_TASKS` tasks (and says how many there were).
//!
//! Which tasks the page shows: those meant to run or complete (desired state up to COMPLETE) and the failed
//! or rejected ones of the history (with their error). A task leaving that set is sent as a removal.
//! The same loop feeds the scheduling-delay histograms from the task writes it reads.
//! Read-only: it never writes to the store.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::Serialize;
use shoal_api::{Node, Service, Task, TaskState};
use shoal_store::{ActionKind, Change, MemoryStore, Object, Tables, WatchError};
use tokio::sync::{broadcast, watch};

use crate::metrics::Recorders;

/// Most live pages subscribed at once.
pub const MAX_SUBSCRIBERS: usize = 64;
/// Commits' deltas kept for subscribers that have not sent them yet.
pub const DELTA_QUEUE: usize = 128;
/// Most tasks in one snapshot.
pub const SNAPSHOT_MAX_TASKS: usize = 10_000;

/// A node as the page shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NodeView {
    id: String,
    hostname: String,
    role: &'static str,
    /// unknown, down, ready, disconnected.
    state: &'static str,
    /// active, pause, drain.
    availability: &'static str,
    addr: String,
    message: String,
    leader: bool,
}

/// A service as the page shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ServiceView {
    id: String,
    name: String,
    /// replicated, global, replicated-job, global-job.
    mode: &'static str,
    /// Replicas (replicated) or total completions (replicated job).
    replicas: Option<u64>,
    image: String,
}

/// A task as the page shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TaskView {
    id: String,
    service_id: String,
    node_id: String,
    slot: u64,
    state: &'static str,
    desired: &'static str,
    message: String,
    err: String,
}

/// One change the page applies.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum PageChange {
    /// A node created or updated.
    Node(NodeView),
    /// A service created or updated.
    Service(ServiceView),
    /// A task the page shows, created or updated.
    Task(TaskView),
    /// An object gone from the page.
    Gone {
        /// node, service or task.
        of: &'static str,
        /// Its ID.
        id: String,
    },
}

/// What the page gets first: everything it shows, as of `index`.
#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    /// The store's index the snapshot was read at.
    pub index: u64,
    /// Every node.
    pub nodes: Vec<NodeView>,
    /// Every service.
    pub services: Vec<ServiceView>,
    /// The tasks shown (at most `SNAPSHOT_MAX_TASKS`).
    pub tasks: Vec<TaskView>,
    /// How many tasks the page would show without the cap.
    pub tasks_total: usize,
}

/// The page's changes from one commit.
#[derive(Debug, Clone, Serialize)]
pub struct Delta {
    /// The commit's index.
    pub index: u64,
    /// Its changes the page shows.
    pub changes: Vec<PageChange>,
}

/// What the loop sends subscribers.
#[derive(Debug, Clone)]
pub enum LiveEvent {
    /// One commit's changes, encoded as JSON once for everyone.
    Delta {
        /// The commit's index.
        index: u64,
        /// The `Delta` as JSON.
        json: Arc<str>,
    },
    /// Commits were missed: read a fresh snapshot.
    Resync,
}

fn node_state(n: &Node) -> &'static str {
    use shoal_api::node_status::State;
    match n.status.as_ref().map(|s| State::try_from(s.state).unwrap_or(State::Unknown)) {
        Some(State::Ready) => "ready",
        Some(State::Down) => "down",
        Some(State::Disconnected) => "disconnected",
        _ => "unknown",
    }
}

fn node_view(n: &Node) -> NodeView {
    let availability = match n.spec.as_ref().map(|s| s.availability) {
        Some(1) => "pause",
        Some(2) => "drain",
        _ => "active",
    };
    NodeView {
        id: n.id.clone(),
        hostname: n.description.as_ref().map(|d| d.hostname.clone()).unwrap_or_default(),
        role: if n.role == shoal_api::NodeRole::Manager as i32 { "manager" } else { "worker" },
        state: node_state(n),
        availability,
        addr: n.status.as_ref().map(|s| s.addr.clone()).unwrap_or_default(),
        message: n.status.as_ref().map(|s| s.message.clone()).unwrap_or_default(),
        leader: n.manager_status.as_ref().is_some_and(|m| m.leader),
    }
}

fn service_view(s: &Service) -> ServiceView {
    use shoal_api::service_spec::Mode;
    let spec = s.spec.as_ref();
    let (mode, replicas) = match spec.and_then(|s| s.mode.as_ref()) {
        Some(Mode::Replicated(r)) => ("replicated", Some(r.replicas)),
        Some(Mode::Global(_)) => ("global", None),
        Some(Mode::ReplicatedJob(j)) => ("replicated-job", Some(j.total_completions)),
        Some(Mode::GlobalJob(_)) => ("global-job", None),
        None => ("replicated", None),
    };
    let image = match spec.and_then(|s| s.task.as_ref()).and_then(|t| t.runtime.as_ref()) {
        Some(shoal_api::task_spec::Runtime::Container(c)) => c.image.clone(),
        _ => String::new(),
    };
    ServiceView {
        id: s.id.clone(),
        name: spec.and_then(|s| s.annotations.as_ref()).map(|a| a.name.clone()).unwrap_or_default(),
        mode,
        replicas,
        image,
    }
}

fn observed(t: &Task) -> TaskState {
    TaskState::from_wire(t.status.as_ref().map_or(0, |s| s.state))
}

/// Whether the page shows the task: meant to run or complete, or failed (with its error).
pub fn shown(t: &Task) -> bool {
    t.desired_state <= TaskState::Complete as i32 || matches!(observed(t), TaskState::Failed | TaskState::Rejected)
}

fn task_view(t: &Task) -> TaskView {
    let status = t.status.as_ref();
    TaskView {
        id: t.id.clone(),
        service_id: t.service_id.clone(),
        node_id: t.node_id.clone(),
        slot: t.slot,
        state: observed(t).docker_name(),
        desired: TaskState::from_wire(t.desired_state).docker_name(),
        message: status.map(|s| s.message.clone()).unwrap_or_default(),
        err: status.map(|s| s.err.clone()).unwrap_or_default(),
    }
}

/// The snapshot of a read view.
pub fn snapshot(t: &Tables) -> Snapshot {
    let mut nodes: Vec<NodeView> = t.nodes().iter().map(|n| node_view(n)).collect();
    nodes.sort_by(|a, b| (&a.hostname, &a.id).cmp(&(&b.hostname, &b.id)));
    let mut services: Vec<ServiceView> = t.services().iter().map(|s| service_view(s)).collect();
    services.sort_by(|a, b| (&a.name, &a.id).cmp(&(&b.name, &b.id)));
    // The tasks meant to run come from the desired-state indexes; failed ones of the history after them.
    let mut tasks = Vec::new();
    let mut total = 0usize;
    let mut take = |task: &Task| {
        total += 1;
        if tasks.len() < SNAPSHOT_MAX_TASKS {
            tasks.push(task_view(task));
        }
    };
    for desired in crate::metrics::TASK_STATES.into_iter().filter(|s| *s <= TaskState::Complete) {
        t.tasks().by_desired_state(desired).for_each(|task| take(task));
    }
    for state in [TaskState::Failed, TaskState::Rejected] {
        t.tasks()
            .by_state(state)
            .filter(|task| task.desired_state > TaskState::Complete as i32)
            .for_each(|task| take(task));
    }
    Snapshot { index: t.last_index(), nodes, services, tasks, tasks_total: total }
}

fn page_change(c: &Change) -> Option<PageChange> {
    let gone = c.kind == ActionKind::Remove;
    Some(match &c.object {
        Object::Node(n) if gone => PageChange::Gone { of: "node", id: n.id.clone() },
        Object::Node(n) => PageChange::Node(node_view(n)),
        Object::Service(s) if gone => PageChange::Gone { of: "service", id: s.id.clone() },
        Object::Service(s) => PageChange::Service(service_view(s)),
        Object::Task(t) if gone || !shown(t) => {
            // A task the page never showed needs no removal.
            let was_shown = c.old.as_ref().is_some_and(|o| matches!(o, Object::Task(o) if shown(o)));
            if !was_shown {
                return None;
            }
            PageChange::Gone { of: "task", id: t.id.clone() }
        }
        Object::Task(t) => PageChange::Task(task_view(t)),
        _ => return None,
    })
}

/// The page's delta of one commit (None when it changes nothing the page shows).
pub fn delta(index: u64, changes: &[Change]) -> Option<Delta> {
    let changes: Vec<PageChange> = changes.iter().filter_map(page_change).collect();
    (!changes.is_empty()).then_some(Delta { index, changes })
}

/// Seconds from a task's creation to its status timestamp.
fn since_created(t: &Task) -> Option<f64> {
    let created = shoal_api::timestamp_to_unix_ms(t.meta.as_ref()?.created_at.as_ref()?);
    let at = shoal_api::timestamp_to_unix_ms(t.status.as_ref()?.timestamp.as_ref()?);
    Some(at.saturating_sub(created) as f64 / 1000.0)
}

/// Feeds the delay histograms from a task write: the first time a task is seen assigned, and running.
fn record_delays(c: &Change, recorders: &Recorders) {
    let (Object::Task(t), Some(Object::Task(old))) = (&c.object, &c.old) else {
        return;
    };
    let (before, now) = (observed(old), observed(t));
    if before < TaskState::Assigned && now >= TaskState::Assigned && now <= TaskState::Running {
        if let Some(s) = since_created(t) {
            recorders.assignment_delay.observe(s);
        }
    }
    if before < TaskState::Running && now == TaskState::Running {
        if let Some(s) = since_created(t) {
            recorders.scheduling_delay.observe(s);
        }
    }
}

/// The feed: its broadcast queue and the subscriber count.
pub struct LiveHub {
    store: Arc<MemoryStore>,
    tx: Mutex<Option<broadcast::Sender<LiveEvent>>>,
    subscribers: Arc<AtomicUsize>,
    /// The store's watch, taken at creation (before any page can subscribe, so that no commit after a
    /// page's snapshot is missed) and read by `run`.
    watch: Mutex<Option<shoal_store::Watch>>,
    /// The index of the last commit the loop has handled.
    handled_index: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for LiveHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveHub").field("subscribers", &self.subscribers.load(Ordering::Relaxed)).finish()
    }
}

/// A subscriber's place, given back when dropped.
#[derive(Debug)]
pub struct SubscriberSlot(Arc<AtomicUsize>);

impl Drop for SubscriberSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Why a subscription was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// `MAX_SUBSCRIBERS` pages are open.
    Full,
    /// The node is stopping.
    Stopping,
}

impl LiveHub {
    /// A feed of `store`'s changes (run it with `run`).
    pub fn new(store: Arc<MemoryStore>) -> Arc<LiveHub> {
        let (tx, _) = broadcast::channel(DELTA_QUEUE);
        let watch = Mutex::new(Some(store.watch()));
        Arc::new(LiveHub {
            store,
            tx: Mutex::new(Some(tx)),
            subscribers: Arc::new(AtomicUsize::new(0)),
            watch,
            handled_index: Default::default(),
        })
    }

    /// Pages subscribed now.
    pub fn subscribers(&self) -> usize {
        self.subscribers.load(Ordering::Acquire)
    }

    /// The index of the last commit the feed has handled (sent to the pages, or skipped as changing nothing
    /// they show).
    pub fn handled_index(&self) -> u64 {
        self.handled_index.load(Ordering::Acquire)
    }

    /// A new subscription: its place, the deltas from now on, and the snapshot to send first (read after
    /// subscribing, so that every delta after the snapshot's index is received).
    pub fn subscribe(&self) -> Result<(SubscriberSlot, broadcast::Receiver<LiveEvent>, Snapshot), Refused> {
        let taken = self.subscribers.fetch_add(1, Ordering::AcqRel);
        let slot = SubscriberSlot(self.subscribers.clone());
        if taken >= MAX_SUBSCRIBERS {
            return Err(Refused::Full);
        }
        let rx = self.tx.lock().as_ref().map(|tx| tx.subscribe()).ok_or(Refused::Stopping)?;
        Ok((slot, rx, self.snapshot()))
    }

    /// A fresh snapshot (also for a subscriber that lagged).
    pub fn snapshot(&self) -> Snapshot {
        self.store.view(snapshot)
    }

    fn send(&self, event: LiveEvent) {
        if let Some(tx) = self.tx.lock().as_ref() {
            // No subscriber: nothing to do.
            let _ = tx.send(event);
        }
    }

    /// Reads the store's commits until `stop` turns true, sending each commit's delta (and resyncs when it
    /// lagged) and feeding `recorders`. Ends every subscription when it returns.
    pub async fn run(self: Arc<Self>, recorders: Recorders, mut stop: watch::Receiver<bool>) {
        let Some(mut watch) = self.watch.lock().take() else {
            tracing::warn!("live page feed started twice; this one stops");
            return;
        };
        loop {
            let commit = tokio::select! {
                _ = stop.wait_for(|v| *v) => break,
                c = watch.recv() => c,
            };
            match commit {
                Ok(commit) => {
                    for c in &commit.changes {
                        record_delays(c, &recorders);
                    }
                    if let Some(d) = delta(commit.index, &commit.changes) {
                        match serde_json::to_string(&d) {
                            Ok(json) => self.send(LiveEvent::Delta { index: d.index, json: json.into() }),
                            Err(e) => tracing::warn!(error = %e, "live page: a delta could not be encoded"),
                        }
                    }
                    self.handled_index.fetch_max(commit.index, Ordering::AcqRel);
                }
                Err(WatchError::Lagged(n)) => {
                    tracing::debug!(missed = n, "live page feed lagged the store: resyncing its pages");
                    self.send(LiveEvent::Resync);
                }
                Err(WatchError::Closed) => break,
            }
        }
        self.tx.lock().take();
    }
}

#[cfg(test)]
mod tests;
