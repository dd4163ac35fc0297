//! Jobs on the in-process cluster (real manager subsystems, agents with fake executors): a replicated job
//! runs at most `max_concurrent` tasks at once across the workers, a task that exits 1 is run again in its
//! slot, and the job ends with exactly `total_completions` COMPLETE tasks; a global job runs once on every
//! worker, and a worker that joins later runs it too.

use std::time::Duration;

use shoal_api::{
    restart_policy, service_spec, task_spec, Annotations, ContainerSpec, GlobalJob, ReplicatedJob, RestartPolicy,
    ServiceSpec, TaskSpec, TaskState,
};
use shoal_manager::controlapi;
use shoal_store::Tables;
use shoal_testkit::{ClusterOptions, TestCluster};

const DEADLINE: Duration = Duration::from_secs(20);

fn job_spec(name: &str, mode: service_spec::Mode) -> ServiceSpec {
    ServiceSpec {
        annotations: Some(Annotations { name: name.into(), ..Default::default() }),
        task: Some(TaskSpec {
            runtime: Some(task_spec::Runtime::Container(ContainerSpec {
                image: "busybox".into(),
                args: vec!["true".into()],
                ..Default::default()
            })),
            restart: Some(RestartPolicy {
                condition: restart_policy::RestartCondition::OnFailure as i32,
                delay: Some(shoal_api::duration_to_proto(Duration::ZERO)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        mode: Some(mode),
        ..Default::default()
    }
}

fn state(t: &shoal_api::Task) -> TaskState {
    TaskState::from_wire(t.status.as_ref().map_or(0, |s| s.state))
}

/// Tasks of the job running on a worker: (task, node).
fn running(t: &Tables, service_id: &str) -> Vec<(String, String)> {
    t.tasks()
        .by_service(service_id)
        .filter(|t| state(t) == TaskState::Running)
        .map(|t| (t.id.clone(), t.node_id.clone()))
        .collect()
}

/// Tasks of the job meant to run and not finished.
fn in_flight(t: &Tables, service_id: &str) -> usize {
    t.tasks()
        .by_service(service_id)
        .filter(|t| t.desired_state <= TaskState::Complete as i32 && !state(t).is_terminal())
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_job_runs_two_at_a_time_restarts_failures_and_completes() {
    let cluster = TestCluster::start(ClusterOptions { workers: 3, ..Default::default() }).await;
    let mode = service_spec::Mode::ReplicatedJob(ReplicatedJob { max_concurrent: 2, total_completions: 6 });
    let svc = controlapi::create_service(&cluster.state, job_spec("batch", mode)).await.expect("create");
    let mut exits = 0;
    let mut failed = None;
    loop {
        let done = cluster
            .state
            .store
            .view(|t| t.tasks().by_service(&svc.id).filter(|t| state(t) == TaskState::Complete).count());
        if done == 6 {
            break;
        }
        let r = cluster
            .wait_for("a running task of the job", DEADLINE, |t| {
                assert!(in_flight(t, &svc.id) <= 2, "more than max_concurrent tasks in flight");
                let r = running(t, &svc.id);
                (!r.is_empty()).then_some(r)
            })
            .await;
        let (task, node) = r[0].clone();
        let worker = cluster.workers.iter().find(|w| w.node_id == node).expect("a worker runs it");
        // The second task to finish fails once; the rest complete.
        let code = if exits == 1 { 1 } else { 0 };
        if code == 1 {
            failed = Some(task.clone());
        }
        assert!(worker.executor.exit(&task, code));
        exits += 1;
        cluster
            .wait_for("the exit reported", DEADLINE, |t| {
                t.tasks().get(&task).filter(|t| state(t).is_terminal()).map(|_| ())
            })
            .await;
        assert!(exits < 20, "the job does not end");
    }
    let failed = failed.expect("one task failed");
    let (tasks, failed_slot) = cluster.state.store.view(|t| {
        let tasks: Vec<shoal_api::Task> = t.tasks().by_service(&svc.id).map(|t| (**t).clone()).collect();
        (tasks, t.tasks().get(&failed).map(|t| t.slot))
    });
    assert_eq!(tasks.len(), 7, "6 completions and the one failure: {tasks:?}");
    let complete: Vec<u64> = tasks.iter().filter(|t| state(t) == TaskState::Complete).map(|t| t.slot).collect();
    let mut slots = complete.clone();
    slots.sort_unstable();
    assert_eq!(slots, vec![0, 1, 2, 3, 4, 5]);
    assert!(complete.contains(&failed_slot.unwrap()), "the failed slot was run again");
    let st = cluster.state.store.view(|t| controlapi::service_status(t, &svc));
    assert_eq!((st.running_tasks, st.desired_tasks, st.completed_tasks), (0, 2, 6));
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_job_runs_once_per_worker_and_on_a_worker_that_joins() {
    let mut cluster = TestCluster::start(ClusterOptions { workers: 3, ..Default::default() }).await;
    let svc = controlapi::create_service(&cluster.state, job_spec("once", service_spec::Mode::GlobalJob(GlobalJob {})))
        .await
        .expect("create");
    let finish_all = |cluster: &TestCluster, r: Vec<(String, String)>| {
        for (task, node) in r {
            let w = cluster.workers.iter().find(|w| w.node_id == node).expect("a worker runs it");
            assert!(w.executor.exit(&task, 0));
        }
    };
    let r = cluster
        .wait_for("a task running on each worker", DEADLINE, |t| {
            let r = running(t, &svc.id);
            (r.len() == 3).then_some(r)
        })
        .await;
    finish_all(&cluster, r);
    let complete = |t: &Tables| t.tasks().by_service(&svc.id).filter(|t| state(t) == TaskState::Complete).count();
    cluster.wait_for("3 completions", DEADLINE, |t| (complete(t) == 3).then_some(())).await;
    cluster.add_worker().await;
    let r = cluster
        .wait_for("the new worker runs the job", DEADLINE, |t| {
            let r = running(t, &svc.id);
            (r.len() == 1).then_some(r)
        })
        .await;
    finish_all(&cluster, r);
    cluster.wait_for("4 completions", DEADLINE, |t| (complete(t) == 4).then_some(())).await;
    let total = cluster.state.store.view(|t| t.tasks().by_service(&svc.id).count());
    assert_eq!(total, 4, "once per worker");
    cluster.shutdown().await;
}
