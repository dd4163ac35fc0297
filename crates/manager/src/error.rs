//! `ControlError`: why a control API call (or a subsystem acting for one, such as the CA's certificate
//! requests) failed, with a message that says what was wrong and what to do; and its mapping from the
//! store's and Raft's errors. Shared by the control API, the CA and the bounds in `limits`.
//!
//! Must not depend on any subsystem: only on the store, Raft's errors and `ClusterState`'s `WriteError`.

use shoal_raft::ProposeError;
use shoal_store::StoreError;

use crate::state::WriteError;

/// Why a control API call failed. Each message says what was wrong and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    /// No object matches the reference.
    #[error("{kind} {reference} not found: check the ID or name (the `ls` command lists them)")]
    NotFound {
        /// "service", "task" or "node".
        kind: &'static str,
        /// What the caller asked for.
        reference: String,
    },
    /// The request is malformed or violates a rule; the message names the field.
    #[error("{0}")]
    InvalidArgument(String),
    /// The object changed since the caller read it, or the write conflicts with the current state.
    #[error("{0}")]
    Conflict(String),
    /// The name is taken by another object.
    #[error("{0}")]
    AlreadyExists(String),
    /// The object is not in a state that allows the operation (a manager or a ready node removed, the last
    /// manager demoted); the message says what to do first.
    #[error("{0}")]
    FailedPrecondition(String),
    /// This manager cannot accept writes.
    #[error("this manager is not the leader; send the request to the leader")]
    NotLeader,
    /// The write's fate is unknown or the node is stopping; read again, then retry.
    #[error("{0}")]
    Unavailable(String),
    /// A bug: a write that validation should have rejected was refused by the store.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ControlError {
    pub(crate) fn not_found(kind: &'static str, reference: &str) -> ControlError {
        ControlError::NotFound { kind, reference: reference.to_string() }
    }

    /// A write based on a stale version: `what` ("service <id>", "the swarm") is at version `have`, the
    /// `operation` ("update", "rollback") was based on `sent`. The message ends with Docker's own words,
    /// `update out of sequence`, which clients' retry helpers match as a suffix.
    pub(crate) fn out_of_sequence(what: &str, operation: &str, have: u64, sent: u64) -> ControlError {
        ControlError::Conflict(format!(
            "{what} is at version {have}, the {operation} was based on version {sent}; inspect it again and retry: \
             update out of sequence"
        ))
    }
}

impl From<ProposeError> for ControlError {
    fn from(e: ProposeError) -> ControlError {
        match e {
            ProposeError::NotLeader { .. } => ControlError::NotLeader,
            ProposeError::Store(s) => s.into(),
            ProposeError::Unknown(_)
            | ProposeError::Stopped
            | ProposeError::NoLeader(_)
            | ProposeError::DiskFull(_) => ControlError::Unavailable(e.to_string()),
            ProposeError::TooLarge { .. } => ControlError::InvalidArgument(e.to_string()),
        }
    }
}

impl From<StoreError> for ControlError {
    fn from(e: StoreError) -> ControlError {
        match e {
            StoreError::NameConflict { kind, name, owner } => ControlError::AlreadyExists(format!(
                "{0} name {name} is already in use by {0} {owner}; choose another name or remove that {0}",
                kind.name()
            )),
            StoreError::VersionConflict { .. } => ControlError::Conflict(e.to_string()),
            StoreError::NotFound { kind, id } => ControlError::not_found(kind.name(), &id),
            StoreError::DanglingReference(m) => ControlError::InvalidArgument(m),
            StoreError::AddressConflict(m) => ControlError::Conflict(m),
            StoreError::Exists { .. } | StoreError::InvalidObject(_) | StoreError::Decode { .. } => {
                ControlError::Internal(e.to_string())
            }
        }
    }
}

impl From<WriteError<ControlError>> for ControlError {
    fn from(e: WriteError<ControlError>) -> ControlError {
        match e {
            WriteError::Rejected(e) => e,
            WriteError::Propose(p) => p.into(),
        }
    }
}
