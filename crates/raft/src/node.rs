//! `RaftNode`: the production `Proposer`. A cloneable handle talks over bounded channels to a driver that
//! owns the raft-rs `RawNode` and its raft-engine storage, on a dedicated OS thread (named `raft-<id>`)
//! running its own single-threaded tokio runtime: fsyncs block only that thread, never the caller's runtime.
//!
//! The driver loop: wait for a proposal, an inbound message, a tick or a stop; then handle every `Ready`:
//! persist entries + hard state (one fsync for all the entries of the Ready: group commit), send messages,
//! persist the new commit index, apply committed entries to the store, resolve the proposals they carry,
//! take a snapshot every `snapshot_interval_entries` or `snapshot_interval_bytes` (the log stays bounded in
//! bytes too: `compact_point`), and publish leadership.
//!
//! Membership: `add_member`/`remove_member` (leader only) propose a raft-rs `ConfChange` (v1) whose context
//! is the member's encoded `RaftMember` (ID, node ID, address); when applied, the conf state and the
//! addresses are persisted together and published to the transport. Adding a member also takes a snapshot
//! and compacts the log through at least its first entry, so a new member (whose log is empty) always
//! starts from a snapshot that already names it, never by replaying the log from an empty configuration.
//!
//! Follower writes: a follower with a `Forwarder` registers the request ID with its driver, forwards the
//! encoded request to the leader (which appends it), and resolves when its own store applies the entry
//! carrying that ID (read-your-writes), or after `FORWARD_APPLY_TIMEOUT` with `Unknown`.
//! Reads: `read_barrier` is Raft's ReadIndex (the leader confirms with a heartbeat round that it still leads;
//! a follower asks the leader), then waits for the local store to apply that commit index, so that a read of
//! the store on any member that follows it sees every write acknowledged before it began. Without a leader a
//! read waits at most two election timeouts for one, then fails with `NoLeader`.
//! Must not know services, tasks or subsystems: entries are opaque `encode_request` bytes for the store.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prost::Message as _;
use protobuf::Message as _;
use raft::eraftpb::{
    ConfChange, ConfChangeType, ConfChangeV2, ConfState, Entry, EntryType, Message, Snapshot, SnapshotMetadata,
};
use raft::{RawNode, SnapshotStatus, StateRole};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use shoal_api::StoreSnapshot;
use shoal_store::{decode_request, decode_snapshot, encode_request, Action, Commit, MemoryStore, StoreError};
use tokio::sync::{mpsc, oneshot, watch};

use crate::logger::raft_logger;
use crate::storage::{EngineStorage, REPLAY_CHUNK_ENTRIES};
use crate::transport::{Forwarder, Inbound, NoPeers, PeerLink, Transport};
use crate::{
    LeaderState, LogReadError, LoggedWrite, Member, Members, ProposeError, ProposeFuture, Proposer, RaftConfig,
    RaftError, ReadBarrierFuture,
};

/// Bound of the proposal queue between the handles and the driver. A proposer waits for room when it is full.
pub const PROPOSAL_QUEUE: usize = 4096;
/// Most proposals taken from the queue before the driver handles the resulting Ready (one group commit).
pub const MAX_PROPOSALS_PER_READY: usize = 1024;
/// Bound of the queue of messages received from peers; `step` fails with `RaftError::Busy` when full.
pub const INBOUND_QUEUE: usize = 1024;
/// Most inbound messages stepped before the driver handles the resulting Ready.
const MAX_MESSAGES_PER_READY: usize = 256;
/// Largest append message raft-rs builds for a follower, in bytes.
const MAX_SIZE_PER_MSG: u64 = 1 << 20;
/// Most in-flight append messages per follower.
const MAX_INFLIGHT_MSGS: usize = 256;
/// How long a follower waits, after the leader accepted its forwarded write, for its own store to apply it.
pub const FORWARD_APPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `add_member`/`remove_member` wait for the membership change to be applied.
pub const MEMBERSHIP_CHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most forwarded writes a follower waits for at once (further ones fail with `Unknown` at once).
pub const MAX_FORWARDED_IN_FLIGHT: usize = PROPOSAL_QUEUE;
/// How long a read barrier waits for the leader to confirm its commit index and for this store to apply it.
pub const READ_BARRIER_TIMEOUT: Duration = Duration::from_secs(5);
/// Most read barriers waiting at once (further ones fail at once).
pub const MAX_READS_IN_FLIGHT: usize = PROPOSAL_QUEUE;

/// How a node starts with respect to cluster membership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartMode {
    /// With no Raft state, bootstrap a new single-member cluster (this node the only voter, at `cfg.addr`);
    /// with state, recover it.
    BootstrapIfEmpty,
    /// A member just added by the leader (`add_member`): never bootstrap; record `members` (from the
    /// leader's answer) until the leader's snapshot arrives. With existing state, recover it instead.
    Join {
        /// The cluster's members as the leader reported them.
        members: Members,
    },
    /// Recover existing state only; never bootstrap (a joined member restarting).
    Restart,
    /// Disaster recovery when a quorum is lost for good: recover this member's state, then make it the only
    /// voter (every other member is recorded as removed) so it elects itself and takes writes again.
    /// Other managers must then be added again (join). Requires existing state.
    ForceNewCluster,
}

/// Why a membership change did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MembershipError {
    /// This manager is not the leader; membership changes are made by the leader.
    #[error("this manager is not the raft leader (leader: {}); send the request to the leader", leader_addr.as_deref().unwrap_or("unknown"))]
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

/// A snapshot of the node's Raft progress, for status displays and tests.
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

type Done = oneshot::Sender<Result<Arc<Commit>, ProposeError>>;

/// One proposal on its way to the driver.
struct Proposal {
    id: u64,
    data: Vec<u8>,
    done: Done,
    /// Told the log index once the entry is appended (forwarded proposals answer then).
    appended: Option<oneshot::Sender<u64>>,
}

/// What the handles ask of the driver.
enum Command {
    /// Re-seal the whole Raft state on disk with new data keys (`RaftNode::reencrypt`).
    Reencrypt {
        keys: crate::encryption::DataKeys,
        done: oneshot::Sender<Result<(), RaftError>>,
    },
    Propose(Proposal),
    ConfChange {
        cc: ConfChange,
        done: oneshot::Sender<Result<Members, ProposeError>>,
    },
    /// Resolve `done` when an entry carrying request `id` is applied (a write this follower forwarded).
    AwaitForwarded {
        id: u64,
        done: Done,
    },
    /// Resolve `done` once the store has applied the leader's commit index as of now (Raft ReadIndex).
    ReadIndex {
        done: ReadDone,
    },
    /// Read applied entries `[low, high)`, at most `max` of them, back from the log (`CommittedLog`).
    ReadLog {
        low: u64,
        high: u64,
        max: u64,
        done: oneshot::Sender<Result<Vec<LoggedWrite>, LogReadError>>,
    },
    /// Hand leadership to member `to` (`RaftNode::transfer_leadership`).
    TransferLeader {
        to: u64,
        done: oneshot::Sender<Result<(), MembershipError>>,
    },
    /// Apply the cluster's snapshot settings (`RaftNode::set_snapshot_policy`).
    SnapshotPolicy(crate::SnapshotPolicy),
}

type ReadDone = oneshot::Sender<Result<(), ProposeError>>;

/// A proposal appended to the log, waiting for its entry to be applied.
struct Pending {
    id: u64,
    done: oneshot::Sender<Result<Arc<Commit>, ProposeError>>,
}

struct Inner {
    raft_id: u64,
    max_proposal_bytes: usize,
    proposals: mpsc::Sender<Command>,
    inbound: mpsc::Sender<Inbound>,
    members: watch::Receiver<Members>,
    forwarder: Option<Arc<dyn Forwarder>>,
    /// Set to true to ask the driver to stop; dropping it (last handle gone) also stops the driver.
    stop: watch::Sender<bool>,
    /// Becomes true (or closes) once the driver has exited and released the files.
    stopped: watch::Receiver<bool>,
    leader: watch::Receiver<LeaderState>,
    status: Arc<Mutex<RaftStatus>>,
    reachable: Arc<Mutex<BTreeMap<u64, bool>>>,
    next_request_id: AtomicU64,
    shut: AtomicBool,
    synced_writes: Arc<AtomicU64>,
    /// Set while the driver is paused because the disk is full: the message that says so.
    disk_full: Arc<Mutex<Option<String>>>,
}

/// A Raft member whose log lives under `state_dir/raft`. Cheap to clone; all clones drive the same node.
/// Dropping the last clone stops the driver as `shutdown` would (without waiting for it).
#[derive(Clone)]
pub struct RaftNode {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RaftNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftNode").field("status", &self.status()).finish()
    }
}

impl RaftNode {
    /// Opens (or creates) the Raft state under `cfg.state_dir/raft`. Without state, bootstraps a new
    /// single-member cluster with `cfg.raft_id` as its only voter. With state, restores `store` (which must
    /// be empty) from the latest snapshot and replays the committed log entries into it before returning.
    /// The driver runs on a dedicated thread; a single-member cluster campaigns at once.
    pub async fn start(cfg: RaftConfig, store: Arc<MemoryStore>) -> Result<RaftNode, RaftError> {
        RaftNode::start_with_transport(cfg, store, Arc::new(NoPeers)).await
    }

    /// Like `start`, sending messages for peers through `transport`.
    pub async fn start_with_transport(
        cfg: RaftConfig,
        store: Arc<MemoryStore>,
        transport: Arc<dyn Transport>,
    ) -> Result<RaftNode, RaftError> {
        RaftNode::start_with(cfg, store, transport, None, StartMode::BootstrapIfEmpty).await
    }

