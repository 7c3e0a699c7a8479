//! BGP failover in the lab: how long the external client behind the router loses a Service when
//! the node its traffic goes through loses its link, with BFD and without.
//!
//! `cargo bench -p ferrolb-e2e --bench bgp_failover` (as root; it builds the lab tool, the
//! controller and the speaker it runs first, in the bench's release profile). Environment:
//!
//! * `FERROLB_BENCH_TRIALS` (default 10): trials per case.
//! * `FERROLB_BENCH_CASES`: a comma-separated subset (default all): `bfd-300` (MetalLB's default
//!   BFDProfile, 300 ms × 3, on both sides), `bfd-100` (100 ms × 3 on both sides), `hold-3`
//!   (no BFD, hold time 3 s) and `hold-90` (no BFD, hold time 90 s, MetalLB's default).
//!
//! Each trial: the router's ECMP route for the Service's IP has a next hop per node; its kernel
//! picks one for the external client's traffic (`ip route get` tells which). The client sends
//! a UDP datagram to the IP every 10 ms (`ferrolb-lab probe`); at 1 s that node's link is cut
//! from the bridge side. The outage is the longest gap between answers; the route drop is the
//! time from the cut to the router's first route or next-hop change (`ip monitor`). The link
//! comes back once the router has dropped the node, and the trial waits for the route to have
//! every node again. The Service's pods run on the other two nodes, so the figures measure the
//! routing, not kube-proxy's handling of a dead endpoint. Prints figures; asserts nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::BufRead as _;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ferrolb_e2e::Lab;
use ferrolb_e2e::bench::percentiles;
use ferrolb_e2e::cluster::wait_for;
use ferrolb_e2e::ferrolb;
use ferrolb_e2e::probe::Report;
use ferrolb_e2e::process;
use ferrolb_e2e::router::vtysh;
use ferrolb_e2e::scope::TestScope;
use ferrolb_e2e::service::{ingress_ips, wait_ips};
use ferrolb_testkit::objects::service;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, PostParams};

const NODES: [&str; 3] = ["node1", "node2", "node3"];
/// The external client's address (topology: ext on the external segment).
const EXT: &str = "198.19.254.10";

/// One case: BFD timers on both sides (none: no BFD) and the BGP hold time.
struct Case {
    name: &'static str,
    bfd_ms: Option<u32>,
    hold_s: u32,
}

const CASES: [Case; 4] = [
    Case {
        name: "bfd-300",
        bfd_ms: Some(300),
        hold_s: 9,
    },
    Case {
        name: "bfd-100",
        bfd_ms: Some(100),
        hold_s: 9,
    },
    Case {
        name: "hold-3",
        bfd_ms: None,
        hold_s: 3,
    },
    Case {
        name: "hold-90",
        bfd_ms: None,
        hold_s: 90,
    },
];

fn config(case: &Case) -> String {
    let ns = ferrolb::NAMESPACE;
    let bfd = match case.bfd_ms {
        Some(ms) => format!(
            "---
apiVersion: metallb.io/v1beta1
kind: BFDProfile
metadata: {{name: bench, namespace: {ns}}}
spec: {{receiveInterval: {ms}, transmitInterval: {ms}, detectMultiplier: 3}}
"
        ),
        None => String::new(),
    };
    let profile = if case.bfd_ms.is_some() {
        "  bfdProfile: bench\n"
    } else {
        ""
    };
    format!(
        "apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {{name: bench-bgp, namespace: {ns}}}
spec:
  addresses: [198.18.203.0/28]
---
apiVersion: metallb.io/v1beta1
kind: BGPAdvertisement
metadata: {{name: bench-bgp, namespace: {ns}}}
spec:
  ipAddressPools: [bench-bgp]
---
apiVersion: metallb.io/v1beta2
kind: BGPPeer
metadata: {{name: bench-router, namespace: {ns}}}
spec:
  myASN: 64512
  peerASN: 64500
  peerAddress: 198.18.0.254
  holdTime: {}s
  keepaliveTime: {}s
  connectTime: 1s
{profile}{bfd}",
        case.hold_s,
        (case.hold_s / 3).max(1),
    )
}

