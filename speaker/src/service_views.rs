//! The Service views (`view::ServiceView`) kept between steps of the work loop, rebuilt only
//! for the Services whose Service or EndpointSlices the watches saw change. Rebuilding every
//! view at every step cost a pass over every cached Service and EndpointSlice per change (issue
//! #40); a re-list of either watch, whose gaps may hide deletes, rebuilds them all.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::l2::step;
use crate::view::{ServiceObject, ServiceView, SliceObject};
use ferrolb_config::allocator::ServiceKey;

/// The views by Service.
pub type ViewMap = BTreeMap<ServiceKey, Arc<ServiceView>>;

/// Which Services changed since the last step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Changed {
    /// Any of them (the first step, or a watch listed again).
    #[default]
    All,
    /// These.
    Keys(BTreeSet<ServiceKey>),
}

impl Changed {
    /// Adds `key`.
    pub fn mark(&mut self, key: ServiceKey) {
        if let Changed::Keys(keys) = self {
            keys.insert(key);
        }
    }

    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        matches!(self, Changed::Keys(keys) if keys.is_empty())
    }
}

/// Where the views are built from: the watch caches, which keep Services and EndpointSlices
/// reduced (`view::ServiceObject`, `view::SliceObject`).
pub(crate) trait Source {
    /// Every cached Service.
    fn services(&self) -> Vec<Arc<ServiceObject>>;
    /// Every cached EndpointSlice.
    fn slices(&self) -> Vec<Arc<SliceObject>>;
    /// The cached Service `key` (by default found among all of them).
    fn service(&self, key: &ServiceKey) -> Option<Arc<ServiceObject>> {
        self.services().into_iter().find(|s| s.key == *key)
    }
    /// The cached EndpointSlices of Service `key` (by default found among all of them).
    fn slices_of(&self, key: &ServiceKey) -> Vec<Arc<SliceObject>> {
        self.slices()
            .into_iter()
            .filter(|s| s.service == *key)
            .collect()
    }
    /// Which Services changed since the last call (by default: any).
    fn take_changed(&self) -> Changed {
        Changed::All
    }
}

/// The views (each with its Service's UID), kept between steps.
#[derive(Debug, Default)]
pub struct ServiceViews {
    views: ViewMap,
    /// Changes whenever a UID does.
    uids_generation: u64,
}

impl ServiceViews {
    /// The views.
    pub fn views(&self) -> &ViewMap {
        &self.views
    }

    /// The UID of viewed Service `key` (Events attach to a Service's incarnation).
    pub fn uid(&self, key: &ServiceKey) -> Option<String> {
        self.views.get(key).and_then(|v| v.uid.clone())
    }

    /// Changes whenever a Service's UID does (a Service made again under its name has the
    /// same view but another UID).
    pub fn uids_generation(&self) -> u64 {
        self.uids_generation
    }

