//! The planner: `plan(observed, desired)` compares what a node has (`Observed`, read by the executor) with what
//! it should have (`NodeNetState`) and returns the operations that close the gap, in an order that works
//! (removals first, then the node's table and firewall rules, the networks' namespaces, bridges, VXLAN devices,
//! gateway veths, forwarding entries, task veths, routes, task tables). Sans-IO: it reads no host state and
//! runs no command, so every case is a unit test. Applying the plan and planning again from a fresh
//! observation yields nothing; planning from an empty desired state removes every Shoal link, network
//! namespace, table and iptables rule of the node (task namespaces are the executor's: they go with their
//! tasks).
//!
//! Where things live (docs/design/netplane.md, "A namespace per network"): each network's bridge, VXLAN
//! device and the bridge ends of its tasks' veths are in the network's own namespace (`Op`s name it by VNI),
//! so traffic between tasks of a network is bridged where the host's firewall does not apply; the node's
//! namespace has one veth end per non-internal network (`shlg<vni>`, the gateway address), which is where
//! the node routes, masquerades and forwards published ports.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use crate::names;
use crate::nft;
use crate::state::{mac_for, Attachment, Ipv4Cidr, Ipv6Cidr, Mac, NetworkState, NodeNetState, Subnet, TaskState};

/// What the node has, as far as Shoal is concerned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// Every link of the node's namespace whose name is Shoal's (`names::is_shoal_link`): the networks'
    /// gateway ends, and whatever else carries a Shoal name there (removed).
    pub links: BTreeMap<String, Link>,
    /// The node's network namespaces (`names::network_netns`), by VNI.
    pub networks: BTreeMap<u32, NetworkNs>,
    /// The comment of the node's `ip shoal` table, when it exists.
    pub node_table: Option<String>,
    /// Whether the node forwards IPv4 (`net.ipv4.ip_forward`).
    pub ip_forward: bool,
    /// The filter table's FORWARD chain of each iptables back end that has a filter table on the node.
    pub firewall: Vec<ForwardChain>,
    /// The namespaces of the desired tasks, by path.
    pub tasks: BTreeMap<PathBuf, TaskNs>,
}

/// What one network's namespace has.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetworkNs {
    /// The name is there but is no namespace any more (its bind mount died with the mount namespace that
    /// made it): it is deleted and made again.
    pub dead: bool,
    /// Its Shoal links (bridge, VXLAN device, uplink, task veth ends).
    pub links: BTreeMap<String, Link>,
    /// Static forwarding entries (with a remote destination) of its VXLAN device.
    pub fdb: BTreeSet<Fdb>,
    /// Permanent neighbour entries of its VXLAN device.
    pub neigh: BTreeSet<Neigh>,
    /// Whether the namespace forwards IPv4 (`net.ipv4.ip_forward` there): an internal network of several
    /// subnets is routed between its bridges here.
    pub ip_forward: bool,
}

/// The filter FORWARD chain of one iptables back end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForwardChain {
    /// The back end's command (`iptables-nft`, `iptables-legacy`).
    pub iptables: String,
    /// What `<iptables> -S FORWARD` prints, one line each (`-P FORWARD DROP`, `-A FORWARD -j DOCKER-USER`).
    pub rules: Vec<String>,
}

/// One link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    /// What it is.
    pub kind: LinkKind,
    /// The bridge it is enslaved to.
    pub master: Option<String>,
    /// Administratively up.
    pub up: bool,
    /// Its MTU.
    pub mtu: u16,
    /// Its IPv4 addresses.
    pub addrs: Vec<Ipv4Cidr>,
    /// Its Ethernet address.
    pub mac: Option<Mac>,
    /// `net.ipv4.conf.<link>.route_localnet` (read for gateway ends only): whether the node routes loopback
    /// addresses through it, which a published port reached on 127.0.0.1 needs (its DNAT keeps the loopback
    /// source until the egress rules rewrite it, and replies come back to 127.0.0.1).
    pub route_localnet: bool,
}

/// The kind of a link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkKind {
    /// A bridge.
    Bridge,
    /// A VXLAN device.
    Vxlan {
        /// Its VNI.
        vni: u32,
        /// Its UDP destination port.
        port: u16,
        /// Its local (source) address.
        local: Option<Ipv4Addr>,
        /// Learning is on (Shoal wants it off).
        learning: bool,
        /// ARP proxy is on (Shoal wants it on).
        proxy: bool,
    },
    /// One end of a veth pair.
    Veth,
    /// Anything else that happens to carry a Shoal name.
    Other(String),
}

/// A static forwarding entry: frames for `mac` go to the node at `dst`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Fdb {
    /// The VXLAN device.
    pub dev: String,
    /// The remote task's MAC.
    pub mac: Mac,
    /// The remote node's underlay address.
    pub dst: Ipv4Addr,
}

/// A permanent neighbour entry, answered by the VXLAN device's ARP proxy.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Neigh {
    /// The VXLAN device.
    pub dev: String,
    /// The remote task's address (IPv4, or IPv6 on a network with IPv6: answered by the device's neighbour
    /// discovery proxy).
    pub ip: IpAddr,
    /// Its MAC.
    pub mac: Mac,
}

/// What a task namespace has.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskNs {
    /// Its interfaces other than `lo`, by name.
    pub ifaces: BTreeMap<String, TaskIface>,
    /// The gateway of its default route.
    pub default_gw: Option<Ipv4Addr>,
    /// Its other routes through a gateway (destination, gateway): those to the other subnets of a network of
    /// several (docs/design/overlay-subnets.md).
    pub routes: BTreeSet<(Ipv4Cidr, Ipv4Addr)>,
    /// The comment of its `ip shoal` table, when it exists.
    pub table: Option<String>,
}

/// One interface in a task namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskIface {
    /// Its MAC.
    pub mac: Option<Mac>,
    /// Its IPv4 addresses.
    pub addrs: Vec<Ipv4Cidr>,
    /// Its global IPv6 addresses (link-local ones are the kernel's and not listed).
    pub addrs6: Vec<Ipv6Cidr>,
    /// Its MTU.
    pub mtu: u16,
    /// Administratively up.
    pub up: bool,
}

/// One change to the node. `vni` names the network whose namespace an op runs in.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs, reason = "each variant's doc names what its fields are")]
pub enum Op {
    /// Delete a link of the node's namespace (for a veth, both ends).
    DeleteLink { name: String },
    /// Delete a link of a network's namespace (for a veth, both ends).
    DeleteNetLink { vni: u32, name: String },
    /// Delete an interface inside a task namespace.
    DeleteTaskLink { netns: PathBuf, ifname: String },
    /// Remove a static forwarding entry.
    DelFdb { vni: u32, fdb: Fdb },
    /// Remove a neighbour entry.
    DelNeigh { vni: u32, neigh: Neigh },
    /// Make the network's namespace (`ip netns add`).
    CreateNetworkNs { vni: u32 },
    /// Delete the network's namespace (its links were deleted first).
    DeleteNetworkNs { vni: u32 },
    /// Create the network's bridge in its namespace, with `addrs` (its subnet's gateway on an internal network
    /// of several subnets, routed in the namespace; else none), up.
    CreateBridge { vni: u32, name: String, mtu: u16, addrs: Vec<Ipv4Cidr> },
    /// Let a network's namespace forward IPv4: an internal network of several subnets is routed there.
    EnableNetnsForward { vni: u32 },
    /// Create a VXLAN device of VXLAN ID `id` (its subnet's) without learning, with ARP proxy, in the node's
    /// namespace (its UDP socket stays there, on the underlay), then move it into the network's namespace,
    /// enslaved to `bridge`, up.
    CreateVxlan { vni: u32, id: u32, name: String, port: u16, local: Ipv4Addr, mtu: u16, bridge: String },
    /// Create the network's gateway veth: `name` in the node's namespace with `addrs` (the gateway, and on the
    /// ingress network the node's own ingress address as a /32) and `mac` if given, up; `peer` in the
    /// network's namespace on `bridge`, up.
    CreateGateway {
        vni: u32,
        name: String,
        peer: String,
        bridge: String,
        mtu: u16,
        addrs: Vec<Ipv4Cidr>,
        mac: Option<Mac>,
    },
    /// Enslave a link of a network's namespace to its bridge.
    SetMaster { vni: u32, name: String, master: String },
    /// Add a static forwarding entry.
    AddFdb { vni: u32, fdb: Fdb },
    /// Add (or replace) a neighbour entry.
    AddNeigh { vni: u32, neigh: Neigh },
    /// Create a veth: end `host` on `bridge` in the network's namespace, the other end `ifname` in `netns`
    /// with `mac`, `addr` and `addr6` (IPv6 turned on for it, no duplicate address detection), up.
    CreateVeth {
        vni: u32,
        host: String,
        bridge: String,
        netns: PathBuf,
        ifname: String,
        mac: Mac,
        addr: Ipv4Cidr,
        addr6: Option<Ipv6Cidr>,
        mtu: u16,
    },
    /// Set (or remove, `None`) the default route of a task namespace.
    SetDefaultRoute { netns: PathBuf, via: Option<(Ipv4Addr, String)> },
    /// Add (or replace) a route of a task namespace to `dst` through gateway `via` on interface `dev`: to
    /// another subnet of a network of several, through the gateway of the task's own subnet.
    AddRoute { netns: PathBuf, dst: Ipv4Cidr, via: Ipv4Addr, dev: String },
    /// Let the node forward IPv4 (needed for traffic out of non-internal networks).
    EnableIpForward,
    /// Let the node route loopback addresses through a network's gateway end (`route_localnet`), so a
    /// published port answers on 127.0.0.1. Planned after the node table, whose `loopback_guard` drops
    /// what arrives on a gateway end for 127.0.0.0/8 without a DNAT of Shoal's.
    RouteLocalnet { link: String },
    /// Replace the node's table.
    ApplyNodeTable { script: String },
    /// Delete the node's table.
    DeleteNodeTable,
    /// Replace a task namespace's table.
    ApplyTaskTable { netns: PathBuf, script: String },
    /// Delete a task namespace's table.
    DeleteTaskTable { netns: PathBuf },
    /// Insert a rule into the filter FORWARD chain of iptables back end `iptables` at `position` (1-based).
    InsertForwardRule { iptables: String, position: usize, rule: Vec<String> },
    /// Delete a rule of the filter FORWARD chain of iptables back end `iptables`.
    DeleteForwardRule { iptables: String, rule: Vec<String> },
}

