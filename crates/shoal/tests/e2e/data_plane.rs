//! The data plane as users drive it: three `shoal daemon`s (one manager, two workers, process executor), each
//! in its own network namespace (`shoal_testkit::netns`), so each carries its own bridges, VXLAN devices and
//! nftables table, and the overlay crosses a real (veth) underlay between them.
//!
//! `appnet` carries service `web` (two replicas of a small HTTP server answering with its task's address,
//! placed off node-2) and `client` (on node-2): the client resolves `web` (the VIP) and `tasks.web` (both
//! task addresses) through the node's resolver, and many requests to `http://web/` are answered by both tasks.
//! A service on another network resolves nothing of `web` and reaches neither its VIP nor its tasks; a task
//! of an `--internal` network has no route out while one of `appnet` reaches a node's address. Stopping the
//! daemons cleanly leaves no task namespace behind.
//!
//! Scaling: a client requesting `http://web/` in a loop while `web` goes from 2 to 10 replicas (all ten
//! answer) and back to 1 records no request that failed after its retries (within 3 s: a new task is RUNNING
//! a moment before it listens, and refuses connections meanwhile).
//! Before that it measures sequential requests per second (a new TCP connection each, Python's urllib)
//! through the VIP and straight to a task on its own node and on another node: the `RESULT RATE` lines
//! printed, the figures in BENCHMARKS.md.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::netcluster::{address_on, Cluster, PORT, PYTHON, SERVER};
use common::*;
use serde_json::{json, Value};
use shoal_testkit::managers::post_service;

const WAIT: Duration = Duration::from_secs(60);

/// Probes, by environment: `LOOKUP` names resolved (`RESULT LOOKUP name addr...` or `none`); with `WEB=n`,
/// `web` and `tasks.web` resolved once `tasks.web` has `n` addresses, then (after a first answer) 200 GETs of
/// http://web/ counted by answer; `REACH` host:port pairs connected to (2 s each). Then it sleeps.
const PROBE: &str = r#"
import collections, os, socket, time, urllib.request
def out(*a):
    print('RESULT', *a, flush=True)
def addrs(name):
    try:
        return sorted({a[4][0] for a in socket.getaddrinfo(name, 80, socket.AF_INET, socket.SOCK_STREAM)})
    except socket.gaierror:
        return []
for name in os.environ.get('LOOKUP', '').split():
    out('LOOKUP', name, ' '.join(addrs(name)) or 'none')
want6 = int(os.environ.get('WANT6', '1'))
for name in os.environ.get('LOOKUP6', '').split():
    deadline = time.time() + 30
    while True:
        try:
            found = sorted({a[4][0] for a in socket.getaddrinfo(name, 80, socket.AF_INET6, socket.SOCK_STREAM)})
        except socket.gaierror:
            found = []
        if len(found) >= want6 or time.time() > deadline:
            break
        time.sleep(0.2)
    out('LOOKUP6', name, ' '.join(found) or 'none')
want = int(os.environ.get('WEB', '0'))
if want:
    deadline = time.time() + 50
    while len(addrs('tasks.web')) < want and time.time() < deadline:
        time.sleep(0.2)
    out('VIP', ' '.join(addrs('web')))
    out('TASKS', ' '.join(addrs('tasks.web')))
    # The web tasks are RUNNING a moment before they listen: one answer first (5 s at most), then count.
    for attempt in range(50):
        try:
            urllib.request.urlopen('http://web/', timeout=3).read()
            break
        except Exception:
            time.sleep(0.1)
    seen, errors = collections.Counter(), 0
    for i in range(200):
        try:
            seen[urllib.request.urlopen('http://web/', timeout=3).read().decode()] += 1
        except Exception as e:
            errors += 1
            time.sleep(0.05)
    out('ANSWERS', ' '.join(f'{k}={v}' for k, v in sorted(seen.items())), 'errors', errors)
