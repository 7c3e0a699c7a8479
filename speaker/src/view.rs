//! What a speaker knows of the cluster, reduced from Kubernetes objects to what announcement
//! planning reads: Services holding IPs with where their endpoints serve, and nodes with their
//! labels, conditions and addresses.
//!
//! The conversions are pure so that planning is tested from plain objects, without a cluster.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use ferrolb_config::allocator::{ServiceKey, is_ours};
use ferrolb_config::selector::Labels;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};

/// Label that keeps a node out of every announcement (a Kubernetes well-known label).
pub const EXCLUDE_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// Label of an EndpointSlice naming its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// A LoadBalancer Service of ours that holds IPs, with where its endpoints serve. The Service's
/// own fields (key, UID, labels, IPs, traffic policy) are those the watch keeps, shared with
/// its cache and read through `Deref` (`view.ips`); changing one through `DerefMut` copies
/// them first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceView {
    /// The Service as the watch keeps it.
    pub service: Arc<ServiceObject>,
    /// Nodes with at least one serving endpoint.
    pub serving_nodes: BTreeSet<String>,
    /// Whether any endpoint serves (on a node or not).
    pub any_serving: bool,
}

impl Deref for ServiceView {
    type Target = ServiceObject;

    fn deref(&self) -> &ServiceObject {
        &self.service
    }
}

impl DerefMut for ServiceView {
    fn deref_mut(&mut self) -> &mut ServiceObject {
        Arc::make_mut(&mut self.service)
    }
}

/// What the speaker keeps of a LoadBalancer Service of ours that holds IPs: what its view
/// reads. The watch reduces every Service to this on arrival ([`ServiceObject::reduce`]) and
/// keeps nothing of the others, most of a cluster's Services (issue #40: the cached objects
/// were most of a speaker's memory).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceObject {
    /// Namespace and name.
    pub key: ServiceKey,
    /// The Service's UID (Events attach to a Service's incarnation).
    pub uid: Option<String>,
    /// Its labels (advertisements select Services by them).
    pub labels: Labels,
    /// IPs from `status.loadBalancer.ingress`, sorted, without duplicates; never empty.
    pub ips: Vec<IpAddr>,
    /// `externalTrafficPolicy: Local`: only nodes with a serving endpoint may attract traffic.
    pub local_traffic: bool,
}

impl ServiceObject {
    /// What the speaker keeps of `service`: `None` when it is not ours (type,
    /// `loadBalancerClass`) or holds no IP.
    pub fn reduce(service: &Service, lb_class: Option<&str>) -> Option<Self> {
        if !is_ours(service, lb_class) {
            return None;
        }
        let mut ips: Vec<IpAddr> = ferrolb_config::allocator::status_ips(service);
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
        Some(ServiceObject {
            key: ServiceKey::new(
                service.metadata.namespace.as_deref().unwrap_or_default(),
                service.metadata.name.as_deref().unwrap_or_default(),
            ),
            uid: service.metadata.uid.clone(),
            labels: service.metadata.labels.clone().unwrap_or_default(),
            ips,
            local_traffic,
        })
    }

    /// What the speaker keeps of each of `services` (for a test or bench that holds whole
    /// objects, as the watch would see them).
    pub fn reduce_all(services: &[Arc<Service>], lb_class: Option<&str>) -> Vec<Arc<Self>> {
        let kept = services.iter().filter_map(|s| Self::reduce(s, lb_class));
        kept.map(Arc::new).collect()
    }
}

/// What the speaker keeps of an EndpointSlice with a serving endpoint: its Service and where
/// its endpoints serve. A slice with none adds nothing to its Service's view, and is not kept
/// (every Service with a selector has one, most of them ClusterIPs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceObject {
    /// The Service it belongs to.
    pub service: ServiceKey,
    /// Nodes with at least one serving endpoint of it, sorted, without duplicates.
    pub serving_nodes: Vec<String>,
    /// Whether any of its endpoints serves (on a node or not).
    pub any_serving: bool,
}

