//! The executor: reads a node's network state into an `Observed` and applies the planner's `Op`s, by running
//! iproute2 (`ip`, `bridge`), `nft`, `iptables-nft`/`iptables-legacy` and `sysctl`, entered into a namespace
//! with `nsenter --net=<path>` when the node itself lives in one (tests), for the networks' namespaces
//! (`/run/netns/shl-net-<node key>-<vni>`, the node key being the inode of the node's network namespace) and for
//! task namespaces. Shelling out instead of netlink keeps this crate free of a netlink stack and its async
//! runtime, and every command is the one a person would type to check the result; each command is bounded
//! (killed after `COMMAND_TIMEOUT`, at most `MAX_OUTPUT_BYTES` of output read). Only this file does IO.
//!
//! A network namespace is named by a bind mount in the mount namespace of the daemon; one made by a daemon
//! whose mount namespace is private (`ip netns exec`, systemd's `PrivateMounts`) dies with it, and only its
//! name is left: `observe` reports it `dead` and the planner makes it again.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::names;
use crate::plan::{plan, Fdb, ForwardChain, Link, LinkKind, Neigh, NetworkNs, Observed, Op, TaskIface, TaskNs};
use crate::state::{Ipv4Cidr, Ipv6Cidr, Mac, NodeNetState};
use crate::Error;

/// Longest any one command may run before it is killed.
pub(crate) const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
/// Most bytes of a command's stdout (and of its stderr) read.
pub(crate) const MAX_OUTPUT_BYTES: u64 = 16 << 20;
/// Where `ip netns` keeps named namespaces (the networks' namespaces are there).
pub(crate) const NETNS_DIR: &str = "/run/netns";
/// Pause between checks of a running command.
const POLL_PERIOD: Duration = Duration::from_millis(1);

/// Applies `NodeNetState`s to one node.
#[derive(Clone, Debug, Default)]
pub struct Executor {
    /// The node's network namespace, when it is not the caller's own (tests run each "node" in one).
    pub host_netns: Option<PathBuf>,
}

impl Executor {
    /// An executor for the caller's own network namespace.
    pub fn new() -> Executor {
        Executor::default()
    }

    /// An executor for the node living in network namespace `path`.
    pub fn in_netns(path: impl Into<PathBuf>) -> Executor {
        Executor { host_netns: Some(path.into()) }
    }

    /// Observes, plans and applies: brings the node to `desired` and returns the operations that took.
    pub fn reconcile(&self, desired: &NodeNetState) -> Result<Vec<Op>, Error> {
        desired.validate()?;
        let observed = self.observe(desired)?;
        let ops = plan(&observed, desired);
        self.apply(&ops)?;
        Ok(ops)
    }

    /// Removes what Shoal put in the joined namespace `netns` (a running container's own, which outlives
    /// the task: `TaskState::joined`) once the task is no longer plumbed: its table (the task's interface
    /// went with the reconcile that deleted the veth's other end). A namespace without one is no error.
    pub fn leave_joined(&self, netns: &Path) -> Result<(), Error> {
        let ns = Some(netns);
        let tables = self.run(ns, &["nft", "list", "tables"], None)?;
        if self.table_tag(ns, &tables)?.is_some() {
            self.ok(ns, &["nft", "delete", "table", "ip", names::NFT_TABLE])?;
        }
        Ok(())
    }

    /// The key of the node's network namespace in the names of its networks' namespaces: its inode.
    pub fn node_key(&self) -> Result<u64, Error> {
        use std::os::unix::fs::MetadataExt;
        let p = self.host_netns.clone().unwrap_or_else(|| PathBuf::from("/proc/self/ns/net"));
        std::fs::metadata(&p)
            .map(|m| m.ino())
            .map_err(|e| Error::Invalid(format!("cannot read the node's network namespace {}: {e}", p.display())))
    }

    /// Path of the namespace of the network with VNI `vni` (`names::network_netns` under /run/netns).
    pub fn network_netns(&self, vni: u32) -> Result<PathBuf, Error> {
        Ok(Path::new(NETNS_DIR).join(names::network_netns(self.node_key()?, vni)))
    }

