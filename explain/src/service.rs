//! The whole path of one LoadBalancer Service, from a [`Snapshot`] of the cluster: the pool and
//! rule behind its IPs, who announces them (layer 2 owner with its interfaces, BGP nodes with
//! their peers), the advertisements covering its pool, where its ready endpoints are, and
//! kube-proxy's chains for each port; with what is wrong and what to do.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use ferrolb_config::allocator::ServiceKey;
use ferrolb_config::crd::{ServiceBGPStatus, ServiceL2Status};
use ferrolb_config::model::Config;
use ferrolb_config::selector::Labels;
use ferrolb_config::validate::ConfigError;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde::Serialize;

use crate::allocation::{self, Allocation, ServiceInput};
use crate::diagnosis::{Code, Diagnosis, ObjectRef};
use crate::kube_proxy::{self, Protocol, ServicePort};
use crate::live::{self, LiveSpeaker, NodeFacts, Session};

/// The version of the JSON document `explain` prints; a change that is not an addition bumps it.
pub const SCHEMA: &str = "explain.ferrolb.io/v1alpha1";

/// What the explanation reads: the cluster's objects, as listed by the CLI.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// The namespace of ferrolb's configuration objects (MetalLB's `metallb-system`).
    pub namespace: String,
    /// The validated configuration.
    pub config: Config,
    /// Every Service of the cluster.
    pub services: Vec<Service>,
    /// Namespace labels, by namespace.
    pub namespaces: BTreeMap<String, Labels>,
    /// Every EndpointSlice.
    pub slices: Vec<EndpointSlice>,
    /// The speakers' ServiceL2Status objects.
    pub l2_statuses: Vec<ServiceL2Status>,
    /// The speakers' ServiceBGPStatus objects.
    pub bgp_statuses: Vec<ServiceBGPStatus>,
    /// The LoadBalancer class ferrolb serves (none: Services without a class).
    pub lb_class: Option<String>,
    /// Why configuration objects were left out of `config`.
    pub config_errors: Vec<ConfigError>,
    /// The Nodes.
    pub nodes: Vec<NodeFacts>,
    /// The speakers (from their presence Leases) with their live reports.
    pub speakers: Vec<LiveSpeaker>,
    /// Why no speaker's live report was read at all (e.g. RBAC), if so.
    pub live_unavailable: Option<String>,
    /// The speakers' presence Leases could not be read: which speakers run is not known, so
    /// no problem is inferred from their absence.
    pub speakers_unknown: bool,
}

/// Who announces the Service's IPs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Announcement {
    /// `layer2` or `bgp`.
    pub mode: &'static str,
    /// The announcing node.
    pub node: String,
    /// Layer 2: the interfaces it answers ARP/NDP on.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<String>,
    /// BGP: the BGPPeers it advertises to.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<String>,
    /// Layer 2, from the speakers: the MAC of each interface it answers on (what clients
    /// learn for the IP).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub macs: BTreeMap<String, String>,
    /// Layer 2, from the speakers: the nodes that may own the IPs in the order they would,
    /// the owner first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub takeover: Vec<String>,
    /// BGP, from the node's speaker: each session carrying the Service, with its state and
    /// the routes and attributes sent.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sessions: Vec<Session>,
}

/// Where traffic goes once it reaches a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Traffic {
    /// `Cluster` (any node forwards) or `Local` (only nodes with a ready endpoint).
    pub external_traffic_policy: String,
    /// Ready endpoints by node.
    pub ready_endpoints: BTreeMap<String, usize>,
}

/// kube-proxy's chains for one Service port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PortChains {
    /// The port's name (may be empty).
    pub name: String,
    /// Port number.
    pub port: u16,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// iptables mode: KUBE-SERVICES → KUBE-EXT-… → KUBE-SVC-… (or KUBE-SVL-…) → KUBE-SEP-….
    pub iptables: IptablesChains,
    /// nftables mode (tables `ip kube-proxy` and `ip6 kube-proxy`).
    pub nftables: NftablesChains,
}

/// The iptables-mode chains of a port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct IptablesChains {
    /// The external chain the LoadBalancer IP's rule in KUBE-SERVICES jumps to.
    pub external: String,
    /// The cluster-policy chain (every endpoint).
    pub service: String,
    /// The local-policy chain (this node's endpoints), used with `externalTrafficPolicy: Local`.
    pub local: String,
    /// One chain per endpoint: the DNAT to the pod.
    pub endpoints: Vec<EndpointChain>,
}

/// The nftables-mode chains of a port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NftablesChains {
    /// The external chain.
    pub external: String,
    /// The service chain.
    pub service: String,
    /// The local chain.
    pub local: String,
}

/// An endpoint of a port and its iptables chain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EndpointChain {
    /// `ip:port` of the pod.
    pub endpoint: String,
    /// Its node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Its pod (the endpoint's `targetRef`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The chain.
    pub chain: String,
    /// Its share of the new connections kube-proxy sends on, as a fraction (`1/2`): kube-proxy
    /// spreads them evenly over the ready endpoints of the IP's family, and with
    /// `externalTrafficPolicy: Local` over those on the node the traffic enters.
    pub weight: String,
}

/// The explanation of one Service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ServiceReport {
    /// [`SCHEMA`].
    pub schema: &'static str,
    /// `namespace/name`.
    pub service: String,
    /// The pool, the rule, sharing.
    pub allocation: Allocation,
    /// The advertisements covering the Service's pool (`L2Advertisement x`, `BGPAdvertisement y`).
    pub advertisements: Vec<String>,
    /// Who announces the IPs now.
    pub announcements: Vec<Announcement>,
    /// Traffic policy and endpoints.
    pub traffic: Traffic,
    /// kube-proxy's chains, per port.
    pub kube_proxy: Vec<PortChains>,
    /// Everything found wrong (allocation's included), most basic first.
    pub diagnoses: Vec<Diagnosis>,
    /// Things worth knowing that are not faults.
    pub notes: Vec<String>,
    /// Served by node addresses (decision 0024): which nodes are listed, and why others not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_addresses: Option<crate::node_addresses::NodeAddressReport>,
}

/// The key of the Service holding `ip` in its status, if one does.
pub fn service_of_ip(snapshot: &Snapshot, ip: IpAddr) -> Option<ServiceKey> {
    snapshot
        .services
        .iter()
        .filter(|s| {
            ferrolb_config::allocator::is_ours(s, snapshot.lb_class.as_deref())
                || crate::node_addresses::served(s)
        })
        .find_map(|s| {
            allocation::status_ips(s)
                .contains(&ip)
                .then(|| {
                    Some(ServiceKey::new(
                        s.metadata.namespace.as_deref()?,
                        s.metadata.name.as_deref()?,
                    ))
                })
                .flatten()
        })
}

