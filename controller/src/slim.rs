//! Trimming watched objects to what the controller reads, before they enter the caches.
//!
//! Every replica caches every Service, Namespace and Node of the cluster; as the API server sends
//! them, most of their bytes are `managedFields`, `kubectl.kubernetes.io/last-applied-configuration`
//! and fields the controller never looks at. What is kept here is exactly what `core.rs`, `run/`
//! and the allocator's `ServiceRequest::from_service` read, so the decisions made from a trimmed
//! object are those made from the full one (tested below).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use ferrolb_config::allocator::{ANNOTATION_PREFIX, DEPRECATED_ANNOTATION_PREFIX, ServiceKey};
use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus, Service, ServicePort, ServiceSpec, ServiceStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::Event;

/// The annotations the controller reads: MetalLB's (both prefixes) and ferrolb's own
/// (`ferrolb.io/node-addresses`, `ferrolb.io/served-by`).
fn is_kept_annotation(key: &str) -> bool {
    key.starts_with(ANNOTATION_PREFIX)
        || key.starts_with(DEPRECATED_ANNOTATION_PREFIX)
        || key.starts_with(crate::node_addresses::ANNOTATION_PREFIX)
}

/// Strings that recur in nearly every Service (types, policies, families, protocols, the
/// annotation the controller writes): kept as `'static` references instead of one allocation each.
const COMMON: &[&str] = &[
    "LoadBalancer",
    "ClusterIP",
    "NodePort",
    "ExternalName",
    "SingleStack",
    "PreferDualStack",
    "RequireDualStack",
    "IPv4",
    "IPv6",
    "Cluster",
    "Local",
    "TCP",
    "UDP",
    "SCTP",
    "metallb.io/ip-allocated-from-pool",
    "metallb.io/address-pool",
    "metallb.io/loadBalancerIPs",
    "metallb.io/allow-shared-ip",
];

type Text = Cow<'static, str>;

/// Port numbers and protocols.
type Ports = Box<[(i32, Option<Text>)]>;

fn text(s: String) -> Text {
    match COMMON.iter().find(|c| **c == s) {
        Some(c) => Cow::Borrowed(c),
        None => Cow::Owned(s),
    }
}

/// The spec fields allocation reads.
#[derive(Clone, Debug, Default, PartialEq)]
struct Spec {
    type_: Option<Text>,
    load_balancer_class: Option<Text>,
    ip_families: Option<Box<[Text]>>,
    ip_family_policy: Option<Text>,
    load_balancer_ip: Option<Text>,
    /// Port numbers and protocols.
    ports: Option<Ports>,
    /// Only with `externalTrafficPolicy: Local`, the one case where it is read.
    selector: Option<BTreeMap<String, String>>,
    external_traffic_policy: Option<Text>,
}

/// A Service as the controller caches it: exactly what allocation reads (name, namespace, uid for
/// Events, creation time, labels, the metallb and ferrolb annotations, ServiceLB's finalizer, type and class, families, requested IP, ports'
/// numbers and protocols, traffic policy and, with `Local`, the selector, and the IPs of the
/// ingress), in compact form. A trimmed `k8s_openapi` Service would still cost over 2 KiB (the
/// structs' fixed size, a B-tree node for one annotation, the cache's key); this costs a
/// few hundred bytes. [`CachedService::to_service`] rebuilds a `Service` that reads the same as
/// the original wherever the controller looks (tested below).
#[derive(Clone, Debug, PartialEq)]
pub struct CachedService {
    key: ServiceKey,
    uid: Option<Box<str>>,
    /// The version this copy is of: writes are conditional on it (a write decided on an older
    /// copy than the API server holds is refused), and the cache never goes back to an older one.
    resource_version: Option<Box<str>>,
    labels: Option<BTreeMap<String, String>>,
    /// `metallb.io/*` and `metallb.universe.tf/*` annotations, sorted by key.
    annotations: Box<[(Text, Box<str>)]>,
    spec: Option<Spec>,
    /// The ingress IPs (entries without a valid IP are never read).
    ips: Box<[IpAddr]>,
    /// `metadata.creationTimestamp`: node addresses go to earlier Services first.
    created: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// `metadata.finalizers`, kept only when k3s ServiceLB's is among them (it is removed, and a
    /// merge patch writes the whole list).
    finalizers: Option<Box<[String]>>,
}

