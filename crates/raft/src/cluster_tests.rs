//! Multi-member tests of `RaftNode` over a simulated network: real raft-engine logs in temporary
//! directories, messages delivered in memory by `SimNet`, which can drop (seeded), cut links, isolate and
//! recover members. Each test names the section of the Raft paper (Ongaro & Ousterhout, "In Search of an
//! Understandable Consensus Algorithm", extended version) or of Ongaro's thesis it checks.
//! No fixed sleeps: every wait is on a condition under a deadline.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use raft::eraftpb::{Message, MessageType};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use shoal_api::{Annotations, Service, ServiceSpec, StoreSnapshot};
use shoal_store::{Changes, MemoryStore, StoreObject};

use crate::*;

/// The tree's one wait helper (testkit's), included by path: testkit depends on this crate.
#[allow(unreachable_pub, reason = "testkit's public module, included here by path")]
#[path = "../../testkit/src/wait.rs"]
#[allow(dead_code)] // this test uses part of it
mod wait;

const DEADLINE: Duration = Duration::from_secs(20);
/// Fast ticks for most tests: an election takes a few hundred milliseconds.
const TEST_TICK_MS: u64 = 20;

async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, f).await.unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// Polls `cond` (every 5 ms) until it holds, failing the test after `DEADLINE`.
async fn wait_for(what: &str, cond: impl FnMut() -> bool) {
    wait::wait_until_async(what, DEADLINE, Duration::from_millis(5), wait::holds(cond)).await
}

fn addr(id: u64) -> String {
    format!("sim-{id}")
}

/// The in-memory network: who is up, which links are cut, and a seeded message-drop rate.
struct SimNet {
    nodes: Mutex<HashMap<u64, RaftNode>>,
    links: Mutex<HashMap<u64, PeerLink>>,
    cut: Mutex<HashSet<(u64, u64)>>,
    /// Probability, in parts per million, that any message is dropped.
    drop_ppm: Mutex<u32>,
    rng: Mutex<SmallRng>,
}

impl SimNet {
    fn new(seed: u64) -> Arc<SimNet> {
        println!("simnet seed {seed}");
        Arc::new(SimNet {
            nodes: Mutex::default(),
            links: Mutex::default(),
            cut: Mutex::default(),
            drop_ppm: Mutex::new(0),
            rng: Mutex::new(SmallRng::seed_from_u64(seed)),
        })
    }

    /// Cuts every link between `id` and the others (both directions).
    fn isolate(&self, id: u64, others: &[u64]) {
        let mut cut = self.cut.lock();
        for o in others {
            cut.insert((id, *o));
            cut.insert((*o, id));
        }
    }

    /// Restores every link.
    fn recover(&self) {
        self.cut.lock().clear();
        *self.drop_ppm.lock() = 0;
    }

    fn deliver(&self, from: u64, m: Message) {
        let to = m.to;
        let is_snapshot = m.get_msg_type() == MessageType::MsgSnapshot;
        let dropped = self.cut.lock().contains(&(from, to)) || {
            let ppm = *self.drop_ppm.lock();
            ppm > 0 && self.rng.lock().random_range(0..1_000_000) < ppm
        };
        let target = if dropped { None } else { self.nodes.lock().get(&to).cloned() };
        let delivered = target.is_some_and(|n| n.step(m).is_ok());
        if let Some(link) = self.links.lock().get(&from) {
            if !delivered {
                link.report_unreachable(to);
            }
            if is_snapshot {
                link.report_snapshot(to, delivered);
            }
        }
    }
}

struct SimTransport {
    id: u64,
    net: Arc<SimNet>,
}

impl Transport for SimTransport {
    fn send(&self, msgs: Vec<Message>) {
        for m in msgs {
            self.net.deliver(self.id, m);
        }
    }

    fn attach(&self, link: PeerLink) {
        self.net.links.lock().insert(self.id, link);
    }

