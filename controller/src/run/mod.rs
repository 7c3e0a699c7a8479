//! The controller's I/O driver: watches, the work loop, and the writes. What is decided is up to
//! [`crate::core::Core`], when and what is written up to [`crate::schedule::Schedule`] (every rule
//! of the loop lives there); this module feeds them watch events and finished writes and carries
//! out the schedule's actions, the writes behind the [`Writes`] trait.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

use ferrolb_config::allocator::{IP_ALLOCATED_FROM_POOL, ServiceKey, is_ours};
use ferrolb_config::crd::{
    BFDProfile, BGPPeer, ConfigurationResult, ConfigurationState, ConfigurationStateSpec,
    IPAddressPool, IPAddressPoolStatus,
};
use ferrolb_config::model::Pool;
use ferrolb_config::selector::Labels;
use ferrolb_config::validate::{NodeInfo, validate};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};

use crate::core::{Core, Desired, Note, Outcome, matches};
use crate::leader::Leadership;
use crate::schedule::{Action, Decide, Decision, Input, Schedule, Written};
use crate::slim::{self, CachedService, ServiceCache};
use crate::telemetry::Metrics;
use ferrolb_runtime::Ready;
use ferrolb_runtime::events::{self, EventQueue, Recorder};
use ferrolb_runtime::health::Pulse;
use ferrolb_runtime::watch::{Change, ConfigChange, ConfigStores, Continue, reflect};

/// What the driver needs to know.
pub struct Settings {
    /// Namespace of the configuration objects.
    pub namespace: String,
    /// `--lb-class`.
    pub lb_class: Option<String>,
    /// This replica's identity (events, lease).
    pub identity: String,
    /// Failpoints a test may arm (`controller-loop`: stall the work loop;
    /// `controller-loop-panic`: panic in it).
    pub failpoints: ferrolb_runtime::failpoint::Failpoints,
    /// Owner of ConfigurationState `controller` (the controller's ServiceAccount, once known),
    /// so that it goes with the release.
    pub owner: ferrolb_runtime::owner::OwnerCell,
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
    config: ConfigStores,
}

/// Finalizer that keeps a BFDProfile in use from being deleted.
const BFD_FINALIZER: &str = "metallb.io/bfdprofile-in-use";

/// Objects per page of the initial list (and of a re-list): each page is held whole while it is
/// decoded, so it sets the peak above the caches.
const PAGE_SIZE: u32 = 100;

/// Sends `work` to the loop; `false` once the loop is gone.
fn send(tx: &mpsc::UnboundedSender<Work>, work: Work) -> Continue {
    tx.send(work).is_ok()
}

/// Watches Services, trimming each as it arrives (the full object is dropped at once), and
/// hands the events to the work loop, which keeps the cache.
fn spawn_service_watch(client: &Client, tx: mpsc::UnboundedSender<Work>) {
    let stream = watcher(
        Api::<Service>::all(client.clone()),
        watcher::Config::default().page_size(PAGE_SIZE),
    )
    .backoff(ferrolb_runtime::watch::WatchBackoff::default());
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

/// Watches the metadata of every object of kind `K` (names and labels only are kept).
fn metadata_watch<K>(
    client: &Client,
    tx: &mpsc::UnboundedSender<Work>,
    kind: &'static str,
    map: fn(&PartialObjectMeta<K>) -> Work,
) -> Store<PartialObjectMeta<K>>
where
    PartialObjectMeta<K>: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let tx = tx.clone();
    reflect(
        watcher(
            Api::<PartialObjectMeta<K>>::all(client.clone()),
            watcher::Config::default().page_size(PAGE_SIZE),
        ),
        kind,
        slim::name_and_labels,
        move |change| match change {
            Change::Object(o) => send(&tx, map(o)),
            Change::Listed => send(&tx, Work::Synced(kind)),
        },
    )
}

