//! A model of the controller's Service cache and allocator against an API server whose watch
//! lags, breaks and re-lists, possibly from a snapshot older than what the cache holds (issue #33,
//! item 4; decision 0016). Any interleaving of Service changes, conditional writes landing late,
//! watch events, re-lists from any past revision, fresh reads of a new term and decisions must
//! never leave a Service holding an IP in the API server that the allocator does not hold for it
//! (freed, hence free to give to a second Service), nor one IP on two Services.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ferrolb_config::address::IpRange;
use ferrolb_config::allocator::ServiceKey;
use ferrolb_config::model::Pool;
use ferrolb_config::selector::Labels;
use ferrolb_testkit::objects::service;
use kube::runtime::watcher::Event;
use proptest::prelude::*;

use super::{CachedService, ServiceCache};
use crate::core::{Core, Desired, matches};

const NAMES: [&str; 5] = ["a", "b", "c", "d", "e"];

/// Four addresses for five Services: IPs are freed and handed out again.
fn pools() -> Vec<Pool> {
    vec![Pool {
        name: "p".into(),
        labels: Labels::new(),
        ranges: vec![IpRange::parse("198.18.200.0/30").unwrap()],
        auto_assign: true,
        avoid_buggy_ips: false,
        allocation: None,
    }]
}

fn key(i: usize) -> ServiceKey {
    ServiceKey::new("default", NAMES[i])
}

/// Service `i` at resourceVersion `rv`, holding `ip`.
fn cached(i: usize, rv: u64, ip: Option<IpAddr>) -> CachedService {
    let mut b = service(NAMES[i])
        .namespace("default")
        .port(80, "TCP")
        .with(|s| s.metadata.resource_version = Some(rv.to_string()));
    if let Some(ip) = ip {
        b = b
            .ingress(&[&ip.to_string()])
            .annotation("metallb.io/ip-allocated-from-pool", "p");
    }
    CachedService::new(b.build())
}

/// One Service in the API server.
#[derive(Clone, Copy, Debug)]
struct Stored {
    rv: u64,
    ip: Option<IpAddr>,
}

/// The API server: Services and their history (one change per revision, from 1).
#[derive(Default)]
struct Api {
    services: BTreeMap<usize, Stored>,
    /// Change at revision `n + 1`: the Service and its state, or `None` when deleted (then with
    /// its last state, as a watch's delete carries it).
    log: Vec<(usize, Option<Stored>, Stored)>,
}

impl Api {
    fn rev(&self) -> u64 {
        self.log.len() as u64
    }

    fn set(&mut self, i: usize, ip: Option<IpAddr>) {
        let stored = Stored {
            rv: self.rev() + 1,
            ip,
        };
        self.services.insert(i, stored);
        self.log.push((i, Some(stored), stored));
    }

    fn delete(&mut self, i: usize) {
        if let Some(last) = self.services.remove(&i) {
            let last = Stored {
                rv: self.rev() + 1,
                ..last
            };
            self.log.push((i, None, last));
        }
    }

    /// The Services at revision `at`, as a list at that revision returns them.
    fn snapshot(&self, at: u64) -> Vec<CachedService> {
        let mut state = BTreeMap::new();
        for (i, change, _) in self.log.iter().take(usize::try_from(at).unwrap()) {
            match change {
                Some(s) => state.insert(*i, *s),
                None => state.remove(i),
            };
        }
        state
            .into_iter()
            .map(|(i, s)| cached(i, s.rv, s.ip))
            .collect()
    }
}

/// The controller as the work loop drives it: the cache, the core, and writes in flight.
struct Controller {
    cache: ServiceCache,
    core: Core,
    /// Services to decide at the next step.
    queued: BTreeSet<ServiceKey>,
    /// Writes in flight: the Service, the resourceVersion decided on, the IP.
    writes: Vec<(usize, u64, Option<IpAddr>)>,
    /// The revision the watch has delivered up to.
    cursor: u64,
    /// A re-list under way (the watch is down): its revision and what it lists.
    relist: Option<(u64, Vec<CachedService>)>,
}

