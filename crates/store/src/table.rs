//! Typed tables: objects by ID, a unique-name index where the kind has one, and the task indexes
//! (service, node, service+slot, desired state, observed state). Reads never scan a whole table when an
//! index answers.
//!
//! Memory per task is what bounds a large cluster's manager, so the task table holds each task once: the
//! ID map and every index hold the same `Arc<Task>` (a pointer each, ordered and looked up by the task's own
//! ID, `ById`; an update replaces it in each of its index entries), index entries are small (`SortedSet`),
//! and one copy of the spec, the service annotations and the endpoint serves each service version
//! (`SpecInterner`; the tasks hold them as `Shared`).

use std::borrow::Borrow;
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::{Arc, Weak};

use shoal_api::{Annotations, Endpoint, Shared, Task, TaskSpec};

use crate::object::StoreObject;

/// The hasher of the ID map: fixed keys, so that the order of `Table::iter` depends only on the table's
/// history, the same in every process (a seed of the simulation, `shoal-sim`, replays exactly; with a
/// per-process random hasher every subsystem that iterates a table would decide in a different order on
/// each run). The keys are IDs the managers generate, not a client's choice, so fixed keys give a client no
/// way to make them collide. Names (chosen by clients) keep the randomly keyed default.
type IdHasher = BuildHasherDefault<DefaultHasher>;

/// An object as a key: hashed, compared and looked up (`Borrow<str>`) by its ID, so a set of them is a map
/// from ID to object that holds no copy of the ID.
#[derive(Debug)]
struct ById<T>(Arc<T>);

impl<T> Clone for ById<T> {
    fn clone(&self) -> Self {
        ById(self.0.clone())
    }
}

impl<T: StoreObject> Borrow<str> for ById<T> {
    fn borrow(&self) -> &str {
        self.0.id()
    }
}

impl<T: StoreObject> Hash for ById<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.id().hash(state)
    }
}

impl<T: StoreObject> PartialEq for ById<T> {
    fn eq(&self, other: &Self) -> bool {
        self.0.id() == other.0.id()
    }
}

impl<T: StoreObject> Eq for ById<T> {}

impl<T: StoreObject> PartialOrd for ById<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl<T: StoreObject> Ord for ById<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.id().cmp(other.0.id())
    }
}

/// One table of objects of type `T`, keyed by ID, with a case-insensitive unique-name index.
#[derive(Clone, Debug)]
pub struct Table<T> {
    by_id: HashSet<ById<T>, IdHasher>,
    /// Lowercased name to ID (kinds with unique names: services, secrets, configs, networks, clusters).
    by_name: HashMap<String, String>,
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Table { by_id: HashSet::default(), by_name: HashMap::new() }
    }
}

impl<T: StoreObject> Table<T> {
    /// The object with this ID.
    pub fn get(&self, id: &str) -> Option<&Arc<T>> {
        self.by_id.get(id).map(|k| &k.0)
    }

    /// The object with this unique name (case-insensitive), for kinds with unique names.
    pub fn by_name(&self, name: &str) -> Option<&Arc<T>> {
        self.by_name.get(&name.to_lowercase()).and_then(|id| self.get(id))
    }

    /// All objects, in no particular order (but the same order for the same history of writes).
    pub fn iter(&self) -> impl Iterator<Item = &Arc<T>> + '_ {
        self.by_id.iter().map(|k| &k.0)
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

    /// Stores `obj`; returns the object it replaced.
    pub(crate) fn insert(&mut self, obj: Arc<T>) -> Option<Arc<T>> {
        // An update whose unique name is unchanged replaces the object in place.
        if let Some(old) = self.by_id.get(obj.id()) {
            if old.0.unique_name() == obj.unique_name() {
                return self.by_id.replace(ById(obj)).map(|k| k.0);
            }
        }
        let old = self.remove(obj.id());
        if let Some(name) = obj.unique_name() {
            if !name.is_empty() {
                self.by_name.insert(name.to_lowercase(), obj.id().to_string());
            }
        }
        self.by_id.insert(ById(obj));
        old
    }

    pub(crate) fn remove(&mut self, id: &str) -> Option<Arc<T>> {
        let old = self.by_id.take(id)?.0;
        if let Some(name) = old.unique_name() {
            let key = name.to_lowercase();
            if self.by_name.get(&key).map(String::as_str) == Some(id) {
                self.by_name.remove(&key);
            }
        }
        Some(old)
    }
}

