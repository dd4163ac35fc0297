//! The update supervisor, as one step of the per-service reconcile (SwarmKit's `orchestrator/update`): tasks
//! that are not up to date (`dirty::is_task_dirty`) are replaced, `parallelism` slots at a time (0 = all at
//! once), waiting `delay` between batches, in the configured order:
//!
//! - STOP_FIRST (default): the old task gets desired SHUTDOWN; the slot is "stopping" until the old task
//!   stops (observed terminal, never reached a node, or its node is down), then the reconcile's fill step
//!   creates the new task, desired RUNNING. (So two tasks of a slot never run at once.)
//!   An old task that never reached a node gets desired REMOVE instead (`retire`): nothing of it is left to
//!   show, and as the slot's newest task it would hide the running one in `docker service ps`.
//! - START_FIRST: the new task is created at once, desired RUNNING; the old one gets desired SHUTDOWN
//!   when the new one is observed RUNNING.
//!
//! `service.update_status` follows SwarmKit's states. A spec write (the control API) clears it; the first
//! pass that finds a dirty task starts an update: UPDATING, `started_at`, "update in progress". The tasks
//! of this update are those up to date and created at or after `started_at`. A slot is in flight while its
//! new task has not reached RUNNING (or ended), or its old task is still stopping. As SwarmKit's
//! `parallelism` workers, each of which waits `delay` after its slot's new task started, a slot keeps its
//! worker busy while in flight and for `delay` after its new task started; a new slot starts only when fewer
//! than `parallelism` workers are busy (so with parallelism 2 and a delay, batches of two are `delay` apart).
//! A new task that ends FAILED, REJECTED, COMPLETE or ORPHANED while the update is in progress counts as a
//! failure of its slot (observed SHUTDOWN is never a failure: the agent only reports it after the manager
//! asked for it). When failed slots / slots of the service exceed `max_failure_ratio`, the failure action
//! runs:
//!
//! - PAUSE: PAUSED, "update paused due to failure or early termination of task X"; nothing more is
//!   replaced (the restart supervisor still restarts failed tasks) until the next spec write.
//! - ROLLBACK: the service's spec becomes `previous_spec` (and `spec_version` the previous one),
//!   ROLLBACK_STARTED, "update rolled back due to failure or early termination of task X"; the next passes
//!   roll the tasks back with the `rollback` config. A failing rollback is never rolled back: it pauses
//!   (ROLLBACK_PAUSED). A service without a previous spec pauses instead.
//! - CONTINUE: failures are ignored.
//!
//! Once nothing is dirty or in flight, the update is watched for `monitor` more after its last new task
//! started (SwarmKit: for `delay` + 1 s when the delay is at least the monitor period), then COMPLETED
//! ("update completed") or ROLLBACK_COMPLETED ("rollback completed"), with `completed_at`.
//!
//! SwarmKit counts a task's failure only within `monitor` of that task starting, timed in the updater's
//! memory; here everything is derived from the store (so a new leader resumes an update where it was), and
//! a failure counts while the update is in progress, which lasts at least `monitor` past each new task's
//! start.
//!
//! A global service runs the same step with one key per node instead of one per slot (`global`); a node
//! that may not get a new task (paused, see `Work::may_create`) keeps its old one.
//!
//! Must not depend on IO, async or the clock (time comes in through the reconcile's `now_ms`).

use shoal_api::update_config::{FailureAction, UpdateOrder};
use shoal_api::update_status::UpdateState;
use shoal_api::{Service, TaskState, UpdateConfig, UpdateStatus};

use super::replicated::{SlotClass, Work};
use super::{created_ms, observed_state, status_ms, task_is_live};

