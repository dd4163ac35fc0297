//! `Core`: one Raft member's logic without IO. It owns raft-rs's `RawNode` over a `LogStorage`, the
//! member's store, and everything the member remembers between two Readies: the proposals waiting for
//! their entries, the membership changes, the writes this follower forwarded, the read barriers (with the
//! time they were asked, passed in), the snapshot policy and the leadership it publishes.
//!
//! Two drivers run it, and nothing else carries this logic: the daemon's (`node::Driver`: a thread, its
//! channels, a clock, raft-engine storage and a full disk's pause) and the deterministic simulation's
//! (`shoal-sim`: simulated storage, network and time). A driver feeds the core proposals, messages, ticks
//! and the time; it calls `handle_ready` after each batch and sends the messages it is handed.
//!
//! Must not know threads, channels' receiving ends, the wall clock or files: time comes in as a `Duration`
//! since the member started, messages go out through the closure `handle_ready` is given, and the disk is
//! the `LogStorage`. Answers go back through the `oneshot` senders the callers handed in (they need no
//! runtime) and leadership through `watch` senders.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use prost::Message as _;
use protobuf::Message as _;
use raft::eraftpb::{
    ConfChange, ConfChangeType, ConfChangeV2, ConfState, Entry, EntryType, HardState, Message, Snapshot,
    SnapshotMetadata,
};
use raft::{RawNode, SnapshotStatus, StateRole};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use shoal_api::StoreSnapshot;
use shoal_store::{decode_request, decode_snapshot, Commit, MemoryStore, StoreError};
use tokio::sync::{oneshot, watch};

use crate::logger::raft_logger;
use crate::screen::screen_inbound;
use crate::{LeaderState, LogReadError, LoggedWrite, Member, Members, ProposeError, RaftConfig, RaftError};

/// Largest append message raft-rs builds for a follower, in bytes.
const MAX_SIZE_PER_MSG: u64 = 1 << 20;
/// Most in-flight append messages per follower.
const MAX_INFLIGHT_MSGS: usize = 256;
/// Bound of the proposal queue between the handles and the driver. A proposer waits for room when it is full.
pub const PROPOSAL_QUEUE: usize = 4096;
/// Most forwarded writes a follower waits for at once (further ones fail with `Unknown` at once).
pub const MAX_FORWARDED_IN_FLIGHT: usize = PROPOSAL_QUEUE;
/// Most read barriers waiting at once (further ones fail at once).
pub const MAX_READS_IN_FLIGHT: usize = PROPOSAL_QUEUE;
/// Entries read per storage call when replaying the log at start.
const REPLAY_CHUNK_ENTRIES: u64 = 1024;

/// The storage a `Core` persists to: what raft-rs reads, plus the writes the core makes, each durable when
/// it returns (except `set_commit`, which may be lost by a crash: the commit index is recomputed).
pub trait LogStorage: raft::Storage {
    /// Appends a Ready's entries (replacing a conflicting suffix) and its hard state.
    fn append(&mut self, entries: &[Entry], hs: Option<&HardState>) -> Result<(), RaftError>;
    /// Records a new commit index.
    fn set_commit(&mut self, commit: u64) -> Result<(), RaftError>;
    /// The hard state as written.
    fn hard_state(&self) -> &HardState;
    /// The configuration (voters, learners).
    fn conf_state(&self) -> &ConfState;
    /// The members' addresses as of `conf_state`.
    fn members(&self) -> &Members;
    /// Persists a configuration and its addresses together.
    fn set_membership(&mut self, cs: ConfState, members: Members) -> Result<(), RaftError>;
    /// The latest snapshot's metadata (index 0: none).
    fn snapshot_metadata(&self) -> &SnapshotMetadata;
    /// The latest snapshot's data; a missing or unreadable one is `RaftError::Damaged`.
    fn load_snapshot(&self) -> Result<Vec<u8>, RaftError>;
    /// Where snapshot `index` is kept, for error messages.
    fn snapshot_path(&self, index: u64) -> PathBuf;
    /// A snapshot from the leader: its data kept, the log restarted after it, at most `keep` snapshots left.
    fn install_snapshot(
        &mut self,
        meta: SnapshotMetadata,
        data: &[u8],
        members: Members,
        keep: usize,
    ) -> Result<(), RaftError>;
    /// A snapshot taken here: its data kept, the log compacted through `compact_through`, at most `keep`
    /// snapshots left.
    fn record_snapshot(
        &mut self,
        meta: SnapshotMetadata,
        data: &[u8],
        compact_through: u64,
        keep: usize,
    ) -> Result<(), RaftError>;
    /// The first index still in the log.
    fn first_log_index(&self) -> u64;
    /// Entries `[low, high)`.
    fn read_entries(&self, low: u64, high: u64) -> Result<Vec<Entry>, RaftError>;
}

/// A snapshot of a member's Raft progress, for status displays and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RaftStatus {
    /// This member's Raft ID.
    pub id: u64,
    /// The current term.
    pub term: u64,
    /// The leader's Raft ID (0 when unknown).
    pub leader_id: u64,
    /// The highest index known committed.
    pub commit: u64,
    /// The highest index applied to the store.
    pub applied: u64,
    /// Index of the latest snapshot (0 when none was taken).
    pub last_snapshot_index: u64,
    /// True when this node leads and has applied an entry of its own term (it may write).
    pub is_leader: bool,
}

/// Why a membership change did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MembershipError {
    /// This manager is not the leader; membership changes are made by the leader.
    #[error("this manager is not the raft leader (leader: {}); send the request to the \
             leader", leader_addr.as_deref().unwrap_or("unknown"))]
    NotLeader {
        /// The leader's address, when known.
        leader_addr: Option<String>,
    },
    /// The change is not allowed as asked.
    #[error("{0}")]
    Refused(String),
    /// The change was proposed but its outcome is not known to be applied.
    #[error("the membership change failed: {0}")]
    Failed(#[from] ProposeError),
}

