//! ferrolb-controller end to end: two replicas with their own ServiceAccount and least-privilege
//! RBAC, against the lab's real API server. Tests run one at a time (they share the
//! controller); each works in its own namespace with its own pool, removed afterwards.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, ensure};
use ferrolb_e2e::Lab;
use ferrolb_e2e::cluster::wait_for;
use ferrolb_e2e::process::{self, LabProcess};
use ferrolb_e2e::scope::TestScope;
use ferrolb_e2e::service::{ingress_ips, lb_service, wait_ips};
use ferrolb_e2e::suite::{self, Fixture, Suite};
use ferrolb_testkit::objects::service;
use ferrolb_testkit::trial::Arguments;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};

const NS: &str = "metallb-system";

/// The controller replicas of the test run.
struct Replicas {
    lab: Lab,
    kubeconfig: PathBuf,
    running: std::sync::Mutex<Vec<(String, LabProcess)>>,
}

impl Replicas {
    fn start(&self, identity: &str, port: u16) -> anyhow::Result<()> {
        let kubeconfig = self.kubeconfig_of(identity)?;
        let p = ferrolb_e2e::ferrolb::start_controller(&self.lab, &kubeconfig, identity, port)?;
        self.running.lock().unwrap().push((identity.to_string(), p));
        Ok(())
    }

    /// The address replica `identity` reaches the API server at: each its own, so that a test
    /// can cut one replica off (`a` over loopback, `b` over the control plane's IPv6 address; the
    /// rest of the lab uses its IPv4 address; all three are in the serving certificate).
    fn api_address(&self, identity: &str) -> String {
        let cp_v6 = self
            .lab
            .topology
            .host("cp")
            .map(|h| h.interfaces[0].ipv6.to_string())
            .unwrap_or_default();
        if identity == "a" {
            "127.0.0.1".into()
        } else {
            cp_v6
        }
    }

    /// A copy of the controller's kubeconfig that reaches the API server at the replica's address.
    fn kubeconfig_of(&self, identity: &str) -> anyhow::Result<PathBuf> {
        let text = std::fs::read_to_string(&self.kubeconfig)?;
        let usual = format!("https://{}:6443", self.lab.topology.apiserver_address());
        anyhow::ensure!(
            text.contains(&usual),
            "the kubeconfig does not name {usual}"
        );
        let address = self.api_address(identity);
        let server = if address.contains(':') {
            format!("https://[{address}]:6443")
        } else {
            format!("https://{address}:6443")
        };
        let path = self
            .kubeconfig
            .with_extension(format!("{identity}.kubeconfig"));
        std::fs::write(&path, text.replace(&usual, &server))?;
        Ok(path)
    }

    fn kill(&self, identity: &str) {
        let mut running = self.running.lock().unwrap();
        running.retain(|(id, p)| {
            if id == identity {
                process::kill_now(p);
                false
            } else {
                true
            }
        });
    }

    fn stop_all(&self) {
        for (_, p) in self.running.lock().unwrap().drain(..) {
            process::stop(&p, Duration::from_secs(5));
        }
    }
}

async fn wait_event(
    lab: &Lab,
    namespace: &str,
    object: &str,
    reason: &str,
) -> anyhow::Result<String> {
    let events: Api<Event> = Api::namespaced(lab.client().await?, namespace);
    wait_for(
        &format!("a {reason} Event on {namespace}/{object}"),
        Duration::from_secs(30),
        || async {
            let list = events
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let found = list.items.iter().find(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(object)
            });
            match found {
                Some(e) => Ok(Some(e.note.clone().unwrap_or_default())),
                None => Err(format!(
                    "{} events, none {reason} on {object}",
                    list.items.len()
                )),
            }
        },
    )
    .await
}

