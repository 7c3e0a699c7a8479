//! Properties of the allocator under random sequences of operations.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use ferrolb_config::address::{Family, IpRange, ip_to_u128, u128_to_ip};
use ferrolb_config::allocator::{
    Allocator, Assignment, Backend, FamilyPolicy, PoolStats, ProtocolPort, ServiceKey,
    ServiceRequest, is_buggy_ip,
};
use ferrolb_config::model::{Pool, PoolAllocation};
use ferrolb_config::selector::Labels;
use proptest::prelude::*;

/// Each pool name owns a block of IPv4 and IPv6 space, so generated pools never overlap. Block
/// "a" crosses 10.0.0.255/10.0.1.0 so that avoidBuggyIPs matters.
const BLOCKS: [(&str, &str, u128, &str, u128); 3] = [
    ("a", "10.0.0.250", 12, "fd00::a:0", 8),
    ("b", "10.0.2.0", 8, "fd00::b:0", 8),
    ("c", "10.0.3.248", 8, "fd00::c:0", 8),
];
const SERVICES: usize = 8;
const NAMESPACES: [&str; 2] = ["ns1", "ns2"];

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A pool as generated: sub-ranges of its block and flags.
#[derive(Clone, Debug)]
struct PoolSpec {
    block: usize,
    v4: Option<(u128, u128)>,
    v6: Option<(u128, u128)>,
    auto_assign: bool,
    avoid_buggy_ips: bool,
    /// (priority, only namespace ns1)
    allocation: Option<(Option<u32>, bool)>,
}

fn sub_range(base: &str, block_len: u128, (start, len): (u128, u128)) -> IpRange {
    let base_ip = ip(base);
    let family = Family::of(base_ip);
    let first = ip_to_u128(base_ip) + start;
    let last = (first + len - 1).min(ip_to_u128(base_ip) + block_len - 1);
    IpRange::new(u128_to_ip(family, first), u128_to_ip(family, last)).unwrap()
}

impl PoolSpec {
    fn build(&self) -> Pool {
        let (name, v4_base, v4_len, v6_base, v6_len) = BLOCKS[self.block];
        let mut ranges = Vec::new();
        if let Some(r) = self.v4 {
            ranges.push(sub_range(v4_base, v4_len, r));
        }
        if let Some(r) = self.v6 {
            ranges.push(sub_range(v6_base, v6_len, r));
        }
        ranges.sort();
        Pool {
            name: name.into(),
            labels: Labels::new(),
            ranges,
            auto_assign: self.auto_assign,
            avoid_buggy_ips: self.avoid_buggy_ips,
            allocation: self.allocation.map(|(priority, only_ns1)| PoolAllocation {
                priority,
                namespaces: if only_ns1 {
                    BTreeSet::from(["ns1".to_string()])
                } else {
                    BTreeSet::new()
                },
                ..Default::default()
            }),
        }
    }
}

/// A Service's request as generated.
#[derive(Clone, Debug)]
struct ReqSpec {
    families: u8,
    requested: Vec<IpAddr>,
    pool: Option<&'static str>,
    key: Option<&'static str>,
    ports: BTreeSet<u16>,
    local: Option<u8>,
}

fn service_key(i: usize) -> ServiceKey {
    ServiceKey::new(NAMESPACES[i % 2], format!("s{i}"))
}

impl ReqSpec {
    fn build(&self, i: usize) -> ServiceRequest {
        let (policy, families): (FamilyPolicy, &[Family]) = match self.families % 6 {
            0 | 1 => (FamilyPolicy::SingleStack, &[Family::V4]),
            2 => (FamilyPolicy::SingleStack, &[Family::V6]),
            3 => (FamilyPolicy::PreferDualStack, &[Family::V4, Family::V6]),
            4 => (FamilyPolicy::PreferDualStack, &[Family::V6, Family::V4]),
            _ => (FamilyPolicy::RequireDualStack, &[Family::V4, Family::V6]),
        };
        let ports: Vec<ProtocolPort> = self.ports.iter().map(|&p| ProtocolPort::tcp(p)).collect();
        let mut r = ServiceRequest::new(NAMESPACES[i % 2], format!("s{i}"))
            .with_families(policy, families)
            .with_requested_ips(&self.requested)
            .with_ports(&ports)
            .with_backend(match self.local {
                None => Backend::Cluster,
                Some(app) => {
                    Backend::Local([("app".to_string(), app.to_string())].into_iter().collect())
                }
            });
        if let Some(pool) = self.pool {
            r = r.with_pool(pool);
        }
        if let Some(key) = self.key {
            r = r.with_sharing_key(key);
        }
        r
    }
}

