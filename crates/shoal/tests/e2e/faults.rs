//! Process-level fault scenarios on three manager daemons, each in its own network namespace
//! (`shoal_testkit::netns`), with clients writing and reading services during the fault: kill -9 of the
//! leader, of a follower, of a quorum (then restarted), of a follower whose state is wiped before it joins
//! again; the leader cut off from both followers; a follower's traffic delayed; every manager restarted at once.
//!
//! The clients (threads with seeded random choices; the seed is printed and can be set with
//! `SHOAL_FAULT_SEED`) create, update (read, then update at the version read), delete and read a few services
//! through the Engine API sockets of all three managers and record every operation in a
//! `shoal_testkit::history::History`. After the fault heals: exactly one leader, the same services, tasks and
//! nodes on every manager, and the history (with a final read of every service on every manager) linearizable,
//! which also says that every write acknowledged to a client is present.
//!
//! Which answers say "definitely not applied" (`Outcome::Fail`), from the code: 400 (validation, and the size
//! limit, both before anything is proposed), 404 and 409 (the object is missing, the name is taken or the
//! version is stale: either seen before proposing, or found when the committed entry is applied, which then
//! changes nothing: `ProposeError::Store`), and a control socket that refuses the connection (the request was
//! never sent). Everything else is `Outcome::Unknown`: 503 can be "no leader" before anything was appended,
//! but also a proposal appended and then lost or committed after leadership changed, a forwarded write whose
//! answer did not come back, or a follower that did not apply it in time; 500, a dropped connection and a
//! client timeout say nothing either. Failed ops are left out of the check; 404/409 are not used as reads of
//! the state (they may be decided on a follower's view).

use crate::common;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use shoal_testkit::daemon::DaemonOptions;
use shoal_testkit::history::{self, History, Op, Outcome};
use shoal_testkit::http::{self, RequestError};
use shoal_testkit::managers::{leader_seen_by, managers_seen_by, wait_identical};
use shoal_testkit::netns::Net;

/// Raft timing of every manager: 50 ms ticks, elections after 0.5-1 s of silence, heartbeats every tick.
const TIMING: [&str; 6] = ["--raft-tick-interval-ms", "50", "--election-tick", "10", "--heartbeat-tick", "1"];
/// The remote API port of every manager (each has its own namespace, hence its own port space).
const PORT: u16 = 4242;
/// How long a client waits for one answer before recording the op as unknown.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(20);
/// Client threads per scenario.
const CLIENTS: usize = 3;
/// Services the clients work on.
const KEYS: usize = 3;

/// Three managers in namespaces `manager-0..2`; manager-0 bootstraps the cluster and the others join it.
struct Cluster {
    // Dropped before `net`: a namespace lives on while a process is inside it.
    ds: Vec<DaemonProcess>,
    net: Net,
    token: String,
}

impl Cluster {
    fn start(tag: &str) -> Cluster {
        let net = Net::new(tag, 3);
        let first = DaemonProcess::start_with(&shoal_bin(), options(&net, 0, TIMING.map(String::from).to_vec()));
        let token = first.get("/v1.47/swarm")["JoinTokens"]["Manager"].as_str().expect("manager token").to_string();
        let mut c = Cluster { ds: vec![first], net, token };
        for i in 1..3 {
            let join = c.join_args(0);
            let d = DaemonProcess::start_with(&shoal_bin(), options(&c.net, i, join));
            c.ds.push(d);
        }
        c.wait_healthy(&[0, 1, 2], Duration::from_secs(40));
        c
    }

    /// Flags to join through manager `via` (plus the timing).
    fn join_args(&self, via: usize) -> Vec<String> {
        let mut a: Vec<String> = TIMING.map(String::from).to_vec();
        a.extend(["--join-addr".into(), self.ds[via].remote_addr(), "--join-token".into(), self.token.clone()]);
        a
    }

    fn restart(&mut self, i: usize) {
        self.ds[i].restart(&TIMING.map(String::from));
    }

    fn sockets(&self) -> Vec<PathBuf> {
        self.ds.iter().map(|d| d.socket().to_path_buf()).collect()
    }