    /// Reads the node's Shoal links, network namespaces (with their links and entries), table, iptables
    /// FORWARD chains and the namespaces of `desired`'s tasks.
    pub fn observe(&self, desired: &NodeNetState) -> Result<Observed, Error> {
        let mut obs = Observed {
            links: shoal_links(&self.json(None, &["ip", "-j", "-d", "addr", "show"])?),
            ..Observed::default()
        };
        let key = self.node_key()?;
        let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir(NETNS_DIR)
            .into_iter()
            .flatten()
            .filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                Some((names::network_netns_vni(key, &name)?, Path::new(NETNS_DIR).join(name)))
            })
            .collect();
        found.sort();
        for (vni, path) in found {
            obs.networks.insert(vni, self.observe_network(&path)?);
        }
        let tables = self.run(None, &["nft", "list", "tables"], None)?;
        obs.node_table = self.table_tag(None, &tables)?;
        obs.firewall = self.forward_chains(&tables)?;
        // One `sysctl` for the node's forwarding and each gateway end's `route_localnet`, in that order.
        let gateways: Vec<String> = obs
            .links
            .iter()
            .filter(|(n, l)| l.kind == LinkKind::Veth && n.starts_with(names::GATEWAY_PREFIX))
            .map(|(n, _)| n.clone())
            .collect();
        let mut keys = vec!["net.ipv4.ip_forward".to_string()];
        keys.extend(gateways.iter().map(|b| format!("net.ipv4.conf.{b}.route_localnet")));
        let mut args = vec!["sysctl", "-n"];
        args.extend(keys.iter().map(String::as_str));
        let out = self.run(None, &args, None)?;
        let mut values = out.lines().map(|v| v.trim() == "1");
        obs.ip_forward = values.next().unwrap_or(false);
        for (b, on) in gateways.iter().zip(values) {
            if let Some(l) = obs.links.get_mut(b) {
                l.route_localnet = on;
            }
        }
        for t in &desired.tasks {
            if !t.netns.exists() {
                return Err(Error::NamespaceMissing { task: t.task_id.clone(), path: t.netns.clone() });
            }
            let ns = Some(t.netns.as_path());
            let mut tns = TaskNs::default();
            for l in self.json(ns, &["ip", "-j", "addr", "show"])?.as_array().into_iter().flatten() {
                let name = str_of(l, "ifname");
                if name == "lo" {
                    continue;
                }
                let iface = TaskIface {
                    mac: str_of(l, "address").parse().ok(),
                    addrs: inet_addrs(l),
                    addrs6: inet6_addrs(l),
                    mtu: num_of(&l["mtu"]).unwrap_or(0),
                    up: has_flag(l, "UP"),
                };
                tns.ifaces.insert(name.to_string(), iface);
            }
            // The main table's routes through a gateway: the default one, and those to a network's other subnets.
            let routes = self.json(ns, &["ip", "-j", "route", "show"])?;
            for r in routes.as_array().into_iter().flatten() {
                let Some(gw) = r["gateway"].as_str().and_then(|g| g.parse::<Ipv4Addr>().ok()) else { continue };
                match str_of(r, "dst") {
                    "default" => tns.default_gw = tns.default_gw.or(Some(gw)),
                    dst => {
                        if let Ok(dst) = dst.parse::<Ipv4Cidr>() {
                            tns.routes.insert((dst, gw));
                        }
                    }
                }
            }
            let tables = self.run(ns, &["nft", "list", "tables"], None)?;
            tns.table = self.table_tag(ns, &tables)?;
            obs.tasks.insert(t.netns.clone(), tns);
        }
        Ok(obs)
    }

    /// One network namespace: its links, forwarding and neighbour entries, read with one command.
    fn observe_network(&self, path: &Path) -> Result<NetworkNs, Error> {
        if !is_netns(path) {
            return Ok(NetworkNs { dead: true, ..NetworkNs::default() });
        }
        const SEP: &str = "@@shoal@@";
        let script = format!(
            "ip -j -d addr show && echo {SEP} && bridge -j fdb show && echo {SEP} && ip -j neigh show nud permanent \
             && echo {SEP} && cat /proc/sys/net/ipv4/ip_forward"
        );
        let out = self.run(Some(path), &["sh", "-c", &script], None)?;
        let parts: Vec<&str> = out.split(SEP).collect();
        let [links, fdb, neigh, forward] = parts.as_slice() else {
            return Err(Error::Parse { command: script, detail: format!("{} parts, not 4", parts.len()) });
        };
        let parse = |text: &str| -> Result<Value, Error> {
            if text.trim().is_empty() {
                return Ok(Value::Array(Vec::new()));
            }
            serde_json::from_str(text).map_err(|e| Error::Parse { command: script.clone(), detail: e.to_string() })
        };
        let mut ns =
            NetworkNs { links: shoal_links(&parse(links)?), ip_forward: forward.trim() == "1", ..NetworkNs::default() };
        for f in parse(fdb)?.as_array().into_iter().flatten() {
            let dev = str_of(f, "ifname");
            let (Some(dst), Ok(mac)) = (f["dst"].as_str().and_then(|d| d.parse().ok()), str_of(f, "mac").parse())
            else {
                continue;
            };
            if dev.starts_with(names::VXLAN_PREFIX) {
                ns.fdb.insert(Fdb { dev: dev.to_string(), mac, dst });
            }
        }
        for e in parse(neigh)?.as_array().into_iter().flatten() {
            let dev = str_of(e, "dev");
            let (Ok(ip), Ok(mac)) = (str_of(e, "dst").parse(), str_of(e, "lladdr").parse()) else {
                continue;
            };
            if dev.starts_with(names::VXLAN_PREFIX) {
                ns.neigh.insert(Neigh { dev: dev.to_string(), ip, mac });
            }
        }
        Ok(ns)
    }

    /// The filter FORWARD chains of the node's iptables back ends that have a filter table: iptables-nft's
    /// when nftables lists `table ip filter`, iptables-legacy's when `/proc/net/ip_tables_names` lists
    /// `filter` (listing it with the legacy tool would create it).
    fn forward_chains(&self, nft_tables: &str) -> Result<Vec<ForwardChain>, Error> {
        let mut out = Vec::new();
        let legacy = self.run(None, &["sh", "-c", "cat /proc/net/ip_tables_names 2>/dev/null; true"], None)?;
        for (present, tool, marker) in [
            (nft_tables.lines().any(|l| l.trim() == "table ip filter"), "iptables-nft", "nf_tables"),
            (legacy.lines().any(|l| l.trim() == "filter"), "iptables-legacy", "legacy"),
        ] {
            if !present {
                continue;
            }
            let Some(iptables) = self.iptables_command(tool, marker) else { continue };
            // No FORWARD chain in that table (made by something else): nothing forwarded is decided there.
            let Ok(listing) = self.run(None, &[&iptables, "-w", "-S", "FORWARD"], None) else { continue };
            let rules = listing.lines().map(|l| l.trim().to_string()).filter(|l| !l.is_empty()).collect();
            out.push(ForwardChain { iptables, rules });
        }
        Ok(out)
    }

    /// The command of iptables back end `tool` (`iptables-nft`, `iptables-legacy`), or plain `iptables` when
    /// that is the back end (its version line says `marker`).
    fn iptables_command(&self, tool: &str, marker: &str) -> Option<String> {
        let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
        if std::env::split_paths(&path).any(|d| d.join(tool).exists()) {
            return Some(tool.to_string());
        }
        let version = self.run(None, &["iptables", "-V"], None).ok()?;
        version.contains(marker).then(|| "iptables".to_string())
    }

    /// Applies `ops` in order, stopping at the first that fails.
    pub fn apply(&self, ops: &[Op]) -> Result<(), Error> {
        for op in ops {
            self.apply_one(op)?;
        }
        Ok(())
    }

    fn apply_one(&self, op: &Op) -> Result<(), Error> {
        let t = names::NFT_TABLE;
        let netns = |vni: &u32| self.network_netns(*vni);
        match op {
            Op::DeleteLink { name } => self.ok(None, &["ip", "link", "del", name]),
            Op::DeleteNetLink { vni, name } => self.ok(Some(&netns(vni)?), &["ip", "link", "del", name]),
            Op::DeleteTaskLink { netns, ifname } => self.ok(Some(netns), &["ip", "link", "del", ifname]),
            Op::DelFdb { vni, fdb: f } => self.ok(
                Some(&netns(vni)?),
                &["bridge", "fdb", "del", &f.mac.to_string(), "dev", &f.dev, "dst", &f.dst.to_string(), "self"],
            ),
            Op::DelNeigh { vni, neigh: n } => {
                self.ok(Some(&netns(vni)?), &["ip", "neigh", "del", &n.ip.to_string(), "dev", &n.dev])
            }
            Op::CreateNetworkNs { vni } => {
                let name = names::network_netns(self.node_key()?, *vni);
                self.ok(None, &["ip", "netns", "add", &name])
            }
            Op::DeleteNetworkNs { vni } => {
                let name = names::network_netns(self.node_key()?, *vni);
                self.ok(None, &["ip", "netns", "delete", &name])
            }
            Op::CreateBridge { vni, name, mtu, addrs } => {
                let ns = netns(vni)?;
                self.ok(Some(&ns), &["ip", "link", "add", name, "mtu", &mtu.to_string(), "type", "bridge"])?;
                for a in addrs {
                    self.ok(Some(&ns), &["ip", "addr", "add", &a.to_string(), "dev", name])?;
                }
                self.ok(Some(&ns), &["ip", "link", "set", name, "up"])
            }
            Op::EnableNetnsForward { vni } => self.ok(Some(&netns(vni)?), &["sysctl", "-qw", "net.ipv4.ip_forward=1"]),
            Op::CreateVxlan { vni, id, name, port, local, mtu, bridge } => {
                self.create_vxlan(*vni, *id, name, *port, *local, *mtu, bridge)
            }
            Op::CreateGateway { vni, name, peer, bridge, mtu, addrs, mac } => {
                self.create_gateway(*vni, name, peer, bridge, *mtu, addrs, *mac)
            }
            Op::SetMaster { vni, name, master } => {
                self.ok(Some(&netns(vni)?), &["ip", "link", "set", name, "master", master])
            }
            Op::AddFdb { vni, fdb: f } => self.ok(
                Some(&netns(vni)?),
                &[
                    "bridge",
                    "fdb",
                    "replace",
                    &f.mac.to_string(),
                    "dev",
                    &f.dev,
                    "dst",
                    &f.dst.to_string(),
                    "self",
                    "permanent",
                ],
            ),
            Op::AddNeigh { vni, neigh: n } => self.ok(
                Some(&netns(vni)?),
                &[
                    "ip",
                    "neigh",
                    "replace",
                    &n.ip.to_string(),
                    "lladdr",
                    &n.mac.to_string(),
                    "dev",
                    &n.dev,
                    "nud",
                    "permanent",
                ],
            ),
            Op::CreateVeth { vni, host, bridge, netns: task_ns, ifname, mac, addr, addr6, mtu } => {
                self.create_veth(*vni, host, bridge, task_ns, ifname, *mac, *addr, *mtu)?;
                match addr6 {
                    Some(a) => self.add_ipv6(task_ns, ifname, *a),
                    None => Ok(()),
                }
            }
            Op::SetDefaultRoute { netns, via: Some((gw, dev)) } => {
                self.ok(Some(netns), &["ip", "route", "replace", "default", "via", &gw.to_string(), "dev", dev])
            }
            Op::SetDefaultRoute { netns, via: None } => self.ok(Some(netns), &["ip", "route", "del", "default"]),
            Op::AddRoute { netns, dst, via, dev } => {
                self.ok(Some(netns), &["ip", "route", "replace", &dst.to_string(), "via", &via.to_string(), "dev", dev])
            }
            Op::EnableIpForward => self.ok(None, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]),
            Op::RouteLocalnet { link } => {
                self.ok(None, &["sysctl", "-qw", &format!("net.ipv4.conf.{link}.route_localnet=1")])
            }
            Op::ApplyNodeTable { script } => self.run(None, &["nft", "-f", "-"], Some(script)).map(drop),
            Op::DeleteNodeTable => self.ok(None, &["nft", "delete", "table", "ip", t]),
            Op::ApplyTaskTable { netns, script } => self.run(Some(netns), &["nft", "-f", "-"], Some(script)).map(drop),
            Op::DeleteTaskTable { netns } => self.ok(Some(netns), &["nft", "delete", "table", "ip", t]),
            Op::InsertForwardRule { iptables, position, rule } => {
                let pos = position.to_string();
                let mut args = vec![iptables.as_str(), "-w", "-I", "FORWARD", &pos];
                args.extend(rule.iter().map(String::as_str));
                self.ok(None, &args)
            }
            Op::DeleteForwardRule { iptables, rule } => {
                let mut args = vec![iptables.as_str(), "-w", "-D", "FORWARD"];
                args.extend(rule.iter().map(String::as_str));
                self.ok(None, &args)
            }
        }
    }

    /// `Op::CreateVxlan`: made in the node's namespace, so its UDP socket is there (on the underlay), then
    /// moved into network `vni`'s namespace onto `bridge`.
    #[allow(clippy::too_many_arguments)] // the fields of the op it applies, as `apply_one` matched them
    fn create_vxlan(
        &self,
        vni: u32,
        id: u32,
        name: &str,
        port: u16,
        local: Ipv4Addr,
        mtu: u16,
        bridge: &str,
    ) -> Result<(), Error> {
        let ns = self.network_netns(vni)?;
        let ns_arg = path_str(&ns)?;
        let (id, port, local, mtu) = (id.to_string(), port.to_string(), local.to_string(), mtu.to_string());
        // Made in the node's namespace, so its UDP socket is there (on the underlay), then moved.
        self.ok(
            None,
            &[
                "ip",
                "link",
                "add",
                name,
                "mtu",
                &mtu,
                "type",
                "vxlan",
                "id",
                &id,
                "dstport",
                &port,
                "local",
                &local,
                "nolearning",
                "proxy",
            ],
        )?;
        self.ok(None, &["ip", "link", "set", name, "netns", ns_arg])?;
        self.ok(Some(&ns), &["ip", "link", "set", name, "master", bridge, "up"])
    }

    /// `Op::CreateGateway`: the node's end `name` with `mac` and `addrs`, the peer on `bridge` in network
    /// `vni`'s namespace.
    #[allow(clippy::too_many_arguments)] // the fields of the op it applies, as `apply_one` matched them
    fn create_gateway(
        &self,
        vni: u32,
        name: &str,
        peer: &str,
        bridge: &str,
        mtu: u16,
        addrs: &[Ipv4Cidr],
        mac: Option<Mac>,
    ) -> Result<(), Error> {
        let ns = self.network_netns(vni)?;
        let mtu = mtu.to_string();
        self.ok(
            None,
            &[
                "ip",
                "link",
                "add",
                name,
                "mtu",
                &mtu,
                "type",
                "veth",
                "peer",
                "name",
                peer,
                "mtu",
                &mtu,
                "netns",
                path_str(&ns)?,
            ],
        )?;
        if let Some(mac) = mac {
            self.ok(None, &["ip", "link", "set", name, "address", &mac.to_string()])?;
        }
        for a in addrs {
            self.ok(None, &["ip", "addr", "add", &a.to_string(), "dev", name])?;
        }
        self.ok(None, &["ip", "link", "set", name, "up"])?;
        self.ok(Some(&ns), &["ip", "link", "set", peer, "master", bridge, "up"])
    }

    /// `Op::CreateVeth`: `host` on `bridge` in network `vni`'s namespace, `ifname` in the task's namespace
    /// `task_ns` with `mac` and `addr`.
    #[allow(clippy::too_many_arguments)] // the fields of the op it applies, as `apply_one` matched them
    fn create_veth(
        &self,
        vni: u32,
        host: &str,
        bridge: &str,
        task_ns: &Path,
        ifname: &str,
        mac: Mac,
        addr: Ipv4Cidr,
        mtu: u16,
    ) -> Result<(), Error> {
        let ns = self.network_netns(vni)?;
        let (mtu, mac) = (mtu.to_string(), mac.to_string());
        self.ok(
            Some(&ns),
            &[
                "ip",
                "link",
                "add",
                host,
                "mtu",
                &mtu,
                "type",
                "veth",
                "peer",
                "name",
                ifname,
                "mtu",
                &mtu,
                "address",
                &mac,
                "netns",
                path_str(task_ns)?,
            ],
        )?;
        self.ok(Some(&ns), &["ip", "link", "set", host, "master", bridge, "up"])?;
        self.ok(Some(task_ns), &["ip", "addr", "add", &addr.to_string(), "dev", ifname])?;
        self.ok(Some(task_ns), &["ip", "link", "set", ifname, "up"])?;
        self.ok(Some(task_ns), &["ip", "link", "set", "lo", "up"])
    }

    /// The IPv6 address `addr` on `ifname` in `task_ns`, with IPv6 turned on for the interface first (an
    /// engine may have turned it off in a container's namespace) and no duplicate address detection (the
    /// manager's allocation makes the address unique; detection would hold it tentative for a second).
    fn add_ipv6(&self, task_ns: &Path, ifname: &str, addr: Ipv6Cidr) -> Result<(), Error> {
        let key = format!("net.ipv6.conf.{ifname}.disable_ipv6=0");
        self.ok(Some(task_ns), &["sysctl", "-qw", &key])?;
        self.ok(Some(task_ns), &["ip", "-6", "addr", "replace", &addr.to_string(), "dev", ifname, "nodad"])
    }

    /// The comment of the `ip shoal` table in `netns` (the node's when `None`), whose `nft list tables` is
    /// `tables`, or `None` when there is none.
    fn table_tag(&self, netns: Option<&Path>, tables: &str) -> Result<Option<String>, Error> {
        let t = names::NFT_TABLE;
        if !tables.lines().any(|l| l.trim() == format!("table ip {t}")) {
            return Ok(None);
        }
        let listing = self.run(netns, &["nft", "list", "table", "ip", t], None)?;
        let tag =
            listing.lines().find_map(|l| l.trim().strip_prefix("comment \"")?.strip_suffix('"').map(str::to_string));
        // A table without Shoal's comment is treated as stale: the planner replaces it.
        Ok(Some(tag.unwrap_or_default()))
    }

    fn json(&self, netns: Option<&Path>, argv: &[&str]) -> Result<Value, Error> {
        let out = self.run(netns, argv, None)?;
        if out.trim().is_empty() {
            return Ok(Value::Array(Vec::new()));
        }
        serde_json::from_str(&out).map_err(|e| Error::Parse { command: argv.join(" "), detail: e.to_string() })
    }

    fn ok(&self, netns: Option<&Path>, argv: &[&str]) -> Result<(), Error> {
        self.run(netns, argv, None).map(drop)
    }

    /// Runs `argv` in `netns` (a task's) or else in the node's namespace; returns its stdout.
    fn run(&self, netns: Option<&Path>, argv: &[&str], stdin: Option<&str>) -> Result<String, Error> {
        let ns = netns.or(self.host_netns.as_deref());
        let mut cmd = match ns {
            Some(p) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net={}", p.display())).arg("--").args(argv);
                c
            }
            None => {
                let mut c = Command::new(argv[0]);
                c.args(&argv[1..]);
                c
            }
        };
        let shown = match ns {
            Some(p) => format!("nsenter --net={} {}", p.display(), argv.join(" ")),
            None => argv.join(" "),
        };
        run_bounded(&mut cmd, &shown, stdin)
    }
}

