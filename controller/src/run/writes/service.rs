//! One Service's write: its status and the controller's annotations (pool, or node addresses)
//! in one fenced merge patch, then its Events. Owns what it needs, so that writes run while the work loop goes on.

use std::sync::Arc;
use std::time::Instant;

use ferrolb_config::allocator::IP_ALLOCATED_FROM_POOL;
use ferrolb_runtime::events::{self, EventQueue};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Resource};

use super::Applied;
use crate::core::{
    DEPRECATED_POOL_ANNOTATION, Desired, Note, Outcome, has_servicelb_finalizer, matches,
};
use crate::leader::Leadership;
use crate::node_addresses::{SERVED_BY_ANNOTATION, SERVED_BY_NODE_ADDRESSES};
use crate::telemetry::Metrics;
use ferrolb_config::node_addresses::SERVICELB_FINALIZER;

/// A write starts only with at least this much of the leadership grant left: less, and it would
/// likely be abandoned half-way (every write is abandoned when the grant ends).
const MIN_WRITE_WINDOW: std::time::Duration = std::time::Duration::from_millis(500);

/// Writes one Service's outcome.
#[derive(Clone)]
pub(super) struct Writer {
    /// The API server.
    pub(super) client: Client,
    /// Checked before every write, and the end of its grant abandons a write.
    pub(super) leadership: Leadership,
    /// Write latencies and failures.
    pub(super) metrics: Arc<Metrics>,
    /// The queue the Services' Events go through.
    pub(super) events: EventQueue,
}

impl Writer {
    /// Writes what differs and records the Events, if this replica still leads in `term`.
    ///
    /// The fence: the write is conditional on the resourceVersion it was decided on, so the API
    /// server refuses it if anyone (a newer leader among them) wrote the Service since; and it is
    /// abandoned when this term's grant ends, which is before any other replica can take the
    /// Lease (docs/decisions/0016-controller-fencing.md).
    pub(super) async fn apply(
        &self,
        service: &Service,
        outcome: &Outcome,
        term: u64,
    ) -> anyhow::Result<Applied> {
        let started = Instant::now();
        let until = match self.leadership.grant() {
            Some((now_term, until)) if now_term == term && until > started + MIN_WRITE_WINDOW => {
                until
            }
            _ => return Ok(Applied::NotLeading),
        };
        if !matches(service, &outcome.desired) {
            // Biased: once the grant has ended, the write is never polled again (not even once
            // on waking from a freeze, which plain `timeout` would do before checking the time).
            let result = tokio::select! {
                biased;
                () = tokio::time::sleep_until(until.into()) => None,
                r = self.write(service, &outcome.desired) => Some(r),
            };
            match result {
                None => {
                    self.metrics.write_failed("abandoned");
                    anyhow::bail!(
                        "the write did not finish before the leadership grant ended; abandoned"
                    )
                }
                Some(Err(WriteError::Conflict)) => {
                    self.metrics.write_failed("conflict");
                    return Ok(Applied::Stale);
                }
                Some(Err(WriteError::Other(e))) => {
                    self.metrics.write_failed("error");
                    return Err(e);
                }
                Some(Ok(())) => {}
            }
            self.metrics
                .allocation_seconds
                .observe(started.elapsed().as_secs_f64());
        }
        for note in &outcome.notes {
            self.publish(service, note);
        }
        Ok(Applied::Done)
    }

