//! The decider: answers the [`Schedule`](crate::schedule::Schedule)'s [`Decide`] calls from the
//! core and the caches (validating the configuration, applying changed pools, deciding
//! Services). Pure and synchronous: no I/O, and the schedule says when to decide what.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use ferrolb_config::allocator::{ServiceKey, ServiceRequest, is_ours};
use ferrolb_config::crd::{BFDProfile, BGPPeer, IPAddressPoolStatus};
use ferrolb_config::model::Pool;
use ferrolb_config::selector::Labels;
use ferrolb_config::validate::{NodeInfo, Validated};
use k8s_openapi::api::core::v1::Service;
use kube::runtime::reflector::ObjectRef;

use super::watches::Stores;
use crate::core::{Core, Desired, Outcome, current_ips, current_pool, matches};
use crate::node_addresses::{self, Engine as NodeAddresses, Route};
use crate::schedule::{Decide, Decision};
use crate::slim::{CachedService, ServiceCache};
use crate::telemetry::Metrics;

/// The decisions: the core and the caches it decides from.
pub(super) struct Decider {
    namespace: String,
    lb_class: Option<String>,
    stores: Stores,
    /// The Services, kept by the work loop from the Service watch's events.
    pub(super) services: ServiceCache,
    metrics: Arc<Metrics>,
    core: Core,
    applied_pools: Option<Vec<Pool>>,
    /// The configuration last applied, until it is reported.
    pub(super) report: Option<ConfigReport>,
    /// The term the allocations were rebuilt for (writes carry it).
    term: u64,
    /// Node addresses (`--node-addresses`), when on.
    pub(super) node_addresses: Option<NodeAddresses>,
}

/// A validated configuration to report, with what its BFDProfile finalizers are decided from.
pub(super) struct ConfigReport {
    /// The model and the errors of the objects left out.
    pub(super) validated: Validated,
    /// The BGPPeers as cached (their BFDProfile references).
    pub(super) peers: Vec<BGPPeer>,
    /// The BFDProfiles as cached (their finalizers).
    pub(super) bfd_profiles: Vec<BFDProfile>,
}

/// One Service's write: what it should carry and the Events to record. The cached form, not the
/// Service: a queue may hold thousands until written.
pub(super) struct ServiceWrite {
    /// The copy of the Service it was decided on (its resourceVersion fences the write).
    pub(super) service: Arc<CachedService>,
    /// What the Service should carry, and the Events to record.
    pub(super) outcome: Outcome,
    /// The leadership term it was decided in: it is sent only while that term lasts.
    pub(super) term: u64,
}

