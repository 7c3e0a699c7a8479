//! Layer 2 membership with many speakers in the lab: at rest, what each speaker sends and
//! receives on the heartbeat port, its CPU and memory, and the API server's watch events; then
//! the client's outage when the owner of a Service IP loses its link. For today's heartbeats
//! (`--membership=legacy`), the voters (`--membership=voters`, decision 0023) and MetalLB's
//! speakers (memberlist), side by side, at each lab size (issue #34, item 3).
//!
//! `cargo bench -p ferrolb-e2e --bench l2_scale` (as root; it builds what it runs first).
//! Environment:
//!
//! * `FERROLB_BENCH_NODES` (default `3,20`): the lab sizes, comma-separated (at most 60).
//! * `FERROLB_BENCH_SECONDS` (default 20): the window measured at rest, per membership.
//! * `FERROLB_BENCH_MEMBERSHIP` (default `legacy,voters,metallb`): the memberships measured
//!   (`metallb`: MetalLB v0.15.2's speakers, as `ferrolb_e2e::metallb` runs them).
//! * `FERROLB_BENCH_TRIALS` (default 10): link cuts per membership and size.
//!
//! Each size brings a lab up with that many nodes (a network namespace, a Ready Node object and
//! a kube-proxy each) and a speaker on every node. Per membership, once every speaker is ready
//! (`/readyz`), it reads over the window: the UDP datagrams and bytes each node sends and
//! receives on port 7946 (iptables counters in the node's namespace, so everything on the wire
//! counts), how many of them exceed one Ethernet frame (1,472 bytes of payload), each
//! speaker's CPU (utime + stime) and RSS, and the API server's watch events
//! (`apiserver_watch_events_total`). Voters: the first five nodes (three below five nodes).
//! A membership whose speakers are not all ready within 120 s is reported as such (which node,
//! and why) and the bench goes on. MetalLB's speakers have no readiness endpoint: they get 20 s
//! to join (memberlist's TCP push/pull, one exchange per node every 30 s, is not counted).
//!
//! Then the failover: a Service whose pods run on two nodes away from its IP's owner; each trial
//! probes the IP from the client every 10 ms for 4 s (20 s for MetalLB, whose memberlist takes
//! seconds to declare a node dead), cuts the owner's link at 1 s, and takes
//! the longest gap between answers (`ferrolb_e2e::systems::failover_trial`, as the side-by-side
//! bench does). Prints figures; asserts nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ferrolb_e2e::Lab;
use ferrolb_e2e::bench::percentile;
use ferrolb_e2e::ferrolb::{self, Deployment};
use ferrolb_e2e::metallb::MetalLb;
use ferrolb_e2e::scope::TestScope;
use ferrolb_e2e::systems::{Fault, Running, failover_trial};
use ferrolb_e2e::topology::Options;
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;

/// The iptables chain the bench counts in, in every node's namespace.
const CHAIN: &str = "FERROLB-BENCH-HB";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if !std::env::args().any(|a| a == "--bench") {
        return Ok(());
    }
    let sizes: Vec<u8> = std::env::var("FERROLB_BENCH_NODES")
        .unwrap_or_else(|_| "3,20".to_string())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let seconds: u64 = std::env::var("FERROLB_BENCH_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let memberships: Vec<String> = std::env::var("FERROLB_BENCH_MEMBERSHIP")
        .unwrap_or_else(|_| "legacy,voters,metallb".to_string())
        .split(',')
        .map(|s| s.trim().to_string())
        .collect();
    let trials = ferrolb_e2e::bench::trials(10);
    anyhow::ensure!(ferrolb_e2e::is_root(), "the bench needs root (the lab)");
    ferrolb::build_binaries(&ferrolb_e2e::bench::BINARIES)?;
    let lab_exe = ferrolb::workspace_binary("ferrolb-lab")?;
    let mut rows = Vec::new();
    let mut unsettled = Vec::new();
    for nodes in sizes {
        let options = Options {
            nodes,
            ..Options::default()
        };
        let lab = Lab::up(options, &lab_exe).await?;
        let result = measure_size(&lab, seconds, trials, &memberships).await;
        ferrolb_e2e::bench::lab_done()?;
        for outcome in result? {
            match outcome {
                Ok(row) => rows.push(row),
                Err(why) => unsettled.push(why),
            }
        }
    }
    println!();
    println!("{}", table_header());
    for r in &rows {
        println!("{}", table_row(r));
    }
    for r in &rows {
        if let Err(why) = &r.outage_ms {
            println!(
                "{:>5} {:>10}: failover not measured: {why}",
                r.nodes, r.membership
            );
        }
    }
    for why in &unsettled {
        println!("{why}");
    }
    Ok(())
}

