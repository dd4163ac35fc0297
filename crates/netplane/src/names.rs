//! The names Shoal gives what it creates on a node, in one place. Each network has a namespace of its own,
//! `shl-net-<node key>-<vni>` under /run/netns (the node key is the inode of the node's network namespace, so
//! the daemons of several node namespaces on one machine never share a name), holding its bridge `shlb<vni>`,
//! its VXLAN device `shlx<vni>`, the network end `shlu<vni>` of its gateway veth and the bridge ends
//! `shlv<hash>` of its tasks' veths; in the node's namespace, the gateway end `shlg<vni>`. A network of
//! several subnets has a bridge, VXLAN device and gateway veth per subnet, each named by that subnet's VNI
//! (unique in the cluster, so no two subnets share a name), in the namespace named by its first VNI. Every link starts
//! with `shl`; the nftables table is `ip shoal` on the node and in each task namespace; the node's iptables
//! FORWARD rules carry the comment `shoal-netplane`. Interface names stay within the kernel's 15 bytes. Pure
//! functions.

/// Name of the nftables table (family `ip`) Shoal owns, on the node and in each task namespace.
pub(crate) const NFT_TABLE: &str = "shoal";
/// Prefix of the bridges.
pub(crate) const BRIDGE_PREFIX: &str = "shlb";
/// Prefix of the VXLAN devices.
pub(crate) const VXLAN_PREFIX: &str = "shlx";
/// Prefix of the bridge ends of task veths (in the network's namespace).
pub(crate) const VETH_PREFIX: &str = "shlv";
/// Prefix of the node ends of the networks' gateway veths (in the node's namespace).
pub(crate) const GATEWAY_PREFIX: &str = "shlg";
/// Prefix of the network ends of the gateway veths (in the network's namespace, on the bridge).
pub(crate) const UPLINK_PREFIX: &str = "shlu";
/// Prefix of the networks' namespaces (`ip netns` names).
pub(crate) const NETWORK_NETNS_PREFIX: &str = "shl-net-";
/// Comment of the iptables FORWARD rules Shoal owns on the node.
pub(crate) const IPTABLES_COMMENT: &str = "shoal-netplane";

/// The namespace of the network with VNI `vni` on the node whose network namespace has inode `node_key`.
pub fn network_netns(node_key: u64, vni: u32) -> String {
    format!("{NETWORK_NETNS_PREFIX}{node_key}-{vni}")
}

/// The VNI of a network namespace name of node `node_key`, if it is one.
pub fn network_netns_vni(node_key: u64, name: &str) -> Option<u32> {
    name.strip_prefix(&format!("{NETWORK_NETNS_PREFIX}{node_key}-"))?.parse().ok()
}

/// The node end of the gateway veth of the network with VNI `vni`: it carries the gateway address.
pub(crate) fn gateway(vni: u32) -> String {
    format!("{GATEWAY_PREFIX}{vni}")
}

/// The network end of that veth, a port of the network's bridge.
pub(crate) fn uplink(vni: u32) -> String {
    format!("{UPLINK_PREFIX}{vni}")
}

/// The bridge of the network with VNI `vni`.
pub(crate) fn bridge(vni: u32) -> String {
    format!("{BRIDGE_PREFIX}{vni}")
}

/// The VXLAN device of the network with VNI `vni`.
pub(crate) fn vxlan(vni: u32) -> String {
    format!("{VXLAN_PREFIX}{vni}")
}

/// The host end of the veth of task `task_id` on network `network_id` (a hash: IDs are longer than 15 bytes).
pub(crate) fn veth(task_id: &str, network_id: &str) -> String {
    let h = fnv1a64(&[task_id.as_bytes(), b"/", network_id.as_bytes()]);
    format!("{VETH_PREFIX}{:010x}", h & 0xff_ffff_ffff)
}

/// The interface of attachment `index` inside the task's namespace.
pub(crate) fn task_ifname(index: usize) -> String {
    format!("eth{index}")
}

/// The interface a new attachment gets in a joined namespace (a container's own): the lowest `eth<N>` not
/// in `taken`, as Docker names the interface of a network connected to a running container.
pub(crate) fn free_task_ifname(taken: &std::collections::BTreeSet<String>) -> String {
    (0..=taken.len()).map(task_ifname).find(|n| !taken.contains(n)).expect("one of len + 1 names is free")
}

/// Whether a host link name is one Shoal made.
pub(crate) fn is_shoal_link(name: &str) -> bool {
    [BRIDGE_PREFIX, VXLAN_PREFIX, VETH_PREFIX, GATEWAY_PREFIX, UPLINK_PREFIX].iter().any(|p| name.starts_with(p))
}

/// 64-bit FNV-1a over the concatenation of `parts` (names and nftables content tags; not security relevant).
pub(crate) fn fnv1a64(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in *p {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_the_kernel_limit_and_are_recognised() {
        for n in [
            bridge(crate::state::MAX_VNI),
            vxlan(crate::state::MAX_VNI),
            veth("a".repeat(64).as_str(), "n"),
            gateway(crate::state::MAX_VNI),
            uplink(crate::state::MAX_VNI),
        ] {
            assert!(n.len() <= 15, "{n}");
            assert!(is_shoal_link(&n));
        }
        assert!(!is_shoal_link("eth0"));
        let taken = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<std::collections::BTreeSet<_>>();
        assert_eq!(free_task_ifname(&taken(&[])), "eth0");
        assert_eq!(free_task_ifname(&taken(&["eth0"])), "eth1");
        assert_eq!(free_task_ifname(&taken(&["eth0", "eth2", "tunl0"])), "eth1");
        assert_ne!(veth("t1", "n1"), veth("t1", "n2"));
        assert_eq!(network_netns_vni(4026532000, &network_netns(4026532000, 42)), Some(42));
        assert_eq!(network_netns_vni(4026532001, &network_netns(4026532000, 42)), None);
    }
}
