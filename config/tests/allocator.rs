//! The allocator's rules, one test per sentence of the spec (docs: spec "Allocation").
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::net::IpAddr;

use ferrolb_config::address::Family;
use ferrolb_config::allocator::{
    AllocationError, Allocator, Assignment, Backend, FamilyPolicy, PoolStats, ProtocolPort,
    ServiceKey, ServiceRequest, ShareConflict,
};
use ferrolb_config::model::{Pool, PoolAllocation};
use ferrolb_config::selector::{Labels, Selector};
use ferrolb_testkit::model::pool;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn ips(list: &[&str]) -> Vec<IpAddr> {
    list.iter().map(|s| ip(s)).collect()
}

fn manual(mut p: Pool) -> Pool {
    p.auto_assign = false;
    p
}

fn avoiding(mut p: Pool) -> Pool {
    p.avoid_buggy_ips = true;
    p
}

fn restricted(mut p: Pool, allocation: PoolAllocation) -> Pool {
    p.allocation = Some(allocation);
    p
}

fn with_priority(p: Pool, priority: Option<u32>) -> Pool {
    restricted(
        p,
        PoolAllocation {
            priority,
            ..Default::default()
        },
    )
}

fn only_namespace(p: Pool, namespace: &str) -> Pool {
    restricted(
        p,
        PoolAllocation {
            namespaces: BTreeSet::from([namespace.to_string()]),
            ..Default::default()
        },
    )
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn svc(name: &str) -> ServiceRequest {
    ServiceRequest::new("default", name)
}

fn key(name: &str) -> ServiceKey {
    ServiceKey::new("default", name)
}

fn dual(req: ServiceRequest, policy: FamilyPolicy) -> ServiceRequest {
    req.with_families(policy, &[Family::V4, Family::V6])
}

fn shared(name: &str, sharing_key: &str, ports: &[u16]) -> ServiceRequest {
    let ports: Vec<ProtocolPort> = ports.iter().map(|&p| ProtocolPort::tcp(p)).collect();
    svc(name).with_sharing_key(sharing_key).with_ports(&ports)
}

fn got(a: &mut Allocator, req: &ServiceRequest) -> (String, Vec<IpAddr>) {
    let Assignment { pool, ips } = a.allocate(req).unwrap();
    (pool.to_string(), ips.to_vec())
}

fn assignment(pool: &str, list: &[&str]) -> Assignment {
    Assignment {
        pool: pool.into(),
        ips: ips(list).into(),
    }
}

// ---- Choosing an address -------------------------------------------------------------------

#[test]
fn lowest_free_address_is_taken_first_and_reused_after_release() {
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.0/30"])]);
    for (name, want) in [("a", "10.0.0.0"), ("b", "10.0.0.1"), ("c", "10.0.0.2")] {
        assert_eq!(got(&mut a, &svc(name)), ("p".into(), ips(&[want])));
    }
    assert_eq!(a.release(&key("b")), Some(assignment("p", &["10.0.0.1"])));
    assert_eq!(got(&mut a, &svc("d")).1, ips(&["10.0.0.1"]));
    assert_eq!(got(&mut a, &svc("e")).1, ips(&["10.0.0.3"]));
}

#[test]
fn requested_ip_is_honoured_even_in_a_pool_without_auto_assign() {
    let mut a = Allocator::new(vec![manual(pool("manual", &["10.0.0.0/24"]))]);
    let req = svc("a").with_requested_ips(&ips(&["10.0.0.42"]));
    assert_eq!(got(&mut a, &req), ("manual".into(), ips(&["10.0.0.42"])));
}

#[test]
fn requested_ip_outside_every_pool_is_refused() {
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.0/24"])]);
    let req = svc("a").with_requested_ips(&ips(&["192.0.2.1"]));
    assert_eq!(
        a.allocate(&req),
        Err(AllocationError::IpNotInAnyPool {
            ip: ip("192.0.2.1")
        })
    );
    assert_eq!(a.assignment(&key("a")), None);
}

#[test]
fn requested_ip_outside_annotated_pool_is_refused() {
    let mut a = Allocator::new(vec![
        pool("a", &["10.0.0.0/24"]),
        pool("b", &["10.0.1.0/24"]),
    ]);
    let req = svc("s")
        .with_pool("b")
        .with_requested_ips(&ips(&["10.0.0.5"]));
    assert_eq!(
        a.allocate(&req),
        Err(AllocationError::IpNotInAnnotatedPool {
            ip: ip("10.0.0.5"),
            pool: "b".into()
        })
    );
    let req = req.with_requested_ips(&ips(&["10.0.1.5"]));
    assert_eq!(got(&mut a, &req), ("b".into(), ips(&["10.0.1.5"])));
}

#[test]
fn requested_ip_in_a_pool_that_does_not_admit_the_service_is_refused() {
    let mut a = Allocator::new(vec![only_namespace(pool("team", &["10.0.0.0/24"]), "team")]);
    let req = svc("s").with_requested_ips(&ips(&["10.0.0.5"]));
    assert_eq!(
        a.allocate(&req),
        Err(AllocationError::PoolDoesNotAdmit {
            pool: "team".into(),
            service: key("s")
        })
    );
}

#[test]
fn requested_ips_in_two_pools_are_refused() {
    let mut a = Allocator::new(vec![
        pool("four", &["10.0.0.0/24"]),
        pool("six", &["fd00::/120"]),
    ]);
    let req = dual(svc("s"), FamilyPolicy::RequireDualStack)
        .with_requested_ips(&ips(&["10.0.0.1", "fd00::1"]));
    assert_eq!(
        a.allocate(&req),
        Err(AllocationError::IpsInDifferentPools {
            first: ip("10.0.0.1"),
            first_pool: "four".into(),
            second: ip("fd00::1"),
            second_pool: "six".into(),
        })
    );
}

#[test]
fn requested_ip_of_a_family_the_service_lacks_is_refused() {
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.0/24", "fd00::/120"])]);
    let req = svc("s").with_requested_ips(&ips(&["fd00::1"]));
    assert_eq!(
        a.allocate(&req),
        Err(AllocationError::FamilyNotRequested { ip: ip("fd00::1") })
    );
}

#[test]
fn two_requested_ips_of_one_family_are_refused() {
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.0/24", "fd00::/120"])]);
    let req = dual(svc("s"), FamilyPolicy::PreferDualStack)
        .with_requested_ips(&ips(&["10.0.0.1", "10.0.0.2"]));
    assert_eq!(
        a.allocate(&req),
        Err(AllocationError::TwoOfOneFamily {
            first: ip("10.0.0.1"),
            second: ip("10.0.0.2")
        })
    );
}

#[test]
fn require_dual_stack_with_one_requested_family_is_refused() {
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.0/24", "fd00::/120"])]);
    let req =
        dual(svc("s"), FamilyPolicy::RequireDualStack).with_requested_ips(&ips(&["10.0.0.1"]));
    assert_eq!(
        a.allocate(&req),
        Err(AllocationError::MissingFamily { family: Family::V6 })
    );
}

#[test]
fn held_ip_is_not_kept_for_a_require_dual_stack_request_of_one_family() {
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.0/24", "fd00::/120"])]);
    let at = ips(&["10.0.0.1"]);
    got(&mut a, &svc("s").with_requested_ips(&at));
    let req = dual(svc("s"), FamilyPolicy::RequireDualStack).with_requested_ips(&at);
    assert_eq!(
        a.allocate(&req),
        Err(AllocationError::MissingFamily { family: Family::V6 })
    );
    assert_eq!(a.assignment(&key("s")), None);
}

/// Found by the property test: a held IPv6 address (the secondary family of a RequireDualStack
/// request) must not be kept alone either.
#[test]
fn held_secondary_ip_is_not_kept_for_a_require_dual_stack_request_of_one_family() {
    let mut a = Allocator::new(vec![pool("p", &["fd00::/120"])]);
    let at = ips(&["fd00::1"]);
    let v6 = svc("s").with_families(FamilyPolicy::SingleStack, &[Family::V6]);
    got(&mut a, &v6.with_requested_ips(&at));
    let req = dual(svc("s"), FamilyPolicy::RequireDualStack).with_requested_ips(&at);
    assert!(a.allocate(&req).is_err());
    assert_eq!(a.assignment(&key("s")), None);
}

#[test]
fn annotated_pool_is_used_even_without_auto_assign() {
    let mut a = Allocator::new(vec![
        pool("auto", &["10.0.0.0/24"]),
        manual(pool("manual", &["10.0.1.0/24"])),
    ]);
    assert_eq!(
        got(&mut a, &svc("s").with_pool("manual")),
        ("manual".into(), ips(&["10.0.1.0"]))
    );
    assert_eq!(got(&mut a, &svc("t")).0, "auto");
}

#[test]
fn annotated_pool_must_admit_the_service() {
    let mut a = Allocator::new(vec![only_namespace(pool("team", &["10.0.0.0/24"]), "team")]);
    assert_eq!(
        a.allocate(&svc("s").with_pool("team")),
        Err(AllocationError::PoolDoesNotAdmit {
            pool: "team".into(),
            service: key("s")
        })
    );
    let ok = ServiceRequest::new("team", "s").with_pool("team");
    assert_eq!(got(&mut a, &ok).1, ips(&["10.0.0.0"]));
}

#[test]
fn unknown_annotated_pool_is_refused() {
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.0/24"])]);
    assert_eq!(
        a.allocate(&svc("s").with_pool("nope")),
        Err(AllocationError::UnknownPool {
            pool: "nope".into()
        })
    );
}

#[test]
fn exhausted_annotated_pool_is_named() {
    let mut a = Allocator::new(vec![
        pool("tiny", &["10.0.0.1/32"]),
        pool("big", &["10.1.0.0/16"]),
    ]);
    got(&mut a, &svc("a").with_pool("tiny"));
    assert_eq!(
        a.allocate(&svc("b").with_pool("tiny")),
        Err(AllocationError::PoolExhausted {
            pool: "tiny".into(),
            family: Family::V4
        })
    );
}

#[test]
fn priority_orders_pools_lower_first_unset_last() {
    // Each pool holds one address: the n-th Service shows the n-th pool in the order.
    let mut a = Allocator::new(vec![
        pool("0-open", &["10.0.0.6/32"]),
        with_priority(pool("1-unset", &["10.0.0.4/32"]), None),
        with_priority(pool("2-twenty", &["10.0.0.2/32"]), Some(20)),
        with_priority(pool("3-ten", &["10.0.0.1/32"]), Some(10)),
        with_priority(pool("4-zero", &["10.0.0.5/32"]), Some(0)),
        with_priority(pool("5-ten-too", &["10.0.0.3/32"]), Some(10)),
    ]);
    let order: Vec<String> = (0..6)
        .map(|i| got(&mut a, &svc(&format!("s{i}"))).0)
        .collect();
    assert_eq!(
        order,
        [
            "3-ten",
            "5-ten-too",
            "2-twenty",
            "1-unset",
            "4-zero",
            "0-open"
        ]
    );
    assert_eq!(
        a.allocate(&svc("s6")),
        Err(AllocationError::AllPoolsExhausted {
            pools: vec![
                "3-ten".into(),
                "5-ten-too".into(),
                "2-twenty".into(),
                "1-unset".into(),
                "4-zero".into(),
                "0-open".into()
            ]
        })
    );
}

#[test]
fn pools_without_service_allocation_follow_by_name() {
    let mut a = Allocator::new(vec![
        pool("charlie", &["10.0.0.3/32"]),
        pool("alpha", &["10.0.0.1/32"]),
        pool("bravo", &["10.0.0.2/32"]),
    ]);
    let order: Vec<String> = (0..3)
        .map(|i| got(&mut a, &svc(&format!("s{i}"))).0)
        .collect();
    assert_eq!(order, ["alpha", "bravo", "charlie"]);
}

#[test]
fn pools_without_auto_assign_are_never_chosen_automatically() {
    let mut a = Allocator::new(vec![manual(pool("manual", &["10.0.0.0/24"]))]);
    assert_eq!(
        a.allocate(&svc("s")),
        Err(AllocationError::NoPoolAdmits { service: key("s") })
    );
}

#[test]
fn service_allocation_admits_by_namespace_namespace_labels_and_service_labels() {
    let ns_sel = PoolAllocation {
        namespace_selectors: vec![Selector::from_labels([("team", "web")])],
        ..Default::default()
    };
    let svc_sel = PoolAllocation {
        service_selectors: vec![Selector::from_labels([("tier", "edge")])],
        ..Default::default()
    };
    let both = PoolAllocation {
        namespaces: BTreeSet::from(["web".to_string()]),
        service_selectors: vec![Selector::from_labels([("tier", "edge")])],
        ..Default::default()
    };
    let web_ns = labels(&[("team", "web")]);
    let edge = labels(&[("tier", "edge")]);
    // (allocation, namespace, namespace labels, service labels, admitted)
    let cases = [
        (
            PoolAllocation::default(),
            "x",
            Labels::new(),
            Labels::new(),
            true,
        ),
        (ns_sel.clone(), "x", web_ns.clone(), Labels::new(), true),
        (ns_sel, "x", Labels::new(), Labels::new(), false),
        (svc_sel.clone(), "x", Labels::new(), edge.clone(), true),
        (svc_sel, "x", Labels::new(), Labels::new(), false),
        (both.clone(), "web", Labels::new(), edge.clone(), true),
        (both.clone(), "other", Labels::new(), edge, false),
        (both, "web", Labels::new(), Labels::new(), false),
    ];
    for (i, (allocation, namespace, ns_labels, svc_labels, admitted)) in
        cases.into_iter().enumerate()
    {
        let mut a = Allocator::new(vec![restricted(pool("p", &["10.0.0.0/24"]), allocation)]);
        let req = ServiceRequest::new(namespace, "s")
            .with_namespace_labels(ns_labels)
            .with_labels(svc_labels);
        assert_eq!(a.allocate(&req).is_ok(), admitted, "case {i}");
    }
}

#[test]
fn admitting_pools_come_before_open_pools_and_refusing_pools_are_skipped() {
    let mut a = Allocator::new(vec![
        pool("aaa-open", &["10.0.0.1/32"]),
        only_namespace(pool("other-team", &["10.0.1.0/24"]), "other"),
        only_namespace(pool("our-team", &["10.0.2.0/31"]), "ours"),
    ]);
    let ours = |n: &str| ServiceRequest::new("ours", n);
    assert_eq!(got(&mut a, &ours("a")).0, "our-team");
    assert_eq!(got(&mut a, &ours("b")).0, "our-team");
    assert_eq!(got(&mut a, &ours("c")).0, "aaa-open");
    assert_eq!(
        a.allocate(&ours("d")),
        Err(AllocationError::AllPoolsExhausted {
            pools: vec!["our-team".into(), "aaa-open".into()]
        })
    );
}

#[test]
fn no_admitting_pool_is_reported() {
    let mut a = Allocator::new(vec![only_namespace(pool("team", &["10.0.0.0/24"]), "team")]);
    let err = a.allocate(&svc("s")).unwrap_err();
    assert_eq!(err, AllocationError::NoPoolAdmits { service: key("s") });
    assert!(
        err.to_string()
            .starts_with("no pool with autoAssign: true admits default/s")
    );
}

#[test]
fn avoid_buggy_ips_skips_dot_zero_and_dot_255() {
    let mut a = Allocator::new(vec![avoiding(pool("p", &["10.0.0.254-10.0.2.1"]))]);
    // 260 addresses, of which .0.255, .1.0, .1.255 and .2.0 are skipped.
    assert_eq!(a.pool_stats("p").unwrap().total_ipv4, 256);
    let first: Vec<IpAddr> = (0..3)
        .map(|i| got(&mut a, &svc(&format!("s{i}"))).1[0])
        .collect();
    assert_eq!(first, ips(&["10.0.0.254", "10.0.1.1", "10.0.1.2"]));
    for i in 3..256 {
        let addr = got(&mut a, &svc(&format!("s{i}"))).1[0];
        let IpAddr::V4(v4) = addr else { panic!() };
        assert!(!matches!(v4.octets()[3], 0 | 255), "{addr}");
    }
    assert_eq!(
        a.allocate(&svc("full")),
        Err(AllocationError::AllPoolsExhausted {
            pools: vec!["p".into()]
        })
    );
    // Without the flag the same range hands out .255 and .0.
    let mut b = Allocator::new(vec![pool("p", &["10.0.0.254-10.0.2.1"])]);
    let all: Vec<IpAddr> = (0..3)
        .map(|i| got(&mut b, &svc(&format!("s{i}"))).1[0])
        .collect();
    assert_eq!(all, ips(&["10.0.0.254", "10.0.0.255", "10.0.1.0"]));
}

#[test]
fn requested_buggy_ip_is_refused_when_the_pool_avoids_it() {
    let mut a = Allocator::new(vec![avoiding(pool("p", &["10.0.0.0/23"]))]);
    for bad in ["10.0.0.0", "10.0.0.255", "10.0.1.255"] {
        assert_eq!(
            a.allocate(&svc("s").with_requested_ips(&ips(&[bad]))),
            Err(AllocationError::BuggyIp {
                ip: ip(bad),
                pool: "p".into()
            })
        );
    }
    assert!(
        a.allocate(&svc("s").with_requested_ips(&ips(&["10.0.1.0"])))
            .is_err()
    );
    assert!(
        a.allocate(&svc("s").with_requested_ips(&ips(&["10.0.1.1"])))
            .is_ok()
    );
}

#[test]
fn avoid_buggy_ips_does_not_touch_ipv6() {
    let mut a = Allocator::new(vec![avoiding(pool("p", &["fd00::ff-fd00::100"]))]);
    let req = |n: &str| svc(n).with_families(FamilyPolicy::SingleStack, &[Family::V6]);
    assert_eq!(got(&mut a, &req("a")).1, ips(&["fd00::ff"]));
    assert_eq!(got(&mut a, &req("b")).1, ips(&["fd00::100"]));
}

// ---- Dual stack ----------------------------------------------------------------------------

#[test]
fn require_dual_stack_takes_both_families_from_one_pool() {
    let mut a = Allocator::new(vec![
        pool("a-four", &["10.0.0.0/24"]),
        pool("b-six", &["fd00::/120"]),
        pool("c-dual", &["10.0.1.0/24", "fd01::/120"]),
    ]);
    let req = dual(svc("s"), FamilyPolicy::RequireDualStack);
    assert_eq!(
        got(&mut a, &req),
        ("c-dual".into(), ips(&["10.0.1.0", "fd01::"]))
    );
}

#[test]
fn require_dual_stack_without_a_dual_pool_is_refused() {
    let mut a = Allocator::new(vec![
        pool("a-four", &["10.0.0.0/24"]),
        pool("b-six", &["fd00::/120"]),
    ]);
    assert_eq!(
        a.allocate(&dual(svc("s"), FamilyPolicy::RequireDualStack)),
        Err(AllocationError::DualStackNotPossible)
    );
    let annotated = dual(svc("s"), FamilyPolicy::RequireDualStack).with_pool("a-four");
    assert_eq!(
        a.allocate(&annotated),
        Err(AllocationError::FamilyNotInPool {
            pool: "a-four".into(),
            family: Family::V6
        })
    );
}

#[test]
fn require_dual_stack_takes_nothing_when_one_family_is_full() {
    let mut a = Allocator::new(vec![pool("dual", &["10.0.0.0/24", "fd00::1/128"])]);
    let six = svc("six").with_families(FamilyPolicy::SingleStack, &[Family::V6]);
    got(&mut a, &six);
    assert!(
        a.allocate(&dual(svc("s"), FamilyPolicy::RequireDualStack))
            .is_err()
    );
    assert_eq!(a.pool_stats("dual").unwrap().assigned_ipv4, 0);
}

#[test]
fn prefer_dual_stack_prefers_a_pool_with_both_families() {
    let mut a = Allocator::new(vec![
        pool("a-four", &["10.0.0.0/24"]),
        pool("b-dual", &["10.0.1.0/24", "fd01::/120"]),
    ]);
    let req = dual(svc("s"), FamilyPolicy::PreferDualStack);
    assert_eq!(
        got(&mut a, &req),
        ("b-dual".into(), ips(&["10.0.1.0", "fd01::"]))
    );
}

#[test]
fn prefer_dual_stack_falls_back_to_the_primary_family() {
    let mut a = Allocator::new(vec![
        pool("a-six", &["fd00::/120"]),
        pool("b-four", &["10.0.0.0/24"]),
    ]);
    let req = dual(svc("s"), FamilyPolicy::PreferDualStack);
    assert_eq!(got(&mut a, &req), ("b-four".into(), ips(&["10.0.0.0"])));
}

/// Found by the differential test against MetalLB (seed 2): one family is a valid answer for
/// PreferDualStack, the secondary one too when the primary is exhausted everywhere.
#[test]
fn prefer_dual_stack_takes_the_secondary_family_when_the_primary_is_exhausted() {
    let mut a = Allocator::new(vec![pool("dual", &["10.0.0.1/32", "fd00::/120"])]);
    got(&mut a, &svc("four"));
    let req = dual(svc("s"), FamilyPolicy::PreferDualStack);
    assert_eq!(got(&mut a, &req), ("dual".into(), ips(&["fd00::"])));
    // In an annotated pool MetalLB tries both, then IPv4, then IPv6, whatever the primary.
    let mut a = Allocator::new(vec![pool("dual", &["10.0.0.1/32", "fd00::1/128"])]);
    got(&mut a, &svc("four"));
    let six_first = svc("s")
        .with_families(FamilyPolicy::PreferDualStack, &[Family::V6, Family::V4])
        .with_pool("dual");
    assert_eq!(got(&mut a, &six_first), ("dual".into(), ips(&["fd00::1"])));
    // RequireDualStack still needs both.
    let mut a = Allocator::new(vec![pool("dual", &["10.0.0.1/32", "fd00::/120"])]);
    got(&mut a, &svc("four"));
    assert!(
        a.allocate(&dual(svc("r"), FamilyPolicy::RequireDualStack))
            .is_err()
    );
}

/// Found by the differential test against MetalLB (seed 5): a pool whose serviceAllocation admits
/// the Service is used for one family before an open pool with both.
#[test]
fn prefer_dual_stack_takes_one_family_from_a_restricted_pool_before_an_open_one() {
    let mut a = Allocator::new(vec![
        with_priority(pool("a-six", &["fd00::/120"]), Some(1)),
        pool("b-dual", &["10.0.0.0/24", "fd01::/120"]),
    ]);
    let req = dual(svc("s"), FamilyPolicy::PreferDualStack);
    assert_eq!(got(&mut a, &req), ("a-six".into(), ips(&["fd00::"])));
}

/// Found by the differential test against MetalLB (seed 2): a PreferDualStack Service that holds
/// only its secondary family keeps it when a pool with both families appears.
#[test]
fn prefer_dual_stack_on_its_secondary_family_is_not_moved() {
    let mut a = Allocator::new(vec![pool("a-dual", &["10.0.0.1/32", "fd00::/120"])]);
    got(&mut a, &svc("four"));
    let req = dual(svc("s"), FamilyPolicy::PreferDualStack);
    assert_eq!(got(&mut a, &req), ("a-dual".into(), ips(&["fd00::"])));
    a.set_pools(vec![
        pool("a-dual", &["10.0.0.1/32", "fd00::/120"]),
        pool("b-dual", &["10.0.1.0/24", "fd01::/120"]),
    ]);
    assert_eq!(got(&mut a, &req), ("a-dual".into(), ips(&["fd00::"])));
    // It gains its primary family when that frees up in its own pool.
    a.release(&key("four"));
    assert_eq!(
        got(&mut a, &req),
        ("a-dual".into(), ips(&["10.0.0.1", "fd00::"]))
    );
}

#[test]
fn prefer_dual_stack_gains_the_other_family_later_from_the_same_pool() {
    let mut a = Allocator::new(vec![pool("dual", &["10.0.0.0/24", "fd00::1/128"])]);
    let six = svc("six").with_families(FamilyPolicy::SingleStack, &[Family::V6]);
    got(&mut a, &six);
    let req = dual(svc("s"), FamilyPolicy::PreferDualStack);
    assert_eq!(got(&mut a, &req), ("dual".into(), ips(&["10.0.0.0"])));
    assert_eq!(
        got(&mut a, &req),
        ("dual".into(), ips(&["10.0.0.0"])),
        "still full"
    );
    a.release(&key("six"));
    assert_eq!(
        got(&mut a, &req),
        ("dual".into(), ips(&["10.0.0.0", "fd00::1"]))
    );
}

#[test]
fn single_stack_takes_the_primary_family_only() {
    let mut a = Allocator::new(vec![pool("dual", &["10.0.0.0/24", "fd00::/120"])]);
    let req = svc("s").with_families(FamilyPolicy::SingleStack, &[Family::V6, Family::V4]);
    assert_eq!(got(&mut a, &req).1, ips(&["fd00::"]));
}

#[test]
fn ips_follow_the_service_family_order() {
    let mut a = Allocator::new(vec![pool("dual", &["10.0.0.0/24", "fd00::/120"])]);
    let req = svc("s").with_families(FamilyPolicy::RequireDualStack, &[Family::V6, Family::V4]);
    assert_eq!(got(&mut a, &req).1, ips(&["fd00::", "10.0.0.0"]));
    let restored =
        svc("r").with_families(FamilyPolicy::RequireDualStack, &[Family::V6, Family::V4]);
    assert_eq!(
        a.assign(&restored, &ips(&["10.0.0.9", "fd00::9"]))
            .unwrap()
            .ips
            .to_vec(),
        ips(&["fd00::9", "10.0.0.9"])
    );
}

#[test]
fn dual_stack_service_turned_single_stack_releases_the_other_family() {
    let mut a = Allocator::new(vec![pool("dual", &["10.0.0.0/24", "fd00::/120"])]);
    got(&mut a, &dual(svc("s"), FamilyPolicy::RequireDualStack));
    assert_eq!(got(&mut a, &svc("s")).1, ips(&["10.0.0.0"]));
    assert_eq!(a.pool_stats("dual").unwrap().assigned_ipv6, 0);
}

// ---- Sharing -------------------------------------------------------------------------------

#[test]
fn shared_ip_allowed_with_same_key_disjoint_ports_and_same_backend() {
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.0/24"])]);
    let web = shared("web", "k", &[80]).with_requested_ips(&ips(&["10.0.0.7"]));
    let dns = shared("dns", "k", &[53]).with_requested_ips(&ips(&["10.0.0.7"]));
    got(&mut a, &web);
    assert_eq!(got(&mut a, &dns).1, ips(&["10.0.0.7"]));
    assert_eq!(a.holders(ip("10.0.0.7")), [key("web"), key("dns")]);
    // Same port number, other protocol: no overlap.
    let udp = svc("udp")
        .with_sharing_key("k")
        .with_ports(&[ProtocolPort::udp(80)])
        .with_requested_ips(&ips(&["10.0.0.7"]));
    assert!(a.allocate(&udp).is_ok());
}

#[test]
fn shared_ip_refused_when_keys_differ() {
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.0/24"])]);
    got(
        &mut a,
        &shared("web", "k1", &[80]).with_requested_ips(&ips(&["10.0.0.7"])),
    );
    let err = a
        .allocate(&shared("dns", "k2", &[53]).with_requested_ips(&ips(&["10.0.0.7"])))
        .unwrap_err();
    assert_eq!(
        err,
        AllocationError::IpInUse {
            ip: ip("10.0.0.7"),
            holder: key("web"),
            conflict: ShareConflict::DifferentKey {
                ours: "k2".into(),
                theirs: "k1".into()
            }
        }
    );
}

#[test]
fn shared_ip_refused_when_ports_overlap() {
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.0/24"])]);
    got(
        &mut a,
        &shared("web", "k", &[80, 443]).with_requested_ips(&ips(&["10.0.0.7"])),
    );
    let err = a
        .allocate(&shared("other", "k", &[8080, 80]).with_requested_ips(&ips(&["10.0.0.7"])))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "10.0.0.7 is in use by default/web and cannot be shared: both Services use port TCP/80"
    );
}

