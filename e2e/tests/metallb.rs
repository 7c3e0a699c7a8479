//! MetalLB itself in the lab (issue #16): its controller and speakers, built from the Go module by
//! `e2e/install-deps`, run where ferrolb's run, with its chart's RBAC and memberlist, reading
//! ferrolb's CRDs. These tests prove the reference works here — layer 2 and native BGP, with a
//! failover — so the comparisons built on it (differential allocation, `versus_metallb`) compare
//! against a MetalLB that does its job, and that a MetalLB configuration is served by our CRDs.
//! Tests run one at a time (they share the speakers); each works in its own namespace.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use ferrolb_e2e::Lab;
use ferrolb_e2e::cluster::wait_for;
use ferrolb_e2e::ferrolb::NAMESPACE;
use ferrolb_e2e::metallb::MetalLb;
use ferrolb_e2e::router::{wait_advertised_by, wait_http_pods, wait_installed};
use ferrolb_e2e::scope::TestScope;
use ferrolb_e2e::service::{ingress_ips, lb_service, wait_ips};
use ferrolb_e2e::suite::{self, Suite};
use ferrolb_testkit::trial::Arguments;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, PostParams};

const NODES: [&str; 3] = ["node1", "node2", "node3"];

/// A pool announced in layer 2 and one announced over BGP to the lab router, as a MetalLB user
/// writes them (MetalLB's documented examples with the lab's addresses). No `keepaliveTime`:
/// MetalLB's native BGP refuses it ("has keepalive-time set on native bgp mode", its FRR mode
/// takes it) and with it the whole configuration; and IPv4 only in the BGP pool: an IPv6 range
/// in a pool a BGPAdvertisement selects is refused the same way ("native bgp mode does not support
/// ipv6"). ferrolb's native BGP takes both (docs/metallb-differences.md).
fn config() -> String {
    format!(
        "apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {{name: l2, namespace: {NAMESPACE}}}
spec:
  addresses: ['198.18.200.0/25', 'fd00:18::c8:0/113']
---
apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {{name: l2, namespace: {NAMESPACE}}}
spec:
  ipAddressPools: [l2]
---
apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {{name: bgp, namespace: {NAMESPACE}}}
spec:
  addresses: ['198.18.201.0/24']
---
apiVersion: metallb.io/v1beta1
kind: BGPAdvertisement
metadata: {{name: bgp, namespace: {NAMESPACE}}}
spec:
  ipAddressPools: [bgp]
---
apiVersion: metallb.io/v1beta2
kind: BGPPeer
metadata: {{name: router, namespace: {NAMESPACE}}}
spec:
  myASN: 64512
  peerASN: 64500
  peerAddress: 198.18.0.254
  holdTime: 9s
"
    )
}

type Ctx = MetalLb;

/// A namespace `ns` with pods `web` on `nodes` and a LoadBalancer Service `web` from pool
/// `pool` (dual-stack when `dual`), once it has its IPs and an endpoint on every node; returns
/// its IPs.
async fn web(
    lab: &Lab,
    ns: &str,
    pool: &str,
    dual: bool,
    nodes: &[&str],
) -> anyhow::Result<(TestScope, Vec<String>)> {
    let mut scope = TestScope::new(lab, ns).await?;
    scope.deploy("web", nodes).await?;
    let api: Api<Service> = Api::namespaced(lab.client().await?, &scope.namespace);
    let svc = lb_service("web")
        .annotation("metallb.io/address-pool", pool)
        .ip_family_policy(if dual {
            "RequireDualStack"
        } else {
            "SingleStack"
        })
        .selector("app", "web")
        .build();
    api.create(&PostParams::default(), &svc).await?;
    let ips = ingress_ips(&wait_ips(&api, "web", if dual { 2 } else { 1 }).await?);
    scope.wait_ready_endpoints("web", nodes.len()).await?;
    Ok((scope, ips))
}

/// Waits until one node answers ARP/NDP for every IP of `ips` and a request from the client
/// through each is answered by a pod; returns that node.
async fn served_in_layer2(lab: &Lab, ips: &[String]) -> anyhow::Result<String> {
    wait_for(
        &format!("one node to answer for {ips:?} and serve them"),
        Duration::from_secs(60),
        || async {
            let mut owners = BTreeSet::new();
            for ip in ips {
                owners.insert(
                    lab.answering_node("client", ip)
                        .await
                        .map_err(|e| e.to_string())?,
                );
                lab.http_from("client", ip).map_err(|e| e.to_string())?;
            }
            match owners.len() {
                1 => Ok(owners.into_iter().next()),
                _ => Err(format!("answered by {owners:?}")),
            }
        },
    )
    .await
}