    /// A stopped member's address refuses connections; a cut link answers nothing.
    fn probe(&self, raft_id: u64) {
        let gone = !self.net.cut.lock().contains(&(self.id, raft_id)) && !self.net.nodes.lock().contains_key(&raft_id);
        if let (true, Some(link)) = (gone, self.net.links.lock().get(&self.id)) {
            link.report_gone(raft_id);
        }
    }
}

/// Forwards to the node whose simulated address is `leader_addr`, unless the link is cut.
struct SimForwarder {
    id: u64,
    net: Arc<SimNet>,
}

impl Forwarder for SimForwarder {
    fn forward(&self, leader_addr: &str, request: Vec<u8>) -> ForwardFuture {
        let to: u64 = leader_addr.trim_start_matches("sim-").parse().expect("sim address");
        let reachable = !self.net.cut.lock().contains(&(self.id, to));
        let target = self.net.nodes.lock().get(&to).cloned().filter(|_| reachable);
        let leader_addr = leader_addr.to_string();
        Box::pin(async move {
            match target {
                Some(n) => n.propose_forwarded(request).await,
                None => Err(ProposeError::NoLeader(format!("cannot reach the leader at {leader_addr}"))),
            }
        })
    }
}

struct Member {
    dir: tempfile::TempDir,
    node: Option<RaftNode>,
    store: Arc<MemoryStore>,
}

/// A cluster of members on one `SimNet`.
struct Cluster {
    net: Arc<SimNet>,
    members: HashMap<u64, Member>,
    tweak: fn(&mut RaftConfig),
}

fn fast(cfg: &mut RaftConfig) {
    cfg.tick_interval_ms = TEST_TICK_MS;
}

impl Cluster {
    /// Bootstraps member 1, then adds members 2..=n through `add_member_with_id` (each starts with
    /// `StartMode::Join` and catches up from the leader's snapshot).
    async fn start(n: u64, seed: u64, tweak: fn(&mut RaftConfig)) -> Cluster {
        let mut c = Cluster { net: SimNet::new(seed), members: HashMap::new(), tweak };
        c.launch(1, StartMode::BootstrapIfEmpty, tempfile::tempdir().unwrap()).await;
        c.wait_leader(&[1]).await;
        for id in 2..=n {
            c.add(id).await;
        }
        c
    }

    fn cfg(&self, id: u64, dir: &std::path::Path) -> RaftConfig {
        let mut cfg = RaftConfig::new(dir.to_path_buf(), id);
        cfg.addr = addr(id);
        (self.tweak)(&mut cfg);
        cfg
    }

    async fn launch(&mut self, id: u64, mode: StartMode, dir: tempfile::TempDir) {
        let store = Arc::new(MemoryStore::default());
        let transport = Arc::new(SimTransport { id, net: self.net.clone() });
        let forwarder = Arc::new(SimForwarder { id, net: self.net.clone() });
        let node = within(
            "start",
            RaftNode::start_with(self.cfg(id, dir.path()), store.clone(), transport, Some(forwarder), mode),
        )
        .await
        .expect("start");
        self.net.nodes.lock().insert(id, node.clone());
        self.members.insert(id, Member { dir, node: Some(node), store });
    }

    /// Adds member `id` through the current leader and starts it.
    async fn add(&mut self, id: u64) {
        let leader = self.leader_node();
        let (raft_id, members) = within("add member", leader.add_member_with_id(id, &addr(id), "")).await.expect("add");
        assert_eq!(raft_id, id);
        self.launch(id, StartMode::Join { members }, tempfile::tempdir().unwrap()).await;
    }

    fn node(&self, id: u64) -> &RaftNode {
        self.members[&id].node.as_ref().expect("running")
    }

    fn store(&self, id: u64) -> &Arc<MemoryStore> {
        &self.members[&id].store
    }

    fn running(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.members.iter().filter(|(_, m)| m.node.is_some()).map(|(id, _)| *id).collect();
        ids.sort_unstable();
        ids
    }

    /// The IDs among `ids` that currently say they lead.
    fn leaders(&self, ids: &[u64]) -> Vec<u64> {
        ids.iter().copied().filter(|id| self.node(*id).status().is_leader).collect()
    }

