//! The manager's subsystems, one folder each: `orchestrator` (replicated services, restarts, rolling
//! updates, task reaper), `scheduler` (filters, then spread), `dispatcher` (agent sessions, heartbeats,
//! assignments, task status), `logbroker` (log subscriptions between subscribers and agents), `netview` (each
//! node's data-plane view: its networks' peers and service backends), `keymanager` (the network encryption
//! keys), `allocator` (addresses and ports), `resourceapi` (network attachments of a node's own containers). `state`
//! holds what they share; `subsystem` starts and stops the leader-only ones on leadership change.
//!
//! Subsystems never call each other: each reads and watches the store and writes through the proposer.
//! The manager knows nothing of HTTP or the Engine API (that is `shoal-engine-api`).

pub mod allocator;
pub mod ca;
pub mod controlapi;
pub mod dispatcher;
pub mod error;
pub mod keymanager;
pub mod leader;
pub mod limits;
pub mod logbroker;
pub mod logrpc;
pub mod netview;
pub mod orchestrator;
pub mod resourceapi;
pub mod scheduler;
pub mod state;
pub mod subsystem;
pub mod swarmkit_api;
pub mod tasks;
pub mod volumes;
#[cfg(test)]
#[allow(unreachable_pub, reason = "testkit's public module, included here by path")]
#[path = "../../testkit/src/wait.rs"]
#[allow(dead_code)] // the unit tests use part of it
mod wait;
pub mod write;

pub use leader::{leader_subsystems, LeaderConfig};
pub use state::{ClusterState, ManualTimer, RandomIds, SleepFuture, Timer, TokioTimer, WriteError};
pub use subsystem::{run_while_leader, stopped, Subsystem, SubsystemFuture};
