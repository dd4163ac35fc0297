//! Global services driven by the stock docker CLI on real daemons (1 manager + workers on 127.0.0.10x,
//! process executor, so every task is a real `sleep` process counted with `pids_with_cmdline`): one task per
//! node; a joining node gets one, a drained node loses it; a label constraint leaves out the unlabelled
//! node and removing the label stops that node's task; `service update --args` rolls every node's task;
//! `service rm` stops them all. `service ls` shows `global` and `N/M`, `service ps` one task per node.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(60);

/// Hostnames of the nodes the service's running tasks are on.
fn hosts_of(m: &DaemonProcess, tasks: &[Value]) -> BTreeSet<String> {
    let nodes = m.get("/v1.47/nodes");
    let host = |id: &str| -> String {
        nodes
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["ID"] == id)
            .map(|n| n["Description"]["Hostname"].as_str().unwrap_or("").to_string())
            .unwrap_or_else(|| format!("unknown node {id}"))
    };
    tasks.iter().map(|t| host(t["NodeID"].as_str().unwrap_or(""))).collect()
}

fn set(hosts: &[&str]) -> BTreeSet<String> {
    hosts.iter().map(|h| h.to_string()).collect()
}

/// Waits until `docker node ls` shows every host Ready.
fn wait_ready(m: &DaemonProcess, hosts: &[&str]) {
    wait_until("every node ready", DEADLINE, || {
        let ls = docker(m, &["node", "ls", "--format", "{{.Hostname}} {{.Status}}"]);
        if hosts.iter().all(|h| ls.lines().any(|l| l == format!("{h} Ready"))) {
            Ok(())
        } else {
            Err(ls)
        }
    });
}

/// The `service ls` row of `name` as "MODE REPLICAS".
fn ls_row(m: &DaemonProcess, name: &str) -> String {
    let ls = docker(m, &["service", "ls", "--filter", &format!("name={name}"), "--format", "{{.Mode}} {{.Replicas}}"]);
    ls.trim().to_string()
}

#[test]
fn a_global_service_runs_one_task_per_eligible_node() {
    if no_docker_cli() {
        return;
    }
    let v1 = ["sleep", "5151"];
    let m = node_at(101, "gm-101", None);
    let _w2 = node_at(102, "gw-102", Some((&m, "Worker")));
    let _w3 = node_at(103, "gw-103", Some((&m, "Worker")));
    wait_ready(&m, &["gm-101", "gw-102", "gw-103"]);

    // Three nodes, three tasks, one on each.
    docker(&m, &["service", "create", "--detach", "--name", "gsvc", "--mode", "global", "busybox", "sleep", "5151"]);
    let running = wait_running(&m, "gsvc", 3, &v1, DEADLINE);
    assert_eq!(hosts_of(&m, &running), set(&["gm-101", "gw-102", "gw-103"]));
    wait_until("service ls shows global 3/3", DEADLINE, || match ls_row(&m, "gsvc").as_str() {
        "global 3/3" => Ok(()),
        other => Err(other.to_string()),
    });
    let ps = docker(
        &m,
        &["service", "ps", "gsvc", "--filter", "desired-state=running", "--format", "{{.Node}} {{.CurrentState}}"],
    );
    let rows: BTreeSet<String> = ps.lines().map(|l| l.split_whitespace().next().unwrap_or("").to_string()).collect();
    assert_eq!(rows, set(&["gm-101", "gw-102", "gw-103"]), "service ps:\n{ps}");
    assert!(ps.lines().all(|l| l.contains("Running")), "service ps:\n{ps}");

    // A fourth node joins: four tasks.
    let _w4 = node_at(104, "gw-104", Some((&m, "Worker")));
    let running = wait_running(&m, "gsvc", 4, &v1, DEADLINE);
    assert_eq!(hosts_of(&m, &running), set(&["gm-101", "gw-102", "gw-103", "gw-104"]));

    // Drained: its task stops and is not replaced elsewhere.
    docker(&m, &["node", "update", "--availability", "drain", "gw-104"]);
    let running = wait_running(&m, "gsvc", 3, &v1, DEADLINE);
    assert_eq!(hosts_of(&m, &running), set(&["gm-101", "gw-102", "gw-103"]));
    wait_until("service ls shows global 3/3", DEADLINE, || match ls_row(&m, "gsvc").as_str() {
        "global 3/3" => Ok(()),
        other => Err(other.to_string()),
    });

    // A label constraint: only the labelled nodes; removing a label stops that node's task.
    docker(&m, &["node", "update", "--label-add", "zone=a", "gm-101"]);
    docker(&m, &["node", "update", "--label-add", "zone=a", "gw-102"]);
    let zoned = ["sleep", "5153"];
    docker(
        &m,
        &[
            "service",
            "create",
            "--detach",
            "--name",
            "gzone",
            "--mode",
            "global",
            "--constraint",
            "node.labels.zone==a",
            "busybox",
            "sleep",
            "5153",
        ],
    );
    let running = wait_running(&m, "gzone", 2, &zoned, DEADLINE);
    assert_eq!(hosts_of(&m, &running), set(&["gm-101", "gw-102"]));
    docker(&m, &["node", "update", "--label-rm", "zone", "gw-102"]);
    let running = wait_running(&m, "gzone", 1, &zoned, DEADLINE);
    assert_eq!(hosts_of(&m, &running), set(&["gm-101"]));

    // A rolling update replaces every node's task.
    let v2 = ["sleep", "5152"];
    docker(&m, &["service", "update", "--detach", "--update-parallelism", "1", "--args", "sleep 5152", "gsvc"]);
    let running = wait_running(&m, "gsvc", 3, &v2, DEADLINE);
    assert_eq!(hosts_of(&m, &running), set(&["gm-101", "gw-102", "gw-103"]));
    wait_until("no old task process", DEADLINE, || match process::pids_with_cmdline(&v1).len() {
        0 => Ok(()),
        n => Err(format!("{n} left")),
    });
    wait_until("the update completed", DEADLINE, || {
        let s = m.get("/v1.47/services/gsvc");
        match s["UpdateStatus"]["State"].as_str() {
            Some("completed") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });

    // Removal stops every task.
    docker(&m, &["service", "rm", "gsvc", "gzone"]);
    wait_until("no task process left", DEADLINE, || {
        let n = process::pids_with_cmdline(&v2).len() + process::pids_with_cmdline(&zoned).len();
        if n == 0 {
            Ok(())
        } else {
            Err(format!("{n} left"))
        }
    });
    assert!(service_names(&m).is_empty());
}

#[test]
fn a_service_mode_cannot_change() {
    if no_docker_cli() {
        return;
    }
    let d = daemon();
    docker(&d, &["service", "create", "--detach", "--name", "web", "--replicas", "1", "busybox", "sleep", "5154"]);
    let s = d.get("/v1.47/services/web");
    let mut spec = s["Spec"].clone();
    spec["Mode"] = serde_json::json!({"Global": {}});
    let r = shoal_testkit::http::request(
        d.socket(),
        "POST",
        &format!("/v1.47/services/web/update?version={}", s["Version"]["Index"]),
        Some(&spec.to_string()),
    )
    .unwrap();
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body["message"].as_str().unwrap_or("").contains("service mode change is not allowed"), "{}", r.body);
    docker(&d, &["service", "rm", "web"]);
    wait_until("no sleep 5154 left", DEADLINE, || match process::pids_with_cmdline(&["sleep", "5154"]).len() {
        0 => Ok(()),
        n => Err(format!("{n} left")),
    });
}
