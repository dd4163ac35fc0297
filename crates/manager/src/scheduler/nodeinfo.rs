//! `NodeInfo`: what the scheduler knows of one node: the node, its tasks that still hold resources
//! (assigned there and not terminal, see `holds_resources`), counted in total and per service, the resources
//! left, and what every pass reads, computed once per node version: the ready-and-active flag and an
//! ordering key of the node ID. Kept between passes in a `NodeSet` (`nodeset`), which updates it from store
//! commits; a pass updates it in memory as it assigns tasks and takes its placements back at the end.
//!
//! Must not depend on the store's mutation API or on IO.

use std::collections::HashMap;
use std::sync::Arc;

use shoal_api::node_spec::Availability;
use shoal_api::{node_status, Node, Task};

use crate::orchestrator::observed_state;

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

/// True when the task counts on its node: it has a node and its observed state is not terminal.
pub fn holds_resources(t: &Task) -> bool {
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
pub fn id_order_key(id: &str) -> u128 {
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
        r
    }

    /// Takes back what `add` of the same task counted.
    pub fn remove(&mut self, t: &Task) {
        self.remove_many(&t.service_id, 1, Amount::reserved_by(t));
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
        self.total == 0 && self.by_service.is_empty() && self.reserved == Amount::default()
    }
}

/// One node as the scheduler sees it.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    node: Arc<Node>,
    ready_active: bool,
    order_key: u128,
    capacity: Amount,
    load: TaskLoad,
}

impl NodeInfo {
    /// The info of `node` carrying `load`.
    pub fn new(node: Arc<Node>, load: TaskLoad) -> NodeInfo {
        NodeInfo {
            ready_active: is_ready_and_active(&node),
            order_key: id_order_key(&node.id),
            capacity: Amount::offered_by(&node),
            load,
            node,
        }
    }

    /// Replaces the node (a new version of the same ID), keeping the task counts.
    pub fn set_node(&mut self, node: Arc<Node>) {
        debug_assert_eq!(node.id, self.node.id);
        self.ready_active = is_ready_and_active(&node);
        self.capacity = Amount::offered_by(&node);
        self.node = node;
    }

    /// Counts a task placed on this node; returns its reservations.
    pub fn add_task(&mut self, t: &Task) -> Amount {
        self.load.add(t)
    }

    /// Takes back what `add_task` of the same task counted.
    pub fn remove_task(&mut self, t: &Task) {
        self.load.remove(t);
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