fn start_watches(client: &Client, namespace: &str, tx: &mpsc::UnboundedSender<Work>) -> Stores {
    spawn_service_watch(client, tx.clone());
    let config_tx = tx.clone();
    Stores {
        namespaces: metadata_watch::<Namespace>(client, tx, "namespaces", |n| {
            Work::Namespace(n.metadata.name.clone().unwrap_or_default())
        }),
        nodes: metadata_watch::<Node>(client, tx, "nodes", |_| Work::Config),
        config: ConfigStores::start(client, namespace, PAGE_SIZE, move |kind, change| {
            send(
                &config_tx,
                match change {
                    ConfigChange::Changed => Work::Config,
                    ConfigChange::Listed => Work::Synced(kind),
                },
            )
        }),
    }
}

/// The decisions: the core and the caches it decides from. Pure and synchronous; the
/// [`Schedule`] says when to decide what.
struct Decider {
    namespace: String,
    lb_class: Option<String>,
    stores: Stores,
    services: ServiceCache,
    metrics: Arc<Metrics>,
    core: Core,
    applied_pools: Option<Vec<Pool>>,
    /// The configuration last applied, until it is reported.
    report: Option<ConfigReport>,
    /// The term the allocations were rebuilt for (writes carry it).
    term: u64,
}

/// A validated configuration to report, with what its BFDProfile finalizers are decided from.
struct ConfigReport {
    validated: ferrolb_config::validate::Validated,
    peers: Vec<BGPPeer>,
    bfd_profiles: Vec<BFDProfile>,
}

/// One Service's write: what it should carry and the Events to record. The cached form, not the
/// Service: a queue may hold thousands until written.
struct ServiceWrite {
    service: Arc<CachedService>,
    outcome: Outcome,
    /// The leadership term it was decided in: it is sent only while that term lasts.
    term: u64,
}

/// What became of one Service's writes.
enum Applied {
    /// Written (or nothing differed), Events recorded.
    Done,
    /// Not written: this replica's leadership (in the term the write was decided in) had lapsed,
    /// or too little of it was left to finish the write.
    NotLeading,
    /// Refused by the API server: the Service changed since the copy the write was decided on
    /// (its resourceVersion precondition failed). Decided again on the newer copy.
    Stale,
}

/// A write starts only with at least this much of the leadership grant left: less, and it would
/// likely be abandoned half-way (every write is abandoned when the grant ends).
const MIN_WRITE_WINDOW: std::time::Duration = std::time::Duration::from_millis(500);

/// One Service's write in flight.
type WriteFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<Applied>> + Send>>;

/// One Service's write in flight, with its key.
type KeyedWrite = std::pin::Pin<
    Box<dyn std::future::Future<Output = (ServiceKey, anyhow::Result<Applied>)> + Send>,
>;

/// The controller's writes to the API server, behind a trait so that the loop can be driven
/// without one.
trait Writes {
    /// Starts one Service's write (it runs while the loop goes on).
    fn write_service(&self, write: ServiceWrite) -> WriteFuture;
    /// A new term: what was written before may have been overwritten by another leader.
    fn new_term(&mut self);
    /// Writes ConfigurationState `controller`, Events on left-out objects and BFDProfile
    /// finalizers, where they changed.
    async fn report_config(&mut self, report: &ConfigReport);
    /// Writes pool counters to IPAddressPool status (and metrics) where they changed.
    async fn write_pool_status(&mut self, counters: Vec<(String, IPAddressPoolStatus)>);
}

/// Number of watches that must list before the controller acts.
const WATCHES: usize = 9;

/// The work loop: feeds the [`Schedule`] and carries out its actions.
struct Driver<W: Writes> {
    schedule: Schedule<ServiceWrite>,
    decider: Decider,
    writes: W,
    /// Service writes in flight, each with its key.
    in_flight: FuturesUnordered<KeyedWrite>,
}

impl<W: Writes> Driver<W> {
    /// Takes one watch event in.
    fn take(&mut self, work: Work) {
        match work {
            Work::Service(event) => {
                for key in self.decider.services.apply(*event) {
                    self.schedule.handle(Input::ServiceChanged(key));
                }
            }
            Work::Config => self.schedule.handle(Input::ConfigChanged),
            Work::Namespace(ns) => {
                // Namespace labels feed pool admission: look at that namespace's Services again.
                for s in self.decider.services.iter() {
                    if s.key().namespace() == ns {
                        self.schedule.handle(Input::ServiceChanged(s.key().clone()));
                    }
                }
            }
            Work::Synced(kind) => self.schedule.handle(Input::Listed(kind)),
        }
    }

