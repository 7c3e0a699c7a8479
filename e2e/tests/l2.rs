//! ferrolb-speaker in layer 2 mode, end to end: the controller and one speaker per lab node (each
//! a process in its node's network namespace with its own ServiceAccount), a real kube-proxy on
//! every node, and the client asking ARP/NDP and sending traffic over the lab segment.
//! Tests run one at a time (they share the speakers); each works in its own namespace.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, ensure};
use ferrolb_e2e::Lab;
use ferrolb_e2e::cluster::wait_for;
use ferrolb_e2e::faults::{HeartbeatDelay, HeartbeatFault};
use ferrolb_e2e::ferrolb::{self, Deployment};
use ferrolb_e2e::probe::Held;
use ferrolb_e2e::scope::TestScope;
use ferrolb_e2e::service::{ingress_ips, lb_service, wait_ips};
use ferrolb_e2e::suite::{self, Suite};
use ferrolb_layer2::damping::Damping;
use ferrolb_layer2::voters::VoterConfig;
use ferrolb_testkit::objects::service;
use ferrolb_testkit::trial::Arguments;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, PostParams};

const NODES: [&str; 3] = ["node1", "node2", "node3"];

/// Everything a test gets: the lab, the controller and the speakers.
type Ctx = Deployment;

/// The nodes whose ServiceL2Status says they announce Service `ns/name`.
fn status_owners(lab: &Lab, ns: &str, name: &str) -> anyhow::Result<Vec<String>> {
    ferrolb::l2_status_nodes(
        lab,
        &format!("metallb.io/service-namespace={ns},metallb.io/service-name={name}"),
    )
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

/// Waits until exactly one MAC answers for `ip` from the client, and returns its node.
async fn answering_node(lab: &Lab, ip: &str) -> anyhow::Result<String> {
    lab.answering_node("client", ip).await
}

/// HTTP through `ip` from the client: the answering pod and the source it saw.
fn http(lab: &Lab, ip: &str) -> anyhow::Result<(String, String)> {
    lab.http_from("client", ip)
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
        lb_service("web")
            .ip_family_policy("RequireDualStack")
            .selector("app", "web")
            .build(),
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

/// Waits until `node` answers for every IP of `ips` again after `what`. A node that flapped
/// through a fault is held back by flap damping for up to its longest hold-down, so the wait
/// allows that and a quarter minute more for the claim and the answers.
async fn answered_again_by(
    lab: &Lab,
    ips: &[String],
    node: &str,
    what: &str,
) -> anyhow::Result<()> {
    let longest = Damping::MAX_HOLD + Duration::from_secs(15);
    for ip in ips {
        wait_for(
            &format!("{node} to answer for {ip} again after {what}"),
            longest,
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
        lb_service("web")
            .ip_family_policy("RequireDualStack")
            .selector("app", "web")
            .build(),
    )
    .await?;
    let ips = ingress_ips(&wait_ips(&api, "web", 2).await?);
    scope.wait_ready_endpoints("web", 2).await?;
    // The first test of the suite starts while the speakers still settle after their start:
    // the owner is the one ServiceL2Status names once that node answers for every IP.
    let owner = settled_owner(lab, &scope.namespace, &ips).await?;
    for ip in &ips {
        let mut pods = BTreeSet::new();
        for _ in 0..12 {
            let (pod, source) = http(lab, ip)?;
            // kube-proxy masquerades at the owner with the address of the link towards the pod:
            // the owner's own for a pod elsewhere; for a pod on the owner itself, over IPv4, the
            // lab's routed pod link address (e2e/src/lab/pods.rs).
            let on_owner =
                (pod == "web-0" && owner == "node1") || (pod == "web-1" && owner == "node2");
            ensure!(
                source == node_address(lab, &owner, ip)
                    || (on_owner && !ip.contains(':') && source == "169.254.1.1"),
                "{ip}: pod {pod} saw source {source}, not the owner {owner}'s address"
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
            lb_service(&format!("web-{i}"))
                .external_traffic_policy("Local")
                .selector("app", "web")
                .build(),
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
            service(name)
                .annotations([
                    ("metallb.io/allow-shared-ip", "k"),
                    ("metallb.io/loadBalancerIPs", "198.18.200.77"),
                ])
                .selector("app", "web")
                .named_port("http", port, 8080, "TCP")
                .build(),
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
            lb_service(&format!("s{i}")).selector("app", "web").build(),
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
                lb_service(&format!("n3-{i}"))
                    .annotation("metallb.io/address-pool", "only-node3")
                    .selector("app", "web")
                    .build(),
            )
            .await?;
        }
        create(
            &api,
            lb_service("eth9")
                .annotation("metallb.io/address-pool", "no-such-interface")
                .selector("app", "web")
                .build(),
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
        ensure!(
            lab.l2_answers("client", &ip)?.is_empty(),
            "someone answers {ip}"
        );
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

/// Issue #40: an IP move costs the new owner no list of ServiceL2Status (a list makes the API
/// server scan every Service's objects, at every move): the new owner deletes the object of the
/// owner it took the Service from by name. Twelve Services; the speaker owning the most is
/// killed without a goodbye, so it cannot delete its own objects; every Service it owned moves
/// and keeps exactly one ServiceL2Status, the new owner's, with no LIST of them meanwhile.
async fn a_move_lists_no_status_objects(ctx: Ctx) -> anyhow::Result<()> {
    let lab = &ctx.lab;
    let mut scope = TestScope::new(lab, "l2-move-cost").await?;
    scope.deploy("web", &["node1"]).await?;
    let client = lab.client().await?;
    let api: Api<Service> = Api::namespaced(client.clone(), &scope.namespace);
    let names: Vec<String> = (0..12).map(|i| format!("s{i}")).collect();
    for name in &names {
        create(&api, lb_service(name).selector("app", "web").build()).await?;
    }
    let mut owners: BTreeMap<String, String> = BTreeMap::new();
    for name in &names {
        let ips = ingress_ips(&wait_ips(&api, name, 1).await?);
        // Settled: the owner its ServiceL2Status names is the node answering for its IP. Just
        // after the speakers start, a Service may still move (a speaker's claim delay), and
        // a status object read then names an owner the speakers' plans have already left.
        let settled = wait_for(
            &format!("{name}'s ServiceL2Status owner to answer for {ips:?}"),
            Duration::from_secs(60),
            || async {
                let o = owner(lab, &scope.namespace, name)
                    .await
                    .map_err(|e| e.to_string())?;
                for ip in &ips {
                    let n = answering_node(lab, ip).await.map_err(|e| e.to_string())?;
                    if n != o {
                        return Err(format!("{ip} answered by {n}, ServiceL2Status names {o}"));
                    }
                }
                Ok(Some(o))
            },
        )
        .await?;
        owners.insert(name.clone(), settled);
    }
    let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
    for o in owners.values() {
        *per_node.entry(o.as_str()).or_default() += 1;
    }
    let victim = per_node
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(node, _)| node.to_string())
        .context("no owner")?;
    let moved: Vec<&String> = owners
        .iter()
        .filter(|(_, o)| **o == victim)
        .map(|(n, _)| n)
        .collect();
    // The API server's counters tell every client's requests apart only by verb: the test
    // itself lists no ServiceL2Status between the two readings (status_owners would).
    let key = |verb: &str| (verb.to_string(), "metallb.io/servicel2statuses".to_string());
    let count = |r: &ferrolb_e2e::apiserver_metrics::Requests, verb: &str| {
        r.get(&key(verb)).copied().unwrap_or(0.0)
    };
    let before = ferrolb_e2e::apiserver_metrics::requests(&client).await?;
    ctx.speakers.kill(&victim);
    let outcome = async {
        let after = wait_for(
            &format!(
                "the new owners to delete {victim}'s {} objects",
                moved.len()
            ),
            Duration::from_secs(30),
            || async {
                let now = ferrolb_e2e::apiserver_metrics::requests(&client)
                    .await
                    .map_err(|e| e.to_string())?;
                let deletes = count(&now, "DELETE") - count(&before, "DELETE");
                if deletes >= moved.len() as f64 {
                    Ok(Some(now))
                } else {
                    Err(format!("{deletes} deletes"))
                }
            },
        )
        .await?;
        let lists = count(&after, "LIST") - count(&before, "LIST");
        println!(
            "    {} Services moved off {victim}: {lists} lists and {} deletes of ServiceL2Status",
            moved.len(),
            count(&after, "DELETE") - count(&before, "DELETE"),
        );
        ensure!(
            lists == 0.0,
            "{lists} lists of ServiceL2Status for {} moves",
            moved.len()
        );
        for name in &moved {
            let now = status_owners(lab, &scope.namespace, name)?;
            ensure!(
                now.len() == 1 && now[0] != victim,
                "{name}: ServiceL2Status nodes {now:?} after it moved off {victim}"
            );
        }
        anyhow::Ok(())
    }
    .await;
    ctx.speakers.start(&victim)?;
    outcome?;
    // Back after flap damping, it owns its Services again, each with one ServiceL2Status.
    for name in &moved {
        wait_for(
            &format!("{victim} to own {name} again"),
            Damping::MAX_HOLD + Duration::from_secs(15),
            || async {
                let now = status_owners(lab, &scope.namespace, name).map_err(|e| e.to_string())?;
                match now.as_slice() {
                    [one] if *one == victim => Ok(Some(())),
                    other => Err(format!("ServiceL2Status nodes: {other:?}")),
                }
            },
        )
        .await?;
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
        let blocked = HeartbeatFault::block(lab, node, chains)?;
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
                            lab.node_of_mac(macs.iter().next().map_or("", String::as_str))?
                                == first,
                            "{what}: {ip} moved away from {first}"
                        );
                    } else {
                        ensure!(
                            lab.node_of_mac(macs.iter().next().map_or("", String::as_str))?
                                != first,
                            "{what}: {ip} still answered by {first}, which is cut off"
                        );
                    }
                    http(lab, ip)?;
                }
            }
            // `/readyz` is honest about it: the cut-off node says why it is not ready (its
            // pod would be NotReady, holding a rolling update), the others stay ready.
            for n in NODES {
                let (code, body) = ferrolb::speaker_readyz(lab, n)?;
                if n == node {
                    ensure!(
                        code == 503 && body.contains("out of the quorum"),
                        "{what}: {n}'s /readyz answered {code} {body:?}"
                    );
                } else {
                    ensure!(code == 200, "{what}: {n}'s /readyz answered {code} {body:?}");
                }
            }
            eprintln!(
                "l2 partial fault: {what}: most MACs answering one IP after detection: {most}; /readyz of {node}: 503"
            );
            anyhow::Ok(())
        }
        .await;
        drop(blocked);
        outcome?;
        answered_again_by(lab, &ips, &first, what).await?;
        ferrolb::wait_speaker_ready(lab, node, Duration::from_secs(10)).await?;
    }
    Ok(())
}

