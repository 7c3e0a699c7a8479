//! The layer 2 plan kept between steps and brought up to date by what changed, so that a step
//! costs the change, not the cluster ([`plan::plan`] costs a score per node and Service).
//!
//! A step hands [`Planner::update`] the whole inputs; the planner compares them with the last
//! ones and replans only the sharing groups (Services connected by shared IPs) whose outcome
//! can change:
//! * a Service that changed, came or went: its old group and the group it is in now;
//! * a node or speaker `X` that changed, came or went: with rendezvous hashing
//!   (`ferrolb_layer2::owner`) only the groups `X` owned, the groups `X` may own now and whose
//!   owner it outscores, and, where Services sharing an IP may disagree on their candidates,
//!   the groups `X` may own now at all;
//! * the configuration: everything.
//!
//! Nothing else is replanned: a step in which nothing changed (a presence Lease renewal, a
//! timer) costs a comparison per Service and no score at all. Each group is planned by the
//! same [`plan::plan_group`] a full plan uses, and a property test checks that the plan kept
//! here always equals a full plan from scratch.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use ferrolb_config::allocator::ServiceKey;
use ferrolb_config::model::Config;
use ferrolb_layer2::liveness::Member;
use ferrolb_layer2::owner;

use crate::l2::plan::{self, Covered, Inputs, Plan};
use crate::service_views::{Changed, ViewMap};
use crate::view::NodeMap;

/// What the planner remembers of one sharing group, kept under the group's id: its least
/// Service key. Nearly every group is one Service, so a group costs no allocation of its own
/// unless this node owns it.
#[derive(Clone, Debug)]
struct Group {
    /// Its Services other than the one naming it (all covered by an L2Advertisement), sorted.
    rest: Vec<ServiceKey>,
    /// The IPs this node announces for it (none unless it owns the group).
    announced: Vec<IpAddr>,
    /// The owner and the IP it was chosen by (`plan::GroupPlan`).
    owner: Option<Arc<str>>,
    key: Option<IpAddr>,
    /// How many of its Services serve.
    serving: usize,
    /// When this node owns the group: the owner it took the group from, as this node's plans
    /// saw it (kept while this node owns it). The status writer deletes that node's
    /// ServiceL2Status by name instead of listing every node's.
    taken_from: Option<Arc<str>>,
}

/// A dropped group's owner and `taken_from`, remembered for its Services' next plan.
type Before = (Option<Arc<str>>, Option<Arc<str>>);

/// The covered Services holding one IP: nearly always one, which takes no set of its own.
#[derive(Clone, Debug)]
enum Holders {
    One(ServiceKey),
    Many(BTreeSet<ServiceKey>),
}

impl Holders {
    fn insert(&mut self, key: ServiceKey) {
        match self {
            Holders::One(one) if *one == key => {}
            Holders::One(one) => *self = Holders::Many(BTreeSet::from([one.clone(), key])),
            Holders::Many(set) => {
                set.insert(key);
            }
        }
    }

    /// Takes `key` out; returns whether none is left.
    fn remove(&mut self, key: &ServiceKey) -> bool {
        match self {
            Holders::One(one) => one == key,
            Holders::Many(set) => {
                set.remove(key);
                // Two or more were held, so one is left at least.
                if set.len() == 1
                    && let Some(last) = set.pop_first()
                {
                    *self = Holders::One(last);
                }
                false
            }
        }
    }

