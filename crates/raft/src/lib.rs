//! Consensus for Shoal's managers: a Raft node around raft-rs whose log and hard state live in raft-engine
//! under the state dir (fsync'd before a write is acknowledged), with snapshots of the store and log
//! compaction, and leadership events.
//!
//! This crate knows the store only through `MemoryStore::apply`/`advance_index`/`snapshot`/`restore` and
//! the codecs; it knows nothing of services, tasks or the subsystems.
//!
//! # Design
//!
//! - **A sans-IO core, two drivers.** `Core` holds the member's logic: raft-rs's `RawNode` over a
//!   `LogStorage`, the Ready handling (persist, send, apply, snapshot, publish), proposals and their answers,
//!   membership changes, forwarded writes, read barriers (time passed in), the snapshot policy. It reads no
//!   clock and does no IO of its own. `RaftNode` is a handle; its driver (`node.rs`) owns the core on a
//!   dedicated OS thread (`raft-<id>`) running a single-threaded tokio runtime, with raft-engine storage:
//!   persisting is blocking IO (fsync), so it stays off the caller's runtime. `shoal-sim` drives the same
//!   core over simulated storage, network and time.
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
//!   renamed and the directory fsync'd; the newest and `keep_old_snapshots` older ones are kept. A snapshot is taken
//!   every `snapshot_interval_entries` applied entries; then the log is compacted to keep
//!   `log_entries_for_slow_followers` entries behind it. The snapshot is written on the driver thread, so a
//!   large store delays the loop while it is written (acceptable at this size; move it to a helper thread
//!   when stores grow).
//! - **Recovery.** `start` opens the log, loads the snapshot named by the recorded metadata into the store,
//!   replays the committed entries after it, and gives raft-rs the applied index, before returning.
//!   The log is opened strictly and checked against `raft/commit-record` (what this member acknowledged,
//!   kept outside raft-engine): damage reaching an acknowledged entry, a missing or empty log, or a missing
//!   or damaged snapshot stops the start with `RaftError::Damaged` and changes nothing; only a torn tail
//!   that held nothing acknowledged is cut (checked on a copy first), and the cut is logged.
//! - **A full disk** (`RaftError::DiskFull`) pauses the driver instead of stopping it: waiting callers are
//!   answered, writes and reads are refused with a message naming the disk (`RaftNode::disk_full`), raft-rs
//!   is neither ticked nor stepped, and once a probe write succeeds raft-rs is rebuilt from the storage as a
//!   restart would (docs/design/raft-disk-full.md).
//! - **Snapshot policy.** `RaftNode::set_snapshot_policy` applies the cluster's `SnapshotInterval`,
//!   `KeepOldSnapshots` and `LogEntriesForSlowFollowers` to a running member; old snapshot files are removed
//!   only once the log names the new snapshot.
//! - **Determinism.** raft-rs draws election timeouts from an unseeded RNG; the core overrides every draw
//!   with one from a per-member seeded RNG. raft-rs's slog output goes to `tracing` (target `raft`), and the
//!   node logs one info line per leadership change.
//! - **Transport seam.** Outgoing messages go to a `Transport`; received ones come in through
//!   `RaftNode::step` (bounded by `INBOUND_QUEUE`); the transport reports unreachable peers and snapshot
//!   outcomes through its `PeerLink`. `grpc::GrpcTransport` is the real one (bounded per-peer queues); the
//!   tests use a simulated network. A single-member cluster never sends.
//! - **Membership.** `add_member`/`remove_member` (leader only) propose a `ConfChange` carrying the member's
//!   `RaftMember` (ID, node ID, address) in its context; applied, the conf state and the addresses
//!   (`Members`) are persisted together and written into every snapshot (SwarmKit's `Snapshot.membership`).
//!   Adding a member takes a snapshot and compacts the log past its first entry, so a new member always
//!   starts from a snapshot that names it. pre-vote and check-quorum are on: an isolated leader steps down
//!   after an election timeout, and a rejoining member does not disrupt a healthy leader.
//! - **A leader whose process is gone.** A follower that has heard nothing from its leader for three ticks
//!   asks the transport to probe it (`Core::silent_leader`, `Transport::probe`: a TCP connection to its Raft
//!   address). A refused connection (the host answers, nothing listens: the process died) ends the leader's
//!   lease there (`Core::peer_gone`): the follower's election clock moves to the end of the election timeout,
//!   so the followers grant pre-votes at once and campaign after the randomized rest of their timeouts. A
//!   crashed leader is replaced about 0.7 s sooner with the default timing; a host that is down or cut off
//!   (the probe times out) is waited out as before, and a loaded machine's late heartbeats cause no election.
//! - **Follower writes.** With a `Forwarder`, `propose` on a follower sends the encoded request to the
//!   leader (`RaftProposals.ForwardProposal`), then resolves when the local store applies the entry with
//!   the same request ID (read-your-writes), or fails after `FORWARD_APPLY_TIMEOUT`. Without a reachable
//!   leader it fails at once with `ProposeError::NoLeader` ("no leader / lost quorum: ..."), never hangs.
//!
//! # Starting, joining, serving (the API the node uses)
//!
//! - First manager of a new cluster, or any restart: `grpc::start_member(cfg, store, channels, mode)` with
//!   `StartMode::BootstrapIfEmpty` (bootstrap when there is no state) or `StartMode::Restart` (recover
//!   only). `cfg.addr` is the address other managers reach this one at; `cfg.node_id` its node ID.
//! - A new manager: `grpc::join_cluster(cfg, store, channels, manager_addr)` calls `RaftMembership.Join` on
//!   any manager (a follower redirects to the leader through `x-shoal-leader-addr` metadata), starts this
//!   member under the Raft ID the leader assigned (read it back with `RaftNode::id` and store it), and the
//!   leader then sends its snapshot.
//! - Serving: `grpc::services(&node)` returns the `Raft`, `RaftMembership` and `RaftProposals` tonic
//!   services as values; the node adds them to its one server (and may wrap them with TLS/authorization).
//! - Every client channel comes from the injected `grpc::ChannelFactory` (`grpc::PlainHttp` by default).

