//! Unit tests of the replicated orchestrator, restart supervisor, rolling updater and task reaper: the
//! sans-IO cores driven over a `LocalProposer` and a `ManualClock`, and the async loops under tokio's
//! paused time with deadline-bounded waits.

use std::time::Duration;

use shoal_api::restart_policy::RestartCondition;
use shoal_api::update_config::UpdateOrder;
use shoal_api::update_status::UpdateState;
use shoal_api::{
    node_status, service_spec::Mode, Cluster, ClusterSpec, OrchestrationConfig, ReplicatedService, RestartPolicy,
    TaskState, UpdateConfig,
};
use shoal_store::Changes;

use super::fixture::{node, service, set_image, wait_until, Fx};
use super::replicated::PENDING_MESSAGE;
use super::taskreaper::{all_slots, reap};
use super::*;

fn set_replicas(fx: &Fx, id: &str, n: u64) {
    fx.update_service(id, |s| s.mode = Some(Mode::Replicated(ReplicatedService { replicas: n })));
}

fn with_restart(
    id: &str,
    replicas: u64,
    condition: RestartCondition,
    delay_ms: u64,
    max: u64,
    window_ms: u64,
) -> shoal_api::Service {
    let mut s = service(id, replicas);
    s.spec.as_mut().unwrap().task.as_mut().unwrap().restart = Some(RestartPolicy {
        condition: condition as i32,
        delay: Some(shoal_api::duration_to_proto(Duration::from_millis(delay_ms))),
        max_attempts: max,
        window: (window_ms > 0).then(|| shoal_api::duration_to_proto(Duration::from_millis(window_ms))),
    });
    s
}

#[test]
fn scale_up_creates_one_pending_task_per_slot_and_is_idempotent() {
    let fx = Fx::new();
    fx.create(service("s1", 3));
    fx.reconcile("s1");
    let tasks = fx.tasks("s1");
    assert_eq!(tasks.iter().map(|t| t.slot).collect::<Vec<_>>(), vec![1, 2, 3]);
    for t in &tasks {
        assert_eq!(t.desired_state(), TaskState::Running);
        assert_eq!(observed_state(t), TaskState::Pending);
        assert_eq!(t.status.as_ref().unwrap().message, PENDING_MESSAGE);
        assert_eq!(t.spec.as_deref(), fx.service("s1").spec.unwrap().task.as_ref());
        assert_eq!(t.spec_version.as_ref().unwrap().index, 1);
        assert_eq!(t.service_annotations.as_ref().unwrap().name, "svc-s1");
        assert_eq!(created_ms(t), fx.now());
    }
    assert_eq!(fx.pending_changes("s1"), 0, "a reconciled service needs no write");
    set_replicas(&fx, "s1", 5);
    fx.reconcile("s1");
    assert_eq!(fx.runnable("s1").iter().map(|t| t.slot).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5]);
}

#[test]
fn new_tasks_get_the_services_log_driver_else_the_clusters_default() {
    let fx = Fx::new();
    let driver = |name: &str| shoal_api::Driver { name: name.into(), ..Default::default() };
    fx.create(Cluster {
        id: "c1".into(),
        spec: Some(ClusterSpec {
            task_defaults: Some(shoal_api::TaskDefaults { log_driver: Some(driver("local")) }),
            ..Default::default()
        }),
        ..Default::default()
    });
    fx.create(service("plain", 1));
    let mut own = service("own", 1);
    own.spec.as_mut().unwrap().task.as_mut().unwrap().log_driver = Some(driver("json-file"));
    fx.create(own);
    fx.reconcile("plain");
    fx.reconcile("own");
    let name = |id: &str| fx.tasks(id)[0].log_driver.as_ref().map(|d| d.name.clone());
    assert_eq!((name("plain"), name("own")), (Some("local".into()), Some("json-file".into())));
}

