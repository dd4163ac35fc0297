//! The in-process cluster harness runs a real manager (orchestrator, scheduler, reaper, dispatcher) against
//! agents with fake executors: a service's tasks spread over the workers and run, a failed task is replaced,
//! and scaling to zero stops everything. Once over a `LocalProposer`, once over a real Raft node.

use std::time::Duration;

use shoal_api::{
    restart_policy, service_spec, task_spec, Annotations, ContainerSpec, ReplicatedService, RestartPolicy, ServiceSpec,
    TaskSpec, TaskState,
};
use shoal_manager::controlapi;
use shoal_store::Tables;
use shoal_testkit::{ClusterOptions, TestCluster};

fn spec(name: &str, replicas: u64) -> ServiceSpec {
    ServiceSpec {
        annotations: Some(Annotations { name: name.into(), ..Default::default() }),
        task: Some(TaskSpec {
            runtime: Some(task_spec::Runtime::Container(ContainerSpec {
                image: "busybox".into(),
                args: vec!["sleep".into(), "1".into()],
                ..Default::default()
            })),
            restart: Some(RestartPolicy {
                condition: restart_policy::RestartCondition::Any as i32,
                delay: Some(shoal_api::duration_to_proto(Duration::ZERO)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        mode: Some(service_spec::Mode::Replicated(ReplicatedService { replicas })),
        ..Default::default()
    }
}

fn running(t: &Tables, service_id: &str) -> Vec<(String, String)> {
    t.tasks()
        .by_service(service_id)
        .filter(|t| {
            t.status.as_ref().map(|s| s.state) == Some(TaskState::Running as i32)
                && t.desired_state == TaskState::Running as i32
        })
        .map(|t| (t.id.clone(), t.node_id.clone()))
        .collect()
}

async fn scenario(raft: bool) {
    let cluster = TestCluster::start(ClusterOptions { workers: 3, raft, ..Default::default() }).await;
    let svc = controlapi::create_service(&cluster.state, spec("web", 6)).await.expect("create");

    let placed = cluster
        .wait_for("6 running tasks", Duration::from_secs(20), |t| {
            let r = running(t, &svc.id);
            (r.len() == 6).then_some(r)
        })
        .await;
    for w in &cluster.workers {
        let on_node = placed.iter().filter(|(_, n)| *n == w.node_id).count();
        assert_eq!(on_node, 2, "spread: 2 tasks per worker, got {placed:?}");
    }

    // A task fails on its worker: it is replaced and the failure stays in history.
    let (victim, node) = placed[0].clone();
    let worker = cluster.workers.iter().find(|w| w.node_id == node).unwrap();
    assert!(worker.executor.exit(&victim, 1), "the fake executor runs {victim}");
    cluster
        .wait_for("the failed task replaced", Duration::from_secs(20), |t| {
            let failed = t.tasks().get(&victim)?.status.as_ref()?.state == TaskState::Failed as i32;
            let r = running(t, &svc.id);
            (failed && r.len() == 6 && !r.iter().any(|(id, _)| *id == victim)).then_some(())
        })
        .await;

    // Scale to zero: nothing runs on any worker.
    let current = controlapi::get_service(&cluster.state, &svc.id).unwrap();
    let version = current.meta.as_ref().and_then(|m| m.version.as_ref()).map(|v| v.index).unwrap();
    controlapi::update_service(&cluster.state, &svc.id, version, spec("web", 0)).await.expect("scale to 0");
    cluster
        .wait_for("no running task", Duration::from_secs(20), |t| running(t, &svc.id).is_empty().then_some(()))
        .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while cluster.workers.iter().any(|w| !w.executor.running().is_empty()) {
        assert!(std::time::Instant::now() < deadline, "workers still run tasks");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_runs_spreads_and_recovers_over_a_local_proposer() {
    scenario(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_runs_spreads_and_recovers_over_raft() {
    scenario(true).await;
}