/// Where a write's outcome is sent.
pub type Done = oneshot::Sender<Result<Arc<Commit>, ProposeError>>;
/// Where a read barrier's outcome is sent.
pub type ReadDone = oneshot::Sender<Result<(), ProposeError>>;
/// Where a membership change's outcome is sent.
pub type MembersDone = oneshot::Sender<Result<Members, ProposeError>>;
/// Sees every entry the core applies to the store, in order, the replay at start included (the
/// simulation's safety checks; `None` in the daemon).
pub type ApplyObserver = Box<dyn FnMut(&Entry) + Send>;

/// One write to append.
pub struct Proposal {
    /// The request ID its entry carries (`encode_request`).
    pub id: u64,
    /// The encoded request.
    pub data: Vec<u8>,
    /// Answered once the entry is applied (or known lost).
    pub done: Done,
    /// Told the log index once the entry is appended (forwarded proposals answer then).
    pub appended: Option<oneshot::Sender<u64>>,
}

/// A proposal appended to the log, waiting for its entry to be applied.
struct Pending {
    id: u64,
    done: Done,
}

/// What the core publishes: leadership, members, status and (on a leader) the members heard from.
#[derive(Debug)]
pub struct Outlets {
    /// Leadership as the proposers see it.
    pub leader: watch::Sender<LeaderState>,
    /// The members, as applied.
    pub members: watch::Sender<Members>,
    /// Progress, for status displays.
    pub status: Arc<Mutex<RaftStatus>>,
    /// On the leader: which members were heard from recently.
    pub reachable: Arc<Mutex<BTreeMap<u64, bool>>>,
}

impl Outlets {
    /// Fresh outlets for member `raft_id`.
    pub fn new(raft_id: u64) -> Outlets {
        Outlets {
            leader: watch::channel(LeaderState::default()).0,
            members: watch::channel(Members::default()).0,
            status: Arc::new(Mutex::new(RaftStatus { id: raft_id, ..RaftStatus::default() })),
            reachable: Arc::new(Mutex::new(BTreeMap::new())),
        }
    }
}

/// One Raft member's logic (module docs).
pub struct Core<S: LogStorage> {
    cfg: RaftConfig,
    raw: RawNode<S>,
    store: Arc<MemoryStore>,
    out: Outlets,
    /// Proposals appended to the log, by index.
    pending: BTreeMap<u64, Pending>,
    /// Membership changes appended to the log, by index.
    conf_pending: BTreeMap<u64, MembersDone>,
    /// Writes this node forwarded to the leader, by request ID (at most `MAX_FORWARDED_IN_FLIGHT`).
    forwarded: HashMap<u64, Done>,
    /// Read barriers waiting for their read index, by context (at most `MAX_READS_IN_FLIGHT`), with the
    /// leader asked and when.
    reads: HashMap<u64, (u64, Duration, ReadDone)>,
    /// Read barriers whose read index is known, waiting for the store to apply it.
    reads_to_apply: Vec<(u64, ReadDone)>,
    /// Read barriers waiting for a leader to ask, since when.
    reads_deferred: Vec<(Duration, ReadDone)>,
    next_read_ctx: u64,
    /// Take a snapshot after this Ready (a member was added).
    force_snapshot: bool,
    /// Seeded per member: the election timeouts are repeatable (raft-rs's own draw is not seedable).
    rng: SmallRng,
    /// Role and term when the election timeout was last drawn.
    role_term: Option<(StateRole, u64)>,
    applied: u64,
    applied_term: u64,
    last_snapshot_index: u64,
    /// Bytes of entry data applied since the last snapshot (counted from this start on: after a restart
    /// the entries replayed are not counted).
    bytes_since_snapshot: u64,
    /// (index, data bytes) of the entries applied after the front of the log, oldest first: what the
    /// byte bound on the entries kept behind a snapshot is computed from.
    entry_bytes: VecDeque<(u64, u64)>,
    observer: Option<ApplyObserver>,
}

/// raft-rs's configuration of a member, recovered with `applied` entries applied to the store.
fn raft_config(cfg: &RaftConfig, applied: u64) -> raft::Config {
    raft::Config {
        id: cfg.raft_id,
        election_tick: cfg.election_tick,
        heartbeat_tick: cfg.heartbeat_tick,
        applied,
        max_size_per_msg: MAX_SIZE_PER_MSG,
        max_inflight_msgs: MAX_INFLIGHT_MSGS,
        check_quorum: true,
        pre_vote: true,
        ..raft::Config::default()
    }
}

/// Whether `raft_id` is the only voter (it then campaigns as soon as it starts).
/// Ticks without a word from the leader (it sends a heartbeat every tick) after which a follower probes it
/// (`Core::silent_leader`).
pub(crate) const PROBE_SILENT_LEADER_TICKS: usize = 3;

pub(crate) fn is_single_voter(cs: &ConfState, raft_id: u64) -> bool {
    cs.voters == [raft_id] && cs.learners.is_empty() && cs.voters_outgoing.is_empty()
}

impl<S: LogStorage> Core<S> {
    /// Recovers `store` (which must be empty) from `storage`'s snapshot and committed entries, then builds
    /// raft-rs's node over it; a lone voter campaigns at once. `rng_seed` seeds the election timeouts.
    pub fn open(
        cfg: RaftConfig,
        storage: S,
        store: Arc<MemoryStore>,
        out: Outlets,
        rng_seed: u64,
        mut observer: Option<ApplyObserver>,
    ) -> Result<Core<S>, RaftError> {
        out.members.send_replace(storage.members().clone());
        let (applied, applied_term) = recover_store(&cfg, &storage, &store, &mut observer)?;
        let last_snapshot_index = storage.snapshot_metadata().index;
        let raft_cfg = raft_config(&cfg, applied);
        raft_cfg.validate()?;
        let raw = RawNode::new(&raft_cfg, storage, &raft_logger(cfg.raft_id))?;
        let mut core = Core {
            rng: SmallRng::seed_from_u64(rng_seed),
            cfg,
            raw,
            store,
            out,
            pending: BTreeMap::new(),
            conf_pending: BTreeMap::new(),
            forwarded: HashMap::new(),
            reads: HashMap::new(),
            reads_to_apply: Vec::new(),
            reads_deferred: Vec::new(),
            next_read_ctx: 0,
            force_snapshot: false,
            role_term: None,
            applied,
            applied_term,
            last_snapshot_index,
            bytes_since_snapshot: 0,
            entry_bytes: VecDeque::new(),
            observer,
        };
        core.campaign_if_alone()?;
        Ok(core)
    }

