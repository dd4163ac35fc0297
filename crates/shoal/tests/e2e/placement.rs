//! Placement preferences driven by the stock docker CLI on real daemons (1 manager + 2 workers on
//! 127.0.0.11x, process executor): `--placement-pref spread=node.labels.zone` spreads tasks over the label's
//! values before nodes, `service inspect` shows the preference as stored, a node attribute (`node.role`) is
//! spread over as a label is, and a descriptor SwarmKit cannot group by is accepted and skipped as there.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(60);

/// Running tasks per zone label value of their node.
fn per_zone(m: &DaemonProcess, tasks: &[Value]) -> BTreeMap<String, usize> {
    let nodes = m.get("/v1.47/nodes");
    let zone = |id: &str| -> String {
        let node = nodes.as_array().unwrap().iter().find(|n| n["ID"] == id);
        node.and_then(|n| n["Spec"]["Labels"]["zone"].as_str()).unwrap_or("").to_string()
    };
    let mut m = BTreeMap::new();
    for t in tasks {
        *m.entry(zone(t["NodeID"].as_str().unwrap_or(""))).or_default() += 1;
    }
    m
}

#[test]
fn spread_preference_balances_zones_before_nodes() {
    if no_docker_cli() {
        return;
    }
    let m = node_at(111, "pm-111", None);
    let _w2 = node_at(112, "pw-112", Some((&m, "Worker")));
    let _w3 = node_at(113, "pw-113", Some((&m, "Worker")));
    wait_until("three nodes ready", DEADLINE, || {
        let ls = docker(&m, &["node", "ls", "--format", "{{.Hostname}} {{.Status}}"]);
        let ready = ls.lines().filter(|l| l.ends_with(" Ready")).count();
        if ready == 3 {
            Ok(())
        } else {
            Err(ls)
        }
    });
    // Zones a, a, b: 4 replicas give 2 in a (one per node) and 2 in b (its one node).
    for (host, zone) in [("pm-111", "a"), ("pw-112", "a"), ("pw-113", "b")] {
        docker(&m, &["node", "update", "--label-add", &format!("zone={zone}"), host]);
    }
    let argv = ["sleep", "6161"];
    docker(
        &m,
        &[
            "service",
            "create",
            "--detach",
            "--name",
            "zoned",
            "--replicas",
            "4",
            "--placement-pref",
            "spread=node.labels.zone",
            "busybox",
            "sleep",
            "6161",
        ],
    );
    let running = wait_running(&m, "zoned", 4, &argv, DEADLINE);
    let expected: BTreeMap<String, usize> = [("a".to_string(), 2), ("b".to_string(), 2)].into();
    assert_eq!(per_zone(&m, &running), expected);

    let prefs =
        docker(&m, &["service", "inspect", "zoned", "--format", "{{json .Spec.TaskTemplate.Placement.Preferences}}"]);
    assert_eq!(prefs.trim(), r#"[{"Spread":{"SpreadDescriptor":"node.labels.zone"}}]"#);

    // Scaling to 6 keeps the zones even: 3 and 3.
    docker(&m, &["service", "scale", "--detach", "zoned=6"]);
    let running = wait_running(&m, "zoned", 6, &argv, DEADLINE);
    let expected: BTreeMap<String, usize> = [("a".to_string(), 3), ("b".to_string(), 3)].into();
    assert_eq!(per_zone(&m, &running), expected);

    // Any descriptor the engine accepts is accepted: a node attribute is spread over as a label is (one
    // manager, two workers: 4 replicas give the manager 2 and each worker 1), one SwarmKit cannot group by
    // is skipped as SwarmKit skips it (issue 32: both were refused).
    let roles = ["--placement-pref", "spread=node.role", "--placement-pref", "spread=node.ip"];
    let args = ["service", "create", "--detach", "--name", "roles", "--replicas", "4"];
    docker(&m, &[&args[..], &roles[..], &["busybox", "sleep", "6162"]].concat());
    wait_running(&m, "roles", 4, &["sleep", "6162"], DEADLINE);
    let expected: BTreeMap<String, usize> =
        [("pm-111".to_string(), 2), ("pw-112".into(), 1), ("pw-113".into(), 1)].into();
    assert_eq!(per_host(&m, "roles"), expected);
    docker(&m, &["service", "rm", "roles"]);

    docker(&m, &["service", "rm", "zoned"]);
    wait_until("the tasks stopped", DEADLINE, || {
        let pids = process::pids_with_cmdline(&argv);
        if pids.is_empty() {
            Ok(())
        } else {
            Err(format!("{} processes", pids.len()))
        }
    });
}

/// Running tasks of `service` per node hostname.
fn per_host(m: &DaemonProcess, service: &str) -> BTreeMap<String, usize> {
    let nodes = m.get("/v1.47/nodes");
    let host = |id: &str| -> String {
        let node = nodes.as_array().unwrap().iter().find(|n| n["ID"] == id);
        node.and_then(|n| n["Description"]["Hostname"].as_str()).unwrap_or("").to_string()
    };
    let mut out = BTreeMap::new();
    for t in tasks_of(m, service).iter().filter(|t| state(t) == "running" && desired(t) == "running") {
        *out.entry(host(t["NodeID"].as_str().unwrap_or(""))).or_default() += 1;
    }
    out
}

#[test]
fn rebalancing_moves_tasks_to_a_node_that_joined_later() {
    if no_docker_cli() {
        return;
    }
    let m = node_at(114, "rm-114", None);
    let _w2 = node_at(115, "rw-115", Some((&m, "Worker")));
    wait_until("two nodes ready", DEADLINE, || {
        let ls = docker(&m, &["node", "ls", "--format", "{{.Hostname}} {{.Status}}"]);
        if ls.lines().filter(|l| l.ends_with(" Ready")).count() == 2 {
            Ok(())
        } else {
            Err(ls)
        }
    });
    let argv = ["sleep", "6262"];
    docker(&m, &["service", "create", "--detach", "--name", "spread6", "--replicas", "6", "busybox", "sleep", "6262"]);
    wait_running(&m, "spread6", 6, &argv, DEADLINE);
    let before: BTreeMap<String, usize> = [("rm-114".to_string(), 3), ("rw-115".to_string(), 3)].into();
    assert_eq!(per_host(&m, "spread6"), before);
    // The same with start-first moves (the replacement runs before the old task stops).
    let argv_sf = ["sleep", "6263"];
    docker(
        &m,
        &[
            "service",
            "create",
            "--detach",
            "--name",
            "spread6sf",
            "--replicas",
            "6",
            "--update-order",
            "start-first",
            "busybox",
            "sleep",
            "6263",
        ],
    );
    wait_running(&m, "spread6sf", 6, &argv_sf, DEADLINE);

    // A third node joins; with rebalancing on (Shoal's CLI; GET /swarm shows it), its tasks spread 2, 2, 2,
    // moved one at a time (the service's update parallelism, 1).
    let _w3 = node_at(116, "rw-116", Some((&m, "Worker")));
    let out = shoal_cli(m.socket(), &["swarm", "update", "--rebalance"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let swarm = m.get("/v1.47/swarm");
    assert_eq!(swarm["Spec"]["Orchestration"]["ShoalRebalance"], true, "{swarm}");
    // The docker CLI's own read-modify-write of the swarm spec keeps the setting.
    docker(&m, &["swarm", "update", "--task-history-limit", "4"]);
    assert_eq!(m.get("/v1.47/swarm")["Spec"]["Orchestration"]["ShoalRebalance"], true);
    let even: BTreeMap<String, usize> =
        [("rm-114".to_string(), 2), ("rw-115".to_string(), 2), ("rw-116".to_string(), 2)].into();
    for (service, argv) in [("spread6", argv), ("spread6sf", argv_sf)] {
        wait_until(&format!("2 tasks of {service} per node"), DEADLINE, || {
            let now = per_host(&m, service);
            if now == even && process::pids_with_cmdline(&argv).len() == 6 {
                Ok(())
            } else {
                Err(format!("{now:?}"))
            }
        });
    }
    assert!(m.log().contains("rebalancing: stopping tasks on the fullest nodes"));

    docker(&m, &["service", "rm", "spread6", "spread6sf"]);
    wait_until("the tasks stopped", DEADLINE, || {
        let pids = process::pids_with_cmdline(&argv).len() + process::pids_with_cmdline(&argv_sf).len();
        if pids == 0 {
            Ok(())
        } else {
            Err(format!("{pids} processes"))
        }
    });
}

/// `--constraint node.id==<ID>` (the ID the CA put in the node's certificate, not something the node reports)
/// places every task on that node; an ID no node has leaves the tasks pending, saying why (docs/security.md).
#[test]
fn a_node_id_constraint_places_tasks_on_that_node_only() {
    if no_docker_cli() {
        return;
    }
    let m = node_at(124, "pm-124", None);
    let _w = node_at(125, "pw-125", Some((&m, "Worker")));
    wait_until("two nodes ready", DEADLINE, || {
        let ls = docker(&m, &["node", "ls", "--format", "{{.Hostname}} {{.Status}}"]);
        if ls.lines().filter(|l| l.ends_with(" Ready")).count() == 2 {
            Ok(())
        } else {
            Err(ls)
        }
    });
    let worker_id = docker(&m, &["node", "inspect", "--format", "{{.ID}}", "pw-125"]).trim().to_string();
    let argv = ["sleep", "6262"];
    let constraint = format!("node.id=={worker_id}");
    docker(
        &m,
        &["service", "create", "--detach", "--name", "pinned", "--replicas", "3", "--constraint", &constraint]
            .into_iter()
            .chain(["busybox", "sleep", "6262"])
            .collect::<Vec<_>>(),
    );
    let running = wait_running(&m, "pinned", 3, &argv, DEADLINE);
    assert!(running.iter().all(|t| t["NodeID"] == worker_id.as_str()), "{running:?}");
    docker(
        &m,
        &["service", "create", "--detach", "--name", "nowhere", "--constraint", "node.id==no-such-node", "busybox"]
            .into_iter()
            .chain(["sleep", "6263"])
            .collect::<Vec<_>>(),
    );
    wait_until("the unplaceable task is pending with the reason", DEADLINE, || {
        let tasks = tasks_of(&m, "nowhere");
        let t = tasks.first().ok_or("no task yet")?;
        let err = t["Status"]["Err"].as_str().unwrap_or_default();
        if state(t) == "pending" && err.contains("constraint") {
            Ok(())
        } else {
            Err(format!("{} {err}", state(t)))
        }
    });
    docker(&m, &["service", "rm", "pinned", "nowhere"]);
    wait_until("the tasks stopped", DEADLINE, || {
        let pids = process::pids_with_cmdline(&argv);
        if pids.is_empty() {
            Ok(())
        } else {
            Err(format!("{} processes", pids.len()))
        }
    });
}
