//! The controller's I/O driver. What is decided is up to [`crate::core::Core`], when and what is
//! written up to [`crate::schedule::Schedule`] (every rule of the loop lives there); this module
//! is the loop that feeds them watch events and finished writes and carries out the schedule's
//! actions. Where to look:
//!
//! * [`watches`]: what is watched, and the work items each watch hands the loop;
//! * [`decide`]: the [`Decide`](crate::schedule::Decide) calls, answered from the core and the
//!   caches (the configuration validated and applied, each Service decided);
//! * [`writes`]: the writes behind the [`Writes`] trait (Services, the configuration's report,
//!   pool counters);
//! * here: start-up, the select loop, and a new term's fresh read of the Services.

mod decide;
mod watches;
mod writes;

use std::sync::Arc;
use std::time::Instant;

use ferrolb_config::allocator::ServiceKey;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use k8s_openapi::api::core::v1::Service;
use kube::Client;
use kube::api::{Api, ListParams};
use tokio::sync::{mpsc, watch};

use crate::leader::Leadership;
use crate::schedule::{Action, Input, Schedule, Written};
use crate::slim::CachedService;
use crate::telemetry::Metrics;
use decide::{Decider, ServiceWrite};
use ferrolb_runtime::health::Pulse;
use ferrolb_runtime::server::Ready;
use watches::Work;
use writes::{ApiWrites, Applied, Writes};

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
    /// Node addresses (`--node-addresses`, decision 0024): the speakers' presence Lease group
    /// whose live speakers make their nodes' addresses eligible; `None`: off.
    pub node_addresses: Option<String>,
}

/// One Service's write in flight, with its key.
type KeyedWrite = std::pin::Pin<
    Box<dyn std::future::Future<Output = (ServiceKey, anyhow::Result<Applied>)> + Send>,
>;

/// The work loop: feeds the [`Schedule`] and carries out its actions.
struct Driver<W: Writes> {
    schedule: Schedule<ServiceWrite>,
    decider: Decider,
    writes: W,
    /// Service writes in flight, each with its key.
    in_flight: FuturesUnordered<KeyedWrite>,
    /// The term whose fresh read is in the cache: a term acts only after one.
    fresh_for: Option<u64>,
    /// The speakers' presence (node addresses on).
    presence: Option<crate::presence::Presence>,
    /// A presence Lease changed since who is alive was last read.
    presence_seen: bool,
}

impl<W: Writes> Driver<W> {
    fn new(schedule: Schedule<ServiceWrite>, decider: Decider, writes: W) -> Self {
        Self {
            schedule,
            decider,
            writes,
            in_flight: FuturesUnordered::new(),
            fresh_for: None,
            presence: None,
            presence_seen: false,
        }
    }

    /// Node addresses' inputs changed: decide again the Services whose outcome changed.
    fn node_inputs(&mut self, change: impl FnOnce(&mut crate::node_addresses::Engine)) {
        for key in self.decider.node_inputs(change) {
            self.schedule.handle(Input::ServiceChanged(key));
        }
    }

    /// Reads which speakers are alive now (node addresses on).
    fn check_presence(&mut self) {
        self.presence_seen = false;
        if let Some(presence) = &self.presence {
            let alive = presence.alive(Instant::now());
            self.node_inputs(|engine| engine.set_alive(alive));
        }
    }