    /// Takes a finished Service write in.
    fn finished(&mut self, key: ServiceKey, result: anyhow::Result<Applied>) {
        let written = match result {
            Ok(Applied::Done) => Written::Done,
            Ok(Applied::NotLeading) => {
                tracing::debug!(service = %key, "leadership lapsed before the write; retrying when leading again");
                Written::NotLeading
            }
            Ok(Applied::Stale) => {
                tracing::debug!(service = %key, "the Service changed since the write was decided; deciding again");
                Written::Failed
            }
            Err(e) => {
                tracing::warn!(service = %key, error = %format!("{e:#}"), "writing Service failed; retrying");
                Written::Failed
            }
        };
        self.schedule
            .handle(Input::WriteFinished(key, written, Instant::now()));
    }

    /// Decides what the inputs so far call for under leadership `term` and carries it out.
    async fn step(&mut self, term: Option<u64>) {
        let actions = self.schedule.step(term, Instant::now(), &mut self.decider);
        for action in actions {
            match action {
                Action::NewTerm(_) => self.writes.new_term(),
                Action::ReportConfig => {
                    if let Some(report) = self.decider.report.take() {
                        self.writes.report_config(&report).await;
                    }
                }
                Action::Write(key, write) => {
                    let write = self.writes.write_service(write);
                    self.in_flight
                        .push(Box::pin(async move { (key, write.await) }));
                }
                Action::WritePoolStatus => {
                    self.writes
                        .write_pool_status(self.decider.pool_counters())
                        .await;
                    self.schedule
                        .handle(Input::PoolStatusWritten(Instant::now()));
                }
            }
        }
    }
}

/// How long a new term's fresh read of the Services may take before it is tried again.
const FRESH_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Services per page of a new term's fresh read (pages keep the memory of a big cluster's read
/// bounded; a paginated list is still one consistent snapshot).
const FRESH_READ_PAGE: u32 = 500;

/// A consistent read of every Service, trimmed as the cache keeps them, with the revision it was
/// read at. A LIST without a resourceVersion is served from etcd by quorum read, never from the
/// API server's watch cache, so it holds every write acknowledged before it, whatever the state of
/// this replica's watch.
async fn fresh_services(client: &Client) -> anyhow::Result<(Vec<CachedService>, Option<u64>)> {
    let api: Api<Service> = Api::all(client.clone());
    let mut params = ListParams::default().limit(FRESH_READ_PAGE);
    let mut services = Vec::new();
    let mut revision = None;
    loop {
        let page = api.list(&params).await?;
        if revision.is_none() {
            revision = page
                .metadata
                .resource_version
                .as_deref()
                .and_then(|r| r.parse().ok());
        }
        services.extend(page.items.into_iter().map(CachedService::new));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => break,
        }
    }
    Ok((services, revision))
}

impl<W: Writes> Driver<W> {
    /// Reads every Service afresh for a new `term` and takes what changed in; false when the read
    /// failed or timed out (the term does not act until a read succeeds). A new term decides on a
    /// fresh read, not on the watch alone: after an API-server outage or a partition the watch can
    /// be behind the last leader's writes.
    async fn read_afresh(&mut self, client: &Client, term: u64) -> bool {
        match tokio::time::timeout(FRESH_READ_TIMEOUT, fresh_services(client)).await {
            Ok(Ok((listed, revision))) => {
                let changed = self.decider.services.refresh(listed, revision);
                tracing::info!(
                    term,
                    changed = changed.len(),
                    "new term: read every Service afresh"
                );
                for key in changed {
                    self.schedule.handle(Input::ServiceChanged(key));
                }
                true
            }
            Ok(Err(e)) => {
                tracing::warn!(term, error = %format!("{e:#}"), "new term: cannot read the Services; not acting until it can");
                false
            }
            Err(_) => {
                tracing::warn!(
                    term,
                    "new term: reading the Services timed out; not acting until it can"
                );
                false
            }
        }
    }
}

