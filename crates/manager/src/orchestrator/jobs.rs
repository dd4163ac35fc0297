//! The jobs orchestrator's core: `reconcile_job` runs a replicated job (`ReplicatedJob {max_concurrent,
//! total_completions}`) or a global job (one run per eligible node) to completion, as a pure function of a
//! read view, the time and an ID source (SwarmKit's `orchestrator/jobs`: one orchestrator for both job
//! modes, one reconcile per service).
//!
//! A job runs in iterations: `Service.job_status.job_iteration.index` is set to 0 when the service is
//! created and raised by one on every spec update (`docker service update --force` included, see
//! `controlapi::service`). Every task carries the iteration it was made for (`Task.job_iteration`); only the
//! current iteration's tasks count. One pass:
//!
//! 1. Tasks of another iteration still meant to run (desired <= COMPLETE, not observed COMPLETE) get
//!    desired SHUTDOWN: they become history, the reaper trims them like any old task. (The new iteration
//!    does not wait for them to stop.)
//! 2. Job tasks are created with desired COMPLETE, as SwarmKit's: the agent runs them through RUNNING and
//!    they end COMPLETE (exit 0) or FAILED. A task that ended COMPLETE is never restarted, whatever the
//!    restart condition (ANY acts as ON_FAILURE for jobs, as SwarmKit's restart supervisor). A task that
//!    failed (or whose node is down or drained, for a replicated job) gets desired SHUTDOWN and, when its
//!    restart policy allows (`restart::restarts_in_window` within `max_attempts`, condition not NONE), a
//!    replacement under the same key (slot, or node) with desired READY until the restart delay ends, then
//!    COMPLETE. A key whose last task failed and may not restart is "exhausted": it holds its place and
//!    gets no new task in this iteration (SwarmKit would create a fresh task at once, with no delay; that
//!    makes `--restart-condition none` loop), so such a job does not reach its total.
//! 3. Replicated job: each completion has its own slot, numbered 0 to `total_completions - 1` (the docker
//!    CLI's progress reads slots that way). Slots holding a task meant to run count as running; new tasks
//!    go into the lowest empty slots, as many as `max_concurrent - running` and `total - complete -
//!    running - exhausted` allow, so at most `max_concurrent` tasks of the iteration are meant to run at
//!    once, and exactly `total_completions` end COMPLETE.
//! 4. Global job: each node is a key. A node that is ready, active and matches the placement
//!    (`global::node_eligibility`) gets one task per iteration if it holds none of this iteration (a node
//!    joining later gets one for the current iteration); a paused node keeps what it runs; a node that is
//!    gone, down, drained or no longer matching has its unfinished task shut down, and gets a new one when it
//!    is eligible again (unless its task completed).
//!
//! One pass creates at most `replicated::MAX_NEW_TASKS_PER_PASS` tasks and `MAX_NEW_TASK_BYTES_PER_PASS`
//! bytes; their commit triggers the next pass. Everything is read from the store, so a new leader resumes a
//! job where the old one left it.
//!
//! Must not depend on IO, async, the clock or other subsystems (time comes in as `now_ms`).

use std::collections::BTreeMap;
use std::sync::Arc;

use shoal_api::prost::Message;
use shoal_api::restart_policy::RestartCondition;
use shoal_api::service_spec::Mode;
use shoal_api::{Service, Task, TaskState, Version};
use shoal_store::{Changes, IdSource, StoreObject, Tables};

use super::global::{node_eligibility, node_index, Eligibility};
use super::replicated::{Reconciled, MAX_NEW_TASKS_PER_PASS, MAX_NEW_TASK_BYTES_PER_PASS};
use super::restart::{restarts_in_window, EffectivePolicy};
use super::{history_key, node_is_down, node_is_drained, observed_state, task_is_live};

/// True for a replicated job or a global job.
pub fn is_job(service: &Service) -> bool {
    matches!(service.spec.as_ref().and_then(|s| s.mode.as_ref()), Some(Mode::ReplicatedJob(_) | Mode::GlobalJob(_)))
}

/// True for a global job.
pub(crate) fn is_global_job(service: &Service) -> bool {
    matches!(service.spec.as_ref().and_then(|s| s.mode.as_ref()), Some(Mode::GlobalJob(_)))
}

/// The job iteration the service is on (0 when it has no job status).
pub fn current_iteration(service: &Service) -> u64 {
    service.job_status.as_ref().and_then(|j| j.job_iteration.as_ref()).map_or(0, |v| v.index)
}

/// True when `task` belongs to the service's current job iteration.
pub fn in_iteration(task: &Task, iteration: u64) -> bool {
    task.job_iteration.as_ref().is_some_and(|v| v.index == iteration)
}

