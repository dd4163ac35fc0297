//! The sans-IO gossip member: the table of members it knows, what it answers to a packet (probes, and the
//! membership news it takes in: alive, suspect, dead) and to a stream (a push-pull state exchange, which is
//! how a Docker Engine joins, and a probe over TCP). It is the seed the engines join through: it tells each
//! joiner of the members that joined before, so engines find each other and gossip among themselves. It
//! does not probe anyone itself.
//!
//! It passes news on, as every member of a gossip must: an engine broadcasts each piece of news to a few
//! random members only (memberlist: 4 sends for a cluster under 10), so a member that swallows what it
//! hears keeps it from the engines it was meant for. News of a member that is new or back, and the network
//! database's network joins and leaves (`NetworkEvent`), go on from here to every other live member
//! (`take_relays`), once each. The network memberships it heard of also go into its push-pull, so an
//! engine that missed one learns it at its next push-pull with any manager.
//!
//! It also publishes entries of its own (`publish`: the peer records of tasks on Shoal agents, which the
//! node computes from the store): it joins their networks, sends each change as a table event to every live
//! member, and sends an engine that joins one of those networks its entries there directly (it answers no
//! bulk sync). The tables' entries of others it ignores.
//!
//! Must not depend on IO or clocks: time (`now_ms`) and nonces come in.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use prost::Message;
use rmpv::Value;

use crate::wire::{self, kind, Writer, NONCE_BYTES};
use crate::GossipError;

/// Most members the table holds (libnetwork's own clusters are far smaller; past this, news of new members
/// is dropped and logged).
pub const MAX_MEMBERS: usize = 1024;
/// How long a member reported dead or gone stays in the table (and in push-pulls, so the news spreads).
pub const DEAD_KEPT_MS: u64 = 60_000;
/// Most (node, network) memberships remembered (a node's entries go with the node).
pub const MAX_NETWORK_ENTRIES: usize = 16_384;
/// Most packets waiting to be relayed between two `take_relays` (past this, news is not passed on).
pub const MAX_RELAYS: usize = 4_096;
/// How far another member's Lamport time may move this member's clock at once: a key holder cannot push
/// it to the end of its range (where nothing this member says would be newer).
pub const MAX_CLOCK_JUMP: u64 = 1 << 32;
/// Most answers to bulk syncs waiting for their connection (an engine asks every 30 s per network).
pub const MAX_STREAMS_OUT: usize = 64;
/// The protocol versions this member speaks (memberlist's `Vsn`: protocol min, max, current; delegate min,
/// max, current), as libnetwork's memberlist announces them.
pub const VERSIONS: [u8; 6] = [1, 5, 2, 0, 0, 0];

/// A member's state as memberlist numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Answers probes.
    Alive = 0,
    /// Suspected by some member to have failed.
    Suspect = 1,
    /// Confirmed failed.
    Dead = 2,
    /// Left on its own.
    Left = 3,
}

impl State {
    fn from_u64(v: u64) -> State {
        match v {
            0 => State::Alive,
            1 => State::Suspect,
            2 => State::Dead,
            _ => State::Left,
        }
    }
}

/// Another member, as last heard of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Its address and gossip port.
    pub addr: SocketAddr,
    /// Its application metadata (libnetwork sends none).
    pub meta: Vec<u8>,
    /// Its incarnation (only the member itself raises it).
    pub incarnation: u32,
    /// What it is known as.
    pub state: State,
    /// Its protocol versions.
    pub versions: Vec<u8>,
    /// When the state last changed (ms on the caller's clock).
    pub since_ms: u64,
}

/// One member's description, as alive messages and push-pulls carry it.
#[derive(Clone, Debug)]
struct Described {
    name: String,
    addr: Option<SocketAddr>,
    meta: Vec<u8>,
    incarnation: u32,
    state: State,
    versions: Vec<u8>,
}

fn socket_of(addr: &[u8], port: u64) -> Option<SocketAddr> {
    let ip: IpAddr = match addr.len() {
        4 => <[u8; 4]>::try_from(addr).ok()?.into(),
        16 => <[u8; 16]>::try_from(addr).ok()?.into(),
        _ => return None,
    };
    Some(SocketAddr::new(ip, u16::try_from(port).ok()?))
}

fn addr_bytes(a: &SocketAddr) -> Vec<u8> {
    match a.ip() {
        IpAddr::V4(v) => v.octets().to_vec(),
        IpAddr::V6(v) => v.octets().to_vec(),
    }
}

fn described(v: &Value, state_field: bool) -> Described {
    Described {
        name: wire::field_str(v, if state_field { "Name" } else { "Node" }),
        addr: socket_of(&wire::field_bytes(v, "Addr"), wire::field_u64(v, "Port")),
        meta: wire::field_bytes(v, "Meta"),
        incarnation: u32::try_from(wire::field_u64(v, "Incarnation")).unwrap_or(u32::MAX),
        state: if state_field { State::from_u64(wire::field_u64(v, "State")) } else { State::Alive },
        versions: wire::field_bytes(v, "Vsn"),
    }
}

/// libnetwork's network database envelope (`GossipMessage`), for the push-pull's application state.
#[derive(Clone, PartialEq, Message)]
struct GossipMessage {
    #[prost(int32, tag = "1")]
    kind: i32,
    #[prost(bytes = "vec", tag = "2")]
    data: Vec<u8>,
}

/// libnetwork's `NetworkPushPull`: the network memberships of every node the sender knows.
#[derive(Clone, PartialEq, Message)]
struct NetworkPushPull {
    #[prost(uint64, tag = "1")]
    l_time: u64,
    #[prost(message, repeated, tag = "2")]
    networks: Vec<NetworkEntry>,
    #[prost(string, tag = "3")]
    node_name: String,
}

/// libnetwork's `NetworkEntry`: node `node_name` is in network `network_id` (or leaving it) as of `l_time`.
#[derive(Clone, PartialEq, Message)]
struct NetworkEntry {
    #[prost(string, tag = "1")]
    network_id: String,
    #[prost(uint64, tag = "2")]
    l_time: u64,
    #[prost(string, tag = "3")]
    node_name: String,
    #[prost(bool, tag = "4")]
    leaving: bool,
}

/// libnetwork's `NetworkEvent`: node `node_name` joined (1) or left (2) network `network_id` at `l_time`.
#[derive(Clone, PartialEq, Message)]
struct NetworkEvent {
    #[prost(int32, tag = "1")]
    kind: i32,
    #[prost(uint64, tag = "2")]
    l_time: u64,
    #[prost(string, tag = "3")]
    node_name: String,
    #[prost(string, tag = "4")]
    network_id: String,
}

/// libnetwork's `TableEvent`: an entry of table `table_name` in network `network_id`, owned by `node_name`.
#[derive(Clone, PartialEq, Message)]
struct TableEvent {
    #[prost(int32, tag = "1")]
    kind: i32,
    #[prost(uint64, tag = "2")]
    l_time: u64,
    #[prost(string, tag = "3")]
    node_name: String,
    #[prost(string, tag = "4")]
    network_id: String,
    #[prost(string, tag = "5")]
    table_name: String,
    #[prost(string, tag = "6")]
    key: String,
    #[prost(bytes = "vec", tag = "7")]
    value: Vec<u8>,
    #[prost(int32, tag = "8")]
    residual_reap_time: i32,
}

/// libnetwork's `BulkSyncMessage`: every entry its sender holds in `networks` (`payload`, a compound of
/// table events); `unsolicited` when it asks for the receiver's in return.
#[derive(Clone, PartialEq, Message)]
struct BulkSyncMessage {
    #[prost(uint64, tag = "1")]
    l_time: u64,
    #[prost(bool, tag = "2")]
    unsolicited: bool,
    #[prost(string, tag = "3")]
    node_name: String,
    #[prost(string, repeated, tag = "4")]
    networks: Vec<String>,
    #[prost(bytes = "vec", tag = "5")]
    payload: Vec<u8>,
}

/// libnetwork's `CompoundMessage`: several of its messages in one.
#[derive(Clone, PartialEq, Message)]
struct CompoundMessage {
    #[prost(message, repeated, tag = "1")]
    messages: Vec<SimpleMessage>,
}

