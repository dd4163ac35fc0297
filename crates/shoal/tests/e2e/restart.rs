//! The daemon keeps its state across restarts: a clean stop (SIGTERM) and a crash (kill -9) both come back
//! with the same cluster, nodes and services, same IDs and versions, and tasks converge again.

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::Value;

fn create(d: &DaemonProcess, name: &str, replicas: u64, argv: &[&str]) -> String {
    let body = serde_json::json!({
        "Name": name,
        "TaskTemplate": {"ContainerSpec": {"Image": "busybox", "Args": argv},
            "RestartPolicy": {"Delay": 100_000_000u64}},
        "Mode": {"Replicated": {"Replicas": replicas}},
    });
    let r =
        shoal_testkit::http::request(d.socket(), "POST", "/v1.47/services/create", Some(&body.to_string())).unwrap();
    assert_eq!(r.status, 201, "create: {}", r.body);
    r.body["ID"].as_str().unwrap().to_string()
}

fn ids_and_versions(v: &Value) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|o| (o["ID"].as_str().unwrap().to_string(), o["Version"]["Index"].as_u64().unwrap()))
        .collect();
    out.sort();
    out
}

#[test]
fn sigterm_and_restart_keeps_ids_versions_and_converges() {
    let mut d = daemon();
    let swarm_before = d.get("/v1.47/swarm");
    let id = create(&d, "web", 2, &["sleep", "3151"]);
    wait_running(&d, "web", 2, &["sleep", "3151"], Duration::from_secs(20));
    let services_before = ids_and_versions(&d.get("/v1.47/services"));
    let nodes_before: Vec<String> = ids_and_versions(&d.get("/v1.47/nodes")).into_iter().map(|(id, _)| id).collect();

    assert!(d.stop(), "daemon exits 0 on SIGTERM; log:\n{}", d.log());
    assert!(process::pids_with_cmdline(&["sleep", "3151"]).is_empty(), "task processes stop with the daemon");

    d.restart(&[]);
    let swarm_after = d.get("/v1.47/swarm");
    assert_eq!(swarm_after["ID"], swarm_before["ID"]);
    assert_eq!(swarm_after["CreatedAt"], swarm_before["CreatedAt"]);
    assert_eq!(ids_and_versions(&d.get("/v1.47/services")), services_before);
    let nodes_after: Vec<String> = ids_and_versions(&d.get("/v1.47/nodes")).into_iter().map(|(id, _)| id).collect();
    assert_eq!(nodes_after, nodes_before);
    let svc = d.get(&format!("/v1.47/services/{id}"));
    assert_eq!(svc["Spec"]["Name"], "web");
    wait_running(&d, "web", 2, &["sleep", "3151"], Duration::from_secs(30));
}

#[test]
fn kill9_right_after_create_keeps_the_service() {
    let mut d = daemon();
    let id = create(&d, "crashy", 1, &["sleep", "3152"]);
    d.kill9();
    d.restart(&[]);
    let svc = d.get(&format!("/v1.47/services/{id}"));
    assert_eq!(svc["Spec"]["Name"], "crashy");
    wait_running(&d, "crashy", 1, &["sleep", "3152"], Duration::from_secs(30));
}
