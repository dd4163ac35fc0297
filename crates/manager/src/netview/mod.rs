//! The data-plane view each node gets from its manager (Shoal's own `shoal.v1.NetworkView` service, on the
//! remote port next to the dispatcher). SwarmKit's agents learn, through libnetwork's gossip, where the other
//! tasks of their overlay networks live and which tasks back each service; Shoal's manager computes that from
//! the store instead and streams it to each node, without touching any `docker.swarmkit.v1` message (a stock
//! Docker Engine agent never calls this service).
//!
//! `node_view` (pure, over a store view) is the whole rule: the networks a node is on are those of its tasks
//! that are assigned and not yet stopped; for each, the peers are the same network's task addresses on other
//! nodes (each with that node's underlay address: its data path address when it reports one, else
//! `Node.status.addr`, the address its session comes from)
//! and the services are those attached to it, with their VIP there and the addresses of their tasks that run
//! and are meant to run (a task told to stop leaves its service's backends at once, before it stops). It
//! also lists the nodes' own addresses that lie inside those networks' subnets (`overlapping_node_addrs`),
//! so the node refuses to carry such a network rather than route its underlay traffic into the overlay.
//! `service.rs` serves it: a whole view at once and again after each change, computed from the store's watch
//! (not polled), at most one computation per `MIN_RECOMPUTE_INTERVAL_MS` per stream, sent only when it differs.
//!
//! Must not know the agent, the data plane's devices or TLS (the caller's node comes from the authorization
//! layer's `PeerIdentity`).

mod service;

use std::collections::{BTreeMap, BTreeSet};

use shoal_api::shoal_v1::{MeshPort, NetworkPeers, NodeNetworkView, RemotePeer, ServiceBackends};
use shoal_api::{
    endpoint_spec::ResolutionMode, port_config::PublishMode, NetworkAttachment, Node, Service, Task, TaskState,
};
use shoal_store::Tables;

pub(crate) use service::NetworkViewService;
pub(crate) use shoal_api::shoal_v1::network_view_server::NetworkViewServer;

/// A task still holds its address on a node: assigned there and not stopped (its namespace may exist).
fn holds_address(t: &Task) -> bool {
    let s = TaskState::from_wire(t.status.as_ref().map_or(0, |s| s.state));
    !t.node_id.is_empty() && s as i32 >= TaskState::Assigned as i32 && !s.is_terminal()
}

/// A task backs its service: it runs and is meant to keep running.
fn is_backend(t: &Task) -> bool {
    let s = TaskState::from_wire(t.status.as_ref().map_or(0, |s| s.state));
    s == TaskState::Running && t.desired_state <= TaskState::Running as i32 && !t.node_id.is_empty()
}

/// The task's addresses on network `network_id`, without their prefix lengths: its IPv4 one, and its IPv6 one
/// on an `--ipv6` network (the attachment's second address; empty otherwise).
fn addresses_on(t: &Task, network_id: &str) -> Option<(String, String)> {
    let a = t.networks.iter().find(|a| a.network.as_ref().is_some_and(|n| n.id == network_id))?;
    let ip = a.addresses.first()?.split('/').next().unwrap_or_default().parse::<std::net::Ipv4Addr>().ok()?;
    let ip6 = a.addresses.iter().skip(1).find_map(|s| s.split('/').next()?.parse::<std::net::Ipv6Addr>().ok());
    Some((ip.to_string(), ip6.map(|ip| ip.to_string()).unwrap_or_default()))
}

/// A node's underlay address, when the store knows one: the data path address it reports
/// (`shoal_api::SHOAL_DATA_PATH_ADDR_LABEL`, from `--data-path-addr`), else the address its session comes from.
fn node_addr(t: &Tables, node_id: &str) -> Option<String> {
    t.nodes().get(node_id)?.underlay_addr().map(|ip| ip.to_string())
}

/// The networks a service is attached to, with its aliases on each.
fn service_networks(s: &Service) -> BTreeMap<&str, Vec<String>> {
    let spec = s.spec.as_ref();
    let configs = spec
        .and_then(|s| s.task.as_ref())
        .map(|t| t.networks.as_slice())
        .filter(|n| !n.is_empty())
        .or_else(|| spec.map(|s| s.networks.as_slice()))
        .unwrap_or_default();
    let mut out: BTreeMap<&str, Vec<String>> = configs.iter().map(|c| (c.target.as_str(), c.aliases.clone())).collect();
    // The ingress network is on the endpoint only (a VIP there), never in the spec.
    for vip in s.endpoint.iter().flat_map(|e| e.virtual_ips.iter()) {
        out.entry(vip.network_id.as_str()).or_default();
    }
    out
}

