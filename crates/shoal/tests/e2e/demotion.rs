//! `docker node promote` and `docker node demote`, as a user runs them, on real daemons on 127.0.0.x with
//! the process executor: a demoted manager leaves the Raft group (the leader removes it only when the others
//! keep a quorum; a demoted leader hands its leadership over first), renews its certificate as a worker,
//! drops its Raft data and runs on as a worker, also after a restart; a promoted worker joins Raft; and no
//! task ever runs twice meanwhile. "Twice" is counted on the machine: a sampler reads `/proc` every few
//! milliseconds for the service's task processes and which daemon forked each, for the whole test.

use crate::common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;
use shoal_testkit::managers::{create_service, leader_seen_by, managers_seen_by, try_get};

/// The most task processes of one command line seen at once, and when, for as long as it runs.
struct Sampler {
    stop: Arc<AtomicBool>,
    max: Arc<Mutex<(usize, String)>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(argv: &'static [&'static str]) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let max = Arc::new(Mutex::new((0, String::new())));
        let thread = std::thread::spawn({
            let (stop, max) = (stop.clone(), max.clone());
            move || {
                let started = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    let pids = process::pids_with_cmdline(argv);
                    let mut m = max.lock().unwrap();
                    if pids.len() > m.0 {
                        *m = (pids.len(), format!("{:?} after the start: pids {pids:?}", started.elapsed()));
                    }
                    drop(m);
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        });
        Sampler { stop, max, thread: Some(thread) }
    }

    /// The most processes seen at once so far, and when.
    fn max(&self) -> (usize, String) {
        self.max.lock().unwrap().clone()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The parent PID of `pid`.
fn ppid(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
}

/// How many task processes of `argv` each daemon (by hostname) forked.
fn processes_per_node(argv: &[&str], nodes: &[(&str, &DaemonProcess)]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for pid in process::pids_with_cmdline(argv) {
        let parent = ppid(pid).unwrap_or(0);
        let owner = nodes.iter().find(|(_, d)| d.pid() == parent).map_or("(no daemon)", |(h, _)| h);
        *out.entry(owner.to_string()).or_insert(0) += 1;
    }
    out
}

/// The node named `host` as `d` sees it.
fn node_named(d: &DaemonProcess, host: &str) -> Result<Value, String> {
    let nodes = try_get(d, "/v1.47/nodes")?;
    nodes
        .as_array()
        .and_then(|ns| ns.iter().find(|n| n["Description"]["Hostname"] == host).cloned())
        .ok_or_else(|| format!("no node {host}"))
}

/// What `docker info` on `d` says under "Is Manager".
fn is_manager(d: &DaemonProcess) -> Result<bool, String> {
    let out = docker_cli::run(d.socket(), &["info", "--format", "{{.Swarm.ControlAvailable}}"]);
    match String::from_utf8_lossy(&out.stdout).trim() {
        "true" => Ok(true),
        "false" => Ok(false),
        other => Err(format!("docker info: {other:?} {}", String::from_utf8_lossy(&out.stderr))),
    }
}

/// How many of something there are per key.
type Counts<K> = BTreeMap<K, usize>;

/// Tasks of `service` that `d` shows running, per slot, and per node ID.
fn running_tasks(d: &DaemonProcess, service: &str) -> Result<(Counts<u64>, Counts<String>), String> {
    let filters = format!("{{\"service\":{{\"{service}\":true}}}}");
    let tasks = try_get(d, &format!("/v1.47/tasks?filters={}", urlencode(&filters)))?;
    let (mut slots, mut nodes) = (BTreeMap::new(), BTreeMap::new());
    for t in tasks.as_array().cloned().unwrap_or_default() {
        if state(&t) == "running" {
            *slots.entry(t["Slot"].as_u64().unwrap_or(0)).or_insert(0) += 1;
            *nodes.entry(t["NodeID"].as_str().unwrap_or("").to_string()).or_insert(0) += 1;
        }
    }
    Ok((slots, nodes))
}

/// `docker node promote|demote node` on `d`. The node object may change between the CLI's read and its
/// update (its description, its manager status, right after a join or a role change): the update is then
/// refused as out of sequence, and the user runs the command again. A demotion is also refused while the
/// leader has not heard from a quorum of the other managers lately (a manager just promoted, or all of them
/// on a loaded machine, can be marked unreachable for a few heartbeats): the user waits and runs it again,
/// and so does the test, until its deadline.
fn role_change(d: &DaemonProcess, verb: &str, node: &str) {
    wait_until(&format!("docker node {verb} {node} accepted"), Duration::from_secs(30), || {
        let out = docker_cli::run(d.socket(), &["node", verb, node]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        match out.status.success() {
            true => Ok(()),
            false if err.contains("update out of sequence") => Err(err),
            false if verb == "demote" && err.contains("would result in a loss of quorum") => Err(err),
            false => panic!("docker node {verb} {node}: {err}"),
        }
    });
}

/// The cluster as the test follows it: the daemons by hostname, the service and its task processes.
struct Cluster<'a> {
    nodes: Vec<(&'a str, &'a DaemonProcess)>,
    service: &'static str,
    argv: &'static [&'static str],
    replicas: usize,
}

