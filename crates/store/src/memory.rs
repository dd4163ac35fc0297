//! `MemoryStore`: the tables behind one lock, read views, atomic application of committed writes, and the
//! watch queue.
//!
//! The watch queue is one bounded queue per watcher (not a shared ring): a commit is kept only until every
//! watcher has taken it, so a quiet store holds no history, and a watcher that falls `watch_queue_commits`
//! behind is told it lagged (it re-reads a view) instead of holding memory for it.
//!
//! Writes are not made here directly: a writer builds a `Changes` list from a view, the list is proposed to
//! Raft, and every member applies the committed list with `apply(index, ..)`. Application is deterministic and
//! all-or-nothing: an update whose version no longer matches, a create whose ID or name is taken, or a remove
//! of a missing object fails the whole list, on every member alike; so does a service write that refers to a
//! missing secret or config, or the removal of one a service refers to or of a cluster volume a service mounts
//! (the one cross-table rule: a writer's view cannot guarantee it, since a removal and a service write may be
//! proposed from the same view).
//! Applied objects get `meta.version.index = index` (the Raft index), which is what the next compare-and-swap
//! checks against.
//!
//! The store also remembers which indexes carried a write that failed to apply (bounded by
//! `MAX_FAILED_APPLIES_KEPT`, reset by a restore), so that a replay of the Raft log (SwarmKit's Watch resumed
//! from a version) shows only the writes that took effect.

use std::sync::Arc;

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};
use shoal_api::{Cluster, Config, Network, Node, Secret, Service, StoreSnapshot, Volume};
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio::sync::mpsc;

use crate::object::{Action, ActionKind, Object, ObjectKind, StoreObject};
use crate::table::{Table, TaskTable};
use crate::StoreError;

/// At most this many failed applications are remembered (`MemoryStore::apply_failed`); past it the oldest
/// is forgotten and `apply_outcomes_known_from` moves after it.
pub const MAX_FAILED_APPLIES_KEPT: usize = 100_000;

/// Which Raft indexes, since `known_from`, carried a write that failed to apply (a compare-and-swap that no
/// longer matched, a name taken, ...): what a replay of the Raft log must skip to see only what happened.
#[derive(Debug)]
struct ApplyOutcomes {
    known_from: u64,
    failed: std::collections::BTreeSet<u64>,
}

/// Default capacity of the watch queue, in commits. A watcher that falls further behind sees
/// `RecvError::Lagged` and must re-read the state from a fresh view.
pub const DEFAULT_WATCH_QUEUE_COMMITS: usize = 4096;

/// What happened to one object in a commit.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    /// Create, update or remove.
    pub kind: ActionKind,
    /// The object after the change (for a remove: the object as it was).
    pub object: Object,
    /// The object before the change, for updates and removes.
    pub old: Option<Object>,
}

/// One applied write: its Raft index and the changes it made, in order.
#[derive(Clone, Debug, PartialEq)]
pub struct Commit {
    /// The Raft index of the write (the new version of every object it touched).
    pub index: u64,
    /// The changes, in the order they were applied.
    pub changes: Vec<Change>,
}

/// A receiver of commits, made by `view_and_watch` or `watch`, in commit order. Bounded: when more than the
/// store's `watch_queue_commits` wait for it, later commits are not queued and the next receive past the
/// queued ones says `Lagged(missed)`: the watcher must read a fresh view (which may show it commits it
/// then also receives). Dropping it unsubscribes.
#[derive(Debug)]
pub struct Watch {
    rx: mpsc::Receiver<Arc<Commit>>,
    missed: Arc<AtomicU64>,
}

impl Watch {
    /// The next commit; `Lagged(n)` once after `n` commits were not queued for this watcher; `Closed` when
    /// the store is gone.
    pub async fn recv(&mut self) -> Result<Arc<Commit>, RecvError> {
        match self.try_recv() {
            Ok(c) => return Ok(c),
            Err(TryRecvError::Lagged(n)) => return Err(RecvError::Lagged(n)),
            Err(TryRecvError::Closed) => return Err(RecvError::Closed),
            Err(TryRecvError::Empty) => {}
        }
        // The queue is empty, so the store queues the next commit rather than counting it as missed.
        self.rx.recv().await.ok_or(RecvError::Closed)
    }