/// Runs `cmd` with `stdin`, killing it after `COMMAND_TIMEOUT`; its stdout, or an error naming `shown`.
fn run_bounded(cmd: &mut Command, shown: &str, stdin: Option<&str>) -> Result<String, Error> {
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| Error::Spawn { command: shown.to_string(), source: e })?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // Scripts are small (a table per namespace); a failed write shows up as the command's error.
        let _ = pipe.write_all(input.as_bytes());
    }
    let read = |p: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(p) = p {
                let _ = p.take(MAX_OUTPUT_BYTES).read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = read(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let err = read(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    let status = loop {
        match child.try_wait().map_err(|e| Error::Spawn { command: shown.to_string(), source: e })? {
            Some(s) => break s,
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::Timeout { command: shown.to_string(), secs: COMMAND_TIMEOUT.as_secs() });
            }
            None => std::thread::sleep(POLL_PERIOD),
        }
    };
    let out = String::from_utf8_lossy(&out.join().unwrap_or_default()).into_owned();
    let err = String::from_utf8_lossy(&err.join().unwrap_or_default()).trim().to_string();
    if !status.success() {
        return Err(Error::Command { command: shown.to_string(), status: status.to_string(), stderr: err });
    }
    Ok(out)
}

/// The Shoal links (`names::is_shoal_link`) of an `ip -j -d addr show` listing.
fn shoal_links(listing: &Value) -> std::collections::BTreeMap<String, Link> {
    let mut out = std::collections::BTreeMap::new();
    for l in listing.as_array().into_iter().flatten() {
        let name = str_of(l, "ifname");
        if !names::is_shoal_link(name) {
            continue;
        }
        let info = &l["linkinfo"];
        let data = &info["info_data"];
        let kind = match info["info_kind"].as_str().unwrap_or("") {
            "bridge" => LinkKind::Bridge,
            "veth" => LinkKind::Veth,
            "vxlan" => LinkKind::Vxlan {
                vni: num_of(&data["id"]).unwrap_or(0),
                port: num_of(&data["port"]).unwrap_or(0),
                local: data["local"].as_str().and_then(|s| s.parse().ok()),
                learning: data["learning"].as_bool().unwrap_or(true),
                proxy: data["proxy"].as_bool().unwrap_or(false),
            },
            other => LinkKind::Other(other.to_string()),
        };
        let link = Link {
            kind,
            master: l["master"].as_str().map(str::to_string),
            up: has_flag(l, "UP"),
            mtu: num_of(&l["mtu"]).unwrap_or(0),
            addrs: inet_addrs(l),
            mac: str_of(l, "address").parse().ok(),
            // Read by `observe` with the node's other settings.
            route_localnet: false,
        };
        out.insert(name.to_string(), link);
    }
    out
}

