//! The layer 2 voter configuration (`--voters-object`; decision 0023, *Changing the voters*):
//! the leader chooses the speakers' voters, publishes them in a ConfigMap, replaces a voter
//! that is gone, and ends each change only once no voter serves the old generation. The rules
//! are `ferrolb_layer2::voters::steward`; this is their I/O.
//!
//! * **Eligible nodes**: a Node whose speaker is alive (`crate::presence`: its presence Lease
//!   seen renewed within the Lease's duration of the newest renewal seen, by this replica's own
//!   clock; a speaker's clock may be off, and a Lease first seen counts as renewed then): the
//!   speaker runs and reaches the API server. A Node NotReady
//!   whose speaker still runs can still vote. The failure domain is `topology.kubernetes.io/zone`, else
//!   `topology.kubernetes.io/region`, else none.
//! * **Fenced writes**: the configuration is written only while this replica leads with at
//!   least [`WRITE_MARGIN`] of its grant left, abandoned when the grant ends, and on the
//!   version read (409 if another leader wrote since); generations only grow.
//! * **A fresh steward per term**: what a new leader does not know (since when a voter has
//!   been gone, which voters moved on) it learns again; it starts no change sooner for it.
//! * **Fresh reads**: the configuration and every duty record are read with GETs, which the
//!   API server answers from etcd by quorum read, never from a watch cache that may lag.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrolb_layer2::voters::VoterConfig;
use ferrolb_layer2::voters::steward::{Candidate, DutyRead, Plan, Settings as Rules, Steward, Why};
use ferrolb_runtime::owner::OwnerCell;
use ferrolb_runtime::voters::{
    Record, config_object, config_of, record_name, record_object, record_of, timed,
};
use ferrolb_runtime::watch::{Continue, reflect};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, ListParams, PartialObjectMeta, PostParams};
use kube::runtime::reflector::Store;
use kube::runtime::watcher::{self, watcher};

use crate::leader::Leadership;
use crate::presence::Presence;
use crate::telemetry::Metrics;

/// A write starts only with this much of the grant left.
const WRITE_MARGIN: Duration = Duration::from_millis(500);
/// How often the leader looks again (each look reads the configuration afresh).
const EVERY: Duration = Duration::from_secs(1);

/// What the voters' task needs.
pub struct Settings {
    /// The speakers' namespace (where the object and the duty records live).
    pub namespace: String,
    /// The configuration's ConfigMap (`--voters-object`).
    pub object: String,
    /// The speakers' presence Lease group (`--presence-group`).
    pub presence_group: String,
    /// The steward's rules.
    pub rules: Rules,
}

/// Starts the task; it runs until the process ends.
pub fn spawn(
    client: kube::Client,
    settings: Settings,
    leadership: Leadership,
    owner: OwnerCell,
    metrics: Arc<Metrics>,
) {
    let nodes = Api::<PartialObjectMeta<Node>>::all(client.clone());
    let node_store = reflect(
        watcher(nodes, watcher::Config::default().page_size(500)),
        "nodes (voters)",
        crate::slim::name_and_labels,
        |_| -> Continue { true },
    );
    let leases: Api<Lease> = Api::namespaced(client.clone(), &settings.namespace);
    // Which speakers are alive, aged by this replica's own clock (a speaker's `renewTime` is its
    // wall clock, which may be off: issue 33).
    let presence = Presence::watch(
        &client,
        &settings.namespace,
        &settings.presence_group,
        |_| -> Continue { true },
    );
    let task = Task {
        configs: Api::namespaced(client, &settings.namespace),
        records: leases,
        settings,
        nodes: node_store,
        presence,
        owner,
        metrics,
    };
    tokio::spawn(task.run(leadership));
}

struct Task {
    configs: Api<ConfigMap>,
    records: Api<Lease>,
    settings: Settings,
    nodes: Store<PartialObjectMeta<Node>>,
    presence: Presence,
    owner: OwnerCell,
    metrics: Arc<Metrics>,
}