    /// The general start: messages go through `transport`; when not the leader, writes are forwarded to
    /// the leader through `forwarder` (without one they fail with `NotLeader`); `mode` says whether to
    /// bootstrap, join or only recover. For joining a running cluster see `grpc::join_cluster`, which asks
    /// the leader's `RaftMembership.Join` for a Raft ID and then starts with `StartMode::Join`.
    pub async fn start_with(
        cfg: RaftConfig,
        store: Arc<MemoryStore>,
        transport: Arc<dyn Transport>,
        forwarder: Option<Arc<dyn Forwarder>>,
        mode: StartMode,
    ) -> Result<RaftNode, RaftError> {
        cfg.validate()?;
        let (prop_tx, prop_rx) = mpsc::channel(PROPOSAL_QUEUE);
        let (in_tx, in_rx) = mpsc::channel(INBOUND_QUEUE);
        let (stop_tx, stop_rx) = watch::channel(false);
        let (stopped_tx, stopped_rx) = watch::channel(false);
        let (leader_tx, leader_rx) = watch::channel(LeaderState::default());
        let (members_tx, members_rx) = watch::channel(Members::default());
        transport.attach(PeerLink { inbound: in_tx.clone(), members: members_rx.clone() });
        let status = Arc::new(Mutex::new(RaftStatus { id: cfg.raft_id, ..RaftStatus::default() }));
        let (ready_tx, ready_rx) = oneshot::channel::<Result<Arc<AtomicU64>, RaftError>>();

        let raft_id = cfg.raft_id;
        let max_proposal_bytes = cfg.max_proposal_bytes;
        let driver_status = status.clone();
        let disk_full = Arc::new(Mutex::new(None));
        let driver_disk_full = disk_full.clone();
        let reachable = Arc::new(Mutex::new(BTreeMap::new()));
        let driver_reachable = reachable.clone();
        std::thread::Builder::new()
            .name(format!("raft-{raft_id}"))
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread().enable_time().build() {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(RaftError::StateDir { path: cfg.state_dir.clone(), source: e }));
                        return;
                    }
                };
                let driver = match Driver::open(cfg, store, transport, leader_tx, members_tx, driver_status, mode) {
                    Ok(mut d) => {
                        d.reachable = driver_reachable;
                        // Paused already when it started on a full disk: the handle sees that too.
                        *driver_disk_full.lock() = d.disk_full.lock().clone();
                        d.disk_full = driver_disk_full;
                        d
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(driver.raw.store().synced_writes()));
                rt.block_on(driver.run(prop_rx, in_rx, stop_rx));
                // The driver (and with it the engine and its directory lock) is gone.
                let _ = stopped_tx.send(true);
            })
            .map_err(|e| RaftError::StateDir { path: std::path::PathBuf::from("<thread>"), source: e })?;

        let synced_writes = match ready_rx.await {
            Ok(Ok(counter)) => counter,
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(RaftError::Stopped),
        };
        // Request IDs only need to differ between this node's proposals in flight at one index; a base from
        // the wall clock keeps them distinct across restarts too (matching is by index, then ID).
        let base = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let next_request_id = ((raft_id & 0xffff) << 48) | (base & ((1 << 48) - 1));
        Ok(RaftNode {
            inner: Arc::new(Inner {
                raft_id,
                max_proposal_bytes,
                proposals: prop_tx,
                inbound: in_tx,
                members: members_rx,
                forwarder,
                stop: stop_tx,
                stopped: stopped_rx,
                leader: leader_rx,
                status,
                reachable,
                next_request_id: AtomicU64::new(next_request_id),
                shut: AtomicBool::new(false),
                synced_writes,
                disk_full,
            }),
        })
    }

    /// True when `state_dir/raft` shows this node was bootstrapped or joined before: a log file, the
    /// commit record or a snapshot. Then a start must recover (a missing or empty log is reported as
    /// damage by `start`, never taken for a new member).
    pub fn has_existing_state(state_dir: &Path) -> bool {
        crate::storage::has_raft_traces(state_dir)
    }

    /// Removes the Raft state under `state_dir` (log, snapshots, commit record, data key): a manager that
    /// left the Raft group for good (demoted) keeps none, so a later start is a worker's, and a later
    /// promotion joins under a new Raft ID. The node must not be running.
    pub fn remove_state(state_dir: &Path) -> std::io::Result<()> {
        let raft = state_dir.join("raft");
        match std::fs::remove_dir_all(&raft) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        }
        std::fs::File::open(state_dir).and_then(|d| d.sync_all())
    }

    /// Re-seals the log and the snapshots on disk with `keys` (a DEK rotation: `keys` holds the new current
    /// DEK and the older ones the present records were sealed with). Once it returns, no record sealed with
    /// an older DEK is left on disk and those DEKs may be forgotten.
    pub async fn reencrypt(&self, keys: crate::encryption::DataKeys) -> Result<(), RaftError> {
        let (done, rx) = oneshot::channel();
        self.inner.proposals.send(Command::Reencrypt { keys, done }).await.map_err(|_| RaftError::Stopped)?;
        rx.await.map_err(|_| RaftError::Stopped)?
    }

    /// Largest encoded proposal accepted, in bytes.
    pub fn max_proposal_bytes(&self) -> usize {
        self.inner.max_proposal_bytes
    }

    /// This member's Raft ID.
    pub fn id(&self) -> u64 {
        self.inner.raft_id
    }

    /// The node's Raft progress as of the last Ready handled.
    pub fn status(&self) -> RaftStatus {
        *self.inner.status.lock()
    }

    /// Why this member is paused, when its disk is full: the message naming the disk and what to do. It resumes
    /// by itself once there is space again (`None` then).
    pub fn disk_full(&self) -> Option<String> {
        self.inner.disk_full.lock().clone()
    }

    /// Applies the cluster's snapshot settings from now on (and at once: a snapshot is taken after the next
    /// write if the new interval has passed). Called on every manager when the cluster object changes.
    pub async fn set_snapshot_policy(&self, policy: crate::SnapshotPolicy) -> Result<(), RaftError> {
        self.inner.proposals.send(Command::SnapshotPolicy(policy)).await.map_err(|_| RaftError::Stopped)
    }

    /// Number of synced (fsync'd) writes to the Raft log since start. With group commit this grows by about
    /// two per batch of proposals, not per proposal.
    pub fn synced_writes(&self) -> u64 {
        self.inner.synced_writes.load(Ordering::Relaxed)
    }

    /// Feeds a message received from a peer. Fails with `Busy` when the inbound queue (`INBOUND_QUEUE`)
    /// is full (Raft retransmits) and `Stopped` after shutdown.
    pub fn step(&self, msg: Message) -> Result<(), RaftError> {
        self.inner.inbound.try_send(Inbound::Message(msg)).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => RaftError::Busy(INBOUND_QUEUE),
            mpsc::error::TrySendError::Closed(_) => RaftError::Stopped,
        })
    }

    /// Resolves once the driver has exited (after `shutdown`, after the last handle was dropped, or after
    /// a fatal storage error) and the Raft files are released.
    pub fn closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.inner.stopped.clone();
        async move {
            // An error means the driver thread ended without saying so (panic): it is gone either way.
            let _ = rx.wait_for(|s| *s).await;
        }
    }

    /// The current members and their addresses.
    pub fn members(&self) -> Members {
        self.inner.members.borrow().clone()
    }

    /// Membership changes, as a watch channel.
    pub fn members_watch(&self) -> watch::Receiver<Members> {
        self.inner.members.clone()
    }

    /// On the leader: whether each member (by Raft ID) was heard from within the last election timeout
    /// (the leader counts itself reachable). Empty on followers.
    pub fn reachable_members(&self) -> BTreeMap<u64, bool> {
        self.inner.reachable.lock().clone()
    }

    /// The leader's address, when a leader is known and its address too.
    pub fn leader_addr(&self) -> Option<String> {
        let leader = self.inner.leader.borrow().leader_id;
        self.inner.members.borrow().addr(leader).map(str::to_string)
    }

    fn not_leader(&self) -> MembershipError {
        MembershipError::NotLeader { leader_addr: self.leader_addr() }
    }

    /// Adds a voter at `addr` (leader only) with a fresh Raft ID; resolves once the change is applied here,
    /// with the new member's ID and the membership. The new member must then start with
    /// `StartMode::Join` under that ID; it receives a snapshot from the leader.
    pub async fn add_member(&self, addr: &str, node_id: &str) -> Result<(u64, Members), MembershipError> {
        let members = self.members();
        let raft_id = loop {
            let id: u64 = rand::random();
            if id != 0 && !members.members.contains_key(&id) && !members.removed.contains(&id) {
                break id;
            }
        };
        self.add_member_with_id(raft_id, addr, node_id).await
    }

    /// `add_member` with a chosen Raft ID (tests use it for repeatable IDs); refuses an ID in use or removed.
    pub async fn add_member_with_id(
        &self,
        raft_id: u64,
        addr: &str,
        node_id: &str,
    ) -> Result<(u64, Members), MembershipError> {
        if !self.inner.leader.borrow().is_leader {
            return Err(self.not_leader());
        }
        if addr.is_empty() {
            return Err(MembershipError::Refused(
                "the joining manager sent no address; set its advertise address".into(),
            ));
        }
        let mut members = self.members();
        if let Some(m) = members.members.values().find(|m| m.addr == addr).cloned() {
            // A member that lost its state and comes back at the same address: if the old member is not
            // heard from (a dead or wiped manager), replace it; a live one is never displaced.
            let alive = self.reachable_members().get(&m.raft_id).copied().unwrap_or(true);
            if alive || m.raft_id == self.inner.raft_id {
                return Err(MembershipError::Refused(format!(
                    "a running manager at {addr} is already a member (raft id {:x}); stop it, or remove it first, or use another address",
                    m.raft_id
                )));
            }
            tracing::info!(
                old = format_args!("{:x}", m.raft_id),
                addr,
                "replacing an unreachable member at the joining address"
            );
            members = self.remove_member(m.raft_id).await?;
        }
        if raft_id == 0 || members.members.contains_key(&raft_id) || members.removed.contains(&raft_id) {
            return Err(MembershipError::Refused(format!("raft id {raft_id:x} is in use, was removed, or is zero")));
        }
        let member = Member { raft_id, node_id: node_id.to_string(), addr: addr.to_string() };
        let mut cc = ConfChange::default();
        cc.set_change_type(ConfChangeType::AddNode);
        cc.node_id = raft_id;
        cc.context = member.encode().into();
        let members = self.change_membership(cc).await?;
        tracing::info!(raft_id = format_args!("{raft_id:x}"), addr, "raft member added");
        Ok((raft_id, members))
    }

    /// Changes member `raft_id`'s address (leader only): a manager restarted with a new advertised address
    /// (SwarmKit's `updateNode`, its issue #642). The change is a conf change that adds the voter again with
    /// the new address in its context, so every member, and every later snapshot, has it. Resolves once
    /// applied here; nothing changes when the address is already the member's.
    pub async fn update_member_addr(&self, raft_id: u64, addr: &str) -> Result<Members, MembershipError> {
        if !self.inner.leader.borrow().is_leader {
            return Err(self.not_leader());
        }
        if addr.is_empty() {
            return Err(MembershipError::Refused("no address given; set the manager's advertise address".into()));
        }
        let members = self.members();
        let Some(current) = members.members.get(&raft_id).cloned() else {
            return Err(MembershipError::Refused(format!("raft id {raft_id:x} is not a member")));
        };
        if current.addr == addr {
            return Ok(members);
        }
        if let Some(other) = members.members.values().find(|m| m.addr == addr && m.raft_id != raft_id) {
            return Err(MembershipError::Refused(format!(
                "{addr} is the address of another member (raft id {:x}); pick an address of this manager's own",
                other.raft_id
            )));
        }
        let member = Member { raft_id, node_id: current.node_id.clone(), addr: addr.to_string() };
        let mut cc = ConfChange::default();
        cc.set_change_type(ConfChangeType::AddNode);
        cc.node_id = raft_id;
        cc.context = member.encode().into();
        let members = self.change_membership(cc).await?;
        tracing::info!(raft_id = format_args!("{raft_id:x}"), from = %current.addr, to = addr, "raft member address changed");
        Ok(members)
    }

    /// Hands leadership to member `to` (leader only; Raft thesis 3.10): `to` is brought up to date and then
    /// campaigns at once. Resolves once the transfer has started; the leadership watch shows its outcome
    /// (raft-rs abandons a transfer that has not finished within an election timeout).
    pub async fn transfer_leadership(&self, to: u64) -> Result<(), MembershipError> {
        if !self.inner.leader.borrow().is_leader {
            return Err(self.not_leader());
        }
        let (done, rx) = oneshot::channel();
        self.inner.proposals.send(Command::TransferLeader { to, done }).await.map_err(|_| ProposeError::Stopped)?;
        rx.await.map_err(|_| ProposeError::Stopped)?
    }

    /// Whether removing member `raft_id` leaves the other members a reachable quorum (SwarmKit's
    /// `CanRemoveMember`): counted on the leader, which counts itself reachable; `false` elsewhere.
    pub fn removal_keeps_quorum(&self, raft_id: u64) -> bool {
        let members = self.members();
        let reachable = self.reachable_members();
        let remaining: Vec<u64> = members.members.keys().copied().filter(|id| *id != raft_id).collect();
        let alive = remaining.iter().filter(|id| reachable.get(id).copied().unwrap_or(false)).count();
        !remaining.is_empty() && alive > remaining.len() / 2
    }

    /// Removes member `raft_id` (leader only; the leader cannot remove itself). Resolves once applied here.
    pub async fn remove_member(&self, raft_id: u64) -> Result<Members, MembershipError> {
        if !self.inner.leader.borrow().is_leader {
            return Err(self.not_leader());
        }
        if raft_id == self.inner.raft_id {
            return Err(MembershipError::Refused(
                "this manager is the leader and cannot remove itself; stop it so another manager leads, then remove it from there".into(),
            ));
        }
        let members = self.members();
        if !members.members.contains_key(&raft_id) {
            return Err(MembershipError::Refused(format!("raft id {raft_id:x} is not a member")));
        }
        if members.members.len() <= 1 {
            return Err(MembershipError::Refused("cannot remove the last member".into()));
        }
        let mut cc = ConfChange::default();
        cc.set_change_type(ConfChangeType::RemoveNode);
        cc.node_id = raft_id;
        let members = self.change_membership(cc).await?;
        tracing::info!(raft_id = format_args!("{raft_id:x}"), "raft member removed");
        Ok(members)
    }

    async fn change_membership(&self, cc: ConfChange) -> Result<Members, MembershipError> {
        let (done, rx) = oneshot::channel();
        self.inner.proposals.send(Command::ConfChange { cc, done }).await.map_err(|_| ProposeError::Stopped)?;
        match tokio::time::timeout(MEMBERSHIP_CHANGE_TIMEOUT, rx).await {
            Ok(Ok(r)) => Ok(r?),
            Ok(Err(_)) => Err(ProposeError::Stopped.into()),
            Err(_) => Err(ProposeError::Unknown(format!(
                "the membership change was not applied within {MEMBERSHIP_CHANGE_TIMEOUT:?} (is a quorum reachable?)"
            ))
            .into()),
        }
    }

    /// Leader side of a forwarded write: appends `request` (an encoded `InternalRaftRequest`) and answers
    /// with its log index once appended. The follower learns the outcome by applying the entry itself.
    pub async fn propose_forwarded(&self, request: Vec<u8>) -> Result<u64, ProposeError> {
        let inner = &self.inner;
        if inner.shut.load(Ordering::SeqCst) {
            return Err(ProposeError::Stopped);
        }
        if let Some(msg) = inner.disk_full.lock().clone() {
            return Err(ProposeError::DiskFull(msg));
        }
        let state = *inner.leader.borrow();
        if !state.is_leader {
            return Err(ProposeError::NotLeader { leader: (state.leader_id != 0).then_some(state.leader_id) });
        }
        if request.len() > inner.max_proposal_bytes {
            return Err(ProposeError::TooLarge { size: request.len(), limit: inner.max_proposal_bytes });
        }
        let (id, _) = decode_request(&request)?;
        let (done, done_rx) = oneshot::channel();
        let (appended, appended_rx) = oneshot::channel();
        inner
            .proposals
            .send(Command::Propose(Proposal { id, data: request, done, appended: Some(appended) }))
            .await
            .map_err(|_| ProposeError::Stopped)?;
        match appended_rx.await {
            Ok(index) => Ok(index),
            Err(_) => match done_rx.await {
                Ok(Err(e)) => Err(e),
                _ => Err(ProposeError::Stopped),
            },
        }
    }

    /// Stops the driver: pending proposals resolve with `Stopped`, the log is flushed and its files
    /// released. After it returns, `propose` fails with `Stopped`.
    pub async fn shutdown(&self) {
        self.inner.shut.store(true, Ordering::SeqCst);
        self.inner.stop.send_replace(true);
        self.closed().await;
    }
}

