//! Watches of the objects the speaker plans from, cached in reflector stores. Every change wakes
//! the work loop; configuration changes also mark the configuration for re-validation.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::l2::presence::selector;
use crate::view::{trim_node, trim_service, trim_slice};
use ferrolb_config::model::{Config, PeerPassword};
use ferrolb_config::validate::{NodeInfo, Validated};
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

/// Watches that must list before the speaker acts: Services, EndpointSlices, Nodes, presence
/// Leases and the configuration's (Secrets are watched one by one as BGPPeers name them).
const WATCHES: usize = 4 + ConfigStores::WATCHES;

/// The caches.
pub struct Stores {
    /// Services.
    pub services: Store<Service>,
    /// EndpointSlices.
    pub slices: Store<EndpointSlice>,
    /// Nodes.
    pub nodes: Store<Node>,
    /// The Secrets BGPPeers name (`passwordSecret`), holding only the `password` key.
    pub secrets: NamedSecrets,
    /// The speakers' presence Leases.
    pub presence: Store<Lease>,
    config: ConfigStores,
    synced: Arc<AtomicUsize>,
    config_dirty: Arc<AtomicBool>,
}

impl Stores {
    /// Whether every watch has its initial list.
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Relaxed) >= WATCHES
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
            .map(|n| NodeInfo::from_metadata(&n.metadata))
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
        if first_list {
            self.synced.fetch_add(1, Ordering::Relaxed);
        }
        if config {
            self.config_dirty.store(true, Ordering::Relaxed);
        }
        self.changed.notify_one();
        true
    }
}

/// Watches every `K` (of a namespace, or of the cluster) into a cache, trimming each object
/// (`managedFields` always: the speaker never reads them, and they are about half an object).
fn watch<K>(
    api: Api<K>,
    selector: watcher::Config,
    kind: &'static str,
    wake: &Wake,
    config: bool,
    trim: fn(&mut K),
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
        move |o: &mut K| {
            o.meta_mut().managed_fields = None;
            trim(o);
        },
        move |change| {
            let first = matches!(change, Change::Listed) && !std::mem::replace(&mut counted, true);
            wake.heard(first, config)
        },
    )
}

/// Every object of a kind (no selector).
fn all() -> watcher::Config {
    watcher::Config::default()
}

/// Starts every watch.
pub fn start(client: &Client, namespace: &str, group: &str, changed: Arc<Notify>) -> Stores {
    let wake = Wake {
        changed,
        synced: Arc::new(AtomicUsize::new(0)),
        config_dirty: Arc::new(AtomicBool::new(true)),
    };
    let config_wake = wake.clone();
    let mut counted = false;
    let config = ConfigStores::start(client, namespace, PAGE_SIZE, move |_, change| {
        let first = change == ConfigChange::Listed && !std::mem::replace(&mut counted, true);
        config_wake.heard(first, true)
    });
    Stores {
        // Every Service, EndpointSlice and Node of the cluster is cached: keep only what
        // planning reads (view.rs says what, and a test that planning reads the same).
        services: watch(
            Api::all(client.clone()),
            all(),
            "services",
            &wake,
            false,
            trim_service,
        ),
        slices: watch(
            Api::all(client.clone()),
            all(),
            "endpointslices",
            &wake,
            false,
            trim_slice,
        ),
        // Node labels select advertisements: the configuration is re-read when they change.
        nodes: watch(
            Api::all(client.clone()),
            all(),
            "nodes",
            &wake,
            true,
            trim_node,
        ),
        secrets: NamedSecrets {
            api: Api::namespaced(client.clone(), namespace),
            wake: wake.clone(),
            watches: Mutex::default(),
        },
        // The speakers' presence Leases: the known set of the quorum rule.
        presence: watch(
            Api::namespaced(client.clone(), namespace),
            watcher::Config::default().labels(&selector(group)),
            "leases",
            &wake,
            false,
            |_| {},
        ),
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
