//! The swarm lifecycle as a Docker user drives it with the stock docker CLI: `--no-init` daemons are in no
//! swarm until `docker swarm init` or `docker swarm join`, and `docker swarm leave` takes them out again.
//!
//! - Init, join, leave: a `--no-init` daemon reports inactive and refuses cluster commands with Docker's
//!   message; `docker swarm init` (with a spec option) makes it a one-node swarm's manager; a second
//!   `--no-init` daemon joins with the worker token and is Ready; `docker swarm leave` on it makes it
//!   inactive (also after a restart without `--no-init`) and the manager sees it Down; the last manager
//!   refuses to leave without `--force`, then leaves with it.
//! - Nodes started together: a worker started with `--join-addr` while its manager is down keeps trying
//!   (saying so in its log) and joins once the manager is back; a wrong token fails at once.

mod common;

use std::time::{Duration, Instant};

use common::*;
use shoal_testkit::DaemonOptions;

fn daemon_at(i: u8, hostname: &str, extra: &[&str]) -> DaemonProcess {
    DaemonProcess::start_with(
        &shoal_bin(),
        DaemonOptions {
            listen_ip: Some(format!("127.0.0.{i}")),
            hostname: Some(hostname.into()),
            extra_args: extra.iter().map(|s| s.to_string()).collect(),
            ..DaemonOptions::default()
        },
    )
}