/// One membership's figures at one lab size.
struct Row {
    nodes: usize,
    membership: &'static str,
    /// Sent plus received per node per second, mean over the nodes.
    datagrams_per_node: f64,
    kbytes_per_node: f64,
    /// The busiest node's datagrams per second (a voter, with voters).
    busiest_datagrams: f64,
    /// Datagrams sent over the window larger than one Ethernet frame, all nodes.
    over_one_frame: u64,
    /// Mean CPU of one speaker, percent of one core.
    cpu_percent: f64,
    /// Mean RSS of one speaker.
    rss_mib: f64,
    /// The API server's watch events per second, all resources.
    watch_events: f64,
    /// The client's outage when the owner's link is cut: p50, p99 and max, milliseconds; or
    /// why it could not be measured (no single node answering for the IP).
    outage_ms: Result<[f64; 3], String>,
}

/// Each membership's row at this size, or (as text) why its speakers did not settle.
async fn measure_size(
    lab: &Lab,
    seconds: u64,
    trials: usize,
    memberships: &[String],
) -> anyhow::Result<Vec<Result<Row, String>>> {
    let nodes: Vec<String> = lab.topology.nodes().map(|h| h.name.clone()).collect();
    for node in &nodes {
        install_counters(lab, node)?;
    }
    let voters: Vec<&str> = nodes
        .iter()
        .take(if nodes.len() >= 5 { 5 } else { 3 })
        .map(String::as_str)
        .collect();
    let voters_flag = format!("--voters={}", voters.join(","));
    let pool = ferrolb::l2_pool("scale", &["198.18.200.0/25", "fd00:18::c8:0/113"]);
    let mut rows = Vec::new();
    for (membership, args) in [
        ("legacy", vec![]),
        ("voters", vec!["--membership=voters", voters_flag.as_str()]),
        ("metallb", vec![]),
    ] {
        if !memberships.iter().any(|m| m == membership) {
            continue;
        }
        let running = if membership == "metallb" {
            Running::MetalLb(MetalLb::start(lab, &pool).await?)
        } else {
            Running::Ferrolb(Deployment::start_with_speakers(
                lab,
                "scale",
                &pool,
                &[],
                &args,
            )?)
        };
        let outcome = match settle(lab, &running, &nodes).await {
            Ok(()) => measure(lab, &running, &nodes, membership, seconds, trials)
                .await
                .map(Ok),
            Err(e) => Ok(Err(format!(
                "{:>5} {:>10} did not settle: {e:#}",
                nodes.len(),
                membership
            ))),
        };
        running.stop();
        let outcome = outcome?;
        match &outcome {
            Ok(row) => println!("{}", table_row(row)),
            Err(why) => println!("{why}"),
        }
        rows.push(outcome);
    }
    Ok(rows)
}

/// Waits (at most 120 s each) until every node's speaker is ready; MetalLB's, which say
/// nothing, get 20 s to join.
async fn settle(lab: &Lab, running: &Running, nodes: &[String]) -> anyhow::Result<()> {
    if let Running::MetalLb(_) = running {
        tokio::time::sleep(Duration::from_secs(20)).await;
        return Ok(());
    }
    for node in nodes {
        ferrolb::wait_speaker_ready(lab, node, Duration::from_secs(120)).await?;
    }
    Ok(())
}

/// The table's header, its columns as [`table_row`] fills them.
fn table_header() -> String {
    format!(
        "{:>5} {:>10} {:>12} {:>12} {:>12} {:>10} {:>10} {:>10} {:>12} {:>20}",
        "nodes",
        "membership",
        "dgram/s/node",
        "KB/s/node",
        "max dgram/s",
        ">1 frame",
        "CPU %/spk",
        "RSS MiB",
        "watch ev/s",
        "cut p50/p99/max ms"
    )
}

/// One row of the table (also printed as each membership is measured).
fn table_row(r: &Row) -> String {
    format!(
        "{:>5} {:>10} {:>12.1} {:>12.2} {:>12.1} {:>10} {:>10.2} {:>10.1} {:>12.1} {:>20}",
        r.nodes,
        r.membership,
        r.datagrams_per_node,
        r.kbytes_per_node,
        r.busiest_datagrams,
        r.over_one_frame,
        r.cpu_percent,
        r.rss_mib,
        r.watch_events,
        match &r.outage_ms {
            Ok([p50, p99, max]) => format!("{p50:.0}/{p99:.0}/{max:.0}"),
            Err(_) => "no single owner".to_string(),
        }
    )
}

