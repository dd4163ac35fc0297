//! `docker service create` and `docker service update` without `--detach`: the stock CLI follows the
//! service's convergence (service inspect, tasks with the `_up-to-date` filter, the node list) and must end
//! with `verify: Service <id> converged` for replicated and global services, and `job complete` for jobs.
//! The CLI's output is not a terminal here, so it prints its overall-progress and verify lines (the per-task
//! bars are drawn only on a terminal); each command runs under a deadline, so a progress that never ends fails.

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use common::*;

/// Runs the docker CLI until it exits (at most `limit`), asserting success; returns what it printed.
fn docker_until_done(d: &DaemonProcess, args: &[&str], limit: Duration) -> String {
    let child = docker_cli::command(d.socket(), args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run docker");
    let (ok, out) = process::wait_exit(child, limit, &format!("docker {args:?}"));
    assert!(ok, "docker {args:?} failed:\n{out}");
    out
}

fn check_lines(out: &str, wanted: &[&str], what: &str) {
    let lines: Vec<&str> = out.lines().map(str::trim_end).collect();
    for w in wanted {
        assert!(lines.iter().any(|l| l.contains(w)), "{what}: no line with {w:?} in:\n{out}");
    }
}

fn service_id(d: &DaemonProcess, name: &str) -> String {
    d.get(&format!("/v1.47/services/{name}"))["ID"].as_str().expect("service ID").to_string()
}

#[test]
fn create_and_update_without_detach_follow_the_service_until_it_converges() {
    if no_docker_cli() {
        return;
    }
    let d = daemon();
    let limit = Duration::from_secs(90);

    // Replicated: every task of the replicas counted, then the monitor period, then "converged".
    let out = docker_until_done(
        &d,
        &[
            "service",
            "create",
            "--name",
            "web",
            "--replicas",
            "3",
            "--update-monitor",
            "2s",
            "busybox",
            "sleep",
            "3301",
        ],
        limit,
    );
    let web = service_id(&d, "web");
    check_lines(
        &out,
        &[
            "overall progress: 0 out of 3 tasks",
            "overall progress: 3 out of 3 tasks",
            &format!("verify: Service {web} converged"),
        ],
        "replicated create",
    );

    // Update: the new tasks (the `_up-to-date` ones) converge.
    let out = docker_until_done(&d, &["service", "update", "--args", "sleep 3302", "web"], limit);
    check_lines(&out, &["overall progress: 3 out of 3 tasks", "verify: Service web converged"], "replicated update");
    let running = wait_running(&d, "web", 3, &["sleep", "3302"], Duration::from_secs(30));
    assert_eq!(running.len(), 3);

    // Rollback and scale follow the service the same way.
    let out = docker_until_done(&d, &["service", "rollback", "web"], limit);
    check_lines(&out, &["rollback: manually requested rollback", "verify: Service web converged"], "rollback");
    wait_running(&d, "web", 3, &["sleep", "3301"], Duration::from_secs(30));
    let out = docker_until_done(&d, &["service", "scale", "web=4"], limit);
    check_lines(&out, &["overall progress: 4 out of 4 tasks", "verify: Service web converged"], "scale");

    // Global: one task per active node (one node here).
    let out = docker_until_done(
        &d,
        &[
            "service",
            "create",
            "--name",
            "everywhere",
            "--mode",
            "global",
            "--update-monitor",
            "1s",
            "busybox",
            "sleep",
            "3303",
        ],
        limit,
    );
    let everywhere = service_id(&d, "everywhere");
    check_lines(
        &out,
        &["overall progress: 1 out of 1 tasks", &format!("verify: Service {everywhere} converged")],
        "global create",
    );

    // A replicated job returns once its completions are done; no verify period.
    let out = docker_until_done(
        &d,
        &[
            "service",
            "create",
            "--name",
            "batch",
            "--mode",
            "replicated-job",
            "--replicas",
            "3",
            "--max-concurrent",
            "2",
            "busybox",
            "true",
        ],
        limit,
    );
    check_lines(&out, &["active tasks:", "job complete"], "replicated job create");
    assert!(!out.contains("verify:"), "a job is not verified:\n{out}");
    let done = tasks_of(&d, "batch").iter().filter(|t| state(t) == "complete").count();
    assert_eq!(done, 3, "three completions when the CLI returned");
    // `update --force` runs the job again (a new iteration) and returns when it is done.
    let out = docker_until_done(&d, &["service", "update", "--force", "batch"], limit);
    check_lines(&out, &["job complete"], "replicated job run again");
    let done = tasks_of(&d, "batch").iter().filter(|t| state(t) == "complete").count();
    assert_eq!(done, 6, "three more completions when the CLI returned");

    // A global job likewise.
    let out = docker_until_done(
        &d,
        &["service", "create", "--name", "once", "--mode", "global-job", "busybox", "true"],
        limit,
    );
    check_lines(&out, &["job complete"], "global job create");
    let done = tasks_of(&d, "once").iter().filter(|t| state(t) == "complete").count();
    assert_eq!(done, 1, "one completion per node when the CLI returned");
}
