//! IP prefixes (`10.0.0.0/24`, `fd00::/64`) as the store and the manager's address management read them from
//! network objects: parsing (host bits must be zero), containment and overlap. Both families are held as a
//! 128-bit number with a family tag, so the arithmetic is one code path.
//!
//! Pure: no IO, no allocation beyond `Display`.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// An IP prefix: a network address whose bits past `prefix_len` are zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cidr {
    v6: bool,
    bits: u128,
    prefix_len: u8,
}

/// Why a prefix did not parse; the message says what a valid one looks like.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid subnet {input:?}: {why}")]
pub struct CidrError {
    input: String,
    why: String,
}

impl Cidr {
    /// The prefix of `addr` with `prefix_len` bits (host bits cleared).
    pub fn new(addr: IpAddr, prefix_len: u8) -> Option<Cidr> {
        let (v6, bits, width) = split(addr);
        if prefix_len > width {
            return None;
        }
        Some(Cidr { v6, bits: bits & mask(width, prefix_len), prefix_len })
    }

    /// True for an IPv6 prefix.
    pub fn is_v6(&self) -> bool {
        self.v6
    }

    /// Bits of the address: 32 or 128.
    pub fn width(&self) -> u8 {
        if self.v6 {
            128
        } else {
            32
        }
    }

    /// The prefix length.
    pub fn prefix_len(&self) -> u8 {
        self.prefix_len
    }

    /// Number of addresses in the prefix, saturating at `u128::MAX`.
    pub fn size(&self) -> u128 {
        let host = u32::from(self.width() - self.prefix_len);
        1u128.checked_shl(host).unwrap_or(u128::MAX)
    }

    /// The address `offset` addresses into the prefix, if inside it.
    pub fn nth(&self, offset: u128) -> Option<IpAddr> {
        (offset < self.size()).then(|| join(self.v6, self.bits + offset))
    }

    /// Where `addr` lies in the prefix, if inside it.
    pub fn offset_of(&self, addr: IpAddr) -> Option<u128> {
        let (v6, bits, width) = split(addr);
        (v6 == self.v6 && bits & mask(width, self.prefix_len) == self.bits).then(|| bits - self.bits)
    }

    /// True when `other` lies entirely inside this prefix.
    pub fn contains(&self, other: &Cidr) -> bool {
        self.v6 == other.v6
            && other.prefix_len >= self.prefix_len
            && other.bits & mask(self.width(), self.prefix_len) == self.bits
    }

    /// True when the two prefixes share an address.
    pub fn overlaps(&self, other: &Cidr) -> bool {
        self.contains(other) || other.contains(self)
    }

    /// The `index`th sub-prefix of length `len` inside this one, if there is one.
    pub fn subnet(&self, len: u8, index: u128) -> Option<Cidr> {
        if len < self.prefix_len || len > self.width() {
            return None;
        }
        let count = 1u128.checked_shl(u32::from(len - self.prefix_len)).unwrap_or(u128::MAX);
        if index >= count {
            return None;
        }
        let step = 1u128.checked_shl(u32::from(self.width() - len)).unwrap_or(0);
        Some(Cidr { v6: self.v6, bits: self.bits + index * step, prefix_len: len })
    }
}

fn split(addr: IpAddr) -> (bool, u128, u8) {
    match addr {
        IpAddr::V4(a) => (false, u128::from(u32::from(a)), 32),
        IpAddr::V6(a) => (true, u128::from(a), 128),
    }
}

fn join(v6: bool, bits: u128) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::from(bits))
    } else {
        IpAddr::V4(Ipv4Addr::from(u32::try_from(bits).expect("an IPv4 prefix and its offsets stay within 32 bits")))
    }
}

/// The network mask of `prefix_len` bits in an address of `width` bits.
fn mask(width: u8, prefix_len: u8) -> u128 {
    let all = if width == 128 { u128::MAX } else { (1u128 << width) - 1 };
    let host = u32::from(width - prefix_len);
    all & !(1u128.checked_shl(host).map_or(u128::MAX, |h| h - 1))
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Cidr, CidrError> {
        let err = |why: String| CidrError { input: s.to_string(), why };
        let (addr, len) =
            s.split_once('/').ok_or_else(|| err("write it as ADDRESS/PREFIX, e.g. 10.1.0.0/24".into()))?;
        let addr: IpAddr = addr.parse().map_err(|_| err(format!("{addr:?} is not an IP address")))?;
        let (_, bits, width) = split(addr);
        let len: u8 = len
            .parse()
            .ok()
            .filter(|l| *l <= width)
            .ok_or_else(|| err(format!("the prefix length must be a number from 0 to {width}")))?;
        let c = Cidr::new(addr, len).expect("length checked");
        if c.bits != bits {
            return Err(err(format!("host bits are set; the network address is {c}")));
        }
        Ok(c)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", join(self.v6, self.bits), self.prefix_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    #[test]
    fn parses_checks_and_prints() {
        assert_eq!(c("10.0.0.0/24").to_string(), "10.0.0.0/24");
        assert_eq!(c("fd00::/64").to_string(), "fd00::/64");
        for (bad, why) in [
            ("10.0.0.1/24", "the network address is 10.0.0.0/24"),
            ("10.0.0.0", "ADDRESS/PREFIX"),
            ("10.0.0.0/33", "from 0 to 32"),
            ("ten/8", "not an IP address"),
        ] {
            let e = bad.parse::<Cidr>().unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn overlap_containment_and_carving() {
        assert!(c("10.0.0.0/8").overlaps(&c("10.3.0.0/24")));
        assert!(c("10.3.0.0/24").overlaps(&c("10.0.0.0/8")));
        assert!(!c("10.0.0.0/24").overlaps(&c("10.0.1.0/24")));
        assert!(!c("10.0.0.0/8").overlaps(&c("fd00::/8")));
        let pool = c("10.0.0.0/8");
        assert_eq!(pool.subnet(24, 0), Some(c("10.0.0.0/24")));
        assert_eq!(pool.subnet(24, 257), Some(c("10.1.1.0/24")));
        assert_eq!(pool.subnet(24, 1 << 16), None);
        assert_eq!(c("10.0.0.0/29").size(), 8);
        assert_eq!(c("10.0.0.0/29").nth(7), Some("10.0.0.7".parse().unwrap()));
        assert_eq!(c("10.0.0.0/29").nth(8), None);
        assert_eq!(c("10.0.0.0/29").offset_of("10.0.0.5".parse().unwrap()), Some(5));
        assert_eq!(c("10.0.0.0/29").offset_of("10.0.0.9".parse().unwrap()), None);
        assert_eq!(c("0.0.0.0/0").size(), 1 << 32);
        assert_eq!(c("::/0").size(), u128::MAX);
    }
}
