//! Who owns the records a component writes for itself (Leases, status objects): Kubernetes'
//! garbage collector deletes them with their owner, so that `helm uninstall` leaves none behind.
//!
//! Owners are learnt from the API server after start-up ([`learn`] into an [`OwnerCell`]), so a
//! slow or absent API server never holds a component's start up, and a record written before
//! the owner is known gets it later.

use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// An owner for the objects a component writes.
#[derive(Clone, Debug, PartialEq)]
pub struct Owner(OwnerReference);

impl Owner {
    /// An owner reference as the garbage collector needs it: not the managing controller, and
    /// no blockOwnerDeletion (that would need the permission to set finalizers on the owner,
    /// and nothing here must hold an owner's deletion up).
    fn new(api_version: &str, kind: &str, name: &str, uid: &str) -> Self {
        Owner(OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
            controller: None,
            block_owner_deletion: None,
        })
    }

    /// A Pod.
    pub fn pod(name: &str, uid: &str) -> Self {
        Self::new("v1", "Pod", name, uid)
    }

    /// A Node (cluster-scoped: it may own objects in any namespace).
    pub fn node(name: &str, uid: &str) -> Self {
        Self::new("v1", "Node", name, uid)
    }

    /// A ServiceAccount (owns objects in its own namespace only).
    pub fn service_account(name: &str, uid: &str) -> Self {
        Self::new("v1", "ServiceAccount", name, uid)
    }

    /// The object another reference names (a Pod's controller: its DaemonSet), as an owner.
    pub fn of(reference: &OwnerReference) -> Self {
        Self::new(
            &reference.api_version,
            &reference.kind,
            &reference.name,
            &reference.uid,
        )
    }

    /// The owner a Pod's records should have: the Pod's controller (a DaemonSet, which
    /// outlives its Pods' replacement, so a rolling update keeps the records), else the Pod.
    pub fn for_pod(pod: &ObjectMeta) -> Option<Self> {
        let controller = pod
            .owner_references
            .iter()
            .flatten()
            .find(|r| r.controller == Some(true));
        match controller {
            Some(r) => Some(Self::of(r)),
            None => Some(Self::pod(pod.name.as_deref()?, pod.uid.as_deref()?)),
        }
    }

    /// The owner reference to write into `metadata.ownerReferences`.
    pub fn reference(&self) -> OwnerReference {
        self.0.clone()
    }

    /// Whether `references` (an object's `metadata.ownerReferences`) are exactly this owner.
    pub fn is_sole_owner_in(&self, references: Option<&[OwnerReference]>) -> bool {
        references.is_some_and(|r| r.len() == 1 && r[0].uid == self.0.uid)
    }

    /// `metadata.ownerReferences` as JSON, for patches and server-side apply.
    pub fn references_json(&self) -> serde_json::Value {
        serde_json::json!([{
            "apiVersion": self.0.api_version,
            "kind": self.0.kind,
            "name": self.0.name,
            "uid": self.0.uid,
        }])
    }
}

/// An owner learnt after start-up: empty until [`learn`] has read it.
#[derive(Clone, Debug, Default)]
pub struct OwnerCell(Arc<RwLock<Option<Owner>>>);

impl OwnerCell {
    /// The owner, once known.
    pub fn get(&self) -> Option<Owner> {
        self.0.read().ok().and_then(|o| o.clone())
    }

    fn set(&self, owner: Owner) {
        if let Ok(mut slot) = self.0.write() {
            *slot = Some(owner);
        }
    }
}

