//! The authorization matrix over real daemons: every entry point a manager opens x every identity state
//! (current manager, current worker, operator, revoked operator, demoted manager, removed node, another
//! cluster's manager) x a representative call, each decided from the cluster's current state. The entry
//! points come from the daemon itself (`GET /shoal/v1/entry-points`, the listeners that registered with its
//! authorization module) and are compared with the sockets the daemon process holds open (/proc): a listener
//! that skips the module, or one the matrix has no row for, fails the test.
//!
//! The acceptance case of issue 31: in a 3-manager cluster on 127.0.0.x, a manager's copied certificate gets
//! 403 on the TCP Engine API (`GET /swarm`, `POST /services/create`) and PERMISSION_DENIED on the gRPC port
//! within 1 s of its demotion, and again within 1 s of its `node rm --force`; its open streams (`/events`
//! over TCP, `LogBroker.ListenSubscriptions` over gRPC) are closed within 1 s too. The demoted manager is
//! stopped first (a copied certificate is what an attacker holds; the demotion of a live manager is another
//! engineer's work).

use crate::common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;
use shoal_api::ca_client::CaClient;
use shoal_api::log_broker_client::LogBrokerClient;
use shoal_api::logs_client::LogsClient;
use shoal_api::{GetRootCaCertificateRequest, ListenSubscriptionsRequest, LogSelector, SubscribeLogsRequest};
use shoal_testkit::daemon::DaemonOptions;

/// The longest a change may take to reach every entry point (issue 31's acceptance).
const WITHIN: Duration = Duration::from_secs(1);

/// Two distinct free ports of `ip`.
fn free_ports(ip: &str) -> (u16, u16) {
    let a = std::net::TcpListener::bind((ip, 0)).unwrap();
    let b = std::net::TcpListener::bind((ip, 0)).unwrap();
    (a.local_addr().unwrap().port(), b.local_addr().unwrap().port())
}

fn start(ip: &str, hostname: &str, extra: Vec<String>) -> DaemonProcess {
    DaemonProcess::start_with(
        &shoal_bin(),
        DaemonOptions {
            listen_ip: Some(ip.into()),
            hostname: Some(hostname.into()),
            extra_args: extra,
            ..DaemonOptions::default()
        },
    )
}

fn token(m: &DaemonProcess, role: &str) -> String {
    m.get("/v1.47/swarm")["JoinTokens"][role].as_str().unwrap().to_string()
}

fn node_id(d: &DaemonProcess) -> String {
    d.get("/v1.47/info")["Swarm"]["NodeID"].as_str().unwrap().to_string()
}

/// A client identity: a dir with ca.pem (this cluster's root), cert.pem and key.pem.
struct Identity {
    name: &'static str,
    dir: PathBuf,
}

/// `d`'s node certificate and key with `root` (the cluster's root certificate) as an identity.
fn copy_node_certs(name: &'static str, d: &DaemonProcess, root: &Path, base: &Path) -> Identity {
    let dir = base.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let certs = d.state_dir().join("certificates");
    std::fs::copy(root, dir.join("ca.pem")).unwrap();
    std::fs::copy(certs.join("swarm-node.crt"), dir.join("cert.pem")).unwrap();
    std::fs::copy(certs.join("swarm-node.key"), dir.join("key.pem")).unwrap();
    Identity { name, dir }
}

/// An HTTPS request with `id`'s certificate: (status, body); status 0 when there was no HTTP answer (the
/// TLS handshake was refused).
fn https(api: &str, id: &Identity, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "--max-time", "10", "-X", method, "-w", "\n%{http_code}"])
        .arg("--cacert")
        .arg(id.dir.join("ca.pem"))
        .arg("--cert")
        .arg(id.dir.join("cert.pem"))
        .arg("--key")
        .arg(id.dir.join("key.pem"));
    if let Some(b) = body {
        cmd.args(["-H", "Content-Type: application/json", "--data-binary", &b.to_string()]);
    }
    let out = cmd.arg(format!("https://{api}{path}")).output().expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// What a call came to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// Answered, or refused by the handler (it passed authorization).
    Passed,
    /// Refused by authorization with this message.
    Denied(String),
    /// No connection, TLS handshake refused, or a transport error.
    NoConnection(String),
}

