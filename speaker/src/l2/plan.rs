//! Layer 2 planning: which node owns each Service IP, and what this node must answer for on which
//! interfaces. A pure function of the configuration, the Services, the nodes and the live
//! speakers: every speaker computes the whole cluster's answer from the same inputs, so they agree
//! on one owner per IP without writing anything to the API server.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use ferrolb_config::allocator::ServiceKey;
use ferrolb_config::model::{Config, L2Advertisement, Pool};
use ferrolb_config::selector::any_matches;

use crate::view::{NodeView, ServiceView};
use ferrolb_layer2::liveness::Member;
use ferrolb_layer2::owner;

/// What this node announces for one IP.
///
/// Sorted vectors rather than sets: a node owning 10,000 IPs keeps one of these per IP, and
/// each set would take a whole tree node (hundreds of bytes) for the one or two entries it
/// nearly always holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Announcement {
    /// Interfaces to answer on (names), sorted, without duplicates.
    pub interfaces: Vec<String>,
    /// Services holding the IP, sorted, without duplicates.
    pub services: Vec<ServiceKey>,
}

/// Why a layer 2 Service is announced by nobody.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unannounced {
    /// No endpoint of the Service serves.
    NoServingEndpoints,
    /// No live speaker on a node that the advertisements select (and, with
    /// `externalTrafficPolicy: Local`, that runs a serving endpoint).
    NoEligibleNode,
}

/// The layer 2 outcome for one Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServiceOutcome {
    /// Announced by this node (its name is shared by the Services of a sharing group).
    Owner(Arc<str>),
    /// Not announced, and why.
    Unannounced(Unannounced),
}

/// The plan: what this node announces, and each layer 2 Service's owner in the whole cluster.
/// The takeover order is not kept here: [`takeover`] computes it when the live report is
/// asked for, so a step costs no O(Services × nodes) memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// IPs this node answers for.
    pub announce: BTreeMap<IpAddr, Announcement>,
    /// Every Service in layer 2 mode (covered by an L2Advertisement) and its outcome.
    pub services: BTreeMap<ServiceKey, ServiceOutcome>,
}

/// Everything planning reads.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    /// The validated configuration.
    pub config: &'a Config,
    /// Nodes by name.
    pub nodes: &'a BTreeMap<String, NodeView>,
    /// Candidate speakers (this one included when it may own IPs) with their usable
    /// interfaces: the quorum rule's verdict (`ferrolb_layer2::quorum`).
    pub members: &'a BTreeMap<String, Member>,
    /// This node's name.
    pub me: &'a str,
}

/// A Service in layer 2 mode, with the advertisements that cover it.
pub(crate) struct Covered<'a> {
    pub(crate) service: &'a ServiceView,
    advertisements: Vec<&'a L2Advertisement>,
}

/// What one sharing group (Services connected by shared IPs) comes to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct GroupPlan {
    /// Each Service's outcome.
    pub outcomes: Vec<(ServiceKey, ServiceOutcome)>,
    /// The owner of the group's IPs, when its serving Services have one.
    pub owner: Option<Arc<str>>,
    /// The key the owner was chosen by (the serving Services' lowest IP, see [`group_key`]);
    /// `None` when no Service of the group serves.
    pub key: Option<IpAddr>,
    /// What this node announces for the group (empty unless it owns it).
    pub announce: BTreeMap<IpAddr, Announcement>,
}

/// Computes the plan.
pub fn plan<'a>(inputs: Inputs<'_>, services: impl IntoIterator<Item = &'a ServiceView>) -> Plan {
    let covered: Vec<Covered<'_>> = services
        .into_iter()
        .filter_map(|service| covering(inputs.config, service))
        .collect();
    let mut plan = Plan::default();
    for group in sharing_groups(&covered) {
        let members: Vec<&Covered<'_>> = group.iter().map(|&i| &covered[i]).collect();
        let g = plan_group(inputs, &members);
        plan.services.extend(g.outcomes);
        plan.announce.extend(g.announce);
    }
    plan
}

