//! The writer of per-node status objects (MetalLB's status API): one object per Service this node
//! announces, for layer 2 (ServiceL2Status, [`crate::l2::status`]) and BGP (ServiceBGPStatus,
//! [`crate::bgp::status`]). Each kind says how its object looks; the writer does the rest the same
//! way for both: stable names, adopting what a previous run left, deleting what is no longer true,
//! writing only what changed (so steady-state API writes do not grow with the number of
//! Services), a `nodeAssigned` Event when the node starts announcing a Service, and writing an
//! object again when someone else deletes it while it is still true. The speaker's DaemonSet,
//! once known, owns the objects, so they go with the release but stay through a rolling update
//! (MetalLB's are owned by the speaker Pod, so each roll deletes and rewrites them).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use ferrolb_config::allocator::ServiceKey;
use ferrolb_runtime::events::{EventQueue, Queued};
use ferrolb_runtime::owner::{Owner, OwnerCell};
use ferrolb_runtime::rate::Pacer;
use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watcher};
use kube::{Api, Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

/// Label naming the announcing node (MetalLB's).
pub const NODE_LABEL: &str = "metallb.io/node";
/// Label naming the Service.
pub const SERVICE_NAME_LABEL: &str = "metallb.io/service-name";
/// Label naming the Service's namespace.
pub const SERVICE_NAMESPACE_LABEL: &str = "metallb.io/service-namespace";

/// One kind of status object.
pub trait StatusKind: Send + Sync + 'static {
    /// The object.
    type Object: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Debug
        + DeserializeOwned
        + Serialize
        + Send
        + Sync;
    /// What the node announces of one Service (what the object's status says).
    type Value: Clone + Debug + PartialEq + Send + Sync + 'static;
    /// The kind, for logs.
    const KIND: &'static str;
    /// Prefix of the objects' names (`l2`, `bgp`).
    const PREFIX: &'static str;
    /// The protocol, as the `nodeAssigned` Event names it (`layer2`, `bgp`).
    const PROTOCOL: &'static str;
    /// Whether one node at most may hold a Service's object: taking a Service then deletes the
    /// objects other nodes left (a node that died or lost its link cannot delete its own).
    const EXCLUSIVE: bool;

    /// A new object `name` (spec only; the writer adds the labels).
    fn object(name: &str) -> Self::Object;
    /// The object's status for `value`.
    fn status(key: &ServiceKey, node: &str, value: &Self::Value) -> serde_json::Value;
    /// The Service's UID, if the value knows it (Events then attach to this incarnation).
    fn uid(value: &Self::Value) -> Option<String>;
    /// For an exclusive kind, the node this one took the Service from, when known: its object
    /// is deleted by name. Unknown, the objects of every other node are looked for.
    fn taken_from(_value: &Self::Value) -> Option<&str> {
        None
    }
}

/// What the node announces, by Service.
pub type Desired<K> = BTreeMap<ServiceKey, <K as StatusKind>::Value>;

/// Name of the status object of a Service announced by a node: stable, so a restarted speaker
/// finds its own objects, and short whatever the names' lengths.
pub fn object_name<K: StatusKind>(key: &ServiceKey, node: &str) -> String {
    let digest = Sha256::digest(format!("{}/{}/{node}", key.namespace(), key.name()));
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{hex}", K::PREFIX)
}

/// Where and as whom a speaker writes its status objects.
#[derive(Clone)]
pub struct Scope {
    /// The API client.
    pub client: Client,
    /// The speaker's namespace, where the objects live.
    pub namespace: String,
    /// This node.
    pub node: String,
    /// The speaker's DaemonSet, owner of the objects, once known.
    pub owner: OwnerCell,
    /// The speaker's Event queue (`nodeAssigned`).
    pub events: EventQueue,
    /// Spaces out the writes (creates, status patches, owner patches and deletes), shared by
    /// both kinds' writers (`--status-writes-per-second`).
    pub pace: Pacer,
}

