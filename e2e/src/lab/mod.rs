//! Bringing the lab up and down, and everything a test does in it. `up` is idempotent; `down`
//! removes every namespace, link, route and process the lab recorded (by name and PID), and also
//! cleans up after an `up` that failed half-way.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

mod build;
mod hosts;
pub mod images;
mod kubectl;
pub mod kubelet;
mod pods;
mod processes;

pub use hosts::http_url;
use pods::remove_pod_local;
pub use processes::Outage;

use crate::cmd::run;
use crate::process::{self, LabProcess};
use crate::topology::{Options, Topology};

/// Serialises changes to the state file between threads of one process (tests run in threads).
static STATE_LOCK: Mutex<()> = Mutex::new(());

/// Where the lab keeps its state, certificates and logs (`FERROLB_LAB_DIR`, default
/// `/run/ferrolb-lab`).
pub fn lab_dir() -> PathBuf {
    std::env::var_os("FERROLB_LAB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/ferrolb-lab"))
}

/// Where the Kubernetes binaries are (`FERROLB_BIN`, default the cache `e2e/install-deps` fills).
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("FERROLB_BIN") {
        return PathBuf::from(dir);
    }
    let cache = std::env::var_os("FERROLB_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                .join(".cache/ferrolb")
        });
    cache.join("bin/current")
}

/// A pod the lab made: a namespace with an echo server, and its Pod object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabPod {
    /// Kubernetes namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Node it runs on.
    pub node: String,
    /// Network namespace.
    pub netns: String,
    /// Host number inside the node's pod CIDR.
    pub host_number: u8,
    /// Its addresses (primary family first).
    pub ips: Vec<String>,
    /// The echo server (absent while the pod is being made, and for a kubelet's pod).
    pub process: Option<LabProcess>,
    /// A real pod that a kubelet runs (`up --kubelet`): `netns` and `host_number` are unused,
    /// and it goes with its Pod object.
    #[serde(default)]
    pub kubelet: bool,
}

/// What the lab has made, saved after every step so `down` can undo a half-finished `up`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct State {
    /// The topology (absent before the first step).
    pub topology: Option<Topology>,
    /// Long-running processes, in start order.
    pub processes: Vec<LabProcess>,
    /// Network namespaces of hosts.
    pub netns: Vec<String>,
    /// Links in the host namespace.
    pub host_links: Vec<String>,
    /// Routes added in the host namespace (`ip route` arguments).
    pub host_routes: Vec<Vec<String>>,
    /// Pods.
    pub pods: Vec<LabPod>,
    /// Counter for pod namespaces and links.
    pub next_pod: u32,
    /// Kubelet nodes whose directory, mount namespace and cgroups exist (`up --kubelet`).
    #[serde(default)]
    pub kubelet_nodes: Vec<String>,
    /// Directories `up --kubelet` made on the host as mount points (removed by `down`).
    #[serde(default)]
    pub host_dirs: Vec<String>,
    /// Whether `up` finished.
    pub ready: bool,
}

impl State {
    fn path(dir: &Path) -> PathBuf {
        dir.join("state.json")
    }

    /// Infrastructure processes (see [`process::Kind`]) that no longer run: the lab is broken
    /// while there is any.
    pub fn dead_infrastructure(&self) -> Vec<&LabProcess> {
        self.processes
            .iter()
            .filter(|p| p.kind == process::Kind::Infrastructure && !process::running(p))
            .collect()
    }

    /// Reads the state, if the lab has any.
    pub fn load(dir: &Path) -> anyhow::Result<Option<State>> {
        match std::fs::read_to_string(Self::path(dir)) {
            Ok(text) => Ok(Some(
                serde_json::from_str(&text).context("parsing the lab state")?,
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).context("reading the lab state"),
        }
    }

    fn save(&self, dir: &Path) -> anyhow::Result<()> {
        let tmp = dir.join("state.json.tmp");
        std::fs::write(&tmp, serde_json::to_string_pretty(self)?)?;
        std::fs::rename(&tmp, Self::path(dir))?;
        Ok(())
    }
}

/// A running lab.
#[derive(Clone, Debug)]
pub struct Lab {
    /// State, certificates and logs.
    pub dir: PathBuf,
    /// The topology.
    pub topology: Topology,
    /// The `ferrolb-lab` executable (runs the echo servers and the node agent).
    pub lab_exe: PathBuf,
}

/// Whether we may change network namespaces (root).
pub use ferrolb_testkit::trial::is_root;

fn log_path(dir: &Path, name: &str) -> PathBuf {
    dir.join("logs").join(format!("{name}.log"))
}

fn s(items: &[&str]) -> Vec<String> {
    items.iter().map(|x| x.to_string()).collect()
}

impl Lab {
    /// The lab described by the state in `lab_dir()`, if it is up.
    pub fn running(lab_exe: &Path) -> anyhow::Result<Option<Lab>> {
        let dir = lab_dir();
        let Some(state) = State::load(&dir)? else {
            return Ok(None);
        };
        // ferrolb's own processes may die (that is what tests provoke, and what a user debugs):
        // the lab stays usable while its infrastructure runs.
        if !state.dead_infrastructure().is_empty() {
            return Ok(None);
        }
        let (true, Some(topology)) = (state.ready, state.topology) else {
            return Ok(None);
        };
        Ok(Some(Lab {
            dir,
            topology,
            lab_exe: lab_exe.to_path_buf(),
        }))
    }

