//! The scheduler: places PENDING tasks on nodes. For each group of pending tasks of one service and spec
//! version, every node goes once through the filter pipeline (`filter`: ready and active, resources,
//! constraints, platform, max replicas); the nodes that pass are ordered for spread (fewest tasks of the
//! same service, then fewest tasks overall, then node ID), and each task goes to the first node that
//! still passes (resources and per-node limits shrink as the pass assigns).
//!
//! Node information lives in a `NodeSet` (`nodeset`) that the loop keeps between passes and updates from
//! store commits, instead of rebuilding 100k `NodeInfo`s (`nodeinfo`) from scattered nodes and the node
//! index on every pass. Each `NodeInfo` carries what every pass reads, computed when its node version came
//! in: the ready-and-active flag, the resources left, the task counts and an ordering key of the node ID
//! (its first 16 bytes), so a pass whose tasks set no constraint or platform reads only the contiguous
//! vector. The pass counts its placements in the set as it goes and takes them back at the end: they are
//! written through Raft and counted when their commits come back, so a failed write needs no repair.
//!
//! The spread order is a binary heap of small entries (two counts, the ID key, the node's slot, the ID
//! borrowed for ties of the key); each placement pops the best node and pushes it back with its new counts
//! (O(log nodes)). Only a group's `tasks` best candidates can ever be used (a node is first popped only
//! after every better unpopped node, and each first pop places a task), so with fewer tasks than nodes a
//! bounded max-heap keeps those while the nodes go through the filters; otherwise all candidates are
//! heapified in one O(nodes) step. A pass costs O(groups x nodes + tasks x log nodes): 100k nodes x 1k
//! tasks neither sorts nor heaps 100k nodes.
//!
//! A group whose tasks have placement preferences (`spread=node.labels.zone`) goes down SwarmKit's decision
//! tree instead (`preferences`): even over the label values first, level by level, then the spread above
//! within each leaf.
//!
//! A task created with its node already set (a global service's) is only checked against that node
//! (`check_preassigned`).
//!
//! A placed task gets `node_id` and status ASSIGNED ("scheduler assigned task to node"). A task that fits
//! nowhere stays PENDING with `status.err` = "no suitable node (...)" naming each filter's refusals; it is
//! written only when that text changes, so the scheduler's own writes do not loop.
//!
//! `Scheduler::schedule` is the sans-IO core (a `&Tables` view and the `NodeSet` in step with it in,
//! `Changes` out); `subsystem()` is the leader-only loop around it (`runner`). `constraint` parses and
//! matches placement constraints.
//! Must not depend on other subsystems or on IO other than `ClusterState`.

pub(crate) mod constraint;
pub(crate) mod filter;
pub(crate) mod nodeinfo;
pub(crate) mod nodeset;
pub(crate) mod preferences;
mod runner;
pub(crate) mod volumes;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::sync::Arc;

use shoal_api::{Task, TaskState, TaskStatus};
use shoal_store::{Changes, StoreObject, Tables};

pub(crate) use filter::Pipeline;
pub(crate) use nodeinfo::{Amount, NodeInfo};
pub use nodeset::NodeSet;
pub(crate) use preferences::PreferenceTree;
pub(crate) use runner::SchedulerLoop;

use crate::subsystem::Subsystem;
use crate::tasks::observed_state;

/// The status message of a task the scheduler placed.
pub(crate) const ASSIGNED_MESSAGE: &str = "scheduler assigned task to node";
/// The start of `status.err` for a task no node can take.
pub(crate) const NO_SUITABLE_NODE: &str = "no suitable node";

/// The scheduler as a leader-only subsystem.
pub(crate) fn subsystem() -> Box<dyn Subsystem> {
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
    /// The tasks placed with cluster volumes, and the volumes they use (publications added): written together
    /// in one write, apart from `changes`, so that the volumes' version checks cover the tasks.
    pub volume_changes: Changes,
    /// The IDs of the tasks in `volume_changes`.
    pub volume_tasks: Vec<String>,
    /// Tasks with cluster volumes left for the next pass (over `MAX_VOLUME_TASKS_PER_PASS`).
    pub deferred: Vec<String>,
}

/// Most tasks with cluster volumes placed in one pass: they are written in one atomic write with their
/// volumes, which must stay within `write::MAX_ACTIONS_PER_WRITE` and `MAX_BYTES_PER_WRITE`; the rest wait
/// for the next pass, which follows at once.
pub(crate) const MAX_VOLUME_TASKS_PER_PASS: usize = 32;

