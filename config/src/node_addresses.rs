//! Node addresses for LoadBalancer Services: k3s ServiceLB's decision without its pods (issue #35,
//! decision 0024).
//!
//! ServiceLB (k3s `pkg/cloudprovider/servicelb.go`) runs one `svclb-*` DaemonSet per Service and
//! writes into the Service's status the addresses of the nodes whose `svclb` pod is Ready. The pods
//! themselves never see a packet: kube-proxy DNATs the "load balancer IP" (the node's own address)
//! first. What is left of ServiceLB's job is a decision, made here from plain inputs: which node
//! addresses a Service gets, why each node is or is not listed, and which Events to record. No
//! I/O, no Kubernetes types: the controller reads Nodes, Services and EndpointSlices into
//! [`Node`] and [`Service`] and writes what differs.
//!
//! Citations are to k3s-io/k3s at commit `0821db5a081300bc46bddeb04b09823c79255655`,
//! `pkg/cloudprovider/servicelb.go`, by line ("L357" below).
//!
//! The rules, in the order they are applied to each Service:
//!
//! 1. **Eligible nodes.** If any node carries the label [`ENABLE_LB_LABEL`] (any value,
//!    L634-L641 `nodeHasDaemonSetLabel`), only nodes where it is `"true"` (L584-L592, the
//!    DaemonSet's node selector); then, if the Service has a non-empty [`LB_POOL_LABEL`], only nodes
//!    with the same value (L593-L596). Without any `enablelb` label every node is eligible and
//!    `lbpool` is ignored.
//! 2. **Alive.** ServiceLB counts a node while its svclb pod is Ready (L333). Here: the Node is
//!    Ready and ferrolb's speaker on it is alive.
//! 3. **`externalTrafficPolicy: Local`**: only nodes holding a ready endpoint of the Service
//!    (L260-L277, L336).
//! 4. **Which addresses.** External IPs if any remaining node has one, of any family; otherwise
//!    Internal IPs (L346-L361). Other address types are ignored.
//! 5. **Families.** Addresses are filtered by the Service's `ipFamilies` and grouped in that order,
//!    each family sorted as strings (Go's `sort.Strings`, L376-L401): `10.0.0.10` comes before
//!    `10.0.0.9`, exactly as ServiceLB wrote it, so a migrated Service's status does not change.
//! 6. **Ports.** Two Services cannot hold the same port and protocol on one node address: with
//!    ServiceLB the second Service's pod would stay Pending on that node for its hostPort (L526).
//!    Here the earlier Service (creation time, then namespace/name) keeps the address and the
//!    later one loses that address, every port of it (as a Pending pod loses the whole node),
//!    with a reason naming the holder.
//! 7. **Events.** When the ingress list changes: `UnAvailableLoadBalancer` (Warning) if it is now
//!    empty, else `UpdatedLoadBalancer` (Normal, old -> new), with ServiceLB's messages
//!    (L304-L319). ferrolb adds [`PORT_HELD_REASON`] (Warning) for each address lost to a holder.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::IpAddr;

use crate::address::Family;
use crate::allocator::{ProtocolPort, ServiceKey};
use crate::selector::Labels;

/// Prefix of ferrolb's own Service annotations.
pub const ANNOTATION_PREFIX: &str = "ferrolb.io/";
/// A Service's own choice: `"true"` for node addresses, `"false"` for pools only (never the
/// fallback).
pub const OPT_ANNOTATION: &str = "ferrolb.io/node-addresses";
/// Written by the controller with the status of a Service it serves by node addresses (even with
/// no node to list), valued [`SERVED_BY_NODE_ADDRESSES`]: with addresses, the choice sticks, so a
/// pool that frees up later never moves the Service's address.
pub const SERVED_BY_ANNOTATION: &str = "ferrolb.io/served-by";
/// The value of [`SERVED_BY_ANNOTATION`].
pub const SERVED_BY_NODE_ADDRESSES: &str = "node-addresses";
/// The LoadBalancerClass that asks for node addresses, never a pool.
pub const CLASS: &str = "ferrolb.io/node-addresses";

/// Node label that, once present on any node, restricts ServiceLB to nodes where it is `"true"`
/// (k3s L41, L584-L592, L634-L641).
pub const ENABLE_LB_LABEL: &str = "svccontroller.k3s.cattle.io/enablelb";
/// Label on a Service, and on nodes, that restricts the Service to nodes with the same value while
/// the `enablelb` label is in effect (k3s L42, L593-L596).
pub const LB_POOL_LABEL: &str = "svccontroller.k3s.cattle.io/lbpool";
/// The finalizer older ServiceLB versions put on Services; removed when taking over (k3s L38,
/// L651-L689).
pub const SERVICELB_FINALIZER: &str = "svccontroller.k3s.cattle.io/daemonset";
/// ServiceLB's Event reason when the ingress list changed to a non-empty one (k3s L316).
pub const UPDATED_REASON: &str = "UpdatedLoadBalancer";
/// ServiceLB's Event reason when the ingress list changed to an empty one (k3s L314).
pub const UNAVAILABLE_REASON: &str = "UnAvailableLoadBalancer";
/// ServiceLB's message for [`UNAVAILABLE_REASON`] (k3s L314).
pub const UNAVAILABLE_MESSAGE: &str = "There are no available nodes for LoadBalancer";
/// ferrolb's Event reason when a node address is not listed because an earlier Service holds one
/// of the Service's ports on it (ServiceLB has none: its pod just stays Pending).
pub const PORT_HELD_REASON: &str = "NodeAddressPortHeld";

