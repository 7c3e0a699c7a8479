//! The controller's work loop as a pure state machine: which Service to decide when, which write
//! to start, when to write pool counters. No I/O, no clock: the driver in `run/` feeds it
//! [`Input`]s (watch events, finished writes, time as an `Instant`) and carries out the
//! [`Action`]s [`Schedule::step`] returns; decisions themselves come from [`Decide`] (the core).
//!
//! The rules, all of them here:
//!
//! * **Writes only while leading, per term.** [`Schedule::step`] takes the current leadership
//!   term; without one it starts no write and forgets the writes waiting for a slot (writes in
//!   flight finish: each checks the lease deadline itself just before writing and reports
//!   [`Written::NotLeading`] if it has lapsed). A term we have not built for means another
//!   replica may have written meanwhile: everything waiting is forgotten, the allocations are
//!   rebuilt from the caches and every Service is decided again.
//! * **One write in flight per Service.** A Service that changes while its write is in flight is
//!   not decided (the decision would be made on what the write is about to change); it is
//!   decided again once its write has finished.
//! * **At most [`MAX_IN_FLIGHT`] writes in flight.** Decisions wait in a queue, in the order they
//!   were first made. Deciding a queued Service again replaces its write in place (it keeps its
//!   turn and carries the newest decision); a decision that needs no write drops the queued one.
//! * **Freed IPs wake waiting Services.** When a decision frees IPs (a deleted Service that held
//!   some, or fewer IPs held after a pass), the Services still waiting for one are decided again,
//!   until a pass frees nothing.
//! * **A write that did not happen is retried, with backoff.** A failed write, or one that found
//!   leadership lapsed, is not done: the Service is decided again once its retry is due (and, like
//!   every Service, at the next term). Each failure in a row doubles the wait from [`RETRY_AFTER`]
//!   up to [`RETRY_MAX`], with jitter (half to all of it) so that Services that failed together,
//!   in an API-server outage, do not retry together; a write that is done resets it.
//! * **Pool counters** are written when the writes run out, and at least every
//!   [`POOL_STATUS_INTERVAL`] while they keep coming.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use ferrolb_config::allocator::ServiceKey;

/// Service writes in flight at once.
pub const MAX_IN_FLIGHT: usize = 48;

/// How often pool counters are written while Service writes keep coming (they are written at
/// once when the writes run out).
pub const POOL_STATUS_INTERVAL: Duration = Duration::from_secs(2);

/// The wait before the first retry of a write that did not happen (before jitter).
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The longest wait before a retry (before jitter).
pub const RETRY_MAX: Duration = Duration::from_secs(60);

/// The wait before retry number `attempt` (1 for the first) of `key`'s write: exponential from
/// [`RETRY_AFTER`] to [`RETRY_MAX`], scaled by a jitter in [0.5, 1) drawn from `seed`, the key
/// and the attempt (deterministic for tests, spread across Services and replicas).
pub fn backoff(attempt: u32, key: &ServiceKey, seed: u64) -> Duration {
    use std::hash::{Hash, Hasher};
    let exponent = attempt.saturating_sub(1).min(16);
    let full = RETRY_AFTER.saturating_mul(1 << exponent).min(RETRY_MAX);
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (seed, key, attempt).hash(&mut hasher);
    // 53 random bits as a fraction in [0, 1).
    let fraction = (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64;
    full.mul_f64(0.5 + fraction / 2.0)
}

/// What happened, as the state machine needs to know it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// A Service changed or was deleted, or its namespace's labels changed.
    ServiceChanged(ServiceKey),
    /// A configuration object or a Node changed: validate and apply the configuration again.
    ConfigChanged,
    /// The watch of this kind has listed (the loop acts once every watch has).
    Listed(&'static str),
    /// The write of this Service has finished, at this time.
    WriteFinished(ServiceKey, Written, Instant),
    /// [`Schedule::retry_wait`] has passed: it is now this time.
    RetryDue(Instant),
    /// Pool counters were written (or found unchanged) at this time.
    PoolStatusWritten(Instant),
}

/// What became of one Service's write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    /// Written (or nothing differed), Events queued.
    Done,
    /// Not written: this replica's leadership had lapsed.
    NotLeading,
    /// The API server refused or did not answer.
    Failed,
}