/// Starts the writer; send the desired state into the returned channel (the latest value wins).
/// The task ends, after writing the last value, when the sender is dropped.
pub fn spawn<K: StatusKind>(
    scope: Scope,
) -> (watch::Sender<Desired<K>>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(Desired::<K>::new());
    let handle = tokio::spawn(run::<K>(scope, rx));
    (tx, handle)
}

/// The writer's task: writes what `rx` holds, again after a failure, an owner change or a
/// delete from outside, until the sender is dropped.
async fn run<K: StatusKind>(scope: Scope, mut rx: watch::Receiver<Desired<K>>) {
    let Scope {
        client,
        namespace,
        node,
        owner,
        events,
        pace,
    } = scope;
    let writer = Writer::<K> {
        api: Api::namespaced(client, &namespace),
        node: Arc::from(node.as_str()),
        events,
        pace,
        owner,
        adopted: Mutex::new(Adopted::default()),
        owner_refused: AtomicBool::new(false),
    };
    // A newly learnt (or re-learnt) owner is given to what is already written.
    let mut owner_changes = writer.owner.subscribe();
    let mut written = writer.left_by_an_earlier_run().await;
    // This node's objects as the API server has them: one that someone else deletes while
    // it is still true (another node that briefly believed it owned the Service removes
    // the others' objects) is written again, without a second Event. A delete made while
    // the watch was down shows only as a missing object in the next relist, so each relist
    // is compared with what was written.
    let own = watcher(
        writer.api.clone(),
        watcher::Config::default().labels(&format!("{NODE_LABEL}={node}")),
    )
    .backoff(ferrolb_runtime::watch::WatchBackoff::default());
    futures::pin_mut!(own);
    let mut lost: BTreeSet<String> = BTreeSet::new();
    let mut listing: Option<BTreeSet<String>> = None;
    // Writes that failed (API server or etcd away) are tried again on their own: in a quiet
    // cluster nothing else may change for hours.
    let mut retries = ferrolb_runtime::watch::WatchBackoff::default();
    loop {
        let desired = rx.borrow_and_update().clone();
        let retry_at = if writer.sync(&desired, &mut written, &mut lost).await {
            kube::runtime::utils::Backoff::reset(&mut retries);
            None
        } else {
            let wait = retries
                .next()
                .unwrap_or(ferrolb_runtime::watch::WatchBackoff::MAX);
            tracing::debug!(kind = K::KIND, ?wait, "status writes failed; trying again");
            Some(tokio::time::Instant::now() + wait)
        };
        loop {
            tokio::select! {
                Ok(()) = owner_changes.changed() => break,
                changed = rx.changed() => {
                    if changed.is_err() {
                        // Sender gone (shutdown): write the last value and stop.
                        let desired = rx.borrow().clone();
                        writer.sync(&desired, &mut written, &mut lost).await;
                        return;
                    }
                    break;
                }
                () = sleep_until(retry_at), if retry_at.is_some() => break,
                Some(event) = own.next() => {
                    if watched(event, &mut written, &mut lost, &mut listing) {
                        break;
                    }
                }
            }
        }
    }
}

/// One event of the watch on this node's objects (`listing`: the names a relist found so far).
/// Returns whether the writer must act: an object still true was deleted, or a relist found
/// objects to adopt or missing ones to write again.
fn watched<O: Resource, V>(
    event: Result<watcher::Event<O>, watcher::Error>,
    written: &mut BTreeMap<String, Option<V>>,
    lost: &mut BTreeSet<String>,
    listing: &mut Option<BTreeSet<String>>,
) -> bool {
    match event {
        Ok(watcher::Event::Delete(object)) => object
            .meta()
            .name
            .as_deref()
            .is_some_and(|name| deleted(written, lost, name)),
        Ok(watcher::Event::Init) => {
            *listing = Some(BTreeSet::new());
            false
        }
        Ok(watcher::Event::InitApply(object)) => {
            if let (Some(names), Some(name)) = (listing.as_mut(), object.meta().name.clone()) {
                names.insert(name);
            }
            false
        }
        Ok(watcher::Event::InitDone) => listing
            .take()
            .is_some_and(|present| relisted(written, lost, &present)),
        Ok(watcher::Event::Apply(_)) | Err(_) => false,
    }
}