/// A Node as this decision sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.labels` (for [`ENABLE_LB_LABEL`] and [`LB_POOL_LABEL`]).
    pub labels: Labels,
    /// `status.addresses` of type `InternalIP`, both families, in any order.
    pub internal: Vec<IpAddr>,
    /// `status.addresses` of type `ExternalIP`, both families, in any order.
    pub external: Vec<IpAddr>,
    /// The Node's `Ready` condition is `True`.
    pub ready: bool,
    /// ferrolb's speaker on this node is alive (it stands in for ServiceLB's Ready svclb pod).
    pub speaker_alive: bool,
}

/// `spec.externalTrafficPolicy`, with what `Local` needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum TrafficPolicy {
    /// `Cluster` (the default): any node forwards.
    #[default]
    Cluster,
    /// `Local`: only nodes with a ready endpoint answer.
    Local {
        /// Names of the nodes holding a ready Pod endpoint of the Service (EndpointSlice
        /// endpoints with a Pod `targetRef`, `conditions.ready` true and a `nodeName`, as k3s
        /// L268-L275 counts them).
        ready_endpoint_nodes: BTreeSet<String>,
    },
}

/// A LoadBalancer Service served by node addresses, as this decision sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Service {
    /// Namespace and name.
    pub key: ServiceKey,
    /// `metadata.creationTimestamp` as a sortable value (seconds since the Unix epoch): earlier
    /// Services keep contested ports.
    pub created: i64,
    /// `metadata.labels` (for [`LB_POOL_LABEL`]).
    pub labels: Labels,
    /// `spec.ipFamilies`, in order. A repeated family counts once.
    pub ip_families: Vec<Family>,
    /// `spec.ports`: port and protocol.
    pub ports: Vec<ProtocolPort>,
    /// `spec.externalTrafficPolicy`.
    pub traffic: TrafficPolicy,
    /// `status.loadBalancer.ingress` as it is now, one string per entry (its IP, else its
    /// hostname), in order: compared with the new list to decide the Events, as k3s compares the
    /// statuses (L305) and prints them (`ingressToString`).
    pub current_ingress: Vec<String>,
}

/// Input that cannot be decided on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    /// Two nodes with one name.
    #[error("node {0} is listed twice")]
    DuplicateNode(String),
    /// Two Services with one namespace/name.
    #[error("Service {0} is listed twice")]
    DuplicateService(ServiceKey),
    /// A Service port 0 (the API server refuses it; a hand-built input could carry it).
    #[error("Service {service} has port 0 ({protocol})", protocol = port.protocol)]
    ZeroPort {
        /// The Service.
        service: ServiceKey,
        /// The offending port.
        port: ProtocolPort,
    },
}

/// Which of a node's addresses a Service gets (k3s L346-L361).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AddressKind {
    /// `ExternalIP`: some eligible node has one.
    External,
    /// `InternalIP`: no eligible node has an External IP.
    Internal,
}

impl fmt::Display for AddressKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AddressKind::External => "ExternalIP",
            AddressKind::Internal => "InternalIP",
        })
    }
}

/// Why a node, or one of its addresses, is not in a Service's ingress list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Exclusion {
    /// Some node has [`ENABLE_LB_LABEL`] and this one does not have it `"true"`.
    NotEnabled {
        /// The node's value of the label, if it has one.
        value: Option<String>,
    },
    /// The Service asks for an `lbpool` this node is not in.
    OtherPool {
        /// The Service's `lbpool`.
        wanted: String,
        /// The node's `lbpool`, if any.
        node: Option<String>,
    },
    /// The Node is not Ready.
    NotReady,
    /// ferrolb's speaker on the node is not alive.
    SpeakerNotAlive,
    /// `externalTrafficPolicy: Local` and no ready endpoint on the node.
    NoReadyEndpoint,
    /// Other eligible nodes have External IPs, so Internal IPs are not used, and this node has
    /// none (k3s L357-L361).
    NoExternalAddress,
    /// The node has no address of this kind in the Service's families.
    NoAddressOfFamilies {
        /// The kind of address in use for the Service.
        kind: AddressKind,
    },
    /// An earlier Service holds one of this Service's ports on this address.
    PortHeld {
        /// The node address.
        address: IpAddr,
        /// The contested port.
        port: ProtocolPort,
        /// The Service holding it.
        holder: ServiceKey,
    },
}

impl fmt::Display for Exclusion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exclusion::NotEnabled { value: None } => {
                write!(f, "not labelled {ENABLE_LB_LABEL}=true (other nodes are)")
            }
            Exclusion::NotEnabled { value: Some(v) } => {
                write!(f, "labelled {ENABLE_LB_LABEL}={v:?}, not \"true\"")
            }
            Exclusion::OtherPool { wanted, node: None } => {
                write!(f, "the Service wants {LB_POOL_LABEL}={wanted:?}, the node has none")
            }
            Exclusion::OtherPool {
                wanted,
                node: Some(n),
            } => write!(
                f,
                "the Service wants {LB_POOL_LABEL}={wanted:?}, the node is in {n:?}"
            ),
            Exclusion::NotReady => f.write_str("the Node is not Ready"),
            Exclusion::SpeakerNotAlive => f.write_str("ferrolb's speaker on the node is not alive"),
            Exclusion::NoReadyEndpoint => f.write_str(
                "externalTrafficPolicy is Local and the node has no ready endpoint of the Service",
            ),
            Exclusion::NoExternalAddress => f.write_str(
                "other nodes have an ExternalIP, so only ExternalIPs are listed, and this node has none",
            ),
            Exclusion::NoAddressOfFamilies { kind } => {
                write!(f, "no {kind} of the Service's ipFamilies")
            }
            Exclusion::PortHeld {
                address,
                port,
                holder,
            } => write!(f, "{port} on {address} is held by Service {holder}"),
        }
    }
}

/// One node left out of a Service's list, or one of its addresses ([`Exclusion::PortHeld`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Excluded {
    /// The node.
    pub node: String,
    /// Why.
    pub reason: Exclusion,
}

