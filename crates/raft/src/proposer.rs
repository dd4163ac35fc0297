//! The seam between the cluster logic and consensus: a `Proposer` takes a list of store actions, gets it
//! committed, and resolves once the local store has applied it. `RaftNode` is the real one; `LocalProposer`
//! applies directly (no log), for unit tests of the subsystems.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use shoal_store::{Action, Commit, MemoryStore, StoreError};
use tokio::sync::watch;

/// The future a proposal returns.
pub type ProposeFuture = Pin<Box<dyn Future<Output = Result<Arc<Commit>, ProposeError>> + Send + 'static>>;

/// The future a read barrier returns.
pub type ReadBarrierFuture = Pin<Box<dyn Future<Output = Result<(), ProposeError>> + Send + 'static>>;

/// Why a proposal did not take effect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProposeError {
    /// This manager is not the leader; send the write to the leader (its Raft ID, if known).
    #[error("this manager is not the leader (leader: {leader:?}); retry against the leader")]
    NotLeader {
        /// The leader's Raft ID, when known.
        leader: Option<u64>,
    },
    /// The write was committed but could not be applied (version conflict, name taken, ...). Nothing changed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Leadership was lost or the node stopped before the write was known to be committed: it may or may
    /// not have been applied. Read the state again before retrying.
    #[error("the write's outcome is unknown: {0}; read the state again before retrying")]
    Unknown(String),
    /// The proposal is larger than one Raft entry may be.
    #[error("the write is too large ({size} bytes, limit {limit}); split it")]
    TooLarge {
        /// Encoded size.
        size: usize,
        /// Limit.
        limit: usize,
    },
    /// The Raft node has stopped.
    #[error("the raft node is stopped")]
    Stopped,
    /// This manager's disk is full: the write was not applied (the message names the disk and what to do).
    #[error("{0}")]
    DiskFull(String),
    /// No leader can take the write: the managers are electing one or this manager cannot reach a quorum.
    #[error(
        "no leader / lost quorum: {0}; retry in a few seconds, and check that a majority of the managers are \
             running and reachable"
    )]
    NoLeader(String),
}

/// Who leads, as this node sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeaderState {
    /// True when this node is the leader.
    pub is_leader: bool,
    /// The current term.
    pub term: u64,
    /// The leader's Raft ID (0 when unknown).
    pub leader_id: u64,
}

/// Gets writes committed and applied.
pub trait Proposer: Send + Sync + 'static {
    /// Proposes `actions` as one atomic write; resolves once applied to the local store.
    fn propose(&self, actions: Vec<Action>) -> ProposeFuture;

    /// Leadership changes, as a watch channel (the current value is always available).
    fn leadership(&self) -> watch::Receiver<LeaderState>;

    /// Resolves once the local store holds every write committed before the call, so that a read of it that
    /// follows is linearizable; fails (bounded in time) when that cannot be confirmed, e.g. without a leader.
    fn read_barrier(&self) -> ReadBarrierFuture;

    /// Why this manager cannot serve for a reason of its own rather than the cluster's (its disk is full), for
    /// `/_ping` and `/info`; `None` when it is healthy.
    fn unhealthy(&self) -> Option<String> {
        None
    }
}

/// One committed write read back from the log: its Raft index and its actions as proposed (objects carry
/// the version they were read at; the store stamps `index` on those it applies).
#[derive(Debug, Clone, PartialEq)]
pub struct LoggedWrite {
    /// The entry's Raft index.
    pub index: u64,
    /// The write's actions, in order.
    pub actions: Vec<Action>,
}

/// Why committed writes could not be read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogReadError {
    /// The entries asked for were compacted into a snapshot.
    #[error("the raft log no longer holds index {asked}: it starts at {first}")]
    Compacted {
        /// The first index asked for.
        asked: u64,
        /// The first index the log holds.
        first: u64,
    },
    /// The log could not be read.
    #[error("the raft log could not be read: {0}")]
    Failed(String),
    /// The Raft node has stopped.
    #[error("the raft node is stopped")]
    Stopped,
}

/// The future `CommittedLog::read_committed` returns.
pub type LogReadFuture = Pin<Box<dyn Future<Output = Result<Vec<LoggedWrite>, LogReadError>> + Send + 'static>>;

/// Reads committed, applied writes back from the Raft log (SwarmKit's `ChangesBetween`), for a watch resumed
/// from a version. Entries that carry no store write (a leader's no-op, membership changes) are skipped.
pub trait CommittedLog: Send + Sync + 'static {
    /// The writes at indexes `[low, high)` that this member has applied, at most `max_entries` log entries
    /// from `low` (so the answer may end before `high`; the caller continues after the last entry read, which
    /// `read_committed` reports as `Ok` with the writes found). Fails with `Compacted` when `low` is no longer
    /// in the log.
    fn read_committed(&self, low: u64, high: u64, max_entries: u64) -> LogReadFuture;
}

/// Applies writes straight to a store, with consecutive indexes; always the leader. For tests.
#[derive(Debug)]
pub struct LocalProposer {
    store: Arc<MemoryStore>,
    next_index: AtomicU64,
    lock: Mutex<()>,
    leader: watch::Sender<LeaderState>,
}

impl LocalProposer {
    /// A proposer over `store`, continuing after its last index.
    pub fn new(store: Arc<MemoryStore>) -> LocalProposer {
        let next = store.last_index() + 1;
        let (leader, _) = watch::channel(LeaderState { is_leader: true, term: 1, leader_id: 1 });
        LocalProposer { store, next_index: AtomicU64::new(next), lock: Mutex::new(()), leader }
    }

    /// Flips leadership, to test start/stop of leader-only subsystems.
    pub fn set_leader(&self, is_leader: bool) {
        self.leader.send_modify(|s| {
            s.is_leader = is_leader;
            s.term += 1;
        });
    }
}

impl Proposer for LocalProposer {
    fn propose(&self, actions: Vec<Action>) -> ProposeFuture {
        let result = if !self.leader.borrow().is_leader {
            Err(ProposeError::NotLeader { leader: None })
        } else {
            let _guard = self.lock.lock();
            let index = self.next_index.fetch_add(1, Ordering::SeqCst);
            self.store.apply(index, &actions).map_err(ProposeError::from)
        };
        Box::pin(async move { result })
    }

    fn leadership(&self) -> watch::Receiver<LeaderState> {
        self.leader.subscribe()
    }

    /// Writes are applied to the one store before `propose` returns: every read is already current.
    fn read_barrier(&self) -> ReadBarrierFuture {
        Box::pin(async { Ok(()) })
    }
}
