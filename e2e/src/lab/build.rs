//! Building the lab: its network (namespaces, veths, the bridge, routes) and its control plane
//! (etcd, kube-apiserver, kube-controller-manager, kube-proxies, the router, the node agent).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::Api;

use super::*;
use crate::cluster;
use crate::cmd::{ip_in, output_in, run, sysctl_in};
use crate::pki::Pki;
use crate::process::{self, LabProcess};
use crate::router;
use crate::topology::{LAB_RANGE_V4, LAB_RANGE_V6, Role};

impl Lab {
    pub(super) fn spawn(
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

    pub(super) async fn build(&self, state: &mut State) -> anyhow::Result<()> {
        let t = &self.topology;
        let started = Instant::now();
        self.build_network(state)?;
        eprintln!("lab: network ready ({:.1?})", started.elapsed());

        let server = format!("https://{}:6443", t.apiserver_address());
        let mut server_ips: Vec<std::net::IpAddr> = t
            .host("cp")
            .map(|h| vec![h.interfaces[0].ipv4.into(), h.interfaces[0].ipv6.into()])
            .unwrap_or_default();
        server_ips.extend(t.kubernetes_service_ips());
        let pki = Pki::ensure(&self.dir.join("pki"), &server, &server_ips)?;
        let bin = bin_dir();

        self.start_etcd(state, &bin).await?;
        let client = self.start_apiserver(state, &pki, &bin).await?;
        eprintln!("lab: kube-apiserver ready ({:.1?})", started.elapsed());
        self.start_controller_manager(state, &pki, &bin)?;
        self.start_nodes(state, &pki, &bin, &client).await?;
        self.start_kube_proxies(state, &pki, &bin)?;
        self.start_router(state).await?;
        self.wait_settled(&client).await?;
        eprintln!("lab: up in {:.1?}", started.elapsed());
        Ok(())
    }

    /// etcd in the control plane's namespace, from an empty data directory, once it answers.
    async fn start_etcd(&self, state: &mut State, bin: &Path) -> anyhow::Result<()> {
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
        Ok(())
    }

    /// kube-apiserver, once it serves requests and has written the bootstrap RBAC policy: a
    /// client with the admin's credentials.
    async fn start_apiserver(
        &self,
        state: &mut State,
        pki: &Pki,
        bin: &Path,
    ) -> anyhow::Result<kube::Client> {
        let t = &self.topology;
        let v6_primary = t.options.families == crate::topology::Families::V6;
        let advertise = if v6_primary {
            t.host("cp")
                .map(|h| h.interfaces[0].ipv6.to_string())
                .unwrap_or_default()
        } else {
            t.apiserver_address().to_string()
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
                // Node: what a kubelet may read and write (kubelet nodes); RBAC for the rest.
                "--authorization-mode=Node,RBAC".into(),
                // OwnerReferencesPermissionEnforcement (on in OpenShift): setting an owner
                // needs `delete` on the object, which ferrolb's RBAC must grant for its records.
                "--enable-admission-plugins=NodeRestriction,OwnerReferencesPermissionEnforcement"
                    .into(),
                // To the kubelets (logs, exec, proxy): by the node's address ("node1" resolves
                // nowhere), with a client certificate their webhook authorizer accepts.
                "--kubelet-preferred-address-types=InternalIP".into(),
                format!(
                    "--kubelet-client-certificate={}",
                    p("apiserver-kubelet-client.crt")
                ),
                format!("--kubelet-client-key={}", p("apiserver-kubelet-client.key")),
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
        Ok(client)
    }

    /// kube-controller-manager (its readiness is awaited in [`Self::wait_settled`]).
    fn start_controller_manager(
        &self,
        state: &mut State,
        pki: &Pki,
        bin: &Path,
    ) -> anyhow::Result<()> {
        let p = |f: &str| pki.path(f).display().to_string();
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
                // The default 20 requests/s makes thousands of EndpointSlices (the benches'
                // Services) take minutes; the lab's API server has room for more.
                "--kube-api-qps=100".into(),
                "--kube-api-burst=200".into(),
                "--v=1".into(),
            ],
        )?;
        Ok(())
    }

