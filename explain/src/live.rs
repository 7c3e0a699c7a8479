//! What the speakers and Nodes say about one Service, beyond the objects: which nodes the
//! advertisements select and which of them may attract traffic, the layer 2 owner with its MAC
//! and the takeover order, each BGP session carrying the Service with its state and the
//! attributes sent, and the diagnoses only this shows (node excluded, no speaker on a selected
//! node, a speaker cut off from the others, a peer not Established, a speaker that does not
//! answer).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use ferrolb_config::allocator::ServiceKey;
use ferrolb_config::model::{Config, Pool};
use ferrolb_config::node_address_inputs::node_addresses;
use ferrolb_config::selector::{Labels, any_matches};
use k8s_openapi::api::core::v1::Node;
use serde::Serialize;

use crate::diagnosis::{Code, Diagnosis, ObjectRef};
use crate::speaker_report::{Layer2Service, SpeakerReport};

/// The label that keeps a node out of every announcement (a Kubernetes well-known label).
pub const EXCLUDE_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// What explain reads of a Node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeFacts {
    /// Name.
    pub name: String,
    /// Labels (advertisements select nodes by them).
    pub labels: Labels,
    /// Carries [`EXCLUDE_LABEL`]: no speaker announces from it.
    pub excluded: bool,
    /// Condition `NetworkUnavailable=True`: no speaker announces from it.
    pub network_unavailable: bool,
    /// Cordoned (`spec.unschedulable`): still announces, as with MetalLB.
    pub unschedulable: bool,
    /// Condition `Ready` is not `True`.
    pub not_ready: bool,
    /// `InternalIP` addresses (node addresses, decision 0024).
    pub internal: Vec<std::net::IpAddr>,
    /// `ExternalIP` addresses.
    pub external: Vec<std::net::IpAddr>,
}

impl NodeFacts {
    /// Reads a Node; `None` without a name.
    pub fn from_node(node: &Node) -> Option<Self> {
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let conditions = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .cloned()
            .unwrap_or_default();
        let is = |t: &str, v: &str| conditions.iter().any(|c| c.type_ == t && c.status == v);
        Some(Self {
            name: node.metadata.name.clone()?,
            excluded: labels.contains_key(EXCLUDE_LABEL),
            network_unavailable: is("NetworkUnavailable", "True"),
            unschedulable: node
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false),
            not_ready: !is("Ready", "True"),
            internal: node_addresses(node, "InternalIP"),
            external: node_addresses(node, "ExternalIP"),
            labels,
        })
    }

    /// A speaker may announce from it.
    pub fn may_announce(&self) -> bool {
        !self.excluded && !self.network_unavailable
    }
}

/// One speaker: its presence, and its live report when it could be read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LiveSpeaker {
    /// Its node.
    pub node: String,
    /// Its presence Lease was renewed within its duration.
    pub live: bool,
    /// Its report, read through the API server's proxy.
    pub report: Option<SpeakerReport>,
    /// Why the report could not be read (and it was asked for).
    pub error: Option<String>,
}

/// One BGP session that carries (or should carry) the Service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Session {
    /// BGPPeer name.
    pub peer: String,
    /// Its address (or interface).
    pub address: String,
    /// FSM state, or `NotStarted`.
    pub state: String,
    /// The prefixes carrying the Service's IPs, with their attributes.
    pub routes: Vec<String>,
    /// The last error, when not Established.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// Nodes selected by the advertisements covering `pool` and selecting a Service with
/// `labels` (their `serviceSelectors`), layer 2 and BGP, by mode.
pub fn selected_nodes<'a>(
    config: &Config,
    pool: &Pool,
    labels: &Labels,
    nodes: &'a [NodeFacts],
) -> BTreeMap<&'static str, Vec<&'a NodeFacts>> {
    let mut out: BTreeMap<&'static str, Vec<&NodeFacts>> = BTreeMap::new();
    let l2: Vec<_> = config
        .l2_advertisements
        .values()
        .filter(|a| a.pools.covers(pool) && any_matches(&a.service_selectors, labels))
        .map(|a| &a.node_selectors)
        .collect();
    let bgp: Vec<_> = config
        .bgp_advertisements
        .values()
        .filter(|a| a.pools.covers(pool) && any_matches(&a.service_selectors, labels))
        .map(|a| &a.node_selectors)
        .collect();
    for (mode, selectors) in [("layer2", l2), ("bgp", bgp)] {
        if selectors.is_empty() {
            continue;
        }
        let chosen: Vec<&NodeFacts> = nodes
            .iter()
            .filter(|n| selectors.iter().any(|s| any_matches(s, &n.labels)))
            .collect();
        out.insert(mode, chosen);
    }
    out
}

