//! Tells the cluster what this node announces: a ServiceL2Status object per Service it owns
//! (MetalLB's status API) and a `nodeAssigned` Event when it takes one. Written only when
//! ownership changes, so steady-state API writes do not grow with the number of Services.

use std::collections::BTreeMap;

use ferrolb_config::allocator::ServiceKey;
use ferrolb_config::crd::{
    InterfaceInfo, ServiceL2Status, ServiceL2StatusSpec, ServiceL2StatusStatus,
};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client};
use sha2::{Digest, Sha256};
use tokio::sync::watch;

/// Label naming the announcing node (MetalLB's).
const NODE_LABEL: &str = "metallb.io/node";
/// Label naming the Service.
const SERVICE_NAME_LABEL: &str = "metallb.io/service-name";
/// Label naming the Service's namespace.
const SERVICE_NAMESPACE_LABEL: &str = "metallb.io/service-namespace";

/// What the node announces, by Service (the pure step decides it).
pub use ferrolb_speaker::l2::step::{Owned, Reported as Desired};

/// Name of the status object of a Service announced by a node: stable, so a restarted speaker
/// finds its own objects, and short whatever the names' lengths.
fn object_name(key: &ServiceKey, node: &str) -> String {
    let digest = Sha256::digest(format!("{}/{}/{node}", key.namespace(), key.name()));
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("l2-{hex}")
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
        let api: Api<ServiceL2Status> = Api::namespaced(client.clone(), &namespace);
        let recorder = Recorder::new(
            client,
            Reporter {
                controller: "ferrolb-speaker".into(),
                instance: Some(node.clone()),
            },
        );
        // Objects a previous run of this speaker left: kept if still true, deleted otherwise.
        let mut written: BTreeMap<String, Option<Owned>> = BTreeMap::new();
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
            Err(e) => tracing::warn!(error = %e, "listing ServiceL2Status objects"),
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

async fn sync(
    api: &Api<ServiceL2Status>,
    recorder: &Recorder,
    node: &str,
    desired: &Desired,
    written: &mut BTreeMap<String, Option<Owned>>,
) {
    let wanted: BTreeMap<String, (&ServiceKey, &Owned)> = desired
        .iter()
        .map(|(k, o)| (object_name(k, node), (k, o)))
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
            Err(e) => tracing::warn!(object = %name, error = %e, "deleting ServiceL2Status"),
        }
    }
    for (name, (key, owned)) in wanted {
        let previous = written.get(&name);
        if previous.is_some_and(|p| p.as_ref() == Some(owned)) {
            continue;
        }
        let newly_taken = previous.is_none_or(Option::is_none);
        if let Err(e) = write(api, &name, key, node, owned).await {
            tracing::warn!(service = %key, error = %e, "writing ServiceL2Status");
            continue;
        }
        written.insert(name, Some(owned.clone()));
        if newly_taken {
            remove_others(api, key, node).await;
            publish(
                recorder,
                key,
                owned.uid.clone(),
                EventType::Normal,
                "nodeAssigned",
                format!("announcing from node \"{node}\" with protocol \"layer2\""),
            )
            .await;
        }
    }
}

/// Deletes the status objects other nodes wrote for a Service this node now announces: a node
/// that died or lost its link cannot delete its own, and one announcer is what the plan says.
async fn remove_others(api: &Api<ServiceL2Status>, key: &ServiceKey, node: &str) {
    let selector = format!(
        "{SERVICE_NAME_LABEL}={},{SERVICE_NAMESPACE_LABEL}={},{NODE_LABEL}!={node}",
        key.name(),
        key.namespace()
    );
    let Ok(list) = api.list(&ListParams::default().labels(&selector)).await else {
        return;
    };
    for name in list.items.into_iter().filter_map(|o| o.metadata.name) {
        if let Err(e) = api.delete(&name, &DeleteParams::default()).await {
            tracing::debug!(object = %name, error = %e, "deleting another node's ServiceL2Status");
        }
    }
}

async fn write(
    api: &Api<ServiceL2Status>,
    name: &str,
    key: &ServiceKey,
    node: &str,
    owned: &Owned,
) -> Result<(), kube::Error> {
    let mut object = ServiceL2Status::new(name, ServiceL2StatusSpec {});
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
    let status = ServiceL2StatusStatus {
        node: node.to_string(),
        service_name: key.name().to_string(),
        service_namespace: key.namespace().to_string(),
        interfaces: owned
            .interfaces
            .iter()
            .map(|i| InterfaceInfo { name: i.clone() })
            .collect(),
    };
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "status": status })),
    )
    .await?;
    Ok(())
}

/// Records `announceFailed` on a Service.
pub async fn announce_failed(
    recorder: &Recorder,
    key: &ServiceKey,
    uid: Option<String>,
    why: String,
) {
    publish(
        recorder,
        key,
        uid,
        EventType::Warning,
        "announceFailed",
        why,
    )
    .await;
}

/// Records an Event on a Service (best effort: a lost Event must not stop announcing).
pub(super) async fn publish(
    recorder: &Recorder,
    key: &ServiceKey,
    uid: Option<String>,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Announce".into(),
        secondary: None,
    };
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Service".into()),
        namespace: Some(key.namespace().to_string()),
        name: Some(key.name().to_string()),
        uid,
        ..Default::default()
    };
    if let Err(e) = recorder.publish(&event, &reference).await {
        tracing::debug!(error = %e, "recording an Event failed");
    }
}