impl Outcome {
    fn kind(&self) -> &'static str {
        match self {
            Outcome::Passed => "passed",
            Outcome::Denied(_) => "denied",
            Outcome::NoConnection(_) => "no connection",
        }
    }
}

fn http_outcome((code, body): (u16, String), ok: u16) -> Outcome {
    match code {
        c if c == ok => Outcome::Passed,
        403 => Outcome::Denied(body),
        0 => Outcome::NoConnection("no HTTP answer".into()),
        c => panic!("unexpected HTTP {c}: {body}"),
    }
}

fn grpc_outcome<T>(r: Result<T, tonic::Status>) -> Outcome {
    match r {
        Ok(_) => Outcome::Passed,
        Err(s) if s.code() == tonic::Code::PermissionDenied => Outcome::Denied(s.message().to_string()),
        // The transport's own failures (a handshake refused after the client thought it done, a reset).
        Err(s) if matches!(s.code(), tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled) => {
            Outcome::NoConnection(format!("{s:?}"))
        }
        // Unimplemented would mean the call is not served here: the matrix must pick another.
        Err(s) if s.code() == tonic::Code::Unimplemented => panic!("a call of the matrix is not served: {s:?}"),
        Err(_) => Outcome::Passed,
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// A gRPC channel to `addr` with `id`'s certificate (and this cluster's root for the server).
async fn channel(addr: &str, id: &Identity) -> Result<tonic::transport::Channel, String> {
    let read = |f: &str| std::fs::read_to_string(id.dir.join(f)).unwrap();
    let tls =
        shoal_node::NodeTls::new(&read("ca.pem"), &read("cert.pem"), &read("key.pem")).map_err(|e| e.to_string())?;
    tls.endpoint(addr).map_err(|e| e.to_string())?.connect().await.map_err(|e| format!("{e:?}"))
}

/// The representative calls, one per access level and entry point.
const CALLS: [&str; 5] = [
    "engine-api-tcp GET /swarm",
    "engine-api-tcp POST /services/create",
    "remote-grpc Logs.SubscribeLogs (managers)",
    "remote-grpc LogBroker.ListenSubscriptions (nodes)",
    "remote-grpc CA.GetRootCACertificate (anyone)",
];

/// Every call of `CALLS` with `id`; a service created is named `authz-{id.name}-{n}`.
fn row(rt: &tokio::runtime::Runtime, api: &str, grpc: &str, id: &Identity, n: u32) -> Vec<Outcome> {
    let service = serde_json::json!({
        "Name": format!("authz-{}-{n}", id.name),
        "TaskTemplate": {"ContainerSpec": {"Image": "busybox", "Args": ["sleep", "3600"]}},
        "Mode": {"Replicated": {"Replicas": 0}},
    });
    let mut out = vec![
        http_outcome(https(api, id, "GET", "/v1.41/swarm", None), 200),
        http_outcome(https(api, id, "POST", "/v1.41/services/create", Some(&service)), 201),
    ];
    out.extend(rt.block_on(async {
        let ch = match channel(grpc, id).await {
            Ok(ch) => ch,
            Err(e) => return vec![Outcome::NoConnection(e); 3],
        };
        vec![
            grpc_outcome(
                LogsClient::new(ch.clone())
                    .subscribe_logs(SubscribeLogsRequest {
                        selector: Some(LogSelector { service_ids: vec!["authz-none".into()], ..Default::default() }),
                        options: None,
                    })
                    .await,
            ),
            grpc_outcome(LogBrokerClient::new(ch.clone()).listen_subscriptions(ListenSubscriptionsRequest {}).await),
            grpc_outcome(CaClient::new(ch).get_root_ca_certificate(GetRootCaCertificateRequest {}).await),
        ]
    }));
    out
}

/// Checks `id`'s row against `want` (one of "passed", "denied", "no connection" per call), and that each
/// denial's message contains `why`; on a mismatch, says which cell.
fn check_row(rt: &tokio::runtime::Runtime, api: &str, grpc: &str, id: &Identity, n: u32, want: [&str; 5], why: &str) {
    let got = row(rt, api, grpc, id, n);
    for ((call, outcome), want) in CALLS.iter().zip(&got).zip(want) {
        assert_eq!(outcome.kind(), want, "{} x {call}: {outcome:?}", id.name);
        if let Outcome::Denied(msg) = outcome {
            assert!(msg.contains(why), "{} x {call}: the refusal should say {why:?}: {msg}", id.name);
        }
    }
}

/// Polls `row` until it is `want`, then checks it once more with `check_row`. The first row that is `want`
/// must have started within `WITHIN` of `since`: a request sent from then on is decided from the new state.
/// (The row's own calls, each a curl process or a gRPC handshake, can take longer than that on a loaded
/// machine; the streams, which the server closes by itself, are timed to their end.) Returns when it started.
#[allow(clippy::too_many_arguments)]
fn row_within(
    rt: &tokio::runtime::Runtime,
    api: &str,
    grpc: &str,
    id: &Identity,
    n: &std::cell::Cell<u32>,
    since: Instant,
    want: [&str; 5],
    why: &str,
) -> Duration {
    loop {
        n.set(n.get() + 1);
        let started = since.elapsed();
        assert!(started <= WITHIN, "{}: still not {want:?} {started:?} after the change", id.name);
        let got = row(rt, api, grpc, id, n.get());
        let kinds: Vec<&str> = got.iter().map(Outcome::kind).collect();
        if kinds == want {
            n.set(n.get() + 1);
            check_row(rt, api, grpc, id, n.get(), want, why);
            return started;
        }
        eprintln!("{}: {started:?} after the change: {got:?}", id.name);
    }
}

/// The services whose names start with `authz-`.
fn authz_services(m: &DaemonProcess) -> BTreeSet<String> {
    service_names(m).into_iter().filter(|n| n.starts_with("authz-")).collect()
}

/// The addresses (`IP:PORT`, socket paths) the process `pid` listens on, from /proc.
fn listening(pid: i32) -> BTreeSet<String> {
    let mut inodes = BTreeSet::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().flatten() {
        if let Ok(target) = std::fs::read_link(fd.path()) {
            let t = target.to_string_lossy().to_string();
            if let Some(i) = t.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) {
                inodes.insert(i.to_string());
            }
        }
    }
    let mut out = BTreeSet::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 || f[3] != "0A" || !inodes.contains(f[9]) {
                continue;
            }
            let (ip, port) = f[1].split_once(':').unwrap();
            let port = u16::from_str_radix(port, 16).unwrap();
            let ip = if ip.len() == 8 {
                let n = u32::from_str_radix(ip, 16).unwrap();
                std::net::IpAddr::from(std::net::Ipv4Addr::from(n.swap_bytes()))
            } else {
                let mut b = [0u8; 16];
                for (i, chunk) in b.chunks_mut(4).enumerate() {
                    let word = u32::from_str_radix(&ip[i * 8..i * 8 + 8], 16).unwrap().swap_bytes();
                    chunk.copy_from_slice(&word.to_be_bytes());
                }
                std::net::IpAddr::from(std::net::Ipv6Addr::from(b))
            };
            out.insert(std::net::SocketAddr::new(ip, port).to_string());
        }
    }
    let unix = std::fs::read_to_string(format!("/proc/{pid}/net/unix")).unwrap_or_default();
    for line in unix.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        // Flags 00010000: a listening socket.
        if f.len() >= 8 && f[3] == "00010000" && inodes.contains(f[6]) {
            out.insert(f[7].to_string());
        }
    }
    out
}