#[test]
fn shared_ip_refused_when_backends_differ() {
    let local = |sel: &[(&str, &str)]| Backend::Local(labels(sel));
    // (holder backend, newcomer backend, shareable)
    let cases = [
        (Backend::Cluster, Backend::Cluster, true),
        (local(&[("app", "a")]), local(&[("app", "a")]), true),
        (Backend::Cluster, local(&[("app", "a")]), false),
        (local(&[("app", "a")]), local(&[("app", "b")]), false),
        (local(&[("app", "a")]), local(&[]), false),
    ];
    for (i, (theirs, ours, ok)) in cases.into_iter().enumerate() {
        let mut a = Allocator::new(vec![pool("p", &["10.0.0.0/24"])]);
        let at = ips(&["10.0.0.7"]);
        got(
            &mut a,
            &shared("a", "k", &[80])
                .with_backend(theirs.clone())
                .with_requested_ips(&at),
        );
        let result = a.allocate(
            &shared("b", "k", &[81])
                .with_backend(ours.clone())
                .with_requested_ips(&at),
        );
        match result {
            Ok(_) => assert!(ok, "case {i}"),
            Err(e) => {
                assert!(!ok, "case {i}: {e}");
                assert_eq!(
                    e,
                    AllocationError::IpInUse {
                        ip: at[0],
                        holder: key("a"),
                        conflict: ShareConflict::BackendMismatch { ours, theirs }
                    },
                    "case {i}"
                );
            }
        }
    }
}

