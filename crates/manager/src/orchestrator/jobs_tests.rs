//! Unit tests of the jobs orchestrator's core (`reconcile_job`) over a `LocalProposer` and a `ManualClock`:
//! concurrency and completions of a replicated job (also as a seeded random run of completions and
//! failures), restarts under each restart condition, a new iteration on update, a global job over joining,
//! draining and paused nodes, the reaper keeping counted completions, and the status `service ls` shows.

use std::time::Duration;

use shoal_api::node_spec::Availability;
use shoal_api::restart_policy::RestartCondition;
use shoal_api::service_spec::Mode;
use shoal_api::{GlobalJob, JobStatus, ReplicatedJob, RestartPolicy, Service, Task, TaskState, Version};
use shoal_store::Changes;

use super::fixture::{node, service, Fx};
use super::jobs::{job_counts, reconcile_job};
use super::taskreaper::reap;
use super::*;

/// A replicated job (`max_concurrent`, `total`) with a restart policy (`delay_ms`, condition, attempts).
fn replicated_job(id: &str, max_concurrent: u64, total: u64, restart: Option<RestartPolicy>) -> Service {
    let mut s = service(id, 0);
    let spec = s.spec.as_mut().unwrap();
    spec.mode = Some(Mode::ReplicatedJob(ReplicatedJob { max_concurrent, total_completions: total }));
    spec.task.as_mut().unwrap().restart = restart;
    s.job_status = Some(JobStatus { job_iteration: Some(Version { index: 0 }), last_execution: None });
    s
}

fn global_job(id: &str) -> Service {
    let mut s = replicated_job(id, 0, 0, Some(policy(RestartCondition::Any, 0, 0)));
    s.spec.as_mut().unwrap().mode = Some(Mode::GlobalJob(GlobalJob {}));
    s
}

fn policy(condition: RestartCondition, delay_ms: u64, max_attempts: u64) -> RestartPolicy {
    RestartPolicy {
        condition: condition as i32,
        delay: Some(shoal_api::duration_to_proto(Duration::from_millis(delay_ms))),
        max_attempts,
        window: None,
    }
}

/// One pass of the jobs core, applied; returns the wake time.
fn pass(fx: &Fx, id: &str) -> Option<u64> {
    let now = fx.now();
    let r = fx.view(|t| {
        let s = t.services().get(id).cloned().expect("service exists");
        reconcile_job(t, &s, now, fx.state.ids.as_ref())
    });
    fx.apply(r.changes);
    r.wake_at_ms
}

/// Writes a pass would make, without applying them.
fn pending(fx: &Fx, id: &str) -> usize {
    let now = fx.now();
    fx.view(|t| {
        let s = t.services().get(id).cloned().expect("service exists");
        reconcile_job(t, &s, now, fx.state.ids.as_ref()).changes.len()
    })
}

/// The tasks meant to run and not finished (desired <= COMPLETE, observed not terminal).
fn in_flight(fx: &Fx, id: &str) -> Vec<Task> {
    fx.tasks(id)
        .into_iter()
        .filter(|t| t.desired_state() <= TaskState::Complete && !observed_state(t).is_terminal())
        .collect()
}

fn completed(fx: &Fx, id: &str) -> Vec<Task> {
    fx.tasks(id).into_iter().filter(|t| observed_state(t) == TaskState::Complete).collect()
}

/// What the control API does on an update: a new spec version and the next job iteration.
fn rerun(fx: &Fx, id: &str) {
    fx.update_service(id, |s| s.task.as_mut().unwrap().force_update += 1);
    let mut s = fx.service(id);
    let j = s.job_status.as_mut().unwrap();
    j.job_iteration = Some(Version { index: j.job_iteration.unwrap().index + 1 });
    let mut c = Changes::new();
    c.update(s);
    fx.apply(c);
}

