//! Rebalancing (Shoal's own; SwarmKit #310, moby #24103): with the cluster setting
//! `Orchestration.shoal_rebalance` on (`shoal swarm update --rebalance`), replicated tasks move to nodes
//! that joined (or became available) after them, when a service's spread is uneven by more than one task per
//! node. Off by default: SwarmKit, Docker swarm and Nomad never move a running task on their own.
//!
//! A move stops one task on a node holding the most of the service (desired SHUTDOWN); the replicated
//! orchestrator refills the slot and the scheduler's spread puts the new task on a node holding the fewest.
//! At most the service's `UpdateConfig.Parallelism` tasks move at once (0: all that need to), in stop-first
//! order; a service whose update order is start-first is not rebalanced (a start-first move needs the update
//! supervisor to run two tasks in one slot, which it does only for spec changes).
//!
//! How it avoids flapping:
//! - only a settled service moves: every task meant to run is RUNNING, none is pending or stopping, and no
//!   update or rollback is in progress or paused. The next moves wait until the last ones' replacements run;
//! - the spread is measured against the nodes that can take one more task of the service now (the scheduler's
//!   filters: ready, active, resources, constraints, platform, max replicas per node), and a task moves only
//!   from a node holding at least two more than such a node: each move lowers the sum of squared counts, so a
//!   sequence of moves ends, and a move never makes another one necessary;
//! - a destination node must have been unchanged for `SETTLE_MS` (its object's last write), so a node that
//!   flaps between ready and down does not attract tasks.
//!
//! The core is `plan(tables, now_ms)`; the loop (`Rebalancer`) runs it when a commit touches nodes, tasks,
//! services or the cluster object, at most every `DEBOUNCE_MS`, and again when a node settles.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use shoal_api::{service_spec, update_config::UpdateOrder, update_status::UpdateState, Task, TaskState};
use shoal_store::{Changes, Object, StoreObject, Tables, WatchError};
use tokio::sync::watch;

use super::observed_state;
use super::update::EffectiveUpdateConfig;
use crate::scheduler::{NodeSet, Pipeline};
use crate::state::ClusterState;
use crate::subsystem::{stopped, Subsystem, SubsystemFuture};

/// How long a node's object must be unchanged before tasks move to it.
pub const SETTLE_MS: u64 = 5_000;
/// Least time between two passes.
pub const DEBOUNCE_MS: u64 = 1_000;

/// True when the cluster setting is on.
pub fn enabled(tables: &Tables) -> bool {
    tables.clusters().iter().any(|c| c.spec.as_ref().and_then(|s| s.orchestration.as_ref()).is_some_and(|o| o.shoal_rebalance))
}

/// What a pass decided: the tasks to stop, and when to look again for nodes that have not settled yet.
#[derive(Debug, Default)]
pub struct Plan {
    /// Tasks set to desired SHUTDOWN.
    pub changes: Changes,
    /// The earliest time a node that is not settled yet will be (ms since the epoch).
    pub wake_at_ms: Option<u64>,
}

