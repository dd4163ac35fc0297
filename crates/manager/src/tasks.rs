//! What every subsystem reads off a task: its observed state, when it was created and last changed, and
//! whether it is a network attachment (made by `AttachNetwork`, of no service).
//!
//! Must not depend on any other module of this crate: plain functions of a `Task`.

use shoal_api::{task_spec, Task, TaskState};

/// The task's observed state (`status.state`), `New` when it has no status.
pub fn observed_state(t: &Task) -> TaskState {
    t.status.as_ref().map(|s| s.state()).unwrap_or(TaskState::New)
}

/// When the task was created, in ms since the epoch (0 when unknown).
pub fn created_ms(t: &Task) -> u64 {
    t.meta.as_ref().and_then(|m| m.created_at.as_ref()).map(shoal_api::timestamp_to_unix_ms).unwrap_or(0)
}

/// The time of the task's last status change, in ms since the epoch (0 when unknown).
pub fn status_ms(t: &Task) -> u64 {
    t.status.as_ref().and_then(|s| s.timestamp.as_ref()).map(shoal_api::timestamp_to_unix_ms).unwrap_or(0)
}

/// True for a network attachment task (made by `AttachNetwork`, of no service).
pub fn is_attachment_task(t: &Task) -> bool {
    t.service_id.is_empty()
        && matches!(t.spec.as_ref().and_then(|s| s.runtime.as_ref()), Some(task_spec::Runtime::Attachment(_)))
}
