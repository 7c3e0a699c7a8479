//! Running ferrolb's own components in the lab: CRDs, RBAC, ServiceAccount credentials, and
//! controller processes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, ensure};

use crate::lab::{Lab, repo_root};
use crate::process::{self, LabProcess};

/// Namespace of ferrolb's configuration objects in the lab.
pub const NAMESPACE: &str = "metallb-system";

/// The package that builds each binary the lab runs.
fn package_of(binary: &str) -> &str {
    match binary {
        "ferrolb-lab" => "ferrolb-e2e",
        "ferrolb" | "kubectl-ferrolb" => "ferrolb-cli",
        other => other,
    }
}

/// A binary of the workspace, next to the running test or bench binary (cargo builds every
/// binary of the workspace for `cargo test --workspace` and `cargo bench --workspace`, the
/// benches build the ones they run with [`build_binaries`], and `e2e/lab` builds the ones it
/// runs). Refuses a missing binary, and a stale one (a source file newer than the binary, by
/// the dep-info file cargo writes next to it): a test must never run yesterday's speaker. Both
/// errors give the command that builds it for this profile.
pub fn workspace_binary(name: &str) -> anyhow::Result<PathBuf> {
    let profile_dir = profile_dir()?;
    let build = format!("cargo {}", build_args(&[name], &profile_dir).join(" "));
    let path = profile_dir.join(name);
    ensure!(
        path.is_file(),
        "{name} is missing in {}: run `{build}` first",
        profile_dir.display()
    );
    if let Some(newer) = newer_source(&path) {
        anyhow::bail!(
            "{} is older than {} (changed since it was built): run `{build}` first",
            path.display(),
            newer.display()
        );
    }
    Ok(path)
}

/// Builds `binaries` of the workspace in the profile of the running test or bench binary (a
/// bench in the release profile, as `cargo bench` builds it), with cargo's progress on stderr:
/// what `e2e/lab` does before it runs the lab, here for a bench that must run current binaries.
pub fn build_binaries(binaries: &[&str]) -> anyhow::Result<()> {
    let args = build_args(binaries, &profile_dir()?);
    // The cargo running this bench, also under sudo (whose PATH may lack ~/.cargo/bin).
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!(
        "building {} (cargo {})",
        binaries.join(", "),
        args.join(" ")
    );
    let mut command = std::process::Command::new(cargo);
    command.args(&args).arg("--locked").current_dir(repo_root());
    without_running_package_env(&mut command);
    let status = command.status().context("running cargo")?;
    ensure!(
        status.success(),
        "`cargo {}` failed: {status}",
        args.join(" ")
    );
    Ok(())
}

/// Removes from `command` what cargo sets for the bench or test it runs (`CARGO_PKG_*`,
/// `CARGO_MANIFEST_*`, `CARGO_CRATE_NAME`, ...). Build scripts declare some of these with
/// `rerun-if-env-changed` (ring's does: `CARGO_MANIFEST_DIR`, `CARGO_PKG_NAME`, ...), and cargo
/// compares them from its own environment: a cargo started with them set, then one without,
/// each ran ring's build script again and rebuilt everything above it (rustls, kube), about
/// 8 minutes of every lab bench's start.
pub(crate) fn without_running_package_env(command: &mut std::process::Command) {
    const SET_FOR_A_RUNNING_TARGET: [&str; 7] = [
        "CARGO_CRATE_NAME",
        "CARGO_BIN_NAME",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
        "CARGO_RUSTC_CURRENT_DIR",
        "OUT_DIR",
        "CARGO_MANIFEST_LINKS",
    ];
    for (key, _) in std::env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        if key.starts_with("CARGO_PKG_")
            || key.starts_with("CARGO_MANIFEST_")
            || SET_FOR_A_RUNNING_TARGET.contains(&key)
        {
            command.env_remove(key);
        }
    }
}

