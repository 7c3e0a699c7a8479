//! The watches: Services (trimmed as they arrive, cached by the work loop), the metadata of
//! Namespaces and Nodes, and the `metallb.io` configuration of ferrolb's namespace. Each hands
//! the loop a [`Work`] item per change and one when its initial list is complete.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};

use ferrolb_runtime::failpoint::Failpoints;
use ferrolb_runtime::watch::{Change, ConfigChange, ConfigStores, Continue, reflect};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::Store;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use crate::node_addresses::{NodeFacts, SliceFacts};
use crate::presence::Presence;
use crate::slim::{self, CachedService};
use ferrolb_config::allocator::ServiceKey;
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// Work items the watches produce.
#[derive(Debug)]
pub(super) enum Work {
    /// A watch event of a Service, already trimmed (boxed: it is ten times the other variants).
    Service(Box<Event<CachedService>>),
    /// A configuration object or a Node changed: validate the configuration again.
    Config,
    /// A Namespace changed (its labels admit Services to pools).
    Namespace(String),
    /// The watch of this kind has its initial list (or a re-list).
    Synced(&'static str),
    /// A Node's addresses, labels or readiness (node addresses only).
    Node(Event<(ServiceKey, NodeFacts)>),
    /// An EndpointSlice's ready nodes (node addresses only).
    Slice(Event<(ServiceKey, SliceFacts)>),
    /// A speaker's presence Lease changed (node addresses only).
    Presence,
}

/// The watches' caches, but for Services, which the work loop keeps itself.
pub(super) struct Stores {
    /// Namespaces' names and labels (pool admission).
    pub(super) namespaces: Store<PartialObjectMeta<Namespace>>,
    /// Nodes' names and labels (validation).
    pub(super) nodes: Store<PartialObjectMeta<Node>>,
    /// The `metallb.io` objects of ferrolb's namespace.
    pub(super) config: ConfigStores,
}

/// The watches started: their caches, and how many must list before the controller acts.
pub(super) struct Started {
    /// The caches the watches fill.
    pub(super) stores: Stores,
    /// The speakers' presence, watched when node addresses are on.
    pub(super) presence: Option<Presence>,
    /// Counted as the watches start, so that a watch added can never be missing from it.
    pub(super) watches: usize,
}

/// Objects per page of the initial list (and of a re-list): each page is held whole while it is
/// decoded, so it sets the peak above the caches.
const PAGE_SIZE: u32 = 100;

/// Starts every watch, sending what they hear on `tx`. With `presence_group` (node addresses
/// on) also full Nodes, EndpointSlices and that group's presence Leases.
pub(super) fn start(
    client: &Client,
    namespace: &str,
    presence_group: Option<&str>,
    tx: &mpsc::UnboundedSender<Work>,
    failpoints: &Failpoints,
) -> Started {
    let mut starter = Starter {
        client,
        tx,
        started: 0,
    };
    starter.services(failpoints.clone());
    let stores = Stores {
        namespaces: starter.namespaces(),
        nodes: starter.nodes(),
        config: starter.config(namespace),
    };
    let presence = presence_group.map(|group| {
        starter.facts::<Node, _>("nodes (addresses)", NodeFacts::of, Work::Node);
        starter.facts::<EndpointSlice, _>(
            "endpointslices",
            |s| {
                let facts = SliceFacts::of(s);
                Some((facts.slice.clone(), facts))
            },
            Work::Slice,
        );
        starter.presence(namespace, group)
    });
    Started {
        stores,
        presence,
        watches: starter.started,
    }
}

/// Sends `work` to the loop; `false` once the loop is gone.
fn send(tx: &mpsc::UnboundedSender<Work>, work: Work) -> Continue {
    tx.send(work).is_ok()
}

/// Starts watches, counting each one it starts.
struct Starter<'a> {
    client: &'a Client,
    tx: &'a mpsc::UnboundedSender<Work>,
    started: usize,
}

