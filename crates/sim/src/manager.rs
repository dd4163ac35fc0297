//! One simulated manager: raft-rs's `RawNode` over `SimStorage`, its store, a `Proposer` whose writes the
//! simulation appends to the log, the real leader-only subsystems (the list `shoal-node` runs: the
//! orchestrators, reaper, constraint enforcer, rebalancer, scheduler and the dispatcher's loop) polled on
//! the simulation's executor, and the real `Dispatcher` answering the agents' in-process RPCs.
//!
//! The Ready handling follows `shoal_raft`'s driver step for step (persist, send, apply, advance, persist
//! the commit, apply, snapshot, publish) and uses its screen and apply functions (`sim_hooks`); leadership
//! counts only once an entry of the leader's term is applied; every election timeout is drawn from the
//! member's seeded RNG. A crash drops everything but the disk (`SimStorage::crash`); a restart recovers
//! the store from the snapshot and the committed entries, as `recover_store` does.
//!
//! Must not read the wall clock or spawn threads: time is the simulation's (`ManualClock`, `ManualTimer`).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use raft::eraftpb::{Entry, EntryType, Message, SnapshotMetadata};
use raft::{RawNode, StateRole};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shoal_api::{AssignmentChange, SessionRequest, TaskStatus, UpdateTaskStatusRequest};
use shoal_manager::dispatcher::{AssignmentSet, Dispatcher, DispatcherConfig};
use shoal_manager::{ClusterState, RandomIds};
use shoal_raft::sim_hooks::{apply_normal, screen_inbound};
use shoal_raft::{LeaderState, ProposeError, ProposeFuture, Proposer, ReadBarrierFuture};
use shoal_store::{decode_snapshot, encode_request, encode_snapshot, Action, Commit, ManualClock, MemoryStore, Watch};
use tokio::sync::watch;

use crate::disk::SimStorage;
use crate::exec::{poll_once, SimFuture};
use shoal_manager::ManualTimer;

/// Election timeout in ticks (randomized in `[n, 2n)`), heartbeat interval, as the daemon's defaults.
pub const ELECTION_TICK: usize = 10;
/// Leader heartbeat interval, in ticks.
pub const HEARTBEAT_TICK: usize = 1;
/// Most proposals appended per step (the driver's `MAX_PROPOSALS_PER_READY`).
pub const MAX_PROPOSALS_PER_STEP: usize = 1024;
/// Most writes waiting in one manager's proposer (the driver's `PROPOSAL_QUEUE`); beyond it they fail.
pub const PROPOSAL_QUEUE: usize = 4096;

type Slot = Arc<Mutex<Option<Result<Arc<Commit>, ProposeError>>>>;

/// What travels between the simulated nodes.
#[derive(Debug, Clone)]
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
    /// Manager -> agent: an assignments message of the session's stream.
    Assignments { session: String, complete: bool, changes: Vec<AssignmentChange> },
    /// Manager -> agent: the session's streams ended (this manager lost leadership, or the session expired).
    SessionEnded { session: String },
}

/// The proposer the subsystems and the control API write through: queues writes for the simulation loop
/// to append, answers when they are applied.
#[derive(Debug)]
pub struct SimProposer {
    queue: Mutex<VecDeque<(Vec<Action>, Slot)>>,
    leader: watch::Sender<LeaderState>,
}

impl SimProposer {
    fn new() -> SimProposer {
        SimProposer { queue: Mutex::new(VecDeque::new()), leader: watch::channel(LeaderState::default()).0 }
    }
}

fn answered(r: Result<Arc<Commit>, ProposeError>) -> ProposeFuture {
    Box::pin(std::future::ready(r))
}

impl Proposer for SimProposer {
    fn propose(&self, actions: Vec<Action>) -> ProposeFuture {
        let st = *self.leader.borrow();
        if !st.is_leader {
            return answered(Err(ProposeError::NotLeader { leader: (st.leader_id != 0).then_some(st.leader_id) }));
        }
        let mut q = self.queue.lock();
        if q.len() >= PROPOSAL_QUEUE {
            return answered(Err(ProposeError::Unknown(format!("{PROPOSAL_QUEUE} writes already queued"))));
        }
        let slot: Slot = Arc::new(Mutex::new(None));
        q.push_back((actions, slot.clone()));
        Box::pin(std::future::poll_fn(move |_| match slot.lock().take() {
            Some(r) => std::task::Poll::Ready(r),
            None => std::task::Poll::Pending,
        }))
    }

    fn leadership(&self) -> watch::Receiver<LeaderState> {
        self.leader.subscribe()
    }