/// The moves of every settled replicated service (see the module doc), stamped `now_ms`.
pub fn plan(tables: &Tables, now_ms: u64) -> Plan {
    let mut plan = Plan::default();
    if !enabled(tables) {
        return plan;
    }
    let nodes = NodeSet::build(tables);
    let mut pipeline = Pipeline::default();
    for service in tables.services().iter() {
        let Some(spec) = service.spec.as_ref() else { continue };
        let Some(service_spec::Mode::Replicated(_)) = spec.mode else { continue };
        if service.pending_delete {
            continue;
        }
        let state = service.update_status.as_ref().map(|s| s.state()).unwrap_or(UpdateState::Unknown);
        if !matches!(state, UpdateState::Unknown | UpdateState::Completed | UpdateState::RollbackCompleted) {
            continue;
        }
        let cfg = EffectiveUpdateConfig::of(spec.update.as_ref());
        if cfg.order == UpdateOrder::StartFirst {
            continue;
        }
        let tasks: Vec<&Arc<Task>> = tables.tasks().by_service(&service.id).collect();
        // Settled: every task meant to run runs, and nothing is on its way out.
        let live = |t: &Task| !observed_state(t).is_terminal() && !t.node_id.is_empty();
        let settled = tasks.iter().all(|t| {
            if t.desired_state() <= TaskState::Running {
                observed_state(t) == TaskState::Running
            } else {
                !live(t) || observed_state(t) > TaskState::Running
            }
        });
        let running: Vec<&Arc<Task>> =
            tasks.iter().copied().filter(|t| t.desired_state() == TaskState::Running && live(t)).collect();
        if !settled || running.is_empty() {
            continue;
        }
        let mut per_node: HashMap<&str, Vec<&Arc<Task>>> = HashMap::new();
        for t in &running {
            per_node.entry(t.node_id.as_str()).or_default().push(t);
        }
        // Destinations: nodes that could take one more task of this service now and have settled.
        pipeline.set_task(running[0]);
        let mut dests: Vec<(usize, &str)> = Vec::new();
        for info in nodes.iter() {
            if !pipeline.process(info) {
                continue;
            }
            let changed_ms =
                info.node().meta.as_ref().and_then(|m| m.updated_at.as_ref()).map_or(0, shoal_api::timestamp_to_unix_ms);
            if now_ms < changed_ms.saturating_add(SETTLE_MS) {
                let at = changed_ms.saturating_add(SETTLE_MS);
                plan.wake_at_ms = Some(plan.wake_at_ms.map_or(at, |w| w.min(at)));
                continue;
            }
            dests.push((info.service_tasks(&service.id), info.id()));
        }
        if dests.is_empty() {
            continue;
        }
        // Simulate moves one at a time: the fullest node gives one to the emptiest destination while they
        // differ by two or more, up to the parallelism.
        let mut sources: Vec<(usize, &str)> = per_node.iter().map(|(n, ts)| (ts.len(), *n)).collect();
        let budget = if cfg.parallelism == 0 { usize::MAX } else { cfg.parallelism as usize };
        let mut moved: HashMap<&str, usize> = HashMap::new();
        for _ in 0..budget {
            sources.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
            dests.sort();
            let (Some(&(from_count, from)), Some(&(to_count, to))) = (sources.first(), dests.first()) else { break };
            if from == to || from_count < to_count + 2 {
                break;
            }
            let taken = moved.entry(from).or_insert(0);
            // The task to stop: the node's newest (the last to come, the first to go).
            let mut on_node = per_node[from].clone();
            on_node.sort_by_key(|t| std::cmp::Reverse(super::created_ms(t)));
            let Some(task) = on_node.get(*taken) else { break };
            *taken += 1;
            let mut t = (***task).clone();
            t.set_desired_state(TaskState::Shutdown);
            t.meta_mut().updated_at = Some(shoal_api::timestamp_from_unix_ms(now_ms));
            plan.changes.update(t);
            sources[0].0 -= 1;
            if let Some(s) = sources.iter_mut().find(|s| s.1 == to) {
                s.0 += 1;
            } else {
                sources.push((1, to));
            }
            dests[0].0 += 1;
            if let Some(d) = dests.iter_mut().find(|d| d.1 == from) {
                d.0 -= 1;
            }
        }
    }
    plan
}

/// The rebalancer as a leader-only subsystem.
#[derive(Debug, Default, Clone, Copy)]
pub struct Rebalancer;

impl Subsystem for Rebalancer {
    fn name(&self) -> &'static str {
        "rebalancer"
    }

    fn run(&self, state: ClusterState, stop: watch::Receiver<bool>) -> SubsystemFuture {
        Box::pin(run(state, stop))
    }
}

fn relevant(commit: &shoal_store::Commit) -> bool {
    commit.changes.iter().any(|c| matches!(c.object, Object::Node(_) | Object::Task(_) | Object::Service(_) | Object::Cluster(_)))
}

