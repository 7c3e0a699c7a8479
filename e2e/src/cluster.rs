//! The lab's part of the Kubernetes API: Node objects with their status and Leases (what a
//! kubelet would keep fresh), Pod objects with their status, and waiting with reasons.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, Pod,
    PodCondition, PodIP, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, Config};

use crate::topology::{Host, Role, Topology};

/// Field manager of the lab's writes.
const MANAGER: &str = "ferrolb-lab";

/// A kube client from a kubeconfig file.
pub async fn client_from(kubeconfig: &std::path::Path) -> anyhow::Result<Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let config = Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Ok(Client::try_from(config)?)
}

/// Polls `check` until it returns `Some`, or fails after `timeout` saying what was awaited and
/// what was last seen.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, String>>,
{
    let deadline = Instant::now() + timeout;
    let mut last = String::from("nothing checked yet");
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(seen) => last = seen,
        }
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}; last seen: {last}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn now() -> Time {
    Time(Timestamp::now())
}

/// Node addresses of a host for the cluster's families.
fn node_addresses(topology: &Topology, host: &Host) -> Vec<NodeAddress> {
    let mut out = Vec::new();
    let fam = topology.options.families;
    let iface = &host.interfaces[0];
    let mut ips = Vec::new();
    if fam.v4() {
        ips.push(iface.ipv4.to_string());
    }
    if fam.v6() {
        ips.push(iface.ipv6.to_string());
    }
    // The primary family comes first, as the kubelet orders them.
    for ip in ips {
        out.push(NodeAddress {
            type_: "InternalIP".into(),
            address: ip,
        });
    }
    out.push(NodeAddress {
        type_: "Hostname".into(),
        address: host.name.clone(),
    });
    out
}

fn pod_cidrs(topology: &Topology, host: &Host) -> Vec<String> {
    let Role::Node {
        pod_cidr_v4,
        pod_cidr_v6,
        ..
    } = &host.role
    else {
        return Vec::new();
    };
    let fam = topology.options.families;
    let mut cidrs = Vec::new();
    if fam.v4() {
        cidrs.push(pod_cidr_v4.clone());
    }
    if fam.v6() {
        cidrs.push(pod_cidr_v6.clone());
    }
    cidrs
}

/// Creates (or updates) every Node object with a Ready status, and its Lease.
pub async fn register_nodes(client: &Client, topology: &Topology) -> anyhow::Result<()> {
    create_nodes(client, topology).await?;
    for host in topology.nodes() {
        set_node_ready(client, topology, &host.name, true).await?;
    }
    renew_leases(client, topology).await
}

/// Creates (or updates) the Node objects with their labels and pod CIDRs, and no status: what
/// a kubelet node adopts when it registers (the lab runs no CIDR allocator).
pub async fn create_nodes(client: &Client, topology: &Topology) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    for host in topology.nodes() {
        let cidrs = pod_cidrs(topology, host);
        let node = Node {
            metadata: ObjectMeta {
                name: Some(host.name.clone()),
                labels: Some(BTreeMap::from([
                    ("kubernetes.io/hostname".to_string(), host.name.clone()),
                    ("kubernetes.io/os".to_string(), "linux".to_string()),
                    ("ferrolb.dev/lab".to_string(), "true".to_string()),
                ])),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                pod_cidr: cidrs.first().cloned(),
                pod_cidrs: Some(cidrs),
                ..Default::default()
            }),
            status: None,
        };
        nodes
            .patch(
                &host.name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&node),
            )
            .await
            .with_context(|| format!("creating Node {}", host.name))?;
    }
    Ok(())
}

