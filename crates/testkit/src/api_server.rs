//! `ApiServer`: the Engine API alone, served on a temporary unix socket over a `ClusterState` with a
//! `LocalProposer` and a `ManualClock` (no orchestrator, scheduler or agent), on its own thread. For tests of
//! the API and of clients (the docker CLI, our CLI). Stopped and its socket removed on drop.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use shoal_engine_api::connections::ConnectionLimits;
use shoal_engine_api::{serve_unix_with, ApiContext};
use shoal_manager::{ClusterState, RandomIds};
use shoal_raft::LocalProposer;
use shoal_store::{ManualClock, MemoryStore};

/// A running API server.
pub struct ApiServer {
    socket: PathBuf,
    state: ClusterState,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl ApiServer {
    /// Serves the API for a node with this ID and hostname; object IDs come from `seed`. Returns once the
    /// socket accepts connections.
    pub fn start(node_id: &str, hostname: &str, seed: u64) -> ApiServer {
        ApiServer::start_with_limits(node_id, hostname, seed, ConnectionLimits::default())
    }

    /// `start`, with these connection limits.
    pub fn start_with_limits(node_id: &str, hostname: &str, seed: u64, limits: ConnectionLimits) -> ApiServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("control.sock");
        let store = Arc::new(MemoryStore::default());
        let proposer = Arc::new(LocalProposer::new(store.clone()));
        let state = ClusterState::new(
            store,
            proposer,
            Arc::new(ManualClock::new(1_700_000_000_000)),
            Arc::new(RandomIds::seeded(seed)),
        );
        let ctx = ApiContext {
            state: state.clone(),
            node_id: node_id.into(),
            node_addr: "127.0.0.1:4242".into(),
            executor: "process".into(),
            hostname: hostname.into(),
            leader_logs: None,
            lifecycle: Default::default(),
            events: shoal_engine_api::events::EventLog::new(shoal_manager::WatchService::new(
                state.clone(),
                None,
                None,
            )),
        };
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let sock = socket.clone();
        let thread = std::thread::spawn(move || {
            let rt =
                tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::UnixListener::bind(&sock).expect("bind control socket");
                ready_tx.send(()).expect("test waits");
                serve_unix_with(listener, ctx, limits, async move {
                    let _ = stop_rx.await;
                })
                .await
                .expect("serve");
            });
        });
        ready_rx.recv().expect("server thread started");
        ApiServer { socket, state, stop: Some(stop_tx), thread: Some(thread), _dir: dir }
    }

    /// The control socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The state behind the API (to seed nodes and tasks, or to check what a request wrote).
    pub fn state(&self) -> &ClusterState {
        &self.state
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