    fn read_barrier(&self) -> ReadBarrierFuture {
        let ok = self.leader.borrow().is_leader;
        Box::pin(std::future::ready(if ok { Ok(()) } else { Err(ProposeError::NoLeader("not the leader".into())) }))
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

/// A manager that is up.
pub struct Running {
    raw: RawNode<SimStorage>,
    /// The replicated state as this manager applied it.
    pub store: Arc<MemoryStore>,
    proposer: Arc<SimProposer>,
    /// What the control API and the subsystems use.
    pub state: ClusterState,
    dispatcher: Arc<Dispatcher>,
    pending: BTreeMap<u64, (u64, Slot)>,
    next_request: u64,
    /// Last applied index, and its term.
    pub applied: u64,
    applied_term: u64,
    last_snapshot_index: u64,
    role_term: Option<(StateRole, u64)>,
    rng: StdRng,
    leader: Option<LeaderLoops>,
    rpcs: Vec<Rpc>,
    streams: BTreeMap<usize, Stream>,
    /// Entries applied since the start: index -> (term, digest of the data), for the safety checks.
    pub applied_log: BTreeMap<u64, (u64, u64)>,
    /// When this manager last answered a heartbeat of each node OK (simulation time, ms).
    pub last_beat_ok_ms: BTreeMap<String, u64>,
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

impl Manager {
    /// A manager with an empty disk, not started.
    pub fn new(id: u64, cfg: &ManagerConfig, clock: Arc<ManualClock>, seed: u64) -> Manager {
        Manager { id, clock, run: None, disk: SimStorage::with_voters(cfg.voters.clone()), seed, starts: 0 }
    }

    /// Starts (or restarts) from the disk: recovers the store, builds the raft node.
    pub fn start(&mut self, cfg: &ManagerConfig, timer: &Arc<ManualTimer>) {
        assert!(self.run.is_none(), "manager {} is already up", self.id);
        self.starts += 1;
        let storage = std::mem::take(&mut self.disk);
        let store = Arc::new(MemoryStore::new(shoal_store::DEFAULT_WATCH_QUEUE_COMMITS));
        let (mut applied, mut applied_term) = (0, 0);
        let mut applied_log = BTreeMap::new();
        let (meta, data) = storage.snapshot_parts();
        if meta.index > 0 {
            let snap = decode_snapshot(data).expect("the simulation's snapshots decode");
            store.restore(meta.index, snap);
            applied = meta.index;
            applied_term = meta.term;
        }
        let last_snapshot_index = meta.index;
        let commit = storage.hard_state().commit;
        if commit > applied {
            for e in storage.read(applied + 1, commit + 1) {
                match e.get_entry_type() {
                    EntryType::EntryNormal => {
                        let _ = apply_normal(&store, &e);
                    }
                    _ => store.advance_index(e.index),
                }
                applied_log.insert(e.index, (e.term, digest(&e.data)));
                applied = e.index;
                applied_term = e.term;
            }
        }
        let raft_cfg = raft::Config {
            id: self.id,
            election_tick: ELECTION_TICK,
            heartbeat_tick: HEARTBEAT_TICK,
            applied,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 256,
            check_quorum: true,
            pre_vote: true,
            ..raft::Config::default()
        };
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let raw = RawNode::new(&raft_cfg, storage, &logger).expect("raft config is valid");
        let proposer = Arc::new(SimProposer::new());
        let ids = Arc::new(RandomIds::seeded(self.seed ^ self.starts.wrapping_mul(0x9e37_79b9_7f4a_7c15)));
        let state =
            ClusterState::new(store.clone(), proposer.clone(), self.clock.clone(), ids).with_timer(timer.clone());
        let dispatcher = Dispatcher::new(state.clone(), cfg.dispatcher.clone());
        let rng = StdRng::seed_from_u64(self.seed.wrapping_add(self.starts));
        let mut run = Running {
            raw,
            store,
            proposer,
            state,
            dispatcher,
            pending: BTreeMap::new(),
            next_request: self.starts << 40,
            applied,
            applied_term,
            last_snapshot_index,
            role_term: None,
            rng,
            leader: None,
            rpcs: Vec::new(),
            streams: BTreeMap::new(),
            applied_log,
            last_beat_ok_ms: BTreeMap::new(),
        };
        run.reseed_election_timeout();
        self.run = Some(run);
    }

    /// Crashes: everything but the disk is gone; unsynced writes too when `lose_unsynced`.
    pub fn crash(&mut self, lose_unsynced: bool) {
        if let Some(run) = self.run.take() {
            let err = ProposeError::Stopped;
            for (_, (_, slot)) in run.pending {
                *slot.lock() = Some(Err(err.clone()));
            }
            for (_, slot) in run.proposer.queue.lock().drain(..) {
                *slot.lock() = Some(Err(err.clone()));
            }
            run.proposer.leader.send_modify(|s| s.is_leader = false);
            self.disk = run.raw.store().crash(lose_unsynced);
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
    /// Raft's view: role, term, leader.
    pub fn raft_state(&self) -> (StateRole, u64, u64) {
        (self.raw.raft.state, self.raw.raft.term, self.raw.raft.leader_id)
    }

    /// The leadership the subsystems see.
    pub fn leader_state(&self) -> LeaderState {
        *self.proposer.leader.borrow()
    }

    /// Commit index.
    pub fn commit(&self) -> u64 {
        self.raw.raft.raft_log.committed
    }

    /// Raft's state, for failure messages.
    pub fn debug_raft(&self) -> String {
        let r = &self.raw.raft;
        format!(
            "role {:?} term {} leader {} commit {} last {} first {} snapshot {} pending {} queued {} leading since term {:?}",
            r.state,
            r.term,
            r.leader_id,
            r.raft_log.committed,
            r.raft_log.last_index(),
            r.raft_log.first_index(),
            self.last_snapshot_index,
            self.pending.len(),
            self.proposer.queue.lock().len(),
            self.leader.as_ref().map(|l| l.term)
        )
    }

    /// The leader's progress of `peer`, for failure messages.
    pub fn debug_progress(&self, peer: u64) -> String {
        match self.raw.raft.prs().get(peer) {
            Some(p) => format!(
                "{p:?} (leader first {} last {})",
                self.raw.raft.raft_log.first_index(),
                self.raw.raft.raft_log.last_index()
            ),
            None => "no progress".into(),
        }
    }

    /// Syncs done by the disk.
    pub fn syncs(&self) -> u64 {
        self.raw.store().syncs
    }

    fn reseed_election_timeout(&mut self) {
        let now = Some((self.raw.raft.state, self.raw.raft.term));
        if now == self.role_term {
            return;
        }
        self.role_term = now;
        let t = self.rng.random_range(ELECTION_TICK..2 * ELECTION_TICK);
        self.raw.raft.set_randomized_election_timeout(t);
    }

    /// Steps a Raft message from a peer, screened as the driver screens it.
    pub fn step_raft(&mut self, mut m: Message) {
        let last = self.raw.raft.raft_log.last_index();
        if screen_inbound(&mut m, last) {
            let _ = self.raw.step(m);
        }
        self.reseed_election_timeout();
    }

    /// What the transport says of a snapshot sent to `peer` (the driver's `Inbound::SnapshotStatus`):
    /// a failed one also makes the peer unreachable, so the leader probes it again.
    pub fn report_snapshot(&mut self, peer: u64, delivered: bool) {
        if delivered {
            self.raw.report_snapshot(peer, raft::SnapshotStatus::Finish);
        } else {
            self.raw.report_unreachable(peer);
            self.raw.report_snapshot(peer, raft::SnapshotStatus::Failure);
        }
    }

    /// One tick of Raft's logical clock.
    pub fn tick(&mut self) {
        self.raw.tick();
        self.reseed_election_timeout();
    }

    /// Appends the queued writes (leader only; others fail `NotLeader`), as the driver's `propose`.
    pub fn take_proposals(&mut self) {
        for _ in 0..MAX_PROPOSALS_PER_STEP {
            let Some((actions, slot)) = self.proposer.queue.lock().pop_front() else { break };
            let leader = (self.raw.raft.leader_id != 0).then_some(self.raw.raft.leader_id);
            if self.raw.raft.state != StateRole::Leader {
                *slot.lock() = Some(Err(ProposeError::NotLeader { leader }));
                continue;
            }
            self.next_request += 1;
            let id = self.next_request;
            let before = self.raw.raft.raft_log.last_index();
            match self.raw.propose(vec![], encode_request(id, &actions)) {
                Ok(()) if self.raw.raft.raft_log.last_index() > before => {
                    self.pending.insert(self.raw.raft.raft_log.last_index(), (id, slot));
                }
                Ok(()) => *slot.lock() = Some(Err(ProposeError::Unknown("raft did not append the proposal".into()))),
                Err(raft::Error::ProposalDropped) => *slot.lock() = Some(Err(ProposeError::NotLeader { leader })),
                Err(e) => *slot.lock() = Some(Err(ProposeError::Unknown(format!("raft refused the proposal: {e}")))),
            }
        }
    }

    /// Handles every pending Ready (the driver's `handle_ready`); returns the Raft messages to send.
    pub fn handle_ready(&mut self, cfg: &ManagerConfig) -> Vec<Message> {
        let mut out = Vec::new();
        while self.raw.has_ready() {
            let mut rd = self.raw.ready();
            if !rd.snapshot().is_empty() {
                self.install_snapshot(rd.snapshot().clone());
            }
            self.raw.mut_store().append(rd.entries(), rd.hs());
            out.extend(rd.take_messages());
            self.apply(rd.take_committed_entries());
            out.extend(rd.take_persisted_messages());
            let mut light = self.raw.advance(rd);
            if let Some(commit) = light.commit_index() {
                self.raw.mut_store().set_commit(commit);
            }
            out.extend(light.take_messages());
            self.apply(light.take_committed_entries());
            self.raw.advance_apply();
            self.maybe_snapshot(cfg);
        }
        self.publish();
        out
    }

    fn apply(&mut self, entries: Vec<Entry>) {
        for e in entries {
            if e.index <= self.applied {
                continue;
            }
            match e.get_entry_type() {
                EntryType::EntryNormal => {
                    let pending = self.pending.remove(&e.index);
                    let (id, result) = apply_normal(&self.store, &e);
                    if let Some((want, slot)) = pending {
                        let answer = if id == Some(want) {
                            result.map_err(ProposeError::Store)
                        } else {
                            Err(ProposeError::Unknown("another leader's entry replaced the proposal".into()))
                        };
                        *slot.lock() = Some(answer);
                    }
                }
                // No membership changes in the simulation: the voters are fixed.
                _ => self.store.advance_index(e.index),
            }
            if let Some((term, d)) = self.applied_log.get(&e.index) {
                assert_eq!(
                    (*term, *d),
                    (e.term, digest(&e.data)),
                    "manager {} applied index {} twice, differently",
                    self.raw.raft.id,
                    e.index
                );
            }
            self.applied_log.insert(e.index, (e.term, digest(&e.data)));
            self.applied = e.index;
            self.applied_term = e.term;
        }
    }

    fn install_snapshot(&mut self, snap: raft::eraftpb::Snapshot) {
        let meta = snap.get_metadata().clone();
        let decoded = decode_snapshot(&snap.data).expect("the simulation's snapshots decode");
        self.raw.mut_store().install_snapshot(meta.clone(), snap.data.to_vec());
        self.store.restore(meta.index, decoded);
        self.applied = meta.index;
        self.applied_term = meta.term;
        self.last_snapshot_index = meta.index;
        let stale: Vec<u64> = self.pending.range(..=meta.index).map(|(i, _)| *i).collect();
        for index in stale {
            if let Some((_, slot)) = self.pending.remove(&index) {
                *slot.lock() = Some(Err(ProposeError::Unknown("a snapshot replaced the log".into())));
            }
        }
    }

    fn maybe_snapshot(&mut self, cfg: &ManagerConfig) {
        if self.applied < self.last_snapshot_index + cfg.snapshot_interval_entries {
            return;
        }
        let (index, snap) = self.store.snapshot();
        assert_eq!(index, self.applied, "the store is at index {index} but raft applied {}", self.applied);
        let meta = SnapshotMetadata {
            index,
            term: self.applied_term,
            conf_state: protobuf::SingularPtrField::some(self.raw.store().conf_state().clone()),
            ..SnapshotMetadata::default()
        };
        let through = index.saturating_sub(cfg.log_entries_for_slow_followers);
        self.raw.mut_store().record_snapshot(meta, encode_snapshot(snap), through);
        self.last_snapshot_index = index;
    }

    /// Publishes leadership (the driver's `publish`): the leader counts once it applied an entry of its
    /// term; losing the role fails the writes in flight.
    fn publish(&mut self) {
        let raft = &self.raw.raft;
        let role_leader = raft.state == StateRole::Leader;
        let state = LeaderState {
            is_leader: role_leader && self.applied_term == raft.term,
            term: raft.term,
            leader_id: raft.leader_id,
        };
        if *self.proposer.leader.borrow() != state {
            self.proposer.leader.send_replace(state);
        }
        if !role_leader && !self.pending.is_empty() {
            for (_, (_, slot)) in std::mem::take(&mut self.pending) {
                *slot.lock() =
                    Some(Err(ProposeError::Unknown("leadership was lost before the write was applied".into())));
            }
        }
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
                // The daemon's own list (`shoal_manager::leader`), the key manager's RNG seeded from this run's.
                let key_rng = Box::new(StdRng::seed_from_u64(self.rng.random()));
                let list = shoal_manager::leader_subsystems(&self.dispatcher, key_rng);
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
                let leader = self.raw.raft.leader_id;
                self.rpcs.push(Box::pin(async move {
                    let req = SessionRequest { description: None, session_id: String::new() };
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
            let mut lookup = |d: &shoal_manager::dispatcher::Dependency| store.view(|t| d.lookup(t));
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
