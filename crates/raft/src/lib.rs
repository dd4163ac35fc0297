//! Consensus for Shoal's managers: a Raft node around raft-rs whose log and hard state live in raft-engine
//! under the state dir (fsync'd before a write is acknowledged), with snapshots of the store and log
//! compaction, and leadership events.
//!
//! This crate knows the store only through `MemoryStore::apply`/`snapshot`/`restore` and the codecs; it
//! knows nothing of services, tasks or the subsystems.

mod proposer;

pub use proposer::{LeaderState, LocalProposer, ProposeError, ProposeFuture, Proposer};