async fn run(state: ClusterState, mut stop: watch::Receiver<bool>) {
    let (mut dirty, mut events) = state.store.view_and_watch(enabled);
    let mut wake: Option<tokio::time::Instant> = None;
    let mut last_pass: Option<tokio::time::Instant> = None;
    loop {
        if dirty {
            let now = tokio::time::Instant::now();
            // At most one pass per DEBOUNCE_MS: a burst of commits makes one pass.
            if let Some(at) = last_pass.map(|p| p + Duration::from_millis(DEBOUNCE_MS)).filter(|at| *at > now) {
                wake = Some(wake.map_or(at, |w| w.min(at)));
            } else {
                dirty = false;
                last_pass = Some(now);
                let now_ms = state.clock.now_unix_ms();
                let plan = state.store.view(|t| plan(t, now_ms));
                if let Some(at) = plan.wake_at_ms {
                    let at = now + Duration::from_millis(at.saturating_sub(now_ms));
                    wake = Some(wake.map_or(at, |w| w.min(at)));
                }
                if !plan.changes.is_empty() {
                    let n = plan.changes.len();
                    match state.propose(plan.changes).await {
                        Ok(_) => tracing::info!(tasks = n, "rebalancing: stopping tasks on the fullest nodes"),
                        Err(e) => {
                            tracing::debug!(error = %e, "rebalancing write failed; looking again");
                            dirty = true;
                        }
                    }
                }
            }
        }
        let timer = async {
            match wake {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = stopped(&mut stop) => return,
            _ = timer => {
                wake = None;
                dirty = true;
            }
            r = events.recv() => match r {
                Ok(commit) => {
                    // Only while the setting is on (turning it on is a cluster commit): an idle cluster wakes nobody.
                    let on = state.store.view(enabled);
                    dirty |= on && relevant(&commit);
                    while let Ok(c) = events.try_recv() {
                        dirty |= on && relevant(&c);
                    }
                }
                Err(WatchError::Lagged(_)) => dirty = true,
                Err(WatchError::Closed) => return,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::orchestrator::fixture::{node, service, Fx};
    use shoal_api::{ClusterSpec, OrchestrationConfig};

    fn enable(fx: &Fx, on: bool) {
        let cluster = shoal_api::Cluster {
            id: "c1".into(),
            spec: Some(ClusterSpec {
                orchestration: Some(OrchestrationConfig { shoal_rebalance: on, ..Default::default() }),
                ..Default::default()
            }),
            ..Default::default()
        };
        fx.create(cluster);
    }

    /// Places `n` running tasks of `svc` on the given nodes (created long ago).
    fn run_tasks(fx: &Fx, svc: &str, on: &[&str]) {
        fx.reconcile(svc);
        let tasks = fx.runnable(svc);
        assert_eq!(tasks.len(), on.len());
        for (t, n) in tasks.iter().zip(on) {
            fx.place(&t.id, n, TaskState::Running);
        }
    }

    fn stopped_on(fx: &Fx, plan: &Plan) -> Vec<String> {
        let mut nodes: Vec<String> = plan
            .changes
            .actions()
            .iter()
            .map(|a| match &a.object {
                Object::Task(t) => {
                    assert_eq!(t.desired_state(), TaskState::Shutdown);
                    fx.task(&t.id).node_id
                }
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        nodes.sort();
        nodes
    }

    #[test]
    fn moves_tasks_from_the_fullest_nodes_to_a_node_that_joined_later_within_the_parallelism() {
        let fx = Fx::new();
        fx.create(node("n1"));
        fx.create(node("n2"));
        fx.create(service("s1", 6));
        run_tasks(&fx, "s1", &["n1", "n1", "n1", "n2", "n2", "n2"]);
        // Off: nothing moves, whatever the spread.
        let later = fx.now() + 60_000;
        let mut n3 = node("n3");
        n3.meta_mut().updated_at = Some(shoal_api::timestamp_from_unix_ms(fx.now()));
        fx.create(n3);
        assert!(plan(&fx.view(|t| t.clone()), later).changes.is_empty());

        enable(&fx, true);
        // The new node has not settled yet: look again when it has.
        let p = fx.view(|t| plan(t, fx.now()));
        assert!(p.changes.is_empty());
        assert!(p.wake_at_ms.is_some());
        // Settled: parallelism 1 (the default) moves one task, from one of the fullest nodes.
        let p = fx.view(|t| plan(t, later));
        let from = stopped_on(&fx, &p);
        assert_eq!(from.len(), 1);
        assert!(from[0] == "n1" || from[0] == "n2");
        // With parallelism 0, both moves needed at once: one from each of n1 and n2 (3,3,0 -> 2,2,2).
        fx.update_service("s1", |s| s.update = Some(shoal_api::UpdateConfig { parallelism: 0, ..Default::default() }));
        let p = fx.view(|t| plan(t, later));
        assert_eq!(stopped_on(&fx, &p), vec!["n1".to_string(), "n2".to_string()]);
    }

    #[test]
    fn an_even_unsettled_or_start_first_service_stays_where_it_is() {
        let fx = Fx::new();
        enable(&fx, true);
        for n in ["n1", "n2", "n3"] {
            fx.create(node(n));
        }
        let later = fx.now() + 60_000;
        // Uneven by one only: 2, 1, 1.
        fx.create(service("even", 4));
        run_tasks(&fx, "even", &["n1", "n1", "n2", "n3"]);
        assert!(fx.view(|t| plan(t, later)).changes.is_empty());

        // A task not running yet: wait.
        fx.create(service("busy", 3));
        fx.reconcile("busy");
        let tasks = fx.runnable("busy");
        fx.place(&tasks[0].id, "n1", TaskState::Running);
        fx.place(&tasks[1].id, "n1", TaskState::Running);
        fx.place(&tasks[2].id, "n1", TaskState::Starting);
        assert!(fx.view(|t| plan(t, later)).changes.is_empty());
        fx.set_state(&tasks[2].id, TaskState::Running);
        assert_eq!(fx.view(|t| plan(t, later)).changes.len(), 1, "3, 0, 0 moves once settled");

        // Start-first services are left alone.
        fx.update_service("busy", |s| {
            s.update = Some(shoal_api::UpdateConfig { order: UpdateOrder::StartFirst as i32, ..Default::default() })
        });
        assert!(fx.view(|t| plan(t, later)).changes.is_empty());
    }
}