/// Explains Service `key`.
pub fn explain(snapshot: &Snapshot, key: &ServiceKey) -> ServiceReport {
    Explainer::new(snapshot).explain(key)
}

/// Namespace labels of a namespace that is not listed.
static NO_LABELS: Labels = Labels::new();

/// Explains any number of Services of one snapshot, replaying the allocator once for all of
/// them (`status` explains every Service).
pub struct Explainer<'a> {
    snapshot: &'a Snapshot,
    inputs: Vec<ServiceInput<'a>>,
    pools: Vec<ferrolb_config::model::Pool>,
    replay: allocation::Replay,
    index: Index<'a>,
}

/// The snapshot's objects by the Service they belong to, built once so that each explanation
/// looks its Service's objects up instead of scanning them all.
#[derive(Default)]
struct Index<'a> {
    /// Services of ours, into `Explainer::inputs`.
    services: HashMap<ServiceKey, usize>,
    /// EndpointSlices, by their `kubernetes.io/service-name` label.
    slices: HashMap<ServiceKey, Vec<&'a EndpointSlice>>,
    /// ServiceL2Status objects, by the Service they report on.
    l2: HashMap<ServiceKey, Vec<&'a ServiceL2Status>>,
    /// ServiceBGPStatus objects, by the Service they report on.
    bgp: HashMap<ServiceKey, Vec<&'a ServiceBGPStatus>>,
    /// The speakers' reports.
    live: live::LiveIndex<'a>,
}

impl<'a> Index<'a> {
    fn new(snapshot: &'a Snapshot, ours: &[&'a Service]) -> Self {
        let mut index = Index {
            live: live::LiveIndex::new(&snapshot.speakers),
            ..Index::default()
        };
        for (i, s) in ours.iter().enumerate() {
            if let (Some(ns), Some(name)) = (&s.metadata.namespace, &s.metadata.name) {
                index
                    .services
                    .insert(ServiceKey::new(ns.as_str(), name.as_str()), i);
            }
        }
        for slice in &snapshot.slices {
            let service = slice
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("kubernetes.io/service-name"));
            if let (Some(ns), Some(name)) = (&slice.metadata.namespace, service) {
                index
                    .slices
                    .entry(ServiceKey::new(ns.as_str(), name.as_str()))
                    .or_default()
                    .push(slice);
            }
        }
        for status in &snapshot.l2_statuses {
            if let Some(st) = &status.status {
                index
                    .l2
                    .entry(ServiceKey::new(
                        st.service_namespace.as_str(),
                        st.service_name.as_str(),
                    ))
                    .or_default()
                    .push(status);
            }
        }
        for status in &snapshot.bgp_statuses {
            if let Some(st) = &status.status {
                index
                    .bgp
                    .entry(ServiceKey::new(
                        st.service_namespace.as_str(),
                        st.service_name.as_str(),
                    ))
                    .or_default()
                    .push(status);
            }
        }
        index
    }

    /// The Service's EndpointSlices.
    fn slices_of(&self, key: &ServiceKey) -> impl Iterator<Item = &'a EndpointSlice> + '_ {
        self.slices.get(key).into_iter().flatten().copied()
    }
}

impl<'a> Explainer<'a> {
    /// Replays the allocator over the snapshot's Services.
    pub fn new(snapshot: &'a Snapshot) -> Self {
        let ours: Vec<&Service> = snapshot
            .services
            .iter()
            .filter(|s| ferrolb_config::allocator::is_ours(s, snapshot.lb_class.as_deref()))
            .collect();
        let inputs: Vec<ServiceInput<'a>> = ours
            .iter()
            .map(|service| ServiceInput {
                service,
                namespace_labels: service
                    .metadata
                    .namespace
                    .as_ref()
                    .and_then(|ns| snapshot.namespaces.get(ns))
                    .unwrap_or(&NO_LABELS),
            })
            .collect();
        let pools: Vec<_> = snapshot.config.pools.values().cloned().collect();
        let replay = allocation::Replay::new(&pools, &inputs);
        let index = Index::new(snapshot, &ours);
        Self {
            snapshot,
            inputs,
            pools,
            replay,
            index,
        }
    }

    /// Explains Service `key`.
    pub fn explain(&mut self, key: &ServiceKey) -> ServiceReport {
        if let Some(service) = self.snapshot.services.iter().find(|s| {
            s.metadata.namespace.as_deref() == Some(key.namespace())
                && s.metadata.name.as_deref() == Some(key.name())
                && crate::node_addresses::served(s)
        }) {
            return self.explain_node_addresses(key, service);
        }
        let input = self.index.services.get(key).map(|&i| &self.inputs[i]);
        let ips = input
            .map(|i| allocation::status_ips(i.service))
            .unwrap_or_default();
        let allocation = if self.replay.disputed(key, &ips) {
            allocation::explain(&self.pools, &self.snapshot.namespace, &self.inputs, key)
        } else {
            self.replay
                .explain(&self.pools, &self.snapshot.namespace, input, key)
        };
        explain_allocated(
            self.snapshot,
            &self.index,
            key,
            input.map(|i| i.service),
            allocation,
        )
    }
}

impl Explainer<'_> {
    /// A Service served by node addresses: no pool, no advertisement, no announcement (the
    /// nodes answer for their own addresses); which nodes are listed and why the others not.
    fn explain_node_addresses(&self, key: &ServiceKey, service: &Service) -> ServiceReport {
        let (report, diagnoses) = crate::node_addresses::explain(self.snapshot, service);
        let allocation = Allocation {
            ips: allocation::status_ips(service),
            pool: None,
            rule: None,
            sharing_key: None,
            shared_with: Vec::new(),
            diagnoses,
        };
        let mut r = explain_allocated(self.snapshot, &self.index, key, Some(service), allocation);
        r.notes.insert(
            0,
            "served by node addresses (k3s ServiceLB's rules, decision 0024): each listed node receives the traffic for its own address, and kube-proxy there forwards it; nothing is announced".into(),
        );
        r.node_addresses = Some(report);
        r
    }
}