#[test]
fn scale_down_removes_not_running_then_highest_slots() {
    let fx = Fx::new();
    fx.create(node("n1"));
    fx.create(service("s1", 4));
    fx.reconcile("s1");
    let tasks = fx.tasks("s1");
    fx.place(&tasks[1].id, "n1", TaskState::Running); // slot 2
    fx.place(&tasks[3].id, "n1", TaskState::Running); // slot 4
    set_replicas(&fx, "s1", 2);
    fx.reconcile("s1");
    let removed: Vec<u64> =
        fx.tasks("s1").iter().filter(|t| t.desired_state() == TaskState::Remove).map(|t| t.slot).collect();
    assert_eq!(removed, vec![1, 3]);
    assert_eq!(fx.runnable("s1").iter().map(|t| t.slot).collect::<Vec<_>>(), vec![2, 4]);
    assert_eq!(fx.pending_changes("s1"), 0);
    // Scaling back up fills the lowest free slots.
    set_replicas(&fx, "s1", 3);
    fx.reconcile("s1");
    assert_eq!(fx.runnable("s1").iter().map(|t| t.slot).collect::<Vec<_>>(), vec![1, 2, 4]);
}

#[test]
fn removing_a_service_marks_its_tasks_remove() {
    let fx = Fx::new();
    let svc = service("s1", 2);
    fx.create(svc);
    fx.reconcile("s1");
    let s = std::sync::Arc::new(fx.service("s1"));
    let mut c = Changes::new();
    c.remove(s);
    fx.apply(c);
    let changes = fx.view(|t| remove_service_tasks(t, "s1", fx.now()));
    assert_eq!(changes.len(), 2);
    fx.apply(changes);
    assert!(fx.tasks("s1").iter().all(|t| t.desired_state() == TaskState::Remove));
    assert!(fx.view(|t| remove_service_tasks(t, "s1", fx.now())).is_empty());
}

#[test]
fn failed_task_is_restarted_in_its_slot_after_the_delay() {
    let fx = Fx::new();
    fx.create(node("n1"));
    fx.create(with_restart("s1", 1, RestartCondition::Any, 5_000, 0, 0));
    fx.reconcile("s1");
    let first = fx.tasks("s1")[0].clone();
    fx.place(&first.id, "n1", TaskState::Running);
    fx.set_state(&first.id, TaskState::Failed);
    let wake = fx.reconcile("s1");
    let tasks = fx.tasks("s1");
    assert_eq!(tasks.len(), 2);
    assert_eq!(fx.task(&first.id).desired_state(), TaskState::Shutdown);
    let second = tasks.iter().find(|t| t.id != first.id).unwrap().clone();
    assert_eq!(second.slot, first.slot);
    assert_eq!(second.desired_state(), TaskState::Ready);
    assert_eq!(wake, Some(fx.now() + 5_000));
    fx.clock.advance_ms(4_999);
    assert_eq!(fx.pending_changes("s1"), 0, "still inside the restart delay");
    fx.clock.advance_ms(1);
    assert_eq!(fx.reconcile("s1"), None);
    assert_eq!(fx.task(&second.id).desired_state(), TaskState::Running);
    assert_eq!(fx.tasks("s1").len(), 2);
}

#[test]
fn a_replacement_rejected_within_its_delay_is_replaced_once_the_delay_passed() {
    let fx = Fx::new();
    fx.create(node("n1"));
    fx.create(with_restart("s1", 1, RestartCondition::Any, 5_000, 0, 0));
    fx.reconcile("s1");
    let first = fx.tasks("s1")[0].clone();
    fx.place(&first.id, "n1", TaskState::Assigned);
    fx.set_state(&first.id, TaskState::Rejected);
    fx.reconcile("s1");
    let second = fx.runnable("s1").into_iter().find(|t| t.id != first.id).expect("a replacement");
    assert_eq!(second.desired_state(), TaskState::Ready);
    // The replacement is prepared while it waits its delay, and rejected at once (a missing image).
    fx.clock.advance_ms(100);
    fx.place(&second.id, "n1", TaskState::Assigned);
    fx.set_state(&second.id, TaskState::Rejected);
    let wake = fx.reconcile("s1");
    assert_eq!(fx.tasks("s1").len(), 2, "no third task inside the second's delay");
    assert_eq!(wake, Some(created_ms(&second) + 5_000), "the pass wakes when the delay ends");
    fx.clock.advance_ms(4_899);
    assert_eq!(fx.pending_changes("s1"), 0, "still inside the delay");
    fx.clock.advance_ms(1);
    fx.reconcile("s1");
    assert_eq!(fx.task(&second.id).desired_state(), TaskState::Shutdown);
    let tasks = fx.tasks("s1");
    assert_eq!(tasks.len(), 3, "replaced once its delay passed");
    let third = tasks.iter().find(|t| t.id != first.id && t.id != second.id).unwrap();
    assert_eq!((third.slot, third.desired_state()), (first.slot, TaskState::Ready));
}

