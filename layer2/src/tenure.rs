//! How long an owner may keep answering: until the earliest instant at which enough of the
//! others can have stopped hearing it to take its IPs over (decision record 0015, "Answering
//! only while heard").
//!
//! The quorum rule ([`crate::quorum`]) makes a takeover need a majority of the known speakers,
//! the owner not among them, whose latest reports all say they no longer hear the owner. Each
//! of them stops hearing the owner one failure timeout after the last heartbeat of the owner it
//! received, and it received that heartbeat no earlier than the owner sent it. Every heartbeat
//! names, for each peer its sender hears, the boot and sequence number of that peer's heartbeat
//! heard last: an acknowledgement. The owner keeps the instants it sent its recent heartbeats
//! ([`SentLog`]), so each acknowledgement from peer `p` gives a lower bound of the instant `p`
//! can stop hearing it: `sent + timeout`. The smallest majority that could take over needs `k`
//! peers; no takeover can happen before the `k`-th earliest of those instants, so the owner
//! answers only until then (less a margin the speaker chooses). A peer from which no
//! acknowledgement of the current boot has arrived may already have stopped hearing it.
//!
//! This closes the window that reports alone leave open: when the owner's heartbeats are lost
//! in bursts, the others can stop hearing it and take over before any report telling it so
//! reaches it. With acknowledgements it stops answering on its own, before the first instant a
//! takeover is possible, and without slowing the takeover.
//!
//! Two assumptions, both held by the speaker: every speaker uses the same failure timeout (one
//! Helm value), and a speaker that starts sends no heartbeat before it has listened for one
//! failure timeout, so a restarted peer, which hears no one yet, cannot report "not heard"
//! earlier than its previous boot's acknowledgement allows.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use crate::heartbeat::Heard;

/// Heartbeats remembered: ample for any timeout over interval ratio the speaker accepts (an
/// acknowledgement older than the failure timeout bounds nothing anyway).
const KEEP: usize = 256;

/// When this speaker sent its recent heartbeats.
#[derive(Clone, Debug)]
pub struct SentLog {
    boot: u64,
    beats: VecDeque<(u64, Instant)>,
}

impl SentLog {
    /// An empty log for the boot `boot`.
    pub fn new(boot: u64) -> Self {
        SentLog {
            boot,
            beats: VecDeque::new(),
        }
    }

    /// The boot whose heartbeats are logged.
    pub fn boot(&self) -> u64 {
        self.boot
    }

    /// Records that heartbeat `seq` is sent at `at` (call it before sending: a bound taken too
    /// early is safe, one too late is not).
    pub fn record(&mut self, seq: u64, at: Instant) {
        if self.beats.len() >= KEEP {
            self.beats.pop_front();
        }
        self.beats.push_back((seq, at));
    }

    /// When heartbeat `seq` was sent, if it is still remembered.
    pub fn sent_at(&self, seq: u64) -> Option<Instant> {
        self.beats
            .iter()
            .rev()
            .find(|(s, _)| *s == seq)
            .map(|(_, at)| *at)
    }
}

/// Until when the owner may answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tenure {
    /// No set of the others can take over at all (a cluster of one, or of two whose other node
    /// is not the lowest-named: it holds no majority alone).
    Unbounded,
    /// Until this instant: the earliest a takeover can happen.
    Until(Instant),
    /// A takeover may already be possible: too few acknowledgements of the current boot.
    Lapsed,
}

impl Tenure {
    /// The earlier of `until` and this tenure less `margin`; `None` when nothing may be
    /// answered.
    pub fn cap(self, until: Instant, margin: Duration) -> Option<Instant> {
        match self {
            Tenure::Unbounded => Some(until),
            Tenure::Until(end) => end.checked_sub(margin).map(|end| end.min(until)),
            Tenure::Lapsed => None,
        }
    }
}

/// The size of the smallest majority of `known` (this node `me` in it) that leaves `me` out:
/// more than half, or exactly half holding the lowest name ([`crate::quorum::majority`]).
fn smallest_takeover(me: &str, known: &BTreeSet<String>) -> usize {
    let n = known.len();
    let lowest_is_me = known.first().is_none_or(|lowest| lowest == me);
    if n.is_multiple_of(2) && !lowest_is_me {
        n / 2
    } else {
        n / 2 + 1
    }
}

