//! A member: beats to the voters, keeps their latest reports and decides whether it may own IPs,
//! which nodes are candidates, and until when it may answer.
//!
//! The rules are today's (decision 0015 and the speaker's gate) with the voters' reports in
//! place of every peer's heartbeat:
//!
//! 1. **Quorum**: fresh reports (received within the failure timeout) from a majority of the
//!    voters acknowledge a beat of this process: they hear it, and it hears them.
//! 2. **Settle**, **flap damping**, **starvation**, the **claim delay** and **resignation** (a
//!    beat that said not ready ends the claim, which is earned again as at a rejoin): the shared
//!    gate ([`crate::gate`]), exactly as in today's design.
//! 3. **Candidates**: the union of the fresh reports' bitmaps; this node among them only while
//!    it claims.
//! 4. **Tenure**: from the mature acknowledgements of the voters other than itself, the
//!    earliest instant a majority of them can have stopped listing it; answering ends half an
//!    interval before.
//! 5. **Claim**: acting for the claim delay (three intervals), a tenure, and `told` from a
//!    majority of the voters in reports that acknowledge a beat sent after its last
//!    resignation.
//! 6. **Configurations** ([`VoterConfig`]): a report counts only toward the rules of its
//!    generation, and "a majority of the voters" means one of each of the generation's sets.
//!    A member counts the configuration it adopted last and the one just before it, and acts on
//!    one of the two in which it has a quorum (the newest whose tenure has not lapsed, else the
//!    newest), with that one's tenure, `told` and candidates: so it keeps acting while the
//!    voters move to the new generation one by one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::gate::Gate;
use crate::heartbeat::HeartbeatError;
use crate::replay::{self, History, Stamp};
use crate::tenure::{SentLog, Tenure};
use crate::wire::{Ack, Beat, Report, bitmap};

use super::{Roster, Timers, VoterConfig, majority, smallest_takeover};

/// Why a report was not taken in.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MemberError {
    /// Not from one of our voters, or for another node.
    #[error("report not from a voter of ours to us")]
    NotOurs,
    /// Over another presence set: its bitmap would be read against the wrong names.
    #[error("report over another presence set")]
    OtherSet,
    /// Refused by the replay rule.
    #[error("report refused: {0}")]
    Replay(#[from] HeartbeatError),
    /// It leaves out a bitmap this member does not hold (a report that carried it was lost):
    /// ignored and not acknowledged, so the voter sends the bitmap again.
    #[error("report leaves out bitmap version {0}, which this member does not hold")]
    MissingBitmap(u64),
    /// Of a voter configuration this member does not count (older than the one before its
    /// own, or newer than its own: it has not read that one yet).
    #[error("report of voter configuration {0}, which this member does not count")]
    OtherGeneration(u64),
}

/// Rules of the member that the simulator switches off to show that its invariants catch the
/// split each one prevents. Everything else leaves them all on ([`Rules::default`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rules {
    /// Act only with a quorum of voters (rule 1).
    pub quorum: bool,
    /// Answer only within the tenure (rule 4).
    pub tenure: bool,
    /// Claim only once told by a majority (rule 5).
    pub told: bool,
}

impl Default for Rules {
    fn default() -> Self {
        Rules {
            quorum: true,
            tenure: true,
            told: true,
        }
    }
}

/// A voter's latest report, as held.
#[derive(Clone, Debug)]
struct Held {
    report: Report,
    at: Instant,
}

/// What one check decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// This node acts (may own IPs; its beats say ready while confirmed).
    pub acts: bool,
    /// It claims IPs: it is among the candidates it plans with.
    pub claims: bool,
    /// The candidates, as a bitmap over the roster.
    pub candidates: Vec<u8>,
    /// It may answer for what it owns until then (`None`: not at all).
    pub answer_until: Option<Instant>,
}

