//! Layer 2 failover in the lab: how long a client loses a Service when the node that owns its IP
//! loses its link, and when its speaker is SIGKILLed.
//!
//! `cargo build --release -p ferrolb-controller -p ferrolb-speaker && cargo bench -p ferrolb-e2e
//! --bench l2_failover` (as root). Environment:
//!
//! * `FERROLB_BENCH_TRIALS` (default 20): trials per fault.
//! * `FERROLB_BENCH_SPEAKER_ARGS`: extra speaker arguments (e.g. `--failure-timeout=300ms`).
//! * `FERROLB_BENCH_FAULTS`: a comma-separated subset of the faults (default all): `link`,
//!   `kill`, `hb-nonowner`, `hb-owner`, `hb-owner-in`, `hb-owner-out`.
//!
//! The `hb-*` faults are partial: UDP 7946 (the heartbeats) dropped with iptables in one node's
//! namespace, both ways on a node that does not own the IP, both ways on the owner, inbound only
//! on the owner, outbound only on the owner. For them the bench also counts the MACs answering
//! ARP/NDP for each IP from the client 1.5 s after the fault (after detection), and the time
//! from removing the fault until the client's answer comes from the owner again.
//!
//! Each trial: the client sends a UDP datagram to the Service's IPv4 and IPv6 address every 10 ms
//! (`ferrolb-lab probe`) for 4 s; at 1 s the owner's link is cut from the bridge side (or its
//! speaker killed); the outage is the longest gap between answers. The fault is then undone and
//! the trial waits until the owner answers again. The Service's pods run on the two other nodes,
//! so the outage measures the announcement, not kube-proxy's endpoint handling of a dead node.
//! Prints figures; asserts nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use ferrolb_e2e::cluster::wait_for;
use ferrolb_e2e::ferrolb;
use ferrolb_e2e::probe::Report;
use ferrolb_e2e::process;
use ferrolb_e2e::scope::TestScope;
use ferrolb_e2e::service::{ingress_ips, lb_service, wait_ips};
use ferrolb_e2e::{Lab, Options};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, PostParams};

const NODES: [&str; 3] = ["node1", "node2", "node3"];

async fn answering(lab: &Lab, ip: &str) -> anyhow::Result<String> {
    let mac = wait_for(
        &format!("one MAC to answer for {ip}"),
        Duration::from_secs(30),
        || async {
            let macs = lab.l2_answers("client", ip).map_err(|e| e.to_string())?;
            if macs.len() == 1 {
                Ok(macs.into_iter().next())
            } else {
                Err(format!("{macs:?}"))
            }
        },
    )
    .await?;
    for node in NODES {
        if lab.mac_of(node)?.eq_ignore_ascii_case(&mac) {
            return Ok(node.to_string());
        }
    }
    anyhow::bail!("{mac} is no node's")
}

