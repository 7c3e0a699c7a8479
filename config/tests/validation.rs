//! Validation end to end: manifests as operators write them, read and validated into the model.
//! One test per rejection of the compatibility spec, each asserting the exact object and field.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::IpAddr;
use std::time::Duration;

use ferrolb_config::manifest::read_manifests;
use ferrolb_config::model::{CommunityValue, PeerAsn, PeerPassword, PeerTarget};
use ferrolb_config::validate::{NodeInfo, Objects, Validated, validate};

const NS: &str = "metallb-system";

fn objects(yaml: &str) -> Objects {
    let mut objects = Objects {
        namespace: NS.into(),
        ..Default::default()
    };
    let errors = read_manifests(yaml, "test.yaml", &mut objects);
    assert!(errors.is_empty(), "manifest errors: {errors:?}");
    objects
}

fn check(yaml: &str) -> Validated {
    validate(&objects(yaml))
}

fn errors(yaml: &str) -> Vec<String> {
    check(yaml).errors.iter().map(|e| e.to_string()).collect()
}

/// Asserts exactly one error, on `prefix` (`Kind ns/name: field`), containing `words`.
#[track_caller]
fn rejects(yaml: &str, prefix: &str, words: &str) {
    let errors = errors(yaml);
    assert_eq!(errors.len(), 1, "expected one error, got {errors:#?}");
    assert!(
        errors[0].starts_with(&format!("{prefix}: ")),
        "expected {prefix:?}, got {:?}",
        errors[0]
    );
    assert!(
        errors[0].contains(words),
        "expected {words:?} in {:?}",
        errors[0]
    );
}

const POOL: &str = "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: pool}\nspec: {addresses: [198.18.100.0/26, 'fd00:100::/120']}\n---\n";

fn peer(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: metallb.io/v1beta2\nkind: BGPPeer\nmetadata: {{name: {name}}}\nspec: {spec}\n---\n"
    )
}

fn bgp_adv(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: metallb.io/v1beta1\nkind: BGPAdvertisement\nmetadata: {{name: {name}}}\nspec: {spec}\n---\n"
    )
}

// ---- MetalLB documentation examples parse into the model unchanged ----

#[test]
fn metallb_l2_documentation_example_parses_unchanged() {
    let v = check(include_str!("manifests/metallb-docs-l2.yaml"));
    assert!(v.is_valid(), "{:?}", v.errors);
    let first = &v.config.pools["first-pool"];
    assert_eq!(first.ranges.len(), 3);
    assert!(first.auto_assign && !first.avoid_buggy_ips);
    assert!(first.contains("192.168.9.5".parse::<IpAddr>().unwrap()));
    assert!(first.contains("fc00:f853:ccd:e799::f".parse::<IpAddr>().unwrap()));
    let expensive = &v.config.pools["expensive"];
    assert!(!expensive.auto_assign && expensive.avoid_buggy_ips);
    let team = v.config.pools["team-pool"].allocation.as_ref().unwrap();
    assert_eq!(team.priority, Some(50));
    let labels = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert!(team.admits(
        "namespace-a",
        &labels(&[("team", "red")]),
        &labels(&[("app", "api")])
    ));
    assert!(!team.admits(
        "namespace-b",
        &labels(&[("team", "red")]),
        &labels(&[("app", "api")])
    ));
    assert!(!team.admits(
        "namespace-a",
        &labels(&[("team", "red")]),
        &labels(&[("app", "db")])
    ));
    let l2 = &v.config.l2_advertisements["example"];
    assert_eq!(l2.interfaces, ["eth0", "eth1"]);
    assert!(l2.pools.covers(first) && !l2.pools.covers(expensive));
    assert!(
        v.config.l2_advertisements["by-label"]
            .pools
            .covers(expensive)
    );
}