/// The scheduling core. Holds only the filter pipeline (reused between groups); every decision is a
/// function of the view and node set passed to `schedule`.
#[derive(Debug, Default)]
pub struct Scheduler {
    pipeline: Pipeline,
}

/// True when the scheduler should place (or, with a node already set, check) this task: observed PENDING
/// and meant to run (desired up to RUNNING, or COMPLETE for a job's task).
pub(crate) fn is_schedulable(t: &Task) -> bool {
    observed_state(t) == TaskState::Pending && t.desired_state() <= TaskState::Complete
}

impl Scheduler {
    /// A scheduler with the default pipeline.
    pub fn new() -> Scheduler {
        Scheduler::default()
    }

    /// Places the selected pending tasks on `nodes` (see the module doc), which must hold the nodes and
    /// task counts of `tables` (`NodeSet::build`, then `apply` of every later commit). `nodes` is the same
    /// after the call as before: the placements come back as commits. `now_ms` stamps the new statuses.
    pub fn schedule(
        &mut self,
        tables: &Tables,
        nodes: &mut NodeSet,
        pending: &PendingTasks,
        now_ms: u64,
    ) -> SchedulePass {
        let (preassigned, groups, with_volumes) = select(tables, pending);
        let mut out = SchedulePass::default();
        self.check_preassigned(nodes, preassigned, now_ms, &mut out);
        if !with_volumes.is_empty() {
            self.place_with_volumes(tables, nodes, with_volumes, now_ms, &mut out);
        }
        if groups.is_empty() {
            return out;
        }
        let mut pass = Pass {
            out,
            now: shoal_api::timestamp_from_unix_ms(now_ms),
            placed: Vec::with_capacity(groups.len()),
            generic_placed: Vec::new(),
            host_placed: Vec::new(),
        };
        let (infos, ids) = nodes.parts_mut();
        for ((service_id, _), mut tasks) in groups {
            tasks.sort_by(|a, b| (a.slot, &a.id).cmp(&(b.slot, &b.id)));
            self.pipeline.set_task(tasks[0]);
            pass.placed.push((service_id, Vec::with_capacity(tasks.len())));
            let descriptors = preferences::descriptors(tasks[0]);
            let unplaced = if descriptors.is_empty() {
                self.place_spread(infos, ids, service_id, tasks, &mut pass)
            } else {
                let mut tree = PreferenceTree::build(infos, service_id, &descriptors);
                let mut unplaced = Vec::new();
                for task in tasks {
                    match tree.place(&mut self.pipeline, infos, ids, service_id, task) {
                        Some((slot, reserved, claims)) => pass.placed(task, &ids[slot], slot, reserved, claims),
                        None => unplaced.push(task),
                    }
                }
                unplaced
            };
            self.explain_unplaced(unplaced, pass.now, &mut pass.out);
        }
        pass.take_back(infos)
    }

    /// Places `tasks` of one group (a service's spec version, no placement preferences), spread over the
    /// nodes that pass the pipeline; returns those no node took.
    fn place_spread<'t>(
        &mut self,
        infos: &mut [NodeInfo],
        ids: &[Arc<str>],
        service_id: &str,
        tasks: Vec<&'t Arc<Task>>,
        pass: &mut Pass<'t>,
    ) -> Vec<&'t Arc<Task>> {
        // Min-heap on (tasks of this service, tasks overall, node ID); the slot finds the node's info.
        // `best_candidates` keeps at most `tasks.len()` of them (see the module doc) but consumes every
        // node, so the filters' refusal counts cover all of them.
        let pipeline = &mut self.pipeline;
        let passing = infos.iter().enumerate().filter(|(_, info)| pipeline.process(info));
        let passing = passing.map(|(i, info)| Spread {
            service_tasks: count32(info.service_tasks(service_id)),
            total_tasks: count32(info.total_tasks()),
            key: info.order_key(),
            id: &ids[i],
            slot: i,
        });
        let mut order = best_candidates(passing, infos.len(), tasks.len());
        let mut unplaced = Vec::new();
        for task in tasks {
            let mut target = None;
            while let Some(Reverse(best)) = order.pop() {
                let info = &mut infos[best.slot];
                // Resources and per-node limits shrink as tasks are placed: check again.
                if !self.pipeline.process(info) {
                    continue;
                }
                let (reserved, claims) = info.place_task(task);
                // Only this group's placements changed the node's counts since its entry was made.
                debug_assert_eq!(best.service_tasks as usize + 1, info.service_tasks(service_id));
                order.push(Reverse(Spread {
                    service_tasks: best.service_tasks.saturating_add(1),
                    total_tasks: best.total_tasks.saturating_add(1),
                    ..best
                }));
                target = Some((best.id, best.slot, reserved, claims));
                break;
            }
            match target {
                Some((node_id, slot, reserved, claims)) => pass.placed(task, node_id, slot, reserved, claims),
                None => unplaced.push(task),
            }
        }
        unplaced
    }
}

