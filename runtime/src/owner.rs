//! Who owns the records a component writes for itself (Leases, status objects): Kubernetes'
//! garbage collector deletes them with their owner, so that `helm uninstall` leaves none behind.
//!
//! Owners are learnt from the API server after start-up ([`learn`] into an [`OwnerCell`]), so a
//! slow or absent API server never holds a component's start up; writers give records written
//! before the owner was known their owner once it is, and an owner made again under its name is
//! learnt again.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use tokio::sync::watch;

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

    /// A merge patch making this the object's only owner (a merge patch replaces the list
    /// whole, so an earlier owner is no longer named).
    pub fn merge_patch(&self) -> kube::api::Patch<serde_json::Value> {
        kube::api::Patch::Merge(serde_json::json!({
            "metadata": {"ownerReferences": self.references_json()}
        }))
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

/// What is known of an owner that [`learn`] reads.
#[derive(Clone, Debug, PartialEq)]
enum Learnt {
    /// Not read yet (the API server has not answered).
    Pending,
    /// Read: the owner.
    Known(Owner),
    /// There is none to be had (refused, missing, or gone).
    Unavailable,
}

/// An owner learnt after start-up and kept up to date by [`learn`]; writers read it when they
/// write and may wait for it to change.
#[derive(Clone, Debug)]
pub struct OwnerCell(Arc<watch::Sender<Learnt>>);

impl Default for OwnerCell {
    fn default() -> Self {
        OwnerCell(Arc::new(watch::Sender::new(Learnt::Pending)))
    }
}

impl OwnerCell {
    /// The owner, while known.
    pub fn get(&self) -> Option<Owner> {
        match &*self.0.borrow() {
            Learnt::Known(owner) => Some(owner.clone()),
            Learnt::Pending | Learnt::Unavailable => None,
        }
    }

    /// A receiver that sees every change of the owner.
    pub fn subscribe(&self) -> watch::Receiver<impl Sized + use<>> {
        self.0.subscribe()
    }

    /// Waits until the owner has been read or found unavailable (at once when it has been).
    pub async fn settled(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|l| *l != Learnt::Pending).await;
    }

    fn set(&self, learnt: Learnt) {
        self.0.send_if_modified(|now| {
            let changed = *now != learnt;
            *now = learnt;
            changed
        });
    }
}

/// Longest wait between two reads while the owner is not known.
const MAX_WAIT: Duration = Duration::from_secs(60);
/// How long one read may take.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a known owner is read again: one deleted and made again under its name (a GitOps
/// tool replacing it) has a new UID, and records naming the old one would be deleted by the
/// garbage collector over and over.
pub const REFRESH: Duration = Duration::from_secs(300);

/// Keeps `cell` holding the owner `read` returns, for as long as the task runs: until the
/// first answer every 1 s to a minute, then every [`REFRESH`]. `Ok(None)` or a refusal (403: no
/// permission; 404: the object is missing) makes it unavailable, with a warning naming `what`
/// the first time: records are then written without it, and nothing else changes.
pub async fn learn<F, Fut>(cell: OwnerCell, what: &str, read: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Option<Owner>, kube::Error>>,
{
    let mut wait = Duration::from_secs(1);
    let mut warned = false;
    loop {
        let answer = tokio::time::timeout(READ_TIMEOUT, read()).await;
        let unavailable = |why: String, warned: &mut bool| {
            if !*warned {
                *warned = true;
                tracing::warn!("{what}: {why}; its records get no owner and stay after uninstall");
            }
            cell.set(Learnt::Unavailable);
        };
        match answer {
            Ok(Ok(Some(owner))) => {
                if cell.get().as_ref() != Some(&owner) {
                    tracing::debug!(owner = ?owner.reference(), "{what}: owner learnt");
                }
                cell.set(Learnt::Known(owner));
                warned = false;
                wait = REFRESH;
            }
            Ok(Ok(None)) => {
                unavailable("no owner to name".into(), &mut warned);
                wait = REFRESH;
            }
            Ok(Err(kube::Error::Api(e))) if e.code == 403 || e.code == 404 => {
                unavailable(format!("cannot read the owner ({e})"), &mut warned);
                wait = REFRESH;
            }
            // A known owner stays known through a failed read.
            Ok(Err(e)) => {
                tracing::debug!(error = %e, ?wait, "{what}: reading the owner failed");
                if cell.get().is_none() {
                    wait = (wait * 2).min(MAX_WAIT);
                }
            }
            Err(_) => {
                tracing::debug!(?wait, "{what}: reading the owner timed out");
                if cell.get().is_none() {
                    wait = (wait * 2).min(MAX_WAIT);
                }
            }
        }
        tokio::time::sleep(wait).await;
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

    /// A speaker Pod's controller reference, as the DaemonSet controller writes it.
    fn daemonset() -> OwnerReference {
        OwnerReference {
            api_version: "apps/v1".into(),
            kind: "DaemonSet".into(),
            name: "ferrolb-speaker".into(),
            uid: "ds-1".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    #[test]
    fn a_merge_patch_names_only_this_owner() {
        let owner = Owner::pod("p", "u");
        match owner.merge_patch() {
            kube::api::Patch::Merge(v) => {
                assert_eq!(v["metadata"]["ownerReferences"], owner.references_json())
            }
            other => panic!("not a merge patch: {other:?}"),
        }
    }

    #[test]
    fn a_pods_controller_becomes_a_plain_owner() {
        let controller = daemonset();
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
        let daemonset = daemonset();
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
    async fn learning_retries_until_the_owner_is_read_then_refreshes_it() {
        use std::sync::atomic::{AtomicU32, Ordering};
        let cell = OwnerCell::default();
        let calls = Arc::new(AtomicU32::new(0));
        let task = {
            let (cell, calls) = (cell.clone(), calls.clone());
            tokio::spawn(async move {
                learn(cell, "test", || {
                    let n = calls.fetch_add(1, Ordering::SeqCst);
                    async move {
                        match n {
                            0..3 => Err(kube::Error::LinesCodecMaxLineLengthExceeded),
                            3 => Ok(Some(Owner::pod("p", "u1"))),
                            // Made again under its name: a new UID.
                            _ => Ok(Some(Owner::pod("p", "u2"))),
                        }
                    }
                })
                .await
            })
        };
        cell.settled().await;
        assert_eq!(
            calls.load(Ordering::SeqCst),
            4,
            "three failures, then the answer"
        );
        assert_eq!(cell.get(), Some(Owner::pod("p", "u1")));
        let mut changes = cell.subscribe();
        changes.borrow_and_update();
        tokio::time::sleep(REFRESH + Duration::from_secs(1)).await;
        assert!(
            changes.has_changed().unwrap_or(false),
            "the refresh is seen"
        );
        assert_eq!(cell.get(), Some(Owner::pod("p", "u2")));
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_owner_is_unavailable_at_once() {
        let cell = OwnerCell::default();
        let task = {
            let cell = cell.clone();
            tokio::spawn(async move {
                learn(cell, "test", || async {
                    Err(kube::Error::Api(Box::new(
                        kube::core::Status::failure("forbidden", "Forbidden").with_code(403),
                    )))
                })
                .await
            })
        };
        cell.settled().await;
        assert_eq!(cell.get(), None);
        task.abort();
    }
}
