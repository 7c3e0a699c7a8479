//! Watches into reflector caches, and the one watch of the `metallb.io` configuration that both
//! binaries validate from. Each binary says what a change means to its own work loop (a queued
//! work item, a wake-up); the watching, trimming, retrying and caching are the same.

use std::hash::Hash;

use ferrolb_config::crd::{
    BFDProfile, BGPAdvertisement, BGPPeer, Community, IPAddressPool, L2Advertisement,
};
use ferrolb_config::validate::{NodeInfo, Objects};
use futures::{Stream, StreamExt};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

/// What a watch tells its owner.
#[derive(Debug)]
pub enum Change<'a, K> {
    /// An object was listed, added, changed or deleted (the cache already holds the result).
    Object(&'a K),
    /// The watch's initial list (or a re-list) is complete.
    Listed,
}

/// Whether the watch goes on after its owner heard a change: `false` once the owner is gone.
pub type Continue = bool;

/// How a failed watch is retried: 500 ms doubling up to 5 s, each wait scaled by a jitter in
/// [0.5, 1), back to 500 ms once the watch delivers again. kube-runtime's default goes up to 30 s,
/// which after a minute without API server leaves every cache up to 30 s behind once it is back
/// (measured in the lab: a Service created after the API server returned waited for the
/// controller's Service watch to retry); a retry every few seconds costs the API server nothing
/// next to a cluster's kubelets.
#[derive(Debug)]
pub struct WatchBackoff {
    next: std::time::Duration,
    state: u64,
}

impl WatchBackoff {
    /// The first wait.
    pub const MIN: std::time::Duration = std::time::Duration::from_millis(500);
    /// The longest wait (before jitter).
    pub const MAX: std::time::Duration = std::time::Duration::from_secs(5);
}

