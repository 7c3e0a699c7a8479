//! Bringing the lab up and down, and everything a test does in it. `up` is idempotent; `down`
//! removes every namespace, link, route and process the lab recorded (by name and PID), and also
//! cleans up after an `up` that failed half-way.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::Client;
use kube::api::{Api, DeleteParams};
use serde::{Deserialize, Serialize};

use crate::cluster;
use crate::cmd::{ip_in, output_in, run, run_in, sysctl_in};
use crate::pki::Pki;
use crate::process::{self, LabProcess};
use crate::router;
use crate::topology::{LAB_RANGE_V4, LAB_RANGE_V6, Options, Role, Topology};

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
    /// The echo server (absent while the pod is being made).
    pub process: Option<LabProcess>,
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
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

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

    fn spawn(
        &self,
        state: &mut State,
        name: &str,
        netns: Option<&str>,
        program: &Path,
        args: Vec<String>,
    ) -> anyhow::Result<LabProcess> {
        if !program.exists() {
            bail!(
                "{} is missing: run e2e/install-deps first",
                program.display()
            );
        }
        let p = process::spawn(
            &self.lab_exe,
            name,
            netns,
            &program.display().to_string(),
            &args,
            &log_path(&self.dir, name),
        )?;
        state.processes.push(p.clone());
        state.save(&self.dir)?;
        Ok(p)
    }

    async fn build(&self, state: &mut State) -> anyhow::Result<()> {
        let t = &self.topology;
        let started = Instant::now();
        self.build_network(state)?;
        eprintln!("lab: network ready ({:.1?})", started.elapsed());

        let cp = t.apiserver_address();
        let server = format!("https://{cp}:6443");
        let mut server_ips: Vec<std::net::IpAddr> = t
            .host("cp")
            .map(|h| vec![h.interfaces[0].ipv4.into(), h.interfaces[0].ipv6.into()])
            .unwrap_or_default();
        server_ips.extend(t.kubernetes_service_ips());
        let pki = Pki::ensure(&self.dir.join("pki"), &server, &server_ips)?;
        let bin = bin_dir();

        let etcd_dir = self.dir.join("etcd");
        let _ = std::fs::remove_dir_all(&etcd_dir);
        self.spawn(
            state,
            "etcd",
            Some("flb-cp"),
            &bin.join("etcd"),
            vec![
                format!("--data-dir={}", etcd_dir.display()),
                "--listen-client-urls=http://127.0.0.1:2379".into(),
                "--advertise-client-urls=http://127.0.0.1:2379".into(),
                "--listen-peer-urls=http://127.0.0.1:2380".into(),
                "--initial-advertise-peer-urls=http://127.0.0.1:2380".into(),
                "--initial-cluster=default=http://127.0.0.1:2380".into(),
                "--unsafe-no-fsync".into(),
                "--log-level=warn".into(),
            ],
        )?;
        cluster::wait_for(
            "etcd to answer /health",
            Duration::from_secs(30),
            || async {
                match output_in("flb-cp", "curl", &["-sf", "http://127.0.0.1:2379/health"]) {
                    Ok(o) if o.status.success() => Ok(Some(())),
                    Ok(o) => Err(format!("curl exit {}", o.status)),
                    Err(e) => Err(e.to_string()),
                }
            },
        )
        .await?;

        let v6_primary = t.options.families == crate::topology::Families::V6;
        let advertise = if v6_primary {
            t.host("cp")
                .map(|h| h.interfaces[0].ipv6.to_string())
                .unwrap_or_default()
        } else {
            cp.to_string()
        };
        let p = |f: &str| pki.path(f).display().to_string();
        self.spawn(
            state,
            "kube-apiserver",
            Some("flb-cp"),
            &bin.join("kube-apiserver"),
            vec![
                "--etcd-servers=http://127.0.0.1:2379".into(),
                "--bind-address=::".into(),
                "--secure-port=6443".into(),
                format!("--advertise-address={advertise}"),
                format!("--tls-cert-file={}", p("apiserver.crt")),
                format!("--tls-private-key-file={}", p("apiserver.key")),
                format!("--client-ca-file={}", p("ca.crt")),
                format!("--service-account-key-file={}", p("sa.pub")),
                format!("--service-account-signing-key-file={}", p("sa.key")),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
                format!("--service-cluster-ip-range={}", t.service_cidrs.join(",")),
                "--authorization-mode=RBAC".into(),
                "--profiling=false".into(),
                "--v=1".into(),
            ],
        )?;
        let admin = pki.kubeconfig("admin");
        let client = cluster::wait_for(
            "kube-apiserver to serve requests",
            Duration::from_secs(90),
            || {
                let admin = admin.clone();
                async move {
                    let client = cluster::client_from(&admin)
                        .await
                        .map_err(|e| e.to_string())?;
                    // Components need the bootstrap RBAC policy, which the server writes after it
                    // starts answering: wait for its last piece that kube-controller-manager reads.
                    let ns: Api<Namespace> = Api::all(client.clone());
                    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), "kube-system");
                    match (
                        ns.get("default").await,
                        bindings
                            .get_opt("system::extension-apiserver-authentication-reader")
                            .await,
                    ) {
                        (Ok(_), Ok(Some(_))) => Ok(Some(client)),
                        (Err(e), _) | (_, Err(e)) => Err(e.to_string()),
                        (_, Ok(None)) => Err("bootstrap RBAC policy not written yet".into()),
                    }
                }
            },
        )
        .await?;
        eprintln!("lab: kube-apiserver ready ({:.1?})", started.elapsed());

        let kcm = pki
            .kubeconfig("kube-controller-manager")
            .display()
            .to_string();
        self.spawn(
            state,
            "kube-controller-manager",
            Some("flb-cp"),
            &bin.join("kube-controller-manager"),
            vec![
                format!("--kubeconfig={kcm}"),
                format!("--authentication-kubeconfig={kcm}"),
                format!("--authorization-kubeconfig={kcm}"),
                "--leader-elect=false".into(),
                "--bind-address=127.0.0.1".into(),
                "--use-service-account-credentials=true".into(),
                format!("--service-account-private-key-file={}", p("sa.key")),
                format!("--root-ca-file={}", p("ca.crt")),
                "--v=1".into(),
            ],
        )?;
        cluster::register_nodes(&client, t).await?;
        self.spawn(
            state,
            "node-agent",
            None,
            &self.lab_exe,
            vec!["agent".into()],
        )?;

        for node in t.nodes() {
            let config = self.dir.join(format!("kube-proxy-{}.yaml", node.name));
            std::fs::write(&config, self.kube_proxy_config(&pki, &node.name))?;
            self.spawn(
                state,
                &format!("kube-proxy-{}", node.name),
                Some(&node.netns),
                &bin.join("kube-proxy"),
                vec![format!("--config={}", config.display()), "--v=1".into()],
            )?;
        }

        let frr_dir = self.dir.join("frr");
        std::fs::create_dir_all(&frr_dir)?;
        std::fs::write(frr_dir.join("zebra.conf"), router::zebra_config())?;
        std::fs::write(frr_dir.join("bgpd.conf"), router::frr_config(t))?;
        // FRR drops privileges to its own user, which must own its path space.
        run("chown", &["-R", "frr:frr", &frr_dir.display().to_string()])?;
        for daemon in ["zebra", "bgpd"] {
            let args = router::daemon_args(daemon, &frr_dir);
            self.spawn(
                state,
                &format!("frr-{daemon}"),
                Some("flb-router"),
                &Path::new(router::FRR_DIR).join(daemon),
                args,
            )?;
            if daemon == "zebra" {
                let api = frr_dir.join("zserv.api");
                cluster::wait_for("zebra's zserv socket", Duration::from_secs(20), || {
                    let ready = api.exists();
                    async move {
                        if ready {
                            Ok(Some(()))
                        } else {
                            Err("no socket yet".into())
                        }
                    }
                })
                .await?;
            }
        }

        // kube-controller-manager is serving once it has created the default ServiceAccount.
        let sa: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
        cluster::wait_for(
            "kube-controller-manager to create ServiceAccount default/default",
            Duration::from_secs(60),
            || {
                let sa = sa.clone();
                async move {
                    sa.get_opt("default")
                        .await
                        .map_err(|e| e.to_string())
                        .map(|o| o.map(|_| ()))
                }
            },
        )
        .await?;
        for node in t.nodes() {
            let netns = node.netns.clone();
            let mode = t.options.proxy_mode;
            cluster::wait_for(
                &format!("kube-proxy on {} to program its rules", node.name),
                Duration::from_secs(60),
                || {
                    let netns = netns.clone();
                    async move { kube_proxy_programmed(&netns, mode).map(|ok| ok.then_some(())) }
                },
            )
            .await?;
        }
        eprintln!("lab: up in {:.1?}", started.elapsed());
        Ok(())
    }

    fn kube_proxy_config(&self, pki: &Pki, node: &str) -> String {
        let t = &self.topology;
        format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclientConnection:\n  kubeconfig: {}\nhostnameOverride: {node}\nmode: {}\nclusterCIDR: {}\nconntrack:\n  maxPerCore: 0\n  min: 0\nmetricsBindAddress: 127.0.0.1:10249\nhealthzBindAddress: 0.0.0.0:10256\n",
            pki.kubeconfig("kube-proxy").display(),
            t.options.proxy_mode.as_str(),
            t.cluster_cidrs.join(","),
        )
    }

    fn build_network(&self, state: &mut State) -> anyhow::Result<()> {
        let t = &self.topology;
        // The host never routes lab addresses anywhere but the lab bridge.
        for (family, range) in [("-4", LAB_RANGE_V4), ("-6", LAB_RANGE_V6)] {
            let args = s(&[family, "route", "replace", "unreachable", range]);
            run("ip", &args.iter().map(String::as_str).collect::<Vec<_>>())?;
            state
                .host_routes
                .push(s(&[family, "route", "del", "unreachable", range]));
        }
        state.save(&self.dir)?;
        for seg in &t.segments {
            let Some(br) = &seg.host_bridge else { continue };
            run(
                "ip",
                &[
                    "link",
                    "add",
                    &br.name,
                    "type",
                    "bridge",
                    "mcast_snooping",
                    "0",
                ],
            )?;
            state.host_links.push(br.name.clone());
            state.save(&self.dir)?;
            let prefix4 = seg.ipv4.split('/').nth(1).unwrap_or("16");
            let prefix6 = seg.ipv6.split('/').nth(1).unwrap_or("64");
            run(
                "ip",
                &[
                    "addr",
                    "add",
                    &format!("{}/{prefix4}", br.ipv4),
                    "dev",
                    &br.name,
                ],
            )?;
            run(
                "ip",
                &[
                    "addr",
                    "add",
                    &format!("{}/{prefix6}", br.ipv6),
                    "dev",
                    &br.name,
                    "nodad",
                ],
            )?;
            run("ip", &["link", "set", &br.name, "up"])?;
        }
        for host in &t.hosts {
            run("ip", &["netns", "add", &host.netns])?;
            state.netns.push(host.netns.clone());
            state.save(&self.dir)?;
            ip_in(&host.netns, &["link", "set", "lo", "up"])?;
            sysctl_in(&host.netns, "net.ipv6.conf.all.accept_dad", "0")?;
            sysctl_in(&host.netns, "net.ipv6.conf.default.accept_dad", "0")?;
            let fwd = if host.forwarding { "1" } else { "0" };
            sysctl_in(&host.netns, "net.ipv4.ip_forward", fwd)?;
            sysctl_in(&host.netns, "net.ipv6.conf.all.forwarding", fwd)?;
        }
        // The external segment has two members: a veth pair joins them directly.
        let mut external_peer: Option<(String, String)> = None;
        for host in &t.hosts {
            for iface in &host.interfaces {
                let seg = t.segments.iter().find(|s| s.name == iface.segment);
                match seg.and_then(|s| s.host_bridge.as_ref()) {
                    Some(br) => {
                        let outside = format!("flb-{}", host.name);
                        run(
                            "ip",
                            &[
                                "link",
                                "add",
                                &outside,
                                "type",
                                "veth",
                                "peer",
                                "name",
                                &iface.name,
                                "netns",
                                &host.netns,
                            ],
                        )?;
                        run("ip", &["link", "set", &outside, "master", &br.name, "up"])?;
                    }
                    None => match external_peer.take() {
                        None => external_peer = Some((host.netns.clone(), iface.name.clone())),
                        Some((peer_ns, peer_if)) => {
                            run(
                                "ip",
                                &[
                                    "link",
                                    "add",
                                    "flb-tmp-a",
                                    "netns",
                                    &peer_ns,
                                    "type",
                                    "veth",
                                    "peer",
                                    "name",
                                    "flb-tmp-b",
                                    "netns",
                                    &host.netns,
                                ],
                            )?;
                            ip_in(&peer_ns, &["link", "set", "flb-tmp-a", "name", &peer_if])?;
                            ip_in(
                                &host.netns,
                                &["link", "set", "flb-tmp-b", "name", &iface.name],
                            )?;
                            for (ns, name) in [
                                (peer_ns.as_str(), peer_if.as_str()),
                                (host.netns.as_str(), iface.name.as_str()),
                            ] {
                                ip_in(ns, &["link", "set", name, "up"])?;
                            }
                        }
                    },
                }
            }
        }
        for host in &t.hosts {
            for iface in &host.interfaces {
                let seg = t.segments.iter().find(|s| s.name == iface.segment);
                let prefix4 = seg.and_then(|s| s.ipv4.split('/').nth(1)).unwrap_or("24");
                let prefix6 = seg.and_then(|s| s.ipv6.split('/').nth(1)).unwrap_or("64");
                ip_in(
                    &host.netns,
                    &[
                        "addr",
                        "add",
                        &format!("{}/{prefix4}", iface.ipv4),
                        "dev",
                        &iface.name,
                    ],
                )?;
                ip_in(
                    &host.netns,
                    &[
                        "addr",
                        "add",
                        &format!("{}/{prefix6}", iface.ipv6),
                        "dev",
                        &iface.name,
                        "nodad",
                    ],
                )?;
                ip_in(&host.netns, &["link", "set", &iface.name, "up"])?;
            }
        }
        for host in &t.hosts {
            for route in &host.routes {
                ip_in(
                    &host.netns,
                    &["route", "replace", &route.to, "via", &route.via.to_string()],
                )?;
            }
            if let Role::Node { .. } = host.role {
                // Pods reach their node at these link-local addresses (see add_pod).
                sysctl_in(&host.netns, "net.ipv4.conf.all.rp_filter", "0")?;
            }
        }
        Ok(())
    }

    /// A kube client with the lab's admin credentials.
    pub async fn client(&self) -> anyhow::Result<Client> {
        cluster::client_from(&self.dir.join("pki/admin.kubeconfig")).await
    }

    /// Path of the admin kubeconfig.
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.join("pki/admin.kubeconfig")
    }

    /// Runs a command in a host of the lab and returns its output.
    pub fn exec(&self, host: &str, program: &str, args: &[&str]) -> anyhow::Result<String> {
        let netns = self.netns_of(host)?;
        run_in(&netns, program, args)
    }

    /// Runs a command in a host and returns its output whatever its exit status.
    pub fn exec_output(
        &self,
        host: &str,
        program: &str,
        args: &[&str],
    ) -> anyhow::Result<std::process::Output> {
        let netns = self.netns_of(host)?;
        output_in(&netns, program, args)
    }

    /// Cuts (`up == false`) or restores a host's link to the lab bridge, from the bridge side:
    /// the host sees its carrier go, as when a cable is pulled, and keeps its addresses and
    /// routes.
    pub fn set_link(&self, host: &str, up: bool) -> anyhow::Result<()> {
        let h = self
            .topology
            .host(host)
            .with_context(|| format!("no lab host {host}"))?;
        let outside = format!("flb-{}", h.name);
        run(
            "ip",
            &["link", "set", &outside, if up { "up" } else { "down" }],
        )
        .map(|_| ())
    }

    /// The MAC addresses that answer ARP (IPv4) or NDP (IPv6) for `ip` when `from` asks on its
    /// lab interface: three requests, every answer counted.
    pub fn l2_answers(&self, from: &str, ip: &str) -> anyhow::Result<BTreeSet<String>> {
        let mut macs = BTreeSet::new();
        if ip.contains(':') {
            // ndisc6 -m prints every advertisement: "Target link-layer address: 82:24:...".
            let out = self.exec_output(
                from,
                "ndisc6",
                &["-m", "-n", "-r", "3", "-w", "300", ip, "eth0"],
            )?;
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                if let Some(mac) = line.trim().strip_prefix("Target link-layer address:") {
                    macs.insert(mac.trim().to_ascii_lowercase());
                }
            }
        } else {
            // arping prints "60 bytes from 82:24:ad:bd:37:ba (198.18.200.0): index=0 ...".
            let out =
                self.exec_output(from, "arping", &["-c", "3", "-W", "0.3", "-i", "eth0", ip])?;
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                if let Some(rest) = line.split(" bytes from ").nth(1)
                    && let Some(mac) = rest.split_whitespace().next()
                {
                    macs.insert(mac.to_ascii_lowercase());
                }
            }
        }
        Ok(macs)
    }

    /// The network namespace of a host (hosts by short name, pods by their namespace name).
    pub fn netns_of(&self, host: &str) -> anyhow::Result<String> {
        if let Some(h) = self.topology.host(host) {
            return Ok(h.netns.clone());
        }
        if host.starts_with("flb-") {
            return Ok(host.to_string());
        }
        bail!(
            "no host {host:?} in the lab (hosts: {})",
            self.topology
                .hosts
                .iter()
                .map(|h| h.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
    }

    /// Creates a pod on `node`: a namespace with an echo server, routed through the node, and a
    /// Ready Pod object with these labels.
    pub async fn add_pod(
        &self,
        namespace: &str,
        name: &str,
        node: &str,
        labels: &BTreeMap<String, String>,
    ) -> anyhow::Result<LabPod> {
        let Some(host) = self.topology.host(node) else {
            bail!("no node {node:?}")
        };
        let Role::Node { index, .. } = host.role else {
            bail!("{node:?} is not a node")
        };
        let (netns, veth, host_number) = {
            let _guard = STATE_LOCK
                .lock()
                .map_err(|_| anyhow::anyhow!("state lock poisoned"))?;
            let mut state = State::load(&self.dir)?.context("the lab is not up")?;
            let used: Vec<u8> = state
                .pods
                .iter()
                .filter(|p| p.node == node)
                .map(|p| p.host_number)
                .collect();
            let host_number = (10..=250)
                .find(|n| !used.contains(n))
                .context("no pod address left on this node")?;
            let n = state.next_pod;
            state.next_pod += 1;
            // Recorded at once, so concurrent add_pod calls never share an address and `down`
            // removes the namespace even if this call fails half-way.
            state.pods.push(LabPod {
                namespace: namespace.into(),
                name: name.into(),
                node: node.into(),
                netns: format!("flb-pod{n}"),
                host_number,
                ips: Vec::new(),
                process: None,
            });
            state.save(&self.dir)?;
            (format!("flb-pod{n}"), format!("pv{n}"), host_number)
        };
        let fam = self.topology.options.families;
        let ip4 = format!("198.19.{index}.{host_number}");
        let ip6 = format!("fd00:19:{index:x}::{host_number:x}");
        let mut ips = Vec::new();
        if fam.v4() {
            ips.push(ip4.clone());
        }
        if fam.v6() {
            ips.push(ip6.clone());
        }
        run("ip", &["netns", "add", &netns])?;
        let result: anyhow::Result<LabPod> = async {
            ip_in(&netns, &["link", "set", "lo", "up"])?;
            sysctl_in(&netns, "net.ipv6.conf.all.accept_dad", "0")?;
            sysctl_in(&netns, "net.ipv6.conf.default.accept_dad", "0")?;
            run(
                "ip",
                &[
                    "link",
                    "add",
                    &veth,
                    "netns",
                    &host.netns,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "eth0",
                    "netns",
                    &netns,
                ],
            )?;
            // Routed pod networking: the node answers at 169.254.1.1 / fe80::1 on every pod link,
            // so all pod traffic crosses the node's IP stack (and kube-proxy's conntrack).
            ip_in(
                &host.netns,
                &["addr", "add", "169.254.1.1/32", "dev", &veth],
            )?;
            ip_in(
                &host.netns,
                &["addr", "add", "fe80::1/64", "dev", &veth, "nodad"],
            )?;
            ip_in(&host.netns, &["link", "set", &veth, "up"])?;
            ip_in(
                &host.netns,
                &["route", "replace", &format!("{ip4}/32"), "dev", &veth],
            )?;
            ip_in(
                &host.netns,
                &[
                    "-6",
                    "route",
                    "replace",
                    &format!("{ip6}/128"),
                    "dev",
                    &veth,
                ],
            )?;
            ip_in(
                &netns,
                &["addr", "add", &format!("{ip4}/32"), "dev", "eth0"],
            )?;
            ip_in(
                &netns,
                &["addr", "add", &format!("{ip6}/128"), "dev", "eth0", "nodad"],
            )?;
            ip_in(&netns, &["link", "set", "eth0", "up"])?;
            ip_in(
                &netns,
                &[
                    "route",
                    "add",
                    "169.254.1.1",
                    "dev",
                    "eth0",
                    "scope",
                    "link",
                ],
            )?;
            ip_in(
                &netns,
                &[
                    "route",
                    "add",
                    "default",
                    "via",
                    "169.254.1.1",
                    "dev",
                    "eth0",
                ],
            )?;
            ip_in(
                &netns,
                &[
                    "-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0",
                ],
            )?;
            let log = log_path(&self.dir, &format!("pod-{namespace}-{name}"));
            let process = process::spawn(
                &self.lab_exe,
                &format!("echo {namespace}/{name}"),
                Some(&netns),
                &self.lab_exe.display().to_string(),
                &s(&["echo", "--name", name]),
                &log,
            )?;
            Ok(LabPod {
                namespace: namespace.into(),
                name: name.into(),
                node: node.into(),
                netns: netns.clone(),
                host_number,
                ips: ips.clone(),
                process: Some(process),
            })
        }
        .await;
        let pod = match result {
            Ok(pod) => pod,
            Err(e) => {
                let _ = run("ip", &["netns", "del", &netns]);
                let _ = ip_in(&host.netns, &["link", "del", &veth]);
                self.forget_pod(&netns)?;
                return Err(e);
            }
        };
        {
            let _guard = STATE_LOCK
                .lock()
                .map_err(|_| anyhow::anyhow!("state lock poisoned"))?;
            let mut state = State::load(&self.dir)?.context("the lab is not up")?;
            if let Some(p) = state.pods.iter_mut().find(|p| p.netns == netns) {
                *p = pod.clone();
            }
            state.save(&self.dir)?;
        }
        let client = self.client().await?;
        let host_ip = host.interfaces[0].ipv4.to_string();
        cluster::create_pod(&client, namespace, name, node, &host_ip, labels, &ips).await?;
        Ok(pod)
    }

    /// Removes a pod: its Pod object, process, namespace and node route.
    pub async fn remove_pod(&self, pod: &LabPod) -> anyhow::Result<()> {
        let client = self.client().await?;
        let pods: Api<Pod> = Api::namespaced(client, &pod.namespace);
        let _ = pods
            .delete(
                &pod.name,
                &DeleteParams {
                    grace_period_seconds: Some(0),
                    ..Default::default()
                },
            )
            .await;
        remove_pod_local(pod);
        self.forget_pod(&pod.netns)
    }

    fn forget_pod(&self, netns: &str) -> anyhow::Result<()> {
        let _guard = STATE_LOCK
            .lock()
            .map_err(|_| anyhow::anyhow!("state lock poisoned"))?;
        if let Some(mut state) = State::load(&self.dir)? {
            state.pods.retain(|p| p.netns != netns);
            state.save(&self.dir)?;
        }
        Ok(())
    }
}

fn remove_pod_local(pod: &LabPod) {
    if let Some(p) = &pod.process {
        process::stop(p, Duration::from_secs(2));
    }
    // Deleting the namespace deletes the veth pair and with it the node's route.
    let _ = run("ip", &["netns", "del", &pod.netns]);
}

/// Whether kube-proxy has programmed its base rules in a node.
fn kube_proxy_programmed(netns: &str, mode: crate::topology::ProxyMode) -> Result<bool, String> {
    let out = match mode {
        crate::topology::ProxyMode::Iptables => {
            output_in(netns, "iptables", &["-t", "nat", "-S", "KUBE-SERVICES"])
        }
        crate::topology::ProxyMode::Nftables => {
            output_in(netns, "nft", &["list", "table", "ip", "kube-proxy"])
        }
    }
    .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(true)
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
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
    for p in state.processes.iter().rev() {
        process::stop(p, Duration::from_secs(5));
    }
    let mut problems = Vec::new();
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

impl Lab {
    /// Runs the lab's kubectl as admin; fails with kubectl's message.
    pub fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        let kubectl = bin_dir().join("kubectl");
        let kubeconfig = self.admin_kubeconfig().display().to_string();
        let mut full = vec!["--kubeconfig", kubeconfig.as_str()];
        full.extend_from_slice(args);
        run(&kubectl.display().to_string(), &full)
    }

    /// Applies a YAML text with kubectl (server-side, so repeated applies are idempotent).
    pub fn apply(&self, yaml: &str) -> anyhow::Result<()> {
        let file = self.dir.join(format!("apply-{}.yaml", std::process::id()));
        std::fs::write(&file, yaml)?;
        let result = self.kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &file.display().to_string(),
        ]);
        let _ = std::fs::remove_file(&file);
        result.map(|_| ())
    }

    /// Installs ferrolb's CRDs (from charts/ferrolb/crds) and waits until they are served.
    pub fn install_crds(&self) -> anyhow::Result<()> {
        let dir = repo_root().join("charts/ferrolb/crds");
        self.kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &dir.display().to_string(),
        ])?;
        self.kubectl(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd",
            "-l",
            "",
            "--all",
        ])
        .map(|_| ())
    }

    /// A kubeconfig file for a ServiceAccount, with a fresh token (TokenRequest, 24 h).
    pub fn service_account_kubeconfig(
        &self,
        namespace: &str,
        account: &str,
    ) -> anyhow::Result<PathBuf> {
        let token = self.kubectl(&[
            "create",
            "token",
            account,
            "-n",
            namespace,
            "--duration=24h",
        ])?;
        let pki = Pki {
            dir: self.dir.join("pki"),
        };
        let server = format!("https://{}:6443", self.topology.apiserver_address());
        let path = self.dir.join(format!("{namespace}-{account}.kubeconfig"));
        std::fs::write(&path, pki.token_kubeconfig(&server, account, token.trim()))?;
        Ok(path)
    }
}