/// The plan of one sharing group: who owns its IPs, and what this node announces of them.
pub(crate) fn plan_group(inputs: Inputs<'_>, members: &[&Covered<'_>]) -> GroupPlan {
    let mut out = GroupPlan::default();
    let serving: Vec<&Covered<'_>> = members
        .iter()
        .copied()
        .filter(|c| c.service.any_serving)
        .collect();
    for c in members.iter().filter(|c| !c.service.any_serving) {
        out.outcomes.push((
            c.service.key.clone(),
            ServiceOutcome::Unannounced(Unannounced::NoServingEndpoints),
        ));
    }
    if serving.is_empty() {
        return out;
    }
    let key = lowest_ip(&serving);
    let common = common_candidates(inputs, &serving);
    let owner = owner::choose(&group_key(key), common.iter().copied());
    out.key = key;
    let Some(owner) = owner else {
        for c in &serving {
            out.outcomes.push((
                c.service.key.clone(),
                ServiceOutcome::Unannounced(Unannounced::NoEligibleNode),
            ));
        }
        return out;
    };
    let owner_name: Arc<str> = Arc::from(owner);
    for c in &serving {
        out.outcomes.push((
            c.service.key.clone(),
            ServiceOutcome::Owner(owner_name.clone()),
        ));
    }
    if owner == inputs.me {
        announce(&mut out.announce, inputs, &serving);
        // An IP whose owner has no interface left for it would be a silent black hole; the
        // candidate rules make it impossible, and this keeps the plan honest if they change.
        out.announce.retain(|_, a| !a.interfaces.is_empty());
    }
    out.owner = Some(owner_name);
    out
}

/// For each announced Service, the nodes that may own its IPs in the order they would: the
/// owner first, then who takes over if it goes (`ferrolb_layer2::owner::rank`). What the live
/// report shows; computed when asked for, since it costs a score per node and Service.
pub fn takeover<'a>(
    inputs: Inputs<'_>,
    services: impl IntoIterator<Item = &'a ServiceView>,
) -> BTreeMap<ServiceKey, Vec<String>> {
    let covered: Vec<Covered<'_>> = services
        .into_iter()
        .filter_map(|service| covering(inputs.config, service))
        .collect();
    let mut out = BTreeMap::new();
    for group in sharing_groups(&covered) {
        let serving: Vec<&Covered<'_>> = group
            .iter()
            .map(|&i| &covered[i])
            .filter(|c| c.service.any_serving)
            .collect();
        if serving.is_empty() {
            continue;
        }
        let common = common_candidates(inputs, &serving);
        let key = group_key(lowest_ip(&serving));
        let ranked: Vec<String> = owner::rank(&key, common.iter().copied())
            .into_iter()
            .map(str::to_string)
            .collect();
        if ranked.is_empty() {
            continue;
        }
        for c in &serving {
            out.insert(c.service.key.clone(), ranked.clone());
        }
    }
    out
}

/// The Service with the L2Advertisements that cover it; none when it is not in layer 2 mode.
pub(crate) fn covering<'a>(config: &'a Config, service: &'a ServiceView) -> Option<Covered<'a>> {
    let pool = pool_of(config, service)?;
    let advertisements: Vec<&L2Advertisement> = config
        .l2_advertisements
        .values()
        .filter(|a| a.pools.covers(pool) && any_matches(&a.service_selectors, &service.labels))
        .collect();
    (!advertisements.is_empty()).then_some(Covered {
        service,
        advertisements,
    })
}

