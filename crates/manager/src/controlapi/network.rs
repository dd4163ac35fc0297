//! Networks in the control API (SwarmKit's controlapi/network.go rules, our code): swarm-scope overlay
//! networks created, read, listed and removed; the predefined `ingress` network made with the cluster; and
//! what a service spec may say about networks and ports (`resolve_service_networks`, `check_endpoint`).
//!
//! A network's subnets (the user's, at most `MAX_OVERLAY_SUBNETS`, else the first free `SubnetSize` block of the
//! cluster's address pools), each one's gateway (the subnet's first address unless given) and VXLAN ID are chosen
//! here, in the write that creates it; the store refuses an overlapping subnet or a VXLAN ID in use when the write
//! is applied, so two creates from one view cannot both get one. A subnet may not overlap the loopback, link-local,
//! "this network" or multicast ranges, nor hold a node's own address (the error names the node); a subnet chosen
//! from the pools skips the nodes' addresses. Removal is refused while a service uses the network (naming it) or a
//! task still holds an address in it.
//!
//! Must not depend on HTTP, JSON, processes or Docker.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use shoal_api::{
    endpoint_spec, ipam_config, port_config, Annotations, Driver, IpamConfig, IpamOptions, Meta, Network,
    NetworkAttachmentConfig, NetworkSpec, ServiceSpec, ENDPOINT_IFNAME_OPTION,
};
use shoal_store::cidr::Cidr;
use shoal_store::{Changes, StoreObject, Tables};

use super::{labels_match, resolve, ControlError};
use crate::allocator::ipam::{
    choose_subnet, DEFAULT_ADDRESS_POOL, DEFAULT_SUBNET_SIZE, IPV6_RANGE_ADDRESSES, MAX_RANGE_ADDRESSES,
};
use crate::limits::MAX_IPAM_OPTION_BYTES;
use crate::state::ClusterState;

/// The name of the predefined routing-mesh network.
pub const INGRESS_NAME: &str = "ingress";
/// Its subnet, as Docker's.
pub const INGRESS_SUBNET: &str = "10.0.0.0/24";
/// The only driver of swarm-scope networks Shoal makes.
pub const OVERLAY_DRIVER: &str = "overlay";
/// The driver option carrying a network's VXLAN ID (libnetwork's overlay driver's key).
pub use shoal_store::VXLAN_ID_OPTION;
/// The first VXLAN ID given (libnetwork's overlay driver starts at 4096 + 1).
pub const FIRST_VXLAN_ID: u32 = 4097;
/// Most networks in a cluster.
pub const MAX_NETWORKS: usize = 1000;
/// Most networks one service attaches to.
pub const MAX_SERVICE_NETWORKS: usize = 32;
/// Most aliases per attachment, and the longest alias.
pub const MAX_ALIASES: usize = 32;
/// See `MAX_ALIASES`.
pub const MAX_ALIAS_BYTES: usize = 253;
/// Most ports one service publishes.
pub const MAX_PORTS: usize = 128;
/// Longest network name.
pub const MAX_NETWORK_NAME_BYTES: usize = 64;

fn invalid(msg: impl Into<String>) -> ControlError {
    ControlError::InvalidArgument(msg.into())
}

/// The ingress network a new cluster starts with, on the default pool's first block (as Docker's).
pub fn ingress_network(id: String, now: shoal_api::prost_types::Timestamp) -> Network {
    let subnet: Cidr = INGRESS_SUBNET.parse().expect("constant");
    ingress_network_on(id, now, subnet)
}

/// The ingress network of a new cluster whose networks come from `pools` (`AddressPools::check`): the
/// first `subnet_size` block that holds none of `avoid` (the first manager's own addresses). None when the
/// pools have no such block.
pub fn ingress_network_from(
    id: String,
    now: shoal_api::prost_types::Timestamp,
    pools: &AddressPools,
    avoid: &[std::net::IpAddr],
) -> Option<Network> {
    let taken: Vec<Cidr> = avoid.iter().filter_map(|ip| Cidr::new(*ip, if ip.is_ipv4() { 32 } else { 128 })).collect();
    let subnet = choose_subnet(&pools.pools, pools.subnet_size, &taken)?;
    Some(ingress_network_on(id, now, subnet))
}

fn ingress_network_on(id: String, now: shoal_api::prost_types::Timestamp, subnet: Cidr) -> Network {
    let spec = NetworkSpec {
        annotations: Some(Annotations { name: INGRESS_NAME.into(), ..Default::default() }),
        driver_config: Some(Driver { name: OVERLAY_DRIVER.into(), ..Default::default() }),
        ingress: true,
        ..Default::default()
    };
    built(id, now, spec, &[(subnet, None, None)], &[FIRST_VXLAN_ID])
}

/// The UDP port of VXLAN traffic unless the swarm was made with another (`--data-path-port`).
pub const DEFAULT_DATA_PATH_PORT: u16 = 4789;
/// The data path ports a swarm may be given (Docker's range: above the well-known ports, below the dynamic).
pub const DATA_PATH_PORTS: std::ops::RangeInclusive<u16> = 1024..=49151;

/// What a new swarm's networks are made with (`docker swarm init --default-addr-pool`,
/// `--default-addr-pool-mask-length`, `--data-path-port`), checked; fixed for the swarm's life, as Docker's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SwarmNetworking {
    /// Where networks without a subnet get theirs, the ingress network's included.
    pub pools: AddressPools,
    /// The UDP port VXLAN traffic between nodes uses.
    pub data_path_port: u16,
}

impl Default for SwarmNetworking {
    fn default() -> Self {
        SwarmNetworking {
            pools: AddressPools::check(&[], 0).expect("the defaults are valid"),
            data_path_port: DEFAULT_DATA_PATH_PORT,
        }
    }
}

impl SwarmNetworking {
    /// Checks an init request's network fields (`AddressPools::check`; a port of 0 is the default).
    pub fn check(pools: &[String], subnet_size: u32, data_path_port: u32) -> Result<SwarmNetworking, ControlError> {
        let pools = AddressPools::check(pools, subnet_size)?;
        let data_path_port = match data_path_port {
            0 => DEFAULT_DATA_PATH_PORT,
            p => u16::try_from(p).ok().filter(|p| DATA_PATH_PORTS.contains(p)).ok_or_else(|| {
                invalid(format!(
                    "data path port {p} is out of range: give a port from {} to {} (--data-path-port)",
                    DATA_PATH_PORTS.start(),
                    DATA_PATH_PORTS.end()
                ))
            })?,
        };
        Ok(SwarmNetworking { pools, data_path_port })
    }

    /// Writes these settings into a new cluster object (the defaults stay unwritten, as Docker leaves them).
    pub fn apply_to(&self, cluster: &mut shoal_api::Cluster) {
        if !self.pools.is_default() {
            cluster.default_address_pool = self.pools.pools.iter().map(|p| p.to_string()).collect();
            cluster.subnet_size = u32::from(self.pools.subnet_size);
        }
        cluster.vxlan_udp_port = self.vxlan_udp_port();
    }

    /// The cluster object's `vxlan_udp_port` for these settings (0 for the default port, as Docker leaves it).
    pub fn vxlan_udp_port(&self) -> u32 {
        if self.data_path_port == DEFAULT_DATA_PATH_PORT {
            0
        } else {
            u32::from(self.data_path_port)
        }
    }
}

/// The data path port of the cluster `c` (its own, else the default).
pub fn data_path_port(c: &shoal_api::Cluster) -> u16 {
    u16::try_from(c.vxlan_udp_port).ok().filter(|p| DATA_PATH_PORTS.contains(p)).unwrap_or(DEFAULT_DATA_PATH_PORT)
}

/// Most address pools a swarm is given at init.
pub const MAX_ADDRESS_POOLS: usize = 64;
/// The longest prefix a pool's networks may get: a /29 holds 8 addresses, the fewest a network with its
/// gateway, broadcast and a few tasks works with (Docker's bound too).
pub const MAX_POOL_SUBNET_SIZE: u8 = 29;

/// The address pools a new swarm's networks take their subnets from (`docker swarm init --default-addr-pool`
/// and `--default-addr-pool-mask-length`), checked by `AddressPools::check`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddressPools {
    /// The pools, in the order given (the first block of the first pool goes first).
    pub pools: Vec<Cidr>,
    /// The prefix length of each network's subnet.
    pub subnet_size: u8,
}

impl AddressPools {
    /// Checks an init request's pools and mask length: IPv4 CIDRs with their host bits zero, at most
    /// `MAX_ADDRESS_POOLS`, none overlapping another or a reserved range (loopback, link-local, "this
    /// network", multicast), and a mask length (0: 24) from the longest pool prefix up to
    /// `MAX_POOL_SUBNET_SIZE`. No pools: the default pool, 10.0.0.0/8, with that mask length.
    pub fn check(pools: &[String], subnet_size: u32) -> Result<AddressPools, ControlError> {
        if pools.len() > MAX_ADDRESS_POOLS {
            return Err(invalid(format!("{} address pools: at most {MAX_ADDRESS_POOLS} may be given", pools.len())));
        }
        let mut parsed: Vec<Cidr> = Vec::new();
        for p in pools {
            let c: Cidr = p.trim().parse().map_err(|e| {
                invalid(format!("invalid address pool {p:?}: {e}; give an IPv4 CIDR such as 10.20.0.0/16"))
            })?;
            if c.is_v6() {
                return Err(invalid(format!(
                    "address pool {c}: IPv6 pools are not supported (Shoal's overlay networks are IPv4); give an IPv4 \
                     CIDR"
                )));
            }
            for (range, what) in RESERVED_RANGES {
                let r: Cidr = range.parse().expect("constant");
                if r.overlaps(&c) {
                    return Err(invalid(format!(
                        "address pool {c} overlaps the {what} range {r}, which no overlay network may use; give \
                         another pool"
                    )));
                }
            }
            if let Some(other) = parsed.iter().find(|o| o.overlaps(&c)) {
                return Err(invalid(format!("address pools {other} and {c} overlap; give pools that do not")));
            }
            parsed.push(c);
        }
        if parsed.is_empty() {
            parsed.push(DEFAULT_ADDRESS_POOL.parse().expect("constant"));
        }
        let size = match subnet_size {
            0 => DEFAULT_SUBNET_SIZE,
            s => match u8::try_from(s) {
                Ok(size) if size <= MAX_POOL_SUBNET_SIZE => size,
                _ => {
                    return Err(invalid(format!(
                        "subnet size {s} is out of range: a network's mask length may be at most \
                         {MAX_POOL_SUBNET_SIZE} (--default-addr-pool-mask-length)"
                    )))
                }
            },
        };
        if let Some(p) = parsed.iter().find(|p| p.prefix_len() > size) {
            return Err(invalid(format!(
                "subnet size {size} is too small for the address pool {p}: a network's mask length must be at least \
                 the pool's ({}) (--default-addr-pool-mask-length)",
                p.prefix_len()
            )));
        }
        Ok(AddressPools { pools: parsed, subnet_size: size })
    }

