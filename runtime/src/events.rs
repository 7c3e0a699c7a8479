//! Events (`events.k8s.io/v1`) for both binaries: written as kube-runtime's `Recorder` writes
//! them, with a bounded de-duplication cache, through a bounded background queue so that no work
//! loop ever waits for an Event.
//!
//! kube-runtime's `Recorder` keeps every Event it sent for six minutes and scans that whole cache
//! under a write lock on every publish: allocating 10,000 Services kept 10,000 Events in memory
//! and made publishing quadratic. Here the cache holds at most [`CACHE_ENTRIES`] small entries;
//! an Event repeated within [`SERIES_WINDOW`] still becomes one Event with a growing `series`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};

/// Entries the de-duplication cache keeps at most.
pub const CACHE_ENTRIES: usize = 1024;

/// How long a repeated Event joins the earlier one's series (kube-runtime's figure).
pub const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);

/// One Event to record.
pub struct Note<'a> {
    /// `Warning` or `Normal`.
    pub warning: bool,
    /// Machine-readable reason.
    pub reason: &'a str,
    /// Human-readable message.
    pub message: &'a str,
    /// What the binary was doing (`Allocate`, `Validate`, `Announce`).
    pub action: &'a str,
}

/// What makes two Events the same: the object, the kind of Event and its message.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    namespace: String,
    kind: String,
    name: String,
    uid: String,
    warning: bool,
    reason: String,
    action: String,
    message: String,
}

#[derive(Debug)]
struct Sent {
    /// Name of the Event object written.
    name: String,
    count: i32,
    last: Instant,
}

/// Publishes Events for one controller instance.
pub struct Recorder {
    client: Client,
    controller: String,
    instance: String,
    sent: Mutex<HashMap<Key, Sent>>,
}

impl Recorder {
    /// A recorder reporting as `controller` (instance `instance`).
    pub fn new(client: Client, controller: &str, instance: &str) -> Self {
        Self {
            client,
            controller: controller.into(),
            instance: instance.into(),
            sent: Mutex::new(HashMap::new()),
        }
    }

    /// Records `note` on `regarding`: a new Event, or the next count of the same Event sent
    /// within [`SERIES_WINDOW`].
    pub async fn publish(
        &self,
        note: &Note<'_>,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let key = Key {
            namespace: namespace.into(),
            kind: regarding.kind.clone().unwrap_or_default(),
            name: regarding.name.clone().unwrap_or_default(),
            uid: regarding.uid.clone().unwrap_or_default(),
            warning: note.warning,
            reason: note.reason.into(),
            action: note.action.into(),
            message: note.message.into(),
        };
        let now = Instant::now();
        let repeat = self
            .lock()
            .get(&key)
            .filter(|s| now.duration_since(s.last) < SERIES_WINDOW)
            .map(|s| (s.name.clone(), s.count + 1));
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let stamp = Timestamp::now();
        let name = match repeat {
            Some((name, count)) => {
                let patch = serde_json::json!({
                    "series": {"count": count, "lastObservedTime": MicroTime(stamp)}
                });
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                self.remember(key, name.clone(), count, now);
                return Ok(());
            }
            None => format!(
                "{}.{:x}",
                regarding.name.as_deref().unwrap_or(&self.controller),
                stamp.as_nanosecond()
            ),
        };
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.into()),
                ..ObjectMeta::default()
            },
            action: Some(note.action.into()),
            reason: Some(note.reason.into()),
            note: Some(note.message.into()),
            event_time: Some(MicroTime(stamp)),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(if note.warning { "Warning" } else { "Normal" }.into()),
            ..Event::default()
        };
        api.create(&PostParams::default(), &event).await?;
        self.remember(key, name, 1, now);
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Sent>> {
        // A panic elsewhere while holding the lock leaves a usable map: take it.
        self.sent.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn remember(&self, key: Key, name: String, count: i32, now: Instant) {
        let mut sent = self.lock();
        if sent.len() >= CACHE_ENTRIES && !sent.contains_key(&key) {
            sent.retain(|_, s| now.duration_since(s.last) < SERIES_WINDOW);
            if sent.len() >= CACHE_ENTRIES
                && let Some(oldest) = sent
                    .iter()
                    .min_by_key(|(_, s)| s.last)
                    .map(|(k, _)| k.clone())
            {
                sent.remove(&oldest);
            }
        }
        sent.insert(
            key,
            Sent {
                name,
                count,
                last: now,
            },
        );
    }

    /// Entries in the de-duplication cache (for tests).
    #[cfg(test)]
    fn cached(&self) -> usize {
        self.lock().len()
    }
}

/// Events waiting for the writer, at most; more are dropped and counted.
pub const QUEUE_CAPACITY: usize = 4096;

/// Event writes in flight at once. Few, so that status writes, which carry the allocation,
/// get most of the API server when both compete (a backlog makes one Event per Service).
pub const WRITERS: usize = 4;