/// Kubernetes Event type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// `Normal`.
    Normal,
    /// `Warning`.
    Warning,
}

/// An Event to record on the Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Normal or Warning.
    pub event_type: EventType,
    /// The reason ([`UPDATED_REASON`], [`UNAVAILABLE_REASON`], [`PORT_HELD_REASON`]).
    pub reason: &'static str,
    /// The message.
    pub message: String,
}

/// The decision for one Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceOutcome {
    /// The Service.
    pub service: ServiceKey,
    /// The kind of address in use; `None` when no node is eligible.
    pub kind: Option<AddressKind>,
    /// `status.loadBalancer.ingress`: in the Service's family order, each family sorted as
    /// strings, no duplicates.
    pub ingress: Vec<IpAddr>,
    /// Each listed node and its addresses in `ingress` (a node may lose some addresses to
    /// [`Exclusion::PortHeld`] and keep others).
    pub listed: BTreeMap<String, Vec<IpAddr>>,
    /// The nodes, or node addresses, left out and why, by node name.
    pub excluded: Vec<Excluded>,
    /// Events to record. The port Events come with every decision that finds a held port: the
    /// caller de-duplicates them against the previous decision.
    pub events: Vec<Event>,
}

impl ServiceOutcome {
    /// `ingress` as status strings.
    pub fn ingress_strings(&self) -> Vec<String> {
        self.ingress.iter().map(IpAddr::to_string).collect()
    }

    /// The status changes (what k3s's `LoadBalancerStatusEqual` check decides, L305).
    pub fn changed(&self, current_ingress: &[String]) -> bool {
        self.ingress_strings() != current_ingress
    }
}

/// All nodes, validated and indexed once for every Service's decision.
#[derive(Clone, Debug, Default)]
pub struct Nodes {
    by_name: BTreeMap<String, Node>,
    enable_lb_in_effect: bool,
    /// Every node address by its rank in Go's `sort.Strings` order of their texts, and its
    /// text: computed once, so that no Service's decision formats or compares strings per node.
    rank: HashMap<IpAddr, u32>,
    text: Vec<String>,
}

impl Nodes {
    /// Index the cluster's nodes: all of them, Ready or not, since any node's `enablelb` label
    /// switches the rule on (k3s lists every node, L640).
    pub fn new(nodes: impl IntoIterator<Item = Node>) -> Result<Self, InputError> {
        let mut by_name = BTreeMap::new();
        for node in nodes {
            if by_name.contains_key(&node.name) {
                return Err(InputError::DuplicateNode(node.name));
            }
            by_name.insert(node.name.clone(), node);
        }
        let enable_lb_in_effect = by_name
            .values()
            .any(|n| n.labels.contains_key(ENABLE_LB_LABEL));
        let mut all: Vec<(String, IpAddr)> = by_name
            .values()
            .flat_map(|n| n.internal.iter().chain(&n.external))
            .map(|a| (a.to_string(), *a))
            .collect();
        all.sort();
        all.dedup();
        let rank = all
            .iter()
            .enumerate()
            .map(|(i, (_, a))| (*a, u32::try_from(i).unwrap_or(u32::MAX)))
            .collect();
        let text = all.into_iter().map(|(t, _)| t).collect();
        Ok(Self {
            by_name,
            enable_lb_in_effect,
            rank,
            text,
        })
    }

    /// Sorts node addresses as Go's `sort.Strings` sorts their texts (k3s L390-L391), by the
    /// ranks computed once.
    fn sort_as_strings(&self, addresses: &mut [IpAddr]) {
        addresses.sort_by_key(|a| self.rank.get(a).copied().unwrap_or(u32::MAX));
    }

    /// The text of a node address (its status string).
    fn text_of(&self, address: &IpAddr) -> Option<&str> {
        let rank = *self.rank.get(address)?;
        self.text
            .get(usize::try_from(rank).ok()?)
            .map(String::as_str)
    }

    /// Some node carries [`ENABLE_LB_LABEL`] (any value), so only `"true"` nodes are eligible.
    pub fn enable_lb_in_effect(&self) -> bool {
        self.enable_lb_in_effect
    }

    /// The nodes, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Node> {
        self.by_name.values()
    }

    /// Why a node cannot serve this Service at all, or `None` if it is eligible. The first rule
    /// that fails is the reason given.
    pub fn ineligibility(&self, node: &Node, service: &Service) -> Option<Exclusion> {
        if self.enable_lb_in_effect {
            let value = node.labels.get(ENABLE_LB_LABEL);
            if value.map(String::as_str) != Some("true") {
                return Some(Exclusion::NotEnabled {
                    value: value.cloned(),
                });
            }
            // k3s adds the lbpool selector only next to the enablelb one (L590-L596), and only
            // for a non-empty value.
            if let Some(wanted) = service.labels.get(LB_POOL_LABEL).filter(|v| !v.is_empty()) {
                let pool = node.labels.get(LB_POOL_LABEL);
                if pool != Some(wanted) {
                    return Some(Exclusion::OtherPool {
                        wanted: wanted.clone(),
                        node: pool.cloned(),
                    });
                }
            }
        }
        if !node.ready {
            return Some(Exclusion::NotReady);
        }
        if !node.speaker_alive {
            return Some(Exclusion::SpeakerNotAlive);
        }
        if let TrafficPolicy::Local {
            ready_endpoint_nodes,
        } = &service.traffic
            && !ready_endpoint_nodes.contains(&node.name)
        {
            return Some(Exclusion::NoReadyEndpoint);
        }
        None
    }
}

