//! Layer 2 membership at scale, in the simulator (issue #34): today's design and the voters',
//! side by side. `cargo bench -p ferrolb-layer2 --bench simulate`.
//!
//! **Voters** ([`VotersDesign`]) run in full at every size: start-up, a steady second, then the
//! owner of the most IPs cut off for 2 s and healed, and the busiest voter cut off for 2 s.
//! Up to 2,000 IPs (4 per node below 500 nodes).
//!
//! **Today's design:**
//! For each cluster size: a full simulated run where the engine can carry it (start-up, a
//! steady second whose wall time is the `wall s/sim s` column, then the owner of the most IPs
//! cut off for 2 s and healed), and for every size a model from the real rules'
//! measured costs (one heartbeat received, one membership check, one heartbeat signed, at that
//! size). The full runs calibrate the model; where a full run would take hours the model says
//! how many. The model's costs are measured with hot caches on one table, so it is a lower
//! bound: at N = 100 the full run's steady state costs about four times the model.
//!
//! **SWIM** (MetalLB's memberlist, through `foca`: `tests/support/swim.rs`) runs in full, with
//! the same faults, up to `SIM_BENCH_SWIM_MAX` nodes (default 200: every node announcing itself to every other at start makes larger runs slow).
//!
//! **A voter change** (`change` in `SIM_BENCH_DESIGNS`): every voter replaced through the joint
//! phase in a healthy cluster, with the time until every node is on the last generation and
//! the IPs it moved or left unanswered (none expected).
//!
//! Run by `cargo test` (without `--bench`), it is a smoke run at 50 nodes.
//!
//! Environment: `SIM_BENCH_NODES` (default `100,1000,5000`), `SIM_BENCH_FULL_MAX` (largest size
//! of today's design run in full, default 100), `SIM_BENCH_SECONDS` (simulated seconds of a
//! full run, default 10), `SIM_BENCH_DESIGNS` (`legacy,voters,swim,change` by default).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use ferrolb_layer2::heartbeat::{Heard, Heartbeat};
use ferrolb_layer2::liveness::Membership;
use ferrolb_layer2::quorum;
use ferrolb_layer2::sim::{
    Cluster, Design, Engine, FRAME_PAYLOAD, Fault, FaultKind, Legacy, MAX_DATAGRAM, MS, Micros,
    SECOND, VotersDesign, frames,
};

#[path = "../tests/support/sim.rs"]
mod support;
#[path = "../tests/support/swim.rs"]
mod swim;
use ferrolb_layer2::tenure::{self, SentLog};
use support::run;

const KEY: &[u8] = b"ferrolb-simulator-gossip-key-000";

fn env_list(name: &str, default: &str) -> Vec<usize> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_string())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn ms(v: Option<Micros>) -> String {
    v.map_or("-".to_string(), |v| format!("{}", v / MS))
}

/// What the real rules cost at size `n`, measured.
struct Model {
    /// Bytes of a steady-state heartbeat (every peer heard and acknowledged).
    heartbeat: usize,
    /// Seconds to take in one heartbeat (the copy each receiver gets, then `receive`).
    receive: f64,
    /// Seconds of one membership check (reports, quorum, acknowledgements, tenure).
    check: f64,
    /// Seconds to build and sign one heartbeat.
    sign: f64,
}

impl Model {
    /// Datagrams each node sends a second: every interval, one to each peer (none when a
    /// heartbeat no longer fits a datagram).
    fn datagrams(&self, n: usize) -> f64 {
        if self.heartbeat > MAX_DATAGRAM {
            0.0
        } else {
            10.0 * (n - 1) as f64
        }
    }

    /// CPU seconds per simulated second, all nodes: each receives 10·(N−1) heartbeats, checks
    /// and signs 10 times a second.
    fn cpu(&self, n: usize) -> f64 {
        let n = n as f64;
        n * (10.0 * (n - 1.0) * self.receive + 10.0 * (self.check + self.sign))
    }
}

