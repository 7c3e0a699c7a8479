//! The controller's I/O driver: watches, the work loop, and the writes. Decisions are made by
//! [`crate::core::Core`]; this module only feeds it and writes what differs, and only while this
//! replica leads.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use ferrolb_config::allocator::{IP_ALLOCATED_FROM_POOL, ServiceKey, is_ours};
use ferrolb_config::crd::{
    BFDProfile, BGPAdvertisement, BGPPeer, Community, ConfigurationResult, ConfigurationState,
    ConfigurationStateSpec, IPAddressPool, IPAddressPoolStatus, L2Advertisement,
};
use ferrolb_config::model::Pool;
use ferrolb_config::selector::Labels;
use ferrolb_config::validate::{NodeInfo, Objects, validate};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};

use crate::core::{Core, Desired, Note, matches};
use crate::events::{self, EventQueue, Recorder};
use crate::leader::Leadership;
use crate::slim::{self, CachedService, ServiceCache};
use crate::telemetry::{Metrics, Ready};

/// What the driver needs to know.
pub struct Settings {
    /// Namespace of the configuration objects.
    pub namespace: String,
    /// `--lb-class`.
    pub lb_class: Option<String>,
    /// This replica's identity (events, lease).
    pub identity: String,
}

/// Work items the watches produce.
#[derive(Debug)]
enum Work {
    /// A watch event of a Service, already trimmed (boxed: it is ten times the other variants).
    Service(Box<Event<CachedService>>),
    Config,
    Namespace(String),
    Synced(&'static str),
}

/// The watches' caches, but for Services, which the work loop keeps itself.
struct Stores {
    namespaces: Store<PartialObjectMeta<Namespace>>,
    nodes: Store<PartialObjectMeta<Node>>,
    pools: Store<IPAddressPool>,
    l2: Store<L2Advertisement>,
    bgp: Store<BGPAdvertisement>,
    peers: Store<BGPPeer>,
    communities: Store<Community>,
    bfd: Store<BFDProfile>,
}

/// Finalizer that keeps a BFDProfile in use from being deleted.
const BFD_FINALIZER: &str = "metallb.io/bfdprofile-in-use";

/// Service writes in flight at once.
const WRITE_CONCURRENCY: usize = 48;

/// What to do about one Service after the core decided.
enum Decision {
    /// It was deleted and held IPs: waiting Services may fit now.
    Freed,
    /// Write what differs and record Events.
    Write(Arc<CachedService>, crate::core::Outcome),
    /// Nothing to do.
    Nothing,
}

/// What became of one Service's writes.
enum Applied {
    /// Written (or nothing differed), Events recorded.
    Done,
    /// Not written: this replica's leadership had lapsed.
    NotLeading,
}

/// How often pool counters are written while Service writes keep coming (they are written
/// at once when the writes run out).
const POOL_STATUS_INTERVAL: Duration = Duration::from_secs(2);

/// One Service's write, with its key.
type WriteFuture = std::pin::Pin<
    Box<dyn std::future::Future<Output = (ServiceKey, anyhow::Result<Applied>)> + Send>,
>;

/// Decided writes waiting for a slot, and the writes in flight (at most [`WRITE_CONCURRENCY`]).
/// A Service has at most one write in flight; one that changes meanwhile is decided again when
/// that write is done.
#[derive(Default)]
struct Pipeline {
    /// Keys in decision order; a key whose entry left `decided` is skipped.
    order: std::collections::VecDeque<ServiceKey>,
    decided: HashMap<ServiceKey, (Arc<CachedService>, crate::core::Outcome)>,
    in_flight: futures::stream::FuturesUnordered<WriteFuture>,
    busy: std::collections::HashSet<ServiceKey>,
    /// Keys that changed while their write was in flight.
    deferred: BTreeSet<ServiceKey>,
}

impl Pipeline {
    fn is_in_flight(&self, key: &ServiceKey) -> bool {
        self.busy.contains(key)
    }