/// Which Service keeps a contested port: the earlier creation time, then namespace/name. A total
/// order on distinct keys, so the outcome never depends on the order of the input.
pub fn priority(a: &Service, b: &Service) -> Ordering {
    (a.created, &a.key).cmp(&(b.created, &b.key))
}

/// The (address, port) pairs held so far, and by whom: what a Service's decision needs to know
/// of the Services before it in [`priority`] order. Kept per port as the holders with the
/// addresses each holds, not per pair: a Service holds its ports on all its addresses, so holding
/// costs its ports, not its ports times the nodes.
#[derive(Clone, Debug, Default)]
pub struct HeldPorts {
    /// Per port, the holders in the order they took it.
    held: HashMap<ProtocolPort, Vec<Holder>>,
}

/// A Service holding a port, with the addresses it holds it on (sorted; shared by its ports).
type Holder = (ServiceKey, std::sync::Arc<[IpAddr]>);

impl HeldPorts {
    /// Nothing held.
    pub fn new() -> Self {
        Self::default()
    }

    /// Who holds `port` on `address`, if anyone: the first to take it.
    pub fn holder(&self, address: IpAddr, port: ProtocolPort) -> Option<&ServiceKey> {
        self.held
            .get(&port)?
            .iter()
            .find(|(_, addresses)| addresses.binary_search(&address).is_ok())
            .map(|(key, _)| key)
    }

    /// Record that `service` holds every one of its ports on each of `ingress`. A pair already
    /// held stays with its holder: the first to hold keeps it.
    pub fn hold(&mut self, service: &Service, ingress: &[IpAddr]) {
        if ingress.is_empty() {
            return;
        }
        let mut addresses = ingress.to_vec();
        addresses.sort_unstable();
        addresses.dedup();
        let addresses: std::sync::Arc<[IpAddr]> = addresses.into();
        let mut ports = service.ports.clone();
        ports.sort_unstable();
        ports.dedup();
        for port in ports {
            self.held
                .entry(port)
                .or_default()
                .push((service.key.clone(), addresses.clone()));
        }
    }

    /// Forget everything `service` holds (for a caller that recomputes it).
    pub fn release(&mut self, service: &ServiceKey) {
        for holders in self.held.values_mut() {
            holders.retain(|(holder, _)| holder != service);
        }
        self.held.retain(|_, holders| !holders.is_empty());
    }

    /// Every held pair, in (address, port) order.
    pub fn iter(&self) -> impl Iterator<Item = (IpAddr, ProtocolPort, &ServiceKey)> {
        let mut pairs: BTreeMap<(IpAddr, ProtocolPort), &ServiceKey> = BTreeMap::new();
        for (&port, holders) in &self.held {
            for (key, addresses) in holders {
                for &address in addresses.iter() {
                    pairs.entry((address, port)).or_insert(key);
                }
            }
        }
        pairs.into_iter().map(|((a, p), k)| (a, p, k))
    }
}

/// Decide one Service, given the ports held by the Services before it in [`priority`] order
/// (pairs held by the Service itself are ignored, so an index from a previous round can be
/// reused for the Service being recomputed). Call it in priority order, holding each outcome's
/// ingress in `held`, to get what [`compute`] gets.
pub fn compute_service(
    nodes: &Nodes,
    service: &Service,
    held: &HeldPorts,
) -> Result<ServiceOutcome, InputError> {
    decide_service(nodes, service, held, true)
}

/// [`compute_service`] without the per-node detail: `listed` and `excluded` are left empty
/// (everything else is the same). For a caller that keeps the outcomes of many Services and
/// needs only the status and the Events: the detail is Services × nodes.
pub fn compute_service_brief(
    nodes: &Nodes,
    service: &Service,
    held: &HeldPorts,
) -> Result<ServiceOutcome, InputError> {
    decide_service(nodes, service, held, false)
}