#[test]
fn metallb_bgp_documentation_example_parses_unchanged() {
    let v = check(include_str!("manifests/metallb-docs-bgp.yaml"));
    assert!(v.is_valid(), "{:?}", v.errors);
    let sample = &v.config.peers["sample"];
    assert_eq!(sample.peer_asn, PeerAsn::Fixed(64501));
    assert_eq!(
        sample.target,
        PeerTarget::Address("10.0.0.1".parse().unwrap())
    );
    assert_eq!(
        (sample.hold_time, sample.keepalive_time),
        (Duration::from_secs(90), Duration::from_secs(30))
    );
    assert_eq!(
        sample.password,
        Some(PeerPassword::Secret {
            name: "secretname".into(),
            namespace: NS.into()
        })
    );
    assert_eq!(sample.port, 179);
    let legacy = &v.config.peers["legacy-peer"];
    assert_eq!(
        (legacy.port, legacy.router_id),
        (1179, Some("10.10.10.10".parse().unwrap()))
    );
    assert_eq!(v.config.peers["unnumbered"].peer_asn, PeerAsn::External);
    let bfd = &v.config.bfd_profiles["full-profile"];
    assert_eq!(
        (
            bfd.receive_interval_ms,
            bfd.transmit_interval_ms,
            bfd.detect_multiplier,
            bfd.echo_interval_ms
        ),
        (380, 270, 37, 50)
    );
    let local = &v.config.bgp_advertisements["local"];
    assert_eq!(local.local_pref, Some(100));
    assert_eq!(
        local.communities.iter().copied().collect::<Vec<_>>(),
        [
            CommunityValue::Standard(64500, 100),
            CommunityValue::Standard(65535, 65282)
        ]
    );
    let external = &v.config.bgp_advertisements["external"];
    assert_eq!(
        (external.aggregation_length, external.aggregation_length_v6),
        (24, 64)
    );
}

// ---- IPAddressPool ----

#[test]
fn pool_with_empty_addresses_is_rejected() {
    rejects(
        "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: p}\nspec: {addresses: []}\n",
        "IPAddressPool metallb-system/p: spec.addresses",
        "at least one",
    );
}

#[test]
fn pool_with_unparsable_cidr_is_rejected() {
    rejects(
        "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: p}\nspec: {addresses: [198.18.0.0/24, 198.18.300.0/24]}\n",
        "IPAddressPool metallb-system/p: spec.addresses[1]",
        "neither a CIDR",
    );
}

#[test]
fn pool_with_reversed_range_is_rejected() {
    rejects(
        "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: p}\nspec: {addresses: [198.18.0.20-198.18.0.10]}\n",
        "IPAddressPool metallb-system/p: spec.addresses[0]",
        "starts after it ends",
    );
}

#[test]
fn overlapping_pools_keep_the_older_and_report_the_newer() {
    let yaml = "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: a, creationTimestamp: '2026-01-01T00:00:00Z'}\nspec: {addresses: [198.18.0.0/24]}\n---\napiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: b, creationTimestamp: '2025-01-01T00:00:00Z'}\nspec: {addresses: [198.18.0.128/25]}\n";
    rejects(
        yaml,
        "IPAddressPool metallb-system/a: spec.addresses[0]",
        "older pool \"b\"",
    );
    let v = check(yaml);
    assert!(v.config.pools.contains_key("b") && !v.config.pools.contains_key("a"));
}

// ---- BGPAdvertisement ----

#[test]
fn aggregation_length_above_32_is_rejected() {
    rejects(
        &format!("{POOL}{}", bgp_adv("a", "{aggregationLength: 33}")),
        "BGPAdvertisement metallb-system/a: spec.aggregationLength",
        "outside 0-32",
    );
}

#[test]
fn aggregation_length_v6_above_128_is_rejected() {
    rejects(
        &format!("{POOL}{}", bgp_adv("a", "{aggregationLengthV6: 129}")),
        "BGPAdvertisement metallb-system/a: spec.aggregationLengthV6",
        "outside 0-128",
    );
}

#[test]
fn aggregation_shorter_than_the_pools_most_specific_cidr_is_rejected() {
    rejects(
        &format!(
            "{POOL}{}",
            bgp_adv("a", "{aggregationLength: 24, ipAddressPools: [pool]}")
        ),
        "BGPAdvertisement metallb-system/a: spec.aggregationLength",
        "shorter than /26",
    );
    rejects(
        &format!("{POOL}{}", bgp_adv("a", "{aggregationLengthV6: 64}")),
        "BGPAdvertisement metallb-system/a: spec.aggregationLengthV6",
        "shorter than /120",
    );
    assert_eq!(
        errors(&format!(
            "{POOL}{}",
            bgp_adv("a", "{aggregationLength: 26, aggregationLengthV6: 120}")
        )),
        Vec::<String>::new()
    );
}

