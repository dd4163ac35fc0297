//! The desired network state of one node (`NodeNetState`), as the agent derives it from its assigned tasks and
//! the manager's networks, and its validation: every count, range and address is checked here, before the
//! planner or the executor sees it. Plain data: no IO, no clock.

use std::collections::BTreeSet;
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use crate::Error;

/// Most overlay networks one node carries.
pub(crate) const MAX_NETWORKS: usize = 256;
/// Most task namespaces one node plumbs.
pub(crate) const MAX_TASKS: usize = 1024;
/// Most IPv4 subnets of one network (the manager's bound too): each has a bridge and a VXLAN device of its own.
pub(crate) const MAX_SUBNETS_PER_NETWORK: usize = 16;
/// Most networks one task is attached to.
pub(crate) const MAX_ATTACHMENTS_PER_TASK: usize = 16;
/// Most remote peers (task addresses on other nodes) of one network.
pub(crate) const MAX_PEERS_PER_NETWORK: usize = 65_536;
/// Most services with a VIP on one network.
pub(crate) const MAX_SERVICES_PER_NETWORK: usize = 1024;
/// Most backends behind one VIP.
pub(crate) const MAX_BACKENDS_PER_SERVICE: usize = 1024;
/// Most aliases of one service on one network.
pub(crate) const MAX_ALIASES: usize = 32;
/// Longest service, alias or network name (one DNS label).
pub(crate) const MAX_DNS_LABEL_LEN: usize = 63;
/// Shortest IPv6 prefix of a network (the manager's bound too).
pub(crate) const MIN_IPV6_PREFIX_LEN: u8 = 48;
/// Longest IPv6 prefix of a network: a few addresses at least.
pub(crate) const MAX_IPV6_PREFIX_LEN: u8 = 120;
/// Largest VXLAN network identifier (24 bits).
pub(crate) const MAX_VNI: u32 = (1 << 24) - 1;
/// Longest network, task or service ID accepted.
pub(crate) const MAX_ID_LEN: usize = 64;
/// Longest interface name the kernel takes (IFNAMSIZ less its terminating zero).
pub(crate) const MAX_IFNAME_LEN: usize = 15;
/// Most ports published on one node (routing mesh and host mode together). With `MAX_BACKENDS_PER_SERVICE`
/// it bounds the node table's published-port rules: one rule per port in each of two chains, each with at
/// most that many map entries. The allocator already keeps ingress ports unique cluster-wide (65,535 per
/// protocol at most) and the scheduler host ports unique per node.
pub(crate) const MAX_PUBLISHED_PORTS: usize = 4096;
/// Default UDP port of the VXLAN data path (as Docker's `--data-path-port`).
pub(crate) const DEFAULT_VXLAN_PORT: u16 = 4789;
/// Default MTU inside overlays: an underlay of 1500 less the 50 bytes of VXLAN encapsulation.
pub(crate) const DEFAULT_OVERLAY_MTU: u16 = 1450;

/// An IPv4 address with its prefix length (`10.0.0.2/24`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ipv4Cidr {
    /// The address.
    pub addr: Ipv4Addr,
    /// The prefix length, 0..=32.
    pub prefix_len: u8,
}

impl Ipv4Cidr {
    /// The network address (host bits cleared).
    pub fn network(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.addr) & self.mask())
    }

    /// Whether `ip` lies in this prefix.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & self.mask() == u32::from(self.network())
    }

    /// The broadcast address (host bits set).
    pub fn broadcast(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.network()) | !self.mask())
    }

    /// Whether this prefix and `other` share an address.
    pub fn overlaps(&self, other: &Ipv4Cidr) -> bool {
        self.contains(other.network()) || other.contains(self.network())
    }

    fn mask(&self) -> u32 {
        if self.prefix_len == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(self.prefix_len.min(32)))
        }
    }
}

impl fmt::Display for Ipv4Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

impl std::str::FromStr for Ipv4Cidr {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = || Error::Invalid(format!("{s:?} is not an IPv4 prefix like 10.0.0.0/24"));
        let (a, p) = s.split_once('/').ok_or_else(bad)?;
        let addr = a.parse().map_err(|_| bad())?;
        let prefix_len: u8 = p.parse().map_err(|_| bad())?;
        if prefix_len > 32 {
            return Err(bad());
        }
        Ok(Ipv4Cidr { addr, prefix_len })
    }
}