impl Lab {
    /// Records a process the lab did not start itself (e.g. the demo's controller), so `down`
    /// stops it. A recorded process of the same name that no longer runs is forgotten: the new
    /// one takes its place.
    pub fn track_process(&self, process: LabProcess) -> anyhow::Result<()> {
        let _guard = STATE_LOCK
            .lock()
            .map_err(|_| anyhow::anyhow!("state lock poisoned"))?;
        let mut state = State::load(&self.dir)?.context("the lab is not up")?;
        state
            .processes
            .retain(|p| p.name != process.name || process::running(p));
        state.processes.push(process);
        state.save(&self.dir)
    }

    /// Stops every recorded process named `name` that still runs (by PID) and forgets it.
    pub fn stop_process(&self, name: &str) -> anyhow::Result<()> {
        let victims: Vec<LabProcess> = {
            let _guard = STATE_LOCK
                .lock()
                .map_err(|_| anyhow::anyhow!("state lock poisoned"))?;
            let state = State::load(&self.dir)?.context("the lab is not up")?;
            state
                .processes
                .iter()
                .filter(|p| p.name == name)
                .cloned()
                .collect()
        };
        for p in &victims {
            process::stop(p, Duration::from_secs(5));
        }
        let _guard = STATE_LOCK
            .lock()
            .map_err(|_| anyhow::anyhow!("state lock poisoned"))?;
        let mut state = State::load(&self.dir)?.context("the lab is not up")?;
        state.processes.retain(|p| !victims.contains(p));
        state.save(&self.dir)
    }

