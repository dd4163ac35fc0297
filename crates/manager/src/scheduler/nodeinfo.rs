//! `NodeInfo`: what the scheduler knows of one node: the node, its tasks that still hold resources
//! (assigned there and not terminal, see `holds_resources`), counted in total and per service, the resources
//! left, and what every pass reads, computed once per node version: the ready-and-active flag and an
//! ordering key of the node ID. Kept between passes in a `NodeSet` (`nodeset`), which updates it from store
//! commits; a pass updates it in memory as it assigns tasks and takes its placements back at the end.
//!
//! Must not depend on the store's mutation API or on IO.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use shoal_api::node_spec::Availability;
use shoal_api::{generic, generic_resource, node_status, GenericResource, Node, Task};

use crate::tasks::observed_state;

/// CPU and memory, as in `Resources` (nano CPUs, bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Amount {
    /// CPU in units of 1e-9 CPUs.
    pub nano_cpus: i64,
    /// Memory in bytes.
    pub memory_bytes: i64,
}

impl Amount {
    /// The reservations a task asks for (zero when it sets none).
    pub fn reserved_by(t: &Task) -> Amount {
        let r = t.spec.as_ref().and_then(|s| s.resources.as_ref()).and_then(|r| r.reservations.as_ref());
        r.map(|r| Amount { nano_cpus: r.nano_cpus, memory_bytes: r.memory_bytes }).unwrap_or_default()
    }

    /// The resources a node offers (zero when it reports none).
    pub fn offered_by(n: &Node) -> Amount {
        let r = n.description.as_ref().and_then(|d| d.resources.as_ref());
        r.map(|r| Amount { nano_cpus: r.nano_cpus, memory_bytes: r.memory_bytes }).unwrap_or_default()
    }

    /// True when `self` covers `need`.
    pub fn covers(&self, need: &Amount) -> bool {
        self.nano_cpus >= need.nano_cpus && self.memory_bytes >= need.memory_bytes
    }

    /// True when nothing is asked for.
    pub fn is_zero(&self) -> bool {
        self.nano_cpus <= 0 && self.memory_bytes <= 0
    }

    /// The sum of both.
    pub fn plus(self, o: Amount) -> Amount {
        Amount {
            nano_cpus: self.nano_cpus.wrapping_add(o.nano_cpus),
            memory_bytes: self.memory_bytes.wrapping_add(o.memory_bytes),
        }
    }

    /// `self` less `o`.
    pub fn minus(self, o: Amount) -> Amount {
        Amount {
            nano_cpus: self.nano_cpus.wrapping_sub(o.nano_cpus),
            memory_bytes: self.memory_bytes.wrapping_sub(o.memory_bytes),
        }
    }
}

/// The generic resources a task reserves, by kind (`Reservations.GenericResources`: counts only, as the
/// control API accepts them).
pub(crate) fn generic_need(t: &Task) -> Vec<(&str, i64)> {
    let r = t.spec.as_ref().and_then(|s| s.resources.as_ref()).and_then(|r| r.reservations.as_ref());
    let Some(r) = r else { return Vec::new() };
    r.generic
        .iter()
        .filter_map(|g| match &g.resource {
            Some(generic_resource::Resource::DiscreteResourceSpec(d)) if d.value > 0 => {
                Some((d.kind.as_str(), d.value))
            }
            _ => None,
        })
        .collect()
}

/// What a node offers of one generic kind.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Offered {
    /// A count of interchangeable units.
    Count(i64),
    /// Named units, each given to one task at a time, in the order the node lists them.
    Named(Vec<String>),
}

/// The generic resources a node offers, by kind (empty for most nodes: no allocation).
fn generic_offer(n: &Node) -> BTreeMap<String, Offered> {
    let mut offer = BTreeMap::new();
    let generic = n.description.as_ref().and_then(|d| d.resources.as_ref()).map(|r| r.generic.as_slice());
    for g in generic.unwrap_or(&[]) {
        match &g.resource {
            Some(generic_resource::Resource::DiscreteResourceSpec(d)) => {
                offer.insert(d.kind.clone(), Offered::Count(d.value));
            }
            Some(generic_resource::Resource::NamedResourceSpec(r)) => {
                match offer.entry(r.kind.clone()).or_insert_with(|| Offered::Named(Vec::new())) {
                    Offered::Named(names) => names.push(r.value.clone()),
                    // A kind offered both ways: the count stands (the agent's parser refuses this).
                    Offered::Count(_) => {}
                }
            }
            None => {}
        }
    }
    offer
}

/// Generic resources held by a node's tasks, of one kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Claimed {
    /// Units of a counted kind.
    pub count: i64,
    /// Named units in use.
    pub names: BTreeSet<String>,
}

/// True when the task counts on its node: it has a node and its observed state is not terminal.
pub(crate) fn holds_resources(t: &Task) -> bool {
    !t.node_id.is_empty() && !observed_state(t).is_terminal()
}

/// True when the node is READY and its availability is ACTIVE (not paused or drained).
pub fn is_ready_and_active(n: &Node) -> bool {
    let ready = n.status.as_ref().map(|s| s.state()) == Some(node_status::State::Ready);
    let active = n.spec.as_ref().map(|s| s.availability()).unwrap_or(Availability::Active) == Availability::Active;
    ready && active
}

