//! Issue 30's acceptance stack on three nodes: three `shoal daemon`s (one manager, two workers) in network
//! namespaces on a veth underlay, each prepared like a host running Docker (`common/netcluster.rs`: FORWARD
//! policy DROP with Docker's chains, `bridge-nf-call-iptables=1`, strict rp_filter; node-1 with
//! iptables-legacy, the others iptables-nft), and a router beyond them to the "outside world" (a namespace on
//! the underlay that is every node's default route, with a listener on an address off the nodes' subnet).
//! `docker stack deploy` of the stack `host_data_plane.rs` runs on one node (`common/acceptance_stack.rs`):
//! `web` (2 replicas, at most one per node, not on node-2) on `front` and `back` publishing port 8080, `client`
//! on `front` and `db` on `back`, both on node-2, so that every check below crosses the underlay (VXLAN between
//! the nodes' networks' namespaces, through each node's FORWARD chain). Process executor: the data plane is the
//! same for both executors (the docker executor's tasks join the same namespaces; `host_data_plane.rs` runs the
//! stack with both), and three docker-executor nodes on one machine's engine would only make this slower.
//!
//! Checked from inside the tasks: the client resolves `web` (its VIP on front) and `tasks.web` (both tasks),
//! reaches `web` by name and through the VIP with both tasks answering, cannot resolve `db`, and reaches the
//! outside world (masqueraded on its node's way out); each `web` task reaches `db` by name on `back`. From the
//! outside namespace, the published port answers on every node's address (node-2 runs no `web`: the routing
//! mesh), both tasks; and on every node's 127.0.0.1. `docker stack rm` then leaves, in every node's namespace,
//! no `shl*` link, network namespace, `ip shoal` table or Shoal iptables rule, no task namespace, and no
//! process of the stack's tasks (each task carries a marker in its environment).

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::acceptance_stack::{self, Outside};
use common::netcluster::{address_on, Cluster, SERVER};
use common::*;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);
const PUBLISHED: u16 = 8080;

/// `web`: the server (answering with the address a connection arrived at) plus a thread that, from inside
/// the task, resolves `db` (waiting up to 60 s for its name), then GETs `http://db/` 20 times (the first
/// retried for up to 10 s): `RESULT db-name <addresses>`, `RESULT db <answer>=<count> ...`, `RESULT DONE`.
const WEB: &str = concat!(
    "\nimport collections, socket, threading, time\n",
    acceptance_stack::py_get!(),
    r#"def probe_db():
    names = 'none'
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            names = ','.join(sorted(socket.gethostbyname_ex('db')[2]))
            break
        except OSError:
            time.sleep(0.2)
    print('RESULT db-name', names, flush=True)
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            get('db', 80)
            break
        except OSError:
            time.sleep(0.1)
    seen = collections.Counter()
    for i in range(20):
        try:
            seen[get('db', 80)] += 1
        except OSError as e:
            seen['error:' + type(e).__name__] += 1
    print('RESULT db', ' '.join('%s=%d' % kv for kv in sorted(seen.items())), flush=True)
    print('RESULT DONE', flush=True)
threading.Thread(target=probe_db, daemon=True).start()
"#
);

fn py(script: &str) -> Vec<String> {
    [netcluster::PYTHON, "-S", "-c", script].map(String::from).to_vec()
}

/// The processes (`pid cmdline`) whose environment holds `marker` (`NAME=value`).
fn processes_with(marker: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let pid = e.file_name().to_string_lossy().to_string();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(env) = std::fs::read(e.path().join("environ")) else { continue };
        if env.split(|b| *b == 0).any(|kv| kv == marker.as_bytes()) {
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let cmd: String = String::from_utf8_lossy(&cmd).replace('\0', " ").chars().take(60).collect();
            out.push(format!("{pid} {cmd}"));
        }
    }
    out
}

/// What Shoal's data plane has on node `i`: `Cluster::shoal_links` (links, networks' namespaces, iptables
/// rules) and its nftables tables.
fn leftovers(c: &Cluster, i: usize) -> Vec<String> {
    let mut left = c.shoal_links(i);
    let tables = c.in_node(i, &["nft", "list", "tables"]);
    left.extend(tables.lines().filter(|l| l.contains("shoal")).map(str::to_string));
    left
}