/// Sets a node's Ready condition (and addresses), as a kubelet would.
pub async fn set_node_ready(
    client: &Client,
    topology: &Topology,
    name: &str,
    ready: bool,
) -> anyhow::Result<()> {
    let Some(host) = topology.host(name) else {
        bail!("no node {name} in the lab")
    };
    let nodes: Api<Node> = Api::all(client.clone());
    let cond = |type_: &str, status: &str, reason: &str| NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some("set by the ferrolb lab".into()),
        last_heartbeat_time: Some(now()),
        last_transition_time: Some(now()),
    };
    let status = NodeStatus {
        addresses: Some(node_addresses(topology, host)),
        conditions: Some(vec![
            cond(
                "Ready",
                if ready { "True" } else { "False" },
                if ready {
                    "KubeletReady"
                } else {
                    "LabSetNotReady"
                },
            ),
            cond("NetworkUnavailable", "False", "LabNetworkReady"),
        ]),
        ..Default::default()
    };
    let patch = serde_json::json!({"status": status});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("setting status of Node {name}"))?;
    Ok(())
}

/// Renews every node's Lease in kube-node-lease, as kubelets do every 10 s.
pub async fn renew_leases(client: &Client, topology: &Topology) -> anyhow::Result<()> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    for host in topology.nodes() {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(host.name.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(host.name.clone()),
                lease_duration_seconds: Some(40),
                renew_time: Some(MicroTime(Timestamp::now())),
                ..Default::default()
            }),
        };
        leases
            .patch(
                &host.name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&lease),
            )
            .await
            .with_context(|| format!("renewing Lease of {}", host.name))?;
    }
    Ok(())
}

/// Creates a Pod object bound to `node` and marks it Running and Ready with `ips`.
pub async fn create_pod(
    client: &Client,
    namespace: &str,
    name: &str,
    node: &str,
    host_ip: &str,
    labels: &BTreeMap<String, String>,
    ips: &[String],
) -> anyhow::Result<()> {
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels.clone()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            automount_service_account_token: Some(false),
            containers: vec![Container {
                name: "echo".into(),
                image: Some("ferrolb-lab/echo:local".into()),
                ports: Some(vec![
                    ContainerPort {
                        container_port: 8080,
                        protocol: Some("TCP".into()),
                        name: Some("http".into()),
                        ..Default::default()
                    },
                    ContainerPort {
                        container_port: 8081,
                        protocol: Some("UDP".into()),
                        name: Some("udp".into()),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    };
    create_running_pod(client, namespace, pod, host_ip, ips).await
}

/// Creates `pod` (bound to a node by its spec) and marks it Running and Ready with `ips`, as the
/// node's kubelet would once its containers run.
pub async fn create_running_pod(
    client: &Client,
    namespace: &str,
    pod: Pod,
    host_ip: &str,
    ips: &[String],
) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let name = pod.metadata.name.clone().context("a Pod needs a name")?;
    // The ServiceAccount admission plugin refuses pods until the namespace's `default`
    // ServiceAccount exists, which kube-controller-manager creates shortly after the namespace.
    wait_for(
        &format!("Pod {namespace}/{name} to be accepted"),
        Duration::from_secs(30),
        || {
            let pods = pods.clone();
            let pod = pod.clone();
            async move {
                match pods.create(&PostParams::default(), &pod).await {
                    Ok(_) => Ok(Some(())),
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(Some(())),
                    Err(e) => Err(e.to_string()),
                }
            }
        },
    )
    .await?;
    let cond = |t: &str| PodCondition {
        type_: t.into(),
        status: "True".into(),
        last_transition_time: Some(now()),
        ..Default::default()
    };
    let status = PodStatus {
        phase: Some("Running".into()),
        host_ip: Some(host_ip.into()),
        pod_ip: ips.first().cloned(),
        pod_ips: Some(ips.iter().map(|ip| PodIP { ip: ip.clone() }).collect()),
        conditions: Some(vec![
            cond("PodScheduled"),
            cond("Initialized"),
            cond("ContainersReady"),
            cond("Ready"),
        ]),
        start_time: Some(now()),
        ..Default::default()
    };
    pods.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(&serde_json::json!({"status": status})),
    )
    .await
    .with_context(|| format!("setting status of Pod {namespace}/{name}"))?;
    Ok(())
}
