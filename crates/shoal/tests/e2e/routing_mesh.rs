//! The routing mesh and host-mode published ports as users drive them: three `shoal daemon`s (one manager,
//! two workers, process executor), each in its own network namespace (`shoal_testkit::netns`), so each
//! carries its own bridges, VXLAN devices and nftables table over a real (veth) underlay.
//!
//! `docker service create -p 8080:80` with two replicas placed off node-2: every node's address answers on
//! 8080, node-2's too (it runs no task of the service), from another node (the prerouting path) and from the
//! node itself (the output path), and on each node's loopback (127.0.0.1:8080), and over many requests both
//! tasks answer. `docker network inspect ingress`
//! shows the node's ingress endpoint. A host-mode port (`--publish mode=host,published=8081,target=80`)
//! answers on its task's node only, and a task of another network reaches the mesh through node addresses; what cannot
//! be forwarded (a host-mode port without a number, a host-mode port of a task only on `--internal` networks) is
//! rejected on the task with the field named. A node killed and restarted clears what its crash left and forwards the
//! port again. Scaling the service to 0 refuses the port on every node; removing it takes its rules away. A clean stop
//! of the daemons leaves no `shl*` link, no Shoal nftables table and no task namespace.
//!
//! `RESULT RATE` lines: sequential requests per second (a new TCP connection each, a python3 client in
//! node-2's namespace) through the mesh on node-0's address, through the mesh on node-2's own address (its
//! backends all across VXLAN), and straight to a task's ingress address; the figures in BENCHMARKS.md.
//! HTTP clients run in the node namespaces (`ip netns exec`): the test process's own namespace has no route to
//! the underlay.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Duration;

use common::netcluster::{address_on, parse_counts, Cluster, CLIENT, PYTHON, SERVER};
use common::*;

const WAIT: Duration = Duration::from_secs(60);

/// The network namespace (`/proc/<pid>/ns/net`) of the `SERVER` task process that has address `addr`. The
/// daemons made the task namespaces' `/run/netns` entries in their own mount namespaces (`ip netns exec`),
/// so the test enters them through the task's process.
fn task_netns(addr: &str) -> String {
    let mut seen = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if !String::from_utf8_lossy(&cmdline).contains("s.bind(('0.0.0.0', 80))") {
            continue;
        }
        let ns = format!("/proc/{pid}/ns/net");
        let out = Command::new("nsenter").arg(format!("--net={ns}")).args(["ip", "-o", "-4", "addr"]).output().unwrap();
        let addrs = String::from_utf8_lossy(&out.stdout).into_owned();
        if addrs.contains(&format!(" {addr}/")) {
            return ns;
        }
        seen.push(addrs);
    }
    panic!("no SERVER process with address {addr}: {seen:?}");
}

/// Answers only from `want` (and at least one), nothing failed.
fn only(answers: &BTreeMap<String, u32>, want: &BTreeSet<String>) -> Result<(), String> {
    if !answers.is_empty() && answers.keys().all(|k| want.contains(k)) {
        Ok(())
    } else {
        Err(format!("{answers:?}, want answers from {want:?}"))
    }
}

