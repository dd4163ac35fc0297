//! The data plane driven in network namespaces (needs root, iproute2, nftables, nsenter, iptables-nft and
//! iptables-legacy): two "nodes", each a namespace prepared like a host running Docker (FORWARD policy DROP
//! with Docker's chains, bridge-nf-call-iptables=1: node 0 with iptables-nft, node 1 with iptables-legacy,
//! `docker_host`), joined by a veth underlay (192.168.77.1 and .2), each with task namespaces plumbed by the
//! `Executor`. Tests ping and open TCP connections between tasks the way a task would, and check what is left on
//! the nodes afterwards (links, network namespaces, tables, iptables rules). Every namespace is a `Netns` guard
//! named `shl-t<pid>-<tag>-...`, deleted on drop even when an assertion fails (a node's network namespaces are
//! removed first); namespaces of test processes that died are deleted by the next test.

#[allow(unreachable_pub, reason = "testkit's public module, included here by path")]
#[path = "../../testkit/src/netns_docker_host.rs"]
mod docker_host;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::sync_channel;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shoal_netplane::{
    mac_for, Attachment, Executor, NetworkState, NodeIngress, NodeNetState, Op, Peer, Protocol, PublishedPort,
    ServiceVip, Subnet6, TaskState,
};

const PREFIX: &str = "shl-t";
const NODE_IPS: [Ipv4Addr; 2] = [Ipv4Addr::new(192, 168, 77, 1), Ipv4Addr::new(192, 168, 77, 2)];
const PORT: u16 = 8080;

fn sh(args: &[&str]) -> std::process::Output {
    Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn run(args: &[&str]) {
    let out = sh(args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The inode of a namespace file (`nsfs`), which names a node's network namespaces.
fn inode(path: &std::path::Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// Deletes the namespaces of test processes that no longer exist, and the network namespaces
/// (`shl-net-<node inode>-<vni>`) of node namespaces that no longer exist.
fn remove_leftovers() {
    let names: Vec<String> = std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    let mut alive: std::collections::BTreeSet<u64> =
        names.iter().filter_map(|n| inode(&std::path::Path::new("/run/netns").join(n))).collect();
    for p in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        alive.extend(inode(&p.path().join("ns/net")));
    }
    for n in &names {
        let node = n.strip_prefix("shl-net-").and_then(|r| r.split('-').next()?.parse::<u64>().ok());
        if node.is_some_and(|k| !alive.contains(&k)) {
            let _ = sh(&["ip", "netns", "del", n]);
        }
    }
    let out = sh(&["ip", "netns", "list"]);
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(pid) = name.strip_prefix(PREFIX).and_then(|r| r.split('-').next()?.parse::<u32>().ok()) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = sh(&["ip", "netns", "del", name]);
        }
    }
}

/// A named network namespace, deleted on drop.
struct Netns {
    name: String,
}

impl Netns {
    fn new(tag: &str, what: &str) -> Netns {
        let ns = Netns { name: format!("{PREFIX}{}-{tag}-{what}", std::process::id()) };
        run(&["ip", "netns", "add", &ns.name]);
        run(&["ip", "-n", &ns.name, "link", "set", "lo", "up"]);
        ns
    }

    fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.name))
    }

    /// Runs a command inside; whether it succeeded.
    fn exec(&self, args: &[&str]) -> bool {
        let mut a = vec!["ip", "netns", "exec", &self.name];
        a.extend_from_slice(args);
        sh(&a).status.success()
    }

    fn output(&self, args: &[&str]) -> String {
        let mut a = vec!["ip", "netns", "exec", &self.name];
        a.extend_from_slice(args);
        String::from_utf8_lossy(&sh(&a).stdout).into_owned()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = sh(&["ip", "netns", "del", &self.name]);
    }
}

/// Runs `f` on a thread inside namespace `path`; sockets made there stay in it.
fn in_netns<T: Send + 'static>(path: PathBuf, f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path:?}: {e}"));
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        f()
    })
    .join()
    .expect("netns thread")
}

/// A TCP server inside a task namespace answering every connection with `reply`; stopped on drop.
struct Server {
    stop: Arc<AtomicBool>,
    netns: PathBuf,
    addr: SocketAddr,
}

impl Server {
    fn start(netns: PathBuf, addr: Ipv4Addr, reply: &str) -> Server {
        Server::start_at(netns, SocketAddr::V4(SocketAddrV4::new(addr, PORT)), reply)
    }

    fn start_v6(netns: PathBuf, addr: Ipv6Addr, reply: &str) -> Server {
        Server::start_at(netns, SocketAddr::V6(SocketAddrV6::new(addr, PORT, 0, 0)), reply)
    }

    fn start_at(netns: PathBuf, addr: SocketAddr, reply: &str) -> Server {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = sync_channel(1);
        let (s, p, reply) = (stop.clone(), netns.clone(), reply.to_string());
        std::thread::spawn(move || {
            let file = std::fs::File::open(&p).expect("open netns");
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            let listener = TcpListener::bind(addr);
            let ok = listener.is_ok();
            let _ = tx.send(listener.as_ref().map(drop).map_err(|e| e.to_string()));
            if !ok {
                return;
            }
            for conn in listener.expect("checked").incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(mut c) = conn {
                    let _ = c.write_all(reply.as_bytes());
                }
            }
        });
        rx.recv().expect("server thread").unwrap_or_else(|e| panic!("bind {addr}: {e}"));
        Server { stop, netns, addr }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let addr = self.addr;
        in_netns(self.netns.clone(), move || drop(TcpStream::connect_timeout(&addr, Duration::from_secs(1))));
    }
}

/// Connects from `netns` to `addr:PORT` and reads the answer.
fn fetch(netns: PathBuf, addr: Ipv4Addr, timeout: Duration) -> std::io::Result<String> {
    in_netns(netns, move || {
        let mut c = TcpStream::connect_timeout(&SocketAddr::V4(SocketAddrV4::new(addr, PORT)), timeout)?;
        c.set_read_timeout(Some(timeout))?;
        let mut s = String::new();
        c.read_to_string(&mut s)?;
        Ok(s)
    })
}

/// Resolves `name` (A) from inside `netns` through the resolver on 127.0.0.11.
fn resolve(netns: PathBuf, name: &str) -> Vec<Ipv4Addr> {
    let q = shoal_netplane::query_bytes(7, name, hickory_proto::rr::RecordType::A);
    in_netns(netns, move || {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
        s.set_read_timeout(Some(Duration::from_secs(2))).expect("timeout");
        s.send_to(&q, shoal_netplane::RESOLVER_ADDR).expect("send");
        let mut b = vec![0u8; 4096];
        let n = s.recv(&mut b).expect("DNS answer");
        shoal_netplane::parse_response(&b[..n]).expect("response").2
    })
}