    /// Rebuilds raft-rs's node from the storage (what is on disk) with the applied index the store holds,
    /// as a restart would: after a full disk's pause, whose unwritten state raft-rs's memory may hold.
    pub fn restart(self) -> Result<Core<S>, RaftError> {
        let storage = self.raw.raft.r.raft_log.store;
        let raw = RawNode::new(&raft_config(&self.cfg, self.applied), storage, &raft_logger(self.cfg.raft_id))?;
        let mut core = Core { raw, role_term: None, ..self };
        core.campaign_if_alone()?;
        Ok(core)
    }

    fn campaign_if_alone(&mut self) -> Result<(), RaftError> {
        self.reseed_election_timeout();
        if is_single_voter(self.raw.store().conf_state(), self.cfg.raft_id) {
            self.raw.campaign()?;
            self.reseed_election_timeout();
        }
        Ok(())
    }

    /// The configuration it runs with.
    pub fn cfg(&self) -> &RaftConfig {
        &self.cfg
    }

    /// raft-rs's node (role, term, logs, progress: read-only views for status and checks).
    pub fn raw(&self) -> &RawNode<S> {
        &self.raw
    }

    /// The storage.
    pub fn storage(&self) -> &S {
        self.raw.store()
    }

    /// The storage, to change it outside Raft's writes (re-encryption, a full disk's commit record).
    pub fn storage_mut(&mut self) -> &mut S {
        self.raw.mut_store()
    }

    /// The member's store.
    pub fn store(&self) -> &Arc<MemoryStore> {
        &self.store
    }

    /// The last index applied to the store.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// The latest snapshot's index.
    pub fn last_snapshot_index(&self) -> u64 {
        self.last_snapshot_index
    }

    /// Proposals appended and not yet applied.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// What it publishes.
    pub fn outlets(&self) -> &Outlets {
        &self.out
    }

    /// Applies the cluster's snapshot settings; says whether they changed.
    pub fn set_snapshot_policy(&mut self, policy: crate::SnapshotPolicy) -> bool {
        let before =
            (self.cfg.snapshot_interval_entries, self.cfg.keep_old_snapshots, self.cfg.log_entries_for_slow_followers);
        policy.apply_to(&mut self.cfg);
        let after =
            (self.cfg.snapshot_interval_entries, self.cfg.keep_old_snapshots, self.cfg.log_entries_for_slow_followers);
        before != after
    }

    /// Appends a proposal to the log (if leader) and remembers whom to answer.
    pub fn propose(&mut self, p: Proposal) {
        if self.raw.raft.state != StateRole::Leader {
            let _ = p.done.send(Err(ProposeError::NotLeader { leader: self.leader() }));
            return;
        }
        let before = self.raw.raft.raft_log.last_index();
        match self.raw.propose(vec![], p.data) {
            Ok(()) => {
                let index = self.raw.raft.raft_log.last_index();
                if index == before {
                    let _ = p.done.send(Err(ProposeError::Unknown("raft did not append the proposal".into())));
                } else {
                    if let Some(appended) = p.appended {
                        let _ = appended.send(index);
                    }
                    self.pending.insert(index, Pending { id: p.id, done: p.done });
                }
            }
            Err(raft::Error::ProposalDropped) => {
                let _ = p.done.send(Err(ProposeError::NotLeader { leader: self.leader() }));
            }
            Err(e) => {
                let _ = p.done.send(Err(ProposeError::Unknown(format!("raft refused the proposal: {e}"))));
            }
        }
    }

    fn leader(&self) -> Option<u64> {
        (self.raw.raft.leader_id != 0).then_some(self.raw.raft.leader_id)
    }

    /// Proposes a membership change (leader only); `done` is answered once it is applied.
    pub fn propose_conf_change(&mut self, cc: ConfChange, done: MembersDone) {
        if self.raw.raft.state != StateRole::Leader {
            let _ = done.send(Err(ProposeError::NotLeader { leader: self.leader() }));
            return;
        }
        let before = self.raw.raft.raft_log.last_index();
        match self.raw.propose_conf_change(vec![], cc) {
            Ok(()) if self.raw.raft.raft_log.last_index() > before => {
                self.conf_pending.insert(self.raw.raft.raft_log.last_index(), done);
            }
            Ok(()) => {
                let _ = done.send(Err(ProposeError::Unknown("raft did not append the membership change".into())));
            }
            Err(e) => {
                let _ = done.send(Err(ProposeError::Unknown(format!("raft refused the membership change: {e}"))));
            }
        }
    }

    /// Answers `done` when an entry carrying request `id` is applied (a write this follower forwarded).
    pub fn await_forwarded(&mut self, id: u64, done: Done) {
        if self.forwarded.len() >= MAX_FORWARDED_IN_FLIGHT {
            self.forwarded.retain(|_, d| !d.is_closed());
        }
        if self.forwarded.len() >= MAX_FORWARDED_IN_FLIGHT {
            let _ = done.send(Err(ProposeError::Unknown(format!(
                "{MAX_FORWARDED_IN_FLIGHT} forwarded writes are already waiting; retry later"
            ))));
        } else {
            self.forwarded.insert(id, done);
        }
    }