#[test]
fn shared_ip_refused_without_a_key_on_either_side() {
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.0/24"])]);
    let at = ips(&["10.0.0.7"]);
    got(&mut a, &svc("plain").with_requested_ips(&at));
    let keyed = shared("keyed", "k", &[81]).with_requested_ips(&at);
    assert!(matches!(
        a.allocate(&keyed),
        Err(AllocationError::IpInUse {
            conflict: ShareConflict::HolderHasNoKey,
            ..
        })
    ));
    a.release(&key("plain"));
    got(&mut a, &keyed);
    assert!(matches!(
        a.allocate(&svc("plain").with_requested_ips(&at)),
        Err(AllocationError::IpInUse {
            conflict: ShareConflict::NoKey,
            ..
        })
    ));
    // An empty key is no key.
    let empty = shared("empty", "", &[82]).with_requested_ips(&at);
    assert!(matches!(
        a.allocate(&empty),
        Err(AllocationError::IpInUse {
            conflict: ShareConflict::NoKey,
            ..
        })
    ));
}

#[test]
fn keyed_service_prefers_the_ip_of_a_compatible_service_with_the_same_key() {
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.0/24"])]);
    got(&mut a, &svc("first"));
    assert_eq!(
        got(&mut a, &shared("web", "k", &[80])).1,
        ips(&["10.0.0.1"])
    );
    got(&mut a, &svc("third"));
    a.release(&key("first"));
    // 10.0.0.0 is free and lower, but 10.0.0.1 is shareable.
    assert_eq!(
        got(&mut a, &shared("dns", "k", &[53])).1,
        ips(&["10.0.0.1"])
    );
    // Overlapping ports: not shareable, so the lowest free address.
    assert_eq!(
        got(&mut a, &shared("web2", "k", &[80])).1,
        ips(&["10.0.0.0"])
    );
    // Another key never joins.
    assert_eq!(
        got(&mut a, &shared("x", "other", &[1])).1,
        ips(&["10.0.0.3"])
    );
}

