//! Reading a Kubernetes Service into an allocation request.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::IpAddr;

use ferrolb_config::address::Family;
use ferrolb_config::allocator::{
    Backend, FamilyPolicy, ParsedService, Protocol, ProtocolPort, RequestError, RequestWarning,
    ServiceKey, ServiceRequest, is_ours,
};
use ferrolb_config::selector::Labels;
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A LoadBalancer Service `shop/web` with these annotations and spec.
fn service(annotations: &[(&str, &str)], spec: ServiceSpec) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("shop".into()),
            annotations: (!annotations.is_empty()).then(|| map(annotations)),
            labels: Some(map(&[("app", "web")])),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ..spec
        }),
        status: None,
    }
}

fn parse(annotations: &[(&str, &str)], spec: ServiceSpec) -> Result<ParsedService, RequestError> {
    ServiceRequest::from_service(&service(annotations, spec), &map(&[("team", "shop")]))
}

fn request(annotations: &[(&str, &str)], spec: ServiceSpec) -> ServiceRequest {
    parse(annotations, spec).unwrap().request
}

fn families(list: &[&str], policy: Option<&str>) -> ServiceSpec {
    ServiceSpec {
        ip_families: Some(list.iter().map(|s| s.to_string()).collect()),
        ip_family_policy: policy.map(str::to_string),
        ..Default::default()
    }
}

fn dual_spec() -> ServiceSpec {
    families(&["IPv4", "IPv6"], Some("PreferDualStack"))
}

#[test]
fn a_plain_service_is_single_stack_ipv4_with_cluster_backend() {
    let parsed = parse(&[], ServiceSpec::default()).unwrap();
    let r = &parsed.request;
    assert_eq!(r.key, ServiceKey::new("shop", "web"));
    assert_eq!(r.key.to_string(), "shop/web");
    assert_eq!(
        (r.primary_family(), r.secondary_family()),
        (Family::V4, None)
    );
    assert_eq!(r.family_policy, FamilyPolicy::SingleStack);
    assert_eq!(r.backend, Backend::Cluster);
    assert!(r.requested_ips.is_empty() && r.pool.is_none() && r.sharing_key.is_none());
    assert_eq!(*r.labels, map(&[("app", "web")]));
    assert_eq!(*r.namespace_labels, map(&[("team", "shop")]));
    assert!(parsed.warnings.is_empty());
}

#[test]
fn load_balancer_ips_annotation_is_a_comma_list_with_spaces_trimmed() {
    let r = request(
        &[("metallb.io/loadBalancerIPs", " 10.0.0.1 , fd00::1 ")],
        dual_spec(),
    );
    assert_eq!(r.requested_ips, [ip("10.0.0.1"), ip("fd00::1")]);
}

#[test]
fn spec_load_balancer_ip_is_a_requested_ip() {
    let spec = ServiceSpec {
        load_balancer_ip: Some("10.0.0.9".into()),
        ..Default::default()
    };
    assert_eq!(request(&[], spec).requested_ips, [ip("10.0.0.9")]);
}

#[test]
fn load_balancer_ip_and_the_annotation_together_are_refused() {
    let spec = ServiceSpec {
        load_balancer_ip: Some("10.0.0.9".into()),
        ..Default::default()
    };
    for annotation in [
        "metallb.io/loadBalancerIPs",
        "metallb.universe.tf/loadBalancerIPs",
    ] {
        let err = parse(&[(annotation, "10.0.0.1")], spec.clone()).unwrap_err();
        assert_eq!(
            err,
            RequestError::BothRequestedIpForms {
                annotation: annotation.into()
            }
        );
        assert!(err.to_string().starts_with(&format!(
            "spec.loadBalancerIP and {annotation} are both set"
        )));
    }
}

#[test]
fn unparsable_ip_names_the_annotation() {
    let err = parse(
        &[("metallb.io/loadBalancerIPs", "10.0.0.1,1.2.3.x")],
        ServiceSpec::default(),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"metallb.io/loadBalancerIPs: "1.2.3.x" is not an IP address"#
    );
    let spec = ServiceSpec {
        load_balancer_ip: Some("nope".into()),
        ..Default::default()
    };
    assert_eq!(
        parse(&[], spec).unwrap_err().to_string(),
        r#"spec.loadBalancerIP: "nope" is not an IP address"#
    );
}

#[test]
fn two_ips_of_one_family_are_refused() {
    let err = parse(
        &[("metallb.io/loadBalancerIPs", "10.0.0.1,10.0.0.2")],
        dual_spec(),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "metallb.io/loadBalancerIPs: 10.0.0.1 and 10.0.0.2 are both IPv4; give at most one address per family"
    );
}

