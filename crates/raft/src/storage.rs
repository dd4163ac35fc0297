//! `raft::Storage` over raft-engine: the log entries (region `LOG_REGION`) and the small durable state
//! (region `META_REGION`: hard state, conf state, the members' addresses, the latest snapshot's metadata and
//! the truncation point)
//! under `state_dir/raft/log`. Every write that Raft depends on is made with `sync = true`.
//!
//! The log may start before the latest snapshot (entries are kept for slow followers); `truncated` is the
//! (index, term) of the entry just before the first one kept, so `term(first_index - 1)` always answers.
//! Knows nothing of the store: snapshot bytes live in `snapshot_files`.
//!
//! Opening never hides loss: raft-engine is opened with `AbsoluteConsistency` (a damaged record is refused,
//! nothing is rewritten), and the result is checked against the commit record (`commit_record`, what this
//! member acknowledged): every acknowledged entry present, the term not behind, every entry readable. When
//! raft-engine refuses, `repair_torn_tail` lets its tail recovery cut a copy of the log and compares what
//! is left with the record; only if nothing acknowledged was cut is the same cut made to the log.
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

use crate::commit_record::{self, Acked, CommitRecord};
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

/// Size at which raft-engine starts a new log file, in MiB.
const LOG_FILE_MIB: u64 = 16;
/// Size of the log's files past which compaction deletes files, in MiB (two files).
const LOG_PURGE_THRESHOLD_MIB: u64 = 2 * LOG_FILE_MIB;

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
    /// What this member acknowledged, recorded beside the log (see `commit_record`).
    record: CommitRecord,
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

/// Opens raft-engine in `dir`. `AbsoluteConsistency` refuses any damaged record without changing a byte;
/// `TolerateTailCorruption` cuts the last file at its first damaged record (used only once
/// `repair_torn_tail` has shown, on a copy, that the cut loses nothing acknowledged).
fn open_engine_with(dir: &Path, mode: raft_engine::RecoveryMode) -> raft_engine::Result<Engine> {
    let cfg = raft_engine::Config {
        dir: dir.to_string_lossy().into_owned(),
        recovery_mode: mode,
        // The entries are sealed (random-looking): compressing them would only cost CPU.
        batch_compression_threshold: raft_engine::ReadableSize(0),
        // Compaction frees whole files: smaller ones than the default 128 MiB keep the directory within a
        // few files of what the snapshot policy keeps (`RaftConfig::snapshot_interval_bytes`).
        target_file_size: raft_engine::ReadableSize::mb(LOG_FILE_MIB),
        // Files are freed only once the log is past this size: raft-engine then moves what old files still
        // hold (the durable state written at bootstrap, entries kept for slow followers) to its rewrite
        // queue and deletes them. Its default, 10 GiB, let the log grow to gigabytes before anything went.
        purge_threshold: raft_engine::ReadableSize::mb(LOG_PURGE_THRESHOLD_MIB),
        ..Default::default()
    };
    Engine::open(cfg)
}

/// Opens a log that must be intact (a fresh directory, or one this process just wrote).
fn open_engine(dir: &Path) -> Result<Engine, RaftError> {
    open_engine_with(dir, raft_engine::RecoveryMode::AbsoluteConsistency).map_err(|e| engine_err(dir, e))
}

/// The log's data files (raft-engine's `*.raftlog` and `*.rewrite`) with their sizes, by name; none when
/// the directory does not exist.
fn log_data_files(dir: &Path) -> Result<Vec<(PathBuf, u64)>, RaftError> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(RaftError::StateDir { path: dir.to_path_buf(), source: e }),
    };
    for entry in entries {
        let entry = entry.map_err(|e| RaftError::StateDir { path: dir.to_path_buf(), source: e })?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.ends_with(".raftlog") || name.ends_with(".rewrite") {
            let len = entry.metadata().map_err(|e| RaftError::StateDir { path: entry.path(), source: e })?.len();
            out.push((entry.path(), len));
        }
    }
    out.sort();
    Ok(out)
}

