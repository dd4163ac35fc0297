//! The manager's subsystems, one folder each: `orchestrator` (replicated services, restarts, rolling
//! updates, task reaper), `scheduler` (filters, then spread), `dispatcher` (agent sessions, heartbeats,
//! assignments, task status), `logbroker` (log subscriptions between subscribers and agents), `netview` (each
//! node's data-plane view: its networks' peers and service backends), `keymanager` (the network encryption
//! keys), `allocator` (addresses and ports), `resourceapi` (network attachments of a node's own containers). `state`
//! holds what they share; `subsystem` starts and stops the leader-only ones on leadership change.
//!
//! Subsystems never call each other: each reads and watches the store and writes through the proposer.
//! The manager knows nothing of HTTP or the Engine API (that is `shoal-engine-api`).
//!
//! The facade: every module is internal; other crates use what this root re-exports, grouped below by
//! subsystem (the shared state and leader wiring, the dispatcher, the CA, the gRPC services, cluster volumes,
//! the key manager, and the scheduling and orchestration rules the simulator and benchmarks model). The one
//! public module is `controlapi`, itself the facade of the control API (every write the Engine API makes).

// The control API: every write of the Engine API and the SwarmKit control socket; itself a facade
// (its submodules are internal but `network` and `limits`), used throughout shoal-engine-api.
pub mod controlapi;

mod allocator;
mod ca;
mod dispatcher;
mod error;
mod keymanager;
mod leader;
mod limits;
mod logbroker;
mod logrpc;
mod netview;
mod orchestrator;
mod resourceapi;
mod scheduler;
mod state;
mod subsystem;
mod swarmkit_api;
mod tasks;
mod volumes;
#[cfg(test)]
#[allow(unreachable_pub, reason = "testkit's public module, included here by path")]
#[path = "../../testkit/src/wait.rs"]
#[allow(dead_code)] // the unit tests use part of it
mod wait;
mod write;

// Shared state, time and the leader-only subsystems.
pub use leader::{leader_subsystems, LeaderConfig};
pub use state::{ClusterState, ManualTimer, RandomIds, SleepFuture, Timer, TokioTimer, WriteError};
pub use subsystem::{run_while_leader, stopped, Subsystem, SubsystemFuture};

// The dispatcher: agent sessions, assignments and task status.
pub use dispatcher::assignments::{AssignmentSet, Dependency};
pub use dispatcher::registrations::{REGISTRATION_BURST, REGISTRATION_REFILL_MS};
pub use dispatcher::status::{apply_updates, check_update, StatusUpdate};
pub use dispatcher::{Dispatcher, DispatcherConfig, NODE_ID_METADATA_KEY};

// The certificate authority: root CA, node and client certificates, join tokens.
pub use ca::{
    cluster as current_cluster, is_client_cert_revoked, issue_client_cert, new_root_ca, node_cert_expiry,
    revoke_client_cert, root_ca_of, rotate_join_tokens, CaService, ClientCertError, ExternalSigner, PeerIdentity,
    RotateTokens,
};

// The gRPC services a node serves besides the dispatcher's and the CA's.
pub use logrpc::subscribe::LogsService;
pub use resourceapi::ResourceAllocatorService;
pub use swarmkit_api::watch::WatchService;
pub use swarmkit_api::{ControlService, HealthService};

// Cluster volumes: the seam to the node's CSI controller plugins.
pub use volumes::core::capability as volume_capability;
pub use volumes::{ControllerPlugins, PluginError, PluginFuture};

// The key manager: the network encryption keys.
pub use keymanager::{Keyring, ROTATION_INTERVAL_MS as NETWORK_KEY_ROTATION_INTERVAL_MS, SUBSYSTEM_GOSSIP};

// Scheduling and orchestration rules (the simulator's model and the benchmarks use them as the manager does).
pub use orchestrator::dirty::is_task_dirty;
pub use orchestrator::jobs::{current_iteration, in_iteration, is_job};
pub use orchestrator::node_is_down;
pub use scheduler::nodeinfo::is_ready_and_active;
pub use scheduler::{NodeSet, PendingTasks, Scheduler};
pub use tasks::created_ms;
