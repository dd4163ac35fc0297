//! The global orchestrator's core: `reconcile_global` keeps one task per eligible node for a global service,
//! as a pure function of a read view, the time and an ID source (SwarmKit's `orchestrator/global`).
//!
//! Each node is one key of the replicated reconcile's working state (`replicated::Work`), in place of a slot
//! number, so the restart supervisor and the rolling updater run unchanged over it. Per node:
//!
//! - It may get a new task when it is READY, its availability is ACTIVE, and it matches the service's
//!   placement constraints and platforms. Global tasks are created with slot 0 and their node already set;
//!   the scheduler only checks that the node takes them.
//! - It keeps its tasks while it exists, is not DOWN, not drained and still matches (a PAUSED node, or one
//!   whose status is not READY yet, keeps what it runs and gets nothing new, nor an updated task).
//! - Otherwise its tasks get desired SHUTDOWN, and no replacement is made elsewhere. A node that went DOWN
//!   keeps its task's record; when it comes back READY, a new task is created once the old one stopped.
//!
//! A failed task is replaced on the same node after its restart delay (`restart`); a new spec rolls node by
//! node in batches of the update config's parallelism (`update`). One pass creates at most
//! `replicated::MAX_NEW_TASKS_PER_PASS` tasks and `MAX_NEW_TASK_BYTES_PER_PASS` bytes; their commit triggers
//! the next pass.
//!
//! Must not depend on IO, async, the clock or other subsystems; it reads the scheduler's pure constraint and
//! platform matchers (as SwarmKit's global orchestrator imports its `constraint` package).

use std::collections::{BTreeMap, HashMap};

use shoal_api::node_spec::Availability;
use shoal_api::service_spec::Mode;
use shoal_api::{node_status, Node, Service, TaskState};
use shoal_store::{IdSource, Tables};

use super::replicated::{Entry, Reconciled, SlotClass, Work, MAX_NEW_TASKS_PER_PASS, MAX_NEW_TASK_BYTES_PER_PASS};
use super::update;
use crate::scheduler::constraint;
use crate::scheduler::filter::platform_matches;

/// The nodes a pass over a global service works on: key `k` of `Work::slots` is node `ids[k]`.
#[derive(Debug, Clone, Default)]
pub(crate) struct NodeKeys {
    ids: Vec<String>,
    creatable: Vec<bool>,
}

impl NodeKeys {
    /// The node ID of a key.
    pub(crate) fn node_id(&self, key: u64) -> &str {
        &self.ids[node_index(key)]
    }

    /// True when the key's node may get a new task.
    pub(crate) fn may_create(&self, key: u64) -> bool {
        self.creatable.get(node_index(key)).copied().unwrap_or(false)
    }
}

/// The index in a pass's node list of a global service's key (a key is made from such an index).
pub(crate) fn node_index(key: u64) -> usize {
    usize::try_from(key).expect("a global key is an index of the pass's nodes")
}

/// True for a global service.
pub(crate) fn is_global(service: &Service) -> bool {
    matches!(service.spec.as_ref().and_then(|s| s.mode.as_ref()), Some(Mode::Global(_)))
}

/// How one node stands for a global service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Eligibility {
    /// Ready, active and matching: it gets a task.
    Create,
    /// It keeps what it runs but gets nothing new (paused, or not ready yet).
    Keep,
    /// Its tasks are shut down (gone, down, drained, or no longer matching).
    Shutdown,
}

/// The placement rules of a service's task spec, parsed once per pass.
struct Placement {
    /// `None` when the stored constraints do not parse (the API refuses those): no node matches.
    constraints: Option<Vec<constraint::Constraint>>,
    platforms: Vec<shoal_api::Platform>,
}

impl Placement {
    fn of(service: &Service) -> Placement {
        let p = service.spec.as_ref().and_then(|s| s.task.as_ref()).and_then(|t| t.placement.as_ref());
        Placement {
            constraints: constraint::parse(p.map(|p| p.constraints.as_slice()).unwrap_or(&[])).ok(),
            platforms: p.map(|p| p.platforms.clone()).unwrap_or_default(),
        }
    }

