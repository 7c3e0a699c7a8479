//! What a speaker knows of the cluster, reduced from Kubernetes objects to what announcement
//! planning reads: Services holding IPs with where their endpoints serve, and nodes with their
//! labels, conditions and addresses.
//!
//! The conversions are pure so that planning is tested from plain objects, without a cluster.

use std::collections::BTreeSet;
use std::net::IpAddr;

use ferrolb_config::allocator::{ServiceKey, is_ours};
use ferrolb_config::selector::Labels;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};

/// Label that keeps a node out of every announcement (a Kubernetes well-known label).
pub const EXCLUDE_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// Label of an EndpointSlice naming its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// A LoadBalancer Service of ours that holds IPs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceView {
    /// Namespace and name.
    pub key: ServiceKey,
    /// The Service's labels (advertisements select Services by them).
    pub labels: Labels,
    /// IPs from `status.loadBalancer.ingress`, sorted, without duplicates.
    pub ips: Vec<IpAddr>,
    /// `externalTrafficPolicy: Local`: only nodes with a serving endpoint may attract traffic.
    pub local_traffic: bool,
    /// Nodes with at least one serving endpoint.
    pub serving_nodes: BTreeSet<String>,
    /// Whether any endpoint serves (on a node or not).
    pub any_serving: bool,
}

impl ServiceView {
    /// Reads a Service and its EndpointSlices. `None` when the Service is not ours (type,
    /// `loadBalancerClass`) or holds no IP.
    pub fn from_service<'a>(
        service: &Service,
        slices: impl IntoIterator<Item = &'a EndpointSlice>,
        lb_class: Option<&str>,
    ) -> Option<Self> {
        if !is_ours(service, lb_class) {
            return None;
        }
        let mut ips: Vec<IpAddr> = service
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|i| i.ip.as_deref())
            .filter_map(|ip| ip.parse().ok())
            .collect();
        ips.sort();
        ips.dedup();
        if ips.is_empty() {
            return None;
        }
        let local_traffic = service
            .spec
            .as_ref()
            .and_then(|s| s.external_traffic_policy.as_deref())
            == Some("Local");
        let mut serving_nodes = BTreeSet::new();
        let mut any_serving = false;
        for endpoint in slices.into_iter().flat_map(|s| &s.endpoints) {
            if serving(endpoint) {
                any_serving = true;
                if let Some(node) = &endpoint.node_name {
                    serving_nodes.insert(node.clone());
                }
            }
        }
        Some(ServiceView {
            key: ServiceKey::new(
                service.metadata.namespace.as_deref().unwrap_or_default(),
                service.metadata.name.as_deref().unwrap_or_default(),
            ),
            labels: service.metadata.labels.clone().unwrap_or_default(),
            ips,
            local_traffic,
            serving_nodes,
            any_serving,
        })
    }
}

/// Whether an endpoint serves traffic: ready (an absent condition means ready, as the API
/// documents), or still serving while it terminates.
pub fn serving(endpoint: &Endpoint) -> bool {
    let conditions = endpoint.conditions.as_ref();
    let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
    let serving = conditions.and_then(|c| c.serving).unwrap_or(false);
    ready || serving
}

/// The Service an EndpointSlice belongs to, from its label.
pub fn slice_service(slice: &EndpointSlice) -> Option<ServiceKey> {
    let name = slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
    Some(ServiceKey::new(
        slice.metadata.namespace.as_deref().unwrap_or_default(),
        name.as_str(),
    ))
}

/// A node as planning sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeView {
    /// Node name.
    pub name: String,
    /// Node labels (advertisements and peers select nodes by them).
    pub labels: Labels,
    /// Condition `NetworkUnavailable=True`: the node must not attract traffic.
    pub network_unavailable: bool,
    /// Carries the exclusion label.
    pub excluded: bool,
    /// Addresses other speakers reach it at: InternalIPs first, then ExternalIPs.
    pub addresses: Vec<IpAddr>,
}