impl Proposer for RaftNode {
    fn propose(&self, actions: Vec<Action>) -> ProposeFuture {
        let inner = &self.inner;
        if inner.shut.load(Ordering::SeqCst) {
            return Box::pin(async { Err(ProposeError::Stopped) });
        }
        if let Some(msg) = inner.disk_full.lock().clone() {
            return Box::pin(async move { Err(ProposeError::DiskFull(msg)) });
        }
        let state = *inner.leader.borrow();
        let id = inner.next_request_id.fetch_add(1, Ordering::Relaxed);
        let data = encode_request(id, &actions);
        if data.len() > inner.max_proposal_bytes {
            let (size, limit) = (data.len(), inner.max_proposal_bytes);
            return Box::pin(async move { Err(ProposeError::TooLarge { size, limit }) });
        }
        let tx = inner.proposals.clone();
        if !state.is_leader {
            let Some(forwarder) = inner.forwarder.clone() else {
                let leader = (state.leader_id != 0).then_some(state.leader_id);
                return Box::pin(async move { Err(ProposeError::NotLeader { leader }) });
            };
            let leader_addr = if state.leader_id == 0 {
                Err("no manager is the raft leader right now (an election is under way or no quorum is reachable)"
                    .to_string())
            } else if state.leader_id == inner.raft_id {
                Err("this manager was just elected and is catching up".to_string())
            } else {
                inner.members.borrow().addr(state.leader_id).map(str::to_string).ok_or_else(|| {
                    format!("the address of the leader (raft id {:x}) is not known to this manager", state.leader_id)
                })
            };
            return Box::pin(async move {
                let addr = leader_addr.map_err(ProposeError::NoLeader)?;
                let (done, rx) = oneshot::channel();
                tx.send(Command::AwaitForwarded { id, done }).await.map_err(|_| ProposeError::Stopped)?;
                forwarder.forward(&addr, data).await?;
                match tokio::time::timeout(FORWARD_APPLY_TIMEOUT, rx).await {
                    Ok(r) => r.unwrap_or(Err(ProposeError::Stopped)),
                    Err(_) => Err(ProposeError::Unknown(format!(
                        "the leader accepted the write but this manager did not apply it within {FORWARD_APPLY_TIMEOUT:?}"
                    ))),
                }
            });
        }
        Box::pin(async move {
            let (done, rx) = oneshot::channel();
            tx.send(Command::Propose(Proposal { id, data, done, appended: None }))
                .await
                .map_err(|_| ProposeError::Stopped)?;
            // A dropped sender means the driver stopped before answering.
            rx.await.unwrap_or(Err(ProposeError::Stopped))
        })
    }

