//! What this node advertises to which BGP peer: a pure function of the configuration, the
//! Services and the Nodes.
//!
//! The rule (docs/architecture.md, "BGP"): a node advertises a Service's IP to a peer when a
//! BGPAdvertisement covers the IP's pool, selects this node and the Service, the peer is selected
//! for this node (its `nodeSelectors`) and named in the advertisement's `peers` (when that list is
//! set); this node is not `NetworkUnavailable` nor excluded; with `externalTrafficPolicy:
//! Cluster` some endpoint serves, with `Local` an endpoint serves on this node. Every eligible
//! node advertises, so the router spreads traffic over them (ECMP).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv6Addr};

use ferrolb_bgp::packet::{Community, LargeCommunity};
use ferrolb_config::allocator::ServiceKey;
use ferrolb_config::model::{CommunityValue, Config, Peer};
use ferrolb_config::selector::any_matches;
use ipnet::IpNet;

use crate::view::{NodeView, ServiceView};

/// The attributes of one planned prefix; defined with the Adj-RIB-Out that holds them.
pub use ferrolb_bgp::adj_out::RouteAttributes;

/// What to advertise to one peer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerPlan {
    /// Prefixes with their attributes.
    pub routes: BTreeMap<IpNet, RouteAttributes>,
}

/// This node's BGP plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Every peer this node keeps a session with (selected for the node), by BGPPeer name, with
    /// what it advertises there (possibly nothing).
    pub peers: BTreeMap<String, PeerPlan>,
    /// Per Service, the peers it is advertised to (for ServiceBGPStatus and metrics).
    pub services: BTreeMap<ServiceKey, BTreeSet<String>>,
    /// This node's first IPv6 address, the next hop of IPv6 prefixes over IPv4 sessions.
    pub node_ipv6: Option<Ipv6Addr>,
}

/// Inputs of [`plan`].
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    /// The validated configuration.
    pub config: &'a Config,
    /// Every node, by name.
    pub nodes: &'a BTreeMap<String, NodeView>,
    /// This node's name.
    pub me: &'a str,
}

/// Whether `peer` keeps a session with `node` (its `nodeSelectors`).
pub fn peer_selects(peer: &Peer, node: &NodeView) -> bool {
    any_matches(&peer.node_selectors, &node.labels)
}

/// Plans what this node advertises to each of its peers.
pub fn plan<'a>(inputs: Inputs<'_>, services: impl IntoIterator<Item = &'a ServiceView>) -> Plan {
    let Inputs { config, nodes, me } = inputs;
    let mut out = Plan::default();
    // A node that is not (yet) a Node object keeps no session: nothing selects it.
    let Some(node) = nodes.get(me) else {
        return out;
    };
    out.node_ipv6 = node.addresses.iter().find_map(|a| match a {
        IpAddr::V6(v6) if !v6.is_loopback() && !v6.is_unicast_link_local() => Some(*v6),
        _ => None,
    });
    let peers: Vec<&Peer> = config
        .peers
        .values()
        .filter(|p| peer_selects(p, node))
        .collect();
    for p in &peers {
        out.peers.insert(p.name.clone(), PeerPlan::default());
    }
    // Sessions stay up on an unavailable or excluded node; it only stops attracting traffic.
    // With no peer or no advertisement no route goes anywhere: no pass over the Services (a
    // layer-2-only cluster pays nothing here per step).
    if node.network_unavailable
        || node.excluded
        || peers.is_empty()
        || config.bgp_advertisements.is_empty()
    {
        return out;
    }
    for service in services {
        let serves = if service.local_traffic {
            service.serving_nodes.contains(me)
        } else {
            service.any_serving
        };
        if !serves {
            continue;
        }
        for ip in &service.ips {
            let Some(pool) = config.pools.values().find(|p| p.contains(*ip)) else {
                continue;
            };
            for adv in config.bgp_advertisements.values() {
                if !adv.pools.covers(pool)
                    || !any_matches(&adv.node_selectors, &node.labels)
                    || !any_matches(&adv.service_selectors, &service.labels)
                {
                    continue;
                }
                let len = match ip {
                    IpAddr::V4(_) => adv.aggregation_length,
                    IpAddr::V6(_) => adv.aggregation_length_v6,
                };
                let Ok(prefix) = IpNet::new(*ip, len) else {
                    continue;
                };
                let prefix = prefix.trunc();
                let (communities, large_communities) = split_communities(&adv.communities);
                for peer in peers
                    .iter()
                    .filter(|p| adv.peers.is_empty() || adv.peers.contains(&p.name))
                {
                    let attrs = RouteAttributes {
                        local_pref: adv.local_pref.filter(|_| peer.is_ibgp()),
                        communities: communities.clone(),
                        large_communities: large_communities.clone(),
                    };
                    let routes = &mut out.peers.entry(peer.name.clone()).or_default().routes;
                    match routes.get_mut(&prefix) {
                        Some(existing) => existing.merge(attrs),
                        None => {
                            routes.insert(prefix, attrs);
                        }
                    }
                    out.services
                        .entry(service.key.clone())
                        .or_default()
                        .insert(peer.name.clone());
                }
            }
        }
    }
    out
}