/// Pending tasks by (service ID, spec version).
type Groups<'t> = BTreeMap<(&'t str, u64), Vec<&'t Arc<Task>>>;

/// The selected pending tasks the scheduler should handle: those already on a node (to check), the others
/// grouped by (service, spec version): tasks of a group share a spec, so filters run once per node; and
/// apart, those that mount cluster volumes (placed one by one, `place_with_volumes`). Keys borrow the
/// service ID from the view: no string is copied per task.
fn select<'t>(tables: &'t Tables, pending: &PendingTasks) -> (Vec<&'t Arc<Task>>, Groups<'t>, Vec<&'t Arc<Task>>) {
    let mut groups = Groups::new();
    let selected: Vec<&Arc<Task>> = match pending {
        PendingTasks::All => tables.tasks().by_state(TaskState::Pending).collect(),
        PendingTasks::Only(ids) => ids.iter().filter_map(|id| tables.tasks().get(id)).collect(),
    };
    let mut preassigned = Vec::new();
    let mut with_volumes = Vec::new();
    for t in selected {
        if is_schedulable(t) && volumes::uses_cluster_volumes(t) {
            with_volumes.push(t);
        } else if is_schedulable(t) && !t.node_id.is_empty() {
            preassigned.push(t);
        } else if is_schedulable(t) {
            let v = t.spec_version.as_ref().map_or(0, |v| v.index);
            groups.entry((t.service_id.as_str(), v)).or_default().push(t);
        }
    }
    with_volumes.sort_by(|a, b| (&a.service_id, a.slot, &a.id).cmp(&(&b.service_id, b.slot, &b.id)));
    (preassigned, groups, with_volumes)
}

