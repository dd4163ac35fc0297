//! `NodeInfo`: what the scheduler knows of one node during a pass: the node, its tasks that still hold
//! resources (assigned there and not terminal), counted in total and per service, and the resources left.
//! Built once per pass from the store's node index, then updated in memory as the pass assigns tasks.
//!
//! Must not depend on the store's mutation API or on IO.

use std::collections::HashMap;
use std::sync::Arc;

use shoal_api::{Node, Task};
use shoal_store::Tables;

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

    /// True when `self` covers `need`.
    pub fn covers(&self, need: &Amount) -> bool {
        self.nano_cpus >= need.nano_cpus && self.memory_bytes >= need.memory_bytes
    }

    /// True when nothing is asked for.
    pub fn is_zero(&self) -> bool {
        self.nano_cpus <= 0 && self.memory_bytes <= 0
    }
}

/// One node as the scheduler sees it during a pass.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    /// The stored node.
    pub node: Arc<Node>,
    /// Tasks on the node that are not terminal.
    pub total_tasks: usize,
    /// The same, per service ID.
    pub tasks_by_service: HashMap<String, usize>,
    /// The node's resources minus the reservations of its non-terminal tasks.
    pub available: Amount,
}

impl NodeInfo {
    /// Builds the info of `node` from the node index.
    pub fn build(tables: &Tables, node: &Arc<Node>) -> NodeInfo {
        let res = node.description.as_ref().and_then(|d| d.resources.as_ref());
        let mut info = NodeInfo {
            node: node.clone(),
            total_tasks: 0,
            tasks_by_service: HashMap::new(),
            available: Amount {
                nano_cpus: res.map_or(0, |r| r.nano_cpus),
                memory_bytes: res.map_or(0, |r| r.memory_bytes),
            },
        };
        for t in tables.tasks().by_node(&node.id) {
            if !observed_state(t).is_terminal() {
                info.add_task(t);
            }
        }
        info
    }

    /// Counts a task placed on this node.
    pub fn add_task(&mut self, t: &Task) {
        self.total_tasks += 1;
        // Look up before inserting: the service ID is copied only the first time a node sees the service.
        match self.tasks_by_service.get_mut(&t.service_id) {
            Some(n) => *n += 1,
            None => {
                self.tasks_by_service.insert(t.service_id.clone(), 1);
            }
        }
        let r = Amount::reserved_by(t);
        self.available.nano_cpus -= r.nano_cpus;
        self.available.memory_bytes -= r.memory_bytes;
    }

    /// Tasks of `service_id` on this node.
    pub fn service_tasks(&self, service_id: &str) -> usize {
        self.tasks_by_service.get(service_id).copied().unwrap_or(0)
    }
}