fn pool_yaml(name: &str, namespace: &str, addresses: &[&str], extra: &str) -> String {
    format!(
        "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {{name: {name}, namespace: {NS}}}\nspec:\n  addresses: [{}]\n  serviceAllocation: {{priority: 10, namespaces: [{namespace}]}}\n{extra}",
        addresses
            .iter()
            .map(|a| format!("'{a}'"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// A test namespace plus its pools, all removed on drop.
struct Case {
    scope: TestScope,
    pools: Vec<String>,
}

impl Case {
    async fn new(lab: &Lab, namespace: &str) -> anyhow::Result<Self> {
        Ok(Self {
            scope: TestScope::new(lab, namespace).await?,
            pools: Vec::new(),
        })
    }
    fn pool(&mut self, name: &str, addresses: &[&str], extra: &str) -> anyhow::Result<()> {
        self.scope
            .lab
            .apply(&pool_yaml(name, &self.scope.namespace, addresses, extra))?;
        self.pools.push(name.into());
        Ok(())
    }
    /// A pool with a spec written out in YAML flow style.
    fn pool_spec(&mut self, name: &str, spec: &str) -> anyhow::Result<()> {
        self.scope.lab.apply(&format!("apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {{name: {name}, namespace: {NS}}}\nspec: {spec}\n"))?;
        self.pools.push(name.into());
        Ok(())
    }
    async fn services(&self) -> anyhow::Result<Api<Service>> {
        Ok(Api::namespaced(
            self.scope.lab.client().await?,
            &self.scope.namespace,
        ))
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        for pool in &self.pools {
            let _ = self.scope.lab.kubectl(&[
                "delete",
                "ipaddresspool",
                "-n",
                NS,
                pool,
                "--ignore-not-found",
                "--wait=false",
            ]);
        }
    }
}

async fn allocation_from_a_pool(lab: &Lab) -> anyhow::Result<()> {
    let mut case = Case::new(lab, "ctl-alloc").await?;
    case.pool("ctl-alloc", &["198.18.210.0/29", "fd00:18::d2:0/125"], "")?;
    let api = case.services().await?;
    api.create(
        &PostParams::default(),
        &lb_service("web")
            .ip_family_policy("PreferDualStack")
            .ip_families(&["IPv4", "IPv6"])
            .build(),
    )
    .await?;
    let s = wait_ips(&api, "web", 2).await?;
    let ips = ingress_ips(&s);
    ensure!(ips == ["198.18.210.0", "fd00:18::d2:0"], "IPs {ips:?}");
    let annotations = s.metadata.annotations.unwrap_or_default();
    ensure!(
        annotations
            .get("metallb.io/ip-allocated-from-pool")
            .map(String::as_str)
            == Some("ctl-alloc"),
        "annotations {annotations:?}"
    );
    let mode = s
        .status
        .and_then(|st| st.load_balancer)
        .and_then(|lb| lb.ingress)
        .and_then(|i| i[0].ip_mode.clone());
    ensure!(mode.as_deref() == Some("VIP"), "ipMode {mode:?}");
    let note = wait_event(lab, "ctl-alloc", "web", "IPAllocated").await?;
    ensure!(note.contains("198.18.210.0"), "event note {note:?}");
    // The pool's status counts it.
    wait_for("pool status to count 1 IPv4 and 1 IPv6", Duration::from_secs(20), || async {
        let out = lab.kubectl(&["get", "ipaddresspool", "-n", NS, "ctl-alloc", "-o", "jsonpath={.status.assignedIPv4} {.status.assignedIPv6} {.status.availableIPv4}"]).map_err(|e| e.to_string())?;
        if out.trim() == "1 1 7" { Ok(Some(())) } else { Err(out) }
    })
    .await
}

async fn requested_ips(lab: &Lab) -> anyhow::Result<()> {
    let mut case = Case::new(lab, "ctl-request").await?;
    case.pool("ctl-request", &["198.18.211.0/28"], "")?;
    let api = case.services().await?;
    api.create(
        &PostParams::default(),
        &lb_service("by-annotation")
            .annotation("metallb.io/loadBalancerIPs", "198.18.211.7")
            .build(),
    )
    .await?;
    api.create(
        &PostParams::default(),
        &lb_service("by-spec")
            .load_balancer_ip("198.18.211.9")
            .build(),
    )
    .await?;
    api.create(
        &PostParams::default(),
        &lb_service("both")
            .annotation("metallb.io/loadBalancerIPs", "198.18.211.3")
            .load_balancer_ip("198.18.211.3")
            .build(),
    )
    .await?;
    ensure!(ingress_ips(&wait_ips(&api, "by-annotation", 1).await?) == ["198.18.211.7"]);
    ensure!(ingress_ips(&wait_ips(&api, "by-spec", 1).await?) == ["198.18.211.9"]);
    let note = wait_event(lab, "ctl-request", "both", "AllocationFailed").await?;
    ensure!(note.contains("loadBalancerIP"), "note {note:?}");
    ensure!(
        ingress_ips(&api.get("both").await?).is_empty(),
        "both got an IP"
    );
    Ok(())
}

async fn exhaustion_then_release(lab: &Lab) -> anyhow::Result<()> {
    let mut case = Case::new(lab, "ctl-full").await?;
    case.pool("ctl-full", &["198.18.212.0/31"], "")?;
    let api = case.services().await?;
    for name in ["a", "b", "c"] {
        api.create(&PostParams::default(), &lb_service(name).build())
            .await?;
        if name != "c" {
            wait_ips(&api, name, 1).await?;
        }
    }
    let note = wait_event(lab, "ctl-full", "c", "AllocationFailed").await?;
    ensure!(note.contains("ctl-full"), "note {note:?}");
    let freed = ingress_ips(&api.get("a").await?);
    api.delete("a", &DeleteParams::default()).await?;
    let c = wait_ips(&api, "c", 1).await?;
    ensure!(
        ingress_ips(&c) == freed,
        "c got {:?}, freed {freed:?}",
        ingress_ips(&c)
    );
    Ok(())
}

async fn type_change_and_foreign_class(lab: &Lab) -> anyhow::Result<()> {
    let mut case = Case::new(lab, "ctl-type").await?;
    case.pool("ctl-type", &["198.18.213.0/30"], "")?;
    let api = case.services().await?;
    api.create(&PostParams::default(), &lb_service("lb").build())
        .await?;
    wait_ips(&api, "lb", 1).await?;
    api.patch(
        "lb",
        &PatchParams::default(),
        &Patch::Merge(&serde_json::json!({"spec": {"type": "ClusterIP"}})),
    )
    .await?;
    wait_for(
        "the controller to clear a Service that became ClusterIP",
        Duration::from_secs(30),
        || async {
            let s = api.get("lb").await.map_err(|e| e.to_string())?;
            let annotated = s
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key("metallb.io/ip-allocated-from-pool"));
            if ingress_ips(&s).is_empty() && !annotated {
                Ok(Some(()))
            } else {
                Err(format!("ips {:?}, annotated {annotated}", ingress_ips(&s)))
            }
        },
    )
    .await?;
    api.create(
        &PostParams::default(),
        &lb_service("foreign")
            .load_balancer_class("example.com/other")
            .build(),
    )
    .await?;
    // Give the controller time to (wrongly) act, then check nothing was written.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let s = api.get("foreign").await?;
    ensure!(
        ingress_ips(&s).is_empty() && s.metadata.annotations.unwrap_or_default().is_empty(),
        "foreign Service was touched"
    );
    Ok(())
}

async fn invalid_and_overlapping_pools_are_reported(lab: &Lab) -> anyhow::Result<()> {
    let mut case = Case::new(lab, "ctl-config").await?;
    case.pool("ctl-config", &["198.18.214.0/29"], "")?;
    let api = case.services().await?;
    api.create(&PostParams::default(), &lb_service("keeps").build())
        .await?;
    let before = ingress_ips(&wait_ips(&api, "keeps", 1).await?);
    // Overlaps ctl-config: accepted by the API server, left out by the controller.
    case.pool("ctl-config-overlap", &["198.18.214.4/30"], "")?;
    let summary = wait_for(
        "ConfigurationState controller to report the overlap",
        Duration::from_secs(30),
        || async {
            let out = lab
                .kubectl(&[
                    "get",
                    "configurationstate",
                    "-n",
                    NS,
                    "controller",
                    "-o",
                    "jsonpath={.status.result}|{.status.errorSummary}",
                ])
                .map_err(|e| e.to_string())?;
            if out.starts_with("Invalid|") && out.contains("ctl-config-overlap") {
                Ok(Some(out))
            } else {
                Err(out)
            }
        },
    )
    .await?;
    ensure!(
        summary.contains("IPAddressPool metallb-system/ctl-config-overlap: spec.addresses[0]"),
        "{summary}"
    );
    // An invalid pool is refused at admission (CEL), with the field named.
    let refused = case.scope.lab.apply(&pool_yaml(
        "ctl-config-bad",
        "ctl-config",
        &["198.18.214.300/32"],
        "",
    ));
    ensure!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("spec.addresses[0]")),
        "{refused:?}"
    );
    api.create(&PostParams::default(), &lb_service("new").build())
        .await?;
    wait_ips(&api, "new", 1).await?;
    ensure!(
        ingress_ips(&api.get("keeps").await?) == before,
        "existing IP changed"
    );
    case.scope
        .lab
        .kubectl(&["delete", "ipaddresspool", "-n", NS, "ctl-config-overlap"])?;
    wait_for(
        "ConfigurationState back to Valid",
        Duration::from_secs(30),
        || async {
            let out = lab
                .kubectl(&[
                    "get",
                    "configurationstate",
                    "-n",
                    NS,
                    "controller",
                    "-o",
                    "jsonpath={.status.result}",
                ])
                .map_err(|e| e.to_string())?;
            if out == "Valid" {
                Ok(Some(()))
            } else {
                Err(out)
            }
        },
    )
    .await
}

/// An IPAddressPool stored under a looser schema than ferrolb's types (an older CRD, or
/// MetalLB's: here the CRD without `format: int32` on the priority, which the API server checks)
/// with a priority above `i32::MAX` is refused by name and field, and the pools around it, old
/// and new, work on (issue #33, item 10). The API server does not check stored objects again
/// when the CRD is put back.
async fn undecodable_pool_is_refused_by_name(lab: &Lab) -> anyhow::Result<()> {
    let mut case = Case::new(lab, "ctl-undecodable").await?;
    case.pool("ctl-undecodable-good", &["198.18.215.0/29"], "")?;
    let api = case.services().await?;
    api.create(&PostParams::default(), &lb_service("before").build())
        .await?;
    let before = ingress_ips(&wait_ips(&api, "before", 1).await?);
    lab.kubectl(&[
        "patch",
        "crd",
        "ipaddresspools.metallb.io",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/serviceAllocation/properties/priority/format"}]"#,
    ])?;
    let stored = case.pool_spec(
        "ctl-undecodable",
        "{addresses: ['198.18.215.8/29'], serviceAllocation: {priority: 3000000000, namespaces: [ctl-undecodable]}}",
    );
    // The CRD as the chart has it, whatever happened.
    lab.install_crds()?;
    stored?;
    let summary = wait_for(
        "ConfigurationState controller to name the undecodable pool",
        Duration::from_secs(30),
        || async {
            let out = lab
                .kubectl(&[
                    "get",
                    "configurationstate",
                    "-n",
                    NS,
                    "controller",
                    "-o",
                    "jsonpath={.status.result}|{.status.errorSummary}",
                ])
                .map_err(|e| e.to_string())?;
            if out.contains("metallb-system/ctl-undecodable:") {
                Ok(Some(out))
            } else {
                Err(out)
            }
        },
    )
    .await?;
    ensure!(
        summary.contains(
            "IPAddressPool metallb-system/ctl-undecodable: spec.serviceAllocation.priority: cannot be read"
        ),
        "{summary}"
    );
    let note = wait_event(lab, NS, "ctl-undecodable", "InvalidConfiguration").await?;
    ensure!(note.contains("spec.serviceAllocation.priority"), "{note}");
    // A pool added after it is read (a watch failing on the bad object would never see it).
    case.pool("ctl-undecodable-later", &["198.18.215.16/29"], "")?;
    api.create(
        &PostParams::default(),
        &lb_service("later")
            .annotation("metallb.io/address-pool", "ctl-undecodable-later")
            .build(),
    )
    .await?;
    ensure!(ingress_ips(&wait_ips(&api, "later", 1).await?) == ["198.18.215.16"]);
    ensure!(
        ingress_ips(&api.get("before").await?) == before,
        "existing IP changed"
    );
    Ok(())
}

async fn pool_annotation_and_auto_assign_false(lab: &Lab) -> anyhow::Result<()> {
    let mut case = Case::new(lab, "ctl-pool").await?;
    case.pool_spec("ctl-pool-auto", "{addresses: ['198.18.217.0/30'], serviceAllocation: {priority: 10, namespaces: [ctl-pool]}}")?;
    case.pool_spec("ctl-pool-manual", "{addresses: ['198.18.217.8/30'], autoAssign: false, serviceAllocation: {namespaces: [ctl-pool]}}")?;
    let api = case.services().await?;
    api.create(&PostParams::default(), &lb_service("auto").build())
        .await?;
    api.create(
        &PostParams::default(),
        &lb_service("manual")
            .annotation("metallb.io/address-pool", "ctl-pool-manual")
            .build(),
    )
    .await?;
    api.create(
        &PostParams::default(),
        &lb_service("old-prefix")
            .annotation("metallb.universe.tf/address-pool", "ctl-pool-manual")
            .build(),
    )
    .await?;
    ensure!(ingress_ips(&wait_ips(&api, "auto", 1).await?) == ["198.18.217.0"]);
    ensure!(ingress_ips(&wait_ips(&api, "manual", 1).await?) == ["198.18.217.8"]);
    ensure!(ingress_ips(&wait_ips(&api, "old-prefix", 1).await?) == ["198.18.217.9"]);
    let note = wait_event(lab, "ctl-pool", "old-prefix", "deprecatedAnnotation").await?;
    ensure!(note.contains("metallb.io/address-pool"), "{note}");
    Ok(())
}

async fn service_allocation_by_namespace_labels_and_priority(lab: &Lab) -> anyhow::Result<()> {
    let mut case = Case::new(lab, "ctl-sa").await?;
    lab.kubectl(&["label", "namespace", "ctl-sa", "team=red", "--overwrite"])?;
    case.pool_spec(
        "ctl-sa-web",
        "{addresses: ['198.18.218.0/30'], serviceAllocation: {priority: 5, namespaceSelectors: [{matchLabels: {team: red}}], serviceSelectors: [{matchLabels: {tier: web}}]}}",
    )?;
    case.pool_spec(
        "ctl-sa-ns",
        "{addresses: ['198.18.218.8/30'], serviceAllocation: {priority: 20, namespaces: [ctl-sa]}}",
    )?;
    case.pool_spec("ctl-sa-blue", "{addresses: ['198.18.218.16/30'], serviceAllocation: {priority: 1, namespaceSelectors: [{matchLabels: {team: blue}}]}}")?;
    let api = case.services().await?;
    api.create(
        &PostParams::default(),
        &lb_service("web").label("tier", "web").build(),
    )
    .await?;
    api.create(&PostParams::default(), &lb_service("db").build())
        .await?;
    ensure!(
        ingress_ips(&wait_ips(&api, "web", 1).await?) == ["198.18.218.0"],
        "priority 5 pool with matching labels first"
    );
    ensure!(
        ingress_ips(&wait_ips(&api, "db", 1).await?) == ["198.18.218.8"],
        "namespace pool for unlabelled Service"
    );
    Ok(())
}

async fn sharing_allowed_and_refused(lab: &Lab) -> anyhow::Result<()> {
    let mut case = Case::new(lab, "ctl-share").await?;
    case.pool("ctl-share", &["198.18.219.0/29"], "")?;
    let api = case.services().await?;
    // One port `p` replaces lb_service's http port.
    let shared = |name: &str, port: i32| {
        service(name)
            .annotations([
                ("metallb.io/allow-shared-ip", "k"),
                ("metallb.io/loadBalancerIPs", "198.18.219.5"),
            ])
            .add_port(ServicePort {
                name: Some("p".into()),
                port,
                protocol: Some("TCP".into()),
                ..Default::default()
            })
    };
    api.create(&PostParams::default(), &shared("http", 80).build())
        .await?;
    api.create(&PostParams::default(), &shared("https", 443).build())
        .await?;
    ensure!(ingress_ips(&wait_ips(&api, "http", 1).await?) == ["198.18.219.5"]);
    ensure!(
        ingress_ips(&wait_ips(&api, "https", 1).await?) == ["198.18.219.5"],
        "sharing with the same key and other ports"
    );
    api.create(&PostParams::default(), &shared("overlap", 80).build())
        .await?;
    let note = wait_event(lab, "ctl-share", "overlap", "AllocationFailed").await?;
    ensure!(note.contains("80"), "port overlap named: {note}");
    api.create(
        &PostParams::default(),
        &shared("local", 8443)
            .external_traffic_policy("Local")
            .build(),
    )
    .await?;
    let note = wait_event(lab, "ctl-share", "local", "AllocationFailed").await?;
    ensure!(
        note.to_lowercase().contains("traffic") || note.to_lowercase().contains("backend"),
        "backend mismatch named: {note}"
    );
    ensure!(
        ingress_ips(&api.get("overlap").await?).is_empty()
            && ingress_ips(&api.get("local").await?).is_empty()
    );
    Ok(())
}

async fn dual_stack_policies(lab: &Lab) -> anyhow::Result<()> {
    let mut case = Case::new(lab, "ctl-dual").await?;
    case.pool("ctl-dual", &["198.18.220.0/30", "fd00:18::dc:0/126"], "")?;
    let api = case.services().await?;
    api.create(
        &PostParams::default(),
        &lb_service("require")
            .ip_family_policy("RequireDualStack")
            .ip_families(&["IPv4", "IPv6"])
            .build(),
    )
    .await?;
    api.create(
        &PostParams::default(),
        &lb_service("prefer")
            .ip_family_policy("PreferDualStack")
            .ip_families(&["IPv6", "IPv4"])
            .build(),
    )
    .await?;
    api.create(
        &PostParams::default(),
        &lb_service("v6only")
            .ip_family_policy("SingleStack")
            .ip_families(&["IPv6"])
            .build(),
    )
    .await?;
    ensure!(ingress_ips(&wait_ips(&api, "require", 2).await?) == ["198.18.220.0", "fd00:18::dc:0"]);
    let prefer = ingress_ips(&wait_ips(&api, "prefer", 2).await?);
    ensure!(
        prefer == ["fd00:18::dc:1", "198.18.220.1"],
        "IPv6 first as the Service's families say: {prefer:?}"
    );
    ensure!(ingress_ips(&wait_ips(&api, "v6only", 1).await?) == ["fd00:18::dc:2"]);
    Ok(())
}

async fn pool_shrink_and_deletion(lab: &Lab) -> anyhow::Result<()> {
    let mut case = Case::new(lab, "ctl-shrink").await?;
    case.pool("ctl-shrink", &["198.18.221.0/29"], "")?;
    let api = case.services().await?;
    for name in ["a", "b", "c"] {
        api.create(&PostParams::default(), &lb_service(name).build())
            .await?;
        wait_ips(&api, name, 1).await?;
    }
    let before: Vec<Vec<String>> =
        futures::future::try_join_all(["a", "b", "c"].map(|n| api.get(n)))
            .await?
            .iter()
            .map(ingress_ips)
            .collect();
    ensure!(
        before == [["198.18.221.0"], ["198.18.221.1"], ["198.18.221.2"]],
        "{before:?}"
    );
    // Shrink: .2 leaves the pool; only the Service holding it is touched.
    case.pool("ctl-shrink", &["198.18.221.0-198.18.221.1"], "")?;
    wait_event(lab, "ctl-shrink", "c", "AllocationFailed").await?;
    ensure!(ingress_ips(&wait_ips(&api, "c", 0).await?).is_empty());
    ensure!(
        ingress_ips(&api.get("a").await?) == ["198.18.221.0"]
            && ingress_ips(&api.get("b").await?) == ["198.18.221.1"],
        "others kept"
    );
    // Deletion: everything from the pool is cleared.
    lab.kubectl(&["delete", "ipaddresspool", "-n", NS, "ctl-shrink"])?;
    wait_ips(&api, "a", 0).await?;
    wait_ips(&api, "b", 0).await?;
    Ok(())
}

async fn bfd_profile_in_use_is_not_deleted(lab: &Lab) -> anyhow::Result<()> {
    lab.apply(&format!(
        "apiVersion: metallb.io/v1beta1\nkind: BFDProfile\nmetadata: {{name: ctl-bfd, namespace: {NS}}}\nspec: {{receiveInterval: 300}}\n---\napiVersion: metallb.io/v1beta2\nkind: BGPPeer\nmetadata: {{name: ctl-bfd-peer, namespace: {NS}}}\nspec: {{myASN: 64512, peerASN: 64500, peerAddress: 198.18.0.254, bfdProfile: ctl-bfd}}\n"
    ))?;
    let finalizers = || {
        lab.kubectl(&[
            "get",
            "bfdprofile",
            "-n",
            NS,
            "ctl-bfd",
            "-o",
            "jsonpath={.metadata.finalizers}",
        ])
    };
    wait_for(
        "the controller to protect the BFDProfile in use",
        Duration::from_secs(30),
        || {
            let out = finalizers();
            async move {
                match out {
                    Ok(f) if f.contains("metallb.io/bfdprofile-in-use") => Ok(Some(())),
                    other => Err(format!("{other:?}")),
                }
            }
        },
    )
    .await?;
    lab.kubectl(&["delete", "bfdprofile", "-n", NS, "ctl-bfd", "--wait=false"])?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let still = lab.kubectl(&[
        "get",
        "bfdprofile",
        "-n",
        NS,
        "ctl-bfd",
        "-o",
        "jsonpath={.metadata.deletionTimestamp}",
    ])?;
    ensure!(
        !still.is_empty(),
        "the profile in use should wait for its peer, marked for deletion"
    );
    lab.kubectl(&["delete", "bgppeer", "-n", NS, "ctl-bfd-peer"])?;
    wait_for(
        "the unused BFDProfile to go",
        Duration::from_secs(30),
        || {
            let gone = lab
                .kubectl(&["get", "bfdprofile", "-n", NS, "ctl-bfd"])
                .is_err();
            async move {
                if gone {
                    Ok(Some(()))
                } else {
                    Err("still there".into())
                }
            }
        },
    )
    .await
}

async fn metrics_and_health(lab: &Lab) -> anyhow::Result<()> {
    let leader = leader(lab).await?;
    let port = if leader == "a" { 7472 } else { 7473 };
    let get = |path: &str| {
        lab.exec(
            "cp",
            "curl",
            &["-sf", &format!("http://127.0.0.1:{port}{path}")],
        )
    };
    ensure!(get("/healthz")?.trim() == "ok");
    ensure!(get("/readyz")?.trim() == "ok");
    let metrics = get("/metrics")?;
    for name in [
        "metallb_allocator_addresses_total{",
        "metallb_allocator_addresses_in_use_total{",
        "metallb_allocator_ipv4_addresses_in_use_total{",
        "metallb_k8s_client_config_loaded_bool 1",
        "metallb_k8s_client_config_stale_bool",
        "ferrolb_controller_leader 1",
        "ferrolb_controller_allocation_duration_seconds_bucket",
    ] {
        ensure!(
            metrics.contains(name),
            "/metrics of the leader lacks {name}:\n{metrics}"
        );
    }
    Ok(())
}

async fn leader(lab: &Lab) -> anyhow::Result<String> {
    let leases: Api<Lease> = Api::namespaced(lab.client().await?, NS);
    wait_for("a leader", Duration::from_secs(30), || async {
        let l = leases
            .get_opt("ferrolb-controller")
            .await
            .map_err(|e| e.to_string())?;
        match l.and_then(|l| l.spec).and_then(|s| s.holder_identity) {
            Some(h) if !h.is_empty() => Ok(Some(h)),
            other => Err(format!("holder {other:?}")),
        }
    })
    .await
}

async fn snapshot(api: &Api<Service>) -> anyhow::Result<BTreeMap<String, Vec<String>>> {
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|s| (s.metadata.name.clone().unwrap_or_default(), ingress_ips(s)))
        .collect())
}