    /// Waits until exactly one of `ids` leads and all of them agree on it; returns it.
    async fn wait_leader(&self, ids: &[u64]) -> u64 {
        let mut found = 0;
        wait_for("one agreed leader", || {
            let leaders = self.leaders(ids);
            if leaders.len() != 1 {
                return false;
            }
            found = leaders[0];
            ids.iter().all(|id| self.node(*id).status().leader_id == found)
        })
        .await;
        found
    }

    fn leader_node(&self) -> RaftNode {
        let ids = self.running();
        let l = self.leaders(&ids);
        assert_eq!(l.len(), 1, "expected one leader among {ids:?}, found {l:?}");
        self.node(l[0]).clone()
    }

    /// Stops member `id` (its directory stays, for a restart).
    async fn stop(&mut self, id: u64) {
        self.net.nodes.lock().remove(&id);
        self.net.links.lock().remove(&id);
        let node = self.members.get_mut(&id).unwrap().node.take().expect("running");
        within("shutdown", node.shutdown()).await;
    }

    /// Restarts a stopped member on its directory, with an empty store recovered from disk.
    async fn restart(&mut self, id: u64) {
        let m = self.members.remove(&id).expect("known member");
        assert!(m.node.is_none());
        self.launch(id, StartMode::Restart, m.dir).await;
    }

    /// Waits until the stores of `ids` are identical and at least at `index`.
    async fn wait_converged(&self, ids: &[u64], index: u64) {
        wait_for("stores to converge", || {
            let first = sorted(self.store(ids[0]).snapshot());
            first.0 >= index && ids.iter().all(|id| sorted(self.store(*id).snapshot()) == first)
        })
        .await;
    }

    async fn shutdown(mut self) {
        for id in self.running() {
            self.stop(id).await;
        }
    }
}

fn sorted((index, mut s): (u64, StoreSnapshot)) -> (u64, StoreSnapshot) {
    s.services.sort_by(|a, b| a.id.cmp(&b.id));
    (index, s)
}

fn create(id: &str) -> Vec<shoal_store::Action> {
    let mut c = Changes::new();
    c.create(Service {
        id: id.into(),
        spec: Some(ServiceSpec {
            annotations: Some(Annotations { name: format!("name-{id}"), ..Default::default() }),
            ..Default::default()
        }),
        ..Default::default()
    });
    c.into_actions()
}

fn has_service(store: &MemoryStore, id: &str) -> bool {
    store.view(|t| t.services().get(id).is_some())
}

/// §5.2 (leader election) and §5.3 (log replication): three members agree on one leader, and a write
/// acknowledged by the leader is applied by every member at the same index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_elect_one_leader_and_replicate_writes() {
    let c = Cluster::start(3, 1, fast).await;
    let leader = c.wait_leader(&[1, 2, 3]).await;
    let members = c.node(leader).members();
    assert_eq!(members.members.keys().copied().collect::<Vec<_>>(), vec![1, 2, 3]);
    assert_eq!(members.addr(2), Some("sim-2"));
    for id in [2, 3] {
        assert_eq!(c.node(id).members(), members, "member {id} knows the same membership");
    }

    let commit = within("write", c.node(leader).propose(create("s1"))).await.unwrap();
    c.wait_converged(&[1, 2, 3], commit.index).await;
    for id in [1, 2, 3] {
        assert_eq!(c.store(id).view(|t| t.services().get("s1").map(|s| s.version())), Some(commit.index));
    }
    c.shutdown().await;
}

