//! Controller latency in the lab: from a Service's creation to its IP in status, for single
//! Services and bursts, the total time to allocate a burst, and the controller's memory.
//!
//! `cargo build --release -p ferrolb-controller && cargo bench -p ferrolb-e2e --bench controller`
//! (as root; `FERROLB_BENCH_BURSTS=1000,10000`,
//! `FERROLB_BENCH_SINGLES=50`). Prints figures; asserts nothing (machines here are noisy).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferrolb_e2e::cluster::wait_for;
use ferrolb_e2e::ferrolb::{self, NAMESPACE};
use ferrolb_e2e::process;
use ferrolb_e2e::scope::TestScope;
use ferrolb_e2e::{Lab, Options};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, PostParams};
use kube::runtime::watcher::{self, Event};

fn service(name: &str) -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        // No NodePorts: 10,000 Services would exhaust the 2,768 of the default range.
        "spec": {"type": "LoadBalancer", "allocateLoadBalancerNodePorts": false, "ports": [{"port": 80, "protocol": "TCP"}]}
    }))
    .unwrap()
}

fn has_ip(s: &Service) -> bool {
    s.status
        .as_ref()
        .and_then(|st| st.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .is_some_and(|i| !i.is_empty())
}

/// Watches the namespace and records when each Service first shows an IP.
fn watch_ips(api: Api<Service>) -> Arc<Mutex<HashMap<String, Instant>>> {
    let seen: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let out = seen.clone();
    tokio::spawn(async move {
        let stream = watcher::watcher(api, watcher::Config::default());
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            if let Ok(Event::Apply(s) | Event::InitApply(s)) = ev
                && has_ip(&s)
            {
                let now = Instant::now();
                out.lock()
                    .unwrap()
                    .entry(s.metadata.name.clone().unwrap_or_default())
                    .or_insert(now);
            }
        }
    });
    seen
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn burst(
    api: &Api<Service>,
    seen: &Arc<Mutex<HashMap<String, Instant>>>,
    prefix: &str,
    n: usize,
) -> anyhow::Result<(Vec<Duration>, Duration)> {
    let started = Instant::now();
    let names: Vec<String> = (0..n).map(|i| format!("{prefix}-{i:05}")).collect();
    let creates: Vec<(String, Instant)> = futures::stream::iter(names.iter().cloned())
        .map(|name| {
            let api = api.clone();
            async move {
                let at = Instant::now();
                api.create(&PostParams::default(), &service(&name))
                    .await
                    .map(|_| (name, at))
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    wait_for(
        &format!("{n} Services of burst {prefix} to get IPs"),
        Duration::from_secs(900),
        || {
            let done = names
                .iter()
                .filter(|n| seen.lock().unwrap().contains_key(*n))
                .count();
            async move {
                if done == n {
                    Ok(Some(()))
                } else {
                    Err(format!("{done}/{n}"))
                }
            }
        },
    )
    .await?;
    let total = started.elapsed();
    let seen = seen.lock().unwrap();
    let mut latencies: Vec<Duration> = creates
        .iter()
        .map(|(name, at)| seen[name].saturating_duration_since(*at))
        .collect();
    latencies.sort();
    Ok((latencies, total))
}

/// Stops the controller when the bench ends, also on error.
struct Stopped(process::LabProcess);

impl Drop for Stopped {
    fn drop(&mut self) {
        process::stop(&self.0, Duration::from_secs(5));
    }
}

async fn bench(lab: &Lab) -> anyhow::Result<()> {
    let kubeconfig = ferrolb::install(lab)?;
    let scope = TestScope::new(lab, "bench-controller").await?;
    lab.apply(&format!(
        "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {{name: bench, namespace: {NAMESPACE}}}\nspec:\n  addresses: ['198.18.64.0/18']\n  serviceAllocation: {{priority: 1, namespaces: [bench-controller]}}\n"
    ))?;
    let controller = Stopped(ferrolb::start_controller(lab, &kubeconfig, "bench", 7480)?);
    let api: Api<Service> = Api::namespaced(lab.client().await?, &scope.namespace);
    let seen = watch_ips(api.clone());
    // Wait until the controller leads and serves.
    api.create(&PostParams::default(), &service("warmup"))
        .await?;
    wait_for("the controller to serve", Duration::from_secs(60), || {
        let ok = seen.lock().unwrap().contains_key("warmup");
        async move {
            if ok {
                Ok(Some(()))
            } else {
                Err("no IP yet".into())
            }
        }
    })
    .await?;

    let singles: usize = std::env::var("FERROLB_BENCH_SINGLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let mut single = Vec::new();
    for i in 0..singles {
        let (l, _) = burst(&api, &seen, &format!("single{i}"), 1).await?;
        single.extend(l);
    }
    single.sort();
    println!(
        "controller: single Service, creation to IP in status ({singles} samples): p50 {:.1?} p99 {:.1?} max {:.1?}",
        percentile(&single, 0.5),
        percentile(&single, 0.99),
        single.last().copied().unwrap_or_default()
    );
    let bursts: Vec<usize> = std::env::var("FERROLB_BENCH_BURSTS")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1000, 10000]);
    for n in bursts {
        let (lat, total) = burst(&api, &seen, &format!("burst{n}"), n).await?;
        let rss = ferrolb::rss_bytes(controller.0.pid).unwrap_or(0);
        println!(
            "controller: burst of {n}: creation to IP p50 {:.1?} p99 {:.1?} max {:.1?}; all {n} allocated in {:.1?}; controller RSS {:.1} MiB",
            percentile(&lat, 0.5),
            percentile(&lat, 0.99),
            lat.last().copied().unwrap_or_default(),
            total,
            rss as f64 / 1048576.0
        );
    }
    drop(controller);
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
        println!("controller bench: run with `cargo bench -p ferrolb-e2e --bench controller`");
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
