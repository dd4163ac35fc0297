//! The node's wanted data-plane state (`shoal_netplane::NodeNetState`) from what the agent knows: the tasks
//! whose network namespace the executor made (each with the attachments its task carries), the tasks assigned
//! to the node (their networks are carried even before their namespaces exist, so a bridge is ready first),
//! and the manager's view of the node's networks (`shoal.v1.NetworkView`: remote peers, services, VIPs,
//! backends). Pure: no IO, no clock.
//!
//! The routing mesh (`view.ingress`, the node's own ingress attachment): the ingress network is carried with
//! the node's address on it, and every port a service publishes in ingress mode is forwarded to the
//! service's running tasks there (`PublishedPort`). Host-mode ports of the node's own networked tasks are
//! forwarded to that task (its address on its first non-internal network). SCTP ports are not forwarded
//! (the node table handles TCP and UDP; the process executor refuses such tasks).
//!
//! What a network needs is read from the `Network` object each attachment carries (the allocator copies it
//! into the task): its VXLAN IDs (driver option `com.docker.network.driver.overlay.vxlanid_list`, one per
//! IPv4 subnet), each IPAM config's subnet and gateway in order (an IPv6 config, `--ipv6`, is the network's
//! IPv6 subnet and has no VXLAN ID of its own), `internal`, and `encrypted` (driver option). A
//! network without them cannot be carried, and a task attached to it is refused by `task_support` with the
//! reason.

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::sync::Arc;

use shoal_api::port_config::{Protocol as WireProtocol, PublishMode};
use shoal_api::shoal_v1::{NetworkPeers, NodeNetworkView};
use shoal_api::{Network, PortConfig, Task, TaskState as WireState};
use shoal_netplane::{
    mac_for, Attachment, Ipv4Cidr, Ipv6Cidr, NetworkState, NodeIngress, NodeNetState, Peer, Protocol, PublishedPort,
    ServiceVip, Subnet, Subnet6, TaskState,
};

/// The driver option that marks an encrypted overlay (`docker network create --opt encrypted`).
pub(crate) const ENCRYPTED_OPTION: &str = "encrypted";

/// A network as the data plane needs it, read from the `Network` object an attachment carries.
pub(crate) fn network_state(n: &Network) -> Result<NetworkState, String> {
    let name = n.spec.as_ref().and_then(|s| s.annotations.as_ref()).map_or("", |a| a.name.as_str());
    let label = if name.is_empty() { n.id.as_str() } else { name };
    // One VXLAN ID per IPv4 subnet, in the order of the IPAM configs (libnetwork's `vxlanid_list`).
    let vnis: Vec<u32> = n
        .driver_state
        .as_ref()
        .and_then(|d| d.options.get(VXLAN_ID_OPTION))
        .map(|v| v.split(',').map(|id| id.trim().parse::<u32>()).collect::<Result<_, _>>())
        .and_then(Result::ok)
        .unwrap_or_default();
    if vnis.is_empty() {
        return Err(format!("network {label} has no VXLAN ID (its allocation is incomplete); recreate the network"));
    }
    let all = n.ipam.as_ref().map(|i| i.configs.as_slice()).unwrap_or_default();
    // IPv6 configs (`--ipv6`) get no VXLAN ID: they share the IPv4 subnet's interfaces.
    let (configs6, configs): (Vec<_>, Vec<_>) = all.iter().partition(|c| c.subnet.contains(':'));
    let ipv6 = match configs6.as_slice() {
        [] => None,
        [c] => Some(subnet6(label, &c.subnet, &c.gateway)?),
        more => return Err(format!("network {label} has {} IPv6 subnets; a node carries one", more.len())),
    };
    if configs.is_empty() {
        return Err(format!("network {label} has no IPv4 subnet"));
    }
    if configs.len() != vnis.len() {
        return Err(format!(
            "network {label} has {} subnets but {} VXLAN IDs (its allocation is incomplete); recreate the network",
            configs.len(),
            vnis.len()
        ));
    }
    let mut subnets = Vec::with_capacity(configs.len());
    for (config, vni) in configs.iter().zip(vnis) {
        let subnet: Ipv4Cidr = config.subnet.parse().map_err(|e| format!("network {label}: {e}"))?;
        let gateway: Ipv4Addr = config
            .gateway
            .split('/')
            .next()
            .unwrap_or_default()
            .parse()
            .map_err(|_| format!("network {label} has no IPv4 gateway ({:?})", config.gateway))?;
        subnets.push(Subnet {
            vni,
            subnet: Ipv4Cidr { addr: subnet.network(), prefix_len: subnet.prefix_len },
            gateway,
        });
    }
    let first = subnets.remove(0);
    let spec = n.spec.as_ref();
    let encrypted =
        spec.and_then(|s| s.driver_config.as_ref()).is_some_and(|d| d.options.contains_key(ENCRYPTED_OPTION));
    Ok(NetworkState {
        id: n.id.clone(),
        name: name.to_string(),
        vni: first.vni,
        subnet: first.subnet,
        gateway: first.gateway,
        more_subnets: subnets,
        ipv6,
        internal: spec.is_some_and(|s| s.internal),
        encrypted,
        peers: Vec::new(),
        services: Vec::new(),
    })
}