/// §5.2: when the leader stops, the others elect a new leader within a few election timeouts (default
/// timing: 100 ms ticks, election after 10-20 ticks, pre-vote on) and writes continue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_leader_is_replaced_within_about_a_second_and_writes_continue() {
    let mut c = Cluster::start(3, 2, |_| {}).await;
    let old = c.wait_leader(&[1, 2, 3]).await;
    within("write", c.node(old).propose(create("before"))).await.unwrap();

    let stopped_at = Instant::now();
    c.stop(old).await;
    let rest: Vec<u64> = c.running();
    let new = c.wait_leader(&rest).await;
    let took = stopped_at.elapsed();
    println!("new leader {new} elected {took:?} after the leader stopped");
    assert_ne!(new, old);
    assert!(took < Duration::from_secs(4), "election took {took:?}");

    let commit = within("write", c.node(new).propose(create("after"))).await.unwrap();
    c.wait_converged(&rest, commit.index).await;
    assert!(has_service(c.store(rest[0]), "before") && has_service(c.store(rest[1]), "after"));

    // §5.4.1 / §5.3: the old leader restarts as a follower and catches up.
    c.restart(old).await;
    c.wait_converged(&[1, 2, 3], commit.index).await;
    assert!(!c.node(old).status().is_leader || c.leaders(&[1, 2, 3]) == vec![old]);
    c.shutdown().await;
}

/// Thesis §6.2 (check-quorum) and §5.2: a leader cut off from the majority steps down within an election
/// timeout; writes on it fail promptly with a clear error (no hang); the majority elects a leader and keeps
/// writing; once the network heals, the old leader follows and gets the writes it missed (§5.3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_leader_steps_down_and_the_minority_refuses_writes() {
    let c = Cluster::start(3, 3, fast).await;
    let old = c.wait_leader(&[1, 2, 3]).await;
    let rest: Vec<u64> = [1, 2, 3].into_iter().filter(|id| *id != old).collect();
    c.net.isolate(old, &rest);

    let new = c.wait_leader(&rest).await;
    wait_for("the isolated leader to step down", || !c.node(old).status().is_leader).await;

    let started = Instant::now();
    let err = within("minority write", c.node(old).propose(create("lost"))).await.unwrap_err();
    println!("minority write refused after {:?}: {err}", started.elapsed());
    assert!(
        matches!(err, ProposeError::NoLeader(_) | ProposeError::NotLeader { .. } | ProposeError::Unknown(_)),
        "{err:?}"
    );
    assert!(!has_service(c.store(old), "lost"));

    let commit = within("majority write", c.node(new).propose(create("kept"))).await.unwrap();
    c.net.recover();
    c.wait_converged(&[1, 2, 3], commit.index).await;
    assert!(has_service(c.store(old), "kept"));
    assert!(!has_service(c.store(new), "lost"));
    assert_eq!(c.wait_leader(&[1, 2, 3]).await, new, "pre-vote: the rejoining member does not disrupt the leader");
    c.shutdown().await;
}

/// §7 (log compaction, InstallSnapshot): a member added after the log was compacted starts from the
/// leader's snapshot, which carries the membership, then follows the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_member_catches_up_by_snapshot_after_compaction() {
    fn small_snapshots(cfg: &mut RaftConfig) {
        cfg.tick_interval_ms = TEST_TICK_MS;
        cfg.snapshot_interval_entries = 20;
        cfg.log_entries_for_slow_followers = 5;
    }
    let mut c = Cluster::start(3, 4, small_snapshots).await;
    let leader = c.wait_leader(&[1, 2, 3]).await;
    let mut last = 0;
    for i in 0..100 {
        last = within("write", c.node(leader).propose(create(&format!("s{i}")))).await.unwrap().index;
    }
    assert!(c.node(leader).status().last_snapshot_index > 50, "{:?}", c.node(leader).status());

    c.add(4).await;
    c.wait_converged(&[1, 2, 3, 4], last).await;
    let st = c.node(4).status();
    assert!(st.last_snapshot_index > 50, "member 4 installed a snapshot: {st:?}");
    assert_eq!(c.node(4).members().members.len(), 4);
    let commit = within("write", c.node(leader).propose(create("after"))).await.unwrap();
    c.wait_converged(&[1, 2, 3, 4], commit.index).await;
    c.shutdown().await;
}

