//! An agent pointed at a manager that is not the Raft leader follows the leader's address that manager's
//! dispatcher names in its refusal, and opens its session on the leader. In process: two dispatchers on
//! 127.0.0.1:0, each over its own `LocalProposer` store (the follower's says it is not the leader).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use shoal_agent::testing::FakeExecutor;
use shoal_agent::{Agent, AgentConfig};
use shoal_api::{node_status, ManagerStatus, Node};
use shoal_manager::{ClusterState, RandomIds};
use shoal_manager::{Dispatcher, DispatcherConfig};
use shoal_raft::LocalProposer;
use shoal_store::{Changes, ManualClock, MemoryStore};
use tokio::sync::watch;

struct Manager {
    state: ClusterState,
    proposer: Arc<LocalProposer>,
    addr: std::net::SocketAddr,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Manager {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn manager() -> Manager {
    let store = Arc::new(MemoryStore::default());
    let proposer = Arc::new(LocalProposer::new(store.clone()));
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let state = ClusterState::new(store, proposer.clone(), clock, Arc::new(RandomIds::seeded(5)));
    let dispatcher = Dispatcher::new(state.clone(), DispatcherConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = dispatcher.serve_trusting_metadata_for_tests(listener);
    Manager { state, proposer, addr, server }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_sent_to_a_follower_opens_its_session_on_the_leader() {
    let leader = manager().await;
    let follower = manager().await;
    // The follower's store knows the leader (Raft ID 1, the LocalProposer's leader) and its address.
    let mut c = Changes::new();
    c.create(Node {
        id: "manager-1".into(),
        manager_status: Some(ManagerStatus {
            raft_id: 1,
            addr: leader.addr.to_string(),
            leader: true,
            reachability: 2,
        }),
        ..Default::default()
    });
    follower.state.propose(c).await.unwrap();
    follower.proposer.set_leader(false);

    let dir = tempfile::tempdir().unwrap();
    let config = AgentConfig {
        node_id: "node-1".into(),
        manager_addr: format!("http://{}", follower.addr),
        hostname: "worker-1".into(),
        state_dir: dir.path().to_path_buf(),
        engine_labels: HashMap::new(),
        generic_resources: Vec::new(),
    };
    let (shutdown, rx) = watch::channel(false);
    let join = tokio::spawn(Agent::new(config, Arc::new(FakeExecutor::new())).run(rx));

    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let ready = leader.state.store.view(|t| {
            t.nodes().get("node-1").and_then(|n| n.status.as_ref().map(|s| s.state))
                == Some(node_status::State::Ready as i32)
        });
        if ready {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the agent never reached the leader");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(follower.state.store.view(|t| t.nodes().get("node-1").is_none()), "nothing was written on the follower");
    shutdown.send_replace(true);
    tokio::time::timeout(Duration::from_secs(20), join).await.expect("agent stops").unwrap();
}