/// The tenure of node `me` (its log `sent`): `known` are the speakers the API server says
/// exist, `acks` what each peer's latest heartbeat says of ours heard last
/// ([`crate::liveness::Membership::acks`] under `sent`'s boot), `timeout` the failure timeout.
pub fn tenure(
    me: &str,
    known: &BTreeSet<String>,
    acks: &BTreeMap<String, Heard>,
    sent: &SentLog,
    timeout: Duration,
) -> Tenure {
    let mut known = known.clone();
    known.insert(me.to_string());
    let needed = smallest_takeover(me, &known);
    let others = known.len() - 1;
    if needed > others {
        return Tenure::Unbounded;
    }
    // For each other known speaker, the earliest instant it can stop hearing us; a peer with no
    // usable acknowledgement may not hear us now.
    let mut bounds: Vec<Option<Instant>> = known
        .iter()
        .filter(|name| name.as_str() != me)
        .map(|name| {
            let seq = acks.get(name)?.seq;
            Some(sent.sent_at(seq)? + timeout)
        })
        .collect();
    // `None` sorts first: unknown bounds are the earliest.
    bounds.sort();
    match bounds.get(needed - 1).copied().flatten() {
        Some(at) => Tenure::Until(at),
        None => Tenure::Lapsed,
    }
}

/// An owner (or a node about to become one) that cannot answer because its tenure stays lapsed while the others still hear it:
/// its heartbeats reach them, but too late for their acknowledgements to prove it (a one-way
/// delay near the failure timeout on its outgoing path). Nobody takes its IPs over, since they
/// hear it, and it does not answer: new clients would wait for as long as the delay lasts. After
/// a failure timeout of that, the node stops acting, so the others take its IPs over (flap
/// damping then keeps it from taking them back at once).
#[derive(Clone, Copy, Debug, Default)]
pub struct Starvation {
    since: Option<Instant>,
}

impl Starvation {
    /// Takes in whether the others count this node as a candidate (it has acted for the claim
    /// delay) and whether its tenure lets it answer now, with the failure timeout; returns
    /// whether it has been a candidate unable to answer for [`Starvation::limit`] and should
    /// stop acting.
    pub fn observe(
        &mut self,
        candidate: bool,
        answering: bool,
        now: Instant,
        timeout: Duration,
    ) -> bool {
        if !candidate || answering {
            self.since = None;
            return false;
        }
        let limit = Self::limit(timeout);
        let since = *self.since.get_or_insert(now);
        now.saturating_duration_since(since) >= limit
    }
}

