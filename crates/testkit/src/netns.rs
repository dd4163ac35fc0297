//! Network faults between daemon processes, with Linux network namespaces (needs root and iproute2 and iptables).
//!
//! `Net::new(tag, n)` makes a private "hub" namespace holding a bridge, and `n` node namespaces, each with one
//! veth `eth0` plugged into the bridge and the address `10.77.0.(11+i)/24`. Everything lives in namespaces of
//! its own (named `shoal-t-<pid>-<tag>-...`), so the addresses and interface names never collide with another
//! test or the host, and the host's firewall (e.g. Docker's FORWARD policy) never sees the traffic. A daemon is
//! started inside node `i` with `DaemonOptions::netns`; the test talks to it over its control unix socket, which
//! no network fault touches.
//!
//! Faults:
//! - `isolate(i)` / `heal(i)`: node `i`'s namespace drops every packet arriving on `eth0` and the others drop
//!   every packet from node `i` (iptables INPUT DROP): nothing gets through either way and nothing is refused,
//!   so connections stall as in a real partition (no quick "connection refused");
//! - `delay(i, d)`: every TCP connection into or out of node `i` goes through a proxy that holds each chunk of
//!   bytes for `d` before passing it on (iptables REDIRECT in node `i`'s namespace; the kernel here has no
//!   netem). Undone when the returned `Delay` is dropped.
//!
//! `Net::docker_hosts(tag, n)` prepares each node namespace like a host running Docker (`docker_host`: FORWARD
//! policy DROP with Docker's chains, bridge-nf-call-iptables=1; even nodes iptables-nft, odd ones
//! iptables-legacy), so the data plane meets the firewall swarm users have. `Net::new` leaves them clean: a
//! data-plane test on it would hide what real hosts do.
//!
//! Dropping the `Net` deletes the namespaces (and with them the veths, the bridge and the rules) and the
//! networks' namespaces a daemon's data plane made for a node (`shl-net-<node inode>-<vni>`, named outside
//! the node's namespace); namespaces left by a test process that died (its PID is gone) are deleted by the
//! next `Net::new`. Drop the daemons first: a namespace lives on while a process is inside it.

#[path = "netns_docker_host.rs"]
pub mod docker_host;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Prefix of every namespace this module creates.
const PREFIX: &str = "shoal-t-";
/// Port the delay proxy takes connections on inside the delayed namespace.
const PROXY_PORT: u16 = 14999;
/// Packet mark of the proxy's own outgoing connections (not redirected again).
const PROXY_MARK: u32 = 0x5eed;
/// Most chunks held by one direction of one proxied connection.
const PROXY_QUEUE_CHUNKS: usize = 1024;

/// Runs a command, panicking with its output when it fails.
fn run(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("run {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?} failed ({}): {}{}\n(the network fault tests need root, iproute2 and iptables)",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
}

/// Runs `cmd` inside namespace `ns`.
fn run_in(ns: &str, cmd: &[&str]) {
    let mut args = vec!["ip", "netns", "exec", ns];
    args.extend_from_slice(cmd);
    run(&args);
}

/// Deletes namespaces left by test processes that no longer exist.
fn remove_leftovers() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else { return };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(rest) = name.strip_prefix(PREFIX) else { continue };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) else { continue };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("ip").args(["netns", "del", name]).output();
        }
    }
}

/// A hub and `n` node namespaces; see the module doc.
pub struct Net {
    hub: String,
    nodes: Vec<String>,
    isolated: Mutex<Vec<bool>>,
}

