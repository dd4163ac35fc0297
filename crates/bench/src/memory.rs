//! `memory`: resident memory of a real `shoal daemon` (manager and worker in one process): idle right after
//! start-up (median of the daemon's RSS sampled over `SETTLE`, also split into anonymous memory and
//! file-backed pages: the mapped `shoald` binary), then with `--tasks` tasks in its store.
//! The tasks belong to services of `--replicas` replicas (default `TASKS_PER_SERVICE`) created through the
//! Engine API with a placement constraint no node satisfies, so they stay PENDING in the store and no process
//! is started: the figure is the manager's state, not task processes. Waits until every service has all its
//! tasks (listing each service's tasks), then samples RSS again.
//!
//! Before each start the pages of the `shoal` binary and of the `shoald` beside it (the daemon `shoal daemon`
//! executes; until session 20 only `shoal`'s were dropped) are dropped from the page cache
//! (`posix_fadvise(DONTNEED)`), so that the daemon's own start reads them in: kernel 6.18 maps a page-cache
//! large folio whole, so the file-backed part of RSS depends on how the binary's pages were cached (the same
//! binary measured 9.55 MiB read in by its own start, 9.74 MiB as a fresh copy, 9.88 MiB after `cat` of the
//! file). Dropping clean cached pages of one file changes nothing else.
//! Must not depend on the daemon's internals.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::daemon::BenchDaemon;
use crate::engine_client::EngineConn;
use crate::procstat;
use crate::report::{self, fmt_num, BenchError, Table};

/// Replicas per created service unless `--replicas` says otherwise.
pub(crate) const TASKS_PER_SERVICE: usize = 1000;
/// How long RSS is sampled (every 50 ms) before a figure is taken.
pub(crate) const SETTLE: Duration = Duration::from_millis(500);
/// Most time to wait for the orchestrator to create all tasks.
pub(crate) const TASKS_TIMEOUT: Duration = Duration::from_secs(300);

/// Flags of `memory`.
#[derive(Debug, clap::Args)]
pub(crate) struct MemoryArgs {
    /// Tasks to hold in the store after the idle measurement (0: idle only).
    #[arg(long, default_value_t = 2000)]
    tasks: usize,
    /// Replicas per created service (`--tasks 2000 --replicas 10`: 200 services of 10 tasks).
    #[arg(long, default_value_t = TASKS_PER_SERVICE)]
    replicas: usize,
    /// Runs (a fresh daemon each); RESULT is the median RSS with the tasks (idle with --tasks 0).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// A size that runs in seconds (200 tasks, 1 run).
    #[arg(long)]
    smoke: bool,
}

fn settled_rss_kib(pid: i32) -> Result<u64, BenchError> {
    Ok(settled_rss_parts_kib(pid)?.0)
}

/// Medians of the samples over `SETTLE`: (VmRSS, RssAnon, RssFile) in KiB.
fn settled_rss_parts_kib(pid: i32) -> Result<(u64, u64, u64), BenchError> {
    let start = Instant::now();
    let (mut rss, mut anon, mut file) = (Vec::new(), Vec::new(), Vec::new());
    while start.elapsed() < SETTLE {
        rss.push(procstat::rss_kib(pid)? as f64);
        let (a, f) = procstat::rss_parts_kib(pid)?;
        anon.push(a as f64);
        file.push(f as f64);
        std::thread::sleep(Duration::from_millis(50));
    }
    #[expect(clippy::cast_possible_truncation, reason = "the median of u64 KiB samples is a whole u64 or a half")]
    fn kib(samples: &[f64]) -> u64 {
        report::median(samples) as u64
    }
    Ok((kib(&rss), kib(&anon), kib(&file)))
}

fn pending_spec(name: &str, replicas: usize) -> String {
    serde_json::json!({
        "Name": name,
        "TaskTemplate": {
            "ContainerSpec": { "Image": "busybox", "Args": ["sleep", "3600"] },
            "Placement": { "Constraints": ["node.labels.shoal-bench==nowhere"] },
        },
        "Mode": { "Replicated": { "Replicas": replicas } },
    })
    .to_string()
}

async fn load_tasks(socket: &Path, tasks: usize, replicas: usize) -> Result<(), BenchError> {
    let mut c = EngineConn::connect(socket).await?;
    let mut ids = Vec::new();
    let mut left = tasks;
    let mut i = 0;
    while left > 0 {
        let n = left.min(replicas.max(1));
        let (status, body) = c.request("POST", "/services/create", Some(pending_spec(&format!("mem-{i}"), n))).await?;
        if status != 201 {
            return Err(BenchError::Request(format!(
                "POST /services/create: {status} {}",
                String::from_utf8_lossy(&body)
            )));
        }
        let v: serde_json::Value = serde_json::from_slice(&body).map_err(|e| BenchError::Request(e.to_string()))?;
        ids.push((v["ID"].as_str().unwrap_or_default().to_string(), n));
        left -= n;
        i += 1;
    }
    let start = Instant::now();
    for (id, n) in ids {
        let filters = format!(r#"{{"service":["{id}"]}}"#);
        let path = format!("/tasks?filters={}", percent(&filters));
        loop {
            let v = c.get_json(&path).await?;
            if v.as_array().map_or(0, Vec::len) >= n {
                break;
            }
            if start.elapsed() > TASKS_TIMEOUT {
                return Err(BenchError::Timeout(format!("{tasks} tasks not created within {TASKS_TIMEOUT:?}")));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

fn percent(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Drops the page-cache pages of `path` (see the module doc).
fn drop_cached_pages(path: &Path) -> Result<(), BenchError> {
    let file = std::fs::File::open(path).map_err(|e| BenchError::Setup(format!("open {}: {e}", path.display())))?;
    nix::fcntl::posix_fadvise(&file, 0, 0, nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED)
        .map_err(|e| BenchError::Setup(format!("posix_fadvise {}: {e}", path.display())))
}

/// Runs the scenario.
pub(crate) fn run(a: MemoryArgs, shoal: &Path) -> Result<(), BenchError> {
    let (tasks, runs) = if a.smoke { (200, 1) } else { (a.tasks, a.runs.max(1)) };
    let rt = report::runtime()?;
    let mut table =
        Table::new(&["run", "idle RSS MiB", "anon MiB", "file MiB", "tasks", "RSS with tasks MiB", "KiB per task"]);
    let mut figures = Vec::new();
    for r in 1..=runs {
        drop_cached_pages(shoal)?;
        let daemon_binary = shoal.with_file_name("shoald");
        if daemon_binary.exists() {
            drop_cached_pages(&daemon_binary)?;
        }
        let daemon = BenchDaemon::start(shoal)?;
        let (idle, anon, file) = settled_rss_parts_kib(daemon.pid())?;
        let mib = |kib: u64| fmt_num(kib as f64 / 1024.0);
        let mut row = vec![r.to_string(), mib(idle), mib(anon), mib(file), tasks.to_string()];
        if tasks > 0 {
            rt.block_on(load_tasks(daemon.socket(), tasks, a.replicas))?;
            let loaded = settled_rss_kib(daemon.pid())?;
            row.push(fmt_num(loaded as f64 / 1024.0));
            row.push(fmt_num(loaded.saturating_sub(idle) as f64 / tasks as f64));
            figures.push(loaded as f64 / 1024.0);
        } else {
            row.extend([String::new(), String::new()]);
            figures.push(idle as f64 / 1024.0);
        }
        table.row(row);
    }
    // The RSS with the tasks loaded, or the idle RSS with --tasks 0.
    report::finish(&table, "memory", report::median(&figures), "MiB");
    Ok(())
}