/// The rules Shoal keeps in a FORWARD chain that would otherwise drop what the node forwards for its
/// networks (arguments after `-A FORWARD`, as `iptables -S` prints them): what goes out of a network's
/// gateway end (isolation between networks is the node table's, whose forward chain drops first), and what
/// comes back to it or was DNATed to it (a published port). Traffic between tasks of one network is bridged in
/// the network's namespace and never meets them.
pub(crate) fn forward_rules() -> Vec<Vec<String>> {
    let g = format!("{}+", names::GATEWAY_PREFIX);
    let c = names::IPTABLES_COMMENT;
    [
        format!("-o {g} -m conntrack --ctstate RELATED,ESTABLISHED,DNAT -m comment --comment {c} -j ACCEPT"),
        format!("-i {g} -m comment --comment {c} -j ACCEPT"),
    ]
    .iter()
    .map(|r| r.split(' ').map(String::from).collect())
    .collect()
}

/// The ops that make `chain` hold Shoal's rules (`carry`: the node has a non-internal network) when the chain
/// would drop (its policy is not ACCEPT, or it has rules of others, which may drop), right after the jump to
/// `DOCKER-USER` when there is one (a user's rules there keep deciding first), else at the top; and none
/// otherwise.
fn plan_forward_chain(chain: &ForwardChain, carry: bool) -> Vec<Op> {
    let rules: Vec<&str> = chain.rules.iter().filter_map(|l| l.trim().strip_prefix("-A FORWARD ")).collect();
    let is_ours = |r: &str| {
        let w: Vec<&str> = r.split(' ').collect();
        w.windows(2).any(|p| p == ["--comment", names::IPTABLES_COMMENT])
    };
    let drops = chain.rules.iter().any(|l| l.starts_with("-P FORWARD ") && l.trim() != "-P FORWARD ACCEPT")
        || rules.iter().any(|r| !is_ours(r));
    let want = if carry && drops { forward_rules() } else { Vec::new() };
    let ours: Vec<(usize, Vec<String>)> = rules
        .iter()
        .enumerate()
        .filter(|(_, r)| is_ours(r))
        .map(|(i, r)| (i, r.split(' ').map(String::from).collect()))
        .collect();
    let docker_user = rules.iter().position(|r| *r == "-j DOCKER-USER");
    let have: Vec<&Vec<String>> = ours.iter().map(|(_, r)| r).collect();
    let placed = docker_user.is_none_or(|d| ours.iter().all(|(i, _)| *i > d));
    if have.iter().copied().eq(want.iter()) && placed {
        return Vec::new();
    }
    let mut ops: Vec<Op> =
        have.iter().map(|r| Op::DeleteForwardRule { iptables: chain.iptables.clone(), rule: (*r).clone() }).collect();
    let position = docker_user.map_or(1, |d| 1 + rules[..=d].iter().filter(|r| !is_ours(r)).count());
    ops.extend(want.into_iter().enumerate().map(|(k, rule)| Op::InsertForwardRule {
        iptables: chain.iptables.clone(),
        position: position + k,
        rule,
    }));
    ops
}

/// The order in which stale links go: veths first (their other ends go with them), then VXLAN devices, then
/// the rest.
fn stale_order(l: &&String) -> (bool, bool, String) {
    (
        !(l.starts_with(names::VETH_PREFIX) || l.starts_with(names::GATEWAY_PREFIX)),
        !l.starts_with(names::VXLAN_PREFIX),
        (*l).clone(),
    )
}

/// A network namespace that has nothing: what a missing or dead one is planned from.
static NO_NETWORK_NS: NetworkNs =
    NetworkNs { dead: false, links: BTreeMap::new(), fdb: BTreeSet::new(), neigh: BTreeSet::new(), ip_forward: false };

/// A task namespace that has nothing: what an unobserved one is planned from.
static NO_TASK_NS: TaskNs = TaskNs { ifaces: BTreeMap::new(), default_gw: None, routes: BTreeSet::new(), table: None };

/// The plan being drafted: one list of ops per phase (run in the order `Draft::finish` gives), and what the
/// phases learn for the ones after them.
#[derive(Default)]
struct Draft {
    removals: Vec<Op>,
    namespaces: Vec<Op>,
    bridges: Vec<Op>,
    vxlans: Vec<Op>,
    gateways: Vec<Op>,
    masters: Vec<Op>,
    entries: Vec<Op>,
    veths: Vec<Op>,
    routes: Vec<Op>,
    tables: Vec<Op>,
    localnet: Vec<Op>,
    /// Links Shoal wants in the node's namespace.
    wanted: BTreeSet<String>,
    /// Links Shoal wants in each network's namespace, by VNI.
    wanted_in: BTreeMap<u32, BTreeSet<String>>,
    /// Bridges this plan creates (again): whatever stays must be enslaved to them anew.
    rebuilt_bridges: BTreeSet<String>,
    /// Addresses the node can already reach before this plan runs (kept neighbour entries of remote tasks,
    /// local tasks whose interfaces stay): a published port's DNAT may point only at those until the rest of
    /// the plan has made the others reachable.
    reachable: BTreeSet<Ipv4Addr>,
}

/// The network namespace `vni` as observed, or an empty one when it is missing or dead (it is made anew).
fn live(current: &Observed, vni: u32) -> &NetworkNs {
    current.networks.get(&vni).filter(|n| !n.dead).unwrap_or(&NO_NETWORK_NS)
}

/// The operations that take the node from `current` to `desired` (which must have passed `validate`).
pub(crate) fn plan(current: &Observed, desired: &NodeNetState) -> Vec<Op> {
    let mut draft = Draft::default();
    let mut networks: Vec<_> = desired.networks.iter().collect();
    networks.sort_by_key(|n| n.vni);
    for n in &networks {
        draft.network(current, desired, n);
    }
    for t in &desired.tasks {
        draft.task(current, desired, t);
    }
    let carry = networks.iter().any(|n| !n.internal);
    draft.finish(current, desired, carry)
}

impl Draft {
    /// Plans network `n`'s namespace, bridge, VXLAN device, gateway veth and forwarding entries.
    fn network(&mut self, current: &Observed, desired: &NodeNetState, n: &NetworkState) {
        let vni = n.vni;
        match current.networks.get(&vni) {
            Some(ns) if ns.dead => {
                self.removals.push(Op::DeleteNetworkNs { vni });
                self.namespaces.push(Op::CreateNetworkNs { vni });
            }
            Some(_) => {}
            None => self.namespaces.push(Op::CreateNetworkNs { vni }),
        }
        // One bridge, VXLAN device and (unless internal) gateway end per subnet, each named by its own VNI
        // (unique in the cluster), all in the namespace named by the first one's. An internal network has no
        // gateway ends on the node: with several subnets its gateways are on the bridges and its namespace
        // routes between them (as libnetwork's overlay sandbox does), with no way out.
        let routed_in_ns = n.internal && !n.more_subnets.is_empty();
        if routed_in_ns && !live(current, vni).ip_forward {
            self.namespaces.push(Op::EnableNetnsForward { vni });
        }
        let mut in_ns: BTreeSet<String> = BTreeSet::new();
        for sub in n.subnets() {
            let addrs: Vec<Ipv4Cidr> = if routed_in_ns {
                vec![Ipv4Cidr { addr: sub.gateway, prefix_len: sub.subnet.prefix_len }]
            } else {
                Vec::new()
            };
            let vx_ok = self.bridge_and_vxlan(current, desired, vni, sub.vni, addrs);
            in_ns.extend([names::bridge(sub.vni), names::vxlan(sub.vni)]);
            if !n.internal {
                in_ns.insert(self.gateway(current, desired, n, sub));
            }
            self.forwarding_entries(live(current, vni), n, sub.vni, vx_ok);
        }
        self.wanted_in.insert(vni, in_ns);
    }

