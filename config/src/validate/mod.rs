//! Validation of a namespace's ferrolb objects into one [`Config`].
//!
//! One bad object never discards the good ones: each rejected object is left out of the model and
//! the result says which and why. Where two objects conflict, the older one (by creation time,
//! then name) is kept, so adding a conflicting object never disturbs what already serves.

mod advertisements;
mod communities;
mod duration;
mod peers;
mod pools;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use crate::crd::{
    BFDProfile, BGPAdvertisement, BGPPeer, Community, IPAddressPool, L2Advertisement, LabelSelector,
};
use crate::model::Config;
use crate::selector::{Labels, Selector};

pub use duration::{DurationError, parse_go_duration};

/// The kinds of configuration objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// IPAddressPool.
    IPAddressPool,
    /// L2Advertisement.
    L2Advertisement,
    /// BGPAdvertisement.
    BGPAdvertisement,
    /// BGPPeer.
    BGPPeer,
    /// Community.
    Community,
    /// BFDProfile.
    BFDProfile,
}

impl Kind {
    /// The kind's name as in manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::IPAddressPool => "IPAddressPool",
            Kind::L2Advertisement => "L2Advertisement",
            Kind::BGPAdvertisement => "BGPAdvertisement",
            Kind::BGPPeer => "BGPPeer",
            Kind::Community => "Community",
            Kind::BFDProfile => "BFDProfile",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Identity of one object: kind, namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectRef {
    /// Kind of the object.
    pub kind: Kind,
    /// Namespace of the object.
    pub namespace: String,
    /// Name of the object.
    pub name: String,
}

impl ObjectRef {
    fn of(kind: Kind, meta: &ObjectMeta) -> Self {
        Self {
            kind,
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
        }
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// One finding about one object: `Kind namespace/name: field: message`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ConfigError {
    /// The object at fault.
    pub object: ObjectRef,
    /// Path of the field at fault, e.g. `spec.addresses[1]`.
    pub field: String,
    /// What is wrong, in words an operator understands.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.object, self.field, self.message)
    }
}

impl std::error::Error for ConfigError {}

/// A node as far as validation needs it (peers and advertisements select nodes by label).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// Node name.
    pub name: String,
    /// Node labels.
    pub labels: Labels,
}

impl NodeInfo {
    /// A Node's name and labels from its metadata (a Node without a name gets an empty one,
    /// which no selector names).
    pub fn from_metadata(metadata: &ObjectMeta) -> Self {
        NodeInfo {
            name: metadata.name.clone().unwrap_or_default(),
            labels: metadata.labels.clone().unwrap_or_default(),
        }
    }
}

/// Everything validation reads: the ferrolb objects and, when known, the cluster's nodes.
#[derive(Clone, Debug, Default)]
pub struct Objects {
    /// The namespace ferrolb reads its configuration from.
    pub namespace: String,
    /// IPAddressPools.
    pub pools: Vec<IPAddressPool>,
    /// L2Advertisements.
    pub l2_advertisements: Vec<L2Advertisement>,
    /// BGPAdvertisements.
    pub bgp_advertisements: Vec<BGPAdvertisement>,
    /// BGPPeers (v1beta1 objects are converted to v1beta2 first).
    pub peers: Vec<BGPPeer>,
    /// Communities.
    pub communities: Vec<Community>,
    /// BFDProfiles.
    pub bfd_profiles: Vec<BFDProfile>,
    /// The cluster's nodes; `None` when unknown (offline checks), in which case two selector lists
    /// are taken to share a node unless they clearly cannot be compared.
    pub nodes: Option<Vec<NodeInfo>>,
}

/// The outcome of validation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Validated {
    /// The model built from every accepted object.
    pub config: Config,
    /// Why objects were left out (one or more findings per left-out object).
    pub errors: Vec<ConfigError>,
    /// Findings that leave the object in (e.g. a Secret an offline check cannot see).
    pub warnings: Vec<ConfigError>,
    /// The objects left out of the model.
    pub left_out: BTreeSet<ObjectRef>,
}

impl Validated {
    /// Whether every object was accepted.
    pub fn is_valid(&self) -> bool {
        self.errors.is_empty()
    }
}

/// Collects findings while validating; objects with errors are left out.
#[derive(Default)]
pub(crate) struct Report {
    errors: Vec<ConfigError>,
    warnings: Vec<ConfigError>,
}

