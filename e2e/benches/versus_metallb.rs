//! ferrolb against MetalLB v0.15.2 in the lab, side by side (issue #16 item 4): the same
//! scenarios on each, each system on a fresh lab, MetalLB first, then ferrolb. Prints one table
//! with the ratio per row (MetalLB ÷ ferrolb; every row is "lower is better", so a ratio above 1
//! means ferrolb is ahead) and a last line starting `versus MetalLB:`.
//!
//! `cargo build --release -p ferrolb-controller -p ferrolb-speaker -p ferrolb-e2e --bins &&
//! cargo bench -p ferrolb-e2e --bench versus_metallb` (as root; `e2e/install-deps` builds MetalLB).
//!
//! Rows so far: Service creation to IP (single Services one after the other, p50/p99; a burst,
//! all IPs and p99), layer 2 outage when the owner's link is cut and when its speaker is killed
//! (p50/p99/max, UDP probe every 10 ms from the client), and the controller's and one speaker's
//! memory and the controller's CPU time with the burst's Services. Not yet: 10,000 BGP prefixes
//! to FRR, API writes per minute at rest.
//!
//! Environment: `FERROLB_BENCH_TRIALS` (default 10) failover trials per system,
//! `FERROLB_BENCH_SINGLES` (default 30), `FERROLB_BENCH_BURST` (default 1000).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use ferrolb_e2e::Lab;
use ferrolb_e2e::bench::{
    burst, cpu_ticks, env_usize, finish_probe, mib, percentile, percentiles, proc_status_bytes,
    start_probe, watch_ips,
};
use ferrolb_e2e::ferrolb::{self, Deployment, NAMESPACE};
use ferrolb_e2e::metallb::MetalLb;
use ferrolb_e2e::scope::TestScope;
use ferrolb_e2e::service::{ingress_ips, lb_service, wait_ips};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, PostParams};

const NODES: [&str; 3] = ["node1", "node2", "node3"];
/// How long each failover trial probes; the kill comes after [`BEFORE_KILL`].
const WINDOW: Duration = Duration::from_secs(25);
const BEFORE_KILL: Duration = Duration::from_secs(2);

/// One system running in the lab.
enum Running {
    MetalLb(MetalLb),
    Ferrolb(Deployment),
}

impl Running {
    fn name(&self) -> &'static str {
        match self {
            Running::MetalLb(_) => "MetalLB",
            Running::Ferrolb(_) => "ferrolb",
        }
    }

    fn controller_pid(&self) -> i32 {
        match self {
            Running::MetalLb(m) => m.controller.pid,
            Running::Ferrolb(f) => f.controller.pid,
        }
    }

    fn speaker_pid(&self, node: &str) -> Option<i32> {
        match self {
            Running::MetalLb(m) => m.speaker(node).map(|p| p.pid),
            Running::Ferrolb(f) => f.speakers.process(node).map(|p| p.pid),
        }
    }

    fn kill_speaker(&self, node: &str) {
        match self {
            Running::MetalLb(m) => m.kill_speaker(node),
            Running::Ferrolb(f) => f.speakers.kill(node),
        }
    }

    async fn start_speaker(&self, node: &str) -> anyhow::Result<()> {
        match self {
            Running::MetalLb(m) => m.start_speaker(node).await,
            Running::Ferrolb(f) => f.speakers.start(node),
        }
    }

    fn stop(&self) {
        match self {
            Running::MetalLb(m) => m.stop(),
            Running::Ferrolb(f) => f.stop(),
        }
    }
}

/// The bench's pool: room for the burst, and the lab segment's layer 2 range first (the
/// failover Service is created first and gets its first address).
fn config() -> String {
    ferrolb::l2_pool("versus", &["198.18.200.0/21"])
}

/// A system's figures, in the order of [`ROWS`].
type Figures = Vec<Option<f64>>;

const ROWS: [&str; 13] = [
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
];

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if !std::env::args().any(|a| a == "--bench") {
        return Ok(());
    }
    let mut results: Vec<(&'static str, Figures)> = Vec::new();
    for metallb in [true, false] {
        let lab = ferrolb_e2e::bench::lab_up().await?;
        let outcome = measure(&lab, metallb).await;
        ferrolb_e2e::bench::lab_done()?;
        results.push(outcome?);
    }
    print_table(&results);
    Ok(())
}

