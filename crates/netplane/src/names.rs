//! The names Shoal gives what it creates on a node, in one place: every host link starts with `shl` (bridges
//! `shlb<vni>`, VXLAN devices `shlx<vni>`, task veths `shlv<hash>`), the nftables table is `ip shoal` on the
//! node and in each task namespace. Interface names stay within the kernel's 15 bytes. Pure functions.

/// Name of the nftables table (family `ip`) Shoal owns, on the node and in each task namespace.
pub const NFT_TABLE: &str = "shoal";
/// Prefix of the bridges.
pub const BRIDGE_PREFIX: &str = "shlb";
/// Prefix of the VXLAN devices.
pub const VXLAN_PREFIX: &str = "shlx";
/// Prefix of the host ends of task veths.
pub const VETH_PREFIX: &str = "shlv";

/// The bridge of the network with VNI `vni`.
pub fn bridge(vni: u32) -> String {
    format!("{BRIDGE_PREFIX}{vni}")
}

/// The VXLAN device of the network with VNI `vni`.
pub fn vxlan(vni: u32) -> String {
    format!("{VXLAN_PREFIX}{vni}")
}

/// The host end of the veth of task `task_id` on network `network_id` (a hash: IDs are longer than 15 bytes).
pub fn veth(task_id: &str, network_id: &str) -> String {
    let h = fnv1a64(&[task_id.as_bytes(), b"/", network_id.as_bytes()]);
    format!("{VETH_PREFIX}{:010x}", h & 0xff_ffff_ffff)
}

/// The interface of attachment `index` inside the task's namespace.
pub fn task_ifname(index: usize) -> String {
    format!("eth{index}")
}

/// Whether a host link name is one Shoal made.
pub fn is_shoal_link(name: &str) -> bool {
    [BRIDGE_PREFIX, VXLAN_PREFIX, VETH_PREFIX].iter().any(|p| name.starts_with(p))
}

/// 64-bit FNV-1a over the concatenation of `parts` (names and nftables content tags; not security relevant).
pub fn fnv1a64(parts: &[&[u8]]) -> u64 {
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
        for n in [bridge(crate::state::MAX_VNI), vxlan(crate::state::MAX_VNI), veth("a".repeat(64).as_str(), "n")] {
            assert!(n.len() <= 15, "{n}");
            assert!(is_shoal_link(&n));
        }
        assert!(!is_shoal_link("eth0"));
        assert_ne!(veth("t1", "n1"), veth("t1", "n2"));
    }
}
