//! Node addresses for LoadBalancer Services (`--node-addresses`; decision 0024, issue #35): k3s
//! ServiceLB's job from the controller alone. The rules are `ferrolb_config::node_addresses`;
//! this module says which Services they serve ([`route`]), reads their inputs from the watches
//! (Nodes, EndpointSlices, the speakers' presence) and keeps the decision, recomputed when an
//! input changes, with the Services whose outcome changed handed back to be decided again.
//!
//! The core decides every node-address Service at once (a Service's ports can take an address
//! from a later one), linear in Services × nodes; it runs only when an input changed.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ferrolb_config::address::Family;
use ferrolb_config::allocator::{Backend, ServiceKey, ServiceRequest};
use ferrolb_config::node_address_inputs::{node_addresses, ready_pod_nodes};
use ferrolb_config::node_addresses::{
    self as rules, EventType, PORT_HELD_REASON, ServiceOutcome, TrafficPolicy,
};
use ferrolb_config::selector::Labels;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::Event;

use crate::core::Note;

pub use ferrolb_config::node_addresses::{
    ANNOTATION_PREFIX, OPT_ANNOTATION, SERVED_BY_ANNOTATION, SERVED_BY_NODE_ADDRESSES,
};
/// Reason of the Warning recorded when the opt-in annotation is ignored for a MetalLB request.
pub const IGNORED_REASON: &str = "NodeAddressesIgnored";

/// How a Service of ours is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// From a pool only (a MetalLB request, or opted out).
    Pools,
    /// By node addresses only.
    NodeAddresses,
    /// From a pool if one serves it, else by node addresses.
    PoolsThenNodeAddresses,
}

pub use ferrolb_config::node_address_inputs::{has_class, marked as served_by_node_addresses};

fn annotation<'a>(service: &'a Service, key: &str) -> Option<&'a str> {
    service
        .metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// How a Service is served with node addresses turned on (decision 0024, *How a Service
/// chooses*); `None` for a Service that is not ours. `ours` is `is_ours` under the controller's
/// class; `request` the Service's parsed MetalLB request, if it parses; `adoptable` whether its
/// current ingress is all node addresses outside every pool (a Service ServiceLB served).
pub fn route(
    service: &Service,
    ours: bool,
    request: Option<&ServiceRequest>,
    adoptable: bool,
) -> Option<Route> {
    if has_class(service) {
        return Some(Route::NodeAddresses);
    }
    if !ours {
        return None;
    }
    if request.is_none_or(asks_for_a_pool) {
        // A request that cannot be parsed fails as it does today, on the pool path.
        return Some(Route::Pools);
    }
    match annotation(service, OPT_ANNOTATION) {
        Some("true") => return Some(Route::NodeAddresses),
        Some("false") => return Some(Route::Pools),
        _ => {}
    }
    // Marked and holding addresses: the choice sticks (a pool freeing up later must not move
    // a running Service's address). Marked with none, a pool may still serve it.
    let holding = !crate::core::current_ips(service).is_empty();
    if (served_by_node_addresses(service) && holding) || adoptable {
        return Some(Route::NodeAddresses);
    }
    Some(Route::PoolsThenNodeAddresses)
}

/// Whether the request names a pool or IPs (MetalLB's annotations or `spec.loadBalancerIP`):
/// it is served from a pool, never by node addresses.
fn asks_for_a_pool(request: &ServiceRequest) -> bool {
    request.pool.is_some() || !request.requested_ips.is_empty()
}

/// The Warning for an opt-in annotation next to a MetalLB request, if there is one.
pub fn ignored_opt_in(service: &Service, request: Option<&ServiceRequest>) -> Option<Note> {
    (request.is_some_and(asks_for_a_pool) && annotation(service, OPT_ANNOTATION) == Some("true"))
        .then(|| Note {
        warning: true,
        reason: IGNORED_REASON,
        message: format!(
            "annotation {OPT_ANNOTATION} is ignored: the Service asks for a pool or for IPs with a metallb.io annotation or spec.loadBalancerIP"
        ),
    })
}

