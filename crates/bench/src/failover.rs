//! `failover`: three managers in three `shoal daemon` processes (127.0.0.31-33, the second and third join
//! the first with `--join-addr`, and its manager join token when the cluster issues one). Once there is a
//! leader and a write went through, the leader is killed with SIGKILL; timed from the kill to the first
//! service create that succeeds through a survivor's Engine API (tried every `RETRY`). RESULT: the median
//! over `--runs` clusters. `--load N` keeps N busy loops running throughout; `--hold S` keeps each formed
//! cluster S seconds before the kill and counts the elections meanwhile (the Raft terms its managers logged),
//! which are false ones: no manager had gone. Daemons come from the test harness
//! (`shoal_testkit::DaemonProcess`), which stops them and removes their dirs on drop.
//! Must not depend on the daemon's internals.

use std::path::Path;
use std::time::{Duration, Instant};

use shoal_testkit::daemon::DaemonOptions;
use shoal_testkit::{http, DaemonProcess};

use crate::report::{self, fmt_num, BenchError, Table};

/// Pause between write attempts on a survivor.
pub(crate) const RETRY: Duration = Duration::from_millis(5);
/// Most time for a cluster to form, or for a write after the kill.
pub(crate) const DEADLINE: Duration = Duration::from_secs(60);

/// Flags of `failover`.
#[derive(Debug, clap::Args)]
pub(crate) struct FailoverArgs {
    /// Clusters (a fresh one each); RESULT is the median.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// One run.
    #[arg(long)]
    smoke: bool,
    /// Busy-loop processes kept running beside the managers for the whole run (issue 38 asks for 8 on 2 cores).
    #[arg(long, default_value_t = 0)]
    load: usize,
    /// Seconds the formed cluster runs (under the load) before the kill; an election meanwhile is a false one.
    #[arg(long, default_value_t = 0)]
    hold: u64,
}

/// Busy loops (`sh -c 'while :; do :; done'`), each in a process group of its own, killed when dropped.
struct Load(Vec<std::process::Child>);

impl Load {
    fn start(n: usize) -> Result<Load, BenchError> {
        use std::os::unix::process::CommandExt;
        let mut load = Load(Vec::new());
        for _ in 0..n {
            let child = std::process::Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .process_group(0)
                .spawn()
                .map_err(|e| BenchError::Setup(format!("cannot start a busy loop: {e}")))?;
            load.0.push(child);
        }
        Ok(load)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The highest Raft term any of `ds` logged a leadership change in ("raft leadership changed ... term=N").
fn highest_term(ds: &[DaemonProcess]) -> u64 {
    ds.iter()
        .flat_map(|d| {
            d.log()
                .lines()
                .filter(|l| l.contains("raft leadership changed"))
                .filter_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("term=")?.parse::<u64>().ok()))
                .collect::<Vec<_>>()
        })
        .max()
        .unwrap_or(0)
}

/// Manager on 127.0.0.`i`, joining `join`'s cluster when given.
pub(crate) fn manager(shoal: &Path, i: u8, join: Option<&DaemonProcess>) -> DaemonProcess {
    let mut opts = DaemonOptions {
        listen_ip: Some(format!("127.0.0.{i}")),
        hostname: Some(format!("bench-manager-{i}")),
        ..DaemonOptions::default()
    };
    if let Some(j) = join {
        opts.extra_args = vec!["--join-addr".into(), j.remote_addr()];
        let token = j.get("/swarm")["JoinTokens"]["Manager"].as_str().unwrap_or_default().to_string();
        if !token.is_empty() {
            opts.extra_args.extend(["--join-token".into(), token]);
        }
    }
    DaemonProcess::start_with(shoal, opts)
}

fn create(d: &DaemonProcess, name: &str) -> Result<(), String> {
    let body = serde_json::json!({
        "Name": name,
        "TaskTemplate": {"ContainerSpec": {"Image": "busybox", "Args": ["sleep", "3600"]}},
        "Mode": {"Replicated": {"Replicas": 0}},
    });
    let r = http::request(d.socket(), "POST", "/services/create", Some(&body.to_string()))?;
    if r.status == 201 {
        Ok(())
    } else {
        Err(format!("{} {}", r.status, r.body))
    }
}