/// An IPv6 address with its prefix length (`fd00:1::2/64`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ipv6Cidr {
    /// The address.
    pub addr: Ipv6Addr,
    /// The prefix length, 0..=128.
    pub prefix_len: u8,
}

impl Ipv6Cidr {
    /// The network address (host bits cleared): the subnet-router anycast address, nobody's.
    pub fn network(&self) -> Ipv6Addr {
        Ipv6Addr::from(u128::from(self.addr) & self.mask())
    }

    /// Whether `ip` lies in this prefix.
    pub fn contains(&self, ip: Ipv6Addr) -> bool {
        u128::from(ip) & self.mask() == u128::from(self.network())
    }

    fn mask(&self) -> u128 {
        if self.prefix_len == 0 {
            0
        } else {
            u128::MAX << (128 - u32::from(self.prefix_len.min(128)))
        }
    }
}

impl fmt::Display for Ipv6Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

impl std::str::FromStr for Ipv6Cidr {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = || Error::Invalid(format!("{s:?} is not an IPv6 prefix like fd00:1::/64"));
        let (a, p) = s.split_once('/').ok_or_else(bad)?;
        let addr = a.parse().map_err(|_| bad())?;
        let prefix_len: u8 = p.parse().map_err(|_| bad())?;
        if prefix_len > 128 {
            return Err(bad());
        }
        Ok(Ipv6Cidr { addr, prefix_len })
    }
}

/// An Ethernet address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Mac(pub [u8; 6]);

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(f, "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", m[0], m[1], m[2], m[3], m[4], m[5])
    }
}

impl std::str::FromStr for Mac {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = || Error::Invalid(format!("{s:?} is not an Ethernet address like 02:42:0a:00:00:02"));
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for b in &mut out {
            *b = u8::from_str_radix(parts.next().ok_or_else(bad)?, 16).map_err(|_| bad())?;
        }
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(Mac(out))
    }
}

/// The MAC a task endpoint with address `addr` gets (locally administered `02:42` and the four address bytes, as
/// Docker does), so every node can compute a remote task's MAC from its address alone.
pub fn mac_for(addr: Ipv4Addr) -> Mac {
    let o = addr.octets();
    Mac([0x02, 0x42, o[0], o[1], o[2], o[3]])
}

/// What one node must have: see the crate doc.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeNetState {
    /// This node's underlay address: the source of its VXLAN packets, the destination of its peers'.
    pub underlay_ip: Option<Ipv4Addr>,
    /// UDP port of the VXLAN data path (every node of a cluster uses the same one).
    pub vxlan_port: u16,
    /// MTU of the bridges, VXLAN devices and task interfaces.
    pub overlay_mtu: u16,
    /// The overlay networks this node has tasks on.
    pub networks: Vec<NetworkState>,
    /// The local tasks with network attachments.
    pub tasks: Vec<TaskState>,
    /// This node's own address on the ingress network, when it carries the routing mesh: it is given to the
    /// network's bridge and is the source of what the node forwards to the tasks behind a published port.
    pub ingress: Option<NodeIngress>,
    /// Ports published on every address of this node (routing mesh ports and host-mode ports of local tasks),
    /// each forwarded to its backends.
    pub published: Vec<PublishedPort>,
}

/// The node's own endpoint on the ingress network (its `Node.attachments` entry).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeIngress {
    /// The ingress network's ID (one of `NodeNetState::networks`).
    pub network_id: String,
    /// The node's address on it.
    pub address: Ipv4Addr,
}

/// A transport protocol of a published port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        })
    }
}

/// A port published on the node's addresses: connections to any local address on `port` (loopback only
/// from the node itself) are forwarded to `target_port` of one of `backends` (spread evenly); none: refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishedPort {
    /// Its protocol.
    pub protocol: Protocol,
    /// The port on the node, 1..=65535.
    pub port: u16,
    /// The port on the backends, 1..=65535.
    pub target_port: u16,
    /// The task addresses behind it, each inside one of the node's networks: a service's running tasks on
    /// the ingress network (routing mesh), or one local task (host mode).
    pub backends: Vec<Ipv4Addr>,
}

