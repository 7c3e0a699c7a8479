//! Layer 2's part of the work loop: the membership check (who may own IPs now, and until when
//! this node may answer) and the layer 2 step (the plan carried out by the responders, with its
//! Events, metrics and live report). The rules are pure and live beside this module ([`gate`],
//! [`plan`], [`step`]); this is the state between steps and the I/O through
//! [`LoopIo`](crate::run::loop_io::LoopIo).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use ferrolb_config::allocator::ServiceKey;
use ferrolb_config::model::Config;
use ferrolb_layer2::liveness::Member;

use crate::l2::interfaces::Interface;
use crate::l2::planner::Planner;
use crate::l2::status::Desired;
use crate::l2::{gate, presence, readiness, step};
use crate::metrics::{AnnouncedLabels, Metrics};
use crate::report::live::{Layer2Step, Live};
use crate::report::{self, Standing};
use crate::run::loop_io::{Heartbeats, LoopIo};
use crate::service_views::{Changed, ServiceViews};
use crate::view::{NodeMap, NodeView};
use ferrolb_explain::speaker_report::NodeState;

/// Who may own IPs, from [`Layer2::check`].
pub(crate) struct Membership {
    /// The interfaces that may announce.
    pub usable: BTreeMap<String, Interface>,
    /// The Nodes, reduced to what planning reads (shared while they do not change).
    pub nodes: Arc<NodeMap>,
    /// The speakers that may own IPs, this node included when it may.
    pub members: BTreeMap<String, Member>,
    /// Whether this node claims IPs now.
    pub claims: bool,
    /// Until when this node may answer for what it owns: the mandate after this check, cut
    /// short by the tenure (`ferrolb_layer2::tenure`); `None`: not at all now.
    pub answer_until: Option<Instant>,
    /// What the check found, for the live report.
    pub standing: Standing,
}

/// What a step carried out was computed from.
#[derive(Debug, PartialEq, Eq)]
struct CarriedOut {
    /// `Planner::announce_generation`.
    announce: u64,
    /// `ServiceViews::uids_generation`.
    uids: u64,
    /// The interfaces that may announce.
    usable: BTreeMap<String, Interface>,
}

/// What the layer 2 step reads of this speaker's settings.
pub(crate) struct Settings {
    /// This node's name.
    pub me: String,
    /// Interface name prefixes never announced on.
    pub ignore_interfaces: Vec<String>,
    /// The gate's timers.
    pub timing: gate::Timing,
}

/// Layer 2's state between steps.
pub(crate) struct Layer2 {
    settings: Settings,
    /// The known speakers, from their presence Leases as seen over time.
    known: presence::Known,
    /// Who may own IPs, and until when this node may answer.
    gate: gate::Gate,
    /// Whether the last check claimed with a lapsed tenure (to log the changes).
    tenure_lapsed: bool,
    /// What the last membership check found, for `/readyz` (and to log changes).
    state: readiness::Layer2State,
    /// Whether an L2Advertisement selects this node, as of the last membership check.
    announces: bool,
    /// Whether the last check let this node act (for logging the changes).
    acted: bool,
    /// The plan kept between steps, shared with the live report.
    planner: Arc<Mutex<Planner>>,
    /// `metallb_speaker_announced` label sets currently set.
    pub(crate) announced: BTreeSet<(ServiceKey, IpAddr)>,
    /// What the last step carried out came from: while it stays, a step has nothing to do.
    carried_out: Option<CarriedOut>,
    /// Announcement failures already reported with an Event.
    failures: step::FailureLog,
    metrics: Metrics,
    /// The live report `kubectl ferrolb explain` reads.
    live: Live,
    /// The Nodes as the last check read them.
    nodes_read: Option<NodesRead>,
}

/// The Nodes as a membership check read them, kept while the cache's generation stays: the
/// check runs every heartbeat interval, and reading every Node each time would cost O(N) at
/// rest. Shared with the plan, which then sees at once that no Node changed.
struct NodesRead {
    /// The generation of the Node cache they were read at.
    generation: u64,
    nodes: Arc<NodeMap>,
    /// Each Node's addresses, for the voters' link.
    addresses: Arc<BTreeMap<String, Vec<IpAddr>>>,
}

