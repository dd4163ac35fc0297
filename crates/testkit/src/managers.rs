//! Looking at a multi-manager cluster of daemon processes through their Engine APIs: manager statuses as one
//! manager sees them, the leader, and whether every manager's store holds the same objects. Shared by the
//! multi-manager and fault tests.

use std::time::Duration;

use serde_json::Value;

use crate::{wait_until, DaemonProcess};

/// The nodes as `d` sees them: (hostname, "Leader" / the manager's reachability / "none" for a worker), sorted.
pub fn managers_seen_by(d: &DaemonProcess) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = d
        .get("/v1.47/nodes")
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
    out
}

/// `path`'s JSON array from `d`, sorted by ID, for comparing managers' stores.
pub fn sorted_by_id(d: &DaemonProcess, path: &str) -> Vec<Value> {
    let mut v = d.get(path).as_array().cloned().unwrap_or_default();
    v.sort_by(|a, b| a["ID"].as_str().cmp(&b["ID"].as_str()));
    v
}

/// Waits until services, tasks and nodes are the same JSON on every daemon of `ds`.
pub fn wait_identical(ds: &[&DaemonProcess], deadline: Duration) {
    wait_until("services, tasks and nodes identical on every manager", deadline, || {
        for path in ["/v1.47/services", "/v1.47/tasks", "/v1.47/nodes"] {
            let first = sorted_by_id(ds[0], path);
            for d in &ds[1..] {
                if sorted_by_id(d, path) != first {
                    return Err(format!("{path} differs"));
                }
            }
        }
        Ok(())
    });
}

/// The hostname of the one node `d` shows as Leader, or why there is not exactly one.
pub fn leader_seen_by(d: &DaemonProcess) -> Result<String, String> {
    let seen = managers_seen_by(d);
    let leaders: Vec<&(String, String)> = seen.iter().filter(|(_, s)| s == "Leader").collect();
    match leaders.as_slice() {
        [(host, _)] => Ok(host.clone()),
        other => Err(format!("leaders: {other:?}")),
    }
}
