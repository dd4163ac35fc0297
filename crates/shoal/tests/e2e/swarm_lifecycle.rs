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

use crate::common;

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
    let (ok, _, err) = docker_out(&m, &["swarm", "init", "--listen-addr", &m.remote_addr(), "--data-path-port", "80"]);
    assert!(!ok && err.contains("data path port 80 is out of range: give a port from 1024 to 49151"), "{err}");
    let (ok, _, err) =
        docker_out(&m, &["swarm", "init", "--listen-addr", &m.remote_addr(), "--data-path-addr", "127.0.0.41"]);
    assert!(!ok && err.contains("invalid DataPathAddr \"127.0.0.41\": data path address must be a non-zero"), "{err}");
    assert_eq!(local_state(&m), "inactive");

    let addr = m.remote_addr();
    let out = docker(
        &m,
        &["swarm", "init", "--listen-addr", &addr, "--advertise-addr", &addr, "--dispatcher-heartbeat", "1s"],
    );
    assert!(out.contains("Swarm initialized: current node (") && out.contains("is now a manager"), "{out}");
    assert!(out.contains("docker swarm join --token SWMTKN-1-") && out.contains(&addr), "{out}");
    assert_eq!(local_state(&m), "active");
    let heartbeat = docker(&m, &["info", "--format", "{{.Swarm.Cluster.Spec.Dispatcher.HeartbeatPeriod}}"]);
    assert_eq!(heartbeat.trim(), "1s", "the init's spec option applies");
    let row = node_row(&m, "life-manager").unwrap();
    assert!(row.contains("Ready") && row.contains("Leader") && row.contains('*'), "{row}");
    let (ok, _, err) = docker_out(&m, &["swarm", "init"]);
    assert!(!ok && err.contains("This node is already part of a swarm."), "{err}");
    // `docker swarm ca` prints the root the node's certificate chains to (rotation: tests/root_rotation.rs).
    let root = std::fs::read_to_string(m.state_dir().join("certificates/swarm-root-ca.crt")).unwrap();
    assert_eq!(docker(&m, &["swarm", "ca"]).trim(), root.trim());

    let mut w = daemon_at(42, "life-worker", &["--no-init"]);
    assert_eq!(local_state(&w), "inactive");
    let token = docker(&m, &["swarm", "join-token", "-q", "worker"]).trim().to_string();
    // A refused token: the join fails with the manager's reason, and the node stays as it was.
    let mut bad = token.clone();
    bad.truncate(bad.len() - 4);
    bad.push_str("zzzz");
    let (ok, _, err) = docker_out(&w, &["swarm", "join", "--token", &bad, "--listen-addr", &w.remote_addr(), &addr]);
    assert!(!ok && err.contains("cannot join the cluster"), "{err}");
    assert_eq!(local_state(&w), "inactive");
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
    let left: Vec<String> =
        std::fs::read_dir(w.state_dir()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert!(!left.iter().any(|n| n == "certificates" || n == "node.json"), "cluster state removed: {left:?}");
    // A node that left stays out of every swarm on a restart, even without --no-init.
    w.stop();
    w.restart(&[]);
    assert_eq!(local_state(&w), "inactive");

    let (ok, _, err) = docker_out(&m, &["swarm", "leave"]);
    assert!(!ok, "the last manager does not leave without --force");
    assert!(
        err.contains(
            "You are attempting to leave the swarm on a node that is participating as a manager. Removing the \
                      last manager erases all current state of the swarm. Use `--force` to ignore this message."
        ),
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
    let out = docker(
        &j,
        &[
            "swarm",
            "join",
            "--token",
            &token,
            "--listen-addr",
            &j.remote_addr(),
            "--availability",
            "drain",
            &m.remote_addr(),
        ],
    );
    assert!(out.contains("This node joined a swarm as a manager."), "{out}");
    let row = wait_until("the second manager Reachable", Duration::from_secs(30), || {
        node_row(&m, "life-second").and_then(|r| if r.contains("Reachable") { Ok(r) } else { Err(r) })
    });
    assert!(row.contains("Drain"), "the join's availability applies: {row}");
    let (ok, _, err) = docker_out(&j, &["swarm", "leave"]);
    assert!(!ok);
    assert!(
        err.contains(
            "Removing this node leaves 1 managers out of 2. Without a Raft quorum your swarm will be inaccessible."
        ),
        "{err}"
    );
    let out = docker(&j, &["swarm", "leave", "--force"]);
    assert!(out.contains("Node left the swarm."), "{out}");
    assert_eq!(local_state(&j), "inactive");
    j.stop();
    j.restart(&[]);
    assert_eq!(local_state(&j), "inactive");
}

#[test]
fn a_removed_worker_is_refused_and_stops_its_tasks_saying_why() {
    if no_docker_cli() {
        return;
    }
    let m = node_at(48, "life-keeper", None);
    let w = node_at(49, "life-removed", Some((&m, "Worker")));
    wait_until("the worker Ready", Duration::from_secs(30), || {
        node_row(&m, "life-removed").and_then(|r| if r.contains("Ready") { Ok(()) } else { Err(r) })
    });
    docker(
        &m,
        &[
            "service",
            "create",
            "--detach",
            "--name",
            "on-worker",
            "--replicas",
            "2",
            "--constraint",
            "node.role==worker",
            "busybox",
            "sleep",
            "3177",
        ],
    );
    wait_running(&m, "on-worker", 2, &["sleep", "3177"], Duration::from_secs(30));
    docker(&m, &["node", "rm", "--force", "life-removed"]);
    wait_until("the removed worker's tasks stopped", Duration::from_secs(30), || {
        let n = process::pids_with_cmdline(&["sleep", "3177"]).len();
        if n == 0 {
            Ok(())
        } else {
            Err(format!("{n} left"))
        }
    });
    // The agent says why; its log reaches the file a moment after the tasks are gone.
    wait_until("the removed worker's log says why", Duration::from_secs(30), || {
        let log = w.log();
        let said = log.contains("this node was removed from the swarm (docker node rm): stopping its tasks")
            && log.contains("was removed from the cluster; its certificate is no longer accepted");
        if said {
            Ok(())
        } else {
            Err(log)
        }
    });
    let (ok, out, _) = docker_out(&m, &["node", "ls"]);
    assert!(ok && !out.contains("life-removed"), "{out}");
}

#[test]
fn an_autolocked_swarm_from_init_locks_on_restart_and_leaves_only_with_force() {
    if no_docker_cli() {
        return;
    }
    let mut m = daemon_at(50, "life-locked", &["--no-init"]);
    let addr = m.remote_addr();
    let out = docker(&m, &["swarm", "init", "--autolock", "--listen-addr", &addr, "--advertise-addr", &addr]);
    assert!(out.contains("SWMKEY-1-"), "init prints the unlock key: {out}");
    m.stop();
    m.restart(&[]);
    assert_eq!(local_state(&m), "locked");
    let (ok, _, err) = docker_out(&m, &["swarm", "leave"]);
    assert!(
        !ok && err
            .contains("Swarm is encrypted and locked. Please unlock it first or use `--force` to ignore this message."),
        "{err}"
    );
    let out = docker(&m, &["swarm", "leave", "--force"]);
    assert!(out.contains("Node left the swarm."), "{out}");
    assert_eq!(local_state(&m), "inactive");
}

/// The address `d` has for the manager named `host`.
fn manager_addr_seen_by(d: &DaemonProcess, host: &str) -> Result<(String, String), String> {
    let nodes = shoal_testkit::managers::try_get(d, "/v1.47/nodes")?;
    let n = nodes
        .as_array()
        .and_then(|a| a.iter().find(|n| n["Description"]["Hostname"] == host).cloned())
        .ok_or_else(|| format!("no {host}"))?;
    let m = &n["ManagerStatus"];
    let status = if m["Leader"].as_bool() == Some(true) { "Leader" } else { m["Reachability"].as_str().unwrap_or("") };
    Ok((m["Addr"].as_str().unwrap_or("").to_string(), status.to_string()))
}

#[test]
fn a_manager_whose_address_changes_keeps_its_place_in_raft() {
    let m1 = node_at(51, "addr-m1", None);
    let mut m2 = node_at(52, "addr-m2", Some((&m1, "Manager")));
    let mut m3 = node_at(53, "addr-m3", Some((&m1, "Manager")));
    wait_until("three reachable managers", Duration::from_secs(30), || {
        let seen = shoal_testkit::managers::managers_seen_by(&m1)?;
        let ok = seen.len() == 3 && seen.iter().all(|(_, s)| s == "Leader" || s == "reachable");
        if ok {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    });
    m2.stop();
    m2.move_to("127.0.0.54");
    m2.restart(&[]);
    let new_addr = m2.remote_addr();
    for d in [&m1, &m3] {
        wait_until("the others know m2's new address, and reach it", Duration::from_secs(30), || {
            let (addr, status) = manager_addr_seen_by(d, "addr-m2")?;
            if addr == new_addr && (status == "reachable" || status == "Leader") {
                Ok(())
            } else {
                Err(format!("{addr} {status}"))
            }
        });
    }
    assert!(
        m2.log().contains("raft member address changed")
            || m1.log().contains("raft member address changed")
            || m3.log().contains("raft member address changed")
    );
    // Losing another manager now leaves m1 and m2 (at its new address): still a quorum.
    m3.kill9();
    let id = wait_until("a write with m3 gone", Duration::from_secs(30), || {
        shoal_testkit::managers::create_service(&m1, "after-move", 1, &["sleep", "3178"])
    });
    wait_until("m2 sees the write", Duration::from_secs(30), || {
        shoal_testkit::managers::try_get(&m2, &format!("/v1.47/services/{id}")).map(|_| ())
    });
}

/// The validity (not after - not before) of the node certificate in `d`'s state dir, and its role OU.
fn node_cert(d: &DaemonProcess) -> (Duration, shoal_ca::Role) {
    let pem = std::fs::read(d.state_dir().join("certificates/swarm-node.crt")).unwrap();
    let info = shoal_ca::parse_cert(&shoal_ca::parse_cert_pem_chain(&pem).unwrap()[0]).unwrap();
    (info.not_after.duration_since(info.not_before).unwrap(), info.subject.role)
}

#[test]
fn a_new_cert_expiry_applies_to_the_next_certificate_a_node_gets() {
    if no_docker_cli() {
        return;
    }
    let m = node_at(55, "expiry-m", None);
    let w = node_at(56, "expiry-w", Some((&m, "Worker")));
    let (life, role) = node_cert(&w);
    assert_eq!(role, shoal_ca::Role::Worker);
    // 90 days (the default), backdated by an hour.
    assert!(life >= Duration::from_secs(90 * 24 * 3600), "{life:?}");
    docker(&m, &["swarm", "update", "--cert-expiry", "30h"]);
    // The next certificate the worker gets (promotion renews at once) is valid 30 h (and the backdating).
    docker(&m, &["node", "promote", "expiry-w"]);
    let life = wait_until("the promoted node's manager certificate", Duration::from_secs(60), || match node_cert(&w) {
        (life, shoal_ca::Role::Manager) => Ok(life),
        other => Err(format!("{other:?}")),
    });
    let want = Duration::from_secs(31 * 3600);
    assert!(life.abs_diff(want) < Duration::from_secs(120), "issued for {life:?}, want about {want:?}");
}

/// Sends one HTTP/1.1 request on `stream` (kept alive) and reads its answer: the status and the body.
fn exchange(stream: &mut std::os::unix::net::UnixStream, method: &str, path: &str, body: &str) -> (u16, String) {
    use std::io::{BufRead, BufReader, Read, Write};
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: shoal\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send the request");
    let mut reader = BufReader::new(stream.try_clone().expect("clone the stream"));
    let mut line = String::new();
    reader.read_line(&mut line).expect("read the status line");
    let status = line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("status line {line:?}"));
    let mut length = 0;
    loop {
        line.clear();
        reader.read_line(&mut line).expect("read a header");
        if line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().expect("a content length");
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).expect("read the body");
    assert!(reader.buffer().is_empty(), "nothing follows the answer");
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Docker's SDKs keep connections open in a pool, and a CLI may connect at any moment: the control socket
/// stays bound through `swarm init`, so a keep-alive connection opened while the node was in no swarm is
/// answered by the new manager afterwards, and no connection made during the init is refused or reset.
#[test]
fn connections_held_or_made_during_swarm_init_are_answered_by_the_new_manager() {
    let d = shoal_testkit::DaemonProcess::start_with(
        &shoal_bin(),
        DaemonOptions { extra_args: vec!["--no-init".into()], ..Default::default() },
    );
    let mut held = std::os::unix::net::UnixStream::connect(d.socket()).expect("connect to the control socket");
    let (status, body) = exchange(&mut held, "GET", "/info", "");
    assert!(status == 200 && body.contains(r#""LocalNodeState":"inactive""#), "{status} {body}");

    // Connections made, one after the other, all through the init.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let socket = d.socket().to_path_buf();
    let pinger = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut failures = Vec::new();
            let mut made = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                made += 1;
                match std::os::unix::net::UnixStream::connect(&socket) {
                    Ok(mut s) => match std::panic::catch_unwind(move || exchange(&mut s, "GET", "/_ping", "")) {
                        Ok((200, _)) => {}
                        Ok((status, body)) => failures.push(format!("{status} {body}")),
                        Err(_) => failures.push("the connection broke".to_string()),
                    },
                    Err(e) => failures.push(format!("connect: {e}")),
                }
            }
            (made, failures)
        })
    };
    let addr = d.remote_addr();
    let init = format!(r#"{{"ListenAddr":"{addr}","AdvertiseAddr":"{addr}"}}"#);
    let mut conn = std::os::unix::net::UnixStream::connect(d.socket()).expect("connect to the control socket");
    let (status, body) = exchange(&mut conn, "POST", "/swarm/init", &init);
    assert_eq!(status, 200, "{body}\n{}", d.log());

    // The held connection, idle through the init, now reaches the manager.
    let (status, body) = exchange(&mut held, "GET", "/swarm", "");
    assert!(status == 200 && body.contains(r#""JoinTokens""#), "{status} {body}");
    let (status, body) = exchange(&mut held, "GET", "/info", "");
    assert!(status == 200 && body.contains(r#""LocalNodeState":"active""#), "{status} {body}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (made, failures) = pinger.join().expect("the pinger thread");
    assert!(failures.is_empty(), "{} of {made} connections made during the init failed: {failures:?}", failures.len());
}