impl Net {
    /// Creates the namespaces for test `tag` (short, unique among the tests of one process).
    pub fn new(tag: &str, n: usize) -> Net {
        remove_leftovers();
        let base = format!("{PREFIX}{}-{tag}", std::process::id());
        let net = Net {
            hub: format!("{base}-hub"),
            nodes: (0..n).map(|i| format!("{base}-{i}")).collect(),
            isolated: Mutex::new(vec![false; n]),
        };
        // From here on, a failure still deletes whatever was created (Drop).
        run(&["ip", "netns", "add", &net.hub]);
        run(&["ip", "-n", &net.hub, "link", "add", "br0", "type", "bridge"]);
        run(&["ip", "-n", &net.hub, "link", "set", "br0", "up"]);
        for (i, ns) in net.nodes.iter().enumerate() {
            let port = format!("v{i}");
            run(&["ip", "netns", "add", ns]);
            run(&["ip", "-n", &net.hub, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", ns]);
            run(&["ip", "-n", &net.hub, "link", "set", &port, "master", "br0"]);
            run(&["ip", "-n", &net.hub, "link", "set", &port, "up"]);
            run(&["ip", "-n", ns, "addr", "add", &format!("{}/24", net.ip(i)), "dev", "eth0"]);
            run(&["ip", "-n", ns, "link", "set", "eth0", "up"]);
            run(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        net
    }

    /// As `new`, with every node prepared like a Docker host (see the module doc).
    pub fn docker_hosts(tag: &str, n: usize) -> Net {
        let net = Net::new(tag, n);
        for (i, ns) in net.nodes.iter().enumerate() {
            docker_host::prepare(ns, docker_host::for_node(i));
        }
        net
    }

    /// The names of the networks' namespaces the data plane of node `i` has (`shl-net-<node inode>-<vni>`).
    pub fn network_namespaces(&self, i: usize) -> Vec<String> {
        network_namespaces_of(&self.nodes[i])
    }

    /// The hub's namespace (holding the underlay's bridge `br0`; a test plugs more veths into it, e.g. a
    /// router beyond the nodes).
    pub fn hub(&self) -> &str {
        &self.hub
    }

    /// Node `i`'s namespace name (for `DaemonOptions::netns`).
    pub fn ns(&self, i: usize) -> &str {
        &self.nodes[i]
    }

    /// Node `i`'s address.
    pub fn ip(&self, i: usize) -> String {
        format!("10.77.0.{}", 11 + i)
    }

    /// Cuts node `i` off from every other node, both directions, silently (packets are dropped, nothing is
    /// refused) until `heal(i)`: node `i` drops what arrives on `eth0`, the others drop what comes from it.
    pub fn isolate(&self, i: usize) {
        let mut iso = self.isolated.lock().expect("net lock");
        if !iso[i] {
            for (args, ns) in self.cut_rules(i) {
                let mut cmd = vec!["iptables", "-w", "-A"];
                cmd.extend(args.iter().map(String::as_str));
                run_in(&ns, &cmd);
            }
            iso[i] = true;
        }
    }

    /// Reconnects node `i`.
    pub fn heal(&self, i: usize) {
        let mut iso = self.isolated.lock().expect("net lock");
        if iso[i] {
            for (args, ns) in self.cut_rules(i) {
                let mut cmd = vec!["iptables", "-w", "-D"];
                cmd.extend(args.iter().map(String::as_str));
                run_in(&ns, &cmd);
            }
            iso[i] = false;
        }
    }

    /// The INPUT rules (and their namespaces) that cut node `i` off.
    fn cut_rules(&self, i: usize) -> Vec<(Vec<String>, String)> {
        let mut rules = vec![(["INPUT", "-i", "eth0", "-j", "DROP"].map(String::from).to_vec(), self.nodes[i].clone())];
        for (j, ns) in self.nodes.iter().enumerate() {
            if j != i {
                rules.push((["INPUT", "-s", &self.ip(i), "-j", "DROP"].map(String::from).to_vec(), ns.clone()));
            }
        }
        rules
    }

    /// Delays every TCP connection into and out of node `i` by `delay` each way, until the result is dropped.
    pub fn delay(&self, i: usize, delay: Duration) -> Delay {
        Delay::start(&self.nodes[i], delay)
    }
}

/// The networks' namespaces named after node namespace `ns` (its inode), under /run/netns.
fn network_namespaces_of(ns: &str) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let Ok(key) = std::fs::metadata(format!("/run/netns/{ns}")).map(|m| m.ino()) else { return Vec::new() };
    let prefix = format!("shl-net-{key}-");
    let mut out: Vec<String> = std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(&prefix))
        .collect();
    out.sort();
    out
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in &self.nodes {
            for n in network_namespaces_of(ns) {
                let _ = Command::new("ip").args(["netns", "del", &n]).output();
            }
        }
        for ns in self.nodes.iter().chain(std::iter::once(&self.hub)) {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

/// Rules of the delay proxy in a namespace, as `iptables -t nat` arguments after `-A`/`-D`.
fn delay_rules() -> Vec<Vec<String>> {
    let p = PROXY_PORT.to_string();
    let mark = format!("0x{PROXY_MARK:x}");
    vec![
        // Connections into the namespace.
        ["PREROUTING", "-i", "eth0", "-p", "tcp", "-j", "REDIRECT", "--to-ports", &p].map(String::from).to_vec(),
        // Connections out of it, except the proxy's own.
        ["OUTPUT", "-o", "eth0", "-p", "tcp", "-m", "mark", "!", "--mark", &mark, "-j", "REDIRECT", "--to-ports", &p]
            .map(String::from)
            .to_vec(),
    ]
}

/// A running delay on one namespace: the proxy's threads and the redirect rules. Dropping it removes the rules
/// and closes the proxied connections (the daemons reconnect directly).
pub struct Delay {
    ns: String,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl Delay {
    fn start(ns: &str, delay: Duration) -> Delay {
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::new(Mutex::new(Vec::new()));
        // The listener is made on a thread that entered the namespace (a network namespace is per thread), and
        // every socket keeps the namespace it was made in.
        let (ready_tx, ready_rx) = sync_channel::<Result<(), String>>(1);
        let ns_path = format!("/var/run/netns/{ns}");
        let (stop2, conns2) = (stop.clone(), conns.clone());
        let accept = std::thread::spawn(move || {
            let entered = std::fs::File::open(&ns_path)
                .map_err(|e| format!("open {ns_path}: {e}"))
                .and_then(|f| {
                    nix::sched::setns(f.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                        .map_err(|e| format!("setns {ns_path}: {e}"))
                })
                .and_then(|()| {
                    TcpListener::bind(("0.0.0.0", PROXY_PORT)).map_err(|e| format!("bind the delay proxy: {e}"))
                });
            let listener = match entered {
                Ok(l) => l,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let _ = listener.set_nonblocking(true);
            let _ = ready_tx.send(Ok(()));
            while !stop2.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let _ = client.set_nonblocking(false);
                        if let Err(e) = proxy_connection(client, delay, &conns2) {
                            eprintln!("delay proxy: {e}");
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => eprintln!("delay proxy accept: {e}"),
                }
            }
        });
        let d = Delay { ns: ns.to_string(), stop, conns, accept: Some(accept) };
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("delay proxy in {ns}: {e}"),
            Err(_) => panic!("delay proxy in {ns} did not start"),
        }
        for rule in delay_rules() {
            let mut args = vec!["iptables", "-w", "-t", "nat", "-A"];
            args.extend(rule.iter().map(String::as_str));
            run_in(&d.ns, &args);
        }
        // Connections made before the rules keep going direct: cut them so that they reconnect through the proxy.
        cut_tcp(&d.ns);
        d
    }
}

/// Kills the namespace's established TCP connections (`ss -K`), so that they are made again.
fn cut_tcp(ns: &str) {
    let _ = Command::new("ip").args(["netns", "exec", ns, "ss", "-K", "-t", "state", "established"]).output();
}

impl Drop for Delay {
    fn drop(&mut self) {
        for rule in delay_rules() {
            let mut args = vec!["ip", "netns", "exec", &self.ns, "iptables", "-w", "-t", "nat", "-D"];
            args.extend(rule.iter().map(String::as_str));
            let _ = Command::new(args[0]).args(&args[1..]).output();
        }
        self.stop.store(true, Ordering::SeqCst);
        for c in self.conns.lock().expect("proxy lock").drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// Connects to where `client` was going (its original destination, from the REDIRECT) and pumps both ways with
/// the delay, on four threads (a reader and a delayed writer per direction).
fn proxy_connection(client: TcpStream, delay: Duration, conns: &Mutex<Vec<TcpStream>>) -> Result<(), String> {
    let dst = original_dst(&client)?;
    let server = {
        let sock = nix::sys::socket::socket(
            nix::sys::socket::AddressFamily::Inet,
            nix::sys::socket::SockType::Stream,
            nix::sys::socket::SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(|e| format!("socket: {e}"))?;
        nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::Mark, &PROXY_MARK)
            .map_err(|e| format!("SO_MARK: {e}"))?;
        let stream = TcpStream::from(sock);
        let addr = nix::sys::socket::SockaddrIn::from(match dst {
            SocketAddr::V4(a) => a,
            SocketAddr::V6(_) => return Err("IPv6 destination".into()),
        });
        nix::sys::socket::connect(std::os::fd::AsRawFd::as_raw_fd(&stream), &addr)
            .map_err(|e| format!("connect {dst}: {e}"))?;
        stream
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    {
        let mut c = conns.lock().expect("proxy lock");
        c.push(client.try_clone().map_err(|e| e.to_string())?);
        c.push(server.try_clone().map_err(|e| e.to_string())?);
    }
    for (from, to) in [(client.try_clone(), server.try_clone()), (server.try_clone(), client.try_clone())] {
        let (from, to) = (from.map_err(|e| e.to_string())?, to.map_err(|e| e.to_string())?);
        let (tx, rx) = sync_channel::<(Instant, Vec<u8>)>(PROXY_QUEUE_CHUNKS);
        let mut reader = from;
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if tx.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        std::thread::spawn(move || write_delayed(rx, to));
    }
    Ok(())
}

/// Writes each chunk when its time has come; closes the write side when the reader ends.
fn write_delayed(rx: Receiver<(Instant, Vec<u8>)>, mut to: TcpStream) {
    while let Ok((at, bytes)) = rx.recv() {
        let now = Instant::now();
        if at > now {
            // The fault itself: this chunk is due later.
            std::thread::sleep(at - now);
        }
        if to.write_all(&bytes).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

/// The address a redirected connection was going to (SO_ORIGINAL_DST).
fn original_dst(s: &TcpStream) -> Result<SocketAddr, String> {
    let a = nix::sys::socket::getsockopt(s, nix::sys::socket::sockopt::OriginalDst)
        .map_err(|e| format!("SO_ORIGINAL_DST: {e}"))?;
    let ip = std::net::Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
    Ok(SocketAddr::from((ip, u16::from_be(a.sin_port))))
}