/// A Node as the decision reads it, but for its speaker's liveness.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeFacts {
    /// Labels (`enablelb`, `lbpool`).
    pub labels: Labels,
    /// `InternalIP` addresses.
    pub internal: Vec<IpAddr>,
    /// `ExternalIP` addresses.
    pub external: Vec<IpAddr>,
    /// The `Ready` condition is `True`.
    pub ready: bool,
}

impl NodeFacts {
    /// What the decision reads of `node`, keyed by its name (in no namespace).
    pub fn of(node: &Node) -> Option<(ServiceKey, Self)> {
        let name = node.metadata.name.clone()?;
        let status = node.status.as_ref();
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        Some((
            ServiceKey::new(String::new(), name),
            Self {
                labels: node.metadata.labels.clone().unwrap_or_default(),
                internal: node_addresses(node, "InternalIP"),
                external: node_addresses(node, "ExternalIP"),
                ready,
            },
        ))
    }
}

/// One EndpointSlice as the decision reads it: its Service and the nodes of its ready Pod
/// endpoints (k3s L268-L275).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceFacts {
    /// The slice's namespace and name.
    pub slice: ServiceKey,
    /// The Service it belongs to (`kubernetes.io/service-name`), if any.
    pub service: Option<ServiceKey>,
    /// Nodes of its ready Pod endpoints.
    pub ready_nodes: BTreeSet<String>,
}

impl SliceFacts {
    /// What the decision reads of `slice`.
    pub fn of(slice: &EndpointSlice) -> Self {
        let namespace = slice.metadata.namespace.clone().unwrap_or_default();
        let service = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("kubernetes.io/service-name"))
            .map(|name| ServiceKey::new(namespace.clone(), name.clone()));
        let ready_nodes = ready_pod_nodes(slice).cloned().collect();
        Self {
            slice: ServiceKey::new(namespace, slice.metadata.name.clone().unwrap_or_default()),
            service,
            ready_nodes,
        }
    }
}

/// A Service served by node addresses, but for its endpoints (read at each computation).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Member {
    created: i64,
    labels: Labels,
    ip_families: Vec<Family>,
    ports: Vec<ferrolb_config::allocator::ProtocolPort>,
    local: bool,
    current_ingress: Vec<String>,
}

/// A keyed cache fed by a watch's events: a re-list replaces it once complete.
#[derive(Debug)]
struct Listed<T> {
    current: BTreeMap<ServiceKey, T>,
    listing: Option<BTreeMap<ServiceKey, T>>,
}

impl<T> Default for Listed<T> {
    fn default() -> Self {
        Self {
            current: BTreeMap::new(),
            listing: None,
        }
    }
}

impl<T: PartialEq> Listed<T> {
    /// Takes one event of `(key, value)` in; whether the cache changed.
    fn apply(&mut self, event: Event<(ServiceKey, T)>) -> bool {
        match event {
            Event::Apply((key, value)) => {
                if self.current.get(&key) == Some(&value) {
                    false
                } else {
                    self.current.insert(key, value);
                    true
                }
            }
            Event::Delete((key, _)) => self.current.remove(&key).is_some(),
            Event::Init => {
                self.listing = Some(BTreeMap::new());
                false
            }
            Event::InitApply((key, value)) => {
                self.listing
                    .get_or_insert_with(BTreeMap::new)
                    .insert(key, value);
                false
            }
            Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                let changed = listed != self.current;
                self.current = listed;
                changed
            }
        }
    }
}