impl CachedService {
    /// Keeps what the controller reads of `service`.
    pub fn new(service: Service) -> Self {
        let meta = service.metadata;
        let finalizers = meta
            .finalizers
            .filter(|f| {
                f.iter()
                    .any(|f| f == ferrolb_config::node_addresses::SERVICELB_FINALIZER)
            })
            .map(Vec::into_boxed_slice);
        let key = ServiceKey::new(
            meta.namespace.unwrap_or_default(),
            meta.name.unwrap_or_default(),
        );
        let annotations = meta
            .annotations
            .into_iter()
            .flatten()
            .filter(|(k, _)| is_kept_annotation(k))
            .map(|(k, v)| (text(k), v.into_boxed_str()))
            .collect();
        let spec = service.spec.map(|spec| {
            let local = spec.external_traffic_policy.as_deref() == Some("Local");
            Spec {
                type_: spec.type_.map(text),
                load_balancer_class: spec.load_balancer_class.map(text),
                ip_families: spec.ip_families.map(|f| f.into_iter().map(text).collect()),
                ip_family_policy: spec.ip_family_policy.map(text),
                load_balancer_ip: spec.load_balancer_ip.map(text),
                ports: spec.ports.map(|ports| {
                    ports
                        .into_iter()
                        .map(|p| (p.port, p.protocol.map(text)))
                        .collect()
                }),
                selector: if local { spec.selector } else { None },
                external_traffic_policy: spec.external_traffic_policy.map(text),
            }
        });
        let ips = service
            .status
            .and_then(|s| s.load_balancer)
            .and_then(|lb| lb.ingress)
            .into_iter()
            .flatten()
            .filter_map(|i| i.ip?.parse().ok())
            .collect();
        Self {
            key,
            uid: meta.uid.map(String::into_boxed_str),
            resource_version: meta.resource_version.map(String::into_boxed_str),
            labels: meta.labels,
            annotations,
            spec,
            ips,
            created: meta.creation_timestamp,
            finalizers,
        }
    }

    /// The Service's namespace and name.
    pub fn key(&self) -> &ServiceKey {
        &self.key
    }

    /// The resourceVersion as a number, where it is one. Kubernetes 1.35 made resourceVersions
    /// comparable (KEP-5504: decimal integers, ordered as etcd revisions); anything else is
    /// treated as not comparable, and then the newest copy to arrive wins, as before.
    fn revision(&self) -> Option<u64> {
        self.resource_version.as_deref()?.parse().ok()
    }

    /// Whether this copy is older than `other` (both comparable and this one's revision lower).
    fn older_than(&self, other: &CachedService) -> bool {
        matches!((self.revision(), other.revision()), (Some(a), Some(b)) if a < b)
    }

    /// A `Service` with what was kept, for the code that reads Services.
    pub fn to_service(&self) -> Service {
        let owned = |t: &Text| t.to_string();
        Service {
            metadata: ObjectMeta {
                name: Some(self.key.name().to_string()),
                namespace: Some(self.key.namespace().to_string()),
                uid: self.uid.as_deref().map(str::to_string),
                resource_version: self.resource_version.as_deref().map(str::to_string),
                labels: self.labels.clone(),
                creation_timestamp: self.created.clone(),
                finalizers: self.finalizers.as_ref().map(|f| f.to_vec()),
                annotations: (!self.annotations.is_empty()).then(|| {
                    self.annotations
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect()
                }),
                ..ObjectMeta::default()
            },
            spec: self.spec.as_ref().map(|spec| ServiceSpec {
                type_: spec.type_.as_ref().map(owned),
                load_balancer_class: spec.load_balancer_class.as_ref().map(owned),
                ip_families: spec
                    .ip_families
                    .as_ref()
                    .map(|f| f.iter().map(owned).collect()),
                ip_family_policy: spec.ip_family_policy.as_ref().map(owned),
                load_balancer_ip: spec.load_balancer_ip.as_ref().map(owned),
                ports: spec.ports.as_ref().map(|ports| {
                    ports
                        .iter()
                        .map(|(port, protocol)| ServicePort {
                            port: *port,
                            protocol: protocol.as_ref().map(owned),
                            ..ServicePort::default()
                        })
                        .collect()
                }),
                selector: spec.selector.clone(),
                external_traffic_policy: spec.external_traffic_policy.as_ref().map(owned),
                ..ServiceSpec::default()
            }),
            status: (!self.ips.is_empty()).then(|| ServiceStatus {
                load_balancer: Some(LoadBalancerStatus {
                    ingress: Some(
                        self.ips
                            .iter()
                            .map(|ip| LoadBalancerIngress {
                                ip: Some(ip.to_string()),
                                ..LoadBalancerIngress::default()
                            })
                            .collect(),
                    ),
                }),
                conditions: None,
            }),
        }
    }
}

