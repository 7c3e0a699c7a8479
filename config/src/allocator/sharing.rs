//! IP sharing (`metallb.io/allow-shared-ip`): when two Services may hold the same address.
//!
//! Both must carry the same non-empty key, their (protocol, port) pairs must not overlap, and
//! their backends must match: both `externalTrafficPolicy: Cluster`, or both `Local` with
//! identical selectors.

use std::fmt;
use std::sync::Arc;

use super::request::{Backend, ProtocolPort, ServiceRequest};

/// What a Service that holds an IP brings to sharing. Only kept for Services with a key: a
/// Service without one never shares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Sharing {
    pub(crate) key: Arc<str>,
    pub(crate) ports: Vec<ProtocolPort>,
    pub(crate) backend: Backend,
}

/// A view of a Service's sharing terms, without copying them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SharingTerms<'a> {
    pub(crate) key: &'a Arc<str>,
    pub(crate) ports: &'a [ProtocolPort],
    pub(crate) backend: &'a Backend,
}

impl Sharing {
    /// The terms of a request, if it has a sharing key.
    pub(crate) fn of(request: &ServiceRequest) -> Option<Self> {
        request.effective_sharing_key().map(|key| Sharing {
            key: key.clone(),
            ports: request.ports.clone(),
            backend: request.backend.clone(),
        })
    }

    pub(crate) fn terms(&self) -> SharingTerms<'_> {
        SharingTerms {
            key: &self.key,
            ports: &self.ports,
            backend: &self.backend,
        }
    }

    /// Whether these are exactly the terms of the request.
    pub(crate) fn same_as(this: Option<&Self>, request: &ServiceRequest) -> bool {
        match (this, terms_of(request)) {
            (None, None) => true,
            (Some(s), Some(t)) => s.key == *t.key && s.ports == t.ports && s.backend == *t.backend,
            _ => false,
        }
    }
}

/// The sharing terms of a request, if it has a key.
pub(crate) fn terms_of(request: &ServiceRequest) -> Option<SharingTerms<'_>> {
    request.effective_sharing_key().map(|key| SharingTerms {
        key,
        ports: &request.ports,
        backend: &request.backend,
    })
}

/// Why a Service may not share an IP with the Service holding it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShareConflict {
    /// The Service asking has no `metallb.io/allow-shared-ip`.
    NoKey,
    /// The Service holding the IP has no `metallb.io/allow-shared-ip`.
    HolderHasNoKey,
    /// The keys differ.
    DifferentKey {
        /// Key of the Service asking.
        ours: String,
        /// Key of the holder.
        theirs: String,
    },
    /// Both use this (protocol, port).
    PortOverlap(ProtocolPort),
    /// Traffic policies or selectors differ.
    BackendMismatch {
        /// Backend of the Service asking.
        ours: Backend,
        /// Backend of the holder.
        theirs: Backend,
    },
}

impl fmt::Display for ShareConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShareConflict::NoKey => {
                f.write_str("this Service has no metallb.io/allow-shared-ip annotation")
            }
            ShareConflict::HolderHasNoKey => {
                f.write_str("the holder has no metallb.io/allow-shared-ip annotation")
            }
            ShareConflict::DifferentKey { ours, theirs } => write!(
                f,
                "the sharing keys differ (metallb.io/allow-shared-ip {ours:?} here, {theirs:?} there)"
            ),
            ShareConflict::PortOverlap(port) => write!(f, "both Services use port {port}"),
            ShareConflict::BackendMismatch { ours, theirs } => write!(
                f,
                "the backends differ ({ours} here, {theirs} there); both must be Cluster, or Local with the same selector"
            ),
        }
    }
}

/// Why `ours` may not share an IP with `theirs`, or `None` when it may.
pub(crate) fn conflict(
    ours: Option<SharingTerms<'_>>,
    theirs: Option<SharingTerms<'_>>,
) -> Option<ShareConflict> {
    let Some(ours) = ours else {
        return Some(ShareConflict::NoKey);
    };
    let Some(theirs) = theirs else {
        return Some(ShareConflict::HolderHasNoKey);
    };
    if ours.key != theirs.key {
        return Some(ShareConflict::DifferentKey {
            ours: ours.key.to_string(),
            theirs: theirs.key.to_string(),
        });
    }
    // Port lists are a handful of entries: a nested scan beats sorting.
    if let Some(&port) = ours.ports.iter().find(|p| theirs.ports.contains(p)) {
        return Some(ShareConflict::PortOverlap(port));
    }
    if ours.backend != theirs.backend {
        return Some(ShareConflict::BackendMismatch {
            ours: ours.backend.clone(),
            theirs: theirs.backend.clone(),
        });
    }
    None
}
