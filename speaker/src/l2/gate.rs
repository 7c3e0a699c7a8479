//! The layer 2 gate: whether this node may own IPs now, and until when it may answer, from one
//! membership check's inputs. Pure: the work loop (`l2/work.rs`) reads the caches and the
//! heartbeat table, calls [`Gate::check`], and carries the outcome out (the `ready` flag of its
//! heartbeats, the members it plans with, the mandate of the ARP/NDP responders, logs, metrics).
//!
//! The rules, in the order they apply (decision record 0015 says why each exists):
//! 1. **Settling**: a node may own IPs only a failure timeout after it became able to (a usable
//!    interface), so it has heard the others first.
//! 2. **Quorum** (`ferrolb_layer2::quorum`): it hears a majority of the known speakers and a
//!    majority hears it.
//! 3. **Tenure** (`ferrolb_layer2::tenure`): it answers only until the others can first have
//!    stopped hearing it, half a heartbeat interval to spare, and never beyond the mandate.
//! 4. **Starvation**: a candidate unable to answer for 2.5 failure timeouts stops acting, so the
//!    others take its IPs over rather than nobody answering them.
//! 5. **Flap damping** (`ferrolb_layer2::damping`): after a loss of quorum it says it is ready
//!    again only once held down for a while.
//! 6. **Claim delay**: it says `ready` a few heartbeats before it counts itself among the
//!    members, so nodes that became ready together hear each other first.
//! 7. **Claiming** starts only once every other candidate has said it hears this node ready, and
//!    its tenure lets it answer; it goes on while the node acts.
//! 8. **Resignation**: a heartbeat that said `ready: false` (the work loop had not confirmed
//!    recently, say after a freeze) made the others drop this node and take its IPs, even if
//!    the loop never stopped acting. At the next check it stops claiming and earns the claim
//!    again as at a rejoin: the claim delay from that check, then every other candidate's
//!    acknowledgement of a heartbeat sent after the resignation saying `ready`
//!    (`quorum::seen_ready_since`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use ferrolb_layer2::heartbeat::Heard;
use ferrolb_layer2::liveness::Member;
use ferrolb_layer2::quorum::{self, Report, Verdict};
use ferrolb_layer2::tenure::Tenure;

pub use ferrolb_layer2::gate::{CLAIM_AFTER_BEATS, Timing, mandate_for};

use crate::l2::readiness::Layer2State;
use crate::l2::step;

/// What one membership check reads: the known speakers, the heartbeat table, this node's
/// tenure and its usable interfaces.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    /// This node's name.
    pub me: &'a str,
    /// The known speakers (presence Leases).
    pub known: &'a BTreeSet<String>,
    /// What each peer heard now (or held for a restart) said last.
    pub reports: &'a BTreeMap<String, Report>,
    /// What each peer's latest heartbeat says of this node's.
    pub acks: &'a BTreeMap<String, Heard>,
    /// This node's tenure from those acknowledgements.
    pub tenure: Tenure,
    /// The sequence number of this node's latest heartbeat that said `ready: false` (0: none),
    /// read after `acks` (rule 8).
    pub last_unready_seq: u64,
    /// This node's interfaces that can announce.
    pub usable: &'a BTreeSet<String>,
}

/// What a check decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The quorum rule's verdict.
    pub verdict: Verdict,
    /// This node acts: it says `ready` in its heartbeats (rules 1, 2, 4 and 5 allow it).
    pub acts: bool,
    /// It claims IPs: it is among the members it plans with.
    pub claims: bool,
    /// The members planning counts.
    pub members: BTreeMap<String, Member>,
    /// Until when it may answer for what it owns; `None`: not at all now.
    pub answer_until: Option<Instant>,
    /// Until when flap damping holds it back, if it does.
    pub held_until: Option<Instant>,
    /// It stopped acting because its tenure stayed lapsed (rule 4).
    pub starved: bool,
    /// What `/readyz` reads.
    pub state: Layer2State,
}

