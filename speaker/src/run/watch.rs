//! Watches of the objects the speaker plans from, cached in reflector stores. Every change wakes
//! the work loop; configuration changes also mark the configuration for re-validation.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use ferrolb_config::crd::{
    BFDProfile, BGPAdvertisement, BGPPeer, Community, IPAddressPool, L2Advertisement,
};
use ferrolb_config::validate::{NodeInfo, Objects, Validated, validate};
use ferrolb_speaker::view::{trim_node, trim_service, trim_slice};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;

/// Watches that must list before the speaker acts.
const WATCHES: usize = 10;

/// The caches.
pub struct Stores {
    /// Services.
    pub services: Store<Service>,
    /// EndpointSlices.
    pub slices: Store<EndpointSlice>,
    /// Nodes.
    pub nodes: Store<Node>,
    /// Secrets of the speaker's namespace, holding only the `password` key (BGPPeer
    /// `passwordSecret`).
    pub secrets: Store<Secret>,
    pools: Store<IPAddressPool>,
    l2: Store<L2Advertisement>,
    bgp: Store<BGPAdvertisement>,
    peers: Store<BGPPeer>,
    communities: Store<Community>,
    bfd: Store<BFDProfile>,
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
        let objects = Objects {
            namespace: namespace.to_string(),
            pools: cloned(&self.pools),
            l2_advertisements: cloned(&self.l2),
            bgp_advertisements: cloned(&self.bgp),
            peers: cloned(&self.peers),
            communities: cloned(&self.communities),
            bfd_profiles: cloned(&self.bfd),
            nodes: Some(
                self.nodes
                    .state()
                    .iter()
                    .map(|n| NodeInfo {
                        name: n.metadata.name.clone().unwrap_or_default(),
                        labels: n.metadata.labels.clone().unwrap_or_default(),
                    })
                    .collect(),
            ),
        };
        validate(&objects)
    }
}

fn cloned<K>(store: &Store<K>) -> Vec<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store.state().iter().map(|o| (**o).clone()).collect()
}

struct Wake {
    changed: Arc<Notify>,
    synced: Arc<AtomicUsize>,
    config_dirty: Option<Arc<AtomicBool>>,
}

fn spawn_watch<K>(api: Api<K>, wake: Wake) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    spawn_watch_trimmed(api, wake, |_| {})
}

/// [`spawn_watch`] with `trim` applied to every object before it is cached.
fn spawn_watch_trimmed<K>(api: Api<K>, wake: Wake, trim: fn(&mut K)) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    let (reader, writer) = reflector::store();
    tokio::spawn(async move {
        // The speaker never reads managedFields; dropping them roughly halves the cache.
        let stream = watcher(api, watcher::Config::default()).modify(move |o: &mut K| {
            o.meta_mut().managed_fields = None;
            trim(o);
        });
        let stream = reflector::reflector(writer, stream).default_backoff();
        futures::pin_mut!(stream);
        let mut counted = false;
        while let Some(event) = stream.next().await {
            match event {
                Ok(Event::InitDone) => {
                    if !counted {
                        counted = true;
                        wake.synced.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Ok(Event::Init | Event::InitApply(_)) => continue,
                Ok(Event::Apply(_) | Event::Delete(_)) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "watch failed; retrying");
                    continue;
                }
            }
            if let Some(dirty) = &wake.config_dirty {
                dirty.store(true, Ordering::Relaxed);
            }
            wake.changed.notify_one();
        }
    });
    reader
}

/// Starts every watch.
pub fn start(client: &Client, namespace: &str, changed: Arc<Notify>) -> Stores {
    let synced = Arc::new(AtomicUsize::new(0));
    let config_dirty = Arc::new(AtomicBool::new(true));
    let state = |config: bool| Wake {
        changed: changed.clone(),
        synced: synced.clone(),
        config_dirty: config.then(|| config_dirty.clone()),
    };
    Stores {
        // Every Service, EndpointSlice and Node of the cluster is cached: keep only what
        // planning reads (view.rs says what, and a test that planning reads the same).
        services: spawn_watch_trimmed(Api::all(client.clone()), state(false), trim_service),
        slices: spawn_watch_trimmed(Api::all(client.clone()), state(false), trim_slice),
        // Node labels select advertisements: the configuration is re-read when they change.
        nodes: spawn_watch_trimmed(Api::all(client.clone()), state(true), trim_node),
        pools: spawn_watch(Api::namespaced(client.clone(), namespace), state(true)),
        l2: spawn_watch(Api::namespaced(client.clone(), namespace), state(true)),
        bgp: spawn_watch(Api::namespaced(client.clone(), namespace), state(true)),
        peers: spawn_watch(Api::namespaced(client.clone(), namespace), state(true)),
        communities: spawn_watch(Api::namespaced(client.clone(), namespace), state(true)),
        bfd: spawn_watch(Api::namespaced(client.clone(), namespace), state(true)),
        // A BGP password may arrive after its BGPPeer: the loop looks at peers again then.
        secrets: spawn_watch_trimmed(
            Api::namespaced(client.clone(), namespace),
            state(false),
            keep_only_password,
        ),
        synced,
        config_dirty,
    }
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
