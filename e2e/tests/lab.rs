//! Proof tests of the lab: the paths ferrolb relies on work with the real components.
//!
//! Runs each test in iptables mode, then again in nftables mode; in between, tests that break the
//! lab on purpose (a crashed controller and speaker; dead infrastructure). Needs root; without it
//! every test is reported as ignored with the reason. On failure, every lab log is copied to
//! target/lab-logs/<suite>/ and its tail printed (`ferrolb_e2e::suite`). FERROLB_KEEP_LAB=1
//! keeps the last lab up.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use ferrolb_e2e::cluster::wait_for;
use ferrolb_e2e::router;
use ferrolb_e2e::scope::TestScope;
use ferrolb_e2e::service::lb_service;
use ferrolb_e2e::suite::{self, BoxFuture, Suite};
use ferrolb_e2e::topology::Role;
use ferrolb_e2e::{Lab, Options, ProxyMode};
use ferrolb_testkit::trial::Arguments;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams, PostParams};

fn lab_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ferrolb-lab"))
}

fn service(name: &str, type_: &str) -> Service {
    lb_service(name)
        .service_type(type_)
        .selector("app", name)
        .ip_family_policy("PreferDualStack")
        .build()
}

/// Asks `url` from `host` until every name in `want` has answered (bounded attempts).
fn collect_answers(
    lab: &Lab,
    host: &str,
    url: &str,
    want: &BTreeSet<String>,
) -> anyhow::Result<BTreeSet<String>> {
    let mut seen = BTreeSet::new();
    let mut last_error = String::new();
    for _ in 0..60 {
        let out = lab.exec_output(host, "curl", &["-sS", "--max-time", "2", "-g", url])?;
        if out.status.success() {
            let body = String::from_utf8_lossy(&out.stdout);
            if let Some(name) = body.split_whitespace().next() {
                seen.insert(name.to_string());
            }
        } else {
            last_error = String::from_utf8_lossy(&out.stderr).trim().to_string();
        }
        if want.is_subset(&seen) {
            return Ok(seen);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("from {host}, {url} answered by {seen:?}, expected {want:?}; last error: {last_error}")
}

fn node_rules(lab: &Lab, node: &str) -> anyhow::Result<String> {
    match lab.topology.options.proxy_mode {
        ProxyMode::Iptables => {
            let mut rules = lab.exec(node, "iptables-save", &["-t", "nat"])?;
            if let Ok(v6) = lab.exec(node, "ip6tables-save", &["-t", "nat"]) {
                rules.push_str(&v6);
            }
            Ok(rules)
        }
        ProxyMode::Nftables => {
            let mut rules = lab
                .exec(node, "nft", &["list", "table", "ip", "kube-proxy"])
                .unwrap_or_default();
            if let Ok(v6) = lab.exec(node, "nft", &["list", "table", "ip6", "kube-proxy"]) {
                rules.push_str(&v6);
            }
            Ok(rules)
        }
    }
}

/// (a) NodePort and ClusterIP reach both pods; kube-proxy's chains split between them.
async fn nodeport_and_clusterip(lab: &Lab) -> anyhow::Result<()> {
    let mut scope = TestScope::new(lab, "proof-nodeport").await?;
    let pods = scope.deploy("web", &["node1", "node2"]).await?;
    // A pod that is not a backend, to ask from inside the cluster.
    let labels = [("app".to_string(), "asker".to_string())].into();
    let asker = lab
        .add_pod(&scope.namespace, "asker", "node1", &labels)
        .await?;
    let client = lab.client().await?;
    let services: Api<Service> = Api::namespaced(client, &scope.namespace);
    let svc = services
        .create(&PostParams::default(), &service("web", "NodePort"))
        .await?;
    scope.wait_ready_endpoints("web", 2).await?;
    let spec = svc.spec.context("service spec")?;
    let node_port = spec
        .ports
        .as_ref()
        .and_then(|p| p[0].node_port)
        .context("nodePort")?;
    let want: BTreeSet<String> = pods.iter().map(|p| p.name.clone()).collect();

    for node in lab.topology.nodes() {
        let iface = &node.interfaces[0];
        if lab.topology.options.families.v4() {
            collect_answers(
                lab,
                "client",
                &format!("http://{}:{node_port}/", iface.ipv4),
                &want,
            )?;
        }
        if lab.topology.options.families.v6() {
            collect_answers(
                lab,
                "client",
                &format!("http://[{}]:{node_port}/", iface.ipv6),
                &want,
            )?;
        }
    }
    for ip in spec.cluster_ips.unwrap_or_default() {
        let url = ferrolb_e2e::lab::http_url(&ip);
        collect_answers(lab, &asker.netns, &url, &want)?;
    }
    lab.remove_pod(&asker).await?;

    let rules = node_rules(lab, "node1")?;
    match lab.topology.options.proxy_mode {
        ProxyMode::Iptables => {
            for chain in [
                ":KUBE-SERVICES",
                ":KUBE-NODEPORTS",
                ":KUBE-SVC-",
                ":KUBE-SEP-",
            ] {
                ensure!(
                    rules.contains(chain),
                    "node1's nat table has no {chain} chain:\n{rules}"
                );
            }
            ensure!(
                rules.contains("-m statistic --mode random --probability 0.50000000000"),
                "node1's KUBE-SVC chain does not split between the two endpoints:\n{rules}"
            );
        }
        ProxyMode::Nftables => {
            // kube-proxy's nftables mode (1.37) puts the endpoints straight into the service chain.
            ensure!(
                rules.contains("chain service-") && rules.contains("proof-nodeport/web/tcp/http"),
                "no service chain for web:\n{rules}"
            );
            ensure!(
                rules.contains("numgen random mod 2"),
                "no random split between two endpoints:\n{rules}"
            );
        }
    }
    Ok(())
}

/// (b) A LoadBalancer IP set by hand gets kube-proxy's external rules on every node, and a client
/// whose neighbour entry points the IP at one node reaches a pod: the speaker's path.
async fn loadbalancer_ip_by_hand(lab: &Lab) -> anyhow::Result<()> {
    let mut scope = TestScope::new(lab, "proof-lb").await?;
    let pods = scope.deploy("lb", &["node1", "node2"]).await?;
    let client = lab.client().await?;
    let services: Api<Service> = Api::namespaced(client, &scope.namespace);
    services
        .create(&PostParams::default(), &service("lb", "LoadBalancer"))
        .await?;
    scope.wait_ready_endpoints("lb", 2).await?;
    let fam = lab.topology.options.families;
    let mut ips = Vec::new();
    if fam.v4() {
        ips.push("198.18.200.10".to_string());
    }
    if fam.v6() {
        ips.push("fd00:18::c8:a".to_string());
    }
    let ingress: Vec<serde_json::Value> = ips
        .iter()
        .map(|ip| serde_json::json!({"ip": ip, "ipMode": "VIP"}))
        .collect();
    services
        .patch_status(
            "lb",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"status": {"loadBalancer": {"ingress": ingress}}})),
        )
        .await?;

    for node in lab.topology.nodes() {
        for ip in &ips {
            let name = node.name.clone();
            wait_for(
                &format!("kube-proxy on {name} to program {ip}"),
                Duration::from_secs(30),
                || {
                    let found = node_rules(lab, &name).map(|r| {
                        let has_ip = r.contains(ip.as_str());
                        let has_ext = match lab.topology.options.proxy_mode {
                            ProxyMode::Iptables => r.contains("KUBE-EXT-"),
                            ProxyMode::Nftables => r.contains("external-"),
                        };
                        has_ip && has_ext
                    });
                    async move {
                        match found {
                            Ok(true) => Ok(Some(())),
                            Ok(false) => Err("no external rule for the IP yet".to_string()),
                            Err(e) => Err(e.to_string()),
                        }
                    }
                },
            )
            .await?;
        }
    }
    kube_proxy_names_are_computed_right(lab, &scope.namespace, &pods)?;
    let owner_mac = lab.mac_of("node1")?;
    let want: BTreeSet<String> = pods.iter().map(|p| p.name.clone()).collect();
    for ip in &ips {
        lab.set_neighbour("client", ip, Some(&owner_mac))?;
        let answered = collect_answers(lab, "client", &ferrolb_e2e::lab::http_url(ip), &want);
        let _ = lab.set_neighbour("client", ip, None);
        answered?;
    }
    drop(scope);
    Ok(())
}