    /// Waits until every manager in `live` names the same single leader among them, and sees the others of
    /// `live` as reachable; returns the leader's index.
    fn wait_healthy(&self, live: &[usize], deadline: Duration) -> usize {
        wait_until("one leader, every live manager reachable, as every live manager sees it", deadline, || {
            let mut leader: Option<String> = None;
            for &i in live {
                let seen = managers_seen_by(&self.ds[i])?;
                let l = leader_seen_by(&self.ds[i]).map_err(|e| format!("manager-{i}: {e}"))?;
                if leader.as_ref().is_some_and(|x| *x != l) {
                    return Err(format!("manager-{i} names {l}, another names {leader:?}"));
                }
                for &j in live {
                    let host = format!("manager-{j}");
                    if !seen.iter().any(|(h, s)| *h == host && (s == "Leader" || s == "reachable")) {
                        return Err(format!("manager-{i} sees {seen:?}"));
                    }
                }
                leader = Some(l);
            }
            let l = leader.ok_or("no live manager")?;
            l.trim_start_matches("manager-").parse::<usize>().map_err(|e| e.to_string())
        })
    }

    fn all(&self) -> Vec<&DaemonProcess> {
        self.ds.iter().collect()
    }
}

fn options(net: &Net, i: usize, extra_args: Vec<String>) -> DaemonOptions {
    DaemonOptions {
        listen_ip: Some(net.ip(i)),
        port: Some(PORT),
        netns: Some(net.ns(i).to_string()),
        hostname: Some(format!("manager-{i}")),
        extra_args,
        ..DaemonOptions::default()
    }
}

/// The seed of this run: `SHOAL_FAULT_SEED`, else the clock; printed so that a failure can be replayed.
fn seed(test: &str) -> u64 {
    let seed = std::env::var("SHOAL_FAULT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_nanos()).unwrap())
            .unwrap_or(1)
    });
    println!("{test}: SHOAL_FAULT_SEED={seed}");
    seed
}

/// Maps an answer to a write's outcome (see the module doc).
fn write_outcome(r: &Result<http::Response, RequestError>) -> (Outcome, String) {
    match r {
        Ok(resp) if (200..300).contains(&resp.status) => (Outcome::Ok(None), resp.status.to_string()),
        Ok(resp) if matches!(resp.status, 400 | 404 | 409) => (Outcome::Fail, format!("{} {}", resp.status, resp.body)),
        Ok(resp) => (Outcome::Unknown, format!("{} {}", resp.status, resp.body)),
        Err(RequestError::Connect(e)) => (Outcome::Fail, e.clone()),
        Err(RequestError::NoAnswer(e)) => (Outcome::Unknown, e.clone()),
    }
}

/// Reads service `key` through `socket`: the outcome (the label value, or none), and the service's JSON.
fn read(socket: &std::path::Path, key: &str) -> (Outcome, String, Option<Value>) {
    match http::request_within(socket, "GET", &format!("/v1.47/services/{key}"), None, CLIENT_TIMEOUT) {
        Ok(r) if r.status == 200 => {
            let v = r.body["Spec"]["Labels"]["v"].as_str().map(str::to_string);
            (Outcome::Ok(v), "200".into(), Some(r.body))
        }
        Ok(r) if r.status == 404 => (Outcome::Ok(None), "404".into(), None),
        Ok(r) => (Outcome::Unknown, format!("{} {}", r.status, r.body), None),
        Err(e) => (Outcome::Unknown, format!("{e:?}"), None),
    }
}

fn service_spec(key: &str, value: &str) -> Value {
    json!({
        "Name": key,
        "Labels": {"v": value},
        "TaskTemplate": {"ContainerSpec": {"Image": "busybox", "Args": ["sleep", "3600"]}},
        "Mode": {"Replicated": {"Replicas": 0}},
    })
}

/// Client threads running random operations until stopped.
struct Workload {
    stop: Arc<AtomicBool>,
    /// Writes acknowledged so far.
    acked: Arc<AtomicUsize>,
    history: Arc<History>,
    threads: Vec<std::thread::JoinHandle<()>>,
    keys: Vec<String>,
}

