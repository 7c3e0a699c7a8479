//! Tells the cluster what this node advertises over BGP: a ServiceBGPStatus object per Service
//! it advertises (MetalLB's status API), naming the BGPPeers it goes to. Every eligible node
//! advertises, so each node writes its own objects and touches no other node's, and records a
//! `nodeAssigned` Event ("announcing from node X with protocol bgp", as MetalLB) when it starts
//! advertising a Service. Written only when something changes, so steady-state API writes do not
//! grow with the number of Services.
//!
//! The one exception: a node deleted from the cluster cannot delete its own objects, so one live
//! speaker (the sweeper: the first by name among the live ones) deletes the objects of nodes that
//! no longer exist.

use std::collections::{BTreeMap, BTreeSet};

use ferrolb_config::allocator::ServiceKey;
use ferrolb_config::crd::{ServiceBGPStatus, ServiceBGPStatusSpec, ServiceBGPStatusStatus};
use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client};
use tokio::sync::watch;

use crate::status_objects::{NODE_LABEL, StatusKind};

/// What the node advertises: by Service, the BGPPeers it goes to.
pub type Desired = BTreeMap<ServiceKey, BTreeSet<String>>;

/// ServiceBGPStatus, as the shared writer writes it.
pub struct Bgp;

impl StatusKind for Bgp {
    type Object = ServiceBGPStatus;
    type Value = BTreeSet<String>;
    const KIND: &'static str = "ServiceBGPStatus";
    const PREFIX: &'static str = "bgp";
    const PROTOCOL: &'static str = "bgp";
    // Every eligible node advertises (ECMP): each writes its own object.
    const EXCLUSIVE: bool = false;

    fn object(name: &str) -> ServiceBGPStatus {
        ServiceBGPStatus::new(name, ServiceBGPStatusSpec {})
    }

    fn status(key: &ServiceKey, node: &str, peers: &BTreeSet<String>) -> serde_json::Value {
        serde_json::json!(ServiceBGPStatusStatus {
            node: node.to_string(),
            service_name: key.name().to_string(),
            service_namespace: key.namespace().to_string(),
            peers: peers.iter().cloned().collect(),
        })
    }

    fn uid(_: &BTreeSet<String>) -> Option<String> {
        None
    }
}

/// Starts the sweeper task: send it the names of the Nodes that exist (only while this speaker
/// is the sweeper); each new set deletes the objects of nodes outside it.
pub fn spawn_sweeper(
    client: Client,
    namespace: String,
) -> (
    watch::Sender<Option<BTreeSet<String>>>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, mut rx) = watch::channel::<Option<BTreeSet<String>>>(None);
    let handle = tokio::spawn(async move {
        let api: Api<ServiceBGPStatus> = Api::namespaced(client.clone(), &namespace);
        let node_api: Api<Node> = Api::all(client);
        while rx.changed().await.is_ok() {
            let nodes = rx.borrow_and_update().clone();
            if let Some(nodes) = nodes {
                sweep(&api, &node_api, &nodes).await;
            }
        }
    });
    (tx, handle)
}

/// Whether `me` sweeps: the first by name among the live speakers, itself included. One speaker
/// is enough; should two briefly believe they are first, both delete the same objects, which is
/// harmless.
pub fn is_sweeper<'a>(me: &str, alive: impl IntoIterator<Item = &'a String>) -> bool {
    alive.into_iter().all(|other| me <= other.as_str())
}

/// Of `objects` (name, node label), the names whose node is not in `nodes`. An empty `nodes`
/// (a cache that lists nothing) removes nothing.
fn departed<'a>(
    objects: impl IntoIterator<Item = (&'a str, &'a str)>,
    nodes: &BTreeSet<String>,
) -> Vec<&'a str> {
    if nodes.is_empty() {
        return Vec::new();
    }
    objects
        .into_iter()
        .filter(|(_, node)| !nodes.contains(*node))
        .map(|(name, _)| name)
        .collect()
}

async fn sweep(api: &Api<ServiceBGPStatus>, node_api: &Api<Node>, nodes: &BTreeSet<String>) {
    let list = match api.list(&ListParams::default().labels(NODE_LABEL)).await {
        Ok(list) => list,
        Err(e) => {
            tracing::warn!(error = %e, "listing ServiceBGPStatus objects to sweep");
            return;
        }
    };
    let objects: Vec<(&str, &str)> = list
        .items
        .iter()
        .filter_map(|o| {
            let name = o.metadata.name.as_deref()?;
            let node = o.metadata.labels.as_ref()?.get(NODE_LABEL)?;
            Some((name, node.as_str()))
        })
        .collect();
    let candidates: Vec<(&str, &str)> = departed(objects.iter().copied(), nodes)
        .into_iter()
        .filter_map(|name| objects.iter().find(|(n, _)| *n == name).copied())
        .collect();
    tracing::debug!(
        ?nodes,
        ?candidates,
        "sweeping ServiceBGPStatus objects of departed nodes"
    );
    for (name, node) in candidates {
        // The cache may lag behind a Node that just joined: ask the API server before deleting.
        match node_api.get_opt(node).await {
            Ok(None) => {}
            Ok(Some(_)) => continue,
            Err(e) => {
                tracing::warn!(node, error = %e, "checking whether a node still exists");
                continue;
            }
        }
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {
                tracing::info!(object = %name, node, "deleted the ServiceBGPStatus of a node that no longer exists")
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => tracing::warn!(object = %name, error = %e, "deleting ServiceBGPStatus"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweeper_is_the_first_live_speaker_by_name() {
        let alive: Vec<String> = vec!["node2".into(), "node3".into()];
        assert!(is_sweeper("node1", &alive));
        assert!(is_sweeper("node2", &alive));
        assert!(!is_sweeper("node3", &alive));
        assert!(is_sweeper("node9", &[]));
    }

    #[test]
    fn only_objects_of_nodes_that_no_longer_exist_are_swept() {
        let nodes: BTreeSet<String> = ["node1".to_string(), "node2".to_string()].into();
        let objects = [
            ("a", "node1"),
            ("b", "gone"),
            ("c", "node2"),
            ("d", "also-gone"),
        ];
        assert_eq!(departed(objects, &nodes), vec!["b", "d"]);
        // A Node cache that lists nothing is not evidence that every node went.
        assert!(departed(objects, &BTreeSet::new()).is_empty());
    }
}