    fn defer(&mut self, key: ServiceKey) {
        self.deferred.insert(key);
    }

    /// Queues (or replaces, keeping its place) the write of `key`.
    fn queue(
        &mut self,
        key: ServiceKey,
        service: Arc<CachedService>,
        outcome: crate::core::Outcome,
    ) {
        if self
            .decided
            .insert(key.clone(), (service, outcome))
            .is_none()
        {
            self.order.push_back(key);
        }
    }

    /// Drops a queued write that the latest decision no longer needs.
    fn unqueue(&mut self, key: &ServiceKey) {
        self.decided.remove(key);
    }

    /// Drops every queued write (a new term decides everything again); writes in flight finish.
    fn forget_waiting(&mut self) {
        self.decided.clear();
        self.order.clear();
    }

    /// Starts queued writes while slots are free.
    fn start(&mut self, writer: &Writer) {
        while self.in_flight.len() < WRITE_CONCURRENCY {
            let Some(key) = self.order.pop_front() else {
                break;
            };
            let Some((service, outcome)) = self.decided.remove(&key) else {
                continue;
            };
            self.busy.insert(key.clone());
            let writer = writer.clone();
            self.in_flight.push(Box::pin(async move {
                let result = writer.apply(&service.to_service(), &outcome).await;
                (key, result)
            }));
        }
    }

    /// Marks `key`'s write done; a change that came meanwhile makes it dirty again.
    fn finished(&mut self, key: &ServiceKey, dirty: &mut BTreeSet<ServiceKey>) {
        self.busy.remove(key);
        if self.deferred.remove(key) {
            dirty.insert(key.clone());
        }
    }

    fn is_idle(&self) -> bool {
        self.in_flight.is_empty() && self.decided.is_empty()
    }
}

/// Number of watches that must list before the controller acts.
const WATCHES: usize = 9;

/// Objects per page of the initial list (and of a re-list): each page is held whole while it is
/// decoded, so it sets the peak above the caches.
const PAGE_SIZE: u32 = 100;

/// Watches `stream` into `writer`'s cache, trimming each object with `slim` first, and turns each
/// change into work with `map`.
fn spawn_watch<K, S, F>(
    stream: S,
    writer: reflector::store::Writer<K>,
    tx: mpsc::UnboundedSender<Work>,
    kind: &'static str,
    slim: fn(&mut K),
    map: F,
) where
    K: kube::Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
    S: futures::Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
    F: Fn(&K) -> Work + Send + 'static,
{
    tokio::spawn(async move {
        let stream = reflector::reflector(writer, stream.modify(slim)).default_backoff();
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            let work = match event {
                Ok(Event::Apply(o) | Event::Delete(o) | Event::InitApply(o)) => map(&o),
                Ok(Event::InitDone) => Work::Synced(kind),
                Ok(Event::Init) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, watch = kind, "watch failed; retrying");
                    continue;
                }
            };
            if tx.send(work).is_err() {
                return;
            }
        }
    });
}

fn config_watch<K>(
    client: &Client,
    namespace: &str,
    tx: &mpsc::UnboundedSender<Work>,
    kind: &'static str,
) -> Store<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    let (reader, writer) = reflector::store();
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    spawn_watch(
        watcher(api, watcher::Config::default().page_size(PAGE_SIZE)),
        writer,
        tx.clone(),
        kind,
        slim::config_object,
        |_| Work::Config,
    );
    reader
}