#[test]
fn a_published_port_answers_on_every_node_and_follows_the_service() {
    let mut c = Cluster::start("rm");
    c.docker(&[
        "service",
        "create",
        "--detach",
        "--name",
        "web",
        "--replicas",
        "2",
        "--constraint",
        "node.hostname!=node-2",
        "--restart-condition",
        "none",
        "-p",
        "8080:80",
        "python",
        PYTHON,
        "-S",
        "-c",
        SERVER,
    ]);
    let web = c.running("web", 2);
    let tasks: BTreeSet<String> = web.iter().map(|t| address_on(t, "ingress")).collect();
    assert!(web.iter().all(|t| c.node_of(t) != 2), "placed off node-2");

    // Every node's address, from the next node (prerouting) and from the node itself (output): node-2 runs
    // no task of web and answers too.
    for i in 0..3 {
        let addr = c.net.ip(i);
        for from in [(i + 1) % 3, i] {
            wait_until(&format!("{addr}:8080 answers from node-{from}"), WAIT, || {
                only(&c.get(from, &addr, 8080, 1), &tasks)
            });
        }
        // A node programs each backend once it has learnt of the task, so the first answers may all come
        // from the task it learnt of first; within the wait, 40 requests are spread over both tasks.
        let from = (i + 1) % 3;
        let answers = wait_until(&format!("{addr}:8080 from node-{from} balanced over {tasks:?}"), WAIT, || {
            let answers = c.get(from, &addr, 8080, 40);
            only(&answers, &tasks)?;
            match tasks.iter().find(|t| answers.get(*t).copied().unwrap_or(0) < 10) {
                Some(t) => Err(format!("task {t} answered fewer than 10 of 40 requests to node-{i}: {answers:?}")),
                None => Ok(answers),
            }
        });
        println!("node-{i} {addr}:8080 from node-{from}: {answers:?}");
        // And on the node's loopback, as `curl localhost:8080` on a swarm node.
        let answers = c.get(i, "127.0.0.1", 8080, 40);
        only(&answers, &tasks).unwrap_or_else(|e| panic!("127.0.0.1:8080 on node-{i}: {e}"));
        assert!(tasks.iter().all(|t| answers.get(t).copied().unwrap_or(0) >= 10), "127.0.0.1 on node-{i}: {answers:?}");
    }

    // The node's ingress endpoint, as Docker shows its ingress sandbox.
    let ingress = c.manager().get("/v1.47/networks/ingress");
    let sbox = &ingress["Containers"]["ingress-sbox"];
    let sbox_addr = sbox["IPv4Address"].as_str().unwrap_or_else(|| panic!("no ingress-sbox: {ingress}"));
    let subnet = ingress["IPAM"]["Config"][0]["Subnet"].as_str().unwrap();
    let prefix = subnet.rsplit_once('.').unwrap().0;
    assert!(sbox_addr.starts_with(prefix) && !tasks.contains(sbox_addr.split('/').next().unwrap()), "{sbox}");

    // Sequential request rates from node-2: mesh on another node's address, mesh on its own, straight.
    let straight = tasks.iter().next().unwrap().clone();
    for (label, host, port) in [
        ("mesh-other-node", c.net.ip(0), 8080),
        ("mesh-own-node", c.net.ip(2), 8080),
        ("straight-to-task", straight, 80),
    ] {
        let out = c.client(2, &host, port, 300, true);
        let rate = out.lines().find_map(|l| l.strip_prefix("RATE ")).unwrap_or("?").to_string();
        assert!(!out.contains("error"), "{label}: {out}");
        println!(
            "RESULT RATE {label} {rate} (requests/s, a new connection each, python3 client in node-2's namespace)"
        );
    }

    // Host mode: on its task's node only, to that task.
    c.docker(&["network", "create", "-d", "overlay", "appnet"]);
    c.docker(&[
        "service",
        "create",
        "--detach",
        "--name",
        "hostweb",
        "--network",
        "appnet",
        "--constraint",
        "node.hostname==node-1",
        "--restart-condition",
        "none",
        "--publish",
        "mode=host,published=8081,target=80",
        "python",
        PYTHON,
        "-S",
        "-c",
        SERVER,
    ]);
    let hostweb = c.running("hostweb", 1);
    let own: BTreeSet<String> = [address_on(&hostweb[0], "appnet")].into();
    let node1 = c.net.ip(1);
    wait_until("host-mode port 8081 answers on node-1", WAIT, || only(&c.get(0, &node1, 8081, 1), &own));
    only(&c.get(2, &node1, 8081, 10), &own).unwrap();
    // On node-1's own loopback too (masqueraded to appnet's gateway on the way in).
    only(&c.get(1, "127.0.0.1", 8081, 4), &own).unwrap_or_else(|e| panic!("127.0.0.1:8081 on node-1: {e}"));
    for i in [0, 2] {
        let answers = c.get(1, &c.net.ip(i), 8081, 1);
        assert_eq!(
            answers.keys().collect::<Vec<_>>(),
            ["error:ConnectionRefusedError"],
            "8081 on node-{i}: {answers:?}"
        );
    }

    // A task of another network reaches the mesh through its own node's address and another node's.
    let hostweb_ns = task_netns(own.iter().next().unwrap());
    for addr in [c.net.ip(1), c.net.ip(0)] {
        let out = Command::new("nsenter")
            .arg(format!("--net={hostweb_ns}"))
            .args([PYTHON, "-S", "-c", CLIENT, &addr, "8080", "4"])
            .output()
            .expect("client in the task's namespace");
        let answers = parse_counts(String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or(""));
        only(&answers, &tasks).unwrap_or_else(|e| panic!("from hostweb's namespace to {addr}:8080: {e}"));
    }

    // What the data plane cannot forward is refused, the field named, on the task.
    c.docker(&["network", "create", "-d", "overlay", "--internal", "closed"]);
    // (SCTP is refused at the API: engine_api_refusals.rs.)
    let refusals: [(&str, &[&str], &str); 2] = [
        (
            "unnumbered",
            &["--network", "appnet", "--publish", "mode=host,target=80"],
            "EndpointSpec.Ports.PublishedPort",
        ),
        (
            "inside",
            &["--network", "closed", "--publish", "mode=host,published=8085,target=80"],
            "only on --internal networks",
        ),
    ];
    for (name, flags, want) in refusals {
        let mut args = vec!["service", "create", "--detach", "--name", name, "--restart-condition", "none"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["python", PYTHON, "-S", "-c", SERVER]);
        c.docker(&args);
        wait_until(&format!("{name} rejected for {want:?}"), WAIT, || {
            let tasks = tasks_of(c.manager(), name);
            let errs: Vec<String> = tasks.iter().map(|t| format!("{}: {}", state(t), t["Status"]["Err"])).collect();
            if tasks.iter().any(|t| state(t) == "rejected" && t["Status"]["Err"].as_str().unwrap_or("").contains(want))
            {
                Ok(())
            } else {
                Err(format!("{errs:?}"))
            }
        });
        c.docker(&["service", "rm", name]);
    }

    // A crash leaves node-2's links and rules; its restart clears them and rebuilds the mesh.
    c.ds[2].kill9();
    assert!(c.in_node(2, &["ip", "-o", "link"]).contains(": shl"), "a crash leaves the links");
    c.ds[2].restart(&[]);
    let node2 = c.net.ip(2);
    wait_until("node-2's mesh answers again after its restart", WAIT, || only(&c.get(0, &node2, 8080, 1), &tasks));
    // (The links the crash left may answer before the restarted daemon's start clears them: wait for its own
    // first reconcile carrying the network, after its start.)
    wait_until("node-2's restarted data plane carrying the ingress network", WAIT, || {
        let log = c.ds[2].log();
        let since = log.rsplit("data plane on").next().unwrap_or("");
        if since.lines().any(|l| l.contains("data plane reconciled") && !l.contains("networks=0")) {
            Ok(())
        } else {
            Err(since.lines().filter(|l| l.contains("data plane")).collect::<Vec<_>>().join("\n"))
        }
    });
    wait_until("node-2's mesh answers after its own reconcile", WAIT, || only(&c.get(0, &node2, 8080, 1), &tasks));
    let answers = c.get(0, &node2, 8080, 20);
    only(&answers, &tasks).unwrap();
    assert_eq!(answers.len(), 2, "both tasks answer through the restarted node: {answers:?}");

    // No task left: the port is refused on every node; the service removed: its rules go.
    c.docker(&["service", "scale", "--detach", "web=0"]);
    for i in 0..3 {
        let addr = c.net.ip(i);
        wait_until(&format!("{addr}:8080 refused once web has no task"), WAIT, || {
            let answers = c.get((i + 1) % 3, &addr, 8080, 1);
            if answers.keys().collect::<Vec<_>>() == ["error:ConnectionRefusedError"] {
                Ok(())
            } else {
                Err(format!("{answers:?}"))
            }
        });
    }
    c.docker(&["service", "rm", "web"]);
    for i in 0..3 {
        wait_until(&format!("node-{i}'s table without port 8080"), WAIT, || {
            let t = c.in_node(i, &["nft", "list", "table", "ip", "shoal"]);
            if t.contains("8080") {
                Err(t)
            } else {
                Ok(())
            }
        });
        let answers = c.get((i + 1) % 3, &c.net.ip(i), 8080, 1);
        assert_eq!(answers.keys().collect::<Vec<_>>(), ["error:ConnectionRefusedError"], "{answers:?}");
    }
    only(&c.get(0, &node1, 8081, 1), &own).unwrap();

    // A clean stop leaves no Shoal link, table or task namespace.
    for t in tasks_of(c.manager(), "hostweb") {
        c.tasks_seen.insert(t["ID"].as_str().unwrap_or_default().to_string());
    }
    for d in &mut c.ds {
        assert!(d.stop(), "the daemon stops cleanly");
    }
    for i in 0..3 {
        let ours = c.shoal_links(i);
        assert!(ours.is_empty(), "node-{i} keeps Shoal links: {ours:?}");
        let tables = c.in_node(i, &["nft", "list", "tables"]);
        assert!(!tables.contains("shoal"), "node-{i} keeps Shoal's table: {tables}");
    }
    let left = c.task_namespaces();
    assert!(left.is_empty(), "task namespaces left after a clean stop: {left:?}");
}
