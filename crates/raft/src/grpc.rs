//! Raft between managers over gRPC: the `GrpcTransport` (one bounded queue and sender task per peer), the
//! server side (`Raft`, `RaftMembership` and Shoal's `RaftProposals` services, as values the node adds to its
//! one tonic server), the `GrpcForwarder` of follower writes, and `join_cluster`.
//!
//! Every client channel comes from an injected `ChannelFactory` (plain HTTP/2 by default, `PlainHttp`), so
//! TLS and authorization are added by the node without touching this file. Bounds:
//! - `PEER_QUEUE` messages queued per peer; when full the message is dropped and the peer reported
//!   unreachable to raft-rs, which retries. At most `PEER_IN_FLIGHT` sends per peer wait for their answer.
//! - `MAX_RAFT_MESSAGE_BYTES` per Raft message (a snapshot included), in both directions. Messages larger
//!   than `STREAM_CHUNK_BYTES` go over `StreamRaftMessage` in chunks of that size, so no single gRPC
//!   message exceeds tonic's 4 MiB default.
//! - A send times out after `RPC_TIMEOUT` plus one second per MiB (a large snapshot is not cut short).
//!
//! Must not know the store's contents or the manager's subsystems.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;
use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};
use shoal_api::raft_client::RaftClient;
use shoal_api::raft_membership_client::RaftMembershipClient;
use shoal_api::raft_membership_server::{RaftMembership, RaftMembershipServer};
use shoal_api::raft_proposals_client::RaftProposalsClient;
use shoal_api::raft_proposals_server::{RaftProposals, RaftProposalsServer};
use shoal_api::raft_server::{Raft, RaftServer};
use shoal_api::{
    ForwardProposalRequest, ForwardProposalResponse, JoinRequest, JoinResponse, LeaveRequest, LeaveResponse,
    ProcessRaftMessageRequest, ProcessRaftMessageResponse, ResolveAddressRequest, ResolveAddressResponse,
    StreamRaftMessageRequest, StreamRaftMessageResponse,
};
use shoal_store::MemoryStore;
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

use crate::transport::{ForwardFuture, Forwarder, PeerLink, Transport};
use crate::{Members, MembershipError, ProposeError, RaftConfig, RaftError, RaftNode, StartMode};

/// Largest Raft message (e.g. a snapshot) sent or accepted, in bytes: 512 MiB.
pub const MAX_RAFT_MESSAGE_BYTES: usize = 512 << 20;
/// Messages larger than this are streamed in chunks of this size: 1 MiB.
pub const STREAM_CHUNK_BYTES: usize = 1 << 20;
/// Messages queued for one peer before new ones are dropped.
pub const PEER_QUEUE: usize = 1024;
/// Sends to one peer waiting for their answer at once.
pub const PEER_IN_FLIGHT: usize = 64;
/// Base timeout of one send to a peer (plus one second per MiB of message).
pub const RPC_TIMEOUT: Duration = Duration::from_secs(5);
/// Timeout of connecting to a manager (the `PlainHttp` endpoints).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest a probe of a silent leader waits for its connection (`Transport::probe`).
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// Timeout of forwarding a write to the leader.
pub const FORWARD_RPC_TIMEOUT: Duration = Duration::from_secs(5);
/// Timeout of one `RaftMembership.Join` call.
pub const JOIN_TIMEOUT: Duration = Duration::from_secs(20);
/// Pause between Join attempts while the asked manager knows no leader.
pub const JOIN_RETRY_INTERVAL: Duration = Duration::from_millis(200);
/// Redirects to the leader a joining manager follows (a Join sent to a follower names the leader).
pub const JOIN_REDIRECTS: usize = 3;
/// gRPC metadata key in which a follower's refusal names the leader's address.
pub const LEADER_ADDR_METADATA: &str = "x-shoal-leader-addr";
/// gRPC metadata key a joining manager may put its node ID in (until certificates carry it).
pub const NODE_ID_METADATA: &str = "x-shoal-node-id";

