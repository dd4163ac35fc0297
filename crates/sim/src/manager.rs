//! One simulated manager: raft-rs's `RawNode` over `SimStorage`, its store, a `Proposer` whose writes the
//! simulation appends to the log, the real leader-only subsystems (the list `shoal-node` runs: the
//! orchestrators, reaper, constraint enforcer, rebalancer, scheduler and the dispatcher's loop) polled on
//! the simulation's executor, and the real `Dispatcher` answering the agents' in-process RPCs.
//!
//! Raft is `shoal_raft::Core`, the code the daemon's driver runs, over the simulated disk (`SimStorage`):
//! its Ready handling, apply, snapshots, read barriers and publication are the daemon's own; this module
//! only feeds it (messages, ticks, the queued writes and reads, the simulation's time) and routes what it
//! sends. A crash drops everything but the disk (`SimStorage::crash`); a restart recovers the store from
//! the snapshot and the committed entries through `Core::open`, as the daemon's start does.
//!
//! Must not read the wall clock or spawn threads: time is the simulation's (`ManualClock`, `ManualTimer`).

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use raft::eraftpb::{ConfChange, ConfState, Entry, Message};
use raft::{RawNode, StateRole};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shoal_api::{AssignmentChange, SessionRequest, TaskStatus, UpdateTaskStatusRequest};
use shoal_manager::{AssignmentSet, Dispatcher, DispatcherConfig};
use shoal_manager::{ClusterState, RandomIds, Timer};
use shoal_raft::{
    Core, Done, LeaderState, LogStorage, Members, MembersDone, Outlets, Proposal, ProposeError, ProposeFuture,
    Proposer, RaftConfig, ReadBarrierFuture, ReadDone, FORWARD_APPLY_TIMEOUT, MAX_PROPOSALS_PER_READY, PROPOSAL_QUEUE,
};
use shoal_store::{encode_request, Action, ManualClock, MemoryStore, Watch};
use tokio::sync::{oneshot, watch};

use crate::disk::SimStorage;
use crate::exec::{poll_once, SimFuture};
use shoal_manager::ManualTimer;

/// Election timeout in ticks (randomized in `[n, 2n)`), heartbeat interval, as the daemon's defaults.
pub const ELECTION_TICK: usize = 10;
/// Leader heartbeat interval, in ticks.
pub const HEARTBEAT_TICK: usize = 1;

/// What the proposer queues for the simulation loop to hand to the core.
enum Queued {
    Write(Vec<Action>, Done),
    /// A follower's write for `leader`: `done` answers once this manager applies it, `sent` once the leader
    /// appended it (or refused).
    Forward {
        actions: Vec<Action>,
        leader: u64,
        done: Done,
        sent: oneshot::Sender<Result<(), ProposeError>>,
    },
    Read(ReadDone),
}

/// What travels between the simulated nodes.
#[derive(Debug, Clone)]
#[allow(missing_docs, reason = "each variant's doc names what its fields are")]
pub enum Msg {
    /// A Raft message between managers.
    Raft(Box<Message>),
    /// Agent -> manager: open a session (`attempt` numbers the agent's tries).
    OpenSession { attempt: u64 },
    /// Agent -> manager: a heartbeat.
    Heartbeat { session: String },
    /// Agent -> manager: task statuses (`batch` numbers the agent's reports).
    Status { session: String, batch: u64, updates: Vec<(String, TaskStatus)> },
    /// Manager -> agent: the session's ID, or why not (with the leader's Raft ID when known).
    SessionOpened { attempt: u64, result: Result<String, Option<u64>> },
    /// Manager -> agent: the heartbeat's answer.
    HeartbeatAnswer { session: String, ok: bool },
    /// Manager -> agent: a status report was written (or not).
    StatusAnswer { session: String, batch: u64, ok: bool },
    /// Agent -> manager: it unpublished these cluster volumes (`UpdateVolumeStatus`).
    VolumesUnpublished { session: String, ids: Vec<String> },
    /// Manager -> agent: that report was written (or not).
    VolumesAnswer { session: String, ids: Vec<String>, ok: bool },
    /// Manager -> agent: an assignments message of the session's stream.
    Assignments { session: String, complete: bool, changes: Vec<AssignmentChange> },
    /// Manager -> agent: the session's streams ended (this manager lost leadership, or the session expired).
    SessionEnded { session: String },
    /// Follower -> leader: a write the follower forwards (`RaftProposals.ForwardProposal`): its request ID
    /// and the encoded request.
    Forward { id: u64, data: Vec<u8> },
    /// Leader -> follower: the forwarded write was appended at this index, or why not.
    Forwarded { id: u64, result: Result<u64, ProposeError> },
}