/// Runs a one-replica service whose tasks end in `end` over and over; returns how many tasks were created
/// in total after `failures` ends, `gap_ms` apart.
fn run_failures(policy: shoal_api::Service, end: TaskState, failures: usize, gap_ms: u64) -> usize {
    let fx = Fx::new();
    fx.create(node("n1"));
    fx.create(policy);
    fx.reconcile("s1");
    for _ in 0..failures {
        let Some(t) = fx.runnable("s1").into_iter().next() else { break };
        fx.place(&t.id, "n1", TaskState::Running);
        fx.clock.advance_ms(gap_ms);
        fx.set_state(&t.id, end);
        fx.reconcile("s1");
        fx.clock.advance_ms(10); // past the (10 ms) restart delay
        fx.reconcile("s1");
    }
    // Whatever happened, reconciling again must not refill a slot the policy left empty.
    fx.clock.advance_ms(3_600_000);
    assert_eq!(fx.pending_changes("s1"), 0);
    fx.tasks("s1").len()
}

#[test]
fn restart_policy_cases() {
    use RestartCondition::*;
    // (condition, end state, max attempts, window ms, failures, gap between failures, tasks created)
    let cases = [
        (None, TaskState::Failed, 0, 0, 3, 1000, 1),
        (OnFailure, TaskState::Complete, 0, 0, 3, 1000, 1),
        (OnFailure, TaskState::Failed, 0, 0, 3, 1000, 4),
        (Any, TaskState::Complete, 0, 0, 3, 1000, 4),
        (Any, TaskState::Failed, 2, 0, 5, 1000, 3),
        // A 10 s window with failures 6 s apart: at most 2 restarts fall in any window, so it never stops.
        (Any, TaskState::Failed, 2, 10_000, 5, 6_000, 6),
        // Failures 1 s apart: the third restart would be the third in 10 s.
        (Any, TaskState::Failed, 2, 10_000, 5, 1_000, 3),
    ];
    for (cond, end, max, window, failures, gap, expected) in cases {
        let got = run_failures(with_restart("s1", 1, cond, 10, max, window), end, failures, gap);
        assert_eq!(got, expected, "{cond:?} end={end:?} max={max} window={window} failures={failures} gap={gap}");
    }
}

#[test]
fn tasks_on_a_down_node_are_replaced_elsewhere() {
    let fx = Fx::new();
    fx.create(node("n1"));
    fx.create(with_restart("s1", 2, RestartCondition::Any, 0, 0, 0));
    fx.reconcile("s1");
    let tasks = fx.tasks("s1");
    fx.place(&tasks[0].id, "n1", TaskState::Running);
    fx.set_node("n1", |n| n.status.as_mut().unwrap().set_state(node_status::State::Down));
    fx.reconcile("s1");
    assert_eq!(fx.task(&tasks[0].id).desired_state(), TaskState::Shutdown);
    let runnable = fx.runnable("s1");
    assert_eq!(runnable.iter().map(|t| t.slot).collect::<Vec<_>>(), vec![1, 2]);
    assert!(runnable.iter().all(|t| t.node_id.is_empty()), "the replacement waits for the scheduler");
    assert_eq!(fx.pending_changes("s1"), 0);
}

