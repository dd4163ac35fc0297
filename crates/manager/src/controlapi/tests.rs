//! Unit tests of the control API over a `LocalProposer`, a `MemoryStore`, a `ManualClock` and seeded IDs.

use std::sync::Arc;

use shoal_api::{
    node_spec, node_status, service_spec, task_spec, Annotations, ContainerSpec, Node, NodeRole, NodeSpec, NodeStatus,
    Placement, ReplicatedService, RestartPolicy, Service, ServiceSpec, Task, TaskSpec, TaskState, TaskStatus, Version,
};
use shoal_raft::LocalProposer;
use shoal_store::{Changes, ManualClock, MemoryStore, StoreObject};

use super::*;
use crate::state::{ClusterState, RandomIds};

pub(crate) fn cluster() -> (ClusterState, Arc<LocalProposer>) {
    let store = Arc::new(MemoryStore::default());
    let proposer = Arc::new(LocalProposer::new(store.clone()));
    let state = ClusterState::new(
        store,
        proposer.clone(),
        Arc::new(ManualClock::new(1_700_000_000_000)),
        Arc::new(RandomIds::seeded(7)),
    );
    (state, proposer)
}

pub(crate) fn spec(name: &str, replicas: u64) -> ServiceSpec {
    ServiceSpec {
        annotations: Some(Annotations { name: name.into(), ..Default::default() }),
        task: Some(TaskSpec {
            runtime: Some(task_spec::Runtime::Container(ContainerSpec {
                image: "busybox".into(),
                args: vec!["sleep".into(), "1".into()],
                ..Default::default()
            })),
            ..Default::default()
        }),
        mode: Some(service_spec::Mode::Replicated(ReplicatedService { replicas })),
        ..Default::default()
    }
}

fn invalid_spec(mutate: impl FnOnce(&mut ServiceSpec), expected_fragment: &str) {
    let mut s = spec("web", 1);
    mutate(&mut s);
    match validate_service_spec(&s) {
        Err(ControlError::InvalidArgument(m)) => assert!(m.contains(expected_fragment), "{m}"),
        other => panic!("expected InvalidArgument containing {expected_fragment:?}, got {other:?}"),
    }
}

fn task_spec_mut(s: &mut ServiceSpec) -> &mut TaskSpec {
    s.task.as_mut().unwrap()
}

#[test]
fn validation_names_the_bad_field() {
    assert!(validate_service_spec(&spec("web-1.a_b", 1)).is_ok());
    invalid_spec(|s| s.annotations = None, "name is required");
    invalid_spec(|s| s.annotations.as_mut().unwrap().name = "-web".into(), "invalid service name");
    invalid_spec(|s| s.annotations.as_mut().unwrap().name = "we b".into(), "invalid service name");
    invalid_spec(|s| s.annotations.as_mut().unwrap().name = "a".repeat(64), "longer than 63");
    invalid_spec(|s| task_spec_mut(s).runtime = None, "no container spec");
    invalid_spec(
        |s| task_spec_mut(s).runtime = Some(task_spec::Runtime::Container(ContainerSpec::default())),
        "Image is required",
    );
    invalid_spec(|s| s.mode = None, "mode is required");
    invalid_spec(
        |s| {
            task_spec_mut(s).placement =
                Some(Placement { constraints: vec!["node.color==red".into()], ..Default::default() })
        },
        "unknown key",
    );
    invalid_spec(
        |s| {
            task_spec_mut(s).restart = Some(RestartPolicy {
                delay: Some(shoal_api::prost_types::Duration { seconds: -1, nanos: 0 }),
                ..Default::default()
            })
        },
        "RestartPolicy.Delay",
    );
    invalid_spec(
        |s| {
            task_spec_mut(s).resources = Some(shoal_api::ResourceRequirements {
                limits: Some(shoal_api::Resources { nano_cpus: -5, ..Default::default() }),
                ..Default::default()
            })
        },
        "Resources.Limits",
    );
}

fn secs(seconds: i64) -> Option<shoal_api::prost_types::Duration> {
    Some(shoal_api::prost_types::Duration { seconds, nanos: 0 })
}

fn container_mut(s: &mut ServiceSpec) -> &mut ContainerSpec {
    match task_spec_mut(s).runtime.as_mut() {
        Some(task_spec::Runtime::Container(c)) => c,
        _ => unreachable!("spec() has a container"),
    }
}

/// i64::MAX nanoseconds, as the Engine API turns `"StopGracePeriod": 9223372036854775807` into a duration.
const I64_MAX_NS_SECS: i64 = i64::MAX / 1_000_000_000;

