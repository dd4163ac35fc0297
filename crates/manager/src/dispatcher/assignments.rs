//! The set of tasks one node must know about, sans IO: the COMPLETE set from a view, and the INCREMENTAL
//! changes a store commit makes to it. No async, no store writes, no clock.
//!
//! A task belongs to a node's set when `node_id` is that node and its observed state is at least ASSIGNED
//! (tasks with desired state >= SHUTDOWN stay in it until they are deleted or move away, so the agent stops
//! them). Echo suppression: an update is sent only when a field the agent acts on changed (desired state,
//! spec, ...); the agent's own status reports coming back through the store are not sent again.
//!
//! Bound: `sent` holds one entry per task in the node's set.

use std::collections::HashMap;
use std::sync::Arc;

use shoal_api::{
    assignment, assignment_change::AssignmentAction, Assignment, AssignmentChange, Task, TaskState,
};
use shoal_store::{ActionKind, Change, Object, Tables};

/// True when `task` belongs in `node_id`'s assignment set.
pub fn is_assigned_to(task: &Task, node_id: &str) -> bool {
    let observed = task.status.as_ref().map_or(0, |s| s.state);
    task.node_id == node_id && observed >= TaskState::Assigned as i32
}

/// True when `new` differs from `old` in a field the agent acts on. Status and meta are the agent's own
/// reports and the store's bookkeeping: changes there alone are not sent.
pub fn agent_cares(old: &Task, new: &Task) -> bool {
    old.desired_state != new.desired_state
        || old.spec != new.spec
        || old.spec_version != new.spec_version
        || old.node_id != new.node_id
        || old.service_id != new.service_id
        || old.slot != new.slot
        || old.annotations != new.annotations
        || old.service_annotations != new.service_annotations
        || old.endpoint != new.endpoint
        || old.log_driver != new.log_driver
        || old.job_iteration != new.job_iteration
}

fn change(task: &Task, action: AssignmentAction) -> AssignmentChange {
    AssignmentChange {
        assignment: Some(Assignment {
            item: Some(assignment::Item::Task(task.clone())),
        }),
        action: action as i32,
    }
}

/// What has been sent to one node: the last version of each task in its set.
#[derive(Debug)]
pub struct AssignmentSet {
    node_id: String,
    sent: HashMap<String, Arc<Task>>,
}

impl AssignmentSet {
    /// An empty set for `node_id`.
    pub fn new(node_id: &str) -> AssignmentSet {
        AssignmentSet {
            node_id: node_id.to_string(),
            sent: HashMap::new(),
        }
    }

    /// Number of tasks in the set.
    pub fn len(&self) -> usize {
        self.sent.len()
    }

    /// True when the set is empty.
    pub fn is_empty(&self) -> bool {
        self.sent.is_empty()
    }

    /// Rebuilds the set from a view (through the node index) and returns it as UPDATE changes, for a
    /// COMPLETE message.
    pub fn complete(&mut self, tables: &Tables) -> Vec<AssignmentChange> {
        self.sent.clear();
        let mut out = Vec::new();
        for task in tables.tasks().by_node(&self.node_id) {
            if is_assigned_to(task, &self.node_id) {
                out.push(change(task, AssignmentAction::Update));
                self.sent.insert(task.id.clone(), task.clone());
            }
        }
        out
    }

    /// The change one store change makes to the set, if any.
    pub fn on_change(&mut self, c: &Change) -> Option<AssignmentChange> {
        let Object::Task(task) = &c.object else {
            return None;
        };
        if c.kind == ActionKind::Remove {
            let old = self.sent.remove(&task.id)?;
            return Some(change(&old, AssignmentAction::Remove));
        }
        if is_assigned_to(task, &self.node_id) {
            let send = match self.sent.get(&task.id) {
                Some(prev) => agent_cares(prev, task),
                None => true,
            };
            // Keep the newest version either way, so the next comparison is against current fields.
            self.sent.insert(task.id.clone(), task.clone());
            send.then(|| change(task, AssignmentAction::Update))
        } else {
            let old = self.sent.remove(&task.id)?;
            Some(change(&old, AssignmentAction::Remove))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_api::TaskStatus;
    use shoal_store::{Changes, MemoryStore};

    fn task(id: &str, node: &str, state: TaskState, desired: TaskState) -> Task {
        Task {
            id: id.into(),
            node_id: node.into(),
            desired_state: desired as i32,
            status: Some(TaskStatus {
                state: state as i32,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn actions(c: &[AssignmentChange]) -> Vec<(String, i32)> {
        c.iter()
            .map(|c| {
                let Some(assignment::Item::Task(t)) =
                    c.assignment.as_ref().and_then(|a| a.item.clone())
                else {
                    panic!("not a task")
                };
                (t.id, c.action)
            })
            .collect()
    }

    #[test]
    fn complete_set_holds_assigned_tasks_of_the_node_only() {
        let store = MemoryStore::default();
        let mut c = Changes::new();
        c.create(task("a", "n1", TaskState::Assigned, TaskState::Running));
        c.create(task("b", "n1", TaskState::Pending, TaskState::Running));
        c.create(task("c", "n2", TaskState::Running, TaskState::Running));
        c.create(task("d", "n1", TaskState::Complete, TaskState::Shutdown));
        store.apply(1, c.actions()).unwrap();
        let mut set = AssignmentSet::new("n1");
        let mut got = actions(&store.view(|t| set.complete(t)));
        got.sort();
        let upd = AssignmentAction::Update as i32;
        assert_eq!(got, vec![("a".into(), upd), ("d".into(), upd)]);
    }

    #[test]
    fn incremental_changes_skip_status_echoes_and_remove_moved_tasks() {
        let store = MemoryStore::default();
        let mut c = Changes::new();
        c.create(task("a", "n1", TaskState::Assigned, TaskState::Running));
        store.apply(1, c.actions()).unwrap();
        let mut set = AssignmentSet::new("n1");
        store.view(|t| set.complete(t));
        let mut watch = store.watch();
        let current = || store.view(|t| (**t.tasks().get("a").unwrap()).clone());

        // The agent's own report: no update.
        let mut t = current();
        t.status.as_mut().unwrap().state = TaskState::Running as i32;
        store.apply(2, Changes::new().update(t).actions()).unwrap();
        let commit = watch.try_recv().unwrap();
        assert_eq!(set.on_change(&commit.changes[0]), None);

        // Desired state change: update.
        let mut t = current();
        t.desired_state = TaskState::Shutdown as i32;
        store.apply(3, Changes::new().update(t).actions()).unwrap();
        let commit = watch.try_recv().unwrap();
        let got = set.on_change(&commit.changes[0]).unwrap();
        assert_eq!(got.action, AssignmentAction::Update as i32);

        // Moved to another node: remove.
        let mut t = current();
        t.node_id = "n2".into();
        store.apply(4, Changes::new().update(t).actions()).unwrap();
        let commit = watch.try_recv().unwrap();
        assert_eq!(
            set.on_change(&commit.changes[0]).unwrap().action,
            AssignmentAction::Remove as i32
        );
        assert!(set.is_empty());
    }
}