for target in os.environ.get('REACH', '').split():
    host, port = target.rsplit(':', 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
        out('REACH', target, 'ok')
    except OSError:
        out('REACH', target, 'fail')
out('DONE')
time.sleep(100000)
"#;

fn python_service(name: &str, network: &str, constraint: &str, replicas: u64, script: &str, env: &[String]) -> Value {
    json!({
        "Name": name,
        "TaskTemplate": {
            "ContainerSpec": {"Image": "python:latest", "Command": [PYTHON, "-S", "-c", script], "Env": env},
            "Networks": [{"Target": network}],
            "Placement": {"Constraints": [constraint]},
            "RestartPolicy": {"Condition": "none"},
        },
        "Mode": {"Replicated": {"Replicas": replicas}},
    })
}

#[test]
fn tasks_reach_a_service_by_name_across_nodes_and_only_on_their_network() {
    let mut c = Cluster::start("dp");
    c.docker(&["network", "create", "-d", "overlay", "appnet"]);
    c.docker(&["network", "create", "-d", "overlay", "othernet"]);
    c.docker(&["network", "create", "-d", "overlay", "--internal", "closed"]);

    post_service(c.manager(), &python_service("web", "appnet", "node.hostname!=node-2", 2, SERVER, &[])).unwrap();
    let web = c.running("web", 2);
    let mut web_addrs: Vec<String> = web.iter().map(|t| address_on(t, "appnet")).collect();
    web_addrs.sort();
    let vip = c.vip("web");
    let node0 = format!("{}:{PORT}", c.net.ip(0));

    // The client on node-2, which runs no web task: by name, through the VIP, over VXLAN.
    let env = vec!["WEB=2".to_string(), format!("REACH={node0}")];
    post_service(c.manager(), &python_service("client", "appnet", "node.hostname==node-2", 1, PROBE, &env)).unwrap();
    let client = c.running("client", 1);
    let r = c.results(&client[0]);
    println!("client: {r:?}");
    assert!(r.contains(&format!("VIP {vip}")), "web resolves to its VIP {vip}: {r:?}");
    assert!(r.contains(&format!("TASKS {}", web_addrs.join(" "))), "tasks.web lists {web_addrs:?}: {r:?}");
    let answers = r.iter().find(|l| l.starts_with("ANSWERS")).unwrap();
    for a in &web_addrs {
        let n: u32 = answers
            .split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{a}=")))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert!(n >= 40, "task {a} answered {n} of 200 requests: {answers}");
    }
    assert!(answers.ends_with("errors 0"), "{answers}");
    assert!(r.contains(&format!("REACH {node0} ok")), "a task of appnet reaches a node's address: {r:?}");

    // Another network: no name of web, neither its VIP nor its tasks.
    let reach: Vec<String> = std::iter::once(&vip).chain(&web_addrs).map(|a| format!("{a}:80")).collect();
    let env = vec!["LOOKUP=web tasks.web".to_string(), format!("REACH={}", reach.join(" "))];
    post_service(c.manager(), &python_service("other", "othernet", "node.hostname==node-2", 1, PROBE, &env)).unwrap();
    let other = c.running("other", 1);
    let r = c.results(&other[0]);
    println!("other: {r:?}");
    assert!(r.contains(&"LOOKUP web none".to_string()) && r.contains(&"LOOKUP tasks.web none".to_string()), "{r:?}");
    for t in &reach {
        assert!(r.contains(&format!("REACH {t} fail")), "othernet must not reach {t}: {r:?}");
    }

    // An internal network: no route out.
    let env = vec![format!("REACH={node0}")];
    post_service(c.manager(), &python_service("inside", "closed", "node.hostname==node-1", 1, PROBE, &env)).unwrap();
    let inside = c.running("inside", 1);
    let r = c.results(&inside[0]);
    assert!(r.contains(&format!("REACH {node0} fail")), "an internal network has no route out: {r:?}");

    // A clean stop of every daemon leaves no task namespace.
    for d in &mut c.ds {
        assert!(d.stop(), "the daemon stops cleanly");
        // Its running tasks got SIGTERM and went at once (no wait for a reconcile that never comes).
        assert!(!d.log().contains("ignored SIGTERM"), "a task outlived its SIGTERM at the stop:\n{}", d.log());
    }
    let left = c.task_namespaces();
    assert!(left.is_empty(), "task namespaces left after a clean stop: {left:?}");
}

/// An overlay of two subnets across nodes (docs/design/overlay-subnets.md, part 1): its first IP range holds the
/// VIP and three tasks of `web` (all on node-0), so the rest of `web` and the client (on node-1) are on the
/// second subnet. The client reaches every `web` task: those of the first subnet through its gateway, node-1's
/// routing between the network's bridges and the first subnet's VXLAN device; those of the second over its
/// own subnet's VXLAN device. A clean stop leaves no task namespace.
#[test]
fn tasks_reach_each_other_across_the_subnets_of_an_overlay_and_across_nodes() {
    across_subnets_and_nodes("dpsub", false);
}

/// The same on an `--internal` network: no gateway on the nodes, its subnets routed in each node's namespace of
/// the network (docs/design/overlay-subnets.md).
#[test]
fn tasks_reach_each_other_across_the_subnets_of_an_internal_overlay_and_across_nodes() {
    across_subnets_and_nodes("dpsin", true);
}

fn across_subnets_and_nodes(tag: &str, internal: bool) {
    let mut c = Cluster::start(tag);
    let body = json!({"Name": "two", "Driver": "overlay", "Internal": internal, "IPAM": {"Config": [
        {"Subnet": "10.215.0.0/24", "IPRange": "10.215.0.8/30"}, {"Subnet": "10.216.0.0/24"}]}});
    let r =
        shoal_testkit::http::request(c.manager().socket(), "POST", "/v1.47/networks/create", Some(&body.to_string()))
            .unwrap();
    assert_eq!(r.status, 201, "{}", r.body);
    post_service(c.manager(), &python_service("web", "two", "node.hostname==node-0", 5, SERVER, &[])).unwrap();
    let web = c.running("web", 5);
    let mut web_addrs: Vec<String> = web.iter().map(|t| address_on(t, "two")).collect();
    web_addrs.sort();
    let on_first = web_addrs.iter().filter(|a| a.starts_with("10.215.0.")).count();
    assert_eq!(on_first, 3, "the VIP and three tasks fill the first range: {web_addrs:?}");
    let reach: Vec<String> = web_addrs.iter().map(|a| format!("{a}:80")).collect();
    let env = vec![format!("REACH={}", reach.join(" "))];
    post_service(c.manager(), &python_service("client", "two", "node.hostname==node-1", 1, PROBE, &env)).unwrap();
    let client = c.running("client", 1);
    let mine = address_on(&client[0], "two");
    assert!(mine.starts_with("10.216.0."), "the client is on the second subnet: {mine}");
    let r = c.results(&client[0]);
    println!("client: {r:?}");
    for t in &reach {
        assert!(r.contains(&format!("REACH {t} ok")), "the client on {mine} reaches {t}: {r:?}");
    }
    for d in &mut c.ds {
        assert!(d.stop(), "the daemon stops cleanly");
    }
    let left = c.task_namespaces();
    assert!(left.is_empty(), "task namespaces left after a clean stop: {left:?}");
}

/// An IPv6 overlay across nodes (docs/design/overlay-subnets.md, part 2): `web`'s two tasks on node-0, a client
/// on node-1 on the same `--ipv6` network. Each task has an IPv4 and an IPv6 address; the client reaches both
/// `web` tasks over IPv6 across VXLAN (node-1's neighbour entries for node-0's tasks) and `tasks.web` gives it
/// their IPv6 addresses (AAAA).
#[test]
fn tasks_of_an_ipv6_overlay_reach_each_other_over_ipv6_across_nodes() {
    let mut c = Cluster::start("dpv6");
    c.docker(&["network", "create", "-d", "overlay", "--ipv6", "--subnet", "fd00:217::/64", "dual"]);
    let server6 = SERVER.replace("socket.socket()", "socket.socket(socket.AF_INET6)").replace("'0.0.0.0'", "'::'");
    post_service(c.manager(), &python_service("web", "dual", "node.hostname==node-0", 2, &server6, &[])).unwrap();
    let web = c.running("web", 2);
    let address6 = |t: &Value| -> String {
        let a = t["NetworksAttachments"].as_array().unwrap().iter().find(|a| a["Network"]["Spec"]["Name"] == "dual");
        let addrs: Vec<&str> = a.unwrap()["Addresses"].as_array().unwrap().iter().filter_map(|x| x.as_str()).collect();
        assert_eq!(addrs.len(), 2, "an IPv4 and an IPv6 address: {addrs:?}");
        assert!(addrs[1].starts_with("fd00:217::") && addrs[1].ends_with("/64"), "{addrs:?}");
        addrs[1].trim_end_matches("/64").to_string()
    };
    let mut web6: Vec<String> = web.iter().map(address6).collect();
    web6.sort();
    let reach: Vec<String> = web6.iter().map(|a| format!("{a}:80")).collect();
    let env = vec![format!("REACH={}", reach.join(" ")), "LOOKUP6=tasks.web".to_string(), "WANT6=2".to_string()];
    post_service(c.manager(), &python_service("client", "dual", "node.hostname==node-1", 1, PROBE, &env)).unwrap();
    let client = c.running("client", 1);
    let r = c.results(&client[0]);
    println!("client: {r:?}");
    for t in &reach {
        assert!(r.contains(&format!("REACH {t} ok")), "the client reaches {t} over IPv6: {r:?}");
    }
    assert!(r.contains(&format!("LOOKUP6 tasks.web {}", web6.join(" "))), "AAAA of tasks.web: {r:?}");
    for d in &mut c.ds {
        assert!(d.stop(), "the daemon stops cleanly");
    }
    let left = c.task_namespaces();
    assert!(left.is_empty(), "task namespaces left after a clean stop: {left:?}");
}

/// `BENCH` (`label=url` pairs): a first GET of each retried for up to 5 s (the `web` tasks are RUNNING a
/// moment before they listen, longer on a loaded machine), then 300 sequential GETs, `RESULT RATE label n/s`;
/// then `RESULT LOOPING` and GETs of http://web/ (each retried up to 30 times, 100 ms apart: a task is RUNNING from its
/// process's start, a moment before it listens, and the process executor has no health check to wait for) until the
/// file `STOP` exists: `RESULT LOOP <requests> retried <n> failed <n> answers <distinct addresses>`, then `RESULT
/// DONE`.
const LOOP: &str = r#"
import collections, os, time, urllib.request
def out(*a):
    print('RESULT', *a, flush=True)
def get(url):
    return urllib.request.urlopen(url, timeout=2).read().decode()
for pair in os.environ.get('BENCH', '').split():
    label, url = pair.split('=', 1)
    for attempt in range(50):
        try:
            get(url)
            break
        except Exception:
            time.sleep(0.1)
    t0 = time.time()
    for i in range(300):
        get(url)
    out('RATE', label, '%.0f' % (300 / (time.time() - t0)))
out('LOOPING')
seen, first, n, retried, failed, errors = collections.Counter(), {}, 0, 0, 0, collections.Counter()
while not os.path.exists(os.environ['STOP']):
    n += 1
    for attempt in range(30):
        try:
            answer = get('http://web/')
            seen[answer] += 1
            if answer not in first:
                first[answer] = time.time()
                out('SEEN', len(first))
            break
        except Exception as e:
            retried += 1
            errors[type(e).__name__ + ':' + str(e)[:60]] += 1
            time.sleep(0.1)
    else:
        failed += 1
out('LOOP', n, 'retried', retried, 'failed', failed, 'answers', len(seen))
out('ERRORS', dict(errors))
out('FIRST', ' '.join('%s=%.3f' % (k, v) for k, v in sorted(first.items())))
out('DONE')
time.sleep(100000)
"#;

/// Removes the stop file's directory, however the test ends.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn scaling_to_10_and_back_to_1_keeps_the_vip_answering() {
    let mut c = Cluster::start("dps");
    c.docker(&["network", "create", "-d", "overlay", "appnet"]);
    post_service(c.manager(), &python_service("web", "appnet", "node.hostname!=node-2", 2, SERVER, &[])).unwrap();
    let web = c.running("web", 2);
    let on = |host: &str| {
        let t = web.iter().find(|t| {
            let node = t["NodeID"].as_str().unwrap();
            c.manager().get(&format!("/v1.47/nodes/{node}"))["Description"]["Hostname"] == host
        });
        address_on(t.unwrap_or_else(|| panic!("a web task on {host}: {web:?}")), "appnet")
    };
    let (local, remote) = (on("node-0"), on("node-1"));
    let dir = TempDir(std::env::temp_dir().join(format!("shoal-data-plane-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let stop = dir.0.join("stop");
    let env = vec![
        format!("BENCH=vip=http://web/ same-node=http://{local}/ cross-node=http://{remote}/"),
        format!("STOP={}", stop.display()),
    ];
    post_service(c.manager(), &python_service("client", "appnet", "node.hostname==node-0", 1, LOOP, &env)).unwrap();
    let client = c.running("client", 1);
    let r = c.results_until(&client[0], "LOOPING");
    for line in r.iter().filter(|l| l.starts_with("RATE")) {
        println!("RESULT {line} (requests/s, a new connection each, client and web tasks python3)");
    }

    c.docker(&["service", "update", "-d", "--replicas", "10", "web"]);
    // When the manager first shows each new task RUNNING (`wait_until` polls every 20 ms), by its address.
    let mut running_at: std::collections::BTreeMap<String, f64> = Default::default();
    wait_until("10 running tasks of web", WAIT, || {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        let tasks = tasks_of(c.manager(), "web");
        for t in tasks.iter().filter(|t| state(t) == "running") {
            running_at.entry(address_on(t, "appnet")).or_insert(now);
        }
        if running_at.len() >= 10 {
            Ok(())
        } else {
            Err(format!("{} running", running_at.len()))
        }
    });
    for t in tasks_of(c.manager(), "web") {
        c.tasks_seen.insert(t["ID"].as_str().unwrap_or_default().to_string());
    }
    // Every task answers through the VIP before the scale-down (the 2 first ones and 8 new).
    c.results_until(&client[0], "SEEN 10");
    // Back to 1. The image is named with its tag, as the docker CLI names it when it sends the spec back
    // (`python` would become `python:latest` and make the update replace the remaining task, as in Docker).
    let before: BTreeSet<String> =
        tasks_of(c.manager(), "web").iter().map(|t| t["ID"].as_str().unwrap().to_string()).collect();
    c.docker(&["service", "update", "-d", "--replicas", "1", "web"]);
    let left = wait_until("web down to 1 task", WAIT, || {
        let live: Vec<String> = tasks_of(c.manager(), "web")
            .iter()
            .filter(|t| state(t) == "running")
            .map(|t| t["ID"].as_str().unwrap().to_string())
            .collect();
        if live.len() == 1 {
            Ok(live)
        } else {
            Err(format!("{} running", live.len()))
        }
    });
    assert!(before.contains(&left[0]), "scaling down replaced no task: {left:?} is one of {before:?}");
    std::fs::write(&stop, b"").unwrap();
    let r = c.results(&client[0]);
    let looped = r.iter().find(|l| l.starts_with("LOOP ")).unwrap();
    println!("client: {looped}; {:?}", r.iter().find(|l| l.starts_with("ERRORS")));
    let words: Vec<&str> = looped.split_whitespace().collect();
    let (requests, failed, answers): (u32, u32, u32) =
        (words[1].parse().unwrap(), words[5].parse().unwrap(), words[7].parse().unwrap());
    assert_eq!(failed, 0, "no request fails after its retries: {looped}");
    assert!(requests >= 50, "{looped}");
    assert!(answers >= 10, "the new tasks answered too: {looped}");
    // RUNNING (as the manager shows it) to the first answer through the VIP, for the tasks scaling made.
    let first = r.iter().find(|l| l.starts_with("FIRST ")).unwrap();
    let mut delays: Vec<f64> = first
        .split_whitespace()
        .skip(1)
        .filter_map(|kv| kv.split_once('='))
        .filter(|(addr, _)| *addr != local && *addr != remote)
        .filter_map(|(addr, at)| Some(at.parse::<f64>().ok()? - running_at.get(addr)?))
        .collect();
    delays.sort_by(f64::total_cmp);
    if let (Some(min), Some(max)) = (delays.first(), delays.last()) {
        println!(
            "RESULT RUNNING-to-VIP-answer of {} new tasks: min {:.0} ms, median {:.0} ms, max {:.0} ms",
            delays.len(),
            min * 1000.0,
            delays[delays.len() / 2] * 1000.0,
            max * 1000.0
        );
    }
}

/// `--data-path-addr` (issue 32): each node carries its overlay traffic on a second address of its own, given
/// at the init (`docker swarm init --data-path-addr` on node-0's socket) and at the join (the daemon's flag on
/// node-1). Each node drops VXLAN sent to the address it is known by, so only the data path addresses can
/// carry the overlay: the client on node-1 still gets every answer from the web task on node-0, and node-1's
/// VXLAN entries point at node-0's data path address.
#[test]
fn overlay_traffic_goes_between_the_nodes_data_path_addresses() {
    let data = |i: usize| format!("10.78.0.{}", 11 + i);
    let mut c = Cluster::start_first_init("dpa", "process", 2, &["--data-path-addr", &data(0)]);
    for i in 0..2 {
        let ns = c.net.ns(i).to_string();
        let known = c.net.ip(i);
        let add = ["-n", &ns, "addr", "add", &format!("{}/24", data(i)), "dev", "eth0"];
        assert!(std::process::Command::new("ip").args(add).status().unwrap().success());
        let drop =
            ["netns", "exec", &ns, "iptables", "-w", "-I", "INPUT", "-p", "udp", "--dport", "4789", "-d", &known];
        assert!(std::process::Command::new("ip").args(drop).args(["-j", "DROP"]).status().unwrap().success());
    }
    c.join_with(1, &["--data-path-addr", &data(1)]);
    let label = |node: &str| {
        let format = r#"{{index .Description.Engine.Labels "shoal.data-path-addr"}}"#;
        c.docker(&["node", "inspect", node, "--format", format]).trim().to_string()
    };
    assert_eq!((label("node-0"), label("node-1")), (data(0), data(1)));

    c.docker(&["network", "create", "-d", "overlay", "appnet"]);
    post_service(c.manager(), &python_service("web", "appnet", "node.hostname==node-0", 1, SERVER, &[])).unwrap();
    let web = address_on(&c.running("web", 1)[0], "appnet");
    let env = vec!["WEB=1".to_string()];
    post_service(c.manager(), &python_service("client", "appnet", "node.hostname==node-1", 1, PROBE, &env)).unwrap();
    let client = c.running("client", 1);
    let r = c.results(&client[0]);
    println!("client: {r:?}");
    let answers = r.iter().find(|l| l.starts_with("ANSWERS")).unwrap();
    assert_eq!(answers, &format!("ANSWERS {web}=200 errors 0"), "{r:?}");
    let fdb: String = c
        .net
        .network_namespaces(1)
        .iter()
        .map(|ns| {
            let out = std::process::Command::new("ip").args(["netns", "exec", ns, "bridge", "fdb", "show"]).output();
            String::from_utf8_lossy(&out.unwrap().stdout).into_owned()
        })
        .collect();
    assert!(
        fdb.contains(&format!("dst {}", data(0))) && !fdb.contains(&format!("dst {}", c.net.ip(0))),
        "node-1's VXLAN entries: {fdb}"
    );
}
