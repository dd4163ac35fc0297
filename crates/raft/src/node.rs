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

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use raft::eraftpb::{ConfChange, ConfChangeType, ConfState, Message};
use shoal_store::{decode_request, encode_request, Action, MemoryStore};
use tokio::sync::{mpsc, oneshot, watch};

use crate::core::{Core, Done, LogStorage, MembershipError, Outlets, Proposal, RaftStatus, ReadDone, PROPOSAL_QUEUE};
use crate::storage::EngineStorage;
use crate::transport::{Forwarder, Inbound, NoPeers, PeerLink, Transport};
use crate::{
    LeaderState, LogReadError, LoggedWrite, Member, Members, ProposeError, ProposeFuture, Proposer, RaftConfig,
    RaftError, ReadBarrierFuture,
};

/// Most proposals taken from the queue before the driver handles the resulting Ready (one group commit).
pub const MAX_PROPOSALS_PER_READY: usize = 1024;
/// Bound of the queue of messages received from peers; `step` fails with `RaftError::Busy` when full.
pub const INBOUND_QUEUE: usize = 1024;
/// Most inbound messages stepped before the driver handles the resulting Ready.
const MAX_MESSAGES_PER_READY: usize = 256;
/// How long a follower waits, after the leader accepted its forwarded write, for its own store to apply it.
pub const FORWARD_APPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `add_member`/`remove_member` wait for the membership change to be applied.
pub const MEMBERSHIP_CHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a read barrier waits for the leader to confirm its commit index and for this store to apply it.
pub const READ_BARRIER_TIMEOUT: Duration = Duration::from_secs(5);

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
        let outlets = Outlets::new(cfg.raft_id);
        let (leader_rx, members_rx) = (outlets.leader.subscribe(), outlets.members.subscribe());
        let (status, reachable) = (outlets.status.clone(), outlets.reachable.clone());
        transport.attach(PeerLink { inbound: in_tx.clone(), members: members_rx.clone() });
        let (ready_tx, ready_rx) = oneshot::channel::<Result<Arc<AtomicU64>, RaftError>>();

        let raft_id = cfg.raft_id;
        let max_proposal_bytes = cfg.max_proposal_bytes;
        let disk_full = Arc::new(Mutex::new(None));
        let driver_disk_full = disk_full.clone();
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
                let driver = match Driver::open(cfg, store, transport, outlets, driver_disk_full, mode) {
                    Ok(d) => d,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(driver.core.storage().synced_writes()));
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
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
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
                    "a running manager at {addr} is already a member (raft id {:x}); stop it, or remove it first, or \
                     use another address",
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
        tracing::info!(raft_id = format_args!("{raft_id:x}"), from = %current.addr, to = addr, "raft member address \
                                                                                                changed");
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
                "this manager is the leader and cannot remove itself; stop it so another manager leads, then remove it \
                 from there".into(),
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
                        "the leader accepted the write but this manager did not apply it within \
                         {FORWARD_APPLY_TIMEOUT:?}"
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