#[test]
fn tasks_on_a_drained_node_are_shut_down_and_replaced_elsewhere() {
    let fx = Fx::new();
    fx.create(node("n1"));
    fx.create(with_restart("s1", 2, RestartCondition::Any, 0, 0, 0));
    fx.reconcile("s1");
    let tasks = fx.tasks("s1");
    fx.place(&tasks[0].id, "n1", TaskState::Running);
    fx.set_node("n1", |n| n.spec.as_mut().unwrap().set_availability(shoal_api::node_spec::Availability::Drain));
    fx.reconcile("s1");
    assert_eq!(fx.task(&tasks[0].id).desired_state(), TaskState::Shutdown, "the agent stops it");
    let runnable = fx.runnable("s1");
    assert_eq!(runnable.len(), 2);
    assert!(runnable.iter().all(|t| t.node_id.is_empty()), "replacements wait for the scheduler");
    assert_eq!(fx.pending_changes("s1"), 0);
}

/// Drives a rolling update of a 3-replica service to its end, playing the agent: tasks told to shut down
/// stop, new tasks start running. Returns the most slots seen being replaced at once.
fn drive_update(fx: &Fx, order: UpdateOrder, parallelism: u64) -> usize {
    fx.create(node("n1"));
    let mut s = service("s1", 3);
    s.spec.as_mut().unwrap().update = Some(UpdateConfig { parallelism, order: order as i32, ..Default::default() });
    fx.create(s);
    fx.reconcile("s1");
    for t in fx.tasks("s1") {
        fx.place(&t.id, "n1", TaskState::Running);
    }
    fx.update_service("s1", |s| set_image(s, "busybox:2"));
    let mut most = 0;
    for _round in 0..200 {
        fx.clock.advance_ms(100);
        fx.reconcile("s1");
        let svc = fx.service("s1");
        if svc.update_status.as_ref().map(|u| u.state()) == Some(UpdateState::Completed) {
            return most;
        }
        let current = svc.spec.as_ref().unwrap().task.clone();
        let tasks = fx.tasks("s1");
        let in_progress = (1..=3)
            .filter(|slot| {
                let in_slot: Vec<_> = tasks.iter().filter(|t| t.slot == *slot).collect();
                let old_live =
                    in_slot.iter().any(|t| t.spec.as_deref() != current.as_ref() && !observed_state(t).is_terminal());
                let old_told = in_slot
                    .iter()
                    .any(|t| t.spec.as_deref() != current.as_ref() && t.desired_state() > TaskState::Running);
                let new_not_running = in_slot
                    .iter()
                    .any(|t| t.spec.as_deref() == current.as_ref() && observed_state(t) != TaskState::Running);
                // Stop-first: a slot is busy from "old told to stop" until its new task runs. Start-first:
                // from the new task's creation until it runs (the old one then just stops).
                new_not_running || (order == UpdateOrder::StopFirst && old_live && old_told)
            })
            .count();
        most = most.max(in_progress);
        for t in tasks {
            let observed = observed_state(&t);
            if t.desired_state() > TaskState::Running && !observed.is_terminal() {
                fx.set_state(&t.id, TaskState::Shutdown);
            } else if t.desired_state() == TaskState::Running && observed == TaskState::Pending {
                fx.place(&t.id, "n1", TaskState::Running);
            }
        }
    }
    panic!("update did not complete: {:?}", fx.service("s1").update_status);
}

#[test]
fn rolling_update_replaces_all_tasks_one_at_a_time() {
    let fx = Fx::new();
    let most = drive_update(&fx, UpdateOrder::StopFirst, 1);
    assert_eq!(most, 1);
    let svc = fx.service("s1");
    let status = svc.update_status.unwrap();
    assert_eq!(status.message, "update completed");
    assert!(status.started_at.is_some() && status.completed_at.is_some());
    let current = svc.spec.unwrap().task;
    let runnable = fx.runnable("s1");
    assert_eq!(runnable.len(), 3);
    assert!(runnable.iter().all(|t| t.spec.as_deref() == current.as_ref()));
    assert_eq!(fx.tasks("s1").len(), 6);
}

#[test]
fn rolling_update_start_first_and_all_at_once() {
    let fx = Fx::new();
    assert_eq!(drive_update(&fx, UpdateOrder::StartFirst, 1), 1);
    let fx = Fx::new();
    assert_eq!(drive_update(&fx, UpdateOrder::StopFirst, 0), 3);
}

