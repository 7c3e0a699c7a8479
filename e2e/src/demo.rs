//! `e2e/lab demo`: the main job. Brings the lab up, runs ferrolb-controller and a speaker on
//! every node, and serves a LoadBalancer Service with two pods, showing the IP, the node that
//! owns it, the kube-proxy chain it goes through, and the answers a client gets through it.
//!
//! `e2e/lab demo --bgp`: the same in BGP mode: a BGPPeer to the lab router with a BFDProfile, a
//! BGPAdvertisement, and a Service whose IP the router learns from every node (ECMP), shown
//! with the router's routes, its BGP and BFD sessions, and the answers the external client
//! behind the router gets.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::api::{Api, ObjectMeta, Patch, PatchParams};

use crate::cluster::wait_for;
use crate::ferrolb;
use crate::lab::Lab;
use crate::topology::Options;

const DEMO_NS: &str = "demo";

/// Ports of the ServiceLB demo's Service, as k3s's traefik Service has them.
const SERVICELB_PORTS: [u16; 2] = [80, 443];

/// Which demonstration to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Layer 2 mode, ferrolb run as processes in the nodes (`e2e/lab demo`).
    Layer2,
    /// BGP mode with the lab router (`e2e/lab demo --bgp`).
    Bgp,
    /// Layer 2 mode on kubelet nodes, ferrolb installed with its Helm chart (`demo --helm`).
    Helm,
    /// Node addresses, k3s ServiceLB's job, with no pool at all (`demo --servicelb`).
    ServiceLb,
}

/// Runs the demonstration; leaves the lab up for a look (`e2e/lab down` removes it).
pub async fn run(lab_exe: &Path, mode: Mode) -> anyhow::Result<()> {
    if mode == Mode::Helm {
        return crate::helm_demo::run(lab_exe).await;
    }
    if mode == Mode::ServiceLb {
        let lab = start(lab_exe, &["--node-addresses"]).await?;
        return run_servicelb(&lab).await;
    }
    let lab = start(lab_exe, &[]).await?;
    if mode == Mode::Bgp {
        run_bgp(&lab).await
    } else {
        run_l2(&lab).await
    }
}

/// The lab up, ferrolb-controller (with `controller_args`) and a speaker on every node
/// (replacing an earlier demo's).
async fn start(lab_exe: &Path, controller_args: &[&str]) -> anyhow::Result<Lab> {
    println!("==> bringing the lab up (3 nodes, kube-proxy iptables, dual-stack)");
    let lab = Lab::up(Options::default(), lab_exe).await?;
    println!(
        "==> installing ferrolb's CRDs and RBAC, starting ferrolb-controller and the speakers"
    );
    let kubeconfig = ferrolb::install(&lab)?;
    let nodes: Vec<String> = lab.topology.nodes().map(|h| h.name.clone()).collect();
    // A second demo on the same lab replaces the first one's processes instead of adding to them.
    lab.stop_process("controller-demo")?;
    for node in &nodes {
        lab.stop_process(&format!("speaker@{node}"))?;
    }
    // Both tracked by the lab: they keep running after the demo, until `e2e/lab down`.
    ferrolb::start_controller_with(&lab, &kubeconfig, "demo", 7472, controller_args)?;
    let credentials = ferrolb::install_speaker(&lab)?;
    for node in &nodes {
        ferrolb::start_speaker(&lab, &credentials, node, &[])?;
    }
    Ok(lab)
}

