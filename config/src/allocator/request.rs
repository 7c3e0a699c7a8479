//! What the allocator needs to know about a Service, read from the Kubernetes object.
//!
//! [`ServiceRequest::from_service`] reads MetalLB's annotations (under both prefixes), the
//! requested IPs, the IP families, the ports and the backend of a Service, and rejects what cannot
//! be honoured with an error that names the annotation or field. [`is_ours`] tells whether the
//! Service is ours to serve at all.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher};
use std::net::IpAddr;
use std::sync::{Arc, OnceLock};

use k8s_openapi::api::core::v1::{Service, ServiceSpec};

use crate::address::Family;
use crate::selector::Labels;

use super::hash::FoldState;

/// Current prefix of MetalLB's Service annotations.
pub const ANNOTATION_PREFIX: &str = "metallb.io/";
/// Old prefix of MetalLB's Service annotations, still honoured with a warning.
pub const DEPRECATED_ANNOTATION_PREFIX: &str = "metallb.universe.tf/";
/// Annotation (without prefix) listing requested IPs, at most one per family.
pub const LOAD_BALANCER_IPS: &str = "loadBalancerIPs";
/// Annotation (without prefix) naming the pool to allocate from.
pub const ADDRESS_POOL: &str = "address-pool";
/// Annotation (without prefix) carrying the sharing key.
pub const ALLOW_SHARED_IP: &str = "allow-shared-ip";
/// Annotation the controller writes: the pool an IP was allocated from.
pub const IP_ALLOCATED_FROM_POOL: &str = "metallb.io/ip-allocated-from-pool";
/// Reason of the Warning Event for an annotation under the old prefix.
pub const DEPRECATED_ANNOTATION_REASON: &str = "deprecatedAnnotation";

/// Identity of a Service: namespace and name. Cheap to clone (two reference counts) and to hash:
/// the hash is computed once, so that growing the allocator's tables never re-reads the names.
#[derive(Clone)]
pub struct ServiceKey {
    namespace: Arc<str>,
    name: Arc<str>,
    hash: u64,
}

impl ServiceKey {
    /// The key of Service `name` in `namespace`.
    pub fn new(namespace: impl Into<Arc<str>>, name: impl Into<Arc<str>>) -> Self {
        let (namespace, name) = (namespace.into(), name.into());
        let hash = FoldState::default().hash_one((&*namespace, &*name));
        Self {
            namespace,
            name,
            hash,
        }
    }

    /// Namespace of the Service.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Name of the Service.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn namespace_arc(&self) -> &Arc<str> {
        &self.namespace
    }

    /// The same key with an equal namespace string shared with other keys.
    pub(crate) fn with_namespace(&self, namespace: Arc<str>) -> Self {
        debug_assert_eq!(*namespace, *self.namespace);
        Self {
            namespace,
            name: self.name.clone(),
            hash: self.hash,
        }
    }
}

impl PartialEq for ServiceKey {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.namespace == other.namespace && self.name == other.name
    }
}

impl Eq for ServiceKey {}

impl Hash for ServiceKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl Ord for ServiceKey {
    fn cmp(&self, other: &Self) -> Ordering {
        (&self.namespace, &self.name).cmp(&(&other.namespace, &other.name))
    }
}

impl PartialOrd for ServiceKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Debug for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceKey")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .finish()
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// `spec.ipFamilyPolicy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FamilyPolicy {
    /// One IP of the primary family.
    #[default]
    SingleStack,
    /// Both families from one pool when possible, else the primary family.
    PreferDualStack,
    /// One IP of each family from one pool, or nothing.
    RequireDualStack,
}

impl fmt::Display for FamilyPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FamilyPolicy::SingleStack => "SingleStack",
            FamilyPolicy::PreferDualStack => "PreferDualStack",
            FamilyPolicy::RequireDualStack => "RequireDualStack",
        })
    }
}

