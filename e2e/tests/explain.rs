//! `ferrolb explain` (issue #20) against the lab: ferrolb's controller and speakers in layer 2
//! mode, the CLI run as a user would, as the lab's admin (with a token), in text and JSON. Each
//! scenario checks what the CLI says against what the cluster and kube-proxy actually hold.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, ensure};
use ferrolb_e2e::Lab;
use ferrolb_e2e::cluster::wait_for;
use ferrolb_e2e::explain::{self, Run};
use ferrolb_e2e::faults::HeartbeatFault;
use ferrolb_e2e::ferrolb::{self, Deployment};
use ferrolb_e2e::scope::TestScope;
use ferrolb_e2e::service::{ingress_ips, lb_service, wait_ips};
use ferrolb_e2e::suite::{self, Suite};
use ferrolb_testkit::objects::ServiceBuilder;
use ferrolb_testkit::trial::Arguments;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, PostParams};

type Ctx = Deployment;

fn cli(lab: &Lab, args: &[&str]) -> anyhow::Result<Run> {
    explain::run(lab, args)
}

fn cli_as(lab: &Lab, binary: &str, args: &[&str]) -> anyhow::Result<Run> {
    explain::run_with(&explain::admin_token_kubeconfig(lab)?, binary, args)
}

/// The HTTP status of `GET path` on the speaker of `node` (port 7472 of its address), asked
/// straight from the host `from`, as any Pod there could, with `token` if given.
fn speaker_status(
    lab: &Lab,
    from: &str,
    node: &str,
    path: &str,
    token: Option<&str>,
) -> anyhow::Result<u16> {
    let host = lab.topology.host(node).context("no such node")?;
    let url = format!("http://{}:7472{path}", host.interfaces[0].ipv4);
    let header = token.map(|t| format!("Authorization: Bearer {t}"));
    let mut args = vec![
        "-s",
        "-o",
        "/dev/null",
        "--max-time",
        "3",
        "-w",
        "%{http_code}",
    ];
    if let Some(header) = &header {
        args.extend(["-H", header.as_str()]);
    }
    args.push(&url);
    let code = lab.exec(from, "curl", &args)?;
    code.trim()
        .parse()
        .with_context(|| format!("curl {url}: {code:?}"))
}

fn codes(report: &serde_json::Value) -> Vec<String> {
    Run::codes(report)
}

/// Checks a run's whole output (the command, its exit status, standard output) against golden
/// file `name` (`ferrolb_e2e::golden`).
fn golden(name: &str, run: &Run, args: &[&str]) -> anyhow::Result<()> {
    ferrolb_e2e::golden::check(name, &run.transcript(args))
}

async fn create(api: &Api<Service>, svc: Service) -> anyhow::Result<()> {
    api.create(&PostParams::default(), &svc).await?;
    Ok(())
}

/// A LoadBalancer Service `name` selecting app `web`, with these annotations.
fn service(name: &str, annotations: &[(&str, &str)]) -> ServiceBuilder {
    lb_service(name)
        .selector("app", "web")
        .annotations(annotations.iter().copied())
}

/// Waits until `explain service` for `key` reports an announcement, and returns that report.
async fn wait_announced(lab: &Lab, key: &str) -> anyhow::Result<serde_json::Value> {
    wait_for(
        &format!("explain to show {key} announced"),
        Duration::from_secs(30),
        || async {
            let run =
                cli(lab, &["explain", "service", key, "-o", "json"]).map_err(|e| e.to_string())?;
            let report = run.json().map_err(|e| e.to_string())?;
            match report["announcements"].as_array() {
                Some(a) if !a.is_empty() && run.code == Some(0) => Ok(Some(report)),
                _ => Err(format!("exit {:?}: {}", run.code, run.stdout)),
            }
        },
    )
    .await
}