    /// Starts the recorded process `name` again with the command it was started with (stopping
    /// it first if it still runs), appending to the same log; returns the new process.
    pub fn restart(&self, name: &str) -> anyhow::Result<LabProcess> {
        let state = State::load(&self.dir)?.context("the lab is not up")?;
        let old = state
            .processes
            .iter()
            .rev()
            .find(|p| p.name == name)
            .cloned()
            .with_context(|| {
                let names: Vec<&str> = state.processes.iter().map(|p| p.name.as_str()).collect();
                format!("no lab process {name:?}; the lab has: {}", names.join(", "))
            })?;
        let spec = old.command.clone().with_context(|| {
            format!("{name} was recorded without its command line: start it the way it was started")
        })?;
        if process::running(&old) {
            process::stop(&old, Duration::from_secs(5));
        }
        let log = PathBuf::from(&old.log);
        let new = process::start(&self.lab_exe, name, old.kind, &spec, &log)?;
        let _guard = STATE_LOCK
            .lock()
            .map_err(|_| anyhow::anyhow!("state lock poisoned"))?;
        let mut state = State::load(&self.dir)?.context("the lab is not up")?;
        match state.processes.iter_mut().find(|p| **p == old) {
            Some(slot) => *slot = new.clone(),
            None => state.processes.push(new.clone()),
        }
        state.save(&self.dir)?;
        Ok(new)
    }
}

