//! ferrolb against MetalLB v0.15.2 in the lab, side by side (issue #16 item 4): the same
//! scenarios on each, each system on a fresh lab, MetalLB first, then ferrolb. Prints one table
//! with the ratio per row (MetalLB ÷ ferrolb; every row is "lower is better", so a ratio above 1
//! means ferrolb is ahead) and a last line starting `versus MetalLB:`.
//!
//! `cargo bench -p ferrolb-e2e --bench versus_metallb` (as root; it builds the lab tool, the
//! controller and the speaker it runs first, in the bench's release profile; `e2e/install-deps`
//! builds MetalLB).
//!
//! Rows so far: Service creation to IP (single Services one after the other, p50/p99; a burst,
//! all IPs and p99), layer 2 outage when the owner's link is cut and when its speaker is killed
//! (p50/p99/max, UDP probe every 10 ms from the client), and the controller's and one speaker's
//! memory and the controller's CPU time with the burst's Services, the API writes per minute at
//! rest with them (once 10 s pass with no Service write; the API server's counters, less the
//! lab's own rate measured before the system started), and 10,000 BGP prefixes to FRR after the session comes up (Services from a BGP pool
//! with an endpoint each, ignored by kube-proxy; then a BGPPeer for node1; the router's summary
//! polled until it counts them all).
//!
//! Environment: `FERROLB_VERSUS_SYSTEMS` (`metallb,ferrolb`: both, the default; one name
//! measures that side only), `FERROLB_BENCH_TRIALS` (default 10) failover trials per system,
//! `FERROLB_BENCH_SINGLES` (default 30), `FERROLB_BENCH_BURST` (default 1000),
//! `FERROLB_BENCH_PREFIXES` (default 10000), `FERROLB_BENCH_REST_SECONDS` (default 60).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use ferrolb_e2e::Lab;
use ferrolb_e2e::apiserver_metrics::{self, Writes};
use ferrolb_e2e::bench::{
    burst, cpu_ticks, env_usize, mib, percentile, percentiles, proc_status_bytes, wait_all,
    watch_ips,
};
use ferrolb_e2e::ferrolb::{self, Deployment, NAMESPACE};
use ferrolb_e2e::metallb::MetalLb;
use ferrolb_e2e::scope::TestScope;
use ferrolb_e2e::systems::{Fault, Running, failover_trial};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, PostParams};

const NODES: [&str; 3] = ["node1", "node2", "node3"];
/// How long each failover trial probes; the kill comes after [`BEFORE_KILL`].
const WINDOW: Duration = Duration::from_secs(25);
const BEFORE_KILL: Duration = Duration::from_secs(2);

/// The bench's pool: room for the burst, and the lab segment's layer 2 range first (the
/// failover Service is created first and gets its first address).
fn config() -> String {
    ferrolb::l2_pool("versus", &["198.18.200.0/21"])
}

/// A system's figures, in the order of [`ROWS`].
type Figures = Vec<Option<f64>>;

const ROWS: [&str; 16] = [
    "Service to IP, single, p50 (ms)",
    "Service to IP, single, p99 (ms)",
    "burst: all IPs (ms)",
    "burst: Service to IP p99 (ms)",
    "L2 outage, owner's link cut, p50 (ms)",
    "L2 outage, owner's link cut, p99 (ms)",
    "L2 outage, owner's link cut, max (ms)",
    "L2 outage, owner's speaker killed, p50 (ms)",
    "L2 outage, owner's speaker killed, p99 (ms)",
    "L2 outage, owner's speaker killed, max (ms)",
    "controller RSS after the burst (MiB)",
    "controller CPU for the burst (s)",
    "speaker RSS (node1) after the burst (MiB)",
    "API writes per minute at rest, 1,000 Services",
    "BGP: all prefixes at FRR after session up (ms)",
    "BGP: BGPPeer created to all prefixes (ms)",
];

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if !std::env::args().any(|a| a == "--bench") {
        return Ok(());
    }
    let mut results: Vec<(&'static str, Figures)> = Vec::new();
    // `FERROLB_VERSUS_SYSTEMS=ferrolb` (or `metallb`) measures one side only, e.g. to repeat it.
    let systems = std::env::var("FERROLB_VERSUS_SYSTEMS").unwrap_or_default();
    for metallb in [true, false] {
        let key = if metallb { "metallb" } else { "ferrolb" };
        if !systems.is_empty() && !systems.split(',').any(|s| s.trim() == key) {
            continue;
        }
        let lab = ferrolb_e2e::bench::lab_up().await?;
        let outcome = measure(&lab, metallb).await;
        ferrolb_e2e::bench::lab_done()?;
        results.push(outcome?);
    }
    print_table(&results);
    Ok(())
}