/// The status message while an update runs.
pub(crate) const UPDATING_MESSAGE: &str = "update in progress";
/// The status message once an update is done.
pub(crate) const COMPLETED_MESSAGE: &str = "update completed";
/// The status message once a rollback is done.
pub(crate) const ROLLBACK_COMPLETED_MESSAGE: &str = "rollback completed";
/// The status message of a rollback the user asked for (`docker service rollback`).
pub(crate) const MANUAL_ROLLBACK_MESSAGE: &str = "manually requested rollback";
/// The monitor period when the config sets none (SwarmKit's default).
pub(crate) const DEFAULT_MONITOR_MS: u64 = 5000;

/// An update config with SwarmKit's defaults applied (parallelism 1, no delay, 5 s monitor, pause on the
/// first failure, stop-first).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct EffectiveUpdateConfig {
    /// Slots replaced at once (0 = all).
    pub parallelism: u64,
    /// Pause between batches.
    pub delay_ms: u64,
    /// How long a new task is watched for failure after it starts.
    pub monitor_ms: u64,
    /// What to do when too many new tasks fail.
    pub failure_action: FailureAction,
    /// The fraction of slots whose new task may fail before `failure_action` runs.
    pub max_failure_ratio: f32,
    /// Stop the old task first, or start the new one first.
    pub order: UpdateOrder,
}

fn ms(d: Option<&shoal_api::prost_types::Duration>) -> Option<u64> {
    d.map(|d| u64::try_from(shoal_api::duration_from_proto(d).as_millis()).unwrap_or(u64::MAX))
}

impl EffectiveUpdateConfig {
    /// The effective config of an optional `UpdateConfig`.
    pub(crate) fn of(c: Option<&UpdateConfig>) -> EffectiveUpdateConfig {
        match c {
            None => EffectiveUpdateConfig {
                parallelism: 1,
                delay_ms: 0,
                monitor_ms: DEFAULT_MONITOR_MS,
                failure_action: FailureAction::Pause,
                max_failure_ratio: 0.0,
                order: UpdateOrder::StopFirst,
            },
            Some(c) => EffectiveUpdateConfig {
                parallelism: c.parallelism,
                delay_ms: ms(c.delay.as_ref()).unwrap_or(0),
                monitor_ms: ms(c.monitor.as_ref()).unwrap_or(DEFAULT_MONITOR_MS),
                failure_action: c.failure_action(),
                max_failure_ratio: c.max_failure_ratio,
                order: c.order(),
            },
        }
    }

    /// How long the update is watched after its last new task started: the monitor period, or the delay
    /// plus one second when the delay is at least as long (as SwarmKit, so the watch outlasts the delay).
    pub(crate) fn watch_ms(&self) -> u64 {
        if self.delay_ms >= self.monitor_ms {
            self.delay_ms.saturating_add(1000)
        } else {
            self.monitor_ms
        }
    }
}

/// True for an observed state that ends a task meant to run early: it failed, was rejected, exited or was
/// lost. (SHUTDOWN is reported only after the manager asked for it.)
pub(crate) fn is_failure(state: TaskState) -> bool {
    matches!(state, TaskState::Failed | TaskState::Rejected | TaskState::Complete | TaskState::Orphaned)
}

/// The message of a failure action.
pub(crate) fn failure_message(rolling_back: bool, action: FailureAction, has_previous: bool, task_id: &str) -> String {
    let what = "due to failure or early termination of task";
    match (rolling_back, action) {
        (true, _) => format!("rollback paused {what} {task_id}"),
        (false, FailureAction::Rollback) if has_previous => format!("update rolled back {what} {task_id}"),
        (false, FailureAction::Rollback) => {
            format!("update paused {what} {task_id} (no previous spec to roll back to)")
        }
        (false, _) => format!("update paused {what} {task_id}"),
    }
}