fn measure(names: &[String]) -> Model {
    let n = names.len();
    let t0 = Instant::now();
    let timeout = Duration::from_millis(500);
    let known: BTreeSet<String> = names.iter().cloned().collect();
    let eth0: BTreeSet<String> = ["eth0".to_string()].into();
    // A peer's steady-state heartbeat: it hears every node but itself, all acknowledged.
    let beat = |from: usize, seq: u64, at_ms: u64| Heartbeat {
        node: names[from].clone(),
        boot: 1 + from as u64,
        seq,
        unix_ms: 1_800_000_000_000 + at_ms,
        ready: true,
        leaving: false,
        restarting: false,
        interfaces: eth0.clone(),
        hears: names
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != from)
            .map(|(i, name)| {
                (
                    name.clone(),
                    Heard {
                        ready: true,
                        boot: 1 + i as u64,
                        seq: 1_000 + seq,
                    },
                )
            })
            .collect::<BTreeMap<_, _>>(),
    };
    let sample = beat(1, 1, 0);
    let heartbeat = sample.encode(KEY).unwrap().len();
    // Node 0's table, every peer heard once. Past 2,000 nodes the full table (N² names, a few
    // GB) is not built: 2,000 peers are, and the check's cost, linear in the peers heard, is
    // scaled up.
    let mut table = Membership::new(names[0].clone(), timeout);
    table.set_nodes(known.clone());
    let peers = (n - 1).min(2_000);
    let scale = (n - 1) as f64 / peers as f64;
    for i in 1..=peers {
        table.receive(beat(i, 1, 0), t0, 1_800_000_000_000).unwrap();
    }
    // Receiving: each peer's next heartbeat, a copy per receiver as the simulator (and the
    // decoder in the speaker) makes one. Up to 200 peers, then scaled.
    let count = peers.min(200);
    let next: Vec<Heartbeat> = (1..=count).map(|i| beat(i, 2, 100)).collect();
    let start = Instant::now();
    for b in &next {
        let _ = table.receive(
            b.clone(),
            t0 + Duration::from_millis(100),
            1_800_000_000_100,
        );
    }
    let receive = start.elapsed().as_secs_f64() / count as f64;
    // A check, as the speaker's loop runs it.
    let mut sent = SentLog::new(1);
    sent.record(1_001, t0);
    let now = t0 + Duration::from_millis(150);
    let rounds: u32 = 3;
    let start = Instant::now();
    for _ in 0..rounds {
        let reports = table.reports(now);
        let verdict = quorum::decide(&names[0], &known, &reports, true, &eth0);
        let acks = table.acks(1);
        let tenure = tenure::tenure(&names[0], &known, &acks, &sent, timeout);
        std::hint::black_box((verdict, tenure));
    }
    let check = start.elapsed().as_secs_f64() / f64::from(rounds) * scale;
    // Signing: node 0's own heartbeat, built from its table.
    let start = Instant::now();
    for seq in 0..rounds {
        let hears = table.hears(now);
        let own = Heartbeat {
            hears,
            seq: u64::from(seq),
            ..sample.clone()
        };
        std::hint::black_box(own.encode(KEY).unwrap());
    }
    let sign = start.elapsed().as_secs_f64() / f64::from(rounds) * scale;
    Model {
        heartbeat,
        receive,
        check,
        sign,
    }
}

fn main() {
    // `cargo test --all-targets` (CI) runs this too, unoptimised and without `--bench`: a smoke
    // run at 50 nodes there; the figures come from `cargo bench`.
    let smoke = !std::env::args().any(|a| a == "--bench");
    let sizes = env_list(
        "SIM_BENCH_NODES",
        if smoke { "50" } else { "100,1000,5000" },
    );
    let seconds = env_num("SIM_BENCH_SECONDS", 10).max(9);
    let designs =
        std::env::var("SIM_BENCH_DESIGNS").unwrap_or_else(|_| "legacy,voters,swim,change".into());
    if designs.contains("legacy") {
        legacy(&sizes, seconds);
    }
    if designs.contains("voters") {
        voters(&sizes, seconds);
    }
    if designs.contains("change") {
        voter_change(&sizes);
    }
    if designs.contains("swim") {
        swim(&sizes, seconds);
    }
}

