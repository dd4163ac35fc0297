//! Test fixture shared by the orchestrator and scheduler unit tests: a `MemoryStore` behind a
//! `LocalProposer`, a `ManualClock`, seeded IDs, and builders for services, tasks and nodes. Test-only.

use std::sync::Arc;
use std::time::Duration;

use shoal_api::node_spec::Availability;
use shoal_api::service_spec::Mode;
use shoal_api::{
    node_status, Annotations, ContainerSpec, Node, NodeDescription, NodeSpec, NodeStatus, Platform, ReplicatedService,
    Resources, Service, ServiceSpec, Task, TaskSpec, TaskState, TaskStatus, Version,
};
use shoal_raft::{LocalProposer, Proposer};
use shoal_store::{Changes, ManualClock, MemoryStore, StoreObject, Tables};

use crate::state::{ClusterState, RandomIds};

/// Waits (in tokio time, polling every 10 ms) until `cond` holds, failing after `deadline`: the tree's one
/// wait helper (`crate::wait`, testkit's).
pub(crate) async fn wait_until(what: &str, deadline: Duration, cond: impl FnMut() -> bool) {
    crate::wait::wait_until_async(what, deadline, Duration::from_millis(10), crate::wait::holds(cond)).await
}

/// The fixture's start time.
pub(crate) const T0: u64 = 1_700_000_000_000;

pub(crate) struct Fx {
    pub store: Arc<MemoryStore>,
    pub proposer: Arc<LocalProposer>,
    pub clock: Arc<ManualClock>,
    pub state: ClusterState,
}

impl Fx {
    pub(crate) fn new() -> Fx {
        let store = Arc::new(MemoryStore::default());
        let proposer = Arc::new(LocalProposer::new(store.clone()));
        let clock = Arc::new(ManualClock::new(T0));
        let state = ClusterState::new(store.clone(), proposer.clone(), clock.clone(), Arc::new(RandomIds::seeded(7)));
        Fx { store, proposer, clock, state }
    }

    pub(crate) fn now(&self) -> u64 {
        use shoal_store::Clock;
        self.clock.now_unix_ms()
    }

    /// Proposes and applies at once (LocalProposer resolves immediately).
    pub(crate) fn apply(&self, changes: Changes) {
        if changes.is_empty() {
            return;
        }
        futures::executor::block_on(self.proposer.propose(changes.into_actions())).expect("write applies");
    }

    pub(crate) fn view<R>(&self, f: impl FnOnce(&Tables) -> R) -> R {
        self.store.view(f)
    }

    pub(crate) fn create<T: StoreObject>(&self, obj: T) {
        let mut c = Changes::new();
        c.create(obj);
        self.apply(c);
    }

    pub(crate) fn service(&self, id: &str) -> Service {
        (*self.view(|t| t.services().get(id).cloned()).expect("service exists")).clone()
    }

    pub(crate) fn task(&self, id: &str) -> Task {
        (*self.view(|t| t.tasks().get(id).cloned()).expect("task exists")).clone()
    }

    /// The service's tasks, sorted by slot then creation.
    pub(crate) fn tasks(&self, service_id: &str) -> Vec<Task> {
        let mut v: Vec<Task> = self.view(|t| t.tasks().by_service(service_id).map(|t| (**t).clone()).collect());
        v.sort_by(|a, b| (a.slot, super::created_ms(a), &a.id).cmp(&(b.slot, super::created_ms(b), &b.id)));
        v
    }

    /// Tasks meant to run (desired <= RUNNING), by slot.
    pub(crate) fn runnable(&self, service_id: &str) -> Vec<Task> {
        self.tasks(service_id).into_iter().filter(|t| t.desired_state() <= TaskState::Running).collect()
    }

    /// What an agent report does: moves the task's observed state (and node, when given).
    pub(crate) fn set_state(&self, task_id: &str, state: TaskState) {
        let mut t = self.task(task_id);
        let mut st = t.status.clone().unwrap_or_default();
        st.state = state as i32;
        st.timestamp = Some(shoal_api::timestamp_from_unix_ms(self.now()));
        t.status = Some(st);
        let mut c = Changes::new();
        c.update(t);
        self.apply(c);
    }

