//! Kubelet nodes (`up --kubelet`): in every node's network namespace a containerd and a kubelet,
//! registered with the lab's API server by client certificate, running the pods it schedules with
//! routed pod networking (the CNI ptp and host-local plugins) in the upper half of the node's pod
//! CIDR. Decision record 0022 says why these versions and this layout.
//!
//! Several kubelets and containerds share one kernel here, and each would otherwise take
//! host-wide paths for itself. Each node therefore gets:
//! - its own directory (`<lab>/nodes/<node>`) for containerd's root, state and socket, runc's
//!   root, the kubelet's root, the CNI configuration and leases, and the pod logs;
//! - its own mount namespace, which containerd and the kubelet share (the kubelet mounts the
//!   pods' Secret and token volumes, and containerd's runc must see them). In it, the host-wide
//!   paths these programs hard-code (`/run/containerd`, `/var/lib/cni`, `/var/log/pods`,
//!   `/var/log/containers`) are bound to the node's directory, and the kernel settings the kubelet
//!   insists on setting (`vm.overcommit_memory`, `kernel.panic_on_oops`, ...) to files, so it
//!   never changes the machine's (a kubelet would set `kernel.panic_on_oops=1` for everyone);
//! - its own cgroups, `/ferrolb-lab/<node>/runtime` (containerd, its shims, the kubelet) and
//!   `/ferrolb-lab/<node>/pods` (the kubelet's cgroup root), so kubelets never clean up each
//!   other's pods, and `down` stops exactly the processes in them.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::Api;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::*;
use crate::cluster;
use crate::cmd::run;
use crate::pki::Pki;
use crate::topology::{Host, Role, Topology};

/// The sandbox image every pod starts with, built by `e2e/install-deps` from Kubernetes' own
/// `build/pause` source (`$FERROLB_BIN/pause.oci.tar`).
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause";
/// Its tag.
pub const PAUSE_TAG: &str = "3.10.2";
/// The cgroup under which every kubelet node has its own.
const CGROUP_PARENT: &str = "ferrolb-lab";
/// containerd's CRI namespace: images the kubelet can use must be there.
const CRI_NAMESPACE: &str = "k8s.io";
/// The kernel settings the kubelet checks and would otherwise set for the whole machine, with the
/// values it wants (its `setupKernelTunables`): in a node's mount namespace each is a file.
const KERNEL_TUNABLES: &[(&str, &str)] = &[
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];
/// Host-wide paths containerd, the CNI plugins and the kubelet hard-code, bound to the node's own
/// directory inside its mount namespace (source under the node directory, target).
const PRIVATE_PATHS: &[(&str, &str)] = &[
    ("run-containerd", "/run/containerd"),
    ("var-lib-cni", "/var/lib/cni"),
    ("var-log-pods", "/var/log/pods"),
    ("var-log-containers", "/var/log/containers"),
    // The device plugin registry's socket, whatever --root-dir says: shared, three kubelets
    // each remove and bind the same kubelet.sock, and one that loses the race fails to start
    // ("bind: address already in use"; seen in a lab that never came up).
    (
        "var-lib-kubelet-device-plugins",
        "/var/lib/kubelet/device-plugins",
    ),
];

/// One kubelet node's paths.
#[derive(Clone, Debug)]
pub struct NodeRuntime {
    /// The node's name.
    pub node: String,
    /// Its network namespace.
    pub netns: String,
    /// Its directory.
    pub dir: PathBuf,
}

impl NodeRuntime {
    /// The paths of `node` in the lab at `lab_dir`.
    pub fn new(lab_dir: &Path, host: &Host) -> Self {
        Self {
            node: host.name.clone(),
            netns: host.netns.clone(),
            dir: lab_dir.join("nodes").join(&host.name),
        }
    }

    /// The file the node's mount namespace is bound to.
    pub fn mount_ns(&self) -> PathBuf {
        self.dir.join("mnt")
    }

