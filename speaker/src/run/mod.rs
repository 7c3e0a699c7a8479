//! The speaker's I/O: watches, heartbeats, interfaces, the announcer and the status writer,
//! around the pure planning of the library.

mod announce;
mod bgp;
mod bgp_status;
mod gossip;
mod interfaces;
mod metrics;
mod status;
mod watch;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use ferrolb_config::allocator::ServiceKey;
use ferrolb_speaker::l2::interfaces::Interface;
use ferrolb_speaker::l2::plan::{self, Inputs, ServiceOutcome};
use ferrolb_speaker::view::{NodeView, ServiceView, slice_service};
use kube::runtime::events::{Recorder, Reporter};
use tokio::sync::Notify;

use crate::Args;
use metrics::Metrics;

/// How often interfaces are read.
const INTERFACE_POLL: Duration = Duration::from_millis(100);
/// How long a clean shutdown keeps answering after telling the others it leaves, so they have
/// taken over before this node goes quiet.
const HANDOVER: Duration = Duration::from_millis(300);

/// Runs the speaker until SIGTERM or SIGINT.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let key = std::fs::read(&args.gossip_key_file)
        .with_context(|| format!("reading the gossip key {}", args.gossip_key_file.display()))?;
    let key: Vec<u8> = trim_key(key);
    anyhow::ensure!(
        key.len() >= 16,
        "the gossip key in {} is shorter than 16 bytes",
        args.gossip_key_file.display()
    );
    let client = ferrolb_runtime::kube_client(args.kubeconfig.as_deref()).await?;
    let (metrics, registry) = Metrics::new();
    let ready = ferrolb_runtime::Ready::default();
    let server = tokio::spawn(ferrolb_runtime::serve(
        args.listen,
        Arc::new(registry),
        ready.clone(),
        "caches not synced",
    ));
    let changed = Arc::new(Notify::new());
    let stores = watch::start(&client, &args.namespace, changed.clone());
    let gossip = gossip::Gossip::start(
        args.node_name.clone(),
        key,
        args.gossip_port,
        args.heartbeat_interval,
        args.failure_timeout,
        changed.clone(),
        metrics.clone(),
    )
    .await?;
    let links = Arc::new(std::sync::Mutex::new(interfaces::read()));
    tokio::spawn(poll_interfaces(links.clone(), changed.clone()));
    let (status_tx, status_task) = status::spawn(
        client.clone(),
        args.namespace.clone(),
        args.node_name.clone(),
    );
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "ferrolb-speaker".into(),
            instance: Some(args.node_name.clone()),
        },
    );
    tracing::info!(node = %args.node_name, namespace = %args.namespace, "ferrolb-speaker starting");

    let mut speaker = Speaker {
        announcer: announce::Announcer::new(metrics.clone(), args.garp_refresh),
        config: None,
        settled_at: None,
        announced: BTreeMap::new(),
        reported_failures: BTreeSet::new(),
        bgp: bgp::Bgp::new(
            metrics.clone(),
            client.clone(),
            args.namespace.clone(),
            args.node_name.clone(),
            &args.bgp_listen,
        ),
        metrics,
        args,
    };
    let shutdown = ferrolb_runtime::shutdown_signal();
    tokio::pin!(shutdown);
    let mut server = server;
    loop {
        let now = Instant::now();
        let wake = [
            gossip.next_expiry(now),
            speaker.settled_at.filter(|t| *t > now),
        ]
        .into_iter()
        .flatten()
        .min()
        .map(|t| t + Duration::from_millis(1));
        let sleep = async {
            match wake {
                Some(t) => tokio::time::sleep_until(t.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = changed.notified() => {}
            _ = sleep => {}
            signal = &mut shutdown => {
                tracing::info!("{}: handing over and shutting down", signal.unwrap_or("signal"));
                break;
            }
            r = &mut server => return Err(anyhow::anyhow!("metrics server stopped: {r:?}")),
        }
        if !stores.synced() {
            continue;
        }
        ready.set(true);
        let links = links.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let desired = speaker.step(&stores, &gossip, &links, &recorder).await;
        status_tx.send_replace(desired);
    }
    // Clean shutdown: the others take over at once; keep answering until they have.
    gossip.leave().await;
    tokio::time::sleep(HANDOVER).await;
    speaker.announcer.apply(&BTreeMap::new(), &BTreeMap::new());
    speaker.bgp.shutdown().await;
    status_tx.send_replace(status::Desired::new());
    drop(status_tx);
    let _ = tokio::time::timeout(Duration::from_secs(5), status_task).await;
    Ok(())
}

/// A key file may end in a newline (`kubectl create secret --from-file` keeps it).
fn trim_key(mut key: Vec<u8>) -> Vec<u8> {
    while key.last().is_some_and(|b| b.is_ascii_whitespace()) {
        key.pop();
    }
    key
}

async fn poll_interfaces(
    links: Arc<std::sync::Mutex<BTreeMap<String, Interface>>>,
    changed: Arc<Notify>,
) {
    let mut tick = tokio::time::interval(INTERFACE_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = interfaces::read();
        let mut current = links.lock().unwrap_or_else(|p| p.into_inner());
        if *current != now {
            *current = now;
            changed.notify_one();
        }
    }
}

/// The work loop's state.
struct Speaker {
    args: Args,
    announcer: announce::Announcer,
    /// The configuration, recomputed when a configuration object changes.
    config: Option<Arc<ferrolb_config::model::Config>>,
    /// When this speaker may own IPs: a failure timeout after it became able to, so it has
    /// heard the others first (otherwise a starting or reconnected node would grab every IP).
    settled_at: Option<Instant>,
    /// `metallb_speaker_announced` label sets currently set.
    announced: BTreeMap<(ServiceKey, IpAddr), ()>,
    reported_failures: BTreeSet<(String, String)>,
    /// BGP sessions and their routes.
    bgp: bgp::Bgp,
    metrics: Metrics,
}

impl Speaker {
    async fn step(
        &mut self,
        stores: &watch::Stores,
        gossip: &gossip::Gossip,
        links: &BTreeMap<String, Interface>,
        recorder: &Recorder,
    ) -> status::Desired {
        let now = Instant::now();
        if stores.take_config_dirty() || self.config.is_none() {
            let validated = stores.validated(&self.args.namespace);
            self.metrics.config_loaded.set(1);
            self.metrics
                .config_stale
                .set(i64::from(!validated.is_valid()));
            self.config = Some(Arc::new(validated.config));
        }
        let config = self.config.clone().unwrap_or_default();
        let usable: BTreeMap<String, Interface> = links
            .iter()
            .filter(|(_, i)| i.usable(&self.args.ignore_interfaces))
            .map(|(n, i)| (n.clone(), i.clone()))
            .collect();
        let able = !usable.is_empty();
        match (able, self.settled_at) {
            (true, None) => self.settled_at = Some(now + self.args.failure_timeout),
            (false, Some(_)) => self.settled_at = None,
            _ => {}
        }
        let ready = self.settled_at.is_some_and(|t| now >= t);
        gossip
            .set_local(ready, usable.keys().cloned().collect())
            .await;

        let nodes: BTreeMap<String, NodeView> = stores
            .nodes
            .state()
            .iter()
            .map(|n| NodeView::from_node(n))
            .map(|v| (v.name.clone(), v))
            .collect();
        gossip.set_peers(
            nodes
                .values()
                .filter(|n| n.name != self.args.node_name)
                .filter_map(|n| n.addresses.first().copied()),
        );
        let mut members = gossip.alive(now);
        self.metrics
            .peers_alive
            .set(i64::try_from(members.len()).unwrap_or(i64::MAX));
        if ready {
            members.insert(
                self.args.node_name.clone(),
                ferrolb_layer2::liveness::Member {
                    interfaces: usable.keys().cloned().collect(),
                },
            );
        }

        let mut slices: HashMap<ServiceKey, Vec<_>> = HashMap::new();
        for slice in stores.slices.state() {
            if let Some(key) = slice_service(&slice) {
                slices.entry(key).or_default().push(slice);
            }
        }
        let mut uids: HashMap<ServiceKey, Option<String>> = HashMap::new();
        let views: Vec<ServiceView> = stores
            .services
            .state()
            .iter()
            .filter_map(|svc| {
                let key = ServiceKey::new(
                    svc.metadata.namespace.as_deref().unwrap_or_default(),
                    svc.metadata.name.as_deref().unwrap_or_default(),
                );
                let own = slices.get(&key).map(Vec::as_slice).unwrap_or_default();
                let view = ServiceView::from_service(
                    svc,
                    own.iter().map(|s| &**s),
                    self.args.lb_class.as_deref(),
                )?;
                uids.insert(key, svc.metadata.uid.clone());
                Some(view)
            })
            .collect();
        let plan = plan::plan(
            Inputs {
                config: &config,
                nodes: &nodes,
                members: &members,
                me: &self.args.node_name,
            },
            &views,
        );

        if ready {
            self.bgp
                .sweep_departed(&self.args.node_name, &nodes, members.keys());
        }
        // BGP: every eligible node advertises (ECMP), independent of the layer 2 owner choice.
        let bgp_plan = self
            .bgp
            .apply(&config, &nodes, &self.args.node_name, &views, |name| {
                stores.secrets.get(
                    &kube::runtime::reflector::ObjectRef::new(name).within(&self.args.namespace),
                )
            });

        let failures = self.announcer.apply(&plan.announce, &usable);
        for f in failures {
            tracing::warn!(interface = %f.interface, error = %f.error, "cannot announce");
            for a in plan
                .announce
                .values()
                .filter(|a| a.interfaces.contains(&f.interface))
            {
                for key in &a.services {
                    if self
                        .reported_failures
                        .insert((key.to_string(), f.interface.clone()))
                    {
                        status::announce_failed(
                            recorder,
                            key,
                            uids.get(key).cloned().flatten(),
                            format!("cannot announce on interface {}: {}", f.interface, f.error),
                        )
                        .await;
                    }
                }
            }
        }

        // Metrics and status: what this node announces, by Service.
        let mut desired = status::Desired::new();
        let mut announced = BTreeMap::new();
        for (ip, a) in &plan.announce {
            for key in &a.services {
                announced.insert((key.clone(), *ip), ());
                let entry = desired.entry(key.clone()).or_insert_with(|| status::Owned {
                    uid: uids.get(key).cloned().flatten(),
                    interfaces: Vec::new(),
                });
                for i in &a.interfaces {
                    if !entry.interfaces.contains(i) {
                        entry.interfaces.push(i.clone());
                    }
                }
            }
        }
        for (key, ip) in self.announced.keys() {
            if !announced.contains_key(&(key.clone(), *ip)) {
                self.metrics
                    .announced
                    .remove(&self.announced_labels(key, *ip));
            }
        }
        for (key, ip) in announced.keys() {
            self.metrics
                .announced
                .get_or_create(&self.announced_labels(key, *ip))
                .set(1);
        }
        self.announced = announced;
        let unannounced = plan
            .services
            .values()
            .filter(|o| matches!(o, ServiceOutcome::Unannounced(_)))
            .count();
        tracing::debug!(
            services = plan.services.len(),
            unannounced,
            owned = plan.announce.len(),
            bgp_services = bgp_plan.services.len(),
            members = members.len(),
            "planned"
        );
        desired
    }

    fn announced_labels(&self, key: &ServiceKey, ip: IpAddr) -> metrics::AnnouncedLabels {
        vec![
            ("service", key.to_string()),
            ("protocol", "layer2".to_string()),
            ("node", self.args.node_name.clone()),
            ("ip", ip.to_string()),
        ]
    }
}