/// What to do about one Service, as the core decided it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision<W> {
    /// It was deleted and held IPs: waiting Services may fit now.
    Freed,
    /// Write what differs and record Events.
    Write(W),
    /// Nothing to do.
    Nothing,
}

/// The decisions the schedule asks for. Pure and synchronous: the core and the caches.
pub trait Decide {
    /// What a write carries.
    type Write;
    /// A new term: forget every allocation, apply the configuration, let every Service that
    /// holds IPs re-claim them. Returns every Service in the cache.
    fn rebuild(&mut self, term: u64) -> Vec<ServiceKey>;
    /// Validates and applies the configuration. Returns the Services to decide again (those
    /// that lost their IPs and those waiting for one).
    fn apply_config(&mut self) -> Vec<ServiceKey>;
    /// Decides one Service (allocating or releasing).
    fn decide(&mut self, key: &ServiceKey) -> Decision<Self::Write>;
    /// Services of ours still waiting for an IP.
    fn waiting(&self) -> Vec<ServiceKey>;
    /// How many Services hold IPs.
    fn held(&self) -> usize;
    /// Services whose decision changed because of the decisions just made (node addresses: a
    /// Service's ports can take an address from another); decided again in the same step.
    fn follow_ups(&mut self) -> Vec<ServiceKey> {
        Vec::new()
    }
}

/// What the driver must do, in this order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action<W> {
    /// A new term began: forget what was written in earlier terms.
    NewTerm(u64),
    /// The configuration was applied: report it (ConfigurationState, Events, BFD finalizers).
    ReportConfig,
    /// Start this Service's write; report it with [`Input::WriteFinished`].
    Write(ServiceKey, W),
    /// Write the pools' counters; report it with [`Input::PoolStatusWritten`].
    WritePoolStatus,
}

/// The work loop's state.
#[derive(Debug)]
pub struct Schedule<W> {
    /// Watches that must list before anything is decided.
    watches: usize,
    listed: BTreeSet<&'static str>,
    /// The term the allocations were built for.
    term: Option<u64>,
    config_changed: bool,
    /// Services to decide, in key order.
    dirty: BTreeSet<ServiceKey>,
    /// Services whose write did not happen, with when they are decided again.
    retry: BTreeMap<ServiceKey, Instant>,
    /// Failures in a row, by Service (reset by a write that is done).
    attempts: HashMap<ServiceKey, u32>,
    /// Seeds the retries' jitter.
    seed: u64,
    /// Keys in decision order; a key whose write left `queued` is skipped.
    order: VecDeque<ServiceKey>,
    queued: HashMap<ServiceKey, W>,
    in_flight: HashSet<ServiceKey>,
    /// Services that changed while their write was in flight.
    deferred: BTreeSet<ServiceKey>,
    pool_status_written: Instant,
}

impl<W> Schedule<W> {
    /// A schedule that acts once `watches` watches have listed; `now` starts the pool status
    /// interval.
    pub fn new(watches: usize, now: Instant) -> Self {
        Self {
            watches,
            listed: BTreeSet::new(),
            term: None,
            config_changed: true,
            dirty: BTreeSet::new(),
            retry: BTreeMap::new(),
            attempts: HashMap::new(),
            seed: 0,
            order: VecDeque::new(),
            queued: HashMap::new(),
            in_flight: HashSet::new(),
            deferred: BTreeSet::new(),
            pool_status_written: now,
        }
    }

