//! BGP unnumbered (a BGPPeer with `interface`): finding the peer on a link, as FRR does it
//! (docs/decisions/0020-bgp-unnumbered.md). The decisions here are pure (the clock is passed
//! in); [`discovery`] is the ICMPv6 socket that sends and reads Router Advertisements, and
//! [`links`] runs discovery in the work loop on every interface a BGPPeer names.
//!
//! - [`Schedule`]: when to send our Router Advertisements (lifetime 0, so we are nobody's
//!   default router): four 1 s apart when the link comes up, then every 10 s, FRR's interval;
//!   a Router Solicitation is answered at once but at most once per 3 s (RFC 4861 §6.2.6).
//! - [`Follow`]: which advertiser the link takes as its peer. The first one heard; then, since
//!   any host on the link can advertise, another only after the session has failed, and peer
//!   changes damped (issue #33 item 3).

pub mod discovery;
pub(crate) mod links;

use std::net::Ipv6Addr;
use std::time::{Duration, Instant};

/// Advertisements sent fast when the link comes up (FRR's `UseFastRexmit`).
pub const FAST_ADVERTISEMENTS: u8 = 4;
/// Interval of the fast advertisements.
pub const FAST_INTERVAL: Duration = Duration::from_secs(1);
/// Interval of the periodic advertisements (FRR's for interface peers).
pub const INTERVAL: Duration = Duration::from_secs(10);
/// Least time between two answers to solicitations (RFC 4861 §6.2.6 MIN_DELAY_BETWEEN_RAS).
pub const MIN_DELAY_BETWEEN_ANSWERS: Duration = Duration::from_secs(3);

/// When our Router Advertisements go out on one link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    next: Instant,
    fast_left: u8,
    last_sent: Option<Instant>,
}

impl Schedule {
    /// A link that just came up (or a peer just configured): the first advertisement is due now.
    pub fn new(now: Instant) -> Self {
        Schedule {
            next: now,
            fast_left: FAST_ADVERTISEMENTS,
            last_sent: None,
        }
    }

    /// When the next periodic advertisement is due.
    pub fn next(&self) -> Instant {
        self.next
    }

    /// Whether a periodic advertisement is due at `now`.
    pub fn due(&self, now: Instant) -> bool {
        now >= self.next
    }

    /// An advertisement went out at `now` (periodic or an answer): schedules the next one.
    pub fn sent(&mut self, now: Instant) {
        self.last_sent = Some(now);
        let interval = if self.fast_left > 1 {
            self.fast_left -= 1;
            FAST_INTERVAL
        } else {
            self.fast_left = 0;
            INTERVAL
        };
        self.next = now + interval;
    }

    /// A Router Solicitation arrived at `now`: whether to answer it now. An answer within
    /// [`MIN_DELAY_BETWEEN_ANSWERS`] of the last advertisement is dropped; the periodic ones
    /// cover the peer soon enough.
    pub fn answer_solicitation(&self, now: Instant) -> bool {
        self.last_sent
            .is_none_or(|last| now.saturating_duration_since(last) >= MIN_DELAY_BETWEEN_ANSWERS)
    }
}

/// How long a session must have been out of Established before its link may follow another
/// advertiser. A restart, a hold timer expiry or a router reboot is not yet a failure: without
/// this wait, whoever advertises while the real router reboots would take the link.
pub const FAILED_AFTER: Duration = Duration::from_secs(30);
/// How recently another advertiser must have been heard to be followed: three of FRR's 10 s
/// intervals (and FRR's Router Lifetime). One advertisement long ago is nobody to move to.
pub const FRESH: Duration = Duration::from_secs(30);
/// Damping: the least time between two peer changes on a link (and between finding the first
/// peer and the first change); each change doubles it up to [`HOLD_MAX`].
pub const HOLD_MIN: Duration = Duration::from_secs(30);
/// The longest damping wait; a link that has not changed its peer for this long after its
/// last wait ended starts again at [`HOLD_MIN`].
pub const HOLD_MAX: Duration = Duration::from_secs(600);

/// The times [`Follow`] decides with (the constants above unless a test shortens them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timers {
    /// See [`FAILED_AFTER`].
    pub failed_after: Duration,
    /// See [`FRESH`].
    pub fresh: Duration,
    /// See [`HOLD_MIN`].
    pub hold_min: Duration,
    /// See [`HOLD_MAX`].
    pub hold_max: Duration,
}

impl Default for Timers {
    fn default() -> Self {
        Timers {
            failed_after: FAILED_AFTER,
            fresh: FRESH,
            hold_min: HOLD_MIN,
            hold_max: HOLD_MAX,
        }
    }
}

