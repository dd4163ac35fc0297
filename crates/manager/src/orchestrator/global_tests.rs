//! Unit tests of the global orchestrator: the sans-IO core (`reconcile_global`) over a `LocalProposer` and a
//! `ManualClock` (node eligibility as a table, then joins, drains, down nodes, restarts, rolling updates and
//! per-node history, a failing update rolled back), the scheduler's check of tasks created with their node, and the
//! loop under tokio's paused time.

use std::time::Duration;

use shoal_api::node_spec::Availability;
use shoal_api::restart_policy::RestartCondition;
use shoal_api::update_status::UpdateState;
use shoal_api::{
    node_status, service_spec::Mode, GlobalService, Node, Placement, Platform, ResourceRequirements, Resources,
    RestartPolicy, Service, TaskState, UpdateConfig,
};
use shoal_store::Changes;

use super::fixture::{node, service, set_image, wait_until, Fx};
use super::global::reconcile_global;
use super::taskreaper::reap;
use super::*;

/// A global service running busybox, restarting after `delay_ms`.
fn global(id: &str, delay_ms: u64) -> Service {
    let mut s = service(id, 0);
    let spec = s.spec.as_mut().unwrap();
    spec.mode = Some(Mode::Global(GlobalService {}));
    spec.task.as_mut().unwrap().restart = Some(RestartPolicy {
        condition: RestartCondition::Any as i32,
        delay: Some(shoal_api::duration_to_proto(Duration::from_millis(delay_ms))),
        ..Default::default()
    });
    s
}

fn with_constraints(mut s: Service, constraints: &[&str]) -> Service {
    let task = s.spec.as_mut().unwrap().task.as_mut().unwrap();
    task.placement.get_or_insert_with(Placement::default).constraints =
        constraints.iter().map(|c| c.to_string()).collect();
    s
}

/// One pass of the global core, applied; returns the wake time.
fn pass(fx: &Fx, id: &str) -> Option<u64> {
    let now = fx.now();
    let r = fx.view(|t| {
        let s = t.services().get(id).cloned().expect("service exists");
        reconcile_global(t, &s, now, fx.state.ids.as_ref())
    });
    fx.apply(r.changes);
    r.wake_at_ms
}

/// Writes a pass would make, without applying them.
fn pending(fx: &Fx, id: &str) -> usize {
    let now = fx.now();
    fx.view(|t| {
        let s = t.services().get(id).cloned().expect("service exists");
        reconcile_global(t, &s, now, fx.state.ids.as_ref()).changes.len()
    })
}

/// The nodes of the service's tasks meant to run, sorted.
fn nodes_of(fx: &Fx, id: &str) -> Vec<String> {
    let mut v: Vec<String> = fx.runnable(id).into_iter().map(|t| t.node_id).collect();
    v.sort();
    v
}

/// The runnable task on a node.
fn task_on(fx: &Fx, id: &str, node_id: &str) -> shoal_api::Task {
    let mut on: Vec<_> = fx.runnable(id).into_iter().filter(|t| t.node_id == node_id).collect();
    assert_eq!(on.len(), 1, "one runnable task on {node_id}: {on:?}");
    on.pop().unwrap()
}

/// Every runnable task goes RUNNING (what the scheduler and agent would do).
fn run_all(fx: &Fx, id: &str) {
    for t in fx.runnable(id) {
        if observed_state(&t) < TaskState::Running {
            fx.place(&t.id, &t.node_id.clone(), TaskState::Running);
        }
    }
}

fn set_availability(fx: &Fx, id: &str, a: Availability) {
    fx.set_node(id, |n| n.spec.as_mut().unwrap().set_availability(a));
}

fn set_node_state(fx: &Fx, id: &str, s: node_status::State) {
    fx.set_node(id, |n| n.status.as_mut().unwrap().set_state(s));
}

fn labelled(id: &str, key: &str, value: &str) -> Node {
    let mut n = node(id);
    n.spec.as_mut().unwrap().annotations.get_or_insert_with(Default::default).labels.insert(key.into(), value.into());
    n
}

/// One eligibility case: a node as built by `make`, a service as built by `svc`, and whether it gets a task.
fn check(what: &str, make: impl FnOnce() -> Node, svc: impl FnOnce(Service) -> Service, expected: bool) {
    let fx = Fx::new();
    fx.create(make());
    fx.create(svc(global("g", 0)));
    pass(&fx, "g");
    let got = fx.runnable("g").len();
    assert_eq!(got, usize::from(expected), "{what}");
    assert_eq!(pending(&fx, "g"), 0, "{what}: a reconciled service needs no write");
}