    /// Takes one watch event in.
    fn take(&mut self, work: Work) {
        match work {
            Work::Service(event) => {
                for key in self.decider.services.apply(*event) {
                    self.schedule.handle(Input::ServiceChanged(key));
                }
                if self.decider.services.take_unsettled() {
                    // A re-list lacked Services it may be older than: kept until a fresh read
                    // (which knows its revision) says whether they are gone. The term acts
                    // again only once that read is in.
                    tracing::info!(
                        "a re-list of the Services may be older than the cache; reading them afresh"
                    );
                    self.fresh_for = None;
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
            Work::Synced(kind) => {
                // The presence watch's store takes its list in whole at the list's end (not
                // at each listed Lease): read who is alive before anything is decided on it.
                self.check_presence();
                self.schedule.handle(Input::Listed(kind));
            }
            Work::Node(event) => self.node_inputs(|engine| engine.node_event(event)),
            Work::Slice(event) => self.node_inputs(|engine| engine.slice_event(event)),
            // Read once the pending work is taken in: every speaker renews every 10 s, and a
            // read per renewal would go over every Lease each time.
            Work::Presence => self.presence_seen = true,
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
    /// The term this replica may act in: leadership's, once a fresh read of the Services for it
    /// is in (made here when it is not yet; a read that fails is tried again next time).
    async fn acting_term(
        &mut self,
        client: &Client,
        leadership: &Leadership,
        pulse: &Pulse,
    ) -> Option<u64> {
        if let Some(term) = leadership.term()
            && self.fresh_for != Some(term)
        {
            if self.read_afresh(client, term).await {
                self.fresh_for = Some(term);
            }
            // The read may take seconds.
            pulse.beat();
        }
        leadership.term().filter(|t| self.fresh_for == Some(*t))
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
    let started = watches::start(
        &client,
        &settings.namespace,
        settings.node_addresses.as_deref(),
        &tx,
        &settings.failpoints,
    );
    let writes = ApiWrites::new(
        client.clone(),
        settings.namespace.clone(),
        &settings.identity,
        settings.owner,
        leadership.clone(),
        Arc::clone(&metrics),
    );
    let mut decider = Decider::new(
        settings.namespace,
        settings.lb_class,
        started.stores,
        Arc::clone(&metrics),
    );
    if settings.node_addresses.is_some() {
        decider = decider.with_node_addresses();
    }
    // Each replica its own jitter.
    let schedule = Schedule::new(started.watches, Instant::now()).seeded(
        std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), 0u8),
    );
    let mut driver = Driver::new(schedule, decider, writes);
    driver.presence = started.presence;
    let failpoints = settings.failpoints;
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
                if driver.presence_seen { driver.check_presence(); }
            }
            Some((key, result)) = driver.in_flight.next(), if !driver.in_flight.is_empty() => {
                driver.finished(key, result);
            }
            _ = leadership.changed() => {}
            _ = retry_wait => driver.schedule.handle(Input::RetryDue(Instant::now())),
            _ = shutdown.changed() => break,
            _ = beat.tick() => {
                pulse.beat();
                // A presence Lease ages out without an event.
                driver.check_presence();
                // A new term whose fresh read failed tries again.
                if leadership.term().is_none_or(|t| driver.fresh_for == Some(t)) {
                    continue;
                }
            }
        }
        pulse.beat();
        if !driver.schedule.listed() {
            continue;
        }
        ready.set(true);
        let term = driver.acting_term(&client, &leadership, &pulse).await;
        metrics.leader.set(i64::from(term.is_some()));
        driver.step(term).await;
        metrics
            .writes_waiting_retry
            .set(i64::try_from(driver.schedule.retries_waiting()).unwrap_or(i64::MAX));
    }
    Ok(())
}

