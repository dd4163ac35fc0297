//! Task status updates from agents, sans IO: which updates are valid (the task exists, belongs to the
//! reporting node, the state does not move backwards, and a task that ended keeps its end) and the store
//! changes one batch of them makes.
//! Plain functions over a read view (`Tables`); no async, no clock reads (the caller passes `now`), no
//! store writes (the dispatcher's flusher proposes the returned `Changes`).

use std::collections::HashMap;

use shoal_api::{Task, TaskState, TaskStatus};
use shoal_store::{Changes, Tables};

/// One status report for one task, from one node.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusUpdate {
    /// The reporting node (from its identity, not from the request body).
    pub node_id: String,
    /// The task the status is for.
    pub task_id: String,
    /// The new status.
    pub status: TaskStatus,
}

/// Why an update is dropped. Dropping is normal (a stale or duplicate report); the agent is not told.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SkipReason {
    /// The task does not exist (it was deleted).
    #[error("task {task_id} does not exist")]
    NoSuchTask {
        /// The task.
        task_id: String,
    },
    /// The task is assigned to another node (or to none).
    #[error("task {task_id} is assigned to node {assigned:?}, not to the reporting node {reporter}")]
    WrongNode {
        /// The task.
        task_id: String,
        /// Its node.
        assigned: String,
        /// The node that reported.
        reporter: String,
    },
    /// The report would move the observed state backwards (a stale or reordered report).
    #[error("task {task_id} is already {current}; a report of {reported} would move it backwards")]
    Backwards {
        /// The task.
        task_id: String,
        /// The stored state.
        current: &'static str,
        /// The reported state.
        reported: &'static str,
    },
    /// The task already ended (COMPLETE, FAILED, SHUTDOWN, REJECTED...): its outcome is final. A report of
    /// another end is stale, e.g. an agent that restarted and took a task it had seen complete for one whose
    /// process it lost (the simulation found a completed job task turned FAILED, never run again).
    #[error("task {task_id} already ended {current}; a report of {reported} comes too late")]
    Ended {
        /// The task.
        task_id: String,
        /// The stored state.
        current: &'static str,
        /// The reported state.
        reported: &'static str,
    },
    /// The report repeats what is stored.
    #[error("task {task_id}: the report repeats the stored status")]
    Unchanged {
        /// The task.
        task_id: String,
    },
}

fn observed(task: &Task) -> TaskState {
    TaskState::from_wire(task.status.as_ref().map_or(0, |s| s.state))
}

/// Checks one update against the task as stored.
pub fn check_update(task: Option<&Task>, update: &StatusUpdate) -> Result<(), SkipReason> {
    let Some(task) = task else {
        return Err(SkipReason::NoSuchTask { task_id: update.task_id.clone() });
    };
    if task.node_id != update.node_id {
        return Err(SkipReason::WrongNode {
            task_id: update.task_id.clone(),
            assigned: task.node_id.clone(),
            reporter: update.node_id.clone(),
        });
    }
    let current = observed(task);
    let reported = TaskState::from_wire(update.status.state);
    if (reported as i32) < (current as i32) {
        return Err(SkipReason::Backwards {
            task_id: update.task_id.clone(),
            current: current.docker_name(),
            reported: reported.docker_name(),
        });
    }
    if current.is_terminal() && reported != current {
        return Err(SkipReason::Ended {
            task_id: update.task_id.clone(),
            current: current.docker_name(),
            reported: reported.docker_name(),
        });
    }
    if reported == current {
        if let Some(stored) = &task.status {
            let same = stored.message == update.status.message
                && stored.err == update.status.err
                && stored.runtime_status == update.status.runtime_status
                && stored.port_status == update.status.port_status;
            if same {
                return Err(SkipReason::Unchanged { task_id: update.task_id.clone() });
            }
        }
    }
    Ok(())
}

