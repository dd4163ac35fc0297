//! The replicated orchestrator's core: `reconcile_service` brings one replicated service's tasks in line
//! with its spec, as a pure function of a read view, the time and an ID source. One pass:
//!
//! 1. Restart supervisor: every task still meant to run (desired <= RUNNING) that reached a terminal
//!    observed state, or whose node is down or drained, is told to shut down (desired SHUTDOWN); if its restart policy
//!    allows (`restart::should_restart`) and no other task runs in the slot, a replacement is created in the
//!    same slot, with desired READY while the restart delay runs (desired RUNNING when there is none). A
//!    replacement that ends while its own delay runs (rejected while prepared) waits for that delay first.
//! 2. Delayed replacements whose delay has passed are promoted to desired RUNNING.
//! 3. Scaling: slots are classified (runnable / stopping / finished / empty, see `SlotClass`); empty slots
//!    are filled (lowest slot numbers first) until N slots are held; extra slots are removed (desired REMOVE
//!    on their tasks), finished and stopping slots first, then slots whose task is not running, highest
//!    slot number first. One pass creates at most `MAX_NEW_TASKS_PER_PASS` tasks and
//!    `MAX_NEW_TASK_BYTES_PER_PASS` bytes of them (each task holds a copy of the spec); their commit
//!    triggers the next pass, so a large service fills in steps with bounded memory. N is clamped to
//!    `limits::MAX_REPLICAS`: the API refuses more, but a spec stored by an older version may
//!    ask for more; such a service runs `MAX_REPLICAS` tasks, says so in its `UpdateStatus.Message`
//!    (`CLAMPED_MESSAGE`), and can be updated or removed as any other.
//! 4. Rolling update (`update`): tasks whose spec differs from the service's are replaced in batches.
//!
//! Because every decision is derived from the store (no in-memory history), a new leader that reconciles
//! reaches the same result, and a pass over an already reconciled service produces no change.
//!
//! Must not depend on IO, async, the clock (time comes in as `now_ms`) or other subsystems.

use std::collections::BTreeMap;
use std::sync::Arc;

use shoal_api::service_spec::Mode;
use shoal_api::{Meta, Service, Task, TaskState, TaskStatus, Version};
use shoal_store::{Changes, IdSource, StoreObject, Tables};

use crate::limits::MAX_REPLICAS;

use super::{history_key, node_is_down, node_is_drained, observed_state, restart, task_is_live, update};

/// The status message of a task the orchestrator just created.
pub(crate) const PENDING_MESSAGE: &str = "pending task scheduling";
/// The status message of a new task waiting for the allocator (SwarmKit's).
pub(crate) const NEW_MESSAGE: &str = "created";

/// Most tasks one pass over one service creates to fill empty slots.
pub(crate) const MAX_NEW_TASKS_PER_PASS: usize = 10_000;

/// Most encoded bytes of the tasks one pass over one service creates to fill empty slots (at least one
/// task is created, however big).
pub(crate) const MAX_NEW_TASK_BYTES_PER_PASS: usize = 64 << 20;

/// The start of the message a service whose stored replica count is over the limit carries.
pub(crate) const CLAMPED_MESSAGE: &str = "replica count over the limit";

/// The message on a service that asks for `wanted` replicas, over `MAX_REPLICAS`.
pub(crate) fn clamped_message(wanted: u64) -> String {
    format!(
        "{CLAMPED_MESSAGE}: the spec asks for {wanted} replicas, at most {MAX_REPLICAS} run; update the service to \
         {MAX_REPLICAS} or fewer"
    )
}

/// What one reconcile pass decided.
#[derive(Debug, Default)]
pub(crate) struct Reconciled {
    /// The writes to propose (task creations and desired-state updates, maybe a service update-status
    /// update). Empty when the service is in line with its spec.
    pub changes: Changes,
    /// The earliest time (ms since the epoch) at which a pass over this service has more to do even if
    /// nothing changes in the store (a restart delay or an update delay ends). `None`: only events matter.
    pub wake_at_ms: Option<u64>,
}