    /// The next commit if one is queued (as `recv`, without waiting).
    pub fn try_recv(&mut self) -> Result<Arc<Commit>, TryRecvError> {
        match self.rx.try_recv() {
            Ok(c) => Ok(c),
            Err(e) => match self.missed.swap(0, Ordering::AcqRel) {
                0 if e == mpsc::error::TryRecvError::Empty => Err(TryRecvError::Empty),
                0 => Err(TryRecvError::Closed),
                n => Err(TryRecvError::Lagged(n)),
            },
        }
    }
}

/// The store's end of one `Watch`.
struct Watcher {
    tx: mpsc::Sender<Arc<Commit>>,
    /// Commits not queued since the watcher last saw `Lagged`; while non-zero, nothing more is queued.
    missed: Arc<AtomicU64>,
}

/// The tables. Read them through `MemoryStore::view`.
#[derive(Clone, Debug, Default)]
pub struct Tables {
    nodes: Table<Node>,
    services: Table<Service>,
    tasks: TaskTable,
    clusters: Table<Cluster>,
    secrets: Table<Secret>,
    configs: Table<Config>,
    networks: Table<Network>,
    volumes: Table<Volume>,
    service_totals: ServiceTotals,
    last_index: u64,
}

/// What the services ask for in all, kept as services are written: the bound on the whole cluster's tasks is
/// checked against it without reading every service.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServiceTotals {
    /// Tasks the replicated services and replicated jobs ask for (replicas; a job's total completions).
    pub tasks: u64,
    /// Bytes of task specs those tasks carry (tasks x the encoded task spec).
    pub task_bytes: u64,
    /// Global services (and global jobs): each runs a task per node.
    pub global_services: u64,
    /// Bytes of one task spec of each global service, summed (x nodes for what they carry).
    pub global_task_bytes: u64,
}

impl ServiceTotals {
    /// What one service contributes.
    pub fn of(s: &Service) -> ServiceTotals {
        use shoal_api::prost::Message;
        use shoal_api::service_spec::Mode;
        let Some(spec) = &s.spec else { return ServiceTotals::default() };
        let bytes = spec.task.as_ref().map_or(0, |t| t.encoded_len() as u64);
        match &spec.mode {
            Some(Mode::Replicated(r)) => {
                ServiceTotals { tasks: r.replicas, task_bytes: r.replicas.saturating_mul(bytes), ..Default::default() }
            }
            Some(Mode::ReplicatedJob(j)) => ServiceTotals {
                tasks: j.total_completions,
                task_bytes: j.total_completions.saturating_mul(bytes),
                ..Default::default()
            },
            Some(Mode::Global(_)) | Some(Mode::GlobalJob(_)) => {
                ServiceTotals { global_services: 1, global_task_bytes: bytes, ..Default::default() }
            }
            None => ServiceTotals::default(),
        }
    }

    fn add(&mut self, o: ServiceTotals) {
        self.tasks = self.tasks.saturating_add(o.tasks);
        self.task_bytes = self.task_bytes.saturating_add(o.task_bytes);
        self.global_services = self.global_services.saturating_add(o.global_services);
        self.global_task_bytes = self.global_task_bytes.saturating_add(o.global_task_bytes);
    }

    fn sub(&mut self, o: ServiceTotals) {
        self.tasks = self.tasks.saturating_sub(o.tasks);
        self.task_bytes = self.task_bytes.saturating_sub(o.task_bytes);
        self.global_services = self.global_services.saturating_sub(o.global_services);
        self.global_task_bytes = self.global_task_bytes.saturating_sub(o.global_task_bytes);
    }
}