/// The service after its failure action (`action` is PAUSE or ROLLBACK; CONTINUE never gets here).
fn after_failure(service: &Service, rolling_back: bool, action: FailureAction, task_id: &str) -> Service {
    let mut svc = service.clone();
    let has_previous = svc.previous_spec.is_some();
    let message = failure_message(rolling_back, action, has_previous, task_id);
    let state = if rolling_back {
        UpdateState::RollbackPaused
    } else if action == FailureAction::Rollback && has_previous {
        svc.spec = svc.previous_spec.take();
        svc.spec_version = svc.previous_spec_version.take();
        UpdateState::RollbackStarted
    } else {
        UpdateState::Paused
    };
    let started_at = service.update_status.as_ref().and_then(|s| s.started_at);
    svc.update_status = Some(UpdateStatus { state: state as i32, started_at, completed_at: None, message });
    svc
}

/// Tells an out-of-date task to stop: desired SHUTDOWN, or REMOVE for one that never reached a node (a
/// restart's replacement still waiting its delay when a rollback came), which the reaper then deletes: kept as
/// history it would be the slot's newest task, what `docker service ps` shows as the current one, in place of
/// the task that runs.
fn retire(e: &mut super::replicated::Entry) {
    let never_placed = e.task.node_id.is_empty() && observed_state(&e.task) < TaskState::Assigned;
    e.set_desired(if never_placed { TaskState::Remove } else { TaskState::Shutdown });
}

/// Where the service's update stands, from its `update_status`, and the config it runs with.
struct Phase {
    /// The status's state.
    state: UpdateState,
    /// A rollback is in progress (it runs with the `rollback` config).
    rolling_back: bool,
    /// An update or a rollback is in progress.
    in_progress: bool,
    cfg: EffectiveUpdateConfig,
    /// When the update in progress started (now when none is): its tasks are those created since.
    started_ms: u64,
}

impl Phase {
    fn of(service: &Service, now_ms: u64) -> Phase {
        let status = service.update_status.as_ref();
        let state = status.map(|s| s.state()).unwrap_or(UpdateState::Unknown);
        let rolling_back = state == UpdateState::RollbackStarted;
        let in_progress = rolling_back || state == UpdateState::Updating;
        let spec = service.spec.as_ref();
        let cfg = EffectiveUpdateConfig::of(spec.and_then(|s| {
            if rolling_back {
                s.rollback.as_ref()
            } else {
                s.update.as_ref()
            }
        }));
        let started_ms = if in_progress {
            status.and_then(|s| s.started_at.as_ref()).map(shoal_api::timestamp_to_unix_ms).unwrap_or(0)
        } else {
            now_ms
        };
        Phase { state, rolling_back, in_progress, cfg, started_ms }
    }
}

/// What one pass over the service's slots finds, and the old tasks it retires where a new one runs.
#[derive(Default)]
struct Survey {
    /// Slots with out-of-date tasks and no new one: to replace.
    dirty: Vec<u64>,
    /// Slots whose replacement is under way.
    in_flight: u64,
    /// When the last of this update's new tasks started.
    last_started_ms: u64,
    /// When each slot whose new task started and is no longer in flight may be followed by another: SwarmKit
    /// runs `parallelism` workers that each wait `delay` after their slot's new task started, so a worker is
    /// busy while its slot is in flight and for `delay` after.
    cooling_until: Vec<u64>,
    /// Slots holding a task (runnable or stopping).
    held: u64,
    /// The first failure of each slot: (when, task ID).
    failures: Vec<(u64, String)>,
}

impl Survey {
    fn of(work: &mut Work<'_>, phase: &Phase) -> Survey {
        let mut survey = Survey::default();
        let slots: Vec<u64> = work.slots.keys().copied().collect();
        for slot in slots {
            let class = work.classify(slot);
            let SlotUpdate { first_started, failure } = this_update_in_slot(work, slot, phase.started_ms);
            let reached_running = first_started.is_some();
            if let Some((_, at)) = first_started {
                survey.last_started_ms = survey.last_started_ms.max(at);
            }
            survey.failures.extend(failure);
            let in_flight_before = survey.in_flight;
            match class {
                SlotClass::Runnable => {
                    survey.held += 1;
                    survey.runnable_slot(work, slot, reached_running, phase);
                }
                SlotClass::Stopping => {
                    survey.held += 1;
                    if stops_an_old_task(work, slot) {
                        survey.in_flight += 1;
                    }
                }
                SlotClass::Finished | SlotClass::Empty => {}
            }
            if let Some((_, at)) = first_started {
                let gate_ms = crate::tasks::wait_end_ms(at, phase.cfg.delay_ms, work.now_ms);
                if phase.in_progress && survey.in_flight == in_flight_before && work.now_ms < gate_ms {
                    survey.cooling_until.push(gate_ms);
                }
            }
        }
        survey
    }