#[test]
fn eligibility_of_a_node() {
    let same = |s: Service| s;
    check("ready and active", || node("n1"), same, true);
    check(
        "paused",
        || {
            let mut n = node("n1");
            n.spec.as_mut().unwrap().set_availability(Availability::Pause);
            n
        },
        same,
        false,
    );
    check(
        "drained",
        || {
            let mut n = node("n1");
            n.spec.as_mut().unwrap().set_availability(Availability::Drain);
            n
        },
        same,
        false,
    );
    check(
        "down",
        || {
            let mut n = node("n1");
            n.status.as_mut().unwrap().set_state(node_status::State::Down);
            n
        },
        same,
        false,
    );
    check(
        "status unknown",
        || {
            let mut n = node("n1");
            n.status = None;
            n
        },
        same,
        false,
    );
    check("label matches", || labelled("n1", "x", "y"), |s| with_constraints(s, &["node.labels.x==y"]), true);
    check("label differs", || labelled("n1", "x", "z"), |s| with_constraints(s, &["node.labels.x==y"]), false);
    check("label missing", || node("n1"), |s| with_constraints(s, &["node.labels.x==y"]), false);
    check("role", || node("n1"), |s| with_constraints(s, &["node.role!=manager"]), true);
    let platform = |os: &str| {
        let os = os.to_string();
        move |mut s: Service| {
            s.spec.as_mut().unwrap().task.as_mut().unwrap().placement = Some(Placement {
                platforms: vec![Platform { os: os.clone(), architecture: "amd64".into() }],
                ..Default::default()
            });
            s
        }
    };
    check("platform matches", || node("n1"), platform("linux"), true);
    check("platform differs", || node("n1"), platform("windows"), false);
}

#[test]
fn one_task_per_node_created_bound_to_its_node() {
    let fx = Fx::new();
    fx.create(node("n1"));
    fx.create(node("n2"));
    fx.create(global("g", 0));
    pass(&fx, "g");
    assert_eq!(nodes_of(&fx, "g"), ["n1", "n2"]);
    for t in fx.tasks("g") {
        assert_eq!(t.slot, 0);
        assert_eq!(observed_state(&t), TaskState::Pending);
        assert_eq!(t.desired_state(), TaskState::Running);
    }
    assert_eq!(pending(&fx, "g"), 0);
    // A node joins: it gets a task; a node not yet ready gets one when it becomes ready.
    fx.create(node("n3"));
    let mut n4 = node("n4");
    n4.status.as_mut().unwrap().set_state(node_status::State::Unknown);
    fx.create(n4);
    pass(&fx, "g");
    assert_eq!(nodes_of(&fx, "g"), ["n1", "n2", "n3"]);
    set_node_state(&fx, "n4", node_status::State::Ready);
    pass(&fx, "g");
    assert_eq!(nodes_of(&fx, "g"), ["n1", "n2", "n3", "n4"]);
    // The replicated core leaves a global service alone, and the global core a replicated one.
    assert_eq!(fx.pending_changes("g"), 0);
    fx.create(service("r", 2));
    assert_eq!(pending(&fx, "r"), 0);
}

#[test]
fn drain_shuts_down_and_activation_brings_back() {
    let fx = Fx::new();
    for n in ["n1", "n2", "n3"] {
        fx.create(node(n));
    }
    fx.create(global("g", 0));
    pass(&fx, "g");
    run_all(&fx, "g");
    let old = task_on(&fx, "g", "n2");
    set_availability(&fx, "n2", Availability::Drain);
    pass(&fx, "g");
    assert_eq!(fx.task(&old.id).desired_state(), TaskState::Shutdown);
    assert_eq!(nodes_of(&fx, "g"), ["n1", "n3"], "not replaced elsewhere");
    assert_eq!(pending(&fx, "g"), 0);
    // Activated again: a new task once the old one stopped.
    set_availability(&fx, "n2", Availability::Active);
    pass(&fx, "g");
    assert_eq!(nodes_of(&fx, "g"), ["n1", "n3"], "the old task still runs there");
    fx.set_state(&old.id, TaskState::Shutdown);
    pass(&fx, "g");
    assert_eq!(nodes_of(&fx, "g"), ["n1", "n2", "n3"]);
    assert_ne!(task_on(&fx, "g", "n2").id, old.id);
}