/// A layer 2 Service as the speakers see it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Layer2Owner {
    /// The owner, when announced.
    pub owner: Option<String>,
    /// The nodes that may own it, in the order they would (the owner first).
    pub takeover: Vec<String>,
    /// The owner's MAC on each interface it answers on.
    pub macs: BTreeMap<String, String>,
}

/// The speakers' reports by Service, built once: what each explanation looks up.
#[derive(Default)]
pub struct LiveIndex<'a> {
    /// By `namespace/name`: each speaker's view of the layer 2 Service.
    layer2: HashMap<String, Vec<(&'a SpeakerReport, &'a Layer2Service)>>,
    /// By (node, `namespace/name`): the sessions carrying the Service from that node.
    sessions: HashMap<(String, String), Vec<Session>>,
    /// By node: its report.
    reports: HashMap<&'a str, &'a SpeakerReport>,
}

impl<'a> LiveIndex<'a> {
    /// Indexes the reports of `speakers`.
    pub fn new(speakers: &'a [LiveSpeaker]) -> Self {
        let mut index = LiveIndex::default();
        for report in speakers.iter().filter_map(|s| s.report.as_ref()) {
            index.reports.insert(report.node.as_str(), report);
            for service in &report.layer2.services {
                index
                    .layer2
                    .entry(service.service.clone())
                    .or_default()
                    .push((report, service));
            }
            for p in &report.bgp.peers {
                let mut routes: BTreeMap<&str, Vec<String>> = BTreeMap::new();
                for r in &p.routes {
                    let text = route_text(r);
                    for service in &r.services {
                        routes.entry(service).or_default().push(text.clone());
                    }
                }
                for (service, routes) in routes {
                    index
                        .sessions
                        .entry((report.node.clone(), service.to_string()))
                        .or_default()
                        .push(Session {
                            peer: p.name.clone(),
                            address: p.address.clone(),
                            state: p.state.clone(),
                            routes,
                            last_error: p
                                .not_started
                                .clone()
                                .or_else(|| p.last_error.clone())
                                .filter(|_| !p.established()),
                        });
                }
            }
        }
        index
    }

    /// The layer 2 view of a Service announced by `owner` (as its ServiceL2Status says): the
    /// takeover order and the owner's MACs, from the owner's own report, else from a report
    /// that agrees on the owner. None when no report does.
    pub fn layer2_owner(&self, key: &ServiceKey, owner: &str) -> Option<Layer2Owner> {
        let views = self.layer2.get(&key.to_string())?;
        let (_, chosen) = views
            .iter()
            .find(|(r, _)| r.node == owner)
            .filter(|(_, v)| v.owner.as_deref() == Some(owner))
            .or_else(|| {
                views
                    .iter()
                    .find(|(_, v)| v.owner.as_deref() == Some(owner))
            })?;
        let macs = self
            .reports
            .get(owner)
            .map(|r| {
                chosen
                    .interfaces
                    .iter()
                    .filter_map(|i| Some((i.clone(), r.layer2.macs.get(i)?.clone())))
                    .collect()
            })
            .unwrap_or_default();
        Some(Layer2Owner {
            owner: chosen.owner.clone(),
            takeover: chosen.takeover.clone(),
            macs,
        })
    }

    /// The BGP sessions of `node` that carry the Service, from its speaker's report.
    pub fn sessions(&self, node: &str, key: &ServiceKey) -> Vec<Session> {
        self.sessions
            .get(&(node.to_string(), key.to_string()))
            .cloned()
            .unwrap_or_default()
    }
}

/// A route as explain prints it: the prefix and the attributes sent.
fn route_text(r: &crate::speaker_report::RouteReport) -> String {
    let mut text = r.prefix.clone();
    if let Some(lp) = r.local_pref {
        text.push_str(&format!(" local-pref {lp}"));
    }
    if !r.communities.is_empty() {
        text.push_str(&format!(" communities {}", r.communities.join(" ")));
    }
    if !r.large_communities.is_empty() {
        text.push_str(&format!(
            " large-communities {}",
            r.large_communities.join(" ")
        ));
    }
    text
}