impl Controller {
    fn new() -> Self {
        let mut core = Core::new(None);
        core.set_pools(pools());
        Self {
            cache: ServiceCache::default(),
            core,
            queued: BTreeSet::new(),
            writes: Vec::new(),
            cursor: 0,
            relist: None,
        }
    }

    fn take(&mut self, event: Event<CachedService>) {
        self.queued.extend(self.cache.apply(event));
    }

    /// A fresh read: a quorum list at the API server's current revision.
    fn read_afresh(&mut self, api: &Api) {
        let listed = api.snapshot(api.rev());
        self.queued
            .extend(self.cache.refresh(listed, Some(api.rev())));
    }

    fn step(&mut self, api: &Api) {
        if self.cache.take_unsettled() {
            self.read_afresh(api);
        }
        for key in std::mem::take(&mut self.queued) {
            let i = NAMES.iter().position(|n| *n == key.name()).unwrap();
            let Some(copy) = self.cache.get(&key).cloned() else {
                self.core.forget(&key);
                continue;
            };
            let svc = copy.to_service();
            let outcome = self.core.reconcile(&svc, &Labels::new());
            if !matches(&svc, &outcome.desired) {
                let ip = match outcome.desired {
                    Desired::Assigned { ips, .. } => ips.first().copied(),
                    _ => None,
                };
                self.writes.push((i, copy.revision().unwrap(), ip));
            }
        }
    }

    /// A new term: writes of the old one are abandoned, the Services read afresh, the
    /// allocations rebuilt from them, every Service decided.
    fn new_term(&mut self, api: &Api) {
        self.writes.clear();
        self.read_afresh(api);
        self.core = Core::new(None);
        self.core.set_pools(pools());
        let mut all: Vec<_> = self.cache.iter().cloned().collect();
        all.sort_by(|a, b| a.key().cmp(b.key()));
        for s in &all {
            self.core.reclaim(&s.to_service(), &Labels::new());
            self.queued.insert(s.key().clone());
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    /// A user creates Service `i` (if absent).
    Create(usize),
    /// A user deletes Service `i`.
    Delete(usize),
    /// A user changes Service `i` (a label: a new resourceVersion).
    Touch(usize),
    /// The watch delivers the next change.
    Deliver,
    /// The watch breaks and re-lists, from a snapshot this many revisions old.
    BeginRelist(u64),
    /// The re-list completes.
    FinishRelist,
    /// The work loop decides what changed.
    Step,
    /// A write in flight reaches the API server (conditional on its resourceVersion).
    Land(usize),
    /// This replica starts a new term.
    NewTerm,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0..NAMES.len()).prop_map(Op::Create),
        1 => (0..NAMES.len()).prop_map(Op::Delete),
        1 => (0..NAMES.len()).prop_map(Op::Touch),
        4 => Just(Op::Deliver),
        1 => (0u64..8).prop_map(Op::BeginRelist),
        1 => Just(Op::FinishRelist),
        3 => Just(Op::Step),
        3 => (0usize..8).prop_map(Op::Land),
        1 => Just(Op::NewTerm),
    ]
}