#[test]
fn stop_first_waits_for_the_old_task_to_stop() {
    let fx = Fx::new();
    fx.create(node("n1"));
    fx.create(service("s1", 1));
    fx.reconcile("s1");
    let old = fx.tasks("s1")[0].clone();
    fx.place(&old.id, "n1", TaskState::Running);
    fx.update_service("s1", |s| set_image(s, "busybox:2"));
    fx.reconcile("s1");
    assert_eq!(fx.task(&old.id).desired_state(), TaskState::Shutdown);
    assert_eq!(fx.tasks("s1").len(), 1, "no new task while the old one runs");
    assert_eq!(fx.service("s1").update_status.unwrap().state(), UpdateState::Updating);
    assert_eq!(fx.pending_changes("s1"), 0);
    fx.set_state(&old.id, TaskState::Shutdown);
    fx.reconcile("s1");
    let runnable = fx.runnable("s1");
    assert_eq!(runnable.len(), 1);
    assert_eq!(runnable[0].slot, old.slot);
    assert_ne!(runnable[0].spec, old.spec);
}

fn history_task(fx: &Fx, slot: u64, desired: TaskState, observed: TaskState, node: &str) -> String {
    fx.clock.advance_ms(1000);
    let mut t = shoal_api::Task {
        id: fx.state.ids.new_id(),
        service_id: "s1".into(),
        slot,
        node_id: node.into(),
        meta: Some(shoal_api::Meta {
            created_at: Some(shoal_api::timestamp_from_unix_ms(fx.now())),
            ..Default::default()
        }),
        status: Some(shoal_api::TaskStatus { state: observed as i32, ..Default::default() }),
        ..Default::default()
    };
    t.set_desired_state(desired);
    let id = t.id.clone();
    fx.create(t);
    id
}

fn reap_all(fx: &Fx) -> usize {
    let changes = fx.view(|t| reap(t, all_slots(t).iter()));
    let n = changes.len();
    fx.apply(changes);
    n
}

#[test]
fn reaper_keeps_five_tasks_per_slot() {
    let fx = Fx::new();
    fx.create(service("s1", 1));
    let old: Vec<String> = (0..7).map(|_| history_task(&fx, 1, TaskState::Shutdown, TaskState::Failed, "n1")).collect();
    let running = history_task(&fx, 1, TaskState::Running, TaskState::Running, "n1");
    assert_eq!(reap_all(&fx), 3);
    let left: Vec<String> = fx.tasks("s1").into_iter().map(|t| t.id).collect();
    assert_eq!(left.len(), 5);
    assert!(left.contains(&running));
    for id in &old[..3] {
        assert!(!left.contains(id), "the oldest go first");
    }
    assert_eq!(reap_all(&fx), 0);
}

#[test]
fn reaper_honours_the_cluster_retention_limit() {
    // (cluster limit, tasks kept of 7 finished + 1 running)
    for (limit, kept) in [(0i64, 5usize), (2, 2), (-1, 1), (10, 8)] {
        let fx = Fx::new();
        fx.create(service("s1", 1));
        fx.create(Cluster {
            id: "c1".into(),
            spec: Some(ClusterSpec {
                orchestration: Some(OrchestrationConfig { task_history_retention_limit: limit, ..Default::default() }),
                ..Default::default()
            }),
            ..Default::default()
        });
        for _ in 0..7 {
            history_task(&fx, 1, TaskState::Shutdown, TaskState::Complete, "n1");
        }
        history_task(&fx, 1, TaskState::Running, TaskState::Running, "n1");
        reap_all(&fx);
        assert_eq!(fx.tasks("s1").len(), kept, "limit {limit}");
    }
}

