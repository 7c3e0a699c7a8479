//! ferrolb-speaker in layer 2 mode, end to end: the controller and one speaker per lab node (each
//! a process in its node's network namespace with its own ServiceAccount), a real kube-proxy on
//! every node, and the client asking ARP/NDP and sending traffic over the lab segment.
//! Tests run one at a time (they share the speakers); each works in its own namespace.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::ensure;
use ferrolb_e2e::Lab;
use ferrolb_e2e::cluster::wait_for;
use ferrolb_e2e::ferrolb::{self, Deployment};
use ferrolb_e2e::scope::TestScope;
use ferrolb_e2e::service::{ingress_ips, lb_service, wait_ips};
use ferrolb_e2e::suite::{self, Suite};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, PostParams};
use libtest_mimic::Arguments;

const NODES: [&str; 3] = ["node1", "node2", "node3"];

/// Everything a test gets: the lab, the controller and the speakers.
type Ctx = Deployment;

/// The nodes whose ServiceL2Status says they announce Service `ns/name`.
fn status_owners(lab: &Lab, ns: &str, name: &str) -> anyhow::Result<Vec<String>> {
    let out = lab.kubectl(&[
        "get",
        "servicel2statuses",
        "-n",
        ferrolb::NAMESPACE,
        "-l",
        &format!("metallb.io/service-namespace={ns},metallb.io/service-name={name}"),
        "-o",
        "jsonpath={.items[*].status.node}",
    ])?;
    Ok(out.split_whitespace().map(str::to_string).collect())
}

/// Waits until exactly one node reports announcing the Service and returns it.
async fn owner(lab: &Lab, ns: &str, name: &str) -> anyhow::Result<String> {
    wait_for(
        &format!("one speaker to announce {ns}/{name}"),
        Duration::from_secs(30),
        || async {
            let owners = status_owners(lab, ns, name).map_err(|e| e.to_string())?;
            match owners.as_slice() {
                [one] => Ok(Some(one.clone())),
                other => Err(format!("ServiceL2Status nodes: {other:?}")),
            }
        },
    )
    .await
}

/// Node name owning a MAC address.
fn node_of_mac(lab: &Lab, mac: &str) -> anyhow::Result<String> {
    for node in NODES {
        if lab.mac_of(node)?.eq_ignore_ascii_case(mac) {
            return Ok(node.to_string());
        }
    }
    anyhow::bail!("MAC {mac} is no lab node's")
}

/// Waits until exactly one MAC answers for `ip` from the client, and returns its node.
async fn answering_node(lab: &Lab, ip: &str) -> anyhow::Result<String> {
    let mac = wait_for(
        &format!("exactly one MAC to answer for {ip}"),
        Duration::from_secs(30),
        || async {
            let macs = lab.l2_answers("client", ip).map_err(|e| e.to_string())?;
            match macs.len() {
                1 => Ok(macs.into_iter().next()),
                _ => Err(format!("answers from {macs:?}")),
            }
        },
    )
    .await?;
    node_of_mac(lab, &mac)
}

/// HTTP through `ip` from the client: the answering pod and the source it saw.
fn http(lab: &Lab, ip: &str) -> anyhow::Result<(String, String)> {
    let url = ferrolb_e2e::lab::http_url(ip);
    let out = lab.exec("client", "curl", &["-sS", "--max-time", "3", "-g", &url])?;
    let mut words = out.split_whitespace();
    Ok((
        words.next().unwrap_or_default().to_string(),
        words.next().unwrap_or_default().to_string(),
    ))
}

/// The node's address on the lab segment in the family of `ip`.
fn node_address(lab: &Lab, node: &str, ip: &str) -> String {
    let host = lab.topology.host(node).unwrap();
    let iface = &host.interfaces[0];
    if ip.contains(':') {
        iface.ipv6.to_string()
    } else {
        iface.ipv4.to_string()
    }
}

/// A namespace `ns` with pods `web` on `nodes` and a dual-stack LoadBalancer Service `web` for
/// them, once it has both IPs and an endpoint on every node; returns its IPs.
async fn dual_stack_web(
    lab: &Lab,
    ns: &str,
    nodes: &[&str],
) -> anyhow::Result<(TestScope, Api<Service>, Vec<String>)> {
    let mut scope = TestScope::new(lab, ns).await?;
    scope.deploy("web", nodes).await?;
    let api: Api<Service> = Api::namespaced(lab.client().await?, &scope.namespace);
    create(
        &api,
        lb_service(
            "web",
            serde_json::json!({"spec": {"ipFamilyPolicy": "RequireDualStack", "selector": {"app": "web"}}}),
        )?,
    )
    .await?;
    let ips = ingress_ips(&wait_ips(&api, "web", 2).await?);
    scope.wait_ready_endpoints("web", nodes.len()).await?;
    Ok((scope, api, ips))
}