impl Starter<'_> {
    /// Watches Services, trimming each as it arrives (the full object is dropped at once), and
    /// hands the events to the work loop, which keeps the cache.
    ///
    /// Failpoint `controller-services-relist` (debug builds): once armed, the watch starts over
    /// with a re-list, and holds that list's end (`InitDone`) until disarmed, so that a test
    /// can make a re-list older than what happens while it is held (issue #33, item 4).
    fn services(&mut self, failpoints: Failpoints) {
        self.started += 1;
        let client = self.client.clone();
        let tx = self.tx.clone();
        tokio::spawn(async move {
            loop {
                // Lists (the first and every re-list) by quorum read, never from the API
                // server's cache, so that a re-list holds every write the watch delivered
                // before it broke (decision 0016); kube's default, stated because
                // `any_semantic()` would break it.
                let stream = watcher(
                    Api::<Service>::all(client.clone()),
                    watcher::Config::default()
                        .page_size(PAGE_SIZE)
                        .list_semantic(watcher::ListSemantic::MostRecent),
                )
                .backoff(ferrolb_runtime::watch::WatchBackoff::default());
                if !forward_services(stream, &tx, &failpoints).await {
                    return;
                }
            }
        });
    }

    /// Watches the metadata of every object of kind `K` (names and labels only are kept); `on`
    /// hears each change and says whether the watch goes on.
    fn metadata<K>(
        &mut self,
        kind: &'static str,
        on: impl FnMut(Change<'_, PartialObjectMeta<K>>) -> Continue + Send + 'static,
    ) -> Store<PartialObjectMeta<K>>
    where
        PartialObjectMeta<K>: Resource<DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        self.started += 1;
        reflect(
            watcher(
                Api::<PartialObjectMeta<K>>::all(self.client.clone()),
                watcher::Config::default().page_size(PAGE_SIZE),
            ),
            kind,
            slim::name_and_labels,
            on,
        )
    }

    /// Namespaces' names and labels: a namespace's labels decide which pools its Services may
    /// use.
    fn namespaces(&mut self) -> Store<PartialObjectMeta<Namespace>> {
        let tx = self.tx.clone();
        self.metadata("namespaces", move |change| match change {
            Change::Object(n) | Change::Deleted(n) => send(
                &tx,
                Work::Namespace(n.metadata.name.clone().unwrap_or_default()),
            ),
            Change::Listed => send(&tx, Work::Synced("namespaces")),
        })
    }

    /// Nodes' names and labels, which the configuration is validated with (node selectors):
    /// only a Node that comes, goes or changes its labels means validating again, not
    /// kubelet's status reports (one a Node every few minutes, each a metadata change), which
    /// made every one of them an O(N) validation: N/300 a second at rest.
    fn nodes(&mut self) -> Store<PartialObjectMeta<Node>> {
        let tx = self.tx.clone();
        let mut labels = LabelMemo::default();
        self.metadata("nodes", move |change| match change {
            Change::Object(o) => !labels.changed(o) || send(&tx, Work::Config),
            Change::Deleted(o) => {
                labels.forget(o);
                send(&tx, Work::Config)
            }
            // A re-list reports no deletion: whatever went meanwhile counts now.
            Change::Listed => send(&tx, Work::Synced("nodes")) && send(&tx, Work::Config),
        })
    }

    /// Watches every object of kind `K`, keeping only what `read` takes of each (keyed by
    /// namespace and name) and sending it on as `wrap` makes it.
    fn facts<K, T>(
        &mut self,
        kind: &'static str,
        read: fn(&K) -> Option<(ServiceKey, T)>,
        wrap: fn(Event<(ServiceKey, T)>) -> Work,
    ) where
        K: Resource<DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
        T: Send + 'static,
    {
        self.started += 1;
        let client = self.client.clone();
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let api = Api::<K>::all(client);
            let stream = watcher(api, watcher::Config::default().page_size(PAGE_SIZE))
                .backoff(ferrolb_runtime::watch::WatchBackoff::default());
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                let event = match event {
                    Ok(Event::Apply(o)) => read(&o).map(Event::Apply),
                    Ok(Event::Delete(o)) => read(&o).map(Event::Delete),
                    Ok(Event::InitApply(o)) => read(&o).map(Event::InitApply),
                    Ok(Event::Init) => Some(Event::Init),
                    Ok(Event::InitDone) => Some(Event::InitDone),
                    Err(e) => {
                        tracing::warn!(error = %e, watch = kind, "watch failed; retrying");
                        None
                    }
                };
                let Some(event) = event else { continue };
                let done = matches!(event, Event::InitDone);
                if tx.send(wrap(event)).is_err() || (done && tx.send(Work::Synced(kind)).is_err()) {
                    return;
                }
            }
        });
    }

    /// Watches the speakers' presence Leases of `group` in `namespace`.
    fn presence(&mut self, namespace: &str, group: &str) -> Presence {
        self.started += 1;
        let tx = self.tx.clone();
        Presence::watch(self.client, namespace, group, move |change| match change {
            Change::Object(_) | Change::Deleted(_) => send(&tx, Work::Presence),
            Change::Listed => send(&tx, Work::Synced("presence leases")),
        })
    }

    /// Watches the configuration objects of `namespace`, one watch per kind.
    fn config(&mut self, namespace: &str) -> ConfigStores {
        self.started += ConfigStores::WATCHES;
        let tx = self.tx.clone();
        ConfigStores::start(self.client, namespace, PAGE_SIZE, move |kind, change| {
            send(
                &tx,
                match change {
                    ConfigChange::Changed => Work::Config,
                    ConfigChange::Listed => Work::Synced(kind),
                },
            )
        })
    }
}