    async fn write(&self, service: &Service, desired: &Desired) -> Result<(), WriteError> {
        let ns = service.metadata.namespace.as_deref().unwrap_or_default();
        let name = service.metadata.name.as_deref().unwrap_or_default();
        let api: Api<Service> = Api::namespaced(self.client.clone(), ns);
        let ingress_of = |ips: &[std::net::IpAddr]| {
            if ips.is_empty() {
                return serde_json::Value::Null;
            }
            serde_json::Value::Array(
                ips.iter()
                    .map(|ip| serde_json::json!({"ip": ip.to_string(), "ipMode": "VIP"}))
                    .collect(),
            )
        };
        let (ingress, pool, marker) = match desired {
            Desired::Untouched => return Ok(()),
            Desired::Assigned { ips, pool } => (
                ingress_of(ips),
                serde_json::Value::String(pool.clone()),
                serde_json::Value::Null,
            ),
            Desired::Cleared => (
                serde_json::Value::Null,
                serde_json::Value::Null,
                serde_json::Value::Null,
            ),
            Desired::NodeAddresses { ips } => (
                ingress_of(ips),
                serde_json::Value::Null,
                serde_json::Value::String(SERVED_BY_NODE_ADDRESSES.into()),
            ),
        };
        let has = |key: &str| {
            service
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(key))
        };
        let mut annotations = serde_json::Map::new();
        annotations.insert(IP_ALLOCATED_FROM_POOL.into(), pool);
        if has(DEPRECATED_POOL_ANNOTATION) {
            annotations.insert(DEPRECATED_POOL_ANNOTATION.into(), serde_json::Value::Null);
        }
        if !marker.is_null() || has(SERVED_BY_ANNOTATION) {
            annotations.insert(SERVED_BY_ANNOTATION.into(), marker);
        }
        let mut metadata = serde_json::json!({
            "annotations": annotations,
            "resourceVersion": service.metadata.resource_version,
        });
        if matches!(desired, Desired::NodeAddresses { .. }) && has_servicelb_finalizer(service) {
            // k3s ServiceLB's finalizer, left by a ServiceLB that is gone, would hold the
            // Service's deletion for ever. A merge patch replaces the whole list; the
            // resourceVersion precondition makes sure it is the list read.
            let kept: Vec<&String> = service
                .metadata
                .finalizers
                .iter()
                .flatten()
                .filter(|f| f.as_str() != SERVICELB_FINALIZER)
                .collect();
            metadata["finalizers"] = serde_json::json!(kept);
        }
        let written = api
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(&serde_json::json!({
                    "metadata": metadata,
                    "status": {"loadBalancer": {"ingress": ingress}},
                })),
            )
            .await
            .map_err(|e| WriteError::of(e, || format!("writing status of Service {ns}/{name}")))?;
        if !annotations_applied(&written, &annotations) {
            // Services' status subresource has always taken metadata (Kubernetes' own service
            // controller writes its finalizer that way), so this is an API server that drops it.
            return Err(WriteError::Other(anyhow::anyhow!(
                "the API server did not keep the pool annotation written with the status of Service {ns}/{name}"
            )));
        }
        tracing::info!(service = %format!("{ns}/{name}"), ?desired, "wrote Service");
        Ok(())
    }

    /// Queues an Event about `service`; the Event writer sends it without holding up writes.
    fn publish(&self, service: &Service, note: &Note) {
        self.events.push(events::Queued {
            warning: note.warning,
            reason: note.reason,
            message: note.message.clone(),
            action: "Allocate",
            regarding: service.object_ref(&()),
        });
    }
}

/// Why a Service write did not happen.
#[derive(Debug)]
enum WriteError {
    /// The Service changed since the copy the write was decided on.
    Conflict,
    /// Anything else, with what was being written.
    Other(anyhow::Error),
}

impl WriteError {
    fn of(error: kube::Error, what: impl FnOnce() -> String) -> Self {
        match error {
            kube::Error::Api(ref status) if status.code == 409 => Self::Conflict,
            e => Self::Other(anyhow::Error::new(e).context(what())),
        }
    }
}

/// Whether `service` carries the annotation changes of a merge patch (a string sets, null removes).
fn annotations_applied(
    service: &Service,
    patch: &serde_json::Map<String, serde_json::Value>,
) -> bool {
    let current = service.metadata.annotations.as_ref();
    patch.iter().all(|(key, value)| {
        let now = current.and_then(|a| a.get(key));
        match value {
            serde_json::Value::String(v) => now == Some(v),
            _ => now.is_none(),
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// A Service with nothing but `annotations` (no map at all for `None`): all the check reads.
    fn annotated(annotations: Option<&[(&str, &str)]>) -> Service {
        let mut service = Service::default();
        service.metadata.annotations = annotations.map(|a| {
            a.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        });
        service
    }

    #[test]
    fn annotations_applied_checks_sets_and_removals() {
        let patch = serde_json::json!({
            "metallb.io/ip-allocated-from-pool": "p",
            "metallb.universe.tf/ip-allocated-from-pool": null,
        });
        let patch = patch.as_object().unwrap();
        let ok = annotated(Some(&[
            ("metallb.io/ip-allocated-from-pool", "p"),
            ("x", "y"),
        ]));
        assert!(annotations_applied(&ok, patch));
        let ignored = annotated(Some(&[("metallb.universe.tf/ip-allocated-from-pool", "p")]));
        assert!(!annotations_applied(&ignored, patch));
        let other_pool = annotated(Some(&[("metallb.io/ip-allocated-from-pool", "q")]));
        assert!(!annotations_applied(&other_pool, patch));
        let clear = serde_json::json!({"metallb.io/ip-allocated-from-pool": null});
        let clear = clear.as_object().unwrap();
        assert!(annotations_applied(&annotated(None), clear));
        assert!(!annotations_applied(&ok, clear));
    }
}