/// The service's VIP on `network_id` (`None` in DNSRR mode or before the allocator gave one).
fn vip_on(s: &Service, network_id: &str) -> Option<String> {
    let mode = s.spec.as_ref().and_then(|s| s.endpoint.as_ref()).map_or(0, |e| e.mode);
    if mode == ResolutionMode::Dnsrr as i32 {
        return None;
    }
    let vip = s.endpoint.as_ref()?.virtual_ips.iter().find(|v| v.network_id == network_id)?;
    let ip = vip.addr.split('/').next().unwrap_or_default();
    ip.parse::<std::net::Ipv4Addr>().ok().map(|ip| ip.to_string())
}

/// The ports `s` publishes in ingress mode (numbers allocated), as the routing mesh forwards them.
fn ingress_ports(s: &Service) -> Vec<MeshPort> {
    s.endpoint
        .iter()
        .flat_map(|e| e.ports.iter())
        .filter(|p| p.publish_mode == PublishMode::Ingress as i32 && p.published_port != 0)
        .map(|p| MeshPort { protocol: p.protocol, published_port: p.published_port, target_port: p.target_port })
        .collect()
}

/// The node's attachment to network `ingress` (allocated by the allocator), when it has an address.
fn ingress_attachment<'a>(n: &'a Node, ingress: &str) -> Option<&'a NetworkAttachment> {
    n.attachments.iter().find(|a| a.network.as_ref().is_some_and(|net| net.id == ingress) && !a.addresses.is_empty())
}