    fn leadership(&self) -> watch::Receiver<LeaderState> {
        self.inner.leader.clone()
    }

    /// Raft ReadIndex: the leader confirms it still leads (a heartbeat round with a quorum) and names its
    /// commit index; this member (leader or follower) answers once its store has applied that index. Fails
    /// with `NoLeader` without a leader, or after `READ_BARRIER_TIMEOUT` (a leader cut off from its quorum
    /// never confirms).
    fn read_barrier(&self) -> ReadBarrierFuture {
        let inner = &self.inner;
        if inner.shut.load(Ordering::SeqCst) {
            return Box::pin(async { Err(ProposeError::Stopped) });
        }
        if let Some(msg) = inner.disk_full.lock().clone() {
            return Box::pin(async move { Err(ProposeError::DiskFull(msg)) });
        }
        let tx = inner.proposals.clone();
        Box::pin(async move {
            let (done, rx) = oneshot::channel();
            tx.send(Command::ReadIndex { done }).await.map_err(|_| ProposeError::Stopped)?;
            match tokio::time::timeout(READ_BARRIER_TIMEOUT, rx).await {
                Ok(r) => r.unwrap_or(Err(ProposeError::Stopped)),
                Err(_) => Err(ProposeError::NoLeader(format!(
                    "the leader did not confirm its commit index within {READ_BARRIER_TIMEOUT:?}"
                ))),
            }
        })
    }

    fn unhealthy(&self) -> Option<String> {
        self.disk_full()
    }
}

impl crate::CommittedLog for RaftNode {
    fn read_committed(&self, low: u64, high: u64, max_entries: u64) -> crate::LogReadFuture {
        let tx = self.inner.proposals.clone();
        Box::pin(async move {
            let (done, rx) = oneshot::channel();
            tx.send(Command::ReadLog { low, high, max: max_entries, done }).await.map_err(|_| LogReadError::Stopped)?;
            rx.await.unwrap_or(Err(LogReadError::Stopped))
        })
    }
}

/// Why the driver loop ended.
enum Exit {
    /// `shutdown` was called or every handle was dropped.
    Stopped,
    /// Storage failed; the node cannot continue.
    Failed(RaftError),
}

/// Owns the raft-rs node and its storage; runs on the driver thread.
struct Driver {
    cfg: RaftConfig,
    raw: RawNode<EngineStorage>,
    store: Arc<MemoryStore>,
    transport: Arc<dyn Transport>,
    /// Proposals appended to the log, by index.
    pending: BTreeMap<u64, Pending>,
    /// Membership changes appended to the log, by index.
    conf_pending: BTreeMap<u64, oneshot::Sender<Result<Members, ProposeError>>>,
    /// Writes this node forwarded to the leader, by request ID (at most `MAX_FORWARDED_IN_FLIGHT`).
    forwarded: HashMap<u64, Done>,
    /// Read barriers waiting for their read index, by context (at most `MAX_READS_IN_FLIGHT`), with the
    /// leader asked and when.
    reads: HashMap<u64, (u64, Instant, ReadDone)>,
    /// Read barriers whose read index is known, waiting for the store to apply it.
    reads_to_apply: Vec<(u64, ReadDone)>,
    /// Read barriers waiting for a leader to ask, since when.
    reads_deferred: Vec<(Instant, ReadDone)>,
    next_read_ctx: u64,
    /// Take a snapshot after this Ready (a member was added).
    force_snapshot: bool,
    leader_tx: watch::Sender<LeaderState>,
    members_tx: watch::Sender<Members>,
    /// Published on the leader: members heard from recently.
    reachable: Arc<Mutex<BTreeMap<u64, bool>>>,
    status: Arc<Mutex<RaftStatus>>,
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
    entry_bytes: std::collections::VecDeque<(u64, u64)>,
    /// Set while the disk is full (`pause`): raft-rs is neither ticked nor stepped, and writes are refused.
    paused: Option<Paused>,
    /// The handle's copy of the pause message (`RaftNode::disk_full`).
    disk_full: Arc<Mutex<Option<String>>>,
}

/// How often a paused driver checks whether space came back.
const DISK_PROBE_EVERY: Duration = Duration::from_secs(1);

/// What a driver paused by a full disk knows: the failed write, and when to look for space again.
struct Paused {
    path: std::path::PathBuf,
    mount: std::path::PathBuf,
    reason: String,
    message: String,
    next_probe: Instant,
}

impl Paused {
    fn error(&self) -> RaftError {
        RaftError::DiskFull { path: self.path.clone(), mount: self.mount.clone(), reason: self.reason.clone() }
    }
}

/// raft-rs's configuration of this member, recovered with `applied` entries applied to the store.
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

/// Whether this member is the only voter (it then campaigns as soon as it starts).
fn is_single_voter(storage: &EngineStorage, raft_id: u64) -> bool {
    let cs = storage.conf_state();
    cs.voters == [raft_id] && cs.learners.is_empty() && cs.voters_outgoing.is_empty()
}

/// Writes `bytes` zero bytes to `path` and fsyncs them, then removes the file: whether the filesystem has
/// that much space for the log again.
fn probe_space(path: &Path, bytes: u64) -> std::io::Result<()> {
    use std::io::Write;
    let written = (|| {
        let mut f = std::fs::File::create(path)?;
        let chunk = vec![0u8; 64 << 10];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            f.write_all(&chunk[..n])?;
            left -= n as u64;
        }
        f.sync_all()
    })();
    let removed = std::fs::remove_file(path);
    written?;
    removed
}

impl Driver {
    /// Opens the storage, bootstraps or recovers the store, builds the raft-rs node and, for a
    /// single-member cluster, wins the election.
    fn open(
        cfg: RaftConfig,
        store: Arc<MemoryStore>,
        transport: Arc<dyn Transport>,
        leader_tx: watch::Sender<LeaderState>,
        members_tx: watch::Sender<Members>,
        status: Arc<Mutex<RaftStatus>>,
        mode: StartMode,
    ) -> Result<Driver, RaftError> {
        let keys = match &cfg.data_keys {
            Some(keys) => keys.clone(),
            None => crate::encryption::load_or_create_plain(&cfg.state_dir)?,
        };
        let (mut storage, bootstrapped) = EngineStorage::open(&cfg.state_dir, keys)?;
        if !bootstrapped {
            match mode {
                StartMode::BootstrapIfEmpty => {
                    tracing::info!(raft_id = cfg.raft_id, "bootstrapping a new single-member raft cluster");
                    let me = Member { raft_id: cfg.raft_id, node_id: cfg.node_id.clone(), addr: cfg.addr.clone() };
                    let members = Members { members: [(cfg.raft_id, me)].into(), ..Members::default() };
                    storage.bootstrap(ConfState { voters: vec![cfg.raft_id], ..ConfState::default() }, members)?;
                }
                StartMode::Join { members } => {
                    tracing::info!(raft_id = cfg.raft_id, "joining a raft cluster; waiting for the leader's snapshot");
                    storage.set_members(members)?;
                }
                StartMode::Restart => {
                    tracing::info!(raft_id = cfg.raft_id, "no raft membership recorded yet; waiting for the leader");
                }
                StartMode::ForceNewCluster => {
                    return Err(RaftError::InvalidConfig(
                        "force-new-cluster needs an existing raft state to recover; start without it to create a new cluster".into(),
                    ));
                }
            }
        } else if mode == StartMode::ForceNewCluster {
            let old = storage.members().clone();
            let me = old.members.get(&cfg.raft_id).cloned().unwrap_or_else(|| Member {
                raft_id: cfg.raft_id,
                node_id: cfg.node_id.clone(),
                addr: cfg.addr.clone(),
            });
            let mut members = Members { members: [(cfg.raft_id, me)].into(), removed: old.removed.clone() };
            let others = old
                .members
                .keys()
                .chain(storage.conf_state().voters.iter())
                .chain(storage.conf_state().learners.iter());
            members.removed.extend(others.copied().filter(|id| *id != cfg.raft_id));
            tracing::warn!(
                raft_id = cfg.raft_id,
                removed = ?members.removed,
                "forcing a new cluster: this manager becomes the only raft member"
            );
            storage.set_membership(ConfState { voters: vec![cfg.raft_id], ..ConfState::default() }, members)?;
        }
        // A lone member records its current address (state written before addresses were recorded, or a
        // new advertise address): joining managers learn it from the membership.
        let lone = storage.conf_state().voters == [cfg.raft_id] && storage.conf_state().learners.is_empty();
        if lone && !cfg.addr.is_empty() && storage.members().addr(cfg.raft_id) != Some(cfg.addr.as_str()) {
            let mut members = storage.members().clone();
            let node_id = members.members.get(&cfg.raft_id).map(|m| m.node_id.clone()).unwrap_or_default();
            let node_id = if node_id.is_empty() { cfg.node_id.clone() } else { node_id };
            members.members.insert(cfg.raft_id, Member { raft_id: cfg.raft_id, node_id, addr: cfg.addr.clone() });
            let cs = storage.conf_state().clone();
            storage.set_membership(cs, members)?;
        }
        members_tx.send_replace(storage.members().clone());
        let (applied, applied_term) = recover_store(&cfg, &storage, &store)?;
        let last_snapshot_index = storage.snapshot_metadata().index;
        let single_voter = is_single_voter(&storage, cfg.raft_id);
        // A probe a stop interrupted (`probe_space`).
        let _ = std::fs::remove_file(space_probe_path(&cfg));
        let raft_cfg = raft_config(&cfg, applied);
        raft_cfg.validate()?;
        let raw = RawNode::new(&raft_cfg, storage, &raft_logger(cfg.raft_id))?;
        let mut driver = Driver {
            rng: SmallRng::seed_from_u64(election_rng_seed(cfg.raft_id)),
            cfg,
            raw,
            store,
            transport,
            pending: BTreeMap::new(),
            conf_pending: BTreeMap::new(),
            forwarded: HashMap::new(),
            reads: HashMap::new(),
            reads_to_apply: Vec::new(),
            reads_deferred: Vec::new(),
            next_read_ctx: 0,
            force_snapshot: false,
            leader_tx,
            members_tx,
            reachable: Arc::new(Mutex::new(BTreeMap::new())),
            status,
            role_term: None,
            applied,
            applied_term,
            last_snapshot_index,
            bytes_since_snapshot: 0,
            entry_bytes: std::collections::VecDeque::new(),
            paused: None,
            disk_full: Arc::new(Mutex::new(None)),
        };
        driver.reseed_election_timeout();
        if single_voter {
            driver.raw.campaign()?;
            driver.reseed_election_timeout();
        }
        match driver.handle_ready() {
            Ok(()) => Ok(driver),
            // Started on a full disk: paused at once, resumed when space comes.
            Err(e) if e.is_disk_full() => {
                driver.pause(e);
                Ok(driver)
            }
            Err(e) => Err(e),
        }
    }

