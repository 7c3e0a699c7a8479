//! Watches of the objects the speaker plans from, cached in reflector stores, or, for Nodes,
//! Services and EndpointSlices (every one of the cluster), in reduced caches that keep only
//! what planning reads of those that concern the speaker. A change of what is kept wakes the
//! work loop; configuration and Node changes also mark the configuration for re-validation.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::l2::presence::selector;
use crate::service_views::Changed;
use crate::view::{NodeView, ServiceObject, SliceObject, slice_service};
use ferrolb_config::allocator::ServiceKey;
use ferrolb_config::model::{Config, PeerPassword};
use ferrolb_config::validate::{NodeInfo, Validated};
use ferrolb_runtime::reduced::{Reduced, reflect_reduced};
use ferrolb_runtime::watch::{
    Change, ConfigChange, ConfigStores, Continue, reflect, reflect_abortable,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::Store;
use kube::runtime::watcher::{self, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;

/// Objects per page of an initial list: a page is held whole while it is decoded.
const PAGE_SIZE: u32 = 500;

/// Watches that must list before the speaker acts: Services, EndpointSlices, Nodes and the
/// configuration's, and the presence Leases when they are watched (Secrets are watched one by
/// one as BGPPeers name them).
const WATCHES: usize = 3 + ConfigStores::WATCHES;

/// The namespace and name of an EndpointSlice (the same pair as a Service's key).
pub type SliceKey = ServiceKey;

/// The caches.
pub struct Stores {
    /// LoadBalancer Services of ours that hold IPs, reduced ([`ServiceObject`]).
    pub services: Reduced<ServiceKey, ServiceObject>,
    /// EndpointSlices that name a Service, reduced ([`SliceObject`]).
    pub slices: Reduced<SliceKey, SliceObject>,
    /// Nodes, reduced ([`NodeView`]), by name.
    pub nodes: Reduced<String, NodeView>,
    /// The Secrets BGPPeers name (`passwordSecret`), holding only the `password` key.
    pub secrets: NamedSecrets,
    /// The speakers' presence Leases (not watched with `--membership=voters`, whose presence
    /// set is the Nodes).
    pub presence: Option<Store<Lease>>,
    /// Which Services the Service and EndpointSlice watches saw change.
    changes: Arc<ServiceChanges>,
    config: ConfigStores,
    synced: Arc<AtomicUsize>,
    config_dirty: Arc<AtomicBool>,
}

impl Stores {
    /// Whether every watch has its initial list.
    pub fn synced(&self) -> bool {
        let watches = WATCHES + usize::from(self.presence.is_some());
        self.synced.load(Ordering::Relaxed) >= watches
    }

    /// Which Services changed (their object or an EndpointSlice of theirs) since the last
    /// call: all of them after a watch listed again (a gap may hide deletes).
    pub fn take_changed(&self) -> Changed {
        let mut changed = self
            .changes
            .changed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        std::mem::replace(&mut changed, Changed::Keys(BTreeSet::new()))
    }

    /// The cached Service `key`.
    pub fn service(&self, key: &ServiceKey) -> Option<Arc<ServiceObject>> {
        self.services.get(key)
    }

    /// The cached EndpointSlices of Service `key`, found through the names its watch saw (a
    /// name no longer cached is forgotten here).
    pub fn slices_of(&self, key: &ServiceKey) -> Vec<Arc<SliceObject>> {
        let mut index = self
            .changes
            .slices
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(names) = index.get_mut(key) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        names.retain(|name| {
            match self
                .slices
                .get(&SliceKey::new(key.namespace(), name.as_str()))
            {
                // The label that names the Service does not change, but check it anyway.
                Some(slice) if slice.service == *key => {
                    out.push(slice);
                    true
                }
                _ => false,
            }
        });
        if names.is_empty() {
            index.remove(key);
        }
        out
    }

    /// Whether the configuration changed since the last call.
    pub fn take_config_dirty(&self) -> bool {
        self.config_dirty.swap(false, Ordering::Relaxed)
    }

    /// Validates the cached configuration objects.
    pub fn validated(&self, namespace: &str) -> Validated {
        let nodes = self
            .nodes
            .state()
            .iter()
            .map(|n| NodeInfo {
                name: n.name.clone(),
                labels: n.labels.clone(),
            })
            .collect();
        self.config.validate(&self.config.objects(namespace, nodes))
    }
}

/// How a watch wakes the work loop.
#[derive(Clone)]
struct Wake {
    changed: Arc<Notify>,
    synced: Arc<AtomicUsize>,
    config_dirty: Arc<AtomicBool>,
}

impl Wake {
    /// Counts a watch's first initial list (`first_list`; a re-list is not counted again),
    /// marks the configuration for re-validation when `config` says the change touches it,
    /// and wakes the loop.
    fn heard(&self, first_list: bool, config: bool) -> Continue {
        self.count(first_list, config);
        self.changed.notify_one();
        true
    }

    /// [`Wake::heard`] without waking the loop: for what the loop's periodic check reads
    /// anyway (the presence Leases: their renewals, N/10 a second cluster-wide, would each
    /// wake a full step on every speaker, N²/10 steps a second, for a known set that rarely
    /// changes; the check every heartbeat interval reads the set and replans when it does).
    /// Its first list still wakes the loop: it may be the last watch to sync, and the first
    /// step waits for all of them.
    fn counted(&self, first_list: bool) -> Continue {
        self.count(first_list, false);
        if first_list {
            self.changed.notify_one();
        }
        true
    }

    fn count(&self, first_list: bool, config: bool) {
        if first_list {
            self.synced.fetch_add(1, Ordering::Relaxed);
        }
        if config {
            self.config_dirty.store(true, Ordering::Relaxed);
        }
    }
}

/// Which Services the watches saw change, and the EndpointSlices seen for each.
struct ServiceChanges {
    changed: Mutex<Changed>,
    /// The names of the EndpointSlices seen for each Service, so a step finds a Service's
    /// slices without a pass over all of them.
    slices: Mutex<HashMap<ServiceKey, BTreeSet<String>>>,
}

impl ServiceChanges {
    fn mark(&self, key: ServiceKey) {
        if let Ok(mut changed) = self.changed.lock() {
            changed.mark(key);
        }
    }

    fn all(&self) {
        if let Ok(mut changed) = self.changed.lock() {
            *changed = Changed::All;
        }
    }

    /// A Service's event: its view may have changed.
    fn service(&self, change: &Change<'_, Service>) {
        match change {
            Change::Object(svc) | Change::Deleted(svc) => self.mark(ServiceKey::new(
                svc.metadata.namespace.as_deref().unwrap_or_default(),
                svc.metadata.name.as_deref().unwrap_or_default(),
            )),
            Change::Listed => self.all(),
        }
    }

    /// An EndpointSlice's event: its Service's view may have changed.
    fn slice(&self, change: &Change<'_, EndpointSlice>) {
        match change {
            Change::Object(slice) | Change::Deleted(slice) => {
                let (Some(key), Some(name)) = (slice_service(slice), slice.metadata.name.clone())
                else {
                    return;
                };
                if let Ok(mut index) = self.slices.lock() {
                    index.entry(key.clone()).or_default().insert(name);
                }
                self.mark(key);
            }
            Change::Listed => self.all(),
        }
    }
}

/// Watches the `K` that `selector` picks in `api` into a cache (without `managedFields`: the
/// speaker never reads them, and they are about half an object). Its changes wake nothing but
/// its first list ([`Wake::counted`]): the periodic check reads the cache.
fn watch_quietly<K>(
    api: Api<K>,
    selector: watcher::Config,
    kind: &'static str,
    wake: &Wake,
) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    let wake = wake.clone();
    let mut counted = false;
    reflect(
        watcher(api, selector),
        kind,
        |o: &mut K| o.meta_mut().managed_fields = None,
        move |change| {
            let first = matches!(change, Change::Listed) && !std::mem::replace(&mut counted, true);
            wake.counted(first)
        },
    )
}

/// The namespace and name of a namespaced object, as a Service's key.
fn service_key<K: Resource>(o: &K) -> ServiceKey {
    let meta = o.meta();
    ServiceKey::new(
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
    )
}

/// Watches every `K` of the cluster into a reduced cache: `reduce` says what is kept of each
/// object (nothing, for most). `observe` hears each change before the loop is woken; an event
/// that leaves the kept value as it was (most Service and EndpointSlice updates of a cluster
/// concern nothing the speaker keeps) wakes nothing. Values are kept under `key` of their
/// object; `config` says whether a change also marks the configuration for re-validation.
fn watch_reduced<K, Q, V>(
    api: Api<K>,
    kind: &'static str,
    wake: &Wake,
    key: impl Fn(&K) -> Q + Send + 'static,
    reduce: impl FnMut(&K) -> Option<V> + Send + 'static,
    config: bool,
    mut observe: impl FnMut(&Change<'_, K>) + Send + 'static,
) -> Reduced<Q, V>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
    Q: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    V: PartialEq + Send + Sync + 'static,
{
    let wake = wake.clone();
    let mut counted = false;
    reflect_reduced(watcher(api, all()), kind, key, reduce, move |change| {
        observe(&change);
        let first = matches!(change, Change::Listed) && !std::mem::replace(&mut counted, true);
        wake.heard(first, config)
    })
}

/// Every object of a kind (no selector).
fn all() -> watcher::Config {
    watcher::Config::default()
}

/// Starts every watch; the presence Leases of `presence_group` only when given. Services are
/// kept when they are ours by `lb_class` (`--lb-class`).
pub fn start(
    client: &Client,
    namespace: &str,
    presence_group: Option<&str>,
    lb_class: Option<&str>,
    changed: Arc<Notify>,
) -> Stores {
    let wake = Wake {
        changed,
        synced: Arc::new(AtomicUsize::new(0)),
        config_dirty: Arc::new(AtomicBool::new(true)),
    };
    let config_wake = wake.clone();
    let changes = Arc::new(ServiceChanges {
        changed: Mutex::new(Changed::All),
        slices: Mutex::default(),
    });
    let (on_service, on_slice) = (changes.clone(), changes.clone());
    let mut counted = false;
    let config = ConfigStores::start(client, namespace, PAGE_SIZE, move |_, change| {
        let first = change == ConfigChange::Listed && !std::mem::replace(&mut counted, true);
        config_wake.heard(first, true)
    });
    Stores {
        // Every Service, EndpointSlice and Node of the cluster is watched: keep only what
        // planning reads (view.rs says what), and of Services and EndpointSlices only those
        // that can concern a layer 2 or BGP announcement.
        services: {
            let lb_class = lb_class.map(str::to_string);
            watch_reduced(
                Api::all(client.clone()),
                "services",
                &wake,
                service_key,
                move |svc: &Service| ServiceObject::reduce(svc, lb_class.as_deref()),
                false,
                move |c| on_service.service(c),
            )
        },
        slices: watch_reduced(
            Api::all(client.clone()),
            "endpointslices",
            &wake,
            service_key,
            SliceObject::reduce,
            false,
            move |c| on_slice.slice(c),
        ),
        // Node labels select advertisements: the configuration is re-read when they change.
        // A kubelet's status update that changes no view (most of them) wakes nothing.
        nodes: watch_reduced(
            Api::all(client.clone()),
            "nodes",
            &wake,
            |node: &Node| node.metadata.name.clone().unwrap_or_default(),
            NodeView::reduce,
            true,
            |_| {},
        ),
        secrets: NamedSecrets {
            api: Api::namespaced(client.clone(), namespace),
            wake: wake.clone(),
            watches: Mutex::default(),
        },
        // The speakers' presence Leases: the known set of the quorum rule. Their renewals wake
        // nothing: the membership check every heartbeat interval reads them.
        presence: presence_group.map(|group| {
            watch_quietly(
                Api::namespaced(client.clone(), namespace),
                watcher::Config::default().labels(&selector(group)),
                "leases",
                &wake,
            )
        }),
        changes,
        config,
        synced: wake.synced,
        config_dirty: wake.config_dirty,
    }
}

/// The Secrets that BGPPeers name, each watched by name (a `metadata.name` field selector): the
/// speaker never lists, watches or holds the other Secrets of its namespace. Watches start and
/// stop as the configuration names Secrets or stops naming them.
pub struct NamedSecrets {
    api: Api<Secret>,
    wake: Wake,
    watches: Mutex<BTreeMap<String, (Store<Secret>, tokio::task::AbortHandle)>>,
}

impl NamedSecrets {
    /// Watches exactly the Secrets `names` (starting the new ones, stopping the others).
    pub fn want(&self, names: &BTreeSet<String>) {
        let Ok(mut watches) = self.watches.lock() else {
            return;
        };
        watches.retain(|name, (_, task)| {
            let keep = names.contains(name);
            if !keep {
                task.abort();
            }
            keep
        });
        for name in names {
            if watches.contains_key(name) {
                continue;
            }
            let wake = self.wake.clone();
            // A BGP password may arrive after its BGPPeer: the loop looks at peers again then.
            let watched = reflect_abortable(
                watcher(
                    self.api.clone(),
                    watcher::Config::default().fields(&format!("metadata.name={name}")),
                ),
                "secrets",
                |s: &mut Secret| {
                    s.metadata.managed_fields = None;
                    keep_only_password(s);
                },
                move |_| wake.heard(false, false),
            );
            watches.insert(name.clone(), watched);
        }
    }

    /// The Secret `name`, if it is watched and exists.
    pub fn get(&self, name: &str) -> Option<Arc<Secret>> {
        let watches = self.watches.lock().ok()?;
        let (store, _) = watches.get(name)?;
        store
            .state()
            .into_iter()
            .find(|s| s.metadata.name.as_deref() == Some(name))
    }
}

impl Drop for NamedSecrets {
    fn drop(&mut self) {
        if let Ok(watches) = self.watches.lock() {
            for (_, task) in watches.values() {
                task.abort();
            }
        }
    }
}

/// The Secrets of `namespace` that the configuration takes keys from: BGPPeers' passwords and
/// BFDProfiles' authentication keys (both under the key `password`).
pub fn password_secrets(config: &Config, namespace: &str) -> BTreeSet<String> {
    let bgp = config.peers.values().filter_map(|p| match &p.password {
        Some(PeerPassword::Secret {
            name,
            namespace: ns,
        }) if ns == namespace => Some(name.clone()),
        _ => None,
    });
    let bfd = config
        .bfd_profiles
        .values()
        .filter_map(|p| p.authentication.as_ref().map(|a| a.secret.clone()));
    bgp.chain(bfd).collect()
}

/// Drops everything of a Secret but its `password` key and type: the speaker has no use for
/// other Secrets' contents and should not hold them.
fn keep_only_password(secret: &mut Secret) {
    if let Some(data) = &mut secret.data {
        data.retain(|k, _| k == "password");
    }
    secret.string_data = None;
    secret.metadata.annotations = None;
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    fn woke(wake: &Wake) -> bool {
        // A `notify_one` with no waiter leaves a permit: the next `notified` completes at once.
        wake.changed.notified().now_or_never().is_some()
    }

    #[test]
    fn presence_renewals_count_the_sync_but_wake_no_step() {
        let wake = Wake {
            changed: Arc::new(Notify::new()),
            synced: Arc::new(AtomicUsize::new(0)),
            config_dirty: Arc::new(AtomicBool::new(false)),
        };
        // The first list wakes (it may be the last watch to sync) and counts.
        wake.counted(true);
        assert!(woke(&wake));
        assert_eq!(wake.synced.load(Ordering::Relaxed), 1);
        // A renewal wakes nothing and dirties no configuration.
        wake.counted(false);
        assert!(!woke(&wake));
        assert!(!wake.config_dirty.load(Ordering::Relaxed));
        // Other kinds wake a step.
        wake.heard(false, true);
        assert!(woke(&wake));
        assert!(wake.config_dirty.load(Ordering::Relaxed));
    }
}