async fn measure(
    lab: &Lab,
    running: &Running,
    nodes: &[String],
    membership: &'static str,
    seconds: u64,
    trials: usize,
) -> anyhow::Result<Row> {
    // Past the start: the speakers settle and claim.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let client = lab.client().await?;
    let counters_before: Vec<Counters> = nodes
        .iter()
        .map(|n| read_counters(lab, n))
        .collect::<anyhow::Result<_>>()?;
    let cpu_before = cpu_ticks(running, nodes);
    let watch_before = all_watch_events(&client).await?;
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let elapsed = started.elapsed().as_secs_f64();
    let counters_after: Vec<Counters> = nodes
        .iter()
        .map(|n| read_counters(lab, n))
        .collect::<anyhow::Result<_>>()?;
    let cpu_after = cpu_ticks(running, nodes);
    let watch_after = all_watch_events(&client).await?;
    let per_node: Vec<(f64, f64)> = counters_before
        .iter()
        .zip(&counters_after)
        .map(|(b, a)| {
            let datagrams = (a.out_packets + a.in_packets - b.out_packets - b.in_packets) as f64;
            let bytes = (a.out_bytes + a.in_bytes - b.out_bytes - b.in_bytes) as f64;
            (datagrams / elapsed, bytes / elapsed / 1000.0)
        })
        .collect();
    let n = per_node.len().max(1) as f64;
    let over_one_frame = counters_before
        .iter()
        .zip(&counters_after)
        .map(|(b, a)| a.out_large - b.out_large)
        .sum();
    // Clock ticks per second: 100 on Linux.
    let cpu: Vec<f64> = cpu_after
        .iter()
        .filter_map(|(node, after)| {
            let before = cpu_before.get(node)?;
            Some((after - before) as f64 / 100.0 / elapsed * 100.0)
        })
        .collect();
    let rss: Vec<f64> = running
        .speaker_pids(nodes)
        .iter()
        .filter_map(|(_, pid)| ferrolb::rss_bytes(*pid))
        .map(|b| b as f64 / 1024.0 / 1024.0)
        .collect();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let outage_ms = link_cuts(lab, running, nodes, membership, trials).await?;
    Ok(Row {
        nodes: nodes.len(),
        membership,
        datagrams_per_node: per_node.iter().map(|p| p.0).sum::<f64>() / n,
        kbytes_per_node: per_node.iter().map(|p| p.1).sum::<f64>() / n,
        busiest_datagrams: per_node.iter().map(|p| p.0).fold(0.0, f64::max),
        over_one_frame,
        cpu_percent: mean(&cpu),
        rss_mib: mean(&rss),
        watch_events: (watch_after - watch_before) / elapsed,
        outage_ms,
    })
}

/// The client's outage over `trials` cuts of the owner's link: p50, p99 and max, ms. The
/// Service's pods run on two nodes other than the owner.
async fn link_cuts(
    lab: &Lab,
    running: &Running,
    nodes: &[String],
    membership: &str,
    trials: usize,
) -> anyhow::Result<Result<[f64; 3], String>> {
    let mut scope = TestScope::new(lab, &format!("l2-scale-{membership}")).await?;
    let api: Api<Service> = Api::namespaced(lab.client().await?, &scope.namespace);
    let ip = ferrolb_e2e::bench::probe_service(&mut scope, &api, &nodes[0]).await?;
    let owner = match sole_owner(lab, &ip).await {
        Ok(owner) => owner,
        Err(why) => return Ok(Err(why)),
    };
    // Pods on two nodes other than the owner.
    let candidates: Vec<&str> = std::iter::once(owner.as_str())
        .chain(
            nodes
                .iter()
                .map(String::as_str)
                .filter(|n| *n != owner)
                .take(2),
        )
        .collect();
    ferrolb_e2e::bench::serve_away_from(&mut scope, &api, "probe", &candidates, &owner).await?;
    // MetalLB's memberlist takes seconds to declare a node dead (5.6 s at 3 nodes in the
    // side-by-side bench, and its suspicion timeout grows with log N): its probe runs longer,
    // so that the gap is measured, not cut off by the window.
    let window = match running {
        Running::MetalLb(_) => Duration::from_secs(20),
        Running::Ferrolb(_) => Duration::from_secs(4),
    };
    let mut gaps = Vec::new();
    for trial in 0..trials {
        let gap = match failover_trial(
            lab,
            running,
            Fault::LinkCut,
            &ip,
            &owner,
            window,
            Duration::from_secs(1),
        )
        .await
        {
            Ok(gap) => gap,
            Err(e) => return Ok(Err(format!("trial {trial}: {e:#}"))),
        };
        println!(
            "{:>5} {membership}: trial {trial}: {owner}'s link cut, longest gap {gap:.0} ms",
            nodes.len()
        );
        gaps.push(Duration::from_secs_f64(gap / 1000.0));
    }
    gaps.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    Ok(Ok([
        ms(percentile(&gaps, 0.5)),
        ms(percentile(&gaps, 0.99)),
        gaps.last().copied().map_or(0.0, ms),
    ]))
}

