//! The voters' membership (issue #34, [`VotersDesign`]) under the simulator's invariants: random
//! clusters of 5 to 50 speakers with one fault each, faults aimed at the voters, fault-free runs
//! with the traffic each node sends, a rolling restart, and each of the rules that decision 0023
//! adds broken on purpose to show that the invariants catch the split it prevents.
//!
//! `SIM_CASES=200 cargo test -p ferrolb-layer2 --test simulate_voters` for a longer search.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use ferrolb_layer2::sim::{
    Cluster, Design, Fault, FaultKind, MS, Micros, Mutation, SECOND, VotersDesign, rolling_restart,
};
use proptest::prelude::*;

#[path = "support/sim.rs"]
mod support;
use support::{cases, run, sizes, splits, voter_nodes};

/// Without a fault, every speaker claims within about a second of a cold start, no IP moves or
/// goes unanswered, and the traffic does not grow with the cluster: a node sends a beat to each
/// other voter every interval and, on a voter, a report for each beat it receives, which
/// averages under 20·V datagrams/s per node whatever N; no datagram is over one frame.
#[test]
fn a_quiet_cluster_converges_and_nothing_moves() {
    for n in [1, 2, 3, 5, 12, 40] {
        let mut cluster = Cluster::new(n, 11);
        cluster.measure_from = 3 * SECOND;
        let report = run(VotersDesign::default(), &cluster, &[], 6 * SECOND).report();
        let m = &report.metrics;
        assert!(
            m.converged_at.is_some_and(|c| c < 2 * SECOND),
            "n={n}: converged at {:?}",
            m.converged_at
        );
        assert_eq!(report.violation_count, 0, "{:?}", report.violations);
        assert_eq!((m.moved, m.outages_without_fault), (0, 0));
        let v = voter_nodes(n).len() as f64;
        let rate = m.datagrams_per_node_second();
        assert!(rate <= 20.0 * v, "n={n}: {rate} datagrams/s per node");
        assert!(m.largest <= 1_472, "n={n}: {} bytes", m.largest);
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(16),
        ..ProptestConfig::default()
    })]

    /// Any one fault ([`FaultKind::pick`]: a node or a rack cut off, a 50/50 split, one-way
    /// loss, delay, a frozen process, a crash, a graceful stop), 0.2 to 2.5 s long, after
    /// start-up, striking a voter half of the time: never two nodes answer for one IP, every IP
    /// is answered again within the bound (one failure timeout and two intervals) after
    /// the heal, and nothing moves before the fault.
    #[test]
    fn one_fault_keeps_every_invariant(
        n in sizes(),
        seed in any::<u64>(),
        pick in any::<u8>(),
        node in 0usize..50,
        at_voter in any::<bool>(),
        p in 0u64..1_000,
        at in 2_500u64..3_000,
        length in 200u64..2_500,
    ) {
        let node = if at_voter { let v = voter_nodes(n); v[node % v.len()] } else { node };
        let kind = FaultKind::pick(n, pick, node, p);
        let fault = Fault { at: at * MS, heal: (at + length) * MS, kind };
        let cluster = Cluster::new(n, seed);
        let report = run(VotersDesign::default(), &cluster, std::slice::from_ref(&fault), (at + length + 3_000) * MS).report();
        prop_assert!(report.metrics.converged_at.is_some_and(|c| c < at * MS), "not converged: {:?}", report.metrics.converged_at);
        prop_assert_eq!(report.violation_count, 0, "{:?}: {:?}", fault, &report.violations[..report.violations.len().min(4)]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(8),
        ..ProptestConfig::default()
    })]

    /// One fault as above while another node's datagrams are lost at 50 to 95 %, in or out,
    /// from before the fault until a second after it heals: never two nodes answer for one IP.
    /// (The lossy node may rightly stay out of the quorum, so invariant 2 is not asked here.)
    #[test]
    fn one_fault_under_heavy_loss_elsewhere_never_splits(
        n in 3usize..=9,
        seed in any::<u64>(),
        pick in any::<u8>(),
        node in 0usize..50,
        at_voter in any::<bool>(),
        p in 0u64..1_000,
        lossy in 0usize..9,
        inbound in any::<bool>(),
        fraction in 0.5f64..0.95,
        at in 2_500u64..3_000,
        length in 200u64..2_500,
    ) {
        let node = if at_voter { let v = voter_nodes(n); v[node % v.len()] } else { node };
        let fault = Fault { at: at * MS, heal: (at + length) * MS, kind: FaultKind::pick(n, pick, node, p) };
        let lossy = lossy % n;
        let (from, to) = if inbound { (None, Some(lossy)) } else { (Some(lossy), None) };
        let loss = Fault { at: 2 * SECOND, heal: (at + length + 1_000) * MS, kind: FaultKind::Loss { from, to, fraction } };
        let report = run(VotersDesign::default(), &Cluster::new(n, seed), &[fault.clone(), loss.clone()], (at + length + 3_000) * MS).report();
        prop_assert!(splits(&report).is_empty(), "{:?} with {:?}: {:?}", fault, loss, &report.violations[..report.violations.len().min(4)]);
    }
}

