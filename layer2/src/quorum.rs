//! Who may own IPs: the safety rule of layer 2 mode (decision record 0015).
//!
//! Heartbeats alone cannot tell "the others are dead" from "I am cut off": a node that hears no
//! peer would count only itself and answer for every IP while the real owners still do. So a
//! node acts only with a quorum, and a peer counts as up only when a quorum says so:
//!
//! * The **known speakers** `K` come from the API server (each speaker's presence Lease), not from
//!   gossip, so a node cut off at start-up still knows how many it should hear.
//! * A set of speakers is a **majority** when it holds more than half of `K`, or exactly half
//!   and the lowest-named speaker of `K` (so a two-node cluster split in two keeps one side).
//! * Every heartbeat carries the names its sender hears, each with whether it said `ready`.
//!   This node is **up** when the speakers that hear it (itself, and each peer it hears whose
//!   report names it) are a majority.
//! * This node **acts** (may own IPs, and says `ready` in its heartbeat) only while it hears a
//!   majority and is up. A node that only hears, or is only heard, does not act: one-way loss
//!   takes it out on both sides of the broken direction.
//! * Another speaker is a **candidate** when its own heartbeat says `ready`, or, when this node
//!   does not hear it, when a peer it hears reports it `ready`; and while it is held for a
//!   restart (it left to be replaced by a new process: a rolling update keeps its IPs with it,
//!   unanswered for the moment, instead of moving them away and back). If two nodes A and B both act,
//!   a majority hears A and B hears a majority: the two meet in a peer that reports A to B, so
//!   B counts A as a candidate, and A counts B the same way; with the same candidates, owner
//!   choice gives each IP to one of them.
//!
//! Over-counting others' candidacy can only make this node claim less (an outage of one IP at
//! worst); under-counting could make two nodes claim one IP. Every doubt therefore goes toward
//! counting the other as a candidate and this node as not acting.

use std::collections::{BTreeMap, BTreeSet};

/// What one peer's latest heartbeat said, as seen by this node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// This node hears the peer now (its last heartbeat is within the failure timeout).
    pub fresh: bool,
    /// The peer said it may own IPs.
    pub ready: bool,
    /// The peer left to be replaced and is held as a candidate until its successor is ready or
    /// the restart hold ends (it may not be heard at all meanwhile).
    pub held: bool,
    /// The peers it hears, by name; each with whether it reported that peer ready.
    pub hears: BTreeMap<String, bool>,
    /// Its interfaces that can announce.
    pub interfaces: BTreeSet<String>,
}

/// The verdict for this node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// This node hears a majority of the known speakers.
    pub quorum: bool,
    /// A majority hears this node.
    pub up: bool,
    /// Candidates for owning IPs, with their interfaces (`None`: not heard directly, so not
    /// known: treat as able to announce anywhere). This node is in it only when it acts.
    pub candidates: BTreeMap<String, Option<BTreeSet<String>>>,
}

impl Verdict {
    /// Whether this node may own IPs (and says `ready`).
    pub fn acts(&self) -> bool {
        self.quorum && self.up
    }
}

/// Whether `set` is a majority of `known` (ties go to the half with the lowest name).
pub fn majority<'a>(set: impl IntoIterator<Item = &'a str>, known: &BTreeSet<String>) -> bool {
    let members: BTreeSet<&str> = set.into_iter().filter(|n| known.contains(*n)).collect();
    let twice = 2 * members.len();
    twice > known.len()
        || (twice == known.len()
            && known
                .first()
                .is_some_and(|lowest| members.contains(lowest.as_str())))
}