impl Tables {
    /// Nodes by ID.
    pub fn nodes(&self) -> &Table<Node> {
        &self.nodes
    }
    /// Services by ID and by unique name.
    pub fn services(&self) -> &Table<Service> {
        &self.services
    }
    /// Tasks, with the task indexes.
    pub fn tasks(&self) -> &TaskTable {
        &self.tasks
    }
    /// The cluster object(s).
    pub fn clusters(&self) -> &Table<Cluster> {
        &self.clusters
    }
    /// What all services ask for (see `ServiceTotals`).
    pub fn service_totals(&self) -> ServiceTotals {
        self.service_totals
    }
    /// Secrets by ID and by unique name.
    pub fn secrets(&self) -> &Table<Secret> {
        &self.secrets
    }
    /// Configs by ID and by unique name.
    pub fn configs(&self) -> &Table<Config> {
        &self.configs
    }
    /// Networks by ID and by unique name.
    pub fn networks(&self) -> &Table<Network> {
        &self.networks
    }
    /// Cluster volumes by ID and by unique name.
    pub fn volumes(&self) -> &Table<Volume> {
        &self.volumes
    }
    /// The Raft index of the last applied write (or of the snapshot restored).
    pub fn last_index(&self) -> u64 {
        self.last_index
    }

    /// The current version of an object, if present.
    fn current(&self, kind: ObjectKind, id: &str) -> Option<Object> {
        match kind {
            ObjectKind::Node => self.nodes.get(id).cloned().map(Object::Node),
            ObjectKind::Service => self.services.get(id).cloned().map(Object::Service),
            ObjectKind::Task => self.tasks.get(id).cloned().map(Object::Task),
            ObjectKind::Cluster => self.clusters.get(id).cloned().map(Object::Cluster),
            ObjectKind::Secret => self.secrets.get(id).cloned().map(Object::Secret),
            ObjectKind::Config => self.configs.get(id).cloned().map(Object::Config),
            ObjectKind::Network => self.networks.get(id).cloned().map(Object::Network),
            ObjectKind::Volume => self.volumes.get(id).cloned().map(Object::Volume),
        }
    }

    fn name_owner(&self, obj: &Object) -> Option<(&str, String)> {
        let (name, owner) = match obj {
            Object::Service(s) => (s.unique_name()?, self.services.name_owner(s.unique_name()?)),
            Object::Cluster(c) => (c.unique_name()?, self.clusters.name_owner(c.unique_name()?)),
            Object::Secret(c) => (c.unique_name()?, self.secrets.name_owner(c.unique_name()?)),
            Object::Config(c) => (c.unique_name()?, self.configs.name_owner(c.unique_name()?)),
            Object::Network(c) => (c.unique_name()?, self.networks.name_owner(c.unique_name()?)),
            Object::Volume(c) => (c.unique_name()?, self.volumes.name_owner(c.unique_name()?)),
            _ => return None,
        };
        owner.map(|o| (o, name.to_string()))
    }

    fn put(&mut self, obj: Object) -> Option<Object> {
        match obj {
            Object::Node(o) => self.nodes.insert(o).map(Object::Node),
            Object::Service(o) => {
                self.service_totals.add(ServiceTotals::of(&o));
                let old = self.services.insert(o);
                if let Some(old) = &old {
                    self.service_totals.sub(ServiceTotals::of(old));
                }
                old.map(Object::Service)
            }
            Object::Task(o) => self.tasks.insert(o).map(Object::Task),
            Object::Cluster(o) => self.clusters.insert(o).map(Object::Cluster),
            Object::Secret(o) => self.secrets.insert(o).map(Object::Secret),
            Object::Config(o) => self.configs.insert(o).map(Object::Config),
            Object::Network(o) => self.networks.insert(o).map(Object::Network),
            Object::Volume(o) => self.volumes.insert(o).map(Object::Volume),
        }
    }