impl Outcome {
    /// The outcome of a check by the voters membership (`l2/voters.rs`): its decision, and the
    /// candidates its reports name. Only this node's interfaces are known (`usable`); every
    /// other candidate counts as able to announce anywhere, as an unheard one does here.
    pub fn by_voters(
        me: &str,
        checked: crate::l2::voters::Checked,
        usable: &BTreeSet<String>,
    ) -> Self {
        let d = checked.decision;
        let verdict = Verdict {
            quorum: d.quorum,
            up: d.quorum,
            candidates: checked
                .candidates
                .into_iter()
                .map(|n| {
                    let interfaces = (n == me).then(|| usable.clone());
                    (n, interfaces)
                })
                .collect(),
        };
        Self::decided(me, verdict, d)
    }

    /// The outcome of the shared gate's decision `d` on `verdict` (whose candidates planning
    /// counts, this node only when it claims).
    fn decided(me: &str, verdict: Verdict, d: ferrolb_layer2::gate::Decision) -> Self {
        let members = step::members(&verdict, me, d.claims);
        let state = Layer2State {
            settled: d.settled,
            acts: d.quorum,
            held: d.held_until.is_some(),
            starved: d.starved,
            claims: d.claims,
        };
        Outcome {
            verdict,
            acts: d.acts,
            claims: d.claims,
            members,
            answer_until: d.answer_until,
            held_until: d.held_until,
            starved: d.starved,
            state,
        }
    }

    /// A candidate that claims while its tenure is lapsed: it owns IPs it may not answer now.
    pub fn tenure_lapsed(&self) -> bool {
        self.claims && self.answer_until.is_none()
    }
}

/// The gate's state between checks: the shared rules ([`ferrolb_layer2::gate`]) fed with this
/// membership's quorum verdict and claim condition.
#[derive(Clone, Debug)]
pub struct Gate {
    core: ferrolb_layer2::gate::Gate,
}

impl Gate {
    /// A gate for a speaker that has just started.
    pub fn new(timing: Timing) -> Self {
        Gate {
            core: ferrolb_layer2::gate::Gate::new(timing),
        }
    }

    /// One membership check at `now`.
    pub fn check(&mut self, inputs: Inputs<'_>, now: Instant) -> Outcome {
        let settled = self.core.settle(!inputs.usable.is_empty(), now);
        // A deliberately broken build for the nemesis (issue #36, docs/plans/nemesis.md): the
        // quorum and tenure rules off. The node counts only the peers it hears as known (a
        // majority of what it hears, as a gossip view trusts itself) and answers without a
        // tenure, so a node cut off from the others goes on answering. The nemesis's checkers
        // must catch the split; no image or chart is ever built with it.
        #[cfg(feature = "nemesis-broken-quorum")]
        let heard_only: BTreeSet<String> = inputs
            .reports
            .iter()
            .filter(|(_, r)| r.fresh)
            .map(|(n, _)| n.clone())
            .chain([inputs.me.to_string()])
            .collect();
        #[cfg(feature = "nemesis-broken-quorum")]
        let (known, tenure) = (&heard_only, Tenure::Unbounded);
        #[cfg(not(feature = "nemesis-broken-quorum"))]
        let (known, tenure) = (inputs.known, inputs.tenure);
        let verdict = quorum::decide(inputs.me, known, inputs.reports, settled, inputs.usable);
        let d = self.core.decide(
            verdict.acts(),
            tenure,
            inputs.last_unready_seq,
            |after| quorum::seen_ready_since(inputs.me, &verdict, inputs.acks, after),
            now,
        );
        Outcome::decided(inputs.me, verdict, d)
    }

    /// When the loop must wake for the gate to move on (the settle time, the claim delay), if
    /// that is still ahead of `now`.
    pub fn wake_at(&self, now: Instant) -> Option<Instant> {
        self.core.wake_at(now)
    }

    /// Whether this node has acted for the claim delay but waits for the others to hear it
    /// ready before claiming.
    pub fn waiting_to_claim(&self) -> bool {
        self.core.waiting_to_claim()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::l2::readiness::readiness;
    use ferrolb_layer2::damping::Damping;
    use std::time::Duration;

    const ME: &str = "node1";

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_mandate_lapses_before_the_others_take_over() {
        // Defaults: peers take over 500 ms after the last heartbeat, which is at most one
        // interval older than the last renewal.
        assert_eq!(mandate_for(ms(500), ms(100)), ms(300));
        assert!(mandate_for(ms(500), ms(100)) + ms(100) < ms(500));
        // Never shorter than one interval, so the checks between steps can keep it.
        assert_eq!(mandate_for(ms(300), ms(100)), ms(100));
    }

    fn timing() -> Timing {
        Timing {
            heartbeat_interval: ms(100),
            failure_timeout: ms(500),
            mandate: ms(300),
            flap_damping: true,
        }
    }

    fn names(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|n| n.to_string()).collect()
    }

