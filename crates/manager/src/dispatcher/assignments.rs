//! The set of tasks, secrets, configs and cluster volumes one node must know about, sans IO: the COMPLETE
//! set from a view, and the INCREMENTAL changes a store commit makes to it. No async, no store writes, no
//! clock.
//!
//! A task belongs to a node's set when `node_id` is that node and its observed state is at least ASSIGNED
//! (tasks with desired state >= SHUTDOWN stay in it until they are deleted or move away, so the agent stops
//! them). Echo suppression: an update is sent only when a field the agent acts on changed (desired state,
//! spec, ...); the agent's own status reports coming back through the store are not sent again.
//!
//! Dependencies (as SwarmKit's dispatcher): a task that enters the set with observed state at most RUNNING
//! holds the secrets and configs its container spec references (by ID); they are sent (UPDATE, with their
//! data) before the task in the same message, once per node however many tasks use them. A task releases
//! them when its observed state passes RUNNING or it leaves the set; a secret or config no task holds any
//! more is sent as a REMOVE carrying only its ID. A referenced object missing from the store is not sent
//! (the agent then rejects the task, naming it). A node never receives a secret none of its tasks (or of
//! the volumes published to it) uses.
//!
//! Cluster volumes (SwarmKit's): a volume `PUBLISHED` to the node is sent as a `VolumeAssignment` (never
//! the whole Volume: the plugin's IDs and contexts, the access mode, its secrets by ID, which it holds as a
//! task does); `PENDING_NODE_UNPUBLISH` sends it as a REMOVE, which the node answers with
//! `UpdateVolumeStatus` once it has unpublished it (`volumes`).
//!
//! Bound: `sent` holds one entry per task in the node's set; `holders` one per secret/config sent, each with
//! the IDs of the tasks holding it; `held_by` one per task holding any. A COMPLETE set holds at most
//! `COMPLETE_MAX_BYTES` of changes (an agent decodes messages of up to 64 MiB): past it, the node's finished
//! tasks (observed terminal: nothing left for the agent to do) are left out, and a set whose other tasks
//! alone exceed it is refused (`CompleteTooLarge`, naming both sizes) rather than sent as a message the
//! agent cannot read.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use shoal_api::{
    assignment, assignment_change::AssignmentAction, task_spec, volume_publish_status, Assignment, AssignmentChange,
    Config, ContainerSpec, Secret, Task, TaskState, Volume, VolumeAssignment, VolumeSecret,
};
use shoal_store::{ActionKind, Change, Object, Tables};

/// Most encoded bytes of a COMPLETE set's changes: below the 64 MiB an agent decodes in one message
/// (`shoal_agent::MAX_MESSAGE_BYTES`), with room for the message's envelope.
pub(crate) const COMPLETE_MAX_BYTES: usize = 48 << 20;

/// A node's COMPLETE set is over `COMPLETE_MAX_BYTES` even without its finished tasks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the assignment set of node {node_id} is {bytes} bytes without its finished tasks, over the {limit} bytes \
     one message to an agent may hold; scale down or move some of its services (fewer replicas, smaller \
     specs, or constraints to other nodes)"
)]
pub struct CompleteTooLarge {
    /// The node.
    pub node_id: String,
    /// The set's encoded size without finished tasks.
    pub bytes: usize,
    /// The bound.
    pub limit: usize,
}

/// A secret or config a task depends on, by kind and ID.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dependency {
    /// A secret, by ID.
    Secret(String),
    /// A config, by ID.
    Config(String),
}

impl Dependency {
    /// The assignment that carries this dependency, looked up in `tables`; `None` when it is not stored.
    pub fn lookup(&self, tables: &Tables) -> Option<assignment::Item> {
        match self {
            // A volume names its secrets by name or ID; a task's references carry the ID.
            Dependency::Secret(id) => tables
                .secrets()
                .get(id)
                .or_else(|| tables.secrets().by_name(id))
                .map(|s| assignment::Item::Secret((**s).clone())),
            Dependency::Config(id) => tables.configs().get(id).map(|c| assignment::Item::Config((**c).clone())),
        }
    }

    /// The REMOVE change for this dependency: the ID only, never the data.
    fn removal(&self) -> AssignmentChange {
        let item = match self {
            Dependency::Secret(id) => assignment::Item::Secret(Secret { id: id.clone(), ..Default::default() }),
            Dependency::Config(id) => assignment::Item::Config(Config { id: id.clone(), ..Default::default() }),
        };
        AssignmentChange { assignment: Some(Assignment { item: Some(item) }), action: AssignmentAction::Remove as i32 }
    }
}

