//! The gate: whether a node may own layer 2 IPs now, and until when it may answer, from one
//! membership check. One copy of the rules for both memberships (today's heartbeats, decision
//! 0015, and the voters, decision 0023), the speaker and the simulator: what differs between the
//! memberships is only where the quorum, the tenure and the claim condition come from.
//!
//! The rules, in the order they apply (decision record 0015 says why each exists):
//! 1. **Settling**: a node may own IPs only a failure timeout after it became able to (a usable
//!    interface), so it has heard the others first ([`Gate::settle`], called first: the quorum
//!    rule reads whether the node has settled).
//! 2. **Quorum**: the membership's verdict, passed in.
//! 3. **Tenure**: it answers only until the others can first have stopped hearing it, half a
//!    heartbeat interval to spare, and never beyond the mandate.
//! 4. **Starvation**: a candidate unable to answer for 2.5 failure timeouts stops acting, so the
//!    others take its IPs over rather than nobody answering them.
//! 5. **Flap damping** ([`crate::damping`]): after a loss of quorum it acts again only once held
//!    down for a while. A process that has not had a quorum since it settled has lost nothing.
//! 6. **Claim delay**: it acts a few heartbeats before it counts itself among the members, so
//!    nodes that became ready together hear each other first.
//! 7. **Claiming** starts once the membership's claim condition holds (every other candidate
//!    heard it ready; or a majority of the voters told it) and its tenure lets it answer; it
//!    goes on while the node acts.
//! 8. **Resignation**: a heartbeat that said `ready: false` made the others drop this node. At
//!    the next check it stops claiming and earns the claim again as at a rejoin: the claim delay
//!    from that check, then the claim condition counting only acknowledgements of heartbeats
//!    sent after the resignation.

use std::time::{Duration, Instant};

use crate::damping::Damping;
use crate::settling::Settling;
use crate::tenure::{Starvation, Tenure};

/// Heartbeat intervals between acting (saying `ready`) and claiming IPs (rule 6).
pub const CLAIM_AFTER_BEATS: u32 = 3;

/// The timings, as the speaker's flags set them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// Between two heartbeats.
    pub heartbeat_interval: Duration,
    /// Silence after which a peer counts as gone.
    pub failure_timeout: Duration,
    /// How long answering stays allowed after a check ([`mandate_for`]).
    pub mandate: Duration,
    /// Whether flap damping applies (rule 5).
    pub flap_damping: bool,
}

impl Timing {
    /// The timings for `heartbeat_interval` and `failure_timeout`, the mandate from them.
    pub fn new(
        heartbeat_interval: Duration,
        failure_timeout: Duration,
        flap_damping: bool,
    ) -> Self {
        Timing {
            heartbeat_interval,
            failure_timeout,
            mandate: mandate_for(failure_timeout, heartbeat_interval),
            flap_damping,
        }
    }
}

/// How long answering stays allowed after a check: the failure timeout minus two heartbeat
/// intervals, at least one interval (the others take over a failure timeout after the last
/// heartbeat they heard, which is at most one interval older than the last check).
pub fn mandate_for(failure_timeout: Duration, heartbeat_interval: Duration) -> Duration {
    failure_timeout
        .saturating_sub(heartbeat_interval * 2)
        .max(heartbeat_interval)
}

/// What one check decided ([`Default`]: nothing allowed, as before any check).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    /// A failure timeout has passed since the node became able to announce (rule 1).
    pub settled: bool,
    /// The membership's quorum verdict, as passed in.
    pub quorum: bool,
    /// The node acts: it says `ready` (rules 1, 2, 4 and 5 allow it).
    pub acts: bool,
    /// It claims IPs: it counts itself among the members it plans with.
    pub claims: bool,
    /// Until when it may answer for what it owns; `None`: not at all now.
    pub answer_until: Option<Instant>,
    /// Until when flap damping holds it back, if it does.
    pub held_until: Option<Instant>,
    /// It stopped acting because its tenure stayed lapsed (rule 4).
    pub starved: bool,
}

/// The gate's state between checks.
#[derive(Clone, Debug)]
pub struct Gate {
    timing: Timing,
    settling: Settling,
    settled: bool,
    damping: Damping,
    had_quorum: bool,
    claim: Settling,
    claiming: bool,
    /// The others count this node as a candidate (it has acted for the claim delay).
    candidate: bool,
    starvation: Starvation,
    /// The latest `ready: false` heartbeat's sequence number the last check read (rule 8).
    unready_seq: u64,
}

impl Gate {
    /// A gate for a process that has just started.
    pub fn new(timing: Timing) -> Self {
        Gate {
            timing,
            settling: Settling::default(),
            settled: false,
            damping: Damping::new(),
            had_quorum: false,
            claim: Settling::default(),
            claiming: false,
            candidate: false,
            starvation: Starvation::default(),
            unready_seq: 0,
        }
    }

    /// The timings.
    pub fn timing(&self) -> Timing {
        self.timing
    }

    /// Rule 1, the first step of a check at `now`: whether the node has settled, `able` whether
    /// it has an interface that can announce.
    pub fn settle(&mut self, able: bool, now: Instant) -> bool {
        self.settled = self
            .settling
            .observe(able, now, self.timing.failure_timeout);
        self.settled
    }