/// What a heard advertisement was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heard {
    /// The first peer on this link: followed at once.
    New,
    /// The peer again.
    Same,
    /// Another source: remembered as the advertiser to move to should the session fail
    /// ([`Follow::tick`] decides).
    Other,
}

/// Which advertiser a link follows as its BGP peer (docs/decisions/0020-bgp-unnumbered.md,
/// issue #33 item 3). Any host on the link can send a valid Router Advertisement, so the
/// newest source must not simply win:
///
/// - the first advertiser heard is the peer at once;
/// - while the link's session is Established nothing else changes the peer;
/// - once it has not been Established for [`Timers::failed_after`] (never came up, or closed
///   and not back), the link moves to the most recent other advertiser heard within
///   [`Timers::fresh`];
/// - peer changes are damped: none within a hold time of the previous one (or of the first
///   find); the hold starts at [`Timers::hold_min`] and doubles with each change up to
///   [`Timers::hold_max`], back to the minimum after a quiet [`Timers::hold_max`].
///
/// Pure: the caller passes the time and the session state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Follow {
    timers: Timers,
    /// The peer and when it was last heard.
    peer: Option<(Ipv6Addr, Instant)>,
    /// The most recent other advertiser and when it was heard.
    other: Option<(Ipv6Addr, Instant)>,
    /// Since when the session has not been Established (`None`: it is).
    down_since: Option<Instant>,
    /// No peer change before this.
    hold_until: Option<Instant>,
    /// The hold the next change sets.
    next_hold: Duration,
    /// Peer changes since the link came up.
    changes: u32,
    /// Advertisements from other sources than the peer.
    others_heard: u64,
}

impl Follow {
    /// A link that just came up: no peer yet.
    pub fn new(timers: Timers) -> Self {
        Follow {
            timers,
            peer: None,
            other: None,
            down_since: None,
            hold_until: None,
            next_hold: timers.hold_min,
            changes: 0,
            others_heard: 0,
        }
    }

    /// The peer, once one was heard.
    pub fn peer(&self) -> Option<Ipv6Addr> {
        self.peer.map(|(p, _)| p)
    }

    /// The advertiser the link would move to should its session fail.
    pub fn other(&self) -> Option<Ipv6Addr> {
        self.other.map(|(o, _)| o)
    }

    /// How often the peer changed (finding the first one is no change).
    pub fn changes(&self) -> u32 {
        self.changes
    }

    /// How many advertisements came from other sources than the peer.
    pub fn others_heard(&self) -> u64 {
        self.others_heard
    }

    /// A valid Router Advertisement from `source` at `now` (the caller checked it: link-local,
    /// hop limit 255, RFC 4861 §6.1.2).
    pub fn heard(&mut self, source: Ipv6Addr, now: Instant) -> Heard {
        match self.peer {
            None => {
                self.peer = Some((source, now));
                // The session to it starts now, and the damping runs from here.
                self.down_since = Some(now);
                self.hold_until = Some(now + self.timers.hold_min);
                Heard::New
            }
            Some((p, _)) if p == source => {
                self.peer = Some((p, now));
                Heard::Same
            }
            Some(_) => {
                self.other = Some((source, now));
                self.others_heard += 1;
                Heard::Other
            }
        }
    }