/// MetalLB judges a range by its widest block: 3.3.3.2-3.3.3.254 is made of blocks /31 to /26,
/// and allows aggregation down to /26 although its edge blocks are /31 and /32.
#[test]
fn aggregation_of_a_range_is_judged_by_its_widest_block() {
    let pool = "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: r}\nspec: {addresses: [3.3.3.2-3.3.3.254]}\n---\n";
    assert_eq!(
        errors(&format!(
            "{pool}{}",
            bgp_adv("a", "{aggregationLength: 26}")
        )),
        Vec::<String>::new()
    );
    rejects(
        &format!("{pool}{}", bgp_adv("a", "{aggregationLength: 25}")),
        "BGPAdvertisement metallb-system/a: spec.aggregationLength",
        "shorter than /26",
    );
}

#[test]
fn service_selectors_with_aggregation_are_rejected() {
    rejects(
        &format!(
            "{POOL}{}",
            bgp_adv(
                "a",
                "{aggregationLength: 28, serviceSelectors: [{matchLabels: {a: b}}]}"
            )
        ),
        "BGPAdvertisement metallb-system/a: spec.serviceSelectors",
        "cannot be combined",
    );
}

#[test]
fn conflicting_local_pref_on_overlapping_advertisements_is_rejected() {
    let yaml = format!(
        "{POOL}{}{}",
        bgp_adv("first", "{localPref: 100, ipAddressPools: [pool]}"),
        bgp_adv("second", "{localPref: 200, ipAddressPools: [pool]}")
    );
    rejects(
        &yaml,
        "BGPAdvertisement metallb-system/second: spec.localPref",
        "conflicts with localPref 100 of the older BGPAdvertisement \"first\"",
    );
}

/// Advertisements aggregating a pool to different lengths announce different prefixes, so
/// their LOCAL_PREFs cannot conflict (MetalLB's rule): for a pool of both families, both lengths
/// must differ.
#[test]
fn local_pref_with_different_aggregation_does_not_conflict() {
    let v4_pool = "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: v4}\nspec: {addresses: [198.18.100.0/24]}\n---\n";
    let yaml = format!(
        "{v4_pool}{}{}",
        bgp_adv("first", "{localPref: 100, aggregationLength: 24}"),
        bgp_adv("second", "{localPref: 200}")
    );
    assert_eq!(errors(&yaml), Vec::<String>::new());
    // POOL has both families: a different IPv4 length alone still announces the same IPv6
    // prefixes with two LOCAL_PREFs.
    rejects(
        &format!(
            "{POOL}{}{}",
            bgp_adv("first", "{localPref: 100, aggregationLength: 26}"),
            bgp_adv("second", "{localPref: 200}")
        ),
        "BGPAdvertisement metallb-system/second: spec.localPref",
        "conflicts with localPref 100",
    );
    assert_eq!(
        errors(&format!(
            "{POOL}{}{}",
            bgp_adv(
                "first",
                "{localPref: 100, aggregationLength: 26, aggregationLengthV6: 120}"
            ),
            bgp_adv("second", "{localPref: 200}")
        )),
        Vec::<String>::new()
    );
}

#[test]
fn local_pref_on_disjoint_nodes_does_not_conflict() {
    let yaml = format!(
        "{POOL}{}{}",
        bgp_adv(
            "first",
            "{localPref: 100, nodeSelectors: [{matchLabels: {rack: a}}]}"
        ),
        bgp_adv(
            "second",
            "{localPref: 200, nodeSelectors: [{matchLabels: {rack: b}}]}"
        )
    );
    let mut objects = objects(&yaml);
    objects.nodes = Some(vec![
        NodeInfo {
            name: "n1".into(),
            labels: [("rack".to_string(), "a".to_string())].into(),
        },
        NodeInfo {
            name: "n2".into(),
            labels: [("rack".to_string(), "b".to_string())].into(),
        },
    ]);
    assert!(validate(&objects).is_valid());
}

#[test]
fn duplicate_entries_in_an_advertisement_are_rejected() {
    rejects(
        &format!("{POOL}{}", bgp_adv("a", "{communities: ['1:1', '1:1']}")),
        "BGPAdvertisement metallb-system/a: spec.communities[1]",
        "duplicate community",
    );
    rejects(
        &format!(
            "{POOL}{}",
            bgp_adv(
                "a",
                "{nodeSelectors: [{matchLabels: {a: b}}, {matchLabels: {a: b}}]}"
            )
        ),
        "BGPAdvertisement metallb-system/a: spec.nodeSelectors[1]",
        "duplicate selector",
    );
}