/// Transport protocol of a Service port.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// TCP (the Kubernetes default).
    #[default]
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        })
    }
}

/// One (protocol, port) pair a Service listens on. Two Services sharing an IP must not have one
/// in common.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProtocolPort {
    /// Protocol.
    pub protocol: Protocol,
    /// Port number.
    pub port: u16,
}

impl ProtocolPort {
    /// A TCP port.
    pub fn tcp(port: u16) -> Self {
        Self {
            protocol: Protocol::Tcp,
            port,
        }
    }

    /// A UDP port.
    pub fn udp(port: u16) -> Self {
        Self {
            protocol: Protocol::Udp,
            port,
        }
    }
}

impl fmt::Display for ProtocolPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.protocol, self.port)
    }
}

/// Where a Service's traffic goes: what Services sharing an IP must agree on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum Backend {
    /// `externalTrafficPolicy: Cluster` (the default): any node forwards.
    #[default]
    Cluster,
    /// `externalTrafficPolicy: Local` with the Service's `spec.selector`.
    Local(Labels),
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Backend::Cluster => f.write_str("externalTrafficPolicy Cluster"),
            Backend::Local(selector) => {
                f.write_str("externalTrafficPolicy Local with selector {")?;
                for (i, (k, v)) in selector.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{k}={v}")?;
                }
                f.write_str("}")
            }
        }
    }
}

/// What the allocator needs of a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceRequest {
    /// Namespace and name.
    pub key: ServiceKey,
    /// `spec.ipFamilies`, primary first. Empty means IPv4.
    pub ip_families: Vec<Family>,
    /// `spec.ipFamilyPolicy`.
    pub family_policy: FamilyPolicy,
    /// Requested IPs (`metallb.io/loadBalancerIPs` or `spec.loadBalancerIP`), at most one per
    /// family. Empty: none requested.
    pub requested_ips: Vec<IpAddr>,
    /// Pool named by `metallb.io/address-pool`.
    pub pool: Option<String>,
    /// Sharing key from `metallb.io/allow-shared-ip`; `None` or empty: no sharing.
    pub sharing_key: Option<Arc<str>>,
    /// (protocol, port) pairs of the Service.
    pub ports: Vec<ProtocolPort>,
    /// Traffic policy and selector.
    pub backend: Backend,
    /// Labels of the Service (for `serviceSelectors`).
    pub labels: Arc<Labels>,
    /// Labels of the Service's namespace (for `namespaceSelectors`).
    pub namespace_labels: Arc<Labels>,
}

impl ServiceRequest {
    /// A SingleStack IPv4 request with no annotation, no ports and a Cluster backend.
    pub fn new(namespace: impl Into<Arc<str>>, name: impl Into<Arc<str>>) -> Self {
        Self {
            key: ServiceKey::new(namespace, name),
            ip_families: vec![Family::V4],
            family_policy: FamilyPolicy::SingleStack,
            requested_ips: Vec::new(),
            pool: None,
            sharing_key: None,
            ports: Vec::new(),
            backend: Backend::Cluster,
            labels: no_labels(),
            namespace_labels: no_labels(),
        }
    }

    /// Sets the families (primary first) and the family policy.
    pub fn with_families(mut self, policy: FamilyPolicy, families: &[Family]) -> Self {
        self.family_policy = policy;
        self.ip_families = families.to_vec();
        self
    }

    /// Sets the requested IPs.
    pub fn with_requested_ips(mut self, ips: &[IpAddr]) -> Self {
        self.requested_ips = ips.to_vec();
        self
    }

    /// Sets the pool annotation.
    pub fn with_pool(mut self, pool: impl Into<String>) -> Self {
        self.pool = Some(pool.into());
        self
    }

    /// Sets the sharing key.
    pub fn with_sharing_key(mut self, key: impl Into<Arc<str>>) -> Self {
        self.sharing_key = Some(key.into());
        self
    }