fn container(task: &Task) -> Option<&ContainerSpec> {
    match task.spec.as_ref()?.runtime.as_ref()? {
        task_spec::Runtime::Container(c) => Some(c),
        task_spec::Runtime::Attachment(_) => None,
    }
}

/// The secrets and configs `task`'s container spec references, without repeats, secrets first.
pub(crate) fn dependencies_of(task: &Task) -> Vec<Dependency> {
    let Some(c) = container(task) else { return Vec::new() };
    if c.secrets.is_empty() && c.configs.is_empty() {
        return Vec::new();
    }
    let mut out: Vec<Dependency> = Vec::with_capacity(c.secrets.len() + c.configs.len());
    for s in &c.secrets {
        let d = Dependency::Secret(s.secret_id.clone());
        if !out.contains(&d) {
            out.push(d);
        }
    }
    for s in &c.configs {
        let d = Dependency::Config(s.config_id.clone());
        if !out.contains(&d) {
            out.push(d);
        }
    }
    out
}

/// True when `task` belongs in `node_id`'s assignment set.
pub(crate) fn is_assigned_to(task: &Task, node_id: &str) -> bool {
    let observed = task.status.as_ref().map_or(0, |s| s.state);
    task.node_id == node_id && observed >= TaskState::Assigned as i32
}

/// True while a task in the set holds its dependencies: its observed state is at most RUNNING.
fn holds_dependencies(task: &Task) -> bool {
    task.status.as_ref().map_or(0, |s| s.state) <= TaskState::Running as i32
}

/// True when `new` differs from `old` in a field the agent acts on. Status and meta are the agent's own
/// reports and the store's bookkeeping: changes there alone are not sent.
pub(crate) fn agent_cares(old: &Task, new: &Task) -> bool {
    old.desired_state != new.desired_state
        || old.spec != new.spec
        || old.spec_version != new.spec_version
        || old.node_id != new.node_id
        || old.service_id != new.service_id
        || old.slot != new.slot
        || old.annotations != new.annotations
        || old.service_annotations != new.service_annotations
        || old.endpoint != new.endpoint
        || old.log_driver != new.log_driver
        || old.job_iteration != new.job_iteration
        || old.volumes != new.volumes
}

fn change(task: &Task, action: AssignmentAction) -> AssignmentChange {
    AssignmentChange {
        assignment: Some(Assignment { item: Some(assignment::Item::Task(task.clone())) }),
        action: action as i32,
    }
}

/// What has been sent to one node: the last version of each task in its set, and the secrets and configs
/// sent with the tasks holding each.
#[derive(Debug)]
pub struct AssignmentSet {
    node_id: String,
    sent: HashMap<String, Arc<Task>>,
    /// Each secret/config sent, with the IDs of the tasks holding it (never empty).
    holders: HashMap<Dependency, HashSet<String>>,
    /// Each task (or cluster volume) holding dependencies, with those it holds.
    held_by: HashMap<String, Vec<Dependency>>,
    /// Each cluster volume sent, with the publication state it was sent for (`PUBLISHED`: an UPDATE;
    /// `PENDING_NODE_UNPUBLISH`: a REMOVE) and what was sent.
    volumes: HashMap<String, (i32, VolumeAssignment)>,
}

impl AssignmentSet {
    /// An empty set for `node_id`.
    pub fn new(node_id: &str) -> AssignmentSet {
        AssignmentSet {
            node_id: node_id.to_string(),
            sent: HashMap::new(),
            holders: HashMap::new(),
            held_by: HashMap::new(),
            volumes: HashMap::new(),
        }
    }

    /// Number of tasks in the set.
    pub fn len(&self) -> usize {
        self.sent.len()
    }

    /// True when the set is empty.
    pub fn is_empty(&self) -> bool {
        self.sent.is_empty()
    }

    /// The secrets and configs sent to the node and not removed since, sorted.
    pub fn dependencies(&self) -> Vec<Dependency> {
        let mut v: Vec<Dependency> = self.holders.keys().cloned().collect();
        v.sort();
        v
    }

    /// Rebuilds the set from a view (through the node index) and returns it as UPDATE changes, for a
    /// COMPLETE message: the secrets and configs first, then the tasks. Within `COMPLETE_MAX_BYTES` (see
    /// the module doc): past it the finished tasks are left out (a later change of one is sent as an
    /// UPDATE), and a set still past it is refused.
    pub fn complete(&mut self, tables: &Tables) -> Result<Vec<AssignmentChange>, CompleteTooLarge> {
        self.complete_within(tables, COMPLETE_MAX_BYTES)
    }