/// A cut owner's IPs are answered again by the others within a second, and the cut node takes
/// them back after flap damping's hold-down.
#[test]
fn a_cut_owner_fails_over_within_a_second() {
    for n in [5, 12] {
        let cluster = Cluster::new(n, 7);
        for cut in [2, voter_nodes(n)[1]] {
            let fault = Fault {
                at: 4 * SECOND,
                heal: 6 * SECOND,
                kind: FaultKind::Cut(vec![cut]),
            };
            let report = run(VotersDesign::default(), &cluster, &[fault], 10 * SECOND).report();
            assert_eq!(report.violation_count, 0, "{:?}", report.violations);
            let m = &report.metrics;
            assert!(!m.failovers.is_empty(), "node {cut} owned nothing");
            let p99 = m.failover(0.99).unwrap();
            assert!(
                p99 > 400 * MS && p99 < SECOND,
                "n={n} cut {cut}: p99 {p99} µs"
            );
            assert_eq!(m.moved, 2 * m.failovers.len() as u64, "away and back");
        }
    }
}

/// A voter frozen or crashed, or two of the five restarted at once: the others are still a
/// majority, every invariant holds, and when the two are replaced (restart hold), no IP moves.
#[test]
fn losing_a_minority_of_the_voters_moves_nothing_elsewhere() {
    let n = 12;
    let v = voter_nodes(n);
    let pair = [v[0], v[3]];
    for kind in [
        FaultKind::Freeze(pair[0]),
        FaultKind::Restart {
            node: pair[0],
            graceful: None,
        },
    ] {
        let fault = Fault {
            at: 4 * SECOND,
            heal: 6 * SECOND,
            kind: kind.clone(),
        };
        let report = run(
            VotersDesign::default(),
            &Cluster::new(n, 5),
            &[fault],
            10 * SECOND,
        )
        .report();
        assert_eq!(
            report.violation_count, 0,
            "{kind:?}: {:?}",
            report.violations
        );
    }
    // Both voters' processes restart at once: every other node keeps its IPs.
    let faults: Vec<Fault> = pair
        .iter()
        .map(|&node| Fault {
            at: 4 * SECOND,
            heal: 4 * SECOND + 500 * MS,
            kind: FaultKind::Restart {
                node,
                graceful: Some(true),
            },
        })
        .collect();
    let report = run(
        VotersDesign::default(),
        &Cluster::new(n, 5),
        &faults,
        10 * SECOND,
    )
    .report();
    assert_eq!(report.violation_count, 0, "{:?}", report.violations);
    assert_eq!(
        report.metrics.moved, 0,
        "the restart hold keeps the voters' own IPs in place"
    );
}

/// The side that holds a majority of the voters works, however few nodes it has: three nodes
/// holding three of the five voters, cut off from the six others, take every IP over within
/// the failover bound, and the six, which hear only two voters, give theirs up.
#[test]
fn the_side_with_most_voters_takes_everything() {
    let n = 9;
    let v = voter_nodes(n);
    let cut = vec![v[0], v[1], v[2]];
    let fault = Fault {
        at: 4 * SECOND,
        heal: 6 * SECOND,
        kind: FaultKind::Cut(cut.clone()),
    };
    let cluster = Cluster::new(n, 3);
    let mut engine = run(VotersDesign::default(), &cluster, &[fault], 5 * SECOND);
    for ip in 0..cluster.ips {
        let owners = engine.answering(ip);
        assert!(
            owners.len() == 1 && cut.contains(&(owners[0] as usize)),
            "ip {ip}: {owners:?}"
        );
    }
    engine.run_until(10 * SECOND);
    let report = engine.report();
    assert_eq!(report.violation_count, 0, "{:?}", report.violations);
    assert!(report.metrics.failover(1.0).unwrap() < SECOND);
}