/// True while a job task is meant to run or has completed (desired <= COMPLETE).
fn active(desired: TaskState) -> bool {
    desired <= TaskState::Complete
}

/// True when `task`, which ended without completing (or whose node is lost), gets a replacement: its
/// restart condition is not NONE and the restarts already made under its key are fewer than
/// `max_attempts` (0: unlimited). A COMPLETE task is never restarted.
pub(crate) fn should_restart_job<'a>(task: &Task, history: impl IntoIterator<Item = &'a Task>) -> bool {
    if observed_state(task) == TaskState::Complete {
        return false;
    }
    let policy = EffectivePolicy::of(task.spec.as_deref());
    policy.condition != RestartCondition::None
        && (policy.max_attempts == 0 || restarts_in_window(task, history, &policy) < policy.max_attempts)
}

/// How one key (a slot, or a node) of the current iteration stands after the restart step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyClass {
    /// A task of it completed.
    Complete,
    /// A task of it is meant to run (pending, running, or waiting out its restart delay).
    Running,
    /// A task told to stop may still run: wait before putting another there.
    Stopping,
    /// Its last task failed and its restart policy allows no more.
    Exhausted,
    /// Nothing holds it.
    Empty,
}

/// One task as a pass sees it: the stored task, and the desired state the pass gives it.
struct Entry {
    task: Arc<Task>,
    desired: TaskState,
    changed: bool,
    created: bool,
}

impl Entry {
    fn stored(task: &Arc<Task>) -> Entry {
        Entry { task: task.clone(), desired: task.desired_state(), changed: false, created: false }
    }

    fn set_desired(&mut self, state: TaskState) {
        if self.desired != state {
            self.desired = state;
            self.changed = true;
        }
    }
}

/// The working state of one pass over one job.
struct Pass<'a> {
    tables: &'a Tables,
    service: &'a Service,
    now_ms: u64,
    ids: &'a dyn IdSource,
    iteration: u64,
    /// The current iteration's tasks by key (slot, or index into `nodes`).
    keys: BTreeMap<u64, Vec<Entry>>,
    /// Tasks of other iterations the pass changes.
    others: Vec<Entry>,
    /// For a global job: the node of each key.
    nodes: Vec<String>,
    wake_at_ms: Option<u64>,
    /// Tasks created in this pass and their bytes (see `MAX_NEW_TASKS_PER_PASS`).
    made: (usize, usize),
}

impl<'a> Pass<'a> {
    fn wake_at(&mut self, ms: u64) {
        self.wake_at_ms = Some(self.wake_at_ms.map_or(ms, |w| w.min(ms)));
    }

    fn global(&self) -> bool {
        is_global_job(self.service)
    }

    /// A new task for `key` of the current iteration.
    fn new_task(&self, key: u64, desired: TaskState) -> Entry {
        let (slot, node_id) =
            if self.global() { (0, self.nodes[node_index(key)].clone()) } else { (key, String::new()) };
        let mut t = super::replicated::new_service_task(
            self.tables,
            self.service,
            slot,
            node_id,
            self.now_ms,
            self.ids,
            desired,
        );
        t.job_iteration = Some(Version { index: self.iteration });
        Entry { task: Arc::new(t), desired, changed: false, created: true }
    }

    /// True when the pass may still create a task (the per-pass bounds).
    fn may_make(&self) -> bool {
        let (count, bytes) = self.made;
        count < MAX_NEW_TASKS_PER_PASS && (count == 0 || bytes < MAX_NEW_TASK_BYTES_PER_PASS)
    }

    fn add(&mut self, key: u64, e: Entry) {
        let (count, bytes) = self.made;
        self.made = (count + 1, bytes + e.task.encoded_len());
        self.keys.entry(key).or_default().push(e);
    }