/// The nodes that may own the IPs of a group of serving Services sharing them: those eligible
/// for all of them, or, when none is, for any.
fn common_candidates<'a>(inputs: Inputs<'a>, serving: &[&Covered<'_>]) -> BTreeSet<&'a str> {
    let sets: Vec<BTreeSet<&str>> = serving.iter().map(|c| candidates(inputs, c)).collect();
    let mut common = sets.first().cloned().unwrap_or_default();
    for set in sets.iter().skip(1) {
        common = common.intersection(set).copied().collect();
    }
    if common.is_empty() {
        // Services sharing the IP disagree on where it may go: any node eligible for one of
        // them still keeps the IP reachable, and one owner still serves the whole group.
        common = sets.iter().flatten().copied().collect();
    }
    common
}

/// The lowest IP of a group's serving Services, which its owner is chosen by (see
/// [`group_key`]).
fn lowest_ip(serving: &[&Covered<'_>]) -> Option<IpAddr> {
    serving
        .iter()
        .flat_map(|c| c.service.ips.iter())
        .min()
        .copied()
}

/// The key a group's owner is chosen by: the text of its serving Services' lowest IP, so both
/// families of a dual-stack Service and every Service sharing an IP land on the same node.
pub(crate) fn group_key(lowest: Option<IpAddr>) -> String {
    lowest.map(|ip| ip.to_string()).unwrap_or_default()
}

/// Adds to `announce` the IPs of `serving`, which this node owns, with the interfaces to answer
/// on: those of this node's usable interfaces that the advertisements selecting it name.
fn announce(
    announce: &mut BTreeMap<IpAddr, Announcement>,
    inputs: Inputs<'_>,
    serving: &[&Covered<'_>],
) {
    let mine = inputs
        .members
        .get(inputs.me)
        .map(|m| &m.interfaces)
        .cloned()
        .unwrap_or_default();
    let me_node = inputs.nodes.get(inputs.me);
    for c in serving {
        let mut interfaces = BTreeSet::new();
        for adv in &c.advertisements {
            if !me_node.is_some_and(|n| any_matches(&adv.node_selectors, &n.labels)) {
                continue;
            }
            if adv.interfaces.is_empty() {
                interfaces.extend(mine.iter().cloned());
            } else {
                interfaces.extend(adv.interfaces.iter().filter(|i| mine.contains(*i)).cloned());
            }
        }
        for ip in &c.service.ips {
            let entry = announce.entry(*ip).or_insert_with(|| Announcement {
                interfaces: Vec::new(),
                services: Vec::new(),
            });
            for interface in &interfaces {
                if let Err(at) = entry.interfaces.binary_search(interface) {
                    entry.interfaces.insert(at, interface.clone());
                }
            }
            if let Err(at) = entry.services.binary_search(&c.service.key) {
                entry.services.insert(at, c.service.key.clone());
            }
        }
    }
}

/// The pool holding the Service's IPs (the controller allocates all of them from one pool).
fn pool_of<'a>(config: &'a Config, service: &ServiceView) -> Option<&'a Pool> {
    let first = service.ips.first()?;
    config.pools.values().find(|p| p.contains(*first))
}

/// Nodes that may announce the Service: see [`eligible`].
fn candidates<'a>(inputs: Inputs<'a>, covered: &Covered<'_>) -> BTreeSet<&'a str> {
    inputs
        .members
        .keys()
        .filter(|name| eligible(inputs, covered, name))
        .map(String::as_str)
        .collect()
}

/// Whether `name` may announce the Service: a live speaker, allowed by the node's conditions
/// and labels, selected by an advertisement with an interface to use there, and with
/// `externalTrafficPolicy: Local` a serving endpoint on it.
pub(crate) fn eligible(inputs: Inputs<'_>, covered: &Covered<'_>, name: &str) -> bool {
    let (Some(member), Some(node)) = (inputs.members.get(name), inputs.nodes.get(name)) else {
        return false;
    };
    node.may_announce()
        && (!covered.service.local_traffic || covered.service.serving_nodes.contains(name))
        && covered.advertisements.iter().any(|adv| {
            any_matches(&adv.node_selectors, &node.labels)
                && if member.interfaces_unknown {
                    true
                } else if adv.interfaces.is_empty() {
                    !member.interfaces.is_empty()
                } else {
                    adv.interfaces.iter().any(|i| member.interfaces.contains(i))
                }
        })
}

/// Groups of Services connected by shared IPs (indices into `covered`), in a stable order.
fn sharing_groups(covered: &[Covered<'_>]) -> Vec<Vec<usize>> {
    let mut parent: Vec<usize> = (0..covered.len()).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    let mut first_holder: BTreeMap<IpAddr, usize> = BTreeMap::new();
    for (i, c) in covered.iter().enumerate() {
        for ip in &c.service.ips {
            match first_holder.get(ip) {
                Some(&j) => {
                    let (a, b) = (root(&mut parent, i), root(&mut parent, j));
                    parent[a] = b;
                }
                None => {
                    first_holder.insert(*ip, i);
                }
            }
        }
    }
    let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for i in 0..covered.len() {
        let r = root(&mut parent, i);
        groups.entry(r).or_default().push(i);
    }
    groups.into_values().collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::view::ServiceObject;
    use ferrolb_config::model::PoolSelection;
    use ferrolb_config::selector::Selector;
    use ferrolb_testkit::model::pool;
    use proptest::prelude::*;

    fn config(advs: Vec<L2Advertisement>) -> Config {
        let mut c = Config::default();
        c.pools.insert(
            "l2".into(),
            pool("l2", &["198.18.200.0/24", "fd00:18::c8:0/112"]),
        );
        c.pools
            .insert("other".into(), pool("other", &["198.18.201.0/24"]));
        for a in advs {
            c.l2_advertisements.insert(a.name.clone(), a);
        }
        c
    }

    fn adv(name: &str) -> L2Advertisement {
        L2Advertisement {
            name: name.into(),
            pools: PoolSelection {
                names: ["l2".to_string()].into(),
                selectors: vec![],
            },
            ..Default::default()
        }
    }

    fn nodes(n: usize) -> BTreeMap<String, NodeView> {
        (1..=n)
            .map(|i| {
                let name = format!("node{i}");
                let view = NodeView {
                    name: name.clone(),
                    labels: [("zone".to_string(), format!("z{}", i % 2))].into(),
                    ..Default::default()
                };
                (name, view)
            })
            .collect()
    }

    fn members(names: &[&str]) -> BTreeMap<String, Member> {
        names
            .iter()
            .map(|n| {
                (
                    n.to_string(),
                    Member {
                        interfaces: ["eth0".to_string(), "eth1".to_string()].into(),
                        interfaces_unknown: false,
                    },
                )
            })
            .collect()
    }

    fn svc(name: &str, ips: &[&str]) -> ServiceView {
        ServiceView {
            service: Arc::new(ServiceObject {
                key: ServiceKey::new("ns", name),
                labels: [("app".to_string(), name.to_string())].into(),
                ips: {
                    let mut v: Vec<IpAddr> = ips.iter().map(|i| i.parse().unwrap()).collect();
                    v.sort();
                    v
                },
                local_traffic: false,
                uid: None,
            }),
            serving_nodes: ["node1".to_string()].into(),
            any_serving: true,
        }
    }

    fn owner_of(plan: &Plan, name: &str) -> Option<String> {
        match plan.services.get(&ServiceKey::new("ns", name))? {
            ServiceOutcome::Owner(o) => Some(o.to_string()),
            ServiceOutcome::Unannounced(_) => None,
        }
    }

    /// Plans as every node would and checks they agree; returns the plan of `node1`'s view
    /// and which node announces each IP.
    fn plan_all(
        config: &Config,
        nodes: &BTreeMap<String, NodeView>,
        members: &BTreeMap<String, Member>,
        services: &[ServiceView],
    ) -> (Plan, BTreeMap<IpAddr, Vec<String>>) {
        let mut announcers: BTreeMap<IpAddr, Vec<String>> = BTreeMap::new();
        let mut first: Option<Plan> = None;
        for me in nodes.keys() {
            let p = plan(
                Inputs {
                    config,
                    nodes,
                    members,
                    me,
                },
                services,
            );
            for ip in p.announce.keys() {
                announcers.entry(*ip).or_default().push(me.clone());
            }
            if let Some(f) = &first {
                assert_eq!(f.services, p.services, "nodes disagree");
            } else {
                first = Some(p);
            }
        }
        (first.unwrap_or_default(), announcers)
    }

    /// The takeover order as node1 would report it.
    fn order(
        config: &Config,
        nodes: &BTreeMap<String, NodeView>,
        members: &BTreeMap<String, Member>,
        services: &[ServiceView],
    ) -> BTreeMap<ServiceKey, Vec<String>> {
        let inputs = Inputs {
            config,
            nodes,
            members,
            me: "node1",
        };
        takeover(inputs, services)
    }

    #[test]
    fn one_owner_per_ip_and_dual_stack_together() {
        let c = config(vec![adv("a")]);
        let n = nodes(3);
        let m = members(&["node1", "node2", "node3"]);
        let services: Vec<ServiceView> = (0..20)
            .map(|i| {
                svc(
                    &format!("s{i}"),
                    &[&format!("198.18.200.{i}"), &format!("fd00:18::c8:{i:x}")],
                )
            })
            .collect();
        let (p, announcers) = plan_all(&c, &n, &m, &services);
        assert_eq!(announcers.len(), 40);
        for (ip, nodes) in &announcers {
            assert_eq!(nodes.len(), 1, "{ip} announced by {nodes:?}");
        }
        for s in &services {
            let owners: BTreeSet<&String> = s.ips.iter().map(|ip| &announcers[ip][0]).collect();
            assert_eq!(owners.len(), 1, "{:?} split over {owners:?}", s.key);
        }
        let per_node: BTreeSet<&str> = p
            .services
            .values()
            .filter_map(|o| match o {
                ServiceOutcome::Owner(o) => Some(&**o),
                _ => None,
            })
            .collect();
        assert_eq!(per_node.len(), 3, "20 Services should land on all 3 nodes");
    }

    #[test]
    fn shared_ip_has_one_owner() {
        let c = config(vec![adv("a")]);
        let n = nodes(3);
        let m = members(&["node1", "node2", "node3"]);
        let a = svc("a", &["198.18.200.7"]);
        let b = svc("b", &["198.18.200.7", "fd00:18::c8:1"]);
        let (p, announcers) = plan_all(&c, &n, &m, &[a, b]);
        assert_eq!(owner_of(&p, "a"), owner_of(&p, "b"));
        assert_eq!(announcers.len(), 2);
        let a7: IpAddr = "198.18.200.7".parse().unwrap();
        assert_eq!(announcers[&a7].len(), 1);
    }

    #[test]
    fn local_traffic_goes_to_a_node_with_an_endpoint() {
        let c = config(vec![adv("a")]);
        let n = nodes(3);
        let m = members(&["node1", "node2", "node3"]);
        for i in 0..20 {
            let mut s = svc(&format!("s{i}"), &[&format!("198.18.200.{i}")]);
            s.local_traffic = true;
            s.serving_nodes = ["node3".to_string()].into();
            let (p, _) = plan_all(&c, &n, &m, std::slice::from_ref(&s));
            assert_eq!(owner_of(&p, &format!("s{i}")).as_deref(), Some("node3"));
            // Only node3 may take it: nobody else is in line.
            assert_eq!(
                order(&c, &n, &m, std::slice::from_ref(&s))[&s.key],
                ["node3"]
            );
        }
        let mut s = svc("x", &["198.18.200.99"]);
        s.local_traffic = true;
        s.serving_nodes = ["node9".to_string()].into();
        let (p, _) = plan_all(&c, &n, &m, &[s]);
        assert_eq!(
            p.services[&ServiceKey::new("ns", "x")],
            ServiceOutcome::Unannounced(Unannounced::NoEligibleNode)
        );
    }

    #[test]
    fn no_serving_endpoint_no_announcement() {
        let c = config(vec![adv("a")]);
        let mut s = svc("x", &["198.18.200.1"]);
        s.any_serving = false;
        s.serving_nodes.clear();
        let (p, announcers) = plan_all(&c, &nodes(2), &members(&["node1", "node2"]), &[s]);
        assert!(announcers.is_empty());
        assert_eq!(
            p.services[&ServiceKey::new("ns", "x")],
            ServiceOutcome::Unannounced(Unannounced::NoServingEndpoints)
        );
    }

    #[test]
    fn selectors_conditions_and_exclusion() {
        let mut a = adv("a");
        a.node_selectors = vec![Selector::from_labels([("zone", "z0")])];
        let c = config(vec![a]);
        let mut n = nodes(4); // node2 and node4 are in z0
        let m = members(&["node1", "node2", "node3", "node4"]);
        let services: Vec<ServiceView> = (0..20)
            .map(|i| svc(&format!("s{i}"), &[&format!("198.18.200.{i}")]))
            .collect();
        let (p, _) = plan_all(&c, &n, &m, &services);
        for o in p.services.values() {
            assert!(
                matches!(o, ServiceOutcome::Owner(o) if &**o == "node2" || &**o == "node4"),
                "{o:?}"
            );
        }
        n.get_mut("node2").unwrap().network_unavailable = true;
        n.get_mut("node4").unwrap().excluded = true;
        let (p, announcers) = plan_all(&c, &n, &m, &services);
        assert!(announcers.is_empty());
        assert!(
            p.services
                .values()
                .all(|o| *o == ServiceOutcome::Unannounced(Unannounced::NoEligibleNode))
        );
    }

    #[test]
    fn service_selectors_and_pools_decide_coverage() {
        let mut a = adv("a");
        a.service_selectors = vec![Selector::from_labels([("app", "s1")])];
        let c = config(vec![a]);
        let services = vec![
            svc("s1", &["198.18.200.1"]),
            svc("s2", &["198.18.200.2"]),
            svc("s3", &["198.18.201.3"]),
        ];
        let (p, _) = plan_all(&c, &nodes(2), &members(&["node1", "node2"]), &services);
        assert_eq!(p.services.len(), 1, "only s1 is in layer 2 mode");
        assert!(owner_of(&p, "s1").is_some());
    }

    #[test]
    fn interface_lists_are_respected() {
        let mut a = adv("a");
        a.interfaces = vec!["eth1".into()];
        let c = config(vec![a]);
        let n = nodes(2);
        let mut m = members(&["node1", "node2"]);
        m.get_mut("node1").unwrap().interfaces = ["eth0".to_string()].into();
        for i in 0..10 {
            let s = svc(&format!("s{i}"), &[&format!("198.18.200.{i}")]);
            let p = plan(
                Inputs {
                    config: &c,
                    nodes: &n,
                    members: &m,
                    me: "node2",
                },
                [&s],
            );
            // node1 has no eth1: node2 owns everything, on eth1 only.
            let a = &p.announce[&s.ips[0]];
            assert_eq!(a.interfaces, ["eth1"]);
        }
    }

    #[test]
    fn dead_speakers_lose_only_their_share() {
        let c = config(vec![adv("a")]);
        let n = nodes(3);
        let services: Vec<ServiceView> = (0..30)
            .map(|i| svc(&format!("s{i}"), &[&format!("198.18.200.{i}")]))
            .collect();
        let all = members(&["node1", "node2", "node3"]);
        let (before, _) = plan_all(&c, &n, &all, &services);
        let line = order(&c, &n, &all, &services);
        let (after, _) = plan_all(&c, &n, &members(&["node1", "node3"]), &services);
        for (key, outcome) in &before.services {
            if *outcome != ServiceOutcome::Owner("node2".into()) {
                assert_eq!(outcome, &after.services[key]);
            } else {
                assert_ne!(after.services[key], ServiceOutcome::Owner("node2".into()));
                // The IP goes to the second in line the plan showed before node2 died.
                let second = &line[key][1];
                assert_eq!(
                    after.services[key],
                    ServiceOutcome::Owner(second.as_str().into())
                );
            }
        }
    }

    proptest! {
        /// Every node plans from its own view, as the quorum rule leaves it after one faulty
        /// node (any of its links cut, either way): no IP ever has two announcers, and with the
        /// faulty node cut off entirely from three or more, every IP has one.
        #[test]
        fn one_faulty_node_never_gives_an_ip_two_announcers(
            n in 2usize..=5,
            faulty in 0usize..5,
            cut_out in prop::collection::vec(any::<bool>(), 5),
            cut_in in prop::collection::vec(any::<bool>(), 5),
            ips in prop::collection::vec((0u8..40, any::<bool>()), 1..20),
        ) {
            use ferrolb_layer2::quorum;
            let f = faulty % n;
            let link = |a: usize, b: usize| !((a == f && cut_out[b]) || (b == f && cut_in[a]));
            let names: Vec<String> = (1..=n).map(|i| format!("node{i}")).collect();
            let known: BTreeSet<String> = names.iter().cloned().collect();
            let verdicts = quorum::settle(&names, &link, &|_| known.clone(), 6);
            let c = config(vec![adv("a")]);
            let nodes = nodes(n);
            let services: Vec<ServiceView> = ips.iter().enumerate().map(|(i, (ip, v6))| {
                let ip = if *v6 { format!("fd00:18::c8:{ip:x}") } else { format!("198.18.200.{ip}") };
                svc(&format!("s{i}"), &[&ip])
            }).collect();
            let mut announcers: BTreeMap<IpAddr, Vec<&str>> = BTreeMap::new();
            for (i, me) in names.iter().enumerate() {
                let members = crate::l2::step::members(&verdicts[i], me, verdicts[i].acts());
                let p = plan(Inputs { config: &c, nodes: &nodes, members: &members, me }, &services);
                for ip in p.announce.keys() {
                    announcers.entry(*ip).or_default().push(me);
                }
            }
            for (ip, who) in &announcers {
                prop_assert!(who.len() <= 1, "{} announced by {:?}", ip, who);
            }
            let cut_off = (0..n).filter(|&p| p != f).all(|p| !link(p, f) && !link(f, p));
            if cut_off && n >= 3 {
                let all: BTreeSet<IpAddr> = services.iter().flat_map(|s| s.ips.iter().copied()).collect();
                prop_assert_eq!(announcers.len(), all.len());
            }
        }

        #[test]
        fn every_view_agrees_and_each_ip_has_at_most_one_announcer(
            live in prop::collection::btree_set(1usize..=5, 0..=5),
            ips in prop::collection::vec((0u8..40, any::<bool>()), 1..30),
            local in prop::collection::vec(prop::option::of(1usize..=5), 30),
        ) {
            let c = config(vec![adv("a")]);
            let n = nodes(5);
            let names: Vec<String> = live.iter().map(|i| format!("node{i}")).collect();
            let m = members(&names.iter().map(String::as_str).collect::<Vec<_>>());
            let services: Vec<ServiceView> = ips.iter().enumerate().map(|(i, (ip, v6))| {
                let ip = if *v6 { format!("fd00:18::c8:{ip:x}") } else { format!("198.18.200.{ip}") };
                let mut s = svc(&format!("s{i}"), &[&ip]);
                if let Some(node) = local[i] {
                    s.local_traffic = true;
                    s.serving_nodes = [format!("node{node}")].into();
                }
                s
            }).collect();
            let (_, announcers) = plan_all(&c, &n, &m, &services);
            for nodes in announcers.values() {
                prop_assert_eq!(nodes.len(), 1);
                prop_assert!(names.contains(&nodes[0]));
            }
        }
    }
}