/// MetalLB refuses a value twice in one match expression and one match expression twice in a
/// selector, which Kubernetes itself takes; a selector list MetalLB accepts is accepted, even
/// when two of its selectors select alike but are written differently.
#[test]
fn selectors_repeating_values_or_expressions_are_rejected_as_in_metallb() {
    rejects(
        &format!(
            "{POOL}{}",
            bgp_adv(
                "a",
                "{nodeSelectors: [{matchExpressions: [{key: k, operator: In, values: [x, x]}]}]}"
            )
        ),
        "BGPAdvertisement metallb-system/a: spec.nodeSelectors[0].matchExpressions[0].values[1]",
        "duplicate value \"x\"",
    );
    rejects(
        &format!(
            "{POOL}{}",
            bgp_adv(
                "a",
                "{nodeSelectors: [{matchExpressions: [{key: k, operator: In, values: [p, q]}, {key: k, operator: In, values: [q, p]}]}]}"
            )
        ),
        "BGPAdvertisement metallb-system/a: spec.nodeSelectors[0].matchExpressions[1]",
        "duplicate match expression",
    );
    rejects(
        &format!(
            "{POOL}{}",
            bgp_adv(
                "a",
                "{nodeSelectors: [{matchExpressions: [{key: k, operator: In, values: [p, q]}]}, {matchExpressions: [{key: k, operator: In, values: [q, p]}]}]}"
            )
        ),
        "BGPAdvertisement metallb-system/a: spec.nodeSelectors[1]",
        "duplicate selector",
    );
    assert_eq!(
        errors(&format!(
            "{POOL}{}",
            bgp_adv(
                "a",
                "{nodeSelectors: [{matchLabels: {k: x}}, {matchExpressions: [{key: k, operator: In, values: [x]}]}]}"
            )
        )),
        Vec::<String>::new(),
        "written differently: not a duplicate to MetalLB"
    );
}

#[test]
fn invalid_community_value_is_rejected() {
    rejects(
        &format!("{POOL}{}", bgp_adv("a", "{communities: ['65536:1']}")),
        "BGPAdvertisement metallb-system/a: spec.communities[0]",
        "not a community",
    );
}

#[test]
fn unknown_community_alias_is_rejected() {
    rejects(
        &format!("{POOL}{}", bgp_adv("a", "{communities: [no-such-alias]}")),
        "BGPAdvertisement metallb-system/a: spec.communities[0]",
        "nor an alias",
    );
}

/// A reference to nothing is an error of the advertisement that holds it (the compatibility
/// spec; MetalLB lets the name select nothing: docs/metallb-differences.md).
#[test]
fn advertisement_naming_a_missing_pool_or_peer_is_rejected() {
    rejects(
        &format!("{POOL}{}", bgp_adv("a", "{ipAddressPools: [pool, nope]}")),
        "BGPAdvertisement metallb-system/a: spec.ipAddressPools[1]",
        "no IPAddressPool named \"nope\"",
    );
    rejects(
        &format!("{POOL}{}", bgp_adv("a", "{peers: [nope]}")),
        "BGPAdvertisement metallb-system/a: spec.peers[0]",
        "no BGPPeer named \"nope\"",
    );
    rejects(
        &format!(
            "{POOL}apiVersion: metallb.io/v1beta1\nkind: L2Advertisement\nmetadata: {{name: l2}}\nspec: {{ipAddressPools: [nope]}}\n"
        ),
        "L2Advertisement metallb-system/l2: spec.ipAddressPools[0]",
        "no IPAddressPool named \"nope\"",
    );
}

// ---- BGPPeer ----

const GOOD: &str = "myASN: 64500, peerASN: 64501, peerAddress: 198.18.0.1";

#[test]
fn peer_without_my_asn_is_rejected() {
    rejects(
        &peer("p", "{myASN: 0, peerASN: 64501, peerAddress: 198.18.0.1}"),
        "BGPPeer metallb-system/p: spec.myASN",
        "must be set",
    );
    let mut objects = Objects {
        namespace: NS.into(),
        ..Default::default()
    };
    let errors = read_manifests(
        &peer("p", "{peerASN: 64501, peerAddress: 198.18.0.1}"),
        "f",
        &mut objects,
    );
    assert!(
        errors[0]
            .to_string()
            .starts_with("BGPPeer metallb-system/p: spec.myASN: missing field")
    );
}

