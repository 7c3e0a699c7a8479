//! One step of the layer 2 work loop as pure code: from what the caches, the heartbeats and the
//! interfaces say, to the members planning counts, the status this node reports, the announced
//! metric's label sets and the failures worth an Event. Layer 2's part of the work loop
//! (`l2/work.rs`) only gathers the inputs and carries the results out (sockets, API writes,
//! metrics).
//!
//! Who may own IPs at all (settling, the quorum rule, the claim delay, tenure, flap damping) is
//! [`crate::l2::gate`]'s; [`Settling`] and [`members`] are its building blocks here. Rules that
//! live here:
//! * A node reports (ServiceL2Status) exactly the Services of the IPs it announces, with the
//!   interfaces it announces them on, in the plan's order, without repeats.
//! * A failure to announce on an interface is reported once per Service and interface while it
//!   lasts, and again if it comes back after it cleared.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use ferrolb_config::allocator::ServiceKey;
use ferrolb_layer2::liveness::Member;
use ferrolb_layer2::quorum::Verdict;

use crate::l2::plan::Plan;
use crate::view::{ServiceObject, ServiceView, SliceObject};

/// The settle wait, shared with the simulator and the voters' rules.
pub use ferrolb_layer2::settling::Settling;

/// The views of the cached (reduced) Services and EndpointSlices.
pub fn views(services: &[Arc<ServiceObject>], slices: &[Arc<SliceObject>]) -> Vec<ServiceView> {
    let mut by_service: HashMap<&ServiceKey, Vec<&SliceObject>> = HashMap::new();
    for slice in slices {
        by_service.entry(&slice.service).or_default().push(slice);
    }
    services
        .iter()
        .map(|svc| {
            let own = by_service
                .get(&svc.key)
                .map(Vec::as_slice)
                .unwrap_or_default();
            ServiceView::from_objects(svc, own.iter().copied())
        })
        .collect()
}

/// The speakers planning counts: the quorum rule's candidates, this node among them only when
/// it `claims` (see [`Settling`] for the claim delay).
pub fn members(verdict: &Verdict, me: &str, claims: bool) -> BTreeMap<String, Member> {
    verdict
        .candidates
        .iter()
        .filter(|(name, _)| claims || name.as_str() != me)
        .map(|(name, interfaces)| {
            (
                name.clone(),
                Member {
                    interfaces: interfaces.clone().unwrap_or_default(),
                    interfaces_unknown: interfaces.is_none(),
                },
            )
        })
        .collect()
}

/// One Service this node announces, as its ServiceL2Status says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owned {
    /// The Service's UID, so Events attach to this incarnation of it.
    pub uid: Option<String>,
    /// Interfaces it is announced on.
    pub interfaces: Vec<String>,
    /// The node this one took the Service from, as its plans saw it
    /// (`Planner::taken_from`): whose ServiceL2Status to delete when it takes it. `None`:
    /// unknown, the writer looks for other nodes' objects instead.
    pub taken_from: Option<String>,
}

/// What the node announces, by Service.
pub type Reported = BTreeMap<ServiceKey, Owned>;

/// What this node reports for `plan`; `taken_from` says whom it took each Service from.
pub fn reported<'a>(
    plan: &Plan,
    uid: impl Fn(&ServiceKey) -> Option<String>,
    taken_from: impl Fn(&ServiceKey) -> Option<&'a str>,
) -> Reported {
    let mut out = Reported::new();
    for a in plan.announce.values() {
        for key in &a.services {
            let entry = out.entry(key.clone()).or_insert_with(|| Owned {
                uid: uid(key),
                interfaces: Vec::new(),
                taken_from: taken_from(key).map(str::to_string),
            });
            for i in &a.interfaces {
                if !entry.interfaces.contains(i) {
                    entry.interfaces.push(i.clone());
                }
            }
        }
    }
    out
}

/// Every (Service, IP) this node announces: the label sets of `metallb_speaker_announced`.
pub fn announced(plan: &Plan) -> BTreeSet<(ServiceKey, IpAddr)> {
    plan.announce
        .iter()
        .flat_map(|(ip, a)| a.services.iter().map(move |key| (key.clone(), *ip)))
        .collect()
}

/// A failure to announce that deserves an Event on a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailureReport {
    /// The Service.
    pub service: ServiceKey,
    /// The interface.
    pub interface: String,
    /// The Event's message.
    pub message: String,
}