/// One message of a `CompoundMessage`.
#[derive(Clone, PartialEq, Message)]
struct SimpleMessage {
    #[prost(bytes = "vec", tag = "1")]
    payload: Vec<u8>,
}

/// A `TableEvent`'s kinds.
const TABLE_CREATE: i32 = 1;
const TABLE_UPDATE: i32 = 2;
const TABLE_DELETE: i32 = 3;
/// How long engines keep a deleted entry (libnetwork's `reapEntryInterval`, in seconds).
const REAP_SECONDS: i32 = 30 * 60;

/// What this member publishes in the network database: (network ID, table, key) -> value.
pub type Entries = BTreeMap<(String, String, String), Vec<u8>>;

/// The overlay driver's table of endpoints: where each lives (`peer_record`).
pub const PEER_TABLE: &str = "overlay_peer_table";

/// libnetwork's overlay `PeerRecord`.
#[derive(Clone, PartialEq, Message)]
struct PeerRecord {
    #[prost(string, tag = "1")]
    endpoint_ip: String,
    #[prost(string, tag = "2")]
    endpoint_mac: String,
    #[prost(string, tag = "3")]
    tunnel_endpoint_ip: String,
}

/// A `PEER_TABLE` value: the endpoint at `endpoint_ip` (with its prefix length, `10.0.1.6/24`) has MAC
/// `endpoint_mac` and lives behind VXLAN endpoint `tunnel_endpoint_ip` (its node's underlay address).
pub fn peer_record(endpoint_ip: &str, endpoint_mac: &str, tunnel_endpoint_ip: &str) -> Vec<u8> {
    PeerRecord {
        endpoint_ip: endpoint_ip.into(),
        endpoint_mac: endpoint_mac.into(),
        tunnel_endpoint_ip: tunnel_endpoint_ip.into(),
    }
    .encode_to_vec()
}

/// libnetwork's table of service endpoints, which an engine's embedded DNS (`<service>`,
/// `tasks.<service>`, the task's name) and its load balancer answer from (`endpoint_record`).
pub const ENDPOINT_TABLE: &str = "endpoint_table";

/// libnetwork's `EndpointRecord` (agent.proto).
#[derive(Clone, PartialEq, Message)]
struct EndpointRecord {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    service_name: String,
    #[prost(string, tag = "3")]
    service_id: String,
    #[prost(string, tag = "4")]
    virtual_ip: String,
    #[prost(string, tag = "5")]
    endpoint_ip: String,
    #[prost(message, repeated, tag = "6")]
    ingress_ports: Vec<IngressPort>,
    #[prost(string, repeated, tag = "7")]
    aliases: Vec<String>,
    #[prost(string, repeated, tag = "8")]
    task_aliases: Vec<String>,
    #[prost(bool, tag = "9")]
    service_disabled: bool,
}

/// libnetwork's `PortConfig` (agent.proto): a port the routing mesh publishes.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct IngressPort {
    /// The port's name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// TCP 0, UDP 1, SCTP 2.
    #[prost(int32, tag = "2")]
    pub protocol: i32,
    /// The task's port.
    #[prost(uint32, tag = "3")]
    pub target_port: u32,
    /// The port on every node.
    #[prost(uint32, tag = "4")]
    pub published_port: u32,
}

/// A service task's endpoint on a network, as an `ENDPOINT_TABLE` value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Endpoint {
    /// The task's (container's) name, `<service>.<slot>.<task id>`.
    pub name: String,
    /// Its service's name and ID.
    pub service_name: String,
    /// See `service_name`.
    pub service_id: String,
    /// The service's virtual IP on the network, without prefix (empty in DNS round-robin mode).
    pub virtual_ip: String,
    /// The task's address on the network, without prefix.
    pub endpoint_ip: String,
    /// The service's routing-mesh ports (on the ingress network only).
    pub ingress_ports: Vec<IngressPort>,
    /// The service's aliases on the network.
    pub aliases: Vec<String>,
    /// The task's own aliases on the network.
    pub task_aliases: Vec<String>,
}

/// An `ENDPOINT_TABLE` value for `e`.
pub fn endpoint_record(e: &Endpoint) -> Vec<u8> {
    EndpointRecord {
        name: e.name.clone(),
        service_name: e.service_name.clone(),
        service_id: e.service_id.clone(),
        virtual_ip: e.virtual_ip.clone(),
        endpoint_ip: e.endpoint_ip.clone(),
        ingress_ports: e.ingress_ports.clone(),
        aliases: e.aliases.clone(),
        task_aliases: e.task_aliases.clone(),
        service_disabled: false,
    }
    .encode_to_vec()
}

/// The network database's message types this member reads.
const NETWORKDB_NETWORK_EVENT: i32 = 1;
const NETWORKDB_TABLE_EVENT: i32 = 2;
const NETWORKDB_PUSH_PULL: i32 = 3;
const NETWORKDB_BULK_SYNC: i32 = 4;
const NETWORKDB_COMPOUND: i32 = 5;
/// A `NetworkEvent`'s kinds.
const NETWORK_JOIN: i32 = 1;
const NETWORK_LEAVE: i32 = 2;

/// What happened to the table, for the shell to log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A member joined, or came back.
    Joined(String, SocketAddr),
    /// A member was reported dead or left.
    Gone(String),
}

/// The gossip member. See the module doc.
#[derive(Debug)]
pub struct Member {
    name: String,
    addr: SocketAddr,
    incarnation: u32,
    keys: Vec<Vec<u8>>,
    peers: BTreeMap<String, Peer>,
    events: Vec<Event>,
    /// (node, network) -> (Lamport time, leaving), as last heard.
    networks: BTreeMap<(String, String), (u64, bool)>,
    /// Plain messages to pass on: (destination, message).
    relays: Vec<(SocketAddr, Vec<u8>)>,
    /// The entries this member publishes, with the Lamport time of their last change.
    published: BTreeMap<(String, String, String), (u64, Vec<u8>)>,
    /// The networks this member joined (for its entries), with the Lamport time of the join.
    joined: BTreeMap<String, u64>,
    /// This member's Lamport clock for what it publishes.
    clock: u64,
    /// Plain stream messages to send on a connection of their own: (destination, message). Answers to
    /// bulk syncs, at most `MAX_STREAMS_OUT`.
    streams: Vec<(SocketAddr, Vec<u8>)>,
}

/// Packets to send: (destination, bytes).
pub type Outgoing = Vec<(SocketAddr, Vec<u8>)>;

impl Member {
    /// A member named `name` reachable at `addr`, with no keys yet (it answers nothing until it has them).
    pub fn new(name: String, addr: SocketAddr) -> Member {
        Member {
            name,
            addr,
            incarnation: 1,
            keys: Vec::new(),
            peers: BTreeMap::new(),
            events: Vec::new(),
            networks: BTreeMap::new(),
            relays: Vec::new(),
            published: BTreeMap::new(),
            joined: BTreeMap::new(),
            clock: 0,
            streams: Vec::new(),
        }
    }

    /// This member's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The keys to open messages with; the first seals what this member sends.
    pub fn set_keys(&mut self, keys: Vec<Vec<u8>>) {
        self.keys = keys;
    }

    /// The members known, by name.
    pub fn peers(&self) -> &BTreeMap<String, Peer> {
        &self.peers
    }

    /// What happened since the last call.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    /// The news to pass on since the last call, sealed: send each packet to its destination over UDP.
    pub fn take_relays(&mut self, nonce: &mut dyn FnMut() -> [u8; NONCE_BYTES]) -> Result<Outgoing, GossipError> {
        let relays = std::mem::take(&mut self.relays);
        let key = self.primary_key()?.to_vec();
        relays.into_iter().map(|(to, msg)| Ok((to, wire::seal(&key, nonce(), b"", &msg)?))).collect()
    }

    /// Takes the stream messages to send, each on a connection of its own, sealed with the primary key.
    pub fn take_streams(&mut self, nonce: &mut dyn FnMut() -> [u8; NONCE_BYTES]) -> Result<Outgoing, GossipError> {
        let streams = std::mem::take(&mut self.streams);
        let key = self.primary_key()?.to_vec();
        streams.into_iter().map(|(to, msg)| Ok((to, wire::seal_stream(&key, nonce(), &msg)?))).collect()
    }

