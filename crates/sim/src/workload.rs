//! The random workload: an API client that creates, updates (image, environment, replica count) and
//! removes services through the control API functions the Engine API calls (`controlapi::create_service`,
//! `update_service`, `remove_service`), one request at a time, sent to a manager it picks (mostly the one
//! it believes leads). Every outcome goes into the `Ledger`: acknowledged writes with the Raft entry
//! that carries them (index, term, digest, read from the answering manager's applied log), and what might
//! have happened (an unknown outcome), which the checks must allow.
//!
//! Now and then it reads through a read barrier (Raft's ReadIndex) from a manager picked at random, leader
//! or follower: once the barrier passes, that manager's store must hold every service whose creation was
//! acknowledged before the read began and that no removal was sent for (`Ledger::stale_reads`).
//!
//! Now and then it drains a node (while two others stay active) or makes one active again.
//! Services are replicated, global, replicated jobs and global jobs; updates change the image (the task
//! template), the environment, or the replica count (completions for a job), and stop-first or start-first.
//! Specs use short restart delays and update settings so a run converges within a bounded number of
//! steps, and no labels (maps would make encodings differ between runs).

use std::collections::{BTreeMap, BTreeSet};

use rand::rngs::StdRng;
use rand::Rng;
use shoal_api::{
    node_spec::Availability, restart_policy::RestartCondition, service_spec::Mode, task_spec::Runtime,
    update_config::FailureAction, update_config::UpdateOrder, Annotations, ContainerSpec, GlobalService,
    ReplicatedService, RestartPolicy, Service, ServiceSpec, TaskSpec, UpdateConfig,
};
use shoal_manager::controlapi::{self, ControlError};
use shoal_manager::ClusterState;
use shoal_store::StoreObject;

use crate::exec::{poll_once, SimFuture};

/// Most services the client keeps at once.
pub const MAX_SERVICES: usize = 6;
/// Most replicas it asks for.
pub const MAX_REPLICAS: u64 = 4;

/// An acknowledged write: the entry that carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acked {
    /// What it was.
    pub what: String,
    /// Its Raft index and term, and the digest of the entry's data.
    pub index: u64,
    /// Its term.
    pub term: u64,
    /// Digest of the entry's data.
    pub digest: u64,
}

/// What the client knows happened.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Acknowledged writes.
    pub acked: Vec<Acked>,
    /// Services created with an acknowledgement: ID -> index.
    pub created: BTreeMap<String, u64>,
    /// Services a removal was sent for (acknowledged or unknown): their absence is allowed.
    pub maybe_removed: BTreeSet<String>,
    /// Requests sent, answered OK, failed for sure, of unknown outcome.
    pub sent: u64,
    /// Answered OK.
    pub ok: u64,
    /// Failed with nothing written.
    pub refused: u64,
    /// Outcome unknown.
    pub unknown: u64,
    /// Acknowledged writes whose entry is still to be read from the answering manager: (what, manager, index).
    pub to_resolve: Vec<(String, u64, u64)>,
    /// Answers that say the store refused what validation let through (`ControlError::Internal`): bugs.
    pub internal_errors: Vec<String>,
    /// Reads through a read barrier that missed an acknowledged write: bugs.
    pub stale_reads: Vec<String>,
    /// Read barriers passed.
    pub reads: u64,
}

enum Op {
    Create,
    Update(String),
    Remove(String),
    /// Drain or activate a node.
    Node(String, bool),
    /// A read through a read barrier that must see these services (acknowledged, never sent a removal).
    Read(BTreeSet<String>),
    /// Create the overlay network `NETWORK` that services may join.
    Network,
    /// Create the cluster volume `VOLUME` that replicated services may mount.
    Volume,
}

/// The overlay network the client makes first; about half of the services it creates join it, so the
/// allocator gives their tasks and VIPs addresses (`World::check_addresses`).
pub const NETWORK: &str = "simnet";
/// The cluster volume of the workload (single-node, shared by all its tasks, on the simulated CSI plugin).
pub const VOLUME: &str = "simdisk";

/// What a read found missing: the services it had to see and did not.
const STALE: &str = "stale read, missing";

struct InFlight {
    op: Op,
    manager: u64,
    fut: SimFuture<Result<Option<Service>, ControlError>>,
}

/// The client.
#[derive(Default)]
pub struct Client {
    in_flight: Option<InFlight>,
    next_at_ms: u64,
    created: u64,
    /// Whether `NETWORK` exists (its creation was acknowledged, or refused as existing).
    network: bool,
    /// Whether `VOLUME` exists (likewise).
    volume: bool,
    /// The manager it believes leads.
    pub leader_guess: u64,
    /// The ledger.
    pub ledger: Ledger,
}

