//! What the lab benchmarks share: the lab brought up for them (as root, with every binary
//! they run built first) and taken down after, their trial count, and one line of percentiles
//! per series of measurements.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferrolb_testkit::objects::{self, ServiceBuilder};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, PostParams};
use kube::runtime::watcher::{self, Event};

use crate::cluster::wait_for;
use crate::{Lab, Options, ferrolb};

/// The binaries a lab bench runs: the lab tool, the controller and the speaker.
pub const BINARIES: [&str; 3] = ["ferrolb-lab", "ferrolb-controller", "ferrolb-speaker"];

/// Brings the lab up for a bench: fails unless root; builds [`BINARIES`] first (a bench must
/// run the current ones).
pub async fn lab_up() -> anyhow::Result<Lab> {
    anyhow::ensure!(crate::is_root(), "the bench needs root (the lab)");
    ferrolb::build_binaries(&BINARIES)?;
    let lab_exe = ferrolb::workspace_binary("ferrolb-lab")?;
    Lab::up(Options::default(), &lab_exe).await
}

/// Creates Service `probe` (UDP 8081, the lab pods' echo) in `scope` with one pod on `seed_node`,
/// and returns its first ingress IP once allocated: a Service to fail over, whose pods
/// [`serve_away_from`] then moves away from the IP's owner.
pub async fn probe_service(
    scope: &mut crate::scope::TestScope,
    api: &Api<Service>,
    seed_node: &str,
) -> anyhow::Result<String> {
    scope.deploy("seed", &[seed_node]).await?;
    api.create(
        &PostParams::default(),
        &objects::service("probe")
            .selector("app", "seed")
            .named_port("udp", 8081, 8081, "UDP")
            .build(),
    )
    .await?;
    let status = crate::service::wait_ips(api, "probe", 1).await?;
    crate::service::ingress_ips(&status)
        .into_iter()
        .next()
        .ok_or_else(|| anyhow::anyhow!("Service probe has no ingress IP"))
}

/// Deploys pods of app `probe` on every node of `nodes` but `away_from`, points Service
/// `service` at them and waits for their endpoints: a fault on `away_from` then measures the
/// announcement, not kube-proxy's handling of a dead endpoint. Returns the nodes with pods.
pub async fn serve_away_from<'a>(
    scope: &mut crate::scope::TestScope,
    api: &kube::Api<k8s_openapi::api::core::v1::Service>,
    service: &str,
    nodes: &[&'a str],
    away_from: &str,
) -> anyhow::Result<Vec<&'a str>> {
    let others: Vec<&str> = nodes.iter().copied().filter(|n| *n != away_from).collect();
    scope.deploy("probe", &others).await?;
    api.patch(
        service,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({"spec": {"selector": {"app": "probe"}}})),
    )
    .await?;
    scope.wait_ready_endpoints(service, others.len()).await?;
    Ok(others)
}

/// Starts `ferrolb-lab probe` in `host`: a UDP datagram to `ip`'s echo port every 10 ms for
/// `duration`; [`finish_probe`] reads its report.
pub fn start_probe(
    lab: &Lab,
    host: &str,
    ip: &str,
    duration: std::time::Duration,
) -> anyhow::Result<std::process::Child> {
    Ok(lab
        .lab_command(
            host,
            &[
                "probe",
                "--ip",
                ip,
                "--interval-ms",
                "10",
                "--duration-ms",
                &duration.as_millis().to_string(),
            ],
        )?
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()?)
}

