//! The executor: reads a node's network state into an `Observed` and applies the planner's `Op`s, by running
//! iproute2 (`ip`, `bridge`), `nft` and `sysctl`, entered into a namespace with `nsenter --net=<path>` when the
//! node itself lives in one (tests) and for task namespaces. Shelling out instead of netlink keeps this crate
//! free of a netlink stack and its async runtime, and every command is the one a person would type to check the
//! result; each command is bounded (killed after `COMMAND_TIMEOUT`, at most `MAX_OUTPUT_BYTES` of output read).
//! Only this file does IO.

use std::io::{Read, Write};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::names;
use crate::plan::{plan, Fdb, Link, LinkKind, Neigh, Observed, Op, TaskIface, TaskNs};
use crate::state::{Ipv4Cidr, NodeNetState};
use crate::Error;

/// Longest any one command may run before it is killed.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
/// Most bytes of a command's stdout (and of its stderr) read.
pub const MAX_OUTPUT_BYTES: u64 = 16 << 20;
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

    /// Reads the node's Shoal links, entries, table and the namespaces of `desired`'s tasks.
    pub fn observe(&self, desired: &NodeNetState) -> Result<Observed, Error> {
        let mut obs = Observed::default();
        let links = self.json(None, &["ip", "-j", "-d", "addr", "show"])?;
        for l in links.as_array().into_iter().flatten() {
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
                    vni: data["id"].as_u64().unwrap_or(0) as u32,
                    port: data["port"].as_u64().unwrap_or(0) as u16,
                    local: data["local"].as_str().and_then(|s| s.parse().ok()),
                    learning: data["learning"].as_bool().unwrap_or(true),
                    proxy: data["proxy"].as_bool().unwrap_or(false),
                },
                other => LinkKind::Other(other.to_string()),
            };
            obs.links.insert(
                name.to_string(),
                Link {
                    kind,
                    master: l["master"].as_str().map(str::to_string),
                    up: has_flag(l, "UP"),
                    mtu: l["mtu"].as_u64().unwrap_or(0) as u16,
                    addrs: inet_addrs(l),
                    // Read below with the node's other settings.
                    route_localnet: false,
                },
            );
        }
        for f in self.json(None, &["bridge", "-j", "fdb", "show"])?.as_array().into_iter().flatten() {
            let dev = str_of(f, "ifname");
            let (Some(dst), Ok(mac)) = (f["dst"].as_str().and_then(|d| d.parse().ok()), str_of(f, "mac").parse())
            else {
                continue;
            };
            if dev.starts_with(names::VXLAN_PREFIX) {
                obs.fdb.insert(Fdb { dev: dev.to_string(), mac, dst });
            }
        }
        let neigh = self.json(None, &["ip", "-j", "neigh", "show", "nud", "permanent"])?;
        for e in neigh.as_array().into_iter().flatten() {
            let dev = str_of(e, "dev");
            let (Ok(ip), Ok(mac)) = (str_of(e, "dst").parse(), str_of(e, "lladdr").parse()) else {
                continue;
            };
            if dev.starts_with(names::VXLAN_PREFIX) {
                obs.neigh.insert(Neigh { dev: dev.to_string(), ip, mac });
            }
        }
        obs.node_table = self.table_tag(None)?;
        // One `sysctl` for the node's forwarding and each bridge's `route_localnet`, in that order.
        let bridges: Vec<String> =
            obs.links.iter().filter(|(_, l)| l.kind == LinkKind::Bridge).map(|(n, _)| n.clone()).collect();
        let mut keys = vec!["net.ipv4.ip_forward".to_string()];
        keys.extend(bridges.iter().map(|b| format!("net.ipv4.conf.{b}.route_localnet")));
        let mut args = vec!["sysctl", "-n"];
        args.extend(keys.iter().map(String::as_str));
        let out = self.run(None, &args, None)?;
        let mut values = out.lines().map(|v| v.trim() == "1");
        obs.ip_forward = values.next().unwrap_or(false);
        for (b, on) in bridges.iter().zip(values) {
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
                    mtu: l["mtu"].as_u64().unwrap_or(0) as u16,
                    up: has_flag(l, "UP"),
                };
                tns.ifaces.insert(name.to_string(), iface);
            }
            let routes = self.json(ns, &["ip", "-j", "route", "show", "default"])?;
            tns.default_gw =
                routes.as_array().and_then(|r| r.first()).and_then(|r| r["gateway"].as_str()?.parse().ok());
            tns.table = self.table_tag(ns)?;
            obs.tasks.insert(t.netns.clone(), tns);
        }
        Ok(obs)
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
        match op {
            Op::DeleteLink { name } => self.ok(None, &["ip", "link", "del", name]),
            Op::DeleteTaskLink { netns, ifname } => self.ok(Some(netns), &["ip", "link", "del", ifname]),
            Op::DelFdb(f) => self.ok(
                None,
                &["bridge", "fdb", "del", &f.mac.to_string(), "dev", &f.dev, "dst", &f.dst.to_string(), "self"],
            ),
            Op::DelNeigh(n) => self.ok(None, &["ip", "neigh", "del", &n.ip.to_string(), "dev", &n.dev]),
            Op::CreateBridge { name, mtu, addrs } => {
                self.ok(None, &["ip", "link", "add", name, "mtu", &mtu.to_string(), "type", "bridge"])?;
                for a in addrs {
                    self.ok(None, &["ip", "addr", "add", &a.to_string(), "dev", name])?;
                }
                self.ok(None, &["ip", "link", "set", name, "up"])
            }
            Op::CreateVxlan { name, vni, port, local, mtu, bridge } => {
                let (vni, port, local, mtu) = (vni.to_string(), port.to_string(), local.to_string(), mtu.to_string());
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
                        &vni,
                        "dstport",
                        &port,
                        "local",
                        &local,
                        "nolearning",
                        "proxy",
                    ],
                )?;
                self.ok(None, &["ip", "link", "set", name, "master", bridge, "up"])
            }
            Op::SetMaster { name, master } => self.ok(None, &["ip", "link", "set", name, "master", master]),
            Op::AddFdb(f) => self.ok(
                None,
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
            Op::AddNeigh(n) => self.ok(
                None,
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
            Op::CreateVeth { host, bridge, netns, ifname, mac, addr, mtu } => {
                let (mtu, mac) = (mtu.to_string(), mac.to_string());
                let ns =
                    netns.to_str().ok_or_else(|| Error::Invalid(format!("namespace path {netns:?} is not UTF-8")))?;
                self.ok(
                    None,
                    &[
                        "ip", "link", "add", host, "mtu", &mtu, "type", "veth", "peer", "name", ifname, "mtu", &mtu,
                        "address", &mac, "netns", ns,
                    ],
                )?;
                self.ok(None, &["ip", "link", "set", host, "master", bridge, "up"])?;
                self.ok(Some(netns), &["ip", "addr", "add", &addr.to_string(), "dev", ifname])?;
                self.ok(Some(netns), &["ip", "link", "set", ifname, "up"])?;
                self.ok(Some(netns), &["ip", "link", "set", "lo", "up"])
            }
            Op::SetDefaultRoute { netns, via: Some((gw, dev)) } => {
                self.ok(Some(netns), &["ip", "route", "replace", "default", "via", &gw.to_string(), "dev", dev])
            }
            Op::SetDefaultRoute { netns, via: None } => self.ok(Some(netns), &["ip", "route", "del", "default"]),
            Op::EnableIpForward => self.ok(None, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]),
            Op::RouteLocalnet { bridge } => {
                self.ok(None, &["sysctl", "-qw", &format!("net.ipv4.conf.{bridge}.route_localnet=1")])
            }
            Op::ApplyNodeTable { script } => self.run(None, &["nft", "-f", "-"], Some(script)).map(drop),
            Op::DeleteNodeTable => self.ok(None, &["nft", "delete", "table", "ip", t]),
            Op::ApplyTaskTable { netns, script } => self.run(Some(netns), &["nft", "-f", "-"], Some(script)).map(drop),
            Op::DeleteTaskTable { netns } => self.ok(Some(netns), &["nft", "delete", "table", "ip", t]),
        }
    }

    /// The comment of the `ip shoal` table in `netns` (the node's when `None`), or `None` when there is none.
    fn table_tag(&self, netns: Option<&Path>) -> Result<Option<String>, Error> {
        let t = names::NFT_TABLE;
        let tables = self.run(netns, &["nft", "list", "tables"], None)?;
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

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("")
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
            Some(Ipv4Cidr { addr, prefix_len: a["prefixlen"].as_u64()? as u8 })
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
    /// An IPsec ESP state (AES-GCM, as Docker's encrypted overlays) can be installed.
    pub esp: bool,
    /// WireGuard devices can be made.
    pub wireguard: bool,
}

