//! Builders for the Kubernetes objects ferrolb reads (`Service`, `Node`, `EndpointSlice`,
//! `Lease`), so that a test states the fields that matter to it in typed calls instead of a
//! `serde_json::json!` fixture. A builder sets only what it is told: an unset field stays `None`,
//! as in the JSON it replaces. Anything without a method: [`Builder::with`].
//!
//! ```
//! use ferrolb_testkit::objects::{endpoint, endpoint_slice, lease, node, service};
//!
//! let svc = service("web")
//!     .namespace("shop")
//!     .uid("u1")
//!     .external_traffic_policy("Local")
//!     .port(80, "TCP")
//!     .ingress(&["198.18.200.1", "fd00::1"])
//!     .build();
//! assert_eq!(svc.spec.as_ref().unwrap().type_.as_deref(), Some("LoadBalancer"));
//!
//! let slice = endpoint_slice("web-1")
//!     .namespace("shop")
//!     .service("web")
//!     .endpoint(endpoint("10.0.0.1").node("node1").ready(true))
//!     .build();
//! assert_eq!(slice.endpoints[0].node_name.as_deref(), Some("node1"));
//!
//! let n = node("node1").internal_ip("198.18.0.11").ready(true).build();
//! let l = lease("ferrolb-speaker-node1")
//!     .holder("node1")
//!     .duration_seconds(40)
//!     .renew_time("2026-12-02T12:00:00Z")
//!     .build();
//! # let _ = (n, l);
//! ```

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus, Node, NodeAddress, NodeCondition, NodeStatus,
    ObjectReference, Service, ServicePort, ServiceSpec, ServiceStatus,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// An object under construction: the metadata methods are shared, the others are per kind.
#[derive(Clone, Debug)]
#[must_use = "build() gives the object"]
pub struct Builder<T>(T);

impl<T: k8s_openapi::Metadata<Ty = ObjectMeta>> Builder<T> {
    fn meta(&mut self) -> &mut ObjectMeta {
        self.0.metadata_mut()
    }

    /// `metadata.namespace`.
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.meta().namespace = Some(namespace.into());
        self
    }

    /// `metadata.uid`.
    pub fn uid(mut self, uid: &str) -> Self {
        self.meta().uid = Some(uid.into());
        self
    }

    /// One label (the map is created on the first).
    pub fn label(self, key: &str, value: &str) -> Self {
        self.labels([(key, value)])
    }

    /// Labels; the map is present afterwards even if `labels` is empty (as `"labels": {}`).
    pub fn labels<'a>(mut self, labels: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        extend(self.meta().labels.get_or_insert_default(), labels);
        self
    }

    /// One annotation (the map is created on the first).
    pub fn annotation(self, key: &str, value: &str) -> Self {
        self.annotations([(key, value)])
    }

    /// Annotations; the map is present afterwards even if `annotations` is empty.
    pub fn annotations<'a>(
        mut self,
        annotations: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Self {
        extend(self.meta().annotations.get_or_insert_default(), annotations);
        self
    }
}

impl<T> Builder<T> {
    /// Changes what no method covers.
    pub fn with(mut self, change: impl FnOnce(&mut T)) -> Self {
        change(&mut self.0);
        self
    }

    /// The object.
    pub fn build(self) -> T {
        self.0
    }
}

fn extend<'a>(
    map: &mut BTreeMap<String, String>,
    entries: impl IntoIterator<Item = (&'a str, &'a str)>,
) {
    map.extend(entries.into_iter().map(|(k, v)| (k.into(), v.into())));
}

fn named(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        ..Default::default()
    }
}

/// A [`Service`] under construction; see [`service`].
pub type ServiceBuilder = Builder<Service>;

/// Service `name` of type LoadBalancer, with nothing else set (no namespace, ports or status).
pub fn service(name: &str) -> ServiceBuilder {
    Builder(Service {
        metadata: named(name),
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ..Default::default()
        }),
        status: None,
    })
}

impl ServiceBuilder {
    fn spec(&mut self) -> &mut ServiceSpec {
        self.0.spec.get_or_insert_default()
    }

    /// `spec.type` (LoadBalancer unless changed).
    pub fn service_type(mut self, type_: &str) -> Self {
        self.spec().type_ = Some(type_.into());
        self
    }

    /// Adds a port without a name or target port.
    pub fn port(self, port: i32, protocol: &str) -> Self {
        self.add_port(ServicePort {
            port,
            protocol: Some(protocol.into()),
            ..Default::default()
        })
    }