mod commit_record;
mod config;
mod core;
pub mod encryption;
mod error;
pub mod grpc;
mod logger;
mod membership;
mod node;
mod proposer;
mod screen;
mod snapshot_files;
mod storage;
mod transport;

pub use config::{RaftConfig, SnapshotPolicy};
pub use core::{
    ApplyObserver, Core, Done, LogStorage, MembersDone, MembershipError, Outlets, Proposal, RaftStatus, ReadDone,
    MAX_FORWARDED_IN_FLIGHT, MAX_READS_IN_FLIGHT, PROPOSAL_QUEUE,
};
pub use error::RaftError;
pub use membership::{Member, Members};
pub use node::{
    RaftNode, StartMode, FORWARD_APPLY_TIMEOUT, INBOUND_QUEUE, MAX_PROPOSALS_PER_READY, MEMBERSHIP_CHANGE_TIMEOUT,
    READ_BARRIER_TIMEOUT,
};
pub use proposer::{
    CommittedLog, LeaderState, LocalProposer, LogReadError, LogReadFuture, LoggedWrite, ProposeError, ProposeFuture,
    Proposer, ReadBarrierFuture,
};
pub use raft::eraftpb;
pub use transport::{ForwardFuture, Forwarder, NoPeers, PeerLink, Transport};

/// Entry points for the fuzz targets of `shoal-fuzz` only (not an API): the decoders of what a manager
/// reads from its state dir and from conf changes, which are private to this crate otherwise.
#[doc(hidden)]
pub mod fuzz_hooks {
    /// The commit record at `path` as a start reads it: the acknowledged (commit, term), none, or damage.
    pub fn read_commit_record(path: &std::path::Path) -> Result<Option<(u64, u64)>, crate::RaftError> {
        crate::commit_record::read(path).map(|a| a.map(|a| (a.commit, a.term)))
    }

    /// The driver's screening of an inbound raft message before raft-rs steps it: false to drop it.
    pub fn screen_inbound(m: &mut crate::eraftpb::Message, last_index: u64) -> bool {
        crate::screen::screen_inbound(m, last_index)
    }

    /// A conf change's context (one member) and a membership list, as decoded when applied or restored.
    pub fn decode_membership(bytes: &[u8]) -> (bool, bool) {
        (crate::Member::decode(bytes).is_ok(), crate::Members::decode(bytes).is_ok())
    }
}

#[cfg(test)]
mod cluster_tests;
#[cfg(test)]
mod durability_tests;
#[cfg(test)]
mod tests;