/// Whether `path` is a network namespace (a bind mount of nsfs), not a name left without its mount.
fn is_netns(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(path), std::fs::metadata("/proc/self/ns/net")) {
        (Ok(p), Ok(own)) => p.dev() == own.dev(),
        _ => false,
    }
}

/// A path as a command argument.
fn path_str(p: &Path) -> Result<&str, Error> {
    p.to_str().ok_or_else(|| Error::Invalid(format!("namespace path {p:?} is not UTF-8")))
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("")
}

/// A number of `ip -j`'s output as `T`: `None` when it is missing or out of `T`'s range (read as unknown, as a
/// missing one is, never truncated into another value).
fn num_of<T: TryFrom<u64>>(v: &Value) -> Option<T> {
    v.as_u64().and_then(|n| T::try_from(n).ok())
}

fn has_flag(link: &Value, flag: &str) -> bool {
    link["flags"].as_array().is_some_and(|f| f.iter().any(|x| x.as_str() == Some(flag)))
}

fn inet_addrs(link: &Value) -> Vec<Ipv4Cidr> {
    let mut out: Vec<Ipv4Cidr> = link["addr_info"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["family"].as_str() == Some("inet"))
        .filter_map(|a| {
            let addr: Ipv4Addr = a["local"].as_str()?.parse().ok()?;
            Some(Ipv4Cidr { addr, prefix_len: num_of(&a["prefixlen"])? })
        })
        .collect();
    out.sort();
    out
}

