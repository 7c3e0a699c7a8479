//! One pool as the allocator sees it: its free space per family and its counters.

use std::net::IpAddr;
use std::sync::Arc;

use crate::address::{Family, IpRange, ip_to_u128, u128_to_ip};
use crate::model::Pool;

use super::intervals::IntervalSet;

/// Address counts of a pool, for the IPAddressPool status and the
/// `metallb_allocator_addresses_*` metrics. Saturate at `i64::MAX` (an IPv6 /64 holds 2^64).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PoolStats {
    /// IPv4 addresses the pool can hand out (without .0/.255 when avoidBuggyIPs).
    pub total_ipv4: i64,
    /// IPv6 addresses the pool can hand out.
    pub total_ipv6: i64,
    /// IPv4 addresses held by at least one Service (a shared IP counts once).
    pub assigned_ipv4: i64,
    /// IPv6 addresses held by at least one Service (a shared IP counts once).
    pub assigned_ipv6: i64,
    /// IPv4 addresses still free: `total_ipv4 - assigned_ipv4`.
    pub available_ipv4: i64,
    /// IPv6 addresses still free: `total_ipv6 - assigned_ipv6`.
    pub available_ipv6: i64,
}

/// Whether an address is an IPv4 address ending in .0 or .255 (skipped with avoidBuggyIPs).
pub fn is_buggy_ip(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => matches!(v4.octets()[3], 0 | 255),
        IpAddr::V6(_) => false,
    }
}

fn is_buggy_value(value: u128) -> bool {
    matches!(value & 0xff, 0 | 0xff)
}

/// Number of IPv4 values in `0..=n` ending in .0 or .255.
fn buggy_up_to(n: u128) -> u128 {
    n / 256 + 1 + (n + 1) / 256
}

/// Number of IPv4 values in a range ending in .0 or .255.
fn buggy_in(range: &IpRange) -> u128 {
    let (first, last) = (range.first_value(), range.last_value());
    buggy_up_to(last) - first.checked_sub(1).map_or(0, buggy_up_to)
}

pub(crate) fn family_index(family: Family) -> usize {
    match family {
        Family::V4 => 0,
        Family::V6 => 1,
    }
}

/// A pool with its free space.
///
/// Free space is one [`IntervalSet`] per family. With avoidBuggyIPs, .0/.255 addresses are not
/// carved out up front (a /8 would need 131,072 holes): the allocator drops them from the free
/// set the first time they reach its lowest end, so each is skipped at most once.
#[derive(Clone, Debug)]
pub(crate) struct PoolState {
    pub(crate) pool: Pool,
    pub(crate) name: Arc<str>,
    free: [IntervalSet; 2],
    /// Addresses the pool can hand out, per family.
    total: [u128; 2],
    /// Addresses held by at least one Service, per family.
    assigned: [u128; 2],
}

impl PoolState {
    /// A pool with every address free. Costs one interval per range.
    pub(crate) fn new(pool: Pool) -> Self {
        let mut free = [IntervalSet::new(), IntervalSet::new()];
        let mut total = [0u128; 2];
        for range in &pool.ranges {
            let i = family_index(range.family());
            let mut size = range.size();
            if pool.avoid_buggy_ips && range.family() == Family::V4 {
                size -= buggy_in(range);
            }
            // A range of skipped addresses only (a .255/32, a .255-.0 pair) holds nothing: not
            // in the free index, which `lowest_free` prunes only while the pool has room.
            if size > 0 {
                free[i].insert_range(range.first_value(), range.last_value());
            }
            total[i] = total[i].saturating_add(size);
        }
        Self {
            name: Arc::from(pool.name.as_str()),
            pool,
            free,
            total,
            assigned: [0; 2],
        }
    }

    /// Whether the pool has addresses of this family.
    pub(crate) fn has_family(&self, family: Family) -> bool {
        self.total[family_index(family)] > 0
    }

