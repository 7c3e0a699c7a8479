//! Today's membership design as a [`Design`]: every speaker heartbeats every other every
//! interval, listing every peer it hears (decision record 0015).
//!
//! A [`LegacyNode`] is one speaker process wired the way `ferrolb-speaker` wires this crate's
//! rules (`speaker/src/l2/gossip.rs`, `l2/gate.rs`, `l2/work.rs`, `run/mod.rs`):
//! * **Heartbeats** go out on a timer every interval from the process start, once a failure
//!   timeout has passed (it listens first); also at once when the work loop's `acts` changes
//!   (`set_local`) and when the peers it hears, or their `ready`, changed since the last one
//!   (`tell_changes`, run when a received heartbeat changed the table or a silence is due).
//!   `ready` goes out only while the loop confirmed it within the mandate. Each heartbeat is
//!   encoded and signed for real ([`Heartbeat::encode`]): its length is what the metrics count.
//! * **A received heartbeat** goes through [`Membership::receive`]; when that says the members
//!   may have changed, the work loop runs a step at once.
//! * **The work loop** runs a check (the gate) every interval after its last run, at the next
//!   silence or gate timer (plus 1 ms), and at each change: [`quorum::decide`] over
//!   [`Membership::reports`], the tenure from [`Membership::acks`], starvation, flap damping, the
//!   claim delay and [`quorum::seen_ready_since`], exactly as `gate::Gate::check` combines them;
//!   then it plans with the members (owner choice) and renews the mandate to answer. A heartbeat
//!   that said `ready: false` since the last check is a resignation (the gate's rule 8): the
//!   node stops claiming and earns the claim again as at a rejoin.
//!
//! The gate's rules are the speaker's own ([`crate::gate`], which the speaker's `l2::gate` wraps
//! the same way); only the mutation knobs are the simulator's.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use super::{Answer, Design, Dest, Env, MS, Micros, Outbox, micros};
use crate::heartbeat::{Heard, Heartbeat};
use crate::liveness::{Member, Membership};
use crate::quorum::{self, Verdict};
use crate::tenure::{self, SentLog, Tenure};

/// Pause between the three heartbeats a leaving speaker sends (`Gossip::leave`).
const LEAVE_GAP: Micros = 20 * MS;

/// The key the simulated speakers sign with: signing costs what it costs in the speaker.
const KEY: &[u8] = b"ferrolb-simulator-gossip-key-000";

/// Today's design: every speaker heartbeats every other.
#[derive(Clone, Copy, Debug)]
pub struct Legacy {
    /// How long after its start a speaker's work loop runs its first check (the speaker's
    /// caches sync first: at least an API round trip). With none at all, the first check after
    /// settling can come before any peer has reported hearing it, which counts as a loss of
    /// quorum and holds it back for flap damping's first hold-down.
    pub caches_sync: Micros,
    /// How long after a change notification the work loop runs its step (the task wakes, and
    /// notifications meanwhile coalesce into that one step, as `tokio::sync::Notify` does):
    /// 0 runs a step for every heartbeat that changed the table.
    pub loop_latency: Micros,
    /// When the heartbeat timer and the work loop are due at once (after a freeze, say), run
    /// the loop first. The speaker runs them as two tasks in no set order; the default runs
    /// the heartbeat first.
    pub loop_first: bool,
}

impl Default for Legacy {
    fn default() -> Self {
        Legacy {
            caches_sync: 50 * MS,
            loop_latency: MS,
            loop_first: false,
        }
    }
}

/// What the speaker's gate decided in one check.
struct Outcome {
    acts: bool,
    claims: bool,
    members: BTreeMap<String, Member>,
    answer_until: Option<Instant>,
}

/// The speaker's `gate::Gate`: the shared rules ([`crate::gate`]) fed with the quorum rule's
/// verdict and `seen_ready`, with the mutation knobs.
#[derive(Clone, Debug)]
struct Gate {
    core: crate::gate::Gate,
}

