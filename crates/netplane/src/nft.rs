//! Rendering of Shoal's nftables tables (family `ip`, name `shoal`) as `nft -f` scripts. Each script replaces
//! the whole table in one transaction and carries a comment `shoal:<hash of the content>`, which is how the
//! planner tells whether a table is already as wanted without parsing nftables' own listing. Pure functions.
//!
//! - In a task namespace: the VIPs of the task's networks. Connections the task opens to a VIP are DNATed in the
//!   output hook to one backend chosen by `numgen random mod N` (conntrack keeps a connection on its backend);
//!   a VIP with no backend refuses (TCP reset, ICMP unreachable otherwise).
//! - On the node (where each non-internal network has its gateway end `shlg<vni>`, `names`, one per subnet):
//!   networks cannot reach each other through the node (forward hook; a network's own subnets do), and what
//!   leaves a network through the node is masqueraded. Internal networks have no gateway end: they reach
//!   nothing outside their namespace.
//! - On the node, published ports (routing mesh and host mode): a connection to any local address on a
//!   published port, arriving (prerouting) or opened on the node itself (output, loopback included), is
//!   DNATed to one backend, `numgen inc` spreading connections evenly (conntrack keeps each on its backend); what
//!   leaves through the ingress network's gateway end after such a DNAT is SNATed to the node's ingress address,
//!   so a backend on another node answers through this one (so does what the node itself sends there, which
//!   would otherwise leave from the gateway address every node has); one the node opened from loopback and
//!   leaving by another gateway end is masqueraded to its address. The gateway ends route loopback addresses
//!   (`route_localnet`, set after the table: `plan::Op::RouteLocalnet`) for the replies, and the table's
//!   `loopback_guard` drops whatever else arrives on one for 127.0.0.0/8. A published port with no backend is refused
//!   (TCP reset, ICMP unreachable otherwise). Such a DNATed connection passes the isolation rules: a task of
//!   another network may reach the mesh through its own node's address. The rule set is two rules per published port
//!   and at most one map entry per backend (bounded by `MAX_PUBLISHED_PORTS` and `MAX_BACKENDS_PER_SERVICE`).

use std::fmt::Write;
use std::net::Ipv4Addr;

use crate::names;
use crate::state::{NetworkState, NodeNetState, PublishedPort, TaskState};

/// A rendered table: its content tag and the script that installs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Table {
    /// `shoal:<hash>`, the table's comment.
    pub tag: String,
    /// The `nft -f` script replacing the table atomically.
    pub script: String,
}

fn finish(body: String) -> Table {
    let tag = format!("shoal:{:016x}", names::fnv1a64(&[body.as_bytes()]));
    let t = names::NFT_TABLE;
    let script = format!("table ip {t}\ndelete table ip {t}\ntable ip {t} {{\n  comment \"{tag}\"\n{body}}}\n");
    Table { tag, script }
}

/// The task namespace's table, or `None` when none of its networks has a VIP.
pub(crate) fn task_table(state: &NodeNetState, task: &TaskState) -> Option<Table> {
    let vips: Vec<(Ipv4Addr, &[Ipv4Addr])> = task
        .attachments
        .iter()
        .filter_map(|a| state.network(&a.network_id))
        .flat_map(|n| n.services.iter().filter_map(|s| Some((s.vip?, s.backends.as_slice()))))
        .collect();
    if vips.is_empty() {
        return None;
    }
    let mut nat = String::new();
    let mut refuse = String::new();
    for (vip, backends) in &vips {
        let mut backends = backends.to_vec();
        backends.sort();
        backends.dedup();
        match backends.as_slice() {
            [] => {
                let _ = writeln!(refuse, "    ip daddr {vip} meta l4proto tcp reject with tcp reset");
                let _ = writeln!(refuse, "    ip daddr {vip} reject");
            }
            [one] => {
                let _ = writeln!(nat, "    ip daddr {vip} dnat to {one}");
            }
            many => {
                let map: Vec<String> = many.iter().enumerate().map(|(i, b)| format!("{i} : {b}")).collect();
                let _ = writeln!(
                    nat,
                    "    ip daddr {vip} dnat to numgen random mod {} map {{ {} }}",
                    many.len(),
                    map.join(", ")
                );
            }
        }
    }
    let mut body = String::new();
    let _ = writeln!(body, "  chain vip_nat {{\n    type nat hook output priority -100; policy accept;\n{nat}  }}");
    let _ =
        writeln!(body, "  chain vip_refuse {{\n    type filter hook output priority 0; policy accept;\n{refuse}  }}");
    Some(finish(body))
}