/// A sorted set: a sorted `Vec` while small (most index entries hold a task or a few: a slot's history, a
/// node's tasks), a `BTreeSet` past `SMALL_SET_MAX`.
#[derive(Clone, Debug)]
enum SortedSet<K> {
    Small(Vec<K>),
    Large(BTreeSet<K>),
}

/// Tasks in ID order.
type TaskSet = SortedSet<ById<Task>>;

/// The tasks of one service, in (slot, ID) order: all of them, and a slot's (its current task and history)
/// as a range.
type SlotSet = SortedSet<(u64, ById<Task>)>;

/// Largest `SortedSet::Small`; a set that grows past it becomes `Large` (and stays so).
const SMALL_SET_MAX: usize = 32;

impl<K: Ord + Clone> SortedSet<K> {
    /// Adds `key`, or replaces the element equal to it (the new version of a task).
    fn insert(&mut self, key: K) {
        match self {
            SortedSet::Small(v) => match v.binary_search(&key) {
                Ok(at) => v[at] = key,
                Err(at) if v.len() < SMALL_SET_MAX => {
                    // Grow one at a time: most sets stay at one or two elements.
                    v.reserve_exact(1);
                    v.insert(at, key);
                }
                Err(_) => {
                    let mut set: BTreeSet<K> = v.drain(..).collect();
                    set.insert(key);
                    *self = SortedSet::Large(set);
                }
            },
            SortedSet::Large(set) => {
                set.replace(key);
            }
        }
    }

    fn remove<Q: Ord + ?Sized>(&mut self, key: &Q)
    where
        K: Borrow<Q>,
    {
        match self {
            SortedSet::Small(v) => {
                if let Ok(at) = v.binary_search_by(|x| x.borrow().cmp(key)) {
                    v.remove(at);
                    if v.len() * 4 < v.capacity() {
                        v.shrink_to_fit();
                    }
                }
            }
            SortedSet::Large(set) => {
                set.remove(key);
            }
        }
    }

    fn len(&self) -> usize {
        match self {
            SortedSet::Small(v) => v.len(),
            SortedSet::Large(set) => set.len(),
        }
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn iter(&self) -> impl Iterator<Item = &K> + '_ {
        self.iter_from(None)
    }

    /// The elements from `low` on (all with `None`), in order.
    fn iter_from<'a>(&'a self, low: Option<&K>) -> impl Iterator<Item = &'a K> + 'a {
        let (small, large) = match self {
            SortedSet::Small(v) => {
                let at = low.map_or(0, |low| v.partition_point(|x| x < low));
                (Some(v[at..].iter()), None)
            }
            SortedSet::Large(set) => {
                let range = match low {
                    Some(low) => set.range((std::ops::Bound::Included(low), std::ops::Bound::Unbounded)),
                    None => set.range::<K, _>(..),
                };
                (None, Some(range))
            }
        };
        small.into_iter().flatten().chain(large.into_iter().flatten())
    }
}

impl<K> Default for SortedSet<K> {
    fn default() -> Self {
        SortedSet::Small(Vec::new())
    }
}

/// The lowest key of a slot in a `SlotSet`: task IDs are never empty, so a task with an empty ID sorts
/// before the slot's tasks.
fn slot_start(slot: u64) -> (u64, ById<Task>) {
    static EMPTY: std::sync::LazyLock<Arc<Task>> = std::sync::LazyLock::new(Arc::default);
    (slot, ById(EMPTY.clone()))
}

type Index<K> = HashMap<K, TaskSet>;

fn index_add<K: Hash + Eq>(idx: &mut Index<K>, key: K, task: &Arc<Task>) {
    idx.entry(key).or_default().insert(ById(task.clone()));
}

fn index_remove<K, Q>(idx: &mut Index<K>, key: &Q, id: &str)
where
    K: Hash + Eq + Borrow<Q>,
    Q: Hash + Eq + ?Sized,
{
    if let Some(set) = idx.get_mut(key) {
        set.remove(id);
        if set.is_empty() {
            idx.remove(key);
        }
    }
}

/// Moves `task` from `old` to `new` in an index, or replaces it under `new` when the key is the same.
fn index_move<K: Hash + Eq + Copy>(idx: &mut Index<K>, old: K, new: K, task: &Arc<Task>) {
    if old != new {
        index_remove(idx, &old, &task.id);
    }
    index_add(idx, new, task);
}

