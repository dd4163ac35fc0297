//! `docker.swarmkit.v1.Watch`: a stream of the store's changes, one `WatchMessage` per commit holding the
//! events that match the request's entries (kind, action mask, selectors, all of which must match, as in
//! SwarmKit's `ConvertWatchArgs`), with the commit's Raft index as `version`. The first message is empty
//! (SwarmKit's "the watch is set up"). A secret's data never leaves (objects are redacted as the Control
//! API redacts them).
//!
//! Resuming (`resume_from`): the stream starts with every matching change after that version, read back
//! from the Raft log (`CommittedLog`, SwarmKit's `ChangesBetween`) up to the store's last index at
//! subscription time, then continues with live commits. Writes that failed to apply are skipped (the store
//! remembers them, `MemoryStore::apply_failed`). Replayed updates carry no old object (the log holds only
//! the new one), as in SwarmKit. A version older than the log or than what the store knows about is refused
//! with OUT_OF_RANGE: list the objects again and watch from their versions.
//!
//! Bounds: at most `MAX_WATCH_ENTRIES` entries of `MAX_FILTERS_PER_ENTRY` selectors; a subscriber holds at
//! most the store's watch queue (4096 commits) plus `SUBSCRIBER_QUEUE_MESSAGES` messages; one that falls
//! further behind gets ABORTED naming the last version it was sent, to resume from. The replay reads
//! `LOG_READ_CHUNK_ENTRIES` entries at a time, each message holds at most `MAX_EVENTS_PER_MESSAGE` events.

use std::sync::Arc;

use shoal_api::watch_server::Watch;
use shoal_api::{
    object, select_by, watch_message, watch_request, Object as WireObject, SelectBy, WatchActionKind, WatchMessage,
    WatchRequest,
};
use shoal_raft::{CommittedLog, LogReadError};
use shoal_store::{ActionKind, Change, Object, ObjectKind, StoreObject, WatchError};
use tokio::sync::{mpsc, watch as tokio_watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::read_barrier;
use crate::state::ClusterState;

/// Most entries one request may hold.
pub(crate) const MAX_WATCH_ENTRIES: usize = 64;
/// Most selectors one entry may hold.
pub(super) const MAX_FILTERS_PER_ENTRY: usize = 16;
/// Messages queued for one subscriber between the store's watch queue and the connection.
pub(crate) const SUBSCRIBER_QUEUE_MESSAGES: usize = 64;
/// Log entries read per step of a replay.
pub(crate) const LOG_READ_CHUNK_ENTRIES: u64 = 256;
/// Most events in one message; a larger commit is sent as several messages of the same version.
pub(crate) const MAX_EVENTS_PER_MESSAGE: usize = 1000;

/// The Watch service over a manager's store, resuming through `log` when there is one.
#[derive(Clone)]
pub struct WatchService {
    state: ClusterState,
    log: Option<Arc<dyn CommittedLog>>,
    shutdown: Option<tokio_watch::Receiver<bool>>,
}

impl std::fmt::Debug for WatchService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchService").field("resumable", &self.log.is_some()).finish()
    }
}

impl WatchService {
    /// The service over `state`; `log` (the Raft node) makes `resume_from` work; streams end when
    /// `shutdown` turns true.
    pub fn new(
        state: ClusterState,
        log: Option<Arc<dyn CommittedLog>>,
        shutdown: Option<tokio_watch::Receiver<bool>>,
    ) -> WatchService {
        WatchService { state, log, shutdown }
    }

    /// The shutdown signal it was given, if any (for streams made from this one).
    pub fn shutdown_signal(&self) -> Option<tokio_watch::Receiver<bool>> {
        self.shutdown.clone()
    }

    /// True once the shutdown it was given has turned true.
    pub fn stopping(&self) -> bool {
        self.shutdown.as_ref().is_some_and(|rx| *rx.borrow())
    }

    /// As a tonic service.
    pub fn server(self) -> shoal_api::watch_server::WatchServer<WatchService> {
        shoal_api::watch_server::WatchServer::new(self)
    }
}

/// One selector of an entry, checked against an object.
#[derive(Debug, Clone, PartialEq)]
enum Check {
    Id(String),
    IdPrefix(String),
    Name(String),
    NamePrefix(String),
    ServiceId(String),
    NodeId(String),
    Slot(String, u64),
    DesiredState(i32),
    Role(i32),
    Membership(i32),
    ReferencedSecret(String),
    ReferencedConfig(String),
}