/// [`dual_stack_web`] with pods on every node, and its owner once it answers for every IP.
async fn owned_web(lab: &Lab, ns: &str) -> anyhow::Result<(TestScope, Vec<String>, String)> {
    let (scope, _, ips) = dual_stack_web(lab, ns, &NODES).await?;
    let owner = settled_owner(lab, &scope.namespace, &ips).await?;
    Ok((scope, ips, owner))
}

/// A lab node other than `node`.
fn other_than(node: &str) -> &'static str {
    NODES
        .iter()
        .copied()
        .find(|n| *n != node)
        .unwrap_or("node1")
}

/// The owner of Service `web` once it is the node answering for every IP of `ips` (a test that
/// follows a fault may start while the IPs are still settling, e.g. a node held back by flap
/// damping).
async fn settled_owner(lab: &Lab, ns: &str, ips: &[String]) -> anyhow::Result<String> {
    wait_for(
        "the owner in ServiceL2Status to answer for every IP",
        Duration::from_secs(60),
        || async {
            let owner = owner(lab, ns, "web").await.map_err(|e| e.to_string())?;
            for ip in ips {
                let n = answering_node(lab, ip).await.map_err(|e| e.to_string())?;
                if n != owner {
                    return Err(format!("{ip} answered by {n}, owner {owner}"));
                }
            }
            Ok(Some(owner))
        },
    )
    .await
}

/// Waits until `node` answers for every IP of `ips` again after `what`.
async fn answered_again_by(
    lab: &Lab,
    ips: &[String],
    node: &str,
    what: &str,
) -> anyhow::Result<()> {
    for ip in ips {
        wait_for(
            &format!("{node} to answer for {ip} again after {what}"),
            Duration::from_secs(30),
            || async {
                let n = answering_node(lab, ip).await.map_err(|e| e.to_string())?;
                if n == node { Ok(Some(())) } else { Err(n) }
            },
        )
        .await?;
    }
    Ok(())
}

async fn create(api: &Api<Service>, svc: Service) -> anyhow::Result<()> {
    api.create(&PostParams::default(), &svc).await?;
    Ok(())
}

/// A dual-stack Service with two pods is reachable over both families; the traffic enters at the
/// owner (the client's neighbour entry and the source the pods see, masqueraded by kube-proxy at
/// the owner) and kube-proxy's DNAT spreads it over both pods; the owner reports itself.
async fn reachable_through_the_owner(ctx: Ctx) -> anyhow::Result<()> {
    let lab = &ctx.lab;
    let mut scope = TestScope::new(lab, "l2-reach").await?;
    scope.deploy("web", &["node1", "node2"]).await?;
    let api: Api<Service> = Api::namespaced(lab.client().await?, &scope.namespace);
    create(
        &api,
        lb_service(
            "web",
            serde_json::json!({"spec": {"ipFamilyPolicy": "RequireDualStack", "selector": {"app": "web"}}}),
        )?,
    )
    .await?;
    let ips = ingress_ips(&wait_ips(&api, "web", 2).await?);
    scope.wait_ready_endpoints("web", 2).await?;
    let owner = owner(lab, &scope.namespace, "web").await?;
    for ip in &ips {
        ensure!(
            answering_node(lab, ip).await? == owner,
            "{ip}: the MAC answering is not the owner's ({owner})"
        );
        let mut pods = BTreeSet::new();
        for _ in 0..12 {
            let (pod, source) = http(lab, ip)?;
            ensure!(
                source == node_address(lab, &owner, ip),
                "{ip}: pods saw source {source}, not the owner {owner}'s address"
            );
            pods.insert(pod);
        }
        ensure!(pods.len() == 2, "{ip}: answers only from {pods:?}");
    }
    let events: Api<Event> = Api::namespaced(lab.client().await?, &scope.namespace);
    let note = wait_for("a nodeAssigned Event", Duration::from_secs(20), || async {
        let list = events
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        list.items
            .iter()
            .find(|e| e.reason.as_deref() == Some("nodeAssigned"))
            .map(|e| Some(e.note.clone().unwrap_or_default()))
            .ok_or_else(|| "none yet".to_string())
    })
    .await?;
    ensure!(
        note == format!("announcing from node \"{owner}\" with protocol \"layer2\""),
        "{note}"
    );
    // A ServiceL2Status deleted from outside while still true (as another node that briefly
    // believed it owned the Service does) is written again by the owner.
    lab.kubectl(&[
        "delete",
        "servicel2statuses",
        "-n",
        ferrolb::NAMESPACE,
        "-l",
        &format!(
            "metallb.io/service-namespace={},metallb.io/service-name=web",
            scope.namespace
        ),
    ])?;
    let restored = self::owner(lab, &scope.namespace, "web").await?;
    ensure!(
        restored == owner,
        "the ServiceL2Status came back naming {restored}, not the owner {owner}"
    );
    Ok(())
}

