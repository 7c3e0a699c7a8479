//! The nemesis (issue #36): faults from a seeded schedule, overlapping, while a client on the
//! segment probes every LoadBalancer IP every 10 ms; then the checkers read the history.
//!
//! `cargo bench -p ferrolb-e2e --bench nemesis` (as root; it builds the lab tool, the
//! controller and the speaker first, in the bench's release profile). Environment:
//!
//! * `FERROLB_NEMESIS_SEED` (default 1): the schedule's seed. The same seed gives the same
//!   faults at the same times on the same nodes.
//! * `FERROLB_NEMESIS_MINUTES` (default 2, fractions allowed): the run's length; its last 30 s
//!   are free of faults, so recovery is checked.
//! * `FERROLB_NEMESIS_KINDS`: a comma-separated subset of the fault kinds, by their names in
//!   the schedule (`LinkCut,SpeakerKilled`); default: every kind the injector applies.
//! * `FERROLB_NEMESIS_AT_ONCE` (default 2): at most this many faults in force together.
//! * `FERROLB_NEMESIS_BROKEN=quorum`: runs a deliberately broken speaker (the layer 2 quorum
//!   and tenure rules off, built into `target/nemesis-broken/`): the run must then fail with
//!   two owners for an IP (`FERROLB_NEMESIS_KINDS=HeartbeatBlocked` finds it fastest).
//!
//! The lab: process nodes (3), ferrolb's controller and a speaker per node in layer 2 mode
//! (the default membership), two dual-stack Services with `externalTrafficPolicy: Local` and
//! an echo pod on every node, so an IP's traffic depends only on its owner; the client probes
//! their IPs. Meanwhile a seeded workload creates, changes and deletes up to four more
//! Services (`e2e/src/nemesis/workload.rs`), whose IPs the allocation checkers follow. The history goes
//! to `target/nemesis/seed-<S>.json`; the bench prints the faults by kind, the outages by the
//! faults in force when they began (p50/p99/max), memory at the start and end per process,
//! and every violation, and fails when there is one, with the command that replays the run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use ferrolb_e2e::Lab;
use ferrolb_e2e::ferrolb::{self, Deployment};
use ferrolb_e2e::nemesis::broken::Broken;
use ferrolb_e2e::nemesis::check::{self, Bounds, History};
use ferrolb_e2e::nemesis::inject::{Injector, RETRY_EVERY, SUPPORTED};
use ferrolb_e2e::nemesis::record::{Processes, Recorder};
use ferrolb_e2e::nemesis::schedule::{self, FaultKind, Params, Window};
use ferrolb_e2e::nemesis::summary;
use ferrolb_e2e::nemesis::workload;
use ferrolb_e2e::scope::TestScope;
use ferrolb_e2e::service::{ingress_ips, wait_ips};
use ferrolb_testkit::objects::service;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, PostParams};

/// The controller's identity in the lab.
const IDENTITY: &str = "nemesis";

struct Settings {
    seed: u64,
    minutes: f64,
    kinds: Vec<FaultKind>,
    at_once: usize,
    broken: Option<Broken>,
}

