//! A manager joins a cluster whose state is over 100 MB (issue 4, "no 4 MiB cap, no fixed short send
//! timeout", SwarmKit #2374 and #3113): the leader's snapshot reaches it in chunks, the new member's store
//! is identical to the leader's, and writes go on through both.

use crate::common;

use std::time::{Duration, Instant};

use common::*;

/// Services written, each carrying a label of `LABEL_BYTES`: 104 x 1 MiB = 104 MiB of state.
const SERVICES: usize = 104;
const LABEL_BYTES: usize = 1 << 20;

/// Creates service `name` (no replicas) with a label of `LABEL_BYTES` bytes made from `seed`.
fn create_big(d: &DaemonProcess, name: &str, seed: usize) {
    let fill: String = (0..LABEL_BYTES).map(|i| char::from(b'a' + u8::try_from((i + seed) % 26).unwrap())).collect();
    let body = serde_json::json!({
        "Name": name,
        "Labels": {"fill": fill},
        "TaskTemplate": {"ContainerSpec": {"Image": "busybox", "Args": ["sleep", "1"]}},
        "Mode": {"Replicated": {"Replicas": 0}},
    });
    shoal_testkit::managers::post_service(d, &body).unwrap_or_else(|e| panic!("create {name}: {e}"));
}

/// (ID, version, length of the fill label) of every service, sorted by ID.
fn services_digest(d: &DaemonProcess) -> Vec<(String, u64, usize)> {
    let mut out: Vec<(String, u64, usize)> = d
        .get("/v1.47/services")
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|s| {
            (
                s["ID"].as_str().unwrap_or("").to_string(),
                s["Version"]["Index"].as_u64().unwrap_or(0),
                s["Spec"]["Labels"]["fill"].as_str().map(str::len).unwrap_or(0),
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn a_manager_joins_a_cluster_holding_over_100_mb_of_state() {
    let a = manager_at(61, None);
    let started = Instant::now();
    std::thread::scope(|s| {
        for t in 0..4 {
            let a = &a;
            s.spawn(move || {
                for i in (t..SERVICES).step_by(4) {
                    create_big(a, &format!("big-{i}"), i);
                }
            });
        }
    });
    println!("wrote {SERVICES} MiB of services in {:?}", started.elapsed());
    let want = services_digest(&a);
    assert_eq!(want.len(), SERVICES);
    assert!(want.iter().all(|(_, _, len)| *len == LABEL_BYTES));

    let joined_at = Instant::now();
    let b = manager_at(62, Some(&a));
    wait_until("the new manager holds the whole state", Duration::from_secs(120), || {
        let got = services_digest(&b);
        if got == want {
            Ok(())
        } else {
            Err(format!("{} of {} services", got.len(), want.len()))
        }
    });
    println!("a manager joined a {SERVICES} MiB cluster in {:?}", joined_at.elapsed());

    // Both take writes afterwards (two members: both are needed for a quorum), and see each other's.
    create_big(&b, "after-join-via-follower", 7);
    create_big(&a, "after-join-via-first", 8);
    wait_until("both managers see both new services", Duration::from_secs(30), || {
        let (x, y) = (services_digest(&a), services_digest(&b));
        if x == y && x.len() == SERVICES + 2 {
            Ok(())
        } else {
            Err(format!("{} vs {} services", x.len(), y.len()))
        }
    });
}