/// The tree's one wait helper (testkit's), included by path: testkit depends on this crate (through the agent).
#[allow(unreachable_pub, reason = "testkit's public module, included here by path")]
#[path = "../../testkit/src/wait.rs"]
#[allow(dead_code)] // this test uses part of it
mod wait;

/// Waits (polling every 20 ms) until `f` holds, panicking with `what` after `limit`.
fn wait_for(what: &str, limit: Duration, f: impl FnMut() -> bool) {
    wait::wait_until(what, limit, wait::holds(f))
}

/// Two node namespaces joined by a veth underlay, each prepared like a Docker host (see the module doc).
struct Nodes {
    tag: String,
    nodes: Vec<Netns>,
}

impl Nodes {
    fn new(tag: &str) -> Nodes {
        Nodes::prepared(tag, |ns, i| docker_host::prepare(ns, docker_host::for_node(i)))
    }

    /// Two nodes, each namespace prepared by `prepare(name, i)`.
    fn prepared(tag: &str, prepare: impl Fn(&str, usize)) -> Nodes {
        remove_leftovers();
        let nodes = vec![Netns::new(tag, "n0"), Netns::new(tag, "n1")];
        for (i, n) in nodes.iter().enumerate() {
            prepare(&n.name, i);
        }
        run(&[
            "ip",
            "-n",
            &nodes[0].name,
            "link",
            "add",
            "u0",
            "type",
            "veth",
            "peer",
            "name",
            "u1",
            "netns",
            &nodes[1].name,
        ]);
        for (i, n) in nodes.iter().enumerate() {
            let dev = format!("u{i}");
            run(&["ip", "-n", &n.name, "addr", "add", &format!("{}/24", NODE_IPS[i]), "dev", &dev]);
            run(&["ip", "-n", &n.name, "link", "set", &dev, "up"]);
        }
        Nodes { tag: tag.to_string(), nodes }
    }

    fn task(&self, what: &str) -> Netns {
        Netns::new(&self.tag, what)
    }

    fn exec(&self, i: usize) -> Executor {
        Executor::in_netns(self.nodes[i].path())
    }

    /// The name of network `vni`'s namespace on node `i`.
    fn network_ns(&self, i: usize, vni: u32) -> String {
        shoal_netplane::network_netns(inode(&self.nodes[i].path()).expect("node namespace"), vni)
    }

    /// Runs a command in network `vni`'s namespace on node `i`.
    fn in_network(&self, i: usize, vni: u32, args: &[&str]) {
        let ns = self.network_ns(i, vni);
        let mut a = vec!["ip", "netns", "exec", &ns];
        a.extend_from_slice(args);
        run(&a);
    }

    /// Reconciles each node (`execs[i]` drives node `i`) to carrying nothing, and checks nothing of
    /// Shoal's is left on it.
    fn tear_down(&self, execs: &[Executor]) {
        for (i, e) in execs.iter().enumerate() {
            e.reconcile(&NodeNetState::new(NODE_IPS[i])).expect("teardown");
            assert_eq!(self.leftovers(i), "", "node {i} keeps Shoal's links or table");
        }
    }

    /// The Shoal links, network namespaces, tables and iptables rules left on node `i`.
    fn leftovers(&self, i: usize) -> String {
        let links = self.nodes[i].output(&["ip", "-o", "link", "show"]);
        let mut left: Vec<String> = links
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap_or(n).to_string())
            .filter(|n| n.starts_with("shl"))
            .collect();
        if self.nodes[i].output(&["nft", "list", "tables"]).contains("shoal") {
            left.push("table ip shoal".into());
        }
        let key = inode(&self.nodes[i].path()).expect("node namespace");
        left.extend(
            std::fs::read_dir("/run/netns")
                .into_iter()
                .flatten()
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| shoal_netplane::network_netns_vni(key, n).is_some()),
        );
        left.extend(docker_host::shoal_rules(&self.nodes[i].name));
        left.join(", ")
    }
}

impl Drop for Nodes {
    /// A failed test still removes the nodes' network namespaces (their names are outside the nodes').
    fn drop(&mut self) {
        for (i, ip) in NODE_IPS.iter().enumerate().take(self.nodes.len()) {
            let _ = self.exec(i).reconcile(&NodeNetState::new(*ip));
        }
    }
}

fn network(id: &str, vni: u32, third: u8, internal: bool) -> NetworkState {
    NetworkState {
        id: id.into(),
        name: id.into(),
        vni,
        subnet: format!("10.{third}.0.0/24").parse().unwrap(),
        gateway: Ipv4Addr::new(10, third, 0, 1),
        more_subnets: Vec::new(),
        internal,
        encrypted: false,
        peers: Vec::new(),
        services: Vec::new(),
        ipv6: None,
    }
}

fn task(id: &str, ns: &Netns, attachments: &[(&str, Ipv4Addr)]) -> TaskState {
    TaskState {
        task_id: id.into(),
        netns: ns.path(),
        attachments: attachments
            .iter()
            .map(|(n, a)| Attachment { network_id: n.to_string(), address: *a, ifname: None, address6: None })
            .collect(),
        joined: false,
    }
}

fn peer(address: Ipv4Addr, node: usize) -> Peer {
    Peer { address, mac: mac_for(address), node_ip: NODE_IPS[node], address6: None }
}

/// Whether `from` reaches `to`: a TCP connection to its port 9, where nothing listens, is answered (refused
/// by `to`'s kernel) within a second. A drop times out; no route fails at once. (No ping binary needed.)
fn ping(from: &Netns, to: Ipv4Addr) -> bool {
    in_netns(from.path(), move || {
        match TcpStream::connect_timeout(&SocketAddr::V4(SocketAddrV4::new(to, 9)), Duration::from_secs(1)) {
            Ok(_) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionRefused,
        }
    })
}

/// Whether `from` reaches IPv6 address `to` (as `ping`: port 9 refused within a second).
fn ping6(from: &Netns, to: Ipv6Addr) -> bool {
    in_netns(from.path(), move || {
        match TcpStream::connect_timeout(&SocketAddr::V6(SocketAddrV6::new(to, 9, 0, 0)), Duration::from_secs(1)) {
            Ok(_) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionRefused,
        }
    })
}