/// One task of the service as this pass sees it: the stored task, plus the desired state the pass gives it.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// The stored task (for a new task: the task to create).
    pub task: Arc<Task>,
    /// The desired state after this pass.
    pub desired: TaskState,
    /// True when `desired` differs from the stored one.
    pub changed: bool,
    /// True for a task this pass creates.
    pub created: bool,
    /// The key of `Work::slots` it belongs under (its slot; for a global service, its node's key).
    pub key: u64,
}

impl Entry {
    pub(crate) fn stored(task: &Arc<Task>, key: u64) -> Entry {
        Entry { task: task.clone(), desired: task.desired_state(), changed: false, created: false, key }
    }

    /// Sets the desired state (never lowers it, except READY -> RUNNING promotion which raises it).
    pub(crate) fn set_desired(&mut self, state: TaskState) {
        if self.desired != state {
            self.desired = state;
            self.changed = true;
        }
    }

    /// True while the task is meant to run (desired <= RUNNING).
    pub(crate) fn runnable(&self) -> bool {
        self.desired <= TaskState::Running
    }
}

/// How a slot stands, for scaling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum SlotClass {
    /// Its last task ended and its restart policy forbids a replacement: it stays empty but counts as held.
    Finished,
    /// No task is meant to run, but one told to shut down (desired SHUTDOWN) may still run: the slot is
    /// being replaced (stop-first update) and is refilled once that task stops.
    Stopping,
    /// A task is meant to run in it.
    Runnable,
    /// Nothing holds it: it may be filled.
    Empty,
}

/// The working state of one pass over one service.
pub(crate) struct Work<'a> {
    pub tables: &'a Tables,
    pub service: &'a Service,
    pub now_ms: u64,
    pub ids: &'a dyn IdSource,
    /// Tasks by slot.
    pub slots: BTreeMap<u64, Vec<Entry>>,
    pub wake_at_ms: Option<u64>,
    /// Tasks `fill` created in this pass, and their encoded bytes (see `MAX_NEW_TASKS_PER_PASS`).
    pub filled: (usize, usize),
    /// For a global service: what the keys of `slots` stand for (a node each); `None` for a replicated
    /// service, whose keys are slot numbers.
    pub nodes: Option<super::global::NodeKeys>,
}

/// A new task of `service`'s current spec in `slot` (on `node_id` for the global modes, else unplaced): PENDING,
/// desired `desired`, stamped `now_ms`, named by `ids`. The orchestrators of every mode make their tasks here.
/// Its log driver is the spec's, else the cluster's `TaskDefaults.LogDriver` (SwarmKit's `NewTask`).
pub(crate) fn new_service_task(
    tables: &Tables,
    service: &Service,
    slot: u64,
    node_id: String,
    now_ms: u64,
    ids: &dyn IdSource,
    desired: TaskState,
) -> Task {
    let now = shoal_api::timestamp_from_unix_ms(now_ms);
    let spec = service.spec.as_ref();
    let task_spec = spec.and_then(|s| s.task.clone());
    let mut t = Task {
        id: ids.new_id(),
        meta: Some(Meta { version: None, created_at: Some(now), updated_at: Some(now) }),
        log_driver: task_spec
            .as_ref()
            .and_then(|s| s.log_driver.clone())
            .or_else(|| default_log_driver(tables))
            .map(Box::new),
        spec: task_spec.map(Into::into),
        service_id: service.id.clone(),
        slot,
        node_id,
        service_annotations: spec.and_then(|s| s.annotations.clone()).map(Into::into),
        // A task whose networks or ports need allocating starts NEW; the allocator moves it to PENDING.
        status: Some(if crate::allocator::needs_allocation(spec) {
            TaskStatus {
                timestamp: Some(now),
                state: TaskState::New as i32,
                message: NEW_MESSAGE.to_string(),
                ..Default::default()
            }
        } else {
            TaskStatus {
                timestamp: Some(now),
                state: TaskState::Pending as i32,
                message: PENDING_MESSAGE.to_string(),
                ..Default::default()
            }
        }),
        endpoint: service.endpoint.clone().map(Into::into),
        spec_version: Some(service_spec_version(service)),
        ..Default::default()
    };
    t.set_desired_state(desired);
    t
}

