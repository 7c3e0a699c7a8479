//! Layer 2 failover in the lab: how long a client loses a Service when the node that owns its IP
//! loses its link, and when its speaker is SIGKILLed.
//!
//! `cargo bench -p ferrolb-e2e --bench l2_failover` (as root; it builds the lab tool, the
//! controller and the speaker it runs first, in the bench's release profile). Environment:
//!
//! * `FERROLB_BENCH_TRIALS` (default 20): trials per fault.
//! * `FERROLB_BENCH_SPEAKER_ARGS`: extra speaker arguments (e.g. `--failure-timeout=300ms`).
//! * `FERROLB_BENCH_FAULTS`: a comma-separated subset of the faults (default all): `link`,
//!   `kill`, `hb-nonowner`, `hb-owner`, `hb-owner-in`, `hb-owner-out`, `hb-owner-loss`,
//!   `freeze`, `hb-owner-delay`, `junk`, `api-link`, `key-owner`, `rotate`, `roll`, `upgrade`.
//! * `FERROLB_BENCH_UPGRADE_FROM=<commit>`: runs `upgrade`, a rolling upgrade from the speaker
//!   of that commit (built once into `~/.cache/ferrolb/upgrade/`) to this one and back, as
//!   `roll` counts it: broken connections, IP moves, MACs per request.
//!
//! The other faults are partial: UDP 7946 (the heartbeats) dropped with iptables in one node's
//! namespace, both ways on a node that does not own the IP, both ways on the owner, inbound only
//! on the owner, outbound only on the owner, 80 % of the owner's outgoing at random, the owner's
//! outgoing delayed 600 ms (a relay, the lab has no netem); or the owner's speaker frozen
//! (SIGSTOP) for 2 s and resumed; or junk datagrams (8,000 per node in 2.5 s, a third starting
//! like a heartbeat) at every node's heartbeat port. For them the bench also sends ARP/NDP requests for each IP one
//! at a time throughout the fault and counts the MACs answering each (two would be two owners at
//! once) and the IP moves, and the time from removing the fault until the client's answer comes
//! from the owner again. `roll` restarts the three speakers one at a time per trial, paced by
//! `/readyz` as a DaemonSet update is, and counts the long-lived TCP connections (one per IP)
//! that broke and the IP moves.
//!
//! `api-link` is the link cut with the API server stopped for all its trials; `key-owner` a wrong
//! gossip key written to the owner's key file (watched 8 s: the speakers re-read their files
//! every 5 s); `rotate` a key rotation rolled node by node (see [`rotate`]).
//!
//! Each trial: the client sends a UDP datagram to the Service's IPv4 and IPv6 address every 10 ms
//! (`ferrolb-lab probe`) for 4 s; at 1 s the owner's link is cut from the bridge side (or its
//! speaker killed); the outage is the longest gap between answers. The fault is then undone and
//! the trial waits until the owner answers again. The Service's pods run on the two other nodes,
//! so the outage measures the announcement, not kube-proxy's endpoint handling of a dead node.
//! Prints figures; asserts nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use ferrolb_e2e::Lab;
use ferrolb_e2e::bench::finish_probe;
use ferrolb_e2e::cluster::wait_for;
use ferrolb_e2e::faults::{HeartbeatDelay, HeartbeatFault, junk_flood};
use ferrolb_e2e::ferrolb;
use ferrolb_e2e::probe::{Held, Report};
use ferrolb_e2e::process;
use ferrolb_e2e::scope::TestScope;
use ferrolb_e2e::service::{ingress_ips, wait_ips};
use ferrolb_testkit::objects::service;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, PostParams};
use nix::sys::signal::Signal;

const NODES: [&str; 3] = ["node1", "node2", "node3"];

async fn answering(lab: &Lab, ip: &str) -> anyhow::Result<String> {
    lab.answering_node("client", ip).await
}

fn start_probe(lab: &Lab, ip: &str, duration: Duration) -> anyhow::Result<std::process::Child> {
    ferrolb_e2e::bench::start_probe(lab, "client", ip, duration)
}