/// Watches Services, trimming each as it arrives (the full object is dropped at once), and
/// hands the events to the work loop, which keeps the cache.
fn spawn_service_watch(client: &Client, tx: mpsc::UnboundedSender<Work>) {
    let stream = watcher(
        Api::<Service>::all(client.clone()),
        watcher::Config::default().page_size(PAGE_SIZE),
    )
    .default_backoff();
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            let event = match event {
                Ok(Event::Apply(s)) => Event::Apply(CachedService::new(s)),
                Ok(Event::Delete(s)) => Event::Delete(CachedService::new(s)),
                Ok(Event::InitApply(s)) => Event::InitApply(CachedService::new(s)),
                Ok(Event::Init) => Event::Init,
                Ok(Event::InitDone) => Event::InitDone,
                Err(e) => {
                    tracing::warn!(error = %e, watch = "services", "watch failed; retrying");
                    continue;
                }
            };
            let done = matches!(event, Event::InitDone);
            if tx.send(Work::Service(Box::new(event))).is_err()
                || (done && tx.send(Work::Synced("services")).is_err())
            {
                return;
            }
        }
    });
}

fn start_watches(client: &Client, namespace: &str, tx: &mpsc::UnboundedSender<Work>) -> Stores {
    spawn_service_watch(client, tx.clone());
    let (namespaces, writer) = reflector::store();
    spawn_watch(
        watcher(
            Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
            watcher::Config::default().page_size(PAGE_SIZE),
        ),
        writer,
        tx.clone(),
        "namespaces",
        slim::name_and_labels,
        |n: &PartialObjectMeta<Namespace>| {
            Work::Namespace(n.metadata.name.clone().unwrap_or_default())
        },
    );
    let (nodes, writer) = reflector::store();
    spawn_watch(
        watcher(
            Api::<PartialObjectMeta<Node>>::all(client.clone()),
            watcher::Config::default().page_size(PAGE_SIZE),
        ),
        writer,
        tx.clone(),
        "nodes",
        slim::name_and_labels,
        |_| Work::Config,
    );
    Stores {
        namespaces,
        nodes,
        pools: config_watch(client, namespace, tx, "ipaddresspools"),
        l2: config_watch(client, namespace, tx, "l2advertisements"),
        bgp: config_watch(client, namespace, tx, "bgpadvertisements"),
        peers: config_watch(client, namespace, tx, "bgppeers"),
        communities: config_watch(client, namespace, tx, "communities"),
        bfd: config_watch(client, namespace, tx, "bfdprofiles"),
    }
}

fn cloned<K>(store: &Store<K>) -> Vec<K>
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store.state().iter().map(|o| (**o).clone()).collect()
}

/// The work loop's state.
struct Driver {
    client: Client,
    settings: Settings,
    stores: Stores,
    services: ServiceCache,
    metrics: Arc<Metrics>,
    /// For configuration errors, whose reporting is remembered only once written.
    recorder: Arc<Recorder>,
    /// For allocation Events, written in the background.
    events: EventQueue,
    leadership: Leadership,
    core: Core,
    applied_pools: Option<Vec<Pool>>,
    written_state: Option<(ConfigurationResult, String)>,
    written_pool_status: HashMap<String, IPAddressPoolStatus>,
    reported_errors: BTreeSet<String>,
}

