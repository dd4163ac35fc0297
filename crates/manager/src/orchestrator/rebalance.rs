//! Rebalancing (Shoal's own; SwarmKit #310, moby #24103): with the cluster setting
//! `Orchestration.shoal_rebalance` on (`shoal swarm update --rebalance`), replicated tasks move to nodes
//! that joined (or became available) after them, when a service's spread is uneven by more than one task per
//! node. Off by default: SwarmKit, Docker swarm and Nomad never move a running task on their own.
//!
//! A move replaces one task on a node holding the most of the service, in the service's update order:
//! stop-first stops it (desired SHUTDOWN) and the replicated orchestrator refills the slot; start-first
//! creates its replacement in the same slot first and stops the old task once the new one runs (the next pass
//! does that). Either way the scheduler's spread puts the new task on a node holding the fewest. At most the
//! service's `UpdateConfig.Parallelism` tasks move at once (0: all that need to).
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

use shoal_api::{service_spec, update_config::UpdateOrder, update_status::UpdateState, Task, TaskState};
use shoal_store::{Changes, IdSource, Object, StoreObject, Tables, WatchError};
use tokio::sync::watch;

use super::observed_state;
use super::update::EffectiveUpdateConfig;
use crate::scheduler::{NodeSet, Pipeline};
use crate::state::ClusterState;
use crate::subsystem::{stopped, Subsystem, SubsystemFuture};

/// How long a node's object must be unchanged before tasks move to it.
pub(crate) const SETTLE_MS: u64 = 5_000;
/// Least time between two passes.
pub(crate) const DEBOUNCE_MS: u64 = 1_000;

/// True when the cluster setting is on.
pub(crate) fn enabled(tables: &Tables) -> bool {
    tables
        .clusters()
        .iter()
        .any(|c| c.spec.as_ref().and_then(|s| s.orchestration.as_ref()).is_some_and(|o| o.shoal_rebalance))
}

/// What a pass decided: the tasks to stop, and when to look again for nodes that have not settled yet.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// Tasks set to desired SHUTDOWN.
    pub changes: Changes,
    /// The earliest time a node that is not settled yet will be (ms since the epoch).
    pub wake_at_ms: Option<u64>,
}

/// The moves of every settled replicated service (see the module doc), stamped `now_ms`; `ids` names the
/// replacements of start-first moves.
pub(crate) fn plan(tables: &Tables, now_ms: u64, ids: &dyn IdSource) -> Plan {
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
        let start_first = cfg.order == UpdateOrder::StartFirst;
        let tasks: Vec<&Arc<Task>> = tables.tasks().by_service(&service.id).collect();
        if start_first && finish_start_first_moves(&tasks, now_ms, &mut plan.changes) {
            // Moves under way: the next ones wait until their replacements run and the old tasks stop.
            continue;
        }
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
            let changed_ms = info
                .node()
                .meta
                .as_ref()
                .and_then(|m| m.updated_at.as_ref())
                .map_or(0, shoal_api::timestamp_to_unix_ms);
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
        let budget =
            if cfg.parallelism == 0 { usize::MAX } else { usize::try_from(cfg.parallelism).unwrap_or(usize::MAX) };
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
            if start_first {
                let work = super::replicated::Work {
                    tables,
                    service,
                    now_ms,
                    ids,
                    slots: Default::default(),
                    wake_at_ms: None,
                    filled: (0, 0),
                    nodes: None,
                };
                plan.changes.create((*work.new_task(task.slot, TaskState::Running).task).clone());
            } else {
                let mut t = (***task).clone();
                t.set_desired_state(TaskState::Shutdown);
                t.meta_mut().updated_at = Some(shoal_api::timestamp_from_unix_ms(now_ms));
                plan.changes.update(t);
            }
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

/// Start-first moves under way: in each slot holding more than one task meant to run, once the newest runs
/// the older ones are stopped (added to `changes`). True when any slot holds more than one (a move is under
/// way, done in this pass or not).
fn finish_start_first_moves(tasks: &[&Arc<Task>], now_ms: u64, changes: &mut Changes) -> bool {
    let mut by_slot: HashMap<u64, Vec<&Arc<Task>>> = HashMap::new();
    for t in tasks.iter().filter(|t| t.desired_state() == TaskState::Running && !observed_state(t).is_terminal()) {
        by_slot.entry(t.slot).or_default().push(t);
    }
    let mut under_way = false;
    for slot_tasks in by_slot.values_mut().filter(|v| v.len() > 1) {
        under_way = true;
        slot_tasks.sort_by_key(|t| super::created_ms(t));
        let (newest, older) = slot_tasks.split_last().expect("more than one");
        if observed_state(newest) != TaskState::Running {
            continue;
        }
        for t in older {
            let mut t = (***t).clone();
            t.set_desired_state(TaskState::Shutdown);
            t.meta_mut().updated_at = Some(shoal_api::timestamp_from_unix_ms(now_ms));
            changes.update(t);
        }
    }
    under_way
}

/// The rebalancer as a leader-only subsystem.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Rebalancer;

impl Subsystem for Rebalancer {
    fn name(&self) -> &'static str {
        "rebalancer"
    }

    fn run(&self, state: ClusterState, stop: watch::Receiver<bool>) -> SubsystemFuture {
        Box::pin(run(state, stop))
    }
}

fn relevant(commit: &shoal_store::Commit) -> bool {
    commit
        .changes
        .iter()
        .any(|c| matches!(c.object, Object::Node(_) | Object::Task(_) | Object::Service(_) | Object::Cluster(_)))
}