    /// Plans the bridge (with `addrs`) and VXLAN device of the subnet with VXLAN ID `id` in network `vni`'s
    /// namespace; returns whether the device stays as it is.
    fn bridge_and_vxlan(
        &mut self,
        current: &Observed,
        desired: &NodeNetState,
        vni: u32,
        id: u32,
        addrs: Vec<Ipv4Cidr>,
    ) -> bool {
        let mtu = desired.overlay_mtu;
        let ns = live(current, vni);
        let (br, vx) = (names::bridge(id), names::vxlan(id));
        let br_ok =
            ns.links.get(&br).is_some_and(|l| l.kind == LinkKind::Bridge && l.up && l.mtu == mtu && l.addrs == addrs);
        if !br_ok {
            if ns.links.contains_key(&br) {
                self.removals.push(Op::DeleteNetLink { vni, name: br.clone() });
            }
            self.bridges.push(Op::CreateBridge { vni, name: br.clone(), mtu, addrs });
            self.rebuilt_bridges.insert(br.clone());
        }
        let local = desired.underlay_ip.expect("validated: networks need an underlay address");
        let want_vx =
            LinkKind::Vxlan { vni: id, port: desired.vxlan_port, local: Some(local), learning: false, proxy: true };
        let vx_link = ns.links.get(&vx);
        let vx_ok = vx_link.is_some_and(|l| l.kind == want_vx && l.up && l.mtu == mtu);
        if !vx_ok {
            if vx_link.is_some() {
                self.removals.push(Op::DeleteNetLink { vni, name: vx.clone() });
            }
            self.vxlans.push(Op::CreateVxlan { vni, id, name: vx, port: desired.vxlan_port, local, mtu, bridge: br });
        } else {
            self.enslave(vni, &vx, vx_link, &br);
        }
        vx_ok
    }

    /// Enslaves `name` (observed as `link`) to bridge `br` when it is not on it, or the bridge is made anew.
    fn enslave(&mut self, vni: u32, name: &str, link: Option<&Link>, br: &str) {
        if self.rebuilt_bridges.contains(br) || link.and_then(|l| l.master.as_deref()) != Some(br) {
            self.masters.push(Op::SetMaster { vni, name: name.to_string(), master: br.to_string() });
        }
    }

    /// Plans the gateway veth of subnet `sub` of non-internal network `n`: the node's end carries the
    /// subnet's gateway address (the routing mesh's source address too, as a /32, so the gateway stays the
    /// subnet route's source), and the node routes between a network's subnets through these ends. Returns
    /// the name of its end in the network's namespace.
    fn gateway(&mut self, current: &Observed, desired: &NodeNetState, n: &NetworkState, sub: Subnet) -> String {
        let (vni, mtu) = (n.vni, desired.overlay_mtu);
        let ns = live(current, vni);
        let br = names::bridge(sub.vni);
        let (gw, up) = (names::gateway(sub.vni), names::uplink(sub.vni));
        let ingress = desired.ingress.iter().find(|i| i.network_id == n.id && sub.subnet.contains(i.address));
        let mut addrs = vec![Ipv4Cidr { addr: sub.gateway, prefix_len: sub.subnet.prefix_len }];
        addrs.extend(ingress.map(|i| Ipv4Cidr { addr: i.address, prefix_len: 32 }));
        addrs.sort();
        // On the ingress network, the other nodes send what answers the mesh's connections to this node's
        // ingress address, at the MAC their view gives it (`mac_for`): the gateway end must have it.
        let mac = ingress.map(|i| mac_for(i.address));
        let gw_link = current.links.get(&gw);
        let gw_ok = gw_link.is_some_and(|l| {
            l.kind == LinkKind::Veth && l.up && l.mtu == mtu && l.addrs == addrs && mac.is_none_or(|m| l.mac == Some(m))
        });
        let up_link = ns.links.get(&up);
        let up_ok = up_link.is_some_and(|l| l.kind == LinkKind::Veth && l.up && l.mtu == mtu);
        let keep = gw_ok && up_ok;
        if keep {
            self.enslave(vni, &up, up_link, &br);
        } else {
            if gw_link.is_some() {
                self.removals.push(Op::DeleteLink { name: gw.clone() });
            } else if up_link.is_some() {
                self.removals.push(Op::DeleteNetLink { vni, name: up.clone() });
            }
            self.gateways.push(Op::CreateGateway {
                vni,
                name: gw.clone(),
                peer: up.clone(),
                bridge: br,
                mtu,
                addrs,
                mac,
            });
        }
        if !(keep && gw_link.is_some_and(|l| l.route_localnet)) {
            self.localnet.push(Op::RouteLocalnet { link: gw.clone() });
        }
        self.wanted.insert(gw);
        up
    }

    /// Plans the forwarding and neighbour entries of the VXLAN device of network `n`'s subnet with VXLAN ID
    /// `id` toward its peers there (they live on the device: a recreated one, `vx_ok` false, has none).
    fn forwarding_entries(&mut self, ns: &NetworkNs, n: &NetworkState, id: u32, vx_ok: bool) {
        let (vni, vx) = (n.vni, names::vxlan(id));
        let peers: Vec<_> = n.peers.iter().filter(|p| n.subnet_of(p.address).is_some_and(|s| s.vni == id)).collect();
        let (have_fdb, have_neigh): (BTreeSet<&Fdb>, BTreeSet<&Neigh>) = if vx_ok {
            (ns.fdb.iter().filter(|f| f.dev == vx).collect(), ns.neigh.iter().filter(|e| e.dev == vx).collect())
        } else {
            (BTreeSet::new(), BTreeSet::new())
        };
        let want_fdb: BTreeSet<Fdb> =
            peers.iter().map(|p| Fdb { dev: vx.clone(), mac: p.mac, dst: p.node_ip }).collect();
        // A peer's IPv6 address shares its IPv4 one's MAC (one interface per task and network).
        let want_neigh: BTreeSet<Neigh> = peers
            .iter()
            .flat_map(|p| {
                let v6 = p.address6.filter(|a| n.contains6(*a)).map(IpAddr::V6);
                std::iter::once(IpAddr::V4(p.address)).chain(v6).map(|ip| Neigh { dev: vx.clone(), ip, mac: p.mac })
            })
            .collect();
        self.removals
            .extend(have_fdb.iter().filter(|f| !want_fdb.contains(f)).map(|f| Op::DelFdb { vni, fdb: (*f).clone() }));
        self.reachable.extend(have_neigh.iter().filter(|e| want_neigh.contains(e)).filter_map(|e| match e.ip {
            IpAddr::V4(ip) => Some(ip),
            IpAddr::V6(_) => None,
        }));
        self.removals.extend(
            have_neigh.iter().filter(|e| !want_neigh.contains(e)).map(|e| Op::DelNeigh { vni, neigh: (*e).clone() }),
        );
        self.entries
            .extend(want_fdb.iter().filter(|f| !have_fdb.contains(f)).map(|f| Op::AddFdb { vni, fdb: f.clone() }));
        self.entries.extend(
            want_neigh.iter().filter(|e| !have_neigh.contains(e)).map(|e| Op::AddNeigh { vni, neigh: e.clone() }),
        );
    }

    /// Plans task `t`'s namespace: a veth per attachment, its default route and its table.
    fn task(&mut self, current: &Observed, desired: &NodeNetState, t: &TaskState) {
        let tns = current.tasks.get(&t.netns).unwrap_or(&NO_TASK_NS);
        let mut replumbed = false;
        let mut want_ifaces = BTreeSet::new();
        // Names in use in a joined namespace (the container's interfaces, and those this plan gives).
        let mut taken: BTreeSet<String> = tns.ifaces.keys().cloned().collect();
        for (i, a) in t.attachments.iter().enumerate() {
            let ifname = if t.joined {
                match tns.ifaces.iter().find(|(_, f)| f.mac == Some(mac_for(a.address))) {
                    Some((name, _)) => name.clone(),
                    None => names::free_task_ifname(&taken),
                }
            } else {
                t.ifname(i)
            };
            taken.insert(ifname.clone());
            let made = self.attachment(current, desired, t, tns, a, &ifname);
            replumbed |= made;
            self.subnet_routes(desired, t, tns, a, &ifname, made);
            want_ifaces.insert(ifname);
        }
        // Interfaces named like Shoal's that no attachment wants any more (a task's networks shrank); in a
        // joined namespace they are the container's own, and its routes too.
        if !t.joined {
            for name in tns.ifaces.keys() {
                if name.starts_with("eth") && !want_ifaces.contains(name) {
                    self.removals.push(Op::DeleteTaskLink { netns: t.netns.clone(), ifname: name.clone() });
                }
            }
            let via = t.attachments.iter().enumerate().find_map(|(i, a)| {
                let n = desired.network(&a.network_id)?;
                (!n.internal).then(|| (n.subnet_of(a.address).map_or(n.gateway, |s| s.gateway), t.ifname(i)))
            });
            if (replumbed && via.is_some()) || tns.default_gw != via.as_ref().map(|v| v.0) {
                self.routes.push(Op::SetDefaultRoute { netns: t.netns.clone(), via });
            }
        }
        match nft::task_table(desired, t) {
            Some(table) if tns.table.as_deref() != Some(table.tag.as_str()) => {
                self.tables.push(Op::ApplyTaskTable { netns: t.netns.clone(), script: table.script })
            }
            None if tns.table.is_some() => self.tables.push(Op::DeleteTaskTable { netns: t.netns.clone() }),
            _ => {}
        }
    }

