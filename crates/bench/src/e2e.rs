//! `e2e`: one service with R replicas on N simulated nodes, in one process: the real manager (orchestrator,
//! scheduler, dispatcher, a real Raft node on a temp dir with fsync) and N agents with fake executors over
//! real gRPC (`shoal_testkit::TestCluster`). Timed from the create call to every task ASSIGNED (placements
//! through Raft) and to every task RUNNING (reported back by the agents). RESULT: the median time to all
//! RUNNING; the table also gives placements per second. With `--global`, the service is global instead: one
//! task per node (`--replicas` is ignored), all RUNNING when every READY node runs one.
//! Must not depend on the manager's internals beyond the control API and the store's read views.

use std::time::{Duration, Instant};

use shoal_api::{
    service_spec, task_spec, Annotations, ContainerSpec, GlobalService, ReplicatedService, ServiceSpec, TaskSpec,
    TaskState,
};
use shoal_manager::controlapi;
use shoal_testkit::{ClusterOptions, TestCluster};

use crate::report::{self, fmt_num, BenchError, Table};

/// Flags of `e2e`.
#[derive(Debug, clap::Args)]
pub(crate) struct E2eArgs {
    /// Replicas of the service.
    #[arg(long, default_value_t = 1000)]
    replicas: u64,
    /// Simulated nodes (agents with fake executors).
    #[arg(long, default_value_t = 100)]
    nodes: usize,
    /// Runs (a fresh cluster each); RESULT is the median.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Most time to wait for all tasks RUNNING, in seconds.
    #[arg(long, default_value_t = 120)]
    timeout_s: u64,
    /// A size that runs in seconds (50 replicas on 5 nodes, 1 run).
    #[arg(long)]
    smoke: bool,
    /// A global service (one task per node) instead of a replicated one.
    #[arg(long)]
    global: bool,
    /// Attach the service to an overlay network (the allocator runs).
    #[arg(long)]
    network: bool,
}

/// A replicated service `name` of `replicas` tasks running `sleep 3600` (the e2e and agents scenarios).
pub(crate) fn sleep_service(name: &str, replicas: u64) -> ServiceSpec {
    ServiceSpec {
        annotations: Some(Annotations { name: name.into(), ..Default::default() }),
        task: Some(TaskSpec {
            runtime: Some(task_spec::Runtime::Container(ContainerSpec {
                image: "busybox".into(),
                args: vec!["sleep".into(), "3600".into()],
                ..Default::default()
            })),
            ..Default::default()
        }),
        mode: Some(service_spec::Mode::Replicated(ReplicatedService { replicas })),
        ..Default::default()
    }
}

struct Run {
    assigned: Duration,
    running: Duration,
}

async fn one_run(
    replicas: u64,
    nodes: usize,
    global: bool,
    network: bool,
    timeout: Duration,
) -> Result<Run, BenchError> {
    let cluster = TestCluster::start(ClusterOptions { workers: nodes, raft: true, ..Default::default() }).await;
    let mut spec = sleep_service("bench", replicas);
    if network {
        let n = controlapi::create_network(
            &cluster.state,
            shoal_api::NetworkSpec {
                annotations: Some(Annotations { name: "benchnet".into(), ..Default::default() }),
                ipam: Some(shoal_api::IpamOptions {
                    driver: None,
                    configs: vec![shoal_api::IpamConfig { subnet: "10.128.0.0/16".into(), ..Default::default() }],
                }),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| BenchError::Request(e.to_string()))?;
        if let Some(t) = spec.task.as_mut() {
            t.networks = vec![shoal_api::NetworkAttachmentConfig { target: n.id, ..Default::default() }];
        }
    }
    let mut want = usize::try_from(replicas).map_err(|_| BenchError::Setup(format!("{replicas} replicas")))?;
    if global {
        spec.mode = Some(service_spec::Mode::Global(GlobalService {}));
        want = cluster.state.store.view(|t| {
            let ready = shoal_api::node_status::State::Ready as i32;
            t.nodes().iter().filter(|n| n.status.as_ref().map(|s| s.state) == Some(ready)).count()
        });
    }
    let start = Instant::now();
    let svc = controlapi::create_service(&cluster.state, spec).await.map_err(|e| BenchError::Request(e.to_string()))?;
    let mut assigned_at = None;
    let counted = tokio::time::timeout(timeout, async {
        loop {
            let ((total, pending, running), mut watch) = cluster.state.store.view_and_watch(|t| {
                let total = t.tasks().count_by_service(&svc.id);
                let pending =
                    t.tasks().by_state(TaskState::Pending).count() + t.tasks().by_state(TaskState::New).count();
                let running = t.tasks().by_state(TaskState::Running).count();
                (total, pending, running)
            });
            if assigned_at.is_none() && total >= want && pending == 0 {
                assigned_at = Some(start.elapsed());
            }
            if running >= want {
                return start.elapsed();
            }
            // Any commit (or a lag) is a reason to count again; take everything queued first.
            let _ = watch.recv().await;
            while watch.try_recv().is_ok() {}
        }
    })
    .await;
    let result = match counted {
        Ok(running) => Ok(Run { assigned: assigned_at.unwrap_or(running), running }),
        Err(_) => Err(BenchError::Timeout(format!("{want} tasks on {nodes} nodes not all RUNNING within {timeout:?}"))),
    };
    cluster.shutdown().await;
    result
}

/// Runs the scenario.
pub(crate) fn run(a: E2eArgs) -> Result<(), BenchError> {
    let (replicas, nodes, runs) = if a.smoke { (50, 5, 1) } else { (a.replicas, a.nodes.max(1), a.runs.max(1)) };
    // A global service runs one task per node.
    let replicas = if a.global { nodes as u64 } else { replicas };
    crate::procstat::raise_nofile_limit()?;
    let rt = report::runtime()?;
    let mut table = Table::new(&["run", "replicas", "nodes", "all assigned ms", "placements/s", "all running ms"]);
    let mut times = Vec::new();
    let mut rates = Vec::new();
    for r in 1..=runs {
        let run = rt.block_on(one_run(replicas, nodes, a.global, a.network, Duration::from_secs(a.timeout_s)))?;
        let rate = replicas as f64 / run.assigned.as_secs_f64().max(1e-9);
        table.row(vec![
            r.to_string(),
            replicas.to_string(),
            nodes.to_string(),
            fmt_num(run.assigned.as_secs_f64() * 1000.0),
            fmt_num(rate),
            fmt_num(run.running.as_secs_f64() * 1000.0),
        ]);
        times.push(run.running.as_secs_f64() * 1000.0);
        rates.push(rate);
    }
    let med = report::median(&times);
    table.row(vec![
        "median".into(),
        String::new(),
        String::new(),
        String::new(),
        fmt_num(report::median(&rates)),
        fmt_num(med),
    ]);
    let name = match (a.global, a.network) {
        (true, true) => "e2e-global-network",
        (true, false) => "e2e-global",
        (false, true) => "e2e-network",
        (false, false) => "e2e",
    };
    report::finish(&table, name, med, "ms");
    Ok(())
}