/// Thesis §3.10 (leadership transfer), as a demoted leader uses it: the leader hands over to the member it
/// names, which then leads; only the leader can transfer, and only to another voter. Removing a member is
/// known to keep a quorum only while the others are reachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_hands_its_leadership_to_a_named_member() {
    let mut c = Cluster::start(3, 5, fast).await;
    let leader = c.wait_leader(&[1, 2, 3]).await;
    let to = [1, 2, 3].into_iter().find(|id| *id != leader).unwrap();
    let third = [1, 2, 3].into_iter().find(|id| *id != leader && *id != to).unwrap();
    wait_for("the leader hears from both others", || c.node(leader).removal_keeps_quorum(leader)).await;
    assert!(c.node(leader).removal_keeps_quorum(third));
    assert!(!c.node(to).removal_keeps_quorum(third), "a follower cannot tell");
    let err = within("a follower's transfer", c.node(to).transfer_leadership(third)).await.unwrap_err();
    assert!(matches!(err, MembershipError::NotLeader { .. }), "{err:?}");
    let err = within("to itself", c.node(leader).transfer_leadership(leader)).await.unwrap_err();
    assert!(matches!(err, MembershipError::Refused(_)), "{err:?}");

    within("transfer", c.node(leader).transfer_leadership(to)).await.unwrap();
    wait_for("the named member leads", || c.node(to).status().is_leader && !c.node(leader).status().is_leader).await;
    let commit = within("write", c.node(to).propose(create("after-transfer"))).await.unwrap();
    c.wait_converged(&[1, 2, 3], commit.index).await;

    c.stop(third).await;
    wait_for("the new leader sees the third gone", || !c.node(to).removal_keeps_quorum(leader)).await;
    c.shutdown().await;
}

/// §6 (cluster membership changes, one server at a time): a removed member leaves the configuration on
/// every member, is recorded as removed, and the remaining two keep committing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_is_removed_and_the_rest_keep_committing() {
    let mut c = Cluster::start(3, 5, fast).await;
    let leader = c.wait_leader(&[1, 2, 3]).await;
    let victim = [1, 2, 3].into_iter().find(|id| *id != leader).unwrap();
    let err = within("self removal", c.node(leader).remove_member(leader)).await.unwrap_err();
    assert!(matches!(err, MembershipError::Refused(_)), "{err:?}");

    let members = within("remove", c.node(leader).remove_member(victim)).await.unwrap();
    assert!(!members.members.contains_key(&victim) && members.removed.contains(&victim));
    c.stop(victim).await;
    let rest = c.running();
    wait_for("everyone sees the removal", || rest.iter().all(|id| c.node(*id).members() == members)).await;

    let commit = within("write", c.node(leader).propose(create("two"))).await.unwrap();
    c.wait_converged(&rest, commit.index).await;
    // A removed ID cannot come back.
    let err = within("re-add", c.node(leader).add_member_with_id(victim, "sim-x", "")).await.unwrap_err();
    assert!(matches!(err, MembershipError::Refused(_)), "{err:?}");
    c.shutdown().await;
}

/// A member added but never started (the joining manager's Join answer was lost, and it joins again under
/// another ID) is not reachable, though raft-rs marks an added member recently active: a demotion must not
/// leave a quorum that needs it (found by the simulation with membership changes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_added_but_never_started_is_not_reachable() {
    let c = Cluster::start(2, 11, fast).await;
    let leader = c.wait_leader(&[1, 2]).await;
    let other = [1, 2].into_iter().find(|id| *id != leader).unwrap();
    within("add a member that never starts", c.node(leader).add_member_with_id(9, &addr(9), "")).await.expect("add");
    let l = c.node(leader);
    wait_for("the new member to be listed", || l.reachable_members().contains_key(&9)).await;
    assert_eq!(l.reachable_members().get(&9), Some(&false), "{:?}", l.reachable_members());
    assert!(!l.removal_keeps_quorum(other), "removing {other} would leave {leader} and the absent 9");
    c.shutdown().await;
}