    /// containerd's socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    /// The node's cgroup below the hierarchy's root (`ferrolb-lab/node1`).
    pub fn cgroup(&self) -> String {
        format!("{CGROUP_PARENT}/{}", self.node)
    }

    /// The command that runs `program args` as part of this node: a shell moves itself into the
    /// node's runtime cgroup (in every hierarchy), then execs `nsenter` into the node's mount and
    /// network namespaces, which execs the program. Every exec keeps the PID, so the lab records
    /// the program's own; and `e2e/lab restart` of the same command lands in the same cgroup, so
    /// whatever the program starts (containerd's shims) stays where `down` finds it.
    fn command(&self, nsenter: &Path, program: &Path, args: &[String]) -> (PathBuf, Vec<String>) {
        let procs: Vec<String> = cgroup_hierarchies()
            .iter()
            .map(|h| {
                quote(
                    &h.join(format!("{}/runtime/cgroup.procs", self.cgroup()))
                        .display()
                        .to_string(),
                )
            })
            .collect();
        let mut script = String::from("set -e; ");
        for file in procs {
            script.push_str(&format!("echo $$ > {file}; "));
        }
        script.push_str("exec ");
        let words = [
            nsenter.display().to_string(),
            format!("--mount={}", self.mount_ns().display()),
            format!("--net=/run/netns/{}", self.netns),
            "--".into(),
            program.display().to_string(),
        ];
        let line: Vec<String> = words.iter().chain(args).map(|w| quote(w)).collect();
        script.push_str(&line.join(" "));
        (PathBuf::from("/bin/sh"), vec!["-c".into(), script])
    }
}

/// `word` quoted for `sh`.
fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', "'\\''"))
}

/// containerd's configuration for one node.
pub fn containerd_config(rt: &NodeRuntime, bin: &Path) -> String {
    let d = rt.dir.display();
    let b = bin.display();
    format!(
        r#"# Written by the ferrolb lab for {node}: everything under its own directory.
version = 3
root = '{d}/containerd/root'
state = '{d}/containerd/state'
# One NRI socket per machine (/var/run/nri); the CRI runs without it.
disabled_plugins = ['io.containerd.nri.v1.nri']
[grpc]
  address = '{d}/containerd.sock'
[ttrpc]
  address = '{d}/containerd.sock.ttrpc'
[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  # Imported, never pulled: pinned so image garbage collection never removes it.
  pinned_images = {{ sandbox = '{PAUSE_IMAGE}:{PAUSE_TAG}' }}
[plugins.'io.containerd.cri.v1.runtime']
  # Pod network namespaces under the node's state, not in /var/run/netns with the lab's own.
  netns_mounts_under_state_dir = true
  # Sandboxes and critical pods ask for a negative OOM score, which needs CAP_SYS_RESOURCE;
  # machines such as CI's sandboxes lack it (runc then fails every pod): never go below
  # containerd's own score.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = '{b}/runc'
        Root = '{d}/runc'
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['{cni}']
    conf_dir = '{d}/cni/net.d'
    max_conf_num = 1
    use_internal_loopback = true
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'
"#,
        node = rt.node,
        cni = CNI_BIN_DIR,
    )
}

/// Where Debian's containernetworking-plugins package puts the plugins.
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";

/// The CNI configuration of node `index`: a routed veth per pod (ptp) with an address from the
/// upper half of the node's pod CIDRs (the lab's own pods use the lower half), in the cluster's
/// families.
pub fn cni_config(t: &Topology, rt: &NodeRuntime, index: u8) -> String {
    // (family on, subnet, first, last, gateway, default route) per family.
    let families = [
        (
            t.options.families.v4(),
            format!("198.19.{index}.0/24"),
            format!("198.19.{index}.128"),
            format!("198.19.{index}.254"),
            format!("198.19.{index}.1"),
            "0.0.0.0/0",
        ),
        (
            t.options.families.v6(),
            format!("fd00:19:{index:x}::/64"),
            format!("fd00:19:{index:x}::1:0"),
            format!("fd00:19:{index:x}::1:ffff"),
            format!("fd00:19:{index:x}::1"),
            "::/0",
        ),
    ];
    let (mut ranges, mut routes) = (Vec::new(), Vec::new());
    for (on, subnet, start, end, gateway, default) in families {
        if on {
            ranges.push(serde_json::json!([{
                "subnet": subnet, "rangeStart": start, "rangeEnd": end, "gateway": gateway,
            }]));
            routes.push(serde_json::json!({"dst": default}));
        }
    }
    let conf = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": format!("flb-{}", rt.node),
        "plugins": [{
            "type": "ptp",
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "dataDir": format!("{}/cni/ipam", rt.dir.display()),
                "ranges": ranges,
                "routes": routes,
            },
        }],
    });
    serde_json::to_string_pretty(&conf).unwrap_or_default()
}