    /// Hands leadership to member `to`.
    pub fn transfer_leader(&mut self, to: u64) -> Result<(), MembershipError> {
        if self.raw.raft.state != StateRole::Leader {
            return Err(MembershipError::Refused(
                "this manager is not the leader: it has no leadership to hand over".into(),
            ));
        }
        if !self.raw.raft.prs().conf().voters().contains(to) || to == self.cfg.raft_id {
            return Err(MembershipError::Refused(format!("raft id {to:x} is not another voting member")));
        }
        self.raw.transfer_leader(to);
        Ok(())
    }

    /// Applied entries `[low, min(high, applied + 1, low + max))` decoded into writes; the decodable normal
    /// entries with data only. `max` bounds how long it holds the driver.
    pub fn read_log(&self, low: u64, high: u64, max: u64) -> Result<Vec<LoggedWrite>, LogReadError> {
        let storage = self.raw.store();
        let first = storage.first_log_index();
        if low < first {
            return Err(LogReadError::Compacted { asked: low, first });
        }
        let high = high.min(self.applied + 1).min(low.saturating_add(max.max(1)));
        if high <= low {
            return Ok(Vec::new());
        }
        let entries = storage.read_entries(low, high).map_err(|e| LogReadError::Failed(e.to_string()))?;
        Ok(entries
            .iter()
            .filter(|e| e.get_entry_type() == EntryType::EntryNormal && !e.data.is_empty())
            .filter_map(|e| decode_request(&e.data).ok().map(|(_, actions)| LoggedWrite { index: e.index, actions }))
            .collect())
    }

    /// Asks raft-rs for a read index (the leader confirms with a quorum that it still leads and answers
    /// with its commit index; a follower asks the leader). Without a leader to ask (an election, or a leader
    /// that has not yet committed an entry of its term, which raft-rs would ignore) the read waits in
    /// `reads_deferred` for one, at most `leaderless_read_wait` (then "no leader"); the caller's timeout
    /// bounds the whole wait. `now` is the time since the member started.
    pub fn read_index(&mut self, now: Duration, done: ReadDone) {
        if self.reads.len() + self.reads_deferred.len() >= MAX_READS_IN_FLIGHT {
            self.reads.retain(|_, (_, _, d)| !d.is_closed());
            self.reads_deferred.retain(|(_, d)| !d.is_closed());
        }
        if self.reads.len() + self.reads_deferred.len() >= MAX_READS_IN_FLIGHT {
            let _ = done.send(Err(ProposeError::NoLeader(format!(
                "{MAX_READS_IN_FLIGHT} reads are already waiting for the leader; retry later"
            ))));
            return;
        }
        if !self.can_ask_read_index() {
            self.reads_deferred.push((now, done));
            return;
        }
        let leader = self.raw.raft.leader_id;
        self.next_read_ctx += 1;
        self.raw.read_index(self.next_read_ctx.to_be_bytes().to_vec());
        self.reads.insert(self.next_read_ctx, (leader, now, done));
    }

    /// Whether a leader can answer a read index now.
    fn can_ask_read_index(&self) -> bool {
        let raft = &self.raw.raft;
        raft.leader_id != 0 && (raft.state != StateRole::Leader || raft.commit_to_current_term())
    }

    /// How long a read waits for a leader: two of the longest election timeouts (an election in progress).
    fn leaderless_read_wait(&self) -> Duration {
        Duration::from_millis(self.cfg.tick_interval_ms.saturating_mul(2 * self.cfg.election_tick as u64))
    }

    /// Reads asked of a leader that is no longer the leader (it died or lost an election: it will never
    /// answer) wait for a leader again; reads not answered within half of `leaderless_read_wait` are asked
    /// again under the same context, the first answer counting (a leader drops, without a word, a read index
    /// that arrives before it committed an entry of its term). Reads waiting for a leader are asked once there
    /// is one, and fail with "no leader" once they waited `leaderless_read_wait`.
    fn retry_deferred_reads(&mut self, now: Duration) {
        let leader = self.raw.raft.leader_id;
        if self.reads.values().any(|(asked, _, _)| *asked != leader) {
            let stale: Vec<u64> =
                self.reads.iter().filter(|(_, (asked, _, _))| *asked != leader).map(|(k, _)| *k).collect();
            for k in stale {
                if let Some((_, _, done)) = self.reads.remove(&k) {
                    self.reads_deferred.push((now, done));
                }
            }
        }
        let reask = self.leaderless_read_wait() / 2;
        let due = |at: &Duration| now.saturating_sub(*at) >= reask;
        if self.can_ask_read_index() && self.reads.values().any(|(_, at, _)| due(at)) {
            for (ctx, (_, at, _)) in self.reads.iter_mut().filter(|(_, (_, at, _))| due(at)) {
                *at = now;
                self.raw.read_index(ctx.to_be_bytes().to_vec());
            }
        }
        if self.reads_deferred.is_empty() {
            return;
        }
        if self.can_ask_read_index() {
            for (_, done) in std::mem::take(&mut self.reads_deferred) {
                if !done.is_closed() {
                    self.read_index(now, done);
                }
            }
            return;
        }
        let wait = self.leaderless_read_wait();
        let (expired, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.reads_deferred)
            .into_iter()
            .partition(|(since, _)| now.saturating_sub(*since) >= wait);
        self.reads_deferred = waiting;
        for (_, done) in expired {
            let _ = done.send(Err(ProposeError::NoLeader(
                "no manager is the raft leader right now (an election is under way or no quorum is reachable)".into(),
            )));
        }
    }

    /// Moves answered read indexes to `reads_to_apply`, then answers every barrier whose index is applied.
    fn answer_reads(&mut self, states: Vec<raft::ReadState>) {
        for rs in states {
            let Ok(ctx) = <[u8; 8]>::try_from(rs.request_ctx.as_slice()) else { continue };
            if let Some((_, _, done)) = self.reads.remove(&u64::from_be_bytes(ctx)) {
                self.reads_to_apply.push((rs.index, done));
            }
        }
        if !self.reads_to_apply.is_empty() {
            let applied = self.applied;
            let (ready, waiting) =
                std::mem::take(&mut self.reads_to_apply).into_iter().partition(|(i, _)| *i <= applied);
            self.reads_to_apply = waiting;
            for (_, done) in ready {
                let _ = done.send(Ok(()));
            }
        }
    }