/// Runs `design` in full at size `n`: start-up, a steady second, the owner of the most IPs (not
/// a voter) cut off at 4 s for `fault` seconds, the busiest sender cut off a second after the
/// heal for 1 s; then, on a fresh cluster, a 50/50 split from 4 s for `fault` + 1 seconds,
/// counting the IPs that two nodes answer `fault` seconds into it.
fn full_run<D: Design + Clone>(design: D, n: usize, seconds: u64, avoid: &[usize], fault: u64) {
    // Fault lengths: `fault` seconds for the cut owner and the split, 1 s for the cut voter.
    let heal = 4 + fault;
    let seconds = seconds.max(heal + 5);
    let mut cluster = Cluster::new(n, 1);
    cluster.ips = (4 * n).clamp(16, 2_000);
    cluster.measure_from = 2 * SECOND;
    let setup = Instant::now();
    let mut engine = run(design.clone(), &cluster, &[], 0);
    let setup = setup.elapsed().as_secs_f64();
    let started = Instant::now();
    engine.run_until(3 * SECOND);
    let startup = started.elapsed().as_secs_f64();
    let steady = Instant::now();
    engine.run_until(4 * SECOND);
    let wall = steady.elapsed().as_secs_f64();
    let owner = (0..n)
        .filter(|i| !avoid.contains(i))
        .max_by_key(|&i| {
            (0..cluster.ips)
                .filter(|&ip| engine.answering(ip) == [i as u32])
                .count()
        })
        .unwrap_or(0);
    let owned: Vec<usize> = (0..cluster.ips)
        .filter(|&ip| engine.answering(ip) == [owner as u32])
        .collect();
    engine.add_fault(Fault {
        at: 4 * SECOND,
        heal: heal * SECOND,
        kind: FaultKind::Cut(vec![owner]),
    });
    // Takeover: when every IP the cut node owned is answered by another node (whether or not
    // the cut node still answers it too), in 10 ms steps.
    let mut takeover = None;
    let mut t = 4 * SECOND;
    while t < heal * SECOND && takeover.is_none() {
        t += 10 * MS;
        engine.run_until(t);
        if owned
            .iter()
            .all(|&ip| engine.answering(ip).iter().any(|&a| a as usize != owner))
        {
            takeover = Some(t - 4 * SECOND);
        }
    }
    let report = engine.report();
    let busiest = (0..n)
        .max_by_key(|&i| report.metrics.datagrams[i])
        .unwrap_or(0);
    engine.add_fault(Fault {
        at: (heal + 1) * SECOND,
        heal: (heal + 2) * SECOND,
        kind: FaultKind::Cut(vec![busiest]),
    });
    let faulty = Instant::now();
    engine.run_until(seconds * SECOND);
    let fault_wall = faulty.elapsed().as_secs_f64() / (seconds - 4) as f64;
    let report = engine.report();
    let m = &report.metrics;
    let secs = m.measured as f64 / SECOND as f64;
    let max_dgrams = m.datagrams.iter().max().copied().unwrap_or(0) as f64 / secs;
    let max_bytes = m.bytes.iter().max().copied().unwrap_or(0) as f64 / secs;
    // The split, on a fresh cluster.
    let halves = Fault {
        at: 4 * SECOND,
        heal: (heal + 1) * SECOND,
        kind: FaultKind::halves(n),
    };
    let split = run(design, &cluster, &[halves], heal * SECOND);
    let doubled = (0..cluster.ips)
        .filter(|&ip| split.answering(ip).len() > 1)
        .count();
    println!(
        "{:>6} {:>6} {:>8} {:>8} {:>8} {:>6} {:>12.0} {:>14.0} {:>14.0} {:>16.0} {:>10} {:>12.2} {:>10} {:>10}",
        n,
        cluster.ips,
        ms(takeover),
        ms(m.failover(0.5)),
        ms(m.failover(0.99)),
        m.moved,
        m.datagrams_per_node_second(),
        m.bytes_per_node_second(),
        max_dgrams,
        max_bytes,
        m.largest,
        wall,
        ms(m.converged_at),
        format!("{doubled}/{}", cluster.ips),
    );
    println!(
        "       set-up {setup:.1} s, start-up (first 3 simulated s) {startup:.1} s wall; wall per \
         simulated s from the cut on: {fault_wall:.2} s; {} IPs failed over; hand-back \
         outages p50/p99 {}/{} ms; {} invariant violations (split run not counted; at most {} kept)",
        m.failovers.len(),
        ms(m.handback(0.5)),
        ms(m.handback(0.99)),
        report.violation_count,
        ferrolb_layer2::sim::Report::KEPT,
    );
    if let Some(v) = report.violations.first() {
        println!("       first violation: {v:?}");
    }
}

fn full_header(title: &str) {
    println!("{title}");
    println!(
        "{:>6} {:>6} {:>8} {:>8} {:>8} {:>6} {:>12} {:>14} {:>14} {:>16} {:>10} {:>12} {:>10} {:>10}",
        "N",
        "IPs",
        "takeover",
        "fo p50",
        "fo p99",
        "moved",
        "dgram/s/node",
        "bytes/s/node",
        "max dgram/s",
        "max bytes/s",
        "largest B",
        "wall s/sim s",
        "converged",
        "2 owners"
    );
}