/// The first 16 bytes of a node ID as a big-endian number, zero-padded. Comparing two keys gives the order
/// of the IDs whenever the keys differ; equal keys need the full IDs.
pub(crate) fn id_order_key(id: &str) -> u128 {
    let mut b = [0u8; 16];
    let n = id.len().min(16);
    b[..n].copy_from_slice(&id.as_bytes()[..n]);
    u128::from_be_bytes(b)
}

/// What the tasks holding resources on one node add up to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskLoad {
    /// Number of tasks.
    pub total: usize,
    /// The same, per service ID (services with no task are absent).
    pub by_service: HashMap<String, usize>,
    /// Their reservations, summed.
    pub reserved: Amount,
    /// The generic resources assigned to them, by kind (`Task.assigned_generic_resources`).
    pub generic: BTreeMap<String, Claimed>,
    /// Host-mode published ports they hold, (protocol, port) -> tasks (`HostPortFilter`).
    pub host_ports: HashMap<(i32, u32), usize>,
}

/// The host-mode ports a task publishes with a number (those it holds on its node).
pub(crate) fn host_ports(t: &Task) -> impl Iterator<Item = (i32, u32)> + '_ {
    let ports = t.endpoint.as_ref().map(|e| e.ports.as_slice()).unwrap_or(&[]);
    ports
        .iter()
        .filter(|p| p.publish_mode == shoal_api::port_config::PublishMode::Host as i32 && p.published_port != 0)
        .map(|p| (p.protocol, p.published_port))
}

impl TaskLoad {
    /// Counts a task; returns its reservations.
    pub fn add(&mut self, t: &Task) -> Amount {
        self.total += 1;
        // Look up before inserting: the service ID is copied only the first time a node sees the service.
        match self.by_service.get_mut(&t.service_id) {
            Some(n) => *n += 1,
            None => {
                self.by_service.insert(t.service_id.clone(), 1);
            }
        }
        let r = Amount::reserved_by(t);
        self.reserved = self.reserved.plus(r);
        self.claim(&t.assigned_generic_resources);
        self.hold_host_ports(t);
        r
    }

    /// Counts the task's host-mode ports.
    pub fn hold_host_ports(&mut self, t: &Task) {
        for key in host_ports(t) {
            *self.host_ports.entry(key).or_default() += 1;
        }
    }

    /// Takes back what `hold_host_ports` of the same task counted.
    pub fn release_host_ports(&mut self, t: &Task) {
        for key in host_ports(t) {
            if let Some(n) = self.host_ports.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    self.host_ports.remove(&key);
                }
            }
        }
    }

    /// Takes back what `add` of the same task counted.
    pub fn remove(&mut self, t: &Task) {
        self.remove_many(&t.service_id, 1, Amount::reserved_by(t));
        self.release(&t.assigned_generic_resources);
        self.release_host_ports(t);
    }

    /// Counts generic resources as held.
    pub fn claim(&mut self, resources: &[GenericResource]) {
        for g in resources {
            match &g.resource {
                Some(generic_resource::Resource::DiscreteResourceSpec(d)) => {
                    self.generic.entry(d.kind.clone()).or_default().count += d.value;
                }
                Some(generic_resource::Resource::NamedResourceSpec(r)) => {
                    self.generic.entry(r.kind.clone()).or_default().names.insert(r.value.clone());
                }
                None => {}
            }
        }
    }

    /// Takes back what `claim` of the same resources counted.
    pub fn release(&mut self, resources: &[GenericResource]) {
        for g in resources {
            let kind = generic::kind(g);
            let Some(c) = self.generic.get_mut(kind) else { continue };
            match &g.resource {
                Some(generic_resource::Resource::DiscreteResourceSpec(d)) => c.count -= d.value,
                Some(generic_resource::Resource::NamedResourceSpec(r)) => {
                    c.names.remove(&r.value);
                }
                None => {}
            }
            if c.count == 0 && c.names.is_empty() {
                self.generic.remove(kind);
            }
        }
    }

    /// Takes back what `add` counted for `tasks` tasks of `service_id` that reserved `reserved` in all.
    pub fn remove_many(&mut self, service_id: &str, tasks: usize, reserved: Amount) {
        debug_assert!(self.total >= tasks, "{tasks} tasks of {service_id} removed from a load of {}", self.total);
        self.total = self.total.saturating_sub(tasks);
        if let Some(n) = self.by_service.get_mut(service_id) {
            *n = n.saturating_sub(tasks);
            if *n == 0 {
                self.by_service.remove(service_id);
            }
        }
        self.reserved = self.reserved.minus(reserved);
    }

    /// True when no task is counted.
    pub fn is_empty(&self) -> bool {
        self.total == 0
            && self.by_service.is_empty()
            && self.reserved == Amount::default()
            && self.generic.is_empty()
            && self.host_ports.is_empty()
    }
}

