//! The known speakers: who the API server says runs a speaker, from each speaker's presence
//! Lease. The quorum rule (`ferrolb_layer2::quorum`) counts majorities of this set, so a node
//! cut off from the others still knows how many it should hear.
//!
//! Every speaker renews a Lease `<group>-<node>` (holder: its node; the group is
//! `--presence-group`, `ferrolb-speaker` unless a chart release names its own) every
//! [`RENEW_EVERY`] and deletes it on a clean shutdown. A Lease counts while it was renewed
//! within [`LEASE_SECONDS`] of the newest renewal of any speaker. Measuring age against the
//! newest renewal, not against this node's clock, keeps the set still while the API server is
//! away (no renewal lands, so none ages) and keeps it from depending on clock offsets between
//! this node and the others beyond seconds.
//!
//! [`Presence`] keeps this speaker's own Lease: renewed while the speaker runs, deleted when it
//! stops cleanly. The Lease is owned by the speaker's DaemonSet once the speaker has read it
//! from its Pod, else by the Node, so that deleting the DaemonSet (`helm uninstall`, whose RBAC
//! goes at the same time and refuses the clean stop's delete) or the Node removes it, while a
//! rolling update, which keeps the DaemonSet, does not.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ferrolb_runtime::owner::{Owner, OwnerCell};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Client, Resource};

/// How often a speaker renews its presence Lease.
pub const RENEW_EVERY: Duration = Duration::from_secs(10);
/// How long a presence Lease counts after its renewal (four renewals: one lost write or a slow
/// API server does not drop a live speaker).
pub const LEASE_SECONDS: i32 = 40;
/// Label on every presence Lease, valued with the group; the speaker watches only its group's.
pub const LABEL: &str = "ferrolb.io/speaker-presence";

/// The name of node `node`'s presence Lease in `group`.
pub fn lease_name(group: &str, node: &str) -> String {
    format!("{group}-{node}")
}

/// Whether `group` can name presence Leases: a label value (at most 63 of `[A-Za-z0-9._-]`,
/// starting and ending alphanumeric) whose Lease names stay valid object names.
pub fn valid_group(group: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    group.len() <= 63
        && edge(group.chars().next())
        && edge(group.chars().last())
        && group
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
}

/// The label selector of `group`'s presence Leases.
pub fn selector(group: &str) -> String {
    format!("{LABEL}={group}")
}

/// The speakers whose presence Lease counts (see the module docs).
pub fn known(leases: &[Arc<Lease>]) -> BTreeSet<String> {
    let renewed: Vec<(&str, Timestamp, i64)> = leases
        .iter()
        .filter(|l| l.metadata.deletion_timestamp.is_none())
        .filter_map(|l| {
            let spec = l.spec.as_ref()?;
            let holder = spec.holder_identity.as_deref().filter(|h| !h.is_empty())?;
            let at = spec.renew_time.as_ref()?.0;
            let seconds = i64::from(spec.lease_duration_seconds.unwrap_or(LEASE_SECONDS));
            Some((holder, at, seconds))
        })
        .collect();
    let Some(newest) = renewed.iter().map(|(_, at, _)| *at).max() else {
        return BTreeSet::new();
    };
    renewed
        .into_iter()
        .filter(|(_, at, seconds)| newest.as_second() - at.as_second() <= *seconds)
        .map(|(holder, _, _)| holder.to_string())
        .collect()
}

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
    pub async fn keep(self, metrics: crate::metrics::Metrics) {
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
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use ferrolb_testkit::objects;

    fn lease(holder: &str, renewed_at_second: i64) -> Arc<Lease> {
        let renewed = Timestamp::from_second(1_800_000_000 + renewed_at_second).unwrap();
        Arc::new(
            objects::lease(&lease_name("ferrolb-speaker", holder))
                .holder(holder)
                .duration_seconds(LEASE_SECONDS)
                .renewed(MicroTime(renewed))
                .build(),
        )
    }

    #[test]
    fn a_lease_counts_while_renewed_within_its_duration_of_the_newest() {
        let leases = [lease("node1", 100), lease("node2", 60), lease("node3", 59)];
        assert_eq!(
            known(&leases).into_iter().collect::<Vec<_>>(),
            ["node1", "node2"]
        );
    }

    #[test]
    fn groups_must_make_valid_names_and_label_values() {
        assert!(valid_group("ferrolb-speaker"));
        assert!(valid_group("my-release.ferrolb-speaker"));
        assert!(!valid_group(""));
        assert!(!valid_group("-x"));
        assert!(!valid_group("Upper"));
        assert!(!valid_group(&"a".repeat(64)));
        assert_eq!(selector("g"), "ferrolb.io/speaker-presence=g");
    }

    #[test]
    fn nothing_ages_while_no_one_renews() {
        // The API server is away: whatever the local clock says, the set stays.
        let leases = [lease("node1", 0), lease("node2", -30)];
        assert_eq!(known(&leases).len(), 2);
        assert!(known(&[]).is_empty());
    }

    #[test]
    fn released_and_deleted_leases_do_not_count() {
        let mut released = (*lease("node2", 0)).clone();
        released.spec.as_mut().unwrap().holder_identity = None;
        let mut deleting = (*lease("node3", 0)).clone();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                Timestamp::from_second(1_800_000_000).unwrap(),
            ));
        let leases = [lease("node1", 0), Arc::new(released), Arc::new(deleting)];
        assert_eq!(known(&leases).into_iter().collect::<Vec<_>>(), ["node1"]);
    }

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
