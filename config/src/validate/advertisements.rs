//! L2Advertisement and BGPAdvertisement rules: references, selectors, aggregation, communities
//! and LOCAL_PREF conflicts.

use std::collections::{BTreeMap, BTreeSet};

use super::communities::parse_community;
use super::{Kind, NodeInfo, ObjectRef, Report, by_age, compile_selectors, share_a_node};
use crate::address::Family;
use crate::crd::{BGPAdvertisement, BGPAdvertisementSpec, BGPPeer, IPAddressPool, L2Advertisement};
use crate::model::{self, CommunityValue, Pool, PoolSelection};
use crate::selector::Selector;

fn pool_selection(
    report: &mut Report,
    me: &ObjectRef,
    names: &[String],
    selectors: &[crate::crd::LabelSelector],
    pool_objects: &[IPAddressPool],
) -> PoolSelection {
    let known: BTreeSet<&str> = pool_objects
        .iter()
        .filter_map(|p| p.metadata.name.as_deref())
        .collect();
    let mut set = BTreeSet::new();
    for (i, name) in names.iter().enumerate() {
        // An error of the advertisement, as for every reference to nothing
        // (docs/metallb-differences.md: MetalLB lets the name select nothing, which hides a
        // typo until traffic is missing).
        if !known.contains(name.as_str()) {
            report.error(
                me,
                format!("spec.ipAddressPools[{i}]"),
                format!("there is no IPAddressPool named {name:?}"),
            );
        }
        if !set.insert(name.clone()) {
            report.error(
                me,
                format!("spec.ipAddressPools[{i}]"),
                format!("duplicate pool {name:?}"),
            );
        }
    }
    PoolSelection {
        names: set,
        selectors: compile_selectors(report, me, "spec.ipAddressPoolSelectors", selectors),
    }
}

/// The parts both kinds of advertisement share: which pools, which nodes, which Services.
fn common(
    report: &mut Report,
    me: &ObjectRef,
    pool_names: &[String],
    [pool_selectors, node_selectors, service_selectors]: [&[crate::crd::LabelSelector]; 3],
    pool_objects: &[IPAddressPool],
) -> (PoolSelection, Vec<Selector>, Vec<Selector>) {
    (
        pool_selection(report, me, pool_names, pool_selectors, pool_objects),
        compile_selectors(report, me, "spec.nodeSelectors", node_selectors),
        compile_selectors(report, me, "spec.serviceSelectors", service_selectors),
    )
}

fn unique_names(
    report: &mut Report,
    me: &ObjectRef,
    field: &str,
    what: &str,
    names: &[String],
) -> BTreeSet<String> {
    let mut set = BTreeSet::new();
    for (i, name) in names.iter().enumerate() {
        if !set.insert(name.clone()) {
            report.error(
                me,
                format!("{field}[{i}]"),
                format!("duplicate {what} {name:?}"),
            );
        }
    }
    set
}

/// Validates L2Advertisements. Pool names must name existing IPAddressPool objects.
pub(super) fn validate_l2(
    report: &mut Report,
    objects: &[L2Advertisement],
    pool_objects: &[IPAddressPool],
) -> BTreeMap<String, model::L2Advertisement> {
    let mut accepted = BTreeMap::new();
    for object in by_age(objects) {
        let me = ObjectRef::of(Kind::L2Advertisement, &object.metadata);
        let mark = report.mark();
        let spec = &object.spec;
        let (pools, node_selectors, service_selectors) = common(
            report,
            &me,
            &spec.ip_address_pools,
            [
                &spec.ip_address_pool_selectors,
                &spec.node_selectors,
                &spec.service_selectors,
            ],
            pool_objects,
        );
        unique_names(
            report,
            &me,
            "spec.interfaces",
            "interface",
            &spec.interfaces,
        );
        for (i, name) in spec.interfaces.iter().enumerate() {
            if name.is_empty() || name.len() > 15 || name.contains(['/', ' ']) {
                report.error(
                    &me,
                    format!("spec.interfaces[{i}]"),
                    format!("{name:?} is not a valid interface name"),
                );
            }
        }
        if !report.failed_since(mark) {
            accepted.insert(
                me.name.clone(),
                model::L2Advertisement {
                    name: me.name.clone(),
                    pools,
                    node_selectors,
                    interfaces: spec.interfaces.clone(),
                    service_selectors,
                },
            );
        }
    }
    accepted
}

/// The shortest aggregation length a pool's addresses of one family allow, if it has any: as
/// MetalLB decides it, per address entry (CIDR or range) the shortest prefix among the CIDRs
/// that make up the entry, and the longest of these over the entries. A range such as
/// 3.3.3.2-3.3.3.254 thus allows /26 (its widest block), although its ends are /31 and /32 blocks.
fn shortest_aggregation(pool: &Pool, family: Family) -> Option<u8> {
    pool.ranges
        .iter()
        .filter(|r| r.family() == family)
        .filter_map(|r| r.cidrs().iter().map(|net| net.prefix_len()).min())
        .max()
}