async fn measure(lab: &Lab, metallb: bool) -> anyhow::Result<(&'static str, Figures)> {
    // The lab's own writers (node agent, kube-controller-manager) before the system starts.
    let client = lab.client().await?;
    let window = Duration::from_secs(30);
    let before = apiserver_metrics::writes(&client).await?;
    tokio::time::sleep(window).await;
    let lab_rate = apiserver_metrics::per_minute(
        &before,
        &apiserver_metrics::writes(&client).await?,
        window.as_secs_f64(),
    );
    println!(
        "lab's own API writes per minute: {}",
        show_writes(&lab_rate)
    );
    let running = if metallb {
        Running::MetalLb(MetalLb::start(lab, &config()).await?)
    } else {
        // As the chart ships it: the lab's fast Lease timings would triple the writes at rest.
        Running::Ferrolb(Deployment::start_with(
            lab,
            "versus",
            &config(),
            &ferrolb::SHIPPED_LEASE_TIMINGS,
        )?)
    };
    let figures = scenarios(lab, &running, apiserver_metrics::total(&lab_rate)).await;
    running.stop();
    Ok((running.name(), figures?))
}

async fn scenarios(lab: &Lab, running: &Running, lab_writes: f64) -> anyhow::Result<Figures> {
    let name = running.name();
    let mut scope = TestScope::new(lab, "versus").await?;
    let api: Api<Service> = Api::namespaced(lab.client().await?, &scope.namespace);

    // Failover first: the Service gets the pool's first address, on the lab segment.
    let ip = ferrolb_e2e::bench::probe_service(&mut scope, &api, "node1").await?;
    let first_owner = lab.answering_node("client", &ip).await?;
    ferrolb_e2e::bench::serve_away_from(&mut scope, &api, "probe", &NODES, &first_owner).await?;
    let mut figures = Vec::new();
    for fault in [Fault::LinkCut, Fault::SpeakerKill] {
        let mut outages = Vec::new();
        for trial in 0..ferrolb_e2e::bench::trials(10) {
            let gap =
                failover_trial(lab, running, fault, &ip, &first_owner, WINDOW, BEFORE_KILL).await?;
            println!("{name}: trial {trial}: {first_owner}: {fault:?}, longest gap {gap:.0} ms");
            outages.push(gap);
        }
        if let Some(line) = percentiles(&format!("{name} L2 outage, {fault:?}"), outages.clone()) {
            println!("{line}");
        }
        outages.sort_by(f64::total_cmp);
        let outage = |p: f64| {
            let i = ((p * outages.len() as f64).ceil() as usize).clamp(1, outages.len().max(1)) - 1;
            outages.get(i).copied()
        };
        figures.extend([outage(0.5), outage(0.99), outages.last().copied()]);
    }

    let seen = watch_ips(api.clone());
    let mut single = Vec::new();
    for i in 0..env_usize("FERROLB_BENCH_SINGLES", 30) {
        let (l, _, _) = burst(&api, &seen, &format!("single{i}"), 1, 1).await?;
        single.extend(l);
    }
    single.sort();
    let n = env_usize("FERROLB_BENCH_BURST", 1000);
    let controller = running.controller_pid();
    let cpu_before = cpu_ticks(controller);
    let started = Instant::now();
    let (latencies, total, _) = burst(&api, &seen, "burst", n, 64).await?;
    // Let the speakers catch up before their memory is read.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let cpu = cpu_ticks(controller)
        .zip(cpu_before)
        .map(|(after, before)| after.saturating_sub(before) as f64 / 100.0);
    println!(
        "{name}: burst of {n} in {:.1} s; controller RSS {:.1} MiB, CPU {:?} s",
        started.elapsed().as_secs_f64(),
        mib(proc_status_bytes(controller, "VmRSS:")),
        cpu
    );
    let ms = |d: Duration| Some(d.as_secs_f64() * 1000.0);
    let speaker_rss = running
        .speaker_pid("node1")
        .and_then(|pid| proc_status_bytes(pid, "VmRSS:"));
    let mut rows = vec![
        ms(percentile(&single, 0.5)),
        ms(percentile(&single, 0.99)),
        ms(total),
        ms(percentile(&latencies, 0.99)),
    ];
    rows.extend(figures);
    rows.extend([
        proc_status_bytes(controller, "VmRSS:").map(|b| mib(Some(b))),
        cpu,
        speaker_rss.map(|b| mib(Some(b))),
    ]);

    // At rest with the burst's Services: once a 10 s window has no Service writes (MetalLB
    // writes status for tens of seconds after the last IP appears; its client sends 20
    // requests/s), bounded.
    let client = lab.client().await?;
    let settle_from = Instant::now();
    let mut before = apiserver_metrics::writes(&client).await?;
    loop {
        tokio::time::sleep(Duration::from_secs(10)).await;
        let now = apiserver_metrics::writes(&client).await?;
        let window = apiserver_metrics::per_minute(&before, &now, 10.0);
        before = now;
        let busy = window.keys().any(|k| k.starts_with("core/services"));
        if !busy || settle_from.elapsed() > Duration::from_secs(300) {
            println!(
                "{name}: at rest after {:.0} s (last window: {})",
                settle_from.elapsed().as_secs_f64(),
                show_writes(&window)
            );
            break;
        }
    }
    let rest = Duration::from_secs(env_usize("FERROLB_BENCH_REST_SECONDS", 60) as u64);
    tokio::time::sleep(rest).await;
    let at_rest = apiserver_metrics::per_minute(
        &before,
        &apiserver_metrics::writes(&client).await?,
        rest.as_secs_f64(),
    );
    println!(
        "{name}: API writes per minute at rest, with the lab's own: {}",
        show_writes(&at_rest)
    );
    rows.push(Some(
        (apiserver_metrics::total(&at_rest) - lab_writes).max(0.0),
    ));

    let (session_up, peer_created) = prefixes(lab, &scope, &seen, name).await?;
    rows.extend([session_up, peer_created].map(|d| d.and_then(ms)));
    Ok(rows)
}

