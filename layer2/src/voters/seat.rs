//! A node's seat among the voters across configuration changes (decision 0023, "The voter
//! set"): when its voter moves to a new generation, and when it falls silent.
//!
//! A report counts only toward its generation's rules, so a voter that moved to a new
//! generation before the members read it would cost them their quorum, and one that came new
//! into the set reports nothing for its first failure timeout (listening) and no mature
//! acknowledgement before 1.5. So:
//!
//! * **A voter that stays** moves to a new generation 1.5 failure timeouts
//!   ([`super::Timers::held_for`]) after it reads it, and not before its node's member finds
//!   the new voters of that generation reporting to it ([`super::Member::ready_for`],
//!   [`Seat::ready`]). Its table goes on as it is (it only stamps another generation), so its
//!   acknowledgements stay mature and its `told` stays true: what it listed before and after is
//!   one history. Meanwhile the new voters of a joint phase have started and matured, and the
//!   members have read the configuration too, so the quorum passes from one generation to the
//!   next without a gap. If the new voters never report, the old ones never move, and the
//!   controller's change waits (it may replace the joint phase by another with the same old
//!   set: any two configurations that share a set are safe together).
//! * **A voter that leaves** goes on serving its generation for twice that, then falls silent
//!   ([`Seat::retired`]): the members keep their quorum on the old generation until the
//!   voters of the new one have moved.
//! * **A new voter** starts as any voter process does ([`Voter::new`]).

use std::sync::Arc;
use std::time::Instant;

use crate::wire::{Beat, Report};

use super::voter::VoterError;
use super::{Roster, Timers, Voter};

/// One node's voter process and where it is going.
#[derive(Clone, Debug)]
pub struct Seat {
    voter: Voter,
    /// The generation it moves to, from when, and whether the new voters are ready.
    pending: Option<(u64, Instant, bool)>,
    /// The node left the voters: it serves its generation until then, and nothing after.
    retire_at: Option<Instant>,
}

impl Seat {
    /// The node at `me` of `roster` becomes a voter of `generation` at `now` (process `boot`).
    pub fn new(
        roster: Arc<Roster>,
        me: u16,
        boot: u64,
        generation: u64,
        timers: Timers,
        now: Instant,
    ) -> Self {
        Seat {
            voter: Voter::new(roster, me, boot, generation, timers, now),
            pending: None,
            retire_at: None,
        }
    }

    /// The node read at `now` a configuration, `generation`, in which it is a voter: it moves
    /// to it after [`super::Timers::held_for`], unless it serves or moves to that generation or
    /// a later one already.
    pub fn move_to(&mut self, generation: u64, now: Instant) {
        let newest = self.pending.map_or(self.voter.generation(), |(g, _, _)| {
            g.max(self.voter.generation())
        });
        if generation <= newest {
            return;
        }
        // Back among the voters before it fell silent: it serves on.
        self.retire_at = None;
        self.pending = Some((generation, now + self.voter.timers().held_for(), false));
    }

    /// The generation it is to move to, if any.
    pub fn pending(&self) -> Option<u64> {
        self.pending.map(|(g, _, _)| g)
    }

    /// The node's member finds the new voters of the pending generation reporting: the seat
    /// may move once its delay is over.
    pub fn ready(&mut self) {
        if let Some(p) = self.pending.as_mut() {
            p.2 = true;
        }
    }

    /// The node read at `now` a configuration in which it is no voter: it serves on for
    /// twice [`super::Timers::held_for`], then falls silent.
    pub fn retire(&mut self, now: Instant) {
        self.pending = None;
        self.retire_at
            .get_or_insert(now + self.voter.timers().held_for() * 2);
    }

    /// Whether it has retired at `now`: it sends nothing more and may be dropped.
    pub fn retired(&self, now: Instant) -> bool {
        self.retire_at.is_some_and(|at| now >= at)
    }

    /// The presence set changed ([`Voter::set_roster`]).
    pub fn set_roster(&mut self, wanted: &Arc<Roster>, now: Instant) -> bool {
        self.voter.set_roster(wanted, now)
    }

    /// The configuration it serves was read as still current at `now`.
    pub fn confirm(&mut self, now: Instant) {
        self.voter.confirm(now);
    }

    /// Moves to the pending generation once it is due.
    fn apply(&mut self, now: Instant) {
        if let Some((generation, at, true)) = self.pending
            && now >= at
        {
            self.voter.set_generation(generation);
            self.pending = None;
        }
    }

    /// Takes in `beat` and returns the report to send back, if any.
    pub fn receive(
        &mut self,
        beat: &Beat,
        now: Instant,
        unix_ms: u64,
    ) -> Result<Option<Report>, VoterError> {
        self.apply(now);
        let report = self.voter.receive(beat, now, unix_ms)?;
        Ok(report.filter(|_| !self.retired(now)))
    }

