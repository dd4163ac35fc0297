//! `raft::Storage` over raft-engine: the log entries (region `LOG_REGION`) and the small durable state
//! (region `META_REGION`: hard state, conf state, the members' addresses, the latest snapshot's metadata and
//! the truncation point)
//! under `state_dir/raft/log`. Every write that Raft depends on is made with `sync = true`.
//!
//! The log may start before the latest snapshot (entries are kept for slow followers); `truncated` is the
//! (index, term) of the entry just before the first one kept, so `term(first_index - 1)` always answers.
//! Knows nothing of the store: snapshot bytes live in `snapshot_files`.
//!
//! Encryption at rest: every entry's data is sealed with the node's DEK (`encryption::DataKeys`, associated
//! data = the entry's index) on its way into raft-engine and opened on its way out, so raft-rs, the
//! replay and the followers see plain entries while the files hold none. Empty data (a leader's no-op)
//! stays empty. The small durable state (hard state, conf state, addresses) is not sealed.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState, StorageError};
use raft_engine::{Command, Engine, LogBatch, MessageExt};

use crate::encryption::{entry_aad, DataKeys};
use crate::snapshot_files::SnapshotDir;
use crate::{Members, RaftError};

/// raft-engine group holding the log entries.
const LOG_REGION: u64 = 1;
/// raft-engine group holding the durable state (keys below).
const META_REGION: u64 = 2;
const KEY_HARD_STATE: &[u8] = b"hard_state";
const KEY_CONF_STATE: &[u8] = b"conf_state";
const KEY_SNAPSHOT: &[u8] = b"snapshot_meta";
const KEY_TRUNCATED: &[u8] = b"truncated";
const KEY_MEMBERS: &[u8] = b"members";

/// Entries read per raft-engine call when replaying the log at start.
pub(crate) const REPLAY_CHUNK_ENTRIES: u64 = 1024;

/// Tells raft-engine how to index raft-rs entries.
struct EntryCodec;

impl MessageExt for EntryCodec {
    type Entry = Entry;

    fn index(e: &Entry) -> u64 {
        e.index
    }
}

/// The Raft log and durable state on disk, plus a cache of the small state.
pub(crate) struct EngineStorage {
    /// Always `Some`, except for the instant `reencrypt` swaps the log directory.
    engine_slot: Option<Arc<Engine>>,
    log_dir: PathBuf,
    keys: DataKeys,
    snapshots: SnapshotDir,
    hard_state: HardState,
    conf_state: ConfState,
    /// The members' addresses as of `conf_state`.
    members: Members,
    snapshot: SnapshotMetadata,
    /// (index, term) of the last entry removed from the front of the log.
    truncated: (u64, u64),
    /// Synced writes made so far (observability; shows group commit at work).
    synced_writes: Arc<AtomicU64>,
}

impl std::fmt::Debug for EngineStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineStorage")
            .field("log_dir", &self.log_dir)
            .field("hard_state", &self.hard_state)
            .field("snapshot_index", &self.snapshot.index)
            .field("truncated", &self.truncated)
            .finish()
    }
}

/// The raft-engine directory under a node's state dir.
pub(crate) fn log_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("raft").join("log")
}

fn engine_err(path: &Path, e: impl std::fmt::Display) -> RaftError {
    RaftError::Log { path: path.to_path_buf(), reason: e.to_string() }
}

fn open_engine(dir: &Path) -> Result<Engine, RaftError> {
    let cfg = raft_engine::Config {
        dir: dir.to_string_lossy().into_owned(),
        // A torn record at the tail (crash during a write that was never acknowledged) is dropped.
        recovery_mode: raft_engine::RecoveryMode::TolerateTailCorruption,
        // The entries are sealed (random-looking): compressing them would only cost CPU.
        batch_compression_threshold: raft_engine::ReadableSize(0),
        ..Default::default()
    };
    Engine::open(cfg).map_err(|e| engine_err(dir, e))
}