/// target/<profile>/ of the running binary: binaries sit there, test and bench binaries in its
/// deps/.
fn profile_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("target directory")?;
    let profile_dir = if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().context("target directory")?
    } else {
        dir
    };
    Ok(profile_dir.to_path_buf())
}

/// cargo's arguments that build `binaries` into `profile_dir`. Each binary is named with its
/// package: `--bin` applies to every selected package.
fn build_args(binaries: &[&str], profile_dir: &Path) -> Vec<String> {
    let mut args = vec!["build".to_string()];
    match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => {}
        // `cargo bench` uses the bench profile, which writes to target/release.
        Some("release") => args.push("--release".into()),
        Some(other) => args.extend(["--profile".into(), other.into()]),
    }
    let mut packages: Vec<&str> = binaries.iter().map(|b| package_of(b)).collect();
    packages.dedup();
    for package in packages {
        args.extend(["-p".into(), package.into()]);
    }
    for binary in binaries {
        args.extend(["--bin".into(), binary.to_string()]);
    }
    args
}

/// A source file of `binary` (as listed in cargo's dep-info file `<binary>.d`) that is newer than
/// the binary, if any. Without a dep-info file nothing can be said, and nothing is claimed.
fn newer_source(binary: &Path) -> Option<PathBuf> {
    let built = std::fs::metadata(binary).and_then(|m| m.modified()).ok()?;
    let mut dep_info = binary.as_os_str().to_owned();
    dep_info.push(".d");
    let text = std::fs::read_to_string(PathBuf::from(dep_info)).ok()?;
    // `target: dep dep ...` (spaces in paths are escaped as `\ `; our paths have none).
    let (_, deps) = text.lines().next()?.split_once(": ")?;
    deps.split_whitespace().map(PathBuf::from).find(|dep| {
        std::fs::metadata(dep)
            .and_then(|m| m.modified())
            .is_ok_and(|changed| changed > built)
    })
}

/// Installs the CRDs, the namespace and the controller's RBAC; returns a kubeconfig with the
/// controller ServiceAccount's token.
pub fn install(lab: &Lab) -> anyhow::Result<PathBuf> {
    lab.install_crds()?;
    if lab.kubectl(&["get", "namespace", NAMESPACE]).is_err() {
        lab.kubectl(&["create", "namespace", NAMESPACE])?;
    }
    let rbac = repo_root().join("charts/ferrolb/rbac/controller.yaml");
    lab.kubectl(&["apply", "-f", &rbac.display().to_string()])?;
    lab.service_account_kubeconfig(NAMESPACE, "ferrolb-controller")
}

/// The failpoint directory of controller replica `identity`: a file `controller-loop` in it
/// stalls that replica's work loop until removed (debug builds).
pub fn controller_failpoints(lab: &Lab, identity: &str) -> PathBuf {
    lab.dir
        .join("failpoints")
        .join(format!("controller-{identity}"))
}

/// The gossip key Secret the lab's controllers create (`--gossip-secret-name`).
pub const CONTROLLER_MADE_GOSSIP_SECRET: &str = "ferrolb-controller-made-gossip-key";

/// Starts a controller replica in the control-plane host, with fast lease timings.
pub fn start_controller(
    lab: &Lab,
    kubeconfig: &Path,
    identity: &str,
    port: u16,
) -> anyhow::Result<LabProcess> {
    start_controller_with(lab, kubeconfig, identity, port, &[])
}

/// The controller's Lease timings as the chart ships them (its defaults); the lab's replicas
/// run faster ones unless `extra` gives these.
pub const SHIPPED_LEASE_TIMINGS: [&str; 8] = [
    "--lease-duration",
    "15s",
    "--renew-deadline",
    "10s",
    "--retry-period",
    "2s",
    "--stall-timeout",
    "30s",
];