/// Runs the controller until `shutdown` turns true.
pub async fn run(
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    ready: Ready,
    mut leadership: Leadership,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let stores = start_watches(&client, &settings.namespace, &tx);
    let recorder = Arc::new(Recorder::new(
        client.clone(),
        "ferrolb-controller",
        &settings.identity,
    ));
    let events = EventQueue::spawn(
        Arc::clone(&recorder),
        leadership.clone(),
        metrics.events_dropped.clone(),
    );
    let mut driver = Driver {
        core: Core::new(settings.lb_class.clone()),
        client,
        settings,
        stores,
        services: ServiceCache::default(),
        metrics,
        recorder,
        events,
        leadership: leadership.clone(),
        applied_pools: None,
        written_state: None,
        written_pool_status: HashMap::new(),
        reported_errors: BTreeSet::new(),
    };
    let mut synced: BTreeSet<&'static str> = BTreeSet::new();
    let mut dirty: BTreeSet<ServiceKey> = BTreeSet::new();
    let mut retry: BTreeSet<ServiceKey> = BTreeSet::new();
    let mut writes = Pipeline::default();
    let mut config_dirty = true;
    // The leadership term the core was built for.
    let mut built_for: Option<u64> = None;
    let mut pool_status_written = Instant::now();
    loop {
        let retry_wait = async {
            if retry.is_empty() {
                futures::future::pending::<()>().await
            } else {
                tokio::time::sleep(Duration::from_secs(1)).await
            }
        };
        tokio::select! {
            work = rx.recv() => {
                let Some(work) = work else { break };
                let mut handle = |w: Work| match w {
                    Work::Service(event) => dirty.extend(driver.services.apply(*event)),
                    Work::Config => config_dirty = true,
                    Work::Namespace(ns) => {
                        // Namespace labels feed pool admission: look at that namespace's Services again.
                        for s in driver.services.iter() {
                            if s.key().namespace() == ns { dirty.insert(s.key().clone()); }
                        }
                    }
                    Work::Synced(kind) => { synced.insert(kind); }
                };
                handle(work);
                while let Ok(w) = rx.try_recv() { handle(w); }
            }
            Some((key, result)) = writes.in_flight.next(), if !writes.in_flight.is_empty() => {
                writes.finished(&key, &mut dirty);
                match result {
                    Ok(Applied::Done) => {}
                    Ok(Applied::NotLeading) => {
                        tracing::debug!(service = %key, "leadership lapsed before the write; retrying when leading again");
                        retry.insert(key);
                    }
                    Err(e) => {
                        tracing::warn!(service = %key, error = %format!("{e:#}"), "writing Service failed; retrying");
                        retry.insert(key);
                    }
                }
            }
            _ = leadership.changed() => {}
            _ = retry_wait => { dirty.append(&mut retry); }
            _ = shutdown.changed() => break,
        }
        if synced.len() < WATCHES {
            continue;
        }
        ready.set();
        let term = driver.leadership.term();
        driver.metrics.leader.set(i64::from(term.is_some()));
        let Some(term) = term else {
            // Not leading: decisions wait for the next term, which starts from the caches.
            writes.forget_waiting();
            continue;
        };
        if built_for != Some(term) {
            // A new leader starts from the caches: configuration, then every Service holding
            // IPs re-claims them, then everything else.
            tracing::info!(
                term,
                "leading: rebuilding allocations from the Services' status"
            );
            built_for = Some(term);
            driver.core = Core::new(driver.settings.lb_class.clone());
            driver.applied_pools = None;
            driver.written_state = None;
            driver.written_pool_status.clear();
            writes.forget_waiting();
            driver.apply_config().await;
            let started = Instant::now();
            let mut sorted: Vec<Arc<CachedService>> = driver.services.iter().cloned().collect();
            sorted.sort_by(|a, b| a.key().cmp(b.key()));
            let mut reclaimed = 0usize;
            for cached in &sorted {
                let svc = cached.to_service();
                if driver.core.reclaim(&svc, &driver.namespace_labels(&svc)) {
                    reclaimed += 1;
                }
            }
            tracing::info!(reclaimed, services = sorted.len(), elapsed = ?started.elapsed(), "re-claimed existing IPs");
            dirty.extend(sorted.iter().map(|s| s.key().clone()));
            config_dirty = false;
        }
        if config_dirty {
            config_dirty = false;
            dirty.extend(driver.apply_config().await);
        }
        // Decide in order (the allocator is sequential and deterministic); releasing IPs can
        // make room for Services that wait, so look at those again until a pass releases
        // nothing. Writes, not decisions, take time: they run in the pipeline while the loop
        // goes on taking events, so a Service created during a burst does not wait for the
        // writes of those before it to finish.
        while !dirty.is_empty() {
            let held_before = driver.core.allocator().len();
            let mut released = false;
            for key in std::mem::take(&mut dirty) {
                if writes.is_in_flight(&key) {
                    // Decided again once its write is done, on what the write left.
                    writes.defer(key);
                    continue;
                }
                match driver.decide(&key) {
                    Decision::Freed => released = true,
                    Decision::Write(service, outcome) => writes.queue(key, service, outcome),
                    Decision::Nothing => writes.unqueue(&key),
                }
            }
            if released || driver.core.allocator().len() < held_before {
                dirty.extend(driver.pending());
            }
        }
        writes.start(&driver.writer());
        if writes.is_idle() || pool_status_written.elapsed() >= POOL_STATUS_INTERVAL {
            driver.write_pool_status().await;
            pool_status_written = Instant::now();
        }
    }
    Ok(())
}