/// The cluster's `TaskDefaults.LogDriver`, for tasks whose spec names none.
fn default_log_driver(tables: &Tables) -> Option<shoal_api::Driver> {
    tables
        .clusters()
        .iter()
        .min_by(|a, b| a.id.cmp(&b.id))
        .and_then(|c| c.spec.as_ref()?.task_defaults.as_ref()?.log_driver.clone())
}

/// The version tasks created now carry: the service's `spec_version`, or its object version when unset.
pub(crate) fn service_spec_version(service: &Service) -> Version {
    service.spec_version.unwrap_or(Version { index: service.version() })
}

impl<'a> Work<'a> {
    pub(crate) fn wake_at(&mut self, ms: u64) {
        self.wake_at_ms = Some(self.wake_at_ms.map_or(ms, |w| w.min(ms)));
    }

    /// True when a new task may be created under `key`: always for a slot of a replicated service; for a
    /// global service, only on a node that is ready, active and fits the placement.
    pub(crate) fn may_create(&self, key: u64) -> bool {
        self.nodes.as_ref().is_none_or(|n| n.may_create(key))
    }

    /// A new task for `key` (a slot; for a global service, the key of a node) from the service's current
    /// spec. A global service's task gets slot 0 and its node at creation, as SwarmKit's: the scheduler
    /// only checks that the node takes it.
    pub(crate) fn new_task(&self, key: u64, desired: TaskState) -> Entry {
        let (slot, node_id) = match &self.nodes {
            None => (key, String::new()),
            Some(n) => (0, n.node_id(key).to_string()),
        };
        let t = new_service_task(self.tables, self.service, slot, node_id, self.now_ms, self.ids, desired);
        Entry { task: Arc::new(t), desired, changed: false, created: true, key }
    }

    /// True when a task is up to date with the service's current spec (`dirty::is_task_dirty`).
    pub(crate) fn is_current(&self, t: &Task) -> bool {
        !super::dirty::is_task_dirty(self.service, t, self.tables.nodes().get(&t.node_id).map(|n| &**n))
    }

    fn live(&self, e: &Entry) -> bool {
        !e.created && task_is_live(self.tables, &e.task)
    }

    /// Classifies a slot (see `SlotClass`).
    pub(crate) fn classify(&self, slot: u64) -> SlotClass {
        let Some(entries) = self.slots.get(&slot) else { return SlotClass::Empty };
        if entries.iter().any(Entry::runnable) {
            return SlotClass::Runnable;
        }
        if entries.iter().any(|e| e.desired == TaskState::Shutdown && self.live(e)) {
            return SlotClass::Stopping;
        }
        let newest = entries.iter().max_by(|a, b| history_key(&a.task).cmp(&history_key(&b.task)));
        if let Some(newest) = newest {
            if newest.desired == TaskState::Shutdown
                && self.is_current(&newest.task)
                && !restart::should_restart(&newest.task, entries.iter().map(|e| &*e.task))
            {
                return SlotClass::Finished;
            }
        }
        SlotClass::Empty
    }

    /// Adds a new task under its key.
    pub(crate) fn add(&mut self, entry: Entry) {
        self.slots.entry(entry.key).or_default().push(entry);
    }