/// A healthy dual-stack Service: the report names the pool and rule, the owner node and its
/// interface (as ServiceL2Status does), the ready endpoints by node, and kube-proxy's chains,
/// each of which exists with that name in the owner's `iptables-save`/`ip6tables-save`; the
/// kubectl plugin binary says the same; the text output walks the same steps.
async fn healthy_service_and_kube_proxy_chains(ctx: Ctx) -> anyhow::Result<()> {
    let lab = &ctx.lab;
    let mut scope = TestScope::new(lab, "explain-ok").await?;
    scope.deploy("web", &["node1", "node2"]).await?;
    let api: Api<Service> = Api::namespaced(lab.client().await?, &scope.namespace);
    let web = lb_service("web")
        .selector("app", "web")
        .ip_family_policy("RequireDualStack");
    create(&api, web.build()).await?;
    let ips: BTreeSet<String> = ingress_ips(&wait_ips(&api, "web", 2).await?)
        .into_iter()
        .collect();
    scope.wait_ready_endpoints("web", 2).await?;
    let key = format!("{}/web", scope.namespace);
    wait_announced(lab, &key).await?;
    // Once every speaker is a candidate (each claims a moment after it hears the others), all
    // three are in line for the IPs.
    let report = wait_for(
        "all three speakers in the takeover order",
        Duration::from_secs(30),
        || async {
            let run =
                cli(lab, &["explain", "service", &key, "-o", "json"]).map_err(|e| e.to_string())?;
            let report = run.json().map_err(|e| e.to_string())?;
            match report["announcements"][0]["takeover"].as_array() {
                Some(t) if t.len() == 3 => Ok(Some(report)),
                other => Err(format!("takeover {other:?}")),
            }
        },
    )
    .await?;
    let allocation = &report["allocation"];
    ensure!(allocation["pool"] == "explain", "{report:#}");
    ensure!(allocation["rule"]["kind"] == "auto-assign", "{report:#}");
    let reported: BTreeSet<String> = allocation["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    ensure!(reported == ips, "IPs {reported:?}, status {ips:?}");
    let owner = report["announcements"][0]["node"]
        .as_str()
        .context("no owner")?
        .to_string();
    ensure!(
        report["announcements"][0]["mode"] == "layer2"
            && report["announcements"][0]["interfaces"] == serde_json::json!(["eth0"]),
        "{report:#}"
    );
    let status_nodes = lab.kubectl(&[
        "get",
        "servicel2statuses",
        "-n",
        ferrolb::NAMESPACE,
        "-o",
        "jsonpath={range .items[?(@.status.serviceName==\"web\")]}{.status.serviceNamespace}={.status.node}{\"\\n\"}{end}",
    ])?;
    ensure!(
        status_nodes.contains(&format!("{}={owner}", scope.namespace)),
        "explain says {owner}; ServiceL2Status: {status_nodes}"
    );
    ensure!(
        report["traffic"]["ready_endpoints"] == serde_json::json!({"node1": 1, "node2": 1}),
        "{report:#}"
    );
    ensure!(codes(&report).is_empty(), "{report:#}");
    // From the speakers' live reports (through the API server's proxy to their Pods): every
    // node in line for the IPs, the owner first, and the MAC clients learn, which is the
    // owner's eth0's.
    let announcement = &report["announcements"][0];
    let takeover: Vec<&str> = announcement["takeover"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n.as_str())
        .collect();
    ensure!(
        takeover.len() == 3 && takeover[0] == owner,
        "takeover order {takeover:?}, owner {owner}"
    );
    let mac = lab.exec(&owner, "cat", &["/sys/class/net/eth0/address"])?;
    ensure!(
        announcement["macs"]["eth0"] == mac.trim(),
        "MAC {} in explain, {} on {owner}'s eth0",
        announcement["macs"]["eth0"],
        mac.trim()
    );
    // Every chain name explain computes is one kube-proxy wrote on the owner (kube-proxy
    // programs the Service a moment after its endpoints are ready: wait for its last chain).
    let port = &report["kube_proxy"][0];
    let last = port["iptables"]["endpoints"][3]["chain"]
        .as_str()
        .context("four endpoint chains")?
        .to_string();
    let (v4, v6) = wait_for(
        &format!("kube-proxy on {owner} to write the chains explain names"),
        Duration::from_secs(30),
        || async {
            let v4 = lab
                .exec(&owner, "iptables-save", &["-t", "nat"])
                .map_err(|e| e.to_string())?;
            let v6 = lab
                .exec(&owner, "ip6tables-save", &["-t", "nat"])
                .map_err(|e| e.to_string())?;
            if v4.contains(&format!(":{last} ")) || v6.contains(&format!(":{last} ")) {
                Ok(Some((v4, v6)))
            } else {
                Err(format!("no chain {last} yet"))
            }
        },
    )
    .await?;
    for field in ["external", "service"] {
        let chain = port["iptables"][field].as_str().context("chain")?;
        ensure!(
            v4.contains(&format!(":{chain} ")) && v6.contains(&format!(":{chain} ")),
            "{field} chain {chain} is not in the owner's iptables"
        );
    }
    let endpoints = port["iptables"]["endpoints"]
        .as_array()
        .context("endpoints")?;
    ensure!(endpoints.len() == 4, "{port:#}");
    // The weights are kube-proxy's: its service chain jumps to each of a family's endpoints
    // (two per family here), spreading connections evenly.
    let service_chain = port["iptables"]["service"].as_str().context("service")?;
    for (table, family) in [(&v4, "IPv4"), (&v6, "IPv6")] {
        let jumps = table
            .lines()
            .filter(|l| {
                l.starts_with(&format!("-A {service_chain} ")) && l.contains("-j KUBE-SEP-")
            })
            .count();
        ensure!(
            jumps == 2,
            "{family}: {jumps} endpoint jumps in {service_chain}"
        );
    }
    ensure!(
        endpoints.iter().all(|e| e["weight"] == "1/2"),
        "weights: {port:#}"
    );
    for e in endpoints {
        let chain = e["chain"].as_str().context("chain")?;
        let endpoint = e["endpoint"].as_str().context("endpoint")?;
        let table = if endpoint.starts_with('[') { &v6 } else { &v4 };
        // kube-proxy's DNAT rule for exactly this endpoint, in exactly this chain.
        let dnat = format!("--to-destination {endpoint}");
        ensure!(
            table
                .lines()
                .any(|l| l.starts_with(&format!("-A {chain} ")) && l.contains(&dnat)),
            "endpoint chain {chain} ({endpoint}) is not kube-proxy's"
        );
    }
    // A user with nothing but the chart's read-only ClusterRole gets the same answer from the
    // objects, and is told the speakers' live reports were not read; with the Role in the
    // speakers' namespace too (pods/proxy), the whole answer.
    let rbac = ferrolb_e2e::lab::repo_root().join("charts/ferrolb/rbac/explain.yaml");
    lab.kubectl(&["apply", "-f", &rbac.display().to_string()])?;
    lab.kubectl(&[
        "-n",
        ferrolb::NAMESPACE,
        "create",
        "serviceaccount",
        "explainer",
        "--dry-run=client",
        "-o",
        "yaml",
    ])
    .and_then(|yaml| lab.apply(&yaml))?;
    lab.kubectl(&[
        "create",
        "clusterrolebinding",
        "explainer",
        "--clusterrole=ferrolb-explain",
        &format!("--serviceaccount={}:explainer", ferrolb::NAMESPACE),
        "--dry-run=client",
        "-o",
        "yaml",
    ])
    .and_then(|yaml| lab.apply(&yaml))?;
    let _rbac = lab.delete_on_drop(
        ferrolb::NAMESPACE,
        &[
            "rolebinding/explainer",
            "role/ferrolb-explain",
            "clusterrolebinding/explainer",
            "serviceaccount/explainer",
            "clusterrole/ferrolb-explain",
        ],
    );
    let reader = lab.service_account_kubeconfig(ferrolb::NAMESPACE, "explainer")?;
    // The report, asked straight from another node, as any Pod there could (issue 33, item 6):
    // nothing without a token, nothing to a subject without the Role; the probes and the
    // metrics stay open.
    let reader_token = lab
        .kubectl(&["create", "token", "explainer", "-n", ferrolb::NAMESPACE])?
        .trim()
        .to_string();
    let report_path = "/explain/v1alpha1";
    let from = if owner == "node2" { "node3" } else { "node2" };
    let direct = [
        speaker_status(lab, from, &owner, report_path, None)?,
        speaker_status(lab, from, &owner, report_path, Some("not-a-token"))?,
        speaker_status(lab, from, &owner, report_path, Some(&reader_token))?,
        speaker_status(lab, from, &owner, "/metrics", None)?,
        speaker_status(lab, from, &owner, "/readyz", None)?,
    ];
    ensure!(
        direct == [401, 401, 403, 200, 200],
        "the report straight from {from} (no token, a made-up one, a reader without the Role; /metrics, /readyz): {direct:?}"
    );
    // An admin with a client certificate has no token to pass on: the objects' answer, and
    // why the live part is missing.
    let by_cert = explain::run_with(
        &lab.admin_kubeconfig(),
        "ferrolb",
        &["explain", "service", &key, "-o", "json"],
    )?;
    let by_cert_json = by_cert.json()?;
    ensure!(
        by_cert.code == Some(0)
            && by_cert_json["allocation"] == report["allocation"]
            && by_cert_json["announcements"][0]["takeover"].is_null()
            && by_cert_json["notes"]
                .to_string()
                .contains("answer only callers that send a bearer token"),
        "with the admin's client certificate: exit {:?}, {by_cert_json:#}",
        by_cert.code,
    );
    let as_reader = explain::run_with(
        &reader,
        "ferrolb",
        &["explain", "service", &key, "-o", "json"],
    )?;
    let partial = as_reader.json()?;
    ensure!(
        as_reader.code == Some(0)
            && partial["allocation"] == report["allocation"]
            && partial["announcements"][0]["node"] == owner.as_str()
            && partial["announcements"][0]["takeover"].is_null()
            && partial["notes"]
                .to_string()
                .contains("live reports were not read"),
        "with only ClusterRole ferrolb-explain: exit {:?}, {partial:#}",
        as_reader.code,
    );
    lab.kubectl(&[
        "-n",
        ferrolb::NAMESPACE,
        "create",
        "rolebinding",
        "explainer",
        "--role=ferrolb-explain",
        &format!("--serviceaccount={}:explainer", ferrolb::NAMESPACE),
        "--dry-run=client",
        "-o",
        "yaml",
    ])
    .and_then(|yaml| lab.apply(&yaml))?;
    let as_reader = explain::run_with(
        &reader,
        "ferrolb",
        &["explain", "service", &key, "-o", "json"],
    )?;
    ensure!(
        as_reader.code == Some(0) && as_reader.json()? == report,
        "with ClusterRole and Role ferrolb-explain: exit {:?}, {}",
        as_reader.code,
        as_reader.stderr
    );
    // With the Role, the reader's token opens the report straight from a node too (what
    // kube-rbac-proxy would allow): a new token, as the speaker remembers the refusal of the
    // first for a few seconds.
    let reader_token = lab
        .kubectl(&["create", "token", "explainer", "-n", ferrolb::NAMESPACE])?
        .trim()
        .to_string();
    let allowed = speaker_status(lab, from, &owner, report_path, Some(&reader_token))?;
    ensure!(
        allowed == 200,
        "the reader with the Role, straight: {allowed}"
    );
    // `status` (with the same read-only role): the pool's usage, the three live speakers.
    let st = explain::run_with(&reader, "ferrolb", &["status", "-o", "json"])?;
    let st_json = st.json()?;
    ensure!(
        st.code == Some(0),
        "status: exit {:?}: {st_json:#}",
        st.code
    );
    let pool = st_json["pools"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "explain")
        .context("no pool explain in status")?;
    ensure!(
        pool["ipv4"][0] == 1
            && pool["ipv6"][0] == 1
            && pool["advertised_by"] == serde_json::json!(["L2Advertisement explain"]),
        "{pool:#}"
    );
    ensure!(
        st_json["speakers"]
            == serde_json::json!([
                {"node": "node1", "live": true, "quorum": true},
                {"node": "node2", "live": true, "quorum": true},
                {"node": "node3", "live": true, "quorum": true},
            ]),
        "{st_json:#}"
    );
    let st_text = explain::run(lab, &["status"])?;
    ensure!(
        st_text.stdout.contains("No problem found."),
        "{}",
        st_text.stdout
    );
    golden(
        "explain/l2-healthy.txt",
        &cli(lab, &["explain", "service", &key])?,
        &["explain", "service", &key],
    )?;
    golden(
        "explain/l2-healthy.json",
        &cli(lab, &["explain", "service", &key, "-o", "json"])?,
        &["explain", "service", &key, "-o", "json"],
    )?;
    // The plugin binary is the same program; the text walks the same steps.
    let plugin = cli_as(
        lab,
        "kubectl-ferrolb",
        &["explain", "service", &key, "-o", "json"],
    )?;
    ensure!(plugin.json()? == report, "kubectl-ferrolb differs");
    let text = cli(lab, &["explain", "service", &key])?;
    for want in [
        format!("Service {key}"),
        "1. Pool:         explain".to_string(),
        format!("layer 2 by {owner} on eth0"),
        "No problem found.".to_string(),
    ] {
        ensure!(
            text.stdout.contains(&want),
            "{want:?} not in:\n{}",
            text.stdout
        );
    }
    // By IP, the same Service.
    let first = ips.iter().next().context("no IP")?;
    let by_ip = cli(lab, &["explain", "ip", first, "-o", "json"])?.json()?;
    ensure!(by_ip["service"] == key, "{by_ip:#}");
    Ok(())
}

/// Services that cannot get an address, each diagnosed with the object and field at fault:
/// an unknown pool, a requested IP outside every pool, an exhausted pool (the IPAddressPool is
/// named), and a pool no advertisement covers; the exit status says problems were found.
async fn allocation_problems_are_diagnosed(ctx: Ctx) -> anyhow::Result<()> {
    let lab = &ctx.lab;
    let ns = ferrolb::NAMESPACE;
    lab.apply(&format!(
        "apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {{name: tiny, namespace: {ns}}}
spec:
  addresses: ['198.18.210.5/32']
  autoAssign: false
---
apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {{name: tiny, namespace: {ns}}}
spec:
  ipAddressPools: [tiny]
---
apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {{name: lonely, namespace: {ns}}}
spec:
  addresses: ['198.18.211.0/28']
  autoAssign: false
---
apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {{name: nowhere, namespace: {ns}}}
spec:
  addresses: ['198.18.212.0/28']
  autoAssign: false
---
apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {{name: nowhere, namespace: {ns}}}
spec:
  ipAddressPools: [nowhere]
  nodeSelectors:
  - matchLabels: {{kubernetes.io/hostname: no-such-node}}
---
apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {{name: private, namespace: {ns}}}
spec:
  addresses: ['198.18.213.0/28']
  autoAssign: false
  serviceAllocation:
    namespaces: [somewhere-else]
---
apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {{name: private, namespace: {ns}}}
spec:
  ipAddressPools: [private]
"
    ))?;
    let _delete = lab.delete_on_drop(
        ns,
        &[
            "l2advertisement/tiny",
            "ipaddresspool/tiny",
            "ipaddresspool/lonely",
            "l2advertisement/nowhere",
            "ipaddresspool/nowhere",
            "l2advertisement/private",
            "ipaddresspool/private",
        ],
    );
    let mut scope = TestScope::new(lab, "explain-bad").await?;
    scope.deploy("web", &["node1"]).await?;
    let api: Api<Service> = Api::namespaced(lab.client().await?, &scope.namespace);
    create(
        &api,
        service("holder", &[("metallb.io/address-pool", "tiny")]).build(),
    )
    .await?;
    wait_ips(&api, "holder", 1).await?;
    for pool in ["lonely", "nowhere"] {
        create(
            &api,
            service(pool, &[("metallb.io/address-pool", pool)]).build(),
        )
        .await?;
        wait_ips(&api, pool, 1).await?;
    }
    for (name, annotations) in [
        ("exhausted", &[("metallb.io/address-pool", "tiny")][..]),
        ("unknown", &[("metallb.io/address-pool", "nope")]),
        ("outside", &[("metallb.io/loadBalancerIPs", "198.18.250.1")]),
        ("private", &[("metallb.io/address-pool", "private")]),
        (
            "intruder",
            &[
                ("metallb.io/loadBalancerIPs", "198.18.210.5"),
                ("metallb.io/allow-shared-ip", "k"),
            ],
        ),
    ] {
        create(&api, service(name, annotations).build()).await?;
    }
    let ns_svc = |name: &str| format!("{}/{name}", scope.namespace);
    let cases = [
        (
            "exhausted",
            "pool-exhausted",
            "IPAddressPool",
            "tiny",
            Some("spec.addresses"),
        ),
        (
            "unknown",
            "unknown-pool",
            "Service",
            "unknown",
            Some("metadata.annotations[metallb.io/address-pool]"),
        ),
        (
            "outside",
            "ip-outside-pools",
            "Service",
            "outside",
            Some("metadata.annotations[metallb.io/loadBalancerIPs]"),
        ),
        (
            "lonely",
            "no-advertisement",
            "IPAddressPool",
            "lonely",
            None,
        ),
        ("nowhere", "not-announced", "Service", "nowhere", None),
        (
            "private",
            "pool-does-not-admit",
            "IPAddressPool",
            "private",
            Some("spec.serviceAllocation"),
        ),
        (
            "intruder",
            "sharing-refused",
            "Service",
            "intruder",
            Some("metadata.annotations[metallb.io/allow-shared-ip]"),
        ),
    ];
    for (name, code, kind, object, field) in cases {
        let key = ns_svc(name);
        let run = cli(lab, &["explain", "service", &key, "-o", "json"])?;
        let report = run.json()?;
        ensure!(run.code == Some(2), "{key}: exit {:?}", run.code);
        ensure!(
            codes(&report) == [code],
            "{key}: want [{code}], got {:?}:\n{report:#}",
            codes(&report)
        );
        let d = &report["diagnoses"][0];
        ensure!(
            d["object"]["kind"] == kind && d["object"]["name"] == object,
            "{key}: object {}",
            d["object"]
        );
        if let Some(field) = field {
            ensure!(d["field"] == field, "{key}: field {}", d["field"]);
        }
        ensure!(
            !d["fix"].as_str().unwrap_or_default().is_empty(),
            "{key}: no fix"
        );
        let text = cli(lab, &["explain", "service", &key])?;
        ensure!(
            text.stdout.contains("Problems:") && text.stdout.contains(code),
            "{key}: text:\n{}",
            text.stdout
        );
        golden(
            &format!("explain/l2-{code}.txt"),
            &text,
            &["explain", "service", &key],
        )?;
    }
    Ok(())
}

/// An IPAddressPool overlapping another is left out of the configuration (the older object
/// wins): `status` names it as a problem with its field; `explain` of a served Service notes it,
/// of a Service without an address names it as its first problem.
async fn a_left_out_object_is_named(ctx: Ctx) -> anyhow::Result<()> {
    let lab = &ctx.lab;
    let ns = ferrolb::NAMESPACE;
    let mut scope = TestScope::new(lab, "explain-config").await?;
    scope.deploy("web", &["node1"]).await?;
    let api: Api<Service> = Api::namespaced(lab.client().await?, &scope.namespace);
    create(&api, service("web", &[]).build()).await?;
    wait_ips(&api, "web", 1).await?;
    lab.apply(&format!(
        "apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {{name: overlap, namespace: {ns}}}
spec:
  addresses: ['198.18.200.128/30']
  autoAssign: false
"
    ))?;
    let _delete = lab.delete_on_drop(ns, &["ipaddresspool/overlap"]);
    let key = format!("{}/web", scope.namespace);
    // A Service that is served: the left-out object is a note, not its problem.
    let run = cli(lab, &["explain", "service", &key, "-o", "json"])?;
    let report = run.json()?;
    ensure!(run.code == Some(0), "exit {:?}: {report:#}", run.code);
    ensure!(
        report["notes"].as_array().into_iter().flatten().any(|n| n
            .as_str()
            .is_some_and(|n| n.contains("IPAddressPool metallb-system/overlap"))),
        "{report:#}"
    );
    // `status` names it as a problem, once, with its field.
    let run = cli(lab, &["status", "-o", "json"])?;
    let status = run.json()?;
    ensure!(run.code == Some(2), "status exit {:?}", run.code);
    let d = &status["diagnoses"][0];
    ensure!(
        d["code"] == "config-left-out"
            && d["object"]["kind"] == "IPAddressPool"
            && d["object"]["name"] == "overlap"
            && d["field"]
                .as_str()
                .is_some_and(|f| f.starts_with("spec.addresses")),
        "{status:#}"
    );
    // A Service without an address gets it as a problem, first: it may be why.
    create(
        &api,
        service("stuck", &[("metallb.io/address-pool", "overlap")]).build(),
    )
    .await?;
    let stuck = cli(
        lab,
        &[
            "explain",
            "service",
            &format!("{}/stuck", scope.namespace),
            "-o",
            "json",
        ],
    )?
    .json()?;
    ensure!(
        stuck["diagnoses"][0]["code"] == "config-left-out",
        "{stuck:#}"
    );
    let stuck_key = format!("{}/stuck", scope.namespace);
    golden(
        "explain/l2-config-left-out.txt",
        &cli(lab, &["explain", "service", &stuck_key])?,
        &["explain", "service", &stuck_key],
    )?;
    // The Service itself is fine: its pool and rule are still explained.
    ensure!(report["allocation"]["pool"] == "explain", "{report:#}");
    Ok(())
}

/// Waits until `explain service key` reports `code` (and exit status 2); returns the text run.
async fn wait_code(lab: &Lab, key: &str, code: &str) -> anyhow::Result<Run> {
    wait_for(
        &format!("explain to report {code} for {key}"),
        Duration::from_secs(60),
        || async {
            let run =
                cli(lab, &["explain", "service", key, "-o", "json"]).map_err(|e| e.to_string())?;
            let report = run.json().map_err(|e| e.to_string())?;
            if run.code == Some(2) && codes(&report) == [code] {
                Ok(Some(()))
            } else {
                Err(format!("exit {:?}: {:?}", run.code, codes(&report)))
            }
        },
    )
    .await?;
    cli(lab, &["explain", "service", key])
}

/// What only the Nodes and the speakers' live reports show, each the one diagnosis of its
/// Service: the only selected node excluded by its label; externalTrafficPolicy Local with no
/// endpoint on a selected node; no speaker on the selected node; a speaker that renews its
/// Lease but does not answer (frozen); a speaker cut off from the others' heartbeats.
async fn nodes_and_speakers_are_diagnosed(ctx: Ctx) -> anyhow::Result<()> {
    let lab = &ctx.lab;
    let ns = ferrolb::NAMESPACE;
    lab.kubectl(&["label", "node", "node2", "explain-pick=yes", "--overwrite"])?;
    struct Unlabel<'a>(&'a Lab);
    impl Drop for Unlabel<'_> {
        fn drop(&mut self) {
            for label in ["explain-pick-", ferrolb_explain_exclude_removal()] {
                let _ = self.0.kubectl(&["label", "node", "node2", label]);
            }
        }
    }
    let _unlabel = Unlabel(lab);
    lab.apply(&format!(
        "apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {{name: picky, namespace: {ns}}}
spec:
  addresses: ['198.18.214.0/28']
  autoAssign: false
---
apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {{name: picky, namespace: {ns}}}
spec:
  ipAddressPools: [picky]
  nodeSelectors:
  - matchLabels: {{explain-pick: 'yes'}}
"
    ))?;
    let _delete = lab.delete_on_drop(ns, &["l2advertisement/picky", "ipaddresspool/picky"]);
    let mut scope = TestScope::new(lab, "explain-nodes").await?;
    scope.deploy("web", &["node1", "node2"]).await?;
    scope.deploy("solo", &["node1"]).await?;
    let api: Api<Service> = Api::namespaced(lab.client().await?, &scope.namespace);
    let picky = [("metallb.io/address-pool", "picky")];
    create(&api, service("picky", &picky).build()).await?;
    let local = service("local", &picky)
        .external_traffic_policy("Local")
        .selector("app", "solo");
    create(&api, local.build()).await?;
    // Its own address, whatever the earlier tests' Services still hold: the owner and the
    // takeover order in the golden files are hashed from it.
    create(
        &api,
        service("web", &[("metallb.io/loadBalancerIPs", "198.18.200.150")]).build(),
    )
    .await?;
    for name in ["picky", "local", "web"] {
        wait_ips(&api, name, 1).await?;
    }
    let key = |name: &str| format!("{}/{name}", scope.namespace);
    wait_announced(lab, &key("picky")).await?;

    // Local policy, the pods on node1, only node2 selected.
    let run = wait_code(lab, &key("local"), "local-without-endpoint").await?;
    golden(
        "explain/l2-local-without-endpoint.txt",
        &run,
        &["explain", "service", &key("local")],
    )?;

    // The only selected node excluded.
    lab.kubectl(&[
        "label",
        "node",
        "node2",
        "node.kubernetes.io/exclude-from-external-load-balancers=true",
    ])?;
    let run = wait_code(lab, &key("picky"), "node-excluded").await?;
    golden(
        "explain/l2-node-excluded.txt",
        &run,
        &["explain", "service", &key("picky")],
    )?;
    lab.kubectl(&["label", "node", "node2", ferrolb_explain_exclude_removal()])?;
    wait_announced(lab, &key("picky")).await?;

    // No speaker on the selected node (stopped cleanly: its presence Lease goes).
    ctx.speakers.stop("node2");
    let stopped = wait_code(lab, &key("picky"), "no-speaker").await;
    ctx.speakers.start("node2")?;
    golden(
        "explain/l2-no-speaker.txt",
        &stopped?,
        &["explain", "service", &key("picky")],
    )?;
    wait_announced(lab, &key("picky")).await?;

    // A frozen speaker: its Lease is still fresh, it does not answer.
    ctx.speakers.freeze("node3", true)?;
    let frozen = wait_code(lab, &key("web"), "speaker-unreachable").await;
    ctx.speakers.freeze("node3", false)?;
    golden(
        "explain/l2-speaker-unreachable.txt",
        &frozen?,
        &["explain", "service", &key("web")],
    )?;
    wait_announced(lab, &key("web")).await?;

    // node3 cut off from the heartbeats both ways: it loses its quorum.
    let cut = HeartbeatFault::block(lab, "node3", &["INPUT", "OUTPUT"])?;
    let run = wait_code(lab, &key("web"), "speaker-cut-off").await;
    drop(cut);
    golden(
        "explain/l2-speaker-cut-off.txt",
        &run?,
        &["explain", "service", &key("web")],
    )?;
    wait_announced(lab, &key("web")).await?;
    Ok(())
}

