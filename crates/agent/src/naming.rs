//! The names SwarmKit gives a task and its service, which the containers, the templates and the secrets'
//! files of a task carry.
//!
//! Must not depend on any other module of this crate.

use shoal_api::Task;

/// The service's name, from the task's service annotations (the service ID when unnamed).
pub fn service_name(task: &Task) -> String {
    task.service_annotations
        .as_ref()
        .map(|a| a.name.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| task.service_id.clone())
}

/// The task's name as SwarmKit forms it: `<service>.<slot>.<task id>` (`<service>.<node id>.<task id>` for
/// slotless tasks). Also the container's name.
pub fn task_name(task: &Task) -> String {
    if let Some(n) = task.annotations.as_ref().map(|a| &a.name).filter(|n| !n.is_empty()) {
        return n.clone();
    }
    let middle = if task.slot != 0 { task.slot.to_string() } else { task.node_id.clone() };
    format!("{}.{}.{}", service_name(task), middle, task.id)
}