impl Default for WatchBackoff {
    fn default() -> Self {
        use std::hash::BuildHasher;
        Self {
            next: Self::MIN,
            state: std::collections::hash_map::RandomState::new().hash_one(0u8) | 1,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = std::time::Duration;

    fn next(&mut self) -> Option<Self::Item> {
        // xorshift64: jitter needs spread, not secrecy.
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        let fraction = (self.state >> 11) as f64 / (1u64 << 53) as f64;
        let wait = self.next.mul_f64(0.5 + fraction / 2.0);
        self.next = (self.next * 2).min(Self::MAX);
        Some(wait)
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = Self::MIN;
    }
}

/// Watches `stream` into a new reflector cache, applying `trim` to every object before it is
/// cached (what is trimmed is never held), and calls `on` after each change. A failed watch is
/// logged and retried with backoff; the task ends when `on` returns `false`.
pub fn reflect<K, S, T, F>(stream: S, kind: &'static str, trim: T, on: F) -> Store<K>
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default,
    S: Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
    T: FnMut(&mut K) + Send + 'static,
    F: FnMut(Change<'_, K>) -> Continue + Send + 'static,
{
    reflect_abortable(stream, kind, trim, on).0
}

/// Like [`reflect`], with a handle that stops the watch (for watches that come and go with the
/// configuration, which may never see another event to stop on).
pub fn reflect_abortable<K, S, T, F>(
    stream: S,
    kind: &'static str,
    trim: T,
    on: F,
) -> (Store<K>, tokio::task::AbortHandle)
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default,
    S: Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
    T: FnMut(&mut K) + Send + 'static,
    F: FnMut(Change<'_, K>) -> Continue + Send + 'static,
{
    let (reader, writer) = reflector::store();
    let mut on = on;
    let task = tokio::spawn(async move {
        let stream =
            reflector::reflector(writer, stream.modify(trim)).backoff(WatchBackoff::default());
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            let go_on = match event {
                Ok(Event::Apply(o) | Event::Delete(o) | Event::InitApply(o)) => {
                    on(Change::Object(&o))
                }
                Ok(Event::InitDone) => on(Change::Listed),
                Ok(Event::Init) => true,
                Err(e) => {
                    tracing::warn!(error = %e, watch = kind, "watch failed; retrying");
                    true
                }
            };
            if !go_on {
                return;
            }
        }
    });
    (reader, task.abort_handle())
}

/// Drops what no one reads from a configuration object and that can be large: its field
/// managers and kubectl's copy of the last applied object. Everything else stays: validation
/// reads creation times, deletion marks and finalizers.
pub fn trim_config_object<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// The caches of the `metallb.io` configuration objects in ferrolb's namespace.
pub struct ConfigStores {
    /// IPAddressPools.
    pub pools: Store<IPAddressPool>,
    /// L2Advertisements.
    pub l2: Store<L2Advertisement>,
    /// BGPAdvertisements.
    pub bgp: Store<BGPAdvertisement>,
    /// BGPPeers.
    pub peers: Store<BGPPeer>,
    /// Communities.
    pub communities: Store<Community>,
    /// BFDProfiles.
    pub bfd: Store<BFDProfile>,
}

impl ConfigStores {
    /// How many watches [`ConfigStores::start`] starts (each reports [`Change::Listed`]).
    pub const WATCHES: usize = 6;

    /// Starts one watch per configuration kind in `namespace`, listing `page_size` objects per
    /// page. `on` hears every change with the watch's kind (`"ipaddresspools"`, ...); a change
    /// of any of them means the configuration must be validated again. Each watch calls its
    /// own clone of `on`, so state it keeps is per kind.
    pub fn start<F>(client: &Client, namespace: &str, page_size: u32, on: F) -> Self
    where
        F: FnMut(&'static str, ConfigChange) -> Continue + Clone + Send + 'static,
    {
        Self {
            pools: config_watch(client, namespace, page_size, "ipaddresspools", on.clone()),
            l2: config_watch(client, namespace, page_size, "l2advertisements", on.clone()),
            bgp: config_watch(
                client,
                namespace,
                page_size,
                "bgpadvertisements",
                on.clone(),
            ),
            peers: config_watch(client, namespace, page_size, "bgppeers", on.clone()),
            communities: config_watch(client, namespace, page_size, "communities", on.clone()),
            bfd: config_watch(client, namespace, page_size, "bfdprofiles", on),
        }
    }

    /// The cached objects as validation takes them, with the cluster's `nodes` (which select
    /// advertisements and peers).
    pub fn objects(&self, namespace: &str, nodes: Vec<NodeInfo>) -> Objects {
        Objects {
            namespace: namespace.to_string(),
            pools: cloned(&self.pools),
            l2_advertisements: cloned(&self.l2),
            bgp_advertisements: cloned(&self.bgp),
            peers: cloned(&self.peers),
            communities: cloned(&self.communities),
            bfd_profiles: cloned(&self.bfd),
            nodes: Some(nodes),
        }
    }
}

/// What a configuration watch tells its owner (the object itself is in the cache).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigChange {
    /// An object of the kind changed.
    Changed,
    /// The kind's initial list (or a re-list) is complete.
    Listed,
}

fn config_watch<K, F>(
    client: &Client,
    namespace: &str,
    page_size: u32,
    kind: &'static str,
    on: F,
) -> Store<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Eq + Hash + Clone + Default,
    F: FnMut(&'static str, ConfigChange) -> Continue + Send + 'static,
{
    let mut on = on;
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    reflect(
        watcher(api, watcher::Config::default().page_size(page_size)),
        kind,
        trim_config_object,
        move |change| match change {
            Change::Object(_) => on(kind, ConfigChange::Changed),
            Change::Listed => on(kind, ConfigChange::Listed),
        },
    )
}

/// Every object in `store`, cloned.
pub fn cloned<K>(store: &Store<K>) -> Vec<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    store.state().iter().map(|o| (**o).clone()).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use kube::runtime::utils::Backoff;

    #[test]
    fn watch_retries_double_to_five_seconds_with_jitter_and_reset() {
        let mut b = WatchBackoff::default();
        let waits: Vec<std::time::Duration> = (0..8).map(|_| b.next().unwrap()).collect();
        let mut full = WatchBackoff::MIN;
        for wait in &waits {
            assert!(*wait >= full / 2 && *wait < full, "{wait:?} of {full:?}");
            full = (full * 2).min(WatchBackoff::MAX);
        }
        assert!(waits.iter().all(|w| *w < WatchBackoff::MAX));
        b.reset();
        assert!(b.next().unwrap() < WatchBackoff::MIN);
    }
}
