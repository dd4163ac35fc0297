//! Placement preferences (`--placement-pref spread=node.labels.zone`): SwarmKit's decision tree.
//!
//! Each preference is one level of a tree: the nodes are grouped by the value of the preference's label
//! (`node.labels.<name>` or `engine.labels.<name>`; a node without the label is in the group of the empty
//! value), then each group by the next preference, and so on. Every branch counts the tasks of the service
//! already on its nodes (all of its nodes, whether or not they pass the filters, as SwarmKit counts them).
//! Each task goes down the tree to the branch holding the fewest of the service's tasks (ties: the smaller
//! label value), so the branches of every level fill evenly; a branch whose nodes can take no more is left
//! out from then on. At a leaf the usual spread applies: the node with the fewest tasks of the service, then
//! the fewest tasks overall, then the smallest ID.
//!
//! Placing one task at a time by the fewest count fills the branches as evenly as SwarmKit's level-by-level
//! split, and better where branches start uneven (it never gives two tasks to one branch while another is
//! below it). The nodes of a leaf go through the filter pipeline when the leaf is first reached, so a pass
//! still runs each node through the filters at most once, and only the leaves it needs.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::Arc;

use shoal_api::{placement_preference, GenericResource, Node, Task};

use super::filter::Pipeline;
use super::nodeinfo::{Amount, NodeInfo};
use super::{count32, Spread};

const NODE_LABELS: &str = "node.labels.";
const ENGINE_LABELS: &str = "engine.labels.";

/// A spread descriptor the tree can group by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Descriptor {
    /// `node.labels.<name>`: a label of the node's spec.
    NodeLabel(String),
    /// `engine.labels.<name>`: a label the node's engine reports.
    EngineLabel(String),
    /// `node.id`, `node.hostname`, `node.role`, `node.platform.os` or `node.platform.arch` (lower case): what
    /// a constraint can name.
    Attribute(&'static str),
}

/// The node attributes a spread can group by, as constraints name them.
const ATTRIBUTES: [&str; 5] = ["node.id", "node.hostname", "node.role", "node.platform.os", "node.platform.arch"];

impl Descriptor {
    /// Parses `node.labels.<name>` or `engine.labels.<name>` (the prefix in any case, as SwarmKit reads it).
    pub(crate) fn parse(descriptor: &str) -> Option<Descriptor> {
        let label = |prefix: &str| {
            let head = descriptor.get(..prefix.len())?;
            let name = &descriptor[prefix.len()..];
            (head.eq_ignore_ascii_case(prefix) && !name.is_empty()).then(|| name.to_string())
        };
        label(NODE_LABELS)
            .map(Descriptor::NodeLabel)
            .or_else(|| label(ENGINE_LABELS).map(Descriptor::EngineLabel))
            .or_else(|| ATTRIBUTES.into_iter().find(|a| a.eq_ignore_ascii_case(descriptor)).map(Descriptor::Attribute))
    }

    /// The node's value for this descriptor ("" when it has none).
    fn value<'n>(&self, node: &'n Node) -> &'n str {
        let desc = node.description.as_ref();
        let labels = match self {
            Descriptor::Attribute(attr) => {
                let platform = desc.and_then(|d| d.platform.as_ref());
                return match *attr {
                    "node.id" => node.id.as_str(),
                    "node.hostname" => desc.map_or("", |d| d.hostname.as_str()),
                    "node.role" => match node.role() {
                        shoal_api::NodeRole::Manager => "manager",
                        shoal_api::NodeRole::Worker => "worker",
                    },
                    "node.platform.os" => platform.map_or("", |p| p.os.as_str()),
                    _ => platform.map_or("", |p| p.architecture.as_str()),
                };
            }
            Descriptor::NodeLabel(name) => {
                node.spec.as_ref().and_then(|s| s.annotations.as_ref()).map(|a| (&a.labels, name))
            }
            Descriptor::EngineLabel(name) => desc.and_then(|d| d.engine.as_ref()).map(|e| (&e.labels, name)),
        };
        labels.and_then(|(labels, name)| labels.get(name)).map_or("", String::as_str)
    }
}

/// The spread descriptors of a task's placement preferences, in order. Descriptors the tree cannot group by
/// are left out (the API refuses them at create and update, so only an older stored spec can hold one).
pub(crate) fn descriptors(task: &Task) -> Vec<Descriptor> {
    let prefs = task.spec.as_ref().and_then(|s| s.placement.as_ref()).map(|p| p.preferences.as_slice()).unwrap_or(&[]);
    prefs
        .iter()
        .filter_map(|p| match p.preference.as_ref()? {
            placement_preference::Preference::Spread(s) => Descriptor::parse(&s.spread_descriptor),
        })
        .collect()
}

/// One branch of the tree.
#[derive(Debug)]
struct Branch<'a> {
    /// Tasks of the service on the branch's nodes (including this pass's placements).
    tasks: usize,
    /// True once the branch could not take a task.
    full: bool,
    kind: BranchKind<'a>,
}

#[derive(Debug)]
enum BranchKind<'a> {
    /// The next level, by label value.
    Split(BTreeMap<String, Branch<'a>>),
    /// The node slots of a leaf, and their spread order once the leaf was first reached.
    Leaf { slots: Vec<usize>, order: Option<BinaryHeap<Reverse<Spread<'a>>>> },
}

/// The decision tree of one group's pass.
#[derive(Debug)]
pub(crate) struct PreferenceTree<'a> {
    root: Branch<'a>,
}