    fn delete(&mut self, kind: ObjectKind, id: &str) -> Option<Object> {
        match kind {
            ObjectKind::Node => self.nodes.remove(id).map(Object::Node),
            ObjectKind::Service => {
                let old = self.services.remove(id);
                if let Some(old) = &old {
                    self.service_totals.sub(ServiceTotals::of(old));
                }
                old.map(Object::Service)
            }
            ObjectKind::Task => self.tasks.remove(id).map(Object::Task),
            ObjectKind::Cluster => self.clusters.remove(id).map(Object::Cluster),
            ObjectKind::Secret => self.secrets.remove(id).map(Object::Secret),
            ObjectKind::Config => self.configs.remove(id).map(Object::Config),
            ObjectKind::Network => self.networks.remove(id).map(Object::Network),
            ObjectKind::Volume => self.volumes.remove(id).map(Object::Volume),
        }
    }

    /// The secrets and configs a service's current spec refers to must exist; on an update, those the stored
    /// service already referred to (in its spec or previous spec) are not checked again, so that writes
    /// carrying what is already there (status updates, a rollback to the previous spec) never fail on them.
    fn check_references_of(&self, service: &Service) -> Result<(), StoreError> {
        let Some(c) = container_of(service) else { return Ok(()) };
        let stored = self.services.get(&service.id);
        let had = |secret: Option<&str>, config: Option<&str>| {
            stored.is_some_and(|s| {
                let specs = [s.spec.as_ref(), s.previous_spec.as_ref()];
                specs.into_iter().flatten().filter_map(container_of_spec).any(|c| {
                    secret.is_some_and(|id| c.secrets.iter().any(|r| r.secret_id == id))
                        || config.is_some_and(|id| c.configs.iter().any(|r| r.config_id == id))
                })
            })
        };
        let name = service.unique_name().unwrap_or("");
        let missing_secret = |r: &&shoal_api::SecretReference| {
            self.secrets.get(&r.secret_id).is_none() && !had(Some(&r.secret_id), None)
        };
        let missing_config = |r: &&shoal_api::ConfigReference| {
            self.configs.get(&r.config_id).is_none() && !had(None, Some(&r.config_id))
        };
        if let Some(r) = c.secrets.iter().find(missing_secret) {
            return Err(StoreError::DanglingReference(format!(
                "secret not found: {} (service {name} refers to it; it was removed meanwhile)",
                if r.secret_name.is_empty() { &r.secret_id } else { &r.secret_name }
            )));
        }
        if let Some(r) = c.configs.iter().find(missing_config) {
            return Err(StoreError::DanglingReference(format!(
                "config not found: {} (service {name} refers to it; it was removed meanwhile)",
                if r.config_name.is_empty() { &r.config_id } else { &r.config_name }
            )));
        }
        Ok(())
    }

    /// The networks a service's current spec attaches to must exist (those the stored service already
    /// attached to are not checked again, as for secrets).
    fn check_networks_of(&self, service: &Service) -> Result<(), StoreError> {
        let Some(spec) = &service.spec else { return Ok(()) };
        let stored = self.services.get(&service.id);
        let had = |id: &str| {
            stored.is_some_and(|s| {
                [s.spec.as_ref(), s.previous_spec.as_ref()]
                    .into_iter()
                    .flatten()
                    .any(|sp| spec_networks(sp).any(|n| n == id))
            })
        };
        if let Some(id) = spec_networks(spec).find(|id| self.networks.get(id).is_none() && !had(id)) {
            return Err(StoreError::DanglingReference(format!(
                "network not found: {id} (service {} refers to it; it was removed meanwhile)",
                service.unique_name().unwrap_or("")
            )));
        }
        Ok(())
    }

    /// No service's current spec may attach to a network being removed, and the ingress network stays while
    /// a service publishes a port through it.
    fn check_network_unused(&self, network: &Network) -> Result<(), StoreError> {
        let ingress = network.spec.as_ref().is_some_and(|s| s.ingress);
        let uses = |s: &Service| {
            s.spec.as_ref().is_some_and(|sp| {
                spec_networks(sp).any(|n| n == network.id)
                    || (ingress
                        && sp.endpoint.as_ref().is_some_and(|e| {
                            e.ports
                                .iter()
                                .any(|p| p.publish_mode == shoal_api::port_config::PublishMode::Ingress as i32)
                        }))
            })
        };
        if let Some(svc) = self.services.iter().find(|s| uses(s)) {
            return Err(StoreError::DanglingReference(format!(
                "network {} is in use by service {} (it started using it meanwhile)",
                network.unique_name().unwrap_or(&network.id),
                svc.unique_name().unwrap_or("")
            )));
        }
        Ok(())
    }

