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
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{EventType, Recorder, Reporter};
use kube::{Api, Client};
use sha2::{Digest, Sha256};
use tokio::sync::watch;

/// Label naming the advertising node (MetalLB's).
const NODE_LABEL: &str = "metallb.io/node";
/// Label naming the Service.
const SERVICE_NAME_LABEL: &str = "metallb.io/service-name";
/// Label naming the Service's namespace.
const SERVICE_NAMESPACE_LABEL: &str = "metallb.io/service-namespace";

/// What the node advertises: by Service, the BGPPeers it goes to.
pub type Desired = BTreeMap<ServiceKey, BTreeSet<String>>;

/// Name of the status object of a Service advertised by a node: stable, so a restarted speaker
/// finds its own objects, and short whatever the names' lengths.
fn object_name(key: &ServiceKey, node: &str) -> String {
    let digest = Sha256::digest(format!("{}/{}/{node}", key.namespace(), key.name()));
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("bgp-{hex}")
}

/// Starts the writer; send the desired state into the returned channel (the latest value wins).
/// The task ends, after writing the last value, when the sender is dropped.
pub fn spawn(
    client: Client,
    namespace: String,
    node: String,
) -> (watch::Sender<Desired>, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = watch::channel(Desired::new());
    let handle = tokio::spawn(async move {
        let api: Api<ServiceBGPStatus> = Api::namespaced(client.clone(), &namespace);
        let recorder = Recorder::new(
            client,
            Reporter {
                controller: "ferrolb-speaker".into(),
                instance: Some(node.clone()),
            },
        );
        // Objects a previous run of this speaker left: kept if still true, deleted otherwise.
        let mut written: BTreeMap<String, Option<BTreeSet<String>>> = BTreeMap::new();
        match api
            .list(&ListParams::default().labels(&format!("{NODE_LABEL}={node}")))
            .await
        {
            Ok(list) => {
                for o in list.items {
                    if let Some(name) = o.metadata.name {
                        written.insert(name, None);
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "listing ServiceBGPStatus objects"),
        }
        loop {
            let desired = rx.borrow_and_update().clone();
            sync(&api, &recorder, &node, &desired, &mut written).await;
            if rx.changed().await.is_err() {
                // Sender gone (shutdown): write the last value and stop.
                let desired = rx.borrow().clone();
                sync(&api, &recorder, &node, &desired, &mut written).await;
                return;
            }
        }
    });
    (tx, handle)
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

async fn sync(
    api: &Api<ServiceBGPStatus>,
    recorder: &Recorder,
    node: &str,
    desired: &Desired,
    written: &mut BTreeMap<String, Option<BTreeSet<String>>>,
) {
    let wanted: BTreeMap<String, (&ServiceKey, &BTreeSet<String>)> = desired
        .iter()
        .map(|(k, peers)| (object_name(k, node), (k, peers)))
        .collect();
    let stale: Vec<String> = written
        .keys()
        .filter(|n| !wanted.contains_key(*n))
        .cloned()
        .collect();
    for name in stale {
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {
                written.remove(&name);
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {
                written.remove(&name);
            }
            Err(e) => tracing::warn!(object = %name, error = %e, "deleting ServiceBGPStatus"),
        }
    }
    for (name, (key, peers)) in wanted {
        if written
            .get(&name)
            .is_some_and(|p| p.as_ref() == Some(peers))
        {
            continue;
        }
        let newly_advertised = written.get(&name).is_none_or(Option::is_none);
        if let Err(e) = write(api, &name, key, node, peers).await {
            tracing::warn!(service = %key, error = %e, "writing ServiceBGPStatus");
            continue;
        }
        written.insert(name, Some(peers.clone()));
        if newly_advertised {
            super::status::publish(
                recorder,
                key,
                None,
                EventType::Normal,
                "nodeAssigned",
                format!("announcing from node \"{node}\" with protocol \"bgp\""),
            )
            .await;
        }
    }
}

async fn write(
    api: &Api<ServiceBGPStatus>,
    name: &str,
    key: &ServiceKey,
    node: &str,
    peers: &BTreeSet<String>,
) -> Result<(), kube::Error> {
    let mut object = ServiceBGPStatus::new(name, ServiceBGPStatusSpec {});
    object.metadata.labels = Some(
        [
            (NODE_LABEL.to_string(), node.to_string()),
            (SERVICE_NAME_LABEL.to_string(), key.name().to_string()),
            (
                SERVICE_NAMESPACE_LABEL.to_string(),
                key.namespace().to_string(),
            ),
        ]
        .into(),
    );
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e),
    }
    let status = ServiceBGPStatusStatus {
        node: node.to_string(),
        service_name: key.name().to_string(),
        service_namespace: key.namespace().to_string(),
        peers: peers.iter().cloned().collect(),
    };
    // A merge patch replaces the whole `peers` list, so a peer no longer used disappears.
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "status": status })),
    )
    .await?;
    Ok(())
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

    #[test]
    fn object_names_are_stable_short_and_per_node() {
        let key = ServiceKey::new("ns", "a-very-long-service-name-".repeat(10).as_str());
        let a = object_name(&key, "node1");
        assert_eq!(a, object_name(&key, "node1"));
        assert_ne!(a, object_name(&key, "node2"));
        assert!(a.starts_with("bgp-") && a.len() == 20, "{a}");
    }
}
