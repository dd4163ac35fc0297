//! The scheduler's filters, as a pipeline in SwarmKit's manner: each filter is set up for a task (and may
//! say it does not apply), `check`s a node, and `explain`s how many nodes it refused. The pipeline counts,
//! per filter, the nodes it was the first to refuse, which makes the message a pending task shows:
//! "no suitable node (1 node not available for new tasks; insufficient resources on 2 nodes)".
//!
//! Must not depend on the store or IO: filters see only the task and a `NodeInfo`.

use shoal_api::{Platform, Task};

use super::constraint::{self, Constraint};
use super::nodeinfo::{generic_need, Amount, NodeInfo};

/// One test a node must pass to take a task.
pub(crate) trait Filter: Send {
    /// Prepares for `task`; returns false when the filter does not apply to it (then it is skipped).
    fn set_task(&mut self, task: &Task) -> bool;
    /// True when the node passes.
    fn check(&self, node: &NodeInfo) -> bool;
    /// Why `nodes` nodes were refused, e.g. "insufficient resources on 2 nodes".
    fn explain(&self, nodes: usize) -> String;
}

fn nodes(n: usize) -> String {
    if n == 1 {
        "1 node".to_string()
    } else {
        format!("{n} nodes")
    }
}

/// The node is READY and its availability is ACTIVE (not paused or drained).
#[derive(Debug, Default)]
pub(crate) struct ReadyFilter;

impl Filter for ReadyFilter {
    fn set_task(&mut self, _task: &Task) -> bool {
        true
    }
    fn check(&self, n: &NodeInfo) -> bool {
        // Computed when the node version entered the node set (`nodeinfo::is_ready_and_active`).
        n.ready_active()
    }
    fn explain(&self, n: usize) -> String {
        format!("{} not available for new tasks", nodes(n))
    }
}

/// The node has the CPU, memory and generic resources the task reserves, after what its other tasks hold.
#[derive(Debug, Default)]
pub(crate) struct ResourceFilter {
    need: Amount,
    generic: Vec<(String, i64)>,
}

impl Filter for ResourceFilter {
    fn set_task(&mut self, task: &Task) -> bool {
        self.need = Amount::reserved_by(task);
        self.generic = generic_need(task).into_iter().map(|(k, n)| (k.to_string(), n)).collect();
        !self.need.is_zero() || !self.generic.is_empty()
    }
    fn check(&self, n: &NodeInfo) -> bool {
        if !n.available().covers(&self.need) {
            return false;
        }
        if self.generic.is_empty() {
            return true;
        }
        let need: Vec<(&str, i64)> = self.generic.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        n.generic_fits(&need)
    }
    fn explain(&self, n: usize) -> String {
        format!("insufficient resources on {}", nodes(n))
    }
}

/// The node satisfies the task's placement constraints (`scheduler::constraint`).
#[derive(Debug, Default)]
pub(crate) struct ConstraintFilter {
    constraints: Vec<Constraint>,
    invalid: bool,
}

impl Filter for ConstraintFilter {
    fn set_task(&mut self, task: &Task) -> bool {
        let exprs =
            task.spec.as_ref().and_then(|s| s.placement.as_ref()).map(|p| p.constraints.as_slice()).unwrap_or(&[]);
        match constraint::parse(exprs) {
            Ok(c) => {
                self.constraints = c;
                self.invalid = false;
            }
            Err(e) => {
                // The control API validates; a bad constraint that got through matches no node.
                tracing::warn!(task = %task.id, error = %e, "task has an invalid constraint");
                self.constraints.clear();
                self.invalid = true;
            }
        }
        self.invalid || !self.constraints.is_empty()
    }
    fn check(&self, n: &NodeInfo) -> bool {
        !self.invalid && self.constraints.iter().all(|c| c.matches(n.node()))
    }
    fn explain(&self, n: usize) -> String {
        format!("scheduling constraints not satisfied on {}", nodes(n))
    }
}

/// The node's platform is one of the task's `placement.platforms` (any, when the list is empty).
#[derive(Debug, Default)]
pub(crate) struct PlatformFilter {
    platforms: Vec<Platform>,
}

/// Architecture names that mean the same thing, folded to one (Go's names).
fn normalize_arch(a: &str) -> String {
    match a.to_ascii_lowercase().as_str() {
        "x86_64" | "x86-64" => "amd64".to_string(),
        "aarch64" => "arm64".to_string(),
        other => other.to_string(),
    }
}