async fn run(state: ClusterState, mut stop: watch::Receiver<bool>) {
    let (mut dirty, mut events) = state.store.view_and_watch(enabled);
    // Times on `state.timer`, in ms.
    let mut wake: Option<u64> = None;
    let mut last_pass: Option<u64> = None;
    loop {
        if dirty {
            let now = state.timer.now_ms();
            // At most one pass per DEBOUNCE_MS: a burst of commits makes one pass.
            if let Some(at) = last_pass.map(|p| p + DEBOUNCE_MS).filter(|at| *at > now) {
                wake = Some(wake.map_or(at, |w| w.min(at)));
            } else {
                dirty = false;
                last_pass = Some(now);
                let now_ms = state.clock.now_unix_ms();
                let plan = state.store.view(|t| plan(t, now_ms, &*state.ids));
                if let Some(at) = plan.wake_at_ms {
                    let at = now + at.saturating_sub(now_ms);
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
                Some(at) => state.sleep_ms(at.saturating_sub(state.timer.now_ms())).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
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

    fn ids() -> crate::state::RandomIds {
        crate::state::RandomIds::seeded(3)
    }

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
        assert!(plan(&fx.view(|t| t.clone()), later, &ids()).changes.is_empty());

        enable(&fx, true);
        // The new node has not settled yet: look again when it has.
        let p = fx.view(|t| plan(t, fx.now(), &ids()));
        assert!(p.changes.is_empty());
        assert!(p.wake_at_ms.is_some());
        // Settled: parallelism 1 (the default) moves one task, from one of the fullest nodes.
        let p = fx.view(|t| plan(t, later, &ids()));
        let from = stopped_on(&fx, &p);
        assert_eq!(from.len(), 1);
        assert!(from[0] == "n1" || from[0] == "n2");
        // With parallelism 0, both moves needed at once: one from each of n1 and n2 (3,3,0 -> 2,2,2).
        fx.update_service("s1", |s| s.update = Some(shoal_api::UpdateConfig { parallelism: 0, ..Default::default() }));
        let p = fx.view(|t| plan(t, later, &ids()));
        assert_eq!(stopped_on(&fx, &p), vec!["n1".to_string(), "n2".to_string()]);
    }

    #[test]
    fn a_start_first_move_starts_the_replacement_then_stops_the_old_task() {
        let fx = Fx::new();
        enable(&fx, true);
        fx.create(node("n1"));
        fx.create(node("n2"));
        let mut svc = service("s1", 2);
        svc.spec.as_mut().unwrap().update = Some(shoal_api::UpdateConfig {
            parallelism: 1,
            order: UpdateOrder::StartFirst as i32,
            ..Default::default()
        });
        fx.create(svc);
        run_tasks(&fx, "s1", &["n1", "n1"]);
        let later = fx.now() + 60_000;
        // 2, 0: a new task in the slot of one of n1's tasks, nothing stopped yet.
        let p = fx.view(|t| plan(t, later, &ids()));
        let created: Vec<Task> = p
            .changes
            .actions()
            .iter()
            .map(|a| match (&a.kind, &a.object) {
                (shoal_store::ActionKind::Create, Object::Task(t)) => (**t).clone(),
                other => panic!("expected a created task, got {other:?}"),
            })
            .collect();
        assert_eq!(created.len(), 1);
        let new = &created[0];
        assert_eq!((new.desired_state(), new.node_id.as_str()), (TaskState::Running, ""));
        let old = fx.runnable("s1").into_iter().find(|t| t.slot == new.slot).unwrap();
        fx.apply(p.changes);
        // The orchestrator leaves the slot's two tasks alone (no update is running, both are up to date).
        assert_eq!(fx.pending_changes("s1"), 0);
        // While the replacement is not running: no change, no further move.
        assert!(fx.view(|t| plan(t, later, &ids())).changes.is_empty());
        // Once it runs on n2, the old task of its slot stops.
        fx.place(&new.id, "n2", TaskState::Running);
        assert_eq!(fx.pending_changes("s1"), 0);
        let p = fx.view(|t| plan(t, later, &ids()));
        assert_eq!(stopped_on(&fx, &p), vec!["n1".to_string()]);
        match &p.changes.actions()[0].object {
            Object::Task(t) => assert_eq!(t.id, old.id),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_even_or_unsettled_service_stays_where_it_is() {
        let fx = Fx::new();
        enable(&fx, true);
        for n in ["n1", "n2", "n3"] {
            fx.create(node(n));
        }
        let later = fx.now() + 60_000;
        // Uneven by one only: 2, 1, 1.
        fx.create(service("even", 4));
        run_tasks(&fx, "even", &["n1", "n1", "n2", "n3"]);
        assert!(fx.view(|t| plan(t, later, &ids())).changes.is_empty());

        // A task not running yet: wait.
        fx.create(service("busy", 3));
        fx.reconcile("busy");
        let tasks = fx.runnable("busy");
        fx.place(&tasks[0].id, "n1", TaskState::Running);
        fx.place(&tasks[1].id, "n1", TaskState::Running);
        fx.place(&tasks[2].id, "n1", TaskState::Starting);
        assert!(fx.view(|t| plan(t, later, &ids())).changes.is_empty());
        fx.set_state(&tasks[2].id, TaskState::Running);
        assert_eq!(fx.view(|t| plan(t, later, &ids())).changes.len(), 1, "3, 0, 0 moves once settled");
    }
}