/// A dual-stack network (`--ipv6`): each task has its IPv6 address beside its IPv4 one on one interface, and
/// reaches the others' over IPv6 on its node (bridged) and across VXLAN (the device's neighbour discovery
/// proxy answers for remote tasks), on a node prepared like a Docker host; the same state again changes
/// nothing, and a lost IPv6 neighbour entry is restored.
#[test]
fn tasks_of_an_ipv6_network_reach_each_other_over_ipv6_across_vxlan() {
    let nodes = Nodes::new("v6");
    let (a0, b0, a1) = (Ipv4Addr::new(10, 50, 0, 2), Ipv4Addr::new(10, 50, 0, 3), Ipv4Addr::new(10, 50, 0, 4));
    let v6 = |h: u16| Ipv6Addr::new(0xfd00, 0x50, 0, 0, 0, 0, 0, h);
    let (a0_6, b0_6, a1_6) = (v6(2), v6(3), v6(4));
    let (t_a0, t_b0, t_a1) = (nodes.task("a0"), nodes.task("b0"), nodes.task("a1"));
    let mut net = network("dual", 5050, 50, false);
    net.ipv6 = Some(Subnet6 { subnet: "fd00:50::/64".parse().unwrap(), gateway: v6(1) });
    let with6 = |id: &str, ns: &Netns, a: Ipv4Addr, a6: Ipv6Addr| {
        let mut t = task(id, ns, &[("dual", a)]);
        t.attachments[0].address6 = Some(a6);
        t
    };
    let peer6 = |a: Ipv4Addr, a6: Ipv6Addr, node: usize| Peer { address6: Some(a6), ..peer(a, node) };
    let mut s0 = NodeNetState::new(NODE_IPS[0]);
    net.peers = vec![peer6(a1, a1_6, 1)];
    s0.networks = vec![net.clone()];
    s0.tasks = vec![with6("a0", &t_a0, a0, a0_6), with6("b0", &t_b0, b0, b0_6)];
    let mut s1 = NodeNetState::new(NODE_IPS[1]);
    net.peers = vec![peer6(a0, a0_6, 0), peer6(b0, b0_6, 0)];
    s1.networks = vec![net];
    s1.tasks = vec![with6("a1", &t_a1, a1, a1_6)];
    let (e0, e1) = (nodes.exec(0), nodes.exec(1));
    e0.reconcile(&s0).expect("node 0");
    e1.reconcile(&s1).expect("node 1");

    let global = t_a0.output(&["ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "global"]);
    assert!(global.contains("fd00:50::2/64"), "a0's IPv6 address: {global}");
    wait_for("a0 to reach a1 over IPv6 across VXLAN", Duration::from_secs(5), || ping6(&t_a0, a1_6));
    assert!(ping6(&t_a1, a0_6) && ping6(&t_a1, b0_6), "node 1 reaches both tasks of node 0 over IPv6");
    assert!(ping6(&t_a0, b0_6), "tasks of one node reach each other over IPv6");
    assert!(ping(&t_a0, a1), "IPv4 still works beside it");
    let srv = Server::start_v6(t_a1.path(), a1_6, "a1 over IPv6");
    let got = in_netns(t_b0.path(), move || {
        let mut c =
            TcpStream::connect_timeout(&SocketAddr::V6(SocketAddrV6::new(a1_6, PORT, 0, 0)), Duration::from_secs(2))
                .expect("TCP b0 -> a1 over IPv6");
        let mut s = String::new();
        c.read_to_string(&mut s).expect("read");
        s
    });
    assert_eq!(got, "a1 over IPv6");
    assert_eq!(e0.reconcile(&s0).expect("node 0 again"), Vec::<Op>::new());
    assert_eq!(e1.reconcile(&s1).expect("node 1 again"), Vec::<Op>::new());

    // A lost IPv6 neighbour entry (by hand, or a crash) is restored, and traffic follows.
    nodes.in_network(1, 5050, &["ip", "-6", "neigh", "flush", "dev", "shlx5050", "nud", "permanent"]);
    let ops = e1.reconcile(&s1).expect("node 1 repaired");
    assert!(ops.iter().all(|o| matches!(o, Op::AddNeigh { neigh, .. } if neigh.ip.is_ipv6())), "{ops:?}");
    assert_eq!(ops.len(), 2, "{ops:?}");
    wait_for("a1 to reach a0 over IPv6 after the repair", Duration::from_secs(5), || ping6(&t_a1, a0_6));

    drop(srv);
    nodes.tear_down(&[e0, e1]);
}

/// An internal network of two subnets: its gateways are on its bridges and its namespace routes between them,
/// so a task of the first subnet reaches tasks of the second on its node and across VXLAN, and nothing outside
/// the network (the nodes' underlay addresses); the same state again changes nothing.
#[test]
fn an_internal_network_of_two_subnets_is_routed_in_its_namespace_and_nowhere_else() {
    let nodes = Nodes::new("in2");
    let (a0, c0, b1) = (Ipv4Addr::new(10, 60, 0, 2), Ipv4Addr::new(10, 61, 0, 2), Ipv4Addr::new(10, 61, 0, 3));
    let (t_a0, t_c0, t_b1) = (nodes.task("a0"), nodes.task("c0"), nodes.task("b1"));
    let mut net = network("closed", 6060, 60, true);
    net.more_subnets = vec![shoal_netplane::Subnet {
        vni: 6061,
        subnet: "10.61.0.0/24".parse().unwrap(),
        gateway: Ipv4Addr::new(10, 61, 0, 1),
    }];
    let mut s0 = NodeNetState::new(NODE_IPS[0]);
    net.peers = vec![peer(b1, 1)];
    s0.networks = vec![net.clone()];
    s0.tasks = vec![task("a0", &t_a0, &[("closed", a0)]), task("c0", &t_c0, &[("closed", c0)])];
    let mut s1 = NodeNetState::new(NODE_IPS[1]);
    net.peers = vec![peer(a0, 0), peer(c0, 0)];
    s1.networks = vec![net];
    s1.tasks = vec![task("b1", &t_b1, &[("closed", b1)])];
    let (e0, e1) = (nodes.exec(0), nodes.exec(1));
    e0.reconcile(&s0).expect("node 0");
    e1.reconcile(&s1).expect("node 1");

    wait_for("a0 to reach b1 across subnets and nodes", Duration::from_secs(5), || ping(&t_a0, b1));
    assert!(ping(&t_a0, c0) && ping(&t_c0, a0), "the subnets are routed to each other on one node");
    assert!(ping(&t_b1, a0), "node 1's task of the second subnet reaches the first subnet's on node 0");
    let srv = Server::start(t_b1.path(), b1, "b1");
    assert_eq!(fetch(t_a0.path(), b1, Duration::from_secs(2)).expect("TCP a0 -> b1"), "b1");
    assert_eq!(t_a0.output(&["ip", "route", "show", "default"]).trim(), "", "an internal network has a default route");
    for ip in NODE_IPS {
        assert!(!ping(&t_a0, ip) && !ping(&t_b1, ip), "an internal network reached the underlay address {ip}");
    }
    assert_eq!(e0.reconcile(&s0).expect("node 0 again"), Vec::<Op>::new());
    assert_eq!(e1.reconcile(&s1).expect("node 1 again"), Vec::<Op>::new());
    // Forwarding turned off in the network's namespace (a new namespace inherits the host's setting, which
    // may be off): the subnets are cut, and the next reconcile turns it on again.
    nodes.in_network(0, 6060, &["sysctl", "-qw", "net.ipv4.ip_forward=0"]);
    assert!(!ping(&t_a0, c0), "the subnets are routed without forwarding");
    assert_eq!(e0.reconcile(&s0).expect("node 0 repaired"), vec![Op::EnableNetnsForward { vni: 6060 }]);
    wait_for("a0 to reach c0 again", Duration::from_secs(5), || ping(&t_a0, c0));
    drop(srv);
    nodes.tear_down(&[e0, e1]);
}

#[test]
fn tasks_reach_each_other_across_vxlan_and_only_on_their_network() {
    let nodes = Nodes::new("vx");
    let (a0, a1) = (Ipv4Addr::new(10, 20, 0, 2), Ipv4Addr::new(10, 20, 0, 3));
    let (b0, b1) = (Ipv4Addr::new(10, 21, 0, 2), Ipv4Addr::new(10, 21, 0, 3));
    let c0 = Ipv4Addr::new(10, 22, 0, 2);
    let (t_a0, t_a1, t_b0, t_b1, t_c0) =
        (nodes.task("a0"), nodes.task("a1"), nodes.task("b0"), nodes.task("b1"), nodes.task("c0"));

    // Node 0: a0 on appnet, b0 on other, c0 on the internal network. Node 1: a1 on appnet, b1 on other.
    let mut s0 = NodeNetState::new(NODE_IPS[0]);
    let mut appnet = network("appnet", 4242, 20, false);
    let mut other = network("other", 4343, 21, false);
    appnet.peers = vec![peer(a1, 1)];
    other.peers = vec![peer(b1, 1)];
    s0.networks = vec![appnet.clone(), other.clone(), network("private", 4444, 22, true)];
    s0.tasks = vec![
        task("a0", &t_a0, &[("appnet", a0)]),
        task("b0", &t_b0, &[("other", b0)]),
        task("c0", &t_c0, &[("private", c0)]),
    ];
    let mut s1 = NodeNetState::new(NODE_IPS[1]);
    appnet.peers = vec![peer(a0, 0)];
    other.peers = vec![peer(b0, 0)];
    s1.networks = vec![appnet, other];
    s1.tasks = vec![task("a1", &t_a1, &[("appnet", a1)]), task("b1", &t_b1, &[("other", b1)])];

    let (e0, e1) = (nodes.exec(0), nodes.exec(1));
    assert!(!e0.reconcile(&s0).expect("node 0").is_empty());
    assert!(!e1.reconcile(&s1).expect("node 1").is_empty());

    // Same network across nodes: ping and TCP both ways.
    wait_for("a0 to ping a1 over VXLAN", Duration::from_secs(5), || ping(&t_a0, a1));
    assert!(ping(&t_a1, a0));
    assert!(ping(&t_b1, b0), "the second network works too");
    let srv = Server::start(t_a1.path(), a1, "a1");
    assert_eq!(fetch(t_a0.path(), a1, Duration::from_secs(2)).expect("TCP a0 -> a1"), "a1");

    // Other networks, same node (routed through the node) and across nodes: nothing gets through.
    let quick = Duration::from_millis(500);
    assert!(fetch(t_b0.path(), a1, quick).is_err(), "other network reached a1");
    assert!(!ping(&t_b0, a0), "other network reached a0 through node 0");
    assert!(!ping(&t_a0, b0), "appnet reached the other network through node 0");
    assert!(!ping(&t_b1, a0), "other network reached a0 from node 1");

    // Out of a non-internal network: the other node's underlay address answers (masqueraded); the internal
    // network has no route out at all.
    assert!(ping(&t_a0, NODE_IPS[1]), "appnet has a route out");
    // Through each node's Docker-like firewall, in its own back end: Shoal's accept rules are there, in that
    // back end only.
    for (i, want) in [(0, "iptables-nft: "), (1, "iptables-legacy: ")] {
        let rules = docker_host::shoal_rules(&nodes.nodes[i].name);
        assert!(rules.len() == 2 && rules.iter().all(|r| r.starts_with(want)), "node {i}: {rules:?}");
    }
    // The host's firewall still decides what leaves a network through the node: a user's DOCKER-USER rule
    // applies (node 0, iptables-nft); traffic inside the network, bridged in its namespace, never meets it.
    let user_rule = ["DOCKER-USER", "-s", "10.20.0.0/24", "-j", "DROP"];
    let ipt = |op: &str| {
        let mut a = vec!["iptables-nft", "-w", op];
        a.extend_from_slice(&user_rule);
        assert!(nodes.nodes[0].exec(&a), "{a:?}");
    };
    ipt("-I");
    assert!(!ping(&t_a0, NODE_IPS[1]), "the user's DOCKER-USER rule did not apply");
    assert!(ping(&t_a0, a1), "a DOCKER-USER rule cut traffic inside the network");
    ipt("-D");
    assert!(ping(&t_a0, NODE_IPS[1]), "appnet has a route out again");
    assert_eq!(t_c0.output(&["ip", "route", "show", "default"]).trim(), "", "internal network has a default route");
    assert!(!ping(&t_c0, NODE_IPS[0]), "internal network reached the node");
    assert!(!ping(&t_c0, a0), "internal network reached appnet");

    // Idempotent: the same state again changes nothing.
    assert_eq!(e0.reconcile(&s0).expect("node 0 again"), Vec::<Op>::new());
    assert_eq!(e1.reconcile(&s1).expect("node 1 again"), Vec::<Op>::new());

    // Damage done behind Shoal's back (after a crash, or by hand) is repaired from the state: node 0 loses
    // appnet's bridge (its veths fall off it), node 1 the forwarding entry towards a0.
    nodes.in_network(0, 4242, &["ip", "link", "del", "shlb4242"]);
    nodes.in_network(1, 4242, &["ip", "neigh", "flush", "dev", "shlx4242", "nud", "permanent"]);
    let mac = mac_for(a0).to_string();
    nodes.in_network(1, 4242, &["bridge", "fdb", "del", &mac, "dev", "shlx4242", "dst", "192.168.77.1", "self"]);
    assert!(!ping(&t_a0, a1), "the damage did not cut appnet");
    let ops = e0.reconcile(&s0).expect("node 0 repaired");
    assert!(ops.iter().any(|o| matches!(o, Op::SetMaster { name, .. } if name.starts_with("shlv"))), "{ops:?}");
    let ops = e1.reconcile(&s1).expect("node 1 repaired");
    assert!(matches!(ops.as_slice(), [Op::AddFdb { .. }, Op::AddNeigh { .. }]), "{ops:?}");
    wait_for("a0 to ping a1 after the repair", Duration::from_secs(5), || ping(&t_a0, a1));
    assert_eq!(e0.reconcile(&s0).expect("node 0 again"), Vec::<Op>::new());

    // A task that goes away takes its veth; the network stays for the others.
    s0.tasks.retain(|t| t.task_id != "b0");
    let ops = e0.reconcile(&s0).expect("b0 removed");
    assert!(matches!(ops.as_slice(), [Op::DeleteNetLink { name, .. }] if name.starts_with("shlv")), "{ops:?}");
    assert!(ping(&t_a1, a0));

    // Removing everything leaves nothing of Shoal's on either node.
    drop(srv);
    nodes.tear_down(&[e0, e1]);
}

#[test]
fn a_vip_spreads_connections_over_its_backends_and_follows_them() {
    let nodes = Nodes::new("vip");
    let (client, web1, web2) = (Ipv4Addr::new(10, 30, 0, 2), Ipv4Addr::new(10, 30, 0, 3), Ipv4Addr::new(10, 30, 0, 4));
    let vip = Ipv4Addr::new(10, 30, 0, 200);
    let (t_client, t_web1, t_web2) = (nodes.task("cl"), nodes.task("w1"), nodes.task("w2"));

    // The client and web1 on node 0, web2 on node 1: one backend local, one across VXLAN.
    let mut appnet = network("appnet", 5001, 30, false);
    appnet.services = vec![ServiceVip {
        service_id: "web".into(),
        name: "web".into(),
        aliases: Vec::new(),
        vip: Some(vip),
        backends: vec![web1, web2],
        backends6: Vec::new(),
    }];
    let mut s0 = NodeNetState::new(NODE_IPS[0]);
    let mut n0 = appnet.clone();
    n0.peers = vec![peer(web2, 1)];
    s0.networks = vec![n0];
    s0.tasks = vec![task("client", &t_client, &[("appnet", client)]), task("web1", &t_web1, &[("appnet", web1)])];
    let mut s1 = NodeNetState::new(NODE_IPS[1]);
    let mut n1 = appnet;
    n1.peers = vec![peer(client, 0), peer(web1, 0)];
    s1.networks = vec![n1];
    s1.tasks = vec![task("web2", &t_web2, &[("appnet", web2)])];
    let (e0, e1) = (nodes.exec(0), nodes.exec(1));
    e0.reconcile(&s0).expect("node 0");
    e1.reconcile(&s1).expect("node 1");
    let _srv1 = Server::start(t_web1.path(), web1, "web1");
    let _srv2 = Server::start(t_web2.path(), web2, "web2");

    let timeout = Duration::from_secs(2);
    wait_for("the VIP to answer", Duration::from_secs(5), || fetch(t_client.path(), vip, timeout).is_ok());

    // The client finds the service by name through the node's resolver, as `http://web/` would.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let resolver = shoal_netplane::Resolver::new(Vec::new());
    rt.block_on(resolver.update(&s0)).expect("resolver");
    assert_eq!(resolve(t_client.path(), "web"), vec![vip]);
    let mut by_name = resolve(t_client.path(), "tasks.web");
    by_name.sort();
    assert_eq!(by_name, vec![web1, web2]);
    assert!(fetch(t_client.path(), resolve(t_client.path(), "web")[0], timeout).is_ok());
    drop(resolver);

    // Connections per second (one at a time) through the VIP and straight to each backend; printed for the
    // design notes (`--no-capture`), not asserted.
    for (what, to) in [("VIP", vip), ("web1 (same node)", web1), ("web2 (across VXLAN)", web2)] {
        let n = 300;
        let start = Instant::now();
        for _ in 0..n {
            fetch(t_client.path(), to, timeout).expect("connection");
        }
        let rate = f64::from(n) / start.elapsed().as_secs_f64();
        eprintln!("RESULT connections/s to {what}: {rate:.0}");
    }
    let count = |n: usize| {
        let (mut w1, mut w2) = (0, 0);
        for _ in 0..n {
            match fetch(t_client.path(), vip, timeout).expect("VIP connection").as_str() {
                "web1" => w1 += 1,
                "web2" => w2 += 1,
                other => panic!("unexpected answer {other:?}"),
            }
        }
        (w1, w2)
    };
    let (w1, w2) = count(100);
    // With an even random spread, fewer than 20 of 100 on one side has a probability below 1e-9.
    assert!(w1 >= 20 && w2 >= 20, "uneven spread over the VIP: web1 {w1}, web2 {w2}");

    // A backend goes away: only the task table of the client (and of web1, which has the VIP too) changes,
    // and every connection lands on the one left.
    s0.networks[0].services[0].backends = vec![web2];
    let ops = e0.reconcile(&s0).expect("backends shrink");
    assert!(ops.iter().all(|o| matches!(o, Op::ApplyTaskTable { .. })) && ops.len() == 2, "{ops:?}");
    assert_eq!(count(20), (0, 20));

    // No backend: connections to the VIP are refused at once, not left to time out.
    s0.networks[0].services[0].backends.clear();
    e0.reconcile(&s0).expect("no backends");
    let err = fetch(t_client.path(), vip, timeout).expect_err("a VIP without backends answered");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");

    // The service goes away: the task tables go with it; then everything.
    s0.networks[0].services.clear();
    let ops = e0.reconcile(&s0).expect("service removed");
    assert!(ops.iter().all(|o| matches!(o, Op::DeleteTaskTable { .. })) && ops.len() == 2, "{ops:?}");
    assert!(!t_client.output(&["nft", "list", "tables"]).contains("shoal"));
    nodes.tear_down(&[e0, e1]);
}

#[test]
fn a_published_port_answers_on_both_nodes_through_the_mesh_and_is_refused_without_backends() {
    let nodes = Nodes::new("mesh");
    let (web1, web2) = (Ipv4Addr::new(10, 40, 0, 3), Ipv4Addr::new(10, 40, 0, 4));
    let ingress_addr = [Ipv4Addr::new(10, 40, 0, 250), Ipv4Addr::new(10, 40, 0, 251)];
    let (t_web1, t_web2) = (nodes.task("w1"), nodes.task("w2"));
    // web1 on node 0, web2 on node 1; each node has its ingress address and forwards PORT to both.
    let published =
        vec![PublishedPort { protocol: Protocol::Tcp, port: PORT, target_port: PORT, backends: vec![web1, web2] }];
    let state = |i: usize, web: (&str, &Netns, Ipv4Addr), remote: Ipv4Addr| {
        let mut s = NodeNetState::new(NODE_IPS[i]);
        let mut n = network("ingress", 5100, 40, false);
        n.peers = vec![peer(remote, 1 - i), peer(ingress_addr[1 - i], 1 - i)];
        s.networks = vec![n];
        s.tasks = vec![task(web.0, web.1, &[("ingress", web.2)])];
        s.ingress = Some(NodeIngress { network_id: "ingress".into(), address: ingress_addr[i] });
        s.published = published.clone();
        s
    };
    let mut s0 = state(0, ("web1", &t_web1, web1), web2);
    let s1 = state(1, ("web2", &t_web2, web2), web1);
    let (e0, e1) = (nodes.exec(0), nodes.exec(1));
    e0.reconcile(&s0).expect("node 0");
    e1.reconcile(&s1).expect("node 1");
    assert!(e0.reconcile(&s0).expect("again").is_empty(), "a second reconcile changes nothing");
    let _srv1 = Server::start(t_web1.path(), web1, "web1");
    let _srv2 = Server::start(t_web2.path(), web2, "web2");

    // From the other node (prerouting) and from the node itself (output), to either node's address.
    let timeout = Duration::from_secs(2);
    for (from, to) in [(1, 0), (0, 0), (0, 1), (1, 1)] {
        let (mut w1, mut w2) = (0, 0);
        for _ in 0..20 {
            match fetch(nodes.nodes[from].path(), NODE_IPS[to], timeout)
                .unwrap_or_else(|e| panic!("node {from} to node {to}'s address: {e}"))
                .as_str()
            {
                "web1" => w1 += 1,
                "web2" => w2 += 1,
                other => panic!("unexpected answer {other:?}"),
            }
        }
        // `numgen inc`: an even spread.
        assert_eq!((w1, w2), (10, 10), "node {from} to node {to}'s address");
    }
    // On each node's loopback too, as Docker's mesh answers `curl localhost:8080` (the node's own
    // connections; the backends on the other node answer across VXLAN).
    for i in 0..2 {
        let mut answers = std::collections::BTreeMap::new();
        for _ in 0..20 {
            let a = fetch(nodes.nodes[i].path(), Ipv4Addr::LOCALHOST, timeout)
                .unwrap_or_else(|e| panic!("node {i} to 127.0.0.1:{PORT}: {e}"));
            *answers.entry(a).or_insert(0) += 1;
        }
        assert_eq!(answers, [("web1".to_string(), 10), ("web2".to_string(), 10)].into(), "node {i} on 127.0.0.1");
    }

    // The bridges route loopback addresses for those replies; a task that sends to 127.0.0.1 through its
    // gateway still reaches nothing on its node's loopback: the guard drops it (and, as a control, lets it
    // through once its rules are flushed by hand).
    // (127.0.0.2: the task keeps 127.0.0.1 as its own; its 127.0.0.0/8 local route goes, so 127.0.0.2 leaves
    // by its gateway, and its eth0 takes loopback sources for the answer.)
    let guarded = std::net::SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 2), 9099));
    let listener = in_netns(nodes.nodes[0].path(), move || {
        TcpListener::bind(guarded).expect("a loopback-only listener on node 0")
    });
    listener.set_nonblocking(true).expect("nonblocking");
    for cmd in [
        &["ip", "route", "del", "local", "127.0.0.0/8", "dev", "lo", "table", "local"][..],
        &["ip", "route", "add", "127.0.0.0/8", "via", "10.40.0.1", "dev", "eth0"],
        &["sysctl", "-qw", "net.ipv4.conf.eth0.route_localnet=1"],
    ] {
        assert!(t_web1.exec(cmd), "in web1's namespace: {cmd:?}");
    }
    let try_loopback =
        |limit: Duration| in_netns(t_web1.path(), move || TcpStream::connect_timeout(&guarded, limit).map(drop));
    let err = try_loopback(Duration::from_millis(700)).expect_err("a task reached node 0's loopback-only listener");
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "dropped, not refused: {err}");
    assert!(listener.accept().is_err(), "the listener saw a connection");
    let flush = ["nft", "flush", "chain", "ip", "shoal", "loopback_guard"];
    assert!(nodes.nodes[0].exec(&flush), "flush the guard on node 0");
    try_loopback(Duration::from_secs(5))
        .expect("without the guard the same connection goes through: the test's setup is sound");
    e0.reconcile(&NodeNetState::new(NODE_IPS[0])).expect("clear node 0");
    e0.reconcile(&s0).expect("node 0 again");

    // No backend: refused at once on node 0.
    s0.published[0].backends.clear();
    e0.reconcile(&s0).expect("no backends");
    let err = fetch(nodes.nodes[1].path(), NODE_IPS[0], timeout).expect_err("answered without backends");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");

    nodes.tear_down(&[e0, e1]);
}