/// The global IPv6 addresses of an `ip -j addr show` entry (link-local ones are the kernel's).
fn inet6_addrs(link: &Value) -> Vec<Ipv6Cidr> {
    let mut out: Vec<Ipv6Cidr> = link["addr_info"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["family"].as_str() == Some("inet6") && a["scope"].as_str() == Some("global"))
        .filter_map(|a| {
            let addr: Ipv6Addr = a["local"].as_str()?.parse().ok()?;
            Some(Ipv6Cidr { addr, prefix_len: num_of(&a["prefixlen"])? })
        })
        .collect();
    out.sort();
    out
}

/// What this kernel and its tools offer the data plane, measured in a throwaway namespace (`unshare --net`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// VXLAN devices can be made.
    pub vxlan: bool,
    /// nftables with NAT and `numgen` maps works.
    pub nft_nat: bool,
}

/// What this kernel offers encrypted overlays, which the data plane refuses for now (`check_encryption`),
/// measured as `Capabilities` are. Apart from `probe` because nothing on a daemon's start reads it, and on a
/// kernel without them each check costs a `modprobe` helper the kernel runs (4-6 ms each on the development
/// machine, where both are false), which the start waited for (BENCHMARKS.md, session 23).
#[cfg(any(test, feature = "test-doors"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncryptionCapabilities {
    /// An IPsec ESP state (AES-GCM, as Docker's encrypted overlays) can be installed.
    pub esp: bool,
    /// WireGuard devices can be made.
    pub wireguard: bool,
}