    /// Steps a message from a peer, screened first (`screen::screen_inbound`).
    pub fn step_message(&mut self, mut m: Message) {
        // A member that lost its state and joined again at the same address has a new Raft ID; messages
        // still addressed to its old ID (queued or retried by a peer) carry that member's progress, e.g. a
        // commit index beyond this node's log, which raft-rs would take as its own and panic on.
        if m.to != self.cfg.raft_id {
            tracing::debug!(to = m.to, from = m.from, "raft message for another member id dropped");
            return;
        }
        // A member removed from the cluster (as this member applied it) is not heard (SwarmKit's transport
        // refuses it too): raft-rs grants votes to a candidate outside its configuration, so a removed
        // member that had not applied its removal yet could be elected by those that had.
        if self.raw.store().members().removed.contains(&m.from) {
            tracing::debug!(from = m.from, "raft message from a removed member dropped");
            return;
        }
        if !screen_inbound(&mut m, self.raw.raft.raft_log.last_index()) {
            return;
        }
        if let Err(e) = self.raw.step(m) {
            tracing::debug!(error = %e, "raft message dropped");
        }
        self.reseed_election_timeout();
    }

    /// The transport could not reach `peer` (raft-rs goes back to probing it).
    pub fn report_unreachable(&mut self, peer: u64) {
        self.raw.report_unreachable(peer);
    }

    /// A snapshot sent to `peer` was delivered or failed.
    pub fn report_snapshot(&mut self, peer: u64, delivered: bool) {
        let status = if delivered { SnapshotStatus::Finish } else { SnapshotStatus::Failure };
        self.raw.report_snapshot(peer, status);
    }

    /// One tick of Raft's logical clock.
    pub fn tick(&mut self) {
        self.raw.tick();
        self.reseed_election_timeout();
    }

    /// The leader the transport should probe now (`Transport::probe`, after each tick): this member follows it
    /// and has heard nothing from it for `PROBE_SILENT_LEADER_TICKS` ticks, and less than an election timeout
    /// (after that an election starts anyway). The probe asks whether its process is still there.
    pub fn silent_leader(&self) -> Option<u64> {
        let r = &self.raw.raft;
        let silent = r.election_elapsed >= PROBE_SILENT_LEADER_TICKS && r.election_elapsed < r.election_timeout();
        (r.state == StateRole::Follower && r.leader_id != raft::INVALID_ID && silent).then_some(r.leader_id)
    }

    /// The transport found nothing listening at `peer`'s address (its connection was refused: the host answers
    /// and the process is gone). When `peer` is this member's leader, its lease is over: this member's
    /// election clock moves to the end of the election timeout, so it grants pre-votes at once and campaigns
    /// after the randomized rest of its timeout, instead of waiting out the whole timeout first. Timing only:
    /// an election still needs a quorum's votes, and a leader that is in fact alive keeps its followers with
    /// its next heartbeat. Returns whether the clock moved.
    pub fn peer_gone(&mut self, peer: u64) -> bool {
        let r = &mut self.raw.raft;
        let base = r.election_timeout();
        if r.state != StateRole::Follower || r.leader_id != peer || r.election_elapsed >= base {
            return false;
        }
        tracing::info!(
            raft_id = self.cfg.raft_id,
            leader = peer,
            term = r.term,
            "the leader's process is gone \
            (its port refuses connections): its lease is over"
        );
        r.election_elapsed = base;
        true
    }

    /// raft-rs draws election timeouts from an unseeded RNG whenever it resets its timer (on every role or
    /// term change); this replaces each draw with one from the member's seeded RNG.
    fn reseed_election_timeout(&mut self) {
        let now = Some((self.raw.raft.state, self.raw.raft.term));
        if now == self.role_term {
            return;
        }
        self.role_term = now;
        let min = self.cfg.election_tick;
        let t = self.rng.random_range(min..2 * min);
        self.raw.raft.set_randomized_election_timeout(t);
    }

    /// Whether Raft's logical clock must run. A leader that is the only member (no other voter, no learner)
    /// has no one to send heartbeats to and no election to time out: its ticks would change nothing, so a
    /// one-manager cluster does not wake every tick while it idles. The ticks start again as soon as a
    /// member is added (its progress appears) or this node is not the leader.
    pub fn needs_ticks(&self) -> bool {
        let raft = &self.raw.raft;
        raft.state != StateRole::Leader || raft.prs().iter().len() > 1
    }

    /// Handles every pending Ready: persist, send, apply, snapshot, then publish. Entries and hard state
    /// are durable before anything that depends on them leaves through `send`. `now` is the time since the
    /// member started (read barriers' waits).
    pub fn handle_ready(&mut self, now: Duration, send: &mut dyn FnMut(Vec<Message>)) -> Result<(), RaftError> {
        self.reseed_election_timeout();
        let mut send = |msgs: Vec<Message>| {
            if !msgs.is_empty() {
                send(msgs);
            }
        };
        loop {
            while self.raw.has_ready() {
                let mut rd = self.raw.ready();
                let read_states = rd.take_read_states();
                if !rd.snapshot().is_empty() {
                    self.install_snapshot(rd.snapshot().clone())?;
                }
                self.raw.mut_store().append(rd.entries(), rd.hs())?;
                send(rd.take_messages());
                self.apply(rd.take_committed_entries())?;
                send(rd.take_persisted_messages());
                let mut light = self.raw.advance(rd);
                if let Some(commit) = light.commit_index() {
                    self.raw.mut_store().set_commit(commit)?;
                }
                send(light.take_messages());
                self.apply(light.take_committed_entries())?;
                self.raw.advance_apply();
                self.answer_reads(read_states);
                self.maybe_snapshot()?;
            }
            if !self.reads_to_apply.is_empty() {
                self.answer_reads(Vec::new());
            }
            self.retry_deferred_reads(now);
            // A deferred read on a single-member cluster is answered at once, in a new Ready.
            if !self.raw.has_ready() {
                break;
            }
        }
        self.reseed_election_timeout();
        self.publish();
        Ok(())
    }

