//! The controller's voter configuration (`--voters-object`; decision 0023, *Changing the
//! voters*): every speaker watches the one ConfigMap and its member adopts each newer
//! configuration; a voter node also runs the duty loop (`ferrolb_layer2::voters::duty`).
//!
//! The duty loop runs while the node is a voter of the newest configuration read or holds a
//! seat that has not retired, once a [`DUTY_EVERY`] and at once when the watch delivers a newer
//! configuration (so the voters move together): it reads the configuration afresh (a
//! quorum read: a GET without a resourceVersion), works out what the read means for the seat,
//! writes the node's duty record on the version it last saw, and only once that write has
//! landed acts on the read (start, move, retire or drop the seat; confirm its configuration as
//! of the read's start). A write refused (409: the controller fenced the record, or another
//! process of this node wrote it) sends the loop back to reading the record. A voter whose
//! reads or writes fail confirms nothing and falls silent after the confirmation window.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrolb_layer2::voters::duty::Planned;
use ferrolb_runtime::voters::{Record, config_of, record_name, record_object, record_of, timed};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube::runtime::watcher::{self, watcher};

use crate::l2::gossip::Gossip;

/// How often a voter node reads the configuration afresh and writes its duty record.
pub const DUTY_EVERY: Duration = Duration::from_secs(1);

/// Where the voter configuration and this node's duty record are.
#[derive(Clone)]
pub struct Object {
    configs: Api<ConfigMap>,
    records: Api<Lease>,
    namespace: String,
    name: String,
    node: String,
}

impl Object {
    /// The configuration `name` in `namespace`, as node `node` reads it.
    pub fn new(client: &kube::Client, namespace: &str, name: &str, node: &str) -> Self {
        Object {
            configs: Api::namespaced(client.clone(), namespace),
            records: Api::namespaced(client.clone(), namespace),
            namespace: namespace.to_string(),
            name: name.to_string(),
            node: node.to_string(),
        }
    }

    /// Starts the watch and the duty loop; both end with the process.
    pub fn start(self, gossip: Arc<Gossip>) {
        tokio::spawn(self.clone().watch(gossip.clone()));
        tokio::spawn(self.duty(gossip));
    }

    /// Hands every configuration the watch delivers to the member.
    async fn watch(self, gossip: Arc<Gossip>) {
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.name));
        let mut events = std::pin::pin!(watcher(self.configs.clone(), config));
        while let Some(event) = events.next().await {
            let map = match event {
                Ok(watcher::Event::Apply(map) | watcher::Event::InitApply(map)) => map,
                Ok(_) => continue,
                Err(e) => {
                    tracing::warn!(object = %self.name, error = %e, "watching the voter configuration");
                    continue;
                }
            };
            match config_of(&map) {
                Ok(config) => {
                    if let Some(link) = gossip.voters() {
                        link.adopt(config);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "ignoring the voter configuration"),
            }
        }
    }

    /// The duty loop.
    async fn duty(self, gossip: Arc<Gossip>) {
        let Some(link) = gossip.voters() else {
            return;
        };
        let mut tick = tokio::time::interval(DUTY_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The duty record as last read or written; `None`: read it first.
        let mut record: Option<Record> = None;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = link.newer_config() => {}
            }
            if !link.on_duty(Instant::now()) {
                continue;
            }
            let started = Instant::now();
            let config = match timed(self.configs.get_opt(&self.name)).await {
                Ok(Some(map)) => match config_of(&map) {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "voter duty: the configuration is unreadable");
                        continue;
                    }
                },
                Ok(None) => continue,
                Err(e) => {
                    tracing::debug!(error = %e, "voter duty: reading the configuration failed");
                    continue;
                }
            };
            let current = match record.clone() {
                Some(r) => r,
                None => {
                    let name = record_name(&self.name, &self.node);
                    match timed(self.records.get_opt(&name)).await {
                        Ok(Some(lease)) => record_of(&lease),
                        Ok(None) => Record::default(),
                        Err(e) => {
                            tracing::debug!(error = %e, "voter duty: reading the duty record failed");
                            continue;
                        }
                    }
                }
            };
            let Planned::Write {
                mark,
                action,
                confirm,
            } = link.duty_plan(&config, current.mark, current.fence, Instant::now())
            else {
                record = Some(current);
                continue;
            };
            let wanted = Record {
                mark: Some(mark),
                ..current.clone()
            };
            match self.write(&wanted).await {
                Ok(version) => {
                    record = Some(Record {
                        version: Some(version),
                        ..wanted
                    });
                    link.duty_apply(config, action, confirm, started);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "voter duty: writing the duty record failed");
                    record = None;
                }
            }
        }
    }

    /// Writes the duty record on its version (creates it when it has none); returns the new
    /// version.
    async fn write(&self, record: &Record) -> anyhow::Result<String> {
        let lease = record_object(&self.name, &self.namespace, &self.node, record);
        let written = match record.version.as_deref() {
            None => timed(self.records.create(&PostParams::default(), &lease)).await?,
            Some(_) => {
                let name = record_name(&self.name, &self.node);
                timed(self.records.replace(&name, &PostParams::default(), &lease)).await?
            }
        };
        written
            .metadata
            .resource_version
            .ok_or_else(|| anyhow::anyhow!("the written duty record has no resourceVersion"))
    }
}