/// True when `state_dir/raft` shows this member had Raft state: a log file, the commit record or a
/// snapshot file (so a missing log is damage, not a fresh start).
pub(crate) fn has_raft_traces(state_dir: &Path) -> bool {
    let raft = state_dir.join("raft");
    let snapshots = std::fs::read_dir(raft.join("snapshots"))
        .map(|d| d.flatten().any(|e| e.file_name().to_str().is_some_and(|n| n.ends_with(".bin"))))
        .unwrap_or(false);
    snapshots
        || commit_record::path(state_dir).exists()
        || log_data_files(&log_dir(state_dir)).is_ok_and(|f| !f.is_empty())
}

/// The durable state kept in `META_REGION`.
struct Meta {
    hard_state: HardState,
    /// `None` until the member is bootstrapped (or has installed a snapshot).
    conf_state: Option<ConfState>,
    members: Members,
    snapshot: SnapshotMetadata,
    truncated: (u64, u64),
}

fn load_meta(engine: &Engine, log_dir: &Path) -> Result<Meta, RaftError> {
    let get = |key: &[u8]| engine.get(META_REGION, key);
    let parse_err = |what: &str, e: protobuf::ProtobufError| RaftError::Damaged {
        path: log_dir.to_path_buf(),
        what: format!("the stored {what} cannot be decoded ({e})"),
    };
    let hard_state = match get(KEY_HARD_STATE) {
        Some(b) => HardState::parse_from_bytes(&b).map_err(|e| parse_err("hard state", e))?,
        None => HardState::default(),
    };
    let conf_state = match get(KEY_CONF_STATE) {
        Some(b) => Some(ConfState::parse_from_bytes(&b).map_err(|e| parse_err("conf state", e))?),
        None => None,
    };
    let members = match get(KEY_MEMBERS) {
        Some(b) => Members::decode(&b).map_err(|e| RaftError::Damaged {
            path: log_dir.to_path_buf(),
            what: format!("the stored members cannot be decoded ({e})"),
        })?,
        None => Members::default(),
    };
    let snapshot = match get(KEY_SNAPSHOT) {
        Some(b) => SnapshotMetadata::parse_from_bytes(&b).map_err(|e| parse_err("snapshot metadata", e))?,
        None => SnapshotMetadata::default(),
    };
    let truncated = match get(KEY_TRUNCATED) {
        Some(b) if b.len() == 16 => {
            let index = u64::from_be_bytes(b[..8].try_into().expect("8 bytes"));
            let term = u64::from_be_bytes(b[8..].try_into().expect("8 bytes"));
            (index, term)
        }
        Some(b) => {
            return Err(RaftError::Damaged {
                path: log_dir.to_path_buf(),
                what: format!("the stored truncation point has {} bytes, expected 16", b.len()),
            })
        }
        None => (snapshot.index, snapshot.term),
    };
    Ok(Meta { hard_state, conf_state, members, snapshot, truncated })
}

/// The last index a log covers: its last entry, or its snapshot when the log holds nothing after it.
fn covered_through(engine: &Engine, meta: &Meta) -> u64 {
    engine.last_index(LOG_REGION).unwrap_or(0).max(meta.truncated.0).max(meta.snapshot.index)
}

