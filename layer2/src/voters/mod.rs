//! Layer 2 membership by voters (issue #34, decision record 0023): every node beats to a few
//! voters, the voters report whom they hear, and a node acts on a majority of the voters.
//!
//! Today's design ([`crate::liveness`], [`crate::quorum`]) has every speaker heartbeat every
//! other, listing every peer it hears: each node's traffic and the membership check grow with the
//! cluster (O(N) datagrams per interval per node, O(N) bytes each, an O(N²) check). Here the
//! same safety argument (decision 0015) runs with "a majority of the voters" in place of "a
//! majority of the known speakers":
//!
//! * A small odd set of **voters** (5 by default, spread over failure domains: [`spread`]).
//!   Every node sends one [`Beat`](crate::wire::Beat) per interval to each voter.
//! * A **voter** ([`voter::Voter`]) answers each beat with a
//!   [`Report`](crate::wire::Report) to its sender: a bitmap over the sorted presence set
//!   ([`Roster`]) of the nodes it hears whose last beat said ready (a node held through its
//!   restart too), the recipient's beat it heard last (`ack`), whether it has heard the
//!   recipient long enough for that to bound a takeover (`mature`), and whether every node
//!   that may hold one of its reports holds one that lists the recipient ready (`told`).
//! * A **member** ([`member::Member`]) acts while fresh reports from a majority of the voters
//!   say they hear it. Its candidates for owner choice are the union of its fresh reports'
//!   bitmaps. It answers only within its tenure: the instant by which a majority of the voters,
//!   itself left out, can have stopped listing it, from the mature acknowledgements. It starts
//!   to claim IPs only once a majority of the voters say `told`.
//!
//! **Why two nodes never answer for one IP.** Suppose A and B both answer for IP `x`. Owner
//! choice over a common candidate set gives `x` to one node, so one of them, say B, does not
//! count A: none of B's fresh reports lists A ready. B acts, so a majority `M_B` of the voters
//! has a fresh report at B; A claimed, so a majority `M_A` said `told` to A; the two meet in a
//! voter `w`. When `w` told A, every node that might hold a report of `w` held one sent after
//! `w` began listing A ready; B's report from `w` is that one or a later one, so it lists A
//! unless `w` stopped listing A since. `w` stops listing A only a failure timeout after the
//! last beat of A it heard, and A's tenure ends before that for a majority of the voters: A
//! has stopped answering by the time B can leave it out. The cases (a voter restarting, frozen,
//! cut off; reports delayed; a member resigning) are in decision 0023; the simulator
//! ([`crate::sim::VotersDesign`]) checks the claim at every event.
//!
//! **Cost.** A member sends `V` beats per interval (100 bytes or so each) and receives `V`
//! reports of `99 + ⌈N/8⌉` bytes, whatever N; a voter receives N beats and sends N reports
//! per interval. The bitmap is kept up to date as beats arrive, so a report costs a copy of it.

pub mod duty;
pub mod member;
pub mod seat;
pub mod steward;
pub mod voter;

use std::collections::HashMap;
use std::time::Duration;

use crate::wire::{NodeRef, SetId, WireError};

pub use member::{Check, Member, Rules};
pub use seat::Seat;
pub use voter::Voter;

/// The timers every speaker of a cluster shares (one Helm value each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timers {
    /// Between two beats (`--heartbeat-interval`).
    pub interval: Duration,
    /// A node (or a voter's report) silent this long is gone (`--failure-timeout`).
    pub timeout: Duration,
    /// How long a node that left to be replaced stays listed (`--restart-hold`).
    pub restart_hold: Duration,
    /// Flap damping (`--flap-damping`).
    pub flap_damping: bool,
    /// A voter that could not confirm its configuration for this long sends no reports
    /// ([`Voter::serving`]); the controller's drain before it retires a generation counts it.
    pub confirm_within: Duration,
}

impl Default for Timers {
    fn default() -> Self {
        Timers {
            interval: Duration::from_millis(100),
            timeout: Duration::from_millis(500),
            restart_hold: Duration::from_secs(10),
            flap_damping: true,
            confirm_within: Duration::from_secs(5),
        }
    }
}

