//! The seams through which a Raft member talks to its peers. The node hands every outgoing
//! `eraftpb::Message` to a `Transport`; received messages come back in through `RaftNode::step`, and the
//! transport reports undeliverable peers and snapshot outcomes through the `PeerLink` it is attached to.
//! A follower's writes go to the leader through a `Forwarder`.
//!
//! Must not depend on the node's internals: a transport only moves messages (gRPC in `grpc`, in-memory in
//! the tests).

use std::future::Future;
use std::pin::Pin;

use raft::eraftpb::Message;
use tokio::sync::{mpsc, watch};

use crate::{Members, ProposeError};

/// What the driver receives besides proposals: messages from peers and the transport's delivery reports.
#[derive(Debug)]
pub(crate) enum Inbound {
    /// A message from a peer.
    Message(Message),
    /// A message to this peer could not be delivered (raft-rs slows down replication to it).
    Unreachable(u64),
    /// A snapshot sent to this peer was delivered (`true`) or failed (`false`).
    SnapshotStatus(u64, bool),
    /// A probe found nothing listening at this peer's address (`Transport::probe`).
    Gone(u64),
}

/// The node's side of a transport: current members' addresses and delivery reports. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PeerLink {
    pub(crate) inbound: mpsc::Sender<Inbound>,
    pub(crate) members: watch::Receiver<Members>,
}

impl PeerLink {
    /// The current members (addresses by Raft ID).
    pub fn members(&self) -> Members {
        self.members.borrow().clone()
    }

    /// Tells raft-rs that `raft_id` could not be reached (it goes back to probing). Dropped when the node's
    /// inbound queue is full: the next failure reports again.
    pub fn report_unreachable(&self, raft_id: u64) {
        let _ = self.inbound.try_send(Inbound::Unreachable(raft_id));
    }

    /// Tells the node that nothing listens at `raft_id`'s address any more (`Transport::probe`).
    pub fn report_gone(&self, raft_id: u64) {
        let _ = self.inbound.try_send(Inbound::Gone(raft_id));
    }

    /// Tells raft-rs whether a snapshot sent to `raft_id` arrived, so it resumes replication or resends.
    pub fn report_snapshot(&self, raft_id: u64, delivered: bool) {
        let _ = self.inbound.try_send(Inbound::SnapshotStatus(raft_id, delivered));
    }
}

/// Delivers Raft messages to peers. `send` is called from the node's driver thread after the entries and
/// hard state those messages depend on were persisted; it must not block for long (queue and return).
/// Losing messages is allowed: Raft retransmits.
pub trait Transport: Send + Sync + 'static {
    /// Sends messages (each names its destination in `to`).
    fn send(&self, msgs: Vec<Message>);

    /// Checks, without blocking, whether `raft_id`'s process is still there, and reports through
    /// `PeerLink::report_gone` when its address refuses connections (a timeout or any other answer reports
    /// nothing). Asked for a follower's silent leader; by default nothing is checked.
    fn probe(&self, raft_id: u64) {
        let _ = raft_id;
    }

    /// Called once when the node starts, before any `send`: where to find addresses and report failures.
    fn attach(&self, link: PeerLink) {
        let _ = link;
    }
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

/// The future a forwarded proposal returns: `Ok(index)` once the leader appended it.
pub type ForwardFuture = Pin<Box<dyn Future<Output = Result<u64, ProposeError>> + Send + 'static>>;

/// Sends a follower's proposal (an encoded `InternalRaftRequest`) to the leader at `leader_addr`, which
/// appends it to the log. Must resolve within a bounded time (a failure is `NotLeader`/`Unknown`).
pub trait Forwarder: Send + Sync + 'static {
    /// Forwards `request` to the leader.
    fn forward(&self, leader_addr: &str, request: Vec<u8>) -> ForwardFuture;
}
