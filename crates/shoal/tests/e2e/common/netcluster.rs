//! A cluster of three `shoal daemon`s (one manager, two workers; process executor, or the docker executor with
//! `start_docker`, the three sharing the machine's Docker Engine), each in its own network namespace
//! (`shoal_testkit::netns`), so each carries its own data plane (networks' namespaces, gateway veths, nftables
//! table, iptables rules) and the overlay crosses a real (veth) underlay between them; hostnames node-0..2.
//! Each node namespace is prepared like a host running Docker (`Net::docker_hosts`: FORWARD policy DROP with
//! Docker's chains, bridge-nf-call-iptables=1; node-0 and node-2 with iptables-nft, node-1 with
//! iptables-legacy), as the hosts swarm users have. Used by the tests
//! of the data plane, the routing mesh, the docker executor on networks and of stacks that run.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::Value;
use shoal_testkit::daemon::DaemonOptions;
use shoal_testkit::docker_engine::engine;
use shoal_testkit::netns::Net;

use super::{desired, docker_cli, shoal_bin, state, tasks_of, wait_until, DaemonProcess};

/// The remote API port of every node (each has its own namespace, hence its own port space).
pub(crate) const PORT: u16 = 4242;
const WAIT: Duration = Duration::from_secs(60);
/// Docker tasks wait longer (the holder image is loaded, containers are created through the engine).
const DOCKER_WAIT: Duration = Duration::from_secs(90);

/// The python3 of the process executor's tasks.
pub(crate) const PYTHON: &str = "/usr/bin/python3";

/// An HTTP server on port 80 answering every request with the address the connection arrived at (the task's
/// own address on the network, also when the client connected to the VIP or through the mesh). Only `socket`
/// is imported (python runs with `-S`): it listens within milliseconds of its start, so a task reported
/// RUNNING answers almost at once (the process executor has no health check to wait for).
pub(crate) const SERVER: &str = r#"
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('0.0.0.0', 80))
s.listen(128)
while True:
    c, _ = s.accept()
    try:
        c.settimeout(2)
        c.recv(4096)
        b = c.getsockname()[0].encode()
        c.sendall(b'HTTP/1.0 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n' % len(b) + b)
    except OSError:
        pass
    finally:
        c.close()
"#;

/// One manager and two workers, each in its own namespace; hostnames node-0..2.
/// `CLIENT host port n [rate]`: `n` sequential GETs (a connection each, 3 s timeout), then one line
/// `answer=count ...` (failures counted as `error:<kind>`); with `rate`, one more line `RATE <requests/s>`
/// (and the first failure ends the run).
pub(crate) const CLIENT: &str = r#"
import socket, sys, time, collections
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
seen = collections.Counter()
t0 = time.time()
for i in range(n):
    try:
        s = socket.create_connection((host, port), timeout=3)
        s.sendall(b'GET / HTTP/1.0\r\n\r\n')
        data = b''
        while True:
            d = s.recv(4096)
            if not d:
                break
            data += d
        s.close()
        seen[data.split(b'\r\n\r\n', 1)[1].decode()] += 1
    except OSError as e:
        seen['error:' + type(e).__name__] += 1
        if len(sys.argv) > 4:
            break
took = time.time() - t0
print(' '.join('%s=%d' % kv for kv in sorted(seen.items())))
if len(sys.argv) > 4:
    print('RATE %.0f' % (n / took))
"#;

/// Shoal daemons in network namespaces of their own, joined into one cluster, with their tasks.
pub(crate) struct Cluster {
    /// The daemons, the first one the manager. Dropped before `net`: a namespace lives on while a process
    /// is inside it.
    pub ds: Vec<DaemonProcess>,
    /// The nodes' IDs, in the order of `ds`.
    pub node_ids: Vec<String>,
    /// The namespaces and links the daemons live in.
    pub net: Net,
    /// "process" or "docker".
    executor: &'static str,
    /// Every task ID seen, so that a failed test still deletes their namespaces.
    pub tasks_seen: BTreeSet<String>,
}

/// Daemon `i`'s options in `net` with `executor` and `extra_args`.
pub(crate) fn options(net: &Net, i: usize, executor: &str, extra_args: Vec<String>) -> DaemonOptions {
    DaemonOptions {
        listen_ip: Some(net.ip(i)),
        port: Some(PORT),
        netns: Some(net.ns(i).to_string()),
        hostname: Some(format!("node-{i}")),
        executor: Some(executor.into()),
        extra_args,
        ..DaemonOptions::default()
    }
}