#[test]
fn peer_with_both_or_neither_asn_is_rejected() {
    rejects(
        &peer(
            "p",
            "{myASN: 64500, peerASN: 64501, dynamicASN: external, peerAddress: 198.18.0.1}",
        ),
        "BGPPeer metallb-system/p: spec.dynamicASN",
        "cannot both",
    );
    rejects(
        &peer("p", "{myASN: 64500, peerAddress: 198.18.0.1}"),
        "BGPPeer metallb-system/p: spec.peerASN",
        "either peerASN or dynamicASN",
    );
}

#[test]
fn peer_with_both_or_neither_address_is_rejected() {
    rejects(
        &peer(
            "p",
            "{myASN: 64500, peerASN: 64501, peerAddress: 198.18.0.1, interface: eth0}",
        ),
        "BGPPeer metallb-system/p: spec.interface",
        "cannot both",
    );
    rejects(
        &peer("p", "{myASN: 64500, peerASN: 64501}"),
        "BGPPeer metallb-system/p: spec.peerAddress",
        "either peerAddress or interface",
    );
}

#[test]
fn ebgp_multihop_on_ibgp_is_rejected() {
    rejects(
        &peer(
            "p",
            "{myASN: 64500, peerASN: 64500, peerAddress: 198.18.0.1, ebgpMultiHop: true}",
        ),
        "BGPPeer metallb-system/p: spec.ebgpMultiHop",
        "iBGP",
    );
    rejects(
        &peer(
            "p",
            "{myASN: 64500, dynamicASN: internal, peerAddress: 198.18.0.1, ebgpMultiHop: true}",
        ),
        "BGPPeer metallb-system/p: spec.ebgpMultiHop",
        "iBGP",
    );
}

#[test]
fn unparsable_addresses_and_router_id_are_rejected() {
    rejects(
        &peer(
            "p",
            "{myASN: 64500, peerASN: 64501, peerAddress: 198.18.0.256}",
        ),
        "BGPPeer metallb-system/p: spec.peerAddress",
        "not an IP address",
    );
    rejects(
        &peer("p", &format!("{{{GOOD}, sourceAddress: nowhere}}")),
        "BGPPeer metallb-system/p: spec.sourceAddress",
        "not an IP address",
    );
    rejects(
        &peer("p", &format!("{{{GOOD}, routerID: 'fd00::1'}}")),
        "BGPPeer metallb-system/p: spec.routerID",
        "not a router ID",
    );
}

#[test]
fn bad_timers_are_rejected() {
    rejects(
        &peer("p", &format!("{{{GOOD}, holdTime: 2s}}")),
        "BGPPeer metallb-system/p: spec.holdTime",
        "too short",
    );
    rejects(
        &peer(
            "p",
            &format!("{{{GOOD}, holdTime: 10s, keepaliveTime: 20s}}"),
        ),
        "BGPPeer metallb-system/p: spec.keepaliveTime",
        "exceeds the hold time",
    );
    rejects(
        &peer("p", &format!("{{{GOOD}, holdTime: soon}}")),
        "BGPPeer metallb-system/p: spec.holdTime",
        "not a duration",
    );
    rejects(
        &peer("p", &format!("{{{GOOD}, keepaliveTime: 500ms}}")),
        "BGPPeer metallb-system/p: spec.holdTime",
        "too short",
    );
}

#[test]
fn timer_defaults_follow_metallb() {
    let v = check(&format!(
        "{}{}{}",
        peer("a", &format!("{{{GOOD}}}")),
        peer(
            "b",
            "{myASN: 64500, peerASN: 64501, peerAddress: 198.18.0.2, holdTime: 30s}"
        ),
        peer(
            "c",
            "{myASN: 64500, peerASN: 64501, peerAddress: 198.18.0.3, keepaliveTime: 20s}"
        )
    ));
    assert!(v.is_valid(), "{:?}", v.errors);
    let t = |n: &str| {
        (
            v.config.peers[n].hold_time.as_secs(),
            v.config.peers[n].keepalive_time.as_secs(),
        )
    };
    assert_eq!((t("a"), t("b"), t("c")), ((90, 30), (30, 10), (60, 20)));
}

