//! `RaftConfig`: where the Raft state lives and the timing and size limits of one Raft member.
//!
//! Plain data; depends on nothing else in the crate.

use std::path::PathBuf;

use crate::RaftError;

/// Configuration of one Raft member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaftConfig {
    /// The node's state directory; raft data goes under `state_dir/raft`.
    pub state_dir: PathBuf,
    /// This member's Raft ID (non-zero).
    pub raft_id: u64,
    /// The address peers reach this member's Raft gRPC services at (`host:port`; recorded at bootstrap).
    pub addr: String,
    /// This manager's node ID (recorded with its address; may be empty).
    pub node_id: String,
    /// Length of one Raft tick, in milliseconds.
    pub tick_interval_ms: u64,
    /// Ticks without hearing from a leader before a follower campaigns (randomized in `[n, 2n)`).
    pub election_tick: usize,
    /// Ticks between leader heartbeats.
    pub heartbeat_tick: usize,
    /// Take a snapshot of the store and compact the log every this many applied entries.
    pub snapshot_interval_entries: u64,
    /// Entries kept in the log behind a snapshot, so slow followers catch up without a snapshot.
    pub log_entries_for_slow_followers: u64,
    /// Snapshot files kept beyond the newest one (SwarmKit's `KeepOldSnapshots`).
    pub keep_old_snapshots: u64,
    /// Also take a snapshot once the entries applied since the last one hold this many bytes of data, so
    /// the log's size on disk is bounded by bytes as well as by entries (a few large writes fill a disk long
    /// before 10 000 entries).
    pub snapshot_interval_bytes: u64,
    /// At most this many bytes of entries are kept behind a snapshot (and at most
    /// `log_entries_for_slow_followers` entries, whichever is fewer); the last entry is always kept.
    pub log_bytes_for_slow_followers: u64,
    /// Largest encoded proposal accepted, in bytes; larger ones fail with `ProposeError::TooLarge`.
    pub max_proposal_bytes: usize,
    /// The data encryption keys that seal the log entries and snapshots. `None`: the plain DEK file under
    /// `state_dir/raft` (created on first start); a node with autolock passes the keys it unsealed.
    pub data_keys: Option<crate::encryption::DataKeys>,
}

impl RaftConfig {
    /// A configuration with the defaults: 100 ms ticks, election after 10 ticks, heartbeat every tick,
    /// a snapshot every 10 000 entries or 32 MiB of entries, keeping 500 entries and at most 8 MiB behind
    /// it and no older snapshot file, proposals up to 8 MiB.
    pub fn new(state_dir: PathBuf, raft_id: u64) -> Self {
        RaftConfig {
            state_dir,
            raft_id,
            addr: String::new(),
            node_id: String::new(),
            tick_interval_ms: 100,
            election_tick: 10,
            heartbeat_tick: 1,
            snapshot_interval_entries: 10_000,
            log_entries_for_slow_followers: 500,
            keep_old_snapshots: 0,
            snapshot_interval_bytes: 32 << 20,
            log_bytes_for_slow_followers: 8 << 20,
            max_proposal_bytes: 8 << 20,
            data_keys: None,
        }
    }

    /// Checks the values that raft-rs or this crate cannot work with.
    pub(crate) fn validate(&self) -> Result<(), RaftError> {
        let bad = |m: &str| Err(RaftError::InvalidConfig(m.to_string()));
        if self.raft_id == 0 {
            return bad("raft_id must be non-zero");
        }
        if self.tick_interval_ms == 0 {
            return bad("tick_interval_ms must be at least 1");
        }
        if self.heartbeat_tick == 0 || self.election_tick <= self.heartbeat_tick {
            return bad("election_tick must be greater than heartbeat_tick, which must be at least 1");
        }
        if self.snapshot_interval_entries == 0 {
            return bad("snapshot_interval_entries must be at least 1");
        }
        if self.snapshot_interval_bytes == 0 {
            return bad("snapshot_interval_bytes must be at least 1");
        }
        if self.max_proposal_bytes == 0 {
            return bad("max_proposal_bytes must be at least 1");
        }
        Ok(())
    }
}

/// The cluster's snapshot settings (`ClusterSpec.raft`: `SnapshotInterval`, `KeepOldSnapshots`,
/// `LogEntriesForSlowFollowers`, set with `docker swarm update --snapshot-interval` etc.), applied to a running
/// member by `RaftNode::set_snapshot_policy`. The byte bounds (`snapshot_interval_bytes`,
/// `log_bytes_for_slow_followers`) are not part of it: they always hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotPolicy {
    /// A snapshot every this many applied entries; 0: none by count (SwarmKit's meaning), only by bytes.
    pub interval_entries: u64,
    /// Snapshot files kept beyond the newest one.
    pub keep_old_snapshots: u64,
    /// Entries kept in the log behind a snapshot for slow followers.
    pub log_entries_for_slow_followers: u64,
}

impl SnapshotPolicy {
    /// Applies the policy to `cfg`.
    pub(crate) fn apply_to(&self, cfg: &mut RaftConfig) {
        cfg.snapshot_interval_entries = if self.interval_entries == 0 { u64::MAX } else { self.interval_entries };
        cfg.keep_old_snapshots = self.keep_old_snapshots;
        cfg.log_entries_for_slow_followers = self.log_entries_for_slow_followers;
    }
}