impl NodeNetState {
    /// An empty state for a node with underlay address `underlay_ip` and the default port and MTU.
    pub fn new(underlay_ip: Ipv4Addr) -> NodeNetState {
        NodeNetState {
            underlay_ip: Some(underlay_ip),
            vxlan_port: DEFAULT_VXLAN_PORT,
            overlay_mtu: DEFAULT_OVERLAY_MTU,
            networks: Vec::new(),
            tasks: Vec::new(),
            ingress: None,
            published: Vec::new(),
        }
    }

    /// The network with ID `id`.
    pub fn network(&self, id: &str) -> Option<&NetworkState> {
        self.networks.iter().find(|n| n.id == id)
    }

    /// Checks every bound and cross-reference; nothing is planned for an invalid state.
    pub fn validate(&self) -> Result<(), Error> {
        let inv = |m: String| Err(Error::Invalid(m));
        if self.networks.len() > MAX_NETWORKS {
            return inv(format!("{} networks on one node; at most {MAX_NETWORKS}", self.networks.len()));
        }
        if self.tasks.len() > MAX_TASKS {
            return inv(format!("{} tasks with networks on one node; at most {MAX_TASKS}", self.tasks.len()));
        }
        if !self.networks.is_empty() && self.underlay_ip.is_none() {
            return inv("the node has overlay networks but no underlay address".into());
        }
        if self.vxlan_port == 0 {
            return inv("the VXLAN data path port must be 1..=65535".into());
        }
        if !(576..=9000).contains(&self.overlay_mtu) {
            return inv(format!("overlay MTU {} is outside 576..=9000", self.overlay_mtu));
        }
        let mut ids = BTreeSet::new();
        let mut vnis = BTreeSet::new();
        for n in &self.networks {
            n.validate()?;
            if !ids.insert(n.id.as_str()) {
                return inv(format!("network {} is listed twice", n.id));
            }
            for s in n.subnets() {
                if !vnis.insert(s.vni) {
                    return inv(format!("VNI {} is used by two networks", s.vni));
                }
            }
        }
        if let Some(i) = &self.ingress {
            let Some(n) = self.network(&i.network_id) else {
                return inv(format!("the node's ingress address is on unknown network {}", i.network_id));
            };
            let broadcast =
                Ipv4Addr::from(u32::from(n.subnet.network()) | !(u32::MAX << (32 - u32::from(n.subnet.prefix_len))));
            if !n.subnet.contains(i.address)
                || i.address == n.gateway
                || i.address == n.subnet.network()
                || i.address == broadcast
            {
                return inv(format!(
                    "the node's ingress address {} is not a host address of network {}'s subnet {}",
                    i.address, n.id, n.subnet
                ));
            }
        }
        self.validate_published()?;
        let mut task_ids = BTreeSet::new();
        let mut netns_paths = BTreeSet::new();
        for t in &self.tasks {
            check_id("task", &t.task_id)?;
            if !task_ids.insert(t.task_id.as_str()) {
                return inv(format!("task {} is listed twice", t.task_id));
            }
            if !t.netns.is_absolute() {
                return inv(format!("task {}: network namespace path {:?} is not absolute", t.task_id, t.netns));
            }
            if !netns_paths.insert(t.netns.clone()) {
                return inv(format!("task {}: network namespace {:?} is shared with another task", t.task_id, t.netns));
            }
            if t.attachments.len() > MAX_ATTACHMENTS_PER_TASK {
                return inv(format!(
                    "task {} has {} network attachments; at most {MAX_ATTACHMENTS_PER_TASK}",
                    t.task_id,
                    t.attachments.len()
                ));
            }
            check_ifnames(&t.attachments).map_err(|e| Error::Invalid(format!("task {}: {e}", t.task_id)))?;
            let mut seen = BTreeSet::new();
            for a in &t.attachments {
                let Some(n) = self.network(&a.network_id) else {
                    return inv(format!("task {} is attached to unknown network {}", t.task_id, a.network_id));
                };
                if !seen.insert(a.network_id.as_str()) {
                    return inv(format!("task {} is attached twice to network {}", t.task_id, a.network_id));
                }
                if !n.subnet_of(a.address).is_some_and(|s| s.holds_host(a.address)) {
                    return inv(format!(
                        "task {}: address {} is not a host address of network {}'s subnets",
                        t.task_id, a.address, n.id
                    ));
                }
                if let Some(a6) = a.address6.filter(|a6| !n.ipv6.is_some_and(|s| s.holds_host(*a6))) {
                    return inv(format!(
                        "task {}: IPv6 address {a6} is not a host address of network {}'s IPv6 subnet",
                        t.task_id, n.id
                    ));
                }
            }
        }
        Ok(())
    }
}