    fn iter(&self) -> impl Iterator<Item = &ServiceKey> {
        let (one, many) = match self {
            Holders::One(one) => (Some(one), None),
            Holders::Many(set) => (None, Some(set)),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }
}

/// The layer 2 plan and the inputs it was made from.
#[derive(Debug)]
pub struct Planner {
    me: String,
    config: Arc<Config>,
    nodes: Arc<NodeMap>,
    members: BTreeMap<String, Member>,
    /// Every Service handed in, covered or not (shared with the caller's views).
    services: ViewMap,
    /// The covered Services holding each IP.
    holders: HashMap<IpAddr, Holders>,
    /// The group of each covered Service that does not name its group (`groups` is keyed by
    /// the rest): only Services sharing an IP with a lesser one are here.
    group_of: HashMap<ServiceKey, ServiceKey>,
    groups: HashMap<ServiceKey, Group>,
    plan: Plan,
    /// The owner and `taken_from` of each Service whose group was dropped in this update,
    /// until it is planned again.
    before: HashMap<ServiceKey, Before>,
    /// Counts the updates that touched what this node announces (see
    /// [`announce_generation`](Self::announce_generation)).
    announce_generation: u64,
}

impl Planner {
    /// A planner for node `me` that has planned nothing yet.
    pub fn new(me: &str) -> Self {
        Planner {
            me: me.to_string(),
            config: Arc::default(),
            nodes: Arc::default(),
            members: BTreeMap::new(),
            services: BTreeMap::new(),
            holders: HashMap::new(),
            group_of: HashMap::new(),
            groups: HashMap::new(),
            plan: Plan::default(),
            before: HashMap::new(),
            announce_generation: 0,
        }
    }

    /// The plan for the inputs of the last [`update`](Self::update).
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Changes whenever what this node announces (the plan's `announce`, or whom it took a
    /// Service from) may have changed; while it stays, so do they, and the step has nothing
    /// to carry out.
    pub fn announce_generation(&self) -> u64 {
        self.announce_generation
    }

    /// The candidates the last plan was made with.
    pub fn members(&self) -> &BTreeMap<String, Member> {
        &self.members
    }

    /// The inputs of the last update, as a full plan reads them.
    pub fn inputs(&self) -> Inputs<'_> {
        Inputs {
            config: &self.config,
            nodes: &self.nodes,
            members: &self.members,
            me: &self.me,
        }
    }

