//! The speaker's cost over a grid of cluster sizes in the lab (issue #40, item 5): N nodes ×
//! S LoadBalancer Services, three of the nodes real (network namespaces with a speaker each)
//! and the rest simulated in the API server (`ferrolb_e2e::simulated_nodes`: a Ready Node, its
//! kubelet Lease and a presence Lease, renewed every 10 s as a kubelet and a speaker would).
//!
//! `cargo bench -p ferrolb-e2e --bench speaker_grid` (as root; it builds what it runs first).
//! Environment:
//!
//! * `FERROLB_BENCH_NODES` (default `3,100,1000`): the values of N; a fresh lab for each.
//! * `FERROLB_BENCH_SERVICES` (default `1000,10000`): the values of S, reached one after the
//!   other by bursts (the second burst adds what the first left out).
//! * `FERROLB_BENCH_CHANGES` (default 100): single Services created one by one at rest, per
//!   cell.
//! * `FERROLB_BENCH_REST_SECONDS` (default 30): the window measured at rest, per cell.
//! * `FERROLB_BENCH_MOVERS` (default 30): Services given endpoints on the real nodes, so that
//!   they are announced and move when a speaker dies (the bursts' Services have no endpoints,
//!   as in the controller bench: planned, not announced).
//!
//! The speakers run `--membership=voters` with the three real nodes as voters (decision record
//! 0023; the legacy membership beats to every node and cannot reach 1,000). The lab's
//! kube-proxies are paused, as in the controller bench. Per cell it reports, for each
//! speaker: the CPU a burst costs (from its start until the speakers stop replanning), RSS
//! (anonymous and file-backed), CPU and replanned Services at rest, and the CPU and replanned
//! Services per single change net of the rest rate; and the API server's watch events per
//! second at rest, by kind. At the last S of each N it kills the speaker owning most movers and
//! counts the API requests per IP move. Prints figures; asserts nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use ferrolb_e2e::apiserver_metrics::{self, Requests};
use ferrolb_e2e::bench::{
    PausedKubeProxies, Seen, burst, cpu_ns, cpu_ticks, create_all, env_usize, mib,
    proc_status_bytes, wait_all, watch_ips,
};
use ferrolb_e2e::cluster::wait_for;
use ferrolb_e2e::ferrolb::{self, NAMESPACE, Speakers};
use ferrolb_e2e::scope::TestScope;
use ferrolb_e2e::simulated_nodes::SimulatedNodes;
use ferrolb_e2e::{Lab, Options};
use ferrolb_testkit::objects;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, PostParams};

/// The bench's namespace.
const SCOPE: &str = "bench-grid";
/// The speakers' presence group (their default).
const PRESENCE_GROUP: &str = "ferrolb-speaker";

/// One cell of the grid.
struct Cell {
    nodes: usize,
    services: usize,
    burst: usize,
    burst_wall: Duration,
    /// CPU seconds of each speaker for the burst.
    burst_cpu: Vec<f64>,
    /// RSS, anonymous and file-backed, MiB, of each speaker after the burst.
    rss: Vec<(f64, f64, f64)>,
    /// Mean CPU of one speaker at rest, milliseconds per second.
    rest_cpu_ms: f64,
    /// Services replanned at rest, all speakers, over the window.
    rest_replanned: f64,
    /// Watch events the API server sent per second at rest, all kinds.
    watch_events: f64,
    /// The three busiest kinds of those.
    watch_top: String,
    /// Mean CPU of one speaker per single change, net of the rest rate, milliseconds.
    change_cpu_ms: f64,
    /// Services one speaker replanned per single change.
    change_replanned: f64,
}