impl Gate {
    fn new(env: &Env) -> Self {
        let t = env.timing;
        Gate {
            core: crate::gate::Gate::new(crate::gate::Timing {
                heartbeat_interval: t.interval,
                failure_timeout: t.timeout,
                mandate: t.mandate(),
                flap_damping: t.flap_damping,
            }),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn check(
        &mut self,
        env: &Env,
        me: &str,
        reports: &BTreeMap<String, quorum::Report>,
        acks: &BTreeMap<String, Heard>,
        tenure: Tenure,
        last_unready_seq: u64,
        usable: &BTreeSet<String>,
        now: Instant,
    ) -> Outcome {
        let settled = self.core.settle(!usable.is_empty(), now);
        let mut verdict = quorum::decide(me, &env.known, reports, settled, usable);
        if env.mutation.ignore_quorum() {
            force_acting(&mut verdict, me, settled, usable);
        }
        let no_tenure = env.mutation.no_tenure();
        let d = self.core.decide(
            verdict.acts(),
            if no_tenure { Tenure::Unbounded } else { tenure },
            last_unready_seq,
            |after| no_tenure || quorum::seen_ready_since(me, &verdict, acks, after),
            now,
        );
        // The speaker's `step::members`: this node among them only once it claims.
        let members = verdict
            .candidates
            .iter()
            .filter(|(name, _)| d.claims || name.as_str() != me)
            .map(|(name, interfaces)| {
                (
                    name.clone(),
                    Member {
                        interfaces: interfaces.clone().unwrap_or_default(),
                        interfaces_unknown: interfaces.is_none(),
                    },
                )
            })
            .collect();
        Outcome {
            acts: d.acts,
            claims: d.claims,
            members,
            answer_until: d.answer_until,
        }
    }

    fn wake_at(&self, now: Instant) -> Option<Instant> {
        self.core.wake_at(now)
    }
}

/// [`Mutation::IgnoreQuorum`](super::Mutation::IgnoreQuorum): the verdict says this node acts
/// whatever it hears.
fn force_acting(verdict: &mut Verdict, me: &str, settled: bool, usable: &BTreeSet<String>) {
    verdict.quorum = true;
    verdict.up = true;
    if settled {
        verdict
            .candidates
            .insert(me.to_string(), Some(usable.clone()));
    }
}

/// What a speaker says about itself (the speaker's `gossip::Local`).
#[derive(Clone, Debug, Default)]
struct Local {
    ready: bool,
    leaving: bool,
    restarting: bool,
    confirmed: Option<Micros>,
}

/// One speaker process of today's design.
#[derive(Debug)]
pub struct LegacyNode {
    me: usize,
    name: String,
    boot: u64,
    seq: u64,
    /// The latest heartbeat that said `ready: false` (`Gossip::last_unready_seq`).
    last_unready_seq: u64,
    speaks_from: Micros,
    table: Membership,
    sent: SentLog,
    local: Local,
    interfaces: BTreeSet<String>,
    /// Who the last heartbeat said this speaker hears (`Gossip::told`).
    told: BTreeMap<String, bool>,
    gate: Gate,
    next_beat: Micros,
    /// When the work loop wakes next without an event, and whether that wake is a silence or
    /// gate timer (which runs `tell_changes` first) rather than the periodic check.
    loop_wake: Micros,
    loop_wake_is_timer: bool,
    /// A change notification is pending: the next loop wake tells the changes first.
    notified: bool,
    claims: bool,
    members: BTreeMap<String, Member>,
    plan: Vec<u32>,
    until: Micros,
    left: bool,
    /// Checks run, and of those, run because a received heartbeat changed the table.
    checks: u64,
    changes: u64,
}

impl LegacyNode {
    /// Whether it acts now (says `ready`).
    pub fn acts(&self) -> bool {
        self.local.ready
    }

    /// Whether it claims IPs now.
    pub fn claims(&self) -> bool {
        self.claims
    }

    /// The IPs it owns in its plan (answering them while its mandate lasts).
    pub fn plan(&self) -> &[u32] {
        &self.plan
    }

    /// Checks its work loop ran, and how many of those a received heartbeat caused (it
    /// changed what planning reads).
    pub fn checks(&self) -> (u64, u64) {
        (self.checks, self.changes)
    }

    /// Peers in its table.
    pub fn known_peers(&self) -> usize {
        self.table.known()
    }

    fn heartbeat(&mut self, env: &Env, now: Micros) -> Option<Heartbeat> {
        if now < self.speaks_from {
            return None;
        }
        self.seq += 1;
        let at = env.instant(now);
        self.sent.record(self.seq, at);
        let local = &self.local;
        let ready = local.ready
            && !local.leaving
            && local
                .confirmed
                .is_some_and(|c| now.saturating_sub(c) <= micros(env.timing.mandate()));
        if !ready {
            self.last_unready_seq = self.seq;
        }
        Some(Heartbeat {
            node: self.name.clone(),
            boot: self.boot,
            seq: self.seq,
            unix_ms: env.unix_ms(now),
            ready,
            leaving: local.leaving,
            restarting: local.leaving && local.restarting,
            interfaces: self.interfaces.clone(),
            hears: self.table.hears(at),
        })
    }

    /// `Gossip::beat`: builds, signs and sends a heartbeat to every other node.
    fn beat(&mut self, env: &Env, now: Micros, after: Micros, out: &mut Outbox<Heartbeat>) {
        let Some(beat) = self.heartbeat(env, now) else {
            return;
        };
        self.told = summary(&beat.hears);
        // Signed for real: the length counted, and the work counted by the bench, are the
        // speaker's. An encoding error cannot happen with these names.
        let bytes = beat.encode(KEY).map(|b| b.len()).unwrap_or(usize::MAX);
        out.send(Dest::All, beat, bytes, after);
    }

    /// `Gossip::tell_changes`.
    fn tell_changes(&mut self, env: &Env, now: Micros, out: &mut Outbox<Heartbeat>) {
        let hears = summary(&self.table.hears(env.instant(now)));
        if hears != self.told {
            self.beat(env, now, 0, out);
        }
    }

    /// One turn of the work loop: `tell` when woken by a change or a silence timer.
    fn step(&mut self, env: &Env, now: Micros, tell: bool, out: &mut Outbox<Heartbeat>) {
        if tell {
            self.tell_changes(env, now, out);
        }
        self.checks += 1;
        let at = env.instant(now);
        let reports = self.table.reports(at);
        let acks = self.table.acks(self.boot);
        let tenure = tenure::tenure(
            &self.name,
            &env.known,
            &acks,
            &self.sent,
            env.timing.timeout,
        );
        let o = self.gate.check(
            env,
            &self.name,
            &reports,
            &acks,
            tenure,
            self.last_unready_seq,
            &self.interfaces,
            at,
        );
        // `Gossip::set_local`: a change of `ready` goes out at once.
        let changed = self.local.ready != o.acts;
        self.local.ready = o.acts;
        self.local.confirmed = Some(now);
        if changed {
            self.beat(env, now, 0, out);
        }
        // `still_valid` or a step: plan when the members changed, renew the mandate if claiming.
        if o.members != self.members {
            self.members = o.members;
            self.replan(env);
        }
        self.claims = o.claims;
        if o.claims {
            self.until = o.answer_until.map_or(now, |u| env.micros(u));
        }
        let timer = [self.table.next_silence(at), self.gate.wake_at(at)]
            .into_iter()
            .flatten()
            .min()
            .map(|t| env.micros(t) + MS);
        let check = now + micros(env.timing.interval);
        match timer {
            Some(t) if t < check => {
                self.loop_wake = t;
                self.loop_wake_is_timer = true;
            }
            _ => {
                self.loop_wake = check;
                self.loop_wake_is_timer = false;
            }
        }
    }

    /// The IPs this node owns among its members (the speaker's plan, every node able to
    /// announce every IP).
    fn replan(&mut self, env: &Env) {
        self.plan.clear();
        if !self.members.contains_key(&self.name) {
            return;
        }
        let members: Vec<usize> = self
            .members
            .keys()
            .filter_map(|n| env.index.get(n).copied())
            .collect();
        for ip in 0..env.ips.len() {
            if env.owner(ip, members.iter().copied()) == Some(self.me) {
                self.plan.push(u32::try_from(ip).unwrap_or(u32::MAX));
            }
        }
    }
}

fn summary(hears: &BTreeMap<String, Heard>) -> BTreeMap<String, bool> {
    hears.iter().map(|(n, h)| (n.clone(), h.ready)).collect()
}

impl Design for Legacy {
    type Node = LegacyNode;
    type Message = Heartbeat;

    fn name(&self) -> &'static str {
        "legacy"
    }

    fn start(&self, env: &Env, me: usize, boot: u64, now: Micros) -> LegacyNode {
        let name = env.names[me].clone();
        let mut table = Membership::new(name.clone(), env.timing.timeout);
        table.set_restart_hold(env.timing.restart_hold);
        table.set_nodes(env.known.clone());
        LegacyNode {
            me,
            name,
            boot,
            seq: 0,
            last_unready_seq: 0,
            speaks_from: now + micros(env.timing.timeout),
            table,
            sent: SentLog::new(boot),
            local: Local::default(),
            interfaces: ["eth0".to_string()].into(),
            told: BTreeMap::new(),
            gate: Gate::new(env),
            // The heartbeat timer's first tick is at once (and skipped: still listening).
            next_beat: now,
            loop_wake: now + self.caches_sync,
            loop_wake_is_timer: false,
            notified: false,
            claims: false,
            members: BTreeMap::new(),
            plan: Vec::new(),
            until: 0,
            left: false,
            checks: 0,
            changes: 0,
        }
    }

    fn wake(&self, env: &Env, node: &mut LegacyNode, now: Micros, out: &mut Outbox<Heartbeat>) {
        if node.left {
            return;
        }
        let loop_due = now >= node.loop_wake;
        let tell = node.loop_wake_is_timer || node.notified;
        if loop_due {
            node.notified = false;
        }
        if self.loop_first && loop_due {
            node.step(env, now, tell, out);
        }
        if now >= node.next_beat {
            node.beat(env, now, 0, out);
            // The timer's missed ticks are delayed, not burst (a frozen process resumes).
            let interval = micros(env.timing.interval);
            node.next_beat += interval;
            if node.next_beat <= now {
                node.next_beat = now + interval;
            }
        }
        if !self.loop_first && loop_due {
            node.step(env, now, tell, out);
        }
    }

    fn receive(
        &self,
        env: &Env,
        node: &mut LegacyNode,
        msg: &Heartbeat,
        now: Micros,
        out: &mut Outbox<Heartbeat>,
    ) {
        if node.left {
            return;
        }
        let changed = node
            .table
            .receive(msg.clone(), env.instant(now), env.unix_ms(now));
        if changed == Ok(true) {
            node.changes += 1;
            if self.loop_latency == 0 {
                node.step(env, now, true, out);
            } else if !node.notified {
                // One wake for every notification until the step runs.
                node.notified = true;
                node.loop_wake = node.loop_wake.min(now + self.loop_latency);
            }
        }
    }

    fn leave(
        &self,
        env: &Env,
        node: &mut LegacyNode,
        replaced: bool,
        now: Micros,
        out: &mut Outbox<Heartbeat>,
    ) {
        // The announcer stops first, then the others are told three times (UDP may drop one).
        node.claims = false;
        node.plan.clear();
        node.until = 0;
        node.local.leaving = true;
        node.local.restarting = replaced;
        for k in 0..3 {
            node.beat(env, now, LEAVE_GAP * k, out);
        }
        node.left = true;
    }

    fn next_wake(&self, node: &LegacyNode) -> Micros {
        if node.left {
            Micros::MAX
        } else {
            node.next_beat.min(node.loop_wake)
        }
    }

    fn answer<'a>(&self, node: &'a LegacyNode) -> Answer<'a> {
        Answer {
            ips: &node.plan,
            until: if node.claims { node.until } else { 0 },
        }
    }

    fn claims(&self, node: &LegacyNode) -> bool {
        node.claims
    }

    fn startup(&self, env: &Env) -> Micros {
        // Listening (one timeout), then the others acknowledge it only once heard for 1.5
        // timeouts, and the acknowledgements take a round of heartbeats to come back.
        let t = env.timing;
        micros(t.timeout * 5 / 2 + t.interval * 3)
    }
}