/// A key no other node has.
const WRONG_KEY: &str = "a-key-no-other-node-has-0123456789";
/// The key a rotation moves to and back from.
const ROTATED_KEY: &str = "rotated-gossip-key-0123456789abcdef0123456789abcdef";
/// The heartbeats a speaker refused for their key.
const REFUSED: &str = "ferrolb_speaker_heartbeats_refused_total{reason=\"authentication\"}";

/// Each node's own gossip key files (`<lab>/bench-keys/<node>.key` and `.next`, which the
/// speakers re-read every 5 s), so a fault can give one node a wrong key or roll a rotation.
struct Keys {
    dir: std::path::PathBuf,
    /// The key every node starts with.
    original: String,
}

impl Keys {
    fn new(lab: &Lab, credentials: &ferrolb::SpeakerCredentials) -> anyhow::Result<Self> {
        let dir = lab.dir.join("bench-keys");
        std::fs::create_dir_all(&dir)?;
        let keys = Keys {
            dir,
            original: std::fs::read_to_string(&credentials.gossip_key)?,
        };
        for node in NODES {
            keys.set(node, &keys.original, None)?;
        }
        Ok(keys)
    }

    fn key(&self, node: &str) -> std::path::PathBuf {
        self.dir.join(format!("{node}.key"))
    }

    fn next(&self, node: &str) -> std::path::PathBuf {
        self.dir.join(format!("{node}.next"))
    }

    /// Writes `node`'s key files: `key` to sign with, `next` accepted too (none: removed).
    fn set(&self, node: &str, key: &str, next: Option<&str>) -> anyhow::Result<()> {
        std::fs::write(self.key(node), key)?;
        match next {
            Some(n) => std::fs::write(self.next(node), n)?,
            None => {
                let _ = std::fs::remove_file(self.next(node));
            }
        }
        Ok(())
    }

    /// Starts `node`'s speaker on its own key files.
    fn start(
        &self,
        lab: &Lab,
        credentials: &ferrolb::SpeakerCredentials,
        node: &str,
        extra: &[&str],
    ) -> anyhow::Result<process::LabProcess> {
        self.start_exe(lab, credentials, node, extra, None)
    }

    /// [`Self::start`] running the speaker binary `exe` when given (another version's).
    fn start_exe(
        &self,
        lab: &Lab,
        credentials: &ferrolb::SpeakerCredentials,
        node: &str,
        extra: &[&str],
        exe: Option<&std::path::Path>,
    ) -> anyhow::Result<process::LabProcess> {
        let credentials = ferrolb::SpeakerCredentials {
            gossip_key: self.key(node),
            ..credentials.clone()
        };
        let next = self.next(node).display().to_string();
        let mut args = vec!["--gossip-next-key-file", next.as_str()];
        args.extend_from_slice(extra);
        match exe {
            None => ferrolb::start_speaker(lab, &credentials, node, &args),
            Some(exe) => ferrolb::start_speaker_exe(lab, &credentials, node, &args, exe),
        }
    }
}

/// Heartbeats refused for their key, summed over the nodes.
fn refused(lab: &Lab) -> anyhow::Result<f64> {
    NODES
        .iter()
        .map(|n| ferrolb::speaker_metric(lab, n, REFUSED))
        .sum()
}

/// Waits until `owner` answers for every IP of `ips`.
async fn answered_by(
    lab: &Lab,
    ips: &[String],
    owner: &str,
    within: Duration,
) -> anyhow::Result<()> {
    for ip in ips {
        wait_for(&format!("{owner} to answer for {ip}"), within, || async {
            let n = answering(lab, ip).await.map_err(|e| e.to_string())?;
            if n == owner { Ok(Some(())) } else { Err(n) }
        })
        .await?;
    }
    Ok(())
}

/// Sends `signal` to a lab speaker's PID (SIGSTOP freezes it, SIGCONT resumes it).
fn signal(pid: i32, signal: Signal) -> anyhow::Result<()> {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal)?;
    Ok(())
}

