//! Properties of the node-address decision (`ferrolb_config::node_addresses`, decision 0024)
//! over random clusters: small address pools so that nodes share addresses and Services share
//! ports, labels and readiness at random.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ferrolb_config::address::Family;
use ferrolb_config::allocator::{Protocol, ProtocolPort, ServiceKey};
use ferrolb_config::node_addresses::{
    ENABLE_LB_LABEL, Exclusion, HeldPorts, LB_POOL_LABEL, Node, Nodes, Service, ServiceOutcome,
    TrafficPolicy, compute, compute_service, compute_service_brief, priority,
};
use ferrolb_config::selector::Labels;
use proptest::prelude::*;

// "10.0.0.10" and "10.0.0.9" sort differently as strings and as numbers.
const INTERNAL: [&str; 6] = [
    "10.0.0.1",
    "10.0.0.9",
    "10.0.0.10",
    "10.0.0.2",
    "fd00::1",
    "fd00::a",
];
const EXTERNAL: [&str; 4] = ["203.0.113.1", "203.0.113.20", "2001:db8::1", "2001:db8::10"];
const PORTS: [(Protocol, u16); 4] = [
    (Protocol::Tcp, 80),
    (Protocol::Tcp, 443),
    (Protocol::Udp, 53),
    (Protocol::Tcp, 53),
];
const MAX_NODES: usize = 6;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn label_value() -> impl Strategy<Value = Option<&'static str>> {
    prop_oneof![
        4 => Just(None),
        1 => Just(Some("true")),
        1 => Just(Some("false")),
    ]
}

fn pool_value() -> impl Strategy<Value = Option<&'static str>> {
    prop_oneof![2 => Just(None), 1 => Just(Some("a")), 1 => Just(Some("b"))]
}

fn node_at(index: usize) -> impl Strategy<Value = Node> {
    (
        proptest::sample::subsequence(INTERNAL.to_vec(), 0..=3),
        prop_oneof![
            2 => Just(Vec::new()),
            1 => proptest::sample::subsequence(EXTERNAL.to_vec(), 0..=2),
        ],
        label_value(),
        pool_value(),
        prop::bool::weighted(0.85),
        prop::bool::weighted(0.85),
    )
        .prop_map(
            move |(internal, external, enable, pool, ready, speaker_alive)| {
                let mut labels = Labels::new();
                if let Some(v) = enable {
                    labels.insert(ENABLE_LB_LABEL.into(), v.into());
                }
                if let Some(v) = pool {
                    labels.insert(LB_POOL_LABEL.into(), v.into());
                }
                Node {
                    name: format!("n{index}"),
                    labels,
                    internal: internal.into_iter().map(ip).collect(),
                    external: external.into_iter().map(ip).collect(),
                    ready,
                    speaker_alive,
                }
            },
        )
}

fn nodes() -> impl Strategy<Value = Vec<Node>> {
    (0..=MAX_NODES).prop_flat_map(|n| (0..n).map(node_at).collect::<Vec<_>>())
}

fn families() -> impl Strategy<Value = Vec<Family>> {
    prop_oneof![
        3 => Just(vec![Family::V4]),
        1 => Just(vec![Family::V6]),
        1 => Just(vec![Family::V4, Family::V6]),
        1 => Just(vec![Family::V6, Family::V4]),
    ]
}

fn service_at(index: usize) -> impl Strategy<Value = Service> {
    (
        prop::sample::select(vec!["ns1", "ns2"]),
        0i64..3,
        pool_value(),
        families(),
        proptest::sample::subsequence(PORTS.to_vec(), 1..=2),
        prop::option::weighted(
            0.3,
            proptest::sample::subsequence((0..MAX_NODES).collect::<Vec<_>>(), 0..=MAX_NODES),
        ),
    )
        .prop_map(move |(ns, created, pool, ip_families, ports, local)| {
            let mut labels = Labels::new();
            if let Some(v) = pool {
                labels.insert(LB_POOL_LABEL.into(), v.into());
            }
            Service {
                key: ServiceKey::new(ns, format!("s{index}")),
                created,
                labels,
                ip_families,
                ports: ports
                    .into_iter()
                    .map(|(protocol, port)| ProtocolPort { protocol, port })
                    .collect(),
                traffic: match local {
                    None => TrafficPolicy::Cluster,
                    Some(on) => TrafficPolicy::Local {
                        ready_endpoint_nodes: on.into_iter().map(|i| format!("n{i}")).collect(),
                    },
                },
                current_ingress: Vec::new(),
            }
        })
}

fn services() -> impl Strategy<Value = Vec<Service>> {
    (0..=6usize).prop_flat_map(|n| (0..n).map(service_at).collect::<Vec<_>>())
}

