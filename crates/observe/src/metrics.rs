//! The Prometheus metrics of a node (OpenMetrics text, through the `prometheus-client` crate), named as
//! SwarmKit names them where it has them (`swarm_manager_*`, `swarm_raft_*`, `swarm_store_*`,
//! `swarm_dispatcher_*`, `swarm_node_*`) plus the standard `process_*` ones.
//!
//! Gauges derived from the store are computed on scrape from one read view in O(nodes + task states): task
//! counts come from the store's observed-state index (`TaskTable::count_by_state`, O(1) each), the other
//! tables' sizes are O(1), and only the node table is walked (for nodes by state). So a scrape at 100,000
//! tasks costs what it costs at 10 (see the `scrape_cost_does_not_grow_with_tasks` test).
//! Histograms (store write latency, scheduling delay) are fed as things happen: by `TimedProposer` around
//! every proposal, and by the live loop (`live.rs`) from the commits it reads.
//!
//! What does not apply to a node is left out rather than reported as zero: a worker has no store, no Raft and
//! no dispatcher, so it serves the `swarm_node_*` and `process_*` families only.
//! Must not write to the store or call subsystems.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use shoal_api::TaskState;
use shoal_store::MemoryStore;

/// Every task state, in SwarmKit's order: `swarm_manager_tasks_total` reports each (zero included), as
/// SwarmKit does.
pub const TASK_STATES: [TaskState; 14] = TaskState::ALL;

/// Node states as the `state` label of `swarm_manager_nodes` (SwarmKit's lower-case names).
const NODE_STATES: [(shoal_api::node_status::State, &str); 4] = [
    (shoal_api::node_status::State::Unknown, "unknown"),
    (shoal_api::node_status::State::Down, "down"),
    (shoal_api::node_status::State::Ready, "ready"),
    (shoal_api::node_status::State::Disconnected, "disconnected"),
];

/// Raft progress as the node's Raft member reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RaftFigures {
    /// True when this member leads (and may write).
    pub is_leader: bool,
    /// The current term.
    pub term: u64,
    /// The leader's Raft ID (0 when unknown).
    pub leader_id: u64,
    /// The highest index known committed.
    pub commit_index: u64,
    /// The highest index applied to the store.
    pub applied_index: u64,
    /// The latest snapshot's index.
    pub snapshot_index: u64,
    /// Fsync'd writes of the Raft log since start.
    pub synced_writes: u64,
    /// Raft members.
    pub members: u64,
}

/// A reading taken at scrape time.
pub type Reading<T> = Arc<dyn Fn() -> T + Send + Sync>;

/// What a node can report: all but the node ID are absent on a worker.
#[derive(Clone, Default)]
pub struct Sources {
    /// This node's ID.
    pub node_id: String,
    /// The cluster state (managers).
    pub store: Option<Arc<MemoryStore>>,
    /// Raft progress (managers).
    pub raft: Option<Reading<RaftFigures>>,
    /// Open agent sessions on this manager's dispatcher (managers; the leader serves them).
    pub dispatcher_sessions: Option<Reading<usize>>,
}

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sources")
            .field("node_id", &self.node_id)
            .field("store", &self.store.is_some())
            .field("raft", &self.raft.is_some())
            .field("dispatcher_sessions", &self.dispatcher_sessions.is_some())
            .finish()
    }
}

/// The histograms and counters fed as things happen. Cheap to clone (the metrics are shared).
#[derive(Debug, Clone)]
pub struct Recorders {
    /// `swarm_store_write_tx_latency_seconds`: a write from its proposal until this manager's store applied it
    /// (Raft commit and fsync included), as SwarmKit's store update latency.
    pub write_latency: Histogram,
    /// `swarm_store_write_tx_failures_total`: proposals that failed (not leader, conflict, no quorum, ...).
    pub write_failures: Counter,
    /// `swarm_dispatcher_scheduling_delay_seconds`: a task's creation until it was reported running, as
    /// SwarmKit's dispatcher measures it.
    pub scheduling_delay: Histogram,
    /// `swarm_scheduler_assignment_delay_seconds`: a task's creation until the scheduler assigned it a node.
    pub assignment_delay: Histogram,
}

