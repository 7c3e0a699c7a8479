//! The nemesis run's recorder: gathers the client's view ([`super::observe`], run in the
//! client's namespace), every Service's IPs from a watch, the workload's edits and every
//! process's memory, into the observations a [`History`](super::check::History) holds. Times
//! are milliseconds from the start of the run.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::IpAddr;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::runtime::watcher::{self, Event};

use super::check::Observation;
use super::observe::epoch_ms;
use crate::Lab;

/// The annotations that name a Service's sharing key (MetalLB's current and former prefix).
const SHARING_KEYS: [&str; 2] = [
    "metallb.io/allow-shared-ip",
    "metallb.universe.tf/allow-shared-ip",
];

/// The processes whose memory is sampled: `(name, PID)` for each, asked anew at every sample
/// (a restarted speaker has a new PID).
pub type Processes = Arc<dyn Fn() -> Vec<(String, i32)> + Send + Sync>;

/// Observations as they come, from every source.
#[derive(Clone, Default)]
struct Sink {
    start: u64,
    seen: Arc<Mutex<Vec<Observation>>>,
}

impl Sink {
    fn now(&self) -> u64 {
        epoch_ms().saturating_sub(self.start)
    }

    fn push(&self, o: Observation) {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(o);
    }
}

/// A recording in progress.
pub struct Recorder {
    sink: Sink,
    observer: Child,
    reader: std::thread::JoinHandle<anyhow::Result<()>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Recorder {
    /// Starts recording for `duration`: the client (`from`) observes `ips`; the Services of
    /// `services` are watched; `processes`' memory is sampled every 5 s.
    pub fn start(
        lab: &Lab,
        from: &str,
        ips: &[IpAddr],
        services: Api<Service>,
        processes: Processes,
        duration: Duration,
    ) -> anyhow::Result<Self> {
        let sink = Sink {
            start: epoch_ms(),
            ..Sink::default()
        };
        let duration_ms = duration.as_millis().to_string();
        let mut args = vec!["nemesis-observe", "--duration-ms", duration_ms.as_str()];
        let ip_text: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
        for ip in &ip_text {
            args.extend(["--ip", ip.as_str()]);
        }
        let mut observer = lab
            .lab_command(from, &args)?
            .stdout(Stdio::piped())
            .spawn()
            .context("starting ferrolb-lab nemesis-observe")?;
        let stdout = observer.stdout.take().context("the observer's stdout")?;
        let reader = {
            let sink = sink.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let line = line?;
                    let o: Observation = serde_json::from_str(&line)
                        .with_context(|| format!("the observer printed {line:?}"))?;
                    sink.push(rebase(o, sink.start));
                }
                Ok(())
            })
        };
        let tasks = vec![
            tokio::spawn(watch_services(services, sink.clone())),
            tokio::spawn(sample_memory(processes, sink.clone())),
        ];
        Ok(Self {
            sink,
            observer,
            reader,
            tasks,
        })
    }

    /// Milliseconds since the recording started.
    pub fn now(&self) -> u64 {
        self.sink.now()
    }

    /// Records that the workload edited (or created, or deleted) `service` (`namespace/name`).
    pub fn edited(&self, service: &str) {
        self.sink.push(Observation::ServiceEdited {
            at: self.sink.now(),
            service: service.to_string(),
        });
    }

    /// Waits for the observer to end (it stops by itself after the duration), stops the watch
    /// and the sampler, and returns the observations with each MAC replaced by the name of
    /// its node in `nodes` (MAC → node).
    pub async fn finish(
        mut self,
        nodes: &BTreeMap<String, String>,
    ) -> anyhow::Result<Vec<Observation>> {
        let mut observer = self.observer;
        let waited = tokio::task::spawn_blocking(move || {
            let status = observer.wait();
            (observer, status)
        })
        .await;
        for t in &self.tasks {
            t.abort();
        }
        let (_, status) = waited?;
        let status = status?;
        self.reader
            .join()
            .map_err(|_| anyhow::anyhow!("the observer's reader panicked"))??;
        anyhow::ensure!(status.success(), "nemesis-observe ended with {status}");
        self.tasks.clear();
        let mut seen = std::mem::take(
            &mut *self
                .sink
                .seen
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for o in &mut seen {
            if let Observation::Neighbour { answered_by, .. } = o {
                for mac in answered_by.iter_mut() {
                    if let Some(node) = nodes.get(&mac.to_ascii_lowercase()) {
                        *mac = node.clone();
                    }
                }
            }
        }
        Ok(seen)
    }
}

/// `o` with its epoch time made relative to `start`.
fn rebase(mut o: Observation, start: u64) -> Observation {
    if let Observation::Echo {
        until: Some(until), ..
    } = &mut o
    {
        *until = until.saturating_sub(start);
    }
    match &mut o {
        Observation::Neighbour { at, .. }
        | Observation::Echo { at, .. }
        | Observation::ServiceIps { at, .. }
        | Observation::ServiceEdited { at, .. }
        | Observation::Rss { at, .. } => *at = at.saturating_sub(start),
    }
    o
}

/// Every Service's IPs as the watch delivers them (a deletion: none).
async fn watch_services(api: Api<Service>, sink: Sink) {
    let stream = watcher::watcher(api, watcher::Config::default());
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let (s, deleted) = match event {
            Ok(Event::Apply(s) | Event::InitApply(s)) => (s, false),
            Ok(Event::Delete(s)) => (s, true),
            // Errors are retried by the watcher; an outage of the API server is a fault.
            _ => continue,
        };
        sink.push(service_ips(&s, deleted, sink.now()));
    }
}

/// A Service's IPs as an observation at `at`.
pub fn service_ips(s: &Service, deleted: bool, at: u64) -> Observation {
    let name = format!(
        "{}/{}",
        s.metadata.namespace.as_deref().unwrap_or_default(),
        s.metadata.name.as_deref().unwrap_or_default()
    );
    let sharing_key = s.metadata.annotations.as_ref().and_then(|a| {
        SHARING_KEYS
            .iter()
            .find_map(|k| a.get(*k))
            .filter(|v| !v.is_empty())
            .cloned()
    });
    let mut ips: Vec<IpAddr> = if deleted {
        Vec::new()
    } else {
        crate::service::ingress_ips(s)
            .iter()
            .filter_map(|ip| ip.parse().ok())
            .collect()
    };
    ips.sort();
    Observation::ServiceIps {
        at,
        service: name,
        sharing_key,
        ips,
    }
}

/// Every process's resident memory, every 5 s.
async fn sample_memory(processes: Processes, sink: Sink) {
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tick.tick().await;
        for (process, pid) in processes() {
            if let Some(bytes) = crate::ferrolb::rss_bytes(pid) {
                sink.push(Observation::Rss {
                    at: sink.now(),
                    process,
                    bytes,
                });
            }
        }
    }
}