fn decide_service(
    nodes: &Nodes,
    service: &Service,
    held: &HeldPorts,
    detail: bool,
) -> Result<ServiceOutcome, InputError> {
    let mut ports: Vec<ProtocolPort> = service.ports.clone();
    ports.sort();
    ports.dedup();
    if let Some(&port) = ports.iter().find(|p| p.port == 0) {
        return Err(InputError::ZeroPort {
            service: service.key.clone(),
            port,
        });
    }
    let mut families: Vec<Family> = Vec::with_capacity(2);
    for &family in &service.ip_families {
        if !families.contains(&family) {
            families.push(family);
        }
    }

    let mut excluded = Vec::new();
    let mut eligible = Vec::new();
    for node in nodes.iter() {
        match nodes.ineligibility(node, service) {
            Some(reason) if detail => excluded.push(Excluded {
                node: node.name.clone(),
                reason,
            }),
            Some(_) => {}
            None => eligible.push(node),
        }
    }

    // External IPs of any family on any eligible node switch the whole Service to External IPs,
    // before the family filter (L346-L361): an IPv4 Service whose nodes only have IPv6 External
    // IPs gets nothing, as with ServiceLB.
    let kind = if eligible.is_empty() {
        None
    } else if eligible.iter().any(|n| !n.external.is_empty()) {
        Some(AddressKind::External)
    } else {
        Some(AddressKind::Internal)
    };

    let mut listed: BTreeMap<String, Vec<IpAddr>> = BTreeMap::new();
    let mut accepted: BTreeSet<IpAddr> = BTreeSet::new();
    let mut port_events: BTreeMap<(IpAddr, ProtocolPort), ServiceKey> = BTreeMap::new();
    if let Some(kind) = kind {
        for node in eligible {
            let addresses = match kind {
                AddressKind::External => &node.external,
                AddressKind::Internal => &node.internal,
            };
            if addresses.is_empty() && kind == AddressKind::External {
                if detail {
                    excluded.push(Excluded {
                        node: node.name.clone(),
                        reason: Exclusion::NoExternalAddress,
                    });
                }
                continue;
            }
            let mut mine: Vec<IpAddr> = addresses
                .iter()
                .copied()
                .filter(|a| families.contains(&Family::of(*a)))
                .collect();
            nodes.sort_as_strings(&mut mine);
            mine.dedup();
            if mine.is_empty() {
                if detail {
                    excluded.push(Excluded {
                        node: node.name.clone(),
                        reason: Exclusion::NoAddressOfFamilies { kind },
                    });
                }
                continue;
            }
            for address in mine {
                // The first of the Service's ports (in order) held by someone else names the
                // holder; one is enough to lose the address.
                let taken = ports.iter().find_map(|&port| {
                    held.holder(address, port)
                        .filter(|h| **h != service.key)
                        .map(|h| (port, h.clone()))
                });
                match taken {
                    Some((port, holder)) => {
                        port_events.insert((address, port), holder.clone());
                        if detail {
                            excluded.push(Excluded {
                                node: node.name.clone(),
                                reason: Exclusion::PortHeld {
                                    address,
                                    port,
                                    holder,
                                },
                            });
                        }
                    }
                    None => {
                        accepted.insert(address);
                        if detail {
                            listed.entry(node.name.clone()).or_default().push(address);
                        }
                    }
                }
            }
        }
    }

    let mut ingress = Vec::with_capacity(accepted.len());
    for family in &families {
        let mut of_family: Vec<IpAddr> = accepted
            .iter()
            .copied()
            .filter(|a| Family::of(*a) == *family)
            .collect();
        nodes.sort_as_strings(&mut of_family);
        ingress.extend(of_family);
    }
    for addresses in listed.values_mut() {
        // A node's addresses in ingress order: by family as the Service lists them, then as
        // strings (not by looking each up in ingress, which would cost N per node).
        addresses.sort_by_key(|a| {
            (
                families.iter().position(|f| *f == Family::of(*a)),
                nodes.rank.get(a).copied(),
            )
        });
    }

    let mut events = Vec::new();
    // Compared by the texts computed once; formatted only when the status changes.
    let unchanged = ingress.len() == service.current_ingress.len()
        && ingress
            .iter()
            .zip(&service.current_ingress)
            .all(|(a, current)| nodes.text_of(a) == Some(current.as_str()));
    if !unchanged {
        let new_strings: Vec<String> = ingress.iter().map(IpAddr::to_string).collect();
        if ingress.is_empty() {
            events.push(Event {
                event_type: EventType::Warning,
                reason: UNAVAILABLE_REASON,
                message: UNAVAILABLE_MESSAGE.to_string(),
            });
        } else {
            events.push(Event {
                event_type: EventType::Normal,
                reason: UPDATED_REASON,
                message: format!(
                    "Updated LoadBalancer with new IPs: {} -> {}",
                    go_list(&service.current_ingress),
                    go_list(&new_strings)
                ),
            });
        }
    }
    for ((address, port), holder) in port_events {
        events.push(Event {
            event_type: EventType::Warning,
            reason: PORT_HELD_REASON,
            message: format!(
                "node address {address} not listed: {port} on it is held by Service {holder}, created earlier"
            ),
        });
    }

    Ok(ServiceOutcome {
        service: service.key.clone(),
        kind,
        ingress,
        listed,
        excluded,
        events,
    })
}

/// Decide every Service: in [`priority`] order, each given the ports held by those before it.
/// The result is keyed by Service and does not depend on the order of either input.
pub fn compute(
    nodes: &Nodes,
    services: &[Service],
) -> Result<BTreeMap<ServiceKey, ServiceOutcome>, InputError> {
    let mut order: Vec<&Service> = services.iter().collect();
    order.sort_by(|a, b| priority(a, b));
    let mut seen = BTreeSet::new();
    for service in &order {
        if !seen.insert(&service.key) {
            return Err(InputError::DuplicateService(service.key.clone()));
        }
    }
    let mut held = HeldPorts::new();
    let mut out = BTreeMap::new();
    for service in order {
        let outcome = compute_service(nodes, service, &held)?;
        held.hold(service, &outcome.ingress);
        out.insert(service.key.clone(), outcome);
    }
    Ok(out)
}

