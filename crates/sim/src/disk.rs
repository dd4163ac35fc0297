//! One manager's Raft storage on a simulated disk: what raft-rs reads (`raft::Storage`) and what survives a
//! crash. It keeps the write discipline of the real storage (`shoal_raft`'s `EngineStorage`): entries, term
//! and vote are synced with every append; a hard state whose only change is the commit index is written
//! without a sync; snapshots are synced when recorded, so the commit on disk is never behind one. A crash
//! that loses the page cache (`crash(lose_unsynced = true)`) gives back the commit index of the last sync.
//!
//! Plain data: no IO, no clock.

use std::path::PathBuf;

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState, StorageError};
use shoal_raft::{LogStorage, Member, Members, RaftError};

/// Manager `raft_id` as the members list names it: its node ID and Raft address (made up: messages are
/// routed by Raft ID).
pub fn member(raft_id: u64) -> Member {
    Member { raft_id, node_id: format!("manager-{raft_id}"), addr: format!("10.0.0.{raft_id}:4242") }
}

/// The log, hard state, conf state and latest snapshot of one member.
#[derive(Clone, Debug, Default)]
pub struct SimStorage {
    hard_state: HardState,
    conf_state: ConfState,
    /// The members' addresses as of `conf_state` (none are needed: messages are routed by Raft ID).
    members: Members,
    /// The latest snapshot's metadata and data (index 0: none).
    snapshot: SnapshotMetadata,
    snapshot_data: Vec<u8>,
    /// Entries are kept after this index (whose term is `truncated.1`).
    truncated: (u64, u64),
    entries: Vec<Entry>,
    /// The commit index as of the last sync.
    synced_commit: u64,
    /// Syncs done (counted for the report).
    pub syncs: u64,
}

impl SimStorage {
    /// A new member's disk: no log, the given voters.
    /// The members are recorded with their addresses, as the daemon's bootstrap and joins record them.
    pub fn with_voters(voters: Vec<u64>) -> SimStorage {
        let members =
            Members { members: voters.iter().map(|id| (*id, member(*id))).collect(), removed: Default::default() };
        SimStorage { conf_state: ConfState { voters, ..Default::default() }, members, ..Default::default() }
    }

    /// A joining member's disk (`StartMode::Join`): no log, no configuration, the members the leader
    /// answered with; the leader's snapshot fills it.
    pub fn joining(members: Members) -> SimStorage {
        SimStorage { members, ..Default::default() }
    }

    /// The term of entry `idx` if this disk holds it (in the log, or covered by the snapshot: then the
    /// snapshot's term, as any index at or behind it is committed and applied).
    pub fn durable_term(&self, idx: u64) -> Option<u64> {
        if idx <= self.truncated.0 || idx <= self.snapshot.index {
            return Some(0);
        }
        (idx <= self.last()).then(|| self.entries[self.pos(idx)].term)
    }

    fn first(&self) -> u64 {
        self.truncated.0 + 1
    }

    fn last(&self) -> u64 {
        self.truncated.0 + self.entries.len() as u64
    }

    /// Where entry `idx` (at or past the log's first) is in `entries`.
    fn pos(&self, idx: u64) -> usize {
        usize::try_from(idx - self.first()).expect("an offset in the in-memory log")
    }

    /// Entries `[low, high)` (the caller keeps within the log).
    fn read(&self, low: u64, high: u64) -> Vec<Entry> {
        self.entries[self.pos(low)..self.pos(high)].to_vec()
    }

    /// Appends a Ready's entries (replacing any conflicting suffix) and its hard state; synced when there
    /// are entries or the term or vote changed, as the real storage does.
    fn append_entries(&mut self, entries: &[Entry], hs: Option<&HardState>) {
        let mut sync = false;
        if let Some(first) = entries.first() {
            assert!(first.index > self.truncated.0, "append at {} behind the log start {}", first.index, self.first());
            assert!(first.index <= self.last() + 1, "append at {} leaves a gap after {}", first.index, self.last());
            self.entries.truncate(self.pos(first.index));
            self.entries.extend_from_slice(entries);
            sync = true;
        }
        if let Some(hs) = hs {
            sync |= hs.term != self.hard_state.term || hs.vote != self.hard_state.vote;
            self.hard_state = hs.clone();
        }
        if sync {
            self.sync();
        }
    }