    /// Whether the pool may hand out this address (in a range, and not skipped as buggy).
    pub(crate) fn may_hold(&self, ip: IpAddr) -> bool {
        self.pool.contains(ip) && !(self.pool.avoid_buggy_ips && is_buggy_ip(ip))
    }

    /// The lowest free address of a family, without taking it.
    pub(crate) fn lowest_free(&mut self, family: Family) -> Option<IpAddr> {
        let avoid = self.pool.avoid_buggy_ips && family == Family::V4;
        let free = &mut self.free[family_index(family)];
        loop {
            let (first, last) = free.first()?;
            if !avoid {
                return Some(u128_to_ip(family, first));
            }
            let usable = match first & 0xff {
                0 => first + 1,
                0xff => first + 2,
                _ => first,
            };
            if usable <= last {
                if usable > first {
                    free.remove_range(first, usable - 1);
                }
                return Some(u128_to_ip(family, usable));
            }
            free.remove_range(first, last);
        }
    }

    /// Takes a free address (its first holder arrives). Returns false if it was not free.
    pub(crate) fn claim(&mut self, ip: IpAddr) -> bool {
        let i = family_index(Family::of(ip));
        let taken = self.free[i].remove(ip_to_u128(ip));
        if taken {
            self.assigned[i] += 1;
        }
        taken
    }

    /// Gives an address back (its last holder left).
    pub(crate) fn unclaim(&mut self, ip: IpAddr) {
        let i = family_index(Family::of(ip));
        let value = ip_to_u128(ip);
        debug_assert!(
            !(self.pool.avoid_buggy_ips && Family::of(ip) == Family::V4 && is_buggy_value(value))
        );
        if self.free[i].insert(value) {
            self.assigned[i] = self.assigned[i].saturating_sub(1);
        }
    }

    /// Number of intervals of free space (memory cost).
    pub(crate) fn free_intervals(&self) -> usize {
        self.free.iter().map(IntervalSet::interval_count).sum()
    }

    pub(crate) fn stats(&self) -> PoolStats {
        let clamp = |v: u128| i64::try_from(v).unwrap_or(i64::MAX);
        let available = |i: usize| self.total[i].saturating_sub(self.assigned[i]);
        PoolStats {
            total_ipv4: clamp(self.total[0]),
            total_ipv6: clamp(self.total[1]),
            assigned_ipv4: clamp(self.assigned[0]),
            assigned_ipv6: clamp(self.assigned[1]),
            available_ipv4: clamp(available(0)),
            available_ipv6: clamp(available(1)),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn a_range_of_skipped_addresses_only_keeps_no_free_space() {
        // Found by allocator_props::released_space_is_reused: 10.0.0.255/32 with avoidBuggyIPs.
        let range =
            |a: &str, b: &str| IpRange::new(a.parse().unwrap(), b.parse().unwrap()).unwrap();
        let pool = Pool {
            name: "p".into(),
            labels: Default::default(),
            ranges: vec![
                range("10.0.0.255", "10.0.0.255"),
                range("10.0.1.255", "10.0.2.0"),
            ],
            auto_assign: true,
            avoid_buggy_ips: true,
            allocation: None,
        };
        let state = PoolState::new(pool);
        assert_eq!(state.free_intervals(), 0);
        assert_eq!(state.stats().total_ipv4, 0);
    }

    #[test]
    fn buggy_count_matches_a_scan() {
        for (first, last) in [
            (0u128, 0u128),
            (0, 255),
            (1, 254),
            (255, 256),
            (250, 1030),
            (256, 511),
        ] {
            let scan = (first..=last).filter(|v| is_buggy_value(*v)).count() as u128;
            let range = IpRange::new(u128_to_ip(Family::V4, first), u128_to_ip(Family::V4, last))
                .expect("range");
            assert_eq!(buggy_in(&range), scan, "{first}-{last}");
        }
    }
}