fn file_name(p: &Path) -> String {
    p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// Whether raft-engine's refusal to open a log is about its content (a damaged or cut record), rather
/// than about using the files (a lock held by another process, permissions, a full disk).
fn is_damage(e: &raft_engine::Error) -> bool {
    match e {
        raft_engine::Error::Corruption(_) | raft_engine::Error::Codec(_) | raft_engine::Error::Protobuf(_) => true,
        raft_engine::Error::Io(io) => {
            matches!(io.kind(), std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::InvalidData)
        }
        _ => false,
    }
}

/// Called when raft-engine refused to open the log in `AbsoluteConsistency` mode (`strict_err`). Repairs
/// the log only when the damage is a torn tail that holds nothing acknowledged; otherwise changes nothing
/// and returns `RaftError::Damaged`. The check runs on a copy (`raft/log.check`, removed afterwards):
/// raft-engine's tail recovery cuts the copy's last file at its first damaged record, and what the copy
/// still holds is compared with the commit record. Only then is the same cut made to the real log.
fn repair_torn_tail(
    state_dir: &Path,
    log_dir: &Path,
    strict_err: raft_engine::Error,
    acked: Option<Acked>,
) -> Result<Engine, RaftError> {
    let scratch = state_dir.join("raft").join("log.check");
    tracing::warn!(
        "the raft log at {} does not open cleanly ({strict_err}); checking a copy in {} for a torn tail (raft-engine's \
         messages about truncating a file refer to that copy)",
        log_dir.display(),
        scratch.display()
    );
    remove_dir_if_present(&scratch)?;
    std::fs::create_dir_all(&scratch).map_err(|e| RaftError::StateDir { path: scratch.clone(), source: e })?;
    let before = log_data_files(log_dir)?;
    let checked = (|| {
        for (p, _) in &before {
            let to = scratch.join(p.file_name().unwrap_or_default());
            std::fs::copy(p, &to).map_err(|e| RaftError::StateDir { path: to, source: e })?;
        }
        let copy = open_engine_with(&scratch, raft_engine::RecoveryMode::TolerateTailCorruption).map_err(|e| {
            if is_damage(&e) {
                RaftError::Damaged {
                    path: log_dir.to_path_buf(),
                    what: format!("the raft log cannot be read ({strict_err}), and not only at its tail ({e})"),
                }
            } else {
                engine_err(&scratch, e)
            }
        })?;
        let after = log_data_files(&scratch)?;
        let meta = load_meta(&copy, log_dir)?;
        let covered = covered_through(&copy, &meta);
        let last = copy.last_index(LOG_REGION).unwrap_or(0);
        Ok::<_, RaftError>((after, meta, covered, last))
    })();
    remove_dir_if_present(&scratch)?;
    let (after, meta, covered, last) = checked?;
    // Each file the check cut: its path, the length it keeps, its length now.
    let cuts: Vec<(&PathBuf, u64, u64)> = before
        .iter()
        .filter_map(|(p, len)| {
            let name = file_name(p);
            let now = after.iter().find(|(q, _)| file_name(q) == name).map_or(0, |(_, l)| *l);
            (now != *len).then_some((p, now, *len))
        })
        .collect();
    let cut: Vec<String> = cuts
        .iter()
        .map(|(p, now, len)| format!("{} is readable only up to byte {now} of {len}", p.display()))
        .collect();
    // raft-engine preallocates file space; a process that dies before closing the log leaves it as zeros.
    let only_zeros = cuts.iter().all(|(p, now, len)| now < len && bytes_are_zero(p, *now, *len));
    if cut.is_empty() {
        // Nothing a repair would change: not damage (e.g. the log is in use by another process).
        return Err(engine_err(log_dir, strict_err));
    }
    let cut = cut.join(", ");
    let total = |files: &[(PathBuf, u64)]| files.iter().map(|(_, l)| *l).sum::<u64>();
    let cut_bytes = total(&before).saturating_sub(total(&after));
    let Some(acked) = acked else {
        return Err(RaftError::Damaged {
            path: log_dir.to_path_buf(),
            what: format!(
                "{cut} ({strict_err}); there is no commit record (the state dir was written by an older Shoal), so \
                 whether the damaged part held acknowledged entries cannot be told"
            ),
        });
    };
    if covered < acked.commit {
        return Err(RaftError::Damaged {
            path: log_dir.to_path_buf(),
            what: format!(
                "{cut} ({strict_err}); the intact part holds entries through index {covered}, but entries through \
                 {} were acknowledged, so entries {}..={} would be lost",
                acked.commit,
                covered + 1,
                acked.commit
            ),
        });
    }
    if meta.hard_state.term < acked.term {
        return Err(RaftError::Damaged {
            path: log_dir.to_path_buf(),
            what: format!(
                "{cut} ({strict_err}); the intact part records term {}, but this member recorded term {} (its vote \
                 would be lost)",
                meta.hard_state.term, acked.term
            ),
        });
    }
    let engine = open_engine_with(log_dir, raft_engine::RecoveryMode::TolerateTailCorruption)
        .map_err(|e| engine_err(log_dir, e))?;
    if only_zeros {
        tracing::warn!(
            "cut the unused, preallocated tail of the raft log that a stop without closing the log leaves: {cut} \
             ({strict_err}); the {cut_bytes} bytes cut after entry {last} were all zeros; every acknowledged entry \
             (through index {}) is intact",
            acked.commit
        );
    } else {
        tracing::warn!(
            "repaired a torn write at the tail of the raft log: {cut} ({strict_err}), so {cut_bytes} bytes after \
             entry {last} were cut; they held nothing acknowledged (at most entries after {last} or a newer commit \
             index, never acknowledged); every acknowledged entry (through index {}) is intact",
            acked.commit
        );
    }
    Ok(engine)
}

/// Whether bytes `[from, to)` of the file at `path` are all zero (false when they cannot be read).
fn bytes_are_zero(path: &Path, from: u64, to: u64) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else { return false };
    if f.seek(SeekFrom::Start(from)).is_err() {
        return false;
    }
    let mut left = to - from;
    let mut buf = vec![0u8; 64 * 1024];
    while left > 0 {
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        match f.read(&mut buf[..want]) {
            Ok(0) | Err(_) => return false,
            Ok(n) => {
                if buf[..n].iter().any(|b| *b != 0) {
                    return false;
                }
                left -= n as u64;
            }
        }
    }
    true
}