/// Remembers which (Service, interface) failures are reported and still failing, so each
/// failure gets one Event while it lasts, and one again if it comes back after it cleared. What
/// no longer fails (fixed, or the Service or interface gone) is forgotten at the next step.
#[derive(Clone, Debug, Default)]
pub struct FailureLog {
    reported: BTreeSet<(ServiceKey, String)>,
}

impl FailureLog {
    /// The reports not made before for `failures` (interface, error) on the IPs of `plan`;
    /// `failures` is everything failing in this step.
    pub fn new_reports(
        &mut self,
        plan: &Plan,
        failures: &[(String, String)],
    ) -> Vec<FailureReport> {
        let mut out = Vec::new();
        let mut failing = BTreeSet::new();
        for (interface, error) in failures {
            for a in plan
                .announce
                .values()
                .filter(|a| a.interfaces.contains(interface))
            {
                for key in &a.services {
                    let pair = (key.clone(), interface.clone());
                    if !self.reported.contains(&pair) && !failing.contains(&pair) {
                        out.push(FailureReport {
                            service: key.clone(),
                            interface: interface.clone(),
                            message: format!("cannot announce on interface {interface}: {error}"),
                        });
                    }
                    failing.insert(pair);
                }
            }
        }
        self.reported = failing;
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::l2::plan::Announcement;
    use ferrolb_testkit::objects;
    use std::time::{Duration, Instant};

    fn key(name: &str) -> ServiceKey {
        ServiceKey::new("default", name)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn names(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    /// A plan announcing each (IP, Services, interfaces).
    fn plan(entries: &[(&str, &[&str], &[&str])]) -> Plan {
        Plan {
            announce: entries
                .iter()
                .map(|(addr, services, interfaces)| {
                    (
                        ip(addr),
                        Announcement {
                            interfaces: names(interfaces).into_iter().collect(),
                            services: services.iter().map(|s| key(s)).collect(),
                        },
                    )
                })
                .collect(),
            services: BTreeMap::new(),
        }
    }

    #[test]
    fn a_node_owns_nothing_until_a_failure_timeout_after_it_can_announce() {
        let t0 = Instant::now();
        let wait = Duration::from_millis(500);
        let mut s = Settling::default();
        assert!(!s.observe(false, t0, wait));
        assert!(
            !s.observe(true, t0, wait),
            "able now, but has not heard the others"
        );
        assert_eq!(s.wake_at(t0), Some(t0 + wait));
        assert!(!s.observe(true, t0 + Duration::from_millis(499), wait));
        assert!(s.observe(true, t0 + wait, wait));
        assert_eq!(s.wake_at(t0 + wait), None);
    }

    #[test]
    fn losing_every_usable_interface_starts_the_wait_over() {
        let t0 = Instant::now();
        let wait = Duration::from_millis(500);
        let mut s = Settling::default();
        s.observe(true, t0, wait);
        assert!(s.observe(true, t0 + wait, wait));
        assert!(!s.observe(false, t0 + wait * 2, wait));
        assert!(
            !s.observe(true, t0 + wait * 3, wait),
            "waits again after coming back"
        );
        assert!(s.observe(true, t0 + wait * 4, wait));
    }

    #[test]
    fn this_node_counts_among_the_members_only_when_it_claims() {
        let usable = names(&["eth0"]);
        let verdict = Verdict {
            quorum: true,
            up: true,
            candidates: BTreeMap::from([
                ("node1".to_string(), Some(usable.clone())),
                ("node2".to_string(), Some(BTreeSet::new())),
                ("node3".to_string(), None),
            ]),
        };
        let not_yet = members(&verdict, "node1", false);
        assert_eq!(not_yet.keys().collect::<Vec<_>>(), ["node2", "node3"]);
        let claims = members(&verdict, "node1", true);
        assert_eq!(
            claims.keys().collect::<Vec<_>>(),
            ["node1", "node2", "node3"]
        );
        assert_eq!(claims["node1"].interfaces, usable);
        assert!(!claims["node2"].interfaces_unknown);
        assert!(claims["node3"].interfaces_unknown);
    }

    #[test]
    fn the_report_names_each_announced_service_once_with_all_its_interfaces() {
        let p = plan(&[
            ("198.18.200.1", &["web", "shared"], &["eth0"]),
            ("fd00:18::c8:1", &["web"], &["eth0", "eth1"]),
            ("198.18.200.2", &["shared"], &["eth1"]),
        ]);
        let uids = HashMap::from([(key("web"), Some("uid-web".to_string()))]);
        let uid = |k: &ServiceKey| uids.get(k).cloned().flatten();
        let r = reported(&p, uid, |k| (k.name() == "web").then_some("node2"));
        assert_eq!(r.len(), 2);
        assert_eq!(r[&key("web")].uid.as_deref(), Some("uid-web"));
        assert_eq!(r[&key("web")].taken_from.as_deref(), Some("node2"));
        assert_eq!(r[&key("shared")].taken_from, None);
        assert_eq!(r[&key("web")].interfaces, ["eth0", "eth1"]);
        assert_eq!(r[&key("shared")].uid, None);
        assert_eq!(r[&key("shared")].interfaces, ["eth0", "eth1"]);
    }

    #[test]
    fn nothing_announced_reports_nothing() {
        assert!(reported(&Plan::default(), |_| None, |_| None).is_empty());
        assert!(announced(&Plan::default()).is_empty());
    }

    #[test]
    fn announced_label_sets_are_every_service_and_ip_pair() {
        let p = plan(&[
            ("198.18.200.1", &["a", "b"], &["eth0"]),
            ("198.18.200.2", &["a"], &["eth0"]),
        ]);
        assert_eq!(
            announced(&p),
            BTreeSet::from([
                (key("a"), ip("198.18.200.1")),
                (key("b"), ip("198.18.200.1")),
                (key("a"), ip("198.18.200.2")),
            ])
        );
    }

    #[test]
    fn a_failure_is_reported_once_per_service_and_interface() {
        let p = plan(&[
            ("198.18.200.1", &["a", "b"], &["eth0"]),
            ("198.18.200.2", &["c"], &["eth1"]),
        ]);
        let mut log = FailureLog::default();
        let failure = vec![("eth0".to_string(), "link down".to_string())];
        let first = log.new_reports(&p, &failure);
        assert_eq!(
            first.iter().map(|r| r.service.name()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(
            first[0].message,
            "cannot announce on interface eth0: link down"
        );
        assert!(log.new_reports(&p, &failure).is_empty(), "already reported");
        let other = vec![("eth1".to_string(), "gone".to_string())];
        assert_eq!(log.new_reports(&p, &other).len(), 1, "c on eth1 is new");
    }

    /// Issue 33: the log was never pruned (it grew with every Service that ever failed) and a
    /// failure that cleared and came back was never reported again.
    #[test]
    fn a_failure_that_clears_and_comes_back_is_reported_again_and_gone_ones_are_forgotten() {
        let p = plan(&[("198.18.200.1", &["a"], &["eth0"])]);
        let mut log = FailureLog::default();
        let failure = vec![("eth0".to_string(), "link down".to_string())];
        assert_eq!(log.new_reports(&p, &failure).len(), 1);
        assert!(log.new_reports(&p, &failure).is_empty(), "still failing");
        assert!(log.new_reports(&p, &[]).is_empty(), "cleared");
        assert!(log.reported.is_empty(), "kept {:?}", log.reported);
        assert_eq!(log.new_reports(&p, &failure).len(), 1, "failing again");
        // The Service leaves the plan: its entry goes with it.
        let empty = plan(&[]);
        assert!(log.new_reports(&empty, &failure).is_empty());
        assert!(log.reported.is_empty(), "kept {:?}", log.reported);
    }

    /// A Service as the watch keeps it (`None`: not kept).
    fn service(name: &str, uid: &str, ips: &[&str]) -> Option<Arc<ServiceObject>> {
        let svc = objects::service(name)
            .namespace("default")
            .uid(uid)
            .ingress(ips)
            .build();
        ServiceObject::reduce(&svc, None).map(Arc::new)
    }

    fn slice(service: &str, node: &str) -> Arc<SliceObject> {
        let slice = objects::endpoint_slice(&format!("{service}-x"))
            .namespace("default")
            .service(service)
            .endpoint(
                objects::endpoint("198.19.1.10")
                    .node(node)
                    .ready(true)
                    .serving(true),
            )
            .build();
        Arc::new(SliceObject::reduce(&slice).unwrap())
    }

    #[test]
    fn views_pair_each_service_with_its_own_slices_and_skip_services_without_ips() {
        let pending = service("pending", "u2", &[]);
        assert!(pending.is_none(), "a Service without IPs is not kept");
        let kept: Vec<_> = [service("web", "u1", &["198.18.200.1"]), pending]
            .into_iter()
            .flatten()
            .collect();
        let v = views(&kept, &[slice("web", "node2"), slice("other", "node3")]);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].key, key("web"));
        assert_eq!(v[0].serving_nodes, names(&["node2"]));
        assert_eq!(v[0].uid.as_deref(), Some("u1"));
    }
}