/// The nodes MetalLB's ServiceL2Status objects name for Service `ns/web`.
fn l2_status_nodes(lab: &Lab, ns: &str) -> anyhow::Result<Vec<String>> {
    ferrolb_e2e::ferrolb::l2_status_nodes(
        lab,
        &format!("metallb.io/service-namespace={ns},metallb.io/service-name=web"),
    )
}

/// Layer 2: MetalLB's controller gives a dual-stack Service an IP of each family from the pool,
/// exactly one node answers ARP and NDP for both, the client reaches the pods through them, and
/// MetalLB's ServiceL2Status (written into ferrolb's CRD) names that node.
async fn layer2_serves_through_one_node(ctx: Ctx) -> anyhow::Result<()> {
    let lab = &ctx.lab;
    let (scope, ips) = web(lab, "mlb-l2", "l2", true, &["node1", "node2"]).await?;
    ensure!(
        ips.iter().any(|ip| ip.starts_with("198.18.200."))
            && ips.iter().any(|ip| ip.starts_with("fd00:18::c8:")),
        "IPs {ips:?} are not from pool l2"
    );
    let owner = served_in_layer2(lab, &ips).await?;
    wait_for(
        "MetalLB's ServiceL2Status to name the answering node",
        Duration::from_secs(30),
        || async {
            let nodes = l2_status_nodes(lab, &scope.namespace).map_err(|e| e.to_string())?;
            if nodes == [owner.clone()] {
                Ok(Some(()))
            } else {
                Err(format!(
                    "ServiceL2Status nodes {nodes:?}, answering {owner}"
                ))
            }
        },
    )
    .await?;
    Ok(())
}

/// Layer 2 failover: the owner's speaker is killed; memberlist notices, another node takes the
/// IPs and the client is served again. The time is printed (MetalLB's memberlist needs seconds:
/// the figure `versus_metallb` measures over many trials).
async fn layer2_fails_over_when_the_owner_speaker_dies(ctx: Ctx) -> anyhow::Result<()> {
    let lab = &ctx.lab;
    let (_scope, ips) = web(lab, "mlb-failover", "l2", true, &NODES).await?;
    let owner = served_in_layer2(lab, &ips).await?;
    let killed = Instant::now();
    ctx.kill_speaker(&owner);
    let outcome = async {
        let taker = wait_for(
            &format!("another node than {owner} to answer for {}", ips[0]),
            Duration::from_secs(60),
            || async {
                let node = lab
                    .answering_node("client", &ips[0])
                    .await
                    .map_err(|e| e.to_string())?;
                if node == owner {
                    Err(format!("still {owner}"))
                } else {
                    Ok(Some(node))
                }
            },
        )
        .await?;
        let taken = killed.elapsed();
        let now = served_in_layer2(lab, &ips).await?;
        ensure!(now == taker, "{taker} took {}, then {now} answered", ips[0]);
        println!(
            "MetalLB layer 2: {owner}'s speaker killed, {taker} answers after {:.1} s",
            taken.as_secs_f64()
        );
        anyhow::Ok(())
    }
    .await;
    ctx.start_speaker(&owner).await?;
    outcome
}

/// Native BGP: every node's speaker peers with the lab router (FRR) and advertises the
/// Service's IPs with its own address as next hop; the router installs them and the external
/// client behind it reaches the pods; a killed speaker's paths are withdrawn and come back with it.
async fn native_bgp_advertises_to_frr(ctx: Ctx) -> anyhow::Result<()> {
    let lab = &ctx.lab;
    let (_scope, ips) = web(lab, "mlb-bgp", "bgp", false, &["node1", "node2"]).await?;
    for ip in &ips {
        wait_advertised_by(lab, ip, &NODES).await?;
        wait_installed(lab, ip, &NODES).await?;
        wait_http_pods(lab, ip, 2).await?;
    }
    ctx.kill_speaker("node3");
    let outcome = async {
        wait_advertised_by(lab, &ips[0], &["node1", "node2"])
            .await
            .context("after SIGKILL of node3's speaker")?;
        wait_http_pods(lab, &ips[0], 1).await?;
        anyhow::Ok(())
    };
    let outcome = outcome.await;
    ctx.start_speaker("node3").await?;
    outcome?;
    wait_advertised_by(lab, &ips[0], &NODES)
        .await
        .context("after restarting node3's speaker")?;
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args = Arguments::from_args();
    let conclusion = Suite::new("metallb")
        .one_at_a_time()
        .test("layer2_serves_through_one_node", |c| {
            Box::pin(layer2_serves_through_one_node(c))
        })
        .test("layer2_fails_over_when_the_owner_speaker_dies", |c| {
            Box::pin(layer2_fails_over_when_the_owner_speaker_dies(c))
        })
        .test("native_bgp_advertises_to_frr", |c| {
            Box::pin(native_bgp_advertises_to_frr(c))
        })
        .run(&args, |lab| {
            Box::pin(async move { MetalLb::start(&lab, &config()).await })
        });
    suite::exit_code(&[conclusion])
}
