//! The replay rule: which authenticated heartbeats of a peer count as new.
//!
//! Anyone on the path can capture a heartbeat and send it again; anyone holding the key can send
//! heartbeats in any node's name. The rule refuses the first and bounds what the second costs the
//! real sender: one forged datagram at most [`MAX_LEAD_MS`] of refused heartbeats, never a
//! lock-out until a restart. Per peer:
//!
//! 1. **Window.** A timestamp further than [`CLOCK_WINDOW_MS`] from our clock is refused
//!    (`Clock`), whatever the table holds or forgot.
//! 2. **Same boot.** Counts when its sequence number is above every one accepted from that boot,
//!    or else when its timestamp is later than every one recorded for the node (`Replay`
//!    otherwise).
//! 3. **Another boot** counts only when its timestamp is no older than the newest recorded minus
//!    [`BOOT_TOLERANCE_MS`] and, for one of the last [`MAX_BOOTS`] boots heard, when rule 2 holds
//!    against that boot's own sequence.
//! 4. **Recorded time is capped** at [`MAX_LEAD_MS`] ahead of the table's estimate of the
//!    sender's clock; a heartbeat beyond it moves the estimate on by the lead and is refused if
//!    it comes again.
//!
//! Why this shape, the bound it gives and the clock-step cases:
//! docs/decisions/0015-layer2-quorum.md, "Replay protection".

use std::collections::VecDeque;
use std::time::Instant;

use crate::heartbeat::{Heartbeat, HeartbeatError};

/// What the replay rule reads of a message: its sender's boot, sequence number and clock. v3
/// heartbeats and v4 beats and reports ([`crate::wire`]) carry the same three, so one rule
/// serves both formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// Random per process start.
    pub boot: u64,
    /// Increases with every message of one boot.
    pub seq: u64,
    /// The sender's wall clock, milliseconds since the Unix epoch.
    pub unix_ms: u64,
}

impl From<&Heartbeat> for Stamp {
    fn from(beat: &Heartbeat) -> Self {
        Stamp {
            boot: beat.boot,
            seq: beat.seq,
            unix_ms: beat.unix_ms,
        }
    }
}

/// Heartbeats whose timestamp is further than this from ours are refused: replays of old
/// captures fail, while nodes kept within seconds by NTP pass.
pub const CLOCK_WINDOW_MS: u64 = 30_000;
/// How far ahead of the sender's clock, as the table estimates it, a recorded timestamp may be:
/// what one forged heartbeat can cost the real sender (module docs, rule 4), well under the
/// default failure timeout. Real heartbeats are not ahead of the estimate unless the sender's
/// clock jumped forward; they still count, and the estimate catches up by this much a heartbeat.
pub const MAX_LEAD_MS: u64 = 250;
/// A boot other than the last heard counts when its timestamp is no older than the newest
/// recorded for the node minus this (module docs, rule 3): a restart after a clock step back of
/// up to this much is heard at once, while the captures of an earlier boot that were not
/// remembered stay refused once the sender has run this long.
pub const BOOT_TOLERANCE_MS: u64 = 10_000;
/// Boots remembered per peer, each with its highest sequence number: a restarted sender's old
/// boot stays refused; more boots in one clock window (forged ones) push the oldest out, which
/// then falls back to rule 3's timestamp check.
pub const MAX_BOOTS: usize = 4;

/// Rule 1: a heartbeat stamped `beat_ms` when our wall clock reads `unix_ms` is refused when
/// the two are further apart than [`CLOCK_WINDOW_MS`].
pub fn check_window(beat_ms: u64, unix_ms: u64) -> Result<(), HeartbeatError> {
    let skew_ms = unix_ms.abs_diff(beat_ms);
    if skew_ms > CLOCK_WINDOW_MS {
        return Err(HeartbeatError::Clock { skew_ms });
    }
    Ok(())
}