    /// Ages the table at `now`.
    pub fn sweep(&mut self, now: Instant) {
        self.apply(now);
        self.voter.sweep(now);
    }

    /// The voter process.
    pub fn serving(&self) -> &Voter {
        &self.voter
    }

    /// Whether the seat has left every generation before `generation` at `now`: it serves
    /// that one or a later one (or will at its next report), it cannot report (its
    /// configuration unconfirmed), or it has retired. The controller's condition for ending a
    /// joint phase.
    pub fn moved_on(&self, generation: u64, now: Instant) -> bool {
        let due = self
            .pending
            .is_some_and(|(g, at, ready)| g >= generation && now >= at && ready);
        self.voter.generation() >= generation || due || self.voter.fenced(now) || self.retired(now)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::collections::BTreeSet;
    use std::time::Duration;

    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const UNIX: u64 = 1_800_000_000_000;

    fn beat(roster: &Roster, seq: u64) -> Beat {
        Beat {
            node: "a".into(),
            boot: 1,
            seq,
            unix_ms: UNIX + seq,
            ready: true,
            leaving: false,
            restarting: false,
            set: roster.id(),
            interfaces: BTreeSet::new(),
            acks: vec![],
        }
    }

    /// Reports of the old generation until 750 ms after the move was read, then of the new
    /// one, from the same table: one report per beat, no gap, mature throughout.
    #[test]
    fn a_move_keeps_the_table_and_leaves_no_gap() {
        let roster = Arc::new(Roster::new(["a", "v"]).unwrap());
        let t0 = Instant::now();
        let mut seat = Seat::new(roster.clone(), 1, 7, 1, Timers::default(), t0);
        let mut seen = Vec::new();
        for k in 1..=30u64 {
            let now = t0 + 100 * MS * u32::try_from(k).unwrap();
            if k == 10 {
                seat.move_to(2, now);
                assert!(!seat.moved_on(2, now));
            }
            if k == 12 {
                seat.ready();
            }
            seat.confirm(now);
            seat.sweep(now);
            if let Some(r) = seat.receive(&beat(&roster, k), now, UNIX).unwrap() {
                seen.push((k, r.generation, r.boot, r.mature));
            }
        }
        assert_eq!(seen.first().map(|s| s.0), Some(5), "listening 500 ms");
        assert_eq!(seat.pending(), None);
        assert!(seen.windows(2).all(|w| w[1].0 == w[0].0 + 1), "no gap");
        let first_new = seen.iter().find(|s| s.1 == 2).unwrap();
        assert_eq!(first_new.0, 18, "moved 750 ms after 1 s");
        assert!(seen.iter().all(|s| s.2 == 7), "one process");
        assert!(seen.iter().filter(|s| s.0 >= 10).all(|s| s.3), "mature on");
        assert!(seat.moved_on(2, t0 + 3_000 * MS));
    }

    /// A voter that leaves serves on for 1.5 s, then falls silent; read back in before that,
    /// it serves on.
    #[test]
    fn a_leaving_voter_serves_on_then_falls_silent() {
        let roster = Arc::new(Roster::new(["a", "v"]).unwrap());
        let t0 = Instant::now();
        let mut seat = Seat::new(roster.clone(), 1, 7, 1, Timers::default(), t0);
        let at = |ms: u32| t0 + ms * MS;
        seat.retire(at(1_000));
        assert!(
            seat.receive(&beat(&roster, 1), at(2_400), UNIX)
                .unwrap()
                .is_some()
        );
        assert!(!seat.moved_on(2, at(2_400)));
        assert_eq!(seat.receive(&beat(&roster, 2), at(2_500), UNIX), Ok(None));
        assert!(seat.retired(at(2_500)) && seat.moved_on(2, at(2_500)));
        let mut back = Seat::new(roster.clone(), 1, 7, 1, Timers::default(), t0);
        back.retire(at(1_000));
        back.move_to(3, at(1_100));
        assert!(!back.retired(at(5_000)));
    }

    /// A voter that cannot confirm its configuration stops reporting, and counts as moved on.
    #[test]
    fn an_unconfirmed_voter_falls_silent() {
        let roster = Arc::new(Roster::new(["a", "v"]).unwrap());
        let t0 = Instant::now();
        let timers = Timers::default();
        let mut seat = Seat::new(roster.clone(), 1, 7, 1, timers, t0);
        let late = t0 + timers.confirm_within + 100 * MS;
        assert!(!seat.moved_on(2, t0 + 600 * MS));
        assert_eq!(seat.receive(&beat(&roster, 1), late, UNIX), Ok(None));
        assert!(seat.moved_on(2, late));
        seat.confirm(late);
        assert!(
            seat.receive(&beat(&roster, 2), late, UNIX)
                .unwrap()
                .is_some()
        );
    }
}