#[test]
fn requested_ip_of_a_family_the_service_lacks_is_refused() {
    let err = parse(
        &[("metallb.io/loadBalancerIPs", "fd00::1")],
        ServiceSpec::default(),
    )
    .unwrap_err();
    assert_eq!(
        err,
        RequestError::FamilyNotInService {
            field: "metallb.io/loadBalancerIPs".into(),
            ip: ip("fd00::1"),
            families: vec![Family::V4],
            policy: FamilyPolicy::SingleStack,
        }
    );
    assert_eq!(
        err.to_string(),
        "metallb.io/loadBalancerIPs: fd00::1 is IPv6, but the Service asks for [IPv4] only (spec.ipFamilies [IPv4], SingleStack)"
    );
    // SingleStack only takes the primary family even if both are listed.
    let spec = families(&["IPv4", "IPv6"], Some("SingleStack"));
    assert!(parse(&[("metallb.io/loadBalancerIPs", "fd00::1")], spec).is_err());
}

#[test]
fn require_dual_stack_with_one_requested_ip_is_refused() {
    let spec = families(&["IPv4", "IPv6"], Some("RequireDualStack"));
    let err = parse(&[("metallb.io/loadBalancerIPs", "10.0.0.1")], spec.clone()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "metallb.io/loadBalancerIPs: RequireDualStack needs a requested IPv6 address too"
    );
    let r = request(&[("metallb.io/loadBalancerIPs", "fd00::1,10.0.0.1")], spec);
    assert_eq!(r.requested_ips, [ip("fd00::1"), ip("10.0.0.1")]);
}

#[test]
fn families_and_policies_are_read() {
    // (ipFamilies, ipFamilyPolicy, primary, secondary, policy)
    let cases = [
        (vec![], None, Family::V4, None, FamilyPolicy::SingleStack),
        (
            vec!["IPv6"],
            None,
            Family::V6,
            None,
            FamilyPolicy::SingleStack,
        ),
        (
            vec!["IPv6", "IPv4"],
            Some("SingleStack"),
            Family::V6,
            None,
            FamilyPolicy::SingleStack,
        ),
        (
            vec!["IPv6", "IPv4"],
            Some("PreferDualStack"),
            Family::V6,
            Some(Family::V4),
            FamilyPolicy::PreferDualStack,
        ),
        (
            vec!["IPv4"],
            Some("PreferDualStack"),
            Family::V4,
            None,
            FamilyPolicy::PreferDualStack,
        ),
        (
            vec!["IPv4"],
            Some("RequireDualStack"),
            Family::V4,
            Some(Family::V6),
            FamilyPolicy::RequireDualStack,
        ),
    ];
    for (i, (list, policy, primary, secondary, want_policy)) in cases.into_iter().enumerate() {
        let r = request(&[], families(&list, policy));
        assert_eq!(
            (r.primary_family(), r.secondary_family(), r.family_policy),
            (primary, secondary, want_policy),
            "case {i}"
        );
    }
}

#[test]
fn unknown_field_values_are_refused_with_the_field() {
    let bad_port = ServiceSpec {
        ports: Some(vec![
            ServicePort {
                port: 80,
                ..Default::default()
            },
            ServicePort {
                port: 53,
                protocol: Some("QUIC".into()),
                ..Default::default()
            },
        ]),
        ..Default::default()
    };
    let cases = [
        (
            families(&["IPv5"], None),
            r#"spec.ipFamilies[0]: "IPv5" is not one of IPv4, IPv6"#,
        ),
        (
            families(&["IPv4", "IPv4"], None),
            "spec.ipFamilies: IPv4 is listed twice",
        ),
        (
            families(&["IPv4"], Some("Dual")),
            r#"spec.ipFamilyPolicy: "Dual" is not one of SingleStack, PreferDualStack, RequireDualStack"#,
        ),
        (
            bad_port,
            r#"spec.ports[1].protocol: "QUIC" is not one of TCP, UDP, SCTP"#,
        ),
        (
            ServiceSpec {
                ports: Some(vec![ServicePort {
                    port: 70000,
                    ..Default::default()
                }]),
                ..Default::default()
            },
            "spec.ports[0].port: 70000 is not a port number (1-65535)",
        ),
        (
            ServiceSpec {
                external_traffic_policy: Some("Global".into()),
                ..Default::default()
            },
            r#"spec.externalTrafficPolicy: "Global" is not one of Cluster, Local"#,
        ),
    ];
    for (spec, want) in cases {
        assert_eq!(parse(&[], spec).unwrap_err().to_string(), want);
    }
}

#[test]
fn a_service_without_name_or_namespace_is_refused() {
    let mut svc = service(&[], ServiceSpec::default());
    svc.metadata.namespace = None;
    assert_eq!(
        ServiceRequest::from_service(&svc, &Labels::new())
            .unwrap_err()
            .to_string(),
        "metadata.namespace: missing"
    );
}

