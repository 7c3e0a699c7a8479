//! The checkers over a nemesis run's recorded history (issue #36, item 2). Pure: they read
//! what the recorder saw (times in milliseconds from the start of the run) and the schedule,
//! and return every violation, each naming the IP, Service or process and the time.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::schedule::{Reach, Window};

/// One observation, as the recorder writes it (one JSON line each).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "what", rename_all = "snake_case")]
pub enum Observation {
    /// One ARP (IPv4) or NDP (IPv6) exchange for `ip`: the nodes whose MACs answered (a MAC
    /// of no node is kept as the MAC).
    Neighbour {
        /// Milliseconds from the start of the run.
        at: u64,
        /// The IP asked for.
        ip: IpAddr,
        /// Who answered.
        answered_by: Vec<String>,
    },
    /// Datagrams to `ip`'s echo port: one answered or not at `at`, or, with `until`, answers
    /// from `at` to `until` with no gap longer than the recorder's thinning gap between them
    /// (the recorder keeps runs, not every answer).
    Echo {
        /// Milliseconds from the start of the run.
        at: u64,
        /// The Service IP.
        ip: IpAddr,
        /// Whether the pods answered.
        answered: bool,
        /// The last answer of a run that began at `at`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        until: Option<u64>,
    },
    /// A Service's ingress IPs as its watch delivered them (empty: none, or deleted).
    ServiceIps {
        /// Milliseconds from the start of the run.
        at: u64,
        /// `namespace/name`.
        service: String,
        /// Its `metallb.io/allow-shared-ip` key, if any.
        sharing_key: Option<String>,
        /// The IPs in its status.
        ips: Vec<IpAddr>,
    },
    /// The workload changed a Service in a way that may move its IPs (requested IPs, pool,
    /// sharing key, type, deletion), or created it.
    ServiceEdited {
        /// Milliseconds from the start of the run.
        at: u64,
        /// `namespace/name`.
        service: String,
    },
    /// A process's resident memory.
    Rss {
        /// Milliseconds from the start of the run.
        at: u64,
        /// The process, as the lab names it (`speaker@node1`).
        process: String,
        /// Bytes.
        bytes: u64,
    },
}

/// A run's record: the schedule that ran and what was seen.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct History {
    /// The faults, as injected.
    pub faults: Vec<Window>,
    /// What the recorder saw, in any order.
    pub observations: Vec<Observation>,
    /// The run's length, milliseconds.
    pub run: u64,
    /// The cluster's nodes (how many faulted nodes can cost a healthy node its quorum).
    #[serde(default)]
    pub nodes: Vec<String>,
}

/// The bounds the checkers hold the run to.
#[derive(Clone, Debug)]
pub struct Bounds {
    /// A gap in the echo answers longer than this is an outage.
    pub outage: Duration,
    /// How long a fault may still cause outages after it is undone (an IP moving back to a
    /// healed node, a restarted speaker claiming).
    pub after_heal: Duration,
    /// Every IP answers again within this time after the last fault is undone.
    pub recovery: Duration,
    /// A process's memory may grow this much (as a fraction of the first third's median)
    /// from the first third of the run to the last, and at least [`Bounds::growth_floor`].
    pub growth: f64,
    /// Growth below this many bytes is never a violation (allocator noise).
    pub growth_floor: u64,
    /// How long after an edit of a Service its IPs may change (the API server and the
    /// controller's leader may be among the faults meanwhile).
    pub edit_effect: Duration,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            outage: Duration::from_millis(50),
            after_heal: Duration::from_secs(10),
            recovery: Duration::from_secs(5),
            growth: 0.2,
            growth_floor: 4 << 20,
            edit_effect: Duration::from_secs(60),
        }
    }
}

