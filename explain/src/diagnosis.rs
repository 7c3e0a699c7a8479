//! What is wrong on the way to a Service's pods, said so a user can act on it: the object and
//! field at fault, what is wrong, and what to do.

use std::fmt;

use serde::Serialize;

/// One problem found. Serialized as part of `-o json`; `code` is the stable part scripts match.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Diagnosis {
    /// What kind of problem, stable across releases.
    pub code: Code,
    /// The object at fault.
    pub object: ObjectRef,
    /// The field (or annotation) at fault, if one is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// What is wrong.
    pub problem: String,
    /// What to do about it.
    pub fix: String,
}

/// The kinds of [`Diagnosis`]; serialized in kebab case (`pool-exhausted`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Code {
    /// No pool may give the Service an address (serviceAllocation, autoAssign).
    NoPoolMatches,
    /// The pool(s) the Service may use have no free address.
    PoolExhausted,
    /// A requested IP is in no pool, or not in the annotated one.
    IpOutsidePools,
    /// `metallb.io/address-pool` names a pool that does not exist.
    UnknownPool,
    /// The pool the Service names does not admit it.
    PoolDoesNotAdmit,
    /// No pool the Service may use has the family it needs.
    NoPoolForFamily,
    /// The IP is held by another Service, and sharing is refused.
    SharingRefused,
    /// The Service's annotations or fields cannot be read.
    BadRequest,
    /// The Service could get an address, but the controller has not given it one.
    NotAssignedYet,
    /// Any other reason the allocator gives.
    AllocationFailed,
    /// No L2Advertisement or BGPAdvertisement covers the Service's pool.
    NoAdvertisement,
    /// An advertisement covers the pool, yet no speaker announces the Service.
    NotAnnounced,
    /// `externalTrafficPolicy: Local` and the layer 2 owner has no ready endpoint.
    LocalWithoutEndpoint,
    /// A configuration object is invalid and left out (ConfigurationState says so too).
    ConfigLeftOut,
    /// No speaker is alive (on the nodes that matter): nothing is announced from them.
    NoSpeaker,
    /// The nodes the advertisements select are excluded (label or NetworkUnavailable).
    NodeExcluded,
    /// A speaker does not hear a quorum of the others: it owns no layer 2 IP.
    SpeakerCutOff,
    /// A BGP session that should carry the Service is not Established.
    PeerNotEstablished,
    /// A live speaker's report could not be read.
    SpeakerUnreachable,
    /// Node addresses: the status differs from what the nodes give now.
    NodeAddressesBehind,
    /// Node addresses: no node can serve the Service.
    NoNodeAddress,
    /// Node addresses: an address in the status that no kube-proxy rule serves (no node's
    /// address, or `ipMode: Proxy`).
    NotANodeAddress,
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The same spelling as in JSON.
        let text = serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        f.write_str(&text)
    }
}

/// A Kubernetes object, named as `kubectl` names it: `IPAddressPool metallb-system/default`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct ObjectRef {
    /// Kind, e.g. `Service`.
    pub kind: String,
    /// Namespace; none for cluster-scoped objects.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
}

impl ObjectRef {
    /// A namespaced object.
    pub fn namespaced(kind: &str, namespace: &str, name: &str) -> Self {
        Self {
            kind: kind.to_string(),
            namespace: Some(namespace.to_string()),
            name: name.to_string(),
        }
    }

    /// A Node (cluster-scoped).
    pub fn node(name: &str) -> Self {
        Self {
            kind: "Node".to_string(),
            namespace: None,
            name: name.to_string(),
        }
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.kind, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

impl fmt::Display for Diagnosis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.object)?;
        if let Some(field) = &self.field {
            write!(f, " {field}")?;
        }
        let mut fix = self.fix.chars();
        let fix: String = fix
            .next()
            .map(|c| c.to_uppercase().chain(fix).collect())
            .unwrap_or_default();
        write!(f, ": {} ({}). {fix}.", self.problem, self.code)
    }
}