/// gRPC metadata key of `RaftMembership.Join` by which a member restarted with a new address names its Raft
/// ID (hex): the leader then changes that member's address instead of adding a member.
pub const RAFT_ID_METADATA: &str = "x-shoal-raft-id";

/// How long a restarted member keeps asking for its new address to be recorded.
pub const ADDRESS_UPDATE_TIMEOUT: Duration = Duration::from_secs(120);

/// Asks the leader (through any other member, following the leader's address when one answers it is not
/// the leader) to record `cfg.addr` as member `cfg.raft_id`'s address; retries every `JOIN_RETRY_INTERVAL`
/// for up to `ADDRESS_UPDATE_TIMEOUT`. Until it succeeds the other members cannot reach this one.
pub async fn update_own_address(
    cfg: &RaftConfig,
    members: &Members,
    factory: Arc<dyn ChannelFactory>,
) -> Result<(), JoinError> {
    let deadline = tokio::time::Instant::now() + ADDRESS_UPDATE_TIMEOUT;
    let others: Vec<String> = members
        .members
        .values()
        .filter(|m| m.raft_id != cfg.raft_id && !m.addr.is_empty())
        .map(|m| m.addr.clone())
        .collect();
    let mut last = String::from("no other member has an address");
    loop {
        let mut queue: std::collections::VecDeque<String> = others.iter().cloned().collect();
        let mut hops = 0;
        while let Some(addr) = queue.pop_front() {
            let Ok(endpoint) = factory.endpoint(&addr) else { continue };
            let call = async {
                let channel = endpoint.connect().await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
                let mut request = Request::new(JoinRequest { addr: cfg.addr.clone() });
                if let Ok(v) = cfg.node_id.parse() {
                    request.metadata_mut().insert(NODE_ID_METADATA, v);
                }
                if let Ok(v) = format!("{:x}", cfg.raft_id).parse() {
                    request.metadata_mut().insert(RAFT_ID_METADATA, v);
                }
                RaftMembershipClient::new(channel).join(request).await
            };
            match tokio::time::timeout(JOIN_RETRY_INTERVAL * 10, call).await {
                Ok(Ok(_)) => {
                    tracing::info!(addr = %cfg.addr, via = %addr, "this member's new address is recorded in the raft \
                                                                   membership");
                    return Ok(());
                }
                Ok(Err(status)) => {
                    let leader =
                        status.metadata().get(LEADER_ADDR_METADATA).and_then(|v| v.to_str().ok()).map(str::to_string);
                    if status.code() != tonic::Code::Unavailable {
                        return Err(JoinError::Refused { addr, reason: status.message().to_string() });
                    }
                    if let Some(leader) = leader.filter(|l| *l != addr && hops < JOIN_REDIRECTS) {
                        hops += 1;
                        queue.push_front(leader);
                    }
                    last = format!("{addr}: {}", status.message());
                }
                Err(_) => last = format!("{addr}: no answer"),
            }
        }
        if tokio::time::Instant::now() + JOIN_RETRY_INTERVAL >= deadline {
            return Err(JoinError::Unreachable { addr: others.join(","), reason: last });
        }
        tokio::time::sleep(JOIN_RETRY_INTERVAL).await;
    }
}

/// Why no client endpoint could be made for an address.
#[derive(Debug, thiserror::Error)]
#[error("cannot make a gRPC endpoint for {addr}: {reason}; check the address (host:port)")]
pub struct ChannelError {
    /// The address asked for.
    pub addr: String,
    /// What was wrong.
    pub reason: String,
}

/// Makes the client endpoint for a manager's address (`host:port`). The node injects one that adds TLS;
/// `PlainHttp` is the plain HTTP/2 default.
pub trait ChannelFactory: Send + Sync + 'static {
    /// The endpoint to connect to `addr`.
    fn endpoint(&self, addr: &str) -> Result<Endpoint, ChannelError>;
}

/// Plain HTTP/2 endpoints (no TLS), with `CONNECT_TIMEOUT` and TCP_NODELAY.
#[derive(Debug, Default, Clone, Copy)]
pub struct PlainHttp;

