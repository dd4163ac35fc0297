//! `agents`: simulated agents against an in-process manager. The manager is the real one (store, Raft on
//! a temp dir with fsync, orchestrator, scheduler, dispatcher over gRPC on 127.0.0.1: `TestCluster` with no
//! built-in workers) on its own 2-thread runtime; N fake nodes run on a second runtime in the same process.
//! Each opens a real dispatcher session and assignments stream, sends heartbeats at the period the manager
//! returns (5 s by default), and answers assignments like a fake executor: every task assigned to it is
//! reported RUNNING. Nodes identify themselves with the dispatcher's test-only metadata identity (the
//! in-process harness installs it), so no certificates are needed. Sessions share HTTP/2 connections
//! (`--nodes-per-connection` per tonic channel), so that 50k nodes need few file descriptors.
//!
//! Phases: (1) register all nodes (time, rate); (2) optionally create one service with `--tasks-per-node`
//! x N replicas and wait until the simulated nodes have reported them all RUNNING; (3) a steady window of
//! `--seconds` in which the manager's CPU (its runtime's threads and the Raft thread, from
//! /proc/self/task) and heartbeat round trips are measured; then the nodes the manager's store holds as
//! DOWN (any is wrong: every node kept beating). RESULT: the manager's CPU in the steady window, in cores.
//!
//! With `--global`, phase (2) is a global service instead: the time until every simulated node reported its
//! task RUNNING, and the manager's CPU meanwhile, are table rows (RESULT stays the steady window's CPU).
//!
//! With `--job N`, phase (2) is instead a replicated job of N completions, `--max-concurrent` (default: one
//! per node) at a time: the simulated nodes report every job task (desired COMPLETE) COMPLETE as soon as it
//! is assigned, and the phase ends when the store holds N COMPLETE tasks of the job; it checks that no more
//! than N tasks were made and none is left in flight. RESULT (`agents-job`): the time to complete the job,
//! in seconds; the table also gives completions per second and the manager's CPU during the job.
//! Must not depend on the manager's internals: the simulated nodes speak the wire protocol only.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shoal_api::dispatcher_client::DispatcherClient;
use shoal_api::update_task_status_request::TaskStatusUpdate;
use shoal_api::{
    assignment, assignment_change, node_status, AssignmentsRequest, HeartbeatRequest, NodeDescription, Platform,
    Resources, SessionRequest, TaskState, TaskStatus, UpdateTaskStatusRequest,
};
use shoal_manager::controlapi;
use shoal_testkit::{ClusterOptions, TestCluster};
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint};
use tonic::Request;

use crate::procstat;
use crate::report::{self, fmt_num, BenchError, Table};

/// The metadata key carrying a node's ID (the dispatcher's `NODE_ID_METADATA_KEY`).
const NODE_ID_KEY: &str = "x-shoal-node-id";
/// Timeout of one unary call.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Most time for all nodes to register, or for all tasks to run.
const PHASE_TIMEOUT: Duration = Duration::from_secs(600);
/// The same at the smoke size (50 nodes), where a phase takes a few seconds: a stuck one fails the run with
/// its counts long before a test runner's cut-off.
const SMOKE_PHASE_TIMEOUT: Duration = Duration::from_secs(45);
/// Attempts of one status report before the simulated node gives up on it (a real agent retries too: a
/// batch that kept conflicting, or a leader busy, answers UNAVAILABLE "retry").
const STATUS_ATTEMPTS: u32 = 20;
/// Pause between two attempts of a status report.
const STATUS_RETRY: Duration = Duration::from_millis(250);
/// How often the job phase counts the job's tasks.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// Flags of `agents`.
#[derive(Debug, clap::Args)]
pub(crate) struct AgentsArgs {
    /// Simulated nodes.
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    /// Length of the steady window, in seconds.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Sessions multiplexed on one HTTP/2 connection.
    #[arg(long, default_value_t = 250)]
    nodes_per_connection: usize,
    /// Replicas per simulated node of the service created before the steady window (0: none).
    #[arg(long, default_value_t = 1)]
    tasks_per_node: usize,
    /// Completions of a replicated job run instead of the service (0: no job). With `--smoke`: 500.
    #[arg(long, default_value_t = 0)]
    job: u64,
    /// Tasks of the job run at once (default: one per simulated node).
    #[arg(long)]
    max_concurrent: Option<u64>,
    /// A global service (one task per simulated node) instead of `--tasks-per-node` replicas.
    #[arg(long)]
    global: bool,
    /// A size that runs in seconds (50 nodes, 2 s window).
    #[arg(long)]
    smoke: bool,
}