    /// Places a task on a node at the given state (what the scheduler and agent would do).
    pub(crate) fn place(&self, task_id: &str, node_id: &str, state: TaskState) {
        let mut t = self.task(task_id);
        t.node_id = node_id.to_string();
        t.status = Some(TaskStatus {
            state: state as i32,
            timestamp: Some(shoal_api::timestamp_from_unix_ms(self.now())),
            ..Default::default()
        });
        let mut c = Changes::new();
        c.update(t);
        self.apply(c);
    }

    /// Runs one reconcile pass of a service and applies it; returns the wake time.
    pub(crate) fn reconcile(&self, service_id: &str) -> Option<u64> {
        let now = self.now();
        let r = self.view(|t| {
            let s = t.services().get(service_id).cloned().expect("service exists");
            super::reconcile_service(t, &s, now, self.state.ids.as_ref())
        });
        self.apply(r.changes);
        r.wake_at_ms
    }

    /// Number of actions one reconcile pass would write (without applying them).
    pub(crate) fn pending_changes(&self, service_id: &str) -> usize {
        let now = self.now();
        self.view(|t| {
            let s = t.services().get(service_id).cloned().expect("service exists");
            super::reconcile_service(t, &s, now, self.state.ids.as_ref()).changes.len()
        })
    }

    /// Updates a service like the control API: new spec, spec_version = the write's index, the old ones
    /// previous, no update status.
    pub(crate) fn update_service(&self, id: &str, f: impl FnOnce(&mut ServiceSpec)) {
        let mut s = self.service(id);
        s.previous_spec = s.spec.clone();
        s.previous_spec_version = s.spec_version;
        f(s.spec.as_mut().expect("spec"));
        s.spec_version = Some(Version { index: self.store.last_index() + 1 });
        s.update_status = None;
        let mut c = Changes::new();
        c.update(s);
        self.apply(c);
    }

    pub(crate) fn set_node<F: FnOnce(&mut Node)>(&self, id: &str, f: F) {
        let mut n = (*self.view(|t| t.nodes().get(id).cloned()).expect("node exists")).clone();
        f(&mut n);
        let mut c = Changes::new();
        c.update(n);
        self.apply(c);
    }
}

/// A replicated service running `image`.
pub(crate) fn service(id: &str, replicas: u64) -> Service {
    Service {
        id: id.into(),
        spec: Some(ServiceSpec {
            annotations: Some(Annotations { name: format!("svc-{id}"), ..Default::default() }),
            task: Some(TaskSpec {
                runtime: Some(shoal_api::task_spec::Runtime::Container(ContainerSpec {
                    image: "busybox:1".into(),
                    ..Default::default()
                })),
                ..Default::default()
            }),
            mode: Some(Mode::Replicated(ReplicatedService { replicas })),
            ..Default::default()
        }),
        spec_version: Some(Version { index: 1 }),
        ..Default::default()
    }
}

/// A ready, active linux/x86_64 worker with 4 CPUs and 8 GiB.
pub(crate) fn node(id: &str) -> Node {
    Node {
        id: id.into(),
        spec: Some(NodeSpec { availability: Availability::Active as i32, ..Default::default() }),
        description: Some(NodeDescription {
            hostname: format!("host-{id}"),
            platform: Some(Platform { architecture: "x86_64".into(), os: "linux".into() }),
            resources: Some(Resources { nano_cpus: 4_000_000_000, memory_bytes: 8 << 30, generic: vec![] }),
            ..Default::default()
        }),
        status: Some(NodeStatus { state: node_status::State::Ready as i32, ..Default::default() }),
        ..Default::default()
    }
}

/// Sets the image of a service spec's container.
pub(crate) fn set_image(spec: &mut ServiceSpec, image: &str) {
    if let Some(shoal_api::task_spec::Runtime::Container(c)) = spec.task.as_mut().and_then(|t| t.runtime.as_mut()) {
        c.image = image.to_string();
    }
}
