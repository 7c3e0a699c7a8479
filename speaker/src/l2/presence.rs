//! The known speakers: who the API server says runs a speaker, from each speaker's presence
//! Lease. The quorum rule (`ferrolb_layer2::quorum`) counts majorities of this set, so a node
//! cut off from the others still knows how many it should hear.
//!
//! Every speaker renews a Lease `<group>-<node>` (holder: its node; the group is
//! `--presence-group`, `ferrolb-speaker` unless a chart release names its own) every
//! [`RENEW_EVERY`] and deletes it on a clean shutdown. [`Known`] ages each Lease by when this
//! node saw its `renewTime` change, on this node's monotonic clock, never by the time written in
//! it: that comes from the writer's wall clock, and one node whose clock is far ahead would
//! otherwise look like the only live speaker to everybody (issue 33: two owners for one IP). A
//! Lease counts while it was seen renewed within [`LEASE_SECONDS`] of the last renewal this node
//! saw of any Lease, so the set stays still while the API server is away (no renewal is seen,
//! so none ages). Only Leases held by a Node of the cluster count: a Lease written for a name
//! that is not a Node cannot grow the set.
//!
//! [`Presence`] keeps this speaker's own Lease: renewed while the speaker runs, deleted when it
//! stops cleanly. The Lease is owned by the speaker's DaemonSet once the speaker has read it
//! from its Pod, else by the Node, so that deleting the DaemonSet (`helm uninstall`, whose RBAC
//! goes at the same time and refuses the clean stop's delete) or the Node removes it, while a
//! rolling update, which keeps the DaemonSet, does not.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
pub const LABEL: &str = ferrolb_runtime::voters::PRESENCE_LABEL;

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

/// The known speakers, kept across membership checks: each Lease's `renewTime` as last seen
/// and when this node saw it change (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct Known {
    /// By Lease name: two Leases naming one holder (a forged one) age apart.
    seen: BTreeMap<String, Seen>,
    /// When this node last saw any Lease renewed.
    newest: Option<Instant>,
}

#[derive(Clone, Debug)]
struct Seen {
    holder: String,
    /// `renewTime` as written: compared for change only, never read as a time.
    renewed: Timestamp,
    /// The Lease's duration (`leaseDurationSeconds`).
    duration: Duration,
    /// When this node saw `renewed` change (or first saw the Lease).
    at: Instant,
}

/// A pause in the renewals seen longer than this (two renewal periods: every speaker renews
/// every [`RENEW_EVERY`], this one included) is the API server or the watch away, not speakers
/// gone: the ages stop for it.
const GAP: Duration = Duration::from_secs(2 * RENEW_EVERY.as_secs());

impl Known {
    /// Takes in the Leases as they are at `now` and returns the speakers that count: held by one
    /// of `nodes`, not being deleted, and seen renewed within their duration of the last renewal
    /// seen of any Lease. A Lease first seen counts as renewed then.
    pub fn observe(
        &mut self,
        leases: &[Arc<Lease>],
        nodes: &BTreeSet<String>,
        now: Instant,
    ) -> BTreeSet<String> {
        let mut present = BTreeSet::new();
        let mut renewed_now = false;
        for lease in leases {
            let Some((name, holder, renewed, duration)) = Self::read(lease) else {
                continue;
            };
            present.insert(name.to_string());
            match self.seen.get_mut(name) {
                Some(seen) if seen.renewed == renewed && seen.holder == holder => {
                    seen.duration = duration;
                }
                _ => {
                    let seen = Seen {
                        holder: holder.to_string(),
                        renewed,
                        duration,
                        at: now,
                    };
                    self.seen.insert(name.to_string(), seen);
                    renewed_now = true;
                }
            }
        }
        if renewed_now {
            self.pause_over_gap(now);
            self.newest = Some(now);
        }
        // A Lease deleted (a clean stop) stops counting at once.
        self.seen.retain(|name, _| present.contains(name));
        let Some(newest) = self.newest else {
            return BTreeSet::new();
        };
        self.seen
            .values()
            .filter(|seen| nodes.contains(&seen.holder))
            .filter(|seen| newest.saturating_duration_since(seen.at) <= seen.duration)
            .map(|seen| seen.holder.clone())
            .collect()
    }