    /// The session state at `now`; moves the link to the other advertiser when the rule
    /// allows, returning the peer it leaves.
    pub fn tick(&mut self, now: Instant, established: bool) -> Option<Ipv6Addr> {
        if established {
            self.down_since = None;
            return None;
        }
        let down_since = *self.down_since.get_or_insert(now);
        let (peer, peer_heard) = self.peer?;
        let (other, other_heard) = self.other?;
        let fresh = now.saturating_duration_since(other_heard) <= self.timers.fresh;
        let failed = now.saturating_duration_since(down_since) >= self.timers.failed_after;
        let hold_until = self.hold_until.unwrap_or(now);
        if !fresh || !failed || now < hold_until {
            return None;
        }
        if now >= hold_until + self.timers.hold_max {
            self.next_hold = self.timers.hold_min;
        }
        self.hold_until = Some(now + self.next_hold);
        self.next_hold = (self.next_hold * 2).min(self.timers.hold_max);
        self.peer = Some((other, other_heard));
        // The peer left behind is the one to go back to, should the new one fail too.
        self.other = Some((peer, peer_heard));
        self.down_since = Some(now);
        self.changes += 1;
        Some(peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn four_fast_advertisements_then_every_ten_seconds() {
        let t0 = Instant::now();
        let mut s = Schedule::new(t0);
        assert!(s.due(t0));
        let mut now = t0;
        let mut gaps = Vec::new();
        for _ in 0..7 {
            s.sent(now);
            gaps.push(s.next() - now);
            assert!(!s.due(now));
            now = s.next();
            assert!(s.due(now));
        }
        let secs: Vec<u64> = gaps.iter().map(Duration::as_secs).collect();
        assert_eq!(secs, [1, 1, 1, 10, 10, 10, 10]);
    }

    #[test]
    fn solicitations_are_answered_at_most_every_three_seconds() {
        let t0 = Instant::now();
        let mut s = Schedule::new(t0);
        assert!(s.answer_solicitation(t0), "nothing sent yet");
        s.sent(t0);
        assert!(!s.answer_solicitation(t0 + Duration::from_secs(2)));
        assert!(s.answer_solicitation(t0 + Duration::from_secs(3)));
    }

    fn ll(n: u16) -> Ipv6Addr {
        Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, n)
    }

    const S: fn(u64) -> Duration = Duration::from_secs;

    /// The first advertiser is the peer at once; the same one again changes nothing.
    #[test]
    fn the_first_advertiser_is_the_peer() {
        let t0 = Instant::now();
        let mut f = Follow::new(Timers::default());
        assert_eq!(f.peer(), None);
        assert_eq!(f.tick(t0, false), None);
        assert_eq!(f.heard(ll(1), t0), Heard::New);
        assert_eq!(f.heard(ll(1), t0 + S(10)), Heard::Same);
        assert_eq!((f.peer(), f.changes()), (Some(ll(1)), 0));
    }

    /// Issue #33 item 3: a forged advertisement from another host on the link, while the
    /// session runs, changes nothing, however long it goes on; the link only remembers it.
    #[test]
    fn an_established_session_keeps_its_peer() {
        let t0 = Instant::now();
        let mut f = Follow::new(Timers::default());
        f.heard(ll(1), t0);
        assert_eq!(f.tick(t0 + S(2), true), None);
        for s in 3..3600 {
            assert_eq!(f.heard(ll(66), t0 + S(s)), Heard::Other);
            assert_eq!(f.tick(t0 + S(s), true), None);
        }
        assert_eq!(
            (f.peer(), f.other(), f.changes()),
            (Some(ll(1)), Some(ll(66)), 0)
        );
        assert_eq!(f.others_heard(), 3597);
    }

    /// A session that fails (closed, not back for FAILED_AFTER) moves the link to the other
    /// advertiser, which is what a replaced router needs; not a moment earlier.
    #[test]
    fn a_failed_session_moves_to_the_other_advertiser() {
        let t0 = Instant::now();
        let mut f = Follow::new(Timers::default());
        f.heard(ll(1), t0);
        f.tick(t0 + S(1), true);
        // The session closes at 100 s; the new router advertises from then on.
        assert_eq!(f.tick(t0 + S(100), false), None);
        for s in 100..130 {
            f.heard(ll(2), t0 + S(s));
            assert_eq!(f.tick(t0 + S(s), false), None, "moved after {} s", s - 100);
        }
        assert_eq!(f.tick(t0 + S(130), false), Some(ll(1)));
        assert_eq!(
            (f.peer(), f.other(), f.changes()),
            (Some(ll(2)), Some(ll(1)), 1)
        );
    }

    /// A session that never came up counts as failed from when its peer was found.
    #[test]
    fn a_session_that_never_comes_up_fails_too() {
        let t0 = Instant::now();
        let mut f = Follow::new(Timers::default());
        f.heard(ll(66), t0);
        f.heard(ll(1), t0 + S(5));
        assert_eq!(f.tick(t0 + S(29), false), None);
        assert_eq!(f.tick(t0 + S(30), false), Some(ll(66)));
        assert_eq!(f.peer(), Some(ll(1)));
    }

    /// A router reboot (the session down for minutes) does not hand the link to an advertiser
    /// heard once long ago.
    #[test]
    fn an_advertiser_not_heard_lately_is_not_followed() {
        let t0 = Instant::now();
        let mut f = Follow::new(Timers::default());
        f.heard(ll(1), t0);
        f.tick(t0, true);
        f.heard(ll(66), t0 + S(60));
        f.tick(t0 + S(100), false);
        assert_eq!(f.tick(t0 + S(300), false), None);
        assert_eq!(f.peer(), Some(ll(1)));
    }

    /// Two advertisers and a session that never comes up: the link alternates, ever more
    /// slowly (30, 30, 60, 120, ... 600 s), and after a quiet spell starts again at 30 s.
    #[test]
    fn peer_changes_are_damped_more_with_each() {
        let t0 = Instant::now();
        let mut f = Follow::new(Timers::default());
        f.heard(ll(1), t0);
        let mut changes = vec![];
        let mut s = 0;
        while s < 4000 {
            s += 1;
            let now = t0 + S(s);
            f.heard(ll(1), now);
            f.heard(ll(2), now);
            if f.tick(now, false).is_some() {
                changes.push(s);
            }
        }
        let gaps: Vec<u64> = changes.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(changes[0], 30);
        assert_eq!(gaps[..6], [30, 60, 120, 240, 480, 600]);
        assert!(gaps[5..].iter().all(|g| *g == 600), "{gaps:?}");
        // Established for long: the next change waits only HOLD_MIN after FAILED_AFTER.
        let last = *changes.last().unwrap_or(&0);
        let up = t0 + S(last + 10);
        f.tick(up, true);
        let down = up + S(2000);
        f.tick(down, false);
        f.heard(ll(2), down + S(30));
        f.heard(ll(1), down + S(30));
        assert!(f.tick(down + S(30), false).is_some());
        f.heard(ll(2), down + S(59));
        f.heard(ll(1), down + S(59));
        assert_eq!(
            f.tick(down + S(59), false),
            None,
            "the hold restarts at 30 s"
        );
        assert!(f.tick(down + S(60), false).is_some());
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        /// One step of a link's life: some seconds pass, then an advertisement from one of
        /// four sources (or none), then the session is reported.
        #[derive(Clone, Debug)]
        struct Step {
            wait: u64,
            source: Option<u16>,
            established: bool,
        }

        fn steps() -> impl Strategy<Value = Vec<Step>> {
            prop::collection::vec(
                (0u64..90, prop::option::of(1u16..5), any::<bool>()).prop_map(
                    |(wait, source, established)| Step {
                        wait,
                        source,
                        established,
                    },
                ),
                1..200,
            )
        }

        proptest! {
            /// While the session is Established, no sequence of advertisements from other
            /// sources changes the peer.
            #[test]
            fn established_never_changes_the_peer(steps in steps()) {
                let t0 = Instant::now();
                let mut f = Follow::new(Timers::default());
                f.heard(ll(1), t0);
                let mut now = t0;
                for s in steps {
                    now += S(s.wait);
                    if let Some(n) = s.source {
                        f.heard(ll(n), now);
                    }
                    prop_assert_eq!(f.tick(now, true), None);
                    prop_assert_eq!(f.peer(), Some(ll(1)));
                }
            }

            /// Whatever advertises and however the session goes: a change happens only with
            /// the session not Established for FAILED_AFTER, to a source heard within FRESH,
            /// at most one per damping window (HOLD_MIN at least, and each window is at least
            /// as long as the one before unless HOLD_MAX passed quietly in between).
            #[test]
            fn changes_follow_the_rule(steps in steps()) {
                let timers = Timers::default();
                let t0 = Instant::now();
                let mut f = Follow::new(timers);
                let mut now = t0;
                let mut found: Option<Instant> = None;
                let mut heard: std::collections::BTreeMap<Ipv6Addr, Instant> = Default::default();
                let mut up_at: Option<Instant> = None;
                let mut down_since: Option<Instant> = None;
                let mut changes: Vec<Instant> = vec![];
                for s in steps {
                    now += S(s.wait);
                    if let Some(n) = s.source {
                        heard.insert(ll(n), now);
                        if f.heard(ll(n), now) == Heard::New {
                            found = Some(now);
                            down_since = Some(now);
                        }
                    }
                    if s.established {
                        up_at = Some(now);
                        down_since = None;
                    } else if down_since.is_none() {
                        down_since = Some(now);
                    }
                    let before = f.peer();
                    let left = f.tick(now, s.established);
                    prop_assert_eq!(left, before.filter(|_| f.peer() != before));
                    let Some(left) = left else { continue };
                    let to = f.peer().unwrap_or(left);
                    prop_assert!(left != to);
                    prop_assert!(!s.established);
                    prop_assert!(up_at.is_none_or(|u| now.duration_since(u) >= timers.failed_after));
                    prop_assert!(down_since.is_some_and(|d| now.duration_since(d) >= timers.failed_after));
                    prop_assert!(heard.get(&to).is_some_and(|h| now.duration_since(*h) <= timers.fresh));
                    let previous = changes.last().copied().or(found);
                    prop_assert!(previous.is_some_and(|p| now.duration_since(p) >= timers.hold_min));
                    changes.push(now);
                    down_since = Some(now);
                }
                // The windows grow: with the gaps at least 30, 60, 120, 240, 480 s, no six
                // changes fit in one HOLD_MAX (a quiet spell that resets them is longer).
                for w in changes.windows(6) {
                    prop_assert!(w[5] - w[0] > timers.hold_max, "changes at {:?}", changes);
                }
            }
        }
    }
}
