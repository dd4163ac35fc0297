//! Removing a dead manager for good (issue 4, membership): of three managers one is killed and never comes
//! back; `docker node rm` refuses it while it is a manager, `docker node demote` takes it out of Raft with
//! the two survivors' quorum, `docker node rm --force` removes the node. A new manager then joins, and the
//! cluster survives losing one more: had the dead member stayed in Raft, two live managers of four would
//! have no quorum.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use shoal_testkit::managers::{create_service, managers_seen_by, wait_identical};

fn wait_seen(d: &DaemonProcess, want: &[(&str, &str)]) {
    let want: Vec<(String, String)> = want.iter().map(|(h, s)| (h.to_string(), s.to_string())).collect();
    wait_until("the expected managers", Duration::from_secs(30), || {
        let seen = managers_seen_by(d)?;
        if seen == want {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    });
}

fn create(d: &DaemonProcess, name: &str) -> Result<(), String> {
    create_service(d, name, 1, &["sleep", "3301"]).map(|_| ())
}

#[test]
fn a_dead_manager_is_demoted_and_removed_and_the_cluster_grows_again() {
    if no_docker_cli() {
        return;
    }
    let a = manager_at(63, None);
    let b = manager_at(64, Some(&a));
    let mut c = manager_at(65, Some(&a));
    wait_seen(&a, &[("manager-63", "Leader"), ("manager-64", "reachable"), ("manager-65", "reachable")]);
    create(&a, "before").expect("create");

    c.kill9();
    wait_until("manager-65 unreachable", Duration::from_secs(30), || {
        let seen = managers_seen_by(&a)?;
        if seen.iter().any(|(h, s)| h == "manager-65" && s == "unreachable") {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    });

    // Still a manager: removal is refused with what to do, and nothing changes.
    let out = docker_cli::run(a.socket(), &["node", "rm", "--force", "manager-65"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("demote"), "{err}");
    assert_eq!(managers_seen_by(&a).expect("nodes").len(), 3);

    let demoted_at = Instant::now();
    docker(&b, &["node", "demote", "manager-65"]);
    wait_seen(&a, &[("manager-63", "Leader"), ("manager-64", "reachable"), ("manager-65", "none")]);
    println!("dead manager out of Raft {:?} after demote", demoted_at.elapsed());
    docker(&a, &["node", "rm", "--force", "manager-65"]);
    wait_seen(&b, &[("manager-63", "Leader"), ("manager-64", "reachable")]);
    create(&b, "after-removal").expect("a write with two managers left");

    // A fresh manager joins; then the first one dies: two of three is still a quorum.
    let d = manager_at(66, Some(&b));
    wait_seen(&a, &[("manager-63", "Leader"), ("manager-64", "reachable"), ("manager-66", "reachable")]);
    wait_identical(&[&a, &b, &d], Duration::from_secs(30));
    let mut a = a;
    a.kill9();
    wait_until("a write after losing manager-63", Duration::from_secs(30), || create(&d, "after-second-loss"));
    wait_identical(&[&b, &d], Duration::from_secs(30));
    let names = service_names(&b);
    for want in ["before", "after-removal", "after-second-loss"] {
        assert!(names.iter().any(|n| n == want), "{want} missing from {names:?}");
    }
}