    /// Applies committed entries to the store in order and answers the proposals they carry.
    fn apply(&mut self, entries: Vec<Entry>) -> Result<(), RaftError> {
        for e in entries {
            if e.index <= self.applied {
                continue;
            }
            match e.get_entry_type() {
                EntryType::EntryNormal => self.apply_normal_entry(&e),
                EntryType::EntryConfChange => {
                    let cc = ConfChange::parse_from_bytes(&e.data)
                        .map_err(|err| self.corrupted(format!("conf change at {}: {err}", e.index)))?;
                    self.apply_conf_change(e.index, &cc)?;
                }
                EntryType::EntryConfChangeV2 => {
                    let cc = ConfChangeV2::parse_from_bytes(&e.data)
                        .map_err(|err| self.corrupted(format!("conf change at {}: {err}", e.index)))?;
                    let result = match self.raw.apply_conf_change(&cc) {
                        Ok(cs) => {
                            let members = self.raw.store().members().clone();
                            self.raw.mut_store().set_membership(cs, members.clone())?;
                            Ok(members)
                        }
                        Err(err) => Err(ProposeError::Unknown(format!("raft refused the membership change: {err}"))),
                    };
                    self.store.advance_index(e.index);
                    if let Some(done) = self.conf_pending.remove(&e.index) {
                        let _ = done.send(result);
                    }
                }
            }
            self.applied = e.index;
            self.applied_term = e.term;
            let bytes = e.data.len() as u64;
            self.bytes_since_snapshot = self.bytes_since_snapshot.saturating_add(bytes);
            self.entry_bytes.push_back((e.index, bytes));
            if let Some(observe) = self.observer.as_mut() {
                observe(&e);
            }
        }
        Ok(())
    }

    fn apply_normal_entry(&mut self, e: &Entry) {
        let pending = self.pending.remove(&e.index);
        let (id, result) = apply_normal(&self.store, e);
        // Whoever learns of the write from its answer sees it in the status too.
        {
            let mut st = self.out.status.lock();
            st.applied = e.index;
            st.commit = st.commit.max(e.index);
        }
        if let Some(done) = self.conf_pending.remove(&e.index) {
            let _ = done.send(Err(ProposeError::Unknown(
                "another membership change was in progress; retry once it is done".into(),
            )));
        }
        if let Some(p) = pending {
            let answer = if id == Some(p.id) {
                result.clone().map_err(ProposeError::Store)
            } else {
                Err(ProposeError::Unknown("another leader's entry replaced the proposal".into()))
            };
            let _ = p.done.send(answer);
        }
        if let Some(done) = id.and_then(|id| self.forwarded.remove(&id)) {
            let _ = done.send(result.map_err(ProposeError::Store));
        }
    }

    /// Applies a committed membership change: raft-rs's configuration, then the addresses (from the
    /// context), persisted together. A change raft-rs refuses is skipped identically on every member.
    fn apply_conf_change(&mut self, index: u64, cc: &ConfChange) -> Result<(), RaftError> {
        let result = match self.raw.apply_conf_change(cc) {
            Ok(cs) => {
                let mut members = self.raw.store().members().clone();
                match cc.get_change_type() {
                    ConfChangeType::AddNode | ConfChangeType::AddLearnerNode => {
                        let mut m = Member::decode(&cc.context).unwrap_or_else(|err| {
                            tracing::warn!(index, error = %err, "membership change without a readable address");
                            Member::default()
                        });
                        m.raft_id = cc.node_id;
                        members.members.insert(cc.node_id, m);
                        self.force_snapshot = true;
                    }
                    ConfChangeType::RemoveNode => {
                        members.members.remove(&cc.node_id);
                        members.removed.insert(cc.node_id);
                    }
                }
                self.raw.mut_store().set_membership(cs, members.clone())?;
                self.out.members.send_replace(members.clone());
                Ok(members)
            }
            Err(err) => {
                tracing::warn!(index, error = %err, "membership change refused by raft; skipped");
                Err(ProposeError::Unknown(format!("raft refused the membership change: {err}")))
            }
        };
        self.store.advance_index(index);
        if let Some(done) = self.conf_pending.remove(&index) {
            let _ = done.send(result);
        }
        Ok(())
    }

    fn corrupted(&self, reason: String) -> RaftError {
        RaftError::Corrupted { path: self.cfg.state_dir.join("raft"), reason }
    }

    /// How many snapshots the storage keeps: the newest and `keep_old_snapshots` older ones.
    fn snapshots_kept(&self) -> usize {
        usize::try_from(self.cfg.keep_old_snapshots).unwrap_or(usize::MAX).saturating_add(1)
    }

    /// Installs a snapshot sent by the leader: file, log state, then the store.
    fn install_snapshot(&mut self, snap: Snapshot) -> Result<(), RaftError> {
        let meta = snap.get_metadata().clone();
        let (decoded, members) = decode_raft_snapshot(&snap.data)
            .map_err(|e| RaftError::SnapshotDecode { path: self.raw.store().snapshot_path(meta.index), reason: e })?;
        let members = members.unwrap_or_else(|| self.raw.store().members().clone());
        let keep = self.snapshots_kept();
        self.raw.mut_store().install_snapshot(meta.clone(), &snap.data, members.clone(), keep)?;
        self.out.members.send_replace(members);
        self.store.restore(meta.index, decoded);
        tracing::info!(raft_id = self.cfg.raft_id, index = meta.index, "installed a snapshot from the leader");
        self.applied = meta.index;
        self.applied_term = meta.term;
        self.last_snapshot_index = meta.index;
        self.bytes_since_snapshot = 0;
        self.entry_bytes.clear();
        {
            let mut st = self.out.status.lock();
            st.applied = meta.index;
            st.last_snapshot_index = meta.index;
        }
        let stale: Vec<u64> = self.pending.range(..=meta.index).map(|(i, _)| *i).collect();
        for index in stale {
            if let Some(p) = self.pending.remove(&index) {
                let _ = p.done.send(Err(ProposeError::Unknown("a snapshot replaced the log".into())));
            }
        }
        // Forwarded writes covered by the snapshot were applied (or not) without this node seeing them.
        for (_, done) in self.forwarded.drain() {
            let _ = done.send(Err(ProposeError::Unknown("a snapshot from the leader replaced the log".into())));
        }
        Ok(())
    }

