//! Secrets and configs from the dispatcher to the agent and its executor, in process: a real dispatcher
//! (tonic on 127.0.0.1:0, `LocalProposer` store, `ManualClock`) and two agents with fake executors. Secrets,
//! configs and tasks are written to the store the way the control API and scheduler would; the tests wait
//! (with deadlines) for what the agents report and hold.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use shoal_agent::testing::FakeExecutor;
use shoal_agent::{Agent, AgentConfig};
use shoal_agent::{FileKind, Held};
use shoal_api::{
    config_reference, secret_reference, task_spec, Annotations, Config, ConfigReference, ConfigSpec, ContainerSpec,
    Driver, FileTarget, Secret, SecretReference, SecretSpec, Task, TaskSpec, TaskState, TaskStatus,
};
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
    let state = ClusterState::new(store, proposer, clock, Arc::new(RandomIds::seeded(5)));
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
    fake: FakeExecutor,
    held: watch::Receiver<Held>,
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

fn start_agent(c: &Cluster, node_id: &str) -> RunningAgent {
    let dir = tempfile::tempdir().unwrap();
    let config = AgentConfig {
        node_id: node_id.into(),
        manager_addr: format!("http://{}", c.addr),
        hostname: format!("host-{node_id}"),
        state_dir: dir.path().to_path_buf(),
        engine_labels: HashMap::new(),
        generic_resources: Vec::new(),
    };
    let fake = FakeExecutor::new();
    let (held_tx, held) = watch::channel(Held::default());
    let (shutdown, rx) = watch::channel(false);
    let agent = Agent::new(config, Arc::new(fake.clone())).with_held_sink(Arc::new(move |h: &Held| {
        held_tx.send_replace(h.clone());
    }));
    let join = tokio::spawn(agent.run(rx));
    RunningAgent { fake, held, shutdown, join, _dir: dir }
}

impl Cluster {
    fn task(&self, id: &str) -> Task {
        self.state.store.view(|t| (**t.tasks().get(id).unwrap()).clone())
    }

    fn status(&self, id: &str) -> TaskStatus {
        self.task(id).status.unwrap_or_default()
    }

    async fn write(&self, c: Changes) {
        self.state.propose(c).await.unwrap();
    }

