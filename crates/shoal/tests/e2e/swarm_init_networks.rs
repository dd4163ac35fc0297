//! `docker swarm init --default-addr-pool ... --default-addr-pool-mask-length ... --data-path-port ...` as a
//! user runs it, on two `shoal daemon`s (process executor) in namespaces prepared like hosts running Docker
//! (`common::netcluster`): the swarm shows its pools and port (`docker info`); the ingress network and a new
//! overlay network get their subnets from the first pool, in blocks of the mask length; both nodes' VXLAN
//! devices use the port, and traffic between the nodes crosses on it (a port published on node-1, which runs
//! no task, answers from the task on node-0 through the routing mesh).

use crate::common;

use std::time::Duration;

use common::netcluster::{address_on, Cluster, PYTHON, SERVER};
use common::*;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(60);

/// The `dstport` of every VXLAN device node `i`'s data plane has (its namespace and its networks').
fn vxlan_ports(c: &Cluster, i: usize) -> Vec<String> {
    let mut text = c.in_node(i, &["ip", "-d", "-o", "link", "show", "type", "vxlan"]);
    for ns in c.net.network_namespaces(i) {
        let out = std::process::Command::new("ip")
            .args(["-n", &ns, "-d", "-o", "link", "show", "type", "vxlan"])
            .output()
            .expect("ip link show");
        text.push_str(&String::from_utf8_lossy(&out.stdout));
    }
    text.lines()
        .filter_map(|l| l.split_whitespace().skip_while(|w| *w != "dstport").nth(1).map(str::to_string))
        .collect()
}

#[test]
fn a_swarm_initialised_with_address_pools_and_a_data_path_port_uses_them() {
    let mut c = Cluster::start_first_init(
        "ipool",
        "process",
        2,
        &[
            "--default-addr-pool",
            "10.20.0.0/16",
            "--default-addr-pool",
            "10.30.0.0/16",
            "--default-addr-pool-mask-length",
            "26",
            "--data-path-port",
            "7789",
        ],
    );
    c.join(1);
    let cluster: Value =
        serde_json::from_str(c.docker(&["info", "--format", "{{json .Swarm.Cluster}}"]).trim()).unwrap();
    assert_eq!(cluster["DataPathPort"], 7789, "{cluster}");
    assert_eq!(cluster["DefaultAddrPool"], json!(["10.20.0.0/16", "10.30.0.0/16"]), "{cluster}");
    assert_eq!(cluster["SubnetSize"], 26, "{cluster}");
    let subnet = |name: &str| {
        c.docker(&["network", "inspect", "--format", "{{(index .IPAM.Config 0).Subnet}}", name]).trim().to_string()
    };
    assert_eq!(subnet("ingress"), "10.20.0.0/26");
    c.docker(&["network", "create", "--driver", "overlay", "app"]);
    assert_eq!(subnet("app"), "10.20.0.64/26");

    c.docker(&[
        "service",
        "create",
        "--detach",
        "--name",
        "web",
        "--constraint",
        "node.hostname==node-0",
        "--network",
        "app",
        "-p",
        "8080:80",
        "python",
        PYTHON,
        "-S",
        "-c",
        SERVER,
    ]);
    let web = c.running("web", 1);
    let on_ingress = address_on(&web[0], "ingress");
    let on_app = address_on(&web[0], "app");
    assert!(on_ingress.starts_with("10.20.0."), "{on_ingress}");
    let last: u8 = on_app.strip_prefix("10.20.0.").and_then(|l| l.parse().ok()).unwrap_or(0);
    assert!((64..128).contains(&last), "inside 10.20.0.64/26: {on_app}");

    // Node-1 runs no task of web: its published port forwards across the underlay, VXLAN on port 7789.
    let node1 = c.net.ip(1);
    wait_until("node-1's 8080 answers from the task on node-0", WAIT, || {
        let answers = c.get(1, &node1, 8080, 4);
        if answers.keys().eq([&on_ingress]) {
            Ok(())
        } else {
            Err(format!("{answers:?}, want answers from {on_ingress}"))
        }
    });
    for i in 0..2 {
        let ports = vxlan_ports(&c, i);
        assert!(!ports.is_empty() && ports.iter().all(|p| p == "7789"), "node-{i}'s VXLAN ports: {ports:?}");
    }
}