/// A removed member is not heard: a message of a higher term from it moves no member's term (raft-rs would
/// follow it, or grant it a vote; found by the simulation with membership changes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_member_is_not_heard() {
    let mut c = Cluster::start(3, 13, fast).await;
    let leader = c.wait_leader(&[1, 2, 3]).await;
    let mut others = [1, 2, 3].into_iter().filter(|id| *id != leader);
    let (victim, f) = (others.next().unwrap(), others.next().unwrap());
    let members = within("remove", c.node(leader).remove_member(victim)).await.unwrap();
    c.stop(victim).await;
    wait_for("the follower applies the removal", || c.node(f).members() == members).await;
    let term = c.node(f).status().term;
    let mut m = Message::default();
    m.set_msg_type(MessageType::MsgHeartbeat);
    m.from = victim;
    m.to = f;
    m.term = term + 5;
    c.node(f).step(m).unwrap();
    let commit = within("write", c.node(leader).propose(create("after"))).await.unwrap();
    c.wait_converged(&[leader, f], commit.index).await;
    assert_eq!(c.node(f).status().term, term, "the removed member's term was taken");
    c.shutdown().await;
}

/// §5 (persistent state) and §7: every member stops, all restart from disk with the same membership and
/// data, elect a leader and continue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_cluster_restarts_from_disk() {
    let mut c = Cluster::start(3, 6, fast).await;
    let leader = c.wait_leader(&[1, 2, 3]).await;
    let mut last = 0;
    for i in 0..10 {
        last = within("write", c.node(leader).propose(create(&format!("s{i}")))).await.unwrap().index;
    }
    c.wait_converged(&[1, 2, 3], last).await;
    let before = sorted(c.store(1).snapshot()).1;
    let members = c.node(1).members();
    for id in [1, 2, 3] {
        c.stop(id).await;
    }
    for id in [1, 2, 3] {
        c.restart(id).await;
    }
    let leader = c.wait_leader(&[1, 2, 3]).await;
    for id in [1, 2, 3] {
        assert_eq!(c.node(id).members(), members);
        assert_eq!(sorted(c.store(id).snapshot()).1, before);
    }
    let commit = within("write", c.node(leader).propose(create("again"))).await.unwrap();
    c.wait_converged(&[1, 2, 3], commit.index).await;
    c.shutdown().await;
}

/// Follower writes: a write proposed on a follower goes to the leader and resolves once the follower's own
/// store has applied it (read-your-writes); without a reachable leader it fails promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_forwards_writes_and_reads_its_own_writes() {
    let c = Cluster::start(3, 7, fast).await;
    let leader = c.wait_leader(&[1, 2, 3]).await;
    let follower = [1, 2, 3].into_iter().find(|id| *id != leader).unwrap();
    let commit = within("forwarded write", c.node(follower).propose(create("fwd"))).await.unwrap();
    assert!(has_service(c.store(follower), "fwd"), "applied on the follower when the write resolves");
    assert_eq!(c.store(follower).view(|t| t.services().get("fwd").map(|s| s.version())), Some(commit.index));

    // A conflicting write forwarded from a follower reports the store's error.
    let err = within("duplicate", c.node(follower).propose(create("fwd"))).await.unwrap_err();
    assert!(matches!(err, ProposeError::Store(_)), "{err:?}");

    // Cut the follower off: its writes fail within a bounded time, never hang.
    c.net.isolate(follower, &[1, 2, 3]);
    let err = within("cut-off write", c.node(follower).propose(create("nope"))).await.unwrap_err();
    println!("cut-off follower write: {err}");
    c.shutdown().await;
}

/// §5.3 under message loss: with 20% of messages dropped (seeded), every acknowledged write is on every
/// member once the network heals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_survive_message_loss() {
    let seed = std::env::var("SIMNET_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(8);
    let c = Cluster::start(3, seed, fast).await;
    c.wait_leader(&[1, 2, 3]).await;
    *c.net.drop_ppm.lock() = 200_000;
    let mut acked = Vec::new();
    for i in 0..30 {
        let id = format!("s{i}");
        let node = (i % 3) + 1;
        if within("lossy write", c.node(node).propose(create(&id))).await.is_ok() {
            acked.push(id);
        }
    }
    c.net.recover();
    let leader = c.wait_leader(&[1, 2, 3]).await;
    let commit = within("write", c.node(leader).propose(create("final"))).await.unwrap();
    c.wait_converged(&[1, 2, 3], commit.index).await;
    println!("{} of 30 writes acknowledged under loss", acked.len());
    for id in &acked {
        assert!(has_service(c.store(1), id), "acknowledged write {id} is missing");
    }
    c.shutdown().await;
}