impl ChannelFactory for PlainHttp {
    fn endpoint(&self, addr: &str) -> Result<Endpoint, ChannelError> {
        let ep = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| ChannelError { addr: addr.to_string(), reason: e.to_string() })?;
        Ok(ep.connect_timeout(CONNECT_TIMEOUT).tcp_nodelay(true))
    }
}

fn raft_client(channel: Channel) -> RaftClient<Channel> {
    RaftClient::new(channel)
        .max_encoding_message_size(MAX_RAFT_MESSAGE_BYTES)
        .max_decoding_message_size(MAX_RAFT_MESSAGE_BYTES)
}

/// Sends Raft messages to peers over gRPC, one task and bounded queue per peer.
pub struct GrpcTransport {
    factory: Arc<dyn ChannelFactory>,
    runtime: tokio::runtime::Handle,
    link: OnceLock<PeerLink>,
    peers: Mutex<HashMap<u64, Peer>>,
    /// A probe is under way (`Transport::probe`: one at a time).
    probing: Arc<AtomicBool>,
}

struct Peer {
    addr: String,
    queue: mpsc::Sender<Message>,
}

impl GrpcTransport {
    /// A transport whose sender tasks run on the current tokio runtime.
    pub fn new(factory: Arc<dyn ChannelFactory>) -> Arc<GrpcTransport> {
        Arc::new(GrpcTransport {
            factory,
            runtime: tokio::runtime::Handle::current(),
            link: OnceLock::new(),
            peers: Mutex::new(HashMap::new()),
            probing: Arc::new(AtomicBool::new(false)),
        })
    }

    fn queue_for(&self, link: &PeerLink, to: u64, addr: &str) -> mpsc::Sender<Message> {
        let mut peers = self.peers.lock();
        if let Some(p) = peers.get(&to) {
            if p.addr == addr && !p.queue.is_closed() {
                return p.queue.clone();
            }
        }
        let (tx, rx) = mpsc::channel(PEER_QUEUE);
        self.runtime.spawn(run_peer(to, addr.to_string(), self.factory.clone(), link.clone(), rx));
        peers.insert(to, Peer { addr: addr.to_string(), queue: tx.clone() });
        tx
    }
}

impl Transport for GrpcTransport {
    fn attach(&self, link: PeerLink) {
        let _ = self.link.set(link);
    }

    /// A TCP connection to the peer's address, closed at once: refused means the host answered and nothing
    /// listens there (the process is gone); a timeout (`PROBE_TIMEOUT`: a partition, a host down) or a
    /// connection says nothing.
    fn probe(&self, raft_id: u64) {
        let Some(link) = self.link.get() else { return };
        let Some(addr) = link.members().addr(raft_id).map(str::to_string) else { return };
        if self.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        let (link, probing) = (link.clone(), self.probing.clone());
        self.runtime.spawn(async move {
            let connect = tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(&addr)).await;
            probing.store(false, Ordering::Release);
            if let Ok(Err(e)) = connect {
                if e.kind() == std::io::ErrorKind::ConnectionRefused {
                    tracing::debug!(raft_id, addr, "raft peer's address refuses connections");
                    link.report_gone(raft_id);
                }
            }
        });
    }

    fn send(&self, msgs: Vec<Message>) {
        let Some(link) = self.link.get() else { return };
        let members = link.members();
        // Sender tasks of peers that left end when their queue is dropped.
        self.peers.lock().retain(|id, _| members.members.contains_key(id));
        for m in msgs {
            let to = m.to;
            let is_snapshot = m.get_msg_type() == MessageType::MsgSnapshot;
            let Some(addr) = members.addr(to) else {
                tracing::debug!(to, "raft message to a member without a known address dropped");
                link.report_unreachable(to);
                continue;
            };
            if self.queue_for(link, to, addr).try_send(m).is_err() {
                tracing::debug!(to, "raft peer queue full; message dropped");
                link.report_unreachable(to);
                if is_snapshot {
                    link.report_snapshot(to, false);
                }
            }
        }
    }
}

