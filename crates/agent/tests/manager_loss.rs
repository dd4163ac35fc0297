//! The agent when it loses its manager, in process: dispatchers on 127.0.0.1:0 over `LocalProposer` stores
//! with `ManualClock`s (heartbeats expire only when a test advances the clock), reached through a TCP proxy
//! that a test can cut (every connection dropped, new ones refused) and restore.
//!
//! - A manager gone: the agent opens its next session with another manager from the list the dispatcher
//!   sent, which it also saved in its state dir; a new agent that knows only the dead manager finds the
//!   live one from that file.
//! - A worker cut off: its tasks keep running while it has no session; the manager marks it DOWN and the
//!   task is told to shut down (as the orchestrator does); when the connection comes back the node is READY
//!   again and the agent stops the replaced task.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use shoal_agent::testing::FakeExecutor;
use shoal_agent::{load_managers, MANAGERS_FILE};
use shoal_agent::{Agent, AgentConfig};
use shoal_api::{node_status, ManagerStatus, Node, Task, TaskState, TaskStatus};
use shoal_manager::{ClusterState, RandomIds};
use shoal_manager::{Dispatcher, DispatcherConfig};
use shoal_raft::LocalProposer;
use shoal_store::{Changes, ManualClock, MemoryStore};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A TCP proxy to one address; `cut(true)` drops every connection and refuses new ones until `cut(false)`.
struct Proxy {
    addr: SocketAddr,
    cut: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn to(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (cut, cut_rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else { return };
                if *cut_rx.borrow() {
                    continue; // dropped: the connection is reset
                }
                let mut cut_rx = cut_rx.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(target).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut_rx.wait_for(|c| *c) => {}
                    }
                });
            }
        });
        Proxy { addr, cut, task }
    }

    fn cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut.send_replace(true);
        self.task.abort();
    }
}

struct Manager {
    state: ClusterState,
    clock: Arc<ManualClock>,
    addr: SocketAddr,
    server: tokio::task::JoinHandle<()>,
    _stop: watch::Sender<bool>,
}

impl Drop for Manager {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// A manager whose dispatcher tells agents it is at `advertised` (when set) and knows `others` as managers.
async fn manager(listener: TcpListener, advertised: Option<SocketAddr>, others: &[SocketAddr]) -> Manager {
    let store = Arc::new(MemoryStore::default());
    let proposer = Arc::new(LocalProposer::new(store.clone()));
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let state = ClusterState::new(store, proposer, clock.clone(), Arc::new(RandomIds::seeded(11)));
    let addr = listener.local_addr().unwrap();
    let mut c = Changes::new();
    for (i, other) in others.iter().enumerate() {
        c.create(Node {
            id: format!("manager-{i}"),
            manager_status: Some(ManagerStatus {
                raft_id: 10 + i as u64,
                addr: other.to_string(),
                leader: false,
                reachability: 2,
            }),
            ..Default::default()
        });
    }
    if !others.is_empty() {
        state.propose(c).await.unwrap();
    }
    let config = DispatcherConfig {
        status_flush_ms: 5,
        heartbeat_period_ms_default: 100,
        manager_addr: advertised.unwrap_or(addr).to_string(),
        ..Default::default()
    };
    let dispatcher = Dispatcher::new(state.clone(), config);
    let server = dispatcher.serve_trusting_metadata_for_tests(listener);
    let (stop, stop_rx) = watch::channel(false);
    tokio::spawn(dispatcher.subsystem().run(state.clone(), stop_rx));
    Manager { state, clock, addr, server, _stop: stop }
}

impl Manager {
    fn node(&self, id: &str) -> Option<Node> {
        self.state.store.view(|t| t.nodes().get(id).map(|n| (**n).clone()))
    }

    fn node_state(&self, id: &str) -> Option<i32> {
        self.node(id).and_then(|n| n.status.map(|s| s.state))
    }

    fn task(&self, id: &str) -> Task {
        self.state.store.view(|t| (**t.tasks().get(id).unwrap()).clone())
    }