    /// The nodes: real kubelets (with the scheduler they need), or Node objects kept Ready by
    /// the node agent.
    async fn start_nodes(
        &self,
        state: &mut State,
        pki: &Pki,
        bin: &Path,
        client: &kube::Client,
    ) -> anyhow::Result<()> {
        let t = &self.topology;
        if t.options.kubelet {
            // Deployments and DaemonSets need a scheduler once real kubelets run the pods.
            let kubeconfig = pki.kubeconfig("kube-scheduler").display().to_string();
            self.spawn(
                state,
                "kube-scheduler",
                Some("flb-cp"),
                &bin.join("kube-scheduler"),
                vec![
                    format!("--kubeconfig={kubeconfig}"),
                    format!("--authentication-kubeconfig={kubeconfig}"),
                    format!("--authorization-kubeconfig={kubeconfig}"),
                    "--leader-elect=false".into(),
                    "--bind-address=127.0.0.1".into(),
                    "--v=1".into(),
                ],
            )?;
            // The Node objects with their labels and pod CIDRs, which the kubelets adopt and keep
            // Ready themselves.
            cluster::create_nodes(client, t).await?;
            self.build_kubelet_nodes(state, pki, client).await?;
        } else {
            cluster::register_nodes(client, t).await?;
            self.spawn(
                state,
                "node-agent",
                None,
                &self.lab_exe,
                vec!["agent".into()],
            )?;
        }
        Ok(())
    }

    /// A kube-proxy in each node's namespace.
    fn start_kube_proxies(&self, state: &mut State, pki: &Pki, bin: &Path) -> anyhow::Result<()> {
        for node in self.topology.nodes() {
            let config = self.dir.join(format!("kube-proxy-{}.yaml", node.name));
            std::fs::write(&config, self.kube_proxy_config(pki, &node.name))?;
            self.spawn(
                state,
                &format!("kube-proxy-{}", node.name),
                Some(&node.netns),
                &bin.join("kube-proxy"),
                vec![format!("--config={}", config.display()), "--v=1".into()],
            )?;
        }
        Ok(())
    }