async fn restart_and_failover_change_no_ip(
    lab: &Lab,
    replicas: &Replicas,
    count: usize,
) -> anyhow::Result<()> {
    let mut case = Case::new(lab, "ctl-restart").await?;
    case.pool("ctl-restart", &["198.18.216.0/21"], "")?;
    let api = case.services().await?;
    // Create in an order unrelated to name order, so a restart that allocated in name order
    // would give different IPs.
    create_all(&api, (0..count).rev().map(|i| format!("svc-{i:05}"))).await?;
    let before = wait_for(
        &format!("all {count} Services to get an IP"),
        Duration::from_secs(300),
        || async {
            let snap = snapshot(&api).await.map_err(|e| e.to_string())?;
            let done = snap.values().filter(|ips| ips.len() == 1).count();
            if done == count {
                Ok(Some(snap))
            } else {
                Err(format!("{done}/{count} have an IP"))
            }
        },
    )
    .await?;

    // SIGKILL every replica, start them again: the new leader re-claims before it serves.
    let old = leader(lab).await?;
    replicas.kill("a");
    replicas.kill("b");
    replicas.start("a", 7472)?;
    replicas.start("b", 7473)?;
    api.create(&PostParams::default(), &lb_service("after-restart").build())
        .await?;
    wait_ips(&api, "after-restart", 1).await?;
    let mut after = snapshot(&api).await?;
    after.remove("after-restart");
    let changed: Vec<&String> = before
        .keys()
        .filter(|k| before.get(*k) != after.get(*k))
        .collect();
    ensure!(
        changed.is_empty(),
        "{} of {count} IPs changed across the restart (old leader {old}), e.g. {:?}",
        changed.len(),
        changed.iter().take(5).collect::<Vec<_>>()
    );

    // Kill the leader: the other replica takes over, serves a new Service, and changes no IP.
    let current = leader(lab).await?;
    replicas.kill(&current);
    api.create(
        &PostParams::default(),
        &lb_service("after-failover").build(),
    )
    .await?;
    wait_ips(&api, "after-failover", 1).await?;
    let new_leader = leader(lab).await?;
    ensure!(new_leader != current, "leader still {current}");
    let mut after = snapshot(&api).await?;
    after.remove("after-restart");
    after.remove("after-failover");
    let changed = before
        .keys()
        .filter(|k| before.get(*k) != after.get(*k))
        .count();
    ensure!(changed == 0, "{changed} IPs changed across the failover");
    replicas.start(&current, if current == "a" { 7472 } else { 7473 })?;
    Ok(())
}