    /// Takes one input in. Decisions wait for [`Self::step`].
    pub fn handle(&mut self, input: Input) {
        match input {
            Input::ServiceChanged(key) => {
                self.dirty.insert(key);
            }
            Input::ConfigChanged => self.config_changed = true,
            Input::Listed(kind) => {
                self.listed.insert(kind);
            }
            Input::WriteFinished(key, written, at) => {
                self.in_flight.remove(&key);
                if self.deferred.remove(&key) {
                    self.dirty.insert(key.clone());
                }
                let attempt = match written {
                    Written::Done => {
                        self.attempts.remove(&key);
                        return;
                    }
                    // Not a failure of the write: the next term decides it anyway.
                    Written::NotLeading => 1,
                    Written::Failed => {
                        let n = self.attempts.entry(key.clone()).or_insert(0);
                        *n = n.saturating_add(1);
                        *n
                    }
                };
                let due = at + backoff(attempt, &key, self.seed);
                self.retry.insert(key, due);
            }
            Input::RetryDue(now) => {
                let due: Vec<ServiceKey> = self
                    .retry
                    .iter()
                    .filter(|(_, at)| **at <= now)
                    .map(|(k, _)| k.clone())
                    .collect();
                for key in due {
                    self.retry.remove(&key);
                    self.dirty.insert(key);
                }
            }
            Input::PoolStatusWritten(at) => self.pool_status_written = at,
        }
    }

    /// Whether every watch has listed (the controller is ready).
    pub fn listed(&self) -> bool {
        self.listed.len() >= self.watches
    }