/// What the table remembers of a peer's heartbeats to tell new ones from replays (module docs,
/// rules 2 to 4).
#[derive(Clone, Debug)]
pub struct History {
    /// Boots heard, each with the highest sequence number accepted from it; the boot heard last
    /// is at the end. At most [`MAX_BOOTS`].
    boots: Vec<(u64, u64)>,
    /// The highest timestamp recorded (capped, rule 4) for the node, any boot.
    newest_ms: u64,
    /// The estimate of the sender's clock: `clock_ms` at `clock_at`, advancing with our
    /// monotonic clock.
    clock_ms: u64,
    clock_at: Instant,
    /// Heartbeats accepted with a timestamp beyond the cap, as (boot, seq, timestamp), while
    /// their timestamp is above `newest_ms`: the time rule alone would take them again. At most
    /// [`MAX_AHEAD`], oldest first.
    ahead: VecDeque<(u64, u64, u64)>,
}

/// Heartbeats remembered per peer as accepted ahead of the clock estimate: enough for the
/// estimate to catch up with a sender whose clock jumped a whole clock window forward, one
/// heartbeat at a time.
const MAX_AHEAD: usize = 128;

impl History {
    /// The state after the first heartbeat heard from a peer. With nothing known of its clock,
    /// ours stands in for it (rule 4).
    pub fn first(beat: Stamp, now: Instant, unix_ms: u64) -> Self {
        let mut history = History {
            boots: Vec::new(),
            newest_ms: 0,
            clock_ms: unix_ms,
            clock_at: now,
            ahead: VecDeque::new(),
        };
        history.record(beat, now);
        history
    }

    /// The sender's clock at `now`, as estimated.
    fn clock(&self, now: Instant) -> u64 {
        let elapsed = u64::try_from(now.saturating_duration_since(self.clock_at).as_millis())
            .unwrap_or(u64::MAX);
        self.clock_ms.saturating_add(elapsed)
    }

    /// Decides whether `beat` is new (rules 2 and 3) and, if so, records it (rule 4).
    pub fn admit(&mut self, beat: Stamp, now: Instant) -> Result<(), HeartbeatError> {
        if self.ahead.contains(&(beat.boot, beat.seq, beat.unix_ms)) {
            // Accepted before with a capped timestamp: the time rule alone would take it again.
            return Err(HeartbeatError::Replay);
        }
        let current = self
            .boots
            .last()
            .is_some_and(|&(boot, _)| boot == beat.boot);
        if !current && beat.unix_ms.saturating_add(BOOT_TOLERANCE_MS) < self.newest_ms {
            // An earlier boot's capture, or a restart after a clock step back beyond the
            // tolerance (refused until the sender's clock catches up).
            return Err(HeartbeatError::Replay);
        }
        let known = self.boots.iter().find(|&&(boot, _)| boot == beat.boot);
        // The second arm is what a forged `seq` cannot close for good: real heartbeats pass it
        // once their timestamps pass the (capped) newest.
        if known.is_some_and(|&(_, seq)| beat.seq <= seq && beat.unix_ms <= self.newest_ms) {
            return Err(HeartbeatError::Replay);
        }
        self.record(beat, now);
        Ok(())
    }