impl Driver {
    fn namespace_labels(&self, service: &Service) -> Labels {
        let ns = service.metadata.namespace.as_deref().unwrap_or_default();
        self.stores
            .namespaces
            .get(&ObjectRef::new(ns))
            .and_then(|n| n.metadata.labels.clone())
            .unwrap_or_default()
    }

    /// Validates the configuration from the caches, applies changed pools, reports. Returns the
    /// Services to reconcile again: those that lost their IPs and those still waiting for one.
    async fn apply_config(&mut self) -> Vec<ServiceKey> {
        let s = &self.stores;
        let objects = Objects {
            namespace: self.settings.namespace.clone(),
            pools: cloned(&s.pools),
            l2_advertisements: cloned(&s.l2),
            bgp_advertisements: cloned(&s.bgp),
            peers: cloned(&s.peers),
            communities: cloned(&s.communities),
            bfd_profiles: cloned(&s.bfd),
            nodes: Some(
                s.nodes
                    .state()
                    .iter()
                    .map(|n| NodeInfo {
                        name: n.metadata.name.clone().unwrap_or_default(),
                        labels: n.metadata.labels.clone().unwrap_or_default(),
                    })
                    .collect(),
            ),
        };
        let validated = validate(&objects);
        self.metrics.config_loaded.set(1);
        self.metrics
            .config_stale
            .set(i64::from(!validated.is_valid()));
        for e in &validated.errors {
            tracing::warn!(object = %e.object, field = %e.field, "configuration error: {}", e.message);
        }
        self.report_config(&validated).await;
        self.protect_bfd_profiles(&objects.peers, &objects.bfd_profiles)
            .await;
        let pools: Vec<Pool> = validated.config.pools.values().cloned().collect();
        let mut requeue = Vec::new();
        if self.applied_pools.as_ref() != Some(&pools) {
            tracing::info!(pools = pools.len(), "applying pools");
            requeue = self.core.set_pools(pools.clone());
            for (name, pool) in &validated.config.pools {
                let (v4, v6) =
                    pool.ranges
                        .iter()
                        .fold((0u128, 0u128), |(a, b), r| match r.family() {
                            ferrolb_config::address::Family::V4 => (a + r.size(), b),
                            ferrolb_config::address::Family::V6 => (a, b.saturating_add(r.size())),
                        });
                let label = vec![("pool", name.clone())];
                let clamp = |v: u128| i64::try_from(v).unwrap_or(i64::MAX);
                self.metrics
                    .addresses_total
                    .get_or_create(&label)
                    .set(clamp(v4.saturating_add(v6)));
                self.metrics.ipv4_total.get_or_create(&label).set(clamp(v4));
                self.metrics.ipv6_total.get_or_create(&label).set(clamp(v6));
            }
            self.applied_pools = Some(pools);
            // Services waiting for an IP may fit now.
            requeue.extend(self.pending());
        }
        requeue
    }