    /// Pauses the node on a full disk (`e` is `RaftError::DiskFull`). What failed to be written is dropped with
    /// raft-rs's in-memory state (rebuilt from the storage by `resume`): the storage changes only on a write
    /// that succeeded, and every write the node depends on is made before anything that depends on it, so
    /// nothing unwritten was sent, applied or acknowledged. Every caller waiting is answered now: a write whose
    /// entry never reached the log is refused (`DiskFull`: not applied); one whose entry is in the log may
    /// still be committed (`Unknown`). Until `resume`, raft-rs is neither ticked nor stepped (a leader's
    /// followers elect another leader), writes and reads are refused with the message, and it is published as
    /// not leading.
    fn pause(&mut self, e: RaftError) {
        let RaftError::DiskFull { path, mount, reason } = &e else {
            debug_assert!(false, "pause is for a full disk only: {e}");
            return;
        };
        let message = e.to_string();
        tracing::error!(raft_id = self.cfg.raft_id, "{message}");
        let in_log = raft::Storage::last_index(self.raw.store()).unwrap_or(0);
        let refused = ProposeError::DiskFull(message.clone());
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
        let asked = self.reads.drain().map(|(_, (_, _, done))| done);
        let waiting = asked.chain(self.reads_to_apply.drain(..).map(|(_, done)| done));
        for done in waiting.chain(self.reads_deferred.drain(..).map(|(_, done)| done)) {
            let _ = done.send(Err(refused.clone()));
        }
        self.force_snapshot = false;
        self.reachable.lock().clear();
        let term = self.raw.raft.term;
        self.leader_tx.send_replace(LeaderState { is_leader: false, term, leader_id: 0 });
        {
            let mut st = self.status.lock();
            st.is_leader = false;
            st.leader_id = 0;
        }
        *self.disk_full.lock() = Some(message.clone());
        self.paused = Some(Paused {
            path: path.clone(),
            mount: mount.clone(),
            reason: reason.clone(),
            message,
            next_probe: Instant::now() + DISK_PROBE_EVERY,
        });
    }

    /// While paused: whether space came back (checked every `DISK_PROBE_EVERY` by writing
    /// `RESUME_FREE_BYTES` to a probe file), and the storage is ready for `resume` (its commit index covers
    /// what the store applied, which raft-rs requires of a restart).
    fn space_is_back(&mut self) -> bool {
        let Some(paused) = self.paused.as_mut() else { return false };
        if Instant::now() < paused.next_probe {
            return false;
        }
        paused.next_probe = Instant::now() + DISK_PROBE_EVERY;
        if let Err(e) = probe_space(&space_probe_path(&self.cfg), crate::error::RESUME_FREE_BYTES) {
            tracing::debug!(error = %e, "the raft state's disk is still full");
            return false;
        }
        if self.raw.store().hard_state().commit < self.applied {
            if let Err(e) = self.raw.mut_store().set_commit(self.applied) {
                tracing::debug!(error = %e, "the raft state's disk is still full");
                return false;
            }
        }
        true
    }

    /// Leaves the pause: raft-rs is rebuilt from the storage (what is on disk) with the applied index the
    /// store holds, as a restart would, and the node goes on (a lone member campaigns again at once; others
    /// follow the leader they hear from). Fails only if raft-rs refuses the storage (then the node stops).
    fn resume(mut self) -> Result<Driver, RaftError> {
        let paused_for = self.paused.take().map(|p| p.message);
        let storage = self.raw.raft.r.raft_log.store;
        let raft_cfg = raft_config(&self.cfg, self.applied);
        let raw = RawNode::new(&raft_cfg, storage, &raft_logger(self.cfg.raft_id))?;
        let mut d = Driver { raw, ..self };
        d.role_term = None;
        d.reseed_election_timeout();
        if is_single_voter(d.raw.store(), d.cfg.raft_id) {
            d.raw.campaign()?;
            d.reseed_election_timeout();
        }
        match d.handle_ready() {
            Ok(()) => {
                *d.disk_full.lock() = None;
                tracing::info!(
                    raft_id = d.cfg.raft_id,
                    paused_for = paused_for.as_deref().unwrap_or_default(),
                    "the raft state's disk has space again: raft resumed"
                );
                Ok(d)
            }
            Err(e) if e.is_disk_full() => {
                d.pause(e);
                Ok(d)
            }
            Err(e) => Err(e),
        }
    }

    async fn run(
        mut self,
        mut proposals: mpsc::Receiver<Command>,
        mut inbound: mpsc::Receiver<Inbound>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut ticker = tokio::time::interval(Duration::from_millis(self.cfg.tick_interval_ms));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut inbound_open = true;
        let exit = loop {
            tokio::select! {
                biased;
                // A value change is a shutdown; an error means every handle was dropped.
                _ = stop.changed() => break Exit::Stopped,
                p = proposals.recv() => match p {
                    Some(p) => {
                        self.command(p);
                        for _ in 1..MAX_PROPOSALS_PER_READY {
                            match proposals.try_recv() {
                                Ok(p) => self.command(p),
                                Err(_) => break,
                            }
                        }
                    }
                    None => break Exit::Stopped,
                },
                m = inbound.recv(), if inbound_open => match m {
                    Some(m) => {
                        // Commands queued before these messages arrived go first: a forwarded write's
                        // registration must precede the entry that answers it.
                        for _ in 0..MAX_PROPOSALS_PER_READY {
                            match proposals.try_recv() {
                                Ok(p) => self.command(p),
                                Err(_) => break,
                            }
                        }
                        self.step(m);
                        for _ in 1..MAX_MESSAGES_PER_READY {
                            match inbound.try_recv() {
                                Ok(m) => self.step(m),
                                Err(_) => break,
                            }
                        }
                    }
                    None => inbound_open = false,
                },
                _ = ticker.tick(), if self.paused.is_some() || self.needs_ticks() => {
                    if self.paused.is_none() {
                        self.raw.tick();
                    }
                }
            }
            if self.paused.is_some() {
                if self.space_is_back() {
                    let (raft_id, disk_full) = (self.cfg.raft_id, self.disk_full.clone());
                    match self.resume() {
                        Ok(d) => self = d,
                        Err(e) => {
                            tracing::error!(raft_id, error = %e, "raft could not resume after the disk was full, and stopped");
                            *disk_full.lock() = Some(format!(
                                "raft could not resume after the disk was full ({e}); restart this manager"
                            ));
                            return;
                        }
                    }
                }
                continue;
            }
            self.reseed_election_timeout();
            match self.handle_ready() {
                Ok(()) => {}
                Err(e) if e.is_disk_full() => self.pause(e),
                Err(e) => break Exit::Failed(e),
            }
        };
        let reason = match exit {
            Exit::Stopped => {
                tracing::info!(raft_id = self.cfg.raft_id, "raft node stopping");
                ProposeError::Stopped
            }
            Exit::Failed(e) => {
                tracing::error!(raft_id = self.cfg.raft_id, error = %e, "raft node failed and stopped");
                ProposeError::Unknown(format!("the raft node failed: {e}"))
            }
        };
        self.fail_pending(&reason);
        for (_, done) in self.forwarded.drain() {
            let _ = done.send(Err(reason.clone()));
        }
        let asked = self.reads.drain().map(|(_, (_, _, done))| done);
        for done in asked.chain(self.reads_to_apply.drain(..).map(|(_, done)| done)) {
            let _ = done.send(Err(reason.clone()));
        }
        for (_, done) in self.reads_deferred.drain(..) {
            let _ = done.send(Err(reason.clone()));
        }
        // Everything acknowledged was synced already; this makes the last non-synced writes (log
        // compaction) durable too.
        if let Err(e) = self.raw.store().sync() {
            tracing::warn!(error = %e, "final raft log flush failed");
        }
        self.leader_tx.send_modify(|s| s.is_leader = false);
        self.status.lock().is_leader = false;
    }