    /// A user message that came on a stream: the network database's bulk sync. An unsolicited one (an
    /// engine's periodic or joining sync with this member) is answered as libnetwork answers it, with this
    /// member's entries in the networks it names, on a new stream to its sender; the engine waits 30 s
    /// for that answer, and logs the sync as timed out without it. The entries it sends are not kept: this
    /// member keeps no tables but its own.
    fn stream_user_message(&mut self, user: &[u8]) {
        let Ok(g) = GossipMessage::decode(user) else { return };
        if g.kind != NETWORKDB_BULK_SYNC {
            return;
        }
        let Ok(asked) = BulkSyncMessage::decode(g.data.as_slice()) else { return };
        if !asked.unsolicited || self.streams.len() >= MAX_STREAMS_OUT {
            return;
        }
        let Some(to) = self.peers.get(&asked.node_name).filter(|p| p.state == State::Alive).map(|p| p.addr) else {
            return;
        };
        // Its table clock is witnessed, so what this member publishes next is newer than what it has seen.
        self.witness(asked.l_time);
        let mut messages = Vec::new();
        for network in &asked.networks {
            let from = (network.clone(), String::new(), String::new());
            for (k, (t, v)) in self.published.range(from..).take_while(|(k, _)| &k.0 == network) {
                messages.push(SimpleMessage { payload: self.table_gossip(k, TABLE_CREATE, *t, v) });
            }
        }
        let payload = GossipMessage { kind: NETWORKDB_COMPOUND, data: CompoundMessage { messages }.encode_to_vec() }
            .encode_to_vec();
        let answer = BulkSyncMessage {
            l_time: self.clock,
            unsolicited: false,
            node_name: self.name.clone(),
            networks: asked.networks,
            payload,
        };
        let body = GossipMessage { kind: NETWORKDB_BULK_SYNC, data: answer.encode_to_vec() }.encode_to_vec();
        let mut w = Writer::with_type(kind::USER);
        w.map(1).key("UserMsgLen").uint(body.len() as u64);
        let mut msg = w.out;
        msg.extend_from_slice(&body);
        self.streams.push((to, msg));
    }

    /// Queues `msg` for every live member but `about` (the news's subject) and `from` (who told it).
    fn relay(&mut self, msg: &[u8], about: &str, from: Option<SocketAddr>) {
        for (name, p) in &self.peers {
            if p.state != State::Alive || name == about || Some(p.addr) == from {
                continue;
            }
            if self.relays.len() >= MAX_RELAYS {
                tracing::warn!("gossip: {MAX_RELAYS} relays waiting already; news is not passed on");
                return;
            }
            self.relays.push((p.addr, msg.to_vec()));
        }
    }

    /// News that `node` joined (or left) `network` at `l_time`; true when it is news (newer than what this
    /// member knew, about a member it knows), as libnetwork's `handleNetworkEvent` decides.
    fn network_news(&mut self, node: &str, network: &str, l_time: u64, leaving: bool) -> bool {
        if node == self.name || !self.peers.contains_key(node) {
            return false;
        }
        let key = (node.to_string(), network.to_string());
        match self.networks.get(&key) {
            Some(&(t, _)) if t >= l_time => return false,
            None if leaving => return false,
            None if self.networks.len() >= MAX_NETWORK_ENTRIES => {
                tracing::warn!(%node, %network, "gossip: {MAX_NETWORK_ENTRIES} network memberships known already");
                return false;
            }
            _ => {}
        }
        self.networks.insert(key, (l_time, leaving));
        true
    }

    /// A user message (the network database's): a network join or leave is remembered and passed on.
    fn user_message(&mut self, body: &[u8], from: SocketAddr) {
        let Ok(g) = GossipMessage::decode(body) else { return };
        if g.kind == NETWORKDB_TABLE_EVENT {
            // Another member's entry (another manager's member publishes the same keys): its time is
            // witnessed, so this member's next word on a key is newer than any it heard (`republish`).
            if let Ok(e) = TableEvent::decode(g.data.as_slice()) {
                self.witness(e.l_time);
            }
            return;
        }
        if g.kind != NETWORKDB_NETWORK_EVENT {
            return;
        }
        let Ok(e) = NetworkEvent::decode(g.data.as_slice()) else { return };
        if self.network_news(&e.node_name, &e.network_id, e.l_time, e.kind == NETWORK_LEAVE) {
            let mut msg = vec![kind::USER];
            msg.extend_from_slice(body);
            self.relay(&msg, &e.node_name, Some(from));
            if e.kind == NETWORK_JOIN {
                self.greet(&e.node_name, &e.network_id);
            }
        }
    }

    /// A push-pull's application state: the sender's network memberships; what is news is passed on.
    fn merge_networks(&mut self, state: &[u8]) {
        let Ok(g) = GossipMessage::decode(state) else { return };
        if g.kind != NETWORKDB_PUSH_PULL {
            return;
        }
        let Ok(pp) = NetworkPushPull::decode(g.data.as_slice()) else { return };
        for n in pp.networks {
            if self.network_news(&n.node_name, &n.network_id, n.l_time, n.leaving) {
                let event = NetworkEvent {
                    kind: if n.leaving { NETWORK_LEAVE } else { NETWORK_JOIN },
                    l_time: n.l_time,
                    node_name: n.node_name.clone(),
                    network_id: n.network_id,
                };
                let msg = user(NETWORKDB_NETWORK_EVENT, event.encode_to_vec());
                self.relay(&msg, &n.node_name, None);
                if !n.leaving {
                    self.greet(&n.node_name, &event.network_id);
                }
            }
        }
    }

    /// Publishes `entries` from now on (the store's view of Shoal agents' endpoints): joins the networks
    /// they are in and leaves those they no longer are, and tells every live member of each entry that
    /// changed. `epoch` seeds the Lamport clock (a restarted member's times must be newer than its last
    /// run's: pass the wall clock in seconds).
    pub fn publish(&mut self, entries: Entries, epoch: u64) {
        self.clock = self.clock.max(epoch);
        let nets: BTreeSet<String> = entries.keys().map(|k| k.0.clone()).collect();
        for n in &nets {
            if !self.joined.contains_key(n) {
                self.clock = self.clock.saturating_add(1);
                self.joined.insert(n.clone(), self.clock);
                let msg = self.network_event(n, NETWORK_JOIN, self.clock);
                self.relay(&msg, "", None);
            }
        }
        let gone: Vec<_> = self.published.keys().filter(|k| !entries.contains_key(*k)).cloned().collect();
        for k in gone {
            self.clock = self.clock.saturating_add(1);
            let msg = self.table_event(&k, TABLE_DELETE, self.clock, &[]);
            self.relay(&msg, "", None);
            self.published.remove(&k);
        }
        for (k, v) in entries {
            let kind_ = match self.published.get(&k) {
                Some((_, old)) if *old == v => continue,
                Some(_) => TABLE_UPDATE,
                None => TABLE_CREATE,
            };
            self.clock = self.clock.saturating_add(1);
            let msg = self.table_event(&k, kind_, self.clock, &v);
            self.relay(&msg, "", None);
            self.published.insert(k, (self.clock, v));
        }
        let left: Vec<String> = self.joined.keys().filter(|n| !nets.contains(*n)).cloned().collect();
        for n in left {
            self.clock = self.clock.saturating_add(1);
            let msg = self.network_event(&n, NETWORK_LEAVE, self.clock);
            self.relay(&msg, "", None);
            self.joined.remove(&n);
        }
    }

    /// A user message: this member's `NetworkEvent` of `kind_` for `network` at `l_time`.
    fn network_event(&self, network: &str, kind_: i32, l_time: u64) -> Vec<u8> {
        let e = NetworkEvent { kind: kind_, l_time, node_name: self.name.clone(), network_id: network.into() };
        user(NETWORKDB_NETWORK_EVENT, e.encode_to_vec())
    }

    /// A user message: this member's `TableEvent` of `kind_` for entry `k`.
    fn table_event(&self, k: &(String, String, String), kind_: i32, l_time: u64, value: &[u8]) -> Vec<u8> {
        let mut msg = vec![kind::USER];
        msg.extend_from_slice(&self.table_gossip(k, kind_, l_time, value));
        msg
    }