/// Sleeps until `at`; never wakes without one (the branch is then disabled anyway).
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Object `name` of this node was deleted by someone else. Returns whether the writer must act:
/// the object is still true, so it is written again (`lost`: without a second Event).
fn deleted<V>(
    written: &mut BTreeMap<String, Option<V>>,
    lost: &mut BTreeSet<String>,
    name: &str,
) -> bool {
    match written.get(name) {
        Some(Some(_)) => {
            tracing::info!(object = %name, "status object deleted by someone else while still true: writing it again");
            written.remove(name);
            lost.insert(name.to_string());
            true
        }
        Some(None) => {
            written.remove(name);
            false
        }
        None => false,
    }
}

/// A relist found this node's objects `present`. Objects written but missing were deleted while
/// the watch was down: written again (`lost`). Objects present but unknown to the writer (left by
/// a previous run, or written by a request that failed late) are adopted: kept if true, deleted
/// otherwise. Returns whether the writer must act.
fn relisted<V>(
    written: &mut BTreeMap<String, Option<V>>,
    lost: &mut BTreeSet<String>,
    present: &BTreeSet<String>,
) -> bool {
    let missing: Vec<String> = written
        .keys()
        .filter(|name| !present.contains(*name))
        .cloned()
        .collect();
    let mut act = false;
    for name in missing {
        if written.remove(&name).flatten().is_some() {
            tracing::info!(object = %name, "status object missing after a relist while still true: writing it again");
            lost.insert(name);
            act = true;
        }
    }
    for name in present {
        if !written.contains_key(name) {
            written.insert(name.clone(), None);
            act = true;
        }
    }
    act
}

struct Writer<K: StatusKind> {
    api: Api<K::Object>,
    node: Arc<str>,
    events: EventQueue,
    pace: Pacer,
    /// The speaker's DaemonSet, owner of the objects it writes.
    owner: OwnerCell,
    /// Objects this run has written with the owner, or given it.
    adopted: Mutex<Adopted>,
    /// Whether a refusal to set the owner was logged (once).
    owner_refused: AtomicBool,
}

impl<K: StatusKind> Writer<K> {
    /// Makes the API server hold `desired`. `lost` names objects deleted from outside while
    /// still true: written again, but not newly taken (no Event, no removal of others').
    /// Returns whether every write and delete succeeded.
    async fn sync(
        &self,
        desired: &Desired<K>,
        written: &mut BTreeMap<String, Option<K::Value>>,
        lost: &mut BTreeSet<String>,
    ) -> bool {
        let mut complete = true;
        let node = &*self.node;
        let wanted: BTreeMap<String, (&ServiceKey, &K::Value)> = desired
            .iter()
            .map(|(k, v)| (object_name::<K>(k, node), (k, v)))
            .collect();
        lost.retain(|name| wanted.contains_key(name));
        let stale: Vec<String> = written
            .keys()
            .filter(|n| !wanted.contains_key(*n))
            .cloned()
            .collect();
        for name in stale {
            match self.delete(&name).await {
                Ok(_) => {
                    written.remove(&name);
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    written.remove(&name);
                }
                Err(e) => {
                    complete = false;
                    tracing::warn!(kind = K::KIND, object = %name, error = %e, "deleting");
                }
            }
        }
        // Objects written before the owner was known (or by an earlier run, or for an owner
        // made again under its name) get it now.
        if let Some(owner) = self.owner.get() {
            for (name, value) in written.iter() {
                if value.is_some()
                    && wanted.contains_key(name)
                    && let Err(e) = self.adopt(name, &owner).await
                {
                    complete = false;
                    tracing::debug!(kind = K::KIND, object = %name, error = %e, "setting the owner");
                }
            }
        }
        // Newly taken Services whose previous owner is unknown: their other objects are looked
        // for with one list after the writes.
        let mut unknown: BTreeSet<&ServiceKey> = BTreeSet::new();
        for (name, (key, value)) in wanted {
            let previous = written.get(&name);
            if previous.is_some_and(|p| p.as_ref() == Some(value)) {
                continue;
            }
            let newly_taken = previous.is_none_or(Option::is_none) && !lost.contains(&name);
            if let Err(e) = self.write(&name, key, value).await {
                complete = false;
                tracing::warn!(kind = K::KIND, service = %key, error = %e, "writing");
                continue;
            }
            lost.remove(&name);
            written.insert(name, Some(value.clone()));
            if newly_taken {
                if K::EXCLUSIVE {
                    match K::taken_from(value).filter(|n| *n != node) {
                        Some(from) => self.remove_of(key, from).await,
                        None => {
                            unknown.insert(key);
                        }
                    }
                }
                self.events.push(Queued {
                    warning: false,
                    reason: "nodeAssigned",
                    message: format!(
                        "announcing from node \"{node}\" with protocol \"{}\"",
                        K::PROTOCOL
                    ),
                    action: "Announce",
                    regarding: service_reference(key, K::uid(value)),
                });
            }
        }
        if !unknown.is_empty() {
            self.remove_others(&unknown).await;
        }
        complete
    }

