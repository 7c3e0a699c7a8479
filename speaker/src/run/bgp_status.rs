//! Tells the cluster what this node advertises over BGP: a ServiceBGPStatus object per Service
//! it advertises (MetalLB's status API), naming the BGPPeers it goes to. Every eligible node
//! advertises, so each node writes its own objects and touches no other node's. Written only when
//! something changes, so steady-state API writes do not grow with the number of Services.

use std::collections::{BTreeMap, BTreeSet};

use ferrolb_config::allocator::ServiceKey;
use ferrolb_config::crd::{ServiceBGPStatus, ServiceBGPStatusSpec, ServiceBGPStatusStatus};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
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
        let api: Api<ServiceBGPStatus> = Api::namespaced(client, &namespace);
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
            sync(&api, &node, &desired, &mut written).await;
            if rx.changed().await.is_err() {
                // Sender gone (shutdown): write the last value and stop.
                let desired = rx.borrow().clone();
                sync(&api, &node, &desired, &mut written).await;
                return;
            }
        }
    });
    (tx, handle)
}

async fn sync(
    api: &Api<ServiceBGPStatus>,
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
        if let Err(e) = write(api, &name, key, node, peers).await {
            tracing::warn!(service = %key, error = %e, "writing ServiceBGPStatus");
            continue;
        }
        written.insert(name, Some(peers.clone()));
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
    fn object_names_are_stable_short_and_per_node() {
        let key = ServiceKey::new("ns", "a-very-long-service-name-".repeat(10).as_str());
        let a = object_name(&key, "node1");
        assert_eq!(a, object_name(&key, "node1"));
        assert_ne!(a, object_name(&key, "node2"));
        assert!(a.starts_with("bgp-") && a.len() == 20, "{a}");
    }
}
