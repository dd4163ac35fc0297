//! The agent and the dispatcher together, in process: tonic on 127.0.0.1:0, a `LocalProposer` store, a
//! `ManualClock` (so heartbeats never expire by accident). Tasks are written to the store the way the
//! scheduler would; the test waits (with a deadline) for the statuses the agent reports.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use shoal_agent::testing::{FakeBehavior, FakeExecutor};
use shoal_agent::ProcessExecutor;
use shoal_agent::{Agent, AgentConfig, Executor};
use shoal_api::{node_status, task_spec, ContainerSpec, Task, TaskSpec, TaskState, TaskStatus};
use shoal_manager::{ClusterState, RandomIds};
use shoal_manager::{Dispatcher, DispatcherConfig};
use shoal_raft::LocalProposer;
use shoal_store::{Changes, ManualClock, MemoryStore};
use tokio::sync::watch;

struct Cluster {
    state: ClusterState,
    addr: std::net::SocketAddr,
    server: tokio::task::JoinHandle<()>,
    _stop_subsystem: watch::Sender<bool>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn cluster() -> Cluster {
    let store = Arc::new(MemoryStore::default());
    let proposer = Arc::new(LocalProposer::new(store.clone()));
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let state = ClusterState::new(store, proposer, clock, Arc::new(RandomIds::seeded(3)));
    let config = DispatcherConfig { status_flush_ms: 5, heartbeat_period_ms_default: 200, ..Default::default() };
    let dispatcher = Dispatcher::new(state.clone(), config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = dispatcher.serve_trusting_metadata_for_tests(listener);
    let (stop, stop_rx) = watch::channel(false);
    tokio::spawn(dispatcher.subsystem().run(state.clone(), stop_rx));
    Cluster { state, addr, server, _stop_subsystem: stop }
}

struct RunningAgent {
    shutdown: watch::Sender<bool>,
    join: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl RunningAgent {
    async fn stop(self) {
        self.shutdown.send_replace(true);
        tokio::time::timeout(Duration::from_secs(20), self.join).await.expect("agent did not stop").unwrap();
    }
}

fn start_agent(c: &Cluster, executor: Arc<dyn Executor>, dir: tempfile::TempDir) -> RunningAgent {
    let config = AgentConfig {
        node_id: "node-1".into(),
        manager_addr: format!("http://{}", c.addr),
        hostname: "worker-1".into(),
        state_dir: dir.path().to_path_buf(),
        engine_labels: HashMap::new(),
        generic_resources: Vec::new(),
    };
    let (shutdown, rx) = watch::channel(false);
    let join = tokio::spawn(Agent::new(config, executor).run(rx));
    RunningAgent { shutdown, join, _dir: dir }
}

impl Cluster {
    fn task(&self, id: &str) -> Task {
        self.state.store.view(|t| (**t.tasks().get(id).unwrap()).clone())
    }

    fn task_state(&self, id: &str) -> i32 {
        self.task(id).status.map_or(0, |s| s.state)
    }

    async fn create(&self, task: Task) {
        let mut c = Changes::new();
        c.create(task);
        self.state.propose(c).await.unwrap();
    }

    async fn set_desired(&self, id: &str, desired: TaskState) {
        let mut t = self.task(id);
        t.desired_state = desired as i32;
        let mut c = Changes::new();
        c.update(t);
        self.state.propose(c).await.unwrap();
    }

    async fn wait_state(&self, id: &str, state: TaskState) {
        wait_for(&format!("task {id} {state:?}"), || self.task_state(id) == state as i32).await;
    }
}

/// The tree's one wait helper (testkit's), included by path: testkit depends on this crate.
#[allow(unreachable_pub, reason = "testkit's public module, included here by path")]
#[path = "../../testkit/src/wait.rs"]
#[allow(dead_code)] // this test uses part of it
mod wait;

/// Polls `cond` (every 10 ms) until it holds, failing the test after 20 s.
async fn wait_for(what: &str, cond: impl FnMut() -> bool) {
    wait::wait_until_async(what, Duration::from_secs(20), Duration::from_millis(10), wait::holds(cond)).await
}

fn task(id: &str, state: TaskState, desired: TaskState, command: &[&str]) -> Task {
    Task {
        id: id.into(),
        service_id: "svc".into(),
        node_id: "node-1".into(),
        desired_state: desired as i32,
        status: Some(TaskStatus { state: state as i32, ..Default::default() }),
        spec: Some(
            TaskSpec {
                runtime: Some(task_spec::Runtime::Container(ContainerSpec {
                    image: "busybox".into(),
                    command: command.iter().map(|s| s.to_string()).collect(),
                    ..Default::default()
                })),
                ..Default::default()
            }
            .into(),
        ),
        ..Default::default()
    }
}

#[tokio::test]
async fn the_agent_runs_holds_and_stops_tasks_as_desired() {
    let c = cluster().await;
    let fake = FakeExecutor::new();
    fake.set_behavior("t-exit3", FakeBehavior::ExitImmediately(3));
    let agent = start_agent(&c, Arc::new(fake.clone()), tempfile::tempdir().unwrap());

    wait_for("node ready", || {
        c.state.store.view(|t| {
            t.nodes()
                .get("node-1")
                .and_then(|n| n.status.clone())
                .is_some_and(|s| s.state == node_status::State::Ready as i32)
        })
    })
    .await;
    let host = c.state.store.view(|t| t.nodes().get("node-1").unwrap().description.clone().unwrap().hostname);
    assert_eq!(host, "worker-1");

    // Runs to RUNNING, then SHUTDOWN when asked.
    c.create(task("t1", TaskState::Assigned, TaskState::Running, &["x"])).await;
    c.wait_state("t1", TaskState::Running).await;
    assert_eq!(fake.running(), vec!["t1".to_string()]);
    c.set_desired("t1", TaskState::Shutdown).await;
    c.wait_state("t1", TaskState::Shutdown).await;
    assert!(fake.calls("t1").contains(&"shutdown"));
    assert!(fake.running().is_empty());

    // Desired READY holds at READY (prepared, not started) until RUNNING is desired.
    c.create(task("t2", TaskState::Assigned, TaskState::Ready, &["x"])).await;
    c.wait_state("t2", TaskState::Ready).await;
    assert_eq!(fake.calls("t2"), vec!["prepare"]);
    c.set_desired("t2", TaskState::Running).await;
    c.wait_state("t2", TaskState::Running).await;

    // A non-zero exit is FAILED with the exit code.
    c.create(task("t-exit3", TaskState::Assigned, TaskState::Running, &["x"])).await;
    c.wait_state("t-exit3", TaskState::Failed).await;
    let st = c.task("t-exit3").status.unwrap();
    assert_eq!(st.message, "task: non-zero exit (3)");
    let Some(shoal_api::task_status::RuntimeStatus::Container(cs)) = st.runtime_status else { panic!("no exit code") };
    assert_eq!(cs.exit_code, 3);

    // A task already RUNNING that this agent does not run lost its process.
    c.create(task("t-lost", TaskState::Running, TaskState::Running, &["x"])).await;
    c.wait_state("t-lost", TaskState::Failed).await;
    assert_eq!(c.task("t-lost").status.unwrap().message, shoal_agent::LOST_TASK_MESSAGE);

    // A task deleted from the store is stopped and removed.
    let t2 = c.state.store.view(|t| t.tasks().get("t2").cloned()).unwrap();
    let mut ch = Changes::new();
    ch.remove(t2);
    c.state.propose(ch).await.unwrap();
    wait_for("t2 removed", || fake.calls("t2").contains(&"remove")).await;
    assert!(fake.running().is_empty());

    // Stopping the agent stops what it runs.
    c.create(task("t3", TaskState::Assigned, TaskState::Running, &["x"])).await;
    c.wait_state("t3", TaskState::Running).await;
    agent.stop().await;
    assert!(fake.running().is_empty(), "still running: {:?}", fake.running());
    assert!(fake.calls("t3").contains(&"shutdown"));
}

#[tokio::test]
async fn the_process_executor_end_to_end_reports_exit_codes_and_rejections() {
    let c = cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let exec = Arc::new(ProcessExecutor::new(dir.path(), "worker-1", HashMap::new()));
    let agent = start_agent(&c, exec, dir);

    c.create(task("p1", TaskState::Assigned, TaskState::Running, &["sh", "-c", "echo hi; exit 3"])).await;
    c.wait_state("p1", TaskState::Failed).await;
    let st = c.task("p1").status.unwrap();
    let Some(shoal_api::task_status::RuntimeStatus::Container(cs)) = st.runtime_status else { panic!("no exit code") };
    assert_eq!(cs.exit_code, 3);
    assert!(cs.pid > 0);

    c.create(task("p2", TaskState::Assigned, TaskState::Running, &[])).await;
    c.wait_state("p2", TaskState::Rejected).await;
    assert!(c.task("p2").status.unwrap().err.contains("has no command"));

    c.create(task("p3", TaskState::Assigned, TaskState::Running, &["sleep", "30"])).await;
    c.wait_state("p3", TaskState::Running).await;
    c.set_desired("p3", TaskState::Shutdown).await;
    c.wait_state("p3", TaskState::Shutdown).await;
    agent.stop().await;
}

/// The cluster's network keys reach the agent in its session and again after a rotation (written to the
/// cluster object as the key manager writes it): what the node's data plane is handed.
#[tokio::test]
async fn the_agent_is_given_the_network_keys_and_their_rotation() {
    use rand::SeedableRng;
    use shoal_manager::Keyring;
    let c = cluster().await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let ring = Keyring::default().completed(&mut rng).unwrap();
    let mut cluster_object = shoal_api::Cluster { id: "c1".into(), ..Default::default() };
    ring.store_in(&mut cluster_object);
    let mut ch = Changes::new();
    ch.create(cluster_object);
    c.state.propose(ch).await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let config = AgentConfig {
        node_id: "node-1".into(),
        manager_addr: format!("http://{}", c.addr),
        hostname: "worker-1".into(),
        state_dir: dir.path().to_path_buf(),
        engine_labels: HashMap::new(),
        generic_resources: Vec::new(),
    };
    let (keys_tx, keys_rx) = watch::channel(Vec::new());
    let (shutdown, rx) = watch::channel(false);
    let join = tokio::spawn(Agent::new(config, Arc::new(FakeExecutor::new())).with_network_keys_sink(keys_tx).run(rx));
    let agent = RunningAgent { shutdown, join, _dir: dir };

    wait_for("the keys", || *keys_rx.borrow() == ring.keys).await;
    let rotated = ring.rotated(&mut rng);
    let mut cluster_object = c.state.store.view(|t| (**t.clusters().get("c1").unwrap()).clone());
    rotated.store_in(&mut cluster_object);
    let mut ch = Changes::new();
    ch.update(cluster_object);
    c.state.propose(ch).await.unwrap();
    wait_for("the rotated keys", || *keys_rx.borrow() == rotated.keys).await;
    agent.stop().await;
}

/// A task on a network created with `--opt encrypted` is REJECTED by the agent with the data plane's reason
/// (no node encrypts yet), whatever the executor (the fake one would run anything); a task on a plain
/// network of the same kind reaches the executor.
#[tokio::test]
async fn the_agent_refuses_tasks_on_encrypted_networks_with_the_data_planes_reason() {
    let c = cluster().await;
    let fake = FakeExecutor::new();
    let agent = start_agent(&c, Arc::new(fake.clone()), tempfile::tempdir().unwrap());
    let on = |id: &str, encrypted: bool| {
        let mut options = HashMap::new();
        if encrypted {
            options.insert(shoal_api::ENCRYPTED_OPTION.to_string(), String::new());
        }
        let spec = shoal_api::NetworkSpec {
            driver_config: Some(shoal_api::Driver { name: "overlay".into(), options }),
            ..Default::default()
        };
        let network = shoal_api::Network { id: format!("net-{id}"), spec: Some(spec), ..Default::default() };
        let mut t = task(id, TaskState::Assigned, TaskState::Running, &["x"]);
        t.networks = vec![shoal_api::NetworkAttachment { network: Some(network), ..Default::default() }];
        t
    };
    c.create(on("t-enc", true)).await;
    c.wait_state("t-enc", TaskState::Rejected).await;
    let message = c.task("t-enc").status.unwrap().err;
    assert!(message.contains("network net-t-enc is encrypted") && message.contains("--opt encrypted"), "{message}");
    assert!(fake.calls("t-enc").is_empty(), "the executor never saw it: {:?}", fake.calls("t-enc"));
    c.create(on("t-plain", false)).await;
    c.wait_state("t-plain", TaskState::Running).await;
    agent.stop().await;
}
