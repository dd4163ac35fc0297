//! Errors of the raft node boundary: opening, recovering and running the Raft state on disk.
//!
//! Depends only on std and thiserror; callers see these from `RaftNode::start`.

use std::path::PathBuf;

/// Why the Raft node could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum RaftError {
    /// The configuration is not usable.
    #[error("invalid raft configuration: {0}; fix the configuration and start again")]
    InvalidConfig(String),
    /// The state directory (or a file in it) could not be created, written or read.
    #[error(
        "cannot use the raft state at {path}: {source}; check that the directory exists, is writable by this user \
             and the disk is not full"
    )]
    StateDir {
        /// The path that failed.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The raft log (raft-engine) could not be opened, read or written.
    #[error(
        "the raft log at {path} failed: {reason}; if another shoal process uses this state dir stop it, otherwise \
             the log may be corrupted (restore the state dir from a backup)"
    )]
    Log {
        /// The log directory.
        path: PathBuf,
        /// What raft-engine reported.
        reason: String,
    },
    /// The raft state on disk is inconsistent (e.g. the snapshot the log refers to is missing).
    #[error(
        "the raft state at {path} is corrupted: {reason}; restore the state dir from a backup or rejoin this \
             manager to the cluster"
    )]
    Corrupted {
        /// The state directory.
        path: PathBuf,
        /// What is inconsistent.
        reason: String,
    },
    /// Raft state this member acknowledged (or needs to start safely) is damaged or missing. Nothing on
    /// disk was changed: the operator decides.
    #[error(
        "the raft state of this manager is damaged: {what} (at {path}); nothing on disk was changed, and this \
             manager will not start without it, so that no acknowledged write is lost. To recover: move this manager's \
             state dir away and start it with --join-addr (a healthy manager's address) and --join-token (from docker \
             swarm join-token -q manager) to rejoin from the other managers, or, if no healthy manager is left, start \
             a healthy copy of a manager state dir (a backup, or another manager's) with --force-new-cluster"
    )]
    Damaged {
        /// The damaged file or directory.
        path: PathBuf,
        /// What is damaged: which file, which entries, and what was acknowledged.
        what: String,
    },
    /// A snapshot file could not be decoded.
    #[error(
        "cannot decode the raft snapshot {path}: {reason}; the file is damaged, remove it only if an older \
             snapshot and the log cover it, or restore from a backup"
    )]
    SnapshotDecode {
        /// The snapshot file.
        path: PathBuf,
        /// The decoder's message.
        reason: String,
    },
    /// The data encryption key is sealed (autolock) and no key-encryption key was given.
    #[error("the raft data key is sealed (autolock is on): unlock this manager with the swarm's unlock key")]
    Locked,
    /// A record of the log or a snapshot could not be decrypted.
    #[error("cannot decrypt {what} under {path}: {reason}")]
    Decrypt {
        /// The raft state directory.
        path: PathBuf,
        /// Which record.
        what: String,
        /// What failed.
        reason: String,
    },
    /// raft-rs refused an operation.
    #[error("raft refused the operation: {0}")]
    Raft(#[from] raft::Error),
    /// The filesystem holding the Raft state has no space left (or the user's quota is used up). The node
    /// pauses rather than stops: it takes no writes until space returns, then resumes by itself.
    #[error("{}", disk_full_message(path, mount, reason))]
    DiskFull {
        /// The file or directory that could not be written.
        path: PathBuf,
        /// Where the filesystem holding it is mounted.
        mount: PathBuf,
        /// What the OS or raft-engine reported.
        reason: String,
    },
    /// The node has stopped.
    #[error("the raft node is stopped")]
    Stopped,
    /// The incoming-message queue is full; the message was dropped (Raft retries on its own).
    #[error(
        "the raft inbound queue is full ({0} messages); the message was dropped and will be retried by its sender"
    )]
    Busy(usize),
}

/// Most bytes the space probe writes before a paused node resumes (twice what raft-engine allocates ahead in a
/// log file): what "enough space" means to a manager whose disk was full.
pub(crate) const RESUME_FREE_BYTES: u64 = 4 << 20;

/// The message of `RaftError::DiskFull`: which disk, what happened, what to do.
pub(crate) fn disk_full_message(path: &std::path::Path, mount: &std::path::Path, reason: &str) -> String {
    format!(
        "the disk holding this manager's raft state is full: writing {} failed ({reason}; no space left on the \
         filesystem mounted at {}); this manager takes no writes until there is space again: free at least {} MiB \
         on that filesystem and it resumes by itself within seconds, without a restart (nothing acknowledged is lost)",
        path.display(),
        mount.display(),
        RESUME_FREE_BYTES >> 20
    )
}

/// Whether an IO error says the filesystem is full (ENOSPC) or the quota is used up (EDQUOT).
pub(crate) fn is_no_space(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::StorageFull || matches!(e.raw_os_error(), Some(28) | Some(122))
}

/// The mount point of the filesystem holding `path`: the highest ancestor on the same device.
pub(crate) fn mount_point(path: &std::path::Path) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let mut here: PathBuf = path.to_path_buf();
    while std::fs::metadata(&here).is_err() {
        match here.parent() {
            Some(p) => here = p.to_path_buf(),
            None => return path.to_path_buf(),
        }
    }
    let Ok(dev) = std::fs::metadata(&here).map(|m| m.dev()) else { return here };
    while let Some(parent) = here.parent() {
        match std::fs::metadata(parent) {
            Ok(m) if m.dev() == dev => here = parent.to_path_buf(),
            _ => break,
        }
    }
    here
}

impl RaftError {
    /// An IO error on `path`: `DiskFull` when the filesystem is full, `StateDir` otherwise.
    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> RaftError {
        if is_no_space(&source) {
            return RaftError::DiskFull {
                path: path.to_path_buf(),
                mount: mount_point(path),
                reason: source.to_string(),
            };
        }
        RaftError::StateDir { path: path.to_path_buf(), source }
    }

    /// A raft-engine error on the log at `path`: `DiskFull` when it comes from a full filesystem (raft-engine
    /// reports the second failed attempt of an append that ran out of space as `TryAgain`), `Log` otherwise.
    pub(crate) fn engine(path: &std::path::Path, e: raft_engine::Error) -> RaftError {
        let full = match &e {
            raft_engine::Error::Io(io) => is_no_space(io),
            raft_engine::Error::TryAgain(_) => true,
            _ => false,
        };
        if full {
            return RaftError::DiskFull { path: path.to_path_buf(), mount: mount_point(path), reason: e.to_string() };
        }
        RaftError::Log { path: path.to_path_buf(), reason: e.to_string() }
    }

    /// Whether this is `DiskFull`: the node pauses instead of failing.
    pub fn is_disk_full(&self) -> bool {
        matches!(self, RaftError::DiskFull { .. })
    }
}
