//! The orchestrators' async loop, run once per service mode (`Kind`): the replicated orchestrator, the
//! global orchestrator and the jobs orchestrator (replicated and global jobs, `jobs`) are three instances of
//! it, each reconciling only its own services (and the replicated one removing the tasks of deleted
//! services). It subscribes and reads (`view_and_watch`), reconciles every service, then reacts to commits.
//! A service is reconciled again when it is created, updated or removed, when one of its tasks changes in a
//! way a pass reads (`task_change_matters`: created, desired state, node or spec version changed, observed
//! state crossed into assigned or finished, or into running while the service's rolling update is in
//! progress: only the updater waits for RUNNING), when a node holding its tasks goes down (or is removed),
//! and when a restart or update delay it asked for ends. The global instance (and the jobs instance, for
//! global jobs) also reconciles every global service when a node is created or removed, or changes in what
//! decides where global tasks run (status state, spec: availability and labels, platform). A lagging
//! watch makes it reconcile everything again. (Status reports inside a band, such as ACCEPTED, PREPARING
//! and STARTING after ASSIGNED, change nothing a pass decides; a pass costs O(tasks of the service), so
//! reconciling on each of them made a large service's start quadratic.)
//!
//! Bounds: at most `MAX_EVENTS_PER_BATCH` commits are drained before a pass; a pass reads at most
//! `MAX_SERVICES_PER_PASS` services per view; writes carry at most `write::MAX_ACTIONS_PER_WRITE` actions;
//! a service whose write conflicts is retried at most `MAX_ATTEMPTS` times per round (the next event brings
//! it back); the timer sleeps at most `MAX_TIMER_SLEEP_MS` so a moved clock is noticed.
//!
//! Must not depend on other subsystems; only on `ClusterState`.

use std::collections::{BTreeSet, HashMap, HashSet};

use shoal_api::update_status::UpdateState;
use shoal_api::{node_status, Service, Task, TaskState};
use shoal_store::{ActionKind, Commit, Object, Tables, WatchError};
use tokio::sync::watch;

use super::global::{is_global, reconcile_global};
use super::jobs::{is_global_job, is_job, reconcile_job};
use super::replicated::{reconcile_service, remove_service_tasks, replicas, Reconciled};
use crate::state::ClusterState;
use crate::subsystem::{stopped, Subsystem, SubsystemFuture};
use crate::write::{is_conflict, propose_grouped, MAX_ACTIONS_PER_WRITE};

/// Most commits drained from the watch queue before a pass.
pub(super) const MAX_EVENTS_PER_BATCH: usize = 10_000;
/// Most services reconciled from one read view.
pub(super) const MAX_SERVICES_PER_PASS: usize = 1000;
/// Most write attempts for one service in one round.
pub(super) const MAX_ATTEMPTS: u32 = 3;
/// How long a service whose writes conflicted `MAX_ATTEMPTS` times in a row waits before its next try.
pub(super) const CONFLICT_RETRY_MS: u64 = 500;
/// Longest timer sleep, so that a clock that moved is noticed.
pub(super) const MAX_TIMER_SLEEP_MS: u64 = 1000;
/// Pause after a write failed for a reason other than a conflict (e.g. lost leadership).
const BACKOFF_MS: u64 = 100;

/// Which services a loop reconciles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Replicated services, and the tasks of deleted services.
    Replicated,
    /// Global services.
    Global,
    /// Replicated and global jobs.
    Jobs,
}

impl Kind {
    fn owns(self, s: &Service) -> bool {
        match self {
            Kind::Replicated => !is_global(s) && !is_job(s),
            Kind::Global => is_global(s),
            Kind::Jobs => is_job(s),
        }
    }

    /// True when the placement of `s`'s tasks depends on the nodes (a node change reconciles it).
    fn follows_nodes(self, s: &Service) -> bool {
        match self {
            Kind::Replicated => false,
            Kind::Global => is_global(s),
            Kind::Jobs => is_global_job(s),
        }
    }
}

/// The replicated orchestrator subsystem (with the restart supervisor and the rolling updater).
#[derive(Debug, Default)]
pub(crate) struct ReplicatedOrchestrator;

impl Subsystem for ReplicatedOrchestrator {
    fn name(&self) -> &'static str {
        "replicated-orchestrator"
    }

    fn run(&self, state: ClusterState, stop: watch::Receiver<bool>) -> SubsystemFuture {
        Box::pin(run(state, stop, Kind::Replicated))
    }
}

