//! The stock docker CLI drives a one-node Shoal cluster: a replicated service's tasks run as real processes,
//! and create, ls, ps, inspect, scale, update, rm and node ls behave as a swarm user expects.

use crate::common;

use std::time::Duration;

use common::*;

#[test]
fn create_runs_three_real_processes_and_the_cli_shows_them() {
    if no_docker_cli() {
        return;
    }
    let d = daemon();
    let out =
        docker(&d, &["service", "create", "--detach", "--name", "web", "--replicas", "3", "busybox", "sleep", "3141"]);
    let id = out.trim().lines().last().unwrap_or("").to_string();
    assert_eq!(id.len(), 25, "create prints the service ID, got {out:?}");
    let running = wait_running(&d, "web", 3, &["sleep", "3141"], Duration::from_secs(20));
    let mut slots: Vec<u64> = running.iter().map(|t| t["Slot"].as_u64().unwrap()).collect();
    slots.sort();
    assert_eq!(slots, [1, 2, 3]);

    let ls = docker(&d, &["service", "ls"]);
    let row = ls.lines().find(|l| l.contains("web")).unwrap_or_else(|| panic!("no web row in:\n{ls}"));
    assert!(row.contains("replicated") && row.contains("3/3") && row.contains("busybox"), "service ls row: {row}");

    let ps = docker(&d, &["service", "ps", "web"]);
    let rows: Vec<&str> = ps.lines().skip(1).collect();
    assert_eq!(rows.len(), 3, "service ps:\n{ps}");
    for r in &rows {
        assert!(r.contains("web.") && r.contains("Running") && r.contains("shoal-test-node"), "service ps row: {r}");
    }

    let inspect = docker(&d, &["service", "inspect", "web"]);
    let v: serde_json::Value = serde_json::from_str(&inspect).expect("inspect prints JSON");
    assert_eq!(v[0]["ID"], id.as_str());
    assert_eq!(v[0]["Spec"]["Name"], "web");
    assert_eq!(v[0]["Spec"]["Mode"]["Replicated"]["Replicas"], 3);
    assert_eq!(v[0]["Spec"]["TaskTemplate"]["ContainerSpec"]["Args"], serde_json::json!(["sleep", "3141"]));

    let nodes = docker(&d, &["node", "ls"]);
    let row = nodes.lines().find(|l| l.contains("shoal-test-node")).unwrap_or_else(|| panic!("node ls:\n{nodes}"));
    assert!(
        row.contains('*') && row.contains("Ready") && row.contains("Active") && row.contains("Leader"),
        "node ls row: {row}"
    );

    docker(&d, &["service", "rm", "web"]);
    wait_until("no sleep 3141 left", Duration::from_secs(20), || {
        let n = process::pids_with_cmdline(&["sleep", "3141"]).len();
        if n == 0 {
            Ok(())
        } else {
            Err(format!("{n} left"))
        }
    });
}