/// A pass of `Scheduler::schedule` under way: its output, its time, and what it placed in the node set,
/// taken back at its end (`take_back`).
struct Pass<'t> {
    out: SchedulePass,
    /// What stamps the new statuses.
    now: shoal_api::prost_types::Timestamp,
    /// The placements made in the node set, per group (the last is the current one): its service, and the
    /// slot and reservation of each.
    placed: Vec<(&'t str, Vec<(usize, Amount)>)>,
    /// The generic resources given to placed tasks, per node slot.
    generic_placed: Vec<(usize, Vec<shoal_api::GenericResource>)>,
    /// The placed tasks holding host-mode ports, per node slot.
    host_placed: Vec<(usize, &'t Arc<Task>)>,
}

impl<'t> Pass<'t> {
    /// Records `task` of the current group, placed on node `slot` (`node_id`) with `reserved` and the generic
    /// resource units `claims`.
    fn placed(
        &mut self,
        task: &'t Arc<Task>,
        node_id: &str,
        slot: usize,
        reserved: Amount,
        claims: Vec<shoal_api::GenericResource>,
    ) {
        self.placed.last_mut().expect("a group is open").1.push((slot, reserved));
        if nodeinfo::host_ports(task).next().is_some() {
            self.host_placed.push((slot, task));
        }
        record(&mut self.out, &mut self.generic_placed, assigned(task, node_id, self.now), slot, claims);
    }

    /// Takes back from `infos` what the pass placed in them, and returns its output.
    fn take_back(self, infos: &mut [NodeInfo]) -> SchedulePass {
        // Taken back per node and group: one per-service count update per node, not one per task.
        for (service_id, mut slots) in self.placed {
            slots.sort_unstable_by_key(|&(slot, _)| slot);
            for run in slots.chunk_by(|a, b| a.0 == b.0) {
                let reserved = run.iter().fold(Amount::default(), |sum, &(_, r)| sum.plus(r));
                infos[run[0].0].take_back(service_id, run.len(), reserved);
            }
        }
        for (slot, claims) in self.generic_placed {
            infos[slot].release(&claims);
        }
        for (slot, task) in self.host_placed {
            infos[slot].take_back_host_ports(task);
        }
        self.out
    }
}

impl Scheduler {
    /// Counts the group's tasks that no node took and writes the pipeline's explanation into each (only
    /// where the text changes, so the scheduler's own writes do not loop).
    fn explain_unplaced(
        &self,
        unplaced: Vec<&Arc<Task>>,
        now: shoal_api::prost_types::Timestamp,
        pass: &mut SchedulePass,
    ) {
        if unplaced.is_empty() {
            return;
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

    /// Tasks created with their node set (a global service's): each is checked against that node alone
    /// (SwarmKit's preassigned tasks). A task the node takes goes ASSIGNED; otherwise it stays PENDING with
    /// the refusal in `status.err` (written when that text changes). The task already counts in its node's
    /// load (it holds a node), so the check runs with it taken off and counts it back after.
    fn check_preassigned(&mut self, nodes: &mut NodeSet, tasks: Vec<&Arc<Task>>, now_ms: u64, pass: &mut SchedulePass) {
        let now = shoal_api::timestamp_from_unix_ms(now_ms);
        // Generic resources given during this pass, taken back at the end (their commits count them).
        let mut claimed: Vec<(&str, Vec<shoal_api::GenericResource>)> = Vec::new();
        for task in tasks {
            self.pipeline.set_task(task);
            let err = match nodes.get_mut(&task.node_id) {
                Some(info) => {
                    info.remove_task(task);
                    let fits = self.pipeline.process(info);
                    let claims = if fits { info.claim_generic(task) } else { Vec::new() };
                    info.add_task(task);
                    if fits {
                        let mut t = assigned(task, &task.node_id, now);
                        if !claims.is_empty() {
                            info.claim(&claims);
                            t.assigned_generic_resources = claims.clone();
                            claimed.push((&task.node_id, claims));
                        }
                        pass.changes.update(t);
                        pass.assigned += 1;
                        continue;
                    }
                    format!("{NO_SUITABLE_NODE} ({})", self.pipeline.explain())
                }
                None => format!("{NO_SUITABLE_NODE} (node {} not found)", task.node_id),
            };
            pass.unplaced += 1;
            let status = task.status.clone().unwrap_or_default();
            if status.err != err {
                let mut t = (**task).clone();
                t.status = Some(TaskStatus { err, timestamp: Some(now), ..status });
                pass.changes.update(t);
            }
        }
        for (node_id, claims) in claimed {
            if let Some(info) = nodes.get_mut(node_id) {
                info.release(&claims);
            }
        }
    }
}

impl Scheduler {
    /// Places the tasks that mount cluster volumes, one at a time (`volumes`): each goes to the first node,
    /// in spread order (its own node for a task created on one), that passes the pipeline and can use a
    /// volume for each of its cluster mounts. The tasks and the volumes they use are written together
    /// (`SchedulePass::volume_changes`). One that fits nowhere stays PENDING with the pipeline's refusals and
    /// the volumes' reason.
    fn place_with_volumes(
        &mut self,
        tables: &Tables,
        nodes: &mut NodeSet,
        tasks: Vec<&Arc<Task>>,
        now_ms: u64,
        out: &mut SchedulePass,
    ) {
        let now = shoal_api::timestamp_from_unix_ms(now_ms);
        let mut set = volumes::VolumeSet::build(tables);
        // What this pass placed in the node set, taken back at the end (their commits count them).
        let mut placed: Vec<(String, &Arc<Task>, Amount, Vec<shoal_api::GenericResource>)> = Vec::new();
        for (n, task) in tasks.into_iter().enumerate() {
            if n >= MAX_VOLUME_TASKS_PER_PASS {
                out.deferred.push(task.id.clone());
                continue;
            }
            self.pipeline.set_task(task);
            let mut refused_by_volumes: BTreeMap<String, usize> = BTreeMap::new();
            let (infos, _) = nodes.parts_mut();
            let mut order: Vec<usize> =
                (0..infos.len()).filter(|&i| task.node_id.is_empty() || infos[i].id() == task.node_id).collect();
            order.sort_by_key(|&i| {
                let info = &infos[i];
                (info.service_tasks(&task.service_id), info.total_tasks(), info.order_key(), info.id().to_string())
            });
            let mut target = None;
            for i in order {
                let info = &mut infos[i];
                let fits = if task.node_id.is_empty() {
                    self.pipeline.process(info)
                } else {
                    // A task created on its node already counts in that node's load.
                    info.remove_task(task);
                    let fits = self.pipeline.process(info);
                    info.add_task(task);
                    fits
                };
                if !fits {
                    continue;
                }
                match set.choose(task, info.node()) {
                    Ok(attachments) => {
                        target = Some((i, attachments));
                        break;
                    }
                    Err(why) => *refused_by_volumes.entry(why).or_insert(0) += 1,
                }
            }
            let Some((i, attachments)) = target else {
                out.unplaced += 1;
                let mut reasons: Vec<String> = Vec::new();
                let pipeline = self.pipeline.explain();
                if !pipeline.is_empty() {
                    reasons.push(pipeline);
                }
                for (why, n) in refused_by_volumes {
                    reasons
                        .push(format!("{why} on {}", if n == 1 { "1 node".to_string() } else { format!("{n} nodes") }));
                }
                let err = if reasons.is_empty() {
                    format!("{NO_SUITABLE_NODE} (node {} not found)", task.node_id)
                } else {
                    format!("{NO_SUITABLE_NODE} ({})", reasons.join("; "))
                };
                let status = task.status.clone().unwrap_or_default();
                if status.err != err {
                    let mut t = (**task).clone();
                    t.status = Some(TaskStatus { err, timestamp: Some(now), ..status });
                    out.changes.update(t);
                }
                continue;
            };
            let info = &mut infos[i];
            let node_id = info.id().to_string();
            let mut t = assigned(task, &node_id, now);
            if task.node_id.is_empty() {
                let (reserved, claims) = info.place_task(task);
                if !claims.is_empty() {
                    t.assigned_generic_resources = claims.clone();
                }
                placed.push((node_id.clone(), task, reserved, claims));
            } else {
                let claims = info.claim_generic(task);
                if !claims.is_empty() {
                    info.claim(&claims);
                    t.assigned_generic_resources = claims.clone();
                    placed.push((node_id.clone(), task, Amount::default(), claims));
                }
            }
            set.reserve(task, &node_id, &attachments);
            t.volumes = attachments.into();
            out.volume_tasks.push(t.id.clone());
            out.volume_changes.update(t);
            out.assigned += 1;
        }
        for v in set.take_written() {
            let mut v = v;
            v.meta.get_or_insert_with(Default::default).updated_at = Some(now);
            out.volume_changes.update(v);
        }
        for (node_id, task, reserved, claims) in placed {
            if let Some(info) = nodes.get_mut(&node_id) {
                if task.node_id.is_empty() {
                    info.take_back(&task.service_id, 1, reserved);
                    info.take_back_host_ports(task);
                }
                info.release(&claims);
            }
        }
    }
}

/// A heap entry: the spread order of one candidate node. Fields compare in order, so the node ID is read
/// only when the counts and the 16-byte ID prefixes (`key`) tie; the slot never decides (IDs are unique).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Spread<'a> {
    service_tasks: u32,
    total_tasks: u32,
    key: u128,
    id: &'a str,
    slot: usize,
}

/// The `keep` best of `entries` (at most `nodes` of them) as a min-heap: all of them, heapified in one step,
/// when they cannot be more than `keep`; else through a bounded max-heap that replaces its worst entry.
fn best_candidates<'a>(
    entries: impl Iterator<Item = Spread<'a>>,
    nodes: usize,
    keep: usize,
) -> BinaryHeap<Reverse<Spread<'a>>> {
    if nodes <= keep {
        return entries.map(Reverse).collect();
    }
    let mut best = BinaryHeap::with_capacity(keep);
    for entry in entries {
        if best.len() < keep {
            best.push(entry);
        } else if let Some(mut worst) = best.peek_mut() {
            if entry < *worst {
                *worst = entry;
            }
        }
    }
    best.into_iter().map(Reverse).collect()
}

fn count32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests;

/// Counts a placed task into the pass: its write, with the generic resource units it was given (remembered
/// per node slot, to be taken back from the node set at the end of the pass).
fn record(
    pass: &mut SchedulePass,
    generic_placed: &mut Vec<(usize, Vec<shoal_api::GenericResource>)>,
    mut t: Task,
    slot: usize,
    claims: Vec<shoal_api::GenericResource>,
) {
    if !claims.is_empty() {
        t.assigned_generic_resources = claims.clone();
        generic_placed.push((slot, claims));
    }
    pass.changes.update(t);
    pass.assigned += 1;
}

/// A copy of `task` placed on `node_id`: state ASSIGNED at `now`.
fn assigned(task: &Task, node_id: &str, now: shoal_api::prost_types::Timestamp) -> Task {
    let mut t = task.clone();
    t.node_id = node_id.to_string();
    t.status = Some(TaskStatus {
        timestamp: Some(now),
        state: TaskState::Assigned as i32,
        message: ASSIGNED_MESSAGE.to_string(),
        ..Default::default()
    });
    t.meta_mut().updated_at = Some(now);
    t
}
