//! The IP allocator: which addresses each LoadBalancer Service gets, by MetalLB's rules.
//!
//! Pure and deterministic: no I/O, no clock, and no result depends on hash-map order (the maps'
//! hasher is keyed per process). The controller feeds it the pools
//! ([`Allocator::set_pools`]), re-claims the addresses Services already hold on start
//! ([`Allocator::assign`], before anything else), then asks for addresses
//! ([`Allocator::allocate`]) and gives them back ([`Allocator::release`]).
//!
//! Order of choice for a Service without a valid assignment:
//! 1. requested IPs (`metallb.io/loadBalancerIPs` or `spec.loadBalancerIP`): they must be in a pool
//!    that admits the Service (`autoAssign` does not matter), and in the annotated pool if there is
//!    one;
//! 2. the pool named by `metallb.io/address-pool`, even with `autoAssign: false`, if its
//!    `serviceAllocation` admits the Service;
//! 3. pools with `autoAssign: true` and a `serviceAllocation` admitting the Service, by priority
//!    (lower first, unset or 0 last, ties by name);
//! 4. pools with `autoAssign: true` and no `serviceAllocation`, by name (MetalLB: random order).
//!
//! Within a pool the lowest free address is taken; a Service with a sharing key first takes an
//! address already held by a compatible Service with the same key (in the first pool, in the
//! order above, that has one). Dual-stack Services take both families from one pool.
//!
//! An assignment is kept as long as it is valid: its pool exists, holds the IPs (not skipped as
//! .0/.255), admits the Service, is the annotated pool if any; the IPs are the requested ones if
//! any; sharing is still allowed. `autoAssign` only governs new choices, so a pool switched to
//! `autoAssign: false` keeps its Services, as in MetalLB. When pools change, `serviceAllocation`
//! is re-checked with the Service's labels from its latest request and its namespace's labels
//! from the latest request of any Service in that namespace.
//!
//! Free space is a set of intervals per pool and family: a pool of any size (a /8, a /64) starts
//! as one interval per address range, memory grows with the number of assignments and holes,
//! and no operation's cost grows with the size of a pool. The one cost that grows with use: a
//! Service with a sharing key looks through the addresses already held under that key.

mod error;
mod hash;
mod holders;
mod intervals;
mod pool_state;
mod request;
mod sharing;

use std::collections::btree_map::Entry;
use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use crate::address::Family;
use crate::model::Pool;
use crate::selector::Labels;

pub use error::AllocationError;
pub use pool_state::{PoolStats, is_buggy_ip};
pub use request::{
    ADDRESS_POOL, ALLOW_SHARED_IP, ANNOTATION_PREFIX, Backend, DEPRECATED_ANNOTATION_PREFIX,
    DEPRECATED_ANNOTATION_REASON, FamilyPolicy, IP_ALLOCATED_FROM_POOL, LOAD_BALANCER_IPS,
    ParsedService, Protocol, ProtocolPort, RequestError, RequestWarning, ServiceKey,
    ServiceRequest, is_ours, status_ips,
};
pub use sharing::ShareConflict;

use hash::FoldState;
use holders::{HolderMap, Holders};
use pool_state::PoolState;
use sharing::{Sharing, conflict, terms_of};

/// The addresses a Service holds and the pool they come from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Assignment {
    /// Name of the pool (for the `metallb.io/ip-allocated-from-pool` annotation).
    pub pool: Arc<str>,
    /// One address per family, in the order of the Service's `spec.ipFamilies`.
    pub ips: Arc<[IpAddr]>,
}

/// What the allocator remembers of a Service that holds addresses.
#[derive(Clone, Debug)]
struct Holding {
    assignment: Assignment,
    /// Index of the pool in `Allocator::pools`.
    pool: u32,
    /// Sharing terms; `None` for a Service without a sharing key.
    sharing: Option<Box<Sharing>>,
    /// Kept to re-check `serviceAllocation` when pools change; `None` when empty.
    labels: Option<Arc<Labels>>,
}

