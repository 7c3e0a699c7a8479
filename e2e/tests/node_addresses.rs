//! Node addresses end to end (issue #35, decision 0024): k3s ServiceLB's job done by the
//! controller alone. The controller runs with `--node-addresses` and a pool that serves no
//! Service on its own (`autoAssign: false`), a speaker runs on every node (its presence makes
//! the node eligible), a real kube-proxy on every node DNATs the node's own address, and the
//! client sends traffic over the lab segment. Tests run one at a time (they label nodes and stop
//! speakers); each works in its own namespace.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, ensure};
use ferrolb_e2e::Lab;
use ferrolb_e2e::cluster::{self, wait_for};
use ferrolb_e2e::explain;
use ferrolb_e2e::ferrolb::{self, Deployment};
use ferrolb_e2e::process::{self, LabProcess};
use ferrolb_e2e::scope::TestScope;
use ferrolb_e2e::service::{ingress_ips, lb_service};
use ferrolb_e2e::suite::{self, Fixture, Suite};
use ferrolb_testkit::objects::service;
use ferrolb_testkit::trial::Arguments;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;

const NODES: [&str; 3] = ["node1", "node2", "node3"];
const ENABLE_LB: &str = "svccontroller.k3s.cattle.io/enablelb";
const SERVICELB_FINALIZER: &str = "svccontroller.k3s.cattle.io/daemonset";

/// The lab with ferrolb; the controller can be replaced by a test (kept here so the suite's
/// teardown stops whichever runs).
#[derive(Clone)]
struct Ctx {
    deployment: Deployment,
    controller: Arc<Mutex<Option<LabProcess>>>,
}

impl Fixture for Ctx {
    fn teardown(&self) {
        if let Some(p) = self.controller.lock().unwrap().take() {
            process::stop(&p, Duration::from_secs(5));
        }
        self.deployment.stop();
    }
}

impl Ctx {
    fn lab(&self) -> &Lab {
        &self.deployment.lab
    }
}

/// The controller's arguments in this suite.
const CONTROLLER_ARGS: [&str; 1] = ["--node-addresses"];

/// A pool that serves only Services that ask for it: every other Service falls back to node
/// addresses.
const CONFIG: &str = r#"
apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata:
  name: on-request
  namespace: metallb-system
spec:
  addresses: [198.18.201.0/28]
  autoAssign: false
"#;

/// Node `node`'s address on the lab segment, IPv4 or IPv6.
fn address(lab: &Lab, node: &str, v6: bool) -> String {
    let iface = &lab.topology.host(node).unwrap().interfaces[0];
    if v6 {
        iface.ipv6.to_string()
    } else {
        iface.ipv4.to_string()
    }
}

/// The IPv4 addresses of `nodes`, sorted as ServiceLB sorts them (as strings).
fn v4_of(lab: &Lab, nodes: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = nodes.iter().map(|n| address(lab, n, false)).collect();
    out.sort();
    out
}

/// Waits until Service `name`'s ingress is exactly `want`, in order.
async fn wait_ingress(api: &Api<Service>, name: &str, want: &[String]) -> anyhow::Result<Service> {
    wait_for(
        &format!("Service {name}'s ingress to be {want:?}"),
        Duration::from_secs(60),
        || async {
            let s = api.get(name).await.map_err(|e| e.to_string())?;
            let ips = ingress_ips(&s);
            if ips == want {
                Ok(Some(s))
            } else {
                Err(format!("ingress {ips:?}"))
            }
        },
    )
    .await
}

/// HTTP from the client to `ip` on `port` until a pod answers; returns the pod's name.
async fn reach(lab: &Lab, ip: &str, port: u16) -> anyhow::Result<String> {
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_string()
    };
    let url = format!("http://{host}:{port}/");
    wait_for(
        &format!("an answer from {url} at the client"),
        Duration::from_secs(30),
        || async {
            match lab.exec("client", "curl", &["-sS", "--max-time", "3", "-g", &url]) {
                Ok(out) if !out.trim().is_empty() => Ok(Some(
                    out.split_whitespace()
                        .next()
                        .unwrap_or_default()
                        .to_string(),
                )),
                Ok(out) => Err(format!("empty answer {out:?}")),
                Err(e) => Err(format!("{e:#}")),
            }
        },
    )
    .await
}

