//! Watches into reflector caches, and the one watch of the `metallb.io` configuration that both
//! binaries validate from. Each binary says what a change means to its own work loop (a queued
//! work item, a wake-up); the watching, trimming, retrying and caching are the same.
//!
//! The configuration is watched as untyped objects and decoded one object at a time
//! ([`Decoder`]): an object that the CRD's schema admits but ferrolb's types refuse is left out
//! (or, if an earlier version of it was read, that version stays in use) and reported as a
//! configuration error naming it and the field, while the others of its kind work on. Decoded by
//! the watch itself, one such object would fail every list of its kind, and the kind would
//! never be read.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use ferrolb_config::crd::{
    BFDProfile, BGPAdvertisement, BGPPeer, Community, IPAddressPool, L2Advertisement,
};
use ferrolb_config::validate::{ConfigError, Kind, NodeInfo, ObjectRef, Objects, Validated};
use futures::{Stream, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

/// What a watch tells its owner.
#[derive(Debug)]
pub enum Change<'a, K> {
    /// An object was listed, added or changed (the cache already holds it).
    Object(&'a K),
    /// An object was deleted (the cache no longer holds it): its last state.
    Deleted(&'a K),
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
                Ok(Event::Apply(o) | Event::InitApply(o)) => on(Change::Object(&o)),
                Ok(Event::Delete(o)) => on(Change::Deleted(&o)),
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
    /// The objects that cannot be decoded, of every kind ([`ConfigStores::validate`] reports
    /// them).
    pub refused: Refusals,
}

/// The configuration objects that cannot be decoded, each with why: shared by the six watches.
pub type Refusals = Arc<Mutex<BTreeMap<ObjectRef, ConfigError>>>;

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
        let refused = Refusals::default();
        let watch = ConfigWatch {
            client,
            namespace,
            page_size,
            refused: &refused,
        };
        Self {
            pools: watch.start(Kind::IPAddressPool, "ipaddresspools", on.clone()),
            l2: watch.start(Kind::L2Advertisement, "l2advertisements", on.clone()),
            bgp: watch.start(Kind::BGPAdvertisement, "bgpadvertisements", on.clone()),
            peers: watch.start(Kind::BGPPeer, "bgppeers", on.clone()),
            communities: watch.start(Kind::Community, "communities", on.clone()),
            bfd: watch.start(Kind::BFDProfile, "bfdprofiles", on),
            refused,
        }
    }

    /// Validates `objects` (from [`ConfigStores::objects`]) and adds an error for each object
    /// that cannot be decoded.
    pub fn validate(&self, objects: &Objects) -> Validated {
        with_refusals(
            ferrolb_config::validate::validate(objects),
            self.refused
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .values(),
        )
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

/// `validated` with an error for each of `refused`; an object refused with no earlier version
/// in use is left out.
fn with_refusals<'a>(
    mut validated: Validated,
    refused: impl IntoIterator<Item = &'a ConfigError>,
) -> Validated {
    for e in refused {
        if !e.message.ends_with(KEPT) {
            validated.left_out.insert(e.object.clone());
        }
        validated.errors.push(e.clone());
    }
    validated
}

/// What ends a refusal's message when an earlier version of the object stays in use.
const KEPT: &str = "; the version read before stays in use";

/// What the six configuration watches share.
struct ConfigWatch<'a> {
    client: &'a Client,
    namespace: &'a str,
    page_size: u32,
    refused: &'a Refusals,
}