/// Where `reencrypt` builds the new log, and the file that says it is complete.
fn rekey_paths(state_dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let raft = state_dir.join("raft");
    (raft.join("log.rekey"), raft.join("log.rekey.done"), raft.join("log.old"))
}

fn fsync_dir(dir: &Path) -> Result<(), RaftError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| RaftError::StateDir { path: dir.to_path_buf(), source: e })
}

fn remove_dir_if_present(dir: &Path) -> Result<(), RaftError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(RaftError::StateDir { path: dir.to_path_buf(), source: e }),
    }
}

/// Completes or undoes a `reencrypt` a crash interrupted: with the completion marker, the new log replaces
/// the old one; without it, the partial new log is removed (the old one is intact).
fn finish_interrupted_reencrypt(state_dir: &Path) -> Result<(), RaftError> {
    let (new_dir, done, old_dir) = rekey_paths(state_dir);
    let live = log_dir(state_dir);
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |e| RaftError::StateDir { path: p, source: e }
    };
    if done.exists() {
        if new_dir.exists() {
            if live.exists() {
                std::fs::rename(&live, &old_dir).map_err(io(&live))?;
            }
            std::fs::rename(&new_dir, &live).map_err(io(&new_dir))?;
        }
        remove_dir_if_present(&old_dir)?;
        std::fs::remove_file(&done).map_err(io(&done))?;
        fsync_dir(&state_dir.join("raft"))?;
        tracing::info!("completed the re-encryption of the raft log interrupted by the last stop");
    } else {
        remove_dir_if_present(&new_dir)?;
        remove_dir_if_present(&old_dir)?;
    }
    Ok(())
}

fn store_err(e: impl std::fmt::Display) -> raft::Error {
    raft::Error::Store(StorageError::Other(e.to_string().into()))
}

impl EngineStorage {
    /// Opens (creating if needed) the log under `state_dir/raft`, sealing and opening entries with `keys`.
    /// Returns the storage and whether it holds a bootstrapped state (a conf state was recorded).
    pub(crate) fn open(state_dir: &Path, keys: DataKeys) -> Result<(EngineStorage, bool), RaftError> {
        let log_dir = log_dir(state_dir);
        std::fs::create_dir_all(&log_dir).map_err(|e| RaftError::StateDir { path: log_dir.clone(), source: e })?;
        let snapshots = SnapshotDir::open(state_dir.join("raft").join("snapshots"), keys.clone())?;
        finish_interrupted_reencrypt(state_dir)?;
        let engine = open_engine(&log_dir)?;
        let get = |key: &[u8]| -> Result<Option<Vec<u8>>, RaftError> { Ok(engine.get(META_REGION, key)) };
        let parse_err = |what: &str, e: protobuf::ProtobufError| RaftError::Corrupted {
            path: log_dir.clone(),
            reason: format!("cannot decode the stored {what}: {e}"),
        };
        let hard_state = match get(KEY_HARD_STATE)? {
            Some(b) => HardState::parse_from_bytes(&b).map_err(|e| parse_err("hard state", e))?,
            None => HardState::default(),
        };
        let (conf_state, bootstrapped) = match get(KEY_CONF_STATE)? {
            Some(b) => (ConfState::parse_from_bytes(&b).map_err(|e| parse_err("conf state", e))?, true),
            None => (ConfState::default(), false),
        };
        let members = match get(KEY_MEMBERS)? {
            Some(b) => Members::decode(&b).map_err(|e| RaftError::Corrupted {
                path: log_dir.clone(),
                reason: format!("cannot decode the stored members: {e}"),
            })?,
            None => Members::default(),
        };
        let snapshot = match get(KEY_SNAPSHOT)? {
            Some(b) => SnapshotMetadata::parse_from_bytes(&b).map_err(|e| parse_err("snapshot metadata", e))?,
            None => SnapshotMetadata::default(),
        };
        let truncated = match get(KEY_TRUNCATED)? {
            Some(b) if b.len() == 16 => {
                let index = u64::from_be_bytes(b[..8].try_into().expect("8 bytes"));
                let term = u64::from_be_bytes(b[8..].try_into().expect("8 bytes"));
                (index, term)
            }
            Some(b) => {
                return Err(RaftError::Corrupted {
                    path: log_dir,
                    reason: format!("the truncation point has {} bytes, expected 16", b.len()),
                })
            }
            None => (snapshot.index, snapshot.term),
        };
        let storage = EngineStorage {
            engine_slot: Some(Arc::new(engine)),
            log_dir,
            keys,
            snapshots,
            hard_state,
            conf_state,
            members,
            snapshot,
            truncated,
            synced_writes: Arc::new(AtomicU64::new(0)),
        };
        if bootstrapped && storage.hard_state.commit < storage.snapshot.index {
            return Err(RaftError::Corrupted {
                path: storage.log_dir.clone(),
                reason: format!(
                    "the commit index {} is behind the snapshot index {}",
                    storage.hard_state.commit, storage.snapshot.index
                ),
            });
        }
        Ok((storage, bootstrapped))
    }