/// An HTTP URL for an IP (bracketed for IPv6).
pub fn http_url(ip: &str) -> String {
    if ip.contains(':') {
        format!("http://[{ip}]/")
    } else {
        format!("http://{ip}/")
    }
}

impl Lab {
    /// MAC address of a host's lab interface.
    pub fn mac_of(&self, host: &str) -> anyhow::Result<String> {
        Ok(self
            .exec(host, "cat", &["/sys/class/net/eth0/address"])?
            .trim()
            .to_string())
    }

    /// Points `ip` at `mac` in `host`'s neighbour table (what a speaker's ARP/NDP answer does),
    /// or removes that entry with `mac: None`.
    pub fn set_neighbour(&self, host: &str, ip: &str, mac: Option<&str>) -> anyhow::Result<()> {
        let family = if ip.contains(':') { "-6" } else { "-4" };
        match mac {
            Some(mac) => self.exec(
                host,
                "ip",
                &[
                    family,
                    "neigh",
                    "replace",
                    ip,
                    "lladdr",
                    mac,
                    "dev",
                    "eth0",
                    "nud",
                    "permanent",
                ],
            ),
            None => self.exec(host, "ip", &[family, "neigh", "del", ip, "dev", "eth0"]),
        }
        .map(|_| ())
    }
}