/// A broken promise, with what the history shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Two nodes answered for one IP in one exchange.
    TwoOwners {
        /// When.
        at: u64,
        /// The IP.
        ip: IpAddr,
        /// Who answered.
        answered_by: Vec<String>,
    },
    /// One IP in the status of two Services that do not share it.
    IpOnTwoServices {
        /// When the second got it.
        at: u64,
        /// The IP.
        ip: IpAddr,
        /// The two Services.
        services: [String; 2],
    },
    /// A Service's IPs changed although nothing asked for it.
    IpChanged {
        /// When.
        at: u64,
        /// The Service.
        service: String,
        /// Its IPs before and after.
        from: Vec<IpAddr>,
        /// Its IPs after.
        to: Vec<IpAddr>,
    },
    /// An IP still unanswered [`Bounds::recovery`] after the last fault was undone.
    NotRecovered {
        /// The IP.
        ip: IpAddr,
        /// The ARP/NDP answers (else the echo answers).
        neighbour: bool,
        /// The last answer before the silence that lasted past the bound (none: never
        /// answered).
        last_answer: Option<u64>,
    },
    /// An outage that no fault in force (or just undone) can explain.
    UnexplainedOutage {
        /// The IP.
        ip: IpAddr,
        /// The last answer before the gap and the first after it.
        from: u64,
        /// The first answer after it (the run's end if none).
        to: u64,
        /// Who answered for the IP when it began, as last seen.
        owner: Option<String>,
    },
    /// A process's memory grew past the bound.
    MemoryGrowth {
        /// The process.
        process: String,
        /// Median bytes over the first and the last third of the run.
        first: u64,
        /// Median over the last third.
        last: u64,
    },
}

impl Violation {
    /// The violation's kind, as the summary groups them.
    pub fn kind(&self) -> &'static str {
        match self {
            Violation::TwoOwners { .. } => "two owners for one IP",
            Violation::IpOnTwoServices { .. } => "one IP on two Services",
            Violation::IpChanged { .. } => "an IP changed under a running Service",
            Violation::NotRecovered { .. } => "not answered again after the last heal",
            Violation::UnexplainedOutage { .. } => "an outage no fault explains",
            Violation::MemoryGrowth { .. } => "memory growth",
        }
    }
}

/// Every violation in `history`, checker by checker.
pub fn check(history: &History, bounds: &Bounds) -> Vec<Violation> {
    let mut v = two_owners(history);
    v.extend(ip_on_two_services(history));
    v.extend(ip_changed(history, bounds));
    v.extend(recovery(history, bounds));
    v.extend(unexplained_outages(history, bounds));
    v.extend(memory_growth(history, bounds));
    v
}

/// Never two nodes answering for one IP in one exchange.
pub fn two_owners(history: &History) -> Vec<Violation> {
    history
        .observations
        .iter()
        .filter_map(|o| match o {
            Observation::Neighbour {
                at,
                ip,
                answered_by,
            } => {
                let distinct: BTreeSet<&String> = answered_by.iter().collect();
                (distinct.len() > 1).then(|| Violation::TwoOwners {
                    at: *at,
                    ip: *ip,
                    answered_by: distinct.into_iter().cloned().collect(),
                })
            }
            _ => None,
        })
        .collect()
}

/// The observations in time order (the recorder's tasks write them interleaved).
fn in_order(history: &History) -> Vec<&Observation> {
    let mut all: Vec<&Observation> = history.observations.iter().collect();
    all.sort_by_key(|o| at(o));
    all
}

fn at(o: &Observation) -> u64 {
    match o {
        Observation::Neighbour { at, .. }
        | Observation::Echo { at, .. }
        | Observation::ServiceIps { at, .. }
        | Observation::ServiceEdited { at, .. }
        | Observation::Rss { at, .. } => *at,
    }
}

/// Never one IP in two Services' status at once, unless both carry the same sharing key.
pub fn ip_on_two_services(history: &History) -> Vec<Violation> {
    let mut holding: BTreeMap<&str, (&Option<String>, &Vec<IpAddr>)> = BTreeMap::new();
    let mut out = Vec::new();
    for o in in_order(history) {
        let Observation::ServiceIps {
            at,
            service,
            sharing_key,
            ips,
        } = o
        else {
            continue;
        };
        for (other, (key, theirs)) in &holding {
            if *other == service.as_str() {
                continue;
            }
            let shared = sharing_key.is_some() && sharing_key == *key;
            for ip in ips.iter().filter(|ip| theirs.contains(ip)) {
                if !shared {
                    out.push(Violation::IpOnTwoServices {
                        at: *at,
                        ip: *ip,
                        services: [(*other).to_string(), service.clone()],
                    });
                }
            }
        }
        holding.insert(service, (sharing_key, ips));
    }
    out
}