/// A network's IPv6 subnet and gateway as its IPAM config gives them (the subnet's first host address when the
/// config has no gateway, as the manager gives it).
fn subnet6(label: &str, subnet: &str, gateway: &str) -> Result<Subnet6, String> {
    let s: Ipv6Cidr = subnet.parse().map_err(|e| format!("network {label}: {e}"))?;
    let s = Ipv6Cidr { addr: s.network(), prefix_len: s.prefix_len };
    let gateway = match gateway.split('/').next().unwrap_or_default() {
        "" => Ipv6Addr::from(u128::from(s.addr) + 1),
        g => g.parse().map_err(|_| format!("network {label}'s IPv6 gateway {gateway:?} is not an IPv6 address"))?,
    };
    Ok(Subnet6 { subnet: s, gateway })
}

/// libnetwork's overlay driver key for the VXLAN ID (the manager's allocator writes it; `shoal_store`'s
/// `VXLAN_ID_OPTION`, which the agent does not link).
pub(crate) const VXLAN_ID_OPTION: &str = "com.docker.network.driver.overlay.vxlanid_list";

/// A task's attachments as the data plane plumbs them, in the task's order.
pub(crate) fn attachments(task: &Task) -> Result<Vec<(Network, Attachment)>, String> {
    let mut out = Vec::new();
    for a in task.overlay_attachments() {
        let Some(n) = &a.network else { continue };
        let addr = a.addresses.first().ok_or_else(|| format!("the task has no address on network {}", n.id))?;
        let ip: Ipv4Addr = addr
            .split('/')
            .next()
            .unwrap_or_default()
            .parse()
            .map_err(|_| format!("the task's address {addr:?} on network {} is not IPv4", n.id))?;
        // On an IPv6 network the manager gives a second address, the IPv6 one.
        let address6 = a.addresses.iter().skip(1).find_map(|a| a.split('/').next()?.parse::<Ipv6Addr>().ok());
        let ifname = a.driver_attachment_opts.get(shoal_api::ENDPOINT_IFNAME_OPTION).cloned();
        out.push((n.clone(), Attachment { network_id: n.id.clone(), address: ip, address6, ifname }));
    }
    Ok(out)
}

/// A task whose network namespace the executor made, with what it is attached to.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PlumbedTask {
    /// Its namespace.
    pub netns: PathBuf,
    /// The networks (as the task carries them) and its address on each.
    pub attachments: Vec<(Network, Attachment)>,
    /// Whether the namespace is a running container's own (`shoal_netplane::TaskState::joined`).
    pub joined: bool,
}