/// True when the node's platform is one of `platforms` (any, when the list is empty). The global
/// orchestrator uses it too, to choose the nodes a global service runs on.
pub(crate) fn platform_matches(platforms: &[Platform], node: &shoal_api::Node) -> bool {
    if platforms.is_empty() {
        return true;
    }
    let Some(np) = node.description.as_ref().and_then(|d| d.platform.as_ref()) else { return false };
    platforms.iter().any(|p| {
        let os_ok = p.os.is_empty() || p.os.eq_ignore_ascii_case(&np.os);
        let arch_ok = p.architecture.is_empty() || normalize_arch(&p.architecture) == normalize_arch(&np.architecture);
        os_ok && arch_ok
    })
}

impl Filter for PlatformFilter {
    fn set_task(&mut self, task: &Task) -> bool {
        self.platforms =
            task.spec.as_ref().and_then(|s| s.placement.as_ref()).map(|p| p.platforms.clone()).unwrap_or_default();
        !self.platforms.is_empty()
    }
    fn check(&self, n: &NodeInfo) -> bool {
        platform_matches(&self.platforms, n.node())
    }
    fn explain(&self, n: usize) -> String {
        format!("unsupported platform on {}", nodes(n))
    }
}

/// The node holds fewer than `placement.max_replicas` tasks of the task's service (when set).
#[derive(Debug, Default)]
pub(crate) struct MaxReplicasFilter {
    service_id: String,
    max: u64,
}

impl Filter for MaxReplicasFilter {
    fn set_task(&mut self, task: &Task) -> bool {
        self.service_id = task.service_id.clone();
        self.max = task.spec.as_ref().and_then(|s| s.placement.as_ref()).map_or(0, |p| p.max_replicas);
        self.max > 0
    }
    fn check(&self, n: &NodeInfo) -> bool {
        (n.service_tasks(&self.service_id) as u64) < self.max
    }
    fn explain(&self, n: usize) -> String {
        format!("max replicas per node limit exceed on {}", nodes(n))
    }
}

/// The node's engine has the plugins the task's networks need (SwarmKit's PluginFilter, for network
/// drivers): a node that does not report `{type "Network", name "overlay"}` cannot connect an overlay
/// attachment, so it does not take such a task (nor one on `bridge` without `{"Network", "bridge"}`). A refused node
/// that said why it has no data plane (`shoal_api::SHOAL_NO_DATA_PLANE_LABEL`, e.g. another Shoal daemon holds its
/// network namespace's) is named with its reason in the explanation (the first such node of a pass).
#[derive(Debug, Default)]
pub(crate) struct PluginFilter {
    drivers: Vec<String>,
    /// The first refused node's hostname (or ID) and reason, when it gave one.
    reason: std::sync::Mutex<Option<(String, String)>>,
}

