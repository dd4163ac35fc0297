//! The fuzz targets, one module per kind of input. Every function takes arbitrary bytes and must return
//! without panicking; what it checks beyond that is said on each.

pub mod ca;
pub mod engine;
pub mod gossip;
pub mod grpc;
pub mod raft;
pub mod store;

/// The first byte of `data` (0 when empty) and the rest: targets that cover several decoders use it to
/// choose one.
pub(crate) fn split_selector(data: &[u8]) -> (u8, &[u8]) {
    match data.split_first() {
        Some((s, rest)) => (*s, rest),
        None => (0, data),
    }
}
