//! Watch caches that keep, per object, only a reduction of it: a value of the binary's own
//! type, or nothing when the object does not concern the binary.
//!
//! A reflector cache ([`crate::watch::reflect`]) keeps the Kubernetes object itself, and the
//! generated types are large even when trimmed (a `Service` is 824 bytes before any of its
//! strings, an `EndpointSlice` 432 and each endpoint 352). A speaker caches every Service and
//! EndpointSlice of the cluster, most of which it never announces: at 10,000 Services those
//! caches were most of its memory (issue #40). A reduced cache keeps what the binary reads,
//! and for an object it has no use for, not even its key.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use futures::{Stream, StreamExt};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

use crate::watch::{Change, Continue, WatchBackoff};

/// A cache of reduced objects by key, filled by [`reflect_reduced`]. Cheap to clone: clones
/// share the cache.
#[derive(Debug)]
pub struct Reduced<Q, V> {
    map: Arc<RwLock<HashMap<Q, Arc<V>>>>,
    /// Counts the changes to `map`, bumped under its write lock.
    generation: Arc<AtomicU64>,
}

impl<Q, V> Clone for Reduced<Q, V> {
    fn clone(&self) -> Self {
        Self {
            map: self.map.clone(),
            generation: self.generation.clone(),
        }
    }
}

impl<Q: Hash + Eq, V> Default for Reduced<Q, V> {
    fn default() -> Self {
        Self {
            map: Arc::default(),
            generation: Arc::default(),
        }
    }
}

impl<Q: Hash + Eq + Clone, V> Reduced<Q, V> {
    /// The value kept under `key`.
    pub fn get(&self, key: &Q) -> Option<Arc<V>> {
        self.read(|map| map.get(key).cloned())
    }

    /// Every value kept, in no order.
    pub fn state(&self) -> Vec<Arc<V>> {
        self.read(|map| map.values().cloned().collect())
    }