    fn matches(&self, node: &Node) -> bool {
        self.constraints.as_ref().is_some_and(|cs| cs.iter().all(|c| c.matches(node)))
            && platform_matches(&self.platforms, node)
    }
}

/// How `node` (absent: removed) stands for a service with placement `placement`.
fn eligibility(node: Option<&Node>, placement: &Placement) -> Eligibility {
    let Some(node) = node else { return Eligibility::Shutdown };
    let state = node.status.as_ref().map(|s| s.state()).unwrap_or(node_status::State::Unknown);
    let availability = node.spec.as_ref().map(|s| s.availability()).unwrap_or(Availability::Active);
    if state == node_status::State::Down || availability == Availability::Drain || !placement.matches(node) {
        Eligibility::Shutdown
    } else if state == node_status::State::Ready && availability == Availability::Active {
        Eligibility::Create
    } else {
        Eligibility::Keep
    }
}

/// How `node` stands for `service` (see `Eligibility`).
pub(crate) fn node_eligibility(service: &Service, node: Option<&Node>) -> Eligibility {
    eligibility(node, &Placement::of(service))
}

/// Reconciles one global service (see the module doc). Services of other modes get no change.
pub(crate) fn reconcile_global(tables: &Tables, service: &Service, now_ms: u64, ids: &dyn IdSource) -> Reconciled {
    if !is_global(service) {
        return Reconciled::default();
    }
    let placement = Placement::of(service);
    // Keys: every node of the store, then nodes that only the service's tasks still name.
    let mut keys = NodeKeys::default();
    let mut key_of: HashMap<&str, u64> = HashMap::with_capacity(tables.nodes().len());
    let mut shutdown = Vec::new();
    for node in tables.nodes().iter() {
        let key = keys.ids.len() as u64;
        let e = eligibility(Some(node), &placement);
        key_of.insert(node.id.as_str(), key);
        keys.ids.push(node.id.clone());
        keys.creatable.push(e == Eligibility::Create);
        if e == Eligibility::Shutdown {
            shutdown.push(key);
        }
    }
    let mut slots: BTreeMap<u64, Vec<Entry>> = BTreeMap::new();
    for t in tables.tasks().by_service(&service.id) {
        let key = match key_of.get(t.node_id.as_str()) {
            Some(&k) => k,
            None => {
                let k = keys.ids.len() as u64;
                key_of.insert(t.node_id.as_str(), k);
                keys.ids.push(t.node_id.clone());
                keys.creatable.push(false);
                shutdown.push(k);
                k
            }
        };
        slots.entry(key).or_default().push(Entry::stored(t, key));
    }
    let mut work = Work { tables, service, now_ms, ids, slots, wake_at_ms: None, filled: (0, 0), nodes: Some(keys) };
    for key in shutdown {
        for e in work.slots.get_mut(&key).into_iter().flatten() {
            if e.runnable() {
                e.set_desired(TaskState::Shutdown);
            }
        }
    }
    work.restart_and_promote();
    fill_nodes(&mut work);
    let service_update = update::rolling_update(&mut work);
    fill_nodes(&mut work);
    work.into_changes(service_update)
}

/// Creates a task on every node that may get one and holds none (its key is empty: no task meant to run,
/// none stopping, and not finished by its restart policy), within the per-pass bounds.
fn fill_nodes(work: &mut Work<'_>) {
    use shoal_api::prost::Message;
    let count = work.nodes.as_ref().map_or(0, |n| n.ids.len()) as u64;
    let mut task_bytes = None;
    for key in 0..count {
        let (made, bytes) = work.filled;
        if made >= MAX_NEW_TASKS_PER_PASS || (made > 0 && bytes >= MAX_NEW_TASK_BYTES_PER_PASS) {
            break;
        }
        if !work.may_create(key) || work.classify(key) != SlotClass::Empty {
            continue;
        }
        let e = work.new_task(key, TaskState::Running);
        let len = *task_bytes.get_or_insert_with(|| e.task.encoded_len());
        work.filled = (made + 1, bytes + len);
        work.add(e);
    }
}