#[test]
fn old_prefix_is_honoured_with_a_deprecation_warning() {
    let parsed = parse(
        &[
            ("metallb.universe.tf/address-pool", "legacy"),
            ("metallb.universe.tf/allow-shared-ip", "k"),
            ("metallb.universe.tf/loadBalancerIPs", "10.0.0.3"),
        ],
        ServiceSpec::default(),
    )
    .unwrap();
    let r = &parsed.request;
    assert_eq!(r.pool.as_deref(), Some("legacy"));
    assert_eq!(r.sharing_key.as_deref(), Some("k"));
    assert_eq!(r.requested_ips, [ip("10.0.0.3")]);
    let messages: Vec<String> = parsed.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(
        messages,
        [
            "annotation metallb.universe.tf/loadBalancerIPs is deprecated; use metallb.io/loadBalancerIPs",
            "annotation metallb.universe.tf/address-pool is deprecated; use metallb.io/address-pool",
            "annotation metallb.universe.tf/allow-shared-ip is deprecated; use metallb.io/allow-shared-ip",
        ]
    );
    assert!(
        parsed
            .warnings
            .iter()
            .all(|w| w.reason() == "deprecatedAnnotation")
    );
}

#[test]
fn new_prefix_wins_over_the_old_one() {
    let parsed = parse(
        &[
            ("metallb.io/address-pool", "new"),
            ("metallb.universe.tf/address-pool", "old"),
            ("metallb.io/allow-shared-ip", "new-key"),
            ("metallb.universe.tf/allow-shared-ip", "old-key"),
        ],
        ServiceSpec::default(),
    )
    .unwrap();
    assert_eq!(parsed.request.pool.as_deref(), Some("new"));
    assert_eq!(parsed.request.sharing_key.as_deref(), Some("new-key"));
    assert_eq!(
        parsed.warnings[0],
        RequestWarning::DeprecatedAnnotation {
            annotation: "metallb.universe.tf/address-pool".into(),
            replacement: "metallb.io/address-pool".into(),
            overridden: true,
        }
    );
    assert_eq!(
        parsed.warnings[0].to_string(),
        "annotation metallb.universe.tf/address-pool is deprecated and ignored because metallb.io/address-pool is also set; remove it"
    );
    assert_eq!(parsed.warnings.len(), 2);
}

#[test]
fn invalid_old_annotation_is_named_when_it_is_the_one_used() {
    let err = parse(
        &[("metallb.universe.tf/loadBalancerIPs", "x")],
        ServiceSpec::default(),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"metallb.universe.tf/loadBalancerIPs: "x" is not an IP address"#
    );
}

#[test]
fn empty_annotations_mean_unset() {
    let r = request(
        &[
            ("metallb.io/address-pool", " "),
            ("metallb.io/allow-shared-ip", ""),
            ("metallb.io/loadBalancerIPs", ""),
        ],
        ServiceSpec {
            load_balancer_ip: Some(String::new()),
            ..Default::default()
        },
    );
    assert!(r.pool.is_none() && r.sharing_key.is_none() && r.requested_ips.is_empty());
}

#[test]
fn ports_are_protocol_port_pairs_defaulting_to_tcp() {
    let port = |port: i32, protocol: Option<&str>| ServicePort {
        port,
        protocol: protocol.map(str::to_string),
        ..Default::default()
    };
    let spec = ServiceSpec {
        ports: Some(vec![
            port(80, None),
            port(53, Some("UDP")),
            port(53, Some("TCP")),
            port(80, Some("TCP")),
            port(9, Some("SCTP")),
        ]),
        ..Default::default()
    };
    assert_eq!(
        request(&[], spec).ports,
        [
            ProtocolPort::tcp(80),
            ProtocolPort::udp(53),
            ProtocolPort::tcp(53),
            ProtocolPort {
                protocol: Protocol::Sctp,
                port: 9
            },
        ]
    );
}

#[test]
fn local_traffic_policy_carries_the_selector() {
    let spec = ServiceSpec {
        external_traffic_policy: Some("Local".into()),
        selector: Some(map(&[("app", "web")])),
        ..Default::default()
    };
    assert_eq!(
        request(&[], spec).backend,
        Backend::Local(map(&[("app", "web")]))
    );
    let cluster = ServiceSpec {
        external_traffic_policy: Some("Cluster".into()),
        selector: Some(map(&[("app", "web")])),
        ..Default::default()
    };
    assert_eq!(request(&[], cluster).backend, Backend::Cluster);
}

#[test]
fn is_ours_requires_type_load_balancer_and_the_configured_class() {
    let with = |type_: &str, class: Option<&str>| {
        let mut svc = service(&[], ServiceSpec::default());
        let spec = svc.spec.as_mut().unwrap();
        spec.type_ = Some(type_.into());
        spec.load_balancer_class = class.map(str::to_string);
        svc
    };
    // (type, Service's class, configured class, ours)
    let cases = [
        ("LoadBalancer", None, None, true),
        ("LoadBalancer", Some("other"), None, false),
        ("LoadBalancer", Some("ferrolb"), Some("ferrolb"), true),
        ("LoadBalancer", Some("other"), Some("ferrolb"), false),
        ("LoadBalancer", None, Some("ferrolb"), false),
        ("ClusterIP", None, None, false),
        ("NodePort", None, None, false),
    ];
    for (i, (type_, class, configured, ours)) in cases.into_iter().enumerate() {
        assert_eq!(is_ours(&with(type_, class), configured), ours, "case {i}");
    }
    let no_spec = Service::default();
    assert!(!is_ours(&no_spec, None));
}