/// The node-address decision of every Service served by node addresses, kept current.
#[derive(Debug, Default)]
pub struct Engine {
    nodes: Listed<NodeFacts>,
    slices: Listed<SliceFacts>,
    /// Nodes whose speaker is alive.
    alive: BTreeSet<String>,
    members: BTreeMap<ServiceKey, Member>,
    outcomes: BTreeMap<ServiceKey, ServiceOutcome>,
    /// An input changed since the last computation.
    dirty: bool,
    /// Services whose outcome changed in a computation and that were not decided since.
    changed: BTreeSet<ServiceKey>,
    /// Services asked for while an input had changed: decided again after the computation.
    deferred: BTreeSet<ServiceKey>,
    /// The port-held Events last recorded per Service (recorded again only when they change).
    reported: BTreeMap<ServiceKey, Vec<Note>>,
}

impl Engine {
    /// Takes a Node watch event in (keyed by name, namespace empty).
    pub fn node_event(&mut self, event: Event<(ServiceKey, NodeFacts)>) {
        self.dirty |= self.nodes.apply(event);
    }

    /// Takes an EndpointSlice watch event in. Only slices of node-address Services with
    /// `externalTrafficPolicy: Local` change a decision.
    pub fn slice_event(&mut self, event: Event<(ServiceKey, SliceFacts)>) {
        let members = &self.members;
        let relevant = |s: &SliceFacts| {
            s.service
                .as_ref()
                .and_then(|k| members.get(k))
                .is_some_and(|m| m.local)
        };
        let touches = match &event {
            Event::Apply((key, s)) => {
                relevant(s) || self.slices.current.get(key).is_some_and(relevant)
            }
            Event::Delete((key, _)) => self.slices.current.get(key).is_some_and(relevant),
            // A re-list may change any slice.
            Event::InitDone => members.values().any(|m| m.local),
            Event::Init | Event::InitApply(_) => false,
        };
        let changed = self.slices.apply(event);
        self.dirty |= changed && touches;
    }

    /// Sets the nodes whose speaker is alive.
    pub fn set_alive(&mut self, alive: BTreeSet<String>) {
        if alive != self.alive {
            self.alive = alive;
            self.dirty = true;
        }
    }

    /// Whether `ip` is an address of some Node.
    pub fn is_node_address(&self, ip: IpAddr) -> bool {
        self.nodes
            .current
            .values()
            .any(|n| n.internal.contains(&ip) || n.external.contains(&ip))
    }

    /// Sets whether the Service `key` is served by node addresses (`Some` with its parsed
    /// request) or not.
    pub fn set_member(&mut self, key: &ServiceKey, service: Option<(&Service, &ServiceRequest)>) {
        let member = service.map(|(service, request)| Member {
            created: service
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(0, |t| t.0.as_second()),
            labels: service.metadata.labels.clone().unwrap_or_default(),
            ip_families: request.ip_families.clone(),
            ports: request.ports.clone(),
            local: matches!(request.backend, Backend::Local(_)),
            current_ingress: crate::core::current_ips(service)
                .iter()
                .map(ToString::to_string)
                .collect(),
        });
        let changed = match member {
            Some(member) => self.members.insert(key.clone(), member.clone()) != Some(member),
            None => {
                self.reported.remove(key);
                self.outcomes.remove(key);
                self.deferred.remove(key);
                self.members.remove(key).is_some()
            }
        };
        self.dirty |= changed;
    }

    /// The outcome for member `key`, with its Events: port-held Warnings only when they differ
    /// from those last recorded. `None` while an input changed since the last computation: the
    /// Service is deferred to [`Self::take_changed`], so that a pass deciding many Services (a
    /// burst of new ones) computes once, not once per Service; or when the computation failed
    /// (logged).
    pub fn decide(&mut self, key: &ServiceKey) -> Option<(Vec<IpAddr>, Vec<Note>)> {
        if self.dirty {
            self.deferred.insert(key.clone());
            return None;
        }
        self.changed.remove(key);
        let outcome = self.outcomes.get(key)?;
        let mut notes: Vec<Note> = outcome
            .events
            .iter()
            .filter(|e| e.reason != PORT_HELD_REASON)
            .map(note)
            .collect();
        let held: Vec<Note> = outcome
            .events
            .iter()
            .filter(|e| e.reason == PORT_HELD_REASON)
            .map(note)
            .collect();
        if self.reported.get(key) != Some(&held) {
            notes.extend(held.iter().cloned());
            self.reported.insert(key.clone(), held);
        }
        Some((outcome.ingress.clone(), notes))
    }