/// The kubelet's configuration for one node.
pub fn kubelet_config(rt: &NodeRuntime, pki: &Pki) -> String {
    let d = rt.dir.display();
    format!(
        r#"# Written by the ferrolb lab for {node}.
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine has cgroup v1; kubelet 1.35+ refuses it unless told (decision record 0022).
failCgroupV1: false
cgroupDriver: cgroupfs
# Its own cgroup root: a kubelet destroys pod cgroups it does not know under its root.
cgroupRoot: /{cgroup}/pods
containerRuntimeEndpoint: unix://{d}/containerd.sock
address: "::"
port: 10250
healthzBindAddress: 127.0.0.1
healthzPort: 10248
readOnlyPort: 0
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {ca}
authorization:
  mode: Webhook
volumePluginDir: {d}/volume-plugins
# Pods get no DNS configuration: the lab has no cluster DNS, and the machine's resolver is not
# the lab's to hand out.
resolvConf: ""
failSwapOn: false
# The kernel settings it checks are files in the node's mount namespace (see the module doc).
protectKernelDefaults: false
# Images are imported, never pulled: never collect or evict them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "0%"
  nodefs.inodesFree: "0%"
  imagefs.available: "0%"
"#,
        node = rt.node,
        cgroup = rt.cgroup(),
        ca = pki.path("ca.crt").display(),
    )
}

/// The node's addresses in the cluster's families, primary first (the kubelet's `--node-ip`).
fn node_ips(t: &Topology, host: &Host) -> Vec<IpAddr> {
    let mut ips = Vec::new();
    let iface = &host.interfaces[0];
    if t.options.families == crate::topology::Families::V6 {
        ips.push(IpAddr::V6(iface.ipv6));
    } else {
        ips.push(IpAddr::V4(iface.ipv4));
        if t.options.families.v6() {
            ips.push(IpAddr::V6(iface.ipv6));
        }
    }
    ips
}

/// The cgroup hierarchies mounted under /sys/fs/cgroup: every v1 controller's (and the v1
/// `name=systemd` one, and cgroup v2's `unified`), or the v2 root itself.
fn cgroup_hierarchies() -> Vec<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    if root.join("cgroup.controllers").exists() {
        return vec![root.to_path_buf()];
    }
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        // Symlinks (cpu,cpuacct -> cpu) name the same hierarchy twice.
        .filter(|p| !p.is_symlink() && p.join("cgroup.procs").exists())
        .collect();
    out.sort();
    out
}