    /// Seeds the jitter of retries (each replica its own, so that they spread).
    pub fn seeded(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// How long from `now` until the next retry is due ([`Input::RetryDue`]); `None` while no
    /// write waits for a retry.
    pub fn retry_wait(&self, now: Instant) -> Option<Duration> {
        self.retry
            .values()
            .min()
            .map(|due| due.saturating_duration_since(now))
    }

    /// How many Services wait for a retry.
    pub fn retries_waiting(&self) -> usize {
        self.retry.len()
    }

    /// Decides what the inputs so far call for, under leadership `term` (`None`: not leading)
    /// at `now`, and returns what to do.
    pub fn step<D>(&mut self, term: Option<u64>, now: Instant, core: &mut D) -> Vec<Action<W>>
    where
        D: Decide<Write = W>,
    {
        let mut actions = Vec::new();
        if !self.listed() {
            return actions;
        }
        let Some(term) = term else {
            // Decisions wait for the next term, which starts from the caches.
            self.forget_waiting();
            return actions;
        };
        if self.term != Some(term) {
            self.term = Some(term);
            self.forget_waiting();
            // The rebuild decides every Service again.
            self.retry.clear();
            self.attempts.clear();
            actions.push(Action::NewTerm(term));
            self.dirty.extend(core.rebuild(term));
            actions.push(Action::ReportConfig);
            self.config_changed = false;
        }
        if self.config_changed {
            self.config_changed = false;
            self.dirty.extend(core.apply_config());
            actions.push(Action::ReportConfig);
        }
        self.decide(core);
        while self.in_flight.len() < MAX_IN_FLIGHT {
            let Some(key) = self.order.pop_front() else {
                break;
            };
            let Some(write) = self.queued.remove(&key) else {
                continue;
            };
            self.in_flight.insert(key.clone());
            actions.push(Action::Write(key, write));
        }
        let idle = self.in_flight.is_empty() && self.queued.is_empty();
        if idle || now.saturating_duration_since(self.pool_status_written) >= POOL_STATUS_INTERVAL {
            actions.push(Action::WritePoolStatus);
        }
        actions
    }

    /// Decides the dirty Services in key order (the allocator is sequential and deterministic);
    /// freeing IPs can make room for Services that wait, so those are decided again until a
    /// pass frees nothing.
    fn decide<D: Decide<Write = W>>(&mut self, core: &mut D) {
        while !self.dirty.is_empty() {
            let held_before = core.held();
            let mut freed = false;
            for key in std::mem::take(&mut self.dirty) {
                if self.in_flight.contains(&key) {
                    // Decided again once its write is done, on what the write left.
                    self.deferred.insert(key);
                    continue;
                }
                match core.decide(&key) {
                    Decision::Freed => freed = true,
                    Decision::Write(write) => {
                        if self.queued.insert(key.clone(), write).is_none() {
                            self.order.push_back(key);
                        }
                    }
                    Decision::Nothing => {
                        self.queued.remove(&key);
                    }
                }
            }
            if freed || core.held() < held_before {
                self.dirty.extend(core.waiting());
            }
            self.dirty.extend(core.follow_ups());
        }
    }

    /// Drops every write waiting for a slot; writes in flight finish.
    fn forget_waiting(&mut self) {
        self.queued.clear();
        self.order.clear();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    const TERM: Option<u64> = Some(1);

    fn key(name: &str) -> ServiceKey {
        ServiceKey::new("default".to_string(), name.to_string())
    }

    /// A fake core: what each Service's decision is now, who waits for an IP, how many hold one.
    #[derive(Default)]
    struct Core {
        /// Services in the cache, with the write (a version) each wants; absent: deleted.
        services: BTreeMap<ServiceKey, Option<u32>>,
        /// Deleted Services that held IPs.
        holders_gone: BTreeSet<ServiceKey>,
        /// Services whose decision releases an IP (held goes down by one).
        releasing: BTreeSet<ServiceKey>,
        waiting: Vec<ServiceKey>,
        held: usize,
        decided: Vec<ServiceKey>,
        rebuilds: usize,
        configs: usize,
    }

    impl Decide for Core {
        type Write = u32;
        fn rebuild(&mut self, _term: u64) -> Vec<ServiceKey> {
            self.rebuilds += 1;
            self.services.keys().cloned().collect()
        }
        fn apply_config(&mut self) -> Vec<ServiceKey> {
            self.configs += 1;
            Vec::new()
        }
        fn decide(&mut self, key: &ServiceKey) -> Decision<u32> {
            self.decided.push(key.clone());
            if self.releasing.remove(key) {
                self.held = self.held.saturating_sub(1);
            }
            match self.services.get(key) {
                Some(Some(version)) => Decision::Write(*version),
                Some(None) => Decision::Nothing,
                None if self.holders_gone.remove(key) => Decision::Freed,
                None => Decision::Nothing,
            }
        }
        fn waiting(&self) -> Vec<ServiceKey> {
            self.waiting.clone()
        }
        fn held(&self) -> usize {
            self.held
        }
    }

    /// One replica's schedule with a fake core. Inputs go in one by one; `step` is the loop's
    /// turn after them. Time stands still unless a test moves `now`.
    struct Replica {
        core: Core,
        schedule: Schedule<u32>,
        now: Instant,
    }

    impl Replica {
        /// Every watch has listed and the replica leads in [`TERM`], with no Services yet.
        fn leading() -> Self {
            let now = Instant::now();
            let mut schedule = Schedule::new(1, now);
            schedule.handle(Input::Listed("services"));
            let mut core = Core::default();
            assert_eq!(schedule.step(TERM, now, &mut core)[0], Action::NewTerm(1));
            Self {
                core,
                schedule,
                now,
            }
        }

        /// Service `name` changed and now wants its write of `version`.
        fn wants(&mut self, name: &str, version: u32) {
            self.core.services.insert(key(name), Some(version));
            self.schedule.handle(Input::ServiceChanged(key(name)));
        }

        /// Service `name` changed and already carries what it should.
        fn satisfied(&mut self, name: &str) {
            self.core.services.insert(key(name), None);
            self.schedule.handle(Input::ServiceChanged(key(name)));
        }

        /// Service `name` was deleted, holding IPs or not.
        fn deleted(&mut self, name: &str, held_ips: bool) {
            self.core.services.remove(&key(name));
            if held_ips {
                self.core.holders_gone.insert(key(name));
            }
            self.schedule.handle(Input::ServiceChanged(key(name)));
        }

        fn finish(&mut self, key: &ServiceKey, written: Written) {
            self.schedule
                .handle(Input::WriteFinished(key.clone(), written, self.now));
        }

        fn step(&mut self) -> Vec<Action<u32>> {
            self.step_in(TERM)
        }

        fn step_in(&mut self, term: Option<u64>) -> Vec<Action<u32>> {
            self.schedule.step(term, self.now, &mut self.core)
        }

        /// The Services decided since the last call.
        fn decided(&mut self) -> Vec<ServiceKey> {
            std::mem::take(&mut self.core.decided)
        }

        /// Fills every write slot with Services `slot00`..; returns their keys.
        fn fill_slots(&mut self) -> Vec<ServiceKey> {
            let names: Vec<String> = (0..MAX_IN_FLIGHT).map(|i| format!("slot{i:02}")).collect();
            for name in &names {
                self.wants(name, 1);
            }
            assert_eq!(started(&self.step()).len(), MAX_IN_FLIGHT);
            self.decided();
            names.iter().map(|n| key(n)).collect()
        }
    }

    /// The writes `actions` start, by key.
    fn started(actions: &[Action<u32>]) -> BTreeMap<ServiceKey, u32> {
        started_in_order(actions).into_iter().collect()
    }

    fn started_in_order(actions: &[Action<u32>]) -> Vec<(ServiceKey, u32)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Write(k, w) => Some((k.clone(), *w)),
                _ => None,
            })
            .collect()
    }

    /// Writes of these Services with these versions.
    fn writes(of: &[(&str, u32)]) -> BTreeMap<ServiceKey, u32> {
        of.iter().map(|(name, v)| (key(name), *v)).collect()
    }

    fn writes_pool_status(actions: &[Action<u32>]) -> bool {
        actions.contains(&Action::WritePoolStatus)
    }

    #[test]
    fn nothing_is_decided_before_every_watch_has_listed() {
        let now = Instant::now();
        let mut core = Core::default();
        core.services.insert(key("a"), Some(1));
        let mut schedule = Schedule::new(2, now);
        schedule.handle(Input::Listed("services"));
        schedule.handle(Input::ServiceChanged(key("a")));
        assert!(schedule.step(TERM, now, &mut core).is_empty());
        assert!(!schedule.listed());
        schedule.handle(Input::Listed("nodes"));
        assert!(schedule.listed());
        let actions = schedule.step(TERM, now, &mut core);
        assert_eq!(started(&actions), writes(&[("a", 1)]));
    }

    #[test]
    fn nothing_is_written_while_not_leading() {
        let mut r = Replica::leading();
        r.wants("a", 1);
        assert!(r.step_in(None).is_empty());
        assert!(r.decided().is_empty());
    }

    #[test]
    fn a_service_changed_during_its_write_is_decided_again_after_the_write_and_never_twice_in_flight()
     {
        let mut r = Replica::leading();
        r.wants("a", 1);
        assert_eq!(started(&r.step()), writes(&[("a", 1)]));
        r.decided();

        r.wants("a", 2);
        assert!(started(&r.step()).is_empty(), "a second write in flight");
        assert!(
            r.decided().is_empty(),
            "decided on what the write is changing"
        );

        r.finish(&key("a"), Written::Done);
        assert_eq!(started(&r.step()), writes(&[("a", 2)]));
    }

    #[test]
    fn the_49th_write_waits_for_a_free_slot() {
        let mut r = Replica::leading();
        let slots = r.fill_slots();
        r.wants("late", 1);
        assert!(started(&r.step()).is_empty());
        assert_eq!(r.schedule.in_flight.len(), MAX_IN_FLIGHT);

        r.finish(&slots[7], Written::Done);
        assert_eq!(started(&r.step()), writes(&[("late", 1)]));
        assert_eq!(r.schedule.in_flight.len(), MAX_IN_FLIGHT);
    }

    #[test]
    fn a_queued_write_decided_again_keeps_its_place_and_carries_the_newest_decision() {
        let mut r = Replica::leading();
        let slots = r.fill_slots();
        r.wants("first", 1);
        r.step();
        r.wants("second", 1);
        r.step();
        r.wants("first", 2);
        r.step();

        r.finish(&slots[0], Written::Done);
        assert_eq!(started(&r.step()), writes(&[("first", 2)]));
        r.finish(&slots[1], Written::Done);
        assert_eq!(started(&r.step()), writes(&[("second", 1)]));
    }

    #[test]
    fn a_queued_write_the_newest_decision_no_longer_needs_is_dropped() {
        let mut r = Replica::leading();
        let slots = r.fill_slots();
        r.wants("a", 1);
        r.step();
        r.satisfied("a");
        r.step();

        for slot in &slots {
            r.finish(slot, Written::Done);
        }
        let actions = r.step();
        assert!(started(&actions).is_empty(), "{actions:?}");
    }

    #[test]
    fn a_write_that_finds_leadership_lapsed_is_not_done_and_is_decided_again_at_the_next_term() {
        let mut r = Replica::leading();
        r.wants("a", 1);
        r.step();
        assert!(r.step_in(None).is_empty());
        r.finish(&key("a"), Written::NotLeading);
        let wait = r.schedule.retry_wait(r.now).unwrap();
        assert!(wait >= RETRY_AFTER / 2 && wait < RETRY_AFTER, "{wait:?}");
        assert!(r.step_in(None).is_empty());

        let actions = r.step_in(Some(2));
        assert_eq!(actions[0], Action::NewTerm(2));
        assert_eq!(started(&actions), writes(&[("a", 1)]));
    }

    #[test]
    fn a_write_that_did_not_happen_is_decided_again_after_the_retry_wait() {
        let mut r = Replica::leading();
        for result in [Written::Failed, Written::NotLeading] {
            r.wants("a", 1);
            r.step();
            r.finish(&key("a"), result);
            assert!(started(&r.step()).is_empty());
            let wait = r.schedule.retry_wait(r.now).unwrap();
            // Not due yet: nothing moves.
            r.schedule.handle(Input::RetryDue(r.now + wait / 2));
            assert!(started(&r.step()).is_empty());
            r.now += wait;
            r.schedule.handle(Input::RetryDue(r.now));
            assert_eq!(r.schedule.retry_wait(r.now), None);
            assert_eq!(started(&r.step()), writes(&[("a", 1)]));
            r.finish(&key("a"), Written::Done);
        }
        assert_eq!(
            r.schedule.retry_wait(r.now),
            None,
            "a write that is done is not retried"
        );
    }

    #[test]
    fn failures_in_a_row_back_off_exponentially_with_jitter_and_a_success_resets() {
        let mut r = Replica::leading();
        r.wants("a", 1);
        let mut waits = Vec::new();
        for _ in 0..10 {
            assert_eq!(started(&r.step()), writes(&[("a", 1)]));
            r.finish(&key("a"), Written::Failed);
            let wait = r.schedule.retry_wait(r.now).unwrap();
            waits.push(wait);
            r.now += wait;
            r.schedule.handle(Input::RetryDue(r.now));
        }
        for (i, wait) in waits.iter().enumerate() {
            let full = RETRY_AFTER.saturating_mul(1 << i).min(RETRY_MAX);
            assert!(
                *wait >= full / 2 && *wait < full,
                "retry {i}: {wait:?} of {full:?}"
            );
        }
        assert!(waits[9] >= RETRY_MAX / 2, "capped, not stopped: {waits:?}");
        // Done resets: the next failure waits the first wait again.
        assert_eq!(started(&r.step()), writes(&[("a", 1)]));
        r.finish(&key("a"), Written::Done);
        r.wants("a", 2);
        r.step();
        r.finish(&key("a"), Written::Failed);
        assert!(r.schedule.retry_wait(r.now).unwrap() < RETRY_AFTER);
    }

    #[test]
    fn services_that_fail_together_retry_spread_out() {
        let mut r = Replica::leading();
        for i in 0..40 {
            r.wants(&format!("s{i:02}"), 1);
        }
        let started = started(&r.step());
        for k in started.keys() {
            r.finish(k, Written::Failed);
        }
        let due: BTreeSet<Instant> = r.schedule.retry.values().copied().collect();
        assert!(
            due.len() > 30,
            "40 failures retry at {} distinct times",
            due.len()
        );
        // Another replica (another seed) spreads them differently.
        let a = backoff(3, &key("x"), 1);
        let b = backoff(3, &key("x"), 2);
        assert_ne!(a, b);
    }

    #[test]
    fn a_new_term_forgets_waiting_writes_and_decides_everything_again() {
        let mut r = Replica::leading();
        let slots = r.fill_slots();
        for name in ["z", "y", "unneeded"] {
            r.wants(name, 1);
            r.step();
        }
        // Another leader may have written meanwhile: the caches now say otherwise.
        r.core.services.insert(key("z"), Some(2));
        r.core.services.insert(key("y"), Some(2));
        r.core.services.insert(key("unneeded"), None);
        r.core.services.insert(key("idle"), None);
        for slot in &slots {
            r.core.services.insert(slot.clone(), None);
        }
        r.decided();

        let actions = r.step_in(Some(2));
        assert_eq!(actions[..2], [Action::NewTerm(2), Action::ReportConfig]);
        assert_eq!(r.core.rebuilds, 2);
        assert!(started(&actions).is_empty(), "{actions:?}");
        let decided = r.decided();
        for name in ["z", "y", "unneeded", "idle"] {
            assert!(decided.contains(&key(name)), "{name} not decided again");
        }
        assert!(
            !decided.contains(&slots[0]),
            "in flight: decided after its write"
        );

        for slot in &slots[..3] {
            r.finish(slot, Written::Done);
        }
        let actions = r.step_in(Some(2));
        assert_eq!(r.decided(), slots[..3]);
        // The writes queued in the last term are gone; this term's go in its own order.
        assert_eq!(started_in_order(&actions), [(key("y"), 2), (key("z"), 2)]);
    }

    #[test]
    fn a_changed_configuration_is_applied_and_reported() {
        let mut r = Replica::leading();
        assert_eq!(
            r.core.configs, 0,
            "a new term applies it as part of the rebuild"
        );
        r.schedule.handle(Input::ConfigChanged);
        assert_eq!(r.step()[0], Action::ReportConfig);
        assert_eq!(r.core.configs, 1);
        assert!(!r.step().contains(&Action::ReportConfig));
    }

    #[test]
    fn pool_status_is_written_when_the_writes_run_out() {
        let mut r = Replica::leading();
        r.wants("a", 1);
        assert!(!writes_pool_status(&r.step()));
        r.finish(&key("a"), Written::Done);
        assert!(writes_pool_status(&r.step()));
    }

    #[test]
    fn pool_status_is_written_at_least_every_two_seconds_while_writes_keep_coming() {
        let mut r = Replica::leading();
        r.schedule.handle(Input::PoolStatusWritten(r.now));
        let mut written_at = Vec::new();
        for tick in 1..=10u32 {
            r.now += Duration::from_millis(500);
            r.wants(&format!("s{tick}"), 1);
            let actions = r.step();
            assert_eq!(started(&actions).len(), 1);
            if writes_pool_status(&actions) {
                written_at.push(tick);
                r.schedule.handle(Input::PoolStatusWritten(r.now));
            }
        }
        assert_eq!(written_at, vec![4, 8]);
    }

    #[test]
    fn deleting_a_service_that_held_ips_makes_waiting_services_be_decided_again() {
        let mut r = Replica::leading();
        r.core.waiting = vec![key("waiting")];
        r.deleted("holder", true);
        r.step();
        assert_eq!(r.decided(), vec![key("holder"), key("waiting")]);

        r.deleted("never-held", false);
        r.step();
        assert_eq!(
            r.decided(),
            vec![key("never-held")],
            "woke waiting Services"
        );
    }

    #[test]
    fn a_pass_that_leaves_fewer_ips_held_makes_waiting_services_be_decided_again() {
        let mut r = Replica::leading();
        r.core.waiting = vec![key("waiting")];
        r.core.held = 1;
        r.core.releasing.insert(key("shrinks"));
        r.wants("shrinks", 1);
        r.step();
        assert_eq!(r.decided(), vec![key("shrinks"), key("waiting")]);
    }

    #[test]
    fn writes_start_in_the_order_they_were_first_decided() {
        let mut r = Replica::leading();
        for name in ["c", "a", "b"] {
            r.wants(name, 1);
        }
        // One step decides in key order.
        let order: Vec<ServiceKey> = started_in_order(&r.step())
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(order, [key("a"), key("b"), key("c")]);
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        #[derive(Clone, Debug)]
        enum Op {
            Change(u8, Option<u32>),
            Delete(u8, bool),
            Finish(usize, u8),
            Config,
            Retry,
            Step(Option<u64>, u64),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                6 => (0u8..70, prop::option::weighted(0.8, 0u32..4)).prop_map(|(k, v)| Op::Change(k, v)),
                1 => (0u8..70, any::<bool>()).prop_map(|(k, h)| Op::Delete(k, h)),
                4 => (any::<usize>(), 0u8..6).prop_map(|(i, r)| Op::Finish(i, r)),
                1 => Just(Op::Config),
                1 => Just(Op::Retry),
                3 => (prop::option::weighted(0.85, 1u64..4), 0u64..3000).prop_map(|(t, ms)| Op::Step(t, ms)),
            ]
        }

        proptest! {
            #[test]
            fn no_service_ever_has_two_writes_in_flight_and_never_more_than_the_limit(
                ops in prop::collection::vec(op(), 1..300)
            ) {
                let start = Instant::now();
                let mut now = start;
                let mut core = Core { waiting: (0..5).map(|i| key(&format!("s{i}"))).collect(), ..Core::default() };
                let mut schedule: Schedule<u32> = Schedule::new(1, start);
                schedule.handle(Input::Listed("services"));
                // What the driver sees: writes started and not yet finished.
                let mut flying: Vec<ServiceKey> = Vec::new();
                for op in ops {
                    match op {
                        Op::Change(k, v) => {
                            let k = key(&format!("s{k}"));
                            core.services.insert(k.clone(), v);
                            schedule.handle(Input::ServiceChanged(k));
                        }
                        Op::Delete(k, held) => {
                            let k = key(&format!("s{k}"));
                            core.services.remove(&k);
                            if held { core.holders_gone.insert(k.clone()); }
                            schedule.handle(Input::ServiceChanged(k));
                        }
                        Op::Finish(i, r) => {
                            if !flying.is_empty() {
                                let k = flying.remove(i % flying.len());
                                let written = match r { 0 => Written::NotLeading, 1 => Written::Failed, _ => Written::Done };
                                schedule.handle(Input::WriteFinished(k, written, now));
                            }
                        }
                        Op::Config => schedule.handle(Input::ConfigChanged),
                        Op::Retry => schedule.handle(Input::RetryDue(now + RETRY_MAX)),
                        Op::Step(term, ms) => {
                            now += Duration::from_millis(ms);
                            for action in schedule.step(term, now, &mut core) {
                                match action {
                                    Action::Write(k, _) => {
                                        prop_assert!(term.is_some(), "a write started while not leading");
                                        prop_assert!(!flying.contains(&k), "two writes of {k} in flight");
                                        flying.push(k);
                                    }
                                    Action::WritePoolStatus => schedule.handle(Input::PoolStatusWritten(now)),
                                    Action::NewTerm(_) | Action::ReportConfig => {}
                                }
                            }
                            prop_assert!(flying.len() <= MAX_IN_FLIGHT);
                        }
                    }
                    let mut ours: Vec<ServiceKey> = schedule.in_flight.iter().cloned().collect();
                    let mut theirs = flying.clone();
                    ours.sort();
                    theirs.sort();
                    prop_assert_eq!(ours, theirs);
                    prop_assert!(schedule.queued.keys().all(|k| !schedule.in_flight.contains(k)));
                }
            }
        }
    }
}
