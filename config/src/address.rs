//! Address ranges of pools: parsing MetalLB's `CIDR` and `first-last` notations, and the
//! arithmetic the validator and the allocator share.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// IP family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl Family {
    /// The family of an address.
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    /// Address width in bits.
    pub fn bits(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// The integer value of an address (IPv4 in the low 32 bits).
pub fn ip_to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The address of a family with this integer value. Values wider than the family are truncated.
pub fn u128_to_ip(family: Family, value: u128) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(value as u32)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(value)),
    }
}

/// An inclusive range of addresses of one family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IpRange {
    family: Family,
    first: u128,
    last: u128,
}

/// Why an address entry of a pool is not usable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// Neither a CIDR nor a range.
    #[error(
        "{0:?} is neither a CIDR (198.51.100.0/24) nor a range first-last (198.51.100.10-198.51.100.20)"
    )]
    Syntax(String),
    /// The ends of a range are of different families.
    #[error("{0:?} mixes IPv4 and IPv6")]
    MixedFamilies(String),
    /// The range ends before it starts.
    #[error("{0:?} starts after it ends")]
    Reversed(String),
}

impl IpRange {
    /// A range from two addresses of one family, first ≤ last.
    pub fn new(first: IpAddr, last: IpAddr) -> Option<Self> {
        let family = Family::of(first);
        (family == Family::of(last) && ip_to_u128(first) <= ip_to_u128(last)).then(|| Self {
            family,
            first: ip_to_u128(first),
            last: ip_to_u128(last),
        })
    }

    /// The range a CIDR covers (host bits are ignored, as MetalLB does).
    pub fn from_net(net: IpNet) -> Self {
        let net = net.trunc();
        Self {
            family: Family::of(net.addr()),
            first: ip_to_u128(net.network()),
            last: ip_to_u128(net.broadcast()),
        }
    }

    /// Parses MetalLB's notations: `198.51.100.0/24`, `198.51.100.10-198.51.100.20`, spaces allowed around the dash.
    pub fn parse(text: &str) -> Result<Self, AddressError> {
        let trimmed = text.trim();
        if let Some((first, last)) = trimmed.split_once('-') {
            let first: IpAddr = first
                .trim()
                .parse()
                .map_err(|_| AddressError::Syntax(text.into()))?;
            let last: IpAddr = last
                .trim()
                .parse()
                .map_err(|_| AddressError::Syntax(text.into()))?;
            if Family::of(first) != Family::of(last) {
                return Err(AddressError::MixedFamilies(text.into()));
            }
            return Self::new(first, last).ok_or_else(|| AddressError::Reversed(text.into()));
        }
        let net: IpNet = trimmed
            .parse()
            .map_err(|_| AddressError::Syntax(text.into()))?;
        Ok(Self::from_net(net))
    }

    /// The family of the range.
    pub fn family(&self) -> Family {
        self.family
    }

    /// First address as an integer.
    pub fn first_value(&self) -> u128 {
        self.first
    }

    /// Last address as an integer.
    pub fn last_value(&self) -> u128 {
        self.last
    }

    /// First address.
    pub fn first(&self) -> IpAddr {
        u128_to_ip(self.family, self.first)
    }

    /// Last address.
    pub fn last(&self) -> IpAddr {
        u128_to_ip(self.family, self.last)
    }

    /// Whether the range holds this address.
    pub fn contains(&self, ip: IpAddr) -> bool {
        Family::of(ip) == self.family && (self.first..=self.last).contains(&ip_to_u128(ip))
    }

    /// Whether two ranges share an address.
    pub fn overlaps(&self, other: &IpRange) -> bool {
        self.family == other.family && self.first <= other.last && other.first <= self.last
    }

    /// Number of addresses, saturating at u128::MAX for the whole IPv6 space.
    pub fn size(&self) -> u128 {
        (self.last - self.first).saturating_add(1)
    }

    /// The smallest set of CIDRs covering exactly this range, in address order.
    pub fn cidrs(&self) -> Vec<IpNet> {
        let bits = u32::from(self.family.bits());
        // Offset of the last address of an aligned block of 2^k addresses.
        let span = |k: u32| {
            if k >= 128 {
                u128::MAX
            } else {
                (1u128 << k) - 1
            }
        };
        let mut out = Vec::new();
        let mut start = self.first;
        loop {
            // Largest block aligned at `start` that does not pass `last`.
            let mut k = start.trailing_zeros().min(bits);
            while k > 0 && start.checked_add(span(k)).is_none_or(|end| end > self.last) {
                k -= 1;
            }
            if let Ok(net) = IpNet::new(u128_to_ip(self.family, start), (bits - k) as u8) {
                out.push(net);
            }
            let end = start + span(k);
            if end >= self.last {
                break;
            }
            start = end + 1;
        }
        out
    }
}

impl fmt::Display for IpRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first())
        } else {
            write!(f, "{}-{}", self.first(), self.last())
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn parses_cidrs_and_ranges() {
        let r = IpRange::parse("198.51.100.0/24").expect("cidr");
        assert_eq!(
            (r.first(), r.last(), r.size()),
            (ip("198.51.100.0"), ip("198.51.100.255"), 256)
        );
        let r = IpRange::parse("198.51.100.7/24").expect("host bits ignored");
        assert_eq!(r.first(), ip("198.51.100.0"));
        let r = IpRange::parse(" 198.51.100.10 - 198.51.100.20 ").expect("range");
        assert_eq!(r.size(), 11);
        let r = IpRange::parse("fd00::/64").expect("v6");
        assert_eq!(r.size(), 1 << 64);
        assert_eq!(IpRange::parse("::/0").expect("all").size(), u128::MAX);
    }

    #[test]
    fn rejects_bad_entries() {
        assert!(matches!(
            IpRange::parse("198.51.100.0/33"),
            Err(AddressError::Syntax(_))
        ));
        assert!(matches!(
            IpRange::parse("198.51.100.1"),
            Err(AddressError::Syntax(_))
        ));
        assert!(matches!(
            IpRange::parse("1.2.3.4-fd00::1"),
            Err(AddressError::MixedFamilies(_))
        ));
        assert!(matches!(
            IpRange::parse("1.2.3.9-1.2.3.4"),
            Err(AddressError::Reversed(_))
        ));
    }

    #[test]
    fn cidr_decomposition_is_minimal_and_exact() {
        let r = IpRange::parse("198.51.100.10-198.51.100.20").expect("range");
        let cidrs: Vec<String> = r.cidrs().iter().map(|n| n.to_string()).collect();
        assert_eq!(
            cidrs,
            [
                "198.51.100.10/31",
                "198.51.100.12/30",
                "198.51.100.16/30",
                "198.51.100.20/32"
            ]
        );
        assert_eq!(IpRange::parse("0.0.0.0/0").expect("all").cidrs().len(), 1);
        assert_eq!(
            IpRange::parse("::/0").expect("all").cidrs()[0].to_string(),
            "::/0"
        );
    }

    #[test]
    fn overlap_and_contains() {
        let a = IpRange::parse("198.51.100.0/25").expect("a");
        let b = IpRange::parse("198.51.100.100-198.51.100.200").expect("b");
        let c = IpRange::parse("fd00::/64").expect("c");
        assert!(a.overlaps(&b) && b.overlaps(&a));
        assert!(!a.overlaps(&c));
        assert!(a.contains(ip("198.51.100.127")) && !a.contains(ip("198.51.100.128")));
    }
}