    /// Plans the veth of task `t`'s attachment `a`, `ifname` inside the task's namespace `tns`; returns
    /// whether it is made (again).
    fn attachment(
        &mut self,
        current: &Observed,
        desired: &NodeNetState,
        t: &TaskState,
        tns: &TaskNs,
        a: &Attachment,
        ifname: &str,
    ) -> bool {
        let mtu = desired.overlay_mtu;
        let n = desired.network(&a.network_id).expect("validated: attachments name known networks");
        let vni = n.vni;
        let ns = live(current, vni);
        let host = names::veth(&t.task_id, &n.id);
        // The bridge of the subnet that holds the address (validated: one does).
        let sub = n.subnet_of(a.address).expect("validated: an attachment's address is in its network");
        let br = names::bridge(sub.vni);
        let mac = mac_for(a.address);
        let addr = Ipv4Cidr { addr: a.address, prefix_len: sub.subnet.prefix_len };
        let addr6 = a.address6.zip(n.ipv6).map(|(ip, s)| Ipv6Cidr { addr: ip, prefix_len: s.subnet.prefix_len });
        let host_link = ns.links.get(&host);
        let host_ok = host_link.is_some_and(|l| l.kind == LinkKind::Veth && l.up && l.mtu == mtu);
        let inner_ok = tns.ifaces.get(ifname).is_some_and(|f| {
            f.mac == Some(mac) && f.addrs == [addr] && f.addrs6 == addr6.as_slice() && f.up && f.mtu == mtu
        });
        let replumb = !(host_ok && inner_ok);
        if !replumb {
            self.reachable.insert(a.address);
            self.enslave(vni, &host, host_link, &br);
        } else {
            if host_link.is_some() {
                self.removals.push(Op::DeleteNetLink { vni, name: host.clone() });
            } else if tns.ifaces.contains_key(ifname) {
                self.removals.push(Op::DeleteTaskLink { netns: t.netns.clone(), ifname: ifname.to_string() });
            }
            self.veths.push(Op::CreateVeth {
                vni,
                host: host.clone(),
                bridge: br,
                netns: t.netns.clone(),
                ifname: ifname.to_string(),
                mac,
                addr,
                addr6,
                mtu,
            });
        }
        self.wanted_in.entry(vni).or_default().insert(host);
        replumb
    }

    /// Plans the routes of task `t`'s attachment `a` (interface `ifname`) to the other subnets of its
    /// network, through the gateway of its own subnet (libnetwork's `AddStaticRoute`); `made`: the interface is
    /// made (again) by this plan, so its routes are gone with the old one. Joined namespaces get them too
    /// (they are the network's own, and go with the interface).
    fn subnet_routes(
        &mut self,
        desired: &NodeNetState,
        t: &TaskState,
        tns: &TaskNs,
        a: &Attachment,
        ifname: &str,
        made: bool,
    ) {
        let n = desired.network(&a.network_id).expect("validated: attachments name known networks");
        let Some(own) = n.subnet_of(a.address) else { return };
        for other in n.subnets().filter(|s| s.vni != own.vni) {
            let dst = Ipv4Cidr { addr: other.subnet.network(), prefix_len: other.subnet.prefix_len };
            if made || !tns.routes.contains(&(dst, own.gateway)) {
                self.routes.push(Op::AddRoute {
                    netns: t.netns.clone(),
                    dst,
                    via: own.gateway,
                    dev: ifname.to_string(),
                });
            }
        }
    }

    /// The whole plan in its order: stale links and namespaces, the removals, the node's forwarding, table
    /// and firewall, then the phases (`carry`: the node has a non-internal network).
    fn finish(mut self, current: &Observed, desired: &NodeNetState, carry: bool) -> Vec<Op> {
        let mut out = stale_links(current, &self.wanted, &self.wanted_in);
        out.append(&mut self.removals);
        if carry && !current.ip_forward {
            out.push(Op::EnableIpForward);
        }
        let (first, last) = node_table(current, desired, &self.reachable);
        out.extend(first);
        for chain in &current.firewall {
            out.extend(plan_forward_chain(chain, carry));
        }
        for part in [
            self.namespaces,
            self.bridges,
            self.vxlans,
            self.gateways,
            self.masters,
            self.entries,
            self.veths,
            self.routes,
            self.tables,
            last,
            self.localnet,
        ] {
            out.extend(part);
        }
        out
    }
}

/// The deletions of every Shoal link nobody wants, and of network namespaces no network wants.
fn stale_links(current: &Observed, wanted: &BTreeSet<String>, wanted_in: &BTreeMap<u32, BTreeSet<String>>) -> Vec<Op> {
    // Every Shoal link of the node's namespace nobody wants (a gateway end takes its network end with it;
    // links of an older layout, bridges and VXLAN devices in the node's namespace, go too), veths first.
    let mut stale: Vec<&String> = current.links.keys().filter(|l| !wanted.contains(*l)).collect();
    stale.sort_by_key(stale_order);
    let mut out: Vec<Op> = stale.into_iter().map(|l| Op::DeleteLink { name: l.clone() }).collect();
    // In each network namespace: the links nobody wants (an uplink whose gateway end is deleted above goes
    // with it); a namespace no network wants goes after its links (deleted one by one first: a namespace's
    // own teardown runs later in the kernel, and its VXLAN device would keep the VNI's socket busy).
    for (vni, ns) in &current.networks {
        let want = wanted_in.get(vni);
        if ns.dead {
            if want.is_none() {
                out.push(Op::DeleteNetworkNs { vni: *vni });
            }
            continue;
        }
        let empty_set = BTreeSet::new();
        let want_links = want.unwrap_or(&empty_set);
        let mut stale: Vec<&String> = ns
            .links
            .keys()
            .filter(|l| !want_links.contains(*l))
            .filter(|l| {
                // An uplink goes with its gateway end (`shlu<id>` with `shlg<id>`, `id` its subnet's VNI).
                let gateway = l.strip_prefix(names::UPLINK_PREFIX).map(|id| format!("{}{id}", names::GATEWAY_PREFIX));
                !gateway.is_some_and(|g| current.links.contains_key(&g))
            })
            .filter(|l| want.is_some() || !l.starts_with(names::BRIDGE_PREFIX))
            .collect();
        stale.sort_by_key(stale_order);
        out.extend(stale.into_iter().map(|l| Op::DeleteNetLink { vni: *vni, name: l.clone() }));
        if want.is_none() {
            out.push(Op::DeleteNetworkNs { vni: *vni });
        }
    }
    out
}