/// The task table: a `Table<Task>` plus secondary indexes, and the specs its tasks share (`SpecInterner`).
#[derive(Clone, Debug, Default)]
pub struct TaskTable {
    table: Table<Task>,
    /// Each service's tasks by (slot, ID): one entry per task answers both `by_service` and `by_slot`.
    by_service: HashMap<String, SlotSet>,
    by_node: Index<String>,
    by_desired_state: Index<i32>,
    by_state: Index<i32>,
    specs: SpecInterner,
}

fn observed_state(t: &Task) -> i32 {
    t.status.as_ref().map(|s| s.state).unwrap_or(0)
}

/// Values of one kind kept per service for sharing, at most: a service has its current spec and, during an
/// update or a rollback, the previous one; a few more cover tasks that differ in what the orchestrator copies
/// per task.
pub(crate) const INTERNED_SPECS_PER_SERVICE: usize = 4;

/// What the tasks of one service share, held weakly: their specs, the service's annotations and endpoint as
/// copied into each task.
#[derive(Clone, Debug, Default)]
struct ServiceShared {
    specs: Vec<Weak<TaskSpec>>,
    annotations: Vec<Weak<Annotations>>,
    endpoints: Vec<Weak<Endpoint>>,
}

/// An equal value already shared in `kept`, or `None` when `value` is that one or none is equal (then
/// `value` is remembered, the oldest dropped past `INTERNED_SPECS_PER_SERVICE`).
fn share<T: PartialEq>(kept: &mut Vec<Weak<T>>, value: &Shared<T>) -> Option<Arc<T>> {
    kept.retain(|w| w.strong_count() > 0);
    for w in kept.iter() {
        let Some(s) = w.upgrade() else { continue };
        if Arc::ptr_eq(&s, value.arc()) {
            return None;
        }
        if *s == **value {
            return Some(s);
        }
    }
    if kept.len() >= INTERNED_SPECS_PER_SERVICE {
        kept.remove(0);
    }
    kept.push(Arc::downgrade(value.arc()));
    None
}

/// The shared parts of each service's tasks (`ServiceShared`): a task applied with a spec, service
/// annotations or endpoint equal to one another task of its service holds is given that one (`Shared`), so
/// the tasks of one service version hold one copy of each between them, on every member (interning happens
/// where tasks are applied or restored, whatever their origin). A value no task holds any more is dropped
/// from the lists when the service's next task comes.
#[derive(Clone, Debug, Default)]
struct SpecInterner {
    by_service: HashMap<String, ServiceShared>,
}

impl SpecInterner {
    /// `task` with its shared parts replaced by equal ones already shared, where there are; each new one
    /// remembered for the service's next tasks.
    fn intern(&mut self, task: Arc<Task>) -> Arc<Task> {
        if task.spec.is_none() && task.service_annotations.is_none() && task.endpoint.is_none() {
            return task;
        }
        let kept = match self.by_service.get_mut(task.service_id.as_str()) {
            Some(kept) => kept,
            None => self.by_service.entry(task.service_id.clone()).or_default(),
        };
        let spec = task.spec.as_ref().and_then(|v| share(&mut kept.specs, v));
        let annotations = task.service_annotations.as_ref().and_then(|v| share(&mut kept.annotations, v));
        let endpoint = task.endpoint.as_ref().and_then(|v| share(&mut kept.endpoints, v));
        if spec.is_none() && annotations.is_none() && endpoint.is_none() {
            return task;
        }
        let mut task = Arc::unwrap_or_clone(task);
        if let Some(v) = spec {
            task.spec = Some(Shared::from_arc(v));
        }
        if let Some(v) = annotations {
            task.service_annotations = Some(Shared::from_arc(v));
        }
        if let Some(v) = endpoint {
            task.endpoint = Some(Shared::from_arc(v));
        }
        Arc::new(task)
    }

    /// Forgets a service whose last task is gone.
    fn forget(&mut self, service_id: &str) {
        self.by_service.remove(service_id);
    }
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

