//! The seam through which a Raft member sends messages to its peers. The node hands every outgoing
//! `eraftpb::Message` to a `Transport`; received messages come back in through `RaftNode::step`.
//!
//! Must not depend on the node's internals: a transport only moves messages (gRPC later, in-memory in tests).

use raft::eraftpb::Message;

/// Delivers Raft messages to peers. `send` is called from the node's driver thread after the entries and
/// hard state those messages depend on were persisted; it must not block for long (queue and return).
/// Losing messages is allowed: Raft retransmits.
pub trait Transport: Send + Sync + 'static {
    /// Sends messages (each names its destination in `to`).
    fn send(&self, msgs: Vec<Message>);
}

/// The transport of a single-member cluster: there is nobody to send to. Logs and drops anything it gets
/// (which would mean the configuration has peers this node cannot reach).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoPeers;

impl Transport for NoPeers {
    fn send(&self, msgs: Vec<Message>) {
        if let Some(m) = msgs.first() {
            tracing::warn!(count = msgs.len(), to = m.to, "raft message to a peer dropped: no transport configured");
        }
    }
}