/// A fault on one replica's traffic to the API server, in the control plane's namespace; removed
/// on drop (also when the test fails).
struct ApiFault {
    lab: Lab,
    undo: Vec<(String, Vec<String>)>,
}

impl ApiFault {
    fn run(lab: &Lab, program: &str, args: &[String]) -> anyhow::Result<()> {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        lab.exec("cp", program, &args)?;
        Ok(())
    }

    /// Drops every packet the replica sends to the API server.
    fn drop_all(lab: &Lab, address: &str) -> anyhow::Result<Self> {
        let tables = if address.contains(':') {
            "ip6tables"
        } else {
            "iptables"
        };
        let rule = |op: &str| -> Vec<String> {
            [
                op, "OUTPUT", "-p", "tcp", "-d", address, "--dport", "6443", "-j", "DROP",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect()
        };
        Self::run(lab, tables, &rule("-I"))?;
        Ok(Self {
            lab: lab.clone(),
            undo: vec![(tables.into(), rule("-D"))],
        })
    }
}

impl Drop for ApiFault {
    fn drop(&mut self) {
        for (program, args) in &self.undo {
            let _ = Self::run(&self.lab, program, args);
        }
    }
}

/// What a watcher of Services saw go wrong: an IP on two Services at once, or a Service whose IP
/// changed or went away.
#[derive(Default)]
struct Invariants {
    ips: BTreeMap<String, Vec<String>>,
    violations: Vec<String>,
    events: usize,
}

impl Invariants {
    fn saw(&mut self, name: &str, ips: Option<Vec<String>>) {
        self.events += 1;
        match ips {
            None => {
                self.ips.remove(name);
            }
            Some(ips) => {
                if let Some(before) = self.ips.get(name)
                    && !before.is_empty()
                    && *before != ips
                {
                    self.violations
                        .push(format!("{name}: IP changed from {before:?} to {ips:?}"));
                }
                for ip in &ips {
                    if let Some((other, _)) = self
                        .ips
                        .iter()
                        .find(|(n, held)| n.as_str() != name && held.contains(ip))
                    {
                        self.violations
                            .push(format!("{ip} on {name} and {other} at once"));
                    }
                }
                self.ips.insert(name.to_string(), ips);
            }
        }
    }
}

/// Watches the Services of `api` and checks [`Invariants`] on every change until dropped.
fn watch_invariants(
    api: Api<Service>,
) -> (
    std::sync::Arc<std::sync::Mutex<Invariants>>,
    tokio::task::JoinHandle<()>,
) {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Invariants::default()));
    let writer = std::sync::Arc::clone(&seen);
    let task = tokio::spawn(async move {
        use kube::runtime::watcher::{self, Event as W};
        let mut stream = std::pin::pin!(watcher::watcher(api, watcher::Config::default()));
        while let Some(event) = stream.next().await {
            let mut seen = writer.lock().unwrap();
            match event {
                Ok(W::Apply(s) | W::InitApply(s)) => seen.saw(
                    &s.metadata.name.clone().unwrap_or_default(),
                    Some(ingress_ips(&s)),
                ),
                Ok(W::Delete(s)) => seen.saw(&s.metadata.name.clone().unwrap_or_default(), None),
                Ok(W::Init | W::InitDone) | Err(_) => {}
            }
        }
    });
    (seen, task)
}

