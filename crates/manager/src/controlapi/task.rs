//! Tasks: lookup and list with filters (answered from the task indexes when a service, node or desired
//! state is given). Tasks are written by the orchestrator, scheduler and dispatcher, never here.
//! Must not depend on HTTP or JSON.

use std::collections::BTreeSet;
use std::sync::Arc;

use shoal_api::{Task, TaskState};
use shoal_store::Tables;

use super::{any_prefix, labels_match, resolve, ControlError};
use crate::state::ClusterState;

/// Which tasks to list. Empty fields match everything; entries within a field are alternatives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskFilters {
    /// ID prefixes.
    pub id_prefixes: Vec<String>,
    /// Prefixes of the task name (`service.slot.id`, or `service.node.id` without a slot).
    pub name_prefixes: Vec<String>,
    /// Services, by ID, name or ID prefix (an unknown service matches no task).
    pub services: Vec<String>,
    /// Nodes, by ID, name or ID prefix (an unknown node matches no task).
    pub nodes: Vec<String>,
    /// Desired states.
    pub desired_states: Vec<TaskState>,
    /// `key` or `key=value` task labels (from the task's annotations); all must match.
    pub labels: Vec<String>,
    /// Only tasks up to date with their service's current spec (the docker CLI's `_up-to-date` filter, used
    /// to follow a rollout).
    pub up_to_date: bool,
}

/// True when the task is up to date with its service's current spec (`orchestrator::dirty`).
fn is_up_to_date(t: &Tables, task: &Task) -> bool {
    t.services().get(&task.service_id).is_some_and(|s| {
        !crate::orchestrator::dirty::is_task_dirty(s, task, t.nodes().get(&task.node_id).map(|n| &**n))
    })
}

/// A task's full name as SwarmKit forms it: `service.slot.id` (or `service.node.id` for global tasks).
pub fn task_name(tables: &Tables, task: &Task) -> String {
    if let Some(n) = task.annotations.as_ref().map(|a| a.name.as_str()).filter(|n| !n.is_empty()) {
        return n.to_string();
    }
    let svc = task
        .service_annotations
        .as_ref()
        .map(|a| a.name.clone())
        .filter(|n| !n.is_empty())
        .or_else(|| {
            tables
                .services()
                .get(&task.service_id)
                .and_then(|s| s.spec.as_ref()?.annotations.as_ref().map(|a| a.name.clone()))
        })
        .unwrap_or_else(|| task.service_id.clone());
    if task.slot != 0 {
        format!("{svc}.{}.{}", task.slot, task.id)
    } else {
        format!("{svc}.{}.{}", task.node_id, task.id)
    }
}

/// The task with this ID or unique ID prefix.
pub fn get_task(state: &ClusterState, reference: &str) -> Result<Arc<Task>, ControlError> {
    state.store.view(|t| resolve("task", reference, |id| t.tasks().get(id), |_| None, t.tasks().iter()).cloned())
}

/// Tasks matching `filters`, sorted by service, slot, then creation time.
pub fn list_tasks(state: &ClusterState, filters: &TaskFilters) -> Vec<Arc<Task>> {
    let mut out: Vec<Arc<Task>> = state.store.view(|t| {
        // Pick the narrowest index the filters allow.
        let candidates: Vec<&Arc<Task>> = if !filters.services.is_empty() {
            let ids: BTreeSet<String> =
                filters.services.iter().filter_map(|r| super::find_service(t, r).ok()).map(|s| s.id.clone()).collect();
            ids.iter().flat_map(|id| t.tasks().by_service(id)).collect()
        } else if !filters.nodes.is_empty() {
            let ids: BTreeSet<String> =
                filters.nodes.iter().filter_map(|r| super::node::find(t, r).ok().map(|n| n.id.clone())).collect();
            ids.iter().flat_map(|id| t.tasks().by_node(id)).collect()
        } else if !filters.desired_states.is_empty() {
            let states: BTreeSet<i32> = filters.desired_states.iter().map(|s| *s as i32).collect();
            states.iter().flat_map(|s| t.tasks().by_desired_state(TaskState::from_wire(*s))).collect()
        } else {
            t.tasks().iter().collect()
        };
        let node_ids: Option<BTreeSet<String>> = (!filters.nodes.is_empty())
            .then(|| filters.nodes.iter().filter_map(|r| super::node::find(t, r).ok().map(|n| n.id.clone())).collect());
        candidates
            .into_iter()
            .filter(|task| {
                // SwarmKit matches a task's label filter against its service's labels (what
                // `docker stack ps` lists a stack's tasks by), not the task's own annotations.
                let labels = task.service_annotations.as_ref().map(|a| a.labels.clone()).unwrap_or_default();
                any_prefix(&filters.id_prefixes, &task.id)
                    && (filters.name_prefixes.is_empty() || any_prefix(&filters.name_prefixes, &task_name(t, task)))
                    && node_ids.as_ref().is_none_or(|ids| ids.contains(&task.node_id))
                    && (filters.desired_states.is_empty()
                        || filters.desired_states.iter().any(|s| *s as i32 == task.desired_state))
                    && labels_match(&labels, &filters.labels)
                    && (!filters.up_to_date || is_up_to_date(t, task))
            })
            .cloned()
            .collect()
    });
    out.sort_by(|a, b| {
        let created = |t: &Task| t.meta.as_ref().and_then(|m| m.created_at).map(|c| (c.seconds, c.nanos));
        (&a.service_id, a.slot, &a.node_id, created(a)).cmp(&(&b.service_id, b.slot, &b.node_id, created(b)))
    });
    out
}