    /// Records the initial membership of a new cluster (durably).
    pub(crate) fn bootstrap(&mut self, conf_state: ConfState, members: Members) -> Result<(), RaftError> {
        let mut batch = LogBatch::default();
        self.put(&mut batch, KEY_CONF_STATE, &conf_state)?;
        self.put_members(&mut batch, &members)?;
        self.write(&mut batch)?;
        self.conf_state = conf_state.clone();
        self.members = members;
        self.snapshot.set_conf_state(conf_state);
        Ok(())
    }

    /// Records the members' addresses only (a joining node's view before it receives the leader's snapshot;
    /// no conf state, so the node stays unbootstrapped).
    pub(crate) fn set_members(&mut self, members: Members) -> Result<(), RaftError> {
        let mut batch = LogBatch::default();
        self.put_members(&mut batch, &members)?;
        self.write(&mut batch)?;
        self.members = members;
        Ok(())
    }

    /// The members' addresses as last persisted.
    pub(crate) fn members(&self) -> &Members {
        &self.members
    }

    fn put_members(&self, batch: &mut LogBatch, members: &Members) -> Result<(), RaftError> {
        batch.put(META_REGION, KEY_MEMBERS.to_vec(), members.encode()).map_err(|e| engine_err(&self.log_dir, e))
    }

    /// The snapshot files.
    pub(crate) fn snapshot_dir(&self) -> &SnapshotDir {
        &self.snapshots
    }

    /// The counter of synced writes (shared, for the handle).
    pub(crate) fn synced_writes(&self) -> Arc<AtomicU64> {
        self.synced_writes.clone()
    }

    /// The hard state as last persisted.
    pub(crate) fn hard_state(&self) -> &HardState {
        &self.hard_state
    }

    /// The membership as last persisted.
    pub(crate) fn conf_state(&self) -> &ConfState {
        &self.conf_state
    }

    /// The latest snapshot's metadata (index 0 when there is none).
    pub(crate) fn snapshot_metadata(&self) -> &SnapshotMetadata {
        &self.snapshot
    }

    fn put(&self, batch: &mut LogBatch, key: &[u8], msg: &impl protobuf::Message) -> Result<(), RaftError> {
        batch.put_message(META_REGION, key.to_vec(), msg).map_err(|e| engine_err(&self.log_dir, e))
    }

    fn write(&self, batch: &mut LogBatch) -> Result<(), RaftError> {
        self.write_with(batch, true)
    }