    /// Objects an earlier run of this speaker left: kept if still true, deleted otherwise (a
    /// failed list leaves them to the watch's first listing).
    async fn left_by_an_earlier_run(&self) -> BTreeMap<String, Option<K::Value>> {
        let mut written = BTreeMap::new();
        let selector = format!("{NODE_LABEL}={}", self.node);
        match self
            .api
            .list(&ListParams::default().labels(&selector))
            .await
        {
            Ok(list) => {
                for o in list.items {
                    if let Some(name) = o.meta().name.clone() {
                        written.insert(name, None);
                    }
                }
            }
            Err(e) => tracing::warn!(kind = K::KIND, error = %e, "listing status objects"),
        }
        written
    }

    /// Deletes the object node `from` wrote for a Service this node took from it: one
    /// delete by name, whatever the number of Services (a list would cost the API server a
    /// scan of every status object at every move).
    async fn remove_of(&self, key: &ServiceKey, from: &str) {
        let name = object_name::<K>(key, from);
        match self.delete(&name).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => {
                tracing::debug!(kind = K::KIND, object = %name, error = %e, "deleting the previous owner's object");
            }
        }
    }

    /// Deletes the objects other nodes wrote for Services this node now holds exclusively and
    /// whose previous owner it does not know (taken at its first plan): one list for all of
    /// them, served from the API server's cache (`resourceVersion=0`). An object it misses was
    /// written a moment ago by a node that also believes it owns the Service, and that node
    /// deletes its own once it sees this one.
    async fn remove_others(&self, keys: &BTreeSet<&ServiceKey>) {
        let mut selector = format!("{NODE_LABEL}!={}", self.node);
        if let [key] = keys.iter().collect::<Vec<_>>().as_slice() {
            selector = format!(
                "{SERVICE_NAME_LABEL}={},{SERVICE_NAMESPACE_LABEL}={},{selector}",
                key.name(),
                key.namespace()
            );
        }
        let list = match self
            .api
            .list(&ListParams::default().match_any().labels(&selector))
            .await
        {
            Ok(list) => list,
            Err(e) => {
                tracing::debug!(kind = K::KIND, error = %e, "listing other nodes' objects");
                return;
            }
        };
        for o in list.items {
            let meta = o.meta();
            let label = |l: &str| {
                meta.labels
                    .as_ref()
                    .and_then(|m| m.get(l))
                    .map(String::as_str)
                    .unwrap_or_default()
            };
            let of = ServiceKey::new(label(SERVICE_NAMESPACE_LABEL), label(SERVICE_NAME_LABEL));
            let Some(name) = meta.name.clone().filter(|_| keys.contains(&of)) else {
                continue;
            };
            if let Err(e) = self.delete(&name).await {
                tracing::debug!(kind = K::KIND, object = %name, error = %e, "deleting another node's object");
            }
        }
    }

    async fn write(
        &self,
        name: &str,
        key: &ServiceKey,
        value: &K::Value,
    ) -> Result<(), kube::Error> {
        let owner = self.owner.get();
        let mut object = K::object(name);
        object.meta_mut().owner_references = owner.as_ref().map(|o| vec![o.reference()]);
        object.meta_mut().labels = Some(
            [
                (NODE_LABEL.to_string(), self.node.to_string()),
                (SERVICE_NAME_LABEL.to_string(), key.name().to_string()),
                (
                    SERVICE_NAMESPACE_LABEL.to_string(),
                    key.namespace().to_string(),
                ),
            ]
            .into(),
        );
        self.pace.wait().await;
        let created = match self.api.create(&PostParams::default(), &object).await {
            // OwnerReferencesPermissionEnforcement without `delete`: written without an owner.
            Err(kube::Error::Api(e)) if e.code == 403 && owner.is_some() => {
                self.refused(&e);
                object.meta_mut().owner_references = None;
                self.pace.wait().await;
                self.api.create(&PostParams::default(), &object).await
            }
            other => other,
        };
        match created {
            Ok(_) => {
                if let Some(owner) = &owner {
                    self.adopted_now(name, owner);
                }
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                if let Some(owner) = &owner {
                    self.adopt(name, owner).await?;
                }
            }
            Err(e) => return Err(e),
        }
        // A merge patch replaces lists whole, so an interface or peer no longer used disappears.
        self.pace.wait().await;
        self.api
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "status": K::status(key, &self.node, value) })),
            )
            .await?;
        Ok(())
    }
}