/// Creates `rel` (and its parents) in every hierarchy; a new v1 cpuset cgroup starts with no
/// CPUs or memory nodes, so it gets its parent's.
fn make_cgroup(rel: &str) -> anyhow::Result<()> {
    for h in cgroup_hierarchies() {
        let mut path = h.clone();
        for part in rel.split('/') {
            let parent = path.clone();
            path.push(part);
            if path.exists() {
                continue;
            }
            std::fs::create_dir(&path).with_context(|| format!("creating {}", path.display()))?;
            for file in ["cpuset.cpus", "cpuset.mems"] {
                if let Ok(value) = std::fs::read_to_string(parent.join(file)) {
                    std::fs::write(path.join(file), value.trim())
                        .with_context(|| format!("writing {}", path.join(file).display()))?;
                }
            }
        }
    }
    if let [root] = &cgroup_hierarchies()[..]
        && root.join("cgroup.controllers").exists()
    {
        // cgroup v2: enable the controllers from the root down to the node's cgroup (not into
        // its leaves, which hold processes).
        let controllers =
            std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
        let enable: String = controllers
            .split_whitespace()
            .map(|c| format!("+{c} "))
            .collect();
        let mut path = root.clone();
        let parts: Vec<&str> = rel.split('/').collect();
        for part in &parts[..parts.len().saturating_sub(1)] {
            let _ = std::fs::write(path.join("cgroup.subtree_control"), enable.trim());
            path.push(part);
        }
        let _ = std::fs::write(path.join("cgroup.subtree_control"), enable.trim());
    }
    Ok(())
}

/// Every process in cgroup `rel` and below (read from one hierarchy: the v1 `pids` one, or v2's).
fn cgroup_pids(rel: &str) -> Vec<i32> {
    let hierarchies = cgroup_hierarchies();
    let Some(h) = hierarchies
        .iter()
        .find(|h| h.ends_with("pids"))
        .or(hierarchies.first())
    else {
        return Vec::new();
    };
    let mut pids = Vec::new();
    let mut stack = vec![h.join(rel)];
    while let Some(dir) = stack.pop() {
        if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
        }
        if let Ok(entries) = std::fs::read_dir(&dir) {
            stack.extend(
                entries
                    .filter_map(|e| e.ok())
                    .map(|e| e.path())
                    .filter(|p| p.is_dir()),
            );
        }
    }
    pids
}

/// Removes cgroup `rel` and everything below it in every hierarchy, deepest first.
fn remove_cgroup(rel: &str) {
    for h in cgroup_hierarchies() {
        let top = h.join(rel);
        let mut dirs = Vec::new();
        let mut stack = vec![top];
        while let Some(dir) = stack.pop() {
            if !dir.is_dir() {
                continue;
            }
            if let Ok(entries) = std::fs::read_dir(&dir) {
                stack.extend(
                    entries
                        .filter_map(|e| e.ok())
                        .map(|e| e.path())
                        .filter(|p| p.is_dir()),
                );
            }
            dirs.push(dir);
        }
        for dir in dirs.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
        // The shared parent goes with the last node.
        let _ = std::fs::remove_dir(h.join(CGROUP_PARENT));
    }
}

impl Lab {
    /// Brings up containerd and the kubelet on every node, imports the pause image, and waits
    /// until every node is Ready.
    pub(super) async fn build_kubelet_nodes(
        &self,
        state: &mut State,
        pki: &Pki,
        client: &Client,
    ) -> anyhow::Result<()> {
        let bin = bin_dir();
        let nsenter = node_tools(&bin)?;
        let started = Instant::now();
        self.prepare_node_mounts(state)?;
        self.start_containerds(state, &bin, &nsenter)?;
        self.start_kubelets(state, pki, &bin, &nsenter).await?;
        wait_nodes_ready(state, client).await?;
        eprintln!("lab: kubelet nodes Ready ({:.1?})", started.elapsed());
        let oci = super::images::build()?;
        self.import_images(&oci)?;
        eprintln!(
            "lab: ferrolb's images built and imported into every node ({:.1?})",
            started.elapsed()
        );
        Ok(())
    }