    /// The rest of the check at `now`, after [`Gate::settle`]: `quorum` the membership's
    /// verdict, `tenure` from its acknowledgements, `last_unready_seq` the node's latest
    /// heartbeat that said `ready: false` (0: none), and `may_claim` the claim condition,
    /// given the resignation to count from (acknowledgements of later heartbeats only).
    pub fn decide(
        &mut self,
        quorum: bool,
        tenure: Tenure,
        last_unready_seq: u64,
        may_claim: impl FnOnce(u64) -> bool,
        now: Instant,
    ) -> Decision {
        let t = self.timing;
        let settled = self.settled;
        let answer_until = tenure
            .cap(now + t.mandate, t.heartbeat_interval / 2)
            .filter(|until| *until > now);
        let starved = self.starvation.observe(
            self.candidate,
            answer_until.is_some(),
            now,
            t.failure_timeout,
        );
        self.had_quorum |= settled && quorum;
        if settled && t.flap_damping && self.had_quorum {
            self.damping.observe(quorum && !starved, now);
        }
        let held_until = self.damping.held_until(now);
        let acts = settled && quorum && held_until.is_none() && !starved;
        let claim_wait = t.heartbeat_interval * CLAIM_AFTER_BEATS;
        if last_unready_seq > self.unready_seq {
            // Rule 8: a `ready: false` heartbeat went out since the last check, a resignation
            // the others acted on. Start over as a node that did not act until now.
            self.unready_seq = last_unready_seq;
            self.claiming = false;
            self.claim.observe(false, now, claim_wait);
        }
        let delay_over = self.claim.observe(acts, now, claim_wait);
        self.candidate = delay_over;
        let claims = delay_over
            && (self.claiming || (answer_until.is_some() && may_claim(self.unready_seq)));
        self.claiming = claims;
        Decision {
            settled,
            quorum,
            acts,
            claims,
            answer_until,
            held_until,
            starved,
        }
    }

    /// When the loop must wake for the gate to move on (the settle time, the claim delay), if
    /// that is still ahead of `now`.
    pub fn wake_at(&self, now: Instant) -> Option<Instant> {
        [self.settling.wake_at(now), self.claim.wake_at(now)]
            .into_iter()
            .flatten()
            .min()
    }

    /// Whether the node has acted for the claim delay but waits for the claim condition.
    pub fn waiting_to_claim(&self) -> bool {
        self.candidate && !self.claiming
    }

    /// Whether it claims (as of the last check).
    pub fn claiming(&self) -> bool {
        self.claiming
    }

    /// The process stops: it claims nothing from now on.
    pub fn stop(&mut self) {
        self.claiming = false;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_mandate_lapses_before_the_others_take_over() {
        assert_eq!(mandate_for(ms(500), ms(100)), ms(300));
        assert_eq!(mandate_for(ms(300), ms(100)), ms(100));
    }

    /// Checks every 100 ms with a quorum from `quorum_from` on: returns when it first claims.
    fn first_claim(quorum_from: u64) -> Option<u64> {
        let t0 = Instant::now();
        let mut gate = Gate::new(Timing::new(ms(100), ms(500), true));
        for k in 0..40 {
            let now = t0 + ms(100 * k);
            gate.settle(true, now);
            let d = gate.decide(k >= quorum_from, Tenure::Unbounded, 0, |_| true, now);
            if d.claims {
                return Some(k);
            }
        }
        None
    }

    #[test]
    fn a_process_without_a_quorum_yet_is_not_held_down_when_it_gets_one() {
        // Settled at 5 (500 ms); a quorum from 5: acts at once, claims after 3 intervals.
        assert_eq!(first_claim(5), Some(8));
        // A quorum only from 9 (the voters were listening): no hold-down, claims at 12.
        assert_eq!(first_claim(9), Some(12));
    }

    #[test]
    fn losing_the_quorum_after_having_it_is_held_down() {
        let t0 = Instant::now();
        let mut gate = Gate::new(Timing::new(ms(100), ms(500), true));
        let mut claimed_again = None;
        for k in 0..60 {
            let now = t0 + ms(100 * k);
            gate.settle(true, now);
            let quorum = !(10..12).contains(&k);
            let d = gate.decide(quorum, Tenure::Unbounded, 0, |_| true, now);
            if k == 11 {
                assert!(!d.acts && !d.claims);
            }
            if k > 12 && d.claims && claimed_again.is_none() {
                claimed_again = Some(k);
            }
        }
        // Back at 12, held 2 s (to 32), then the claim delay.
        assert_eq!(claimed_again, Some(35));
    }

    #[test]
    fn a_resignation_restarts_the_claim() {
        let t0 = Instant::now();
        let mut gate = Gate::new(Timing::new(ms(100), ms(500), true));
        let mut seen = Vec::new();
        for k in 0..20u64 {
            let now = t0 + ms(100 * k);
            gate.settle(true, now);
            let unready = if k >= 10 { 42 } else { 0 };
            let d = gate.decide(
                true,
                Tenure::Unbounded,
                unready,
                |after| {
                    seen.push(after);
                    true
                },
                now,
            );
            if k == 10 {
                assert!(!d.claims, "resigned");
            }
            if k == 13 {
                assert!(d.claims, "earned again after the claim delay");
            }
        }
        assert_eq!(seen.last(), Some(&42), "counts from the resignation");
    }
}