    /// Whether these are the defaults (10.0.0.0/8 in /24 blocks).
    pub fn is_default(&self) -> bool {
        self.subnet_size == DEFAULT_SUBNET_SIZE
            && self.pools.len() == 1
            && self.pools[0] == DEFAULT_ADDRESS_POOL.parse::<Cidr>().expect("constant")
    }
}

/// The network object of an overlay: one IPAM config per subnet, in order (each with its range, gateway,
/// the subnet's first host unless given, and the user's auxiliary addresses of that config), and one VXLAN
/// ID per subnet in the same order (`vnis`), written as libnetwork's `vxlanid_list`: comma-separated.
fn built(
    id: String,
    now: shoal_api::prost_types::Timestamp,
    spec: NetworkSpec,
    subnets: &[UserIpam],
    vnis: &[u32],
) -> Network {
    debug_assert_eq!(subnets.iter().filter(|s| !s.0.is_v6()).count(), vnis.len(), "one VXLAN ID per IPv4 subnet");
    let configs = subnets
        .iter()
        .map(|(subnet, range, gateway)| {
            let gateway = gateway.or_else(|| subnet.nth(1)).map(|g| g.to_string()).unwrap_or_default();
            // The user's auxiliary addresses (checked by `user_ipam`), which the allocator never hands out: the
            // config of this subnet's (a CLI sends the configs in no fixed order).
            let reserved = spec
                .ipam
                .as_ref()
                .and_then(|s| s.configs.iter().find(|c| c.subnet.parse::<Cidr>().ok() == Some(*subnet)))
                .map(|c| c.reserved.clone())
                .unwrap_or_default();
            let mut config = IpamConfig {
                subnet: subnet.to_string(),
                range: range.map(|r| r.to_string()).unwrap_or_default(),
                gateway,
                reserved,
                ..Default::default()
            };
            config.set_family(if subnet.is_v6() {
                ipam_config::AddressFamily::Ipv6
            } else {
                ipam_config::AddressFamily::Ipv4
            });
            config
        })
        .collect();
    let ipam_options =
        spec.ipam.as_ref().and_then(|i| i.driver.as_ref()).map(|d| d.options.clone()).unwrap_or_default();
    let list = vnis.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(",");
    let mut driver_options = HashMap::from([(VXLAN_ID_OPTION.to_string(), list)]);
    // The driver's state repeats `encrypted`, so `docker network inspect` shows it among the options.
    if let Some(v) = spec.driver_config.as_ref().and_then(|d| d.options.get(shoal_api::ENCRYPTED_OPTION)) {
        driver_options.insert(shoal_api::ENCRYPTED_OPTION.to_string(), v.clone());
    }
    Network {
        id,
        meta: Some(Meta { version: None, created_at: Some(now), updated_at: Some(now) }),
        spec: Some(spec),
        driver_state: Some(Driver { name: OVERLAY_DRIVER.into(), options: driver_options }),
        ipam: Some(IpamOptions { driver: Some(Driver { name: "default".into(), options: ipam_options }), configs }),
        pending_delete: false,
    }
}

/// The VXLAN IDs of a network, one per subnet in order (none when it has no driver state of the overlay's).
pub fn vxlan_ids(n: &Network) -> Vec<u32> {
    n.driver_state
        .as_ref()
        .and_then(|d| d.options.get(VXLAN_ID_OPTION))
        .map_or_else(Vec::new, |l| shoal_store::parse_vxlan_ids(l))
}

fn validate_network_name(name: &str) -> Result<(), ControlError> {
    let ok_chars = name.chars().enumerate().all(|(i, c)| c.is_ascii_alphanumeric() || (i > 0 && "_.-".contains(c)));
    if name.is_empty() || name.len() > MAX_NETWORK_NAME_BYTES || !ok_chars {
        return Err(invalid(format!(
            "invalid network name {name:?}: use 1 to {MAX_NETWORK_NAME_BYTES} letters, digits, '_', '.' or '-', \
             starting with a letter or digit"
        )));
    }
    Ok(())
}

/// Ranges no overlay subnet may overlap, with what they are: addresses there never reach another node
/// (loopback stays on the host, link-local and "this network" are not routed, multicast is no unicast
/// address), and a node's own loopback or link-local traffic would go into the overlay.
const RESERVED_RANGES: [(&str, &str); 4] = [
    ("0.0.0.0/8", "\"this network\""),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local"),
    ("224.0.0.0/4", "multicast"),
];

