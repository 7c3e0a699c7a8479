//! The voters' membership ([`crate::voters`], issue #34) as a [`Design`]: every node beats to a
//! few voters every interval; each voter answers with a report; each node decides on a majority
//! of the voters' reports ([`Member::check`]).
//!
//! A [`VotersNode`] is one speaker process: a [`Member`] on every node, and a [`Voter`] on the
//! nodes chosen as voters ([`crate::voters::spread`] over the racks). It runs the same loop as
//! today's speaker ([`super::Legacy`]): a beat every interval (its own voter, if it is one, takes
//! it in without the network), a check every interval and soon after a report that changed
//! something, the voter's sweep every quarter interval. Every beat and report is encoded and
//! signed for real: the sizes counted are the wire format's ([`crate::wire`]).

use std::cell::{OnceCell, RefCell};
use std::collections::BTreeSet;
use std::sync::Arc;

use super::{Answer, Design, Dest, Env, MS, Micros, Mutation, Outbox, micros};
use crate::heartbeat::KeyRing;
use crate::voters::{Member, Roster, Rules, Seat, Timers, VoterConfig, spread};
use crate::wire::{Beat, Message, Report, heard};

/// Pause between the three beats a leaving speaker sends.
const LEAVE_GAP: Micros = 20 * MS;

/// The key the simulated speakers sign with.
const KEY: &[u8] = b"ferrolb-simulator-gossip-key-000";

/// What voters and members send each other.
#[derive(Clone, Debug)]
pub enum VoterMessage {
    /// Member → voter.
    Beat(Beat),
    /// Voter → member.
    Report(Report),
}

/// The voters' design.
#[derive(Clone, Debug)]
pub struct VotersDesign {
    /// How many voters (rounded down to an odd number above 2; at most the nodes).
    pub voters: usize,
    /// How long after its start a speaker's loop runs its first check (caches sync).
    pub caches_sync: Micros,
    /// How long after a report that changed something the loop runs its check.
    pub loop_latency: Micros,
    /// Between two sweeps of a voter's table.
    pub sweep_every: Micros,
    /// The roster, the voters and the signing ring, built at the first start.
    shared: OnceCell<Shared>,
}

#[derive(Clone, Debug)]
struct Shared {
    roster: Arc<Roster>,
    /// The configurations the controller published, oldest first (never empty).
    configs: RefCell<Vec<VoterConfig>>,
    keys: KeyRing,
}

impl Shared {
    fn latest(&self) -> VoterConfig {
        self.configs
            .borrow()
            .last()
            .cloned()
            .unwrap_or_else(unreachable_config)
    }

    fn publish(&self, config: VoterConfig) {
        self.configs.borrow_mut().push(config);
    }
}

impl Default for VotersDesign {
    fn default() -> Self {
        VotersDesign {
            voters: 5,
            caches_sync: 50 * MS,
            loop_latency: MS,
            sweep_every: 25 * MS,
            shared: OnceCell::new(),
        }
    }
}

impl VotersDesign {
    /// `count` voters and the defaults otherwise.
    pub fn with_voters(count: usize) -> Self {
        VotersDesign {
            voters: count,
            ..Self::default()
        }
    }

    fn shared(&self, env: &Env) -> &Shared {
        self.shared.get_or_init(|| build_shared(env, self.voters))
    }

    /// The voters of the latest configuration (node indexes; during a change, of both sets).
    pub fn voter_nodes(&self, env: &Env) -> Vec<usize> {
        self.shared(env)
            .latest()
            .voters()
            .filter_map(|v| env.index.get(v).copied())
            .collect()
    }

    /// Every configuration published so far, oldest first.
    pub fn configs(&self, env: &Env) -> Vec<VoterConfig> {
        self.shared(env).configs.borrow().clone()
    }