#[cfg(test)]
mod driver_tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::cell::{Cell, RefCell};

    use ferrolb_config::crd::{IPAddressPool, IPAddressPoolStatus};
    use ferrolb_runtime::watch::ConfigStores;
    use ferrolb_testkit::objects;
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;

    use super::decide::ConfigReport;
    use super::watches::Stores;
    use super::writes::WriteFuture;
    use super::*;

    const NAMESPACE: &str = "ferrolb-system";

    /// Writes that only log what they would write; Service writes find this replica leading or not.
    struct Logged {
        log: RefCell<Vec<String>>,
        /// Events recorded, as `key: reason`.
        notes: RefCell<Vec<String>>,
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
            for note in &write.outcome.notes {
                self.notes
                    .borrow_mut()
                    .push(format!("{}: {}", write.service.key(), note.reason));
            }
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

    /// The kinds the production watches report as listed.
    const LISTED: [&str; 9] = [
        "services",
        "namespaces",
        "nodes",
        "ipaddresspools",
        "l2advertisements",
        "bgpadvertisements",
        "bgppeers",
        "communities",
        "bfdprofiles",
    ];

    /// A driver whose watches have all listed, with pool `p` of `range` and no Services.
    fn driver_with_pool(range: &str) -> Driver<Logged> {
        driver_with(Some(range), false)
    }

    /// A driver whose watches have all listed, with pool `p` of `range` if any, node addresses
    /// on or off, and no Services.
    fn driver_with(range: Option<&str>, node_addresses: bool) -> Driver<Logged> {
        let (pools, mut writer) = reflector::store();
        if let Some(range) = range {
            let pool: IPAddressPool = serde_json::from_value(serde_json::json!({
                "apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
                "metadata": {"name": "p", "namespace": NAMESPACE},
                "spec": {"addresses": [range]},
            }))
            .unwrap();
            writer.apply_watcher_event(&Event::Apply(pool));
        }
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
                refused: Default::default(),
            },
        };
        let mut decider = Decider::new(NAMESPACE.into(), None, stores, Arc::new(Metrics::new().0));
        if node_addresses {
            decider = decider.with_node_addresses();
        }
        let mut driver = Driver::new(
            Schedule::new(LISTED.len(), Instant::now()),
            decider,
            Logged {
                log: RefCell::default(),
                notes: RefCell::default(),
                leading: Cell::new(true),
            },
        );
        for kind in LISTED {
            driver.take(Work::Synced(kind));
        }
        driver
    }

    fn created(name: &str) -> Work {
        let service = objects::service(name)
            .namespace("default")
            .port(80, "TCP")
            .build();
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

    fn at_version(name: &str, rv: &str) -> CachedService {
        CachedService::new(
            objects::service(name)
                .namespace("default")
                .port(80, "TCP")
                .with(|s| s.metadata.resource_version = Some(rv.into()))
                .build(),
        )
    }

    #[tokio::test]
    async fn a_relist_that_cannot_settle_a_service_makes_the_term_read_afresh() {
        let mut driver = driver_with_pool("198.18.200.0/30");
        driver.take(Work::Service(Box::new(Event::Apply(at_version("a", "10")))));
        driver.take(Work::Service(Box::new(Event::Apply(at_version("b", "30")))));
        driver.fresh_for = Some(1);
        // A re-list that holds a and b: settled, the term acts on.
        driver.take(Work::Service(Box::new(Event::Init)));
        for (name, rv) in [("a", "10"), ("b", "30")] {
            driver.take(Work::Service(Box::new(Event::InitApply(at_version(
                name, rv,
            )))));
        }
        driver.take(Work::Service(Box::new(Event::InitDone)));
        assert_eq!(driver.fresh_for, Some(1));
        // One whose newest copy (20) is older than b: b may have been created after it; kept,
        // and the term does not act until a fresh read settles it.
        driver.take(Work::Service(Box::new(Event::Init)));
        driver.take(Work::Service(Box::new(Event::InitApply(at_version(
            "a", "20",
        )))));
        driver.take(Work::Service(Box::new(Event::InitDone)));
        assert_eq!(driver.fresh_for, None);
        assert!(
            driver
                .decider
                .services
                .get(at_version("b", "1").key())
                .is_some()
        );
    }

    mod node_addresses {
        use super::*;
        use crate::node_addresses::NodeFacts;
        use ferrolb_config::allocator::ServiceKey;
        use ferrolb_config::node_addresses::ENABLE_LB_LABEL;
        use ferrolb_config::selector::Labels;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

        /// Node `name` with InternalIP `ip`, Ready, its speaker alive once [`alive`] says so.
        fn node(name: &str, ip: &str, labels: &[(&str, &str)]) -> Work {
            let facts = NodeFacts {
                labels: labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<Labels>(),
                internal: vec![ip.parse().unwrap()],
                external: Vec::new(),
                ready: true,
            };
            Work::Node(Event::Apply((
                ServiceKey::new(String::new(), name.to_string()),
                facts,
            )))
        }

        fn alive(driver: &mut Driver<Logged>, nodes: &[&str]) {
            let set = nodes.iter().map(|n| n.to_string()).collect();
            driver.node_inputs(|e| e.set_alive(set));
        }

        /// LoadBalancer Service `name` on port 80/TCP created at `second`.
        fn svc(name: &str, second: i64) -> objects::ServiceBuilder {
            svc_on(name, second, 80)
        }

        /// LoadBalancer Service `name` on `port`/TCP created at `second`.
        fn svc_on(name: &str, second: i64, port: i32) -> objects::ServiceBuilder {
            objects::service(name)
                .namespace("default")
                .port(port, "TCP")
                .with(|s| {
                    s.metadata.creation_timestamp = Some(Time(
                        k8s_openapi::jiff::Timestamp::from_second(second).unwrap(),
                    ))
                })
        }

        fn apply(driver: &mut Driver<Logged>, service: k8s_openapi::api::core::v1::Service) {
            driver.take(Work::Service(Box::new(Event::Apply(CachedService::new(
                service,
            )))));
        }

        /// Two nodes, both alive, and a driver with node addresses on and pool `range` if any.
        fn two_nodes(range: Option<&str>) -> Driver<Logged> {
            let mut driver = driver_with(range, true);
            driver.take(node("n1", "198.18.0.11", &[]));
            driver.take(node("n2", "198.18.0.12", &[]));
            alive(&mut driver, &["n1", "n2"]);
            driver
        }

        async fn settle(driver: &mut Driver<Logged>) -> Vec<String> {
            driver.step(Some(1)).await;
            while !driver.in_flight.is_empty() {
                finish_one(driver).await;
                driver.step(Some(1)).await;
            }
            driver
                .writes
                .take()
                .into_iter()
                .filter(|l| l.starts_with("write"))
                .collect()
        }

        const BOTH: &str = "NodeAddresses { ips: [198.18.0.11, 198.18.0.12] }";

        #[tokio::test]
        async fn with_no_pool_a_service_gets_the_addresses_of_nodes_whose_speaker_is_alive() {
            let mut driver = two_nodes(None);
            apply(&mut driver, svc("a", 1).build());
            assert_eq!(
                settle(&mut driver).await,
                [format!("write default/a: {BOTH}")]
            );
            assert_eq!(
                driver.writes.notes.take(),
                ["default/a: UpdatedLoadBalancer"]
            );
            // A speaker gone: its node leaves the list.
            apply(
                &mut driver,
                svc("a", 1)
                    .ingress(&["198.18.0.11", "198.18.0.12"])
                    .annotation("ferrolb.io/served-by", "node-addresses")
                    .build(),
            );
            alive(&mut driver, &["n2"]);
            assert_eq!(
                settle(&mut driver).await,
                ["write default/a: NodeAddresses { ips: [198.18.0.12] }"]
            );
        }

        #[tokio::test]
        async fn pools_come_first_and_node_addresses_take_what_no_pool_serves() {
            let mut driver = two_nodes(Some("198.18.200.0/32"));
            apply(&mut driver, svc("a", 1).build());
            apply(&mut driver, svc("b", 2).port(443, "TCP").build());
            assert_eq!(
                settle(&mut driver).await,
                [
                    "write default/a: Assigned { ips: [198.18.200.0], pool: \"p\" }".to_string(),
                    format!("write default/b: {BOTH}"),
                ]
            );
        }

        #[tokio::test]
        async fn a_port_held_by_an_earlier_service_keeps_the_later_one_off_that_address() {
            let mut driver = two_nodes(None);
            apply(&mut driver, svc("later", 20).build());
            apply(&mut driver, svc("early", 10).build());
            let writes = settle(&mut driver).await;
            assert!(
                writes.contains(&format!("write default/early: {BOTH}")),
                "{writes:?}"
            );
            assert!(
                writes.contains(&"write default/later: NodeAddresses { ips: [] }".to_string()),
                "{writes:?}"
            );
            let notes = driver.writes.notes.take();
            assert!(
                notes.contains(&"default/later: NodeAddressPortHeld".to_string()),
                "{notes:?}"
            );
            // The holder goes: the later Service gets the addresses, with no second decision
            // of its own asked for.
            driver.take(Work::Service(Box::new(Event::Delete(CachedService::new(
                svc("early", 10).build(),
            )))));
            assert_eq!(
                settle(&mut driver).await,
                [format!("write default/later: {BOTH}")]
            );
        }

        #[tokio::test]
        async fn the_enablelb_label_restricts_every_service_to_labelled_nodes() {
            let mut driver = two_nodes(None);
            apply(&mut driver, svc("a", 1).build());
            settle(&mut driver).await;
            apply(
                &mut driver,
                svc("a", 1)
                    .ingress(&["198.18.0.11", "198.18.0.12"])
                    .annotation("ferrolb.io/served-by", "node-addresses")
                    .build(),
            );
            driver.take(node("n2", "198.18.0.12", &[(ENABLE_LB_LABEL, "true")]));
            assert_eq!(
                settle(&mut driver).await,
                ["write default/a: NodeAddresses { ips: [198.18.0.12] }"]
            );
        }

        #[tokio::test]
        async fn opting_out_or_a_metallb_request_never_falls_back_to_node_addresses() {
            let mut driver = two_nodes(None);
            apply(
                &mut driver,
                svc("out", 1)
                    .annotation("ferrolb.io/node-addresses", "false")
                    .build(),
            );
            apply(
                &mut driver,
                svc("pool", 2)
                    .annotation("metallb.io/address-pool", "p")
                    .build(),
            );
            // Written: nothing but the Events.
            assert_eq!(
                settle(&mut driver).await,
                [
                    "write default/out: Untouched",
                    "write default/pool: Untouched"
                ]
            );
            let notes = driver.writes.notes.take();
            assert_eq!(
                notes,
                [
                    "default/out: AllocationFailed",
                    "default/pool: AllocationFailed"
                ]
            );
        }

        #[tokio::test]
        async fn the_class_asks_for_node_addresses_even_where_a_pool_has_room() {
            let mut driver = two_nodes(Some("198.18.200.0/30"));
            apply(
                &mut driver,
                svc("a", 1)
                    .load_balancer_class("ferrolb.io/node-addresses")
                    .build(),
            );
            assert_eq!(
                settle(&mut driver).await,
                [format!("write default/a: {BOTH}")]
            );
        }

        #[tokio::test]
        async fn a_service_servicelb_served_keeps_its_addresses_next_to_a_pool() {
            // The status k3s ServiceLB wrote, no ferrolb annotation: adopted, not moved to the
            // pool; the only write adds the mark (the ingress is unchanged) and no Event.
            let mut driver = two_nodes(Some("198.18.200.0/30"));
            apply(
                &mut driver,
                svc("traefik", 1)
                    .ingress(&["198.18.0.11", "198.18.0.12"])
                    .build(),
            );
            assert_eq!(
                settle(&mut driver).await,
                [format!("write default/traefik: {BOTH}")]
            );
            assert!(driver.writes.notes.take().is_empty());
            let marked = svc("traefik", 1)
                .ingress(&["198.18.0.11", "198.18.0.12"])
                .annotation("ferrolb.io/served-by", "node-addresses")
                .build();
            apply(&mut driver, marked);
            assert!(settle(&mut driver).await.is_empty());
        }

        #[tokio::test]
        async fn with_local_traffic_only_nodes_with_a_ready_endpoint_are_listed() {
            use crate::node_addresses::SliceFacts;
            let mut driver = two_nodes(None);
            apply(
                &mut driver,
                svc("a", 1).external_traffic_policy("Local").build(),
            );
            // No endpoint anywhere: no address, only the mark written.
            assert_eq!(
                settle(&mut driver).await,
                ["write default/a: NodeAddresses { ips: [] }"]
            );
            let slice = ServiceKey::new("default".to_string(), "a-x1".to_string());
            driver.take(Work::Slice(Event::Apply((
                slice.clone(),
                SliceFacts {
                    slice,
                    service: Some(ServiceKey::new("default".to_string(), "a".to_string())),
                    ready_nodes: ["n2".to_string()].into(),
                },
            ))));
            assert_eq!(
                settle(&mut driver).await,
                ["write default/a: NodeAddresses { ips: [198.18.0.12] }"]
            );
        }

        #[tokio::test]
        async fn servicelb_s_finalizer_is_removed_and_an_ignored_opt_in_is_reported() {
            let mut driver = two_nodes(None);
            let with_finalizer = svc("a", 1)
                .ingress(&["198.18.0.11", "198.18.0.12"])
                .annotation("ferrolb.io/served-by", "node-addresses")
                .with(|s| {
                    s.metadata.finalizers =
                        Some(vec!["svccontroller.k3s.cattle.io/daemonset".into()])
                })
                .build();
            apply(&mut driver, with_finalizer);
            assert_eq!(
                settle(&mut driver).await,
                [format!("write default/a: {BOTH}")]
            );
            let mut driver = two_nodes(Some("198.18.200.0/30"));
            apply(
                &mut driver,
                svc("b", 1)
                    .annotation("ferrolb.io/node-addresses", "true")
                    .annotation("metallb.io/loadBalancerIPs", "198.18.200.1")
                    .build(),
            );
            assert_eq!(
                settle(&mut driver).await,
                ["write default/b: Assigned { ips: [198.18.200.1], pool: \"p\" }"]
            );
            let notes = driver.writes.notes.take();
            assert!(
                notes.contains(&"default/b: NodeAddressesIgnored".to_string()),
                "{notes:?}"
            );
        }

        #[tokio::test]
        async fn a_burst_of_services_each_gets_its_addresses() {
            let mut driver = two_nodes(None);
            for i in 0..50 {
                // A port of its own: nobody's port is held.
                apply(
                    &mut driver,
                    svc_on(&format!("s{i:02}"), i, 1000 + i as i32).build(),
                );
            }
            let writes = settle(&mut driver).await;
            assert_eq!(writes.len(), 50, "{writes:?}");
            assert!(writes.iter().all(|w| w.ends_with(BOTH)), "{writes:?}");
        }

        #[tokio::test]
        async fn a_service_left_without_a_node_takes_a_pool_address_that_frees_up() {
            let mut driver = two_nodes(Some("198.18.200.0/32"));
            apply(&mut driver, svc("holder", 1).build());
            settle(&mut driver).await;
            // Every speaker gone: b gets no node, and is marked.
            alive(&mut driver, &[]);
            apply(&mut driver, svc("b", 2).port(443, "TCP").build());
            assert_eq!(
                settle(&mut driver).await,
                ["write default/b: NodeAddresses { ips: [] }"]
            );
            apply(
                &mut driver,
                svc("b", 2)
                    .port(443, "TCP")
                    .annotation("ferrolb.io/served-by", "node-addresses")
                    .build(),
            );
            driver.take(Work::Service(Box::new(Event::Delete(CachedService::new(
                svc("holder", 1).build(),
            )))));
            assert_eq!(
                settle(&mut driver).await,
                ["write default/b: Assigned { ips: [198.18.200.0], pool: \"p\" }"]
            );
        }

        #[tokio::test]
        async fn node_addresses_off_leave_a_service_without_a_pool_pending() {
            let mut driver = driver_with(None, false);
            apply(&mut driver, svc("a", 1).build());
            assert_eq!(settle(&mut driver).await, ["write default/a: Untouched"]);
            assert_eq!(driver.writes.notes.take(), ["default/a: AllocationFailed"]);
        }
    }
}
