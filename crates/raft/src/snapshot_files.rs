//! Snapshot files under `state_dir/raft/snapshots`: one file per snapshot, named by its Raft index, written
//! atomically (temporary file, fsync, rename, fsync of the directory). Once the log names a new snapshot, the
//! older files beyond the cluster's `KeepOldSnapshots` are removed (`prune`).
//!
//! Every file is sealed with the node's data encryption key (`encryption::DataKeys`, associated data = the
//! snapshot's index): `write` takes and `read` returns the plain bytes (the store's `encode_snapshot`
//! output, as sent to followers over TLS); nothing readable reaches the disk. The metadata lives in the log.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::encryption::{snapshot_aad, DataKeys};
use crate::RaftError;

const PREFIX: &str = "snapshot-";
const SUFFIX: &str = ".bin";

fn io_err(path: &Path, source: std::io::Error) -> RaftError {
    RaftError::io(path, source)
}

/// The snapshot directory.
#[derive(Debug, Clone)]
pub(crate) struct SnapshotDir {
    dir: PathBuf,
    keys: DataKeys,
}

impl SnapshotDir {
    /// Creates the directory if needed; files are sealed and opened with `keys`.
    pub(crate) fn open(dir: PathBuf, keys: DataKeys) -> Result<SnapshotDir, RaftError> {
        fs::create_dir_all(&dir).map_err(|e| io_err(&dir, e))?;
        Ok(SnapshotDir { dir, keys })
    }

    /// The file of the snapshot at `index`.
    pub(crate) fn path(&self, index: u64) -> PathBuf {
        self.dir.join(format!("{PREFIX}{index:020}{SUFFIX}"))
    }

    /// Writes the snapshot at `index` (plain bytes; sealed here) durably. A failed write leaves no file behind
    /// (a full disk keeps no half-written snapshot). Older files stay until `prune`, which the caller runs once
    /// the log names the new snapshot: until then a restart needs the one it names.
    pub(crate) fn write(&self, index: u64, data: &[u8]) -> Result<PathBuf, RaftError> {
        let data = self.keys.encrypt(&snapshot_aad(index), data);
        let path = self.path(index);
        let tmp = self.dir.join(format!("{PREFIX}{index:020}{SUFFIX}.tmp"));
        let written = (|| {
            let mut f = fs::File::create(&tmp).map_err(|e| io_err(&tmp, e))?;
            f.write_all(&data).map_err(|e| io_err(&tmp, e))?;
            f.sync_all().map_err(|e| io_err(&tmp, e))?;
            fs::rename(&tmp, &path).map_err(|e| io_err(&path, e))
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        fs::File::open(&self.dir).and_then(|d| d.sync_all()).map_err(|e| io_err(&self.dir, e))?;
        Ok(path)
    }

    /// Reads the snapshot at `index` and returns its plain bytes.
    pub(crate) fn read(&self, index: u64) -> Result<Vec<u8>, RaftError> {
        let path = self.path(index);
        let sealed = fs::read(&path).map_err(|e| io_err(&path, e))?;
        self.keys.decrypt(&snapshot_aad(index), &sealed).map_err(|e| RaftError::Decrypt {
            path: self.dir.clone(),
            what: format!("snapshot {index}"),
            reason: crate::encryption::decrypt_failure(&e),
        })
    }

    /// Indexes of the snapshot files present, ascending.
    pub(crate) fn list(&self) -> Result<Vec<u64>, RaftError> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.dir).map_err(|e| io_err(&self.dir, e))? {
            let entry = entry.map_err(|e| io_err(&self.dir, e))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Some(index) = name.strip_prefix(PREFIX).and_then(|n| n.strip_suffix(SUFFIX)) {
                if let Ok(index) = index.parse::<u64>() {
                    out.push(index);
                }
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// Removes all but the newest `keep` snapshot files (at least one), and leftover temporary files.
    pub(crate) fn prune(&self, keep: usize) -> Result<(), RaftError> {
        let all = self.list()?;
        let old = all.len().saturating_sub(keep.max(1));
        for index in &all[..old] {
            let p = self.path(*index);
            fs::remove_file(&p).map_err(|e| io_err(&p, e))?;
        }
        for entry in fs::read_dir(&self.dir).map_err(|e| io_err(&self.dir, e))? {
            let entry = entry.map_err(|e| io_err(&self.dir, e))?;
            if entry.file_name().to_str().is_some_and(|n| n.ends_with(".tmp")) {
                let p = entry.path();
                fs::remove_file(&p).map_err(|e| io_err(&p, e))?;
            }
        }
        Ok(())
    }
}