async fn measure(lab: &Lab, metallb: bool) -> anyhow::Result<(&'static str, Figures)> {
    let running = if metallb {
        Running::MetalLb(MetalLb::start(lab, &config()).await?)
    } else {
        Running::Ferrolb(Deployment::start(lab, "versus", &config())?)
    };
    let figures = scenarios(lab, &running).await;
    running.stop();
    Ok((running.name(), figures?))
}

async fn scenarios(lab: &Lab, running: &Running) -> anyhow::Result<Figures> {
    let name = running.name();
    let mut scope = TestScope::new(lab, "versus").await?;
    let api: Api<Service> = Api::namespaced(lab.client().await?, &scope.namespace);

    // Failover first: the Service gets the pool's first address, on the lab segment.
    scope.deploy("seed", &["node1"]).await?;
    api.create(
        &PostParams::default(),
        &lb_service(
            "probe",
            serde_json::json!({"spec": {"selector": {"app": "seed"},
                "ports": [{"name": "udp", "port": 8081, "targetPort": 8081, "protocol": "UDP"}]}}),
        )?,
    )
    .await?;
    let ip = ingress_ips(&wait_ips(&api, "probe", 1).await?).remove(0);
    let first_owner = lab.answering_node("client", &ip).await?;
    ferrolb_e2e::bench::serve_away_from(&mut scope, &api, "probe", &NODES, &first_owner).await?;
    let mut figures = Vec::new();
    for fault in [Fault::LinkCut, Fault::SpeakerKill] {
        let mut outages = Vec::new();
        for trial in 0..ferrolb_e2e::bench::trials(10) {
            // The pods are away from the first owner: a fault there measures the announcement,
            // not kube-proxy's handling of a dead endpoint. Both systems hand the IP back to it
            // once it is healthy (rendezvous or consistent hashing; ferrolb after flap damping).
            let owner = ferrolb_e2e::cluster::wait_for(
                &format!("{first_owner} to answer for {ip} again"),
                Duration::from_secs(180),
                || async {
                    let now = lab
                        .answering_node("client", &ip)
                        .await
                        .map_err(|e| e.to_string())?;
                    if now == first_owner {
                        Ok(Some(now))
                    } else {
                        Err(now)
                    }
                },
            )
            .await?;
            let probe = start_probe(lab, "client", &ip, WINDOW)?;
            tokio::time::sleep(BEFORE_KILL).await;
            match fault {
                Fault::LinkCut => lab.set_link(&owner, false)?,
                Fault::SpeakerKill => running.kill_speaker(&owner),
            }
            let report = tokio::task::spawn_blocking(move || finish_probe(probe)).await??;
            match fault {
                Fault::LinkCut => lab.set_link(&owner, true)?,
                Fault::SpeakerKill => running.start_speaker(&owner).await?,
            }
            println!(
                "{name}: trial {trial}: {owner}: {fault:?}, longest gap {:.0} ms",
                report.max_gap_ms
            );
            outages.push(report.max_gap_ms);
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
    Ok(rows)
}

/// The layer 2 faults measured on the owner.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// Its lab link goes down: the node is gone for the client.
    LinkCut,
    /// SIGKILL of its speaker: the node still forwards, so the client's neighbour entry keeps
    /// working until a new owner announces itself.
    SpeakerKill,
}

fn print_table(results: &[(&'static str, Figures)]) {
    let find = |name: &str| results.iter().find(|(n, _)| *n == name).map(|(_, f)| f);
    let (Some(theirs), Some(ours)) = (find("MetalLB"), find("ferrolb")) else {
        return;
    };
    println!();
    println!(
        "{:46} {:>12} {:>12} {:>8}",
        "row (lower is better)", "MetalLB", "ferrolb", "ratio"
    );
    let mut ahead = 0;
    let mut rows = 0;
    for (i, row) in ROWS.iter().enumerate() {
        let (t, o) = (theirs[i], ours[i]);
        let ratio = t.zip(o).map(|(t, o)| t / o.max(1e-9));
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