/// Heartbeat round trips in ms, kept only during the steady window (so bounded by the heartbeats sent in it).
#[derive(Default)]
struct LatencyLog(std::sync::Mutex<Vec<f64>>);

impl LatencyLog {
    fn push(&self, ms: f64) {
        self.0.lock().expect("latency log").push(ms);
    }
    fn take(&self) -> Vec<f64> {
        std::mem::take(&mut *self.0.lock().expect("latency log"))
    }
}

/// Counters shared by the simulated nodes.
#[derive(Default)]
struct Shared {
    registered: AtomicUsize,
    running_reported: AtomicUsize,
    complete_reported: AtomicUsize,
    heartbeat_errors: AtomicU64,
    sessions_lost: AtomicU64,
    measuring: AtomicBool,
    latencies: LatencyLog,
}

fn req<T>(node_id: &str, msg: T, timeout: Option<Duration>) -> Request<T> {
    let mut r = Request::new(msg);
    r.metadata_mut().insert(NODE_ID_KEY, node_id.parse().expect("ASCII node ID"));
    if let Some(t) = timeout {
        r.set_timeout(t);
    }
    r
}

fn description(i: usize) -> NodeDescription {
    NodeDescription {
        hostname: format!("sim-{i}"),
        platform: Some(Platform { architecture: "x86_64".into(), os: "linux".into() }),
        resources: Some(Resources { nano_cpus: 2_000_000_000, memory_bytes: 4 << 30, ..Default::default() }),
        ..Default::default()
    }
}

/// The reports a simulated node makes for assignment `changes`: a service's task runs, a job's task (desired
/// COMPLETE) is done at once; each task reported once (`reported`).
fn status_updates(
    changes: Vec<shoal_api::AssignmentChange>,
    reported: &mut std::collections::HashSet<String>,
) -> Vec<TaskStatusUpdate> {
    let mut updates = Vec::new();
    for ch in changes {
        if ch.action != assignment_change::AssignmentAction::Update as i32 {
            continue;
        }
        let Some(assignment::Item::Task(task)) = ch.assignment.and_then(|a| a.item) else { continue };
        let state = if task.desired_state == TaskState::Running as i32 {
            TaskState::Running
        } else if task.desired_state == TaskState::Complete as i32 {
            TaskState::Complete
        } else {
            continue;
        };
        if reported.insert(task.id.clone()) {
            let message = if state == TaskState::Complete { "finished" } else { "started" }.into();
            updates.push(TaskStatusUpdate {
                task_id: task.id,
                status: Some(TaskStatus { state: state as i32, message, ..Default::default() }),
            });
        }
    }
    updates
}