    /// The Lease's name, holder, `renewTime` and duration, if it counts at all: named, not
    /// being deleted, held and renewed.
    fn read(lease: &Lease) -> Option<(&str, &str, Timestamp, Duration)> {
        if lease.metadata.deletion_timestamp.is_some() {
            return None;
        }
        let name = lease.metadata.name.as_deref()?;
        let spec = lease.spec.as_ref()?;
        let holder = spec.holder_identity.as_deref().filter(|h| !h.is_empty())?;
        let renewed = spec.renew_time.as_ref()?.0;
        let seconds = spec.lease_duration_seconds.unwrap_or(LEASE_SECONDS);
        let duration = Duration::from_secs(u64::try_from(seconds).unwrap_or(0));
        Some((name, holder, renewed, duration))
    }

    /// The first renewal seen after a pause longer than [`GAP`] (the API server back after an
    /// outage, a watch resynced): every Lease seen before is aged as if the pause had lasted
    /// one renewal period, so the Leases not renewed yet are not dropped while their renewals
    /// arrive one by one. Within normal renewals nothing moves, and a dead speaker's Lease ages
    /// as before.
    fn pause_over_gap(&mut self, now: Instant) {
        let Some(newest) = self.newest else {
            return;
        };
        let gap = now.saturating_duration_since(newest);
        if gap <= GAP {
            return;
        }
        let shift = gap - RENEW_EVERY;
        for seen in self.seen.values_mut().filter(|s| s.at <= newest) {
            seen.at += shift;
        }
    }
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

    const NODES: [&str; 3] = ["node1", "node2", "node3"];

    fn nodes() -> BTreeSet<String> {
        NODES.iter().map(|n| n.to_string()).collect()
    }

    fn names(known: BTreeSet<String>) -> Vec<String> {
        known.into_iter().collect()
    }

    /// Every node renews every 10 s with its wall clock `offset` seconds off, for `steps`
    /// renewals from `t0`, but `silent`, whose Lease stays as it was first written; returns the
    /// set after each step.
    fn run(
        known: &mut Known,
        t0: Instant,
        offsets: [i64; 3],
        silent: Option<&str>,
        steps: u64,
    ) -> Vec<BTreeSet<String>> {
        (0..=steps)
            .map(|step| {
                let leases: Vec<_> = NODES
                    .iter()
                    .zip(offsets)
                    .map(|(n, offset)| {
                        let renewals = if Some(*n) == silent { 0 } else { step };
                        lease(n, i64::try_from(renewals * 10).unwrap() + offset)
                    })
                    .collect();
                known.observe(&leases, &nodes(), t0 + Duration::from_secs(step * 10))
            })
            .collect()
    }

    #[test]
    fn a_lease_counts_while_seen_renewed_within_its_duration_of_the_last_renewal_seen() {
        let mut known = Known::default();
        let sets = run(&mut known, Instant::now(), [0, 0, 0], Some("node3"), 5);
        // node3 last changed when first seen (t0): it counts until the others' renewals are
        // more than 40 s later.
        assert_eq!(names(sets[4].clone()), NODES);
        assert_eq!(names(sets[5].clone()), ["node1", "node2"]);
    }

    /// The fault of issue 33: one node's wall clock far ahead (or behind) made it the only
    /// known speaker. Clocks off by seconds, minutes and hours, ahead and behind, on any node,
    /// and a clock stepping while running: every renewing node counts, a silent one still ages
    /// out.
    #[test]
    fn wall_clocks_do_not_decide_who_counts() {
        for offset in [5, 90, 3 * 3600, -5, -90, -3 * 3600] {
            for skewed in 0..3 {
                let mut offsets = [0; 3];
                offsets[skewed] = offset;
                let mut known = Known::default();
                let sets = run(&mut known, Instant::now(), offsets, None, 8);
                assert!(
                    sets.iter().all(|s| names(s.clone()) == NODES),
                    "offset {offset} s on {}: {sets:?}",
                    NODES[skewed]
                );
                // The skewed node falls silent: it ages out like any other.
                let mut known = Known::default();
                let silent = NODES[skewed];
                let sets = run(&mut known, Instant::now(), offsets, Some(silent), 5);
                assert!(!sets[5].contains(silent), "offset {offset} s: {sets:?}");
                assert_eq!(sets[5].len(), 2);
            }
        }
        // A clock that steps an hour ahead while running: its renewals still change the Lease.
        let mut known = Known::default();
        let t0 = Instant::now();
        run(&mut known, t0, [0, 0, 0], None, 3);
        let sets = run(
            &mut known,
            t0 + Duration::from_secs(40),
            [0, 3600, 0],
            None,
            8,
        );
        assert!(sets.iter().all(|s| s.len() == 3), "{sets:?}");
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
        // The API server is away: however long, the set stays.
        let mut known = Known::default();
        let t0 = Instant::now();
        let leases = [lease("node1", 0), lease("node2", -30)];
        assert_eq!(known.observe(&leases, &nodes(), t0).len(), 2);
        let later = t0 + Duration::from_secs(3600);
        assert_eq!(known.observe(&leases, &nodes(), later).len(), 2);
        assert!(known.observe(&[], &nodes(), later).is_empty());
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
        let mut known = Known::default();
        assert_eq!(
            names(known.observe(&leases, &nodes(), Instant::now())),
            ["node1"]
        );
    }