#[test]
fn the_kernel_has_what_the_data_plane_needs_and_encrypted_networks_are_refused() {
    let caps = shoal_netplane::probe().expect("probe");
    let encryption = shoal_netplane::probe_encryption().expect("probe of encryption");
    // Measured on the development machine: vxlan and nft_nat true, esp and wireguard false.
    eprintln!("kernel capabilities: {caps:?} {encryption:?}");
    assert!(caps.vxlan && caps.nft_nat, "{caps:?}");

    let nodes = Nodes::new("enc");
    let t = nodes.task("t");
    let mut s = NodeNetState::new(NODE_IPS[0]);
    let mut n = network("secret", 6001, 40, false);
    n.encrypted = true;
    s.networks = vec![n];
    s.tasks = vec![task("t", &t, &[("secret", Ipv4Addr::new(10, 40, 0, 2))])];
    let err = nodes.exec(0).reconcile(&s).expect_err("an encrypted network was plumbed");
    assert!(matches!(err, shoal_netplane::Error::EncryptionUnsupported { .. }), "{err}");
    assert_eq!(nodes.leftovers(0), "", "a refused state changed the node");
}

/// An nftables-only firewall (firewalld's nftables back end, no zone for Shoal's interfaces: its forward chain
/// drops): traffic inside a network, on one node and across VXLAN, works without Shoal adding anything to it;
/// what the node forwards out of a network is the host firewall's to allow (firewalld's trusted zone for
/// `shlg+`), and Shoal adds no iptables table or rule of its own there.
#[test]
fn an_nftables_only_firewall_keeps_east_west_traffic_and_decides_north_south() {
    let nodes = Nodes::prepared("nf", |ns, _| docker_host::prepare_nft_only(ns));
    let firewall = |i: usize| nodes.nodes[i].output(&["nft", "list", "table", "inet", "firewalld"]);
    let before = [firewall(0), firewall(1)];
    let (a0, b0, a1) = (Ipv4Addr::new(10, 30, 0, 2), Ipv4Addr::new(10, 30, 0, 4), Ipv4Addr::new(10, 30, 0, 3));
    let (t_a0, t_b0, t_a1) = (nodes.task("a0"), nodes.task("b0"), nodes.task("a1"));
    let mut appnet = network("appnet", 4545, 30, false);
    appnet.peers = vec![peer(a1, 1)];
    let mut s0 = NodeNetState::new(NODE_IPS[0]);
    s0.networks = vec![appnet.clone()];
    s0.tasks = vec![task("a0", &t_a0, &[("appnet", a0)]), task("b0", &t_b0, &[("appnet", b0)])];
    appnet.peers = vec![peer(a0, 0), peer(b0, 0)];
    let mut s1 = NodeNetState::new(NODE_IPS[1]);
    s1.networks = vec![appnet];
    s1.tasks = vec![task("a1", &t_a1, &[("appnet", a1)])];
    let (e0, e1) = (nodes.exec(0), nodes.exec(1));
    e0.reconcile(&s0).expect("node 0");
    e1.reconcile(&s1).expect("node 1");

    // East-west: on one node and across VXLAN, both ways, TCP too.
    wait_for("a0 to reach a1 over VXLAN", Duration::from_secs(5), || ping(&t_a0, a1));
    assert!(ping(&t_a1, a0) && ping(&t_a1, b0), "node 1 reaches both tasks of node 0");
    assert!(ping(&t_a0, b0) && ping(&t_b0, a0), "tasks of one node reach each other");
    let srv = Server::start(t_a1.path(), a1, "a1");
    assert_eq!(fetch(t_b0.path(), a1, Duration::from_secs(2)).expect("TCP b0 -> a1"), "a1");

    // Shoal added nothing to the host's firewall: no iptables table made, firewalld's table unchanged.
    for (i, n) in nodes.nodes.iter().enumerate() {
        let tables = n.output(&["nft", "list", "tables"]);
        let tables: Vec<&str> = tables.lines().map(str::trim).collect();
        assert_eq!(tables, ["table inet firewalld", "table ip shoal"], "node {i}'s nftables tables");
        assert_eq!(n.output(&["cat", "/proc/net/ip_tables_names"]).trim(), "", "node {i}: a legacy table made");
        assert_eq!(firewall(i), before[i], "node {i}: firewalld's table changed");
    }

    // North-south: what node 0 forwards out of the network (to node 1's address, masqueraded) is dropped by
    // firewalld's forward chain until the host allows Shoal's gateway ends, as `firewall-cmd --zone=trusted
    // --add-interface=shlg4545` does.
    assert!(!ping(&t_a0, NODE_IPS[1]), "firewalld's forward chain let a task's outbound traffic through");
    let chain = ["inet", "firewalld", "filter_FORWARD"];
    let mut rule = vec!["nft", "insert", "rule"];
    rule.extend(chain);
    rule.extend(["iifname", "shlg*", "accept"]);
    assert!(nodes.nodes[0].exec(&rule), "{rule:?}");
    assert!(ping(&t_a0, NODE_IPS[1]), "the trusted gateway end did not let the task out");
    assert!(ping(&t_a0, a1), "east-west still works");

    drop(srv);
    for (i, e) in [e0, e1].iter().enumerate() {
        e.reconcile(&NodeNetState::new(NODE_IPS[i])).expect("teardown");
        let links = nodes.nodes[i].output(&["ip", "-o", "link", "show"]);
        assert!(!links.contains(": shl"), "node {i} keeps Shoal's links: {links}");
        let tables = nodes.nodes[i].output(&["nft", "list", "tables"]);
        assert_eq!(tables.trim(), "table inet firewalld", "node {i}: only the host's table is left");
    }
}