/// The nodes' own addresses as the store knows them (the address each node's session came from, and each
/// manager's advertised address), with the node's ID and name, sorted by address.
fn node_addresses(t: &Tables) -> Vec<(std::net::IpAddr, String, String)> {
    let parse =
        |a: &str| a.parse::<std::net::IpAddr>().ok().or_else(|| a.parse::<std::net::SocketAddr>().ok().map(|s| s.ip()));
    let mut out: Vec<_> = t
        .nodes()
        .iter()
        .flat_map(|n| {
            let status = n.status.as_ref().and_then(|s| parse(&s.addr));
            let manager = n.manager_status.as_ref().and_then(|m| parse(&m.addr));
            let name = super::node::node_name(n).to_string();
            [status, manager].into_iter().flatten().map(move |ip| (ip, n.id.clone(), name.clone()))
        })
        .filter(|(ip, _, _)| !ip.is_unspecified())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Refuses a user's subnet that holds a node's own address: that node's traffic to the address (its
/// underlay) would go into the overlay's bridge, and the node would be cut off.
fn check_node_overlap(t: &Tables, subnet: &Cidr) -> Result<(), ControlError> {
    if let Some((ip, id, name)) = node_addresses(t).into_iter().find(|(ip, _, _)| subnet.offset_of(*ip).is_some()) {
        return Err(invalid(format!(
            "subnet {subnet} holds the address {ip} of node {name} ({id}): the node's own traffic to that network \
             would go into the overlay and cut the node off; choose a subnet outside the nodes' networks"
        )));
    }
    Ok(())
}

/// The first IPv6 config the user gave (`--subnet <IPv6 prefix>`), if any.
fn ipv6_config(spec: &NetworkSpec) -> Option<&IpamConfig> {
    spec.ipam.as_ref()?.configs.iter().find(|c| is_ipv6_config(c))
}

/// Whether an IPAM config is an IPv6 one: its subnet is an IPv6 prefix (a bad one is refused when parsed).
fn is_ipv6_config(c: &IpamConfig) -> bool {
    c.subnet.contains(':')
}

/// A user's subnet, with the IP range and gateway given inside it.
type UserIpam = (Cidr, Option<Cidr>, Option<std::net::IpAddr>);

/// Most IPv4 subnets an overlay network is given: `MAX_OVERLAY_SUBNETS`, each with a VXLAN ID and an address
/// pool of its own, which the nodes' data plane carries as a bridge, VXLAN device and gateway end per subnet
/// (docs/design/overlay-subnets.md, part 1).
pub(crate) const OVERLAY_SUBNETS_CARRIED: usize = crate::limits::MAX_OVERLAY_SUBNETS;

/// The user's IPAM settings, checked: at most `max_configs` IPv4 subnets (none of them overlapping another),
/// each with its range, gateway and auxiliary addresses inside it. Empty: the network's subnet is chosen
/// from the cluster's pools.
fn user_ipam(spec: &NetworkSpec, max_configs: usize) -> Result<Vec<UserIpam>, ControlError> {
    let Some(ipam) = &spec.ipam else { return Ok(Vec::new()) };
    if let Some(d) = &ipam.driver {
        if !(d.name.is_empty() || d.name == "default") {
            return Err(invalid(format!("IPAM driver {:?} is not supported: Shoal's IPAM is the default one", d.name)));
        }
        // Kept with the network and shown back, as Docker keeps them: its default IPAM reads none of them
        // (swarm's one, `com.docker.network.ipam.serial`, is how Shoal always allocates). Bounded as labels are.
        let bytes = super::secret::map_bytes(&d.options);
        if bytes > MAX_IPAM_OPTION_BYTES {
            return Err(invalid(format!(
                "IPAM options are {bytes} bytes, over the limit of {MAX_IPAM_OPTION_BYTES} bytes; give fewer or \
                 shorter ones"
            )));
        }
    }
    // IPv6 configs (`--ipv6 --subnet <IPv6 prefix>`) apart: the rules below are the IPv4 subnets'.
    let (v6, v4): (Vec<&IpamConfig>, Vec<&IpamConfig>) = ipam.configs.iter().partition(|c| is_ipv6_config(c));
    let n = v4.len();
    if n > max_configs && max_configs == 1 {
        return Err(invalid(format!("{n} IPAM configs given: this network takes one subnet; give one --subnet")));
    }
    if n > max_configs {
        return Err(invalid(format!("{n} IPAM configs given: a network has at most {max_configs} subnets")));
    }
    if n > 1 && spec.ingress {
        return Err(invalid(format!(
            "{n} IPAM configs given on the ingress network: the routing mesh's network has one subnet (each node's \
             ingress address is in it); give one --subnet"
        )));
    }
    if n > 1 && v4.iter().any(|c| c.subnet.is_empty()) {
        return Err(invalid("several IPAM configs given: give each its --subnet"));
    }
    if !v6.is_empty() && !spec.ipv6_enabled {
        return Err(invalid(format!(
            "subnet {} is IPv6: add --ipv6 (EnableIPv6) to give the network an IPv6 subnet",
            v6[0].subnet
        )));
    }
    if v6.len() > 1 {
        return Err(invalid(format!("{} IPv6 subnets given: an IPv6 network has one; give one", v6.len())));
    }
    if !v6.is_empty() && n > 1 {
        return Err(invalid(format!(
            "{n} IPv4 subnets given beside an IPv6 one: an IPv6 network takes one IPv4 subnet (its tasks' interfaces \
             carry both addresses); give one IPv4 --subnet"
        )));
    }
    let mut out: Vec<UserIpam> = Vec::with_capacity(n + v6.len());
    for c in v4 {
        let Some(u) = user_ipam_config(c)? else {
            // No IPv4 subnet given: the pools' choice, with the IPv6 one (if any) beside it.
            return v6.into_iter().map(user_ipam6_config).collect();
        };
        if let Some((other, _, _)) = out.iter().find(|(o, _, _)| o.overlaps(&u.0)) {
            return Err(invalid(format!(
                "subnets {other} and {} of this network overlap; give subnets that do not",
                u.0
            )));
        }
        out.push(u);
    }
    for c in v6 {
        out.push(user_ipam6_config(c)?);
    }
    Ok(out)
}

/// Ranges no IPv6 subnet may overlap, with what they are (as `RESERVED_RANGES` for IPv4).
const RESERVED_RANGES_V6: [(&str, &str); 3] =
    [("::/8", "loopback, unspecified and IPv4-mapped"), ("fe80::/10", "link-local"), ("ff00::/8", "multicast")];

/// The IPv6 config of an `--ipv6` network, checked: a prefix length in
/// `MIN_IPV6_PREFIX_LEN..=MAX_IPV6_PREFIX_LEN`, outside the reserved ranges, its range and gateway inside it
/// (the gateway not the subnet-router anycast address), its auxiliary addresses as IPv4's.
fn user_ipam6_config(c: &IpamConfig) -> Result<UserIpam, ControlError> {
    use crate::limits::{MAX_IPV6_PREFIX_LEN, MIN_IPV6_PREFIX_LEN};
    let subnet: Cidr = c.subnet.parse().map_err(|e: shoal_store::cidr::CidrError| invalid(e.to_string()))?;
    let len = subnet.prefix_len();
    if !(MIN_IPV6_PREFIX_LEN..=MAX_IPV6_PREFIX_LEN).contains(&len) {
        let why = if len < MIN_IPV6_PREFIX_LEN {
            format!(
                "a prefix shorter than /{MIN_IPV6_PREFIX_LEN} is more than one network is worth (tasks take addresses \
                 from the first {IPV6_RANGE_ADDRESSES} of it)"
            )
        } else {
            let fewest = 1u32 << (128 - MAX_IPV6_PREFIX_LEN);
            format!("a prefix longer than /{MAX_IPV6_PREFIX_LEN} leaves fewer than {fewest} addresses to allocate")
        };
        return Err(invalid(format!(
            "IPv6 subnet {subnet}: give a prefix length from /{MIN_IPV6_PREFIX_LEN} to /{MAX_IPV6_PREFIX_LEN} (a /64 \
             is usual): {why}"
        )));
    }
    for (range, what) in RESERVED_RANGES_V6 {
        let r: Cidr = range.parse().expect("constant");
        if r.overlaps(&subnet) {
            return Err(invalid(format!(
                "IPv6 subnet {subnet} overlaps the {what} range {r}; choose a unique local prefix such as fd00:1::/64"
            )));
        }
    }
    let range = ip_range_in(c, &subnet)?;
    let gateway = if c.gateway.is_empty() {
        None
    } else {
        let g: std::net::IpAddr =
            c.gateway.parse().map_err(|_| invalid(format!("gateway {:?} is not an IP address", c.gateway)))?;
        if subnet.offset_of(g).is_none_or(|o| o == 0) {
            return Err(invalid(format!("gateway {g} is not a host address of subnet {subnet}")));
        }
        Some(g)
    };
    check_aux_addresses(&c.reserved, &subnet, gateway.or_else(|| subnet.nth(1)))?;
    Ok((subnet, range, gateway))
}

/// One IPAM config of the user's, checked (`user_ipam`); None when it gives no subnet.
fn user_ipam_config(c: &IpamConfig) -> Result<Option<UserIpam>, ControlError> {
    if c.subnet.is_empty() {
        if !c.reserved.is_empty() {
            return Err(invalid("auxiliary addresses need a subnet to lie in: give --subnet too"));
        }
        if !c.range.is_empty() || !c.gateway.is_empty() {
            return Err(invalid("an IP range or gateway needs a subnet: give --subnet too"));
        }
        return Ok(None);
    }
    let subnet: Cidr = c.subnet.parse().map_err(|e: shoal_store::cidr::CidrError| invalid(e.to_string()))?;
    if subnet.is_v6() {
        // `user_ipam` sends IPv6 configs to `user_ipam6_config`; this would be a config it did not recognise.
        return Err(invalid(format!("subnet {subnet} is IPv6 where an IPv4 subnet is wanted; give an IPv4 subnet")));
    }
    for (range, what) in RESERVED_RANGES {
        let r: Cidr = range.parse().expect("constant");
        if r.overlaps(&subnet) {
            return Err(invalid(format!(
                "subnet {subnet} overlaps the {what} range {r}, whose addresses do not reach other nodes; choose \
                 another subnet (a private range such as 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16)"
            )));
        }
    }
    if subnet.prefix_len() > 30 {
        return Err(invalid(format!(
            "subnet {subnet} is too small: give a prefix of /30 or shorter (4 addresses or more)"
        )));
    }
    let range = ip_range_in(c, &subnet)?;
    if range.unwrap_or(subnet).size() > MAX_RANGE_ADDRESSES {
        return Err(invalid(format!(
            "subnet {subnet} has more than {MAX_RANGE_ADDRESSES} addresses to allocate: give a /12 or smaller, or an \
             --ip-range of that size"
        )));
    }
    let gateway = if c.gateway.is_empty() {
        None
    } else {
        let g: std::net::IpAddr =
            c.gateway.parse().map_err(|_| invalid(format!("gateway {:?} is not an IP address", c.gateway)))?;
        if subnet.offset_of(g).is_none_or(|o| o == 0 || o == subnet.size() - 1) {
            return Err(invalid(format!("gateway {g} is not a host address of subnet {subnet}")));
        }
        Some(g)
    };
    check_aux_addresses(&c.reserved, &subnet, gateway.or_else(|| subnet.nth(1)))?;
    Ok(Some((subnet, range, gateway)))
}

/// A config's IP range (`--ip-range`), checked to lie inside `subnet`; `None` when it gives none.
fn ip_range_in(c: &IpamConfig, subnet: &Cidr) -> Result<Option<Cidr>, ControlError> {
    if c.range.is_empty() {
        return Ok(None);
    }
    let r: Cidr = c.range.parse().map_err(|e: shoal_store::cidr::CidrError| invalid(format!("IP range: {e}")))?;
    if !subnet.contains(&r) {
        return Err(invalid(format!("IP range {r} is not inside subnet {subnet}")));
    }
    Ok(Some(r))
}

/// Most auxiliary addresses (`--aux-address name=ip`) one network may reserve.
pub const MAX_AUX_ADDRESSES: usize = 256;
/// Longest name of an auxiliary address.
pub const MAX_AUX_NAME_BYTES: usize = 64;

/// The user's auxiliary addresses, checked: each a host address of `subnet` (not its gateway), named, and
/// at most `MAX_AUX_ADDRESSES` of them.
fn check_aux_addresses(
    reserved: &HashMap<String, String>,
    subnet: &Cidr,
    gateway: Option<std::net::IpAddr>,
) -> Result<(), ControlError> {
    if reserved.len() > MAX_AUX_ADDRESSES {
        return Err(invalid(format!(
            "{} auxiliary addresses given: at most {MAX_AUX_ADDRESSES} per network",
            reserved.len()
        )));
    }
    let mut names: Vec<&String> = reserved.keys().collect();
    names.sort();
    let mut seen = BTreeSet::new();
    for name in names {
        let value = &reserved[name];
        if name.is_empty() || name.len() > MAX_AUX_NAME_BYTES {
            return Err(invalid(format!(
                "auxiliary address {value:?}: give it a name of 1 to {MAX_AUX_NAME_BYTES} bytes (--aux-address name=ip)"
            )));
        }
        let ip: std::net::IpAddr =
            value.parse().map_err(|_| invalid(format!("auxiliary address {name}={value:?} is not an IP address")))?;
        // An IPv4 subnet's last address is its broadcast address; IPv6 has none.
        let last = subnet.size() - 1;
        if subnet.offset_of(ip).is_none_or(|o| o == 0 || (o == last && !subnet.is_v6())) {
            return Err(invalid(format!(
                "auxiliary address {name}={ip} is not a host address of subnet {subnet} (no matching subnet for \
                 aux-address)"
            )));
        }
        if Some(ip) == gateway {
            return Err(invalid(format!("auxiliary address {name}={ip} is the network's gateway; choose another")));
        }
        if !seen.insert(ip) {
            return Err(invalid(format!("auxiliary address {ip} is given twice ({name} is the second name)")));
        }
    }
    Ok(())
}

/// Checks a network spec as a user sends it (`docker network create`): what Shoal cannot honour is refused.
pub fn validate_network_spec(spec: &NetworkSpec) -> Result<(), ControlError> {
    let name = spec.annotations.as_ref().map_or("", |a| a.name.as_str());
    validate_network_name(name)?;
    if shoal_api::PREDEFINED_NETWORKS.contains(&name) || name == "none" {
        return Err(ControlError::Conflict(format!(
            "network with name {name} already exists: {name} is a predefined network (every node's own); choose \
             another name"
        )));
    }
    if spec.annotations.as_ref().is_some_and(|a| a.labels.contains_key(shoal_api::PREDEFINED_NETWORK_LABEL)) {
        return Err(invalid(format!(
            "label {} is for the predefined networks the managers make; leave it out",
            shoal_api::PREDEFINED_NETWORK_LABEL
        )));
    }
    if let Some(driver) = spec.driver_config.as_ref().map(|d| d.name.as_str()) {
        if shoal_api::NODE_LOCAL_DRIVERS.contains(&driver) {
            return validate_node_local_spec(driver, spec);
        }
    }
    if spec.config_from.is_some() {
        return Err(invalid(
            "--config-from is for the drivers whose networks live on each node's engine (macvlan, ipvlan); an \
             overlay network takes its settings directly",
        ));
    }
    if let Some(d) = &spec.driver_config {
        if !(d.name.is_empty() || d.name == OVERLAY_DRIVER) {
            return Err(invalid(format!(
                "network driver {:?} is not supported: swarm networks use the overlay driver (-d overlay), or \
                 macvlan or ipvlan for a network of each node's engine",
                d.name
            )));
        }
        // `encrypted` is kept (its value is not read, as libnetwork's): every node's agent refuses a task on
        // such a network with the data plane's reason (`shoal_netplane::check_encryption`), since no node
        // encrypts yet. Any other option would be dropped: refused.
        let mut others: Vec<&String> = d.options.keys().filter(|k| k.as_str() != shoal_api::ENCRYPTED_OPTION).collect();
        others.sort();
        if let Some(k) = others.first() {
            return Err(invalid(format!(
                "network driver option {k:?} is not supported yet; leave it out (Shoal knows only \"{}\")",
                shoal_api::ENCRYPTED_OPTION
            )));
        }
    }
    // Before `user_ipam`, whose "add --ipv6" would send the user round in a circle here.
    if spec.ingress && (spec.ipv6_enabled || ipv6_config(spec).is_some()) {
        return Err(invalid(
            "--ipv6 and IPv6 subnets are not supported on the ingress network: the routing mesh is IPv4; give an \
             IPv4 --subnet",
        ));
    }
    let subnets = user_ipam(spec, OVERLAY_SUBNETS_CARRIED)?;
    if spec.ipv6_enabled && !subnets.iter().any(|(s, _, _)| s.is_v6()) {
        return Err(invalid(
            "--ipv6 needs an IPv6 subnet: give --subnet an IPv6 prefix such as fd00:1::/64 (Shoal chooses IPv4 \
             subnets only)",
        ));
    }
    Ok(())
}

/// Checks a swarm network of each node's engine (`driver`: one of `NODE_LOCAL_DRIVERS`): its settings are
/// either taken from a config-only network of the same name on each node (`--config-from`, nothing else
/// given) or given here (driver options such as `parent`, one IPv4 subnet), and each node's engine makes it
/// when a task needs it, addressing the tasks itself. What such a network cannot do in Shoal is refused.
fn validate_node_local_spec(driver: &str, spec: &NetworkSpec) -> Result<(), ControlError> {
    let article = if driver.starts_with(['a', 'e', 'i', 'o', 'u']) { "an" } else { "a" };
    let refuse =
        |what: &str, why: &str| Err(invalid(format!("{what} is not supported on {article} {driver} network: {why}")));
    if spec.ingress {
        return refuse("--ingress", "the routing mesh is an overlay network");
    }
    if spec.attachable {
        return refuse("--attachable", "Shoal attaches the engine's containers to overlay networks only");
    }
    let options = spec.driver_config.as_ref().map(|d| &d.options);
    if options.is_some_and(|o| o.contains_key(shoal_api::ENCRYPTED_OPTION)) {
        return refuse("--opt encrypted", "only overlay networks are encrypted");
    }
    if let Some(shoal_api::network_spec::ConfigFrom::Network(from)) = &spec.config_from {
        validate_network_name(from)?;
        let configured = options.is_some_and(|o| !o.is_empty())
            || spec.ipv6_enabled
            || spec
                .ipam
                .as_ref()
                .is_some_and(|i| !i.configs.is_empty() || i.driver.as_ref().is_some_and(|d| !d.options.is_empty()));
        if configured {
            return Err(invalid(format!(
                "network {from:?} given with --config-from holds the settings: leave out --opt, --subnet, --ip-range, \
                 --gateway, --aux-address, --ipam-opt and --ipv6"
            )));
        }
    }
    // `--ipv6` with its IPv6 subnet beside the IPv4 one: the engine's network gets both, and the engine
    // addresses each task in both.
    let subnets = user_ipam(spec, 1)?;
    if spec.ipv6_enabled && !subnets.iter().any(|(s, _, _)| s.is_v6()) {
        return refuse(
            "--ipv6 without an IPv6 subnet",
            "give --subnet an IPv6 prefix too (the engine's IPAM needs one)",
        );
    }
    Ok(())
}

fn pools_of(t: &Tables) -> (Vec<Cidr>, u8) {
    let cluster = t.clusters().iter().next();
    let pools: Vec<Cidr> = cluster
        .map(|c| c.default_address_pool.iter().filter_map(|p| p.parse().ok()).collect())
        .filter(|p: &Vec<Cidr>| !p.is_empty())
        .unwrap_or_else(|| vec![DEFAULT_ADDRESS_POOL.parse().expect("constant")]);
    let size = cluster
        .and_then(|c| u8::try_from(c.subnet_size).ok())
        .filter(|s| (1..=30).contains(s))
        .unwrap_or(DEFAULT_SUBNET_SIZE);
    (pools, size)
}

/// Creates a swarm-scope network: an overlay, or one of each node's engine (`NODE_LOCAL_DRIVERS`).
pub async fn create_network(state: &ClusterState, spec: NetworkSpec) -> Result<Network, ControlError> {
    validate_network_spec(&spec)?;
    let now = state.now();
    let id = state.ids.new_id();
    if let Some(driver) = spec.driver_config.as_ref().map(|d| d.name.clone()) {
        if shoal_api::NODE_LOCAL_DRIVERS.contains(&driver.as_str()) {
            return create_node_local(state, id, now, spec, driver).await;
        }
    }
    let mut spec = spec;
    spec.driver_config.get_or_insert_with(Default::default).name = OVERLAY_DRIVER.into();
    let (network, _) = state
        .write(|t: &Tables, c: &mut Changes| create_overlay(t, c, id.clone(), now, &spec, OVERLAY_SUBNETS_CARRIED))
        .await?;
    Ok(state.store.view(|t| t.networks().get(&network.id).map(|n| (**n).clone())).unwrap_or(network))
}

/// The write that creates overlay network `id` from `spec` (checked by `validate_network_spec`) with at most
/// `max_subnets` subnets: the user's, else one chosen from the cluster's pools, each overlapping no other
/// network's, and a free VXLAN ID for each.
pub(crate) fn create_overlay(
    t: &Tables,
    c: &mut Changes,
    id: String,
    now: shoal_api::prost_types::Timestamp,
    spec: &NetworkSpec,
    max_subnets: usize,
) -> Result<Network, ControlError> {
    let name = spec.annotations.as_ref().map_or("", |a| a.name.as_str());
    room_for_network(t, name)?;
    if spec.ingress && t.networks().iter().any(|n| n.spec.as_ref().is_some_and(|s| s.ingress)) {
        return Err(invalid("an ingress network exists already; remove it first"));
    }
    let mut subnets = user_ipam(spec, max_subnets)?;
    if !subnets.iter().any(|(s, _, _)| !s.is_v6()) {
        // A subnet chosen from the pools also skips the nodes' own addresses.
        let taken: Vec<Cidr> = t
            .networks()
            .iter()
            .flat_map(|n| n.ipam.iter().flat_map(|i| i.configs.iter()).filter_map(|c| c.subnet.parse().ok()))
            .chain(
                node_addresses(t)
                    .into_iter()
                    .filter_map(|(ip, _, _)| Cidr::new(ip, if ip.is_ipv4() { 32 } else { 128 })),
            )
            .collect();
        let (pools, size) = pools_of(t);
        let s = choose_subnet(&pools, size, &taken).ok_or_else(|| {
            invalid(format!(
                "no /{size} subnet is left in the address pools ({}); give --subnet or remove a network",
                pools.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ")
            ))
        })?;
        for (subnet, _, _) in &subnets {
            check_node_overlap(t, subnet)?;
        }
        subnets.insert(0, (s, None, None));
    } else {
        for (subnet, _, _) in &subnets {
            check_node_overlap(t, subnet)?;
        }
    }
    for (subnet, _, _) in &subnets {
        // The overlapping network with the lowest subnet, so the message does not depend on table order.
        if let Some((theirs, other)) = t
            .networks()
            .iter()
            .filter_map(|n| {
                let theirs = n
                    .ipam
                    .iter()
                    .flat_map(|i| i.configs.iter())
                    .filter_map(|c| c.subnet.parse::<Cidr>().ok())
                    .find(|c| c.overlaps(subnet))?;
                Some((theirs, n.clone()))
            })
            .min_by(|a, b| a.0.cmp(&b.0))
        {
            return Err(ControlError::Conflict(format!(
                "subnet {subnet} overlaps subnet {theirs} of network {}; choose another subnet",
                other.unique_name().unwrap_or(&other.id)
            )));
        }
    }
    let used: BTreeSet<u32> = t.networks().iter().flat_map(|n| vxlan_ids(n)).collect();
    // One VXLAN ID per IPv4 subnet (an IPv6 one shares the IPv4 one's interfaces, as in libnetwork).
    let v4 = subnets.iter().filter(|(s, _, _)| !s.is_v6()).count();
    let vnis: Vec<u32> = (FIRST_VXLAN_ID..).filter(|v| !used.contains(v)).take(v4).collect();
    let n = built(id, now, spec.clone(), &subnets, &vnis);
    c.create(n.clone());
    Ok(n)
}

/// Whether the cluster can take a new network named `name`: the name is free, and it has fewer than
/// `MAX_NETWORKS`.
fn room_for_network(t: &Tables, name: &str) -> Result<(), ControlError> {
    if let Some(owner) = t.networks().by_name(name) {
        return Err(ControlError::AlreadyExists(format!(
            "network with name {name} already exists (network {}); choose another name",
            owner.id
        )));
    }
    if t.networks().len() >= MAX_NETWORKS {
        return Err(invalid(format!("the cluster has {MAX_NETWORKS} networks, the most it may have; remove one")));
    }
    Ok(())
}

/// Creates a network of each node's engine: no subnet, VXLAN ID or address is allocated (each engine
/// addresses its tasks); the driver state names the driver, which a node must report to run its tasks.
async fn create_node_local(
    state: &ClusterState,
    id: String,
    now: shoal_api::prost_types::Timestamp,
    spec: NetworkSpec,
    driver: String,
) -> Result<Network, ControlError> {
    let network = Network {
        id,
        meta: Some(Meta { version: None, created_at: Some(now), updated_at: Some(now) }),
        driver_state: Some(Driver { name: driver, options: HashMap::new() }),
        ipam: spec.ipam.clone(),
        spec: Some(spec),
        ..Default::default()
    };
    let (network, _) = state
        .write(|t: &Tables, c: &mut Changes| {
            let name = network.spec.as_ref().and_then(|s| s.annotations.as_ref()).map_or("", |a| a.name.as_str());
            room_for_network(t, name)?;
            c.create(network.clone());
            Ok(network.clone())
        })
        .await?;
    Ok(state.store.view(|t| t.networks().get(&network.id).map(|n| (**n).clone())).unwrap_or(network))
}

/// The network with this ID, name or unique ID prefix, in a view.
pub fn find_network<'a>(t: &'a Tables, reference: &str) -> Result<&'a Arc<Network>, ControlError> {
    resolve("network", reference, |id| t.networks().get(id), |n| t.networks().by_name(n), t.networks().iter())
}