fn run(api: &mut Api, ctl: &mut Controller, op: &Op) {
    match *op {
        Op::Create(i) => {
            if !api.services.contains_key(&i) {
                api.set(i, None);
            }
        }
        Op::Delete(i) => api.delete(i),
        Op::Touch(i) => {
            if let Some(s) = api.services.get(&i).copied() {
                api.set(i, s.ip);
            }
        }
        Op::Deliver => {
            if ctl.relist.is_none() && ctl.cursor < api.rev() {
                let (i, change, last) = api.log[usize::try_from(ctl.cursor).unwrap()];
                ctl.cursor += 1;
                let copy = cached(i, last.rv, last.ip);
                ctl.take(match change {
                    Some(_) => Event::Apply(copy),
                    None => Event::Delete(copy),
                });
            }
        }
        Op::BeginRelist(age) => {
            if ctl.relist.is_none() {
                let at = api.rev().saturating_sub(age);
                ctl.relist = Some((at, api.snapshot(at)));
            }
        }
        Op::FinishRelist => {
            if let Some((at, listed)) = ctl.relist.take() {
                ctl.take(Event::Init);
                for s in listed {
                    ctl.take(Event::InitApply(s));
                }
                ctl.take(Event::InitDone);
                // The watch goes on from the list's revision.
                ctl.cursor = at;
            }
        }
        Op::Step => ctl.step(api),
        Op::Land(n) => {
            if !ctl.writes.is_empty() {
                let (i, rv, ip) = ctl.writes.remove(n % ctl.writes.len());
                match api.services.get(&i) {
                    Some(s) if s.rv == rv => api.set(i, ip),
                    // Conflict: decided again on the cache (the watch brings the newer copy).
                    Some(_) => {
                        ctl.queued.insert(key(i));
                    }
                    None => {}
                }
            }
        }
        Op::NewTerm => ctl.new_term(api),
    }
}

/// No IP on two Services, and each IP a Service holds is held for it by the allocator.
fn check(api: &Api, ctl: &Controller, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut holders = BTreeMap::new();
    for (&i, s) in &api.services {
        let Some(ip) = s.ip else { continue };
        if let Some(other) = holders.insert(ip, i) {
            return Err(TestCaseError::fail(format!(
                "{ip} on {} and {} after {ops:?}",
                NAMES[other], NAMES[i]
            )));
        }
        let held = ctl
            .core
            .allocator()
            .assignment(&key(i))
            .is_some_and(|a| a.ips.contains(&ip));
        prop_assert!(
            held,
            "{} holds {ip} but the allocator does not hold it for it (holders {:?}) after {:?}",
            NAMES[i],
            ctl.core.allocator().holders(ip),
            ops
        );
    }
    Ok(())
}

/// Lets the watch catch up and every write land; then the cache must be the API server's state
/// and the allocator hold exactly the IPs the Services carry: nothing kept back for a Service
/// that is gone (a re-list that could not settle a Service asks for the fresh read that does).
fn settle(api: &mut Api, ctl: &mut Controller, ops: &[Op]) -> Result<(), TestCaseError> {
    run(api, ctl, &Op::FinishRelist);
    for _ in 0..100 {
        while ctl.cursor < api.rev() {
            run(api, ctl, &Op::Deliver);
        }
        run(api, ctl, &Op::Step);
        if ctl.writes.is_empty() && ctl.queued.is_empty() && ctl.cursor == api.rev() {
            break;
        }
        while !ctl.writes.is_empty() {
            run(api, ctl, &Op::Land(0));
        }
        check(api, ctl, ops)?;
    }
    let cached: BTreeMap<String, Option<u64>> = ctl
        .cache
        .iter()
        .map(|s| (s.key().name().to_string(), s.revision()))
        .collect();
    let stored: BTreeMap<String, Option<u64>> = api
        .services
        .iter()
        .map(|(i, s)| (NAMES[*i].to_string(), Some(s.rv)))
        .collect();
    prop_assert_eq!(cached, stored, "the cache after {:?}", ops);
    for (key, held) in ctl.core.allocator().assignments() {
        let i = NAMES.iter().position(|n| *n == key.name()).unwrap();
        let carried = api.services.get(&i).and_then(|s| s.ip);
        prop_assert_eq!(
            held.ips.first().copied(),
            carried,
            "{} in the allocator after {:?}",
            key,
            ops
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn no_relist_or_event_frees_an_assigned_ip_or_gives_it_twice(
        ops in proptest::collection::vec(op(), 1..80)
    ) {
        let mut api = Api::default();
        let mut ctl = Controller::new();
        for (n, op) in ops.iter().enumerate() {
            run(&mut api, &mut ctl, op);
            check(&api, &ctl, &ops[..=n])?;
        }
        settle(&mut api, &mut ctl, &ops)?;
    }
}
