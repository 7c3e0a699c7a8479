//! `ferrolb status`: the cluster at a glance. The pools with their usage and the advertisements
//! covering them, how many LoadBalancer Services hold addresses, the speakers that are alive,
//! and every problem [`crate::service::explain`] finds, configuration first.

use std::fmt::Write as _;

use ferrolb_config::allocator::{Allocator, ServiceKey, ServiceRequest, is_ours, status_ips};
use ferrolb_config::selector::Labels;
use serde::Serialize;

use crate::diagnosis::{Code, Diagnosis, ObjectRef};
use crate::live::LiveSpeaker;
use crate::service::{self, Snapshot};

/// A speaker, as its presence Lease and its live report show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Speaker {
    /// Its node.
    pub node: String,
    /// Whether the Lease was renewed within its duration.
    pub live: bool,
    /// Layer 2: whether it hears a quorum of the speakers (it may own IPs only then); absent
    /// when its report was not read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quorum: Option<bool>,
    /// Its BGP sessions.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sessions: Vec<SessionState>,
    /// Why its report could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One BGP session of a speaker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SessionState {
    /// BGPPeer name.
    pub peer: String,
    /// Its address (or interface).
    pub address: String,
    /// FSM state, or `NotStarted`.
    pub state: String,
    /// Prefixes advertised on it.
    pub prefixes: usize,
}

impl Speaker {
    /// From what the snapshot holds of it.
    fn from_live(s: &LiveSpeaker) -> Self {
        Self {
            node: s.node.clone(),
            live: s.live,
            quorum: s
                .report
                .as_ref()
                .filter(|r| r.planned)
                .map(|r| r.layer2.quorum),
            sessions: s
                .report
                .iter()
                .flat_map(|r| &r.bgp.peers)
                .map(|p| SessionState {
                    peer: p.name.clone(),
                    address: p.address.clone(),
                    state: p.state.clone(),
                    prefixes: p.routes.len(),
                })
                .collect(),
            error: s.error.clone(),
        }
    }
}

/// One pool's usage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PoolUsage {
    /// IPAddressPool name.
    pub name: String,
    /// Whether Services get addresses from it without asking.
    pub auto_assign: bool,
    /// IPv4 addresses held / that it can hand out.
    pub ipv4: (i64, i64),
    /// IPv6 addresses held / that it can hand out.
    pub ipv6: (i64, i64),
    /// The advertisements covering it.
    pub advertised_by: Vec<String>,
}

/// The cluster at a glance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StatusReport {
    /// [`service::SCHEMA`].
    pub schema: &'static str,
    /// The pools, by name.
    pub pools: Vec<PoolUsage>,
    /// LoadBalancer Services of ours.
    pub services: usize,
    /// Those holding at least one address.
    pub services_with_ips: usize,
    /// Services served by node addresses (decision 0024): `namespace/name` and the addresses
    /// in their status.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub node_addresses: Vec<(String, Vec<std::net::IpAddr>)>,
    /// The speakers' presence.
    pub speakers: Vec<Speaker>,
    /// Every problem found: the configuration's once, then each Service's own.
    pub diagnoses: Vec<Diagnosis>,
}

