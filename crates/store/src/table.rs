//! Typed tables: objects by ID, a unique-name index where the kind has one, and the task indexes
//! (service, node, service+slot, desired state, observed state). Reads never scan a whole table when an
//! index answers.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeSet, HashMap};
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use shoal_api::Task;

use crate::object::StoreObject;

/// The hasher of the ID map: fixed keys, so that the order of `Table::iter` depends only on the table's
/// history, the same in every process (a seed of the simulation, `shoal-sim`, replays exactly; with a
/// per-process random hasher every subsystem that iterates a table would decide in a different order on
/// each run). The keys are IDs the managers generate, not a client's choice, so fixed keys give a client no
/// way to make them collide. Names (chosen by clients) keep the randomly keyed default.
type IdHasher = BuildHasherDefault<DefaultHasher>;

/// One table of objects of type `T`, keyed by ID, with a case-insensitive unique-name index.
#[derive(Clone, Debug)]
pub struct Table<T> {
    by_id: HashMap<String, Arc<T>, IdHasher>,
    by_name: HashMap<String, String>,
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Table { by_id: HashMap::default(), by_name: HashMap::new() }
    }
}

impl<T: StoreObject> Table<T> {
    /// The object with this ID.
    pub fn get(&self, id: &str) -> Option<&Arc<T>> {
        self.by_id.get(id)
    }

    /// The object with this unique name (case-insensitive), for kinds with unique names.
    pub fn by_name(&self, name: &str) -> Option<&Arc<T>> {
        self.by_name.get(&name.to_lowercase()).and_then(|id| self.by_id.get(id))
    }

    /// All objects, in no particular order (but the same order for the same history of writes).
    pub fn iter(&self) -> impl Iterator<Item = &Arc<T>> + '_ {
        self.by_id.values()
    }

    /// Number of objects.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// True when the table holds nothing.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// The ID holding `name`, if any.
    pub(crate) fn name_owner(&self, name: &str) -> Option<&str> {
        self.by_name.get(&name.to_lowercase()).map(String::as_str)
    }

    pub(crate) fn insert(&mut self, obj: Arc<T>) -> Option<Arc<T>> {
        // An update whose unique name is unchanged replaces the object in place: no key is copied.
        if let Some(slot) = self.by_id.get_mut(obj.id()) {
            if slot.unique_name() == obj.unique_name() {
                return Some(std::mem::replace(slot, obj));
            }
        }
        let old = self.remove(obj.id());
        if let Some(name) = obj.unique_name() {
            if !name.is_empty() {
                self.by_name.insert(name.to_lowercase(), obj.id().to_string());
            }
        }
        self.by_id.insert(obj.id().to_string(), obj);
        old
    }

    pub(crate) fn remove(&mut self, id: &str) -> Option<Arc<T>> {
        let old = self.by_id.remove(id)?;
        if let Some(name) = old.unique_name() {
            let key = name.to_lowercase();
            if self.by_name.get(&key).map(String::as_str) == Some(id) {
                self.by_name.remove(&key);
            }
        }
        Some(old)
    }
}

type Index<K> = HashMap<K, BTreeSet<String>>;

fn index_add<K: std::hash::Hash + Eq>(idx: &mut Index<K>, key: K, id: &str) {
    idx.entry(key).or_default().insert(id.to_string());
}

fn index_remove<K, Q>(idx: &mut Index<K>, key: &Q, id: &str)
where
    K: std::hash::Hash + Eq + std::borrow::Borrow<Q>,
    Q: std::hash::Hash + Eq + ?Sized,
{
    if let Some(set) = idx.get_mut(key) {
        set.remove(id);
        if set.is_empty() {
            idx.remove(key);
        }
    }
}

/// Moves `id` from `old` to `new` in an index, when the key changed.
fn index_move<K, Q>(idx: &mut Index<K>, old: &Q, new: &Q, id: &str)
where
    K: std::hash::Hash + Eq + std::borrow::Borrow<Q>,
    Q: std::hash::Hash + Eq + ToOwned<Owned = K> + ?Sized,
{
    if old != new {
        index_remove(idx, old, id);
        index_add(idx, new.to_owned(), id);
    }
}

/// The task table: a `Table<Task>` plus secondary indexes.
#[derive(Clone, Debug, Default)]
pub struct TaskTable {
    table: Table<Task>,
    by_service: Index<String>,
    by_node: Index<String>,
    by_slot: Index<(String, u64)>,
    by_desired_state: Index<i32>,
    by_state: Index<i32>,
}