/// How often the idle loop beats its pulse (health: [`Pulse`]).
pub const PULSE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Runs the controller until `shutdown` turns true. The loop beats `pulse` at least every
/// [`PULSE_EVERY`] and ends it when it returns or panics.
pub async fn run(
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    ready: Ready,
    mut leadership: Leadership,
    mut shutdown: watch::Receiver<bool>,
    pulse: Pulse,
) -> anyhow::Result<()> {
    let _ended = pulse.end_on_drop();
    let mut beat = tokio::time::interval(PULSE_EVERY);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
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
        // Each replica its own jitter.
        schedule: Schedule::new(WATCHES, Instant::now()).seeded(std::hash::BuildHasher::hash_one(
            &std::collections::hash_map::RandomState::new(),
            0u8,
        )),
        decider: Decider {
            namespace: settings.namespace.clone(),
            lb_class: settings.lb_class.clone(),
            stores,
            services: ServiceCache::default(),
            metrics: Arc::clone(&metrics),
            core: Core::new(settings.lb_class.clone()),
            applied_pools: None,
            report: None,
            term: 0,
        },
        writes: ApiWrites {
            writer: Writer {
                client: client.clone(),
                leadership: leadership.clone(),
                metrics: Arc::clone(&metrics),
                events,
            },
            namespace: settings.namespace,
            recorder,
            owner: settings.owner,
            state_owner: None,
            written_state: None,
            written_pool_status: HashMap::new(),
            reported_errors: BTreeSet::new(),
        },
        in_flight: FuturesUnordered::new(),
    };
    // The term whose fresh read is in the cache: a term acts only after one.
    let mut fresh_for: Option<u64> = None;
    let failpoints = settings.failpoints.clone();
    loop {
        failpoints.hold("controller-loop").await;
        failpoints.panic_if_armed("controller-loop-panic");
        let retry_wait = driver.schedule.retry_wait(Instant::now());
        let retry_wait = async {
            match retry_wait {
                Some(wait) => tokio::time::sleep(wait).await,
                None => futures::future::pending::<()>().await,
            }
        };
        tokio::select! {
            work = rx.recv() => {
                let Some(work) = work else { break };
                driver.take(work);
                while let Ok(w) = rx.try_recv() { driver.take(w); }
            }
            Some((key, result)) = driver.in_flight.next(), if !driver.in_flight.is_empty() => {
                driver.finished(key, result);
            }
            _ = leadership.changed() => {}
            _ = retry_wait => driver.schedule.handle(Input::RetryDue(Instant::now())),
            _ = shutdown.changed() => break,
            _ = beat.tick() => {
                pulse.beat();
                // A new term whose fresh read failed tries again.
                if leadership.term().is_none_or(|t| fresh_for == Some(t)) {
                    continue;
                }
            }
        }
        pulse.beat();
        if !driver.schedule.listed() {
            continue;
        }
        ready.set(true);
        if let Some(term) = leadership.term()
            && fresh_for != Some(term)
        {
            if driver.read_afresh(&client, term).await {
                fresh_for = Some(term);
            }
            // The read may take seconds.
            pulse.beat();
        }
        let term = leadership.term().filter(|t| fresh_for == Some(*t));
        metrics.leader.set(i64::from(term.is_some()));
        driver.step(term).await;
        metrics
            .writes_waiting_retry
            .set(i64::try_from(driver.schedule.retries_waiting()).unwrap_or(i64::MAX));
    }
    Ok(())
}

impl Decide for Decider {
    type Write = ServiceWrite;

    /// A new leader starts from the caches: configuration, then every Service holding IPs
    /// re-claims them (in key order), then everything else.
    fn rebuild(&mut self, term: u64) -> Vec<ServiceKey> {
        tracing::info!(
            term,
            "leading: rebuilding allocations from the Services' status"
        );
        self.term = term;
        self.core = Core::new(self.lb_class.clone());
        self.applied_pools = None;
        self.apply_config();
        let started = Instant::now();
        let mut sorted: Vec<Arc<CachedService>> = self.services.iter().cloned().collect();
        sorted.sort_by(|a, b| a.key().cmp(b.key()));
        let mut reclaimed = 0usize;
        for cached in &sorted {
            let svc = cached.to_service();
            if self.core.reclaim(&svc, &self.namespace_labels(&svc)) {
                reclaimed += 1;
            }
        }
        tracing::info!(reclaimed, services = sorted.len(), elapsed = ?started.elapsed(), "re-claimed existing IPs");
        sorted.iter().map(|s| s.key().clone()).collect()
    }