impl Decider {
    /// A decider for the configuration of `namespace` and Services of `lb_class`, with no
    /// Services yet and nothing applied.
    pub(super) fn new(
        namespace: String,
        lb_class: Option<String>,
        stores: Stores,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            namespace,
            core: Core::new(lb_class.clone()),
            lb_class,
            stores,
            services: ServiceCache::default(),
            metrics,
            applied_pools: None,
            report: None,
            term: 0,
            node_addresses: None,
        }
    }

    /// Turns node addresses on (decision 0024).
    pub(super) fn with_node_addresses(mut self) -> Self {
        self.node_addresses = Some(NodeAddresses::default());
        self
    }

    /// Node addresses' inputs changed (`change` applied them): the Services whose decision
    /// changed, to decide again.
    pub(super) fn node_inputs(
        &mut self,
        change: impl FnOnce(&mut NodeAddresses),
    ) -> Vec<ServiceKey> {
        match &mut self.node_addresses {
            Some(engine) => {
                change(engine);
                engine.take_changed()
            }
            None => Vec::new(),
        }
    }

    /// Whether `ip` is in a pool applied now.
    fn in_a_pool(&self, ip: std::net::IpAddr) -> bool {
        self.applied_pools
            .iter()
            .flatten()
            .any(|p| p.ranges.iter().any(|r| r.contains(ip)))
    }

    /// Decides `service` with node addresses on: its route, then the pools or the node
    /// addresses. `None` when node addresses are off.
    fn decide_with_node_addresses(
        &mut self,
        key: &ServiceKey,
        service: &Service,
        labels: &Labels,
    ) -> Option<Outcome> {
        let engine = self.node_addresses.as_ref()?;
        let request = ServiceRequest::from_service(service, labels)
            .ok()
            .map(|p| p.request);
        let ips = current_ips(service);
        let adoptable = current_pool(service).is_none()
            && !ips.is_empty()
            && ips
                .iter()
                .all(|ip| engine.is_node_address(*ip) && !self.in_a_pool(*ip));
        let ours = is_ours(service, self.lb_class.as_deref());
        let route = node_addresses::route(service, ours, request.as_ref(), adoptable);
        let by_nodes = |me: &mut Self, request: &ServiceRequest| {
            me.core.forget(key);
            let engine = me.node_addresses.as_mut()?;
            engine.set_member(key, Some((service, request)));
            Some(match engine.decide(key) {
                Some((ips, notes)) => Outcome {
                    desired: Desired::NodeAddresses { ips },
                    notes,
                },
                // Decided again once the decision is computed (`follow_ups`).
                None => Outcome {
                    desired: Desired::Untouched,
                    notes: Vec::new(),
                },
            })
        };
        let not_by_nodes = |me: &mut Self| {
            if let Some(engine) = me.node_addresses.as_mut() {
                engine.set_member(key, None);
            }
        };
        match (route, request.as_ref()) {
            (Some(Route::NodeAddresses), Some(request)) => by_nodes(self, request),
            (Some(Route::PoolsThenNodeAddresses), Some(request)) => {
                match self.core.try_pools(service, labels) {
                    Some(outcome) => {
                        not_by_nodes(self);
                        Some(outcome)
                    }
                    None => by_nodes(self, request),
                }
            }
            _ => {
                not_by_nodes(self);
                let mut outcome = self.core.reconcile(service, labels);
                if !matches(service, &outcome.desired) {
                    outcome
                        .notes
                        .extend(node_addresses::ignored_opt_in(service, request.as_ref()));
                }
                Some(outcome)
            }
        }
    }

    fn namespace_labels(&self, service: &Service) -> Labels {
        let ns = service.metadata.namespace.as_deref().unwrap_or_default();
        self.stores
            .namespaces
            .get(&ObjectRef::new(ns))
            .and_then(|n| n.metadata.labels.clone())
            .unwrap_or_default()
    }

    /// The applied pools' counters, as IPAddressPool status.
    pub(super) fn pool_counters(&self) -> Vec<(String, IPAddressPoolStatus)> {
        let Some(pools) = &self.applied_pools else {
            return Vec::new();
        };
        pools
            .iter()
            .filter_map(|p| {
                let stats = self.core.allocator().pool_stats(&p.name)?;
                let status = IPAddressPoolStatus {
                    assigned_ipv4: stats.assigned_ipv4,
                    assigned_ipv6: stats.assigned_ipv6,
                    available_ipv4: stats.available_ipv4,
                    available_ipv6: stats.available_ipv6,
                };
                Some((p.name.clone(), status))
            })
            .collect()
    }

    /// Sets the size metrics (addresses in all, per family) of each pool.
    fn count_pool_sizes(&self, pools: &BTreeMap<String, Pool>) {
        for (name, pool) in pools {
            let (v4, v6) = pool
                .ranges
                .iter()
                .fold((0u128, 0u128), |(a, b), r| match r.family() {
                    ferrolb_config::address::Family::V4 => (a + r.size(), b),
                    ferrolb_config::address::Family::V6 => (a, b.saturating_add(r.size())),
                });
            let label = vec![("pool", name.clone())];
            let clamp = |v: u128| i64::try_from(v).unwrap_or(i64::MAX);
            self.metrics
                .addresses_total
                .get_or_create(&label)
                .set(clamp(v4.saturating_add(v6)));
            self.metrics.ipv4_total.get_or_create(&label).set(clamp(v4));
            self.metrics.ipv6_total.get_or_create(&label).set(clamp(v6));
        }
    }
}

impl Decide for Decider {
    type Write = ServiceWrite;

    /// A new leader starts from the caches: configuration, then every Service holding IPs
    /// re-claims them (in key order), then everything else.
    fn rebuild(&mut self, term: u64) -> Vec<ServiceKey> {
        tracing::info!(
            term,
            "leading: rebuilding allocations from the Services' status"
        );
        self.term = term;
        self.core = Core::new(self.lb_class.clone());
        self.applied_pools = None;
        self.apply_config();
        let started = Instant::now();
        let mut sorted: Vec<Arc<CachedService>> = self.services.iter().cloned().collect();
        sorted.sort_by(|a, b| a.key().cmp(b.key()));
        let mut reclaimed = 0usize;
        for cached in &sorted {
            let svc = cached.to_service();
            if self.core.reclaim(&svc, &self.namespace_labels(&svc)) {
                reclaimed += 1;
            }
        }
        tracing::info!(reclaimed, services = sorted.len(), elapsed = ?started.elapsed(), "re-claimed existing IPs");
        sorted.iter().map(|s| s.key().clone()).collect()
    }