/// The proposer the subsystems and the control API write and read through: queues writes and read
/// barriers for the simulation loop to hand to the core, which answers them.
#[derive(Debug)]
pub struct SimProposer {
    raft_id: u64,
    queue: Mutex<VecDeque<Queued>>,
    leader: watch::Receiver<LeaderState>,
    timer: Arc<ManualTimer>,
}

impl std::fmt::Debug for Queued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Queued::Write(..) => "write",
            Queued::Forward { .. } => "forwarded write",
            Queued::Read(_) => "read",
        })
    }
}

fn answered<T: Send + 'static>(
    r: Result<T, ProposeError>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, ProposeError>> + Send>> {
    Box::pin(std::future::ready(r))
}

impl SimProposer {
    /// Queues `q` for the simulation loop, unless `PROPOSAL_QUEUE` wait already (the driver's bound; beyond
    /// it writes fail here, where the daemon's proposers wait for room).
    fn push(&self, q: Queued) -> Result<(), ProposeError> {
        let mut queue = self.queue.lock();
        if queue.len() >= PROPOSAL_QUEUE {
            return Err(ProposeError::Unknown(format!("{PROPOSAL_QUEUE} writes already queued")));
        }
        queue.push_back(q);
        Ok(())
    }

    fn enqueue<T: Send + 'static>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, ProposeError>>) -> Queued,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, ProposeError>> + Send>> {
        let (tx, rx) = oneshot::channel();
        if let Err(e) = self.push(make(tx)) {
            return answered(Err(e));
        }
        // A dropped sender: the manager crashed.
        Box::pin(async move { rx.await.unwrap_or(Err(ProposeError::Stopped)) })
    }

    /// A follower's write, as `RaftNode::propose` makes it: forwarded to the leader, answered once this
    /// manager applied it (read-your-writes), `Unknown` after `FORWARD_APPLY_TIMEOUT` (the leader's answer
    /// or the entry may be lost).
    fn forward(&self, actions: Vec<Action>, leader: u64) -> ProposeFuture {
        let (sent, mut sent_rx) = oneshot::channel();
        let (done, mut done_rx) = oneshot::channel();
        if let Err(e) = self.push(Queued::Forward { actions, leader, done, sent }) {
            return answered(Err(e));
        }
        let mut timeout = self.timer.sleep_ms(u64::try_from(FORWARD_APPLY_TIMEOUT.as_millis()).unwrap_or(u64::MAX));
        let mut appended = false;
        Box::pin(std::future::poll_fn(move |cx| {
            use std::task::Poll;
            if !appended {
                match std::pin::Pin::new(&mut sent_rx).poll(cx) {
                    Poll::Ready(Ok(Ok(()))) => appended = true,
                    Poll::Ready(Ok(Err(e))) => return Poll::Ready(Err(e)),
                    Poll::Ready(Err(_)) => return Poll::Ready(Err(ProposeError::Stopped)),
                    Poll::Pending => {}
                }
            }
            if appended {
                if let Poll::Ready(r) = std::pin::Pin::new(&mut done_rx).poll(cx) {
                    return Poll::Ready(r.unwrap_or(Err(ProposeError::Stopped)));
                }
            }
            match timeout.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(ProposeError::Unknown(format!(
                    "the write was forwarded to the leader but this manager did not apply it within \
                     {FORWARD_APPLY_TIMEOUT:?}"
                )))),
                Poll::Pending => Poll::Pending,
            }
        }))
    }
}