impl Cluster<'_> {
    fn daemon(&self, host: &str) -> &DaemonProcess {
        self.nodes.iter().find(|(h, _)| *h == host).map(|(_, d)| *d).unwrap()
    }

    /// Checks, waiting for each to hold: `docker node ls` answers on every manager in `managers`, each shows
    /// the roles and manager statuses wanted (`managers` are the managers, every other node a worker with no
    /// manager status), `docker info` agrees on every node, a write succeeds through every manager, and the
    /// service's every slot runs exactly once, as a process forked by the node the store says runs it.
    fn check(&self, step: &str, managers: &[&str]) {
        let started = Instant::now();
        let deadline = Duration::from_secs(90);
        for (host, d) in &self.nodes {
            let want_manager = managers.contains(host);
            wait_until(&format!("{step}: docker info on {host} says manager={want_manager}"), deadline, || {
                match is_manager(d)? {
                    m if m == want_manager => Ok(()),
                    m => Err(format!("Is Manager: {m}")),
                }
            });
        }
        for m in managers {
            let d = self.daemon(m);
            wait_until(&format!("{step}: docker node ls on {m}"), deadline, || {
                let out = docker_cli::run(d.socket(), &["node", "ls", "--format", "{{.Hostname}} {{.ManagerStatus}}"]);
                if !out.status.success() {
                    return Err(String::from_utf8_lossy(&out.stderr).into_owned());
                }
                let ls = String::from_utf8_lossy(&out.stdout).into_owned();
                let mut ok = ls.lines().count() == self.nodes.len();
                for (host, _) in &self.nodes {
                    let line = ls.lines().find(|l| l.split(' ').next() == Some(*host)).unwrap_or("");
                    let status = line.split_once(' ').map_or("", |(_, s)| s.trim());
                    ok &= if managers.contains(host) {
                        status == "Leader" || status == "Reachable"
                    } else {
                        status.is_empty()
                    };
                }
                let leaders = ls.lines().filter(|l| l.ends_with(" Leader")).count();
                if ok && leaders == 1 {
                    Ok(())
                } else {
                    Err(ls)
                }
            });
            wait_until(&format!("{step}: roles in docker node inspect on {m}"), deadline, || {
                for (host, _) in &self.nodes {
                    let n = node_named(d, host)?;
                    let want = if managers.contains(host) { "manager" } else { "worker" };
                    if n["Spec"]["Role"] != want || n["ManagerStatus"].is_null() == (want == "manager") {
                        return Err(format!(
                            "{host}: role {} manager status {}",
                            n["Spec"]["Role"], n["ManagerStatus"]
                        ));
                    }
                }
                Ok(())
            });
            wait_until(&format!("{step}: a write through {m}"), deadline, || {
                let name = format!("w-{}-{}", step.replace(' ', "-"), m);
                create_service(d, &name, 0, &["true"]).map(|_| ())
            });
        }
        let leader = self.daemon(managers[0]);
        let nodes: Vec<(&str, &DaemonProcess)> = self.nodes.clone();
        let ids: BTreeMap<String, String> = nodes
            .iter()
            .map(|(h, _)| (node_named(leader, h).unwrap()["ID"].as_str().unwrap().to_string(), h.to_string()))
            .collect();
        wait_until(
            &format!("{step}: every slot of {} running once, where the store says", self.service),
            deadline,
            || {
                let (slots, per_node) = running_tasks(leader, self.service)?;
                let per_node: BTreeMap<String, usize> =
                    per_node.into_iter().map(|(id, n)| (ids.get(&id).cloned().unwrap_or(id), n)).collect();
                let processes = processes_per_node(self.argv, &nodes);
                if slots.len() == self.replicas && slots.values().all(|n| *n == 1) && processes == per_node {
                    Ok(())
                } else {
                    Err(format!(
                        "running per slot {slots:?}; per node in the store {per_node:?}, as processes {processes:?}"
                    ))
                }
            },
        );
        println!("{step}: checked in {:?}", started.elapsed());
    }
}