/// The API requests of one round of IP moves.
struct Moves {
    nodes: usize,
    services: usize,
    victim: String,
    moved: usize,
    /// Requests per move, by verb and resource, Leases and watches left out.
    per_move: BTreeMap<(String, String), f64>,
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!(
            "speaker_grid bench: run with `cargo bench -p ferrolb-e2e --bench speaker_grid` (as root)"
        );
        return;
    }
    if !ferrolb_e2e::is_root() {
        eprintln!("speaker_grid bench skipped: the lab needs root");
        return;
    }
    if let Err(e) = ferrolb::build_binaries(&ferrolb_e2e::bench::BINARIES) {
        eprintln!("speaker_grid bench: {e:#}");
        std::process::exit(1);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let list = |name: &str, default: &str| -> Vec<usize> {
        std::env::var(name)
            .unwrap_or_else(|_| default.to_string())
            .split(',')
            .filter_map(|x| x.trim().parse().ok())
            .collect()
    };
    let nodes = list("FERROLB_BENCH_NODES", "3,100,1000");
    let services = list("FERROLB_BENCH_SERVICES", "1000,10000");
    let mut cells = Vec::new();
    let mut moves = Vec::new();
    let mut failed = None;
    for n in nodes {
        let result = rt.block_on(async {
            let lab_exe = ferrolb::workspace_binary("ferrolb-lab")?;
            let lab = Lab::up(Options::default(), &lab_exe).await?;
            row(&lab, n, &services, &mut cells, &mut moves).await
        });
        if let Err(e) = ferrolb_e2e::down() {
            eprintln!("speaker_grid bench: lab down: {e:#}");
        }
        if let Err(e) = result {
            failed = Some(e.context(format!("at {n} nodes")));
            break;
        }
    }
    println!();
    println!(
        "{:>5} {:>6} {:>22} {:>8} {:>26} {:>12} {:>10} {:>12} {:>12} {:>10}",
        "nodes",
        "svcs",
        "burst CPU s (each)",
        "burst s",
        "RSS MiB (anon+file)",
        "rest ms/s",
        "rest plans",
        "watch ev/s",
        "change ms",
        "plans/chg"
    );
    for c in &cells {
        println!(
            "{:>5} {:>6} {:>22} {:>8.0} {:>26} {:>12.2} {:>10.0} {:>12.0} {:>12.2} {:>10.1}",
            c.nodes,
            c.services,
            c.burst_cpu
                .iter()
                .map(|s| format!("{s:.1}"))
                .collect::<Vec<_>>()
                .join("/"),
            c.burst_wall.as_secs_f64(),
            c.rss
                .iter()
                .map(|(_, a, f)| format!("{a:.1}+{f:.1}"))
                .collect::<Vec<_>>()
                .join(" "),
            c.rest_cpu_ms,
            c.rest_replanned,
            c.watch_events,
            c.change_cpu_ms,
            c.change_replanned,
        );
    }
    for c in &cells {
        println!(
            "  {} nodes, {} Services: burst of {}; busiest watch kinds at rest: {}",
            c.nodes, c.services, c.burst, c.watch_top
        );
    }
    for m in &moves {
        println!(
            "moves at {} nodes, {} Services: {} IPs moved off {}; requests per move: {}",
            m.nodes,
            m.services,
            m.moved,
            m.victim,
            m.per_move
                .iter()
                .map(|((verb, what), n)| format!("{verb} {what} {n:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if let Some(e) = failed {
        eprintln!("speaker_grid bench failed: {e:#}");
        std::process::exit(1);
    }
}

/// One N: simulated nodes, the controller and three speakers, then each S in turn.
async fn row(
    lab: &Lab,
    n: usize,
    targets: &[usize],
    cells: &mut Vec<Cell>,
    moves: &mut Vec<Moves>,
) -> anyhow::Result<()> {
    let _paused = PausedKubeProxies::pause(lab);
    let kubeconfig = ferrolb::install(lab)?;
    let client = lab.client().await?;
    let real: Vec<String> = lab.topology.nodes().map(|h| h.name.clone()).collect();
    anyhow::ensure!(
        n >= real.len(),
        "{n} nodes: the lab has {} real ones",
        real.len()
    );
    let started = Instant::now();
    let simulated =
        SimulatedNodes::create(&client, n - real.len(), NAMESPACE, PRESENCE_GROUP).await?;
    println!(
        "{n} nodes: {} simulated nodes created in {:.1?}",
        simulated.names().len(),
        started.elapsed()
    );
    // kube-controller-manager labels and annotates each new Node once (its TTL and OS label):
    // at 1,000 nodes a minute of Node events that would land in the first cell's figures.
    let started = Instant::now();
    let quiet = nodes_settle(&client).await?;
    println!(
        "{n} nodes: Node events {} after {:.1?}",
        if quiet { "settled" } else { "still coming" },
        started.elapsed()
    );
    lab.apply(&format!(
        "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {{name: grid, namespace: {NAMESPACE}}}\nspec:\n  addresses: ['198.18.64.0/18']\n  serviceAllocation: {{priority: 1, namespaces: [{SCOPE}]}}\n---\napiVersion: metallb.io/v1beta1\nkind: L2Advertisement\nmetadata: {{name: grid, namespace: {NAMESPACE}}}\nspec: {{ipAddressPools: [grid]}}\n"
    ))?;
    let scope = TestScope::new(lab, SCOPE).await?;
    let api: Api<Service> = Api::namespaced(client.clone(), &scope.namespace);
    let seen = watch_ips(api.clone());
    let controller = Stopped(ferrolb::start_controller(lab, &kubeconfig, "grid", 7480)?);
    let voters = format!("--voters={}", real.join(","));
    let speakers = Speakers::with_args(lab, &["--membership=voters", &voters])?;
    let outcome = async {
        for node in &real {
            speakers.start(node)?;
        }
        for node in &real {
            ferrolb::wait_speaker_ready(lab, node, Duration::from_secs(120)).await?;
        }
        let movers = env_usize("FERROLB_BENCH_MOVERS", 30);
        let mover_names = create_movers(&client, &api, &real, movers).await?;
        wait_all(&seen, &mover_names, "the movers to get IPs").await?;
        let mut existing = mover_names.len();
        for (i, &target) in targets.iter().enumerate() {
            let cell = measure_cell(lab, &api, &seen, &speakers, n, target, existing).await?;
            existing = cell.services + env_usize("FERROLB_BENCH_CHANGES", 100);
            print_cell(&cell);
            cells.push(cell);
            if i + 1 == targets.len() && movers > 0 {
                let m = measure_moves(lab, &client, &speakers, n, existing).await?;
                println!("  {} IPs moved off {}: {:?}", m.moved, m.victim, m.per_move);
                moves.push(m);
            }
        }
        anyhow::Ok(())
    }
    .await;
    speakers.stop_all();
    drop(controller);
    drop(simulated);
    outcome
}

/// Waits until the API server sends fewer than one Node watch event a second over 5 s (at
/// most 3 minutes); returns whether it did.
async fn nodes_settle(client: &kube::Client) -> anyhow::Result<bool> {
    let nodes = |events: &apiserver_metrics::WatchEvents| -> f64 {
        events
            .iter()
            .filter(|(kind, _)| *kind == "core/nodes" || *kind == "core/Node")
            .map(|(_, n)| n)
            .sum()
    };
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut last = nodes(&apiserver_metrics::watch_events(client).await?);
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let now = nodes(&apiserver_metrics::watch_events(client).await?);
        if now - last < 5.0 {
            return Ok(true);
        }
        last = now;
    }
    Ok(false)
}

/// Stops the controller when dropped, also on error.
struct Stopped(ferrolb_e2e::process::LabProcess);

impl Drop for Stopped {
    fn drop(&mut self) {
        ferrolb_e2e::process::stop(&self.0, Duration::from_secs(5));
    }
}

/// Creates `count` Services `mover-NN`, each with an EndpointSlice written by the bench that
/// holds one ready endpoint on every real node (addresses in the nodes' pod CIDRs, where
/// nothing answers: the IPs are announced, not served).
async fn create_movers(
    client: &kube::Client,
    api: &Api<Service>,
    real: &[String],
    count: usize,
) -> anyhow::Result<Vec<String>> {
    let names: Vec<String> = (0..count).map(|i| format!("mover-{i:02}")).collect();
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), SCOPE);
    for name in &names {
        let mut slice = objects::endpoint_slice(&format!("{name}-bench"))
            .service(name)
            .label("endpointslice.kubernetes.io/managed-by", "ferrolb-bench")
            .port(None, 80, "TCP");
        for (i, node) in real.iter().enumerate() {
            slice = slice.endpoint(
                objects::endpoint(&format!("198.19.{}.250", i + 1))
                    .node(node)
                    .ready(true)
                    .serving(true),
            );
        }
        slices
            .create(&PostParams::default(), &slice.build())
            .await
            .with_context(|| format!("creating the EndpointSlice of {name}"))?;
    }
    create_all(api, &names, 8).await?;
    Ok(names)
}

