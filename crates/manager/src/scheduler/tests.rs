//! Unit tests of the scheduler: spread, each filter, the pending explanation, and the loop reacting to a
//! node that becomes ready. The core runs over a `LocalProposer` store; the loop under tokio's paused time.

use std::collections::HashMap;
use std::time::Duration;

use shoal_api::node_spec::Availability;
use shoal_api::{node_status, Annotations, Placement, Platform, ResourceRequirements, Resources, Service, TaskState};

use super::*;
use crate::orchestrator::fixture::{node, service, Fx};

/// Creates the service, reconciles it (pending tasks), runs one scheduling pass and applies it.
fn schedule(fx: &Fx, svc: Service) -> SchedulePass {
    let id = svc.id.clone();
    fx.create(svc);
    fx.reconcile(&id);
    run_pass(fx)
}

fn run_pass(fx: &Fx) -> SchedulePass {
    let mut s = Scheduler::new();
    let now = fx.now();
    let mut pass = fx.view(|t| s.schedule(t, &PendingTasks::All, now));
    let changes = std::mem::take(&mut pass.changes);
    fx.apply(changes);
    pass
}

/// Tasks of the service per node ID ("" for unplaced).
fn placement(fx: &Fx, service_id: &str) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for t in fx.runnable(service_id) {
        *m.entry(t.node_id.clone()).or_default() += 1;
    }
    m
}

fn with_placement(mut s: Service, f: impl FnOnce(&mut Placement)) -> Service {
    let task = s.spec.as_mut().unwrap().task.as_mut().unwrap();
    f(task.placement.get_or_insert_with(Default::default));
    s
}

fn with_reservation(mut s: Service, nano_cpus: i64) -> Service {
    s.spec.as_mut().unwrap().task.as_mut().unwrap().resources = Some(ResourceRequirements {
        reservations: Some(Resources { nano_cpus, ..Default::default() }),
        ..Default::default()
    });
    s
}

#[test]
fn spreads_tasks_evenly_and_prefers_nodes_without_the_service() {
    let fx = Fx::new();
    for n in ["n1", "n2", "n3"] {
        fx.create(node(n));
    }
    let pass = schedule(&fx, service("a", 2));
    assert_eq!(pass.assigned, 2);
    let pass = schedule(&fx, service("b", 7));
    assert_eq!((pass.assigned, pass.unplaced), (7, 0));
    let b = placement(&fx, "b");
    let mut counts: Vec<usize> = b.values().copied().collect();
    counts.sort();
    assert_eq!(counts, vec![2, 2, 3]);
    // The node without a task of "a" takes the seventh (fewest tasks overall breaks the tie).
    let a = placement(&fx, "a");
    let free = ["n1", "n2", "n3"].into_iter().find(|n| !a.contains_key(*n)).unwrap();
    assert_eq!(b[free], 3);
    for t in fx.runnable("b") {
        let st = t.status.unwrap();
        assert_eq!((st.state(), st.message.as_str()), (TaskState::Assigned, ASSIGNED_MESSAGE));
    }
}

#[test]
fn only_ready_active_nodes_take_tasks() {
    // (availability, node state, takes tasks)
    let cases = [
        (Availability::Active, node_status::State::Ready, true),
        (Availability::Pause, node_status::State::Ready, false),
        (Availability::Drain, node_status::State::Ready, false),
        (Availability::Active, node_status::State::Down, false),
        (Availability::Active, node_status::State::Unknown, false),
        (Availability::Active, node_status::State::Disconnected, false),
    ];
    for (availability, state, takes) in cases {
        let fx = Fx::new();
        let mut n = node("n1");
        n.spec.as_mut().unwrap().set_availability(availability);
        n.status.as_mut().unwrap().set_state(state);
        fx.create(n);
        let pass = schedule(&fx, service("s1", 2));
        assert_eq!(pass.assigned == 2, takes, "{availability:?} {state:?}");
        if !takes {
            let err = fx.runnable("s1")[0].status.clone().unwrap().err;
            assert_eq!(err, "no suitable node (1 node not available for new tasks)");
        }
    }
}