    /// The FRR router's daemons, once bfdd and bgpd are zebra's clients.
    async fn start_router(&self, state: &mut State) -> anyhow::Result<()> {
        let t = &self.topology;
        let frr_dir = self.dir.join("frr");
        std::fs::create_dir_all(&frr_dir)?;
        std::fs::write(frr_dir.join("zebra.conf"), router::zebra_config())?;
        std::fs::write(frr_dir.join("bgpd.conf"), router::frr_config(t))?;
        std::fs::write(frr_dir.join("bfdd.conf"), router::bfdd_config(t))?;
        // FRR drops privileges to its own user, which must own its path space.
        run("chown", &["-R", "frr:frr", &frr_dir.display().to_string()])?;
        for daemon in ["zebra", "bfdd", "bgpd"] {
            let args = router::daemon_args(daemon, &frr_dir);
            self.spawn(
                state,
                &format!("frr-{daemon}"),
                Some("flb-router"),
                &Path::new(router::FRR_DIR).join(daemon),
                args,
            )?;
            if daemon == "zebra" {
                // Its socket exists before zebra takes clients; a client that comes too early
                // retries only 10 s later (bfdd did, making the lab 8 s slower): wait until
                // zebra answers on its vty too.
                let api = frr_dir.join("zserv.api");
                cluster::wait_for("zebra's zserv socket", Duration::from_secs(20), || {
                    let ready = api.exists() && router::zebra_vty(&frr_dir, "show version").is_ok();
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
        // bgpd runs sessions before it has reached zebra, and a BFD session it asks for while
        // bfdd or bgpd is not yet zebra's client is never installed (FRR 8.4 does not ask
        // again): the router is ready once both are zebra's clients.
        cluster::wait_for(
            "bfdd and bgpd to be zebra's clients",
            Duration::from_secs(30),
            || {
                let clients = router::zebra_vty(&frr_dir, "show zebra client summary");
                async move {
                    let clients = clients?;
                    let has = |name: &str| {
                        clients
                            .lines()
                            .any(|l| l.split_whitespace().next() == Some(name))
                    };
                    if has("bfd") && has("bgp") {
                        Ok(Some(()))
                    } else {
                        Err(clients)
                    }
                }
            },
        )
        .await?;
        Ok(())
    }

    /// Waits until kube-controller-manager serves and every kube-proxy has programmed its rules.
    async fn wait_settled(&self, client: &kube::Client) -> anyhow::Result<()> {
        let t = &self.topology;
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
        self.build_bridges(state)?;
        self.build_namespaces(state)?;
        self.build_veths()?;
        self.build_links()?;
        self.address_interfaces()?;
        self.route_hosts()
    }

    /// The host's unreachable routes for the lab ranges, and the segments' bridges with their
    /// addresses.
    fn build_bridges(&self, state: &mut State) -> anyhow::Result<()> {
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
        Ok(())
    }

    /// A namespace per host, with loopback up, no duplicate address detection, and forwarding
    /// as the host's role wants.
    fn build_namespaces(&self, state: &mut State) -> anyhow::Result<()> {
        for host in &self.topology.hosts {
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
        Ok(())
    }

    /// Each interface's veth: to its segment's bridge, or straight to the other member of the
    /// external segment.
    fn build_veths(&self) -> anyhow::Result<()> {
        let t = &self.topology;
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
        Ok(())
    }

    /// Each interface's addresses (with its segment's prefix lengths), then up.
    fn address_interfaces(&self) -> anyhow::Result<()> {
        let t = &self.topology;
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
        Ok(())
    }

    /// Each host's static routes, and the reverse-path filters its role needs off.
    fn route_hosts(&self) -> anyhow::Result<()> {
        let t = &self.topology;
        for host in &t.hosts {
            for route in &host.routes {
                ip_in(
                    &host.netns,
                    &["route", "replace", &route.to, "via", &route.via.to_string()],
                )?;
            }
            match host.role {
                Role::Node { .. } => {
                    // Pods reach their node at these link-local addresses (see add_pod).
                    sysctl_in(&host.netns, "net.ipv4.conf.all.rp_filter", "0")?;
                }
                Role::Router { .. } => {
                    // A route learnt over an unnumbered link points at that link, while the
                    // node's replies come back over the lab segment: the router must not drop
                    // them as spoofed. The effective value is the larger of `all` and the
                    // interface's, and a new namespace inherits the host's IPv4 defaults.
                    sysctl_in(&host.netns, "net.ipv4.conf.all.rp_filter", "0")?;
                    sysctl_in(&host.netns, "net.ipv4.conf.default.rp_filter", "0")?;
                    let links = t.links_of(&host.name).map(|(mine, _)| &mine.interface);
                    for name in host.interfaces.iter().map(|i| &i.name).chain(links) {
                        sysctl_in(&host.netns, &format!("net.ipv4.conf.{name}.rp_filter"), "0")?;
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The unnumbered point-to-point links: a veth made straight between the two namespaces
    /// (nothing ever appears in the host namespace), no addresses but the kernel's IPv6
    /// link-local ones, no Router Advertisements taken, both ends up with their link-local
    /// address usable (not tentative) before this returns.
    fn build_links(&self) -> anyhow::Result<()> {
        let t = &self.topology;
        for (n, link) in t.links.iter().enumerate() {
            let mut ends = Vec::new();
            for (side, end) in ["a", "b"].into_iter().zip(&link.ends) {
                let host = t
                    .host(&end.host)
                    .with_context(|| format!("link {n}: no host {} in the topology", end.host))?;
                ends.push((
                    host.netns.as_str(),
                    end.interface.as_str(),
                    format!("flb-l{n}{side}"),
                ));
            }
            let [(ns_a, if_a, tmp_a), (ns_b, if_b, tmp_b)] = &ends[..] else {
                bail!("link {n} has not two ends");
            };
            // Temporary names, unique in both namespaces, as for the external segment's pair.
            run(
                "ip",
                &[
                    "link", "add", tmp_a, "netns", ns_a, "type", "veth", "peer", "name", tmp_b,
                    "netns", ns_b,
                ],
            )?;
            for (ns, name, tmp) in [(ns_a, if_a, tmp_a), (ns_b, if_b, tmp_b)] {
                ip_in(ns, &["link", "set", tmp, "name", name])?;
                // IPv6 on (the link-local address is all the link has); never a default route
                // from the peer's Router Advertisements (the speaker and FRR send them to find
                // each other, FRR's with a lifetime, and node1 forwards); no DAD, which would
                // leave the address tentative for a second (the namespace's `default` already
                // says so, this holds whatever made the namespace); no reverse path check on
                // IPv4 routed over the link to an IPv6 next hop (its replies take the segment).
                for (key, value) in [
                    ("ipv6", "disable_ipv6", "0"),
                    ("ipv6", "accept_ra", "0"),
                    ("ipv6", "accept_dad", "0"),
                    ("ipv4", "rp_filter", "0"),
                ]
                .map(|(family, key, value)| (format!("net.{family}.conf.{name}.{key}"), value))
                {
                    sysctl_in(ns, &key, value)?;
                }
            }
            for (ns, name) in [(ns_a, if_a), (ns_b, if_b)] {
                ip_in(ns, &["link", "set", name, "up"])?;
            }
            for (ns, name) in [(ns_a, if_a), (ns_b, if_b)] {
                wait_link_local(ns, name)?;
            }
        }
        Ok(())
    }
}

/// Waits until `interface` in `netns` has a usable IPv6 link-local address (present, not
/// tentative): the kernel adds it once the veth has carrier, which both ends being up gives.
fn wait_link_local(netns: &str, interface: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = ip_in(
            netns,
            &["-6", "addr", "show", "dev", interface, "scope", "link"],
        )?;
        let usable = out
            .lines()
            .map(str::trim)
            .any(|l| l.starts_with("inet6 fe80:") && !l.contains("tentative"));
        if usable {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("{interface} in {netns} has no usable link-local address after 10 s: {out}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
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