/// One entry of a request, parsed.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    kind: ObjectKind,
    /// Bits of `WatchActionKind`.
    actions: i32,
    checks: Vec<Check>,
}

const ALL_ACTIONS: i32 = WatchActionKind::WatchActionCreate as i32
    | WatchActionKind::WatchActionUpdate as i32
    | WatchActionKind::WatchActionRemove as i32;

fn kind_of(name: &str) -> Result<ObjectKind, Status> {
    Ok(match name {
        "node" => ObjectKind::Node,
        "service" => ObjectKind::Service,
        "task" => ObjectKind::Task,
        "cluster" => ObjectKind::Cluster,
        "secret" => ObjectKind::Secret,
        "config" => ObjectKind::Config,
        "network" => ObjectKind::Network,
        "volume" => ObjectKind::Volume,
        "" => return Err(Status::invalid_argument("no kind of object specified: set kind (e.g. \"service\")")),
        other => {
            return Err(Status::invalid_argument(format!(
                "kind {other:?} cannot be watched on Shoal: use node, service, task, cluster, secret, config, network \
                 or volume"
            )))
        }
    })
}

fn parse_entry(e: &watch_request::WatchEntry) -> Result<Entry, Status> {
    let kind = kind_of(&e.kind)?;
    if e.action == 0 || e.action & !ALL_ACTIONS != 0 {
        return Err(Status::invalid_argument(format!(
            "action {} of the {} entry is not a mask of WATCH_ACTION_CREATE (1), WATCH_ACTION_UPDATE (2) and \
             WATCH_ACTION_REMOVE (4)",
            e.action, e.kind
        )));
    }
    if e.filters.len() > MAX_FILTERS_PER_ENTRY {
        return Err(Status::invalid_argument(format!(
            "the {} entry has {} filters; at most {MAX_FILTERS_PER_ENTRY} are allowed",
            e.kind,
            e.filters.len()
        )));
    }
    let mut checks: Vec<Check> = Vec::new();
    for SelectBy { by } in &e.filters {
        let Some(by) = by else {
            return Err(Status::invalid_argument(format!("an empty filter in the {} entry: set one selector", e.kind)));
        };
        let (class, check) = match by.clone() {
            select_by::By::Id(v) => ("id", Check::Id(v)),
            select_by::By::IdPrefix(v) => ("id", Check::IdPrefix(v)),
            select_by::By::Name(v) => ("name", Check::Name(v)),
            select_by::By::NamePrefix(v) => ("name", Check::NamePrefix(v)),
            select_by::By::ServiceId(v) if kind == ObjectKind::Task => ("service", Check::ServiceId(v)),
            select_by::By::NodeId(v) if kind == ObjectKind::Task => ("node", Check::NodeId(v)),
            select_by::By::Slot(s) if kind == ObjectKind::Task => ("service", Check::Slot(s.service_id, s.slot)),
            select_by::By::DesiredState(v) if kind == ObjectKind::Task => ("desired_state", Check::DesiredState(v)),
            select_by::By::Role(v) if kind == ObjectKind::Node => ("role", Check::Role(v)),
            select_by::By::Membership(v) if kind == ObjectKind::Node => ("membership", Check::Membership(v)),
            select_by::By::ReferencedSecretId(v) if kind == ObjectKind::Service => {
                ("referenced_secret_id", Check::ReferencedSecret(v))
            }
            select_by::By::ReferencedConfigId(v) if kind == ObjectKind::Service => {
                ("referenced_config_id", Check::ReferencedConfig(v))
            }
            other => {
                return Err(Status::invalid_argument(format!(
                    "filter {} does not apply to {} objects on Shoal (custom indexes and networks do not exist here)",
                    selector_name(&other),
                    e.kind
                )))
            }
        };
        if checks.iter().any(|c| class_of(c) == class) {
            return Err(Status::invalid_argument(format!(
                "conflicting filters in the {} entry: two {class} selectors",
                e.kind
            )));
        }
        checks.push(check);
    }
    Ok(Entry { kind, actions: e.action, checks })
}

