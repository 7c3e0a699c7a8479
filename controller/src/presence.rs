//! Which speakers are alive, from their presence Leases (`<group>-<node>`, labelled
//! `ferrolb.io/speaker-presence=<group>`, renewed every 10 s by each speaker and deleted when it
//! stops cleanly). Node addresses (decision 0024) list a node only while its speaker is alive,
//! as ServiceLB lists a node only while its svclb pod is Ready.
//!
//! A Lease is aged by when this replica saw it change, on this replica's monotonic clock, never
//! by the time written in it (a speaker's wall clock may be off; issue 33), and relative to the
//! newest renewal seen of any Lease: while the API server is away no renewal is seen and the set
//! stays still, instead of every speaker looking dead at once and every node address being
//! withdrawn.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ferrolb_runtime::watch::{Change, Continue, reflect};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube::runtime::reflector::Store;
use kube::runtime::watcher::{self, watcher};

/// When each presence Lease (by name) was last seen changed: its version and the instant.
type Renewals = Arc<Mutex<HashMap<String, (String, Instant)>>>;

/// The speakers' presence, as this replica sees it.
#[derive(Clone)]
pub struct Presence {
    leases: Store<Lease>,
    renewals: Renewals,
}

impl Presence {
    /// Watches `group`'s presence Leases in `namespace`; `on` hears each change and the end of
    /// each (re-)list.
    pub fn watch(
        client: &kube::Client,
        namespace: &str,
        group: &str,
        mut on: impl FnMut(Change<'_, Lease>) -> Continue + Send + 'static,
    ) -> Self {
        let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
        let selector = format!("{}={group}", ferrolb_runtime::voters::PRESENCE_LABEL);
        let renewals: Renewals = Arc::default();
        let seen = renewals.clone();
        let leases = reflect(
            watcher(api, watcher::Config::default().labels(&selector)),
            "presence leases",
            |l: &mut Lease| l.metadata.managed_fields = None,
            move |change| {
                if let Change::Object(lease) | Change::Deleted(lease) = &change {
                    seen_now(&seen, lease, Instant::now());
                }
                on(change)
            },
        );
        Self { leases, renewals }
    }

    /// Waits until the first list of the Leases is in.
    pub async fn wait_until_ready(
        &self,
    ) -> Result<(), kube::runtime::reflector::store::WriterDropped> {
        self.leases.wait_until_ready().await
    }

    /// The nodes whose speaker is alive at `now`: a Lease held by the node, seen renewed within
    /// its duration of the newest renewal seen of any Lease.
    pub fn alive(&self, now: Instant) -> BTreeSet<String> {
        let leases = self.leases.state();
        let mut renewals = self.renewals.lock().unwrap_or_else(PoisonError::into_inner);
        // Forget deleted Leases, so the map is as big as the store.
        let names: BTreeSet<&str> = leases
            .iter()
            .filter_map(|l| l.metadata.name.as_deref())
            .collect();
        renewals.retain(|name, _| names.contains(name.as_str()));
        alive(leases.iter().map(|l| l.as_ref()), &renewals, now)
    }
}

/// Records `lease` as renewed at `now` if its version is new.
fn seen_now(renewals: &Renewals, lease: &Lease, now: Instant) {
    let (Some(name), Some(version)) = (
        lease.metadata.name.clone(),
        lease.metadata.resource_version.clone(),
    ) else {
        return;
    };
    let mut seen = renewals.lock().unwrap_or_else(PoisonError::into_inner);
    if seen.get(&name).is_none_or(|(v, _)| *v != version) {
        seen.insert(name, (version, now));
    }
}

/// The rule of [`Presence::alive`], on plain inputs.
fn alive<'a>(
    leases: impl Iterator<Item = &'a Lease>,
    renewals: &HashMap<String, (String, Instant)>,
    now: Instant,
) -> BTreeSet<String> {
    let newest = renewals.values().map(|(_, at)| *at).max();
    let Some(newest) = newest else {
        return BTreeSet::new();
    };
    // The set ages from the newest renewal seen, never beyond now.
    let reference = newest.min(now);
    leases
        .filter_map(|l| {
            let spec = l.spec.as_ref()?;
            let seconds = u64::try_from(spec.lease_duration_seconds?).ok()?;
            let (_, at) = renewals.get(l.metadata.name.as_deref()?)?;
            let fresh = reference.saturating_duration_since(*at) < Duration::from_secs(seconds);
            fresh.then(|| spec.holder_identity.clone())?
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn lease(node: &str, version: &str) -> Lease {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("g-{node}"), "resourceVersion": version},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": 40},
        }))
        .unwrap()
    }

    #[test]
    fn a_speaker_counts_while_its_lease_is_seen_renewed_within_its_duration() {
        let renewals: Renewals = Arc::default();
        let t0 = Instant::now();
        let (a, b) = (lease("a", "1"), lease("b", "2"));
        seen_now(&renewals, &a, t0);
        seen_now(&renewals, &b, t0);
        let names = |set: BTreeSet<String>| set.into_iter().collect::<Vec<_>>();
        let map = renewals.lock().unwrap().clone();
        assert_eq!(names(alive([&a, &b].into_iter(), &map, t0)), ["a", "b"]);
        // b renews for a minute, a does not: a ages out relative to b's renewals.
        let b2 = lease("b", "3");
        seen_now(&renewals, &b2, t0 + Duration::from_secs(60));
        let map = renewals.lock().unwrap().clone();
        let later = t0 + Duration::from_secs(61);
        assert_eq!(names(alive([&a, &b2].into_iter(), &map, later)), ["b"]);
        // The same version seen again is no renewal.
        seen_now(&renewals, &a, later);
        let map = renewals.lock().unwrap().clone();
        assert_eq!(names(alive([&a, &b2].into_iter(), &map, later)), ["b"]);
    }

    #[test]
    fn with_no_renewal_seen_at_all_the_set_stays_still() {
        // The API server is away: nobody's renewal is seen, so nobody ages.
        let renewals: Renewals = Arc::default();
        let t0 = Instant::now();
        let (a, b) = (lease("a", "1"), lease("b", "2"));
        seen_now(&renewals, &a, t0);
        seen_now(&renewals, &b, t0);
        let map = renewals.lock().unwrap().clone();
        let much_later = t0 + Duration::from_secs(3600);
        assert_eq!(alive([&a, &b].into_iter(), &map, much_later).len(), 2);
    }
}