    async fn put(&self, task: Task) {
        let mut c = Changes::new();
        if self.state.store.view(|t| t.tasks().get(&task.id).is_some()) {
            c.update(task);
        } else {
            c.create(task);
        }
        self.state.propose(c).await.unwrap();
    }
}

struct RunningAgent {
    shutdown: watch::Sender<bool>,
    join: tokio::task::JoinHandle<()>,
}

impl RunningAgent {
    async fn stop(self) {
        self.shutdown.send_replace(true);
        tokio::time::timeout(Duration::from_secs(20), self.join).await.expect("agent did not stop").unwrap();
    }
}

fn start_agent(
    first: SocketAddr,
    hostname: &str,
    state_dir: &std::path::Path,
    more: Vec<String>,
    fake: &FakeExecutor,
) -> RunningAgent {
    let config = AgentConfig {
        node_id: "node-1".into(),
        manager_addr: format!("http://{first}"),
        hostname: hostname.into(),
        state_dir: state_dir.to_path_buf(),
        engine_labels: HashMap::new(),
        generic_resources: Vec::new(),
    };
    let (shutdown, rx) = watch::channel(false);
    let agent = Agent::new(config, Arc::new(fake.clone())).with_managers(more, Some(state_dir.join(MANAGERS_FILE)));
    RunningAgent { shutdown, join: tokio::spawn(agent.run(rx)) }
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

fn task(id: &str, node: &str, desired: TaskState) -> Task {
    Task {
        id: id.into(),
        service_id: "svc".into(),
        node_id: node.into(),
        desired_state: desired as i32,
        status: Some(TaskStatus { state: TaskState::Assigned as i32, ..Default::default() }),
        ..Default::default()
    }
}

const READY: Option<i32> = Some(node_status::State::Ready as i32);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_loses_its_manager_opens_its_session_with_another_one() {
    let b = manager(TcpListener::bind("127.0.0.1:0").await.unwrap(), None, &[]).await;
    // Manager A is reached through a proxy (the address it advertises), and knows B as a manager.
    let a_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a_proxy = Proxy::to(a_listener.local_addr().unwrap()).await;
    let a = manager(a_listener, Some(a_proxy.addr), &[b.addr]).await;
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeExecutor::new();

    let agent = start_agent(a_proxy.addr, "worker-1", dir.path(), Vec::new(), &fake);
    wait_for("the node ready on manager A", || a.node_state("node-1") == READY).await;
    let file = dir.path().join(MANAGERS_FILE);
    let mut both = vec![a_proxy.addr.to_string(), b.addr.to_string()];
    both.sort();
    wait_for("the manager list saved", || load_managers(&file).ok() == Some(both.clone())).await;
    assert!(b.node("node-1").is_none());

    // A is gone: the agent's next session is with B.
    a_proxy.cut(true);
    wait_for("the node ready on manager B", || b.node_state("node-1") == READY).await;
    // B lists only itself: that is the list now.
    wait_for("B's list saved", || load_managers(&file).ok() == Some(vec![b.addr.to_string()])).await;
    agent.stop().await;

    // A new agent that was given only A (still gone) finds B from the saved list.
    let saved = load_managers(&file).unwrap();
    let agent = start_agent(a_proxy.addr, "worker-1-restarted", dir.path(), saved, &fake);
    wait_for("the restarted agent's session on B", || {
        b.node("node-1").and_then(|n| n.description).is_some_and(|d| d.hostname == "worker-1-restarted")
    })
    .await;
    assert_eq!(b.node_state("node-1"), READY);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_agent_keeps_its_tasks_and_stops_the_replaced_ones_when_it_returns() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = Proxy::to(listener.local_addr().unwrap()).await;
    let m = manager(listener, Some(proxy.addr), &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeExecutor::new();
    let agent = start_agent(proxy.addr, "worker-1", dir.path(), Vec::new(), &fake);
    wait_for("node ready", || m.node_state("node-1") == READY).await;
    m.put(task("t1", "node-1", TaskState::Running)).await;
    wait_for("t1 running", || m.task("t1").status.unwrap().state == TaskState::Running as i32).await;

    // Cut off: no heartbeat arrives, so once the time to live passes (3 periods of 100 ms) the node is DOWN.
    proxy.cut(true);
    m.clock.advance_ms(1_000);
    wait_for("node down", || m.node_state("node-1") == Some(node_status::State::Down as i32)).await;
    // What the orchestrator does for a down node's task: shut it down, replace it elsewhere.
    let mut stale = m.task("t1");
    stale.desired_state = TaskState::Shutdown as i32;
    m.put(stale).await;
    m.put(task("t1-replacement", "node-2", TaskState::Running)).await;
    // The agent has no session, and its task still runs.
    assert_eq!(fake.running(), vec!["t1".to_string()]);
    assert!(!fake.calls("t1").contains(&"shutdown"), "{:?}", fake.calls("t1"));

    // Back: READY again, and the replaced task is stopped and reported SHUTDOWN.
    proxy.cut(false);
    wait_for("node ready again", || m.node_state("node-1") == READY).await;
    wait_for("t1 shut down", || m.task("t1").status.unwrap().state == TaskState::Shutdown as i32).await;
    assert!(fake.calls("t1").contains(&"shutdown"));
    assert!(fake.running().is_empty(), "{:?}", fake.running());
    agent.stop().await;
}