/// Called when the log holds no data (no file, or only empty files): a fresh start only when nothing says
/// this member ever had Raft state.
fn check_empty_log(
    log_dir: &Path,
    files: &[(PathBuf, u64)],
    acked: Option<Acked>,
    snapshots: &SnapshotDir,
) -> Result<(), RaftError> {
    let log = if files.is_empty() {
        format!("the raft log {} is missing", log_dir.display())
    } else {
        let names: Vec<String> = files.iter().map(|(p, _)| file_name(p)).collect();
        format!("the raft log file(s) {} in {} are empty", names.join(", "), log_dir.display())
    };
    let damaged = |what: String| Err(RaftError::Damaged { path: log_dir.to_path_buf(), what });
    match acked {
        Some(a) if a.commit > 0 || a.term > 0 => {
            return damaged(format!(
                "{log}, but this member acknowledged entries through index {} (term {}) according to {}",
                a.commit,
                a.term,
                commit_record::FILE_NAME
            ))
        }
        None if !files.is_empty() => {
            return damaged(format!("{log}, and there is no commit record to tell what was acknowledged"))
        }
        _ => {}
    }
    let snaps = snapshots.list()?;
    if let Some(index) = snaps.last() {
        return damaged(format!("{log}, but snapshot {index} ({}) is on disk", snapshots.path(*index).display()));
    }
    // Empty files with nothing ever acknowledged (a first start that stopped at once): nothing to lose.
    for (p, _) in files {
        std::fs::remove_file(p).map_err(|e| RaftError::StateDir { path: p.clone(), source: e })?;
    }
    Ok(())
}