    /// Validates the configuration from the caches and applies changed pools (to be reported).
    fn apply_config(&mut self) -> Vec<ServiceKey> {
        let s = &self.stores;
        let nodes = s
            .nodes
            .state()
            .iter()
            .map(|n| NodeInfo {
                name: n.metadata.name.clone().unwrap_or_default(),
                labels: n.metadata.labels.clone().unwrap_or_default(),
            })
            .collect();
        let objects = s.config.objects(&self.namespace, nodes);
        let validated = validate(&objects);
        self.metrics.config_loaded.set(1);
        self.metrics
            .config_stale
            .set(i64::from(!validated.is_valid()));
        for e in &validated.errors {
            tracing::warn!(object = %e.object, field = %e.field, "configuration error: {}", e.message);
        }
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
            requeue.extend(self.waiting());
        }
        self.report = Some(ConfigReport {
            validated,
            peers: objects.peers,
            bfd_profiles: objects.bfd_profiles,
        });
        requeue
    }

    /// Decides what one Service should carry (allocating or releasing in the core).
    fn decide(&mut self, key: &ServiceKey) -> Decision<ServiceWrite> {
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
            Decision::Write(ServiceWrite {
                service: cached,
                outcome,
                term: self.term,
            })
        }
    }

    /// Services of ours still waiting for an IP, or for their second family: a PreferDualStack
    /// Service with two cluster IPs that holds one family gains the other when it frees up, as
    /// in MetalLB (found by the differential test).
    fn waiting(&self) -> Vec<ServiceKey> {
        self.services
            .iter()
            .filter(|s| {
                let service = s.to_service();
                if !is_ours(&service, self.lb_class.as_deref()) {
                    return false;
                }
                match self.core.allocator().assignment(s.key()) {
                    None => true,
                    Some(held) => held.ips.len() < 2 && prefers_dual_stack(&service),
                }
            })
            .map(|s| s.key().clone())
            .collect()
    }

    fn held(&self) -> usize {
        self.core.allocator().len()
    }
}

/// Whether the Service is PreferDualStack and got both families (`spec.ipFamilies`; the cache
/// keeps no cluster IPs).
fn prefers_dual_stack(service: &Service) -> bool {
    service.spec.as_ref().is_some_and(|spec| {
        spec.ip_family_policy.as_deref() == Some("PreferDualStack")
            && spec.ip_families.as_ref().is_some_and(|f| f.len() == 2)
    })
}

impl Decider {
    fn namespace_labels(&self, service: &Service) -> Labels {
        let ns = service.metadata.namespace.as_deref().unwrap_or_default();
        self.stores
            .namespaces
            .get(&ObjectRef::new(ns))
            .and_then(|n| n.metadata.labels.clone())
            .unwrap_or_default()
    }

    /// The applied pools' counters, as IPAddressPool status.
    fn pool_counters(&self) -> Vec<(String, IPAddressPoolStatus)> {
        let Some(pools) = &self.applied_pools else {
            return Vec::new();
        };
        pools
            .iter()
            .filter_map(|p| {
                let stats = self.core.allocator().pool_stats(&p.name)?;
                let status = IPAddressPoolStatus {
                    assigned_ipv4: stats.assigned_ipv4,
                    assigned_ipv6: stats.assigned_ipv6,
                    available_ipv4: stats.available_ipv4,
                    available_ipv6: stats.available_ipv6,
                };
                Some((p.name.clone(), status))
            })
            .collect()
    }
}