/// Reads one network.
pub fn get_network(state: &ClusterState, reference: &str) -> Result<Network, ControlError> {
    state.store.view(|t| find_network(t, reference).map(|n| (**n).clone()))
}

/// What `list_networks` keeps (each list: any entry may match; empty: all).
#[derive(Debug, Clone, Default)]
pub struct NetworkFilters {
    /// ID prefixes.
    pub ids: Vec<String>,
    /// Name substrings (Docker matches names by substring).
    pub names: Vec<String>,
    /// `key` or `key=value` labels, all of which must match.
    pub labels: Vec<String>,
}

/// Lists networks, sorted by name.
pub fn list_networks(state: &ClusterState, f: &NetworkFilters) -> Vec<Network> {
    let mut out: Vec<Network> = state.store.view(|t| {
        t.networks()
            .iter()
            .filter(|n| f.ids.is_empty() || f.ids.iter().any(|p| n.id.starts_with(p.as_str())))
            .filter(|n| {
                let name = n.unique_name().unwrap_or("");
                f.names.is_empty() || f.names.iter().any(|w| name.contains(w.as_str()))
            })
            .filter(|n| {
                labels_match(&n.spec.as_ref().and_then(|s| s.annotations.clone()).unwrap_or_default().labels, &f.labels)
            })
            .map(|n| (**n).clone())
            .collect()
    });
    out.sort_by(|a, b| a.unique_name().cmp(&b.unique_name()).then(a.id.cmp(&b.id)));
    out
}