/// The checks of `probe`: the word a check prints when it passes, and its command.
const DATA_PLANE_CHECKS: &[(&str, &str)] = &[
    ("vxlan", "ip link add shlprobe type vxlan id 1 dstport 4789 nolearning"),
    (
        "nft_nat",
        "printf 'table ip p { chain c { type nat hook output priority -100; ip daddr 192.0.2.9 dnat to numgen \
         random mod 2 map { 0 : 192.0.2.1, 1 : 192.0.2.2 }; }; }' | nft -f -",
    ),
];

/// The checks of `probe_encryption`, as `DATA_PLANE_CHECKS`.
#[cfg(any(test, feature = "test-doors"))]
const ENCRYPTION_CHECKS: &[(&str, &str)] = &[
    (
        "esp",
        "ip xfrm state add src 192.0.2.1 dst 192.0.2.2 proto esp spi 0x100 reqid 1 mode transport aead \
         'rfc4106(gcm(aes))' 0x0102030405060708090a0b0c0d0e0f1011121314 128",
    ),
    ("wireguard", "ip link add shlprobew type wireguard"),
];

/// The shell script that runs `checks` side by side (each in the background, then `wait`: the probe takes as
/// long as its slowest check, not their sum) and prints the word of each that passed, one a line.
fn probe_script(checks: &[(&str, &str)]) -> String {
    let mut script: String =
        checks.iter().map(|(word, command)| format!("{command} >/dev/null 2>&1 && echo {word} &\n")).collect();
    script.push_str("wait\n");
    script
}

