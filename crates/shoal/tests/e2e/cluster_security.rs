//! A secured cluster of separate daemon processes on 127.0.0.x: one manager and two workers that joined
//! with the worker token (roles, a replicated service spread over all three, a worker restart that resumes
//! its identity, draining a worker moves its tasks), and everything that must be refused with a clear error and no
//! state change: a wrong token, a rotated-away token, a token for another root CA, plain TCP and TLS without a
//! certificate, a worker certificate calling a manager-only RPC, another cluster's certificate, a removed node coming
//! back.

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::Value;
use shoal_api::dispatcher_client::DispatcherClient;
use shoal_api::raft_client::RaftClient;
use shoal_api::{HeartbeatRequest, ResolveAddressRequest};
use shoal_testkit::daemon::DaemonOptions;

fn manager(ip: u8) -> DaemonProcess {
    DaemonProcess::start_with(
        &shoal_bin(),
        DaemonOptions {
            listen_ip: Some(format!("127.0.0.{ip}")),
            hostname: Some(format!("manager-{ip}")),
            ..DaemonOptions::default()
        },
    )
}

fn token(m: &DaemonProcess, role: &str) -> String {
    m.get("/v1.47/swarm")["JoinTokens"][role].as_str().unwrap().to_string()
}

fn worker(ip: u8, m: &DaemonProcess) -> DaemonProcess {
    DaemonProcess::start_with(
        &shoal_bin(),
        DaemonOptions {
            listen_ip: Some(format!("127.0.0.{ip}")),
            hostname: Some(format!("worker-{ip}")),
            extra_args: vec!["--join-addr".into(), m.remote_addr(), "--join-token".into(), token(m, "Worker")],
            ..DaemonOptions::default()
        },
    )
}

fn nodes(m: &DaemonProcess) -> Vec<Value> {
    m.get("/v1.47/nodes").as_array().cloned().unwrap_or_default()
}

/// (hostname, role, state) of every node, sorted.
fn node_table(m: &DaemonProcess) -> Vec<(String, String, String)> {
    let mut v: Vec<_> = nodes(m)
        .iter()
        .map(|n| {
            let s = |v: &Value| v.as_str().unwrap_or("").to_string();
            (s(&n["Description"]["Hostname"]), s(&n["Spec"]["Role"]), s(&n["Status"]["State"]))
        })
        .collect();
    v.sort();
    v
}