#[derive(Clone, Debug)]
enum Op {
    Allocate(usize, ReqSpec),
    Release(usize),
    Assign(usize, ReqSpec, Vec<IpAddr>),
    SetPools(Vec<PoolSpec>),
}

fn candidate_ips() -> Vec<IpAddr> {
    let mut out = vec![ip("192.0.2.1"), ip("2001:db8::1")];
    for (_, v4, v4_len, v6, v6_len) in BLOCKS {
        for (base, len) in [(v4, v4_len), (v6, v6_len)] {
            let b = ip(base);
            out.extend((0..len).map(|o| u128_to_ip(Family::of(b), ip_to_u128(b) + o)));
        }
    }
    out
}

/// Addresses likely to be in pools and held: requests and restores pick these most of the time.
fn hot_ips() -> Vec<IpAddr> {
    let mut out = Vec::new();
    for (_, v4, _, v6, _) in BLOCKS {
        for (base, len) in [(v4, 3), (v6, 2)] {
            let b = ip(base);
            out.extend((0..len).map(|o| u128_to_ip(Family::of(b), ip_to_u128(b) + o)));
        }
    }
    out
}

fn some_ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        3 => prop::sample::select(hot_ips()),
        1 => prop::sample::select(candidate_ips()),
    ]
}

fn pool_spec(block: usize) -> impl Strategy<Value = PoolSpec> {
    let sub = |len: u128| (prop_oneof![2 => Just(0), 1 => 0..len], 1..=len);
    let (_, _, v4_len, _, v6_len) = BLOCKS[block];
    (
        prop::option::weighted(0.85, sub(v4_len)),
        prop::option::weighted(0.6, sub(v6_len)),
        prop::bool::weighted(0.8),
        prop::bool::weighted(0.3),
        prop::option::weighted(0.4, (prop::option::of(0u32..3), any::<bool>())),
    )
        .prop_map(
            move |(v4, v6, auto_assign, avoid_buggy_ips, allocation)| PoolSpec {
                block,
                v4,
                v6,
                auto_assign,
                avoid_buggy_ips,
                allocation,
            },
        )
}

fn pools_spec() -> impl Strategy<Value = Vec<PoolSpec>> {
    (
        prop::option::weighted(0.9, pool_spec(0)),
        prop::option::weighted(0.7, pool_spec(1)),
        prop::option::weighted(0.5, pool_spec(2)),
    )
        .prop_map(|(a, b, c)| [a, b, c].into_iter().flatten().collect())
}

fn req_spec() -> impl Strategy<Value = ReqSpec> {
    (
        0u8..6,
        prop::option::weighted(0.25, prop::collection::vec(some_ip(), 1..=2)),
        prop::option::weighted(0.2, prop::sample::select(vec!["a", "b", "c", "zz"])),
        prop::option::weighted(0.7, prop::sample::select(vec!["k1", "k1", "k2", ""])),
        prop::collection::btree_set(prop::sample::select(vec![53u16, 80, 443]), 0..=2),
        prop::option::weighted(0.3, 0u8..2),
    )
        .prop_map(|(families, requested, pool, key, ports, local)| ReqSpec {
            families,
            requested: requested.unwrap_or_default(),
            pool,
            key,
            ports,
            local,
        })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..SERVICES, req_spec()).prop_map(|(i, r)| Op::Allocate(i, r)),
        2 => (0..SERVICES).prop_map(Op::Release),
        1 => (0..SERVICES, req_spec(), prop::collection::vec(some_ip(), 0..=2))
            .prop_map(|(i, r, ips)| Op::Assign(i, r, ips)),
        // Restores that fit the request's families, as a real Service status would.
        2 => (0..SERVICES, req_spec(), some_ip(), some_ip(), 0u8..4).prop_map(|(i, r, x, y, drop)| {
            let wanted = r.build(i);
            let mut ips: Vec<IpAddr> = [x, y]
                .into_iter()
                .filter(|&a| wanted.wants_family(Family::of(a)))
                .collect();
            ips.dedup_by_key(|a| Family::of(*a));
            if drop == 0 && ips.len() > 1 {
                ips.pop();
            }
            let r = if r.requested.is_empty() { r } else { ReqSpec { requested: ips.clone(), ..r } };
            Op::Assign(i, r, ips)
        }),
        1 => pools_spec().prop_map(Op::SetPools),
    ]
}

/// Drives an allocator and remembers the request behind every assignment.
struct Harness {
    allocator: Allocator,
    pools: Vec<Pool>,
    requests: HashMap<ServiceKey, ServiceRequest>,
}