/// Creates LoadBalancer Services named `names`, 16 at a time, in that order.
async fn create_all(api: &Api<Service>, names: impl Iterator<Item = String>) -> anyhow::Result<()> {
    let created = futures::stream::iter(names)
        .map(|name| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &lb_service(&name).build())
                    .await
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    for r in created {
        r?;
    }
    Ok(())
}

/// Creates Services `prefix-000`.. in a burst.
async fn create_burst(api: &Api<Service>, prefix: &str, count: usize) -> anyhow::Result<()> {
    create_all(api, (0..count).map(|i| format!("{prefix}-{i:03}"))).await
}

/// The leader cut off from the API server (its packets dropped past its lease, then let through
/// with whatever its kernel still had queued) while Services are created and deleted in bursts: the other replica takes over, and a watcher
/// sees no IP on two Services at once and no Service's IP change, then or after the heal.
async fn leader_cut_off_from_the_api_server(lab: &Lab, replicas: &Replicas) -> anyhow::Result<()> {
    let mut case = Case::new(lab, "ctl-fence").await?;
    case.pool("ctl-fence", &["198.18.224.0/24"], "")?;
    let api = case.services().await?;
    let (seen, watcher) = watch_invariants(api.clone());
    struct Abort(tokio::task::JoinHandle<()>);
    impl Drop for Abort {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let _watcher = Abort(watcher);
    create_burst(&api, "before", 60).await?;
    let mut total = 60;
    // Two rounds: each replica is cut off once (whichever leads). Its packets are dropped, not
    // refused: requests it sent stay in its kernel's send queue and are retransmitted when the
    // cut heals, long after the other replica took over, which is the late write the fence is for.
    for (round, fault) in ["cut-1", "cut-2"].iter().enumerate() {
        let cut = leader(lab).await?;
        let address = replicas.api_address(&cut);
        let guard = ApiFault::drop_all(lab, &address)?;
        // Churn while it is cut off: deletions free IPs that new Services may take.
        for i in (round * 10)..(round * 10 + 10) {
            api.delete(&format!("before-{i:03}"), &DeleteParams::default())
                .await?;
        }
        total -= 10;
        create_burst(&api, fault, 60).await?;
        total += 60;
        wait_for(
            &format!("another replica to lead while {cut} is cut off ({fault})"),
            Duration::from_secs(60),
            || async {
                match leader(lab).await {
                    Ok(l) if l != cut => Ok(Some(())),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await?;
        tokio::time::sleep(Duration::from_secs(8)).await;
        drop(guard);
        // After the heal the old leader's late traffic (delayed packets, retransmissions) lands.
        tokio::time::sleep(Duration::from_secs(8)).await;
    }
    let want = total;
    wait_for(
        &format!("all {want} Services to get an IP"),
        Duration::from_secs(120),
        || async {
            let snap = snapshot(&api).await.map_err(|e| e.to_string())?;
            let done = snap.values().filter(|ips| ips.len() == 1).count();
            if done == want {
                Ok(Some(()))
            } else {
                Err(format!("{done}/{want} have an IP"))
            }
        },
    )
    .await?;
    let snap = snapshot(&api).await?;
    let mut all: Vec<&String> = snap.values().flatten().collect();
    all.sort();
    let distinct = all.len();
    all.dedup();
    ensure!(
        all.len() == distinct,
        "{} IPs given twice at the end",
        distinct - all.len()
    );
    let seen = seen.lock().unwrap();
    eprintln!(
        "ctl-fence: {} Service changes watched, {} violations",
        seen.events,
        seen.violations.len()
    );
    ensure!(
        seen.violations.is_empty(),
        "{} violations, e.g. {:?}",
        seen.violations.len(),
        seen.violations.iter().take(5).collect::<Vec<_>>()
    );
    Ok(())
}

/// Waits until replica `identity`'s log holds `text`.
async fn wait_log(replicas: &Replicas, identity: &str, text: &str) -> anyhow::Result<()> {
    let process = replicas
        .running
        .lock()
        .unwrap()
        .iter()
        .find(|(id, _)| id == identity)
        .map(|(_, p)| p.clone())
        .with_context(|| format!("replica {identity} is not running"))?;
    wait_for(
        &format!("{identity}'s log to say {text:?}"),
        Duration::from_secs(30),
        || async {
            let log = process::log_tail(&process, 400);
            if log.iter().any(|l| l.contains(text)) {
                Ok(Some(()))
            } else {
                Err(log.last().cloned().unwrap_or_default())
            }
        },
    )
    .await
}

/// A Service re-list older than a new term's fresh read (issue #33, item 4): the standby's
/// Service watch re-lists (failpoint `controller-services-relist`) and the list's end is held
/// while the leader gives the pool's one IP to Service `b`, created after the list; `c`, in the
/// list and waiting, becomes eligible for the pool; the leader dies and the standby leads, reads
/// afresh, and only then is the old list let through. Taking the list whole would drop `b`, free
/// its IP and give it to `c` (whose listed copy is current, so the write lands): one IP on two
/// Services. A watcher sees no IP on two Services and none changed, and `c` stays waiting.
async fn stale_relist_frees_no_ip(lab: &Lab, replicas: &Replicas) -> anyhow::Result<()> {
    const POOL: &str = "ctl-relist";
    let mut case = Case::new(lab, POOL).await?;
    // Only Services labelled `relist: first` at first.
    case.pool_spec(
        POOL,
        "{addresses: ['198.18.226.0/32'], serviceAllocation: {priority: 10, namespaces: [ctl-relist], serviceSelectors: [{matchLabels: {relist: first}}]}}",
    )?;
    let api = case.services().await?;
    let (seen, watcher) = watch_invariants(api.clone());
    struct Abort(tokio::task::JoinHandle<()>);
    impl Drop for Abort {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let _watcher = Abort(watcher);
    api.create(
        &PostParams::default(),
        &lb_service("c").label("relist", "second").build(),
    )
    .await?;
    // Let the leader see c (and give it nothing) before the list, so that c's listed copy is
    // its last.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let old = leader(lab).await?;
    let standby = if old == "a" { "b" } else { "a" };
    let dir = ferrolb_e2e::ferrolb::controller_failpoints(lab, standby);
    std::fs::create_dir_all(&dir)?;
    let armed = dir.join("controller-services-relist");
    struct Disarm(PathBuf);
    impl Drop for Disarm {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    std::fs::write(&armed, "")?;
    let disarm = Disarm(armed);
    wait_log(replicas, standby, "stalling here until it is removed").await?;

    // After the list: b gets the IP, then the pool admits c too (full: c waits).
    api.create(
        &PostParams::default(),
        &lb_service("b").label("relist", "first").build(),
    )
    .await?;
    ensure!(ingress_ips(&wait_ips(&api, "b", 1).await?) == ["198.18.226.0"]);
    case.pool_spec(
        POOL,
        "{addresses: ['198.18.226.0/32'], serviceAllocation: {priority: 10, namespaces: [ctl-relist]}}",
    )?;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The standby leads and reads afresh while its re-list is still held.
    replicas.kill(&old);
    let new_leader = wait_for(
        &format!("{standby} to lead after {old} was killed"),
        Duration::from_secs(60),
        || async {
            match leader(lab).await {
                Ok(l) if l == standby => Ok(Some(l)),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await?;
    wait_log(replicas, &new_leader, "new term: read every Service afresh").await?;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The old list through: nothing may move.
    drop(disarm);
    wait_log(replicas, &new_leader, "failpoint removed: going on").await?;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let restarted = replicas.start(&old, if old == "a" { 7472 } else { 7473 });
    let snap = snapshot(&api).await?;
    let violations = seen.lock().unwrap().violations.clone();
    restarted?;
    ensure!(
        violations.is_empty(),
        "{violations:?} (Services now {snap:?})"
    );
    ensure!(
        snap.get("b").map(Vec::as_slice) == Some(&["198.18.226.0".to_string()][..])
            && snap.get("c").is_some_and(Vec::is_empty),
        "after the stale re-list: {snap:?}"
    );
    eprintln!("stale re-list: no IP freed or reused ({snap:?})");
    Ok(())
}

/// The leader's work loop stalls (a failpoint) while its Lease task runs on: its health fails
/// and it gives up the Lease, the other replica takes over and serves; released, it recovers as
/// a healthy follower.
async fn stalled_loop_hands_leadership_over(lab: &Lab) -> anyhow::Result<()> {
    let mut case = Case::new(lab, "ctl-stall").await?;
    case.pool("ctl-stall", &["198.18.225.0/28"], "")?;
    let api = case.services().await?;
    let stalled = leader(lab).await?;
    let port = if stalled == "a" { 7472 } else { 7473 };
    let health = || -> anyhow::Result<String> {
        lab.exec(
            "cp",
            "curl",
            &[
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                &format!("http://127.0.0.1:{port}/healthz"),
            ],
        )
    };
    ensure!(health()? == "200", "{stalled} unhealthy before the stall");
    let dir = ferrolb_e2e::ferrolb::controller_failpoints(lab, &stalled);
    std::fs::create_dir_all(&dir)?;
    let armed = dir.join("controller-loop");
    std::fs::write(&armed, "")?;
    // Disarmed also when the test fails.
    struct Disarm(PathBuf);
    impl Drop for Disarm {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let disarm = Disarm(armed);
    let started = std::time::Instant::now();
    let new_leader = wait_for(
        &format!("another replica to lead while {stalled}'s loop is stalled"),
        Duration::from_secs(60),
        || async {
            match leader(lab).await {
                Ok(l) if l != stalled => Ok(Some(l)),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await?;
    let handover = started.elapsed();
    let code = health()?;
    ensure!(
        code == "503",
        "{stalled}'s /healthz answered {code} with its loop stalled"
    );
    api.create(&PostParams::default(), &lb_service("during-stall").build())
        .await?;
    wait_ips(&api, "during-stall", 1).await?;
    drop(disarm);
    wait_for(
        &format!("{stalled} healthy again"),
        Duration::from_secs(30),
        || async {
            match health() {
                Ok(c) if c == "200" => Ok(Some(())),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await?;
    ensure!(
        leader(lab).await? == new_leader,
        "leadership moved again after the release"
    );
    eprintln!(
        "stalled loop: {new_leader} led {handover:.1?} after {stalled}'s loop stalled (stall timeout 5 s, lease 4 s)"
    );
    Ok(())
}

/// The leader's work loop panics (a failpoint): the process ends instead of living on behind a
/// Lease task that keeps renewing, its Lease is released on the way out, and the other replica
/// leads within a lease duration; the panicked replica, started again as its Deployment would,
/// follows.
async fn panicked_loop_hands_leadership_over(lab: &Lab, replicas: &Replicas) -> anyhow::Result<()> {
    let mut case = Case::new(lab, "ctl-panic").await?;
    case.pool("ctl-panic", &["198.18.225.16/28"], "")?;
    let api = case.services().await?;
    let panicked = leader(lab).await?;
    let port = if panicked == "a" { 7472 } else { 7473 };
    let process = replicas
        .running
        .lock()
        .unwrap()
        .iter()
        .find(|(id, _)| *id == panicked)
        .map(|(_, p)| p.clone())
        .with_context(|| format!("replica {panicked} is not running"))?;
    let dir = ferrolb_e2e::ferrolb::controller_failpoints(lab, &panicked);
    std::fs::create_dir_all(&dir)?;
    let armed = dir.join("controller-loop-panic");
    struct Disarm(PathBuf);
    impl Drop for Disarm {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    std::fs::write(&armed, "")?;
    let disarm = Disarm(armed);
    let started = std::time::Instant::now();
    // The loop wakes at least every second: it reaches the failpoint on its own.
    wait_for(
        &format!("{panicked}'s process to end after its loop panicked"),
        Duration::from_secs(30),
        || async {
            if process::running(&process) {
                Err("still running".to_string())
            } else {
                Ok(Some(()))
            }
        },
    )
    .await?;
    let exited = started.elapsed();
    let new_leader = wait_for(
        &format!("another replica to lead after {panicked}'s loop panicked"),
        Duration::from_secs(60),
        || async {
            match leader(lab).await {
                Ok(l) if l != panicked => Ok(Some(l)),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await?;
    let handover = started.elapsed();
    let log = process::log_tail(&process, 40).join("\n");
    ensure!(
        log.contains("panicked"),
        "{panicked}'s log does not say the loop panicked:\n{log}"
    );
    api.create(&PostParams::default(), &lb_service("after-panic").build())
        .await?;
    wait_ips(&api, "after-panic", 1).await?;
    drop(disarm);
    // Started again, as the Deployment's pod would be: it follows.
    replicas.kill(&panicked);
    replicas.start(&panicked, port)?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    ensure!(
        leader(lab).await? == new_leader,
        "leadership moved again when {panicked} came back"
    );
    eprintln!(
        "panicked loop: {panicked}'s process ended {exited:.1?} after the panic was armed; {new_leader} led {handover:.1?} after (lease 4 s)"
    );
    Ok(())
}

/// `--gossip-secret-name` (the chart's `speaker.secretCreatedBy: controller`): the controller
/// creates the speakers' key Secret with the RBAC of `rbac/controller.yaml` (create, no read),
/// a random key of 256 bits, and never changes it: a replica restarting keeps it as it is.
async fn gossip_secret_created_once(lab: &Lab, replicas: &Replicas) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Secret;
    let secrets: Api<Secret> = Api::namespaced(lab.client().await?, NS);
    let name = ferrolb_e2e::ferrolb::CONTROLLER_MADE_GOSSIP_SECRET;
    let key_of = |s: &Secret| -> anyhow::Result<Vec<u8>> {
        Ok(s.data
            .as_ref()
            .and_then(|d| d.get("secretkey"))
            .context("no secretkey")?
            .0
            .clone())
    };
    let first = wait_for(
        &format!("the controller to create Secret {name}"),
        Duration::from_secs(30),
        || async {
            match secrets.get_opt(name).await {
                Ok(Some(s)) => Ok(Some(s)),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await?;
    let key = key_of(&first)?;
    ensure!(
        key.len() == 64 && key.iter().all(u8::is_ascii_hexdigit),
        "key of {} bytes",
        key.len()
    );
    for identity in ["a", "b"] {
        let port = if identity == "a" { 7472 } else { 7473 };
        replicas.kill(identity);
        replicas.start(identity, port)?;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let again = secrets.get(name).await?;
    ensure!(
        key_of(&again)? == key,
        "the key changed when the replicas restarted"
    );
    ensure!(
        again.metadata.resource_version == first.metadata.resource_version,
        "the Secret was written again"
    );
    Ok(())
}

/// A test body: an async function of the lab.
/// What every test gets: the lab and the two replicas.
#[derive(Clone)]
struct Ctx {
    lab: Lab,
    replicas: std::sync::Arc<Replicas>,
}

impl Fixture for Ctx {
    fn teardown(&self) {
        self.replicas.stop_all();
    }
}

/// How many Services the restart test allocates (`FERROLB_RESTART_SERVICES`, default 1,000).
fn restart_services() -> usize {
    std::env::var("FERROLB_RESTART_SERVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

fn main() -> std::process::ExitCode {
    let args = Arguments::from_args();
    // The tests share the controller replicas and the configuration namespace: one at a time.
    let conclusion = Suite::<Ctx>::new("controller")
        .one_at_a_time()
        .test(
            "allocation_from_a_pool_writes_ip_annotation_event_and_pool_status",
            |c| Box::pin(async move { allocation_from_a_pool(&c.lab).await }),
        )
        .test(
            "requested_ips_by_annotation_and_spec_and_the_error_when_both",
            |c| Box::pin(async move { requested_ips(&c.lab).await }),
        )
        .test("pool_exhaustion_then_release", |c| {
            Box::pin(async move { exhaustion_then_release(&c.lab).await })
        })
        .test("type_change_clears_and_foreign_class_is_left_alone", |c| {
            Box::pin(async move { type_change_and_foreign_class(&c.lab).await })
        })
        .test(
            "invalid_and_overlapping_pools_are_reported_without_disturbing_the_rest",
            |c| Box::pin(async move { invalid_and_overlapping_pools_are_reported(&c.lab).await }),
        )
        .test(
            "an_undecodable_pool_is_refused_by_name_and_field_and_the_others_work_on",
            |c| Box::pin(async move { undecodable_pool_is_refused_by_name(&c.lab).await }),
        )
        .test(
            "pool_annotation_picks_an_auto_assign_false_pool_under_both_prefixes",
            |c| Box::pin(async move { pool_annotation_and_auto_assign_false(&c.lab).await }),
        )
        .test(
            "service_allocation_by_namespace_labels_service_labels_and_priority",
            |c| {
                Box::pin(async move {
                    service_allocation_by_namespace_labels_and_priority(&c.lab).await
                })
            },
        )
        .test(
            "sharing_allowed_and_refused_for_port_overlap_and_backend_mismatch",
            |c| Box::pin(async move { sharing_allowed_and_refused(&c.lab).await }),
        )
        .test("require_prefer_and_single_stack_ipv6", |c| {
            Box::pin(async move { dual_stack_policies(&c.lab).await })
        })
        .test(
            "pool_shrink_releases_only_what_left_and_deletion_clears",
            |c| Box::pin(async move { pool_shrink_and_deletion(&c.lab).await }),
        )
        .test(
            "a_bfd_profile_in_use_waits_for_its_peer_before_deletion",
            |c| Box::pin(async move { bfd_profile_in_use_is_not_deleted(&c.lab).await }),
        )
        .test("metrics_health_and_readiness_of_the_leader", |c| {
            Box::pin(async move { metrics_and_health(&c.lab).await })
        })
        .test(
            "a_stalled_work_loop_fails_health_and_hands_leadership_over",
            |c| Box::pin(async move { stalled_loop_hands_leadership_over(&c.lab).await }),
        )
        .test(
            "the_gossip_key_secret_is_created_once_by_the_controller_and_kept",
            |c| Box::pin(async move { gossip_secret_created_once(&c.lab, &c.replicas).await }),
        )
        .test(
            "a_panicked_work_loop_ends_the_process_and_hands_leadership_over",
            |c| {
                Box::pin(
                    async move { panicked_loop_hands_leadership_over(&c.lab, &c.replicas).await },
                )
            },
        )
        .test("a_stale_service_relist_frees_and_reuses_no_ip", |c| {
            Box::pin(async move { stale_relist_frees_no_ip(&c.lab, &c.replicas).await })
        })
        .test(
            "a_leader_cut_off_from_the_api_server_gives_no_ip_twice_and_changes_none",
            |c| {
                Box::pin(
                    async move { leader_cut_off_from_the_api_server(&c.lab, &c.replicas).await },
                )
            },
        )
        .test(
            "restart_of_every_replica_and_leader_failover_change_no_ip_of_1000_services",
            |c| {
                Box::pin(async move {
                    restart_and_failover_change_no_ip(&c.lab, &c.replicas, restart_services()).await
                })
            },
        )
        .run(&args, |lab| {
            Box::pin(async move {
                let kubeconfig = ferrolb_e2e::ferrolb::install(&lab)?;
                let replicas = Replicas {
                    lab: lab.clone(),
                    kubeconfig,
                    running: std::sync::Mutex::new(Vec::new()),
                };
                replicas.start("a", 7472)?;
                replicas.start("b", 7473)?;
                let ctx = Ctx {
                    lab: lab.clone(),
                    replicas: std::sync::Arc::new(replicas),
                };
                // Stops the replicas should the wait fail (the runner tears down only a fixture
                // it got).
                if let Err(e) = leader(&lab).await {
                    ctx.teardown();
                    return Err(e);
                }
                Ok(ctx)
            })
        });
    if conclusion.has_failed() {
        for id in ["a", "b"] {
            eprintln!("controller-{id}'s log: target/lab-logs/controller/controller-{id}.log");
        }
    }
    suite::exit_code(&[conclusion])
}
