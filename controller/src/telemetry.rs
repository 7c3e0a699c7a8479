//! Prometheus metrics (served, with health and readiness, by ferrolb-runtime).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels with one `pool` label.
type PoolLabel = Vec<(&'static str, String)>;

/// Labels with one `reason` label.
type ReasonLabel = Vec<(&'static str, &'static str)>;

/// The controller's metrics: MetalLB's names (users' dashboards expect them) plus `ferrolb_*`.
pub struct Metrics {
    /// `metallb_allocator_addresses_total{pool}`.
    pub addresses_total: Family<PoolLabel, Gauge>,
    /// `metallb_allocator_addresses_in_use_total{pool}`.
    pub addresses_in_use: Family<PoolLabel, Gauge>,
    /// IPv4 addresses of each pool.
    pub ipv4_total: Family<PoolLabel, Gauge>,
    /// IPv4 addresses in use.
    pub ipv4_in_use: Family<PoolLabel, Gauge>,
    /// IPv6 addresses of each pool (saturating).
    pub ipv6_total: Family<PoolLabel, Gauge>,
    /// IPv6 addresses in use.
    pub ipv6_in_use: Family<PoolLabel, Gauge>,
    /// 1 when the last configuration loaded, 0 when it could not be read.
    pub config_loaded: Gauge,
    /// 1 when some objects were left out of the running configuration.
    pub config_stale: Gauge,
    /// 1 on the leader.
    pub leader: Gauge,
    /// Seconds from picking up a Service to its status written.
    pub allocation_seconds: Histogram,
    /// Services holding IPs.
    pub services_assigned: Gauge,
    /// Services served by node addresses (`--node-addresses`).
    pub node_address_services: Gauge,
    /// Events dropped because the Event queue was full.
    pub events_dropped: Counter,
    /// Service writes that did not happen, by `reason`: `conflict` (the Service changed since the
    /// decision), `abandoned` (the leadership grant ended first), `error` (refused or no answer).
    pub writes_failed: Family<ReasonLabel, Counter>,
    /// Services whose write waits for its retry (with backoff).
    pub writes_waiting_retry: Gauge,
    /// The layer 2 voter configuration's generation as the leader last read it (0: none).
    pub voters_generation: Gauge,
    /// 1 while a change of the layer 2 voters is under way (a joint phase).
    pub voters_changing: Gauge,
}

impl Metrics {
    /// Counts one Service write that did not happen.
    pub fn write_failed(&self, reason: &'static str) {
        self.writes_failed
            .get_or_create(&vec![("reason", reason)])
            .inc();
    }
}

impl Metrics {
    /// The metrics, with a registry that serves them.
    pub fn new() -> (Self, Registry) {
        let mut registry = Registry::default();
        let m = Metrics {
            addresses_total: Family::default(),
            addresses_in_use: Family::default(),
            ipv4_total: Family::default(),
            ipv4_in_use: Family::default(),
            ipv6_total: Family::default(),
            ipv6_in_use: Family::default(),
            config_loaded: Gauge::default(),
            config_stale: Gauge::default(),
            leader: Gauge::default(),
            allocation_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            services_assigned: Gauge::default(),
            node_address_services: Gauge::default(),
            events_dropped: Counter::default(),
            writes_failed: Family::default(),
            writes_waiting_retry: Gauge::default(),
            voters_generation: Gauge::default(),
            voters_changing: Gauge::default(),
        };
        registry.register(
            "metallb_allocator_addresses_total",
            "Number of usable addresses, per pool",
            m.addresses_total.clone(),
        );
        registry.register(
            "metallb_allocator_addresses_in_use_total",
            "Number of addresses allocated, per pool",
            m.addresses_in_use.clone(),
        );
        registry.register(
            "metallb_allocator_ipv4_addresses_total",
            "Number of usable IPv4 addresses, per pool",
            m.ipv4_total.clone(),
        );
        registry.register(
            "metallb_allocator_ipv4_addresses_in_use_total",
            "Number of IPv4 addresses allocated, per pool",
            m.ipv4_in_use.clone(),
        );
        registry.register(
            "metallb_allocator_ipv6_addresses_total",
            "Number of usable IPv6 addresses, per pool (saturating)",
            m.ipv6_total.clone(),
        );
        registry.register(
            "metallb_allocator_ipv6_addresses_in_use_total",
            "Number of IPv6 addresses allocated, per pool",
            m.ipv6_in_use.clone(),
        );
        registry.register(
            "metallb_k8s_client_config_loaded_bool",
            "1 if the configuration was loaded",
            m.config_loaded.clone(),
        );
        registry.register(
            "metallb_k8s_client_config_stale_bool",
            "1 if some configuration objects are left out",
            m.config_stale.clone(),
        );
        registry.register(
            "ferrolb_controller_leader",
            "1 if this replica holds the leader Lease",
            m.leader.clone(),
        );
        registry.register(
            "ferrolb_controller_allocation_duration_seconds",
            "Time from picking up a Service to its status written",
            m.allocation_seconds.clone(),
        );
        registry.register(
            "ferrolb_controller_services_assigned",
            "Services holding IPs",
            m.services_assigned.clone(),
        );
        registry.register(
            "ferrolb_controller_node_address_services",
            "Services served by node addresses (--node-addresses)",
            m.node_address_services.clone(),
        );
        registry.register(
            "ferrolb_controller_events_dropped",
            "Events dropped because the Event queue was full (Events are best effort)",
            m.events_dropped.clone(),
        );
        registry.register(
            "ferrolb_controller_voters_generation",
            "Generation of the layer 2 voter configuration as the leader last read it (0: none)",
            m.voters_generation.clone(),
        );
        registry.register(
            "ferrolb_controller_voters_changing",
            "1 while a change of the layer 2 voters is under way (a joint phase)",
            m.voters_changing.clone(),
        );
        registry.register(
            "ferrolb_controller_writes_failed",
            "Service writes that did not happen, by reason (conflict, abandoned, error)",
            m.writes_failed.clone(),
        );
        registry.register(
            "ferrolb_controller_writes_waiting_retry",
            "Services whose write waits for its retry (exponential backoff with jitter)",
            m.writes_waiting_retry.clone(),
        );
        (m, registry)
    }
}
