//! What every subsystem reads off a task: its observed state, when it was created and last changed, and
//! whether it is a network attachment (made by `AttachNetwork`, of no service); and how a wait measured
//! from such a stamp ends (`wait_end_ms`).
//!
//! Must not depend on any other module of this crate: plain functions of a `Task`.

use shoal_api::{task_spec, Task, TaskState};

/// The task's observed state (`status.state`), `New` when it has no status.
pub(crate) fn observed_state(t: &Task) -> TaskState {
    t.status.as_ref().map(|s| s.state()).unwrap_or(TaskState::New)
}

/// When the task was created, in ms since the epoch (0 when unknown).
pub fn created_ms(t: &Task) -> u64 {
    t.meta.as_ref().and_then(|m| m.created_at.as_ref()).map(shoal_api::timestamp_to_unix_ms).unwrap_or(0)
}

/// The time of the task's last status change, in ms since the epoch (0 when unknown).
pub(crate) fn status_ms(t: &Task) -> u64 {
    t.status.as_ref().and_then(|s| s.timestamp.as_ref()).map(shoal_api::timestamp_to_unix_ms).unwrap_or(0)
}

/// True for a network attachment task (made by `AttachNetwork`, of no service).
pub(crate) fn is_attachment_task(t: &Task) -> bool {
    t.service_id.is_empty()
        && matches!(t.spec.as_ref().and_then(|s| s.runtime.as_ref()), Some(task_spec::Runtime::Attachment(_)))
}

/// How far in this manager's future a stamp may lie and still be taken as written: wall clocks of managers
/// and nodes kept by NTP differ by far less.
pub(crate) const FUTURE_STAMP_TOLERANCE_MS: u64 = 1000;

/// When a wait of `wait_ms` from `stamp_ms` ends, as this manager's clock sees it at `now_ms`. Stamps are
/// written by whichever manager (or node) wrote the task, whose clock may be ahead of this one: a stamp more
/// than `FUTURE_STAMP_TOLERANCE_MS` in the future says nothing of how long ago it was made, and waiting for
/// this clock to reach it would stretch a restart delay or an update's delay or monitor period by the clocks'
/// difference (the simulation found a 500 ms restart delay lasting 97 s after a failover to a manager
/// whose clock was behind). Such a wait is taken as over: it ends `now_ms`.
pub(crate) fn wait_end_ms(stamp_ms: u64, wait_ms: u64, now_ms: u64) -> u64 {
    if stamp_ms > now_ms.saturating_add(FUTURE_STAMP_TOLERANCE_MS) {
        now_ms
    } else {
        stamp_ms.saturating_add(wait_ms)
    }
}