/// The modes a service is created in.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Replicated,
    Global,
    ReplicatedJob,
    GlobalJob,
}

fn mode(kind: Kind, rng: &mut StdRng) -> Mode {
    match kind {
        Kind::Replicated => Mode::Replicated(ReplicatedService { replicas: rng.random_range(0..=MAX_REPLICAS) }),
        Kind::Global => Mode::Global(GlobalService {}),
        Kind::ReplicatedJob => Mode::ReplicatedJob(shoal_api::ReplicatedJob {
            max_concurrent: rng.random_range(1..=2),
            total_completions: rng.random_range(1..=MAX_REPLICAS),
        }),
        Kind::GlobalJob => Mode::GlobalJob(shoal_api::GlobalJob {}),
    }
}

fn spec(name: &str, rng: &mut StdRng, kind: Kind) -> ServiceSpec {
    let mode = mode(kind, rng);
    let order = if rng.random_bool(0.3) { UpdateOrder::StartFirst } else { UpdateOrder::StopFirst };
    let ms = |v: u64| Some(shoal_api::duration_to_proto(std::time::Duration::from_millis(v)));
    ServiceSpec {
        annotations: Some(Annotations { name: name.to_string(), ..Default::default() }),
        task: Some(TaskSpec {
            runtime: Some(Runtime::Container(ContainerSpec {
                image: format!("img:{}", rng.random_range(1..4)),
                ..Default::default()
            })),
            restart: Some(RestartPolicy {
                condition: RestartCondition::Any as i32,
                delay: ms(rng.random_range(0..=5) * 100),
                max_attempts: 0,
                window: None,
            }),
            ..Default::default()
        }),
        update: Some(UpdateConfig {
            parallelism: rng.random_range(1..=2),
            delay: ms(rng.random_range(0..=3) * 100),
            failure_action: FailureAction::Continue as i32,
            monitor: ms(500),
            order: order as i32,
            ..Default::default()
        }),
        mode: Some(mode),
        ..Default::default()
    }
}

/// The spec for `kind`: jobs take no update config (a spec update runs a job again).
fn spec_of(name: &str, rng: &mut StdRng, kind: Kind) -> ServiceSpec {
    let mut s = spec(name, rng, kind);
    if matches!(kind, Kind::ReplicatedJob | Kind::GlobalJob) {
        s.update = None;
    }
    s
}

/// A random change to service `id` (one of `services`): its task, an environment variable, or its count or
/// update config.
fn update(state: ClusterState, services: &[std::sync::Arc<Service>], id: &str, rng: &mut StdRng) -> Request {
    let current = services.iter().find(|s| s.id == id).expect("listed").clone();
    let mut next = current.spec.clone().unwrap_or_default();
    let name = next.annotations.as_ref().map(|a| a.name.clone()).unwrap_or_default();
    let fresh = spec(&name, rng, Kind::Replicated);
    match rng.random_range(0..3) {
        0 => next.task = fresh.task,
        1 => {
            if let Some(Runtime::Container(c)) = next.task.as_mut().and_then(|t| t.runtime.as_mut()) {
                c.env = vec![format!("N={}", rng.random_range(0..100))];
            }
        }
        _ => match &mut next.mode {
            Some(Mode::Replicated(r)) => r.replicas = rng.random_range(0..=MAX_REPLICAS),
            Some(Mode::ReplicatedJob(j)) => j.total_completions = rng.random_range(1..=MAX_REPLICAS),
            Some(Mode::GlobalJob(_)) => {}
            _ => next.update = fresh.update,
        },
    }
    let (id, version) = (id.to_string(), current.version());
    Box::pin(async move { controlapi::update_service(&state, &id, version, next).await.map(Some) })
}

/// A request sent to a manager: its answer, the service it wrote (if any).
type Request = SimFuture<Result<Option<Service>, ControlError>>;