/// What the allocator keeps of a namespace.
#[derive(Clone, Debug)]
struct Namespace {
    /// Its name, shared by the keys of its holdings.
    name: Arc<str>,
    /// The labels of its latest request, to re-check `serviceAllocation` when pools change.
    labels: Arc<Labels>,
}

static NO_LABELS: Labels = Labels::new();

impl Holding {
    fn pool(&self) -> usize {
        self.pool as usize
    }

    fn labels(&self) -> &Labels {
        self.labels.as_deref().unwrap_or(&NO_LABELS)
    }
}

/// Up to one address per family, picked before they are committed.
#[derive(Clone, Copy, Debug)]
struct Picked {
    ips: [IpAddr; 2],
    len: usize,
}

impl Default for Picked {
    fn default() -> Self {
        Self {
            ips: [IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED); 2],
            len: 0,
        }
    }
}

impl Picked {
    fn push(&mut self, ip: IpAddr) {
        self.ips[self.len] = ip;
        self.len += 1;
    }

    fn as_slice(&self) -> &[IpAddr] {
        &self.ips[..self.len]
    }
}

/// The allocator. See the [module documentation](self) for the rules.
#[derive(Clone, Debug, Default)]
pub struct Allocator {
    /// Pools sorted by name.
    pools: Vec<PoolState>,
    /// Pools a Service may get automatically, in the order they are tried.
    auto_order: Vec<usize>,
    holdings: HashMap<ServiceKey, Holding, FoldState>,
    holders: HolderMap,
    /// Addresses held by Services with a sharing key, by key.
    keyed_ips: HashMap<Arc<str>, BTreeSet<IpAddr>, FoldState>,
    /// The namespaces of the Services seen.
    namespaces: HashMap<Arc<str>, Namespace, FoldState>,
}

impl Allocator {
    /// An allocator over these pools, with nothing assigned. Pools are kept sorted by name; of
    /// two pools with one name only the first counts. Pools must not overlap (validation
    /// guarantees it).
    pub fn new(pools: Vec<Pool>) -> Self {
        let mut allocator = Self::default();
        allocator.set_pools(pools);
        allocator
    }

    /// The pools, by name.
    pub fn pools(&self) -> impl Iterator<Item = &Pool> {
        self.pools.iter().map(|s| &s.pool)
    }

    /// Replaces the pools. Assignments still valid (same pool still there, still holding the
    /// IPs, not skipped as .0/.255, still admitting the Service) stay as they are; the others
    /// are released and returned, sorted by Service, with the reason.
    pub fn set_pools(&mut self, mut pools: Vec<Pool>) -> Vec<(ServiceKey, AllocationError)> {
        pools.sort_by(|a, b| a.name.cmp(&b.name));
        pools.dedup_by(|later, first| later.name == first.name);

        let invalid = self.release_invalid(&pools);
        self.replace_pool_states(pools);
        self.order_auto_assign();
        invalid
    }

    /// Releases the assignments that the new `pools` (sorted by name) no longer allow; returns
    /// them sorted by Service, with the reason.
    fn release_invalid(&mut self, pools: &[Pool]) -> Vec<(ServiceKey, AllocationError)> {
        let mut invalid = Vec::new();
        for (key, holding) in &self.holdings {
            let name = &holding.assignment.pool;
            let reason = match pools.binary_search_by(|p| p.name.as_str().cmp(name)) {
                Err(_) => Some(AllocationError::PoolDeleted {
                    pool: name.to_string(),
                }),
                Ok(i) => invalid_under(
                    &pools[i],
                    key,
                    holding,
                    self.namespace_labels(key.namespace()),
                ),
            };
            if let Some(reason) = reason {
                invalid.push((key.clone(), reason));
            }
        }
        invalid.sort_by(|a, b| a.0.cmp(&b.0));
        for (key, _) in &invalid {
            self.release(key);
        }
        invalid
    }