/// The port of `Bulk` servers.
const BULK_PORT: u16 = 8081;

/// A TCP server inside a task namespace that sends zeros on every connection until the peer closes it;
/// stopped on drop.
struct Bulk {
    stop: Arc<AtomicBool>,
    netns: PathBuf,
    addr: SocketAddr,
}

impl Bulk {
    fn start(netns: PathBuf, addr: Ipv4Addr) -> Bulk {
        let addr = SocketAddr::V4(SocketAddrV4::new(addr, BULK_PORT));
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = sync_channel(1);
        let (s, p) = (stop.clone(), netns.clone());
        std::thread::spawn(move || {
            let file = std::fs::File::open(&p).expect("open netns");
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            let listener = match TcpListener::bind(addr) {
                Ok(l) => l,
                Err(e) => return drop(tx.send(Err(e.to_string()))),
            };
            let _ = tx.send(Ok(()));
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(mut c) = conn {
                    std::thread::spawn(move || {
                        let buf = vec![0u8; 64 * 1024];
                        while c.write_all(&buf).is_ok() {}
                    });
                }
            }
        });
        rx.recv().expect("bulk server thread").unwrap_or_else(|e| panic!("bind {addr}: {e}"));
        Bulk { stop, netns, addr }
    }
}

impl Drop for Bulk {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let addr = self.addr;
        in_netns(self.netns.clone(), move || drop(TcpStream::connect_timeout(&addr, Duration::from_secs(1))));
    }
}

