//! The constraint enforcer (SwarmKit's `orchestrator/constraintenforcer`): when a node changes (its labels,
//! role, availability, resources or status) so that a task it runs no longer fits, the task is rejected,
//! and its orchestrator replaces it (on another node, when one fits) as it replaces any failed task.
//!
//! A task fits its node when the node satisfies the placement constraints of the task's service as the
//! service is now (a service updated in its constraints alone keeps tasks whose node still satisfies them,
//! see `dirty`, so the task's own copy may be outdated; a task without a service uses its own), and when
//! the reservations of the node's tasks, taken oldest first, fit the node's CPU and memory and the generic
//! resource units assigned to them are still offered by the node: the newest tasks beyond them are
//! rejected. Only tasks meant to run (desired <= RUNNING) and not yet ended are
//! looked at, and only on ACTIVE nodes: a drained node's tasks are moved by the orchestrators, a paused
//! node keeps what it runs.
//!
//! Like SwarmKit, the enforcer sets the observed state REJECTED ("task rejected by constraint enforcer",
//! error "assigned node no longer meets constraints") rather than the desired state, which belongs to the
//! orchestrators: they then shut the task down (desired SHUTDOWN, so the agent stops it) and apply the
//! restart policy as for a failure. The observed state only grows; the agent's later SHUTDOWN report is
//! dropped by the dispatcher as older.
//!
//! The core is `reject_noncompliant(tables, node, now_ms)`; the loop (`ConstraintEnforcer`) checks every
//! node once when it starts, then each node whose write changed its spec, description, role or status state. Bounds:
//! at most `MAX_EVENTS_PER_BATCH` commits are drained before a pass, writes carry at most
//! `write::MAX_ACTIONS_PER_WRITE` actions, and a node whose write conflicted is checked again at most
//! `MAX_ATTEMPTS` times in a row. Must not depend on other subsystems; it reads the scheduler's pure
//! constraint matcher and resource arithmetic.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use shoal_api::node_spec::Availability;
use shoal_api::{generic_resource, GenericResource, Node, Task, TaskState};
use shoal_store::{ActionKind, Changes, Object, Tables, WatchError};
use tokio::sync::watch;

use super::{created_ms, observed_state};
use crate::scheduler::constraint;
use crate::scheduler::nodeinfo::Amount;
use crate::state::ClusterState;
use crate::subsystem::{stopped, Subsystem, SubsystemFuture};
use crate::write::{is_conflict, propose_grouped, MAX_ACTIONS_PER_WRITE};

/// The status message of a task the enforcer rejected.
pub(crate) const REJECTED_MESSAGE: &str = "task rejected by constraint enforcer";
/// The status error of a task the enforcer rejected.
pub(crate) const REJECTED_ERR: &str = "assigned node no longer meets constraints";
/// Most commits drained from the watch queue before a pass.
pub(crate) const MAX_EVENTS_PER_BATCH: usize = 10_000;
/// Most checks of one node in a row whose write conflicted (the next change of the node brings it back).
pub(crate) const MAX_ATTEMPTS: u32 = 3;
/// Pause after a write failed for another reason than a conflict (e.g. lost leadership).
const BACKOFF_MS: u64 = 100;