    /// Sets the ports.
    pub fn with_ports(mut self, ports: &[ProtocolPort]) -> Self {
        self.ports = ports.to_vec();
        self
    }

    /// Sets the backend.
    pub fn with_backend(mut self, backend: Backend) -> Self {
        self.backend = backend;
        self
    }

    /// Sets the Service's labels.
    pub fn with_labels(mut self, labels: Labels) -> Self {
        self.labels = shared_labels(labels);
        self
    }

    /// Sets the namespace's labels.
    pub fn with_namespace_labels(mut self, labels: Labels) -> Self {
        self.namespace_labels = shared_labels(labels);
        self
    }

    /// The primary family: the first of `spec.ipFamilies`, IPv4 when none is given.
    pub fn primary_family(&self) -> Family {
        self.ip_families.first().copied().unwrap_or(Family::V4)
    }

    /// The second family the Service asks for, if any: always the other family for
    /// RequireDualStack, the second of `spec.ipFamilies` for PreferDualStack, none for
    /// SingleStack.
    pub fn secondary_family(&self) -> Option<Family> {
        let primary = self.primary_family();
        match self.family_policy {
            FamilyPolicy::SingleStack => None,
            FamilyPolicy::RequireDualStack => Some(other_family(primary)),
            FamilyPolicy::PreferDualStack => {
                self.ip_families.get(1).copied().filter(|&f| f != primary)
            }
        }
    }

    /// Whether the Service may get an address of this family.
    pub fn wants_family(&self, family: Family) -> bool {
        family == self.primary_family() || Some(family) == self.secondary_family()
    }

    /// The families the Service may get, primary first.
    pub fn families(&self) -> Vec<Family> {
        std::iter::once(self.primary_family())
            .chain(self.secondary_family())
            .collect()
    }

    /// The sharing key, if set and not empty.
    pub fn effective_sharing_key(&self) -> Option<&Arc<str>> {
        self.sharing_key.as_ref().filter(|k| !k.is_empty())
    }
}

/// One shared empty label map, so that requests without labels allocate nothing for them.
fn no_labels() -> Arc<Labels> {
    static EMPTY: OnceLock<Arc<Labels>> = OnceLock::new();
    EMPTY.get_or_init(Arc::default).clone()
}

fn shared_labels(labels: Labels) -> Arc<Labels> {
    if labels.is_empty() {
        no_labels()
    } else {
        Arc::new(labels)
    }
}

/// The other IP family.
pub(crate) fn other_family(family: Family) -> Family {
    match family {
        Family::V4 => Family::V6,
        Family::V6 => Family::V4,
    }
}

/// Something worth telling the Service's owner that does not stop allocation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestWarning {
    /// An annotation under the old `metallb.universe.tf/` prefix.
    #[error("{}", deprecated_message(.annotation, .replacement, *.overridden))]
    DeprecatedAnnotation {
        /// The annotation as written, e.g. `metallb.universe.tf/address-pool`.
        annotation: String,
        /// The annotation to use instead, e.g. `metallb.io/address-pool`.
        replacement: String,
        /// The replacement is also set, so this one is ignored.
        overridden: bool,
    },
}

fn deprecated_message(annotation: &str, replacement: &str, overridden: bool) -> String {
    if overridden {
        format!(
            "annotation {annotation} is deprecated and ignored because {replacement} is also set; remove it"
        )
    } else {
        format!("annotation {annotation} is deprecated; use {replacement}")
    }
}

impl RequestWarning {
    /// The reason of the Warning Event to record.
    pub fn reason(&self) -> &'static str {
        match self {
            RequestWarning::DeprecatedAnnotation { .. } => DEPRECATED_ANNOTATION_REASON,
        }
    }
}