/// The writes, to the API server.
struct ApiWrites {
    writer: Writer,
    namespace: String,
    /// For configuration errors, whose reporting is remembered only once written.
    recorder: Arc<Recorder>,
    /// Owner of ConfigurationState `controller`.
    owner: ferrolb_runtime::owner::OwnerCell,
    /// The owner (UID) this run has set on ConfigurationState `controller`, or was refused.
    state_owner: Option<String>,
    written_state: Option<(ConfigurationResult, String)>,
    written_pool_status: HashMap<String, IPAddressPoolStatus>,
    reported_errors: BTreeSet<String>,
}

impl Writes for ApiWrites {
    fn write_service(&self, write: ServiceWrite) -> WriteFuture {
        let writer = self.writer.clone();
        Box::pin(async move {
            writer
                .apply(&write.service.to_service(), &write.outcome, write.term)
                .await
        })
    }

    fn new_term(&mut self) {
        self.written_state = None;
        self.written_pool_status.clear();
    }

    async fn report_config(&mut self, report: &ConfigReport) {
        self.report_state(&report.validated).await;
        self.protect_bfd_profiles(&report.peers, &report.bfd_profiles)
            .await;
    }

    async fn write_pool_status(&mut self, counters: Vec<(String, IPAddressPoolStatus)>) {
        let api: Api<IPAddressPool> = Api::namespaced(self.writer.client.clone(), &self.namespace);
        let metrics = &self.writer.metrics;
        for (name, status) in counters {
            let label = vec![("pool", name.clone())];
            metrics
                .addresses_in_use
                .get_or_create(&label)
                .set(status.assigned_ipv4.saturating_add(status.assigned_ipv6));
            metrics
                .ipv4_in_use
                .get_or_create(&label)
                .set(status.assigned_ipv4);
            metrics
                .ipv6_in_use
                .get_or_create(&label)
                .set(status.assigned_ipv6);
            if self.written_pool_status.get(&name) == Some(&status)
                || !self.writer.leadership.is_leading()
            {
                continue;
            }
            let patch = serde_json::json!({"status": status});
            match api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.written_pool_status.insert(name, status);
                }
                Err(e) => {
                    tracing::warn!(pool = %name, error = %e, "writing IPAddressPool status failed")
                }
            }
        }
    }
}