impl Layer2 {
    /// The state of a speaker that has just started.
    pub fn new(settings: Settings, metrics: Metrics, live: Live) -> Self {
        Layer2 {
            gate: gate::Gate::new(settings.timing),
            planner: Arc::new(Mutex::new(Planner::new(&settings.me))),
            known: presence::Known::default(),
            settings,
            tenure_lapsed: false,
            state: readiness::Layer2State::default(),
            announces: true,
            acted: false,
            announced: BTreeSet::new(),
            carried_out: None,
            failures: step::FailureLog::default(),
            metrics,
            live,
            nodes_read: None,
        }
    }

    /// When the gate next needs a check without any event (a settle or hold time ending).
    pub fn wake_at(&self, now: Instant) -> Option<Instant> {
        self.gate.wake_at(now)
    }

    /// What `/readyz` says now (`readiness`); called once the caches are synced.
    pub fn readiness(&self) -> Result<(), &'static str> {
        readiness::readiness(true, self.announces, self.state)
    }

    /// Who may own IPs now (the quorum rule, settling and the claim delay), and the inputs
    /// that go with it. Cheap: no planning. `config` is the last configuration read, if any.
    pub async fn check<Io: LoopIo>(
        &mut self,
        io: &mut Io,
        config: Option<&Config>,
        links: &BTreeMap<String, Interface>,
        now: Instant,
    ) -> Membership {
        // Owned: the steps below borrow `self` mutably.
        let me = self.settings.me.clone();
        let me = me.as_str();
        let usable: BTreeMap<String, Interface> = links
            .iter()
            .filter(|(_, i)| i.usable(&self.settings.ignore_interfaces))
            .map(|(n, i)| (n.clone(), i.clone()))
            .collect();
        let usable_names: BTreeSet<String> = usable.keys().cloned().collect();
        let generation = io.nodes_generation();
        let read = match self.nodes_read.take() {
            Some(read) if read.generation == generation => read,
            _ => {
                let nodes: NodeMap = io
                    .nodes()
                    .iter()
                    .map(|v| (v.name.clone(), NodeView::clone(v)))
                    .collect();
                // Heartbeat state is kept for Nodes only: a deleted Node's entry goes, and junk
                // names cannot grow the table (ferrolb_layer2::liveness::Membership::set_nodes).
                io.set_peers(
                    nodes
                        .values()
                        .filter(|n| n.name != me)
                        .filter_map(|n| n.addresses.first().copied())
                        .collect(),
                    nodes.keys().cloned().collect(),
                );
                let addresses = nodes
                    .iter()
                    .map(|(n, v)| (n.clone(), v.addresses.clone()))
                    .collect();
                NodesRead {
                    generation,
                    nodes: Arc::new(nodes),
                    addresses: Arc::new(addresses),
                }
            }
        };
        let (nodes, addresses) = (read.nodes.clone(), read.addresses.clone());
        self.nodes_read = Some(read);
        let (o, known, heard) = match io.voters() {
            // The voters decide: the presence set is the Nodes, the reports the voters'.
            Some(link) => {
                let checked = link.check(&addresses, &usable_names, now);
                // The speakers known and heard, as the heartbeats count them: the presence set,
                // and the other speakers the voters list.
                let (known, heard) = (checked.roster, checked.peers_alive);
                (
                    gate::Outcome::by_voters(me, checked, &usable_names),
                    known,
                    heard,
                )
            }
            None => self.check_by_heartbeats(io, me, &nodes, &usable_names, now),
        };
        self.log_changes(&o, known, heard, now);
        io.say(o.acts, usable_names).await;
        self.count(&o, known, heard);
        self.state = o.state;
        // Before the first configuration is read, count layer 2 as announcing here: the doubt
        // goes the way that keeps a rolling update waiting.
        self.announces =
            config.is_none_or(|config| readiness::announces_here(config, nodes.get(me)));
        let standing = Standing {
            may_own: o.acts,
            quorum: o.verdict.quorum,
            known,
            heard,
            held_back: o.held_until.is_some(),
        };
        Membership {
            usable,
            nodes,
            members: o.members,
            claims: o.claims,
            answer_until: o.answer_until,
            standing,
        }
    }

    /// Who may own IPs, this node included, and until when it may answer, by today's
    /// membership: the gate's rules, from the known speakers, the heartbeat table and the
    /// acknowledgements. Returns the outcome, the known speakers and the peers heard.
    fn check_by_heartbeats<Io: LoopIo>(
        &mut self,
        io: &Io,
        me: &str,
        nodes: &BTreeMap<String, NodeView>,
        usable: &BTreeSet<String>,
        now: Instant,
    ) -> (gate::Outcome, usize, usize) {
        let known = self
            .known
            .observe(&io.presence(), &nodes.keys().cloned().collect(), now);
        let Heartbeats {
            reports,
            acks,
            tenure,
            last_unready_seq,
        } = io.heartbeats(&known, now);
        let o = self.gate.check(
            gate::Inputs {
                me,
                known: &known,
                reports: &reports,
                acks: &acks,
                tenure,
                last_unready_seq,
                usable,
            },
            now,
        );
        (o, known.len(), reports.len())
    }

    /// Logs what changed in the gate's outcome since the last check.
    fn log_changes(&mut self, o: &gate::Outcome, known: usize, heard: usize, now: Instant) {
        if o.starved {
            tracing::warn!(
                "this node's heartbeats reach the other speakers too late to prove it is heard: handing its layer 2 IPs over"
            );
        }
        if o.held_until.is_some() != self.state.held {
            match o.held_until {
                Some(until) => tracing::warn!(
                    hold = ?until.saturating_duration_since(now),
                    "quorum regained after a loss: holding back from owning layer 2 IPs for a while (flap damping)"
                ),
                None => tracing::info!("flap damping over: this node may own layer 2 IPs again"),
            }
        }
        if self.gate.waiting_to_claim() {
            tracing::debug!("waiting for every candidate to hear this node ready before claiming");
        }
        if o.acts != self.acted {
            if o.acts {
                tracing::info!(known, heard, "quorum: this node may own layer 2 IPs");
            } else if o.state.settled {
                tracing::warn!(
                    known,
                    heard,
                    quorum = o.verdict.quorum,
                    heard_by_majority = o.verdict.up,
                    "no quorum: this node gives up its layer 2 IPs until it hears, and is heard by, a majority of the known speakers"
                );
            }
            self.acted = o.acts;
        }
        if o.tenure_lapsed() != self.tenure_lapsed {
            if o.tenure_lapsed() {
                // Debug: under lossy heartbeats this changes many times a second; the metric
                // counts it.
                tracing::debug!(
                    "tenure lapsed: not answering for this node's layer 2 IPs until the other speakers' acknowledgements of its heartbeats catch up"
                );
            } else {
                tracing::debug!("tenure back: answering for this node's layer 2 IPs again");
            }
            self.tenure_lapsed = o.tenure_lapsed();
        }
    }

    /// Sets the membership metrics from the gate's outcome.
    fn count(&self, o: &gate::Outcome, known: usize, heard: usize) {
        self.metrics.damped.set(i64::from(o.held_until.is_some()));
        self.metrics.quorum.set(i64::from(o.verdict.acts()));
        self.metrics
            .speakers_known
            .set(i64::try_from(known).unwrap_or(i64::MAX));
        self.metrics
            .peers_alive
            .set(i64::try_from(heard).unwrap_or(i64::MAX));
        if o.tenure_lapsed() {
            self.metrics.tenure_lapsed.inc();
        }
    }

    /// The periodic check between steps: when the members are still those the last plan was
    /// made with, renews the mandate to answer (see `announce::Mandate`) and returns true;
    /// otherwise returns false, and the loop plans again.
    pub async fn still_valid<Io: LoopIo>(
        &mut self,
        io: &mut Io,
        config: Option<&Config>,
        links: &BTreeMap<String, Interface>,
        now: Instant,
    ) -> bool {
        let m = self.check(io, config, links, now).await;
        let same = {
            let planned = self.planner.lock().unwrap_or_else(PoisonError::into_inner);
            m.members == *planned.members()
        };
        if !same {
            return false;
        }
        if m.claims {
            io.renew(m.answer_until.unwrap_or(now));
        }
        true
    }

    /// The layer 2 step: plans who owns each IP (again only where something changed), has the
    /// responders answer for this node's, reports failures once, and sets the metrics and the
    /// live report. Returns what this node reports in ServiceL2Status, or `None` when that,
    /// and what the responders answer for, are as the last step left them (most steps: a
    /// change elsewhere in the cluster; carrying them out again would cost a pass over every
    /// IP this node owns).
    pub fn step<Io: LoopIo>(
        &mut self,
        io: &mut Io,
        config: &Arc<Config>,
        membership: Membership,
        views: &ServiceViews,
        changed: &Changed,
        now: Instant,
    ) -> Option<Desired> {
        let Membership {
            usable,
            nodes,
            members,
            claims,
            answer_until,
            standing,
        } = membership;
        let me_node = report::node_state(nodes.get(&self.settings.me));
        let members_now = members.len();
        if claims {
            io.renew(answer_until.unwrap_or(now));
        }
        let planner = self.planner.clone();
        let mut planner = planner.lock().unwrap_or_else(PoisonError::into_inner);
        let replanned = planner.update(config, nodes, members, views.views(), changed);
        self.metrics
            .replanned
            .inc_by(u64::try_from(replanned).unwrap_or(u64::MAX));
        let plan = planner.plan();
        let inputs = CarriedOut {
            announce: planner.announce_generation(),
            uids: views.uids_generation(),
            usable: usable.clone(),
        };
        if self.carried_out.as_ref() == Some(&inputs) {
            tracing::debug!(replanned, "planned: nothing to carry out");
            drop(planner);
            self.publish(me_node, standing, usable);
            return None;
        }
        let failures = io.announce(&plan.announce, &usable);
        // A responder that could not be set up is tried again at the next step.
        self.carried_out = failures.is_empty().then_some(inputs);
        for (interface, error) in &failures {
            tracing::warn!(%interface, %error, "cannot announce");
        }
        for report in self.failures.new_reports(plan, &failures) {
            io.announce_failed(&report.service, views.uid(&report.service), report.message);
        }
        let desired = step::reported(plan, |key| views.uid(key), |key| planner.taken_from(key));
        let announced = step::announced(plan);
        tracing::debug!(
            services = plan.services.len(),
            replanned,
            owned = plan.announce.len(),
            members = members_now,
            "planned"
        );
        drop(planner);
        self.set_announced(announced);
        self.publish(me_node, standing, usable);
        Some(desired)
    }

    /// Hands the live report this step's standing; the report reads the planner only when
    /// someone asks for it. Called with the planner unlocked: the report locks the live report
    /// first, then the planner.
    fn publish(
        &self,
        node: NodeState,
        standing: Standing,
        interfaces: BTreeMap<String, Interface>,
    ) {
        self.live.set_layer2(Layer2Step {
            node,
            standing,
            interfaces,
            planner: self.planner.clone(),
        });
    }

    /// Sets `metallb_speaker_announced` for what this node announces now, and removes the
    /// label sets of what it no longer does.
    fn set_announced(&mut self, announced: BTreeSet<(ServiceKey, IpAddr)>) {
        for (key, ip) in self.announced.difference(&announced) {
            self.metrics
                .announced
                .remove(&self.announced_labels(key, *ip));
        }
        for (key, ip) in announced.difference(&self.announced) {
            self.metrics
                .announced
                .get_or_create(&self.announced_labels(key, *ip))
                .set(1);
        }
        self.announced = announced;
    }

    fn announced_labels(&self, key: &ServiceKey, ip: IpAddr) -> AnnouncedLabels {
        vec![
            ("service", key.to_string()),
            ("protocol", "layer2".to_string()),
            ("node", self.settings.me.clone()),
            ("ip", ip.to_string()),
        ]
    }
}
