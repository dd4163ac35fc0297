//! The rolling updater, as one step of the replicated reconcile: tasks whose spec differs from the
//! service's current task spec are replaced, `parallelism` slots at a time (0 = all at once), waiting
//! `delay` between batches, in the configured order:
//!
//! - STOP_FIRST (default): the old task gets desired SHUTDOWN; the slot is "stopping" until the old task
//!   stops (observed terminal, never reached a node, or its node is down), then the reconcile's fill step
//!   creates the new task, desired RUNNING. (So two tasks of a slot never run at once.)
//! - START_FIRST: the new task is created at once, desired RUNNING; the old one gets desired SHUTDOWN
//!   when the new one is observed RUNNING.
//!
//! A batch is in flight while its new tasks are not yet RUNNING (or its old tasks not yet stopped); the
//! next batch starts when nothing is in flight and `delay` has passed since the last new task started
//! running. `service.update_status` goes UPDATING (with `started_at`) when an update begins and COMPLETED
//! (with `completed_at`, message "update completed") when no slot is left to update.
//!
//! A global service runs the same step with one key per node instead of one per slot (`global`); a node
//! that may not get a new task (paused, see `Work::may_create`) keeps its old one.
//!
//! Not done yet: `monitor`, `failure_action` and `max_failure_ratio` (no pause or rollback on failures),
//! and rollback to `previous_spec`. All state is read from the store, so a new leader resumes an update.
//!
//! Must not depend on IO, async or the clock (time comes in through the reconcile's `now_ms`).

use shoal_api::update_config::UpdateOrder;
use shoal_api::update_status::UpdateState;
use shoal_api::{Service, TaskState, UpdateConfig, UpdateStatus};

use super::replicated::{SlotClass, Work};
use super::{created_ms, observed_state, status_ms, task_is_live};

/// The status message while an update runs.
pub const UPDATING_MESSAGE: &str = "update in progress";
/// The status message once an update is done.
pub const COMPLETED_MESSAGE: &str = "update completed";

/// An update config with SwarmKit's defaults applied (parallelism 1, no delay, stop-first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EffectiveUpdateConfig {
    /// Slots replaced at once (0 = all).
    pub parallelism: u64,
    /// Pause between batches.
    pub delay_ms: u64,
    /// Stop the old task first, or start the new one first.
    pub order: UpdateOrder,
}

impl EffectiveUpdateConfig {
    /// The effective config of an optional `UpdateConfig`.
    pub fn of(c: Option<&UpdateConfig>) -> EffectiveUpdateConfig {
        match c {
            None => EffectiveUpdateConfig { parallelism: 1, delay_ms: 0, order: UpdateOrder::StopFirst },
            Some(c) => EffectiveUpdateConfig {
                parallelism: c.parallelism,
                delay_ms: c.delay.as_ref().map(|d| shoal_api::duration_from_proto(d).as_millis() as u64).unwrap_or(0),
                order: c.order(),
            },
        }
    }
}

/// Runs the update step over `work`; returns the service with a new `update_status` when it changes.
pub(crate) fn rolling_update(work: &mut Work<'_>) -> Option<Service> {
    let service = work.service;
    let cfg = EffectiveUpdateConfig::of(service.spec.as_ref().and_then(|s| s.update.as_ref()));
    let status = service.update_status.as_ref();
    let was_updating = status.map(|s| s.state()) == Some(UpdateState::Updating);
    let started_ms = if was_updating {
        status.and_then(|s| s.started_at.as_ref()).map(shoal_api::timestamp_to_unix_ms).unwrap_or(0)
    } else {
        work.now_ms
    };

    let mut dirty = Vec::new();
    let mut in_flight = 0u64;
    let mut last_started_ms = 0u64;
    let slots: Vec<u64> = work.slots.keys().copied().collect();
    for slot in slots {
        let class = work.classify(slot);
        let entries = &work.slots[&slot];
        match class {
            SlotClass::Runnable => {
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
                for &i in &new {
                    let t = &entries[i].task;
                    if observed_state(t) >= TaskState::Running && created_ms(t) >= started_ms {
                        last_started_ms = last_started_ms.max(status_ms(t));
                    }
                }
                if !old.is_empty() && new.is_empty() {
                    // A global service's task on a node that may not get a new one (paused) is left as is.
                    if work.may_create(slot) {
                        dirty.push(slot);
                    }
                } else if !old.is_empty() {
                    if new_running {
                        let entries = work.slots.get_mut(&slot).expect("slot listed");
                        for i in old {
                            entries[i].set_desired(TaskState::Shutdown);
                        }
                    } else {
                        in_flight += 1;
                    }
                } else if was_updating
                    && new.iter().any(|&i| {
                        let t = &entries[i].task;
                        observed_state(t) < TaskState::Running && created_ms(t) >= started_ms
                    })
                {
                    in_flight += 1;
                }
            }
            SlotClass::Stopping => {
                let stopping_old = entries.iter().any(|e| {
                    e.desired == TaskState::Shutdown
                        && !e.created
                        && task_is_live(work.tables, &e.task)
                        && !work.is_current(&e.task)
                });
                if stopping_old {
                    in_flight += 1;
                }
            }
            SlotClass::Finished | SlotClass::Empty => {}
        }
    }

    let busy = !dirty.is_empty() || in_flight > 0;
    let now = shoal_api::timestamp_from_unix_ms(work.now_ms);
    let new_status = if busy && !was_updating {
        Some(UpdateStatus {
            state: UpdateState::Updating as i32,
            started_at: Some(now),
            completed_at: None,
            message: UPDATING_MESSAGE.to_string(),
        })
    } else if !busy && was_updating {
        Some(UpdateStatus {
            state: UpdateState::Completed as i32,
            started_at: status.and_then(|s| s.started_at),
            completed_at: Some(now),
            message: COMPLETED_MESSAGE.to_string(),
        })
    } else {
        None
    };

    if !dirty.is_empty() {
        let gate_ms = last_started_ms.saturating_add(cfg.delay_ms);
        let delayed =
            was_updating && in_flight == 0 && cfg.delay_ms > 0 && last_started_ms > 0 && work.now_ms < gate_ms;
        if delayed {
            work.wake_at(gate_ms);
        } else {
            let available =
                if cfg.parallelism == 0 { dirty.len() as u64 } else { cfg.parallelism.saturating_sub(in_flight) };
            for slot in dirty.into_iter().take(available as usize) {
                match cfg.order {
                    UpdateOrder::StopFirst => {
                        let current = work.service.spec.as_ref().and_then(|s| s.task.as_ref());
                        for e in work.slots.get_mut(&slot).into_iter().flatten() {
                            if e.runnable() && e.task.spec.as_ref() != current {
                                e.set_desired(TaskState::Shutdown);
                            }
                        }
                    }
                    UpdateOrder::StartFirst => {
                        let e = work.new_task(slot, TaskState::Running);
                        work.add(e);
                    }
                }
            }
        }
    }

    new_status.map(|s| {
        let mut svc = service.clone();
        svc.update_status = Some(s);
        svc
    })
}