/// Why a Service's request cannot be honoured. Each message starts with the annotation or field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// `metadata.name` or `metadata.namespace` is missing.
    #[error("{field}: missing")]
    MissingMetadata {
        /// The missing field.
        field: &'static str,
    },
    /// A requested IP does not parse.
    #[error("{field}: {value:?} is not an IP address")]
    NotAnIp {
        /// Annotation or field.
        field: String,
        /// The text that does not parse.
        value: String,
    },
    /// Two requested IPs of one family.
    #[error("{field}: {first} and {second} are both {family}; give at most one address per family")]
    TwoOfOneFamily {
        /// Annotation or field.
        field: String,
        /// The family listed twice.
        family: Family,
        /// First address.
        first: IpAddr,
        /// Second address.
        second: IpAddr,
    },
    /// Both `spec.loadBalancerIP` and the `loadBalancerIPs` annotation are set.
    #[error(
        "spec.loadBalancerIP and {annotation} are both set; keep only {annotation} (spec.loadBalancerIP is deprecated)"
    )]
    BothRequestedIpForms {
        /// The annotation as written.
        annotation: String,
    },
    /// A requested IP of a family the Service does not have.
    #[error(
        "{field}: {ip} is {}, but the Service asks for {} only (spec.ipFamilies {}, {policy})",
        Family::of(*.ip), list_families(.families), list_families(.families)
    )]
    FamilyNotInService {
        /// Annotation or field.
        field: String,
        /// The address.
        ip: IpAddr,
        /// The Service's families.
        families: Vec<Family>,
        /// The Service's family policy.
        policy: FamilyPolicy,
    },
    /// RequireDualStack with a requested address of only one family.
    #[error("{field}: RequireDualStack needs a requested {family} address too")]
    MissingRequestedFamily {
        /// Annotation or field.
        field: String,
        /// The family without an address.
        family: Family,
    },
    /// A field holds a value this version does not know.
    #[error("{field}: {value:?} is not one of {expected}")]
    UnknownValue {
        /// The field, e.g. `spec.ipFamilies[0]`.
        field: String,
        /// The value found.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// A family listed twice in `spec.ipFamilies`.
    #[error("spec.ipFamilies: {0} is listed twice")]
    DuplicateFamily(Family),
    /// A port outside 1–65535.
    #[error("{field}: {value} is not a port number (1-65535)")]
    BadPort {
        /// The field, e.g. `spec.ports[0].port`.
        field: String,
        /// The value found.
        value: i32,
    },
}

fn list_families(families: &[Family]) -> String {
    let names: Vec<String> = families.iter().map(Family::to_string).collect();
    format!("[{}]", names.join(", "))
}

/// A request read from a Service, with the warnings to record as Events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedService {
    /// What to allocate.
    pub request: ServiceRequest,
    /// Warnings (Event reason [`RequestWarning::reason`]).
    pub warnings: Vec<RequestWarning>,
}

/// The addresses in a Service's `status.loadBalancer.ingress` (entries without an IP, such as
/// hostnames, and unparsable ones left out).
pub fn status_ips(service: &Service) -> Vec<IpAddr> {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.as_deref()?.parse().ok())
        .collect()
}

/// Whether the Service is ours: `spec.type: LoadBalancer` and `spec.loadBalancerClass` equal to
/// the configured class, that is unset when none is configured (as MetalLB: with a class
/// configured, Services without a class belong to someone else).
pub fn is_ours(service: &Service, lb_class: Option<&str>) -> bool {
    let Some(spec) = service.spec.as_ref() else {
        return false;
    };
    let class = spec
        .load_balancer_class
        .as_deref()
        .filter(|c| !c.is_empty());
    spec.type_.as_deref() == Some("LoadBalancer") && class == lb_class.filter(|c| !c.is_empty())
}

