//! The orchestrators: they turn services into tasks. `replicated` keeps N tasks per replicated service (one
//! per slot), `global` one task per eligible node of a global service (on the same working state, a node per
//! key), `jobs` runs replicated and global jobs to completion (its own reconcile), and `replicated` holds
//! the restart supervisor (`restart`) and the update supervisor (`update`, with what "up to date" means in
//! `dirty`) as parts of one per-service reconcile; `taskreaper` deletes old and removed tasks;
//! `constraint_enforcer` rejects tasks whose node no longer fits them; `rebalance` moves tasks to nodes that
//! joined later when the cluster setting is on. Each has a sans-IO core (plain
//! functions over a `&Tables` view and a time in milliseconds, returning `Changes`) and a thin async loop
//! over the store's watch queue (`replicated_loop`, `taskreaper`, `constraint_enforcer`).
//!
//! This module must not depend on the dispatcher or any IO other than `ClusterState`'s proposer
//! (subsystems only talk through the store); from the scheduler it reads only the pure constraint and
//! platform matchers and resource arithmetic.

pub(crate) mod constraint_enforcer;
pub(crate) mod dirty;
pub(crate) mod global;
pub(crate) mod jobs;
pub(crate) mod rebalance;
pub(crate) mod replicated;
mod replicated_loop;
pub(crate) mod restart;
pub(crate) mod taskreaper;
pub(crate) mod update;

#[cfg(test)]
pub(crate) mod fixture;
#[cfg(test)]
mod global_tests;
#[cfg(test)]
mod jobs_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod update_tests;

use shoal_api::{node_status, Node, Task, TaskState};
use shoal_store::Tables;

pub(crate) use constraint_enforcer::ConstraintEnforcer;
#[cfg(test)]
pub(crate) use replicated::{reconcile_service, remove_service_tasks};
pub(crate) use replicated_loop::{GlobalOrchestrator, JobsOrchestrator, ReplicatedOrchestrator};
pub(crate) use taskreaper::TaskReaper;

pub(crate) use crate::tasks::{created_ms, observed_state, status_ms};

use crate::subsystem::Subsystem;

/// The leader-only orchestration subsystems: the replicated and global orchestrators (each with the
/// restart supervisor and update supervisor), the jobs orchestrator, the task reaper, the constraint enforcer
/// and the rebalancer.
pub(crate) fn subsystems() -> Vec<Box<dyn Subsystem>> {
    vec![
        Box::new(ReplicatedOrchestrator),
        Box::new(GlobalOrchestrator),
        Box::new(JobsOrchestrator),
        Box::new(TaskReaper),
        Box::new(ConstraintEnforcer),
        Box::new(rebalance::Rebalancer),
    ]
}

/// True when the node is gone from the store or marked DOWN: its tasks will not report again.
pub fn node_is_down(node: Option<&Node>) -> bool {
    match node {
        None => true,
        Some(n) => n.status.as_ref().map(|s| s.state()) == Some(node_status::State::Down),
    }
}

/// True when the node is drained (availability DRAIN): its tasks are to be moved elsewhere.
pub(crate) fn node_is_drained(node: Option<&Node>) -> bool {
    node.and_then(|n| n.spec.as_ref())
        .is_some_and(|s| s.availability == shoal_api::node_spec::Availability::Drain as i32)
}

/// True when the task may still be running somewhere: it reached a node (observed >= ASSIGNED), has not
/// reached a terminal state, and its node is not down.
pub(crate) fn task_is_live(tables: &Tables, t: &Task) -> bool {
    let observed = observed_state(t);
    observed >= TaskState::Assigned
        && !observed.is_terminal()
        && !t.node_id.is_empty()
        && !node_is_down(tables.nodes().get(&t.node_id).map(|n| &**n))
}

/// Order of tasks in a slot's history: by creation time, then version, then ID (oldest first).
pub(crate) fn history_key(t: &Task) -> (u64, u64, &str) {
    use shoal_store::StoreObject;
    (created_ms(t), t.version(), t.id.as_str())
}