/// Removes the exclusion label (`kubectl label node N LABEL-`).
fn ferrolb_explain_exclude_removal() -> &'static str {
    "node.kubernetes.io/exclude-from-external-load-balancers-"
}

/// An IP no Service holds, a Service that does not exist, a usage mistake: a clear error and
/// exit status 1 (2 means problems found), nothing on stdout.
async fn an_ip_nobody_holds_is_a_clear_error(ctx: Ctx) -> anyhow::Result<()> {
    let missing = cli(&ctx.lab, &["explain", "service", "nowhere/nothing"])?;
    ensure!(
        missing.code == Some(1)
            && missing.stdout.is_empty()
            && missing
                .stderr
                .contains("no LoadBalancer Service nowhere/nothing"),
        "exit {:?}: {}{}",
        missing.code,
        missing.stdout,
        missing.stderr
    );
    let usage = cli(&ctx.lab, &["explain", "nonsense"])?;
    ensure!(usage.code == Some(1), "usage error: exit {:?}", usage.code);
    let run = cli(&ctx.lab, &["explain", "ip", "198.18.250.9"])?;
    ensure!(run.code == Some(1), "exit {:?}", run.code);
    ensure!(run.stdout.is_empty(), "{}", run.stdout);
    ensure!(
        run.stderr
            .contains("no Service has 198.18.250.9 in its status.loadBalancer.ingress"),
        "{}",
        run.stderr
    );
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args = Arguments::from_args();
    let conclusion = Suite::new("explain")
        .one_at_a_time()
        .test("healthy_service_and_kube_proxy_chains", |c| {
            Box::pin(healthy_service_and_kube_proxy_chains(c))
        })
        .test("allocation_problems_are_diagnosed", |c| {
            Box::pin(allocation_problems_are_diagnosed(c))
        })
        .test("a_left_out_object_is_named", |c| {
            Box::pin(a_left_out_object_is_named(c))
        })
        .test("nodes_and_speakers_are_diagnosed", |c| {
            Box::pin(nodes_and_speakers_are_diagnosed(c))
        })
        .test("an_ip_nobody_holds_is_a_clear_error", |c| {
            Box::pin(an_ip_nobody_holds_is_a_clear_error(c))
        })
        .run(&args, |lab| {
            Box::pin(async move {
                Deployment::start(
                    &lab,
                    "explain",
                    &ferrolb::l2_pool("explain", &["198.18.200.128/26", "fd00:18::c8:8000/113"]),
                )
            })
        });
    suite::exit_code(&[conclusion])
}