/// Namespace `ns` with two pods of app=demo on node1 and node2 and a dual-stack LoadBalancer
/// Service `demo` (with `annotations`) in front of them, once it has its IPs: the Service, its
/// IPs and the pool they came from.
async fn serve(
    lab: &Lab,
    ns: &str,
    annotations: &[(&str, &str)],
) -> anyhow::Result<(Service, Vec<String>, String)> {
    let client = lab.client().await?;
    println!("==> two pods of app=demo on node1 and node2, and a LoadBalancer Service");
    namespace_with_pods(lab, ns, "demo").await?;
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let svc = crate::service::lb_service("demo")
        .annotations(annotations.iter().copied())
        .ip_family_policy("PreferDualStack")
        .selector("app", "demo")
        .build();
    services
        .patch(
            "demo",
            &PatchParams::apply("ferrolb-demo").force(),
            &Patch::Apply(&svc),
        )
        .await?;
    let svc = wait_for(
        &format!("ferrolb-controller to give Service {ns}/demo its IPs"),
        Duration::from_secs(60),
        || {
            let services = services.clone();
            async move {
                let s = services.get("demo").await.map_err(|e| e.to_string())?;
                let n = s
                    .status
                    .as_ref()
                    .and_then(|st| st.load_balancer.as_ref())
                    .and_then(|lb| lb.ingress.as_ref())
                    .map_or(0, Vec::len);
                if n > 0 {
                    Ok(Some(s))
                } else {
                    Err("no IP yet".into())
                }
            }
        },
    )
    .await?;
    let ips: Vec<String> = svc
        .status
        .as_ref()
        .and_then(|st| st.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|i| i.iter().filter_map(|x| x.ip.clone()).collect())
        .unwrap_or_default();
    let pool = svc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("metallb.io/ip-allocated-from-pool"))
        .cloned()
        .unwrap_or_default();
    println!(
        "\nService {ns}/demo got {} from pool {pool} (metallb.io/ip-allocated-from-pool)",
        ips.join(" and ")
    );
    Ok((svc, ips, pool))
}

/// Namespace `ns` with two pods of `app` (`<app>-0` on node1, `<app>-1` on node2), made only
/// where an earlier demo did not leave them.
async fn namespace_with_pods(lab: &Lab, ns: &str, app: &str) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(lab.client().await?);
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(ns.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    namespaces
        .patch(
            ns,
            &PatchParams::apply("ferrolb-demo").force(),
            &Patch::Apply(&namespace),
        )
        .await?;
    let labels = BTreeMap::from([("app".to_string(), app.to_string())]);
    for (i, node) in ["node1", "node2"].iter().enumerate() {
        let name = format!("{app}-{i}");
        let running = crate::lab::State::load(&lab.dir)?
            .is_some_and(|s| s.pods.iter().any(|p| p.namespace == ns && p.name == name));
        if !running {
            lab.add_pod(ns, &name, node, &labels).await?;
        }
    }
    Ok(())
}

/// Runs `kubectl ferrolb explain service KEY` (the `ferrolb` binary, with the lab's admin
/// kubeconfig) and prints what it says. A healthy demo Service must explain without a problem;
/// the speakers' status objects may trail the traffic by a moment, so it is asked again for a
/// few seconds before that counts as a failure.
fn explain(lab: &Lab, key: &str) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let out = loop {
        let out = crate::explain::run(lab, &["explain", "service", key])?;
        if out.code == Some(0) || std::time::Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    println!("\nkubectl ferrolb explain service {key}:");
    for line in out.stdout.lines() {
        println!("  {line}");
    }
    anyhow::ensure!(
        out.code == Some(0),
        "ferrolb explain service {key} found problems or failed (exit {:?}): {}",
        out.code,
        out.stderr.trim()
    );
    Ok(())
}

/// Four requests from `host` through each of `ips`, printed; the IPs no request got through.
fn requests(lab: &Lab, host: &str, ips: &[String]) -> anyhow::Result<Vec<String>> {
    let mut unanswered = Vec::new();
    for ip in ips {
        let url = crate::lab::http_url(ip);
        let mut answered = 0;
        for _ in 0..4 {
            let out = lab.exec_output(host, "curl", &["-sS", "--max-time", "3", "-g", &url])?;
            let answer = if out.status.success() {
                answered += 1;
                String::from_utf8_lossy(&out.stdout).trim().to_string()
            } else {
                String::from_utf8_lossy(&out.stderr).trim().to_string()
            };
            println!("  curl {url:28} -> {answer}");
        }
        if answered == 0 {
            unanswered.push(ip.clone());
        }
    }
    Ok(unanswered)
}

