//! Service updates and rollbacks driven by the stock docker CLI on real daemons (process executor, so every
//! task is a real process counted with `pids_with_cmdline`):
//!
//! - `service update --label-add` without `--detach` returns promptly and replaces no task (a label does
//!   not reach tasks: they stay up to date);
//! - `--force` replaces every task of an unchanged spec;
//! - `--update-order start-first` starts each new task before its old one stops;
//! - an update whose new tasks exit 1 at once, with `--update-failure-action rollback`, ends in
//!   `rollback_completed` with the old spec's tasks running; with `pause`, the update pauses, `service
//!   update` without `--detach` and `service inspect` say why, and `docker service rollback` brings the old
//!   spec back;
//! - the constraint enforcer: 1 manager + 1 worker; a service constrained to `node.labels.x==1` runs on the
//!   worker; moving the label to the manager moves the task there within seconds, and `service ps` shows
//!   why the old one ended.

use crate::common;

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(60);

fn inspect(d: &DaemonProcess, service: &str, format: &str) -> String {
    docker(d, &["service", "inspect", "--format", format, service]).trim().to_string()
}

/// Waits until `docker service inspect` shows the service's update state `want`; returns its message.
fn wait_update_state(d: &DaemonProcess, service: &str, want: &str) -> String {
    wait_until(&format!("{service}'s UpdateStatus.State {want}"), DEADLINE, || {
        let state = inspect(d, service, "{{if .UpdateStatus}}{{.UpdateStatus.State}}{{end}}");
        if state == want {
            Ok(inspect(d, service, "{{.UpdateStatus.Message}}"))
        } else {
            Err(format!("{state:?}: {}", inspect(d, service, "{{if .UpdateStatus}}{{.UpdateStatus.Message}}{{end}}")))
        }
    })
}

fn task_ids(tasks: &[Value]) -> BTreeSet<String> {
    tasks.iter().map(|t| t["ID"].as_str().unwrap_or("").to_string()).collect()
}

fn args_of(t: &Value) -> Vec<String> {
    t["Spec"]["ContainerSpec"]["Args"]
        .as_array()
        .map(|a| a.iter().map(|s| s.as_str().unwrap_or("").to_string()).collect())
        .unwrap_or_default()
}

/// An RFC 3339 time as a string that sorts in time order (the fraction padded to 9 digits).
fn sortable_time(t: &str) -> String {
    let t = t.trim_end_matches('Z');
    let (secs, frac) = t.split_once('.').unwrap_or((t, ""));
    format!("{secs}.{frac:0<9}")
}

