//! Seeing a Shoal node from outside: Prometheus metrics (`metrics.rs`, `process.rs`; write latency from
//! `proposer.rs`) and a live page of the cluster (`live.rs` feeds it from the store's watch queue, `http.rs`
//! serves it with the page in `page/`), both on the node's `--listen-metrics` address.
//!
//! Read-only: nothing here writes to the store or calls a subsystem; the node hands it what it may read
//! (`metrics::Sources`). Must not know Raft beyond the `Proposer` seam, nor the executors or the Engine API.

pub mod http;
pub mod live;
pub mod metrics;
pub mod process;
pub mod proposer;

pub use http::{router, Observed};
pub use live::LiveHub;
pub use metrics::{Metrics, RaftFigures, Recorders, Sources};
pub use proposer::TimedProposer;