/// The rest of the explanation, once the allocation is known.
fn explain_allocated(
    snapshot: &Snapshot,
    index: &Index<'_>,
    key: &ServiceKey,
    service: Option<&Service>,
    allocation: Allocation,
) -> ServiceReport {
    let labels = service
        .and_then(|s| s.metadata.labels.as_ref())
        .unwrap_or(&NO_LABELS);
    let pool = allocation
        .pool
        .as_deref()
        .and_then(|p| snapshot.config.pools.get(p));
    // A left-out object may be the very pool or advertisement a Service without an address
    // needs: then it is a problem, said first. For a Service that is served it is a note.
    let mut notes = Vec::new();
    let mut diagnoses = Vec::new();
    if allocation.ips.is_empty() || !allocation.diagnoses.is_empty() {
        diagnoses.extend(config_diagnoses(snapshot));
    } else {
        notes.extend(
            config_diagnoses(snapshot)
                .iter()
                .map(|d| format!("configuration: {d}")),
        );
    }
    diagnoses.extend(allocation.diagnoses.iter().cloned());
    let advertisements = pool
        .map(|pool| covering(&snapshot.config, pool, Some(labels)))
        .unwrap_or_default();
    if let Some(name) = &allocation.pool {
        diagnoses.extend(unadvertised(snapshot, key, name, pool, &advertisements));
    }
    let mut announcements = announcements(index, key);
    live_details(&index.live, key, &mut announcements);
    let traffic = traffic(index, key, service);
    let mut specific = false;
    if let Some(pool) = pool.filter(|_| !allocation.ips.is_empty()) {
        let (problems, live_notes) =
            live_diagnoses(snapshot, index, key, pool, labels, &announcements, &traffic);
        specific = problems.iter().any(|d| {
            matches!(
                d.code,
                Code::NodeExcluded | Code::NoSpeaker | Code::LocalWithoutEndpoint
            )
        });
        diagnoses.extend(problems);
        notes.extend(live_notes);
    }
    if let Some(why) = &snapshot.live_unavailable {
        notes.push(format!("the speakers' live reports were not read: {why}"));
    }
    // Said only when no more specific cause was found.
    if !allocation.ips.is_empty()
        && !advertisements.is_empty()
        && announcements.is_empty()
        && !specific
    {
        diagnoses.push(Diagnosis {
            code: Code::NotAnnounced,
            object: ObjectRef::namespaced("Service", key.namespace(), key.name()),
            field: None,
            problem: "no speaker announces this Service (no ServiceL2Status or ServiceBGPStatus for it)".into(),
            fix: "check that a speaker runs on the nodes the advertisements select (kubectl get pods -o wide), that those nodes are not excluded (node.kubernetes.io/exclude-from-external-load-balancers, NotReady), and with externalTrafficPolicy: Local that a ready endpoint is on one of them".into(),
        });
    }
    diagnoses.extend(owners_without_endpoint(key, &traffic, &announcements));
    if !allocation.ips.is_empty() {
        notes.push("kube-proxy forwards only the Service's ports: ping to the IP gets no answer, test with the port (e.g. curl or nc)".into());
    }
    let kube_proxy = service
        .map(|s| port_chains(index, key, s))
        .unwrap_or_default();
    ServiceReport {
        schema: SCHEMA,
        service: key.to_string(),
        allocation,
        advertisements,
        announcements,
        traffic,
        kube_proxy,
        diagnoses,
        notes,
        node_addresses: None,
    }
}

/// Pool `pool_name` (`pool` if it is in the configuration) gave the Service its IPs, but no
/// `advertisements` announce them: those covering the pool select other Services, or none
/// covers it.
fn unadvertised(
    snapshot: &Snapshot,
    key: &ServiceKey,
    pool_name: &str,
    pool: Option<&ferrolb_config::model::Pool>,
    advertisements: &[String],
) -> Option<Diagnosis> {
    if !advertisements.is_empty() {
        return None;
    }
    let pool_advertisements = pool
        .map(|pool| covering(&snapshot.config, pool, None))
        .unwrap_or_default();
    Some(if !pool_advertisements.is_empty() {
        Diagnosis {
            code: Code::NoAdvertisement,
            object: ObjectRef::namespaced("Service", key.namespace(), key.name()),
            field: Some("metadata.labels".into()),
            problem: format!(
                "the advertisements covering pool {pool_name} ({}) select other Services by their serviceSelectors: this one's IPs are allocated but never announced",
                pool_advertisements.join(", ")
            ),
            fix: "label the Service to match an advertisement's serviceSelectors, or add an advertisement that selects it".into(),
        }
    } else {
        Diagnosis {
            code: Code::NoAdvertisement,
            object: ObjectRef::namespaced("IPAddressPool", &snapshot.namespace, pool_name),
            field: None,
            problem: "no L2Advertisement or BGPAdvertisement covers this pool: its IPs are allocated but never announced".into(),
            fix: format!("create an L2Advertisement or BGPAdvertisement in {} whose ipAddressPools (or ipAddressPoolSelectors) include {pool_name}", snapshot.namespace),
        }
    })
}

/// What the Nodes and the speakers' reports say about announcing the Service (see
/// [`live::diagnoses`]). A missing speaker is not inferred when the speakers are unknown.
fn live_diagnoses(
    snapshot: &Snapshot,
    index: &Index<'_>,
    key: &ServiceKey,
    pool: &ferrolb_config::model::Pool,
    labels: &Labels,
    announcements: &[Announcement],
    traffic: &Traffic,
) -> (Vec<Diagnosis>, Vec<String>) {
    let local_endpoints: Option<BTreeSet<String>> = (traffic.external_traffic_policy == "Local")
        .then(|| {
            traffic
                .ready_endpoints
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(node, _)| node.clone())
                .collect()
        });
    let announced_by: BTreeSet<String> = announcements.iter().map(|a| a.node.clone()).collect();
    let (problems, notes) = live::diagnoses(
        &snapshot.config,
        &snapshot.namespace,
        &snapshot.nodes,
        &snapshot.speakers,
        &index.live,
        &live::Subject {
            key,
            pool,
            labels,
            announced_by: &announced_by,
            local_endpoints: local_endpoints.as_ref(),
        },
    );
    let problems = problems
        .into_iter()
        .filter(|d| !(snapshot.speakers_unknown && d.code == Code::NoSpeaker))
        .collect();
    (problems, notes)
}

/// With `externalTrafficPolicy: Local`, each layer 2 owner without a ready endpoint: kube-proxy
/// drops the traffic there.
fn owners_without_endpoint<'a>(
    key: &'a ServiceKey,
    traffic: &'a Traffic,
    announcements: &'a [Announcement],
) -> impl Iterator<Item = Diagnosis> + 'a {
    announcements
        .iter()
        .filter(move |a| {
            traffic.external_traffic_policy == "Local"
                && a.mode == "layer2"
                && traffic.ready_endpoints.get(&a.node).copied().unwrap_or(0) == 0
        })
        .map(|a| Diagnosis {
            code: Code::LocalWithoutEndpoint,
            object: ObjectRef::namespaced("Service", key.namespace(), key.name()),
            field: Some("spec.externalTrafficPolicy".into()),
            problem: format!("externalTrafficPolicy: Local, and the owner node {} has no ready endpoint: kube-proxy drops the traffic there", a.node),
            fix: "wait for the speaker to move the IP to a node with a ready endpoint, or use externalTrafficPolicy: Cluster".into(),
        })
}