/// The Service [`diagnoses`] looks at.
pub struct Subject<'a> {
    /// Its key.
    pub key: &'a ServiceKey,
    /// The pool its addresses come from.
    pub pool: &'a Pool,
    /// Its labels (advertisements select Services by them).
    pub labels: &'a Labels,
    /// The nodes announcing it now.
    pub announced_by: &'a BTreeSet<String>,
    /// With `externalTrafficPolicy: Local`, the nodes with a ready endpoint.
    pub local_endpoints: Option<&'a BTreeSet<String>>,
}

/// What the Nodes and speakers say is wrong with announcing `subject`. Problems come back as
/// diagnoses; things worth knowing that do not stop traffic as notes.
pub fn diagnoses(
    config: &Config,
    namespace: &str,
    nodes: &[NodeFacts],
    speakers: &[LiveSpeaker],
    live_index: &LiveIndex<'_>,
    subject: &Subject<'_>,
) -> (Vec<Diagnosis>, Vec<String>) {
    let Subject {
        key,
        pool,
        labels,
        announced_by,
        local_endpoints,
    } = *subject;
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    let announced = !announced_by.is_empty();
    let live: BTreeSet<&str> = speakers
        .iter()
        .filter(|s| s.live)
        .map(|s| s.node.as_str())
        .collect();
    for (mode, selected) in selected_nodes(config, pool, labels, nodes) {
        let mode_name = if mode == "layer2" { "layer 2" } else { "BGP" };
        let usable: Vec<&NodeFacts> = selected
            .iter()
            .copied()
            .filter(|n| n.may_announce())
            .collect();
        // Excluded nodes: the cause when no selected node is left, else worth a note.
        for n in selected.iter().filter(|n| !n.may_announce()) {
            if usable.is_empty() && !announced {
                problems.push(node_excluded(n, mode_name));
            } else {
                notes.push(format!(
                    "node {} {}: it does not announce this Service ({mode_name})",
                    n.name,
                    exclusion(n).1
                ));
            }
        }
        for n in selected
            .iter()
            .filter(|n| n.unschedulable || n.not_ready)
            .filter(|n| announced_by.contains(&n.name))
        {
            notes.push(format!(
                "node {} is {} and still announces this Service ({mode_name}), as with MetalLB; label it {EXCLUDE_LABEL} to move the traffic away",
                n.name,
                if n.not_ready { "NotReady" } else { "cordoned" }
            ));
        }
        // Local policy: only nodes with a ready endpoint may announce.
        if let Some(with_endpoints) = local_endpoints
            && !announced
            && !usable.is_empty()
            && !usable.iter().any(|n| with_endpoints.contains(&n.name))
        {
            problems.push(local_without_endpoint(key, &usable, mode_name));
        }
        if !usable.is_empty() && !usable.iter().any(|n| live.contains(n.name.as_str())) {
            problems.push(no_speaker(namespace, &usable, mode_name));
        }
        if mode == "layer2" {
            problems.extend(speakers_cut_off(speakers, &usable));
        }
    }
    problems.extend(sessions_not_established(
        namespace,
        live_index,
        key,
        announced_by,
    ));
    // Speakers that are alive on a node that matters here but did not answer.
    let relevant: BTreeSet<&str> = selected_nodes(config, pool, labels, nodes)
        .values()
        .flatten()
        .filter(|n| n.may_announce())
        .map(|n| n.name.as_str())
        .collect();
    problems.extend(speakers_unreachable(speakers, &relevant));
    (problems, notes)
}

/// Why a selected node may not announce: the field that says so and what it says.
fn exclusion(n: &NodeFacts) -> (String, String) {
    if n.excluded {
        (
            format!("metadata.labels[{EXCLUDE_LABEL}]"),
            format!("carries the label {EXCLUDE_LABEL}"),
        )
    } else {
        (
            "status.conditions[NetworkUnavailable]".to_string(),
            "has the condition NetworkUnavailable=True".to_string(),
        )
    }
}

/// The advertisements of one mode select only nodes that may not announce, such as `n`.
fn node_excluded(n: &NodeFacts, mode_name: &str) -> Diagnosis {
    let (field, what) = exclusion(n);
    Diagnosis {
        code: Code::NodeExcluded,
        object: ObjectRef::node(&n.name),
        field: Some(field),
        problem: format!(
            "{what}, so no speaker announces from it, and it is the only kind of node the {mode_name} advertisements select"
        ),
        fix: if n.excluded {
            format!(
                "remove the label (kubectl label node {} {EXCLUDE_LABEL}-) or select other nodes in the advertisement's nodeSelectors",
                n.name
            )
        } else {
            "fix the node's network (its CNI sets NetworkUnavailable) or select other nodes".into()
        },
    }
}