impl<'a> PreferenceTree<'a> {
    /// The tree of every node in `infos` (IDs in `ids`, by slot) by `descriptors`, counting `service_id`'s tasks.
    pub(crate) fn build(infos: &[NodeInfo], service_id: &str, descriptors: &[Descriptor]) -> PreferenceTree<'a> {
        let mut root = Branch::new(descriptors.is_empty());
        for (slot, info) in infos.iter().enumerate() {
            let tasks = info.service_tasks(service_id);
            let mut branch = &mut root;
            for (level, d) in descriptors.iter().enumerate() {
                branch.tasks += tasks;
                let BranchKind::Split(next) = &mut branch.kind else { unreachable!("a split above the last level") };
                let leaf = level + 1 == descriptors.len();
                let value = d.value(info.node());
                if !next.contains_key(value) {
                    next.insert(value.to_string(), Branch::new(leaf));
                }
                branch = next.get_mut(value).expect("inserted above");
            }
            branch.tasks += tasks;
            if let BranchKind::Leaf { slots, .. } = &mut branch.kind {
                slots.push(slot);
            }
        }
        PreferenceTree { root }
    }

    /// Places `task` on the best node under the tree (see the module doc), counting it there; returns the
    /// node's slot and the task's reservations, or `None` when no node of any branch can take it.
    pub(crate) fn place(
        &mut self,
        pipeline: &mut Pipeline,
        infos: &mut [NodeInfo],
        ids: &'a [Arc<str>],
        service_id: &str,
        task: &Task,
    ) -> Option<(usize, Amount, Vec<GenericResource>)> {
        self.root.place(pipeline, infos, ids, service_id, task)
    }
}

impl<'a> Branch<'a> {
    fn new(leaf: bool) -> Branch<'a> {
        let kind =
            if leaf { BranchKind::Leaf { slots: Vec::new(), order: None } } else { BranchKind::Split(BTreeMap::new()) };
        Branch { tasks: 0, full: false, kind }
    }

    fn place(
        &mut self,
        pipeline: &mut Pipeline,
        infos: &mut [NodeInfo],
        ids: &'a [Arc<str>],
        service_id: &str,
        task: &Task,
    ) -> Option<(usize, Amount, Vec<GenericResource>)> {
        if self.full {
            return None;
        }
        let placed = match &mut self.kind {
            BranchKind::Split(next) => loop {
                // The open branch with the fewest tasks; the map's order (by value) breaks ties.
                let Some(best) = next.values_mut().filter(|b| !b.full).min_by_key(|b| b.tasks) else {
                    break None;
                };
                if let Some(placed) = best.place(pipeline, infos, ids, service_id, task) {
                    break Some(placed);
                }
            },
            BranchKind::Leaf { slots, order } => {
                let order = order.get_or_insert_with(|| {
                    slots
                        .iter()
                        .filter(|&&slot| pipeline.process(&infos[slot]))
                        .map(|&slot| {
                            let info = &infos[slot];
                            Reverse(Spread {
                                service_tasks: count32(info.service_tasks(service_id)),
                                total_tasks: count32(info.total_tasks()),
                                key: info.order_key(),
                                id: &ids[slot],
                                slot,
                            })
                        })
                        .collect()
                });
                let mut placed = None;
                while let Some(Reverse(best)) = order.pop() {
                    let info = &mut infos[best.slot];
                    // Resources and per-node limits shrink as tasks are placed: check again.
                    if !pipeline.process(info) {
                        continue;
                    }
                    let (reserved, claims) = info.place_task(task);
                    order.push(Reverse(Spread {
                        service_tasks: best.service_tasks.saturating_add(1),
                        total_tasks: best.total_tasks.saturating_add(1),
                        ..best
                    }));
                    placed = Some((best.slot, reserved, claims));
                    break;
                }
                placed
            }
        };
        match placed {
            Some(_) => self.tasks += 1,
            None => self.full = true,
        }
        placed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_take_node_and_engine_labels_and_node_attributes_in_any_case() {
        assert_eq!(Descriptor::parse("node.labels.zone"), Some(Descriptor::NodeLabel("zone".into())));
        assert_eq!(Descriptor::parse("Node.Labels.Zone"), Some(Descriptor::NodeLabel("Zone".into())));
        assert_eq!(Descriptor::parse("engine.labels.disk"), Some(Descriptor::EngineLabel("disk".into())));
        assert_eq!(Descriptor::parse("node.hostname"), Some(Descriptor::Attribute("node.hostname")));
        assert_eq!(Descriptor::parse("Node.ID"), Some(Descriptor::Attribute("node.id")));
        let mut n = Node { id: "n1".into(), ..Default::default() };
        n.description = Some(shoal_api::NodeDescription { hostname: "vm".into(), ..Default::default() });
        assert_eq!(Descriptor::parse("node.hostname").unwrap().value(&n), "vm");
        assert_eq!(Descriptor::parse("node.role").unwrap().value(&n), "worker");
        for bad in ["node.labels.", "zone", "", "node.labelszone"] {
            assert_eq!(Descriptor::parse(bad), None, "{bad:?}");
        }
    }
}