/// One simulated node: session, assignments, heartbeats, RUNNING reports; until `stop`.
async fn sim_node(i: usize, channel: Channel, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let node_id = format!("simnode{i:06}");
    let mut client = DispatcherClient::new(channel);
    let session = client
        .session(req(&node_id, SessionRequest { description: Some(description(i)), session_id: String::new() }, None))
        .await;
    let mut session = match session {
        Ok(s) => s.into_inner(),
        Err(e) => {
            eprintln!("node {node_id}: Session failed: {e}");
            shared.sessions_lost.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    let session_id = match session.message().await {
        Ok(Some(m)) => m.session_id,
        other => {
            eprintln!("node {node_id}: no first session message: {other:?}");
            shared.sessions_lost.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    let mut assignments =
        match client.assignments(req(&node_id, AssignmentsRequest { session_id: session_id.clone() }, None)).await {
            Ok(s) => s.into_inner(),
            Err(e) => {
                eprintln!("node {node_id}: Assignments failed: {e}");
                shared.sessions_lost.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
    shared.registered.fetch_add(1, Ordering::Relaxed);
    let mut reported: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut next_beat = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep_until(next_beat) => {
                let t = Instant::now();
                let r = client.heartbeat(req(&node_id, HeartbeatRequest { session_id: session_id.clone() },
                    Some(CALL_TIMEOUT))).await;
                let ms = t.elapsed().as_secs_f64() * 1000.0;
                match r {
                    Ok(resp) => {
                        if shared.measuring.load(Ordering::Relaxed) {
                            shared.latencies.push(ms);
                        }
                        let period = resp.into_inner().period.as_ref().map(shoal_api::duration_from_proto);
                        let period = period.unwrap_or(Duration::from_secs(5));
                        next_beat = tokio::time::Instant::now() + period.max(Duration::from_millis(10));
                    }
                    Err(e) => {
                        shared.heartbeat_errors.fetch_add(1, Ordering::Relaxed);
                        eprintln!("node {node_id}: heartbeat failed: {e}");
                        next_beat = tokio::time::Instant::now() + Duration::from_secs(1);
                    }
                }
            }
            m = session.message() => if !matches!(m, Ok(Some(_))) {
                shared.sessions_lost.fetch_add(1, Ordering::Relaxed);
                eprintln!("node {node_id}: session stream ended: {m:?}");
                return;
            },
            m = assignments.message() => match m {
                Ok(Some(msg)) => {
                    let updates = status_updates(msg.changes, &mut reported);
                    if !updates.is_empty() {
                        let done = |u: &&TaskStatusUpdate| {
                            u.status.as_ref().is_some_and(|s| s.state == TaskState::Complete as i32)
                        };
                        let complete = updates.iter().filter(done).count();
                        let n = updates.len();
                        // Retried as an agent retries its reports: a lost report would leave a task (and the
                        // phase waiting on it) unfinished.
                        let mut attempt = 0;
                        loop {
                            attempt += 1;
                            let r = client.update_task_status(req(&node_id,
                                UpdateTaskStatusRequest { session_id: session_id.clone(), updates: updates.clone() },
                                    Some(CALL_TIMEOUT))).await;
                            match r {
                                Ok(_) => {
                                    shared.running_reported.fetch_add(n - complete, Ordering::Relaxed);
                                    shared.complete_reported.fetch_add(complete, Ordering::Relaxed);
                                    break;
                                }
                                Err(e) if attempt < STATUS_ATTEMPTS => {
                                    eprintln!("node {node_id}: UpdateTaskStatus failed (attempt {attempt}, retrying): \
                                               {e}");
                                    tokio::time::sleep(STATUS_RETRY).await;
                                }
                                Err(e) => {
                                    eprintln!("node {node_id}: UpdateTaskStatus failed {attempt} times, given up: {e}");
                                    break;
                                }
                            }
                        }
                    }
                }
                other => {
                    shared.sessions_lost.fetch_add(1, Ordering::Relaxed);
                    eprintln!("node {node_id}: assignments stream ended: {other:?}");
                    return;
                }
            },
        }
    }
}

/// Thread-name prefix of the manager's runtime.
const MANAGER_THREADS: &str = "shoal-manager";

/// CPU seconds used so far by the manager's threads: its runtime's and the Raft driver's (`raft-<id>`).
fn manager_cpu_seconds() -> Result<f64, BenchError> {
    let pid = std::process::id() as i32;
    let dir = std::fs::read_dir("/proc/self/task").map_err(|e| BenchError::Setup(format!("/proc/self/task: {e}")))?;
    let mut total = 0.0;
    for entry in dir.flatten() {
        let tid = entry.file_name().to_string_lossy().to_string();
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        let comm = comm.trim();
        if comm.starts_with(MANAGER_THREADS) || comm.starts_with("raft-") {
            if let Ok(tid) = tid.parse::<i32>() {
                total += procstat::thread_cpu_seconds(pid, tid).unwrap_or(0.0);
            }
        }
    }
    Ok(total)
}

async fn wait_count(what: &str, counter: &AtomicUsize, want: usize, limit: Duration) -> Result<Duration, BenchError> {
    let start = Instant::now();
    let mut last_log = Instant::now();
    eprintln!("waiting: {what} ({want})");
    while counter.load(Ordering::Relaxed) < want {
        if last_log.elapsed() >= Duration::from_secs(10) {
            eprintln!("{:.0} s: {what}: {} of {want}", start.elapsed().as_secs_f64(), counter.load(Ordering::Relaxed));
            last_log = Instant::now();
        }
        if start.elapsed() > limit {
            return Err(BenchError::Timeout(format!(
                "{what}: {} of {want} after {limit:?}",
                counter.load(Ordering::Relaxed)
            )));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(start.elapsed())
}

/// Runs the scenario.
pub(crate) fn run(a: AgentsArgs) -> Result<(), BenchError> {
    let (nodes, seconds) = if a.smoke { (50, 2) } else { (a.nodes.max(1), a.seconds.max(1)) };
    let job = if a.smoke && a.job > 0 { 500 } else { a.job };
    let phase_timeout = if a.smoke { SMOKE_PHASE_TIMEOUT } else { PHASE_TIMEOUT };
    let nofile = procstat::raise_nofile_limit()?;
    let per_conn = a.nodes_per_connection.max(1);
    let manager_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(MANAGER_THREADS)
        .enable_all()
        .build()
        .map_err(|e| BenchError::Setup(e.to_string()))?;
    let sim_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("shoal-sim")
        .enable_all()
        .build()
        .map_err(|e| BenchError::Setup(e.to_string()))?;
    eprintln!("starting the manager");
    let cluster =
        manager_rt.block_on(TestCluster::start(ClusterOptions { workers: 0, raft: true, ..Default::default() }));
    let mut table = Table::new(&["measure", "value"]);
    table.row(vec!["simulated nodes".into(), nodes.to_string()]);
    table.row(vec!["HTTP/2 connections".into(), nodes.div_ceil(per_conn).to_string()]);
    table.row(vec!["open-file limit".into(), nofile.to_string()]);
    let scene = Scene {
        manager_rt: &manager_rt,
        sim_rt: &sim_rt,
        cluster: &cluster,
        shared: Arc::new(Shared::default()),
        nodes,
        phase_timeout,
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut job_took: Option<Duration> = None;
    let result = (|| {
        let handles = scene.start_nodes(per_conn, &stop_rx)?;
        let cpu0 = manager_cpu_seconds()?;
        let reg = sim_rt.block_on(wait_count("nodes registered", &scene.shared.registered, nodes, phase_timeout))?;
        let cpu_reg = manager_cpu_seconds()? - cpu0;
        table.row(vec!["registration s".into(), fmt_num(reg.as_secs_f64())]);
        table.row(vec!["registrations/s".into(), fmt_num(nodes as f64 / reg.as_secs_f64().max(1e-9))]);
        table.row(vec!["manager CPU s during registration".into(), fmt_num(cpu_reg)]);
        if job > 0 {
            job_took = Some(scene.job(job, a.max_concurrent, &mut table)?);
        } else if a.global {
            scene.global(&mut table)?;
        } else if a.tasks_per_node > 0 {
            scene.replicas(nodes * a.tasks_per_node, &mut table)?;
        }
        let steady = scene.steady_window(seconds)?;
        let _ = stop_tx.send(true);
        eprintln!("stopping the simulated nodes");
        sim_rt.block_on(async {
            for h in handles {
                let _ = h.await;
            }
        });
        steady.rows(seconds, &scene.shared, &mut table);
        Ok::<_, BenchError>((steady.cores, steady.down, scene.shared.sessions_lost.load(Ordering::Relaxed)))
    })();
    let _ = stop_tx.send(true);
    eprintln!("stopping the manager");
    manager_rt.block_on(cluster.shutdown());
    eprintln!("manager stopped");
    let (cores, down, lost) = result?;
    match job_took {
        Some(took) => report::finish(&table, "agents-job", took.as_secs_f64(), "s"),
        None => report::finish(&table, "agents", cores, "cores"),
    }
    if down > 0 || lost > 0 {
        return Err(BenchError::Request(format!(
            "{down} nodes marked DOWN and {lost} sessions lost although every simulated node kept beating"
        )));
    }
    Ok(())
}

/// The scenario's stage: the manager on its runtime, the simulated nodes on theirs, what they share.
struct Scene<'a> {
    manager_rt: &'a tokio::runtime::Runtime,
    sim_rt: &'a tokio::runtime::Runtime,
    cluster: &'a TestCluster,
    shared: Arc<Shared>,
    /// Simulated nodes.
    nodes: usize,
    /// How long a phase may take.
    phase_timeout: Duration,
}

/// What the steady window measured.
struct Steady {
    /// Manager CPU over the window, in cores.
    cores: f64,
    /// Process RSS, KiB.
    rss_kib: u64,
    /// Heartbeat latencies in the window, sorted, ms.
    latencies: Vec<f64>,
    /// Nodes the manager marked DOWN.
    down: usize,
}

impl Steady {
    /// Its rows of the table, with the heartbeat errors and lost sessions counted in `shared` so far.
    fn rows(&self, seconds: u64, shared: &Shared, table: &mut Table) {
        let lat = &self.latencies;
        table.row(vec![format!("manager CPU, steady {seconds} s window (cores)"), fmt_num(self.cores)]);
        table.row(vec!["process RSS MiB (manager + simulated nodes)".into(), fmt_num(self.rss_kib as f64 / 1024.0)]);
        table.row(vec!["heartbeats in window".into(), lat.len().to_string()]);
        table.row(vec!["heartbeat p50 ms".into(), fmt_num(report::quantile(lat, 0.5))]);
        table.row(vec!["heartbeat p99 ms".into(), fmt_num(report::quantile(lat, 0.99))]);
        table.row(vec!["heartbeat errors".into(), shared.heartbeat_errors.load(Ordering::Relaxed).to_string()]);
        table.row(vec!["sessions lost".into(), shared.sessions_lost.load(Ordering::Relaxed).to_string()]);
        table.row(vec!["nodes wrongly DOWN".into(), self.down.to_string()]);
    }
}

impl Scene<'_> {
    /// Connects the simulated nodes to the manager, `per_conn` of them per HTTP/2 connection, until `stop`.
    fn start_nodes(
        &self,
        per_conn: usize,
        stop: &watch::Receiver<bool>,
    ) -> Result<Vec<tokio::task::JoinHandle<()>>, BenchError> {
        self.sim_rt.block_on(async {
            let endpoint = Endpoint::from_shared(format!("http://{}", self.cluster.manager_addr()))
                .map_err(|e| BenchError::Setup(e.to_string()))?
                .tcp_nodelay(true)
                .connect_timeout(CALL_TIMEOUT);
            let mut channels = Vec::new();
            for _ in 0..self.nodes.div_ceil(per_conn) {
                channels.push(endpoint.connect().await.map_err(|e| BenchError::Request(format!("connect: {e}")))?);
            }
            let mut handles = Vec::with_capacity(self.nodes);
            for i in 0..self.nodes {
                handles.push(tokio::spawn(sim_node(
                    i,
                    channels[i / per_conn].clone(),
                    self.shared.clone(),
                    stop.clone(),
                )));
            }
            Ok(handles)
        })
    }

    /// Runs a replicated job of `job` completions, at most `max_concurrent` (all nodes by default) at once,
    /// to its end; checks it made and completed exactly `job` tasks within the bound. Returns how long it took.
    fn job(&self, job: u64, max_concurrent: Option<u64>, table: &mut Table) -> Result<Duration, BenchError> {
        let max_concurrent = max_concurrent.unwrap_or(self.nodes as u64).max(1);
        let mut spec = crate::e2e::sleep_service("agents-job", 0);
        spec.mode = Some(shoal_api::service_spec::Mode::ReplicatedJob(shoal_api::ReplicatedJob {
            max_concurrent,
            total_completions: job,
        }));
        let cpu_before = manager_cpu_seconds()?;
        let start = Instant::now();
        let svc = self
            .manager_rt
            .block_on(controlapi::create_service(&self.cluster.state, spec))
            .map_err(|e| BenchError::Request(e.to_string()))?;
        let done = |t: &shoal_store::Tables| {
            t.tasks()
                .by_service(&svc.id)
                .filter(|t| t.status.as_ref().is_some_and(|s| s.state == TaskState::Complete as i32))
                .count()
        };
        // Tasks meant to run and not finished: never more than max_concurrent.
        let in_flight = |t: &shoal_store::Tables| {
            t.tasks()
                .by_service(&svc.id)
                .filter(|t| {
                    t.desired_state <= TaskState::Complete as i32
                        && t.status.as_ref().is_none_or(|s| s.state <= TaskState::Running as i32)
                })
                .count()
        };
        // Sampled every `SAMPLE_EVERY` (a view over the job's tasks), not on every commit, so that the
        // measure does not hold the store's read lock on every write.
        let mut most_in_flight = 0;
        let mut last_log = Instant::now();
        loop {
            let (n, flying) = self.cluster.state.store.view(|t| (done(t), in_flight(t)));
            most_in_flight = most_in_flight.max(flying);
            if n as u64 >= job {
                break;
            }
            if start.elapsed() > self.phase_timeout {
                return Err(BenchError::Timeout(format!("{job} completions: {n} after {:?}", self.phase_timeout)));
            }
            if last_log.elapsed() >= Duration::from_secs(10) {
                eprintln!("{:.0} s: {n} completions, {flying} in flight", start.elapsed().as_secs_f64());
                last_log = Instant::now();
            }
            std::thread::sleep(SAMPLE_EVERY);
        }
        let took = start.elapsed();
        let cpu = manager_cpu_seconds()? - cpu_before;
        let (made, complete) = self.cluster.state.store.view(|t| (t.tasks().by_service(&svc.id).count(), done(t)));
        table.row(vec!["job completions".into(), job.to_string()]);
        table.row(vec!["job max concurrent".into(), max_concurrent.to_string()]);
        table.row(vec!["job complete s".into(), fmt_num(took.as_secs_f64())]);
        table.row(vec!["completions/s".into(), fmt_num(job as f64 / took.as_secs_f64().max(1e-9))]);
        table.row(vec!["manager CPU s during the job".into(), fmt_num(cpu)]);
        table.row(vec!["manager CPU during the job (cores)".into(), fmt_num(cpu / took.as_secs_f64().max(1e-9))]);
        table.row(vec!["job tasks made / COMPLETE".into(), format!("{made} / {complete}")]);
        table.row(vec!["most job tasks in flight (sampled)".into(), most_in_flight.to_string()]);
        if made as u64 != job || complete as u64 != job || most_in_flight as u64 > max_concurrent {
            return Err(BenchError::Request(format!(
                "the job made {made} tasks, {complete} COMPLETE ({job} expected), at most {most_in_flight} in flight \
                 ({max_concurrent} allowed)"
            )));
        }
        Ok(took)
    }

    /// Starts a global service and waits until every node reported its task RUNNING.
    fn global(&self, table: &mut Table) -> Result<(), BenchError> {
        let nodes = self.nodes;
        let mut spec = crate::e2e::sleep_service("agents-global", 0);
        spec.mode = Some(shoal_api::service_spec::Mode::Global(shoal_api::GlobalService {}));
        let cpu_before = manager_cpu_seconds()?;
        let start = Instant::now();
        self.manager_rt
            .block_on(controlapi::create_service(&self.cluster.state, spec))
            .map_err(|e| BenchError::Request(e.to_string()))?;
        self.sim_rt.block_on(wait_count(
            "global tasks reported RUNNING",
            &self.shared.running_reported,
            nodes,
            self.phase_timeout,
        ))?;
        let took = start.elapsed();
        table.row(vec![format!("global service: {nodes} tasks reported RUNNING s"), fmt_num(took.as_secs_f64())]);
        table.row(vec![
            "manager CPU s during the global service's start".into(),
            fmt_num(manager_cpu_seconds()? - cpu_before),
        ]);
        Ok(())
    }

    /// Starts a service of `replicas` tasks and waits until they are all reported RUNNING.
    fn replicas(&self, replicas: usize, table: &mut Table) -> Result<(), BenchError> {
        let start = Instant::now();
        self.manager_rt
            .block_on(controlapi::create_service(
                &self.cluster.state,
                crate::e2e::sleep_service("agents-bench", replicas as u64),
            ))
            .map_err(|e| BenchError::Request(e.to_string()))?;
        self.sim_rt.block_on(wait_count(
            "tasks reported RUNNING",
            &self.shared.running_reported,
            replicas,
            self.phase_timeout,
        ))?;
        table.row(vec![format!("{replicas} replicas reported RUNNING s"), fmt_num(start.elapsed().as_secs_f64())]);
        Ok(())
    }

    /// Measures the manager over a steady window of `seconds`: its CPU, the process's RSS, the heartbeats'
    /// latencies, and the nodes it wrongly marked DOWN.
    fn steady_window(&self, seconds: u64) -> Result<Steady, BenchError> {
        let shared = &self.shared;
        shared.latencies.take();
        shared.measuring.store(true, Ordering::Relaxed);
        eprintln!("steady window: {seconds} s");
        let cpu1 = manager_cpu_seconds()?;
        let t1 = Instant::now();
        std::thread::sleep(Duration::from_secs(seconds));
        let cpu2 = manager_cpu_seconds()?;
        let window = t1.elapsed().as_secs_f64();
        shared.measuring.store(false, Ordering::Relaxed);
        let cores = (cpu2 - cpu1) / window;
        let rss_kib = procstat::rss_kib(std::process::id() as i32)?;
        let mut latencies = shared.latencies.take();
        latencies.sort_by(|x, y| x.total_cmp(y));
        let down = self.cluster.state.store.view(|t| {
            t.nodes()
                .iter()
                .filter(|n| n.status.as_ref().is_some_and(|s| s.state == node_status::State::Down as i32))
                .count()
        });
        Ok(Steady { cores, rss_kib, latencies, down })
    }
}