impl Harness {
    fn new(pools: Vec<Pool>) -> Self {
        Self {
            allocator: Allocator::new(pools.clone()),
            pools,
            requests: HashMap::new(),
        }
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match op {
            Op::Allocate(i, spec) => {
                let req = spec.build(*i);
                match self.allocator.allocate(&req) {
                    Ok(a) => {
                        prop_assert_eq!(self.allocator.assignment(&req.key), Some(&a));
                        self.requests.insert(req.key.clone(), req);
                    }
                    Err(_) => {
                        prop_assert_eq!(self.allocator.assignment(&req.key), None);
                        self.requests.remove(&req.key);
                    }
                }
            }
            Op::Release(i) => {
                self.allocator.release(&service_key(*i));
                self.requests.remove(&service_key(*i));
                prop_assert_eq!(self.allocator.assignment(&service_key(*i)), None);
            }
            Op::Assign(i, spec, ips) => {
                let req = spec.build(*i);
                let before = self.allocator.assignment(&req.key).cloned();
                match self.allocator.assign(&req, ips) {
                    Ok(a) => {
                        let got: BTreeSet<IpAddr> = a.ips.iter().copied().collect();
                        prop_assert_eq!(got, ips.iter().copied().collect::<BTreeSet<_>>());
                        self.requests.insert(req.key.clone(), req);
                    }
                    Err(_) => {
                        prop_assert_eq!(self.allocator.assignment(&req.key).cloned(), before);
                    }
                }
            }
            Op::SetPools(specs) => {
                let pools: Vec<Pool> = specs.iter().map(PoolSpec::build).collect();
                let released = self.allocator.set_pools(pools.clone());
                for (key, _) in &released {
                    prop_assert_eq!(self.allocator.assignment(key), None);
                    self.requests.remove(key);
                }
                self.pools = pools;
            }
        }
        Ok(())
    }

    fn sorted_assignments(&self) -> Vec<(ServiceKey, Assignment)> {
        let mut all: Vec<_> = self
            .allocator
            .assignments()
            .map(|(k, a)| (k.clone(), a.clone()))
            .collect();
        all.sort_by(|x, y| x.0.cmp(&y.0));
        all
    }

    fn stats(&self) -> BTreeMap<String, Option<PoolStats>> {
        self.pools
            .iter()
            .map(|p| (p.name.clone(), self.allocator.pool_stats(&p.name)))
            .collect()
    }