#[test]
fn keyed_service_looks_for_a_shareable_ip_across_candidate_pools() {
    let mut a = Allocator::new(vec![
        pool("a", &["10.0.0.0/24"]),
        pool("b", &["10.0.1.0/24"]),
    ]);
    got(&mut a, &shared("web", "k", &[80]).with_pool("b"));
    assert_eq!(
        got(&mut a, &shared("dns", "k", &[53])),
        ("b".into(), ips(&["10.0.1.0"]))
    );
    assert_eq!(got(&mut a, &svc("plain")), ("a".into(), ips(&["10.0.0.0"])));
}

#[test]
fn shared_ip_counts_once_and_returns_to_the_pool_with_its_last_holder() {
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.0/30"])]);
    got(&mut a, &shared("web", "k", &[80]));
    got(&mut a, &shared("dns", "k", &[53]));
    let stats = a.pool_stats("p").unwrap();
    assert_eq!((stats.assigned_ipv4, stats.available_ipv4), (1, 3));
    a.release(&key("web"));
    assert_eq!(a.pool_stats("p").unwrap().assigned_ipv4, 1);
    assert_eq!(got(&mut a, &svc("plain")).1, ips(&["10.0.0.1"]));
    a.release(&key("dns"));
    assert_eq!(a.pool_stats("p").unwrap().assigned_ipv4, 1);
    assert_eq!(got(&mut a, &svc("next")).1, ips(&["10.0.0.0"]));
}

