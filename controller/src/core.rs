//! The controller's pure core: from a Service (and its namespace's labels) to the status and
//! annotation it should carry, through the allocator. No I/O: the driver in `run/` feeds it
//! watch events and writes what differs.

use std::collections::HashMap;
use std::net::IpAddr;

use ferrolb_config::allocator::{
    Allocator, IP_ALLOCATED_FROM_POOL, ServiceKey, ServiceRequest, is_ours,
};
use ferrolb_config::model::Pool;
use ferrolb_config::selector::Labels;
use k8s_openapi::api::core::v1::Service;

use crate::node_addresses::served_by_node_addresses;

/// The old annotation prefix's name of the pool annotation (also cleared when we clear): the
/// controller's one spelling of it (ferrolb-config has the prefix, not this name under it).
pub const DEPRECATED_POOL_ANNOTATION: &str = "metallb.universe.tf/ip-allocated-from-pool";

/// An Event to record on a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// Warning (true) or Normal.
    pub warning: bool,
    /// Event reason (`IPAllocated`, `AllocationFailed`, `ClearAssignment`, `deprecatedAnnotation`).
    pub reason: &'static str,
    /// Human-readable message.
    pub message: String,
}

/// What a Service should carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Desired {
    /// Leave the Service alone (not ours, and nothing of ours on it).
    Untouched,
    /// `status.loadBalancer.ingress` should be exactly these IPs, annotated with this pool.
    Assigned {
        /// IPs, in the Service's family order.
        ips: Vec<IpAddr>,
        /// Pool the IPs come from.
        pool: String,
    },
    /// No IP: clear the ingress and our annotation.
    Cleared,
    /// Served by node addresses (decision 0024): `status.loadBalancer.ingress` should be exactly
    /// these node addresses (none when no node can serve it), the Service marked as served by
    /// them, with no pool annotation and without k3s ServiceLB's finalizer.
    NodeAddresses {
        /// The addresses, in the order ServiceLB writes them.
        ips: Vec<IpAddr>,
    },
}

/// The outcome of reconciling one Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// What the Service should carry.
    pub desired: Desired,
    /// Events to record (already de-duplicated against the previous outcome).
    pub notes: Vec<Note>,
}

/// IPs in a Service's `status.loadBalancer.ingress`.
pub use ferrolb_config::allocator::status_ips as current_ips;

/// The pool annotation we wrote on a Service, if any.
pub fn current_pool(service: &Service) -> Option<&str> {
    let annotations = service.metadata.annotations.as_ref()?;
    annotations
        .get(IP_ALLOCATED_FROM_POOL)
        .or_else(|| annotations.get(DEPRECATED_POOL_ANNOTATION))
        .map(String::as_str)
}

/// The Service's key.
pub fn key_of(service: &Service) -> ServiceKey {
    ServiceKey::new(
        service.metadata.namespace.clone().unwrap_or_default(),
        service.metadata.name.clone().unwrap_or_default(),
    )
}

/// Whether a Service already matches what is desired (no write needed).
pub fn matches(service: &Service, desired: &Desired) -> bool {
    let marked = served_by_node_addresses(service);
    match desired {
        Desired::Untouched => true,
        Desired::Assigned { ips, pool } => {
            current_ips(service) == *ips && current_pool(service) == Some(pool.as_str()) && !marked
        }
        Desired::Cleared => {
            current_ips(service).is_empty() && current_pool(service).is_none() && !marked
        }
        Desired::NodeAddresses { ips } => {
            current_ips(service) == *ips
                && current_pool(service).is_none()
                && marked
                && !has_servicelb_finalizer(service)
        }
    }
}

/// Whether the Service still carries k3s ServiceLB's finalizer.
pub fn has_servicelb_finalizer(service: &Service) -> bool {
    service
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == ferrolb_config::node_addresses::SERVICELB_FINALIZER)
}

/// The allocation core of the controller.
pub struct Core {
    allocator: Allocator,
    lb_class: Option<String>,
    /// Last failure message per Service, so a failure is reported once, not on every resync.
    last_failure: HashMap<ServiceKey, String>,
}

impl Core {
    /// A core with no pools yet. `lb_class` is the `--lb-class` option.
    pub fn new(lb_class: Option<String>) -> Self {
        Self {
            allocator: Allocator::new(Vec::new()),
            lb_class,
            last_failure: HashMap::new(),
        }
    }

    /// The allocator (for pool statistics).
    pub fn allocator(&self) -> &Allocator {
        &self.allocator
    }