fn summary(label: &str, gaps: Vec<f64>) {
    if let Some(line) = ferrolb_e2e::bench::percentiles(label, gaps) {
        println!("{line}");
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    if !std::env::args().any(|a| a == "--bench") {
        return Ok(());
    }
    let trials = ferrolb_e2e::bench::trials(20);
    let extra = std::env::var("FERROLB_BENCH_SPEAKER_ARGS").unwrap_or_default();
    let extra: Vec<&str> = extra.split_whitespace().collect();
    let lab = ferrolb_e2e::bench::lab_up().await?;
    let result = measure(&lab, &extra, trials).await;
    ferrolb_e2e::bench::lab_done()?;
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
    let keys = Keys::new(&lab, &credentials)?;
    let mut speakers: BTreeMap<&str, process::LabProcess> = BTreeMap::new();
    for node in NODES {
        speakers.insert(node, keys.start(&lab, &credentials, node, extra)?);
    }
    let result = run(&lab, &credentials, &keys, extra, &mut speakers, trials).await;
    for p in speakers.values() {
        process::stop(p, Duration::from_secs(5));
    }
    let _ = std::fs::remove_dir_all(&keys.dir);
    process::stop(&controller, Duration::from_secs(5));
    let _ = lab.set_link("node1", true);
    let _ = lab.set_link("node2", true);
    let _ = lab.set_link("node3", true);
    result
}

async fn run(
    lab: &Lab,
    credentials: &ferrolb::SpeakerCredentials,
    keys: &Keys,
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
        &service("probe")
            .ip_family_policy("RequireDualStack")
            .selector("app", "seed")
            .named_port("udp", 8081, 8081, "UDP")
            .named_port("http", 80, 8080, "TCP")
            .build(),
    )
    .await?;
    let ips = ingress_ips(&wait_ips(&api, "probe", 2).await?);
    let owner = answering(lab, &ips[0]).await?;
    let others =
        ferrolb_e2e::bench::serve_away_from(&mut scope, &api, "probe", &NODES, &owner).await?;
    println!("Service probe: {ips:?}, owner {owner}, pods on {others:?}");
    let owner: &'static str = NODES.iter().copied().find(|n| *n == owner).unwrap();
    let mut gaps: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    // Partial faults: the most MACs answering one ARP/NDP request, how many requests, IP moves.
    let mut macs_per_request: BTreeMap<&str, (usize, usize, usize)> = BTreeMap::new();
    let node_of: BTreeMap<String, String> = NODES
        .iter()
        .map(|n| Ok((lab.mac_of(n)?.to_lowercase(), n.to_string())))
        .collect::<anyhow::Result<_>>()?;
    let mut heal_ms: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let wanted = std::env::var("FERROLB_BENCH_FAULTS").unwrap_or_default();
    let wanted: Vec<&str> = wanted.split(',').filter(|w| !w.is_empty()).collect();
    for (fault, key) in [
        ("link cut", "link"),
        ("speaker SIGKILL", "kill"),
        ("hb blocked, non-owner", "hb-nonowner"),
        ("hb blocked, owner", "hb-owner"),
        ("hb owner inbound lost", "hb-owner-in"),
        ("hb owner outbound lost", "hb-owner-out"),
        ("hb owner 80 % lost", "hb-owner-loss"),
        ("owner speaker frozen 2 s", "freeze"),
        ("hb owner delayed 600 ms", "hb-owner-delay"),
        ("junk at every node's hb port", "junk"),
        ("link cut, API server down", "api-link"),
        ("wrong gossip key on owner", "key-owner"),
    ] {
        if !wanted.is_empty() && !wanted.contains(&key) {
            continue;
        }
        // `api-link`: every trial's link cut with the API server stopped (from before the first
        // trial to after the last): failover needs nothing from it.
        let api_down = if key == "api-link" {
            answered_by(lab, &ips, owner, Duration::from_secs(90)).await?;
            Some(lab.stop_keeping("kube-apiserver")?)
        } else {
            None
        };
        for trial in 0..trials {
            answered_by(lab, &ips, owner, Duration::from_secs(30)).await?;
            // Let the owner's takeover burst end, so each trial starts from the same state.
            tokio::time::sleep(Duration::from_secs(1)).await;
            // The fault is watched for `window`: a key change takes up to 5 s to be read.
            let window = if key == "key-owner" {
                Duration::from_secs(8)
            } else {
                Duration::from_millis(2800)
            };
            let probes: Vec<_> = ips
                .iter()
                .map(|ip| start_probe(lab, ip, window + Duration::from_millis(1200)))
                .collect::<anyhow::Result<_>>()?;
            tokio::time::sleep(Duration::from_secs(1)).await;
            let injected = std::time::Instant::now();
            let mut frozen = None;
            let mut delayed = None;
            // Undone when dropped, also on an error.
            let mut flood = None;
            let mut keyed = false;
            let heartbeats = match key {
                "link" | "api-link" => {
                    lab.set_link(owner, false)?;
                    None
                }
                "kill" => {
                    if let Some(p) = speakers.remove(owner) {
                        process::kill_now(&p);
                    }
                    None
                }
                "hb-nonowner" => Some(HeartbeatFault::block(lab, others[0], &["INPUT", "OUTPUT"])?),
                "hb-owner" => Some(HeartbeatFault::block(lab, owner, &["INPUT", "OUTPUT"])?),
                "hb-owner-in" => Some(HeartbeatFault::block(lab, owner, &["INPUT"])?),
                "hb-owner-out" => Some(HeartbeatFault::block(lab, owner, &["OUTPUT"])?),
                "hb-owner-loss" => Some(HeartbeatFault::loss(lab, owner, "0.8")?),
                "hb-owner-delay" => {
                    delayed = Some(HeartbeatDelay::start(
                        lab,
                        owner,
                        &others
                            .iter()
                            .map(|n| lab.ipv4_of(n))
                            .collect::<anyhow::Result<Vec<_>>>()?,
                        Duration::from_millis(600),
                    )?);
                    None
                }
                "key-owner" => {
                    keys.set(owner, WRONG_KEY, None)?;
                    keyed = true;
                    None
                }
                "junk" => {
                    // 8,000 datagrams at each node over the 2.8 s watched below.
                    let targets: Vec<std::net::IpAddr> = NODES
                        .iter()
                        .map(|n| lab.ipv4_of(n).map(Into::into))
                        .collect::<anyhow::Result<_>>()?;
                    flood = Some(std::thread::spawn(move || -> anyhow::Result<()> {
                        let floods: Vec<_> = targets
                            .into_iter()
                            .map(|t| {
                                std::thread::spawn(move || {
                                    junk_flood(t, 8_000, Duration::from_millis(2500))
                                })
                            })
                            .collect();
                        for f in floods {
                            f.join()
                                .map_err(|_| anyhow::anyhow!("a flood panicked"))??;
                        }
                        Ok(())
                    }));
                    None
                }
                "freeze" => {
                    let pid = speakers.get(owner).map(|p| p.pid);
                    if let Some(pid) = pid {
                        signal(pid, Signal::SIGSTOP)?;
                    }
                    frozen = pid;
                    None
                }
                _ => None,
            };
            // Partial faults: every ARP/NDP request on its own until the probes end (2.8 s
            // after the fault, the frozen speaker resumed at 2 s): two MACs for one request is
            // two nodes answering at once.
            if heartbeats.is_some()
                || frozen.is_some()
                || delayed.is_some()
                || flood.is_some()
                || keyed
            {
                let entry = macs_per_request.entry(fault).or_default();
                let mut last = owner.to_string();
                while injected.elapsed() < window {
                    if let Some(pid) = frozen
                        && injected.elapsed() >= Duration::from_secs(2)
                    {
                        signal(pid, Signal::SIGCONT)?;
                        frozen = None;
                    }
                    for (i, ip) in ips.iter().enumerate() {
                        for macs in lab.l2_answers_by_request("client", ip)? {
                            entry.0 = entry.0.max(macs.len());
                            entry.1 += 1;
                            // IP moves: changes of the node answering the first IP.
                            if i == 0
                                && let Some(by) = macs.iter().next().and_then(|m| node_of.get(m))
                                && *by != last
                            {
                                entry.2 += 1;
                                last = by.clone();
                            }
                        }
                    }
                }
                if let Some(pid) = frozen {
                    signal(pid, Signal::SIGCONT)?;
                }
                if let Some(flood) = flood.take() {
                    flood
                        .join()
                        .map_err(|_| anyhow::anyhow!("the flood panicked"))??;
                }
            }
            let reports: Vec<Report> = probes
                .into_iter()
                .map(finish_probe)
                .collect::<anyhow::Result<_>>()?;
            match key {
                "link" | "api-link" => lab.set_link(owner, true)?,
                "kill" => {
                    speakers.insert(owner, keys.start(lab, credentials, owner, extra)?);
                }
                _ => {
                    drop(heartbeats);
                    drop(delayed);
                    if keyed {
                        keys.set(owner, &keys.original, None)?;
                    }
                    // Healing: until the client's answer for every IP comes from the owner.
                    // Trials in a row flap the owner, and flap damping holds it back for up to
                    // 30 s (docs/decisions/0015): the wait allows for that.
                    let healed = std::time::Instant::now();
                    answered_by(lab, &ips, owner, Duration::from_secs(90)).await?;
                    heal_ms
                        .entry(fault)
                        .or_default()
                        .push(healed.elapsed().as_secs_f64() * 1000.0);
                }
            }
            for (ip, r) in ips.iter().zip(&reports) {
                let family = if ip.contains(':') { "IPv6" } else { "IPv4" };
                println!(
                    "{fault:24} trial {trial:2} {family}: outage {:6.0} ms (from {:5.0} ms), {} of {} answered, by {:?}",
                    r.max_gap_ms, r.gap_start_ms, r.received, r.sent, r.answers
                );
                gaps.entry(format!("{fault}, {family}"))
                    .or_default()
                    .push(r.max_gap_ms);
            }
        }
        if let Some(outage) = api_down {
            outage.end()?;
        }
    }
    println!();
    println!("outage (longest gap between answers, probes every 10 ms):");
    for (label, g) in gaps {
        summary(&label, g);
    }
    if !macs_per_request.is_empty() {
        println!();
        println!(
            "partial faults: most MACs answering one ARP/NDP request during the fault, over all trials:"
        );
        for (fault, (most, requests, moves)) in &macs_per_request {
            println!("{fault:32} {most} ({requests} requests); IP moves {moves}");
        }
        println!();
        println!("partial faults: from removing the fault to the owner answering every IP again:");
        for (fault, h) in heal_ms {
            summary(fault, h);
        }
    }
    if wanted.is_empty() || wanted.contains(&"rotate") {
        rotate(lab, keys, &ips, owner, &node_of, trials).await?;
    }
    // Last, with everything above already printed: it leaves the speakers restarted with
    // `--restart-hold-when=always`.
    let rolling = Rolling {
        lab,
        credentials,
        keys,
        extra,
        ips: &ips,
        owner,
        node_of: &node_of,
    };
    if wanted.is_empty() || wanted.contains(&"roll") {
        roll(&rolling, speakers, None, trials).await?;
    }
    // Only when asked for: it builds another version's speaker.
    let from = std::env::var("FERROLB_BENCH_UPGRADE_FROM").ok();
    anyhow::ensure!(
        from.is_some() || !wanted.contains(&"upgrade"),
        "the upgrade needs FERROLB_BENCH_UPGRADE_FROM=<commit>"
    );
    if let Some(from) = from
        && (wanted.is_empty() || wanted.contains(&"upgrade"))
    {
        let old = ferrolb_e2e::bench::speaker_at(&from)?;
        roll(&rolling, speakers, Some((&from, &old)), trials).await?;
    }
    Ok(())
}