    /// The nodes' directory as a private mount, and the mount points of the nodes' private
    /// paths.
    fn prepare_node_mounts(&self, state: &mut State) -> anyhow::Result<()> {
        // `unshare --mount=FILE` binds the node's new mount namespace onto FILE, which the kernel
        // refuses on a shared mount (systemd makes / shared): the nodes' directory becomes a
        // private mount of its own, as `ip netns` does for /run/netns. `down` unmounts it.
        let nodes_dir = self.dir.join("nodes");
        std::fs::create_dir_all(&nodes_dir)?;
        if !is_mount_point(&nodes_dir) {
            let d = nodes_dir.display().to_string();
            run("mount", &["--bind", &d, &d])?;
        }
        run(
            "mount",
            &["--make-private", &nodes_dir.display().to_string()],
        )?;
        // The mount points of the nodes' private paths must exist on the host; the ones made here
        // are recorded and removed by `down`.
        for (_, target) in PRIVATE_PATHS {
            // Every directory made (parents first), so that `down` removes them all.
            let missing: Vec<&Path> = Path::new(target)
                .ancestors()
                .take_while(|d| !d.exists())
                .collect();
            if !missing.is_empty() {
                std::fs::create_dir_all(target)
                    .with_context(|| format!("creating the mount point {target}"))?;
                for dir in missing.iter().rev() {
                    state.host_dirs.push(dir.display().to_string());
                }
                state.save(&self.dir)?;
            }
        }
        Ok(())
    }

    /// Each node's runtime directory, then its containerd.
    fn start_containerds(
        &self,
        state: &mut State,
        bin: &Path,
        nsenter: &Path,
    ) -> anyhow::Result<()> {
        let t = &self.topology;
        for host in t.nodes() {
            let Role::Node { index, .. } = host.role else {
                continue;
            };
            let rt = NodeRuntime::new(&self.dir, host);
            state.kubelet_nodes.push(rt.node.clone());
            state.save(&self.dir)?;
            self.prepare_node(&rt, t, index)?;
            let (program, args) = rt.command(
                nsenter,
                &bin.join("containerd"),
                &[format!(
                    "--config={}",
                    rt.dir.join("containerd.toml").display()
                )],
            );
            self.spawn(
                state,
                &format!("containerd@{}", rt.node),
                None,
                &program,
                args,
            )?;
        }
        Ok(())
    }

    /// Once its containerd answers: each node's pause image, credentials, and kubelet.
    async fn start_kubelets(
        &self,
        state: &mut State,
        pki: &Pki,
        bin: &Path,
        nsenter: &Path,
    ) -> anyhow::Result<()> {
        let t = &self.topology;
        for node in &state.kubelet_nodes.clone() {
            let host = t.host(node).context("kubelet node not in the topology")?;
            let rt = NodeRuntime::new(&self.dir, host);
            let socket = rt.socket();
            cluster::wait_for(
                &format!("containerd on {node} to answer"),
                Duration::from_secs(60),
                || {
                    let ready = socket.exists() && ctr(&rt, &["version"]).is_ok();
                    async move { Ok(ready.then_some(())) }
                },
            )
            .await?;
            import_image(&rt, &bin.join("pause.oci.tar"), PAUSE_IMAGE)?;
            let kubeconfig = pki.issue_node(node)?;
            std::fs::write(rt.dir.join("kubelet.yaml"), kubelet_config(&rt, pki))?;
            let ips: Vec<String> = node_ips(t, host).iter().map(ToString::to_string).collect();
            let (program, args) = rt.command(
                nsenter,
                &bin.join("kubelet"),
                &[
                    format!("--config={}", rt.dir.join("kubelet.yaml").display()),
                    format!("--kubeconfig={}", kubeconfig.display()),
                    format!("--hostname-override={node}"),
                    format!("--node-ip={}", ips.join(",")),
                    format!("--root-dir={}", rt.dir.join("kubelet").display()),
                    format!("--cert-dir={}", rt.dir.join("kubelet/pki").display()),
                    "--v=1".into(),
                ],
            );
            self.spawn(state, &format!("kubelet@{node}"), None, &program, args)?;
        }
        Ok(())
    }