#[test]
fn reaper_deletes_removed_and_orphaned_tasks_once_stopped() {
    let fx = Fx::new();
    fx.create(service("s1", 1));
    let done = history_task(&fx, 1, TaskState::Remove, TaskState::Shutdown, "n1");
    let never_assigned = history_task(&fx, 2, TaskState::Remove, TaskState::Pending, "");
    let still_running = history_task(&fx, 3, TaskState::Remove, TaskState::Running, "n1");
    let mut orphan = shoal_api::Task { id: "o1".into(), service_id: "gone".into(), slot: 1, ..Default::default() };
    orphan.status = Some(shoal_api::TaskStatus { state: TaskState::Failed as i32, ..Default::default() });
    fx.create(orphan);
    let mut orphan_running = shoal_api::Task {
        id: "o2".into(),
        service_id: "gone".into(),
        slot: 2,
        node_id: "n1".into(),
        ..Default::default()
    };
    orphan_running.status = Some(shoal_api::TaskStatus { state: TaskState::Running as i32, ..Default::default() });
    fx.create(orphan_running);
    assert_eq!(reap_all(&fx), 3);
    let left: Vec<String> = fx.view(|t| t.tasks().iter().map(|t| t.id.clone()).collect());
    assert!(left.contains(&still_running) && left.contains(&"o2".to_string()));
    assert!(!left.contains(&done) && !left.contains(&never_assigned) && !left.contains(&"o1".to_string()));
}

#[tokio::test(start_paused = true)]
async fn loops_follow_commits_and_stop_with_leadership() {
    let fx = Fx::new();
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let mut list = subsystems();
    list.push(crate::scheduler::subsystem());
    let runner = tokio::spawn(crate::run_while_leader(fx.state.clone(), list, shutdown_rx));

    fx.create(node("n1"));
    fx.create(with_restart("s1", 3, RestartCondition::Any, 1_000, 0, 0));
    wait_until("3 assigned tasks", Duration::from_secs(5), || {
        fx.runnable("s1").iter().filter(|t| observed_state(t) == TaskState::Assigned).count() == 3
    })
    .await;

    // A failure is restarted after the delay (the timer re-reads the manual clock).
    let victim = fx.runnable("s1")[0].clone();
    fx.set_state(&victim.id, TaskState::Failed);
    wait_until("a delayed replacement", Duration::from_secs(5), || {
        fx.tasks("s1").iter().any(|t| t.slot == victim.slot && t.desired_state() == TaskState::Ready)
    })
    .await;
    fx.clock.advance_ms(1_000);
    wait_until("the replacement to be told to run", Duration::from_secs(5), || {
        fx.runnable("s1").iter().filter(|t| t.desired_state() == TaskState::Running).count() == 3
    })
    .await;

    // Deleting the service: tasks marked REMOVE, then reaped once stopped.
    let svc = std::sync::Arc::new(fx.service("s1"));
    let mut c = Changes::new();
    c.remove(svc);
    fx.apply(c);
    wait_until("tasks marked for removal", Duration::from_secs(5), || {
        fx.tasks("s1").iter().all(|t| t.desired_state() == TaskState::Remove)
    })
    .await;
    for t in fx.tasks("s1") {
        if !observed_state(&t).is_terminal() {
            fx.set_state(&t.id, TaskState::Shutdown);
        }
    }
    wait_until("tasks reaped", Duration::from_secs(5), || fx.tasks("s1").is_empty()).await;

    // Losing leadership stops every loop (run_while_leader awaits them); regaining it restarts them.
    fx.proposer.set_leader(false);
    fx.proposer.set_leader(true);
    fx.create(service("s2", 2));
    wait_until("the new leader's orchestrator", Duration::from_secs(5), || fx.runnable("s2").len() == 2).await;
    fx.proposer.set_leader(false);
    shutdown_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), runner).await.expect("loops stopped").unwrap();
}

#[test]
fn update_waits_the_delay_between_batches() {
    let fx = Fx::new();
    fx.create(node("n1"));
    let mut s = service("s1", 2);
    s.spec.as_mut().unwrap().update = Some(UpdateConfig {
        parallelism: 1,
        delay: Some(shoal_api::duration_to_proto(Duration::from_secs(10))),
        ..Default::default()
    });
    fx.create(s);
    fx.reconcile("s1");
    for t in fx.tasks("s1") {
        fx.place(&t.id, "n1", TaskState::Running);
    }
    fx.update_service("s1", |s| set_image(s, "busybox:2"));
    fx.reconcile("s1");
    let first = fx.tasks("s1").into_iter().find(|t| t.desired_state() == TaskState::Shutdown).unwrap();
    fx.set_state(&first.id, TaskState::Shutdown);
    fx.reconcile("s1");
    let new = fx.runnable("s1").into_iter().find(|t| t.slot == first.slot).unwrap();
    fx.place(&new.id, "n1", TaskState::Running);
    let started = fx.now();
    let wake = fx.reconcile("s1");
    assert_eq!(wake, Some(started + 10_000));
    assert_eq!(fx.runnable("s1").len(), 2, "the second batch waits for the delay");
    fx.clock.advance_ms(10_000);
    fx.reconcile("s1");
    let told: Vec<u64> = fx
        .tasks("s1")
        .iter()
        .filter(|t| t.desired_state() == TaskState::Shutdown && t.slot != first.slot)
        .map(|t| t.slot)
        .collect();
    assert_eq!(told.len(), 1);
}

