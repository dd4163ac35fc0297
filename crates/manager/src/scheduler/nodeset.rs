//! `NodeSet`: every node's `NodeInfo`, kept by the scheduler loop between passes. `build` reads a view once
//! (at start, and after the watch lagged); `apply` then follows each store commit: a node created or updated
//! is inserted or replaced, a removed node leaves the set; a task version that held resources on a node
//! (`holds_resources`) is taken off that node and the new version is counted. So a pass reads a contiguous
//! vector instead of rebuilding 100k infos from scattered nodes and the node index.
//!
//! Tasks can name a node the set does not hold (the node was removed, or is not created yet); their load is
//! kept aside by node ID and moves onto the node if it comes (back), so `apply` always ends where `build` of
//! the resulting tables would.
//!
//! Must not depend on the store's mutation API or on IO.

use std::collections::HashMap;
use std::sync::Arc;

use shoal_api::{Node, Task};
use shoal_store::{ActionKind, Commit, Object, Tables};

use super::nodeinfo::{holds_resources, NodeInfo, TaskLoad};

/// The nodes the scheduler places on, with the tasks counted on each.
#[derive(Debug, Clone, Default)]
pub struct NodeSet {
    infos: Vec<NodeInfo>,
    /// `infos[i]`'s node ID, apart so that a pass can borrow IDs while it updates the infos.
    ids: Vec<Arc<str>>,
    slots: HashMap<Arc<str>, usize>,
    /// Loads of tasks whose node is not in the set, by node ID.
    absent: HashMap<String, TaskLoad>,
}

impl NodeSet {
    /// The set of a view: every node, and every task that holds resources.
    pub fn build(tables: &Tables) -> NodeSet {
        let n = tables.nodes().len();
        let mut set = NodeSet {
            infos: Vec::with_capacity(n),
            ids: Vec::with_capacity(n),
            slots: HashMap::with_capacity(n),
            absent: HashMap::new(),
        };
        for node in tables.nodes().iter() {
            set.push(node.clone(), TaskLoad::default());
        }
        // One pass over the tasks rather than one node-index lookup per node; it also finds tasks on
        // nodes that are not in the table.
        for t in tables.tasks().iter() {
            if holds_resources(t) {
                set.count(t);
            }
        }
        set
    }

    /// Follows one commit (see the module doc).
    pub fn apply(&mut self, commit: &Commit) {
        for ch in &commit.changes {
            match &ch.object {
                Object::Node(n) => match ch.kind {
                    ActionKind::Remove => self.remove_node(&n.id),
                    _ => self.put_node(n.clone()),
                },
                Object::Task(t) => {
                    if let Some(Object::Task(old)) = &ch.old {
                        if holds_resources(old) {
                            self.uncount(old);
                        }
                    }
                    if ch.kind != ActionKind::Remove && holds_resources(t) {
                        self.count(t);
                    }
                }
                _ => {}
            }
        }
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.infos.len()
    }

    /// True when the set holds no node.
    pub fn is_empty(&self) -> bool {
        self.infos.is_empty()
    }

    /// The nodes, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &NodeInfo> + '_ {
        self.infos.iter()
    }

    /// The info of one node.
    pub fn get(&self, node_id: &str) -> Option<&NodeInfo> {
        self.slots.get(node_id).map(|&i| &self.infos[i])
    }

    /// The info of one node, to count a task on it and take it back within a pass.
    pub(super) fn get_mut(&mut self, node_id: &str) -> Option<&mut NodeInfo> {
        self.slots.get(node_id).map(|&i| &mut self.infos[i])
    }

    /// Loads counted for node IDs the set does not hold.
    pub fn absent(&self) -> &HashMap<String, TaskLoad> {
        &self.absent
    }

    /// The infos to update and, in the same order, the node IDs (borrowed apart).
    pub(super) fn parts_mut(&mut self) -> (&mut [NodeInfo], &[Arc<str>]) {
        (&mut self.infos, &self.ids)
    }

    fn push(&mut self, node: Arc<Node>, load: TaskLoad) {
        let id: Arc<str> = Arc::from(node.id.as_str());
        self.slots.insert(id.clone(), self.infos.len());
        self.ids.push(id);
        self.infos.push(NodeInfo::new(node, load));
    }

    fn put_node(&mut self, node: Arc<Node>) {
        match self.slots.get(node.id.as_str()) {
            Some(&i) => self.infos[i].set_node(node),
            None => {
                let load = self.absent.remove(&node.id).unwrap_or_default();
                self.push(node, load);
            }
        }
    }

    fn remove_node(&mut self, node_id: &str) {
        let Some(i) = self.slots.remove(node_id) else { return };
        let info = self.infos.swap_remove(i);
        self.ids.swap_remove(i);
        if let Some(moved) = self.ids.get(i) {
            self.slots.insert(moved.clone(), i);
        }
        let load = info.into_load();
        if !load.is_empty() {
            self.absent.insert(node_id.to_string(), load);
        }
    }

    fn count(&mut self, t: &Task) {
        match self.slots.get(t.node_id.as_str()) {
            Some(&i) => self.infos[i].add_task(t),
            None => self.absent.entry(t.node_id.clone()).or_default().add(t),
        };
    }

    fn uncount(&mut self, t: &Task) {
        match self.slots.get(t.node_id.as_str()) {
            Some(&i) => self.infos[i].remove_task(t),
            None => {
                if let Some(load) = self.absent.get_mut(&t.node_id) {
                    load.remove(t);
                    if load.is_empty() {
                        self.absent.remove(&t.node_id);
                    }
                }
            }
        }
    }
}
