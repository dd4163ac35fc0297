//! The allocator's sans-IO core: the address pools of every network and the ingress port space, kept in step
//! with the store commit by commit (`apply`), rebuilt from a whole view (`build`), and one pass (`pass`) that
//! allocates the endpoints of the services that need it (ingress ports, a virtual IP on each network in VIP
//! mode) and the network attachments of NEW tasks, which it moves to PENDING with their service's endpoint.
//!
//! What an object holds, from the store alone: a network its subnet; a service the VIPs and ingress ports of
//! its `endpoint`; a task the addresses of its `networks` while its observed state is at most RUNNING (a task
//! that stopped holds nothing, so history kept for `docker service ps` costs no address). `apply` reserves
//! what a changed object holds now and releases what it held before; the pass allocates only from what is
//! free, so an address is never given twice, on this leader or the next one (which builds from the store).
//!
//! Must not depend on IO or other subsystems.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use shoal_api::{
    endpoint, endpoint_spec, port_config, Endpoint, Network, NetworkAttachment, NetworkAttachmentConfig, Node,
    PortConfig, Service, Task, TaskState, TaskStatus,
};
use shoal_store::{spec_networks, ActionKind, Change, Object, StoreObject, Tables};

use super::ipam::{parse_address, AddressPool, NetworkPools};
use super::ports::PortSpace;
use crate::tasks::observed_state;

/// The status message of a task whose attachments are allocated (the scheduler's turn).
pub(crate) const ALLOCATED_MESSAGE: &str = "pending task scheduling";

/// Whether tasks of a service with this spec need the allocator before the scheduler (networks, or ports
/// whose numbers and holders the endpoint records). Those that do not are created PENDING directly.
pub(crate) fn needs_allocation(spec: Option<&shoal_api::ServiceSpec>) -> bool {
    spec.is_some_and(|s| spec_networks(s).next().is_some() || s.endpoint.as_ref().is_some_and(|e| !e.ports.is_empty()))
}

fn is_ingress_port(p: &PortConfig) -> bool {
    p.publish_mode == port_config::PublishMode::Ingress as i32
}

/// True when the task holds the addresses of its attachments (see the module doc).
fn holds_addresses(t: &Task) -> bool {
    observed_state(t) <= TaskState::Running
}

fn task_addresses(t: &Task) -> Vec<(String, IpAddr)> {
    if !holds_addresses(t) {
        return Vec::new();
    }
    let mut out = Vec::new();
    for a in &t.networks {
        let Some(n) = &a.network else { continue };
        out.extend(a.addresses.iter().filter_map(|s| parse_address(s)).map(|ip| (n.id.clone(), ip)));
    }
    out
}