impl Report {
    pub(crate) fn error(
        &mut self,
        object: &ObjectRef,
        field: impl Into<String>,
        message: impl Into<String>,
    ) {
        self.errors.push(ConfigError {
            object: object.clone(),
            field: field.into(),
            message: message.into(),
        });
    }

    pub(crate) fn warn(
        &mut self,
        object: &ObjectRef,
        field: impl Into<String>,
        message: impl Into<String>,
    ) {
        self.warnings.push(ConfigError {
            object: object.clone(),
            field: field.into(),
            message: message.into(),
        });
    }

    /// Number of errors so far; compare before and after checking an object to know if it failed.
    pub(crate) fn mark(&self) -> usize {
        self.errors.len()
    }

    pub(crate) fn failed_since(&self, mark: usize) -> bool {
        self.errors.len() > mark
    }
}

/// Age order of objects: older first, then by name. Conflicts keep the older object.
pub(crate) fn by_age<T: kube::Resource>(objects: &[T]) -> Vec<&T> {
    let mut sorted: Vec<&T> = objects.iter().collect();
    sorted.sort_by(|a, b| {
        let key = |o: &T| -> (Option<Time>, String) {
            (
                o.meta().creation_timestamp.clone(),
                o.meta().name.clone().unwrap_or_default(),
            )
        };
        key(a).cmp(&key(b))
    });
    sorted
}

/// One match expression as MetalLB compares them: key, operator, values sorted.
type WrittenExpression = (String, String, Vec<String>);

/// A selector as MetalLB compares selectors for duplicates: its labels, and its expressions in
/// the order written, each with its values sorted. Selectors written differently are not
/// duplicates to MetalLB even when they select alike, so they are not to us either: a list
/// MetalLB accepts must be accepted.
fn written_form(selector: &LabelSelector) -> (BTreeMap<String, String>, Vec<WrittenExpression>) {
    let labels = selector.match_labels.clone().unwrap_or_default();
    let expressions = selector
        .match_expressions
        .iter()
        .flatten()
        .map(|e| {
            let mut values = e.values.clone().unwrap_or_default();
            values.sort();
            (e.key.clone(), e.operator.clone(), values)
        })
        .collect();
    (labels, expressions)
}

/// Reports what MetalLB refuses inside one selector: a value twice in one match expression, or
/// the same match expression twice (Kubernetes itself takes both).
fn check_repeats(report: &mut Report, object: &ObjectRef, field: &str, selector: &LabelSelector) {
    let mut expressions = BTreeSet::new();
    for (j, expression) in selector.match_expressions.iter().flatten().enumerate() {
        let mut values = BTreeSet::new();
        for (k, value) in expression.values.iter().flatten().enumerate() {
            if !values.insert(value) {
                report.error(
                    object,
                    format!("{field}.matchExpressions[{j}].values[{k}]"),
                    format!("duplicate value {value:?}"),
                );
            }
        }
        let mut sorted = expression.values.clone().unwrap_or_default();
        sorted.sort();
        if !expressions.insert((&expression.key, &expression.operator, sorted)) {
            report.error(
                object,
                format!("{field}.matchExpressions[{j}]"),
                "duplicate match expression: the same key, operator and values appear twice",
            );
        }
    }
}

/// Compiles a list of selectors, reporting each bad one under `field[i]`.
pub(crate) fn compile_selectors(
    report: &mut Report,
    object: &ObjectRef,
    field: &str,
    selectors: &[LabelSelector],
) -> Vec<Selector> {
    let mut compiled = Vec::new();
    let mut seen = BTreeSet::new();
    for (i, selector) in selectors.iter().enumerate() {
        check_repeats(report, object, &format!("{field}[{i}]"), selector);
        if !seen.insert(written_form(selector)) {
            report.error(
                object,
                format!("{field}[{i}]"),
                "duplicate selector: the same selector appears twice",
            );
        }
        match Selector::compile(selector) {
            Ok(s) => compiled.push(s),
            Err(e) => report.error(object, format!("{field}[{i}].{}", e.field), e.message),
        }
    }
    compiled
}