/// A gossip key rotation rolled node by node per trial, as the kubelet updates a Secret volume
/// node by node (docs/architecture.md, "Rotating the gossip key"): add the next key everywhere,
/// swap, drop the old one, each node 6 s after the previous (the speakers re-read their files
/// every 5 s). Counts the MACs answering each ARP/NDP request, the IP moves, the heartbeats
/// refused for their key and the client's longest gap. Trials alternate between the two keys.
async fn rotate(
    lab: &Lab,
    keys: &Keys,
    ips: &[String],
    owner: &str,
    node_of: &BTreeMap<String, String>,
    trials: usize,
) -> anyhow::Result<()> {
    const STEP: Duration = Duration::from_secs(6);
    let (mut most, mut requests, mut moves, mut refusals) = (0usize, 0usize, 0usize, 0f64);
    let mut gaps: Vec<f64> = Vec::new();
    for trial in 0..trials {
        answered_by(lab, ips, owner, Duration::from_secs(90)).await?;
        let (old, new) = if trial % 2 == 0 {
            (keys.original.as_str(), ROTATED_KEY)
        } else {
            (ROTATED_KEY, keys.original.as_str())
        };
        let refused_before = refused(lab)?;
        let probes: Vec<_> = ips
            .iter()
            .map(|ip| start_probe(lab, ip, STEP * 9 + Duration::from_secs(2)))
            .collect::<anyhow::Result<_>>()?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut last = owner.to_string();
        for (key, next) in [(old, Some(new)), (new, Some(old)), (new, None)] {
            for node in NODES {
                keys.set(node, key, next)?;
                let step = std::time::Instant::now();
                while step.elapsed() < STEP {
                    for (i, ip) in ips.iter().enumerate() {
                        for macs in lab.l2_answers_by_request("client", ip)? {
                            most = most.max(macs.len());
                            requests += 1;
                            if i == 0
                                && let Some(by) = macs.iter().next().and_then(|m| node_of.get(m))
                                && *by != last
                            {
                                moves += 1;
                                last = by.clone();
                            }
                        }
                    }
                }
            }
        }
        let reports: Vec<Report> = probes
            .into_iter()
            .map(finish_probe)
            .collect::<anyhow::Result<_>>()?;
        let refused_now = refused(lab)? - refused_before;
        refusals += refused_now;
        for (ip, r) in ips.iter().zip(&reports) {
            println!(
                "key rotation trial {trial:2} {ip}: outage {:6.0} ms, {} of {} answered; heartbeats refused {refused_now}",
                r.max_gap_ms, r.received, r.sent
            );
            gaps.push(r.max_gap_ms);
        }
    }
    println!();
    println!(
        "key rotation ({trials} trials, 3 steps x 3 nodes each): most MACs answering one request {most} ({requests} requests); IP moves {moves}; heartbeats refused for their key {refusals}"
    );
    summary("key rotation, longest gap", gaps);
    Ok(())
}