fn node_id(d: &DaemonProcess) -> String {
    let info = d.get("/v1.47/info");
    let id = info["Swarm"]["NodeID"].as_str().unwrap_or_default().to_string();
    assert!(!id.is_empty(), "/info has no Swarm.NodeID: {info}");
    id
}

impl Cluster {
    /// Three process-executor nodes.
    pub(crate) fn start(tag: &str) -> Cluster {
        Cluster::start_with(tag, "process")
    }

    /// Three docker-executor nodes; dropping the cluster removes their containers and holders too.
    pub(crate) fn start_docker(tag: &str) -> Cluster {
        Cluster::start_with(tag, "docker")
    }

    /// One node (a one-node swarm) with `executor`, in its namespace prepared like a Docker host.
    pub(crate) fn start_one(tag: &str, executor: &'static str) -> Cluster {
        Cluster::start_nodes(tag, executor, 1)
    }

    fn start_with(tag: &str, executor: &'static str) -> Cluster {
        Cluster::start_nodes(tag, executor, 3)
    }

    fn start_nodes(tag: &str, executor: &'static str, nodes: usize) -> Cluster {
        let mut c = Cluster::start_first(tag, executor, nodes);
        for i in 1..nodes {
            c.join(i);
        }
        c
    }

    /// The namespaces of `nodes` nodes, with only node-0 (the manager) started: the others join with `join`.
    pub(crate) fn start_first(tag: &str, executor: &'static str, nodes: usize) -> Cluster {
        let net = Net::docker_hosts(tag, nodes);
        let first = DaemonProcess::start_with(&shoal_bin(), options(&net, 0, executor, vec![]));
        let c =
            Cluster { node_ids: vec![node_id(&first)], ds: vec![first], net, executor, tasks_seen: BTreeSet::new() };
        c.wait_ready();
        c
    }

    /// As `start_first`, with node-0 started in no swarm (`--no-init`) and made the swarm's first manager by
    /// `docker swarm init` on its socket with `init_args` added (the address flags are given here).
    pub(crate) fn start_first_init(tag: &str, executor: &'static str, nodes: usize, init_args: &[&str]) -> Cluster {
        let net = Net::docker_hosts(tag, nodes);
        let first = DaemonProcess::start_with(&shoal_bin(), options(&net, 0, executor, vec!["--no-init".into()]));
        let addr = format!("{}:{PORT}", net.ip(0));
        let mut args = vec!["swarm", "init", "--listen-addr", &addr, "--advertise-addr", &addr];
        args.extend_from_slice(init_args);
        docker_cli::ok(first.socket(), &args);
        let c =
            Cluster { node_ids: vec![node_id(&first)], ds: vec![first], net, executor, tasks_seen: BTreeSet::new() };
        c.wait_ready();
        c
    }

    /// Node `i` joins as a worker (the nodes join in order); returns once every started node is ready.
    pub(crate) fn join(&mut self, i: usize) {
        self.join_with(i, &[]);
    }

    /// As `join`, with `extra` daemon flags.
    pub(crate) fn join_with(&mut self, i: usize, extra: &[&str]) {
        assert_eq!(i, self.ds.len(), "nodes join in order");
        let token = self.ds[0].get("/v1.47/swarm")["JoinTokens"]["Worker"].as_str().expect("worker token").to_string();
        let mut join = vec!["--join-addr".into(), self.ds[0].remote_addr(), "--join-token".into(), token];
        join.extend(extra.iter().map(|a| a.to_string()));
        let d = DaemonProcess::start_with(&shoal_bin(), options(&self.net, i, self.executor, join));
        self.node_ids.push(node_id(&d));
        self.ds.push(d);
        self.wait_ready();
    }

    /// Waits until every started node is ready with the overlay plugin.
    fn wait_ready(&self) {
        let nodes = self.ds.len();
        wait_until(&format!("{nodes} nodes ready, each with the overlay plugin"), WAIT, || {
            let listed = self.ds[0].get("/v1.47/nodes");
            let ready: Vec<&Value> = listed
                .as_array()
                .into_iter()
                .flatten()
                .filter(|n| n["Status"]["State"] == "ready")
                .filter(|n| {
                    n["Description"]["Engine"]["Plugins"]
                        .as_array()
                        .is_some_and(|p| p.iter().any(|p| p["Type"] == "Network" && p["Name"] == "overlay"))
                })
                .collect();
            if ready.len() == nodes {
                Ok(())
            } else {
                Err(format!("{listed}"))
            }
        });
    }

    /// The manager's daemon.
    pub(crate) fn manager(&self) -> &DaemonProcess {
        &self.ds[0]
    }