    /// `complete` with another bound (tests).
    pub fn complete_within(
        &mut self,
        tables: &Tables,
        limit: usize,
    ) -> Result<Vec<AssignmentChange>, CompleteTooLarge> {
        use shoal_api::prost::Message;
        let build = |set: &mut AssignmentSet, keep_finished: bool| {
            set.sent.clear();
            set.holders.clear();
            set.held_by.clear();
            set.volumes.clear();
            let mut deps = Vec::new();
            for v in tables.volumes().iter() {
                set.on_volume(v, &mut deps, &mut |d| d.lookup(tables));
            }
            let mut tasks = Vec::new();
            for task in tables.tasks().by_node(&set.node_id) {
                let finished = task.status.as_ref().is_some_and(|s| s.state().is_terminal());
                if is_assigned_to(task, &set.node_id) && (keep_finished || !finished) {
                    set.acquire(task, &mut deps, &mut |d| d.lookup(tables));
                    tasks.push(update(assignment::Item::Task((**task).clone())));
                    set.sent.insert(task.id.clone(), task.clone());
                }
            }
            deps.extend(tasks);
            let bytes: usize = deps.iter().map(|c| c.encoded_len()).sum();
            (deps, bytes)
        };
        let (all, bytes) = build(self, true);
        if bytes <= limit {
            return Ok(all);
        }
        let (live, bytes) = build(self, false);
        if bytes <= limit {
            tracing::warn!(node = %self.node_id, bytes, limit, "assignment set without the node's finished tasks, to \
                                                                fit one message");
            return Ok(live);
        }
        Err(CompleteTooLarge { node_id: self.node_id.clone(), bytes, limit })
    }

    /// The changes one store change makes to the set, appended to `out` (a task's new dependencies before
    /// it, dependencies it released after it). `lookup` reads a secret or config from the store; it is
    /// called only for a dependency not yet sent to the node.
    pub fn on_change(
        &mut self,
        c: &Change,
        out: &mut Vec<AssignmentChange>,
        lookup: &mut dyn FnMut(&Dependency) -> Option<assignment::Item>,
    ) {
        let task = match &c.object {
            Object::Task(task) => task,
            Object::Volume(v) if c.kind == ActionKind::Remove => return self.forget_volume(&v.id, out),
            Object::Volume(v) => return self.on_volume(v, out, lookup),
            _ => return,
        };
        if c.kind != ActionKind::Remove && is_assigned_to(task, &self.node_id) {
            let send = match self.sent.get(&task.id) {
                Some(prev) => agent_cares(prev, task),
                None => {
                    self.acquire(task, out, lookup);
                    true
                }
            };
            // Keep the newest version either way, so the next comparison is against current fields.
            self.sent.insert(task.id.clone(), task.clone());
            if send {
                out.push(update(assignment::Item::Task((**task).clone())));
            }
            if !holds_dependencies(task) {
                self.release(&task.id, out);
            }
        } else if let Some(old) = self.sent.remove(&task.id) {
            out.push(change(&old, AssignmentAction::Remove));
            self.release(&task.id, out);
        }
    }

    /// Records the dependencies of `task` (entering the set) and appends UPDATEs for those not sent yet.
    fn acquire(
        &mut self,
        task: &Task,
        out: &mut Vec<AssignmentChange>,
        lookup: &mut dyn FnMut(&Dependency) -> Option<assignment::Item>,
    ) {
        if !holds_dependencies(task) {
            return;
        }
        let deps = dependencies_of(task);
        if deps.is_empty() {
            return;
        }
        let mut held = Vec::with_capacity(deps.len());
        for d in deps {
            if let Some(holders) = self.holders.get_mut(&d) {
                holders.insert(task.id.clone());
                held.push(d);
                continue;
            }
            // Not stored (removed meanwhile): not sent; the agent rejects the task naming it.
            let Some(item) = lookup(&d) else { continue };
            out.push(update(item));
            self.holders.insert(d.clone(), HashSet::from([task.id.clone()]));
            held.push(d);
        }
        if !held.is_empty() {
            self.held_by.insert(task.id.clone(), held);
        }
    }