    /// A number that changes whenever the kept values do: a reader that reads it before the
    /// values and finds it equal to an earlier reading has the same values as then, and
    /// need not read them again (a speaker checks its Nodes every heartbeat interval).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn read<T>(&self, f: impl FnOnce(&HashMap<Q, Arc<V>>) -> T) -> T {
        // A panic while the lock was held cannot leave the map half-changed: each write is
        // one insert, remove or swap.
        f(&self.map.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Runs `f` on the map; when it returns true (it changed the map), bumps the generation
    /// before the lock is released, so a reader that sees the new generation sees the change.
    fn write(&self, f: impl FnOnce(&mut HashMap<Q, Arc<V>>) -> bool) -> bool {
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        let changed = f(&mut map);
        if changed {
            self.generation.fetch_add(1, Ordering::Release);
        }
        changed
    }

    /// Applies one watch event: an object applied or deleted, or a step of a (re-)list,
    /// whose objects replace the whole cache once it is complete, as a reflector's do (a
    /// list after a gap must drop what was deleted in the gap). `list` holds the list being
    /// read. Returns whether the event can matter to a reader: an applied or deleted object
    /// whose reduction changed, a listed object kept, or the end of a list.
    fn apply<K>(
        &self,
        event: &Event<K>,
        list: &mut Option<HashMap<Q, Arc<V>>>,
        key: &impl Fn(&K) -> Q,
        reduce: &mut impl FnMut(&K) -> Option<V>,
    ) -> bool
    where
        V: PartialEq,
    {
        match event {
            Event::Apply(o) => {
                let k = key(o);
                match reduce(o) {
                    Some(v) => self.write(|map| match map.get(&k) {
                        Some(old) if **old == v => false,
                        _ => {
                            map.insert(k, Arc::new(v));
                            true
                        }
                    }),
                    None => self.write(|map| map.remove(&k).is_some()),
                }
            }
            Event::Delete(o) => {
                let k = key(o);
                self.write(|map| map.remove(&k).is_some())
            }
            Event::Init => {
                *list = Some(HashMap::new());
                false
            }
            Event::InitApply(o) => match reduce(o) {
                Some(v) => {
                    list.get_or_insert_default().insert(key(o), Arc::new(v));
                    true
                }
                None => false,
            },
            Event::InitDone => {
                let listed = list.take().unwrap_or_default();
                self.write(|map| {
                    *map = listed;
                    true
                })
            }
        }
    }
}

/// Watches `stream` into a new reduced cache: each object is kept as `reduce` of it under
/// `key` of it, or not at all when `reduce` gives `None` (and a value kept for an earlier
/// version goes). Calls `on` once the cache holds the result of an event that can matter to a
/// reader: with the whole object when its reduction changed (an object whose reduction stays
/// the same, or stays nothing, calls nothing: most of a cluster's Service and EndpointSlice
/// updates), and at the end of each list. A failed watch is logged and retried with backoff;
/// the task ends when `on` returns `false`.
pub fn reflect_reduced<K, Q, V, S>(
    stream: S,
    kind: &'static str,
    key: impl Fn(&K) -> Q + Send + 'static,
    mut reduce: impl FnMut(&K) -> Option<V> + Send + 'static,
    mut on: impl FnMut(Change<'_, K>) -> Continue + Send + 'static,
) -> Reduced<Q, V>
where
    K: Send + 'static,
    Q: Hash + Eq + Clone + Send + Sync + 'static,
    V: PartialEq + Send + Sync + 'static,
    S: Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
{
    let cache = Reduced::default();
    let writer = cache.clone();
    tokio::spawn(async move {
        let stream = stream.backoff(WatchBackoff::default());
        futures::pin_mut!(stream);
        let mut list = None;
        while let Some(event) = stream.next().await {
            let event = match event {
                Ok(event) => event,
                Err(e) => {
                    tracing::warn!(error = %e, watch = kind, "watch failed; retrying");
                    continue;
                }
            };
            if !writer.apply(&event, &mut list, &key, &mut reduce) {
                continue;
            }
            let go_on = match &event {
                Event::Apply(o) | Event::InitApply(o) => on(Change::Object(o)),
                Event::Delete(o) => on(Change::Deleted(o)),
                Event::InitDone => on(Change::Listed),
                Event::Init => true,
            };
            if !go_on {
                return;
            }
        }
    });
    cache
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// An object: a name and a number; kept as the number when it is even.
    type Obj = (&'static str, u32);

    fn apply(
        cache: &Reduced<&'static str, u32>,
        list: &mut Option<HashMap<&'static str, Arc<u32>>>,
        event: Event<Obj>,
    ) -> bool {
        cache.apply(&event, list, &|o: &Obj| o.0, &mut |o: &Obj| {
            o.1.is_multiple_of(2).then_some(o.1)
        })
    }

    fn kept(cache: &Reduced<&'static str, u32>) -> Vec<(&'static str, u32)> {
        let mut out: Vec<_> = cache.read(|m| m.iter().map(|(k, v)| (*k, **v)).collect());
        out.sort();
        out
    }

    #[test]
    fn keeps_reductions_and_drops_what_reduces_to_nothing() {
        let cache = Reduced::default();
        let mut list = None;
        apply(&cache, &mut list, Event::Apply(("a", 2)));
        apply(&cache, &mut list, Event::Apply(("b", 3)));
        assert_eq!(kept(&cache), [("a", 2)]);
        // A new version that no longer concerns us takes the old one out.
        apply(&cache, &mut list, Event::Apply(("a", 5)));
        assert!(kept(&cache).is_empty());
        apply(&cache, &mut list, Event::Apply(("a", 4)));
        apply(&cache, &mut list, Event::Delete(("a", 4)));
        assert!(cache.get(&"a").is_none());
    }

    #[test]
    fn a_list_replaces_the_cache_once_complete() {
        let cache = Reduced::default();
        let mut list = None;
        apply(&cache, &mut list, Event::Apply(("gone", 2)));
        apply(&cache, &mut list, Event::Apply(("stays", 2)));
        apply(&cache, &mut list, Event::Init);
        apply(&cache, &mut list, Event::InitApply(("stays", 6)));
        apply(&cache, &mut list, Event::InitApply(("odd", 7)));
        apply(&cache, &mut list, Event::InitApply(("new", 8)));
        // Until the list is complete, the cache is the old one.
        assert_eq!(kept(&cache), [("gone", 2), ("stays", 2)]);
        apply(&cache, &mut list, Event::InitDone);
        assert_eq!(kept(&cache), [("new", 8), ("stays", 6)]);
    }

    #[test]
    fn only_an_event_that_changes_what_is_kept_matters() {
        let cache = Reduced::default();
        let mut list = None;
        assert!(apply(&cache, &mut list, Event::Apply(("a", 2))));
        // The same reduction again (another field of the object changed): nothing to do.
        assert!(!apply(&cache, &mut list, Event::Apply(("a", 2))));
        assert!(apply(&cache, &mut list, Event::Apply(("a", 4))));
        // Objects that reduce to nothing, before and after: nothing to do.
        assert!(!apply(&cache, &mut list, Event::Apply(("b", 3))));
        assert!(!apply(&cache, &mut list, Event::Apply(("b", 5))));
        assert!(!apply(&cache, &mut list, Event::Delete(("b", 5))));
        // Kept, then no longer: that matters, as does its delete while kept.
        assert!(apply(&cache, &mut list, Event::Apply(("a", 7))));
        assert!(apply(&cache, &mut list, Event::Apply(("a", 8))));
        assert!(apply(&cache, &mut list, Event::Delete(("a", 8))));
        // A list: its kept objects and its end matter (the end replaces the cache).
        assert!(!apply(&cache, &mut list, Event::Init));
        assert!(!apply(&cache, &mut list, Event::InitApply(("c", 9))));
        assert!(apply(&cache, &mut list, Event::InitApply(("d", 10))));
        assert!(apply(&cache, &mut list, Event::InitDone));
        assert_eq!(kept(&cache), [("d", 10)]);
    }

    #[test]
    fn the_generation_moves_with_every_change_and_only_then() {
        let cache = Reduced::default();
        let mut list = None;
        let g0 = cache.generation();
        apply(&cache, &mut list, Event::Apply(("a", 2)));
        let g1 = cache.generation();
        assert_ne!(g0, g1);
        apply(&cache, &mut list, Event::Apply(("a", 2)));
        apply(&cache, &mut list, Event::Apply(("b", 3)));
        apply(&cache, &mut list, Event::Delete(("b", 3)));
        assert_eq!(cache.generation(), g1, "nothing kept changed");
        apply(&cache, &mut list, Event::Delete(("a", 2)));
        let g2 = cache.generation();
        assert_ne!(g2, g1);
        // A list changes the cache when it completes, not before.
        apply(&cache, &mut list, Event::Init);
        apply(&cache, &mut list, Event::InitApply(("c", 4)));
        assert_eq!(cache.generation(), g2);
        apply(&cache, &mut list, Event::InitDone);
        assert_ne!(cache.generation(), g2);
    }
}