/// The BGP pool of the prefix scenario (room for 16,384 /32s, off the layer 2 pools), only for
/// Services that name it.
fn prefix_config() -> String {
    format!(
        "apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {{name: prefixes, namespace: {NAMESPACE}}}
spec:
  addresses: ['198.18.128.0/18']
  autoAssign: false
---
apiVersion: metallb.io/v1beta1
kind: BGPAdvertisement
metadata: {{name: prefixes, namespace: {NAMESPACE}}}
spec:
  ipAddressPools: [prefixes]
"
    )
}

/// The router, peered from node1 only: one session to time.
fn peer_config() -> String {
    format!(
        "apiVersion: metallb.io/v1beta2
kind: BGPPeer
metadata: {{name: router, namespace: {NAMESPACE}}}
spec:
  myASN: 64512
  peerASN: 64500
  peerAddress: 198.18.0.254
  holdTime: 9s
  nodeSelectors:
  - matchLabels: {{kubernetes.io/hostname: node1}}
"
    )
}

/// A Service of the prefix scenario: from the BGP pool, with the probe pods as endpoints (both
/// systems announce a Cluster-policy Service only while it has one), ignored by kube-proxy (its
/// rules are not what is measured, and 10,000 Services would keep it busy for minutes).
fn prefix_service(name: &str) -> Service {
    ferrolb_e2e::bench::service(name)
        .label("service.kubernetes.io/service-proxy-name", "none")
        .annotation("metallb.io/address-pool", "prefixes")
        .selector("app", "probe")
        .build()
}