#[test]
fn counts_durations_and_sizes_are_bounded_and_the_error_names_the_limit() {
    use crate::limits::*;
    let ok = |mutate: &dyn Fn(&mut ServiceSpec)| {
        let mut s = spec("web", 1);
        mutate(&mut s);
        validate_service_spec(&s).unwrap_or_else(|e| panic!("{e}"));
    };
    let replicas = |n: u64| {
        move |s: &mut ServiceSpec| s.mode = Some(service_spec::Mode::Replicated(ReplicatedService { replicas: n }))
    };
    ok(&replicas(MAX_REPLICAS));
    invalid_spec(replicas(MAX_REPLICAS + 1), "Mode.Replicated.Replicas 250001 is too large: the limit is 250000");
    invalid_spec(replicas(1_000_000_000), "the limit is 250000");
    invalid_spec(replicas(i64::MAX as u64), "the limit is 250000");

    ok(&|s| container_mut(s).stop_grace_period = secs(3600));
    invalid_spec(
        |s| container_mut(s).stop_grace_period = secs(I64_MAX_NS_SECS),
        "ContainerSpec.StopGracePeriod 9223372036s is too long: the limit is 1h",
    );
    invalid_spec(|s| container_mut(s).stop_grace_period = secs(-1), "StopGracePeriod must not be negative");

    let restart = |r: RestartPolicy| move |s: &mut ServiceSpec| task_spec_mut(s).restart = Some(r);
    invalid_spec(
        restart(RestartPolicy { delay: secs(I64_MAX_NS_SECS), ..Default::default() }),
        "RestartPolicy.Delay 9223372036s is too long: the limit is 24h",
    );
    invalid_spec(
        restart(RestartPolicy { window: secs(90_000), ..Default::default() }),
        "RestartPolicy.Window 25h is too long",
    );
    invalid_spec(
        restart(RestartPolicy { max_attempts: u64::MAX, ..Default::default() }),
        "RestartPolicy.MaxAttempts 18446744073709551615 is too large: the limit is 1000000",
    );
    ok(&restart(RestartPolicy { delay: secs(86_400), max_attempts: 1_000_000, ..Default::default() }));

    let update = |u: shoal_api::UpdateConfig| move |s: &mut ServiceSpec| s.update = Some(u);
    invalid_spec(
        update(shoal_api::UpdateConfig { parallelism: u64::MAX, ..Default::default() }),
        "UpdateConfig.Parallelism 18446744073709551615 is too large: the limit is 250000",
    );
    invalid_spec(
        update(shoal_api::UpdateConfig { delay: secs(I64_MAX_NS_SECS), ..Default::default() }),
        "UpdateConfig.Delay 9223372036s is too long: the limit is 24h",
    );
    invalid_spec(
        update(shoal_api::UpdateConfig { monitor: secs(-3), ..Default::default() }),
        "UpdateConfig.Monitor must not be negative",
    );
    invalid_spec(
        |s| s.rollback = Some(shoal_api::UpdateConfig { monitor: secs(I64_MAX_NS_SECS), ..Default::default() }),
        "RollbackConfig.Monitor",
    );
    invalid_spec(
        update(shoal_api::UpdateConfig { max_failure_ratio: f32::NAN, ..Default::default() }),
        "MaxFailureRatio",
    );

    let health = |h: shoal_api::HealthConfig| move |s: &mut ServiceSpec| container_mut(s).healthcheck = Some(h.clone());
    let ns = |nanos: i32| Some(shoal_api::prost_types::Duration { seconds: 0, nanos });
    invalid_spec(
        health(shoal_api::HealthConfig { interval: secs(-1), ..Default::default() }),
        "ContainerSpec.Healthcheck.Interval must not be negative",
    );
    invalid_spec(
        health(shoal_api::HealthConfig { timeout: ns(999_999), ..Default::default() }),
        "ContainerSpec.Healthcheck.Timeout 999999ns is too short: use 0 (the default) or at least 1ms",
    );
    invalid_spec(
        health(shoal_api::HealthConfig { start_period: secs(I64_MAX_NS_SECS), ..Default::default() }),
        "Healthcheck.StartPeriod 9223372036s is too long: the limit is 24h",
    );
    invalid_spec(
        health(shoal_api::HealthConfig { start_interval: secs(-2), ..Default::default() }),
        "Healthcheck.StartInterval",
    );
    invalid_spec(
        health(shoal_api::HealthConfig { retries: -1, ..Default::default() }),
        "Healthcheck.Retries must not be negative",
    );
    invalid_spec(health(shoal_api::HealthConfig { retries: i32::MAX, ..Default::default() }), "the limit is 1000");
    ok(&health(shoal_api::HealthConfig {
        interval: ns(1_000_000),
        timeout: secs(30),
        retries: 3,
        ..Default::default()
    }));

    invalid_spec(
        |s| {
            task_spec_mut(s).placement =
                Some(Placement { constraints: vec!["node.role==boss".into()], ..Default::default() })
        },
        "node.role is manager or worker",
    );

    // 1.6 MB of labels fits; 3.2 MB does not, and the message gives the size and the limit.
    let labels = |n: usize| {
        move |s: &mut ServiceSpec| {
            s.annotations.as_mut().unwrap().labels = (0..n).map(|i| (format!("k{i}"), "x".repeat(100_000))).collect();
        }
    };
    ok(&labels(16));
    invalid_spec(labels(32), "over the limit of 3145728 bytes (3 MiB)");
    // ... and 1.6 MB x 1000 replicas is more than a manager should hold.
    invalid_spec(
        |s| {
            labels(16)(s);
            replicas(1000)(s);
        },
        "over the limit of 1073741824 bytes (1 GiB)",
    );
}

