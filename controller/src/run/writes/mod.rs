//! The writes: the [`Writes`] trait the work loop carries its actions out through, and
//! [`ApiWrites`], its implementation against the API server. One Service's fenced write is in
//! [`service`]; the report of a configuration (ConfigurationState, Events, BFDProfile
//! finalizers) in [`report`]; pool counters here.

mod report;
mod service;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use ferrolb_config::crd::{ConfigurationResult, IPAddressPool, IPAddressPoolStatus};
use ferrolb_runtime::events::{EventQueue, Recorder};
use ferrolb_runtime::owner::OwnerCell;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};

use super::decide::{ConfigReport, ServiceWrite};
use crate::leader::Leadership;
use crate::telemetry::Metrics;
use service::Writer;

/// What became of one Service's writes.
pub(super) enum Applied {
    /// Written (or nothing differed), Events recorded.
    Done,
    /// Not written: this replica's leadership (in the term the write was decided in) had lapsed,
    /// or too little of it was left to finish the write.
    NotLeading,
    /// Refused by the API server: the Service changed since the copy the write was decided on
    /// (its resourceVersion precondition failed). Decided again on the newer copy.
    Stale,
}

/// One Service's write in flight.
pub(super) type WriteFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<Applied>> + Send>>;

/// The controller's writes to the API server, behind a trait so that the loop can be driven
/// without one.
pub(super) trait Writes {
    /// Starts one Service's write (it runs while the loop goes on).
    fn write_service(&self, write: ServiceWrite) -> WriteFuture;
    /// A new term: what was written before may have been overwritten by another leader.
    fn new_term(&mut self);
    /// Writes ConfigurationState `controller`, Events on left-out objects and BFDProfile
    /// finalizers, where they changed.
    async fn report_config(&mut self, report: &ConfigReport);
    /// Writes pool counters to IPAddressPool status (and metrics) where they changed.
    async fn write_pool_status(&mut self, counters: Vec<(String, IPAddressPoolStatus)>);
}

/// The writes, to the API server.
pub(super) struct ApiWrites {
    writer: Writer,
    namespace: String,
    /// For configuration errors, whose reporting is remembered only once written.
    recorder: Arc<Recorder>,
    /// Owner of ConfigurationState `controller`.
    owner: OwnerCell,
    /// The owner (UID) this run has set on ConfigurationState `controller`, or was refused.
    state_owner: Option<String>,
    written_state: Option<(ConfigurationResult, String)>,
    written_pool_status: HashMap<String, IPAddressPoolStatus>,
    reported_errors: BTreeSet<String>,
}

impl ApiWrites {
    /// Writes to the configuration objects of `namespace` as `identity` (the Events' reporter),
    /// while `leadership` lasts; starts the queue that writes Services' Events.
    pub(super) fn new(
        client: Client,
        namespace: String,
        identity: &str,
        owner: OwnerCell,
        leadership: Leadership,
        metrics: Arc<Metrics>,
    ) -> Self {
        let recorder = Arc::new(Recorder::new(
            client.clone(),
            "ferrolb-controller",
            identity,
        ));
        let events = EventQueue::spawn(
            Arc::clone(&recorder),
            leadership.clone(),
            metrics.events_dropped.clone(),
        );
        Self {
            writer: Writer {
                client,
                leadership,
                metrics,
                events,
            },
            namespace,
            recorder,
            owner,
            state_owner: None,
            written_state: None,
            written_pool_status: HashMap::new(),
            reported_errors: BTreeSet::new(),
        }
    }
}

impl Writes for ApiWrites {
    fn write_service(&self, write: ServiceWrite) -> WriteFuture {
        let writer = self.writer.clone();
        Box::pin(async move {
            writer
                .apply(&write.service.to_service(), &write.outcome, write.term)
                .await
        })
    }

    fn new_term(&mut self) {
        self.written_state = None;
        self.written_pool_status.clear();
    }

    async fn report_config(&mut self, report: &ConfigReport) {
        self.report_state(&report.validated).await;
        self.protect_bfd_profiles(&report.peers, &report.bfd_profiles)
            .await;
    }

    async fn write_pool_status(&mut self, counters: Vec<(String, IPAddressPoolStatus)>) {
        let api: Api<IPAddressPool> = Api::namespaced(self.writer.client.clone(), &self.namespace);
        let metrics = &self.writer.metrics;
        for (name, status) in counters {
            let label = vec![("pool", name.clone())];
            metrics
                .addresses_in_use
                .get_or_create(&label)
                .set(status.assigned_ipv4.saturating_add(status.assigned_ipv6));
            metrics
                .ipv4_in_use
                .get_or_create(&label)
                .set(status.assigned_ipv4);
            metrics
                .ipv6_in_use
                .get_or_create(&label)
                .set(status.assigned_ipv6);
            if self.written_pool_status.get(&name) == Some(&status)
                || !self.writer.leadership.is_leading()
            {
                continue;
            }
            let patch = serde_json::json!({"status": status});
            match api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.written_pool_status.insert(name, status);
                }
                Err(e) => {
                    tracing::warn!(pool = %name, error = %e, "writing IPAddressPool status failed")
                }
            }
        }
    }
}