    /// Adds port `name` forwarding to `target_port` of the pods.
    pub fn named_port(self, name: &str, port: i32, target_port: i32, protocol: &str) -> Self {
        self.add_port(ServicePort {
            name: Some(name.into()),
            port,
            target_port: Some(IntOrString::Int(target_port)),
            protocol: Some(protocol.into()),
            ..Default::default()
        })
    }

    /// Adds a port as given.
    pub fn add_port(mut self, port: ServicePort) -> Self {
        self.spec().ports.get_or_insert_default().push(port);
        self
    }

    /// `spec.externalTrafficPolicy` (`Cluster` or `Local`).
    pub fn external_traffic_policy(mut self, policy: &str) -> Self {
        self.spec().external_traffic_policy = Some(policy.into());
        self
    }

    /// `spec.loadBalancerClass`.
    pub fn load_balancer_class(mut self, class: &str) -> Self {
        self.spec().load_balancer_class = Some(class.into());
        self
    }

    /// `spec.loadBalancerIP` (deprecated in Kubernetes, still read).
    pub fn load_balancer_ip(mut self, ip: &str) -> Self {
        self.spec().load_balancer_ip = Some(ip.into());
        self
    }

    /// `spec.ipFamilies`, in order.
    pub fn ip_families(mut self, families: &[&str]) -> Self {
        self.spec().ip_families = Some(families.iter().map(|f| f.to_string()).collect());
        self
    }

    /// `spec.ipFamilyPolicy` (`SingleStack`, `PreferDualStack`, `RequireDualStack`).
    pub fn ip_family_policy(mut self, policy: &str) -> Self {
        self.spec().ip_family_policy = Some(policy.into());
        self
    }

    /// One entry of `spec.selector`.
    pub fn selector(mut self, key: &str, value: &str) -> Self {
        extend(self.spec().selector.get_or_insert_default(), [(key, value)]);
        self
    }

    /// `status.loadBalancer.ingress`: one entry per IP with only `ip` set. The list is present
    /// even when `ips` is empty (as `"ingress": []`).
    pub fn ingress(mut self, ips: &[&str]) -> Self {
        let ingress = ips
            .iter()
            .map(|ip| LoadBalancerIngress {
                ip: Some(ip.to_string()),
                ..Default::default()
            })
            .collect();
        self.0.status = Some(ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(ingress),
            }),
            ..Default::default()
        });
        self
    }
}

/// A [`Node`] under construction; see [`node`].
pub type NodeBuilder = Builder<Node>;

/// Node `name`, with nothing else set (no spec, no status).
pub fn node(name: &str) -> NodeBuilder {
    Builder(Node {
        metadata: named(name),
        ..Default::default()
    })
}

impl NodeBuilder {
    fn status(&mut self) -> &mut NodeStatus {
        self.0.status.get_or_insert_default()
    }

    /// Adds an address of `type_` (`InternalIP`, `ExternalIP`, `Hostname`).
    pub fn address(mut self, type_: &str, address: &str) -> Self {
        self.status()
            .addresses
            .get_or_insert_default()
            .push(NodeAddress {
                type_: type_.into(),
                address: address.into(),
            });
        self
    }

    /// Adds an `InternalIP` address.
    pub fn internal_ip(self, address: &str) -> Self {
        self.address("InternalIP", address)
    }

    /// Adds condition `type_` with `status` (`True`, `False`, `Unknown`) and nothing else.
    pub fn condition(mut self, type_: &str, status: &str) -> Self {
        self.status()
            .conditions
            .get_or_insert_default()
            .push(NodeCondition {
                type_: type_.into(),
                status: status.into(),
                ..Default::default()
            });
        self
    }

    /// Adds the `Ready` condition.
    pub fn ready(self, ready: bool) -> Self {
        self.condition("Ready", if ready { "True" } else { "False" })
    }
}

/// An [`EndpointSlice`] under construction; see [`endpoint_slice`].
pub type EndpointSliceBuilder = Builder<EndpointSlice>;

/// EndpointSlice `name` of address type IPv4, with no endpoints, ports or labels.
pub fn endpoint_slice(name: &str) -> EndpointSliceBuilder {
    Builder(EndpointSlice {
        metadata: named(name),
        address_type: "IPv4".into(),
        endpoints: Vec::new(),
        ports: None,
    })
}