/// Sends one peer's messages in order, up to `PEER_IN_FLIGHT` at once on the peer's HTTP/2 connection (one at
/// a time, a peer with a long round trip would get a few messages per second, fall behind and see its queue
/// overflow). A failed send reports the peer unreachable (and a failed snapshot as failed) and drops what is
/// queued behind it: raft-rs resends from its own state.
async fn run_peer(
    to: u64,
    addr: String,
    factory: Arc<dyn ChannelFactory>,
    link: PeerLink,
    mut rx: mpsc::Receiver<Message>,
) {
    use futures::StreamExt as _;
    let mut client: Option<RaftClient<Channel>> = None;
    let mut failing = false;
    let mut in_flight = futures::stream::FuturesOrdered::new();
    let mut open = true;
    while open || !in_flight.is_empty() {
        tokio::select! {
            m = rx.recv(), if open && in_flight.len() < PEER_IN_FLIGHT => {
                let Some(m) = m else {
                    open = false;
                    continue;
                };
                if client.is_none() {
                    match factory.endpoint(&addr) {
                        Ok(ep) => client = Some(raft_client(ep.connect_lazy())),
                        Err(e) => {
                            tracing::warn!(to, error = %e, "cannot reach raft peer");
                            link.report_unreachable(to);
                            continue;
                        }
                    }
                }
                let Some(mut c) = client.clone() else { continue };
                let is_snapshot = m.get_msg_type() == MessageType::MsgSnapshot;
                in_flight.push_back(async move { (send_message(&mut c, &m).await, is_snapshot) });
            }
            Some((result, is_snapshot)) = in_flight.next(), if !in_flight.is_empty() => match result {
                Ok(()) => {
                    if failing {
                        tracing::info!(to, addr, "raft peer reachable again");
                        failing = false;
                    }
                    if is_snapshot {
                        link.report_snapshot(to, true);
                    }
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(to, addr, error = %e, "raft peer unreachable");
                        failing = true;
                    }
                    link.report_unreachable(to);
                    if is_snapshot {
                        link.report_snapshot(to, false);
                    }
                    while rx.try_recv().is_ok() {}
                }
            },
        }
    }
}

async fn send_message(client: &mut RaftClient<Channel>, m: &Message) -> Result<(), String> {
    let bytes = m.write_to_bytes().map_err(|e| format!("cannot encode the raft message: {e}"))?;
    if bytes.len() > MAX_RAFT_MESSAGE_BYTES {
        return Err(format!("the raft message is {} bytes, over the {MAX_RAFT_MESSAGE_BYTES} byte limit", bytes.len()));
    }
    let timeout = RPC_TIMEOUT + Duration::from_secs((bytes.len() / (1 << 20)) as u64);
    let call = async {
        if bytes.len() <= STREAM_CHUNK_BYTES {
            client.process_raft_message(ProcessRaftMessageRequest { message: bytes }).await.map(|_| ())
        } else {
            let chunks: Vec<StreamRaftMessageRequest> =
                bytes.chunks(STREAM_CHUNK_BYTES).map(|c| StreamRaftMessageRequest { message: c.to_vec() }).collect();
            client.stream_raft_message(futures::stream::iter(chunks)).await.map(|_| ())
        }
    };
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(status)) => Err(status.to_string()),
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}

/// The Raft gRPC services of one node, ready to be added to the node's tonic server (the node may wrap
/// them, e.g. with an authorization layer).
pub struct RaftServices {
    /// `Raft`: message delivery between members and address resolution.
    pub raft: RaftServer<RaftService>,
    /// `RaftMembership`: Join and Leave (served by the leader).
    pub membership: RaftMembershipServer<MembershipService>,
    /// `RaftProposals`: writes forwarded by followers (served by the leader).
    pub proposals: RaftProposalsServer<ProposalsService>,
}