    async fn wait_state(&self, id: &str, state: TaskState) {
        wait_for(&format!("task {id} {state:?}"), || self.status(id).state == state as i32).await;
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

fn secret(id: &str, name: &str, data: &str) -> Secret {
    Secret {
        id: id.into(),
        spec: Some(SecretSpec {
            annotations: Some(Annotations { name: name.into(), ..Default::default() }),
            data: data.as_bytes().to_vec(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn templated_config(id: &str, name: &str, text: &str) -> Config {
    Config {
        id: id.into(),
        spec: Some(ConfigSpec {
            annotations: Some(Annotations { name: name.into(), ..Default::default() }),
            data: text.as_bytes().to_vec(),
            templating: Some(Driver { name: "golang".into(), ..Default::default() }),
        }),
        ..Default::default()
    }
}

fn target(name: &str) -> FileTarget {
    FileTarget { name: name.into(), uid: "0".into(), gid: "0".into(), mode: 0o444 }
}

fn task(id: &str, node: &str, slot: u64, secrets: &[(&str, &str)], configs: &[(&str, &str)]) -> Task {
    Task {
        id: id.into(),
        service_id: "svc".into(),
        node_id: node.into(),
        slot,
        service_annotations: Some(Annotations { name: "web".into(), ..Default::default() }.into()),
        desired_state: TaskState::Running as i32,
        status: Some(TaskStatus { state: TaskState::Assigned as i32, ..Default::default() }),
        spec: Some(
            TaskSpec {
                runtime: Some(task_spec::Runtime::Container(ContainerSpec {
                    image: "busybox".into(),
                    secrets: secrets
                        .iter()
                        .map(|(id, name)| SecretReference {
                            secret_id: id.to_string(),
                            secret_name: name.to_string(),
                            target: Some(secret_reference::Target::File(target(name))),
                        })
                        .collect(),
                    configs: configs
                        .iter()
                        .map(|(id, name)| ConfigReference {
                            config_id: id.to_string(),
                            config_name: name.to_string(),
                            target: Some(config_reference::Target::File(target(name))),
                        })
                        .collect(),
                    ..Default::default()
                })),
                ..Default::default()
            }
            .into(),
        ),
        ..Default::default()
    }
}

fn file_data(fake: &FakeExecutor, task: &str, kind: FileKind, target: &str) -> Option<String> {
    fake.files(task)
        .into_iter()
        .find(|f| f.kind == kind && f.target == target)
        .map(|f| String::from_utf8(f.data.expose().to_vec()).unwrap())
}

#[tokio::test]
async fn only_the_node_running_a_task_gets_its_secret_and_drops_it_when_the_task_ends() {
    let c = cluster().await;
    let mut setup = Changes::new();
    setup.create(secret("s1", "db_pw", "pw-0123456789")).create(templated_config(
        "c1",
        "app",
        "{{.Service.Name}}-{{.Task.Slot}}",
    ));
    c.write(setup).await;
    let a = start_agent(&c, "node-a");
    let b = start_agent(&c, "node-b");

    let mut tasks = Changes::new();
    tasks.create(task("t1", "node-a", 1, &[("s1", "db_pw")], &[("c1", "app")]));
    tasks.create(task("t2", "node-a", 2, &[("s1", "db_pw")], &[("c1", "app")]));
    tasks.create(task("t3", "node-b", 3, &[], &[]));
    c.write(tasks).await;
    for t in ["t1", "t2", "t3"] {
        c.wait_state(t, TaskState::Running).await;
    }
    // Each task of node A got the secret and its own rendering of the config.
    assert_eq!(file_data(&a.fake, "t1", FileKind::Secret, "db_pw").as_deref(), Some("pw-0123456789"));
    assert_eq!(file_data(&a.fake, "t1", FileKind::Config, "app").as_deref(), Some("web-1"));
    assert_eq!(file_data(&a.fake, "t2", FileKind::Config, "app").as_deref(), Some("web-2"));
    let both = Held { secrets: vec![("s1".into(), "db_pw".into())], configs: vec![("c1".into(), "app".into())] };
    assert_eq!(*a.held.borrow(), both);
    // Node B runs a task too, but none that uses them: it never held them.
    assert_eq!(*b.held.borrow(), Held::default());
    assert!(b.fake.files("t3").is_empty());

    // One of the two tasks ends: node A keeps them for the other. Both end: node A drops them.
    a.fake.exit("t1", 0);
    c.wait_state("t1", TaskState::Complete).await;
    assert_eq!(*a.held.borrow(), both);
    a.fake.exit("t2", 0);
    c.wait_state("t2", TaskState::Complete).await;
    let mut held = a.held.clone();
    wait_for("node A to drop the secret and config", || *held.borrow_and_update() == Held::default()).await;
    assert_eq!(*b.held.borrow(), Held::default());
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn a_task_whose_secret_is_gone_is_rejected_naming_it() {
    let c = cluster().await;
    let a = start_agent(&c, "node-a");
    let mut tasks = Changes::new();
    tasks.create(task("t1", "node-a", 1, &[("s-gone", "db_pw")], &[]));
    c.write(tasks).await;
    c.wait_state("t1", TaskState::Rejected).await;
    let st = c.status("t1");
    assert!(st.err.contains("secret db_pw (s-gone) was not sent to this node"), "{st:?}");
    assert!(a.fake.calls("t1").is_empty(), "never prepared: {:?}", a.fake.calls("t1"));

    // A config template that fails rejects the task with the template's error.
    let mut w = Changes::new();
    w.create(templated_config("c1", "bad", "{{.Service.Nope.Deeper}}"));
    w.create(task("t2", "node-a", 2, &[], &[("c1", "bad")]));
    c.write(w).await;
    c.wait_state("t2", TaskState::Rejected).await;
    let st = c.status("t2");
    assert!(st.err.starts_with("config bad: its golang template did not render"), "{st:?}");
    a.stop().await;
}