    /// A network's subnets must not overlap any other network's.
    fn check_network_subnets(&self, network: &Network) -> Result<(), StoreError> {
        let vnis = |n: &Network| {
            n.driver_state
                .as_ref()
                .and_then(|d| d.options.get(VXLAN_ID_OPTION))
                .map_or_else(Vec::new, |l| parse_vxlan_ids(l))
        };
        for v in vnis(network) {
            if let Some(other) = self.networks.iter().find(|o| o.id != network.id && vnis(o).contains(&v)) {
                return Err(StoreError::AddressConflict(format!(
                    "VXLAN ID {v} of network {} is in use by network {}; create the network again",
                    network.unique_name().unwrap_or(&network.id),
                    other.unique_name().unwrap_or(&other.id)
                )));
            }
        }
        for mine in network_subnets(network) {
            // The overlapping network with the lowest subnet, so the message does not depend on table order.
            let first = self
                .networks
                .iter()
                .filter(|o| o.id != network.id)
                .filter_map(|o| Some((network_subnets(o).find(|t| t.overlaps(&mine))?, o)))
                .min_by(|a, b| a.0.cmp(&b.0));
            if let Some((theirs, other)) = first {
                return Err(StoreError::AddressConflict(format!(
                    "subnet {mine} of network {} overlaps subnet {theirs} of network {}; choose another subnet",
                    network.unique_name().unwrap_or(&network.id),
                    other.unique_name().unwrap_or(&other.id)
                )));
            }
        }
        Ok(())
    }

    /// No service's current spec may refer to a secret or config being removed, nor mount a cluster volume
    /// being removed (`type=cluster` naming it by name or ID).
    fn check_unreferenced(&self, obj: &Object) -> Result<(), StoreError> {
        let uses = |c: &shoal_api::ContainerSpec| match obj {
            Object::Secret(s) => c.secrets.iter().any(|r| r.secret_id == s.id),
            Object::Config(s) => c.configs.iter().any(|r| r.config_id == s.id),
            Object::Volume(v) => mounts_volume(c, v),
            _ => false,
        };
        if !matches!(obj, Object::Secret(_) | Object::Config(_) | Object::Volume(_)) {
            return Ok(());
        }
        if let Some(svc) = self.services.iter().find(|s| container_of(s).is_some_and(uses)) {
            return Err(StoreError::DanglingReference(format!(
                "{} {} is in use by service {} (it started using it meanwhile)",
                obj.kind().name(),
                obj.id(),
                svc.unique_name().unwrap_or("")
            )));
        }
        Ok(())
    }

    /// A task with its spec shared with its service's other tasks where equal (other objects as they are).
    fn interned(&mut self, obj: Object) -> Object {
        match obj {
            Object::Task(t) => Object::Task(self.tasks.intern(t)),
            other => other,
        }
    }