impl EndpointSliceBuilder {
    /// The Service the slice belongs to (its [`SERVICE_NAME_LABEL`]).
    pub fn service(self, service: &str) -> Self {
        self.label(SERVICE_NAME_LABEL, service)
    }

    /// `addressType` (`IPv4`, `IPv6`, `FQDN`).
    pub fn address_type(mut self, address_type: &str) -> Self {
        self.0.address_type = address_type.into();
        self
    }

    /// Adds an endpoint.
    pub fn endpoint(mut self, endpoint: EndpointBuilder) -> Self {
        self.0.endpoints.push(endpoint.0);
        self
    }

    /// Adds a port; `name` may be absent, as in a slice of a Service with one unnamed port.
    pub fn port(mut self, name: Option<&str>, port: i32, protocol: &str) -> Self {
        self.0.ports.get_or_insert_default().push(EndpointPort {
            name: name.map(str::to_string),
            port: Some(port),
            protocol: Some(protocol.into()),
            ..Default::default()
        });
        self
    }
}

/// An endpoint of an EndpointSlice under construction; see [`endpoint`].
#[derive(Clone, Debug)]
#[must_use = "pass it to EndpointSliceBuilder::endpoint"]
pub struct EndpointBuilder(Endpoint);

/// An endpoint at `address`, with no node, conditions or target.
pub fn endpoint(address: &str) -> EndpointBuilder {
    EndpointBuilder(Endpoint {
        addresses: vec![address.into()],
        ..Default::default()
    })
}

impl EndpointBuilder {
    fn conditions(&mut self) -> &mut EndpointConditions {
        self.0.conditions.get_or_insert_default()
    }

    /// `nodeName`.
    pub fn node(mut self, node: &str) -> Self {
        self.0.node_name = Some(node.into());
        self
    }

    /// `conditions.ready`.
    pub fn ready(mut self, ready: bool) -> Self {
        self.conditions().ready = Some(ready);
        self
    }

    /// `conditions.serving`.
    pub fn serving(mut self, serving: bool) -> Self {
        self.conditions().serving = Some(serving);
        self
    }

    /// `conditions.terminating`.
    pub fn terminating(mut self, terminating: bool) -> Self {
        self.conditions().terminating = Some(terminating);
        self
    }

    /// `targetRef`: Pod `name` (kind and name only).
    pub fn pod(mut self, name: &str) -> Self {
        self.0.target_ref = Some(ObjectReference {
            kind: Some("Pod".into()),
            name: Some(name.into()),
            ..Default::default()
        });
        self
    }
}

/// A [`Lease`] under construction; see [`lease`].
pub type LeaseBuilder = Builder<Lease>;

/// Lease `name`, with an empty spec.
pub fn lease(name: &str) -> LeaseBuilder {
    Builder(Lease {
        metadata: named(name),
        spec: Some(LeaseSpec::default()),
    })
}

impl LeaseBuilder {
    fn spec(&mut self) -> &mut LeaseSpec {
        self.0.spec.get_or_insert_default()
    }

    /// `spec.holderIdentity`.
    pub fn holder(mut self, holder: &str) -> Self {
        self.spec().holder_identity = Some(holder.into());
        self
    }

    /// `spec.leaseDurationSeconds`.
    pub fn duration_seconds(mut self, seconds: i32) -> Self {
        self.spec().lease_duration_seconds = Some(seconds);
        self
    }

    /// `spec.renewTime`, an RFC 3339 time such as `2026-12-02T12:00:00Z` (panics on another).
    pub fn renew_time(self, time: &str) -> Self {
        let time = time
            .parse()
            .unwrap_or_else(|e| panic!("renew time {time:?}: {e}"));
        self.renewed(MicroTime(time))
    }

    /// `spec.renewTime`.
    pub fn renewed(mut self, time: MicroTime) -> Self {
        self.spec().renew_time = Some(time);
        self
    }
}

#[cfg(test)]
mod tests {
    //! Each builder against the JSON fixture it replaces: the same object, field for field.

    use serde_json::json;

    use super::*;

