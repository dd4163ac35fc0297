//! SwarmKit's own gRPC API for `swarmctl` and SwarmKit tooling: the `Control` service (`control.rs`, a thin
//! adapter over `controlapi`, which holds every rule: there is no second copy of validation here), the
//! `Watch` service (`watch.rs`: store changes per kind and action with SwarmKit's selectors, resumable from a
//! version through the Raft log) and `Health` (`health.rs`). The node serves them on a local socket of their
//! own (`--listen-swarmkit-api`).
//!
//! Reads pass the Raft read barrier first, as the Engine API's do, so any manager answers linearizably;
//! writes go through `controlapi`, which a follower forwards to the leader. `ControlError`s become
//! SwarmKit's gRPC codes (`status_of`).
//!
//! Must not depend on HTTP/JSON, sockets or TLS: the node wires the transport.

mod control;
mod health;
pub(crate) mod watch;

pub use control::ControlService;
pub use health::HealthService;
#[cfg(test)]
pub(crate) use watch::{WatchService, MAX_WATCH_ENTRIES, SUBSCRIBER_QUEUE_MESSAGES};

use tonic::Status;

use crate::controlapi::ControlError;
use crate::state::ClusterState;

/// The gRPC status SwarmKit's controlapi answers for `e`.
pub(crate) fn status_of(e: ControlError) -> Status {
    let msg = e.to_string();
    match e {
        ControlError::NotFound { .. } => Status::not_found(msg),
        ControlError::InvalidArgument(_) => Status::invalid_argument(msg),
        ControlError::AlreadyExists(_) => Status::already_exists(msg),
        ControlError::Conflict(_) | ControlError::FailedPrecondition(_) => Status::failed_precondition(msg),
        ControlError::NotLeader | ControlError::Unavailable(_) => Status::unavailable(msg),
        ControlError::Internal(_) => Status::internal(msg),
    }
}

/// Waits until this manager's store holds every write acknowledged before the call (Raft ReadIndex).
pub(crate) async fn read_barrier(state: &ClusterState) -> Result<(), Status> {
    state.read_barrier().await.map_err(|e| status_of(ControlError::from(e)))
}

#[cfg(test)]
mod tests;
