//! What the node-address rules ([`crate::node_addresses`], which take plain inputs) read of
//! Kubernetes objects: the controller, which serves by them, and `explain`, which says why, read
//! them through these, so that both read the same.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::node_addresses::{CLASS, SERVED_BY_ANNOTATION, SERVED_BY_NODE_ADDRESSES};

/// Whether `service` carries the controller's mark of a Service served by node addresses.
pub fn marked(service: &Service) -> bool {
    service
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SERVED_BY_ANNOTATION))
        .is_some_and(|v| v == SERVED_BY_NODE_ADDRESSES)
}

/// Whether `service` is a LoadBalancer of class [`CLASS`] (node addresses, never a pool).
pub fn has_class(service: &Service) -> bool {
    service.spec.as_ref().is_some_and(|s| {
        s.type_.as_deref() == Some("LoadBalancer")
            && s.load_balancer_class.as_deref() == Some(CLASS)
    })
}

/// The addresses of `node`'s `status.addresses` of type `kind` (`InternalIP`, `ExternalIP`)
/// that parse.
pub fn node_addresses(node: &Node, kind: &str) -> Vec<IpAddr> {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .into_iter()
        .flatten()
        .filter(|a| a.type_ == kind)
        .filter_map(|a| a.address.parse().ok())
        .collect()
}

/// The nodes of `slice`'s ready Pod endpoints: endpoints with `conditions.ready`, a Pod
/// `targetRef` and a `nodeName`, as k3s counts them (L268-L275).
pub fn ready_pod_nodes(slice: &EndpointSlice) -> impl Iterator<Item = &String> {
    slice
        .endpoints
        .iter()
        .filter(|e| {
            e.conditions.as_ref().and_then(|c| c.ready) == Some(true)
                && e.target_ref.as_ref().and_then(|t| t.kind.as_deref()) == Some("Pod")
        })
        .filter_map(|e| e.node_name.as_ref())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn a_node_s_addresses_by_type_and_the_ready_pod_endpoints_of_a_slice() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1"},
            "status": {"addresses": [
                {"type": "InternalIP", "address": "198.18.0.11"},
                {"type": "InternalIP", "address": "not an address"},
                {"type": "ExternalIP", "address": "fd00:18::1:b"},
                {"type": "Hostname", "address": "n1"},
            ]},
        }))
        .unwrap();
        assert_eq!(
            node_addresses(&node, "InternalIP"),
            ["198.18.0.11".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(node_addresses(&node, "ExternalIP").len(), 1);
        let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "s"},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.0.0.1"], "nodeName": "a", "conditions": {"ready": true}, "targetRef": {"kind": "Pod", "name": "p"}},
                {"addresses": ["10.0.0.2"], "nodeName": "b", "conditions": {"ready": false}, "targetRef": {"kind": "Pod", "name": "q"}},
                {"addresses": ["10.0.0.3"], "nodeName": "c", "conditions": {"ready": true}},
            ],
        }))
        .unwrap();
        assert_eq!(ready_pod_nodes(&slice).collect::<Vec<_>>(), ["a"]);
    }

    #[test]
    fn the_mark_and_the_class() {
        let service = |annotation: Option<&str>, class: Option<&str>| -> Service {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "s", "annotations": annotation.map(|v| serde_json::json!({SERVED_BY_ANNOTATION: v}))},
                "spec": {"type": "LoadBalancer", "loadBalancerClass": class},
            }))
            .unwrap()
        };
        assert!(marked(&service(Some(SERVED_BY_NODE_ADDRESSES), None)));
        assert!(!marked(&service(Some("other"), None)));
        assert!(has_class(&service(None, Some(CLASS))));
        assert!(!has_class(&service(None, Some("other.io/lb"))));
    }
}