    /// Installs the new pools (sorted by name), points the holdings at their new indices and marks
    /// held addresses taken in the pools that start over.
    fn replace_pool_states(&mut self, pools: Vec<Pool>) {
        // Pools whose addresses did not change keep their free space; the others start over.
        let mut old: HashMap<String, PoolState> = self
            .pools
            .drain(..)
            .map(|s| (s.pool.name.clone(), s))
            .collect();
        let mut rebuilt = vec![false; pools.len()];
        self.pools = pools
            .into_iter()
            .enumerate()
            .map(|(i, pool)| match old.remove(&pool.name) {
                Some(mut state)
                    if state.pool.ranges == pool.ranges
                        && state.pool.avoid_buggy_ips == pool.avoid_buggy_ips =>
                {
                    state.pool = pool;
                    state
                }
                _ => {
                    rebuilt[i] = true;
                    PoolState::new(pool)
                }
            })
            .collect();
        for holding in self.holdings.values_mut() {
            let name = &holding.assignment.pool;
            if let Ok(i) = self
                .pools
                .binary_search_by(|p| p.pool.name.as_str().cmp(name))
            {
                holding.pool = i as u32;
            }
        }
        for (ip, holders) in self.holders.iter() {
            let pool = holders
                .as_slice()
                .first()
                .and_then(|key| self.holdings.get(key))
                .map(Holding::pool);
            if let Some(i) = pool.filter(|&i| rebuilt[i]) {
                self.pools[i].claim(ip);
            }
        }
    }

    /// The order automatic allocation tries pools in: pools with an allocation policy by
    /// priority, then the others, each in name order.
    fn order_auto_assign(&mut self) {
        let mut restricted: Vec<usize> = (0..self.pools.len())
            .filter(|&i| self.pools[i].pool.auto_assign && self.pools[i].pool.allocation.is_some())
            .collect();
        // Stable sort: equal priorities stay in name order.
        restricted.sort_by_key(|&i| {
            match self.pools[i]
                .pool
                .allocation
                .as_ref()
                .and_then(|a| a.priority)
            {
                Some(p) if p > 0 => (0, p),
                _ => (1, 0),
            }
        });
        let open = (0..self.pools.len())
            .filter(|&i| self.pools[i].pool.auto_assign && self.pools[i].pool.allocation.is_none());
        self.auto_order = restricted.into_iter().chain(open).collect();
    }

    /// Gives the Service addresses, or keeps the ones it holds if they are still valid for this
    /// request (for PreferDualStack, the missing family is added from the same pool when
    /// possible). A Service whose assignment is no longer valid loses it and gets a new one.
    pub fn allocate(&mut self, request: &ServiceRequest) -> Result<Assignment, AllocationError> {
        if self.holdings.contains_key(&request.key) {
            if let Some(kept) = self.revalidate(request) {
                return Ok(kept);
            }
            self.release(&request.key);
        }
        if !request.requested_ips.is_empty() {
            let (pool, ips) = self.check_ips(request, &request.requested_ips, true)?;
            return Ok(self.commit(request, pool, &ips));
        }
        if let Some(name) = &request.pool {
            return self.allocate_in_annotated_pool(request, name);
        }
        self.allocate_automatically(request)
    }

    /// Claims exactly these addresses for the Service (on start, from its status), replacing what
    /// it held. Fails, changing nothing, if they are not valid for it: not in one pool that
    /// admits it, not the annotated pool, not the requested IPs, skipped as .0/.255, of a family
    /// it does not ask for, one family only for RequireDualStack, or held by a Service it may not
    /// share with. A PreferDualStack Service may hold one family.
    pub fn assign(
        &mut self,
        request: &ServiceRequest,
        ips: &[IpAddr],
    ) -> Result<Assignment, AllocationError> {
        let (pool, ips) = self.check_ips(request, ips, false)?;
        self.release(&request.key);
        Ok(self.commit(request, pool, &ips))
    }

