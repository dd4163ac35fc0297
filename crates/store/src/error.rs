//! Errors of the store boundary.

use crate::object::ObjectKind;

/// Why a write could not be applied. Every variant leaves the store unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// An object with this ID already exists.
    #[error("{} {id} already exists", kind.name())]
    Exists {
        /// The table.
        kind: ObjectKind,
        /// The ID.
        id: String,
    },
    /// No object with this ID exists.
    #[error("{} {id} not found", kind.name())]
    NotFound {
        /// The table.
        kind: ObjectKind,
        /// The ID.
        id: String,
    },
    /// The name is held by another object.
    #[error("{} name {name:?} is already in use by {owner}", kind.name())]
    NameConflict {
        /// The table.
        kind: ObjectKind,
        /// The name asked for.
        name: String,
        /// The ID of the object that holds it.
        owner: String,
    },
    /// The object changed since the writer read it (compare-and-swap failed).
    #[error("update out of sequence: {} {id} is at version {actual}, the update was based on version {expected}; read \
             it again and retry", kind.name())]
    VersionConflict {
        /// The table.
        kind: ObjectKind,
        /// The ID.
        id: String,
        /// The version the writer read.
        expected: u64,
        /// The version stored now.
        actual: u64,
    },
    /// The write would leave a service referring to a secret or config that does not exist: a service
    /// created or updated with a new reference to a missing one, or one removed while a service refers to it
    /// (checked when the write is applied, so a removal and a service write racing each other cannot both
    /// succeed).
    #[error("{0}")]
    DanglingReference(String),
    /// A network's subnet overlaps another network's (checked when the write is applied, so two networks
    /// created from the same view cannot both get one range).
    #[error("{0}")]
    AddressConflict(String),
    /// The object is malformed (e.g. no ID).
    #[error("invalid object: {0}")]
    InvalidObject(String),
    /// A proposal or snapshot could not be decoded.
    #[error("cannot decode {what}: {reason}")]
    Decode {
        /// What was being decoded.
        what: &'static str,
        /// The decoder's message.
        reason: String,
    },
}