/// One member process.
#[derive(Clone, Debug)]
pub struct Member {
    roster: Arc<Roster>,
    me: u16,
    name: String,
    boot: u64,
    seq: u64,
    sent: SentLog,
    timers: Timers,
    /// The configurations whose reports count, oldest first: the one adopted last and, when it
    /// is the generation just before, the one before it (rule 6).
    configs: Vec<VoterConfig>,
    /// Roster indexes of every voter of `configs`, ascending: the slots below.
    voters: Vec<u16>,
    /// Per voter (same order), its latest report and replay history.
    held: Vec<Option<Held>>,
    /// Per voter, its latest report of a generation before the latest one's: it counts toward
    /// that generation's rules until it goes stale, while the voters move one by one.
    older: Vec<Option<Held>>,
    histories: Vec<Option<History>>,
    /// Per voter, the last bitmap it sent: its boot, version and bits.
    bitmaps: Vec<Option<(u64, u64, Vec<u8>)>>,
    /// The shared rules (settling, damping, starvation, claim delay, resignation).
    gate: Gate,
    /// The latest `ready: false` beat sent.
    last_unready_seq: u64,
    /// What the beats say.
    ready: bool,
    confirmed: Option<Instant>,
    leaving: bool,
    restarting: bool,
    /// The generation the last check acted on.
    acted_on: Option<u64>,
    /// The rules in force.
    pub rules: Rules,
}

impl Member {
    /// A member process started on the node at `me` of `roster`, with a random `boot`, on the
    /// voter configuration `config`.
    pub fn new(
        roster: Arc<Roster>,
        me: u16,
        boot: u64,
        config: VoterConfig,
        timers: Timers,
    ) -> Self {
        let name = roster.name(me).unwrap_or_default().to_string();
        let voters = config.voters();
        Member {
            held: vec![None; voters.len()],
            older: vec![None; voters.len()],
            histories: vec![None; voters.len()],
            bitmaps: vec![None; voters.len()],
            voters,
            configs: vec![config],
            roster,
            me,
            name,
            boot,
            seq: 0,
            sent: SentLog::new(boot),
            timers,
            gate: Gate::new(crate::gate::Timing::new(
                timers.interval,
                timers.timeout,
                timers.flap_damping,
            )),
            last_unready_seq: 0,
            ready: false,
            confirmed: None,
            leaving: false,
            restarting: false,
            acted_on: None,
            rules: Rules::default(),
        }
    }

    /// Every voter it beats to (roster indexes, ascending): those of the configurations whose
    /// reports count.
    pub fn voters(&self) -> &[u16] {
        &self.voters
    }

    /// The configuration adopted last.
    pub fn config(&self) -> &VoterConfig {
        // `configs` is never empty: `new` puts one, `adopt` replaces with at least one.
        &self.configs[self.configs.len() - 1]
    }

    /// The latest report held from each voter, with when it arrived (what `explain` shows).
    pub fn held(&self) -> impl Iterator<Item = (u16, &Report, Instant)> {
        self.voters
            .iter()
            .zip(&self.held)
            .filter_map(|(&v, h)| h.as_ref().map(|h| (v, &h.report, h.at)))
    }

    /// The generation the last check found a quorum in, if any.
    pub fn acted_on(&self) -> Option<u64> {
        self.acted_on
    }

    /// Whether the voters of generation `generation` (adopted) that were no voters of the
    /// configuration before it report to this member at it, so that with the voters that stay
    /// they make a majority of each of its sets: the condition for this node's own voter to
    /// move to that generation ([`super::Seat::ready`]). The voters that stay are counted as
    /// if they had moved: they move about together.
    pub fn ready_for(&self, generation: u64, now: Instant) -> bool {
        let Some(at) = self.configs.iter().position(|c| c.generation == generation) else {
            return false;
        };
        let config = &self.configs[at];
        let before: Vec<u16> = match at.checked_sub(1) {
            Some(i) => self.configs[i].voters(),
            None => Vec::new(),
        };
        let view = self.view();
        config.sets().all(|set| {
            let mut count = 0;
            let mut lowest = false;
            for (i, v) in set.iter().enumerate() {
                let reports = view
                    .fresh(*v, generation, now)
                    .is_some_and(|r| r.mature && view.hears_me(r));
                if before.contains(v) || reports {
                    count += 1;
                    lowest |= i == 0;
                }
            }
            majority(count, lowest, set.len())
        })
    }

