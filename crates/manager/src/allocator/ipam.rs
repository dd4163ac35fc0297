//! IP address management in the manager (SwarmKit's cnmallocator with libnetwork's default IPAM, our own
//! code): one `AddressPool` per network subnet (a network's are its `NetworkPools`, which allocates from the
//! first with room, in config order), a bitmap over the allocation range (the IP range a user gave, else the
//! subnet) with the network address, the broadcast address and the gateway reserved; addresses are
//! handed out next-fit from a cursor, so a freed address is reused only after the rest of the range. And the
//! choice of a new network's subnet: the first `subnet_size` block of the cluster's address pools that
//! overlaps no existing network.
//!
//! Nothing here is the truth: the store is. Pools are rebuilt from the networks, services and tasks of a view
//! (`reserve`) and only then allocate. Pure: no IO, no clock.

use std::net::IpAddr;

use shoal_store::cidr::Cidr;

/// Largest allocation range (addresses) a network may have: its bitmap is then 128 KiB.
pub(crate) const MAX_RANGE_ADDRESSES: u128 = 1 << 20;
/// An IPv6 subnet's (or IP range's) addresses are given from its first `IPV6_RANGE_ADDRESSES` only: a /64 has
/// 2^64, far past what a bitmap can hold and what a cluster's tasks need (an 8 KiB bitmap).
pub(crate) const IPV6_RANGE_ADDRESSES: u128 = 1 << IPV6_RANGE_BITS;
/// See `IPV6_RANGE_ADDRESSES`.
const IPV6_RANGE_BITS: u8 = 16;

/// The cluster's default address pool and subnet size when the cluster object sets none (Docker's).
pub(crate) const DEFAULT_ADDRESS_POOL: &str = "10.0.0.0/8";
/// See `DEFAULT_ADDRESS_POOL`.
pub(crate) const DEFAULT_SUBNET_SIZE: u8 = 24;

/// The addresses of one subnet: which are taken.
#[derive(Clone, Debug)]
pub(crate) struct AddressPool {
    subnet: Cidr,
    range: Cidr,
    bits: Vec<u64>,
    free: u64,
    cursor: u64,
}

impl AddressPool {
    /// A pool over `subnet`, allocating inside `range` (the subnet when `None`), with `gateway` reserved.
    /// `None` when the range is not inside the subnet or larger than `MAX_RANGE_ADDRESSES`.
    /// An IPv6 range allocates from its first `IPV6_RANGE_ADDRESSES` addresses.
    pub(crate) fn new(subnet: Cidr, range: Option<Cidr>, gateway: Option<IpAddr>) -> Option<AddressPool> {
        let mut range = range.unwrap_or(subnet);
        if range.is_v6() && range.size() > IPV6_RANGE_ADDRESSES {
            range = Cidr::new(range.nth(0)?, 128 - IPV6_RANGE_BITS)?;
        }
        if !subnet.contains(&range) || range.size() > MAX_RANGE_ADDRESSES {
            return None;
        }
        let size = u64::try_from(range.size()).expect("checked against MAX_RANGE_ADDRESSES");
        let words = usize::try_from(size.div_ceil(64)).expect("checked against MAX_RANGE_ADDRESSES");
        let mut p = AddressPool { subnet, range, bits: vec![0; words], free: size, cursor: 0 };
        // The network and broadcast addresses are nobody's (IPv4 subnets of more than two addresses).
        if !subnet.is_v6() && subnet.size() > 2 {
            for a in [subnet.nth(0), subnet.nth(subnet.size() - 1)].into_iter().flatten() {
                p.reserve(a);
            }
        }
        // An IPv6 subnet's first address is its subnet-router anycast address, nobody's.
        if let Some(a) = subnet.nth(0).filter(|_| subnet.is_v6()) {
            p.reserve(a);
        }
        if let Some(g) = gateway {
            p.reserve(g);
        }
        Some(p)
    }

    /// Addresses left to allocate.
    #[cfg(test)]
    pub(crate) fn free(&self) -> u64 {
        self.free
    }

    fn index(&self, addr: IpAddr) -> Option<u64> {
        self.range.offset_of(addr).and_then(|o| u64::try_from(o).ok())
    }