/// A service whose annotations carry `label_bytes` bytes of labels (every task copies them).
fn big_service(id: &str, replicas: u64, label_bytes: usize) -> shoal_api::Service {
    let mut s = service(id, replicas);
    s.spec.as_mut().unwrap().annotations.as_mut().unwrap().labels =
        [("big".to_string(), "x".repeat(label_bytes))].into();
    s
}

#[test]
fn a_stored_replica_count_over_the_limit_is_clamped_filled_in_bounded_steps_and_removable() {
    use crate::limits::MAX_REPLICAS;
    use replicated::{clamped_message, MAX_NEW_TASKS_PER_PASS};
    let fx = Fx::new();
    // As an older version would have stored it: the control API refuses this now.
    fx.create(service("s1", 1_000_000_000));
    fx.reconcile("s1");
    assert_eq!(fx.tasks("s1").len(), MAX_NEW_TASKS_PER_PASS, "one pass creates a bounded number of tasks");
    let status = fx.service("s1").update_status.expect("the clamp is visible on the service");
    assert_eq!(status.message, clamped_message(1_000_000_000));
    assert!(status.message.contains("at most 250000 run"), "{}", status.message);
    fx.reconcile("s1");
    assert_eq!(fx.tasks("s1").len(), 2 * MAX_NEW_TASKS_PER_PASS, "the next pass goes on");
    assert_eq!(fx.service("s1").update_status.unwrap().message, clamped_message(1_000_000_000), "kept");
    // The service can be scaled back within the limit (filling all MAX_REPLICAS takes 25 passes: too slow
    // for a debug unit test; the end-to-end test in crates/shoal/tests/e2e/bounds.rs runs it).
    set_replicas(&fx, "s1", MAX_REPLICAS / 25);
    fx.reconcile("s1");
    assert_eq!(fx.runnable("s1").len() as u64, MAX_REPLICAS / 25);
    // Removal: every task gets desired REMOVE.
    let changes = fx.view(|t| remove_service_tasks(t, "s1", fx.now()));
    assert_eq!(changes.len() as u64, MAX_REPLICAS / 25, "the scaled-down ones are marked already");
}

#[test]
fn big_tasks_are_created_within_the_byte_bound_per_pass() {
    use replicated::MAX_NEW_TASK_BYTES_PER_PASS;
    let fx = Fx::new();
    fx.create(big_service("s1", 200, 1 << 20));
    fx.reconcile("s1");
    let n = fx.tasks("s1").len();
    assert_eq!(n, MAX_NEW_TASK_BYTES_PER_PASS.div_ceil((1 << 20) + 200), "about 64 tasks of 1 MiB per pass: {n}");
    assert!(fx.service("s1").update_status.is_none(), "no clamp message under the limit");
    while fx.pending_changes("s1") > 0 {
        fx.reconcile("s1");
    }
    assert_eq!(fx.tasks("s1").len(), 200);
}