/// The router's timers for the nodes' sessions and BFD profile for `case`; sessions reset so
/// the hold time is negotiated again.
fn router_for(lab: &Lab, case: &Case) -> anyhow::Result<()> {
    let ms = case.bfd_ms.unwrap_or(300);
    let keepalive = (case.hold_s / 3).max(1);
    vtysh(
        lab,
        &[
            "configure terminal",
            "bfd",
            "profile nodes",
            &format!("receive-interval {ms}"),
            &format!("transmit-interval {ms}"),
            "exit",
            "exit",
            "router bgp 64500",
            &format!("neighbor nodes timers {keepalive} {}", case.hold_s),
            "end",
            "clear bgp *",
        ],
    )?;
    Ok(())
}

/// The node the router sends the external client's traffic for `ip` to.
fn carrier(lab: &Lab, ip: &str) -> anyhow::Result<String> {
    let out = lab.exec(
        "router",
        "ip",
        &["route", "get", ip, "from", EXT, "iif", "eth1"],
    )?;
    let via = out
        .split_whitespace()
        .skip_while(|w| *w != "via")
        .nth(1)
        .with_context(|| format!("no next hop in {out:?}"))?;
    NODES
        .iter()
        .find(|n| {
            lab.topology
                .host(n)
                .is_some_and(|h| h.interfaces[0].ipv4.to_string() == via)
        })
        .map(|n| n.to_string())
        .with_context(|| format!("{via} is no node's"))
}

/// Waits until the router routes `ip` over every node (and, with BFD, its sessions are up).
async fn all_paths(lab: &Lab, ip: &str, bfd: bool) -> anyhow::Result<()> {
    wait_for(
        &format!("the router to route {ip} over every node"),
        Duration::from_secs(200),
        || async {
            let out = lab
                .exec("router", "ip", &["route", "show", &format!("{ip}/32")])
                .map_err(|e| e.to_string())?;
            if out.matches("nexthop").count() < NODES.len() {
                return Err(out);
            }
            if bfd {
                let peers = vtysh(lab, &["show bfd peers brief"]).map_err(|e| e.to_string())?;
                if peers
                    .lines()
                    .filter(|l| l.trim_end().ends_with("up"))
                    .count()
                    < NODES.len()
                {
                    return Err(peers);
                }
            }
            Ok(Some(()))
        },
    )
    .await
}

/// Watches the router's routes and next hops (`ip monitor`) and sends the arrival time of each
/// line.
struct Monitor {
    child: std::process::Child,
    lines: mpsc::Receiver<Instant>,
}

impl Monitor {
    fn start(lab: &Lab) -> anyhow::Result<Monitor> {
        let mut child = std::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                "flb-router",
                "ip",
                "monitor",
                "route",
                "nexthop",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let _ = lab;
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                if line.is_err() || tx.send(Instant::now()).is_err() {
                    return;
                }
            }
        });
        Ok(Monitor { child, lines: rx })
    }

    /// The first change at or after `since`, waiting at most `limit`.
    fn first_after(&self, since: Instant, limit: Duration) -> Option<Instant> {
        let end = Instant::now() + limit;
        loop {
            let left = end.checked_duration_since(Instant::now())?;
            match self.lines.recv_timeout(left) {
                Ok(at) if at >= since => return Some(at),
                Ok(_) => continue,
                Err(_) => return None,
            }
        }
    }

    fn drain(&self) {
        while self.lines.try_recv().is_ok() {}
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    if !std::env::args().any(|a| a == "--bench") {
        return Ok(());
    }
    let trials = ferrolb_e2e::bench::trials(10);
    let wanted = std::env::var("FERROLB_BENCH_CASES").unwrap_or_default();
    let cases: Vec<&Case> = CASES
        .iter()
        .filter(|c| wanted.is_empty() || wanted.split(',').any(|w| w.trim() == c.name))
        .collect();
    let lab = ferrolb_e2e::bench::lab_up().await?;
    let result = measure(&lab, &cases, trials).await;
    for node in NODES {
        let _ = lab.set_link(node, true);
    }
    ferrolb_e2e::bench::lab_done()?;
    result
}