/// The advertisements covering `pool` (and, given a Service's `labels`, selecting it by their
/// `serviceSelectors`): `L2Advertisement name`, then `BGPAdvertisement name`.
pub fn covering(
    config: &Config,
    pool: &ferrolb_config::model::Pool,
    labels: Option<&Labels>,
) -> Vec<String> {
    let selects = |selectors: &[ferrolb_config::selector::Selector]| {
        labels.is_none_or(|l| ferrolb_config::selector::any_matches(selectors, l))
    };
    let l2 = config
        .l2_advertisements
        .values()
        .filter(|a| a.pools.covers(pool) && selects(&a.service_selectors))
        .map(|a| format!("L2Advertisement {}", a.name));
    let bgp = config
        .bgp_advertisements
        .values()
        .filter(|a| a.pools.covers(pool) && selects(&a.service_selectors))
        .map(|a| format!("BGPAdvertisement {}", a.name));
    l2.chain(bgp).collect()
}

/// The closing lines of a report: "No problem found." or each problem.
pub fn render_problems(t: &mut String, diagnoses: &[Diagnosis]) {
    if diagnoses.is_empty() {
        let _ = writeln!(t, "No problem found.");
    } else {
        let _ = writeln!(t, "Problems:");
        for d in diagnoses {
            let _ = writeln!(t, "  - {d}");
        }
    }
}

/// The configuration objects left out, as diagnoses.
pub fn config_diagnoses(snapshot: &Snapshot) -> Vec<Diagnosis> {
    snapshot
        .config_errors
        .iter()
        .map(|e| Diagnosis {
            code: Code::ConfigLeftOut,
            object: ObjectRef::namespaced(
                &e.object.kind.to_string(),
                &e.object.namespace,
                &e.object.name,
            ),
            field: Some(e.field.clone()),
            problem: format!("{}; the object is left out of the configuration", e.message),
            fix: "correct the field (kubectl get configurationstate -A shows the same)".into(),
        })
        .collect()
}

fn announcements(index: &Index<'_>, key: &ServiceKey) -> Vec<Announcement> {
    let mut out = Vec::new();
    for s in index.l2.get(key).into_iter().flatten() {
        let Some(st) = &s.status else { continue };
        {
            out.push(Announcement {
                mode: "layer2",
                node: st.node.clone(),
                interfaces: st.interfaces.iter().map(|i| i.name.clone()).collect(),
                peers: Vec::new(),
                macs: BTreeMap::new(),
                takeover: Vec::new(),
                sessions: Vec::new(),
            });
        }
    }
    for s in index.bgp.get(key).into_iter().flatten() {
        let Some(st) = &s.status else { continue };
        {
            out.push(Announcement {
                mode: "bgp",
                node: st.node.clone(),
                interfaces: Vec::new(),
                peers: st.peers.clone(),
                macs: BTreeMap::new(),
                takeover: Vec::new(),
                sessions: Vec::new(),
            });
        }
    }
    out.sort_by(|a, b| (a.mode, &a.node).cmp(&(b.mode, &b.node)));
    out
}

/// Adds what the speakers report to the announcements the status objects show: the layer 2
/// owner's MACs and the takeover order, each BGP node's sessions.
fn live_details(live: &live::LiveIndex<'_>, key: &ServiceKey, announcements: &mut [Announcement]) {
    for a in announcements.iter_mut() {
        match a.mode {
            "layer2" => {
                if let Some(o) = live.layer2_owner(key, &a.node) {
                    a.takeover = o.takeover;
                    a.macs = o.macs;
                }
            }
            _ => a.sessions = live.sessions(&a.node, key),
        }
    }
}

fn ready(e: &k8s_openapi::api::discovery::v1::Endpoint) -> bool {
    e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true)
}

fn traffic(index: &Index<'_>, key: &ServiceKey, service: Option<&Service>) -> Traffic {
    let policy = service
        .and_then(|s| s.spec.as_ref())
        .and_then(|s| s.external_traffic_policy.clone())
        .unwrap_or_else(|| "Cluster".into());
    // A dual-stack pod is in one slice per family: count pods (their targetRef), not entries.
    let mut pods: BTreeSet<(String, String)> = BTreeSet::new();
    for slice in index.slices_of(key) {
        for e in slice.endpoints.iter().filter(|e| ready(e)) {
            let node = e.node_name.clone().unwrap_or_else(|| "?".into());
            let pod = e
                .target_ref
                .as_ref()
                .and_then(|t| t.name.clone())
                .or_else(|| e.addresses.first().cloned())
                .unwrap_or_default();
            pods.insert((node, pod));
        }
    }
    let mut ready_endpoints: BTreeMap<String, usize> = BTreeMap::new();
    for (node, _) in pods {
        *ready_endpoints.entry(node).or_default() += 1;
    }
    Traffic {
        external_traffic_policy: policy,
        ready_endpoints,
    }
}

fn port_chains(index: &Index<'_>, key: &ServiceKey, service: &Service) -> Vec<PortChains> {
    let local_policy = service
        .spec
        .as_ref()
        .and_then(|s| s.external_traffic_policy.as_deref())
        == Some("Local");
    let mut out = Vec::new();
    for p in service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
    {
        let protocol_text = p.protocol.clone().unwrap_or_else(|| "TCP".into());
        let Ok(protocol) = protocol_text.parse::<Protocol>() else {
            continue;
        };
        let name = p.name.clone().unwrap_or_default();
        let sp = ServicePort::new(key.namespace(), key.name(), &name, protocol);
        // Endpoints of this port: the slices' port with the same name and protocol.
        let mut endpoints = BTreeSet::new();
        let mut pods: BTreeMap<SocketAddr, String> = BTreeMap::new();
        for slice in index.slices_of(key) {
            let port = slice.ports.iter().flatten().find(|sp| {
                sp.name.clone().unwrap_or_default() == name
                    && sp.protocol.clone().unwrap_or_else(|| "TCP".into()) == protocol_text
            });
            let Some(port) = port
                .and_then(|p| p.port)
                .and_then(|p| u16::try_from(p).ok())
            else {
                continue;
            };
            for e in slice.endpoints.iter().filter(|e| ready(e)) {
                let pod = e
                    .target_ref
                    .as_ref()
                    .filter(|t| t.kind.as_deref() == Some("Pod"))
                    .and_then(|t| t.name.clone());
                for a in &e.addresses {
                    if let Ok(ip) = a.parse::<IpAddr>() {
                        endpoints.insert((SocketAddr::new(ip, port), e.node_name.clone()));
                        if let Some(pod) = &pod {
                            pods.insert(SocketAddr::new(ip, port), pod.clone());
                        }
                    }
                }
            }
        }
        out.push(PortChains {
            name: name.clone(),
            port: u16::try_from(p.port).unwrap_or(0),
            protocol: protocol_text.clone(),
            iptables: IptablesChains {
                external: kube_proxy::iptables::external_chain(&sp),
                service: kube_proxy::iptables::service_chain(&sp),
                local: kube_proxy::iptables::local_chain(&sp),
                endpoints: endpoints
                    .iter()
                    .map(|(addr, node)| {
                        // The endpoints sharing the traffic with this one: the same family and,
                        // under Local policy, the same node.
                        let peers = endpoints
                            .iter()
                            .filter(|(a, n)| {
                                a.is_ipv4() == addr.is_ipv4() && (!local_policy || n == node)
                            })
                            .count();
                        EndpointChain {
                            endpoint: addr.to_string(),
                            node: node.clone(),
                            pod: pods.get(addr).cloned(),
                            chain: kube_proxy::iptables::endpoint_chain(&sp, *addr),
                            weight: format!("1/{}", peers.max(1)),
                        }
                    })
                    .collect(),
            },
            nftables: NftablesChains {
                external: kube_proxy::nftables::external_chain(&sp),
                service: kube_proxy::nftables::service_chain(&sp),
                local: kube_proxy::nftables::local_chain(&sp),
            },
        });
    }
    out
}