    fn sync(&mut self) {
        self.synced_commit = self.hard_state.commit;
        self.syncs += 1;
    }

    /// Installs a snapshot from the leader: the log restarts after it (synced).
    fn install(&mut self, meta: SnapshotMetadata, data: Vec<u8>, members: Members) {
        self.members = members;
        self.truncated = (meta.index, meta.term);
        self.entries.clear();
        self.hard_state.commit = self.hard_state.commit.max(meta.index);
        self.conf_state = meta.get_conf_state().clone();
        self.snapshot = meta;
        self.snapshot_data = data;
        self.sync();
    }

    /// Records a snapshot taken locally and compacts the log through `compact_through` (synced).
    fn record(&mut self, meta: SnapshotMetadata, data: Vec<u8>, compact_through: u64) {
        let through = compact_through.min(meta.index).min(self.last());
        if through > self.truncated.0 {
            let term = self.entries[self.pos(through)].term;
            self.entries.drain(..=self.pos(through));
            self.truncated = (through, term);
        }
        self.snapshot = meta;
        self.snapshot_data = data;
        self.sync();
    }

    /// What is on disk after a crash: everything synced; the commit index written since the last sync only
    /// when the page cache survived.
    pub fn crash(&self, lose_unsynced: bool) -> SimStorage {
        let mut disk = self.clone();
        if lose_unsynced {
            disk.hard_state.commit = self.synced_commit;
        }
        disk
    }
}

/// The simulated disk keeps one snapshot: older ones would only be read by a human.
impl LogStorage for SimStorage {
    fn append(&mut self, entries: &[Entry], hs: Option<&HardState>) -> Result<(), RaftError> {
        self.append_entries(entries, hs);
        Ok(())
    }

    /// A new commit index, without a sync.
    fn set_commit(&mut self, commit: u64) -> Result<(), RaftError> {
        self.hard_state.commit = commit;
        Ok(())
    }

    fn hard_state(&self) -> &HardState {
        &self.hard_state
    }

    fn conf_state(&self) -> &ConfState {
        &self.conf_state
    }

    fn members(&self) -> &Members {
        &self.members
    }

    fn set_membership(&mut self, cs: ConfState, members: Members) -> Result<(), RaftError> {
        self.conf_state = cs;
        self.members = members;
        self.sync();
        Ok(())
    }

    fn snapshot_metadata(&self) -> &SnapshotMetadata {
        &self.snapshot
    }

    fn load_snapshot(&self) -> Result<Vec<u8>, RaftError> {
        Ok(self.snapshot_data.clone())
    }

    fn snapshot_path(&self, index: u64) -> PathBuf {
        PathBuf::from(format!("<simulated disk>/snapshot-{index}"))
    }

    fn install_snapshot(
        &mut self,
        meta: SnapshotMetadata,
        data: &[u8],
        members: Members,
        _keep: usize,
    ) -> Result<(), RaftError> {
        self.install(meta, data.to_vec(), members);
        Ok(())
    }

    fn record_snapshot(
        &mut self,
        meta: SnapshotMetadata,
        data: &[u8],
        compact_through: u64,
        _keep: usize,
    ) -> Result<(), RaftError> {
        self.record(meta, data.to_vec(), compact_through);
        Ok(())
    }

    fn first_log_index(&self) -> u64 {
        self.first()
    }

    fn read_entries(&self, low: u64, high: u64) -> Result<Vec<Entry>, RaftError> {
        Ok(self.read(low, high))
    }
}

impl raft::Storage for SimStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(self.hard_state.clone(), self.conf_state.clone()))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low < self.first() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last() + 1 {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let mut out = self.read(low, high);
        raft::util::limit_size(&mut out, max_size.into());
        Ok(out)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx == self.truncated.0 {
            return Ok(self.truncated.1);
        }
        if idx == self.snapshot.index {
            return Ok(self.snapshot.term);
        }
        if idx < self.first() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if idx > self.last() {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        Ok(self.entries[self.pos(idx)].term)
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.first())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last())
    }

    fn snapshot(&self, _request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        if self.snapshot.index == 0 {
            return Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable));
        }
        let mut snap = Snapshot::default();
        snap.set_metadata(self.snapshot.clone());
        snap.data = self.snapshot_data.clone().into();
        Ok(snap)
    }
}