/// Whether two advertisements with these aggregation lengths announce different prefixes for
/// this pool, so that their LOCAL_PREFs cannot conflict (MetalLB's `isAggrLengthDifferent`).
fn aggregation_differs(
    pool: &Pool,
    a: &model::BgpAdvertisement,
    b: &model::BgpAdvertisement,
) -> bool {
    let has = |family: Family| pool.ranges.iter().any(|r| r.family() == family);
    let v4_differs = a.aggregation_length != b.aggregation_length;
    let v6_differs = a.aggregation_length_v6 != b.aggregation_length_v6;
    match (has(Family::V4), has(Family::V6)) {
        (false, false) => true,
        (true, false) => v4_differs,
        (false, true) => v6_differs,
        (true, true) => v4_differs && v6_differs,
    }
}

/// What BGPAdvertisements are checked against.
pub(super) struct BgpRefs<'a> {
    /// Every IPAddressPool object (names are looked up here).
    pub(super) pool_objects: &'a [IPAddressPool],
    /// The accepted pools.
    pub(super) pools: &'a BTreeMap<String, Pool>,
    /// Every BGPPeer object (names are looked up here).
    pub(super) peer_objects: &'a [BGPPeer],
    /// The accepted peers.
    pub(super) peers: &'a BTreeMap<String, model::Peer>,
    /// The accepted BFD profiles.
    pub(super) bfd_profiles: &'a BTreeMap<String, model::BfdProfile>,
    /// Community aliases.
    pub(super) aliases: &'a BTreeMap<String, CommunityValue>,
    /// The cluster's nodes, when known.
    pub(super) nodes: Option<&'a [NodeInfo]>,
}

/// Validates BGPAdvertisements against the accepted pools, the peers and the community aliases.
pub(super) fn validate_bgp(
    report: &mut Report,
    objects: &[BGPAdvertisement],
    refs: &BgpRefs<'_>,
) -> BTreeMap<String, model::BgpAdvertisement> {
    let &BgpRefs {
        pool_objects,
        pools,
        peer_objects,
        aliases,
        nodes,
        ..
    } = refs;
    let known_peers: BTreeSet<&str> = peer_objects
        .iter()
        .filter_map(|p| p.metadata.name.as_deref())
        .collect();
    let mut accepted: BTreeMap<String, model::BgpAdvertisement> = BTreeMap::new();
    for object in by_age(objects) {
        let me = ObjectRef::of(Kind::BGPAdvertisement, &object.metadata);
        let mark = report.mark();
        let spec = &object.spec;
        let (pool_sel, node_selectors, service_selectors) = common(
            report,
            &me,
            &spec.ip_address_pools,
            [
                &spec.ip_address_pool_selectors,
                &spec.node_selectors,
                &spec.service_selectors,
            ],
            pool_objects,
        );

        let covered: Vec<&Pool> = pools.values().filter(|p| pool_sel.covers(p)).collect();
        let (v4, v6) = aggregation_lengths(report, &me, spec, &covered);
        let communities = communities(report, &me, &spec.communities, aliases);
        let peers = unique_names(report, &me, "spec.peers", "peer", &spec.peers);
        // An error, as for pool names.
        for (i, name) in spec.peers.iter().enumerate() {
            if !known_peers.contains(name.as_str()) {
                report.error(
                    &me,
                    format!("spec.peers[{i}]"),
                    format!("there is no BGPPeer named {name:?}"),
                );
            }
        }
        bfd_echo_over_ipv6(report, &me, &covered, &spec.peers, refs);

        let candidate = model::BgpAdvertisement {
            name: me.name.clone(),
            aggregation_length: v4.unwrap_or(32),
            aggregation_length_v6: v6.unwrap_or(128),
            local_pref: spec.local_pref,
            communities,
            pools: pool_sel,
            node_selectors,
            peers,
            service_selectors,
        };
        check_local_pref(report, &me, &candidate, &covered, &accepted, nodes);
        if !report.failed_since(mark) {
            accepted.insert(me.name.clone(), candidate);
        }
    }
    accepted
}