    /// The Services to decide again: those whose outcome changed since they were last decided,
    /// and those deferred (computing afresh if an input changed).
    pub fn take_changed(&mut self) -> Vec<ServiceKey> {
        self.compute();
        let mut keys = std::mem::take(&mut self.changed);
        keys.extend(std::mem::take(&mut self.deferred));
        keys.into_iter().collect()
    }

    /// How many Services are served by node addresses.
    pub fn members(&self) -> usize {
        self.members.len()
    }

    /// Whether the Service `key` is served by node addresses.
    pub fn is_member(&self, key: &ServiceKey) -> bool {
        self.members.contains_key(key)
    }

    fn compute(&mut self) {
        if !std::mem::take(&mut self.dirty) {
            return;
        }
        let nodes = self.nodes.current.iter().map(|(key, facts)| rules::Node {
            name: key.name().to_string(),
            labels: facts.labels.clone(),
            internal: facts.internal.clone(),
            external: facts.external.clone(),
            ready: facts.ready,
            speaker_alive: self.alive.contains(key.name()),
        });
        let nodes = match rules::Nodes::new(nodes) {
            Ok(nodes) => nodes,
            Err(e) => {
                tracing::warn!(error = %e, "node addresses: cannot decide; keeping the last decision");
                return;
            }
        };
        let mut endpoints: BTreeMap<&ServiceKey, BTreeSet<String>> = BTreeMap::new();
        for slice in self.slices.current.values() {
            if let Some(service) = &slice.service
                && self.members.get(service).is_some_and(|m| m.local)
            {
                endpoints
                    .entry(service)
                    .or_default()
                    .extend(slice.ready_nodes.iter().cloned());
            }
        }
        let services: Vec<rules::Service> = self
            .members
            .iter()
            .map(|(key, m)| rules::Service {
                key: key.clone(),
                created: m.created,
                labels: m.labels.clone(),
                ip_families: m.ip_families.clone(),
                ports: m.ports.clone(),
                traffic: if m.local {
                    TrafficPolicy::Local {
                        ready_endpoint_nodes: endpoints.get(key).cloned().unwrap_or_default(),
                    }
                } else {
                    TrafficPolicy::Cluster
                },
                current_ingress: m.current_ingress.clone(),
            })
            .collect();
        // `rules::compute`'s loop, keeping of each outcome only what the status and the Events
        // need: the per-node detail (`listed`, `excluded`) is Services × nodes, hundreds of
        // megabytes at a thousand nodes, and `explain` computes it again when asked.
        let mut order: Vec<&rules::Service> = services.iter().collect();
        order.sort_by(|a, b| rules::priority(a, b));
        let mut held = rules::HeldPorts::new();
        let mut outcomes = BTreeMap::new();
        for service in order {
            match rules::compute_service_brief(&nodes, service, &held) {
                Ok(outcome) => {
                    held.hold(service, &outcome.ingress);
                    outcomes.insert(service.key.clone(), outcome);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "node addresses: cannot decide; keeping the last decision");
                    return;
                }
            }
        }
        for (key, outcome) in &outcomes {
            if self.outcomes.get(key) != Some(outcome) {
                self.changed.insert(key.clone());
            }
        }
        self.outcomes = outcomes;
    }
}

fn note(event: &rules::Event) -> Note {
    Note {
        warning: event.event_type == EventType::Warning,
        reason: event.reason,
        message: event.message.clone(),
    }
}