    /// Replaces the pools. Returns the Services whose IPs are no longer valid (released): they
    /// must be reconciled again, together with the Services still waiting for an IP.
    pub fn set_pools(&mut self, pools: Vec<Pool>) -> Vec<ServiceKey> {
        self.allocator
            .set_pools(pools)
            .into_iter()
            .map(|(key, _)| key)
            .collect()
    }

    /// Forgets a deleted Service. Returns whether it held IPs (then waiting Services may fit).
    pub fn forget(&mut self, key: &ServiceKey) -> bool {
        self.last_failure.remove(key);
        self.allocator.release(key).is_some()
    }

    /// Claims the IPs a Service already holds, if they are still valid for it. Used on start (and
    /// on becoming leader) for every Service with IPs before any pending Service is served, so
    /// that a restart changes no IP.
    pub fn reclaim(&mut self, service: &Service, namespace_labels: &Labels) -> bool {
        let ips = current_ips(service);
        if ips.is_empty() || !is_ours(service, self.lb_class.as_deref()) {
            return false;
        }
        match ServiceRequest::from_service(service, namespace_labels) {
            Ok(parsed) => self.allocator.assign(&parsed.request, &ips).is_ok(),
            Err(_) => false,
        }
    }

    /// Decides what a Service should carry, allocating or releasing as needed.
    pub fn reconcile(&mut self, service: &Service, namespace_labels: &Labels) -> Outcome {
        match self.reconcile_or_fall_back(service, namespace_labels, false) {
            Some(outcome) => outcome,
            // Without a fall-back every failure is an outcome.
            None => Outcome {
                desired: Desired::Untouched,
                notes: Vec::new(),
            },
        }
    }

    /// Like [`Self::reconcile`], but when no pool serves the Service (its request parses and
    /// cannot be met) it releases what it held and returns `None`, recording no failure: the
    /// Service falls back to node addresses (decision 0024).
    pub fn try_pools(&mut self, service: &Service, namespace_labels: &Labels) -> Option<Outcome> {
        self.reconcile_or_fall_back(service, namespace_labels, true)
    }

