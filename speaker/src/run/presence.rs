//! Keeps this speaker's presence Lease (see `ferrolb_speaker::l2::presence`): renewed while the
//! speaker runs, deleted when it stops cleanly. The Lease is owned by the speaker's DaemonSet
//! once the speaker has read it from its Pod, else by the Node, so that deleting the DaemonSet
//! (`helm uninstall`, whose RBAC goes at the same time and refuses the clean stop's delete) or
//! the Node removes it, while a rolling update, which keeps the DaemonSet, does not.

use std::time::Duration;

use ferrolb_runtime::owner::{Owner, OwnerCell};
use ferrolb_speaker::l2::presence::{LABEL, LEASE_SECONDS, RENEW_EVERY, lease_name};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Client, Resource};

/// Field manager of the speaker's Lease writes.
const MANAGER: &str = "ferrolb-speaker";

/// The presence Lease of one node.
pub struct Presence {
    api: Api<Lease>,
    nodes: Api<Node>,
    group: String,
    node: String,
    name: String,
    /// The speaker's DaemonSet, once known.
    owner: OwnerCell,
}

impl Presence {
    /// The Lease of `node` in `group`, in `namespace`, owned by `owner` once known (until then
    /// by the Node).
    pub fn new(
        client: &Client,
        namespace: &str,
        group: &str,
        node: &str,
        owner: OwnerCell,
    ) -> Self {
        Presence {
            api: Api::namespaced(client.clone(), namespace),
            nodes: Api::all(client.clone()),
            group: group.to_string(),
            node: node.to_string(),
            name: lease_name(group, node),
            owner,
        }
    }

    /// Renews the Lease every [`RENEW_EVERY`] until the task is dropped. A failed renewal is
    /// logged and retried at the next tick; the Lease counts for [`LEASE_SECONDS`], several
    /// renewals.
    pub async fn keep(self, metrics: super::metrics::Metrics) {
        let mut tick = tokio::time::interval(RENEW_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match self.renew().await {
                Ok(()) => {
                    metrics.presence_renewed.set(1);
                }
                Err(e) => {
                    metrics.presence_renewed.set(0);
                    tracing::warn!(error = %e, lease = %self.name, "renewing the presence Lease failed");
                }
            }
        }
    }

    async fn renew(&self) -> anyhow::Result<()> {
        // Outside a pod the Node owns the Lease; without its UID (not yet listed, or no
        // access) the Lease is written without an owner and only ages out.
        let owner = match self.owner.get() {
            Some(daemonset) => Some(daemonset),
            None => self
                .nodes
                .get_metadata_opt(&self.node)
                .await
                .ok()
                .flatten()
                .and_then(|n| Some(Owner::node(&self.node, n.meta().uid.as_deref()?))),
        };
        let lease = manifest(
            &self.name,
            &self.group,
            &self.node,
            owner.as_ref(),
            MicroTime(Timestamp::now()),
        );
        self.api
            .patch(
                &self.name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&lease),
            )
            .await?;
        Ok(())
    }

    /// Deletes the Lease (clean shutdown): the others stop counting this speaker at once.
    pub async fn remove(&self) {
        let done = tokio::time::timeout(
            Duration::from_secs(2),
            self.api.delete(&self.name, &DeleteParams::default()),
        )
        .await;
        if !matches!(done, Ok(Ok(_))) {
            tracing::warn!(lease = %self.name, "could not delete the presence Lease; it ages out");
        }
    }
}

/// The Lease as applied: server-side apply, so the owner written last replaces an earlier one
/// (the previous Pod's, after a restart).
fn manifest(
    name: &str,
    group: &str,
    node: &str,
    owner: Option<&Owner>,
    renewed: MicroTime,
) -> serde_json::Value {
    let mut metadata = serde_json::json!({
        "name": name,
        "labels": {LABEL: group},
    });
    if let Some(owner) = owner {
        metadata["ownerReferences"] = owner.references_json();
    }
    serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": renewed,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> MicroTime {
        MicroTime(Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn the_lease_names_its_owner_when_there_is_one() {
        let node = Owner::node("node1", "uid-1");
        let lease = manifest("ferrolb-speaker-node1", "g", "node1", Some(&node), at());
        assert_eq!(
            lease["metadata"]["ownerReferences"],
            serde_json::json!([{"apiVersion": "v1", "kind": "Node", "name": "node1", "uid": "uid-1"}])
        );
        assert_eq!(lease["spec"]["holderIdentity"], "node1");
        assert_eq!(lease["metadata"]["labels"][LABEL], "g");
        let lease = manifest("ferrolb-speaker-node1", "g", "node1", None, at());
        assert!(
            lease["metadata"].get("ownerReferences").is_none(),
            "{lease}"
        );
    }
}