    /// A copy of the plan and its inputs, for the live report: taken under the work loop's
    /// lock, it costs a copy, and the report's own work (the takeover order) is done outside.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            me: self.me.clone(),
            config: self.config.clone(),
            nodes: self.nodes.clone(),
            members: self.members.clone(),
            services: self.services.clone(),
            plan: self.plan.clone(),
        }
    }

    /// Brings the plan up to date with these inputs; returns how many Services it replanned.
    /// A configuration is taken as changed when it is another `Arc` than the last one.
    /// `changed` says which views may differ from the last update's (the others are not
    /// looked at: a step then costs the change, not a pass over every Service).
    pub fn update(
        &mut self,
        config: &Arc<Config>,
        nodes: Arc<NodeMap>,
        members: BTreeMap<String, Member>,
        services: &ViewMap,
        changed: &Changed,
    ) -> usize {
        if !Arc::ptr_eq(config, &self.config) {
            self.config = config.clone();
            self.nodes = nodes;
            self.members = members;
            self.services = services.clone();
            self.holders.clear();
            let ids: Vec<ServiceKey> = self.groups.keys().cloned().collect();
            let mut ignored = BTreeSet::new();
            for id in ids {
                self.drop_group(&id, &mut ignored);
            }
            let all: Vec<ServiceKey> = self.services.keys().cloned().collect();
            for key in &all {
                self.index(key);
            }
            return self.replan(all);
        }
        // The Nodes come shared while none changed: then there is nothing to compare.
        let mut changed_nodes: BTreeSet<String> = if Arc::ptr_eq(&self.nodes, &nodes) {
            BTreeSet::new()
        } else {
            changed_keys(&self.nodes, &nodes)
        };
        changed_nodes.extend(changed_keys(&self.members, &members));
        self.nodes = nodes;
        self.members = members;
        let changed_services = match changed {
            Changed::All => changed_keys(&self.services, services),
            Changed::Keys(keys) => keys
                .iter()
                .filter(|k| self.services.get(*k) != services.get(*k))
                .cloned()
                .collect(),
        };
        let mut dirty: BTreeSet<ServiceKey> = BTreeSet::new();
        for key in &changed_services {
            self.unindex(key, &mut dirty);
        }
        for key in &changed_services {
            match services.get(key) {
                Some(view) => self.services.insert(key.clone(), view.clone()),
                None => self.services.remove(key),
            };
        }
        for key in &changed_services {
            self.index(key);
            dirty.insert(key.clone());
        }
        if !changed_nodes.is_empty() {
            let mut touched = Vec::new();
            for (id, group) in &self.groups {
                if changed_nodes
                    .iter()
                    .any(|x| self.may_change_owner(id, group, x))
                {
                    touched.push(id.clone());
                }
            }
            for id in touched {
                self.drop_group(&id, &mut dirty);
            }
        }
        self.replan(dirty.into_iter().collect())
    }

    /// Adds the Service `key` (as now in `services`) to the IP index when it is covered.
    fn index(&mut self, key: &ServiceKey) {
        let Some(view) = self.services.get(key) else {
            return;
        };
        if plan::covering(&self.config, view).is_none() {
            return;
        }
        for ip in &view.ips {
            match self.holders.get_mut(ip) {
                Some(holders) => holders.insert(key.clone()),
                None => {
                    self.holders.insert(*ip, Holders::One(key.clone()));
                }
            }
        }
    }

    /// Takes the Service `key` (as last planned) out of the IP index, and drops the results
    /// of its group, whose Services go into `dirty`.
    fn unindex(&mut self, key: &ServiceKey, dirty: &mut BTreeSet<ServiceKey>) {
        if let Some(view) = self.services.get(key) {
            for ip in &view.ips {
                if self.holders.get_mut(ip).is_some_and(|h| h.remove(key)) {
                    self.holders.remove(ip);
                }
            }
        }
        if let Some(id) = self.group_id(key) {
            self.drop_group(&id, dirty);
        }
    }

    /// The id of the group the covered Service `key` is in, if planned.
    fn group_id(&self, key: &ServiceKey) -> Option<ServiceKey> {
        if self.groups.contains_key(key) {
            Some(key.clone())
        } else {
            self.group_of.get(key).cloned()
        }
    }

    /// Forgets the results of group `id` (its owner is remembered for the next plan of its
    /// Services); its Services go into `dirty`.
    fn drop_group(&mut self, id: &ServiceKey, dirty: &mut BTreeSet<ServiceKey>) {
        let Some(group) = self.groups.remove(id) else {
            return;
        };
        if !group.announced.is_empty() {
            self.announce_generation += 1;
        }
        for ip in &group.announced {
            self.plan.announce.remove(ip);
        }
        for key in std::iter::once(id.clone()).chain(group.rest) {
            self.plan.services.remove(&key);
            self.group_of.remove(&key);
            self.before
                .insert(key.clone(), (group.owner.clone(), group.taken_from.clone()));
            dirty.insert(key);
        }
    }

    /// The node this node took Service `key` from, while this node owns it: whose
    /// ServiceL2Status to delete. `None` when this node does not own it, or its plans never
    /// saw another owner (it took the Service at its first plan).
    pub fn taken_from(&self, key: &ServiceKey) -> Option<&str> {
        let group = match self.groups.get(key) {
            Some(group) => group,
            None => self.groups.get(self.group_of.get(key)?)?,
        };
        group.taken_from.as_deref()
    }

    /// Whether a change of node or speaker `x` may change the outcome of `group`.
    fn may_change_owner(&self, id: &ServiceKey, group: &Group, x: &str) -> bool {
        if group.serving == 0 {
            // Nobody serves: the outcome does not depend on the nodes.
            return false;
        }
        if group.owner.as_deref() == Some(x) {
            return true;
        }
        if !self.eligible_for_any(id, group, x) {
            // Not a candidate now: whether it was one before or not, the owner stays (it
            // outscored `x`, or `x` was never in line), and an ownerless group stays so.
            return false;
        }
        match (&group.owner, &group.key) {
            // With several serving Services the candidate set may switch between the
            // intersection and the union: plan the group again.
            _ if group.serving > 1 => true,
            (Some(owner), Some(ip)) => {
                let key = plan::group_key(Some(*ip));
                (owner::score(x, &key), x) > (owner::score(owner, &key), &**owner)
            }
            _ => true,
        }
    }

    /// Whether `x` may announce any serving Service of `group` under the current inputs.
    fn eligible_for_any(&self, id: &ServiceKey, group: &Group, x: &str) -> bool {
        let inputs = self.inputs();
        std::iter::once(id).chain(&group.rest).any(|key| {
            self.services
                .get(key)
                .filter(|view| view.any_serving)
                .and_then(|view| plan::covering(&self.config, view))
                .is_some_and(|c| plan::eligible(inputs, &c, x))
        })
    }

    /// Plans the groups of the covered Services among `dirty` (whose old results are gone),
    /// merging in any group they now share an IP with. Returns how many Services it planned.
    fn replan(&mut self, dirty: Vec<ServiceKey>) -> usize {
        let mut planned = 0;
        for seed in dirty {
            if self.group_id(&seed).is_some() || !self.is_covered(&seed) {
                continue;
            }
            let members = self.component(&seed);
            // A group this one now touches is planned again as part of it.
            let mut merged = BTreeSet::new();
            for key in &members {
                if let Some(id) = self.group_id(key) {
                    self.drop_group(&id, &mut merged);
                }
            }
            planned += members.len();
            self.plan_component(members);
        }
        self.before.clear();
        planned
    }

    /// Whether the Service `key` is in layer 2 mode.
    fn is_covered(&self, key: &ServiceKey) -> bool {
        self.services
            .get(key)
            .and_then(|v| plan::covering(&self.config, v))
            .is_some()
    }

    /// The covered Services connected to `seed` by shared IPs, `seed` included, sorted.
    fn component(&self, seed: &ServiceKey) -> Vec<ServiceKey> {
        let mut seen: BTreeSet<ServiceKey> = BTreeSet::from([seed.clone()]);
        let mut queue = vec![seed.clone()];
        while let Some(key) = queue.pop() {
            let Some(view) = self.services.get(&key) else {
                continue;
            };
            for ip in &view.ips {
                for other in self.holders.get(ip).into_iter().flat_map(Holders::iter) {
                    if seen.insert(other.clone()) {
                        queue.push(other.clone());
                    }
                }
            }
        }
        seen.into_iter().collect()
    }

    /// Plans one group and records its results.
    fn plan_component(&mut self, members: Vec<ServiceKey>) {
        let covered: Vec<Covered<'_>> = members
            .iter()
            .filter_map(|k| self.services.get(k))
            .filter_map(|v| plan::covering(&self.config, v))
            .collect();
        let refs: Vec<&Covered<'_>> = covered.iter().collect();
        let g = plan::plan_group(self.inputs(), &refs);
        let serving = covered.iter().filter(|c| c.service.any_serving).count();
        let Some(id) = members.first().cloned() else {
            return;
        };
        let taken_from = if g.owner.as_deref() == Some(self.me.as_str()) {
            let before: Vec<&Before> = members.iter().filter_map(|k| self.before.get(k)).collect();
            // Still this node's: it keeps what it took the group from. Newly taken: from the
            // owner its plans last saw.
            match before
                .iter()
                .find(|(owner, _)| owner.as_deref() == Some(self.me.as_str()))
            {
                Some((_, taken_from)) => taken_from.clone(),
                None => before.iter().find_map(|(owner, _)| owner.clone()),
            }
        } else {
            None
        };
        let group = Group {
            rest: members[1..].to_vec(),
            announced: g.announce.keys().copied().collect(),
            owner: g.owner,
            key: g.key,
            serving,
            taken_from,
        };
        if !g.announce.is_empty() {
            self.announce_generation += 1;
        }
        self.plan.services.extend(g.outcomes);
        self.plan.announce.extend(g.announce);
        for key in &group.rest {
            self.group_of.insert(key.clone(), id.clone());
        }
        self.groups.insert(id, group);
    }
}

