//! Jobs driven by the stock docker CLI on real daemons (process executor, so each task is a real `sh -c
//! 'sleep ...'` process): `service create --mode replicated-job --replicas 5 --max-concurrent 2` without
//! `--detach` returns once the job completed, never more than 2 tasks ran at once (from the tasks'
//! timestamps), 5 tasks ended COMPLETE and none was restarted; `service ls` shows the job's progress as
//! docker does; `service update --force` runs it again (5 more, of the next iteration, the old ones kept as
//! history). A global job on 1 manager + 2 workers (127.0.0.13x) runs once per node. On the docker executor
//! (where a Docker Engine answers), a job's containers run to exit 0 and its tasks end COMPLETE.

use crate::common;

use std::collections::BTreeSet;
use std::process::{Child, Stdio};
use std::time::Duration;

use common::*;
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(60);

/// A docker CLI process, killed if still running when dropped (a test that fails leaves none behind).
struct Cli(Child);

impl Drop for Cli {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the docker CLI and waits (at most `DEADLINE`) for it to exit successfully; returns its stdout.
fn docker_returns(d: &DaemonProcess, args: &[&str]) -> String {
    let child = docker_cli::command(d.socket(), args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run docker");
    let mut cli = Cli(child);
    wait_until(&format!("docker {args:?} returns"), DEADLINE, || match cli.0.try_wait() {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err("still running".to_string()),
        Err(e) => Err(e.to_string()),
    });
    let mut out = String::new();
    let mut err = String::new();
    use std::io::Read;
    let _ = cli.0.stdout.take().expect("stdout").read_to_string(&mut out);
    let _ = cli.0.stderr.take().expect("stderr").read_to_string(&mut err);
    let status = cli.0.wait().expect("exit status");
    assert!(status.success(), "docker {args:?} failed ({status}):\nstdout: {out}\nstderr: {err}");
    out
}

fn ms(time: &Value) -> u64 {
    let s = time.as_str().unwrap_or("");
    chrono_ms(s).unwrap_or_else(|| panic!("not a time: {s:?}"))
}

/// The most tasks whose [created, finished] intervals overlap at one instant (an upper bound of how many
/// ran at once: a task runs after it is created and before its COMPLETE status is stamped).
fn most_at_once(tasks: &[&Value]) -> usize {
    let mut events: Vec<(u64, i32)> = Vec::new();
    for t in tasks {
        events.push((ms(&t["CreatedAt"]), 1));
        events.push((ms(&t["Status"]["Timestamp"]), -1));
    }
    // Ends before starts at the same instant.
    events.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, delta) in events {
        now += delta;
        most = most.max(now);
    }
    most as usize
}

fn iteration(t: &Value) -> u64 {
    t["JobIteration"]["Index"].as_u64().unwrap_or(u64::MAX)
}

/// The `service ls` row of `name` as "MODE REPLICAS".
fn ls_row(d: &DaemonProcess, name: &str) -> String {
    docker(d, &["service", "ls", "--filter", &format!("name={name}"), "--format", "{{.Mode}} {{.Replicas}}"])
        .trim()
        .to_string()
}

#[test]
fn a_replicated_job_runs_its_completions_two_at_a_time_and_again_on_forced_update() {
    if no_docker_cli() {
        return;
    }
    let d = daemon();
    let cmd = "sleep 0.3";
    // Without --detach, the CLI follows the job's progress and returns when it completed.
    let out = docker_returns(
        &d,
        &[
            "service",
            "create",
            "--name",
            "batch",
            "--mode",
            "replicated-job",
            "--replicas",
            "5",
            "--max-concurrent",
            "2",
            "busybox",
            "sh",
            "-c",
            cmd,
        ],
    );
    assert!(out.contains("job complete"), "the CLI's progress ends with the job complete:\n{out}");
    let svc = d.get("/v1.47/services/batch");
    assert_eq!(svc["Spec"]["Mode"], serde_json::json!({"ReplicatedJob": {"MaxConcurrent": 2, "TotalCompletions": 5}}));
    assert_eq!(svc["JobStatus"]["JobIteration"]["Index"], 0, "{svc}");
    let tasks = tasks_of(&d, "batch");
    let first: Vec<&Value> = tasks.iter().filter(|t| iteration(t) == 0).collect();
    assert_eq!(first.len(), 5, "5 tasks, none restarted: {tasks:?}");
    assert!(first.iter().all(|t| state(t) == "complete" && desired(t) == "complete"), "{first:?}");
    let slots: BTreeSet<u64> = first.iter().map(|t| t["Slot"].as_u64().unwrap_or(0)).collect();
    assert_eq!(slots.len(), 5, "one slot per completion");
    assert!(most_at_once(&first) <= 2, "more than 2 tasks at once: {first:?}");
    assert_eq!(ls_row(&d, "batch"), "replicated job 0/2 (5/5 completed)");
    let ours = shoal_cli(d.socket(), &["service", "ls"]);
    let ours = String::from_utf8_lossy(&ours.stdout);
    let row = ours.lines().find(|l| l.contains("batch")).unwrap_or_default();
    assert!(row.contains("replicated job") && row.contains("0/2 (5/5 completed)"), "shoal service ls:\n{ours}");

    // `service update --force` runs the job again: 5 more, the first 5 kept as history.
    docker_returns(&d, &["service", "update", "--force", "batch"]);
    let svc = d.get("/v1.47/services/batch");
    assert_eq!(svc["JobStatus"]["JobIteration"]["Index"], 1, "{svc}");
    let tasks = tasks_of(&d, "batch");
    let second: Vec<&Value> = tasks.iter().filter(|t| iteration(t) == 1).collect();
    assert_eq!(second.len(), 5, "5 more: {tasks:?}");
    assert!(second.iter().all(|t| state(t) == "complete"), "{second:?}");
    assert!(most_at_once(&second) <= 2, "more than 2 tasks at once: {second:?}");
    assert_eq!(tasks.iter().filter(|t| iteration(t) == 0 && state(t) == "complete").count(), 5, "history kept");
    assert_eq!(ls_row(&d, "batch"), "replicated job 0/2 (5/5 completed)");
    let ps = docker(&d, &["service", "ps", "batch", "--format", "{{.DesiredState}} {{.CurrentState}}"]);
    assert_eq!(ps.lines().filter(|l| l.starts_with("Complete Complete")).count(), 10, "service ps:\n{ps}");

    docker(&d, &["service", "rm", "batch"]);
    assert!(service_names(&d).is_empty());
}

#[test]
fn a_failing_job_task_is_restarted_and_a_job_can_not_become_a_service() {
    if no_docker_cli() {
        return;
    }
    let d = daemon();
    // The first run fails, the second completes (a marker file).
    let dir = tempfile::tempdir().expect("temp dir");
    let marker = dir.path().join("failed-once");
    let script = format!("test -e {0} && exit 0; touch {0}; exit 1", marker.display());
    docker(
        &d,
        &[
            "service",
            "create",
            "--detach",
            "--name",
            "flaky",
            "--mode",
            "replicated-job",
            "--replicas",
            "1",
            "--restart-delay",
            "100ms",
            "busybox",
            "sh",
            "-c",
            &script,
        ],
    );
    let tasks = wait_until("the failed task is replaced and the job completes", DEADLINE, || {
        let tasks = tasks_of(&d, "flaky");
        if tasks.iter().any(|t| state(t) == "complete") {
            Ok(tasks)
        } else {
            Err(format!("{tasks:?}"))
        }
    });
    assert_eq!(tasks.len(), 2, "one failure, one completion: {tasks:?}");
    assert_eq!(tasks.iter().filter(|t| state(t) == "failed").count(), 1, "{tasks:?}");
    assert!(tasks.iter().all(|t| t.get("Slot").is_none()), "both in slot 0: {tasks:?}");
    // The mode cannot change, and a job takes no update config.
    let out = docker_cli::run(d.socket(), &["service", "update", "--update-parallelism", "2", "flaky"]);
    assert!(!out.status.success());
    let svc = d.get("/v1.47/services/flaky");
    let mut spec = svc["Spec"].clone();
    spec["Mode"] = serde_json::json!({"Replicated": {"Replicas": 1}});
    let r = shoal_testkit::http::request(
        d.socket(),
        "POST",
        &format!("/v1.47/services/flaky/update?version={}", svc["Version"]["Index"]),
        Some(&spec.to_string()),
    )
    .unwrap();
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body["message"].as_str().unwrap_or("").contains("replicated-job -> replicated"), "{}", r.body);
    docker(&d, &["service", "rm", "flaky"]);
}