#[test]
fn password_and_password_secret_together_are_rejected() {
    rejects(
        &peer(
            "p",
            &format!("{{{GOOD}, password: x, passwordSecret: {{name: s}}}}"),
        ),
        "BGPPeer metallb-system/p: spec.passwordSecret",
        "cannot both",
    );
}

#[test]
fn password_longer_than_a_tcp_md5_key_is_rejected() {
    // Linux's TCP_MD5SIG_MAXKEYLEN is 80 bytes: the speaker could not protect the session.
    let long = "x".repeat(81);
    rejects(
        &peer("p", &format!("{{{GOOD}, password: {long}}}")),
        "BGPPeer metallb-system/p: spec.password",
        "81 bytes",
    );
    // Bytes, not characters: 41 two-byte characters are 82 bytes.
    let wide = "é".repeat(41);
    rejects(
        &peer("p", &format!("{{{GOOD}, password: {wide}}}")),
        "BGPPeer metallb-system/p: spec.password",
        "82 bytes",
    );
    let v = check(&peer(
        "p",
        &format!("{{{GOOD}, password: {}}}", "x".repeat(80)),
    ));
    assert!(v.errors.is_empty(), "{:?}", v.errors);
    assert_eq!(
        v.config.peers["p"].password,
        Some(PeerPassword::Plain("x".repeat(80)))
    );
}

#[test]
fn peers_sharing_a_node_must_agree_on_router_id_asn_and_not_repeat_an_address() {
    let a = peer("a", &format!("{{{GOOD}, routerID: 10.0.0.1}}"));
    rejects(
        &format!(
            "{a}{}",
            peer(
                "b",
                "{myASN: 64500, peerASN: 64501, peerAddress: 198.18.0.2, routerID: 10.0.0.2}"
            )
        ),
        "BGPPeer metallb-system/b: spec.routerID",
        "a node has one router ID",
    );
    rejects(
        &format!(
            "{a}{}",
            peer(
                "b",
                "{myASN: 64599, peerASN: 64501, peerAddress: 198.18.0.2}"
            )
        ),
        "BGPPeer metallb-system/b: spec.myASN",
        "a node has one AS",
    );
    rejects(
        &format!(
            "{a}{}",
            peer(
                "b",
                "{myASN: 64500, peerASN: 64502, peerAddress: 198.18.0.1}"
            )
        ),
        "BGPPeer metallb-system/b: spec.peerAddress",
        "already peers with address 198.18.0.1",
    );
}

#[test]
fn peers_on_disjoint_nodes_may_differ() {
    let yaml = format!(
        "{}{}",
        peer(
            "a",
            "{myASN: 64500, peerASN: 64501, peerAddress: 198.18.0.1, nodeSelectors: [{matchLabels: {rack: a}}]}"
        ),
        peer(
            "b",
            "{myASN: 64599, peerASN: 64501, peerAddress: 198.18.0.1, nodeSelectors: [{matchLabels: {rack: b}}]}"
        )
    );
    let mut objects = objects(&yaml);
    objects.nodes = Some(vec![NodeInfo {
        name: "n1".into(),
        labels: [("rack".to_string(), "a".to_string())].into(),
    }]);
    assert!(validate(&objects).is_valid());
}

#[test]
fn peer_naming_a_missing_bfd_profile_is_rejected() {
    rejects(
        &peer("p", &format!("{{{GOOD}, bfdProfile: gone}}")),
        "BGPPeer metallb-system/p: spec.bfdProfile",
        "BFDProfile \"gone\" does not exist",
    );
}

// ---- Community and BFDProfile ----

#[test]
fn community_with_bad_value_or_repeated_alias_is_rejected() {
    rejects(
        "apiVersion: metallb.io/v1beta1\nkind: Community\nmetadata: {name: c}\nspec: {communities: [{name: a, value: 'large:1:2'}]}\n",
        "Community metallb-system/c: spec.communities[0].value",
        "not a large community",
    );
    rejects(
        "apiVersion: metallb.io/v1beta1\nkind: Community\nmetadata: {name: c}\nspec: {communities: [{name: a, value: '1:1'}, {name: a, value: '1:2'}]}\n",
        "Community metallb-system/c: spec.communities[1].name",
        "defined twice",
    );
}