/// With externalTrafficPolicy Local, the owner is always a node with a serving pod.
async fn local_traffic_policy(ctx: Ctx) -> anyhow::Result<()> {
    let lab = &ctx.lab;
    let mut scope = TestScope::new(lab, "l2-local").await?;
    scope.deploy("web", &["node2"]).await?;
    let api: Api<Service> = Api::namespaced(lab.client().await?, &scope.namespace);
    for i in 0..6 {
        create(
            &api,
            lb_service(
                &format!("web-{i}"),
                serde_json::json!({"spec": {"externalTrafficPolicy": "Local", "selector": {"app": "web"}}}),
            )?,
        )
        .await?;
    }
    for i in 0..6 {
        let name = format!("web-{i}");
        let ip = ingress_ips(&wait_ips(&api, &name, 1).await?).remove(0);
        ensure!(owner(lab, &scope.namespace, &name).await? == "node2");
        ensure!(answering_node(lab, &ip).await? == "node2");
        ensure!(http(lab, &ip)?.0 == "web-0");
    }
    Ok(())
}

/// Two Services sharing an IP (different ports) are announced by one node.
async fn shared_ip_one_node(ctx: Ctx) -> anyhow::Result<()> {
    let lab = &ctx.lab;
    let mut scope = TestScope::new(lab, "l2-shared").await?;
    scope.deploy("web", &["node1", "node3"]).await?;
    let api: Api<Service> = Api::namespaced(lab.client().await?, &scope.namespace);
    for (name, port) in [("a", 80), ("b", 81)] {
        create(
            &api,
            lb_service(
                name,
                serde_json::json!({
                    "metadata": {"annotations": {"metallb.io/allow-shared-ip": "k", "metallb.io/loadBalancerIPs": "198.18.200.77"}},
                    "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": port, "targetPort": 8080, "protocol": "TCP"}]}
                }),
            )?,
        )
        .await?;
    }
    wait_ips(&api, "a", 1).await?;
    wait_ips(&api, "b", 1).await?;
    let a = owner(lab, &scope.namespace, "a").await?;
    let b = owner(lab, &scope.namespace, "b").await?;
    ensure!(a == b, "shared IP announced by {a} and {b}");
    ensure!(answering_node(lab, "198.18.200.77").await? == a);
    Ok(())
}

/// Twenty Services land on all three nodes, each IP answered by exactly its owner.
async fn twenty_services_spread(ctx: Ctx) -> anyhow::Result<()> {
    let lab = &ctx.lab;
    let mut scope = TestScope::new(lab, "l2-spread").await?;
    scope.deploy("web", &["node1"]).await?;
    let api: Api<Service> = Api::namespaced(lab.client().await?, &scope.namespace);
    for i in 0..20 {
        create(
            &api,
            lb_service(
                &format!("s{i}"),
                serde_json::json!({"spec": {"selector": {"app": "web"}}}),
            )?,
        )
        .await?;
    }
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..20 {
        let name = format!("s{i}");
        let ip = ingress_ips(&wait_ips(&api, &name, 1).await?).remove(0);
        let owner = owner(lab, &scope.namespace, &name).await?;
        ensure!(answering_node(lab, &ip).await? == owner, "{ip}");
        *per_node.entry(owner).or_default() += 1;
    }
    ensure!(
        per_node.len() == 3,
        "20 Services on {per_node:?}, not on all 3 nodes"
    );
    println!("    owners: {per_node:?}");
    Ok(())
}