/// `FERROLB_BENCH_PREFIXES` Services with IPs and endpoints, then the BGPPeer: how long after the
/// session is up (and after the peer was created) the router counts every prefix.
async fn prefixes(
    lab: &Lab,
    scope: &TestScope,
    seen: &ferrolb_e2e::bench::Seen,
    name: &str,
) -> anyhow::Result<(Option<Duration>, Option<Duration>)> {
    let n = env_usize("FERROLB_BENCH_PREFIXES", 10_000);
    if n == 0 {
        return Ok((None, None));
    }
    lab.apply(&prefix_config())?;
    let client = lab.client().await?;
    let api: Api<Service> = Api::namespaced(client.clone(), &scope.namespace);
    let names: Vec<String> = (0..n).map(|i| format!("pfx-{i:05}")).collect();
    let started = Instant::now();
    futures::stream::iter(names.iter().cloned())
        .map(|service| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &prefix_service(&service))
                    .await
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    wait_all(
        seen,
        &names,
        &format!("{n} Services of the BGP pool to get IPs"),
    )
    .await?;
    let slices: Api<EndpointSlice> = Api::namespaced(client, &scope.namespace);
    ferrolb_e2e::cluster::wait_for(
        &format!("{n} Services of the BGP pool to have a ready endpoint"),
        Duration::from_secs(900),
        || async {
            let ready = slices
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .iter()
                .filter(|s| {
                    s.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get("kubernetes.io/service-name"))
                        .is_some_and(|svc| svc.starts_with("pfx-"))
                        && s.endpoints
                            .iter()
                            .any(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false))
                })
                .count();
            if ready >= n {
                Ok(Some(()))
            } else {
                Err(format!("{ready} of {n}"))
            }
        },
    )
    .await?;
    println!(
        "{name}: {n} Services of the BGP pool with IPs and endpoints in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    // Let the speakers take in the last of them before the session starts.
    tokio::time::sleep(Duration::from_secs(10)).await;

    let created = Instant::now();
    lab.apply(&peer_config())?;
    // The session came up after the last poll that saw it down: "after session up" is measured
    // from that poll, an upper bound that holds however fast the prefixes follow (a system that
    // sends them with its first UPDATE is seen with them in the very poll that sees it up).
    let mut down_at = created;
    let mut established = false;
    let deadline = created + Duration::from_secs(600);
    loop {
        let polled = Instant::now();
        let summary = ferrolb_e2e::router::vtysh(lab, &["show bgp ipv4 unicast summary json"])?;
        let now = Instant::now();
        let json: serde_json::Value = serde_json::from_str(&summary).unwrap_or_default();
        let peer = &json["peers"]["198.18.0.11"];
        if !established {
            if peer["state"] == "Established" {
                established = true;
            } else {
                down_at = polled;
            }
        }
        let count = peer["pfxRcd"].as_u64().unwrap_or(0) as usize;
        if count >= n {
            let up = established.then(|| now.saturating_duration_since(down_at));
            println!(
                "{name}: {n} prefixes at FRR {:.0} ms after the BGPPeer, {:.0?} after session up",
                (now - created).as_secs_f64() * 1000.0,
                up
            );
            return Ok((up, Some(now - created)));
        }
        anyhow::ensure!(
            now < deadline,
            "{name}: FRR counts {count} of {n} prefixes from node1 after 600 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Writes per minute, the total and the resources with the most.
fn show_writes(w: &Writes) -> String {
    let mut top: Vec<_> = w.iter().collect();
    top.sort_by(|a, b| b.1.total_cmp(a.1));
    let list: Vec<String> = top
        .iter()
        .take(8)
        .map(|(k, v)| format!("{k} {v:.1}"))
        .collect();
    format!("{:.1} ({})", apiserver_metrics::total(w), list.join(", "))
}

fn print_table(results: &[(&'static str, Figures)]) {
    let find = |name: &str| results.iter().find(|(n, _)| *n == name).map(|(_, f)| f);
    let none: Figures = vec![None; ROWS.len()];
    let (theirs, ours) = (
        find("MetalLB").unwrap_or(&none),
        find("ferrolb").unwrap_or(&none),
    );
    println!();
    println!(
        "{:46} {:>12} {:>12} {:>8}",
        "row (lower is better)", "MetalLB", "ferrolb", "ratio"
    );
    let mut ahead = 0;
    let mut rows = 0;
    for (i, row) in ROWS.iter().enumerate() {
        let (t, o) = (theirs[i], ours[i]);
        // A zero (nothing measurable) has no meaningful ratio.
        let ratio = t.zip(o).filter(|(_, o)| *o > 0.0).map(|(t, o)| t / o);
        let show = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        println!(
            "{row:46} {:>12} {:>12} {:>8}",
            show(t),
            show(o),
            ratio.map_or("-".to_string(), |r| format!("{r:.2}x"))
        );
        if let Some(r) = ratio {
            rows += 1;
            if r > 1.0 {
                ahead += 1;
            }
        }
    }
    println!(
        "versus MetalLB: ferrolb ahead on {ahead} of {rows} rows (ratio = MetalLB / ferrolb; namespace {NAMESPACE})"
    );
}