/// The services of `node`, with message limits raised to `MAX_RAFT_MESSAGE_BYTES` where messages may be
/// large.
pub fn services(node: &RaftNode) -> RaftServices {
    RaftServices {
        raft: RaftServer::new(RaftService { node: node.clone() })
            .max_decoding_message_size(STREAM_CHUNK_BYTES + 1024)
            .max_encoding_message_size(STREAM_CHUNK_BYTES),
        membership: RaftMembershipServer::new(MembershipService { node: node.clone() }),
        proposals: RaftProposalsServer::new(ProposalsService { node: node.clone() })
            .max_decoding_message_size(node.max_proposal_bytes() + 1024),
    }
}

/// Server side of `Raft`.
pub struct RaftService {
    node: RaftNode,
}

impl RaftService {
    fn step(&self, bytes: &[u8]) -> Result<(), Status> {
        let m = Message::parse_from_bytes(bytes)
            .map_err(|e| Status::invalid_argument(format!("not a raft message: {e}")))?;
        self.node.step(m).map_err(|e| match e {
            RaftError::Busy(_) => Status::resource_exhausted(e.to_string()),
            e => Status::unavailable(e.to_string()),
        })
    }
}

#[tonic::async_trait]
impl Raft for RaftService {
    async fn process_raft_message(
        &self,
        request: Request<ProcessRaftMessageRequest>,
    ) -> Result<Response<ProcessRaftMessageResponse>, Status> {
        self.step(&request.into_inner().message)?;
        Ok(Response::new(ProcessRaftMessageResponse {}))
    }

    async fn stream_raft_message(
        &self,
        request: Request<tonic::Streaming<StreamRaftMessageRequest>>,
    ) -> Result<Response<StreamRaftMessageResponse>, Status> {
        let mut stream = request.into_inner();
        let mut buf = Vec::new();
        while let Some(chunk) = stream.message().await? {
            if buf.len() + chunk.message.len() > MAX_RAFT_MESSAGE_BYTES {
                return Err(Status::resource_exhausted(format!(
                    "the streamed raft message exceeds {MAX_RAFT_MESSAGE_BYTES} bytes"
                )));
            }
            buf.extend_from_slice(&chunk.message);
        }
        self.step(&buf)?;
        Ok(Response::new(StreamRaftMessageResponse {}))
    }

    async fn resolve_address(
        &self,
        request: Request<ResolveAddressRequest>,
    ) -> Result<Response<ResolveAddressResponse>, Status> {
        let id = request.into_inner().raft_id;
        match self.node.members().addr(id) {
            Some(addr) => Ok(Response::new(ResolveAddressResponse { addr: addr.to_string() })),
            None => Err(Status::not_found(format!("raft id {id:x} is not a member with a known address"))),
        }
    }
}

/// A refusal from a non-leader (with `code`), naming the leader's address in `LEADER_ADDR_METADATA` when
/// known.
fn not_leader_status(code: tonic::Code, message: String, leader_addr: Option<String>) -> Status {
    let mut status = Status::new(code, message);
    if let Some(addr) = leader_addr.and_then(|a| a.parse().ok()) {
        status.metadata_mut().insert(LEADER_ADDR_METADATA, addr);
    }
    status
}

fn membership_status(node: &RaftNode, e: MembershipError) -> Status {
    match e {
        // Unavailable: try the leader named in the metadata, or again once one is elected.
        MembershipError::NotLeader { .. } => {
            not_leader_status(tonic::Code::Unavailable, e.to_string(), node.leader_addr())
        }
        MembershipError::Refused(_) => Status::failed_precondition(e.to_string()),
        MembershipError::Failed(_) => Status::aborted(e.to_string()),
    }
}

/// Server side of `RaftMembership`.
pub struct MembershipService {
    node: RaftNode,
}