/// An advertisement's node selector and interface list decide where an IP may go.
async fn node_selectors_and_interfaces(ctx: Ctx) -> anyhow::Result<()> {
    let lab = &ctx.lab;
    lab.apply(
        "apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: only-node3, namespace: metallb-system}
spec:
  addresses: [198.18.200.128/28]
---
apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {name: only-node3, namespace: metallb-system}
spec:
  ipAddressPools: [only-node3]
  nodeSelectors: [{matchLabels: {kubernetes.io/hostname: node3}}]
  interfaces: [eth0]
---
apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: no-such-interface, namespace: metallb-system}
spec:
  addresses: [198.18.200.144/28]
---
apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {name: no-such-interface, namespace: metallb-system}
spec:
  ipAddressPools: [no-such-interface]
  interfaces: [eth9]
",
    )?;
    let result = async {
        let mut scope = TestScope::new(lab, "l2-select").await?;
        scope.deploy("web", &["node1"]).await?;
        let api: Api<Service> = Api::namespaced(lab.client().await?, &scope.namespace);
        for i in 0..4 {
            create(
                &api,
                lb_service(
                    &format!("n3-{i}"),
                    serde_json::json!({"metadata": {"annotations": {"metallb.io/address-pool": "only-node3"}},
                                       "spec": {"selector": {"app": "web"}}}),
                )?,
            )
            .await?;
        }
        create(
            &api,
            lb_service(
                "eth9",
                serde_json::json!({"metadata": {"annotations": {"metallb.io/address-pool": "no-such-interface"}},
                                   "spec": {"selector": {"app": "web"}}}),
            )?,
        )
        .await?;
        for i in 0..4 {
            let name = format!("n3-{i}");
            let ip = ingress_ips(&wait_ips(&api, &name, 1).await?).remove(0);
            ensure!(owner(lab, &scope.namespace, &name).await? == "node3");
            ensure!(answering_node(lab, &ip).await? == "node3");
        }
        let ip = ingress_ips(&wait_ips(&api, "eth9", 1).await?).remove(0);
        // No node has eth9: nobody may answer, and nobody claims the Service.
        tokio::time::sleep(Duration::from_secs(2)).await;
        ensure!(lab.l2_answers("client", &ip)?.is_empty(), "someone answers {ip}");
        ensure!(status_owners(lab, &scope.namespace, "eth9")?.is_empty());
        anyhow::Ok(())
    }
    .await;
    for kind in ["l2advertisement", "ipaddresspool"] {
        for name in ["only-node3", "no-such-interface"] {
            let _ = lab.kubectl(&[
                "delete",
                kind,
                name,
                "-n",
                ferrolb::NAMESPACE,
                "--wait=false",
            ]);
        }
    }
    result
}

/// Failover: the owner's link is cut, then separately its speaker is killed; each time another
/// node answers and the Service stays reachable; afterwards the owner takes its IP back.
async fn failover(ctx: Ctx) -> anyhow::Result<()> {
    let lab = &ctx.lab;
    let (_scope, ips, first) = owned_web(lab, "l2-failover").await?;

    // The link, cut from the bridge side; the speaker, SIGKILLed without a goodbye; then a
    // clean stop, which hands over before exiting.
    let first_node = first.as_str();
    let fault = |what: &str, on: bool| -> anyhow::Result<()> {
        match (what, on) {
            ("its link is down", true) => lab.set_link(first_node, false),
            ("its link is down", false) => lab.set_link(first_node, true),
            ("its speaker was killed", true) => {
                ctx.speakers.kill(first_node);
                Ok(())
            }
            ("its speaker stopped", true) => {
                ctx.speakers.stop(first_node);
                Ok(())
            }
            _ => ctx.speakers.start(first_node),
        }
    };
    for what in [
        "its link is down",
        "its speaker was killed",
        "its speaker stopped",
    ] {
        fault(what, true)?;
        let outcome = async {
            for ip in &ips {
                let now = answering_node(lab, ip).await?;
                ensure!(now != first, "{ip} still answered by {first} when {what}");
                // With the link down, kube-proxy elsewhere may still pick the pod behind it:
                // that is the endpoints' business, not the announcement's.
                if what != "its link is down" {
                    http(lab, ip)?;
                }
            }
            anyhow::Ok(())
        }
        .await;
        fault(what, false)?;
        outcome?;
        answered_again_by(lab, &ips, &first, what).await?;
    }
    Ok(())
}