    fn taken(&self, i: u64) -> bool {
        self.bits[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    fn set(&mut self, i: u64, on: bool) {
        let w = &mut self.bits[(i / 64) as usize];
        let mask = 1u64 << (i % 64);
        if on && *w & mask == 0 {
            *w |= mask;
            self.free -= 1;
        } else if !on && *w & mask != 0 {
            *w &= !mask;
            self.free += 1;
        }
    }

    /// Marks `addr` taken (idempotent). False when it lies outside the allocation range (a user-given
    /// address elsewhere in the subnet is simply not this pool's to track).
    pub(crate) fn reserve(&mut self, addr: IpAddr) -> bool {
        match self.index(addr) {
            Some(i) => {
                self.set(i, true);
                true
            }
            None => false,
        }
    }

    /// Frees `addr` (idempotent).
    pub(crate) fn release(&mut self, addr: IpAddr) {
        if let Some(i) = self.index(addr) {
            self.set(i, false);
        }
    }

    /// The next free address after the last one given, or `None` when the range is full.
    pub(crate) fn allocate(&mut self) -> Option<IpAddr> {
        if self.free == 0 {
            return None;
        }
        let size = u64::try_from(self.range.size()).expect("bounded by MAX_RANGE_ADDRESSES when the pool was made");
        for step in 0..size {
            let i = (self.cursor + step) % size;
            if !self.taken(i) {
                self.set(i, true);
                self.cursor = (i + 1) % size;
                return self.range.nth(u128::from(i));
            }
        }
        None
    }

    /// `addr` written as the store keeps attachment addresses: with the subnet's prefix length.
    pub(crate) fn with_prefix(&self, addr: IpAddr) -> String {
        format!("{addr}/{}", self.subnet.prefix_len())
    }
}

/// The addresses of one network: one `AddressPool` per IPv4 IPAM config, in config order, and the pool of
/// its IPv6 config when it has one (`--ipv6`). An IPv4 address (a task's, a node's, a VIP) comes from the first
/// pool that has one free: SwarmKit's rule (`allocateNetworkIPs` tries the pools in turn), in a fixed order
/// where SwarmKit's map has none. A task on an IPv6 network gets an IPv6 address too (dual stack, as later
/// engines give); nodes and VIPs stay IPv4.
#[derive(Clone, Debug)]
pub(crate) struct NetworkPools {
    pools: Vec<AddressPool>,
    v6: Option<AddressPool>,
}

impl NetworkPools {
    /// The pools of a network, in config order (an IPv6 one apart); `None` when there is no IPv4 one.
    pub(crate) fn new(all: Vec<AddressPool>) -> Option<NetworkPools> {
        let (v6, pools): (Vec<AddressPool>, Vec<AddressPool>) = all.into_iter().partition(|p| p.subnet.is_v6());
        (!pools.is_empty()).then(|| NetworkPools { pools, v6: v6.into_iter().next() })
    }

    /// Whether the network has an IPv6 subnet.
    pub(crate) fn has_v6(&self) -> bool {
        self.v6.is_some()
    }

    /// The next free IPv6 address, or `None` when the network has none left (or no IPv6 subnet).
    pub(crate) fn allocate6(&mut self) -> Option<IpAddr> {
        self.v6.as_mut()?.allocate()
    }

    /// Addresses left to allocate, in all the pools.
    #[cfg(test)]
    pub(crate) fn free(&self) -> u64 {
        self.pools.iter().map(AddressPool::free).sum()
    }

    /// IPv6 addresses left to allocate; `None` without an IPv6 subnet.
    #[cfg(test)]
    pub(crate) fn free6(&self) -> Option<u64> {
        self.v6.as_ref().map(AddressPool::free)
    }

    /// The pool whose subnet holds `addr` (subnets of one network do not overlap).
    fn pool_of(&mut self, addr: IpAddr) -> Option<&mut AddressPool> {
        self.pools.iter_mut().chain(self.v6.as_mut()).find(|p| p.subnet.offset_of(addr).is_some())
    }

    /// Marks `addr` taken in its subnet's pool (idempotent); false when no pool's range holds it.
    pub(crate) fn reserve(&mut self, addr: IpAddr) -> bool {
        self.pool_of(addr).is_some_and(|p| p.reserve(addr))
    }

    /// Frees `addr` (idempotent).
    pub(crate) fn release(&mut self, addr: IpAddr) {
        if let Some(p) = self.pool_of(addr) {
            p.release(addr);
        }
    }

    /// The next free address of the first pool that has one, or `None` when every pool is full.
    pub(crate) fn allocate(&mut self) -> Option<IpAddr> {
        self.pools.iter_mut().find_map(AddressPool::allocate)
    }

    /// `addr` with the prefix length of the subnet that holds it, as the store keeps attachment addresses.
    pub(crate) fn with_prefix(&self, addr: IpAddr) -> String {
        match self.pools.iter().chain(self.v6.as_ref()).find(|p| p.subnet.offset_of(addr).is_some()) {
            Some(p) => p.with_prefix(addr),
            None => addr.to_string(),
        }
    }
}

/// The address part of an attachment address (`10.0.0.3/24` or a bare address).
pub(crate) fn parse_address(s: &str) -> Option<IpAddr> {
    s.split('/').next()?.parse().ok()
}

/// The first block of `/size` in `pools` (in order) that overlaps none of `taken`; `None` when every block
/// is used. Costs at most blocks x networks overlap tests, bounded by the pool sizes and network count.
pub(crate) fn choose_subnet(pools: &[Cidr], size: u8, taken: &[Cidr]) -> Option<Cidr> {
    for pool in pools {
        let mut index: u128 = 0;
        while let Some(candidate) = pool.subnet(size, index) {
            match taken.iter().filter(|t| t.overlaps(&candidate)).max_by_key(|t| t.size()) {
                None => return Some(candidate),
                // Skip past the biggest network in the way (the blocks inside it are all taken).
                Some(t) if t.size() > candidate.size() => match t.nth(0).and_then(|a| pool.offset_of(a)) {
                    Some(start) => index = (start + t.size()) / candidate.size(),
                    // It covers the whole pool.
                    None => break,
                },
                Some(_) => index += 1,
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Cidr {
        s.parse().unwrap()
    }
    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_29_has_five_addresses_beside_network_broadcast_and_gateway() {
        let mut p = AddressPool::new(c("10.0.9.0/29"), None, Some(ip("10.0.9.1"))).unwrap();
        let got: Vec<_> = std::iter::from_fn(|| p.allocate()).collect();
        assert_eq!(got, ["10.0.9.2", "10.0.9.3", "10.0.9.4", "10.0.9.5", "10.0.9.6"].map(ip));
        assert_eq!(p.free(), 0);
        // Next-fit: a freed address comes back only once the cursor passes it again.
        p.release(ip("10.0.9.3"));
        assert_eq!(p.allocate(), Some(ip("10.0.9.3")));
        assert_eq!(p.allocate(), None);
        assert_eq!(p.with_prefix(ip("10.0.9.3")), "10.0.9.3/29");
    }

    #[test]
    fn a_range_limits_allocation_and_reserve_is_idempotent() {
        let mut p = AddressPool::new(c("10.1.0.0/16"), Some(c("10.1.4.0/30")), Some(ip("10.1.0.1"))).unwrap();
        assert!(p.reserve(ip("10.1.4.1")));
        assert!(p.reserve(ip("10.1.4.1")));
        assert!(!p.reserve(ip("10.1.0.9")));
        let got: Vec<_> = std::iter::from_fn(|| p.allocate()).collect();
        assert_eq!(got, ["10.1.4.0", "10.1.4.2", "10.1.4.3"].map(ip));
        assert!(AddressPool::new(c("10.1.0.0/16"), Some(c("10.2.0.0/24")), None).is_none());
        assert!(AddressPool::new(c("10.0.0.0/8"), None, None).is_none(), "2^24 addresses is past the bound");
    }

    #[test]
    fn a_network_of_several_subnets_allocates_from_the_first_pool_with_room_in_config_order() {
        let first = AddressPool::new(c("10.5.0.0/24"), Some(c("10.5.0.8/30")), Some(ip("10.5.0.1"))).unwrap();
        let second = AddressPool::new(c("10.6.0.0/24"), None, Some(ip("10.6.0.1"))).unwrap();
        let mut p = NetworkPools::new(vec![first, second]).unwrap();
        assert_eq!(p.free(), 4 + 253);
        let got: Vec<_> = (0..6).map(|_| p.allocate().unwrap()).collect();
        assert_eq!(got, ["10.5.0.8", "10.5.0.9", "10.5.0.10", "10.5.0.11", "10.6.0.2", "10.6.0.3"].map(ip));
        assert_eq!(p.with_prefix(ip("10.5.0.9")), "10.5.0.9/24");
        assert_eq!(p.with_prefix(ip("10.6.0.3")), "10.6.0.3/24");
        // A freed address of the first subnet is the next one given: the first pool with room wins.
        p.release(ip("10.5.0.10"));
        assert_eq!(p.allocate(), Some(ip("10.5.0.10")));
        assert_eq!(p.allocate(), Some(ip("10.6.0.4")));
        // Reserving finds the pool by subnet; an address of neither is no pool's.
        assert!(p.reserve(ip("10.6.0.9")));
        assert!(!p.reserve(ip("10.7.0.9")));
        assert!(!p.reserve(ip("10.5.0.40")), "inside the first subnet, outside its range");
        assert_eq!(p.free(), 253 - 4);
        assert!(NetworkPools::new(Vec::new()).is_none());
    }

    #[test]
    fn an_ipv6_pool_gives_from_its_first_addresses_past_the_anycast_and_gateway_and_apart_from_ipv4() {
        let v6 = AddressPool::new(c("fd00:1::/64"), None, Some(ip("fd00:1::1"))).unwrap();
        assert_eq!(
            v6.free(),
            u64::try_from(IPV6_RANGE_ADDRESSES - 2).unwrap(),
            "the first 2^16, less ::0 and the gateway"
        );
        let v4 = AddressPool::new(c("10.7.0.0/24"), None, Some(ip("10.7.0.1"))).unwrap();
        let mut p = NetworkPools::new(vec![v6, v4]).unwrap();
        assert!(p.has_v6());
        assert_eq!(p.allocate(), Some(ip("10.7.0.2")), "IPv4 addresses come from the IPv4 pool only");
        assert_eq!(p.allocate6(), Some(ip("fd00:1::2")));
        assert_eq!(p.with_prefix(ip("fd00:1::2")), "fd00:1::2/64");
        p.release(ip("fd00:1::2"));
        assert!(p.reserve(ip("fd00:1::3")));
        assert!(!p.reserve(ip("fd00:1::1:0:0")), "past the first 2^16 addresses: no pool's");
        assert_eq!(p.allocate6(), Some(ip("fd00:1::4")), "next-fit past the reserved one");
        // A small IP range runs out; an IPv6-only pool list has no IPv4 pool and is no network's.
        let tiny = AddressPool::new(c("fd00:2::/64"), Some(c("fd00:2::10/126")), None).unwrap();
        let mut t = NetworkPools::new(vec![AddressPool::new(c("10.8.0.0/24"), None, None).unwrap(), tiny]).unwrap();
        assert_eq!((0..5).map(|_| t.allocate6()).filter(Option::is_some).count(), 4);
        assert!(NetworkPools::new(vec![AddressPool::new(c("fd00:3::/64"), None, None).unwrap()]).is_none());
        assert!(!NetworkPools::new(vec![AddressPool::new(c("10.9.0.0/24"), None, None).unwrap()]).unwrap().has_v6());
    }

    #[test]
    fn subnets_are_chosen_past_the_ones_in_use() {
        let pools = [c("10.0.0.0/8")];
        assert_eq!(choose_subnet(&pools, 24, &[]), Some(c("10.0.0.0/24")));
        assert_eq!(choose_subnet(&pools, 24, &[c("10.0.0.0/24"), c("10.0.2.0/24")]), Some(c("10.0.1.0/24")));
        assert_eq!(choose_subnet(&pools, 24, &[c("10.0.0.0/16")]), Some(c("10.1.0.0/24")));
        assert_eq!(choose_subnet(&pools, 24, &[c("10.0.0.128/25"), c("10.0.1.0/24")]), Some(c("10.0.2.0/24")));
        assert_eq!(choose_subnet(&[c("10.0.0.0/23")], 24, &[c("10.0.0.0/24"), c("10.0.1.0/24")]), None);
        assert_eq!(
            choose_subnet(&[c("10.0.0.0/23"), c("192.168.0.0/24")], 24, &[c("10.0.0.0/23")]),
            Some(c("192.168.0.0/24"))
        );
    }
}