/// What node `node_id` needs for its data plane (see the module doc). Deterministic: networks by ID, peers
/// by address, services by name, backends by address.
pub(crate) fn node_view(t: &Tables, node_id: &str) -> NodeNetworkView {
    let mut view = NodeNetworkView {
        node_addr: node_addr(t, node_id).unwrap_or_default(),
        vxlan_udp_port: t
            .clusters()
            .iter()
            .next()
            .map_or(0, |c| u32::from(crate::controlapi::network::data_path_port(c))),
        ..Default::default()
    };
    let mut on: BTreeSet<String> = t
        .tasks()
        .by_node(node_id)
        .filter(|t| holds_address(t))
        .flat_map(|t| t.overlay_attachments().filter_map(|a| a.network.as_ref().map(|n| n.id.clone())))
        .collect();
    // The routing mesh: once a service publishes a port in ingress mode, every node carries the ingress
    // network with its own address there (its `Node.attachments` entry).
    let ingress = t.networks().iter().find(|n| n.spec.as_ref().is_some_and(|s| s.ingress)).map(|n| n.id.clone());
    if let Some(ingress) = &ingress {
        let meshed = t.services().iter().any(|s| !ingress_ports(s).is_empty());
        let own = t.nodes().get(node_id).and_then(|n| ingress_attachment(n, ingress).cloned());
        if let (true, Some(own)) = (meshed, own) {
            on.insert(ingress.clone());
            view.ingress = Some(own);
        }
    }
    // Against the networks of every task the node has, ended ones too: a task that just ended may still be
    // plumbed there for a moment, and its network must not be carried meanwhile.
    let mut networks = on.clone();
    networks.extend(
        t.tasks()
            .by_node(node_id)
            .flat_map(|t| t.overlay_attachments().filter_map(|a| a.network.as_ref().map(|n| n.id.clone()))),
    );
    view.overlapping_node_addrs = overlapping_node_addrs(t, &networks);
    if on.is_empty() {
        return view;
    }
    // Network -> task address -> (its node's address, the task's IPv6 address or "").
    let mut peers: BTreeMap<&str, BTreeMap<String, (String, String)>> = BTreeMap::new();
    // Other nodes' ingress addresses: the sources of what they forward to this node's tasks.
    if let (Some(ingress), true) = (&ingress, view.ingress.is_some()) {
        for n in t.nodes().iter().filter(|n| n.id != node_id) {
            let (Some(a), Some(addr)) = (ingress_attachment(n, ingress), node_addr(t, &n.id)) else { continue };
            if let Some(ip) = a.addresses.first().and_then(|s| s.split('/').next()?.parse::<std::net::Ipv4Addr>().ok())
            {
                peers.entry(ingress.as_str()).or_default().insert(ip.to_string(), (addr, String::new()));
            }
        }
    }
    for task in t.tasks().iter().filter(|t| t.node_id != node_id && holds_address(t)) {
        let Some(addr) = node_addr(t, &task.node_id) else { continue };
        for n in on.iter().map(String::as_str) {
            if let Some((ip, ip6)) = addresses_on(task, n) {
                peers.entry(n).or_default().insert(ip, (addr.clone(), ip6));
            }
        }
    }
    let mut services: BTreeMap<String, Vec<ServiceBackends>> = BTreeMap::new();
    for s in t.services().iter() {
        let name = s.spec.as_ref().and_then(|s| s.annotations.as_ref()).map_or("", |a| a.name.as_str());
        for (n, aliases) in service_networks(s) {
            if !on.contains(n) {
                continue;
            }
            let (mut backends, mut backends6): (Vec<String>, Vec<String>) =
                t.tasks().by_service(&s.id).filter(|t| is_backend(t)).filter_map(|t| addresses_on(t, n)).unzip();
            backends6.retain(|b| !b.is_empty());
            backends.sort_by_key(|b| b.parse::<std::net::Ipv4Addr>().ok());
            backends.dedup();
            backends6.sort_by_key(|b| b.parse::<std::net::Ipv6Addr>().ok());
            backends6.dedup();
            services.entry(n.to_string()).or_default().push(ServiceBackends {
                service_id: s.id.clone(),
                name: name.to_string(),
                vip: vip_on(s, n).unwrap_or_default(),
                backends,
                aliases,
                ingress_ports: if ingress.as_deref() == Some(n) { ingress_ports(s) } else { Vec::new() },
                backends6,
            });
        }
    }
    for n in &on {
        let mut svcs = services.remove(n).unwrap_or_default();
        svcs.sort_by(|a, b| (&a.name, &a.service_id).cmp(&(&b.name, &b.service_id)));
        let mut ps: Vec<RemotePeer> = peers
            .remove(n.as_str())
            .unwrap_or_default()
            .into_iter()
            .map(|(address, (node_addr, address6))| RemotePeer { address, node_addr, address6 })
            .collect();
        ps.sort_by_key(|p| p.address.parse::<std::net::Ipv4Addr>().ok());
        view.networks.push(NetworkPeers { network_id: n.clone(), peers: ps, services: svcs });
    }
    view
}

/// Every node's own addresses (`Node.status.addr`, the manager's advertised address, its data path address)
/// that lie inside a
/// subnet of one of the networks `on`, sorted. Costs nodes x subnets containment tests (the networks of one
/// node's tasks).
fn overlapping_node_addrs(t: &Tables, on: &BTreeSet<String>) -> Vec<String> {
    let subnets: Vec<shoal_store::cidr::Cidr> = on
        .iter()
        .filter_map(|id| t.networks().get(id))
        .flat_map(|n| n.ipam.iter().flat_map(|i| i.configs.iter()))
        .filter_map(|c| c.subnet.parse().ok())
        .collect();
    if subnets.is_empty() {
        return Vec::new();
    }
    let parse =
        |a: &str| a.parse::<std::net::IpAddr>().ok().or_else(|| a.parse::<std::net::SocketAddr>().ok().map(|s| s.ip()));
    let mut out: Vec<std::net::IpAddr> = t
        .nodes()
        .iter()
        .flat_map(|n| {
            let status = n.status.as_ref().and_then(|s| parse(&s.addr));
            let manager = n.manager_status.as_ref().and_then(|m| parse(&m.addr));
            [status, manager, n.data_path_addr()].into_iter().flatten()
        })
        .filter(|ip| !ip.is_unspecified() && subnets.iter().any(|s| s.offset_of(*ip).is_some()))
        .collect();
    out.sort();
    out.dedup();
    out.into_iter().map(|ip| ip.to_string()).collect()
}

#[cfg(test)]
mod tests;