/// Longest wait between two reads.
const MAX_WAIT: Duration = Duration::from_secs(60);
/// How long one read may take.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Reads the owner with `read` until it answers, into `cell`, backing off from 1 s to a minute.
/// `Ok(None)` (no owner to be had) or a refusal (403: no permission; 404: the object is
/// missing) ends it with a warning naming `what`: the records then keep their owners of
/// before, and nothing else changes.
pub async fn learn<F, Fut>(cell: OwnerCell, what: &str, read: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Option<Owner>, kube::Error>>,
{
    let mut wait = Duration::from_secs(1);
    loop {
        match tokio::time::timeout(READ_TIMEOUT, read()).await {
            Ok(Ok(Some(owner))) => {
                tracing::debug!(owner = ?owner.reference(), "{what}: owner learnt");
                cell.set(owner);
                return;
            }
            Ok(Ok(None)) => {
                tracing::warn!("{what}: no owner to name; its records stay after uninstall");
                return;
            }
            Ok(Err(kube::Error::Api(e))) if e.code == 403 || e.code == 404 => {
                tracing::warn!(error = %e, "{what}: cannot read the owner; its records get none and stay after uninstall");
                return;
            }
            Ok(Err(e)) => tracing::debug!(error = %e, ?wait, "{what}: reading the owner failed"),
            Err(_) => tracing::debug!(?wait, "{what}: reading the owner timed out"),
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(MAX_WAIT);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_json_form_names_the_same_object_and_nothing_that_blocks_deletion() {
        let owner = Owner::service_account("ferrolb-controller", "abc");
        let json = owner.references_json();
        assert_eq!(
            json,
            serde_json::json!([{
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "name": "ferrolb-controller",
                "uid": "abc",
            }])
        );
        let parsed: Vec<OwnerReference> = serde_json::from_value(json).unwrap_or_default();
        assert_eq!(parsed, vec![owner.reference()]);
    }

    #[test]
    fn a_pods_controller_becomes_a_plain_owner() {
        let controller = OwnerReference {
            api_version: "apps/v1".into(),
            kind: "DaemonSet".into(),
            name: "ferrolb-speaker".into(),
            uid: "ds-1".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        };
        let owner = Owner::of(&controller).reference();
        assert_eq!(
            (
                owner.api_version.as_str(),
                owner.kind.as_str(),
                owner.uid.as_str()
            ),
            ("apps/v1", "DaemonSet", "ds-1")
        );
        assert_eq!((owner.controller, owner.block_owner_deletion), (None, None));
    }

    #[test]
    fn a_pods_records_belong_to_its_daemonset_else_to_the_pod() {
        let mut pod = ObjectMeta {
            name: Some("ferrolb-speaker-x7k2p".into()),
            uid: Some("pod-1".into()),
            ..Default::default()
        };
        assert_eq!(
            Owner::for_pod(&pod),
            Some(Owner::pod("ferrolb-speaker-x7k2p", "pod-1"))
        );
        let daemonset = OwnerReference {
            api_version: "apps/v1".into(),
            kind: "DaemonSet".into(),
            name: "ferrolb-speaker".into(),
            uid: "ds-1".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        };
        let other = OwnerReference {
            controller: None,
            uid: "other".into(),
            ..daemonset.clone()
        };
        pod.owner_references = Some(vec![other, daemonset.clone()]);
        assert_eq!(Owner::for_pod(&pod), Some(Owner::of(&daemonset)));
        assert_eq!(Owner::for_pod(&ObjectMeta::default()), None);
    }

    #[test]
    fn sole_ownership_is_by_uid() {
        let owner = Owner::pod("p", "u1");
        assert!(owner.is_sole_owner_in(Some(&[Owner::pod("renamed", "u1").reference()])));
        assert!(!owner.is_sole_owner_in(Some(&[Owner::pod("p", "u2").reference()])));
        assert!(!owner.is_sole_owner_in(Some(&[])));
        assert!(!owner.is_sole_owner_in(None));
        let two = [owner.reference(), Owner::node("n", "u3").reference()];
        assert!(!owner.is_sole_owner_in(Some(&two)));
    }

    // Paused time: the back-off sleeps pass at once.
    #[tokio::test(start_paused = true)]
    async fn learning_retries_until_the_owner_is_read_and_stops_on_a_refusal() {
        let cell = OwnerCell::default();
        let calls = std::sync::atomic::AtomicU32::new(0);
        learn(cell.clone(), "test", || {
            let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                if n < 3 {
                    Err(kube::Error::LinesCodecMaxLineLengthExceeded)
                } else {
                    Ok(Some(Owner::pod("p", "u")))
                }
            }
        })
        .await;
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 4);
        assert_eq!(cell.get(), Some(Owner::pod("p", "u")));

        let refused = OwnerCell::default();
        let calls = std::sync::atomic::AtomicU32::new(0);
        learn(refused.clone(), "test", || {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async {
                Err(kube::Error::Api(Box::new(
                    kube::core::Status::failure("forbidden", "Forbidden").with_code(403),
                )))
            }
        })
        .await;
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(refused.get(), None);
    }
}