/// The node table's ops: those that go before any network is linked to the node (isolation), and those that
/// go at the very end. When some published port's backend becomes reachable only through this plan (its
/// forwarding entries or veth come later; `reachable` are those reachable before it), that first table
/// forwards to the reachable backends only, and the whole table follows at the end: no connection is DNATed
/// to an address the node cannot reach yet.
fn node_table(current: &Observed, desired: &NodeNetState, reachable: &BTreeSet<Ipv4Addr>) -> (Vec<Op>, Vec<Op>) {
    let (mut first, mut last) = (Vec::new(), Vec::new());
    let have = current.node_table.as_deref();
    match nft::node_table(desired) {
        Some(full) if have != Some(full.tag.as_str()) => {
            let early = if desired.published.is_empty() {
                None
            } else {
                let mut published = desired.published.clone();
                for p in &mut published {
                    p.backends.retain(|b| reachable.contains(b));
                }
                let now = NodeNetState {
                    networks: desired.networks.clone(),
                    ingress: desired.ingress.clone(),
                    published,
                    ..NodeNetState::new(desired.underlay_ip.unwrap_or(Ipv4Addr::UNSPECIFIED))
                };
                nft::node_table(&now).filter(|t| t.tag != full.tag)
            };
            match early {
                Some(early) => {
                    if have != Some(early.tag.as_str()) {
                        first.push(Op::ApplyNodeTable { script: early.script });
                    }
                    last.push(Op::ApplyNodeTable { script: full.script });
                }
                None => first.push(Op::ApplyNodeTable { script: full.script }),
            }
        }
        None if current.node_table.is_some() => first.push(Op::DeleteNodeTable),
        _ => {}
    }
    (first, last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Attachment, NetworkState, Peer, TaskState};
    use crate::Error;
    use std::path::Path;

    fn net(vni: u32) -> NetworkState {
        NetworkState {
            id: format!("n{vni}"),
            name: format!("net{vni}"),
            vni,
            subnet: "10.9.0.0/24".parse().unwrap(),
            gateway: Ipv4Addr::new(10, 9, 0, 1),
            more_subnets: Vec::new(),
            internal: false,
            encrypted: false,
            peers: Vec::new(),
            services: Vec::new(),
            ipv6: None,
        }
    }

    fn link(kind: LinkKind) -> Link {
        Link { kind, master: None, up: true, mtu: 1450, addrs: Vec::new(), mac: None, route_localnet: true }
    }

    /// What a node carrying `s` (network 7 on 10.9.0.0/24) has once reconciled: its table, its gateway end
    /// (gateway address, loopback routed) and the network's namespace with its bridge, VXLAN device and
    /// uplink; no entries, no task.
    fn with_network_7(s: &NodeNetState) -> Observed {
        let mut o =
            Observed { ip_forward: true, node_table: Some(nft::node_table(s).unwrap().tag), ..Observed::default() };
        o.links.insert("shlg7".into(), Link { addrs: vec!["10.9.0.1/24".parse().unwrap()], ..link(LinkKind::Veth) });
        let mut ns = NetworkNs::default();
        ns.links.insert("shlb7".into(), link(LinkKind::Bridge));
        let vx = LinkKind::Vxlan { vni: 7, port: 4789, local: s.underlay_ip, learning: false, proxy: true };
        for (name, kind) in [("shlx7", vx), ("shlu7", LinkKind::Veth)] {
            ns.links.insert(name.into(), Link { master: Some("shlb7".into()), ..link(kind) });
        }
        o.networks.insert(7, ns);
        o
    }

    /// The op kinds `plan` returns, in order, as short names.
    fn kinds(ops: &[Op]) -> Vec<String> {
        ops.iter().map(|o| format!("{o:?}").split([' ', '(']).next().unwrap_or("").to_string()).collect()
    }

    fn check(observed: &Observed, desired: &NodeNetState, expected: &[&str]) {
        desired.validate().expect("valid state");
        assert_eq!(kinds(&plan(observed, desired)), expected, "plan for {desired:?}");
    }

    #[test]
    fn nothing_to_do_for_nothing() {
        check(&Observed::default(), &NodeNetState::new(Ipv4Addr::new(192, 0, 2, 1)), &[]);
    }

    #[test]
    fn a_fresh_node_gets_table_bridge_vxlan_entries_veth_route() {
        let mut s = NodeNetState::new(Ipv4Addr::new(192, 0, 2, 1));
        let mut n = net(7);
        let remote = Ipv4Addr::new(10, 9, 0, 9);
        n.peers =
            vec![Peer { address: remote, mac: mac_for(remote), node_ip: Ipv4Addr::new(192, 0, 2, 2), address6: None }];
        s.networks = vec![n];
        s.tasks = vec![TaskState {
            task_id: "t".into(),
            netns: "/run/netns/t".into(),
            attachments: vec![Attachment {
                network_id: "n7".into(),
                address: Ipv4Addr::new(10, 9, 0, 2),
                ifname: None,
                address6: None,
            }],
            joined: false,
        }];
        check(
            &Observed::default(),
            &s,
            &[
                "EnableIpForward",
                "ApplyNodeTable",
                "CreateNetworkNs",
                "CreateBridge",
                "CreateVxlan",
                "CreateGateway",
                "AddFdb",
                "AddNeigh",
                "CreateVeth",
                "SetDefaultRoute",
                // After the table (its loopback guard): the bridge routes loopback for 127.0.0.1's replies.
                "RouteLocalnet",
            ],
        );
        // Internal: no forwarding switched on, no gateway veth to the node, no default route, no loopback.
        s.networks[0].internal = true;
        let ops = plan(&Observed::default(), &s);
        assert_eq!(
            kinds(&ops),
            ["ApplyNodeTable", "CreateNetworkNs", "CreateBridge", "CreateVxlan", "AddFdb", "AddNeigh", "CreateVeth"]
        );
        assert!(ops.contains(&Op::CreateVeth {
            vni: 7,
            host: names::veth("t", "n7"),
            bridge: "shlb7".into(),
            netns: "/run/netns/t".into(),
            ifname: "eth0".into(),
            mac: mac_for(Ipv4Addr::new(10, 9, 0, 2)),
            addr: "10.9.0.2/24".parse().unwrap(),
            mtu: 1450,
            addr6: None,
        }));
    }

    /// A dual-stack network: the task's one interface gets its IPv6 address too, each peer an IPv6 neighbour
    /// entry with its IPv4 one's MAC; an interface found without its IPv6 address is made again; nothing is
    /// left to do once applied. Bad IPv6 states are refused.
    #[test]
    fn an_ipv6_network_gives_the_task_its_ipv6_address_and_peers_ipv6_neighbours() {
        use crate::state::Subnet6;
        use std::net::Ipv6Addr;
        let v6 = |h: u16| Ipv6Addr::new(0xfd00, 9, 0, 0, 0, 0, 0, h);
        let mut s = NodeNetState::new(Ipv4Addr::new(192, 0, 2, 1));
        let mut n = net(7);
        n.ipv6 = Some(Subnet6 { subnet: "fd00:9::/64".parse().unwrap(), gateway: v6(1) });
        let remote = Ipv4Addr::new(10, 9, 0, 9);
        n.peers = vec![Peer {
            address: remote,
            mac: mac_for(remote),
            node_ip: Ipv4Addr::new(192, 0, 2, 2),
            address6: Some(v6(9)),
        }];
        s.networks = vec![n];
        let local = Ipv4Addr::new(10, 9, 0, 2);
        s.tasks = vec![TaskState {
            task_id: "t".into(),
            netns: "/run/netns/t".into(),
            attachments: vec![Attachment {
                network_id: "n7".into(),
                address: local,
                ifname: None,
                address6: Some(v6(2)),
            }],
            joined: false,
        }];
        s.validate().expect("valid");
        let observed = with_network_7(&s);
        let ops = plan(&observed, &s);
        let neigh =
            |ip: IpAddr| Op::AddNeigh { vni: 7, neigh: Neigh { dev: "shlx7".into(), ip, mac: mac_for(remote) } };
        assert!(ops.contains(&neigh(remote.into())) && ops.contains(&neigh(v6(9).into())), "{ops:?}");
        let veth = ops.iter().find_map(|o| match o {
            Op::CreateVeth { addr6, .. } => Some(*addr6),
            _ => None,
        });
        assert_eq!(veth, Some(Some("fd00:9::2/64".parse().unwrap())), "{ops:?}");

        // Applied: nothing to do. Without its IPv6 address the interface is made again.
        let mut applied = observed.clone();
        let ns = applied.networks.get_mut(&7).unwrap();
        for ip in [IpAddr::from(remote), v6(9).into()] {
            ns.neigh.insert(Neigh { dev: "shlx7".into(), ip, mac: mac_for(remote) });
        }
        ns.fdb.insert(Fdb { dev: "shlx7".into(), mac: mac_for(remote), dst: Ipv4Addr::new(192, 0, 2, 2) });
        let host = names::veth("t", "n7");
        ns.links.insert(host, Link { master: Some("shlb7".into()), ..link(LinkKind::Veth) });
        let iface = TaskIface {
            mac: Some(mac_for(local)),
            addrs: vec!["10.9.0.2/24".parse().unwrap()],
            addrs6: vec!["fd00:9::2/64".parse().unwrap()],
            mtu: 1450,
            up: true,
        };
        let tns = TaskNs {
            ifaces: [("eth0".to_string(), iface)].into(),
            default_gw: Some(Ipv4Addr::new(10, 9, 0, 1)),
            table: nft::task_table(&s, &s.tasks[0]).map(|t| t.tag),
            ..TaskNs::default()
        };
        applied.tasks.insert("/run/netns/t".into(), tns);
        assert_eq!(plan(&applied, &s), Vec::<Op>::new());
        applied.tasks.get_mut(Path::new("/run/netns/t")).unwrap().ifaces.get_mut("eth0").unwrap().addrs6.clear();
        assert!(kinds(&plan(&applied, &s)).contains(&"CreateVeth".to_string()));

        let refused = |s: &NodeNetState, want: &str| {
            let e = s.validate().expect_err(want).to_string();
            assert!(e.contains(want), "{e} should contain {want:?}");
        };
        let mut bad = s.clone();
        bad.tasks[0].attachments[0].address6 = Some(v6(1));
        refused(&bad, "IPv6 address fd00:9::1 is not a host address");
        bad.tasks[0].attachments[0].address6 = Some(Ipv6Addr::new(0xfd00, 8, 0, 0, 0, 0, 0, 2));
        refused(&bad, "is not a host address of network n7's IPv6 subnet");
        let mut bad = s.clone();
        bad.networks[0].peers[0].address6 = Some(Ipv6Addr::new(0xfd00, 8, 0, 0, 0, 0, 0, 2));
        refused(&bad, "peer IPv6 address fd00:8::2 is outside its IPv6 subnet");
        let mut bad = s.clone();
        bad.networks[0].ipv6 = Some(Subnet6 { subnet: "fd00:9::/32".parse().unwrap(), gateway: v6(1) });
        refused(&bad, "must have a prefix length in 48..=120");
        let mut bad = s.clone();
        bad.networks[0].more_subnets =
            vec![Subnet { vni: 8, subnet: "10.19.0.0/24".parse().unwrap(), gateway: Ipv4Addr::new(10, 19, 0, 1) }];
        refused(&bad, "an IPv6 network takes one IPv4 subnet beside its IPv6 one");
    }

    /// A network of two subnets (docs/design/overlay-subnets.md): a bridge, VXLAN device (with its own VNI)
    /// and gateway end per subnet, in the network's one namespace; each task on its address's subnet bridge,
    /// with its default route and a route to the other subnet through its own subnet's gateway; each peer's
    /// entries on the VXLAN device of its subnet; the node table lets the two gateway ends reach each other.
    /// Observed as applied, nothing is left to do.
    #[test]
    fn a_network_of_two_subnets_gets_a_bridge_vxlan_and_gateway_per_subnet_and_routes_between_them() {
        let mut s = NodeNetState::new(Ipv4Addr::new(192, 0, 2, 1));
        let mut n = net(7);
        let second = Subnet { vni: 8, subnet: "10.19.0.0/24".parse().unwrap(), gateway: Ipv4Addr::new(10, 19, 0, 1) };
        n.more_subnets = vec![second];
        let (p1, p2) = (Ipv4Addr::new(10, 9, 0, 9), Ipv4Addr::new(10, 19, 0, 9));
        let other_node = Ipv4Addr::new(192, 0, 2, 2);
        n.peers = [p1, p2].map(|a| Peer { address: a, mac: mac_for(a), node_ip: other_node, address6: None }).into();
        s.networks = vec![n];
        let (a1, a2) = (Ipv4Addr::new(10, 9, 0, 2), Ipv4Addr::new(10, 19, 0, 2));
        let task = |id: &str, address| TaskState {
            task_id: id.into(),
            netns: format!("/run/netns/{id}").into(),
            attachments: vec![Attachment { network_id: "n7".into(), address, ifname: None, address6: None }],
            joined: false,
        };
        s.tasks = vec![task("a", a1), task("b", a2)];
        s.validate().unwrap();
        let ops = plan(&Observed::default(), &s);
        let has = |op: Op| assert!(ops.contains(&op), "{op:?} missing from {ops:#?}");
        for (id, sub) in [(7, "10.9.0.1/24"), (8, "10.19.0.1/24")] {
            has(Op::CreateBridge { vni: 7, name: format!("shlb{id}"), mtu: 1450, addrs: vec![] });
            has(Op::CreateVxlan {
                vni: 7,
                id,
                name: format!("shlx{id}"),
                port: 4789,
                local: Ipv4Addr::new(192, 0, 2, 1),
                mtu: 1450,
                bridge: format!("shlb{id}"),
            });
            has(Op::CreateGateway {
                vni: 7,
                name: format!("shlg{id}"),
                peer: format!("shlu{id}"),
                bridge: format!("shlb{id}"),
                mtu: 1450,
                addrs: vec![sub.parse().unwrap()],
                mac: None,
            });
        }
        for (peer, dev) in [(p1, "shlx7"), (p2, "shlx8")] {
            has(Op::AddFdb { vni: 7, fdb: Fdb { dev: dev.into(), mac: mac_for(peer), dst: other_node } });
            has(Op::AddNeigh { vni: 7, neigh: Neigh { dev: dev.into(), ip: peer.into(), mac: mac_for(peer) } });
        }
        assert_eq!(ops.iter().filter(|o| matches!(o, Op::AddFdb { .. })).count(), 2, "each peer on one device");
        let (gw1, gw2) = (Ipv4Addr::new(10, 9, 0, 1), Ipv4Addr::new(10, 19, 0, 1));
        for (id, addr, br, gw, other) in
            [("a", a1, "shlb7", gw1, "10.19.0.0/24"), ("b", a2, "shlb8", gw2, "10.9.0.0/24")]
        {
            let netns: PathBuf = format!("/run/netns/{id}").into();
            has(Op::CreateVeth {
                vni: 7,
                host: names::veth(id, "n7"),
                bridge: br.into(),
                netns: netns.clone(),
                ifname: "eth0".into(),
                mac: mac_for(addr),
                addr: Ipv4Cidr { addr, prefix_len: 24 },
                mtu: 1450,
                addr6: None,
            });
            has(Op::SetDefaultRoute { netns: netns.clone(), via: Some((gw, "eth0".into())) });
            has(Op::AddRoute { netns, dst: other.parse().unwrap(), via: gw, dev: "eth0".into() });
        }
        let table = nft::node_table(&s).unwrap().script;
        assert!(
            table.contains(r#"iifname { "shlg7", "shlg8" } oifname "shlg*" oifname != { "shlg7", "shlg8" } drop"#),
            "{table}"
        );
        assert!(table.contains(r#"ip saddr 10.19.0.0/24 oifname != { "shlg7", "shlg8" } masquerade"#), "{table}");

        // The node as that plan leaves it: nothing more to do.
        let mut o =
            Observed { ip_forward: true, node_table: Some(nft::node_table(&s).unwrap().tag), ..Observed::default() };
        let mut ns = NetworkNs::default();
        for (id, sub) in [(7u32, "10.9.0.1/24"), (8, "10.19.0.1/24")] {
            let br = format!("shlb{id}");
            o.links.insert(format!("shlg{id}"), Link { addrs: vec![sub.parse().unwrap()], ..link(LinkKind::Veth) });
            ns.links.insert(br.clone(), link(LinkKind::Bridge));
            let vx = LinkKind::Vxlan { vni: id, port: 4789, local: s.underlay_ip, learning: false, proxy: true };
            for (name, kind) in [(format!("shlx{id}"), vx), (format!("shlu{id}"), LinkKind::Veth)] {
                ns.links.insert(name, Link { master: Some(br.clone()), ..link(kind) });
            }
        }
        for (peer, dev) in [(p1, "shlx7"), (p2, "shlx8")] {
            ns.fdb.insert(Fdb { dev: dev.into(), mac: mac_for(peer), dst: other_node });
            ns.neigh.insert(Neigh { dev: dev.into(), ip: peer.into(), mac: mac_for(peer) });
        }
        for (id, addr, br, gw, other) in
            [("a", a1, "shlb7", gw1, "10.19.0.0/24"), ("b", a2, "shlb8", gw2, "10.9.0.0/24")]
        {
            ns.links.insert(names::veth(id, "n7"), Link { master: Some(br.into()), ..link(LinkKind::Veth) });
            let mut tns = TaskNs { default_gw: Some(gw), ..TaskNs::default() };
            tns.ifaces.insert(
                "eth0".into(),
                TaskIface {
                    mac: Some(mac_for(addr)),
                    addrs: vec![Ipv4Cidr { addr, prefix_len: 24 }],
                    mtu: 1450,
                    up: true,
                    addrs6: Vec::new(),
                },
            );
            tns.routes.insert((other.parse().unwrap(), gw));
            o.tasks.insert(format!("/run/netns/{id}").into(), tns);
        }
        o.networks.insert(7, ns);
        check(&o, &s, &[]);
        // A route to the other subnet gone (someone deleted it): only it comes back.
        o.tasks.get_mut(Path::new("/run/netns/a")).unwrap().routes.clear();
        check(&o, &s, &["AddRoute"]);

        // Internal: no gateway end on the node; each bridge has its subnet's gateway and the network's
        // namespace forwards, so the subnets are routed there; the tasks keep their routes to the other subnet
        // and have no default route.
        s.networks[0].internal = true;
        s.validate().unwrap();
        let ops = plan(&Observed::default(), &s);
        let has = |op: Op| assert!(ops.contains(&op), "{op:?} missing from {ops:#?}");
        has(Op::EnableNetnsForward { vni: 7 });
        for (id, gw) in [(7, "10.9.0.1/24"), (8, "10.19.0.1/24")] {
            has(Op::CreateBridge { vni: 7, name: format!("shlb{id}"), mtu: 1450, addrs: vec![gw.parse().unwrap()] });
        }
        assert!(!kinds(&ops).iter().any(|k| k == "CreateGateway" || k == "SetDefaultRoute" || k == "EnableIpForward"));
        assert_eq!(kinds(&ops).iter().filter(|k| *k == "AddRoute").count(), 2, "{ops:#?}");
        // Applied: nothing to do; the namespace's forwarding found off is turned on again.
        o.links.clear();
        o.node_table = Some(nft::node_table(&s).unwrap().tag);
        let ns = o.networks.get_mut(&7).unwrap();
        ns.links.retain(|name, _| !name.starts_with("shlu"));
        for (id, gw) in [(7, "10.9.0.1/24"), (8, "10.19.0.1/24")] {
            ns.links.get_mut(&format!("shlb{id}")).unwrap().addrs = vec![gw.parse().unwrap()];
        }
        ns.ip_forward = true;
        for t in o.tasks.values_mut() {
            t.default_gw = None;
        }
        let a = o.tasks.get_mut(Path::new("/run/netns/a")).unwrap();
        a.routes.insert(("10.19.0.0/24".parse().unwrap(), gw1));
        check(&o, &s, &[]);
        o.networks.get_mut(&7).unwrap().ip_forward = false;
        check(&o, &s, &["EnableNetnsForward"]);
    }

    #[test]
    fn subnets_of_a_network_are_checked() {
        let mut s = NodeNetState::new(Ipv4Addr::new(192, 0, 2, 1));
        let sub = |vni, subnet: &str, gw| Subnet { vni, subnet: subnet.parse().unwrap(), gateway: gw };
        let refused = |s: &NodeNetState, want: &str| {
            let e = s.validate().expect_err(want).to_string();
            assert!(e.contains(want), "{e} should contain {want:?}");
        };
        let mut n = net(7);
        n.more_subnets = vec![sub(8, "10.9.0.128/25", Ipv4Addr::new(10, 9, 0, 129))];
        s.networks = vec![n.clone()];
        refused(&s, "overlap or share a VNI");
        s.networks[0].more_subnets = vec![sub(7, "10.19.0.0/24", Ipv4Addr::new(10, 19, 0, 1))];
        refused(&s, "overlap or share a VNI");
        s.networks[0].more_subnets = vec![sub(8, "10.19.0.0/24", Ipv4Addr::new(10, 20, 0, 1))];
        refused(&s, "gateway 10.20.0.1 is outside subnet 10.19.0.0/24");
        s.networks[0].more_subnets = vec![sub(8, "10.19.0.0/24", Ipv4Addr::new(10, 19, 0, 1))];
        s.validate().unwrap();
        // Another network may not reuse the second subnet's VNI; a task may not take its gateway.
        let mut other = net(8);
        (other.id, other.subnet, other.gateway) =
            ("o".into(), "10.29.0.0/24".parse().unwrap(), Ipv4Addr::new(10, 29, 0, 1));
        s.networks.push(other);
        refused(&s, "VNI 8 is used by two networks");
        s.networks.pop();
        s.tasks = vec![TaskState {
            task_id: "t".into(),
            netns: "/run/netns/t".into(),
            attachments: vec![Attachment {
                network_id: "n7".into(),
                address: Ipv4Addr::new(10, 19, 0, 1),
                ifname: None,
                address6: None,
            }],
            joined: false,
        }];
        refused(&s, "address 10.19.0.1 is not a host address of network n7's subnets");
        s.tasks[0].attachments[0].address = Ipv4Addr::new(10, 19, 0, 7);
        s.validate().unwrap();
        s.networks[0].more_subnets = (0..16)
            .map(|i| {
                sub(100 + i, &format!("10.{}.0.0/24", 100 + i), Ipv4Addr::new(10, 100 + u8::try_from(i).unwrap(), 0, 1))
            })
            .collect();
        s.tasks.clear();
        refused(&s, "17 subnets; at most 16");
    }

    #[test]
    fn an_attachment_that_names_its_interface_gets_it_and_the_route_through_it() {
        let mut s = NodeNetState::new(Ipv4Addr::new(192, 0, 2, 1));
        let mut n8 = net(8);
        (n8.subnet, n8.gateway) = ("10.8.0.0/24".parse().unwrap(), Ipv4Addr::new(10, 8, 0, 1));
        s.networks = vec![net(7), n8];
        let (a7, a8) = (Ipv4Addr::new(10, 9, 0, 2), Ipv4Addr::new(10, 8, 0, 2));
        s.tasks = vec![TaskState {
            task_id: "t".into(),
            netns: "/run/netns/t".into(),
            attachments: vec![
                Attachment { network_id: "n7".into(), address: a7, ifname: Some("front0".into()), address6: None },
                Attachment { network_id: "n8".into(), address: a8, ifname: None, address6: None },
            ],
            joined: false,
        }];
        s.validate().unwrap();
        let ops = plan(&Observed::default(), &s);
        let veths: Vec<&str> = ops
            .iter()
            .filter_map(|o| match o {
                Op::CreateVeth { ifname, .. } => Some(ifname.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(veths, ["front0", "eth1"]);
        assert!(ops.contains(&Op::SetDefaultRoute {
            netns: "/run/netns/t".into(),
            via: Some((Ipv4Addr::new(10, 9, 0, 1), "front0".into()))
        }));
        // A name given twice (against another attachment's eth<i> too), or one the kernel refuses: invalid.
        for (name, want) in [("eth1", "both be interface eth1"), ("lo", "not lo"), ("a/b", "letters")] {
            s.tasks[0].attachments[0].ifname = Some(name.into());
            let err = s.validate().expect_err(want).to_string();
            assert!(err.contains(want), "{err}");
        }
    }

    #[test]
    fn a_joined_namespace_keeps_the_containers_interfaces_and_route() {
        let mut s = NodeNetState::new(Ipv4Addr::new(192, 0, 2, 1));
        s.networks = vec![net(7)];
        let addr = Ipv4Addr::new(10, 9, 0, 2);
        s.tasks = vec![TaskState {
            task_id: "t".into(),
            netns: "/run/netns/t".into(),
            attachments: vec![Attachment { network_id: "n7".into(), address: addr, ifname: None, address6: None }],
            joined: true,
        }];
        let mut o = with_network_7(&s);
        // A container of the engine's default bridge: its eth0, its default route through the bridge.
        let bridge_if = TaskIface {
            mac: Some(mac_for(Ipv4Addr::new(172, 17, 0, 2))),
            addrs: vec!["172.17.0.2/16".parse().unwrap()],
            mtu: 1500,
            up: true,
            addrs6: Vec::new(),
        };
        let mut tns = TaskNs { default_gw: Some(Ipv4Addr::new(172, 17, 0, 1)), ..TaskNs::default() };
        tns.ifaces.insert("eth0".into(), bridge_if);
        o.tasks.insert("/run/netns/t".into(), tns.clone());
        let ops = plan(&o, &s);
        // The overlay's interface is eth1; nothing of the container's is removed; the route stays.
        assert_eq!(kinds(&ops), ["CreateVeth"], "{ops:?}");
        assert!(matches!(&ops[0], Op::CreateVeth { ifname, .. } if ifname == "eth1"), "{ops:?}");

        // Plumbed: found by its MAC, nothing to do.
        tns.ifaces.insert(
            "eth1".into(),
            TaskIface {
                mac: Some(mac_for(addr)),
                addrs: vec!["10.9.0.2/24".parse().unwrap()],
                mtu: 1450,
                up: true,
                addrs6: Vec::new(),
            },
        );
        o.tasks.insert("/run/netns/t".into(), tns.clone());
        o.networks
            .get_mut(&7)
            .unwrap()
            .links
            .insert(names::veth("t", "n7"), Link { master: Some("shlb7".into()), ..link(LinkKind::Veth) });
        assert_eq!(plan(&o, &s), []);

        // The same namespace made for a task of its own: eth0 would be Shoal's, and the route too.
        s.tasks[0].joined = false;
        let kinds_own = kinds(&plan(&o, &s));
        assert!(kinds_own.contains(&"SetDefaultRoute".to_string()), "{kinds_own:?}");
    }

    #[test]
    fn a_gateway_found_without_route_localnet_gets_it_and_a_dead_namespace_is_made_again() {
        let mut s = NodeNetState::new(Ipv4Addr::new(192, 0, 2, 1));
        s.networks = vec![net(7)];
        let mut o = with_network_7(&s);
        o.links.get_mut("shlg7").unwrap().route_localnet = false;
        assert_eq!(plan(&o, &s), [Op::RouteLocalnet { link: "shlg7".into() }]);
        o.links.get_mut("shlg7").unwrap().route_localnet = true;
        assert_eq!(plan(&o, &s), []);
        // A namespace whose name lost its mount is deleted and made again, with everything in it.
        o.networks.get_mut(&7).unwrap().dead = true;
        let ops = plan(&o, &s);
        assert_eq!(
            kinds(&ops),
            [
                "DeleteNetworkNs",
                "DeleteLink",
                "CreateNetworkNs",
                "CreateBridge",
                "CreateVxlan",
                "CreateGateway",
                "RouteLocalnet"
            ],
            "{ops:?}"
        );
    }

    #[test]
    fn stale_links_go_veths_first_and_the_table_last() {
        let mut o = Observed::default();
        o.links.insert("shlb3".into(), link(LinkKind::Bridge));
        o.links.insert(
            "shlx3".into(),
            link(LinkKind::Vxlan { vni: 3, port: 4789, local: None, learning: false, proxy: true }),
        );
        o.links.insert("shlv0123456789".into(), link(LinkKind::Veth));
        o.node_table = Some("shoal:0".into());
        o.ip_forward = true;
        let ops = plan(&o, &NodeNetState::new(Ipv4Addr::new(192, 0, 2, 1)));
        let names: Vec<String> = ops.iter().map(|op| format!("{op:?}")).collect();
        assert_eq!(names.len(), 4, "{names:?}");
        assert!(names[0].contains("shlv") && names[1].contains("shlx3") && names[2].contains("shlb3"), "{names:?}");
        assert_eq!(ops[3], Op::DeleteNodeTable);

        // A network's namespace nobody wants: its gateway end (taking its uplink), then its veths and VXLAN
        // device one by one, then the namespace.
        let mut o = Observed::default();
        o.links.insert("shlg3".into(), link(LinkKind::Veth));
        let mut ns = NetworkNs::default();
        for (name, kind) in [("shlb3", LinkKind::Bridge), ("shlu3", LinkKind::Veth), ("shlv0123456789", LinkKind::Veth)]
        {
            ns.links.insert(name.into(), link(kind));
        }
        ns.links.insert(
            "shlx3".into(),
            link(LinkKind::Vxlan { vni: 3, port: 4789, local: None, learning: false, proxy: true }),
        );
        o.networks.insert(3, ns);
        assert_eq!(
            plan(&o, &NodeNetState::new(Ipv4Addr::new(192, 0, 2, 1))),
            [
                Op::DeleteLink { name: "shlg3".into() },
                Op::DeleteNetLink { vni: 3, name: "shlv0123456789".into() },
                Op::DeleteNetLink { vni: 3, name: "shlx3".into() },
                Op::DeleteNetworkNs { vni: 3 },
            ]
        );
    }

    #[test]
    fn forward_rules_go_after_docker_user_where_the_chain_would_drop_and_nowhere_else() {
        let chain = |lines: &[&str]| ForwardChain {
            iptables: "iptables-nft".into(),
            rules: lines.iter().map(|l| l.to_string()).collect(),
        };
        let ours: Vec<String> = forward_rules().iter().map(|r| format!("-A FORWARD {}", r.join(" "))).collect();
        let docker = [
            "-P FORWARD DROP",
            "-A FORWARD -j DOCKER-USER",
            "-A FORWARD -j DOCKER-ISOLATION-STAGE-1",
            "-A FORWARD -o docker0 -j DOCKER",
        ];
        // Docker's chain: inserted as rules 2 and 3, right after the jump to DOCKER-USER.
        let ops = plan_forward_chain(&chain(&docker), true);
        assert_eq!(
            ops.iter()
                .map(|o| match o {
                    Op::InsertForwardRule { position, .. } => *position,
                    other => panic!("{other:?}"),
                })
                .collect::<Vec<_>>(),
            [2, 3]
        );
        // In place: nothing to do. Without a network to carry: removed.
        let mut placed: Vec<&str> = vec![docker[0], docker[1]];
        placed.extend(ours.iter().map(String::as_str));
        placed.extend(&docker[2..]);
        assert_eq!(plan_forward_chain(&chain(&placed), true), []);
        assert_eq!(kinds(&plan_forward_chain(&chain(&placed), false)), ["DeleteForwardRule", "DeleteForwardRule"]);
        // Found before DOCKER-USER's jump (Docker restarted and put its jump below them): moved after it.
        let mut early: Vec<&str> = vec![docker[0]];
        early.extend(ours.iter().map(String::as_str));
        early.extend(&docker[1..]);
        let ops = plan_forward_chain(&chain(&early), true);
        assert_eq!(kinds(&ops), ["DeleteForwardRule", "DeleteForwardRule", "InsertForwardRule", "InsertForwardRule"]);
        assert!(matches!(&ops[2], Op::InsertForwardRule { position: 2, .. }), "{ops:?}");
        // A chain that accepts everything needs nothing; policy DROP alone (no Docker) gets them at the top.
        assert_eq!(plan_forward_chain(&chain(&["-P FORWARD ACCEPT"]), true), []);
        let ops = plan_forward_chain(&chain(&["-P FORWARD DROP"]), true);
        assert!(matches!(&ops[0], Op::InsertForwardRule { position: 1, .. }), "{ops:?}");
    }

    #[test]
    fn a_peer_that_moves_node_gets_its_entry_replaced() {
        let mut s = NodeNetState::new(Ipv4Addr::new(192, 0, 2, 1));
        let mut n = net(7);
        let remote = Ipv4Addr::new(10, 9, 0, 9);
        n.peers =
            vec![Peer { address: remote, mac: mac_for(remote), node_ip: Ipv4Addr::new(192, 0, 2, 3), address6: None }];
        s.networks = vec![n];
        let mut o = with_network_7(&s);
        let ns = o.networks.get_mut(&7).unwrap();
        ns.fdb.insert(Fdb { dev: "shlx7".into(), mac: mac_for(remote), dst: Ipv4Addr::new(192, 0, 2, 2) });
        ns.neigh.insert(Neigh { dev: "shlx7".into(), ip: remote.into(), mac: mac_for(remote) });
        check(&o, &s, &["DelFdb", "AddFdb"]);
    }

    /// A node carrying the routing mesh: ingress network `n7` with the node's address 10.9.0.50, port 8080
    /// over two backends (one of them remote), host-mode port 8081 to a local task, and 8082 with none.
    fn meshed() -> NodeNetState {
        use crate::state::{NodeIngress, Protocol, PublishedPort};
        let mut s = NodeNetState::new(Ipv4Addr::new(192, 0, 2, 1));
        s.networks = vec![net(7)];
        s.ingress = Some(NodeIngress { network_id: "n7".into(), address: Ipv4Addr::new(10, 9, 0, 50) });
        let port = |protocol, port, backends: &[u8]| PublishedPort {
            protocol,
            port,
            target_port: 80,
            backends: backends.iter().map(|b| Ipv4Addr::new(10, 9, 0, *b)).collect(),
        };
        s.published =
            vec![port(Protocol::Tcp, 8080, &[3, 2]), port(Protocol::Udp, 8081, &[2]), port(Protocol::Tcp, 8082, &[])];
        s
    }

    #[test]
    fn the_routing_mesh_puts_the_ingress_address_on_the_bridge_and_published_ports_in_the_node_table() {
        let s = meshed();
        let ops = plan(&Observed::default(), &s);
        assert!(
            ops.contains(&Op::CreateGateway {
                vni: 7,
                name: "shlg7".into(),
                peer: "shlu7".into(),
                bridge: "shlb7".into(),
                mtu: 1450,
                addrs: vec!["10.9.0.1/24".parse().unwrap(), "10.9.0.50/32".parse().unwrap()],
                mac: Some(mac_for(Ipv4Addr::new(10, 9, 0, 50))),
            }),
            "{ops:?}"
        );
        let t = nft::node_table(&s).unwrap().script;
        println!("{t}");
        for want in [
            "oifname \"shlg7\" ct status dnat snat to 10.9.0.50",
            "oifname \"shlg7\" ip saddr 10.9.0.1 snat to 10.9.0.50",
            "tcp dport 8080 dnat ip to numgen inc mod 2 map { 0 : 10.9.0.2 . 80, 1 : 10.9.0.3 . 80 }",
            "udp dport 8081 dnat to 10.9.0.2:80",
            "tcp dport 8082 reject with tcp reset",
            "type nat hook prerouting priority -100",
            "type nat hook output priority -100",
            "fib daddr type local ip daddr != 127.0.0.0/8 jump published",
            "type nat hook output priority -100; policy accept;\n    fib daddr type local jump published",
            "policy accept;\n    ct status dnat accept\n",
            "oifname \"shlg*\" ip saddr 127.0.0.0/8 ct status dnat masquerade",
            "iifname \"shlg*\" ip daddr 127.0.0.0/8 ct status dnat accept\n    iifname \"shlg*\" ip daddr 127.0.0.0/8 \
             drop",
        ] {
            assert!(t.contains(want), "{want:?} missing from\n{t}");
        }
        // On a fresh node no backend is reachable before the entries and veths exist: the first table refuses
        // the ports, the whole table comes last.
        let scripts: Vec<&String> = ops
            .iter()
            .filter_map(|o| match o {
                Op::ApplyNodeTable { script } => Some(script),
                _ => None,
            })
            .collect();
        assert_eq!(scripts.len(), 2, "{ops:?}");
        assert!(scripts[0].contains("tcp dport 8080 reject") && !scripts[0].contains("dnat ip to"), "{}", scripts[0]);
        assert_eq!(*scripts[1], t);
        assert!(matches!(ops[ops.len() - 2], Op::ApplyNodeTable { .. }), "{ops:?}");
        assert_eq!(ops.last(), Some(&Op::RouteLocalnet { link: "shlg7".into() }));
        // The loopback SNAT comes after the ingress bridge's own (the first nat rule that matches applies).
        let ingress_snat = t.find("snat to 10.9.0.50").unwrap();
        assert!(t.find("ip saddr 127.0.0.0/8 ct status dnat masquerade").unwrap() > ingress_snat, "{t}");
        // No published port: no mesh chains, and the table is the one a node without the mesh has.
        let mut plain = s.clone();
        plain.published.clear();
        plain.ingress = None;
        let t = nft::node_table(&plain).unwrap().script;
        assert!(!t.contains("published") && !t.contains("snat"), "{t}");
        // The ingress address arriving later rebuilds the gateway veth with it.
        let mut o = with_network_7(&s);
        o.node_table = None;
        let ops = plan(&o, &s);
        assert_eq!(kinds(&ops)[..3], ["DeleteLink", "ApplyNodeTable", "CreateGateway"], "{ops:?}");
    }

    #[test]
    fn bad_published_ports_and_ingress_addresses_are_refused() {
        use crate::state::{Protocol, PublishedPort, MAX_PUBLISHED_PORTS};
        type Change = Box<dyn Fn(&mut NodeNetState)>;
        let cases: Vec<(Change, &str)> = vec![
            (Box::new(|s| s.ingress.as_mut().unwrap().network_id = "n9".into()), "unknown network n9"),
            (Box::new(|s| s.ingress.as_mut().unwrap().address = Ipv4Addr::new(10, 9, 0, 1)), "not a host address"),
            (Box::new(|s| s.ingress.as_mut().unwrap().address = Ipv4Addr::new(10, 9, 0, 255)), "not a host address"),
            (
                Box::new(|s| {
                    let p = s.published[0].clone();
                    s.published.push(p)
                }),
                "port 8080/tcp is published twice",
            ),
            (Box::new(|s| s.published[1].target_port = 0), "1..=65535"),
            (
                Box::new(|s| s.published[0].backends.push(Ipv4Addr::new(10, 1, 0, 2))),
                "backend 10.1.0.2 is on none of the node's networks",
            ),
            (
                Box::new(|s| {
                    s.published = (1..=u16::try_from(MAX_PUBLISHED_PORTS).unwrap() + 1)
                        .map(|port| PublishedPort { protocol: Protocol::Tcp, port, target_port: 80, backends: vec![] })
                        .collect()
                }),
                "at most 4096",
            ),
        ];
        meshed().validate().expect("the base state is valid");
        for (change, want) in cases {
            let mut s = meshed();
            change(&mut s);
            let err = s.validate().expect_err(want).to_string();
            assert!(err.contains(want), "{err:?} lacks {want:?}");
        }
    }

    #[test]
    fn invalid_states_are_refused_with_the_bound() {
        let base = || {
            let mut s = NodeNetState::new(Ipv4Addr::new(192, 0, 2, 1));
            s.networks = vec![net(7)];
            s
        };
        type Change = Box<dyn Fn(&mut NodeNetState)>;
        let cases: Vec<(Change, &str)> = vec![
            (Box::new(|s| s.networks[0].vni = 0), "outside 1..=16777215"),
            (Box::new(|s| s.networks[0].gateway = Ipv4Addr::new(10, 8, 0, 1)), "outside subnet"),
            (Box::new(|s| s.networks.push(net(7))), "listed twice"),
            (
                Box::new(|s| {
                    s.networks[0].services = vec![crate::ServiceVip {
                        service_id: "web".into(),
                        name: "web".into(),
                        aliases: Vec::new(),
                        vip: Some(Ipv4Addr::new(10, 9, 0, 100)),
                        backends: vec![Ipv4Addr::new(10, 9, 0, 2); 1025],
                        backends6: Vec::new(),
                    }]
                }),
                "at most 1024",
            ),
            (
                Box::new(|s| {
                    s.tasks = vec![TaskState {
                        task_id: "t".into(),
                        netns: "/run/netns/t".into(),
                        attachments: vec![Attachment {
                            network_id: "n7".into(),
                            address: Ipv4Addr::new(10, 1, 0, 2),
                            ifname: None,
                            address6: None,
                        }],
                        joined: false,
                    }]
                }),
                "not a host address",
            ),
            (Box::new(|s| s.overlay_mtu = 100), "576..=9000"),
        ];
        for (change, want) in cases {
            let mut s = base();
            change(&mut s);
            let err = s.validate().expect_err(want).to_string();
            assert!(err.contains(want), "{err:?} lacks {want:?}");
        }
        let mut s = base();
        s.networks[0].encrypted = true;
        let err = s.validate().expect_err("encrypted");
        assert!(matches!(err, Error::EncryptionUnsupported { .. }));
        assert!(err.to_string().contains("--opt encrypted"), "{err}");
    }
}