    /// The node's directory, cgroups, mount namespace and configuration files.
    fn prepare_node(&self, rt: &NodeRuntime, t: &Topology, index: u8) -> anyhow::Result<()> {
        if is_mount_point(&rt.mount_ns()) {
            bail!(
                "{} is still mounted (an earlier lab's {} was not taken down): run e2e/lab down",
                rt.mount_ns().display(),
                rt.node
            );
        }
        let _ = std::fs::remove_dir_all(&rt.dir);
        for sub in ["cni/net.d", "cni/ipam", "kubelet/pki", "sysctl"] {
            std::fs::create_dir_all(rt.dir.join(sub))?;
        }
        make_cgroup(&format!("{}/runtime", rt.cgroup()))?;
        make_cgroup(&format!("{}/pods", rt.cgroup()))?;
        std::fs::write(
            rt.dir.join("containerd.toml"),
            containerd_config(rt, &bin_dir()),
        )?;
        std::fs::write(
            rt.dir.join("cni/net.d/10-flb.conflist"),
            cni_config(t, rt, index),
        )?;
        // The mount namespace, kept alive by a bind mount of it on a file in the node's directory
        // (`unshare --mount=FILE`); set up once here, entered by containerd and the kubelet.
        let mut script = String::from("set -e\n");
        for (source, target) in PRIVATE_PATHS {
            let source = rt.dir.join(source);
            std::fs::create_dir_all(&source)?;
            script.push_str(&format!(
                "mount --bind {} {}\n",
                quote(&source.display().to_string()),
                quote(target)
            ));
        }
        for (key, value) in KERNEL_TUNABLES {
            let file = rt.dir.join("sysctl").join(key.replace('/', "."));
            std::fs::write(&file, format!("{value}\n"))?;
            script.push_str(&format!(
                "mount --bind {} {}\n",
                quote(&file.display().to_string()),
                quote(&format!("/proc/sys/{key}"))
            ));
        }
        std::fs::write(rt.mount_ns(), "")?;
        run(
            "nsenter",
            &[
                &format!("--net=/run/netns/{}", rt.netns),
                "unshare",
                &format!("--mount={}", rt.mount_ns().display()),
                "--propagation",
                "private",
                "sh",
                "-c",
                &script,
            ],
        )
        .with_context(|| format!("making {}'s mount namespace", rt.node))?;
        Ok(())
    }
}

/// Whether `path` is a mount point in this mount namespace.
pub(super) fn is_mount_point(path: &Path) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|info| {
        info.lines()
            .any(|l| l.split_whitespace().nth(4) == Some(&*path.to_string_lossy()))
    })
}