    /// Checks and applies one action, returning the change it made.
    fn apply_one(&mut self, index: u64, action: &Action) -> Result<Change, StoreError> {
        let kind = action.object.kind();
        let id = action.object.id().to_string();
        if id.is_empty() {
            return Err(StoreError::InvalidObject(format!("{} without an ID", kind.name())));
        }
        match (&action.kind, &action.object) {
            (ActionKind::Create | ActionKind::Update, Object::Service(s)) => {
                self.check_references_of(s)?;
                self.check_networks_of(s)?;
            }
            (ActionKind::Create | ActionKind::Update, Object::Network(n)) => self.check_network_subnets(n)?,
            (ActionKind::Remove, Object::Network(_)) => {
                if let Some(Object::Network(current)) = self.current(kind, &id) {
                    self.check_network_unused(&current)?;
                }
            }
            (ActionKind::Remove, Object::Secret(_) | Object::Config(_) | Object::Volume(_)) => {
                if let Some(current) = self.current(kind, &id) {
                    self.check_unreferenced(&current)?;
                }
            }
            _ => {}
        }
        let current = self.current(kind, &id);
        match action.kind {
            ActionKind::Create => {
                if current.is_some() {
                    return Err(StoreError::Exists { kind, id });
                }
                if let Some((owner, name)) = self.name_owner(&action.object) {
                    return Err(StoreError::NameConflict { kind, name, owner: owner.to_string() });
                }
                let obj = self.interned(stamp(&action.object, index));
                self.put(obj.clone());
                Ok(Change { kind: ActionKind::Create, object: obj, old: None })
            }
            ActionKind::Update => {
                let Some(current) = current else {
                    return Err(StoreError::NotFound { kind, id });
                };
                if current.version() != action.object.version() {
                    return Err(StoreError::VersionConflict {
                        kind,
                        id,
                        expected: action.object.version(),
                        actual: current.version(),
                    });
                }
                if let Some((owner, name)) = self.name_owner(&action.object) {
                    if owner != id {
                        return Err(StoreError::NameConflict { kind, name, owner: owner.to_string() });
                    }
                }
                let obj = self.interned(stamp(&action.object, index));
                self.put(obj.clone());
                Ok(Change { kind: ActionKind::Update, object: obj, old: Some(current) })
            }
            ActionKind::Remove => {
                let Some(old) = self.delete(kind, &id) else {
                    return Err(StoreError::NotFound { kind, id });
                };
                Ok(Change { kind: ActionKind::Remove, object: old.clone(), old: Some(old) })
            }
        }
    }

    fn undo(&mut self, change: Change) {
        match change.kind {
            ActionKind::Create => {
                self.delete(change.object.kind(), change.object.id());
            }
            ActionKind::Update | ActionKind::Remove => {
                if let Some(old) = change.old {
                    self.put(old);
                }
            }
        }
    }
}

/// The container spec of a service's current spec.
fn container_of(s: &Service) -> Option<&shoal_api::ContainerSpec> {
    container_of_spec(s.spec.as_ref()?)
}

fn container_of_spec(spec: &shoal_api::ServiceSpec) -> Option<&shoal_api::ContainerSpec> {
    match spec.task.as_ref()?.runtime.as_ref()? {
        shoal_api::task_spec::Runtime::Container(c) => Some(c),
        shoal_api::task_spec::Runtime::Attachment(_) => None,
    }
}

/// True when a container spec mounts cluster volume `v` (a `type=cluster` mount whose source is its name,
/// case-insensitively as names are unique, or its ID). A mount naming a group (`group:<name>`) names no one
/// volume: layer 1 does not count it (the volume manager of layer 2 counts the volumes published to tasks).
pub fn mounts_volume(c: &shoal_api::ContainerSpec, v: &shoal_api::Volume) -> bool {
    let name = v.unique_name().unwrap_or("");
    c.mounts.iter().any(|m| {
        m.r#type == shoal_api::mount::Type::Cluster as i32
            && (m.source == v.id || (!name.is_empty() && m.source.eq_ignore_ascii_case(name)))
    })
}

/// The driver option holding an overlay network's VXLAN IDs (libnetwork's key): one per IPv4 subnet, in the
/// order of its IPAM configs, comma-separated; each unique per cluster.
pub const VXLAN_ID_OPTION: &str = "com.docker.network.driver.overlay.vxlanid_list";

/// The VXLAN IDs of a `VXLAN_ID_OPTION` value, in order (those that parse).
pub fn parse_vxlan_ids(list: &str) -> Vec<u32> {
    list.split(',').filter_map(|v| v.trim().parse().ok()).collect()
}

/// The network IDs a service spec attaches to (the task spec's and the deprecated service-level list).
pub fn spec_networks(spec: &shoal_api::ServiceSpec) -> impl Iterator<Item = &str> + '_ {
    let task = spec.task.as_ref().map(|t| t.networks.as_slice()).unwrap_or(&[]);
    task.iter().chain(spec.networks.iter()).map(|n| n.target.as_str())
}

