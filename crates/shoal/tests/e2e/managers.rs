//! Three managers in three daemon processes on 127.0.0.{11,12,13}: the first bootstraps, the others join it
//! with `--join-addr` (mutual TLS between managers; each joins with the manager token). Every manager serves the Engine
//! API; writes on a follower are forwarded to the leader. Killing the leader (kill -9) elects another within seconds
//! and writes continue through a survivor; the killed manager restarts as a follower and the stores converge.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use shoal_testkit::managers::{create_service as create, managers_seen_by, wait_identical};

/// Sets the desired role of the node named `host` through `d`'s control socket (what `docker node promote`
/// and `docker node demote` send).
fn set_role(d: &DaemonProcess, host: &str, role: &str) {
    let node = d
        .get("/v1.47/nodes")
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["Description"]["Hostname"] == host)
        .cloned()
        .unwrap_or_else(|| panic!("no node {host}"));
    let mut spec = node["Spec"].clone();
    spec["Role"] = role.into();
    let path = format!("/v1.47/nodes/{}/update?version={}", node["ID"].as_str().unwrap(), node["Version"]["Index"]);
    let r = shoal_testkit::http::request(d.socket(), "POST", &path, Some(&spec.to_string())).unwrap();
    assert_eq!(r.status, 200, "set role {role} of {host}: {}", r.body);
}