/// The status of the cluster in `snapshot`.
pub fn status(snapshot: &Snapshot) -> StatusReport {
    let speakers: Vec<Speaker> = snapshot.speakers.iter().map(Speaker::from_live).collect();
    let no_labels = Labels::new();
    let ours: Vec<_> = snapshot
        .services
        .iter()
        .filter(|s| is_ours(s, snapshot.lb_class.as_deref()) || crate::node_addresses::served(s))
        .collect();
    let node_addresses = ours
        .iter()
        .filter(|s| crate::node_addresses::served(s))
        .filter_map(|s| {
            let ns = s.metadata.namespace.as_deref()?;
            let name = s.metadata.name.as_deref()?;
            Some((format!("{ns}/{name}"), status_ips(s)))
        })
        .collect();
    // Usage as the controller counts it: every Service's addresses claimed again.
    let mut allocator = Allocator::new(snapshot.config.pools.values().cloned().collect());
    let mut keys = Vec::new();
    for s in &ours {
        let labels = s
            .metadata
            .namespace
            .as_ref()
            .and_then(|ns| snapshot.namespaces.get(ns))
            .unwrap_or(&no_labels);
        if let Ok(parsed) = ServiceRequest::from_service(s, labels) {
            let ips = status_ips(s);
            if !ips.is_empty() {
                let _ = allocator.assign(&parsed.request, &ips);
            }
        }
        if let (Some(ns), Some(name)) = (&s.metadata.namespace, &s.metadata.name) {
            keys.push(ServiceKey::new(ns.as_str(), name.as_str()));
        }
    }
    let pools = snapshot
        .config
        .pools
        .values()
        .map(|pool| {
            let stats = allocator.pool_stats(&pool.name).unwrap_or_default();
            PoolUsage {
                name: pool.name.clone(),
                auto_assign: pool.auto_assign,
                ipv4: (stats.assigned_ipv4, stats.total_ipv4),
                ipv6: (stats.assigned_ipv6, stats.total_ipv6),
                advertised_by: service::covering(&snapshot.config, pool, None),
            }
        })
        .collect();
    // The configuration's problems once, then each Service's own.
    // Problems of the cluster (a speaker cut off, a peer down) show up under every Service
    // they touch: each is listed once.
    let mut diagnoses = service::config_diagnoses(snapshot);
    let mut seen: std::collections::HashSet<Diagnosis> = diagnoses.iter().cloned().collect();
    let mut explainer = service::Explainer::new(snapshot);
    for key in &keys {
        for d in explainer.explain(key).diagnoses {
            if d.code != Code::ConfigLeftOut && seen.insert(d.clone()) {
                diagnoses.push(d);
            }
        }
    }
    if !ours.is_empty() && !snapshot.speakers_unknown && !speakers.iter().any(|s| s.live) {
        diagnoses.push(Diagnosis {
            code: Code::NoSpeaker,
            object: ObjectRef::namespaced("DaemonSet", &snapshot.namespace, "speaker"),
            field: None,
            problem: "no speaker is alive (no fresh presence Lease): nothing is announced".into(),
            fix: "check the speaker DaemonSet's pods and their logs".into(),
        });
    }
    StatusReport {
        schema: service::SCHEMA,
        pools,
        services: ours.len(),
        services_with_ips: ours.iter().filter(|s| !status_ips(s).is_empty()).count(),
        node_addresses,
        speakers,
        diagnoses,
    }
}