/// Whether the node could carry `task`'s networks: `Err` names what is missing.
pub(crate) fn task_support(task: &Task, encryption: bool) -> Result<(), String> {
    for (n, _) in attachments(task)? {
        let s = network_state(&n)?;
        if s.encrypted && !encryption {
            return Err(shoal_netplane::Error::EncryptionUnsupported { network: s.name }.to_string());
        }
    }
    Ok(())
}

/// The data plane's protocol for a port's (`None`: SCTP, which the node table does not forward).
pub(crate) fn port_protocol(p: &PortConfig) -> Option<Protocol> {
    match WireProtocol::try_from(p.protocol) {
        Ok(WireProtocol::Tcp) => Some(Protocol::Tcp),
        Ok(WireProtocol::Udp) => Some(Protocol::Udp),
        _ => None,
    }
}

/// The address a host-mode port of `task` is forwarded to: the task's address on its first non-internal
/// network (the one its default route leaves by, so replies come back through the node). `None` when it
/// is only on internal networks, which reach nothing outside.
pub(crate) fn host_port_backend(task: &Task) -> Option<Ipv4Addr> {
    attachments(task).ok()?.into_iter().find_map(|(n, a)| {
        let internal = n.spec.as_ref().is_some_and(|s| s.internal);
        (!internal).then_some(a.address)
    })
}

/// Why the data plane cannot forward one of `task`'s published ports (the task is on networks; `None`: all
/// can be): ingress ports and host-mode ports are forwarded by the node table for TCP and UDP, a host-mode
/// port needs its number, and a backend on a network that reaches outside (not only `--internal` ones).
/// Both executors refuse such a task with this reason, the field named.
pub(crate) fn ports_unforwardable(task: &Task) -> Option<String> {
    for p in task.endpoint.iter().flat_map(|e| e.ports.iter()) {
        if port_protocol(p).is_none() {
            return Some(format!(
                "EndpointSpec.Ports: port {} uses protocol sctp, which the data plane does not forward; \
                 publish it as tcp or udp",
                p.target_port
            ));
        }
        if p.publish_mode != PublishMode::Host as i32 {
            continue;
        }
        if p.published_port == 0 {
            return Some(format!(
                "EndpointSpec.Ports.PublishedPort: the host-mode port for target {} has no number; \
                 give one (mode=host,published=<port>,target={0})",
                p.target_port
            ));
        }
        if host_port_backend(task).is_none() {
            return Some(format!(
                "EndpointSpec.Ports: host-mode port {} cannot reach a task that is only on --internal \
                 networks; attach the service to a network that is not internal too",
                p.published_port
            ));
        }
    }
    None
}

fn holds_network(task: &Task) -> bool {
    let s = WireState::from_wire(task.status.as_ref().map_or(0, |s| s.state));
    !s.is_terminal() && task.desired_state <= WireState::Running as i32
}

/// Why this node must not carry network `n` (`None`: it may): its subnet holds this node's own address
/// (`underlay`) or another node's (`view.overlapping_node_addrs`, from the manager), so traffic to that
/// address would go into the overlay and the node would be cut off from it.
pub(crate) fn overlap_reason(n: &NetworkState, underlay: Option<Ipv4Addr>, view: &NodeNetworkView) -> Option<String> {
    let held = underlay
        .into_iter()
        .chain(view.overlapping_node_addrs.iter().filter_map(|a| a.parse::<Ipv4Addr>().ok()))
        .find(|ip| n.contains(*ip))?;
    let whose = if Some(held) == underlay { "this node's own address" } else { "the address of a node" };
    let subnet = n.subnet_of(held).map_or(n.subnet, |s| s.subnet);
    Some(format!(
        "network {}: its subnet {subnet} holds {whose} {held}, and carrying it would cut this node off from that \
         address; remove the network and create it again with a subnet outside the nodes' networks",
        n.name
    ))
}