impl NodeNetState {
    /// Checks the published ports: their count, numbers, uniqueness and backends (each on one of the networks).
    fn validate_published(&self) -> Result<(), Error> {
        let inv = |m: String| Err(Error::Invalid(m));
        if self.published.len() > MAX_PUBLISHED_PORTS {
            return inv(format!("{} published ports on one node; at most {MAX_PUBLISHED_PORTS}", self.published.len()));
        }
        let mut ports = BTreeSet::new();
        for p in &self.published {
            if p.port == 0 || p.target_port == 0 {
                return inv(format!(
                    "published port {}/{} -> {}: ports must be 1..=65535",
                    p.port, p.protocol, p.target_port
                ));
            }
            if !ports.insert((p.protocol, p.port)) {
                return inv(format!("port {}/{} is published twice", p.port, p.protocol));
            }
            if p.backends.len() > MAX_BACKENDS_PER_SERVICE {
                return inv(format!(
                    "published port {}/{}: {} backends; at most {MAX_BACKENDS_PER_SERVICE}",
                    p.port,
                    p.protocol,
                    p.backends.len()
                ));
            }
            if let Some(b) = p.backends.iter().find(|b| !self.networks.iter().any(|n| n.contains(**b))) {
                return inv(format!(
                    "published port {}/{}: backend {b} is on none of the node's networks",
                    p.port, p.protocol
                ));
            }
        }
        Ok(())
    }
}

fn check_id(what: &str, id: &str) -> Result<(), Error> {
    if id.is_empty()
        || id.len() > MAX_ID_LEN
        || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(Error::Invalid(format!(
            "{what} ID {id:?} must be 1..={MAX_ID_LEN} characters of letters, digits, '-' and '_'"
        )));
    }
    Ok(())
}

/// One overlay network as this node sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkState {
    /// The network's ID.
    pub id: String,
    /// Its name (the suffix of `service.network` names).
    pub name: String,
    /// The VXLAN network identifier of its first subnet, 1..=16777215; it names the network's namespace.
    pub vni: u32,
    /// Its first subnet.
    pub subnet: Ipv4Cidr,
    /// The first subnet's gateway (on each node's gateway end unless `internal`).
    pub gateway: Ipv4Addr,
    /// Its other IPv4 subnets, in the order of its IPAM configs (docs/design/overlay-subnets.md): each with
    /// its own VNI, bridge, VXLAN device and gateway end; the node routes between a network's subnets.
    pub more_subnets: Vec<Subnet>,
    /// Its IPv6 subnet (`docker network create --ipv6`), on the bridge and VXLAN device of its one IPv4
    /// subnet (dual stack; docs/design/overlay-subnets.md, part 2): a task's IPv6 address is on the same
    /// interface as its IPv4 one, with the same MAC. On-link only, as on a Docker overlay: nothing routes IPv6
    /// into or out of the network.
    pub ipv6: Option<Subnet6>,
    /// No route out of the network and none into it (`docker network create --internal`).
    pub internal: bool,
    /// Encrypted data path (`--opt encrypted`): refused, the kernel here has neither IPsec ESP nor WireGuard.
    pub encrypted: bool,
    /// Task addresses of this network on other nodes.
    pub peers: Vec<Peer>,
    /// Services with a VIP on this network.
    pub services: Vec<ServiceVip>,
}

/// One IPv4 subnet of a network, with its own VXLAN ID and gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Subnet {
    /// Its VXLAN network identifier (`vxlanid_list` gives one per subnet, in order).
    pub vni: u32,
    /// The subnet.
    pub subnet: Ipv4Cidr,
    /// Its gateway.
    pub gateway: Ipv4Addr,
}

/// The IPv6 subnet of a network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Subnet6 {
    /// The subnet.
    pub subnet: Ipv6Cidr,
    /// Its gateway as the manager gave it (reserved; nothing routes through it).
    pub gateway: Ipv6Addr,
}

impl Subnet6 {
    /// Whether `ip` is a host address of this subnet: not its subnet-router anycast address nor its gateway.
    pub fn holds_host(&self, ip: Ipv6Addr) -> bool {
        self.subnet.contains(ip) && ip != self.gateway && ip != self.subnet.network()
    }
}

