//! A checklist of the stock docker CLI's swarm commands against one Shoal node: each command must succeed
//! and print (or change) what a swarm user expects. One test walks the list in order, so a failure names
//! the first command that broke.

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::Value;

fn inspect(d: &DaemonProcess, what: &[&str]) -> Value {
    let out = docker(d, what);
    let v: Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("docker {what:?} printed no JSON ({e}): {out}"));
    v[0].clone()
}

fn running_count(d: &DaemonProcess, service: &str) -> usize {
    tasks_of(d, service).iter().filter(|t| state(t) == "running" && desired(t) == "running").count()
}

fn wait_running_count(d: &DaemonProcess, service: &str, n: usize) {
    wait_until(&format!("{n} running tasks of {service}"), Duration::from_secs(30), || {
        let c = running_count(d, service);
        if c == n {
            Ok(())
        } else {
            Err(format!("{c} running"))
        }
    });
}

#[test]
fn the_docker_cli_swarm_checklist() {
    if no_docker_cli() {
        return;
    }
    let d = daemon();

    // version, info
    let v = docker(&d, &["version", "--format", "{{.Server.Version}} {{.Server.APIVersion}}"]);
    assert!(v.contains("1.47"), "docker version: {v}");
    let info: Value = serde_json::from_str(&docker(&d, &["info", "--format", "{{json .}}"])).expect("info JSON");
    assert_eq!(info["Swarm"]["LocalNodeState"], "active", "{info}");
    assert_eq!(info["Swarm"]["ControlAvailable"], true);
    assert_eq!(info["Swarm"]["Nodes"], 1);
    assert_eq!(info["Swarm"]["Managers"], 1);
    let node_id = info["Swarm"]["NodeID"].as_str().expect("NodeID").to_string();
    let text = docker(&d, &["info"]);
    assert!(text.contains("Swarm: active") && text.contains("Is Manager: true"), "docker info: {text}");

    // service create with common flags
    docker(
        &d,
        &[
            "service",
            "create",
            "--detach",
            "--name",
            "web",
            "--replicas",
            "2",
            "--env",
            "A=1",
            "--label",
            "team=blue",
            "--reserve-memory",
            "1M",
            "--restart-condition",
            "on-failure",
            "--restart-max-attempts",
            "3",
            "--constraint",
            "node.role==manager",
            "busybox",
            "sleep",
            "1000",
        ],
    );
    wait_running_count(&d, "web", 2);
    let ls = docker(&d, &["service", "ls"]);
    assert!(ls.lines().any(|l| l.contains("web") && l.contains("2/2")), "service ls: {ls}");
    let ps = docker(&d, &["service", "ps", "web"]);
    assert_eq!(ps.lines().filter(|l| l.contains("Running")).count(), 2, "service ps: {ps}");
    let s = inspect(&d, &["service", "inspect", "web"]);
    let tt = &s["Spec"]["TaskTemplate"];
    assert_eq!(tt["ContainerSpec"]["Env"], serde_json::json!(["A=1"]));
    assert_eq!(s["Spec"]["Labels"]["team"], "blue");
    // Limits are the docker executor's: this node runs processes, so a service with limits is stored as
    // given and its task is rejected naming them (never run without them).
    docker(
        &d,
        &[
            "service",
            "create",
            "--detach",
            "--name",
            "lim",
            "--limit-cpu",
            "0.5",
            "--limit-memory",
            "64M",
            "busybox",
            "sleep",
            "3012",
        ],
    );
    let lim = inspect(&d, &["service", "inspect", "lim"]);
    assert_eq!(lim["Spec"]["TaskTemplate"]["Resources"]["Limits"]["NanoCPUs"], 500_000_000);
    assert_eq!(lim["Spec"]["TaskTemplate"]["Resources"]["Limits"]["MemoryBytes"], 64 << 20);
    wait_until("the limited task is rejected", Duration::from_secs(30), || {
        let ps = docker(&d, &["service", "ps", "--no-trunc", "lim"]);
        if ps.contains("Rejected") && ps.contains("Resources.Limits.NanoCPUs") {
            Ok(())
        } else {
            Err(ps)
        }
    });
    docker(&d, &["service", "rm", "lim"]);
    assert_eq!(tt["RestartPolicy"]["Condition"], "on-failure");
    assert_eq!(tt["RestartPolicy"]["MaxAttempts"], 3);
    assert_eq!(tt["Placement"]["Constraints"], serde_json::json!(["node.role==manager"]));
    let pretty = docker(&d, &["service", "inspect", "--pretty", "web"]);
    assert!(pretty.contains("Name:") && pretty.contains("web") && pretty.contains("Replicas:"), "{pretty}");

    // service update with common flags
    docker(
        &d,
        &[
            "service",
            "update",
            "--detach",
            "--env-add",
            "B=2",
            "--args",
            "sleep 999",
            "--replicas",
            "3",
            "--constraint-add",
            "node.hostname==shoal-test-node",
            "--reserve-cpu",
            "0.1",
            "--restart-condition",
            "any",
            "--label-add",
            "tier=web",
            "web",
        ],
    );
    let s = inspect(&d, &["service", "inspect", "web"]);
    let tt = &s["Spec"]["TaskTemplate"];
    let mut env: Vec<&str> =
        tt["ContainerSpec"]["Env"].as_array().expect("Env").iter().filter_map(Value::as_str).collect();
    env.sort();
    assert_eq!(env, ["A=1", "B=2"]);
    assert_eq!(tt["ContainerSpec"]["Args"], serde_json::json!(["sleep", "999"]));
    assert_eq!(s["Spec"]["Mode"]["Replicated"]["Replicas"], 3);
    assert_eq!(tt["Resources"]["Reservations"]["NanoCPUs"], 100_000_000);
    assert_eq!(tt["RestartPolicy"]["Condition"], "any");
    assert_eq!(s["Spec"]["Labels"]["tier"], "web");
    assert_eq!(tt["Placement"]["Constraints"].as_array().map(Vec::len), Some(2));
    wait_until("the update converges on sleep 999", Duration::from_secs(60), || {
        let n = process::pids_with_cmdline(&["sleep", "999"]).len();
        if n == 3 && running_count(&d, "web") == 3 {
            Ok(())
        } else {
            Err(format!("{n} sleep 999 processes"))
        }
    });

    // scale
    docker(&d, &["service", "scale", "--detach", "web=1"]);
    wait_running_count(&d, "web", 1);

    // rollback: back to the spec before the last update (scale was an update too: replicas 3)
    docker(&d, &["service", "rollback", "--detach", "web"]);
    let s = inspect(&d, &["service", "inspect", "web"]);
    assert_eq!(s["Spec"]["Mode"]["Replicated"]["Replicas"], 3, "rollback restores the previous spec");
    wait_running_count(&d, "web", 3);

    // logs
    docker(&d, &["service", "logs", "web"]);

    // node ls / inspect / ps / update
    let nodes = docker(&d, &["node", "ls"]);
    assert!(nodes.contains("shoal-test-node") && nodes.contains("Leader"), "node ls: {nodes}");
    let n = inspect(&d, &["node", "inspect", "self"]);
    assert_eq!(n["ID"], node_id.as_str());
    let nps = docker(&d, &["node", "ps", "self"]);
    assert!(nps.lines().filter(|l| l.contains("web.") && l.contains("Running")).count() >= 3, "node ps: {nps}");
    docker(&d, &["node", "update", "--label-add", "zone=a", &node_id]);
    let n = inspect(&d, &["node", "inspect", "self"]);
    assert_eq!(n["Spec"]["Labels"]["zone"], "a");

    // swarm update: task history limit and certificate expiry
    docker(&d, &["swarm", "update", "--task-history-limit", "3", "--cert-expiry", "48h"]);
    let sw: Value = serde_json::from_str(&serde_json::to_string(&d.get("/v1.47/swarm")).unwrap()).unwrap();
    assert_eq!(sw["Spec"]["Orchestration"]["TaskHistoryRetentionLimit"], 3, "{sw}");
    assert_eq!(sw["Spec"]["CAConfig"]["NodeCertExpiry"], 48 * 3600 * 1_000_000_000_i64, "{sw}");

    // rm
    docker(&d, &["service", "rm", "web"]);
    wait_until("no task process left", Duration::from_secs(30), || {
        let n = process::pids_with_cmdline(&["sleep", "999"]).len();
        if n == 0 {
            Ok(())
        } else {
            Err(format!("{n} left"))
        }
    });
    let ls = docker(&d, &["service", "ls", "-q"]);
    assert!(ls.trim().is_empty(), "service ls after rm: {ls}");
}