/// Decides for node `me`: `known` are the speakers the API server says exist, `peers` what
/// this node last heard from each peer, `ready` whether this node could own IPs if it acts
/// (caches synced, settled, an interface usable), `interfaces` its usable interfaces.
pub fn decide(
    me: &str,
    known: &BTreeSet<String>,
    peers: &BTreeMap<String, Report>,
    ready: bool,
    interfaces: &BTreeSet<String>,
) -> Verdict {
    // This node always counts itself, even before its own Lease shows up in the cache.
    let mut known = known.clone();
    known.insert(me.to_string());
    let heard: BTreeSet<&str> = peers
        .iter()
        .filter(|(name, r)| r.fresh && name.as_str() != me)
        .map(|(name, _)| name.as_str())
        .chain([me])
        .collect();
    let quorum = majority(heard.iter().copied(), &known);
    // Who hears this node: itself, and each heard peer whose latest report names it.
    let supporters = |z: &str| -> Vec<&str> {
        heard
            .iter()
            .copied()
            .filter(|&y| y == z || peers.get(y).is_some_and(|r| r.hears.contains_key(z)))
            .collect()
    };
    let up = majority(supporters(me), &known);
    let mut candidates = BTreeMap::new();
    if quorum && up && ready {
        candidates.insert(me.to_string(), Some(interfaces.clone()));
    }
    // Everyone anyone heard, and everyone held for a restart, is a possible candidate.
    let mut names: BTreeSet<&str> = heard.iter().copied().filter(|&n| n != me).collect();
    names.extend(
        peers
            .iter()
            .filter(|(n, r)| r.held && n.as_str() != me)
            .map(|(n, _)| n.as_str()),
    );
    for y in &heard {
        if let Some(r) = peers.get(*y) {
            names.extend(r.hears.keys().map(String::as_str).filter(|&n| n != me));
        }
    }
    for z in names {
        let held = peers.get(z).is_some_and(|r| r.held);
        let is_candidate = held
            || match peers.get(z).filter(|r| r.fresh) {
                // Its own word is the freshest.
                Some(r) => r.ready,
                // Not heard here: any report that it acts keeps it a candidate.
                None => heard.iter().any(|y| {
                    peers
                        .get(*y)
                        .and_then(|r| r.hears.get(z))
                        .copied()
                        .unwrap_or(false)
                }),
            };
        if is_candidate {
            let interfaces = peers
                .get(z)
                .filter(|r| r.fresh || r.held)
                .map(|r| r.interfaces.clone());
            candidates.insert(z.to_string(), interfaces);
        }
    }
    Verdict {
        quorum,
        up,
        candidates,
    }
}

/// Whether every other candidate of `verdict` has said, in its latest heartbeat, that it hears
/// `me` and that `me` said `ready` (`acks`: [`crate::liveness::Membership::acks`] under this
/// node's boot). A node starts to claim IPs only then (and after the claim delay): two acting
/// nodes choose from the same candidates only if each counts the other, and a candidate that has
/// not yet heard this node's `ready` (lost heartbeats) would still choose itself for IPs this
/// node is about to take. Once claiming, a candidate that stops counting this node is a
/// takeover, which [`crate::tenure`] covers. A candidate known only from reports has not spoken
/// to this node, so it has not said so either.
pub fn seen_ready(
    me: &str,
    verdict: &Verdict,
    acks: &BTreeMap<String, crate::heartbeat::Heard>,
) -> bool {
    seen_ready_since(me, verdict, acks, 0)
}

/// [`seen_ready`], counting only acknowledgements of heartbeats sent after `after_seq`: this
/// node's latest heartbeat that said `ready: false` (0: none). Such a heartbeat is a
/// resignation (the others dropped this node as a candidate and may have taken its IPs), so the
/// claim must be earned again as at a rejoin. An older acknowledgement does not count: after a
/// freeze, the others' heartbeats acknowledging what this node sent before it resigned are
/// still queued when it resumes, and they say `ready` although the others no longer count it.
pub fn seen_ready_since(
    me: &str,
    verdict: &Verdict,
    acks: &BTreeMap<String, crate::heartbeat::Heard>,
    after_seq: u64,
) -> bool {
    verdict
        .candidates
        .keys()
        .filter(|name| name.as_str() != me)
        .all(|name| {
            acks.get(name)
                .is_some_and(|heard| heard.ready && heard.seq > after_seq)
        })
}

