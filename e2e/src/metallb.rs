//! MetalLB, the reference ferrolb is measured against (issue #16), run in the lab where ferrolb
//! runs: its controller in the control-plane host, its speaker in every node's network namespace
//! (the host network, as its DaemonSet runs it), each with the ServiceAccount and RBAC that
//! MetalLB's own chart grants, and memberlist on as the chart sets it up.
//!
//! `e2e/install-deps` builds both binaries from the Go module and renders the chart's RBAC
//! (`metallb-rbac.yaml`) next to them. The configuration objects are the same `metallb.io`
//! objects ferrolb reads, from ferrolb's CRDs: that they serve MetalLB is part of the claim.
//!
//! Memberlist finds its peers by listing Pods with the speaker's labels and joining their
//! `status.podIP`; with no kubelet in the lab, [`MetalLb::start_speaker`] writes that Pod object as
//! a kubelet would (Running, Ready, host network, the node's address).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams};

use crate::ferrolb::NAMESPACE;
use crate::lab::{Lab, bin_dir};
use crate::process::{self, LabProcess};

/// The MetalLB release `e2e/install-deps` builds (its `METALLB_VERSION`).
pub const VERSION: &str = "v0.15.2";

/// The labels of MetalLB's speaker pods, which its chart also passes as `METALLB_ML_LABELS`.
pub const SPEAKER_LABELS: [(&str, &str); 2] = [
    ("app.kubernetes.io/name", "metallb"),
    ("app.kubernetes.io/component", "speaker"),
];

/// The memberlist port of MetalLB's chart (`speaker.memberlist.mlBindPort`).
pub const MEMBERLIST_PORT: u16 = 7946;

/// The port of MetalLB's metrics (both binaries' `--port` default, and the chart's).
pub const METRICS_PORT: u16 = 7472;

/// A file `e2e/install-deps` put in the lab's binary directory, or an error saying to run it.
fn installed(name: &str) -> anyhow::Result<PathBuf> {
    let path = bin_dir().join(name);
    ensure!(
        path.exists(),
        "{} is missing: run e2e/install-deps (it builds MetalLB {VERSION} and renders its chart's RBAC)",
        path.display()
    );
    Ok(path)
}