    /// Records an accepted heartbeat: its sequence for its boot, its timestamp capped at the
    /// clock estimate plus [`MAX_LEAD_MS`]. A capped one moves the estimate on by the lead and is
    /// remembered until the recorded time passes it.
    fn record(&mut self, beat: Stamp, now: Instant) {
        let cap = self.clock(now).saturating_add(MAX_LEAD_MS);
        if beat.unix_ms > cap {
            self.clock_ms = cap;
            self.clock_at = now;
            if self.ahead.len() >= MAX_AHEAD {
                self.ahead.pop_front();
            }
            self.ahead.push_back((beat.boot, beat.seq, beat.unix_ms));
        }
        self.newest_ms = self.newest_ms.max(beat.unix_ms.min(cap));
        let newest = self.newest_ms;
        self.ahead.retain(|&(_, _, ts)| ts > newest);
        let seq = match self.boots.iter().position(|&(boot, _)| boot == beat.boot) {
            Some(i) => self.boots.remove(i).1.max(beat.seq),
            None => {
                if self.boots.len() >= MAX_BOOTS {
                    self.boots.remove(0);
                }
                beat.seq
            }
        };
        self.boots.push((beat.boot, seq));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Duration;

    use super::*;
    use crate::heartbeat::fixtures::{beat, beat_at};
    use crate::liveness::Membership;
    use proptest::prelude::*;

    #[test]
    fn refuses_replays_clock_skew_and_itself() {
        let t0 = Instant::now();
        let mut m = Membership::new("node1", Duration::from_millis(500));
        m.receive(beat("node2", 5), t0, 1_000_000).unwrap();
        assert_eq!(
            m.receive(beat("node2", 5), t0, 1_000_000),
            Err(HeartbeatError::Replay)
        );
        assert_eq!(
            m.receive(beat("node2", 4), t0, 1_000_000),
            Err(HeartbeatError::Replay)
        );
        // An older boot's capture replayed: new boot id, old timestamp.
        let mut old_boot = beat("node2", 99);
        old_boot.boot = 3;
        old_boot.unix_ms = 1_000_000 - BOOT_TOLERANCE_MS - 1;
        assert_eq!(
            m.receive(old_boot, t0, 1_000_000),
            Err(HeartbeatError::Replay)
        );
        // A real restart: new boot, later time, sequence starting over.
        let mut restarted = beat("node2", 1);
        restarted.boot = 8;
        restarted.unix_ms = 1_000_500;
        assert!(m.receive(restarted, t0, 1_000_500).is_ok());
        assert!(matches!(
            m.receive(beat("node3", 1), t0, 1_000_000 + CLOCK_WINDOW_MS + 1),
            Err(HeartbeatError::Clock { .. })
        ));
        assert!(!m.receive(beat("node1", 1), t0, 1_000_000).unwrap());
        assert!(!m.alive(t0).contains_key("node1"));
    }

    /// One authenticated datagram with the highest sequence number (anyone holding the key can
    /// send it) must not make the sender's real heartbeats replays until it restarts.
    #[test]
    fn a_forged_sequence_number_does_not_lock_the_sender_out() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut m = Membership::new("node1", ms(500));
        m.receive(beat_at("node2", 7, 1, 1_000_000), t0, 1_000_000)
            .unwrap();
        m.receive(
            beat_at("node2", 7, u64::MAX, 1_000_050),
            t0 + ms(50),
            1_000_050,
        )
        .unwrap();
        // The real sender goes on, one heartbeat every 100 ms: accepted again within a second
        // and a heartbeat.
        assert_real_sender_heard_again(&mut m, t0);
    }

    /// The real node2 (boot 7) goes on sending one heartbeat every 100 ms from `t0`: it must be
    /// heard again within about a second, and from then on every heartbeat counts.
    fn assert_real_sender_heard_again(m: &mut Membership, t0: Instant) {
        let accepted: Vec<u64> = (2..40)
            .filter(|&seq| {
                let at = 100 * (seq - 1);
                m.receive(
                    beat_at("node2", 7, seq, 1_000_000 + at),
                    t0 + Duration::from_millis(at),
                    1_000_000 + at,
                )
                .is_ok()
            })
            .collect();
        assert!(accepted.first().is_some_and(|&s| s <= 12), "{accepted:?}");
        assert!((12..40).all(|s| accepted.contains(&s)), "{accepted:?}");
    }