/// MetalLB refuses BFD echo mode towards a peer that is sent IPv6 addresses.
#[test]
fn bfd_echo_mode_with_ipv6_advertisements_is_rejected() {
    let profile = |echo: bool| {
        format!(
            "apiVersion: metallb.io/v1beta1\nkind: BFDProfile\nmetadata: {{name: echo}}\nspec: {{echoMode: {echo}}}\n---\n"
        )
    };
    let with = peer(
        "e",
        "{myASN: 64500, peerASN: 64501, peerAddress: 198.18.0.1, bfdProfile: echo}",
    );
    let without = peer(
        "plain",
        "{myASN: 64500, peerASN: 64501, peerAddress: 198.18.0.2}",
    );
    rejects(
        &format!(
            "{POOL}{}{with}{without}{}",
            profile(true),
            bgp_adv("a", "{}")
        ),
        "BGPAdvertisement metallb-system/a: spec.peers",
        "BGPPeer \"e\", whose BFDProfile \"echo\" enables echoMode",
    );
    rejects(
        &format!(
            "{POOL}{}{with}{without}{}",
            profile(true),
            bgp_adv("a", "{peers: [plain, e]}")
        ),
        "BGPAdvertisement metallb-system/a: spec.peers[1]",
        "does not support IPv6",
    );
    let v4_pool = "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: v4}\nspec: {addresses: [198.18.100.0/24]}\n---\n";
    for ok in [
        format!(
            "{POOL}{}{with}{without}{}",
            profile(false),
            bgp_adv("a", "{}")
        ),
        format!(
            "{POOL}{}{with}{without}{}",
            profile(true),
            bgp_adv("a", "{peers: [plain]}")
        ),
        format!("{v4_pool}{}{with}{}", profile(true), bgp_adv("a", "{}")),
    ] {
        assert_eq!(errors(&ok), Vec::<String>::new(), "{ok}");
    }
}

/// Two objects of one kind and name can only meet in manifest files; which one `kubectl apply`
/// keeps depends on file order, so neither is taken (MetalLB refuses them too).
#[test]
fn objects_defined_twice_are_both_left_out() {
    let profile = |interval: u32| {
        format!(
            "apiVersion: metallb.io/v1beta1\nkind: BFDProfile\nmetadata: {{name: twice}}\nspec: {{receiveInterval: {interval}}}\n---\n"
        )
    };
    let v = check(&format!("{}{}", profile(100), profile(200)));
    assert_eq!(
        v.errors.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
        [
            "BFDProfile metallb-system/twice: metadata.name: 2 objects of this kind are named \"twice\"; the API server keeps one per name"
        ]
    );
    assert!(v.config.bfd_profiles.is_empty());
}

#[test]
fn bfd_profile_values_out_of_range_are_rejected() {
    for (field, value, words) in [
        ("receiveInterval", "9", "outside 10-60000"),
        ("transmitInterval", "60001", "outside 10-60000"),
        ("detectMultiplier", "1", "outside 2-255"),
        ("echoInterval", "5", "outside 10-60000"),
        ("minimumTtl", "255", "outside 1-254"),
    ] {
        rejects(
            &format!(
                "apiVersion: metallb.io/v1beta1\nkind: BFDProfile\nmetadata: {{name: b}}\nspec: {{{field}: {value}}}\n"
            ),
            &format!("BFDProfile metallb-system/b: spec.{field}"),
            words,
        );
    }
}

fn bfd_profile_annotated(annotations: &str) -> String {
    format!(
        "apiVersion: metallb.io/v1beta1\nkind: BFDProfile\nmetadata:\n  name: b\n  annotations: {{{annotations}}}\nspec: {{}}\n"
    )
}

#[test]
fn bfd_authentication_is_read_from_the_profile_annotations() {
    use ferrolb_bfd::auth::AuthType;
    let v = check(&bfd_profile_annotated(
        "ferrolb.io/bfd-authentication: meticulous-keyed-sha1, ferrolb.io/bfd-authentication-secret: bfd-key",
    ));
    assert!(v.is_valid(), "{:?}", v.errors);
    let auth = v.config.bfd_profiles["b"].authentication.clone().unwrap();
    assert_eq!(auth.kind, AuthType::MeticulousKeyedSha1);
    assert_eq!(auth.key_id, 1, "the default key ID");
    assert_eq!(auth.secret, "bfd-key");
    let v = check(&bfd_profile_annotated(
        "ferrolb.io/bfd-authentication: keyed-md5, ferrolb.io/bfd-authentication-secret: k, ferrolb.io/bfd-authentication-key-id: '200'",
    ));
    let auth = v.config.bfd_profiles["b"].authentication.clone().unwrap();
    assert_eq!((auth.kind, auth.key_id), (AuthType::KeyedMd5, 200));
    let v = check(&bfd_profile_annotated("other.io/x: 'y'"));
    assert_eq!(v.config.bfd_profiles["b"].authentication, None);
}