/// The Pod object of the speaker on `node` (its DaemonSet's pod, host network).
fn speaker_pod(node: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(speaker_pod_name(node)),
            labels: Some(
                SPEAKER_LABELS
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            host_network: Some(true),
            service_account_name: Some("metallb-speaker".into()),
            automount_service_account_token: Some(false),
            containers: vec![Container {
                name: "speaker".into(),
                image: Some(format!("quay.io/metallb/speaker:{VERSION}")),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}

/// The name of the speaker's Pod on `node` (also its `--pod-name`).
pub fn speaker_pod_name(node: &str) -> String {
    format!("metallb-speaker-{node}")
}

/// What MetalLB's processes run with: kubeconfigs with their ServiceAccounts' tokens and the
/// memberlist key directory.
#[derive(Clone, Debug)]
struct Credentials {
    controller: PathBuf,
    speaker: PathBuf,
    /// Directory with the file `secretkey`, as the chart mounts the memberlist Secret.
    memberlist: PathBuf,
}

/// Installs the CRDs, the namespace, MetalLB's RBAC (from its chart) and a memberlist key.
fn install(lab: &Lab) -> anyhow::Result<Credentials> {
    lab.install_crds()?;
    if lab.kubectl(&["get", "namespace", NAMESPACE]).is_err() {
        lab.kubectl(&["create", "namespace", NAMESPACE])?;
    }
    let rbac = installed("metallb-rbac.yaml")?;
    lab.kubectl(&["apply", "-f", &rbac.display().to_string()])?;
    let memberlist = lab.dir.join("metallb-memberlist");
    std::fs::create_dir_all(&memberlist)?;
    let key = memberlist.join("secretkey");
    if !key.exists() {
        // 128 random bits as hex, as the chart's Secret holds.
        let uuid = std::fs::read_to_string("/proc/sys/kernel/random/uuid")?;
        let hex: String = uuid.chars().filter(char::is_ascii_hexdigit).collect();
        std::fs::write(&key, hex)?;
    }
    Ok(Credentials {
        controller: lab.service_account_kubeconfig(NAMESPACE, "metallb-controller")?,
        speaker: lab.service_account_kubeconfig(NAMESPACE, "metallb-speaker")?,
        memberlist,
    })
}

/// MetalLB running in the lab: a controller and a speaker per node, the speakers restartable one
/// by one.
#[derive(Clone)]
pub struct MetalLb {
    /// The lab.
    pub lab: Lab,
    /// The controller.
    pub controller: LabProcess,
    credentials: Credentials,
    speakers: Arc<Mutex<BTreeMap<String, LabProcess>>>,
}

impl MetalLb {
    /// Installs MetalLB (CRDs, its chart's RBAC, the memberlist key), starts its controller,
    /// applies `config` (YAML) and starts a speaker on every node.
    pub async fn start(lab: &Lab, config: &str) -> anyhow::Result<Self> {
        let credentials = install(lab)?;
        let controller = start_controller(lab, &credentials.controller)?;
        let metallb = Self {
            lab: lab.clone(),
            controller,
            credentials,
            speakers: Arc::default(),
        };
        let started = async {
            lab.apply(config)?;
            for node in lab.topology.nodes() {
                metallb.start_speaker(&node.name).await?;
            }
            anyhow::Ok(())
        }
        .await;
        match started {
            Ok(()) => Ok(metallb),
            Err(e) => {
                metallb.stop();
                Err(e)
            }
        }
    }

    fn speakers(&self) -> MutexGuard<'_, BTreeMap<String, LabProcess>> {
        // A test that panicked while holding the lock leaves a map that is still valid.
        self.speakers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes the speaker's Pod object on `node` (so memberlist on the other nodes finds it) and
    /// starts the speaker in the node's namespace.
    pub async fn start_speaker(&self, node: &str) -> anyhow::Result<()> {
        let host = self
            .lab
            .topology
            .host(node)
            .with_context(|| format!("no lab host {node}"))?;
        let address = host.interfaces[0].ipv4.to_string();
        let client = self.lab.client().await?;
        crate::cluster::create_running_pod(
            &client,
            NAMESPACE,
            speaker_pod(node),
            &address,
            std::slice::from_ref(&address),
        )
        .await?;
        let labels = SPEAKER_LABELS
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let args: Vec<String> = [
            "--node-name",
            node,
            "--pod-name",
            &speaker_pod_name(node),
            "--namespace",
            NAMESPACE,
            "--kubeconfig",
            &self.credentials.speaker.display().to_string(),
            "--ml-bindaddr",
            &address,
            "--ml-bindport",
            &MEMBERLIST_PORT.to_string(),
            "--ml-labels",
            &labels,
            "--ml-secret-key-path",
            &self.credentials.memberlist.display().to_string(),
            "--port",
            &METRICS_PORT.to_string(),
            "--log-level",
            "info",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let log = self
            .lab
            .dir
            .join("logs")
            .join(format!("metallb-speaker-{node}.log"));
        let exe = installed("metallb-speaker")?;
        let p = process::spawn_kind(
            &self.lab.lab_exe,
            &format!("metallb-speaker@{node}"),
            process::Kind::Ferrolb,
            Some(&host.netns),
            &exe.display().to_string(),
            &args,
            &log,
        )?;
        // Also in the lab's state, so `lab down` stops it should the caller die before it does.
        self.lab.track_process(p.clone())?;
        self.speakers().insert(node.to_string(), p);
        Ok(())
    }

    /// Kills the speaker of `node` at once (SIGKILL: a crash). Its Pod object stays, as a crashed
    /// container's pod does.
    pub fn kill_speaker(&self, node: &str) {
        if let Some(p) = self.speakers().remove(node) {
            process::kill_now(&p);
        }
    }

    /// The running speaker of `node`.
    pub fn speaker(&self, node: &str) -> Option<LabProcess> {
        self.speakers().get(node).cloned()
    }

    /// Stops the speakers and the controller, and deletes the speakers' Pod objects.
    pub fn stop(&self) {
        let speakers = std::mem::take(&mut *self.speakers());
        for p in speakers.values() {
            process::stop(p, Duration::from_secs(5));
        }
        process::stop(&self.controller, Duration::from_secs(5));
        let lab = self.lab.clone();
        let nodes: Vec<String> = lab.topology.nodes().map(|n| n.name.clone()).collect();
        let deleted = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async {
                let pods: Api<Pod> = Api::namespaced(lab.client().await?, NAMESPACE);
                for node in nodes {
                    let _ = pods
                        .delete(&speaker_pod_name(&node), &DeleteParams::default())
                        .await;
                }
                anyhow::Ok(())
            })
        })
        .join();
        if let Ok(Err(e)) = deleted {
            eprintln!("deleting MetalLB's speaker Pods: {e:#}");
        }
    }
}

impl crate::suite::Fixture for MetalLb {
    fn teardown(&self) {
        self.stop();
    }
}

/// Installs MetalLB ([`MetalLb::start`] does the same) and starts only its controller, with
/// `extra` arguments (e.g. `--lb-class`): for comparing allocations, which need no speaker.
pub fn start_controller_only(lab: &Lab, extra: &[&str]) -> anyhow::Result<LabProcess> {
    let credentials = install(lab)?;
    start_controller_with(lab, &credentials.controller, extra)
}

/// Starts MetalLB's controller in the control-plane host: webhooks off (the lab's API server has
/// no route to a webhook Service; ferrolb's CRDs carry the validation), native BGP (its default).
fn start_controller(lab: &Lab, kubeconfig: &Path) -> anyhow::Result<LabProcess> {
    start_controller_with(lab, kubeconfig, &[])
}

/// [`start_controller`] with `extra` arguments.
fn start_controller_with(
    lab: &Lab,
    kubeconfig: &Path,
    extra: &[&str],
) -> anyhow::Result<LabProcess> {
    let log = lab.dir.join("logs").join("metallb-controller.log");
    let args: Vec<String> = [
        "--namespace",
        NAMESPACE,
        "--kubeconfig",
        &kubeconfig.display().to_string(),
        "--webhook-mode",
        "disabled",
        "--disable-cert-rotation",
        "--port",
        &METRICS_PORT.to_string(),
        "--log-level",
        "info",
    ]
    .iter()
    .chain(extra)
    .map(|s| s.to_string())
    .collect();
    let exe = installed("metallb-controller")?;
    let p = process::spawn_kind(
        &lab.lab_exe,
        "metallb-controller",
        process::Kind::Ferrolb,
        Some("flb-cp"),
        &exe.display().to_string(),
        &args,
        &log,
    )?;
    lab.track_process(p.clone())?;
    Ok(p)
}