/// A Service's IPs change only after the workload edited (or created) it: never under a running
/// Service. A Service with no IP yet getting its first is no change. An edit allows one change
/// within [`Bounds::edit_effect`]: an update that leaves the IPs as they are (the edit's own
/// watch event) does not spend it, and an edit that never takes effect (refused while the API
/// server was down) does not allow a change for the rest of the run.
pub fn ip_changed(history: &History, bounds: &Bounds) -> Vec<Violation> {
    let mut last: BTreeMap<&str, &Vec<IpAddr>> = BTreeMap::new();
    // The latest edit of each Service not spent yet.
    let mut edited: BTreeMap<&str, u64> = BTreeMap::new();
    let mut out = Vec::new();
    for o in in_order(history) {
        match o {
            Observation::ServiceEdited { at, service } => {
                edited.insert(service, *at);
            }
            Observation::ServiceIps {
                at, service, ips, ..
            } => {
                let before = last.insert(service, ips);
                let changed = before.is_some_and(|b| !b.is_empty() && b != ips);
                let allowed = edited
                    .get(service.as_str())
                    .is_some_and(|t| at.saturating_sub(*t) <= ms(bounds.edit_effect));
                if changed && !allowed {
                    out.push(Violation::IpChanged {
                        at: *at,
                        service: service.clone(),
                        from: before.cloned().unwrap_or_default(),
                        to: ips.clone(),
                    });
                }
                if changed || before.is_some_and(|b| b.is_empty() && !ips.is_empty()) {
                    // The edit has taken effect: a later change needs a later edit.
                    edited.remove(service.as_str());
                }
            }
            _ => {}
        }
    }
    out
}