    /// Every `snapshot_interval_entries` applied entries, or once they hold `snapshot_interval_bytes`:
    /// snapshot the store, record it, and compact the log so that at most `log_entries_for_slow_followers`
    /// entries and `log_bytes_for_slow_followers` bytes stay behind it.
    fn maybe_snapshot(&mut self) -> Result<(), RaftError> {
        let force = std::mem::take(&mut self.force_snapshot) && self.applied > self.last_snapshot_index;
        let by_entries = self.applied >= self.last_snapshot_index.saturating_add(self.cfg.snapshot_interval_entries);
        let by_bytes =
            self.bytes_since_snapshot >= self.cfg.snapshot_interval_bytes && self.applied > self.last_snapshot_index;
        if !force && !by_entries && !by_bytes {
            return Ok(());
        }
        let (index, snap) = self.store.snapshot();
        if index != self.applied {
            return Err(self.corrupted(format!(
                "the store is at index {index} but raft applied {}: something else writes to the store",
                self.applied
            )));
        }
        let data = encode_raft_snapshot(snap, self.raw.store().members());
        let meta = SnapshotMetadata {
            index,
            term: self.applied_term,
            conf_state: protobuf::SingularPtrField::some(self.raw.store().conf_state().clone()),
            ..SnapshotMetadata::default()
        };
        let mut compact_through = compact_point(
            index,
            &self.entry_bytes,
            self.cfg.log_entries_for_slow_followers,
            self.cfg.log_bytes_for_slow_followers,
        );
        if force {
            // A new member's empty log must be filled from this snapshot, never from entry 1 on.
            compact_through = compact_through.max(1);
        }
        let keep = self.snapshots_kept();
        self.raw.mut_store().record_snapshot(meta, &data, compact_through, keep)?;
        self.last_snapshot_index = index;
        self.bytes_since_snapshot = 0;
        while self.entry_bytes.front().is_some_and(|(i, _)| *i <= compact_through) {
            self.entry_bytes.pop_front();
        }
        tracing::debug!(
            raft_id = self.cfg.raft_id,
            index,
            bytes = data.len(),
            first_log_index = self.raw.store().first_log_index(),
            "raft snapshot taken"
        );
        Ok(())
    }

    /// Publishes leadership and status. A leader counts as such once it has applied an entry of its own
    /// term (its no-op): from then on its store holds everything committed before it, so writes based on
    /// it are meaningful. Losing the leader role fails the proposals in flight with `Unknown`.
    fn publish(&mut self) {
        let raft = &self.raw.raft;
        let role_leader = raft.state == StateRole::Leader;
        let state = LeaderState {
            is_leader: role_leader && self.applied_term == raft.term,
            term: raft.term,
            leader_id: raft.leader_id,
        };
        *self.out.status.lock() = RaftStatus {
            id: self.cfg.raft_id,
            term: raft.term,
            leader_id: raft.leader_id,
            commit: raft.raft_log.committed,
            applied: self.applied,
            last_snapshot_index: self.last_snapshot_index,
            is_leader: state.is_leader,
        };
        {
            let mut reachable = self.out.reachable.lock();
            reachable.clear();
            if role_leader {
                let me = self.cfg.raft_id;
                // raft-rs marks a member it adds recently active before it was ever heard from (so that a quorum
                // check does not depose the leader at once): counting it would let a removal leave a quorum
                // that needs a member that never started (a join whose answer was lost). A member counts once
                // it has acknowledged an entry this term.
                for (id, pr) in raft.prs().iter() {
                    reachable.insert(*id, *id == me || (pr.recent_active && pr.matched > 0));
                }
            }
        }
        let before = *self.out.leader.borrow();
        if before != state {
            if before.is_leader != state.is_leader || before.leader_id != state.leader_id {
                tracing::info!(
                    raft_id = self.cfg.raft_id,
                    term = state.term,
                    leader = state.leader_id,
                    is_leader = state.is_leader,
                    "raft leadership changed"
                );
            }
            self.out.leader.send_replace(state);
        }
        if !role_leader && (!self.pending.is_empty() || !self.conf_pending.is_empty()) {
            self.fail_pending(&ProposeError::Unknown("leadership was lost before the write was applied".into()));
        }
    }

    /// Fails the leader's own pending proposals and membership changes (not the forwarded ones, which any
    /// leader may still commit).
    fn fail_pending(&mut self, reason: &ProposeError) {
        for (_, p) in std::mem::take(&mut self.pending) {
            let _ = p.done.send(Err(reason.clone()));
        }
        for (_, done) in std::mem::take(&mut self.conf_pending) {
            let _ = done.send(Err(reason.clone()));
        }
    }

    /// A full disk (`message` says which): every caller waiting is answered. A write whose entry never
    /// reached the log is refused (`DiskFull`: not applied); one whose entry is in the log may still be
    /// committed (`Unknown`). Published as not leading.
    pub fn abandon_for_full_disk(&mut self, message: &str) {
        let in_log = raft::Storage::last_index(self.raw.store()).unwrap_or(0);
        let refused = ProposeError::DiskFull(message.to_string());
        let maybe = ProposeError::Unknown(format!(
            "{message}; the write reached this manager's raft log before that and may still be applied: read the \
             state again before retrying"
        ));
        for (index, p) in std::mem::take(&mut self.pending) {
            let _ = p.done.send(Err(if index <= in_log { maybe.clone() } else { refused.clone() }));
        }
        for (index, done) in std::mem::take(&mut self.conf_pending) {
            let _ = done.send(Err(if index <= in_log { maybe.clone() } else { refused.clone() }));
        }
        for (_, done) in self.forwarded.drain() {
            let _ = done.send(Err(ProposeError::Unknown(format!(
                "{message}; the leader may still apply the write: read the state again before retrying"
            ))));
        }
        self.fail_reads(&refused);
        self.force_snapshot = false;
        self.out.reachable.lock().clear();
        let term = self.raw.raft.term;
        self.out.leader.send_replace(LeaderState { is_leader: false, term, leader_id: 0 });
        let mut st = self.out.status.lock();
        st.is_leader = false;
        st.leader_id = 0;
    }