    /// A forged new boot stamped at the far edge of the clock window must not make the real
    /// boot's heartbeats replays for the rest of the window.
    #[test]
    fn a_forged_boot_from_the_future_does_not_lock_the_sender_out() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut m = Membership::new("node1", ms(500));
        m.receive(beat_at("node2", 7, 1, 1_000_000), t0, 1_000_000)
            .unwrap();
        m.receive(
            beat_at("node2", 99, 1, 1_000_000 + CLOCK_WINDOW_MS),
            t0 + ms(10),
            1_000_010,
        )
        .unwrap();
        assert_real_sender_heard_again(&mut m, t0);
    }

    /// A speaker restarted after its clock stepped back a few seconds is heard at once.
    #[test]
    fn a_restart_after_the_clock_stepped_back_is_accepted() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut m = Membership::new("node1", ms(500));
        m.receive(beat_at("node2", 7, 500, 1_000_000), t0, 1_000_000)
            .unwrap();
        // Clock stepped back 5 s, process restarted 1 s later.
        m.receive(beat_at("node2", 8, 1, 996_000), t0 + ms(1_000), 1_001_000)
            .unwrap();
        m.receive(beat_at("node2", 8, 2, 996_100), t0 + ms(1_100), 1_001_100)
            .unwrap();
        // Within a boot a backward step is no replay either: the sequence grows.
        m.receive(beat_at("node2", 8, 3, 990_000), t0 + ms(1_200), 1_001_200)
            .unwrap();
        assert_eq!(
            m.alive(t0 + ms(1_200)).keys().collect::<Vec<_>>(),
            ["node2"]
        );
    }

    /// What replay protection is for: captured datagrams sent again, inside and outside the
    /// clock window, never count.
    #[test]
    fn captured_heartbeats_sent_again_are_refused() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut m = Membership::new("node1", ms(500));
        let mut captured = Vec::new();
        for seq in 1..=50 {
            let at = 100 * seq;
            let b = beat_at("node2", 7, seq, 1_000_000 + at);
            m.receive(b.clone(), t0 + ms(at), 1_000_000 + at).unwrap();
            captured.push(b);
        }
        // The sender restarts (a new boot); the old boot's captures stay refused.
        for seq in 1..=50 {
            let at = 6_000 + 100 * seq;
            let b = beat_at("node2", 8, seq, 1_000_000 + at);
            m.receive(b.clone(), t0 + ms(at), 1_000_000 + at).unwrap();
            captured.push(b);
        }
        let now_ms = 1_011_000;
        for b in &captured {
            assert_eq!(
                m.receive(b.clone(), t0 + ms(11_000), now_ms),
                Err(HeartbeatError::Replay),
                "{b:?}"
            );
        }
        // Later than the window: refused for the clock, whatever the table holds.
        let mut fresh = Membership::new("node1", ms(500));
        assert!(matches!(
            fresh.receive(captured[0].clone(), t0, 1_000_100 + CLOCK_WINDOW_MS + 1),
            Err(HeartbeatError::Clock { .. })
        ));
    }

    /// The real sender's heartbeats from `from` (seq, timestamp and our clock advancing 100 ms
    /// each), fed to `m`; returns the sequence numbers accepted.
    fn run_sender(
        m: &mut Membership,
        t0: Instant,
        boot: u64,
        seqs: std::ops::Range<u64>,
        clock_step_ms: i64,
    ) -> Vec<u64> {
        seqs.filter(|&seq| {
            let at = 100 * seq;
            let ts = (1_000_000 + at).saturating_add_signed(clock_step_ms);
            m.receive(
                beat_at("node2", boot, seq, ts),
                t0 + Duration::from_millis(at),
                1_000_000 + at,
            )
            .is_ok()
        })
        .collect()
    }

    /// A forged maximal sequence number, then the real sender's clock jumps forward: its
    /// heartbeats pass neither the sequence nor (at first) the timestamp cap, but each one moves
    /// the clock estimate on, so they are heard again within a couple of seconds.
    #[test]
    fn a_clock_jump_after_a_forged_sequence_number_is_heard_again() {
        let t0 = Instant::now();
        let mut m = Membership::new("node1", Duration::from_millis(500));
        assert_eq!(run_sender(&mut m, t0, 7, 1..10, 0).len(), 9);
        m.receive(
            beat_at("node2", 7, u64::MAX, 1_000_950),
            t0 + Duration::from_millis(950),
            1_000_950,
        )
        .unwrap();
        let accepted = run_sender(&mut m, t0, 7, 10..60, 10_000);
        // 10 s ahead, caught up at 500 ms a heartbeat: 20 heartbeats.
        assert!(accepted.first().is_some_and(|&s| s <= 32), "{accepted:?}");
        assert!((32..60).all(|s| accepted.contains(&s)), "{accepted:?}");
    }

    /// More forged boots than the table remembers push the real boot out; it comes back as a
    /// new boot at once (its timestamp is current), and its captures stay refused.
    #[test]
    fn a_flood_of_forged_boots_does_not_lock_the_sender_out() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut m = Membership::new("node1", ms(500));
        assert_eq!(run_sender(&mut m, t0, 7, 1..10, 0).len(), 9);
        for boot in 0..(2 * MAX_BOOTS as u64) {
            m.receive(
                beat_at("node2", 100 + boot, u64::MAX, 1_000_000 + CLOCK_WINDOW_MS),
                t0 + ms(950),
                1_000_950,
            )
            .unwrap();
        }
        assert_eq!(run_sender(&mut m, t0, 7, 10..30, 0).len(), 20);
        assert_eq!(
            m.receive(
                beat_at("node2", 7, 25, 1_002_500),
                t0 + ms(3_000),
                1_003_000
            ),
            Err(HeartbeatError::Replay)
        );
    }

    /// What the adversary sends in [`forged_heartbeats_lock_the_sender_out_only_briefly`].
    #[derive(Clone, Debug)]
    enum Evil {
        /// A heartbeat signed with the key: boot 0 and 1 are the real sender's two boots,
        /// others are made up; the timestamp is relative to the receiver's clock.
        Forge { boot: u64, seq: u64, ts_off: i64 },
        /// Any datagram sent so far, real or forged, sent again.
        Replay(usize),
    }

    fn evil() -> impl Strategy<Value = Evil> {
        prop_oneof![
            (
                0u64..6,
                prop_oneof![Just(u64::MAX), any::<u64>(), 0u64..400],
                prop_oneof![
                    Just(CLOCK_WINDOW_MS as i64),
                    -(CLOCK_WINDOW_MS as i64) - 1_000..CLOCK_WINDOW_MS as i64 + 1_000
                ],
            )
                .prop_map(|(boot, seq, ts_off)| Evil::Forge { boot, seq, ts_off }),
            any::<usize>().prop_map(Evil::Replay),
        ]
    }

    /// Our wall clock at `at` ms into a simulation.
    const SIM_EPOCH_MS: u64 = 1_700_000_000_000;

    proptest! {
        /// Arbitrary interleavings of the real sender's heartbeats (one every 100 ms, a restart
        /// with a new boot somewhere, its clock `skew` from ours) with forged heartbeats and
        /// replays: a real heartbeat is refused only shortly after a forged one, never until a
        /// restart: at most [`MAX_LEAD_MS`] per forged datagram sent so far (docs/decisions/0015,
        /// "Replay protection").
        #[test]
        fn forged_heartbeats_lock_the_sender_out_only_briefly(
            skew in -5_000i64..5_000,
            restart_at in 2u64..200,
            attacks in prop::collection::vec((0u64..200, 0u64..10, evil()), 0..16),
        ) {
            let t0 = Instant::now();
            let mut m = Membership::new("node1", Duration::from_millis(500));
            let mut sent: Vec<(Heartbeat, bool)> = Vec::new();
            let mut forged_seen = 0u64;
            let mut last_forged: Option<u64> = None;
            let mut attacks = attacks;
            attacks.sort_by_key(|(slot, sub, _)| (*slot, *sub));
            let mut attacks = attacks.into_iter().peekable();
            for slot in 0..200u64 {
                // The real heartbeat of this slot (none in slot 0, so forgeries can come first;
                // none for 500 ms around the restart).
                let at = 100 * slot;
                let restarting = (restart_at..restart_at + 5).contains(&slot);
                if slot > 0 && !restarting {
                    let (boot, seq) = if slot < restart_at { (7, slot) } else { (8, slot - restart_at) };
                    let b = beat_at("node2", boot, seq, (SIM_EPOCH_MS + at).saturating_add_signed(skew));
                    let result = m.receive(b.clone(), t0 + Duration::from_millis(at), SIM_EPOCH_MS + at);
                    if result.is_err() {
                        // The lead per forged datagram so far (decision 0015), what a forged
                        // first contact adds when the sender's clock is behind ours, and one
                        // heartbeat interval.
                        let bound = MAX_LEAD_MS * forged_seen + (-skew).max(0) as u64 + 100;
                        prop_assert!(
                            last_forged.is_some_and(|f| at - f <= bound),
                            "real heartbeat {:?} refused at {} ms ({:?}), last forged at {:?}, bound {}",
                            b, at, result, last_forged, bound
                        );
                    }
                    sent.push((b, false));
                }
                while let Some((_, sub, evil)) = attacks.next_if(|(s, _, _)| *s == slot) {
                    let at = at + 1 + 9 * sub;
                    let (b, forged) = match evil {
                        Evil::Forge { boot, seq, ts_off } => {
                            let boot = [7, 8].get(boot as usize).copied().unwrap_or(100 + boot);
                            let ts = (SIM_EPOCH_MS + at).saturating_add_signed(ts_off);
                            (beat_at("node2", boot, seq, ts), true)
                        }
                        Evil::Replay(i) if !sent.is_empty() => sent[i % sent.len()].clone(),
                        Evil::Replay(_) => continue,
                    };
                    let accepted = m.receive(b.clone(), t0 + Duration::from_millis(at), SIM_EPOCH_MS + at).is_ok();
                    if forged {
                        forged_seen += 1;
                    }
                    // A replayed forged datagram can count again (once); a replayed real one
                    // is what the rule exists to refuse.
                    if forged || (accepted && b.seq != 0 && sent.iter().any(|(s, f)| *f && s == &b)) {
                        last_forged = Some(at);
                        forged_seen += u64::from(!forged);
                    }
                    sent.push((b, forged));
                }
            }
        }

        /// The real sender's heartbeats (a restart, its clock stepping back within a boot or
        /// before the restart, some lost) interleaved with replays of any earlier one: every
        /// real heartbeat that arrives counts, no replay of one that counted does.
        #[test]
        fn replays_never_count_and_real_heartbeats_always_do(
            skew in -5_000i64..5_000,
            restart_at in 2u64..150,
            step_at in 1u64..150,
            step_back in 0u64..BOOT_TOLERANCE_MS,
            lost in prop::collection::btree_set(1u64..150, 0..20),
            replays in prop::collection::vec((1u64..150, any::<usize>()), 0..60),
        ) {
            let t0 = Instant::now();
            let mut m = Membership::new("node1", Duration::from_millis(500));
            let mut accepted: Vec<Heartbeat> = Vec::new();
            for slot in 1..150u64 {
                let at = 100 * slot;
                if !(restart_at..restart_at + 5).contains(&slot) {
                    let (boot, seq) = if slot < restart_at { (7, slot) } else { (8, slot - restart_at) };
                    let stepped = if slot >= step_at { step_back } else { 0 };
                    let ts = (SIM_EPOCH_MS + at).saturating_add_signed(skew) - stepped;
                    let b = beat_at("node2", boot, seq, ts);
                    if !lost.contains(&slot) {
                        let r = m.receive(b.clone(), t0 + Duration::from_millis(at), SIM_EPOCH_MS + at);
                        prop_assert!(r.is_ok(), "{:?} refused: {:?}", b, r);
                        accepted.push(b);
                    }
                }
                for (_, i) in replays.iter().filter(|(s, _)| *s == slot) {
                    if accepted.is_empty() {
                        continue;
                    }
                    let b = accepted[i % accepted.len()].clone();
                    let at = at + 50;
                    let r = m.receive(b.clone(), t0 + Duration::from_millis(at), SIM_EPOCH_MS + at);
                    prop_assert_eq!(r, Err(HeartbeatError::Replay), "{:?}", b);
                }
            }
        }
    }
}