    fn from<T: k8s_openapi::serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
        serde_json::from_value(value).expect("a valid object")
    }

    #[test]
    fn a_service_is_the_json_it_replaces() {
        let built = service("web")
            .namespace("ns")
            .uid("u1")
            .label("app", "web")
            .annotation("metallb.io/address-pool", "blue")
            .external_traffic_policy("Local")
            .load_balancer_class("ferrolb.io/a")
            .load_balancer_ip("198.18.200.9")
            .ip_families(&["IPv4", "IPv6"])
            .ip_family_policy("RequireDualStack")
            .selector("app", "web")
            .port(80, "TCP")
            .named_port("http", 8000, 8080, "TCP")
            .ingress(&["198.18.200.1", "fd00::1"])
            .build();
        let json: Service = from(json!({
            "metadata": {"namespace": "ns", "name": "web", "uid": "u1", "labels": {"app": "web"},
                         "annotations": {"metallb.io/address-pool": "blue"}},
            "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local",
                     "loadBalancerClass": "ferrolb.io/a", "loadBalancerIP": "198.18.200.9",
                     "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "RequireDualStack",
                     "selector": {"app": "web"},
                     "ports": [{"port": 80, "protocol": "TCP"},
                               {"name": "http", "port": 8000, "targetPort": 8080, "protocol": "TCP"}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.18.200.1"}, {"ip": "fd00::1"}]}}
        }));
        assert_eq!(built, json);
    }

    #[test]
    fn empty_maps_and_lists_are_present_as_in_json() {
        let built = service("web")
            .service_type("ClusterIP")
            .annotations([])
            .ingress(&[])
            .build();
        let json: Service = from(json!({
            "metadata": {"name": "web", "annotations": {}},
            "spec": {"type": "ClusterIP"},
            "status": {"loadBalancer": {"ingress": []}}
        }));
        assert_eq!(built, json);
        let bare: Service =
            from(json!({"metadata": {"name": "web"}, "spec": {"type": "LoadBalancer"}}));
        assert_eq!(service("web").build(), bare);
    }

    #[test]
    fn a_node_is_the_json_it_replaces() {
        let built = node("n1")
            .label("zone", "a")
            .ready(true)
            .condition("NetworkUnavailable", "True")
            .address("Hostname", "n1")
            .internal_ip("198.18.0.11")
            .build();
        let json: Node = from(json!({
            "metadata": {"name": "n1", "labels": {"zone": "a"}},
            "status": {
                "conditions": [{"type": "Ready", "status": "True"},
                               {"type": "NetworkUnavailable", "status": "True"}],
                "addresses": [{"type": "Hostname", "address": "n1"},
                              {"type": "InternalIP", "address": "198.18.0.11"}]
            }
        }));
        assert_eq!(built, json);
        assert_eq!(
            node("n1").build(),
            from(json!({"metadata": {"name": "n1"}}))
        );
    }

    #[test]
    fn an_endpoint_slice_is_the_json_it_replaces() {
        let built = endpoint_slice("web-abc")
            .namespace("ns")
            .service("web")
            .endpoint(endpoint("10.0.0.1").node("b").ready(true))
            .endpoint(endpoint("10.0.0.2").node("a").pod("p"))
            .endpoint(
                endpoint("10.0.0.4")
                    .node("d")
                    .ready(false)
                    .serving(true)
                    .terminating(true),
            )
            .port(Some("http"), 8080, "TCP")
            .build();
        let json: EndpointSlice = from(json!({
            "metadata": {"namespace": "ns", "name": "web-abc",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.0.0.1"], "nodeName": "b", "conditions": {"ready": true}},
                {"addresses": ["10.0.0.2"], "nodeName": "a", "targetRef": {"kind": "Pod", "name": "p"}},
                {"addresses": ["10.0.0.4"], "nodeName": "d",
                 "conditions": {"ready": false, "serving": true, "terminating": true}},
            ],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
        }));
        assert_eq!(built, json);
        let v6 = endpoint_slice("x").address_type("IPv6").build();
        assert_eq!(v6.address_type, "IPv6");
    }

    #[test]
    fn a_lease_is_the_json_it_replaces() {
        let built = lease("ferrolb-speaker-n1")
            .namespace("metallb-system")
            .holder("n1")
            .duration_seconds(40)
            .renew_time("2026-12-02T12:00:00.000000Z")
            .build();
        let json: Lease = from(json!({
            "metadata": {"name": "ferrolb-speaker-n1", "namespace": "metallb-system"},
            "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 40,
                     "renewTime": "2026-12-02T12:00:00.000000Z"}
        }));
        assert_eq!(built, json);
    }

    #[test]
    fn with_changes_what_no_method_covers() {
        let n = node("n1")
            .with(|n| n.spec.get_or_insert_default().pod_cidr = Some("198.19.1.0/24".into()))
            .build();
        assert_eq!(
            n.spec.and_then(|s| s.pod_cidr).as_deref(),
            Some("198.19.1.0/24")
        );
    }
}