/// [`start_controller`] with `extra` arguments (e.g. `--lb-class`, or
/// [`SHIPPED_LEASE_TIMINGS`] instead of the lab's fast ones).
pub fn start_controller_with(
    lab: &Lab,
    kubeconfig: &Path,
    identity: &str,
    port: u16,
    extra: &[&str],
) -> anyhow::Result<LabProcess> {
    let log = lab
        .dir
        .join("logs")
        .join(format!("controller-{identity}.log"));
    let fast = [
        "--lease-duration",
        "4s",
        "--renew-deadline",
        "3s",
        "--retry-period",
        "500ms",
        "--stall-timeout",
        "5s",
    ];
    let timings: &[&str] = if extra.contains(&"--lease-duration") {
        &[]
    } else {
        &fast
    };
    let args: Vec<String> = [
        "run",
        "--kubeconfig",
        &kubeconfig.display().to_string(),
        "--identity",
        identity,
        "--listen",
        &format!("127.0.0.1:{port}"),
    ]
    .iter()
    .chain(timings)
    .chain(&[
        "--failpoints",
        &controller_failpoints(lab, identity).display().to_string(),
        // The Secret a chart with `speaker.secretCreatedBy: controller` leaves to the
        // controller; named apart from the key the lab's speakers use.
        "--gossip-secret-name",
        CONTROLLER_MADE_GOSSIP_SECRET,
        // The account whose token it runs with: the owner of its Lease and ConfigurationState,
        // as in the chart (the RBAC file grants reading it).
        "--service-account",
        "ferrolb-controller",
    ])
    .chain(extra)
    .map(|s| s.to_string())
    .collect();
    let exe = workspace_binary("ferrolb-controller")?;
    let p = process::spawn_kind(
        &lab.lab_exe,
        &format!("controller-{identity}"),
        process::Kind::Ferrolb,
        Some("flb-cp"),
        &exe.display().to_string(),
        &args,
        &log,
    )?;
    // Also in the lab's state, so `lab down` stops it should the caller die before it does.
    lab.track_process(p.clone())?;
    Ok(p)
}