/// An Event waiting to be written.
#[derive(Debug)]
pub struct Queued {
    /// `Warning` or `Normal`.
    pub warning: bool,
    /// Machine-readable reason.
    pub reason: &'static str,
    /// Human-readable message.
    pub message: String,
    /// What the binary was doing.
    pub action: &'static str,
    /// The object the Event is about.
    pub regarding: ObjectReference,
}

/// Whether Events may be written now: the controller writes only while it leads, a speaker
/// always.
pub trait WriteGate: Clone + Send + Sync + 'static {
    /// Whether an Event may be written now.
    fn may_write(&self) -> bool;
}

/// The gate of a process that always writes (a speaker reports for its own node).
#[derive(Clone, Copy, Debug, Default)]
pub struct Always;

impl WriteGate for Always {
    fn may_write(&self) -> bool {
        true
    }
}

/// Hands Events to a background writer, so that no work loop waits for an Event.
///
/// Events are best effort, as client-go's broadcaster treats them: when the queue is full the
/// Event is dropped and counted (the binary's `..._events_dropped_total`). Queued Events are
/// written only while the [`WriteGate`] allows.
#[derive(Clone, Debug)]
pub struct EventQueue {
    tx: mpsc::Sender<Queued>,
    dropped: Counter,
}

impl EventQueue {
    /// Starts the writer task.
    pub fn spawn(recorder: Arc<Recorder>, gate: impl WriteGate, dropped: Counter) -> Self {
        let (tx, rx) = mpsc::channel::<Queued>(QUEUE_CAPACITY);
        let stream = tokio_stream_of(rx);
        tokio::spawn(async move {
            stream
                .map(|q| {
                    let recorder = Arc::clone(&recorder);
                    let gate = gate.clone();
                    async move {
                        if !gate.may_write() {
                            return;
                        }
                        let note = Note {
                            warning: q.warning,
                            reason: q.reason,
                            message: &q.message,
                            action: q.action,
                        };
                        if let Err(e) = recorder.publish(&note, &q.regarding).await {
                            tracing::debug!(error = %e, reason = q.reason, "recording an Event failed");
                        }
                    }
                })
                .buffer_unordered(WRITERS)
                .for_each(|()| async {})
                .await;
        });
        Self { tx, dropped }
    }

    /// Queues an Event; drops it (counted) when the queue is full.
    pub fn push(&self, event: Queued) {
        if let Err(e) = self.tx.try_send(event) {
            self.dropped.inc();
            tracing::debug!(error = %e, "Event queue full; Event dropped");
        }
    }
}

/// The receiver as a stream (without pulling in tokio-stream for one adapter).
fn tokio_stream_of(rx: mpsc::Receiver<Queued>) -> impl futures::Stream<Item = Queued> {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|q| (q, rx)) })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn recorder() -> Recorder {
        // Never contacted: the tests only exercise the cache.
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        Recorder::new(Client::try_from(config).unwrap(), "c", "i")
    }

    fn key(i: usize) -> Key {
        Key {
            namespace: "ns".into(),
            kind: "Service".into(),
            name: format!("s{i}"),
            uid: String::new(),
            warning: false,
            reason: "IPAllocated".into(),
            action: "Allocate".into(),
            message: "m".into(),
        }
    }

    #[tokio::test]
    async fn the_cache_stays_bounded_and_forgets_the_oldest() {
        let r = recorder();
        let start = Instant::now();
        for i in 0..CACHE_ENTRIES * 3 {
            r.remember(
                key(i),
                format!("e{i}"),
                1,
                start + Duration::from_millis(i as u64),
            );
        }
        assert_eq!(r.cached(), CACHE_ENTRIES);
        let sent = r.lock();
        assert!(!sent.contains_key(&key(0)));
        assert!(sent.contains_key(&key(CACHE_ENTRIES * 3 - 1)));
    }

    #[tokio::test]
    async fn expired_entries_go_first() {
        let r = recorder();
        let start = Instant::now();
        for i in 0..CACHE_ENTRIES {
            r.remember(key(i), format!("e{i}"), 1, start);
        }
        let later = start + SERIES_WINDOW + Duration::from_secs(1);
        r.remember(key(CACHE_ENTRIES), "new".into(), 1, later);
        assert_eq!(r.cached(), 1);
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_instead_of_waiting() {
        // The current-thread runtime runs the writer only when this test yields, so the
        // pushes below meet a queue nobody drains yet.
        let dropped = Counter::default();
        let queue = EventQueue::spawn(Arc::new(recorder()), Always, dropped.clone());
        for i in 0..QUEUE_CAPACITY + 10 {
            queue.push(Queued {
                warning: false,
                reason: "IPAllocated",
                message: format!("m{i}"),
                action: "Allocate",
                regarding: ObjectReference::default(),
            });
        }
        assert_eq!(dropped.get(), 10);
    }
}