/// What the Service watch of [`Starter::services`] does with each event: trims it and sends it
/// on. Returns `false` once the loop is gone, `true` when failpoint `controller-services-relist`
/// asks for a re-list.
async fn forward_services(
    stream: impl futures::Stream<Item = watcher::Result<Event<Service>>>,
    tx: &mpsc::UnboundedSender<Work>,
    failpoints: &Failpoints,
) -> Continue {
    const RELIST: &str = "controller-services-relist";
    futures::pin_mut!(stream);
    // Whether this stream is the re-list the failpoint asked for.
    let forced = failpoints.armed(RELIST);
    loop {
        let event = tokio::select! {
            event = stream.next() => event,
            () = failpoints.armed_later(RELIST), if !forced => {
                tracing::warn!(failpoint = RELIST, "failpoint armed: re-listing the Services");
                return true;
            }
        };
        let Some(event) = event else { return true };
        let event = match event {
            Ok(Event::Apply(s)) => Event::Apply(CachedService::new(s)),
            Ok(Event::Delete(s)) => Event::Delete(CachedService::new(s)),
            Ok(Event::InitApply(s)) => Event::InitApply(CachedService::new(s)),
            Ok(Event::Init) => Event::Init,
            Ok(Event::InitDone) => Event::InitDone,
            Err(e) => {
                tracing::warn!(error = %e, watch = "services", "watch failed; retrying");
                continue;
            }
        };
        let done = matches!(event, Event::InitDone);
        if done && forced {
            failpoints.hold(RELIST).await;
        }
        if tx.send(Work::Service(Box::new(event))).is_err()
            || (done && tx.send(Work::Synced("services")).is_err())
        {
            return false;
        }
    }
}

/// A fingerprint of each Node's labels, to tell a label change from any other update.
#[derive(Default)]
struct LabelMemo {
    seen: HashMap<String, u64>,
    hasher: RandomState,
}

impl LabelMemo {
    /// Whether `node` is new or its labels differ from the last time (and remembers them).
    fn changed(&mut self, node: &PartialObjectMeta<Node>) -> bool {
        let name = node.metadata.name.clone().unwrap_or_default();
        let fingerprint = self.hasher.hash_one(&node.metadata.labels);
        self.seen.insert(name, fingerprint) != Some(fingerprint)
    }

    /// `node` is gone.
    fn forget(&mut self, node: &PartialObjectMeta<Node>) {
        if let Some(name) = &node.metadata.name {
            self.seen.remove(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, labels: &[(&str, &str)]) -> PartialObjectMeta<Node> {
        let mut node = PartialObjectMeta::<Node>::default();
        node.metadata.name = Some(name.to_string());
        node.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        node
    }

    /// Only a new Node, or new labels, is a change; an update that keeps them is not, and a
    /// Node that left and came back is new again.
    #[test]
    fn only_a_label_change_is_a_change() {
        let mut memo = LabelMemo::default();
        assert!(memo.changed(&node("n1", &[("zone", "a")])));
        assert!(memo.changed(&node("n2", &[("zone", "a")])));
        assert!(
            !memo.changed(&node("n1", &[("zone", "a")])),
            "kubelet's status report"
        );
        assert!(memo.changed(&node("n1", &[("zone", "b")])));
        assert!(memo.changed(&node("n1", &[("zone", "b"), ("rack", "1")])));
        assert!(memo.changed(&node("n1", &[])));
        assert!(!memo.changed(&node("n2", &[("zone", "a")])));
        memo.forget(&node("n2", &[("zone", "a")]));
        assert!(
            memo.changed(&node("n2", &[("zone", "a")])),
            "a Node back after leaving"
        );
    }
}