/// The global orchestrator subsystem: one task per eligible node (`global`), with the same restart
/// supervisor and rolling updater.
#[derive(Debug, Default)]
pub(crate) struct GlobalOrchestrator;

impl Subsystem for GlobalOrchestrator {
    fn name(&self) -> &'static str {
        "global-orchestrator"
    }

    fn run(&self, state: ClusterState, stop: watch::Receiver<bool>) -> SubsystemFuture {
        Box::pin(run(state, stop, Kind::Global))
    }
}

/// The jobs orchestrator subsystem: replicated and global jobs run to completion (`jobs`).
#[derive(Debug, Default)]
pub(crate) struct JobsOrchestrator;

impl Subsystem for JobsOrchestrator {
    fn name(&self) -> &'static str {
        "jobs-orchestrator"
    }

    fn run(&self, state: ClusterState, stop: watch::Receiver<bool>) -> SubsystemFuture {
        Box::pin(run(state, stop, Kind::Jobs))
    }
}

/// The services of `kind`; for the replicated loop also services that are gone but still have tasks not
/// marked for removal (never the tasks of no service: network attachments, which `DetachNetwork` removes).
fn all_targets(t: &Tables, kind: Kind) -> BTreeSet<String> {
    let mut ids: BTreeSet<String> = t.services().iter().filter(|s| kind.owns(s)).map(|s| s.id.clone()).collect();
    if kind != Kind::Replicated {
        return ids;
    }
    for task in t.tasks().iter() {
        if task.desired_state() < shoal_api::TaskState::Remove
            && !task.service_id.is_empty()
            && t.services().get(&task.service_id).is_none()
        {
            ids.insert(task.service_id.clone());
        }
    }
    ids
}

struct LoopState {
    kind: Kind,
    pending: BTreeSet<String>,
    /// A node changed in a way that decides where global tasks run: every global service is pending.
    nodes_changed: bool,
    /// Services whose rolling update is in progress (update status UPDATING), as of the last commit seen.
    updating: HashSet<String>,
    down_nodes: HashSet<String>,
    wakes: HashMap<String, u64>,
    /// Services already logged about once (a mode this loop ignores, or a replica count it clamps).
    logged_modes: HashSet<String>,
}

impl Default for LoopState {
    fn default() -> Self {
        LoopState {
            kind: Kind::Replicated,
            pending: BTreeSet::new(),
            nodes_changed: false,
            updating: HashSet::new(),
            down_nodes: HashSet::new(),
            wakes: HashMap::new(),
            logged_modes: HashSet::new(),
        }
    }
}

/// True when a node write changes where global tasks run: a new or removed node, or a changed status
/// state, spec (availability, labels) or platform.
fn node_change_matters(kind: ActionKind, old: Option<&Object>, new: &shoal_api::Node) -> bool {
    let Some(Object::Node(old)) = old else { return true };
    kind == ActionKind::Remove
        || old.status.as_ref().map(|s| s.state) != new.status.as_ref().map(|s| s.state)
        || old.spec != new.spec
        || old.description.as_ref().and_then(|d| d.platform.as_ref())
            != new.description.as_ref().and_then(|d| d.platform.as_ref())
}

impl LoopState {
    fn note(&mut self, commit: &Commit) {
        for ch in &commit.changes {
            match &ch.object {
                Object::Service(s) => {
                    self.pending.insert(s.id.clone());
                    if ch.kind != ActionKind::Remove && is_updating(s) {
                        self.updating.insert(s.id.clone());
                    } else {
                        self.updating.remove(&s.id);
                    }
                }
                // Deletions (the reaper's) do not need a pass.
                Object::Task(t) if ch.kind != ActionKind::Remove && !t.service_id.is_empty() => {
                    let old = match &ch.old {
                        Some(Object::Task(o)) => Some(&**o),
                        _ => None,
                    };
                    if task_change_matters(old, t, self.updating.contains(&t.service_id)) {
                        self.pending.insert(t.service_id.clone());
                    }
                }
                Object::Node(n) => {
                    if self.kind != Kind::Replicated && node_change_matters(ch.kind, ch.old.as_ref(), n) {
                        self.nodes_changed = true;
                    }
                    let down = |o: &Option<Object>| match o {
                        Some(Object::Node(n)) => n.status.as_ref().map(|s| s.state()) == Some(node_status::State::Down),
                        _ => false,
                    };
                    let drained = |o: &Option<Object>| match o {
                        Some(Object::Node(n)) => super::node_is_drained(Some(n)),
                        _ => false,
                    };
                    let now_down = ch.kind == ActionKind::Remove
                        || n.status.as_ref().map(|s| s.state()) == Some(node_status::State::Down);
                    let now_drained = super::node_is_drained(Some(n)) && !drained(&ch.old);
                    if now_drained || (now_down && !(ch.kind == ActionKind::Update && down(&ch.old))) {
                        self.down_nodes.insert(n.id.clone());
                    }
                }
                _ => {}
            }
        }
    }
}