/// The rejections for the tasks of `node` that no longer fit it (see the module doc), stamped `now_ms`.
pub(crate) fn reject_noncompliant(tables: &Tables, node: &Node, now_ms: u64) -> Changes {
    let mut changes = Changes::new();
    let active = node.spec.as_ref().map(|s| s.availability()).unwrap_or(Availability::Active) == Availability::Active;
    if !active {
        return changes;
    }
    let mut tasks: Vec<&Arc<Task>> = tables
        .tasks()
        .by_node(&node.id)
        .filter(|t| t.desired_state() <= TaskState::Running && observed_state(t) < TaskState::Complete)
        .collect();
    tasks.sort_by(|a, b| (created_ms(a), a.id.as_str()).cmp(&(created_ms(b), b.id.as_str())));
    let mut available = Amount::offered_by(node);
    let mut generic = GenericOffer::of(node);
    let mut parsed: HashMap<&str, bool> = HashMap::new();
    for t in tasks {
        let service = tables.services().get(&t.service_id);
        let fits_constraints = match service {
            Some(s) => *parsed.entry(s.id.as_str()).or_insert_with(|| {
                let p = s.spec.as_ref().and_then(|s| s.task.as_ref()).and_then(|t| t.placement.as_ref());
                matches(p.map(|p| p.constraints.as_slice()).unwrap_or(&[]), node)
            }),
            None => {
                let p = t.spec.as_ref().and_then(|s| s.placement.as_ref());
                matches(p.map(|p| p.constraints.as_slice()).unwrap_or(&[]), node)
            }
        };
        let need = Amount::reserved_by(t);
        let fits_resources = need.is_zero() || available.covers(&need);
        if fits_constraints && fits_resources && generic.claim(&t.assigned_generic_resources) {
            available = available.minus(need);
            continue;
        }
        let mut rejected = (**t).clone();
        let status = rejected.status.get_or_insert_with(Default::default);
        status.set_state(TaskState::Rejected);
        status.message = REJECTED_MESSAGE.to_string();
        status.err = REJECTED_ERR.to_string();
        status.timestamp = Some(shoal_api::timestamp_from_unix_ms(now_ms));
        changes.update(rejected);
    }
    changes
}

/// The generic resources a node still offers while its tasks' assigned units are claimed, oldest task first.
#[derive(Debug, Default)]
struct GenericOffer {
    counts: HashMap<String, i64>,
    named: HashSet<(String, String)>,
}

impl GenericOffer {
    fn of(node: &Node) -> GenericOffer {
        let mut offer = GenericOffer::default();
        let generic = node.description.as_ref().and_then(|d| d.resources.as_ref()).map(|r| r.generic.as_slice());
        for g in generic.unwrap_or(&[]) {
            match &g.resource {
                Some(generic_resource::Resource::DiscreteResourceSpec(d)) => {
                    *offer.counts.entry(d.kind.clone()).or_default() += d.value;
                }
                Some(generic_resource::Resource::NamedResourceSpec(r)) => {
                    offer.named.insert((r.kind.clone(), r.value.clone()));
                }
                None => {}
            }
        }
        offer
    }

    /// Claims every unit of `assigned` and returns true, or claims nothing and returns false when one is no
    /// longer offered (its kind or name is gone, or fewer units are left than were assigned).
    fn claim(&mut self, assigned: &[GenericResource]) -> bool {
        let mut counts: HashMap<&str, i64> = HashMap::new();
        let mut named: Vec<(String, String)> = Vec::new();
        for g in assigned {
            match &g.resource {
                Some(generic_resource::Resource::DiscreteResourceSpec(d)) => {
                    *counts.entry(d.kind.as_str()).or_default() += d.value;
                }
                Some(generic_resource::Resource::NamedResourceSpec(r)) => {
                    let unit = (r.kind.clone(), r.value.clone());
                    if !self.named.contains(&unit) || named.contains(&unit) {
                        return false;
                    }
                    named.push(unit);
                }
                None => {}
            }
        }
        if counts.iter().any(|(kind, n)| self.counts.get(*kind).copied().unwrap_or(0) < *n) {
            return false;
        }
        for (kind, n) in counts {
            *self.counts.get_mut(kind).expect("checked above") -= n;
        }
        for unit in named {
            self.named.remove(&unit);
        }
        true
    }
}

/// True when `node` satisfies every constraint. Constraints that do not parse (the control API refuses
/// them) are left alone: the enforcer never rejects a task for a rule it cannot read.
fn matches(exprs: &[String], node: &Node) -> bool {
    match constraint::parse(exprs) {
        Ok(cs) => cs.iter().all(|c| c.matches(node)),
        Err(_) => true,
    }
}