    /// Restart supervisor (step 1) and promotion of delayed replacements (step 2).
    pub(crate) fn restart_and_promote(&mut self) {
        let slots: Vec<u64> = self.slots.keys().copied().collect();
        let mut delayed = Vec::new();
        for slot in slots {
            let mut replacement = false;
            {
                let tables = self.tables;
                let entries = self.slots.get_mut(&slot).expect("slot listed");
                let history: Vec<Arc<Task>> = entries.iter().map(|e| e.task.clone()).collect();
                for i in 0..entries.len() {
                    let e = &entries[i];
                    if !e.runnable() || e.created {
                        continue;
                    }
                    let observed = observed_state(&e.task);
                    let node = tables.nodes().get(&e.task.node_id).map(|n| &**n);
                    // A down node's tasks will not report again; a drained node's are moved elsewhere.
                    let node_down = observed >= TaskState::Assigned
                        && !e.task.node_id.is_empty()
                        && (node_is_down(node) || node_is_drained(node));
                    if !observed.is_terminal() && !node_down {
                        continue;
                    }
                    // A replacement that ended within its own restart delay (rejected while it was prepared,
                    // before it could run) is replaced only once that delay has passed, as SwarmKit's restart
                    // supervisor waits: a task that can never start is retried once per delay, not in a burst.
                    if e.desired == TaskState::Ready && !node_down {
                        let at = restart::ready_at_ms(&e.task, self.now_ms);
                        if at > self.now_ms {
                            delayed.push(at);
                            continue;
                        }
                    }
                    let restart = restart::should_restart(&e.task, history.iter().map(|t| &**t));
                    entries[i].set_desired(TaskState::Shutdown);
                    if restart && !entries.iter().any(Entry::runnable) {
                        replacement = true;
                    }
                }
            }
            if replacement && self.may_create(slot) {
                let delay =
                    restart::EffectivePolicy::of(self.service.spec.as_ref().and_then(|s| s.task.as_ref())).delay_ms;
                let desired = if delay > 0 { TaskState::Ready } else { TaskState::Running };
                let e = self.new_task(slot, desired);
                self.add(e);
            }
        }
        let now = self.now_ms;
        let mut wakes = delayed;
        for e in self.slots.values_mut().flat_map(|v| v.iter_mut()) {
            if e.desired == TaskState::Ready && !observed_state(&e.task).is_terminal() {
                let at = restart::ready_at_ms(&e.task, now);
                if at <= now {
                    e.set_desired(TaskState::Running);
                } else {
                    wakes.push(at);
                }
            }
        }
        for w in wakes {
            self.wake_at(w);
        }
    }

    /// Number of slots held (runnable, stopping or finished).
    fn held_slots(&self) -> Vec<(u64, SlotClass)> {
        self.slots.keys().map(|&s| (s, self.classify(s))).filter(|(_, c)| *c != SlotClass::Empty).collect()
    }

    /// Step 3, fill: creates tasks in the lowest empty slots until `replicas` slots are held, at most
    /// `MAX_NEW_TASKS_PER_PASS` tasks and `MAX_NEW_TASK_BYTES_PER_PASS` bytes per pass.
    pub(crate) fn fill(&mut self, replicas: u64) {
        use shoal_api::prost::Message;
        let held = self.held_slots();
        let mut missing = replicas.saturating_sub(held.len() as u64);
        let held: std::collections::HashSet<u64> = held.into_iter().map(|(s, _)| s).collect();
        let mut slot = 0u64;
        let mut task_bytes = None;
        while missing > 0 {
            let (count, bytes) = self.filled;
            if count >= MAX_NEW_TASKS_PER_PASS || (count > 0 && bytes >= MAX_NEW_TASK_BYTES_PER_PASS) {
                break;
            }
            slot += 1;
            if held.contains(&slot) {
                continue;
            }
            let e = self.new_task(slot, TaskState::Running);
            // Every task of a pass has the same spec: measure one.
            let len = *task_bytes.get_or_insert_with(|| e.task.encoded_len());
            self.filled = (count + 1, bytes + len);
            self.add(e);
            missing -= 1;
        }
    }