async fn measure(lab: &Lab, cases: &[&Case], trials: usize) -> anyhow::Result<()> {
    let kubeconfig = ferrolb::install(lab)?;
    let controller = ferrolb::start_controller(lab, &kubeconfig, "bench", 7472)?;
    let credentials = ferrolb::install_speaker(lab)?;
    let mut speakers = Vec::new();
    for node in NODES {
        speakers.push(ferrolb::start_speaker(lab, &credentials, node, &[])?);
    }
    let result = run(lab, cases, trials).await;
    for p in &speakers {
        process::stop(p, Duration::from_secs(5));
    }
    process::stop(&controller, Duration::from_secs(5));
    let _ = router_for(lab, &CASES[2]);
    result
}

async fn run(lab: &Lab, cases: &[&Case], trials: usize) -> anyhow::Result<()> {
    lab.apply(&config(&CASES[0]))?;
    router_for(lab, &CASES[0])?;
    let mut scope = TestScope::new(lab, "bgp-bench").await?;
    let api: Api<Service> = Api::namespaced(lab.client().await?, &scope.namespace);
    scope.deploy("seed", &["node1"]).await?;
    api.create(
        &PostParams::default(),
        &service("probe")
            .annotation("metallb.io/address-pool", "bench-bgp")
            .selector("app", "seed")
            .named_port("udp", 8081, 8081, "UDP")
            .build(),
    )
    .await?;
    let ip = ingress_ips(&wait_ips(&api, "probe", 1).await?).remove(0);
    all_paths(lab, &ip, true).await?;
    let cut = carrier(lab, &ip)?;
    ferrolb_e2e::bench::serve_away_from(&mut scope, &api, "probe", &NODES, &cut).await?;
    println!("bgp_failover: Service IP {ip}; the external client's traffic goes through {cut}");
    let monitor = Monitor::start(lab)?;
    let mut rows = Vec::new();
    for case in cases {
        lab.apply(&config(case))?;
        router_for(lab, case)?;
        let bfd = case.bfd_ms.is_some();
        all_paths(lab, &ip, bfd).await?;
        let (mut outages, mut drops) = (Vec::new(), Vec::new());
        for trial in 0..trials {
            all_paths(lab, &ip, bfd).await?;
            let node = carrier(lab, &ip)?;
            if node != cut {
                eprintln!(
                    "trial {trial}: traffic goes through {node} now, not {cut}; cutting {node}"
                );
            }
            // Long enough for the hold timer to expire when there is no BFD.
            let probe_for = Duration::from_secs(if bfd { 4 } else { u64::from(case.hold_s) + 4 });
            let probe = ferrolb_e2e::bench::start_probe(lab, "ext", &ip, probe_for)?;
            tokio::time::sleep(Duration::from_secs(1)).await;
            monitor.drain();
            let at = Instant::now();
            lab.set_link(&node, false)?;
            let dropped = monitor.first_after(at, probe_for);
            let report: Report =
                tokio::task::spawn_blocking(move || ferrolb_e2e::bench::finish_probe(probe))
                    .await??;
            lab.set_link(&node, true)?;
            let drop_ms = dropped.map(|d| (d - at).as_secs_f64() * 1000.0);
            println!(
                "{:8} trial {trial:2}: outage {:7.0} ms, route dropped after {} ms",
                case.name,
                report.max_gap_ms,
                drop_ms.map_or("-".to_string(), |d| format!("{d:.0}"))
            );
            outages.push(report.max_gap_ms);
            if let Some(d) = drop_ms {
                drops.push(d);
            }
        }
        rows.push((case.name, outages, drops));
    }
    println!("\nBGP failover, external client through the router, node link cut:");
    for (name, outages, drops) in rows {
        for (what, values) in [("outage", outages), ("route drop", drops)] {
            let label = format!("{name} {what}");
            let line = percentiles(&label, values);
            println!("{}", line.unwrap_or_else(|| format!("{label:32} no data")));
        }
    }
    Ok(())
}