    /// Keeps a finalizer on every BFDProfile a BGPPeer refers to, so deleting a profile in use
    /// waits until no peer refers to it (MetalLB's webhook refuses such a deletion).
    async fn protect_bfd_profiles(&self, peers: &[BGPPeer], profiles: &[BFDProfile]) {
        if !self.leadership.is_leading() {
            return;
        }
        let referenced: BTreeSet<&str> = peers
            .iter()
            .filter_map(|p| p.spec.bfd_profile.as_deref())
            .collect();
        let api: Api<BFDProfile> = Api::namespaced(self.client.clone(), &self.settings.namespace);
        for profile in profiles {
            let name = profile.metadata.name.as_deref().unwrap_or_default();
            let finalizers = profile.metadata.finalizers.clone().unwrap_or_default();
            let has = finalizers.iter().any(|f| f == BFD_FINALIZER);
            let wanted = referenced.contains(name);
            if has == wanted {
                if wanted && profile.metadata.deletion_timestamp.is_some() {
                    tracing::warn!(
                        profile = name,
                        "BFDProfile is being deleted but a BGPPeer still refers to it; the deletion waits"
                    );
                }
                continue;
            }
            let mut next: Vec<String> = finalizers
                .into_iter()
                .filter(|f| f != BFD_FINALIZER)
                .collect();
            if wanted {
                next.push(BFD_FINALIZER.to_string());
            }
            // The resourceVersion makes the update fail rather than drop another finalizer
            // written meanwhile; the next pass retries.
            let patch = serde_json::json!({"metadata": {"finalizers": next, "resourceVersion": profile.metadata.resource_version}});
            if let Err(e) = api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                tracing::warn!(profile = name, error = %e, "updating the BFDProfile finalizer failed");
            }
        }
    }

    /// Writes ConfigurationState `controller` and Events on left-out objects, when they change.
    async fn report_config(&mut self, validated: &ferrolb_config::validate::Validated) {
        if !self.leadership.is_leading() {
            return;
        }
        let result = if validated.is_valid() {
            ConfigurationResult::Valid
        } else {
            ConfigurationResult::Invalid
        };
        let summary = validated
            .errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n");
        if self.written_state.as_ref() != Some(&(result, summary.clone())) {
            let api: Api<ConfigurationState> =
                Api::namespaced(self.client.clone(), &self.settings.namespace);
            let object = ConfigurationState {
                metadata: ObjectMeta {
                    name: Some("controller".into()),
                    ..Default::default()
                },
                spec: ConfigurationStateSpec {},
                status: None,
            };
            let created = match api.create(&PostParams::default(), &object).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                Err(e) => Err(e),
            };
            let patch = serde_json::json!({"status": {"result": result, "errorSummary": summary}});
            match created.and(
                api.patch_status("controller", &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map(|_| ()),
            ) {
                Ok(()) => self.written_state = Some((result, summary)),
                Err(e) => {
                    tracing::warn!(error = %e, "writing ConfigurationState controller failed")
                }
            }
        }
        for e in &validated.errors {
            let line = e.to_string();
            if self.reported_errors.contains(&line) {
                continue;
            }
            let reference = k8s_openapi::api::core::v1::ObjectReference {
                api_version: Some(
                    if e.object.kind == ferrolb_config::validate::Kind::BGPPeer {
                        "metallb.io/v1beta2"
                    } else {
                        "metallb.io/v1beta1"
                    }
                    .into(),
                ),
                kind: Some(e.object.kind.as_str().into()),
                name: Some(e.object.name.clone()),
                namespace: Some(e.object.namespace.clone()),
                ..Default::default()
            };
            let message = format!(
                "{}: {} (left out of the running configuration)",
                e.field, e.message
            );
            let note = events::Note {
                warning: true,
                reason: "InvalidConfiguration",
                message: &message,
                action: "Validate",
            };
            if self.recorder.publish(&note, &reference).await.is_ok() {
                self.reported_errors.insert(line);
            }
        }
        let current: BTreeSet<String> = validated.errors.iter().map(ToString::to_string).collect();
        self.reported_errors.retain(|l| current.contains(l));
    }

    /// Services of ours still waiting for an IP.
    fn pending(&self) -> Vec<ServiceKey> {
        self.services
            .iter()
            .filter(|s| self.core.allocator().assignment(s.key()).is_none())
            .filter(|s| is_ours(&s.to_service(), self.settings.lb_class.as_deref()))
            .map(|s| s.key().clone())
            .collect()
    }

    /// Decides what one Service should carry (allocating or releasing in the core).
    fn decide(&mut self, key: &ServiceKey) -> Decision {
        let Some(cached) = self.services.get(key).cloned() else {
            return if self.core.forget(key) {
                Decision::Freed
            } else {
                Decision::Nothing
            };
        };
        let service = cached.to_service();
        let outcome = self
            .core
            .reconcile(&service, &self.namespace_labels(&service));
        self.metrics
            .services_assigned
            .set(i64::try_from(self.core.allocator().len()).unwrap_or(i64::MAX));
        if matches(&service, &outcome.desired) && outcome.notes.is_empty() {
            Decision::Nothing
        } else {
            // The cached form, not the Service: a batch may hold thousands until written.
            Decision::Write(cached, outcome)
        }
    }

    /// What the write pipeline needs of the driver.
    fn writer(&self) -> Writer {
        Writer {
            client: self.client.clone(),
            leadership: self.leadership.clone(),
            metrics: Arc::clone(&self.metrics),
            events: self.events.clone(),
        }
    }

    /// Writes pool counters to IPAddressPool status (and metrics) when they changed.
    async fn write_pool_status(&mut self) {
        let Some(pools) = &self.applied_pools else {
            return;
        };
        let names: Vec<String> = pools.iter().map(|p| p.name.clone()).collect();
        let api: Api<IPAddressPool> =
            Api::namespaced(self.client.clone(), &self.settings.namespace);
        let mut written: BTreeMap<String, IPAddressPoolStatus> = BTreeMap::new();
        for name in names {
            let Some(stats) = self.core.allocator().pool_stats(&name) else {
                continue;
            };
            let status = IPAddressPoolStatus {
                assigned_ipv4: stats.assigned_ipv4,
                assigned_ipv6: stats.assigned_ipv6,
                available_ipv4: stats.available_ipv4,
                available_ipv6: stats.available_ipv6,
            };
            let label = vec![("pool", name.clone())];
            self.metrics
                .addresses_in_use
                .get_or_create(&label)
                .set(stats.assigned_ipv4.saturating_add(stats.assigned_ipv6));
            self.metrics
                .ipv4_in_use
                .get_or_create(&label)
                .set(stats.assigned_ipv4);
            self.metrics
                .ipv6_in_use
                .get_or_create(&label)
                .set(stats.assigned_ipv6);
            if self.written_pool_status.get(&name) == Some(&status) || !self.leadership.is_leading()
            {
                continue;
            }
            let patch = serde_json::json!({"status": status});
            match api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    written.insert(name, status);
                }
                Err(e) => {
                    tracing::warn!(pool = %name, error = %e, "writing IPAddressPool status failed")
                }
            }
        }
        self.written_pool_status.extend(written);
    }
}