/// Places every pending task of the service on `n1` and runs it (what the scheduler and agent do).
fn run_pending(fx: &Fx, id: &str) {
    for t in fx.tasks(id) {
        if observed_state(&t) == TaskState::Pending && t.desired_state() == TaskState::Complete {
            fx.place(&t.id, "n1", TaskState::Running);
        }
    }
}

#[test]
fn a_replicated_job_runs_max_concurrent_at_a_time_until_total_completions() {
    let fx = Fx::new();
    fx.create(node("n1"));
    fx.create(replicated_job("j", 2, 5, None));
    pass(&fx, "j");
    let first = fx.tasks("j");
    assert_eq!(first.len(), 2);
    for (t, slot) in first.iter().zip([0, 1]) {
        assert_eq!(t.slot, slot, "slots count from 0, as the docker CLI reads them");
        assert_eq!(t.desired_state(), TaskState::Complete, "a job task is meant to complete");
        assert_eq!(t.job_iteration, Some(Version { index: 0 }));
    }
    let mut steps = 0;
    while completed(&fx, "j").len() < 5 {
        steps += 1;
        assert!(steps < 20, "the job does not progress");
        run_pending(&fx, "j");
        assert!(in_flight(&fx, "j").len() <= 2, "never more than max_concurrent at once");
        assert_eq!(pending(&fx, "j"), 0, "a running task changes nothing");
        let t = in_flight(&fx, "j").into_iter().next().expect("a task runs");
        fx.set_state(&t.id, TaskState::Complete);
        pass(&fx, "j");
    }
    let done = fx.tasks("j");
    assert_eq!(done.len(), 5, "exactly total_completions tasks, none restarted: {done:?}");
    let mut slots: Vec<u64> = done.iter().map(|t| t.slot).collect();
    slots.sort_unstable();
    assert_eq!(slots, vec![0, 1, 2, 3, 4]);
    assert_eq!(pending(&fx, "j"), 0, "a finished job stays finished");
    let counts = fx.view(|t| job_counts(t, &fx.service("j")));
    assert_eq!((counts.complete, counts.running, counts.exhausted), (5, 0, 0));
}

#[test]
fn a_failed_task_is_restarted_in_its_slot_after_the_delay_and_a_completed_one_never() {
    let fx = Fx::new();
    fx.create(node("n1"));
    // Condition ANY acts as ON_FAILURE for a job.
    fx.create(replicated_job("j", 1, 2, Some(policy(RestartCondition::Any, 1000, 0))));
    pass(&fx, "j");
    let t0 = fx.tasks("j").remove(0);
    fx.place(&t0.id, "n1", TaskState::Running);
    fx.set_state(&t0.id, TaskState::Failed);
    let wake = pass(&fx, "j");
    assert_eq!(fx.task(&t0.id).desired_state(), TaskState::Shutdown);
    let again: Vec<Task> = fx.tasks("j").into_iter().filter(|t| t.id != t0.id).collect();
    assert_eq!(again.len(), 1, "one replacement, and no other task while it waits: {again:?}");
    assert_eq!((again[0].slot, again[0].desired_state()), (0, TaskState::Ready));
    assert_eq!(wake, Some(fx.now() + 1000));
    fx.clock.advance_ms(1000);
    pass(&fx, "j");
    assert_eq!(fx.task(&again[0].id).desired_state(), TaskState::Complete, "told to run after the delay");
    fx.place(&again[0].id, "n1", TaskState::Running);
    fx.set_state(&again[0].id, TaskState::Complete);
    pass(&fx, "j");
    let last: Vec<Task> = fx.tasks("j").into_iter().filter(|t| t.slot == 1).collect();
    assert_eq!(last.len(), 1);
    fx.place(&last[0].id, "n1", TaskState::Running);
    fx.set_state(&last[0].id, TaskState::Complete);
    pass(&fx, "j");
    assert_eq!(fx.tasks("j").len(), 3, "completed tasks are not restarted");
    assert_eq!(completed(&fx, "j").len(), 2);
}