fn selector_name(by: &select_by::By) -> &'static str {
    match by {
        select_by::By::Id(_) => "id",
        select_by::By::IdPrefix(_) => "id_prefix",
        select_by::By::Name(_) => "name",
        select_by::By::NamePrefix(_) => "name_prefix",
        select_by::By::Custom(_) => "custom",
        select_by::By::CustomPrefix(_) => "custom_prefix",
        select_by::By::ServiceId(_) => "service_id",
        select_by::By::NodeId(_) => "node_id",
        select_by::By::Slot(_) => "slot",
        select_by::By::DesiredState(_) => "desired_state",
        select_by::By::Role(_) => "role",
        select_by::By::Membership(_) => "membership",
        select_by::By::ReferencedNetworkId(_) => "referenced_network_id",
        select_by::By::ReferencedSecretId(_) => "referenced_secret_id",
        select_by::By::ReferencedConfigId(_) => "referenced_config_id",
        select_by::By::Kind(_) => "kind",
    }
}

fn class_of(c: &Check) -> &'static str {
    match c {
        Check::Id(_) | Check::IdPrefix(_) => "id",
        Check::Name(_) | Check::NamePrefix(_) => "name",
        Check::ServiceId(_) | Check::Slot(..) => "service",
        Check::NodeId(_) => "node",
        Check::DesiredState(_) => "desired_state",
        Check::Role(_) => "role",
        Check::Membership(_) => "membership",
        Check::ReferencedSecret(_) => "referenced_secret_id",
        Check::ReferencedConfig(_) => "referenced_config_id",
    }
}

/// The name selectors match: a node's spec name or hostname, a task's name as SwarmKit forms it
/// (`service.slot.id`), the others' annotations name.
fn name_of(o: &Object) -> String {
    match o {
        Object::Node(n) => crate::controlapi::node_name(n).to_string(),
        Object::Task(t) => {
            if let Some(n) = t.annotations.as_ref().map(|a| a.name.as_str()).filter(|n| !n.is_empty()) {
                return n.to_string();
            }
            let svc = t.service_annotations.as_ref().map(|a| a.name.as_str()).unwrap_or(&t.service_id);
            if t.slot != 0 {
                format!("{svc}.{}.{}", t.slot, t.id)
            } else {
                format!("{svc}.{}.{}", t.node_id, t.id)
            }
        }
        other => other.unique_name().unwrap_or_default().to_string(),
    }
}

trait UniqueName {
    fn unique_name(&self) -> Option<&str>;
}

impl UniqueName for Object {
    fn unique_name(&self) -> Option<&str> {
        match self {
            Object::Node(o) => o.unique_name(),
            Object::Service(o) => o.unique_name(),
            Object::Task(o) => o.unique_name(),
            Object::Cluster(o) => o.unique_name(),
            Object::Secret(o) => o.unique_name(),
            Object::Config(o) => o.unique_name(),
            Object::Network(o) => o.unique_name(),
            Object::Volume(o) => o.unique_name(),
        }
    }
}

fn container_of(s: &shoal_api::Service) -> Option<&shoal_api::ContainerSpec> {
    match s.spec.as_ref()?.task.as_ref()?.runtime.as_ref()? {
        shoal_api::task_spec::Runtime::Container(c) => Some(c),
        shoal_api::task_spec::Runtime::Attachment(_) => None,
    }
}

fn check(c: &Check, o: &Object) -> bool {
    match (c, o) {
        (Check::Id(v), o) => o.id() == v,
        (Check::IdPrefix(v), o) => o.id().starts_with(v.as_str()),
        (Check::Name(v), o) => name_of(o) == *v,
        (Check::NamePrefix(v), o) => name_of(o).starts_with(v.as_str()),
        (Check::ServiceId(v), Object::Task(t)) => t.service_id == *v,
        (Check::NodeId(v), Object::Task(t)) => t.node_id == *v,
        (Check::Slot(s, n), Object::Task(t)) => t.service_id == *s && t.slot == *n,
        (Check::DesiredState(v), Object::Task(t)) => t.desired_state == *v,
        (Check::Role(v), Object::Node(n)) => n.role == *v,
        (Check::Membership(v), Object::Node(n)) => n.spec.as_ref().is_some_and(|s| s.membership == *v),
        (Check::ReferencedSecret(v), Object::Service(s)) => {
            container_of(s).is_some_and(|c| c.secrets.iter().any(|r| r.secret_id == *v))
        }
        (Check::ReferencedConfig(v), Object::Service(s)) => {
            container_of(s).is_some_and(|c| c.configs.iter().any(|r| r.config_id == *v))
        }
        _ => false,
    }
}