impl Subnet {
    /// Whether `ip` is a host address of this subnet that is not its gateway.
    fn holds_host(&self, ip: Ipv4Addr) -> bool {
        self.subnet.contains(ip) && ip != self.gateway && ip != self.subnet.network() && ip != self.subnet.broadcast()
    }
}

impl NetworkState {
    /// Its subnets in order: the first (`vni`, `subnet`, `gateway`), then `more_subnets`.
    pub fn subnets(&self) -> impl Iterator<Item = Subnet> + '_ {
        std::iter::once(Subnet { vni: self.vni, subnet: self.subnet, gateway: self.gateway })
            .chain(self.more_subnets.iter().copied())
    }

    /// The subnet that holds `ip`, if one does.
    pub fn subnet_of(&self, ip: Ipv4Addr) -> Option<Subnet> {
        self.subnets().find(|s| s.subnet.contains(ip))
    }

    /// Whether one of its subnets holds `ip`.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        self.subnet_of(ip).is_some()
    }

    /// Whether its IPv6 subnet holds `ip`.
    pub fn contains6(&self, ip: Ipv6Addr) -> bool {
        self.ipv6.is_some_and(|s| s.subnet.contains(ip))
    }

    fn validate(&self) -> Result<(), Error> {
        let inv = |m: String| Err(Error::Invalid(m));
        check_id("network", &self.id)?;
        check_dns_name("network", &self.name)?;
        crate::check_encryption(&self.id, self.encrypted)?;
        if self.vni == 0 || self.vni > MAX_VNI {
            return inv(format!("network {}: VNI {} is outside 1..={MAX_VNI}", self.id, self.vni));
        }
        if !(8..=30).contains(&self.subnet.prefix_len) {
            return inv(format!("network {}: subnet {} must have a prefix length in 8..=30", self.id, self.subnet));
        }
        if !self.subnet.contains(self.gateway) {
            return inv(format!("network {}: gateway {} is outside subnet {}", self.id, self.gateway, self.subnet));
        }
        if self.more_subnets.len() >= MAX_SUBNETS_PER_NETWORK {
            return inv(format!(
                "network {}: {} subnets; at most {MAX_SUBNETS_PER_NETWORK}",
                self.id,
                self.more_subnets.len() + 1
            ));
        }
        self.validate_ipv6()?;
        let all: Vec<Subnet> = self.subnets().collect();
        for (i, s) in all.iter().enumerate().skip(1) {
            if s.vni == 0 || s.vni > MAX_VNI {
                return inv(format!("network {}: VNI {} is outside 1..={MAX_VNI}", self.id, s.vni));
            }
            if !(8..=30).contains(&s.subnet.prefix_len) {
                return inv(format!("network {}: subnet {} must have a prefix length in 8..=30", self.id, s.subnet));
            }
            if !s.subnet.contains(s.gateway) {
                return inv(format!("network {}: gateway {} is outside subnet {}", self.id, s.gateway, s.subnet));
            }
            if let Some(o) = all[..i].iter().find(|o| o.vni == s.vni || o.subnet.overlaps(&s.subnet)) {
                return inv(format!(
                    "network {}: subnets {} (VNI {}) and {} (VNI {}) overlap or share a VNI",
                    self.id, o.subnet, o.vni, s.subnet, s.vni
                ));
            }
        }
        if self.peers.len() > MAX_PEERS_PER_NETWORK {
            return inv(format!(
                "network {}: {} remote peers; at most {MAX_PEERS_PER_NETWORK}",
                self.id,
                self.peers.len()
            ));
        }
        let mut addrs = BTreeSet::new();
        for p in &self.peers {
            if !self.contains(p.address) {
                return inv(format!("network {}: peer {} is outside its subnets", self.id, p.address));
            }
            if !addrs.insert(p.address) {
                return inv(format!("network {}: peer address {} is listed twice", self.id, p.address));
            }
        }
        let mut addrs6 = BTreeSet::new();
        for a in self.peers.iter().filter_map(|p| p.address6) {
            if !self.ipv6.is_some_and(|s| s.holds_host(a)) || !addrs6.insert(a) {
                return inv(format!(
                    "network {}: peer IPv6 address {a} is outside its IPv6 subnet or listed twice",
                    self.id
                ));
            }
        }
        if self.services.len() > MAX_SERVICES_PER_NETWORK {
            return inv(format!(
                "network {}: {} services; at most {MAX_SERVICES_PER_NETWORK}",
                self.id,
                self.services.len()
            ));
        }
        let mut vips = BTreeSet::new();
        for s in &self.services {
            check_id("service", &s.service_id)?;
            check_dns_name("service", &s.name)?;
            if s.aliases.len() > MAX_ALIASES {
                return inv(format!("service {}: {} aliases; at most {MAX_ALIASES}", s.name, s.aliases.len()));
            }
            for a in &s.aliases {
                check_dns_name("alias", a)?;
            }
            if s.vip.is_some_and(|vip| !self.contains(vip) || !vips.insert(vip)) {
                return inv(format!(
                    "network {}: service {} VIP {} is outside its subnets or used twice",
                    self.id,
                    s.service_id,
                    s.vip.unwrap_or(Ipv4Addr::UNSPECIFIED),
                ));
            }
            if s.backends.len() > MAX_BACKENDS_PER_SERVICE {
                return inv(format!(
                    "service {}: {} backends; at most {MAX_BACKENDS_PER_SERVICE}",
                    s.service_id,
                    s.backends.len()
                ));
            }
            if let Some(b) = s.backends.iter().find(|b| !self.contains(**b)) {
                return inv(format!("service {}: backend {b} is outside network {}'s subnets", s.service_id, self.id));
            }
            if s.backends6.len() > MAX_BACKENDS_PER_SERVICE {
                return inv(format!(
                    "service {}: {} IPv6 backends; at most {MAX_BACKENDS_PER_SERVICE}",
                    s.service_id,
                    s.backends6.len()
                ));
            }
            if let Some(b) = s.backends6.iter().find(|b| !self.contains6(**b)) {
                return inv(format!(
                    "service {}: IPv6 backend {b} is outside network {}'s IPv6 subnet",
                    s.service_id, self.id
                ));
            }
        }
        Ok(())
    }
}