/// Layer 2 mode.
pub(crate) async fn run_l2(lab: &Lab) -> anyhow::Result<()> {
    lab.apply(&ferrolb::l2_pool(
        "demo",
        &["198.18.200.0/28", "fd00:18::c8:0/124"],
    ))?;
    let (_, ips, _) = serve(lab, DEMO_NS, &[]).await?;

    let owner = crate::service::wait_l2_owner(lab, DEMO_NS, "demo").await?;
    let mac = lab.mac_of(&owner)?;
    println!(
        "\nOwner node: {owner} ({mac}), chosen by the speakers among the live ones without any API write;\n\
         it answers ARP and NDP for the IPs and wrote ServiceL2Status (kubectl get servicel2statuses -A)."
    );
    for ip in &ips {
        // Forget what an earlier run learnt, so the client asks the network now.
        lab.set_neighbour("client", ip, None).ok();
    }
    let owner = owner.as_str();
    let v4 = ips.iter().find(|ip| !ip.contains(':')).cloned();
    if let Some(ip) = &v4 {
        wait_for(
            &format!("kube-proxy on {owner} to program {ip}"),
            Duration::from_secs(30),
            || {
                let rules = lab
                    .exec(owner, "iptables-save", &["-t", "nat"])
                    .unwrap_or_default();
                let ok = rules.contains(ip.as_str());
                async move {
                    if ok {
                        Ok(Some(()))
                    } else {
                        Err("not yet".into())
                    }
                }
            },
        )
        .await?;
        let rules = lab.exec(owner, "iptables-save", &["-t", "nat"])?;
        let ext_chain = rules
            .lines()
            .find(|l| l.contains(&format!("-d {ip}/32")) && l.contains("-j KUBE-EXT-"))
            .and_then(|l| l.split("-j ").last())
            .map(str::to_string)
            .context("no KUBE-EXT chain for the IP")?;
        let svc_chain = ext_chain.replace("KUBE-EXT-", "KUBE-SVC-");
        println!("\nkube-proxy's path on {owner} for {ip} (iptables-save -t nat):");
        for line in rules.lines().filter(|l| {
            (l.starts_with("-A KUBE-SERVICES") && l.contains(ip.as_str()))
                || l.starts_with(&format!("-A {ext_chain} "))
                || l.starts_with(&format!("-A {svc_chain} "))
                || (l.starts_with("-A KUBE-SEP-") && l.contains("DNAT") && l.contains("demo/demo"))
        }) {
            println!("  {line}");
        }
    }
    println!(
        "\nRequests from the client host through the LoadBalancer IPs (each answer: pod name, source seen):"
    );
    let unanswered = requests(lab, "client", &ips)?;
    let neighbours = lab.exec("client", "ip", &["neigh", "show", "dev", "eth0"])?;
    println!("\nThe client's neighbour table: each IP resolves to {owner}'s MAC {mac}:");
    for line in neighbours
        .lines()
        .filter(|l| ips.iter().any(|ip| l.starts_with(&format!("{ip} "))))
    {
        println!("  {line}");
    }
    explain(lab, &format!("{DEMO_NS}/demo"))?;
    println!(
        "\nThe lab stays up: `sudo e2e/lab status`, `sudo e2e/lab kubectl get svc -A`, `sudo e2e/lab down`."
    );
    // The demo's promise is answered requests: without them it has failed, whatever it printed.
    anyhow::ensure!(
        unanswered.is_empty(),
        "no request through {} was answered (logs: {})",
        unanswered.join(" and "),
        lab.dir.join("logs").display()
    );
    println!("\ndemo: every LoadBalancer IP answered");
    Ok(())
}

