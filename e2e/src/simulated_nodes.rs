//! Nodes that exist only in the API server: a Ready Node object, its kubelet Lease in
//! `kube-node-lease` and a speaker presence Lease, each renewed every 10 s as a kubelet and a
//! speaker would. A bench surrounds the lab's few real nodes with hundreds of these to measure
//! what the cluster's size costs the real speakers (issue #40's grid): every Node is in their
//! watch and in their members, and the API server carries the renewals a cluster of that size
//! makes. No simulated node heartbeats, so none is ever live: the real speakers plan over all
//! of them and own every IP themselves.
//!
//! Names are `sim-NNNN`; addresses are on the lab segment (198.18.4.0 up, fd00:18::4:0 up),
//! where nothing listens: no packet is ever sent to them.

use std::time::Duration;

use anyhow::Context;
use ferrolb_testkit::objects;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};

/// The field manager of everything this module writes.
const MANAGER: &str = "ferrolb-bench-simulated-nodes";
/// How often a kubelet renews its node Lease, and a speaker its presence Lease.
const RENEW_EVERY: Duration = Duration::from_secs(10);
/// Writes in flight at once while creating or renewing.
const CONCURRENCY: usize = 16;

/// Simulated nodes, renewed until dropped.
pub struct SimulatedNodes {
    names: Vec<String>,
    renewing: tokio::task::JoinHandle<()>,
}

impl SimulatedNodes {
    /// Creates `count` simulated nodes (Ready, with their Leases; presence Leases in
    /// `namespace`, group `presence_group`) and starts renewing their Leases.
    pub async fn create(
        client: &Client,
        count: usize,
        namespace: &str,
        presence_group: &str,
    ) -> anyhow::Result<Self> {
        let names: Vec<String> = (1..=count).map(|i| format!("sim-{i:04}")).collect();
        let nodes: Api<Node> = Api::all(client.clone());
        let results: Vec<anyhow::Result<()>> = futures::stream::iter(names.iter().enumerate())
            .map(|(i, name)| {
                let nodes = nodes.clone();
                async move {
                    let node = objects::node(name)
                        .label("kubernetes.io/hostname", name)
                        .label("kubernetes.io/os", "linux")
                        .label("ferrolb.dev/simulated", "true")
                        .build();
                    nodes
                        .patch(
                            name,
                            &PatchParams::apply(MANAGER).force(),
                            &Patch::Apply(&node),
                        )
                        .await
                        .with_context(|| format!("creating Node {name}"))?;
                    let status = objects::node(name)
                        .internal_ip(&address_v4(i))
                        .internal_ip(&address_v6(i))
                        .ready(true)
                        .condition("NetworkUnavailable", "False")
                        .build()
                        .status;
                    nodes
                        .patch_status(
                            name,
                            &PatchParams::default(),
                            &Patch::Merge(&serde_json::json!({ "status": status })),
                        )
                        .await
                        .with_context(|| format!("setting the status of Node {name}"))?;
                    Ok(())
                }
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        results.into_iter().collect::<anyhow::Result<()>>()?;
        let renewer = Renewer {
            node_leases: Api::namespaced(client.clone(), "kube-node-lease"),
            presence: Api::namespaced(client.clone(), namespace),
            group: presence_group.to_string(),
            names: names.clone(),
        };
        // The first round before returning: a node without its Lease is not yet in a cluster.
        renewer.round().await?;
        let renewing = tokio::spawn(async move {
            loop {
                tokio::time::sleep(RENEW_EVERY).await;
                if let Err(e) = renewer.round().await {
                    eprintln!("simulated nodes: renewing: {e:#}");
                }
            }
        });
        Ok(Self { names, renewing })
    }

    /// The simulated nodes' names.
    pub fn names(&self) -> &[String] {
        &self.names
    }
}

impl Drop for SimulatedNodes {
    fn drop(&mut self) {
        // The objects go with the lab; only the renewing task is this value's.
        self.renewing.abort();
    }
}

/// What renews the Leases.
struct Renewer {
    node_leases: Api<Lease>,
    presence: Api<Lease>,
    group: String,
    names: Vec<String>,
}

impl Renewer {
    /// Renews every node's two Leases once.
    async fn round(&self) -> anyhow::Result<()> {
        let now = MicroTime(Timestamp::now());
        let results: Vec<anyhow::Result<()>> = futures::stream::iter(self.names.clone())
            .map(|name| {
                let (node_leases, presence) = (self.node_leases.clone(), self.presence.clone());
                let presence_name = format!("{}-{name}", self.group);
                let group = self.group.clone();
                let now = now.clone();
                async move {
                    let kubelet = objects::lease(&name)
                        .holder(&name)
                        .duration_seconds(40)
                        .renewed(now.clone())
                        .build();
                    node_leases
                        .patch(
                            &name,
                            &PatchParams::apply(MANAGER).force(),
                            &Patch::Apply(&kubelet),
                        )
                        .await
                        .with_context(|| format!("renewing the node Lease of {name}"))?;
                    let lease = objects::lease(&presence_name)
                        .label(ferrolb_runtime::voters::PRESENCE_LABEL, &group)
                        .holder(&name)
                        .duration_seconds(40)
                        .renewed(now)
                        .build();
                    presence
                        .patch(
                            &presence_name,
                            &PatchParams::apply(MANAGER).force(),
                            &Patch::Apply(&lease),
                        )
                        .await
                        .with_context(|| format!("renewing the presence Lease of {name}"))?;
                    anyhow::Ok(())
                }
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        results.into_iter().collect()
    }
}

/// Simulated node `i`'s IPv4 address (0-based; up to 64,000 nodes).
fn address_v4(i: usize) -> String {
    format!("198.18.{}.{}", 4 + i / 250, 1 + i % 250)
}

/// Simulated node `i`'s IPv6 address.
fn address_v6(i: usize) -> String {
    format!("fd00:18::4:{:x}", i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_stay_on_the_lab_segment_and_apart_from_the_real_hosts() {
        assert_eq!(address_v4(0), "198.18.4.1");
        assert_eq!(address_v4(249), "198.18.4.250");
        assert_eq!(address_v4(250), "198.18.5.1");
        assert_eq!(address_v4(999), "198.18.7.250");
        assert_eq!(address_v6(999), "fd00:18::4:3e8");
    }
}