/// Runs `shoal daemon --join-addr ... --join-token token` on a fresh state dir and returns its exit status
/// and output; it must exit by itself (a refused join) within 30 s.
fn refused_join(addr: &str, token: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(shoal_bin())
        .args(["daemon", "--state-dir"])
        .arg(dir.path().join("state"))
        .arg("--listen-control-api")
        .arg(dir.path().join("control.sock"))
        .args([
            "--listen-remote-api",
            "127.0.0.99:0",
            "--executor",
            "process",
            "--join-addr",
            addr,
            "--join-token",
            token,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    process::wait_exit(child, Duration::from_secs(30), "a join with a bad token")
}

/// Waits (30 s at most) until `ok`; on timeout panics with `what` and `show()`.
fn until(what: &str, mut ok: impl FnMut() -> bool, show: impl Fn() -> String) {
    wait_until(what, Duration::from_secs(30), || if ok() { Ok(()) } else { Err(show()) });
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

fn node_tls(state_dir: &Path) -> shoal_node::NodeTls {
    shoal_node::load_certs(state_dir).unwrap().expect("certificates in the state dir").tls().unwrap()
}

#[test]
fn one_manager_two_workers_run_a_service_together() {
    let m = manager(31);
    let w1 = worker(32, &m);
    let _w2 = worker(33, &m);
    until(
        "three ready nodes",
        || node_table(&m).iter().filter(|n| n.2 == "ready").count() == 3,
        || format!("{:?}", node_table(&m)),
    );
    assert_eq!(
        node_table(&m),
        vec![
            ("manager-31".into(), "manager".into(), "ready".into()),
            ("worker-32".into(), "worker".into(), "ready".into()),
            ("worker-33".into(), "worker".into(), "ready".into()),
        ]
    );
    // Key and certificates are private.
    for f in ["swarm-node.key", "swarm-node.crt", "swarm-root-ca.crt"] {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(w1.state_dir().join("certificates").join(f)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{f}");
    }
    // A worker's control socket refuses cluster commands.
    let r = shoal_testkit::http::request(w1.socket(), "GET", "/v1.47/nodes", None).unwrap();
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(r.body["message"].as_str().unwrap().contains("not a swarm manager"), "{}", r.body);

    // A replicated service spreads over all three nodes.
    let body = serde_json::json!({
        "Name": "web",
        "TaskTemplate": {"ContainerSpec": {"Image": "busybox", "Args": ["sleep", "3541"]}},
        "Mode": {"Replicated": {"Replicas": 6}},
    });
    let r =
        shoal_testkit::http::request(m.socket(), "POST", "/v1.47/services/create", Some(&body.to_string())).unwrap();
    assert_eq!(r.status, 201, "{}", r.body);
    let running_nodes = |m: &DaemonProcess| {
        let mut ids: Vec<String> = tasks_of(m, "web")
            .iter()
            .filter(|t| state(t) == "running")
            .map(|t| t["NodeID"].as_str().unwrap_or("").to_string())
            .collect();
        let count = ids.len();
        ids.sort();
        ids.dedup();
        (count, ids.len())
    };
    until("6 running tasks on 3 nodes", || running_nodes(&m) == (6, 3), || format!("{:?}", running_nodes(&m)));

    // A worker restarted without --join-* keeps its identity and runs tasks again.
    let w1_id = w1.get("/v1.47/info")["Swarm"]["NodeID"].as_str().unwrap().to_string();
    let mut w1 = w1;
    assert!(w1.stop());
    w1.restart(&[]);
    assert_eq!(w1.get("/v1.47/info")["Swarm"]["NodeID"], w1_id.as_str());
    until("6 running tasks on 3 nodes", || running_nodes(&m) == (6, 3), || format!("{:?}", running_nodes(&m)));
    assert_eq!(nodes(&m).len(), 3, "no new node object after the restart");

    // Draining a worker moves its tasks to the other nodes.
    // (Read-modify-write like `docker node update`; the agent's session may bump the version in between.)
    wait_until("the drain to be written", Duration::from_secs(30), || {
        let n = m.get(&format!("/v1.47/nodes/{w1_id}"));
        let version = n["Version"]["Index"].as_u64().unwrap();
        let mut spec = n["Spec"].clone();
        spec["Availability"] = "drain".into();
        let path = format!("/v1.47/nodes/{w1_id}/update?version={version}");
        let r = shoal_testkit::http::request(m.socket(), "POST", &path, Some(&spec.to_string())).unwrap();
        match r.status {
            200..=299 => Ok(()),
            409 => Err(r.body.to_string()),
            other => panic!("{other} {}", r.body),
        }
    });
    let on_w1 = |m: &DaemonProcess| {
        tasks_of(m, "web").iter().filter(|t| t["NodeID"] == w1_id.as_str() && state(t) == "running").count()
    };
    until(
        "the drained worker's tasks to move",
        || on_w1(&m) == 0 && running_nodes(&m) == (6, 2),
        || format!("{} on the drained node, {:?}", on_w1(&m), running_nodes(&m)),
    );
}

#[test]
fn refusals_are_clear_and_change_nothing() {
    let m = manager(41);
    let addr = m.remote_addr();
    let worker_token = token(&m, "Worker");
    let node_count = |m: &DaemonProcess| nodes(m).len();
    assert_eq!(node_count(&m), 1);

    // Tokens: wrong secret, another root CA's digest, garbage, then a rotated-away one.
    let wrong_secret =
        format!("{}{}", &worker_token[..worker_token.len() - 1], if worker_token.ends_with('0') { '1' } else { '0' });
    let other_root = shoal_ca::generate_join_token(&[7u8; 32], &mut rand_like_rng());
    let mut cases = vec![
        (wrong_secret, "invalid join token"),
        (other_root, "does not match the join token"),
        ("SWMTKN-1-nonsense".to_string(), "invalid join token"),
    ];
    // `shoal swarm join-token` prints the token; with --rotate it replaces it first.
    let cli = |args: &[&str]| {
        let out = shoal_cli(m.socket(), args);
        assert!(out.status.success(), "shoal {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(cli(&["swarm", "join-token", "-q", "worker"]), worker_token);
    let shown = cli(&["swarm", "join-token", "worker"]);
    assert!(shown.contains(&format!("--join-addr {addr} --join-token {worker_token}")), "{shown}");
    let rotated = cli(&["swarm", "join-token", "--rotate", "-q", "worker"]);
    assert_ne!(rotated, worker_token);
    assert_eq!(token(&m, "Worker"), rotated);
    cases.push((worker_token, "invalid join token"));
    for (t, want) in &cases {
        let (ok, out) = refused_join(&addr, t);
        assert!(!ok, "join with {t} succeeded: {out}");
        assert!(out.contains(want), "join with {t}: expected {want:?} in:\n{out}");
    }
    assert_eq!(node_count(&m), 1, "refused joins created no node");

    // A real worker, then its certificate against a manager-only RPC.
    let mut w = worker(42, &m);
    until("the worker's node object", || node_count(&m) == 2, || format!("{:?}", node_table(&m)));
    let w_tls = node_tls(w.state_dir());
    let rt = rt();
    let err = rt.block_on(async {
        let ch = w_tls.endpoint(&addr).unwrap().connect().await.unwrap();
        RaftClient::new(ch).resolve_address(ResolveAddressRequest { raft_id: 1 }).await.unwrap_err()
    });
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("managers only"), "{}", err.message());

    // Plain TCP (no TLS) gets no answer; TLS without a certificate is unauthenticated.
    let plain = rt.block_on(async {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await;
        match ch {
            Err(e) => Err(e.to_string()),
            Ok(ch) => DispatcherClient::new(ch)
                .heartbeat(HeartbeatRequest { session_id: "x".into() })
                .await
                .map(|_| ())
                .map_err(|s| s.to_string()),
        }
    });
    assert!(plain.is_err(), "a plain HTTP/2 call was answered");
    let anonymous = rt.block_on(async {
        let ch = shoal_node::endpoint_trusting_root(&addr, &w_tls.root_pem()).unwrap().connect().await.unwrap();
        DispatcherClient::new(ch).heartbeat(HeartbeatRequest { session_id: "x".into() }).await.unwrap_err()
    });
    assert_eq!(anonymous.code(), tonic::Code::Unauthenticated, "{anonymous:?}");

    // Another cluster's manager certificate: the handshake fails.
    let other = manager(43);
    let other_tls = node_tls(other.state_dir());
    let foreign = rt.block_on(async {
        match other_tls.endpoint(&addr).unwrap().connect().await {
            Err(e) => Err(format!("{e:?}")),
            Ok(ch) => DispatcherClient::new(ch)
                .heartbeat(HeartbeatRequest { session_id: "x".into() })
                .await
                .map(|_| ())
                .map_err(|s| format!("{s:?}")),
        }
    });
    assert!(foreign.is_err(), "another cluster's certificate was accepted");

    // A removed node cannot come back with its old certificate.
    let w_id = w.get("/v1.47/info")["Swarm"]["NodeID"].as_str().unwrap().to_string();
    assert!(w.stop());
    let r =
        shoal_testkit::http::request(m.socket(), "DELETE", &format!("/v1.47/nodes/{w_id}?force=true"), None).unwrap();
    assert!((200..300).contains(&r.status), "{} {}", r.status, r.body);
    w.restart(&[]);
    until("the removed worker to be refused", || w.log().contains("was removed from the cluster"), || w.log());
    assert_eq!(node_count(&m), 1, "the removed node was not recreated");
}

/// A seeded generator for a token whose digest names no real root (its secret does not matter).
fn rand_like_rng() -> impl rand::CryptoRng {
    use rand::SeedableRng;
    rand::rngs::StdRng::seed_from_u64(5)
}

#[test]
fn three_managers_and_two_workers_over_mutual_tls() {
    let m1 = manager(61);
    let join_manager = |ip: u8| {
        DaemonProcess::start_with(
            &shoal_bin(),
            DaemonOptions {
                listen_ip: Some(format!("127.0.0.{ip}")),
                hostname: Some(format!("manager-{ip}")),
                extra_args: vec!["--join-addr".into(), m1.remote_addr(), "--join-token".into(), token(&m1, "Manager")],
                ..DaemonOptions::default()
            },
        )
    };
    let m2 = join_manager(62);
    let _m3 = join_manager(63);
    let w1 = worker(64, &m1);
    let _w2 = worker(65, &m1);
    let summary = |m: &DaemonProcess| {
        let mut v: Vec<(String, String, String, bool)> = nodes(m)
            .iter()
            .map(|n| {
                let s = |v: &Value| v.as_str().unwrap_or("").to_string();
                let leader = n["ManagerStatus"]["Leader"].as_bool() == Some(true);
                (s(&n["Description"]["Hostname"]), s(&n["Spec"]["Role"]), s(&n["Status"]["State"]), leader)
            })
            .collect();
        v.sort();
        v
    };
    let want = vec![
        ("manager-61".to_string(), "manager".to_string(), "ready".to_string(), true),
        ("manager-62".into(), "manager".into(), "ready".into(), false),
        ("manager-63".into(), "manager".into(), "ready".into(), false),
        ("worker-64".into(), "worker".into(), "ready".into(), false),
        ("worker-65".into(), "worker".into(), "ready".into(), false),
    ];
    // Every manager sees the same five nodes (a follower reads its replicated store).
    until("five ready nodes on m1", || summary(&m1) == want, || format!("{:?}", summary(&m1)));
    until("five ready nodes on m2", || summary(&m2) == want, || format!("{:?}", summary(&m2)));

    // A worker's `docker info` lists every manager (ID and address), as the dispatcher tells its agent.
    let mut managers: Vec<(String, String)> = nodes(&m1)
        .iter()
        .filter(|n| n["Spec"]["Role"] == "manager")
        .map(|n| {
            let s = |v: &Value| v.as_str().unwrap_or("").to_string();
            (s(&n["ID"]), s(&n["ManagerStatus"]["Addr"]))
        })
        .collect();
    managers.sort();
    assert_eq!(managers.len(), 3, "{managers:?}");
    let remote_managers = |w: &DaemonProcess| {
        let info = w.get("/v1.47/info");
        let mut v: Vec<(String, String)> = info["Swarm"]["RemoteManagers"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|p| (p["NodeID"].as_str().unwrap_or("").to_string(), p["Addr"].as_str().unwrap_or("").to_string()))
            .collect();
        v.sort();
        v
    };
    until(
        "a worker's /info to list the three managers",
        || remote_managers(&w1) == managers,
        || format!("{:?} want {managers:?}", remote_managers(&w1)),
    );

    // A service created through a follower spreads over all five nodes.
    let body = serde_json::json!({
        "Name": "wide",
        "TaskTemplate": {"ContainerSpec": {"Image": "busybox", "Args": ["sleep", "3541"]}},
        "Mode": {"Replicated": {"Replicas": 10}},
    });
    let r =
        shoal_testkit::http::request(m2.socket(), "POST", "/v1.47/services/create", Some(&body.to_string())).unwrap();
    assert_eq!(r.status, 201, "{}", r.body);
    let spread = |m: &DaemonProcess| {
        let mut ids: Vec<String> = tasks_of(m, "wide")
            .iter()
            .filter(|t| state(t) == "running")
            .map(|t| t["NodeID"].as_str().unwrap_or("").to_string())
            .collect();
        let n = ids.len();
        ids.sort();
        ids.dedup();
        (n, ids.len())
    };
    until("10 running tasks on 5 nodes", || spread(&m1) == (10, 5), || format!("{:?}", spread(&m1)));
}

/// Runs the stock docker CLI against `tcp://addr` with the client files in `certs` (ca.pem, cert.pem,
/// key.pem; `None`: no certificates, TLS verification only).
fn docker_tcp(addr: &str, certs: Option<&Path>, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new("docker");
    cmd.arg("-H").arg(format!("tcp://{addr}")).arg("--tlsverify");
    if let Some(dir) = certs {
        cmd.arg("--tlscacert").arg(dir.join("ca.pem"));
        cmd.arg("--tlscert").arg(dir.join("cert.pem"));
        cmd.arg("--tlskey").arg(dir.join("key.pem"));
    }
    cmd.args(args).env_remove("DOCKER_HOST").env_remove("DOCKER_CERT_PATH").output().expect("run docker")
}

#[test]
fn the_engine_api_over_tcp_takes_manager_and_operator_certificates_only() {
    let ip = "127.0.0.71";
    let port = std::net::TcpListener::bind((ip, 0)).unwrap().local_addr().unwrap().port();
    let api = format!("{ip}:{port}");
    let m = DaemonProcess::start_with(
        &shoal_bin(),
        DaemonOptions {
            listen_ip: Some(ip.into()),
            hostname: Some("manager-71".into()),
            extra_args: vec!["--listen-api".into(), format!("tcp://{api}")],
            ..DaemonOptions::default()
        },
    );
    let w = worker(72, &m);
    until("two nodes", || nodes(&m).len() == 2, || format!("{:?}", node_table(&m)));

    // An operator certificate from `shoal ca issue-client-cert` works with the stock docker CLI.
    let dir = tempfile::tempdir().unwrap();
    let admin = dir.path().join("admin");
    let out = shoal_cli(m.socket(), &["ca", "issue-client-cert", "--name", "ops", "--out", admin.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(admin.join("key.pem")).unwrap().permissions().mode() & 0o777, 0o600);
    }
    let ls = docker_tcp(&api, Some(&admin), &["node", "ls", "--format", "{{.Hostname}}"]);
    assert!(ls.status.success(), "{}", String::from_utf8_lossy(&ls.stderr));
    let hosts = String::from_utf8_lossy(&ls.stdout);
    assert!(hosts.contains("manager-71") && hosts.contains("worker-72"), "{hosts}");

    // The manager's own node certificate works too.
    let mgr = dir.path().join("mgr");
    std::fs::create_dir_all(&mgr).unwrap();
    let certs_dir = m.state_dir().join("certificates");
    std::fs::copy(certs_dir.join("swarm-root-ca.crt"), mgr.join("ca.pem")).unwrap();
    std::fs::copy(certs_dir.join("swarm-node.crt"), mgr.join("cert.pem")).unwrap();
    std::fs::copy(certs_dir.join("swarm-node.key"), mgr.join("key.pem")).unwrap();
    let info = docker_tcp(&api, Some(&mgr), &["info", "--format", "{{.Swarm.ControlAvailable}}"]);
    assert!(info.status.success(), "{}", String::from_utf8_lossy(&info.stderr));
    assert_eq!(String::from_utf8_lossy(&info.stdout).trim(), "true");

    // A worker's certificate is refused with 403; no certificate fails the handshake.
    let wk = dir.path().join("worker");
    std::fs::create_dir_all(&wk).unwrap();
    let wdir = w.state_dir().join("certificates");
    std::fs::copy(wdir.join("swarm-root-ca.crt"), wk.join("ca.pem")).unwrap();
    std::fs::copy(wdir.join("swarm-node.crt"), wk.join("cert.pem")).unwrap();
    std::fs::copy(wdir.join("swarm-node.key"), wk.join("key.pem")).unwrap();
    let refused = docker_tcp(&api, Some(&wk), &["node", "ls"]);
    assert!(!refused.status.success());
    let msg = String::from_utf8_lossy(&refused.stderr);
    assert!(msg.contains("worker certificates are refused"), "{msg}");
    let anonymous = docker_tcp(&api, None, &["node", "ls"]);
    assert!(!anonymous.status.success(), "no certificate: {}", String::from_utf8_lossy(&anonymous.stdout));
}