/// True while the service's rolling update (or rollback) is in progress.
fn is_updating(s: &Service) -> bool {
    matches!(s.update_status.as_ref().map(|u| u.state()), Some(UpdateState::Updating | UpdateState::RollbackStarted))
}

/// Where a task's observed state stands for a reconcile pass: not yet assigned, assigned (or running),
/// running during an update, finished. A pass reads the observed state only through these bands: restart
/// on finished, node down for assigned and later; RUNNING matters only to the rolling updater (a batch is
/// in flight until its new tasks run; START_FIRST stops the old task then) and to the order of a
/// scale-down, which runs in a pass a service change triggers.
fn observed_band(t: &Task, updating: bool) -> u8 {
    let s = super::observed_state(t);
    if s.is_terminal() {
        3
    } else if s == TaskState::Running && updating {
        2
    } else if s >= TaskState::Assigned {
        1
    } else {
        0
    }
}

/// True when a task write can change what reconciling its service decides: a new task (or one whose old
/// version is not known), or a changed desired state, node, spec version or observed-state band.
fn task_change_matters(old: Option<&Task>, new: &Task, updating: bool) -> bool {
    let Some(old) = old else { return true };
    old.desired_state != new.desired_state
        || old.node_id != new.node_id
        || old.spec_version != new.spec_version
        || observed_band(old, updating) != observed_band(new, updating)
}

async fn run(state: ClusterState, mut stop: watch::Receiver<bool>, kind: Kind) {
    let ((targets, updating), mut events) = state.store.view_and_watch(|t| {
        (all_targets(t, kind), t.services().iter().filter(|s| is_updating(s)).map(|s| s.id.clone()).collect())
    });
    let mut ls = LoopState { kind, pending: targets, updating, ..Default::default() };
    tracing::info!(services = ls.pending.len(), ?kind, "orchestrator started");
    loop {
        let now = state.clock.now_unix_ms();
        let due: Vec<String> = ls.wakes.iter().filter(|(_, &w)| w <= now).map(|(k, _)| k.clone()).collect();
        for id in due {
            ls.wakes.remove(&id);
            ls.pending.insert(id);
        }
        if std::mem::take(&mut ls.nodes_changed) {
            let ids: Vec<String> = state
                .store
                .view(|t| t.services().iter().filter(|s| kind.follows_nodes(s)).map(|s| s.id.clone()).collect());
            ls.pending.extend(ids);
        }
        if !ls.down_nodes.is_empty() {
            let nodes = std::mem::take(&mut ls.down_nodes);
            state.store.view(|t| {
                for n in &nodes {
                    for task in t.tasks().by_node(n) {
                        ls.pending.insert(task.service_id.clone());
                    }
                }
            });
        }
        if !ls.pending.is_empty() && !reconcile_pending(&state, &mut ls).await {
            tokio::select! {
                biased;
                _ = stopped(&mut stop) => return,
                _ = state.sleep_ms(BACKOFF_MS) => {}
            }
            continue;
        }
        let now = state.clock.now_unix_ms();
        let sleep_ms = ls.wakes.values().min().map(|w| w.saturating_sub(now).clamp(1, MAX_TIMER_SLEEP_MS));
        // Biased (stop, events, timer) so that a simulation replays: wakes are taken at the top of the loop
        // whichever branch ends the wait.
        tokio::select! {
            biased;
            _ = stopped(&mut stop) => return,
            r = events.recv() => match r {
                Ok(commit) => {
                    ls.note(&commit);
                    for _ in 1..MAX_EVENTS_PER_BATCH {
                        match events.try_recv() {
                            Ok(c) => ls.note(&c),
                            Err(tokio::sync::broadcast::error::TryRecvError::Lagged(_)) => {
                                lagged(&state, &mut ls);
                            }
                            Err(_) => break,
                        }
                    }
                }
                Err(WatchError::Lagged(n)) => {
                    tracing::warn!(missed = n, "orchestrator watch lagged; reconciling every service");
                    lagged(&state, &mut ls);
                }
                Err(WatchError::Closed) => return,
            },
            _ = state.sleep_ms(sleep_ms.unwrap_or(0)), if sleep_ms.is_some() => {}
        }
    }
}