/// One node as the scheduler sees it.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    node: Arc<Node>,
    ready_active: bool,
    order_key: u128,
    capacity: Amount,
    generic: BTreeMap<String, Offered>,
    load: TaskLoad,
}

impl NodeInfo {
    /// The info of `node` carrying `load`.
    pub fn new(node: Arc<Node>, load: TaskLoad) -> NodeInfo {
        NodeInfo {
            ready_active: is_ready_and_active(&node),
            order_key: id_order_key(&node.id),
            capacity: Amount::offered_by(&node),
            generic: generic_offer(&node),
            load,
            node,
        }
    }

    /// Replaces the node (a new version of the same ID), keeping the task counts.
    pub fn set_node(&mut self, node: Arc<Node>) {
        debug_assert_eq!(node.id, self.node.id);
        self.ready_active = is_ready_and_active(&node);
        self.capacity = Amount::offered_by(&node);
        self.generic = generic_offer(&node);
        self.node = node;
    }

    /// Counts a task placed on this node; returns its reservations.
    pub fn add_task(&mut self, t: &Task) -> Amount {
        self.load.add(t)
    }

    /// Counts a task placed on this node by the scheduler and gives it the generic resources it reserves (which
    /// must fit: `generic_fits`); returns its reservations and those resources, for `Task.assigned_generic_resources`.
    pub fn place_task(&mut self, t: &Task) -> (Amount, Vec<GenericResource>) {
        let claims = self.claim_generic(t);
        let reserved = self.load.add(t);
        self.load.claim(&claims);
        (reserved, claims)
    }

    /// Counts generic resources given to a task already counted here (a pre-assigned task the pass placed).
    pub fn claim(&mut self, resources: &[GenericResource]) {
        self.load.claim(resources);
    }

    /// Takes back what `claim` (or `place_task`) counted of generic resources.
    pub fn release(&mut self, resources: &[GenericResource]) {
        self.load.release(resources);
    }

    /// True when the node has, unclaimed, every generic resource in `need` (kind, count).
    pub fn generic_fits(&self, need: &[(&str, i64)]) -> bool {
        need.iter().all(|&(kind, n)| {
            let claimed = self.load.generic.get(kind);
            match self.generic.get(kind) {
                Some(Offered::Count(c)) => c - claimed.map_or(0, |c| c.count) >= n,
                Some(Offered::Named(names)) => {
                    let free = names.iter().filter(|v| !claimed.is_some_and(|c| c.names.contains(*v))).count();
                    free as i64 >= n
                }
                None => false,
            }
        })
    }

    /// The generic resources the scheduler gives `t` here: its counts of counted kinds, and the first free
    /// named units (in the node's order) of named kinds.
    pub fn claim_generic(&self, t: &Task) -> Vec<GenericResource> {
        let mut claims = Vec::new();
        for (kind, n) in generic_need(t) {
            let claimed = self.load.generic.get(kind);
            match self.generic.get(kind) {
                Some(Offered::Count(_)) => claims.push(generic::discrete(kind, n)),
                Some(Offered::Named(names)) => claims.extend(
                    names
                        .iter()
                        .filter(|v| !claimed.is_some_and(|c| c.names.contains(*v)))
                        .take(usize::try_from(n).unwrap_or(usize::MAX))
                        .map(|v| generic::named(kind, v)),
                ),
                None => {}
            }
        }
        claims
    }

    /// Takes back what `add_task` of the same task counted.
    pub fn remove_task(&mut self, t: &Task) {
        self.load.remove(t);
    }

    /// True when a task here holds host-mode `port` of `protocol`.
    pub fn host_port_taken(&self, protocol: i32, port: u32) -> bool {
        self.load.host_ports.contains_key(&(protocol, port))
    }

    /// Takes back the host-mode ports `place_task` of `t` counted (a pass's own placement).
    pub fn take_back_host_ports(&mut self, t: &Task) {
        self.load.release_host_ports(t);
    }

    /// Takes back `tasks` placements of `service_id` that reserved `reserved` in all (a pass's own).
    pub fn take_back(&mut self, service_id: &str, tasks: usize, reserved: Amount) {
        self.load.remove_many(service_id, tasks, reserved);
    }

    /// The stored node.
    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// The node ID.
    pub fn id(&self) -> &str {
        &self.node.id
    }

    /// True when the node is READY and ACTIVE (computed when the node version was stored here).
    pub fn ready_active(&self) -> bool {
        self.ready_active
    }

    /// `id_order_key` of the node ID.
    pub fn order_key(&self) -> u128 {
        self.order_key
    }

    /// The node's resources minus the reservations of its tasks.
    pub fn available(&self) -> Amount {
        self.capacity.minus(self.load.reserved)
    }

    /// Tasks on the node that hold resources.
    pub fn total_tasks(&self) -> usize {
        self.load.total
    }

    /// Tasks of `service_id` on this node.
    pub fn service_tasks(&self, service_id: &str) -> usize {
        self.load.by_service.get(service_id).copied().unwrap_or(0)
    }

    /// The tasks counted on this node.
    pub fn load(&self) -> &TaskLoad {
        &self.load
    }

    pub(super) fn into_load(self) -> TaskLoad {
        self.load
    }
}