#[test]
fn a_global_job_runs_once_per_node() {
    if no_docker_cli() {
        return;
    }
    let m = node_at(131, "jm-131", None);
    let _w2 = node_at(132, "jw-132", Some((&m, "Worker")));
    let _w3 = node_at(133, "jw-133", Some((&m, "Worker")));
    wait_until("every node ready", DEADLINE, || {
        let ls = docker(&m, &["node", "ls", "--format", "{{.Hostname}} {{.Status}}"]);
        if ["jm-131", "jw-132", "jw-133"].iter().all(|h| ls.lines().any(|l| l == format!("{h} Ready"))) {
            Ok(())
        } else {
            Err(ls)
        }
    });
    let out = docker_returns(
        &m,
        &["service", "create", "--name", "once", "--mode", "global-job", "busybox", "sh", "-c", "sleep 0.2"],
    );
    assert!(out.contains("job complete"), "{out}");
    let tasks = tasks_of(&m, "once");
    assert_eq!(tasks.len(), 3, "one task per node, none restarted: {tasks:?}");
    assert!(tasks.iter().all(|t| state(t) == "complete"), "{tasks:?}");
    let nodes: BTreeSet<&str> = tasks.iter().map(|t| t["NodeID"].as_str().unwrap_or("")).collect();
    assert_eq!(nodes.len(), 3, "on three different nodes: {tasks:?}");
    assert_eq!(ls_row(&m, "once"), "global job 0/0 (3/3 completed)");
    docker(&m, &["service", "rm", "once"]);
}