impl Recorders {
    /// Empty histograms and counters.
    pub fn new() -> Recorders {
        Recorders {
            // 0.25 ms to about 8 s.
            write_latency: Histogram::new(exponential_buckets(0.000_25, 2.0, 16)),
            write_failures: Counter::default(),
            // 10 ms to about 5.5 min.
            scheduling_delay: Histogram::new(exponential_buckets(0.01, 2.0, 16)),
            assignment_delay: Histogram::new(exponential_buckets(0.001, 2.0, 18)),
        }
    }
}

impl Default for Recorders {
    fn default() -> Recorders {
        Recorders::new()
    }
}

/// A node's metrics: the registry a scrape encodes.
pub struct Metrics {
    registry: Registry,
    recorders: Recorders,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// The OpenMetrics content type of a scrape's answer (Prometheus reads it; so do Python's parsers).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

impl Metrics {
    /// The metrics of a node with `sources`, and `recorders` (made first, for the `TimedProposer`).
    pub fn new(sources: Sources, recorders: Recorders) -> Metrics {
        let mut registry = Registry::default();
        let swarm = registry.sub_registry_with_prefix("swarm");
        if sources.store.is_some() {
            swarm.register_with_unit(
                "store_write_tx_latency",
                "Time from a write's proposal until this manager's store applied it (Raft commit and fsync included)",
                Unit::Seconds,
                recorders.write_latency.clone(),
            );
            swarm.register(
                "store_write_tx_failures",
                "Writes proposed through this manager that failed",
                recorders.write_failures.clone(),
            );
            swarm.register_with_unit(
                "dispatcher_scheduling_delay",
                "Time from a task's creation until it was reported running",
                Unit::Seconds,
                recorders.scheduling_delay.clone(),
            );
            swarm.register_with_unit(
                "scheduler_assignment_delay",
                "Time from a task's creation until the scheduler assigned it to a node",
                Unit::Seconds,
                recorders.assignment_delay.clone(),
            );
        }
        registry.register_collector(Box::new(NodeCollector { sources }));
        registry.register_collector(Box::new(crate::process::ProcessCollector));
        Metrics { registry, recorders }
    }

    /// The recorders to feed.
    pub fn recorders(&self) -> &Recorders {
        &self.recorders
    }

    /// One scrape: the OpenMetrics text of every metric (ends with `# EOF`).
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(16 << 10);
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The gauges read at scrape time.
#[derive(Clone)]
struct NodeCollector {
    sources: Sources,
}

impl std::fmt::Debug for NodeCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.sources.fmt(f)
    }
}

fn gauge(enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: i64) -> Result<(), std::fmt::Error> {
    let g = ConstGauge::new(v);
    g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)
}

fn counter(enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: u64) -> Result<(), std::fmt::Error> {
    let c = ConstCounter::new(v);
    c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)
}

fn labelled_gauges<'a>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    label: &str,
    values: impl IntoIterator<Item = (&'a str, i64)>,
) -> Result<(), std::fmt::Error> {
    let mut family = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (value, n) in values {
        ConstGauge::new(n).encode(family.encode_family(&[(label, value)])?)?;
    }
    Ok(())
}

/// What one read view gives.
struct StoreFigures {
    cluster_id: String,
    nodes_by_state: [i64; 4],
    tasks_by_state: [i64; 14],
    services: i64,
    secrets: i64,
    configs: i64,
    last_index: u64,
}

