//! `writes`: control-plane write throughput. A fresh `shoal daemon` (one manager, Raft log fsync'd before
//! every acknowledgement), or with `--managers K` a fresh cluster of K daemons written through its leader,
//! takes `--creates` service creates, either through the Engine API on its control
//! socket (`--clients` concurrent keep-alive connections, `POST /services/create`) or through the `shoal`
//! CLI (`--clients` concurrent loops, one `shoal service create` process per create). Services have
//! `--replicas` replicas (default 0, so that the figure is the write path and not task processes).
//! Reports creates per second and per-create latency; RESULT is the median rate over `--runs` daemons.
//! Must not depend on the daemon's internals: it is a client, like docker or the shoal CLI.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::daemon::BenchDaemon;
use crate::engine_client::{service_spec_json, EngineConn};
use crate::report::{self, fmt_num, BenchError, Table};

/// How creates are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Via {
    /// HTTP requests on the control socket.
    Api,
    /// One `shoal service create` process per create.
    Cli,
    /// One stock `docker service create --detach` process per create (the docker CLI on PATH), for the
    /// same loop with Docker's own client.
    Docker,
}

/// Flags of `writes`.
#[derive(Debug, clap::Args)]
pub(crate) struct WritesArgs {
    /// Concurrent clients (connections, or CLI loops).
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Managers: 1 is a single daemon; more is a cluster of daemons joined with --join-addr, written
    /// through the leader.
    #[arg(long, default_value_t = 1)]
    managers: usize,
    /// Engine API or CLI.
    #[arg(long, value_enum, default_value_t = Via::Api)]
    via: Via,
    /// Service creates per run (default: 4000 through the API, 500 through the CLI).
    #[arg(long)]
    creates: Option<usize>,
    /// Replicas of each created service.
    #[arg(long, default_value_t = 0)]
    replicas: u64,
    /// Runs (a fresh daemon each); RESULT is the median.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// A size that runs in seconds (200 creates through the API, 20 through the CLI, 1 run).
    #[arg(long)]
    smoke: bool,
}

struct Run {
    rate: f64,
    latencies_ms: Vec<f64>,
}

async fn api_run(socket: &Path, clients: usize, creates: usize, replicas: u64, run: usize) -> Result<Run, BenchError> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut conns = Vec::new();
    for _ in 0..clients {
        conns.push(EngineConn::connect(socket).await?);
    }
    let start = Instant::now();
    let mut handles = Vec::new();
    for mut conn in conns {
        let next = next.clone();
        handles.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= creates {
                    return Ok::<_, BenchError>(lat);
                }
                let body = service_spec_json(&format!("bench-{run}-{i}"), replicas);
                let t = Instant::now();
                let (status, body) = conn.request("POST", "/services/create", Some(body)).await?;
                if status != 201 {
                    return Err(BenchError::Request(format!(
                        "POST /services/create: {status} {}",
                        String::from_utf8_lossy(&body)
                    )));
                }
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
            }
        }));
    }
    let mut latencies_ms = Vec::new();
    for h in handles {
        latencies_ms.extend(h.await.map_err(|e| BenchError::Request(e.to_string()))??);
    }
    let elapsed = start.elapsed();
    Ok(Run { rate: creates as f64 / elapsed.as_secs_f64(), latencies_ms })
}

fn cli_run(
    shoal: &Path,
    via: Via,
    socket: &Path,
    clients: usize,
    creates: usize,
    replicas: u64,
    run: usize,
) -> Result<Run, BenchError> {
    let next = Arc::new(AtomicUsize::new(0));
    let host = format!("unix://{}", socket.display());
    let program = if via == Via::Docker { Path::new("docker") } else { shoal };
    let start = Instant::now();
    let results: Vec<Result<Vec<f64>, BenchError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..clients)
            .map(|_| {
                let next = next.clone();
                let host = host.clone();
                s.spawn(move || {
                    let mut lat = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= creates {
                            return Ok(lat);
                        }
                        let t = Instant::now();
                        let mut cmd = std::process::Command::new(program);
                        cmd.args(["-H", &host, "service", "create"]);
                        if program != shoal {
                            // The docker CLI otherwise waits for the service to converge.
                            cmd.arg("--detach");
                        }
                        let out = cmd
                            .arg("--name")
                            .arg(format!("bench-{run}-{i}"))
                            .arg("--replicas")
                            .arg(replicas.to_string())
                            .arg("busybox")
                            .output()
                            .map_err(|e| BenchError::Request(format!("run {}: {e}", program.display())))?;
                        if !out.status.success() {
                            return Err(BenchError::Request(format!(
                                "{} service create: {}",
                                program.display(),
                                String::from_utf8_lossy(&out.stderr).trim()
                            )));
                        }
                        lat.push(t.elapsed().as_secs_f64() * 1000.0);
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(BenchError::Request("a client panicked".into()))))
            .collect()
    });
    let elapsed = start.elapsed();
    let mut latencies_ms = Vec::new();
    for r in results {
        latencies_ms.extend(r?);
    }
    Ok(Run { rate: creates as f64 / elapsed.as_secs_f64(), latencies_ms })
}