    /// Property (a), plus the counters.
    fn check(&self) -> Result<(), TestCaseError> {
        let mut by_ip: BTreeMap<IpAddr, Vec<ServiceKey>> = BTreeMap::new();
        for (key, a) in self.sorted_assignments() {
            let req = &self.requests[&key];
            let pool = self.pools.iter().find(|p| *p.name == *a.pool);
            prop_assert!(pool.is_some(), "{key} holds from missing pool {}", a.pool);
            let pool = pool.unwrap();
            prop_assert!(pool.admits(key.namespace(), &req.namespace_labels, &req.labels));
            prop_assert!(!a.ips.is_empty());
            if a.ips.len() == 2 {
                prop_assert_eq!(
                    Family::of(a.ips[0]),
                    req.primary_family(),
                    "family order: {:?}",
                    a
                );
            }
            let families: BTreeSet<Family> = a.ips.iter().map(|&i| Family::of(i)).collect();
            prop_assert_eq!(
                families.len(),
                a.ips.len(),
                "one address per family: {:?}",
                a
            );
            for &addr in a.ips.iter() {
                prop_assert!(req.wants_family(Family::of(addr)), "{key}: {addr}");
                prop_assert!(pool.contains(addr), "{key}: {addr} outside {}", pool.name);
                prop_assert!(
                    !(pool.avoid_buggy_ips && is_buggy_ip(addr)),
                    "{key}: buggy {addr} in {}",
                    pool.name
                );
                prop_assert!(self.allocator.holders(addr).contains(&key));
                by_ip.entry(addr).or_default().push(key.clone());
            }
            if let Some(requested_pool) = &req.pool {
                prop_assert_eq!(&**requested_pool, &*a.pool);
            }
            if !req.requested_ips.is_empty() {
                let held: BTreeSet<IpAddr> = a.ips.iter().copied().collect();
                prop_assert_eq!(
                    held,
                    req.requested_ips.iter().copied().collect::<BTreeSet<_>>()
                );
            }
            if req.family_policy == FamilyPolicy::RequireDualStack {
                prop_assert_eq!(a.ips.len(), 2);
            }
        }
        for (addr, keys) in &by_ip {
            prop_assert_eq!(self.allocator.holders(*addr).len(), keys.len());
            for (n, x) in keys.iter().enumerate() {
                for y in &keys[n + 1..] {
                    let (rx, ry) = (&self.requests[x], &self.requests[y]);
                    let kx = rx.effective_sharing_key();
                    prop_assert!(
                        kx.is_some() && kx == ry.effective_sharing_key(),
                        "{addr}: {x} and {y} keys"
                    );
                    prop_assert!(
                        rx.ports.iter().all(|p| !ry.ports.contains(p)),
                        "{addr}: {x} and {y} ports"
                    );
                    prop_assert_eq!(
                        &rx.backend,
                        &ry.backend,
                        "{}: {} and {} backends",
                        addr,
                        x,
                        y
                    );
                }
            }
        }
        for pool in &self.pools {
            let count = |family: Family| {
                pool.ranges
                    .iter()
                    .filter(|r| r.family() == family)
                    .flat_map(|r| r.first_value()..=r.last_value())
                    .map(|v| u128_to_ip(family, v))
                    .filter(|&i| !(pool.avoid_buggy_ips && is_buggy_ip(i)))
                    .count() as i64
            };
            let held = |family: Family| {
                by_ip
                    .keys()
                    .filter(|&&i| Family::of(i) == family && pool.contains(i))
                    .count() as i64
            };
            let want = PoolStats {
                total_ipv4: count(Family::V4),
                total_ipv6: count(Family::V6),
                assigned_ipv4: held(Family::V4),
                assigned_ipv6: held(Family::V6),
                available_ipv4: count(Family::V4) - held(Family::V4),
                available_ipv6: count(Family::V6) - held(Family::V6),
            };
            prop_assert_eq!(
                self.allocator.pool_stats(&pool.name),
                Some(want),
                "pool {}",
                pool.name
            );
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// (a) No IP is held by two Services unless they may share it; every held IP is inside its
    /// pool and not skipped as buggy; counters match the assignments.
    #[test]
    fn holdings_stay_valid_after_any_operations(
        initial in pools_spec(),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let mut h = Harness::new(initial.iter().map(PoolSpec::build).collect());
        for op in &ops {
            h.apply(op)?;
            h.check()?;
        }
    }

    /// (c) A fresh allocator rebuilt with `assign` from the current assignments (as after a
    /// restart) holds exactly the same assignments and reports the same counts.
    #[test]
    fn rebuilding_from_assignments_reproduces_them(
        initial in pools_spec(),
        ops in prop::collection::vec(op(), 1..60),
        reverse in any::<bool>(),
    ) {
        let mut h = Harness::new(initial.iter().map(PoolSpec::build).collect());
        for op in &ops {
            h.apply(op)?;
        }
        let mut rebuilt = Allocator::new(h.pools.clone());
        let mut current = h.sorted_assignments();
        if reverse {
            current.reverse();
        }
        for (key, a) in &current {
            let restored = rebuilt.assign(&h.requests[key], &a.ips);
            prop_assert_eq!(restored.as_ref(), Ok(a), "{}", key);
        }
        let again = Harness { allocator: rebuilt, pools: h.pools.clone(), requests: h.requests.clone() };
        prop_assert_eq!(again.sorted_assignments(), h.sorted_assignments());
        prop_assert_eq!(again.stats(), h.stats());
    }

    /// (b) Releasing N Services of a full pool lets exactly N new ones in.
    #[test]
    fn released_space_is_reused(
        size in 1u32..200,
        avoid in any::<bool>(),
        start in 0u32..600,
        release in prop::collection::vec(any::<bool>(), 200),
    ) {
        let first = 0x0a00_0000 + start;
        let range = IpRange::new(u128_to_ip(Family::V4, first.into()), u128_to_ip(Family::V4, (first + size - 1).into())).unwrap();
        let pool = Pool {
            name: "p".into(),
            labels: Labels::new(),
            ranges: vec![range],
            auto_assign: true,
            avoid_buggy_ips: avoid,
            allocation: None,
        };
        let mut a = Allocator::new(vec![pool]);
        let mut n = 0;
        while a.allocate(&ServiceRequest::new("ns", format!("s{n}"))).is_ok() {
            n += 1;
        }
        let total = a.pool_stats("p").unwrap().total_ipv4;
        prop_assert_eq!(n as i64, total);
        let released: Vec<usize> = (0..n).filter(|&i| release[i % release.len()]).collect();
        for &i in &released {
            let key = ServiceKey::new("ns", format!("s{i}"));
            prop_assert!(a.release(&key).is_some());
        }
        prop_assert_eq!(a.pool_stats("p").unwrap().available_ipv4, released.len() as i64);
        for j in 0..released.len() {
            let req = ServiceRequest::new("ns", format!("again{j}"));
            prop_assert!(a.allocate(&req).is_ok());
        }
        prop_assert!(a.allocate(&ServiceRequest::new("ns", "one-more")).is_err());
        prop_assert_eq!(a.free_space_intervals(), 0);
    }
}