/// Runs `checks` in a throwaway network namespace; the words of those that passed.
fn run_probe(checks: &[(&str, &str)]) -> Result<Vec<String>, Error> {
    let script = probe_script(checks);
    let out =
        run_bounded(Command::new("unshare").args(["--net", "sh", "-c", &script]), "unshare --net sh -c <probe>", None)?;
    Ok(out.lines().map(|l| l.trim().to_string()).collect())
}

/// Measures `Capabilities` (needs root; leaves nothing behind: the namespace dies with the probe).
pub fn probe() -> Result<Capabilities, Error> {
    let passed = run_probe(DATA_PLANE_CHECKS)?;
    let has = |w: &str| passed.iter().any(|l| l == w);
    Ok(Capabilities { vxlan: has("vxlan"), nft_nat: has("nft_nat") })
}

/// Measures `EncryptionCapabilities` (needs root; leaves nothing behind, as `probe`).
#[cfg(any(test, feature = "test-doors"))]
pub fn probe_encryption() -> Result<EncryptionCapabilities, Error> {
    let passed = run_probe(ENCRYPTION_CHECKS)?;
    let has = |w: &str| passed.iter().any(|l| l == w);
    Ok(EncryptionCapabilities { esp: has("esp"), wireguard: has("wireguard") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_script_prints_the_words_of_the_checks_that_passed_and_runs_them_side_by_side() {
        // The second check blocks until the third writes to a FIFO: run one after the other, they would hang
        // until the command's bound and fail; side by side, both pass.
        let dir = tempfile::tempdir().expect("temp dir");
        let fifo = dir.path().join("fifo");
        let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo runs");
        assert!(made.success(), "mkfifo failed");
        let reads = format!("read line < {}", fifo.display());
        // In a shell of its own: the script sends each check's output to /dev/null, which would override a
        // redirection written on the check itself.
        let writes = format!("sh -c 'echo x > {}'", fifo.display());
        let checks: &[(&str, &str)] =
            &[("fails", "false"), ("reads", &reads), ("writes", &writes), ("piped", "echo x | grep -q x")];
        let out = run_bounded(Command::new("sh").args(["-c", &probe_script(checks)]), "sh -c <probe>", None)
            .expect("the script runs");
        let mut words: Vec<&str> = out.lines().collect();
        words.sort_unstable();
        assert_eq!(words, ["piped", "reads", "writes"]);
    }
}
