//! Our own `shoal` CLI drives a daemon through the Engine API: create, ls, ps, scale, inspect, rm, node ls,
//! with clear one-line errors and non-zero exit codes.

use crate::common;

use std::time::Duration;

use common::*;

fn ok(d: &DaemonProcess, args: &[&str]) -> String {
    let out = shoal_cli(d.socket(), args);
    assert!(
        out.status.success(),
        "shoal {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_shoal_cli_manages_a_service_end_to_end() {
    let d = daemon();
    let id = ok(&d, &["service", "create", "--name", "api", "--replicas", "2", "busybox", "sleep", "3171"]);
    assert_eq!(id.trim().len(), 25, "create prints the ID: {id:?}");
    wait_running(&d, "api", 2, &["sleep", "3171"], Duration::from_secs(20));
    let ls = ok(&d, &["service", "ls"]);
    assert!(ls.lines().any(|l| l.contains("api") && l.contains("2/2")), "service ls:\n{ls}");
    let ps = ok(&d, &["service", "ps", "api"]);
    assert_eq!(ps.lines().filter(|l| l.contains("Running") || l.contains("running")).count(), 2, "service ps:\n{ps}");
    let json: serde_json::Value = serde_json::from_str(&ok(&d, &["service", "inspect", "api"])).expect("inspect JSON");
    assert_eq!(json[0]["Spec"]["Name"], "api");
    ok(&d, &["service", "scale", "api=3"]);
    wait_running(&d, "api", 3, &["sleep", "3171"], Duration::from_secs(20));
    let nodes = ok(&d, &["node", "ls"]);
    assert!(nodes.contains("shoal-test-node"), "node ls:\n{nodes}");
    ok(&d, &["service", "rm", "api"]);
    wait_until("processes gone", Duration::from_secs(20), || {
        let n = process::pids_with_cmdline(&["sleep", "3171"]).len();
        if n == 0 {
            Ok(())
        } else {
            Err(format!("{n} left"))
        }
    });

    let out = shoal_cli(d.socket(), &["service", "inspect", "nope"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "one-line error: {err}");
    assert!(err.contains("nope"), "{err}");
}