/// Recovery from a permanent loss of quorum (SwarmKit's --force-new-cluster; outside the paper): with two of
/// three members gone for good, the survivor restarts as the only voter with its data, elects itself and
/// takes writes; a new member can join it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_new_cluster_recovers_a_lost_quorum() {
    let mut c = Cluster::start(3, 9, fast).await;
    let leader = c.wait_leader(&[1, 2, 3]).await;
    let commit = within("write", c.node(leader).propose(create("kept"))).await.unwrap();
    c.wait_converged(&[1, 2, 3], commit.index).await;
    for id in [1, 2, 3] {
        c.stop(id).await;
    }

    let m = c.members.remove(&1).unwrap();
    c.launch(1, StartMode::ForceNewCluster, m.dir).await;
    c.wait_leader(&[1]).await;
    let members = c.node(1).members();
    assert_eq!(members.members.keys().copied().collect::<Vec<_>>(), vec![1]);
    assert!(members.removed.contains(&2) && members.removed.contains(&3));
    assert!(has_service(c.store(1), "kept"));
    within("write", c.node(1).propose(create("after"))).await.unwrap();

    c.add(4).await;
    let commit = within("write", c.node(1).propose(create("with-4"))).await.unwrap();
    c.wait_converged(&[1, 4], commit.index).await;
    assert!(has_service(c.store(4), "kept"));
    for id in [1, 4] {
        c.stop(id).await;
    }
}

/// Forcing a new cluster without state is refused with a clear error.
#[tokio::test]
async fn force_new_cluster_without_state_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let err = RaftNode::start_with(
        RaftConfig::new(dir.path().to_path_buf(), 1),
        Arc::new(MemoryStore::default()),
        Arc::new(NoPeers),
        None,
        StartMode::ForceNewCluster,
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("force-new-cluster needs an existing raft state"), "{err}");
}

/// §5.4 (safety) under a seeded schedule of partitions: members are isolated and healed at random while
/// writes go to random members; every write acknowledged anywhere is, once the network heals, applied
/// identically on every member (stores equal). Replay a failure with `SIMNET_SEED=<seed>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_random_partitions() {
    let seed = std::env::var("SIMNET_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let c = Cluster::start(3, seed, fast).await;
    c.wait_leader(&[1, 2, 3]).await;
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut acked = Vec::new();
    for round in 0..6 {
        c.net.recover();
        let victim = rng.random_range(1..=3u64);
        let others: Vec<u64> = [1, 2, 3].into_iter().filter(|id| *id != victim).collect();
        c.net.isolate(victim, &others);
        *c.net.drop_ppm.lock() = rng.random_range(0..100_000);
        // Liveness (§5.2): the majority side elects a leader, and writes through it are acknowledged; the
        // other writes go to random members, the cut-off one included.
        let majority_leader = c.wait_leader(&others).await;
        for i in 0..5 {
            let id = format!("r{round}-{i}");
            let node = if i % 2 == 0 { majority_leader } else { rng.random_range(1..=3u64) };
            // Bounded: a write on the cut-off member fails (or times out) instead of hanging.
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(15), c.node(node).propose(create(&id))).await {
                acked.push(id);
            }
        }
    }
    c.net.recover();
    let leader = c.wait_leader(&[1, 2, 3]).await;
    let commit = within("final write", c.node(leader).propose(create("final"))).await.unwrap();
    c.wait_converged(&[1, 2, 3], commit.index).await;
    println!("seed {seed}: {} of 30 writes acknowledged across partitions", acked.len());
    assert!(acked.len() >= 6, "only {} writes acknowledged in 6 rounds (seed {seed})", acked.len());
    for id in &acked {
        assert!(has_service(c.store(1), id), "acknowledged write {id} lost (seed {seed})");
    }
    c.shutdown().await;
}