    fn command(&mut self, c: Command) {
        let c = match (&self.paused, c) {
            (None, c) => c,
            (Some(p), Command::Propose(prop)) => {
                let _ = prop.done.send(Err(ProposeError::DiskFull(p.message.clone())));
                return;
            }
            (Some(p), Command::ConfChange { done, .. }) => {
                let _ = done.send(Err(ProposeError::DiskFull(p.message.clone())));
                return;
            }
            (Some(p), Command::AwaitForwarded { done, .. }) => {
                let _ = done.send(Err(ProposeError::DiskFull(p.message.clone())));
                return;
            }
            (Some(p), Command::ReadIndex { done }) => {
                let _ = done.send(Err(ProposeError::DiskFull(p.message.clone())));
                return;
            }
            (Some(p), Command::TransferLeader { done, .. }) => {
                let _ = done.send(Err(MembershipError::Failed(ProposeError::DiskFull(p.message.clone()))));
                return;
            }
            (Some(p), Command::Reencrypt { done, .. }) => {
                let _ = done.send(Err(p.error()));
                return;
            }
            (Some(_), c @ (Command::ReadLog { .. } | Command::SnapshotPolicy(_))) => c,
        };
        match c {
            Command::SnapshotPolicy(policy) => {
                let before = (
                    self.cfg.snapshot_interval_entries,
                    self.cfg.keep_old_snapshots,
                    self.cfg.log_entries_for_slow_followers,
                );
                policy.apply_to(&mut self.cfg);
                let after = (
                    self.cfg.snapshot_interval_entries,
                    self.cfg.keep_old_snapshots,
                    self.cfg.log_entries_for_slow_followers,
                );
                if before != after {
                    tracing::info!(
                        raft_id = self.cfg.raft_id,
                        snapshot_interval = policy.interval_entries,
                        keep_old_snapshots = policy.keep_old_snapshots,
                        log_entries_for_slow_followers = policy.log_entries_for_slow_followers,
                        "raft snapshot settings applied"
                    );
                }
            }
            Command::Reencrypt { keys, done } => {
                let result = self.raw.mut_store().reencrypt(&self.cfg.state_dir, keys);
                let _ = done.send(result);
            }
            Command::Propose(p) => self.propose(p),
            Command::ConfChange { cc, done } => self.propose_conf_change(cc, done),
            Command::AwaitForwarded { id, done } => {
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
            Command::ReadIndex { done } => self.read_index(done),
            Command::ReadLog { low, high, max, done } => {
                let _ = done.send(self.read_log(low, high, max));
            }
            Command::TransferLeader { to, done } => {
                let r = if self.raw.raft.state != StateRole::Leader {
                    Err(MembershipError::Refused(
                        "this manager is not the leader: it has no leadership to hand over".into(),
                    ))
                } else if !self.raw.raft.prs().conf().voters().contains(to) || to == self.cfg.raft_id {
                    Err(MembershipError::Refused(format!("raft id {to:x} is not another voting member")))
                } else {
                    self.raw.transfer_leader(to);
                    Ok(())
                };
                let _ = done.send(r);
            }
        }
    }

    /// Applied entries `[low, min(high, applied + 1, low + max))` decoded into writes; the decodable normal
    /// entries with data only. Runs on the driver thread: `max` bounds how long it holds the loop.
    fn read_log(&self, low: u64, high: u64, max: u64) -> Result<Vec<LoggedWrite>, LogReadError> {
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
    /// bounds the whole wait.
    fn read_index(&mut self, done: ReadDone) {
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
            self.reads_deferred.push((Instant::now(), done));
            return;
        }
        let leader = self.raw.raft.leader_id;
        self.next_read_ctx += 1;
        self.raw.read_index(self.next_read_ctx.to_be_bytes().to_vec());
        self.reads.insert(self.next_read_ctx, (leader, Instant::now(), done));
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
    fn retry_deferred_reads(&mut self) {
        let leader = self.raw.raft.leader_id;
        if self.reads.values().any(|(asked, _, _)| *asked != leader) {
            let stale: Vec<u64> =
                self.reads.iter().filter(|(_, (asked, _, _))| *asked != leader).map(|(k, _)| *k).collect();
            for k in stale {
                if let Some((_, _, done)) = self.reads.remove(&k) {
                    self.reads_deferred.push((Instant::now(), done));
                }
            }
        }
        let reask = self.leaderless_read_wait() / 2;
        if self.can_ask_read_index() && self.reads.values().any(|(_, at, _)| at.elapsed() >= reask) {
            for (ctx, (_, at, _)) in self.reads.iter_mut().filter(|(_, (_, at, _))| at.elapsed() >= reask) {
                *at = Instant::now();
                self.raw.read_index(ctx.to_be_bytes().to_vec());
            }
        }
        if self.reads_deferred.is_empty() {
            return;
        }
        if self.can_ask_read_index() {
            for (_, done) in std::mem::take(&mut self.reads_deferred) {
                if !done.is_closed() {
                    self.read_index(done);
                }
            }
            return;
        }
        let wait = self.leaderless_read_wait();
        let (expired, waiting): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.reads_deferred).into_iter().partition(|(since, _)| since.elapsed() >= wait);
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

    fn propose_conf_change(&mut self, cc: ConfChange, done: oneshot::Sender<Result<Members, ProposeError>>) {
        if self.raw.raft.state != StateRole::Leader {
            let leader = (self.raw.raft.leader_id != 0).then_some(self.raw.raft.leader_id);
            let _ = done.send(Err(ProposeError::NotLeader { leader }));
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

    /// Appends a proposal to the log (if leader) and remembers whom to answer.
    fn propose(&mut self, p: Proposal) {
        if self.raw.raft.state != StateRole::Leader {
            let leader = (self.raw.raft.leader_id != 0).then_some(self.raw.raft.leader_id);
            let _ = p.done.send(Err(ProposeError::NotLeader { leader }));
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
                let leader = (self.raw.raft.leader_id != 0).then_some(self.raw.raft.leader_id);
                let _ = p.done.send(Err(ProposeError::NotLeader { leader }));
            }
            Err(e) => {
                let _ = p.done.send(Err(ProposeError::Unknown(format!("raft refused the proposal: {e}"))));
            }
        }
    }

    fn step(&mut self, m: Inbound) {
        if self.paused.is_some() {
            // Paused (full disk): raft-rs is not stepped; peers retry.
            return;
        }
        match m {
            Inbound::Message(m) => {
                // A member that lost its state and joined again at the same address has a new Raft ID; messages
                // still addressed to its old ID (queued or retried by a peer) carry that member's progress, e.g. a
                // commit index beyond this node's log, which raft-rs would take as its own and panic on.
                if m.to != self.cfg.raft_id {
                    tracing::debug!(to = m.to, from = m.from, "raft message for another member id dropped");
                    return;
                }
                let mut m = m;
                if !screen_inbound(&mut m, self.raw.raft.raft_log.last_index()) {
                    return;
                }
                if let Err(e) = self.raw.step(m) {
                    tracing::debug!(error = %e, "raft message dropped");
                }
            }
            Inbound::Unreachable(id) => self.raw.report_unreachable(id),
            Inbound::SnapshotStatus(id, delivered) => {
                let status = if delivered { SnapshotStatus::Finish } else { SnapshotStatus::Failure };
                self.raw.report_snapshot(id, status);
            }
        }
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

    /// Handles every pending Ready: persist, send, apply, snapshot, publish.
    /// Whether Raft's logical clock must run. A leader that is the only member (no other voter, no learner)
    /// has no one to send heartbeats to and no election to time out: its ticks would change nothing, so a
    /// one-manager cluster does not wake every tick while it idles. The ticks start again as soon as a
    /// member is added (its progress appears) or this node is not the leader.
    fn needs_ticks(&self) -> bool {
        let raft = &self.raw.raft;
        raft.state != StateRole::Leader || raft.prs().iter().len() > 1
    }

    fn handle_ready(&mut self) -> Result<(), RaftError> {
        while self.raw.has_ready() {
            let mut rd = self.raw.ready();
            let read_states = rd.take_read_states();
            if !rd.snapshot().is_empty() {
                self.install_snapshot(rd.snapshot().clone())?;
            }
            // Entries and hard state are durable before anything that depends on them leaves this node.
            self.raw.mut_store().append(rd.entries(), rd.hs())?;
            self.send(rd.take_messages());
            self.apply(rd.take_committed_entries())?;
            self.send(rd.take_persisted_messages());
            let mut light = self.raw.advance(rd);
            if let Some(commit) = light.commit_index() {
                self.raw.mut_store().set_commit(commit)?;
            }
            self.send(light.take_messages());
            self.apply(light.take_committed_entries())?;
            self.raw.advance_apply();
            self.answer_reads(read_states);
            self.maybe_snapshot()?;
        }
        if !self.reads_to_apply.is_empty() {
            self.answer_reads(Vec::new());
        }
        self.retry_deferred_reads();
        if self.raw.has_ready() {
            // A deferred read on a single-member cluster is answered at once, in a new Ready.
            return self.handle_ready();
        }
        self.publish();
        Ok(())
    }

    fn send(&self, msgs: Vec<Message>) {
        if !msgs.is_empty() {
            self.transport.send(msgs);
        }
    }

    /// Applies committed entries to the store in order and answers the proposals they carry.
    fn apply(&mut self, entries: Vec<Entry>) -> Result<(), RaftError> {
        for e in entries {
            if e.index <= self.applied {
                continue;
            }
            match e.get_entry_type() {
                EntryType::EntryNormal => {
                    let pending = self.pending.remove(&e.index);
                    let (id, result) = apply_normal(&self.store, &e);
                    // Whoever learns of the write from its answer sees it in the status too.
                    {
                        let mut st = self.status.lock();
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
        }
        Ok(())
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
                self.members_tx.send_replace(members.clone());
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

    /// Installs a snapshot sent by the leader: file, log state, then the store.
    fn install_snapshot(&mut self, snap: Snapshot) -> Result<(), RaftError> {
        let meta = snap.get_metadata().clone();
        let dir = self.raw.store().snapshot_dir().clone();
        let (decoded, members) = decode_raft_snapshot(&snap.data)
            .map_err(|e| RaftError::SnapshotDecode { path: dir.path(meta.index), reason: e })?;
        let members = members.unwrap_or_else(|| self.raw.store().members().clone());
        dir.write(meta.index, &snap.data)?;
        self.raw.mut_store().install_snapshot(meta.clone(), members.clone())?;
        self.prune_snapshots()?;
        self.members_tx.send_replace(members);
        self.store.restore(meta.index, decoded);
        tracing::info!(raft_id = self.cfg.raft_id, index = meta.index, "installed a snapshot from the leader");
        self.applied = meta.index;
        self.applied_term = meta.term;
        self.last_snapshot_index = meta.index;
        self.bytes_since_snapshot = 0;
        self.entry_bytes.clear();
        {
            let mut st = self.status.lock();
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
    /// snapshot the store to a file, record it, and compact the log so that at most
    /// `log_entries_for_slow_followers` entries and `log_bytes_for_slow_followers` bytes stay behind it.
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
        self.raw.store().snapshot_dir().write(index, &data)?;
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
        self.raw.mut_store().record_snapshot(meta, compact_through)?;
        self.prune_snapshots()?;
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

    /// Removes the snapshot files older than the one the log names, beyond `keep_old_snapshots`.
    fn prune_snapshots(&self) -> Result<(), RaftError> {
        let keep = usize::try_from(self.cfg.keep_old_snapshots).unwrap_or(usize::MAX).saturating_add(1);
        self.raw.store().snapshot_dir().prune(keep)
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
        *self.status.lock() = RaftStatus {
            id: self.cfg.raft_id,
            term: raft.term,
            leader_id: raft.leader_id,
            commit: raft.raft_log.committed,
            applied: self.applied,
            last_snapshot_index: self.last_snapshot_index,
            is_leader: state.is_leader,
        };
        {
            let mut reachable = self.reachable.lock();
            reachable.clear();
            if role_leader {
                let me = self.cfg.raft_id;
                for (id, pr) in raft.prs().iter() {
                    reachable.insert(*id, *id == me || pr.recent_active);
                }
            }
        }
        let before = *self.leader_tx.borrow();
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
            self.leader_tx.send_replace(state);
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
}

/// Encodes a snapshot's data: SwarmKit's `Snapshot` with the store and the membership.
fn encode_raft_snapshot(store: StoreSnapshot, members: &Members) -> Vec<u8> {
    shoal_api::Snapshot { version: 0, membership: Some(members.to_wire()), store: Some(store) }.encode_to_vec()
}

/// Decodes a snapshot's data; the membership is `None` in snapshots written before it was recorded.
fn decode_raft_snapshot(bytes: &[u8]) -> Result<(StoreSnapshot, Option<Members>), String> {
    let snap = shoal_api::Snapshot::decode(bytes).map_err(|e| e.to_string())?;
    Ok((snap.store.unwrap_or_default(), snap.membership.as_ref().map(Members::from_wire)))
}

/// The file `probe_space` writes while the disk is full.
fn space_probe_path(cfg: &RaftConfig) -> std::path::PathBuf {
    cfg.state_dir.join("raft").join("space-probe.tmp")
}

/// Seed of a member's election-timeout RNG: fixed per member, different between members.
const fn election_rng_seed(raft_id: u64) -> u64 {
    raft_id.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Applies one normal entry: an empty one (a leader's no-op) only advances the index; otherwise the
/// decoded actions are applied all-or-nothing. Returns the request ID (when decodable) and the outcome.
/// The last entry to drop from the log after a snapshot at `index`: entries after it are kept for slow
/// followers, at most `keep_entries` of them and at most `keep_bytes` of data (`entry_bytes` holds the
/// (index, bytes) of the entries applied since this start, oldest first). The entry at `index` itself is
/// always kept, whatever its size, so a follower one entry behind needs no snapshot. Entries applied before
/// a restart, whose sizes are not known, are kept by count only (they were within the bounds then).
pub(crate) fn compact_point(
    index: u64,
    entry_bytes: &std::collections::VecDeque<(u64, u64)>,
    keep_entries: u64,
    keep_bytes: u64,
) -> u64 {
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
fn recover_store(cfg: &RaftConfig, storage: &EngineStorage, store: &MemoryStore) -> Result<(u64, u64), RaftError> {
    let meta = storage.snapshot_metadata().clone();
    let (mut applied, mut applied_term) = (0, 0);
    if meta.index > 0 {
        let dir = storage.snapshot_dir();
        let path = dir.path(meta.index);
        let bytes = match dir.read(meta.index) {
            Ok(b) => b,
            Err(RaftError::StateDir { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                return Err(RaftError::Damaged {
                    path,
                    what: format!(
                        "the raft log names snapshot {} (term {}) as the start of its state, but its file is missing",
                        meta.index, meta.term
                    ),
                })
            }
            Err(RaftError::Decrypt { reason, .. }) => {
                return Err(RaftError::Damaged {
                    path,
                    what: format!("snapshot {} cannot be opened (its seal does not verify: {reason})", meta.index),
                })
            }
            Err(e) => return Err(e),
        };
        let snap = decode_snapshot(&bytes).map_err(|e| RaftError::Damaged {
            path: path.clone(),
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

/// What a message from a peer must satisfy before raft-rs steps it, which takes its fields as given and
/// panics (killing the Raft thread) on some it never sends: returns false to drop the message, and clamps
/// a heartbeat's commit (`clamp_heartbeat_commit`). Local-only messages (campaign, timers, transport
/// reports) never come from a peer. `MsgPropose`, `MsgReadIndex` and `MsgTransferLeader` are forwarded to
/// the leader without a term, and raft-rs panics forwarding one that carries a term ("term should not be
/// set when sending MsgPropose"); a vote request must name a term; an append's entries must carry the
/// indexes that follow its own; a snapshot's conf state must be one joint consensus can produce
/// (`conf_state_is_consistent`). (All found by fuzzing the Raft transport's messages, `shoal-fuzz`.)
pub(crate) fn screen_inbound(m: &mut Message, last_index: u64) -> bool {
    use raft::eraftpb::MessageType::{
        MsgBeat, MsgCheckQuorum, MsgHup, MsgPropose, MsgReadIndex, MsgRequestPreVote, MsgRequestVote, MsgSnapStatus,
        MsgTransferLeader, MsgUnreachable,
    };
    // Messages the local node gives itself (campaign, heartbeat and quorum timers, transport reports): a
    // peer never sends them.
    if matches!(m.get_msg_type(), MsgHup | MsgBeat | MsgCheckQuorum | MsgUnreachable | MsgSnapStatus) {
        tracing::debug!(from = m.from, kind = ?m.get_msg_type(), "local-only raft message from a peer dropped");
        return false;
    }
    if matches!(m.get_msg_type(), MsgPropose | MsgReadIndex | MsgTransferLeader) && m.term != 0 {
        tracing::debug!(from = m.from, kind = ?m.get_msg_type(), term = m.term, "forwarded raft message with a term dropped");
        return false;
    }
    // raft-rs reads term 0 as a match for any index beyond its log: an append after an entry of term 0
    // (only the empty log's index 0 has it) or a snapshot of term 0 would commit entries it lacks.
    let after_term_0 = m.get_msg_type() == raft::eraftpb::MessageType::MsgAppend && m.log_term == 0 && m.index != 0;
    let snapshot_term_0 =
        m.get_msg_type() == raft::eraftpb::MessageType::MsgSnapshot && m.get_snapshot().get_metadata().term == 0;
    if after_term_0 || snapshot_term_0 {
        tracing::debug!(from = m.from, kind = ?m.get_msg_type(), "raft message naming term 0 beyond the log start dropped");
        return false;
    }
    // raft-rs rebuilds its configuration from a snapshot's conf state and panics ("invalid restore") when
    // the result differs from what the snapshot says: only a conf state a leader could have written passes.
    if m.get_msg_type() == raft::eraftpb::MessageType::MsgSnapshot
        && !conf_state_is_consistent(m.get_snapshot().get_metadata().get_conf_state())
    {
        tracing::debug!(from = m.from, "raft snapshot with an inconsistent conf state dropped");
        return false;
    }
    // A vote request names the term it campaigns for (raft-rs panics answering one of term 0).
    if matches!(m.get_msg_type(), MsgRequestVote | MsgRequestPreVote) && m.term == 0 {
        tracing::debug!(from = m.from, "raft vote request without a term dropped");
        return false;
    }
    // An append's entries follow its index one by one, with terms from its log term up to its own term,
    // never decreasing, as a leader writes them (raft-rs slices and commits by position and panics on
    // entries whose indexes say otherwise; it reads a term 0 beyond its log as a match).
    let mut prev_term = m.log_term;
    if m.get_msg_type() == raft::eraftpb::MessageType::MsgAppend
        && m.entries.iter().enumerate().any(|(i, e)| {
            let misplaced = Some(e.index) != m.index.checked_add(1 + i as u64);
            let bad_term = e.term == 0 || e.term < prev_term || e.term > m.term;
            prev_term = e.term;
            misplaced || bad_term
        })
    {
        tracing::debug!(from = m.from, index = m.index, "raft append whose entries do not follow its index dropped");
        return false;
    }
    clamp_heartbeat_commit(m, last_index);
    true
}

/// True when a conf state is one joint consensus can produce: at least one voter; no ID twice in a list;
/// no ID both voter and learner; learners-next and auto-leave only in a joint configuration, where each
/// learner-next is an outgoing voter that is not an incoming voter, and no learner is an outgoing voter
/// (such a node waits in learners-next instead).
pub(crate) fn conf_state_is_consistent(cs: &ConfState) -> bool {
    use std::collections::BTreeSet;
    let set = |ids: &[u64]| -> Option<BTreeSet<u64>> {
        let s: BTreeSet<u64> = ids.iter().copied().collect();
        (s.len() == ids.len() && !s.contains(&0)).then_some(s)
    };
    let (Some(voters), Some(learners), Some(outgoing), Some(next)) =
        (set(cs.get_voters()), set(cs.get_learners()), set(cs.get_voters_outgoing()), set(cs.get_learners_next()))
    else {
        return false;
    };
    if voters.is_empty() || !voters.is_disjoint(&learners) {
        return false;
    }
    if outgoing.is_empty() {
        return next.is_empty() && !cs.auto_leave;
    }
    next.is_subset(&outgoing)
        && next.is_disjoint(&voters)
        && learners.is_disjoint(&outgoing)
        && next.is_disjoint(&learners)
}

/// Clamps a heartbeat's commit index to this member's last log index, and says whether it did. raft-rs
/// takes a heartbeat's commit as its own and panics ("to_commit N is out of range [last_index M]") when it
/// lies beyond the log, which kills the Raft thread: a leader sends min(match, commit), beyond the log only
/// when this member lost entries the leader saw it hold (a cut tail), or when the sender is confused.
/// Entries up to the last index are a prefix of what the leader matched, so committing them is what it
/// asked; the rest comes by append.
pub(crate) fn clamp_heartbeat_commit(m: &mut Message, last_index: u64) -> bool {
    if m.get_msg_type() == raft::eraftpb::MessageType::MsgHeartbeat && m.commit > last_index {
        tracing::warn!(
            from = m.from,
            commit = m.commit,
            last_index,
            "heartbeat commit beyond this member's log clamped"
        );
        m.commit = last_index;
        return true;
    }
    false
}

#[cfg(test)]
mod heartbeat_tests {
    use raft::eraftpb::{Message, MessageType};
    use raft::storage::MemStorage;
    use raft::{Config, RawNode};

    use super::{clamp_heartbeat_commit, conf_state_is_consistent, screen_inbound};

    /// A follower of a 3-member group stepping a heartbeat whose commit lies beyond its log: without the
    /// clamp raft-rs panics; with it the follower commits what it holds and keeps running.
    #[test]
    fn a_heartbeat_commit_beyond_the_log_is_clamped_not_fatal() {
        let storage = MemStorage::new_with_conf_state((vec![1, 2, 3], vec![]));
        let cfg = Config { id: 2, ..Default::default() };
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let mut raw = RawNode::new(&cfg, storage, &logger).unwrap();
        let mut hb = Message::default();
        hb.set_msg_type(MessageType::MsgHeartbeat);
        hb.set_from(1);
        hb.set_to(2);
        hb.set_term(1);
        hb.set_commit(1_000);
        let last = raw.raft.raft_log.last_index();
        let mut clamped = hb.clone();
        assert!(clamp_heartbeat_commit(&mut clamped, last));
        raw.step(clamped).unwrap();
        assert_eq!(raw.raft.raft_log.committed, last);
        let unclamped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| raw.step(hb)));
        assert!(unclamped.is_err(), "raft-rs takes the commit as is (the reason for the clamp)");
        let mut ok = Message::default();
        ok.set_msg_type(MessageType::MsgHeartbeat);
        ok.set_commit(last);
        assert!(!clamp_heartbeat_commit(&mut ok, last));
    }

    /// A forwarded proposal or read-index request carrying a term is dropped: raft-rs panics forwarding it.
    #[test]
    fn forwarded_messages_with_a_term_are_dropped() {
        let storage = MemStorage::new_with_conf_state((vec![1, 2, 3], vec![]));
        let cfg = Config { id: 2, ..Default::default() };
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let mut raw = RawNode::new(&cfg, storage, &logger).unwrap();
        raw.raft.become_follower(1, 1);
        for kind in [MessageType::MsgPropose, MessageType::MsgReadIndex] {
            let mut m = Message::default();
            m.set_msg_type(kind);
            m.set_from(3);
            m.set_to(2);
            m.set_term(1);
            m.set_entries(vec![raft::eraftpb::Entry::default()].into());
            assert!(!screen_inbound(&mut m.clone(), 0), "{kind:?} with a term is dropped");
            let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| raw.step(m.clone())));
            assert!(stepped.is_err(), "raft-rs panics on {kind:?} with a term (the reason for the screen)");
            m.set_term(0);
            assert!(screen_inbound(&mut m, 0), "{kind:?} without a term passes");
        }
        for kind in [MessageType::MsgRequestVote, MessageType::MsgRequestPreVote] {
            let mut m = Message::default();
            m.set_msg_type(kind);
            m.set_from(3);
            m.set_to(2);
            assert!(!screen_inbound(&mut m.clone(), 0), "{kind:?} of term 0 is dropped");
            m.set_term(2);
            assert!(screen_inbound(&mut m, 0), "{kind:?} of a term passes");
        }
    }

    /// An append whose entries' indexes do not follow its index, or whose terms are not those a leader
    /// writes, is dropped: raft-rs slices by them and commits past its log.
    #[test]
    fn appends_with_misnumbered_or_misdated_entries_are_dropped() {
        let entry = |index| {
            let mut e = raft::eraftpb::Entry::default();
            e.set_index(index);
            e.set_term(1);
            e
        };
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgAppend);
        m.set_index(5);
        m.set_term(1);
        m.set_log_term(1);
        m.set_entries(vec![entry(6), entry(7)].into());
        assert!(screen_inbound(&mut m.clone(), 7));
        let mut unterm = entry(7);
        unterm.set_term(0);
        m.set_entries(vec![entry(6), unterm].into());
        assert!(!screen_inbound(&mut m.clone(), 7), "an entry of term 0 is dropped");
        m.set_term(0);
        m.set_entries(vec![entry(6)].into());
        assert!(!screen_inbound(&mut m.clone(), 7), "an entry of a later term than the message is dropped");
        m.set_term(1);
        m.set_entries(vec![entry(6), entry(9)].into());
        assert!(!screen_inbound(&mut m.clone(), 7));
        m.set_index(u64::MAX);
        m.set_entries(vec![entry(0)].into());
        assert!(!screen_inbound(&mut m.clone(), 7));
        m.set_index(5);
        m.set_log_term(0);
        m.set_entries(vec![entry(6)].into());
        assert!(!screen_inbound(&mut m.clone(), 7), "an append after index 5 of term 0 is dropped");
        let mut snap = Message::default();
        snap.set_msg_type(MessageType::MsgSnapshot);
        snap.mut_snapshot().mut_metadata().set_index(100);
        assert!(!screen_inbound(&mut snap.clone(), 7), "a snapshot of term 0 is dropped");
        snap.mut_snapshot().mut_metadata().set_term(1);
        snap.mut_snapshot().mut_metadata().mut_conf_state().set_voters(vec![1, 2, 3]);
        assert!(screen_inbound(&mut snap, 7));
    }

    /// Conf states raft-rs restores from a snapshot: the screen lets through exactly those it restores as
    /// given (raft-rs panics "invalid restore" on the others; found by fuzzing, `raft_step`).
    #[test]
    fn only_conf_states_joint_consensus_produces_pass() {
        use raft::eraftpb::ConfState;
        let cs = |voters: &[u64], learners: &[u64], outgoing: &[u64], next: &[u64], auto_leave: bool| ConfState {
            voters: voters.to_vec(),
            learners: learners.to_vec(),
            voters_outgoing: outgoing.to_vec(),
            learners_next: next.to_vec(),
            auto_leave,
            ..Default::default()
        };
        for (what, c, ok) in [
            ("three voters", cs(&[1, 2, 3], &[], &[], &[], false), true),
            ("voters and a learner", cs(&[2, 3], &[1], &[], &[], false), true),
            ("joint, 1 leaving to learner", cs(&[2, 3], &[], &[1, 2, 3], &[1], true), true),
            ("no voter", cs(&[], &[1], &[], &[], false), false),
            ("a voter twice", cs(&[2, 2, 3], &[], &[], &[], false), false),
            ("voter and learner", cs(&[1, 2], &[1], &[], &[], false), false),
            ("learner-next outside a joint config", cs(&[2, 3], &[], &[], &[1], false), false),
            ("auto-leave outside a joint config", cs(&[2, 3], &[], &[], &[], true), false),
            ("learner-next not an outgoing voter", cs(&[2, 3], &[], &[2, 3], &[1], false), false),
            ("learner-next also an incoming voter", cs(&[1, 2], &[], &[1, 2, 3], &[1], false), false),
            ("learner also an outgoing voter", cs(&[2, 3], &[1], &[1, 2, 3], &[], false), false),
            ("raft ID 0", cs(&[0, 2], &[], &[], &[], false), false),
        ] {
            assert_eq!(conf_state_is_consistent(&c), ok, "{what}");
        }
    }

    /// What a peer never sends: the local node's own timers and transport reports, and a forwarded
    /// leadership transfer with a term (raft-rs panics forwarding it; found by fuzzing, `raft_step`).
    #[test]
    fn local_only_messages_and_a_transfer_with_a_term_are_dropped() {
        use raft::eraftpb::MessageType::*;
        for kind in [MsgHup, MsgBeat, MsgCheckQuorum, MsgUnreachable, MsgSnapStatus] {
            let mut m = Message { msg_type: kind, from: 1, to: 2, ..Default::default() };
            assert!(!screen_inbound(&mut m, 7), "{kind:?}");
        }
        let mut transfer = Message { msg_type: MsgTransferLeader, from: 1, to: 2, term: 1, ..Default::default() };
        assert!(!screen_inbound(&mut transfer.clone(), 7));
        transfer.term = 0;
        assert!(screen_inbound(&mut transfer, 7));
    }
}