impl Workload {
    fn start(tag: &str, sockets: Vec<PathBuf>, seed: u64) -> Workload {
        let keys: Vec<String> = (0..KEYS).map(|k| format!("{tag}-{k}")).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(AtomicUsize::new(0));
        let history = Arc::new(History::new());
        let threads = (0..CLIENTS)
            .map(|c| {
                let (stop, acked, history, keys, sockets) =
                    (stop.clone(), acked.clone(), history.clone(), keys.clone(), sockets.clone());
                std::thread::spawn(move || {
                    let mut rng = SmallRng::seed_from_u64(seed.wrapping_add(c as u64));
                    let mut n = 0u64;
                    while !stop.load(Ordering::SeqCst) {
                        let key = &keys[rng.random_range(0..keys.len())];
                        let socket = &sockets[rng.random_range(0..sockets.len())];
                        n += 1;
                        let value = format!("c{c}-{n}");
                        let dice: f64 = rng.random();
                        let acked_write = if dice < 0.35 {
                            history.run(c, key, Op::Read, || {
                                let (o, note, _) = read(socket, key);
                                (o, note)
                            });
                            false
                        } else if dice < 0.75 {
                            // Update: read the version, then update at it (409 if someone wrote in between).
                            let mut body = None;
                            history.run(c, key, Op::Read, || {
                                let (o, note, b) = read(socket, key);
                                body = b;
                                (o, note)
                            });
                            match body {
                                Some(body) => {
                                    let mut spec = body["Spec"].clone();
                                    spec["Labels"]["v"] = value.clone().into();
                                    let path =
                                        format!("/v1.47/services/{key}/update?version={}", body["Version"]["Index"]);
                                    let out = history.run(c, key, Op::Update(value), || {
                                        write_outcome(&http::request_within(
                                            socket,
                                            "POST",
                                            &path,
                                            Some(&spec.to_string()),
                                            CLIENT_TIMEOUT,
                                        ))
                                    });
                                    matches!(out, Outcome::Ok(_))
                                }
                                None => false,
                            }
                        } else if dice < 0.92 {
                            let body = service_spec(key, &value).to_string();
                            let out = history.run(c, key, Op::Create(value), || {
                                write_outcome(&http::request_within(
                                    socket,
                                    "POST",
                                    "/v1.47/services/create",
                                    Some(&body),
                                    CLIENT_TIMEOUT,
                                ))
                            });
                            matches!(out, Outcome::Ok(_))
                        } else {
                            let path = format!("/v1.47/services/{key}");
                            let out = history.run(c, key, Op::Delete, || {
                                write_outcome(&http::request_within(socket, "DELETE", &path, None, CLIENT_TIMEOUT))
                            });
                            matches!(out, Outcome::Ok(_))
                        };
                        if acked_write {
                            acked.fetch_add(1, Ordering::SeqCst);
                        }
                        // Think time between operations: keeps the history (and the checker's search) small.
                        std::thread::sleep(Duration::from_millis(rng.random_range(5..25)));
                    }
                })
            })
            .collect();
        Workload { stop, acked, history, threads, keys }
    }

    /// Waits until `more` further writes are acknowledged (the cluster takes writes); returns how long it took.
    fn wait_acked(&self, more: usize, what: &str, deadline: Duration) -> Duration {
        let start = Instant::now();
        let target = self.acked.load(Ordering::SeqCst) + more;
        wait_until(&format!("{more} more acknowledged writes {what}"), deadline, || {
            let n = self.acked.load(Ordering::SeqCst);
            if n >= target {
                Ok(())
            } else {
                Err(format!("{n} of {target}"))
            }
        });
        start.elapsed()
    }