/// Node addresses (decision 0024): no pool at all; a Service like k3s's traefik (ports 80 and
/// 443) gets the addresses of the nodes, as ServiceLB would give them, and the client reaches
/// it on every address and both ports; explain says why each node is listed.
async fn run_servicelb(lab: &Lab) -> anyhow::Result<()> {
    let client = lab.client().await?;
    let ns = "demo-servicelb";
    println!(
        "==> no IPAddressPool at all; ferrolb-controller runs with --node-addresses (chart: controller.nodeAddresses.enabled=true)"
    );
    println!(
        "==> two pods of app=web on node1 and node2, and a LoadBalancer Service on ports 80 and 443"
    );
    // Pools come first: where an earlier demo left one on this lab, the Service asks for node
    // addresses itself (those demos' Services keep their pool IPs, so their ports hold no node
    // address).
    let pools = lab.kubectl(&[
        "get",
        "ipaddresspools",
        "-n",
        ferrolb::NAMESPACE,
        "-o",
        "name",
    ])?;
    let annotations: &[(&str, &str)] = if pools.trim().is_empty() {
        &[]
    } else {
        println!(
            "==> an earlier demo left pools ({}): this Service asks for node addresses with ferrolb.io/node-addresses: \"true\"",
            pools.split_whitespace().collect::<Vec<_>>().join(", ")
        );
        &[("ferrolb.io/node-addresses", "true")]
    };
    namespace_with_pods(lab, ns, "web").await?;
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let svc = crate::service::lb_service("web")
        .annotations(annotations.iter().copied())
        .named_port("https", 443, 8080, "TCP")
        .ip_family_policy("PreferDualStack")
        .selector("app", "web")
        .build();
    services
        .patch(
            "web",
            &PatchParams::apply("ferrolb-demo").force(),
            &Patch::Apply(&svc),
        )
        .await?;
    let nodes = lab.topology.nodes().count();
    let ips = wait_for(
        &format!("ferrolb-controller to give Service {ns}/web the nodes' addresses"),
        Duration::from_secs(60),
        || {
            let services = services.clone();
            async move {
                let s = services.get("web").await.map_err(|e| e.to_string())?;
                let ips = crate::service::ingress_ips(&s);
                // Every node, both families.
                if ips.len() >= 2 * nodes {
                    Ok(Some(ips))
                } else {
                    Err(format!("ingress {ips:?}"))
                }
            }
        },
    )
    .await?;
    println!(
        "\nService {ns}/web got every node's address, IPv4 then IPv6, each sorted as ServiceLB sorts them:\n  {}",
        ips.join(", ")
    );
    let v4 = ips
        .iter()
        .find(|ip| !ip.contains(':'))
        .cloned()
        .context("no IPv4 address")?;
    let node = lab
        .topology
        .nodes()
        .find(|h| h.interfaces[0].ipv4.to_string() == v4)
        .map(|h| h.name.clone())
        .context("no node has the first address")?;
    wait_for(
        &format!("kube-proxy on {node} to program {v4}"),
        Duration::from_secs(30),
        || {
            let rules = lab
                .exec(&node, "iptables-save", &["-t", "nat"])
                .unwrap_or_default();
            let ok = rules.contains(&format!("-d {v4}/32"));
            async move {
                if ok {
                    Ok(Some(()))
                } else {
                    Err("not yet".into())
                }
            }
        },
    )
    .await?;
    let rules = lab.exec(&node, "iptables-save", &["-t", "nat"])?;
    println!(
        "\nkube-proxy's rules on {node} for its own address {v4} (iptables-save -t nat): the same DNAT a pool IP gets"
    );
    for line in rules
        .lines()
        .filter(|l| l.starts_with("-A KUBE-SERVICES") && l.contains(&format!("-d {v4}/32")))
    {
        println!("  {line}");
    }
    println!(
        "\nRequests from the client host to every address on both ports (each answer: pod name, source seen):"
    );
    let mut unanswered = Vec::new();
    for ip in &ips {
        for port in SERVICELB_PORTS {
            let host = if ip.contains(':') {
                format!("[{ip}]")
            } else {
                ip.clone()
            };
            let url = format!("http://{host}:{port}/");
            let answered = (0..20).any(|_| {
                let out =
                    lab.exec_output("client", "curl", &["-sS", "--max-time", "3", "-g", &url]);
                match out {
                    Ok(out) if out.status.success() => {
                        println!(
                            "  curl {url:32} -> {}",
                            String::from_utf8_lossy(&out.stdout).trim()
                        );
                        true
                    }
                    _ => {
                        std::thread::sleep(Duration::from_millis(500));
                        false
                    }
                }
            });
            if !answered {
                println!("  curl {url:32} -> no answer");
                unanswered.push(url);
            }
        }
    }
    explain(lab, &format!("{ns}/web"))?;
    println!(
        "\nThe lab stays up: `sudo e2e/lab kubectl get svc -A`, `sudo e2e/lab down`. docs/k3s.md says how a k3s cluster switches."
    );
    anyhow::ensure!(
        unanswered.is_empty(),
        "no answer from {} (logs: {})",
        unanswered.join(" and "),
        lab.dir.join("logs").display()
    );
    println!("\ndemo: every node address answered on every port");
    Ok(())
}

