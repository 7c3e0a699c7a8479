//! A wait before a node may own IPs, restarted whenever it stops being able to: the settle time
//! after a speaker finds a usable interface, and the claim delay after it starts to act
//! (decision record 0015, "Claim delay"). One copy for the speaker, the voters' member rules
//! and the simulator.

use std::time::{Duration, Instant};

/// A wait that starts when a condition becomes true and starts over when it turns false.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Settling {
    settled_at: Option<Instant>,
}

impl Settling {
    /// Takes in whether the node can announce (`able`: it has a usable interface, or it acts)
    /// at `now`; returns whether the wait is over. Once able, it is over after `wait`; no longer
    /// able, it starts over.
    pub fn observe(&mut self, able: bool, now: Instant, wait: Duration) -> bool {
        match (able, self.settled_at) {
            (true, None) => self.settled_at = Some(now + wait),
            (false, Some(_)) => self.settled_at = None,
            _ => {}
        }
        self.settled_at.is_some_and(|t| now >= t)
    }

    /// When the loop must wake for the wait to end, if that is still ahead of `now`.
    pub fn wake_at(&self, now: Instant) -> Option<Instant> {
        self.settled_at.filter(|t| *t > now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_starts_over_when_the_condition_drops() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut s = Settling::default();
        assert!(!s.observe(true, t0, ms(300)));
        assert_eq!(s.wake_at(t0), Some(t0 + ms(300)));
        assert!(!s.observe(true, t0 + ms(299), ms(300)));
        assert!(s.observe(true, t0 + ms(300), ms(300)));
        assert!(!s.observe(false, t0 + ms(301), ms(300)));
        assert!(!s.observe(true, t0 + ms(302), ms(300)));
        assert!(s.observe(true, t0 + ms(602), ms(300)));
        assert_eq!(s.wake_at(t0 + ms(602)), None);
    }
}
