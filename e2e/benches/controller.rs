//! Controller latency in the lab: from a Service's creation to its IP in status, for single
//! Services and bursts, the total time to allocate a burst, and the controller's memory; and the
//! backlog scenario, which takes the API server's creation rate out of the measurement: it
//! creates N LoadBalancer Services while no controller runs, then starts one and times until all
//! N have an IP.
//!
//! `cargo bench -p ferrolb-e2e --bench controller` (as root; it builds the lab tool, the
//! controller and the speaker it runs first, in the bench's release profile). Environment:
//!
//! * `FERROLB_BENCH_SINGLES` (default 50): single Services, one after the other.
//! * `FERROLB_BENCH_BURSTS` (default `1000`): comma-separated burst sizes; empty for none.
//! * `FERROLB_BENCH_BACKLOG` (default 10000): Services of the backlog scenario; 0 for none.
//! * `FERROLB_BENCH_CREATE_CONCURRENCY` (default 64): creations in flight at once.
//! * `FERROLB_BENCH_SPEAKERS` (default `0`): `1` also runs a speaker on every node (layer 2,
//!   with an L2Advertisement for the bench's pool) and prints each speaker's memory after every
//!   burst; bursts add up (`FERROLB_BENCH_BURSTS=1000,9000` measures at 1,000 and 10,000
//!   Services).
//! * `FERROLB_BENCH_KUBE_PROXY` (default `pause`): `pause` stops the lab's three kube-proxies
//!   (SIGSTOP, resumed at the end, also on failure) for the run; `run` keeps them. In a cluster
//!   kube-proxy runs on the nodes, not on the control plane's CPUs; in the lab all share 2
//!   vCPUs, and at 10,000 Services each of their syncs rewrites the whole rule set.
//!
//! Prints figures, among them where the CPU went during each phase (every lab process and the
//! controller); asserts nothing (machines here are noisy).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ferrolb_e2e::bench::{
    Seen, burst, cpu_ticks, create_all, env_usize, mib, percentile, proc_status_bytes, service,
    wait_all, watch_ips,
};
use ferrolb_e2e::cluster::wait_for;
use ferrolb_e2e::ferrolb::{self, NAMESPACE};
use ferrolb_e2e::lab::State;
use ferrolb_e2e::process;
use ferrolb_e2e::scope::TestScope;
use ferrolb_e2e::{Lab, Options};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, PostParams};

/// CPU time (user + system) each process used, to show what bounds a phase.
struct CpuSample {
    at: Instant,
    ticks: Vec<(String, i32, u64)>,
}

impl CpuSample {
    /// Samples every lab process and the extra ones given.
    fn take(lab: &Lab, extra: &[(&str, i32)]) -> Self {
        let mut procs: Vec<(String, i32)> = State::load(&lab.dir)
            .ok()
            .flatten()
            .map(|s| s.processes.into_iter().map(|p| (p.name, p.pid)).collect())
            .unwrap_or_default();
        procs.extend(extra.iter().map(|(n, p)| (n.to_string(), *p)));
        procs.push(("bench".into(), std::process::id() as i32));
        let ticks = procs
            .into_iter()
            .filter_map(|(name, pid)| cpu_ticks(pid).map(|t| (name, pid, t)))
            .collect();
        Self {
            at: Instant::now(),
            ticks,
        }
    }