    /// Step 2 for one key: failed tasks are shut down and replaced when their policy allows (and `may_create`);
    /// delayed replacements whose delay ended are told to run.
    fn restart_key(&mut self, key: u64, may_create: bool) {
        let tables = self.tables;
        let global = self.global();
        let entries = self.keys.get_mut(&key).expect("key listed");
        // The common case of a large job: a slot whose task completed (and its history). Nothing to decide.
        if entries.iter().all(|e| !active(e.desired) || observed_state(&e.task) == TaskState::Complete) {
            return;
        }
        // A task of the key completed (one given up for its lost node may still complete): the key is done,
        // any other task of it stops.
        if entries.iter().any(|e| observed_state(&e.task) == TaskState::Complete) {
            for e in entries.iter_mut() {
                if active(e.desired) && observed_state(&e.task) != TaskState::Complete {
                    e.set_desired(TaskState::Shutdown);
                }
            }
            return;
        }
        let history: Vec<Arc<Task>> = entries.iter().map(|e| e.task.clone()).collect();
        let mut replace = false;
        for e in entries.iter_mut() {
            if !active(e.desired) || e.created {
                continue;
            }
            let observed = observed_state(&e.task);
            if observed == TaskState::Complete {
                continue;
            }
            let node = tables.nodes().get(&e.task.node_id).map(|n| &**n);
            // A replicated job's task on a lost node is run elsewhere; a global job's stays with its node.
            let node_lost = !global
                && observed >= TaskState::Assigned
                && !e.task.node_id.is_empty()
                && (node_is_down(node) || node_is_drained(node));
            if !observed.is_terminal() && !node_lost {
                continue;
            }
            e.set_desired(TaskState::Shutdown);
            if should_restart_job(&e.task, history.iter().map(|t| &**t)) {
                replace = true;
            }
        }
        let entries = &self.keys[&key];
        if replace && may_create && !entries.iter().any(|e| active(e.desired)) {
            let delay = EffectivePolicy::of(self.service.spec.as_ref().and_then(|s| s.task.as_ref())).delay_ms;
            let e = self.new_task(key, if delay > 0 { TaskState::Ready } else { TaskState::Complete });
            self.add(key, e);
        }
        let now = self.now_ms;
        let mut wakes = Vec::new();
        for e in self.keys.get_mut(&key).into_iter().flatten() {
            if e.desired == TaskState::Ready {
                let at = super::restart::ready_at_ms(&e.task, now);
                if at <= now {
                    e.set_desired(TaskState::Complete);
                } else {
                    wakes.push(at);
                }
            }
        }
        for w in wakes {
            self.wake_at(w);
        }
    }

    /// How a key stands (see `KeyClass`).
    fn classify(&self, key: u64) -> KeyClass {
        let Some(entries) = self.keys.get(&key) else { return KeyClass::Empty };
        if entries.iter().any(|e| observed_state(&e.task) == TaskState::Complete) {
            return KeyClass::Complete;
        }
        if entries.iter().any(|e| active(e.desired)) {
            return KeyClass::Running;
        }
        let live = |e: &Entry| !e.created && e.desired == TaskState::Shutdown && task_is_live(self.tables, &e.task);
        if entries.iter().any(live) {
            return KeyClass::Stopping;
        }
        let newest = entries.iter().max_by(|a, b| history_key(&a.task).cmp(&history_key(&b.task)));
        match newest {
            Some(n) if !should_restart_job(&n.task, entries.iter().map(|e| &*e.task)) => KeyClass::Exhausted,
            _ => KeyClass::Empty,
        }
    }

    fn into_changes(self) -> Reconciled {
        let mut changes = Changes::new();
        let now = shoal_api::timestamp_from_unix_ms(self.now_ms);
        for e in self.keys.into_values().flatten().chain(self.others) {
            if e.created {
                let mut t = (*e.task).clone();
                t.set_desired_state(e.desired);
                changes.create(t);
            } else if e.changed {
                let mut t = (*e.task).clone();
                t.set_desired_state(e.desired);
                t.meta_mut().updated_at = Some(now);
                changes.update(t);
            }
        }
        Reconciled { changes, wake_at_ms: self.wake_at_ms }
    }
}

/// What a replicated job's current iteration holds: slots with a completed task, with a task meant to run,
/// and exhausted ones.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct JobCounts {
    /// Slots (or nodes) whose task completed.
    pub complete: u64,
    /// Slots (or nodes) with a task meant to run.
    pub running: u64,
    /// Slots (or nodes) whose last task failed and may not restart.
    pub exhausted: u64,
}