/// Every speaker's counter of replanned Services (0 for one that cannot be read).
fn replanned(lab: &Lab, speakers: &Speakers) -> Vec<f64> {
    speakers
        .pids()
        .iter()
        .map(|(node, _)| {
            ferrolb::speaker_metric(lab, node, "ferrolb_layer2_replanned_services_total")
                .unwrap_or(0.0)
        })
        .collect()
}

/// Waits until no speaker replans for three seconds in a row.
async fn settle(lab: &Lab, speakers: &Speakers) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut last = replanned(lab, speakers);
    let mut still = 0;
    while still < 3 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the speakers still replan after 10 minutes"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = replanned(lab, speakers);
        still = if now == last { still + 1 } else { 0 };
        last = now;
    }
    Ok(())
}

/// Brings the cluster to `target` Services with one burst, then measures at rest and per
/// single change.
async fn measure_cell(
    lab: &Lab,
    api: &Api<Service>,
    seen: &Seen,
    speakers: &Speakers,
    nodes: usize,
    target: usize,
    existing: usize,
) -> anyhow::Result<Cell> {
    let pids = speakers.pids();
    let size = target.saturating_sub(existing);
    let ticks = |pids: &[(String, i32)]| -> Vec<u64> {
        pids.iter()
            .map(|(_, p)| cpu_ticks(*p).unwrap_or(0))
            .collect()
    };
    let before = ticks(&pids);
    let started = Instant::now();
    if size > 0 {
        burst(api, seen, &format!("burst{target}"), size, 64).await?;
    }
    settle(lab, speakers).await?;
    let burst_wall = started.elapsed();
    let burst_cpu = ticks(&pids)
        .iter()
        .zip(&before)
        .map(|(a, b)| a.saturating_sub(*b) as f64 / 100.0)
        .collect();
    let rss = pids
        .iter()
        .map(|(_, p)| {
            (
                mib(proc_status_bytes(*p, "VmRSS:")),
                mib(proc_status_bytes(*p, "RssAnon:")),
                mib(proc_status_bytes(*p, "RssFile:")),
            )
        })
        .collect();

    // At rest.
    let client = lab.client().await?;
    let rest = Duration::from_secs(env_usize("FERROLB_BENCH_REST_SECONDS", 30) as u64);
    let ns = |pids: &[(String, i32)]| -> u64 { pids.iter().filter_map(|(_, p)| cpu_ns(*p)).sum() };
    let watch_before = apiserver_metrics::watch_events(&client).await?;
    let rest_plans_before: f64 = replanned(lab, speakers).iter().sum();
    let cpu_before = ns(&pids);
    let at = Instant::now();
    tokio::time::sleep(rest).await;
    let cpu_after = ns(&pids);
    let seconds = at.elapsed().as_secs_f64();
    let rest_plans_after: f64 = replanned(lab, speakers).iter().sum();
    let watch_after = apiserver_metrics::watch_events(&client).await?;
    let rest_ns_per_s = (cpu_after - cpu_before) as f64 / seconds / pids.len() as f64;
    let watch = apiserver_metrics::per_second(&watch_before, &watch_after, seconds);
    let mut top: Vec<(&String, &f64)> = watch.iter().collect();
    top.sort_by(|a, b| b.1.total_cmp(a.1));
    let watch_top = top
        .iter()
        .take(3)
        .map(|(k, v)| format!("{k} {v:.1}/s"))
        .collect::<Vec<_>>()
        .join(", ");

    // Single changes at rest: each a Service created and given its IP, one after the other.
    let changes = env_usize("FERROLB_BENCH_CHANGES", 100);
    let plans_before = replanned(lab, speakers).iter().sum::<f64>();
    let cpu_before = ns(&pids);
    let at = Instant::now();
    for i in 0..changes {
        burst(api, seen, &format!("change{target}-{i:03}"), 1, 1).await?;
    }
    // The last change's plan: the speakers may step a moment after the IP is seen.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cpu_after = ns(&pids);
    let elapsed = at.elapsed().as_secs_f64();
    let plans_after = replanned(lab, speakers).iter().sum::<f64>();
    let per_speaker = changes.max(1) as f64 * pids.len() as f64;
    let net = (cpu_after - cpu_before) as f64 - rest_ns_per_s * elapsed * pids.len() as f64;
    Ok(Cell {
        nodes,
        services: target.max(existing),
        burst: size,
        burst_wall,
        burst_cpu,
        rss,
        rest_cpu_ms: rest_ns_per_s / 1e6,
        rest_replanned: rest_plans_after - rest_plans_before,
        watch_events: watch.values().sum(),
        watch_top,
        change_cpu_ms: net / per_speaker / 1e6,
        change_replanned: (plans_after - plans_before) / per_speaker,
    })
}