#[test]
fn the_acceptance_stack_runs_on_three_docker_like_hosts_and_stack_rm_leaves_nothing() {
    if no_docker_cli() {
        return;
    }
    let mut c = Cluster::start("s3n");
    let outside = Outside::router_of(&c.net, 3);
    for i in 0..3 {
        assert_eq!(leftovers(&c, i), Vec::<String>::new(), "node-{i} has Shoal's data plane before the stack");
    }

    let marker = format!("SHOAL_TEST_STACK={}-s3n", std::process::id());
    let web = py(&format!("{WEB}{SERVER}"));
    let mut compose =
        acceptance_stack::compose("python:latest", &web, &py(acceptance_stack::CLIENT), &outside.ip, PUBLISHED);
    // `db` is the server alone (no '$' in it for compose to interpolate).
    compose["services"]["db"]["command"] = json!([SERVER]);
    compose["services"]["web"]["deploy"]["placement"] =
        json!({"constraints": ["node.hostname != node-2"], "max_replicas_per_node": 1});
    for s in ["client", "db"] {
        compose["services"][s]["deploy"]["placement"] = json!({"constraints": ["node.hostname == node-2"]});
    }
    for s in ["web", "client", "db"] {
        let (k, v) = marker.split_once('=').unwrap();
        compose["services"][s]["environment"][k] = json!(v);
    }
    let dir = tempfile::Builder::new().prefix("stack3-").tempdir_in(shoal_testkit::scratch_dir()).unwrap();
    let file = dir.path().join("stack.yml");
    std::fs::write(&file, compose.to_string()).unwrap();
    c.docker(&["stack", "deploy", "--resolve-image", "never", "-c", file.to_str().unwrap(), "app"]);

    let webs = c.running("app_web", 2);
    let db = c.running("app_db", 1).remove(0);
    let client = c.running("app_client", 1).remove(0);
    let web_nodes: BTreeSet<usize> = webs.iter().map(|t| c.node_of(t)).collect();
    assert_eq!(web_nodes, BTreeSet::from([0, 1]), "one web task on node-0 and one on node-1");
    assert_eq!((c.node_of(&db), c.node_of(&client)), (2, 2), "db and the client on node-2");
    let in_stack = processes_with(&marker);
    assert_eq!(in_stack.len(), 4, "the stack's four task processes carry the marker: {in_stack:?}");

    // From inside the client (node-2): web by name and through its VIP (both tasks, across the underlay),
    // tasks.web, no db, the outside world.
    let vip = acceptance_stack::vip_on(|a| c.docker(a), "app_web", "app_front");
    let mut web_addrs: Vec<String> = webs.iter().map(|t| address_on(t, "app_front")).collect();
    web_addrs.sort();
    let r = c.results(&client);
    eprintln!("the client saw: {r:?}");
    acceptance_stack::check_client(&r, &vip, &web_addrs);

    // From inside each web task (node-0, node-1): db by name on back (its VIP there), answering with its own
    // address on back.
    let db_vip = acceptance_stack::vip_on(|a| c.docker(a), "app_db", "app_back");
    let db_addr = address_on(&db, "app_back");
    for t in &webs {
        let r = c.results(t);
        let node = c.node_of(t);
        assert!(r.contains(&format!("db-name {db_vip}")), "node-{node}: db resolves to its VIP {db_vip}: {r:?}");
        assert!(r.contains(&format!("db {db_addr}=20")), "node-{node}: db ({db_addr}) answers all 20: {r:?}");
    }

    // The published port from the outside namespace on every node's address (through each node's prerouting
    // and FORWARD chain; node-2 hands its connections over the mesh) and on each node's own 127.0.0.1: both
    // tasks answer (with their address on ingress).
    let ingress: BTreeSet<String> = webs.iter().map(|t| address_on(t, "ingress")).collect();
    for i in 0..3 {
        let node_ip = c.net.ip(i);
        let seen = wait_until(&format!("node-{i}'s published port from outside"), WAIT, || {
            let mut seen = BTreeSet::new();
            for _ in 0..10 {
                seen.insert(outside.get(&node_ip, PUBLISHED)?);
            }
            if seen == ingress {
                Ok(seen)
            } else {
                Err(format!("{seen:?}, want {ingress:?}"))
            }
        });
        eprintln!("{node_ip}:{PUBLISHED} from outside answered by {seen:?}");
        let local = c.get(i, "127.0.0.1", PUBLISHED, 10);
        let answered: BTreeSet<String> = local.keys().cloned().collect();
        assert_eq!(answered, ingress, "node-{i}'s 127.0.0.1:{PUBLISHED}: both tasks answer, nothing fails");
    }
    // The outside listener's answers above came back through every node's FORWARD chain with Shoal's rules in it.
    for i in 0..3 {
        let rules = shoal_testkit::netns::docker_host::shoal_rules(c.net.ns(i));
        assert!(!rules.is_empty(), "node-{i} has no Shoal FORWARD rule");
    }

    // What the checks after `stack rm` look for is there now, on every node.
    for i in 0..3 {
        let now = leftovers(&c, i);
        assert!(
            now.iter().any(|l| l.starts_with("shl")) && now.iter().any(|l| l.contains("table ip shoal")),
            "node-{i}'s data plane: {now:?}"
        );
    }

    // `docker stack rm` removes the services, then tries the networks (which may still hold tasks being
    // removed: removed again until they are gone).
    let _ = docker_cli::run(c.manager().socket(), &["stack", "rm", "app"]);
    wait_until("the stack's services and networks removed", WAIT, || {
        let services = c.docker(&["service", "ls", "--format", "{{.Name}}"]);
        let networks = c.docker(&["network", "ls", "--format", "{{.Name}}"]);
        let left: Vec<&str> = services.lines().chain(networks.lines()).filter(|n| n.starts_with("app_")).collect();
        for n in left.iter().filter(|n| networks.lines().any(|l| l == **n)) {
            let _ = docker_cli::run(c.manager().socket(), &["network", "rm", n]);
        }
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    });
    for i in 0..3 {
        wait_until(&format!("nothing of the stack's data plane left on node-{i}"), WAIT, || {
            let left = leftovers(&c, i);
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("{left:?}"))
            }
        });
    }
    wait_until("the tasks' namespaces and processes gone", WAIT, || {
        let (ns, procs) = (c.task_namespaces(), processes_with(&marker));
        if ns.is_empty() && procs.is_empty() {
            Ok(())
        } else {
            Err(format!("namespaces {ns:?}, processes {procs:?}"))
        }
    });
    assert!(c.tasks_seen.len() >= 4, "{:?}", c.tasks_seen);
}