/// Waits for an Event `reason` on Service `ns/name`; returns its note.
async fn wait_event(lab: &Lab, ns: &str, name: &str, reason: &str) -> anyhow::Result<String> {
    let events: Api<Event> = Api::namespaced(lab.client().await?, ns);
    wait_for(
        &format!("a {reason} Event on {ns}/{name}"),
        Duration::from_secs(30),
        || async {
            let list = events
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            list.items
                .iter()
                .find(|e| {
                    e.reason.as_deref() == Some(reason)
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                })
                .map(|e| Some(e.note.clone().unwrap_or_default()))
                .ok_or_else(|| format!("{} Events, none {reason}", list.items.len()))
        },
    )
    .await
}

async fn create(api: &Api<Service>, service: Service) -> anyhow::Result<()> {
    api.create(&PostParams::default(), &service)
        .await
        .context("creating Service")?;
    Ok(())
}

/// Undoes a node label at the end of a test, also when it fails.
struct Labelled<'a> {
    lab: &'a Lab,
    node: &'a str,
    key: &'a str,
}

impl Drop for Labelled<'_> {
    fn drop(&mut self) {
        let _ = self
            .lab
            .kubectl(&["label", "node", self.node, &format!("{}-", self.key)]);
    }
}

fn label<'a>(
    lab: &'a Lab,
    node: &'a str,
    key: &'a str,
    value: &str,
) -> anyhow::Result<Labelled<'a>> {
    lab.kubectl(&[
        "label",
        "node",
        node,
        "--overwrite",
        &format!("{key}={value}"),
    ])?;
    Ok(Labelled { lab, node, key })
}

/// A dual-stack Service like k3s's traefik (ports 80 and 443) lists every node's addresses,
/// IPv4 then IPv6, each sorted, and the client reaches each address on both ports.
async fn every_node_address_is_listed_and_answers_on_each_port(ctx: Ctx) -> anyhow::Result<()> {
    let lab = ctx.lab();
    let mut scope = TestScope::new(lab, "na-every").await?;
    scope.deploy("web", &NODES).await?;
    let api: Api<Service> = Api::namespaced(lab.client().await?, &scope.namespace);
    create(
        &api,
        lb_service("web")
            .named_port("https", 443, 8080, "TCP")
            .ip_family_policy("RequireDualStack")
            .selector("app", "web")
            .build(),
    )
    .await?;
    let mut v6: Vec<String> = NODES.iter().map(|n| address(lab, n, true)).collect();
    v6.sort();
    let want: Vec<String> = v4_of(lab, &NODES).into_iter().chain(v6).collect();
    let s = wait_ingress(&api, "web", &want).await?;
    let annotations = s.metadata.annotations.unwrap_or_default();
    ensure!(
        annotations.get("ferrolb.io/served-by").map(String::as_str) == Some("node-addresses")
            && !annotations.contains_key("metallb.io/ip-allocated-from-pool"),
        "annotations {annotations:?}"
    );
    let note = wait_event(lab, &scope.namespace, "web", "UpdatedLoadBalancer").await?;
    ensure!(
        note.starts_with("Updated LoadBalancer with new IPs: [] -> ["),
        "{note}"
    );
    scope.wait_ready_endpoints("web", NODES.len()).await?;
    for ip in &want {
        for port in [80, 443] {
            reach(lab, ip, port).await?;
        }
    }
    // explain lists every node and kube-proxy's chains for the ports; status lists it.
    let key = format!("{}/web", scope.namespace);
    let run = explain::run(lab, &["explain", "service", &key])?;
    ensure!(run.code == Some(0), "{}{}", run.stdout, run.stderr);
    for node in NODES {
        ensure!(
            run.stdout.contains(&format!("{node}: listed")),
            "{}",
            run.stdout
        );
    }
    ensure!(run.stdout.contains("KUBE-EXT-"), "{}", run.stdout);
    let status = explain::run(lab, &["status"])?;
    ensure!(
        status.stdout.contains("Served by node addresses:") && status.stdout.contains(&key),
        "{}",
        status.stdout
    );
    Ok(())
}

