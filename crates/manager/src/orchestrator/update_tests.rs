//! Unit tests of the update supervisor's state machine (`update`): the sans-IO reconcile over a
//! `LocalProposer` and a `ManualClock`, with a scripted agent on one node that runs every task whose image
//! is good and fails (at once, or after running for a while) those whose image is bad. Each test drives
//! one feature: what is up to date, the monitor window, the failure ratio, each failure action,
//! start-first order, manual rollback and resuming a paused update. No sleeps: the clock is advanced.

use std::time::Duration;

use shoal_api::restart_policy::RestartCondition;
use shoal_api::update_config::{FailureAction, UpdateOrder};
use shoal_api::update_status::UpdateState;
use shoal_api::{RestartPolicy, Task, TaskState, UpdateConfig};

use super::fixture::{node, service, set_image, Fx};
use super::update::{EffectiveUpdateConfig, DEFAULT_MONITOR_MS};
use super::*;

const GOOD: &str = "busybox:1";
const BAD: &str = "busybox:bad";
const LATE: &str = "busybox:late";

thread_local! {
    /// More images the agent fails at start (each test runs on its own thread).
    static EXTRA_BAD: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn dur(ms: u64) -> Option<shoal_api::prost_types::Duration> {
    Some(shoal_api::duration_to_proto(Duration::from_millis(ms)))
}

/// An update config: `parallelism`, the failure action and ratio, a 2 s monitor, no delay.
fn config(parallelism: u64, action: FailureAction, ratio: f32, order: UpdateOrder) -> UpdateConfig {
    UpdateConfig {
        parallelism,
        delay: None,
        failure_action: action as i32,
        monitor: dur(2_000),
        max_failure_ratio: ratio,
        order: order as i32,
    }
}

/// A running `replicas`-task service of image GOOD on node n1, restarting failed tasks after 1 s.
fn running_service(fx: &Fx, replicas: u64, update: UpdateConfig) {
    fx.create(node("n1"));
    let mut s = service("s1", replicas);
    let spec = s.spec.as_mut().unwrap();
    spec.update = Some(update);
    spec.task.as_mut().unwrap().restart =
        Some(RestartPolicy { condition: RestartCondition::Any as i32, delay: dur(1_000), ..Default::default() });
    fx.create(s);
    fx.reconcile("s1");
    agent(fx);
    fx.reconcile("s1");
    assert_eq!(running(fx).len() as u64, replicas);
}

fn image(t: &Task) -> &str {
    match t.spec.as_ref().and_then(|s| s.runtime.as_ref()) {
        Some(shoal_api::task_spec::Runtime::Container(c)) => &c.image,
        _ => "",
    }
}

/// The scripted agent on n1: stops tasks told to stop; starts tasks told to run (BAD ones fail at once,
/// LATE ones fail once they have run for 1 s).
fn agent(fx: &Fx) {
    for t in fx.tasks("s1") {
        let observed = observed_state(&t);
        if t.desired_state() > TaskState::Running && !observed.is_terminal() {
            fx.set_state(&t.id, TaskState::Shutdown);
        } else if t.desired_state() == TaskState::Running && observed < TaskState::Running {
            let bad = image(&t) == BAD || EXTRA_BAD.with(|b| b.borrow().iter().any(|i| i == image(&t)));
            let state = if bad { TaskState::Failed } else { TaskState::Running };
            fx.place(&t.id, "n1", state);
        } else if observed == TaskState::Running && image(&t) == LATE && fx.now() >= status_ms(&t) + 1_000 {
            fx.set_state(&t.id, TaskState::Failed);
        }
    }
}

/// 100 ms pass: reconcile, the agent acts, reconcile again.
fn step(fx: &Fx) {
    fx.clock.advance_ms(100);
    fx.reconcile("s1");
    agent(fx);
    fx.reconcile("s1");
}

fn state(fx: &Fx) -> Option<UpdateState> {
    fx.service("s1").update_status.map(|u| u.state())
}

/// Steps until the update status is `want` (at most 60 simulated seconds).
fn until(fx: &Fx, want: UpdateState) {
    for _ in 0..600 {
        if state(fx) == Some(want) {
            return;
        }
        step(fx);
    }
    panic!("update status never became {want:?}: {:?}", fx.service("s1").update_status);
}

/// Tasks observed RUNNING and meant to run.
fn running(fx: &Fx) -> Vec<Task> {
    fx.runnable("s1").into_iter().filter(|t| observed_state(t) == TaskState::Running).collect()
}

fn images(tasks: &[Task]) -> Vec<&str> {
    tasks.iter().map(image).collect()
}

fn update_image(fx: &Fx, img: &str) {
    fx.update_service("s1", |s| set_image(s, img));
}

#[test]
fn effective_config_has_swarmkit_defaults() {
    let d = EffectiveUpdateConfig::of(None);
    assert_eq!((d.parallelism, d.delay_ms, d.monitor_ms), (1, 0, DEFAULT_MONITOR_MS));
    assert_eq!((d.failure_action, d.order), (FailureAction::Pause, UpdateOrder::StopFirst));
    // The watch after the last batch outlasts a delay at least as long as the monitor period.
    let mut c = config(1, FailureAction::Pause, 0.0, UpdateOrder::StopFirst);
    assert_eq!(EffectiveUpdateConfig::of(Some(&c)).watch_ms(), 2_000);
    c.delay = dur(3_000);
    assert_eq!(EffectiveUpdateConfig::of(Some(&c)).watch_ms(), 4_000);
}

#[test]
fn a_change_that_does_not_reach_tasks_replaces_nothing_and_starts_no_update() {
    let fx = Fx::new();
    running_service(&fx, 3, config(1, FailureAction::Pause, 0.0, UpdateOrder::StopFirst));
    let before: Vec<String> = fx.tasks("s1").iter().map(|t| t.id.clone()).collect();
    fx.update_service("s1", |s| {
        s.annotations.as_mut().unwrap().labels = [("x".to_string(), "y".to_string())].into();
    });
    for _ in 0..20 {
        step(&fx);
    }
    assert_eq!(fx.tasks("s1").iter().map(|t| t.id.clone()).collect::<Vec<_>>(), before);
    assert_eq!(state(&fx), None, "no update runs");
    // --force bumps ForceUpdate: every task is replaced.
    fx.update_service("s1", |s| s.task.as_mut().unwrap().force_update += 1);
    until(&fx, UpdateState::Completed);
    let after = running(&fx);
    assert_eq!(after.len(), 3);
    assert!(after.iter().all(|t| !before.contains(&t.id)));
}

#[test]
fn completion_waits_for_the_monitor_period_after_the_last_task_started() {
    let fx = Fx::new();
    running_service(&fx, 2, config(0, FailureAction::Pause, 0.0, UpdateOrder::StopFirst));
    update_image(&fx, "busybox:2");
    step(&fx); // old tasks stopped, new ones created
    step(&fx); // new ones running
    assert_eq!(images(&running(&fx)), ["busybox:2", "busybox:2"]);
    let started = running(&fx).iter().map(status_ms).max().unwrap();
    let wake = fx.reconcile("s1");
    assert_eq!(wake, Some(started + 2_000), "wakes when the monitor period ends");
    assert_eq!(state(&fx), Some(UpdateState::Updating));
    fx.clock.advance_ms(started + 2_000 - fx.now() - 1);
    fx.reconcile("s1");
    assert_eq!(state(&fx), Some(UpdateState::Updating), "1 ms before the end");
    fx.clock.advance_ms(1);
    fx.reconcile("s1");
    let status = fx.service("s1").update_status.unwrap();
    assert_eq!((status.state(), status.message.as_str()), (UpdateState::Completed, "update completed"));
    assert!(status.completed_at.is_some());
}

#[test]
fn pause_stops_after_the_first_failure_and_says_which_task() {
    let fx = Fx::new();
    running_service(&fx, 3, config(1, FailureAction::Pause, 0.0, UpdateOrder::StopFirst));
    update_image(&fx, BAD);
    until(&fx, UpdateState::Paused);
    let status = fx.service("s1").update_status.unwrap();
    let failed = fx.tasks("s1").into_iter().find(|t| observed_state(t) == TaskState::Failed).unwrap();
    assert_eq!(status.message, format!("update paused due to failure or early termination of task {}", failed.id));
    // Nothing more is replaced: two slots keep their old task.
    for _ in 0..50 {
        step(&fx);
    }
    assert_eq!(images(&running(&fx)), [GOOD, GOOD]);
    assert_eq!(state(&fx), Some(UpdateState::Paused));
    // The next spec write resumes: a good image rolls through.
    update_image(&fx, "busybox:3");
    until(&fx, UpdateState::Completed);
    assert_eq!(images(&running(&fx)), ["busybox:3"; 3]);
}

#[test]
fn a_task_that_fails_within_the_monitor_window_counts() {
    let fx = Fx::new();
    running_service(&fx, 2, config(1, FailureAction::Pause, 0.0, UpdateOrder::StopFirst));
    update_image(&fx, LATE);
    until(&fx, UpdateState::Paused);
    let message = fx.service("s1").update_status.unwrap().message;
    assert!(message.starts_with("update paused due to failure or early termination of task"), "{message}");
}

#[test]
fn continue_ignores_failures_and_completes() {
    let fx = Fx::new();
    running_service(&fx, 3, config(1, FailureAction::Continue, 0.0, UpdateOrder::StopFirst));
    update_image(&fx, BAD);
    until(&fx, UpdateState::Completed);
    assert!(fx.runnable("s1").iter().all(|t| image(t) == BAD), "every slot was updated");
}

#[test]
fn failures_up_to_the_ratio_are_tolerated() {
    // Four slots, all at once, ratio 0.5: two failing slots (2/4) go on, a third (3/4) pauses.
    let check = |bad_slots: u64, want: UpdateState| {
        let fx = Fx::new();
        running_service(&fx, 4, config(0, FailureAction::Pause, 0.5, UpdateOrder::StopFirst));
        update_image(&fx, "busybox:2");
        fx.reconcile("s1");
        agent(&fx); // old tasks stop
        fx.reconcile("s1"); // new tasks created
        for t in fx.runnable("s1") {
            let state = if t.slot <= bad_slots { TaskState::Failed } else { TaskState::Running };
            fx.place(&t.id, "n1", state);
        }
        fx.reconcile("s1");
        fx.clock.advance_ms(2_000);
        fx.reconcile("s1");
        assert_eq!(state(&fx), Some(want), "{bad_slots} failing slots");
    };
    check(2, UpdateState::Completed);
    check(3, UpdateState::Paused);
}

#[test]
fn rollback_restores_the_previous_spec_and_completes() {
    let fx = Fx::new();
    running_service(&fx, 3, config(1, FailureAction::Rollback, 0.0, UpdateOrder::StopFirst));
    let original = fx.service("s1").spec;
    update_image(&fx, BAD);
    until(&fx, UpdateState::RollbackStarted);
    let svc = fx.service("s1");
    assert_eq!(svc.spec, original, "the previous spec is current again");
    assert!(svc.previous_spec.is_none());
    assert!(svc
        .update_status
        .unwrap()
        .message
        .starts_with("update rolled back due to failure or early termination of task"));
    until(&fx, UpdateState::RollbackCompleted);
    assert_eq!(fx.service("s1").update_status.unwrap().message, "rollback completed");
    for _ in 0..20 {
        step(&fx);
    }
    assert_eq!(images(&running(&fx)), [GOOD; 3]);
    assert!(fx.runnable("s1").iter().all(|t| image(t) == GOOD));
}

#[test]
fn a_failing_rollback_pauses_and_is_never_rolled_back() {
    let fx = Fx::new();
    running_service(&fx, 2, config(1, FailureAction::Rollback, 0.0, UpdateOrder::StopFirst));
    update_image(&fx, "busybox:2");
    until(&fx, UpdateState::Completed);
    // busybox:2 keeps running where it runs, but no longer starts; a bad update rolls back to it.
    EXTRA_BAD.with(|b| b.borrow_mut().push("busybox:2".into()));
    fx.update_service("s1", |s| {
        set_image(s, BAD);
        s.rollback = Some(config(1, FailureAction::Rollback, 0.0, UpdateOrder::StopFirst));
    });
    until(&fx, UpdateState::RollbackStarted);
    until(&fx, UpdateState::RollbackPaused);
    let message = fx.service("s1").update_status.unwrap().message;
    assert!(message.starts_with("rollback paused due to failure or early termination of task"), "{message}");
    EXTRA_BAD.with(|b| b.borrow_mut().clear());
}

#[test]
fn start_first_keeps_the_old_task_until_the_new_one_runs_and_rolls_back_cleanly() {
    let fx = Fx::new();
    running_service(&fx, 2, config(1, FailureAction::Rollback, 0.0, UpdateOrder::StartFirst));
    let old: Vec<String> = running(&fx).iter().map(|t| t.id.clone()).collect();
    update_image(&fx, "busybox:2");
    fx.reconcile("s1");
    // A new task is created while both old ones still run.
    assert_eq!(fx.runnable("s1").len(), 3);
    assert!(old.iter().all(|id| fx.task(id).desired_state() == TaskState::Running));
    until(&fx, UpdateState::Completed);
    assert_eq!(images(&running(&fx)), ["busybox:2"; 2]);

    // A bad start-first update: the old tasks never stop, the rollback leaves them running.
    let before: Vec<String> = running(&fx).iter().map(|t| t.id.clone()).collect();
    update_image(&fx, BAD);
    until(&fx, UpdateState::RollbackCompleted);
    for _ in 0..20 {
        step(&fx);
    }
    let after: Vec<String> = running(&fx).iter().map(|t| t.id.clone()).collect();
    assert_eq!(after, before, "the tasks that ran before the bad update still run");
    assert_eq!(fx.runnable("s1").len(), 2, "no bad task left meant to run");
}

#[test]
fn after_a_start_first_rollback_the_running_task_is_its_slots_newest() {
    let fx = Fx::new();
    running_service(&fx, 1, config(1, FailureAction::Rollback, 0.0, UpdateOrder::StartFirst));
    let before = running(&fx)[0].clone();
    update_image(&fx, BAD);
    until(&fx, UpdateState::RollbackCompleted);
    for _ in 0..20 {
        step(&fx);
    }
    fx.apply(fx.view(|t| taskreaper::reap(t, taskreaper::all_slots(t).iter())));
    // `docker service ps` shows a slot's newest task as its current one: the restart's replacement that was
    // still waiting its delay when the rollback came must not be that task.
    let tasks = fx.tasks("s1");
    assert_eq!(running(&fx).iter().map(|t| &t.id).collect::<Vec<_>>(), [&before.id]);
    assert!(
        tasks.iter().all(|t| !t.node_id.is_empty()),
        "no task that never reached a node is kept as history: {tasks:#?}"
    );
}

#[test]
fn a_manual_rollback_uses_the_rollback_config() {
    let fx = Fx::new();
    running_service(&fx, 3, config(1, FailureAction::Pause, 0.0, UpdateOrder::StopFirst));
    update_image(&fx, "busybox:2");
    until(&fx, UpdateState::Completed);
    // What the control API's rollback writes: previous spec current, ROLLBACK_STARTED. Rollback config:
    // all at once.
    let mut s = fx.service("s1");
    let prev = s.previous_spec.take().unwrap();
    let prev_version = s.previous_spec_version.take();
    s.previous_spec = s.spec.replace(prev);
    s.previous_spec_version = std::mem::replace(&mut s.spec_version, prev_version);
    s.spec.as_mut().unwrap().rollback = Some(config(0, FailureAction::Pause, 0.0, UpdateOrder::StopFirst));
    s.update_status = Some(shoal_api::UpdateStatus {
        state: UpdateState::RollbackStarted as i32,
        started_at: Some(shoal_api::timestamp_from_unix_ms(fx.now())),
        completed_at: None,
        message: update::MANUAL_ROLLBACK_MESSAGE.into(),
    });
    let mut c = shoal_store::Changes::new();
    c.update(s);
    fx.apply(c);
    fx.reconcile("s1");
    let stopping =
        fx.tasks("s1").iter().filter(|t| image(t) == "busybox:2" && t.desired_state() == TaskState::Shutdown).count();
    assert_eq!(stopping, 3, "parallelism 0 of the rollback config: all at once");
    until(&fx, UpdateState::RollbackCompleted);
    assert_eq!(images(&running(&fx)), [GOOD; 3]);
}

/// Found by the simulation (`shoal-sim`, seed 24): in a start-first update, a slot whose first new task
/// failed counted as updated (that task had "reached" RUNNING by ending), so the update COMPLETED while the
/// restarted new task was still starting; when it ran, no update was in progress, nothing reconciled the
/// service, and the old task ran beside it for good. A slot that still runs its old task stays in flight
/// until a new one runs; then the old one is stopped.
#[test]
fn start_first_waits_for_a_restarted_new_task_before_stopping_the_old_and_completing() {
    let fx = Fx::new();
    running_service(&fx, 1, config(1, FailureAction::Continue, 0.0, UpdateOrder::StartFirst));
    let old = running(&fx)[0].id.clone();
    update_image(&fx, "busybox:2");
    fx.reconcile("s1");
    let first = fx.runnable("s1").into_iter().find(|t| t.id != old).expect("a new task").id;
    fx.place(&first, "n1", TaskState::Failed);
    // The restart is created (and, with no agent acting, does not start): the update waits.
    for _ in 0..40 {
        fx.clock.advance_ms(100);
        fx.reconcile("s1");
        assert_eq!(state(&fx), Some(UpdateState::Updating), "the update ended while the old task still ran");
        assert_eq!(fx.task(&old).desired_state(), TaskState::Running);
    }
    until(&fx, UpdateState::Completed);
    assert_eq!(images(&running(&fx)), ["busybox:2"]);
    assert!(fx.task(&old).desired_state() >= TaskState::Shutdown, "the old task still meant to run");
}

/// Issue 32: with parallelism 2 and a delay, the delay separates batches even when the two tasks of a batch
/// start at different times (found with the docker CLI: new tasks started at 0.3, 0.4, 1.7 and 1.8 s with a
/// 5 s delay). Here the agent starts at most one task per 100 ms step, so a batch's tasks start apart.
#[test]
fn a_delay_separates_batches_whose_tasks_start_at_different_times() {
    let fx = Fx::new();
    let mut cfg = config(2, FailureAction::Pause, 0.0, UpdateOrder::StopFirst);
    cfg.delay = dur(5_000);
    running_service(&fx, 4, cfg);
    update_image(&fx, "busybox:2");
    let mut started: Vec<(String, u64)> = Vec::new();
    for _ in 0..400 {
        fx.clock.advance_ms(100);
        fx.reconcile("s1");
        let tasks = fx.tasks("s1");
        for t in tasks.iter().filter(|t| t.desired_state() > TaskState::Running && !observed_state(t).is_terminal()) {
            fx.set_state(&t.id, TaskState::Shutdown);
        }
        // One new task a step.
        if let Some(t) =
            tasks.iter().find(|t| t.desired_state() == TaskState::Running && observed_state(t) < TaskState::Running)
        {
            fx.place(&t.id, "n1", TaskState::Running);
            started.push((t.id.clone(), fx.now()));
        }
        fx.reconcile("s1");
        if state(&fx) == Some(UpdateState::Completed) {
            break;
        }
    }
    assert_eq!(state(&fx), Some(UpdateState::Completed), "{:?}", fx.service("s1").update_status);
    assert_eq!(started.len(), 4, "{started:?}");
    let at: Vec<u64> = started.iter().map(|(_, ms)| *ms).collect();
    assert!(at[1] - at[0] < 1_000, "the first batch's two tasks start together: {at:?}");
    // The second batch's first task waits for the delay after the first batch's first task started, and
    // its second after the first batch's second.
    assert!(at[2] >= at[0] + 5_000, "the delay was skipped: {at:?}");
    assert!(at[3] >= at[1] + 5_000, "the delay was skipped: {at:?}");
    assert!(at[3] - at[2] < 1_000, "the second batch's two tasks start together: {at:?}");
}
