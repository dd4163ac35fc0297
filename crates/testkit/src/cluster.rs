//! `TestCluster`: a whole cluster in one process for tests and benchmarks. One manager (the real store and
//! subsystems, over a `LocalProposer` or a real `RaftNode` on a temp dir; a `ManualClock` or the system
//! clock) serving the real dispatcher over gRPC on 127.0.0.1, and N agents with `FakeExecutor`s, each a
//! separate node. Later multi-manager tests grow from here.

use std::sync::Arc;
use std::time::Duration;

use shoal_agent::testing::FakeExecutor;
use shoal_agent::{Agent, AgentConfig};
use shoal_manager::DispatcherConfig;
use shoal_manager::{ClusterState, RandomIds};
use shoal_raft::{LocalProposer, Proposer, RaftConfig, RaftNode};
use shoal_store::{Clock, MemoryStore, SystemClock, Tables};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How to build a test cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Number of worker nodes (agents with fake executors).
    pub workers: usize,
    /// Use a real Raft node on a temp dir (fsync and all) instead of applying writes directly.
    pub raft: bool,
    /// Seed for IDs.
    pub seed: u64,
    /// Dispatcher settings.
    pub dispatcher: DispatcherConfig,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions { workers: 3, raft: false, seed: 1, dispatcher: DispatcherConfig::default() }
    }
}

/// One worker of a test cluster.
pub struct TestWorker {
    /// The node ID.
    pub node_id: String,
    /// The worker's executor: finish or inspect its tasks through it.
    pub executor: Arc<FakeExecutor>,
    stop: watch::Sender<bool>,
    handle: JoinHandle<()>,
}

/// A running in-process cluster. Call `shutdown` at the end; dropping it aborts everything.
pub struct TestCluster {
    /// The manager's state handles.
    pub state: ClusterState,
    /// The workers.
    pub workers: Vec<TestWorker>,
    raft: Option<RaftNode>,
    shutdown: watch::Sender<bool>,
    handles: Vec<(&'static str, JoinHandle<()>)>,
    manager_addr: std::net::SocketAddr,
    _dir: Option<tempfile::TempDir>,
}

impl TestCluster {
    /// Starts a manager and `opts.workers` agents, and waits until every worker's node is READY.
    pub async fn start(opts: ClusterOptions) -> TestCluster {
        let store = Arc::new(MemoryStore::default());
        let (proposer, raft, dir): (Arc<dyn Proposer>, Option<RaftNode>, Option<tempfile::TempDir>) = if opts.raft {
            let dir = tempfile::Builder::new().prefix("shoal-cluster-").tempdir().expect("tempdir");
            let node =
                RaftNode::start(RaftConfig::new(dir.path().to_path_buf(), 1), store.clone()).await.expect("raft");
            (Arc::new(node.clone()), Some(node), Some(dir))
        } else {
            (Arc::new(LocalProposer::new(store.clone())), None, None)
        };
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let state = ClusterState::new(store, proposer, clock, Arc::new(RandomIds::seeded(opts.seed)));
        let (shutdown, shutdown_rx) = watch::channel(false);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let manager_addr = listener.local_addr().expect("addr");
        let handles = shoal_node::start_manager_services(&state, opts.dispatcher.clone(), listener, shutdown_rx);
        let mut cluster = TestCluster { state, workers: Vec::new(), raft, shutdown, handles, manager_addr, _dir: dir };
        for _ in 0..opts.workers {
            cluster.add_worker().await;
        }
        let n = cluster.workers.len();
        // Sessions open one after another: allow 20 s, and 20 ms per worker beyond a thousand of them.
        let deadline = Duration::from_secs(20) + Duration::from_millis(20 * n.saturating_sub(1000) as u64);
        cluster
            .wait_for("every worker READY", deadline, |t| {
                let ready = t
                    .nodes()
                    .iter()
                    .filter(|n| n.status.as_ref().map(|s| s.state) == Some(shoal_api::node_status::State::Ready as i32))
                    .count();
                (ready >= n).then_some(())
            })
            .await;
        cluster
    }

    /// The manager's gRPC address (dispatcher), for clients other than the built-in workers (load
    /// generators).
    pub fn manager_addr(&self) -> std::net::SocketAddr {
        self.manager_addr
    }

    /// Adds a worker with a new node ID and a fresh fake executor.
    pub async fn add_worker(&mut self) -> &TestWorker {
        let node_id = shoal_store::IdSource::new_id(&*self.state.ids);
        let executor = Arc::new(FakeExecutor::new());
        let (stop, stop_rx) = watch::channel(false);
        let agent = Agent::new(
            AgentConfig {
                node_id: node_id.clone(),
                manager_addr: format!("http://{}", self.manager_addr),
                hostname: format!("worker-{}", self.workers.len() + 1),
                state_dir: crate::scratch_dir().join("testcluster-agent"),
                engine_labels: Default::default(),
                generic_resources: Vec::new(),
            },
            executor.clone(),
        );
        let handle = tokio::spawn(agent.run(stop_rx));
        self.workers.push(TestWorker { node_id, executor, stop, handle });
        self.workers.last().expect("just pushed")
    }

    /// Waits (reacting to commits, with a deadline) until `f` returns `Some` on a view of the store.
    /// Panics with `what` when the deadline passes.
    pub async fn wait_for<T>(&self, what: &str, deadline: Duration, f: impl Fn(&Tables) -> Option<T>) -> T {
        let fut = async {
            loop {
                let (found, mut watch) = self.state.store.view_and_watch(|t| f(t));
                if let Some(v) = found {
                    return v;
                }
                // Any commit (or a lag) is a reason to look again.
                let _ = watch.recv().await;
            }
        };
        match tokio::time::timeout(deadline, fut).await {
            Ok(v) => v,
            Err(_) => panic!("timed out after {deadline:?} waiting for {what}"),
        }
    }

    /// Stops the workers (their tasks), the manager's services, and Raft.
    pub async fn shutdown(self) {
        for w in self.workers {
            let _ = w.stop.send(true);
            let _ = tokio::time::timeout(Duration::from_secs(10), w.handle).await;
        }
        let _ = self.shutdown.send(true);
        for (_, h) in self.handles {
            let _ = tokio::time::timeout(Duration::from_secs(10), h).await;
        }
        if let Some(r) = self.raft {
            r.shutdown().await;
        }
    }
}