    /// What volume `v`'s publication on this node asks of the node, appended to `out` when it changed since
    /// it was last sent (SwarmKit's dispatcher): `PUBLISHED` sends the `VolumeAssignment` (UPDATE, its
    /// secrets before it, as ordinary secret assignments, the assignment naming them by ID);
    /// `PENDING_NODE_UNPUBLISH` sends it as a REMOVE (the node unpublishes it and reports so), whether or not
    /// the node had it (it may have restarted); the other states, or no publication, send nothing and forget
    /// it.
    fn on_volume(
        &mut self,
        v: &Volume,
        out: &mut Vec<AssignmentChange>,
        lookup: &mut dyn FnMut(&Dependency) -> Option<assignment::Item>,
    ) {
        use volume_publish_status::State;
        let Some(st) = v.publish_status.iter().find(|s| s.node_id == self.node_id) else {
            return self.forget_volume(&v.id, out);
        };
        if st.state != State::Published as i32 && st.state != State::PendingNodeUnpublish as i32 {
            return self.forget_volume(&v.id, out);
        }
        let spec = v.spec.clone().unwrap_or_default();
        let info = v.volume_info.clone().unwrap_or_default();
        let mut a = VolumeAssignment {
            id: v.id.clone(),
            volume_id: info.volume_id,
            driver: spec.driver,
            volume_context: info.volume_context,
            publish_context: st.publish_context.clone(),
            access_mode: spec.access_mode,
            secrets: spec.secrets,
        };
        if st.state == State::PendingNodeUnpublish as i32 {
            if self.volumes.get(&v.id).is_some_and(|(s, _)| *s == st.state) {
                return;
            }
            out.push(AssignmentChange {
                assignment: Some(Assignment { item: Some(assignment::Item::Volume(a.clone())) }),
                action: AssignmentAction::Remove as i32,
            });
            self.volumes.insert(v.id.clone(), (st.state, a));
            self.release(&v.id, out);
            return;
        }
        // Its secrets, by ID: sent (once per node) before it.
        let mut held = Vec::with_capacity(a.secrets.len());
        let mut refs = Vec::with_capacity(a.secrets.len());
        for s in &a.secrets {
            // Not stored (removed meanwhile): not sent; the node cannot stage the volume and says why.
            let Some(assignment::Item::Secret(secret)) = lookup(&Dependency::Secret(s.secret.clone())) else {
                refs.push(s.clone());
                continue;
            };
            refs.push(VolumeSecret { key: s.key.clone(), secret: secret.id.clone() });
            let d = Dependency::Secret(secret.id.clone());
            match self.holders.get_mut(&d) {
                Some(holders) => {
                    holders.insert(v.id.clone());
                }
                None => {
                    out.push(update(assignment::Item::Secret(secret)));
                    self.holders.insert(d.clone(), HashSet::from([v.id.clone()]));
                }
            }
            held.push(d);
        }
        a.secrets = refs;
        if self.volumes.get(&v.id).is_some_and(|(s, sent)| *s == st.state && *sent == a) {
            // Unchanged: the holds just taken are the ones already recorded.
            return;
        }
        let before = self.held_by.insert(v.id.clone(), held);
        out.push(update(assignment::Item::Volume(a.clone())));
        self.volumes.insert(v.id.clone(), (st.state, a));
        // Secrets it no longer names (a changed spec cannot change them, but a secret may be re-created).
        if let Some(before) = before {
            let now: HashSet<&Dependency> = self.held_by.get(&v.id).map(|h| h.iter().collect()).unwrap_or_default();
            for d in before.into_iter().filter(|d| !now.contains(d)) {
                if let Some(holders) = self.holders.get_mut(&d) {
                    holders.remove(&v.id);
                    if holders.is_empty() {
                        self.holders.remove(&d);
                        out.push(d.removal());
                    }
                }
            }
        }
    }

    /// Stops tracking volume `id` (no publication on this node any more, or removed): its secrets are
    /// released; nothing is sent for the volume itself.
    fn forget_volume(&mut self, id: &str, out: &mut Vec<AssignmentChange>) {
        if self.volumes.remove(id).is_some() {
            self.release(id, out);
        }
    }

    /// Drops `task_id`'s hold on its dependencies and appends REMOVEs for those no task holds any more.
    fn release(&mut self, task_id: &str, out: &mut Vec<AssignmentChange>) {
        if self.held_by.is_empty() {
            return;
        }
        let Some(held) = self.held_by.remove(task_id) else { return };
        for d in held {
            let Some(holders) = self.holders.get_mut(&d) else { continue };
            holders.remove(task_id);
            if holders.is_empty() {
                self.holders.remove(&d);
                out.push(d.removal());
            }
        }
    }
}