    /// Adopts `config`, published by the controller, if it is newer than the one held. Reports
    /// of the generation just before keep counting until they expire (rule 6), so a member
    /// keeps acting while the voters move over. Returns whether it was adopted.
    pub fn adopt(&mut self, config: VoterConfig) -> bool {
        let adopted = self.config().generation;
        if config.generation <= adopted {
            return false;
        }
        let previous = self.configs.pop();
        self.configs.clear();
        if config.generation == adopted + 1 {
            self.configs.extend(previous);
        }
        self.configs.push(config);
        let mut voters: Vec<u16> = self.configs.iter().flat_map(VoterConfig::voters).collect();
        voters.sort_unstable();
        voters.dedup();
        let mut held = vec![None; voters.len()];
        let mut older = vec![None; voters.len()];
        let mut histories = vec![None; voters.len()];
        let mut bitmaps = vec![None; voters.len()];
        for (old, v) in self.voters.iter().enumerate() {
            if let Ok(new) = voters.binary_search(v) {
                held[new] = self.held[old].take();
                older[new] = self.older[old].take();
                histories[new] = self.histories[old].take();
                bitmaps[new] = self.bitmaps[old].take();
            }
        }
        (self.voters, self.held, self.older) = (voters, held, older);
        (self.histories, self.bitmaps) = (histories, bitmaps);
        true
    }

    /// The node's roster index.
    pub fn me(&self) -> u16 {
        self.me
    }

    /// Whether it claims IPs (as of the last check).
    pub fn claims(&self) -> bool {
        self.gate.claiming()
    }

    /// The next beat, sent at `now` (wall clock `unix_ms`) to every voter. It says ready only
    /// while the last check that found the node acting is within the mandate.
    pub fn beat(&mut self, now: Instant, unix_ms: u64, interfaces: &[String]) -> Beat {
        self.seq += 1;
        self.sent.record(self.seq, now);
        let ready = self.ready
            && !self.leaving
            && self
                .confirmed
                .is_some_and(|c| now.saturating_duration_since(c) <= self.timers.mandate());
        if !ready {
            self.last_unready_seq = self.seq;
        }
        let acks = self
            .voters
            .iter()
            .zip(&self.held)
            .filter_map(|(&v, held)| {
                let held = held.as_ref()?;
                Some(Ack {
                    voter: self.roster.node_ref(v)?,
                    seen: crate::wire::Seen {
                        boot: held.report.boot,
                        seq: held.report.seq,
                    },
                })
            })
            .collect();
        Beat {
            node: self.name.clone(),
            boot: self.boot,
            seq: self.seq,
            unix_ms,
            ready,
            leaving: self.leaving,
            restarting: self.leaving && self.restarting,
            set: self.roster.id(),
            interfaces: interfaces.iter().cloned().collect(),
            acks,
        }
    }

    /// Takes in `report`, which arrived at `now` (our wall clock `unix_ms`). Returns whether it
    /// changed what a check reads (its bitmap, or what it says of this node).
    pub fn receive(
        &mut self,
        mut report: Report,
        now: Instant,
        unix_ms: u64,
    ) -> Result<bool, MemberError> {
        let slot = self.slot_of(&report)?;
        replay::check_window(report.unix_ms, unix_ms)?;
        let stamp = Stamp {
            boot: report.boot,
            seq: report.seq,
            unix_ms: report.unix_ms,
        };
        match self.histories[slot].as_mut() {
            Some(h) => h.admit(stamp, now)?,
            None => self.histories[slot] = Some(History::first(stamp, now, unix_ms)),
        }
        self.fill_bitmap(slot, &mut report)?;
        Ok(self.hold(slot, report, now))
    }

    /// Takes in the report of this node's own voter (no network, so no replay rule).
    pub fn receive_local(&mut self, mut report: Report, now: Instant) -> Result<bool, MemberError> {
        let slot = self.slot_of(&report)?;
        self.fill_bitmap(slot, &mut report)?;
        Ok(self.hold(slot, report, now))
    }

    /// Puts the bitmap a `same` report leaves out back from the one kept, or keeps the one it
    /// carries.
    fn fill_bitmap(&mut self, slot: usize, report: &mut Report) -> Result<(), MemberError> {
        let kept = &mut self.bitmaps[slot];
        if report.same {
            match kept {
                Some((boot, version, bits))
                    if *boot == report.boot && *version == report.version =>
                {
                    report.bitmap = bits.clone();
                    Ok(())
                }
                _ => Err(MemberError::MissingBitmap(report.version)),
            }
        } else {
            *kept = Some((report.boot, report.version, report.bitmap.clone()));
            Ok(())
        }
    }