/// The node's table, or `None` when the node carries no network.
pub(crate) fn node_table(state: &NodeNetState) -> Option<Table> {
    if state.networks.is_empty() {
        return None;
    }
    let mut networks: Vec<&NetworkState> = state.networks.iter().collect();
    networks.sort_by_key(|n| n.vni);
    let mut fwd = String::new();
    let mut post = String::new();
    // An internal network has no gateway end on the node: nothing of it reaches the node, nothing needs a rule.
    for n in networks.into_iter().filter(|n| !n.internal) {
        // A network of several subnets has a gateway end per subnet: the node routes between them (a task
        // reaches another subnet through its own subnet's gateway), unmasqueraded.
        let ends: Vec<String> = n.subnets().map(|s| format!("\"{}\"", names::gateway(s.vni))).collect();
        let gw = if ends.len() == 1 { ends[0].clone() } else { format!("{{ {} }}", ends.join(", ")) };
        let _ = writeln!(fwd, "    iifname {gw} oifname \"{}*\" oifname != {gw} drop", names::GATEWAY_PREFIX);
        for sub in n.subnets() {
            let net = format!("{}/{}", sub.subnet.network(), sub.subnet.prefix_len);
            let _ = writeln!(post, "    ip saddr {net} oifname != {gw} masquerade");
        }
    }
    if !state.published.is_empty() {
        // A connection to a published port is one the node chose to forward (its DNAT), whichever network it
        // came from: a task on another network reaching the routing mesh through its own node's address.
        fwd.insert_str(0, "    ct status dnat accept\n");
    }
    if let Some(i) = &state.ingress {
        if let Some(n) = state.network(&i.network_id) {
            let br = names::gateway(n.vni);
            // What the node forwards (after a published port's DNAT) and what it sends itself (from the
            // gateway, the subnet route's source, which every node has) leaves from its own address.
            post.insert_str(
                0,
                &format!(
                    "    oifname \"{br}\" ct status dnat snat to {a}\n    oifname \"{br}\" ip saddr {gw} snat to {a}\n",
                    a = i.address,
                    gw = n.gateway
                ),
            );
        }
    }
    // A connection the node opens to a published port on 127.0.0.1 keeps its loopback source through the
    // DNAT; leaving by a gateway end, it takes that end's address (the ingress network's rule above comes
    // first).
    let _ = writeln!(post, "    oifname \"{}*\" ip saddr 127.0.0.0/8 ct status dnat masquerade", names::GATEWAY_PREFIX);
    let mut body = String::new();
    let _ = writeln!(body, "  chain isolate {{\n    type filter hook forward priority -10; policy accept;\n{fwd}  }}");
    // The gateway ends route loopback addresses (`route_localnet`, for the replies of those connections): what
    // arrives on one for 127.0.0.0/8 is dropped unless it belongs to a connection Shoal DNATed, so a task
    // never reaches what listens on the node's loopback (CVE-2020-8558 in kube-proxy).
    let _ = writeln!(
        body,
        "  chain loopback_guard {{\n    type filter hook input priority -10; policy accept;\n    \
         iifname \"{b}*\" ip daddr 127.0.0.0/8 ct status dnat accept\n    \
         iifname \"{b}*\" ip daddr 127.0.0.0/8 drop\n  }}",
        b = names::GATEWAY_PREFIX
    );
    let _ = writeln!(body, "  chain egress {{\n    type nat hook postrouting priority 100; policy accept;\n{post}  }}");
    if !state.published.is_empty() {
        body.push_str(&published_chains(&state.published));
    }
    Some(finish(body))
}

/// The chains of the published ports (see the module doc), in port order.
fn published_chains(published: &[PublishedPort]) -> String {
    let mut ports: Vec<&PublishedPort> = published.iter().collect();
    ports.sort_by_key(|p| (p.protocol, p.port));
    let mut dnat = String::new();
    let mut refuse = String::new();
    for p in ports {
        let mut backends = p.backends.clone();
        backends.sort();
        backends.dedup();
        let (proto, port, target) = (p.protocol, p.port, p.target_port);
        match backends.as_slice() {
            [] => {
                let how = match p.protocol {
                    crate::state::Protocol::Tcp => " with tcp reset",
                    crate::state::Protocol::Udp => "",
                };
                let _ = writeln!(refuse, "    {proto} dport {port} reject{how}");
            }
            [one] => {
                let _ = writeln!(dnat, "    {proto} dport {port} dnat to {one}:{target}");
            }
            many => {
                let map: Vec<String> = many.iter().enumerate().map(|(i, b)| format!("{i} : {b} . {target}")).collect();
                let _ = writeln!(
                    dnat,
                    "    {proto} dport {port} dnat ip to numgen inc mod {} map {{ {} }}",
                    many.len(),
                    map.join(", ")
                );
            }
        }
    }
    // Arriving: any local address (what arrives for loopback is a martian). Opened on the node: loopback too.
    let arriving = "fib daddr type local ip daddr != 127.0.0.0/8 jump published";
    let local = "fib daddr type local jump published";
    format!(
        "  chain published {{\n{dnat}  }}\n\
         \x20 chain publish_in {{\n    type nat hook prerouting priority -100; policy accept;\n    {arriving}\n  }}\n\
         \x20 chain publish_local {{\n    type nat hook output priority -100; policy accept;\n    {local}\n  }}\n\
         \x20 chain publish_refuse {{\n    type filter hook input priority 0; policy accept;\n{refuse}  }}\n"
    )
}