fn split_communities(
    values: &BTreeSet<CommunityValue>,
) -> (BTreeSet<Community>, BTreeSet<LargeCommunity>) {
    let mut standard = BTreeSet::new();
    let mut large = BTreeSet::new();
    for v in values {
        match *v {
            CommunityValue::Standard(a, b) => {
                standard.insert(Community::new(a, b));
            }
            CommunityValue::Large(global_admin, local_data_1, local_data_2) => {
                large.insert(LargeCommunity {
                    global_admin,
                    local_data_1,
                    local_data_2,
                });
            }
        }
    }
    (standard, large)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::view::ServiceObject;
    use ferrolb_config::model::{BgpAdvertisement, PeerAsn, PoolSelection};
    use ferrolb_config::selector::Selector;
    use ferrolb_testkit::model::{self, pool};
    use proptest::prelude::*;
    use std::sync::Arc;

    fn adv(name: &str, pools: &[&str]) -> BgpAdvertisement {
        BgpAdvertisement {
            name: name.into(),
            aggregation_length: 32,
            aggregation_length_v6: 128,
            local_pref: None,
            communities: BTreeSet::new(),
            pools: PoolSelection {
                names: pools.iter().map(|p| p.to_string()).collect(),
                selectors: vec![],
            },
            node_selectors: vec![],
            peers: BTreeSet::new(),
            service_selectors: vec![],
        }
    }

    fn peer(name: &str, my: u32, asn: PeerAsn, addr: &str) -> Peer {
        model::peer(name, addr).my_asn(my).peer_asn(asn).build()
    }

    fn config(advs: Vec<BgpAdvertisement>, peers: Vec<Peer>) -> Config {
        let mut c = Config::default();
        c.pools.insert(
            "bgp".into(),
            pool("bgp", &["198.18.200.0/24", "fd00:18::c8:0/112"]),
        );
        c.pools
            .insert("other".into(), pool("other", &["198.18.201.0/24"]));
        for a in advs {
            c.bgp_advertisements.insert(a.name.clone(), a);
        }
        for p in peers {
            c.peers.insert(p.name.clone(), p);
        }
        c
    }

    fn nodes() -> BTreeMap<String, NodeView> {
        (1..=3)
            .map(|i| {
                let name = format!("node{i}");
                let view = NodeView {
                    name: name.clone(),
                    labels: [("zone".to_string(), format!("z{}", i % 2))].into(),
                    addresses: vec![
                        format!("198.18.0.{i}").parse().unwrap(),
                        format!("fd00:18::{i}").parse().unwrap(),
                    ],
                    ..Default::default()
                };
                (name, view)
            })
            .collect()
    }

    fn svc(name: &str, ips: &[&str]) -> ServiceView {
        ServiceView {
            service: Arc::new(ServiceObject {
                key: ServiceKey::new("ns", name),
                labels: [("app".to_string(), name.to_string())].into(),
                ips: ips.iter().map(|i| i.parse().unwrap()).collect(),
                local_traffic: false,
                uid: None,
            }),
            serving_nodes: ["node1".to_string()].into(),
            any_serving: true,
        }
    }

    fn run(c: &Config, n: &BTreeMap<String, NodeView>, me: &str, s: &[ServiceView]) -> Plan {
        plan(
            Inputs {
                config: c,
                nodes: n,
                me,
            },
            s,
        )
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn ebgp() -> Peer {
        peer("r1", 64512, PeerAsn::Fixed(64500), "198.18.0.254")
    }

    #[test]
    fn both_families_with_aggregation_and_communities() {
        let mut a = adv("a", &["bgp"]);
        a.aggregation_length = 24;
        a.aggregation_length_v6 = 64;
        a.communities = [
            CommunityValue::Standard(64512, 100),
            CommunityValue::Large(64512, 1, 2),
        ]
        .into();
        a.local_pref = Some(200);
        let c = config(vec![a], vec![ebgp()]);
        let p = run(
            &c,
            &nodes(),
            "node2",
            &[svc("s", &["198.18.200.7", "fd00:18::c8:5"])],
        );
        let routes = &p.peers["r1"].routes;
        assert_eq!(
            routes.keys().copied().collect::<Vec<_>>(),
            vec![net("198.18.200.0/24"), net("fd00:18::/64")]
        );
        let attrs = &routes[&net("198.18.200.0/24")];
        // eBGP: no LOCAL_PREF.
        assert_eq!(attrs.local_pref, None);
        assert_eq!(
            attrs.communities,
            [Community::new(64512, 100)].into_iter().collect()
        );
        assert_eq!(attrs.large_communities.len(), 1);
        assert_eq!(p.node_ipv6, Some("fd00:18::2".parse().unwrap()));
        assert_eq!(
            p.services[&ServiceKey::new("ns", "s")],
            ["r1".to_string()].into()
        );
    }

    #[test]
    fn local_pref_only_towards_ibgp() {
        let mut a = adv("a", &["bgp"]);
        a.local_pref = Some(150);
        let ibgp = peer("in", 64512, PeerAsn::Fixed(64512), "198.18.0.253");
        let dyn_in = peer("dyn", 64512, PeerAsn::Internal, "198.18.0.252");
        let c = config(vec![a], vec![ebgp(), ibgp, dyn_in]);
        let p = run(&c, &nodes(), "node1", &[svc("s", &["198.18.200.7"])]);
        let ip = net("198.18.200.7/32");
        assert_eq!(p.peers["r1"].routes[&ip].local_pref, None);
        assert_eq!(p.peers["in"].routes[&ip].local_pref, Some(150));
        assert_eq!(p.peers["dyn"].routes[&ip].local_pref, Some(150));
    }

    #[test]
    fn peers_list_and_peer_node_selectors() {
        let mut a = adv("a", &["bgp"]);
        a.peers = ["r2".to_string()].into();
        let mut r2 = peer("r2", 64512, PeerAsn::External, "198.18.0.253");
        r2.node_selectors = vec![Selector::from_labels([("zone", "z1")])];
        let c = config(vec![a], vec![ebgp(), r2]);
        let s = [svc("s", &["198.18.200.7"])];
        // node1 is in z1: sessions with both, routes only to r2.
        let p = run(&c, &nodes(), "node1", &s);
        assert!(p.peers["r1"].routes.is_empty());
        assert_eq!(p.peers["r2"].routes.len(), 1);
        // node2 is in z0: no session with r2 at all.
        let p = run(&c, &nodes(), "node2", &s);
        assert!(!p.peers.contains_key("r2"));
        assert!(p.peers["r1"].routes.is_empty());
        assert!(p.services.is_empty());
    }

    #[test]
    fn node_and_service_selectors_and_pool_coverage() {
        let mut a = adv("a", &["bgp"]);
        a.node_selectors = vec![Selector::from_labels([("zone", "z0")])];
        a.service_selectors = vec![Selector::from_labels([("app", "yes")])];
        let c = config(vec![a], vec![ebgp()]);
        let s = [
            svc("yes", &["198.18.200.1"]),
            svc("no", &["198.18.200.2"]),
            // Selected Service, but its pool is not covered.
            {
                let mut o = svc("yes", &["198.18.201.1"]);
                o.key = ServiceKey::new("ns", "other");
                o
            },
        ];
        let p = run(&c, &nodes(), "node2", &s);
        assert_eq!(
            p.peers["r1"].routes.keys().copied().collect::<Vec<_>>(),
            vec![net("198.18.200.1/32")]
        );
        let p = run(&c, &nodes(), "node1", &s);
        assert!(p.peers["r1"].routes.is_empty());
    }

    #[test]
    fn unavailable_excluded_and_endpoints() {
        let c = config(vec![adv("a", &["bgp"])], vec![ebgp()]);
        let mut n = nodes();
        n.get_mut("node2").unwrap().network_unavailable = true;
        n.get_mut("node3").unwrap().excluded = true;
        let s = [svc("s", &["198.18.200.1"])];
        assert!(run(&c, &n, "node2", &s).peers["r1"].routes.is_empty());
        assert!(run(&c, &n, "node3", &s).peers["r1"].routes.is_empty());
        assert_eq!(run(&c, &n, "node1", &s).peers["r1"].routes.len(), 1);
        // Unknown node: no sessions.
        assert!(run(&c, &n, "ghost", &s).peers.is_empty());

        let n = nodes();
        let mut local = svc("l", &["198.18.200.2"]);
        local.local_traffic = true;
        assert_eq!(
            run(&c, &n, "node1", &[local.clone()]).peers["r1"]
                .routes
                .len(),
            1
        );
        assert!(run(&c, &n, "node2", &[local]).peers["r1"].routes.is_empty());
        let mut idle = svc("i", &["198.18.200.3"]);
        idle.any_serving = false;
        idle.serving_nodes.clear();
        assert!(run(&c, &n, "node1", &[idle]).peers["r1"].routes.is_empty());
    }

    #[test]
    fn overlapping_advertisements_merge_communities() {
        let mut a = adv("a", &["bgp"]);
        a.communities = [CommunityValue::Standard(1, 1)].into();
        let mut b = adv("b", &["bgp"]);
        b.communities = [CommunityValue::Standard(2, 2)].into();
        b.aggregation_length = 24;
        let c = config(vec![a, b], vec![ebgp()]);
        let p = run(&c, &nodes(), "node1", &[svc("s", &["198.18.200.9"])]);
        let routes = &p.peers["r1"].routes;
        assert_eq!(routes.len(), 2);
        assert_eq!(
            routes[&net("198.18.200.9/32")].communities,
            [Community::new(1, 1)].into()
        );
        let c = config(vec![a_with(1), a_with(2)], vec![ebgp()]);
        let p = run(&c, &nodes(), "node1", &[svc("s", &["198.18.200.9"])]);
        assert_eq!(
            p.peers["r1"].routes[&net("198.18.200.9/32")].communities,
            [Community::new(1, 1), Community::new(2, 2)].into()
        );
    }

    fn a_with(n: u16) -> BgpAdvertisement {
        let mut a = adv(&format!("a{n}"), &["bgp"]);
        a.communities = [CommunityValue::Standard(n, n)].into();
        a
    }

    proptest! {
        /// Every advertised prefix holds an IP of a Service that serves from this node's point
        /// of view, is truncated to the aggregation length, and only iBGP peers get LOCAL_PREF.
        #[test]
        fn prefixes_come_from_services_and_respect_rules(
            hosts in proptest::collection::vec((0u8..=255, any::<bool>(), any::<bool>(), any::<bool>()), 0..12),
            agg in 24u8..=32,
            agg6 in 100u8..=128,
            me in 1usize..=3,
            pref in proptest::option::of(any::<u32>()),
        ) {
            let mut a = adv("a", &["bgp"]);
            a.aggregation_length = agg;
            a.aggregation_length_v6 = agg6;
            a.local_pref = pref;
            let ibgp = peer("in", 64512, PeerAsn::Internal, "198.18.0.253");
            let c = config(vec![a], vec![ebgp(), ibgp]);
            let me = format!("node{me}");
            let services: Vec<ServiceView> = hosts
                .iter()
                .enumerate()
                .map(|(i, (h, v6, local, serving))| {
                    let ip = if *v6 { format!("fd00:18::c8:{h:x}") } else { format!("198.18.200.{h}") };
                    let mut s = svc(&format!("s{i}"), &[&ip]);
                    s.local_traffic = *local;
                    s.any_serving = *serving;
                    if !serving { s.serving_nodes.clear(); }
                    s
                })
                .collect();
            let p = run(&c, &nodes(), &me, &services);
            prop_assert_eq!(p.peers.len(), 2);
            for (name, pp) in &p.peers {
                for (prefix, attrs) in &pp.routes {
                    let expected_len = match prefix { IpNet::V4(_) => agg, IpNet::V6(_) => agg6 };
                    prop_assert_eq!(prefix.prefix_len(), expected_len);
                    prop_assert_eq!(*prefix, prefix.trunc());
                    let from_a_service = services.iter().any(|s| {
                        let serves = if s.local_traffic { s.serving_nodes.contains(&me) } else { s.any_serving };
                        serves && s.ips.iter().any(|ip| prefix.contains(ip))
                    });
                    prop_assert!(from_a_service, "{} comes from no serving Service", prefix);
                    if name == "r1" { prop_assert_eq!(attrs.local_pref, None); }
                    else { prop_assert_eq!(attrs.local_pref, pref); }
                }
                // Both peers get the same prefixes: the advertisement names no peer.
                prop_assert_eq!(
                    pp.routes.keys().collect::<Vec<_>>(),
                    p.peers["r1"].routes.keys().collect::<Vec<_>>()
                );
            }
            // Every serving Service's IPs are covered (others may be, by an aggregate).
            for s in &services {
                let serves = if s.local_traffic { s.serving_nodes.contains(&me) } else { s.any_serving };
                for ip in &s.ips {
                    let covered = p.peers["r1"].routes.keys().any(|n| n.contains(ip));
                    prop_assert!(covered || !serves);
                }
            }
        }
    }
}
