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
    #[error("cannot use the raft state at {path}: {source}; check that the directory exists, is writable by this user and the disk is not full")]
    StateDir {
        /// The path that failed.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The raft log (raft-engine) could not be opened, read or written.
    #[error("the raft log at {path} failed: {reason}; if another shoal process uses this state dir stop it, otherwise the log may be corrupted (restore the state dir from a backup)")]
    Log {
        /// The log directory.
        path: PathBuf,
        /// What raft-engine reported.
        reason: String,
    },
    /// The raft state on disk is inconsistent (e.g. the snapshot the log refers to is missing).
    #[error("the raft state at {path} is corrupted: {reason}; restore the state dir from a backup or rejoin this manager to the cluster")]
    Corrupted {
        /// The state directory.
        path: PathBuf,
        /// What is inconsistent.
        reason: String,
    },
    /// Raft state this member acknowledged (or needs to start safely) is damaged or missing. Nothing on
    /// disk was changed: the operator decides.
    #[error("the raft state of this manager is damaged: {what} (at {path}); nothing on disk was changed, and this manager will not start without it, so that no acknowledged write is lost. To recover: move this manager's state dir away and start it with --join-addr (a healthy manager's address) and --join-token (from docker swarm join-token -q manager) to rejoin from the other managers, or, if no healthy manager is left, start a healthy copy of a manager state dir (a backup, or another manager's) with --force-new-cluster")]
    Damaged {
        /// The damaged file or directory.
        path: PathBuf,
        /// What is damaged: which file, which entries, and what was acknowledged.
        what: String,
    },
    /// A snapshot file could not be decoded.
    #[error("cannot decode the raft snapshot {path}: {reason}; the file is damaged, remove it only if an older snapshot and the log cover it, or restore from a backup")]
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
    /// The node has stopped.
    #[error("the raft node is stopped")]
    Stopped,
    /// The incoming-message queue is full; the message was dropped (Raft retries on its own).
    #[error(
        "the raft inbound queue is full ({0} messages); the message was dropped and will be retried by its sender"
    )]
    Busy(usize),
}