/// Waits until `d` sees exactly the managers in `want` (hostname, "Leader"/"reachable"/"none"), sorted.
fn wait_managers(d: &DaemonProcess, want: &[(&str, &str)], deadline: Duration) {
    let want: Vec<(String, String)> = want.iter().map(|(h, s)| (h.to_string(), s.to_string())).collect();
    wait_until("the expected manager statuses", deadline, || {
        let seen = managers_seen_by(d)?;
        if seen == want {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    });
}

fn leader_index(ds: &[&DaemonProcess]) -> usize {
    wait_until("one leader", Duration::from_secs(20), || {
        let seen = managers_seen_by(ds[0])?;
        let leaders: Vec<&(String, String)> = seen.iter().filter(|(_, s)| s == "Leader").collect();
        match leaders.as_slice() {
            [(host, _)] => {
                let i: usize = host.trim_start_matches("manager-").parse().map_err(|e| format!("{e}"))?;
                Ok(i - 11)
            }
            other => Err(format!("leaders: {other:?}")),
        }
    })
}

#[test]
fn three_managers_survive_losing_the_leader() {
    let a = manager_at(11, None);
    let b = manager_at(12, Some(&a));
    let c = manager_at(13, Some(&a));
    let mut ds = [a, b, c];

    let expected = |leader: &str| {
        let mut v: Vec<(String, String)> = (11..=13)
            .map(|i| {
                let h = format!("manager-{i}");
                let s = if h == leader { "Leader" } else { "reachable" };
                (h, s.to_string())
            })
            .collect();
        v.sort();
        v
    };
    for d in &ds {
        wait_until("3 managers, one leader (manager-11)", Duration::from_secs(30), || {
            let seen = managers_seen_by(d)?;
            if seen == expected("manager-11") {
                Ok(())
            } else {
                Err(format!("{seen:?}"))
            }
        });
    }
    if !no_docker_cli() {
        let ls = docker(&ds[1], &["node", "ls"]);
        assert_eq!(ls.matches("Leader").count(), 1, "{ls}");
        assert_eq!(ls.matches("Reachable").count(), 2, "{ls}");
    }

    // A write on a follower is forwarded to the leader and visible on every manager.
    create(&ds[2], "from-follower", 3, &["sleep", "3271"]).expect("create on a follower");
    wait_identical(&[&ds[0], &ds[1], &ds[2]], Duration::from_secs(30));

    // kill -9 the leader: a survivor takes writes again within a few seconds.
    let old = leader_index(&[&ds[1], &ds[2]]);
    assert_eq!(old, 0);
    ds[old].kill9();
    let killed_at = Instant::now();
    let survivor = &ds[1];
    wait_until("a write through a survivor after the leader died", Duration::from_secs(20), || {
        create(survivor, "after-failover", 1, &["sleep", "3272"])
    });
    let took = killed_at.elapsed();
    println!("write through a survivor succeeded {took:?} after kill -9 of the leader");
    assert!(took < Duration::from_secs(10), "failover took {took:?}");
    let new = leader_index(&[&ds[1], &ds[2]]);
    assert_ne!(new, old);

    // The killed manager restarts as a follower and catches up.
    ds[old].restart(&[]);
    wait_identical(&[&ds[0], &ds[1], &ds[2]], Duration::from_secs(30));
    assert_eq!(leader_index(&[&ds[0], &ds[1], &ds[2]]), new, "the restarted manager follows");
    wait_until("the restarted manager is reachable again", Duration::from_secs(30), || {
        let seen = managers_seen_by(&ds[0])?;
        let leader = format!("manager-{}", 11 + new);
        if seen == expected(&leader) {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    });
}

/// Disaster recovery: two of three managers are lost for good; writes on the survivor fail promptly with
/// a clear 503; restarted with `--force-new-cluster`, it is the only manager, keeps the data and takes writes.
#[test]
fn force_new_cluster_recovers_from_losing_two_of_three_managers() {
    let mut a = manager_at(21, None);
    let mut b = manager_at(22, Some(&a));
    let mut c = manager_at(23, Some(&a));
    wait_until("3 managers", Duration::from_secs(30), || {
        let seen = managers_seen_by(&a)?;
        if seen.len() == 3 && seen.iter().filter(|(_, s)| s == "Leader").count() == 1 {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    });
    create(&a, "before-disaster", 1, &["sleep", "3181"]).expect("create");
    wait_identical(&[&a, &b, &c], Duration::from_secs(30));
    b.kill9();
    c.kill9();

    // Without a quorum a write fails with a clear 503, and never hangs.
    let err = wait_until("a write refused for lack of quorum", Duration::from_secs(30), || {
        let started = Instant::now();
        match create(&a, "no-quorum", 1, &["sleep", "3182"]) {
            Ok(id) => Err(format!("write {id} accepted")),
            Err(e) if e.starts_with("503") && e.contains("no leader / lost quorum") => Ok((e, started.elapsed())),
            Err(e) => Err(e),
        }
    });
    println!("refused in {:?}: {}", err.1, err.0);
    assert!(err.1 < Duration::from_secs(12), "refusal took {:?}", err.1);

    assert!(a.stop(), "clean stop; log:\n{}", a.log());
    a.restart(&["--force-new-cluster".to_string()]);
    wait_until("a write after --force-new-cluster", Duration::from_secs(20), || {
        create(&a, "after-recovery", 1, &["sleep", "3183"])
    });
    let names = service_names(&a);
    assert!(names.contains(&"before-disaster".to_string()), "{names:?}");
    wait_until("only manager-21 is a manager", Duration::from_secs(20), || {
        let seen = managers_seen_by(&a)?;
        let managers: Vec<&(String, String)> = seen.iter().filter(|(_, s)| s != "none").collect();
        if managers.len() == 1 && managers[0].1 == "Leader" {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    });
}

/// `docker node demote` of a manager (desired role worker) takes it out of Raft; the others keep their quorum
/// and take writes, and the node stays in the cluster without a manager status.
#[test]
fn a_demoted_manager_leaves_raft() {
    let a = manager_at(31, None);
    let b = manager_at(32, Some(&a));
    let c = manager_at(33, Some(&a));
    wait_until("3 managers, manager-31 leads", Duration::from_secs(30), || {
        let seen = managers_seen_by(&a)?;
        let want: Vec<(String, String)> = vec![
            ("manager-31".into(), "Leader".into()),
            ("manager-32".into(), "reachable".into()),
            ("manager-33".into(), "reachable".into()),
        ];
        if seen == want {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    });
    let node = a
        .get("/v1.47/nodes")
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["Description"]["Hostname"] == "manager-33")
        .cloned()
        .unwrap();
    let mut spec = node["Spec"].clone();
    spec["Role"] = "worker".into();
    let path = format!("/v1.47/nodes/{}/update?version={}", node["ID"].as_str().unwrap(), node["Version"]["Index"]);
    let r = shoal_testkit::http::request(a.socket(), "POST", &path, Some(&spec.to_string())).unwrap();
    assert_eq!(r.status, 200, "demote: {}", r.body);
    wait_until("manager-33 is no longer a manager", Duration::from_secs(30), || {
        let seen = managers_seen_by(&a)?;
        if seen.iter().any(|(h, s)| h == "manager-33" && s == "none") {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    });
    wait_until("a write through manager-32", Duration::from_secs(20), || {
        create(&b, "after-demote", 1, &["sleep", "3191"])
    });
    drop(c);
}

/// A task printing one greeting, then `beat N` every 200 ms.
const GREETER: &str = "echo greeting from the task; i=0; while true; do echo beat $i; i=$((i+1)); sleep 0.2; done";

#[test]
fn a_follower_manager_serves_service_logs_from_the_leader() {
    if no_docker_cli() {
        return;
    }
    let a = manager_at(11, None);
    let b = manager_at(12, Some(&a));
    let c = manager_at(13, Some(&a));
    let mut all = [a, b, c];
    for d in &all {
        wait_until("3 managers seen", Duration::from_secs(30), || {
            let seen = managers_seen_by(d)?;
            if seen.len() == 3 && seen.iter().filter(|(_, s)| s == "Leader").count() == 1 {
                Ok(())
            } else {
                Err(format!("{seen:?}"))
            }
        });
    }
    let leader = leader_index(&[&all[0], &all[1], &all[2]]);
    let follower = &all[(leader + 1) % 3];

    // A service created through the leader has logs on a follower at once: the follower's read waits until it
    // has applied what the leader had committed (200, never a 404 for a service it has not applied yet).
    for i in 0..5 {
        let name = format!("quiet-{i}");
        create(&all[leader], &name, 0, &["true"]).expect("create on the leader");
        let path = format!("/v1.47/services/{name}/logs?stdout=1&stderr=1");
        let r = shoal_testkit::http::request(follower.socket(), "GET", &path, None).expect("logs on the follower");
        assert_eq!(r.status, 200, "logs of {name} right after its creation: {}", r.body);
    }

    docker(
        follower,
        &["service", "create", "--detach", "--name", "greeter", "--replicas", "3", "busybox", "sh", "-c", GREETER],
    );
    // Every task's lines, whichever node runs it, come back through the follower.
    let out = wait_until("the three tasks' greetings through the follower", Duration::from_secs(60), || {
        let out = docker_cli::run(follower.socket(), &["service", "logs", "greeter"]);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            return Err(format!("docker service logs failed: {}", String::from_utf8_lossy(&out.stderr)));
        }
        let greeted = |slot: u8| {
            stdout
                .lines()
                .any(|l| l.starts_with(&format!("greeter.{slot}.")) && l.ends_with("| greeting from the task"))
        };
        if (1..=3).all(greeted) {
            Ok(stdout)
        } else {
            Err(format!("{} lines so far", stdout.lines().count()))
        }
    });
    let latest = out
        .lines()
        .filter_map(|l| l.split("| beat ").nth(1))
        .filter_map(|n| n.trim().parse::<u64>().ok())
        .max()
        .unwrap_or(0);

    // -f through the follower keeps streaming lines printed after it started.
    let mut f = Follower::start(follower.socket(), "greeter");
    let later = format!("| beat {}", latest + 10);
    let seen = f.wait_for(&later, Duration::from_secs(30));
    assert!(seen.starts_with("greeter."), "{seen}");

    // When the leader goes away mid-follow, the stream through the follower ends cleanly.
    all[leader].kill9();
    let status = f.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "docker service logs -f ended with {status}");
}

/// Runs `shoal daemon` (no --join-*) on a fresh state dir holding only a copy of `state_dir`'s certificates
/// (a manager's certificate, no Raft data) and returns its exit status and output; it must exit by itself
/// within 30 s.
fn start_with_certs_only(state_dir: &std::path::Path) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let certs = shoal_node::certs_dir(&state);
    std::fs::create_dir_all(&certs).unwrap();
    for f in std::fs::read_dir(shoal_node::certs_dir(state_dir)).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), certs.join(f.file_name())).unwrap();
    }
    let child = std::process::Command::new(shoal_bin())
        .args(["daemon", "--state-dir"])
        .arg(&state)
        .arg("--listen-control-api")
        .arg(dir.path().join("control.sock"))
        .args(["--listen-remote-api", "127.0.0.99:0", "--executor", "process"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    process::wait_exit(child, Duration::from_secs(30), "a daemon with a manager certificate and no raft state")
}

/// `docker node promote` of a running worker: it renews its certificate for the manager role as soon as its
/// session shows the new desired role, restarts in-process as a manager that joins Raft through the manager
/// it knows, and shows as "reachable"; a write through its own control socket succeeds (forwarded to the
/// leader). Its certificate copied to a state dir without Raft data refuses to bootstrap a new cluster.
/// Demoted again, it leaves Raft and is a worker in `docker node ls`.
#[test]
fn a_promoted_worker_becomes_a_manager_and_back() {
    let a = manager_at(41, None);
    let w = node_at(42, "worker-42", Some((&a, "Worker")));
    wait_managers(&a, &[("manager-41", "Leader"), ("worker-42", "none")], Duration::from_secs(30));

    // The docker CLI when it is installed (`docker node promote` sends the same update), else the API.
    let cli = docker_cli::available();
    if cli {
        docker(&a, &["node", "promote", "worker-42"]);
    } else {
        set_role(&a, "worker-42", "manager");
    }
    wait_managers(&a, &[("manager-41", "Leader"), ("worker-42", "reachable")], Duration::from_secs(60));
    if cli {
        let ls = docker(&a, &["node", "ls", "--format", "{{.Hostname}} {{.ManagerStatus}}"]);
        let mut lines: Vec<&str> = ls.lines().collect();
        lines.sort();
        assert_eq!(lines, ["manager-41 Leader", "worker-42 Reachable"], "docker node ls: {ls}");
    }
    let role = |host: &str| -> String {
        let nodes = a.get("/v1.47/nodes");
        let n = nodes.as_array().unwrap().iter().find(|n| n["Description"]["Hostname"] == host).cloned();
        n.map(|n| n["Spec"]["Role"].as_str().unwrap_or("").to_string()).unwrap_or_default()
    };
    assert_eq!(role("worker-42"), "manager");
    assert!(w.log().contains("promoted to manager"), "{}", w.log());
    let (ok, out) = start_with_certs_only(w.state_dir());
    assert!(!ok && out.contains("must not create a new one"), "a manager certificate without raft state: {out}");
    wait_until("a write through the promoted node", Duration::from_secs(20), || {
        create(&w, "via-promoted", 1, &["sleep", "3192"])
    });
    wait_until("the promoted node to see the service", Duration::from_secs(20), || {
        let n = w.get("/v1.47/services").as_array().map(|v| v.len()).unwrap_or(0);
        if n == 1 {
            Ok(())
        } else {
            Err(format!("{n} services"))
        }
    });

    if cli {
        docker(&a, &["node", "demote", "worker-42"]);
    } else {
        set_role(&a, "worker-42", "worker");
    }
    wait_managers(&a, &[("manager-41", "Leader"), ("worker-42", "none")], Duration::from_secs(30));
    assert_eq!(role("worker-42"), "worker");
    wait_until("a write through the leader after the demotion", Duration::from_secs(20), || {
        create(&a, "after-demote-back", 1, &["sleep", "3193"])
    });
}