impl NodeView {
    /// Reads a Node.
    pub fn from_node(node: &Node) -> Self {
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let status = node.status.as_ref();
        let network_unavailable = status
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "NetworkUnavailable" && c.status == "True");
        let mut addresses: Vec<(u8, IpAddr)> = status
            .and_then(|s| s.addresses.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|a| {
                let rank = match a.type_.as_str() {
                    "InternalIP" => 0,
                    "ExternalIP" => 1,
                    _ => return None,
                };
                Some((rank, a.address.parse().ok()?))
            })
            .collect();
        addresses.sort();
        NodeView {
            name: node.metadata.name.clone().unwrap_or_default(),
            excluded: labels.contains_key(EXCLUDE_LABEL),
            labels,
            network_unavailable,
            addresses: addresses.into_iter().map(|(_, ip)| ip).collect(),
        }
    }

    /// Whether the node may attract traffic at all (condition and exclusion label).
    pub fn may_announce(&self) -> bool {
        !self.network_unavailable && !self.excluded
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use serde_json::json;

    fn service(value: serde_json::Value) -> Service {
        serde_json::from_value(value).unwrap()
    }

    fn lb(ips: &[&str], etp: &str) -> Service {
        service(json!({
            "metadata": {"namespace": "ns", "name": "web", "labels": {"app": "web"}},
            "spec": {"type": "LoadBalancer", "externalTrafficPolicy": etp},
            "status": {"loadBalancer": {"ingress": ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>()}}
        }))
    }

    fn slice(endpoints: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": "web-abc", "labels": {SERVICE_NAME_LABEL: "web"}},
            "addressType": "IPv4",
            "endpoints": endpoints,
        }))
        .unwrap()
    }

    #[test]
    fn reads_ips_sorted_and_endpoints_by_node() {
        let svc = lb(&["fd00::1", "198.18.200.1", "198.18.200.1"], "Local");
        let s = slice(json!([
            {"addresses": ["10.0.0.1"], "nodeName": "b", "conditions": {"ready": true}},
            {"addresses": ["10.0.0.2"], "nodeName": "a"},
            {"addresses": ["10.0.0.3"], "nodeName": "c", "conditions": {"ready": false}},
            {"addresses": ["10.0.0.4"], "nodeName": "d", "conditions": {"ready": false, "serving": true}},
        ]));
        let view = ServiceView::from_service(&svc, [&s], None).unwrap();
        assert_eq!(
            view.ips,
            vec![
                "198.18.200.1".parse::<IpAddr>().unwrap(),
                "fd00::1".parse().unwrap()
            ]
        );
        assert!(view.local_traffic);
        assert!(view.any_serving);
        let nodes: Vec<&str> = view.serving_nodes.iter().map(String::as_str).collect();
        assert_eq!(nodes, ["a", "b", "d"]);
        assert_eq!(slice_service(&s), Some(view.key.clone()));
    }

    #[test]
    fn skips_services_without_ips_or_not_ours() {
        assert!(ServiceView::from_service(&lb(&[], "Cluster"), [], None).is_none());
        let mut foreign = lb(&["198.18.200.1"], "Cluster");
        foreign.spec.as_mut().unwrap().load_balancer_class = Some("other".into());
        assert!(ServiceView::from_service(&foreign, [], None).is_none());
        let mut cluster_ip = lb(&["198.18.200.1"], "Cluster");
        cluster_ip.spec.as_mut().unwrap().type_ = Some("ClusterIP".into());
        assert!(ServiceView::from_service(&cluster_ip, [], None).is_none());
        let view = ServiceView::from_service(&lb(&["198.18.200.1"], "Cluster"), [], None).unwrap();
        assert!(!view.any_serving && !view.local_traffic);
    }

    #[test]
    fn reads_node_conditions_labels_and_addresses() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {EXCLUDE_LABEL: ""}},
            "status": {
                "conditions": [{"type": "NetworkUnavailable", "status": "True"}],
                "addresses": [
                    {"type": "Hostname", "address": "n1"},
                    {"type": "ExternalIP", "address": "203.0.113.1"},
                    {"type": "InternalIP", "address": "198.18.0.11"},
                ]
            }
        }))
        .unwrap();
        let view = NodeView::from_node(&node);
        assert!(view.network_unavailable && view.excluded && !view.may_announce());
        assert_eq!(
            view.addresses,
            vec![
                "198.18.0.11".parse::<IpAddr>().unwrap(),
                "203.0.113.1".parse().unwrap()
            ]
        );
    }
}