/// ServiceLB's `podIPs` + `filterByIPFamily` for one Service alone, written from k3s's source
/// (servicelb.go at 0821db5a, L325-L401 and the node selector L584-L596) independently of the
/// module: eligible nodes, External IPs if any else Internal, by family, sorted as strings.
fn servicelb_reference(nodes: &[Node], service: &Service) -> Vec<IpAddr> {
    let enable = nodes.iter().any(|n| n.labels.contains_key(ENABLE_LB_LABEL));
    let pool = service.labels.get(LB_POOL_LABEL).filter(|v| !v.is_empty());
    let serving: Vec<&Node> = nodes
        .iter()
        .filter(|n| {
            !enable
                || (n.labels.get(ENABLE_LB_LABEL).map(String::as_str) == Some("true")
                    && pool.is_none_or(|p| n.labels.get(LB_POOL_LABEL) == Some(p)))
        })
        .filter(|n| n.ready && n.speaker_alive)
        .filter(|n| match &service.traffic {
            TrafficPolicy::Cluster => true,
            TrafficPolicy::Local {
                ready_endpoint_nodes,
            } => ready_endpoint_nodes.contains(&n.name),
        })
        .collect();
    let ext: BTreeSet<String> = serving
        .iter()
        .flat_map(|n| n.external.iter().map(IpAddr::to_string))
        .collect();
    let int: BTreeSet<String> = serving
        .iter()
        .flat_map(|n| n.internal.iter().map(IpAddr::to_string))
        .collect();
    // A BTreeSet of strings iterates in sort.Strings order.
    let chosen = if ext.is_empty() { int } else { ext };
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for family in &service.ip_families {
        if seen.contains(family) {
            continue;
        }
        seen.push(*family);
        out.extend(
            chosen
                .iter()
                .map(|s| ip(s))
                .filter(|a| Family::of(*a) == *family),
        );
    }
    out
}