/// Waits for a probe started by [`start_probe`] and returns what it saw.
pub fn finish_probe(child: std::process::Child) -> anyhow::Result<crate::probe::Report> {
    let out = child.wait_with_output()?;
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// The speaker binary of another version of ferrolb, `commit` (anything `git rev-parse` takes
/// in this repository), built once in the release profile and kept in the cache
/// (`$FERROLB_CACHE/upgrade/<sha>/`, default `~/.cache/ferrolb`): the other side of a rolling
/// upgrade. The tree is taken with `git archive`, so the working tree and `.git` are left alone.
pub fn speaker_at(commit: &str) -> anyhow::Result<std::path::PathBuf> {
    use anyhow::Context;
    let root = crate::lab::repo_root();
    let git = |args: &[&str]| -> anyhow::Result<std::process::Output> {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(&root)
            .args(args)
            .output()
            .context("running git")?;
        anyhow::ensure!(
            out.status.success(),
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(out)
    };
    let rev = format!("{commit}^{{commit}}");
    let sha = String::from_utf8(git(&["rev-parse", "--verify", &rev])?.stdout)?
        .trim()
        .to_string();
    let cache = std::env::var_os("FERROLB_CACHE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                .join(".cache/ferrolb")
        })
        .join("upgrade");
    let src = cache.join(&sha);
    // Its own copy per version: every version builds into one shared target dir.
    let kept = cache.join(format!("ferrolb-speaker-{sha}"));
    if kept.is_file() {
        return Ok(kept);
    }
    if !src.join("Cargo.toml").is_file() {
        std::fs::create_dir_all(&src)?;
        let tar = git(&["archive", "--format=tar", &sha])?.stdout;
        let mut child = std::process::Command::new("tar")
            .arg("-x")
            .arg("-C")
            .arg(&src)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .context("running tar")?;
        std::io::Write::write_all(child.stdin.as_mut().context("tar's stdin")?, &tar)?;
        drop(child.stdin.take());
        anyhow::ensure!(child.wait()?.success(), "unpacking {sha} failed");
    }
    eprintln!("building the speaker of {sha} in {}", src.display());
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = std::process::Command::new(cargo)
        .args([
            "build",
            "--release",
            "--locked",
            "-p",
            "ferrolb-speaker",
            "--bin",
        ])
        .arg("ferrolb-speaker")
        .env("CARGO_TARGET_DIR", cache.join("target"))
        .current_dir(&src)
        .status()
        .context("running cargo")?;
    anyhow::ensure!(
        status.success(),
        "building the speaker of {sha} failed: {status}"
    );
    let built = cache.join("target").join("release").join("ferrolb-speaker");
    std::fs::copy(&built, &kept)?;
    Ok(kept)
}

/// Takes the lab down after a bench, unless `FERROLB_KEEP_LAB` is set.
pub fn lab_done() -> anyhow::Result<()> {
    if std::env::var_os("FERROLB_KEEP_LAB").is_none() {
        crate::down()?;
    }
    Ok(())
}

/// `label n= p50 p99 max min` (milliseconds) of `values`; `None` when there are none.
pub fn percentiles(label: &str, mut values: Vec<f64>) -> Option<String> {
    values.sort_by(f64::total_cmp);
    let last = *values.last()?;
    let pct = |p: f64| {
        let i = ((p * values.len() as f64).ceil() as usize).clamp(1, values.len()) - 1;
        values[i]
    };
    Some(format!(
        "{label:32} n={:3}  p50 {:7.0} ms  p99 {:7.0} ms  max {:7.0} ms  min {:7.0} ms",
        values.len(),
        pct(0.5),
        pct(0.99),
        last,
        values[0]
    ))
}

/// The trials per case a bench runs: `FERROLB_BENCH_TRIALS`, else `default`.
pub fn trials(default: usize) -> usize {
    std::env::var("FERROLB_BENCH_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

// Services created and timed until their IP shows: the controller bench and versus_metallb.

/// A LoadBalancer Service `name` with one TCP port and no NodePorts.
pub fn service(name: &str) -> ServiceBuilder {
    objects::service(name).port(80, "TCP").with(|s| {
        // No NodePorts: 10,000 Services would exhaust the 2,768 of the default range.
        s.spec
            .get_or_insert_default()
            .allocate_load_balancer_node_ports = Some(false);
    })
}

/// The map of a [`Seen`], also after a panic elsewhere (the map stays valid).
fn seen_map(seen: &Seen) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
    seen.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether the Service has an IP in its status.
pub fn has_ip(s: &Service) -> bool {
    s.status
        .as_ref()
        .and_then(|st| st.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .is_some_and(|i| !i.is_empty())
}

/// When each Service first showed an IP, by name.
pub type Seen = Arc<Mutex<HashMap<String, Instant>>>;

/// Watches the namespace and records when each Service first shows an IP.
pub fn watch_ips(api: Api<Service>) -> Seen {
    let seen: Seen = Arc::default();
    let out = seen.clone();
    tokio::spawn(async move {
        let stream = watcher::watcher(api, watcher::Config::default());
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            if let Ok(Event::Apply(s) | Event::InitApply(s)) = ev
                && has_ip(&s)
            {
                let now = Instant::now();
                seen_map(&out)
                    .entry(s.metadata.name.clone().unwrap_or_default())
                    .or_insert(now);
            }
        }
    });
    seen
}

/// The `p` quantile (0..=1) of sorted durations; zero for none.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// A number from the environment, else `default`.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// User plus system CPU time of a process, in clock ticks (USER_HZ, 100 per second on Linux).
pub fn cpu_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let rest = stat.rsplit(')').next()?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Creates `names` as LoadBalancer Services, `concurrency` at a time; returns when each
/// creation was sent.
pub async fn create_all(
    api: &Api<Service>,
    names: &[String],
    concurrency: usize,
) -> anyhow::Result<Vec<(String, Instant)>> {
    futures::stream::iter(names.iter().cloned())
        .map(|name| {
            let api = api.clone();
            async move {
                let at = Instant::now();
                api.create(&PostParams::default(), &service(&name).build())
                    .await
                    .map(|_| (name, at))
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()
        .map_err(Into::into)
}

/// Waits until every one of `names` has an IP.
pub async fn wait_all(seen: &Seen, names: &[String], what: &str) -> anyhow::Result<()> {
    let n = names.len();
    wait_for(what, Duration::from_secs(900), || {
        let done = {
            let seen = seen_map(seen);
            names.iter().filter(|n| seen.contains_key(*n)).count()
        };
        async move {
            if done == n {
                Ok(Some(()))
            } else {
                Err(format!("{done}/{n}"))
            }
        }
    })
    .await
}

/// Creates `n` Services `prefix-NNNNN`, `concurrency` at a time, and waits until all have IPs:
/// each one's latency (sorted), the total time, and the time the creations took.
pub async fn burst(
    api: &Api<Service>,
    seen: &Seen,
    prefix: &str,
    n: usize,
    concurrency: usize,
) -> anyhow::Result<(Vec<Duration>, Duration, Duration)> {
    let started = Instant::now();
    let names: Vec<String> = (0..n).map(|i| format!("{prefix}-{i:05}")).collect();
    let creates = create_all(api, &names, concurrency).await?;
    let created = started.elapsed();
    wait_all(
        seen,
        &names,
        &format!("{n} Services of burst {prefix} to get IPs"),
    )
    .await?;
    let total = started.elapsed();
    let seen = seen_map(seen);
    let mut latencies: Vec<Duration> = creates
        .iter()
        .filter_map(|(name, at)| Some(seen.get(name)?.saturating_duration_since(*at)))
        .collect();
    latencies.sort();
    Ok((latencies, total, created))
}

/// A `VmRSS`-style field of /proc/PID/status, in bytes.
pub fn proc_status_bytes(pid: i32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = status
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// Bytes as MiB (0 when unknown).
pub fn mib(bytes: Option<u64>) -> f64 {
    bytes.unwrap_or(0) as f64 / 1048576.0
}

/// CPU time a process's live threads have run, in nanoseconds (the first field of each
/// `/proc/PID/task/TID/schedstat`): [`cpu_ticks`]'s 10 ms steps are too coarse to time one
/// change. A thread that exited takes its time with it, so read it over short windows.
pub fn cpu_ns(pid: i32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0;
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        total += stat
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Some(total)
}

/// The lab's kube-proxies, stopped (SIGSTOP) until dropped.
pub struct PausedKubeProxies(Vec<i32>);

impl PausedKubeProxies {
    /// Stops every kube-proxy of the lab's state.
    pub fn pause(lab: &Lab) -> Self {
        let pids: Vec<i32> = crate::lab::State::load(&lab.dir)
            .ok()
            .flatten()
            .map(|s| {
                s.processes
                    .into_iter()
                    .filter(|p| p.name.starts_with("kube-proxy"))
                    .map(|p| p.pid)
                    .collect()
            })
            .unwrap_or_default();
        for pid in &pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid),
                nix::sys::signal::Signal::SIGSTOP,
            );
        }
        println!("kube-proxy: {} paused for the run", pids.len());
        Self(pids)
    }
}

impl Drop for PausedKubeProxies {
    fn drop(&mut self) {
        for pid in &self.0 {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid),
                nix::sys::signal::Signal::SIGCONT,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn percentiles_of_a_series() {
        let line = percentiles("x", vec![30.0, 10.0, 20.0, 40.0]).unwrap();
        assert!(line.contains("n=  4"), "{line}");
        assert!(line.contains("p50      20 ms"), "{line}");
        assert!(line.contains("p99      40 ms"), "{line}");
        assert!(line.contains("min      10 ms"), "{line}");
        assert_eq!(percentiles("x", Vec::new()), None);
    }
}