    /// Brings the views up to date with `source` for the Services `changed`; returns the
    /// Services whose view changed (came, went or differs), or [`Changed::All`] after a
    /// rebuild of every view.
    pub(crate) fn refresh(&mut self, source: &impl Source, changed: Changed) -> Changed {
        let keys = match changed {
            Changed::All => {
                let all = step::views(&source.services(), &source.slices());
                self.uids_generation += 1;
                self.views = all
                    .into_iter()
                    .map(|v| (v.key.clone(), Arc::new(v)))
                    .collect();
                return Changed::All;
            }
            Changed::Keys(keys) => keys,
        };
        let mut out = BTreeSet::new();
        for key in keys {
            let slices = source.slices_of(&key);
            let view = source
                .service(&key)
                .map(|svc| ServiceView::from_objects(&svc, slices.iter().map(Arc::as_ref)));
            match view {
                Some(view) => {
                    let old = self.views.get(&key);
                    if old.is_none_or(|old| old.uid != view.uid) {
                        self.uids_generation += 1;
                    }
                    if old.is_none_or(|old| **old != view) {
                        self.views.insert(key.clone(), Arc::new(view));
                        out.insert(key);
                    }
                }
                None => {
                    if self.views.remove(&key).is_some() {
                        self.uids_generation += 1;
                        out.insert(key);
                    }
                }
            }
        }
        Changed::Keys(out)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use ferrolb_testkit::objects;
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use proptest::prelude::*;

    /// Caches as plain lists of whole objects, reduced as the watches reduce them.
    #[derive(Default)]
    struct Caches {
        services: Vec<Arc<Service>>,
        slices: Vec<Arc<EndpointSlice>>,
    }

    impl Source for Caches {
        fn services(&self) -> Vec<Arc<ServiceObject>> {
            ServiceObject::reduce_all(&self.services, None)
        }
        fn slices(&self) -> Vec<Arc<SliceObject>> {
            SliceObject::reduce_all(&self.slices)
        }
    }

    fn service(i: u8, ip: Option<u8>) -> Arc<Service> {
        let ips: Vec<String> = ip.map(|n| format!("198.18.200.{n}")).into_iter().collect();
        let ips: Vec<&str> = ips.iter().map(String::as_str).collect();
        Arc::new(
            objects::service(&format!("s{i}"))
                .namespace("default")
                .uid(&format!("uid-{i}"))
                .ingress(&ips)
                .build(),
        )
    }

    fn slice(i: u8, part: u8, node: u8, ready: bool) -> Arc<EndpointSlice> {
        Arc::new(
            objects::endpoint_slice(&format!("s{i}-{part}"))
                .namespace("default")
                .service(&format!("s{i}"))
                .endpoint(
                    objects::endpoint(&format!("10.0.{i}.{part}"))
                        .node(&format!("node{node}"))
                        .ready(ready),
                )
                .build(),
        )
    }

    #[derive(Clone, Debug)]
    enum Edit {
        /// Service i: holding an IP, or none (not viewed), or deleted.
        Service(u8, Option<Option<u8>>),
        /// Slice part of Service i on a node, ready or not; or deleted.
        Slice(u8, u8, Option<(u8, bool)>),
    }

    fn edit() -> impl Strategy<Value = Edit> {
        prop_oneof![
            (0u8..5, prop::option::of(prop::option::of(0u8..4)))
                .prop_map(|(i, s)| Edit::Service(i, s)),
            (0u8..5, 0u8..2, prop::option::of((1u8..4, any::<bool>())))
                .prop_map(|(i, p, s)| Edit::Slice(i, p, s)),
        ]
    }

    proptest! {
        /// Views refreshed for the Services the edits touched (as the watches mark them) equal
        /// views rebuilt from every cached object.
        #[test]
        fn refreshing_what_changed_equals_rebuilding_everything(
            batches in prop::collection::vec(prop::collection::vec(edit(), 0..4), 1..15),
        ) {
            let mut caches = Caches::default();
            let mut kept = ServiceViews::default();
            kept.refresh(&caches, Changed::All);
            for batch in batches {
                let mut changed = Changed::Keys(BTreeSet::new());
                for e in batch {
                    let (i, name) = match &e {
                        Edit::Service(i, _) => (*i, format!("s{i}")),
                        Edit::Slice(i, p, _) => (*i, format!("s{i}-{p}")),
                    };
                    changed.mark(ServiceKey::new("default", format!("s{i}").as_str()));
                    match e {
                        Edit::Service(_, what) => {
                            caches.services.retain(|s| s.metadata.name.as_deref() != Some(&name));
                            if let Some(ip) = what {
                                caches.services.push(service(i, ip));
                            }
                        }
                        Edit::Slice(_, p, what) => {
                            caches.slices.retain(|s| s.metadata.name.as_deref() != Some(&name));
                            if let Some((node, ready)) = what {
                                caches.slices.push(slice(i, p, node, ready));
                            }
                        }
                    }
                }
                let nothing = changed.is_empty();
                let out = kept.refresh(&caches, changed);
                let mut full = ServiceViews::default();
                full.refresh(&caches, Changed::All);
                prop_assert_eq!(&kept.views, &full.views);
                if nothing {
                    prop_assert!(out.is_empty());
                }
            }
        }
    }

    #[test]
    fn only_views_that_differ_are_reported_changed() {
        let mut caches = Caches {
            services: vec![service(1, Some(1)), service(2, Some(2))],
            slices: vec![slice(1, 0, 1, true)],
        };
        let mut kept = ServiceViews::default();
        assert_eq!(kept.refresh(&caches, Changed::All), Changed::All);
        let key = |i: u8| ServiceKey::new("default", format!("s{i}").as_str());
        // A slice update that changes nothing planning reads.
        let same = kept.refresh(&caches, Changed::Keys([key(1)].into()));
        assert!(same.is_empty());
        caches.slices = vec![slice(1, 0, 2, true)];
        let moved = kept.refresh(&caches, Changed::Keys([key(1)].into()));
        assert_eq!(moved, Changed::Keys([key(1)].into()));
        caches
            .services
            .retain(|s| s.metadata.name.as_deref() != Some("s2"));
        let gone = kept.refresh(&caches, Changed::Keys([key(2)].into()));
        assert_eq!(gone, Changed::Keys([key(2)].into()));
        assert!(!kept.views().contains_key(&key(2)));
        assert_eq!(kept.uid(&key(2)), None);
        assert_eq!(kept.uid(&key(1)).as_deref(), Some("uid-1"));
    }
}