impl SliceObject {
    /// What the speaker keeps of `slice`: `None` when no Service label names its Service or
    /// no endpoint of it serves.
    pub fn reduce(slice: &EndpointSlice) -> Option<Self> {
        let service = slice_service(slice)?;
        let mut serving_nodes = Vec::new();
        let mut any_serving = false;
        for endpoint in slice.endpoints.iter().filter(|e| serving(e)) {
            any_serving = true;
            if let Some(node) = &endpoint.node_name {
                serving_nodes.push(node.clone());
            }
        }
        if !any_serving {
            return None;
        }
        serving_nodes.sort();
        serving_nodes.dedup();
        Some(SliceObject {
            service,
            serving_nodes,
            any_serving,
        })
    }

    /// What the speaker keeps of each of `slices` (see [`ServiceObject::reduce_all`]).
    pub fn reduce_all(slices: &[Arc<EndpointSlice>]) -> Vec<Arc<Self>> {
        let kept = slices.iter().filter_map(|s| Self::reduce(s));
        kept.map(Arc::new).collect()
    }
}

impl ServiceView {
    /// The view of a kept Service with its kept EndpointSlices.
    pub fn from_objects<'a>(
        service: &Arc<ServiceObject>,
        slices: impl IntoIterator<Item = &'a SliceObject>,
    ) -> Self {
        let mut serving_nodes = BTreeSet::new();
        let mut any_serving = false;
        for slice in slices {
            any_serving |= slice.any_serving;
            serving_nodes.extend(slice.serving_nodes.iter().cloned());
        }
        ServiceView {
            service: service.clone(),
            serving_nodes,
            any_serving,
        }
    }

    /// Reads a Service and its EndpointSlices (reduced as the watches reduce them). `None`
    /// when the Service is not ours (type, `loadBalancerClass`) or holds no IP.
    pub fn from_service<'a>(
        service: &Service,
        slices: impl IntoIterator<Item = &'a EndpointSlice>,
        lb_class: Option<&str>,
    ) -> Option<Self> {
        let service = Arc::new(ServiceObject::reduce(service, lb_class)?);
        let slices: Vec<SliceObject> = slices.into_iter().filter_map(SliceObject::reduce).collect();
        Some(Self::from_objects(&service, &slices))
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

/// The Nodes by name.
pub type NodeMap = std::collections::BTreeMap<String, NodeView>;

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

    /// What the speaker keeps of a Node (its watch cache holds this, not the Node): nothing
    /// for a Node without a name. Images, capacity, node info, the spec and the conditions'
    /// times are most of a Node and change on their own; a kubelet's status update that
    /// changes none of this leaves the view equal, and wakes nothing.
    pub fn reduce(node: &Node) -> Option<Self> {
        node.metadata.name.is_some().then(|| Self::from_node(node))
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
    use ferrolb_testkit::objects::{self, endpoint};

    fn lb(ips: &[&str], etp: &str) -> Service {
        objects::service("web")
            .namespace("ns")
            .label("app", "web")
            .external_traffic_policy(etp)
            .ingress(ips)
            .build()
    }

    fn slice(endpoints: impl IntoIterator<Item = objects::EndpointBuilder>) -> EndpointSlice {
        endpoints
            .into_iter()
            .fold(
                objects::endpoint_slice("web-abc")
                    .namespace("ns")
                    .service("web"),
                |slice, e| slice.endpoint(e),
            )
            .build()
    }

    #[test]
    fn reads_ips_sorted_and_endpoints_by_node() {
        let svc = lb(&["fd00::1", "198.18.200.1", "198.18.200.1"], "Local");
        let s = slice([
            endpoint("10.0.0.1").node("b").ready(true),
            endpoint("10.0.0.2").node("a"),
            endpoint("10.0.0.3").node("c").ready(false),
            endpoint("10.0.0.4").node("d").ready(false).serving(true),
        ]);
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
        let node = objects::node("n1")
            .label(EXCLUDE_LABEL, "")
            .condition("NetworkUnavailable", "True")
            .address("Hostname", "n1")
            .address("ExternalIP", "203.0.113.1")
            .address("InternalIP", "198.18.0.11")
            .build();
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

    #[test]
    fn keeps_of_a_service_and_its_slices_what_planning_reads() {
        let mut svc = lb(&["198.18.200.1", "fd00::1"], "Local");
        svc.metadata.uid = Some("u1".into());
        svc.metadata.annotations = Some([("big".to_string(), "x".repeat(1000))].into());
        let kept = ServiceObject::reduce(&svc, None).unwrap();
        assert_eq!(kept.uid.as_deref(), Some("u1"));
        assert_eq!(kept.labels, [("app".to_string(), "web".to_string())].into());
        let s = slice([
            endpoint("10.0.0.1").node("b").ready(true),
            endpoint("10.0.0.2").node("a").pod("p"),
            endpoint("10.0.0.5").node("a"),
            endpoint("10.0.0.3").node("c").ready(false),
            endpoint("10.0.0.4")
                .node("d")
                .ready(false)
                .serving(true)
                .terminating(true),
        ]);
        let slice_kept = SliceObject::reduce(&s).unwrap();
        assert_eq!(slice_kept.serving_nodes, ["a", "b", "d"]);
        assert_eq!(Some(slice_kept.service.clone()), slice_service(&s));
        // A slice that names no Service is not kept; nor is a Service that is not ours.
        let mut orphan = s.clone();
        orphan.metadata.labels = None;
        assert!(SliceObject::reduce(&orphan).is_none());
        for (class, ty) in [(Some("other"), "LoadBalancer"), (None, "ClusterIP")] {
            let mut other = svc.clone();
            other.spec.as_mut().unwrap().load_balancer_class = class.map(str::to_string);
            other.spec.as_mut().unwrap().type_ = Some(ty.into());
            assert!(ServiceObject::reduce(&other, None).is_none());
        }
        // A slice that serves nowhere is not kept either: the view is the same without it.
        let idle = slice([endpoint("10.0.0.3").node("c").ready(false)]);
        assert!(SliceObject::reduce(&idle).is_none());
        let view = ServiceView::from_service(&svc, [&idle], None).unwrap();
        assert!(!view.any_serving && view.serving_nodes.is_empty());
        // Serving, on no node.
        let nowhere = slice([endpoint("10.0.0.6").ready(true)]);
        let view =
            ServiceView::from_objects(&Arc::new(kept), [&SliceObject::reduce(&nowhere).unwrap()]);
        assert!(view.any_serving && view.serving_nodes.is_empty());
    }

    #[test]
    fn a_node_reduces_to_what_planning_and_validation_read() {
        let node = objects::node("n1")
            .labels([(EXCLUDE_LABEL, ""), ("zone", "a")])
            .annotation("a", "b")
            .ready(true)
            .condition("NetworkUnavailable", "True")
            .address("Hostname", "n1")
            .address("ExternalIP", "203.0.113.1")
            .address("InternalIP", "198.18.0.11")
            .with(|n| {
                n.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
                    pod_cidr: Some("198.19.1.0/24".into()),
                    ..Default::default()
                });
                let image = k8s_openapi::api::core::v1::ContainerImage {
                    names: Some(vec!["registry/image:tag".into()]),
                    size_bytes: Some(1),
                };
                n.status.get_or_insert_default().images = Some(vec![image]);
            })
            .build();
        // What a kubelet rewrites on its own (heartbeat times, images) leaves the view equal.
        let mut later = node.clone();
        later.status.as_mut().unwrap().images = None;
        for c in later
            .status
            .as_mut()
            .unwrap()
            .conditions
            .iter_mut()
            .flatten()
        {
            c.last_heartbeat_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        }
        later.metadata.annotations = None;
        assert_eq!(NodeView::reduce(&later), NodeView::reduce(&node));
        let view = NodeView::reduce(&node).unwrap();
        assert_eq!(view.name, "n1");
        assert!(view.excluded && view.network_unavailable);
        assert_eq!(
            view.addresses,
            [
                "198.18.0.11".parse::<IpAddr>().unwrap(),
                "203.0.113.1".parse().unwrap()
            ]
        );
        // A new label is a new view.
        later
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("rack".into(), "r1".into());
        assert_ne!(NodeView::reduce(&later), NodeView::reduce(&node));
        let mut nameless = node.clone();
        nameless.metadata.name = None;
        assert_eq!(NodeView::reduce(&nameless), None);
    }
}