/// Leaves out every object whose kind and name appear more than once. Only manifest files can
/// hold such a pair (the API server keeps one object per name), and which one `kubectl apply`
/// would keep depends on the order of the files, so neither is taken; MetalLB refuses them too.
fn unique_names<T: kube::Resource + Clone>(
    report: &mut Report,
    kind: Kind,
    objects: Vec<T>,
) -> Vec<T> {
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    for object in &objects {
        *count
            .entry(object.meta().name.clone().unwrap_or_default())
            .or_default() += 1;
    }
    for (name, n) in count.iter().filter(|(_, n)| **n > 1) {
        let object = ObjectRef {
            kind,
            namespace: objects
                .first()
                .and_then(|o| o.meta().namespace.clone())
                .unwrap_or_default(),
            name: name.clone(),
        };
        report.error(
            &object,
            "metadata.name",
            format!(
                "{n} objects of this kind are named {name:?}; the API server keeps one per name"
            ),
        );
    }
    objects
        .into_iter()
        .filter(|o| count.get(o.meta().name.as_deref().unwrap_or_default()) == Some(&1))
        .collect()
}

/// Whether two node selector lists select a common node. With a node list this is exact;
/// without one, empty lists (all nodes) or identical lists are taken to overlap.
pub(crate) fn share_a_node(nodes: Option<&[NodeInfo]>, a: &[Selector], b: &[Selector]) -> bool {
    match nodes {
        Some(nodes) => nodes.iter().any(|n| {
            crate::selector::any_matches(a, &n.labels) && crate::selector::any_matches(b, &n.labels)
        }),
        None => a.is_empty() || b.is_empty() || a == b,
    }
}

/// The objects of one kind that count: those in ferrolb's namespace, each name once. Objects
/// outside it are ignored with a warning, as MetalLB ignores them.
fn ours<T: kube::Resource + Clone>(
    report: &mut Report,
    ns: &str,
    kind: Kind,
    objects: &[T],
) -> Vec<T> {
    let mine: Vec<T> = objects
        .iter()
        .filter(|o| {
            let object = ObjectRef::of(kind, o.meta());
            if object.namespace == ns {
                return true;
            }
            report.warn(
                &object,
                "metadata.namespace",
                format!("ignored: ferrolb reads its configuration only from namespace {ns:?}"),
            );
            false
        })
        .cloned()
        .collect();
    // In one namespace by now: a name is unique per kind.
    unique_names(report, kind, mine)
}

/// Validates every object of `objects` into one model.
pub fn validate(objects: &Objects) -> Validated {
    let mut report = Report::default();
    let mut left_out = BTreeSet::new();
    let ns = objects.namespace.as_str();

    let pools = ours(&mut report, ns, Kind::IPAddressPool, &objects.pools);
    let l2 = ours(
        &mut report,
        ns,
        Kind::L2Advertisement,
        &objects.l2_advertisements,
    );
    let bgp = ours(
        &mut report,
        ns,
        Kind::BGPAdvertisement,
        &objects.bgp_advertisements,
    );
    let peers = ours(&mut report, ns, Kind::BGPPeer, &objects.peers);
    let communities = ours(&mut report, ns, Kind::Community, &objects.communities);
    let bfd = ours(&mut report, ns, Kind::BFDProfile, &objects.bfd_profiles);

    let mut config = Config {
        communities: communities::validate(&mut report, &communities),
        bfd_profiles: peers::validate_bfd_profiles(&mut report, &bfd),
        pools: pools::validate(&mut report, &pools),
        ..Config::default()
    };
    let nodes = objects.nodes.as_deref();
    config.l2_advertisements = advertisements::validate_l2(&mut report, &l2, &pools);
    config.peers = peers::validate(&mut report, &peers, &bfd, &config.bfd_profiles, ns, nodes);
    config.bgp_advertisements = advertisements::validate_bgp(
        &mut report,
        &bgp,
        &advertisements::BgpRefs {
            pool_objects: &pools,
            pools: &config.pools,
            peer_objects: &peers,
            peers: &config.peers,
            bfd_profiles: &config.bfd_profiles,
            aliases: &config.communities,
            nodes,
        },
    );

    for e in &report.errors {
        left_out.insert(e.object.clone());
    }
    let mut errors = report.errors;
    errors.sort();
    errors.dedup();
    Validated {
        config,
        errors,
        warnings: report.warnings,
        left_out,
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! Builders for objects in tests.
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    /// Metadata in the test namespace with a creation time `age_rank` seconds after the epoch.
    pub(crate) fn meta(name: &str, age_rank: i64) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some("metallb-system".into()),
            creation_timestamp: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + age_rank).unwrap(),
            )),
            ..Default::default()
        }
    }
}
