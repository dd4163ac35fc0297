//! Starting the daemons of a multi-manager cluster on 127.0.0.x and looking at it through their Engine APIs:
//! joining with a role's token, creating services through any manager, manager statuses as one manager sees
//! them, the leader, and whether every manager's store holds the same objects. Shared by the multi-manager
//! and fault tests.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::{wait_until, DaemonOptions, DaemonProcess};

/// The join token `d`'s cluster hands out for `role` ("Manager" or "Worker").
pub fn join_token(d: &DaemonProcess, role: &str) -> String {
    d.get("/v1.47/swarm")["JoinTokens"][role].as_str().unwrap_or_else(|| panic!("no {role} join token")).to_string()
}

/// Starts `binary`'s daemon listening on 127.0.0.`i` with hostname `hostname`. With `join = Some((d, role))`
/// it joins `d`'s cluster (`--join-addr`) with `d`'s join token for `role` ("Manager" or "Worker"); without,
/// it bootstraps a new cluster.
pub fn start_node(binary: &Path, i: u8, hostname: &str, join: Option<(&DaemonProcess, &str)>) -> DaemonProcess {
    let mut opts = DaemonOptions {
        listen_ip: Some(format!("127.0.0.{i}")),
        hostname: Some(hostname.to_string()),
        ..DaemonOptions::default()
    };
    if let Some((d, role)) = join {
        opts.extra_args = vec!["--join-addr".into(), d.remote_addr(), "--join-token".into(), join_token(d, role)];
    }
    DaemonProcess::start_with(binary, opts)
}

/// POST `spec` to `d`'s `/services/create`: the new service's ID, else the status and body as the error
/// (e.g. a 503 while no leader is elected or quorum is lost).
pub fn post_service(d: &DaemonProcess, spec: &Value) -> Result<String, String> {
    let r = crate::http::request(d.socket(), "POST", "/v1.47/services/create", Some(&spec.to_string()))?;
    if r.status == 201 {
        Ok(r.body["ID"].as_str().unwrap_or_default().to_string())
    } else {
        Err(format!("{} {}", r.status, r.body))
    }
}

/// Creates service `name`: `replicas` busybox tasks running `argv` (see [`post_service`]).
pub fn create_service(d: &DaemonProcess, name: &str, replicas: u64, argv: &[&str]) -> Result<String, String> {
    post_service(
        d,
        &serde_json::json!({
            "Name": name,
            "TaskTemplate": {"ContainerSpec": {"Image": "busybox", "Args": argv}},
            "Mode": {"Replicated": {"Replicas": replicas}},
        }),
    )
}

/// GET `path` on `d`'s Engine API: the JSON body of a 2xx answer, else the status and body as the error
/// (e.g. a 503 while the managers elect a leader).
pub fn try_get(d: &DaemonProcess, path: &str) -> Result<Value, String> {
    let r = crate::http::request(d.socket(), "GET", path, None)?;
    if (200..300).contains(&r.status) {
        Ok(r.body)
    } else {
        Err(format!("GET {path} -> {} {}", r.status, r.body))
    }
}

/// The nodes as `d` sees them: (hostname, "Leader" / the manager's reachability / "none" for a worker), sorted;
/// an error when `d` cannot answer (no leader confirms its reads).
pub fn managers_seen_by(d: &DaemonProcess) -> Result<Vec<(String, String)>, String> {
    let mut out: Vec<(String, String)> = try_get(d, "/v1.47/nodes")?
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|n| {
            let host = n["Description"]["Hostname"].as_str().unwrap_or("").to_string();
            let m = &n["ManagerStatus"];
            let status = if m["Leader"].as_bool() == Some(true) {
                "Leader".to_string()
            } else {
                m["Reachability"].as_str().unwrap_or("none").to_string()
            };
            (host, status)
        })
        .collect();
    out.sort();
    Ok(out)
}

/// `path`'s JSON array from `d`, sorted by ID, for comparing managers' stores.
pub fn sorted_by_id(d: &DaemonProcess, path: &str) -> Result<Vec<Value>, String> {
    let mut v = try_get(d, path)?.as_array().cloned().unwrap_or_default();
    v.sort_by(|a, b| a["ID"].as_str().cmp(&b["ID"].as_str()));
    Ok(v)
}

/// Waits until services, tasks and nodes are the same JSON on every daemon of `ds`.
pub fn wait_identical(ds: &[&DaemonProcess], deadline: Duration) {
    wait_until("services, tasks and nodes identical on every manager", deadline, || {
        for path in ["/v1.47/services", "/v1.47/tasks", "/v1.47/nodes"] {
            let first = sorted_by_id(ds[0], path)?;
            for d in &ds[1..] {
                if sorted_by_id(d, path)? != first {
                    return Err(format!("{path} differs"));
                }
            }
        }
        Ok(())
    });
}

/// The hostname of the one node `d` shows as Leader, or why there is not exactly one.
pub fn leader_seen_by(d: &DaemonProcess) -> Result<String, String> {
    let seen = managers_seen_by(d)?;
    let leaders: Vec<&(String, String)> = seen.iter().filter(|(_, s)| s == "Leader").collect();
    match leaders.as_slice() {
        [(host, _)] => Ok(host.clone()),
        other => Err(format!("leaders: {other:?}")),
    }
}