    fn eth0() -> BTreeSet<String> {
        names(&["eth0"])
    }

    /// Every other node's report: fresh, ready, hearing every node of `all` (this one `me_ready`).
    fn reports(all: &[&str], heard: &[&str], me_ready: bool) -> BTreeMap<String, Report> {
        heard
            .iter()
            .map(|peer| {
                let hears = all
                    .iter()
                    .filter(|n| *n != peer)
                    .map(|n| (n.to_string(), *n != ME || me_ready))
                    .collect();
                (
                    peer.to_string(),
                    Report {
                        fresh: true,
                        ready: true,
                        held: false,
                        hears,
                        interfaces: eth0(),
                    },
                )
            })
            .collect()
    }

    /// Every node of `peers` acknowledges this node's heartbeat `seq`, `ready`.
    fn acks(peers: &[&str], ready: bool, seq: u64) -> BTreeMap<String, Heard> {
        peers
            .iter()
            .map(|p| {
                (
                    p.to_string(),
                    Heard {
                        ready,
                        boot: 1,
                        seq,
                    },
                )
            })
            .collect()
    }

    /// A three-node cluster seen from node1, every check 100 ms apart from `t0`.
    struct Cluster {
        gate: Gate,
        t0: Instant,
        known: BTreeSet<String>,
        /// The latest heartbeat of node1's the others acknowledge.
        acked_seq: u64,
        /// node1's latest heartbeat that said `ready: false` (0: none).
        unready: u64,
    }

    impl Cluster {
        fn new() -> Self {
            Cluster {
                gate: Gate::new(timing()),
                t0: Instant::now(),
                known: names(&["node1", "node2", "node3"]),
                acked_seq: 10,
                unready: 0,
            }
        }

        fn at(&self, millis: u64) -> Instant {
            self.t0 + ms(millis)
        }

        /// A check at `millis` where `heard` peers are heard and say they hear node1 (`ready`
        /// as `acked_ready`), with `tenure`.
        fn check(
            &mut self,
            millis: u64,
            heard: &[&str],
            acked_ready: bool,
            tenure: Tenure,
        ) -> Outcome {
            let now = self.at(millis);
            let reports = reports(&["node1", "node2", "node3"], heard, acked_ready);
            let acks = acks(heard, acked_ready, self.acked_seq);
            let usable = eth0();
            self.gate.check(
                Inputs {
                    me: ME,
                    known: &self.known,
                    reports: &reports,
                    acks: &acks,
                    tenure,
                    last_unready_seq: self.unready,
                    usable: &usable,
                },
                now,
            )
        }

        /// Checks every 100 ms from `from` to `to` (inclusive) with everyone heard and a tenure
        /// always a second ahead; returns the last outcome.
        fn steady(&mut self, from: u64, to: u64) -> Outcome {
            let mut last = None;
            for t in (from..=to).step_by(100) {
                let tenure = Tenure::Until(self.at(t + 1000));
                last = Some(self.check(t, &["node2", "node3"], true, tenure));
            }
            last.expect("at least one check")
        }
    }

    #[test]
    fn a_starting_node_settles_acts_then_claims_after_the_delay() {
        let mut c = Cluster::new();
        let tenure = Tenure::Until(c.at(5000));
        // Before the settle time (one failure timeout): nothing.
        let o = c.check(0, &["node2", "node3"], true, tenure);
        assert!(!o.acts && !o.claims);
        assert_eq!(
            readiness(true, true, o.state),
            Err("layer 2: settling (no usable interface yet, or listening after the start)")
        );
        assert_eq!(c.gate.wake_at(c.at(0)), Some(c.at(500)));
        // Settled: acts (says ready), but is not among its own members for the claim delay.
        let o = c.check(500, &["node2", "node3"], true, tenure);
        assert!(o.acts && !o.claims);
        assert!(!o.members.contains_key(ME));
        assert_eq!(
            readiness(true, true, o.state),
            Err("layer 2: waiting for the other speakers to hear this node ready")
        );
        // Three heartbeat intervals later: claims, plans with itself, ready.
        let o = c.check(800, &["node2", "node3"], true, tenure);
        assert!(o.acts && o.claims && o.members.contains_key(ME));
        assert_eq!(readiness(true, true, o.state), Ok(()));
        // It answers until the mandate, inside the tenure.
        assert_eq!(o.answer_until, Some(c.at(1100)));
    }