/// A majority of the voters frozen at once: no node may act, so every IP goes unanswered, never
/// two answer, and after the heal every IP is answered again. Flap damping holds every node
/// that lost its quorum for its first hold-down (2 s), so the outage lasts the fault plus about
/// 2 s, as in today's design after a split without a majority: a finding for decision 0023
/// (damping counts a loss of the voters as this node's own flap).
#[test]
fn a_majority_of_the_voters_frozen_stops_everyone_and_comes_back() {
    let n = 9;
    let v = voter_nodes(n);
    let faults: Vec<Fault> = v[..3]
        .iter()
        .map(|&node| Fault {
            at: 4 * SECOND,
            heal: 5 * SECOND,
            kind: FaultKind::Freeze(node),
        })
        .collect();
    let mut cluster = Cluster::new(n, 3);
    cluster.heal_bound = 3 * SECOND;
    let report = run(VotersDesign::default(), &cluster, &faults, 10 * SECOND).report();
    assert_eq!(report.violation_count, 0, "{:?}", report.violations);
    let m = &report.metrics;
    assert_eq!(m.failovers.len(), cluster.ips, "every IP went unanswered");
    let longest = m.failover(1.0).unwrap();
    assert!(
        longest > 2 * SECOND + SECOND && longest < 4 * SECOND,
        "{longest} µs"
    );
}

/// A rolling restart of every node, voters included, each replaced (restart hold): one owner
/// throughout, and no IP moves.
#[test]
fn a_rolling_restart_keeps_one_owner_and_the_ips_in_place() {
    for n in [5, 9] {
        let cluster = Cluster::new(n, 3);
        let faults = rolling_restart(n, 4 * SECOND, 4 * SECOND, SECOND);
        let report = run(
            VotersDesign::default(),
            &cluster,
            &faults,
            (4 + 4 * n as u64 + 4) * SECOND,
        )
        .report();
        assert_eq!(report.violation_count, 0, "{:?}", report.violations);
        assert_eq!(
            report.metrics.moved, 0,
            "the restart hold keeps IPs in place"
        );
    }
}

/// A node back from a restart (replaced: the voters held it) and cut off soon after, before
/// the restart hold would have ended, fails over like any other: its successor said ready,
/// which ended the hold. The voters kept holding it (until 10 s after the restart) when the
/// successor's first beat said not ready, as a new process's does; the lab's frozen-owner test
/// with `--membership=voters` caught it. The restart's own outage (held, then the successor's
/// claim) is about 2 s; the cut's alone must be under a second.
#[test]
fn a_node_cut_soon_after_its_restart_fails_over_at_once() {
    for n in [5, 9] {
        let cluster = Cluster::new(n, 7);
        for node in [2, voter_nodes(n)[1]] {
            let faults = [
                Fault {
                    at: 4 * SECOND,
                    heal: 4 * SECOND + 500 * MS,
                    kind: FaultKind::Restart {
                        node,
                        graceful: Some(true),
                    },
                },
                Fault {
                    at: 8 * SECOND,
                    heal: 13 * SECOND + 500 * MS,
                    kind: FaultKind::Cut(vec![node]),
                },
            ];
            let report = run(VotersDesign::default(), &cluster, &faults, 18 * SECOND).report();
            assert_eq!(report.violation_count, 0, "{:?}", report.violations);
            let longest = report.metrics.failovers.iter().max().copied();
            assert!(
                longest.is_some_and(|l| l < 3 * SECOND),
                "n={n} node {node}: failovers {:?} µs",
                report.metrics.failovers
            );
        }
    }
}