/// The report as text, step by step.
pub fn render_text(r: &ServiceReport) -> String {
    let mut t = String::new();
    let _ = writeln!(t, "Service {}", r.service);
    if let Some(na) = &r.node_addresses {
        write_node_addresses(&mut t, r, na);
    } else {
        write_allocation(&mut t, r);
        let _ = writeln!(
            t,
            "2. Advertised:   {}",
            if r.advertisements.is_empty() {
                "nothing".to_string()
            } else {
                r.advertisements.join(", ")
            }
        );
        write_announcements(&mut t, r);
    }
    write_traffic(&mut t, r);
    write_kube_proxy(&mut t, r);
    render_problems(&mut t, &r.diagnoses);
    for n in &r.notes {
        let _ = writeln!(t, "Note: {n}");
    }
    t
}

/// Steps 1 to 3 of a Service served by node addresses: the nodes listed and why the others not.
fn write_node_addresses(
    t: &mut String,
    r: &ServiceReport,
    na: &crate::node_addresses::NodeAddressReport,
) {
    let ips: Vec<String> = r.allocation.ips.iter().map(IpAddr::to_string).collect();
    let _ = writeln!(
        t,
        "  IPs:            {}",
        if ips.is_empty() {
            "none".to_string()
        } else {
            ips.join(", ")
        }
    );
    let _ = writeln!(
        t,
        "1. Node addresses: {} of the nodes that can serve it (k3s ServiceLB's rules)",
        na.kind.unwrap_or("none")
    );
    for (node, addresses) in &na.listed {
        let list: Vec<String> = addresses.iter().map(IpAddr::to_string).collect();
        let _ = writeln!(t, "   {node}: listed, {}", list.join(", "));
    }
    for (node, why) in &na.excluded {
        let _ = writeln!(t, "   {node}: not listed: {why}");
    }
    let _ = writeln!(
        t,
        "2. Advertised:   not needed (each node answers for its own address)"
    );
    let _ = writeln!(
        t,
        "3. Announced:    by each listed node, for its own address"
    );
}

/// The IPs and step 1: the pool, the rule that chose it, sharing.
fn write_allocation(t: &mut String, r: &ServiceReport) {
    let a = &r.allocation;
    let ips: Vec<String> = a.ips.iter().map(IpAddr::to_string).collect();
    let _ = writeln!(
        t,
        "  IPs:            {}",
        if ips.is_empty() {
            "none".to_string()
        } else {
            ips.join(", ")
        }
    );
    match (&a.pool, &a.rule) {
        (Some(pool), Some(rule)) => {
            let _ = writeln!(t, "1. Pool:         {pool}, because {}", rule.describe());
        }
        _ => {
            let _ = writeln!(t, "1. Pool:         none");
        }
    }
    if let Some(k) = &a.sharing_key {
        let _ = writeln!(
            t,
            "   Sharing key:  {k}{}",
            if a.shared_with.is_empty() {
                String::new()
            } else {
                format!(" (shared with {})", a.shared_with.join(", "))
            }
        );
    }
}

/// Step 3: who announces the IPs, with layer 2 interfaces and takeover order or BGP sessions.
fn write_announcements(t: &mut String, r: &ServiceReport) {
    if r.announcements.is_empty() {
        let _ = writeln!(t, "3. Announced:    by no node");
    }
    for (i, an) in r.announcements.iter().enumerate() {
        let lead = if i == 0 {
            "3. Announced:   "
        } else {
            "                "
        };
        match an.mode {
            "layer2" => {
                let interfaces: Vec<String> = an
                    .interfaces
                    .iter()
                    .map(|i| match an.macs.get(i) {
                        Some(mac) => format!("{i} (MAC {mac})"),
                        None => i.clone(),
                    })
                    .collect();
                let _ = writeln!(
                    t,
                    "{lead} layer 2 by {} on {} (answers ARP/NDP)",
                    an.node,
                    interfaces.join(", ")
                );
                if an.takeover.len() > 1 {
                    let _ = writeln!(
                        t,
                        "                   takeover order: {}",
                        an.takeover[1..].join(", ")
                    );
                }
            }
            _ => {
                let _ = writeln!(t, "{lead} BGP by {} to {}", an.node, an.peers.join(", "));
                for s in &an.sessions {
                    let _ = writeln!(
                        t,
                        "                   {} {} {}: {}",
                        s.peer,
                        s.address,
                        s.state,
                        s.routes.join("; ")
                    );
                }
            }
        }
    }
}

/// Step 4: traffic policy and ready endpoints.
fn write_traffic(t: &mut String, r: &ServiceReport) {
    let eps: Vec<String> = r
        .traffic
        .ready_endpoints
        .iter()
        .map(|(n, c)| format!("{n}: {c}"))
        .collect();
    let _ = writeln!(
        t,
        "4. Traffic:      externalTrafficPolicy {}; ready endpoints {}",
        r.traffic.external_traffic_policy,
        if eps.is_empty() {
            "none".to_string()
        } else {
            eps.join(", ")
        }
    );
}