    fn lookup(set: Option<&TaskSet>) -> impl Iterator<Item = &Arc<Task>> + '_ {
        set.into_iter().flat_map(SortedSet::iter).map(|k| &k.0)
    }

    /// Tasks of a service, in (slot, ID) order.
    pub fn by_service<'a>(&'a self, service_id: &str) -> impl Iterator<Item = &'a Arc<Task>> + 'a {
        self.by_service.get(service_id).into_iter().flat_map(SortedSet::iter).map(|(_, k)| &k.0)
    }

    /// Number of tasks of a service.
    pub fn count_by_service(&self, service_id: &str) -> usize {
        self.by_service.get(service_id).map_or(0, SortedSet::len)
    }

    /// Tasks assigned to a node, in ID order.
    pub fn by_node<'a>(&'a self, node_id: &str) -> impl Iterator<Item = &'a Arc<Task>> + 'a {
        Self::lookup(self.by_node.get(node_id))
    }

    /// Tasks of one slot of a service (the current one and its history), in ID order.
    pub fn by_slot<'a>(&'a self, service_id: &str, slot: u64) -> impl Iterator<Item = &'a Arc<Task>> + 'a {
        let start = slot_start(slot);
        let tasks = self.by_service.get(service_id).into_iter().flat_map(move |s| s.iter_from(Some(&start)));
        tasks.take_while(move |(s, _)| *s == slot).map(|(_, k)| &k.0)
    }

    /// Tasks with this desired state, in ID order.
    pub fn by_desired_state(&self, state: shoal_api::TaskState) -> impl Iterator<Item = &Arc<Task>> + '_ {
        Self::lookup(self.by_desired_state.get(&(state as i32)))
    }

    /// Tasks whose observed state (status.state) is this one, in ID order.
    pub fn by_state(&self, state: shoal_api::TaskState) -> impl Iterator<Item = &Arc<Task>> + '_ {
        Self::lookup(self.by_state.get(&(state as i32)))
    }

    /// Number of tasks whose observed state is this one (O(1): the size of its index entry).
    pub fn count_by_state(&self, state: shoal_api::TaskState) -> usize {
        self.by_state.get(&(state as i32)).map_or(0, SortedSet::len)
    }

    /// Adds `task` to its service's set, or replaces its older version there.
    fn add_to_service(&mut self, task: &Arc<Task>) {
        let tasks = match self.by_service.get_mut(task.service_id.as_str()) {
            Some(t) => t,
            None => self.by_service.entry(task.service_id.clone()).or_default(),
        };
        tasks.insert((task.slot, ById(task.clone())));
    }

    fn remove_from_service(&mut self, old: &Arc<Task>) {
        let Some(tasks) = self.by_service.get_mut(old.service_id.as_str()) else { return };
        tasks.remove(&(old.slot, ById(old.clone())));
        if tasks.is_empty() {
            self.by_service.remove(old.service_id.as_str());
            self.specs.forget(&old.service_id);
        }
    }

    /// `task` with its spec shared with its service's other tasks where equal (see `SpecInterner`): what
    /// the store applies and publishes, so that no watcher keeps a copy of its own.
    pub(crate) fn intern(&mut self, task: Arc<Task>) -> Arc<Task> {
        self.specs.intern(task)
    }

    /// Stores a task; returns the task it replaced. Every index entry of the task then holds this version.
    pub(crate) fn insert(&mut self, task: Arc<Task>) -> Option<Arc<Task>> {
        if let Some(old) = self.table.get(&task.id).cloned() {
            // An update: each index entry takes the new version; an entry whose key changed moves.
            if old.service_id != task.service_id || old.slot != task.slot {
                self.remove_from_service(&old);
            }
            self.add_to_service(&task);
            if old.node_id != task.node_id && !old.node_id.is_empty() {
                index_remove(&mut self.by_node, old.node_id.as_str(), &old.id);
            }
            if !task.node_id.is_empty() {
                match self.by_node.get_mut(task.node_id.as_str()) {
                    Some(set) => set.insert(ById(task.clone())),
                    None => index_add(&mut self.by_node, task.node_id.clone(), &task),
                }
            }
            index_move(&mut self.by_desired_state, old.desired_state, task.desired_state, &task);
            index_move(&mut self.by_state, observed_state(&old), observed_state(&task), &task);
            return self.table.insert(task);
        }
        self.add_to_service(&task);
        if !task.node_id.is_empty() {
            index_add(&mut self.by_node, task.node_id.clone(), &task);
        }
        index_add(&mut self.by_desired_state, task.desired_state, &task);
        index_add(&mut self.by_state, observed_state(&task), &task);
        self.table.insert(task)
    }

    pub(crate) fn remove(&mut self, id: &str) -> Option<Arc<Task>> {
        let old = self.table.remove(id)?;
        self.remove_from_service(&old);
        if !old.node_id.is_empty() {
            index_remove(&mut self.by_node, old.node_id.as_str(), id);
        }
        index_remove(&mut self.by_desired_state, &old.desired_state, id);
        index_remove(&mut self.by_state, &observed_state(&old), id);
        Some(old)
    }
}