fn action_of(k: ActionKind) -> WatchActionKind {
    match k {
        ActionKind::Create => WatchActionKind::WatchActionCreate,
        ActionKind::Update => WatchActionKind::WatchActionUpdate,
        ActionKind::Remove => WatchActionKind::WatchActionRemove,
    }
}

fn matches(entries: &[Entry], action: ActionKind, o: &Object) -> bool {
    let bit = action_of(action) as i32;
    entries.iter().any(|e| e.kind == o.kind() && e.actions & bit != 0 && e.checks.iter().all(|c| check(c, o)))
}

/// `o` on the wire, as the Control API shows it (a secret without data, a cluster without its keys), with
/// `version` stamped when given (a replayed write: the log holds the object as proposed).
fn wire(o: &Object, version: Option<u64>) -> WireObject {
    fn stamp<T: StoreObject + Clone>(o: &T, version: Option<u64>) -> T {
        let mut o = o.clone();
        if let Some(index) = version {
            o.meta_mut().version = Some(shoal_api::Version { index });
        }
        o
    }
    let inner = match o {
        Object::Node(n) => object::Object::Node(stamp(&**n, version)),
        Object::Service(s) => object::Object::Service(stamp(&**s, version)),
        Object::Task(t) => object::Object::Task(stamp(&**t, version)),
        Object::Cluster(c) => {
            let mut c = stamp(&**c, version);
            if let Some(r) = c.root_ca.as_mut() {
                r.ca_key.clear();
            }
            c.unlock_keys.clear();
            c.network_bootstrap_keys.clear();
            c.encryption_key_lamport_clock = 0;
            object::Object::Cluster(c)
        }
        Object::Secret(s) => {
            let mut s = stamp(&**s, version);
            if let Some(spec) = s.spec.as_mut() {
                spec.data.clear();
            }
            object::Object::Secret(s)
        }
        Object::Config(c) => object::Object::Config(stamp(&**c, version)),
        Object::Network(n) => object::Object::Network(stamp(&**n, version)),
        Object::Volume(v) => object::Object::Volume(stamp(&**v, version)),
    };
    WireObject { object: Some(inner) }
}

/// The events of one live commit that match.
fn live_events(entries: &[Entry], changes: &[Change], include_old: bool) -> Vec<watch_message::Event> {
    changes
        .iter()
        .filter(|c| matches(entries, c.kind, &c.object))
        .map(|c| watch_message::Event {
            action: action_of(c.kind) as i32,
            object: Some(wire(&c.object, None)),
            old_object: match (&c.old, c.kind, include_old) {
                (Some(old), ActionKind::Update, true) => Some(wire(old, None)),
                _ => None,
            },
        })
        .collect()
}

/// The events of one replayed write that match (no old objects: the log does not hold them).
fn logged_events(entries: &[Entry], index: u64, actions: &[shoal_store::Action]) -> Vec<watch_message::Event> {
    actions
        .iter()
        .filter(|a| matches(entries, a.kind, &a.object))
        .map(|a| {
            let version = (a.kind != ActionKind::Remove).then_some(index);
            watch_message::Event {
                action: action_of(a.kind) as i32,
                object: Some(wire(&a.object, version)),
                old_object: None,
            }
        })
        .collect()
}

type Tx = mpsc::Sender<Result<WatchMessage, Status>>;

/// Sends `events` of version `index` in messages of at most `MAX_EVENTS_PER_MESSAGE`; false once the
/// subscriber is gone.
async fn send_events(tx: &Tx, index: u64, mut events: Vec<watch_message::Event>) -> bool {
    while !events.is_empty() {
        let rest = events.split_off(events.len().min(MAX_EVENTS_PER_MESSAGE));
        let msg = WatchMessage { events, version: Some(shoal_api::Version { index }) };
        if tx.send(Ok(msg)).await.is_err() {
            return false;
        }
        events = rest;
    }
    true
}

struct Subscription {
    entries: Vec<Entry>,
    include_old: bool,
    resume_from: Option<u64>,
    /// The store's last index when the live watch was taken: the replay ends there.
    last: u64,
    watch: shoal_store::Watch,
}