/// The status as text.
pub fn render_text(r: &StatusReport) -> String {
    let mut t = String::new();
    let _ = writeln!(t, "Pools:");
    if r.pools.is_empty() {
        let _ = writeln!(t, "  none");
    }
    for p in &r.pools {
        let mut used = Vec::new();
        if p.ipv4.1 > 0 {
            used.push(format!("IPv4 {}/{}", p.ipv4.0, p.ipv4.1));
        }
        if p.ipv6.1 > 0 {
            used.push(format!("IPv6 {}/{}", p.ipv6.0, p.ipv6.1));
        }
        let _ = writeln!(
            t,
            "  {:<16} used {}{}; advertised by {}",
            p.name,
            used.join(", "),
            if p.auto_assign {
                ""
            } else {
                " (autoAssign: false)"
            },
            if p.advertised_by.is_empty() {
                "nothing".to_string()
            } else {
                p.advertised_by.join(", ")
            }
        );
    }
    let _ = writeln!(
        t,
        "Services: {} LoadBalancer, {} with addresses",
        r.services, r.services_with_ips
    );
    if !r.node_addresses.is_empty() {
        let _ = writeln!(t, "Served by node addresses:");
        for (service, ips) in &r.node_addresses {
            let ips: Vec<String> = ips.iter().map(ToString::to_string).collect();
            let _ = writeln!(
                t,
                "  {service:<32} {}",
                if ips.is_empty() {
                    "no node".to_string()
                } else {
                    ips.join(", ")
                }
            );
        }
    }
    if r.speakers.is_empty() {
        let _ = writeln!(t, "Speakers: none");
    } else {
        let _ = writeln!(t, "Speakers:");
    }
    for s in &r.speakers {
        let mut what = Vec::new();
        if !s.live {
            what.push("Lease expired".to_string());
        }
        match s.quorum {
            Some(true) => what.push("layer 2 quorum".to_string()),
            Some(false) => what.push("NO layer 2 quorum (cut off)".to_string()),
            None => {}
        }
        if let Some(e) = &s.error {
            what.push(format!("report not read: {e}"));
        }
        let _ = writeln!(t, "  {:<16} {}", s.node, what.join("; "));
        for p in &s.sessions {
            let _ = writeln!(
                t,
                "    BGP {} {} {}, {} prefixes",
                p.peer, p.address, p.state, p.prefixes
            );
        }
    }
    service::render_problems(&mut t, &r.diagnoses);
    t
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use ferrolb_config::model::{Config, L2Advertisement};
    use ferrolb_testkit::model::pool;
    use ferrolb_testkit::objects;
    use k8s_openapi::api::core::v1::ServicePort;

    use super::*;

    fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    fn snapshot() -> Snapshot {
        let mut config = Config::default();
        config.pools.insert(
            "a".into(),
            pool("a", &["198.18.200.0/30", "fd00:18::c8:0/126"]),
        );
        config.l2_advertisements.insert(
            "l2".into(),
            L2Advertisement {
                name: "l2".into(),
                ..Default::default()
            },
        );
        // Port 80 without a protocol; the annotation map and the ingress list are present
        // even when empty.
        let svc = |name: &str, annotations: &[(&str, &str)], ips: &[&str]| {
            objects::service(name)
                .namespace("web")
                .annotations(annotations.iter().copied())
                .add_port(ServicePort {
                    port: 80,
                    ..Default::default()
                })
                .ingress(ips)
                .build()
        };
        Snapshot {
            namespace: "metallb-system".into(),
            config,
            services: vec![
                svc("ok", &[], &["198.18.200.0"]),
                svc("bad", &[("metallb.io/address-pool", "nope")], &[]),
            ],
            l2_statuses: vec![from(serde_json::json!({
                "apiVersion": "metallb.io/v1beta1", "kind": "ServiceL2Status",
                "metadata": {"namespace": "metallb-system", "name": "x"}, "spec": {},
                "status": {"node": "node1", "serviceName": "ok", "serviceNamespace": "web"},
            }))],
            ..Default::default()
        }
    }

    #[test]
    fn usage_speakers_and_each_services_problems() {
        let mut s = snapshot();
        s.speakers = vec![LiveSpeaker {
            node: "node1".into(),
            live: true,
            ..Default::default()
        }];
        let r = status(&s);
        assert_eq!(r.pools.len(), 1);
        assert_eq!(r.pools[0].ipv4, (1, 4));
        assert_eq!(r.pools[0].ipv6, (0, 4));
        assert_eq!(r.pools[0].advertised_by, ["L2Advertisement l2"]);
        assert_eq!((r.services, r.services_with_ips), (2, 1));
        let codes: Vec<Code> = r.diagnoses.iter().map(|d| d.code).collect();
        assert_eq!(codes, [Code::UnknownPool]);
        let text = render_text(&r);
        for want in [
            "a                used IPv4 1/4, IPv6 0/4",
            "Services: 2 LoadBalancer, 1 with addresses",
            "Speakers:\n  node1",
            "unknown-pool",
        ] {
            assert!(text.contains(want), "{want:?} not in:\n{text}");
        }
    }

    #[test]
    fn no_live_speaker_is_a_problem() {
        let mut s = snapshot();
        s.speakers = vec![LiveSpeaker {
            node: "node1".into(),
            live: false,
            ..Default::default()
        }];
        let r = status(&s);
        assert!(r.diagnoses.iter().any(|d| d.code == Code::NoSpeaker));
        assert!(render_text(&r).contains("Lease expired"));
    }

    /// A left-out object is listed once, not once per Service.
    #[test]
    fn configuration_problems_are_listed_once() {
        let mut s = snapshot();
        s.services.remove(1);
        let mut more = s.services[0].clone();
        more.metadata.name = Some("ok2".into());
        s.services.push(more);
        s.config_errors.push(ferrolb_config::validate::ConfigError {
            object: ferrolb_config::validate::ObjectRef {
                kind: ferrolb_config::validate::Kind::IPAddressPool,
                namespace: "metallb-system".into(),
                name: "overlap".into(),
            },
            field: "spec.addresses[0]".into(),
            message: "overlaps pool a".into(),
        });
        let r = status(&s);
        let left_out = r
            .diagnoses
            .iter()
            .filter(|d| d.code == Code::ConfigLeftOut)
            .count();
        assert_eq!(left_out, 1, "{:?}", r.diagnoses);
    }
}