    /// Validates the configuration from the caches and applies changed pools (to be reported).
    fn apply_config(&mut self) -> Vec<ServiceKey> {
        let s = &self.stores;
        let nodes = s
            .nodes
            .state()
            .iter()
            .map(|n| NodeInfo::from_metadata(&n.metadata))
            .collect();
        let objects = s.config.objects(&self.namespace, nodes);
        let validated = s.config.validate(&objects);
        self.metrics.config_loaded.set(1);
        self.metrics
            .config_stale
            .set(i64::from(!validated.is_valid()));
        for e in &validated.errors {
            tracing::warn!(object = %e.object, field = %e.field, "configuration error: {}", e.message);
        }
        let pools: Vec<Pool> = validated.config.pools.values().cloned().collect();
        let mut requeue = Vec::new();
        if self.applied_pools.as_ref() != Some(&pools) {
            tracing::info!(pools = pools.len(), "applying pools");
            requeue = self.core.set_pools(pools.clone());
            self.count_pool_sizes(&validated.config.pools);
            self.applied_pools = Some(pools);
            // Services waiting for an IP may fit now.
            requeue.extend(self.waiting());
        }
        self.report = Some(ConfigReport {
            validated,
            peers: objects.peers,
            bfd_profiles: objects.bfd_profiles,
        });
        requeue
    }

    /// Decides what one Service should carry (allocating or releasing in the core).
    fn decide(&mut self, key: &ServiceKey) -> Decision<ServiceWrite> {
        let Some(cached) = self.services.get(key).cloned() else {
            // Services it held ports from are decided again through `follow_ups`.
            if let Some(engine) = &mut self.node_addresses {
                engine.set_member(key, None);
            }
            return if self.core.forget(key) {
                Decision::Freed
            } else {
                Decision::Nothing
            };
        };
        let service = cached.to_service();
        let labels = self.namespace_labels(&service);
        let outcome = match self.decide_with_node_addresses(key, &service, &labels) {
            Some(outcome) => outcome,
            None => self.core.reconcile(&service, &labels),
        };
        self.metrics
            .services_assigned
            .set(i64::try_from(self.core.allocator().len()).unwrap_or(i64::MAX));
        if let Some(engine) = &self.node_addresses {
            self.metrics
                .node_address_services
                .set(i64::try_from(engine.members()).unwrap_or(i64::MAX));
        }
        if matches(&service, &outcome.desired) && outcome.notes.is_empty() {
            Decision::Nothing
        } else {
            Decision::Write(ServiceWrite {
                service: cached,
                outcome,
                term: self.term,
            })
        }
    }

    /// Services of ours still waiting for an IP, or for their second family: a PreferDualStack
    /// Service with two cluster IPs that holds one family gains the other when it frees up, as
    /// in MetalLB (found by the differential test).
    fn waiting(&self) -> Vec<ServiceKey> {
        self.services
            .iter()
            .filter(|s| {
                let service = s.to_service();
                // A Service served by node addresses waits for nothing while it holds them (the
                // choice sticks); with none, a pool that frees up may serve it.
                let holds_node_addresses = !current_ips(&service).is_empty()
                    && self
                        .node_addresses
                        .as_ref()
                        .is_some_and(|e| e.is_member(s.key()));
                if !is_ours(&service, self.lb_class.as_deref()) || holds_node_addresses {
                    return false;
                }
                match self.core.allocator().assignment(s.key()) {
                    None => true,
                    Some(held) => held.ips.len() < 2 && prefers_dual_stack(&service),
                }
            })
            .map(|s| s.key().clone())
            .collect()
    }

    fn held(&self) -> usize {
        self.core.allocator().len()
    }

    fn follow_ups(&mut self) -> Vec<ServiceKey> {
        self.node_inputs(|_| {})
    }
}

/// Whether the Service is PreferDualStack and got both families (`spec.ipFamilies`; the cache
/// keeps no cluster IPs).
fn prefers_dual_stack(service: &Service) -> bool {
    service.spec.as_ref().is_some_and(|spec| {
        spec.ip_family_policy.as_deref() == Some("PreferDualStack")
            && spec.ip_families.as_ref().is_some_and(|f| f.len() == 2)
    })
}