// ---- Keeping, changing, re-evaluating ------------------------------------------------------

#[test]
fn allocate_is_idempotent_for_an_unchanged_request() {
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.0/24"])]);
    let req = shared("web", "k", &[80]);
    let first = a.allocate(&req).unwrap();
    got(&mut a, &svc("other"));
    for _ in 0..3 {
        assert_eq!(a.allocate(&req).unwrap(), first);
    }
    assert_eq!(a.pool_stats("p").unwrap().assigned_ipv4, 2);
}

#[test]
fn changed_requested_ip_moves_the_service() {
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.0/24"])]);
    got(&mut a, &svc("s").with_requested_ips(&ips(&["10.0.0.5"])));
    assert_eq!(
        got(&mut a, &svc("s").with_requested_ips(&ips(&["10.0.0.9"]))).1,
        ips(&["10.0.0.9"])
    );
    assert_eq!(a.holders(ip("10.0.0.5")), &[] as &[ServiceKey]);
    // Dropping the request keeps the address: it is still valid.
    assert_eq!(got(&mut a, &svc("s")).1, ips(&["10.0.0.9"]));
}

#[test]
fn changed_pool_annotation_moves_the_service() {
    let mut a = Allocator::new(vec![
        pool("a", &["10.0.0.0/24"]),
        pool("b", &["10.0.1.0/24"]),
    ]);
    assert_eq!(got(&mut a, &svc("s")).0, "a");
    assert_eq!(
        got(&mut a, &svc("s").with_pool("b")),
        ("b".into(), ips(&["10.0.1.0"]))
    );
    assert_eq!(a.pool_stats("a").unwrap().assigned_ipv4, 0);
}