#[test]
fn a_slot_whose_policy_allows_no_more_restarts_stays_failed() {
    for (p, attempts_before_giving_up) in
        [(policy(RestartCondition::None, 0, 0), 1), (policy(RestartCondition::OnFailure, 0, 2), 3)]
    {
        let fx = Fx::new();
        fx.create(node("n1"));
        fx.create(replicated_job("j", 1, 2, Some(p)));
        pass(&fx, "j");
        for _ in 0..attempts_before_giving_up {
            let t = in_flight(&fx, "j").remove(0);
            assert_eq!(t.slot, 0);
            fx.place(&t.id, "n1", TaskState::Running);
            fx.set_state(&t.id, TaskState::Failed);
            pass(&fx, "j");
        }
        let tasks = fx.tasks("j");
        assert_eq!(tasks.iter().filter(|t| t.slot == 0).count(), attempts_before_giving_up, "{p:?}");
        // The exhausted slot holds its place: slot 1 runs next, and the job stops there.
        let next = in_flight(&fx, "j");
        assert_eq!(next.iter().map(|t| t.slot).collect::<Vec<_>>(), vec![1], "{p:?}");
        fx.place(&next[0].id, "n1", TaskState::Running);
        fx.set_state(&next[0].id, TaskState::Complete);
        pass(&fx, "j");
        assert!(in_flight(&fx, "j").is_empty());
        assert_eq!(pending(&fx, "j"), 0);
        let counts = fx.view(|t| job_counts(t, &fx.service("j")));
        assert_eq!((counts.complete, counts.exhausted), (1, 1), "{p:?}");
    }
}

#[test]
fn a_task_on_a_lost_node_is_run_again_elsewhere() {
    let fx = Fx::new();
    fx.create(node("n1"));
    fx.create(replicated_job("j", 1, 1, Some(policy(RestartCondition::OnFailure, 0, 0))));
    pass(&fx, "j");
    let t = fx.tasks("j").remove(0);
    fx.place(&t.id, "n1", TaskState::Running);
    fx.set_node("n1", |n| n.spec.as_mut().unwrap().availability = Availability::Drain as i32);
    pass(&fx, "j");
    assert_eq!(fx.task(&t.id).desired_state(), TaskState::Shutdown);
    let again = in_flight(&fx, "j");
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].slot, again[0].desired_state()), (0, TaskState::Complete));
}

/// A small seeded generator (xorshift), so a failing run can be replayed from its seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[test]
fn random_completions_and_failures_never_exceed_max_concurrent_and_end_at_the_total() {
    for seed in 1..=20u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let fx = Fx::new();
        fx.create(node("n1"));
        let (max, total) = (1 + rng.below(4), 1 + rng.below(12));
        fx.create(replicated_job("j", max, total, Some(policy(RestartCondition::Any, 0, 0))));
        let mut steps = 0;
        loop {
            pass(&fx, "j");
            run_pending(&fx, "j");
            let flying = in_flight(&fx, "j");
            assert!(flying.len() as u64 <= max, "seed {seed}: {} in flight, max {max}", flying.len());
            if flying.is_empty() {
                break;
            }
            steps += 1;
            assert!(steps < 1000, "seed {seed}: no end");
            let t = &flying[usize::try_from(rng.below(flying.len() as u64)).unwrap()];
            let end = if rng.below(3) == 0 { TaskState::Failed } else { TaskState::Complete };
            fx.set_state(&t.id, end);
        }
        let done = completed(&fx, "j");
        assert_eq!(done.len() as u64, total, "seed {seed}: exactly the total completes");
        let mut slots: Vec<u64> = done.iter().map(|t| t.slot).collect();
        slots.sort_unstable();
        assert_eq!(slots, (0..total).collect::<Vec<_>>(), "seed {seed}: one completion per slot");
    }
}