/// Heartbeat loss on one node, the commonest partial fault (a host firewall, a security group):
/// UDP 7946 dropped on a node that does not own the IPs, on the owner, and one way only. After
/// detection exactly one MAC answers ARP and NDP for every IP, requests are served, and once
/// the fault is removed the IPs settle back on their owner. The isolated node must never claim
/// the IPs (before the quorum rule it claimed every one of them).
async fn heartbeats_blocked_on_one_node(ctx: Ctx) -> anyhow::Result<()> {
    let lab = &ctx.lab;
    let (_scope, ips, first) = owned_web(lab, "l2-heartbeats-blocked").await?;
    let other = other_than(&first);
    // The speakers' heartbeat port (their default, as MetalLB's memberlist).
    let port = "7946";
    // (what, node, chains): INPUT drops what the node hears, OUTPUT what it sends.
    let faults: [(&str, &str, &[&str]); 4] = [
        (
            "a non-owner's heartbeats blocked both ways",
            other,
            &["INPUT", "OUTPUT"],
        ),
        (
            "the owner's heartbeats blocked both ways",
            first.as_str(),
            &["INPUT", "OUTPUT"],
        ),
        ("the owner hears no heartbeat", first.as_str(), &["INPUT"]),
        (
            "the owner's heartbeats are not heard",
            first.as_str(),
            &["OUTPUT"],
        ),
    ];
    for (what, node, chains) in faults {
        // Heartbeats go from port 7946 to port 7946 both ways.
        let rule = |op: &str, chain: &str| {
            lab.exec(
                node,
                "iptables",
                &[op, chain, "-p", "udp", "--dport", port, "-j", "DROP"],
            )
        };
        for chain in chains {
            rule("-I", chain)?;
        }
        let outcome = async {
            // Detection: the failure timeout (500 ms) and a heartbeat's round.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let mut most = 0usize;
            for _ in 0..5 {
                for ip in &ips {
                    let macs = lab.l2_answers("client", ip)?;
                    most = most.max(macs.len());
                    ensure!(
                        macs.len() == 1,
                        "{what}: {ip} answered by {} MACs ({macs:?})",
                        macs.len()
                    );
                    if what.starts_with("a non-owner") {
                        ensure!(
                            node_of_mac(lab, macs.iter().next().map_or("", String::as_str))?
                                == first,
                            "{what}: {ip} moved away from {first}"
                        );
                    } else {
                        ensure!(
                            node_of_mac(lab, macs.iter().next().map_or("", String::as_str))?
                                != first,
                            "{what}: {ip} still answered by {first}, which is cut off"
                        );
                    }
                    http(lab, ip)?;
                }
            }
            eprintln!(
                "l2 partial fault: {what}: most MACs answering one IP after detection: {most}"
            );
            anyhow::Ok(())
        }
        .await;
        for chain in chains {
            rule("-D", chain)?;
        }
        outcome?;
        answered_again_by(lab, &ips, &first, what).await?;
    }
    Ok(())
}

/// A share of the heartbeats one node sends (UDP to port 7946, both families) dropped at random
/// (iptables' statistic match: the lab's kernel has no netem); removed on drop.
struct HeartbeatLoss<'a> {
    lab: &'a Lab,
    node: String,
    rules: Vec<(&'static str, Vec<String>)>,
}

impl<'a> HeartbeatLoss<'a> {
    fn add(lab: &'a Lab, node: &str, probability: &str) -> anyhow::Result<Self> {
        let mut loss = Self {
            lab,
            node: node.to_string(),
            rules: Vec::new(),
        };
        for tables in ["iptables", "ip6tables"] {
            let rule: Vec<String> = [
                "OUTPUT",
                "-p",
                "udp",
                "--dport",
                "7946",
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                probability,
                "-j",
                "DROP",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            let mut insert = vec!["-I".to_string()];
            insert.extend(rule.iter().cloned());
            let args: Vec<&str> = insert.iter().map(String::as_str).collect();
            lab.exec(node, tables, &args)?;
            loss.rules.push((tables, rule));
        }
        Ok(loss)
    }
}

impl Drop for HeartbeatLoss<'_> {
    fn drop(&mut self) {
        for (tables, rule) in &self.rules {
            let mut args = vec!["-D"];
            args.extend(rule.iter().map(String::as_str));
            let _ = self.lab.exec(&self.node, tables, &args);
        }
    }
}

/// Sends `count` junk datagrams to `address`:7946 from the host over the lab's bridge: random
/// bytes of random lengths, some starting like a heartbeat (`FLB` and a version byte), spread over
/// about `over`.
fn junk_flood(address: std::net::IpAddr, count: usize, over: Duration) -> anyhow::Result<()> {
    use std::hash::{BuildHasher, Hasher};
    let bind: std::net::SocketAddr = if address.is_ipv4() {
        "0.0.0.0:0".parse()?
    } else {
        "[::]:0".parse()?
    };
    let socket = std::net::UdpSocket::bind(bind)?;
    let seed = std::collections::hash_map::RandomState::new();
    let word = |i: u64| {
        let mut h = seed.build_hasher();
        h.write_u64(i);
        h.finish()
    };
    let pause = over / u32::try_from(count.max(1)).unwrap_or(u32::MAX);
    for i in 0..count {
        let len = 1 + (word(i as u64) % 1400) as usize;
        let mut datagram: Vec<u8> = (0..len)
            .map(|j| word((i * 2000 + j) as u64) as u8)
            .collect();
        if i % 3 == 0 && len > 4 {
            datagram[..4].copy_from_slice(b"FLB\x02");
        }
        socket.send_to(&datagram, (address, 7946))?;
        if i % 100 == 0 {
            std::thread::sleep(pause * 100);
        }
    }
    Ok(())
}