#[test]
fn sharing_service_whose_ports_now_overlap_moves_to_a_new_ip() {
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.0/24"])]);
    got(&mut a, &shared("web", "k", &[80]));
    got(&mut a, &shared("dns", "k", &[53]));
    assert_eq!(a.holders(ip("10.0.0.0")).len(), 2);
    assert_eq!(
        got(&mut a, &shared("dns", "k", &[53, 80])).1,
        ips(&["10.0.0.1"])
    );
    assert_eq!(a.holders(ip("10.0.0.0")), [key("web")]);
}

#[test]
fn sole_holder_may_change_its_sharing_key() {
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.0/24"])]);
    got(&mut a, &shared("web", "k1", &[80]));
    assert_eq!(
        got(&mut a, &shared("web", "k2", &[80])).1,
        ips(&["10.0.0.0"])
    );
    assert_eq!(
        got(&mut a, &shared("dns", "k2", &[53])).1,
        ips(&["10.0.0.0"])
    );
    assert_eq!(got(&mut a, &shared("x", "k1", &[1])).1, ips(&["10.0.0.1"]));
}

#[test]
fn assignment_is_kept_when_its_pool_stops_auto_assigning() {
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.0/24"])]);
    got(&mut a, &svc("s"));
    assert!(
        a.set_pools(vec![manual(pool("p", &["10.0.0.0/24"]))])
            .is_empty()
    );
    assert_eq!(got(&mut a, &svc("s")).1, ips(&["10.0.0.0"]));
    assert!(a.allocate(&svc("new")).is_err());
}

#[test]
fn assignment_is_reevaluated_when_the_service_labels_change() {
    let allocation = PoolAllocation {
        service_selectors: vec![Selector::from_labels([("tier", "edge")])],
        ..Default::default()
    };
    let mut a = Allocator::new(vec![
        restricted(pool("edge", &["10.0.0.0/24"]), allocation),
        pool("open", &["10.0.1.0/24"]),
    ]);
    let edge = svc("s").with_labels(labels(&[("tier", "edge")]));
    assert_eq!(got(&mut a, &edge).0, "edge");
    assert_eq!(got(&mut a, &svc("s")), ("open".into(), ips(&["10.0.1.0"])));
}

// ---- Restart: rebuilding from Service status -----------------------------------------------

#[test]
fn restart_rebuild_keeps_every_valid_ip() {
    let pools = vec![
        pool("dual", &["10.0.0.0/29", "fd00::/125"]),
        manual(pool("manual", &["10.0.1.0/24"])),
    ];
    let requests = vec![
        svc("a"),
        svc("b"),
        dual(svc("c"), FamilyPolicy::RequireDualStack),
        shared("web", "k", &[80]),
        shared("dns", "k", &[53]),
        svc("pinned").with_pool("manual"),
        svc("asked").with_requested_ips(&ips(&["10.0.0.6"])),
    ];
    let mut before = Allocator::new(pools.clone());
    for r in &requests {
        before.allocate(r).unwrap();
    }
    before.release(&key("a"));
    // Status as the controller finds it on start.
    let status: Vec<(ServiceRequest, Vec<IpAddr>)> = requests
        .iter()
        .filter_map(|r| {
            before
                .assignment(&r.key)
                .map(|a| (r.clone(), a.ips.to_vec()))
        })
        .collect();
    let mut after = Allocator::new(pools);
    for (r, held) in status.iter().rev() {
        assert_eq!(
            *after.assign(r, held).unwrap().ips.to_vec(),
            **held,
            "{}",
            r.key
        );
    }
    for r in &requests[1..] {
        assert_eq!(after.assignment(&r.key), before.assignment(&r.key));
    }
    for p in ["dual", "manual"] {
        assert_eq!(after.pool_stats(p), before.pool_stats(p), "{p}");
    }
    // A pending Service gets what is free, never an address re-claimed above.
    assert_eq!(got(&mut after, &svc("pending")).1, ips(&["10.0.0.0"]));
}

#[test]
fn assign_refuses_an_ip_held_by_a_service_it_may_not_share_with() {
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.0/24"])]);
    got(&mut a, &svc("first"));
    assert_eq!(
        a.assign(&svc("second"), &ips(&["10.0.0.0"])),
        Err(AllocationError::IpInUse {
            ip: ip("10.0.0.0"),
            holder: key("first"),
            conflict: ShareConflict::NoKey
        })
    );
}