/// The voters' design in full at every size.
fn voters(sizes: &[usize], seconds: u64) {
    full_header(
        "voters (5, spread over 3 racks): the owner of the most IPs cut off at 4 s for 2 s, then \
         the busiest sender (a voter) at 7 s for 1 s; at most 2,000 IPs; 30-character names; \
         traffic from 2 s; 'takeover': until every IP of the cut node is answered by another; \
         '2 owners': IPs answered by two nodes 4 s into a 50/50 split",
    );
    for &n in sizes {
        let design = VotersDesign::default();
        let avoid = {
            let cluster = Cluster {
                ips: 1,
                ..Cluster::new(n, 1)
            };
            let e = run(design.clone(), &cluster, &[], 0);
            e.design().voter_nodes(e.env())
        };
        full_run(design, n, seconds, &avoid, 2);
    }
}

/// A change of every voter at every size (decision 0023, "The voter set"): the controller
/// publishes the joint phase at 4 s, every node reads each configuration within 200 ms, the
/// controller finishes once no voter serves the old generation and the drain has passed.
fn voter_change(sizes: &[usize]) {
    println!(
        "voter change: all 5 voters replaced by 5 others at 4 s, each configuration read within \
         200 ms; 'done': until every node is on the last generation; IPs moved and outages \
         (failovers and hand-backs) over the run"
    );
    println!(
        "{:>6} {:>6} {:>10} {:>6} {:>8} {:>12} {:>10}",
        "N", "IPs", "done", "moved", "outages", "wall s/sim s", "violations"
    );
    for &n in sizes {
        let mut cluster = Cluster::new(n, 1);
        cluster.ips = (4 * n).clamp(16, 2_000);
        let mut engine = run(VotersDesign::default(), &cluster, &[], 4 * SECOND);
        let old = engine.design().voter_nodes(engine.env());
        // Five others, one per rack in turn as `spread` would choose them.
        let mut next = Vec::new();
        let racks = engine.env().racks.clone();
        for rack in 0.. {
            if next.len() == 5 || rack > 10 {
                break;
            }
            for r in 0..3 {
                if next.len() < 5
                    && let Some(i) =
                        (0..n).find(|&i| racks[i] == r && !old.contains(&i) && !next.contains(&i))
                {
                    next.push(i);
                }
            }
        }
        engine.add_fault(Fault {
            at: 4 * SECOND,
            heal: 14 * SECOND,
            kind: FaultKind::ChangeVoters {
                next,
                adopt_within: 200 * MS,
            },
        });
        let started = Instant::now();
        let mut done = None;
        let mut t = 4 * SECOND;
        while t < 14 * SECOND {
            t += 10 * MS;
            engine.run_until(t);
            if done.is_none()
                && engine.design().configs(engine.env()).len() == 3
                && (0..n).all(|i| engine.node(i).is_none_or(|v| v.generation() == 3))
            {
                done = Some(t - 4 * SECOND);
            }
        }
        let wall = started.elapsed().as_secs_f64() / 10.0;
        let report = engine.report();
        let m = &report.metrics;
        println!(
            "{:>6} {:>6} {:>10} {:>6} {:>8} {:>12.2} {:>10}",
            n,
            cluster.ips,
            ms(done),
            m.moved,
            m.failovers.len() + m.handbacks.len(),
            wall,
            report.violation_count
        );
    }
}

/// MetalLB's design (SWIM through foca, no quorum) in full up to `SIM_BENCH_SWIM_MAX` nodes.
fn swim(sizes: &[usize], seconds: u64) {
    let max = env_num("SIM_BENCH_SWIM_MAX", 200) as usize;
    full_header(
        "SWIM as MetalLB uses it (foca, memberlist's LAN timers, owner chosen among the members \
         each node sees alive): the same faults, 20 s long (SWIM's suspicion takes seconds)",
    );
    for &n in sizes.iter().filter(|&&n| n <= max) {
        full_run(swim::Swim, n, seconds, &[], 20);
    }
}