/// Builds the changes for a batch of updates against a view: each still-valid update replaces the task's
/// status (later updates for the same task apply on top of earlier ones). Returns the changes and the
/// updates skipped, with why. Statuses without a timestamp get `now`.
pub fn apply_updates(
    tables: &Tables,
    updates: &[StatusUpdate],
    now: &shoal_api::prost_types::Timestamp,
) -> (Changes, Vec<SkipReason>) {
    let mut working: HashMap<&str, Task> = HashMap::new();
    let mut order: Vec<&str> = Vec::new();
    let mut skipped = Vec::new();
    for u in updates {
        let current =
            working.get(u.task_id.as_str()).cloned().or_else(|| tables.tasks().get(&u.task_id).map(|t| (**t).clone()));
        if let Err(why) = check_update(current.as_ref(), u) {
            skipped.push(why);
            continue;
        }
        let mut task = current.expect("checked above");
        let mut status = u.status.clone();
        if status.timestamp.is_none() {
            status.timestamp = Some(*now);
        }
        task.status = Some(status);
        if !working.contains_key(u.task_id.as_str()) {
            order.push(u.task_id.as_str());
        }
        working.insert(u.task_id.as_str(), task);
    }
    let mut changes = Changes::new();
    for id in order {
        if let Some(task) = working.remove(id) {
            changes.update(task);
        }
    }
    (changes, skipped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_store::MemoryStore;

    fn task(id: &str, node: &str, state: TaskState) -> Task {
        Task {
            id: id.into(),
            node_id: node.into(),
            status: Some(TaskStatus { state: state as i32, ..Default::default() }),
            ..Default::default()
        }
    }

    fn update(node: &str, id: &str, state: TaskState, msg: &str) -> StatusUpdate {
        StatusUpdate {
            node_id: node.into(),
            task_id: id.into(),
            status: TaskStatus { state: state as i32, message: msg.into(), ..Default::default() },
        }
    }

    fn check(stored: Option<Task>, u: StatusUpdate, ok: bool) {
        let r = check_update(stored.as_ref(), &u);
        assert_eq!(r.is_ok(), ok, "{u:?} against {stored:?}: {r:?}");
    }

    #[test]
    fn updates_move_forward_only_and_only_from_the_owner() {
        let t = task("t1", "n1", TaskState::Running);
        check(Some(t.clone()), update("n1", "t1", TaskState::Complete, "finished"), true);
        check(Some(t.clone()), update("n1", "t1", TaskState::Starting, "starting"), false);
        check(Some(t.clone()), update("n2", "t1", TaskState::Complete, "finished"), false);
        check(None, update("n1", "t1", TaskState::Complete, "finished"), false);
        check(Some(t.clone()), update("n1", "t1", TaskState::Running, ""), false);
        check(Some(t), update("n1", "t1", TaskState::Running, "started"), true);
        // An ended task keeps its end: a later FAILED (a restarted agent's lost task) or SHUTDOWN is stale.
        let done = task("t2", "n1", TaskState::Complete);
        check(Some(done.clone()), update("n1", "t2", TaskState::Failed, "task process was lost"), false);
        check(Some(done), update("n1", "t2", TaskState::Shutdown, "shutdown"), false);
        check(Some(task("t3", "n1", TaskState::Shutdown)), update("n1", "t3", TaskState::Failed, "exit 137"), false);
    }

    #[test]
    fn a_batch_applies_updates_in_order_and_skips_stale_ones() {
        let store = MemoryStore::default();
        let mut c = Changes::new();
        c.create(task("t1", "n1", TaskState::Assigned));
        store.apply(1, c.actions()).unwrap();
        let now = shoal_api::timestamp_from_unix_ms(5);
        let updates = vec![
            update("n1", "t1", TaskState::Preparing, "preparing"),
            update("n1", "t1", TaskState::Accepted, "accepted"),
            update("n1", "t1", TaskState::Running, "started"),
            update("n2", "t1", TaskState::Failed, "bogus"),
        ];
        let (changes, skipped) = store.view(|t| apply_updates(t, &updates, &now));
        assert_eq!(changes.len(), 1);
        assert_eq!(skipped.len(), 2);
        let commit = store.apply(2, changes.actions()).unwrap();
        let shoal_store::Object::Task(t) = &commit.changes[0].object else { panic!("not a task") };
        let st = t.status.as_ref().unwrap();
        assert_eq!(st.state, TaskState::Running as i32);
        assert_eq!(st.timestamp, Some(now));
    }
}