fn settings() -> anyhow::Result<Settings> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let seed = var("FERROLB_NEMESIS_SEED").map_or(Ok(1), |v| v.trim().parse())?;
    let minutes = var("FERROLB_NEMESIS_MINUTES").map_or(Ok(2.0), |v| v.trim().parse())?;
    anyhow::ensure!(
        (0.75..=24.0 * 60.0).contains(&minutes),
        "FERROLB_NEMESIS_MINUTES={minutes}: from 0.75 to 1440"
    );
    let at_once = var("FERROLB_NEMESIS_AT_ONCE").map_or(Ok(2), |v| v.trim().parse())?;
    let kinds = match var("FERROLB_NEMESIS_KINDS") {
        None => SUPPORTED.to_vec(),
        Some(list) => list
            .split(',')
            .map(|name| {
                let name = name.trim();
                SUPPORTED
                    .iter()
                    .find(|k| format!("{k:?}") == name)
                    .copied()
                    .ok_or_else(|| {
                        anyhow::anyhow!(
                            "FERROLB_NEMESIS_KINDS: {name:?} is none of {:?}",
                            SUPPORTED
                        )
                    })
            })
            .collect::<anyhow::Result<_>>()?,
    };
    let broken = var("FERROLB_NEMESIS_BROKEN")
        .map(|name| Broken::named(name.trim()))
        .transpose()?;
    Ok(Settings {
        seed,
        minutes,
        kinds,
        at_once,
        broken,
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    if !std::env::args().any(|a| a == "--bench") {
        return Ok(());
    }
    let settings = settings()?;
    let speaker = settings.broken.map(Broken::build).transpose()?;
    let lab = ferrolb_e2e::bench::lab_up().await?;
    let result = run(&lab, &settings, speaker.as_deref()).await;
    ferrolb_e2e::bench::lab_done()?;
    let broken = match settings.broken {
        Some(b) => format!(
            "FERROLB_NEMESIS_BROKEN={} ",
            Broken::ALL
                .iter()
                .find(|(_, x)| *x == b)
                .map_or("", |(n, _)| n)
        ),
        None => String::new(),
    };
    let replay = format!(
        "{broken}FERROLB_NEMESIS_SEED={} FERROLB_NEMESIS_MINUTES={} FERROLB_NEMESIS_AT_ONCE={} \
         FERROLB_NEMESIS_KINDS={} cargo bench -p ferrolb-e2e --bench nemesis",
        settings.seed,
        settings.minutes,
        settings.at_once,
        settings
            .kinds
            .iter()
            .map(|k| format!("{k:?}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    if let Err(e) = &result {
        println!("nemesis: FAILED: {e:#}\nreplay with: {replay}");
    }
    result
}

async fn run(
    lab: &Lab,
    settings: &Settings,
    speaker: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let next_key = Injector::next_key_file(lab).display().to_string();
    let deployment = Deployment::start_with_speaker_exe(
        lab,
        IDENTITY,
        &ferrolb::l2_pool("nemesis", &["198.18.200.0/25", "fd00:18::c8:0/113"]),
        &[],
        &["--gossip-next-key-file", &next_key],
        speaker,
    )?;
    let result = with_deployment(lab, &deployment, settings).await;
    deployment.stop();
    result
}

async fn with_deployment(
    lab: &Lab,
    deployment: &Deployment,
    settings: &Settings,
) -> anyhow::Result<()> {
    let nodes: Vec<String> = lab.topology.nodes().map(|n| n.name.clone()).collect();
    let mut scope = TestScope::new(lab, "nemesis").await?;
    let node_refs: Vec<&str> = nodes.iter().map(String::as_str).collect();
    scope.deploy("echo", &node_refs).await?;
    let api: Api<Service> = Api::namespaced(lab.client().await?, &scope.namespace);
    let mut ips: Vec<IpAddr> = Vec::new();
    for name in ["a", "b"] {
        api.create(
            &PostParams::default(),
            &service(name)
                .ip_family_policy("RequireDualStack")
                .external_traffic_policy("Local")
                .selector("app", "echo")
                .named_port("udp", 8081, 8081, "UDP")
                .build(),
        )
        .await?;
        let s = wait_ips(&api, name, 2).await?;
        ips.extend(
            ingress_ips(&s)
                .iter()
                .filter_map(|ip| ip.parse::<IpAddr>().ok()),
        );
    }
    for ip in &ips {
        let owner = lab.answering_node("client", &ip.to_string()).await?;
        println!("nemesis: {ip} answered by {owner}");
    }
    let mut macs = BTreeMap::new();
    for n in &nodes {
        macs.insert(lab.mac_of(n)?.to_ascii_lowercase(), n.clone());
    }

    let run_length = Duration::from_secs_f64(settings.minutes * 60.0);
    let params = Params {
        run: run_length,
        nodes: nodes.clone(),
        kinds: settings.kinds.clone(),
        at_once: settings.at_once,
        gap: (Duration::from_secs(1), Duration::from_secs(8)),
        quiet_end: Duration::from_secs(30),
    };
    let windows = schedule::schedule(settings.seed, &params);
    println!(
        "nemesis: seed {}, {:.2} min, {} faults, at most {} at once",
        settings.seed,
        settings.minutes,
        windows.len(),
        settings.at_once
    );
    for w in &windows {
        println!(
            "  {:>8.1} s  {:>5.1} s  {:?} {}",
            w.start.as_secs_f64(),
            w.length.as_secs_f64(),
            w.kind,
            w.target.as_deref().unwrap_or("")
        );
    }

    let lab_dir = lab.dir.clone();
    let processes: Processes = std::sync::Arc::new(move || {
        let Ok(Some(state)) = ferrolb_e2e::lab::State::load(&lab_dir) else {
            return Vec::new();
        };
        state
            .processes
            .iter()
            .filter(|p| {
                p.kind == ferrolb_e2e::process::Kind::Ferrolb && ferrolb_e2e::process::running(p)
            })
            .map(|p| (p.name.clone(), p.pid))
            .collect()
    });
    let recorder = Recorder::start(lab, "client", &ips, api.clone(), processes, run_length)?;
    let steps = workload::plan(
        settings.seed,
        run_length.saturating_sub(params.quiet_end),
        (Duration::from_secs(2), Duration::from_secs(10)),
        4,
        &(100..120)
            .map(|i| format!("198.18.200.{i}"))
            .collect::<Vec<_>>(),
    );
    println!("nemesis: {} workload steps", steps.len());
    let mut injector = Injector::new(lab, deployment, IDENTITY).await?;
    let (injected, refused) = tokio::join!(
        inject(&mut injector, &recorder, &windows),
        work(&api, &recorder, &steps)
    );
    println!(
        "nemesis: workload: {} of {} steps refused or failed (an API server or etcd down)",
        refused,
        steps.len()
    );
    let undone = injector.undo_all().await;
    drop(injector);
    let observations = recorder.finish(&macs).await?;
    let applied = injected?;
    undone?;

    let history = History {
        faults: applied,
        observations,
        run: u64::try_from(run_length.as_millis())?,
        nodes,
    };
    let dir = ferrolb_e2e::lab::repo_root().join("target").join("nemesis");
    std::fs::create_dir_all(&dir)?;
    let file = dir.join(format!("seed-{}.json", settings.seed));
    std::fs::write(&file, serde_json::to_vec(&history)?)?;
    println!("nemesis: history in {}", file.display());
    println!("{}", summary::summary(&history, ips.len()));
    let violations = check::check(&history, &Bounds::default());
    anyhow::ensure!(violations.is_empty(), "{} violations", violations.len());
    Ok(())
}

/// Runs the workload's `steps` at their times; returns how many failed.
async fn work(api: &Api<Service>, recorder: &Recorder, steps: &[workload::Step]) -> usize {
    let mut failed = 0;
    for step in steps {
        let now = Duration::from_millis(recorder.now());
        if let Some(wait) = step.at.checked_sub(now) {
            tokio::time::sleep(wait).await;
        }
        if let Err(e) = workload::apply(api, recorder, step).await {
            println!("nemesis: workload {step:?}: {e:#}");
            failed += 1;
        }
    }
    failed
}

/// Applies and undoes `windows` at their times; returns the windows that were applied.
async fn inject(
    injector: &mut Injector<'_>,
    recorder: &Recorder,
    windows: &[Window],
) -> anyhow::Result<Vec<Window>> {
    // (time, apply?, window), latest first: an undo sorts before an apply at the same time.
    let mut events: Vec<(Duration, bool, usize)> = Vec::new();
    for (i, w) in windows.iter().enumerate() {
        events.push((w.start, true, i));
        events.push((w.end(), false, i));
    }
    let order = |e: &(Duration, bool, usize)| std::cmp::Reverse((e.0, e.1, e.2));
    events.sort_by_key(order);
    let mut applied = Vec::new();
    let mut failed = BTreeSet::new();
    let mut retries = BTreeMap::new();
    while let Some((t, apply, i)) = events.pop() {
        let now = Duration::from_millis(recorder.now());
        if let Some(wait) = t.checked_sub(now) {
            tokio::time::sleep(wait).await;
        }
        let w = &windows[i];
        if apply {
            match injector.apply(w).await {
                Ok(()) => {
                    let at = Duration::from_millis(recorder.now());
                    applied.push(Window {
                        start: at,
                        length: w.end().saturating_sub(at),
                        ..w.clone()
                    });
                }
                Err(e) => {
                    println!("nemesis: could not inject {w:?}: {e:#}");
                    failed.insert(i);
                }
            }
        } else if !failed.contains(&i) {
            if !injector.undo(w).await? {
                // Its undo needs the API server, which another fault holds down: later, so
                // that the undo which brings it back is not kept waiting. Two minutes at most.
                let tries = retries.entry(i).or_insert(0u32);
                *tries += 1;
                anyhow::ensure!(
                    *tries <= 120,
                    "could not undo {w:?}: the API server did not answer for two minutes"
                );
                let later = Duration::from_millis(recorder.now()) + RETRY_EVERY;
                events.push((later, false, i));
                events.sort_by_key(order);
                continue;
            }
            // The window as it really was: until it was undone.
            if let Some(a) = applied
                .iter_mut()
                .find(|a| a.kind == w.kind && a.target == w.target && a.start >= w.start)
            {
                a.length = Duration::from_millis(recorder.now()).saturating_sub(a.start);
            }
        }
    }
    Ok(applied)
}