#[test]
fn assign_refuses_ips_the_service_may_not_hold() {
    let mut a = Allocator::new(vec![
        pool("p", &["10.0.0.0/24", "fd00::/120"]),
        only_namespace(pool("team", &["10.0.1.0/24"]), "team"),
        avoiding(pool("careful", &["10.0.2.0/24"])),
    ]);
    let cases: Vec<(ServiceRequest, Vec<IpAddr>, AllocationError)> = vec![
        (svc("s"), vec![], AllocationError::NoAddress),
        (
            svc("s"),
            ips(&["192.0.2.1"]),
            AllocationError::IpNotInAnyPool {
                ip: ip("192.0.2.1"),
            },
        ),
        (
            svc("s"),
            ips(&["10.0.1.1"]),
            AllocationError::PoolDoesNotAdmit {
                pool: "team".into(),
                service: key("s"),
            },
        ),
        (
            svc("s").with_pool("p"),
            ips(&["10.0.2.1"]),
            AllocationError::IpNotInAnnotatedPool {
                ip: ip("10.0.2.1"),
                pool: "p".into(),
            },
        ),
        (
            svc("s"),
            ips(&["10.0.2.255"]),
            AllocationError::BuggyIp {
                ip: ip("10.0.2.255"),
                pool: "careful".into(),
            },
        ),
        (
            svc("s"),
            ips(&["fd00::1"]),
            AllocationError::FamilyNotRequested { ip: ip("fd00::1") },
        ),
        (
            dual(svc("s"), FamilyPolicy::RequireDualStack),
            ips(&["10.0.0.1"]),
            AllocationError::MissingFamily { family: Family::V6 },
        ),
        (
            svc("s").with_requested_ips(&ips(&["10.0.0.1"])),
            ips(&["10.0.0.2"]),
            AllocationError::NotRequested {
                ips: ips(&["10.0.0.2"]),
                requested: ips(&["10.0.0.1"]),
            },
        ),
    ];
    for (i, (req, offered, want)) in cases.into_iter().enumerate() {
        assert_eq!(a.assign(&req, &offered), Err(want), "case {i}");
    }
    assert!(a.is_empty());
}

#[test]
fn failed_assign_keeps_what_the_service_held() {
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.0/24"])]);
    got(&mut a, &svc("s"));
    assert!(a.assign(&svc("s"), &ips(&["192.0.2.1"])).is_err());
    assert_eq!(
        a.assignment(&key("s")),
        Some(&assignment("p", &["10.0.0.0"]))
    );
    assert_eq!(
        a.assign(&svc("s"), &ips(&["10.0.0.3"])).unwrap(),
        assignment("p", &["10.0.0.3"])
    );
    assert_eq!(a.pool_stats("p").unwrap().assigned_ipv4, 1);
}

#[test]
fn assign_ignores_auto_assign() {
    let mut a = Allocator::new(vec![manual(pool("manual", &["10.0.0.0/24"]))]);
    assert!(a.assign(&svc("s"), &ips(&["10.0.0.1"])).is_ok());
}

// ---- Changing pools ------------------------------------------------------------------------

#[test]
fn pool_shrink_releases_only_ips_outside() {
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.0/24"])]);
    for i in 0..6 {
        got(&mut a, &svc(&format!("s{i}")));
    }
    let released = a.set_pools(vec![pool("p", &["10.0.0.2-10.0.0.200"])]);
    assert_eq!(
        released,
        vec![
            (
                key("s0"),
                AllocationError::IpLeftPool {
                    ip: ip("10.0.0.0"),
                    pool: "p".into()
                }
            ),
            (
                key("s1"),
                AllocationError::IpLeftPool {
                    ip: ip("10.0.0.1"),
                    pool: "p".into()
                }
            ),
        ]
    );
    for i in 2..6 {
        assert_eq!(
            a.assignment(&key(&format!("s{i}"))).unwrap().ips.to_vec(),
            ips(&[&format!("10.0.0.{i}")])
        );
    }
    assert_eq!(
        a.pool_stats("p").unwrap(),
        PoolStats {
            total_ipv4: 199,
            assigned_ipv4: 4,
            available_ipv4: 195,
            ..Default::default()
        }
    );
    assert_eq!(got(&mut a, &svc("new")).1, ips(&["10.0.0.6"]));
}

#[test]
fn pool_deletion_releases_its_services_only() {
    let mut a = Allocator::new(vec![
        pool("a", &["10.0.0.0/24"]),
        pool("b", &["10.0.1.0/24"]),
    ]);
    got(&mut a, &svc("in-a"));
    got(&mut a, &svc("in-b").with_pool("b"));
    let released = a.set_pools(vec![pool("b", &["10.0.1.0/24"])]);
    assert_eq!(
        released,
        vec![(
            key("in-a"),
            AllocationError::PoolDeleted { pool: "a".into() }
        )]
    );
    assert_eq!(
        a.assignment(&key("in-b")),
        Some(&assignment("b", &["10.0.1.0"]))
    );
    assert_eq!(a.pool_stats("a"), None);
}

#[test]
fn service_allocation_change_releases_services_no_longer_admitted() {
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.0/24"])]);
    got(&mut a, &ServiceRequest::new("team", "kept"));
    got(&mut a, &ServiceRequest::new("other", "lost"));
    let released = a.set_pools(vec![only_namespace(pool("p", &["10.0.0.0/24"]), "team")]);
    assert_eq!(
        released,
        vec![(
            ServiceKey::new("other", "lost"),
            AllocationError::PoolDoesNotAdmit {
                pool: "p".into(),
                service: ServiceKey::new("other", "lost")
            }
        )]
    );
    assert!(a.assignment(&ServiceKey::new("team", "kept")).is_some());
}

#[test]
fn namespace_selector_change_releases_services_of_namespaces_no_longer_selected() {
    let selecting = |team: &str| PoolAllocation {
        namespace_selectors: vec![Selector::from_labels([("team", team)])],
        ..Default::default()
    };
    let mut a = Allocator::new(vec![restricted(
        pool("p", &["10.0.0.0/24"]),
        selecting("web"),
    )]);
    let web = ServiceRequest::new("shop", "s").with_namespace_labels(labels(&[("team", "web")]));
    got(&mut a, &web);
    assert!(
        a.set_pools(vec![restricted(
            pool("p", &["10.0.0.0/24"]),
            selecting("web")
        )])
        .is_empty()
    );
    let released = a.set_pools(vec![restricted(
        pool("p", &["10.0.0.0/24"]),
        selecting("api"),
    )]);
    assert_eq!(
        released,
        vec![(
            ServiceKey::new("shop", "s"),
            AllocationError::PoolDoesNotAdmit {
                pool: "p".into(),
                service: ServiceKey::new("shop", "s")
            }
        )]
    );
}

#[test]
fn turning_on_avoid_buggy_ips_releases_dot_zero_and_dot_255_holders() {
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.254-10.0.1.1"])]);
    for i in 0..4 {
        got(&mut a, &svc(&format!("s{i}")));
    }
    let released = a.set_pools(vec![avoiding(pool("p", &["10.0.0.254-10.0.1.1"]))]);
    let keys: Vec<ServiceKey> = released.into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, [key("s1"), key("s2")]);
    assert_eq!(a.pool_stats("p").unwrap().available_ipv4, 0);
    assert!(a.allocate(&svc("new")).is_err());
}