    /// Releases what the Service holds; returns it.
    pub fn release(&mut self, key: &ServiceKey) -> Option<Assignment> {
        let holding = self.holdings.remove(key)?;
        for &ip in holding.assignment.ips.iter() {
            let Entry::Occupied(mut entry) = self.holders.entry(ip) else {
                continue;
            };
            if !entry.get_mut().remove(key) {
                continue;
            }
            entry.remove();
            self.pools[holding.pool()].unclaim(ip);
            if let Some(sharing) = &holding.sharing
                && let Some(ips) = self.keyed_ips.get_mut(&sharing.key)
            {
                ips.remove(&ip);
                if ips.is_empty() {
                    self.keyed_ips.remove(&sharing.key);
                }
            }
        }
        Some(holding.assignment)
    }

    /// What the Service holds.
    pub fn assignment(&self, key: &ServiceKey) -> Option<&Assignment> {
        self.holdings.get(key).map(|h| &h.assignment)
    }

    /// Every assignment, in no particular order.
    pub fn assignments(&self) -> impl Iterator<Item = (&ServiceKey, &Assignment)> {
        self.holdings.iter().map(|(k, h)| (k, &h.assignment))
    }

    /// Number of Services holding addresses.
    pub fn len(&self) -> usize {
        self.holdings.len()
    }

    /// Whether no Service holds an address.
    pub fn is_empty(&self) -> bool {
        self.holdings.is_empty()
    }

    /// The Services holding an address, in the order they got it.
    pub fn holders(&self, ip: IpAddr) -> &[ServiceKey] {
        self.holders.get(ip).map_or(&[], Holders::as_slice)
    }

    /// Address counts of a pool.
    pub fn pool_stats(&self, pool: &str) -> Option<PoolStats> {
        self.pool_index(pool).map(|i| self.pools[i].stats())
    }

    /// Number of intervals the free space of all pools is stored in: the allocator's memory
    /// besides one entry per assignment. A fresh pool costs one per address range.
    pub fn free_space_intervals(&self) -> usize {
        self.pools.iter().map(PoolState::free_intervals).sum()
    }

    fn pool_index(&self, name: &str) -> Option<usize> {
        self.pools
            .binary_search_by(|p| p.pool.name.as_str().cmp(name))
            .ok()
    }

    fn admits(&self, pool: usize, request: &ServiceRequest) -> bool {
        self.pools[pool].pool.admits(
            request.key.namespace(),
            &request.namespace_labels,
            &request.labels,
        )
    }

    /// The first holder of `ip` (other than the Service itself) it may not share with, and why.
    fn conflict_at(
        &self,
        ip: IpAddr,
        request: &ServiceRequest,
    ) -> Option<(ServiceKey, ShareConflict)> {
        let holders = self.holders.get(ip)?;
        let ours = terms_of(request);
        holders
            .as_slice()
            .iter()
            .filter(|&holder| *holder != request.key)
            .find_map(|holder| {
                let theirs = self
                    .holdings
                    .get(holder)
                    .and_then(|h| h.sharing.as_deref())
                    .map(Sharing::terms);
                conflict(ours, theirs).map(|c| (holder.clone(), c))
            })
    }

    /// The lowest address of the family in the pool that a compatible Service with the same
    /// sharing key already holds.
    fn shareable(&self, pool: usize, family: Family, request: &ServiceRequest) -> Option<IpAddr> {
        let key = request.effective_sharing_key()?;
        self.keyed_ips
            .get(key)?
            .iter()
            .copied()
            .filter(|&ip| Family::of(ip) == family && self.pools[pool].pool.contains(ip))
            .find(|&ip| self.conflict_at(ip, request).is_none())
    }

