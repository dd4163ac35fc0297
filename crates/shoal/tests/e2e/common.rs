//! Helpers shared by the end-to-end tests of the `shoal` binary.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;
use shoal_testkit::prerequisites::{self, Prerequisite};
pub(crate) use shoal_testkit::{docker_cli, process, wait_until, DaemonProcess};

#[path = "common/netcluster.rs"]
pub(crate) mod netcluster;

#[path = "common/container_checks.rs"]
pub(crate) mod container_checks;

#[path = "common/acceptance_stack.rs"]
pub(crate) mod acceptance_stack;

/// The binary under test: cargo's build of it, or the one `SHOAL_TEST_BIN` names (to compare two builds
/// with one test binary).
pub(crate) fn shoal_bin() -> PathBuf {
    std::env::var_os("SHOAL_TEST_BIN").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_shoal")))
}

/// Starts a daemon on a fresh state dir.
pub(crate) fn daemon() -> DaemonProcess {
    DaemonProcess::start(&shoal_bin())
}

/// The daemon on 127.0.0.`i` with hostname `hostname`; with `join = Some((d, role))` it joins `d`'s cluster
/// with its join token for `role` ("Manager" or "Worker").
pub(crate) fn node_at(i: u8, hostname: &str, join: Option<(&DaemonProcess, &str)>) -> DaemonProcess {
    shoal_testkit::managers::start_node(&shoal_bin(), i, hostname, join)
}

/// Manager `i`: hostname `manager-{i}` on 127.0.0.`i`; with `join`, it joins that manager's cluster with its
/// manager token.
pub(crate) fn manager_at(i: u8, join: Option<&DaemonProcess>) -> DaemonProcess {
    node_at(i, &format!("manager-{i}"), join.map(|j| (j, "Manager")))
}

/// Tasks of a service, from the Engine API.
pub(crate) fn tasks_of(d: &DaemonProcess, service: &str) -> Vec<Value> {
    let filters = format!("{{\"service\":{{\"{service}\":true}}}}");
    let v = d.get(&format!("/v1.47/tasks?filters={}", urlencode(&filters)));
    v.as_array().cloned().unwrap_or_default()
}

/// The names of the services `d` lists.
pub(crate) fn service_names(d: &DaemonProcess) -> Vec<String> {
    let services = d.get("/v1.47/services");
    let services = services.as_array().expect("a list of services");
    services.iter().map(|s| s["Spec"]["Name"].as_str().unwrap_or("").to_string()).collect()
}

/// Percent-encodes a query value.
pub(crate) fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// State of a task JSON ("running", ...).
pub(crate) fn state(t: &Value) -> &str {
    t["Status"]["State"].as_str().unwrap_or("")
}

/// Desired state of a task JSON.
pub(crate) fn desired(t: &Value) -> &str {
    t["DesiredState"].as_str().unwrap_or("")
}

/// Waits until the service has exactly `n` tasks running with desired state running, and `n` processes with
/// the given command line exist. Returns the running tasks.
pub(crate) fn wait_running(
    d: &DaemonProcess,
    service: &str,
    n: usize,
    argv: &[&str],
    deadline: Duration,
) -> Vec<Value> {
    wait_until(&format!("{n} running tasks of {service} and {n} `{}` processes", argv.join(" ")), deadline, || {
        let tasks = tasks_of(d, service);
        let running: Vec<Value> =
            tasks.iter().filter(|t| state(t) == "running" && desired(t) == "running").cloned().collect();
        let pids = process::pids_with_cmdline(argv);
        if running.len() == n && pids.len() == n {
            Ok(running)
        } else {
            Err(format!("{} running tasks, {} processes", running.len(), pids.len()))
        }
    })
}

/// The docker CLI against the daemon, asserting success.
pub(crate) fn docker(d: &DaemonProcess, args: &[&str]) -> String {
    docker_cli::ok(d.socket(), args)
}

/// Whether to skip a test that drives the docker CLI: a missing CLI fails the test, unless
/// `SHOAL_TEST_SKIP_MISSING` names it (`shoal_testkit::prerequisites`).
pub(crate) fn no_docker_cli() -> bool {
    prerequisites::skip_unless(Prerequisite::DockerCli)
}

/// Our own CLI against the daemon's control socket `socket`, not started.
pub(crate) fn shoal_command(socket: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(shoal_bin());
    cmd.arg("-H").arg(format!("unix://{}", socket.display())).args(args);
    cmd
}

/// Runs our own CLI against the daemon.
pub(crate) fn shoal_cli(socket: &Path, args: &[&str]) -> std::process::Output {
    shoal_command(socket, args).output().expect("run shoal")
}

/// Starts the docker CLI with `args` on `socket`; its output lines arrive on the channel as it prints them.
pub(crate) fn docker_lines(socket: &Path, args: &[&str]) -> (Child, mpsc::Receiver<String>) {
    let mut child = docker_cli::command(socket, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("docker {}: {e}", args.join(" ")));
    let out = child.stdout.take().expect("stdout");
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    (child, lines)
}

/// A `docker service logs -f --tail 0` process, killed when dropped.
pub(crate) struct Follower {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Follower {
    /// Starts following `target` (a service or task) through the control socket `socket`.
    pub(crate) fn start(socket: &std::path::Path, target: &str) -> Follower {
        let (child, lines) = docker_lines(socket, &["service", "logs", "-f", "--tail", "0", target]);
        Follower { child, lines }
    }

    /// Waits for a line containing `needle`, failing after `deadline`.
    pub(crate) fn wait_for(&self, needle: &str, deadline: Duration) -> String {
        let end = std::time::Instant::now() + deadline;
        loop {
            let left = end.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains(needle) => return l,
                Ok(_) => {}
                Err(_) => panic!("`docker service logs -f` printed no line with {needle:?} within {deadline:?}"),
            }
        }
    }
}

impl Follower {
    /// Waits for the process to exit (its log stream ended), failing after `deadline`.
    pub(crate) fn wait_exit(&mut self, deadline: Duration) -> std::process::ExitStatus {
        wait_until("`docker service logs -f` to exit", deadline, || match self.child.try_wait() {
            Ok(Some(status)) => Ok(status),
            Ok(None) => Err("still running".into()),
            Err(e) => Err(e.to_string()),
        })
    }

    /// Waits for a line starting with `prefix`.
    pub(crate) fn wait_for_prefix(&self, prefix: &str, deadline: Duration) -> String {
        let end = std::time::Instant::now() + deadline;
        loop {
            let left = end.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return l,
                Ok(_) => {}
                Err(_) => {
                    panic!("`docker service logs -f` printed no line starting with {prefix:?} within {deadline:?}")
                }
            }
        }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Milliseconds since the epoch of an RFC 3339 UTC time as the Engine API writes it
/// (`2026-12-01T03:17:15.123456789Z`).
pub(crate) fn chrono_ms(s: &str) -> Option<u64> {
    let (date, time) = s.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|p| p.parse::<i64>());
    let (h, min, sec) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    let millis: i64 = format!("{frac:0<3}")[..3].parse().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((((days * 24 + h) * 60 + min) * 60 + sec) as u64 * 1000 + millis as u64)
}