    fn timers(env: &Env) -> Timers {
        Timers {
            interval: env.timing.interval,
            timeout: env.timing.timeout,
            restart_hold: env.timing.restart_hold,
            flap_damping: env.timing.flap_damping,
            ..Timers::default()
        }
    }
}

fn build_shared(env: &Env, count: usize) -> Shared {
    // The simulator's names are valid and fewer than 65,536: this cannot fail.
    let roster =
        Roster::new(env.names.iter().map(String::as_str)).unwrap_or_else(|_| unreachable_roster());
    let domains: Vec<(String, String)> = env
        .names
        .iter()
        .zip(&env.racks)
        .map(|(n, r)| (n.clone(), format!("rack{r:03}")))
        .collect();
    let voters = spread(&domains, count);
    let config = VoterConfig::new(1, voters, []).unwrap_or_else(|_| unreachable_config());
    let keys = KeyRing::new([KEY.to_vec()]).unwrap_or_else(|_| unreachable_ring());
    Shared {
        roster: Arc::new(roster),
        configs: RefCell::new(vec![config]),
        keys,
    }
}

#[allow(clippy::panic)]
fn unreachable_config() -> VoterConfig {
    panic!("the simulator's voter configurations are valid")
}

#[allow(clippy::panic)]
fn unreachable_roster() -> Roster {
    panic!("the simulator's node names form a valid presence set")
}

#[allow(clippy::panic)]
fn unreachable_ring() -> KeyRing {
    panic!("the simulator's key is valid")
}

/// One speaker process of the voters' design.
#[derive(Debug)]
pub struct VotersNode {
    me: usize,
    boot: u64,
    member: Member,
    voter: Option<Seat>,
    keys: KeyRing,
    interfaces: Vec<String>,
    next_beat: Micros,
    next_sweep: Micros,
    loop_wake: Micros,
    claims: bool,
    candidates: Vec<u8>,
    plan: Vec<u32>,
    until: Micros,
    left: bool,
    immature_acks: bool,
    roster: Arc<Roster>,
    /// A presence set seen and not fully taken on yet.
    wanted: Option<Arc<Roster>>,
    /// Checks run, and reports that changed what a check reads.
    checks: u64,
    changes: u64,
}

impl VotersNode {
    /// Whether it claims IPs now.
    pub fn claims(&self) -> bool {
        self.claims
    }

    /// Whether this node runs a voter.
    pub fn is_voter(&self) -> bool {
        self.voter.is_some()
    }

    /// The voter configuration its member adopted last.
    pub fn generation(&self) -> u64 {
        self.member.config().generation
    }

    /// Its voter seat, if it is a voter.
    pub fn seat(&self) -> Option<&Seat> {
        self.voter.as_ref()
    }

    /// Its member.
    pub fn member(&self) -> &Member {
        &self.member
    }

    /// The generation its member acted on at its last check, if it had a quorum.
    pub fn acted_on(&self) -> Option<u64> {
        self.member.acted_on()
    }

    /// The generation its voter process serves, if it is a voter.
    pub fn serves(&self) -> Option<u64> {
        self.voter.as_ref().map(|s| s.serving().generation())
    }

    /// Checks its loop ran, and how many reports changed what a check reads.
    pub fn checks(&self) -> (u64, u64) {
        (self.checks, self.changes)
    }

    fn sign(&self, msg: Message) -> usize {
        // Signed for real: the bytes counted are the wire format's. The simulator's messages
        // are all valid.
        msg.encode(&self.keys).map_or(usize::MAX, |b| b.len())
    }

    fn beat(&mut self, env: &Env, now: Micros, after: Micros, out: &mut Outbox<VoterMessage>) {
        let at = env.instant(now);
        let beat = self.member.beat(at, env.unix_ms(now), &self.interfaces);
        let bytes = self.sign(Message::Beat(beat.clone()));
        for v in self.member.voters() {
            let Some(&v) = env.index.get(v) else {
                continue;
            };
            if v == self.me {
                continue;
            }
            out.send(Dest::One(v), VoterMessage::Beat(beat.clone()), bytes, after);
        }
        if after == 0 {
            self.own_voter_takes(env, &beat, now);
        }
    }