/// The chain names `ferrolb explain` computes (`ferrolb_explain::kube_proxy`) for Service
/// `namespace/lb` port `http` are the ones this lab's kube-proxy wrote on node1: in iptables mode
/// KUBE-EXT, KUBE-SVC and each pod's KUBE-SEP with its DNAT; in nftables mode the external and
/// service chains (kube-proxy 1.37 has endpoint chains only with session affinity).
fn kube_proxy_names_are_computed_right(
    lab: &Lab,
    namespace: &str,
    pods: &[ferrolb_e2e::LabPod],
) -> anyhow::Result<()> {
    use ferrolb_explain::kube_proxy::{Protocol, ServicePort, iptables, nftables};
    let port = ServicePort::new(namespace, "lb", "http", Protocol::Tcp);
    let rules = node_rules(lab, "node1")?;
    match lab.topology.options.proxy_mode {
        ProxyMode::Iptables => {
            for chain in [
                iptables::external_chain(&port),
                iptables::service_chain(&port),
            ] {
                ensure!(
                    rules.contains(&format!(":{chain} ")),
                    "no chain {chain} on node1:\n{rules}"
                );
            }
            for pod in pods {
                for ip in &pod.ips {
                    let endpoint = std::net::SocketAddr::new(ip.parse()?, 8080);
                    let chain = iptables::endpoint_chain(&port, endpoint);
                    let dnat = format!("--to-destination {endpoint}");
                    ensure!(
                        rules
                            .lines()
                            .any(|l| l.starts_with(&format!("-A {chain} ")) && l.contains(&dnat)),
                        "no chain {chain} with {dnat} on node1:\n{rules}"
                    );
                }
            }
        }
        ProxyMode::Nftables => {
            for chain in [
                nftables::external_chain(&port),
                nftables::service_chain(&port),
            ] {
                ensure!(
                    rules.contains(&format!("chain {chain} {{")),
                    "no chain {chain} on node1:\n{rules}"
                );
            }
        }
    }
    Ok(())
}

