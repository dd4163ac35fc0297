//! Consensus for Shoal's managers: a Raft node around raft-rs whose log and hard state live in raft-engine
//! under the state dir (fsync'd before a write is acknowledged), with snapshots of the store and log
//! compaction, and leadership events.
//!
//! This crate knows the store only through `MemoryStore::apply`/`advance_index`/`snapshot`/`restore` and
//! the codecs; it knows nothing of services, tasks or the subsystems.
//!
//! # Design
//!
//! - **Driver thread.** `RaftNode` is a handle; the raft-rs `RawNode` and its storage are owned by a driver
//!   on a dedicated OS thread (`raft-<id>`) running a single-threaded tokio runtime. Persisting is blocking
//!   IO (fsync), so it stays off the caller's runtime, and the loop is plain sequential code: raft-rs is
//!   sans-IO, the driver is its IO shell.
//! - **Durability.** Every Ready's entries and hard state go to raft-engine in one batch with `sync = true`
//!   before its messages are sent or any entry applied; the commit index advanced by `advance` is synced
//!   again before the newly committed entries are applied. A proposal resolves only after its entry is
//!   applied to the store, so an acknowledged write is on disk and replayed by the next start.
//!   Proposals queue (bound `PROPOSAL_QUEUE` = 4096, the proposer awaits room) and the driver takes up to
//!   `MAX_PROPOSALS_PER_READY` = 1024 of them per Ready: one group commit (two fsyncs) for all of them.
//! - **Matching results.** A proposal is remembered by the log index raft-rs appended it at, together with
//!   its request ID (carried in the entry). When that index is applied with the same ID the proposal gets the
//!   store's result (`Ok(commit)` or `ProposeError::Store`); a different ID (another leader overwrote it),
//!   loss of the leader role or a stop resolve it with `Unknown` / `Stopped`. No future is left hanging.
//! - **Leadership.** `leadership()` says `is_leader` once this node is raft leader *and* has applied an
//!   entry of its own term (the no-op raft-rs appends on election): only then does its store hold all
//!   earlier commits, so its compare-and-swap writes are meaningful. A member that is the only voter
//!   campaigns as soon as it starts.
//! - **Storage layout** (`state_dir/raft`): `log/` is raft-engine, with the entries in one group and the
//!   hard state, conf state, latest snapshot metadata and truncation point in another; `snapshots/` holds
//!   `snapshot-<index>.bin` files (the store's `encode_snapshot` bytes), written to a temporary file, fsync'd,
//!   renamed and the directory fsync'd; the two newest are kept. A snapshot is taken every
//!   `snapshot_interval_entries` applied entries; then the log is compacted to keep
//!   `log_entries_for_slow_followers` entries behind it. The snapshot is written on the driver thread, so a
//!   large store delays the loop while it is written (acceptable at this size; move it to a helper thread
//!   when stores grow).
//! - **Recovery.** `start` opens the log, loads the snapshot named by the recorded metadata into the store,
//!   replays the committed entries after it, and gives raft-rs the applied index, before returning.
//! - **Determinism.** raft-rs draws election timeouts from an unseeded RNG; the driver overrides every draw
//!   with one from a per-member seeded RNG. raft-rs's slog output goes to `tracing` (target `raft`), and the
//!   node logs one info line per leadership change.
//! - **Transport seam.** Outgoing messages go to a `Transport`; received ones come in through
//!   `RaftNode::step` (bounded by `INBOUND_QUEUE`). A single-member cluster never sends. Membership changes
//!   are applied when committed (conf state persisted) but there is no API to propose them yet.

mod config;
mod error;
pub mod grpc;
mod logger;
mod membership;
mod node;
mod proposer;
mod snapshot_files;
mod storage;
mod transport;

pub use config::RaftConfig;
pub use error::RaftError;
pub use membership::{Member, Members};
pub use node::{
    MembershipError, RaftNode, RaftStatus, StartMode, FORWARD_APPLY_TIMEOUT, INBOUND_QUEUE, MAX_FORWARDED_IN_FLIGHT,
    MAX_PROPOSALS_PER_READY, MEMBERSHIP_CHANGE_TIMEOUT, PROPOSAL_QUEUE,
};
pub use proposer::{LeaderState, LocalProposer, ProposeError, ProposeFuture, Proposer};
pub use raft::eraftpb;
pub use transport::{ForwardFuture, Forwarder, NoPeers, PeerLink, Transport};

#[cfg(test)]
mod cluster_tests;
#[cfg(test)]
mod tests;