impl Task {
    async fn run(self, mut leadership: Leadership) {
        let _ = self.nodes.wait_until_ready().await;
        let _ = self.presence.wait_until_ready().await;
        let mut term = None;
        let mut steward = Steward::new(self.settings.rules);
        let mut wake = Instant::now();
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(wake.into()) => {}
                _ = leadership.changed() => {}
            }
            let now = Instant::now();
            wake = now + EVERY;
            let Some((t, _)) = leadership.grant() else {
                term = None;
                continue;
            };
            if term != Some(t) {
                term = Some(t);
                steward = Steward::new(self.settings.rules);
            }
            match self.step(&mut steward, &leadership).await {
                Ok(Some(at)) => wake = wake.min(at.max(now)),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(object = %self.settings.object, error = %e, "voter configuration")
                }
            }
        }
    }

    /// One look: reads the configuration, plans, and carries out the plan. Returns an earlier
    /// wake-up when the plan asks for one.
    async fn step(
        &self,
        steward: &mut Steward,
        leadership: &Leadership,
    ) -> anyhow::Result<Option<Instant>> {
        let (config, version) = match timed(self.configs.get_opt(&self.settings.object)).await? {
            Some(map) => {
                let config = config_of(&map)?;
                (Some(config), map.metadata.resource_version)
            }
            None => (None, None),
        };
        self.metrics.voters_generation.set(
            config
                .as_ref()
                .map_or(0, |c| i64::try_from(c.generation).unwrap_or(i64::MAX)),
        );
        self.metrics
            .voters_changing
            .set(i64::from(config.as_ref().is_some_and(VoterConfig::joint)));
        if config.is_none() && self.records_in_use().await? {
            // Generations only grow, and a new first configuration would share no voter with
            // the one the speakers still hold: recreating it could let two members act on
            // disjoint majorities. An operator restores it (or removes the duty records).
            anyhow::bail!(
                "the voter configuration is gone but voters' duty records remain: restore ConfigMap {}/{} with its last generation (kubectl ferrolb voters showed it), or delete the Leases labelled {} to start afresh",
                self.settings.namespace,
                self.settings.object,
                ferrolb_runtime::voters::record_selector(&self.settings.object)
            );
        }
        let candidates = self.candidates();
        let plan = steward.plan(config.as_ref(), &candidates, Instant::now())?;
        match plan {
            Plan::Idle => Ok(None),
            Plan::FinishAt(at) => Ok(Some(at)),
            Plan::Publish(next, why) => {
                self.publish(&next, version, why, config.as_ref(), leadership)
                    .await?;
                // Look again at once: a finished change may allow the next.
                Ok(Some(Instant::now()))
            }
            Plan::Read(voters) => {
                let Some(generation) = config.map(|c| c.generation) else {
                    return Ok(None);
                };
                for voter in voters {
                    let name = record_name(&self.settings.object, &voter);
                    let started = Instant::now();
                    let record = match timed(self.records.get_opt(&name)).await {
                        Ok(Some(lease)) => record_of(&lease),
                        Ok(None) => Record::default(),
                        Err(e) => {
                            tracing::debug!(voter, error = %e, "reading a voter's duty record");
                            continue;
                        }
                    };
                    steward.read(
                        generation,
                        &voter,
                        DutyRead {
                            version: record.version,
                            mark: record.mark,
                            fence: record.fence,
                            started,
                            done: Instant::now(),
                        },
                    );
                }
                Ok(None)
            }
            Plan::Fence {
                voter,
                version,
                generation,
            } => {
                let landed = self.fence(&voter, version, generation, leadership).await?;
                if landed {
                    tracing::info!(
                        voter,
                        generation,
                        "fenced a quiet voter: it cannot serve an older generation any more"
                    );
                }
                steward.fenced(generation, &voter, landed);
                Ok(Some(Instant::now()))
            }
        }
    }

    /// Whether any duty record holds a mark: the speakers have read a configuration.
    async fn records_in_use(&self) -> anyhow::Result<bool> {
        let selector = ferrolb_runtime::voters::record_selector(&self.settings.object);
        let records = timed(self.records.list(&ListParams::default().labels(&selector))).await?;
        Ok(records.items.iter().any(|l| record_of(l).mark.is_some()))
    }

    /// Every Node, eligible while its speaker's presence Lease is fresh.
    fn candidates(&self) -> Vec<Candidate> {
        let alive = self.presence.alive(Instant::now());
        let mut candidates: Vec<Candidate> = self
            .nodes
            .state()
            .iter()
            .filter_map(|n| {
                let name = n.metadata.name.clone()?;
                let labels = n.metadata.labels.as_ref();
                let label = |k: &str| labels.and_then(|l| l.get(k)).cloned();
                let domain = label("topology.kubernetes.io/zone")
                    .or_else(|| label("topology.kubernetes.io/region"))
                    .unwrap_or_default();
                Some(Candidate {
                    eligible: alive.contains(&name),
                    name,
                    domain,
                })
            })
            .collect();
        candidates.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        candidates
    }

    /// Writes `next` on `version` (creates it when there is none), within the grant.
    async fn publish(
        &self,
        next: &VoterConfig,
        version: Option<String>,
        why: Why,
        before: Option<&VoterConfig>,
        leadership: &Leadership,
    ) -> anyhow::Result<()> {
        let owner = self.owner.get();
        let map = config_object(
            &self.settings.object,
            &self.settings.namespace,
            next,
            version.clone(),
            owner.as_ref(),
        );
        let name = self.settings.object.clone();
        let configs = self.configs.clone();
        fenced(leadership, async move {
            match version {
                None => configs.create(&PostParams::default(), &map).await,
                Some(_) => configs.replace(&name, &PostParams::default(), &map).await,
            }
        })
        .await?;
        tracing::info!(
            object = %self.settings.object,
            generation = next.generation,
            current = %next.current.join(","),
            next = %next.next.join(","),
            why = ?why,
            before = ?before.map(|b| b.generation),
            "published the voter configuration"
        );
        Ok(())
    }

    /// Fences `voter`'s duty record for `generation` if it is still at `version`; whether the
    /// fence landed (false: the record changed, the voter wrote).
    async fn fence(
        &self,
        voter: &str,
        version: Option<String>,
        generation: u64,
        leadership: &Leadership,
    ) -> anyhow::Result<bool> {
        let name = record_name(&self.settings.object, voter);
        let current = match timed(self.records.get_opt(&name)).await? {
            Some(lease) => record_of(&lease),
            None => Record::default(),
        };
        if current.version != version {
            return Ok(false);
        }
        let record = Record {
            fence: current.fence.max(generation),
            ..current
        };
        let lease = record_object(
            &self.settings.object,
            &self.settings.namespace,
            voter,
            &record,
        );
        let records = self.records.clone();
        let written = fenced(leadership, async move {
            match record.version {
                None => records.create(&PostParams::default(), &lease).await,
                Some(_) => records.replace(&name, &PostParams::default(), &lease).await,
            }
        })
        .await;
        match written {
            Ok(_) => Ok(true),
            Err(e) if is_conflict(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// Runs `write` only while this replica leads with [`WRITE_MARGIN`] of its grant left, and
/// abandons it when the grant ends (decision 0016).
async fn fenced<T>(
    leadership: &Leadership,
    write: impl Future<Output = kube::Result<T>>,
) -> anyhow::Result<T> {
    let Some((_, until)) = leadership.grant() else {
        anyhow::bail!("not leading");
    };
    let now = Instant::now();
    anyhow::ensure!(
        until.saturating_duration_since(now) >= WRITE_MARGIN,
        "too little of the leadership grant left to write"
    );
    match tokio::time::timeout_at(until.into(), write).await {
        Ok(result) => Ok(result?),
        Err(_) => anyhow::bail!("abandoned: the leadership grant ended"),
    }
}

fn is_conflict(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<kube::Error>(),
        Some(kube::Error::Api(s)) if s.code == 409
    )
}