#[test]
fn an_update_starts_a_new_iteration_and_old_tasks_become_history() {
    let fx = Fx::new();
    fx.create(node("n1"));
    fx.create(replicated_job("j", 2, 3, None));
    pass(&fx, "j");
    for t in fx.tasks("j") {
        fx.place(&t.id, "n1", TaskState::Running);
        fx.set_state(&t.id, TaskState::Complete);
    }
    pass(&fx, "j");
    let old_running = in_flight(&fx, "j").remove(0);
    fx.place(&old_running.id, "n1", TaskState::Running);
    rerun(&fx, "j");
    pass(&fx, "j");
    assert_eq!(fx.task(&old_running.id).desired_state(), TaskState::Shutdown, "the old iteration stops");
    let new: Vec<Task> = fx.tasks("j").into_iter().filter(|t| t.job_iteration == Some(Version { index: 1 })).collect();
    assert_eq!(new.iter().map(|t| t.slot).collect::<Vec<_>>(), vec![0, 1], "the new iteration starts over");
    assert_eq!(completed(&fx, "j").len(), 2, "the old completions stay as history");
    let counts = fx.view(|t| job_counts(t, &fx.service("j")));
    assert_eq!((counts.complete, counts.running), (0, 2), "only the current iteration counts");
}

#[test]
fn a_global_job_runs_once_per_eligible_node_and_on_nodes_that_join_later() {
    let fx = Fx::new();
    for n in ["n1", "n2", "n3"] {
        fx.create(node(n));
    }
    fx.create(global_job("g"));
    pass(&fx, "g");
    let tasks = fx.tasks("g");
    let mut nodes: Vec<&str> = tasks.iter().map(|t| t.node_id.as_str()).collect();
    nodes.sort_unstable();
    assert_eq!(nodes, vec!["n1", "n2", "n3"]);
    assert!(tasks.iter().all(|t| t.slot == 0 && t.desired_state() == TaskState::Complete));
    for t in &tasks {
        fx.place(&t.id, &t.node_id, TaskState::Running);
        fx.set_state(&t.id, TaskState::Complete);
    }
    pass(&fx, "g");
    assert_eq!(fx.tasks("g").len(), 3, "once per node");
    // A node joining later runs the current iteration; a paused one gets nothing.
    fx.create(node("n4"));
    let mut paused = node("n5");
    paused.spec.as_mut().unwrap().availability = Availability::Pause as i32;
    fx.create(paused);
    pass(&fx, "g");
    let late = in_flight(&fx, "g");
    assert_eq!(late.iter().map(|t| t.node_id.as_str()).collect::<Vec<_>>(), vec!["n4"]);
    // Draining n4 stops its unfinished task with no replacement; a failure elsewhere restarts on its node.
    fx.place(&late[0].id, "n4", TaskState::Running);
    fx.set_node("n4", |n| n.spec.as_mut().unwrap().availability = Availability::Drain as i32);
    pass(&fx, "g");
    assert_eq!(fx.task(&late[0].id).desired_state(), TaskState::Shutdown);
    assert!(in_flight(&fx, "g").is_empty());
    assert_eq!(pending(&fx, "g"), 0);
    // A new iteration runs on every eligible node again.
    rerun(&fx, "g");
    pass(&fx, "g");
    let mut again: Vec<String> = in_flight(&fx, "g").into_iter().map(|t| t.node_id).collect();
    again.sort_unstable();
    assert_eq!(again, vec!["n1", "n2", "n3"]);
    let t = in_flight(&fx, "g").remove(0);
    fx.place(&t.id, &t.node_id, TaskState::Running);
    fx.set_state(&t.id, TaskState::Failed);
    pass(&fx, "g");
    let replaced: Vec<Task> = in_flight(&fx, "g").into_iter().filter(|x| x.node_id == t.node_id).collect();
    assert_eq!(replaced.len(), 1, "a failed global job task restarts on its node");
    assert_ne!(replaced[0].id, t.id);
}