/// Removes a network no service uses and no task holds an address in.
pub async fn remove_network(state: &ClusterState, reference: &str) -> Result<(), ControlError> {
    state
        .write(|t: &Tables, c: &mut Changes| {
            let n = find_network(t, reference)?;
            let name = n.unique_name().unwrap_or(&n.id).to_string();
            if n.predefined_driver().is_some() {
                return Err(ControlError::FailedPrecondition(format!(
                    "{name} is a pre-defined network and cannot be removed"
                )));
            }
            let ingress = n.spec.as_ref().is_some_and(|s| s.ingress);
            let users: Vec<&str> = t
                .services()
                .iter()
                .filter(|s| {
                    s.spec.as_ref().is_some_and(|sp| {
                        shoal_store::spec_networks(sp).any(|x| x == n.id)
                            || (ingress
                                && sp.endpoint.as_ref().is_some_and(|e| {
                                    e.ports.iter().any(|p| p.publish_mode == port_config::PublishMode::Ingress as i32)
                                }))
                    })
                })
                .filter_map(|s| s.unique_name())
                .collect();
            if !users.is_empty() {
                let mut users = users;
                users.sort();
                let what = if ingress { "publishes ports through it" } else { "uses it" };
                return Err(invalid(format!(
                    "network {name} is in use by service {} (it {what}); remove the service or update it first",
                    users.join(", ")
                )));
            }
            // A task still meant to run holds the network; one already told to stop (its service removed, as
            // `docker stack rm` does just before it removes the stack's networks) does not, as in SwarmKit:
            // the allocator drops the network's pool and the task's address goes with it.
            let holder = t.tasks().iter().find(|task| {
                crate::tasks::observed_state(task) <= shoal_api::TaskState::Running
                    && task.desired_state < shoal_api::TaskState::Shutdown as i32
                    && task.networks.iter().any(|a| a.network.as_ref().is_some_and(|x| x.id == n.id))
            });
            if let Some(task) = holder {
                return Err(invalid(format!(
                    "network {name} is in use by task {} (it is still running); wait for it to stop",
                    task.id
                )));
            }
            c.remove(n.clone());
            Ok(())
        })
        .await?;
    Ok(())
}

/// Resolves the networks of a service spec to IDs (a name, ID or prefix each) and checks them: they exist,
/// are not `ingress` (reached through published ports), appear once, and stay in bounds. The deprecated
/// service-level list moves into the task spec (so a change of it rolls the tasks, as any task spec change).
pub fn resolve_service_networks(t: &Tables, spec: &mut ServiceSpec) -> Result<(), ControlError> {
    let legacy = std::mem::take(&mut spec.networks);
    let Some(task) = spec.task.as_mut() else { return Ok(()) };
    if !legacy.is_empty() {
        if !task.networks.is_empty() {
            return Err(invalid("give networks in TaskTemplate.Networks or in Networks, not both"));
        }
        task.networks = legacy;
    }
    if task.networks.len() > MAX_SERVICE_NETWORKS {
        return Err(invalid(format!(
            "{} networks given: a service attaches to at most {MAX_SERVICE_NETWORKS}",
            task.networks.len()
        )));
    }
    let mut seen = BTreeSet::new();
    let mut ifnames = BTreeSet::new();
    for (i, a) in task.networks.iter_mut().enumerate() {
        let n = find_network(t, &a.target).map_err(|e| match e {
            ControlError::NotFound { .. } => invalid(format!(
                "network {} not found (TaskTemplate.Networks[{i}]): create it with `docker network create -d overlay`",
                a.target
            )),
            other => other,
        })?;
        if n.spec.as_ref().is_some_and(|s| s.ingress) {
            return Err(invalid(format!(
                "service cannot be explicitly attached to the ingress network {:?}; publish a port instead",
                n.unique_name().unwrap_or(&n.id)
            )));
        }
        if !seen.insert(n.id.clone()) {
            return Err(invalid(format!("network {} is given twice; give each network once", a.target)));
        }
        if a.aliases.len() > MAX_ALIASES || a.aliases.iter().any(|x| x.is_empty() || x.len() > MAX_ALIAS_BYTES) {
            return Err(invalid(format!(
                "TaskTemplate.Networks[{i}].Aliases: at most {MAX_ALIASES} aliases of 1 to {MAX_ALIAS_BYTES} bytes"
            )));
        }
        if !a.addresses.is_empty() {
            return Err(invalid(format!(
                "TaskTemplate.Networks[{i}]: static addresses are not supported; leave them out"
            )));
        }
        check_driver_opts(i, a, n.node_local_driver().map(|_| n.unique_name().unwrap_or(&n.id)), &mut ifnames)?;
        a.target = n.id.clone();
    }
    let predefined: Vec<&str> = task
        .networks
        .iter()
        .filter_map(|a| t.networks().get(&a.target))
        .filter_map(|n| n.node_local_driver().map(|_| n.unique_name().unwrap_or(&n.id)))
        .collect();
    if let Some(name) = predefined.first() {
        if task.networks.len() > 1 {
            return Err(invalid(format!(
                "network {name} is the node's own network (its engine's) and cannot be combined with other \
                 networks; give it alone"
            )));
        }
        check_predefined_ports(name, spec.endpoint.as_ref())?;
    }
    Ok(())
}

/// Longest interface name a task's attachment may ask for (the kernel's IFNAMSIZ less its terminating zero).
const MAX_IFNAME_BYTES: usize = 15;