impl ConfigWatch<'_> {
    /// Watches the objects of `kind` (`plural`, as logs name the watch), decoding each.
    fn start<K, F>(&self, kind: Kind, plural: &'static str, on: F) -> Store<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
        F: FnMut(&'static str, ConfigChange) -> Continue + Send + 'static,
    {
        let mut on = on;
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            self.namespace,
            &ApiResource::erase::<K>(&()),
        );
        let page_size = self.page_size;
        let (reader, mut writer) = reflector::store();
        let cache = reader.clone();
        let refused = self.refused.clone();
        tokio::spawn(async move {
            let mut decoder = Decoder::<K>::new(kind);
            let mut recheck = Recheck::default();
            'watch: loop {
                let events = watcher(api.clone(), watcher::Config::default().page_size(page_size))
                    .backoff(WatchBackoff::default());
                futures::pin_mut!(events);
                loop {
                    let due = recheck.due();
                    let event = tokio::select! {
                        event = events.next() => event,
                        () = sleep_until(due), if due.is_some() => {
                            tracing::info!(watch = plural, "re-listing to confirm the watch after its failure");
                            recheck.restarted();
                            continue 'watch;
                        }
                    };
                    let Some(event) = event else { continue 'watch };
                    let event = match event {
                        Ok(event) => event,
                        Err(e) => {
                            tracing::warn!(error = %e, watch = plural, "watch failed; retrying");
                            recheck.failed(tokio::time::Instant::now());
                            continue;
                        }
                    };
                    let listed = matches!(event, Event::InitDone);
                    let mut quiet = matches!(event, Event::Init);
                    if let Some(mut typed) = decoder.decode(event) {
                        match &mut typed {
                            Event::Apply(o) | Event::Delete(o) | Event::InitApply(o) => {
                                trim_config_object(o)
                            }
                            Event::Init | Event::InitDone => {}
                        }
                        // A status write (the controller's pool counters, one per allocation)
                        // changes nothing validation reads: no new configuration to build.
                        if let Event::Apply(o) = &typed
                            && cache
                                .get(&reflector::ObjectRef::from_obj(o))
                                .is_some_and(|old| same_for_validation(old.meta(), o.meta()))
                        {
                            quiet = true;
                        }
                        writer.apply_watcher_event(&typed);
                    }
                    {
                        let mut all = refused.lock().unwrap_or_else(|p| p.into_inner());
                        all.retain(|object, _| object.kind != kind);
                        all.extend(decoder.refused().map(|e| (e.object.clone(), e.clone())));
                    }
                    let go_on = if quiet {
                        true
                    } else if listed {
                        on(plural, ConfigChange::Listed)
                    } else {
                        on(plural, ConfigChange::Changed)
                    };
                    if !go_on {
                        return;
                    }
                }
            }
        });
        reader
    }
}

/// Whether two versions of a configuration object are the same to validation: the same spec
/// (`generation`, which a write of the status subresource leaves as it is), labels,
/// annotations, deletion mark and finalizers. Without a generation on either side, never.
fn same_for_validation(old: &ObjectMeta, new: &ObjectMeta) -> bool {
    old.generation.is_some()
        && old.generation == new.generation
        && old.uid == new.uid
        && old.labels == new.labels
        && old.annotations == new.annotations
        && old.deletion_timestamp == new.deletion_timestamp
        && old.finalizers == new.finalizers
}

/// Sleeps until `at`, or for ever when there is nothing to wait for.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// When a configuration watch starts over with a fresh list after it failed.
///
/// The API server expires a custom resource's watches when its CRD changes (a `helm upgrade`
/// updates the CRDs, and so did a lab test): it replaces the kind's storage, and kube's watcher
/// re-lists. Once in the lab (2026-12-06, a full `.ci/run`), a pool created right after such a
/// re-list reached the controller only 30 s later, with the next event of its kind: the re-list
/// or the watch after it met storage the API server was replacing. It did not happen again in
/// 9 runs of the same test. Whatever the API server's part, a configuration object that is missed
/// stays missed until its kind changes again, so a watch that failed lists once more
/// [`Recheck::AFTER`] later: configuration kinds are small, and a list every few seconds at most
/// costs nothing next to a missed pool.
#[derive(Debug, Default)]
struct Recheck {
    due: Option<tokio::time::Instant>,
}

impl Recheck {
    /// How long after a failure the watch lists again.
    const AFTER: std::time::Duration = std::time::Duration::from_secs(5);

    /// The watch failed at `now`: list again [`Recheck::AFTER`] after the last failure.
    fn failed(&mut self, now: tokio::time::Instant) {
        self.due = Some(now + Self::AFTER);
    }