    fn slot_of(&self, report: &Report) -> Result<usize, MemberError> {
        if report.set != self.roster.id() {
            return Err(MemberError::OtherSet);
        }
        if report.to.index != self.me || !self.roster.knows(&report.to) {
            return Err(MemberError::NotOurs);
        }
        if !self.roster.knows(&report.voter) {
            return Err(MemberError::NotOurs);
        }
        let config = self
            .configs
            .iter()
            .find(|c| c.generation == report.generation)
            .ok_or(MemberError::OtherGeneration(report.generation))?;
        if config.sets().all(|set| !set.contains(&report.voter.index)) {
            return Err(MemberError::NotOurs);
        }
        self.voters
            .binary_search(&report.voter.index)
            .map_err(|_| MemberError::NotOurs)
    }

    fn hold(&mut self, slot: usize, report: Report, now: Instant) -> bool {
        let changed = self.held[slot].as_ref().is_none_or(|h| {
            now.saturating_duration_since(h.at) >= self.timers.timeout
                || h.report.generation != report.generation
                || h.report.bitmap != report.bitmap
                || (h.report.ack.boot == self.boot) != (report.ack.boot == self.boot)
                || h.report.told != report.told
                || h.report.mature != report.mature
        });
        let generation = report.generation;
        let new = Held { report, at: now };
        match self.held[slot].as_ref().map(|h| h.report.generation) {
            Some(g) if generation < g => self.older[slot] = Some(new),
            Some(g) if generation > g => self.older[slot] = self.held[slot].replace(new),
            _ => self.held[slot] = Some(new),
        }
        changed
    }

    /// The tenure at `now` on the configuration adopted last ([`Member::check`] uses the one it
    /// acts on).
    pub fn tenure(&self, now: Instant) -> Tenure {
        self.view().tenure(self.config(), now)
    }

    fn view(&self) -> View<'_> {
        View {
            voters: &self.voters,
            held: &self.held,
            older: &self.older,
            sent: &self.sent,
            boot: self.boot,
            me: self.me,
            timeout: self.timers.timeout,
        }
    }

    /// One check at `now`: `usable` whether the node has an interface that can announce.
    pub fn check(&mut self, now: Instant, usable: bool) -> Check {
        self.gate.settle(usable, now);
        let view = View {
            voters: &self.voters,
            held: &self.held,
            older: &self.older,
            sent: &self.sent,
            boot: self.boot,
            me: self.me,
            timeout: self.timers.timeout,
        };
        // Rule 6: of the configurations with a quorum, the newest with a tenure, else the
        // newest; with none, the one adopted last.
        let adopted = &self.configs[self.configs.len() - 1];
        let with_quorum = self
            .configs
            .iter()
            .filter(|c| view.quorum(c, now))
            .map(|c| (c, view.tenure(c, now)))
            .max_by_key(|(c, t)| (*t != Tenure::Lapsed, c.generation));
        let config = with_quorum.map_or(adopted, |(c, _)| c);
        let quorum = !self.rules.quorum || with_quorum.is_some();
        let tenure = if !self.rules.tenure {
            Tenure::Unbounded
        } else {
            with_quorum.map_or_else(|| view.tenure(config, now), |(_, t)| t)
        };
        let told_rule = self.rules.told;
        let d = self.gate.decide(
            quorum,
            tenure,
            self.last_unready_seq,
            |after| !told_rule || view.told(config, after, now),
            now,
        );
        self.acted_on = with_quorum.map(|(c, _)| c.generation);
        self.ready = d.acts;
        self.confirmed = Some(now);
        let mut candidates = view.candidates(config, self.roster.len(), now);
        let (byte, bit) = (usize::from(self.me) / 8, 0x80u8 >> (self.me % 8));
        if let Some(c) = candidates.get_mut(byte) {
            if d.claims {
                *c |= bit;
            } else {
                *c &= !bit;
            }
        }
        Check {
            acts: d.acts,
            claims: d.claims,
            candidates,
            answer_until: if d.claims { d.answer_until } else { None },
        }
    }

    /// When a check must run even without a report or a beat: a wait ending, or a held report
    /// going stale.
    pub fn next_wake(&self, now: Instant) -> Option<Instant> {
        let timeout = self.timers.timeout;
        let stale = self
            .held
            .iter()
            .chain(&self.older)
            .flatten()
            .map(|h| h.at + timeout)
            .filter(|at| *at > now)
            .min();
        [self.gate.wake_at(now), stale].into_iter().flatten().min()
    }

    /// The process stops gracefully (`replaced`: a successor follows on this node): it stops
    /// claiming at once, and its next beats say leaving.
    pub fn leave(&mut self, replaced: bool) {
        self.leaving = true;
        self.restarting = replaced;
        self.gate.stop();
        self.ready = false;
    }

    /// The failure timeout and friends.
    pub fn timers(&self) -> Timers {
        self.timers
    }

    /// How long the claim delay is.
    pub fn claim_delay(&self) -> Duration {
        self.timers.interval * crate::gate::CLAIM_AFTER_BEATS
    }
}