    /// Writes a batch, with an fsync when `sync` (then counted in `synced_writes`). An unsynced write still
    /// reaches the file in order: the next synced write (or `sync`) makes it durable with everything before it.
    fn write_with(&self, batch: &mut LogBatch, sync: bool) -> Result<(), RaftError> {
        self.engine().write(batch, sync).map_err(|e| engine_err(&self.log_dir, e))?;
        if sync {
            self.synced_writes.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Persists new log entries (overwriting any conflicting tail) and the hard state. It is fsynced when it
    /// carries entries or a new term or vote, which Raft needs durable before anything depends on them. A hard
    /// state whose only change is the commit index is written without an fsync: the commit index is volatile
    /// state in Raft (a restarted node learns it again from its log and the leader), so one write costs one
    /// fsync instead of two. A later synced write flushes it, and every snapshot record is synced, so the
    /// commit index on disk is never behind a recorded snapshot.
    pub(crate) fn append(&mut self, entries: &[Entry], hard_state: Option<&HardState>) -> Result<(), RaftError> {
        if entries.is_empty() && hard_state.is_none() {
            return Ok(());
        }
        let sync = !entries.is_empty()
            || hard_state.is_some_and(|hs| hs.term != self.hard_state.term || hs.vote != self.hard_state.vote);
        let mut batch = LogBatch::default();
        if !entries.is_empty() {
            let sealed: Vec<Entry> = entries.iter().map(|e| self.seal(e)).collect();
            batch.add_entries::<EntryCodec>(LOG_REGION, &sealed).map_err(|e| engine_err(&self.log_dir, e))?;
        }
        if let Some(hs) = hard_state {
            self.put(&mut batch, KEY_HARD_STATE, hs)?;
        }
        self.write_with(&mut batch, sync)?;
        if let Some(hs) = hard_state {
            self.hard_state = hs.clone();
        }
        Ok(())
    }

    /// Records a higher commit index (before the newly committed entries are applied), unsynced (see `append`).
    pub(crate) fn set_commit(&mut self, commit: u64) -> Result<(), RaftError> {
        if commit <= self.hard_state.commit {
            return Ok(());
        }
        let mut hs = self.hard_state.clone();
        hs.commit = commit;
        self.append(&[], Some(&hs))
    }

    /// Persists a new membership (after a conf change was applied): conf state and addresses in one write.
    pub(crate) fn set_membership(&mut self, cs: ConfState, members: Members) -> Result<(), RaftError> {
        let mut batch = LogBatch::default();
        self.put(&mut batch, KEY_CONF_STATE, &cs)?;
        self.put_members(&mut batch, &members)?;
        self.write(&mut batch)?;
        self.conf_state = cs;
        self.members = members;
        Ok(())
    }

    /// Records a snapshot this node took (its file is already written), then drops log entries up to and
    /// including `compact_through` (if that moves the front of the log) and purges obsolete log files.
    pub(crate) fn record_snapshot(&mut self, meta: SnapshotMetadata, compact_through: u64) -> Result<(), RaftError> {
        let mut batch = LogBatch::default();
        self.put(&mut batch, KEY_SNAPSHOT, &meta)?;
        let mut new_truncated = None;
        if compact_through > self.truncated.0 && compact_through <= meta.index {
            let term = raft::Storage::term(self, compact_through)
                .map_err(|e| engine_err(&self.log_dir, format!("term of entry {compact_through}: {e}")))?;
            batch
                .put(META_REGION, KEY_TRUNCATED.to_vec(), truncated_bytes(compact_through, term))
                .map_err(|e| engine_err(&self.log_dir, e))?;
            batch.add_command(LOG_REGION, Command::Compact { index: compact_through + 1 });
            new_truncated = Some((compact_through, term));
        }
        self.write(&mut batch)?;
        self.snapshot = meta;
        if let Some(t) = new_truncated {
            self.truncated = t;
            self.engine().purge_expired_files().map_err(|e| engine_err(&self.log_dir, e))?;
        }
        Ok(())
    }

    /// Installs a snapshot received from the leader (its file is already written): the whole log is
    /// replaced by it.
    pub(crate) fn install_snapshot(&mut self, meta: SnapshotMetadata, members: Members) -> Result<(), RaftError> {
        let mut hs = self.hard_state.clone();
        hs.term = hs.term.max(meta.term);
        hs.commit = meta.index;
        let cs = meta.get_conf_state().clone();
        let mut batch = LogBatch::default();
        batch.add_command(LOG_REGION, Command::Clean);
        self.put(&mut batch, KEY_SNAPSHOT, &meta)?;
        self.put(&mut batch, KEY_HARD_STATE, &hs)?;
        self.put(&mut batch, KEY_CONF_STATE, &cs)?;
        self.put_members(&mut batch, &members)?;
        batch
            .put(META_REGION, KEY_TRUNCATED.to_vec(), truncated_bytes(meta.index, meta.term))
            .map_err(|e| engine_err(&self.log_dir, e))?;
        self.write(&mut batch)?;
        self.truncated = (meta.index, meta.term);
        self.hard_state = hs;
        self.conf_state = cs;
        self.members = members;
        self.snapshot = meta;
        Ok(())
    }

    /// Reads entries `[low, high)` for replay at start (opened: plain data).
    pub(crate) fn read_entries(&self, low: u64, high: u64) -> Result<Vec<Entry>, RaftError> {
        let mut out = Vec::with_capacity((high - low) as usize);
        self.engine()
            .fetch_entries_to::<EntryCodec>(LOG_REGION, low, high, None, &mut out)
            .map_err(|e| engine_err(&self.log_dir, format!("reading entries {low}..{high}: {e}")))?;
        if out.len() as u64 != high - low {
            return Err(RaftError::Corrupted {
                path: self.log_dir.clone(),
                reason: format!("entries {low}..{high} are incomplete ({} found)", out.len()),
            });
        }
        for e in &mut out {
            self.unseal(e)?;
        }
        Ok(out)
    }

    /// A copy of `e` with its data sealed (empty data stays empty).
    fn seal(&self, e: &Entry) -> Entry {
        let mut sealed = e.clone();
        if !e.data.is_empty() {
            sealed.data = self.keys.encrypt(&entry_aad(e.index), &e.data).into();
        }
        sealed
    }

    /// Replaces a stored entry's sealed data with the plain data.
    fn unseal(&self, e: &mut Entry) -> Result<(), RaftError> {
        if e.data.is_empty() {
            return Ok(());
        }
        let plain = self.keys.decrypt(&entry_aad(e.index), &e.data).map_err(|err| RaftError::Decrypt {
            path: self.log_dir.clone(),
            what: format!("log entry {}", e.index),
            reason: crate::encryption::decrypt_failure(&err),
        })?;
        e.data = plain.into();
        Ok(())
    }

    /// Flushes everything written so far.
    pub(crate) fn sync(&self) -> Result<(), RaftError> {
        self.engine().sync().map_err(|e| engine_err(&self.log_dir, e))
    }

    fn first(&self) -> u64 {
        self.truncated.0 + 1
    }

    fn last(&self) -> u64 {
        match self.engine().last_index(LOG_REGION) {
            Some(last) if last > self.truncated.0 => last,
            _ => self.truncated.0,
        }
    }

    /// First index still in the log.
    pub(crate) fn first_log_index(&self) -> u64 {
        self.first()
    }

    fn engine(&self) -> &Engine {
        self.engine_slot.as_deref().expect("the raft log is open")
    }

    /// Re-seals everything on disk with `keys` (which must also hold the keys the present records were sealed
    /// with): every snapshot file is rewritten, and the log is copied into a new raft-engine directory whose
    /// records are all sealed with `keys`' current DEK, which then replaces the old directory (so no record
    /// sealed with an older DEK stays in a log file). Crash-safe: the new log is used only once complete
    /// (`finish_interrupted_reencrypt` at the next open). Afterwards the older DEKs can be forgotten.
    pub(crate) fn reencrypt(&mut self, state_dir: &Path, keys: DataKeys) -> Result<(), RaftError> {
        let (new_dir, done, old_dir) = rekey_paths(state_dir);
        // Snapshots: read with any key, written with the current one.
        let snapshots = SnapshotDir::open(state_dir.join("raft").join("snapshots"), keys.clone())?;
        for index in snapshots.list()? {
            let data = snapshots.read(index)?;
            snapshots.write(index, &data)?;
        }
        // The log, into a fresh directory.
        remove_dir_if_present(&new_dir)?;
        std::fs::create_dir_all(&new_dir).map_err(|e| RaftError::StateDir { path: new_dir.clone(), source: e })?;
        {
            let fresh = open_engine(&new_dir)?;
            let mut batch = LogBatch::default();
            for key in [KEY_HARD_STATE, KEY_CONF_STATE, KEY_SNAPSHOT, KEY_TRUNCATED, KEY_MEMBERS] {
                if let Some(v) = self.engine().get(META_REGION, key) {
                    batch.put(META_REGION, key.to_vec(), v).map_err(|e| engine_err(&new_dir, e))?;
                }
            }
            fresh.write(&mut batch, true).map_err(|e| engine_err(&new_dir, e))?;
            let (mut low, last) = (self.first(), self.last());
            while low <= last {
                let high = (last + 1).min(low + REPLAY_CHUNK_ENTRIES);
                let plain = self.read_entries(low, high)?;
                let resealed: Vec<Entry> = plain
                    .iter()
                    .map(|e| {
                        let mut sealed = e.clone();
                        if !e.data.is_empty() {
                            sealed.data = keys.encrypt(&entry_aad(e.index), &e.data).into();
                        }
                        sealed
                    })
                    .collect();
                let mut batch = LogBatch::default();
                batch.add_entries::<EntryCodec>(LOG_REGION, &resealed).map_err(|e| engine_err(&new_dir, e))?;
                fresh.write(&mut batch, true).map_err(|e| engine_err(&new_dir, e))?;
                low = high;
            }
            fresh.sync().map_err(|e| engine_err(&new_dir, e))?;
        }
        fsync_dir(&new_dir)?;
        std::fs::File::create(&done)
            .and_then(|f| f.sync_all())
            .map_err(|e| RaftError::StateDir { path: done.clone(), source: e })?;
        fsync_dir(&state_dir.join("raft"))?;
        // Swap: close the old log, move the new one in place, reopen (whichever log is in place on failure).
        self.engine_slot = None;
        let swapped = finish_interrupted_reencrypt(state_dir);
        self.engine_slot = Some(Arc::new(open_engine(&self.log_dir)?));
        swapped?;
        debug_assert!(!old_dir.exists());
        self.keys = keys.clone();
        self.snapshots = snapshots;
        Ok(())
    }
}

fn truncated_bytes(index: u64, term: u64) -> Vec<u8> {
    let mut v = index.to_be_bytes().to_vec();
    v.extend_from_slice(&term.to_be_bytes());
    v
}

impl raft::Storage for EngineStorage {
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
        let mut out = Vec::with_capacity((high - low) as usize);
        let max = max_size.into().map(|m| m as usize);
        self.engine().fetch_entries_to::<EntryCodec>(LOG_REGION, low, high, max, &mut out).map_err(store_err)?;
        if out.is_empty() && high > low {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        for e in &mut out {
            self.unseal(e).map_err(store_err)?;
        }
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
        match self.engine().get_entry::<EntryCodec>(LOG_REGION, idx).map_err(store_err)? {
            Some(e) => Ok(e.term),
            None => Err(raft::Error::Store(StorageError::Unavailable)),
        }
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
        let data = self.snapshots.read(self.snapshot.index).map_err(store_err)?;
        let mut snap = Snapshot::default();
        snap.set_metadata(self.snapshot.clone());
        snap.data = data.into();
        Ok(snap)
    }
}