    /// When to list again, if a failure asks for it.
    fn due(&self) -> Option<tokio::time::Instant> {
        self.due
    }

    /// The watch started over with a list: nothing more is due.
    fn restarted(&mut self) {
        self.due = None;
    }
}

/// An object's namespace and name.
type Key = (String, String);

/// What a list in progress found: the objects that decode, and the refusals.
type Listing<K> = (HashMap<Key, K>, BTreeMap<Key, ConfigError>);

/// Decodes a watch's untyped events into `K`s one object at a time. An object that does not
/// decode is reported ([`Decoder::refused`]) and either skipped or, if an earlier version of
/// it decoded, stood in for by that version (its deletion deletes that version).
pub struct Decoder<K> {
    kind: Kind,
    /// The last version of each object that decoded (by namespace and name).
    last_good: HashMap<Key, K>,
    /// The objects that do not decode now.
    refused: BTreeMap<Key, ConfigError>,
    /// During a list: what the list found so far (a list replaces everything).
    listing: Option<Listing<K>>,
}

impl<K: DeserializeOwned + Clone> Decoder<K> {
    /// A decoder of objects of `kind`.
    pub fn new(kind: Kind) -> Self {
        Decoder {
            kind,
            last_good: HashMap::new(),
            refused: BTreeMap::new(),
            listing: None,
        }
    }

    /// The objects that do not decode, each as a configuration error naming it and the field.
    pub fn refused(&self) -> impl Iterator<Item = &ConfigError> {
        self.refused.values()
    }

    /// The typed event for `event`, if there is one.
    pub fn decode(&mut self, event: Event<DynamicObject>) -> Option<Event<K>> {
        match event {
            Event::Init => {
                self.listing = Some(Default::default());
                Some(Event::Init)
            }
            Event::InitApply(o) => {
                let key = key_of(&o);
                let kept = self.last_good.get(&key).cloned();
                let decoded = self.decoded(&o, kept.is_some());
                let (good, refused) = self.listing.get_or_insert_with(Default::default);
                match decoded {
                    Ok(k) => {
                        good.insert(key, k.clone());
                        Some(Event::InitApply(k))
                    }
                    Err(e) => {
                        refused.insert(key.clone(), e);
                        let k = kept?;
                        good.insert(key, k.clone());
                        Some(Event::InitApply(k))
                    }
                }
            }
            Event::InitDone => {
                if let Some((good, refused)) = self.listing.take() {
                    self.last_good = good;
                    self.refused = refused;
                }
                Some(Event::InitDone)
            }
            Event::Apply(o) => {
                let key = key_of(&o);
                let kept = self.last_good.get(&key).cloned();
                match self.decoded(&o, kept.is_some()) {
                    Ok(k) => {
                        self.refused.remove(&key);
                        self.last_good.insert(key, k.clone());
                        Some(Event::Apply(k))
                    }
                    Err(e) => {
                        self.refused.insert(key, e);
                        kept.map(Event::Apply)
                    }
                }
            }
            Event::Delete(o) => {
                // What the cache holds of it is its last version that decoded, if any.
                let key = key_of(&o);
                self.refused.remove(&key);
                self.last_good.remove(&key).map(Event::Delete)
            }
        }
    }

    /// `object` as a `K`, or the error naming it and the field at fault (`kept`: an earlier
    /// version stays in use, which the message says).
    fn decoded(&self, object: &DynamicObject, kept: bool) -> Result<K, ConfigError> {
        let refuse = |field: String, message: String| {
            let (namespace, name) = key_of(object);
            let message = format!(
                "cannot be read as {}: {message}{}",
                self.kind,
                if kept { KEPT } else { "" }
            );
            tracing::error!(
                object = format!("{} {namespace}/{name}", self.kind),
                field,
                "configuration object refused: {message}"
            );
            ConfigError {
                object: ObjectRef {
                    kind: self.kind,
                    namespace,
                    name,
                },
                field,
                message,
            }
        };
        let value =
            serde_json::to_value(object).map_err(|e| refuse(String::new(), e.to_string()))?;
        serde_path_to_error::deserialize(value).map_err(|e| {
            let field = e.path().to_string();
            refuse(field, e.into_inner().to_string())
        })
    }
}