#[tokio::test]
async fn writes_are_split_to_stay_under_the_byte_bound() {
    use crate::write::{chunk_actions, propose_grouped, MAX_ACTIONS_PER_WRITE, MAX_BYTES_PER_WRITE};
    use shoal_store::StoreObject;
    let fx = Fx::new();
    fx.create(big_service("s1", 5, 1_500_000));
    let changes = fx.view(|t| {
        let s = t.services().get("s1").cloned().unwrap();
        reconcile_service(t, &s, fx.now(), fx.state.ids.as_ref()).changes
    });
    let actions = changes.into_actions();
    assert_eq!(actions.len(), 5);
    let chunks = chunk_actions(actions.clone(), MAX_ACTIONS_PER_WRITE);
    assert_eq!(chunks.iter().map(Vec::len).collect::<Vec<_>>(), vec![2, 2, 1]);
    for c in &chunks {
        let bytes: usize = c.iter().map(shoal_store::Action::encoded_len).sum();
        assert!(bytes <= MAX_BYTES_PER_WRITE, "{bytes}");
    }
    // Through the proposer: two keys, five big tasks, three writes.
    let before = fx.store.last_index();
    let (a, b) = actions.split_at(3);
    let groups = vec![("a", Changes::from(a.to_vec())), ("b", Changes::from(b.to_vec()))];
    assert!(propose_grouped(&fx.state, groups, MAX_ACTIONS_PER_WRITE).await.is_empty());
    assert_eq!(fx.store.last_index() - before, 3, "3 tasks alone need two writes, then 2 more in one");
    assert_eq!(fx.tasks("s1").len(), 5);
    assert!(fx.tasks("s1").iter().all(|t| t.version() > before));
}

#[tokio::test(start_paused = true)]
async fn the_loops_complete_an_update_after_its_monitor_and_move_a_task_off_a_node_that_stops_fitting() {
    let fx = Fx::new();
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let mut list = subsystems();
    list.push(crate::scheduler::subsystem());
    let runner = tokio::spawn(crate::run_while_leader(fx.state.clone(), list, shutdown_rx));
    let labelled = |v: &str| {
        let mut n = node("n1");
        n.spec.as_mut().unwrap().annotations.get_or_insert_with(Default::default).labels =
            [("x".to_string(), v.to_string())].into();
        n
    };
    fx.create(labelled("1"));
    let mut s = with_restart("s1", 1, RestartCondition::Any, 0, 0, 0);
    s.spec.as_mut().unwrap().task.as_mut().unwrap().placement =
        Some(shoal_api::Placement { constraints: vec!["node.labels.x==1".into()], ..Default::default() });
    fx.create(s);
    wait_until("an assigned task", Duration::from_secs(5), || fx.runnable("s1").iter().any(|t| t.node_id == "n1"))
        .await;
    let first = fx.runnable("s1")[0].clone();
    fx.set_state(&first.id, TaskState::Running);

    // An update: the new task runs, then the update completes once the (manual) clock passes the monitor.
    fx.update_service("s1", |s| set_image(s, "busybox:2"));
    wait_until("the old task told to stop", Duration::from_secs(5), || {
        fx.task(&first.id).desired_state() == TaskState::Shutdown
    })
    .await;
    fx.set_state(&first.id, TaskState::Shutdown);
    wait_until("the new task assigned", Duration::from_secs(5), || {
        fx.runnable("s1").iter().any(|t| t.id != first.id && observed_state(t) == TaskState::Assigned)
    })
    .await;
    let second = fx.runnable("s1")[0].clone();
    fx.set_state(&second.id, TaskState::Running);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(fx.service("s1").update_status.unwrap().state(), UpdateState::Updating, "monitoring");
    fx.clock.advance_ms(update::DEFAULT_MONITOR_MS);
    wait_until("the update completed", Duration::from_secs(5), || {
        fx.service("s1").update_status.is_some_and(|u| u.state() == UpdateState::Completed)
    })
    .await;

    // The node loses the label: the enforcer rejects the task, the orchestrator shuts it down and makes a
    // replacement, which stays pending (no node fits).
    fx.set_node("n1", |n| {
        n.spec.as_mut().unwrap().annotations.as_mut().unwrap().labels.insert("x".into(), "2".into());
    });
    wait_until("the task rejected and shut down", Duration::from_secs(5), || {
        let t = fx.task(&second.id);
        observed_state(&t) == TaskState::Rejected && t.desired_state() == TaskState::Shutdown
    })
    .await;
    wait_until("a pending replacement", Duration::from_secs(5), || {
        fx.runnable("s1").iter().any(|t| t.id != second.id && observed_state(t) == TaskState::Pending)
    })
    .await;
    fx.proposer.set_leader(false);
    shutdown_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), runner).await.expect("loops stopped").unwrap();
}
