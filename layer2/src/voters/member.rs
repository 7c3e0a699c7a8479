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
use crate::wire::{Ack, Beat, NAME_CHECK_LEN, NodeRef, Report, Seen, bitmap, heard, name_check};

use super::{Roster, Timers, VoterConfig, majority, smallest_takeover};

/// Why a report was not taken in.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MemberError {
    /// Not from one of our voters, or for another node.
    #[error("report not from a voter of ours to us")]
    NotOurs,
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
    /// Keep a node that leaves the presence set while a report may still list it
    /// ([`Member::set_roster`]).
    pub keep_going: bool,
}

impl Default for Rules {
    fn default() -> Self {
        Rules {
            quorum: true,
            tenure: true,
            told: true,
            keep_going: true,
        }
    }
}

/// The last bitmap a voter sent: its process, version and presence set.
#[derive(Clone, Debug)]
struct Kept {
    boot: u64,
    version: u64,
    set: crate::wire::SetId,
    bits: Vec<u8>,
}

/// A voter's latest report, as held.
#[derive(Clone, Debug)]
struct Held {
    report: Report,
    at: Instant,
    /// Over another presence set than this member's (one of the two has not seen a Node come
    /// or go yet): its bitmap cannot be read here, so it is taken to list every node (doubt
    /// goes the way of fewer takeovers); its acknowledgement still counts.
    foreign: bool,
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
    /// The shared gate's whole decision (settling, damping, starvation), for readiness and
    /// logs.
    pub decision: crate::gate::Decision,
}