/// A list as Go's `%v` prints a `[]string`: `[a b c]` (k3s L316).
fn go_list(items: &[String]) -> String {
    format!("[{}]", items.join(" "))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::allocator::Protocol;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|s| ip(s)).collect()
    }

    fn node(name: &str, internal: &[&str], external: &[&str]) -> Node {
        Node {
            name: name.into(),
            labels: Labels::new(),
            internal: ips(internal),
            external: ips(external),
            ready: true,
            speaker_alive: true,
        }
    }

    fn labelled(mut n: Node, key: &str, value: &str) -> Node {
        n.labels.insert(key.into(), value.into());
        n
    }

    fn svc(name: &str, created: i64, ports: &[u16]) -> Service {
        Service {
            key: ServiceKey::new("default", name),
            created,
            labels: Labels::new(),
            ip_families: vec![Family::V4],
            ports: ports.iter().map(|&p| ProtocolPort::tcp(p)).collect(),
            traffic: TrafficPolicy::Cluster,
            current_ingress: Vec::new(),
        }
    }

    fn one(nodes: Vec<Node>, service: &Service) -> ServiceOutcome {
        compute_service(&Nodes::new(nodes).unwrap(), service, &HeldPorts::new()).unwrap()
    }

    fn reason_of(out: &ServiceOutcome, node: &str) -> Option<Exclusion> {
        out.excluded
            .iter()
            .find(|e| e.node == node)
            .map(|e| e.reason.clone())
    }

    // k3s L325-L361 (`podIPs`): no External IP anywhere, so every node's Internal IPs.
    #[test]
    fn internal_ips_when_no_node_has_an_external_one() {
        let out = one(
            vec![node("a", &["10.0.0.2"], &[]), node("b", &["10.0.0.1"], &[])],
            &svc("web", 0, &[80]),
        );
        assert_eq!(out.kind, Some(AddressKind::Internal));
        assert_eq!(out.ingress, ips(&["10.0.0.1", "10.0.0.2"]));
        assert_eq!(out.listed["a"], ips(&["10.0.0.2"]));
    }

    // k3s L357-L361: one node's External IP switches the whole list to External IPs; a node with
    // only an Internal IP then drops out.
    #[test]
    fn external_ips_when_any_eligible_node_has_one() {
        let out = one(
            vec![
                node("a", &["10.0.0.1"], &["203.0.113.1"]),
                node("b", &["10.0.0.2"], &[]),
            ],
            &svc("web", 0, &[80]),
        );
        assert_eq!(out.kind, Some(AddressKind::External));
        assert_eq!(out.ingress, ips(&["203.0.113.1"]));
        assert_eq!(reason_of(&out, "b"), Some(Exclusion::NoExternalAddress));
    }

    // k3s L336, L346: only nodes that serve count in the External/Internal choice; an ineligible
    // node's External IP does not switch the list.
    #[test]
    fn an_ineligible_node_does_not_decide_the_kind() {
        let mut down = node("a", &["10.0.0.1"], &["203.0.113.1"]);
        down.ready = false;
        let out = one(
            vec![down, node("b", &["10.0.0.2"], &[])],
            &svc("web", 0, &[80]),
        );
        assert_eq!(out.kind, Some(AddressKind::Internal));
        assert_eq!(out.ingress, ips(&["10.0.0.2"]));
    }

    // k3s L357-L366: the choice is made before the family filter, so IPv6-only External IPs
    // leave an IPv4 Service with nothing, as ServiceLB does.
    #[test]
    fn external_of_another_family_still_switches_to_external() {
        let out = one(
            vec![node("a", &["10.0.0.1"], &["2001:db8::1"])],
            &svc("web", 0, &[80]),
        );
        assert_eq!(out.kind, Some(AddressKind::External));
        assert!(out.ingress.is_empty());
        assert_eq!(
            reason_of(&out, "a"),
            Some(Exclusion::NoAddressOfFamilies {
                kind: AddressKind::External
            })
        );
    }

    // k3s L376-L401 (`filterByIPFamily`): grouped in ipFamilies order, each family sorted with
    // sort.Strings: "10.0.0.10" < "10.0.0.9".
    #[test]
    fn families_in_order_each_sorted_as_strings() {
        let mut s = svc("web", 0, &[80]);
        s.ip_families = vec![Family::V6, Family::V4];
        let out = one(
            vec![
                node("a", &["10.0.0.9", "fd00::9"], &[]),
                node("b", &["10.0.0.10", "fd00::10"], &[]),
            ],
            &s,
        );
        assert_eq!(
            out.ingress,
            ips(&["fd00::10", "fd00::9", "10.0.0.10", "10.0.0.9"])
        );
        s.ip_families = vec![Family::V4];
        let out = one(
            vec![
                node("a", &["10.0.0.9", "fd00::9"], &[]),
                node("b", &["10.0.0.10", "fd00::10"], &[]),
            ],
            &s,
        );
        assert_eq!(out.ingress, ips(&["10.0.0.10", "10.0.0.9"]));
    }

    // k3s L329, L346 (a set): an address two nodes report is listed once.
    #[test]
    fn shared_address_listed_once() {
        let out = one(
            vec![
                node("a", &["10.0.0.1"], &["198.51.100.7"]),
                node("b", &["10.0.0.2"], &["198.51.100.7"]),
            ],
            &svc("web", 0, &[80]),
        );
        assert_eq!(out.ingress, ips(&["198.51.100.7"]));
        assert_eq!(out.listed.len(), 2);
    }

    // k3s L584-L596 and L634-L641: one node with the label (any value) restricts to "true" nodes.
    #[test]
    fn enablelb_label_anywhere_restricts_to_true_nodes() {
        let out = one(
            vec![
                labelled(node("a", &["10.0.0.1"], &[]), ENABLE_LB_LABEL, "true"),
                labelled(node("b", &["10.0.0.2"], &[]), ENABLE_LB_LABEL, "false"),
                node("c", &["10.0.0.3"], &[]),
            ],
            &svc("web", 0, &[80]),
        );
        assert_eq!(out.ingress, ips(&["10.0.0.1"]));
        assert_eq!(
            reason_of(&out, "b"),
            Some(Exclusion::NotEnabled {
                value: Some("false".into())
            })
        );
        assert_eq!(
            reason_of(&out, "c"),
            Some(Exclusion::NotEnabled { value: None })
        );
    }

    // k3s L634-L641 lists every node: a NotReady node's "false" label still switches the rule on.
    #[test]
    fn enablelb_label_on_a_down_node_still_counts() {
        let mut down = labelled(node("a", &["10.0.0.1"], &[]), ENABLE_LB_LABEL, "false");
        down.ready = false;
        let out = one(
            vec![down, node("b", &["10.0.0.2"], &[])],
            &svc("web", 0, &[80]),
        );
        assert!(out.ingress.is_empty());
        assert_eq!(
            reason_of(&out, "b"),
            Some(Exclusion::NotEnabled { value: None })
        );
    }

    // k3s L593-L596: lbpool applies only with enablelb in effect, and only for a non-empty value.
    #[test]
    fn lbpool_selects_nodes_of_the_same_pool() {
        let nodes = vec![
            labelled(
                labelled(node("a", &["10.0.0.1"], &[]), ENABLE_LB_LABEL, "true"),
                LB_POOL_LABEL,
                "edge",
            ),
            labelled(node("b", &["10.0.0.2"], &[]), ENABLE_LB_LABEL, "true"),
        ];
        let mut s = svc("web", 0, &[80]);
        s.labels.insert(LB_POOL_LABEL.into(), "edge".into());
        let out = one(nodes.clone(), &s);
        assert_eq!(out.ingress, ips(&["10.0.0.1"]));
        assert_eq!(
            reason_of(&out, "b"),
            Some(Exclusion::OtherPool {
                wanted: "edge".into(),
                node: None
            })
        );
        s.labels.insert(LB_POOL_LABEL.into(), String::new());
        assert_eq!(one(nodes, &s).ingress, ips(&["10.0.0.1", "10.0.0.2"]));
    }

    #[test]
    fn lbpool_is_ignored_without_enablelb() {
        let mut s = svc("web", 0, &[80]);
        s.labels.insert(LB_POOL_LABEL.into(), "edge".into());
        let out = one(
            vec![
                labelled(node("a", &["10.0.0.1"], &[]), LB_POOL_LABEL, "edge"),
                node("b", &["10.0.0.2"], &[]),
            ],
            &s,
        );
        assert_eq!(out.ingress, ips(&["10.0.0.1", "10.0.0.2"]));
    }

    // k3s L333: ServiceLB lists a node while its svclb pod is Ready; here Node Ready and speaker.
    #[test]
    fn not_ready_and_dead_speaker_are_left_out() {
        let mut a = node("a", &["10.0.0.1"], &[]);
        a.ready = false;
        let mut b = node("b", &["10.0.0.2"], &[]);
        b.speaker_alive = false;
        let out = one(
            vec![a, b, node("c", &["10.0.0.3"], &[])],
            &svc("web", 0, &[80]),
        );
        assert_eq!(out.ingress, ips(&["10.0.0.3"]));
        assert_eq!(reason_of(&out, "a"), Some(Exclusion::NotReady));
        assert_eq!(reason_of(&out, "b"), Some(Exclusion::SpeakerNotAlive));
    }

    // k3s L260-L277, L336: Local lists only nodes with a ready endpoint; none means no address.
    #[test]
    fn local_policy_lists_only_nodes_with_ready_endpoints() {
        let mut s = svc("web", 0, &[80]);
        s.traffic = TrafficPolicy::Local {
            ready_endpoint_nodes: ["b".to_string()].into(),
        };
        let nodes = vec![node("a", &["10.0.0.1"], &[]), node("b", &["10.0.0.2"], &[])];
        let out = one(nodes.clone(), &s);
        assert_eq!(out.ingress, ips(&["10.0.0.2"]));
        assert_eq!(reason_of(&out, "a"), Some(Exclusion::NoReadyEndpoint));
        s.traffic = TrafficPolicy::Local {
            ready_endpoint_nodes: BTreeSet::new(),
        };
        assert!(one(nodes, &s).ingress.is_empty());
    }

    // k3s L526 (hostPort): the second Service on port 80 would stay Pending; here the earlier
    // Service keeps the address and the later one gets a reason and an Event naming it.
    #[test]
    fn older_service_keeps_a_contested_port() {
        let nodes = Nodes::new(vec![
            node("a", &["10.0.0.1"], &[]),
            node("b", &["10.0.0.2"], &[]),
        ])
        .unwrap();
        let traefik = svc("traefik", 10, &[80, 443]);
        let other = svc("other", 20, &[80]);
        let dns = svc("dns", 30, &[53]);
        let out = compute(&nodes, &[other.clone(), dns, traefik.clone()]).unwrap();
        assert_eq!(out[&traefik.key].ingress, ips(&["10.0.0.1", "10.0.0.2"]));
        assert_eq!(out[&dns_key()].ingress, ips(&["10.0.0.1", "10.0.0.2"]));
        let lost = &out[&other.key];
        assert!(lost.ingress.is_empty());
        assert_eq!(
            reason_of(lost, "a"),
            Some(Exclusion::PortHeld {
                address: ip("10.0.0.1"),
                port: ProtocolPort::tcp(80),
                holder: traefik.key.clone()
            })
        );
        let reasons: Vec<_> = lost.events.iter().map(|e| e.reason).collect();
        // It never had an address: no status change, so only the port Events (one per address).
        assert_eq!(reasons, [PORT_HELD_REASON, PORT_HELD_REASON]);
        assert!(lost.events[0].message.contains("default/traefik"));
    }

    fn dns_key() -> ServiceKey {
        ServiceKey::new("default", "dns")
    }

    // Same creation second: namespace/name decides, whatever the input order.
    #[test]
    fn creation_tie_broken_by_name() {
        let nodes = Nodes::new(vec![node("a", &["10.0.0.1"], &[])]).unwrap();
        let x = svc("x", 5, &[80]);
        let y = svc("y", 5, &[80]);
        for input in [vec![x.clone(), y.clone()], vec![y.clone(), x.clone()]] {
            let out = compute(&nodes, &input).unwrap();
            assert_eq!(out[&x.key].ingress, ips(&["10.0.0.1"]));
            assert!(out[&y.key].ingress.is_empty());
        }
    }

    // Same port number, other protocol: no conflict (kube-proxy matches on the protocol).
    #[test]
    fn same_port_other_protocol_does_not_conflict() {
        let nodes = Nodes::new(vec![node("a", &["10.0.0.1"], &[])]).unwrap();
        let tcp = svc("tcp", 1, &[53]);
        let mut udp = svc("udp", 2, &[]);
        udp.ports = vec![ProtocolPort {
            protocol: Protocol::Udp,
            port: 53,
        }];
        let out = compute(&nodes, &[tcp, udp.clone()]).unwrap();
        assert_eq!(out[&udp.key].ingress, ips(&["10.0.0.1"]));
    }

    // Per address, not per node: an IPv4 and an IPv6 Service on port 80 share a dual-stack node.
    #[test]
    fn conflicts_are_per_address() {
        let nodes = Nodes::new(vec![node("a", &["10.0.0.1", "fd00::1"], &[])]).unwrap();
        let v4 = svc("v4", 1, &[80]);
        let mut v6 = svc("v6", 2, &[80]);
        v6.ip_families = vec![Family::V6];
        let mut dual = svc("dual", 3, &[80]);
        dual.ip_families = vec![Family::V4, Family::V6];
        let out = compute(&nodes, &[v4, v6.clone(), dual.clone()]).unwrap();
        assert_eq!(out[&v6.key].ingress, ips(&["fd00::1"]));
        assert!(out[&dual.key].ingress.is_empty());
        assert_eq!(
            out[&dual.key]
                .excluded
                .iter()
                .filter(|e| matches!(e.reason, Exclusion::PortHeld { .. }))
                .count(),
            2
        );
    }

    // A loser holds nothing where it lost: a third Service is judged against the holder only.
    #[test]
    fn a_lost_address_holds_none_of_the_losers_ports() {
        let nodes = Nodes::new(vec![node("a", &["10.0.0.1"], &[])]).unwrap();
        let first = svc("first", 1, &[80]);
        let second = svc("second", 2, &[80, 8080]);
        let third = svc("third", 3, &[8080]);
        let out = compute(&nodes, &[first, second, third.clone()]).unwrap();
        assert_eq!(out[&third.key].ingress, ips(&["10.0.0.1"]));
    }

    // k3s L304-L319: no Event when the status is unchanged (a migrated Service), Updated with
    // Go's `%v` lists when it changes, UnAvailable when it empties.
    #[test]
    fn events_follow_status_changes() {
        let nodes = vec![node("a", &["10.0.0.1"], &[]), node("b", &["10.0.0.2"], &[])];
        let mut s = svc("web", 0, &[80]);
        s.current_ingress = vec!["10.0.0.1".into(), "10.0.0.2".into()];
        let out = one(nodes.clone(), &s);
        assert!(!out.changed(&s.current_ingress));
        assert!(out.events.is_empty());

        s.current_ingress = vec!["10.0.0.1".into()];
        let out = one(nodes.clone(), &s);
        assert_eq!(
            out.events,
            [Event {
                event_type: EventType::Normal,
                reason: UPDATED_REASON,
                message: "Updated LoadBalancer with new IPs: [10.0.0.1] -> [10.0.0.1 10.0.0.2]"
                    .into()
            }]
        );

        let mut down = nodes;
        for n in &mut down {
            n.ready = false;
        }
        let out = one(down, &s);
        assert_eq!(
            out.events,
            [Event {
                event_type: EventType::Warning,
                reason: UNAVAILABLE_REASON,
                message: UNAVAILABLE_MESSAGE.into()
            }]
        );
    }

    // A Service that never had an address and still has none: no status change, no Event (k3s
    // L305 returns before recording anything).
    #[test]
    fn no_event_for_an_unchanged_empty_status() {
        let mut a = node("a", &["10.0.0.1"], &[]);
        a.ready = false;
        assert!(one(vec![a], &svc("web", 0, &[80])).events.is_empty());
    }

    #[test]
    fn order_of_exclusion_reasons() {
        // enablelb first, then lbpool, Ready, speaker, endpoint: the first failing rule is named.
        let mut a = labelled(node("a", &["10.0.0.1"], &[]), ENABLE_LB_LABEL, "false");
        a.ready = false;
        a.speaker_alive = false;
        let mut s = svc("web", 0, &[80]);
        s.traffic = TrafficPolicy::Local {
            ready_endpoint_nodes: BTreeSet::new(),
        };
        let out = one(vec![a], &s);
        assert!(matches!(
            reason_of(&out, "a"),
            Some(Exclusion::NotEnabled { .. })
        ));
    }

    #[test]
    fn invalid_input_is_an_error() {
        let dup = Nodes::new(vec![node("a", &[], &[]), node("a", &[], &[])]);
        assert_eq!(dup.unwrap_err(), InputError::DuplicateNode("a".into()));
        let nodes = Nodes::new(vec![node("a", &["10.0.0.1"], &[])]).unwrap();
        let s = svc("web", 0, &[80]);
        assert_eq!(
            compute(&nodes, &[s.clone(), s.clone()]).unwrap_err(),
            InputError::DuplicateService(s.key.clone())
        );
        assert!(matches!(
            compute(&nodes, &[svc("zero", 0, &[0])]).unwrap_err(),
            InputError::ZeroPort { .. }
        ));
    }

    // The incremental path: recomputing one Service against an index that already holds its own
    // ports (from the previous round) gives the same outcome.
    #[test]
    fn recompute_with_own_holdings_in_the_index() {
        let nodes = Nodes::new(vec![node("a", &["10.0.0.1"], &[])]).unwrap();
        let s = svc("web", 0, &[80]);
        let mut held = HeldPorts::new();
        let first = compute_service(&nodes, &s, &held).unwrap();
        held.hold(&s, &first.ingress);
        assert_eq!(compute_service(&nodes, &s, &held).unwrap(), first);
        held.release(&s.key);
        assert_eq!(held.iter().count(), 0);
    }

    #[test]
    fn exclusions_read_well() {
        let r = Exclusion::PortHeld {
            address: ip("10.0.0.1"),
            port: ProtocolPort::tcp(80),
            holder: ServiceKey::new("kube-system", "traefik"),
        };
        assert_eq!(
            r.to_string(),
            "TCP/80 on 10.0.0.1 is held by Service kube-system/traefik"
        );
    }
}