    /// The docker CLI's output of `args` against the manager (the test fails if it fails).
    pub(crate) fn docker(&self, args: &[&str]) -> String {
        docker_cli::ok(self.manager().socket(), args)
    }

    /// The service's running tasks, once there are `n`.
    pub(crate) fn running(&mut self, service: &str, n: usize) -> Vec<Value> {
        let wait = if self.executor == "docker" { DOCKER_WAIT } else { WAIT };
        let tasks = wait_until(&format!("{n} running tasks of {service}"), wait, || {
            let tasks = tasks_of(self.manager(), service);
            for t in &tasks {
                self.tasks_seen.insert(t["ID"].as_str().unwrap_or_default().to_string());
            }
            let running: Vec<Value> =
                tasks.iter().filter(|t| state(t) == "running" && desired(t) == "running").cloned().collect();
            let problems: Vec<String> = tasks
                .iter()
                .filter(|t| !t["Status"]["Err"].as_str().unwrap_or("").is_empty())
                .map(|t| format!("{}: {}", state(t), t["Status"]["Err"]))
                .collect();
            if running.len() == n {
                Ok(running)
            } else {
                Err(format!("{} running; {problems:?}", running.len()))
            }
        });
        tasks
    }

    /// The first virtual IP of `service` (without its prefix length).
    pub(crate) fn vip(&self, service: &str) -> String {
        let ep = &self.manager().get(&format!("/v1.47/services/{service}"))["Endpoint"];
        let vip = ep["VirtualIPs"][0]["Addr"].as_str().unwrap_or_else(|| panic!("{service} has no VIP: {ep}"));
        vip.split('/').next().unwrap().to_string()
    }

    /// The hostname index of the node task `t` runs on.
    pub(crate) fn node_of(&self, t: &Value) -> usize {
        let node = t["NodeID"].as_str().unwrap();
        let host = self.manager().get(&format!("/v1.47/nodes/{node}"))["Description"]["Hostname"]
            .as_str()
            .unwrap()
            .to_string();
        host.trim_start_matches("node-").parse().unwrap()
    }

    /// Runs `cmd` in node `i`'s namespace; its output.
    pub(crate) fn in_node(&self, i: usize, cmd: &[&str]) -> String {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", self.net.ns(i)])
            .args(cmd)
            .output()
            .expect("ip netns exec");
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    }

    /// The engine's containers (running or not, holders too) of node `i`.
    pub(crate) fn containers(&self, i: usize) -> Vec<String> {
        shoal_testkit::docker_engine::containers_of_node(&self.node_ids[i])
    }

    /// What Shoal's data plane has on node `i`: the Shoal links (`shl*`) of its namespace and of its networks'
    /// namespaces, those namespaces, and its iptables FORWARD rules (comment `shoal-netplane`, both back ends).
    pub(crate) fn shoal_links(&self, i: usize) -> Vec<String> {
        self.shoal_links_with_index(i).iter().map(|l| l.split('#').next().unwrap_or_default().to_string()).collect()
    }

    /// As `shoal_links`, links with their interface index (`name#index`, `name#index@<network namespace>`: a
    /// link made again gets a new one).
    pub(crate) fn shoal_links_with_index(&self, i: usize) -> BTreeSet<String> {
        let links = |out: String, at: &str| -> Vec<String> {
            out.lines()
                .filter_map(|l| {
                    let mut f = l.split(':');
                    let index = f.next()?.trim().to_string();
                    let name = f.next()?.trim().split('@').next()?.to_string();
                    name.starts_with("shl").then(|| format!("{name}#{index}{at}"))
                })
                .collect()
        };
        let mut out: BTreeSet<String> = links(self.in_node(i, &["ip", "-o", "link", "show"]), "").into_iter().collect();
        for ns in self.net.network_namespaces(i) {
            let o = std::process::Command::new("ip").args(["-n", &ns, "-o", "link", "show"]).output();
            let text = o.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
            out.extend(links(text, &format!("@{ns}")));
            out.insert(ns);
        }
        out.extend(shoal_testkit::netns::docker_host::shoal_rules(self.net.ns(i)));
        out
    }

    /// The task namespaces (`/run/netns/shl-task-<id>`) of the tasks seen that are still there.
    pub(crate) fn task_namespaces(&self) -> Vec<String> {
        self.tasks_seen
            .iter()
            .map(|id| format!("shl-task-{id}"))
            .filter(|n| std::path::Path::new("/run/netns").join(n).exists())
            .collect()
    }