impl NetworkState {
    /// Checks the IPv6 subnet: beside one IPv4 subnet only (its interfaces are that subnet's), a prefix length
    /// in `MIN_IPV6_PREFIX_LEN..=MAX_IPV6_PREFIX_LEN`, the gateway inside.
    fn validate_ipv6(&self) -> Result<(), Error> {
        let Some(v6) = self.ipv6 else { return Ok(()) };
        let inv = |m: String| Err(Error::Invalid(m));
        if !self.more_subnets.is_empty() {
            return inv(format!(
                "network {}: an IPv6 network takes one IPv4 subnet beside its IPv6 one (it has {})",
                self.id,
                self.more_subnets.len() + 1
            ));
        }
        if !(MIN_IPV6_PREFIX_LEN..=MAX_IPV6_PREFIX_LEN).contains(&v6.subnet.prefix_len) {
            return inv(format!(
                "network {}: IPv6 subnet {} must have a prefix length in {MIN_IPV6_PREFIX_LEN}..={MAX_IPV6_PREFIX_LEN}",
                self.id, v6.subnet
            ));
        }
        if !v6.subnet.contains(v6.gateway) {
            return inv(format!("network {}: IPv6 gateway {} is outside subnet {}", self.id, v6.gateway, v6.subnet));
        }
        Ok(())
    }
}

/// Checks a name tasks resolve: 1..=63 letters, digits, '-' and '_', not starting or ending with '-'.
fn check_dns_name(what: &str, name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= MAX_DNS_LABEL_LEN
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if !ok {
        return Err(Error::Invalid(format!(
            "{what} name {name:?} must be 1..={MAX_DNS_LABEL_LEN} letters, digits, '-' and '_' (one DNS label)"
        )));
    }
    Ok(())
}

/// A task address of a network that lives on another node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Peer {
    /// The remote task's address on the network.
    pub address: Ipv4Addr,
    /// Its MAC (`mac_for(address)` for Shoal nodes).
    pub mac: Mac,
    /// The underlay address of the node it runs on.
    pub node_ip: Ipv4Addr,
    /// The same task's IPv6 address, on a network with IPv6 (same MAC).
    pub address6: Option<Ipv6Addr>,
}

