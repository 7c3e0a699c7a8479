//! Explaining a Service served by node addresses (decision 0024, k3s ServiceLB's job): which
//! nodes are listed, why each other node is not (the `enablelb` label, `lbpool`, NotReady, no
//! speaker, no ready endpoint under `Local`, a port held by an earlier Service), and what is wrong
//! with the addresses in its status. The decision is `ferrolb_config::node_addresses`, run here
//! on the snapshot exactly as the controller runs it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ferrolb_config::allocator::{Backend, ServiceKey, ServiceRequest};
use ferrolb_config::node_address_inputs::{has_class, marked, ready_pod_nodes};
use ferrolb_config::node_addresses::{self as rules, AddressKind, TrafficPolicy};
use k8s_openapi::api::core::v1::Service;
use serde::Serialize;

use crate::diagnosis::{Code, Diagnosis, ObjectRef};
use crate::service::Snapshot;

/// How a Service served by node addresses gets them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NodeAddressReport {
    /// `ExternalIP` or `InternalIP`: which addresses of the nodes are listed (none: no node).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    /// The addresses the rules give now, in the order the status should list them.
    pub expected: Vec<IpAddr>,
    /// The nodes listed, with their addresses.
    pub listed: BTreeMap<String, Vec<IpAddr>>,
    /// The nodes not listed, with why.
    pub excluded: BTreeMap<String, String>,
}

/// Whether `service` is served by node addresses: it carries the controller's mark, or asks by
/// its class.
pub fn served(service: &Service) -> bool {
    marked(service) || has_class(service)
}

fn key_of(service: &Service) -> Option<ServiceKey> {
    Some(ServiceKey::new(
        service.metadata.namespace.as_deref()?,
        service.metadata.name.as_deref()?,
    ))
}

/// The rules' view of one Service, if its spec parses.
fn rules_service(snapshot: &Snapshot, service: &Service) -> Option<rules::Service> {
    let key = key_of(service)?;
    let labels = snapshot
        .namespaces
        .get(key.namespace())
        .cloned()
        .unwrap_or_default();
    let request = ServiceRequest::from_service(service, &labels).ok()?.request;
    let traffic = match request.backend {
        Backend::Local(_) => TrafficPolicy::Local {
            ready_endpoint_nodes: ready_endpoint_nodes(snapshot, &key),
        },
        Backend::Cluster => TrafficPolicy::Cluster,
    };
    Some(rules::Service {
        created: service
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(0, |t| t.0.as_second()),
        labels: service.metadata.labels.clone().unwrap_or_default(),
        ip_families: request.ip_families,
        ports: request.ports,
        traffic,
        current_ingress: crate::allocation::status_ips(service)
            .iter()
            .map(ToString::to_string)
            .collect(),
        key,
    })
}

/// Nodes holding a ready Pod endpoint of the Service (as k3s and the controller count them).
fn ready_endpoint_nodes(snapshot: &Snapshot, key: &ServiceKey) -> BTreeSet<String> {
    snapshot
        .slices
        .iter()
        .filter(|s| {
            s.metadata.namespace.as_deref() == Some(key.namespace())
                && s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("kubernetes.io/service-name"))
                    .is_some_and(|n| n == key.name())
        })
        .flat_map(ready_pod_nodes)
        .cloned()
        .collect()
}