/// Reads annotation `name` under both prefixes: the value and the annotation it came from.
fn annotation<'a>(
    annotations: Option<&'a BTreeMap<String, String>>,
    name: &str,
    warnings: &mut Vec<RequestWarning>,
) -> Option<(&'a str, String)> {
    let annotations = annotations?;
    let current = format!("{ANNOTATION_PREFIX}{name}");
    let old = format!("{DEPRECATED_ANNOTATION_PREFIX}{name}");
    let current_value = annotations.get(&current);
    if annotations.contains_key(&old) {
        warnings.push(RequestWarning::DeprecatedAnnotation {
            annotation: old.clone(),
            replacement: current.clone(),
            overridden: current_value.is_some(),
        });
    }
    match current_value {
        Some(v) => Some((v.as_str(), current)),
        None => annotations.get(&old).map(|v| (v.as_str(), old)),
    }
}

fn parse_ip(field: &str, text: &str) -> Result<IpAddr, RequestError> {
    text.trim().parse().map_err(|_| RequestError::NotAnIp {
        field: field.to_string(),
        value: text.trim().to_string(),
    })
}

impl ServiceRequest {
    /// Reads a Service. `namespace_labels` are the labels of the Service's namespace.
    pub fn from_service(
        service: &Service,
        namespace_labels: &Labels,
    ) -> Result<ParsedService, RequestError> {
        let meta = &service.metadata;
        let name = meta.name.as_deref().ok_or(RequestError::MissingMetadata {
            field: "metadata.name",
        })?;
        let namespace = meta
            .namespace
            .as_deref()
            .ok_or(RequestError::MissingMetadata {
                field: "metadata.namespace",
            })?;
        let default_spec = Default::default();
        let spec = service.spec.as_ref().unwrap_or(&default_spec);
        let annotations = meta.annotations.as_ref();
        let mut warnings = Vec::new();

        let mut request = ServiceRequest::new(namespace, name);
        request.ip_families = ip_families(spec)?;
        request.family_policy = family_policy(spec)?;
        request.labels = shared_labels(meta.labels.clone().unwrap_or_default());
        request.namespace_labels = shared_labels(namespace_labels.clone());
        request.read_requested_ips(spec, annotations, &mut warnings)?;

        // Pool and sharing key; empty values mean unset, as in MetalLB.
        request.pool = annotation(annotations, ADDRESS_POOL, &mut warnings)
            .map(|(v, _)| v.trim())
            .filter(|v| !v.is_empty())
            .map(str::to_string);
        request.sharing_key = annotation(annotations, ALLOW_SHARED_IP, &mut warnings)
            .map(|(v, _)| v.trim())
            .filter(|v| !v.is_empty())
            .map(Arc::from);

        request.ports = ports(spec)?;
        request.backend = backend(spec)?;
        Ok(ParsedService { request, warnings })
    }

    /// Reads the requested IPs (the annotation or `spec.loadBalancerIP`, never both): at most one
    /// per family, each of a family the Service has, every family covered when dual stack is
    /// required. Needs the families read first.
    fn read_requested_ips(
        &mut self,
        spec: &ServiceSpec,
        annotations: Option<&BTreeMap<String, String>>,
        warnings: &mut Vec<RequestWarning>,
    ) -> Result<(), RequestError> {
        let lb_ips = annotation(annotations, LOAD_BALANCER_IPS, warnings)
            .filter(|(v, _)| !v.trim().is_empty());
        let spec_ip = spec
            .load_balancer_ip
            .as_deref()
            .filter(|v| !v.trim().is_empty());
        let (field, texts): (String, Vec<&str>) = match (lb_ips, spec_ip) {
            (Some((_, annotation)), Some(_)) => {
                return Err(RequestError::BothRequestedIpForms { annotation });
            }
            (Some((value, annotation)), None) => (
                annotation,
                value.split(',').filter(|s| !s.trim().is_empty()).collect(),
            ),
            (None, Some(ip)) => ("spec.loadBalancerIP".into(), vec![ip]),
            (None, None) => (String::new(), Vec::new()),
        };
        for text in texts {
            let ip = parse_ip(&field, text)?;
            let family = Family::of(ip);
            if let Some(&first) = self
                .requested_ips
                .iter()
                .find(|&&r| Family::of(r) == family)
            {
                return Err(RequestError::TwoOfOneFamily {
                    field,
                    family,
                    first,
                    second: ip,
                });
            }
            if !self.wants_family(family) {
                return Err(RequestError::FamilyNotInService {
                    field,
                    ip,
                    families: self.families(),
                    policy: self.family_policy,
                });
            }
            self.requested_ips.push(ip);
        }
        if !self.requested_ips.is_empty() && self.family_policy == FamilyPolicy::RequireDualStack {
            for family in self.families() {
                if !self
                    .requested_ips
                    .iter()
                    .any(|&ip| Family::of(ip) == family)
                {
                    return Err(RequestError::MissingRequestedFamily { field, family });
                }
            }
        }
        Ok(())
    }
}