/// What a rolling restart works on.
struct Rolling<'a> {
    lab: &'a Lab,
    credentials: &'a ferrolb::SpeakerCredentials,
    keys: &'a Keys,
    extra: &'a [&'a str],
    ips: &'a [String],
    owner: &'a str,
    node_of: &'a BTreeMap<String, String>,
}

/// A rolling restart of the three speakers per trial, as a DaemonSet update does it: stop, start
/// the successor, wait for its `/readyz`, next node. Counts the long-lived connections (one per
/// IP, `ferrolb-lab hold`) that broke and the IP moves. The speakers run with
/// `--restart-hold-when=always` (they are processes, not pods); `FERROLB_BENCH_SPEAKER_ARGS=
/// --restart-hold=0s` gives the figures without the restart hold.
///
/// With `upgrade` (`FERROLB_BENCH_UPGRADE_FROM=<commit>`, and that version's speaker binary), a
/// rolling upgrade between versions instead: every speaker starts as the old version, then the
/// trials roll old to new and new to old in turn, so every trial has both versions running side
/// by side, as a DaemonSet update (and its rollback) does.
async fn roll(
    r: &Rolling<'_>,
    speakers: &mut BTreeMap<&'static str, process::LabProcess>,
    upgrade: Option<(&str, &std::path::Path)>,
    trials: usize,
) -> anyhow::Result<()> {
    let Rolling {
        lab,
        credentials,
        keys,
        extra,
        ips,
        owner,
        node_of,
    } = *r;
    let mut args: Vec<&str> = extra.to_vec();
    args.push("--restart-hold-when=always");
    let old = upgrade.map(|(_, exe)| exe);
    // Speakers that say they are being replaced when stopped (these restarts move IPs: the
    // running speakers do not know yet), then the owner back; on the old version when upgrading.
    for node in NODES {
        if let Some(p) = speakers.remove(node) {
            process::stop(&p, Duration::from_secs(5));
        }
        speakers.insert(node, keys.start_exe(lab, credentials, node, &args, old)?);
        ferrolb::wait_speaker_ready(lab, node, Duration::from_secs(60)).await?;
    }
    // Those restarts may leave the IPs with another node than the one that held them first (the
    // first speaker up took them; with every speaker up they go to their chosen node): that
    // node is the owner whose IPs must not move during the rolls.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let now = answering(lab, &ips[0]).await?;
    if now != owner {
        println!("the IPs went from {owner} to {now} as the speakers first restarted");
    }
    answered_by(lab, ips, &now, Duration::from_secs(90)).await?;
    let owner = now.as_str();
    let (mut broken, mut held, mut moves, mut most, mut rolls) =
        (0usize, 0usize, 0usize, 0usize, Vec::new());
    for trial in 0..trials {
        answered_by(lab, ips, owner, Duration::from_secs(90)).await?;
        let connections: Vec<Held> = ips
            .iter()
            .map(|ip| Held::start(lab, "client", ip))
            .collect::<anyhow::Result<_>>()?;
        let started = std::time::Instant::now();
        let mut last = owner.to_string();
        for node in NODES {
            if let Some(p) = speakers.remove(node) {
                process::stop(&p, Duration::from_secs(5));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            // Upgrading: even trials roll to this version, odd ones back to the old one.
            let exe = if trial % 2 == 0 { None } else { old };
            speakers.insert(node, keys.start_exe(lab, credentials, node, &args, exe)?);
            // Until the successor is ready, sample who answers, request by request.
            loop {
                for macs in lab.l2_answers_by_request("client", &ips[0])? {
                    most = most.max(macs.len());
                    if let Some(by) = macs.iter().next().and_then(|m| node_of.get(m))
                        && *by != last
                    {
                        moves += 1;
                        last = by.clone();
                    }
                }
                if matches!(ferrolb::speaker_readyz(lab, node), Ok((200, _))) {
                    break;
                }
                anyhow::ensure!(
                    started.elapsed() < Duration::from_secs(120),
                    "{node}'s successor not ready in roll {trial}"
                );
            }
        }
        rolls.push(started.elapsed().as_secs_f64() * 1000.0);
        for (ip, c) in ips.iter().zip(connections) {
            let report = c.finish()?;
            held += 1;
            if report.broken.is_some() {
                broken += 1;
            }
            println!(
                "rolling restart trial {trial:2} {ip}: {} of {} lines answered, longest gap {:.0} ms, broken: {:?}",
                report.received, report.sent, report.max_gap_ms, report.broken
            );
        }
    }
    println!();
    match upgrade {
        None => println!("rolling restarts ({trials} trials, speakers {args:?}):"),
        Some((from, _)) => println!(
            "rolling upgrades from {from} and back ({trials} trials, even: up, odd: down; speakers {args:?}):"
        ),
    }
    println!(
        "long-lived connections broken: {broken} of {held}; IP moves {moves}; most MACs answering one request {most}"
    );
    summary("roll duration", rolls);
    Ok(())
}