    fn fail_reads(&mut self, reason: &ProposeError) {
        let asked = self.reads.drain().map(|(_, (_, _, done))| done);
        let waiting = asked.chain(self.reads_to_apply.drain(..).map(|(_, done)| done));
        for done in waiting.chain(self.reads_deferred.drain(..).map(|(_, done)| done)) {
            let _ = done.send(Err(reason.clone()));
        }
    }

    /// The member stops: everyone waiting is answered with `reason`, and it is published as not leading.
    pub fn stop(&mut self, reason: &ProposeError) {
        self.fail_pending(reason);
        for (_, done) in self.forwarded.drain() {
            let _ = done.send(Err(reason.clone()));
        }
        self.fail_reads(reason);
        self.out.leader.send_modify(|s| s.is_leader = false);
        self.out.status.lock().is_leader = false;
    }
}

/// Encodes a snapshot's data: SwarmKit's `Snapshot` with the store and the membership.
pub(crate) fn encode_raft_snapshot(store: StoreSnapshot, members: &Members) -> Vec<u8> {
    shoal_api::Snapshot { version: 0, membership: Some(members.to_wire()), store: Some(store) }.encode_to_vec()
}

/// Decodes a snapshot's data; the membership is `None` in snapshots written before it was recorded.
fn decode_raft_snapshot(bytes: &[u8]) -> Result<(StoreSnapshot, Option<Members>), String> {
    let snap = shoal_api::Snapshot::decode(bytes).map_err(|e| e.to_string())?;
    Ok((snap.store.unwrap_or_default(), snap.membership.as_ref().map(Members::from_wire)))
}

/// The last entry to drop from the log after a snapshot at `index`: entries after it are kept for slow
/// followers, at most `keep_entries` of them and at most `keep_bytes` of data (`entry_bytes` holds the
/// (index, bytes) of the entries applied since this start, oldest first). The entry at `index` itself is
/// always kept, whatever its size, so a follower one entry behind needs no snapshot. Entries applied before
/// a restart, whose sizes are not known, are kept by count only (they were within the bounds then).
pub(crate) fn compact_point(index: u64, entry_bytes: &VecDeque<(u64, u64)>, keep_entries: u64, keep_bytes: u64) -> u64 {
    let by_entries = index.saturating_sub(keep_entries);
    let mut kept_bytes: u64 = 0;
    let mut first_kept = index.saturating_add(1);
    for (i, bytes) in entry_bytes.iter().rev().filter(|(i, _)| *i <= index) {
        if *i <= by_entries {
            return by_entries;
        }
        kept_bytes = kept_bytes.saturating_add(*bytes);
        if kept_bytes > keep_bytes && first_kept <= index {
            return first_kept - 1;
        }
        first_kept = *i;
    }
    by_entries
}

/// Applies one normal entry: an empty one (a leader's no-op) only advances the index; otherwise the
/// decoded actions are applied all-or-nothing. Returns the request ID (when decodable) and the outcome.
pub(crate) fn apply_normal(store: &MemoryStore, e: &Entry) -> (Option<u64>, Result<Arc<Commit>, StoreError>) {
    if e.data.is_empty() {
        store.advance_index(e.index);
        return (None, Ok(Arc::new(Commit { index: e.index, changes: Vec::new() })));
    }
    match decode_request(&e.data) {
        Ok((id, actions)) => (Some(id), store.apply(e.index, &actions)),
        Err(err) => {
            tracing::error!(index = e.index, error = %err, "undecodable raft entry skipped");
            store.advance_index(e.index);
            (None, Err(err))
        }
    }
}

/// Restores the store from the latest snapshot and replays the committed entries after it. Returns the
/// applied index and its term.
fn recover_store<S: LogStorage>(
    cfg: &RaftConfig,
    storage: &S,
    store: &MemoryStore,
    observer: &mut Option<ApplyObserver>,
) -> Result<(u64, u64), RaftError> {
    let meta = storage.snapshot_metadata().clone();
    let (mut applied, mut applied_term) = (0, 0);
    if meta.index > 0 {
        let bytes = storage.load_snapshot()?;
        let snap = decode_snapshot(&bytes).map_err(|e| RaftError::Damaged {
            path: storage.snapshot_path(meta.index),
            what: format!("snapshot {} cannot be decoded ({e})", meta.index),
        })?;
        store.restore(meta.index, snap);
        applied = meta.index;
        applied_term = meta.term;
    }
    let commit = storage.hard_state().commit;
    let mut low = applied + 1;
    while low <= commit {
        let high = (commit + 1).min(low + REPLAY_CHUNK_ENTRIES);
        for e in storage.read_entries(low, high)? {
            match e.get_entry_type() {
                EntryType::EntryNormal => {
                    let _ = apply_normal(store, &e);
                }
                // The membership they made was persisted when they were applied.
                EntryType::EntryConfChange | EntryType::EntryConfChangeV2 => store.advance_index(e.index),
            }
            if let Some(observe) = observer.as_mut() {
                observe(&e);
            }
            applied = e.index;
            applied_term = e.term;
        }
        low = high;
    }
    if applied > 0 {
        tracing::info!(raft_id = cfg.raft_id, applied, snapshot = meta.index, "raft state recovered");
    }
    Ok((applied, applied_term))
}
