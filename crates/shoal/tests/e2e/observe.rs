//! `shoal daemon --listen-metrics`: the Prometheus metrics scraped by Python's prometheus_client parsers while
//! 1,000 replicas deploy (tasks seen moving from pending to running), and the live page in headless Chromium
//! (a service created after the page loaded appears with its tasks without a reload; a pending task says why,
//! a failed one its error; a worker that dies turns red), with a screenshot in the target dir.

use crate::common;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;
use shoal_testkit::cdp::Browser;
use shoal_testkit::{python, DaemonOptions};

fn free_port(ip: &str) -> u16 {
    TcpListener::bind((ip, 0)).and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

/// A daemon on 127.0.0.`i` serving --listen-metrics on that IP; returns it and the metrics address.
fn daemon_with_metrics(i: u8, hostname: &str) -> (DaemonProcess, String) {
    let ip = format!("127.0.0.{i}");
    let addr = format!("{ip}:{}", free_port(&ip));
    let opts = DaemonOptions {
        listen_ip: Some(ip),
        hostname: Some(hostname.into()),
        extra_args: vec!["--listen-metrics".into(), addr.clone()],
        ..DaemonOptions::default()
    };
    (DaemonProcess::start_with(&shoal_bin(), opts), addr)
}

/// Scrapes the metrics with both of prometheus_client's parsers (OpenMetrics, strict, and the classic text
/// format) while the Docker SDK creates a 1,000-replica service, until every task runs. Prints one JSON
/// line: the samples seen (running and not-yet-running counts) and the last scrape's figures.
const SCRAPE_DURING_DEPLOY: &str = r#"
import json, os, time, urllib.request
import docker
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics
from prometheus_client.parser import text_string_to_metric_families as classic

url = os.environ["METRICS_URL"]
replicas = int(os.environ["REPLICAS"])
BEFORE_RUNNING = {"new", "pending", "assigned", "accepted", "preparing", "ready", "starting"}

fetch_ms = []

def scrape():
    started = time.monotonic()
    with urllib.request.urlopen(url, timeout=10) as r:
        content_type = r.headers.get("Content-Type", "")
        text = r.read().decode()
    fetch_ms.append((time.monotonic() - started) * 1000)
    assert content_type.startswith("application/openmetrics-text"), content_type
    families = {f.name: f for f in openmetrics(text)}
    names = {f.name for f in classic(text)}
    assert "swarm_manager_tasks_total" in names, sorted(names)
    return families

def value(families, name, suffix=""):
    return sum(s.value for s in families[name].samples if s.name == name + suffix)

def tasks_by_state(families):
    return {s.labels["state"]: s.value for s in families["swarm_manager_tasks_total"].samples}

first = scrape()
assert value(first, "swarm_manager_services_total") == 0
client = docker.DockerClient(base_url="unix://" + os.environ["SOCK"], version="1.47", timeout=60)
client.services.create("busybox", command=["sleep", "3471"], name="big",
                       mode=docker.types.ServiceMode("replicated", replicas=replicas))
samples = []
deadline = time.time() + float(os.environ["DEADLINE_S"])
while time.time() < deadline:
    fams = scrape()
    by_state = tasks_by_state(fams)
    running = by_state.get("running", 0)
    before = sum(by_state.get(s, 0) for s in BEFORE_RUNNING)
    samples.append({"running": running, "before_running": before})
    if running == replicas:
        break
    time.sleep(0.1)
last = fams
print(json.dumps({
    "samples": samples,
    "services": value(last, "swarm_manager_services_total"),
    "nodes_ready": sum(s.value for s in last["swarm_manager_nodes"].samples if s.labels["state"] == "ready"),
    "leader": value(last, "swarm_manager_leader"),
    "sessions": value(last, "swarm_dispatcher_sessions"),
    "writes": value(last, "swarm_store_write_tx_latency_seconds", "_count"),
    "scheduling_delays": value(last, "swarm_dispatcher_scheduling_delay_seconds", "_count"),
    "scheduling_delay_sum": value(last, "swarm_dispatcher_scheduling_delay_seconds", "_sum"),
    "rss": value(last, "process_resident_memory_bytes"),
    "fds": value(last, "process_open_fds"),
    "fetch_ms_max": max(fetch_ms),
    "fetch_ms_median": sorted(fetch_ms)[len(fetch_ms) // 2],
}))
"#;

#[test]
fn metrics_scraped_during_a_1000_replica_deploy_show_tasks_moving_from_pending_to_running() {
    let (d, addr) = daemon_with_metrics(1, "metrics-node");
    let replicas = 1000;
    let started = Instant::now();
    let out = python::run_script(
        SCRAPE_DURING_DEPLOY,
        &[
            ("METRICS_URL", &format!("http://{addr}/metrics")),
            ("SOCK", &d.socket().display().to_string()),
            ("REPLICAS", &replicas.to_string()),
            ("DEADLINE_S", "120"),
        ],
        Duration::from_secs(150),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the scraper failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_str(stdout.lines().last().unwrap_or("")).expect("the scraper's JSON line");
    let samples = report["samples"].as_array().expect("samples");
    let running: Vec<f64> = samples.iter().map(|s| s["running"].as_f64().unwrap()).collect();
    println!(
        "RESULT {replicas} replicas running after {:.1} s, {} scrapes (HTTP answer median {:.1} ms, max {:.1} ms); \
         scheduling delay mean {:.2} s over {} tasks",
        started.elapsed().as_secs_f64(),
        samples.len(),
        report["fetch_ms_median"].as_f64().unwrap(),
        report["fetch_ms_max"].as_f64().unwrap(),
        report["scheduling_delay_sum"].as_f64().unwrap() / report["scheduling_delays"].as_f64().unwrap().max(1.0),
        report["scheduling_delays"]
    );
    assert_eq!(running.last().copied(), Some(replicas as f64), "every replica running by the deadline: {samples:?}");
    assert!(
        samples
            .iter()
            .any(|s| s["before_running"].as_f64().unwrap() > 0.0 && s["running"].as_f64().unwrap() < replicas as f64),
        "a scrape saw tasks not yet running: {samples:?}"
    );
    assert!(running.windows(2).all(|w| w[0] <= w[1]), "running only grows during the deploy: {running:?}");
    assert_eq!(report["services"], 1.0);
    assert_eq!(report["nodes_ready"], 1.0);
    assert_eq!(report["leader"], 1.0);
    assert_eq!(report["sessions"], 1.0, "the node's own agent has a session");
    assert!(report["writes"].as_f64().unwrap() > 0.0, "{report}");
    assert!(report["scheduling_delays"].as_f64().unwrap() > 0.0, "{report}");
    assert!(report["rss"].as_f64().unwrap() > 0.0 && report["fds"].as_f64().unwrap() > 0.0, "{report}");
}

/// GET `http://addr/metrics` (HTTP/1.1, `Connection: close`): the body of a 200 answer.
fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect to --listen-metrics");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("read the answer");
    let (head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_string()
}

/// The value of the sample named exactly `name_and_labels` in a scrape.
fn sample(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn a_follower_serves_the_store_and_raft_figures_but_is_not_the_leader() {
    let (leader, _) = daemon_with_metrics(221, "manager-221");
    let ip = "127.0.0.222";
    let follower_metrics = format!("{ip}:{}", free_port(ip));
    let _follower = DaemonProcess::start_with(
        &shoal_bin(),
        DaemonOptions {
            listen_ip: Some(ip.into()),
            hostname: Some("manager-222".into()),
            extra_args: vec![
                "--join-addr".into(),
                leader.remote_addr(),
                "--join-token".into(),
                shoal_testkit::managers::join_token(&leader, "Manager"),
                "--listen-metrics".into(),
                follower_metrics.clone(),
            ],
            ..DaemonOptions::default()
        },
    );
    shoal_testkit::managers::create_service(&leader, "seen", 2, &["sleep", "3491"]).expect("create");
    let text = wait_until(
        "the follower's store counting both tasks running on two ready nodes",
        Duration::from_secs(60),
        || {
            let text = scrape(&follower_metrics);
            let running = sample(&text, "swarm_manager_tasks_total{state=\"running\"}");
            let ready = sample(&text, "swarm_manager_nodes{state=\"ready\"}");
            if running == Some(2.0) && ready == Some(2.0) {
                Ok(text)
            } else {
                Err(format!("running {running:?}, ready nodes {ready:?}"))
            }
        },
    );
    assert_eq!(sample(&text, "swarm_node_manager"), Some(1.0), "{text}");
    assert_eq!(sample(&text, "swarm_manager_leader"), Some(0.0), "{text}");
    assert_eq!(sample(&text, "swarm_raft_members"), Some(2.0), "{text}");
    assert_eq!(sample(&text, "swarm_manager_services_total"), Some(1.0), "{text}");
    assert_eq!(
        sample(&text, "swarm_dispatcher_sessions"),
        Some(0.0),
        "agents hold their sessions with the leader: {text}"
    );
}

fn post_json(d: &DaemonProcess, path: &str, body: &Value) {
    let r = shoal_testkit::http::request(d.socket(), "POST", path, Some(&body.to_string())).expect("request");
    assert!(r.status < 300, "POST {path}: {} {}", r.status, r.body);
}

fn create(d: &DaemonProcess, spec: Value) {
    post_json(d, "/v1.47/services/create", &spec);
}

#[test]
fn the_live_page_shows_a_service_created_after_it_loaded_and_a_worker_going_down() {
    let (m, addr) = daemon_with_metrics(211, "manager-211");
    // A node is DOWN after 3 heartbeat periods without one: 3 s at 1 s.
    let swarm = m.get("/v1.47/swarm");
    let mut spec = swarm["Spec"].clone();
    spec["Dispatcher"]["HeartbeatPeriod"] = 1_000_000_000u64.into();
    post_json(&m, &format!("/v1.47/swarm/update?version={}", swarm["Version"]["Index"]), &spec);
    let ip = "127.0.0.212";
    let worker_metrics_addr = format!("{ip}:{}", free_port(ip));
    let mut w = DaemonProcess::start_with(
        &shoal_bin(),
        DaemonOptions {
            listen_ip: Some(ip.into()),
            hostname: Some("worker-212".into()),
            extra_args: vec![
                "--join-addr".into(),
                m.remote_addr(),
                "--join-token".into(),
                shoal_testkit::managers::join_token(&m, "Worker"),
                "--listen-metrics".into(),
                worker_metrics_addr.clone(),
            ],
            ..DaemonOptions::default()
        },
    );
    wait_until("two ready nodes", Duration::from_secs(30), || {
        let nodes = m.get("/v1.47/nodes");
        let ready = nodes.as_array().map_or(0, |a| a.iter().filter(|n| n["Status"]["State"] == "ready").count());
        if ready == 2 {
            Ok(())
        } else {
            Err(format!("{ready} ready"))
        }
    });
    let wm = scrape(&worker_metrics_addr);
    assert!(wm.contains("swarm_node_manager 0") && wm.contains("process_open_fds"), "{wm}");
    assert!(!wm.contains("swarm_manager_"), "a worker serves no manager metrics: {wm}");

    let mut b = Browser::launch();
    b.navigate(&format!("http://{addr}/"));
    b.wait_for(
        "the page live with both nodes",
        "document.getElementById('conn').textContent === 'live' && \
         document.querySelectorAll('.node[data-node-state=ready]').length === 2",
        Duration::from_secs(30),
    );
    // Marks this document: a reload would lose it.
    b.eval("window.loadedOnce = 'yes'");

    let args = |a: &[&str]| -> Value { a.iter().map(|s| Value::from(*s)).collect() };
    create(
        &m,
        serde_json::json!({
            "Name": "probe",
            "TaskTemplate": {"ContainerSpec": {"Image": "busybox", "Args": args(&["sleep", "3481"])}},
            "Mode": {"Replicated": {"Replicas": 2}},
        }),
    );
    create(
        &m,
        serde_json::json!({
            "Name": "stuck",
            "TaskTemplate": {
                "ContainerSpec": {"Image": "busybox", "Args": args(&["sleep", "3482"])},
                "Placement": {"Constraints": ["node.labels.zone==nowhere"]},
            },
            "Mode": {"Replicated": {"Replicas": 1}},
        }),
    );
    create(
        &m,
        serde_json::json!({
            "Name": "crash",
            "TaskTemplate": {
                "ContainerSpec": {"Image": "busybox", "Args": args(&["sh", "-c", "exit 3"])},
                "RestartPolicy": {"Condition": "none"},
            },
            "Mode": {"Replicated": {"Replicas": 1}},
        }),
    );
    b.wait_for(
        "probe's two tasks running on the page",
        "document.querySelectorAll('.node .task.running[data-service-name=probe]').length === 2",
        Duration::from_secs(60),
    );
    let pending = b.wait_for(
        "stuck's pending task with its reason",
        "(document.querySelector('.task.pending[data-service-name=stuck] .why') || {}).textContent",
        Duration::from_secs(30),
    );
    assert!(pending.as_str().unwrap().contains("no suitable node"), "{pending}");
    let failed = b.wait_for(
        "crash's failed task with its error",
        "(document.querySelector('.task.failed[data-service-name=crash] .why') || {}).textContent",
        Duration::from_secs(60),
    );
    assert!(failed.as_str().unwrap().contains("exit"), "{failed}");
    let row = b.eval("document.querySelector('#services tr[data-service-name=probe] .count').textContent");
    assert_eq!(row, "2/2 running");
    assert_eq!(b.eval("window.loadedOnce"), "yes", "the page was not reloaded");
    let artifacts = shoal_testkit::scratch_dir().join("artifacts").join("observe");
    let shot = artifacts.join("live-page.png");
    b.screenshot(&shot);
    println!("screenshot: {}", shot.display());

    // The worker dies: its column turns red once the manager marks it down (3 missed heartbeats).
    let killed = Instant::now();
    w.kill9();
    b.wait_for(
        "worker-212 shown down",
        "(document.querySelector('.node.down .node-name') || {}).textContent === 'worker-212'",
        Duration::from_secs(30),
    );
    let to_red = killed.elapsed();
    println!(
        "RESULT the live page showed the killed worker down {:.1} s after the kill (heartbeat 1 s)",
        to_red.as_secs_f64()
    );
    assert!(to_red < Duration::from_secs(12), "down shown {to_red:?} after the kill");
    assert_eq!(b.eval("window.loadedOnce"), "yes", "the page was not reloaded");
    b.screenshot(&artifacts.join("live-page-node-down.png"));
}

#[test]
fn a_taken_metrics_address_stops_the_start_naming_the_flag_and_leaves_nothing_behind() {
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().unwrap().to_string();
    let dir = shoal_testkit::scratch_dir().join(format!("observe-taken-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let state = dir.join("state");
    let child = std::process::Command::new(shoal_bin())
        .arg("daemon")
        .args(["--executor", "process", "--listen-remote-api", &format!("127.0.0.1:{}", free_port("127.0.0.1"))])
        .arg("--state-dir")
        .arg(&state)
        .arg("--listen-control-api")
        .arg(dir.join("control.sock"))
        .args(["--listen-metrics", &addr])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn shoal daemon");
    let (ok, text) = process::wait_exit(child, Duration::from_secs(20), "shoal daemon");
    assert!(!ok, "the start should have failed:\n{text}");
    assert!(
        text.contains("--listen-metrics") && text.contains(&addr) && text.to_lowercase().contains("in use"),
        "{text}"
    );
    let left: Vec<_> = std::fs::read_dir(&state).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, vec![std::ffi::OsString::from("shoal.lock")], "a failed first start left files behind");
    assert!(!dir.join("control.sock").exists(), "a failed start left its control socket");
    std::fs::remove_dir_all(&dir).unwrap();
}