#[test]
fn pause_keeps_the_task_and_adds_none() {
    let fx = Fx::new();
    fx.create(node("n1"));
    fx.create(global("g", 0));
    pass(&fx, "g");
    run_all(&fx, "g");
    set_availability(&fx, "n1", Availability::Pause);
    assert_eq!(pending(&fx, "g"), 0, "a paused node keeps its task");
    // An update does not reach a paused node, and completes.
    fx.update_service("g", |s| set_image(s, "busybox:2"));
    pass(&fx, "g");
    assert_eq!(fx.runnable("g").len(), 1);
    assert_eq!(pending(&fx, "g"), 0);
}

#[test]
fn a_down_node_keeps_its_record_and_gets_a_new_task_when_back() {
    let fx = Fx::new();
    fx.create(node("n1"));
    fx.create(node("n2"));
    fx.create(global("g", 0));
    pass(&fx, "g");
    run_all(&fx, "g");
    let old = task_on(&fx, "g", "n1");
    set_node_state(&fx, "n1", node_status::State::Down);
    pass(&fx, "g");
    assert_eq!(fx.task(&old.id).desired_state(), TaskState::Shutdown, "the record is kept, shut down");
    assert_eq!(nodes_of(&fx, "g"), ["n2"], "nothing replaces it on another node");
    assert_eq!(pending(&fx, "g"), 0);
    // Back: the agent stops the old task (it still reports RUNNING first), then a new one starts.
    set_node_state(&fx, "n1", node_status::State::Ready);
    pass(&fx, "g");
    assert_eq!(nodes_of(&fx, "g"), ["n2"]);
    fx.set_state(&old.id, TaskState::Shutdown);
    pass(&fx, "g");
    assert_eq!(nodes_of(&fx, "g"), ["n1", "n2"]);
    // A removed node: its task is shut down, and no node gains one.
    let t2 = task_on(&fx, "g", "n2");
    let n2 = fx.view(|t| t.nodes().get("n2").cloned()).unwrap();
    let mut c = Changes::new();
    c.remove(n2);
    fx.apply(c);
    pass(&fx, "g");
    assert_eq!(fx.task(&t2.id).desired_state(), TaskState::Shutdown);
    assert_eq!(nodes_of(&fx, "g"), ["n1"]);
    assert_eq!(pending(&fx, "g"), 0);
}

#[test]
fn label_changes_add_and_remove_tasks() {
    let fx = Fx::new();
    fx.create(labelled("n1", "x", "y"));
    fx.create(node("n2"));
    fx.create(with_constraints(global("g", 0), &["node.labels.x==y"]));
    pass(&fx, "g");
    assert_eq!(nodes_of(&fx, "g"), ["n1"]);
    fx.set_node("n2", |n| {
        n.spec.as_mut().unwrap().annotations.get_or_insert_with(Default::default).labels.insert("x".into(), "y".into());
    });
    pass(&fx, "g");
    assert_eq!(nodes_of(&fx, "g"), ["n1", "n2"]);
    fx.set_node("n1", |n| {
        n.spec.as_mut().unwrap().annotations.as_mut().unwrap().labels.remove("x");
    });
    pass(&fx, "g");
    assert_eq!(nodes_of(&fx, "g"), ["n2"]);
}

#[test]
fn a_failed_task_is_replaced_on_its_node_after_the_delay() {
    let fx = Fx::new();
    fx.create(node("n1"));
    fx.create(node("n2"));
    fx.create(global("g", 2_000));
    pass(&fx, "g");
    run_all(&fx, "g");
    let old = task_on(&fx, "g", "n1");
    fx.set_state(&old.id, TaskState::Failed);
    let wake = pass(&fx, "g");
    assert_eq!(wake, Some(fx.now() + 2_000));
    let new = task_on(&fx, "g", "n1");
    assert_ne!(new.id, old.id);
    assert_eq!(new.desired_state(), TaskState::Ready, "waits out the restart delay");
    assert_eq!(fx.task(&old.id).desired_state(), TaskState::Shutdown);
    fx.clock.advance_ms(2_000);
    pass(&fx, "g");
    assert_eq!(fx.task(&new.id).desired_state(), TaskState::Running);
    assert_eq!(nodes_of(&fx, "g"), ["n1", "n2"]);
}

