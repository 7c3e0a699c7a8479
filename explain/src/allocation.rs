//! The first step of the path: which pool a Service's addresses come from and by which rule, or
//! why it has none. The answer comes from the controller's own allocator
//! (`ferrolb_config::allocator`), replayed on the cluster's current state: every other Service
//! keeps what it holds, then the Service asked about is allocated (in memory only). So the
//! explanation cannot disagree with what the controller would do.

use std::collections::BTreeMap;
use std::net::IpAddr;

pub use ferrolb_config::allocator::status_ips;
use ferrolb_config::allocator::{
    ADDRESS_POOL, ANNOTATION_PREFIX, AllocationError, Allocator, Assignment,
    DEPRECATED_ANNOTATION_PREFIX, LOAD_BALANCER_IPS, ServiceKey, ServiceRequest,
};
use ferrolb_config::model::Pool;
use ferrolb_config::selector::Labels;
use k8s_openapi::api::core::v1::Service;
use serde::Serialize;

use crate::diagnosis::{Code, Diagnosis, ObjectRef};

/// A Service with what the allocator needs beside it.
#[derive(Clone, Debug)]
pub struct ServiceInput<'a> {
    /// The Service as read from the API server.
    pub service: &'a Service,
    /// The labels of its namespace (pools' `namespaceSelectors`).
    pub namespace_labels: &'a Labels,
}

/// The rule that picked the pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Rule {
    /// The Service asks for these IPs (`field`: the annotation or `spec.loadBalancerIP`).
    RequestedIps {
        /// Where the IPs are asked for.
        field: String,
    },
    /// The Service names the pool (`metallb.io/address-pool`).
    AnnotatedPool {
        /// The annotation as written.
        annotation: String,
    },
    /// The pool's `serviceAllocation` admits the Service; such pools come first, by priority.
    ServiceAllocation {
        /// The pool's priority (lower first; none: after every set priority).
        #[serde(skip_serializing_if = "Option::is_none")]
        priority: Option<u32>,
    },
    /// The first pool with `autoAssign: true` and free addresses, by name.
    AutoAssign,
}

impl Rule {
    /// The rule in words, for the text output.
    pub fn describe(&self) -> String {
        match self {
            Rule::RequestedIps { field } => format!("the Service requests these IPs ({field})"),
            Rule::AnnotatedPool { annotation } => format!("the Service names the pool ({annotation})"),
            Rule::ServiceAllocation { priority: Some(p) } => format!(
                "the pool's serviceAllocation admits the Service (priority {p}; such pools are tried first, lowest priority first)"
            ),
            Rule::ServiceAllocation { priority: None } => "the pool's serviceAllocation admits the Service (no priority: tried after the pools with one)".to_string(),
            Rule::AutoAssign => "the first pool with autoAssign: true and a free address, in name order, after pools with a serviceAllocation".to_string(),
        }
    }
}

/// How a Service got its addresses, or why it has none.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Allocation {
    /// The addresses in the Service's status (ingress IPs).
    pub ips: Vec<IpAddr>,
    /// The pool they come from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// The rule that chose the pool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<Rule>,
    /// The sharing key (`metallb.io/allow-shared-ip`), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sharing_key: Option<String>,
    /// Other Services holding one of these IPs (`namespace/name`).
    pub shared_with: Vec<String>,
    /// What is wrong, if anything.
    pub diagnoses: Vec<Diagnosis>,
}