/// The daemon's IO shell around the member's `Core`: raft-engine storage, the transport, the clock that
/// times read barriers, and a full disk's pause. Runs on the driver thread.
struct Driver {
    core: Core<EngineStorage>,
    transport: Arc<dyn Transport>,
    /// When the driver started: the core's time is measured from it.
    epoch: Instant,
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

/// Writes `bytes` zero bytes to `path` and fsyncs them, then removes the file: whether the filesystem has
/// that much space for the log again.
fn probe_space(path: &Path, bytes: u64) -> std::io::Result<()> {
    use std::io::Write;
    let written = (|| {
        let mut f = std::fs::File::create(path)?;
        let chunk = vec![0u8; 64 << 10];
        let mut left = bytes;
        while left > 0 {
            let n = chunk.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            f.write_all(&chunk[..n])?;
            left -= n as u64;
        }
        f.sync_all()
    })();
    let removed = std::fs::remove_file(path);
    written?;
    removed
}

/// Opens the storage and records the membership `mode` asks for (bootstrap, join, a forced new cluster,
/// a lone member's new address).
fn open_storage(cfg: &RaftConfig, mode: StartMode) -> Result<EngineStorage, RaftError> {
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
                    "force-new-cluster needs an existing raft state to recover; start without it to create a new \
                     cluster"
                        .into(),
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
        let others =
            old.members.keys().chain(storage.conf_state().voters.iter()).chain(storage.conf_state().learners.iter());
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
    Ok(storage)
}

impl Driver {
    /// Opens the storage, recovers the store through the core and handles the first Ready (a lone member
    /// wins its election there).
    fn open(
        cfg: RaftConfig,
        store: Arc<MemoryStore>,
        transport: Arc<dyn Transport>,
        outlets: Outlets,
        disk_full: Arc<Mutex<Option<String>>>,
        mode: StartMode,
    ) -> Result<Driver, RaftError> {
        let storage = open_storage(&cfg, mode)?;
        // A probe a stop interrupted (`probe_space`).
        let _ = std::fs::remove_file(space_probe_path(&cfg));
        let seed = election_rng_seed(cfg.raft_id);
        let core = Core::open(cfg, storage, store, outlets, seed, None)?;
        let mut driver = Driver { core, transport, epoch: Instant::now(), paused: None, disk_full };
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

    fn handle_ready(&mut self) -> Result<(), RaftError> {
        let transport = &self.transport;
        self.core.handle_ready(self.epoch.elapsed(), &mut |msgs| transport.send(msgs))
    }

    /// Pauses the node on a full disk (`e` is `RaftError::DiskFull`). What failed to be written is dropped with
    /// raft-rs's in-memory state (rebuilt from the storage by `resume`): the storage changes only on a write
    /// that succeeded, and every write the node depends on is made before anything that depends on it, so
    /// nothing unwritten was sent, applied or acknowledged. Every caller waiting is answered now
    /// (`Core::abandon_for_full_disk`). Until `resume`, raft-rs is neither ticked nor stepped (a leader's
    /// followers elect another leader), writes and reads are refused with the message, and it is published as
    /// not leading.
    fn pause(&mut self, e: RaftError) {
        let RaftError::DiskFull { path, mount, reason } = &e else {
            debug_assert!(false, "pause is for a full disk only: {e}");
            return;
        };
        let message = e.to_string();
        tracing::error!(raft_id = self.core.cfg().raft_id, "{message}");
        self.core.abandon_for_full_disk(&message);
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
        if let Err(e) = probe_space(&space_probe_path(self.core.cfg()), crate::error::RESUME_FREE_BYTES) {
            tracing::debug!(error = %e, "the raft state's disk is still full");
            return false;
        }
        let applied = self.core.applied();
        if self.core.storage().hard_state().commit < applied {
            if let Err(e) = self.core.storage_mut().set_commit(applied) {
                tracing::debug!(error = %e, "the raft state's disk is still full");
                return false;
            }
        }
        true
    }

    /// Leaves the pause: raft-rs is rebuilt from the storage as a restart would (`Core::restart`), and the
    /// node goes on (a lone member campaigns again at once; others follow the leader they hear from). Fails
    /// only if raft-rs refuses the storage (then the node stops).
    fn resume(self) -> Result<Driver, RaftError> {
        let Driver { core, transport, epoch, paused, disk_full } = self;
        let paused_for = paused.map(|p| p.message);
        let mut d = Driver { core: core.restart()?, transport, epoch, paused: None, disk_full };
        match d.handle_ready() {
            Ok(()) => {
                *d.disk_full.lock() = None;
                tracing::info!(
                    raft_id = d.core.cfg().raft_id,
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
        let mut ticker = tokio::time::interval(Duration::from_millis(self.core.cfg().tick_interval_ms));
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
                _ = ticker.tick(), if self.paused.is_some() || self.core.needs_ticks() => {
                    if self.paused.is_none() {
                        self.core.tick();
                        if let Some(leader) = self.core.silent_leader() {
                            self.transport.probe(leader);
                        }
                    }
                }
            }
            if self.paused.is_some() {
                if self.space_is_back() {
                    let (raft_id, disk_full) = (self.core.cfg().raft_id, self.disk_full.clone());
                    match self.resume() {
                        Ok(d) => self = d,
                        Err(e) => {
                            tracing::error!(raft_id, error = %e, "raft could not resume after the disk was full, and \
                                                                  stopped");
                            *disk_full.lock() = Some(format!(
                                "raft could not resume after the disk was full ({e}); restart this manager"
                            ));
                            return;
                        }
                    }
                }
                continue;
            }
            match self.handle_ready() {
                Ok(()) => {}
                Err(e) if e.is_disk_full() => self.pause(e),
                Err(e) => break Exit::Failed(e),
            }
        };
        let raft_id = self.core.cfg().raft_id;
        let reason = match exit {
            Exit::Stopped => {
                tracing::info!(raft_id, "raft node stopping");
                ProposeError::Stopped
            }
            Exit::Failed(e) => {
                tracing::error!(raft_id, error = %e, "raft node failed and stopped");
                ProposeError::Unknown(format!("the raft node failed: {e}"))
            }
        };
        self.core.stop(&reason);
        // Everything acknowledged was synced already; this makes the last non-synced writes (log
        // compaction) durable too.
        if let Err(e) = self.core.storage().sync() {
            tracing::warn!(error = %e, "final raft log flush failed");
        }
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
                if self.core.set_snapshot_policy(policy) {
                    tracing::info!(
                        raft_id = self.core.cfg().raft_id,
                        snapshot_interval = policy.interval_entries,
                        keep_old_snapshots = policy.keep_old_snapshots,
                        log_entries_for_slow_followers = policy.log_entries_for_slow_followers,
                        "raft snapshot settings applied"
                    );
                }
            }
            Command::Reencrypt { keys, done } => {
                let state_dir = self.core.cfg().state_dir.clone();
                let _ = done.send(self.core.storage_mut().reencrypt(&state_dir, keys));
            }
            Command::Propose(p) => self.core.propose(p),
            Command::ConfChange { cc, done } => self.core.propose_conf_change(cc, done),
            Command::AwaitForwarded { id, done } => self.core.await_forwarded(id, done),
            Command::ReadIndex { done } => self.core.read_index(self.epoch.elapsed(), done),
            Command::ReadLog { low, high, max, done } => {
                let _ = done.send(self.core.read_log(low, high, max));
            }
            Command::TransferLeader { to, done } => {
                let _ = done.send(self.core.transfer_leader(to));
            }
        }
    }

    fn step(&mut self, m: Inbound) {
        if self.paused.is_some() {
            // Paused (full disk): raft-rs is not stepped; peers retry.
            return;
        }
        match m {
            Inbound::Message(m) => self.core.step_message(m),
            Inbound::Unreachable(id) => self.core.report_unreachable(id),
            Inbound::SnapshotStatus(id, delivered) => self.core.report_snapshot(id, delivered),
            Inbound::Gone(id) => {
                self.core.peer_gone(id);
            }
        }
    }
}

/// The file `probe_space` writes while the disk is full.
fn space_probe_path(cfg: &RaftConfig) -> std::path::PathBuf {
    cfg.state_dir.join("raft").join("space-probe.tmp")
}

/// Seed of a member's election-timeout RNG: fixed per member, different between members.
const fn election_rng_seed(raft_id: u64) -> u64 {
    raft_id.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}