/// Runs the docker CLI, failing the test if it has not returned within `deadline` (it is killed then).
fn docker_within(d: &DaemonProcess, args: &[&str], deadline: Duration) -> (String, Duration) {
    let start = Instant::now();
    let mut child = docker_cli::command(d.socket(), args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run docker");
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for docker") {
            break status;
        }
        if start.elapsed() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("collect docker output");
            panic!(
                "`docker {}` did not return within {deadline:?}; stdout:\n{}\nstderr:\n{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().expect("collect docker output");
    assert!(status.success(), "`docker {}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    (String::from_utf8_lossy(&out.stdout).into_owned(), start.elapsed())
}

fn no_processes(argv: &[&str]) {
    wait_until(&format!("no `{}` process", argv.join(" ")), DEADLINE, || {
        match process::pids_with_cmdline(argv).len() {
            0 => Ok(()),
            n => Err(format!("{n} left")),
        }
    });
}

#[test]
fn updates_roll_back_pause_force_and_start_first_through_the_docker_cli() {
    if no_docker_cli() {
        return;
    }
    let d = daemon();

    // A label: the CLI follows the update to its end and returns; no task was replaced.
    let v1 = ["sleep", "7101"];
    docker(
        &d,
        &[
            "service",
            "create",
            "--detach",
            "--name",
            "lbl",
            "--replicas",
            "2",
            "--update-monitor",
            "1s",
            "busybox",
            "sleep",
            "7101",
        ],
    );
    let before = task_ids(&wait_running(&d, "lbl", 2, &v1, DEADLINE));
    let (_, took) = docker_within(&d, &["service", "update", "--label-add", "x=y", "lbl"], Duration::from_secs(30));
    eprintln!("service update --label-add returned after {took:?}");
    assert_eq!(inspect(&d, "lbl", "{{index .Spec.Labels \"x\"}}"), "y");
    assert_eq!(task_ids(&tasks_of(&d, "lbl")), before, "no task was replaced");

    // --force: every task is replaced, with the same spec.
    docker(&d, &["service", "update", "--detach", "--force", "--update-parallelism", "0", "lbl"]);
    wait_until("every task replaced", DEADLINE, || {
        let running: Vec<Value> =
            tasks_of(&d, "lbl").into_iter().filter(|t| state(t) == "running" && desired(t) == "running").collect();
        let ids = task_ids(&running);
        if running.len() == 2 && ids.is_disjoint(&before) && process::pids_with_cmdline(&v1).len() == 2 {
            Ok(())
        } else {
            Err(format!("running {ids:?}"))
        }
    });
    wait_update_state(&d, "lbl", "completed");

    // start-first: the new task is created before the old one stops.
    let (a, b) = (["sleep", "7102"], ["sleep", "7103"]);
    docker(
        &d,
        &["service", "create", "--detach", "--name", "sf", "--update-monitor", "1s", "busybox", "sleep", "7102"],
    );
    wait_running(&d, "sf", 1, &a, DEADLINE);
    docker(&d, &["service", "update", "--detach", "--update-order", "start-first", "--args", "sleep 7103", "sf"]);
    wait_running(&d, "sf", 1, &b, DEADLINE);
    no_processes(&a);
    let message = wait_update_state(&d, "sf", "completed");
    assert_eq!(message, "update completed");
    let tasks = tasks_of(&d, "sf");
    let old = tasks.iter().find(|t| args_of(t) == ["sleep", "7102"]).expect("the old task is kept as history");
    let new = tasks.iter().find(|t| args_of(t) == ["sleep", "7103"]).expect("the new task");
    assert_eq!(state(old), "shutdown");
    let (created, stopped) = (new["CreatedAt"].as_str().unwrap(), old["Status"]["Timestamp"].as_str().unwrap());
    assert!(
        sortable_time(created) < sortable_time(stopped),
        "start-first: new task created {created}, old stopped {stopped}"
    );

    // A failing update with --update-failure-action rollback: rolled back, the old tasks run.
    let ok = ["sleep", "7104"];
    docker(
        &d,
        &[
            "service",
            "create",
            "--detach",
            "--name",
            "rb",
            "--replicas",
            "2",
            "--restart-delay",
            "100ms",
            "busybox",
            "sleep",
            "7104",
        ],
    );
    let original = task_ids(&wait_running(&d, "rb", 2, &ok, DEADLINE));
    docker(
        &d,
        &[
            "service",
            "update",
            "--detach",
            "--update-failure-action",
            "rollback",
            // Long enough that the failing slot is always seen failing inside it, however loaded the machine
            // (the failure is seen at once; the window only holds the next slot back).
            "--update-monitor",
            "30s",
            // The next slot waits this long after the first slot's new task started, so the failure (at once)
            // is always seen before a second slot is replaced, however loaded the machine (with no delay the
            // next slot starts as soon as the new task is RUNNING, before its exit is reported).
            "--update-delay",
            "30s",
            "--rollback-parallelism",
            "0",
            "--rollback-monitor",
            "1s",
            "--args",
            "false",
            "rb",
        ],
    );
    wait_update_state(&d, "rb", "rollback_started");
    let message = wait_update_state(&d, "rb", "rollback_completed");
    assert_eq!(message, "rollback completed");
    assert_eq!(inspect(&d, "rb", "{{json .Spec.TaskTemplate.ContainerSpec.Args}}"), r#"["sleep","7104"]"#);
    let running = wait_running(&d, "rb", 2, &ok, DEADLINE);
    assert!(running.iter().all(|t| args_of(t) == ok), "the old spec's tasks run");
    assert_eq!(
        task_ids(&running).intersection(&original).count(),
        1,
        "stop-first replaced one slot, then rolled it back"
    );
    let failed = tasks_of(&d, "rb").into_iter().filter(|t| args_of(t) == ["false"] && state(t) == "failed").count();
    assert!(failed >= 1, "the new task failed");

    // With pause: the update pauses and says why; `docker service rollback` restores the old spec.
    let p = ["sleep", "7105"];
    docker(
        &d,
        &[
            "service",
            "create",
            "--detach",
            "--name",
            "pz",
            "--replicas",
            "2",
            "--restart-delay",
            "100ms",
            "--rollback-monitor",
            "1s",
            "busybox",
            "sleep",
            "7105",
        ],
    );
    wait_running(&d, "pz", 2, &p, DEADLINE);
    // Without --detach, the CLI follows the update and stops with the pause's message.
    let out = docker_cli::run(
        d.socket(),
        &["service", "update", "--update-failure-action", "pause", "--args", "false", "pz"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a paused update fails the CLI's update");
    assert!(
        stderr.contains("service update paused: update paused due to failure or early termination of task"),
        "{stderr}"
    );
    let message = wait_update_state(&d, "pz", "paused");
    assert!(message.starts_with("update paused due to failure or early termination of task "), "{message}");
    assert_eq!(process::pids_with_cmdline(&p).len(), 1, "the second slot was not updated");
    docker(&d, &["service", "rollback", "--detach", "pz"]);
    let message = wait_update_state(&d, "pz", "rollback_completed");
    assert_eq!(message, "rollback completed");
    wait_running(&d, "pz", 2, &p, DEADLINE);
    assert_eq!(inspect(&d, "pz", "{{json .Spec.TaskTemplate.ContainerSpec.Args}}"), r#"["sleep","7105"]"#);
    assert_eq!(inspect(&d, "pz", "{{json .PreviousSpec.TaskTemplate.ContainerSpec.Args}}"), r#"["false"]"#);

    docker(&d, &["service", "rm", "lbl", "sf", "rb", "pz"]);
    for argv in [&v1, &b, &ok, &p] {
        no_processes(argv);
    }
}

#[test]
fn a_task_whose_node_stops_fitting_moves_within_seconds() {
    if no_docker_cli() {
        return;
    }
    let m = node_at(171, "um-171", None);
    let _w = node_at(172, "uw-172", Some((&m, "Worker")));
    wait_until("both nodes ready", DEADLINE, || {
        let ls = docker(&m, &["node", "ls", "--format", "{{.Hostname}} {{.Status}}"]);
        if ls.contains("um-171 Ready") && ls.contains("uw-172 Ready") {
            Ok(())
        } else {
            Err(ls)
        }
    });
    let host = |t: &Value| -> String {
        let id = t["NodeID"].as_str().unwrap_or("");
        m.get(&format!("/v1.47/nodes/{id}"))["Description"]["Hostname"].as_str().unwrap_or("").to_string()
    };
    let argv = ["sleep", "7111"];
    docker(&m, &["node", "update", "--label-add", "x=1", "uw-172"]);
    docker(
        &m,
        &[
            "service",
            "create",
            "--detach",
            "--name",
            "pinned",
            "--constraint",
            "node.labels.x==1",
            "busybox",
            "sleep",
            "7111",
        ],
    );
    let running = wait_running(&m, "pinned", 1, &argv, DEADLINE);
    assert_eq!(host(&running[0]), "uw-172");
    let first = running[0]["ID"].as_str().unwrap().to_string();

    // The label moves to the manager: the task follows within seconds (the restart delay is 5 s).
    docker(&m, &["node", "update", "--label-add", "x=1", "um-171"]);
    docker(&m, &["node", "update", "--label-rm", "x", "uw-172"]);
    let start = Instant::now();
    let running = wait_running(&m, "pinned", 1, &argv, Duration::from_secs(20));
    eprintln!("the task moved after {:?}", start.elapsed());
    assert_eq!(host(&running[0]), "um-171");
    let ps =
        docker(&m, &["service", "ps", "--no-trunc", "--format", "{{.ID}} {{.CurrentState}} | {{.Error}}", "pinned"]);
    let line = ps.lines().find(|l| l.starts_with(&first)).unwrap_or_else(|| panic!("no row for {first}:\n{ps}"));
    assert!(line.contains("Rejected") && line.contains("assigned node no longer meets constraints"), "{ps}");

    docker(&m, &["service", "rm", "pinned"]);
    no_processes(&argv);
}