    /// One address per family from the pool: a shareable one first, else the lowest free one.
    fn pick(
        &mut self,
        pool: usize,
        family: Family,
        request: &ServiceRequest,
    ) -> Result<IpAddr, AllocationError> {
        if !self.pools[pool].has_family(family) {
            return Err(AllocationError::FamilyNotInPool {
                pool: self.pools[pool].name.to_string(),
                family,
            });
        }
        if let Some(ip) = self.shareable(pool, family, request) {
            return Ok(ip);
        }
        self.pools[pool]
            .lowest_free(family)
            .ok_or_else(|| AllocationError::PoolExhausted {
                pool: self.pools[pool].name.to_string(),
                family,
            })
    }

    fn pick_all(
        &mut self,
        pool: usize,
        families: &[Family],
        request: &ServiceRequest,
    ) -> Result<Picked, AllocationError> {
        let mut picked = Picked::default();
        for &family in families {
            picked.push(self.pick(pool, family, request)?);
        }
        Ok(picked)
    }

    /// The families to ask for (the primary first), how many, and whether one family will do
    /// (PreferDualStack).
    fn plans(request: &ServiceRequest) -> ([Family; 2], usize, bool) {
        let primary = request.primary_family();
        match request.secondary_family() {
            Some(secondary) => (
                [primary, secondary],
                2,
                request.family_policy == FamilyPolicy::PreferDualStack,
            ),
            None => ([primary, primary], 1, false),
        }
    }

    fn allocate_in_annotated_pool(
        &mut self,
        request: &ServiceRequest,
        name: &str,
    ) -> Result<Assignment, AllocationError> {
        let pool = self
            .pool_index(name)
            .ok_or_else(|| AllocationError::UnknownPool { pool: name.into() })?;
        if !self.admits(pool, request) {
            return Err(AllocationError::PoolDoesNotAdmit {
                pool: name.into(),
                service: request.key.clone(),
            });
        }
        let (families, count, fallback) = Self::plans(request);
        let mut result = self.pick_all(pool, &families[..count], request);
        if fallback {
            // MetalLB's order in an annotated pool: both, else IPv4, else IPv6, whatever the
            // Service's primary family.
            for family in [Family::V4, Family::V6] {
                if result.is_err() {
                    result = self.pick_all(pool, &[family], request);
                }
            }
        }
        let picked = result?;
        Ok(self.commit(request, pool, picked.as_slice()))
    }

    fn allocate_automatically(
        &mut self,
        request: &ServiceRequest,
    ) -> Result<Assignment, AllocationError> {
        let (families, count, fallback) = Self::plans(request);
        let keyed = request.effective_sharing_key().is_some();
        // PreferDualStack: a pool with both families, else the first with the primary family,
        // else the first with the secondary one (MetalLB's order; one family is a valid answer).
        let plans: &[&[Family]] = if fallback {
            &[&families[..2], &families[..1], &families[1..2]]
        } else {
            &[&families[..count]]
        };
        // Pools whose serviceAllocation admits the Service first, then the open ones, each group
        // with every plan before the next (MetalLB's order: a PreferDualStack Service takes one
        // family from a restricted pool before both from an open one; found by the
        // differential test).
        for restricted in [true, false] {
            for &plan in plans {
                // Keyed Services first look for a pool where they can share.
                for sharing_pass in [true, false] {
                    if sharing_pass && !keyed {
                        continue;
                    }
                    for n in 0..self.auto_order.len() {
                        let pool = self.auto_order[n];
                        if self.pools[pool].pool.allocation.is_some() != restricted
                            || !self.admits(pool, request)
                            || !plan.iter().all(|&f| self.pools[pool].has_family(f))
                            || (sharing_pass
                                && plan
                                    .iter()
                                    .all(|&f| self.shareable(pool, f, request).is_none()))
                        {
                            continue;
                        }
                        if let Ok(picked) = self.pick_all(pool, plan, request) {
                            return Ok(self.commit(request, pool, picked.as_slice()));
                        }
                    }
                }
            }
        }
        Err(self.automatic_failure(request, &families[..count]))
    }