    /// The network database's message (`GossipMessage`) of this member's `TableEvent` for entry `k`.
    fn table_gossip(&self, k: &(String, String, String), kind_: i32, l_time: u64, value: &[u8]) -> Vec<u8> {
        let e = TableEvent {
            kind: kind_,
            l_time,
            node_name: self.name.clone(),
            network_id: k.0.clone(),
            table_name: k.1.clone(),
            key: k.2.clone(),
            value: value.to_vec(),
            residual_reap_time: if kind_ == TABLE_DELETE { REAP_SECONDS } else { 0 },
        };
        GossipMessage { kind: NETWORKDB_TABLE_EVENT, data: e.encode_to_vec() }.encode_to_vec()
    }

    /// An engine (`node`, at `to`) joined `network`: it hears this member's join and entries there at once
    /// (its own join's bulk sync goes to two random nodes of the network, perhaps not this member).
    fn greet(&mut self, node: &str, network: &str) {
        let Some(&joined) = self.joined.get(network) else { return };
        let Some(to) = self.peers.get(node).map(|p| p.addr) else { return };
        let mut msgs = vec![self.network_event(network, NETWORK_JOIN, joined)];
        for (k, (t, v)) in self.published.range((network.to_string(), String::new(), String::new())..) {
            if k.0 != network {
                break;
            }
            msgs.push(self.table_event(k, TABLE_CREATE, *t, v));
        }
        for m in msgs {
            if self.relays.len() < MAX_RELAYS {
                self.relays.push((to, m));
            }
        }
    }

    fn primary_key(&self) -> Result<&[u8], GossipError> {
        self.keys.first().map(Vec::as_slice).ok_or(GossipError::NoKey)
    }

    /// Takes in a packet from `from`; returns the packets to send back.
    pub fn on_packet(
        &mut self,
        packet: &[u8],
        from: SocketAddr,
        now_ms: u64,
        nonce: &mut dyn FnMut() -> [u8; NONCE_BYTES],
    ) -> Result<Outgoing, GossipError> {
        let plain = wire::open(&self.keys, packet, b"")?;
        let mut out = Vec::new();
        self.message(&plain, from, now_ms, 0, &mut out)?;
        let key = self.primary_key()?.to_vec();
        out.into_iter().map(|(to, msg)| Ok((to, wire::seal(&key, nonce(), b"", &msg)?))).collect()
    }

    fn message(
        &mut self,
        msg: &[u8],
        from: SocketAddr,
        now_ms: u64,
        depth: u8,
        out: &mut Vec<(SocketAddr, Vec<u8>)>,
    ) -> Result<(), GossipError> {
        if depth > 4 {
            return Err(GossipError::Malformed("messages nested too deep".into()));
        }
        let Some((&t, mut body)) = msg.split_first() else { return Ok(()) };
        match t {
            // The CRC guards against corruption; the AES-GCM tag already did.
            kind::HAS_CRC if body.len() >= 4 => self.message(&body[4..], from, now_ms, depth + 1, out)?,
            kind::COMPOUND => {
                for part in wire::split_compound(body)? {
                    self.message(part, from, now_ms, depth + 1, out)?;
                }
            }
            kind::COMPRESS => {
                let plain = wire::decompress(&mut body)?;
                self.message(&plain, from, now_ms, depth + 1, out)?;
            }
            kind::PING => {
                let v = wire::read_value(&mut body)?;
                let target = wire::field_str(&v, "Node");
                if !target.is_empty() && target != self.name {
                    return Ok(());
                }
                let to =
                    socket_of(&wire::field_bytes(&v, "SourceAddr"), wire::field_u64(&v, "SourcePort")).unwrap_or(from);
                out.push((to, ack(wire::field_u64(&v, "SeqNo"))));
            }
            kind::ALIVE => {
                let v = wire::read_value(&mut body)?;
                let d = described(&v, false);
                self.alive(d, now_ms, Some(from));
            }
            kind::USER => self.user_message(body, from),
            kind::SUSPECT | kind::DEAD => {
                let v = wire::read_value(&mut body)?;
                let node = wire::field_str(&v, "Node");
                let from_node = wire::field_str(&v, "From");
                let inc = u32::try_from(wire::field_u64(&v, "Incarnation")).unwrap_or(u32::MAX);
                let state = match (t, from_node == node) {
                    (kind::SUSPECT, _) => State::Suspect,
                    (_, true) => State::Left,
                    _ => State::Dead,
                };
                self.failed(&node, inc, state, now_ms, out);
            }
            // Probes on others' behalf, answers to probes this member never sends, and the network
            // database's messages: nothing to do.
            _ => {}
        }
        Ok(())
    }

    /// News that `d` is alive (from `from`, when it came in a packet); news of a member that is new, back or
    /// of a higher incarnation is passed on.
    fn alive(&mut self, d: Described, now_ms: u64, from: Option<SocketAddr>) {
        if d.name == self.name {
            return;
        }
        let Some(addr) = d.addr else { return };
        self.forget_dead(now_ms);
        let full = self.peers.len() >= MAX_MEMBERS;
        match self.peers.get_mut(&d.name) {
            Some(p) if d.incarnation < p.incarnation => {}
            Some(p) if d.incarnation == p.incarnation && p.state == State::Alive => {}
            Some(p) => {
                let back = p.state != State::Alive;
                let msg = alive_message(&d.name, addr, &d.meta, d.incarnation, &d.versions);
                p.addr = addr;
                p.meta = d.meta;
                p.incarnation = d.incarnation;
                p.versions = d.versions;
                if back {
                    p.state = State::Alive;
                    p.since_ms = now_ms;
                    self.events.push(Event::Joined(d.name.clone(), addr));
                }
                self.relay(&msg, &d.name, from);
            }
            None if full => {
                tracing::warn!(member = %d.name, "gossip: {MAX_MEMBERS} members known already; this one is ignored");
            }
            None => {
                self.events.push(Event::Joined(d.name.clone(), addr));
                let msg = alive_message(&d.name, addr, &d.meta, d.incarnation, &d.versions);
                self.relay(&msg, &d.name, from);
                self.peers.insert(
                    d.name,
                    Peer {
                        addr,
                        meta: d.meta,
                        incarnation: d.incarnation,
                        state: State::Alive,
                        versions: d.versions,
                        since_ms: now_ms,
                    },
                );
            }
        }
    }

    /// News that `node` is suspect, dead or gone; about this member, it answers that it is alive.
    fn failed(&mut self, node: &str, inc: u32, state: State, now_ms: u64, out: &mut Vec<(SocketAddr, Vec<u8>)>) {
        if node == self.name {
            if inc >= self.incarnation {
                self.incarnation = inc.saturating_add(1);
                let alive = self.alive_message();
                for p in self.peers.values().filter(|p| p.state == State::Alive) {
                    out.push((p.addr, alive.clone()));
                }
            }
            return;
        }
        let Some(p) = self.peers.get_mut(node) else { return };
        if inc < p.incarnation || p.state == state || (state == State::Suspect && p.state != State::Alive) {
            return;
        }
        p.incarnation = inc;
        p.state = state;
        p.since_ms = now_ms;
        if state != State::Suspect {
            self.events.push(Event::Gone(node.to_string()));
            self.republish();
        }
    }

    /// Takes another member's Lamport time in (within `MAX_CLOCK_JUMP` of this member's).
    fn witness(&mut self, l_time: u64) {
        if l_time <= self.clock.saturating_add(MAX_CLOCK_JUMP) {
            self.clock = self.clock.max(l_time);
        }
    }

    /// Says every entry again, newer than anything heard: an engine deletes the entries of a member that
    /// fails or leaves, and the entry of a key that several managers' members publish belongs to whichever
    /// said it last. So when a member goes, the others' entries replace what went with it.
    fn republish(&mut self) {
        let keys: Vec<_> = self.published.keys().cloned().collect();
        for k in keys {
            self.clock = self.clock.saturating_add(1);
            let Some((t, v)) = self.published.get_mut(&k) else { continue };
            *t = self.clock;
            let v = v.clone();
            let msg = self.table_event(&k, TABLE_CREATE, self.clock, &v);
            self.relay(&msg, "", None);
        }
    }

    fn forget_dead(&mut self, now_ms: u64) {
        self.peers.retain(|_, p| {
            matches!(p.state, State::Alive | State::Suspect) || now_ms.saturating_sub(p.since_ms) < DEAD_KEPT_MS
        });
        let peers = &self.peers;
        self.networks.retain(|(node, _), _| peers.contains_key(node));
    }

