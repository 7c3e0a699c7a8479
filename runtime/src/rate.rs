//! A token bucket: how a binary spaces out API writes that can come by the thousand (a
//! speaker's status objects after a rollout, or when many IPs move at once), so that N
//! processes do not send the API server N·S writes at the same moment (issue #40). A burst of
//! up to `burst` writes goes at once; beyond it, `per_second` on average.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How fast writes may go.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate {
    /// Writes a second on average; 0 (or less, or not finite): no limit.
    pub per_second: f64,
    /// Writes that may go at once after a quiet time (at least 1).
    pub burst: u32,
}

impl Rate {
    /// No limit.
    pub const UNLIMITED: Rate = Rate {
        per_second: 0.0,
        burst: 1,
    };

    fn limited(&self) -> bool {
        self.per_second.is_finite() && self.per_second > 0.0
    }
}

/// The bucket's state: tokens left and when they were counted.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    rate: Rate,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket at `now`.
    pub fn new(rate: Rate, now: Instant) -> Self {
        let rate = Rate {
            burst: rate.burst.max(1),
            ..rate
        };
        Self {
            rate,
            tokens: f64::from(rate.burst),
            at: now,
        }
    }

    /// Takes a token at `now` if there is one (`None`); otherwise takes nothing and returns
    /// how long until there is one.
    pub fn take(&mut self, now: Instant) -> Option<Duration> {
        if !self.rate.limited() {
            return None;
        }
        // A clock read earlier than the last one adds nothing.
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = self.at.max(now);
        self.tokens =
            (self.tokens + elapsed * self.rate.per_second).min(f64::from(self.rate.burst));
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            None
        } else {
            Some(Duration::from_secs_f64(
                (1.0 - self.tokens) / self.rate.per_second,
            ))
        }
    }
}

/// A [`TokenBucket`] shared by the tasks it paces (clones share it).
#[derive(Clone, Debug)]
pub struct Pacer(Arc<Mutex<TokenBucket>>);

impl Pacer {
    /// A pacer with a full bucket.
    pub fn new(rate: Rate) -> Self {
        Self(Arc::new(Mutex::new(TokenBucket::new(rate, Instant::now()))))
    }

    /// Waits until a write may go, and counts it.
    pub async fn wait(&self) {
        loop {
            let wait = self
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(Instant::now());
            match wait {
                None => return,
                Some(wait) => tokio::time::sleep(wait).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn drain(bucket: &mut TokenBucket, now: Instant) -> usize {
        let mut n = 0;
        while bucket.take(now).is_none() {
            n += 1;
            assert!(n < 1_000_000, "a limited bucket never empties");
        }
        n
    }

    #[test]
    fn a_burst_goes_at_once_then_the_rate_holds() {
        let t0 = Instant::now();
        let rate = Rate {
            per_second: 20.0,
            burst: 100,
        };
        let mut b = TokenBucket::new(rate, t0);
        assert_eq!(drain(&mut b, t0), 100);
        // Empty: the next token in 1/20 s.
        let wait = b.take(t0).unwrap();
        assert!((wait.as_secs_f64() - 0.05).abs() < 1e-9, "{wait:?}");
        // Over 10 s, 200 more, however the reads fall.
        let mut taken = 0;
        for ms in (0..=10_000).step_by(7) {
            taken += drain(&mut b, t0 + Duration::from_millis(ms));
        }
        assert!((199..=200).contains(&taken), "{taken}");
        // A quiet minute refills the burst, no more.
        assert_eq!(drain(&mut b, t0 + Duration::from_secs(70)), 100);
    }

    #[test]
    fn no_rate_means_no_limit_and_a_clock_going_back_adds_nothing() {
        let t0 = Instant::now();
        let mut free = TokenBucket::new(Rate::UNLIMITED, t0);
        assert!((0..10_000).all(|_| free.take(t0).is_none()));
        let mut b = TokenBucket::new(
            Rate {
                per_second: 1.0,
                burst: 0,
            },
            t0 + Duration::from_secs(5),
        );
        // A burst of 0 counts as 1.
        assert_eq!(drain(&mut b, t0 + Duration::from_secs(5)), 1);
        assert_eq!(drain(&mut b, t0), 0);
        assert_eq!(drain(&mut b, t0 + Duration::from_secs(6)), 1);
    }
}