/// The Services the controller knows, kept from the watch's events by the work loop.
///
/// Like kube-runtime's reflector, a (re-)list is taken in only once it is complete; unlike it,
/// the completed list reports what differs from before, Services deleted while the watch was
/// down among them, so that their IPs are released. Unlike it too, neither a list nor an event
/// ever takes the cache back to an older copy than it holds (decision 0016): a re-list can be
/// older than a fresh read made while it was under way, and a Service dropped or an IP seen
/// released on the strength of an old list would be handed to a second Service.
#[derive(Debug, Default)]
pub struct ServiceCache {
    current: HashMap<ServiceKey, Arc<CachedService>>,
    /// A list in progress: what it has seen so far.
    listing: Option<HashMap<ServiceKey, Arc<CachedService>>>,
    /// The revision of the newest fresh read: a copy no newer than it, of a Service the cache
    /// does not hold, is of a Service deleted by then.
    fresh_at: Option<u64>,
    /// A re-list left Services it could not settle (see [`Self::take_unsettled`]).
    unsettled: bool,
}

impl ServiceCache {
    /// Takes one watch event in; returns the Services it changed.
    pub fn apply(&mut self, event: Event<CachedService>) -> Vec<ServiceKey> {
        match event {
            Event::Apply(service) => {
                let stale = match self.current.get(&service.key) {
                    // The watch is behind a fresh read (see [`Self::refresh`]): keep the newer copy.
                    Some(cached) => service.older_than(cached),
                    // Or the fresh read found it deleted: the watch's delete is still to come.
                    None => self.deleted_by_fresh_read(&service),
                };
                if stale {
                    return Vec::new();
                }
                let key = service.key.clone();
                self.current.insert(key.clone(), Arc::new(service));
                vec![key]
            }
            Event::Delete(service) => {
                if self
                    .current
                    .get(&service.key)
                    .is_some_and(|c| service.older_than(c))
                {
                    // A Service deleted and created again since, as a fresh read found it.
                    return Vec::new();
                }
                self.current.remove(&service.key);
                vec![service.key]
            }
            Event::Init => {
                self.listing = Some(HashMap::new());
                Vec::new()
            }
            Event::InitApply(service) => {
                self.listing
                    .get_or_insert_with(HashMap::new)
                    .insert(service.key.clone(), Arc::new(service));
                Vec::new()
            }
            Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                self.relisted(listed)
            }
        }
    }

    /// Takes a complete (re-)list in, under the revision rule of [`Self::refresh`]; returns the
    /// Services that changed.
    ///
    /// The watch lists by quorum read (`ListSemantic::MostRecent`), so a re-list holds every
    /// write the watch delivered before it broke; but a fresh read made while it was under way
    /// may be newer, and an API server that serves lists from a lagging cache would make any
    /// list old. So a listed copy older than the cached one does not replace it; a listed
    /// Service the cache lacks is not taken back in if a fresh read found it deleted since; and
    /// a cached Service the list lacks is dropped (its IPs released) only when the list is
    /// provably at least as new as the cached copy, i.e. holds a copy of some Service as new or
    /// newer. A kube watcher does not tell the list's own revision: a cached Service newer than
    /// everything listed may have been created after the list or deleted before it, so it is
    /// kept, and [`Self::take_unsettled`] asks for a fresh read to settle it. Keeping it holds
    /// its IPs a moment longer; dropping it could give them to a second Service.
    fn relisted(&mut self, listed: HashMap<ServiceKey, Arc<CachedService>>) -> Vec<ServiceKey> {
        let newest = listed.values().filter_map(|s| s.revision()).max();
        // Revisions that are not numbers (before KEP-5504) cannot bound anything: as before,
        // the list is the truth.
        let comparable = listed.is_empty() || newest.is_some();
        let mut changed = Vec::new();
        let mut unsettled = false;
        self.current.retain(|key, cached| {
            if listed.contains_key(key) {
                return true;
            }
            let maybe_newer = comparable
                && cached
                    .revision()
                    .is_some_and(|c| newest.is_none_or(|n| c > n));
            if maybe_newer {
                unsettled = true;
            } else {
                changed.push(key.clone());
            }
            maybe_newer
        });
        for (key, service) in listed {
            let stale = match self.current.get(&key) {
                Some(cached) => service.older_than(cached) || **cached == *service,
                None => self.deleted_by_fresh_read(&service),
            };
            if !stale {
                self.current.insert(key.clone(), service);
                changed.push(key);
            }
        }
        self.unsettled |= unsettled;
        changed
    }

    /// Whether a re-list left cached Services it does not hold but could not prove deleted
    /// (kept, see [`Self::relisted`]); cleared by the call. A fresh read ([`Self::refresh`])
    /// settles them: it knows its revision.
    pub fn take_unsettled(&mut self) -> bool {
        std::mem::take(&mut self.unsettled)
    }

    /// Whether `service`, which the cache does not hold, is a copy no newer than a fresh read
    /// that did not hold it either (or dropped since, by a delete): a Service deleted by then.
    fn deleted_by_fresh_read(&self, service: &CachedService) -> bool {
        matches!((service.revision(), self.fresh_at), (Some(c), Some(r)) if c <= r)
    }

    /// Takes in a fresh, consistent read of every Service (a list from etcd at revision
    /// `revision`), as a new leader does before it decides anything: the watch may be behind (it
    /// is after an API-server outage), and a decision made on a copy older than the previous
    /// leader's last writes could give one IP to two Services. A listed copy replaces a cached one
    /// unless the cached one is newer; a cached Service the list does not hold is dropped unless it
    /// is newer than the list (created since). Returns the Services that changed.
    pub fn refresh(
        &mut self,
        listed: Vec<CachedService>,
        revision: Option<u64>,
    ) -> Vec<ServiceKey> {
        let mut changed = Vec::new();
        let mut seen = std::collections::HashSet::with_capacity(listed.len());
        for service in listed {
            seen.insert(service.key.clone());
            match self.current.get(&service.key) {
                Some(cached) if service.older_than(cached) || **cached == service => {}
                _ => {
                    changed.push(service.key.clone());
                    self.current.insert(service.key.clone(), Arc::new(service));
                }
            }
        }
        self.current.retain(|key, cached| {
            let created_since =
                matches!((cached.revision(), revision), (Some(c), Some(r)) if c > r);
            let keep = seen.contains(key) || created_since;
            if !keep {
                changed.push(key.clone());
            }
            keep
        });
        if revision.is_some() {
            self.fresh_at = self.fresh_at.max(revision);
        }
        self.unsettled = false;
        changed
    }

    /// The Service of `key`, if it exists.
    pub fn get(&self, key: &ServiceKey) -> Option<&Arc<CachedService>> {
        self.current.get(key)
    }

    /// Every Service, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<CachedService>> {
        self.current.values()
    }
}