fn store_figures(store: &MemoryStore) -> StoreFigures {
    store.view(|t| {
        let mut nodes_by_state = [0i64; 4];
        for n in t.nodes().iter() {
            let state = n.status.as_ref().map_or(0, |s| s.state);
            if let Some(i) = NODE_STATES.iter().position(|(s, _)| *s as i32 == state) {
                nodes_by_state[i] += 1;
            }
        }
        let mut tasks_by_state = [0i64; 14];
        for (i, s) in TASK_STATES.iter().enumerate() {
            tasks_by_state[i] = t.tasks().count_by_state(*s) as i64;
        }
        StoreFigures {
            cluster_id: t.clusters().iter().next().map(|c| c.id.clone()).unwrap_or_default(),
            nodes_by_state,
            tasks_by_state,
            services: t.services().len() as i64,
            // Networks: `swarm_manager_networks_total` goes here, from the store's network table, once it exists.
            secrets: t.secrets().len() as i64,
            configs: t.configs().len() as i64,
            last_index: t.last_index(),
        }
    })
}

impl Collector for NodeCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let s = &self.sources;
        let figures = s.store.as_deref().map(store_figures);
        {
            let mut info =
                enc.encode_descriptor("swarm_node_info", "Information related to the swarm", None, MetricType::Gauge)?;
            let cluster_id = figures.as_ref().map(|f| f.cluster_id.as_str()).unwrap_or("");
            let labels = [("swarm_id", cluster_id), ("node_id", s.node_id.as_str())];
            ConstGauge::new(1i64).encode(info.encode_family(&labels)?)?;
        }
        gauge(&mut enc, "swarm_node_manager", "Whether this node is a manager or not", i64::from(s.store.is_some()))?;
        if let Some(raft) = &s.raft {
            let r = raft();
            gauge(
                &mut enc,
                "swarm_manager_leader",
                "Indicates if this manager node is a leader",
                i64::from(r.is_leader),
            )?;
            gauge(&mut enc, "swarm_raft_term", "The Raft term this manager is in", r.term as i64)?;
            gauge(
                &mut enc,
                "swarm_raft_leader_id",
                "The Raft ID of the leader this manager knows (0: none)",
                r.leader_id as i64,
            )?;
            gauge(
                &mut enc,
                "swarm_raft_commit_index",
                "The highest Raft index this manager knows committed",
                r.commit_index as i64,
            )?;
            gauge(
                &mut enc,
                "swarm_raft_applied_index",
                "The highest Raft index applied to this manager's store (every transaction moves it)",
                r.applied_index as i64,
            )?;
            gauge(
                &mut enc,
                "swarm_raft_snapshot_index",
                "The Raft index of this manager's latest snapshot",
                r.snapshot_index as i64,
            )?;
            gauge(&mut enc, "swarm_raft_members", "Members of the Raft cluster", r.members as i64)?;
            counter(
                &mut enc,
                "swarm_raft_synced_writes",
                "Fsync'd writes of this manager's Raft log since it started",
                r.synced_writes,
            )?;
        }
        if let Some(f) = &figures {
            labelled_gauges(
                &mut enc,
                "swarm_manager_nodes",
                "The number of nodes",
                "state",
                NODE_STATES.iter().zip(f.nodes_by_state).map(|((_, name), n)| (*name, n)),
            )?;
            labelled_gauges(
                &mut enc,
                "swarm_manager_tasks_total",
                "The number of tasks in the cluster object store",
                "state",
                TASK_STATES.iter().zip(f.tasks_by_state).map(|(s, n)| (s.docker_name(), n)),
            )?;
            gauge(
                &mut enc,
                "swarm_manager_services_total",
                "The number of services in the cluster object store",
                f.services,
            )?;
            gauge(
                &mut enc,
                "swarm_manager_secrets_total",
                "The number of secrets in the cluster object store",
                f.secrets,
            )?;
            gauge(
                &mut enc,
                "swarm_manager_configs_total",
                "The number of configs in the cluster object store",
                f.configs,
            )?;
            gauge(
                &mut enc,
                "swarm_store_last_index",
                "The Raft index of the store's last applied write",
                f.last_index as i64,
            )?;
        }
        if let Some(sessions) = &s.dispatcher_sessions {
            gauge(
                &mut enc,
                "swarm_dispatcher_sessions",
                "Agent sessions open on this manager's dispatcher",
                sessions() as i64,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
