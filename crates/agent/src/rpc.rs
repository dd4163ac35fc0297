//! How this node's requests to a manager are made: a request carrying the node's ID in metadata (believed
//! only by the in-process test harness; real managers take the caller's certificate) and a deadline.
//! Shared by the session, the data plane's view and the attacher's calls.
//!
//! Must not depend on any other module of this crate.

use std::time::Duration;

use tonic::Request;

/// gRPC metadata key carrying this node's ID (until mutual TLS provides it).
pub const NODE_ID_METADATA_KEY: &str = "x-shoal-node-id";

/// A request carrying this node's ID (believed only by the in-process test harness; real managers take the
/// caller's certificate) and, when given, a deadline.
pub(crate) fn req<T>(node_id: &str, msg: T, timeout: Option<Duration>) -> Request<T> {
    let mut r = Request::new(msg);
    if let Ok(v) = node_id.parse() {
        r.metadata_mut().insert(NODE_ID_METADATA_KEY, v);
    }
    if let Some(t) = timeout {
        r.set_timeout(t);
    }
    r
}