#[test]
fn every_entry_point_decides_from_the_current_cluster_state() {
    let (ip1, ip2, ip3, ipw, ipf) = ("127.0.0.131", "127.0.0.132", "127.0.0.133", "127.0.0.134", "127.0.0.135");
    let (api_port, metrics_port) = free_ports(ip1);
    let (api, metrics) = (format!("{ip1}:{api_port}"), format!("{ip1}:{metrics_port}"));
    let base = tempfile::tempdir().unwrap();
    let swarmkit_sock = base.path().join("swarmkit.sock");
    let m1 = start(
        ip1,
        "authz-m1",
        vec![
            "--listen-api".into(),
            format!("tcp://{api}"),
            "--listen-metrics".into(),
            metrics.clone(),
            "--listen-swarmkit-api".into(),
            swarmkit_sock.display().to_string(),
        ],
    );
    let join = |ip: &str, name: &str, role: &str| {
        start(ip, name, vec!["--join-addr".into(), m1.remote_addr(), "--join-token".into(), token(&m1, role)])
    };
    // A follower with its own TCP Engine API: the changes reach it through Raft.
    let api2 = format!("{ip2}:{}", free_ports(ip2).0);
    let _m2 = start(
        ip2,
        "authz-m2",
        vec![
            "--join-addr".into(),
            m1.remote_addr(),
            "--join-token".into(),
            token(&m1, "Manager"),
            "--listen-api".into(),
            format!("tcp://{api2}"),
        ],
    );
    let mut m3 = join(ip3, "authz-m3", "Manager");
    let w = join(ipw, "authz-w", "Worker");
    let foreign = start(ipf, "authz-foreign", vec![]);
    wait_until("four ready nodes with three managers", Duration::from_secs(60), || {
        let nodes = m1.get("/v1.47/nodes");
        let nodes = nodes.as_array().cloned().unwrap_or_default();
        let ready = nodes.iter().filter(|n| n["Status"]["State"] == "ready").count();
        let managers = nodes.iter().filter(|n| n["ManagerStatus"]["Reachability"] == "reachable").count();
        if ready == 4 && managers == 3 {
            Ok(())
        } else {
            Err(format!("{nodes:?}"))
        }
    });

    // The identities: node certificates copied out of the state dirs, an operator's from the CLI.
    let root = m1.state_dir().join("certificates/swarm-root-ca.crt");
    let manager = copy_node_certs("manager", &m1, &root, base.path());
    let worker = copy_node_certs("worker", &w, &root, base.path());
    let leaving = copy_node_certs("demoted", &m3, &root, base.path());
    let other = copy_node_certs("foreign", &foreign, &root, base.path());
    let issue = |name: &'static str| {
        let dir = base.path().join(name);
        let out = shoal_cli(m1.socket(), &["ca", "issue-client-cert", "--name", name, "--out", dir.to_str().unwrap()]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        Identity { name, dir }
    };
    let operator = issue("operator");
    let revoked = issue("revoked");

    let grpc = m1.remote_addr();
    let rt = rt();
    let n = std::cell::Cell::new(0);
    let next = || {
        n.set(n.get() + 1);
        n.get()
    };
    const ALL: [&str; 5] = ["passed"; 5];
    check_row(&rt, &api, &grpc, &manager, next(), ALL, "");
    check_row(&rt, &api, &grpc, &worker, next(), ["denied", "denied", "denied", "passed", "passed"], "worker");
    check_row(&rt, &api, &grpc, &operator, next(), ["passed", "passed", "denied", "denied", "passed"], "operator");
    check_row(&rt, &api, &grpc, &leaving, next(), ALL, "");
    check_row(&rt, &api, &grpc, &other, next(), ["no connection"; 5], "");
    // The operator endpoints are the control socket's only: an operator certificate cannot mint another.
    let (code, body) = https(&api, &operator, "POST", "/shoal/v1/ca/client-cert", Some(&serde_json::json!({})));
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("control socket"), "{body}");

    // Revocation: by the certificate file, through the CLI; from its commit on, refused everywhere.
    check_row(&rt, &api, &grpc, &revoked, next(), ["passed", "passed", "denied", "denied", "passed"], "operator");
    let out =
        shoal_cli(m1.socket(), &["ca", "revoke-client-cert", "--cert", revoked.dir.join("cert.pem").to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let since = Instant::now();
    let took = row_within(
        &rt,
        &api,
        &grpc,
        &revoked,
        &n,
        since,
        ["denied", "denied", "denied", "denied", "denied"],
        "revoked",
    );
    eprintln!("revoked operator certificate refused everywhere by requests sent from {took:?} on");
    check_row(&rt, &api, &grpc, &operator, next(), ["passed", "passed", "denied", "denied", "passed"], "operator");
    // By serial, as `openssl x509 -serial` prints it (uppercase, `serial=` prefix stripped).
    let by_serial = issue("by-serial");
    check_row(&rt, &api, &grpc, &by_serial, next(), ["passed", "passed", "denied", "denied", "passed"], "operator");
    let printed = Command::new("openssl")
        .args(["x509", "-serial", "-noout", "-in"])
        .arg(by_serial.dir.join("cert.pem"))
        .output()
        .unwrap();
    let serial = String::from_utf8_lossy(&printed.stdout).trim().trim_start_matches("serial=").to_string();
    assert!(!serial.is_empty(), "{printed:?}");
    let out = shoal_cli(m1.socket(), &["ca", "revoke-client-cert", "--serial", &serial]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let since = Instant::now();
    row_within(&rt, &api, &grpc, &by_serial, &n, since, ["denied"; 5], "revoked");
    // Bad input: a 400 naming the field, and nothing revoked (the operator still passes).
    for (body, names) in [
        (serde_json::json!({"Serial": "not-hex"}), "Serial"),
        (serde_json::json!({"Serial": "ab", "Certificate": "x"}), "exactly one"),
        (serde_json::json!({}), "exactly one"),
        (serde_json::json!({"Certificate": "garbage"}), "Certificate"),
    ] {
        let r = shoal_testkit::http::request(
            m1.socket(),
            "POST",
            "/shoal/v1/ca/revoke-client-cert",
            Some(&body.to_string()),
        )
        .unwrap();
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert!(r.body["message"].as_str().unwrap_or_default().contains(names), "{body}: {}", r.body);
    }
    check_row(&rt, &api, &grpc, &operator, next(), ["passed", "passed", "denied", "denied", "passed"], "operator");
    // A node certificate is not revocable this way (it names the command that is).
    let out =
        shoal_cli(m1.socket(), &["ca", "revoke-client-cert", "--cert", worker.dir.join("cert.pem").to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("docker node rm"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    assert_eq!(https(&api2, &leaving, "GET", "/v1.41/swarm", None).0, 200, "manager 3's certificate on the follower");
    // The TCP Engine API of the follower refuses `id` (GET /swarm, POST /services/create) within `WITHIN` of
    // `since`, saying `why`.
    let follower_refuses = |id: &Identity, since: Instant, why: &str| loop {
        let started = since.elapsed();
        assert!(started <= WITHIN, "the follower still answers {} after {started:?}", id.name);
        let service = serde_json::json!({"Name": format!("authz-{}-on-m2", id.name)});
        let got = [
            https(&api2, id, "GET", "/v1.41/swarm", None),
            https(&api2, id, "POST", "/v1.41/services/create", Some(&service)),
        ];
        if got.iter().all(|(code, _)| *code == 403) {
            assert!(got.iter().all(|(_, body)| body.contains(why)), "{got:?}");
            return;
        }
        eprintln!("the follower at {started:?}: {got:?}");
    };

    // The acceptance case: manager 3 stops (its certificate copied), is demoted, then removed.
    let m3_id = node_id(&m3);
    assert!(m3.stop());
    let mut events = Command::new("curl")
        .args(["-s", "-N", "--max-time", "60"])
        .arg("--cacert")
        .arg(leaving.dir.join("ca.pem"))
        .arg("--cert")
        .arg(leaving.dir.join("cert.pem"))
        .arg("--key")
        .arg(leaving.dir.join("key.pem"))
        .arg(format!("https://{api}/v1.41/events"))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // The demotion is refused while the leader does not see the other two managers as reachable (a loaded
    // machine can cost an election, and a new leader marks its followers reachable only once they answer).
    wait_until("managers 1 and 2 reachable in the leader's view", Duration::from_secs(60), || {
        let nodes = m1.get("/v1.47/nodes");
        let nodes = nodes.as_array().cloned().unwrap_or_default();
        let reachable = nodes
            .iter()
            .filter(|n| n["ID"] != m3_id.as_str() && n["ManagerStatus"]["Reachability"] == "reachable")
            .count();
        if reachable == 2 {
            Ok(())
        } else {
            Err(format!("{nodes:?}"))
        }
    });
    let demote = docker_cli::run(m1.socket(), &["node", "demote", &m3_id]);
    assert!(demote.status.success(), "{}", String::from_utf8_lossy(&demote.stderr));
    let since = Instant::now();
    // From the change on, at once and side by side: the leader's entry points, the follower's, the stream.
    std::thread::scope(|scope| {
        let leader = scope.spawn(|| {
            let (rt, n) = (self::rt(), std::cell::Cell::new(1000));
            let want = ["denied", "denied", "denied", "passed", "passed"];
            row_within(&rt, &api, &grpc, &leaving, &n, since, want, "demoted")
        });
        let follower = scope.spawn(|| follower_refuses(&leaving, since, "demoted"));
        wait_until("the /events stream of the demoted manager's certificate to close", WITHIN, || {
            match events.try_wait().unwrap() {
                Some(_) => Ok(()),
                None if since.elapsed() > WITHIN => Err(format!("still open after {:?}", since.elapsed())),
                None => Err("open".into()),
            }
        });
        eprintln!("the /events stream closed after {:?}", since.elapsed());
        let took = leader.join().unwrap();
        eprintln!("demoted manager's certificate refused by requests sent from {took:?} on");
        follower.join().unwrap();
    });

    // Its node stream (opened while it is a worker) is closed by the removal.
    let mut subscriptions = rt.block_on(async {
        let ch = channel(&grpc, &leaving).await.unwrap();
        LogBrokerClient::new(ch).listen_subscriptions(ListenSubscriptionsRequest {}).await.unwrap().into_inner()
    });
    let removed = wait_until("docker node rm --force of the demoted manager", Duration::from_secs(30), || {
        let out = docker_cli::run(m1.socket(), &["node", "rm", "--force", &m3_id]);
        if out.status.success() {
            Ok(Instant::now())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).to_string())
        }
    });
    std::thread::scope(|scope| {
        let leader = scope.spawn(|| {
            let (rt, n) = (self::rt(), std::cell::Cell::new(2000));
            row_within(&rt, &api, &grpc, &leaving, &n, removed, ["denied"; 5], "removed")
        });
        let follower = scope.spawn(|| follower_refuses(&leaving, removed, "removed"));
        let ended = rt.block_on(async {
            let left = WITHIN.saturating_sub(removed.elapsed());
            tokio::time::timeout(left + Duration::from_millis(1), subscriptions.message()).await
        });
        match ended {
            Ok(Err(s)) => {
                assert_eq!(s.code(), tonic::Code::PermissionDenied, "{s:?}");
                assert!(s.message().contains("removed"), "{s:?}");
            }
            other => {
                panic!("the removed node's ListenSubscriptions stream was not closed within {WITHIN:?}: {other:?}")
            }
        }
        eprintln!("the ListenSubscriptions stream closed after {:?}", removed.elapsed());
        let took = leader.join().unwrap();
        eprintln!("removed manager's certificate refused everywhere by requests sent from {took:?} on");
        follower.join().unwrap();
    });

    // Nothing the refused calls asked for happened: only the allowed rows created services.
    let created = authz_services(&m1);
    for name in &created {
        assert!(
            name.starts_with("authz-manager-")
                || name.starts_with("authz-operator-")
                || name.starts_with("authz-revoked-")
                || name.starts_with("authz-demoted-")
                || name.starts_with("authz-by-serial-"),
            "{name} was created by a refused identity; all: {created:?}"
        );
    }
    // The revoked and demoted identities created theirs only before the change: one each.
    assert_eq!(created.iter().filter(|s| s.starts_with("authz-revoked-")).count(), 1, "{created:?}");
    assert_eq!(created.iter().filter(|s| s.starts_with("authz-demoted-")).count(), 1, "{created:?}");
    assert_eq!(created.iter().filter(|s| s.starts_with("authz-by-serial-")).count(), 1, "{created:?}");

    // Every listener the daemon holds registered with the module, and each has its row here.
    let registered = shoal_testkit::http::request(m1.socket(), "GET", "/shoal/v1/entry-points", None).unwrap();
    assert_eq!(registered.status, 200, "{}", registered.body);
    let registered: Vec<Value> = registered.body.as_array().cloned().unwrap_or_default();
    let addresses: BTreeSet<String> =
        registered.iter().map(|e| e["Address"].as_str().unwrap_or_default().to_string()).collect();
    let open = listening(m1.pid());
    assert_eq!(open, addresses, "the daemon's listening sockets and the entry points that registered differ");
    for e in &registered {
        let (name, address, guard) =
            (e["Name"].as_str().unwrap(), e["Address"].as_str().unwrap(), e["Guard"].as_str().unwrap());
        match name {
            // Driven by the rows above.
            "remote-grpc" => assert_eq!((address, guard), (grpc.as_str(), "CertificateAndClusterState")),
            "engine-api-tcp" => assert_eq!((address, guard), (api.as_str(), "CertificateAndClusterState")),
            // Local sockets: their file mode is the access control (the local root user is the operator).
            "control-socket" | "swarmkit-socket" => {
                use std::os::unix::fs::PermissionsExt;
                assert_eq!(guard, "SocketFileMode", "{e}");
                let mode = std::fs::metadata(address).unwrap().permissions().mode();
                assert_eq!(mode & 0o007, 0, "{address} is open to other users: {mode:o}");
            }
            // Docker's overlay gossip: a message not sealed with the cluster's gossip keys gets nothing back
            // (the engine tests show the keyed side: crates/shoal/tests/e2e/engine_worker.rs).
            "overlay-gossip" => {
                assert_eq!(guard, "GossipKey", "{e}");
                use std::io::{Read, Write};
                let unsealed = [6u8, 0x83, 0xa5, b'N', b'o', b'd', b'e', b's', 0x00];
                let mut wrong_key = vec![10u8, 0, 0, 0, 45, 1];
                wrong_key.extend_from_slice(&[7u8; 44]);
                for attempt in [&unsealed[..], &wrong_key[..]] {
                    let mut conn = std::net::TcpStream::connect(address).unwrap();
                    conn.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                    conn.write_all(attempt).unwrap();
                    let mut answer = Vec::new();
                    let _ = conn.read_to_end(&mut answer);
                    assert!(answer.is_empty(), "the gossip member answered {attempt:?} with {answer:?}");
                }
            }
            // Unauthenticated by design: it must serve nothing sensitive.
            "metrics" => {
                assert_eq!((address, guard), (metrics.as_str(), "None"));
                let out = Command::new("curl").args(["-s", &format!("http://{metrics}/metrics")]).output().unwrap();
                let body = String::from_utf8_lossy(&out.stdout);
                assert!(body.contains("swarm_"), "no metrics: {body}");
                for secret in [token(&m1, "Worker"), token(&m1, "Manager"), "PRIVATE KEY".to_string()] {
                    assert!(!body.contains(&secret), "the metrics listener shows {secret}");
                }
            }
            other => panic!(
                "entry point {other} ({address}, {guard}) has no row in this matrix: make it ask node/src/authz.rs and \
                 add its calls here"
            ),
        }
    }
}
