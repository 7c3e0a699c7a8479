//! One step of the work loop: the configuration read when it changed, the layer 2 membership
//! check, then the BGP step and the layer 2 step side by side, each from the same views of the
//! cluster. [`Speaker`] is generic over [`LoopIo`], so its rules are tested here against a fake
//! world.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use crate::args::Args;
use crate::l2::gate;
use crate::l2::interfaces::Interface;
use crate::l2::status::Desired;
use crate::l2::work::{Layer2, Membership, Settings};
use crate::metrics::Metrics;
use crate::report::live::Live;
use crate::run::loop_io::LoopIo;
use crate::service_views::ServiceViews;

/// The work loop's state; `io` is what it reads and does outside itself ([`LoopIo`]).
pub(crate) struct Speaker<Io> {
    pub(crate) args: Args,
    pub(crate) io: Io,
    /// The configuration, recomputed when a configuration object changes.
    config: Option<Arc<ferrolb_config::model::Config>>,
    /// Layer 2's state between steps.
    pub(crate) layer2: Layer2,
    /// The Service views, rebuilt for the Services that changed.
    views: ServiceViews,
    metrics: Metrics,
}

impl<Io> Speaker<Io> {
    /// The loop's state for a speaker that has just started.
    pub fn new(args: Args, io: Io, metrics: Metrics, live: Live) -> Self {
        let settings = Settings {
            me: args.node_name.clone(),
            ignore_interfaces: args.ignore_interfaces.clone(),
            timing: gate::Timing {
                heartbeat_interval: args.heartbeat_interval,
                failure_timeout: args.failure_timeout,
                mandate: gate::mandate_for(args.failure_timeout, args.heartbeat_interval),
                flap_damping: args.flap_damping,
            },
        };
        Speaker {
            layer2: Layer2::new(settings, metrics.clone(), live),
            io,
            config: None,
            views: ServiceViews::default(),
            metrics,
            args,
        }
    }

    /// What `/readyz` says now (`crate::l2::readiness`); called once the caches are synced.
    pub fn readiness(&self) -> Result<(), &'static str> {
        self.layer2.readiness()
    }
}

impl<Io: LoopIo> Speaker<Io> {
    /// The periodic check between steps: when the members are still those the last plan was
    /// made with, renews the mandate to answer and returns true; otherwise returns false, and
    /// the loop plans again.
    pub async fn still_valid(&mut self, links: &BTreeMap<String, Interface>) -> bool {
        self.still_valid_at(links, Instant::now()).await
    }

    async fn still_valid_at(&mut self, links: &BTreeMap<String, Interface>, now: Instant) -> bool {
        let config = self.config.clone();
        self.layer2
            .still_valid(&mut self.io, config.as_deref(), links, now)
            .await
    }

    /// One step: the configuration, who may own, then BGP and layer 2 each carrying out their
    /// plan. Returns what this node reports in ServiceL2Status, `None` when it did not change.
    pub async fn step(&mut self, links: &BTreeMap<String, Interface>) -> Option<Desired> {
        self.step_at(links, Instant::now()).await
    }

    async fn step_at(
        &mut self,
        links: &BTreeMap<String, Interface>,
        now: Instant,
    ) -> Option<Desired> {
        if self.io.take_config_dirty() || self.config.is_none() {
            let validated = self.io.validated(&self.args.common.namespace);
            self.metrics.config_loaded.set(1);
            self.metrics
                .config_stale
                .set(i64::from(!validated.is_valid()));
            // The controller's IPAddressPool status writes (pool counters, one per
            // allocation) wake this too: only a configuration that differs is a new one, and
            // only a new one makes the planner plan every Service again.
            if self.config.as_deref() != Some(&validated.config) {
                self.config = Some(Arc::new(validated.config));
            }
        }
        let config = self.config.clone().unwrap_or_default();
        let membership = self
            .layer2
            .check(&mut self.io, Some(&config), links, now)
            .await;
        let changed = self.io.take_changed();
        let changed = self.views.refresh(&self.io, changed);
        self.bgp_step(&config, &membership);
        self.layer2.step(
            &mut self.io,
            &config,
            membership,
            &self.views,
            &changed,
            now,
        )
    }