/// Starts `n` managers on 127.0.0.`first_ip`.. (the others join the first) and waits for a leader; returns
/// them and the leader's position.
pub(crate) fn cluster(shoal: &Path, n: usize, first_ip: u8) -> Result<(Vec<DaemonProcess>, usize), BenchError> {
    let mut ds: Vec<DaemonProcess> = vec![manager(shoal, first_ip, None)];
    for i in 1..n {
        let ip = u8::try_from(i)
            .ok()
            .and_then(|i| first_ip.checked_add(i))
            .ok_or_else(|| BenchError::Setup(format!("{n} managers from address .{first_ip} run past .255")))?;
        let d = manager(shoal, ip, Some(&ds[0]));
        ds.push(d);
    }
    let host = wait(&format!("{n} managers with a leader"), || leader(&ds[0], n))?;
    let pos = host
        .strip_prefix("bench-manager-")
        .and_then(|i| i.parse::<usize>().ok())
        .and_then(|i| i.checked_sub(first_ip as usize))
        .filter(|i| *i < n)
        .ok_or_else(|| BenchError::Request(format!("leader {host:?} is none of the {n} managers")))?;
    Ok((ds, pos))
}

/// The hostname of the leader as `d` sees it, once there are `n` managers.
fn leader(d: &DaemonProcess, n: usize) -> Option<String> {
    let nodes = http::request(d.socket(), "GET", "/nodes", None).ok()?.body;
    let list = nodes.as_array()?;
    let managers = list.iter().filter(|n| n["ManagerStatus"].is_object()).count();
    let leader = list.iter().find(|n| n["ManagerStatus"]["Leader"].as_bool() == Some(true))?;
    (managers >= n).then(|| leader["Description"]["Hostname"].as_str().unwrap_or_default().to_string())
}

fn wait<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> Result<T, BenchError> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if start.elapsed() > DEADLINE {
            return Err(BenchError::Timeout(format!("{what} within {DEADLINE:?}")));
        }
        std::thread::sleep(RETRY);
    }
}

/// One cluster: how long it took to form, the elections while it was held before the kill (false ones: no
/// manager had gone), and the kill of its leader to the first write through a survivor.
struct Run {
    formed: Duration,
    /// The highest term logged before the kill (0 would mean the logs were not read).
    term: u64,
    false_elections: u64,
    failover: Duration,
}

fn one_run(shoal: &Path, run: usize, hold: Duration) -> Result<Run, BenchError> {
    let formed = Instant::now();
    let (mut ds, old) = cluster(shoal, 3, 31)?;
    let formed = formed.elapsed();
    wait("a first write", || create(&ds[(old + 1) % 3], &format!("before-{run}")).ok())?;
    let term = highest_term(&ds);
    std::thread::sleep(hold);
    let term_at_kill = highest_term(&ds);
    let false_elections = term_at_kill.saturating_sub(term);
    ds[old].kill9();
    let killed = Instant::now();
    let survivor = &ds[(old + 1) % 3];
    let mut attempt = 0;
    wait("a write through a survivor after kill -9 of the leader", || {
        attempt += 1;
        create(survivor, &format!("after-{run}-{attempt}")).ok()
    })?;
    Ok(Run { formed, term: term_at_kill, false_elections, failover: killed.elapsed() })
}

/// Runs the scenario.
pub(crate) fn run(a: FailoverArgs, shoal: &Path) -> Result<(), BenchError> {
    if !shoal.exists() {
        return Err(BenchError::Daemon(format!("{} not found: build it or pass --shoal PATH", shoal.display())));
    }
    let runs = if a.smoke { 1 } else { a.runs.max(1) };
    let _load = Load::start(a.load)?;
    let hold = Duration::from_secs(a.hold);
    let mut table =
        Table::new(&["run", "cluster formed ms", "term at the kill", "false elections", "kill -9 to write ms"]);
    let mut times = Vec::new();
    for r in 1..=runs {
        let run = one_run(shoal, r, hold)?;
        let ms = run.failover.as_secs_f64() * 1000.0;
        let formed = fmt_num(run.formed.as_secs_f64() * 1000.0);
        table.row(vec![r.to_string(), formed, run.term.to_string(), run.false_elections.to_string(), fmt_num(ms)]);
        times.push(ms);
    }
    report::finish(&table, "failover", report::median(&times), "ms");
    Ok(())
}