impl Starvation {
    /// How long a candidate may be unable to answer: a node just heard waits 1.5 failure
    /// timeouts for the others' acknowledgements to mature
    /// ([`crate::liveness::Membership::hears`]), then one more failure timeout.
    pub fn limit(timeout: Duration) -> Duration {
        timeout * 5 / 2
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn acked(list: &[(&str, u64)]) -> BTreeMap<String, Heard> {
        list.iter()
            .map(|(n, seq)| {
                (
                    n.to_string(),
                    Heard {
                        ready: true,
                        boot: 9,
                        seq: *seq,
                    },
                )
            })
            .collect()
    }

    fn known(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A log of heartbeats 1..=n, one every 100 ms from `t0`.
    fn log(t0: Instant, n: u64) -> SentLog {
        let mut log = SentLog::new(9);
        for seq in 1..=n {
            log.record(seq, t0 + ms(100 * (seq - 1)));
        }
        log
    }

    #[test]
    fn the_majority_th_earliest_acknowledgement_bounds_the_tenure() {
        let t0 = Instant::now();
        let sent = log(t0, 10);
        let k = known(&["a", "b", "c", "d", "e"]);
        // Five speakers: a takeover needs three of the four others. They last heard 10, 8, 5, 9.
        let acks = acked(&[("b", 10), ("c", 8), ("d", 5), ("e", 9)]);
        // Sorted bounds: 5, 8, 9, 10 (sent at 400, 700, 800, 900 ms); the third is 9's.
        assert_eq!(
            tenure("a", &k, &acks, &sent, ms(500)),
            Tenure::Until(t0 + ms(800 + 500))
        );
        // Without d's and e's acknowledgements, two may have stopped hearing us already and
        // the third earliest is c's.
        let acks = acked(&[("b", 10), ("c", 8)]);
        assert_eq!(
            tenure("a", &k, &acks, &sent, ms(500)),
            Tenure::Until(t0 + ms(700 + 500))
        );
        let acks = acked(&[("b", 10)]);
        assert_eq!(tenure("a", &k, &acks, &sent, ms(500)), Tenure::Lapsed);
    }

    #[test]
    fn acknowledgements_of_forgotten_or_other_heartbeats_bound_nothing() {
        let t0 = Instant::now();
        let mut sent = log(t0, 3);
        let k = known(&["a", "b", "c"]);
        let acks = acked(&[("b", 7777), ("c", 3)]);
        // b's acknowledgement names no heartbeat we remember: b may not hear us; c's bounds it.
        assert_eq!(
            tenure("a", &k, &acks, &sent, ms(500)),
            Tenure::Until(t0 + ms(200 + 500))
        );
        for seq in 4..=(KEEP as u64 + 3) {
            sent.record(seq, t0 + ms(100 * seq));
        }
        assert_eq!(sent.sent_at(3), None);
        assert_eq!(tenure("a", &k, &acks, &sent, ms(500)), Tenure::Lapsed);
    }

    #[test]
    fn small_clusters_follow_the_tie_break() {
        let t0 = Instant::now();
        let sent = log(t0, 1);
        let none = BTreeMap::new();
        // Alone, or two nodes of which we are the lowest-named: the other cannot take over.
        assert_eq!(
            tenure("a", &known(&[]), &none, &sent, ms(500)),
            Tenure::Unbounded
        );
        assert_eq!(
            tenure("a", &known(&["a", "b"]), &none, &sent, ms(500)),
            Tenure::Unbounded
        );
        // The higher-named of two: the lowest alone is a majority.
        assert_eq!(
            tenure("b", &known(&["a", "b"]), &none, &sent, ms(500)),
            Tenure::Lapsed
        );
        let acks = acked(&[("a", 1)]);
        assert_eq!(
            tenure("b", &known(&["a", "b"]), &acks, &sent, ms(500)),
            Tenure::Until(t0 + ms(500))
        );
        // Four nodes: when we are the lowest-named, all three others must stop hearing us (d
        // may have already; b and c not before t0 + 500 ms).
        let acks = acked(&[("b", 1), ("c", 1)]);
        assert_eq!(
            tenure("a", &known(&["a", "b", "c", "d"]), &acks, &sent, ms(500)),
            Tenure::Until(t0 + ms(500))
        );
        // When we are not, two of them suffice: with one acknowledgement, c and d may be those.
        let acks = acked(&[("a", 1)]);
        assert_eq!(
            tenure("b", &known(&["a", "b", "c", "d"]), &acks, &sent, ms(500)),
            Tenure::Lapsed
        );
        let acks = acked(&[("a", 1), ("c", 1)]);
        assert_eq!(
            tenure("b", &known(&["a", "b", "c", "d"]), &acks, &sent, ms(500)),
            Tenure::Until(t0 + ms(500))
        );
    }

    #[test]
    fn starvation_counts_only_an_unbroken_lapse_while_a_candidate() {
        let t0 = Instant::now();
        let timeout = ms(200);
        assert_eq!(Starvation::limit(timeout), ms(500));
        let mut s = Starvation::default();
        assert!(!s.observe(true, false, t0, timeout));
        assert!(!s.observe(true, false, t0 + ms(499), timeout));
        assert!(s.observe(true, false, t0 + ms(500), timeout));
        // One answer in between starts it over; so does not being a candidate.
        assert!(!s.observe(true, true, t0 + ms(600), timeout));
        assert!(!s.observe(true, false, t0 + ms(700), timeout));
        assert!(!s.observe(true, false, t0 + ms(1_100), timeout));
        assert!(!s.observe(false, false, t0 + ms(1_300), timeout));
        assert!(!s.observe(true, false, t0 + ms(1_400), timeout));
    }

    #[test]
    fn the_cap_takes_the_earlier_and_the_margin() {
        let t0 = Instant::now();
        let until = t0 + ms(300);
        assert_eq!(Tenure::Unbounded.cap(until, ms(50)), Some(until));
        assert_eq!(Tenure::Lapsed.cap(until, ms(50)), None);
        assert_eq!(
            Tenure::Until(t0 + ms(200)).cap(until, ms(50)),
            Some(t0 + ms(150))
        );
        assert_eq!(Tenure::Until(t0 + ms(900)).cap(until, ms(50)), Some(until));
    }
}
