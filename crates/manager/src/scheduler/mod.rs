//! The scheduler: places PENDING tasks on nodes. For each group of pending tasks of one service and spec
//! version, every node goes once through the filter pipeline (`filter`: ready and active, resources,
//! constraints, platform, max replicas); the nodes that pass are ordered for spread (fewest tasks of the
//! same service, then fewest tasks overall, then node ID), and each task goes to the first node that
//! still passes (resources and per-node limits shrink as the pass assigns). Node information is built once
//! per pass from the node index (`nodeinfo`) into a vector and updated in memory, so no table is scanned
//! per task. The spread order is a binary heap built in one O(nodes) step per group; each placement pops
//! the best node and pushes it back with its new counts (O(log nodes)), so a pass costs
//! O(groups x nodes + tasks x log nodes): 100k nodes x 1k tasks does not sort 100k nodes.
//!
//! A placed task gets `node_id` and status ASSIGNED ("scheduler assigned task to node"). A task that fits
//! nowhere stays PENDING with `status.err` = "no suitable node (...)" naming each filter's refusals; it is
//! written only when that text changes, so the scheduler's own writes do not loop.
//!
//! `Scheduler::schedule` is the sans-IO core (a `&Tables` view in, `Changes` out); `subsystem()` is the
//! leader-only loop around it (`runner`). `constraint` parses and matches placement constraints.
//! Must not depend on other subsystems or on IO other than `ClusterState`.

pub mod constraint;
pub mod filter;
pub mod nodeinfo;
mod runner;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::sync::Arc;

use shoal_api::{Task, TaskState, TaskStatus};
use shoal_store::{Changes, StoreObject, Tables};

pub use filter::{Filter, Pipeline};
pub use nodeinfo::{Amount, NodeInfo};
pub use runner::SchedulerLoop;

use crate::orchestrator::observed_state;
use crate::subsystem::Subsystem;

/// The status message of a task the scheduler placed.
pub const ASSIGNED_MESSAGE: &str = "scheduler assigned task to node";
/// The start of `status.err` for a task no node can take.
pub const NO_SUITABLE_NODE: &str = "no suitable node";

/// The scheduler as a leader-only subsystem.
pub fn subsystem() -> Box<dyn Subsystem> {
    Box::new(SchedulerLoop)
}

/// Which pending tasks a pass looks at.
#[derive(Debug, Clone)]
pub enum PendingTasks {
    /// Every task in state PENDING (from the state index).
    All,
    /// Only these task IDs (those not PENDING any more are skipped).
    Only(BTreeSet<String>),
}

/// What one pass decided.
#[derive(Debug, Default)]
pub struct SchedulePass {
    /// Task updates: assignments, and new explanations on tasks that stay pending.
    pub changes: Changes,
    /// Number of tasks assigned.
    pub assigned: usize,
    /// Number of pending tasks no node could take.
    pub unplaced: usize,
}

/// The scheduling core. Holds only the filter pipeline (reused between groups); every decision is a
/// function of the view passed to `schedule`.
#[derive(Debug, Default)]
pub struct Scheduler {
    pipeline: Pipeline,
}

/// True when the scheduler should place this task: observed PENDING, no node, meant to run.
pub fn is_schedulable(t: &Task) -> bool {
    observed_state(t) == TaskState::Pending && t.node_id.is_empty() && t.desired_state() <= TaskState::Running
}

impl Scheduler {
    /// A scheduler with the default pipeline.
    pub fn new() -> Scheduler {
        Scheduler::default()
    }

    /// Places the selected pending tasks (see the module doc). `now_ms` stamps the new statuses.
    pub fn schedule(&mut self, tables: &Tables, pending: &PendingTasks, now_ms: u64) -> SchedulePass {
        // Group by (service, spec version): tasks of a group share a spec, so filters run once per node.
        let mut groups: BTreeMap<(String, u64), Vec<&Arc<Task>>> = BTreeMap::new();
        let selected: Vec<&Arc<Task>> = match pending {
            PendingTasks::All => tables.tasks().by_state(TaskState::Pending).collect(),
            PendingTasks::Only(ids) => ids.iter().filter_map(|id| tables.tasks().get(id)).collect(),
        };
        for t in selected {
            if is_schedulable(t) {
                let v = t.spec_version.as_ref().map_or(0, |v| v.index);
                groups.entry((t.service_id.clone(), v)).or_default().push(t);
            }
        }
        let mut pass = SchedulePass::default();
        if groups.is_empty() {
            return pass;
        }
        // IDs borrowed from the view (not from `nodes`, which the pass updates).
        // Sized up front: growing vectors of 100k entries by doubling cost more than the pass itself.
        let mut listed: Vec<&Arc<shoal_api::Node>> = Vec::with_capacity(tables.nodes().len());
        listed.extend(tables.nodes().iter());
        let mut nodes: Vec<NodeInfo> = Vec::with_capacity(listed.len());
        nodes.extend(listed.iter().map(|n| NodeInfo::build(tables, n)));
        let now = shoal_api::timestamp_from_unix_ms(now_ms);
        for ((service_id, _), mut tasks) in groups {
            tasks.sort_by(|a, b| (a.slot, &a.id).cmp(&(b.slot, &b.id)));
            self.pipeline.set_task(tasks[0]);
            // Min-heap on (tasks of this service, tasks overall, node ID); the index finds the node's info.
            let mut candidates: Vec<Reverse<(usize, usize, &str, usize)>> = Vec::with_capacity(nodes.len());
            for (i, info) in nodes.iter().enumerate() {
                if self.pipeline.process(info) {
                    candidates.push(Reverse((info.service_tasks(&service_id), info.total_tasks, listed[i].id.as_str(), i)));
                }
            }
            let mut order = BinaryHeap::from(candidates);
            let mut unplaced = Vec::new();
            for task in tasks {
                let mut placed = None;
                while let Some(Reverse((_, _, node_id, i))) = order.pop() {
                    let info = &mut nodes[i];
                    // Resources and per-node limits shrink as tasks are placed: check again.
                    if !self.pipeline.process(info) {
                        continue;
                    }
                    info.add_task(task);
                    order.push(Reverse((info.service_tasks(&service_id), info.total_tasks, node_id, i)));
                    placed = Some(node_id);
                    break;
                }
                match placed {
                    Some(node_id) => {
                        let mut t = (**task).clone();
                        t.node_id = node_id.to_string();
                        t.status = Some(TaskStatus {
                            timestamp: Some(now),
                            state: TaskState::Assigned as i32,
                            message: ASSIGNED_MESSAGE.to_string(),
                            ..Default::default()
                        });
                        t.meta_mut().updated_at = Some(now);
                        pass.changes.update(t);
                        pass.assigned += 1;
                    }
                    None => unplaced.push(task),
                }
            }
            if unplaced.is_empty() {
                continue;
            }
            pass.unplaced += unplaced.len();
            let explanation = self.pipeline.explain();
            let err = if explanation.is_empty() {
                NO_SUITABLE_NODE.to_string()
            } else {
                format!("{NO_SUITABLE_NODE} ({explanation})")
            };
            for task in unplaced {
                let status = task.status.clone().unwrap_or_default();
                if status.err == err {
                    continue;
                }
                let mut t = (**task).clone();
                t.status = Some(TaskStatus { err: err.clone(), timestamp: Some(now), ..status });
                pass.changes.update(t);
            }
        }
        pass
    }
}

#[cfg(test)]
mod tests;