/// Checks the driver options of a service's attachment `i` (`--network name=...,driver-opt=k=v`): the one
/// option an overlay endpoint reads, `com.docker.network.endpoint.ifname` (the task's interface name on that
/// network), a valid interface name given to one attachment only (`ifnames` holds those seen); no option on a
/// node's own network (`predefined`: the engine's, which applies them from API 1.45 only).
fn check_driver_opts(
    i: usize,
    a: &NetworkAttachmentConfig,
    predefined: Option<&str>,
    ifnames: &mut BTreeSet<String>,
) -> Result<(), ControlError> {
    let at = format!("TaskTemplate.Networks[{i}].DriverOpts");
    if let (Some(name), Some(k)) = (predefined, a.driver_attachment_opts.keys().next()) {
        return Err(invalid(format!(
            "{at}: {k:?} on the node's own network {name} is not supported (the engine applies endpoint options \
             from API 1.45, and Shoal's engine may be older); leave the driver options out"
        )));
    }
    for (k, v) in &a.driver_attachment_opts {
        if k != ENDPOINT_IFNAME_OPTION {
            return Err(invalid(format!(
                "{at}: {k:?} is not an option an overlay endpoint reads; the one it reads is \
                 {ENDPOINT_IFNAME_OPTION} (the task's interface name on the network)"
            )));
        }
        let ok = !v.is_empty()
            && v.len() <= MAX_IFNAME_BYTES
            && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
            && !matches!(v.as_str(), "lo" | "." | "..");
        if !ok {
            return Err(invalid(format!(
                "{at}: interface name {v:?} must be 1 to {MAX_IFNAME_BYTES} letters, digits, '-', '_' and '.', \
                 and not lo"
            )));
        }
        if !ifnames.insert(v.clone()) {
            return Err(invalid(format!("{at}: interface name {v:?} is asked for twice; give each network its own")));
        }
    }
    Ok(())
}

/// The ports a service on predefined network `name` may publish: none through the routing mesh (its tasks
/// have no address on the ingress network); on `host`, host-mode ports only as the port the task listens on
/// (published = target: the host network has no port mapping).
fn check_predefined_ports(name: &str, endpoint: Option<&shoal_api::EndpointSpec>) -> Result<(), ControlError> {
    for p in endpoint.iter().flat_map(|e| e.ports.iter()) {
        if p.publish_mode == port_config::PublishMode::Ingress as i32 {
            return Err(invalid(format!(
                "port {}: a service on the {name} network cannot publish through the routing mesh (ingress mode); \
                 publish it with mode=host",
                p.target_port
            )));
        }
        if name == "host" && p.published_port != 0 && p.published_port != p.target_port {
            return Err(invalid(format!(
                "port {}:{}: on the host network a task listens on the node's ports directly, so the published \
                 port must be the target port",
                p.published_port, p.target_port
            )));
        }
    }
    Ok(())
}