impl Proposer for SimProposer {
    fn propose(&self, actions: Vec<Action>) -> ProposeFuture {
        let st = *self.leader.borrow();
        if st.is_leader {
            return self.enqueue(|done| Queued::Write(actions, done));
        }
        match st.leader_id {
            0 => answered(Err(ProposeError::NoLeader("no manager is the raft leader right now".into()))),
            me if me == self.raft_id => {
                answered(Err(ProposeError::NoLeader("this manager was just elected and is catching up".into())))
            }
            leader => self.forward(actions, leader),
        }
    }

    fn leadership(&self) -> watch::Receiver<LeaderState> {
        self.leader.clone()
    }

    /// Raft's ReadIndex through the core, as the daemon's.
    fn read_barrier(&self) -> ReadBarrierFuture {
        self.enqueue(Queued::Read)
    }
}

/// The leader-only loops of one term.
struct LeaderLoops {
    term: u64,
    _stop: watch::Sender<bool>,
    loops: Vec<(&'static str, SimFuture<()>)>,
}

/// One agent's assignment stream on this manager.
struct Stream {
    session: String,
    set: AssignmentSet,
    watch: Watch,
    node_id: String,
}

/// A pending in-process RPC: resolves to the reply for an agent.
type Rpc = SimFuture<Option<(usize, Msg)>>;

/// Entries applied since a start: index -> (term, digest of the data), for the safety checks.
pub type AppliedLog = Arc<Mutex<BTreeMap<u64, (u64, u64)>>>;

/// A manager that is up.
pub struct Running {
    core: Core<SimStorage>,
    /// The replicated state as this manager applied it.
    pub store: Arc<MemoryStore>,
    proposer: Arc<SimProposer>,
    /// What the control API and the subsystems use.
    pub state: ClusterState,
    dispatcher: Arc<Dispatcher>,
    next_request: u64,
    /// Seeds the leader-only loops' RNGs (the key manager's).
    rng: StdRng,
    leader: Option<LeaderLoops>,
    rpcs: Vec<Rpc>,
    streams: BTreeMap<usize, Stream>,
    /// Writes this follower forwarded, by request ID, waiting for the leader's answer.
    forwards: BTreeMap<u64, oneshot::Sender<Result<(), ProposeError>>>,
    /// Entries applied since the start (the core's apply observer fills it).
    pub applied_log: AppliedLog,
    /// When this manager last answered a heartbeat of each node OK (simulation time, ms).
    pub last_beat_ok_ms: BTreeMap<String, u64>,
    csi: crate::csi::SimCsi,
}

/// Settings of the simulated managers.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    /// Raft IDs of all members.
    pub voters: Vec<u64>,
    /// Snapshot every this many applied entries (small, so snapshots and their installs happen).
    pub snapshot_interval_entries: u64,
    /// Entries kept behind a snapshot.
    pub log_entries_for_slow_followers: u64,
    /// The dispatcher's settings.
    pub dispatcher: DispatcherConfig,
    /// The CSI plugin every manager's volume manager calls (one storage system).
    pub csi: crate::csi::SimCsi,
}

impl ManagerConfig {
    /// Member `id`'s Raft settings: the daemon's defaults (`RaftConfig::new`) with the simulation's tick
    /// (one step), election and snapshot settings.
    fn raft(&self, id: u64) -> RaftConfig {
        RaftConfig {
            tick_interval_ms: crate::STEP_MS,
            election_tick: ELECTION_TICK,
            heartbeat_tick: HEARTBEAT_TICK,
            snapshot_interval_entries: self.snapshot_interval_entries,
            log_entries_for_slow_followers: self.log_entries_for_slow_followers,
            ..RaftConfig::new(PathBuf::from(format!("<simulated manager {id}>")), id)
        }
    }
}