/// The subnets a network holds (those that parse; the control API writes only valid ones).
fn network_subnets(n: &Network) -> impl Iterator<Item = crate::cidr::Cidr> + '_ {
    n.ipam.iter().flat_map(|i| i.configs.iter()).filter_map(|c| c.subnet.parse().ok())
}

/// Returns a copy of the object with its version set to `index`.
fn stamp(obj: &Object, index: u64) -> Object {
    fn with_version<T: StoreObject>(o: &Arc<T>, index: u64) -> Arc<T> {
        let mut o = (**o).clone();
        o.meta_mut().version = Some(shoal_api::Version { index });
        Arc::new(o)
    }
    match obj {
        Object::Node(o) => Object::Node(with_version(o, index)),
        Object::Service(o) => Object::Service(with_version(o, index)),
        Object::Task(o) => Object::Task(with_version(o, index)),
        Object::Cluster(o) => Object::Cluster(with_version(o, index)),
        Object::Secret(o) => Object::Secret(with_version(o, index)),
        Object::Config(o) => Object::Config(with_version(o, index)),
        Object::Network(o) => Object::Network(with_version(o, index)),
        Object::Volume(o) => Object::Volume(with_version(o, index)),
    }
}

/// The in-memory cluster state. Cheap to share (`Arc<MemoryStore>`); all methods take `&self`.
pub struct MemoryStore {
    tables: RwLock<Tables>,
    outcomes: Mutex<ApplyOutcomes>,
    watchers: Mutex<Vec<Watcher>>,
    watch_queue_commits: usize,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new(DEFAULT_WATCH_QUEUE_COMMITS)
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore").field("last_index", &self.tables.read().last_index).finish()
    }
}

impl MemoryStore {
    /// An empty store whose watch queue holds at most `watch_queue_commits` commits per watcher.
    pub fn new(watch_queue_commits: usize) -> MemoryStore {
        MemoryStore {
            tables: RwLock::new(Tables::default()),
            outcomes: Mutex::new(ApplyOutcomes { known_from: 1, failed: Default::default() }),
            watchers: Mutex::new(Vec::new()),
            watch_queue_commits: watch_queue_commits.max(1),
        }
    }

    fn subscribe(&self) -> Watch {
        let (tx, rx) = mpsc::channel(self.watch_queue_commits);
        let missed = Arc::new(AtomicU64::new(0));
        self.watchers.lock().push(Watcher { tx, missed: missed.clone() });
        Watch { rx, missed }
    }