/// From `netns`: sequential connections to `to:PORT` (each read to its end) for `each`, then one connection to
/// `to:BULK_PORT` read for `each`: (connections/s, MB/s).
fn rates(netns: PathBuf, to: Ipv4Addr, each: Duration) -> (f64, f64) {
    let start = Instant::now();
    let mut n = 0u32;
    while start.elapsed() < each {
        fetch(netns.clone(), to, Duration::from_secs(2)).unwrap_or_else(|e| panic!("connection to {to}: {e}"));
        n += 1;
    }
    let conns = f64::from(n) / start.elapsed().as_secs_f64();
    let bytes = in_netns(netns, move || {
        let mut c = TcpStream::connect_timeout(&SocketAddr::V4(SocketAddrV4::new(to, BULK_PORT)), each)
            .unwrap_or_else(|e| panic!("bulk connection to {to}: {e}"));
        c.set_read_timeout(Some(Duration::from_secs(2))).expect("timeout");
        let mut buf = vec![0u8; 256 * 1024];
        let (start, mut total) = (Instant::now(), 0u64);
        while start.elapsed() < each {
            total += c.read(&mut buf).expect("bulk read") as u64;
        }
        total as f64 / start.elapsed().as_secs_f64()
    });
    (conns, bytes / 1e6)
}

