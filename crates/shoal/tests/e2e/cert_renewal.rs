//! Certificate renewal with short-lived certificates: the manager issues node certificates valid 12 s
//! (`SHOAL_DEBUG_NODE_CERT_EXPIRY_SECS`, a test-only setting that bypasses the one-hour minimum), so the
//! manager and a worker each renew theirs several times, while the service's tasks keep running untouched
//! (same tasks, no restarts). Its own test binary because it sets the environment the daemons inherit.

use crate::common;

use std::time::Duration;

use common::*;
use shoal_testkit::daemon::DaemonOptions;

fn renewals(d: &DaemonProcess) -> usize {
    d.log().matches("node certificate renewed").count()
}

fn running_task_ids(m: &DaemonProcess) -> Vec<String> {
    let mut ids: Vec<String> = tasks_of(m, "steady")
        .iter()
        .filter(|t| state(t) == "running")
        .map(|t| t["ID"].as_str().unwrap_or("").to_string())
        .collect();
    ids.sort();
    ids
}

#[test]
fn certificates_renew_repeatedly_while_tasks_keep_running() {
    // Set before any daemon starts; this binary has only this test.
    std::env::set_var("SHOAL_DEBUG_NODE_CERT_EXPIRY_SECS", "12");
    let m = DaemonProcess::start_with(
        &shoal_bin(),
        DaemonOptions {
            listen_ip: Some("127.0.0.51".into()),
            hostname: Some("manager".into()),
            ..DaemonOptions::default()
        },
    );
    let token = m.get("/v1.47/swarm")["JoinTokens"]["Worker"].as_str().unwrap().to_string();
    let w = DaemonProcess::start_with(
        &shoal_bin(),
        DaemonOptions {
            listen_ip: Some("127.0.0.52".into()),
            hostname: Some("worker".into()),
            extra_args: vec!["--join-addr".into(), m.remote_addr(), "--join-token".into(), token],
            ..DaemonOptions::default()
        },
    );
    let body = serde_json::json!({
        "Name": "steady",
        "TaskTemplate": {"ContainerSpec": {"Image": "busybox", "Args": ["sleep", "3441"]}},
        "Mode": {"Replicated": {"Replicas": 4}},
    });
    let r =
        shoal_testkit::http::request(m.socket(), "POST", "/v1.47/services/create", Some(&body.to_string())).unwrap();
    assert_eq!(r.status, 201, "{}", r.body);
    let before = wait_until("4 running tasks", Duration::from_secs(30), || {
        let ids = running_task_ids(&m);
        if ids.len() == 4 {
            Ok(ids)
        } else {
            Err(format!("{ids:?}"))
        }
    });

    // 12 s certificates renew at 6-9.6 s: three renewals each within 45 s.
    wait_until("three renewals on each node", Duration::from_secs(45), || {
        let (rm, rw) = (renewals(&m), renewals(&w));
        if rm >= 3 && rw >= 3 {
            Ok(())
        } else {
            Err(format!("manager {rm}, worker {rw}"))
        }
    });
    assert_eq!(running_task_ids(&m), before, "the same tasks kept running through the renewals");
    assert_eq!(tasks_of(&m, "steady").len(), 4, "no task was replaced");

    // The worker's certificate on disk is a fresh 12 s one.
    let certs = shoal_node::load_certs(w.state_dir()).unwrap().unwrap();
    let der = shoal_ca::parse_cert_pem_chain(certs.cert_pem.as_bytes()).unwrap();
    let info = shoal_ca::parse_cert(&der[0]).unwrap();
    let life = info.not_after.duration_since(info.not_before).unwrap();
    assert_eq!(life, Duration::from_secs(12) + shoal_ca::BACKDATE);
    assert_eq!(info.subject.role, shoal_ca::Role::Worker);
}