#[test]
fn bfd_authentication_annotations_that_are_wrong_are_rejected_by_name() {
    let prefix = "BFDProfile metallb-system/b: metadata.annotations";
    for (annotations, field, words) in [
        (
            "ferrolb.io/bfd-authentication: simple, ferrolb.io/bfd-authentication-secret: k",
            "ferrolb.io/bfd-authentication",
            "\"simple\" is not one of keyed-md5, meticulous-keyed-md5, keyed-sha1, meticulous-keyed-sha1",
        ),
        (
            "ferrolb.io/bfd-authentication-secret: k",
            "ferrolb.io/bfd-authentication",
            "missing",
        ),
        (
            "ferrolb.io/bfd-authentication: keyed-sha1",
            "ferrolb.io/bfd-authentication-secret",
            "Secret in the speaker's namespace",
        ),
        (
            "ferrolb.io/bfd-authentication: keyed-sha1, ferrolb.io/bfd-authentication-secret: k, ferrolb.io/bfd-authentication-key-id: '256'",
            "ferrolb.io/bfd-authentication-key-id",
            "\"256\" is not a key ID (0-255)",
        ),
    ] {
        rejects(
            &bfd_profile_annotated(annotations),
            &format!("{prefix}[{field}]"),
            words,
        );
    }
}

#[test]
fn peer_referencing_an_invalid_bfd_profile_is_left_out_too() {
    let yaml = format!(
        "apiVersion: metallb.io/v1beta1\nkind: BFDProfile\nmetadata: {{name: b}}\nspec: {{detectMultiplier: 1}}\n---\n{}",
        peer("p", &format!("{{{GOOD}, bfdProfile: b}}"))
    );
    let errors = errors(&yaml);
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(errors.iter().any(|e| e.contains(
        "BGPPeer metallb-system/p: spec.bfdProfile: BFDProfile \"b\" is itself invalid"
    )));
}

// ---- every kind ----

#[test]
fn objects_outside_the_namespace_are_ignored_with_a_message() {
    let v = check(
        "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: p, namespace: default}\nspec: {addresses: [198.18.0.0/24]}\n",
    );
    assert!(v.is_valid() && v.config.pools.is_empty());
    assert_eq!(v.warnings.len(), 1);
    assert!(
        v.warnings[0]
            .to_string()
            .starts_with("IPAddressPool default/p: metadata.namespace: ignored")
    );
}

#[test]
fn one_bad_object_does_not_discard_the_good_ones() {
    let yaml = format!(
        "{POOL}{}{}apiVersion: metallb.io/v1beta1\nkind: L2Advertisement\nmetadata: {{name: l2}}\nspec: {{ipAddressPools: [pool]}}\n",
        peer("good", &format!("{{{GOOD}}}")),
        peer("bad", "{myASN: 64500, peerAddress: 198.18.0.9}")
    );
    let v = check(&yaml);
    assert_eq!(v.errors.len(), 1);
    assert_eq!(
        v.left_out.iter().map(|o| o.to_string()).collect::<Vec<_>>(),
        ["BGPPeer metallb-system/bad"]
    );
    assert!(v.config.pools.contains_key("pool"));
    assert!(v.config.peers.contains_key("good"));
    assert!(v.config.l2_advertisements.contains_key("l2"));
}

#[test]
fn validation_does_not_depend_on_object_order() {
    let docs: Vec<&str> = include_str!("manifests/metallb-docs-bgp.yaml")
        .split("\n---\n")
        .collect();
    let forward = check(&docs.join("\n---\n"));
    let reversed: Vec<&str> = docs.iter().rev().copied().collect();
    let backward = check(&reversed.join("\n---\n"));
    assert_eq!(forward, backward);
}