    #[test]
    fn claiming_waits_until_every_other_candidate_heard_it_ready() {
        let mut c = Cluster::new();
        let tenure = Tenure::Until(c.at(5000));
        c.check(0, &["node2", "node3"], false, tenure);
        c.check(500, &["node2", "node3"], false, tenure);
        // Past the claim delay, but the others' latest heartbeats do not list it ready yet.
        let o = c.check(900, &["node2", "node3"], false, tenure);
        assert!(o.acts && !o.claims && c.gate.waiting_to_claim());
        let o = c.check(1000, &["node2", "node3"], true, tenure);
        assert!(o.claims && !c.gate.waiting_to_claim());
    }

    #[test]
    fn a_claiming_node_that_said_not_ready_earns_its_claim_again() {
        // Issue #34 finding 1: frozen past its mandate, the node's timer heartbeat (seq 20) went
        // out saying `ready: false` before its work loop ran again; the others dropped it.
        for acked_at_once in [false, true] {
            let mut c = Cluster::new();
            assert!(c.steady(0, 1500).claims);
            c.unready = 20;
            let heard = ["node2", "node3"];
            // The others' heartbeats queued during the freeze still acknowledge seq 10, ready.
            let o = c.check(1900, &heard, true, Tenure::Until(c.at(2900)));
            assert!(
                o.acts && !o.claims && !o.members.contains_key(ME),
                "kept claiming"
            );
            assert!(o.state.claims == o.claims);
            if acked_at_once {
                // Acknowledgements newer than the resignation: still the claim delay first.
                c.acked_seq = 21;
            }
            for t in [2000, 2100] {
                let o = c.check(t, &heard, true, Tenure::Until(c.at(t + 1000)));
                assert!(o.acts && !o.claims, "claimed within the claim delay at {t}");
            }
            // The claim delay (three intervals from the check that saw the resignation) is over.
            let o = c.check(2200, &heard, true, Tenure::Until(c.at(3200)));
            if acked_at_once {
                assert!(o.claims && o.members.contains_key(ME));
                continue;
            }
            // Acknowledgements older than the resignation say ready, but do not count.
            assert!(!o.claims && c.gate.waiting_to_claim());
            c.acked_seq = 20;
            let o = c.check(2300, &heard, true, Tenure::Until(c.at(3300)));
            assert!(
                !o.claims,
                "claimed on the resignation's own acknowledgement"
            );
            c.acked_seq = 21;
            let o = c.check(2400, &heard, true, Tenure::Until(c.at(3400)));
            assert!(o.claims && o.members.contains_key(ME));
            // No new resignation: it goes on claiming.
            assert!(c.steady(2500, 3000).claims);
        }
    }

    #[test]
    fn claiming_waits_for_the_tenure_then_goes_on_while_it_lapses() {
        let mut c = Cluster::new();
        c.check(0, &["node2", "node3"], true, Tenure::Lapsed);
        c.check(500, &["node2", "node3"], true, Tenure::Lapsed);
        let o = c.check(900, &["node2", "node3"], true, Tenure::Lapsed);
        assert!(o.acts && !o.claims, "claimed with no tenure");
        let o = c.check(1000, &["node2", "node3"], true, Tenure::Until(c.at(2000)));
        assert!(o.claims);
        // A lapse while claiming: still claims (a takeover is the tenure's business) but may not
        // answer, which the metric counts.
        let o = c.check(1100, &["node2", "node3"], true, Tenure::Lapsed);
        assert!(o.claims && o.answer_until.is_none() && o.tenure_lapsed());
        // The mandate never reaches past the tenure less half an interval.
        let o = c.check(1200, &["node2", "node3"], true, Tenure::Until(c.at(1300)));
        assert_eq!(o.answer_until, Some(c.at(1250)));
    }