fn key_of(object: &DynamicObject) -> Key {
    (
        object.metadata.namespace.clone().unwrap_or_default(),
        object.metadata.name.clone().unwrap_or_default(),
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
    use std::time::Duration;

    #[test]
    fn a_status_write_is_the_same_configuration_and_a_spec_or_label_change_is_not() {
        let old = ObjectMeta {
            name: Some("pool".into()),
            uid: Some("u1".into()),
            generation: Some(3),
            resource_version: Some("10".into()),
            labels: Some([("a".to_string(), "b".to_string())].into()),
            ..ObjectMeta::default()
        };
        // The controller's status write: a new resourceVersion, the same generation.
        let status = ObjectMeta {
            resource_version: Some("11".into()),
            ..old.clone()
        };
        assert!(same_for_validation(&old, &status));
        let spec = ObjectMeta {
            generation: Some(4),
            ..status.clone()
        };
        assert!(!same_for_validation(&old, &spec));
        let label = ObjectMeta {
            labels: None,
            ..status.clone()
        };
        assert!(!same_for_validation(&old, &label));
        let deleting = ObjectMeta {
            deletion_timestamp: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            )),
            ..status.clone()
        };
        assert!(!same_for_validation(&old, &deleting));
        let made_again = ObjectMeta {
            uid: Some("u2".into()),
            ..status.clone()
        };
        assert!(!same_for_validation(&old, &made_again));
        // No generation to go by: always a change.
        let bare = ObjectMeta {
            generation: None,
            ..old.clone()
        };
        assert!(!same_for_validation(&bare, &bare));
    }

    /// An IPAddressPool of ferrolb's namespace as the API server sends it, with `spec`.
    fn pool(name: &str, spec: serde_json::Value) -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "metallb.io/v1beta1",
            "kind": "IPAddressPool",
            "metadata": {"namespace": "ferrolb", "name": name, "resourceVersion": "1"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn good(name: &str, cidr: &str) -> DynamicObject {
        pool(name, serde_json::json!({"addresses": [cidr]}))
    }

    /// Admitted by the CRD's schema (an integer of at least 0; the API server does not check
    /// `format: int32`), refused by the type (an `i32`).
    fn bad(name: &str) -> DynamicObject {
        pool(
            name,
            serde_json::json!({"addresses": ["10.0.9.0/24"], "serviceAllocation": {"priority": 3_000_000_000u64}}),
        )
    }

    fn name(event: &Option<Event<IPAddressPool>>) -> Option<(&'static str, String)> {
        let (what, o) = match event.as_ref()? {
            Event::Apply(o) => ("apply", o),
            Event::InitApply(o) => ("init-apply", o),
            Event::Delete(o) => ("delete", o),
            Event::Init => return Some(("init", String::new())),
            Event::InitDone => return Some(("init-done", String::new())),
        };
        Some((what, o.metadata.name.clone().unwrap_or_default()))
    }

    #[test]
    fn one_undecodable_pool_is_refused_by_name_and_field_and_the_others_are_read() {
        // Decoded as a typed list, as the watch of the kind did before, the one bad object
        // fails the whole list: the kind is never read.
        let list = serde_json::json!({
            "apiVersion": "metallb.io/v1beta1",
            "kind": "IPAddressPoolList",
            "metadata": {"resourceVersion": "1"},
            "items": [good("a", "10.0.1.0/24"), bad("broken"), good("c", "10.0.3.0/24")],
        });
        assert!(serde_json::from_value::<kube::core::ObjectList<IPAddressPool>>(list).is_err());

        let mut d = Decoder::<IPAddressPool>::new(Kind::IPAddressPool);
        let events: Vec<_> = [
            Event::Init,
            Event::InitApply(good("a", "10.0.1.0/24")),
            Event::InitApply(bad("broken")),
            Event::InitApply(good("c", "10.0.3.0/24")),
            Event::InitDone,
        ]
        .into_iter()
        .map(|e| d.decode(e))
        .collect();
        let names: Vec<_> = events.iter().filter_map(name).collect();
        assert_eq!(
            names,
            [
                ("init", String::new()),
                ("init-apply", "a".to_string()),
                ("init-apply", "c".to_string()),
                ("init-done", String::new()),
            ]
        );
        let refused: Vec<String> = d.refused().map(ToString::to_string).collect();
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert!(
            refused[0].starts_with(
                "IPAddressPool ferrolb/broken: spec.serviceAllocation.priority: cannot be read as IPAddressPool: "
            ),
            "{}",
            refused[0]
        );
        assert!(!refused[0].ends_with(KEPT), "{}", refused[0]);

        // Validation reports it next to the good pools, which stay in the model.
        let objects = Objects {
            namespace: "ferrolb".into(),
            pools: events
                .into_iter()
                .filter_map(|e| match e {
                    Some(Event::InitApply(o)) => Some(o),
                    _ => None,
                })
                .collect(),
            ..Default::default()
        };
        let validated = with_refusals(ferrolb_config::validate::validate(&objects), d.refused());
        assert_eq!(
            validated.config.pools.keys().cloned().collect::<Vec<_>>(),
            ["a", "c"]
        );
        assert_eq!(validated.errors.len(), 1);
        assert!(validated.left_out.iter().any(|o| o.name == "broken"));

        // Mended, it is read and no longer refused.
        assert_eq!(
            name(&d.decode(Event::Apply(good("broken", "10.0.2.0/24")))),
            Some(("apply", "broken".to_string()))
        );
        assert_eq!(d.refused().count(), 0);
    }

    #[test]
    fn a_pool_that_turns_undecodable_keeps_its_last_version_until_mended_or_deleted() {
        let mut d = Decoder::<IPAddressPool>::new(Kind::IPAddressPool);
        d.decode(Event::Init);
        d.decode(Event::InitApply(good("a", "10.0.1.0/24")));
        d.decode(Event::InitDone);
        // Broken by an edit: the version read before stands in, and the refusal says so.
        let Some(Event::Apply(kept)) = d.decode(Event::Apply(bad("a"))) else {
            panic!("the earlier version does not stand in");
        };
        assert_eq!(kept.spec.addresses, ["10.0.1.0/24"]);
        let refused: Vec<String> = d.refused().map(ToString::to_string).collect();
        assert!(refused[0].ends_with(KEPT), "{refused:?}");
        let validated = with_refusals(Validated::default(), d.refused());
        assert!(validated.left_out.is_empty() && validated.errors.len() == 1);
        // A re-list keeps it too.
        d.decode(Event::Init);
        assert_eq!(
            name(&d.decode(Event::InitApply(bad("a")))),
            Some(("init-apply", "a".to_string()))
        );
        d.decode(Event::InitDone);
        assert_eq!(d.refused().count(), 1);
        // Deleted: its version in the cache is deleted, and the refusal goes.
        let Some(Event::Delete(gone)) = d.decode(Event::Delete(bad("a"))) else {
            panic!("the cached version is not deleted");
        };
        assert_eq!(gone.spec.addresses, ["10.0.1.0/24"]);
        assert_eq!(d.refused().count(), 0);
        // An object never read and deleted: nothing to delete.
        assert!(d.decode(Event::Apply(bad("b"))).is_none());
        assert!(d.decode(Event::Delete(bad("b"))).is_none());
        assert_eq!(d.refused().count(), 0);
    }

    #[test]
    fn a_failed_config_watch_lists_again_five_seconds_after_its_last_failure() {
        let mut r = Recheck::default();
        assert_eq!(r.due(), None, "nothing due while the watch works");
        let t0 = tokio::time::Instant::now();
        r.failed(t0);
        assert_eq!(r.due(), Some(t0 + Duration::from_secs(5)));
        // Failing again (the retries) moves it: five seconds after the last failure.
        r.failed(t0 + Duration::from_secs(2));
        assert_eq!(r.due(), Some(t0 + Duration::from_secs(7)));
        r.restarted();
        assert_eq!(r.due(), None);
    }

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