/// Reconciles one job (see the module doc). Services of other modes get no change.
pub(crate) fn reconcile_job(tables: &Tables, service: &Service, now_ms: u64, ids: &dyn IdSource) -> Reconciled {
    if !is_job(service) {
        return Reconciled::default();
    }
    let iteration = current_iteration(service);
    let mut pass = Pass {
        tables,
        service,
        now_ms,
        ids,
        iteration,
        keys: BTreeMap::new(),
        others: Vec::new(),
        nodes: Vec::new(),
        wake_at_ms: None,
        made: (0, 0),
    };
    let global = is_global_job(service);
    let mut node_key: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    if global {
        for n in tables.nodes().iter() {
            node_key.insert(n.id.clone(), pass.nodes.len() as u64);
            pass.nodes.push(n.id.clone());
        }
    }
    // No order is needed within a key: the restart count sorts what it reads, `classify` looks for the newest.
    for t in tables.tasks().by_service(&service.id) {
        if !in_iteration(t, iteration) {
            // Step 1: an older iteration's task still meant to run becomes history.
            if active(t.desired_state()) && observed_state(t) != TaskState::Complete {
                let mut e = Entry::stored(t);
                e.set_desired(TaskState::Shutdown);
                pass.others.push(e);
            }
            continue;
        }
        let key = if global {
            *node_key.entry(t.node_id.clone()).or_insert_with(|| {
                pass.nodes.push(t.node_id.clone());
                pass.nodes.len() as u64 - 1
            })
        } else {
            t.slot
        };
        pass.keys.entry(key).or_default().push(Entry::stored(t));
    }
    if global {
        reconcile_global_job(&mut pass);
    } else {
        reconcile_replicated_job(&mut pass);
    }
    pass.into_changes()
}

fn reconcile_replicated_job(pass: &mut Pass<'_>) {
    let Some(Mode::ReplicatedJob(rj)) = pass.service.spec.as_ref().and_then(|s| s.mode.as_ref()) else { return };
    let (max_concurrent, total) = (rj.max_concurrent, rj.total_completions);
    let keys: Vec<u64> = pass.keys.keys().copied().collect();
    for &k in &keys {
        pass.restart_key(k, true);
    }
    let mut counts = JobCounts::default();
    let mut empty = std::collections::HashSet::new();
    for &k in &keys {
        match pass.classify(k) {
            KeyClass::Complete => counts.complete += 1,
            KeyClass::Running | KeyClass::Stopping => counts.running += 1,
            KeyClass::Exhausted => counts.exhausted += 1,
            KeyClass::Empty => {
                empty.insert(k);
            }
        }
    }
    let room = max_concurrent.saturating_sub(counts.running);
    let left = total.saturating_sub(counts.complete + counts.running + counts.exhausted);
    let mut wanted = room.min(left);
    // The lowest slots that hold nothing: absent from `keys` (sorted), or classified empty.
    let mut next_key = 0;
    for slot in 0..total {
        if wanted == 0 || !pass.may_make() {
            break;
        }
        while next_key < keys.len() && keys[next_key] < slot {
            next_key += 1;
        }
        let held = next_key < keys.len() && keys[next_key] == slot && !empty.contains(&slot);
        if !held {
            let e = pass.new_task(slot, TaskState::Complete);
            pass.add(slot, e);
            wanted -= 1;
        }
    }
}

fn reconcile_global_job(pass: &mut Pass<'_>) {
    for (i, key) in (0..pass.nodes.len()).zip(0u64..) {
        let node = pass.tables.nodes().get(&pass.nodes[i]).map(|n| &**n);
        let eligibility = node_eligibility(pass.service, node);
        if eligibility == Eligibility::Shutdown {
            // Gone, down, drained or no longer matching: its unfinished task stops, with no replacement.
            for e in pass.keys.get_mut(&key).into_iter().flatten() {
                if active(e.desired) && observed_state(&e.task) != TaskState::Complete {
                    e.set_desired(TaskState::Shutdown);
                }
            }
            continue;
        }
        let create = eligibility == Eligibility::Create;
        if pass.keys.contains_key(&key) {
            pass.restart_key(key, create);
        }
        if create && pass.may_make() && pass.classify(key) == KeyClass::Empty {
            let e = pass.new_task(key, TaskState::Complete);
            pass.add(key, e);
        }
    }
}

/// Counts a replicated job's current iteration (for tests and status): see `JobCounts`.
#[cfg(test)]
pub(crate) fn job_counts(tables: &Tables, service: &Service) -> JobCounts {
    let iteration = current_iteration(service);
    let mut by_key: BTreeMap<(u64, &str), Vec<&Arc<Task>>> = BTreeMap::new();
    let global = is_global_job(service);
    for t in tables.tasks().by_service(&service.id).filter(|t| in_iteration(t, iteration)) {
        let key = if global { (0, t.node_id.as_str()) } else { (t.slot, "") };
        by_key.entry(key).or_default().push(t);
    }
    let mut counts = JobCounts::default();
    for tasks in by_key.values() {
        if tasks.iter().any(|t| observed_state(t) == TaskState::Complete) {
            counts.complete += 1;
        } else if tasks.iter().any(|t| active(t.desired_state())) {
            counts.running += 1;
        } else if let Some(n) = tasks.iter().max_by(|a, b| history_key(a).cmp(&history_key(b))) {
            if !should_restart_job(n, tasks.iter().map(|t| &***t)) {
                counts.exhausted += 1;
            }
        }
    }
    counts
}