/// A second Service on port 80 gets no address (ServiceLB's pod would stay Pending on the
/// hostPort) and a Warning naming the holder; once the holder is gone it gets every address.
async fn a_port_held_by_an_earlier_service_keeps_a_later_one_off(ctx: Ctx) -> anyhow::Result<()> {
    let lab = ctx.lab();
    let mut scope = TestScope::new(lab, "na-port").await?;
    scope.deploy("web", &NODES).await?;
    let api: Api<Service> = Api::namespaced(lab.client().await?, &scope.namespace);
    let all = v4_of(lab, &NODES);
    create(&api, lb_service("first").selector("app", "web").build()).await?;
    wait_ingress(&api, "first", &all).await?;
    create(&api, lb_service("second").selector("app", "web").build()).await?;
    let note = wait_event(lab, &scope.namespace, "second", "NodeAddressPortHeld").await?;
    ensure!(note.contains("first"), "the Event names the holder: {note}");
    ensure!(ingress_ips(&api.get("second").await?).is_empty());
    // explain says why each node is left out, and that no node can serve it.
    let key = format!("{}/second", scope.namespace);
    let run = explain::run(lab, &["explain", "service", &key, "-o", "json"])?;
    let report = run.json()?;
    let excluded = &report["node_addresses"]["excluded"];
    for node in NODES {
        let why = excluded[node].as_str().unwrap_or_default();
        ensure!(
            why.contains(&format!("{}/first", scope.namespace)),
            "{node}: {why}; report {report:#}"
        );
    }
    ensure!(
        explain::Run::codes(&report) == ["no-node-address"],
        "{report:#}"
    );
    api.delete("first", &Default::default()).await?;
    wait_ingress(&api, "second", &all).await?;
    Ok(())
}

/// Labelling one node `enablelb=true` restricts every Service to it; removing the label gives
/// every node back.
async fn the_enablelb_label_shrinks_every_service_to_labelled_nodes(
    ctx: Ctx,
) -> anyhow::Result<()> {
    let lab = ctx.lab();
    let scope = TestScope::new(lab, "na-label").await?;
    let api: Api<Service> = Api::namespaced(lab.client().await?, &scope.namespace);
    let all = v4_of(lab, &NODES);
    create(&api, lb_service("a").build()).await?;
    create(
        &api,
        // Another port and protocol: no conflict with a.
        service("b").named_port("dns", 53, 53, "UDP").build(),
    )
    .await?;
    wait_ingress(&api, "a", &all).await?;
    wait_ingress(&api, "b", &all).await?;
    {
        let _label = label(lab, "node2", ENABLE_LB, "true")?;
        let only = v4_of(lab, &["node2"]);
        wait_ingress(&api, "a", &only).await?;
        wait_ingress(&api, "b", &only).await?;
    }
    wait_ingress(&api, "a", &all).await?;
    wait_ingress(&api, "b", &all).await?;
    Ok(())
}

/// A node whose speaker stops, or that turns NotReady, leaves every list within seconds, and
/// comes back when its speaker runs again or it is Ready again.
async fn a_stopped_speaker_or_a_not_ready_node_leaves_the_list(ctx: Ctx) -> anyhow::Result<()> {
    let lab = ctx.lab();
    let scope = TestScope::new(lab, "na-alive").await?;
    let api: Api<Service> = Api::namespaced(lab.client().await?, &scope.namespace);
    let all = v4_of(lab, &NODES);
    let without3 = v4_of(lab, &["node1", "node2"]);
    create(&api, lb_service("a").build()).await?;
    wait_ingress(&api, "a", &all).await?;
    let speakers = &ctx.deployment.speakers;
    // From the stop's start: the speaker deletes its presence Lease as it stops cleanly.
    let started = std::time::Instant::now();
    speakers.stop("node3");
    let restarted = async {
        wait_ingress(&api, "a", &without3).await?;
        let left = started.elapsed();
        speakers.start("node3")?;
        wait_ingress(&api, "a", &all).await?;
        anyhow::Ok(left)
    }
    .await;
    if !speakers.is_running("node3") {
        speakers.start("node3")?;
    }
    let left = restarted?;
    eprintln!("a stopped speaker's node left the list in {left:?}");
    let client = lab.client().await?;
    let started = std::time::Instant::now();
    cluster::set_node_ready(&client, &lab.topology, "node3", false).await?;
    let not_ready = wait_ingress(&api, "a", &without3).await;
    let left = started.elapsed();
    let started = std::time::Instant::now();
    cluster::set_node_ready(&client, &lab.topology, "node3", true).await?;
    not_ready?;
    wait_ingress(&api, "a", &all).await?;
    eprintln!(
        "a NotReady node left the list in {left:?}, and was back {:?} after it was Ready",
        started.elapsed()
    );
    Ok(())
}