/// The aggregation lengths (`None` where out of range), checked against the pools the
/// advertisement covers and against its service selectors.
fn aggregation_lengths(
    report: &mut Report,
    me: &ObjectRef,
    spec: &BGPAdvertisementSpec,
    covered: &[&Pool],
) -> (Option<u8>, Option<u8>) {
    let v4 = u8::try_from(spec.aggregation_length)
        .ok()
        .filter(|l| *l <= 32);
    let v6 = u8::try_from(spec.aggregation_length_v6)
        .ok()
        .filter(|l| *l <= 128);
    if v4.is_none() {
        report.error(
            me,
            "spec.aggregationLength",
            format!("{} is outside 0-32", spec.aggregation_length),
        );
    }
    if v6.is_none() {
        report.error(
            me,
            "spec.aggregationLengthV6",
            format!("{} is outside 0-128", spec.aggregation_length_v6),
        );
    }
    for (family, field, len) in [
        (Family::V4, "spec.aggregationLength", v4),
        (Family::V6, "spec.aggregationLengthV6", v6),
    ] {
        let Some(len) = len else { continue };
        for pool in covered {
            if let Some(prefix) = shortest_aggregation(pool, family).filter(|p| len < *p) {
                report.error(
                    me,
                    field,
                    format!(
                        "{len} is shorter than /{prefix}, the prefix of an {family} address entry of pool {:?}: the aggregate would cover addresses outside the pool",
                        pool.name
                    ),
                );
            }
        }
    }
    if !spec.service_selectors.is_empty() && (v4 != Some(32) || v6 != Some(128)) {
        report.error(
            me,
            "spec.serviceSelectors",
            "cannot be combined with an aggregationLength other than 32 or an aggregationLengthV6 other than 128",
        );
    }
    (v4, v6)
}

/// The advertisement's communities: values or aliases, each at most once.
fn communities(
    report: &mut Report,
    me: &ObjectRef,
    texts: &[String],
    aliases: &BTreeMap<String, CommunityValue>,
) -> BTreeSet<CommunityValue> {
    let mut communities = BTreeSet::new();
    for (i, text) in texts.iter().enumerate() {
        let value = if text.contains(':') {
            parse_community(text).map_err(|e| e.to_string())
        } else {
            aliases
                .get(text)
                .copied()
                .ok_or_else(|| format!("{text:?} is neither a community value (a:b, large:a:b:c) nor an alias defined in a Community object"))
        };
        match value {
            Ok(v) => {
                if !communities.insert(v) {
                    report.error(
                        me,
                        format!("spec.communities[{i}]"),
                        format!("duplicate community {text:?}"),
                    );
                }
            }
            Err(e) => report.error(me, format!("spec.communities[{i}]"), e),
        }
    }
    communities
}

/// A localPref must not differ from that of an older accepted advertisement announcing the same
/// prefix to the same peers from the same nodes: the peer could not tell which one holds.
fn check_local_pref(
    report: &mut Report,
    me: &ObjectRef,
    candidate: &model::BgpAdvertisement,
    covered: &[&Pool],
    accepted: &BTreeMap<String, model::BgpAdvertisement>,
    nodes: Option<&[NodeInfo]>,
) {
    let Some(mine) = candidate.local_pref else {
        return;
    };
    for other in accepted.values() {
        let Some(theirs) = other.local_pref.filter(|t| *t != mine) else {
            continue;
        };
        // Per pool both cover, as MetalLB checks it: different aggregation lengths
        // announce different prefixes, which cannot conflict.
        let pools_overlap = covered
            .iter()
            .any(|p| other.pools.covers(p) && !aggregation_differs(p, candidate, other));
        let peers_overlap = candidate.peers.is_empty()
            || other.peers.is_empty()
            || !candidate.peers.is_disjoint(&other.peers);
        if pools_overlap
            && peers_overlap
            && share_a_node(nodes, &candidate.node_selectors, &other.node_selectors)
        {
            report.error(
                me,
                "spec.localPref",
                format!(
                    "{mine} conflicts with localPref {theirs} of the older BGPAdvertisement {:?}, which advertises the same pool to the same peers from the same nodes",
                    other.name
                ),
            );
        }
    }
}

/// MetalLB refuses to advertise IPv6 addresses to a peer whose BFD profile enables echo mode:
/// BFD echo does not support IPv6. ferrolb keeps the rule so that a configuration it accepts
/// also works under MetalLB, and for the day it runs BFD.
fn bfd_echo_over_ipv6(
    report: &mut Report,
    me: &ObjectRef,
    covered: &[&Pool],
    peer_names: &[String],
    refs: &BgpRefs<'_>,
) {
    let Some(v6_pool) = covered
        .iter()
        .find(|p| p.ranges.iter().any(|r| r.family() == Family::V6))
    else {
        return;
    };
    for peer in refs.peers.values() {
        let field = if peer_names.is_empty() {
            "spec.peers".to_string()
        } else if let Some(i) = peer_names.iter().position(|n| *n == peer.name) {
            format!("spec.peers[{i}]")
        } else {
            continue;
        };
        let Some(profile) = peer
            .bfd_profile
            .as_ref()
            .and_then(|name| refs.bfd_profiles.get(name))
            .filter(|profile| profile.echo_mode)
        else {
            continue;
        };
        report.error(
            me,
            field,
            format!(
                "advertises the IPv6 addresses of pool {:?} to BGPPeer {:?}, whose BFDProfile {:?} enables echoMode; BFD echo mode does not support IPv6",
                v6_pool.name, peer.name, profile.name
            ),
        );
    }
}