    /// Stops the clients, reads every service on every manager into the history, and checks it.
    fn finish(mut self, cluster: &Cluster, seed: u64) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            t.join().expect("client thread");
        }
        for (i, d) in cluster.ds.iter().enumerate() {
            for key in &self.keys {
                let out = self.history.run(100 + i, key, Op::Read, || {
                    let (o, note, _) = read(d.socket(), key);
                    (o, format!("final read on manager-{i}: {note}"))
                });
                assert!(matches!(out, Outcome::Ok(_)), "final read of {key} on manager-{i}: {out:?}");
            }
        }
        let records = self.history.records();
        match history::check(&records) {
            Ok(summary) => println!("history of {} ops is linearizable: {summary}", records.len()),
            Err(v) => panic!("SHOAL_FAULT_SEED={seed}: the history is not linearizable: {v}"),
        }
    }
}

impl Drop for Workload {
    /// Stops the clients when a test fails before `finish`.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// After the fault: one leader seen alike by all, the same stores everywhere, the history linearizable.
/// Returns the leader once the fault healed.
fn settle_and_check(cluster: &Cluster, workload: Workload, seed: u64) -> usize {
    let leader = cluster.wait_healthy(&[0, 1, 2], Duration::from_secs(30));
    workload.wait_acked(5, "after the fault healed", Duration::from_secs(20));
    workload.finish(cluster, seed);
    wait_identical(&cluster.all(), Duration::from_secs(30));
    cluster.wait_healthy(&[0, 1, 2], Duration::from_secs(10));
    leader
}

#[test]
fn kill9_of_the_leader() {
    let seed = seed("kill9_of_the_leader");
    let mut c = Cluster::start("kl");
    let w = Workload::start("kl", c.sockets(), seed);
    w.wait_acked(10, "before the fault", Duration::from_secs(20));
    let old = c.wait_healthy(&[0, 1, 2], Duration::from_secs(10));
    c.ds[old].kill9();
    let killed = Instant::now();
    let rest: Vec<usize> = (0..3).filter(|&i| i != old).collect();
    let new = c.wait_healthy(&rest, Duration::from_secs(20));
    println!("new leader manager-{new} seen by both survivors {:?} after kill -9 of manager-{old}", killed.elapsed());
    w.wait_acked(1, "after the leader died", Duration::from_secs(20));
    println!("first write acknowledged by a client {:?} after kill -9 of the leader", killed.elapsed());
    w.wait_acked(10, "with the old leader dead", Duration::from_secs(20));
    c.restart(old);
    settle_and_check(&c, w, seed);
}

#[test]
fn kill9_of_a_follower() {
    let seed = seed("kill9_of_a_follower");
    let mut c = Cluster::start("kf");
    let w = Workload::start("kf", c.sockets(), seed);
    w.wait_acked(10, "before the fault", Duration::from_secs(20));
    let leader = c.wait_healthy(&[0, 1, 2], Duration::from_secs(10));
    let f = (leader + 1) % 3;
    c.ds[f].kill9();
    w.wait_acked(10, "with a follower dead", Duration::from_secs(20));
    c.restart(f);
    settle_and_check(&c, w, seed);
}

#[test]
fn kill9_of_a_quorum_then_restart() {
    let seed = seed("kill9_of_a_quorum_then_restart");
    let mut c = Cluster::start("kq");
    let w = Workload::start("kq", c.sockets(), seed);
    w.wait_acked(10, "before the fault", Duration::from_secs(20));
    let leader = c.wait_healthy(&[0, 1, 2], Duration::from_secs(10));
    let survivor = (leader + 1) % 3;
    let killed: Vec<usize> = (0..3).filter(|&i| i != survivor).collect();
    for &i in &killed {
        c.ds[i].kill9();
    }
    // Without a quorum, a write on the survivor is refused (503) within a bounded time, never hangs.
    let (took, answer) = wait_until("a write refused by the survivor", Duration::from_secs(20), || {
        let start = Instant::now();
        let body = service_spec("kq-no-quorum", "x").to_string();
        match http::request_within(
            c.ds[survivor].socket(),
            "POST",
            "/v1.47/services/create",
            Some(&body),
            CLIENT_TIMEOUT,
        ) {
            Ok(r) if r.status == 503 => Ok((start.elapsed(), r.body.to_string())),
            other => Err(format!("{other:?}")),
        }
    });
    println!("without a quorum a write is refused in {took:?}: {answer}");
    assert!(took < Duration::from_secs(12), "refusal took {took:?}");
    for &i in &killed {
        c.restart(i);
    }
    settle_and_check(&c, w, seed);
    let names: Vec<Value> = c.ds[0].get("/v1.47/services").as_array().cloned().unwrap_or_default();
    assert!(!names.iter().any(|s| s["Spec"]["Name"] == "kq-no-quorum"), "the refused write was applied");
}

#[test]
fn kill9_of_a_follower_that_loses_its_state_and_joins_again() {
    let seed = seed("kill9_of_a_follower_that_loses_its_state");
    let mut c = Cluster::start("kw");
    let w = Workload::start("kw", c.sockets(), seed);
    w.wait_acked(10, "before the fault", Duration::from_secs(20));
    let leader = c.wait_healthy(&[0, 1, 2], Duration::from_secs(10));
    let f = (leader + 1) % 3;
    c.ds[f].kill9();
    c.ds[f].wipe_state();
    w.wait_acked(10, "with a follower dead", Duration::from_secs(20));
    // The leader refuses a join at the address of a member it still hears from; once it sees the old member
    // unreachable, the manager may come back.
    let host = format!("manager-{f}");
    wait_until("the leader sees the killed manager unreachable", Duration::from_secs(20), || {
        let seen = managers_seen_by(&c.ds[leader])?;
        if seen.iter().any(|(h, s)| *h == host && s == "unreachable") {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    });
    // It comes back at the same address with an empty state dir: it joins again (a new node and Raft ID)
    // and replaces its old, unreachable Raft member.
    let join = c.join_args(leader);
    c.ds[f].restart(&join);
    settle_and_check(&c, w, seed);
    let nodes = c.ds[leader].get("/v1.47/nodes");
    let managers = nodes.as_array().unwrap().iter().filter(|n| n["ManagerStatus"].is_object()).count();
    assert_eq!(managers, 3, "the wiped manager's old raft member is replaced: {nodes}");
}

#[test]
fn the_leader_cut_off_from_both_followers() {
    let seed = seed("the_leader_cut_off_from_both_followers");
    let c = Cluster::start("pl");
    let w = Workload::start("pl", c.sockets(), seed);
    w.wait_acked(10, "before the fault", Duration::from_secs(20));
    let old = c.wait_healthy(&[0, 1, 2], Duration::from_secs(10));
    let rest: Vec<usize> = (0..3).filter(|&i| i != old).collect();
    c.net.isolate(old);
    let cut = Instant::now();
    let new = c.wait_healthy(&rest, Duration::from_secs(20));
    assert_ne!(new, old);
    println!("partition: new leader manager-{new} seen by both followers {:?} after the cut", cut.elapsed());
    w.wait_acked(1, "after the cut", Duration::from_secs(20));
    println!("partition: first write acknowledged by a client {:?} after the cut", cut.elapsed());
    // A write through the isolated manager fails with 503 within a bounded time (its proposal cannot
    // commit; it steps down when check-quorum sees no majority).
    let start = Instant::now();
    let body = service_spec("pl-isolated", "x").to_string();
    let r = http::request_within(c.ds[old].socket(), "POST", "/v1.47/services/create", Some(&body), CLIENT_TIMEOUT);
    let took = start.elapsed();
    println!("partition: a write through the isolated manager answered in {took:?}: {r:?}");
    assert!(matches!(&r, Ok(resp) if resp.status == 503), "{r:?}");
    assert!(took < Duration::from_secs(12), "took {took:?}");
    // It has stepped down: it knows no leader, and says so at once.
    let (took, answer) =
        wait_until("the isolated manager refuses writes for want of a leader", Duration::from_secs(20), || {
            let start = Instant::now();
            match http::request_within(
                c.ds[old].socket(),
                "POST",
                "/v1.47/services/create",
                Some(&body),
                CLIENT_TIMEOUT,
            ) {
                Ok(r) if r.status == 503 && r.body.to_string().contains("no leader / lost quorum") => {
                    Ok((start.elapsed(), r.body.to_string()))
                }
                other => Err(format!("{other:?}")),
            }
        });
    println!("partition: the isolated manager-{old} stepped down; refuses a write in {took:?}: {answer}");
    assert!(took < Duration::from_secs(2), "took {took:?}");
    // Its reads are refused too (no leader confirms them), never stale.
    let r = http::request_within(c.ds[old].socket(), "GET", "/v1.47/services", None, CLIENT_TIMEOUT);
    assert!(matches!(&r, Ok(resp) if resp.status == 503), "a read on the isolated manager: {r:?}");
    let r = http::request_within(c.ds[old].socket(), "GET", "/v1.47/swarm", None, CLIENT_TIMEOUT);
    assert!(matches!(&r, Ok(resp) if resp.status == 503), "GET /swarm on the isolated manager: {r:?}");
    // `docker info` still answers there, and says why the cluster's state may be stale.
    let r = http::request_within(c.ds[old].socket(), "GET", "/v1.47/info", None, CLIENT_TIMEOUT).expect("GET /info");
    assert_eq!(r.status, 200, "{:?}", r.body);
    let error = r.body["Swarm"]["Error"].as_str().unwrap_or_default();
    assert!(error.contains("no leader"), "Swarm.Error of the isolated manager: {:?}", r.body["Swarm"]);
    w.wait_acked(5, "on the majority side", Duration::from_secs(20));
    c.net.heal(old);
    let healed = Instant::now();
    let leader = settle_and_check(&c, w, seed);
    println!("partition healed: manager-{old} rejoined as a follower, stores identical {:?} after", healed.elapsed());
    assert_ne!(leader, old, "the isolated manager came back as a follower (pre-vote: its stale log cannot win)");
    let names: Vec<Value> = c.ds[new].get("/v1.47/services").as_array().cloned().unwrap_or_default();
    assert!(!names.iter().any(|s| s["Spec"]["Name"] == "pl-isolated"), "the refused write was applied");
}

#[test]
fn a_follower_with_delayed_traffic() {
    let seed = seed("a_follower_with_delayed_traffic");
    let c = Cluster::start("dl");
    let w = Workload::start("dl", c.sockets(), seed);
    w.wait_acked(10, "before the fault", Duration::from_secs(20));
    let leader = c.wait_healthy(&[0, 1, 2], Duration::from_secs(10));
    let f = (leader + 1) % 3;
    {
        let _delay = c.net.delay(f, Duration::from_millis(200));
        // The fault is in effect: a read on the delayed follower asks the leader for its commit index (one
        // round trip through the delay, 400 ms at least).
        let start = Instant::now();
        let r = http::request_within(c.ds[f].socket(), "GET", "/v1.47/services", None, CLIENT_TIMEOUT);
        let took = start.elapsed();
        println!("a read on the delayed manager-{f} took {took:?}");
        assert!(matches!(&r, Ok(resp) if resp.status == 200), "{r:?}");
        assert!(took >= Duration::from_millis(400), "the delay is not in effect: a read took {took:?}");
        let took = w.wait_acked(20, "with a follower's traffic delayed by 200 ms", Duration::from_secs(30));
        println!("20 writes acknowledged in {took:?} with manager-{f}'s traffic delayed by 200 ms each way");
    }
    settle_and_check(&c, w, seed);
}

#[test]
fn every_manager_restarted_at_once() {
    let seed = seed("every_manager_restarted_at_once");
    let mut c = Cluster::start("ra");
    let w = Workload::start("ra", c.sockets(), seed);
    w.wait_acked(10, "before the fault", Duration::from_secs(20));
    for d in &mut c.ds {
        shoal_testkit::process::kill9(d.pid());
    }
    for d in &mut c.ds {
        d.kill9(); // reaps the killed process
    }
    let down = Instant::now();
    for i in 0..3 {
        c.restart(i);
    }
    let leader = c.wait_healthy(&[0, 1, 2], Duration::from_secs(30));
    println!("every manager killed and restarted: manager-{leader} leads {:?} later", down.elapsed());
    settle_and_check(&c, w, seed);
}