/// Writes one Service's outcome: owns what it needs, so writes run while the loop goes on.
#[derive(Clone)]
struct Writer {
    client: Client,
    leadership: Leadership,
    metrics: Arc<Metrics>,
    events: EventQueue,
}

impl Writer {
    /// Writes what differs and records the Events, if this replica still leads.
    async fn apply(
        &self,
        service: &Service,
        outcome: &crate::core::Outcome,
    ) -> anyhow::Result<Applied> {
        let started = Instant::now();
        if !self.leadership.is_leading() {
            return Ok(Applied::NotLeading);
        }
        if !matches(service, &outcome.desired) {
            self.write(service, &outcome.desired).await?;
            self.metrics
                .allocation_seconds
                .observe(started.elapsed().as_secs_f64());
        }
        for note in &outcome.notes {
            self.publish(service, note);
        }
        Ok(Applied::Done)
    }

    async fn write(&self, service: &Service, desired: &Desired) -> anyhow::Result<()> {
        let ns = service.metadata.namespace.as_deref().unwrap_or_default();
        let name = service.metadata.name.as_deref().unwrap_or_default();
        let api: Api<Service> = Api::namespaced(self.client.clone(), ns);
        let (ingress, pool) = match desired {
            Desired::Untouched => return Ok(()),
            Desired::Assigned { ips, pool } => (
                serde_json::Value::Array(
                    ips.iter()
                        .map(|ip| serde_json::json!({"ip": ip.to_string(), "ipMode": "VIP"}))
                        .collect(),
                ),
                serde_json::Value::String(pool.clone()),
            ),
            Desired::Cleared => (serde_json::Value::Null, serde_json::Value::Null),
        };
        let mut annotations = serde_json::Map::new();
        annotations.insert(IP_ALLOCATED_FROM_POOL.into(), pool);
        if service
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key("metallb.universe.tf/ip-allocated-from-pool"))
        {
            annotations.insert(
                "metallb.universe.tf/ip-allocated-from-pool".into(),
                serde_json::Value::Null,
            );
        }
        // One write for the IP and the pool annotation: the status subresource of Services takes
        // metadata too (as of Kubernetes 1.37 their status strategy resets only the spec), which
        // halves the writes of an allocation. The answer shows whether the server
        // took the annotation; where it did not, it gets its own write.
        let written = api
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(&serde_json::json!({
                    "metadata": {"annotations": annotations},
                    "status": {"loadBalancer": {"ingress": ingress}},
                })),
            )
            .await
            .with_context(|| format!("writing status of Service {ns}/{name}"))?;
        if !annotations_applied(&written, &annotations) {
            api.patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&serde_json::json!({"metadata": {"annotations": annotations}})),
            )
            .await
            .with_context(|| format!("annotating Service {ns}/{name}"))?;
        }
        tracing::info!(service = %format!("{ns}/{name}"), ?desired, "wrote Service");
        Ok(())
    }

    /// Queues an Event about `service`; the Event writer sends it without holding up writes.
    fn publish(&self, service: &Service, note: &Note) {
        self.events.push(events::Queued {
            warning: note.warning,
            reason: note.reason,
            message: note.message.clone(),
            action: "Allocate",
            regarding: service.object_ref(&()),
        });
    }
}

