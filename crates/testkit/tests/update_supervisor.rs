//! The update supervisor in a whole in-process cluster (real orchestrator loop, scheduler, dispatcher and
//! agents with fake executors): an update whose new tasks exit 1 at once is rolled back after its first
//! batch (parallelism 2 of 4 slots), the service's spec is the old one again, and once tasks start again
//! the rollback completes with the old spec's tasks running in every slot.

use std::collections::BTreeSet;
use std::time::Duration;

use shoal_agent::testing::FakeBehavior;
use shoal_api::update_config::FailureAction;
use shoal_api::update_status::UpdateState;
use shoal_api::{
    restart_policy, service_spec, task_spec, Annotations, ContainerSpec, ReplicatedService, RestartPolicy, ServiceSpec,
    Task, TaskSpec, TaskState, UpdateConfig,
};
use shoal_manager::controlapi;
use shoal_store::Tables;
use shoal_testkit::{ClusterOptions, TestCluster};

const DEADLINE: Duration = Duration::from_secs(30);

fn ms(n: u64) -> Option<shoal_api::prost_types::Duration> {
    Some(shoal_api::duration_to_proto(Duration::from_millis(n)))
}

fn spec(args: &str) -> ServiceSpec {
    ServiceSpec {
        annotations: Some(Annotations { name: "web".into(), ..Default::default() }),
        task: Some(TaskSpec {
            runtime: Some(task_spec::Runtime::Container(ContainerSpec {
                image: "busybox".into(),
                args: args.split(' ').map(String::from).collect(),
                ..Default::default()
            })),
            restart: Some(RestartPolicy {
                condition: restart_policy::RestartCondition::Any as i32,
                delay: ms(100),
                ..Default::default()
            }),
            ..Default::default()
        }),
        mode: Some(service_spec::Mode::Replicated(ReplicatedService { replicas: 4 })),
        update: Some(UpdateConfig {
            parallelism: 2,
            failure_action: FailureAction::Rollback as i32,
            monitor: ms(500),
            ..Default::default()
        }),
        // The rollback goes all at once and ignores failures (the executors fail every start for a while).
        rollback: Some(UpdateConfig {
            parallelism: 0,
            failure_action: FailureAction::Continue as i32,
            monitor: ms(200),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn args(t: &Task) -> String {
    match t.spec.as_ref().and_then(|s| s.runtime.as_ref()) {
        Some(task_spec::Runtime::Container(c)) => c.args.join(" "),
        _ => String::new(),
    }
}

fn running_args(t: &Tables, service_id: &str) -> Vec<String> {
    t.tasks()
        .by_service(service_id)
        .filter(|t| t.status.as_ref().map(|s| s.state) == Some(TaskState::Running as i32))
        .filter(|t| t.desired_state == TaskState::Running as i32)
        .map(|t| args(t))
        .collect()
}

fn update_state(t: &Tables, service_id: &str) -> Option<(UpdateState, String)> {
    let u = t.services().get(service_id)?.update_status.clone()?;
    Some((u.state(), u.message))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_update_is_rolled_back_after_its_first_batch() {
    let cluster = TestCluster::start(ClusterOptions { workers: 3, ..Default::default() }).await;
    let svc = controlapi::create_service(&cluster.state, spec("sleep 1")).await.expect("create");
    cluster.wait_for("4 running tasks", DEADLINE, |t| (running_args(t, &svc.id).len() == 4).then_some(())).await;

    for w in &cluster.workers {
        w.executor.set_default(FakeBehavior::ExitImmediately(1));
    }
    let version = controlapi::get_service(&cluster.state, &svc.id).unwrap().meta.unwrap().version.unwrap().index;
    controlapi::update_service(&cluster.state, &svc.id, version, spec("sleep 2")).await.expect("update");

    let message = cluster
        .wait_for("the rollback to start", DEADLINE, |t| match update_state(t, &svc.id)? {
            (UpdateState::RollbackStarted, m) => Some(m),
            _ => None,
        })
        .await;
    assert!(message.starts_with("update rolled back due to failure or early termination of task"), "{message}");
    let now = controlapi::get_service(&cluster.state, &svc.id).unwrap();
    assert_eq!(now.spec, Some(spec("sleep 1")), "the previous spec is the spec again");
    assert!(now.previous_spec.is_none());

    for w in &cluster.workers {
        w.executor.set_default(FakeBehavior::RunUntilExited);
    }
    cluster
        .wait_for("the rollback to complete with 4 old tasks running", DEADLINE, |t| {
            let done = update_state(t, &svc.id)?.0 == UpdateState::RollbackCompleted;
            let running = running_args(t, &svc.id);
            (done && running.len() == 4 && running.iter().all(|a| a == "sleep 1")).then_some(())
        })
        .await;
    let updated_slots: BTreeSet<u64> = cluster
        .state
        .store
        .view(|t| t.tasks().by_service(&svc.id).filter(|t| args(t) == "sleep 2").map(|t| t.slot).collect());
    assert!(
        !updated_slots.is_empty() && updated_slots.len() <= 2,
        "only the first batch (parallelism 2) got the new spec: {updated_slots:?}"
    );
    cluster.shutdown().await;
}