/// Explains Service `service` (served by node addresses): the report and what is wrong.
pub fn explain(snapshot: &Snapshot, service: &Service) -> (NodeAddressReport, Vec<Diagnosis>) {
    let nodes = snapshot.nodes.iter().map(|n| rules::Node {
        name: n.name.clone(),
        labels: n.labels.clone(),
        internal: n.internal.clone(),
        external: n.external.clone(),
        ready: !n.not_ready,
        // Unknown speakers (their Leases unreadable) are taken as running: nothing is inferred
        // from what could not be read.
        speaker_alive: snapshot.speakers_unknown
            || snapshot.speakers.iter().any(|s| s.node == n.name && s.live),
    });
    let members: Vec<rules::Service> = snapshot
        .services
        .iter()
        .filter(|s| served(s))
        .filter_map(|s| rules_service(snapshot, s))
        .collect();
    let key = key_of(service);
    let mut report = NodeAddressReport {
        kind: None,
        expected: Vec::new(),
        listed: BTreeMap::new(),
        excluded: BTreeMap::new(),
    };
    let mut diagnoses = Vec::new();
    let object = |k: &ServiceKey| ObjectRef::namespaced("Service", k.namespace(), k.name());
    let outcome = rules::Nodes::new(nodes)
        .ok()
        .and_then(|nodes| rules::compute(&nodes, &members).ok())
        .and_then(|mut all| all.remove(key.as_ref()?));
    let (Some(key), Some(outcome)) = (key, outcome) else {
        return (report, diagnoses);
    };
    report.kind = outcome.kind.map(|k| match k {
        AddressKind::External => "ExternalIP",
        AddressKind::Internal => "InternalIP",
    });
    report.expected = outcome.ingress.clone();
    report.listed = outcome.listed.clone();
    report.excluded = outcome
        .excluded
        .iter()
        .map(|e| (e.node.clone(), e.reason.to_string()))
        .collect();
    let status = crate::allocation::status_ips(service);
    if status != outcome.ingress {
        diagnoses.push(Diagnosis {
            code: Code::NodeAddressesBehind,
            object: object(&key),
            field: Some("status.loadBalancer.ingress".into()),
            problem: format!(
                "the status lists [{}], the nodes now give [{}]",
                list(&status),
                list(&outcome.ingress)
            ),
            fix: "check that the controller runs with node addresses on (controller.nodeAddresses.enabled, --node-addresses) and is leading; a change is written within seconds".into(),
        });
    }
    if outcome.ingress.is_empty() {
        diagnoses.push(Diagnosis {
            code: Code::NoNodeAddress,
            object: object(&key),
            field: None,
            problem: "no node can serve this Service: every node is left out (see why for each)".into(),
            fix: "make a node eligible: Ready with a speaker running, labelled svccontroller.k3s.cattle.io/enablelb=true where that label is used, with a ready endpoint under externalTrafficPolicy: Local, and with the Service's ports free".into(),
        });
    }
    let node_address: BTreeSet<IpAddr> = snapshot
        .nodes
        .iter()
        .flat_map(|n| n.internal.iter().chain(&n.external).copied())
        .collect();
    for ip in status.iter().filter(|ip| !node_address.contains(ip)) {
        diagnoses.push(Diagnosis {
            code: Code::NotANodeAddress,
            object: object(&key),
            field: Some("status.loadBalancer.ingress".into()),
            problem: format!(
                "{ip} is no node's address: no node receives its traffic, so no kube-proxy rule for it ever sees a packet"
            ),
            fix: "let the controller write the status again (it lists only node addresses); if it does not, see the diagnosis above".into(),
        });
    }
    for ip in proxy_mode(service) {
        diagnoses.push(Diagnosis {
            code: Code::NotANodeAddress,
            object: object(&key),
            field: Some("status.loadBalancer.ingress[].ipMode".into()),
            problem: format!(
                "{ip} has ipMode Proxy: kube-proxy writes no rule for it, and a node address has no proxy in front"
            ),
            fix: "remove ipMode (or set VIP); ferrolb writes VIP".into(),
        });
    }
    (report, diagnoses)
}

/// Ingress addresses with `ipMode: Proxy`.
fn proxy_mode(service: &Service) -> Vec<String> {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter(|i| i.ip_mode.as_deref() == Some("Proxy"))
        .filter_map(|i| i.ip.clone())
        .collect()
}