impl ApiWrites {
    /// Keeps a finalizer on every BFDProfile a BGPPeer refers to, so deleting a profile in use
    /// waits until no peer refers to it (MetalLB's webhook refuses such a deletion).
    async fn protect_bfd_profiles(&self, peers: &[BGPPeer], profiles: &[BFDProfile]) {
        if !self.writer.leadership.is_leading() {
            return;
        }
        let referenced: BTreeSet<&str> = peers
            .iter()
            .filter_map(|p| p.spec.bfd_profile.as_deref())
            .collect();
        let api: Api<BFDProfile> = Api::namespaced(self.writer.client.clone(), &self.namespace);
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
    async fn report_state(&mut self, validated: &ferrolb_config::validate::Validated) {
        if !self.writer.leadership.is_leading() {
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
                Api::namespaced(self.writer.client.clone(), &self.namespace);
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
        // The owner in a write of its own, once per run and owner, whenever a report passes
        // (so also when the owner is learnt after the first one): a refusal
        // (OwnerReferencesPermissionEnforcement without `delete`) never stops the report. A
        // merge patch replaces the list whole.
        if self.written_state.is_some()
            && let Some(owner) = self.owner.get()
            && self.state_owner.as_deref() != Some(owner.reference().uid.as_str())
        {
            let api: Api<ConfigurationState> =
                Api::namespaced(self.writer.client.clone(), &self.namespace);
            match api
                .patch("controller", &PatchParams::default(), &owner.merge_patch())
                .await
            {
                Ok(_) => self.state_owner = Some(owner.reference().uid),
                Err(kube::Error::Api(e)) if e.code == 403 => {
                    self.state_owner = Some(owner.reference().uid);
                    tracing::warn!(error = %e, "setting the owner of ConfigurationState controller was refused: it stays after uninstall (needs patch and delete on it)");
                }
                Err(e) => {
                    tracing::debug!(error = %e, "setting the owner of ConfigurationState controller failed")
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
    /// Writes what differs and records the Events, if this replica still leads in `term`.
    ///
    /// The fence: the write is conditional on the resourceVersion it was decided on, so the API
    /// server refuses it if anyone (a newer leader among them) wrote the Service since; and it is
    /// abandoned when this term's grant ends, which is before any other replica can take the
    /// Lease (docs/decisions/0016-controller-fencing.md).
    async fn apply(
        &self,
        service: &Service,
        outcome: &Outcome,
        term: u64,
    ) -> anyhow::Result<Applied> {
        let started = Instant::now();
        let until = match self.leadership.grant() {
            Some((now_term, until)) if now_term == term && until > started + MIN_WRITE_WINDOW => {
                until
            }
            _ => return Ok(Applied::NotLeading),
        };
        if !matches(service, &outcome.desired) {
            // Biased: once the grant has ended, the write is never polled again (not even once
            // on waking from a freeze, which plain `timeout` would do before checking the time).
            let result = tokio::select! {
                biased;
                () = tokio::time::sleep_until(until.into()) => None,
                r = self.write(service, &outcome.desired) => Some(r),
            };
            match result {
                None => {
                    self.metrics.write_failed("abandoned");
                    anyhow::bail!(
                        "the write did not finish before the leadership grant ended; abandoned"
                    )
                }
                Some(Err(WriteError::Conflict)) => {
                    self.metrics.write_failed("conflict");
                    return Ok(Applied::Stale);
                }
                Some(Err(WriteError::Other(e))) => {
                    self.metrics.write_failed("error");
                    return Err(e);
                }
                Some(Ok(())) => {}
            }
            self.metrics
                .allocation_seconds
                .observe(started.elapsed().as_secs_f64());
        }
        for note in &outcome.notes {
            self.publish(service, note);
        }
        Ok(Applied::Done)
    }

    async fn write(&self, service: &Service, desired: &Desired) -> Result<(), WriteError> {
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
        // metadata too (their status strategy resets only the spec), which halves the writes of
        // an allocation and lets the controller do without write access to Services themselves.
        // A resourceVersion in a merge patch is a precondition the API server checks (409
        // Conflict when the Service has changed since).
        let written = api
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(&serde_json::json!({
                    "metadata": {
                        "annotations": annotations,
                        "resourceVersion": service.metadata.resource_version,
                    },
                    "status": {"loadBalancer": {"ingress": ingress}},
                })),
            )
            .await
            .map_err(|e| WriteError::of(e, || format!("writing status of Service {ns}/{name}")))?;
        if !annotations_applied(&written, &annotations) {
            // Services' status subresource has always taken metadata (Kubernetes' own service
            // controller writes its finalizer that way), so this is an API server that drops it.
            return Err(WriteError::Other(anyhow::anyhow!(
                "the API server did not keep the pool annotation written with the status of Service {ns}/{name}"
            )));
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

/// Why a Service write did not happen.
#[derive(Debug)]
enum WriteError {
    /// The Service changed since the copy the write was decided on.
    Conflict,
    /// Anything else, with what was being written.
    Other(anyhow::Error),
}

impl WriteError {
    fn of(error: kube::Error, what: impl FnOnce() -> String) -> Self {
        match error {
            kube::Error::Api(ref status) if status.code == 409 => Self::Conflict,
            e => Self::Other(anyhow::Error::new(e).context(what())),
        }
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

#[cfg(test)]
mod driver_tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::cell::{Cell, RefCell};

    use kube::runtime::reflector;

    use super::*;

    const NAMESPACE: &str = "ferrolb-system";

    /// Writes that only log what they would write; Service writes find this replica leading or not.
    struct Logged {
        log: RefCell<Vec<String>>,
        leading: Cell<bool>,
    }

    impl Logged {
        fn take(&self) -> Vec<String> {
            self.log.take()
        }
    }

    impl Writes for Logged {
        fn write_service(&self, write: ServiceWrite) -> WriteFuture {
            self.log.borrow_mut().push(format!(
                "write {}: {:?}",
                write.service.key(),
                write.outcome.desired
            ));
            let applied = if self.leading.get() {
                Applied::Done
            } else {
                Applied::NotLeading
            };
            Box::pin(futures::future::ready(Ok(applied)))
        }

        fn new_term(&mut self) {
            self.log.get_mut().push("new term".into());
        }

        async fn report_config(&mut self, report: &ConfigReport) {
            let valid = report.validated.is_valid();
            self.log
                .get_mut()
                .push(format!("report config: valid {valid}"));
        }

        async fn write_pool_status(&mut self, counters: Vec<(String, IPAddressPoolStatus)>) {
            for (pool, status) in counters {
                self.log.get_mut().push(format!(
                    "pool {pool}: {} assigned, {} available",
                    status.assigned_ipv4, status.available_ipv4
                ));
            }
        }
    }

    /// A driver whose watches have all listed, with pool `p` of `range` and no Services.
    fn driver_with_pool(range: &str) -> Driver<Logged> {
        let (pools, mut writer) = reflector::store();
        let pool: IPAddressPool = serde_json::from_value(serde_json::json!({
            "apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
            "metadata": {"name": "p", "namespace": NAMESPACE},
            "spec": {"addresses": [range]},
        }))
        .unwrap();
        writer.apply_watcher_event(&Event::Apply(pool));
        let stores = Stores {
            namespaces: reflector::store().0,
            nodes: reflector::store().0,
            config: ConfigStores {
                pools,
                l2: reflector::store().0,
                bgp: reflector::store().0,
                peers: reflector::store().0,
                communities: reflector::store().0,
                bfd: reflector::store().0,
            },
        };
        let mut driver = Driver {
            schedule: Schedule::new(WATCHES, Instant::now()),
            decider: Decider {
                namespace: NAMESPACE.into(),
                lb_class: None,
                stores,
                services: ServiceCache::default(),
                metrics: Arc::new(Metrics::new().0),
                core: Core::new(None),
                applied_pools: None,
                report: None,
                term: 0,
            },
            writes: Logged {
                log: RefCell::default(),
                leading: Cell::new(true),
            },
            in_flight: FuturesUnordered::new(),
        };
        for kind in [
            "services",
            "namespaces",
            "nodes",
            "ipaddresspools",
            "l2advertisements",
            "bgpadvertisements",
            "bgppeers",
            "communities",
            "bfdprofiles",
        ] {
            driver.take(Work::Synced(kind));
        }
        driver
    }

    fn created(name: &str) -> Work {
        let service: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]},
        }))
        .unwrap();
        Work::Service(Box::new(Event::Apply(CachedService::new(service))))
    }

    /// Waits for the next Service write to finish and takes it in.
    async fn finish_one(driver: &mut Driver<Logged>) {
        let (key, result) = driver.in_flight.next().await.unwrap();
        driver.finished(key, result);
    }

    /// What a term that starts with only Service `a` waiting for an IP writes.
    const A_TERM_THAT_WRITES_A: [&str; 3] = [
        "new term",
        "report config: valid true",
        "write default/a: Assigned { ips: [198.18.200.0], pool: \"p\" }",
    ];

    #[tokio::test]
    async fn the_driver_writes_what_the_schedule_starts_then_the_pool_counters() {
        let mut driver = driver_with_pool("198.18.200.0/30");
        driver.take(created("a"));
        driver.step(Some(1)).await;
        assert_eq!(driver.writes.take(), A_TERM_THAT_WRITES_A);
        finish_one(&mut driver).await;
        driver.step(Some(1)).await;
        assert_eq!(driver.writes.take(), ["pool p: 1 assigned, 3 available"]);
    }

    #[tokio::test]
    async fn a_write_that_finds_leadership_lapsed_is_written_again_at_the_next_term() {
        let mut driver = driver_with_pool("198.18.200.0/30");
        driver.take(created("a"));
        driver.writes.leading.set(false);
        driver.step(Some(1)).await;
        driver.writes.take();
        finish_one(&mut driver).await;
        driver.step(None).await;
        assert!(driver.writes.take().is_empty());

        driver.writes.leading.set(true);
        driver.step(Some(2)).await;
        assert_eq!(driver.writes.take(), A_TERM_THAT_WRITES_A);
    }
}