/// The nodes whose own attachments a task change may change (`Allocator::allocate_nodes`): the task's node
/// before and after, when its node, whether it holds its addresses, or its networks changed.
pub(crate) fn nodes_to_revisit(ch: &Change) -> Vec<String> {
    fn key(t: &Task) -> (String, bool, Vec<&str>) {
        let nets: Vec<&str> = t.networks.iter().filter_map(|a| a.network.as_ref()).map(|n| n.id.as_str()).collect();
        (t.node_id.clone(), holds_addresses(t) && !nets.is_empty(), nets)
    }
    let old = match &ch.old {
        Some(Object::Task(o)) => Some(key(o)),
        _ => None,
    };
    let new = match (&ch.kind, &ch.object) {
        (ActionKind::Remove, _) => None,
        (_, Object::Task(t)) => Some(key(t)),
        _ => return Vec::new(),
    };
    if old == new {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (node, holds, _) in old.into_iter().chain(new) {
        if holds && !node.is_empty() && !out.contains(&node) {
            out.push(node);
        }
    }
    out
}

/// The addresses a node's own attachments hold (its ingress address, for the routing mesh), for as long as
/// the node exists.
fn node_addresses(n: &Node) -> Vec<(String, IpAddr)> {
    let mut out = Vec::new();
    for a in &n.attachments {
        let Some(net) = &a.network else { continue };
        out.extend(a.addresses.iter().filter_map(|s| parse_address(s)).map(|ip| (net.id.clone(), ip)));
    }
    out
}

fn service_vips(s: &Service) -> Vec<(String, IpAddr)> {
    let Some(e) = &s.endpoint else { return Vec::new() };
    e.virtual_ips.iter().filter_map(|v| Some((v.network_id.clone(), parse_address(&v.addr)?))).collect()
}

fn service_ports(s: &Service) -> Vec<(i32, u32)> {
    let Some(e) = &s.endpoint else { return Vec::new() };
    e.ports
        .iter()
        .filter(|p| is_ingress_port(p) && p.published_port != 0)
        .map(|p| (p.protocol, p.published_port))
        .collect()
}

/// The pools a network's IPAM options describe: one per config, in config order (`None` when it has no
/// config, or one that does not parse: the control API writes only valid ones).
pub(crate) fn network_pools(n: &Network) -> Option<NetworkPools> {
    let mut pools = Vec::new();
    for c in &n.ipam.as_ref()?.configs {
        let subnet = c.subnet.parse().ok()?;
        let range = if c.range.is_empty() { None } else { Some(c.range.parse().ok()?) };
        let gateway = if c.gateway.is_empty() { None } else { Some(c.gateway.parse().ok()?) };
        let mut pool = AddressPool::new(subnet, range, gateway)?;
        // Auxiliary addresses (`--aux-address`) are never handed out (those outside the IP range never would be).
        for ip in c.reserved.values().filter_map(|a| a.parse().ok()) {
            pool.reserve(ip);
        }
        pools.push(pool);
    }
    NetworkPools::new(pools)
}

fn network_name(n: &Network) -> &str {
    n.unique_name().unwrap_or(&n.id)
}

/// What one pass decided: objects to write, in that order (services first: their tasks copy the endpoint).
#[derive(Debug, Default)]
pub(crate) struct AllocatePass {
    /// Services with a new endpoint.
    pub services: Vec<Service>,
    /// Tasks moved to PENDING with their attachments, or left NEW with a new explanation.
    pub tasks: Vec<Task>,
    /// Nodes with a new ingress attachment (or without a stale one), written last.
    pub nodes: Vec<Node>,
    /// True when some task could not be allocated (retry every NEW task when capacity frees up).
    pub blocked: bool,
}

/// The address pools and ingress ports, in step with the store.
#[derive(Debug, Default)]
pub(crate) struct Allocator {
    pools: HashMap<String, NetworkPools>,
    ports: PortSpace,
    ingress: Option<String>,
    /// The node-local networks' IDs (`host`, `bridge`, macvlan, ipvlan: no pool, no VIP).
    predefined: BTreeSet<String>,
}

impl Allocator {
    /// Everything `tables` holds, reserved.
    pub(crate) fn build(tables: &Tables) -> Allocator {
        let mut a = Allocator::default();
        for n in tables.networks().iter() {
            a.add_network(n);
        }
        for s in tables.services().iter() {
            a.hold_service(&[], s);
        }
        for t in tables.tasks().iter() {
            a.hold(&[], &task_addresses(t));
        }
        for n in tables.nodes().iter() {
            a.hold(&[], &node_addresses(n));
        }
        a
    }

    /// Addresses left in network `network`'s pool.
    #[cfg(test)]
    pub(crate) fn free_addresses(&self, network: &str) -> Option<u64> {
        self.pools.get(network).map(|p| p.free())
    }

    /// IPv6 addresses left in network `network`'s pool (`None` without one).
    #[cfg(test)]
    pub(crate) fn free6_addresses(&self, network: &str) -> Option<u64> {
        self.pools.get(network).and_then(|p| p.free6())
    }

    /// The ingress network's ID, when the cluster has one.
    pub(crate) fn ingress(&self) -> Option<&str> {
        self.ingress.as_deref()
    }

    fn add_network(&mut self, n: &Network) {
        if n.spec.as_ref().is_some_and(|s| s.ingress) {
            self.ingress = Some(n.id.clone());
        }
        if n.node_local_driver().is_some() {
            self.predefined.insert(n.id.clone());
            return;
        }
        match network_pools(n) {
            Some(p) => {
                self.pools.insert(n.id.clone(), p);
            }
            None => tracing::warn!(network = %n.id, "network has no usable subnet; its tasks cannot be allocated"),
        }
    }

    /// Releases what `before` held and not `after`, and reserves what `after` holds.
    fn hold(&mut self, before: &[(String, IpAddr)], after: &[(String, IpAddr)]) -> bool {
        let mut freed = false;
        for (net, ip) in before.iter().filter(|b| !after.contains(b)) {
            if let Some(p) = self.pools.get_mut(net) {
                p.release(*ip);
                freed = true;
            }
        }
        for (net, ip) in after {
            if let Some(p) = self.pools.get_mut(net) {
                p.reserve(*ip);
            }
        }
        freed
    }

    fn hold_service(&mut self, before: &[&Service], after: &Service) -> bool {
        let old_vips: Vec<_> = before.iter().flat_map(|s| service_vips(s)).collect();
        let old_ports: Vec<_> = before.iter().flat_map(|s| service_ports(s)).collect();
        let new_ports = service_ports(after);
        let mut freed = self.hold(&old_vips, &service_vips(after));
        for (proto, port) in old_ports.iter().filter(|p| !new_ports.contains(p)) {
            self.ports.release(*proto, *port, &after.id);
            freed = true;
        }
        for (proto, port) in new_ports {
            if !self.ports.reserve(proto, port, &after.id) {
                tracing::error!(service = %after.id, port, "ingress port held by two services in the store");
            }
        }
        freed
    }

    /// Takes one committed change into account. True when it freed an address or a port.
    pub(crate) fn apply(&mut self, ch: &Change) -> bool {
        match (&ch.kind, &ch.object) {
            (ActionKind::Remove, Object::Network(n)) => {
                self.pools.remove(&n.id);
                self.predefined.remove(&n.id);
                if self.ingress.as_deref() == Some(&n.id) {
                    self.ingress = None;
                }
                true
            }
            (_, Object::Network(n)) => {
                if !self.pools.contains_key(&n.id) {
                    self.add_network(n);
                }
                false
            }
            (ActionKind::Remove, Object::Service(s)) => {
                let vips = service_vips(s);
                let mut freed = self.hold(&vips, &[]);
                for (proto, port) in service_ports(s) {
                    self.ports.release(proto, port, &s.id);
                    freed = true;
                }
                freed
            }
            (_, Object::Service(s)) => {
                let old = match &ch.old {
                    Some(Object::Service(o)) => vec![&**o],
                    _ => vec![],
                };
                self.hold_service(&old, s)
            }
            (kind, Object::Node(n)) => {
                let before = match &ch.old {
                    Some(Object::Node(o)) => node_addresses(o),
                    _ => Vec::new(),
                };
                let after = if *kind == ActionKind::Remove { Vec::new() } else { node_addresses(n) };
                self.hold(&before, &after)
            }
            (kind, Object::Task(t)) => {
                let before = match &ch.old {
                    Some(Object::Task(o)) => task_addresses(o),
                    _ => Vec::new(),
                };
                let after = if *kind == ActionKind::Remove { Vec::new() } else { task_addresses(t) };
                self.hold(&before, &after)
            }
            _ => false,
        }
    }

    /// Takes a whole commit into account; true when something was freed.
    #[cfg(test)]
    pub(crate) fn apply_commit(&mut self, c: &shoal_store::Commit) -> bool {
        let mut freed = false;
        for ch in &c.changes {
            freed |= self.apply(ch);
        }
        freed
    }

    /// The networks a service's endpoint has VIPs on: its own (VIP mode) and ingress when it publishes
    /// through it.
    fn vip_networks(&self, s: &Service) -> Vec<String> {
        let Some(spec) = &s.spec else { return Vec::new() };
        let ep = spec.endpoint.as_ref();
        if ep.is_some_and(|e| e.mode == endpoint_spec::ResolutionMode::Dnsrr as i32) {
            return Vec::new();
        }
        let mut nets: Vec<String> = Vec::new();
        if ep.is_some_and(|e| e.ports.iter().any(is_ingress_port)) {
            if let Some(i) = &self.ingress {
                nets.push(i.clone());
            }
        }
        for n in spec_networks(spec) {
            // A node-local network (`host`, `bridge`, macvlan, ipvlan) is each node's own: no VIP there.
            if !nets.iter().any(|x| x == n) && !self.predefined.contains(n) {
                nets.push(n.to_string());
            }
        }
        nets
    }

    /// True when the service's endpoint is what its spec asks for (nothing to allocate or free).
    pub(crate) fn endpoint_current(&self, s: &Service) -> bool {
        let Some(spec) = &s.spec else { return true };
        let want_spec = spec.endpoint.as_ref();
        let want_ports = want_spec.map(|e| e.ports.as_slice()).unwrap_or(&[]);
        let vip_nets = self.vip_networks(s);
        let Some(ep) = &s.endpoint else {
            return want_ports.is_empty() && vip_nets.is_empty();
        };
        if want_ports.is_empty() && vip_nets.is_empty() && ep.ports.is_empty() && ep.virtual_ips.is_empty() {
            return true;
        }
        let ports_match = ep.ports.len() == want_ports.len()
            && ep.ports.iter().zip(want_ports).all(|(have, want)| {
                have.name == want.name
                    && have.protocol == want.protocol
                    && have.target_port == want.target_port
                    && have.publish_mode == want.publish_mode
                    && (have.published_port == want.published_port
                        || (want.published_port == 0 && is_ingress_port(want) && have.published_port != 0))
            });
        let have_nets: BTreeSet<&str> = ep.virtual_ips.iter().map(|v| v.network_id.as_str()).collect();
        let want_nets: BTreeSet<&str> = vip_nets.iter().map(String::as_str).collect();
        ep.spec.as_ref() == want_spec && ports_match && have_nets == want_nets
    }

    /// Allocates `s`'s endpoint as its spec asks, keeping what it already holds; frees what it no longer
    /// needs only when the new endpoint is written (`apply` of that commit). On failure nothing is held.
    fn allocate_endpoint(&mut self, tables: &Tables, s: &Service) -> Result<Endpoint, String> {
        let spec = s.spec.as_ref().and_then(|sp| sp.endpoint.clone());
        let current = s.endpoint.clone().unwrap_or_default();
        let mut taken_ports: Vec<(i32, u32)> = Vec::new();
        let mut taken_ips: Vec<(String, IpAddr)> = Vec::new();
        let result = (|| {
            let mut ports = Vec::new();
            for p in spec.as_ref().map(|e| e.ports.as_slice()).unwrap_or(&[]) {
                let mut p = p.clone();
                if is_ingress_port(&p) {
                    if p.published_port == 0 {
                        let kept = current.ports.iter().find(|c| {
                            c.name == p.name
                                && c.protocol == p.protocol
                                && c.target_port == p.target_port
                                && is_ingress_port(c)
                                && c.published_port != 0
                                && !ports.iter().any(|q: &PortConfig| {
                                    q.protocol == c.protocol && q.published_port == c.published_port
                                })
                        });
                        p.published_port = match kept {
                            Some(c) => c.published_port,
                            None => {
                                let port = self.ports.allocate(p.protocol, &s.id).ok_or_else(|| {
                                    "no ingress port left in the dynamic range 30000-32767; publish a port number"
                                        .to_string()
                                })?;
                                taken_ports.push((p.protocol, port));
                                port
                            }
                        };
                    } else if !self.ports.reserve(p.protocol, p.published_port, &s.id) {
                        let holder = self.ports.holder(p.protocol, p.published_port).unwrap_or("");
                        let name = tables.services().get(holder).and_then(|h| h.unique_name()).unwrap_or(holder);
                        return Err(format!(
                            "port {} is already in use by service {name} as an ingress port",
                            p.published_port
                        ));
                    } else if !service_ports(s).contains(&(p.protocol, p.published_port)) {
                        taken_ports.push((p.protocol, p.published_port));
                    }
                }
                ports.push(p);
            }
            let mut vips = Vec::new();
            for net in self.vip_networks(s) {
                if let Some(v) = current.virtual_ips.iter().find(|v| v.network_id == net) {
                    vips.push(v.clone());
                    continue;
                }
                let name = tables.networks().get(&net).map_or(net.as_str(), |n| network_name(n)).to_string();
                let pool = self.pools.get_mut(&net).ok_or_else(|| format!("network {name} has no address pool"))?;
                let ip = pool.allocate().ok_or_else(|| format!("no IP address left in network {name}"))?;
                taken_ips.push((net.clone(), ip));
                vips.push(endpoint::VirtualIp { network_id: net.clone(), addr: pool.with_prefix(ip) });
            }
            Ok(Endpoint { spec: spec.clone(), ports, virtual_ips: vips })
        })();
        if result.is_err() {
            for (proto, port) in taken_ports {
                self.ports.release(proto, port, &s.id);
            }
            self.hold(&taken_ips, &[]);
        }
        result
    }

    /// Allocates `t`'s attachments (its networks, and ingress when `endpoint` publishes through it). On
    /// failure nothing is held and the error names the network.
    fn allocate_task(
        &mut self,
        tables: &Tables,
        t: &Task,
        endpoint: Option<&Endpoint>,
    ) -> Result<Vec<NetworkAttachment>, String> {
        // The networks with the aliases and driver options the spec gives each (none for ingress).
        let mut wanted: Vec<NetworkAttachmentConfig> = Vec::new();
        if endpoint.is_some_and(|e| e.ports.iter().any(is_ingress_port)) {
            if let Some(i) = &self.ingress {
                wanted.push(NetworkAttachmentConfig { target: i.clone(), ..Default::default() });
            }
        }
        for n in t.spec.as_ref().map(|s| s.networks.as_slice()).unwrap_or(&[]) {
            if !wanted.iter().any(|w| w.target == n.target) {
                wanted.push(n.clone());
            }
        }
        let mut out = Vec::with_capacity(wanted.len());
        let mut taken: Vec<(String, IpAddr)> = Vec::new();
        for NetworkAttachmentConfig { target: id, aliases, driver_attachment_opts, .. } in wanted {
            let found = tables.networks().get(&id);
            // A node-local network (`host`, `bridge`, macvlan, ipvlan): the node's own (its engine addresses
            // the task), so the attachment has no address.
            if let Some(network) = found.filter(|n| n.node_local_driver().is_some()) {
                out.push(NetworkAttachment {
                    network: Some((**network).clone()),
                    addresses: Vec::new(),
                    aliases,
                    driver_attachment_opts,
                });
                continue;
            }
            let pool = found.and_then(|_| self.pools.get_mut(&id));
            let (Some(network), Some(pool)) = (found, pool) else {
                self.hold(&taken, &[]);
                return Err(format!("network {id} not found"));
            };
            let Some(ip) = pool.allocate() else {
                self.hold(&taken, &[]);
                return Err(format!("no IP address left in network {}", network_name(network)));
            };
            taken.push((id.clone(), ip));
            let mut addresses = vec![pool.with_prefix(ip)];
            // An IPv6 network gives the task its IPv6 address too, second (the nodes read it there).
            if pool.has_v6() {
                let Some(ip6) = pool.allocate6() else {
                    self.hold(&taken, &[]);
                    return Err(format!("no IPv6 address left in network {}", network_name(network)));
                };
                taken.push((id.clone(), ip6));
                addresses.push(pool.with_prefix(ip6));
            }
            out.push(NetworkAttachment {
                network: Some((**network).clone()),
                addresses,
                aliases,
                driver_attachment_opts,
            });
        }
        Ok(out)
    }

    /// The networks node `node_id` needs an attachment of its own on (SwarmKit's `Node.attachments`): the
    /// ingress network, for its routing mesh, and every network with an address pool that a task on the node
    /// uses while that task holds its addresses (a Docker Engine worker takes the node's address there as the
    /// network's load-balancer endpoint, and waits for it before it starts the task).
    fn node_networks(&self, tables: &Tables, node_id: &str) -> Vec<String> {
        let mut nets: Vec<String> = self.ingress.iter().cloned().collect();
        for t in tables.tasks().by_node(node_id).filter(|t| holds_addresses(t)) {
            for n in t.networks.iter().filter_map(|a| a.network.as_ref()) {
                if self.pools.contains_key(&n.id) && !nets.contains(&n.id) {
                    nets.push(n.id.clone());
                }
            }
        }
        nets
    }

    /// Gives each of `nodes` (every node when `all`) an attachment to each network it needs
    /// (`node_networks`), keeping the addresses it has, and drops attachments it no longer needs (their
    /// addresses are freed when that write is applied). The routing mesh uses the ingress address as the
    /// source of what a node forwards to a service's tasks. A node waits (`blocked`) when a subnet is full.
    /// Bounded by the cluster's nodes and their tasks.
    pub(crate) fn allocate_nodes(
        &mut self,
        tables: &Tables,
        nodes: &BTreeSet<String>,
        all: bool,
        out: &mut AllocatePass,
    ) {
        let ids: Vec<String> =
            if all { tables.nodes().iter().map(|n| n.id.clone()).collect() } else { nodes.iter().cloned().collect() };
        for id in ids {
            let Some(node) = tables.nodes().get(&id) else { continue };
            let nets = self.node_networks(tables, &id);
            let needed = |a: &NetworkAttachment| {
                a.network.as_ref().is_some_and(|n| nets.contains(&n.id)) && !a.addresses.is_empty()
            };
            let mut want: Vec<NetworkAttachment> = node.attachments.iter().filter(|a| needed(a)).cloned().collect();
            for net in &nets {
                if want.iter().any(|a| a.network.as_ref().is_some_and(|n| &n.id == net)) {
                    continue;
                }
                let (Some(network), Some(pool)) = (tables.networks().get(net), self.pools.get_mut(net)) else {
                    continue;
                };
                let Some(ip) = pool.allocate() else {
                    tracing::warn!(node = %id, network = %network_name(network), "no address left for the node's own \
                                                                                  attachment");
                    out.blocked = true;
                    continue;
                };
                want.push(NetworkAttachment {
                    network: Some((**network).clone()),
                    addresses: vec![pool.with_prefix(ip)],
                    aliases: Vec::new(),
                    driver_attachment_opts: Default::default(),
                });
            }
            if want != node.attachments {
                let mut n2 = (**node).clone();
                n2.attachments = want;
                out.nodes.push(n2);
            }
        }
    }

    /// One pass over `services` (IDs whose endpoint may need allocating) and `tasks` (IDs of tasks that may
    /// be NEW; `all_new` adds every NEW task). `now` stamps new statuses.
    pub(crate) fn pass(
        &mut self,
        tables: &Tables,
        services: &BTreeSet<String>,
        tasks: &BTreeSet<String>,
        all_new: bool,
        now: shoal_api::prost_types::Timestamp,
    ) -> AllocatePass {
        let mut out = AllocatePass::default();
        // The endpoint each touched service has after this pass (or why it has none).
        let mut endpoints: BTreeMap<String, Result<Option<Endpoint>, String>> = BTreeMap::new();
        let mut candidates: BTreeSet<&str> = tasks.iter().map(String::as_str).collect();
        for id in services {
            let Some(s) = tables.services().get(id) else { continue };
            if self.endpoint_current(s) {
                continue;
            }
            match self.allocate_endpoint(tables, s) {
                Ok(e) => {
                    let mut s2 = (**s).clone();
                    s2.endpoint = Some(e.clone());
                    out.services.push(s2);
                    endpoints.insert(id.clone(), Ok(Some(e)));
                }
                Err(why) => {
                    tracing::warn!(service = %id, "cannot allocate the service's endpoint: {why}");
                    out.blocked = true;
                    endpoints.insert(id.clone(), Err(why));
                }
            }
            candidates.extend(
                tables.tasks().by_service(id).filter(|t| observed_state(t) == TaskState::New).map(|t| t.id.as_str()),
            );
        }
        let all: Vec<&Arc<Task>> = if all_new {
            tables.tasks().by_state(TaskState::New).collect()
        } else {
            candidates.iter().filter_map(|id| tables.tasks().get(id)).collect()
        };
        let mut seen = BTreeSet::new();
        for t in all.into_iter().chain(candidates.iter().filter_map(|id| tables.tasks().get(id))) {
            if !seen.insert(t.id.as_str())
                || observed_state(t) != TaskState::New
                || t.desired_state() > TaskState::Complete
            {
                continue;
            }
            // A network attachment (`resourceapi`) has no service and so no endpoint: only its network.
            let endpoint = if crate::tasks::is_attachment_task(t) {
                None
            } else {
                let Some(s) = tables.services().get(&t.service_id) else { continue };
                match endpoints.get(&s.id) {
                    Some(Ok(e)) => e.clone(),
                    Some(Err(why)) => {
                        explain(&mut out, t, why, now);
                        continue;
                    }
                    None if self.endpoint_current(s) => {
                        // Checked once per service and pass.
                        endpoints.insert(s.id.clone(), Ok(s.endpoint.clone()));
                        s.endpoint.clone()
                    }
                    None => {
                        // Not among the touched services (e.g. retried after capacity freed up): try it now.
                        match self.allocate_endpoint(tables, s) {
                            Ok(e) => {
                                let mut s2 = (**s).clone();
                                s2.endpoint = Some(e.clone());
                                out.services.push(s2);
                                endpoints.insert(s.id.clone(), Ok(Some(e.clone())));
                                Some(e)
                            }
                            Err(why) => {
                                out.blocked = true;
                                explain(&mut out, t, &why, now);
                                endpoints.insert(s.id.clone(), Err(why));
                                continue;
                            }
                        }
                    }
                }
            };
            match self.allocate_task(tables, t, endpoint.as_ref()) {
                Ok(networks) => {
                    let mut t2 = (**t).clone();
                    t2.networks = networks;
                    t2.endpoint = endpoint.map(Into::into);
                    t2.status = Some(TaskStatus {
                        timestamp: Some(now),
                        state: TaskState::Pending as i32,
                        message: ALLOCATED_MESSAGE.into(),
                        ..Default::default()
                    });
                    out.tasks.push(t2);
                }
                Err(why) => {
                    out.blocked = true;
                    explain(&mut out, t, &why, now);
                }
            }
        }
        out
    }
}

/// Leaves `t` NEW with `why` as its error (written only when it changes, so a retry writes nothing).
fn explain(out: &mut AllocatePass, t: &Task, why: &str, now: shoal_api::prost_types::Timestamp) {
    if t.status.as_ref().is_some_and(|s| s.err == why) {
        return;
    }
    let mut t2 = t.clone();
    let st = t2.status.get_or_insert_with(Default::default);
    st.err = why.to_string();
    st.timestamp = Some(now);
    out.tasks.push(t2);
}