/// Whether `service` carries the annotation changes of a merge patch (a string sets, null removes).
fn annotations_applied(
    service: &Service,
    patch: &serde_json::Map<String, serde_json::Value>,
) -> bool {
    let current = service.metadata.annotations.as_ref();
    patch.iter().all(|(key, value)| {
        let now = current.and_then(|a| a.get(key));
        match value {
            serde_json::Value::String(v) => now == Some(v),
            _ => now.is_none(),
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn annotated(annotations: serde_json::Value) -> Service {
        serde_json::from_value(serde_json::json!({"metadata": {"annotations": annotations}}))
            .unwrap()
    }

    #[test]
    fn annotations_applied_checks_sets_and_removals() {
        let patch = serde_json::json!({
            "metallb.io/ip-allocated-from-pool": "p",
            "metallb.universe.tf/ip-allocated-from-pool": null,
        });
        let patch = patch.as_object().unwrap();
        let ok = annotated(serde_json::json!({"metallb.io/ip-allocated-from-pool": "p", "x": "y"}));
        assert!(annotations_applied(&ok, patch));
        let ignored =
            annotated(serde_json::json!({"metallb.universe.tf/ip-allocated-from-pool": "p"}));
        assert!(!annotations_applied(&ignored, patch));
        let other_pool = annotated(serde_json::json!({"metallb.io/ip-allocated-from-pool": "q"}));
        assert!(!annotations_applied(&other_pool, patch));
        let clear = serde_json::json!({"metallb.io/ip-allocated-from-pool": null});
        let clear = clear.as_object().unwrap();
        assert!(annotations_applied(
            &annotated(serde_json::Value::Null),
            clear
        ));
        assert!(!annotations_applied(&ok, clear));
    }
}