    #[test]
    fn only_leases_held_by_nodes_of_the_cluster_count() {
        // A Lease for a name that is no Node (forged, or a Node deleted) cannot grow the set.
        let leases = [lease("node1", 0), lease("ghost", 1_000_000)];
        let mut known = Known::default();
        assert_eq!(
            names(known.observe(&leases, &nodes(), Instant::now())),
            ["node1"]
        );
    }

    /// The API server away for a minute: when it is back, the speakers' renewals arrive one
    /// by one, and those not in yet must not drop out meanwhile (the set shrinking to the first
    /// renewer would make any majority trivial).
    #[test]
    fn after_an_outage_the_set_stays_whole_while_the_renewals_come_back() {
        let mut known = Known::default();
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let leases = |renewed: [i64; 3]| -> Vec<_> {
            NODES
                .iter()
                .zip(renewed)
                .map(|(n, r)| lease(n, r))
                .collect()
        };
        assert_eq!(known.observe(&leases([0, 0, 0]), &nodes(), t0).len(), 3);
        // Nothing for 60 s, then node1 renews, then node2 and node3 within a renewal period.
        assert_eq!(
            known
                .observe(&leases([60, 0, 0]), &nodes(), t0 + s(60))
                .len(),
            3
        );
        assert_eq!(
            known
                .observe(&leases([60, 62, 0]), &nodes(), t0 + s(62))
                .len(),
            3
        );
        assert_eq!(
            known
                .observe(&leases([60, 62, 65]), &nodes(), t0 + s(65))
                .len(),
            3
        );
        // A speaker that died in the outage still ages out, a Lease duration after the others.
        let mut known = Known::default();
        known.observe(&leases([0, 0, 0]), &nodes(), t0);
        let mut last = BTreeSet::new();
        for step in 6..=12 {
            let t = i64::from(step) * 10;
            last = known.observe(
                &leases([t, t, 0]),
                &nodes(),
                t0 + s(u64::try_from(t).unwrap()),
            );
        }
        assert_eq!(names(last), ["node1", "node2"]);
    }

    #[test]
    fn two_leases_naming_one_holder_age_apart() {
        let mut known = Known::default();
        let t0 = Instant::now();
        let forged = |renewed: i64| {
            let mut l = (*lease("node3", renewed)).clone();
            l.metadata.name = Some("forged-node3".into());
            Arc::new(l)
        };
        let s = Duration::from_secs;
        known.observe(
            &[lease("node1", 0), lease("node3", 0), forged(0)],
            &nodes(),
            t0,
        );
        let mut last = BTreeSet::new();
        // The real node3 is dead; the forged Lease for node3 is written once and left.
        for step in 1..=5 {
            let t = step * 10;
            let leases = [lease("node1", t), lease("node3", 0), forged(0)];
            last = known.observe(&leases, &nodes(), t0 + s(u64::try_from(t).unwrap()));
        }
        assert_eq!(names(last), ["node1"]);
    }

    #[test]
    fn a_deleted_lease_stops_counting_at_once_and_counts_again_when_back() {
        let mut known = Known::default();
        let t0 = Instant::now();
        let both = [lease("node1", 0), lease("node2", 0)];
        assert_eq!(known.observe(&both, &nodes(), t0).len(), 2);
        let one = [lease("node1", 10)];
        let s = Duration::from_secs;
        assert_eq!(names(known.observe(&one, &nodes(), t0 + s(10))), ["node1"]);
        let back = [lease("node1", 20), lease("node2", 0)];
        assert_eq!(known.observe(&back, &nodes(), t0 + s(20)).len(), 2);
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