#[test]
fn a_killed_task_is_replaced_and_kept_in_history() {
    if no_docker_cli() {
        return;
    }
    let d = daemon();
    docker(
        &d,
        &[
            "service",
            "create",
            "--detach",
            "--name",
            "web",
            "--replicas",
            "3",
            "--restart-delay",
            "1s",
            "busybox",
            "sleep",
            "3142",
        ],
    );
    wait_running(&d, "web", 3, &["sleep", "3142"], Duration::from_secs(20));
    let victim = process::pids_with_cmdline(&["sleep", "3142"])[0];
    process::kill9(victim);
    let killed_at = std::time::Instant::now();
    // Replacement within the restart delay (1 s) plus a second, with slack for a loaded 2-core machine.
    wait_until("a failed task and 3 running again", Duration::from_secs(10), || {
        let tasks = tasks_of(&d, "web");
        let failed = tasks.iter().filter(|t| state(t) == "failed").count();
        let running = tasks.iter().filter(|t| state(t) == "running" && desired(t) == "running").count();
        let pids = process::pids_with_cmdline(&["sleep", "3142"]).len();
        if failed == 1 && running == 3 && pids == 3 {
            Ok(())
        } else {
            Err(format!("failed {failed}, running {running}, pids {pids}"))
        }
    });
    let took = killed_at.elapsed();
    eprintln!("replacement RUNNING {took:?} after kill -9 (restart delay 1 s)");
    assert!(took < Duration::from_secs(2), "replacement took {took:?}: more than the restart delay plus a second");
    let ps = docker(&d, &["service", "ps", "web"]);
    assert!(ps.lines().any(|l| l.contains("\\_ web.") && l.contains("Failed")), "history row in service ps:\n{ps}");

    // Keep killing: the history of a slot never grows past the retention limit (5 tasks per slot).
    for round in 0..6 {
        let slot1 = i32::try_from(wait_until("slot 1 running", Duration::from_secs(10), || {
            tasks_of(&d, "web")
                .into_iter()
                .find(|t| t["Slot"] == 1 && state(t) == "running" && desired(t) == "running")
                .and_then(|t| t["Status"]["ContainerStatus"]["PID"].as_i64())
                .filter(|pid| *pid > 0)
                .ok_or_else(|| "no running task in slot 1".to_string())
        }))
        .unwrap();
        process::kill9(slot1);
        wait_until(&format!("replacement {round}"), Duration::from_secs(10), || {
            let pids = process::pids_with_cmdline(&["sleep", "3142"]);
            if pids.len() == 3 && !pids.contains(&slot1) {
                Ok(())
            } else {
                Err(format!("{pids:?}"))
            }
        });
    }
    wait_until("at most 5 tasks per slot", Duration::from_secs(10), || {
        let tasks = tasks_of(&d, "web");
        let mut per_slot = std::collections::BTreeMap::new();
        for t in &tasks {
            *per_slot.entry(t["Slot"].as_u64().unwrap()).or_insert(0) += 1;
        }
        let max = per_slot.values().copied().max().unwrap_or(0);
        if max <= 5 && per_slot.get(&1) == Some(&5) {
            Ok(())
        } else {
            Err(format!("per slot {per_slot:?}"))
        }
    });
    docker(&d, &["service", "rm", "web"]);
}

#[test]
fn scale_up_and_down_converges_and_rm_leaves_nothing() {
    if no_docker_cli() {
        return;
    }
    let d = daemon();
    docker(&d, &["service", "create", "--detach", "--name", "web", "--replicas", "1", "busybox", "sleep", "3143"]);
    wait_running(&d, "web", 1, &["sleep", "3143"], Duration::from_secs(20));
    docker(&d, &["service", "scale", "--detach", "web=50"]);
    wait_running(&d, "web", 50, &["sleep", "3143"], Duration::from_secs(60));
    docker(&d, &["service", "scale", "--detach", "web=0"]);
    wait_until("no task running and no process", Duration::from_secs(60), || {
        let running = tasks_of(&d, "web").iter().filter(|t| state(t) == "running").count();
        let pids = process::pids_with_cmdline(&["sleep", "3143"]).len();
        if running == 0 && pids == 0 {
            Ok(())
        } else {
            Err(format!("running {running}, pids {pids}"))
        }
    });
    docker(&d, &["service", "scale", "--detach", "web=4"]);
    wait_running(&d, "web", 4, &["sleep", "3143"], Duration::from_secs(30));
    docker(&d, &["service", "rm", "web"]);
    wait_until("no process and no task left", Duration::from_secs(30), || {
        let pids = process::pids_with_cmdline(&["sleep", "3143"]).len();
        let tasks = tasks_of(&d, "web").len();
        if pids == 0 && tasks == 0 {
            Ok(())
        } else {
            Err(format!("pids {pids}, tasks {tasks}"))
        }
    });
    let ls = docker(&d, &["service", "ls", "-q"]);
    assert!(ls.trim().is_empty(), "service ls after rm: {ls}");
}