    /// Brings the lab up, or reuses it when it is already up with the same options.
    pub async fn up(options: Options, lab_exe: &Path) -> anyhow::Result<Lab> {
        if !is_root() {
            bail!("the lab needs root (network namespaces, veths, routes)");
        }
        if let Some(lab) = Self::running(lab_exe)?
            && lab.topology.options == Topology::standard(options).options
        {
            if lab.topology.options.kubelet {
                // The images of the code as it is now, not as it was when the lab came up.
                lab.import_images(&images::build()?)?;
            }
            return Ok(lab);
        }
        let dir = lab_dir();
        if let Some(state) = State::load(&dir)? {
            for p in state.dead_infrastructure() {
                eprintln!(
                    "lab: {} died ({}); rebuilding the lab",
                    p.name,
                    process::exit_record(p)
                        .unwrap_or_else(|| "no exit status recorded".to_string())
                );
            }
        }
        down()?;
        // Logs start fresh with each lab, so a failure's logs are that lab's alone; the previous
        // lab's are kept (the evidence of whatever made it go away), a bounded number of them.
        if let Some(kept) = crate::logs::archive(&dir)? {
            eprintln!("lab: the previous lab's logs are in {}", kept.display());
        }
        std::fs::create_dir_all(dir.join("logs"))?;
        let lab = Lab {
            dir: dir.clone(),
            topology: Topology::standard(options),
            lab_exe: lab_exe.to_path_buf(),
        };
        let mut state = State {
            topology: Some(lab.topology.clone()),
            ..Default::default()
        };
        state.save(&dir)?;
        match lab.build(&mut state).await {
            Ok(()) => {
                state.ready = true;
                state.save(&dir)?;
                Ok(lab)
            }
            Err(e) => {
                let _ = state.save(&dir);
                if let Err(cleanup) = down() {
                    eprintln!("lab: cleaning up after the failed up also failed: {cleanup:#}");
                }
                Err(e.context("bringing the lab up (everything it made has been removed)"))
            }
        }
    }
}

/// Takes the lab down: stops every recorded process by PID, deletes every recorded namespace,
/// link and route by name. Safe to run when nothing is up, and after a failed `up`.
pub fn down() -> anyhow::Result<()> {
    let dir = lab_dir();
    let state = State::load(&dir)?;
    let Some(state) = state else { return Ok(()) };
    for pod in &state.pods {
        remove_pod_local(pod);
    }
    // Containers first: they run under the kubelets, not as lab processes.
    let mut problems = Vec::new();
    for node in &state.kubelet_nodes {
        problems.extend(kubelet::teardown_node(&dir, &state, node));
    }
    let nodes_dir = dir.join("nodes");
    if kubelet::is_mount_point(&nodes_dir)
        && let Err(e) = run("umount", &[&nodes_dir.display().to_string()])
    {
        problems.push(format!("{}: {e:#}", nodes_dir.display()));
    }
    let _ = std::fs::remove_dir(&nodes_dir);
    for host_dir in state.host_dirs.iter().rev() {
        // Only if empty: something else may have put files there since.
        let _ = std::fs::remove_dir(host_dir);
    }
    for p in state.processes.iter().rev() {
        process::stop(p, Duration::from_secs(5));
    }
    for ns in state.netns.iter().rev() {
        if let Err(e) = run("ip", &["netns", "del", ns])
            && !e.to_string().contains("No such file")
        {
            problems.push(e.to_string());
        }
    }
    for link in &state.host_links {
        let _ = run("ip", &["link", "del", link]);
    }
    // Host-side veth ends go away with their namespaces; remove any left by a crash.
    if let Some(t) = &state.topology {
        for host in &t.hosts {
            let _ = crate::cmd::output("ip", &["link", "del", &format!("flb-{}", host.name)]);
        }
    }
    for route in &state.host_routes {
        let _ = crate::cmd::output("ip", &route.iter().map(String::as_str).collect::<Vec<_>>());
    }
    std::fs::remove_file(State::path(&dir)).or_else(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            Ok(())
        } else {
            Err(e)
        }
    })?;
    let _ = std::fs::remove_dir_all(dir.join("etcd"));
    if problems.is_empty() {
        Ok(())
    } else {
        bail!("lab down left problems: {}", problems.join("; "))
    }
}

/// The repository's root (for manifests the tests apply).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}