#[test]
fn constraints_platforms_and_resources_filter_nodes() {
    let labelled = |id: &str, zone: &str| {
        let mut n = node(id);
        n.spec.as_mut().unwrap().annotations =
            Some(Annotations { labels: [("zone".to_string(), zone.to_string())].into(), ..Default::default() });
        n
    };
    let arm = |id: &str| {
        let mut n = node(id);
        n.description.as_mut().unwrap().platform =
            Some(Platform { architecture: "aarch64".into(), os: "linux".into() });
        n
    };
    // Constraint: only east nodes.
    let fx = Fx::new();
    fx.create(labelled("e1", "east"));
    fx.create(labelled("w1", "west"));
    schedule(&fx, with_placement(service("s1", 3), |p| p.constraints = vec!["node.labels.zone==east".into()]));
    assert_eq!(placement(&fx, "s1"), [("e1".to_string(), 3)].into());

    // Platform: amd64 asked, x86_64 node matches, the arm node does not; an empty list matches any.
    let fx = Fx::new();
    fx.create(node("x1"));
    fx.create(arm("a1"));
    let wanted = Platform { architecture: "amd64".into(), os: "linux".into() };
    schedule(&fx, with_placement(service("s1", 2), |p| p.platforms = vec![wanted]));
    assert_eq!(placement(&fx, "s1"), [("x1".to_string(), 2)].into());
    schedule(&fx, service("s2", 2));
    assert_eq!(placement(&fx, "s2").len(), 2);

    // Resources: 3 CPUs each on 4-CPU nodes: one per node, the rest stays pending.
    let fx = Fx::new();
    fx.create(node("n1"));
    fx.create(node("n2"));
    let pass = schedule(&fx, with_reservation(service("s1", 3), 3_000_000_000));
    assert_eq!((pass.assigned, pass.unplaced), (2, 1));
    assert_eq!(placement(&fx, "s1")[""], 1);
    let pending = fx.runnable("s1").into_iter().find(|t| t.node_id.is_empty()).unwrap();
    assert_eq!(pending.status.unwrap().err, "no suitable node (insufficient resources on 2 nodes)");
    // Freeing a node's resources lets the pending task in.
    let placed = fx.runnable("s1").into_iter().find(|t| !t.node_id.is_empty()).unwrap();
    fx.set_state(&placed.id, TaskState::Failed);
    assert_eq!(run_pass(&fx).assigned, 1);
}

#[test]
fn explains_every_refusal_and_writes_it_once() {
    let fx = Fx::new();
    let east = |id: &str| {
        let mut n = node(id);
        n.spec.as_mut().unwrap().annotations =
            Some(Annotations { labels: [("zone".to_string(), "east".to_string())].into(), ..Default::default() });
        n
    };
    let mut down = east("d1");
    down.status.as_mut().unwrap().set_state(node_status::State::Down);
    fx.create(down);
    fx.create(east("e1"));
    fx.create(east("e2"));
    // Filters run in order (ready, resources, constraints): w1 has the CPUs but not the label.
    let mut w1 = node("w1");
    w1.description.as_mut().unwrap().resources.as_mut().unwrap().nano_cpus = 8_000_000_000;
    fx.create(w1);
    let svc = with_reservation(service("s1", 2), 5_000_000_000);
    let svc = with_placement(svc, |p| p.constraints = vec!["node.labels.zone==east".into()]);
    let pass = schedule(&fx, svc);
    assert_eq!((pass.assigned, pass.unplaced), (0, 2));
    for t in fx.runnable("s1") {
        let st = t.status.unwrap();
        assert_eq!(st.state(), TaskState::Pending);
        assert_eq!(
            st.err,
            "no suitable node (insufficient resources on 2 nodes; 1 node not available for new tasks; \
             scheduling constraints not satisfied on 1 node)"
        );
    }
    let again = run_pass(&fx);
    assert_eq!((again.unplaced, again.changes.len()), (2, 0), "an unchanged explanation is not rewritten");

    // No node at all.
    let fx = Fx::new();
    schedule(&fx, service("s1", 1));
    assert_eq!(fx.runnable("s1")[0].status.clone().unwrap().err, NO_SUITABLE_NODE);
}

#[tokio::test(start_paused = true)]
async fn loop_places_pending_tasks_when_a_node_becomes_ready() {
    let fx = Fx::new();
    let mut n = node("n1");
    n.status.as_mut().unwrap().set_state(node_status::State::Down);
    fx.create(n);
    fx.create(service("s1", 2));
    fx.reconcile("s1");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(subsystem().run(fx.state.clone(), stop_rx));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !fx.runnable("s1").iter().all(|t| !t.status.clone().unwrap().err.is_empty()) {
        assert!(tokio::time::Instant::now() < deadline, "pending explanation not written");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    fx.set_node("n1", |n| n.status.as_mut().unwrap().set_state(node_status::State::Ready));
    while !fx.runnable("s1").iter().all(|t| t.node_id == "n1") {
        assert!(tokio::time::Instant::now() < deadline, "tasks not placed after the node became ready");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(1), task).await.expect("scheduler stops").unwrap();
}