/// One member process.
#[derive(Clone, Debug)]
pub struct Member {
    roster: Arc<Roster>,
    me: u16,
    seq: u64,
    timers: Timers,
    /// The configurations whose reports count, oldest first: the one adopted last and, when it
    /// is the generation just before, the one before it (rule 6).
    configs: Vec<VoterConfig>,
    /// What it holds from the voters of `configs`, and what it reads their reports against.
    reports: Reports,
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
        Member {
            reports: Reports::new(
                name,
                boot,
                timers.timeout,
                config.voters().map(str::to_string).collect(),
            ),
            configs: vec![config],
            roster,
            me,
            seq: 0,
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

    /// Every voter it beats to (names, ascending): those of the configurations whose reports
    /// count.
    pub fn voters(&self) -> &[String] {
        &self.reports.voters
    }

    /// The presence set it reads bitmaps over.
    pub fn roster(&self) -> &Arc<Roster> {
        &self.roster
    }

    /// The presence set changed (a Node came or went) to `wanted`: held bitmaps are read over
    /// the new set from now on, by name. A node that goes stays in this member's set while a
    /// fresh report lists it, or a fresh report over a set that is neither the old nor the
    /// new one might: dropping it would take its IPs while it may still answer for them. Call
    /// it again (each check) until it returns true: the set is then `wanted`. Returns false,
    /// and changes nothing, when this node is not in `wanted`.
    pub fn set_roster(&mut self, wanted: &Arc<Roster>, now: Instant) -> bool {
        if wanted.index(&self.reports.name).is_none() {
            return false;
        }
        if wanted.id() == self.roster.id() {
            return true;
        }
        let timeout = self.timers.timeout;
        let fresh: Vec<&Held> = self
            .reports
            .all()
            .filter(|h| now.saturating_duration_since(h.at) < timeout)
            .collect();
        let (current, old) = (self.roster.id(), &self.roster);
        let unknown = fresh
            .iter()
            .any(|h| h.report.set != current && h.report.set != wanted.id());
        let keep_going = self.rules.keep_going;
        let keeping = old.keeping(wanted, |name| {
            let listed = old.index(name).is_some_and(|i| {
                fresh
                    .iter()
                    .any(|h| !h.foreign && heard(&h.report.bitmap, usize::from(i)))
            });
            keep_going && (unknown || listed)
        });
        let done = keeping.is_none();
        let roster = keeping.map_or_else(|| wanted.clone(), Arc::new);
        self.rebase(roster);
        done
    }

    /// Reads every held bitmap over `roster` from now on.
    fn rebase(&mut self, roster: Arc<Roster>) {
        if roster.id() == self.roster.id() {
            return;
        }
        let Some(me) = roster.index(&self.reports.name) else {
            return;
        };
        let old = std::mem::replace(&mut self.roster, roster);
        self.me = me;
        let len = u16::try_from(self.roster.len()).unwrap_or(u16::MAX);
        let id = self.roster.id();
        for h in self.reports.all_mut() {
            if h.foreign {
                // Over the new set, and readable: it is this member's now.
                h.foreign = h.report.set != id || h.report.bitmap.is_empty();
                continue;
            }
            let bits = (0..old.len())
                .filter(|&i| heard(&h.report.bitmap, i))
                .filter_map(|i| old.name(u16::try_from(i).ok()?))
                .filter_map(|n| self.roster.index(n))
                .map(usize::from);
            h.report.bitmap = bitmap(len, bits);
            h.report.set = id;
        }
    }

    /// The configuration adopted last.
    pub fn config(&self) -> &VoterConfig {
        // `configs` is never empty: `new` puts one, `adopt` replaces with at least one.
        &self.configs[self.configs.len() - 1]
    }

    /// The latest report held from each voter, with when it arrived (what `explain` shows).
    pub fn held(&self) -> impl Iterator<Item = (&str, &Report, Instant)> {
        let r = &self.reports;
        r.voters
            .iter()
            .zip(&r.slots)
            .filter_map(|(v, s)| s.held.as_ref().map(|h| (v.as_str(), &h.report, h.at)))
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
        let before = at.checked_sub(1).map(|i| &self.configs[i]);
        let view = self.reports.view();
        config.sets().all(|set| {
            let mut count = 0;
            let mut lowest = false;
            for (i, v) in set.iter().enumerate() {
                let reports = view
                    .fresh(v, generation, now)
                    .is_some_and(|h| h.report.mature && view.hears_me(&h.report));
                if before.is_some_and(|c| c.has(v)) || reports {
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
        let mut voters: Vec<String> = self
            .configs
            .iter()
            .flat_map(VoterConfig::voters)
            .map(str::to_string)
            .collect();
        voters.sort_unstable();
        voters.dedup();
        self.reports.set_voters(voters);
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
        self.reports.sent.record(self.seq, now);
        let ready = self.ready
            && !self.leaving
            && self
                .confirmed
                .is_some_and(|c| now.saturating_duration_since(c) <= self.timers.mandate());
        if !ready {
            self.last_unready_seq = self.seq;
        }
        let acks = self
            .reports
            .voters
            .iter()
            .zip(&self.reports.slots)
            .filter_map(|(v, s)| {
                Some(Ack {
                    // A voter whose Node is gone is silent: nothing to acknowledge.
                    voter: NodeRef::new(self.roster.index(v)?, v),
                    seen: s.readable?,
                })
            })
            .collect();
        Beat {
            node: self.reports.name.clone(),
            boot: self.reports.sent.boot(),
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
        let history = &mut self.reports.slots[slot].history;
        match history.as_mut() {
            Some(h) => h.admit(stamp, now)?,
            None => *history = Some(History::first(stamp, now, unix_ms)),
        }
        let foreign = report.set != self.roster.id();
        self.reports.slots[slot].fill_bitmap(&mut report, foreign)?;
        Ok(self.reports.hold(slot, report, now, foreign))
    }

    /// Takes in the report of this node's own voter (no network, so no replay rule).
    pub fn receive_local(&mut self, mut report: Report, now: Instant) -> Result<bool, MemberError> {
        let slot = self.slot_of(&report)?;
        let foreign = report.set != self.roster.id();
        self.reports.slots[slot].fill_bitmap(&mut report, foreign)?;
        Ok(self.reports.hold(slot, report, now, foreign))
    }

    /// The voter slot of `report`, checking that it is for this node, from one of its voters,
    /// of a generation it counts. The indexes in the report may be over another presence set
    /// (a Node came or went and one side has not seen it yet): names decide.
    fn slot_of(&self, report: &Report) -> Result<usize, MemberError> {
        if !report.to.names(&self.reports.name) {
            return Err(MemberError::NotOurs);
        }
        let slot = self
            .reports
            .slots
            .iter()
            .position(|s| s.check == report.voter.check)
            .ok_or(MemberError::NotOurs)?;
        let config = self
            .configs
            .iter()
            .find(|c| c.generation == report.generation)
            .ok_or(MemberError::OtherGeneration(report.generation))?;
        if !config.has(&self.reports.voters[slot]) {
            return Err(MemberError::NotOurs);
        }
        Ok(slot)
    }

    /// The tenure at `now` on the configuration adopted last ([`Member::check`] uses the one it
    /// acts on).
    pub fn tenure(&self, now: Instant) -> Tenure {
        self.reports.view().tenure(self.config(), now)
    }

    /// One check at `now`: `usable` whether the node has an interface that can announce.
    pub fn check(&mut self, now: Instant, usable: bool) -> Check {
        self.gate.settle(usable, now);
        let view = self.reports.view();
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
            decision: d,
        }
    }

    /// When a check must run even without a report or a beat: a wait ending, or a held report
    /// going stale.
    pub fn next_wake(&self, now: Instant) -> Option<Instant> {
        let timeout = self.timers.timeout;
        let stale = self
            .reports
            .all()
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

/// The member's report state: what it holds from each voter, and what the reports are read
/// against (this node's name, the beats this process sent, the failure timeout). A check reads
/// it through [`Reports::view`].
#[derive(Clone, Debug)]
struct Reports {
    /// This node's name, as reports name their recipient.
    name: String,
    /// The beats this process sent (its boot, and when each went): what reports acknowledge.
    sent: SentLog,
    /// The failure timeout: a report held longer is stale.
    timeout: Duration,
    /// Every voter of the configurations whose reports count, by name, ascending: the slots
    /// below.
    voters: Vec<String>,
    /// Per voter (same order), what this member holds from it.
    slots: Vec<Slot>,
}

/// What a member holds from one voter.
#[derive(Clone, Debug)]
struct Slot {
    /// The voter's name check, as reports name it.
    check: [u8; NAME_CHECK_LEN],
    /// Its latest report.
    held: Option<Held>,
    /// Its latest report of a generation before the latest one's: it counts toward that
    /// generation's rules until it goes stale, while the voters move one by one.
    older: Option<Held>,
    /// Its replay history.
    history: Option<History>,
    /// The last bitmap it sent: its boot, version and bits.
    bitmap: Option<Kept>,
    /// Its latest report whose bitmap this member holds: what beats acknowledge, so that a
    /// voter leaves the bitmap out only for a member that has it.
    readable: Option<Seen>,
}

impl Slot {
    /// Nothing held yet from voter `name`.
    fn new(name: &str) -> Self {
        Slot {
            check: name_check(name),
            held: None,
            older: None,
            history: None,
            bitmap: None,
            readable: None,
        }
    }

    /// Puts the bitmap a `same` report leaves out back from the one kept, or keeps the one it
    /// carries (over whichever presence set: it may become this member's). A report over
    /// another set is taken without it (its bitmap is not read); one over this member's set
    /// without it is refused, and left unacknowledged so the voter sends the bitmap again.
    fn fill_bitmap(&mut self, report: &mut Report, foreign: bool) -> Result<(), MemberError> {
        let kept = &mut self.bitmap;
        let seen = Seen {
            boot: report.boot,
            seq: report.seq,
        };
        if !report.same {
            *kept = Some(Kept {
                boot: report.boot,
                version: report.version,
                set: report.set,
                bits: report.bitmap.clone(),
            });
            self.readable = Some(seen);
            return Ok(());
        }
        match kept {
            Some(k)
                if k.boot == report.boot && k.version == report.version && k.set == report.set =>
            {
                report.bitmap = k.bits.clone();
                self.readable = Some(seen);
                Ok(())
            }
            _ if foreign => Ok(()),
            _ => Err(MemberError::MissingBitmap(report.version)),
        }
    }
}

impl Reports {
    /// Nothing held yet from `voters` (ascending), for node `name`'s process `boot`.
    fn new(name: String, boot: u64, timeout: Duration, voters: Vec<String>) -> Self {
        Reports {
            name,
            sent: SentLog::new(boot),
            timeout,
            slots: voters.iter().map(|v| Slot::new(v)).collect(),
            voters,
        }
    }

    /// What a check reads.
    fn view(&self) -> View<'_> {
        View {
            voters: &self.voters,
            slots: &self.slots,
            sent: &self.sent,
            boot: self.sent.boot(),
            me: &self.name,
            timeout: self.timeout,
        }
    }

    /// Takes `voters` (ascending) as the voters: one that stays keeps what is held from it, the
    /// others' is dropped.
    fn set_voters(&mut self, voters: Vec<String>) {
        let mut slots: Vec<Slot> = voters.iter().map(|v| Slot::new(v)).collect();
        for (v, slot) in self.voters.iter().zip(self.slots.drain(..)) {
            if let Ok(new) = voters.binary_search(v) {
                slots[new] = slot;
            }
        }
        (self.voters, self.slots) = (voters, slots);
    }

    /// Every report held, the latest and the older ones, fresh or not.
    fn all(&self) -> impl Iterator<Item = &Held> {
        self.slots
            .iter()
            .flat_map(|s| s.held.iter().chain(&s.older))
    }

    /// Every report held, to change.
    fn all_mut(&mut self) -> impl Iterator<Item = &mut Held> {
        self.slots
            .iter_mut()
            .flat_map(|s| s.held.iter_mut().chain(s.older.iter_mut()))
    }

    /// Holds `report`, which arrived at `now`, from the voter at `slot`. Returns whether it
    /// changed what a check reads.
    fn hold(&mut self, slot: usize, report: Report, now: Instant, foreign: bool) -> bool {
        let boot = self.sent.boot();
        let s = &mut self.slots[slot];
        let changed = s.held.as_ref().is_none_or(|h| {
            now.saturating_duration_since(h.at) >= self.timeout
                || h.report.generation != report.generation
                || h.foreign != foreign
                || h.report.bitmap != report.bitmap
                || (h.report.ack.boot == boot) != (report.ack.boot == boot)
                || h.report.told != report.told
                || h.report.mature != report.mature
        });
        let generation = report.generation;
        let new = Held {
            report,
            at: now,
            foreign,
        };
        match s.held.as_ref().map(|h| h.report.generation) {
            Some(g) if generation < g => s.older = Some(new),
            Some(g) if generation > g => s.older = s.held.replace(new),
            _ => s.held = Some(new),
        }
        changed
    }
}

/// What a check reads: the held reports, by configuration.
struct View<'a> {
    voters: &'a [String],
    slots: &'a [Slot],
    sent: &'a SentLog,
    boot: u64,
    me: &'a str,
    timeout: Duration,
}

impl View<'_> {
    /// Voter `v`'s report, if it is fresh at `now` and of `generation`.
    fn fresh(&self, v: &str, generation: u64, now: Instant) -> Option<&Held> {
        let slot = self.voters.binary_search_by(|x| x.as_str().cmp(v)).ok()?;
        let slot = self.slots.get(slot)?;
        [&slot.held, &slot.older].into_iter().flatten().find(|h| {
            h.report.generation == generation && now.saturating_duration_since(h.at) < self.timeout
        })
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
            for (i, v) in set.iter().enumerate() {
                if self
                    .fresh(v, config.generation, now)
                    .is_some_and(|h| counts(&h.report))
                {
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
        let len = u16::try_from(nodes).unwrap_or(u16::MAX);
        let mut candidates = bitmap(len, []);
        for v in config.voters() {
            if let Some(h) = self.fresh(v, config.generation, now) {
                if h.foreign {
                    return bitmap(len, 0..nodes);
                }
                for (c, b) in candidates.iter_mut().zip(&h.report.bitmap) {
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
    fn tenure_of(&self, set: &[String], generation: u64, now: Instant) -> Tenure {
        let v = set.len();
        let mine = set.iter().position(|x| x == self.me);
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
            .filter(|x| *x != self.me)
            .map(|x| {
                let r = &self.fresh(x, generation, now)?.report;
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
        let names = ["a", "b", "c"];
        VoterConfig::new(1, voters.iter().map(|&v| names[usize::from(v)]), []).unwrap()
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
    fn reports_for_others_are_refused_and_other_sets_read_with_doubt() {
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
        // Over another presence set (the voter saw a Node come first): taken, its bitmap read
        // as listing every node.
        let mut other = r.clone();
        other.set.len += 1;
        other.seq += 1;
        assert_eq!(a.receive(other, later, UNIX), Ok(true));
        let check = a.check(later, true);
        // Every node but this one, which is among its own candidates only while it claims.
        assert!(
            (1..3).all(|i| heard(&check.candidates, i)),
            "doubt lists all"
        );
        assert!(matches!(
            a.receive(r, later, UNIX),
            Err(MemberError::Replay(_))
        ));
    }

    /// A Node comes: held bitmaps are carried over to the new set by name.
    #[test]
    fn a_new_presence_set_keeps_what_the_reports_said() {
        let roster = Arc::new(Roster::new(["a", "b", "c"]).unwrap());
        let t0 = Instant::now();
        let timers = Timers::default();
        let mut voter = Voter::new(roster.clone(), 1, 5, 1, timers, t0);
        let mut a = Member::new(roster.clone(), 0, 10, config(&[1]), timers);
        let mut last = None;
        for k in 0..10u32 {
            let now = t0 + 100 * MS * k;
            let mut beat = a.beat(now, UNIX, &[]);
            beat.ready = true;
            if let Some(r) = voter.receive(&beat, now, UNIX).unwrap() {
                a.receive(r.clone(), now, UNIX).unwrap();
                last = Some(r);
            }
        }
        let last = last.unwrap();
        let (_, held, _) = a.held().next().unwrap();
        assert!(heard(&held.bitmap, 0) && !heard(&held.bitmap, 2));
        let bigger = Arc::new(Roster::new(["a", "aa", "b", "c"]).unwrap());
        let t1 = t0 + 1_000 * MS;
        assert!(a.set_roster(&bigger, t1));
        assert_eq!(a.me(), 0);
        let (_, held, _) = a.held().next().unwrap();
        assert_eq!(held.set, bigger.id());
        assert!(heard(&held.bitmap, 0) && !heard(&held.bitmap, 1) && !heard(&held.bitmap, 3));
        assert!(!a.set_roster(&Arc::new(Roster::new(["b", "c"]).unwrap()), t1));
        // The voter carries its table over too, with a new bitmap version.
        let version = last.version;
        assert!(voter.set_roster(&bigger, t1));
        let now = t0 + 1_000 * MS;
        let mut beat = a.beat(now, UNIX, &[]);
        beat.ready = true;
        let r = voter.receive(&beat, now, UNIX).unwrap().unwrap();
        assert!(r.version > version && !r.same && heard(&r.bitmap, 0));
        assert_eq!(r.to, NodeRef::new(0, "a"));
        assert_eq!(r.voter, NodeRef::new(2, "b"));
        // A Node goes whose node a fresh report lists: it stays until no fresh report does
        // (the voter unlists it a failure timeout after its last beat).
        let mut c = Member::new(bigger.clone(), 3, 12, config(&[1]), timers);
        let mut beat = c.beat(now, UNIX, &[]);
        beat.ready = true;
        voter.receive(&beat, now, UNIX).unwrap();
        let mut beat = a.beat(now + 10 * MS, UNIX, &[]);
        beat.ready = true;
        let r = voter.receive(&beat, now + 10 * MS, UNIX).unwrap().unwrap();
        a.receive(r, now + 10 * MS, UNIX).unwrap();
        let without_c = Arc::new(Roster::new(["a", "aa", "b"]).unwrap());
        let c_in = |m: &Member| m.roster().index("c").is_some();
        assert!(!a.set_roster(&without_c, now + 20 * MS));
        assert!(c_in(&a), "c is listed: it stays");
        assert!(a.set_roster(&without_c, now + 600 * MS), "stale: c goes");
        assert!(!c_in(&a));
        assert!(
            !voter.set_roster(&without_c, now + 20 * MS),
            "the voter heard c just now"
        );
        assert!(voter.set_roster(&without_c, now + 600 * MS));
    }
}