/// With `externalTrafficPolicy: Local` only nodes with a ready endpoint are listed, and the
/// client reaches the Service there.
async fn local_traffic_lists_only_nodes_with_an_endpoint(ctx: Ctx) -> anyhow::Result<()> {
    let lab = ctx.lab();
    let mut scope = TestScope::new(lab, "na-local").await?;
    scope.deploy("web", &["node2"]).await?;
    let api: Api<Service> = Api::namespaced(lab.client().await?, &scope.namespace);
    create(
        &api,
        lb_service("web")
            .external_traffic_policy("Local")
            .selector("app", "web")
            .build(),
    )
    .await?;
    let only = v4_of(lab, &["node2"]);
    wait_ingress(&api, "web", &only).await?;
    scope.wait_ready_endpoints("web", 1).await?;
    reach(lab, &only[0], 80).await?;
    Ok(())
}

/// `loadBalancerSourceRanges` keep working: ServiceLB copied them into its pods, but kube-proxy
/// enforces them before any pod sees a packet, on node addresses as on pool IPs.
async fn source_ranges_are_enforced_by_kube_proxy(ctx: Ctx) -> anyhow::Result<()> {
    let lab = ctx.lab();
    let mut scope = TestScope::new(lab, "na-ranges").await?;
    scope.deploy("web", &["node1"]).await?;
    let api: Api<Service> = Api::namespaced(lab.client().await?, &scope.namespace);
    let client_ip = lab.ipv4_of("client")?;
    let mut svc = service("web")
        .named_port("web", 8082, 8080, "TCP")
        .selector("app", "web")
        .build();
    if let Some(spec) = svc.spec.as_mut() {
        spec.load_balancer_source_ranges = Some(vec![format!("{client_ip}/32")]);
    }
    create(&api, svc).await?;
    let all = v4_of(lab, &NODES);
    wait_ingress(&api, "web", &all).await?;
    scope.wait_ready_endpoints("web", 1).await?;
    reach(lab, &all[0], 8082).await?;
    // Another source only: the client is refused by kube-proxy's firewall chain.
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(
            &serde_json::json!({"spec": {"loadBalancerSourceRanges": ["198.18.0.201/32"]}}),
        ),
    )
    .await?;
    let url = format!("http://{}:8082/", all[0]);
    wait_for(
        "kube-proxy to refuse the client",
        Duration::from_secs(30),
        || async {
            match lab.exec("client", "curl", &["-sS", "--max-time", "2", "-g", &url]) {
                Err(_) => Ok(Some(())),
                Ok(out) => Err(format!("still answered: {out}")),
            }
        },
    )
    .await?;
    Ok(())
}