#[tonic::async_trait]
impl RaftMembership for MembershipService {
    async fn join(&self, request: Request<JoinRequest>) -> Result<Response<JoinResponse>, Status> {
        let node_id =
            request.metadata().get(NODE_ID_METADATA).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        let claimed_raft_id = request
            .metadata()
            .get(RAFT_ID_METADATA)
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                u64::from_str_radix(v, 16)
                    .map_err(|_| Status::invalid_argument(format!("bad {RAFT_ID_METADATA}: {v:?}")))
            })
            .transpose()?;
        let addr = request.into_inner().addr;
        if let Some(raft_id) = claimed_raft_id {
            // A member restarted with a new address: only the node the member was added for may move it.
            let owner = self.node.members().members.get(&raft_id).map(|m| m.node_id.clone());
            if node_id.is_empty() || owner.as_deref() != Some(node_id.as_str()) {
                return Err(Status::permission_denied(format!(
                    "raft id {raft_id:x} is not a member added for node {node_id:?}: it cannot change that member's \
                     address"
                )));
            }
            let members =
                self.node.update_member_addr(raft_id, &addr).await.map_err(|e| membership_status(&self.node, e))?;
            let wire = members.to_wire();
            return Ok(Response::new(JoinResponse { raft_id, members: wire.members, removed_members: wire.removed }));
        }
        let (raft_id, members) =
            self.node.add_member(&addr, &node_id).await.map_err(|e| membership_status(&self.node, e))?;
        let wire = members.to_wire();
        Ok(Response::new(JoinResponse { raft_id, members: wire.members, removed_members: wire.removed }))
    }

    async fn leave(&self, request: Request<LeaveRequest>) -> Result<Response<LeaveResponse>, Status> {
        let Some(member) = request.into_inner().node else {
            return Err(Status::invalid_argument("LeaveRequest.node is missing; name the member to remove"));
        };
        self.node.remove_member(member.raft_id).await.map_err(|e| membership_status(&self.node, e))?;
        Ok(Response::new(LeaveResponse {}))
    }
}

/// Server side of `RaftProposals`.
pub struct ProposalsService {
    node: RaftNode,
}

#[tonic::async_trait]
impl RaftProposals for ProposalsService {
    async fn forward_proposal(
        &self,
        request: Request<ForwardProposalRequest>,
    ) -> Result<Response<ForwardProposalResponse>, Status> {
        match self.node.propose_forwarded(request.into_inner().request).await {
            Ok(index) => Ok(Response::new(ForwardProposalResponse { index })),
            Err(e @ (ProposeError::NotLeader { .. } | ProposeError::NoLeader(_))) => {
                Err(not_leader_status(tonic::Code::FailedPrecondition, e.to_string(), self.node.leader_addr()))
            }
            Err(e @ (ProposeError::TooLarge { .. } | ProposeError::Store(_))) => {
                Err(Status::invalid_argument(e.to_string()))
            }
            Err(e @ (ProposeError::Unknown(_) | ProposeError::Stopped | ProposeError::DiskFull(_))) => {
                Err(Status::unavailable(e.to_string()))
            }
        }
    }
}

/// Forwards follower writes to the leader over `RaftProposals.ForwardProposal`.
pub struct GrpcForwarder {
    factory: Arc<dyn ChannelFactory>,
}

impl GrpcForwarder {
    /// A forwarder whose channels come from `factory`.
    pub fn new(factory: Arc<dyn ChannelFactory>) -> Arc<GrpcForwarder> {
        Arc::new(GrpcForwarder { factory })
    }
}

impl Forwarder for GrpcForwarder {
    fn forward(&self, leader_addr: &str, request: Vec<u8>) -> ForwardFuture {
        let endpoint = self.factory.endpoint(leader_addr);
        let addr = leader_addr.to_string();
        Box::pin(async move {
            let endpoint = endpoint.map_err(|e| ProposeError::NoLeader(e.to_string()))?;
            let call = async {
                let channel = endpoint
                    .connect()
                    .await
                    .map_err(|e| ProposeError::NoLeader(format!("cannot reach the leader at {addr}: {e}")))?;
                let mut client = RaftProposalsClient::new(channel).max_encoding_message_size(request.len() + 1024);
                // The server answers FailedPrecondition only when it is not (or no longer) the leader: nothing
                // was appended. Anything else after the request left may or may not have been appended.
                client.forward_proposal(ForwardProposalRequest { request }).await.map_err(|s| match s.code() {
                    tonic::Code::FailedPrecondition => {
                        ProposeError::NoLeader(format!("the manager at {addr} cannot take the write: {}", s.message()))
                    }
                    _ => ProposeError::Unknown(format!(
                        "forwarding the write to the leader at {addr} failed: {}",
                        s.message()
                    )),
                })
            };
            match tokio::time::timeout(FORWARD_RPC_TIMEOUT, call).await {
                Ok(Ok(resp)) => Ok(resp.into_inner().index),
                Ok(Err(e)) => Err(e),
                Err(_) => Err(ProposeError::Unknown(format!(
                    "the leader at {addr} did not answer within {FORWARD_RPC_TIMEOUT:?}; the write may or may not be \
                     applied"
                ))),
            }
        })
    }
}