/// (c) FRR on the router takes an eBGP session from GoBGP on a node and installs an advertised
/// /32 in its kernel table.
async fn frr_learns_route_from_gobgp(lab: &Lab) -> anyhow::Result<()> {
    let mut scope = TestScope::new(lab, "proof-bgp").await?;
    let node = lab.topology.host("node1").context("node1")?;
    let addr = node.interfaces[0].ipv4;
    let config = lab.dir.join("gobgp-node1.toml");
    std::fs::write(
        &config,
        format!(
            "[global.config]\n  as = 64512\n  router-id = \"{addr}\"\n  port = -1\n[[neighbors]]\n  [neighbors.config]\n    neighbor-address = \"198.18.0.254\"\n    peer-as = 64500\n  [neighbors.timers.config]\n    connect-retry = 1\n    hold-time = 9\n    keepalive-interval = 3\n"
        ),
    )?;
    let gobgpd = Path::new("/usr/bin/gobgpd");
    scope.spawn(
        "gobgpd",
        "node1",
        gobgpd,
        &[
            "-f".into(),
            config.display().to_string(),
            "--api-hosts".into(),
            "127.0.0.1:50051".into(),
            "--log-level".into(),
            "info".into(),
        ],
    )?;
    let prefix = "198.18.201.1/32";
    wait_for("GoBGP to accept the route", Duration::from_secs(20), || {
        let out = lab.exec_output(
            "node1",
            "gobgp",
            &[
                "-u",
                "127.0.0.1",
                "-p",
                "50051",
                "global",
                "rib",
                "add",
                prefix,
                "-a",
                "ipv4",
            ],
        );
        async move {
            match out {
                Ok(o) if o.status.success() => Ok(Some(())),
                Ok(o) => Err(String::from_utf8_lossy(&o.stderr).to_string()),
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .await?;
    wait_for(
        "the router to install 198.18.201.1/32 from BGP",
        Duration::from_secs(60),
        || {
            let out = lab.exec("router", "ip", &["route", "show", "198.18.201.1/32"]);
            async move {
                match out {
                    Ok(o) if o.contains("proto bgp") && o.contains("198.18.0.11") => Ok(Some(())),
                    Ok(o) => Err(format!("router route: {o:?}")),
                    Err(e) => Err(e.to_string()),
                }
            }
        },
    )
    .await?;
    Ok(())
}

/// Undoes the addresses and routes a test added in lab hosts (`ip` arguments per host), also
/// when the test fails.
struct UndoIp<'a> {
    lab: &'a Lab,
    commands: Vec<(String, Vec<String>)>,
}

impl UndoIp<'_> {
    /// Runs `ip ARGS` in `host` and records `undo` (also `ip` arguments) for the drop.
    fn run(&mut self, host: &str, args: &[&str], undo: &[&str]) -> anyhow::Result<()> {
        self.lab.exec(host, "ip", args)?;
        self.commands.push((
            host.to_string(),
            undo.iter().map(|a| a.to_string()).collect(),
        ));
        Ok(())
    }
}

impl Drop for UndoIp<'_> {
    fn drop(&mut self) {
        for (host, args) in self.commands.iter().rev() {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            if let Err(e) = self.lab.exec(host, "ip", &args) {
                eprintln!("undoing `ip {}` in {host}: {e:#}", args.join(" "));
            }
        }
    }
}

/// (d) The unnumbered link between node1 and the router (for BGP unnumbered): each end has one
/// address, its usable (not tentative) IPv6 link-local one, and takes no Router Advertisements;
/// the ends reach each other; FRR's Router Advertisements, which it sends for its interface
/// neighbour, give node1 no default route; bgpd has the neighbour. Then IPv4 and IPv6 routed
/// by the router over the link to a link-local next hop, as an unnumbered session's routes are,
/// reach node1 from the external client, and the answers, which come back over the lab segment,
/// are not dropped by the router's reverse path check.
async fn unnumbered_link(lab: &Lab) -> anyhow::Result<()> {
    let t = &lab.topology;
    let link = t
        .links
        .first()
        .context("the topology has no unnumbered link")?;
    let is_router = |host: &str| {
        t.host(host)
            .is_some_and(|h| matches!(h.role, Role::Router { .. }))
    };
    let (node, router) = match &link.ends {
        [a, b] if is_router(&b.host) => (a, b),
        [a, b] if is_router(&a.host) => (b, a),
        _ => bail!("the link {link:?} does not end at the router"),
    };
    let mut lla = Vec::new();
    for end in [node, router] {
        let out = lab.exec(
            &end.host,
            "ip",
            &["-j", "addr", "show", "dev", &end.interface],
        )?;
        let json: serde_json::Value = serde_json::from_str(&out)?;
        let addresses = json[0]["addr_info"].as_array().cloned().unwrap_or_default();
        let [address] = &addresses[..] else {
            bail!(
                "{}:{} has other than one address: {out}",
                end.host,
                end.interface
            );
        };
        let local = address["local"].as_str().unwrap_or_default();
        ensure!(
            address["family"] == "inet6"
                && address["scope"] == "link"
                && local.starts_with("fe80:")
                && address.get("tentative").is_none(),
            "{}:{} has no usable link-local address: {out}",
            end.host,
            end.interface
        );
        let accept_ra = lab.exec(
            &end.host,
            "sysctl",
            &["-n", &format!("net.ipv6.conf.{}.accept_ra", end.interface)],
        )?;
        ensure!(
            accept_ra.trim() == "0",
            "{}: accept_ra {accept_ra}",
            end.host
        );
        lla.push(local.to_string());
    }
    let [node_lla, router_lla] = &lla[..] else {
        unreachable!()
    };
    for (from, to) in [(node, router_lla), (router, node_lla)] {
        lab.exec(
            &from.host,
            "ndisc6",
            &["-1", "-r", "3", to, &from.interface],
        )
        .with_context(|| format!("{}:{} reaching {to}", from.host, from.interface))?;
    }
    // FRR advertises itself on the link (with a router lifetime): node1 hears it, and keeps no
    // default route.
    wait_for(
        "a Router Advertisement from the router on node1's unnumbered link",
        Duration::from_secs(20),
        || {
            let out = lab.exec_output(&node.host, "rdisc6", &["-1", "-w", "2000", &node.interface]);
            async move {
                match out {
                    Ok(o) if o.status.success() => Ok(Some(())),
                    Ok(o) => Err(String::from_utf8_lossy(&o.stderr).to_string()),
                    Err(e) => Err(e.to_string()),
                }
            }
        },
    )
    .await?;
    let default = lab.exec(&node.host, "ip", &["-6", "route", "show", "default"])?;
    ensure!(
        default.trim().is_empty(),
        "{} took a default route: {default}",
        node.host
    );
    let neighbour = router::vtysh(lab, &[&format!("show bgp neighbors {}", router.interface)])?;
    ensure!(
        neighbour.contains(&format!("BGP neighbor on {}", router.interface)),
        "bgpd has no neighbour {}: {neighbour}",
        router.interface
    );
    // The machine's own defaults may be strict (a new namespace inherits the host's IPv4
    // settings): the lab turns the router's filter off, so the check below proves the path.
    let router_host = t.host(&router.host).context("the router host")?;
    let confs = ["all", router.interface.as_str()]
        .into_iter()
        .chain(router_host.interfaces.iter().map(|i| i.name.as_str()));
    for conf in confs {
        let key = format!("net.ipv4.conf.{conf}.rp_filter");
        let value = lab.exec(&router.host, "sysctl", &["-n", &key])?;
        ensure!(value.trim() == "0", "router: {key} = {value}");
    }

    // Forwarding over the link, replies over the lab segment.
    let mut scope = TestScope::new(lab, "proof-unnumbered").await?;
    scope.spawn(
        "echo-unnumbered",
        &node.host,
        &lab_exe(),
        &["echo".into(), "--name".into(), "unnumbered".into()],
    )?;
    let mut undo = UndoIp {
        lab,
        commands: Vec::new(),
    };
    for (address, family) in [("198.18.240.1", "-4"), ("fd00:18::f0:1", "-6")] {
        let (host_route, v4_via) = if family == "-4" {
            (format!("{address}/32"), "inet6")
        } else {
            (format!("{address}/128"), "")
        };
        undo.run(
            &node.host,
            &["addr", "add", &host_route, "dev", "lo"],
            &["addr", "del", &host_route, "dev", "lo"],
        )?;
        let mut add = vec![family, "route", "add", &host_route, "via"];
        if !v4_via.is_empty() {
            add.push(v4_via);
        }
        add.extend([node_lla.as_str(), "dev", &router.interface]);
        undo.run(&router.host, &add, &[family, "route", "del", &host_route])?;
        let url = format!(
            "http://{}:8080/",
            if family == "-6" {
                format!("[{address}]")
            } else {
                address.to_string()
            }
        );
        wait_for(
            &format!("ext to reach {address} over the unnumbered link"),
            Duration::from_secs(20),
            || {
                let out = lab.exec_output("ext", "curl", &["-sS", "--max-time", "2", "-g", &url]);
                async move {
                    match out {
                        Ok(o) if String::from_utf8_lossy(&o.stdout).starts_with("unnumbered ") => {
                            Ok(Some(()))
                        }
                        Ok(o) => Err(String::from_utf8_lossy(&o.stderr).to_string()),
                        Err(e) => Err(e.to_string()),
                    }
                }
            },
        )
        .await?;
    }
    drop(undo);
    Ok(())
}

/// Runs `ferrolb-lab ARGS` as a user runs `e2e/lab ARGS`; returns its exit code, stdout and
/// stderr.
fn lab_command(args: &[&str]) -> anyhow::Result<(i32, String, String)> {
    let out = std::process::Command::new(lab_exe())
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("running ferrolb-lab {}", args.join(" ")))?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// Waits until a controller on the control plane answers `/healthz` on `port`.
async fn wait_healthz(lab: &Lab, what: &str, port: u16) -> anyhow::Result<()> {
    let url = format!("http://127.0.0.1:{port}/healthz");
    wait_for(what, Duration::from_secs(30), || {
        let out = lab.exec_output("cp", "curl", &["-sf", &url]);
        async move {
            match out {
                Ok(o) if o.status.success() => Ok(Some(())),
                Ok(o) => Err(format!("curl exit {}", o.status)),
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .await
}

/// A crashed controller and speaker leave the lab usable: `exec`, `kubectl` and `status` work,
/// `status` says how each ended and shows its last log lines, and `restart` brings one back.
/// Runs alone (a controller would act on the other tests' Services).
async fn dead_ferrolb_processes_leave_the_lab_usable(lab: &Lab) -> anyhow::Result<()> {
    use ferrolb_e2e::{ferrolb, process};
    let kubeconfig = ferrolb::install(lab)?;
    let credentials = ferrolb::install_speaker(lab)?;
    let controller = ferrolb::start_controller(lab, &kubeconfig, "crash", 7473)?;
    // A speaker that cannot start (an unknown flag): it exits on its own with clap's status 2.
    let speaker = ferrolb::start_speaker(lab, &credentials, "node1", &["--no-such-flag"])?;
    wait_healthz(lab, "the controller to serve /healthz", 7473).await?;
    // A crash: SIGKILL, as the OOM killer sends it.
    process::kill_now(&controller);
    wait_for("the bad speaker to exit", Duration::from_secs(30), || {
        let gone = !process::running(&speaker);
        async move {
            if gone {
                Ok(Some(()))
            } else {
                Err("still running".to_string())
            }
        }
    })
    .await?;

    ensure!(
        Lab::running(&lab_exe())?.is_some(),
        "the lab counts as down because ferrolb processes died"
    );
    let (code, out, err) =
        lab_command(&["exec", "client", "--", "ip", "-br", "addr", "show", "eth0"])?;
    ensure!(
        code == 0 && out.contains("eth0"),
        "exec failed ({code}): {out}{err}"
    );
    let (code, out, err) = lab_command(&["kubectl", "get", "nodes", "-o", "name"])?;
    ensure!(
        code == 0 && out.contains("node/node1"),
        "kubectl failed ({code}): {out}{err}"
    );
    let (code, status, err) = lab_command(&["status"])?;
    ensure!(code == 0, "status failed ({code}): {err}");
    ensure!(
        status
            .lines()
            .next()
            .is_some_and(|l| l.starts_with("lab: up")),
        "status: {status}"
    );
    let line_of = |name: &str| {
        status
            .lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_default()
            .to_string()
    };
    let line = line_of("controller-crash");
    ensure!(
        line.contains("DEAD (killed by signal SIGKILL)"),
        "controller's status line: {line:?}"
    );
    let line = line_of("speaker@node1");
    ensure!(
        line.contains("DEAD (exited with status 2)"),
        "speaker's status line: {line:?}"
    );
    // The speaker's last log lines are shown: clap's complaint and the supervisor's record.
    ensure!(
        status.contains("last lines of speaker@node1")
            && status.contains("--no-such-flag")
            && status.contains("[ferrolb-lab] speaker@node1 exited with status 2"),
        "status shows no log tail of the dead speaker:\n{status}"
    );

    // One command restarts the controller with its original arguments; its log goes on.
    let (code, out, err) = lab_command(&["restart", "controller-crash"])?;
    ensure!(
        code == 0 && out.contains("controller-crash restarted"),
        "restart ({code}): {out}{err}"
    );
    wait_healthz(lab, "the restarted controller to serve /healthz", 7473).await?;
    let (_, status, _) = lab_command(&["status"])?;
    let line = status
        .lines()
        .find(|l| l.trim_start().starts_with("controller-crash"))
        .unwrap_or_default();
    ensure!(line.contains("running"), "after restart: {line:?}");
    let log = std::fs::read_to_string(&controller.log)?;
    ensure!(
        log.contains("[ferrolb-lab] controller-crash killed by signal SIGKILL"),
        "the restart truncated the log, or the crash is not in it"
    );
    lab.stop_process("controller-crash")?;
    lab.stop_process("speaker@node1")?;
    Ok(())
}

/// When the lab's own infrastructure dies, `status` and `exec` say which process, and the next
/// `e2e/lab up` names it and keeps that lab's logs before it rebuilds. Rebuilds the lab in
/// `next` mode.
fn broken_infrastructure_is_named_and_its_logs_kept(
    lab: &Lab,
    next: ProxyMode,
) -> anyhow::Result<()> {
    use ferrolb_e2e::process;
    let state = ferrolb_e2e::lab::State::load(&lab.dir)?.context("no lab state")?;
    let kcm = state
        .processes
        .iter()
        .find(|p| p.name == "kube-controller-manager")
        .context("no kube-controller-manager in the lab")?;
    process::kill_now(kcm);
    let (_, status, _) = lab_command(&["status"])?;
    ensure!(
        status.starts_with("lab: broken (kube-controller-manager died"),
        "status: {status}"
    );
    let (code, _, err) = lab_command(&["exec", "client", "--", "true"])?;
    ensure!(
        code != 0 && err.contains("kube-controller-manager died"),
        "exec in a broken lab ({code}): {err}"
    );
    let (code, out, err) = lab_command(&["up", "--proxy-mode", next.as_str()])?;
    ensure!(
        code == 0,
        "up after the breakage failed ({code}): {out}{err}"
    );
    ensure!(
        err.contains("kube-controller-manager died (killed by signal SIGKILL)"),
        "up did not say what died:\n{err}"
    );
    let kept = err
        .lines()
        .find_map(|l| l.strip_prefix("lab: the previous lab's logs are in "))
        .context("up did not say where the previous logs are")?;
    let old_log =
        std::fs::read_to_string(Path::new(kept.trim()).join("kube-controller-manager.log"))
            .context("the broken lab's kube-controller-manager log was not kept")?;
    ensure!(
        old_log.contains("[ferrolb-lab] kube-controller-manager killed by signal SIGKILL"),
        "the kept log does not end with the crash"
    );
    Ok(())
}

/// The proof tests, in the lab of one kube-proxy mode; test names start with the mode.
fn proof_suite(mode: ProxyMode) -> Suite<Lab> {
    let m = mode.as_str();
    Suite::new(&format!("lab-{m}"))
        .options(Options {
            proxy_mode: mode,
            ..Options::default()
        })
        .test(
            &format!("{m}::nodeport_and_clusterip_reach_both_pods"),
            |lab| Box::pin(async move { nodeport_and_clusterip(&lab).await }),
        )
        .test(
            &format!("{m}::loadbalancer_ip_set_by_hand_reaches_a_pod_through_kube_proxy"),
            |lab| Box::pin(async move { loadbalancer_ip_by_hand(&lab).await }),
        )
        .test(
            &format!("{m}::frr_installs_a_route_advertised_by_gobgp"),
            |lab| Box::pin(async move { frr_learns_route_from_gobgp(&lab).await }),
        )
        .test(
            &format!("{m}::unnumbered_link_has_only_link_local_addresses_and_forwards"),
            |lab| Box::pin(async move { unnumbered_link(&lab).await }),
        )
}

fn main() -> std::process::ExitCode {
    let args = Arguments::from_args();
    let ready = |lab: Lab| -> BoxFuture<Lab> { Box::pin(async move { Ok(lab) }) };
    let mut conclusions = Vec::new();
    // The iptables lab stays up for the tests that break it on purpose, which run one at a time
    // after the others; the second of them rebuilds the lab in nftables mode.
    conclusions.push(
        proof_suite(ProxyMode::Iptables)
            .keep_lab()
            .run(&args, ready),
    );
    conclusions.push(
        Suite::new("lab-breakage")
            .one_at_a_time()
            .keep_lab()
            .test("lab::dead_ferrolb_processes_leave_the_lab_usable", |lab| {
                Box::pin(async move { dead_ferrolb_processes_leave_the_lab_usable(&lab).await })
            })
            .test(
                "lab::broken_infrastructure_is_named_and_its_logs_kept",
                |lab| {
                    Box::pin(async move {
                        broken_infrastructure_is_named_and_its_logs_kept(&lab, ProxyMode::Nftables)
                    })
                },
            )
            .run(&args, ready),
    );
    conclusions.push(proof_suite(ProxyMode::Nftables).run(&args, ready));
    // Whatever was selected, no lab is left behind (unless asked for).
    if ferrolb_e2e::is_root()
        && std::env::var_os("FERROLB_KEEP_LAB").is_none()
        && let Err(e) = ferrolb_e2e::down()
    {
        eprintln!("lab down failed: {e:#}");
        return std::process::ExitCode::FAILURE;
    }
    suite::exit_code(&conclusions)
}