impl Timers {
    /// How long answering stays allowed after a check: the failure timeout less two intervals,
    /// at least one interval (as in today's design).
    pub fn mandate(&self) -> Duration {
        self.timeout
            .saturating_sub(self.interval * 2)
            .max(self.interval)
    }

    /// How long a report may be held after it was sent: a failure timeout of freshness after
    /// its arrival, and delivery within half a failure timeout (the assumption of decision
    /// 0015). After this, nobody holds a report sent before.
    pub fn held_for(&self) -> Duration {
        self.timeout * 3 / 2
    }

    /// How long the controller waits, once every voter of a configuration's generation `g` has
    /// moved on to `g + 1` (or stopped serving), before it publishes `g + 2`: every report of
    /// generation `g` has expired by then, and so has any answering a member based on one.
    pub fn drain(&self) -> Duration {
        self.held_for() + self.mandate()
    }
}

/// The presence set: every node that may beat, in name order, which the bitmaps index.
#[derive(Clone, Debug)]
pub struct Roster {
    names: Vec<String>,
    index: HashMap<String, u16>,
    id: SetId,
}

impl Roster {
    /// The set of `names` (strictly ascending, as a `BTreeSet` iterates; at most
    /// [`crate::wire::MAX_NODES`]).
    pub fn new<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<Self, WireError> {
        let names: Vec<String> = names.into_iter().map(str::to_string).collect();
        let id = SetId::of(names.iter().map(String::as_str))?;
        let index = names
            .iter()
            .enumerate()
            // SetId::of refused more than u16::MAX names.
            .map(|(i, n)| (n.clone(), u16::try_from(i).unwrap_or(u16::MAX)))
            .collect();
        Ok(Roster { names, index, id })
    }

    /// The set's id, as reports carry it.
    pub fn id(&self) -> SetId {
        self.id
    }

    /// Nodes in the set.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The index of `name`, if it is in the set.
    pub fn index(&self, name: &str) -> Option<u16> {
        self.index.get(name).copied()
    }

    /// The name at `index`.
    pub fn name(&self, index: u16) -> Option<&str> {
        self.names.get(usize::from(index)).map(String::as_str)
    }

    /// The node at `index` as messages name it.
    pub fn node_ref(&self, index: u16) -> Option<NodeRef> {
        self.name(index).map(|n| NodeRef::new(index, n))
    }

    /// Every name, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(String::as_str)
    }

    /// `wanted`, with the names of this set that `keep` says must stay: the set to move to when
    /// a Node goes whose node may still be listed (a node leaves a presence set only once it
    /// can have stopped answering). `None` when nothing is kept (move to `wanted` as it is).
    pub fn keeping(&self, wanted: &Roster, keep: impl Fn(&str) -> bool) -> Option<Roster> {
        let kept: Vec<&str> = self
            .names()
            .filter(|n| wanted.index(n).is_none() && keep(n))
            .collect();
        if kept.is_empty() {
            return None;
        }
        let mut names: Vec<&str> = wanted.names().chain(kept).collect();
        names.sort_unstable();
        // A subset of two valid sets' names: it cannot fail.
        Roster::new(names).ok()
    }

    /// Whether `node` names the node at its index in this set.
    pub fn knows(&self, node: &NodeRef) -> bool {
        self.name(node.index).is_some_and(|n| node.names(n))
    }
}

/// The most voters in one set of a [`VoterConfig`]: a member beats to the voters of two
/// consecutive configurations at most (during a change, `current` and `next` of one and the
/// set of the other), and a beat acknowledges at most [`crate::wire::MAX_ACKS`] voters.
pub const MAX_VOTERS: usize = 7;

/// Why a voter configuration was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// `current` names no voter.
    #[error("voter configuration {0}: current names no voter")]
    NoVoters(u64),
    /// A set names more than [`MAX_VOTERS`] voters.
    #[error("voter configuration {generation}: {set} names {count} voters, at most {MAX_VOTERS}")]
    TooMany {
        /// The configuration's generation.
        generation: u64,
        /// `current` or `next`.
        set: &'static str,
        /// How many it names.
        count: usize,
    },
}