fn list(ips: &[IpAddr]) -> String {
    ips.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use ferrolb_testkit::objects;

    use super::*;
    use crate::live::{LiveSpeaker, NodeFacts};
    use crate::service::{Explainer, render_text};
    use ferrolb_config::node_addresses::{CLASS, SERVED_BY_ANNOTATION, SERVED_BY_NODE_ADDRESSES};

    fn node(name: &str, ip: &str, ready: bool) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            not_ready: !ready,
            internal: vec![ip.parse().unwrap()],
            ..NodeFacts::default()
        }
    }

    fn speaker(node: &str) -> LiveSpeaker {
        LiveSpeaker {
            node: node.into(),
            live: true,
            ..LiveSpeaker::default()
        }
    }

    /// Service `name` in `web` on port 80/TCP created at `second`, served by node addresses,
    /// listing `ips`.
    fn served_service(name: &str, second: i64, ips: &[&str]) -> Service {
        objects::service(name)
            .namespace("web")
            .port(80, "TCP")
            .annotation(SERVED_BY_ANNOTATION, SERVED_BY_NODE_ADDRESSES)
            .ingress(ips)
            .with(|s| {
                s.metadata.creation_timestamp =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        k8s_openapi::jiff::Timestamp::from_second(second).unwrap(),
                    ))
            })
            .build()
    }

    fn snapshot(services: Vec<Service>) -> Snapshot {
        Snapshot {
            namespace: "metallb-system".into(),
            services,
            nodes: vec![
                node("n1", "198.18.0.11", true),
                node("n2", "198.18.0.12", true),
                node("n3", "198.18.0.13", false),
            ],
            speakers: vec![speaker("n1")],
            ..Snapshot::default()
        }
    }

    fn codes(r: &crate::service::ServiceReport) -> Vec<Code> {
        r.diagnoses.iter().map(|d| d.code).collect()
    }

    #[test]
    fn each_node_is_listed_or_given_its_reason() {
        let s = snapshot(vec![served_service("web", 1, &["198.18.0.11"])]);
        let r = Explainer::new(&s).explain(&ServiceKey::new("web", "web"));
        let na = r.node_addresses.as_ref().unwrap();
        assert_eq!(na.kind, Some("InternalIP"));
        assert_eq!(na.listed.keys().collect::<Vec<_>>(), ["n1"]);
        assert!(na.excluded["n2"].contains("speaker"), "{:?}", na.excluded);
        assert!(na.excluded["n3"].contains("Ready"), "{:?}", na.excluded);
        assert!(codes(&r).is_empty(), "{:?}", r.diagnoses);
        let text = render_text(&r);
        assert!(text.contains("1. Node addresses: InternalIP"), "{text}");
        assert!(text.contains("n3: not listed"), "{text}");
        // kube-proxy's chains are shown for the node addresses as for any LoadBalancer IP.
        assert_eq!(r.kube_proxy.len(), 1);
    }

    #[test]
    fn a_port_held_by_an_earlier_service_names_the_holder() {
        let s = snapshot(vec![
            served_service("first", 1, &["198.18.0.11"]),
            served_service("second", 2, &[]),
        ]);
        let r = Explainer::new(&s).explain(&ServiceKey::new("web", "second"));
        let na = r.node_addresses.as_ref().unwrap();
        assert!(na.excluded["n1"].contains("web/first"), "{:?}", na.excluded);
        assert_eq!(codes(&r), [Code::NoNodeAddress]);
    }

    #[test]
    fn a_status_behind_the_nodes_or_off_every_node_is_diagnosed() {
        let s = snapshot(vec![served_service(
            "web",
            1,
            &["198.18.0.11", "198.18.0.99"],
        )]);
        let r = Explainer::new(&s).explain(&ServiceKey::new("web", "web"));
        assert_eq!(
            codes(&r),
            [Code::NodeAddressesBehind, Code::NotANodeAddress],
            "{:?}",
            r.diagnoses
        );
        assert!(r.diagnoses[1].problem.contains("198.18.0.99"));
    }

    #[test]
    fn status_lists_the_services_served_by_node_addresses() {
        let s = snapshot(vec![served_service("web", 1, &["198.18.0.11"])]);
        let r = crate::status::status(&s);
        assert_eq!(r.node_addresses.len(), 1);
        assert_eq!(r.node_addresses[0].0, "web/web");
        let text = crate::status::render_text(&r);
        assert!(text.contains("Served by node addresses:"), "{text}");
        assert!(text.contains("198.18.0.11"), "{text}");
    }

    #[test]
    fn explain_by_ip_finds_a_service_of_the_node_address_class() {
        let classed = objects::service("web")
            .namespace("web")
            .port(80, "TCP")
            .load_balancer_class(CLASS)
            .ingress(&["198.18.0.11"])
            .build();
        let s = snapshot(vec![classed]);
        assert_eq!(
            crate::service::service_of_ip(&s, "198.18.0.11".parse().unwrap()),
            Some(ServiceKey::new("web", "web"))
        );
    }
}