    /// This node's own voter takes its beat in directly.
    fn own_voter_takes(&mut self, env: &Env, beat: &Beat, now: Micros) {
        let at = env.instant(now);
        let Some(voter) = self.voter.as_mut() else {
            return;
        };
        if let Ok(Some(mut report)) = voter.receive(beat, at, env.unix_ms(now)) {
            if self.immature_acks {
                report.mature = true;
            }
            if let Ok(true) = self.member.receive_local(report, at) {
                self.changes += 1;
            }
        }
    }

    /// A voter process's boot for `generation`: random per process in effect.
    fn voter_boot(&self, generation: u64) -> u64 {
        self.boot ^ 0x5eed ^ generation.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }

    /// Reads `config`: the member adopts it, and the seat follows it (starts, moves or ends).
    fn follow(&mut self, env: &Env, config: VoterConfig, now: Micros) {
        let at = env.instant(now);
        let me = self.member.me();
        let generation = config.generation;
        let voter = config.has(&env.names[self.me]);
        if !self.member.adopt(config) {
            return;
        }
        let boot = self.voter_boot(generation);
        match (voter, self.voter.as_mut()) {
            (true, Some(seat)) => seat.move_to(generation, at),
            (true, None) => {
                let roster = self.member_roster();
                let timers = self.member.timers();
                self.voter = Some(Seat::new(roster, me, boot, generation, timers, at));
            }
            (false, Some(seat)) => seat.retire(at),
            (false, None) => {}
        }
        self.loop_wake = self.loop_wake.min(now + MS);
    }

    fn member_roster(&self) -> Arc<Roster> {
        self.roster.clone()
    }

    /// Moves the member and the voter toward the presence set last seen, as far as their rules
    /// let them (a node that goes stays while it may still answer).
    fn follow_roster(&mut self, env: &Env, now: Micros) {
        let Some(wanted) = self.wanted.clone() else {
            return;
        };
        let at = env.instant(now);
        if crate::voters::follow_roster(&mut self.member, self.voter.as_mut(), &wanted, at) {
            self.wanted = None;
        }
        if self.member.roster().id() != self.roster.id() {
            self.roster = self.member.roster().clone();
            // The candidates are read over the new set from the next check on.
            self.candidates.clear();
            self.loop_wake = self.loop_wake.min(now + MS);
        }
    }

    fn step(&mut self, env: &Env, now: Micros) {
        self.checks += 1;
        self.follow_roster(env, now);
        let at = env.instant(now);
        let check = self.member.check(at, true);
        if let Some(seat) = self.voter.as_mut()
            && let Some(g) = seat.pending()
            && self.member.ready_for(g, at)
        {
            seat.ready();
        }
        if check.candidates != self.candidates {
            self.candidates = check.candidates;
            self.replan(env);
        }
        self.claims = check.claims;
        if check.claims {
            self.until = check.answer_until.map_or(now, |u| env.micros(u));
        }
        let periodic = now + micros(env.timing.interval);
        let timer = self
            .member
            .next_wake(at)
            .map(|t| env.micros(t) + MS)
            .unwrap_or(Micros::MAX);
        self.loop_wake = periodic.min(timer);
    }

    /// Whether node `i` (an index of [`Env::names`]) is among the candidates, which are a
    /// bitmap over this process's presence set.
    fn candidate(&self, env: &Env, i: usize) -> bool {
        let full = self.roster.len() == env.names.len();
        let at = if full {
            u16::try_from(i).ok()
        } else {
            self.roster.index(&env.names[i])
        };
        at.is_some_and(|at| heard(&self.candidates, usize::from(at)))
    }