/// 80 % of one node's heartbeats lost (the owner's, a non-owner's), and a flood of junk at every
/// node's heartbeat port: never more than one MAC answers a request for an IP (the owner's own
/// losses are what the tenure, ferrolb_layer2::tenure, exists for), and once healed the owner
/// answers again. Losing the owner's heartbeats may cost it its IPs for a while (the others stop hearing
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
                Some(HeartbeatFault::loss(lab, node, loss)?)
            };
            let flood = if loss.is_empty() {
                let targets: Vec<std::net::IpAddr> = NODES
                    .iter()
                    .map(|n| lab.ipv4_of(n).map(Into::into))
                    .collect::<anyhow::Result<_>>()?;
                Some(std::thread::spawn(move || -> anyhow::Result<()> {
                    for target in targets {
                        ferrolb_e2e::faults::junk_flood(target, 20_000, Duration::from_secs(3))?;
                    }
                    Ok(())
                }))
            } else {
                None
            };
            // Detection (the failure timeout, 500 ms, and a heartbeat's round), then 8 s of
            // the fault, asking ARP and NDP and sending a request for every IP.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            while started.elapsed() < Duration::from_secs(10) {
                rounds += 1;
                for (i, ip) in ips.iter().enumerate() {
                    // Per request: an IP that moves between two requests is a handover, two
                    // MACs answering one request a split.
                    let answers = lab.l2_answers_by_request("client", ip)?;
                    for macs in &answers {
                        most = most.max(macs.len());
                        ensure!(macs.len() <= 1, "{what}: {ip} answered by {macs:?}");
                    }
                    // Who answers now: the last request answered.
                    let macs = answers
                        .into_iter()
                        .rev()
                        .find(|m| !m.is_empty())
                        .unwrap_or_default();
                    if i == 0
                        && let Some(mac) = macs.iter().next()
                    {
                        let node = lab.node_of_mac(mac)?;
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

/// A one-way delay of 600 ms on one node's outgoing heartbeats, more than the 500 ms failure
/// timeout (the netem case, made with a relay since the lab's kernel has no netem): the others
/// hear the node all the time, only late. On the owner, its acknowledgements come back too late to
/// give it a tenure, so it cannot answer; after 2.5 failure timeouts it hands its IPs over
/// (ferrolb_layer2::tenure::Starvation) and the others take them, never two MACs for one
/// request. On a non-owner nothing moves. Removed, the owner gets its IPs back.
async fn heartbeats_delayed_on_one_node(ctx: Ctx) -> anyhow::Result<()> {
    let lab = &ctx.lab;
    let (_scope, ips, first) = owned_web(lab, "l2-heartbeats-delayed").await?;
    let other = other_than(&first);
    for (what, node) in [
        ("the owner's heartbeats delayed 600 ms", first.as_str()),
        ("a non-owner's heartbeats delayed 600 ms", other),
    ] {
        let peers: Vec<std::net::Ipv4Addr> = NODES
            .iter()
            .filter(|n| **n != node)
            .map(|n| lab.ipv4_of(n))
            .collect::<anyhow::Result<_>>()?;
        let (mut most, mut requests, mut unanswered, mut served, mut failed) =
            (0usize, 0usize, 0usize, 0usize, 0usize);
        let (mut moves, mut last) = (0usize, first.clone());
        let started = std::time::Instant::now();
        let outcome = async {
            let _delay = HeartbeatDelay::start(lab, node, &peers, Duration::from_millis(600))?;
            while started.elapsed() < Duration::from_secs(8) {
                for (i, ip) in ips.iter().enumerate() {
                    let answers = lab.l2_answers_by_request("client", ip)?;
                    for macs in &answers {
                        most = most.max(macs.len());
                        requests += 1;
                        unanswered += usize::from(macs.is_empty());
                        ensure!(macs.len() <= 1, "{what}: {ip} answered by {macs:?}");
                    }
                    if i == 0
                        && let Some(mac) = answers.iter().rev().find_map(|m| m.iter().next())
                    {
                        let by = lab.node_of_mac(mac)?;
                        if by != last {
                            moves += 1;
                            last = by;
                        }
                    }
                    match http(lab, ip) {
                        Ok(_) => served += 1,
                        Err(_) => failed += 1,
                    }
                }
            }
            // What the delay must have done, so the test can fail: on the owner, the IPs
            // handed over; on a non-owner, nothing moved.
            for ip in &ips {
                let now = answering_node(lab, ip).await?;
                if node == first {
                    ensure!(now != first, "{what}: {ip} still answered by {first}");
                } else {
                    ensure!(now == first, "{what}: {ip} moved to {now}");
                }
            }
            anyhow::Ok(())
        }
        .await;
        eprintln!(
            "l2 partial fault: {what}: most MACs answering one request {most} of {requests}; unanswered requests {unanswered}; IP moves {moves}; requests served {served}, failed {failed}"
        );
        outcome?;
        answered_again_by(lab, &ips, &first, what).await?;
    }
    Ok(())
}

/// A rolling restart of every speaker, one node at a time as a DaemonSet update goes (the old
/// process stops, its successor starts): with the restart hold the IPs never leave their node
/// (each move would break the connections kube-proxy tracks there), no ARP or NDP request is
/// answered by two MACs, and every IP is answered again by its node. The lab's speakers are
/// processes, not pods, so they run with `--restart-hold-when=always` (the pod-deleted check is
/// unit-tested in the speaker).
async fn rolling_restart_keeps_ips_on_their_nodes(ctx: Ctx) -> anyhow::Result<()> {
    let lab = &ctx.lab;
    let (_scope, ips, first) = owned_web(lab, "l2-rolling").await?;
    let outcome = async {
        // Speakers whose every stop is a replacement (these first restarts move IPs: the
        // running speakers do not know yet).
        for node in NODES {
            ctx.speakers.stop(node);
            ctx.speakers
                .start_with(node, &["--restart-hold-when=always"])?;
        }
        answered_again_by(lab, &ips, &first, "the speakers' first restart").await?;
        // A long-lived connection to each IP through the roll, as a database client's: it
        // lives in the owner's conntrack, so it survives only if the IP never leaves the node.
        let held: Vec<Held> = ips
            .iter()
            .map(|ip| Held::start(lab, "client", ip))
            .collect::<anyhow::Result<_>>()?;
        // The roll: stop, start the successor, wait until the owner answers again, next node.
        let (mut most, mut moves, mut unanswered) = (0usize, Vec::new(), 0usize);
        let started = std::time::Instant::now();
        for node in NODES {
            ctx.speakers.stop(node);
            tokio::time::sleep(Duration::from_millis(500)).await;
            ctx.speakers
                .start_with(node, &["--restart-hold-when=always"])?;
            let restarted = std::time::Instant::now();
            // As a DaemonSet update (maxUnavailable 1) waits for the new pod to be ready
            // before the next: `/readyz` says ok only once the successor is back in the quorum
            // and claims (two speakers away at once would be a majority lost).
            ferrolb::wait_speaker_ready(lab, node, Duration::from_secs(30)).await?;
            loop {
                let mut all_home = true;
                for ip in &ips {
                    let answers = lab.l2_answers_by_request("client", ip)?;
                    for macs in &answers {
                        most = most.max(macs.len());
                        ensure!(macs.len() <= 1, "{ip} answered by {macs:?} while {node} restarted");
                        for mac in macs {
                            let by = lab.node_of_mac(mac)?;
                            if by != first {
                                moves.push(format!("{ip} answered by {by} while {node} restarted"));
                            }
                        }
                        unanswered += usize::from(macs.is_empty());
                    }
                    all_home &= answers.last().is_some_and(|m| m.len() == 1);
                }
                if all_home || restarted.elapsed() > Duration::from_secs(30) {
                    break;
                }
            }
        }
        let roll = started.elapsed();
        let mut connections = Vec::new();
        for (ip, h) in ips.iter().zip(held) {
            let report = h.finish()?;
            ensure!(
                report.broken.is_none() && report.received > 0,
                "the connection to {ip} did not survive the roll: {report:?}"
            );
            connections.push(format!(
                "{ip}: {} of {} lines answered, longest gap {:.0} ms",
                report.received, report.sent, report.max_gap_ms
            ));
        }
        eprintln!(
            "rolling restart of {} speakers in {roll:.1?}: most MACs answering one request {most}; IP moves {}; ARP/NDP requests unanswered {unanswered}; long-lived connections held: {}",
            NODES.len(),
            moves.len(),
            connections.join("; ")
        );
        ensure!(moves.is_empty(), "IPs left {first}: {moves:?}");
        answered_again_by(lab, &ips, &first, "the rolling restart").await?;
        anyhow::Ok(())
    }
    .await;
    // Back to the suite's usual speakers, whatever happened.
    for node in NODES {
        ctx.speakers.stop(node);
        ctx.speakers.start(node)?;
    }
    outcome
}

/// What every speaker says of `ip` and of its layer 2 state (for a failure's message): its
/// `/readyz` and its metric lines that name the IP or the quorum, tenure and damping.
fn speakers_on(lab: &Lab, ip: &str) -> String {
    let mut out = format!("what the speakers say of {ip}:");
    for node in NODES {
        let readyz = ferrolb::speaker_readyz(lab, node);
        let page = lab
            .exec(
                node,
                "curl",
                &["-sS", "--max-time", "3", "http://127.0.0.1:7472/metrics"],
            )
            .unwrap_or_else(|e| format!("{e:#}"));
        let lines: Vec<&str> = page
            .lines()
            .filter(|l| {
                !l.starts_with('#')
                    && (l.contains(&format!("\"{ip}\""))
                        || l.starts_with("ferrolb_layer2_quorum")
                        || l.starts_with("ferrolb_layer2_tenure_lapsed")
                        || l.starts_with("ferrolb_layer2_damped"))
            })
            .collect();
        out.push_str(&format!(
            "\n  {node}: /readyz {readyz:?}; {}",
            lines.join("; ")
        ));
    }
    out
}

/// The gossip key, as operators handle it: one node with a wrong key owns nothing and takes no
/// IP (the others refuse its heartbeats, it refuses theirs), and a key rotation rolled node by
/// node as the kubelet updates Secret volumes (add the next key everywhere, swap, drop the old
/// one; docs/architecture.md, "Rotating the gossip key") moves no IP, never has two MACs answer
/// a request, and every node ends signing with the new key.
async fn gossip_key_mismatch_and_rotation(ctx: Ctx) -> anyhow::Result<()> {
    let lab = &ctx.lab;
    let (_scope, ips, first) = owned_web(lab, "l2-keys").await?;
    let dir = lab.dir.join("keys");
    let files = |node: &str| {
        (
            dir.join(format!("{node}.key")),
            dir.join(format!("{node}.next")),
        )
    };
    let outcome = async {
        std::fs::create_dir_all(&dir)?;
        let old = std::fs::read_to_string(&ctx.speakers.credentials().gossip_key)?;
        let new = "rotated-gossip-key-0123456789abcdef0123456789abcdef".to_string();
        for node in NODES {
            let (key, next) = files(node);
            std::fs::write(&key, &old)?;
            let _ = std::fs::remove_file(&next);
            ctx.speakers.stop(node);
            ctx.speakers.start_with_keys(node, &key, &next)?;
        }
        answered_again_by(lab, &ips, &first, "the speakers' restart with their own key files").await?;
        // Watch every IP's answers while `step` runs; no IP may move or be answered twice.
        let watch = |what: String| {
            let ips = ips.clone();
            let first = first.clone();
            async move {
                for ip in &ips {
                    for macs in lab.l2_answers_by_request("client", ip)? {
                        ensure!(macs.len() <= 1, "{what}: {ip} answered by {macs:?}");
                        for mac in &macs {
                            let by = lab.node_of_mac(mac)?;
                            ensure!(by == first, "{what}: {ip} moved to {by}");
                        }
                    }
                }
                anyhow::Ok(())
            }
        };
        // A wrong key on a non-owner.
        let odd = other_than(&first);
        let (key, _) = files(odd);
        std::fs::write(&key, "a-key-no-other-node-has-0123456789")?;
        tokio::time::sleep(Duration::from_secs(7)).await;
        watch(format!("{odd} with a wrong key")).await?;
        let refused = ferrolb::speaker_metric(lab, &first, "ferrolb_speaker_heartbeats_refused_total{reason=\"authentication\"}")?;
        ensure!(refused > 0.0, "{first} refused none of {odd}'s heartbeats");
        std::fs::write(&key, &old)?;
        tokio::time::sleep(Duration::from_secs(7)).await;
        watch(format!("{odd}'s key repaired")).await?;
        // The rotation, one node at a time at each step.
        for (step, write) in [
            ("add the next key", (old.as_str(), Some(new.as_str()))),
            ("swap the keys", (new.as_str(), Some(old.as_str()))),
            ("drop the old key", (new.as_str(), None)),
        ] {
            let refused_before: f64 = NODES
                .iter()
                .map(|n| ferrolb::speaker_metric(lab, n, "ferrolb_speaker_heartbeats_refused_total{reason=\"authentication\"}"))
                .sum::<anyhow::Result<f64>>()?;
            for node in NODES {
                let (key, next) = files(node);
                std::fs::write(&key, write.0)?;
                match write.1 {
                    Some(n) => std::fs::write(&next, n)?,
                    None => {
                        let _ = std::fs::remove_file(&next);
                    }
                }
                // The speaker re-reads its files every 5 s.
                tokio::time::sleep(Duration::from_secs(6)).await;
                watch(format!("{step} on {node}")).await?;
            }
            let refused_after: f64 = NODES
                .iter()
                .map(|n| ferrolb::speaker_metric(lab, n, "ferrolb_speaker_heartbeats_refused_total{reason=\"authentication\"}"))
                .sum::<anyhow::Result<f64>>()?;
            ensure!(
                refused_after == refused_before,
                "{step}: {} heartbeats refused for their key during the roll",
                refused_after - refused_before
            );
        }
        for node in NODES {
            ensure!(
                ferrolb::speaker_metric(lab, node, "ferrolb_speaker_gossip_keys")? == 1.0,
                "{node} still holds two keys"
            );
        }
        eprintln!("gossip keys: wrong key on {odd}: refused, no IP moved; rotation rolled node by node in 3 steps: no IP moved, no heartbeat refused");
        anyhow::Ok(())
    }
    .await;
    for node in NODES {
        ctx.speakers.stop(node);
        ctx.speakers.start(node)?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    outcome
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
            let node = lab.node_of_mac(macs.iter().next().map_or("", String::as_str))?;
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
        // Until it is back (its flap damping hold-down, the claim delay, then the hand-back
        // from the node that took over), each request on its own: answers collected over
        // several requests would put the hand-back's two MACs side by side.
        let resumed = std::time::Instant::now();
        while resumed.elapsed() < Damping::FIRST_HOLD + Duration::from_secs(3) {
            for ip in &ips {
                for macs in lab.l2_answers_by_request("client", ip)? {
                    ensure!(
                        macs.len() <= 1,
                        "{ip} answered by {macs:?} after the resume"
                    );
                }
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

/// The voter configuration `l2_voters` runs with: the controller's ([`VOTERS_OBJECT`]).
async fn voter_config(lab: &Lab) -> anyhow::Result<Option<VoterConfig>> {
    let api: Api<ConfigMap> = Api::namespaced(lab.client().await?, ferrolb::NAMESPACE);
    match api.get_opt(VOTERS_OBJECT).await? {
        Some(map) => Ok(Some(ferrolb_runtime::voters::config_of(&map)?)),
        None => Ok(None),
    }
}

/// Waits until the controller's voter configuration is stable (no change under way) with
/// exactly `voters`, and returns it.
async fn voters_settle_on(lab: &Lab, voters: &[&str]) -> anyhow::Result<VoterConfig> {
    wait_for(
        &format!("the voter configuration to settle on {voters:?}"),
        // A frozen speaker's presence Lease lasts 40 s before its voter is replaced.
        Duration::from_secs(120),
        || async {
            match voter_config(lab).await.map_err(|e| e.to_string())? {
                Some(c) if !c.joint() && c.current == voters => Ok(Some(c)),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
}

/// Asks for every IP of a Service, request by request, on a thread until stopped: never two
/// MACs for one request; it counts the requests nobody answered.
struct OneAnswerWatch {
    watching: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<anyhow::Result<(u64, u64)>>,
}

impl OneAnswerWatch {
    fn start(lab: &Lab, ips: &[String]) -> Self {
        let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let thread = {
            let lab = lab.clone();
            let ips = ips.to_vec();
            let watching = watching.clone();
            std::thread::spawn(move || -> anyhow::Result<(u64, u64)> {
                let (mut asked, mut unanswered) = (0, 0);
                while watching.load(std::sync::atomic::Ordering::Relaxed) {
                    for ip in &ips {
                        for macs in lab.l2_answers_by_request("client", ip)? {
                            asked += 1;
                            unanswered += u64::from(macs.is_empty());
                            ensure!(
                                macs.len() <= 1,
                                "{ip} answered by {macs:?} while the voters changed"
                            );
                        }
                    }
                }
                Ok((asked, unanswered))
            })
        };
        OneAnswerWatch { watching, thread }
    }

    /// Stops it: how many requests were asked and how many went unanswered, or the first
    /// with two answers.
    fn stop(self) -> anyhow::Result<(u64, u64)> {
        self.watching
            .store(false, std::sync::atomic::Ordering::Relaxed);
        let (asked, unanswered) = self
            .thread
            .join()
            .map_err(|_| anyhow::anyhow!("the watch panicked"))??;
        ensure!(asked > 0, "no request was asked");
        Ok((asked, unanswered))
    }
}

/// The duty record of `node` in the `l2_voters` suite.
async fn duty_record(lab: &Lab, node: &str) -> anyhow::Result<ferrolb_runtime::voters::Record> {
    let records: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(lab.client().await?, ferrolb::NAMESPACE);
    let lease = records
        .get_opt(&ferrolb_runtime::voters::record_name(VOTERS_OBJECT, node))
        .await?
        .with_context(|| format!("the duty record of {node}"))?;
    Ok(ferrolb_runtime::voters::record_of(&lease))
}

/// Decision 0023, *Changing the voters*, with a frozen voter (SIGSTOP: its process holds its
/// seat and sockets, and wakes with them): it is replaced once its presence Lease expires,
/// fenced as it stays quiet, and when it resumes its seat ends at its first refused write,
/// before it can report for the old generation; then it comes back as a voter. Every IP is
/// answered by one node at most, request by request, throughout.
async fn a_frozen_voter_is_replaced_and_resumes_without_its_old_seat(
    ctx: Ctx,
) -> anyhow::Result<()> {
    let lab = &ctx.lab;
    let (_scope, ips, owner) = owned_web(lab, "l2-voters-frozen").await?;
    let start = voters_settle_on(lab, &NODES).await?;
    let frozen = other_than(&owner);
    let rest: Vec<&str> = NODES.iter().copied().filter(|n| *n != frozen).collect();
    let watch = OneAnswerWatch::start(lab, &ips);
    let outcome = async {
        let froze = std::time::Instant::now();
        ctx.speakers.freeze(frozen, true)?;
        let without = voters_settle_on(lab, &rest).await?;
        let replaced_after = froze.elapsed();
        let record = duty_record(lab, frozen).await?;
        ensure!(
            record.fence == start.generation + 1,
            "the frozen voter is fenced at the joint generation: {record:?}"
        );
        ctx.speakers.freeze(frozen, false)?;
        // Its first write after the resume is refused (the fence changed the record); it
        // reads the record again, drops its seat and says so.
        wait_for(
            "the resumed voter to say its seat ended",
            Duration::from_secs(20),
            || async {
                let r = duty_record(lab, frozen).await.map_err(|e| e.to_string())?;
                match r.mark {
                    Some(m) if m.serves.is_none() && m.read >= without.generation => Ok(Some(())),
                    _ => Err(format!("{r:?}")),
                }
            },
        )
        .await?;
        let resumed = std::time::Instant::now();
        let back = voters_settle_on(lab, &NODES).await?;
        eprintln!(
            "l2 voters change: {frozen} frozen, replaced after {:.1} s (its presence Lease lasts 40 s); resumed without its seat, a voter again after {:.1} s; generations {} -> {} -> {}",
            replaced_after.as_secs_f64(),
            resumed.elapsed().as_secs_f64(),
            start.generation,
            without.generation,
            back.generation
        );
        anyhow::Ok(())
    }
    .await;
    let _ = ctx.speakers.freeze(frozen, false);
    let asked = watch.stop();
    outcome?;
    let (asked, unanswered) = asked?;
    eprintln!(
        "l2 voters change: {asked} ARP/NDP requests through the freeze, none answered by two nodes, {unanswered} unanswered"
    );
    ensure!(
        unanswered == 0,
        "{unanswered} of {asked} requests unanswered while a frozen voter was replaced"
    );
    for ip in &ips {
        let node = answering_node(lab, ip).await?;
        ensure!(node == owner, "{ip} answered by {node}, owner {owner}");
    }
    Ok(())
}

/// Decision 0023, *Changing the voters*: a voter's speaker stops, the controller takes it out
/// of the voters through a joint phase (fencing its duty record, which stays quiet), and puts
/// it back when it returns; all the while every IP is answered by one node at most, request by
/// request, and by the owner at the end.
async fn voters_change_as_a_voter_goes_and_comes_back(ctx: Ctx) -> anyhow::Result<()> {
    let lab = &ctx.lab;
    let (_scope, ips, owner) = owned_web(lab, "l2-voters-change").await?;
    let start = voters_settle_on(lab, &NODES).await?;
    let gone = other_than(&owner);
    let rest: Vec<&str> = NODES.iter().copied().filter(|n| *n != gone).collect();
    let watch = OneAnswerWatch::start(lab, &ips);
    let outcome = async {
        // A clean stop deletes the presence Lease: the controller sees the speaker gone at
        // once and changes the voters after --voter-replace-after.
        let stopped = std::time::Instant::now();
        ctx.speakers.stop(gone);
        let without = voters_settle_on(lab, &rest).await?;
        let out_after = stopped.elapsed();
        ensure!(
            without.generation == start.generation + 2,
            "one change (a joint phase and its end) from {start:?}, got {without:?}"
        );
        // The stopped voter wrote nothing through the change: it was fenced.
        let record = duty_record(lab, gone).await?;
        ensure!(
            record.fence == start.generation + 1,
            "the stopped voter is fenced at the joint generation: {record:?}"
        );
        for ip in &ips {
            let node = answering_node(lab, ip).await?;
            ensure!(node == owner, "{ip} moved to {node} with the voters");
        }
        let restarted = std::time::Instant::now();
        ctx.speakers.start(gone)?;
        let back = voters_settle_on(lab, &NODES).await?;
        eprintln!(
            "l2 voters change: {gone} stopped, voters without it after {:.1} s (replace-after 5 s, fence after 6 s quiet); back in after {:.1} s; generations {} -> {} -> {}",
            out_after.as_secs_f64(),
            restarted.elapsed().as_secs_f64(),
            start.generation,
            without.generation,
            back.generation
        );
        ensure!(
            back.generation == without.generation + 2,
            "one change back, got {back:?}"
        );
        anyhow::Ok(())
    }
    .await;
    let asked = watch.stop();
    if !ctx.speakers.is_running(gone) {
        ctx.speakers.start(gone)?;
    }
    outcome?;
    let (asked, unanswered) = asked?;
    eprintln!(
        "l2 voters change: {asked} ARP/NDP requests, none answered by two nodes, {unanswered} unanswered"
    );
    // The owner keeps its quorum through both changes: nothing goes unanswered.
    ensure!(
        unanswered == 0,
        "{unanswered} of {asked} requests unanswered while the voters changed"
    );
    for ip in &ips {
        let node = answering_node(lab, ip).await?;
        ensure!(node == owner, "{ip} answered by {node}, owner {owner}");
    }
    Ok(())
}

/// Issue 33: a speaker whose wall clock is 90 s ahead (its node's NTP broken), first on the
/// owner, then on another node, then 90 s behind on the owner. Its heartbeats fall outside the
/// others' clock window and theirs outside its own, so it is a speaker nobody hears: a minority
/// that gives up its IPs, never (as when presence Leases were aged by the time written in them)
/// the only speaker the others know of. Checked for longer than a presence Lease lasts (40 s),
/// request by request: never two MACs for one IP, and every IP answered by a node whose clock
/// is right. Hours off and a step while running are unit-tested (`l2::presence`): libfaketime
/// cannot step a running process's clock reliably.
async fn a_speaker_with_its_clock_off_never_makes_a_second_owner(ctx: Ctx) -> anyhow::Result<()> {
    let lab = &ctx.lab;
    let (scope, ips, mut owner) = owned_web(lab, "l2-clock-off").await?;
    for (on_owner, offset) in [(true, "+90s"), (false, "+90s"), (true, "-90s")] {
        let skewed = if on_owner {
            owner.clone()
        } else {
            other_than(&owner).to_string()
        };
        let refused = "ferrolb_speaker_heartbeats_refused_total{reason=\"clock\"}";
        let healthy = other_than(&skewed);
        let refused_before = ferrolb::speaker_metric(lab, healthy, refused).unwrap_or(0.0);
        ctx.speakers.stop(&skewed);
        ctx.speakers.start_clocked(&skewed, offset)?;
        let (mut requests, mut most, mut unanswered) = (0usize, 0usize, 0usize);
        let outcome = async {
            let started = std::time::Instant::now();
            while started.elapsed() < Duration::from_secs(50) {
                for ip in &ips {
                    for macs in lab.l2_answers_by_request("client", ip)? {
                        requests += 1;
                        most = most.max(macs.len());
                        unanswered += usize::from(macs.is_empty());
                        ensure!(
                            macs.len() <= 1,
                            "{skewed}'s clock {offset}: {ip} answered by {macs:?}"
                        );
                    }
                }
            }
            for ip in &ips {
                let node = answering_node(lab, ip).await?;
                ensure!(
                    node != skewed,
                    "{ip} answered by {skewed}, whose clock is {offset}"
                );
            }
            // The skew was real: the others refused its heartbeats for their time.
            let refused_after = ferrolb::speaker_metric(lab, healthy, refused)?;
            ensure!(
                refused_after > refused_before,
                "{healthy} refused no heartbeat for its clock ({refused_before} → {refused_after})"
            );
            anyhow::Ok(())
        }
        .await;
        let role = if on_owner { "owner" } else { "non-owner" };
        eprintln!(
            "l2 clock {offset} on the {role} ({skewed}), 50 s: most MACs answering one request {most} of {requests}; unanswered requests {unanswered}"
        );
        // The right clock back, whatever happened.
        ctx.speakers.stop(&skewed);
        ctx.speakers.start(&skewed)?;
        outcome?;
        owner = settled_owner(lab, &scope.namespace, &ips).await?;
    }
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

/// The API server stopped (etcd kept) and started again, then etcd, then the API server again
/// while the owner's link is cut: the client's requests are
/// served throughout by one MAC per IP, no IP or owner changes, and after each outage the
/// controller and the speakers carry on by themselves (their watches relist): a new Service gets
/// an IP and is announced.
async fn control_plane_outages(ctx: Ctx) -> anyhow::Result<()> {
    let lab = &ctx.lab;
    let (scope, _, ips) = dual_stack_web(lab, "l2-api-outage", &["node1", "node2"]).await?;
    let first = settled_owner(lab, &scope.namespace, &ips).await?;
    for (component, outage) in [("kube-apiserver", api_outage()), ("etcd", api_outage() / 3)] {
        // The owner's ServiceL2Status, to be deleted behind the API server's back below.
        let status_name = if component == "kube-apiserver" {
            Some(status_object_name(lab, &scope.namespace, "web")?)
        } else {
            None
        };
        let back = lab.stop_keeping(component)?;
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
        // Watch expiry forced: with the API server down, etcd's revision moves on and is
        // compacted, so every watch resumes from a revision etcd no longer has (410 Gone,
        // "too old resource version"), whatever the API server's watch cache held.
        let marks = if component == "kube-apiserver" {
            // A delete no watch can see as an event (as one made while the speakers' watches
            // were down): the owner must find it missing when it relists, and write it again.
            if let Some(name) = &status_name {
                delete_in_etcd(
                    lab,
                    &format!(
                        "/registry/metallb.io/servicel2statuses/{}/{name}",
                        ferrolb::NAMESPACE
                    ),
                )?;
            }
            compact_etcd(lab)?;
            Some(log_lengths(&ctx)?)
        } else {
            None
        };
        back.end()?;
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
        let api = services_once_served(lab, &scope.namespace, component).await?;
        let name = format!("after-{component}");
        // Right after it starts, the API server may refuse to create a Service for a few
        // seconds ("failed to allocate a serviceIP: range is full" until its ClusterIP
        // allocator has synced): retry as any client would.
        let svc = lb_service(&name).selector("app", "web").build();
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
            // Answered again by one node (a step replanning every relisted object can hold
            // answers back for a moment: decision 0015, the mandate), never by two per request.
            if let Err(e) = answering_node(lab, ip).await {
                return Err(e.context(speakers_on(lab, ip)));
            }
            for macs in lab.l2_answers_by_request("client", ip)? {
                ensure!(
                    macs.len() <= 1,
                    "{ip} answered by {macs:?} after the {component} outage"
                );
            }
        }
        eprintln!(
            "control-plane outage: {component} back; served again and a new Service allocated {:.1?} after the restart",
            restarted.elapsed()
        );
        if let Some(marks) = marks {
            // Every binary saw its watches expire and relisted (it carried on, above).
            for (name, log, from) in marks {
                let text = std::fs::read(&log)?;
                let after = String::from_utf8_lossy(text.get(from..).unwrap_or_default());
                ensure!(
                    after.contains("too old resource version") || after.contains("Expired"),
                    "{name}: no watch expiry logged after etcd was compacted"
                );
            }
            eprintln!(
                "control-plane outage: watches expired (410) in the controller and every speaker, relisted"
            );
        }
        ensure!(
            owner(lab, &scope.namespace, "web").await? == first,
            "the owner of web changed across the {component} outage"
        );
    }
    // Last, on the same Service (a new one would wait on kube-controller-manager's backoff after
    // the outages): the owner's link cut while the API server is down.
    owner_link_cut_while_the_api_server_is_down(lab, &scope.namespace, &ips, &first).await
}

/// The name of the one ServiceL2Status written for Service `ns/name`.
fn status_object_name(lab: &Lab, ns: &str, name: &str) -> anyhow::Result<String> {
    let out = lab.kubectl(&[
        "get",
        "servicel2statuses",
        "-n",
        ferrolb::NAMESPACE,
        "-l",
        &format!("metallb.io/service-namespace={ns},metallb.io/service-name={name}"),
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ])?;
    match out.split_whitespace().collect::<Vec<_>>().as_slice() {
        [one] => Ok(one.to_string()),
        other => anyhow::bail!("ServiceL2Status objects of {ns}/{name}: {other:?}"),
    }
}

/// Deletes one key in the lab's etcd, checking that it existed.
fn delete_in_etcd(lab: &Lab, key: &str) -> anyhow::Result<()> {
    let etcdctl = ferrolb_e2e::lab::bin_dir().join("etcdctl");
    let out = lab.exec(
        "cp",
        &etcdctl.to_string_lossy(),
        &["--endpoints=http://127.0.0.1:2379", "del", key],
    )?;
    ensure!(out.trim() == "1", "etcd key {key} not deleted: {out}");
    Ok(())
}

/// Moves etcd's revision on (a key outside the API server's prefix) and compacts up to it.
fn compact_etcd(lab: &ferrolb_e2e::Lab) -> anyhow::Result<()> {
    let etcdctl = ferrolb_e2e::lab::bin_dir().join("etcdctl");
    let etcdctl = etcdctl.to_string_lossy();
    let endpoint = "--endpoints=http://127.0.0.1:2379";
    let put = lab.exec(
        "cp",
        &etcdctl,
        &[
            endpoint,
            "put",
            "/ferrolb-lab/compaction-marker",
            "x",
            "-w",
            "json",
        ],
    )?;
    let revision = serde_json::from_str::<serde_json::Value>(&put)?["header"]["revision"]
        .as_u64()
        .with_context(|| format!("no revision in {put}"))?;
    lab.exec(
        "cp",
        &etcdctl,
        &[endpoint, "compact", &revision.to_string()],
    )?;
    Ok(())
}

/// Each ferrolb process of the suite with its log file and the log's length now.
fn log_lengths(ctx: &Ctx) -> anyhow::Result<Vec<(String, String, usize)>> {
    let mut out = vec![(
        "controller".to_string(),
        ctx.controller.log.clone(),
        std::fs::metadata(&ctx.controller.log)?.len() as usize,
    )];
    for node in NODES {
        let p = ctx
            .speakers
            .process(node)
            .with_context(|| format!("no speaker on {node}"))?;
        let len = std::fs::metadata(&p.log)?.len() as usize;
        out.push((format!("speaker@{node}"), p.log, len));
    }
    Ok(out)
}

/// The Services of `namespace`, once the API server lists them again after `component`'s
/// outage.
async fn services_once_served(
    lab: &Lab,
    namespace: &str,
    component: &str,
) -> anyhow::Result<Api<Service>> {
    wait_for(
        &format!("the API server to serve again after the {component} outage"),
        Duration::from_secs(90),
        || async {
            let client = lab.client().await.map_err(|e| e.to_string())?;
            let services: Api<Service> = Api::namespaced(client, namespace);
            services
                .list(&ListParams::default())
                .await
                .map(|_| Some(services.clone()))
                .map_err(|e| e.to_string())
        },
    )
    .await
}

/// The owner's link cut while the API server is down (after [`control_plane_outages`], on its
/// Service): failover needs nothing from the API
/// server (heartbeats and the known set the speakers already hold), so another node takes the
/// IPs with one MAC per request; the link back, the IPs settle on one node each; the API server
/// back, the Service's IPs are unchanged.
async fn owner_link_cut_while_the_api_server_is_down(
    lab: &Lab,
    namespace: &str,
    ips: &[String],
    first: &str,
) -> anyhow::Result<()> {
    let api: Api<Service> = Api::namespaced(lab.client().await?, namespace);
    let before = ingress_ips(&api.get("web").await?);
    let back = lab.stop_keeping("kube-apiserver")?;
    let outcome = async {
        tokio::time::sleep(Duration::from_secs(3)).await;
        lab.set_link(first, false)?;
        let cut = std::time::Instant::now();
        let mut taken_by = String::new();
        for ip in ips {
            let now = answering_node(lab, ip).await?;
            ensure!(now != first, "{ip} still answered by {first} with its link cut");
            taken_by = now;
        }
        let failover = cut.elapsed();
        for ip in ips {
            for macs in lab.l2_answers_by_request("client", ip)? {
                ensure!(macs.len() <= 1, "{ip} answered by {macs:?} after the cut");
            }
        }
        lab.set_link(first, true)?;
        // Healed (flap damping may hold the old owner back a while): one MAC per request.
        tokio::time::sleep(Duration::from_secs(3)).await;
        for ip in ips {
            for macs in lab.l2_answers_by_request("client", ip)? {
                ensure!(macs.len() <= 1, "{ip} answered by {macs:?} after healing");
            }
        }
        eprintln!(
            "owner link cut with the API server down: {taken_by} answered every IP within {failover:.1?} of the cut (including the ARP round trips that saw it)"
        );
        anyhow::Ok(())
    }
    .await;
    let _ = lab.set_link(first, true);
    back.end()?;
    outcome?;
    let api = services_once_served(lab, namespace, "kube-apiserver").await?;
    ensure!(
        ingress_ips(&api.get("web").await?) == before,
        "web's IPs changed across the outage"
    );
    Ok(())
}

/// The owner's metrics count requests and answers for its IPs; health and readiness answer.
async fn metrics_and_health(ctx: Ctx) -> anyhow::Result<()> {
    let lab = &ctx.lab;
    let mut scope = TestScope::new(lab, "l2-metrics").await?;
    scope.deploy("web", &["node1"]).await?;
    let api: Api<Service> = Api::namespaced(lab.client().await?, &scope.namespace);
    create(&api, lb_service("web").selector("app", "web").build()).await?;
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

/// The suite's tests, in the order they run.
const TESTS: &[(&str, suite::LabBody<Ctx>)] = &[
    ("reachable_through_the_owner", |c| {
        Box::pin(reachable_through_the_owner(c))
    }),
    ("local_traffic_policy", |c| {
        Box::pin(local_traffic_policy(c))
    }),
    ("shared_ip_one_node", |c| Box::pin(shared_ip_one_node(c))),
    ("twenty_services_spread", |c| {
        Box::pin(twenty_services_spread(c))
    }),
    ("node_selectors_and_interfaces", |c| {
        Box::pin(node_selectors_and_interfaces(c))
    }),
    ("failover", |c| Box::pin(failover(c))),
    ("a_move_lists_no_status_objects", |c| {
        Box::pin(a_move_lists_no_status_objects(c))
    }),
    ("heartbeats_blocked_on_one_node", |c| {
        Box::pin(heartbeats_blocked_on_one_node(c))
    }),
    ("heartbeats_lossy_or_flooded", |c| {
        Box::pin(heartbeats_lossy_or_flooded(c))
    }),
    ("heartbeats_delayed_600ms_on_one_node", |c| {
        Box::pin(heartbeats_delayed_on_one_node(c))
    }),
    ("rolling_restart_keeps_ips_on_their_nodes", |c| {
        Box::pin(rolling_restart_keeps_ips_on_their_nodes(c))
    }),
    (
        "gossip_key_mismatch_and_rotation_rolled_node_by_node",
        |c| Box::pin(gossip_key_mismatch_and_rotation(c)),
    ),
    ("frozen_owner_resumes_without_a_second_answer", |c| {
        Box::pin(frozen_owner_resumes_without_a_second_answer(c))
    }),
    ("voters_change_as_a_voter_goes_and_comes_back", |c| {
        Box::pin(voters_change_as_a_voter_goes_and_comes_back(c))
    }),
    (
        "a_frozen_voter_is_replaced_and_resumes_without_its_old_seat",
        |c| {
            Box::pin(a_frozen_voter_is_replaced_and_resumes_without_its_old_seat(
                c,
            ))
        },
    ),
    (
        "a_speaker_with_its_clock_off_never_makes_a_second_owner",
        |c| Box::pin(a_speaker_with_its_clock_off_never_makes_a_second_owner(c)),
    ),
    // Before the tests that stop the API server: kube-controller-manager backs off after
    // an outage and may take minutes to write a new Service's EndpointSlices.
    ("metrics_and_health", |c| Box::pin(metrics_and_health(c))),
    ("api_server_and_etcd_outages_keep_traffic_and_ips", |c| {
        Box::pin(control_plane_outages(c))
    }),
];

/// What the `l2_voters` target (tests/l2_voters.rs) runs with
/// `--membership=voters`: the faults that test one owner per IP and hitless restarts. The whole
/// suite passes with voters too (`FERROLB_LAB_SPEAKER_ARGS="--membership=voters
/// --voters=node1,node2,node3" cargo test -p ferrolb-e2e --test l2`); CI runs this part of it
/// twice over to stay within its time.
const VOTERS_TESTS: &[&str] = &[
    "reachable_through_the_owner",
    "failover",
    "heartbeats_blocked_on_one_node",
    "heartbeats_lossy_or_flooded",
    "rolling_restart_keeps_ips_on_their_nodes",
    "frozen_owner_resumes_without_a_second_answer",
    "voters_change_as_a_voter_goes_and_comes_back",
    "a_frozen_voter_is_replaced_and_resumes_without_its_old_seat",
];

/// Tests that only make sense with voters.
const VOTERS_ONLY: &[&str] = &[
    "voters_change_as_a_voter_goes_and_comes_back",
    "a_frozen_voter_is_replaced_and_resumes_without_its_old_seat",
];

/// The ConfigMap in which `l2_voters`' controller publishes the voters.
const VOTERS_OBJECT: &str = "ferrolb-voters";

/// The suite: all of it as the `l2` target, [`VOTERS_TESTS`] with voters as `l2_voters`.
pub fn main() -> std::process::ExitCode {
    let args = Arguments::from_args();
    let voters = env!("CARGO_CRATE_NAME") == "l2_voters";
    // The tests share the speakers and cut links: one at a time.
    let mut suite = Suite::new(if voters { "l2_voters" } else { "l2" }).one_at_a_time();
    for (name, body) in TESTS {
        if (!voters && !VOTERS_ONLY.contains(name)) || (voters && VOTERS_TESTS.contains(name)) {
            suite = suite.test(name, *body);
        }
    }
    let conclusion = suite.run(&args, move |lab| {
        // The suite's pool; tests that need more add their own and remove them.
        Box::pin(async move {
            let pool = ferrolb::l2_pool("l2", &["198.18.200.0/25", "fd00:18::c8:0/113"]);
            // With voters, the controller chooses them and changes them (a voter gone for 5 s
            // is replaced), as the chart runs it without a fixed `speaker.voters`.
            let object = format!("--voters-object={VOTERS_OBJECT}");
            let (controller_args, speaker_args): (Vec<&str>, Vec<&str>) = if voters {
                (
                    vec![&object, "--voter-count=3", "--voter-replace-after=5s"],
                    vec!["--membership=voters", &object],
                )
            } else {
                (Vec::new(), Vec::new())
            };
            Deployment::start_with_speakers(&lab, "l2", &pool, &controller_args, &speaker_args)
        })
    });
    suite::exit_code(&[conclusion])
}