/// True when a node write can change whether its tasks fit: a changed spec (labels, availability, role),
/// description (resources, platform, engine labels), status state or role.
fn node_change_matters(kind: ActionKind, old: Option<&Object>, new: &Node) -> bool {
    if kind == ActionKind::Remove {
        return false;
    }
    let Some(Object::Node(old)) = old else { return true };
    old.spec != new.spec
        || old.description != new.description
        || old.status.as_ref().map(|s| s.state) != new.status.as_ref().map(|s| s.state)
        || old.role != new.role
}

/// The constraint enforcer subsystem (leader only).
#[derive(Debug, Default)]
pub(crate) struct ConstraintEnforcer;

impl Subsystem for ConstraintEnforcer {
    fn name(&self) -> &'static str {
        "constraint-enforcer"
    }

    fn run(&self, state: ClusterState, stop: watch::Receiver<bool>) -> SubsystemFuture {
        Box::pin(run(state, stop))
    }
}

async fn run(state: ClusterState, mut stop: watch::Receiver<bool>) {
    let (mut pending, mut events) =
        state.store.view_and_watch(|t| t.nodes().iter().map(|n| n.id.clone()).collect::<BTreeSet<String>>());
    let mut attempts: HashMap<String, u32> = HashMap::new();
    loop {
        if !pending.is_empty() {
            let now = state.clock.now_unix_ms();
            let nodes = std::mem::take(&mut pending);
            let groups: Vec<(String, Changes)> = state.store.view(|t| {
                nodes
                    .into_iter()
                    .filter_map(|id| {
                        let node = t.nodes().get(&id)?;
                        Some((id, reject_noncompliant(t, node, now)))
                    })
                    .filter(|(_, c)| !c.is_empty())
                    .collect()
            });
            let written: Vec<String> = groups.iter().map(|(id, _)| id.clone()).collect();
            for (id, changes) in &groups {
                tracing::info!(node = %id, tasks = changes.len(), "rejecting tasks that no longer fit their node");
            }
            let failed = propose_grouped(&state, groups, MAX_ACTIONS_PER_WRITE).await;
            let mut backoff = false;
            for (id, e) in failed {
                let n = attempts.entry(id.clone()).or_insert(0);
                *n += 1;
                if *n < MAX_ATTEMPTS {
                    backoff |= !is_conflict(&e);
                    pending.insert(id);
                } else {
                    tracing::warn!(node = %id, error = %e, "could not reject the tasks that no longer fit the node");
                }
            }
            for id in written.iter().filter(|id| !pending.contains(*id)) {
                attempts.remove(id);
            }
            if backoff {
                tokio::select! {
                    biased;
                    _ = stopped(&mut stop) => return,
                    _ = state.sleep_ms(BACKOFF_MS) => {}
                }
            }
            if !pending.is_empty() {
                continue;
            }
        }
        tokio::select! {
            biased;
            _ = stopped(&mut stop) => return,
            r = events.recv() => match r {
                Ok(commit) => {
                    note(&commit, &mut pending);
                    for _ in 1..MAX_EVENTS_PER_BATCH {
                        match events.try_recv() {
                            Ok(c) => note(&c, &mut pending),
                            Err(tokio::sync::broadcast::error::TryRecvError::Lagged(_)) => {
                                let all =
                                    state.store.view(|t| t.nodes().iter().map(|n| n.id.clone()).collect::<Vec<_>>());
                                pending.extend(all);
                            }
                            Err(_) => break,
                        }
                    }
                }
                Err(WatchError::Lagged(n)) => {
                    tracing::warn!(missed = n, "constraint enforcer watch lagged; checking every node");
                    pending.extend(state.store.view(|t| t.nodes().iter().map(|n| n.id.clone()).collect::<Vec<_>>()));
                }
                Err(WatchError::Closed) => return,
            },
        }
    }
}