/// The echo probes per IP, in time order, as (first, last, answered): a run of answers from
/// first to last, or one probe (first == last).
fn echoes(history: &History) -> BTreeMap<IpAddr, Vec<(u64, u64, bool)>> {
    let mut per_ip: BTreeMap<IpAddr, Vec<(u64, u64, bool)>> = BTreeMap::new();
    for o in in_order(history) {
        if let Observation::Echo {
            at,
            ip,
            answered,
            until,
        } = o
        {
            let last = until.unwrap_or(*at).max(*at);
            per_ip.entry(*ip).or_default().push((*at, last, *answered));
        }
    }
    per_ip
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Every IP probed after the last fault is undone answers within [`Bounds::recovery`] of it, and
/// keeps answering to the end of the run: no echo outage and no ARP/NDP silence longer than
/// [`Bounds::outage`] lasts past that deadline. (A client's neighbour cache hides an IP that
/// nobody announces for a while, so the echo alone would not show it.)
pub fn recovery(history: &History, bounds: &Bounds) -> Vec<Violation> {
    let healed = history
        .faults
        .iter()
        .map(|w| ms(w.end()))
        .max()
        .unwrap_or(0);
    let deadline = healed + ms(bounds.recovery);
    let mut out = Vec::new();
    for (neighbour, gaps) in [
        (false, outages(history, bounds)),
        (true, silences(history, bounds)),
    ] {
        for (ip, gaps) in gaps {
            if let Some((from, _)) = gaps.iter().find(|(_, to)| *to > deadline) {
                out.push(Violation::NotRecovered {
                    ip,
                    neighbour,
                    last_answer: (*from > 0).then_some(*from),
                });
            }
        }
    }
    out
}

/// Every IP's spans with no ARP/NDP answer longer than [`Bounds::outage`]: from the first
/// request nobody answered to the next one answered (the run's end if none).
pub fn silences(history: &History, bounds: &Bounds) -> BTreeMap<IpAddr, Vec<(u64, u64)>> {
    let mut all: BTreeMap<IpAddr, Vec<(u64, u64)>> = BTreeMap::new();
    let mut open: BTreeMap<IpAddr, Option<u64>> = BTreeMap::new();
    for o in in_order(history) {
        let Observation::Neighbour {
            at,
            ip,
            answered_by,
        } = o
        else {
            continue;
        };
        let since = open.entry(*ip).or_default();
        all.entry(*ip).or_default();
        match (answered_by.is_empty(), *since) {
            (true, None) => *since = Some(*at),
            (false, Some(from)) => {
                if at.saturating_sub(from) > ms(bounds.outage) {
                    all.entry(*ip).or_default().push((from, *at));
                }
                *since = None;
            }
            _ => {}
        }
    }
    for (ip, since) in open {
        if let Some(from) = since
            && history.run.saturating_sub(from) > ms(bounds.outage)
        {
            all.entry(ip)
                .or_default()
                .push((from, history.run.max(from)));
        }
    }
    all
}

/// Every IP's outages: the last answer before each gap longer than [`Bounds::outage`] and
/// the first after it (the last probe's time for a gap that lasts to the end).
pub fn outages(history: &History, bounds: &Bounds) -> BTreeMap<IpAddr, Vec<(u64, u64)>> {
    let mut all = BTreeMap::new();
    for (ip, probes) in echoes(history) {
        let mut last_answer: Option<u64> = None;
        let mut gaps = Vec::new();
        for (first, last, answered) in &probes {
            if *answered {
                if let Some(from) = last_answer
                    && first.saturating_sub(from) > ms(bounds.outage)
                {
                    gaps.push((from, *first));
                }
                last_answer = Some(last_answer.map_or(*last, |l| l.max(*last)));
            }
        }
        if let (Some(from), Some((_, end, _))) = (last_answer, probes.last())
            && end.saturating_sub(from) > ms(bounds.outage)
        {
            gaps.push((from, *end));
        }
        all.insert(ip, gaps);
    }
    all
}

/// Every outage (no answer for longer than [`Bounds::outage`]) overlaps a cause, in force or
/// undone less than [`Bounds::after_heal`] before:
/// - a fault on the node that answered for the IP when the outage began, or on the first node
///   that answered after it (an IP moving back to a node that came back);
/// - faults on enough nodes to cost a healthy node its quorum: half of the cluster rounded up
///   (with 3 nodes, a node cut from one peer and one cut from the other leave the third with
///   no majority it both hears and is heard by: it must stop answering);
/// - an edit of a Service holding the IP.
pub fn unexplained_outages(history: &History, bounds: &Bounds) -> Vec<Violation> {
    // Who answered for each IP, over time.
    let mut owners: BTreeMap<IpAddr, Vec<(u64, &Vec<String>)>> = BTreeMap::new();
    let mut edits: Vec<(u64, &str)> = Vec::new();
    let mut services_of: BTreeMap<IpAddr, BTreeSet<&str>> = BTreeMap::new();
    for o in in_order(history) {
        match o {
            Observation::Neighbour {
                at,
                ip,
                answered_by,
            } if !answered_by.is_empty() => owners.entry(*ip).or_default().push((*at, answered_by)),
            Observation::ServiceEdited { at, service } => edits.push((*at, service)),
            Observation::ServiceIps { service, ips, .. } => {
                for ip in ips {
                    services_of.entry(*ip).or_default().insert(service);
                }
            }
            _ => {}
        }
    }
    let slack = ms(bounds.after_heal);
    let mut out = Vec::new();
    let mut gaps: BTreeMap<IpAddr, Vec<(u64, u64)>> = outages(history, bounds);
    for (ip, silent) in silences(history, bounds) {
        gaps.entry(ip).or_default().extend(silent);
    }
    for (ip, gaps) in gaps {
        for (from, to) in gaps {
            let owner = owners.get(&ip).and_then(|seen| {
                seen.iter()
                    .rev()
                    .find(|(t, _)| *t <= from)
                    .and_then(|(_, who)| who.first().cloned())
            });
            let next_owner = owners.get(&ip).and_then(|seen| {
                seen.iter()
                    .find(|(t, _)| *t > from)
                    .and_then(|(_, who)| who.first().cloned())
            });
            let in_reach: Vec<&Window> = history
                .faults
                .iter()
                .filter(|w| {
                    let (start, end) = (ms(w.start), ms(w.end()) + slack);
                    start <= to && from <= end && w.kind.reach() == Reach::TargetsIps
                })
                .collect();
            let on_owner = in_reach.iter().any(|w| {
                owner.is_none()
                    || w.target == owner
                    || (next_owner.is_some() && w.target == next_owner)
            });
            let faulted: BTreeSet<&Option<String>> = in_reach.iter().map(|w| &w.target).collect();
            let quorum_at_risk =
                !history.nodes.is_empty() && faulted.len() >= history.nodes.len().div_ceil(2);
            let by_fault = on_owner || quorum_at_risk;
            let by_edit = services_of.get(&ip).is_some_and(|held_by| {
                edits
                    .iter()
                    .any(|(t, s)| held_by.contains(s) && *t <= to && from <= t + slack)
            });
            if !by_fault && !by_edit {
                out.push(Violation::UnexplainedOutage {
                    ip,
                    from,
                    to,
                    owner,
                });
            }
        }
    }
    out
}

/// No process's memory grows without bound: the median of the last third of its samples stays
/// within [`Bounds::growth`] of the first third's (or [`Bounds::growth_floor`] bytes).
pub fn memory_growth(history: &History, bounds: &Bounds) -> Vec<Violation> {
    let mut samples: BTreeMap<&str, Vec<(u64, u64)>> = BTreeMap::new();
    for o in &history.observations {
        if let Observation::Rss { at, process, bytes } = o {
            samples.entry(process).or_default().push((*at, *bytes));
        }
    }
    let median = |mut v: Vec<u64>| {
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    };
    let mut out = Vec::new();
    for (process, mut s) in samples {
        s.sort_unstable();
        if s.len() < 6 {
            continue;
        }
        let third = s.len() / 3;
        let first = median(s[..third].iter().map(|(_, b)| *b).collect());
        let last = median(s[s.len() - third..].iter().map(|(_, b)| *b).collect());
        let allowed = ((first as f64 * bounds.growth) as u64).max(bounds.growth_floor);
        if last > first + allowed {
            out.push(Violation::MemoryGrowth {
                process: process.to_string(),
                first,
                last,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::schedule::FaultKind;
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn neighbour(at: u64, who: &[&str]) -> Observation {
        Observation::Neighbour {
            at,
            ip: ip("198.18.200.0"),
            answered_by: who.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn svc(at: u64, name: &str, key: Option<&str>, ips: &[&str]) -> Observation {
        Observation::ServiceIps {
            at,
            service: name.into(),
            sharing_key: key.map(String::from),
            ips: ips.iter().map(|s| ip(s)).collect(),
        }
    }

    fn edit(at: u64, name: &str) -> Observation {
        Observation::ServiceEdited {
            at,
            service: name.into(),
        }
    }

    /// Echo probes every 10 ms from `from` to `to`, unanswered in `dark`.
    fn echo(from: u64, to: u64, dark: std::ops::Range<u64>) -> Vec<Observation> {
        (from / 10..to / 10)
            .map(|i| Observation::Echo {
                at: i * 10,
                ip: ip("198.18.200.0"),
                answered: !dark.contains(&(i * 10)),
                until: None,
            })
            .collect()
    }

    fn window(kind: FaultKind, target: Option<&str>, start_ms: u64, length_ms: u64) -> Window {
        Window {
            kind,
            target: target.map(String::from),
            start: Duration::from_millis(start_ms),
            length: Duration::from_millis(length_ms),
        }
    }

    fn history(faults: Vec<Window>, observations: Vec<Observation>) -> History {
        History {
            faults,
            observations,
            run: 60_000,
            nodes: ["node1", "node2", "node3"].map(String::from).to_vec(),
        }
    }

    #[test]
    fn two_macs_for_one_ip_is_a_violation_one_is_not() {
        let h = history(
            vec![],
            vec![
                neighbour(10, &["node1"]),
                neighbour(20, &["node1", "node1"]),
                neighbour(30, &["node1", "node2"]),
            ],
        );
        assert_eq!(
            two_owners(&h),
            [Violation::TwoOwners {
                at: 30,
                ip: ip("198.18.200.0"),
                answered_by: vec!["node1".into(), "node2".into()]
            }]
        );
    }

    #[test]
    fn an_ip_on_two_services_is_a_violation_unless_shared_by_key() {
        let shared = history(
            vec![],
            vec![
                svc(1, "a/x", Some("k"), &["198.18.200.1"]),
                svc(2, "a/y", Some("k"), &["198.18.200.1"]),
            ],
        );
        assert!(ip_on_two_services(&shared).is_empty());
        let clash = history(
            vec![],
            vec![
                svc(1, "a/x", None, &["198.18.200.1"]),
                svc(5, "a/y", Some("k"), &["198.18.200.1"]),
            ],
        );
        assert_eq!(ip_on_two_services(&clash).len(), 1);
        // Released first, then taken: no clash.
        let moved = history(
            vec![],
            vec![
                svc(1, "a/x", None, &["198.18.200.1"]),
                svc(3, "a/x", None, &[]),
                svc(5, "a/y", None, &["198.18.200.1"]),
            ],
        );
        assert!(ip_on_two_services(&moved).is_empty());
    }

    #[test]
    fn an_ip_changes_only_after_an_edit() {
        let fine = history(
            vec![],
            vec![
                svc(1, "a/x", None, &[]),
                svc(2, "a/x", None, &["198.18.200.1"]),
                edit(3, "a/x"),
                svc(4, "a/x", None, &["198.18.200.2"]),
            ],
        );
        let b = Bounds::default();
        assert!(ip_changed(&fine, &b).is_empty());
        // The edit's own update, with the IPs unchanged, does not spend it.
        let two_events = history(
            vec![],
            vec![
                svc(2, "a/x", None, &["198.18.200.1"]),
                edit(3, "a/x"),
                svc(4, "a/x", None, &["198.18.200.1"]),
                svc(5, "a/x", None, &["198.18.200.2"]),
            ],
        );
        assert!(ip_changed(&two_events, &b).is_empty());
        // An edit that never took effect allows no change a long time after.
        let stale = history(
            vec![],
            vec![
                svc(2, "a/x", None, &["198.18.200.1"]),
                edit(3, "a/x"),
                svc(70_000, "a/x", None, &["198.18.200.2"]),
            ],
        );
        assert_eq!(ip_changed(&stale, &b).len(), 1);
        let unasked = history(
            vec![],
            vec![
                svc(2, "a/x", None, &["198.18.200.1"]),
                edit(3, "a/x"),
                svc(4, "a/x", None, &["198.18.200.2"]),
                // The edit was spent on the first change.
                svc(9, "a/x", None, &["198.18.200.3"]),
            ],
        );
        assert_eq!(ip_changed(&unasked, &b).len(), 1);
        // An IP taken away under a running Service is a change too.
        let lost = history(
            vec![],
            vec![
                svc(2, "a/x", None, &["198.18.200.1"]),
                svc(4, "a/x", None, &[]),
            ],
        );
        assert_eq!(ip_changed(&lost, &b).len(), 1);
    }

    #[test]
    fn an_outage_needs_a_fault_on_the_owner_in_force_or_just_undone() {
        let b = Bounds::default();
        let mut obs = vec![neighbour(0, &["node1"])];
        obs.extend(echo(0, 40_000, 20_000..20_500));
        // A link cut of node1 from 19,900 ms to 20,400 ms explains it.
        let cut = window(FaultKind::LinkCut, Some("node1"), 19_900, 500);
        assert!(unexplained_outages(&history(vec![cut], obs.clone()), &b).is_empty());
        // A fault on another node, or one that reaches no IP, does not.
        let elsewhere = window(FaultKind::LinkCut, Some("node2"), 19_900, 500);
        let api = window(FaultKind::ApiServerStopped, None, 19_000, 5_000);
        let v = unexplained_outages(&history(vec![elsewhere, api], obs.clone()), &b);
        assert_eq!(v.len(), 1, "{v:?}");
        // A fault undone more than `after_heal` (10 s) before does not.
        let old = window(FaultKind::LinkCut, Some("node1"), 0, 100);
        assert_eq!(
            unexplained_outages(&history(vec![old], obs.clone()), &b).len(),
            1
        );
        // Faults on two other nodes of three do: the owner may have lost its quorum.
        let two = vec![
            window(FaultKind::HeartbeatInLost, Some("node2"), 19_000, 2_000),
            window(FaultKind::HeartbeatBlocked, Some("node3"), 19_500, 2_000),
        ];
        assert!(unexplained_outages(&history(two.clone(), obs.clone()), &b).is_empty());
        // So does a fault on the node that answers after the outage (the IP moving back).
        let mut back = obs.clone();
        back.push(neighbour(20_500, &["node2"]));
        let restarted = window(FaultKind::SpeakerKilled, Some("node2"), 15_000, 1_000);
        assert!(unexplained_outages(&history(vec![restarted], back), &b).is_empty());
        // An edit of the Service holding the IP does.
        obs.push(svc(1, "a/x", None, &["198.18.200.0"]));
        obs.push(edit(19_950, "a/x"));
        assert!(unexplained_outages(&history(vec![], obs), &b).is_empty());
    }

    #[test]
    fn every_ip_answers_again_after_the_last_heal() {
        let b = Bounds::default();
        let cut = window(FaultKind::LinkCut, Some("node1"), 10_000, 2_000);
        let healed = history(vec![cut.clone()], echo(0, 30_000, 10_000..13_000));
        assert!(recovery(&healed, &b).is_empty());
        let stuck = history(vec![cut.clone()], echo(0, 30_000, 10_000..30_000));
        assert_eq!(
            recovery(&stuck, &b),
            [Violation::NotRecovered {
                ip: ip("198.18.200.0"),
                neighbour: false,
                last_answer: Some(9_990)
            }]
        );
        // Nobody answering ARP after the heal is no recovery either, even while the echo
        // answers (through a client's neighbour cache).
        let mut silent = echo(0, 30_000, 10_000..13_000);
        silent.extend([
            neighbour(0, &["node1"]),
            neighbour(11_000, &[]),
            neighbour(12_000, &["node2"]),
        ]);
        assert!(recovery(&history(vec![cut.clone()], silent.clone()), &b).is_empty());
        silent.push(neighbour(20_000, &[]));
        assert_eq!(
            recovery(&history(vec![cut], silent), &b),
            [Violation::NotRecovered {
                ip: ip("198.18.200.0"),
                neighbour: true,
                last_answer: Some(20_000)
            }]
        );
    }

    #[test]
    fn memory_that_keeps_growing_is_a_violation() {
        let b = Bounds::default();
        let rss = |growth: u64| -> History {
            history(
                vec![],
                (0..30)
                    .map(|i| Observation::Rss {
                        at: i * 5_000,
                        process: "speaker@node1".into(),
                        bytes: (20 << 20) + i * growth,
                    })
                    .collect(),
            )
        };
        assert!(memory_growth(&rss(10_000), &b).is_empty());
        assert_eq!(memory_growth(&rss(1 << 20), &b).len(), 1);
    }

    #[test]
    fn a_history_reads_back_from_its_json_lines() {
        let o = vec![
            neighbour(1, &["node1"]),
            svc(2, "a/x", Some("k"), &["fd00:18::c8:0"]),
            edit(3, "a/x"),
        ];
        for x in &o {
            let line = serde_json::to_string(x).unwrap_or_default();
            let back: Observation = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(&back, x);
        }
    }
}