fn observed_state(t: &Task) -> i32 {
    t.status.as_ref().map(|s| s.state).unwrap_or(0)
}

impl TaskTable {
    /// The task with this ID.
    pub fn get(&self, id: &str) -> Option<&Arc<Task>> {
        self.table.get(id)
    }

    /// All tasks.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Task>> + '_ {
        self.table.iter()
    }

    /// Number of tasks.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// True when there are no tasks.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    fn lookup<'a>(&'a self, ids: Option<&'a BTreeSet<String>>) -> impl Iterator<Item = &'a Arc<Task>> + 'a {
        ids.into_iter().flatten().filter_map(move |id| self.table.get(id))
    }

    /// Tasks of a service.
    pub fn by_service<'a>(&'a self, service_id: &str) -> impl Iterator<Item = &'a Arc<Task>> + 'a {
        self.lookup(self.by_service.get(service_id))
    }

    /// Number of tasks of a service.
    pub fn count_by_service(&self, service_id: &str) -> usize {
        self.by_service.get(service_id).map_or(0, BTreeSet::len)
    }

    /// Tasks assigned to a node.
    pub fn by_node<'a>(&'a self, node_id: &str) -> impl Iterator<Item = &'a Arc<Task>> + 'a {
        self.lookup(self.by_node.get(node_id))
    }

    /// Tasks of one slot of a service (the current one and its history).
    pub fn by_slot<'a>(&'a self, service_id: &str, slot: u64) -> impl Iterator<Item = &'a Arc<Task>> + 'a {
        self.lookup(self.by_slot.get(&(service_id.to_string(), slot)))
    }

    /// Tasks with this desired state.
    pub fn by_desired_state(&self, state: shoal_api::TaskState) -> impl Iterator<Item = &Arc<Task>> + '_ {
        self.lookup(self.by_desired_state.get(&(state as i32)))
    }

    /// Tasks whose observed state (status.state) is this one.
    pub fn by_state(&self, state: shoal_api::TaskState) -> impl Iterator<Item = &Arc<Task>> + '_ {
        self.lookup(self.by_state.get(&(state as i32)))
    }

    /// Number of tasks whose observed state is this one (O(1): the size of its index entry).
    pub fn count_by_state(&self, state: shoal_api::TaskState) -> usize {
        self.by_state.get(&(state as i32)).map_or(0, BTreeSet::len)
    }

    pub(crate) fn insert(&mut self, task: Arc<Task>) -> Option<Arc<Task>> {
        if let Some(old) = self.table.get(&task.id).cloned() {
            // An update: only the indexes whose key changed are touched (usually the states and node).
            let id = task.id.as_str();
            if old.service_id != task.service_id || old.slot != task.slot {
                index_remove(&mut self.by_service, old.service_id.as_str(), id);
                index_remove(&mut self.by_slot, &(old.service_id.clone(), old.slot), id);
                index_add(&mut self.by_service, task.service_id.clone(), id);
                index_add(&mut self.by_slot, (task.service_id.clone(), task.slot), id);
            }
            if old.node_id != task.node_id {
                if !old.node_id.is_empty() {
                    index_remove(&mut self.by_node, old.node_id.as_str(), id);
                }
                if !task.node_id.is_empty() {
                    index_add(&mut self.by_node, task.node_id.clone(), id);
                }
            }
            index_move(&mut self.by_desired_state, &old.desired_state, &task.desired_state, id);
            index_move(&mut self.by_state, &observed_state(&old), &observed_state(&task), id);
            return self.table.insert(task);
        }
        let id = task.id.as_str();
        index_add(&mut self.by_service, task.service_id.clone(), id);
        if !task.node_id.is_empty() {
            index_add(&mut self.by_node, task.node_id.clone(), id);
        }
        index_add(&mut self.by_slot, (task.service_id.clone(), task.slot), id);
        index_add(&mut self.by_desired_state, task.desired_state, id);
        index_add(&mut self.by_state, observed_state(&task), id);
        self.table.insert(task)
    }

    pub(crate) fn remove(&mut self, id: &str) -> Option<Arc<Task>> {
        let old = self.table.remove(id)?;
        index_remove(&mut self.by_service, old.service_id.as_str(), id);
        if !old.node_id.is_empty() {
            index_remove(&mut self.by_node, old.node_id.as_str(), id);
        }
        index_remove(&mut self.by_slot, &(old.service_id.clone(), old.slot), id);
        index_remove(&mut self.by_desired_state, &old.desired_state, id);
        index_remove(&mut self.by_state, &observed_state(&old), id);
        Some(old)
    }
}