/// A service on one network: its names, virtual IP and the task addresses behind it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceVip {
    /// The service's ID.
    pub service_id: String,
    /// Its name (what tasks resolve).
    pub name: String,
    /// Its other names on this network (`--network name=...,alias=...`).
    pub aliases: Vec<String>,
    /// Its VIP on this network; `None` in DNS round-robin mode (`--endpoint-mode dnsrr`): the name resolves to
    /// the backends themselves.
    pub vip: Option<Ipv4Addr>,
    /// The addresses of its running tasks on this network (any node); empty: connections are refused.
    pub backends: Vec<Ipv4Addr>,
    /// Their IPv6 addresses, on a network with IPv6: what the service's names answer for AAAA (there is no
    /// IPv6 VIP).
    pub backends6: Vec<Ipv6Addr>,
}

/// A local task with network attachments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskState {
    /// The task's ID.
    pub task_id: String,
    /// Its network namespace (a bind mount under /run/netns, or /proc/<pid>/ns/net), made by the executor.
    pub netns: PathBuf,
    /// Its networks, in the task's order: attachment `i` is interface `eth<i>` in the namespace; the first
    /// non-internal one carries the default route.
    pub attachments: Vec<Attachment>,
    /// Whether the namespace is a running container's own, joined by `docker network connect` (`false`: it
    /// was made for the task, a holder's or the plane's own). In a joined namespace the container's
    /// interfaces and routes stay as its engine made them: an attachment's interface is the one with its
    /// MAC (`mac_for`), or a new one named with the lowest free `eth<N>`, as Docker names a connected
    /// network's; no interface of the container is removed; the default route is left alone (Docker keeps
    /// a connected container's gateway where it was); the resolver does without 127.0.0.11:53 when
    /// something of the container's holds it.
    pub joined: bool,
}

/// One network attachment of a task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attachment {
    /// The network's ID (one of `NodeNetState::networks`).
    pub network_id: String,
    /// The task's address on it (the prefix length is the network's).
    pub address: Ipv4Addr,
    /// Its IPv6 address, on a network with IPv6 (the prefix length is the IPv6 subnet's).
    pub address6: Option<Ipv6Addr>,
    /// The name of its interface in the task's namespace, when the attachment asks for one (Docker's endpoint
    /// driver option `com.docker.network.endpoint.ifname`); `None`: `eth<i>` for attachment `i`. Ignored in a
    /// joined namespace, where the container's engine named its interfaces.
    pub ifname: Option<String>,
}

impl TaskState {
    /// The interface name of attachment `i` in a namespace made for the task (not joined): its asked name, or
    /// `eth<i>`.
    pub fn ifname(&self, i: usize) -> String {
        attachment_ifname(&self.attachments, i)
    }
}

fn attachment_ifname(attachments: &[Attachment], i: usize) -> String {
    attachments.get(i).and_then(|a| a.ifname.clone()).unwrap_or_else(|| crate::names::task_ifname(i))
}

/// Checks the interface names of a task's attachments, in the task's order: each asked name is valid
/// (`check_ifname`), and no two attachments get the same name (an asked name against another's `eth<i>`
/// too). The agent asks it for every task it is given, so a task that fails it is rejected with this reason.
pub fn check_ifnames(attachments: &[Attachment]) -> Result<(), Error> {
    let mut names = BTreeSet::new();
    for (i, a) in attachments.iter().enumerate() {
        if let Some(name) = &a.ifname {
            check_ifname(name)?;
        }
        let name = attachment_ifname(attachments, i);
        if !names.insert(name.clone()) {
            return Err(Error::Invalid(format!(
                "two network attachments would both be interface {name}: give each a distinct \
                 com.docker.network.endpoint.ifname (unnamed attachments are eth<i>, i their place in the list)"
            )));
        }
    }
    Ok(())
}

/// Checks an interface name a task asks for: 1..=15 bytes (the kernel's limit) of letters, digits, '-', '_' and
/// '.', not `lo`, `.` or `..`.
pub(crate) fn check_ifname(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= MAX_IFNAME_LEN
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && !matches!(name, "lo" | "." | "..");
    if !ok {
        return Err(Error::Invalid(format!(
            "interface name {name:?} must be 1..={MAX_IFNAME_LEN} letters, digits, '-', '_' and '.', and not lo"
        )));
    }
    Ok(())
}