/// 3 managers and a worker, 8 task processes spread over them; then the worker promoted, demoted, promoted
/// again, the leader demoted, and the demoted node restarted (it comes back as a worker). After every step
/// every check of `Cluster::check` holds, and at no moment did more task processes run than replicas.
#[test]
fn promotions_and_demotions_keep_quorum_and_never_run_a_task_twice() {
    if no_docker_cli() {
        return;
    }
    const ARGV: &[&str] = &["sleep", "3377"];
    let m1 = manager_at(71, None);
    let m2 = manager_at(72, Some(&m1));
    let m3 = manager_at(73, Some(&m1));
    let mut w = node_at(74, "worker-74", Some((&m1, "Worker")));
    let sampler = Sampler::start(ARGV);
    docker(&m1, &["service", "create", "--detach", "--name", "load", "--replicas", "8", "busybox", "sleep", "3377"]);
    let c = Cluster {
        nodes: vec![("manager-71", &m1), ("manager-72", &m2), ("manager-73", &m3), ("worker-74", &w)],
        service: "load",
        argv: ARGV,
        replicas: 8,
    };
    c.check("start", &["manager-71", "manager-72", "manager-73"]);

    role_change(&m1, "promote", "worker-74");
    c.check("promote", &["manager-71", "manager-72", "manager-73", "worker-74"]);
    role_change(&m2, "demote", "worker-74");
    c.check("demote", &["manager-71", "manager-72", "manager-73"]);
    assert!(!w.state_dir().join("raft").exists(), "the demoted node kept its raft data");
    role_change(&m3, "promote", "worker-74");
    c.check("promote again", &["manager-71", "manager-72", "manager-73", "worker-74"]);

    // The leader itself: it hands its leadership over, then the new leader removes it.
    let leader = wait_until("a leader", Duration::from_secs(20), || leader_seen_by(&m1));
    let others: Vec<&str> =
        ["manager-71", "manager-72", "manager-73", "worker-74"].into_iter().filter(|h| *h != leader).collect();
    role_change(c.daemon(others[0]), "demote", &leader);
    c.check("demote the leader", &others);
    println!("max task processes at once: {:?}", sampler.max());
    drop(c);

    // The demoted node, restarted, comes back as a worker.
    let (mut m1, mut m2, mut m3) = (m1, m2, m3);
    let d: &mut DaemonProcess = match leader.as_str() {
        "manager-71" => &mut m1,
        "manager-72" => &mut m2,
        "manager-73" => &mut m3,
        _ => &mut w,
    };
    assert!(d.stop(), "the demoted node did not stop cleanly: {}", d.log());
    assert!(!d.state_dir().join("raft").exists(), "the demoted node kept its raft data");
    d.restart(&[]);
    let c = Cluster {
        nodes: vec![("manager-71", &m1), ("manager-72", &m2), ("manager-73", &m3), ("worker-74", &w)],
        service: "load",
        argv: ARGV,
        replicas: 8,
    };
    c.check("restart the demoted node", &others);
    let (max, when) = sampler.max();
    assert!(max <= 8, "{max} task processes of 8 replicas ran at once, {when}");
}