/// Explains the addresses of `target` among `services` (every LoadBalancer Service of ours, the
/// target included) and `pools` (the validated configuration's, in the namespace
/// `pool_namespace`).
pub fn explain(
    pools: &[Pool],
    pool_namespace: &str,
    services: &[ServiceInput<'_>],
    target: &ServiceKey,
) -> Allocation {
    let input = services
        .iter()
        .find(|input| key_of(input.service).as_ref() == Some(target));
    Replay::new_without(pools, services, Some(target)).explain(pools, pool_namespace, input, target)
}

/// Every Service's addresses claimed as the controller re-claims them on start. Built once, it
/// explains any number of Services (`status` explains them all): each explanation takes its
/// Service out, decides, and puts it back, so the cost per Service does not grow with their
/// number.
pub struct Replay {
    allocator: Allocator,
    /// Who holds each address in its status.
    holders: BTreeMap<IpAddr, Vec<ServiceKey>>,
    /// The Services whose addresses were claimed, with them.
    claimed: BTreeMap<ServiceKey, Vec<IpAddr>>,
}

impl Replay {
    /// Claims the addresses of `services` (every LoadBalancer Service of ours) in `pools`.
    pub fn new(pools: &[Pool], services: &[ServiceInput<'_>]) -> Self {
        Self::new_without(pools, services, None)
    }

    /// [`Replay::new`], leaving `without`'s addresses unclaimed.
    fn new_without(
        pools: &[Pool],
        services: &[ServiceInput<'_>],
        without: Option<&ServiceKey>,
    ) -> Self {
        let mut allocator = Allocator::new(pools.to_vec());
        let mut holders: BTreeMap<IpAddr, Vec<ServiceKey>> = BTreeMap::new();
        let mut claimed = BTreeMap::new();
        for input in services {
            let Ok(parsed) = ServiceRequest::from_service(input.service, input.namespace_labels)
            else {
                continue;
            };
            let ips = status_ips(input.service);
            for ip in &ips {
                holders
                    .entry(*ip)
                    .or_default()
                    .push(parsed.request.key.clone());
            }
            if Some(&parsed.request.key) == without {
                continue;
            }
            // Services holding addresses keep them; one whose addresses are no longer valid is
            // left out, as the controller would clear it.
            if !ips.is_empty() && allocator.assign(&parsed.request, &ips).is_ok() {
                claimed.insert(parsed.request.key.clone(), ips);
            }
        }
        Self {
            allocator,
            holders,
            claimed,
        }
    }

    /// Whether another Service holding one of `ips` (the target's) in its status was left
    /// unclaimed, which happens when it conflicts with the target or a Service before it. Then
    /// the shared replay would not decide the target as if it came last (the other Service
    /// would have claimed first): explain it with [`explain`], a replay of its own.
    pub fn disputed(&self, target: &ServiceKey, ips: &[IpAddr]) -> bool {
        ips.iter()
            .flat_map(|ip| self.holders.get(ip).into_iter().flatten())
            .any(|holder| holder != target && !self.claimed.contains_key(holder))
    }

    /// Explains the addresses of `target`, whose input (`None`: no such Service of ours) is
    /// one of those this replay was built from. Only exact when not [`Replay::disputed`].
    pub fn explain(
        &mut self,
        pools: &[Pool],
        pool_namespace: &str,
        target_input: Option<&ServiceInput<'_>>,
        target: &ServiceKey,
    ) -> Allocation {
        // Decided as if the target came last, after every other Service's claim.
        self.allocator.release(target);
        let allocation = self.decide(pools, pool_namespace, target_input, target);
        // Back as it was, for the next Service.
        self.allocator.release(target);
        if let (Some(ips), Some(input)) = (self.claimed.get(target), target_input)
            && let Ok(parsed) = ServiceRequest::from_service(input.service, input.namespace_labels)
        {
            let _ = self.allocator.assign(&parsed.request, ips);
        }
        allocation
    }

    fn decide(
        &mut self,
        pools: &[Pool],
        pool_namespace: &str,
        target_input: Option<&ServiceInput<'_>>,
        target: &ServiceKey,
    ) -> Allocation {
        let service_ref = ObjectRef::namespaced("Service", target.namespace(), target.name());
        let Some(input) = target_input else {
            return Allocation::refused(
                Vec::new(),
                Diagnosis {
                    code: Code::BadRequest,
                    object: service_ref,
                    field: None,
                    problem: "no such LoadBalancer Service of ours".into(),
                    fix: "check the name, spec.type: LoadBalancer and spec.loadBalancerClass"
                        .into(),
                },
            );
        };
        let ips = status_ips(input.service);
        let request = match ServiceRequest::from_service(input.service, input.namespace_labels) {
            Ok(p) => p.request,
            Err(e) => {
                let text = e.to_string();
                let field = text.split(':').next().map(str::to_owned);
                return Allocation::refused(
                    ips,
                    Diagnosis {
                        code: Code::BadRequest,
                        object: service_ref,
                        field,
                        problem: text,
                        fix: "correct the Service's annotation or field named".into(),
                    },
                );
            }
        };
        // A Service holding addresses: they are claimed as the controller re-claims them (their pool
        // is where they are); one without: allocated as the controller would.
        let outcome = if ips.is_empty() {
            self.allocator.allocate(&request)
        } else {
            self.allocator.assign(&request, &ips)
        };
        let mut allocation = Allocation {
            ips: ips.clone(),
            pool: None,
            rule: None,
            sharing_key: request.sharing_key.as_deref().map(str::to_owned),
            shared_with: shared_with(&self.holders, &ips, target),
            diagnoses: Vec::new(),
        };
        match outcome {
            Ok(assignment) if !ips.is_empty() => {
                allocation.pool = Some(assignment.pool.to_string());
                allocation.rule = Some(rule(input.service, &request, pools, &assignment.pool));
            }
            Ok(assignment) => {
                allocation
                    .diagnoses
                    .push(not_assigned_yet(&assignment, service_ref));
            }
            Err(e) => {
                allocation.diagnoses.push(diagnose(
                    &e,
                    input.service,
                    &service_ref,
                    pool_namespace,
                ));
            }
        }
        allocation
    }
}

impl Allocation {
    /// No pool and no rule: only `diagnosis` says why.
    fn refused(ips: Vec<IpAddr>, diagnosis: Diagnosis) -> Self {
        Self {
            ips,
            pool: None,
            rule: None,
            sharing_key: None,
            shared_with: Vec::new(),
            diagnoses: vec![diagnosis],
        }
    }
}

/// The other Services holding any of `ips`, sorted.
fn shared_with(
    holders: &BTreeMap<IpAddr, Vec<ServiceKey>>,
    ips: &[IpAddr],
    target: &ServiceKey,
) -> Vec<String> {
    let mut shared_with: Vec<String> = ips
        .iter()
        .flat_map(|ip| holders.get(ip).into_iter().flatten())
        .filter(|holder| *holder != target)
        .map(ServiceKey::to_string)
        .collect();
    shared_with.sort();
    shared_with.dedup();
    shared_with
}

/// The allocator would give the Service `assignment`, but its status has no address yet: the
/// controller has not run (or not as leader).
fn not_assigned_yet(assignment: &Assignment, service_ref: ObjectRef) -> Diagnosis {
    let would: Vec<String> = assignment.ips.iter().map(IpAddr::to_string).collect();
    Diagnosis {
        code: Code::NotAssignedYet,
        object: service_ref,
        field: Some("status.loadBalancer.ingress".into()),
        problem: format!(
            "no address yet, though pool {:?} has {} for it",
            assignment.pool,
            would.join(",")
        ),
        fix: "check that a ferrolb controller runs and holds its leader Lease (kubectl -n <namespace> get lease), and its logs".into(),
    }
}

/// A Service field as `explain` names it: annotations as `metadata.annotations[...]`.
fn annotation_field(name: &str) -> String {
    if name.starts_with("spec.") {
        name.to_string()
    } else {
        format!("metadata.annotations[{name}]")
    }
}

fn key_of(service: &Service) -> Option<ServiceKey> {
    Some(ServiceKey::new(
        service.metadata.namespace.as_deref()?,
        service.metadata.name.as_deref()?,
    ))
}

/// Annotation `name` as written on the Service (current prefix first).
fn annotation_name(service: &Service, name: &str) -> Option<String> {
    let annotations = service.metadata.annotations.as_ref()?;
    [ANNOTATION_PREFIX, DEPRECATED_ANNOTATION_PREFIX]
        .iter()
        .map(|prefix| format!("{prefix}{name}"))
        .find(|a| annotations.contains_key(a))
}

fn rule(service: &Service, request: &ServiceRequest, pools: &[Pool], pool: &str) -> Rule {
    if !request.requested_ips.is_empty() {
        return Rule::RequestedIps {
            field: annotation_name(service, LOAD_BALANCER_IPS)
                .unwrap_or_else(|| "spec.loadBalancerIP".into()),
        };
    }
    if request.pool.is_some() {
        return Rule::AnnotatedPool {
            annotation: annotation_name(service, ADDRESS_POOL)
                .unwrap_or_else(|| format!("{ANNOTATION_PREFIX}{ADDRESS_POOL}")),
        };
    }
    match pools
        .iter()
        .find(|p| p.name == pool)
        .and_then(|p| p.allocation.as_ref())
    {
        Some(a) => Rule::ServiceAllocation {
            priority: a.priority.filter(|p| *p > 0),
        },
        None => Rule::AutoAssign,
    }
}

/// The allocator's refusal as a diagnosis naming the object and field at fault.
fn diagnose(
    e: &AllocationError,
    service: &Service,
    service_ref: &ObjectRef,
    pool_namespace: &str,
) -> Diagnosis {
    let pool_ref = |pool: &str| ObjectRef::namespaced("IPAddressPool", pool_namespace, pool);
    let requested_field = || {
        annotation_name(service, LOAD_BALANCER_IPS).unwrap_or_else(|| "spec.loadBalancerIP".into())
    };
    let pool_annotation = || {
        annotation_name(service, ADDRESS_POOL)
            .unwrap_or_else(|| format!("{ANNOTATION_PREFIX}{ADDRESS_POOL}"))
    };
    let problem = e.to_string();
    let (code, object, field, fix) = match e {
        AllocationError::PoolExhausted { pool, .. } => (
            Code::PoolExhausted,
            pool_ref(pool),
            Some("spec.addresses".to_string()),
            "add addresses to the pool, or delete Services that hold some".to_string(),
        ),
        AllocationError::AllPoolsExhausted { pools } => (
            Code::PoolExhausted,
            pools
                .first()
                .map(|p| pool_ref(p))
                .unwrap_or_else(|| service_ref.clone()),
            Some("spec.addresses".to_string()),
            format!(
                "add addresses to one of these pools ({}), or add a pool",
                pools.join(", ")
            ),
        ),
        AllocationError::NoPoolAdmits { .. } => (
            Code::NoPoolMatches,
            service_ref.clone(),
            None,
            format!(
                "create an IPAddressPool with autoAssign: true whose serviceAllocation admits this Service, or name a pool with {ANNOTATION_PREFIX}{ADDRESS_POOL}"
            ),
        ),
        AllocationError::NoPoolForFamily { family } => (
            Code::NoPoolForFamily,
            service_ref.clone(),
            Some("spec.ipFamilies".to_string()),
            format!("add {family} addresses to a pool this Service may use, or change spec.ipFamilies / spec.ipFamilyPolicy"),
        ),
        AllocationError::DualStackNotPossible => (
            Code::NoPoolForFamily,
            service_ref.clone(),
            Some("spec.ipFamilyPolicy".to_string()),
            "give a pool this Service may use both IPv4 and IPv6 addresses, or use PreferDualStack".to_string(),
        ),
        AllocationError::FamilyNotInPool { pool, family } => (
            Code::NoPoolForFamily,
            pool_ref(pool),
            Some("spec.addresses".to_string()),
            format!("add {family} addresses to the pool, or change the Service's spec.ipFamilies"),
        ),
        AllocationError::UnknownPool { .. } => (
            Code::UnknownPool,
            service_ref.clone(),
            Some(format!("metadata.annotations[{}]", pool_annotation())),
            "name an existing IPAddressPool (kubectl get ipaddresspools -A)".to_string(),
        ),
        AllocationError::PoolDoesNotAdmit { pool, .. } => (
            Code::PoolDoesNotAdmit,
            pool_ref(pool),
            Some("spec.serviceAllocation".to_string()),
            "admit the Service's namespace or labels in the pool's serviceAllocation, or name another pool".to_string(),
        ),
        AllocationError::IpNotInAnyPool { .. } => (
            Code::IpOutsidePools,
            service_ref.clone(),
            Some(annotation_field(&requested_field())),
            "request an IP inside a pool (kubectl get ipaddresspools -A), or add a pool holding it".to_string(),
        ),
        AllocationError::IpNotInAnnotatedPool { pool, .. } => (
            Code::IpOutsidePools,
            service_ref.clone(),
            Some(annotation_field(&requested_field())),
            format!("request an IP from pool {pool:?}, or change {} to the pool that holds it", pool_annotation()),
        ),
        AllocationError::IpInUse { holder, .. } => (
            Code::SharingRefused,
            service_ref.clone(),
            Some(format!("metadata.annotations[{ANNOTATION_PREFIX}allow-shared-ip]")),
            format!(
                "to share with {holder}: give both Services the same {ANNOTATION_PREFIX}allow-shared-ip key, different ports, and the same externalTrafficPolicy (Local: the same selector); or request another IP"
            ),
        ),
        _ => (
            Code::AllocationFailed,
            service_ref.clone(),
            None,
            "correct what the message names".to_string(),
        ),
    };
    Diagnosis {
        code,
        object,
        field,
        problem,
        fix,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use ferrolb_testkit::model::pool;
    use ferrolb_testkit::objects;

    use super::*;

    const NS: &str = "metallb-system";

    /// A LoadBalancer Service `web/name` on port 80 with these annotations and status IPs
    /// (the annotation map and the ingress list are present even when empty).
    fn service(name: &str, annotations: &[(&str, &str)], ips: &[&str]) -> Service {
        objects::service(name)
            .namespace("web")
            .annotations(annotations.iter().copied())
            .port(80, "TCP")
            .ingress(ips)
            .build()
    }

    fn run(pools: &[Pool], services: &[Service], target: &str) -> Allocation {
        let labels = Labels::new();
        let inputs: Vec<ServiceInput<'_>> = services
            .iter()
            .map(|service| ServiceInput {
                service,
                namespace_labels: &labels,
            })
            .collect();
        explain(pools, NS, &inputs, &ServiceKey::new("web", target))
    }

    fn codes(a: &Allocation) -> Vec<Code> {
        a.diagnoses.iter().map(|d| d.code).collect()
    }

    #[test]
    fn an_automatic_address_names_its_pool_and_rule() {
        let pools = [pool("default", &["198.18.200.0/24"])];
        let a = run(&pools, &[service("a", &[], &["198.18.200.0"])], "a");
        assert_eq!(a.pool.as_deref(), Some("default"));
        assert_eq!(a.rule, Some(Rule::AutoAssign));
        assert!(a.diagnoses.is_empty(), "{:?}", a.diagnoses);
    }

    /// The pool is where the Service's address is, not where a new one would come from.
    #[test]
    fn a_held_address_names_the_pool_that_holds_it() {
        let pools = [
            pool("aaa", &["198.18.199.0/24"]),
            pool("default", &["198.18.200.0/24"]),
        ];
        let a = run(&pools, &[service("a", &[], &["198.18.200.5"])], "a");
        assert_eq!(a.pool.as_deref(), Some("default"));
        assert!(a.diagnoses.is_empty(), "{:?}", a.diagnoses);
        // An address no pool holds any more is a problem, as the controller would clear it.
        let gone = run(&pools, &[service("a", &[], &["198.18.250.5"])], "a");
        assert_eq!(codes(&gone), [Code::IpOutsidePools]);
    }

    #[test]
    fn requested_and_annotated_pools_are_the_rule() {
        let pools = [
            pool("a", &["198.18.200.0/24"]),
            pool("b", &["198.18.201.0/24"]),
        ];
        let requested = service(
            "r",
            &[("metallb.io/loadBalancerIPs", "198.18.201.7")],
            &["198.18.201.7"],
        );
        let named = service(
            "n",
            &[("metallb.universe.tf/address-pool", "b")],
            &["198.18.201.0"],
        );
        let all = [requested, named];
        let r = run(&pools, &all, "r");
        assert_eq!(
            r.rule,
            Some(Rule::RequestedIps {
                field: "metallb.io/loadBalancerIPs".into()
            })
        );
        assert_eq!(r.pool.as_deref(), Some("b"));
        let n = run(&pools, &all, "n");
        assert_eq!(
            n.rule,
            Some(Rule::AnnotatedPool {
                annotation: "metallb.universe.tf/address-pool".into()
            })
        );
    }

    #[test]
    fn a_pool_with_service_allocation_says_its_priority() {
        let mut first = pool("z-first", &["198.18.202.0/24"]);
        first.allocation = Some(ferrolb_config::model::PoolAllocation {
            priority: Some(5),
            ..Default::default()
        });
        let pools = [pool("a", &["198.18.200.0/24"]), first];
        let a = run(&pools, &[service("a", &[], &["198.18.202.0"])], "a");
        assert_eq!(a.rule, Some(Rule::ServiceAllocation { priority: Some(5) }));
        assert!(a.rule.unwrap().describe().contains("priority 5"));
    }

    /// The only address is held by another Service: the pool is named as the object at fault.
    #[test]
    fn an_exhausted_pool_is_named() {
        let pools = [pool("tiny", &["198.18.200.9/32"])];
        let a = run(
            &pools,
            &[
                service("holder", &[], &["198.18.200.9"]),
                service("pending", &[], &[]),
            ],
            "pending",
        );
        assert_eq!(codes(&a), [Code::PoolExhausted]);
        let d = &a.diagnoses[0];
        assert_eq!(d.object.to_string(), "IPAddressPool metallb-system/tiny");
        assert_eq!(d.field.as_deref(), Some("spec.addresses"));
        assert!(d.fix.contains("tiny"), "{d}");
    }

    #[test]
    fn a_requested_ip_outside_every_pool_names_the_annotation() {
        let pools = [pool("default", &["198.18.200.0/24"])];
        let a = run(
            &pools,
            &[service(
                "a",
                &[("metallb.io/loadBalancerIPs", "198.18.250.1")],
                &[],
            )],
            "a",
        );
        assert_eq!(codes(&a), [Code::IpOutsidePools]);
        assert_eq!(
            a.diagnoses[0].field.as_deref(),
            Some("metadata.annotations[metallb.io/loadBalancerIPs]")
        );
        assert!(a.diagnoses[0].problem.contains("198.18.250.1"));
    }

    #[test]
    fn an_unknown_pool_names_the_annotation() {
        let pools = [pool("default", &["198.18.200.0/24"])];
        let a = run(
            &pools,
            &[service("a", &[("metallb.io/address-pool", "nope")], &[])],
            "a",
        );
        assert_eq!(codes(&a), [Code::UnknownPool]);
        assert_eq!(
            a.diagnoses[0].field.as_deref(),
            Some("metadata.annotations[metallb.io/address-pool]")
        );
    }

    /// Requested IP held by a Service without a sharing key: refused, and the holder named.
    #[test]
    fn sharing_refused_names_the_holder() {
        let pools = [pool("default", &["198.18.200.0/24"])];
        let a = run(
            &pools,
            &[
                service("holder", &[], &["198.18.200.3"]),
                service(
                    "b",
                    &[
                        ("metallb.io/loadBalancerIPs", "198.18.200.3"),
                        ("metallb.io/allow-shared-ip", "k"),
                    ],
                    &[],
                ),
            ],
            "b",
        );
        assert_eq!(codes(&a), [Code::SharingRefused]);
        assert!(
            a.diagnoses[0].fix.contains("web/holder"),
            "{}",
            a.diagnoses[0]
        );
    }

    /// Two Services with one key and different ports share; each names the other.
    #[test]
    fn shared_ips_name_the_other_services() {
        let pools = [pool("default", &["198.18.200.0/24"])];
        let sharing = |name: &str, port: i32| {
            objects::service(name)
                .namespace("web")
                .annotation("metallb.io/allow-shared-ip", "k")
                .port(port, "TCP")
                .ingress(&["198.18.200.4"])
                .build()
        };
        let a = run(&pools, &[sharing("one", 80), sharing("two", 443)], "two");
        assert_eq!(a.shared_with, ["web/one"]);
        assert_eq!(a.sharing_key.as_deref(), Some("k"));
        assert!(a.diagnoses.is_empty(), "{:?}", a.diagnoses);
    }

    /// Nothing stops allocation, yet there is no address: the controller is the suspect.
    #[test]
    fn an_allocatable_service_without_address_points_at_the_controller() {
        let pools = [pool("default", &["198.18.200.0/24"])];
        let a = run(&pools, &[service("a", &[], &[])], "a");
        assert_eq!(codes(&a), [Code::NotAssignedYet]);
        assert!(a.diagnoses[0].problem.contains("198.18.200.0"));
        assert!(a.diagnoses[0].fix.contains("leader Lease"));
    }

    #[test]
    fn no_pool_admitting_the_service_is_said() {
        let mut manual = pool("manual", &["198.18.200.0/24"]);
        manual.auto_assign = false;
        let a = run(&[manual], &[service("a", &[], &[])], "a");
        assert_eq!(codes(&a), [Code::NoPoolMatches]);
        assert!(a.diagnoses[0].fix.contains("metallb.io/address-pool"));
    }

    #[test]
    fn the_json_schema_is_stable() {
        let pools = [pool("tiny", &["198.18.200.9/32"])];
        let a = run(
            &pools,
            &[
                service("holder", &[], &["198.18.200.9"]),
                service("pending", &[], &[]),
            ],
            "pending",
        );
        let json = serde_json::to_value(&a).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "ips": [],
                "shared_with": [],
                "diagnoses": [{
                    "code": "pool-exhausted",
                    "object": {"kind": "IPAddressPool", "namespace": "metallb-system", "name": "tiny"},
                    "field": "spec.addresses",
                    "problem": "no free address: every pool this Service may use is full (tiny)",
                    "fix": "add addresses to one of these pools (tiny), or add a pool",
                }],
            })
        );
    }
}