    fn reconcile_or_fall_back(
        &mut self,
        service: &Service,
        namespace_labels: &Labels,
        fall_back: bool,
    ) -> Option<Outcome> {
        let key = key_of(service);
        if !is_ours(service, self.lb_class.as_deref()) {
            return Some(self.let_go(&key, service));
        }
        let mut notes = Vec::new();
        let parsed = match ServiceRequest::from_service(service, namespace_labels) {
            Ok(parsed) => parsed,
            Err(e) => {
                self.allocator.release(&key);
                return Some(self.failed(&key, service, e.to_string(), notes));
            }
        };
        let request = parsed.request;
        let current = current_ips(service);
        // A Service we do not know yet but that holds IPs (a new leader, or IPs written by
        // MetalLB before the switch) keeps them when they are still valid.
        if self.allocator.assignment(&key).is_none()
            && !current.is_empty()
            && self.allocator.assign(&request, &current).is_err()
        {
            notes.push(Note {
                warning: true,
                reason: "ClearAssignment",
                message: format!(
                    "current IPs {} are not valid for this Service any more; allocating again",
                    current
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
        match self.allocator.allocate(&request) {
            Ok(assignment) => {
                self.last_failure.remove(&key);
                let desired = Desired::Assigned {
                    ips: assignment.ips.to_vec(),
                    pool: assignment.pool.to_string(),
                };
                if !matches(service, &desired) {
                    for w in &parsed.warnings {
                        notes.push(Note {
                            warning: true,
                            reason: w.reason(),
                            message: w.to_string(),
                        });
                    }
                    notes.push(Note {
                        warning: false,
                        reason: "IPAllocated",
                        message: format!(
                            "Assigned IP [{}] from pool {}",
                            assignment
                                .ips
                                .iter()
                                .map(|ip| format!("\"{ip}\""))
                                .collect::<Vec<_>>()
                                .join(", "),
                            assignment.pool
                        ),
                    });
                }
                Some(Outcome { desired, notes })
            }
            Err(_) if fall_back => {
                self.allocator.release(&key);
                self.last_failure.remove(&key);
                None
            }
            Err(e) => Some(self.failed(&key, service, e.to_string(), notes)),
        }
    }

    /// A Service that is not ours (any more): forgotten, and cleared only when it stopped being a
    /// LoadBalancer and carries our annotation.
    fn let_go(&mut self, key: &ServiceKey, service: &Service) -> Outcome {
        self.forget(key);
        // A LoadBalancer of another class was never ours (the class cannot change while the
        // type is LoadBalancer), even when it carries the pool annotation: MetalLB, or a
        // second ferrolb with its own class, writes the same one, and clearing it would
        // fight that controller for ever (found by the differential test against MetalLB).
        // Only a Service that stopped being a LoadBalancer is cleared, and only if our
        // annotation marks it.
        let load_balancer = service
            .spec
            .as_ref()
            .is_some_and(|s| s.type_.as_deref() == Some("LoadBalancer"));
        if !load_balancer && (current_pool(service).is_some() || served_by_node_addresses(service))
        {
            return Outcome {
                desired: Desired::Cleared,
                notes: vec![Note {
                    warning: false,
                    reason: "ClearAssignment",
                    message: "Service is no longer a LoadBalancer of this controller; its IP was released".into(),
                }],
            };
        }
        Outcome {
            desired: Desired::Untouched,
            notes: Vec::new(),
        }
    }

    fn failed(
        &mut self,
        key: &ServiceKey,
        service: &Service,
        message: String,
        mut notes: Vec<Note>,
    ) -> Outcome {
        if self.last_failure.get(key) != Some(&message) {
            notes.push(Note {
                warning: true,
                reason: "AllocationFailed",
                message: message.clone(),
            });
            self.last_failure.insert(key.clone(), message);
        }
        let desired = if current_ips(service).is_empty() && current_pool(service).is_none() {
            Desired::Untouched
        } else {
            Desired::Cleared
        };
        Outcome { desired, notes }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use ferrolb_config::address::IpRange;
    use ferrolb_testkit::objects::{self, ServiceBuilder};

    fn pool(name: &str, range: &str) -> Pool {
        Pool {
            name: name.into(),
            labels: Labels::new(),
            ranges: vec![IpRange::parse(range).unwrap()],
            auto_assign: true,
            avoid_buggy_ips: false,
            allocation: None,
        }
    }

    /// LoadBalancer Service `name` in `default` with port 80/TCP.
    fn service(name: &str) -> ServiceBuilder {
        objects::service(name).namespace("default").port(80, "TCP")
    }

    /// `svc` holding `ip` from `pool`: its ingress and the pool annotation.
    fn with_status(svc: ServiceBuilder, ip: &str, pool: &str) -> Service {
        svc.ingress(&[ip])
            .annotation(IP_ALLOCATED_FROM_POOL, pool)
            .build()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_deprecated_pool_annotation_is_the_pool_annotation_under_the_old_prefix() {
        use ferrolb_config::allocator::{ANNOTATION_PREFIX, DEPRECATED_ANNOTATION_PREFIX};
        let name = IP_ALLOCATED_FROM_POOL
            .strip_prefix(ANNOTATION_PREFIX)
            .unwrap();
        assert_eq!(
            DEPRECATED_POOL_ANNOTATION,
            format!("{DEPRECATED_ANNOTATION_PREFIX}{name}")
        );
    }

    #[test]
    fn a_new_service_gets_the_first_free_ip_and_an_event() {
        let mut core = Core::new(None);
        core.set_pools(vec![pool("p", "198.18.200.0/30")]);
        let out = core.reconcile(&service("a").build(), &Labels::new());
        assert_eq!(
            out.desired,
            Desired::Assigned {
                ips: vec![ip("198.18.200.0")],
                pool: "p".into()
            }
        );
        assert_eq!(out.notes.len(), 1);
        assert_eq!(out.notes[0].reason, "IPAllocated");
        assert_eq!(
            out.notes[0].message,
            "Assigned IP [\"198.18.200.0\"] from pool p"
        );
    }

    #[test]
    fn a_service_already_carrying_its_ip_needs_no_write_and_no_event() {
        let mut core = Core::new(None);
        core.set_pools(vec![pool("p", "198.18.200.0/30")]);
        let svc = with_status(service("a"), "198.18.200.2", "p");
        let out = core.reconcile(&svc, &Labels::new());
        assert_eq!(
            out.desired,
            Desired::Assigned {
                ips: vec![ip("198.18.200.2")],
                pool: "p".into()
            }
        );
        assert!(matches(&svc, &out.desired));
        assert!(out.notes.is_empty());
    }

    #[test]
    fn reclaim_first_keeps_every_ip_across_a_restart() {
        let mut core = Core::new(None);
        core.set_pools(vec![pool("p", "198.18.200.0/30")]);
        let holder = with_status(service("old"), "198.18.200.0", "p");
        let pending = service("new").build();
        // Pending first would steal .0 if the holder were not reclaimed before.
        assert!(core.reclaim(&holder, &Labels::new()));
        let out = core.reconcile(&pending, &Labels::new());
        assert_eq!(
            out.desired,
            Desired::Assigned {
                ips: vec![ip("198.18.200.1")],
                pool: "p".into()
            }
        );
        let out = core.reconcile(&holder, &Labels::new());
        assert_eq!(
            out.desired,
            Desired::Assigned {
                ips: vec![ip("198.18.200.0")],
                pool: "p".into()
            }
        );
    }

    #[test]
    fn an_ip_outside_every_pool_is_cleared_and_replaced() {
        let mut core = Core::new(None);
        core.set_pools(vec![pool("p", "198.18.200.0/30")]);
        let svc = with_status(service("a"), "198.18.201.9", "gone");
        let out = core.reconcile(&svc, &Labels::new());
        assert_eq!(
            out.desired,
            Desired::Assigned {
                ips: vec![ip("198.18.200.0")],
                pool: "p".into()
            }
        );
        assert!(out.notes.iter().any(|n| n.reason == "ClearAssignment"));
    }

    #[test]
    fn a_service_that_stops_being_a_load_balancer_is_cleared_once() {
        let mut core = Core::new(None);
        core.set_pools(vec![pool("p", "198.18.200.0/30")]);
        let svc = with_status(service("a").service_type("ClusterIP"), "198.18.200.0", "p");
        let out = core.reconcile(&svc, &Labels::new());
        assert_eq!(out.desired, Desired::Cleared);
        assert_eq!(out.notes[0].reason, "ClearAssignment");
        let mut cleared = svc.clone();
        cleared.status = None;
        cleared.metadata.annotations = None;
        assert_eq!(
            core.reconcile(&cleared, &Labels::new()).desired,
            Desired::Untouched
        );
    }

    #[test]
    fn another_controllers_assignment_is_left_alone() {
        // MetalLB (or a second ferrolb) serving its own class writes the same annotation.
        for ours in [None, Some("ferrolb.io/a")] {
            let mut core = Core::new(ours.map(str::to_string));
            core.set_pools(vec![pool("p", "198.18.200.0/30")]);
            for class in [Some("metallb.io/other"), None] {
                let svc = match class {
                    Some(class) => service("a").load_balancer_class(class),
                    None => service("a"),
                };
                let svc = with_status(svc, "198.18.200.1", "p");
                if is_ours(&svc, ours) {
                    continue;
                }
                assert_eq!(
                    core.reconcile(&svc, &Labels::new()),
                    Outcome {
                        desired: Desired::Untouched,
                        notes: vec![]
                    },
                    "ours {ours:?}, Service class {class:?}"
                );
            }
        }
    }

    #[test]
    fn a_foreign_load_balancer_class_is_left_alone() {
        let mut core = Core::new(None);
        core.set_pools(vec![pool("p", "198.18.200.0/30")]);
        let svc = service("a")
            .load_balancer_class("other.io/lb")
            .ingress(&["203.0.113.1"])
            .build();
        assert_eq!(
            core.reconcile(&svc, &Labels::new()),
            Outcome {
                desired: Desired::Untouched,
                notes: vec![]
            }
        );
    }

    #[test]
    fn a_failure_is_reported_once_and_clears_a_held_ip() {
        let mut core = Core::new(None);
        core.set_pools(vec![pool("p", "198.18.200.0/32")]);
        let first = core.reconcile(&service("a").build(), &Labels::new());
        assert!(matches!(first.desired, Desired::Assigned { .. }));
        let b = service("b").build();
        let out = core.reconcile(&b, &Labels::new());
        assert_eq!(out.desired, Desired::Untouched);
        assert_eq!(out.notes.len(), 1);
        assert_eq!(out.notes[0].reason, "AllocationFailed");
        assert!(
            core.reconcile(&b, &Labels::new()).notes.is_empty(),
            "reported once"
        );
        let both = service("c")
            .annotation("metallb.io/loadBalancerIPs", "198.18.200.0")
            .load_balancer_ip("198.18.200.0")
            .build();
        let out = core.reconcile(&both, &Labels::new());
        assert_eq!(out.notes[0].reason, "AllocationFailed");
        assert!(
            out.notes[0].message.contains("loadBalancerIP"),
            "{}",
            out.notes[0].message
        );
    }

    #[test]
    fn pool_removal_releases_and_requeues_its_services() {
        let mut core = Core::new(None);
        core.set_pools(vec![
            pool("p", "198.18.200.0/30"),
            pool("q", "198.18.201.0/30"),
        ]);
        let svc = service("a")
            .annotation("metallb.io/address-pool", "q")
            .build();
        assert!(matches!(
            core.reconcile(&svc, &Labels::new()).desired,
            Desired::Assigned { .. }
        ));
        let affected = core.set_pools(vec![pool("p", "198.18.200.0/30")]);
        assert_eq!(affected, vec![key_of(&svc)]);
    }
}