/// `spec.ipFamilies`, each at most once; IPv4 when empty.
fn ip_families(spec: &ServiceSpec) -> Result<Vec<Family>, RequestError> {
    let mut ip_families = Vec::new();
    for (i, text) in spec.ip_families.iter().flatten().enumerate() {
        let family = match text.as_str() {
            "IPv4" => Family::V4,
            "IPv6" => Family::V6,
            other => {
                return Err(RequestError::UnknownValue {
                    field: format!("spec.ipFamilies[{i}]"),
                    value: other.to_string(),
                    expected: "IPv4, IPv6",
                });
            }
        };
        if ip_families.contains(&family) {
            return Err(RequestError::DuplicateFamily(family));
        }
        ip_families.push(family);
    }
    if ip_families.is_empty() {
        ip_families.push(Family::V4);
    }
    Ok(ip_families)
}

fn family_policy(spec: &ServiceSpec) -> Result<FamilyPolicy, RequestError> {
    match spec.ip_family_policy.as_deref() {
        None | Some("SingleStack") => Ok(FamilyPolicy::SingleStack),
        Some("PreferDualStack") => Ok(FamilyPolicy::PreferDualStack),
        Some("RequireDualStack") => Ok(FamilyPolicy::RequireDualStack),
        Some(other) => Err(RequestError::UnknownValue {
            field: "spec.ipFamilyPolicy".into(),
            value: other.to_string(),
            expected: "SingleStack, PreferDualStack, RequireDualStack",
        }),
    }
}

/// The distinct protocol and port pairs of `spec.ports`.
fn ports(spec: &ServiceSpec) -> Result<Vec<ProtocolPort>, RequestError> {
    let mut ports = Vec::new();
    for (i, port) in spec.ports.iter().flatten().enumerate() {
        let protocol = match port.protocol.as_deref() {
            None | Some("TCP") => Protocol::Tcp,
            Some("UDP") => Protocol::Udp,
            Some("SCTP") => Protocol::Sctp,
            Some(other) => {
                return Err(RequestError::UnknownValue {
                    field: format!("spec.ports[{i}].protocol"),
                    value: other.to_string(),
                    expected: "TCP, UDP, SCTP",
                });
            }
        };
        let number = u16::try_from(port.port)
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| RequestError::BadPort {
                field: format!("spec.ports[{i}].port"),
                value: port.port,
            })?;
        let pair = ProtocolPort {
            protocol,
            port: number,
        };
        if !ports.contains(&pair) {
            ports.push(pair);
        }
    }
    Ok(ports)
}

/// Where traffic goes: `spec.externalTrafficPolicy`.
fn backend(spec: &ServiceSpec) -> Result<Backend, RequestError> {
    match spec.external_traffic_policy.as_deref() {
        None | Some("Cluster") => Ok(Backend::Cluster),
        Some("Local") => Ok(Backend::Local(spec.selector.clone().unwrap_or_default())),
        Some(other) => Err(RequestError::UnknownValue {
            field: "spec.externalTrafficPolicy".into(),
            value: other.to_string(),
            expected: "Cluster, Local",
        }),
    }
}
