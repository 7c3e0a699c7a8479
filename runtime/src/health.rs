//! Health that can fail: the work loop's pulse. `/healthz` answers ok only while the loop beats
//! (a panicked, ended or stuck loop makes the probe fail, so the kubelet restarts the process),
//! and the controller's Lease task stops renewing when the pulse stops, so a standby takes over.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Why the work loop counts as unhealthy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unhealthy {
    /// The loop returned or panicked.
    #[error("the work loop has ended")]
    Ended,
    /// The loop has not beaten for longer than the limit.
    #[error(
        "the work loop has not made progress for {:.1} s (limit {:.1} s)",
        silent.as_secs_f64(),
        limit.as_secs_f64()
    )]
    Stalled {
        /// Since the last beat.
        silent: Duration,
        /// The pulse's limit.
        limit: Duration,
    },
}

/// The work loop's pulse, shared between the loop (which beats) and whoever checks it.
#[derive(Clone, Debug)]
pub struct Pulse(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    base: Instant,
    /// Milliseconds after `base` of the last beat.
    last_ms: AtomicU64,
    ended: AtomicBool,
    limit: Duration,
}

impl Pulse {
    /// A pulse that counts as stopped when the loop has not beaten for `limit` (the loop must
    /// beat well within it, also when idle). It starts beating now.
    pub fn new(limit: Duration) -> Self {
        Pulse(Arc::new(Inner {
            base: Instant::now(),
            last_ms: AtomicU64::new(0),
            ended: AtomicBool::new(false),
            limit,
        }))
    }

    fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.0.base).as_millis()).unwrap_or(u64::MAX)
    }

    /// The loop is alive at `now`.
    pub fn beat_at(&self, now: Instant) {
        self.0.last_ms.fetch_max(self.ms(now), Ordering::Relaxed);
    }

    /// The loop is alive now.
    pub fn beat(&self) {
        self.beat_at(Instant::now());
    }

    /// The loop has ended (returned or panicked): the pulse is stopped for good.
    pub fn end(&self) {
        self.0.ended.store(true, Ordering::Relaxed);
    }

    /// Ok while the loop beats; otherwise why not.
    pub fn check_at(&self, now: Instant) -> Result<(), Unhealthy> {
        if self.0.ended.load(Ordering::Relaxed) {
            return Err(Unhealthy::Ended);
        }
        let silent = Duration::from_millis(
            self.ms(now)
                .saturating_sub(self.0.last_ms.load(Ordering::Relaxed)),
        );
        if silent > self.0.limit {
            return Err(Unhealthy::Stalled {
                silent,
                limit: self.0.limit,
            });
        }
        Ok(())
    }

    /// [`Pulse::check_at`] now.
    pub fn check(&self) -> Result<(), Unhealthy> {
        self.check_at(Instant::now())
    }

    /// A guard that ends the pulse when dropped, also by a panic's unwinding: hold it in the
    /// loop's task.
    pub fn end_on_drop(&self) -> EndOnDrop {
        EndOnDrop(self.clone())
    }
}

/// Ends its [`Pulse`] when dropped.
#[derive(Debug)]
pub struct EndOnDrop(Pulse);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.0.end();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_pulse_fails_after_its_limit_without_a_beat() {
        let p = Pulse::new(Duration::from_secs(10));
        let t0 = Instant::now();
        p.beat_at(t0);
        assert!(p.check_at(t0 + Duration::from_secs(10)).is_ok());
        let err = p
            .check_at(t0 + Duration::from_secs(11))
            .unwrap_err()
            .to_string();
        assert!(err.contains("not made progress"), "{err}");
        p.beat_at(t0 + Duration::from_secs(11));
        assert!(p.check_at(t0 + Duration::from_secs(12)).is_ok());
        // An older beat (another thread's, late) never moves it back.
        p.beat_at(t0);
        assert!(p.check_at(t0 + Duration::from_secs(20)).is_ok());
    }

    #[test]
    fn a_loop_that_ends_or_panics_stops_the_pulse_for_good() {
        let p = Pulse::new(Duration::from_secs(10));
        let clone = p.clone();
        let joined = std::thread::spawn(move || {
            let _guard = clone.end_on_drop();
            panic!("the loop panics");
        })
        .join();
        assert!(joined.is_err());
        assert_eq!(
            p.check().unwrap_err().to_string(),
            "the work loop has ended"
        );
        p.beat();
        assert!(p.check().is_err());
    }
}