#[tokio::test]
async fn create_sets_id_times_and_spec_version_and_refuses_a_taken_name() {
    let (state, _) = cluster();
    let svc = create_service(&state, spec("web", 3)).await.unwrap();
    assert_eq!(svc.id.len(), 25);
    assert_eq!(svc.version(), 1);
    assert_eq!(svc.spec_version.as_ref().unwrap().index, 0);
    let meta = svc.meta.as_ref().unwrap();
    assert_eq!(meta.created_at.unwrap().seconds, 1_700_000_000);
    assert_eq!(meta.created_at, meta.updated_at);

    let err = create_service(&state, spec("WEB", 1)).await.unwrap_err();
    match err {
        ControlError::AlreadyExists(m) => {
            assert!(m.contains("service name WEB is already in use by service"), "{m}");
            assert!(m.contains(&svc.id), "{m}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn rollback_swaps_the_specs_and_an_update_clears_the_update_status() {
    use shoal_api::update_status::UpdateState;
    let (state, _) = cluster();
    let svc = create_service(&state, spec("web", 3)).await.unwrap();
    let err = rollback_service(&state, "web", svc.version()).await.unwrap_err();
    assert!(matches!(&err, ControlError::InvalidArgument(m) if m.contains("does not have a previous spec")), "{err:?}");
    let updated = update_service(&state, "web", svc.version(), spec("web", 5)).await.unwrap();
    // A stale version is refused, as for an update.
    let err = rollback_service(&state, "web", svc.version()).await.unwrap_err();
    assert!(matches!(&err, ControlError::Conflict(_)), "{err:?}");
    let rolled = rollback_service(&state, "web", updated.version()).await.unwrap();
    assert_eq!(rolled.spec, svc.spec);
    assert_eq!(rolled.spec_version, svc.spec_version);
    assert_eq!(rolled.previous_spec, updated.spec);
    assert_eq!(rolled.previous_spec_version, updated.spec_version);
    let status = rolled.update_status.clone().unwrap();
    assert_eq!(status.state(), UpdateState::RollbackStarted);
    assert_eq!(status.message, "manually requested rollback");
    assert!(status.started_at.is_some());
    // The next spec write starts afresh: no update status until the orchestrator starts one.
    let again = update_service(&state, "web", rolled.version(), spec("web", 4)).await.unwrap();
    assert!(again.update_status.is_none());
}

#[tokio::test]
async fn update_is_compare_and_swap_and_keeps_the_previous_spec() {
    let (state, _) = cluster();
    let svc = create_service(&state, spec("web", 3)).await.unwrap();
    create_service(&state, spec("db", 1)).await.unwrap();

    let updated = update_service(&state, "web", svc.version(), spec("web", 5)).await.unwrap();
    assert!(updated.version() > svc.version());
    assert_eq!(updated.spec_version.as_ref().unwrap().index, svc.version());
    assert_eq!(updated.previous_spec, svc.spec);
    assert_eq!(updated.previous_spec_version, svc.spec_version);

    // A stale version is refused.
    let err = update_service(&state, &svc.id, svc.version(), spec("web", 6)).await.unwrap_err();
    assert!(matches!(&err, ControlError::Conflict(m) if m.ends_with(": update out of sequence")), "{err:?}");
    // A rename to a taken name is refused; to a free one, allowed.
    let err = update_service(&state, &svc.id, updated.version(), spec("db", 1)).await.unwrap_err();
    assert!(matches!(&err, ControlError::AlreadyExists(m) if m.contains("already in use")), "{err:?}");
    let renamed = update_service(&state, &svc.id, updated.version(), spec("web2", 1)).await.unwrap();
    assert_eq!(get_service(&state, "web2").unwrap().id, renamed.id);
    assert!(matches!(get_service(&state, "web"), Err(ControlError::NotFound { .. })));
}

#[tokio::test]
async fn lookups_go_id_then_name_then_unique_prefix() {
    let (state, _) = cluster();
    let a = create_service(&state, spec("alpha", 1)).await.unwrap();
    let b = create_service(&state, spec("beta", 1)).await.unwrap();
    assert_eq!(get_service(&state, &a.id).unwrap().id, a.id);
    assert_eq!(get_service(&state, "beta").unwrap().id, b.id);
    assert_eq!(get_service(&state, &a.id[..10]).unwrap().id, a.id);
    assert!(matches!(get_service(&state, "nope"), Err(ControlError::NotFound { kind: "service", .. })));
    assert!(matches!(get_service(&state, ""), Err(ControlError::InvalidArgument(_))));
    // "" prefix is refused above; a one-character prefix common to both is ambiguous when it is.
    let common: String = a.id.chars().zip(b.id.chars()).take_while(|(x, y)| x == y).map(|(x, _)| x).collect();
    if !common.is_empty() {
        assert!(
            matches!(get_service(&state, &common), Err(ControlError::InvalidArgument(m)) if m.contains("ambiguous"))
        );
    }
}

#[tokio::test]
async fn list_services_filters_by_prefix_label_and_mode() {
    let (state, _) = cluster();
    let mut s = spec("web", 1);
    s.annotations.as_mut().unwrap().labels.insert("tier".into(), "front".into());
    create_service(&state, s).await.unwrap();
    create_service(&state, spec("webhook", 1)).await.unwrap();
    let mut g = spec("agent", 1);
    g.mode = Some(service_spec::Mode::Global(shoal_api::GlobalService {}));
    create_service(&state, g).await.unwrap();

    let names = |f: ServiceFilters| -> Vec<String> {
        list_services(&state, &f).iter().map(|s| s.unique_name().unwrap().to_string()).collect()
    };
    assert_eq!(names(ServiceFilters::default()), ["agent", "web", "webhook"]);
    assert_eq!(names(ServiceFilters { name_prefixes: vec!["web".into()], ..Default::default() }), ["web", "webhook"]);
    assert_eq!(names(ServiceFilters { labels: vec!["tier".into()], ..Default::default() }), ["web"]);
    assert_eq!(names(ServiceFilters { labels: vec!["tier=back".into()], ..Default::default() }), Vec::<String>::new());
    assert_eq!(names(ServiceFilters { modes: vec!["global".into()], ..Default::default() }), ["agent"]);
}

fn task(id: &str, service: &Service, slot: u64, node: &str, state: TaskState, desired: TaskState) -> Task {
    let mut t = Task {
        id: id.into(),
        service_id: service.id.clone(),
        slot,
        node_id: node.into(),
        service_annotations: service.spec.as_ref().unwrap().annotations.clone().map(Into::into),
        status: Some(TaskStatus { state: state as i32, ..Default::default() }),
        ..Default::default()
    };
    t.set_desired_state(desired);
    t
}

#[tokio::test]
async fn tasks_list_by_service_node_state_and_status_counts() {
    let (state, _) = cluster();
    let web = create_service(&state, spec("web", 3)).await.unwrap();
    let db = create_service(&state, spec("db", 1)).await.unwrap();
    let mut c = Changes::new();
    c.create(task("t1", &web, 1, "n1", TaskState::Running, TaskState::Running));
    c.create(task("t2", &web, 2, "n2", TaskState::Pending, TaskState::Running));
    c.create(task("t3", &web, 1, "n1", TaskState::Failed, TaskState::Shutdown));
    c.create(task("t4", &db, 1, "n1", TaskState::Running, TaskState::Running));
    c.create(node("n1", "box1", NodeRole::Manager, node_status::State::Ready));
    state.propose(c).await.unwrap();

    let ids = |f: TaskFilters| -> Vec<String> { list_tasks(&state, &f).iter().map(|t| t.id.clone()).collect() };
    let mut all = ids(TaskFilters::default());
    all.sort();
    assert_eq!(all, ["t1", "t2", "t3", "t4"]);
    assert_eq!(ids(TaskFilters { services: vec!["web".into()], ..Default::default() }).len(), 3);
    assert_eq!(ids(TaskFilters { services: vec!["nope".into()], ..Default::default() }), Vec::<String>::new());
    let mut on_box1 = ids(TaskFilters { nodes: vec!["box1".into()], ..Default::default() });
    on_box1.sort();
    assert_eq!(on_box1, ["t1", "t3", "t4"]);
    assert_eq!(
        ids(TaskFilters {
            services: vec!["web".into()],
            desired_states: vec![TaskState::Running],
            nodes: vec!["n1".into()],
            ..Default::default()
        }),
        ["t1"]
    );
    assert_eq!(ids(TaskFilters { name_prefixes: vec!["web.2.".into()], ..Default::default() }), ["t2"]);
    assert_eq!(get_task(&state, "t3").unwrap().slot, 1);
    assert!(matches!(get_task(&state, "zz"), Err(ControlError::NotFound { kind: "task", .. })));

    let st = state.store.view(|t| service_status(t, &web));
    assert_eq!(st, ServiceStatus { running_tasks: 1, desired_tasks: 3, completed_tasks: 0 });
}

#[tokio::test]
async fn remove_service_marks_its_tasks_for_removal_in_the_same_write() {
    let (state, _) = cluster();
    let web = create_service(&state, spec("web", 2)).await.unwrap();
    let mut c = Changes::new();
    c.create(task("t1", &web, 1, "n1", TaskState::Running, TaskState::Running));
    state.propose(c).await.unwrap();
    let mut watch = state.store.watch();
    remove_service(&state, "web").await.unwrap();
    let commit = watch.try_recv().unwrap();
    assert_eq!(commit.changes.len(), 2);
    let t1 = get_task(&state, "t1").unwrap();
    assert_eq!(t1.desired_state, TaskState::Remove as i32);
    assert!(matches!(remove_service(&state, "web").await, Err(ControlError::NotFound { .. })));
}

#[tokio::test]
async fn removing_a_service_with_more_tasks_than_one_write_holds_is_one_bounded_write() {
    use crate::write::MAX_ACTIONS_PER_WRITE;
    let (state, _) = cluster();
    let web = create_service(&state, spec("web", 1500)).await.unwrap();
    let mut c = Changes::new();
    for i in 0..1500u64 {
        c.create(task(&format!("t{i}"), &web, i + 1, "", TaskState::Pending, TaskState::Running));
    }
    state.propose(c).await.unwrap();
    let mut watch = state.store.watch();
    remove_service(&state, "web").await.unwrap();
    let commit = watch.try_recv().unwrap();
    assert_eq!(commit.changes.len(), MAX_ACTIONS_PER_WRITE, "the service and 999 tasks");
    assert!(get_service(&state, "web").is_err());
    // The orchestrator marks the others: what it would write for the gone service.
    let rest = state.store.view(|t| crate::orchestrator::remove_service_tasks(t, &web.id, 0));
    assert_eq!(rest.len(), 1500 - (MAX_ACTIONS_PER_WRITE - 1));
}

fn node(id: &str, host: &str, role: NodeRole, st: node_status::State) -> Node {
    let mut n = Node {
        id: id.into(),
        spec: Some(NodeSpec { ..Default::default() }),
        description: Some(shoal_api::NodeDescription { hostname: host.into(), ..Default::default() }),
        status: Some(NodeStatus { ..Default::default() }),
        ..Default::default()
    };
    n.set_role(role);
    n.spec.as_mut().unwrap().set_desired_role(role);
    n.spec.as_mut().unwrap().set_membership(node_spec::Membership::Accepted);
    n.status.as_mut().unwrap().set_state(st);
    n
}

/// A demotion that would leave the other Raft members without a reachable quorum is refused with SwarmKit's
/// message and changes nothing; once the unreachable manager is back it goes through.
#[tokio::test]
async fn a_demotion_that_would_lose_quorum_is_refused() {
    use shoal_api::{raft_member_status::Reachability, ManagerStatus};
    let (state, _) = cluster();
    let manager = |id: &str, raft_id: u64, leader: bool, reach: Reachability| {
        let mut n = node(id, id, NodeRole::Manager, node_status::State::Ready);
        n.manager_status = Some(ManagerStatus {
            raft_id,
            addr: format!("127.0.0.{raft_id}:4242"),
            leader,
            reachability: reach as i32,
        });
        n
    };
    let mut c = Changes::new();
    c.create(manager("a", 1, true, Reachability::Reachable));
    c.create(manager("b", 2, false, Reachability::Unreachable));
    c.create(manager("c", 3, false, Reachability::Reachable));
    state.propose(c).await.unwrap();
    let demote = |id: &str| {
        let n = get_node(&state, id).unwrap();
        let mut spec = n.spec.clone().unwrap();
        spec.set_desired_role(NodeRole::Worker);
        (n.version(), spec)
    };
    let (version, spec) = demote("c");
    let err = update_node(&state, "c", version, spec).await.unwrap_err();
    assert!(
        matches!(&err, ControlError::FailedPrecondition(m)
            if m.starts_with("can't remove member from the raft: this would result in a loss of quorum")
                && m.contains("1 of the 2 other managers are reachable")),
        "{err:?}"
    );
    assert_eq!(get_node(&state, "c").unwrap().spec.clone().unwrap().desired_role(), NodeRole::Manager);

    let b = get_node(&state, "b").unwrap();
    let mut back = (*b).clone();
    back.manager_status.as_mut().unwrap().reachability = Reachability::Reachable as i32;
    let mut c = Changes::new();
    c.update(back);
    state.propose(c).await.unwrap();
    let (version, spec) = demote("c");
    let n = update_node(&state, "c", version, spec).await.unwrap();
    assert_eq!(n.spec.unwrap().desired_role(), NodeRole::Worker);
}

#[tokio::test]
async fn node_updates_protect_the_last_manager_and_removal_needs_force() {
    let (state, _) = cluster();
    let mut c = Changes::new();
    c.create(node("m1", "mgr", NodeRole::Manager, node_status::State::Ready));
    c.create(node("w1", "wrk", NodeRole::Worker, node_status::State::Ready));
    c.create(node("w2", "old", NodeRole::Worker, node_status::State::Down));
    state.propose(c).await.unwrap();

    let m1 = get_node(&state, "mgr").unwrap();
    let mut demote = m1.spec.clone().unwrap();
    demote.set_desired_role(NodeRole::Worker);
    let err = update_node(&state, "m1", m1.version(), demote).await.unwrap_err();
    assert!(matches!(&err, ControlError::FailedPrecondition(m) if m.contains("last manager")), "{err:?}");

    let w1 = get_node(&state, "w1").unwrap();
    let mut drain = w1.spec.clone().unwrap();
    drain.set_availability(node_spec::Availability::Drain);
    drain.annotations =
        Some(Annotations { labels: [("zone".to_string(), "east".to_string())].into(), ..Default::default() });
    let updated = update_node(&state, "wrk", w1.version(), drain.clone()).await.unwrap();
    assert_eq!(updated.spec.as_ref().unwrap().availability(), node_spec::Availability::Drain);
    assert!(matches!(update_node(&state, "w1", w1.version(), drain).await, Err(ControlError::Conflict(_))));

    let labelled = list_nodes(&state, &NodeFilters { labels: vec!["zone=east".into()], ..Default::default() });
    assert_eq!(labelled.len(), 1);
    let managers = list_nodes(&state, &NodeFilters { roles: vec!["manager".into()], ..Default::default() });
    assert_eq!(managers[0].id, "m1");

    assert!(matches!(remove_node(&state, "m1", true).await,
            Err(ControlError::FailedPrecondition(m)) if m.contains("demote")));
    assert!(matches!(remove_node(&state, "w1", false).await,
            Err(ControlError::FailedPrecondition(m)) if m.contains("force")));
    remove_node(&state, "w2", false).await.unwrap();
    remove_node(&state, "w1", true).await.unwrap();
    assert_eq!(list_nodes(&state, &NodeFilters::default()).len(), 1);
}

#[tokio::test]
async fn a_docker_engine_worker_is_not_promoted_and_a_shoal_worker_is() {
    let (state, _) = cluster();
    let engine = |labels: &[(&str, &str)]| shoal_api::EngineDescription {
        engine_version: "20.10.24+dfsg1".into(),
        labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..Default::default()
    };
    let mut docker = node("w1", "docker-host", NodeRole::Worker, node_status::State::Ready);
    docker.description.as_mut().unwrap().engine = Some(engine(&[]));
    let mut shoal = node("w2", "shoal-host", NodeRole::Worker, node_status::State::Ready);
    shoal.description.as_mut().unwrap().engine = Some(engine(&[(shoal_api::SHOAL_AGENT_LABEL, "0.1.0")]));
    let mut c = Changes::new();
    c.create(node("m1", "mgr", NodeRole::Manager, node_status::State::Ready));
    c.create(docker);
    c.create(shoal);
    state.propose(c).await.unwrap();

    for (id, refused) in [("w1", true), ("w2", false)] {
        let n = get_node(&state, id).unwrap();
        let mut promote = n.spec.clone().unwrap();
        promote.set_desired_role(NodeRole::Manager);
        let res = update_node(&state, id, n.version(), promote).await;
        if refused {
            let err = res.unwrap_err();
            assert!(
                matches!(&err, ControlError::FailedPrecondition(m)
                    if m.contains("w1 (docker-host) runs Docker Engine 20.10.24+dfsg1") && m.contains("shoal daemon")),
                "{err:?}"
            );
            assert_eq!(get_node(&state, id).unwrap().spec.clone().unwrap().desired_role(), NodeRole::Worker);
        } else {
            assert_eq!(res.unwrap().spec.unwrap().desired_role(), NodeRole::Manager);
        }
    }
    // Other changes to the engine's node are accepted.
    let n = get_node(&state, "w1").unwrap();
    let mut drain = n.spec.clone().unwrap();
    drain.set_availability(node_spec::Availability::Drain);
    update_node(&state, "w1", n.version(), drain).await.unwrap();
}

#[tokio::test]
async fn writes_on_a_follower_are_refused_with_not_leader() {
    let (state, proposer) = cluster();
    proposer.set_leader(false);
    assert_eq!(create_service(&state, spec("web", 1)).await.unwrap_err(), ControlError::NotLeader);
}

fn replicated_job(max_concurrent: u64, total_completions: u64) -> Option<service_spec::Mode> {
    Some(service_spec::Mode::ReplicatedJob(shoal_api::ReplicatedJob { max_concurrent, total_completions }))
}

#[tokio::test]
async fn job_specs_are_bounded_and_have_no_update_config() {
    invalid_spec(|s| s.mode = replicated_job(2, 250_001), "Mode.ReplicatedJob.TotalCompletions 250001 is too large");
    invalid_spec(|s| s.mode = replicated_job(250_001, 5), "Mode.ReplicatedJob.MaxConcurrent 250001 is too large");
    invalid_spec(|s| s.mode = replicated_job(0, 5), "Mode.ReplicatedJob.MaxConcurrent is 0");
    invalid_spec(
        |s| {
            s.mode = Some(service_spec::Mode::GlobalJob(shoal_api::GlobalJob {}));
            s.update = Some(Default::default());
        },
        "UpdateConfig: jobs",
    );
    invalid_spec(
        |s| {
            s.mode = replicated_job(1, 1);
            s.rollback = Some(Default::default());
        },
        "RollbackConfig: jobs",
    );
    invalid_spec(
        |s| {
            s.mode = replicated_job(1, 250_000);
            s.annotations.as_mut().unwrap().labels.insert("big".into(), "x".repeat(8192));
        },
        "Mode.ReplicatedJob.TotalCompletions 250000 x a spec of",
    );
    // Nothing to run is a job done at once.
    let mut empty = spec("empty", 1);
    empty.mode = replicated_job(0, 0);
    validate_service_spec(&empty).unwrap();
}

#[tokio::test]
async fn a_job_starts_at_iteration_0_and_every_update_runs_it_again() {
    let (state, _p) = cluster();
    let mut job = spec("job", 1);
    job.mode = replicated_job(2, 5);
    let svc = create_service(&state, job.clone()).await.unwrap();
    let status = svc.job_status.expect("a job has a job status");
    assert_eq!(status.job_iteration, Some(Version { index: 0 }));
    assert_eq!(status.last_execution, Some(state.now()));
    let mut forced = job.clone();
    forced.task.as_mut().unwrap().force_update += 1;
    let updated = update_service(&state, &svc.id, svc.version(), forced).await.unwrap();
    assert_eq!(updated.job_status.unwrap().job_iteration, Some(Version { index: 1 }));
    // A service is not a job: no job status.
    let web = create_service(&state, spec("web", 1)).await.unwrap();
    assert_eq!(web.job_status, None);
    // A job cannot become a service, nor the other way round.
    let err = update_service(&state, &web.id, web.version(), {
        let mut s = job.clone();
        s.annotations.as_mut().unwrap().name = "web".into();
        s
    })
    .await
    .unwrap_err();
    assert!(
        matches!(&err, ControlError::InvalidArgument(m) if m.contains("(replicated -> replicated-job)")),
        "{err:?}"
    );
}

#[tokio::test]
async fn mode_changes_are_refused_naming_the_field() {
    invalid_spec(|s| s.mode = None, "the service mode is required");

    let (state, _p) = cluster();
    let svc = create_service(&state, spec("web", 1)).await.unwrap();
    let mut g = spec("web", 1);
    g.mode = Some(service_spec::Mode::Global(shoal_api::GlobalService {}));
    let err = update_service(&state, &svc.id, svc.version(), g.clone()).await.unwrap_err();
    assert!(
        matches!(&err, ControlError::InvalidArgument(m) if m.contains("Mode: service mode change is not allowed \
                                                                       (replicated -> global)")),
        "{err:?}"
    );
    let after = state.store.view(|t| t.services().get(&svc.id).cloned()).unwrap();
    assert_eq!(after.version(), svc.version(), "a refused update changes nothing");
    // A global service updates as global.
    let gs = create_service(&state, {
        let mut s = g.clone();
        s.annotations.as_mut().unwrap().name = "agent".into();
        s
    })
    .await
    .unwrap();
    let mut g2 = g;
    g2.annotations.as_mut().unwrap().name = "agent".into();
    set_image_args(&mut g2);
    update_service(&state, &gs.id, gs.version(), g2).await.unwrap();
}

fn set_image_args(s: &mut ServiceSpec) {
    if let Some(task_spec::Runtime::Container(c)) = s.task.as_mut().and_then(|t| t.runtime.as_mut()) {
        c.args = vec!["sleep".into(), "2".into()];
    }
}

#[tokio::test]
async fn the_whole_cluster_s_tasks_are_bounded_across_services() {
    use crate::limits::MAX_CLUSTER_TASKS;
    let (state, _) = cluster();
    // Four services of 250,000 replicas reach the bound exactly; one more task anywhere is refused.
    for i in 0..4 {
        create_service(&state, spec(&format!("big{i}"), MAX_CLUSTER_TASKS / 4)).await.unwrap();
    }
    let totals = state.store.view(|t| t.service_totals());
    assert_eq!(totals.tasks, MAX_CLUSTER_TASKS);
    match create_service(&state, spec("one-more", 1)).await {
        Err(ControlError::InvalidArgument(m)) => {
            assert!(m.contains("would ask for 1000001 tasks in all, over the limit of 1000000"), "{m}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(state.store.view(|t| t.services().by_name("one-more").is_none()), "nothing created");

    // Scaling one of them up is refused the same way; scaling it down makes room, and the totals follow.
    let big0 = state.store.view(|t| t.services().by_name("big0").map(|s| (**s).clone())).unwrap();
    let up = update_service(&state, &big0.id, big0.version(), spec("big0", MAX_CLUSTER_TASKS / 4 + 1)).await;
    assert!(matches!(up, Err(ControlError::InvalidArgument(_))), "{up:?}");
    update_service(&state, &big0.id, big0.version(), spec("big0", 10)).await.unwrap();
    create_service(&state, spec("one-more", 1)).await.unwrap();
    assert_eq!(state.store.view(|t| t.service_totals()).tasks, MAX_CLUSTER_TASKS / 4 * 3 + 11);
    remove_service(&state, "big1").await.unwrap();
    assert_eq!(state.store.view(|t| t.service_totals()).tasks, MAX_CLUSTER_TASKS / 4 * 2 + 11);
}

#[tokio::test]
async fn a_removed_node_is_blacklisted_until_its_certificate_would_expire() {
    let (state, _) = cluster();
    let mut c = Changes::new();
    c.create(shoal_api::Cluster { id: "c1".into(), ..Default::default() });
    c.create(node("w1", "wrk", NodeRole::Worker, node_status::State::Down));
    c.create(node("w2", "wrk2", NodeRole::Worker, node_status::State::Down));
    state.propose(c).await.unwrap();
    remove_node(&state, "w1", false).await.unwrap();
    let now = std::time::SystemTime::try_from(state.now()).unwrap();
    let cluster = get_cluster(&state).unwrap();
    assert!(is_blacklisted(&cluster, "w1", now));
    assert!(!is_blacklisted(&cluster, "w2", now));
    // No certificate in the store: refused for the longest life the CA gives (90 days by default), not forever.
    assert!(is_blacklisted(&cluster, "w1", now + std::time::Duration::from_secs(89 * 24 * 3600)));
    assert!(!is_blacklisted(&cluster, "w1", now + std::time::Duration::from_secs(92 * 24 * 3600)));
    remove_node(&state, "w2", false).await.unwrap();
    assert_eq!(get_cluster(&state).unwrap().blacklisted_certificates.len(), 2);
}