#[test]
fn times_parse_as_the_engine_writes_them() {
    assert_eq!(chrono_ms("1970-01-01T00:00:01.5Z"), Some(1500));
    assert_eq!(chrono_ms("2016-06-07T21:07:31.171892745Z"), Some(1_465_333_651_171));
    assert_eq!(chrono_ms("2000-03-01T00:00:00Z"), Some(951_868_800_000));
}

#[test]
fn a_job_runs_to_completion_on_the_docker_executor() {
    use shoal_testkit::docker_engine::{self, EngineDaemon};
    let Some(image) = docker_engine::test_image_or_skip() else { return };
    let d = EngineDaemon::start(&shoal_bin());
    let out = docker_returns(
        &d,
        &[
            "service",
            "create",
            "--name",
            "djob",
            "--mode",
            "replicated-job",
            "--replicas",
            "3",
            "--max-concurrent",
            "2",
            image,
            "sh",
            "-c",
            "sleep 0.2",
        ],
    );
    assert!(out.contains("job complete"), "{out}");
    let tasks = tasks_of(&d, "djob");
    assert_eq!(tasks.len(), 3, "{tasks:?}");
    assert!(tasks.iter().all(|t| state(t) == "complete"), "{tasks:?}");
    let running = docker_engine::running_with_label(d.node_id(), "com.docker.swarm.service.name", "djob");
    assert!(running.is_empty(), "no container of the job still runs: {running:?}");
    assert!(most_at_once(&tasks.iter().collect::<Vec<_>>()) <= 2, "{tasks:?}");
    docker(&d, &["service", "rm", "djob"]);
}