/// What a check reads: the held reports, by configuration.
struct View<'a> {
    voters: &'a [u16],
    held: &'a [Option<Held>],
    older: &'a [Option<Held>],
    sent: &'a SentLog,
    boot: u64,
    me: u16,
    timeout: Duration,
}

impl View<'_> {
    /// Voter `v`'s report, if it is fresh at `now` and of `generation`.
    fn fresh(&self, v: u16, generation: u64, now: Instant) -> Option<&Report> {
        let slot = self.voters.binary_search(&v).ok()?;
        [self.held.get(slot)?, self.older.get(slot)?]
            .into_iter()
            .flatten()
            .find(|h| {
                h.report.generation == generation
                    && now.saturating_duration_since(h.at) < self.timeout
            })
            .map(|h| &h.report)
    }

    /// Whether `report` acknowledges a beat of this process.
    fn hears_me(&self, report: &Report) -> bool {
        report.ack.boot == self.boot && report.ack.seq > 0
    }

    /// Whether, in every set of `config`, the voters whose fresh report passes `counts` are a
    /// majority.
    fn every_set(
        &self,
        config: &VoterConfig,
        now: Instant,
        counts: impl Fn(&Report) -> bool,
    ) -> bool {
        config.sets().all(|set| {
            let mut count = 0;
            let mut lowest = false;
            for (i, &v) in set.iter().enumerate() {
                if self.fresh(v, config.generation, now).is_some_and(&counts) {
                    count += 1;
                    lowest |= i == 0;
                }
            }
            majority(count, lowest, set.len())
        })
    }

    /// Rule 1 on `config`.
    fn quorum(&self, config: &VoterConfig, now: Instant) -> bool {
        self.every_set(config, now, |r| self.hears_me(r))
    }

    /// Rule 5 on `config`: told, in reports acknowledging a beat sent after `after`.
    fn told(&self, config: &VoterConfig, after: u64, now: Instant) -> bool {
        self.every_set(config, now, |r| {
            r.told && r.ack.boot == self.boot && r.ack.seq > after
        })
    }

    /// Rule 3 on `config`: the union of its fresh reports' bitmaps.
    fn candidates(&self, config: &VoterConfig, nodes: usize, now: Instant) -> Vec<u8> {
        let mut candidates = bitmap(u16::try_from(nodes).unwrap_or(u16::MAX), []);
        for v in config.voters() {
            if let Some(r) = self.fresh(v, config.generation, now) {
                for (c, b) in candidates.iter_mut().zip(&r.bitmap) {
                    *c |= b;
                }
            }
        }
        candidates
    }

    /// Rule 4 on `config`: the earliest of its sets' tenures (a takeover needs a majority of
    /// one set at most: of `current` by a member on the generation before, of `next` by one on
    /// the generation after).
    fn tenure(&self, config: &VoterConfig, now: Instant) -> Tenure {
        config
            .sets()
            .map(|set| self.tenure_of(set, config.generation, now))
            .fold(Tenure::Unbounded, |a, b| match (a, b) {
                (Tenure::Lapsed, _) | (_, Tenure::Lapsed) => Tenure::Lapsed,
                (Tenure::Unbounded, t) | (t, Tenure::Unbounded) => t,
                (Tenure::Until(x), Tenure::Until(y)) => Tenure::Until(x.min(y)),
            })
    }

    /// The tenure from the mature acknowledgements of the voters of `set` other than this node.
    fn tenure_of(&self, set: &[u16], generation: u64, now: Instant) -> Tenure {
        let v = set.len();
        let mine = set.iter().position(|&x| x == self.me);
        let needed = smallest_takeover(v, mine);
        let others = v - usize::from(mine.is_some());
        if v == 0 {
            return Tenure::Lapsed;
        }
        if needed > others {
            return Tenure::Unbounded;
        }
        let mut bounds: Vec<Option<Instant>> = set
            .iter()
            .filter(|&&x| x != self.me)
            .map(|&x| {
                let r = self.fresh(x, generation, now)?;
                if !r.mature || !self.hears_me(r) {
                    return None;
                }
                Some(self.sent.sent_at(r.ack.seq)? + self.timeout)
            })
            .collect();
        bounds.sort();
        match bounds.get(needed - 1).copied().flatten() {
            Some(at) => Tenure::Until(at),
            None => Tenure::Lapsed,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::voters::Voter;
    use crate::wire::heard;

    const MS: Duration = Duration::from_millis(1);
    const UNIX: u64 = 1_800_000_000_000;

    fn config(voters: &[u16]) -> VoterConfig {
        VoterConfig::new(1, voters.iter().copied(), []).unwrap()
    }

    /// Three nodes, each a voter: beats go round every 100 ms without loss. Node 0 claims
    /// after listening, settling, maturity and told; every node ends claiming.
    #[test]
    fn three_voting_members_come_up_and_claim() {
        let roster = Arc::new(Roster::new(["a", "b", "c"]).unwrap());
        let t0 = Instant::now();
        let timers = Timers::default();
        let mut voters: Vec<Voter> = (0..3)
            .map(|i| Voter::new(roster.clone(), i, 100 + u64::from(i), 1, timers, t0))
            .collect();
        let mut members: Vec<Member> = (0..3)
            .map(|i| {
                Member::new(
                    roster.clone(),
                    i,
                    10 + u64::from(i),
                    config(&[0, 1, 2]),
                    timers,
                )
            })
            .collect();
        let eth0 = ["eth0".to_string()];
        let mut claimed_at = None;
        for k in 0..40u32 {
            let now = t0 + 100 * MS * k;
            for (m, member) in members.iter_mut().enumerate() {
                let beat = member.beat(now, UNIX, &eth0);
                for (v, voter) in voters.iter_mut().enumerate() {
                    voter.sweep(now);
                    if let Some(r) = voter.receive(&beat, now, UNIX).unwrap() {
                        if v == m {
                            member.receive_local(r, now).unwrap();
                        } else {
                            member.receive(r, now, UNIX).unwrap();
                        }
                    }
                }
            }
            for m in &mut members {
                let c = m.check(now, true);
                if c.claims && claimed_at.is_none() {
                    claimed_at = Some(k);
                }
            }
        }
        assert!(members.iter().all(Member::claims));
        let c = members[0].check(t0 + 4_000 * MS, true);
        assert!((0..3).all(|i| heard(&c.candidates, i)));
        assert!(c.answer_until.is_some());
        // The voters listen and the members settle for 500 ms at once, then the claim delay
        // (300 ms) covers the voters' maturity (750 ms) and told.
        let k = claimed_at.unwrap();
        assert!((8..=12).contains(&k), "claimed at {k} intervals");
    }

    #[test]
    fn reports_for_others_or_over_other_sets_are_refused() {
        let roster = Arc::new(Roster::new(["a", "b", "c"]).unwrap());
        let t0 = Instant::now();
        let timers = Timers::default();
        let mut voter = Voter::new(roster.clone(), 1, 5, 1, timers, t0);
        let mut a = Member::new(roster.clone(), 0, 10, config(&[1]), timers);
        let mut c = Member::new(roster.clone(), 2, 12, config(&[1]), timers);
        let later = t0 + 600 * MS;
        let beat = a.beat(later, UNIX, &[]);
        voter.receive(&beat, t0, UNIX).unwrap();
        let r = voter
            .receive(
                &{
                    let mut b = beat.clone();
                    b.seq += 1;
                    b
                },
                later,
                UNIX,
            )
            .unwrap()
            .unwrap();
        assert_eq!(c.receive(r.clone(), later, UNIX), Err(MemberError::NotOurs));
        let mut other = r.clone();
        other.set.len += 1;
        assert_eq!(a.receive(other, later, UNIX), Err(MemberError::OtherSet));
        assert_eq!(a.receive(r.clone(), later, UNIX), Ok(true));
        assert!(matches!(
            a.receive(r, later, UNIX),
            Err(MemberError::Replay(_))
        ));
    }
}
