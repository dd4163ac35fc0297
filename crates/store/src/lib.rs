//! The cluster state: typed tables (nodes, services, tasks, clusters, secrets, configs, networks, cluster
//! volumes) with indexes, consistent read views, all-or-nothing application of committed writes with
//! compare-and-swap on `meta.version`, a bounded watch queue, and the codecs for Raft proposals and snapshots.
//!
//! No IO, no async runtime, no clock reads: time and randomness come in through `Clock` and `IdSource`.
//! The store does not know about Raft; the raft crate calls `apply` with each committed entry.

mod changes;
pub mod cidr;
pub mod clock;
mod codec;
mod error;
pub mod ids;
mod memory;
mod object;
mod table;

pub use changes::Changes;
pub use clock::{Clock, ManualClock, SystemClock};
pub use codec::{decode_request, decode_snapshot, encode_request, encode_snapshot};
pub use error::StoreError;
pub use ids::IdSource;
pub use memory::{
    mounts_volume, parse_vxlan_ids, spec_networks, Change, Commit, MemoryStore, ServiceTotals, Tables, Watch,
    DEFAULT_WATCH_QUEUE_COMMITS, MAX_FAILED_APPLIES_KEPT, VXLAN_ID_OPTION,
};
pub use object::{Action, ActionKind, Object, ObjectKind, StoreObject, ACTION_OVERHEAD_BYTES};
pub use table::{Table, TaskTable};

pub use tokio::sync::broadcast::error::RecvError as WatchError;

#[cfg(test)]
mod tests;