/// An IPAddressPool `name` with `addresses` and an L2Advertisement of the same name for it, as
/// YAML for [`Lab::apply`].
pub fn l2_pool(name: &str, addresses: &[&str]) -> String {
    let list = addresses
        .iter()
        .map(|a| format!("'{a}'"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {{name: {name}, namespace: {NAMESPACE}}}
spec:
  addresses: [{list}]
---
apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {{name: {name}, namespace: {NAMESPACE}}}
spec:
  ipAddressPools: [{name}]
"
    )
}

/// What speakers need to run in the lab: their ServiceAccount's kubeconfig and the gossip key.
#[derive(Clone, Debug)]
pub struct SpeakerCredentials {
    /// Kubeconfig with the ferrolb-speaker ServiceAccount's token.
    pub kubeconfig: PathBuf,
    /// File with the key that authenticates heartbeats.
    pub gossip_key: PathBuf,
}

/// Installs the speaker's RBAC (after [`install`]) and writes a gossip key.
pub fn install_speaker(lab: &Lab) -> anyhow::Result<SpeakerCredentials> {
    let rbac = repo_root().join("charts/ferrolb/rbac/speaker.yaml");
    lab.kubectl(&["apply", "-f", &rbac.display().to_string()])?;
    let kubeconfig = lab.service_account_kubeconfig(NAMESPACE, "ferrolb-speaker")?;
    let gossip_key = lab.dir.join("gossip.key");
    if !gossip_key.exists() {
        // 32 random bytes as hex, from the kernel (the chart generates one the same way).
        let uuid = |_| std::fs::read_to_string("/proc/sys/kernel/random/uuid");
        let key: String = (0..2)
            .map(uuid)
            .collect::<Result<Vec<_>, _>>()?
            .concat()
            .chars()
            .filter(char::is_ascii_hexdigit)
            .collect();
        std::fs::write(&gossip_key, key)?;
    }
    Ok(SpeakerCredentials {
        kubeconfig,
        gossip_key,
    })
}

/// A lab speaker's `/readyz` (it listens on port 7472 of its node), asked in its node: the HTTP
/// status and the body.
pub fn speaker_readyz(lab: &Lab, node: &str) -> anyhow::Result<(u16, String)> {
    let out = lab.exec(
        node,
        "curl",
        &[
            "-sS",
            "--max-time",
            "3",
            "-w",
            "\n%{http_code}",
            "http://127.0.0.1:7472/readyz",
        ],
    )?;
    let (body, code) = out
        .trim_end()
        .rsplit_once('\n')
        .with_context(|| format!("{node}: /readyz answered {out:?}"))?;
    Ok((code.trim().parse()?, body.trim().to_string()))
}

/// Waits until the speaker of `node` says it is ready, as a DaemonSet update waits for a new pod.
pub async fn wait_speaker_ready(lab: &Lab, node: &str, within: Duration) -> anyhow::Result<()> {
    crate::cluster::wait_for(
        &format!("{node}'s speaker to be ready (/readyz)"),
        within,
        || async {
            match speaker_readyz(lab, node) {
                Ok((200, _)) => Ok(Some(())),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
}

/// Starts the speaker of lab node `node` in its network namespace (its host network), with
/// `extra` arguments after the standard ones.
pub fn start_speaker(
    lab: &Lab,
    credentials: &SpeakerCredentials,
    node: &str,
    extra: &[&str],
) -> anyhow::Result<LabProcess> {
    start_speaker_clocked(lab, credentials, node, extra, None)
}

/// [`start_speaker`] with the speaker's wall clock off by `offset` (libfaketime's notation,
/// e.g. `+90s`, `-1h`) when given: the node's NTP broken. Its monotonic clock is left alone,
/// as a wall clock step leaves a real one (`faketime --exclude-monotonic`).
pub fn start_speaker_clocked(
    lab: &Lab,
    credentials: &SpeakerCredentials,
    node: &str,
    extra: &[&str],
    offset: Option<&str>,
) -> anyhow::Result<LabProcess> {
    let exe = workspace_binary("ferrolb-speaker")?;
    spawn_speaker(lab, credentials, node, extra, offset, &exe)
}

/// [`start_speaker`] running the speaker binary `exe` instead of the workspace's: another
/// version's, for a rolling upgrade between versions ([`crate::bench::speaker_at`]).
pub fn start_speaker_exe(
    lab: &Lab,
    credentials: &SpeakerCredentials,
    node: &str,
    extra: &[&str],
    exe: &Path,
) -> anyhow::Result<LabProcess> {
    spawn_speaker(lab, credentials, node, extra, None, exe)
}

fn spawn_speaker(
    lab: &Lab,
    credentials: &SpeakerCredentials,
    node: &str,
    extra: &[&str],
    offset: Option<&str>,
    exe: &Path,
) -> anyhow::Result<LabProcess> {
    let host = lab
        .topology
        .host(node)
        .with_context(|| format!("no lab host {node}"))?;
    let log = lab.dir.join("logs").join(format!("speaker-{node}.log"));
    let mut args: Vec<String> = [
        "--node-name",
        node,
        "--kubeconfig",
        &credentials.kubeconfig.display().to_string(),
        "--gossip-key-file",
        &credentials.gossip_key.display().to_string(),
        "--listen",
        "0.0.0.0:7472",
        "--log-level",
        "info,ferrolb_speaker=debug",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    speaker_pod(lab, node, &host.interfaces[0].ipv4.to_string())?;
    let exe = exe.display().to_string();
    let (program, args) = match offset {
        None => (exe, args),
        Some(offset) => {
            let faketime = ["-m", "--exclude-monotonic", "-f", offset, &exe];
            let wrapped = faketime.iter().map(|s| s.to_string()).chain(args);
            ("faketime".to_string(), wrapped.collect())
        }
    };
    let p = process::spawn_kind(
        &lab.lab_exe,
        &format!("speaker@{node}"),
        process::Kind::Ferrolb,
        Some(&host.netns),
        &program,
        &args,
        &log,
    )?;
    // Also in the lab's state, so `lab down` stops it should the caller die before it does.
    lab.track_process(p.clone())?;
    Ok(p)
}

/// The name of the Pod object standing for the lab speaker of `node`.
pub fn speaker_pod_name(node: &str) -> String {
    format!("ferrolb-speaker-{node}")
}

/// Writes the Pod object a kubelet would show for the speaker of `node` (Running, host
/// network, the node's `address`, the metrics port named `monitoring`), once: with no kubelet
/// in the lab, `kubectl ferrolb explain` reaches the speaker through the API server's proxy to
/// this Pod, as it does in a cluster. The Pod stays across the speaker's restarts, as a
/// DaemonSet's Pod does across container restarts.
fn speaker_pod(lab: &Lab, node: &str, address: &str) -> anyhow::Result<()> {
    let name = speaker_pod_name(node);
    // Bounded: with etcd down the API server holds a request for a minute before it fails,
    // and a speaker started then (the nemesis restarts them during such outages) must fail
    // fast and be started again later. A Pod that does not exist is no error.
    let ip = lab.kubectl(&[
        "get",
        "pod",
        &name,
        "-n",
        NAMESPACE,
        "--ignore-not-found",
        "--request-timeout=5s",
        "-o",
        "jsonpath={.status.podIP}",
    ])?;
    if ip.trim() == address {
        return Ok(());
    }
    lab.apply(&format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {NAMESPACE}
  labels: {{app.kubernetes.io/name: ferrolb, app.kubernetes.io/component: speaker}}
spec:
  nodeName: {node}
  hostNetwork: true
  serviceAccountName: ferrolb-speaker
  automountServiceAccountToken: false
  containers:
  - name: speaker
    image: ghcr.io/ferrolb/ferrolb-speaker:lab
    ports: [{{name: monitoring, containerPort: 7472}}]
"
    ))?;
    let now = "2026-01-01T00:00:00Z";
    let conditions: Vec<serde_json::Value> =
        ["PodScheduled", "Initialized", "ContainersReady", "Ready"]
            .iter()
            .map(|t| serde_json::json!({"type": t, "status": "True", "lastTransitionTime": now}))
            .collect();
    let status = serde_json::json!({"status": {
        "phase": "Running", "hostIP": address, "podIP": address,
        "podIPs": [{"ip": address}], "startTime": now, "conditions": conditions,
    }});
    lab.kubectl(&[
        "patch",
        "pod",
        &name,
        "-n",
        NAMESPACE,
        "--subresource=status",
        "--type=merge",
        "-p",
        &status.to_string(),
    ])?;
    Ok(())
}

/// Resident memory of a process, in bytes.
pub fn rss_bytes(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// `FERROLB_LAB_SPEAKER_ARGS`: arguments every lab speaker gets (space-separated), to run a
/// suite with a setting other than the default (`--flap-damping=false`, or
/// `--membership=voters --voters=node1,node2,node3`).
fn lab_speaker_args() -> String {
    std::env::var("FERROLB_LAB_SPEAKER_ARGS").unwrap_or_default()
}

/// The speakers of a suite, one per node, restartable one by one.
pub struct Speakers {
    lab: Lab,
    credentials: SpeakerCredentials,
    /// Arguments every speaker of the suite gets, before `FERROLB_LAB_SPEAKER_ARGS`'s.
    args: Vec<String>,
    /// The speaker binary, when not the workspace's (a deliberately broken build).
    exe: Option<PathBuf>,
    running: std::sync::Mutex<std::collections::BTreeMap<String, LabProcess>>,
}

impl Speakers {
    /// Installs the speaker's RBAC and key ([`install_speaker`]); starts no speaker yet.
    pub fn new(lab: &Lab) -> anyhow::Result<Self> {
        Ok(Self {
            lab: lab.clone(),
            credentials: install_speaker(lab)?,
            args: Vec::new(),
            exe: None,
            running: std::sync::Mutex::new(std::collections::BTreeMap::new()),
        })
    }

    /// [`Self::new`] with arguments every speaker gets (a suite run with a setting other than
    /// the default, such as `--membership=voters`).
    pub fn with_args(lab: &Lab, args: &[&str]) -> anyhow::Result<Self> {
        Ok(Self {
            args: args.iter().map(|s| s.to_string()).collect(),
            ..Self::new(lab)?
        })
    }

    /// The binary the speakers run.
    fn exe(&self) -> anyhow::Result<PathBuf> {
        match &self.exe {
            Some(exe) => Ok(exe.clone()),
            None => workspace_binary("ferrolb-speaker"),
        }
    }

    /// The suite's arguments and `FERROLB_LAB_SPEAKER_ARGS`'s.
    fn common_args(&self) -> Vec<String> {
        let mut args = self.args.clone();
        args.extend(lab_speaker_args().split_whitespace().map(str::to_string));
        args
    }

    fn running(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<String, LabProcess>> {
        // A test that panicked while holding the lock leaves a map that is still valid.
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The credentials the speakers run with.
    pub fn credentials(&self) -> &SpeakerCredentials {
        &self.credentials
    }

    /// Starts the speaker of `node` with the standard arguments, and any in
    /// `FERROLB_LAB_SPEAKER_ARGS` ([`lab_speaker_args`]).
    pub fn start(&self, node: &str) -> anyhow::Result<()> {
        self.start_with(node, &[])
    }

    /// [`Self::start`] with its own key files: `key` to sign with, `next` (`--gossip-next-key-file`,
    /// read while it exists) for a rotation.
    pub fn start_with_keys(&self, node: &str, key: &Path, next: &Path) -> anyhow::Result<()> {
        let credentials = SpeakerCredentials {
            gossip_key: key.to_path_buf(),
            ..self.credentials.clone()
        };
        let next = next.display().to_string();
        let common = self.common_args();
        let mut args: Vec<&str> = common.iter().map(String::as_str).collect();
        args.extend(["--gossip-next-key-file", &next]);
        let p = spawn_speaker(&self.lab, &credentials, node, &args, None, &self.exe()?)?;
        self.running().insert(node.to_string(), p);
        Ok(())
    }

    /// [`Self::start`] with more arguments for this speaker.
    pub fn start_with(&self, node: &str, more: &[&str]) -> anyhow::Result<()> {
        let common = self.common_args();
        let mut extra: Vec<&str> = common.iter().map(String::as_str).collect();
        extra.extend_from_slice(more);
        let p = spawn_speaker(
            &self.lab,
            &self.credentials,
            node,
            &extra,
            None,
            &self.exe()?,
        )?;
        self.running().insert(node.to_string(), p);
        Ok(())
    }

    /// [`Self::start`] with the speaker's wall clock off by `offset` ([`start_speaker_clocked`]).
    pub fn start_clocked(&self, node: &str, offset: &str) -> anyhow::Result<()> {
        let common = self.common_args();
        let extra: Vec<&str> = common.iter().map(String::as_str).collect();
        let p = spawn_speaker(
            &self.lab,
            &self.credentials,
            node,
            &extra,
            Some(offset),
            &self.exe()?,
        )?;
        self.running().insert(node.to_string(), p);
        Ok(())
    }

    /// Kills the speaker of `node` at once (SIGKILL: a crash). A speaker run under
    /// `faketime` ([`Self::start_clocked`]) is a child of the `faketime` process, which forks
    /// it: the child is killed first, or it would outlive its wrapper and go on answering.
    pub fn kill(&self, node: &str) {
        if let Some(p) = self.running().remove(node) {
            if process::running(&p) {
                for child in process::children(p.pid) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(child),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
            process::kill_now(&p);
        }
    }

    /// Stops the speaker of `node` (SIGTERM: it shuts down cleanly).
    pub fn stop(&self, node: &str) {
        if let Some(p) = self.running().remove(node) {
            process::stop(&p, Duration::from_secs(5));
        }
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`): a frozen speaker keeps its sockets open but sends
    /// nothing.
    pub fn freeze(&self, node: &str, frozen: bool) -> anyhow::Result<()> {
        use nix::sys::signal::{Signal, kill};
        let pid = self
            .running()
            .get(node)
            .map(|p| p.pid)
            .context("no speaker")?;
        let signal = if frozen {
            Signal::SIGSTOP
        } else {
            Signal::SIGCONT
        };
        kill(nix::unistd::Pid::from_raw(pid), signal)?;
        Ok(())
    }

    /// The running speakers' nodes and PIDs.
    pub fn pids(&self) -> Vec<(String, i32)> {
        self.running()
            .iter()
            .map(|(node, p)| (node.clone(), p.pid))
            .collect()
    }

    /// The running speaker of `node` (its PID and log).
    pub fn process(&self, node: &str) -> Option<LabProcess> {
        self.running().get(node).cloned()
    }

    /// Whether the suite has a speaker running on `node`.
    pub fn is_running(&self, node: &str) -> bool {
        self.running().contains_key(node)
    }

    /// Stops every speaker (a frozen one is resumed first: it would not see SIGTERM).
    pub fn stop_all(&self) {
        for (_, p) in std::mem::take(&mut *self.running()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p.pid),
                nix::sys::signal::Signal::SIGCONT,
            );
            process::stop(&p, Duration::from_secs(5));
        }
    }
}

/// ferrolb running in the lab as a suite uses it: a controller on the control plane and a
/// speaker on every node, with a configuration applied.
#[derive(Clone)]
pub struct Deployment {
    /// The lab.
    pub lab: Lab,
    /// The controller.
    pub controller: LabProcess,
    /// The speakers, one per node.
    pub speakers: std::sync::Arc<Speakers>,
}

impl Deployment {
    /// Installs ferrolb (CRDs, RBAC, the speakers' key), starts the controller `controller-<name>`
    /// on port 7472, applies `config` (YAML) and starts a speaker on every node.
    pub fn start(lab: &Lab, name: &str, config: &str) -> anyhow::Result<Self> {
        Self::start_with(lab, name, config, &[])
    }

    /// [`Self::start`] with more arguments for the controller.
    pub fn start_with(
        lab: &Lab,
        name: &str,
        config: &str,
        controller_args: &[&str],
    ) -> anyhow::Result<Self> {
        Self::start_with_speakers(lab, name, config, controller_args, &[])
    }

    /// [`Self::start_with`] with arguments for every speaker too.
    pub fn start_with_speakers(
        lab: &Lab,
        name: &str,
        config: &str,
        controller_args: &[&str],
        speaker_args: &[&str],
    ) -> anyhow::Result<Self> {
        Self::start_with_speaker_exe(lab, name, config, controller_args, speaker_args, None)
    }

    /// [`Self::start_with_speakers`] with the speakers running `speaker_exe` when given (a
    /// deliberately broken build, for the nemesis's checkers) instead of the workspace's.
    pub fn start_with_speaker_exe(
        lab: &Lab,
        name: &str,
        config: &str,
        controller_args: &[&str],
        speaker_args: &[&str],
        speaker_exe: Option<&Path>,
    ) -> anyhow::Result<Self> {
        let kubeconfig = install(lab)?;
        let controller = start_controller_with(lab, &kubeconfig, name, 7472, controller_args)?;
        let speakers = Speakers {
            exe: speaker_exe.map(Path::to_path_buf),
            ..Speakers::with_args(lab, speaker_args)?
        };
        let deployment = Self {
            lab: lab.clone(),
            controller,
            speakers: std::sync::Arc::new(speakers),
        };
        let started = (|| {
            lab.apply(config)?;
            for node in lab.topology.nodes() {
                deployment.speakers.start(&node.name)?;
            }
            anyhow::Ok(())
        })();
        match started {
            Ok(()) => Ok(deployment),
            Err(e) => {
                deployment.stop();
                Err(e)
            }
        }
    }

    /// Stops the speakers and the controller.
    pub fn stop(&self) {
        self.speakers.stop_all();
        process::stop(&self.controller, Duration::from_secs(5));
    }
}

impl crate::suite::Fixture for Deployment {
    fn teardown(&self) {
        self.stop();
    }
}

/// The nodes that the ServiceL2Status objects matching `selector` (a label selector, such as
/// `metallb.io/service-namespace=ns`) name in their status, one per object.
pub fn l2_status_nodes(lab: &Lab, selector: &str) -> anyhow::Result<Vec<String>> {
    let out = lab.kubectl(&[
        "get",
        "servicel2statuses",
        "-n",
        NAMESPACE,
        "-l",
        selector,
        "-o",
        "jsonpath={.items[*].status.node}",
    ])?;
    Ok(out.split_whitespace().map(str::to_string).collect())
}

/// One speaker's metric, scraped in its node.
pub fn speaker_metric(lab: &Lab, node: &str, name: &str) -> anyhow::Result<f64> {
    let page = lab.exec(
        node,
        "curl",
        &["-sS", "--max-time", "3", "http://127.0.0.1:7472/metrics"],
    )?;
    // A name with labels matches its series; a bare name only itself, not longer names.
    let prefix = if name.contains('{') {
        name.to_string()
    } else {
        format!("{name} ")
    };
    page.lines()
        .filter(|l| l.starts_with(&prefix))
        .map(|l| {
            l.rsplit(' ')
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .with_context(|| format!("{node}: unreadable metric line {l:?}"))
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Under `cargo test` this process has the package variables cargo sets for what it runs;
    /// the nested build must not see them (they made every lab bench rebuild ring and what
    /// depends on it), and must keep the rest (`CARGO_HOME`, `PATH`, ...).
    #[test]
    fn the_nested_build_runs_without_the_running_package_variables() {
        let package = |k: &str| k.starts_with("CARGO_PKG_") || k.starts_with("CARGO_MANIFEST_");
        let present: BTreeSet<String> = std::env::vars_os()
            .filter_map(|(k, _)| k.into_string().ok())
            .filter(|k| package(k))
            .collect();
        if std::env::var_os("CARGO").is_some() {
            assert!(present.contains("CARGO_PKG_NAME"), "{present:?}");
        }
        let mut command = std::process::Command::new("true");
        without_running_package_env(&mut command);
        let removed: BTreeSet<String> = command
            .get_envs()
            .filter(|(_, v)| v.is_none())
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        assert!(
            present.is_subset(&removed),
            "{present:?} not all in {removed:?}"
        );
        for kept in ["CARGO", "CARGO_HOME", "PATH", "HOME"] {
            assert!(!removed.contains(kept), "{kept} removed");
        }
    }

    #[test]
    fn the_build_command_names_each_package_and_binary_in_the_profile() {
        let release = Path::new("/repo/target/release");
        assert_eq!(
            build_args(
                &["ferrolb-lab", "ferrolb-controller", "ferrolb-speaker"],
                release
            )
            .join(" "),
            "build --release -p ferrolb-e2e -p ferrolb-controller -p ferrolb-speaker \
             --bin ferrolb-lab --bin ferrolb-controller --bin ferrolb-speaker"
        );
        let debug = Path::new("/repo/target/debug");
        assert_eq!(
            build_args(&["ferrolb", "kubectl-ferrolb"], debug).join(" "),
            "build -p ferrolb-cli --bin ferrolb --bin kubectl-ferrolb"
        );
        let custom = Path::new("/repo/target/profiling");
        assert_eq!(
            build_args(&["ferrolb-speaker"], custom).join(" "),
            "build --profile profiling -p ferrolb-speaker --bin ferrolb-speaker"
        );
    }
}