/// The verdicts a cluster settles into: `names` are the speakers (all with usable interface
/// `eth0`), `link(a, b)` whether a's heartbeats reach b, `known_by(i)` the known set node `i`
/// reads from the API server. Each round every node decides from the reports of the round
/// before, as heartbeats carry them; after `rounds` the verdicts are the steady state a fault
/// settles into. Pure: for tests that give every node its own view.
pub fn settle(
    names: &[String],
    link: &dyn Fn(usize, usize) -> bool,
    known_by: &dyn Fn(usize) -> BTreeSet<String>,
    rounds: usize,
) -> Vec<Verdict> {
    let n = names.len();
    let eth0: BTreeSet<String> = ["eth0".to_string()].into();
    let mut ready = vec![false; n];
    let mut hears: Vec<BTreeMap<String, bool>> = vec![BTreeMap::new(); n];
    let mut verdicts = Vec::new();
    for _ in 0..rounds.max(1) {
        verdicts = (0..n)
            .map(|me| {
                let peers: BTreeMap<String, Report> = (0..n)
                    .filter(|&p| p != me && link(p, me))
                    .map(|p| {
                        (
                            names[p].clone(),
                            Report {
                                fresh: true,
                                ready: ready[p],
                                held: false,
                                hears: hears[p].clone(),
                                interfaces: eth0.clone(),
                            },
                        )
                    })
                    .collect();
                decide(&names[me], &known_by(me), &peers, true, &eth0)
            })
            .collect::<Vec<_>>();
        ready = verdicts.iter().map(Verdict::acts).collect();
        hears = (0..n)
            .map(|me| {
                (0..n)
                    .filter(|&p| p != me && link(p, me))
                    .map(|p| (names[p].clone(), ready[p]))
                    .collect()
            })
            .collect();
    }
    verdicts
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::owner;
    use proptest::prelude::*;

    fn names(n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("node{i}")).collect()
    }

    fn settle(
        n: usize,
        link: &dyn Fn(usize, usize) -> bool,
        known_by: &dyn Fn(usize) -> BTreeSet<String>,
    ) -> Vec<Verdict> {
        super::settle(&names(n), link, known_by, 6)
    }

    /// The owners of `key`: every node that acts and picks itself.
    fn owners(verdicts: &[Verdict], key: &str) -> Vec<String> {
        let all = names(verdicts.len());
        verdicts
            .iter()
            .enumerate()
            .filter(|(_, v)| v.acts())
            .filter(|(i, v)| {
                owner::choose(key, v.candidates.keys().map(String::as_str)) == Some(&all[*i])
            })
            .map(|(i, _)| all[i].clone())
            .collect()
    }

    fn known(n: usize) -> BTreeSet<String> {
        names(n).into_iter().collect()
    }

    const KEYS: [&str; 12] = [
        "198.18.200.1",
        "198.18.200.2",
        "198.18.200.3",
        "198.18.200.4",
        "198.18.200.5",
        "198.18.200.6",
        "fd00:200::1",
        "fd00:200::2",
        "fd00:200::3",
        "198.18.201.9",
        "198.18.201.10",
        "198.18.201.11",
    ];

    #[test]
    fn majority_needs_more_than_half_or_the_lowest_half() {
        let k = known(4);
        assert!(majority(["node1", "node2", "node3"], &k));
        assert!(majority(["node1", "node4"], &k));
        assert!(!majority(["node2", "node3"], &k));
        assert!(!majority(["node1"], &k));
        // Names not known do not count.
        assert!(!majority(["node1", "stranger"], &k));
        assert!(majority(["node1"], &known(1)));
    }

    #[test]
    fn a_node_that_hears_no_one_owns_nothing() {
        // The bug this module exists for: node3 with its heartbeat port blocked both ways.
        let verdicts = settle(3, &|a, b| a != 2 && b != 2, &|_| known(3));
        assert!(!verdicts[2].quorum);
        assert!(!verdicts[2].acts());
        assert!(verdicts[0].acts() && verdicts[1].acts());
        for key in KEYS {
            assert_eq!(owners(&verdicts, key).len(), 1, "{key}");
            assert!(!owners(&verdicts, key).contains(&"node3".to_string()));
        }
    }

    #[test]
    fn a_starting_node_cut_off_claims_nothing_even_before_it_hears_anyone() {
        let peers = BTreeMap::new();
        let v = decide(
            "node3",
            &known(3),
            &peers,
            true,
            &["eth0".to_string()].into(),
        );
        assert!(!v.acts());
        assert!(v.candidates.is_empty());
    }

    #[test]
    fn one_way_loss_takes_the_node_out_on_both_sides() {
        // node2 can send but not receive, then receive but not send.
        for (deaf, mute) in [(true, false), (false, true)] {
            let verdicts = settle(
                3,
                &|a, b| {
                    let into_node2 = b == 1 && a != 1;
                    let out_of_node2 = a == 1 && b != 1;
                    !((deaf && into_node2) || (mute && out_of_node2))
                },
                &|_| known(3),
            );
            assert!(!verdicts[1].acts(), "deaf {deaf} mute {mute}");
            for key in KEYS {
                let o = owners(&verdicts, key);
                assert_eq!(o.len(), 1, "deaf {deaf} mute {mute} {key}: {o:?}");
            }
        }
    }

    #[test]
    fn a_two_node_split_keeps_the_lowest_named_side() {
        let verdicts = settle(2, &|_, _| false, &|_| known(2));
        assert!(verdicts[0].acts());
        assert!(!verdicts[1].acts());
        for key in KEYS {
            assert_eq!(owners(&verdicts, key), ["node1"]);
        }
    }

    #[test]
    fn a_healthy_cluster_gives_every_key_one_owner_and_all_nodes_act() {
        let verdicts = settle(4, &|_, _| true, &|_| known(4));
        assert!(verdicts.iter().all(Verdict::acts));
        for key in KEYS {
            assert_eq!(owners(&verdicts, key).len(), 1);
        }
    }

    #[test]
    fn a_peer_heard_only_through_others_stays_a_candidate() {
        // node1 does not hear node2, but node3 does and reports it ready: node1 must not take
        // node2's IPs.
        let eth0: BTreeSet<String> = ["eth0".to_string()].into();
        let peers: BTreeMap<String, Report> = [(
            "node3".to_string(),
            Report {
                fresh: true,
                ready: true,
                held: false,
                hears: [("node1".to_string(), true), ("node2".to_string(), true)].into(),
                interfaces: eth0.clone(),
            },
        )]
        .into();
        let v = decide("node1", &known(3), &peers, true, &eth0);
        assert!(v.acts());
        assert_eq!(v.candidates.get("node2"), Some(&None));
        assert_eq!(v.candidates.get("node3"), Some(&Some(eth0)));
    }

    #[test]
    fn a_peer_held_for_a_restart_stays_a_candidate_heard_or_not() {
        let eth0: BTreeSet<String> = ["eth0".to_string()].into();
        let report = |fresh, ready, held| Report {
            fresh,
            ready,
            held,
            hears: if fresh {
                [("node1".to_string(), true)].into()
            } else {
                BTreeMap::new()
            },
            interfaces: eth0.clone(),
        };
        // node2 is gone (held), node3 hears node1: node1 acts, and node2 keeps its IPs.
        let peers: BTreeMap<String, Report> = [
            ("node2".to_string(), report(false, false, true)),
            ("node3".to_string(), report(true, true, false)),
        ]
        .into();
        let v = decide("node1", &known(3), &peers, true, &eth0);
        assert!(v.acts());
        assert_eq!(v.candidates.get("node2"), Some(&Some(eth0.clone())));
        // Its successor is heard, not ready yet: still a candidate while held, not after.
        let mut peers = peers;
        peers.insert("node2".to_string(), report(true, false, true));
        assert!(
            decide("node1", &known(3), &peers, true, &eth0)
                .candidates
                .contains_key("node2")
        );
        peers.insert("node2".to_string(), report(true, false, false));
        assert!(
            !decide("node1", &known(3), &peers, true, &eth0)
                .candidates
                .contains_key("node2")
        );
    }

    #[test]
    fn claiming_waits_until_every_other_candidate_has_heard_this_node_ready() {
        use crate::heartbeat::Heard;
        let eth0: BTreeSet<String> = ["eth0".to_string()].into();
        let report = |hears: &[&str]| Report {
            fresh: true,
            ready: true,
            held: false,
            hears: hears.iter().map(|n| (n.to_string(), true)).collect(),
            interfaces: eth0.clone(),
        };
        let peers: BTreeMap<String, Report> = [
            ("node2".to_string(), report(&["node1", "node3"])),
            ("node3".to_string(), report(&["node1", "node2"])),
        ]
        .into();
        let v = decide("node1", &known(3), &peers, true, &eth0);
        let ack = |ready| Heard {
            ready,
            boot: 1,
            seq: 1,
        };
        let both = [
            ("node2".to_string(), ack(true)),
            ("node3".to_string(), ack(true)),
        ]
        .into();
        assert!(seen_ready("node1", &v, &both));
        // node3 still has this node's heartbeat from before it was ready.
        let stale = [
            ("node2".to_string(), ack(true)),
            ("node3".to_string(), ack(false)),
        ]
        .into();
        assert!(!seen_ready("node1", &v, &stale));
        // node3 has not acknowledged anything of this boot.
        let missing = [("node2".to_string(), ack(true))].into();
        assert!(!seen_ready("node1", &v, &missing));
        // After a resignation (a `ready: false` heartbeat with seq 5): only acknowledgements of
        // later heartbeats count, however ready the older ones say it was.
        let acked = |seq2, seq3| -> BTreeMap<String, Heard> {
            [
                (
                    "node2".to_string(),
                    Heard {
                        ready: true,
                        boot: 1,
                        seq: seq2,
                    },
                ),
                (
                    "node3".to_string(),
                    Heard {
                        ready: true,
                        boot: 1,
                        seq: seq3,
                    },
                ),
            ]
            .into()
        };
        assert!(!seen_ready_since("node1", &v, &acked(6, 4), 5));
        assert!(!seen_ready_since("node1", &v, &acked(6, 5), 5));
        assert!(seen_ready_since("node1", &v, &acked(6, 7), 5));
        assert!(seen_ready_since("node1", &v, &acked(4, 4), 0));
    }

    proptest! {
        /// Any single faulty node (any mix of its outgoing and incoming links cut), any cluster
        /// size and any key: at most one owner, and when the faulty node is a minority and its
        /// links are all cut, every key still has an owner.
        #[test]
        fn one_faulty_node_never_makes_two_owners(
            n in 2usize..7,
            faulty in 0usize..7,
            cut_out in prop::collection::vec(any::<bool>(), 7),
            cut_in in prop::collection::vec(any::<bool>(), 7),
            key in "[0-9a-f:.]{1,20}",
        ) {
            let f = faulty % n;
            let link = |a: usize, b: usize| {
                !((a == f && cut_out[b]) || (b == f && cut_in[a]))
            };
            let verdicts = settle(n, &link, &|_| known(n));
            let o = owners(&verdicts, &key);
            prop_assert!(o.len() <= 1, "owners {:?}", o);
            let isolated = (0..n).filter(|&p| p != f).all(|p| !link(p, f) && !link(f, p));
            if isolated && n >= 3 {
                prop_assert_eq!(o.len(), 1);
            }
        }

        /// Nodes that disagree on the known set by one stale speaker still never both own a key.
        #[test]
        fn a_stale_known_set_on_one_node_does_not_split(
            n in 3usize..7,
            stale in 0usize..7,
            extra in any::<bool>(),
            key in "[0-9a-f:.]{1,20}",
        ) {
            let s = stale % n;
            let known_by = |me: usize| {
                let mut k = known(n);
                if me == s {
                    if extra { k.insert("gone".into()); } else { k.remove(&format!("node{}", (s + 1) % n + 1)); }
                }
                k
            };
            let verdicts = settle(n, &|_, _| true, &known_by);
            prop_assert!(owners(&verdicts, &key).len() <= 1);
        }
    }
}