/// The reason inside a storage error, for a `Damaged` message (without the outer advice).
fn unwrap_reason(e: &RaftError) -> String {
    match e {
        RaftError::Log { reason, .. } | RaftError::Corrupted { reason, .. } => reason.clone(),
        RaftError::Decrypt { what, reason, .. } => format!("{what} cannot be decrypted: {reason}"),
        other => other.to_string(),
    }
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
    ///
    /// Refuses (`RaftError::Damaged`, nothing changed on disk) when what this member acknowledged (the
    /// commit record) is not all there: a missing or empty log, a damaged record anywhere but a torn tail
    /// that held nothing acknowledged, missing entries, a lost term, an entry that cannot be read or
    /// opened. A torn tail beyond what was acknowledged is cut, and the cut is logged.
    pub(crate) fn open(state_dir: &Path, keys: DataKeys) -> Result<(EngineStorage, bool), RaftError> {
        let log_dir = log_dir(state_dir);
        let raft_dir = state_dir.join("raft");
        std::fs::create_dir_all(&raft_dir).map_err(|e| RaftError::StateDir { path: raft_dir.clone(), source: e })?;
        let snapshots = SnapshotDir::open(raft_dir.join("snapshots"), keys.clone())?;
        finish_interrupted_reencrypt(state_dir)?;
        // A check a crash interrupted (`repair_torn_tail`): only a copy.
        remove_dir_if_present(&raft_dir.join("log.check"))?;
        let record_path = commit_record::path(state_dir);
        let acked = commit_record::read(&record_path)?;
        // The append queue (`*.raftlog`) holds every record written; the rewrite queue only older ones.
        let appends: Vec<(PathBuf, u64)> = log_data_files(&log_dir)?
            .into_iter()
            .filter(|(p, _)| p.extension().is_some_and(|x| x == "raftlog"))
            .collect();
        if appends.iter().all(|(_, len)| *len == 0) {
            check_empty_log(&log_dir, &appends, acked, &snapshots)?;
        }
        let engine = match open_engine_with(&log_dir, raft_engine::RecoveryMode::AbsoluteConsistency) {
            Ok(engine) => engine,
            Err(strict_err) if is_damage(&strict_err) => repair_torn_tail(state_dir, &log_dir, strict_err, acked)?,
            Err(other) => return Err(engine_err(&log_dir, other)),
        };
        let meta = load_meta(&engine, &log_dir)?;
        let bootstrapped = meta.conf_state.is_some();
        let record =
            CommitRecord::open(&record_path, Acked { commit: meta.hard_state.commit, term: meta.hard_state.term })?;
        let mut storage = EngineStorage {
            engine_slot: Some(Arc::new(engine)),
            log_dir,
            keys,
            snapshots,
            hard_state: meta.hard_state,
            conf_state: meta.conf_state.unwrap_or_default(),
            members: meta.members,
            snapshot: meta.snapshot,
            truncated: meta.truncated,
            record,
            synced_writes: Arc::new(AtomicU64::new(0)),
        };
        storage.verify(acked.unwrap_or_default(), bootstrapped)?;
        // A state dir from before the commit record: the record starts from the verified hard state.
        let hs = storage.hard_state.clone();
        storage.record.raise(hs.commit, hs.term)?;
        Ok((storage, bootstrapped))
    }

    /// Checks that the opened log holds everything `acked` says was acknowledged, and that every entry
    /// in it can be read and opened (a flipped byte inside an entry is caught here, by raft-engine's
    /// checksum or the entry's seal, rather than later by raft-rs).
    fn verify(&self, acked: Acked, bootstrapped: bool) -> Result<(), RaftError> {
        let damaged = |what: String| RaftError::Damaged { path: self.log_dir.clone(), what };
        if acked.commit > 0 && !bootstrapped {
            return Err(damaged(format!(
                "the raft log holds no membership (conf state), but entries through index {} were acknowledged",
                acked.commit
            )));
        }
        if self.hard_state.term < acked.term {
            return Err(damaged(format!(
                "the raft log's hard state records term {}, but this member recorded term {} (its vote would be lost)",
                self.hard_state.term, acked.term
            )));
        }
        let covered = self.last().max(self.snapshot.index);
        if covered < acked.commit {
            return Err(damaged(format!(
                "the raft log holds entries through index {covered} only, but entries through {} were \
                 acknowledged, so entries {}..={} are missing",
                acked.commit,
                covered + 1,
                acked.commit
            )));
        }
        if bootstrapped && self.hard_state.commit < self.snapshot.index {
            return Err(damaged(format!(
                "the commit index {} is behind the snapshot index {}",
                self.hard_state.commit, self.snapshot.index
            )));
        }
        let (mut low, last) = (self.first(), self.last());
        while low <= last {
            let high = (last + 1).min(low + REPLAY_CHUNK_ENTRIES);
            if self.read_entries(low, high).is_err() {
                // Name the first entry that cannot be read.
                for i in low..high {
                    if let Err(e) = self.read_entries(i, i + 1) {
                        if matches!(e, RaftError::Decrypt { .. }) {
                            // raft-engine's checksum passed: the key does not match (or the record was
                            // deliberately altered); that error says so.
                            return Err(e);
                        }
                        let acked_note = if i <= acked.commit.max(self.hard_state.commit) {
                            "an acknowledged entry"
                        } else {
                            "an entry synced to disk"
                        };
                        return Err(damaged(format!(
                            "entry {i} of the raft log ({acked_note}) cannot be read: {}",
                            unwrap_reason(&e)
                        )));
                    }
                }
            }
            low = high;
        }
        Ok(())
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

    fn put_members(&self, batch: &mut LogBatch, members: &Members) -> Result<(), RaftError> {
        batch.put(META_REGION, KEY_MEMBERS.to_vec(), members.encode()).map_err(|e| engine_err(&self.log_dir, e))
    }

    /// The counter of synced writes (shared, for the handle).
    pub(crate) fn synced_writes(&self) -> Arc<AtomicU64> {
        self.synced_writes.clone()
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
        self.engine().write(batch, sync).map_err(|e| RaftError::engine(&self.log_dir, e))?;
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
            // Entries through the commit index are in the log (synced by this write or an earlier one).
            self.record.raise(hs.commit, hs.term)?;
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
    fn record_snapshot_meta(&mut self, meta: SnapshotMetadata, compact_through: u64) -> Result<(), RaftError> {
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
            self.engine().purge_expired_files().map_err(|e| RaftError::engine(&self.log_dir, e))?;
        }
        Ok(())
    }

    /// Installs a snapshot received from the leader (its file is already written): the whole log is
    /// replaced by it.
    fn install_snapshot_meta(&mut self, meta: SnapshotMetadata, members: Members) -> Result<(), RaftError> {
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
        self.record.raise(hs.commit, hs.term)?;
        self.truncated = (meta.index, meta.term);
        self.hard_state = hs;
        self.conf_state = cs;
        self.members = members;
        self.snapshot = meta;
        Ok(())
    }

    /// Reads entries `[low, high)` for replay at start (opened: plain data).
    pub(crate) fn read_entries(&self, low: u64, high: u64) -> Result<Vec<Entry>, RaftError> {
        // A capacity hint only.
        let mut out = Vec::with_capacity(usize::try_from(high - low).unwrap_or(0));
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

    /// Flushes everything written so far (the log, then the commit record).
    pub(crate) fn sync(&self) -> Result<(), RaftError> {
        self.engine().sync().map_err(|e| RaftError::engine(&self.log_dir, e))?;
        self.record.sync()
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

impl crate::core::LogStorage for EngineStorage {
    fn append(&mut self, entries: &[Entry], hs: Option<&HardState>) -> Result<(), RaftError> {
        EngineStorage::append(self, entries, hs)
    }

    fn set_commit(&mut self, commit: u64) -> Result<(), RaftError> {
        EngineStorage::set_commit(self, commit)
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
        EngineStorage::set_membership(self, cs, members)
    }

    fn snapshot_metadata(&self) -> &SnapshotMetadata {
        &self.snapshot
    }

    /// The snapshot file the log names; a missing or unsealable file is damage (`RaftError::Damaged`).
    fn load_snapshot(&self) -> Result<Vec<u8>, RaftError> {
        let meta = &self.snapshot;
        let path = self.snapshots.path(meta.index);
        match self.snapshots.read(meta.index) {
            Ok(b) => Ok(b),
            Err(RaftError::StateDir { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                Err(RaftError::Damaged {
                    path,
                    what: format!(
                        "the raft log names snapshot {} (term {}) as the start of its state, but its file is missing",
                        meta.index, meta.term
                    ),
                })
            }
            Err(RaftError::Decrypt { reason, .. }) => Err(RaftError::Damaged {
                path,
                what: format!("snapshot {} cannot be opened (its seal does not verify: {reason})", meta.index),
            }),
            Err(e) => Err(e),
        }
    }

    fn snapshot_path(&self, index: u64) -> PathBuf {
        self.snapshots.path(index)
    }

    /// The file first, then the log state (which names it), then older files pruned.
    fn install_snapshot(
        &mut self,
        meta: SnapshotMetadata,
        data: &[u8],
        members: Members,
        keep: usize,
    ) -> Result<(), RaftError> {
        self.snapshots.write(meta.index, data)?;
        self.install_snapshot_meta(meta, members)?;
        self.snapshots.prune(keep)
    }

    /// The file first, then the log state (which names it), then older files pruned.
    fn record_snapshot(
        &mut self,
        meta: SnapshotMetadata,
        data: &[u8],
        compact_through: u64,
        keep: usize,
    ) -> Result<(), RaftError> {
        self.snapshots.write(meta.index, data)?;
        self.record_snapshot_meta(meta, compact_through)?;
        self.snapshots.prune(keep)
    }

    fn first_log_index(&self) -> u64 {
        EngineStorage::first_log_index(self)
    }

    fn read_entries(&self, low: u64, high: u64) -> Result<Vec<Entry>, RaftError> {
        EngineStorage::read_entries(self, low, high)
    }
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
        // A capacity hint only.
        let mut out = Vec::with_capacity(usize::try_from(high - low).unwrap_or(0));
        // raft-rs passes u64::MAX for "no limit": saturating keeps that meaning.
        let max = max_size.into().map(|m| usize::try_from(m).unwrap_or(usize::MAX));
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