#[test]
fn update_args_replaces_every_task() {
    if no_docker_cli() {
        return;
    }
    let d = daemon();
    docker(&d, &["service", "create", "--detach", "--name", "web", "--replicas", "3", "busybox", "sleep", "3144"]);
    wait_running(&d, "web", 3, &["sleep", "3144"], Duration::from_secs(20));
    docker(&d, &["service", "update", "--detach", "--args", "sleep 2718", "web"]);
    wait_running(&d, "web", 3, &["sleep", "2718"], Duration::from_secs(60));
    wait_until("old processes gone", Duration::from_secs(30), || {
        let n = process::pids_with_cmdline(&["sleep", "3144"]).len();
        if n == 0 {
            Ok(())
        } else {
            Err(format!("{n} old left"))
        }
    });
    let v: serde_json::Value = serde_json::from_str(&docker(&d, &["service", "inspect", "web"])).unwrap();
    assert_eq!(v[0]["Spec"]["TaskTemplate"]["ContainerSpec"]["Args"], serde_json::json!(["sleep", "2718"]));
    assert_eq!(v[0]["PreviousSpec"]["TaskTemplate"]["ContainerSpec"]["Args"], serde_json::json!(["sleep", "3144"]));
    docker(&d, &["service", "rm", "web"]);
}

/// A process task's host-mode port is in its status, so `docker service ps` shows it as Docker's does
/// (issue 32: `PortStatus` was empty on both executors).
#[test]
fn service_ps_shows_a_process_tasks_host_mode_port() {
    if no_docker_cli() {
        return;
    }
    let d = daemon();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let publish = format!("mode=host,target={port},published={port}");
    docker(
        &d,
        &["service", "create", "--detach", "--name", "ported", "--publish", &publish, "busybox", "sleep", "3143"],
    );
    let running = wait_running(&d, "ported", 1, &["sleep", "3143"], Duration::from_secs(20));
    let ports = &running[0]["Status"]["PortStatus"]["Ports"];
    assert_eq!(
        ports,
        &serde_json::json!([{"Protocol": "tcp", "TargetPort": port.parse::<u64>().unwrap(),
            "PublishedPort": port.parse::<u64>().unwrap(), "PublishMode": "host"}]),
        "{}",
        running[0]
    );
    let ps = docker(&d, &["service", "ps", "--format", "{{.Ports}}", "ported"]);
    assert!(ps.contains(&format!("*:{port}->{port}/tcp")), "docker service ps shows the port: {ps}");
}

/// Two nodes with one hostname: `docker node inspect <hostname>` says the name is ambiguous, as Docker's
/// does, instead of "not found"; each is still found by its ID (issue 32).
#[test]
fn nodes_sharing_a_hostname_are_ambiguous_by_that_name() {
    if no_docker_cli() {
        return;
    }
    let m = node_at(211, "vm", None);
    let _w = node_at(212, "vm", Some((&m, "Worker")));
    let ids = wait_until("two nodes called vm", Duration::from_secs(30), || {
        let ids = docker(&m, &["node", "ls", "--format", "{{.ID}} {{.Hostname}}"]);
        let ids: Vec<String> =
            ids.lines().filter(|l| l.ends_with(" vm")).map(|l| l[..l.len() - 3].to_string()).collect();
        if ids.len() == 2 {
            Ok(ids)
        } else {
            Err(format!("{ids:?}"))
        }
    });
    let out = docker_cli::run(m.socket(), &["node", "inspect", "vm"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "an ambiguous name is refused");
    assert!(err.contains("node vm is ambiguous (2 matches found)"), "Docker's message: {err}");
    for id in &ids {
        let host = docker(&m, &["node", "inspect", "--format", "{{.Description.Hostname}}", id]);
        assert_eq!(host.trim(), "vm");
    }
}