impl<K: StatusKind> Writer<K> {
    /// Deletes object `name`, paced.
    async fn delete(&self, name: &str) -> Result<(), kube::Error> {
        self.pace.wait().await;
        self.api
            .delete(name, &DeleteParams::default())
            .await
            .map(|_| ())
    }

    /// Gives `owner` an object found existing (an earlier run's, or one written before the
    /// owner was known), once per run and owner. A refusal is logged once and not tried again:
    /// it never stops the status writes.
    async fn adopt(&self, name: &str, owner: &Owner) -> Result<(), kube::Error> {
        if self.adopted.lock().is_ok_and(|a| a.has(name, owner)) {
            return Ok(());
        }
        // A merge patch replaces the list whole: an earlier owner is no longer named.
        self.pace.wait().await;
        let patched = self
            .api
            .patch(name, &PatchParams::default(), &owner.merge_patch())
            .await;
        match patched {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 403 => self.refused(&e),
            // Gone meanwhile: the next write creates it with its owner.
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
            Err(e) => return Err(e),
        }
        self.adopted_now(name, owner);
        Ok(())
    }

    fn adopted_now(&self, name: &str, owner: &Owner) {
        if let Ok(mut adopted) = self.adopted.lock() {
            adopted.insert(name, owner);
        }
    }

    fn refused(&self, e: &kube::core::Status) {
        if !self.owner_refused.swap(true, Ordering::Relaxed) {
            tracing::warn!(kind = K::KIND, error = %e, "setting the status objects' owner was refused (needs delete on them): they stay after uninstall");
        }
    }
}

/// The objects given the current owner: forgotten when the owner changes (made again under
/// its name, with a new UID).
#[derive(Default)]
struct Adopted {
    owner_uid: String,
    names: BTreeSet<String>,
}

impl Adopted {
    fn has(&self, name: &str, owner: &Owner) -> bool {
        self.owner_uid == owner.reference().uid && self.names.contains(name)
    }

    fn insert(&mut self, name: &str, owner: &Owner) {
        let uid = owner.reference().uid;
        if self.owner_uid != uid {
            self.owner_uid = uid;
            self.names.clear();
        }
        self.names.insert(name.to_string());
    }
}