/// Why joining a cluster failed.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// No endpoint could be made for the address.
    #[error(transparent)]
    Channel(#[from] ChannelError),
    /// The manager could not be reached or did not answer.
    #[error("cannot reach the manager at {addr} to join: {reason}; check --join-addr and that the manager is running")]
    Unreachable {
        /// The address tried.
        addr: String,
        /// What happened.
        reason: String,
    },
    /// The manager refused.
    #[error("the manager at {addr} refused the join: {reason}")]
    Refused {
        /// The address tried.
        addr: String,
        /// Its answer.
        reason: String,
    },
    /// The local Raft node could not start.
    #[error(transparent)]
    Raft(#[from] RaftError),
}

/// Starts a member with the gRPC transport and forwarder: `mode` says whether it bootstraps a new cluster
/// (if it has no state) or only recovers (a member that joined before).
pub async fn start_member(
    cfg: RaftConfig,
    store: Arc<MemoryStore>,
    factory: Arc<dyn ChannelFactory>,
    mode: StartMode,
) -> Result<RaftNode, RaftError> {
    let transport = GrpcTransport::new(factory.clone());
    RaftNode::start_with(cfg, store, transport, Some(GrpcForwarder::new(factory)), mode).await
}

/// Why the manager on `channel` is not one this manager can join Raft through, when its health server says
/// it is a Docker Engine's SwarmKit: it answers NOT_FOUND for `SHOAL_MANAGER_HEALTH`. Any other answer (a
/// Shoal manager's SERVING, or no Health service at all, as on Shoal managers before it was served there)
/// lets the join go on.
async fn not_a_shoal_manager(channel: Channel) -> Option<String> {
    let request = shoal_api::HealthCheckRequest { service: shoal_api::SHOAL_MANAGER_HEALTH.to_string() };
    match shoal_api::health_client::HealthClient::new(channel).check(request).await {
        Err(status) if status.code() == tonic::Code::NotFound => Some(
            "it is a Docker Engine's swarm manager, and a Shoal manager cannot be a member of a Docker swarm's Raft \
             group yet (it would take the swarm's quorum with it): join this node with the swarm's worker token \
             instead, and remove the node entry this attempt left with `docker node rm <node ID>` on a Docker manager"
                .to_string(),
        ),
        _ => None,
    }
}

/// Joins the cluster a manager at `manager_addr` belongs to: asks `RaftMembership.Join` (following up to
/// `JOIN_REDIRECTS` redirects to the leader, and retrying every `JOIN_RETRY_INTERVAL` while the manager
/// knows no leader, for at most `JOIN_TIMEOUT` in all) to add `cfg.addr` as a voter, then starts this member with the
/// Raft ID it was given (`cfg.raft_id` is replaced) and waits for the leader's snapshot. The node must
/// serve `services(&node)` at `cfg.addr` promptly: until it answers, the cluster counts it as down. A
/// Docker swarm's manager is refused before anything is asked of it (`not_a_shoal_manager`).
pub async fn join_cluster(
    mut cfg: RaftConfig,
    store: Arc<MemoryStore>,
    factory: Arc<dyn ChannelFactory>,
    manager_addr: &str,
) -> Result<RaftNode, JoinError> {
    let mut addr = manager_addr.to_string();
    let mut redirects = 0;
    let deadline = tokio::time::Instant::now() + JOIN_TIMEOUT;
    let resp = loop {
        let endpoint = factory.endpoint(&addr)?;
        let unreachable = |reason: String| JoinError::Unreachable { addr: addr.clone(), reason };
        let call = async {
            let channel = endpoint.connect().await.map_err(|e| Err(unreachable(e.to_string())))?;
            if let Some(refusal) = not_a_shoal_manager(channel.clone()).await {
                return Err(Err(JoinError::Refused { addr: addr.clone(), reason: refusal }));
            }
            let mut request = Request::new(JoinRequest { addr: cfg.addr.clone() });
            if let Ok(v) = cfg.node_id.parse() {
                request.metadata_mut().insert(NODE_ID_METADATA, v);
            }
            RaftMembershipClient::new(channel).join(request).await.map_err(Ok)
        };
        let status = match tokio::time::timeout_at(deadline, call).await {
            Err(_) => return Err(unreachable(format!("no answer within {JOIN_TIMEOUT:?}"))),
            Ok(Ok(resp)) => break resp.into_inner(),
            Ok(Err(Err(e))) => return Err(e),
            Ok(Err(Ok(status))) => status,
        };
        let leader = status.metadata().get(LEADER_ADDR_METADATA).and_then(|v| v.to_str().ok()).map(str::to_string);
        match leader {
            _ if status.code() != tonic::Code::Unavailable => {
                return Err(JoinError::Refused { addr: addr.clone(), reason: status.message().to_string() })
            }
            Some(leader) if redirects < JOIN_REDIRECTS && leader != addr => {
                tracing::info!(from = %addr, to = %leader, "join redirected to the raft leader");
                addr = leader;
                redirects += 1;
            }
            _ if tokio::time::Instant::now() + JOIN_RETRY_INTERVAL < deadline => {
                tracing::debug!(manager = %addr, reason = status.message(), "no leader to join yet; retrying");
                tokio::time::sleep(JOIN_RETRY_INTERVAL).await;
            }
            _ => return Err(JoinError::Refused { addr: addr.clone(), reason: status.message().to_string() }),
        }
    };
    cfg.raft_id = resp.raft_id;
    let members =
        Members::from_wire(&shoal_api::ClusterSnapshot { members: resp.members, removed: resp.removed_members });
    tracing::info!(raft_id = format_args!("{:x}", resp.raft_id), leader = %addr, "joined the raft cluster");
    Ok(start_member(cfg, store, factory, StartMode::Join { members }).await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::membership::Member;
    use crate::transport::Inbound;
    use tokio::sync::watch;

    fn members(addrs: &[(u64, String)]) -> Members {
        let mut m = Members::default();
        for (id, addr) in addrs {
            m.members.insert(*id, Member { raft_id: *id, node_id: String::new(), addr: addr.clone() });
        }
        m
    }

    /// A probe reports a peer gone only when its address refuses the connection: a listening port says nothing.
    #[tokio::test]
    async fn a_probe_reports_a_peer_gone_only_when_its_port_refuses_connections() {
        let listening = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let closed_addr = closed.local_addr().unwrap().to_string();
        drop(closed);
        let all = members(&[(2, listening.local_addr().unwrap().to_string()), (3, closed_addr)]);
        let (in_tx, mut in_rx) = mpsc::channel(8);
        let (_members_tx, members_rx) = watch::channel(all);
        let transport = GrpcTransport::new(Arc::new(PlainHttp));
        transport.attach(PeerLink { inbound: in_tx, members: members_rx });

        let finished = |t: &GrpcTransport| !t.probing.load(Ordering::Acquire);
        transport.probe(2);
        let (accepted, _) = listening.accept().await.expect("the probe connects");
        drop(accepted);
        while !finished(&transport) {
            tokio::task::yield_now().await;
        }
        assert!(in_rx.try_recv().is_err(), "a listening peer was reported");
        transport.probe(3);
        match tokio::time::timeout(Duration::from_secs(10), in_rx.recv()).await {
            Ok(Some(Inbound::Gone(3))) => {}
            other => panic!("expected peer 3 gone, got {other:?}"),
        }
        // Unknown members are not probed.
        transport.probe(9);
        assert!(finished(&transport));
    }
}