#[test]
fn the_reaper_keeps_completions_the_current_iteration_counts() {
    let fx = Fx::new();
    fx.create(node("n1"));
    let mut cluster = shoal_api::Cluster { id: "c".into(), ..Default::default() };
    cluster.spec.get_or_insert_with(Default::default).orchestration =
        Some(shoal_api::OrchestrationConfig { task_history_retention_limit: -1, ..Default::default() });
    fx.create(cluster);
    fx.create(replicated_job("j", 1, 1, Some(policy(RestartCondition::OnFailure, 0, 0))));
    pass(&fx, "j");
    let first = fx.tasks("j").remove(0);
    fx.place(&first.id, "n1", TaskState::Running);
    fx.set_state(&first.id, TaskState::Failed);
    pass(&fx, "j");
    let second = in_flight(&fx, "j").remove(0);
    fx.place(&second.id, "n1", TaskState::Running);
    fx.set_state(&second.id, TaskState::Complete);
    let reap_all = |fx: &Fx| fx.apply(fx.view(|t| reap(t, &taskreaper::all_slots(t))));
    reap_all(&fx);
    let left: Vec<String> = fx.tasks("j").into_iter().map(|t| t.id).collect();
    assert_eq!(left, vec![second.id.clone()], "with no history kept, the failure goes and the completion stays");
    assert_eq!(pending(&fx, "j"), 0, "the job is still complete");
    // Once the job runs again, the old completion is history like any other.
    rerun(&fx, "j");
    reap_all(&fx);
    assert!(fx.tasks("j").iter().all(|t| t.id != second.id));
}

#[test]
fn service_status_counts_the_current_iteration_as_swarmkit() {
    use crate::controlapi::service_status;
    let fx = Fx::new();
    fx.create(node("n1"));
    fx.create(replicated_job("j", 2, 3, None));
    pass(&fx, "j");
    let ts = fx.tasks("j");
    fx.place(&ts[0].id, "n1", TaskState::Running);
    fx.place(&ts[1].id, "n1", TaskState::Running);
    fx.set_state(&ts[1].id, TaskState::Complete);
    let st = fx.view(|t| service_status(t, &fx.service("j")));
    // `docker service ls`: 1/2 (1/3 completed).
    assert_eq!((st.running_tasks, st.desired_tasks, st.completed_tasks), (1, 2, 1));
    fx.create(node("n2"));
    fx.create(global_job("g"));
    pass(&fx, "g");
    let gs = fx.tasks("g");
    fx.place(&gs[0].id, &gs[0].node_id, TaskState::Running);
    fx.set_state(&gs[0].id, TaskState::Complete);
    let st = fx.view(|t| service_status(t, &fx.service("g")));
    // `docker service ls`: 0/1 (1/2 completed).
    assert_eq!((st.running_tasks, st.desired_tasks, st.completed_tasks), (0, 1, 1));
}

#[test]
fn a_task_given_up_for_its_lost_node_that_completes_ends_its_slot() {
    let fx = Fx::new();
    fx.create(node("n1"));
    fx.create(node("n2"));
    fx.create(replicated_job("j", 1, 1, Some(policy(RestartCondition::OnFailure, 0, 0))));
    pass(&fx, "j");
    let first = fx.tasks("j").remove(0);
    fx.place(&first.id, "n1", TaskState::Running);
    fx.set_node("n1", |n| n.spec.as_mut().unwrap().availability = Availability::Drain as i32);
    pass(&fx, "j");
    let second = in_flight(&fx, "j").into_iter().find(|t| t.id != first.id).expect("a replacement");
    fx.place(&second.id, "n2", TaskState::Running);
    // The first one still finishes on its drained node.
    fx.set_state(&first.id, TaskState::Complete);
    pass(&fx, "j");
    assert_eq!(fx.task(&second.id).desired_state(), TaskState::Shutdown, "the slot is done: its other task stops");
    assert!(in_flight(&fx, "j").is_empty(), "nothing of the job runs on");
    assert_eq!(pending(&fx, "j"), 0);
}
