//! BGP unnumbered (a BGPPeer with `interface`): finding the peer on a link, as FRR does it
//! (docs/decisions/0020-bgp-unnumbered.md). The decisions here are pure (the clock is passed
//! in); [`discovery`] is the ICMPv6 socket that sends and reads Router Advertisements, and
//! [`links`] runs discovery in the work loop on every interface a BGPPeer names.
//!
//! - [`Schedule`]: when to send our Router Advertisements (lifetime 0, so we are nobody's
//!   default router): four 1 s apart when the link comes up, then every 10 s, FRR's interval;
//!   a Router Solicitation is answered at once but at most once per 3 s (RFC 4861 §6.2.6).
//! - [`LinkPeer`]: the peer is the link-local source of the newest valid Router Advertisement,
//!   as in FRR (one neighbour per interface); sources that keep alternating are counted, since
//!   unnumbered is for point-to-point links and two routers on one is a wiring mistake.

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

/// What a heard advertisement changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heard {
    /// The first peer on this link.
    New,
    /// The same peer again.
    Same,
    /// Another source replaced the peer (FRR does the same): a session not yet Established
    /// should re-target; an Established one keeps running until it fails.
    Replaced {
        /// The peer before.
        previous: Ipv6Addr,
    },
}

/// The peer on one link.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkPeer {
    peer: Option<Ipv6Addr>,
    /// Replacements since the link came up: more than one means several routers answer.
    replacements: u32,
}

impl LinkPeer {
    /// The peer, once one was heard.
    pub fn peer(&self) -> Option<Ipv6Addr> {
        self.peer
    }

    /// How often another source replaced the peer.
    pub fn replacements(&self) -> u32 {
        self.replacements
    }

    /// A valid Router Advertisement from `source` (the caller checked it: link-local, hop
    /// limit 255, RFC 4861 §6.1.2).
    pub fn heard(&mut self, source: Ipv6Addr) -> Heard {
        match self.peer.replace(source) {
            None => Heard::New,
            Some(p) if p == source => Heard::Same,
            Some(previous) => {
                self.replacements += 1;
                Heard::Replaced { previous }
            }
        }
    }

    /// The link went down: the peer is forgotten (FRR forgets it too).
    pub fn link_down(&mut self) {
        *self = LinkPeer::default();
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

    #[test]
    fn the_newest_source_is_the_peer_and_replacements_are_counted() {
        let a = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
        let b = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 2);
        let mut p = LinkPeer::default();
        assert_eq!(p.peer(), None);
        assert_eq!(p.heard(a), Heard::New);
        assert_eq!(p.heard(a), Heard::Same);
        assert_eq!(p.heard(b), Heard::Replaced { previous: a });
        assert_eq!(p.heard(a), Heard::Replaced { previous: b });
        assert_eq!((p.peer(), p.replacements()), (Some(a), 2));
        p.link_down();
        assert_eq!((p.peer(), p.replacements()), (None, 0));
        assert_eq!(p.heard(b), Heard::New);
    }
}