/// The pool, BFD profile, BGP peer and advertisement of the BGP demo: the router (AS 64500,
/// FRR with bfdd) peers with every node; BFD at 100 ms × 3 on our side (the router's 300 ms
/// profile is slower, and the slower side wins).
fn bgp_objects() -> String {
    let ns = ferrolb::NAMESPACE;
    format!(
        "apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {{name: demo-bgp, namespace: {ns}}}
spec:
  addresses: [198.18.202.0/28, 'fd00:18::ca:0/124']
  autoAssign: false
---
apiVersion: metallb.io/v1beta1
kind: BFDProfile
metadata: {{name: demo, namespace: {ns}}}
spec: {{receiveInterval: 100, transmitInterval: 100, detectMultiplier: 3}}
---
apiVersion: metallb.io/v1beta2
kind: BGPPeer
metadata: {{name: demo-router, namespace: {ns}}}
spec:
  myASN: 64512
  peerASN: 64500
  peerAddress: 198.18.0.254
  holdTime: 9s
  connectTime: 1s
  bfdProfile: demo
  # The Service's IPv6 address goes over this IPv4 session too (as in MetalLB, only with this).
  dualStackAddressFamily: true
---
apiVersion: metallb.io/v1beta1
kind: BGPAdvertisement
metadata: {{name: demo-bgp, namespace: {ns}}}
spec:
  ipAddressPools: [demo-bgp]
"
    )
}

/// One vtysh command on the lab router.
fn vtysh(lab: &Lab, command: &str) -> anyhow::Result<String> {
    crate::router::vtysh(lab, &[command])
}

/// BGP mode.
async fn run_bgp(lab: &Lab) -> anyhow::Result<()> {
    println!(
        "==> BGPPeer demo-router (AS 64500, BFDProfile demo), pool demo-bgp, BGPAdvertisement"
    );
    lab.apply(&bgp_objects())?;
    let (_, ips, _) = serve(lab, "demo-bgp", &[("metallb.io/address-pool", "demo-bgp")]).await?;
    let nodes: Vec<String> = lab.topology.nodes().map(|h| h.name.clone()).collect();
    // Every node may announce (externalTrafficPolicy Cluster): the router installs one next hop
    // per node for each IP.
    for ip in &ips {
        let (family, len) = if ip.contains(':') {
            ("-6", 128)
        } else {
            ("-4", 32)
        };
        wait_for(
            &format!("the router to install {ip} with a next hop per node"),
            Duration::from_secs(60),
            || async {
                let out = lab
                    .exec(
                        "router",
                        "ip",
                        &[family, "route", "show", &format!("{ip}/{len}")],
                    )
                    .map_err(|e| e.to_string())?;
                let hops = out.matches("nexthop").count();
                if hops >= nodes.len() {
                    Ok(Some(()))
                } else {
                    Err(format!("{hops} next hops: {out}"))
                }
            },
        )
        .await?;
    }
    wait_for(
        "the router's BFD sessions with every node to be up",
        Duration::from_secs(60),
        || async {
            let out = vtysh(lab, "show bfd peers brief").map_err(|e| e.to_string())?;
            let up = out.lines().filter(|l| l.trim_end().ends_with("up")).count();
            if up >= nodes.len() {
                Ok(Some(()))
            } else {
                Err(out)
            }
        },
    )
    .await?;
    for ip in &ips {
        let (family, len) = if ip.contains(':') {
            ("-6", 128)
        } else {
            ("-4", 32)
        };
        println!("\nThe router's kernel route for {ip} (ip {family} route), ECMP over the nodes:");
        for line in lab
            .exec(
                "router",
                "ip",
                &[family, "route", "show", &format!("{ip}/{len}")],
            )?
            .lines()
        {
            println!("  {line}");
        }
    }
    println!("\nThe router's BGP sessions (vtysh: show bgp summary):");
    for line in vtysh(lab, "show bgp ipv4 unicast summary")?
        .lines()
        // Dynamic neighbours (bgp listen range) are listed with a leading `*`.
        .filter(|l| l.trim_start_matches('*').starts_with("198.18.0.") || l.starts_with("Neighbor"))
    {
        println!("  {line}");
    }
    println!("\nThe router's BFD sessions with the nodes (vtysh: show bfd peers brief):");
    for line in vtysh(lab, "show bfd peers brief")?
        .lines()
        .filter(|l| !l.trim().is_empty())
    {
        println!("  {line}");
    }
    println!("\nRequests from the external client behind the router through the LoadBalancer IPs:");
    let unanswered = requests(lab, "ext", &ips)?;
    explain(lab, "demo-bgp/demo")?;
    println!(
        "\nThe lab stays up: `sudo e2e/lab status`, `sudo e2e/lab exec router -- ip route`, `sudo e2e/lab down`."
    );
    anyhow::ensure!(
        unanswered.is_empty(),
        "no request through {} was answered (logs: {})",
        unanswered.join(" and "),
        lab.dir.join("logs").display()
    );
    println!("\ndemo --bgp: every LoadBalancer IP answered through the router");
    Ok(())
}