fn note(commit: &shoal_store::Commit, pending: &mut BTreeSet<String>) {
    for ch in &commit.changes {
        if let Object::Node(n) = &ch.object {
            if node_change_matters(ch.kind, ch.old.as_ref(), n) {
                pending.insert(n.id.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use shoal_api::{Placement, ResourceRequirements, Resources, Service};

    use super::super::fixture::{node, service, Fx};
    use super::*;

    fn constrained(id: &str, constraint: &str) -> Service {
        let mut s = service(id, 1);
        s.spec.as_mut().unwrap().task.as_mut().unwrap().placement =
            Some(Placement { constraints: vec![constraint.into()], ..Default::default() });
        s
    }

    fn label(fx: &Fx, node_id: &str, value: Option<&str>) {
        fx.set_node(node_id, |n| {
            let labels = &mut n.spec.as_mut().unwrap().annotations.get_or_insert_with(Default::default).labels;
            match value {
                Some(v) => {
                    labels.insert("x".into(), v.into());
                }
                None => {
                    labels.remove("x");
                }
            }
        });
    }

    /// Runs the service's task on `node_id`; returns its ID.
    fn run_on(fx: &Fx, service_id: &str, node_id: &str) -> String {
        fx.reconcile(service_id);
        let t = fx.runnable(service_id).pop().unwrap();
        fx.place(&t.id, node_id, TaskState::Running);
        t.id
    }

    /// Applies the enforcer's pass over `node_id`; returns the tasks it rejected.
    fn enforce(fx: &Fx, node_id: &str) -> Vec<String> {
        let now = fx.now();
        let changes = fx.view(|t| reject_noncompliant(t, t.nodes().get(node_id).unwrap(), now));
        let ids = changes
            .clone()
            .into_actions()
            .into_iter()
            .filter_map(|a| match a.object {
                Object::Task(t) => Some(t.id.clone()),
                _ => None,
            })
            .collect();
        fx.apply(changes);
        ids
    }

    #[test]
    fn a_task_whose_node_loses_the_label_is_rejected_and_replaced() {
        let fx = Fx::new();
        fx.create(node("n1"));
        fx.create(node("n2"));
        label(&fx, "n1", Some("1"));
        fx.create(constrained("s1", "node.labels.x==1"));
        let id = run_on(&fx, "s1", "n1");
        assert!(enforce(&fx, "n1").is_empty(), "the node still fits");
        label(&fx, "n1", Some("2"));
        assert_eq!(enforce(&fx, "n1"), std::slice::from_ref(&id));
        let t = fx.task(&id);
        let status = t.status.as_ref().unwrap();
        assert_eq!(
            (status.state(), status.message.as_str(), status.err.as_str()),
            (TaskState::Rejected, REJECTED_MESSAGE, REJECTED_ERR)
        );
        assert!(enforce(&fx, "n1").is_empty(), "rejected once");
        // The orchestrator shuts it down and makes a replacement (which the scheduler may place elsewhere).
        fx.reconcile("s1");
        assert_eq!(fx.task(&id).desired_state(), TaskState::Shutdown);
        let runnable = fx.runnable("s1");
        assert_eq!(runnable.len(), 1);
        assert_ne!(runnable[0].id, id);
    }

    #[test]
    fn drained_and_paused_nodes_are_left_to_the_orchestrators() {
        use shoal_api::node_spec::Availability;
        let fx = Fx::new();
        fx.create(node("n1"));
        label(&fx, "n1", Some("1"));
        fx.create(constrained("s1", "node.labels.x==1"));
        run_on(&fx, "s1", "n1");
        label(&fx, "n1", None);
        for a in [Availability::Pause, Availability::Drain] {
            fx.set_node("n1", |n| n.spec.as_mut().unwrap().set_availability(a));
            assert!(enforce(&fx, "n1").is_empty(), "{a:?}");
        }
    }

    #[test]
    fn the_service_constraints_as_they_are_now_decide() {
        let fx = Fx::new();
        fx.create(node("n1"));
        label(&fx, "n1", Some("1"));
        fx.create(service("s1", 1));
        let id = run_on(&fx, "s1", "n1");
        // A constraints-only update the node satisfies keeps the task (it is not dirty) ...
        fx.update_service("s1", |s| {
            s.task.as_mut().unwrap().placement =
                Some(Placement { constraints: vec!["node.labels.x==1".into()], ..Default::default() });
        });
        fx.reconcile("s1");
        assert_eq!(fx.task(&id).desired_state(), TaskState::Running);
        // ... and removing the label then rejects it, though its own spec has no constraint.
        label(&fx, "n1", None);
        assert_eq!(enforce(&fx, "n1"), [id]);
    }

    #[test]
    fn a_task_whose_generic_units_the_node_no_longer_offers_is_rejected() {
        use shoal_api::generic::{discrete, named};
        let fx = Fx::new();
        let mut n = node("n1");
        n.description.as_mut().unwrap().resources.as_mut().unwrap().generic =
            vec![named("gpu", "a"), named("gpu", "b"), discrete("ssd", 4)];
        fx.create(n);
        fx.create(service("s1", 3));
        fx.reconcile("s1");
        // What the scheduler gave them: gpu a, gpu b and 2 ssd, then 2 ssd.
        let assigned = [vec![named("gpu", "a")], vec![named("gpu", "b"), discrete("ssd", 2)], vec![discrete("ssd", 2)]];
        let mut ids = Vec::new();
        for (t, units) in fx.runnable("s1").into_iter().zip(assigned) {
            fx.clock.advance_ms(10);
            let mut t = fx.task(&t.id);
            t.meta.as_mut().unwrap().created_at = Some(shoal_api::timestamp_from_unix_ms(fx.now()));
            t.assigned_generic_resources = units;
            let mut c = shoal_store::Changes::new();
            c.update(t.clone());
            fx.apply(c);
            fx.place(&t.id, "n1", TaskState::Running);
            ids.push(t.id);
        }
        assert!(enforce(&fx, "n1").is_empty(), "everything assigned is offered");
        // The node comes back offering gpu a only, and 2 ssd: the task holding gpu b goes, and so its 2 ssd
        // are free for the newest task.
        fx.set_node("n1", |n| {
            n.description.as_mut().unwrap().resources.as_mut().unwrap().generic =
                vec![named("gpu", "a"), discrete("ssd", 2)]
        });
        assert_eq!(enforce(&fx, "n1"), std::slice::from_ref(&ids[1]));
        // No ssd at all: the newest goes too.
        fx.set_node("n1", |n| {
            n.description.as_mut().unwrap().resources.as_mut().unwrap().generic = vec![named("gpu", "a")]
        });
        assert_eq!(enforce(&fx, "n1"), std::slice::from_ref(&ids[2]));
    }

    #[test]
    fn the_newest_tasks_beyond_the_node_resources_are_rejected() {
        let fx = Fx::new();
        fx.create(node("n1"));
        let mut s = service("s1", 3);
        s.spec.as_mut().unwrap().task.as_mut().unwrap().resources = Some(ResourceRequirements {
            reservations: Some(Resources { nano_cpus: 1_000_000_000, memory_bytes: 0, generic: vec![] }),
            ..Default::default()
        });
        fx.create(s);
        fx.reconcile("s1");
        let mut ids = Vec::new();
        for t in fx.runnable("s1") {
            fx.clock.advance_ms(10);
            fx.place(&t.id, "n1", TaskState::Running);
            ids.push(t.id);
        }
        let created: Vec<u64> = ids.iter().map(|id| created_ms(&fx.task(id))).collect();
        assert!(enforce(&fx, "n1").is_empty(), "4 CPUs hold 3");
        // The node now offers 2 CPUs: one task goes, the newest created (the last in ID order on a tie).
        fx.set_node("n1", |n| n.description.as_mut().unwrap().resources.as_mut().unwrap().nano_cpus = 2_000_000_000);
        let rejected = enforce(&fx, "n1");
        assert_eq!(rejected.len(), 1);
        let mut by_age: Vec<(u64, &String)> = created.iter().copied().zip(ids.iter()).collect();
        by_age.sort();
        assert_eq!(&rejected[0], by_age.last().unwrap().1);
    }
}