/// External IPs win over Internal IPs when any eligible node has one (k3s L346-L361): each node
/// gets a second address on the lab segment, reported as its ExternalIP; the Service moves to
/// them and answers there, and back when they go.
async fn external_ips_are_listed_when_nodes_have_them(ctx: Ctx) -> anyhow::Result<()> {
    let lab = ctx.lab();
    let mut scope = TestScope::new(lab, "na-external").await?;
    scope.deploy("web", &NODES).await?;
    let api: Api<Service> = Api::namespaced(lab.client().await?, &scope.namespace);
    create(&api, lb_service("web").selector("app", "web").build()).await?;
    wait_ingress(&api, "web", &v4_of(lab, &NODES)).await?;
    let client = lab.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    // 198.18.1.(10+N): in the lab segment's /16, so the client reaches it on-link.
    let external = |node: &str| address(lab, node, false).replace("198.18.0.", "198.18.1.");
    let result = async {
        for node in NODES {
            let ip = external(node);
            lab.exec(
                node,
                "ip",
                &["addr", "add", &format!("{ip}/32"), "dev", "eth0"],
            )?;
            let mut addresses = vec![
                serde_json::json!({"type": "InternalIP", "address": address(lab, node, false)}),
                serde_json::json!({"type": "InternalIP", "address": address(lab, node, true)}),
                serde_json::json!({"type": "ExternalIP", "address": ip}),
            ];
            addresses.push(serde_json::json!({"type": "Hostname", "address": node}));
            nodes
                .patch_status(
                    node,
                    &PatchParams::default(),
                    &Patch::Merge(&serde_json::json!({"status": {"addresses": addresses}})),
                )
                .await?;
        }
        let mut want: Vec<String> = NODES.iter().map(|n| external(n)).collect();
        want.sort();
        wait_ingress(&api, "web", &want).await?;
        scope.wait_ready_endpoints("web", NODES.len()).await?;
        for ip in &want {
            reach(lab, ip, 80).await?;
        }
        anyhow::Ok(())
    }
    .await;
    for node in NODES {
        let _ = lab.exec(
            node,
            "ip",
            &[
                "addr",
                "del",
                &format!("{}/32", external(node)),
                "dev",
                "eth0",
            ],
        );
        cluster::set_node_ready(&client, &lab.topology, node, true).await?;
    }
    result?;
    wait_ingress(&api, "web", &v4_of(lab, &NODES)).await?;
    Ok(())
}

/// Every version of a Service seen: its ingress and whether it carries ServiceLB's finalizer.
type Versions = Arc<Mutex<Vec<(Vec<String>, bool)>>>;

/// A k3s cluster restarted with `--disable=servicelb`: the Service carries the status ServiceLB
/// wrote (the node addresses, no ferrolb annotation) and ServiceLB's finalizer. The controller
/// starts, removes the finalizer, and the ingress never changes: no flap, no
/// `UpdatedLoadBalancer` Event.
async fn a_status_servicelb_wrote_is_kept_without_a_flap(ctx: Ctx) -> anyhow::Result<()> {
    let lab = ctx.lab();
    let scope = TestScope::new(lab, "na-migrate").await?;
    let client = lab.client().await?;
    let api: Api<Service> = Api::namespaced(client.clone(), &scope.namespace);
    // Neither ServiceLB nor ferrolb runs.
    process::stop(&ctx.deployment.controller, Duration::from_secs(5));
    if let Some(p) = ctx.controller.lock().unwrap().take() {
        process::stop(&p, Duration::from_secs(5));
    }
    let result = async {
        let all = v4_of(lab, &NODES);
        // A port of its own: Services of earlier tests may still be going with their
        // namespaces, and an earlier Service holding port 80 would rightly keep it.
        let mut svc = service("traefik")
            .named_port("web", 8081, 8080, "TCP")
            .build();
        svc.metadata.finalizers = Some(vec![SERVICELB_FINALIZER.into()]);
        create(&api, svc).await?;
        let ingress: Vec<serde_json::Value> = all
            .iter()
            .map(|ip| serde_json::json!({"ip": ip, "ipMode": "VIP"}))
            .collect();
        api.patch_status(
            "traefik",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"status": {"loadBalancer": {"ingress": ingress}}})),
        )
        .await?;
        // Every version of the Service from here on.
        let watched = watcher::watcher(
            api.clone(),
            watcher::Config::default().fields("metadata.name=traefik"),
        );
        let seen: Versions = Arc::default();
        let record = seen.clone();
        let watching = tokio::spawn(async move {
            futures::pin_mut!(watched);
            while let Some(Ok(event)) = watched.next().await {
                if let watcher::Event::Apply(s) | watcher::Event::InitApply(s) = event {
                    let finalizer = s
                        .metadata
                        .finalizers
                        .iter()
                        .flatten()
                        .any(|f| f == SERVICELB_FINALIZER);
                    record.lock().unwrap().push((ingress_ips(&s), finalizer));
                }
            }
        });
        let kubeconfig = ferrolb::install(lab)?;
        let p = ferrolb::start_controller_with(lab, &kubeconfig, "na-2", 7472, &CONTROLLER_ARGS)?;
        *ctx.controller.lock().unwrap() = Some(p);
        let done = wait_for(
            "the controller to take the Service over (ServiceLB's finalizer removed)",
            Duration::from_secs(60),
            || async {
                let s = api.get("traefik").await.map_err(|e| e.to_string())?;
                let marked = s
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("ferrolb.io/served-by"))
                    .is_some();
                let finalizer = s.metadata.finalizers.iter().flatten().count();
                if marked && finalizer == 0 {
                    Ok(Some(s))
                } else {
                    Err(format!("marked {marked}, finalizers {finalizer}"))
                }
            },
        )
        .await;
        // A moment more for any second write to show.
        tokio::time::sleep(Duration::from_secs(3)).await;
        watching.abort();
        let s = done?;
        ensure!(ingress_ips(&s) == all, "ingress {:?}", ingress_ips(&s));
        let seen = seen.lock().unwrap().clone();
        ensure!(
            !seen.is_empty() && seen.iter().all(|(ips, _)| *ips == all),
            "every version of the Service held the same ingress: {seen:?}"
        );
        let events: Api<Event> = Api::namespaced(client.clone(), &scope.namespace);
        let reasons: Vec<String> = events
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter_map(|e| e.reason.clone())
            .collect();
        ensure!(
            !reasons
                .iter()
                .any(|r| r == "UpdatedLoadBalancer" || r == "UnAvailableLoadBalancer"),
            "Events {reasons:?}"
        );
        // Deleting it is not held by the finalizer any more.
        api.delete("traefik", &Default::default()).await?;
        wait_for(
            "Service traefik to be gone",
            Duration::from_secs(30),
            || async {
                match api.get_opt("traefik").await.map_err(|e| e.to_string())? {
                    None => Ok(Some(())),
                    Some(_) => Err("still there".to_string()),
                }
            },
        )
        .await?;
        anyhow::Ok(())
    }
    .await;
    if ctx.controller.lock().unwrap().is_none() {
        let kubeconfig = ferrolb::install(lab)?;
        let p = ferrolb::start_controller_with(lab, &kubeconfig, "na-2", 7472, &CONTROLLER_ARGS)?;
        *ctx.controller.lock().unwrap() = Some(p);
    }
    result
}