/// Spawns per floor measurement.
const SPAWN_FLOOR_SAMPLES: usize = 50;

/// The median time to start and reap `program args` here, in ms, spawned as the CLI loop spawns `shoal`
/// (output captured). With `true`: no CLI loop, one process per create, can be faster than one of these
/// per create; with `shoal --version`: the cost of the `shoal` process itself, without a request.
fn spawn_floor_ms(program: &Path, args: &[&str]) -> Result<f64, BenchError> {
    let mut times = Vec::with_capacity(SPAWN_FLOOR_SAMPLES);
    for _ in 0..SPAWN_FLOOR_SAMPLES {
        let t = Instant::now();
        let out = std::process::Command::new(program)
            .args(args)
            .output()
            .map_err(|e| BenchError::Setup(format!("run {}: {e}", program.display())))?;
        if !out.status.success() {
            return Err(BenchError::Setup(format!("`{} {}` failed", program.display(), args.join(" "))));
        }
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(report::median(&times))
}

/// Runs the scenario.
pub(crate) fn run(a: WritesArgs, shoal: &Path) -> Result<(), BenchError> {
    if !(1..=5).contains(&a.managers) {
        return Err(BenchError::Setup(format!("--managers {}: use 1 to 5", a.managers)));
    }
    let default_creates = match a.via {
        Via::Api => 4000,
        Via::Cli | Via::Docker => 500,
    };
    let (creates, runs) = if a.smoke {
        (if a.via == Via::Api { 200 } else { 20 }, 1)
    } else {
        (a.creates.unwrap_or(default_creates), a.runs.max(1))
    };
    let clients = a.clients.max(1);
    let rt = report::runtime()?;
    let mut table = Table::new(&["run", "via", "managers", "clients", "creates", "creates/s", "p50 ms", "p99 ms"]);
    if a.via != Via::Api {
        for (what, program, args) in [
            ("spawn `true`", Path::new("true"), &[][..]),
            ("`shoal --version`", shoal, &["--version"][..]),
            ("`docker --version`", Path::new("docker"), &["--version"][..]),
        ]
        .into_iter()
        .filter(|(what, ..)| !what.contains(if a.via == Via::Cli { "docker" } else { "shoal" }))
        {
            let floor = spawn_floor_ms(program, args)?;
            table.row(vec![
                "floor".into(),
                what.into(),
                String::new(),
                "1".into(),
                SPAWN_FLOOR_SAMPLES.to_string(),
                fmt_num(1000.0 / floor),
                fmt_num(floor),
                String::new(),
            ]);
        }
    }
    let mut rates = Vec::new();
    for r in 1..=runs {
        // One manager: a bench daemon. Several: a cluster of daemons (127.0.0.41..), writes to the leader.
        let (single, cluster) = if a.managers == 1 {
            (Some(BenchDaemon::start(shoal)?), None)
        } else {
            (None, Some(crate::failover::cluster(shoal, a.managers, 41)?))
        };
        let socket: &Path = match (&single, &cluster) {
            (Some(d), _) => d.socket(),
            (None, Some((ds, leader))) => ds[*leader].socket(),
            (None, None) => unreachable!("one of the two is started"),
        };
        let run = match a.via {
            Via::Api => rt.block_on(api_run(socket, clients, creates, a.replicas, r))?,
            Via::Cli | Via::Docker => cli_run(shoal, a.via, socket, clients, creates, a.replicas, r)?,
        };
        let listed = rt.block_on(async {
            let mut c = EngineConn::connect(socket).await?;
            let v = c.get_json("/services").await?;
            Ok::<_, BenchError>(v.as_array().map_or(0, Vec::len))
        })?;
        if listed != creates {
            return Err(BenchError::Request(format!("created {creates} services but the daemon lists {listed}")));
        }
        let mut lat = run.latencies_ms.clone();
        lat.sort_by(|x, y| x.total_cmp(y));
        table.row(vec![
            r.to_string(),
            format!("{:?}", a.via).to_lowercase(),
            a.managers.to_string(),
            clients.to_string(),
            creates.to_string(),
            fmt_num(run.rate),
            fmt_num(report::quantile(&lat, 0.5)),
            fmt_num(report::quantile(&lat, 0.99)),
        ]);
        rates.push(run.rate);
        drop(single);
        drop(cluster);
    }
    let med = report::median(&rates);
    report::finish(&table, "writes", med, "creates/s");
    Ok(())
}