fn update(item: assignment::Item) -> AssignmentChange {
    AssignmentChange { assignment: Some(Assignment { item: Some(item) }), action: AssignmentAction::Update as i32 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_api::{ConfigReference, ConfigSpec, SecretReference, SecretSpec, TaskSpec, TaskStatus};
    use shoal_store::{Changes, MemoryStore};

    fn task(id: &str, node: &str, state: TaskState, desired: TaskState) -> Task {
        Task {
            id: id.into(),
            node_id: node.into(),
            desired_state: desired as i32,
            status: Some(TaskStatus { state: state as i32, ..Default::default() }),
            ..Default::default()
        }
    }

    fn with_refs(mut t: Task, secrets: &[&str], configs: &[&str]) -> Task {
        let c = ContainerSpec {
            secrets: secrets
                .iter()
                .map(|s| SecretReference { secret_id: s.to_string(), secret_name: format!("name-{s}"), target: None })
                .collect(),
            configs: configs
                .iter()
                .map(|s| ConfigReference { config_id: s.to_string(), config_name: format!("name-{s}"), target: None })
                .collect(),
            ..Default::default()
        };
        t.spec = Some(TaskSpec { runtime: Some(task_spec::Runtime::Container(c)), ..Default::default() }.into());
        t
    }

    fn secret(id: &str, data: &[u8]) -> Secret {
        Secret {
            id: id.into(),
            spec: Some(SecretSpec { data: data.to_vec(), ..Default::default() }),
            ..Default::default()
        }
    }

    fn config(id: &str) -> Config {
        Config {
            id: id.into(),
            spec: Some(ConfigSpec { data: b"cfg".to_vec(), ..Default::default() }),
            ..Default::default()
        }
    }

    /// Each change as (kind, id, action) with kind "task", "secret" or "config".
    fn actions(c: &[AssignmentChange]) -> Vec<(&'static str, String, i32)> {
        c.iter()
            .map(|c| {
                let (kind, id) = match c.assignment.as_ref().and_then(|a| a.item.clone()).expect("an item") {
                    assignment::Item::Task(t) => ("task", t.id),
                    assignment::Item::Secret(s) => ("secret", s.id),
                    assignment::Item::Config(s) => ("config", s.id),
                    assignment::Item::Volume(v) => ("volume", v.id),
                };
                (kind, id, c.action)
            })
            .collect()
    }

    const UPD: i32 = AssignmentAction::Update as i32;
    const REM: i32 = AssignmentAction::Remove as i32;

    fn e(kind: &'static str, id: &str, action: i32) -> (&'static str, String, i32) {
        (kind, id.to_string(), action)
    }

    /// Drives one set over a store: `write` applies changes and returns what the set sends for them.
    struct Harness {
        store: MemoryStore,
        watch: shoal_store::Watch,
        set: AssignmentSet,
        index: u64,
    }

    impl Harness {
        fn new(node: &str, setup: Changes) -> (Harness, Vec<AssignmentChange>) {
            let store = MemoryStore::default();
            store.apply(1, setup.actions()).unwrap();
            let mut set = AssignmentSet::new(node);
            let complete = store.view(|t| set.complete(t)).unwrap();
            let watch = store.watch();
            (Harness { store, watch, set, index: 1 }, complete)
        }

        fn write(&mut self, c: Changes) -> Vec<AssignmentChange> {
            self.index += 1;
            self.store.apply(self.index, c.actions()).unwrap();
            let commit = self.watch.try_recv().unwrap();
            let mut out = Vec::new();
            let store = &self.store;
            for ch in &commit.changes {
                self.set.on_change(ch, &mut out, &mut |d| store.view(|t| d.lookup(t)));
            }
            out
        }

        fn task(&self, id: &str) -> Task {
            self.store.view(|t| (**t.tasks().get(id).unwrap()).clone())
        }
    }

    #[test]
    fn complete_set_holds_assigned_tasks_of_the_node_only() {
        let store = MemoryStore::default();
        let mut c = Changes::new();
        c.create(task("a", "n1", TaskState::Assigned, TaskState::Running));
        c.create(task("b", "n1", TaskState::Pending, TaskState::Running));
        c.create(task("c", "n2", TaskState::Running, TaskState::Running));
        c.create(task("d", "n1", TaskState::Complete, TaskState::Shutdown));
        store.apply(1, c.actions()).unwrap();
        let mut set = AssignmentSet::new("n1");
        let mut got = actions(&store.view(|t| set.complete(t)).unwrap());
        got.sort();
        assert_eq!(got, vec![e("task", "a", UPD), e("task", "d", UPD)]);
    }

    /// The COMPLETE set's bound: all tasks when they fit; past it without the finished ones (which a later
    /// change still brings); refused, naming the sizes, when the tasks the agent must run do not fit.
    #[test]
    fn complete_set_stays_within_its_byte_bound() {
        use shoal_api::prost::Message;
        let store = MemoryStore::default();
        let mut c = Changes::new();
        c.create(task("a", "n1", TaskState::Running, TaskState::Running));
        c.create(task("d", "n1", TaskState::Failed, TaskState::Shutdown));
        store.apply(1, c.actions()).unwrap();
        let one = store.view(|t| update(assignment::Item::Task((**t.tasks().get("a").unwrap()).clone())).encoded_len());
        let mut set = AssignmentSet::new("n1");
        let both = store.view(|t| set.complete_within(t, 2 * one + 64)).unwrap();
        assert_eq!(actions(&both).len(), 2);
        let live = store.view(|t| set.complete_within(t, one + 8)).unwrap();
        assert_eq!(actions(&live), vec![e("task", "a", UPD)], "the finished task is left out");
        assert_eq!(set.len(), 1);
        let mut out = Vec::new();
        let mut failed = store.view(|t| (**t.tasks().get("d").unwrap()).clone());
        failed.set_desired_state(TaskState::Remove);
        let ch = Change { kind: ActionKind::Update, object: Object::Task(Arc::new(failed)), old: None };
        set.on_change(&ch, &mut out, &mut |_| None);
        assert_eq!(actions(&out), vec![e("task", "d", UPD)], "a later change of a left-out task is sent");
        let err = store.view(|t| set.complete_within(t, one - 1)).unwrap_err();
        assert_eq!((err.bytes, err.limit), (one, one - 1));
        assert!(err.to_string().contains(&format!("{one} bytes")), "{err}");
        const { assert!(COMPLETE_MAX_BYTES < 64 << 20) };
    }

    #[test]
    fn incremental_changes_skip_status_echoes_and_remove_moved_tasks() {
        let mut c = Changes::new();
        c.create(task("a", "n1", TaskState::Assigned, TaskState::Running));
        let (mut h, _) = Harness::new("n1", c);

        // The agent's own report: no update.
        let mut t = h.task("a");
        t.status.as_mut().unwrap().state = TaskState::Running as i32;
        assert!(h.write(Changes::new().update(t).clone()).is_empty());

        // Desired state change: update.
        let mut t = h.task("a");
        t.desired_state = TaskState::Shutdown as i32;
        assert_eq!(actions(&h.write(Changes::new().update(t).clone())), vec![e("task", "a", UPD)]);

        // Moved to another node: remove.
        let mut t = h.task("a");
        t.node_id = "n2".into();
        assert_eq!(actions(&h.write(Changes::new().update(t).clone())), vec![e("task", "a", REM)]);
        assert!(h.set.is_empty());
    }

    #[test]
    fn the_complete_set_sends_the_dependencies_of_its_live_tasks_first_once_each() {
        let mut c = Changes::new();
        c.create(secret("s1", b"pw")).create(secret("s2", b"other")).create(config("c1"));
        c.create(with_refs(task("a", "n1", TaskState::Running, TaskState::Running), &["s1", "s1"], &["c1"]));
        c.create(with_refs(task("b", "n1", TaskState::Assigned, TaskState::Running), &["s1"], &[]));
        // Finished: holds nothing. Another node's task: not this node's business.
        c.create(with_refs(task("d", "n1", TaskState::Failed, TaskState::Shutdown), &["s2"], &[]));
        c.create(with_refs(task("x", "n2", TaskState::Running, TaskState::Running), &["s2"], &[]));
        let (h, complete) = Harness::new("n1", c);
        let got = actions(&complete);
        assert_eq!(&got[..2], &[e("secret", "s1", UPD), e("config", "c1", UPD)], "dependencies first: {got:?}");
        let mut tasks = got[2..].to_vec();
        tasks.sort();
        assert_eq!(tasks, vec![e("task", "a", UPD), e("task", "b", UPD), e("task", "d", UPD)]);
        let Some(assignment::Item::Secret(s)) = complete[0].assignment.as_ref().unwrap().item.clone() else { panic!() };
        assert_eq!(s.spec.unwrap().data, b"pw", "an UPDATE carries the data");
        assert_eq!(h.set.dependencies(), vec![Dependency::Secret("s1".into()), Dependency::Config("c1".into())]);
    }

    #[test]
    fn dependencies_come_with_the_first_task_and_go_with_the_last() {
        let mut c = Changes::new();
        c.create(secret("s1", b"pw")).create(config("c1"));
        let (mut h, complete) = Harness::new("n1", c);
        assert!(complete.is_empty());

        // A pending task is not the node's yet: nothing, not even its secret.
        let pending = with_refs(task("a", "n1", TaskState::Pending, TaskState::Running), &["s1"], &["c1"]);
        assert!(h.write(Changes::new().create(pending).clone()).is_empty());

        // Assigned: the secret and config first, then the task.
        let mut a = h.task("a");
        a.status.as_mut().unwrap().state = TaskState::Assigned as i32;
        assert_eq!(
            actions(&h.write(Changes::new().update(a).clone())),
            vec![e("secret", "s1", UPD), e("config", "c1", UPD), e("task", "a", UPD)]
        );

        // A second task using the secret: the secret is not sent again.
        let b = with_refs(task("b", "n1", TaskState::Assigned, TaskState::Running), &["s1"], &[]);
        assert_eq!(actions(&h.write(Changes::new().create(b).clone())), vec![e("task", "b", UPD)]);

        // `a` fails: it releases the config (only it used it), the secret stays for `b`. The status echo itself
        // is not sent.
        let mut a = h.task("a");
        a.status.as_mut().unwrap().state = TaskState::Failed as i32;
        assert_eq!(actions(&h.write(Changes::new().update(a).clone())), vec![e("config", "c1", REM)]);

        // `b` is deleted: the task goes, then the secret, by ID only.
        let out = h.write(Changes::new().remove(Arc::new(h.task("b"))).clone());
        assert_eq!(actions(&out), vec![e("task", "b", REM), e("secret", "s1", REM)]);
        let Some(assignment::Item::Secret(s)) = out[1].assignment.as_ref().unwrap().item.clone() else { panic!() };
        assert_eq!(s.spec, None, "a REMOVE carries no data");
        assert!(h.set.dependencies().is_empty());

        // `a` moving away or being deleted later releases nothing twice.
        let out = h.write(Changes::new().remove(Arc::new(h.task("a"))).clone());
        assert_eq!(actions(&out), vec![e("task", "a", REM)]);
    }

    #[test]
    fn a_missing_dependency_is_not_sent_and_the_task_still_is() {
        let (mut h, _) = Harness::new("n1", Changes::new());
        let a = with_refs(task("a", "n1", TaskState::Assigned, TaskState::Running), &["gone"], &[]);
        assert_eq!(actions(&h.write(Changes::new().create(a).clone())), vec![e("task", "a", UPD)]);
        assert!(h.set.dependencies().is_empty());
        let out = h.write(Changes::new().remove(Arc::new(h.task("a"))).clone());
        assert_eq!(actions(&out), vec![e("task", "a", REM)]);
    }

    fn volume(id: &str, publications: &[(&str, volume_publish_status::State)]) -> Volume {
        Volume {
            id: id.into(),
            spec: Some(shoal_api::VolumeSpec {
                annotations: Some(shoal_api::Annotations { name: format!("name-{id}"), ..Default::default() }),
                driver: Some(shoal_api::Driver { name: "csi.test".into(), ..Default::default() }),
                // By name, as a user gives it.
                secrets: vec![VolumeSecret { key: "password".into(), secret: "name-s1".into() }],
                ..Default::default()
            }),
            volume_info: Some(shoal_api::VolumeInfo { volume_id: format!("plugin-{id}"), ..Default::default() }),
            publish_status: publications
                .iter()
                .map(|(node, state)| shoal_api::VolumePublishStatus {
                    node_id: node.to_string(),
                    state: *state as i32,
                    publish_context: [("device".to_string(), format!("/dev/{node}"))].into(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn named_secret(id: &str) -> Secret {
        let mut s = secret(id, b"pw");
        s.spec.as_mut().unwrap().annotations =
            Some(shoal_api::Annotations { name: format!("name-{id}"), ..Default::default() });
        s
    }

    /// A volume published to the node is sent as a VolumeAssignment (its secret first, named by ID, with the
    /// node's publish context) in the COMPLETE set and when it becomes PUBLISHED; once the node is to
    /// unpublish it, as a REMOVE (its secret then released); nothing for other nodes' publications, for the
    /// states in between, or for an unchanged volume written again.
    #[test]
    fn published_volumes_are_assigned_with_their_secrets_and_removed_when_the_node_must_unpublish() {
        use volume_publish_status::State;
        let mut c = Changes::new();
        c.create(named_secret("s1"));
        c.create(volume("v1", &[("n1", State::Published), ("n2", State::Published)]));
        c.create(volume("v2", &[("n1", State::PendingPublish)]));
        let (mut h, complete) = Harness::new("n1", c);
        assert_eq!(actions(&complete), vec![e("secret", "s1", UPD), e("volume", "v1", UPD)]);
        let Some(assignment::Item::Volume(a)) = complete[1].assignment.as_ref().and_then(|a| a.item.clone()) else {
            panic!("a volume assignment: {complete:?}")
        };
        assert_eq!(a.volume_id, "plugin-v1");
        assert_eq!(a.publish_context.get("device").map(String::as_str), Some("/dev/n1"));
        assert_eq!(a.secrets, vec![VolumeSecret { key: "password".into(), secret: "s1".into() }], "by ID");
        assert_eq!(a.driver.as_ref().map(|d| d.name.as_str()), Some("csi.test"));

        // v2 is published: sent; its secret is already on the node.
        let mut v2 = h.store.view(|t| (**t.volumes().get("v2").unwrap()).clone());
        v2.publish_status[0].state = State::Published as i32;
        assert_eq!(actions(&h.write(Changes::new().update(v2.clone()).clone())), vec![e("volume", "v2", UPD)]);
        // Written again unchanged: nothing.
        let v2 = h.store.view(|t| (**t.volumes().get("v2").unwrap()).clone());
        assert!(h.write(Changes::new().update(v2.clone()).clone()).is_empty());

        // Another node's publication moves: nothing for n1.
        let mut v1 = h.store.view(|t| (**t.volumes().get("v1").unwrap()).clone());
        v1.publish_status[1].state = State::PendingNodeUnpublish as i32;
        assert!(h.write(Changes::new().update(v1.clone()).clone()).is_empty());

        // n1 must unpublish v1: a REMOVE; the secret stays (v2 holds it).
        let mut v1 = h.store.view(|t| (**t.volumes().get("v1").unwrap()).clone());
        v1.publish_status[0].state = State::PendingNodeUnpublish as i32;
        assert_eq!(actions(&h.write(Changes::new().update(v1).clone())), vec![e("volume", "v1", REM)]);
        // ... and v2 too: a REMOVE, then the secret no volume holds any more.
        let mut v2 = h.store.view(|t| (**t.volumes().get("v2").unwrap()).clone());
        v2.publish_status[0].state = State::PendingNodeUnpublish as i32;
        assert_eq!(
            actions(&h.write(Changes::new().update(v2).clone())),
            vec![e("volume", "v2", REM), e("secret", "s1", REM)]
        );
        // The node unpublished v1 (PENDING_UNPUBLISH), then the plugin did (no publication): nothing sent.
        let mut v1 = h.store.view(|t| (**t.volumes().get("v1").unwrap()).clone());
        v1.publish_status[0].state = State::PendingUnpublish as i32;
        assert!(h.write(Changes::new().update(v1.clone()).clone()).is_empty());
        let mut v1 = h.store.view(|t| (**t.volumes().get("v1").unwrap()).clone());
        v1.publish_status.remove(0);
        assert!(h.write(Changes::new().update(v1).clone()).is_empty());
        // A COMPLETE set after a reconnect sends the pending REMOVE again (the node may have restarted).
        let again = h.store.view(|t| h.set.complete(t)).unwrap();
        assert_eq!(actions(&again), vec![e("volume", "v2", REM)]);
    }

    /// The fanout hands a volume's change to every node it is or was published to.
    #[test]
    fn volume_changes_concern_the_nodes_they_are_published_to() {
        use volume_publish_status::State;
        let new = volume("v1", &[("n1", State::Published), ("n2", State::PendingPublish)]);
        let old = volume("v1", &[("n1", State::PendingPublish), ("n3", State::PendingUnpublish)]);
        let ch = Change {
            kind: ActionKind::Update,
            object: Object::Volume(Arc::new(new)),
            old: Some(Object::Volume(Arc::new(old))),
        };
        assert_eq!(super::super::fanout::nodes_of_for_tests(&ch), vec!["n1", "n2", "n3"]);
    }
}