    fn replan(&mut self, env: &Env) {
        self.plan.clear();
        if !self.candidate(env, self.me) {
            return;
        }
        for ip in 0..env.ips.len() {
            if env.owner_among(ip, |i| self.candidate(env, i)) == Some(self.me) {
                self.plan.push(u32::try_from(ip).unwrap_or(u32::MAX));
            }
        }
    }
}

impl Design for VotersDesign {
    type Node = VotersNode;
    type Message = VoterMessage;

    fn name(&self) -> &'static str {
        "voters"
    }

    fn start(&self, env: &Env, me: usize, boot: u64, now: Micros) -> VotersNode {
        let shared = self.shared(env);
        let timers = Self::timers(env);
        let index = u16::try_from(me).unwrap_or(u16::MAX);
        let at = env.instant(now);
        // A process starts on the latest configuration (it reads it before it beats).
        let config = shared.latest();
        let generation = config.generation;
        let voter = config.has(&env.names[me]);
        let mut member = Member::new(shared.roster.clone(), index, boot, config, timers);
        member.rules = Rules {
            quorum: !env.mutation.ignore_quorum(),
            tenure: !env.mutation.no_tenure(),
            told: !env.mutation.no_tenure() && env.mutation != Mutation::NoTold,
            keep_going: env.mutation != Mutation::DropAtOnce,
        };
        let mut node = VotersNode {
            me,
            boot,
            member,
            voter: None,
            keys: shared.keys.clone(),
            interfaces: vec!["eth0".to_string()],
            next_beat: now,
            next_sweep: now,
            loop_wake: now + self.caches_sync,
            claims: false,
            candidates: Vec::new(),
            plan: Vec::new(),
            until: 0,
            left: false,
            immature_acks: env.mutation == Mutation::ImmatureAcks,
            roster: shared.roster.clone(),
            wanted: None,
            checks: 0,
            changes: 0,
        };
        if voter {
            let boot = node.voter_boot(generation);
            node.voter = Some(Seat::new(
                shared.roster.clone(),
                index,
                boot,
                generation,
                timers,
                at,
            ));
        }
        node
    }

    fn wake(&self, env: &Env, node: &mut VotersNode, now: Micros, out: &mut Outbox<VoterMessage>) {
        if node.left {
            return;
        }
        if now >= node.next_sweep {
            if let Some(v) = node.voter.as_mut() {
                v.sweep(env.instant(now));
                if v.retired(env.instant(now)) {
                    node.voter = None;
                }
            }
            node.next_sweep = (node.next_sweep + self.sweep_every).max(now + 1);
        }
        if now >= node.next_beat {
            node.beat(env, now, 0, out);
            let interval = micros(env.timing.interval);
            node.next_beat += interval;
            if node.next_beat <= now {
                // Missed ticks are delayed, not burst (a frozen process resumes).
                node.next_beat = now + interval;
            }
        }
        if now >= node.loop_wake {
            node.step(env, now);
        }
    }

    fn receive(
        &self,
        env: &Env,
        node: &mut VotersNode,
        msg: &VoterMessage,
        now: Micros,
        out: &mut Outbox<VoterMessage>,
    ) {
        if node.left {
            return;
        }
        let at = env.instant(now);
        match msg {
            VoterMessage::Beat(beat) => {
                let immature_acks = node.immature_acks;
                let Some(voter) = node.voter.as_mut() else {
                    return;
                };
                let Ok(Some(mut report)) = voter.receive(beat, at, env.unix_ms(now)) else {
                    return;
                };
                if immature_acks {
                    report.mature = true;
                }
                // To the beat's sender: the report's index of it is over the voter's presence
                // set, which may leave a node out that the simulator's numbering counts.
                let Some(&to) = env.index.get(&beat.node) else {
                    return;
                };
                let bytes = node.sign(Message::Report(report.clone()));
                out.send(Dest::One(to), VoterMessage::Report(report), bytes, 0);
            }
            VoterMessage::Report(report) => {
                if let Ok(true) = node.member.receive(report.clone(), at, env.unix_ms(now)) {
                    node.changes += 1;
                    node.loop_wake = node.loop_wake.min(now + self.loop_latency);
                }
            }
        }
    }

    fn leave(
        &self,
        env: &Env,
        node: &mut VotersNode,
        replaced: bool,
        now: Micros,
        out: &mut Outbox<VoterMessage>,
    ) {
        node.member.leave(replaced);
        node.claims = false;
        node.plan.clear();
        node.until = 0;
        node.voter = None;
        for k in 0..3 {
            node.beat(env, now, LEAVE_GAP * k, out);
        }
        node.left = true;
    }

    fn next_wake(&self, node: &VotersNode) -> Micros {
        if node.left {
            return Micros::MAX;
        }
        let sweep = if node.voter.is_some() {
            node.next_sweep
        } else {
            Micros::MAX
        };
        node.next_beat.min(node.loop_wake).min(sweep)
    }

    fn answer<'a>(&self, node: &'a VotersNode) -> Answer<'a> {
        Answer {
            ips: &node.plan,
            until: if node.claims { node.until } else { 0 },
        }
    }

    fn claims(&self, node: &VotersNode) -> bool {
        node.claims
    }

    fn startup(&self, env: &Env) -> Micros {
        // Settling (one timeout) and the claim delay; told needs the voters to list it ready
        // and every member to acknowledge that, or 1.5 timeouts; a voter process restarting
        // listens a timeout first.
        let t = env.timing;
        micros(t.timeout * 5 / 2 + t.interval * 3)
    }

    fn change_voters(&self, env: &Env, next: &[usize]) -> Option<u64> {
        let shared = self.shared(env);
        let next: Vec<&str> = next
            .iter()
            .filter_map(|&i| env.names.get(i).map(String::as_str))
            .collect();
        let latest = shared.latest();
        if env.mutation == Mutation::SkipJoint {
            let direct = VoterConfig::new(latest.generation + 1, next, [])
                .unwrap_or_else(|_| unreachable_config());
            shared.publish(direct);
            return None;
        }
        let joint = latest
            .change_to(next)
            .unwrap_or_else(|_| unreachable_config());
        let generation = joint.generation;
        shared.publish(joint);
        Some(generation)
    }

    fn moved_on(&self, env: &Env, node: &VotersNode, generation: u64, now: Micros) -> bool {
        node.left
            || node
                .voter
                .as_ref()
                .is_none_or(|seat| seat.moved_on(generation, env.instant(now)))
    }

    fn drain(&self, env: &Env) -> Micros {
        micros(Self::timers(env).drain())
    }

    fn finish_change(&self, env: &Env, generation: u64) {
        let shared = self.shared(env);
        let finish = shared
            .configs
            .borrow()
            .iter()
            .find(|c| c.generation == generation)
            .and_then(VoterConfig::finish);
        if let Some(finish) = finish {
            shared.publish(finish);
        }
    }

    fn set_roster(&self, env: &Env, node: &mut VotersNode, absent: &BTreeSet<usize>, now: Micros) {
        let names = env
            .names
            .iter()
            .enumerate()
            .filter(|(i, _)| !absent.contains(i))
            .map(|(_, n)| n.as_str());
        // The simulator's names are valid: this cannot fail.
        let roster = Arc::new(Roster::new(names).unwrap_or_else(|_| unreachable_roster()));
        node.wanted = Some(roster);
        node.follow_roster(env, now);
    }

    fn adopt(
        &self,
        env: &Env,
        node: &mut VotersNode,
        now: Micros,
        _out: &mut Outbox<VoterMessage>,
    ) {
        if node.left {
            return;
        }
        let latest = self.shared(env).latest();
        node.follow(env, latest, now);
        if let Some(seat) = node.voter.as_mut() {
            seat.confirm(env.instant(now));
        }
    }
}