/// The first `program` in `$PATH`.
fn on_path(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// Runs `ctr` against the node's containerd, in its CRI namespace.
pub fn ctr(rt: &NodeRuntime, args: &[&str]) -> anyhow::Result<String> {
    let ctr = bin_dir().join("ctr");
    let socket = rt.socket().display().to_string();
    let mut full = vec!["--address", socket.as_str(), "--namespace", CRI_NAMESPACE];
    full.extend_from_slice(args);
    run(&ctr.display().to_string(), &full)
}

impl Lab {
    /// The host PID of a running container (`containerd://ID`, as a Pod's status names it) on
    /// kubelet node `node`: its task's PID in the node's containerd.
    pub fn container_pid(&self, node: &str, container_id: &str) -> anyhow::Result<i32> {
        let host = self
            .topology
            .host(node)
            .with_context(|| format!("no node {node:?}"))?;
        let rt = NodeRuntime::new(&self.dir, host);
        let id = container_id
            .strip_prefix("containerd://")
            .unwrap_or(container_id);
        let tasks = ctr(&rt, &["tasks", "ls"])?;
        tasks
            .lines()
            .filter_map(|l| {
                let mut cols = l.split_whitespace();
                Some((cols.next()?, cols.next()?, cols.next()?))
            })
            .find(|(task, _, status)| *task == id && *status == "RUNNING")
            .and_then(|(_, pid, _)| pid.parse().ok())
            .with_context(|| format!("no running task {id} on {node}: {tasks}"))
    }
}

/// Imports an OCI image archive (a tar of an image layout whose reference is a bare tag) into
/// the node's containerd as `base_name:tag`.
pub fn import_image(rt: &NodeRuntime, archive: &Path, base_name: &str) -> anyhow::Result<()> {
    ctr(
        rt,
        &[
            "images",
            "import",
            "--base-name",
            base_name,
            &archive.display().to_string(),
        ],
    )
    .with_context(|| format!("importing {} into {}", archive.display(), rt.node))?;
    Ok(())
}

/// Takes one kubelet node down: the kubelet first (so it starts nothing more), then every process
/// left in the node's cgroups (containers, containerd's shims, containerd), then its mount
/// namespace, cgroups and directory. Safe to run twice, and after a half-made node. Returns what
/// it could not remove: the lab's promise is that `down` leaves the machine as it found it.
pub(super) fn teardown_node(lab_dir: &Path, state: &State, node: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for p in state
        .processes
        .iter()
        .filter(|p| p.name == format!("kubelet@{node}"))
    {
        process::stop(p, Duration::from_secs(5));
    }
    let cgroup = format!("{CGROUP_PARENT}/{node}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pids = cgroup_pids(&cgroup);
        if pids.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            problems.push(format!("processes {pids:?} in cgroup {cgroup} did not end"));
            break;
        }
        for pid in pids {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for p in state
        .processes
        .iter()
        .filter(|p| p.name == format!("containerd@{node}"))
    {
        process::stop(p, Duration::from_secs(5));
    }
    let dir = lab_dir.join("nodes").join(node);
    let mnt = dir.join("mnt");
    if is_mount_point(&mnt)
        && let Err(e) = run("umount", &[&mnt.display().to_string()])
    {
        problems.push(format!("{node}'s mount namespace: {e:#}"));
    }
    remove_cgroup(&cgroup);
    for h in cgroup_hierarchies() {
        if h.join(&cgroup).exists() {
            problems.push(format!(
                "cgroup {} is still there",
                h.join(&cgroup).display()
            ));
        }
    }
    if let Err(e) = std::fs::remove_dir_all(&dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        problems.push(format!("removing {}: {e}", dir.display()));
    }
    problems
}

/// The programs and CNI plugins the kubelet nodes need, all installed: the path of nsenter.
fn node_tools(bin: &Path) -> anyhow::Result<PathBuf> {
    for program in [
        "containerd",
        "containerd-shim-runc-v2",
        "runc",
        "ctr",
        "kubelet",
    ] {
        if !bin.join(program).exists() {
            bail!(
                "{} is missing: run e2e/install-deps first",
                bin.join(program).display()
            );
        }
    }
    for plugin in ["ptp", "host-local"] {
        if !Path::new(CNI_BIN_DIR).join(plugin).exists() {
            bail!("the CNI plugin {CNI_BIN_DIR}/{plugin} is missing: run e2e/install-deps first");
        }
    }
    on_path("nsenter").context("nsenter (util-linux) is not on PATH")
}

/// Waits until the kubelet of every kubelet node reports its Node Ready.
async fn wait_nodes_ready(state: &State, client: &Client) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    for node in &state.kubelet_nodes {
        let nodes = nodes.clone();
        cluster::wait_for(
            &format!("the kubelet on {node} to report its Node Ready"),
            Duration::from_secs(120),
            || {
                let nodes = nodes.clone();
                async move {
                    let n = nodes.get_opt(node).await.map_err(|e| e.to_string())?;
                    let ready = n
                        .as_ref()
                        .and_then(|n| n.status.as_ref())
                        .and_then(|s| s.conditions.as_ref())
                        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
                    match ready {
                        Some(c) if c.status == "True" => Ok(Some(())),
                        Some(c) => Err(format!(
                            "Ready={}: {}",
                            c.status,
                            c.message.clone().unwrap_or_default()
                        )),
                        None => Err("no Ready condition yet".into()),
                    }
                }
            },
        )
        .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::topology::{Families, Options};

    fn node1(families: Families) -> (Topology, NodeRuntime) {
        let t = Topology::standard(Options {
            families,
            kubelet: true,
            ..Options::default()
        });
        let host = t.host("node1").cloned().expect("node1");
        let rt = NodeRuntime::new(Path::new("/run/ferrolb-lab"), &host);
        (t, rt)
    }

    #[test]
    fn cni_ranges_stay_in_the_upper_half_of_the_pod_cidr_for_each_family() {
        let (t, rt) = node1(Families::Dual);
        let conf: serde_json::Value =
            serde_json::from_str(&cni_config(&t, &rt, 1)).expect("valid JSON");
        let ranges = &conf["plugins"][0]["ipam"]["ranges"];
        assert_eq!(ranges[0][0]["rangeStart"], "198.19.1.128");
        assert_eq!(ranges[0][0]["rangeEnd"], "198.19.1.254");
        assert_eq!(ranges[1][0]["rangeStart"], "fd00:19:1::1:0");
        assert_eq!(conf["plugins"][0]["type"], "ptp");
        let (t, rt) = node1(Families::V6);
        let conf: serde_json::Value =
            serde_json::from_str(&cni_config(&t, &rt, 1)).expect("valid JSON");
        let ranges = conf["plugins"][0]["ipam"]["ranges"]
            .as_array()
            .expect("ranges");
        assert_eq!(ranges.len(), 1);
        assert_eq!(ranges[0][0]["subnet"], "fd00:19:1::/64");
    }

    #[test]
    fn the_node_command_keeps_every_argument_whole() {
        let (_, rt) = node1(Families::Dual);
        let (program, args) = rt.command(
            Path::new("/usr/bin/nsenter"),
            Path::new("/bin/kubelet"),
            &["--node-ip=198.18.0.11,fd00:18::b".into(), "it's".into()],
        );
        assert_eq!(program, Path::new("/bin/sh"));
        let script = &args[1];
        assert!(script.ends_with(
            "exec '/usr/bin/nsenter' '--mount=/run/ferrolb-lab/nodes/node1/mnt' \
             '--net=/run/netns/flb-node1' '--' '/bin/kubelet' '--node-ip=198.18.0.11,fd00:18::b' 'it'\\''s'"
        ), "{script}");
        // What sh makes of it: the words as given.
        let out = std::process::Command::new("sh")
            .args(["-c", &format!("printf '%s|' {}", quote("it's a \"test\""))])
            .output()
            .expect("sh");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "it's a \"test\"|");
    }

    #[test]
    fn kubelet_config_has_the_node_own_cgroup_root_and_accepts_cgroup_v1() {
        let (_, rt) = node1(Families::Dual);
        let pki = Pki {
            dir: PathBuf::from("/run/ferrolb-lab/pki"),
        };
        let yaml = kubelet_config(&rt, &pki);
        for line in [
            "failCgroupV1: false",
            "cgroupRoot: /ferrolb-lab/node1/pods",
            "containerRuntimeEndpoint: unix:///run/ferrolb-lab/nodes/node1/containerd.sock",
            "resolvConf: \"\"",
            "imageGCHighThresholdPercent: 100",
        ] {
            assert!(
                yaml.lines().any(|l| l.trim() == line),
                "{line} missing:\n{yaml}"
            );
        }
    }

    #[test]
    fn every_node_path_is_its_own() {
        let (t, rt1) = node1(Families::Dual);
        let rt2 = NodeRuntime::new(
            Path::new("/run/ferrolb-lab"),
            t.host("node2").expect("node2"),
        );
        let bin = Path::new("/bin");
        let (c1, c2) = (containerd_config(&rt1, bin), containerd_config(&rt2, bin));
        for key in ["root =", "state =", "address =", "Root =", "conf_dir ="] {
            let line = |c: &str| {
                c.lines()
                    .find(|l| l.trim_start().starts_with(key))
                    .map(str::to_string)
            };
            assert!(line(&c1).is_some(), "{key} missing");
            assert_ne!(line(&c1), line(&c2), "{key} shared between nodes");
        }
        assert_ne!(rt1.cgroup(), rt2.cgroup());
        assert_eq!(node_ips(&t, t.host("node1").expect("node1")).len(), 2);
    }
}