#[test]
fn rolling_update_goes_node_by_node() {
    let fx = Fx::new();
    for n in ["n1", "n2", "n3"] {
        fx.create(node(n));
    }
    fx.create(global("g", 0));
    pass(&fx, "g");
    run_all(&fx, "g");
    fx.update_service("g", |s| {
        set_image(s, "busybox:2");
        s.update = Some(UpdateConfig {
            parallelism: 2,
            delay: Some(shoal_api::duration_to_proto(Duration::from_millis(1_000))),
            ..Default::default()
        });
    });
    let current = fx.service("g").spec.unwrap().task;
    let (mut rounds, mut batches) = (0, 0);
    while fx.runnable("g").iter().any(|t| t.spec.as_deref() != current.as_ref()) || pending(&fx, "g") > 0 {
        rounds += 1;
        assert!(rounds < 20, "the update finishes");
        pass(&fx, "g");
        // Stop-first: a node never runs two tasks of the service, and at most 2 are down at once.
        let stopping: Vec<_> = fx
            .tasks("g")
            .into_iter()
            .filter(|t| t.desired_state() == TaskState::Shutdown && !observed_state(t).is_terminal())
            .collect();
        assert!(stopping.len() <= 2, "parallelism 2: {stopping:?}");
        batches += usize::from(!stopping.is_empty());
        for t in stopping {
            fx.set_state(&t.id, TaskState::Shutdown);
        }
        pass(&fx, "g");
        run_all(&fx, "g");
        fx.clock.advance_ms(1_000);
    }
    assert_eq!(nodes_of(&fx, "g"), ["n1", "n2", "n3"]);
    assert!(fx.runnable("g").iter().all(|t| t.spec.as_deref() == current.as_ref()));
    // Watched for the monitor period (5 s by default) after the last new task started, then completed.
    assert_eq!(fx.service("g").update_status.unwrap().state(), UpdateState::Updating);
    fx.clock.advance_ms(5_000);
    pass(&fx, "g");
    assert_eq!(fx.service("g").update_status.unwrap().state(), UpdateState::Completed);
    assert_eq!(batches, 2, "two batches of at most two nodes");
}

#[test]
fn history_is_kept_per_node() {
    let fx = Fx::new();
    fx.create(node("n1"));
    fx.create(node("n2"));
    fx.create(global("g", 0));
    pass(&fx, "g");
    // n1 fails 7 times, n2 once: retention 5 keeps 5 on n1 and both on n2.
    for _ in 0..7 {
        let t = task_on(&fx, "g", "n1");
        fx.place(&t.id, "n1", TaskState::Running);
        fx.set_state(&t.id, TaskState::Failed);
        fx.clock.advance_ms(10);
        pass(&fx, "g");
    }
    let t = task_on(&fx, "g", "n2");
    fx.place(&t.id, "n2", TaskState::Running);
    fx.set_state(&t.id, TaskState::Failed);
    pass(&fx, "g");
    fx.apply(fx.view(|t| reap(t, [&("g".to_string(), 0)])));
    let on = |n: &str| fx.tasks("g").iter().filter(|t| t.node_id == n).count();
    assert_eq!((on("n1"), on("n2")), (5, 2));
}

