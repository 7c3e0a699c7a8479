//! Flap damping: a node that lost its quorum and got it back waits before it says it is ready
//! again, longer each time it flaps.
//!
//! Without it, an owner whose heartbeats are lost in bursts (a saturated link or CPU) loses its IPs
//! when the others stop hearing it and takes them back as soon as they hear it again: every round
//! trip moves each IP twice and breaks the connections kube-proxy's conntrack holds on each side.
//! With it, the first loss moves the IPs once (detection cannot be avoided) and they stay with the
//! node that took them until the flapping node has been steady for its hold-down.
//!
//! The rule is applied by the flapping node to itself, through the *ready* flag its heartbeats
//! carry, so that every node sees the same thing: no node has to guess whether another flapped.
//! It never slows a real failover: a failover is other nodes taking over from a node they no longer
//! hear, and the hold-down only delays the *return* of the node that was lost. Its cost is bounded:
//! should the nodes that took over fail during the hold-down, the IPs wait for it to end (at most
//! [`Damping::MAX_HOLD`]).

use std::time::{Duration, Instant};

/// The flap damping state of this node.
#[derive(Clone, Debug)]
pub struct Damping {
    acting: bool,
    /// Losses of quorum in a row, each within [`Damping::STEADY`] of the previous one.
    flaps: u32,
    last_loss: Option<Instant>,
    held_until: Option<Instant>,
}

impl Default for Damping {
    fn default() -> Self {
        Self::new()
    }
}

impl Damping {
    /// The hold-down after the first loss.
    pub const FIRST_HOLD: Duration = Duration::from_secs(2);
    /// The longest hold-down (doubling per flap up to this).
    pub const MAX_HOLD: Duration = Duration::from_secs(30);
    /// A loss this long after the previous one starts the count again.
    pub const STEADY: Duration = Duration::from_secs(60);

    /// A node that has not lost its quorum yet (a starting node has its own settle time).
    pub fn new() -> Self {
        Self {
            acting: true,
            flaps: 0,
            last_loss: None,
            held_until: None,
        }
    }

    /// Takes in whether this node acts (hears a majority and a majority hears it) at `now`.
    pub fn observe(&mut self, acting: bool, now: Instant) {
        match (self.acting, acting) {
            (true, false) => {
                let recent = self
                    .last_loss
                    .is_some_and(|t| now.saturating_duration_since(t) < Self::STEADY);
                self.flaps = if recent {
                    self.flaps.saturating_add(1)
                } else {
                    1
                };
                self.last_loss = Some(now);
            }
            (false, true) => {
                self.held_until = Some(now + self.hold());
            }
            _ => {}
        }
        self.acting = acting;
    }

    /// The hold-down after the current run of losses.
    pub fn hold(&self) -> Duration {
        let doublings = self.flaps.saturating_sub(1).min(16);
        Self::FIRST_HOLD
            .saturating_mul(1 << doublings)
            .min(Self::MAX_HOLD)
    }

    /// Whether this node may say it is ready at `now` (false while held down).
    pub fn ready(&self, now: Instant) -> bool {
        self.held_until.is_none_or(|until| now >= until)
    }

    /// When the hold-down ends, if one is running at `now`.
    pub fn held_until(&self, now: Instant) -> Option<Instant> {
        self.held_until.filter(|until| now < *until)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_node_that_never_lost_its_quorum_is_never_held() {
        let mut d = Damping::new();
        let t0 = Instant::now();
        for i in 0..100 {
            d.observe(true, t0 + MS * i);
            assert!(d.ready(t0 + MS * i));
        }
    }

    #[test]
    fn each_flap_doubles_the_hold_down_up_to_the_cap_and_a_steady_minute_resets_it() {
        let mut d = Damping::new();
        let mut t = Instant::now();
        let mut holds = Vec::new();
        for _ in 0..7 {
            d.observe(false, t);
            t += MS * 600;
            d.observe(true, t);
            assert!(!d.ready(t), "ready at once after regaining the quorum");
            let until = d.held_until(t).unwrap();
            holds.push(until - t);
            assert!(d.ready(until));
            t = until + MS * 100;
        }
        assert_eq!(
            holds,
            [2, 4, 8, 16, 30, 30, 30].map(Duration::from_secs).to_vec()
        );
        // Steady for a minute: the next loss is a first one again.
        t += Damping::STEADY;
        d.observe(false, t);
        d.observe(true, t + MS);
        assert_eq!(d.held_until(t + MS), Some(t + MS + Damping::FIRST_HOLD));
    }

    proptest! {
        /// Whatever the sequence of losses, the node is ready again within the longest hold-down
        /// after it regains its quorum, and never ready at the instant it regains it.
        #[test]
        fn the_hold_down_is_bounded(steps in prop::collection::vec((any::<bool>(), 0u32..5_000), 1..200)) {
            let mut d = Damping::new();
            let mut t = Instant::now();
            let mut was = true;
            for (acting, gap) in steps {
                t += MS * gap;
                d.observe(acting, t);
                if acting && !was {
                    prop_assert!(!d.ready(t));
                    prop_assert!(d.ready(t + Damping::MAX_HOLD));
                }
                was = acting;
            }
        }
    }
}