    #[test]
    fn a_node_that_loses_its_quorum_gives_up_and_is_held_back_on_return() {
        let mut c = Cluster::new();
        assert!(c.steady(0, 1500).claims);
        // Hears nobody: out of the quorum, owns nothing, not ready.
        let o = c.check(1600, &[], true, Tenure::Lapsed);
        assert!(!o.acts && !o.claims && !o.members.contains_key(ME));
        assert!(
            readiness(true, true, o.state)
                .unwrap_err()
                .contains("out of the quorum")
        );
        // Heard again: flap damping holds it back for its first hold-down (2 s).
        let o = c.check(1700, &["node2", "node3"], true, Tenure::Until(c.at(3000)));
        assert!(!o.acts && o.held_until == Some(c.at(1700) + Damping::FIRST_HOLD));
        assert_eq!(
            readiness(true, true, o.state),
            Err("layer 2: held back by flap damping after a loss of quorum")
        );
        // After the hold-down and the claim delay: owns IPs again.
        let o = c.steady(1800, 4100);
        assert!(o.claims);
        assert_eq!(readiness(true, true, o.state), Ok(()));
    }

    #[test]
    fn a_candidate_whose_tenure_stays_lapsed_hands_over() {
        let mut c = Cluster::new();
        assert!(c.steady(0, 1500).claims);
        // Heard by everyone (its heartbeats arrive late), but never able to prove it: 2.5
        // failure timeouts later it stops acting, and says why.
        let mut t = 1600;
        let starved_at = loop {
            let o = c.check(t, &["node2", "node3"], true, Tenure::Lapsed);
            if o.starved {
                assert!(!o.acts && !o.claims);
                assert!(
                    readiness(true, true, o.state)
                        .unwrap_err()
                        .contains("handing over")
                );
                break t;
            }
            assert!(t < 10_000, "never handed over");
            t += 100;
        };
        // The first check at least 2.5 failure timeouts (1,250 ms) into the lapse.
        assert_eq!(starved_at - 1600, 1300);
    }

    #[test]
    fn without_flap_damping_a_returning_node_acts_at_once() {
        let mut c = Cluster::new();
        c.gate = Gate::new(Timing {
            flap_damping: false,
            ..timing()
        });
        assert!(c.steady(0, 1500).claims);
        c.check(1600, &[], true, Tenure::Lapsed);
        let o = c.check(1700, &["node2", "node3"], true, Tenure::Until(c.at(3000)));
        assert!(o.acts && o.held_until.is_none());
    }

    #[test]
    fn a_node_alone_in_its_cluster_owns_everything_it_may() {
        let mut gate = Gate::new(timing());
        let t0 = Instant::now();
        let known = names(&[ME]);
        let usable = eth0();
        let empty = BTreeMap::new();
        let mut last = None;
        for t in (0..=900).step_by(100) {
            last = Some(gate.check(
                Inputs {
                    me: ME,
                    known: &known,
                    reports: &empty,
                    acks: &BTreeMap::new(),
                    tenure: Tenure::Unbounded,
                    last_unready_seq: 0,
                    usable: &usable,
                },
                t0 + ms(t),
            ));
        }
        let o = last.unwrap();
        assert!(o.claims && o.members.contains_key(ME));
        assert_eq!(o.answer_until, Some(t0 + ms(900) + timing().mandate));
    }

    #[test]
    fn no_usable_interface_means_no_settling() {
        let mut gate = Gate::new(timing());
        let t0 = Instant::now();
        let known = names(&[ME]);
        let none = BTreeSet::new();
        for t in (0..=2000).step_by(100) {
            let o = gate.check(
                Inputs {
                    me: ME,
                    known: &known,
                    reports: &BTreeMap::new(),
                    acks: &BTreeMap::new(),
                    tenure: Tenure::Unbounded,
                    last_unready_seq: 0,
                    usable: &none,
                },
                t0 + ms(t),
            );
            assert!(!o.acts && !o.state.settled);
        }
    }
}