type Test = (&'static str, suite::LabBody<Ctx>);

const TESTS: &[Test] = &[
    (
        "every_node_address_is_listed_and_answers_on_each_port",
        |c| Box::pin(every_node_address_is_listed_and_answers_on_each_port(c)),
    ),
    (
        "a_port_held_by_an_earlier_service_keeps_a_later_one_off",
        |c| Box::pin(a_port_held_by_an_earlier_service_keeps_a_later_one_off(c)),
    ),
    (
        "the_enablelb_label_shrinks_every_service_to_labelled_nodes",
        |c| {
            Box::pin(the_enablelb_label_shrinks_every_service_to_labelled_nodes(
                c,
            ))
        },
    ),
    (
        "a_stopped_speaker_or_a_not_ready_node_leaves_the_list",
        |c| Box::pin(a_stopped_speaker_or_a_not_ready_node_leaves_the_list(c)),
    ),
    ("local_traffic_lists_only_nodes_with_an_endpoint", |c| {
        Box::pin(local_traffic_lists_only_nodes_with_an_endpoint(c))
    }),
    ("source_ranges_are_enforced_by_kube_proxy", |c| {
        Box::pin(source_ranges_are_enforced_by_kube_proxy(c))
    }),
    ("external_ips_are_listed_when_nodes_have_them", |c| {
        Box::pin(external_ips_are_listed_when_nodes_have_them(c))
    }),
    ("a_status_servicelb_wrote_is_kept_without_a_flap", |c| {
        Box::pin(a_status_servicelb_wrote_is_kept_without_a_flap(c))
    }),
];

fn main() -> std::process::ExitCode {
    let args = Arguments::from_args();
    let mut suite = Suite::new("node_addresses").one_at_a_time();
    for (name, body) in TESTS {
        suite = suite.test(name, *body);
    }
    let conclusion = suite.run(&args, |lab| {
        Box::pin(async move {
            let deployment =
                Deployment::start_with_speakers(&lab, "na", CONFIG, &CONTROLLER_ARGS, &[])?;
            Ok(Ctx {
                deployment,
                controller: Arc::default(),
            })
        })
    });
    suite::exit_code(&[conclusion])
}