impl Client {
    /// True while a request is waiting for its answer.
    pub fn busy(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Polls the request in flight; maybe sends a new one (when `send` is true). `states` are the managers
    /// that are up, by Raft ID.
    pub fn step(
        &mut self,
        now_ms: u64,
        send: bool,
        states: &BTreeMap<u64, ClusterState>,
        rng: &mut StdRng,
    ) -> Vec<String> {
        let mut events = Vec::new();
        if let Some(f) = &mut self.in_flight {
            let done = if states.contains_key(&f.manager) {
                poll_once(&mut f.fut)
            } else {
                Some(Err(ControlError::Unavailable("the manager crashed".into())))
            };
            if let Some(result) = done {
                let f = self.in_flight.take().expect("in flight");
                events.push(self.record(f, result));
            }
        }
        if !send || self.in_flight.is_some() || now_ms < self.next_at_ms || states.is_empty() {
            return events;
        }
        self.next_at_ms = now_ms + rng.random_range(50..1500);
        let ids: Vec<u64> = states.keys().copied().collect();
        // Reads go to any manager, leader or follower; writes mostly to the one believed to lead.
        let read = rng.random_bool(0.2);
        let manager = if !read && states.contains_key(&self.leader_guess) && rng.random_bool(0.8) {
            self.leader_guess
        } else {
            ids[rng.random_range(0..ids.len())]
        };
        let state = states[&manager].clone();
        let services: Vec<std::sync::Arc<Service>> = controlapi::list_services(&state, &Default::default());
        let nodes = controlapi::list_nodes(&state, &Default::default());
        let op = self.choose(read, &services, &nodes, rng);
        let fut = self.request(&op, state, &services, &nodes, rng);
        self.ledger.sent += 1;
        self.in_flight = Some(InFlight { op, manager, fut });
        // The first poll at once: a request to a follower fails here.
        if let Some(f) = &mut self.in_flight {
            if let Some(result) = poll_once(&mut f.fut) {
                let f = self.in_flight.take().expect("in flight");
                events.push(self.record(f, result));
            }
        }
        events
    }

    /// The next request (`read`: a read), given the cluster's `services` and `nodes`.
    fn choose(
        &self,
        read: bool,
        services: &[std::sync::Arc<Service>],
        nodes: &[std::sync::Arc<shoal_api::Node>],
        rng: &mut StdRng,
    ) -> Op {
        let active =
            |n: &shoal_api::Node| n.spec.as_ref().is_none_or(|s| s.availability == Availability::Active as i32);
        if !self.network {
            Op::Network
        } else if !self.volume {
            Op::Volume
        } else if read {
            Op::Read(
                self.ledger.created.keys().filter(|id| !self.ledger.maybe_removed.contains(*id)).cloned().collect(),
            )
        } else if !nodes.is_empty() && rng.random_bool(0.05) {
            let n = &nodes[rng.random_range(0..nodes.len())];
            // Drain only while at least two other nodes are active.
            let drain = active(n) && nodes.iter().filter(|m| active(m)).count() > 2;
            Op::Node(n.id.clone(), drain)
        } else if services.len() < 2 || (services.len() < MAX_SERVICES && rng.random_bool(0.3)) {
            Op::Create
        } else {
            let s = &services[rng.random_range(0..services.len())];
            if rng.random_bool(0.2) {
                Op::Remove(s.id.clone())
            } else {
                Op::Update(s.id.clone())
            }
        }
    }

    /// Sends `op` to the manager whose state is `state`.
    fn request(
        &mut self,
        op: &Op,
        state: ClusterState,
        services: &[std::sync::Arc<Service>],
        nodes: &[std::sync::Arc<shoal_api::Node>],
        rng: &mut StdRng,
    ) -> Request {
        match op {
            Op::Create => self.create(state, rng),
            Op::Update(id) => update(state, services, id, rng),
            Op::Remove(id) => {
                self.ledger.maybe_removed.insert(id.clone());
                let id = id.clone();
                Box::pin(async move { controlapi::remove_service(&state, &id).await.map(|_| None) })
            }
            Op::Network => {
                let spec = shoal_api::NetworkSpec {
                    annotations: Some(Annotations { name: NETWORK.into(), ..Default::default() }),
                    driver_config: Some(shoal_api::Driver { name: "overlay".into(), ..Default::default() }),
                    ..Default::default()
                };
                Box::pin(async move { controlapi::create_network(&state, spec).await.map(|_| None) })
            }
            Op::Volume => {
                use shoal_api::volume_access_mode::{Scope, Sharing};
                let spec = shoal_api::VolumeSpec {
                    annotations: Some(Annotations { name: VOLUME.into(), ..Default::default() }),
                    driver: Some(shoal_api::Driver { name: crate::csi::PLUGIN.into(), ..Default::default() }),
                    access_mode: Some(shoal_api::VolumeAccessMode {
                        scope: Scope::SingleNode as i32,
                        sharing: Sharing::All as i32,
                        access_type: Some(shoal_api::volume_access_mode::AccessType::Mount(Default::default())),
                    }),
                    ..Default::default()
                };
                Box::pin(async move { controlapi::create_volume(&state, spec).await.map(|_| None) })
            }
            Op::Read(must_see) => {
                let must_see = must_see.clone();
                Box::pin(async move {
                    state.read_barrier().await.map_err(|e| ControlError::Unavailable(e.to_string()))?;
                    let seen: BTreeSet<String> =
                        controlapi::list_services(&state, &Default::default()).iter().map(|s| s.id.clone()).collect();
                    let missing: Vec<&String> = must_see.difference(&seen).collect();
                    if missing.is_empty() {
                        Ok(None)
                    } else {
                        Err(ControlError::Internal(format!("{STALE} {missing:?}")))
                    }
                })
            }
            Op::Node(id, drain) => {
                let node = nodes.iter().find(|n| &n.id == id).expect("listed").clone();
                let mut spec = node.spec.clone().unwrap_or_default();
                spec.availability = if *drain { Availability::Drain } else { Availability::Active } as i32;
                let (id, version) = (id.clone(), node.version());
                Box::pin(async move { controlapi::update_node(&state, &id, version, spec).await.map(|_| None) })
            }
        }
    }

    /// A new service, of a random kind, on the network half the time.
    fn create(&mut self, state: ClusterState, rng: &mut StdRng) -> Request {
        self.created += 1;
        let kind =
            [Kind::Replicated, Kind::Replicated, Kind::Replicated, Kind::Global, Kind::ReplicatedJob, Kind::GlobalJob]
                [rng.random_range(0..6)];
        let mut spec = spec_of(&format!("svc{}", self.created), rng, kind);
        if rng.random_bool(0.5) {
            if let Some(task) = spec.task.as_mut() {
                task.networks =
                    vec![shoal_api::NetworkAttachmentConfig { target: NETWORK.into(), ..Default::default() }];
            }
        }
        // A replicated service may mount the cluster volume: all its tasks then share one node, and move
        // only once the volume is unpublished from the old one.
        if matches!(kind, Kind::Replicated) && rng.random_bool(0.3) {
            if let Some(Runtime::Container(c)) = spec.task.as_mut().and_then(|t| t.runtime.as_mut()) {
                c.mounts = vec![shoal_api::Mount {
                    r#type: shoal_api::mount::Type::Cluster as i32,
                    source: VOLUME.into(),
                    target: "/data".into(),
                    ..Default::default()
                }];
            }
        }
        Box::pin(async move { controlapi::create_service(&state, spec).await.map(Some) })
    }

    fn record(&mut self, f: InFlight, result: Result<Option<Service>, ControlError>) -> String {
        let what = match &f.op {
            Op::Create => "create".to_string(),
            Op::Update(id) => format!("update {id}"),
            Op::Remove(id) => format!("remove {id}"),
            Op::Node(id, drain) => format!("{} {id}", if *drain { "drain" } else { "activate" }),
            Op::Read(must_see) => format!("read on manager {} ({} services to see)", f.manager, must_see.len()),
            Op::Network => format!("create network {NETWORK}"),
            Op::Volume => format!("create volume {VOLUME}"),
        };
        if let (Op::Network, Ok(_) | Err(ControlError::AlreadyExists(_))) = (&f.op, &result) {
            self.network = true;
        }
        if let (Op::Volume, Ok(_) | Err(ControlError::AlreadyExists(_))) = (&f.op, &result) {
            self.volume = true;
        }
        if let (Op::Read(_), Ok(_)) = (&f.op, &result) {
            self.ledger.reads += 1;
        }
        match result {
            Ok(service) => {
                self.ledger.ok += 1;
                if !matches!(f.op, Op::Read(_)) {
                    self.leader_guess = f.manager;
                }
                // The entry that carried the write: the service's version is its index (create, update);
                // a removal is checked by the service's absence.
                if let Some(s) = service {
                    let index = s.version();
                    if let Op::Create = f.op {
                        self.ledger.created.insert(s.id.clone(), index);
                    }
                    self.ledger.to_resolve.push((format!("{what} {}", s.id), f.manager, index));
                }
                format!("{what} ok")
            }
            Err(ControlError::Unavailable(m)) => {
                self.ledger.unknown += 1;
                format!("{what} unknown: {m}")
            }
            Err(ControlError::Internal(m)) if m.starts_with(STALE) => {
                self.ledger.stale_reads.push(format!("{what}: {m}"));
                format!("{what}: {m}")
            }
            Err(ControlError::Internal(m)) => {
                self.ledger.internal_errors.push(format!("{what}: {m}"));
                format!("{what} internal error: {m}")
            }
            Err(e) => {
                self.ledger.refused += 1;
                if let ControlError::NotLeader = e {
                    self.leader_guess = f.manager % 3 + 1;
                }
                format!("{what} refused: {e}")
            }
        }
    }
}