fn held_pairs(
    services: &[Service],
    out: &BTreeMap<ServiceKey, ServiceOutcome>,
) -> Vec<(IpAddr, ProtocolPort, ServiceKey)> {
    let mut pairs = Vec::new();
    for s in services {
        let mut ports = s.ports.clone();
        ports.sort();
        ports.dedup();
        for &a in &out[&s.key].ingress {
            for &p in &ports {
                pairs.push((a, p, s.key.clone()));
            }
        }
    }
    pairs
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// No (address, port, protocol) is ever held by two Services.
    #[test]
    fn no_pair_is_held_twice(nodes in nodes(), services in services()) {
        let out = compute(&Nodes::new(nodes).unwrap(), &services).unwrap();
        let pairs = held_pairs(&services, &out);
        let mut seen = BTreeMap::new();
        for (a, p, k) in pairs {
            if let Some(other) = seen.insert((a, p), k.clone()) {
                prop_assert!(false, "{p} on {a} held by {other} and {k}");
            }
        }
    }

    /// The outcome does not depend on the order of the nodes or of the Services.
    #[test]
    fn independent_of_input_order(
        (nodes, services, shuffled_nodes, shuffled_services) in (nodes(), services())
            .prop_flat_map(|(n, s)| (Just(n.clone()), Just(s.clone()), Just(n).prop_shuffle(), Just(s).prop_shuffle()))
    ) {
        let a = compute(&Nodes::new(nodes).unwrap(), &services).unwrap();
        let b = compute(&Nodes::new(shuffled_nodes).unwrap(), &shuffled_services).unwrap();
        prop_assert_eq!(a, b);
    }

    /// Alone (nothing held), a Service gets exactly what ServiceLB would have written; with
    /// others, a subset of it, and the first Service in priority order gets all of it.
    #[test]
    fn matches_servicelb_and_conflicts_only_remove(nodes in nodes(), services in services()) {
        let index = Nodes::new(nodes.clone()).unwrap();
        let out = compute(&index, &services).unwrap();
        for s in &services {
            let reference = servicelb_reference(&nodes, s);
            let alone = compute_service(&index, s, &HeldPorts::new()).unwrap();
            prop_assert_eq!(&alone.ingress, &reference, "{} alone", s.key);
            let got = &out[&s.key].ingress;
            prop_assert!(got.iter().all(|a| reference.contains(a)), "{}: {:?} not within {:?}", s.key, got, reference);
            // The order is the reference's order, with holes.
            let positions: Vec<usize> = got.iter().map(|a| reference.iter().position(|r| r == a).unwrap()).collect();
            prop_assert!(positions.windows(2).all(|w| w[0] < w[1]));
        }
        if let Some(first) = services.iter().min_by(|a, b| priority(a, b)) {
            prop_assert_eq!(&out[&first.key].ingress, &servicelb_reference(&nodes, first));
        }
    }

    /// The brief decision (the controller's: no per-node detail, holders kept per port) is the
    /// full one without `listed` and `excluded`, Service by Service in priority order.
    #[test]
    fn the_brief_decision_is_the_full_one_without_its_detail(nodes in nodes(), services in services()) {
        let index = Nodes::new(nodes).unwrap();
        let full = compute(&index, &services).unwrap();
        let mut order: Vec<&Service> = services.iter().collect();
        order.sort_by(|a, b| priority(a, b));
        let mut held = HeldPorts::new();
        for s in order {
            let brief = compute_service_brief(&index, s, &held).unwrap();
            held.hold(s, &brief.ingress);
            let mut expected = full[&s.key].clone();
            expected.listed.clear();
            expected.excluded.clear();
            prop_assert_eq!(brief, expected);
        }
    }

    /// An address is lost only to an earlier Service that really holds the port on it, and then
    /// the loser holds none of its ports there.
    #[test]
    fn a_lost_address_names_a_real_earlier_holder(nodes in nodes(), services in services()) {
        let out = compute(&Nodes::new(nodes).unwrap(), &services).unwrap();
        let by_key: BTreeMap<&ServiceKey, &Service> = services.iter().map(|s| (&s.key, s)).collect();
        for s in &services {
            for e in &out[&s.key].excluded {
                if let Exclusion::PortHeld { address, port, holder } = &e.reason {
                    let h = by_key[holder];
                    prop_assert!(priority(h, s).is_lt());
                    prop_assert!(out[holder].ingress.contains(address));
                    prop_assert!(h.ports.contains(port) && s.ports.contains(port));
                    prop_assert!(!out[&s.key].ingress.contains(address));
                }
            }
        }
    }

    /// Every node is accounted for in every Service's outcome: listed, or excluded with a reason.
    #[test]
    fn every_node_is_listed_or_has_a_reason(nodes in nodes(), services in services()) {
        let out = compute(&Nodes::new(nodes.clone()).unwrap(), &services).unwrap();
        for o in out.values() {
            for n in &nodes {
                prop_assert!(
                    o.listed.contains_key(&n.name) || o.excluded.iter().any(|e| e.node == n.name),
                    "{} has no word on {}", o.service, n.name
                );
            }
            let listed: BTreeSet<IpAddr> = o.listed.values().flatten().copied().collect();
            let ingress: BTreeSet<IpAddr> = o.ingress.iter().copied().collect();
            prop_assert_eq!(listed, ingress);
            prop_assert_eq!(o.ingress.len(), o.ingress.iter().collect::<BTreeSet<_>>().len());
        }
    }

    /// With no `enablelb` label anywhere, a new unlabelled node without an External IP never
    /// takes an address away from any Service. (A node with an External IP can: it switches
    /// Services from Internal to External IPs, as in ServiceLB.)
    #[test]
    fn adding_a_plain_node_never_removes_addresses(
        nodes in nodes(),
        services in services(),
        extra in node_at(MAX_NODES),
    ) {
        let nodes: Vec<Node> = nodes.into_iter().map(|mut n| { n.labels.remove(ENABLE_LB_LABEL); n }).collect();
        let mut extra = extra;
        extra.labels.clear();
        extra.external.clear();
        let before = compute(&Nodes::new(nodes.clone()).unwrap(), &services).unwrap();
        let mut more = nodes;
        more.push(extra);
        let after = compute(&Nodes::new(more).unwrap(), &services).unwrap();
        for s in &services {
            let a: BTreeSet<_> = after[&s.key].ingress.iter().collect();
            prop_assert!(before[&s.key].ingress.iter().all(|x| a.contains(x)), "{} lost an address", s.key);
        }
    }

    /// Reporting the status just computed as the current one yields no status Event: a
    /// ServiceLB-written status that ferrolb computes identically is left alone (migration).
    #[test]
    fn an_identical_status_is_left_alone(nodes in nodes(), services in services()) {
        let index = Nodes::new(nodes).unwrap();
        let first = compute(&index, &services).unwrap();
        let again: Vec<Service> = services.iter().cloned().map(|mut s| {
            s.current_ingress = first[&s.key].ingress_strings();
            s
        }).collect();
        let second = compute(&index, &again).unwrap();
        for o in second.values() {
            prop_assert!(!o.changed(&again.iter().find(|s| s.key == o.service).unwrap().current_ingress));
            prop_assert!(o.events.iter().all(|e| e.reason == ferrolb_config::node_addresses::PORT_HELD_REASON));
        }
    }
}