/// One generation of the voter configuration, as the controller publishes it (decision 0023,
/// "The voter set"): the voters, and during a change the voters that replace them.
///
/// A member acts on a generation's reports only with a majority of `current` and, when `next`
/// is set, a majority of `next` too (the joint phase). So a member on `g` (set `C`) and one on
/// `g + 1` (`C` and `N`) both need a majority of `C`, and one on `g + 1` and one on `g + 2`
/// (`N`) both a majority of `N`: any two acting members share a voter, which reports for one
/// generation per process. `g` and `g + 2` share none, which is why the controller publishes
/// `g + 2` only once no voter serves `g` any more and [`Timers::drain`] has passed.
///
/// Voters are named, not indexed: the presence set ([`Roster`]) changes as Nodes come and go,
/// and a voter whose Node is gone still counts (silent) until the controller changes the
/// configuration. Counting over fewer voters would change what a majority is on some nodes
/// before others.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VoterConfig {
    /// Increases by one with every change.
    pub generation: u64,
    /// The voters' node names, ascending.
    pub current: Vec<String>,
    /// During a change, the voters that replace them (ascending); empty otherwise.
    pub next: Vec<String>,
}

impl VoterConfig {
    /// Generation `generation` with `current` and, during a change, `next` (sorted here).
    pub fn new<S: Into<String>>(
        generation: u64,
        current: impl IntoIterator<Item = S>,
        next: impl IntoIterator<Item = S>,
    ) -> Result<Self, ConfigError> {
        let sorted = |set: &'static str, voters: Vec<String>| {
            let mut voters = voters;
            voters.sort_unstable();
            voters.dedup();
            if voters.len() > MAX_VOTERS {
                return Err(ConfigError::TooMany {
                    generation,
                    set,
                    count: voters.len(),
                });
            }
            Ok(voters)
        };
        let current = sorted("current", current.into_iter().map(Into::into).collect())?;
        let next = sorted("next", next.into_iter().map(Into::into).collect())?;
        if current.is_empty() {
            return Err(ConfigError::NoVoters(generation));
        }
        Ok(VoterConfig {
            generation,
            current,
            next,
        })
    }

    /// The sets a member needs a majority of: `current`, and `next` when set.
    pub fn sets(&self) -> impl Iterator<Item = &[String]> {
        std::iter::once(self.current.as_slice())
            .chain((!self.next.is_empty()).then_some(self.next.as_slice()))
    }

    /// Every voter of the configuration, ascending, each once: `current` and `next` merged
    /// (both are ascending).
    pub fn voters(&self) -> impl Iterator<Item = &str> {
        let mut current = self.current.iter().map(String::as_str).peekable();
        let mut next = self.next.iter().map(String::as_str).peekable();
        std::iter::from_fn(move || match (current.peek(), next.peek()) {
            (Some(c), Some(n)) if n < c => next.next(),
            (Some(c), Some(n)) if n == c => {
                next.next();
                current.next()
            }
            (Some(_), _) => current.next(),
            (None, _) => next.next(),
        })
    }

    /// Whether it is the joint phase of a change.
    pub fn joint(&self) -> bool {
        !self.next.is_empty()
    }

    /// The configuration that ends the change: `next` alone, one generation on. `None` when
    /// this is not a joint phase.
    pub fn finish(&self) -> Option<VoterConfig> {
        self.joint().then(|| VoterConfig {
            generation: self.generation + 1,
            current: self.next.clone(),
            next: Vec::new(),
        })
    }

    /// The joint phase that starts a change to `next`, one generation on.
    pub fn change_to<S: Into<String>>(
        &self,
        next: impl IntoIterator<Item = S>,
    ) -> Result<Self, ConfigError> {
        let next: Vec<String> = next.into_iter().map(Into::into).collect();
        VoterConfig::new(self.generation + 1, self.current.clone(), next)
    }

    /// Whether `name` is one of its voters.
    pub fn has(&self, name: &str) -> bool {
        self.sets().flatten().any(|v| v == name)
    }

    /// The configuration as the controller publishes it: the `data` of a ConfigMap, with
    /// `generation`, and `current` and `next` as comma-separated names (`next` empty outside
    /// a change).
    pub fn to_data(&self) -> std::collections::BTreeMap<String, String> {
        [
            ("generation", self.generation.to_string()),
            ("current", self.current.join(",")),
            ("next", self.next.join(",")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Reads a configuration written by [`VoterConfig::to_data`].
    pub fn from_data(data: &std::collections::BTreeMap<String, String>) -> Result<Self, DataError> {
        let field = |key: &'static str| data.get(key).ok_or(DataError::Missing(key));
        let generation = field("generation")?;
        let generation = generation
            .trim()
            .parse::<u64>()
            .map_err(|_| DataError::Generation(generation.chars().take(32).collect()))?;
        let names = |key: &'static str| -> Result<Vec<String>, DataError> {
            let text = data.get(key).map(String::as_str).unwrap_or("");
            text.split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(|n| {
                    if n.len() <= crate::heartbeat::MAX_NAME_LEN {
                        Ok(n.to_string())
                    } else {
                        Err(DataError::Name(key, n.chars().take(64).collect()))
                    }
                })
                .collect()
        };
        field("current")?;
        Ok(VoterConfig::new(
            generation,
            names("current")?,
            names("next")?,
        )?)
    }
}

/// Why a published voter configuration could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DataError {
    /// A key is missing.
    #[error("data.{0} is missing")]
    Missing(&'static str),
    /// `generation` is not a number.
    #[error("data.generation {0:?} is not a whole number")]
    Generation(String),
    /// A name is too long to be a node's.
    #[error("data.{0} names {1:?}, longer than a node name may be")]
    Name(&'static str, String),
    /// The sets are not a configuration.
    #[error("{0}")]
    Config(#[from] ConfigError),
}

/// Moves a node's member and, on a voter node, its seat toward the presence set `wanted`, as
/// far as their keep rules let them ([`Member::set_roster`], [`Seat::set_roster`]). Returns
/// whether both now read `wanted`: until then, call it again at every check.
pub fn follow_roster(
    member: &mut Member,
    seat: Option<&mut Seat>,
    wanted: &std::sync::Arc<Roster>,
    now: std::time::Instant,
) -> bool {
    let member_done = member.set_roster(wanted, now);
    let seat_done = seat.is_none_or(|seat| seat.set_roster(wanted, now));
    member_done && seat_done
}

/// Whether `count` of `voters` voters, the lowest-named voter among them when `lowest`, are a
/// majority: more than half, or exactly half holding the lowest (so a cluster of two voters
/// split in two keeps one side working, as [`crate::quorum::majority`] does).
pub fn majority(count: usize, lowest: bool, voters: usize) -> bool {
    let twice = 2 * count;
    twice > voters || (twice == voters && lowest)
}

/// How many voters, `me` (index in the voter list, if it is one) not among them, the smallest
/// majority that could leave `me` out has.
pub fn smallest_takeover(voters: usize, me: Option<usize>) -> usize {
    if voters.is_multiple_of(2) && me != Some(0) {
        voters / 2
    } else {
        voters / 2 + 1
    }
}

/// Chooses `count` voters among `nodes` (name and failure domain: a zone, a rack), spread over
/// the domains: one from each domain in turn, domains in order of their name, names in order
/// within a domain, so every node that runs it on the same list chooses the same voters. An
/// even count above 2 is rounded down: an odd set tolerates as many lost voters with one fewer.
pub fn spread(nodes: &[(String, String)], count: usize) -> Vec<String> {
    let mut count = count.min(nodes.len());
    if count > 2 && count.is_multiple_of(2) {
        count -= 1;
    }
    let mut domains: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for (name, domain) in nodes {
        domains.entry(domain).or_default().push(name);
    }
    for names in domains.values_mut() {
        names.sort_unstable();
        names.dedup();
    }
    let mut chosen = Vec::with_capacity(count);
    let mut round = 0;
    while chosen.len() < count {
        let mut any = false;
        for names in domains.values() {
            if let Some(name) = names.get(round) {
                any = true;
                if chosen.len() < count {
                    chosen.push(name.to_string());
                }
            }
        }
        if !any {
            break;
        }
        round += 1;
    }
    chosen.sort_unstable();
    chosen
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn majorities_of_voters() {
        assert!(majority(3, false, 5));
        assert!(!majority(2, true, 5));
        assert!(majority(1, true, 2));
        assert!(!majority(1, false, 2));
        assert!(majority(1, false, 1));
        assert_eq!(smallest_takeover(5, None), 3);
        assert_eq!(smallest_takeover(5, Some(0)), 3);
        assert_eq!(smallest_takeover(2, Some(1)), 1);
        assert_eq!(smallest_takeover(2, Some(0)), 2);
    }

    #[test]
    fn voters_spread_over_domains() {
        let nodes: Vec<(String, String)> = (0..9)
            .map(|i| (format!("n{i}"), format!("rack{}", i % 3)))
            .collect();
        let v = spread(&nodes, 5);
        assert_eq!(v, ["n0", "n1", "n2", "n3", "n4"]);
        // Even counts round down; never more than the nodes.
        assert_eq!(spread(&nodes, 4).len(), 3);
        assert_eq!(spread(&nodes[..2], 5).len(), 2);
        // One domain of many nodes still gives the count.
        let one: Vec<(String, String)> = (0..7).map(|i| (format!("n{i}"), "z".into())).collect();
        assert_eq!(spread(&one, 5), ["n0", "n1", "n2", "n3", "n4"]);
    }

    #[test]
    fn a_configurations_voters_are_both_sets_merged() {
        let c = VoterConfig::new(1, ["e", "a", "c"], ["f", "c", "b"]).unwrap();
        assert!(c.voters().eq(["a", "b", "c", "e", "f"]));
        let c = VoterConfig::new(1, ["b", "a"], Vec::<&str>::new()).unwrap();
        assert!(c.voters().eq(["a", "b"]));
        let c = c.change_to(["a", "b"]).unwrap();
        assert!(c.voters().eq(["a", "b"]));
        let c = c.change_to(["c", "d"]).unwrap().finish().unwrap();
        assert!(c.voters().eq(["c", "d"]));
    }

    #[test]
    fn a_configuration_reads_back_from_its_data() {
        let c = VoterConfig::new(4, ["b", "a"], ["c", "a"]).unwrap();
        assert_eq!(VoterConfig::from_data(&c.to_data()), Ok(c));
        let stable = VoterConfig::new(1, ["a"], Vec::<&str>::new()).unwrap();
        assert_eq!(VoterConfig::from_data(&stable.to_data()), Ok(stable));
        let data = |g: &str, current: &str| {
            std::collections::BTreeMap::from([
                ("generation".to_string(), g.to_string()),
                ("current".to_string(), current.to_string()),
            ])
        };
        assert_eq!(
            VoterConfig::from_data(&data("2", " a , b ")).map(|c| c.current),
            Ok(vec!["a".to_string(), "b".to_string()])
        );
        for (bad, says) in [
            (data("x", "a"), "data.generation"),
            (data("1", ""), "current names no voter"),
            (data("1", "a,b,c,d,e,f,g,h"), "at most 7"),
            (Default::default(), "data.generation is missing"),
        ] {
            let e = VoterConfig::from_data(&bad).unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        }
    }

    #[test]
    fn the_roster_indexes_names_in_order() {
        let r = Roster::new(["a", "b", "c"]).unwrap();
        assert_eq!(r.index("b"), Some(1));
        assert_eq!(r.name(2), Some("c"));
        assert!(r.knows(&r.node_ref(1).unwrap()));
        assert!(!r.knows(&NodeRef::new(0, "b")));
        assert!(Roster::new(["b", "a"]).is_err());
    }
}