/// A reference to a Service, for Events about it.
pub fn service_reference(key: &ServiceKey, uid: Option<String>) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Service".into()),
        namespace: Some(key.namespace().to_string()),
        name: Some(key.name().to_string()),
        uid,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bgp::status::Bgp;
    use crate::l2::status::Layer2;

    #[test]
    fn adoption_is_forgotten_when_the_owner_is_made_again() {
        let first = Owner::pod("ds", "uid-1");
        let again = Owner::pod("ds", "uid-2");
        let mut adopted = Adopted::default();
        assert!(!adopted.has("l2-a", &first));
        adopted.insert("l2-a", &first);
        adopted.insert("l2-b", &first);
        assert!(adopted.has("l2-a", &first) && adopted.has("l2-b", &first));
        assert!(
            !adopted.has("l2-a", &again),
            "a new UID needs the object patched again"
        );
        adopted.insert("l2-a", &again);
        assert!(adopted.has("l2-a", &again) && !adopted.has("l2-b", &again));
    }

    #[test]
    fn object_names_are_stable_short_and_per_node() {
        let key = ServiceKey::new("ns", "a-very-long-service-name-".repeat(10).as_str());
        let a = object_name::<Bgp>(&key, "node1");
        assert_eq!(a, object_name::<Bgp>(&key, "node1"));
        assert_ne!(a, object_name::<Bgp>(&key, "node2"));
        assert!(a.starts_with("bgp-") && a.len() == 20, "{a}");
    }

    fn names(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_relist_rewrites_objects_deleted_while_the_watch_was_down() {
        // "a" and "b" written; "a" deleted during an API-server outage (no Delete event comes).
        let mut written = BTreeMap::from([("a".to_string(), Some(1)), ("b".to_string(), Some(2))]);
        let mut lost = BTreeSet::new();
        assert!(relisted(&mut written, &mut lost, &names(&["b"])));
        assert_eq!(lost, names(&["a"]));
        assert_eq!(written, BTreeMap::from([("b".to_string(), Some(2))]));
        // The next relist, after "a" was written again, changes nothing.
        written.insert("a".into(), Some(1));
        lost.clear();
        assert!(!relisted(&mut written, &mut lost, &names(&["a", "b"])));
        assert!(lost.is_empty());
    }

    #[test]
    fn a_relist_adopts_unknown_objects_and_forgets_gone_leftovers() {
        // "old" was adopted from a previous run and is gone; "late" was created by a write the
        // writer believed failed: adopted, so the next sync deletes it unless it is true.
        let mut written = BTreeMap::from([("old".to_string(), None), ("a".to_string(), Some(1))]);
        let mut lost = BTreeSet::new();
        assert!(relisted(&mut written, &mut lost, &names(&["a", "late"])));
        assert!(
            lost.is_empty(),
            "a leftover nobody wants is not written again"
        );
        assert_eq!(
            written,
            BTreeMap::from([("a".to_string(), Some(1)), ("late".to_string(), None)])
        );
    }

    #[test]
    fn a_delete_event_rewrites_only_what_is_still_true() {
        let mut written = BTreeMap::from([("a".to_string(), Some(1)), ("old".to_string(), None)]);
        let mut lost = BTreeSet::new();
        assert!(deleted(&mut written, &mut lost, "a"));
        assert!(!deleted(&mut written, &mut lost, "old"));
        assert!(!deleted(&mut written, &mut lost, "unknown"));
        assert_eq!(lost, names(&["a"]));
        assert!(written.is_empty());
    }

    #[test]
    fn object_names_do_not_change_across_versions() {
        // A restarted speaker adopts the objects its previous version wrote by these names.
        let key = ServiceKey::new("ns", "web");
        assert_eq!(object_name::<Layer2>(&key, "node1"), "l2-c6f677b8df9d49d2");
        assert_eq!(object_name::<Bgp>(&key, "node1"), "bgp-c6f677b8df9d49d2");
    }
}