    /// Surveys runnable `slot` (`reached_running`: a task of this update in it reached RUNNING or ended):
    /// dirty, in flight, or done once its old tasks are retired (their new one runs).
    fn runnable_slot(&mut self, work: &mut Work<'_>, slot: u64, reached_running: bool, phase: &Phase) {
        let entries = &work.slots[&slot];
        let (mut old, mut new) = (Vec::new(), Vec::new());
        for (i, e) in entries.iter().enumerate() {
            if e.runnable() {
                if work.is_current(&e.task) {
                    new.push(i);
                } else {
                    old.push(i);
                }
            }
        }
        let new_running = new.iter().any(|&i| observed_state(&entries[i].task) == TaskState::Running);
        if !old.is_empty() && new.is_empty() {
            // A global service's task on a node that may not get a new one (paused) is left as is.
            if work.may_create(slot) {
                self.dirty.push(slot);
            }
        } else if !old.is_empty() && new_running {
            let entries = work.slots.get_mut(&slot).expect("slot listed");
            for i in old {
                retire(&mut entries[i]);
            }
        } else if !old.is_empty() {
            // Start-first: the old task runs until a new one does, even when an earlier new task of
            // this slot already failed (its restart is starting). Counting the slot as done there
            // completed the update with both left to run (found by the simulation, `shoal-sim`).
            self.in_flight += 1;
        } else if !reached_running
            && phase.in_progress
            && new.iter().any(|&i| {
                let t = &entries[i].task;
                observed_state(t) < TaskState::Running && created_ms(t) >= phase.started_ms
            })
        {
            self.in_flight += 1;
        }
    }
}

/// This update's tasks in one slot: those created since it started, up to date.
struct SlotUpdate {
    /// The first of them (by creation) that reached RUNNING or ended, as (created, status time): the slot's
    /// start (restarts of a crash-looping task do not move it).
    first_started: Option<(u64, u64)>,
    /// The slot's first failure among them, as (when, task ID).
    failure: Option<(u64, String)>,
}

/// This update's tasks in `slot` (`started_ms`: when the update started).
fn this_update_in_slot(work: &Work<'_>, slot: u64, started_ms: u64) -> SlotUpdate {
    let mut first_started: Option<(u64, u64)> = None;
    let mut failure: Option<(u64, String)> = None;
    for e in work.slots[&slot].iter().filter(|e| !e.created && created_ms(&e.task) >= started_ms) {
        let observed = observed_state(&e.task);
        if observed < TaskState::Running || !work.is_current(&e.task) {
            continue;
        }
        let (created, at) = (created_ms(&e.task), status_ms(&e.task));
        if first_started.is_none_or(|(c, _)| created < c) {
            first_started = Some((created, at));
        }
        if is_failure(observed) && failure.as_ref().is_none_or(|(f, _)| at < *f) {
            failure = Some((at, e.task.id.clone()));
        }
    }
    SlotUpdate { first_started, failure }
}

/// Whether stopping `slot` still waits for an out-of-date task of its to stop.
fn stops_an_old_task(work: &Work<'_>, slot: u64) -> bool {
    work.slots[&slot].iter().any(|e| {
        e.desired == TaskState::Shutdown
            && !e.created
            && task_is_live(work.tables, &e.task)
            && !work.is_current(&e.task)
    })
}