fn start_probe(lab: &Lab, ip: &str) -> anyhow::Result<std::process::Child> {
    Ok(Command::new("ip")
        .args(["netns", "exec", "flb-client"])
        .arg(&lab.lab_exe)
        .args([
            "probe",
            "--ip",
            ip,
            "--interval-ms",
            "10",
            "--duration-ms",
            "4000",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?)
}

fn finish_probe(child: std::process::Child) -> anyhow::Result<Report> {
    let out = child.wait_with_output()?;
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn summary(label: &str, mut gaps: Vec<f64>) {
    gaps.sort_by(f64::total_cmp);
    if gaps.is_empty() {
        return;
    }
    let pct = |p: f64| {
        let i = ((p * gaps.len() as f64).ceil() as usize).clamp(1, gaps.len()) - 1;
        gaps[i]
    };
    println!(
        "{label:32} n={:3}  p50 {:7.0} ms  p99 {:7.0} ms  max {:7.0} ms  min {:7.0} ms",
        gaps.len(),
        pct(0.5),
        pct(0.99),
        gaps[gaps.len() - 1],
        gaps[0]
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    if !std::env::args().any(|a| a == "--bench") {
        return Ok(());
    }
    let trials: usize = std::env::var("FERROLB_BENCH_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let extra = std::env::var("FERROLB_BENCH_SPEAKER_ARGS").unwrap_or_default();
    let extra: Vec<&str> = extra.split_whitespace().collect();
    anyhow::ensure!(
        ferrolb_e2e::is_root(),
        "the failover bench needs root (the lab)"
    );
    // Before the lab comes up: every binary the bench runs must be built (and current).
    let lab_exe = ferrolb::workspace_binary("ferrolb-lab")?;
    ferrolb::workspace_binary("ferrolb-controller")?;
    ferrolb::workspace_binary("ferrolb-speaker")?;
    let lab = Lab::up(Options::default(), &lab_exe).await?;
    let result = measure(&lab, &extra, trials).await;
    if std::env::var_os("FERROLB_KEEP_LAB").is_none() {
        ferrolb_e2e::down()?;
    }
    result
}

/// The bench in a lab that is up; whatever happens, the lab is taken down by the caller.
async fn measure(lab: &Lab, extra: &[&str], trials: usize) -> anyhow::Result<()> {
    let lab = lab.clone();
    let kubeconfig = ferrolb::install(&lab)?;
    let controller = ferrolb::start_controller(&lab, &kubeconfig, "bench", 7472)?;
    let credentials = ferrolb::install_speaker(&lab)?;
    lab.apply(&ferrolb::l2_pool(
        "bench",
        &["198.18.200.0/25", "fd00:18::c8:0/113"],
    ))?;
    let mut speakers: BTreeMap<&str, process::LabProcess> = BTreeMap::new();
    for node in NODES {
        speakers.insert(
            node,
            ferrolb::start_speaker(&lab, &credentials, node, extra)?,
        );
    }
    let result = run(&lab, &credentials, extra, &mut speakers, trials).await;
    for p in speakers.values() {
        process::stop(p, Duration::from_secs(5));
    }
    process::stop(&controller, Duration::from_secs(5));
    let _ = lab.set_link("node1", true);
    let _ = lab.set_link("node2", true);
    let _ = lab.set_link("node3", true);
    result
}

async fn run(
    lab: &Lab,
    credentials: &ferrolb::SpeakerCredentials,
    extra: &[&str],
    speakers: &mut BTreeMap<&'static str, process::LabProcess>,
    trials: usize,
) -> anyhow::Result<()> {
    let mut scope = TestScope::new(lab, "l2-bench").await?;
    let api: Api<Service> = Api::namespaced(lab.client().await?, &scope.namespace);
    // A first pod so the Service is announced and its owner known; then pods on the others.
    scope.deploy("seed", &["node1"]).await?;
    api.create(
        &PostParams::default(),
        &lb_service(
            "probe",
            serde_json::json!({"spec": {"ipFamilyPolicy": "RequireDualStack", "selector": {"app": "seed"},
                "ports": [{"name": "udp", "port": 8081, "targetPort": 8081, "protocol": "UDP"}]}}),
        )?,
    )
    .await?;
    let ips = ingress_ips(&wait_ips(&api, "probe", 2).await?);
    let owner = answering(lab, &ips[0]).await?;
    let others: Vec<&str> = NODES.iter().copied().filter(|n| *n != owner).collect();
    scope.deploy("probe", &others).await?;
    api.patch(
        "probe",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({"spec": {"selector": {"app": "probe"}}})),
    )
    .await?;
    scope.wait_ready_endpoints("probe", 2).await?;
    println!("Service probe: {ips:?}, owner {owner}, pods on {others:?}");
    let owner: &'static str = NODES.iter().copied().find(|n| *n == owner).unwrap();
    let mut gaps: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut macs_after: BTreeMap<&str, usize> = BTreeMap::new();
    let mut heal_ms: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let wanted = std::env::var("FERROLB_BENCH_FAULTS").unwrap_or_default();
    let wanted: Vec<&str> = wanted.split(',').filter(|w| !w.is_empty()).collect();
    // For a partial fault: the node the heartbeat rule goes on, and its chains.
    let partial = |key: &str| -> Option<(&'static str, &'static [&'static str])> {
        match key {
            "hb-nonowner" => Some((others[0], &["INPUT", "OUTPUT"])),
            "hb-owner" => Some((owner, &["INPUT", "OUTPUT"])),
            "hb-owner-in" => Some((owner, &["INPUT"])),
            "hb-owner-out" => Some((owner, &["OUTPUT"])),
            _ => None,
        }
    };
    let heartbeat_rule = |node: &str, op: &str, chain: &str| {
        lab.exec(
            node,
            "iptables",
            &[op, chain, "-p", "udp", "--dport", "7946", "-j", "DROP"],
        )
    };
    for (fault, key) in [
        ("link cut", "link"),
        ("speaker SIGKILL", "kill"),
        ("hb blocked, non-owner", "hb-nonowner"),
        ("hb blocked, owner", "hb-owner"),
        ("hb owner inbound lost", "hb-owner-in"),
        ("hb owner outbound lost", "hb-owner-out"),
    ] {
        if !wanted.is_empty() && !wanted.contains(&key) {
            continue;
        }
        for trial in 0..trials {
            for ip in &ips {
                wait_for(
                    &format!("{owner} to own {ip}"),
                    Duration::from_secs(30),
                    || async {
                        let n = answering(lab, ip).await.map_err(|e| e.to_string())?;
                        if n == owner { Ok(Some(())) } else { Err(n) }
                    },
                )
                .await?;
            }
            // Let the owner's takeover burst end, so each trial starts from the same state.
            tokio::time::sleep(Duration::from_secs(1)).await;
            let probes: Vec<_> = ips
                .iter()
                .map(|ip| start_probe(lab, ip))
                .collect::<anyhow::Result<_>>()?;
            tokio::time::sleep(Duration::from_secs(1)).await;
            match (key, partial(key)) {
                ("link", _) => lab.set_link(owner, false)?,
                ("kill", _) => {
                    if let Some(p) = speakers.remove(owner) {
                        process::kill_now(&p);
                    }
                }
                (_, Some((node, chains))) => {
                    for chain in chains {
                        heartbeat_rule(node, "-I", chain)?;
                    }
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                    for ip in &ips {
                        let n = lab.l2_answers("client", ip)?.len();
                        let most = macs_after.entry(fault).or_default();
                        *most = (*most).max(n);
                    }
                }
                _ => {}
            }
            let reports: Vec<Report> = probes
                .into_iter()
                .map(finish_probe)
                .collect::<anyhow::Result<_>>()?;
            match (key, partial(key)) {
                ("link", _) => lab.set_link(owner, true)?,
                ("kill", _) => {
                    speakers.insert(
                        owner,
                        ferrolb::start_speaker(lab, credentials, owner, extra)?,
                    );
                }
                (_, Some((node, chains))) => {
                    for chain in chains {
                        heartbeat_rule(node, "-D", chain)?;
                    }
                    // Healing: until the client's answer for every IP comes from the owner.
                    // Trials in a row flap the owner, and flap damping holds it back for up to
                    // 30 s (docs/decisions/0015): the wait allows for that.
                    let healed = std::time::Instant::now();
                    for ip in &ips {
                        wait_for(
                            &format!("{owner} to answer for {ip} after {fault}"),
                            Duration::from_secs(90),
                            || async {
                                let n = answering(lab, ip).await.map_err(|e| e.to_string())?;
                                if n == owner { Ok(Some(())) } else { Err(n) }
                            },
                        )
                        .await?;
                    }
                    heal_ms
                        .entry(fault)
                        .or_default()
                        .push(healed.elapsed().as_secs_f64() * 1000.0);
                }
                _ => {}
            }
            for (ip, r) in ips.iter().zip(&reports) {
                let family = if ip.contains(':') { "IPv6" } else { "IPv4" };
                println!(
                    "{fault:16} trial {trial:2} {family}: outage {:6.0} ms (from {:5.0} ms), {} of {} answered, by {:?}",
                    r.max_gap_ms, r.gap_start_ms, r.received, r.sent, r.answers
                );
                gaps.entry(format!("{fault}, {family}"))
                    .or_default()
                    .push(r.max_gap_ms);
            }
        }
    }
    println!();
    println!("outage (longest gap between answers, probes every 10 ms):");
    for (label, g) in gaps {
        summary(&label, g);
    }
    if !macs_after.is_empty() {
        println!();
        println!(
            "partial faults: most MACs answering one IP 1.5 s after the fault, over all trials:"
        );
        for (fault, most) in &macs_after {
            println!("{fault:32} {most}");
        }
        println!();
        println!("partial faults: from removing the fault to the owner answering every IP again:");
        for (fault, h) in heal_ms {
            summary(fault, h);
        }
    }
    Ok(())
}