    /// `CLIENT` run in node `from`'s namespace against `host:port`: the answers counted.
    pub(crate) fn get(&self, from: usize, host: &str, port: u16, n: u32) -> BTreeMap<String, u32> {
        let out = self.client(from, host, port, n, false);
        parse_counts(out.lines().next().unwrap_or(""))
    }

    /// `CLIENT` run in node `from`'s namespace against `host:port`: its output (`rate`: with the `RATE` line).
    pub(crate) fn client(&self, from: usize, host: &str, port: u16, n: u32, rate: bool) -> String {
        let mut cmd = std::process::Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            self.net.ns(from),
            PYTHON,
            "-S",
            "-c",
            CLIENT,
            host,
            &port.to_string(),
            &n.to_string(),
        ]);
        if rate {
            cmd.arg("rate");
        }
        let out = cmd.output().expect("run the client");
        assert!(out.status.success(), "client: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The `RESULT` lines task `t` printed, once it printed `DONE`.
    pub(crate) fn results(&self, t: &Value) -> Vec<String> {
        self.results_until(t, "DONE")
    }

    /// The `RESULT` lines task `t` printed, once one of them is `last`.
    pub(crate) fn results_until(&self, t: &Value, last: &str) -> Vec<String> {
        let id = t["ID"].as_str().unwrap();
        let node = t["NodeID"].as_str().unwrap();
        let host = self.manager().get(&format!("/v1.47/nodes/{node}"))["Description"]["Hostname"]
            .as_str()
            .unwrap()
            .to_string();
        let i: usize = host.trim_start_matches("node-").parse().unwrap();
        let log = self.ds[i].state_dir().join("tasks").join(id).join("stdout.log");
        wait_until(&format!("task {id} done probing"), WAIT, || {
            let text = std::fs::read_to_string(&log).map_err(|e| format!("{}: {e}", log.display()))?;
            let lines: Vec<String> =
                text.lines().filter_map(|l| l.split_once("RESULT ").map(|(_, r)| r.to_string())).collect();
            if lines.iter().any(|l| l == last) {
                return Ok(lines);
            }
            // What the task said on stderr (a traceback when the script died), for the failure message.
            let err = std::fs::read_to_string(log.with_file_name("stderr.log")).unwrap_or_default();
            let tail: Vec<&str> = err.lines().rev().take(8).collect();
            Err(format!("so far: {lines:?}; stderr ends: {:?}", tail.into_iter().rev().collect::<Vec<_>>()))
        })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Every task the manager still knows, beyond those the test looked at.
        if self.ds.first().is_some_and(|d| d.is_running()) {
            if let Ok(r) = shoal_testkit::http::request(self.ds[0].socket(), "GET", "/v1.47/tasks", None) {
                for t in r.body.as_array().into_iter().flatten() {
                    self.tasks_seen.insert(t["ID"].as_str().unwrap_or_default().to_string());
                }
            }
        }
        for d in &mut self.ds {
            d.stop();
        }
        // Containers and holders outlive a stopped daemon: every one of these nodes' goes.
        if self.executor == "docker" {
            // (`engine`, not `containers`: a drop must not panic when the engine fails.)
            for id in &self.node_ids {
                let filter = format!("label=com.docker.swarm.node.id={id}");
                let out = engine(&["ps", "-aq", "--no-trunc", "--filter", &filter]);
                for c in String::from_utf8_lossy(&out.stdout).lines() {
                    let _ = engine(&["rm", "-f", c]);
                }
                let _ = std::fs::remove_dir_all(format!("/dev/shm/shoal-{id}"));
            }
        }
        // A daemon that could not stop cleanly leaves its task namespaces (in the host's /run/netns).
        for name in self.task_namespaces() {
            let _ = std::process::Command::new("ip").args(["netns", "delete", &name]).output();
            // (A name whose mount is gone leaves only its file.)
            let _ = std::fs::remove_file(std::path::Path::new("/run/netns").join(&name));
        }
    }
}

/// Task `t`'s address on `network` (without its prefix length).
pub(crate) fn address_on(t: &Value, network: &str) -> String {
    let a = t["NetworksAttachments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["Network"]["Spec"]["Name"] == network)
        .unwrap_or_else(|| panic!("task not on {network}: {t}"));
    a["Addresses"][0].as_str().unwrap().split('/').next().unwrap().to_string()
}

/// The counts of a `CLIENT` answer line.
pub(crate) fn parse_counts(line: &str) -> BTreeMap<String, u32> {
    line.split_whitespace()
        .filter_map(|kv| kv.rsplit_once('='))
        .map(|(k, v)| (k.to_string(), v.parse().unwrap_or(0)))
        .collect()
}