    /// Queues `commit` for every watcher (called with the tables' write lock held, so in commit order).
    fn publish(&self, commit: &Arc<Commit>) {
        self.watchers.lock().retain(|w| {
            if w.missed.load(Ordering::Acquire) > 0 {
                w.missed.fetch_add(1, Ordering::AcqRel);
                return !w.tx.is_closed();
            }
            match w.tx.try_send(commit.clone()) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    w.missed.fetch_add(1, Ordering::AcqRel);
                    true
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            }
        });
    }

    /// Runs `f` on a consistent read view. Keep `f` short: writes wait for it.
    pub fn view<R>(&self, f: impl FnOnce(&Tables) -> R) -> R {
        f(&self.tables.read())
    }

    /// Subscribes to commits and reads a view atomically: every commit after the view is delivered, none
    /// before it ("watch before view, so no event is missed").
    pub fn view_and_watch<R>(&self, f: impl FnOnce(&Tables) -> R) -> (R, Watch) {
        let tables = self.tables.read();
        let watch = self.subscribe();
        (f(&tables), watch)
    }

    /// Subscribes to commits from now on.
    pub fn watch(&self) -> Watch {
        let _tables = self.tables.read();
        self.subscribe()
    }

    /// The index of the last applied write.
    pub fn last_index(&self) -> u64 {
        self.tables.read().last_index
    }

    /// Applies a committed list of actions at Raft index `index`, all or nothing. On success the commit is
    /// published to watchers. On failure nothing changes (but `last_index` still advances, so that the
    /// index stays in step with the log).
    pub fn apply(&self, index: u64, actions: &[Action]) -> Result<Arc<Commit>, StoreError> {
        let mut tables = self.tables.write();
        debug_assert!(index > tables.last_index || actions.is_empty(), "apply must move forward");
        tables.last_index = tables.last_index.max(index);
        let mut changes = Vec::with_capacity(actions.len());
        for action in actions {
            match tables.apply_one(index, action) {
                Ok(change) => changes.push(change),
                Err(e) => {
                    while let Some(change) = changes.pop() {
                        tables.undo(change);
                    }
                    self.record_failure(index);
                    return Err(e);
                }
            }
        }
        let commit = Arc::new(Commit { index, changes });
        if !commit.changes.is_empty() {
            self.publish(&commit);
        }
        Ok(commit)
    }

    fn record_failure(&self, index: u64) {
        let mut o = self.outcomes.lock();
        o.failed.insert(index);
        while o.failed.len() > MAX_FAILED_APPLIES_KEPT {
            if let Some(first) = o.failed.pop_first() {
                o.known_from = first + 1;
            }
        }
    }

    /// True when the write at Raft index `index` failed to apply (it changed nothing). Known only for
    /// indexes from `apply_outcomes_known_from`.
    pub fn apply_failed(&self, index: u64) -> bool {
        self.outcomes.lock().failed.contains(&index)
    }

    /// The first Raft index whose apply outcome this store knows: 1, or just after the snapshot it was
    /// restored from (or after the oldest failure it had to forget, beyond `MAX_FAILED_APPLIES_KEPT`).
    pub fn apply_outcomes_known_from(&self) -> u64 {
        self.outcomes.lock().known_from
    }

    /// Records that a log entry carrying no store change (e.g. a Raft configuration change) was applied.
    pub fn advance_index(&self, index: u64) {
        let mut tables = self.tables.write();
        tables.last_index = tables.last_index.max(index);
    }

    /// A copy of the whole state, for a Raft snapshot.
    pub fn snapshot(&self) -> (u64, StoreSnapshot) {
        let t = self.tables.read();
        let snap = StoreSnapshot {
            nodes: t.nodes.iter().map(|o| (**o).clone()).collect(),
            services: t.services.iter().map(|o| (**o).clone()).collect(),
            tasks: t.tasks.iter().map(|o| (**o).clone()).collect(),
            clusters: t.clusters.iter().map(|o| (**o).clone()).collect(),
            secrets: t.secrets.iter().map(|o| (**o).clone()).collect(),
            configs: t.configs.iter().map(|o| (**o).clone()).collect(),
            networks: t.networks.iter().map(|o| (**o).clone()).collect(),
            volumes: t.volumes.iter().map(|o| (**o).clone()).collect(),
        };
        (t.last_index, snap)
    }

    /// Replaces the whole state with a snapshot taken at `index`. Watchers are not told object by object;
    /// they see `Lagged`-free silence, so callers restore before starting subsystems.
    pub fn restore(&self, index: u64, snap: StoreSnapshot) {
        let mut t = Tables { last_index: index, ..Tables::default() };
        for o in snap.nodes {
            t.nodes.insert(Arc::new(o));
        }
        for o in snap.services {
            t.service_totals.add(ServiceTotals::of(&o));
            t.services.insert(Arc::new(o));
        }
        for o in snap.tasks {
            let task = t.tasks.intern(Arc::new(o));
            t.tasks.insert(task);
        }
        for o in snap.clusters {
            t.clusters.insert(Arc::new(o));
        }
        for o in snap.secrets {
            t.secrets.insert(Arc::new(o));
        }
        for o in snap.configs {
            t.configs.insert(Arc::new(o));
        }
        for o in snap.networks {
            t.networks.insert(Arc::new(o));
        }
        for o in snap.volumes {
            t.volumes.insert(Arc::new(o));
        }
        let mut tables = self.tables.write();
        *tables = t;
        *self.outcomes.lock() = ApplyOutcomes { known_from: index + 1, failed: Default::default() };
    }
}