/// Prints a cell as soon as it is measured (the table at the end repeats it).
fn print_cell(c: &Cell) {
    println!(
        "{} nodes, {} Services (burst of {} in {:.1?}): speaker CPU for the burst {:?} s; RSS {}; at rest {:.2} ms/s a speaker, {} Services replanned, {:.0} watch events/s ({}); a single change {:.2} ms a speaker, {:.1} Services replanned",
        c.nodes,
        c.services,
        c.burst,
        c.burst_wall,
        c.burst_cpu,
        c.rss
            .iter()
            .map(|(t, a, f)| format!("{t:.1} MiB (anonymous {a:.1}, file-backed {f:.1})"))
            .collect::<Vec<_>>()
            .join(", "),
        c.rest_cpu_ms,
        c.rest_replanned,
        c.watch_events,
        c.watch_top,
        c.change_cpu_ms,
        c.change_replanned,
    );
}

/// The nodes the bench's ServiceL2Status objects name, one per announced Service.
fn status_nodes(lab: &Lab) -> anyhow::Result<Vec<String>> {
    ferrolb::l2_status_nodes(lab, &format!("metallb.io/service-namespace={SCOPE}"))
}

/// Kills the speaker that owns most movers and counts the API requests until every one of its
/// IPs has a new owner (its ServiceL2Status deleted by the new owner); then restarts it.
async fn measure_moves(
    lab: &Lab,
    client: &kube::Client,
    speakers: &Speakers,
    nodes: usize,
    services: usize,
) -> anyhow::Result<Moves> {
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for node in status_nodes(lab)? {
        *per_node.entry(node).or_default() += 1;
    }
    let (victim, moved) = per_node
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(node, n)| (node.clone(), *n))
        .context("no mover is announced")?;
    let before = apiserver_metrics::requests(client).await?;
    speakers.kill(&victim);
    // Counted, not listed: a LIST of ServiceL2Status by the bench would count as a speaker's.
    let deletes = |r: &Requests| {
        r.get(&(
            "DELETE".to_string(),
            "metallb.io/servicel2statuses".to_string(),
        ))
        .copied()
        .unwrap_or(0.0)
    };
    let outcome = wait_for(
        &format!("the new owners to delete {victim}'s {moved} ServiceL2Status objects"),
        Duration::from_secs(120),
        || async {
            let now = apiserver_metrics::requests(client)
                .await
                .map_err(|e| e.to_string())?;
            let done = deletes(&now) - deletes(&before);
            if done >= moved as f64 {
                Ok(Some(now))
            } else {
                Err(format!("{done} deletes"))
            }
        },
    )
    .await;
    speakers.start(&victim)?;
    let after = outcome?;
    let per_move = after
        .iter()
        // Leases: the simulated nodes' renewals. WATCH: counted when a watch ends, so these
        // are the killed speaker's own.
        .filter(|((verb, what), _)| {
            !what.starts_with("coordination.k8s.io/leases") && verb != "WATCH"
        })
        .filter_map(|(k, n)| {
            let d = n - before.get(k).copied().unwrap_or(0.0);
            (d > 0.0).then(|| (k.clone(), d / moved as f64))
        })
        .collect();
    ferrolb::wait_speaker_ready(lab, &victim, Duration::from_secs(120)).await?;
    Ok(Moves {
        nodes,
        services,
        victim,
        moved,
        per_move,
    })
}