    /// Why no pool could serve the Service automatically.
    fn automatic_failure(&self, request: &ServiceRequest, families: &[Family]) -> AllocationError {
        let admitting: Vec<usize> = self
            .auto_order
            .iter()
            .copied()
            .filter(|&p| self.admits(p, request))
            .collect();
        if admitting.is_empty() {
            return AllocationError::NoPoolAdmits {
                service: request.key.clone(),
            };
        }
        let primary = families[0];
        let dual_required = request.family_policy == FamilyPolicy::RequireDualStack;
        let fitting: Vec<String> = admitting
            .iter()
            .filter(|&&p| {
                let state = &self.pools[p];
                if dual_required {
                    families.iter().all(|&f| state.has_family(f))
                } else {
                    state.has_family(primary)
                }
            })
            .map(|&p| self.pools[p].name.to_string())
            .collect();
        match (fitting.is_empty(), dual_required) {
            (true, true) => AllocationError::DualStackNotPossible,
            (true, false) => AllocationError::NoPoolForFamily { family: primary },
            (false, _) => AllocationError::AllPoolsExhausted { pools: fitting },
        }
    }

    /// Checks requested or restored IPs; returns their pool and the IPs in family order.
    fn check_ips(
        &self,
        request: &ServiceRequest,
        ips: &[IpAddr],
        requested: bool,
    ) -> Result<(usize, Vec<IpAddr>), AllocationError> {
        let Some(&first) = ips.first() else {
            return Err(AllocationError::NoAddress);
        };
        check_against_request(request, ips, requested)?;
        let pool = self.pool_of_ips(request, first, ips)?;
        if !self.admits(pool, request) {
            return Err(AllocationError::PoolDoesNotAdmit {
                pool: self.pools[pool].name.to_string(),
                service: request.key.clone(),
            });
        }
        for &ip in ips {
            if !self.pools[pool].may_hold(ip) {
                return Err(AllocationError::BuggyIp {
                    ip,
                    pool: self.pools[pool].name.to_string(),
                });
            }
            if let Some((holder, conflict)) = self.conflict_at(ip, request) {
                return Err(AllocationError::IpInUse {
                    ip,
                    holder,
                    conflict,
                });
            }
        }
        let primary = request.primary_family();
        let mut ordered = ips.to_vec();
        ordered.sort_by_key(|&ip| Family::of(ip) != primary);
        Ok((pool, ordered))
    }

    /// The one pool holding all of `ips` (`first` is `ips[0]`): the annotated pool, or else the
    /// pool each IP falls in, which must be the same for all.
    fn pool_of_ips(
        &self,
        request: &ServiceRequest,
        first: IpAddr,
        ips: &[IpAddr],
    ) -> Result<usize, AllocationError> {
        match &request.pool {
            Some(name) => {
                let pool = self
                    .pool_index(name)
                    .ok_or_else(|| AllocationError::UnknownPool { pool: name.clone() })?;
                if let Some(&ip) = ips.iter().find(|&&ip| !self.pools[pool].pool.contains(ip)) {
                    return Err(AllocationError::IpNotInAnnotatedPool {
                        ip,
                        pool: name.clone(),
                    });
                }
                Ok(pool)
            }
            None => {
                let pool_of = |ip: IpAddr| {
                    self.pools
                        .iter()
                        .position(|s| s.pool.contains(ip))
                        .ok_or(AllocationError::IpNotInAnyPool { ip })
                };
                let pool = pool_of(first)?;
                for &ip in &ips[1..] {
                    let other = pool_of(ip)?;
                    if other != pool {
                        return Err(AllocationError::IpsInDifferentPools {
                            first,
                            first_pool: self.pools[pool].name.to_string(),
                            second: ip,
                            second_pool: self.pools[other].name.to_string(),
                        });
                    }
                }
                Ok(pool)
            }
        }
    }