/// A manager demoted right after it joined: the leader takes it out of Raft once it counts in the quorum,
/// the cluster keeps its quorum (writes succeed), and the node runs on as a worker.
#[test]
fn a_manager_demoted_right_after_its_join_leaves_and_the_quorum_holds() {
    if no_docker_cli() {
        return;
    }
    let a = manager_at(75, None);
    let b = manager_at(76, Some(&a));
    // By ID, as soon as its daemon answers: its hostname may not have reached the managers yet.
    let identity: Value = serde_json::from_slice(&std::fs::read(b.state_dir().join("node.json")).unwrap()).unwrap();
    role_change(&a, "demote", identity["node_id"].as_str().unwrap());
    wait_until("manager-76 a worker in the leader's view", Duration::from_secs(60), || {
        let seen = managers_seen_by(&a)?;
        if seen == [("manager-75".to_string(), "Leader".to_string()), ("manager-76".to_string(), "none".to_string())] {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    });
    wait_until("a write through the leader", Duration::from_secs(20), || create_service(&a, "after", 0, &["true"]));
    wait_until("docker info on manager-76 says it is no manager", Duration::from_secs(60), || match is_manager(&b)? {
        false => Ok(()),
        true => Err("Is Manager: true".into()),
    });
    wait_until("manager-76 ready as a worker", Duration::from_secs(30), || {
        let n = node_named(&a, "manager-76")?;
        if n["Status"]["State"] == "ready" && n["Spec"]["Role"] == "worker" {
            Ok(())
        } else {
            Err(format!("{} {}", n["Status"]["State"], n["Spec"]["Role"]))
        }
    });
}

/// Demoting a manager while another is down would leave the rest without a quorum: refused with SwarmKit's
/// message, and nothing changes.
#[test]
fn a_demotion_that_would_lose_quorum_is_refused() {
    if no_docker_cli() {
        return;
    }
    let a = manager_at(77, None);
    let b = manager_at(78, Some(&a));
    let mut c = manager_at(79, Some(&a));
    wait_until("3 managers", Duration::from_secs(30), || {
        let seen = managers_seen_by(&a)?;
        // Each with its hostname: a node killed before its first session wrote its description has none.
        let ready = seen.iter().filter(|(h, s)| !h.is_empty() && (s == "Leader" || s == "reachable")).count();
        if ready == 3 {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    });
    c.kill9();
    let leader = wait_until("manager-79 unreachable", Duration::from_secs(30), || {
        let seen = managers_seen_by(&a)?;
        let leader = leader_seen_by(&a)?;
        if seen.iter().any(|(h, s)| h == "manager-79" && s == "unreachable") {
            Ok(leader)
        } else {
            Err(format!("{seen:?}"))
        }
    });
    let other = if leader == "manager-77" { "manager-78" } else { "manager-77" };
    let out = docker_cli::run(a.socket(), &["node", "demote", other]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("can't remove member from the raft: this would result in a loss of quorum"),
        "{err}"
    );
    assert_eq!(node_named(&a, other).unwrap()["Spec"]["Role"], "manager");
    wait_until("a write through manager-78", Duration::from_secs(20), || create_service(&b, "still", 0, &["true"]));
    drop(b);
}