async fn replay(
    state: &ClusterState,
    log: &dyn CommittedLog,
    sub: &Subscription,
    from: u64,
    tx: &Tx,
) -> Result<bool, Status> {
    let mut low = from + 1;
    while low <= sub.last {
        let writes = log.read_committed(low, sub.last + 1, LOG_READ_CHUNK_ENTRIES).await.map_err(|e| match e {
            LogReadError::Compacted { first, .. } => out_of_range(from, first.saturating_sub(1)),
            other => Status::unavailable(other.to_string()),
        })?;
        for w in writes {
            if state.store.apply_failed(w.index) {
                continue;
            }
            let events = logged_events(&sub.entries, w.index, &w.actions);
            if !events.is_empty() && !send_events(tx, w.index, events).await {
                return Ok(false);
            }
        }
        low = (low + LOG_READ_CHUNK_ENTRIES).min(sub.last + 1);
    }
    Ok(true)
}

fn out_of_range(asked: u64, oldest: u64) -> Status {
    Status::out_of_range(format!(
        "cannot resume from version {asked}: this manager keeps changes from version {oldest} on; list the objects \
         again and watch from their versions"
    ))
}

async fn run(
    state: ClusterState,
    log: Option<Arc<dyn CommittedLog>>,
    mut sub: Subscription,
    tx: Tx,
    mut shutdown: Option<tokio_watch::Receiver<bool>>,
) {
    if tx.send(Ok(WatchMessage::default())).await.is_err() {
        return;
    }
    let mut seen = sub.last;
    if let (Some(from), Some(log)) = (sub.resume_from, log.as_deref()) {
        if from < sub.last {
            match replay(&state, log, &sub, from, &tx).await {
                Ok(true) => {}
                Ok(false) => return,
                Err(status) => {
                    let _ = tx.send(Err(status)).await;
                    return;
                }
            }
        }
    }
    let floor = sub.resume_from.unwrap_or(0).max(sub.last);
    loop {
        let stopping = async {
            match shutdown.as_mut() {
                Some(rx) => crate::stopped(rx).await,
                None => std::future::pending().await,
            }
        };
        let commit = tokio::select! {
            _ = tx.closed() => return,
            _ = stopping => {
                let _ = tx.send(Err(Status::unavailable("the manager is stopping: watch another manager, resuming from \
                                                         the last version received"))).await;
                return;
            }
            c = sub.watch.recv() => c,
        };
        match commit {
            Ok(c) => {
                if c.index <= floor {
                    continue;
                }
                seen = c.index;
                let events = live_events(&sub.entries, &c.changes, sub.include_old);
                if !events.is_empty() && !send_events(&tx, c.index, events).await {
                    return;
                }
            }
            Err(WatchError::Lagged(n)) => {
                let _ = tx
                    .send(Err(Status::aborted(format!(
                        "this watch fell {n} commits behind and was dropped (a subscriber holds at most the store's \
                         watch queue); watch again with resume_from = {seen}"
                    ))))
                    .await;
                return;
            }
            Err(WatchError::Closed) => {
                let _ = tx.send(Err(Status::unavailable("the store closed: the manager is stopping"))).await;
                return;
            }
        }
    }
}

#[tonic::async_trait]
impl Watch for WatchService {
    type WatchStream = ReceiverStream<Result<WatchMessage, Status>>;

    async fn watch(&self, req: Request<WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let r = req.into_inner();
        if r.entries.is_empty() {
            return Err(Status::invalid_argument("a watch needs at least one entry (a kind and actions to watch)"));
        }
        if r.entries.len() > MAX_WATCH_ENTRIES {
            return Err(Status::invalid_argument(format!(
                "{} entries; at most {MAX_WATCH_ENTRIES} are allowed in one watch",
                r.entries.len()
            )));
        }
        let entries = r.entries.iter().map(parse_entry).collect::<Result<Vec<_>, _>>()?;
        read_barrier(&self.state).await?;
        let (last, watch) = self.state.store.view_and_watch(|t| t.last_index());
        let resume_from = r.resume_from.map(|v| v.index);
        if let Some(from) = resume_from {
            if from < last {
                if self.log.is_none() {
                    return Err(Status::failed_precondition(
                        "this manager keeps no Raft log to resume from; watch without resume_from",
                    ));
                }
                let known = self.state.store.apply_outcomes_known_from();
                if from + 1 < known {
                    return Err(out_of_range(from, known - 1));
                }
            }
        }
        let (tx, rx) = mpsc::channel(SUBSCRIBER_QUEUE_MESSAGES);
        let sub = Subscription { entries, include_old: r.include_old_object, resume_from, last, watch };
        tokio::spawn(run(self.state.clone(), self.log.clone(), sub, tx, self.shutdown.clone()));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