/// Measures `Capabilities` (needs root; leaves nothing behind: the namespace dies with the probe).
pub fn probe() -> Result<Capabilities, Error> {
    let script = r#"
ip link add shlprobe type vxlan id 1 dstport 4789 nolearning 2>/dev/null && echo vxlan
printf 'table ip p { chain c { type nat hook output priority -100; ip daddr 192.0.2.9 dnat to numgen random mod 2 map { 0 : 192.0.2.1, 1 : 192.0.2.2 }; }; }' | nft -f - 2>/dev/null && echo nft_nat
ip xfrm state add src 192.0.2.1 dst 192.0.2.2 proto esp spi 0x100 reqid 1 mode transport aead 'rfc4106(gcm(aes))' 0x0102030405060708090a0b0c0d0e0f1011121314 128 2>/dev/null && echo esp
ip link add shlprobew type wireguard 2>/dev/null && echo wireguard
true
"#;
    let out =
        run_bounded(Command::new("unshare").args(["--net", "sh", "-c", script]), "unshare --net sh -c <probe>", None)?;
    let has = |w: &str| out.lines().any(|l| l.trim() == w);
    Ok(Capabilities { vxlan: has("vxlan"), nft_nat: has("nft_nat"), esp: has("esp"), wireguard: has("wireguard") })
}