    /// Step 3, scale down: removes the extra held slots.
    fn scale_down(&mut self, replicas: u64) {
        let held = self.held_slots();
        let extra = held.len().saturating_sub(usize::try_from(replicas).unwrap_or(usize::MAX));
        if extra == 0 {
            return;
        }
        // Cheapest to remove first: finished, stopping, not yet running, running; then highest slot.
        let mut ranked: Vec<(u8, std::cmp::Reverse<u64>)> = held
            .iter()
            .map(|&(slot, class)| {
                let rank = match class {
                    SlotClass::Finished => 0,
                    SlotClass::Stopping => 1,
                    _ => {
                        let running = self.slots[&slot]
                            .iter()
                            .any(|e| e.runnable() && observed_state(&e.task) == TaskState::Running);
                        if running {
                            3
                        } else {
                            2
                        }
                    }
                };
                (rank, std::cmp::Reverse(slot))
            })
            .collect();
        ranked.sort();
        for (_, std::cmp::Reverse(slot)) in ranked.into_iter().take(extra) {
            for e in self.slots.get_mut(&slot).into_iter().flatten() {
                if e.desired < TaskState::Remove {
                    e.set_desired(TaskState::Remove);
                }
            }
        }
    }

    /// Turns the pass into writes: creations, then desired-state updates.
    pub(crate) fn into_changes(self, service_update: Option<Service>) -> Reconciled {
        let mut changes = Changes::new();
        let now = shoal_api::timestamp_from_unix_ms(self.now_ms);
        for e in self.slots.into_values().flatten() {
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
        if let Some(s) = service_update {
            changes.update(s);
        }
        Reconciled { changes, wake_at_ms: self.wake_at_ms }
    }
}

/// The replica count of a replicated service, `None` for other modes.
pub(crate) fn replicas(service: &Service) -> Option<u64> {
    match service.spec.as_ref()?.mode.as_ref()? {
        Mode::Replicated(r) => Some(r.replicas),
        _ => None,
    }
}

/// Reconciles one replicated service (see the module doc). Services of other modes get no change.
/// `now_ms` stamps new tasks and decides restart and update delays; `ids` names new tasks.
pub(crate) fn reconcile_service(tables: &Tables, service: &Service, now_ms: u64, ids: &dyn IdSource) -> Reconciled {
    let Some(wanted) = replicas(service) else { return Reconciled::default() };
    let replicas = wanted.min(MAX_REPLICAS);
    let mut slots: BTreeMap<u64, Vec<Entry>> = BTreeMap::new();
    for t in tables.tasks().by_service(&service.id) {
        slots.entry(t.slot).or_default().push(Entry::stored(t, t.slot));
    }
    let mut work = Work { tables, service, now_ms, ids, slots, wake_at_ms: None, filled: (0, 0), nodes: None };
    work.restart_and_promote();
    work.scale_down(replicas);
    work.fill(replicas);
    let mut service_update = update::rolling_update(&mut work);
    work.fill(replicas);
    if wanted > replicas {
        let message = clamped_message(wanted);
        let current = service_update.as_ref().unwrap_or(service).update_status.as_ref();
        if current.map(|u| u.message.as_str()) != Some(message.as_str()) {
            let mut next = service_update.take().unwrap_or_else(|| service.clone());
            next.update_status.get_or_insert_with(Default::default).message = message;
            service_update = Some(next);
        }
    }
    work.into_changes(service_update)
}

/// The writes for a deleted service: every task of `service_id` not yet marked gets desired REMOVE (the
/// reaper deletes them once they stopped).
pub(crate) fn remove_service_tasks(tables: &Tables, service_id: &str, now_ms: u64) -> Changes {
    let mut changes = Changes::new();
    let now = shoal_api::timestamp_from_unix_ms(now_ms);
    for t in tables.tasks().by_service(service_id) {
        if t.desired_state() < TaskState::Remove {
            let mut t = (**t).clone();
            t.set_desired_state(TaskState::Remove);
            t.meta_mut().updated_at = Some(now);
            changes.update(t);
        }
    }
    changes
}