/// The node's wanted state. `underlay` is the node's address (`None` before the manager's view arrived: then
/// nothing can be carried and the state has no network). Networks the state cannot carry (see
/// `task_support`) are left out, with their tasks, and so are networks whose subnet holds a node's address
/// (`overlap_reason`): the node keeps its underlay when such a network appears, and carries nothing more
/// once it goes.
pub(crate) fn desired(
    underlay: Option<Ipv4Addr>,
    plumbed: &BTreeMap<String, PlumbedTask>,
    assigned: &HashMap<String, Arc<Task>>,
    view: &NodeNetworkView,
) -> NodeNetState {
    let mut state = match underlay {
        Some(ip) => NodeNetState::new(ip),
        None => return NodeNetState { underlay_ip: None, ..NodeNetState::new(Ipv4Addr::UNSPECIFIED) },
    };
    // The cluster's data path port (`docker swarm init --data-path-port`); a view without one keeps the default.
    if let Some(port) = u16::try_from(view.vxlan_udp_port).ok().filter(|p| *p != 0) {
        state.vxlan_port = port;
    }
    let (mut networks, ingress) = carried_networks(underlay, plumbed, assigned, view);
    for v in &view.networks {
        if let Some(n) = networks.get_mut(&v.network_id) {
            fill_from_view(n, v, underlay);
        }
    }
    // Ingress ports first (every node forwards them), then the host-mode ports of this node's running
    // tasks; a port already taken (the scheduler and allocator keep them apart) is not forwarded twice.
    let mut published: BTreeMap<(Protocol, u16), PublishedPort> = BTreeMap::new();
    if let Some(i) = ingress.as_ref().filter(|i| networks.contains_key(&i.network_id)) {
        add_ingress_ports(&mut published, view, i, networks[&i.network_id].subnet);
        state.ingress = Some(i.clone());
    }
    add_host_ports(&mut published, plumbed, assigned, &networks);
    state.published = published.into_values().collect();
    for (id, t) in plumbed {
        if t.attachments.iter().any(|(n, _)| !networks.contains_key(&n.id)) {
            continue;
        }
        state.tasks.push(TaskState {
            task_id: id.clone(),
            netns: t.netns.clone(),
            attachments: t.attachments.iter().map(|(_, a)| a.clone()).collect(),
            joined: t.joined,
        });
    }
    state.networks = networks.into_values().collect();
    state
}

/// The networks the node carries, by ID (those of its plumbed tasks, the ingress network, those of its
/// assigned tasks that hold a network, in that order: the first copy of a network seen is kept), and the
/// node's own address on the ingress network (the routing mesh).
fn carried_networks(
    underlay: Option<Ipv4Addr>,
    plumbed: &BTreeMap<String, PlumbedTask>,
    assigned: &HashMap<String, Arc<Task>>,
    view: &NodeNetworkView,
) -> (BTreeMap<String, NetworkState>, Option<NodeIngress>) {
    let mut networks: BTreeMap<String, NetworkState> = BTreeMap::new();
    // Only networks the manager's view lists: the view is what says which nodes' addresses lie in their
    // subnets, and an assignment can arrive before the view that names such an overlap.
    let viewed: std::collections::BTreeSet<&str> = view.networks.iter().map(|v| v.network_id.as_str()).collect();
    let mut add = |n: &Network| {
        if !networks.contains_key(&n.id) && viewed.contains(n.id.as_str()) {
            if let Ok(s) = network_state(n) {
                if !s.encrypted && overlap_reason(&s, underlay, view).is_none() {
                    networks.insert(n.id.clone(), s);
                }
            }
        }
    };
    for t in plumbed.values() {
        for (n, _) in &t.attachments {
            add(n);
        }
    }
    // The routing mesh: the node's own address on the ingress network.
    let ingress = view.ingress.as_ref().and_then(|a| {
        let n = a.network.as_ref()?;
        let address: Ipv4Addr = a.addresses.first()?.split('/').next()?.parse().ok()?;
        add(n);
        Some(NodeIngress { network_id: n.id.clone(), address })
    });
    let mut ids: Vec<&String> = assigned.keys().collect();
    ids.sort();
    for id in ids {
        let t = &assigned[id];
        if holds_network(t) {
            for n in t.overlay_attachments().filter_map(|a| a.network.as_ref()) {
                add(n);
            }
        }
    }
    (networks, ingress)
}