/// Issue #34 item 4: a node's rejoin does not depend on every other node. Nodes 3 and 4 cannot
/// reach each other at all (members never talk to each other, so that matters to nobody), and
/// node 7 receives nothing (it stays out); node 2 restarts and is back among the owners within
/// the design's start-up bound.
#[test]
fn a_rejoin_does_not_wait_for_a_bad_link_elsewhere() {
    let n = 12;
    let always = |kind| Fault {
        at: SECOND,
        heal: 20 * SECOND,
        kind,
    };
    let faults = vec![
        always(FaultKind::Loss {
            from: Some(3),
            to: Some(4),
            fraction: 1.0,
        }),
        always(FaultKind::Loss {
            from: Some(4),
            to: Some(3),
            fraction: 1.0,
        }),
        always(FaultKind::Loss {
            from: None,
            to: Some(7),
            fraction: 1.0,
        }),
        Fault {
            at: 4 * SECOND,
            heal: 5 * SECOND,
            kind: FaultKind::Restart {
                node: 2,
                graceful: Some(false),
            },
        },
    ];
    let mut engine = run(VotersDesign::default(), &Cluster::new(n, 21), &faults, 0);
    let bound = 5 * SECOND + engine.design().startup(engine.env());
    engine.run_until(bound);
    assert!(
        engine.node(2).is_some_and(|node| node.claims()),
        "node 2 not back by {bound} µs"
    );
    let report = engine.report();
    assert!(splits(&report).is_empty(), "{:?}", report.violations);
}

/// Mutation, the tenure: an owner whose outgoing beats are mostly lost keeps answering after
/// the voters stopped listing it, next to the node that took over. Found by a search over one
/// fault with loss elsewhere (this case); the real rules keep one owner in it.
#[test]
fn ignoring_the_tenure_is_caught() {
    assert_mutation_caught(Mutation::NoTenure, lossy_sender_case());
}

/// Mutation, maturity: a voter that acknowledges a node again at once after a silence lets it
/// count on the voter while another node still holds that voter's report leaving it out.
#[test]
fn immature_acknowledgements_are_caught() {
    assert_mutation_caught(Mutation::ImmatureAcks, lossy_sender_case());
}

/// Mutation, told: a restarted node that claims after the claim delay without a majority of
/// the voters saying every member holds a report listing it takes IPs from a node whose
/// reports are stale (60-70 % of what it receives is lost).
#[test]
fn claiming_without_being_told_is_caught() {
    let case = Case {
        n: 4,
        seed: 545,
        faults: vec![
            Fault {
                at: 2_571 * MS,
                heal: 4_647 * MS,
                kind: FaultKind::Restart {
                    node: 1,
                    graceful: Some(false),
                },
            },
            Fault {
                at: 2 * SECOND,
                heal: 5_647 * MS,
                kind: FaultKind::Loss {
                    from: None,
                    to: Some(2),
                    fraction: 0.69125,
                },
            },
        ],
        end: 7_647 * MS,
    };
    assert_mutation_caught(Mutation::NoTold, case);
}

/// Mutation, the quorum and the tenure together (the rules before decision 0015): a node cut
/// off keeps answering next to the node that took its IPs.
#[test]
fn ignoring_the_quorum_is_caught() {
    let case = Case {
        n: 5,
        seed: 9,
        faults: vec![Fault {
            at: 3 * SECOND,
            heal: 5 * SECOND,
            kind: FaultKind::Cut(vec![1]),
        }],
        end: 7 * SECOND,
    };
    assert_mutation_caught(Mutation::IgnoreQuorumAndTenure, case);
}

struct Case {
    n: usize,
    seed: u64,
    faults: Vec<Fault>,
    end: Micros,
}

/// Three nodes; node 2 cut off for 639 ms while 90.5 % of node 1's datagrams are lost.
fn lossy_sender_case() -> Case {
    Case {
        n: 3,
        seed: 29,
        faults: vec![
            Fault {
                at: 2_616 * MS,
                heal: 3_255 * MS,
                kind: FaultKind::Cut(vec![2]),
            },
            Fault {
                at: 2 * SECOND,
                heal: 4_255 * MS,
                kind: FaultKind::Loss {
                    from: Some(1),
                    to: None,
                    fraction: 0.905,
                },
            },
        ],
        end: 6_255 * MS,
    }
}

fn assert_mutation_caught(mutation: Mutation, case: Case) {
    let mut cluster = Cluster::new(case.n, case.seed);
    let real = run(VotersDesign::default(), &cluster, &case.faults, case.end).report();
    assert!(
        splits(&real).is_empty(),
        "the real rules split: {:?}",
        real.violations
    );
    cluster.mutation = mutation;
    let broken = run(VotersDesign::default(), &cluster, &case.faults, case.end).report();
    assert!(!splits(&broken).is_empty(), "{mutation:?} went unnoticed");
}