/// 80 % of one node's heartbeats lost (the owner's, a non-owner's), and a flood of junk at every
/// node's heartbeat port: never more than one MAC answers an IP, and once healed the owner answers
/// again. Losing the owner's heartbeats may cost it its IPs for a while (the others stop hearing
/// it; flap damping keeps them from bouncing back and forth); the junk costs nothing.
async fn heartbeats_lossy_or_flooded(ctx: Ctx) -> anyhow::Result<()> {
    let lab = &ctx.lab;
    let (_scope, ips, first) = owned_web(lab, "l2-heartbeats-lossy").await?;
    let other = other_than(&first);
    let faults: [(&str, &str, &str); 3] = [
        ("80 % of the owner's heartbeats lost", first.as_str(), "0.8"),
        ("80 % of a non-owner's heartbeats lost", other, "0.8"),
        ("junk datagrams at the heartbeat port of every node", "", ""),
    ];
    for (what, node, loss) in faults {
        let started = std::time::Instant::now();
        let (mut most, mut served, mut failed, mut rounds) = (0usize, 0usize, 0usize, 0usize);
        // IP moves during the fault: changes of the node answering the first IP.
        let (mut moves, mut last) = (0usize, first.clone());
        let outcome = async {
            let _fault = if loss.is_empty() {
                None
            } else {
                Some(HeartbeatLoss::add(lab, node, loss)?)
            };
            let flood = loss.is_empty().then(|| {
                let targets: Vec<std::net::IpAddr> = NODES
                    .iter()
                    .map(|n| lab.topology.host(n).unwrap().interfaces[0].ipv4.into())
                    .collect();
                std::thread::spawn(move || -> anyhow::Result<()> {
                    for target in targets {
                        junk_flood(target, 20_000, Duration::from_secs(3))?;
                    }
                    Ok(())
                })
            });
            // Detection (the failure timeout, 500 ms, and a heartbeat's round), then 8 s of
            // the fault, asking ARP and NDP and sending a request for every IP.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            while started.elapsed() < Duration::from_secs(10) {
                rounds += 1;
                for (i, ip) in ips.iter().enumerate() {
                    let macs = lab.l2_answers("client", ip)?;
                    most = most.max(macs.len());
                    // Known gap (issue #13): under heavy loss of the owner's own heartbeats, the
                    // owner learns that a majority stopped hearing it up to a heartbeat interval
                    // after a peer took over, and both may answer for that moment. Measured and
                    // printed here, asserted for the other faults; the fix (owners stop by the
                    // peers' acknowledged deadlines) is designed in decision 0015.
                    ensure!(
                        macs.len() <= 1 || what.starts_with("80 % of the owner's"),
                        "{what}: {ip} answered by {macs:?}"
                    );
                    if i == 0
                        && let Some(mac) = macs.iter().next()
                    {
                        let node = node_of_mac(lab, mac)?;
                        if node != last {
                            moves += 1;
                            last = node;
                        }
                    }
                    match http(lab, ip) {
                        Ok(_) => served += 1,
                        Err(_) => failed += 1,
                    }
                }
            }
            if let Some(flood) = flood {
                flood
                    .join()
                    .map_err(|_| anyhow::anyhow!("the flood panicked"))??;
                // Junk must cost nothing: the owner kept its IPs.
                for ip in &ips {
                    ensure!(
                        answering_node(lab, ip).await? == first,
                        "{what}: {ip} moved away from {first}"
                    );
                }
                ensure!(failed == 0, "{what}: {failed} requests failed");
            }
            anyhow::Ok(())
        }
        .await;
        eprintln!(
            "l2 partial fault: {what}: most MACs answering one IP: {most}; {rounds} rounds, requests served {served}, failed {failed}; IP moves during the fault {moves}"
        );
        outcome?;
        answered_again_by(lab, &ips, &first, what).await?;
        for ip in &ips {
            let macs = lab.l2_answers("client", ip)?;
            ensure!(macs.len() == 1, "after {what}: {ip} answered by {macs:?}");
        }
    }
    Ok(())
}

/// An owner whose speaker is frozen (SIGSTOP) for 5 s, as a stalled VM or a stuck process: the
/// others take its IPs over, and when it resumes it answers nothing from its old ownership,
/// not even the ARP requests that queued while it was frozen, until it has heard the others
/// and the IPs are given back to it.
async fn frozen_owner_resumes_without_a_second_answer(ctx: Ctx) -> anyhow::Result<()> {
    let lab = &ctx.lab;
    let (_scope, ips, first) = owned_web(lab, "l2-frozen-owner").await?;
    ctx.speakers.freeze(&first, true)?;
    let outcome = async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        for ip in &ips {
            let macs = lab.l2_answers("client", ip)?;
            ensure!(macs.len() == 1, "frozen owner: {ip} answered by {macs:?}");
            let node = node_of_mac(lab, macs.iter().next().map_or("", String::as_str))?;
            ensure!(node != first, "{ip} still answered by the frozen {first}");
        }
        tokio::time::sleep(Duration::from_millis(3000)).await;
        // Ask while the owner is still frozen (its socket queues the requests), and resume it
        // while the client is still collecting answers.
        let askers: Vec<_> = ips
            .iter()
            .map(|ip| {
                let lab = lab.clone();
                let ip = ip.clone();
                std::thread::spawn(move || lab.l2_answers("client", &ip))
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(150)).await;
        ctx.speakers.freeze(&first, false)?;
        for (ip, asker) in ips.iter().zip(askers) {
            let macs = asker
                .join()
                .map_err(|_| anyhow::anyhow!("asker panicked"))??;
            ensure!(
                macs.len() <= 1,
                "{ip} answered by {macs:?} as the frozen owner resumed"
            );
        }
        for _ in 0..3 {
            for ip in &ips {
                let macs = lab.l2_answers("client", ip)?;
                ensure!(
                    macs.len() <= 1,
                    "{ip} answered by {macs:?} after the resume"
                );
            }
        }
        anyhow::Ok(())
    }
    .await;
    // Never leave a frozen speaker behind.
    let _ = ctx.speakers.freeze(&first, false);
    outcome?;
    answered_again_by(lab, &ips, &first, "its freeze").await?;
    Ok(())
}