/// A copy of a [`Planner`]'s plan and inputs.
#[derive(Clone, Debug)]
pub struct Snapshot {
    me: String,
    config: Arc<Config>,
    nodes: Arc<NodeMap>,
    /// The candidates the plan was made with.
    pub members: BTreeMap<String, Member>,
    /// The Services planned, by key.
    pub services: ViewMap,
    /// The plan.
    pub plan: Plan,
}

impl Snapshot {
    /// The takeover order of every announced Service (`plan::takeover`).
    pub fn takeover(&self) -> BTreeMap<ServiceKey, Vec<String>> {
        let inputs = Inputs {
            config: &self.config,
            nodes: &self.nodes,
            members: &self.members,
            me: &self.me,
        };
        plan::takeover(inputs, self.services.values().map(Arc::as_ref))
    }
}

/// The keys whose values differ between `old` and `new`, or that are in only one of them.
fn changed_keys<K: Ord + Clone, V: PartialEq>(
    old: &BTreeMap<K, V>,
    new: &BTreeMap<K, V>,
) -> BTreeSet<K> {
    let mut out: BTreeSet<K> = old
        .iter()
        .filter(|(k, v)| new.get(*k) != Some(*v))
        .map(|(k, _)| k.clone())
        .collect();
    out.extend(new.keys().filter(|k| !old.contains_key(*k)).cloned());
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::l2::plan::ServiceOutcome;
    use crate::view::{NodeView, ServiceObject, ServiceView};
    use ferrolb_config::model::{L2Advertisement, PoolSelection};
    use ferrolb_config::selector::Selector;
    use ferrolb_testkit::model::pool;
    use proptest::prelude::*;

    const NODES: usize = 5;

    /// One of a few configurations: 0 covers every Service of pool `l2` on every node; 1 only
    /// zone z0 nodes on eth1; 2 splits Services by label between two advertisements.
    fn config(variant: u8) -> Arc<Config> {
        let mut c = Config::default();
        c.pools.insert(
            "l2".into(),
            pool("l2", &["198.18.200.0/24", "fd00:18::c8:0/112"]),
        );
        c.pools
            .insert("other".into(), pool("other", &["198.18.201.0/24"]));
        let adv = |name: &str| L2Advertisement {
            name: name.into(),
            pools: PoolSelection {
                names: ["l2".to_string()].into(),
                selectors: vec![],
            },
            ..Default::default()
        };
        let mut advs = vec![];
        match variant % 3 {
            0 => advs.push(adv("all")),
            1 => {
                let mut a = adv("z0");
                a.node_selectors = vec![Selector::from_labels([("zone", "z0")])];
                a.interfaces = vec!["eth1".into()];
                advs.push(a);
            }
            _ => {
                let mut a = adv("red");
                a.service_selectors = vec![Selector::from_labels([("color", "red")])];
                a.node_selectors = vec![Selector::from_labels([("zone", "z1")])];
                advs.push(a);
                let mut b = adv("blue");
                b.service_selectors = vec![Selector::from_labels([("color", "blue")])];
                b.interfaces = vec!["eth0".into()];
                advs.push(b);
            }
        }
        for a in advs {
            c.l2_advertisements.insert(a.name.clone(), a);
        }
        Arc::new(c)
    }

    fn node_name(i: usize) -> String {
        format!("node{}", i % NODES + 1)
    }

    /// A Service from a few small choices: IPs from a small set (so that they are shared),
    /// sometimes from the pool no advertisement covers.
    #[derive(Clone, Debug)]
    struct ServiceSpec {
        ips: Vec<u8>,
        other_pool: bool,
        red: bool,
        local: bool,
        serving: Vec<usize>,
        any_serving: bool,
    }

    fn service(i: usize, spec: &ServiceSpec) -> ServiceView {
        let mut ips: Vec<IpAddr> = spec
            .ips
            .iter()
            .map(|n| {
                let text = match (spec.other_pool, n % 2) {
                    (true, _) => format!("198.18.201.{}", n % 6),
                    (false, 0) => format!("198.18.200.{}", n % 6),
                    (false, _) => format!("fd00:18::c8:{:x}", n % 6),
                };
                text.parse().unwrap()
            })
            .collect();
        ips.sort();
        ips.dedup();
        ServiceView {
            service: Arc::new(ServiceObject {
                key: ServiceKey::new("ns", format!("s{i}").as_str()),
                labels: [(
                    "color".to_string(),
                    if spec.red { "red" } else { "blue" }.to_string(),
                )]
                .into(),
                ips,
                local_traffic: spec.local,
                uid: None,
            }),
            serving_nodes: spec.serving.iter().map(|n| node_name(*n)).collect(),
            any_serving: spec.any_serving,
        }
    }

    #[derive(Clone, Debug)]
    enum Change {
        SetService(usize, ServiceSpec),
        RemoveService(usize),
        Node {
            node: usize,
            zone: u8,
            unavailable: bool,
            excluded: bool,
            present: bool,
        },
        Member {
            node: usize,
            live: bool,
            interfaces: Option<Vec<bool>>,
        },
        Config(u8),
        /// A step in which nothing changed (a presence renewal, a timer).
        Nothing,
    }

    fn spec() -> impl Strategy<Value = ServiceSpec> {
        (
            prop::collection::vec(0u8..12, 0..3),
            prop::bool::weighted(0.1),
            any::<bool>(),
            any::<bool>(),
            prop::collection::vec(0usize..NODES, 0..3),
            prop::bool::weighted(0.85),
        )
            .prop_map(
                |(ips, other_pool, red, local, serving, any_serving)| ServiceSpec {
                    ips,
                    other_pool,
                    red,
                    local,
                    serving,
                    any_serving,
                },
            )
    }

    fn change() -> impl Strategy<Value = Change> {
        prop_oneof![
            4 => (0usize..8, spec()).prop_map(|(i, s)| Change::SetService(i, s)),
            1 => (0usize..8).prop_map(Change::RemoveService),
            2 => (0usize..NODES, 0u8..2, prop::bool::weighted(0.2), prop::bool::weighted(0.2), prop::bool::weighted(0.9))
                .prop_map(|(node, zone, unavailable, excluded, present)| Change::Node { node, zone, unavailable, excluded, present }),
            2 => (0usize..NODES, prop::bool::weighted(0.7), prop::option::weighted(0.9, prop::collection::vec(any::<bool>(), 2)))
                .prop_map(|(node, live, interfaces)| Change::Member { node, live, interfaces }),
            1 => (0u8..3).prop_map(Change::Config),
            1 => Just(Change::Nothing),
        ]
    }

    /// The world the changes act on.
    struct World {
        config: Arc<Config>,
        /// Shared with the planner between changes, as the speaker's Node cache is: a change
        /// makes a new map (`Arc::make_mut` while the planner holds the old one).
        nodes: Arc<NodeMap>,
        members: BTreeMap<String, Member>,
        services: BTreeMap<usize, ServiceView>,
        /// The Services changed since the last update, as the watches would mark them.
        marked: BTreeSet<ServiceKey>,
    }

    impl World {
        fn new() -> Self {
            let nodes: NodeMap = (0..NODES)
                .map(|i| {
                    let name = node_name(i);
                    let view = NodeView {
                        name: name.clone(),
                        labels: [("zone".to_string(), format!("z{}", i % 2))].into(),
                        ..Default::default()
                    };
                    (name, view)
                })
                .collect();
            let members = (0..NODES)
                .map(|i| {
                    let m = Member {
                        interfaces: ["eth0".to_string(), "eth1".to_string()].into(),
                        interfaces_unknown: false,
                    };
                    (node_name(i), m)
                })
                .collect();
            World {
                config: config(0),
                nodes: Arc::new(nodes),
                members,
                services: BTreeMap::new(),
                marked: BTreeSet::new(),
            }
        }

        fn apply(&mut self, change: &Change) {
            match change {
                Change::SetService(i, spec) => {
                    let view = service(*i, spec);
                    self.marked.insert(view.key.clone());
                    self.services.insert(*i, view);
                }
                Change::RemoveService(i) => {
                    if let Some(view) = self.services.remove(i) {
                        self.marked.insert(view.key.clone());
                    }
                }
                Change::Node {
                    node,
                    zone,
                    unavailable,
                    excluded,
                    present,
                } => {
                    let name = node_name(*node);
                    if *present {
                        let view = NodeView {
                            name: name.clone(),
                            labels: [("zone".to_string(), format!("z{zone}"))].into(),
                            network_unavailable: *unavailable,
                            excluded: *excluded,
                            addresses: vec![],
                        };
                        Arc::make_mut(&mut self.nodes).insert(name, view);
                    } else {
                        Arc::make_mut(&mut self.nodes).remove(&name);
                    }
                }
                Change::Member {
                    node,
                    live,
                    interfaces,
                } => {
                    let name = node_name(*node);
                    if *live {
                        let member = Member {
                            interfaces: interfaces
                                .iter()
                                .flatten()
                                .zip(["eth0", "eth1"])
                                .filter(|(on, _)| **on)
                                .map(|(_, i)| i.to_string())
                                .collect(),
                            interfaces_unknown: interfaces.is_none(),
                        };
                        self.members.insert(name, member);
                    } else {
                        self.members.remove(&name);
                    }
                }
                Change::Config(v) => self.config = config(*v),
                Change::Nothing => {}
            }
        }

        /// Changes Service `i` as a watch would see it.
        fn edit(&mut self, i: usize, f: impl FnOnce(&mut ServiceView)) {
            if let Some(view) = self.services.get_mut(&i) {
                f(view);
                self.marked.insert(view.key.clone());
            }
        }

        fn services(&self) -> Vec<ServiceView> {
            self.services.values().cloned().collect()
        }

        fn full(&self, me: &str) -> Plan {
            let inputs = Inputs {
                config: &self.config,
                nodes: &self.nodes,
                members: &self.members,
                me,
            };
            plan::plan(inputs, &self.services())
        }

        /// Updates `planner`, telling it which Services changed (`hints`) or not.
        fn update_with(&mut self, planner: &mut Planner, hints: bool) -> usize {
            let views: ViewMap = self
                .services
                .values()
                .map(|v| (v.key.clone(), Arc::new(v.clone())))
                .collect();
            let marked = std::mem::take(&mut self.marked);
            let changed = if hints {
                Changed::Keys(marked)
            } else {
                Changed::All
            };
            planner.update(
                &self.config,
                self.nodes.clone(),
                self.members.clone(),
                &views,
                &changed,
            )
        }

        fn update(&mut self, planner: &mut Planner) -> usize {
            self.update_with(planner, true)
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// The check: over any sequence of changes, the plan kept by the planner is
        /// the plan computed from scratch, for every node's view.
        #[test]
        fn the_incremental_plan_always_equals_a_full_plan(
            me in 0usize..NODES,
            hints in any::<bool>(),
            changes in prop::collection::vec(change(), 1..40),
        ) {
            let me = node_name(me);
            let mut world = World::new();
            let mut planner = Planner::new(&me);
            world.update(&mut planner);
            for (i, change) in changes.iter().enumerate() {
                world.apply(change);
                let replanned = world.update_with(&mut planner, hints);
                prop_assert_eq!(
                    planner.plan(),
                    &world.full(&me),
                    "after change {} ({:?})",
                    i,
                    change
                );
                if matches!(change, Change::Nothing) {
                    prop_assert_eq!(replanned, 0, "nothing changed, yet it planned again");
                }
            }
            // And the takeover order the report shows starts with the owner.
            let takeover = planner.snapshot().takeover();
            for (key, outcome) in &planner.plan().services {
                if let ServiceOutcome::Owner(owner) = outcome {
                    prop_assert_eq!(takeover[key].first().map(String::as_str), Some(&**owner));
                }
            }
        }
    }

    fn many(world: &mut World, n: usize) {
        for i in 0..n {
            let spec = ServiceSpec {
                ips: vec![],
                other_pool: false,
                red: false,
                local: false,
                serving: vec![],
                any_serving: true,
            };
            let mut view = service(i, &spec);
            view.ips = vec![format!("198.18.200.{}", i % 250).parse().unwrap()];
            if i >= 250 {
                view.ips = vec![format!("fd00:18::c8:{i:x}").parse().unwrap()];
            }
            world.services.insert(i, view);
        }
    }

    #[test]
    fn one_service_change_replans_one_service() {
        let mut world = World::new();
        many(&mut world, 400);
        let mut planner = Planner::new("node1");
        assert_eq!(world.update(&mut planner), 400);
        assert_eq!(world.update(&mut planner), 0, "nothing changed");
        world.edit(7, |v| v.any_serving = false);
        assert_eq!(world.update(&mut planner), 1);
        world.apply(&Change::RemoveService(8));
        assert_eq!(world.update(&mut planner), 0, "a removal plans nothing new");
        assert_eq!(planner.plan(), &world.full("node1"));
    }

    #[test]
    fn a_speaker_leaving_replans_only_what_it_owned() {
        let mut world = World::new();
        many(&mut world, 400);
        let mut planner = Planner::new("node1");
        world.update(&mut planner);
        let owned_by_node3 = planner
            .plan()
            .services
            .values()
            .filter(|o| **o == ServiceOutcome::Owner("node3".into()))
            .count();
        assert!(owned_by_node3 > 40, "{owned_by_node3}");
        world.members.remove("node3");
        assert_eq!(world.update(&mut planner), owned_by_node3);
        assert_eq!(planner.plan(), &world.full("node1"));
        // It comes back: it takes back what it outscores, and nothing else is planned.
        world.members.insert(
            "node3".into(),
            Member {
                interfaces: ["eth0".to_string(), "eth1".to_string()].into(),
                interfaces_unknown: false,
            },
        );
        assert_eq!(world.update(&mut planner), owned_by_node3);
        assert_eq!(planner.plan(), &world.full("node1"));
    }

    /// What the status writer deletes by name: the node this one took each Service from,
    /// kept while it owns it, also across a new configuration; unknown for what it took at its
    /// first plan, and nothing for what it does not own.
    #[test]
    fn the_previous_owner_is_remembered_while_this_node_owns_the_service() {
        let mut world = World::new();
        many(&mut world, 300);
        let mut planner = Planner::new("node1");
        world.update(&mut planner);
        let owner = |p: &Planner, k: &ServiceKey| match &p.plan().services[k] {
            ServiceOutcome::Owner(o) => o.to_string(),
            other => panic!("{other:?}"),
        };
        let keys: Vec<ServiceKey> = planner.plan().services.keys().cloned().collect();
        let first: BTreeMap<ServiceKey, String> = keys
            .iter()
            .map(|k| (k.clone(), owner(&planner, k)))
            .collect();
        for k in &keys {
            assert_eq!(planner.taken_from(k), None, "{k}: taken at the first plan");
        }
        world.members.remove("node3");
        world.members.remove("node4");
        world.update(&mut planner);
        let mut taken = 0;
        for k in &keys {
            let now = owner(&planner, k);
            let expected = (now == "node1" && first[k] != "node1").then(|| first[k].as_str());
            assert_eq!(planner.taken_from(k), expected, "{k}");
            taken += usize::from(expected.is_some());
        }
        assert!(taken > 20, "{taken}");
        // An unrelated change, then a new configuration: still remembered.
        world.edit(0, |v| v.any_serving = false);
        world.update(&mut planner);
        world.config = config(0);
        world.update(&mut planner);
        for k in keys.iter().filter(|k| k.name() != "s0") {
            let expected =
                (owner(&planner, k) == "node1" && first[k] != "node1").then(|| first[k].as_str());
            assert_eq!(planner.taken_from(k), expected, "{k}");
        }
    }

    #[test]
    fn a_new_configuration_replans_everything() {
        let mut world = World::new();
        many(&mut world, 50);
        let mut planner = Planner::new("node1");
        world.update(&mut planner);
        world.config = config(0);
        assert_eq!(world.update(&mut planner), 50);
        world.config = config(1);
        world.update(&mut planner);
        assert_eq!(planner.plan(), &world.full("node1"));
    }
}
