//! Overlay subnets against the nodes' own addresses (issue 31, item 6), on daemons in network namespaces on a
//! veth underlay (10.77.0.0/24, node-0 at .11, node-1 at .12), prepared like Docker hosts.
//!
//! `docker network create` refuses a subnet that holds a node's address (naming the node), and link-local and
//! loopback ranges. A node that joins later with an address inside an existing network's subnet cannot be
//! refused that way: then no node carries that network (its tasks are rejected naming the network, the subnet
//! and the address), every node keeps its underlay (node-1 stays ready, its traffic never goes into the
//! overlay), and once the network is removed the nodes run networked tasks again without a restart.

use crate::common;

use std::time::Duration;

use common::netcluster::{Cluster, PYTHON, SERVER};
use common::*;
use serde_json::{json, Value};
use shoal_testkit::managers::post_service;

const WAIT: Duration = Duration::from_secs(60);

fn service(name: &str, network: &str, node: &str) -> Value {
    json!({
        "Name": name,
        "TaskTemplate": {
            "ContainerSpec": {"Image": "python:latest", "Command": [PYTHON, "-S", "-c", SERVER]},
            "Networks": [{"Target": network}],
            "Placement": {"Constraints": [format!("node.hostname=={node}")]},
            "RestartPolicy": {"Condition": "none"},
        },
        "Mode": {"Replicated": {"Replicas": 1}},
        // DNS round robin: no VIP, so the one address a /30 has after its gateway goes to the task.
        "EndpointSpec": {"Mode": "dnsrr"},
    })
}

/// `docker network create` on the manager, expected to fail: its stderr.
fn refused(c: &Cluster, args: &[&str]) -> String {
    let out = docker_cli::run(c.manager().socket(), args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "docker {args:?} succeeded: {}", String::from_utf8_lossy(&out.stdout));
    err
}

/// The first task of `service` once it ended (rejected or failed): its error.
fn rejection(c: &Cluster, service: &str) -> String {
    let mut err = String::new();
    wait_until(&format!("the task of {service} to be rejected"), WAIT, || {
        let tasks = tasks_of(c.manager(), service);
        match tasks.iter().find(|t| matches!(state(t), "rejected" | "failed")) {
            Some(t) => {
                err = t["Status"]["Err"].as_str().unwrap_or_default().to_string();
                Ok(())
            }
            None => Err(format!("{tasks:?}")),
        }
    });
    err
}

fn node_states(c: &Cluster) -> Vec<String> {
    let nodes = c.manager().get("/v1.47/nodes");
    let mut states: Vec<String> = nodes
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| format!("{}={}", n["Description"]["Hostname"].as_str().unwrap_or("?"), n["Status"]["State"]))
        .collect();
    states.sort();
    states
}

#[test]
fn a_subnet_holding_a_nodes_address_is_refused_or_never_carried_and_the_nodes_keep_their_underlay() {
    let mut c = Cluster::start_first("ovl", "process", 2);
    let m = c.manager().socket().to_path_buf();

    // At create: the manager's own address (10.77.0.11), link-local, loopback.
    let err = refused(&c, &["network", "create", "-d", "overlay", "--subnet", "10.77.0.8/29", "wide"]);
    assert!(err.contains("holds the address 10.77.0.11 of node node-0"), "{err}");
    let err = refused(&c, &["network", "create", "-d", "overlay", "--subnet", "169.254.7.0/24", "ll"]);
    assert!(err.contains("link-local"), "{err}");
    let err = refused(&c, &["network", "create", "-d", "overlay", "--subnet", "127.7.0.0/24", "lo"]);
    assert!(err.contains("loopback"), "{err}");
    let listed = docker(c.manager(), &["network", "ls", "--format", "{{.Name}}"]);
    assert!(!listed.lines().any(|l| matches!(l, "wide" | "ll" | "lo")), "a refused network was made: {listed}");

    // 10.77.0.12/30 holds no node's address yet: accepted. Then node-1 joins at 10.77.0.12.
    c.docker(&["network", "create", "-d", "overlay", "--subnet", "10.77.0.12/30", "late"]);
    c.join(1);
    c.docker(&["network", "create", "-d", "overlay", "--subnet", "10.99.0.0/24", "fine"]);

    // node-0 would route node-1's address into the overlay: it does not carry `late`.
    post_service(c.manager(), &service("on0", "late", "node-0")).unwrap();
    let err = rejection(&c, "on0");
    assert!(
        err.contains("network late")
            && err.contains("10.77.0.12/30")
            && err.contains("the address of a node 10.77.0.12"),
        "{err}"
    );
    // node-1's own address is there.
    post_service(c.manager(), &service("on1", "late", "node-1")).unwrap();
    let err = rejection(&c, "on1");
    assert!(err.contains("this node's own address 10.77.0.12"), "{err}");

    // Both nodes keep their underlay: a service on another network runs on node-1 and node-0 reaches it
    // (the manager's answers to node-1 still leave by eth0), and both nodes stay ready.
    post_service(c.manager(), &service("ok1", "fine", "node-1")).unwrap();
    let ok = c.running("ok1", 1);
    assert_eq!(node_states(&c), ["node-0=\"ready\"", "node-1=\"ready\""]);
    let route = c.in_node(0, &["ip", "-4", "route", "get", "10.77.0.12"]);
    assert!(route.contains("dev eth0"), "node-0 routes node-1's address into {route}");
    assert!(!ok.is_empty());

    // The overlap goes: the network is removed, and networked tasks run on both nodes without a restart.
    for s in ["on0", "on1"] {
        docker(c.manager(), &["service", "rm", s]);
    }
    wait_until("the services on `late` gone", WAIT, || {
        let left: Vec<String> = service_names(c.manager()).into_iter().filter(|s| s.starts_with("on")).collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    });
    wait_until("`docker network rm late`", WAIT, || {
        let out = docker_cli::run(&m, &["network", "rm", "late"]);
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    });
    c.docker(&["network", "create", "-d", "overlay", "--subnet", "10.98.0.0/24", "again"]);
    post_service(c.manager(), &service("again0", "again", "node-0")).unwrap();
    post_service(c.manager(), &service("again1", "again", "node-1")).unwrap();
    c.running("again0", 1);
    c.running("again1", 1);
    assert_eq!(node_states(&c), ["node-0=\"ready\"", "node-1=\"ready\""]);
}