/// Today's design: in full up to `SIM_BENCH_FULL_MAX` nodes, modelled beyond.
fn legacy(sizes: &[usize], seconds: u64) {
    let full_max = env_num("SIM_BENCH_FULL_MAX", 100) as usize;
    println!(
        "today's design (legacy): the owner of the most IPs cut off at 4 s for 2 s; 4 IPs per \
         node; 30-character node names; traffic counted from 2 s on"
    );
    println!(
        "{:>6} {:>5} {:>10} {:>8} {:>8} {:>6} {:>12} {:>14} {:>10} {:>7} {:>12} {:>14}",
        "N",
        "sim s",
        "kind",
        "fo p50",
        "fo p99",
        "moved",
        "dgram/s/node",
        "bytes/s/node",
        "largest B",
        "frames",
        "wall s/sim s",
        "model CPU s/s"
    );
    for &n in sizes {
        let names: Vec<String> = {
            let cluster = Cluster {
                ips: 1,
                ..Cluster::new(n, 1)
            };
            // The engine names nodes; a cluster of one IP keeps this cheap.
            run(Legacy::default(), &cluster, &[], 0).env().names.clone()
        };
        let model = measure(&names);
        let model_cpu = model.cpu(n);
        if n <= full_max {
            let mut cluster = Cluster::new(n, 1);
            cluster.measure_from = 2 * SECOND;
            let end = seconds * SECOND;
            let started = Instant::now();
            // Start-up (every node hears every other for the first time: a storm of checks),
            // the steady state and the fault are timed apart.
            let mut engine = run(Legacy::default(), &cluster, &[], 3 * SECOND);
            let startup = started.elapsed().as_secs_f64();
            let checks = |engine: &Engine<Legacy>| -> (u64, u64) {
                (0..n)
                    .filter_map(|i| engine.node(i).map(|node| node.checks()))
                    .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
            };
            let startup_checks = checks(&engine);
            let steady = Instant::now();
            engine.run_until(4 * SECOND);
            let wall = steady.elapsed().as_secs_f64();
            let steady_checks = checks(&engine);
            // The owner of the most IPs is cut off.
            let owner = (0..n)
                .max_by_key(|&i| engine.node(i).map_or(0, |node| node.plan().len()))
                .unwrap_or(0);
            engine.add_fault(Fault {
                at: 4 * SECOND,
                heal: 6 * SECOND,
                kind: FaultKind::Cut(vec![owner]),
            });
            let faulty = Instant::now();
            engine.run_until(end);
            let fault_wall = faulty.elapsed().as_secs_f64() / (seconds - 4) as f64;
            let report = engine.report();
            let m = &report.metrics;
            println!(
                "{:>6} {:>5} {:>10} {:>8} {:>8} {:>6} {:>12.0} {:>14.0} {:>10} {:>7} {:>12.2} {:>14.2}",
                n,
                seconds,
                "simulated",
                ms(m.failover(0.5)),
                ms(m.failover(0.99)),
                m.moved,
                m.datagrams_per_node_second(),
                m.bytes_per_node_second(),
                m.largest,
                frames(m.largest),
                wall,
                model_cpu,
            );
            let per_node = |c: u64| c as f64 / n as f64;
            println!(
                "       per node: {:.0} checks in start-up ({:.0} heartbeats changed the table), {:.0} in the \
                 steady second ({:.0} changed it)",
                per_node(startup_checks.0),
                per_node(startup_checks.1),
                per_node(steady_checks.0 - startup_checks.0),
                per_node(steady_checks.1 - startup_checks.1),
            );
            println!(
                "       start-up (first 3 simulated s): {startup:.1} s wall; converged at {} ms; \
                 wall per simulated s from the cut on: {fault_wall:.2} s; {} IPs failed over; \
                 hand-back outages p50/p99 {}/{} ms",
                ms(m.converged_at),
                m.failovers.len(),
                ms(m.handback(0.5)),
                ms(m.handback(0.99)),
            );
            if report.violation_count > 0 {
                println!(
                    "       {} invariant violations, first: {:?}",
                    report.violation_count,
                    report.violations.first()
                );
            }
        } else {
            let datagrams = model.datagrams(n);
            println!(
                "{:>6} {:>5} {:>10} {:>8} {:>8} {:>6} {:>12.0} {:>14.0} {:>10} {:>7} {:>12} {:>14.0}",
                n,
                "-",
                "model",
                "-",
                "-",
                "-",
                datagrams,
                datagrams * model.heartbeat as f64,
                model.heartbeat,
                frames(model.heartbeat),
                "-",
                model_cpu,
            );
            if model.heartbeat > MAX_DATAGRAM {
                println!(
                    "       a heartbeat of {} bytes does not fit a UDP datagram ({MAX_DATAGRAM}): \
                     send_to fails, no node hears a majority, layer 2 stops everywhere",
                    model.heartbeat
                );
            } else if model.heartbeat > FRAME_PAYLOAD {
                println!(
                    "       a full run would take about {:.1} h per simulated second (one core)",
                    model_cpu / 3_600.0
                );
            }
        }
        println!(
            "       measured at N={n}: receive {:.1} µs, check {:.1} ms, sign {:.1} µs",
            model.receive * 1e6,
            model.check * 1e3,
            model.sign * 1e6
        );
    }
}