    /// BGP: every eligible node advertises (ECMP), independent of the layer 2 owner choice.
    /// While this node may own layer 2 IPs it also knows the live members, and may then sweep
    /// departed nodes' ServiceBGPStatus.
    fn bgp_step(&mut self, config: &ferrolb_config::model::Config, membership: &Membership) {
        let advertised = self.io.advertise(
            config,
            &membership.nodes,
            &self.args.node_name,
            self.views.views(),
            membership.claims.then_some(&membership.members),
        );
        tracing::debug!(services = advertised, "advertised over BGP");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use std::cell::{Cell, RefCell};
    use std::collections::BTreeSet;
    use std::net::IpAddr;
    use std::time::Duration;

    use crate::run::loop_io::Heartbeats;
    use crate::view::{NodeView, ServiceObject, SliceObject};
    use ferrolb_config::allocator::ServiceKey;
    use ferrolb_layer2::liveness::Member;

    use crate::l2::plan::Announcement;
    use crate::service_views::{Changed, Source, ViewMap};
    use clap::Parser;
    use ferrolb_config::model::Config;
    use ferrolb_config::validate::{Objects, Validated};
    use ferrolb_layer2::heartbeat::Heard;
    use ferrolb_layer2::quorum::Report;
    use ferrolb_layer2::tenure::Tenure;
    use ferrolb_testkit::objects;
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::{Node, Service};
    use k8s_openapi::api::discovery::v1::EndpointSlice;

    const NODES: [&str; 3] = ["node1", "node2", "node3"];
    const IP: &str = "198.18.200.0";

    fn node(name: &str, address: &str) -> Arc<Node> {
        Arc::new(objects::node(name).internal_ip(address).build())
    }

    fn presence(name: &str) -> Arc<Lease> {
        Arc::new(
            objects::lease(&format!("ferrolb-speaker-{name}"))
                .namespace("metallb-system")
                .holder(name)
                .duration_seconds(40)
                .renew_time("2026-12-02T12:00:00Z")
                .build(),
        )
    }

    /// Service `web` holding [`IP`], traffic policy Local: only nodes with a ready endpoint
    /// may announce it.
    fn web() -> Arc<Service> {
        Arc::new(
            objects::service("web")
                .namespace("default")
                .uid("uid-web")
                .external_traffic_policy("Local")
                .port(80, "TCP")
                .ingress(&[IP])
                .build(),
        )
    }

    /// `web`'s endpoints: one ready pod on each of `nodes`.
    fn endpoints_on(nodes: &[&str]) -> Arc<EndpointSlice> {
        let slice = nodes.iter().enumerate().fold(
            objects::endpoint_slice("web-1")
                .namespace("default")
                .service("web")
                .port(None, 8080, "TCP"),
            |slice, (i, n)| {
                slice.endpoint(
                    objects::endpoint(&format!("10.0.{i}.1"))
                        .node(n)
                        .ready(true),
                )
            },
        );
        Arc::new(slice.build())
    }

    fn validated() -> Validated {
        let mut objects = Objects {
            namespace: "metallb-system".into(),
            ..Default::default()
        };
        let errors = ferrolb_config::manifest::read_manifests(
            "apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: lab, namespace: metallb-system}
spec: {addresses: [198.18.200.0/24]}
---
apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {name: l2, namespace: metallb-system}
",
            "test.yaml",
            &mut objects,
        );
        assert!(errors.is_empty(), "{errors:?}");
        ferrolb_config::validate::validate(&objects)
    }

    fn eth0() -> BTreeMap<String, Interface> {
        BTreeMap::from([(
            "eth0".to_string(),
            Interface {
                name: "eth0".into(),
                index: 2,
                mac: Some([2, 0, 0, 0, 0, 1]),
                flags: 1,
                oper_up: true,
                enslaved: false,
            },
        )])
    }

    /// The world as node1 sees it: three speakers, `web` served from `endpoints`, and the
    /// peers it hears (each hearing every node, node1 as ready as node1 says it is).
    struct Fake {
        nodes: Vec<Arc<Node>>,
        services: Vec<Arc<Service>>,
        slices: Vec<Arc<EndpointSlice>>,
        heard: Vec<&'static str>,
        config_dirty: Cell<bool>,
        validations: Cell<usize>,
        /// What node1's heartbeats said, in order.
        said: RefCell<Vec<bool>>,
        /// Every announcement plan handed to the responders.
        announced: Vec<BTreeMap<IpAddr, Announcement>>,
        /// Interfaces the responders cannot set up.
        broken: Vec<String>,
        renewed: Cell<usize>,
        events: RefCell<Vec<(ServiceKey, Option<String>, String)>>,
        /// Which Services changed, as the watches would say: everything at first.
        changed: RefCell<Changed>,
    }

    impl Fake {
        fn new(heard: &[&'static str], endpoints: &[&str]) -> Self {
            Fake {
                nodes: NODES
                    .iter()
                    .enumerate()
                    .map(|(i, n)| node(n, &format!("198.18.0.{}", 11 + i)))
                    .collect(),
                services: vec![web()],
                slices: vec![endpoints_on(endpoints)],
                heard: heard.to_vec(),
                config_dirty: Cell::new(false),
                validations: Cell::new(0),
                said: RefCell::new(Vec::new()),
                announced: Vec::new(),
                broken: Vec::new(),
                renewed: Cell::new(0),
                events: RefCell::new(Vec::new()),
                changed: RefCell::new(Changed::All),
            }
        }

        /// Whether the last plan handed to the responders answers for [`IP`].
        fn answers(&self) -> bool {
            self.announced
                .last()
                .is_some_and(|plan| plan.contains_key(&IP.parse::<IpAddr>().unwrap()))
        }
    }

    impl Source for Fake {
        fn services(&self) -> Vec<Arc<ServiceObject>> {
            ServiceObject::reduce_all(&self.services, None)
        }
        fn slices(&self) -> Vec<Arc<SliceObject>> {
            SliceObject::reduce_all(&self.slices)
        }
        fn take_changed(&self) -> Changed {
            self.changed.replace(Changed::Keys(BTreeSet::new()))
        }
    }

    impl LoopIo for Fake {
        fn nodes(&self) -> Vec<Arc<NodeView>> {
            self.nodes
                .iter()
                .map(|n| Arc::new(NodeView::from_node(n)))
                .collect()
        }

        fn nodes_generation(&self) -> u64 {
            // The fake's Nodes never change.
            0
        }
        fn presence(&self) -> Vec<Arc<Lease>> {
            NODES.iter().map(|n| presence(n)).collect()
        }
        fn take_config_dirty(&self) -> bool {
            self.config_dirty.replace(false)
        }
        fn validated(&self, _namespace: &str) -> Validated {
            self.validations.set(self.validations.get() + 1);
            validated()
        }
        fn set_peers(&self, _addresses: Vec<IpAddr>, _nodes: BTreeSet<String>) {}
        fn heartbeats(&self, _known: &BTreeSet<String>, _now: Instant) -> Heartbeats {
            let me_ready = self.said.borrow().last().copied().unwrap_or(false);
            let reports = self
                .heard
                .iter()
                .map(|peer| {
                    let hears = NODES
                        .iter()
                        .filter(|n| *n != peer)
                        .map(|n| (n.to_string(), *n != "node1" || me_ready))
                        .collect();
                    let report = Report {
                        fresh: true,
                        ready: true,
                        held: false,
                        hears,
                        interfaces: ["eth0".to_string()].into(),
                    };
                    (peer.to_string(), report)
                })
                .collect();
            let acks = self
                .heard
                .iter()
                .map(|p| {
                    let heard = Heard {
                        ready: me_ready,
                        boot: 1,
                        seq: 10,
                    };
                    (p.to_string(), heard)
                })
                .collect();
            let tenure = if self.heard.is_empty() {
                Tenure::Lapsed
            } else {
                Tenure::Unbounded
            };
            Heartbeats {
                reports,
                acks,
                tenure,
                last_unready_seq: 0,
            }
        }
        async fn say(&self, acts: bool, _interfaces: BTreeSet<String>) {
            self.said.borrow_mut().push(acts);
        }
        fn announce(
            &mut self,
            plan: &BTreeMap<IpAddr, Announcement>,
            _usable: &BTreeMap<String, Interface>,
        ) -> Vec<(String, String)> {
            self.announced.push(plan.clone());
            plan.values()
                .flat_map(|a| &a.interfaces)
                .filter(|i| self.broken.contains(i))
                .map(|i| (i.clone(), "no responder".to_string()))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect()
        }
        fn renew(&self, _until: Instant) {
            self.renewed.set(self.renewed.get() + 1);
        }
        fn advertise(
            &mut self,
            _config: &Config,
            _nodes: &BTreeMap<String, NodeView>,
            _me: &str,
            _services: &ViewMap,
            _alive: Option<&BTreeMap<String, Member>>,
        ) -> usize {
            0
        }
        fn announce_failed(&self, key: &ServiceKey, uid: Option<String>, why: String) {
            self.events.borrow_mut().push((key.clone(), uid, why));
        }
    }

    fn speaker(io: Fake) -> Speaker<Fake> {
        let args = Args::try_parse_from([
            "ferrolb-speaker",
            "--node-name",
            "node1",
            "--gossip-key-file",
            "unread-in-tests",
        ])
        .unwrap();
        Speaker::new(args, io, Metrics::new().0, Live::new("node1"))
    }

    /// Steps every 100 ms for `steps` steps from `t0`; returns the last step's report.
    async fn run_steps(s: &mut Speaker<Fake>, t0: Instant, steps: u32) -> Desired {
        let mut desired = Desired::new();
        for i in 0..steps {
            if let Some(d) = s
                .step_at(&eth0(), t0 + Duration::from_millis(100) * i)
                .await
            {
                desired = d;
            }
        }
        desired
    }

    #[tokio::test]
    async fn a_node_hearing_a_majority_announces_what_only_it_can_serve_and_reports_it() {
        let mut s = speaker(Fake::new(&["node2", "node3"], &["node1"]));
        let t0 = Instant::now();
        // Before the settle time (the failure timeout) nothing is claimed.
        run_steps(&mut s, t0, 3).await;
        assert!(
            !s.io.answers(),
            "claimed before hearing the others for a failure timeout"
        );
        let desired = run_steps(&mut s, t0, 15).await;
        assert!(s.io.answers(), "plans: {:?}", s.io.announced.last());
        assert_eq!(s.io.said.borrow().last(), Some(&true));
        assert!(
            desired.contains_key(&ServiceKey::new("default", "web")),
            "{desired:?}"
        );
        assert_eq!(s.readiness(), Ok(()));
        assert!(s.io.renewed.get() > 0, "the mandate was never given");
        assert_eq!(s.io.validations.get(), 1, "validated again with no change");
        // A configuration change is read at the next step; when it comes to the same
        // configuration (a pool's status written), the planner keeps its plan.
        let before = s.config.clone().unwrap();
        s.io.config_dirty.set(true);
        let again = s.step_at(&eth0(), t0 + Duration::from_secs(2)).await;
        assert_eq!(s.io.validations.get(), 2);
        assert!(Arc::ptr_eq(&before, s.config.as_ref().unwrap()));
        assert_eq!(
            again, None,
            "planned and carried out again for the same configuration"
        );
    }

    /// Issue #40: a step in which nothing this node announces changed (a change elsewhere in
    /// the cluster, a timer) hands nothing to the responders or the status writer.
    #[tokio::test]
    async fn a_step_with_nothing_changed_carries_out_nothing() {
        let mut s = speaker(Fake::new(&["node2", "node3"], &["node1"]));
        let t0 = Instant::now();
        run_steps(&mut s, t0, 15).await;
        assert!(s.io.answers());
        let handed = s.io.announced.len();
        let again = s.step_at(&eth0(), t0 + Duration::from_secs(2)).await;
        assert_eq!(again, None, "reported again with no change");
        assert_eq!(
            s.io.announced.len(),
            handed,
            "the responders were handed the plan again"
        );
        // A Service of this node changes: carried out again.
        s.io.slices = vec![endpoints_on(&["node1", "node2"])];
        s.io.changed
            .borrow_mut()
            .mark(ServiceKey::new("default", "web"));
        let changed = s.step_at(&eth0(), t0 + Duration::from_secs(3)).await;
        assert!(changed.is_some());
        assert_eq!(s.io.announced.len(), handed + 1);
        // An interface change always is.
        let mut links = eth0();
        links.get_mut("eth0").unwrap().mac = Some([2, 0, 0, 0, 0, 9]);
        assert!(
            s.step_at(&links, t0 + Duration::from_secs(4))
                .await
                .is_some()
        );
        assert_eq!(s.io.announced.len(), handed + 2);
    }

    #[tokio::test]
    async fn a_node_cut_off_from_the_others_never_announces_and_says_so() {
        // node1 hears nobody while the API server knows three speakers: the minority.
        let mut s = speaker(Fake::new(&[], &["node1"]));
        let desired = run_steps(&mut s, Instant::now(), 30).await;
        assert!(
            s.io.announced.iter().all(|plan| plan.is_empty()),
            "a cut-off node answered: {:?}",
            s.io.announced
        );
        assert!(s.io.said.borrow().iter().all(|acts| !acts));
        assert!(desired.is_empty());
        assert!(s.readiness().is_err(), "a cut-off speaker reported ready");
    }

    #[tokio::test]
    async fn the_node_stops_announcing_when_its_endpoints_leave() {
        let mut s = speaker(Fake::new(&["node2", "node3"], &["node1"]));
        let t0 = Instant::now();
        run_steps(&mut s, t0, 15).await;
        assert!(s.io.answers());
        // The pod moved to node2 (traffic policy Local): node2 answers now, node1 not at all.
        s.io.slices = vec![endpoints_on(&["node2"])];
        s.io.changed
            .borrow_mut()
            .mark(ServiceKey::new("default", "web"));
        let desired = s
            .step_at(&eth0(), t0 + Duration::from_secs(2))
            .await
            .expect("what it announces changed");
        assert!(
            !s.io.answers(),
            "still answering: {:?}",
            s.io.announced.last()
        );
        assert!(desired.is_empty(), "still reported: {desired:?}");
        assert!(
            s.layer2.announced.is_empty(),
            "the announced metric kept {:?}",
            s.layer2.announced
        );
    }

    #[tokio::test]
    async fn an_announcement_failure_is_one_event_not_one_per_step() {
        let mut fake = Fake::new(&["node2", "node3"], &["node1"]);
        fake.broken = vec!["eth0".into()];
        let mut s = speaker(fake);
        run_steps(&mut s, Instant::now(), 30).await;
        let events = s.io.events.borrow();
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].0, ServiceKey::new("default", "web"));
        assert_eq!(events[0].1.as_deref(), Some("uid-web"));
    }

    #[tokio::test]
    async fn checks_between_steps_renew_the_mandate_until_the_members_change() {
        let mut s = speaker(Fake::new(&["node2", "node3"], &["node1"]));
        let t0 = Instant::now();
        run_steps(&mut s, t0, 15).await;
        let renewed = s.io.renewed.get();
        assert!(
            s.still_valid_at(&eth0(), t0 + Duration::from_millis(1500))
                .await
        );
        assert_eq!(s.io.renewed.get(), renewed + 1);
        // node3 falls silent: node1 still holds a majority with node2, but the members it
        // planned with changed, so it must plan again.
        s.io.heard = vec!["node2"];
        assert!(
            !s.still_valid_at(&eth0(), t0 + Duration::from_millis(1600))
                .await
        );
    }
}