impl Filter for PluginFilter {
    fn set_task(&mut self, task: &Task) -> bool {
        // An overlay network's driver is in its driver state (the allocator's); a predefined network's
        // (`host`, `bridge`) is its own name: a node runs such a task only if it reports that driver too
        // (the docker executor's nodes report `bridge`, every node `host`).
        self.drivers = task
            .networks
            .iter()
            .filter_map(|a| {
                let n = a.network.as_ref()?;
                n.node_local_driver().map(str::to_string).or_else(|| n.driver_state.as_ref().map(|d| d.name.clone()))
            })
            .filter(|n| !n.is_empty())
            .collect();
        self.drivers.dedup();
        *self.reason.lock().unwrap_or_else(|e| e.into_inner()) = None;
        !self.drivers.is_empty()
    }
    fn check(&self, n: &NodeInfo) -> bool {
        let description = n.node().description.as_ref();
        let engine = description.and_then(|d| d.engine.as_ref());
        let plugins = engine.map(|e| e.plugins.as_slice()).unwrap_or(&[]);
        let ok = self.drivers.iter().all(|d| plugins.iter().any(|p| p.r#type == "Network" && &p.name == d));
        if !ok {
            if let Some(why) = engine.and_then(|e| e.labels.get(shoal_api::SHOAL_NO_DATA_PLANE_LABEL)) {
                let mut reason = self.reason.lock().unwrap_or_else(|e| e.into_inner());
                if reason.is_none() {
                    let name = description.map(|d| d.hostname.as_str()).filter(|h| !h.is_empty());
                    *reason = Some((name.unwrap_or(&n.node().id).to_string(), why.clone()));
                }
            }
        }
        ok
    }
    fn explain(&self, n: usize) -> String {
        match &*self.reason.lock().unwrap_or_else(|e| e.into_inner()) {
            Some((node, why)) => format!("missing plugin on {} (no data plane on node {node}: {why})", nodes(n)),
            None => format!("missing plugin on {}", nodes(n)),
        }
    }
}

/// A task on an IPv6 overlay (`--ipv6`) goes to Shoal nodes only: a stock Docker Engine worker (a node whose
/// description lacks `shoal_api::SHOAL_AGENT_LABEL`) is not given one, since Docker Engine 20.10's swarm
/// overlays do not carry IPv6 between nodes (docs/design/overlay-subnets.md).
#[derive(Debug, Default)]
pub(crate) struct Ipv6Filter {
    /// The first refused engine's version, for the explanation.
    version: std::sync::Mutex<Option<String>>,
}

impl Filter for Ipv6Filter {
    fn set_task(&mut self, task: &Task) -> bool {
        *self.version.lock().unwrap_or_else(|e| e.into_inner()) = None;
        task.networks
            .iter()
            .filter_map(|a| a.network.as_ref())
            .any(|n| n.node_local_driver().is_none() && n.spec.as_ref().is_some_and(|s| s.ipv6_enabled))
    }
    fn check(&self, n: &NodeInfo) -> bool {
        let engine = n.node().description.as_ref().and_then(|d| d.engine.as_ref());
        let shoal = engine.is_some_and(|e| e.labels.contains_key(shoal_api::SHOAL_AGENT_LABEL));
        if !shoal {
            let mut v = self.version.lock().unwrap_or_else(|e| e.into_inner());
            if v.is_none() {
                *v = Some(engine.map(|e| e.engine_version.clone()).unwrap_or_default());
            }
        }
        shoal
    }
    fn explain(&self, n: usize) -> String {
        let version = self.version.lock().unwrap_or_else(|e| e.into_inner()).clone().unwrap_or_default();
        let engine = if version.is_empty() { String::new() } else { format!(" ({version})") };
        format!(
            "IPv6 overlay not carried on {}: Docker Engine workers{engine} do not carry swarm IPv6 overlays, Shoal \
             nodes do",
            nodes(n)
        )
    }
}

/// No task on the node holds a host-mode port the task publishes (SwarmKit's HostPortFilter).
#[derive(Debug, Default)]
pub(crate) struct HostPortFilter {
    ports: Vec<(i32, u32)>,
}

impl Filter for HostPortFilter {
    fn set_task(&mut self, task: &Task) -> bool {
        self.ports = super::nodeinfo::host_ports(task).collect();
        !self.ports.is_empty()
    }
    fn check(&self, n: &NodeInfo) -> bool {
        self.ports.iter().all(|&(proto, port)| !n.host_port_taken(proto, port))
    }
    fn explain(&self, n: usize) -> String {
        format!("host-mode port already in use on {}", nodes(n))
    }
}

struct Stage {
    filter: Box<dyn Filter>,
    enabled: bool,
    failures: usize,
}

/// The filters in order (ready, resources, constraints, platform, max replicas, plugins, IPv6, host ports), with
/// failure counts.
pub(crate) struct Pipeline {
    stages: Vec<Stage>,
}

impl Default for Pipeline {
    fn default() -> Self {
        let filters: Vec<Box<dyn Filter>> = vec![
            Box::new(ReadyFilter),
            Box::new(ResourceFilter::default()),
            Box::new(ConstraintFilter::default()),
            Box::new(PlatformFilter::default()),
            Box::new(MaxReplicasFilter::default()),
            Box::new(PluginFilter::default()),
            Box::new(Ipv6Filter::default()),
            Box::new(HostPortFilter::default()),
        ];
        Pipeline { stages: filters.into_iter().map(|filter| Stage { filter, enabled: false, failures: 0 }).collect() }
    }
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline").field("stages", &self.stages.len()).finish()
    }
}

impl Pipeline {
    /// Prepares every filter for `task` and clears the failure counts.
    pub(crate) fn set_task(&mut self, task: &Task) {
        for s in &mut self.stages {
            s.enabled = s.filter.set_task(task);
            s.failures = 0;
        }
    }

    /// Runs the node through the filters; on refusal, counts it against the first filter that refused.
    pub(crate) fn process(&mut self, node: &NodeInfo) -> bool {
        for s in &mut self.stages {
            if s.enabled && !s.filter.check(node) {
                s.failures += 1;
                return false;
            }
        }
        true
    }

    /// The refusals, most frequent first (ties in pipeline order), joined by "; "; empty when none.
    pub(crate) fn explain(&self) -> String {
        let mut counted: Vec<(usize, usize)> =
            self.stages.iter().enumerate().filter(|(_, s)| s.failures > 0).map(|(i, s)| (i, s.failures)).collect();
        counted.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        counted.iter().map(|&(i, n)| self.stages[i].filter.explain(n)).collect::<Vec<_>>().join("; ")
    }
}