/// Trims the metadata of a Namespace or Node to its name and labels: namespace labels decide pool
/// admission, node labels the validation of node selectors.
pub fn name_and_labels<K>(object: &mut PartialObjectMeta<K>) {
    let meta = &mut object.metadata;
    *meta = ObjectMeta {
        name: meta.name.take(),
        labels: meta.labels.take(),
        ..ObjectMeta::default()
    };
}

#[cfg(test)]
mod relist_model;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::core::{Core, current_ips, current_pool, key_of};
    use ferrolb_config::address::IpRange;
    use ferrolb_config::allocator::{ServiceRequest, is_ours};
    use ferrolb_config::model::Pool;
    use ferrolb_config::selector::Labels;
    use ferrolb_testkit::objects::{ServiceBuilder, service};
    use k8s_openapi::api::core::v1::PortStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        Condition, FieldsV1, ManagedFieldsEntry, Time,
    };
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use kube::Resource;

    /// Service `name` as the API server sends it, with every kind of field set.
    fn full(name: &str) -> ServiceBuilder {
        service(name)
            .namespace("shop")
            .uid("4a7c")
            .labels([("app", "web"), ("tier", "front")])
            .annotations([
                (
                    "kubectl.kubernetes.io/last-applied-configuration",
                    "{\"big\": \"json\"}",
                ),
                ("metallb.io/address-pool", "blue"),
                ("metallb.universe.tf/allow-shared-ip", "k"),
                ("metallb.io/ip-allocated-from-pool", "blue"),
                ("example.com/other", "x"),
            ])
            .ip_families(&["IPv4", "IPv6"])
            .ip_family_policy("PreferDualStack")
            .add_port(ServicePort {
                name: Some("http".into()),
                port: 80,
                protocol: Some("TCP".into()),
                target_port: Some(IntOrString::Int(8080)),
                node_port: Some(30080),
                ..Default::default()
            })
            .add_port(ServicePort {
                name: Some("dns".into()),
                port: 53,
                protocol: Some("UDP".into()),
                target_port: Some(IntOrString::String("dns".into())),
                app_protocol: Some("dns".into()),
                ..Default::default()
            })
            .selector("app", "web")
            .external_traffic_policy("Cluster")
            .with(|s| {
                let meta = &mut s.metadata;
                meta.resource_version = Some("812".into());
                meta.generation = Some(3);
                meta.creation_timestamp = Some(time("2026-01-02T03:04:05Z"));
                meta.finalizers = Some(vec!["service.kubernetes.io/load-balancer-cleanup".into()]);
                meta.managed_fields = Some(vec![ManagedFieldsEntry {
                    manager: Some("kubectl".into()),
                    operation: Some("Update".into()),
                    api_version: Some("v1".into()),
                    fields_type: Some("FieldsV1".into()),
                    fields_v1: Some(FieldsV1(serde_json::json!({"f:spec": {"f:ports": {}}}))),
                    ..Default::default()
                }]);
                let spec = s.spec.as_mut().unwrap();
                spec.cluster_ip = Some("10.0.0.1".into());
                spec.cluster_ips = Some(vec!["10.0.0.1".into(), "fd00::1".into()]);
                spec.session_affinity = Some("None".into());
                spec.internal_traffic_policy = Some("Cluster".into());
                spec.allocate_load_balancer_node_ports = Some(true);
                s.status = Some(ServiceStatus {
                    load_balancer: Some(LoadBalancerStatus {
                        ingress: Some(vec![
                            LoadBalancerIngress {
                                ip: Some("198.18.200.1".into()),
                                ip_mode: Some("VIP".into()),
                                ports: Some(vec![PortStatus {
                                    port: 80,
                                    protocol: "TCP".into(),
                                    error: None,
                                }]),
                                ..Default::default()
                            },
                            LoadBalancerIngress {
                                ip: Some("fd00:18::c8:1".into()),
                                ip_mode: Some("VIP".into()),
                                ..Default::default()
                            },
                        ]),
                    }),
                    conditions: Some(vec![Condition {
                        type_: "x".into(),
                        status: "True".into(),
                        reason: "r".into(),
                        message: "m".into(),
                        last_transition_time: time("2026-01-02T03:04:05Z"),
                        observed_generation: None,
                    }]),
                });
            })
    }

    fn time(rfc3339: &str) -> Time {
        Time(rfc3339.parse().unwrap())
    }

    fn slimmed(s: &Service) -> Service {
        CachedService::new(s.clone()).to_service()
    }

    fn pools() -> Vec<Pool> {
        ["blue", "green"]
            .iter()
            .zip(["198.18.200.0/24", "198.18.201.0/24"])
            .map(|(name, range)| Pool {
                name: (*name).into(),
                labels: Labels::new(),
                ranges: vec![
                    IpRange::parse(range).unwrap(),
                    IpRange::parse("fd00:18::c8:0/112").unwrap(),
                ],
                auto_assign: true,
                avoid_buggy_ips: false,
                allocation: None,
            })
            .collect()
    }

    /// The trimmed Service reads the same as the full one everywhere the controller looks.
    fn assert_same_reading(full: &Service) {
        let slim = slimmed(full);
        let labels = Labels::from([("team".to_string(), "a".to_string())]);
        assert_eq!(
            ServiceRequest::from_service(&slim, &labels),
            ServiceRequest::from_service(full, &labels)
        );
        for class in [None, Some("other")] {
            assert_eq!(is_ours(&slim, class), is_ours(full, class));
        }
        assert_eq!(current_ips(&slim), current_ips(full));
        assert_eq!(current_pool(&slim), current_pool(full));
        assert_eq!(key_of(&slim), key_of(full));
        assert_eq!(slim.object_ref(&()), full.object_ref(&()));
        let (mut a, mut b) = (Core::new(None), Core::new(None));
        a.set_pools(pools());
        b.set_pools(pools());
        assert_eq!(a.reclaim(&slim, &labels), b.reclaim(full, &labels));
        assert_eq!(a.reconcile(&slim, &labels), b.reconcile(full, &labels));
    }

    #[test]
    fn a_trimmed_service_decides_as_the_full_one() {
        assert_same_reading(&full("web").build());
        assert_same_reading(&full("web").external_traffic_policy("Local").build());
        assert_same_reading(
            &full("web")
                .annotation("metallb.io/loadBalancerIPs", "198.18.200.9,fd00:18::c8:9")
                .with(|s| {
                    let annotations = s.metadata.annotations.as_mut().unwrap();
                    annotations.remove("metallb.io/address-pool");
                })
                .build(),
        );
        assert_same_reading(&full("web").service_type("ClusterIP").build());
        assert_same_reading(&full("web").load_balancer_class("other").build());
        assert_same_reading(&full("web").with(|s| s.status = None).build());
        assert_same_reading(
            &full("web")
                .with(|s| {
                    s.metadata.annotations = None;
                    s.metadata.labels = None;
                })
                .build(),
        );
    }

    #[test]
    fn a_trimmed_service_keeps_only_what_is_read() {
        let slim = slimmed(&full("web").build());
        let m = &slim.metadata;
        assert!(m.managed_fields.is_none() && m.finalizers.is_none());
        assert!(m.generation.is_none());
        let keys: Vec<&str> = m
            .annotations
            .iter()
            .flatten()
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(
            keys,
            [
                "metallb.io/address-pool",
                "metallb.io/ip-allocated-from-pool",
                "metallb.universe.tf/allow-shared-ip"
            ]
        );
        let spec = slim.spec.as_ref().unwrap();
        assert!(spec.cluster_ip.is_none() && spec.cluster_ips.is_none());
        assert!(spec.selector.is_none(), "read only with Local");
        assert!(
            spec.ports
                .iter()
                .flatten()
                .all(|p| p.name.is_none() && p.target_port.is_none())
        );
        let status = slim.status.as_ref().unwrap();
        assert!(status.conditions.is_none());
        assert!(
            status
                .load_balancer
                .iter()
                .flat_map(|lb| lb.ingress.iter().flatten())
                .all(|i| i.ip_mode.is_none() && i.ports.is_none())
        );
    }

    /// Service `name` of [`full`] whose ingress is `ip` alone (its conditions kept), or with no
    /// status for `None`.
    fn holding(name: &str, ip: Option<&str>) -> ServiceBuilder {
        full(name).with(|s| match ip {
            Some(ip) => {
                s.status.as_mut().unwrap().load_balancer = Some(LoadBalancerStatus {
                    ingress: Some(vec![LoadBalancerIngress {
                        ip: Some(ip.into()),
                        ..Default::default()
                    }]),
                });
            }
            None => s.status = None,
        })
    }

    fn cached(name: &str, ip: Option<&str>) -> CachedService {
        CachedService::new(holding(name, ip).build())
    }

    fn keys(mut k: Vec<ServiceKey>) -> Vec<String> {
        k.sort();
        k.iter().map(|k| k.name().to_string()).collect()
    }

    #[test]
    fn the_cache_follows_events_and_a_relist_reports_what_differs() {
        let mut cache = ServiceCache::default();
        assert!(cache.apply(Event::Init).is_empty());
        for name in ["a", "b", "c"] {
            assert!(cache.apply(Event::InitApply(cached(name, None))).is_empty());
        }
        assert!(cache.iter().next().is_none(), "a list counts once complete");
        assert_eq!(keys(cache.apply(Event::InitDone)), ["a", "b", "c"]);
        assert_eq!(
            keys(cache.apply(Event::Apply(cached("a", Some("198.18.200.1"))))),
            ["a"]
        );
        assert_eq!(keys(cache.apply(Event::Delete(cached("c", None)))), ["c"]);
        assert_eq!(cache.iter().count(), 2);
        // The watch broke; meanwhile b changed, a was deleted and d created. The re-list reports
        // exactly those, and the old state serves until it completes.
        cache.apply(Event::Init);
        cache.apply(Event::InitApply(cached("b", Some("198.18.200.2"))));
        cache.apply(Event::InitApply(cached("d", None)));
        assert!(cache.get(&cached("a", None).key).is_some());
        assert_eq!(keys(cache.apply(Event::InitDone)), ["a", "b", "d"]);
        assert!(cache.get(&cached("a", None).key).is_none());
        // Nothing changed: nothing reported.
        cache.apply(Event::Init);
        cache.apply(Event::InitApply(cached("b", Some("198.18.200.2"))));
        cache.apply(Event::InitApply(cached("d", None)));
        assert!(cache.apply(Event::InitDone).is_empty());
    }

    fn versioned(name: &str, ip: Option<&str>, version: &str) -> CachedService {
        let service = holding(name, ip)
            .with(|s| s.metadata.resource_version = Some(version.into()))
            .build();
        CachedService::new(service)
    }

    #[test]
    fn a_fresh_read_brings_a_lagging_cache_up_to_date_and_the_watch_never_takes_it_back() {
        let mut cache = ServiceCache::default();
        cache.apply(Event::Init);
        for (name, ip, rv) in [
            ("a", None, "10"),
            ("b", Some("198.18.200.2"), "11"),
            ("gone", None, "12"),
        ] {
            cache.apply(Event::InitApply(versioned(name, ip, rv)));
        }
        cache.apply(Event::InitDone);
        // The previous leader gave a an IP (rv 20), deleted gone, created c (21); this replica's
        // watch has seen none of it. A fresh read at revision 21 does.
        let listed = vec![
            versioned("a", Some("198.18.200.1"), "20"),
            versioned("b", Some("198.18.200.2"), "11"),
            versioned("c", None, "21"),
        ];
        assert_eq!(keys(cache.refresh(listed, Some(21))), ["a", "c", "gone"]);
        let a = Arc::clone(cache.get(&versioned("a", None, "1").key).unwrap());
        assert_eq!(a.ips.as_ref(), [ip("198.18.200.1")]);
        // The watch catches up late: an older copy of a is not taken, nor the old delete of c...
        assert!(
            cache
                .apply(Event::Apply(versioned("a", None, "15")))
                .is_empty()
        );
        assert_eq!(
            cache.get(&a.key).unwrap().resource_version.as_deref(),
            Some("20")
        );
        assert!(
            cache
                .apply(Event::Delete(versioned("c", None, "5")))
                .is_empty()
        );
        assert!(cache.get(&versioned("c", None, "1").key).is_some());
        // ...while newer ones are.
        assert_eq!(
            keys(cache.apply(Event::Apply(versioned("a", None, "30")))),
            ["a"]
        );
        // A Service created after the read's revision survives a refresh that does not list it.
        cache.apply(Event::Apply(versioned("d", None, "40")));
        assert_eq!(
            keys(cache.refresh(
                vec![
                    versioned("a", None, "30"),
                    versioned("b", Some("198.18.200.2"), "11")
                ],
                Some(35)
            )),
            ["c"]
        );
        assert!(cache.get(&versioned("d", None, "1").key).is_some());
        // Versions that are not numbers are not compared: the newest to arrive wins.
        assert_eq!(
            keys(cache.apply(Event::Apply(versioned("a", None, "x")))),
            ["a"]
        );
    }

    /// A cache listed once with `services` (name, IP, resourceVersion).
    fn listed_cache(services: &[(&str, Option<&str>, &str)]) -> ServiceCache {
        let mut cache = ServiceCache::default();
        cache.apply(Event::Init);
        for (name, ip, rv) in services {
            cache.apply(Event::InitApply(versioned(name, *ip, rv)));
        }
        cache.apply(Event::InitDone);
        cache
    }

    fn ips_of(cache: &ServiceCache, name: &str) -> Option<Vec<IpAddr>> {
        let key = versioned(name, None, "1").key;
        cache.get(&key).map(|s| s.ips.to_vec())
    }

    #[test]
    fn a_relist_older_than_a_fresh_read_made_meanwhile_takes_nothing_back() {
        let mut cache = listed_cache(&[("a", None, "10"), ("gone", Some("198.18.200.9"), "12")]);
        // The watch breaks and re-lists at revision 15; while the list is under way a new term
        // reads afresh at 21: the previous leader gave a an IP (20), gone was deleted, b was
        // created and given an IP (21).
        cache.apply(Event::Init);
        cache.apply(Event::InitApply(versioned("a", None, "10")));
        cache.apply(Event::InitApply(versioned(
            "gone",
            Some("198.18.200.9"),
            "12",
        )));
        let fresh = vec![
            versioned("a", Some("198.18.200.1"), "20"),
            versioned("b", Some("198.18.200.2"), "21"),
        ];
        assert_eq!(keys(cache.refresh(fresh, Some(21))), ["a", "b", "gone"]);
        // The older list completes: it changes nothing. Before the fix it took a's IP away, and
        // dropped b, whose IP the allocator then freed for a second Service.
        assert!(cache.apply(Event::InitDone).is_empty());
        assert_eq!(ips_of(&cache, "a"), Some(vec![ip("198.18.200.1")]));
        assert_eq!(ips_of(&cache, "b"), Some(vec![ip("198.18.200.2")]));
        assert_eq!(
            ips_of(&cache, "gone"),
            None,
            "deleted, as the fresh read found"
        );
        // b, newer than anything listed, is kept; a fresh read is asked for, once.
        assert!(cache.take_unsettled());
        assert!(!cache.take_unsettled());
        // The watch goes on from 15: events the fresh read is past are not taken either.
        assert!(
            cache
                .apply(Event::Apply(versioned("gone", Some("198.18.200.9"), "12")))
                .is_empty()
        );
        assert!(
            cache
                .apply(Event::Apply(versioned("b", None, "16")))
                .is_empty()
        );
        assert_eq!(ips_of(&cache, "b"), Some(vec![ip("198.18.200.2")]));
    }

    #[test]
    fn a_relist_drops_only_what_it_proves_deleted_and_a_fresh_read_settles_the_rest() {
        let mut cache = listed_cache(&[
            ("old", Some("198.18.200.1"), "10"),
            ("kept", None, "11"),
            ("newest", Some("198.18.200.3"), "30"),
        ]);
        // A re-list whose newest copy is at 20 lacks old (10): deleted while the watch was
        // down, released at once. It lacks newest (30) too: created after the list's snapshot
        // or deleted before it, it cannot tell; kept until a fresh read says.
        cache.apply(Event::Init);
        cache.apply(Event::InitApply(versioned("kept", None, "20")));
        assert_eq!(keys(cache.apply(Event::InitDone)), ["kept", "old"]);
        assert_eq!(ips_of(&cache, "old"), None);
        assert_eq!(ips_of(&cache, "newest"), Some(vec![ip("198.18.200.3")]));
        assert!(cache.take_unsettled());
        // The fresh read at 40 does not hold it: deleted, and released now.
        assert_eq!(
            keys(cache.refresh(vec![versioned("kept", None, "20")], Some(40))),
            ["newest"]
        );
        // An empty re-list bounds nothing: it keeps what the cache has and asks for a read.
        cache.apply(Event::Init);
        assert!(cache.apply(Event::InitDone).is_empty());
        assert!(cache.take_unsettled());
        // Revisions that are not numbers: the list is the truth, as before.
        let mut cache = listed_cache(&[("a", None, "x"), ("b", None, "y")]);
        cache.apply(Event::Init);
        cache.apply(Event::InitApply(versioned("a", Some("198.18.200.1"), "z")));
        assert_eq!(keys(cache.apply(Event::InitDone)), ["a", "b"]);
        assert!(!cache.take_unsettled());
    }

    #[test]
    fn common_strings_are_not_allocated() {
        let c = cached("a", Some("198.18.200.1"));
        let spec = c.spec.as_ref().unwrap();
        assert!(matches!(spec.type_, Some(Cow::Borrowed(_))));
        assert!(matches!(spec.ip_family_policy, Some(Cow::Borrowed(_))));
        assert!(c.annotations.iter().any(
            |(k, _)| *k == "metallb.io/ip-allocated-from-pool" && matches!(k, Cow::Borrowed(_))
        ));
        assert_eq!(&*c.ips, [ip("198.18.200.1")]);
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn namespaces_and_nodes_keep_name_and_labels() {
        let mut ns: PartialObjectMeta<k8s_openapi::api::core::v1::Namespace> =
            serde_json::from_value(serde_json::json!({
                "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                "metadata": {"name": "shop", "labels": {"team": "a"}, "uid": "1",
                    "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
                    "managedFields": [{"manager": "kubectl"}]}
            }))
            .unwrap();
        name_and_labels(&mut ns);
        assert_eq!(ns.metadata.name.as_deref(), Some("shop"));
        assert_eq!(
            ns.metadata.labels,
            Some(BTreeMap::from([("team".into(), "a".into())]))
        );
        assert!(ns.metadata.annotations.is_none() && ns.metadata.managed_fields.is_none());
    }
}