/// Checks a service's endpoint spec: ports in range and unique, no ingress port with DNS round robin, and
/// no ingress port another service holds (the error names it). `service_id` is the service being written
/// (its own ports are not a conflict).
pub fn check_endpoint(t: &Tables, service_id: &str, spec: &ServiceSpec) -> Result<(), ControlError> {
    let Some(e) = &spec.endpoint else { return Ok(()) };
    if e.ports.len() > MAX_PORTS {
        return Err(invalid(format!("{} ports published: a service publishes at most {MAX_PORTS}", e.ports.len())));
    }
    let ingress = |p: &shoal_api::PortConfig| p.publish_mode == port_config::PublishMode::Ingress as i32;
    if e.mode == endpoint_spec::ResolutionMode::Dnsrr as i32 && e.ports.iter().any(ingress) {
        return Err(invalid(
            "EndpointSpec: port published with ingress mode can't be used with dnsrr mode; use --publish mode=host or \
             --endpoint-mode vip",
        ));
    }
    let mut seen = BTreeSet::new();
    for p in &e.ports {
        if p.target_port == 0 || p.target_port > 65535 || p.published_port > 65535 {
            return Err(invalid(format!(
                "EndpointSpec.Ports: port {}:{} is out of range: ports go from 1 to 65535 (published 0: one is chosen)",
                p.published_port, p.target_port
            )));
        }
        if p.published_port != 0 && !seen.insert((p.protocol, p.published_port)) {
            return Err(invalid(format!("EndpointSpec.Ports: published port {} is given twice", p.published_port)));
        }
        // Every node's data plane forwards TCP and UDP only (its nftables tables): an SCTP port through the
        // routing mesh, or of a task on networks, would be accepted and its tasks rejected forever. Off
        // networks a host-mode SCTP port is the engine's to bind (or the process's to listen on).
        let on_networks = spec.task.as_ref().is_some_and(|t| !t.networks.is_empty()) || !spec.networks.is_empty();
        if p.protocol == port_config::Protocol::Sctp as i32 && (ingress(p) || on_networks) {
            return Err(invalid(format!(
                "EndpointSpec.Ports: port {} uses protocol sctp, which the nodes' data plane does not forward (TCP \
                 and UDP only, through the routing mesh and on networks); publish it as tcp or udp, or with \
                 mode=host on a service without networks",
                p.target_port
            )));
        }
    }
    for p in e.ports.iter().filter(|p| ingress(p) && p.published_port != 0) {
        let holds = |s: &shoal_api::Service| {
            let allocated = s.endpoint.iter().flat_map(|e| e.ports.iter());
            let asked = s.spec.iter().flat_map(|sp| sp.endpoint.iter()).flat_map(|e| e.ports.iter());
            allocated
                .chain(asked)
                .any(|q| ingress(q) && q.protocol == p.protocol && q.published_port == p.published_port)
        };
        if let Some(other) = t.services().iter().find(|s| s.id != service_id && holds(s)) {
            return Err(invalid(format!(
                "port '{}' is already in use by service '{}' ({}) as an ingress port",
                p.published_port,
                other.unique_name().unwrap_or(""),
                other.id
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::tests::{cluster, spec};
    use super::*;

    fn named(name: &str, subnet: &str) -> NetworkSpec {
        NetworkSpec {
            annotations: Some(Annotations { name: name.into(), ..Default::default() }),
            ipam: (!subnet.is_empty()).then(|| IpamOptions {
                driver: None,
                configs: vec![IpamConfig { subnet: subnet.into(), ..Default::default() }],
            }),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn subnets_come_from_the_cluster_pools_and_a_used_network_stays() {
        let (state, _) = cluster();
        let mut c = Changes::new();
        c.create(shoal_api::Cluster {
            id: "c1".into(),
            default_address_pool: vec!["192.168.0.0/16".into()],
            subnet_size: 26,
            ..Default::default()
        });
        state.propose(c).await.unwrap();
        let subnet = |n: &Network| n.ipam.as_ref().unwrap().configs[0].subnet.clone();
        let a = create_network(&state, named("a", "")).await.unwrap();
        let b = create_network(&state, named("b", "")).await.unwrap();
        assert_eq!((subnet(&a), subnet(&b)), ("192.168.0.0/26".to_string(), "192.168.0.64/26".to_string()));
        assert_eq!(a.ipam.as_ref().unwrap().configs[0].gateway, "192.168.0.1");
        assert_ne!(vxlan_ids(&a), vxlan_ids(&b));
        let e = create_network(&state, named("c", "192.168.0.0/24")).await.unwrap_err().to_string();
        assert!(e.contains("overlaps subnet 192.168.0.0/26 of network a"), "{e}");
        let e = create_network(&state, named("A", "")).await.unwrap_err().to_string();
        assert!(e.contains("already exists"), "{e}");
        // A service on `a` by name: stored by ID; `a` cannot go while the service is there.
        let mut s = spec("web", 1);
        s.task.as_mut().unwrap().networks =
            vec![shoal_api::NetworkAttachmentConfig { target: "a".into(), ..Default::default() }];
        let svc = super::super::create_service(&state, s).await.unwrap();
        assert_eq!(svc.spec.as_ref().unwrap().task.as_ref().unwrap().networks[0].target, a.id);
        let e = remove_network(&state, "a").await.unwrap_err().to_string();
        assert!(e.contains("network a is in use by service web"), "{e}");
        remove_network(&state, &b.id[..5]).await.unwrap();
        assert_eq!(list_networks(&state, &NetworkFilters::default()).len(), 1);
    }

    #[tokio::test]
    async fn subnets_holding_a_node_address_or_in_reserved_ranges_are_refused_naming_the_reason() {
        let (state, _) = cluster();
        let mut c = Changes::new();
        c.create(shoal_api::Cluster {
            id: "c1".into(),
            default_address_pool: vec!["10.20.0.0/16".into()],
            subnet_size: 24,
            ..Default::default()
        });
        c.create(shoal_api::Node {
            id: "w1".into(),
            description: Some(shoal_api::NodeDescription { hostname: "worker-1".into(), ..Default::default() }),
            status: Some(shoal_api::NodeStatus { addr: "10.20.0.7".into(), ..Default::default() }),
            ..Default::default()
        });
        c.create(shoal_api::Node {
            id: "m1".into(),
            description: Some(shoal_api::NodeDescription { hostname: "manager-1".into(), ..Default::default() }),
            manager_status: Some(shoal_api::ManagerStatus { addr: "10.30.5.1:2377".into(), ..Default::default() }),
            ..Default::default()
        });
        state.propose(c).await.unwrap();
        let refused = |subnet: &'static str, want: &'static str| {
            let state = state.clone();
            async move {
                let e = create_network(&state, named("n", subnet)).await.unwrap_err();
                assert!(matches!(e, ControlError::InvalidArgument(_)), "{e:?}");
                assert!(e.to_string().contains(want), "{subnet}: {e} should contain {want:?}");
            }
        };
        refused("10.20.0.0/24", "subnet 10.20.0.0/24 holds the address 10.20.0.7 of node worker-1 (w1)").await;
        refused("10.30.0.0/16", "holds the address 10.30.5.1 of node manager-1 (m1)").await;
        refused("127.0.0.0/24", "overlaps the loopback range 127.0.0.0/8").await;
        refused("169.254.10.0/24", "overlaps the link-local range 169.254.0.0/16").await;
        refused("0.0.0.0/8", "\"this network\" range").await;
        refused("224.1.0.0/16", "multicast").await;
        refused("128.0.0.0/1", "overlaps the link-local range").await;
        assert!(list_networks(&state, &NetworkFilters::default()).is_empty(), "nothing was created");
        // From the pool: the block holding the worker's address is skipped.
        let n = create_network(&state, named("auto", "")).await.unwrap();
        assert_eq!(n.ipam.as_ref().unwrap().configs[0].subnet, "10.20.1.0/24");
        create_network(&state, named("beside", "10.20.2.0/24")).await.unwrap();
    }

    #[test]
    fn network_specs_shoal_cannot_honour_are_refused_with_the_reason() {
        let spec = |f: &dyn Fn(&mut NetworkSpec)| {
            let mut s = NetworkSpec {
                annotations: Some(Annotations { name: "appnet".into(), ..Default::default() }),
                ..Default::default()
            };
            f(&mut s);
            validate_network_spec(&s).err().map(|e| e.to_string()).unwrap_or_default()
        };
        let ipam = |subnet: &str, range: &str, gw: &str| {
            Some(IpamOptions {
                driver: None,
                configs: vec![IpamConfig {
                    subnet: subnet.into(),
                    range: range.into(),
                    gateway: gw.into(),
                    ..Default::default()
                }],
            })
        };
        assert_eq!(spec(&|_| {}), "");
        assert!(spec(&|s| s.driver_config = Some(Driver { name: "bridge".into(), ..Default::default() }))
            .contains("\"bridge\" is not supported"));
        assert!(spec(&|s| s.ipv6_enabled = true).contains("--ipv6 needs an IPv6 subnet"));
        assert!(spec(&|s| s.annotations.as_mut().unwrap().name = "-x".into()).contains("invalid network name"));
        assert!(spec(&|s| s.ipam = ipam("10.9.0.1/24", "", "")).contains("the network address is 10.9.0.0/24"));
        assert!(spec(&|s| s.ipam = ipam("10.9.0.0/24", "10.8.0.0/25", "")).contains("not inside subnet"));
        assert!(spec(&|s| s.ipam = ipam("10.9.0.0/24", "", "10.9.0.255")).contains("not a host address"));
        assert!(spec(&|s| s.ipam = ipam("10.0.0.0/8", "", "")).contains("more than 1048576"));
        assert!(spec(&|s| s.ipam = ipam("10.0.0.0/31", "", "")).contains("too small"));
        assert_eq!(spec(&|s| s.ipam = ipam("10.9.0.0/24", "10.9.0.128/25", "10.9.0.1")), "");
    }

    #[test]
    fn init_address_pools_are_checked_and_the_ingress_takes_their_first_free_block() {
        let check = |pools: &[&str], size: u32| {
            AddressPools::check(&pools.iter().map(|p| p.to_string()).collect::<Vec<_>>(), size)
                .map_err(|e| e.to_string())
        };
        let ok = check(&["10.20.0.0/16", "172.28.0.0/16"], 26).unwrap();
        assert_eq!(ok.subnet_size, 26);
        assert_eq!(ok.pools.len(), 2);
        assert!(check(&[], 0).unwrap().is_default());
        assert_eq!(check(&[], 20).unwrap().subnet_size, 20);
        for (pools, size, says) in [
            (&["10.20.0.0/16"][..], 30, "at most 29"),
            (&["10.20.0.0/16"][..], 12, "at least the pool's (16)"),
            (&[][..], 6, "at least the pool's (8)"),
            (&["10.20.0.0/33"][..], 24, "invalid address pool \"10.20.0.0/33\""),
            (&["10.20.0.1/16"][..], 24, "invalid address pool"),
            (&["nonsense"][..], 24, "IPv4 CIDR such as"),
            (&["fd00::/48"][..], 64, "IPv6 pools are not supported"),
            (&["127.0.0.0/16"][..], 24, "loopback"),
            (&["10.0.0.0/8", "10.20.0.0/16"][..], 24, "overlap"),
        ] {
            let err = check(pools, size).unwrap_err();
            assert!(err.contains(says), "{pools:?} /{size}: {err}");
        }
        let many: Vec<String> = (0..=MAX_ADDRESS_POOLS).map(|i| format!("10.{i}.0.0/16")).collect();
        assert!(AddressPools::check(&many, 24).unwrap_err().to_string().contains("at most 64"));

        let ts = shoal_api::prost_types::Timestamp::default();
        let subnet = |n: &Network| n.ipam.as_ref().unwrap().configs[0].subnet.clone();
        let n = ingress_network_from("i".into(), ts, &ok, &[]).unwrap();
        assert_eq!(subnet(&n), "10.20.0.0/26");
        assert!(n.spec.as_ref().unwrap().ingress);
        // The first manager's own address is never inside it.
        let n = ingress_network_from("i".into(), ts, &ok, &["10.20.0.5".parse().unwrap()]).unwrap();
        assert_eq!(subnet(&n), "10.20.0.64/26");
        let net = |port: u32| SwarmNetworking::check(&[], 0, port).map_err(|e| e.to_string());
        assert_eq!(net(0).unwrap(), SwarmNetworking::default());
        assert_eq!(net(7789).unwrap().data_path_port, 7789);
        for port in [80, 49152, 70000] {
            assert!(net(port).unwrap_err().contains("from 1024 to 49151"), "{port}");
        }
        let mut c = shoal_api::Cluster::default();
        SwarmNetworking::default().apply_to(&mut c);
        assert_eq!(c, shoal_api::Cluster::default(), "the defaults are not written");
        assert_eq!(data_path_port(&c), 4789);
        SwarmNetworking { pools: ok.clone(), data_path_port: 7789 }.apply_to(&mut c);
        assert_eq!(c.default_address_pool, ["10.20.0.0/16", "172.28.0.0/16"]);
        assert_eq!((c.subnet_size, data_path_port(&c)), (26, 7789));
        let tiny = check(&["10.30.0.0/29"], 29).unwrap();
        assert!(ingress_network_from("i".into(), ts, &tiny, &["10.30.0.3".parse().unwrap()]).is_none());
    }

    #[tokio::test]
    async fn predefined_networks_take_services_alone_keep_their_names_and_stay() {
        let (state, _) = cluster();
        let now = state.now();
        let made =
            state.store.view(|t| crate::allocator::predefined::missing_predefined_networks(t, state.ids.as_ref(), now));
        let mut c = Changes::new();
        for n in made {
            c.create(n);
        }
        state.propose(c).await.unwrap();
        // Their names and label are the managers' own.
        for name in ["host", "bridge", "none"] {
            let e = create_network(&state, named(name, "")).await.unwrap_err().to_string();
            assert!(e.contains("predefined network") && e.contains("choose another name"), "{name}: {e}");
        }
        let mut labelled = named("mine", "");
        labelled.annotations.as_mut().unwrap().labels.insert(shoal_api::PREDEFINED_NETWORK_LABEL.into(), "true".into());
        assert!(create_network(&state, labelled).await.unwrap_err().to_string().contains("leave it out"));
        let e = remove_network(&state, "host").await.unwrap_err().to_string();
        assert_eq!(e, "host is a pre-defined network and cannot be removed");
        create_network(&state, named("app", "10.9.0.0/24")).await.unwrap();

        let with = |nets: &[&str], ports: Vec<shoal_api::PortConfig>| {
            let mut s = spec("agent", 1);
            s.task.as_mut().unwrap().networks = nets
                .iter()
                .map(|n| shoal_api::NetworkAttachmentConfig { target: n.to_string(), ..Default::default() })
                .collect();
            s.endpoint = Some(shoal_api::EndpointSpec { mode: 0, ports });
            state.store.view(|t| resolve_service_networks(t, &mut s).map(|()| s).map_err(|e| e.to_string()))
        };
        let port = |mode: port_config::PublishMode, published: u32, target: u32| shoal_api::PortConfig {
            publish_mode: mode as i32,
            published_port: published,
            target_port: target,
            ..Default::default()
        };
        let ok = with(&["host"], vec![port(port_config::PublishMode::Host, 9100, 9100)]).unwrap();
        let host_id = state.store.view(|t| t.networks().by_name("host").unwrap().id.clone());
        assert_eq!(ok.task.unwrap().networks[0].target, host_id, "resolved to the ID");
        assert!(with(&["bridge"], vec![port(port_config::PublishMode::Host, 8080, 80)]).is_ok());
        for (nets, ports, says) in [
            (&["host", "app"][..], vec![], "cannot be combined with other networks"),
            (&["host"][..], vec![port(port_config::PublishMode::Ingress, 8080, 80)], "routing mesh"),
            (&["bridge"][..], vec![port(port_config::PublishMode::Ingress, 8080, 80)], "routing mesh"),
            (&["host"][..], vec![port(port_config::PublishMode::Host, 8080, 80)], "must be the target port"),
        ] {
            let e = with(nets, ports).unwrap_err();
            assert!(e.contains(says), "{nets:?}: {e}");
        }
    }

    /// An `--ipv6` overlay (docs/design/overlay-subnets.md, part 2): its IPv6 config is kept second, with its
    /// family and gateway (the prefix's first host address unless given), and takes no VXLAN ID; without an
    /// IPv4 config one is chosen from the pools. What cannot be carried is refused, naming why.
    #[tokio::test]
    async fn an_ipv6_network_keeps_its_ipv6_subnet_beside_one_ipv4_subnet() {
        let (state, _) = cluster();
        let config = |subnet: &str| IpamConfig { subnet: subnet.into(), ..Default::default() };
        let v6 = |name: &str, configs: Vec<IpamConfig>| NetworkSpec {
            ipv6_enabled: true,
            ipam: Some(IpamOptions { driver: None, configs }),
            ..named(name, "")
        };
        // The docker CLI sends the configs in no fixed order: the IPv6 one first here.
        let n = create_network(&state, v6("dual", vec![config("fd00:1::/64"), config("10.80.0.0/24")])).await.unwrap();
        assert_eq!(vxlan_ids(&n).len(), 1, "one VXLAN ID: the IPv4 subnet's");
        let configs = &n.ipam.as_ref().unwrap().configs;
        let got: Vec<_> = configs.iter().map(|c| (c.subnet.as_str(), c.gateway.as_str(), c.family())).collect();
        assert_eq!(
            got,
            [
                ("10.80.0.0/24", "10.80.0.1", ipam_config::AddressFamily::Ipv4),
                ("fd00:1::/64", "fd00:1::1", ipam_config::AddressFamily::Ipv6)
            ]
        );
        assert!(n.spec.as_ref().unwrap().ipv6_enabled);
        // Only the IPv6 subnet given: the IPv4 one comes from the pools, first.
        let mut only6 = config("fd00:2::/64");
        only6.gateway = "fd00:2::fe".into();
        let n = create_network(&state, v6("only6", vec![only6])).await.unwrap();
        let configs = &n.ipam.as_ref().unwrap().configs;
        assert!(configs[0].subnet.starts_with("10.") && configs[1].gateway == "fd00:2::fe", "{configs:?}");
        // An internal IPv6 network is carried too.
        let mut internal = v6("closed6", vec![config("fd00:3::/64")]);
        internal.internal = true;
        create_network(&state, internal).await.unwrap();
        for (spec, want) in [
            (v6("a", vec![config("10.81.0.0/24")]), "--ipv6 needs an IPv6 subnet"),
            (v6("b", vec![config("fd00:1:0:0:8000::/65")]), "overlaps subnet fd00:1::/64 of network dual"),
            (v6("c", vec![config("fd00:4::/64"), config("fd00:5::/64")]), "2 IPv6 subnets given"),
            (
                v6("d", vec![config("10.82.0.0/24"), config("10.83.0.0/24"), config("fd00:6::/64")]),
                "an IPv6 network takes one IPv4 subnet",
            ),
            (v6("e", vec![config("fd00:7::/32")]), "from /48 to /120 (a /64 is usual): a prefix shorter than /48"),
            (v6("e2", vec![config("fd00:7::/121")]), "leaves fewer than 256 addresses to allocate"),
            (v6("f", vec![config("fe80::/64")]), "link-local"),
            (
                NetworkSpec { ipv6_enabled: false, ..v6("g", vec![config("fd00:8::/64")]) },
                "subnet fd00:8::/64 is IPv6: add --ipv6",
            ),
            (NetworkSpec { ingress: true, ..v6("h", vec![config("fd00:9::/64")]) }, "not supported on the ingress"),
            // An IPv6 subnet where IPv6 is not carried is refused for what it is, not sent to --ipv6 and back.
            (
                NetworkSpec { ingress: true, ipv6_enabled: false, ..v6("h2", vec![config("fd00:9::/64")]) },
                "IPv6 subnets are not supported on the ingress network",
            ),
        ] {
            let e = create_network(&state, spec).await.unwrap_err().to_string();
            assert!(e.contains(want), "{e} should contain {want:?}");
        }
        // An overlap with another network's IPv6 subnet is a conflict (409), as an IPv4 one is.
        let e = create_network(&state, v6("b2", vec![config("fd00:1::/48")])).await.unwrap_err();
        assert!(matches!(&e, ControlError::Conflict(m) if m.contains("overlaps subnet fd00:1::/64")), "{e}");
        let mut gw = config("fd00:10::/64");
        gw.gateway = "fd00:10::".into();
        let e = create_network(&state, v6("i", vec![gw])).await.unwrap_err().to_string();
        assert!(e.contains("gateway fd00:10:: is not a host address"), "{e}");
        // IPv6 auxiliary addresses: host addresses of the prefix (its last one too: IPv6 has no broadcast).
        let aux = |a: &str| {
            let mut c = config("fd00:11::/120");
            c.reserved = [("r".to_string(), a.to_string())].into();
            v6("aux6", vec![c])
        };
        let e = create_network(&state, aux("fd00:11::")).await.unwrap_err().to_string();
        assert!(e.contains("auxiliary address r=fd00:11:: is not a host address"), "{e}");
        let e = create_network(&state, aux("fd00:12::5")).await.unwrap_err().to_string();
        assert!(e.contains("not a host address of subnet fd00:11::/120"), "{e}");
        let n = create_network(&state, aux("fd00:11::ff")).await.unwrap();
        assert_eq!(n.ipam.as_ref().unwrap().configs[1].reserved["r"], "fd00:11::ff");
    }

    /// A network of several subnets (docs/design/overlay-subnets.md, part 1): each config gets its gateway,
    /// range and auxiliary addresses and a VXLAN ID of its own, in order, up to `MAX_OVERLAY_SUBNETS`; what
    /// overlaps is refused, and so are several subnets on the ingress network or a macvlan one; an internal
    /// network takes several too.
    #[tokio::test]
    async fn several_subnets_get_a_vxlan_id_each_in_order_and_are_checked_each() {
        use crate::limits::MAX_OVERLAY_SUBNETS;
        let (state, _) = cluster();
        let config = |subnet: &str| IpamConfig { subnet: subnet.into(), ..Default::default() };
        let with = |name: &str, configs: Vec<IpamConfig>| NetworkSpec {
            ipam: Some(IpamOptions { driver: None, configs }),
            ..named(name, "")
        };
        let two = || {
            let mut first = config("10.40.0.0/24");
            first.range = "10.40.0.8/29".into();
            first.reserved = [("router".to_string(), "10.40.0.9".to_string())].into();
            let mut second = config("10.41.0.0/24");
            second.gateway = "10.41.0.254".into();
            vec![first, second]
        };
        let mut ingress = with("ingress2", two());
        ingress.ingress = true;
        let e = create_network(&state, ingress).await.unwrap_err().to_string();
        assert!(e.contains("2 IPAM configs given on the ingress network"), "{e}");
        let mut macvlan = with("mac", two());
        macvlan.driver_config = Some(Driver { name: "macvlan".into(), ..Default::default() });
        let e = create_network(&state, macvlan).await.unwrap_err().to_string();
        assert!(e.contains("2 IPAM configs given: this network takes one subnet"), "{e}");
        let create = |spec: NetworkSpec| {
            let state = state.clone();
            async move { create_network(&state, spec).await }
        };
        let other = create(named("other", "")).await.unwrap();
        assert_eq!(vxlan_ids(&other), [FIRST_VXLAN_ID]);
        let n = create(with("two", two())).await.unwrap();
        assert_eq!(vxlan_ids(&n), [FIRST_VXLAN_ID + 1, FIRST_VXLAN_ID + 2]);
        let opts = &n.driver_state.as_ref().unwrap().options;
        assert_eq!(opts[VXLAN_ID_OPTION], format!("{},{}", FIRST_VXLAN_ID + 1, FIRST_VXLAN_ID + 2));
        let configs = &n.ipam.as_ref().unwrap().configs;
        let got: Vec<_> = configs.iter().map(|c| (c.subnet.as_str(), c.range.as_str(), c.gateway.as_str())).collect();
        assert_eq!(got, [("10.40.0.0/24", "10.40.0.8/29", "10.40.0.1"), ("10.41.0.0/24", "", "10.41.0.254")]);
        assert_eq!(configs[0].reserved["router"], "10.40.0.9");
        assert!(configs[1].reserved.is_empty());
        // What is refused, each naming the config.
        let refused = |configs: Vec<IpamConfig>, want: &'static str| {
            let create = &create;
            async move {
                let e = create(with("bad", configs)).await.unwrap_err().to_string();
                assert!(e.contains(want), "{e} should contain {want:?}");
            }
        };
        refused(
            vec![config("10.50.0.0/24"), config("10.50.0.128/25")],
            "subnets 10.50.0.0/24 and 10.50.0.128/25 of this network overlap",
        )
        .await;
        refused(vec![config("10.50.0.0/24"), config("10.41.0.0/16")], "overlaps subnet 10.41.0.0/24 of network two")
            .await;
        refused(vec![config("10.50.0.0/24"), config("fd00::/64")], "is IPv6: add --ipv6").await;
        let mut internal = with("internal", vec![config("10.70.0.0/24"), config("10.71.0.0/24")]);
        internal.internal = true;
        let internal = create(internal).await.unwrap();
        assert_eq!(vxlan_ids(&internal).len(), 2, "an internal network of two subnets");
        refused(vec![config("10.50.0.0/24"), config("")], "give each its --subnet").await;
        let mut aux = config("10.51.0.0/24");
        aux.reserved = [("x".to_string(), "10.50.0.9".to_string())].into();
        refused(
            vec![config("10.50.0.0/24"), aux],
            "auxiliary address x=10.50.0.9 is not a host address of subnet 10.51.0.0/24",
        )
        .await;
        let many: Vec<IpamConfig> = (0..=MAX_OVERLAY_SUBNETS).map(|i| config(&format!("10.60.{i}.0/24"))).collect();
        refused(many, "17 IPAM configs given: a network has at most 16 subnets").await;
        // The VXLAN IDs of a removed network are free again; the store refuses one in use in any position.
        remove_network(&state, "other").await.unwrap();
        let again = create(named("again", "")).await.unwrap();
        assert_eq!(vxlan_ids(&again), [FIRST_VXLAN_ID]);
        let mut clash = (*state.store.view(|t| t.networks().get(&again.id).cloned()).unwrap()).clone();
        clash.driver_state.as_mut().unwrap().options.insert(VXLAN_ID_OPTION.into(), format!("{}", FIRST_VXLAN_ID + 2));
        let mut c = Changes::new();
        c.update(clash);
        let e = state.propose(c).await.unwrap_err().to_string();
        assert!(
            e.contains(&format!("VXLAN ID {} of network again is in use by network two", FIRST_VXLAN_ID + 2)),
            "{e}"
        );
    }
}