#[test]
fn the_scheduler_checks_a_task_on_its_node() {
    use crate::scheduler::{NodeSet, PendingTasks, Scheduler};
    let fx = Fx::new();
    fx.create(node("n1"));
    let mut small = node("n2");
    small.description.as_mut().unwrap().resources =
        Some(Resources { nano_cpus: 1_000_000_000, memory_bytes: 1 << 30, generic: vec![] });
    fx.create(small);
    let mut svc = global("g", 0);
    svc.spec.as_mut().unwrap().task.as_mut().unwrap().resources = Some(ResourceRequirements {
        reservations: Some(Resources { nano_cpus: 2_000_000_000, memory_bytes: 0, generic: vec![] }),
        ..Default::default()
    });
    fx.create(svc);
    pass(&fx, "g");
    let pass = fx.view(|t| {
        let mut nodes = NodeSet::build(t);
        Scheduler::new().schedule(t, &mut nodes, &PendingTasks::All, fx.now())
    });
    assert_eq!((pass.assigned, pass.unplaced), (1, 1));
    fx.apply(pass.changes);
    let on1 = task_on(&fx, "g", "n1");
    assert_eq!(observed_state(&on1), TaskState::Assigned, "its own reservation is not counted twice");
    let on2 = task_on(&fx, "g", "n2");
    assert_eq!(observed_state(&on2), TaskState::Pending);
    let err = on2.status.unwrap().err;
    assert!(err.contains("insufficient resources on 1 node"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn the_loop_follows_nodes() {
    let fx = Fx::new();
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let mut list = subsystems();
    list.push(crate::scheduler::subsystem());
    let runner = tokio::spawn(crate::run_while_leader(fx.state.clone(), list, shutdown_rx));
    fx.create(node("n1"));
    fx.create(global("g", 0));
    let assigned = |fx: &Fx, n: usize| {
        let r = fx.runnable("g");
        r.len() == n && r.iter().all(|t| observed_state(t) == TaskState::Assigned)
    };
    wait_until("a task on n1", Duration::from_secs(5), || assigned(&fx, 1)).await;
    fx.create(node("n2"));
    wait_until("a task on n2", Duration::from_secs(5), || assigned(&fx, 2)).await;
    set_availability(&fx, "n2", Availability::Drain);
    wait_until("n2's task shut down", Duration::from_secs(5), || fx.runnable("g").len() == 1).await;
    // Removing the service: every task marked REMOVE.
    let svc = std::sync::Arc::new(fx.service("g"));
    let mut c = Changes::new();
    c.remove(svc);
    fx.apply(c);
    wait_until("tasks marked for removal", Duration::from_secs(5), || {
        fx.tasks("g").iter().all(|t| t.desired_state() == TaskState::Remove)
    })
    .await;
    fx.proposer.set_leader(false);
    shutdown_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), runner).await.expect("loops stopped").unwrap();
}

#[test]
fn a_failing_global_update_rolls_back_node_by_node() {
    use shoal_api::update_config::FailureAction;
    let fx = Fx::new();
    for n in ["n1", "n2", "n3"] {
        fx.create(node(n));
    }
    fx.create(global("g", 100));
    pass(&fx, "g");
    run_all(&fx, "g");
    let original = fx.service("g").spec;
    let before: Vec<String> = fx.runnable("g").iter().map(|t| t.id.clone()).collect();
    fx.update_service("g", |s| {
        set_image(s, "busybox:bad");
        s.update =
            Some(UpdateConfig { parallelism: 1, failure_action: FailureAction::Rollback as i32, ..Default::default() });
    });
    // The agents: tasks told to stop stop; new tasks of the bad image fail at once, others run.
    let agents = |fx: &Fx| {
        for t in fx.tasks("g") {
            let observed = observed_state(&t);
            let bad = matches!(t.spec.as_ref().and_then(|s| s.runtime.as_ref()),
                Some(shoal_api::task_spec::Runtime::Container(c)) if c.image == "busybox:bad");
            if t.desired_state() > TaskState::Running && !observed.is_terminal() {
                fx.set_state(&t.id, TaskState::Shutdown);
            } else if t.desired_state() == TaskState::Running && observed < TaskState::Running {
                fx.place(&t.id, &t.node_id.clone(), if bad { TaskState::Failed } else { TaskState::Running });
            }
        }
    };
    let mut seen_rollback = false;
    for _ in 0..100 {
        fx.clock.advance_ms(200);
        pass(&fx, "g");
        agents(&fx);
        pass(&fx, "g");
        let state = fx.service("g").update_status.map(|u| u.state());
        seen_rollback |= state == Some(UpdateState::RollbackStarted);
        if state == Some(UpdateState::RollbackCompleted) {
            break;
        }
    }
    assert!(seen_rollback);
    let svc = fx.service("g");
    assert_eq!(svc.update_status.unwrap().state(), UpdateState::RollbackCompleted);
    assert_eq!(svc.spec, original);
    assert_eq!(nodes_of(&fx, "g"), ["n1", "n2", "n3"]);
    let runnable = fx.runnable("g");
    assert!(runnable
        .iter()
        .all(|t| t.spec.as_deref() == original.as_ref().unwrap().task.as_ref()
            && observed_state(t) == TaskState::Running));
    // Parallelism 1: one node got the bad image and was rolled back; the two others kept their task.
    assert_eq!(runnable.iter().filter(|t| before.contains(&t.id)).count(), 2);
}