/// Runs the update step over `work`; returns the service when it changes (its `update_status`, and its
/// spec on a rollback).
pub(crate) fn rolling_update(work: &mut Work<'_>) -> Option<Service> {
    let service = work.service;
    let phase = Phase::of(service, work.now_ms);
    if matches!(phase.state, UpdateState::Paused | UpdateState::RollbackPaused) {
        return None;
    }
    let mut survey = Survey::of(work, &phase);
    let cfg = &phase.cfg;
    if phase.in_progress && cfg.failure_action != FailureAction::Continue && !survey.failures.is_empty() {
        let failures = &mut survey.failures;
        let ratio = failures.len() as f32 / survey.held.max(failures.len() as u64) as f32;
        if ratio > cfg.max_failure_ratio {
            failures.sort();
            return Some(after_failure(service, phase.rolling_back, cfg.failure_action, &failures[0].1));
        }
    }
    let new_status = next_status(work, &phase, &survey);
    start_replacements(work, cfg, survey);
    new_status.map(|s| {
        let mut svc = service.clone();
        svc.update_status = Some(s);
        svc
    })
}

/// The service's next update status, if it changes: completed once nothing is busy and the last new task
/// was watched for the monitor period (until then, a wake-up at its end), updating when an update starts.
fn next_status(work: &mut Work<'_>, phase: &Phase, survey: &Survey) -> Option<UpdateStatus> {
    let status = work.service.update_status.as_ref();
    let busy = !survey.dirty.is_empty() || survey.in_flight > 0;
    let now = shoal_api::timestamp_from_unix_ms(work.now_ms);
    if phase.in_progress && !busy {
        let watch_end = crate::tasks::wait_end_ms(survey.last_started_ms, phase.cfg.watch_ms(), work.now_ms);
        if survey.last_started_ms == 0 || work.now_ms >= watch_end {
            let (state, message) = if phase.rolling_back {
                (UpdateState::RollbackCompleted, ROLLBACK_COMPLETED_MESSAGE)
            } else {
                (UpdateState::Completed, COMPLETED_MESSAGE)
            };
            return Some(UpdateStatus {
                state: state as i32,
                started_at: status.and_then(|s| s.started_at),
                completed_at: Some(now),
                message: message.to_string(),
            });
        }
        work.wake_at(watch_end);
    } else if busy && phase.state == UpdateState::Unknown {
        return Some(UpdateStatus {
            state: UpdateState::Updating as i32,
            started_at: Some(now),
            completed_at: None,
            message: UPDATING_MESSAGE.to_string(),
        });
    }
    None
}

/// Starts replacing as many dirty slots as the free workers allow (all with parallelism 0), in `cfg.order`;
/// with none free, wakes when the first cooling worker frees.
fn start_replacements(work: &mut Work<'_>, cfg: &EffectiveUpdateConfig, survey: Survey) {
    if survey.dirty.is_empty() {
        return;
    }
    let busy_workers = survey.in_flight + survey.cooling_until.len() as u64;
    let available =
        if cfg.parallelism == 0 { survey.dirty.len() as u64 } else { cfg.parallelism.saturating_sub(busy_workers) };
    if available == 0 {
        if let Some(&gate_ms) = survey.cooling_until.iter().min() {
            work.wake_at(gate_ms);
        }
        return;
    }
    for slot in survey.dirty.into_iter().take(usize::try_from(available).unwrap_or(usize::MAX)) {
        match cfg.order {
            UpdateOrder::StopFirst => {
                let stale: Vec<usize> = work.slots[&slot]
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| e.runnable() && !work.is_current(&e.task))
                    .map(|(i, _)| i)
                    .collect();
                let entries = work.slots.get_mut(&slot).expect("slot listed");
                for i in stale {
                    retire(&mut entries[i]);
                }
            }
            UpdateOrder::StartFirst => {
                let e = work.new_task(slot, TaskState::Running);
                work.add(e);
            }
        }
    }
}