    fn alive_message(&self) -> Vec<u8> {
        alive_message(&self.name, self.addr, &[], self.incarnation, &VERSIONS)
    }

    /// Takes in a whole stream frame (`[ENCRYPT][length][payload]`); returns the frame to answer with, if
    /// any (a push-pull answers with this member's state, a probe with an ack).
    pub fn on_stream(
        &mut self,
        frame: &[u8],
        now_ms: u64,
        nonce: [u8; NONCE_BYTES],
    ) -> Result<Option<Vec<u8>>, GossipError> {
        let mut plain = wire::open_stream(&self.keys, frame)?;
        if plain.first() == Some(&kind::COMPRESS) {
            let mut body = &plain[1..];
            plain = wire::decompress(&mut body)?;
        }
        let Some((&t, mut body)) = plain.split_first() else { return Ok(None) };
        let reply = match t {
            kind::PUSH_PULL => {
                let header = wire::read_value(&mut body)?;
                let n = wire::field_u64(&header, "Nodes");
                if n > MAX_MEMBERS as u64 * 4 {
                    return Err(GossipError::Malformed(format!("a push-pull of {n} members")));
                }
                let join = wire::field_bool(&header, "Join");
                let mut states = Vec::new();
                for _ in 0..n {
                    states.push(described(&wire::read_value(&mut body)?, true));
                }
                let reply = self.local_state(join);
                let mut ignored = Vec::new();
                for d in states {
                    match d.state {
                        State::Alive => self.alive(d, now_ms, None),
                        s => self.failed(&d.name.clone(), d.incarnation, s, now_ms, &mut ignored),
                    }
                }
                // The rest is the application's state (libnetwork's network memberships), merged after the
                // members as memberlist does.
                let user_len = usize::try_from(wire::field_u64(&header, "UserStateLen")).unwrap_or(usize::MAX);
                if let Some(user) = body.get(..user_len) {
                    self.merge_networks(user);
                }
                reply
            }
            kind::PING => {
                let v = wire::read_value(&mut body)?;
                ack(wire::field_u64(&v, "SeqNo"))
            }
            // A user message (the network database's bulk sync) is answered on a stream of its own.
            kind::USER => {
                let header = wire::read_value(&mut body)?;
                let len = usize::try_from(wire::field_u64(&header, "UserMsgLen")).unwrap_or(usize::MAX);
                if let Some(user) = body.get(..len) {
                    self.stream_user_message(user);
                }
                return Ok(None);
            }
            _ => return Ok(None),
        };
        Ok(Some(wire::seal_stream(self.primary_key()?, nonce, &reply)?))
    }

    /// This member's push-pull: itself and every member it knows, and the network memberships it heard of
    /// (none of its own).
    fn local_state(&self, join: bool) -> Vec<u8> {
        let networks: Vec<NetworkEntry> = self
            .networks
            .iter()
            .map(|((node, network), &(l_time, leaving))| NetworkEntry {
                network_id: network.clone(),
                l_time,
                node_name: node.clone(),
                leaving,
            })
            .chain(self.joined.iter().map(|(network, &l_time)| NetworkEntry {
                network_id: network.clone(),
                l_time,
                node_name: self.name.clone(),
                leaving: false,
            }))
            .collect();
        let l_time = networks.iter().map(|n| n.l_time).max().unwrap_or(1);
        let pp = NetworkPushPull { l_time, networks, node_name: String::new() };
        let user = GossipMessage { kind: NETWORKDB_PUSH_PULL, data: pp.encode_to_vec() }.encode_to_vec();
        let mut w = Writer::with_type(kind::PUSH_PULL);
        w.map(3).key("Nodes").uint(self.peers.len() as u64 + 1).key("UserStateLen").uint(user.len() as u64);
        w.key("Join").bool(join);
        let me = (self.name.as_str(), self.addr, &[][..], self.incarnation, State::Alive, &VERSIONS[..]);
        let others =
            self.peers.iter().map(|(n, p)| (n.as_str(), p.addr, &p.meta[..], p.incarnation, p.state, &p.versions[..]));
        for (name, addr, meta, inc, state, versions) in std::iter::once(me).chain(others) {
            w.map(7)
                .key("Name")
                .raw(name.as_bytes())
                .key("Addr")
                .raw(&addr_bytes(&addr))
                .key("Port")
                .uint(u64::from(addr.port()))
                .key("Meta")
                .raw(meta)
                .key("Incarnation")
                .uint(u64::from(inc))
                .key("State")
                .uint(state as u64)
                .key("Vsn")
                .raw(versions);
        }
        w.out.extend_from_slice(&user);
        w.out
    }
}

/// An `alive` message about member `name`.
fn alive_message(name: &str, addr: SocketAddr, meta: &[u8], incarnation: u32, versions: &[u8]) -> Vec<u8> {
    let mut w = Writer::with_type(kind::ALIVE);
    w.map(6)
        .key("Incarnation")
        .uint(u64::from(incarnation))
        .key("Node")
        .raw(name.as_bytes())
        .key("Addr")
        .raw(&addr_bytes(&addr))
        .key("Port")
        .uint(u64::from(addr.port()))
        .key("Meta")
        .raw(meta)
        .key("Vsn")
        .raw(versions);
    w.out
}

/// A memberlist user message carrying the network database's message `kind_`.
fn user(kind_: i32, data: Vec<u8>) -> Vec<u8> {
    let mut msg = vec![kind::USER];
    msg.extend_from_slice(&GossipMessage { kind: kind_, data }.encode_to_vec());
    msg
}