/// `externalTrafficPolicy: Local` and none of the `usable` nodes has a ready endpoint.
fn local_without_endpoint(key: &ServiceKey, usable: &[&NodeFacts], mode_name: &str) -> Diagnosis {
    let names: Vec<&str> = usable.iter().map(|n| n.name.as_str()).collect();
    Diagnosis {
        code: Code::LocalWithoutEndpoint,
        object: ObjectRef::namespaced("Service", key.namespace(), key.name()),
        field: Some("spec.externalTrafficPolicy".into()),
        problem: format!(
            "externalTrafficPolicy: Local, and none of the nodes the {mode_name} advertisements select ({}) has a ready endpoint: no node may announce it",
            names.join(", ")
        ),
        fix: "run the Service's pods on a selected node, select the nodes they run on, or use externalTrafficPolicy: Cluster".into(),
    }
}

/// No live speaker on any of the `usable` nodes.
fn no_speaker(namespace: &str, usable: &[&NodeFacts], mode_name: &str) -> Diagnosis {
    let names: Vec<&str> = usable.iter().map(|n| n.name.as_str()).collect();
    Diagnosis {
        code: Code::NoSpeaker,
        object: ObjectRef::namespaced("DaemonSet", namespace, "speaker"),
        field: None,
        problem: format!(
            "no speaker runs on a node the {mode_name} advertisements select ({})",
            names.join(", ")
        ),
        fix: "check the speaker DaemonSet's nodeSelector, tolerations and pods on those nodes (kubectl get pods -o wide), or select nodes that run a speaker".into(),
    }
}

/// Live speakers on `usable` nodes that have no layer 2 quorum, so own no layer 2 IP.
fn speakers_cut_off<'a>(
    speakers: &'a [LiveSpeaker],
    usable: &'a [&NodeFacts],
) -> impl Iterator<Item = Diagnosis> + 'a {
    speakers
        .iter()
        .filter(|s| s.live && usable.iter().any(|n| n.name == s.node))
        .filter_map(|s| {
            let r = s.report.as_ref()?;
            (r.planned && !r.layer2.quorum).then(|| Diagnosis {
                code: Code::SpeakerCutOff,
                object: ObjectRef::node(&s.node),
                field: None,
                problem: format!(
                    "the speaker on {} is cut off from the others: it hears {} of {} speakers, not a majority that also hears it, so it owns no layer 2 IP",
                    s.node, r.layer2.speakers_heard, r.layer2.speakers_known
                ),
                fix: "check that UDP port 7946 (the heartbeats) is open between the nodes both ways, and the node's network".into(),
            })
        })
}

/// BGP sessions that should carry the Service from the announcing nodes and are not
/// Established.
fn sessions_not_established(
    namespace: &str,
    live_index: &LiveIndex<'_>,
    key: &ServiceKey,
    announced_by: &BTreeSet<String>,
) -> Vec<Diagnosis> {
    let mut problems = Vec::new();
    for node in announced_by {
        for s in live_index
            .sessions(node, key)
            .into_iter()
            .filter(|s| s.state != "Established")
        {
            problems.push(Diagnosis {
                code: Code::PeerNotEstablished,
                object: ObjectRef::namespaced("BGPPeer", namespace, &s.peer),
                field: None,
                problem: format!(
                    "the session from {node} to {} is {}{}: the router does not get this Service's route from {node}",
                    s.address,
                    s.state,
                    s.last_error
                        .as_deref()
                        .map(|e| format!(" ({e})"))
                        .unwrap_or_default()
                ),
                fix: "check the peer's address, ASNs, password and that TCP port 179 is open both ways (the router's log says why it refuses)".into(),
            });
        }
    }
    problems
}

/// Live speakers on `relevant` nodes whose report could not be read.
fn speakers_unreachable<'a>(
    speakers: &'a [LiveSpeaker],
    relevant: &'a BTreeSet<&str>,
) -> impl Iterator<Item = Diagnosis> + 'a {
    speakers
        .iter()
        .filter(|s| s.live && relevant.contains(s.node.as_str()))
        .filter_map(|s| {
            let e = s.error.as_ref()?;
            Some(Diagnosis {
                code: Code::SpeakerUnreachable,
                object: ObjectRef::node(&s.node),
                field: None,
                problem: format!("the speaker on {} does not answer: {e}", s.node),
                fix: "check the speaker pod on that node (kubectl logs, kubectl describe pod): a speaker that renews its Lease but does not answer may be stuck".into(),
            })
        })
}