/// The one node answering the client for `ip`, waiting at most about 120 s for it to be one;
/// else what answered (several MACs at once is a split membership: MetalLB's at 50 nodes).
async fn sole_owner(lab: &Lab, ip: &str) -> Result<String, String> {
    let mut last = String::new();
    // `answering_node` itself waits 30 s for a single answer.
    for _ in 0..4 {
        match lab.answering_node("client", ip).await {
            Ok(node) => return Ok(node),
            Err(e) => last = format!("{e:#}"),
        }
    }
    Err(last)
}

/// Counts UDP 7946 both ways in `node`'s namespace, and what leaves larger than one frame.
fn install_counters(lab: &Lab, node: &str) -> anyhow::Result<()> {
    for tool in ["iptables", "ip6tables"] {
        let _ = lab.exec(node, tool, &["-N", CHAIN]);
        lab.exec(node, tool, &["-F", CHAIN])?;
        // The jumps from OUTPUT and INPUT count everything; the chain's one rule what leaves
        // larger than 1,472 bytes of payload.
        let over = if tool == "iptables" {
            "1501:65535"
        } else {
            "1521:65535"
        };
        lab.exec(
            node,
            tool,
            &[
                "-A", CHAIN, "-p", "udp", "--dport", "7946", "-m", "length", "--length", over,
            ],
        )?;
        for (chain, dir) in [("OUTPUT", "--dport"), ("INPUT", "--dport")] {
            let _ = lab.exec(
                node,
                tool,
                &["-D", chain, "-p", "udp", dir, "7946", "-j", CHAIN],
            );
            lab.exec(
                node,
                tool,
                &["-I", chain, "-p", "udp", dir, "7946", "-j", CHAIN],
            )?;
        }
    }
    Ok(())
}

/// Packets and bytes counted in [`CHAIN`] (IPv4 and IPv6 together).
#[derive(Default)]
struct Counters {
    out_packets: u64,
    out_bytes: u64,
    in_packets: u64,
    in_bytes: u64,
    out_large: u64,
}

fn read_counters(lab: &Lab, node: &str) -> anyhow::Result<Counters> {
    let mut c = Counters::default();
    for tool in ["iptables", "ip6tables"] {
        // Rows in rule order: the jump from OUTPUT counts what leaves, from INPUT what arrives.
        for (chain, out) in [("OUTPUT", true), ("INPUT", false)] {
            let text = lab.exec(node, tool, &["-L", chain, "-v", "-x", "-n"])?;
            for line in text.lines().filter(|l| l.contains(CHAIN)) {
                let mut f = line.split_whitespace();
                let packets: u64 = f.next().and_then(|v| v.parse().ok()).unwrap_or(0);
                let bytes: u64 = f.next().and_then(|v| v.parse().ok()).unwrap_or(0);
                if out {
                    c.out_packets += packets;
                    c.out_bytes += bytes;
                } else {
                    c.in_packets += packets;
                    c.in_bytes += bytes;
                }
            }
        }
        let text = lab.exec(node, tool, &["-L", CHAIN, "-v", "-x", "-n"])?;
        if let Some(line) = text.lines().find(|l| l.contains("length")) {
            c.out_large += line
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Ok(c)
}

/// Each speaker's utime + stime, in clock ticks.
fn cpu_ticks(running: &Running, nodes: &[String]) -> BTreeMap<String, u64> {
    running
        .speaker_pids(nodes)
        .into_iter()
        .filter_map(|(node, pid)| Some((node, ferrolb_e2e::bench::cpu_ticks(pid)?)))
        .collect()
}

/// The API server's watch events so far, all resources.
async fn all_watch_events(client: &kube::Client) -> anyhow::Result<f64> {
    Ok(ferrolb_e2e::apiserver_metrics::watch_events(client)
        .await?
        .values()
        .sum())
}