#[test]
fn pool_growth_makes_new_addresses_available_and_keeps_the_old() {
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.0/31"])]);
    got(&mut a, &svc("a"));
    got(&mut a, &svc("b"));
    assert!(a.allocate(&svc("c")).is_err());
    assert!(
        a.set_pools(vec![pool("p", &["10.0.0.0/30"]), pool("q", &["fd00::/64"])])
            .is_empty()
    );
    assert_eq!(got(&mut a, &svc("c")).1, ips(&["10.0.0.2"]));
    assert_eq!(
        a.assignment(&key("a")).unwrap().ips.to_vec(),
        ips(&["10.0.0.0"])
    );
}

#[test]
fn unchanged_pools_keep_every_assignment() {
    let pools = vec![
        pool("dual", &["10.0.0.0/24", "fd00::/120"]),
        with_priority(pool("prio", &["10.0.1.0/24"]), Some(1)),
    ];
    let mut a = Allocator::new(pools.clone());
    for i in 0..10 {
        got(
            &mut a,
            &dual(svc(&format!("s{i}")), FamilyPolicy::PreferDualStack),
        );
    }
    let before: Vec<(ServiceKey, Assignment)> = {
        let mut v: Vec<_> = a
            .assignments()
            .map(|(k, x)| (k.clone(), x.clone()))
            .collect();
        v.sort_by(|x, y| x.0.cmp(&y.0));
        v
    };
    assert!(a.set_pools(pools).is_empty());
    let mut after: Vec<_> = a
        .assignments()
        .map(|(k, x)| (k.clone(), x.clone()))
        .collect();
    after.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(after, before);
}

// ---- Statistics and cost -------------------------------------------------------------------

#[test]
fn pool_stats_count_assigned_and_available_per_family() {
    let mut a = Allocator::new(vec![pool("dual", &["10.0.0.0/24", "fd00::/120"])]);
    got(&mut a, &dual(svc("a"), FamilyPolicy::RequireDualStack));
    got(&mut a, &svc("b"));
    assert_eq!(
        a.pool_stats("dual"),
        Some(PoolStats {
            total_ipv4: 256,
            total_ipv6: 256,
            assigned_ipv4: 2,
            assigned_ipv6: 1,
            available_ipv4: 254,
            available_ipv6: 255,
        })
    );
    assert_eq!(a.pool_stats("nope"), None);
}

#[test]
fn huge_ipv6_pool_costs_nothing_up_front() {
    let mut a = Allocator::new(vec![
        pool("v4-slash-8", &["10.0.0.0/8"]),
        pool("v6-slash-64", &["fd00::/64"]),
        pool("v6-everything", &["8000::/1"]),
    ]);
    assert_eq!(a.free_space_intervals(), 3);
    let stats = a.pool_stats("v6-slash-64").unwrap();
    assert_eq!(
        (stats.total_ipv6, stats.available_ipv6),
        (i64::MAX, i64::MAX)
    );
    assert_eq!(a.pool_stats("v4-slash-8").unwrap().total_ipv4, 1 << 24);
    let six = |n: String| {
        svc(&n)
            .with_families(FamilyPolicy::SingleStack, &[Family::V6])
            .with_pool("v6-everything")
    };
    for i in 0..1000 {
        a.allocate(&six(format!("s{i}"))).unwrap();
    }
    // Sequential allocations only move the start of one interval.
    assert_eq!(a.free_space_intervals(), 3);
    assert_eq!(
        a.assignment(&key("s999")).unwrap().ips.to_vec(),
        ips(&["8000::3e7"])
    );
}

#[test]
fn free_space_grows_with_holes_not_with_pool_size() {
    let mut a = Allocator::new(vec![pool("p", &["10.0.0.0/8"])]);
    for i in 0..100 {
        got(&mut a, &svc(&format!("s{i}")));
    }
    for i in (0..100).step_by(2) {
        a.release(&key(&format!("s{i}")));
    }
    // 50 single-address holes plus the rest of the /8.
    assert_eq!(a.free_space_intervals(), 51);
    for i in 0..50 {
        got(&mut a, &svc(&format!("again{i}")));
    }
    assert_eq!(a.free_space_intervals(), 1);
}

// ---- Messages ------------------------------------------------------------------------------

#[test]
fn error_messages_read_for_operators() {
    let cases = [
        (
            AllocationError::PoolExhausted {
                pool: "p".into(),
                family: Family::V6,
            },
            r#"pool "p" has no free IPv6 address"#,
        ),
        (
            AllocationError::AllPoolsExhausted {
                pools: vec!["a".into(), "b".into()],
            },
            "no free address: every pool this Service may use is full (a, b)",
        ),
        (
            AllocationError::IpNotInAnnotatedPool {
                ip: ip("10.0.0.5"),
                pool: "b".into(),
            },
            r#"10.0.0.5 is not in pool "b" named by metallb.io/address-pool"#,
        ),
        (
            AllocationError::IpInUse {
                ip: ip("10.0.0.7"),
                holder: key("web"),
                conflict: ShareConflict::DifferentKey {
                    ours: "x".into(),
                    theirs: "y".into(),
                },
            },
            r#"10.0.0.7 is in use by default/web and cannot be shared: the sharing keys differ (metallb.io/allow-shared-ip "x" here, "y" there)"#,
        ),
        (
            AllocationError::IpInUse {
                ip: ip("10.0.0.7"),
                holder: key("web"),
                conflict: ShareConflict::BackendMismatch {
                    ours: Backend::Cluster,
                    theirs: Backend::Local(labels(&[("app", "web")])),
                },
            },
            "10.0.0.7 is in use by default/web and cannot be shared: the backends differ (externalTrafficPolicy Cluster here, externalTrafficPolicy Local with selector {app=web} there); both must be Cluster, or Local with the same selector",
        ),
        (
            AllocationError::BuggyIp {
                ip: ip("10.0.0.0"),
                pool: "p".into(),
            },
            r#"10.0.0.0 ends in .0 or .255, which pool "p" skips (avoidBuggyIPs: true)"#,
        ),
        (
            AllocationError::DualStackNotPossible,
            "RequireDualStack: no pool this Service may use has both IPv4 and IPv6 addresses",
        ),
        (
            AllocationError::UnknownPool {
                pool: "nope".into(),
            },
            r#"metallb.io/address-pool: pool "nope" does not exist"#,
        ),
    ];
    for (err, want) in cases {
        assert_eq!(err.to_string(), want);
    }
}