/// `docker ARGS` on `d`: its exit status, stdout and stderr.
fn docker_out(d: &DaemonProcess, args: &[&str]) -> (bool, String, String) {
    let out = docker_cli::run(d.socket(), args);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn local_state(d: &DaemonProcess) -> String {
    docker(d, &["info", "--format", "{{.Swarm.LocalNodeState}}"]).trim().to_string()
}

/// The `docker node ls` row of `host` as `m` prints it.
fn node_row(m: &DaemonProcess, host: &str) -> Result<String, String> {
    let (ok, out, err) = docker_out(m, &["node", "ls"]);
    if !ok {
        return Err(err);
    }
    out.lines().find(|l| l.contains(host)).map(str::to_string).ok_or_else(|| format!("no {host} in:\n{out}"))
}

#[test]
fn no_init_daemons_init_join_and_leave_with_the_docker_cli() {
    if no_docker_cli() {
        return;
    }
    let mut m = daemon_at(41, "life-manager", &["--no-init"]);
    assert_eq!(local_state(&m), "inactive");
    let (ok, _, err) = docker_out(&m, &["service", "ls"]);
    assert!(!ok);
    assert!(
        err.contains(r#"This node is not a swarm manager. Use "docker swarm init" or "docker swarm join" to connect this node to swarm and try again."#),
        "{err}"
    );
    let (ok, _, err) = docker_out(&m, &["swarm", "leave"]);
    assert!(!ok && err.contains("This node is not part of a swarm"), "{err}");
    // What Shoal cannot honour is refused, naming it, and nothing changes.
    let (ok, _, err) = docker_out(&m, &["swarm", "init", "--listen-addr", &m.remote_addr(), "--data-path-port", "4790"]);
    assert!(!ok && err.contains("DataPathPort"), "{err}");
    assert_eq!(local_state(&m), "inactive");

    let addr = m.remote_addr();
    let out = docker(&m, &["swarm", "init", "--listen-addr", &addr, "--advertise-addr", &addr, "--dispatcher-heartbeat", "1s"]);
    assert!(out.contains("Swarm initialized: current node (") && out.contains("is now a manager"), "{out}");
    assert!(out.contains("docker swarm join --token SWMTKN-1-") && out.contains(&addr), "{out}");
    assert_eq!(local_state(&m), "active");
    let heartbeat = docker(&m, &["info", "--format", "{{.Swarm.Cluster.Spec.Dispatcher.HeartbeatPeriod}}"]);
    assert_eq!(heartbeat.trim(), "1s", "the init's spec option applies");
    let row = node_row(&m, "life-manager").unwrap();
    assert!(row.contains("Ready") && row.contains("Leader") && row.contains('*'), "{row}");
    let (ok, _, err) = docker_out(&m, &["swarm", "init"]);
    assert!(!ok && err.contains("This node is already part of a swarm."), "{err}");

    let mut w = daemon_at(42, "life-worker", &["--no-init"]);
    assert_eq!(local_state(&w), "inactive");
    let token = docker(&m, &["swarm", "join-token", "-q", "worker"]).trim().to_string();
    let out = docker(&w, &["swarm", "join", "--token", &token, "--listen-addr", &w.remote_addr(), &addr]);
    assert!(out.contains("This node joined a swarm as a worker."), "{out}");
    assert_eq!(local_state(&w), "active");
    wait_until("the worker Ready on the manager", Duration::from_secs(30), || {
        node_row(&m, "life-worker").and_then(|r| if r.contains("Ready") { Ok(()) } else { Err(r) })
    });

    let out = docker(&w, &["swarm", "leave"]);
    assert!(out.contains("Node left the swarm."), "{out}");
    assert_eq!(local_state(&w), "inactive");
    let (ok, _, err) = docker_out(&w, &["node", "ls"]);
    assert!(!ok && err.contains("docker swarm init"), "{err}");
    wait_until("the worker Down on the manager", Duration::from_secs(30), || {
        node_row(&m, "life-worker").and_then(|r| if r.contains("Down") { Ok(()) } else { Err(r) })
    });
    let left: Vec<String> = std::fs::read_dir(w.state_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(!left.iter().any(|n| n == "certificates" || n == "node.json"), "cluster state removed: {left:?}");
    // A node that left stays out of every swarm on a restart, even without --no-init.
    w.stop();
    w.restart(&[]);
    assert_eq!(local_state(&w), "inactive");

    let (ok, _, err) = docker_out(&m, &["swarm", "leave"]);
    assert!(!ok, "the last manager does not leave without --force");
    assert!(
        err.contains("You are attempting to leave the swarm on a node that is participating as a manager. Removing the last manager erases all current state of the swarm. Use `--force` to ignore this message."),
        "{err}"
    );
    assert_eq!(local_state(&m), "active");
    let out = docker(&m, &["swarm", "leave", "--force"]);
    assert!(out.contains("Node left the swarm."), "{out}");
    assert_eq!(local_state(&m), "inactive");
    // And it can start a new swarm again.
    docker(&m, &["swarm", "init", "--listen-addr", &addr, "--advertise-addr", &addr]);
    assert_eq!(local_state(&m), "active");
    m.stop();
    m.restart(&[]);
    assert_eq!(local_state(&m), "active", "a restart keeps the swarm it initialized");
}

#[test]
fn a_worker_started_before_its_manager_joins_once_the_manager_is_up() {
    let mut m = daemon_at(43, "life-late-manager", &[]);
    let token = shoal_testkit::managers::join_token(&m, "Worker");
    let addr = m.remote_addr();
    // A wrong secret with the right root digest: refused by the CA at once, no retries.
    let mut bad = token.clone();
    bad.truncate(bad.len() - 4);
    bad.push_str("zzzz");
    let mut probe = daemon_at(44, "life-wrong-token", &["--no-init"]);
    probe.stop();
    let started = Instant::now();
    let (status, err) = probe.start_expecting_exit(
        &["--join-addr".into(), addr.clone(), "--join-token".into(), bad],
        Duration::from_secs(20),
    );
    assert!(!status.success() && err.contains("cannot join the cluster"), "{err}");
    assert!(!err.contains("retrying"), "a refused token is not retried: {err}");
    assert!(started.elapsed() < Duration::from_secs(10), "it failed at once");

    // The manager goes down; its port is held by the test, which sees the worker's first attempt arrive.
    m.stop();
    let holder = std::net::TcpListener::bind(&addr).expect("hold the manager's port");
    let worker = std::thread::spawn({
        let (addr, token) = (addr.clone(), token.clone());
        move || daemon_at(45, "life-early-worker", &["--join-addr", &addr, "--join-token", &token])
    });
    holder.set_nonblocking(true).unwrap();
    let conn = wait_until("the worker's first attempt", Duration::from_secs(30), || {
        holder.accept().map_err(|e| e.to_string())
    });
    drop(conn);
    drop(holder);
    m.restart(&[]);
    let w = worker.join().expect("the worker started");
    assert!(w.log().contains("cannot join yet; retrying"), "it said it retries:\n{}", w.log());
    wait_until("the early worker Ready", Duration::from_secs(30), || {
        let nodes = m.get("/v1.47/nodes");
        let n = nodes.as_array().unwrap().iter().find(|n| n["Description"]["Hostname"] == "life-early-worker").cloned();
        match n {
            Some(n) if n["Status"]["State"] == "ready" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
}

#[test]
fn a_manager_joins_with_the_manager_token_and_leaves_only_with_force() {
    if no_docker_cli() {
        return;
    }
    let m = daemon_at(46, "life-first", &[]);
    let token = docker(&m, &["swarm", "join-token", "-q", "manager"]).trim().to_string();
    let mut j = daemon_at(47, "life-second", &["--no-init"]);
    let out = docker(&j, &["swarm", "join", "--token", &token, "--listen-addr", &j.remote_addr(), "--availability", "drain", &m.remote_addr()]);
    assert!(out.contains("This node joined a swarm as a manager."), "{out}");
    let row = wait_until("the second manager Reachable", Duration::from_secs(30), || {
        node_row(&m, "life-second").and_then(|r| if r.contains("Reachable") { Ok(r) } else { Err(r) })
    });
    assert!(row.contains("Drain"), "the join's availability applies: {row}");
    let (ok, _, err) = docker_out(&j, &["swarm", "leave"]);
    assert!(!ok);
    assert!(
        err.contains("Removing this node leaves 1 managers out of 2. Without a Raft quorum your swarm will be inaccessible."),
        "{err}"
    );
    let out = docker(&j, &["swarm", "leave", "--force"]);
    assert!(out.contains("Node left the swarm."), "{out}");
    assert_eq!(local_state(&j), "inactive");
    j.stop();
    j.restart(&[]);
    assert_eq!(local_state(&j), "inactive");
}