/// Network `n`'s peers (the tasks on other nodes) and services, from the manager's view `v` of it; only
/// addresses in its subnet are kept.
fn fill_from_view(n: &mut NetworkState, v: &NetworkPeers, underlay: Option<Ipv4Addr>) {
    n.peers = v
        .peers
        .iter()
        .filter_map(|p| {
            let address: Ipv4Addr = p.address.parse().ok()?;
            let node_ip: Ipv4Addr = p.node_addr.parse().ok()?;
            let address6 = p.address6.parse().ok().filter(|a| n.ipv6.is_some_and(|s| s.holds_host(*a)));
            (n.contains(address) && Some(node_ip) != underlay).then(|| Peer {
                address,
                mac: mac_for(address),
                node_ip,
                address6,
            })
        })
        .collect();
    n.services = v
        .services
        .iter()
        .filter(|s| !s.name.is_empty())
        .map(|s| ServiceVip {
            service_id: s.service_id.clone(),
            name: s.name.clone(),
            aliases: s.aliases.clone(),
            vip: s.vip.parse().ok().filter(|ip| n.contains(*ip)),
            backends: s.backends.iter().filter_map(|b| b.parse().ok()).filter(|ip| n.contains(*ip)).collect(),
            backends6: s.backends6.iter().filter_map(|b| b.parse().ok()).filter(|ip| n.contains6(*ip)).collect(),
        })
        .collect();
}

/// Adds the published ports of the services on the ingress network `i` (whose subnet is `subnet`), as the
/// view lists them, to `published`, with their backends in the subnet.
fn add_ingress_ports(
    published: &mut BTreeMap<(Protocol, u16), PublishedPort>,
    view: &NodeNetworkView,
    i: &NodeIngress,
    subnet: Ipv4Cidr,
) {
    for s in view.networks.iter().filter(|v| v.network_id == i.network_id).flat_map(|v| &v.services) {
        for p in &s.ingress_ports {
            let proto = match WireProtocol::try_from(p.protocol) {
                Ok(WireProtocol::Tcp) => Protocol::Tcp,
                Ok(WireProtocol::Udp) => Protocol::Udp,
                _ => continue,
            };
            let (Ok(port), Ok(target_port)) = (u16::try_from(p.published_port), u16::try_from(p.target_port)) else {
                continue;
            };
            let backends = s.backends.iter().filter_map(|b| b.parse().ok()).filter(|ip| subnet.contains(*ip)).collect();
            published.entry((proto, port)).or_insert(PublishedPort { protocol: proto, port, target_port, backends });
        }
    }
}

/// Adds the host-mode ports of the plumbed tasks that hold a network to `published`, each to its task's
/// address on a carried network (`networks`).
fn add_host_ports(
    published: &mut BTreeMap<(Protocol, u16), PublishedPort>,
    plumbed: &BTreeMap<String, PlumbedTask>,
    assigned: &HashMap<String, Arc<Task>>,
    networks: &BTreeMap<String, NetworkState>,
) {
    for id in plumbed.keys() {
        let Some(t) = assigned.get(id) else { continue };
        if !holds_network(t) {
            continue;
        }
        let Some(backend) = host_port_backend(t) else { continue };
        for p in t.endpoint.iter().flat_map(|e| &e.ports).filter(|p| p.publish_mode == PublishMode::Host as i32) {
            let (Some(proto), Ok(port), Ok(target_port)) =
                (port_protocol(p), u16::try_from(p.published_port), u16::try_from(p.target_port))
            else {
                continue;
            };
            if port == 0 || !networks.values().any(|n| n.contains(backend)) {
                continue;
            }
            published.entry((proto, port)).or_insert(PublishedPort {
                protocol: proto,
                port,
                target_port,
                backends: vec![backend],
            });
        }
    }
}

#[cfg(test)]
mod tests;