    /// The Service's current assignment adjusted to the request, or `None` when it is no longer
    /// valid for it.
    fn revalidate(&mut self, request: &ServiceRequest) -> Option<Assignment> {
        let holding = self.holdings.get(&request.key)?;
        let pool = holding.pool();
        let current = holding.assignment.clone();
        let same_terms = Sharing::same_as(holding.sharing.as_deref(), request);
        let same_labels = match &holding.labels {
            None => request.labels.is_empty(),
            Some(labels) => Arc::ptr_eq(labels, &request.labels) || **labels == *request.labels,
        };
        let held = |family: Family| {
            current
                .ips
                .iter()
                .copied()
                .find(|&ip| Family::of(ip) == family)
        };
        let primary = request.primary_family();
        let secondary = request.secondary_family();
        let mut wanted = [held(primary), secondary.and_then(held)];

        if !self.admits(pool, request)
            || request
                .pool
                .as_deref()
                .is_some_and(|p| p != &*self.pools[pool].name)
        {
            return None;
        }
        if !request.requested_ips.is_empty() {
            let kept = wanted.iter().flatten().count();
            if kept != request.requested_ips.len()
                || !wanted
                    .iter()
                    .flatten()
                    .all(|ip| request.requested_ips.contains(ip))
            {
                return None;
            }
        }
        for &ip in wanted.iter().flatten() {
            if !self.pools[pool].may_hold(ip) || self.conflict_at(ip, request).is_some() {
                return None;
            }
        }
        if request.requested_ips.is_empty() {
            if wanted[0].is_none() {
                match self.pick(pool, primary, request) {
                    Ok(ip) => wanted[0] = Some(ip),
                    // A PreferDualStack Service holding its secondary family keeps it: moving it
                    // to a pool with both would change an IP under a running Service (MetalLB
                    // keeps it too; found by the differential test).
                    Err(_)
                        if request.family_policy == FamilyPolicy::PreferDualStack
                            && wanted[1].is_some() => {}
                    Err(_) => return None,
                }
            }
            if let Some(secondary) = secondary
                && wanted[1].is_none()
            {
                match self.pick(pool, secondary, request) {
                    Ok(ip) => wanted[1] = Some(ip),
                    Err(_) if request.family_policy == FamilyPolicy::RequireDualStack => {
                        return None;
                    }
                    Err(_) => {}
                }
            }
        }
        // Only a PreferDualStack Service may hold its secondary family alone.
        if wanted[0].is_none()
            && (request.family_policy != FamilyPolicy::PreferDualStack || wanted[1].is_none())
        {
            return None;
        }
        if request.family_policy == FamilyPolicy::RequireDualStack && wanted[1].is_none() {
            return None;
        }

        if same_terms && current.ips.iter().eq(wanted.iter().flatten()) {
            self.note_namespace(request);
            if !same_labels && let Some(holding) = self.holdings.get_mut(&request.key) {
                holding.labels = Self::kept_labels(request);
            }
            return Some(current);
        }
        self.release(&request.key);
        let ips: Vec<IpAddr> = wanted.iter().flatten().copied().collect();
        Some(self.commit(request, pool, &ips))
    }

    /// The Service's labels as a holding keeps them: `None` when empty.
    fn kept_labels(request: &ServiceRequest) -> Option<Arc<Labels>> {
        (!request.labels.is_empty()).then(|| request.labels.clone())
    }

    /// Records the namespace's latest labels; returns its name as shared by the holdings' keys.
    fn note_namespace(&mut self, request: &ServiceRequest) -> Arc<str> {
        let namespace = request.key.namespace_arc();
        if let Some(known) = self.namespaces.get_mut(&**namespace) {
            if !Arc::ptr_eq(&known.labels, &request.namespace_labels) {
                known.labels = request.namespace_labels.clone();
            }
            return known.name.clone();
        }
        self.namespaces.insert(
            namespace.clone(),
            Namespace {
                name: namespace.clone(),
                labels: request.namespace_labels.clone(),
            },
        );
        namespace.clone()
    }