/// The data plane's rates, side by side in one run on the same two Docker-like nodes (BENCHMARKS.md, "The data
/// plane on Docker-like hosts"): connections per second (one at a time, each a new TCP connection read to its
/// end) and MB/s (one connection), straight to a task on the same node and across VXLAN, through a VIP spread
/// over both, through the routing mesh, and straight to the task the mesh hops to. Printed (`RESULT` lines,
/// `--no-capture`) and asserted only to carry traffic: the machine is shared, so compare within one run.
#[test]
fn the_data_plane_rates_through_the_vip_and_the_mesh_against_direct_connections() {
    let nodes = Nodes::new("rate");
    let (client, web1, web2) = (Ipv4Addr::new(10, 50, 0, 2), Ipv4Addr::new(10, 50, 0, 3), Ipv4Addr::new(10, 50, 0, 4));
    let vip = Ipv4Addr::new(10, 50, 0, 200);
    let (in1, in2) = (Ipv4Addr::new(10, 51, 0, 3), Ipv4Addr::new(10, 51, 0, 4));
    let ingress_addr = [Ipv4Addr::new(10, 51, 0, 250), Ipv4Addr::new(10, 51, 0, 251)];
    let (t_client, t_web1, t_web2) = (nodes.task("cl"), nodes.task("w1"), nodes.task("w2"));
    // The client and web1 on node 0, web2 on node 1; both webs on appnet (the VIP) and ingress (the mesh).
    let mut appnet = network("appnet", 5200, 50, false);
    appnet.services = vec![ServiceVip {
        service_id: "web".into(),
        name: "web".into(),
        aliases: Vec::new(),
        vip: Some(vip),
        backends: vec![web1, web2],
        backends6: Vec::new(),
    }];
    let published: Vec<PublishedPort> = [PORT, BULK_PORT]
        .map(|port| PublishedPort { protocol: Protocol::Tcp, port, target_port: port, backends: vec![in1, in2] })
        .to_vec();
    let state = |i: usize| {
        let mut s = NodeNetState::new(NODE_IPS[i]);
        let (mut app, mut ingress) = (appnet.clone(), network("ingress", 5201, 51, false));
        if i == 0 {
            app.peers = vec![peer(web2, 1)];
            ingress.peers = vec![peer(in2, 1), peer(ingress_addr[1], 1)];
            s.tasks = vec![
                task("client", &t_client, &[("appnet", client)]),
                task("web1", &t_web1, &[("appnet", web1), ("ingress", in1)]),
            ];
        } else {
            app.peers = vec![peer(client, 0), peer(web1, 0)];
            ingress.peers = vec![peer(in1, 0), peer(ingress_addr[0], 0)];
            s.tasks = vec![task("web2", &t_web2, &[("appnet", web2), ("ingress", in2)])];
        }
        s.networks = vec![app, ingress];
        s.ingress = Some(NodeIngress { network_id: "ingress".into(), address: ingress_addr[i] });
        s.published = published.clone();
        s
    };
    let (e0, e1) = (nodes.exec(0), nodes.exec(1));
    e0.reconcile(&state(0)).expect("node 0");
    e1.reconcile(&state(1)).expect("node 1");
    let servers = [
        (Server::start(t_web1.path(), web1, "web1"), Server::start(t_web1.path(), in1, "web1")),
        (Server::start(t_web2.path(), web2, "web2"), Server::start(t_web2.path(), in2, "web2")),
    ];
    let bulks = [
        Bulk::start(t_web1.path(), web1),
        Bulk::start(t_web1.path(), in1),
        Bulk::start(t_web2.path(), web2),
        Bulk::start(t_web2.path(), in2),
    ];
    let timeout = Duration::from_secs(2);
    wait_for("the VIP to answer", Duration::from_secs(5), || fetch(t_client.path(), vip, timeout).is_ok());
    wait_for("the mesh to answer", Duration::from_secs(5), || {
        fetch(nodes.nodes[1].path(), NODE_IPS[0], timeout).is_ok()
    });

    let each = Duration::from_millis(1500);
    let paths: [(&str, PathBuf, Ipv4Addr); 6] = [
        ("task to task, same node", t_client.path(), web1),
        ("task to task, across VXLAN", t_client.path(), web2),
        ("task to the VIP (both backends)", t_client.path(), vip),
        ("node-1 to node-0's published port (mesh, half on to node-1)", nodes.nodes[1].path(), NODE_IPS[0]),
        ("node-1 to web1's ingress address (direct, across VXLAN)", nodes.nodes[1].path(), in1),
        ("node-1 to web2's ingress address (direct, same node)", nodes.nodes[1].path(), in2),
    ];
    for (what, from, to) in paths {
        let (conns, mbs) = rates(from, to, each);
        eprintln!("RESULT data-plane {what}: {conns:.0} connections/s, {mbs:.0} MB/s");
        assert!(conns > 0.0 && mbs > 0.0, "{what}");
    }
    drop((servers, bulks));
    nodes.tear_down(&[e0, e1]);
}