fn ack(seq: u64) -> Vec<u8> {
    let mut w = Writer::with_type(kind::ACK);
    w.map(2).key("SeqNo").uint(seq).key("Payload").raw(&[]);
    w.out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const KEY: [u8; 16] = [5; 16];

    fn member() -> Member {
        let mut m = Member::new("shoal-1".into(), "10.0.0.1:7946".parse().unwrap());
        m.set_keys(vec![KEY.to_vec()]);
        m
    }

    fn nonce() -> [u8; NONCE_BYTES] {
        [3; NONCE_BYTES]
    }

    /// A push-pull as a joining engine sends it: its own state, compressed, in the encrypted envelope.
    fn join_frame(name: &str, ip: [u8; 4]) -> Vec<u8> {
        push_pull_frame(name, ip, &[])
    }

    /// A push-pull from `name` whose network database state is `networks` (node, network, time, leaving).
    fn push_pull_frame(name: &str, ip: [u8; 4], networks: &[(&str, &str, u64, bool)]) -> Vec<u8> {
        let networks = networks
            .iter()
            .map(|&(node, net, l_time, leaving)| NetworkEntry {
                network_id: net.into(),
                l_time,
                node_name: node.into(),
                leaving,
            })
            .collect();
        let pp = NetworkPushPull { l_time: 1, networks, node_name: name.into() };
        let user = GossipMessage { kind: NETWORKDB_PUSH_PULL, data: pp.encode_to_vec() }.encode_to_vec();
        let mut w = Writer::with_type(kind::PUSH_PULL);
        w.map(3).key("Nodes").uint(1).key("UserStateLen").uint(user.len() as u64).key("Join").bool(true);
        w.map(7).key("Name").raw(name.as_bytes()).key("Addr").raw(&ip).key("Port").uint(7946);
        w.key("Meta").raw(&[]).key("Incarnation").uint(1).key("State").uint(0).key("Vsn").raw(&VERSIONS);
        w.out.extend_from_slice(&user);
        let packed = weezl::encode::Encoder::new(weezl::BitOrder::Lsb, 8).encode(&w.out).unwrap();
        let mut c = Writer::with_type(kind::COMPRESS);
        c.map(2).key("Algo").uint(0).key("Buf").raw(&packed);
        wire::seal_stream(&KEY, nonce(), &c.out).unwrap()
    }

    fn names_in_reply(reply: &[u8]) -> Vec<String> {
        let plain = wire::open_stream(&[KEY.to_vec()], reply).unwrap();
        assert_eq!(plain[0], kind::PUSH_PULL);
        let mut body = &plain[1..];
        let header = wire::read_value(&mut body).unwrap();
        let n = wire::field_u64(&header, "Nodes");
        let names = (0..n).map(|_| wire::field_str(&wire::read_value(&mut body).unwrap(), "Name")).collect();
        let user = GossipMessage::decode(body).unwrap();
        assert_eq!(user.kind, NETWORKDB_PUSH_PULL);
        names
    }

    /// The network memberships a push-pull reply carries: (node, network, time, leaving).
    fn networks_in_reply(reply: &[u8]) -> Vec<(String, String, u64, bool)> {
        let plain = wire::open_stream(&[KEY.to_vec()], reply).unwrap();
        let mut body = &plain[1..];
        let n = wire::field_u64(&wire::read_value(&mut body).unwrap(), "Nodes");
        for _ in 0..n {
            wire::read_value(&mut body).unwrap();
        }
        let pp = NetworkPushPull::decode(GossipMessage::decode(body).unwrap().data.as_slice()).unwrap();
        pp.networks.into_iter().map(|e| (e.node_name, e.network_id, e.l_time, e.leaving)).collect()
    }

    /// The relays waiting: (destination, message type, the subject: an alive's node or a network event's
    /// node and network).
    fn relays(m: &mut Member) -> Vec<(SocketAddr, u8, String)> {
        let out = m.take_relays(&mut nonce).unwrap();
        out.into_iter()
            .map(|(to, packet)| {
                let plain = wire::open(&[KEY.to_vec()], &packet, b"").unwrap();
                let about = match plain[0] {
                    kind::ALIVE => wire::field_str(&wire::read_value(&mut &plain[1..]).unwrap(), "Node"),
                    kind::USER => {
                        let g = GossipMessage::decode(&plain[1..]).unwrap();
                        let e = NetworkEvent::decode(g.data.as_slice()).unwrap();
                        format!("{} {} {} {}", e.node_name, e.network_id, e.l_time, e.kind)
                    }
                    t => format!("type {t}"),
                };
                (to, plain[0], about)
            })
            .collect()
    }

    /// A packet carrying libnetwork's `NetworkEvent` (`kind` 1 join, 2 leave).
    fn network_event_packet(node: &str, net: &str, l_time: u64, kind_: i32) -> Vec<u8> {
        let e = NetworkEvent { kind: kind_, l_time, node_name: node.into(), network_id: net.into() };
        let g = GossipMessage { kind: NETWORKDB_NETWORK_EVENT, data: e.encode_to_vec() };
        let mut msg = vec![kind::USER];
        msg.extend_from_slice(&g.encode_to_vec());
        wire::seal(&KEY, nonce(), b"", &msg).unwrap()
    }

    const A: &str = "10.0.0.2:7946";
    const B: &str = "10.0.0.3:7946";
    const C: &str = "10.0.0.4:7946";

    #[test]
    fn news_of_a_new_member_goes_on_to_every_other_member_once() {
        let mut m = member();
        m.on_stream(&join_frame("engine-a", [10, 0, 0, 2]), 0, nonce()).unwrap();
        assert!(relays(&mut m).is_empty(), "nobody else to tell");
        // engine-b joins: engine-a hears of it from here, whatever engine-b's own broadcast reached.
        m.on_stream(&join_frame("engine-b", [10, 0, 0, 3]), 1, nonce()).unwrap();
        assert_eq!(relays(&mut m), [(A.parse().unwrap(), kind::ALIVE, "engine-b".to_string())]);
        // The same news again (engine-b's broadcast, from engine-b): nothing new to pass on.
        let alive = alive_message("engine-b", B.parse().unwrap(), &[], 1, &VERSIONS);
        let packet = wire::seal(&KEY, nonce(), b"", &alive).unwrap();
        m.on_packet(&packet, B.parse().unwrap(), 2, &mut nonce).unwrap();
        assert!(relays(&mut m).is_empty());
        // A higher incarnation (engine-b refuted a suspicion) is news, but not for the one who told it.
        m.on_stream(&join_frame("engine-c", [10, 0, 0, 4]), 3, nonce()).unwrap();
        relays(&mut m);
        let alive = alive_message("engine-b", B.parse().unwrap(), &[], 2, &VERSIONS);
        let packet = wire::seal(&KEY, nonce(), b"", &alive).unwrap();
        m.on_packet(&packet, C.parse().unwrap(), 4, &mut nonce).unwrap();
        assert_eq!(relays(&mut m), [(A.parse().unwrap(), kind::ALIVE, "engine-b".to_string())]);
    }

    /// The user messages waiting, decoded: (destination, "JOIN net" / "LEAVE net" / "CREATE net key" ...;
    /// another node's network event relayed is prefixed with its name).
    fn published(m: &mut Member) -> Vec<(SocketAddr, String)> {
        let out = m.take_relays(&mut nonce).unwrap();
        out.into_iter()
            .map(|(to, packet)| {
                let plain = wire::open(&[KEY.to_vec()], &packet, b"").unwrap();
                assert_eq!(plain[0], kind::USER);
                let g = GossipMessage::decode(&plain[1..]).unwrap();
                let what = if g.kind == NETWORKDB_NETWORK_EVENT {
                    let e = NetworkEvent::decode(g.data.as_slice()).unwrap();
                    let who = if e.node_name == "shoal-1" { String::new() } else { format!("{}: ", e.node_name) };
                    format!("{who}{} {}", ["", "JOIN", "LEAVE"][e.kind as usize], e.network_id)
                } else {
                    let e = TableEvent::decode(g.data.as_slice()).unwrap();
                    assert_eq!(e.node_name, "shoal-1");
                    let kind = ["", "CREATE", "UPDATE", "DELETE"][e.kind as usize];
                    format!("{kind} {} {}", e.network_id, e.key)
                };
                (to, what)
            })
            .collect()
    }

    #[test]
    fn entries_are_published_with_the_networks_join_and_an_engine_joining_later_hears_them() {
        let mut m = member();
        m.on_stream(&join_frame("engine-a", [10, 0, 0, 2]), 0, nonce()).unwrap();
        m.on_stream(&join_frame("engine-b", [10, 0, 0, 3]), 0, nonce()).unwrap();
        relays(&mut m);
        let a: SocketAddr = A.parse().unwrap();
        let b: SocketAddr = B.parse().unwrap();
        let key = |k: &str| ("net1".to_string(), PEER_TABLE.to_string(), k.to_string());
        let entries = |v: &[(&str, &[u8])]| v.iter().map(|(k, x)| (key(k), x.to_vec())).collect::<Entries>();
        m.publish(entries(&[("t1", b"r1")]), 100);
        let s = |x: &str| x.to_string();
        assert_eq!(
            published(&mut m),
            [(a, s("JOIN net1")), (b, s("JOIN net1")), (a, s("CREATE net1 t1")), (b, s("CREATE net1 t1"))]
        );
        // The same entries again: nothing to say. A change, an addition and a removal: each said once.
        m.publish(entries(&[("t1", b"r1")]), 100);
        assert!(published(&mut m).is_empty());
        m.publish(entries(&[("t2", b"r2")]), 100);
        assert_eq!(
            published(&mut m),
            [(a, s("DELETE net1 t1")), (b, s("DELETE net1 t1")), (a, s("CREATE net1 t2")), (b, s("CREATE net1 t2"))]
        );
        // The member is in net1 in its push-pulls, and an engine that joins net1 later hears its entries.
        let reply = m.on_stream(&join_frame("engine-c", [10, 0, 0, 4]), 1, nonce()).unwrap().unwrap();
        assert!(networks_in_reply(&reply)
            .iter()
            .any(|(node, net, _, leaving)| node == "shoal-1" && net == "net1" && !leaving));
        relays(&mut m);
        let join = network_event_packet("engine-c", "net1", 5, NETWORK_JOIN);
        m.on_packet(&join, C.parse().unwrap(), 2, &mut nonce).unwrap();
        let c: SocketAddr = C.parse().unwrap();
        let heard: Vec<_> = published(&mut m).into_iter().filter(|(to, _)| *to == c).collect();
        assert_eq!(heard, [(c, s("JOIN net1")), (c, s("CREATE net1 t2"))]);
        // No entry left in net1: the member leaves it.
        m.publish(Entries::new(), 100);
        let left: Vec<_> = published(&mut m).into_iter().filter(|(to, _)| *to == a).collect();
        assert_eq!(left, [(a, s("DELETE net1 t2")), (a, s("LEAVE net1"))]);
    }

    /// The database's bulk sync message as an engine sends it: `node`'s entries in `networks` (none here).
    pub(crate) fn bulk_sync_of(node: &str, networks: &[&str], unsolicited: bool) -> Vec<u8> {
        let bsm = BulkSyncMessage {
            l_time: 500,
            unsolicited,
            node_name: node.into(),
            networks: networks.iter().map(|n| n.to_string()).collect(),
            payload: GossipMessage { kind: NETWORKDB_COMPOUND, data: vec![] }.encode_to_vec(),
        };
        GossipMessage { kind: NETWORKDB_BULK_SYNC, data: bsm.encode_to_vec() }.encode_to_vec()
    }

    /// An unsolicited `bulk_sync_of`.
    pub(crate) fn bulk_sync(node: &str, networks: &[&str]) -> Vec<u8> {
        bulk_sync_of(node, networks, true)
    }

    /// A bulk sync as an engine sends it on a stream.
    fn bulk_sync_frame(node: &str, networks: &[&str], unsolicited: bool) -> Vec<u8> {
        let body = bulk_sync_of(node, networks, unsolicited);
        let mut w = Writer::with_type(kind::USER);
        w.map(1).key("UserMsgLen").uint(body.len() as u64);
        w.out.extend_from_slice(&body);
        wire::seal_stream(&KEY, nonce(), &w.out).unwrap()
    }

    /// A table event a bulk sync carries: (network, key, Lamport time, kind).
    pub(crate) type SyncedEvent = (String, String, u64, i32);

    /// A bulk sync answer as its receiver reads it: (its sender, networks, the table events it carries as
    /// (network, key, Lamport time, kind)), checking that it is a solicited one.
    pub(crate) fn read_bulk_sync_answer(frame: &[u8], key: &[u8]) -> (String, Vec<String>, Vec<SyncedEvent>) {
        let plain = wire::open_stream(&[key.to_vec()], frame).unwrap();
        assert_eq!(plain[0], kind::USER);
        let mut body = &plain[1..];
        let len = usize::try_from(wire::field_u64(&wire::read_value(&mut body).unwrap(), "UserMsgLen")).unwrap();
        assert_eq!(body.len(), len);
        let g = GossipMessage::decode(body).unwrap();
        assert_eq!(g.kind, NETWORKDB_BULK_SYNC);
        let bsm = BulkSyncMessage::decode(g.data.as_slice()).unwrap();
        assert!(!bsm.unsolicited);
        let c = GossipMessage::decode(bsm.payload.as_slice()).unwrap();
        assert_eq!(c.kind, NETWORKDB_COMPOUND);
        let events = CompoundMessage::decode(c.data.as_slice())
            .unwrap()
            .messages
            .into_iter()
            .map(|m| {
                let g = GossipMessage::decode(m.payload.as_slice()).unwrap();
                assert_eq!(g.kind, NETWORKDB_TABLE_EVENT);
                let e = TableEvent::decode(g.data.as_slice()).unwrap();
                assert_eq!(e.node_name, bsm.node_name);
                (e.network_id, e.key, e.l_time, e.kind)
            })
            .collect();
        (bsm.node_name, bsm.networks, events)
    }

    #[test]
    fn an_engines_bulk_sync_is_answered_on_a_stream_of_its_own_with_the_entries_of_its_networks() {
        let mut m = member();
        m.on_stream(&join_frame("engine-a", [10, 0, 0, 2]), 0, nonce()).unwrap();
        let entry = |net: &str, k: &str| ((net.to_string(), PEER_TABLE.to_string(), k.to_string()), b"r".to_vec());
        m.publish([entry("net1", "t1"), entry("net1", "t2"), entry("net2", "t3")].into(), 100);
        relays(&mut m);
        // No answer on the engine's own stream: a new one to its address.
        assert_eq!(m.on_stream(&bulk_sync_frame("engine-a", &["net1"], true), 1, nonce()).unwrap(), None);
        let out = m.take_streams(&mut nonce).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, A.parse::<SocketAddr>().unwrap());
        let (from, networks, events) = read_bulk_sync_answer(&out[0].1, &KEY);
        assert_eq!((from.as_str(), networks), ("shoal-1", vec!["net1".to_string()]));
        let keys: Vec<_> = events.iter().map(|(n, k, _, kind)| (n.as_str(), k.as_str(), *kind)).collect();
        assert_eq!(keys, [("net1", "t1", TABLE_CREATE), ("net1", "t2", TABLE_CREATE)]);
        // The engine's clock (500) is witnessed: what the member publishes next is newer.
        m.publish([entry("net1", "t1")].into(), 100);
        let later = m.published.values().map(|(t, _)| *t).max().unwrap();
        assert!(m.clock > 500 && later <= m.clock, "{} {later}", m.clock);
        // An answer to the member's own sync (solicited), and a sync from an unknown node: nothing to send.
        m.on_stream(&bulk_sync_frame("engine-a", &["net1"], false), 2, nonce()).unwrap();
        m.on_stream(&bulk_sync_frame("engine-z", &["net1"], true), 2, nonce()).unwrap();
        assert!(m.take_streams(&mut nonce).unwrap().is_empty());
    }

    #[test]
    fn when_a_member_dies_the_entries_are_said_again_newer_than_any_heard() {
        let mut m = member();
        m.on_stream(&join_frame("engine-a", [10, 0, 0, 2]), 0, nonce()).unwrap();
        m.on_stream(&join_frame("shoal-2", [10, 0, 0, 3]), 0, nonce()).unwrap();
        let key = |k: &str| ("net1".to_string(), PEER_TABLE.to_string(), k.to_string());
        m.publish([(key("t1"), b"r1".to_vec()), (key("t2"), b"r2".to_vec())].into(), 100);
        relays(&mut m);
        // Another manager's member publishes the same key later: its time is witnessed.
        let theirs = TableEvent {
            kind: TABLE_UPDATE,
            l_time: 5_000,
            node_name: "shoal-2".into(),
            network_id: "net1".into(),
            table_name: PEER_TABLE.into(),
            key: "t1".into(),
            value: b"r1".to_vec(),
            residual_reap_time: 0,
        };
        let mut msg = vec![kind::USER];
        msg.extend_from_slice(&user(NETWORKDB_TABLE_EVENT, theirs.encode_to_vec())[1..]);
        let packet = wire::seal(&KEY, nonce(), b"", &msg).unwrap();
        m.on_packet(&packet, B.parse().unwrap(), 1, &mut nonce).unwrap();
        // A time far past the clock is not taken in.
        let mut far = theirs.clone();
        far.l_time = u64::MAX;
        let mut msg = vec![kind::USER];
        msg.extend_from_slice(&user(NETWORKDB_TABLE_EVENT, far.encode_to_vec())[1..]);
        m.on_packet(&wire::seal(&KEY, nonce(), b"", &msg).unwrap(), B.parse().unwrap(), 1, &mut nonce).unwrap();
        assert!(relays(&mut m).is_empty(), "entries are not relayed");
        // shoal-2 dies: every entry goes again to the live members, newer than 5,000.
        let mut dead = Writer::with_type(kind::DEAD);
        dead.map(3).key("Incarnation").uint(1).key("Node").raw(b"shoal-2").key("From").raw(b"engine-a");
        m.on_packet(&wire::seal(&KEY, nonce(), b"", &dead.out).unwrap(), A.parse().unwrap(), 2, &mut nonce).unwrap();
        let sent: Vec<_> = m
            .take_relays(&mut nonce)
            .unwrap()
            .into_iter()
            .map(|(to, packet)| {
                let plain = wire::open(&[KEY.to_vec()], &packet, b"").unwrap();
                let g = GossipMessage::decode(&plain[1..]).unwrap();
                assert_eq!(g.kind, NETWORKDB_TABLE_EVENT);
                let e = TableEvent::decode(g.data.as_slice()).unwrap();
                (to, e.key, e.kind, e.l_time)
            })
            .collect();
        let a: SocketAddr = A.parse().unwrap();
        assert_eq!(sent, [(a, "t1".into(), TABLE_CREATE, 5_001), (a, "t2".into(), TABLE_CREATE, 5_002)]);
    }

    #[test]
    fn a_network_join_goes_on_once_and_into_the_next_push_pulls() {
        let mut m = member();
        for (name, ip) in [("engine-a", [10, 0, 0, 2]), ("engine-b", [10, 0, 0, 3]), ("engine-c", [10, 0, 0, 4])] {
            m.on_stream(&join_frame(name, ip), 0, nonce()).unwrap();
        }
        relays(&mut m);
        // engine-a joins net1 and tells this member: engine-b and engine-c hear it from here.
        let join = network_event_packet("engine-a", "net1", 5, NETWORK_JOIN);
        m.on_packet(&join, A.parse().unwrap(), 1, &mut nonce).unwrap();
        let want = "engine-a net1 5 1".to_string();
        assert_eq!(
            relays(&mut m),
            [(B.parse().unwrap(), kind::USER, want.clone()), (C.parse().unwrap(), kind::USER, want)]
        );
        // Heard again (from engine-b, which got it from engine-a too): not news.
        m.on_packet(&join, B.parse().unwrap(), 2, &mut nonce).unwrap();
        assert!(relays(&mut m).is_empty());
        // A leave of a network nobody joined, and a join of a member not known: ignored, as libnetwork does.
        m.on_packet(&network_event_packet("engine-b", "net2", 6, NETWORK_LEAVE), B.parse().unwrap(), 3, &mut nonce)
            .unwrap();
        m.on_packet(&network_event_packet("stranger", "net1", 6, NETWORK_JOIN), B.parse().unwrap(), 3, &mut nonce)
            .unwrap();
        assert!(relays(&mut m).is_empty());
        // An engine that missed the join learns it from this member's push-pull; what the push-pull brings
        // (engine-c's own join, which its broadcasts may not have carried to anyone) goes on to the others.
        let frame = push_pull_frame("engine-c", [10, 0, 0, 4], &[("engine-c", "net1", 7, false)]);
        let reply = m.on_stream(&frame, 4, nonce()).unwrap().unwrap();
        assert_eq!(networks_in_reply(&reply), [("engine-a".to_string(), "net1".to_string(), 5, false)]);
        let want = "engine-c net1 7 1".to_string();
        assert_eq!(
            relays(&mut m),
            [(A.parse().unwrap(), kind::USER, want.clone()), (B.parse().unwrap(), kind::USER, want)]
        );
        // engine-a leaves net1 later: news again; and a member's memberships go with it once it is forgotten.
        m.on_packet(&network_event_packet("engine-a", "net1", 8, NETWORK_LEAVE), A.parse().unwrap(), 5, &mut nonce)
            .unwrap();
        assert_eq!(relays(&mut m).len(), 2);
        let mut dead = Writer::with_type(kind::DEAD);
        dead.map(3).key("Incarnation").uint(1).key("Node").raw(b"engine-a").key("From").raw(b"engine-b");
        m.on_packet(&wire::seal(&KEY, nonce(), b"", &dead.out).unwrap(), B.parse().unwrap(), 6, &mut nonce).unwrap();
        m.on_stream(&join_frame("engine-d", [10, 0, 0, 5]), 6 + DEAD_KEPT_MS, nonce()).unwrap();
        let reply = m.on_stream(&join_frame("engine-e", [10, 0, 0, 6]), 7 + DEAD_KEPT_MS, nonce()).unwrap().unwrap();
        assert_eq!(networks_in_reply(&reply), [("engine-c".to_string(), "net1".to_string(), 7, false)]);
    }

    #[test]
    fn a_joiner_learns_of_the_members_that_joined_before_it() {
        let mut m = member();
        let first = m.on_stream(&join_frame("engine-a", [10, 0, 0, 2]), 0, nonce()).unwrap().unwrap();
        assert_eq!(names_in_reply(&first), ["shoal-1"]);
        let second = m.on_stream(&join_frame("engine-b", [10, 0, 0, 3]), 1, nonce()).unwrap().unwrap();
        // The state goes out before the joiner's is merged, as memberlist does.
        assert_eq!(names_in_reply(&second), ["shoal-1", "engine-a"]);
        assert_eq!(m.peers()["engine-a"].addr, "10.0.0.2:7946".parse().unwrap());
        assert_eq!(
            m.take_events(),
            [
                Event::Joined("engine-a".into(), "10.0.0.2:7946".parse().unwrap()),
                Event::Joined("engine-b".into(), "10.0.0.3:7946".parse().unwrap())
            ]
        );
        // Without the cluster's key, nothing is read.
        let mut stranger = Member::new("x".into(), "10.0.0.9:7946".parse().unwrap());
        stranger.set_keys(vec![vec![6; 16]]);
        assert!(stranger.on_stream(&join_frame("engine-c", [10, 0, 0, 4]), 0, nonce()).is_err());
        assert!(stranger.peers().is_empty());
    }

    #[test]
    fn a_probe_is_acked_to_its_source_and_a_suspicion_is_refuted() {
        let mut m = member();
        m.on_stream(&join_frame("engine-a", [10, 0, 0, 2]), 0, nonce()).unwrap();
        let mut ping = Writer::with_type(kind::PING);
        ping.map(2).key("SeqNo").uint(77).key("Node").raw(b"shoal-1");
        let packet = wire::seal(&KEY, nonce(), b"", &ping.out).unwrap();
        let from: SocketAddr = "10.0.0.2:7946".parse().unwrap();
        let out = m.on_packet(&packet, from, 5, &mut nonce).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, from);
        let plain = wire::open(&[KEY.to_vec()], &out[0].1, b"").unwrap();
        assert_eq!(plain[0], kind::ACK);
        assert_eq!(wire::field_u64(&wire::read_value(&mut &plain[1..]).unwrap(), "SeqNo"), 77);
        // A probe for another name is not answered.
        let mut other = Writer::with_type(kind::PING);
        other.map(2).key("SeqNo").uint(1).key("Node").raw(b"someone-else");
        let packet = wire::seal(&KEY, nonce(), b"", &other.out).unwrap();
        assert!(m.on_packet(&packet, from, 5, &mut nonce).unwrap().is_empty());
        // Suspected, in a compound packet: it says it is alive, with a higher incarnation, to every member.
        let mut suspect = Writer::with_type(kind::SUSPECT);
        suspect.map(3).key("Incarnation").uint(1).key("Node").raw(b"shoal-1").key("From").raw(b"engine-a");
        let mut compound = vec![kind::COMPOUND, 1];
        compound.extend_from_slice(&u16::try_from(suspect.out.len()).unwrap().to_be_bytes());
        compound.extend_from_slice(&suspect.out);
        let packet = wire::seal(&KEY, nonce(), b"", &compound).unwrap();
        let out = m.on_packet(&packet, from, 6, &mut nonce).unwrap();
        assert_eq!(out.len(), 1);
        let plain = wire::open(&[KEY.to_vec()], &out[0].1, b"").unwrap();
        assert_eq!(plain[0], kind::ALIVE);
        let alive = wire::read_value(&mut &plain[1..]).unwrap();
        assert_eq!(wire::field_u64(&alive, "Incarnation"), 2);
        assert_eq!(wire::field_bytes(&alive, "Addr"), [10, 0, 0, 1]);
    }

    #[test]
    fn a_dead_member_stays_known_for_a_while_then_is_forgotten() {
        let mut m = member();
        m.on_stream(&join_frame("engine-a", [10, 0, 0, 2]), 0, nonce()).unwrap();
        m.take_events();
        let mut dead = Writer::with_type(kind::DEAD);
        dead.map(3).key("Incarnation").uint(1).key("Node").raw(b"engine-a").key("From").raw(b"engine-b");
        let packet = wire::seal(&KEY, nonce(), b"", &dead.out).unwrap();
        m.on_packet(&packet, "10.0.0.3:7946".parse().unwrap(), 1_000, &mut nonce).unwrap();
        assert_eq!(m.peers()["engine-a"].state, State::Dead);
        assert_eq!(m.take_events(), [Event::Gone("engine-a".into())]);
        let reply = m.on_stream(&join_frame("engine-b", [10, 0, 0, 3]), 2_000, nonce()).unwrap().unwrap();
        assert_eq!(names_in_reply(&reply), ["shoal-1", "engine-a"], "the news of its death spreads");
        m.on_stream(&join_frame("engine-c", [10, 0, 0, 4]), 1_000 + DEAD_KEPT_MS, nonce()).unwrap();
        assert!(!m.peers().contains_key("engine-a"));
    }
}