/// After missed commits: every service is pending again, and the set of updating services is read anew.
fn lagged(state: &ClusterState, ls: &mut LoopState) {
    let kind = ls.kind;
    let (targets, updating) = state.store.view(|t| {
        (all_targets(t, kind), t.services().iter().filter(|s| is_updating(s)).map(|s| s.id.clone()).collect())
    });
    ls.pending.extend(targets);
    ls.updating = updating;
}

/// Reconciles every pending service, retrying conflicts. Returns false when a write failed for another
/// reason (the caller backs off; pending services stay pending).
async fn reconcile_pending(state: &ClusterState, ls: &mut LoopState) -> bool {
    let mut attempts: HashMap<String, u32> = HashMap::new();
    while !ls.pending.is_empty() {
        let batch: Vec<String> = std::iter::from_fn(|| ls.pending.pop_first()).take(MAX_SERVICES_PER_PASS).collect();
        let now = state.clock.now_unix_ms();
        let results: Vec<(String, Reconciled)> = state.store.view(|t| {
            batch
                .iter()
                .map(|id| {
                    let r = match t.services().get(id) {
                        Some(s) if ls.kind == Kind::Jobs => reconcile_job(t, s, now, state.ids.as_ref()),
                        Some(s) if ls.kind == Kind::Global => {
                            if !is_global(s) {
                                return (id.clone(), Reconciled::default());
                            }
                            reconcile_global(t, s, now, state.ids.as_ref())
                        }
                        // Gone: the replicated loop removes the tasks (the global one leaves them to it).
                        None if ls.kind != Kind::Replicated => Reconciled::default(),
                        Some(s) if is_global(s) || is_job(s) => Reconciled::default(),
                        Some(s) => {
                            if replicas(s).is_none() && ls.logged_modes.insert(id.clone()) {
                                tracing::info!(service = %id, "service mode is not replicated; the replicated \
                                                               orchestrator leaves it alone");
                            }
                            let wanted = replicas(s).unwrap_or(0);
                            if wanted > crate::limits::MAX_REPLICAS && ls.logged_modes.insert(id.clone()) {
                                tracing::warn!(service = %id, "{}", super::replicated::clamped_message(wanted));
                            }
                            reconcile_service(t, s, now, state.ids.as_ref())
                        }
                        None => Reconciled { changes: remove_service_tasks(t, id, now), wake_at_ms: None },
                    };
                    (id.clone(), r)
                })
                .collect()
        });
        let mut groups = Vec::with_capacity(results.len());
        for (id, r) in results {
            match r.wake_at_ms {
                Some(w) => ls.wakes.insert(id.clone(), w),
                None => ls.wakes.remove(&id),
            };
            groups.push((id, r.changes));
        }
        let mut ok = true;
        for (id, e) in propose_grouped(state, groups, MAX_ACTIONS_PER_WRITE).await {
            if !is_conflict(&e) {
                ls.pending.insert(id);
                ok = false;
                continue;
            }
            let n = attempts.entry(id.clone()).or_insert(0);
            *n += 1;
            if *n < MAX_ATTEMPTS {
                ls.pending.insert(id);
            } else {
                // Not dropped: a removed service has no next change, and its tasks would run on (the simulation
                // found one, its writes lost three times to the agent's status updates).
                let retry_at = state.clock.now_unix_ms().saturating_add(CONFLICT_RETRY_MS);
                tracing::warn!(service = %id, error = %e, retry_in_ms = CONFLICT_RETRY_MS, "writes of this service \
                                                                                            keep conflicting; trying \
                                                                                            again later");
                ls.wakes.entry(id.clone()).and_modify(|w| *w = (*w).min(retry_at)).or_insert(retry_at);
            }
        }
        if !ok {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use shoal_api::update_status::UpdateState;
    use shoal_api::{Service, Task, TaskState, TaskStatus, UpdateStatus};
    use shoal_store::{ActionKind, Change, Commit, Object};

    use super::{task_change_matters, LoopState};

    fn task(state: TaskState, desired: TaskState, node: &str) -> Task {
        let mut t = Task {
            id: "t1".into(),
            service_id: "s1".into(),
            node_id: node.into(),
            status: Some(TaskStatus { state: state as i32, ..Default::default() }),
            ..Default::default()
        };
        t.set_desired_state(desired);
        t
    }

    fn task_commit(old: Option<Task>, new: Task) -> Commit {
        let kind = if old.is_some() { ActionKind::Update } else { ActionKind::Create };
        Commit {
            index: 1,
            changes: vec![Change {
                kind,
                object: Object::Task(Arc::new(new)),
                old: old.map(|o| Object::Task(Arc::new(o))),
            }],
        }
    }

    fn pending_after(old: Option<Task>, new: Task) -> bool {
        let mut ls = LoopState::default();
        ls.note(&task_commit(old, new));
        ls.pending.contains("s1")
    }

    fn service_commit(state: Option<UpdateState>) -> Commit {
        let s = Service {
            id: "s1".into(),
            update_status: state.map(|st| UpdateStatus { state: st as i32, ..Default::default() }),
            ..Default::default()
        };
        Commit {
            index: 1,
            changes: vec![Change { kind: ActionKind::Update, object: Object::Service(Arc::new(s)), old: None }],
        }
    }

    #[test]
    fn a_full_pass_targets_gone_services_but_never_the_tasks_of_no_service() {
        let store = shoal_store::MemoryStore::new(16);
        let mut c = shoal_store::Changes::new();
        c.create(task(TaskState::Running, TaskState::Running, "n1"));
        let mut attachment = task(TaskState::Running, TaskState::Running, "n1");
        attachment.id = "a1".into();
        attachment.service_id = String::new();
        c.create(attachment);
        store.apply(1, c.actions()).unwrap();
        let targets = store.view(|t| super::all_targets(t, super::Kind::Replicated));
        assert_eq!(targets.into_iter().collect::<Vec<_>>(), ["s1"], "a network attachment is no service's task");
    }

    #[test]
    fn running_matters_only_while_the_service_updates() {
        use TaskState::*;
        let r = Running;
        let started = || task_commit(Some(task(Starting, r, "n1")), task(Running, r, "n1"));
        let mut ls = LoopState::default();
        ls.note(&started());
        assert!(ls.pending.is_empty(), "a task running outside an update changes no pass");
        ls.note(&service_commit(Some(UpdateState::Updating)));
        ls.pending.clear();
        ls.note(&started());
        assert!(ls.pending.contains("s1"), "the updater waits for its new tasks to run");
        ls.note(&service_commit(Some(UpdateState::Completed)));
        ls.pending.clear();
        ls.note(&started());
        assert!(ls.pending.is_empty());
    }

    #[test]
    fn status_reports_inside_a_band_do_not_reconcile() {
        use TaskState::*;
        let r = Running;
        // Agent progress between assignment and running, and repeated reports: no pass.
        for (a, b) in [
            (Assigned, Accepted),
            (Accepted, Preparing),
            (Preparing, Starting),
            (Starting, Running),
            (Running, Running),
        ] {
            assert!(!pending_after(Some(task(a, r, "n1")), task(b, r, "n1")), "{a:?} -> {b:?}");
        }
        assert!(!pending_after(Some(task(Failed, Shutdown, "n1")), task(Failed, Shutdown, "n1")));
    }

    #[test]
    fn changes_a_pass_reads_reconcile() {
        use TaskState::*;
        let r = Running;
        // A new task; assignment; running; finished; a new desired state; another node.
        assert!(pending_after(None, task(New, r, "")));
        assert!(pending_after(Some(task(Pending, r, "")), task(Assigned, r, "n1")));
        for end in [Complete, Failed, Rejected, Shutdown, Orphaned] {
            assert!(pending_after(Some(task(Running, r, "n1")), task(end, r, "n1")), "{end:?}");
            assert!(pending_after(Some(task(Preparing, r, "n1")), task(end, r, "n1")), "{end:?}");
        }
        assert!(pending_after(Some(task(Running, r, "n1")), task(Running, Shutdown, "n1")));
        assert!(pending_after(Some(task(Assigned, r, "n1")), task(Assigned, r, "n2")));
        let mut bumped = task(Running, r, "n1");
        bumped.spec_version = Some(Default::default());
        assert!(task_change_matters(Some(&task(Running, r, "n1")), &bumped, false));
    }
}