    /// The latest labels seen of a namespace.
    fn namespace_labels(&self, namespace: &str) -> &Labels {
        self.namespaces
            .get(namespace)
            .map_or(&NO_LABELS, |n| &*n.labels)
    }

    /// Records the Service as holding `ips` (valid, in family order) from `pool`. The Service
    /// must hold nothing.
    fn commit(&mut self, request: &ServiceRequest, pool: usize, ips: &[IpAddr]) -> Assignment {
        let sharing = Sharing::of(request).map(Box::new);
        let key = request.key.with_namespace(self.note_namespace(request));
        let labels = Self::kept_labels(request);
        for &ip in ips {
            match self.holders.entry(ip) {
                Entry::Occupied(mut entry) => entry.get_mut().push(key.clone()),
                Entry::Vacant(entry) => {
                    self.pools[pool].claim(ip);
                    entry.insert(Holders::One(key.clone()));
                }
            }
            if let Some(sharing) = &sharing {
                self.keyed_ips
                    .entry(sharing.key.clone())
                    .or_default()
                    .insert(ip);
            }
        }
        let assignment = Assignment {
            pool: self.pools[pool].name.clone(),
            ips: Arc::from(ips),
        };
        self.holdings.insert(
            key,
            Holding {
                assignment: assignment.clone(),
                pool: pool as u32,
                sharing,
                labels,
            },
        );
        assignment
    }
}

/// Checks the families of requested or restored IPs against the request: one per family, only
/// families the Service has, all of them when dual stack is required; restored IPs must be
/// exactly the requested ones, if any are requested.
fn check_against_request(
    request: &ServiceRequest,
    ips: &[IpAddr],
    requested: bool,
) -> Result<(), AllocationError> {
    for (i, &ip) in ips.iter().enumerate() {
        if !request.wants_family(Family::of(ip)) {
            return Err(AllocationError::FamilyNotRequested { ip });
        }
        if let Some(&other) = ips[..i].iter().find(|&&o| Family::of(o) == Family::of(ip)) {
            return Err(AllocationError::TwoOfOneFamily {
                first: other,
                second: ip,
            });
        }
    }
    if request.family_policy == FamilyPolicy::RequireDualStack {
        for family in request.families() {
            if !ips.iter().any(|&ip| Family::of(ip) == family) {
                return Err(AllocationError::MissingFamily { family });
            }
        }
    }
    if !requested
        && !request.requested_ips.is_empty()
        && (ips.len() != request.requested_ips.len()
            || !ips.iter().all(|ip| request.requested_ips.contains(ip)))
    {
        return Err(AllocationError::NotRequested {
            ips: ips.to_vec(),
            requested: request.requested_ips.clone(),
        });
    }
    Ok(())
}

/// Why a held assignment is not valid under a new version of its pool.
fn invalid_under(
    pool: &Pool,
    key: &ServiceKey,
    holding: &Holding,
    namespace_labels: &Labels,
) -> Option<AllocationError> {
    for &ip in holding.assignment.ips.iter() {
        if !pool.contains(ip) {
            return Some(AllocationError::IpLeftPool {
                ip,
                pool: pool.name.clone(),
            });
        }
        if pool.avoid_buggy_ips && is_buggy_ip(ip) {
            return Some(AllocationError::BuggyIp {
                ip,
                pool: pool.name.clone(),
            });
        }
    }
    if !pool.admits(key.namespace(), namespace_labels, holding.labels()) {
        return Some(AllocationError::PoolDoesNotAdmit {
            pool: pool.name.clone(),
            service: key.clone(),
        });
    }
    None
}