/// One manager, up or crashed.
pub struct Manager {
    /// Raft ID.
    pub id: u64,
    /// This manager's wall clock (jumps are faults).
    pub clock: Arc<ManualClock>,
    /// Present while up.
    pub run: Option<Running>,
    /// The disk while crashed.
    disk: SimStorage,
    seed: u64,
    starts: u64,
    /// Removed from Raft and stopped for good (a demoted manager runs as a worker from then on).
    pub retired: bool,
}

/// A 64-bit digest of bytes (FNV-1a), for comparing entries.
pub fn digest(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The core's apply observer: records each applied entry, and fails the run if an index is applied twice
/// with different entries (across a restart's replay too).
fn observe_applied(id: u64, log: AppliedLog) -> shoal_raft::ApplyObserver {
    Box::new(move |e: &Entry| {
        let entry = (e.term, digest(&e.data));
        let mut log = log.lock();
        if let Some(before) = log.get(&e.index) {
            assert_eq!(*before, entry, "manager {id} applied index {} twice, differently", e.index);
        }
        log.insert(e.index, entry);
    })
}

impl Manager {
    /// A manager with an empty disk, not started.
    pub fn new(id: u64, cfg: &ManagerConfig, clock: Arc<ManualClock>, seed: u64) -> Manager {
        Manager {
            id,
            clock,
            run: None,
            disk: SimStorage::with_voters(cfg.voters.clone()),
            seed,
            starts: 0,
            retired: false,
        }
    }

    /// A manager the leader just added (`StartMode::Join`): no configuration yet, the members as the leader
    /// answered; it waits for the leader's snapshot.
    pub fn joining(id: u64, members: Members, clock: Arc<ManualClock>, seed: u64) -> Manager {
        Manager { id, clock, run: None, disk: SimStorage::joining(members), seed, starts: 0, retired: false }
    }

    /// Whether it may run: started once (a member, or one being removed) and not retired.
    pub fn may_run(&self) -> bool {
        self.starts > 0 && !self.retired
    }

    /// Stops for good: removed from Raft, it runs as a worker from now on.
    pub fn retire(&mut self) {
        self.crash(false);
        self.retired = true;
    }

    /// The configuration on its disk (up or crashed).
    pub fn conf_state(&self) -> ConfState {
        match &self.run {
            Some(run) => run.conf_state(),
            None => self.disk.conf_state().clone(),
        }
    }

    /// The term of entry `index` in its log or snapshot (up or crashed): what survives on its disk.
    pub fn durable_term(&self, index: u64) -> Option<u64> {
        let disk = match &self.run {
            Some(run) => run.core.storage(),
            None => &self.disk,
        };
        disk.durable_term(index)
    }

    /// Starts (or restarts) from the disk: the core recovers the store and builds the raft node.
    pub fn start(&mut self, cfg: &ManagerConfig, timer: &Arc<ManualTimer>) {
        assert!(self.run.is_none(), "manager {} is already up", self.id);
        self.starts += 1;
        let storage = std::mem::take(&mut self.disk);
        let store = Arc::new(MemoryStore::new(shoal_store::DEFAULT_WATCH_QUEUE_COMMITS));
        let applied_log = AppliedLog::default();
        let outlets = Outlets::new(self.id);
        let leader = outlets.leader.subscribe();
        let seed = self.seed.wrapping_add(self.starts);
        let observer = Some(observe_applied(self.id, applied_log.clone()));
        let core = Core::open(cfg.raft(self.id), storage, store.clone(), outlets, seed, observer)
            .expect("the simulated disk recovers");
        let proposer = Arc::new(SimProposer {
            raft_id: self.id,
            queue: Mutex::new(VecDeque::new()),
            leader,
            timer: timer.clone(),
        });
        let ids = Arc::new(RandomIds::seeded(self.seed ^ self.starts.wrapping_mul(0x9e37_79b9_7f4a_7c15)));
        let state =
            ClusterState::new(store.clone(), proposer.clone(), self.clock.clone(), ids).with_timer(timer.clone());
        let dispatcher = Dispatcher::new(state.clone(), cfg.dispatcher.clone());
        let rng = StdRng::seed_from_u64(seed);
        self.run = Some(Running {
            core,
            store,
            proposer,
            state,
            dispatcher,
            next_request: self.starts << 40,
            rng,
            leader: None,
            rpcs: Vec::new(),
            streams: BTreeMap::new(),
            forwards: BTreeMap::new(),
            applied_log,
            last_beat_ok_ms: BTreeMap::new(),
            csi: cfg.csi.clone(),
        });
    }

    /// Crashes: everything but the disk is gone; unsynced writes too when `lose_unsynced`.
    pub fn crash(&mut self, lose_unsynced: bool) {
        if let Some(mut run) = self.run.take() {
            run.core.stop(&ProposeError::Stopped);
            // Queued writes and reads are answered `Stopped` as their senders drop.
            run.proposer.queue.lock().clear();
            self.disk = run.core.storage().crash(lose_unsynced);
        }
    }

    /// True while up.
    pub fn is_up(&self) -> bool {
        self.run.is_some()
    }
}

/// What a step of a running manager sends.
pub type Outbox = Vec<(crate::net::Endpoint, Msg)>;

impl Running {
    fn raw(&self) -> &RawNode<SimStorage> {
        self.core.raw()
    }

    /// Raft's view: role, term, leader.
    pub fn raft_state(&self) -> (StateRole, u64, u64) {
        let r = &self.raw().raft;
        (r.state, r.term, r.leader_id)
    }

    /// The leadership the subsystems see.
    pub fn leader_state(&self) -> LeaderState {
        *self.proposer.leader.borrow()
    }

    /// Commit index.
    pub fn commit(&self) -> u64 {
        self.raw().raft.raft_log.committed
    }

    /// Last index applied to the store.
    pub fn applied(&self) -> u64 {
        self.core.applied()
    }

    /// Raft's state, for failure messages.
    pub fn debug_raft(&self) -> String {
        let r = &self.raw().raft;
        format!(
            "role {:?} term {} leader {} commit {} last {} first {} snapshot {} pending {} queued {} leading since \
             term {:?}",
            r.state,
            r.term,
            r.leader_id,
            r.raft_log.committed,
            r.raft_log.last_index(),
            r.raft_log.first_index(),
            self.core.last_snapshot_index(),
            self.core.pending_len(),
            self.proposer.queue.lock().len(),
            self.leader.as_ref().map(|l| l.term)
        )
    }

    /// The leader's progress of `peer`, for failure messages.
    pub fn debug_progress(&self, peer: u64) -> String {
        let raft = &self.raw().raft;
        match raft.prs().get(peer) {
            Some(p) => {
                format!("{p:?} (leader first {} last {})", raft.raft_log.first_index(), raft.raft_log.last_index())
            }
            None => "no progress".into(),
        }
    }

    /// The configuration as applied (persisted with the members).
    pub fn conf_state(&self) -> ConfState {
        self.core.storage().conf_state().clone()
    }

    /// The members as applied.
    pub fn members(&self) -> Members {
        self.core.storage().members().clone()
    }

    /// On a leader: which members were heard from recently (the daemon's `RaftNode::reachable_members`).
    pub fn reachable(&self) -> BTreeMap<u64, bool> {
        self.core.outlets().reachable.lock().clone()
    }

    /// Proposes a membership change through the core, as the daemon's driver does (`Command::ConfChange`);
    /// returns the index it was appended at (none if refused at once).
    pub fn propose_conf_change(&mut self, cc: ConfChange, done: MembersDone) -> Option<u64> {
        let before = self.raw().raft.raft_log.last_index();
        self.core.propose_conf_change(cc, done);
        let after = self.raw().raft.raft_log.last_index();
        (after > before).then_some(after)
    }

    /// Hands leadership to `to` (a demoted leader does, `Core::transfer_leader`).
    pub fn transfer_leader(&mut self, to: u64) -> bool {
        self.core.transfer_leader(to).is_ok()
    }

    /// Syncs done by the disk.
    pub fn syncs(&self) -> u64 {
        self.core.storage().syncs
    }

    /// Steps a Raft message from a peer (screened by the core as the daemon's).
    pub fn step_raft(&mut self, m: Message) {
        self.core.step_message(m);
    }

    /// What the transport says of a snapshot sent to `peer` (the driver's `Inbound::SnapshotStatus`):
    /// a failed one also makes the peer unreachable, so the leader probes it again.
    pub fn report_snapshot(&mut self, peer: u64, delivered: bool) {
        if !delivered {
            self.core.report_unreachable(peer);
        }
        self.core.report_snapshot(peer, delivered);
    }

    /// One tick of Raft's logical clock.
    pub fn tick(&mut self) {
        self.core.tick();
    }

    /// The leader the daemon's transport would probe after this tick (`Core::silent_leader`).
    pub fn silent_leader(&self) -> Option<u64> {
        self.core.silent_leader()
    }

    /// What the daemon's transport reports when the probed peer's address refuses connections.
    pub fn peer_gone(&mut self, peer: u64) {
        self.core.peer_gone(peer);
    }

    /// Hands the queued writes and read barriers to the core (at most the driver's `MAX_PROPOSALS_PER_READY`), as the
    /// driver hands its commands; `now_ms` is the simulation's time. Returns the writes forwarded to the
    /// leader.
    pub fn take_proposals(&mut self, now_ms: u64) -> Outbox {
        let mut out = Vec::new();
        // Forwards whose caller gave up (its timeout) are forgotten.
        self.forwards.retain(|_, sent| !sent.is_closed());
        for _ in 0..MAX_PROPOSALS_PER_READY {
            let Some(queued) = self.proposer.queue.lock().pop_front() else { break };
            match queued {
                Queued::Write(actions, done) => {
                    let id = self.next_request_id();
                    self.core.propose(Proposal { id, data: encode_request(id, &actions), done, appended: None });
                }
                Queued::Forward { actions, leader, done, sent } => {
                    // Registered before the request leaves, as the driver's `AwaitForwarded`.
                    let id = self.next_request_id();
                    self.core.await_forwarded(id, done);
                    self.forwards.insert(id, sent);
                    let data = encode_request(id, &actions);
                    out.push((crate::net::Endpoint::Manager(leader), Msg::Forward { id, data }));
                }
                Queued::Read(done) => self.core.read_index(Duration::from_millis(now_ms), done),
            }
        }
        out
    }

    fn next_request_id(&mut self) -> u64 {
        self.next_request += 1;
        self.next_request
    }

    /// The leader's side of `ForwardProposal` (`RaftNode::propose_forwarded`): appends a follower's write
    /// and answers with its index once appended, or why not.
    pub fn receive_forward(&mut self, from: u64, id: u64, data: Vec<u8>) -> Outbox {
        let result = if self.leader_state().is_leader {
            let (appended, mut appended_rx) = oneshot::channel();
            let (done, mut done_rx) = oneshot::channel();
            self.core.propose(Proposal { id, data, done, appended: Some(appended) });
            match appended_rx.try_recv() {
                Ok(index) => Ok(index),
                Err(_) => match done_rx.try_recv() {
                    Ok(Err(e)) => Err(e),
                    _ => Err(ProposeError::Stopped),
                },
            }
        } else {
            let leader = self.raw().raft.leader_id;
            Err(ProposeError::NotLeader { leader: (leader != 0).then_some(leader) })
        };
        vec![(crate::net::Endpoint::Manager(from), Msg::Forwarded { id, result })]
    }

    /// The leader's answer to a forwarded write.
    pub fn receive_forwarded(&mut self, id: u64, result: Result<u64, ProposeError>) {
        if let Some(sent) = self.forwards.remove(&id) {
            let _ = sent.send(result.map(|_| ()));
        }
    }

    /// Hands every pending Ready to the core (`Core::handle_ready`); returns the Raft messages to send.
    pub fn raft_ready(&mut self, now_ms: u64) -> Vec<Message> {
        let mut out = Vec::new();
        self.core
            .handle_ready(Duration::from_millis(now_ms), &mut |msgs| out.extend(msgs))
            .expect("the simulated disk never fails");
        out
    }

    /// Starts the leader-only loops on gaining leadership, drops them on losing it (as
    /// `run_while_leader`), and polls them.
    pub fn run_leader_loops(&mut self) {
        let st = self.leader_state();
        let keep = st.is_leader && self.leader.as_ref().is_some_and(|l| l.term == st.term);
        if !keep {
            self.leader = None;
            if st.is_leader {
                let (stop, stop_rx) = watch::channel(false);
                // The daemon's own list (`shoal_manager::leader_subsystems`), the key manager's RNG seeded from
                // this run's.
                let key_rng = Box::new(StdRng::seed_from_u64(self.rng.random()));
                let cfg =
                    shoal_manager::LeaderConfig { volume_plugins: Arc::new(self.csi.clone()), ..Default::default() };
                let list = shoal_manager::leader_subsystems(&self.dispatcher, key_rng, &cfg);
                let loops = list.iter().map(|s| (s.name(), s.run(self.state.clone(), stop_rx.clone()))).collect();
                self.leader = Some(LeaderLoops { term: st.term, _stop: stop, loops });
            }
        }
        if let Some(l) = &mut self.leader {
            for (name, fut) in &mut l.loops {
                assert!(poll_once(fut).is_none(), "leader-only subsystem {name} returned while leading");
            }
        }
    }

    /// The names of the leader-only loops running now (empty while not leading).
    pub fn leader_loop_names(&self) -> Vec<&'static str> {
        self.leader.as_ref().map(|l| l.loops.iter().map(|(n, _)| *n).collect()).unwrap_or_default()
    }

    /// Takes an agent's request (`agent` is its index, `node_id` its node).
    pub fn receive_from_agent(&mut self, now_ms: u64, agent: usize, node_id: &str, msg: Msg) -> Outbox {
        let me = crate::net::Endpoint::Agent(agent);
        let mut out = Vec::new();
        match msg {
            Msg::OpenSession { attempt } => {
                let d = self.dispatcher.clone();
                let node = node_id.to_string();
                let leader = self.raw().raft.leader_id;
                self.rpcs.push(Box::pin(async move {
                    // The node reports the overlay driver, so tasks on the workload's network can run there.
                    let description = shoal_api::NodeDescription {
                        hostname: node.clone(),
                        engine: Some(shoal_api::EngineDescription {
                            plugins: vec![shoal_api::PluginDescription {
                                r#type: "Network".into(),
                                name: "overlay".into(),
                            }],
                            ..Default::default()
                        }),
                        // It runs the workload's CSI plugin.
                        csi_info: vec![shoal_api::NodeCsiInfo {
                            plugin_name: crate::csi::PLUGIN.into(),
                            node_id: crate::csi::SimCsi::node_id(&node),
                            ..Default::default()
                        }],
                        ..Default::default()
                    };
                    let req = SessionRequest { description: Some(description), session_id: String::new() };
                    let result =
                        d.open_session_in_process(&node, &req).await.map_err(|_| (leader != 0).then_some(leader));
                    Some((agent, Msg::SessionOpened { attempt, result }))
                }));
            }
            Msg::Heartbeat { session } => {
                let ok = self.dispatcher.heartbeat_in_process(node_id, &session).is_ok();
                if ok {
                    self.last_beat_ok_ms.insert(node_id.to_string(), now_ms);
                }
                out.push((me, Msg::HeartbeatAnswer { session, ok }));
            }
            Msg::Status { session, batch, updates } => {
                let d = self.dispatcher.clone();
                let node = node_id.to_string();
                self.rpcs.push(Box::pin(async move {
                    let req = UpdateTaskStatusRequest {
                        session_id: session.clone(),
                        updates: updates
                            .into_iter()
                            .map(|(task_id, status)| shoal_api::update_task_status_request::TaskStatusUpdate {
                                task_id,
                                status: Some(status),
                            })
                            .collect(),
                    };
                    let ok = d.update_task_status_in_process(&node, req).await.is_ok();
                    Some((agent, Msg::StatusAnswer { session, batch, ok }))
                }));
            }
            Msg::VolumesUnpublished { session, ids } => {
                let d = self.dispatcher.clone();
                let node = node_id.to_string();
                self.rpcs.push(Box::pin(async move {
                    let req = shoal_api::UpdateVolumeStatusRequest {
                        session_id: session.clone(),
                        updates: ids
                            .iter()
                            .map(|id| shoal_api::update_volume_status_request::VolumeStatusUpdate {
                                id: id.clone(),
                                unpublished: true,
                            })
                            .collect(),
                    };
                    let ok = d.update_volume_status_in_process(&node, req).await.is_ok();
                    Some((agent, Msg::VolumesAnswer { session, ids, ok }))
                }));
            }
            _ => {}
        }
        out
    }

    /// Polls the RPCs in flight and the assignment streams; returns the messages for agents.
    pub fn serve_agents(&mut self, node_ids: &[String]) -> Outbox {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.rpcs.len() {
            match poll_once(&mut self.rpcs[i]) {
                Some(reply) => {
                    let rpc = self.rpcs.remove(i);
                    drop(rpc);
                    if let Some((agent, msg)) = reply {
                        let opened = match &msg {
                            Msg::SessionOpened { result: Ok(session), .. } => Some(session.clone()),
                            _ => None,
                        };
                        out.push((crate::net::Endpoint::Agent(agent), msg));
                        // The stream's COMPLETE set follows the session's first message.
                        if let Some(session) = opened {
                            self.open_stream(agent, &node_ids[agent], session, &mut out);
                        }
                    }
                }
                None => i += 1,
            }
        }
        let leading = self.leader_state().is_leader;
        let agents: Vec<usize> = self.streams.keys().copied().collect();
        for agent in agents {
            let s = self.streams.get_mut(&agent).expect("listed");
            let to = crate::net::Endpoint::Agent(agent);
            if !leading || !self.dispatcher.session_is_current(&s.node_id, &s.session) {
                out.push((to, Msg::SessionEnded { session: s.session.clone() }));
                self.streams.remove(&agent);
                continue;
            }
            let mut changes = Vec::new();
            let store = self.store.clone();
            let mut lookup = |d: &shoal_manager::Dependency| store.view(|t| d.lookup(t));
            let mut lagged = false;
            loop {
                match s.watch.try_recv() {
                    Ok(commit) => {
                        for c in &commit.changes {
                            s.set.on_change(c, &mut changes, &mut lookup);
                        }
                    }
                    Err(tokio::sync::broadcast::error::TryRecvError::Lagged(_)) => lagged = true,
                    Err(_) => break,
                }
            }
            if lagged {
                let (complete, w) = self.store.view_and_watch(|t| s.set.complete(t));
                s.watch = w;
                let changes = complete.expect("the simulation's sets are far below the bound");
                out.push((to, Msg::Assignments { session: s.session.clone(), complete: true, changes }));
            } else if !changes.is_empty() {
                out.push((to, Msg::Assignments { session: s.session.clone(), complete: false, changes }));
            }
        }
        out
    }

    /// Opens the assignment stream of a new session: the COMPLETE set first.
    fn open_stream(&mut self, agent: usize, node_id: &str, session: String, out: &mut Outbox) {
        let mut set = AssignmentSet::new(node_id);
        let (complete, watch) = self.store.view_and_watch(|t| set.complete(t));
        let changes = complete.expect("the simulation's sets are far below the bound");
        out.push((
            crate::net::Endpoint::Agent(agent),
            Msg::Assignments { session: session.clone(), complete: true, changes },
        ));
        self.streams.insert(agent, Stream { session, set, watch, node_id: node_id.to_string() });
    }

    /// Ends an agent's stream (its connection broke).
    pub fn drop_stream(&mut self, agent: usize) {
        self.streams.remove(&agent);
    }
}