/// How long the API server stays down in [`control_plane_outages`]
/// (`FERROLB_API_OUTAGE_SECONDS`, default 60; etcd stays down a third of it).
fn api_outage() -> Duration {
    Duration::from_secs(
        std::env::var("FERROLB_API_OUTAGE_SECONDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(60),
    )
}

/// Starts a stopped lab component again when dropped, should the test fail while it is down.
struct StartAgain<'a> {
    lab: &'a Lab,
    name: &'static str,
    started: bool,
}

impl StartAgain<'_> {
    fn now(&mut self) -> anyhow::Result<()> {
        self.started = true;
        self.lab.restart(self.name)?;
        Ok(())
    }
}

impl Drop for StartAgain<'_> {
    fn drop(&mut self) {
        if !self.started {
            let _ = self.lab.restart(self.name);
        }
    }
}

/// The API server stopped (etcd kept) and started again, then etcd: the client's requests are
/// served throughout by one MAC per IP, no IP or owner changes, and after each outage the
/// controller and the speakers carry on by themselves (their watches relist): a new Service gets
/// an IP and is announced.
async fn control_plane_outages(ctx: Ctx) -> anyhow::Result<()> {
    let lab = &ctx.lab;
    let (scope, _, ips) = dual_stack_web(lab, "l2-api-outage", &["node1", "node2"]).await?;
    let first = settled_owner(lab, &scope.namespace, &ips).await?;
    for (component, outage) in [("kube-apiserver", api_outage()), ("etcd", api_outage() / 3)] {
        let mut back = StartAgain {
            lab,
            name: component,
            started: false,
        };
        lab.stop_keeping(component)?;
        let started = std::time::Instant::now();
        let (mut served, mut failed) = (0usize, Vec::new());
        while started.elapsed() < outage {
            for ip in &ips {
                match http(lab, ip) {
                    Ok(_) => served += 1,
                    Err(e) => failed.push(format!("{:.1?} {ip}: {e:#}", started.elapsed())),
                }
                let macs = lab.l2_answers("client", ip)?;
                ensure!(
                    macs.len() == 1,
                    "{ip} answered by {macs:?} with {component} down"
                );
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        back.now()?;
        let restarted = std::time::Instant::now();
        eprintln!(
            "control-plane outage: {component} down {outage:?}: {served} requests served, {} failed",
            failed.len()
        );
        ensure!(
            failed.is_empty(),
            "requests failed with {component} down: {failed:?}"
        );
        // Back: the controller and the speakers carry on by themselves.
        let api: Api<Service> = wait_for(
            &format!("the API server to serve again after the {component} outage"),
            Duration::from_secs(90),
            || async {
                let client = lab.client().await.map_err(|e| e.to_string())?;
                let services: Api<Service> = Api::namespaced(client, &scope.namespace);
                services
                    .list(&ListParams::default())
                    .await
                    .map(|_| Some(services.clone()))
                    .map_err(|e| e.to_string())
            },
        )
        .await?;
        let name = format!("after-{component}");
        // Right after it starts, the API server may refuse to create a Service for a few
        // seconds ("failed to allocate a serviceIP: range is full" until its ClusterIP
        // allocator has synced): retry as any client would.
        let svc = lb_service(
            &name,
            serde_json::json!({"spec": {"selector": {"app": "web"}}}),
        )?;
        wait_for(
            &format!("the API server to create Service {name}"),
            Duration::from_secs(60),
            || async {
                match api.create(&PostParams::default(), &svc).await {
                    Ok(_) => Ok(Some(())),
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(Some(())),
                    Err(e) => Err(e.to_string()),
                }
            },
        )
        .await?;
        wait_ips(&api, &name, 1).await?;
        ensure!(
            ingress_ips(&api.get("web").await?) == ips,
            "web's IPs changed across the {component} outage"
        );
        // The IPs that were served before are served again at once. A new Service is served
        // only once kube-controller-manager has written its EndpointSlices, and after an API
        // server restart the lab's kube-controller-manager took from one to several minutes
        // (its own workqueue backoff): that is not ferrolb's to measure, so the new Service is
        // checked for its IP (above) and not for traffic.
        for ip in &ips {
            wait_for(
                &format!("{ip} served after the {component} outage"),
                Duration::from_secs(30),
                || async {
                    http(lab, ip)
                        .map(|_| Some(()))
                        .map_err(|e| format!("{e:#}"))
                },
            )
            .await?;
            let macs = lab.l2_answers("client", ip)?;
            ensure!(
                macs.len() == 1,
                "{ip} answered by {macs:?} after the {component} outage"
            );
        }
        eprintln!(
            "control-plane outage: {component} back; served again and a new Service allocated {:.1?} after the restart",
            restarted.elapsed()
        );
        ensure!(
            owner(lab, &scope.namespace, "web").await? == first,
            "the owner of web changed across the {component} outage"
        );
    }
    Ok(())
}

/// The owner's metrics count requests and answers for its IPs; health and readiness answer.
async fn metrics_and_health(ctx: Ctx) -> anyhow::Result<()> {
    let lab = &ctx.lab;
    let mut scope = TestScope::new(lab, "l2-metrics").await?;
    scope.deploy("web", &["node1"]).await?;
    let api: Api<Service> = Api::namespaced(lab.client().await?, &scope.namespace);
    create(
        &api,
        lb_service(
            "web",
            serde_json::json!({"spec": {"selector": {"app": "web"}}}),
        )?,
    )
    .await?;
    let ip = ingress_ips(&wait_ips(&api, "web", 1).await?).remove(0);
    let owner = owner(lab, &scope.namespace, "web").await?;
    answering_node(lab, &ip).await?;
    let get = |path: &str| {
        lab.exec(
            &owner,
            "curl",
            &[
                "-sS",
                "--max-time",
                "3",
                &format!("http://127.0.0.1:7472{path}"),
            ],
        )
    };
    ensure!(get("/healthz")?.trim() == "ok");
    ensure!(get("/readyz")?.trim() == "ok");
    let metrics = get("/metrics")?;
    for needle in [
        format!(
            "metallb_speaker_announced{{service=\"{}/web\",protocol=\"layer2\",node=\"{owner}\",ip=\"{ip}\"}} 1",
            scope.namespace
        ),
        format!("metallb_layer2_requests_received_total{{ip=\"{ip}\"}}"),
        format!("metallb_layer2_responses_sent_total{{ip=\"{ip}\"}}"),
        format!("metallb_layer2_gratuitous_sent_total{{ip=\"{ip}\"}}"),
        "ferrolb_speaker_peers_alive 2".to_string(),
    ] {
        ensure!(metrics.contains(&needle), "/metrics lacks {needle}");
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args = Arguments::from_args();
    // The tests share the speakers and cut links: one at a time.
    let conclusion = Suite::new("l2")
        .one_at_a_time()
        .test("reachable_through_the_owner", |c| {
            Box::pin(reachable_through_the_owner(c))
        })
        .test("local_traffic_policy", |c| {
            Box::pin(local_traffic_policy(c))
        })
        .test("shared_ip_one_node", |c| Box::pin(shared_ip_one_node(c)))
        .test("twenty_services_spread", |c| {
            Box::pin(twenty_services_spread(c))
        })
        .test("node_selectors_and_interfaces", |c| {
            Box::pin(node_selectors_and_interfaces(c))
        })
        .test("failover", |c| Box::pin(failover(c)))
        .test("heartbeats_blocked_on_one_node", |c| {
            Box::pin(heartbeats_blocked_on_one_node(c))
        })
        .test("heartbeats_lossy_or_flooded", |c| {
            Box::pin(heartbeats_lossy_or_flooded(c))
        })
        .test("frozen_owner_resumes_without_a_second_answer", |c| {
            Box::pin(frozen_owner_resumes_without_a_second_answer(c))
        })
        .test("api_server_and_etcd_outages_keep_traffic_and_ips", |c| {
            Box::pin(control_plane_outages(c))
        })
        .test("metrics_and_health", |c| Box::pin(metrics_and_health(c)))
        .run(&args, |lab| {
            // The suite's pool; tests that need more add their own and remove them.
            Box::pin(async move {
                Deployment::start(
                    &lab,
                    "l2",
                    &ferrolb::l2_pool("l2", &["198.18.200.0/25", "fd00:18::c8:0/113"]),
                )
            })
        });
    suite::exit_code(&[conclusion])
}
