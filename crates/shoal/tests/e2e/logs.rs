//! `docker service logs` end to end, for both executors: lines the tasks print come back through the log
//! broker with the CLI's `<service>.<slot>.<task>@<node> | line` prefix, per service and per task, with
//! `--tail` and `-t`, and `-f` keeps streaming new lines.

use crate::common;

use std::time::Duration;

use common::*;
use shoal_testkit::docker_engine::{self, EngineDaemon};

/// A service printing `tick N` on stdout and `tock N` on stderr every 100 ms.
const TICKER: &str = "i=0; while true; do echo tick $i; echo tock $i >&2; i=$((i+1)); sleep 0.1; done";

fn number_after(line: &str, word: &str) -> u64 {
    line.split(word).nth(1).and_then(|r| r.trim().parse().ok()).unwrap_or_else(|| panic!("no number in {line:?}"))
}

/// Runs the checks against a daemon where `image` is usable; `socket` is the daemon's control socket.
fn check_logs(d: &DaemonProcess, image: &str) {
    docker(d, &["service", "create", "--detach", "--name", "ticker", "--replicas", "2", image, "sh", "-c", TICKER]);
    let out = wait_until("both tasks printed a few lines", Duration::from_secs(60), || {
        let out = docker(d, &["service", "logs", "ticker"]);
        let count = |s: &str| out.lines().filter(|l| l.contains(s)).count();
        if out.contains("ticker.1.") && out.contains("ticker.2.") && count("tick 3") == 2 {
            Ok(out)
        } else {
            Err(format!("{} lines so far", out.lines().count()))
        }
    });
    let line = out.lines().find(|l| l.contains("tick 0")).expect("a tick 0 line");
    assert!(line.starts_with("ticker.") && line.contains("@shoal-test-node") && line.contains("| tick 0"), "{line}");

    // Stderr lines come back too (the CLI prints them on its stderr).
    let both = docker_cli::run(d.socket(), &["service", "logs", "ticker"]);
    assert!(String::from_utf8_lossy(&both.stderr).contains("| tock 0"), "stderr lines are returned");

    // --tail 1 -t: one line per task, each with an RFC 3339 time first.
    let tail = docker_cli::run(d.socket(), &["service", "logs", "--tail", "1", "-t", "ticker"]);
    assert!(tail.status.success(), "{}", String::from_utf8_lossy(&tail.stderr));
    // The last line of a task may be on stdout or stderr: count both.
    let tail_all = String::from_utf8_lossy(&tail.stdout).into_owned() + &String::from_utf8_lossy(&tail.stderr);
    let rows: Vec<&str> = tail_all.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(rows.len(), 2, "one line per task: {tail_all}");
    for r in &rows {
        assert!(r.len() > 30 && r.as_bytes()[4] == b'-' && r.as_bytes()[10] == b'T', "timestamped: {r}");
    }

    // One task's logs by task ID.
    let tasks = tasks_of(d, "ticker");
    let t1 = tasks.iter().find(|t| t["Slot"] == 1 && state(t) == "running").expect("task in slot 1");
    let id = t1["ID"].as_str().unwrap();
    let only = docker(d, &["service", "logs", id]);
    assert!(!only.is_empty() && only.lines().all(|l| l.starts_with("ticker.1.")), "task logs: {only}");

    // -f: lines printed after the call started arrive.
    let latest = out.lines().filter(|l| l.contains("tick ")).map(|l| number_after(l, "tick ")).max().unwrap();
    let f = Follower::start(d.socket(), "ticker");
    let later = format!("tick {}", latest + 15);
    let seen = f.wait_for(&later, Duration::from_secs(30));
    assert!(seen.starts_with("ticker."), "{seen}");
    // A task started after the follow began is followed too.
    docker(d, &["service", "scale", "--detach", "ticker=3"]);
    f.wait_for_prefix("ticker.3.", Duration::from_secs(60));
    docker(d, &["service", "rm", "ticker"]);
}

#[test]
fn service_logs_with_the_process_executor() {
    if no_docker_cli() {
        return;
    }
    let d = daemon();
    check_logs(&d, "busybox");
}

#[test]
fn service_logs_with_the_docker_executor() {
    let Some(image) = docker_engine::test_image_or_skip() else { return };
    let d = EngineDaemon::start(&shoal_bin());
    check_logs(&d, image);
}