/// Step 5: kube-proxy's chains per port, iptables and nftables.
fn write_kube_proxy(t: &mut String, r: &ServiceReport) {
    for p in &r.kube_proxy {
        let ipt = &p.iptables;
        let next = if r.traffic.external_traffic_policy == "Local" {
            &ipt.local
        } else {
            &ipt.service
        };
        let _ = writeln!(
            t,
            "5. kube-proxy:   port {}/{}{}: KUBE-SERVICES -> {} -> {}",
            p.port,
            p.protocol,
            if p.name.is_empty() {
                String::new()
            } else {
                format!(" ({})", p.name)
            },
            ipt.external,
            next
        );
        for e in &ipt.endpoints {
            let _ = writeln!(
                t,
                "                   -> {} -> {}{}{} (weight {})",
                e.chain,
                e.endpoint,
                e.pod
                    .as_ref()
                    .map(|p| format!(" pod {p}"))
                    .unwrap_or_default(),
                e.node
                    .as_ref()
                    .map(|n| format!(" on {n}"))
                    .unwrap_or_default(),
                e.weight
            );
        }
        let nft_next = if r.traffic.external_traffic_policy == "Local" {
            &p.nftables.local
        } else {
            &p.nftables.service
        };
        let _ = writeln!(
            t,
            "                 nftables: {} -> {nft_next}",
            p.nftables.external
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use ferrolb_config::model::{L2Advertisement, PoolSelection};
    use ferrolb_testkit::model::pool;
    use ferrolb_testkit::objects::{self, EndpointBuilder, ServiceBuilder, endpoint};

    use super::*;

    fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    /// LoadBalancer Service `web/name` with `policy` and port `http` 80/TCP (no target port),
    /// without status.
    fn web_service(name: &str, policy: &str) -> ServiceBuilder {
        objects::service(name)
            .namespace("web")
            .external_traffic_policy(policy)
            .add_port(k8s_openapi::api::core::v1::ServicePort {
                name: Some("http".into()),
                port: 80,
                protocol: Some("TCP".into()),
                ..Default::default()
            })
    }

    /// EndpointSlice `web/name` of Service web with port `http` 8080/TCP and these endpoints.
    fn web_slice(
        name: &str,
        address_type: &str,
        endpoints: impl IntoIterator<Item = EndpointBuilder>,
    ) -> EndpointSlice {
        endpoints
            .into_iter()
            .fold(
                objects::endpoint_slice(name)
                    .namespace("web")
                    .service("web")
                    .address_type(address_type)
                    .port(Some("http"), 8080, "TCP"),
                |slice, e| slice.endpoint(e),
            )
            .build()
    }

    /// A cluster with pool `default` covered by L2Advertisement `l2`, Service web/web at
    /// 198.18.200.0 with `policy`, a pod on node2, and node1 announcing it.
    fn snapshot(policy: &str) -> Snapshot {
        let mut config = Config::default();
        config
            .pools
            .insert("default".into(), pool("default", &["198.18.200.0/24"]));
        config.l2_advertisements.insert(
            "l2".into(),
            L2Advertisement {
                name: "l2".into(),
                pools: PoolSelection::default(),
                ..Default::default()
            },
        );
        Snapshot {
            namespace: "metallb-system".into(),
            config,
            services: vec![
                web_service("web", policy)
                    .ingress(&["198.18.200.0"])
                    .build(),
            ],
            slices: vec![web_slice(
                "web-x",
                "IPv4",
                [endpoint("198.19.2.5")
                    .node("node2")
                    .pod("web-0")
                    .ready(true)],
            )],
            l2_statuses: vec![from(serde_json::json!({
                "apiVersion": "metallb.io/v1beta1", "kind": "ServiceL2Status",
                "metadata": {"namespace": "metallb-system", "name": "l2-x"},
                "spec": {},
                "status": {"node": "node1", "serviceName": "web", "serviceNamespace": "web",
                           "interfaces": [{"name": "eth0"}]},
            }))],
            ..Default::default()
        }
    }

    fn key() -> ServiceKey {
        ServiceKey::new("web", "web")
    }

    #[test]
    fn a_healthy_service_is_explained_step_by_step() {
        let s = snapshot("Cluster");
        let r = explain(&s, &key());
        assert!(r.diagnoses.is_empty(), "{:?}", r.diagnoses);
        assert_eq!(r.advertisements, ["L2Advertisement l2"]);
        assert_eq!(r.announcements.len(), 1);
        assert_eq!(r.announcements[0].node, "node1");
        assert_eq!(r.traffic.ready_endpoints.get("node2"), Some(&1));
        let p = &r.kube_proxy[0];
        assert_eq!((p.port, p.protocol.as_str()), (80, "TCP"));
        assert!(p.iptables.external.starts_with("KUBE-EXT-"));
        assert_eq!(p.iptables.endpoints[0].endpoint, "198.19.2.5:8080");
        assert_eq!(p.iptables.endpoints[0].weight, "1/1");
        assert!(p.iptables.endpoints[0].chain.starts_with("KUBE-SEP-"));
        assert_eq!(
            service_of_ip(&s, "198.18.200.0".parse().unwrap()),
            Some(key())
        );
        let text = render_text(&r);
        for want in [
            "Service web/web",
            "1. Pool:         default",
            "layer 2 by node1 on eth0",
            "node2: 1",
            "KUBE-SERVICES -> KUBE-EXT-",
            "198.19.2.5:8080 pod web-0 on node2 (weight 1/1)",
            "No problem found.",
            "ping",
        ] {
            assert!(text.contains(want), "{want:?} not in:\n{text}");
        }
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["schema"], SCHEMA);
        assert_eq!(json["announcements"][0]["mode"], "layer2");
    }

    #[test]
    fn a_pool_no_advertisement_covers_is_named() {
        let mut s = snapshot("Cluster");
        s.config.l2_advertisements.clear();
        s.l2_statuses.clear();
        let r = explain(&s, &key());
        let codes: Vec<Code> = r.diagnoses.iter().map(|d| d.code).collect();
        assert_eq!(codes, [Code::NoAdvertisement]);
        assert_eq!(
            r.diagnoses[0].object.to_string(),
            "IPAddressPool metallb-system/default"
        );
    }

    #[test]
    fn nobody_announcing_is_said() {
        let mut s = snapshot("Cluster");
        s.l2_statuses.clear();
        let r = explain(&s, &key());
        let codes: Vec<Code> = r.diagnoses.iter().map(|d| d.code).collect();
        assert_eq!(codes, [Code::NotAnnounced]);
        assert!(render_text(&r).contains("by no node"));
    }

    /// Local policy and the owner (node1) has no endpoint (the pod is on node2).
    #[test]
    fn local_policy_without_endpoint_on_the_owner_is_said() {
        let r = explain(&snapshot("Local"), &key());
        let codes: Vec<Code> = r.diagnoses.iter().map(|d| d.code).collect();
        assert_eq!(codes, [Code::LocalWithoutEndpoint]);
        assert!(r.diagnoses[0].problem.contains("node1"));
        assert!(render_text(&r).contains(&r.kube_proxy[0].iptables.local));
    }

    fn live_speaker(
        node: &str,
        report: Option<crate::speaker_report::SpeakerReport>,
    ) -> LiveSpeaker {
        LiveSpeaker {
            node: node.into(),
            live: true,
            report,
            error: None,
        }
    }

    fn node(name: &str, labels: &[(&str, &str)]) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            excluded: labels.iter().any(|(k, _)| *k == live::EXCLUDE_LABEL),
            ..Default::default()
        }
    }

    /// node1 owns web/web (on eth0) with node3 next in line, and hears a quorum.
    fn owner_report() -> crate::speaker_report::SpeakerReport {
        use crate::speaker_report::*;
        SpeakerReport {
            schema: SCHEMA.into(),
            node: "node1".into(),
            planned: true,
            layer2: Layer2Report {
                may_own: true,
                quorum: true,
                speakers_known: 3,
                speakers_heard: 2,
                macs: [("eth0".to_string(), "02:00:00:00:00:01".to_string())].into(),
                services: vec![Layer2Service {
                    service: "web/web".into(),
                    owner: Some("node1".into()),
                    takeover: vec!["node1".into(), "node3".into(), "node2".into()],
                    interfaces: vec!["eth0".into()],
                    ..Default::default()
                }],
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn the_speakers_add_the_mac_and_the_takeover_order() {
        let mut s = snapshot("Cluster");
        s.nodes = vec![node("node1", &[]), node("node2", &[]), node("node3", &[])];
        // node0's speaker, first by name, is stale: it sees no owner. The owner's own report
        // is the one shown.
        let mut stale = owner_report();
        stale.node = "node0".into();
        stale.layer2.services[0].owner = None;
        stale.layer2.services[0].takeover.clear();
        s.speakers = vec![
            live_speaker("node0", Some(stale)),
            live_speaker("node1", Some(owner_report())),
            live_speaker("node2", None),
        ];
        let r = explain(&s, &key());
        assert!(r.diagnoses.is_empty(), "{:?}", r.diagnoses);
        let a = &r.announcements[0];
        assert_eq!(a.takeover, ["node1", "node3", "node2"]);
        assert_eq!(a.macs["eth0"], "02:00:00:00:00:01");
        let text = render_text(&r);
        assert!(text.contains("eth0 (MAC 02:00:00:00:00:01)"), "{text}");
        assert!(text.contains("takeover order: node3, node2"), "{text}");
    }

    #[test]
    fn a_speaker_without_quorum_is_cut_off() {
        let mut s = snapshot("Cluster");
        s.nodes = vec![node("node1", &[]), node("node2", &[])];
        let mut cut = owner_report();
        cut.node = "node2".into();
        cut.layer2.quorum = false;
        cut.layer2.speakers_heard = 0;
        s.speakers = vec![
            live_speaker("node1", Some(owner_report())),
            live_speaker("node2", Some(cut)),
        ];
        let r = explain(&s, &key());
        let codes: Vec<Code> = r.diagnoses.iter().map(|d| d.code).collect();
        assert_eq!(codes, [Code::SpeakerCutOff]);
        assert_eq!(r.diagnoses[0].object.to_string(), "Node node2");
        assert!(r.diagnoses[0].problem.contains("hears 0 of 3"));
    }

    /// The only node the advertisement selects is excluded: that is the cause, not a vague
    /// "not announced"; with another node announcing, it is only a note.
    #[test]
    fn an_excluded_node_is_named() {
        let mut s = snapshot("Cluster");
        s.l2_statuses.clear();
        s.config
            .l2_advertisements
            .get_mut("l2")
            .unwrap()
            .node_selectors = vec![ferrolb_config::selector::Selector::from_labels([(
            "pick", "me",
        )])];
        // Another advertisement of the pool selects node2, but only for other Services.
        s.config.l2_advertisements.insert(
            "others".into(),
            L2Advertisement {
                name: "others".into(),
                pools: PoolSelection::default(),
                service_selectors: vec![ferrolb_config::selector::Selector::from_labels([(
                    "app", "other",
                )])],
                ..Default::default()
            },
        );
        s.nodes = vec![
            node("node1", &[("pick", "me"), (live::EXCLUDE_LABEL, "")]),
            node("node2", &[]),
        ];
        s.speakers = vec![live_speaker("node1", None), live_speaker("node2", None)];
        let r = explain(&s, &key());
        let codes: Vec<Code> = r.diagnoses.iter().map(|d| d.code).collect();
        assert_eq!(codes, [Code::NodeExcluded]);
        assert_eq!(r.advertisements, ["L2Advertisement l2"]);
        assert_eq!(r.diagnoses[0].object.to_string(), "Node node1");
        assert!(r.diagnoses[0].fix.contains("kubectl label node node1"));
    }

    #[test]
    fn no_speaker_on_the_selected_nodes_is_said() {
        let mut s = snapshot("Cluster");
        s.l2_statuses.clear();
        s.nodes = vec![node("node1", &[]), node("node2", &[])];
        s.speakers = vec![LiveSpeaker {
            node: "node1".into(),
            live: false,
            ..Default::default()
        }];
        let r = explain(&s, &key());
        let codes: Vec<Code> = r.diagnoses.iter().map(|d| d.code).collect();
        assert_eq!(codes, [Code::NoSpeaker]);
        assert!(r.diagnoses[0].problem.contains("node1, node2"));
    }

    /// Local policy, and the only selected node has no endpoint (the pod is on node2).
    #[test]
    fn local_policy_with_no_endpoint_on_any_selected_node_is_said() {
        let mut s = snapshot("Local");
        s.l2_statuses.clear();
        s.config
            .l2_advertisements
            .get_mut("l2")
            .unwrap()
            .node_selectors = vec![ferrolb_config::selector::Selector::from_labels([(
            "pick", "me",
        )])];
        s.nodes = vec![node("node1", &[("pick", "me")]), node("node2", &[])];
        s.speakers = vec![live_speaker("node1", None), live_speaker("node2", None)];
        let r = explain(&s, &key());
        let codes: Vec<Code> = r.diagnoses.iter().map(|d| d.code).collect();
        assert_eq!(codes, [Code::LocalWithoutEndpoint]);
        assert!(r.diagnoses[0].problem.contains("(node1)"));
    }

    #[test]
    fn a_bgp_session_down_and_a_silent_speaker_are_problems() {
        use crate::speaker_report::*;
        let mut s = snapshot("Cluster");
        s.l2_statuses.clear();
        s.config.l2_advertisements.clear();
        s.config.bgp_advertisements.insert(
            "bgp".into(),
            ferrolb_config::model::BgpAdvertisement {
                name: "bgp".into(),
                aggregation_length: 32,
                aggregation_length_v6: 128,
                local_pref: None,
                communities: BTreeSet::new(),
                pools: PoolSelection::default(),
                node_selectors: Vec::new(),
                peers: BTreeSet::new(),
                service_selectors: Vec::new(),
            },
        );
        s.bgp_statuses = vec![from(serde_json::json!({
            "apiVersion": "metallb.io/v1beta1", "kind": "ServiceBGPStatus",
            "metadata": {"namespace": "metallb-system", "name": "bgp-x"},
            "spec": {},
            "status": {"node": "node1", "serviceName": "web", "serviceNamespace": "web",
                       "peers": ["router", "backup"]},
        }))];
        let route = |services: &[&str]| RouteReport {
            prefix: "198.18.200.0/32".into(),
            local_pref: None,
            communities: vec!["64500:1".into()],
            large_communities: Vec::new(),
            services: services.iter().map(|s| s.to_string()).collect(),
        };
        let report = SpeakerReport {
            schema: SCHEMA.into(),
            node: "node1".into(),
            planned: true,
            bgp: BgpReport {
                peers: vec![
                    PeerReport {
                        name: "backup".into(),
                        address: "198.18.0.250".into(),
                        state: "Active".into(),
                        last_error: Some("connection refused".into()),
                        routes: vec![route(&["web/web"])],
                        ..Default::default()
                    },
                    PeerReport {
                        name: "router".into(),
                        address: "198.18.0.254".into(),
                        state: "Established".into(),
                        routes: vec![route(&["web/web"])],
                        ..Default::default()
                    },
                ],
            },
            ..Default::default()
        };
        s.nodes = vec![node("node1", &[]), node("node2", &[])];
        s.speakers = vec![
            live_speaker("node1", Some(report)),
            LiveSpeaker {
                node: "node2".into(),
                live: true,
                report: None,
                error: Some("no answer within 5s".into()),
            },
        ];
        let r = explain(&s, &key());
        let codes: Vec<Code> = r.diagnoses.iter().map(|d| d.code).collect();
        assert_eq!(codes, [Code::PeerNotEstablished, Code::SpeakerUnreachable]);
        assert_eq!(
            r.diagnoses[0].object.to_string(),
            "BGPPeer metallb-system/backup"
        );
        assert!(
            r.diagnoses[0]
                .problem
                .contains("Active (connection refused)")
        );
        let sessions = &r.announcements[0].sessions;
        assert_eq!(sessions.len(), 2);
        assert_eq!(sessions[1].routes, ["198.18.200.0/32 communities 64500:1"]);
        let text = render_text(&r);
        assert!(
            text.contains("router 198.18.0.254 Established: 198.18.200.0/32 communities 64500:1"),
            "{text}"
        );
    }

    /// One replay for many Services explains each as a fresh replay does.
    #[test]
    fn one_replay_explains_every_service_as_a_fresh_one_does() {
        let mut s = snapshot("Cluster");
        for i in 1..6 {
            let mut more = web_service(&format!("web{i}"), "Cluster");
            if i % 2 == 0 {
                more = more.ingress(&[&format!("198.18.200.{i}")]);
            }
            s.services.push(more.build());
        }
        // Two Services holding one IP that they may not share (the first claim wins the
        // replay), and two that share one with a key.
        let holding = |name: &str, ip: &str, key: Option<&str>| {
            let mut x = web_service(name, "Cluster").ingress(&[ip]);
            if let Some(k) = key {
                x = x.annotation("metallb.io/allow-shared-ip", k);
            }
            x.build()
        };
        s.services.push(holding("clash-a", "198.18.200.9", None));
        s.services.push(holding("clash-b", "198.18.200.9", None));
        s.services
            .push(holding("share-a", "198.18.200.10", Some("k")));
        s.services
            .push(holding("share-b", "198.18.200.10", Some("k")));
        let keys: Vec<ServiceKey> = s
            .services
            .iter()
            .map(|x| ServiceKey::new("web", x.metadata.name.as_deref().unwrap()))
            .collect();
        // The definition: every other Service claims first, then the one explained.
        let inputs: Vec<ServiceInput<'_>> = s
            .services
            .iter()
            .map(|service| ServiceInput {
                service,
                namespace_labels: &NO_LABELS,
            })
            .collect();
        let pools: Vec<_> = s.config.pools.values().cloned().collect();
        let mut shared = Explainer::new(&s);
        for k in keys.iter().rev().chain(keys.iter()) {
            let own = allocation::explain(&pools, &s.namespace, &inputs, k);
            assert_eq!(shared.explain(k).allocation, own, "{k}");
        }
        // Both Services of the clash are told: each conflicts with the other.
        for name in ["clash-a", "clash-b"] {
            let r = explain(&s, &ServiceKey::new("web", name));
            assert!(
                r.diagnoses.iter().any(|d| d.code == Code::SharingRefused),
                "{name}: {:?}",
                r.diagnoses
            );
        }
    }

    /// kube-proxy spreads connections evenly over the ready endpoints of the IP's family;
    /// under Local policy over those on the node the traffic enters.
    #[test]
    fn each_endpoint_weighs_its_share() {
        let endpoints = [
            endpoint("198.19.1.5").node("node1").ready(true),
            endpoint("198.19.1.6").node("node1").ready(true),
            endpoint("198.19.2.5").node("node2").ready(true),
            endpoint("198.19.2.9").node("node2").ready(false),
        ];
        let v6 = [endpoint("fd00:19:1::5").node("node1").ready(true)];
        for (policy, want) in [
            ("Cluster", ["1/3", "1/3", "1/3", "1/1"]),
            ("Local", ["1/2", "1/2", "1/1", "1/1"]),
        ] {
            let mut s = snapshot(policy);
            s.slices = vec![
                web_slice("web-4", "IPv4", endpoints.clone()),
                web_slice("web-6", "IPv6", v6.clone()),
            ];
            let r = explain(&s, &key());
            let got: Vec<&str> = r.kube_proxy[0]
                .iptables
                .endpoints
                .iter()
                .map(|e| e.weight.as_str())
                .collect();
            assert_eq!(got, want, "{policy}");
        }
    }

    /// The pool is covered, but not for this Service: its labels are named.
    #[test]
    fn an_advertisement_for_other_services_is_named() {
        let mut s = snapshot("Cluster");
        s.l2_statuses.clear();
        s.config
            .l2_advertisements
            .get_mut("l2")
            .unwrap()
            .service_selectors = vec![ferrolb_config::selector::Selector::from_labels([(
            "app", "other",
        )])];
        let r = explain(&s, &key());
        let codes: Vec<Code> = r.diagnoses.iter().map(|d| d.code).collect();
        assert_eq!(codes, [Code::NoAdvertisement]);
        assert_eq!(r.diagnoses[0].object.to_string(), "Service web/web");
        assert!(r.diagnoses[0].problem.contains("(L2Advertisement l2)"));
        assert!(r.advertisements.is_empty());
    }
}