/// §6: a member that lost its state rejoins at the same address: the unreachable old member is removed and
/// the new one added (one change at a time); a live member at that address is never displaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_member_rejoins_at_the_same_address() {
    let mut c = Cluster::start(3, 11, fast).await;
    let leader = c.wait_leader(&[1, 2, 3]).await;
    let victim = [1, 2, 3].into_iter().find(|id| *id != leader).unwrap();
    let err = within("live duplicate", c.node(leader).add_member_with_id(9, &addr(victim), "")).await.unwrap_err();
    assert!(matches!(err, MembershipError::Refused(_)), "{err:?}");

    let commit = within("write", c.node(leader).propose(create("before"))).await.unwrap();
    c.wait_converged(&[1, 2, 3], commit.index).await;
    c.stop(victim).await;
    c.members.remove(&victim); // its state is gone
    let l = c.node(leader).clone();
    wait_for("the victim to be unreachable", || l.reachable_members().get(&victim) == Some(&false)).await;

    // The wiped manager comes back at the same (simulated) address under a new Raft ID.
    let new_id = 20 + victim;
    let (_, members) =
        within("rejoin", c.node(leader).add_member_with_id(new_id, &addr(victim), "")).await.expect("rejoin");
    assert!(members.removed.contains(&victim) && members.members.contains_key(&new_id));
    assert_eq!(members.members.len(), 3);
    c.launch(new_id, StartMode::Join { members }, tempfile::tempdir().unwrap()).await;
    let rest = c.running();
    let commit = within("write", c.node(leader).propose(create("after"))).await.unwrap();
    c.wait_converged(&rest, commit.index).await;
    assert!(has_service(c.store(new_id), "before"));
    c.shutdown().await;
}

/// Thesis §6.4 (ReadIndex): a read barrier on a follower returns only once its store holds every write the
/// leader acknowledged before the barrier began; on a member cut off from the majority it fails within a bounded
/// time rather than letting a stale read through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_barrier_makes_a_follower_read_current_and_fails_without_a_quorum() {
    let c = Cluster::start(3, 11, fast).await;
    let leader = c.wait_leader(&[1, 2, 3]).await;
    let followers: Vec<u64> = [1, 2, 3].into_iter().filter(|id| *id != leader).collect();
    for i in 0..20 {
        let name = format!("s{i}");
        within("write", c.node(leader).propose(create(&name))).await.unwrap();
        let f = followers[i % 2];
        within("read barrier", c.node(f).read_barrier()).await.unwrap();
        assert!(has_service(c.store(f), &name), "follower {f} passed the barrier without write {name}");
    }
    within("read barrier on the leader", c.node(leader).read_barrier()).await.unwrap();

    let cut = followers[0];
    let others: Vec<u64> = [1, 2, 3].into_iter().filter(|id| *id != cut).collect();
    c.net.isolate(cut, &others);
    let started = Instant::now();
    let err = within("read barrier on an isolated member", c.node(cut).read_barrier()).await.unwrap_err();
    println!("read barrier on an isolated member failed after {:?}: {err}", started.elapsed());
    assert!(matches!(err, ProposeError::NoLeader(_)), "{err:?}");
    assert!(started.elapsed() <= READ_BARRIER_TIMEOUT + Duration::from_secs(1));
    c.net.recover();
    c.shutdown().await;
}

/// A message addressed to another Raft ID (one a member had before it lost its state and joined again at the
/// same address) is dropped: its commit index, beyond this member's log, would otherwise stop the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_for_another_member_id_is_dropped() {
    let c = Cluster::start(3, 12, fast).await;
    let leader = c.wait_leader(&[1, 2, 3]).await;
    let f = [1, 2, 3].into_iter().find(|id| *id != leader).unwrap();
    let mut m = Message::default();
    m.set_msg_type(MessageType::MsgHeartbeat);
    m.from = leader;
    m.to = 999;
    m.term = c.node(f).status().term;
    m.commit = 1_000_000;
    c.node(f).step(m).unwrap();
    let commit = within("write", c.node(leader).propose(create("after"))).await.unwrap();
    c.wait_converged(&[1, 2, 3], commit.index).await;
    assert!(has_service(c.store(f), "after"));
    c.shutdown().await;
}
