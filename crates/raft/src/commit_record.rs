//! The commit record: a small file beside the raft log (`state_dir/raft/commit-record`) that says what this
//! member ever acknowledged, independently of raft-engine, so a damaged log cannot hide the loss of
//! acknowledged entries (a cut log file also loses the hard state stored inside it).
//!
//! It holds the highest commit index and term this member's storage recorded. Entries up to the commit
//! index were synced to the log before the index was recorded, and the record is written only after the log
//! write that carried them returned, so the record never claims more than the log held. Updates are a
//! `pwrite` of one 64-byte slot without an fsync (the write path keeps its one fsync per write): the page
//! cache keeps it across a crash of the process, and a power loss can only leave an older record (a lower
//! bound, still true). The file is fsync'd when created and at a clean stop; not at snapshots, where
//! it would add a disk wait to the driver thread and nothing the page cache does not already give.
//!
//! Layout: two slots of `SLOT_BYTES`, written alternately, each `magic | seq | commit | term | digest`
//! (big-endian u64s; the digest is the first 16 bytes of SHA-256 over the slot's first 32 bytes). A read
//! takes the valid slot with the higher `seq`, so a torn slot write leaves the other one. Depends on std
//! and sha2 only; knows nothing of raft-engine.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::RaftError;

const MAGIC: &[u8; 8] = b"SHOALCR1";
const SLOT_BYTES: usize = 64;
const DIGEST_BYTES: usize = 16;

/// The file's name under `state_dir/raft`.
pub(crate) const FILE_NAME: &str = "commit-record";

/// What a member acknowledged: entries through `commit` are committed, and it took part in `term`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Acked {
    /// Highest commit index recorded.
    pub(crate) commit: u64,
    /// Highest term recorded.
    pub(crate) term: u64,
}

/// The record's path for a state dir.
pub(crate) fn path(state_dir: &Path) -> PathBuf {
    state_dir.join("raft").join(FILE_NAME)
}

fn io_err(path: &Path, source: std::io::Error) -> RaftError {
    RaftError::io(path, source)
}

fn encode_slot(seq: u64, acked: Acked) -> [u8; SLOT_BYTES] {
    let mut slot = [0u8; SLOT_BYTES];
    slot[..8].copy_from_slice(MAGIC);
    slot[8..16].copy_from_slice(&seq.to_be_bytes());
    slot[16..24].copy_from_slice(&acked.commit.to_be_bytes());
    slot[24..32].copy_from_slice(&acked.term.to_be_bytes());
    let digest = Sha256::digest(&slot[..32]);
    slot[32..32 + DIGEST_BYTES].copy_from_slice(&digest[..DIGEST_BYTES]);
    slot
}

fn decode_slot(slot: &[u8]) -> Option<(u64, Acked)> {
    if slot.len() != SLOT_BYTES || &slot[..8] != MAGIC {
        return None;
    }
    let digest = Sha256::digest(&slot[..32]);
    if slot[32..32 + DIGEST_BYTES] != digest[..DIGEST_BYTES] {
        return None;
    }
    let u = |r: std::ops::Range<usize>| u64::from_be_bytes(slot[r].try_into().expect("8 bytes"));
    Some((u(8..16), Acked { commit: u(16..24), term: u(24..32) }))
}

/// Reads the record: `None` when the file does not exist (a new member, or state written before the record
/// existed); an error when it exists but neither slot is valid (the file is damaged).
pub(crate) fn read(path: &Path) -> Result<Option<Acked>, RaftError> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(path, e)),
    };
    match best_slot(&bytes) {
        Some((_, acked)) => Ok(Some(acked)),
        None => Err(RaftError::Damaged {
            path: path.to_path_buf(),
            what: format!(
                "the commit record ({} bytes) holds no valid slot, so what this manager acknowledged is unknown",
                bytes.len()
            ),
        }),
    }
}

