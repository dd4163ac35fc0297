//! Raft members talking over real gRPC on 127.0.0.1 (plain HTTP/2): a member bootstraps, two more join
//! through `RaftMembership.Join` (one via a follower, redirected to the leader), writes replicate, a
//! follower's write is forwarded to the leader, a snapshot larger than tonic's 4 MiB default message size
//! reaches a new member (streamed in chunks), and a member leaves.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use shoal_api::{Annotations, Service, ServiceSpec};
use shoal_raft::grpc::{self, PlainHttp};
use shoal_raft::{Proposer, RaftConfig, RaftNode, StartMode};
use shoal_store::{Changes, MemoryStore};
use tokio::sync::watch;

/// The tree's one wait helper (testkit's), included by path: testkit depends on this crate.
#[allow(unreachable_pub, reason = "testkit's public module, included here by path")]
#[path = "../../testkit/src/wait.rs"]
#[allow(dead_code)] // this test uses part of it
mod wait;

const DEADLINE: Duration = Duration::from_secs(30);

async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, f).await.unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// Polls `cond` (every 10 ms) until it holds, failing the test after `DEADLINE`.
async fn wait_for(what: &str, cond: impl FnMut() -> bool) {
    wait::wait_until_async(what, DEADLINE, Duration::from_millis(10), wait::holds(cond)).await
}

struct Served {
    node: RaftNode,
    store: Arc<MemoryStore>,
    addr: String,
    stop: watch::Sender<bool>,
    server: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Served {
    async fn shutdown(self) {
        self.node.shutdown().await;
        let _ = self.stop.send(true);
        let _ = self.server.await;
    }
}

fn serve(node: &RaftNode, listener: tokio::net::TcpListener) -> (watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    let s = grpc::services(node);
    let (stop, mut rx) = watch::channel(false);
    let server = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(s.raft)
            .add_service(s.membership)
            .add_service(s.proposals)
            .serve_with_incoming_shutdown(tokio_stream::wrappers::TcpListenerStream::new(listener), async move {
                let _ = rx.wait_for(|v| *v).await;
            })
            .await
            .expect("server");
    });
    (stop, server)
}

/// Starts a member: bootstraps when `join` is None, else joins through the manager at `join`.
async fn member(join: Option<&str>) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let mut cfg = RaftConfig::new(dir.path().to_path_buf(), 1);
    cfg.addr = addr.clone();
    cfg.tick_interval_ms = 20;
    let store = Arc::new(MemoryStore::default());
    let node = match join {
        None => within(
            "bootstrap",
            grpc::start_member(cfg, store.clone(), Arc::new(PlainHttp), StartMode::BootstrapIfEmpty),
        )
        .await
        .unwrap(),
        Some(j) => within("join", grpc::join_cluster(cfg, store.clone(), Arc::new(PlainHttp), j)).await.unwrap(),
    };
    let (stop, server) = serve(&node, listener);
    Served { node, store, addr, stop, server, _dir: dir }
}

fn service(id: &str, label_bytes: usize) -> Vec<shoal_store::Action> {
    let mut labels = std::collections::HashMap::new();
    if label_bytes > 0 {
        labels.insert("blob".to_string(), "x".repeat(label_bytes));
    }
    let mut c = Changes::new();
    c.create(Service {
        id: id.into(),
        spec: Some(ServiceSpec {
            annotations: Some(Annotations { name: format!("name-{id}"), labels, ..Default::default() }),
            ..Default::default()
        }),
        ..Default::default()
    });
    c.into_actions()
}

fn services_of(store: &MemoryStore) -> usize {
    store.view(|t| t.services().len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_join_replicate_forward_and_leave_over_grpc() {
    let a = member(None).await;
    wait_for("a leads", || a.node.status().is_leader).await;
    // 6 MiB of state: the snapshot a joining member receives is larger than one default gRPC message.
    for i in 0..6 {
        within("big write", a.node.propose(service(&format!("big{i}"), 1 << 20))).await.unwrap();
    }
    let b = member(Some(&a.addr)).await;
    // c asks b (a follower), which redirects it to the leader a.
    let c = member(Some(&b.addr)).await;
    let all = [&a, &b, &c];
    wait_for("everyone has the snapshot", || all.iter().all(|m| services_of(&m.store) == 6)).await;
    let members = a.node.members();
    assert_eq!(members.members.len(), 3);
    for m in all {
        assert_eq!(members.addr(m.node.id()), Some(m.addr.as_str()));
    }
    wait_for("all know the membership", || all.iter().all(|m| m.node.members() == members)).await;

    // A follower's write goes to the leader and is applied locally when it resolves.
    let commit = within("forwarded write", c.node.propose(service("from-c", 0))).await.unwrap();
    assert!(c.store.view(|t| t.services().get("from-c").is_some()));
    wait_for("replicated", || all.iter().all(|m| m.store.last_index() >= commit.index)).await;

    // b leaves; a and c keep writing.
    within("leave", b.node.clone().remove_member_via(&a.addr)).await;
    wait_for("b removed everywhere", || [&a, &c].iter().all(|m| !m.node.members().members.contains_key(&b.node.id())))
        .await;
    b.shutdown().await;
    let commit = within("write after leave", a.node.propose(service("after", 0))).await.unwrap();
    wait_for("replicated", || c.store.last_index() >= commit.index).await;
    c.shutdown().await;
    a.shutdown().await;
}

/// Calls `RaftMembership.Leave` on the manager at `addr` for this node, as a leaving manager would.
trait LeaveVia {
    fn remove_member_via(self, addr: &str) -> impl Future<Output = ()>;
}

impl LeaveVia for RaftNode {
    async fn remove_member_via(self, addr: &str) {
        // A manager that is no longer the leader (an election under load) names the leader: ask it instead, as
        // a leaving manager does.
        let mut addr = addr.to_string();
        for _ in 0..5 {
            let mut client = shoal_api::raft_membership_client::RaftMembershipClient::connect(format!("http://{addr}"))
                .await
                .unwrap();
            let me = shoal_api::RaftMember { raft_id: self.id(), ..Default::default() };
            match client.leave(shoal_api::LeaveRequest { node: Some(me) }).await {
                Ok(_) => return,
                Err(status) => {
                    let leader = status.metadata().get(grpc::LEADER_ADDR_METADATA).and_then(|v| v.to_str().ok());
                    match leader {
                        Some(leader) if leader != addr => addr = leader.to_string(),
                        _ => panic!("Leave at {addr}: {status:?}"),
                    }
                }
            }
        }
        panic!("Leave: more than 5 redirects");
    }
}