    /// One line: CPU seconds per process since `self`, largest first, and the machine's share.
    fn report(&self, lab: &Lab, extra: &[(&str, i32)], phase: &str) {
        let now = Self::take(lab, extra);
        let wall = now.at.duration_since(self.at).as_secs_f64();
        let mut used: Vec<(String, f64)> = now
            .ticks
            .iter()
            .filter_map(|(name, pid, t)| {
                let before = self
                    .ticks
                    .iter()
                    .find(|(n, p, _)| n == name && p == pid)
                    .map_or(0, |(_, _, b)| *b);
                let secs = t.saturating_sub(before) as f64 / 100.0;
                (secs >= 0.1).then(|| (name.clone(), secs))
            })
            .collect();
        used.sort_by(|a, b| b.1.total_cmp(&a.1));
        let total: f64 = used.iter().map(|(_, s)| s).sum();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        println!(
            "  cpu during {phase} ({wall:.1} s wall, {cores} cores): {total:.1} s in lab processes ({:.0}% of the machine): {}",
            100.0 * total / (wall * cores),
            used.iter()
                .map(|(n, s)| format!("{n} {s:.1} s"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

/// Stops the controller when the bench ends, also on error.
struct Stopped(process::LabProcess);

impl Drop for Stopped {
    fn drop(&mut self) {
        process::stop(&self.0, Duration::from_secs(5));
    }
}

/// Starts a controller and waits until it serves (a Service gets an IP).
async fn start_serving(
    lab: &Lab,
    kubeconfig: &std::path::Path,
    api: &Api<Service>,
    seen: &Seen,
    identity: &str,
    port: u16,
) -> anyhow::Result<Stopped> {
    let controller = Stopped(ferrolb::start_controller(lab, kubeconfig, identity, port)?);
    let probe = format!("warmup-{identity}");
    api.create(&PostParams::default(), &service(&probe).build())
        .await?;
    wait_all(seen, &[probe], "the controller to serve").await?;
    Ok(controller)
}

async fn bench(lab: &Lab) -> anyhow::Result<()> {
    let _paused = (std::env::var("FERROLB_BENCH_KUBE_PROXY").as_deref() != Ok("run"))
        .then(|| ferrolb_e2e::bench::PausedKubeProxies::pause(lab));
    let kubeconfig = ferrolb::install(lab)?;
    let scope = TestScope::new(lab, "bench-controller").await?;
    lab.apply(&format!(
        "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {{name: bench, namespace: {NAMESPACE}}}\nspec:\n  addresses: ['198.18.64.0/18']\n  serviceAllocation: {{priority: 1, namespaces: [bench-controller]}}\n"
    ))?;
    let api: Api<Service> = Api::namespaced(lab.client().await?, &scope.namespace);
    let seen = watch_ips(api.clone());
    let concurrency = env_usize("FERROLB_BENCH_CREATE_CONCURRENCY", 64);
    let singles = env_usize("FERROLB_BENCH_SINGLES", 50);
    let bursts: Vec<usize> = std::env::var("FERROLB_BENCH_BURSTS")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1000]);
    let backlog = env_usize("FERROLB_BENCH_BACKLOG", 10_000);
    // Nothing is deleted between scenarios: all must fit the pool (a /18) and the lab's
    // Service range (a /18 too, minus a few lab Services).
    let total = singles + bursts.iter().sum::<usize>() + backlog + 2;
    anyhow::ensure!(
        total <= 16_000,
        "{total} Services do not fit the bench's /18 pool: run the bursts and the backlog separately"
    );

    let speakers = if std::env::var("FERROLB_BENCH_SPEAKERS").as_deref() == Ok("1") {
        lab.apply(&format!(
            "apiVersion: metallb.io/v1beta1\nkind: L2Advertisement\nmetadata: {{name: bench, namespace: {NAMESPACE}}}\nspec: {{ipAddressPools: [bench]}}\n"
        ))?;
        let speakers = ferrolb::Speakers::new(lab)?;
        for node in lab.topology.nodes() {
            speakers.start(&node.name)?;
        }
        Some(speakers)
    } else {
        None
    };
    let mut in_bursts = 0;
    if singles > 0 || !bursts.is_empty() {
        let controller = start_serving(lab, &kubeconfig, &api, &seen, "bench", 7480).await?;
        let pid = controller.0.pid;
        let mut single = Vec::new();
        for i in 0..singles {
            let (l, _, _) = burst(&api, &seen, &format!("single{i}"), 1, 1).await?;
            single.extend(l);
        }
        single.sort();
        if singles > 0 {
            println!(
                "controller: single Service, creation to IP in status ({singles} samples): p50 {:.1?} p99 {:.1?} max {:.1?}",
                percentile(&single, 0.5),
                percentile(&single, 0.99),
                single.last().copied().unwrap_or_default()
            );
        }
        for n in bursts {
            let cpu = CpuSample::take(lab, &[("controller", pid)]);
            let (lat, total, created) =
                burst(&api, &seen, &format!("burst{n}"), n, concurrency).await?;
            println!(
                "controller: burst of {n} ({concurrency} creations in flight): created in {:.1?} ({:.0}/s); creation to IP p50 {:.1?} p99 {:.1?} max {:.1?}; all {n} allocated in {:.1?}; controller RSS {:.1} MiB (peak {:.1} MiB)",
                created,
                n as f64 / created.as_secs_f64(),
                percentile(&lat, 0.5),
                percentile(&lat, 0.99),
                lat.last().copied().unwrap_or_default(),
                total,
                mib(proc_status_bytes(pid, "VmRSS:")),
                mib(proc_status_bytes(pid, "VmHWM:")),
            );
            cpu.report(lab, &[("controller", pid)], &format!("burst of {n}"));
            in_bursts += n;
            if let Some(speakers) = &speakers {
                // The speakers have planned every Service once their logs settle; give them a
                // few seconds, then read their memory.
                tokio::time::sleep(Duration::from_secs(10)).await;
                // RSS splits into the heap and stacks (anonymous: what grows with the
                // cluster) and the binary's code pages (file-backed: constant, shared, and
                // dropped by the kernel under memory pressure).
                for (node, pid) in speakers.pids() {
                    println!(
                        "speaker@{node}: {} LoadBalancer Services in the cluster ({in_bursts} from bursts): RSS {:.1} MiB (peak {:.1} MiB): anonymous {:.1} MiB, file-backed {:.1} MiB",
                        in_bursts + singles + 1,
                        mib(proc_status_bytes(pid, "VmRSS:")),
                        mib(proc_status_bytes(pid, "VmHWM:")),
                        mib(proc_status_bytes(pid, "RssAnon:")),
                        mib(proc_status_bytes(pid, "RssFile:")),
                    );
                }
            }
        }
        drop(controller);
    }

    if backlog > 0 {
        // Create every Service while no controller runs, so the allocation below is timed apart
        // from the API server's creation rate.
        let names: Vec<String> = (0..backlog).map(|i| format!("backlog-{i:05}")).collect();
        let cpu = CpuSample::take(lab, &[]);
        let started = Instant::now();
        create_all(&api, &names, concurrency).await?;
        let created = started.elapsed();
        println!(
            "controller: backlog: {backlog} Services created with no controller running in {:.1?} ({:.0}/s, {concurrency} in flight)",
            created,
            backlog as f64 / created.as_secs_f64()
        );
        cpu.report(lab, &[], "creation");
        let started = Instant::now();
        let controller = Stopped(ferrolb::start_controller(
            lab,
            &kubeconfig,
            "bench-backlog",
            7481,
        )?);
        let pid = controller.0.pid;
        let cpu = CpuSample::take(lab, &[("controller", pid)]);
        wait_for("the first backlog IP", Duration::from_secs(120), || {
            let any = {
                let seen = seen.lock().unwrap();
                names.iter().any(|n| seen.contains_key(n))
            };
            async move {
                if any {
                    Ok(Some(()))
                } else {
                    Err("none yet".into())
                }
            }
        })
        .await?;
        let first = started.elapsed();
        wait_all(
            &seen,
            &names,
            &format!("{backlog} backlog Services to get IPs"),
        )
        .await?;
        let total = started.elapsed();
        println!(
            "controller: backlog: all {backlog} allocated {:.1?} after the controller started (first IP after {:.1?}, so {:.1?} from first to last); controller RSS {:.1} MiB (peak {:.1} MiB)",
            total,
            first,
            total.saturating_sub(first),
            mib(proc_status_bytes(pid, "VmRSS:")),
            mib(proc_status_bytes(pid, "VmHWM:")),
        );
        cpu.report(lab, &[("controller", pid)], "allocation");
        // Memory once the writes are done and the Event cache has settled.
        tokio::time::sleep(Duration::from_secs(10)).await;
        println!(
            "controller: backlog: RSS 10 s later {:.1} MiB",
            mib(proc_status_bytes(pid, "VmRSS:"))
        );
        drop(controller);
    }
    if let Some(speakers) = &speakers {
        speakers.stop_all();
        let _ = lab.kubectl(&[
            "delete",
            "l2advertisement",
            "-n",
            NAMESPACE,
            "bench",
            "--ignore-not-found",
        ]);
    }
    drop(scope);
    let _ = lab.kubectl(&[
        "delete",
        "ipaddresspool",
        "-n",
        NAMESPACE,
        "bench",
        "--ignore-not-found",
    ]);
    Ok(())
}

fn main() {
    // `cargo test --all-targets` runs bench targets too, without `--bench`: only measure when
    // `cargo bench` asks.
    if !std::env::args().any(|a| a == "--bench") {
        println!(
            "controller bench: run with `cargo bench -p ferrolb-e2e --bench controller` (as root)"
        );
        return;
    }
    if !ferrolb_e2e::is_root() {
        eprintln!("controller bench skipped: the lab needs root");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let lab_exe = PathBuf::from(env!("CARGO_BIN_EXE_ferrolb-lab"));
    // Before minutes of setup: the binaries the bench runs must be built (and current).
    if let Err(e) = ferrolb_e2e::ferrolb::build_binaries(&ferrolb_e2e::bench::BINARIES) {
        eprintln!("controller bench: {e:#}");
        std::process::exit(1);
    }
    let result = rt.block_on(async {
        let lab = Lab::up(Options::default(), &lab_exe).await?;
        bench(&lab).await
    });
    if std::env::var_os("FERROLB_KEEP_LAB").is_none() {
        let _ = ferrolb_e2e::down();
    }
    if let Err(e) = result {
        eprintln!("controller bench failed: {e:#}");
        std::process::exit(1);
    }
}