fn best_slot(bytes: &[u8]) -> Option<(u64, Acked)> {
    bytes.chunks(SLOT_BYTES).take(2).filter_map(decode_slot).max_by_key(|(seq, _)| *seq)
}

/// The record, open for updates.
#[derive(Debug)]
pub(crate) struct CommitRecord {
    path: PathBuf,
    file: File,
    seq: u64,
    acked: Acked,
}

impl CommitRecord {
    /// Opens the record at `path`, creating it durably with `initial` when it does not exist.
    pub(crate) fn open(path: &Path, initial: Acked) -> Result<CommitRecord, RaftError> {
        if !path.exists() {
            let tmp = path.with_extension("tmp");
            {
                let mut f = File::create(&tmp).map_err(|e| io_err(&tmp, e))?;
                let mut both = encode_slot(1, initial).to_vec();
                both.extend_from_slice(&encode_slot(0, initial));
                f.write_all(&both).map_err(|e| io_err(&tmp, e))?;
                f.sync_all().map_err(|e| io_err(&tmp, e))?;
            }
            fs::rename(&tmp, path).map_err(|e| io_err(path, e))?;
            if let Some(dir) = path.parent() {
                File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io_err(dir, e))?;
            }
        }
        let bytes = fs::read(path).map_err(|e| io_err(path, e))?;
        let (seq, acked) = best_slot(&bytes).ok_or_else(|| RaftError::Damaged {
            path: path.to_path_buf(),
            what: "the commit record holds no valid slot".into(),
        })?;
        let file = OpenOptions::new().write(true).open(path).map_err(|e| io_err(path, e))?;
        Ok(CommitRecord { path: path.to_path_buf(), file, seq, acked })
    }

    /// Raises the record to `commit` and `term` (each only moves up); a `pwrite` of one slot, no fsync.
    /// Call it only after the log write that made entries through `commit` durable has returned.
    pub(crate) fn raise(&mut self, commit: u64, term: u64) -> Result<(), RaftError> {
        let next = Acked { commit: commit.max(self.acked.commit), term: term.max(self.acked.term) };
        if next == self.acked {
            return Ok(());
        }
        let seq = self.seq + 1;
        let offset = (seq % 2) * SLOT_BYTES as u64;
        self.file.write_all_at(&encode_slot(seq, next), offset).map_err(|e| io_err(&self.path, e))?;
        self.seq = seq;
        self.acked = next;
        Ok(())
    }

    /// Makes the last update durable.
    pub(crate) fn sync(&self) -> Result<(), RaftError> {
        self.file.sync_data().map_err(|e| io_err(&self.path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raises_survive_reopen_and_a_torn_slot_leaves_the_other() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(FILE_NAME);
        assert_eq!(read(&p).unwrap(), None, "no file: nothing recorded");
        let mut r = CommitRecord::open(&p, Acked { commit: 3, term: 1 }).unwrap();
        r.raise(10, 2).unwrap();
        r.raise(7, 1).unwrap(); // never moves down
        assert_eq!(read(&p).unwrap(), Some(Acked { commit: 10, term: 2 }));
        r.raise(11, 2).unwrap();
        r.sync().unwrap();
        drop(r);
        assert_eq!(read(&p).unwrap(), Some(Acked { commit: 11, term: 2 }));

        // Tear the newest slot (seq 3 lives in slot 1): the older one answers.
        let mut bytes = fs::read(&p).unwrap();
        bytes[SLOT_BYTES + 20] ^= 0xff;
        fs::write(&p, &bytes).unwrap();
        assert_eq!(read(&p).unwrap(), Some(Acked { commit: 10, term: 2 }));

        // Both slots damaged: an error that says so, not a fresh start.
        bytes[20] ^= 0xff;
        fs::write(&p, &bytes).unwrap();
        let err = read(&p).unwrap_err().to_string();
        assert!(err.contains("commit record") && err.contains("no valid slot"), "{err}");
    }
}
