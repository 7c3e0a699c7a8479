//! The speaker's I/O: watches, heartbeats, interfaces, the announcer and the status writer,
//! around the pure planning of the library.

mod announce;
mod bgp;
mod bgp_status;
mod gossip;
mod interfaces;
mod keys;
mod metrics;
mod presence;
pub mod restart;
mod status;
mod status_objects;
mod watch;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrolb_config::allocator::ServiceKey;
use ferrolb_layer2::liveness::Member;
use ferrolb_runtime::events::{Always, EventQueue, Recorder};
use ferrolb_speaker::l2::interfaces::Interface;
use ferrolb_speaker::l2::plan::{self, Inputs, ServiceOutcome};
use ferrolb_speaker::l2::presence::known as known_speakers;
use ferrolb_speaker::l2::{gate, readiness, step};
use ferrolb_speaker::view::NodeView;
use tokio::sync::Notify;

use crate::Args;
use metrics::Metrics;

/// How often interfaces are read.
const INTERFACE_POLL: Duration = Duration::from_millis(100);

/// Runs the speaker until SIGTERM or SIGINT.
pub async fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        ferrolb_speaker::l2::presence::valid_group(&args.presence_group),
        "--presence-group {:?}: must be at most 63 lowercase letters, digits, '-' or '.', starting and ending with a letter or digit",
        args.presence_group
    );
    // At start a missing or short key is fatal; later changes that break it keep the last good
    // keys instead (keys.rs).
    let key_files = keys::KeyFiles {
        key: args.gossip_key_file.clone(),
        next: args.gossip_next_key_file.clone(),
    };
    let key_ring = key_files.read()?;
    let client = ferrolb_runtime::kube_client(args.kubeconfig.as_deref()).await?;
    let (metrics, registry) = Metrics::new();
    let ready = ferrolb_runtime::Ready::default();
    // The loop wakes at least every heartbeat interval; silent for this long, it is stuck.
    let pulse = ferrolb_runtime::health::Pulse::new(Duration::from_secs(10));
    let listen = args.listen_ip.map_or(args.listen, |ip| {
        std::net::SocketAddr::new(ip, args.listen.port())
    });
    let server = tokio::spawn(ferrolb_runtime::serve(
        listen,
        Arc::new(registry),
        ready.clone(),
        "caches not synced",
        pulse.clone(),
        args.metrics_tls.files()?,
    ));
    let changed = Arc::new(Notify::new());
    let stores = watch::start(
        &client,
        &args.namespace,
        &args.presence_group,
        changed.clone(),
    );
    let gossip = gossip::Gossip::start(
        args.node_name.clone(),
        key_ring,
        args.gossip_port,
        gossip::Timing {
            interval: args.heartbeat_interval,
            timeout: args.failure_timeout,
            confirm_within: mandate_for(args.failure_timeout, args.heartbeat_interval),
            restart_hold: args.restart_hold,
        },
        changed.clone(),
        metrics.clone(),
    )
    .await?;
    tokio::spawn(keys::keep_reloading(
        key_files,
        gossip.clone(),
        metrics.clone(),
    ));
    let presence = |c: &kube::Client| {
        presence::Presence::new(c, &args.namespace, &args.presence_group, &args.node_name)
    };
    let renewing = tokio::spawn(presence(&client).keep(metrics.clone()));
    let presence = presence(&client);
    let links = Arc::new(std::sync::Mutex::new(interfaces::read()));
    tokio::spawn(poll_interfaces(links.clone(), changed.clone()));
    // One bounded queue for every Event the speaker records: the loop never waits for one.
    let events = EventQueue::spawn(
        Arc::new(Recorder::new(
            client.clone(),
            "ferrolb-speaker",
            &args.node_name,
        )),
        Always,
        metrics.events_dropped.clone(),
    );
    let (status_tx, status_task) = status_objects::spawn::<status::Layer2>(
        client.clone(),
        args.namespace.clone(),
        args.node_name.clone(),
        events.clone(),
    );
    tracing::info!(node = %args.node_name, namespace = %args.namespace, "ferrolb-speaker starting");

    let mut speaker = Speaker {
        announcer: announce::Announcer::new(metrics.clone(), args.garp_refresh),
        config: None,
        gate: gate::Gate::new(gate::Timing {
            heartbeat_interval: args.heartbeat_interval,
            failure_timeout: args.failure_timeout,
            mandate: mandate_for(args.failure_timeout, args.heartbeat_interval),
            flap_damping: args.flap_damping,
        }),
        tenure_lapsed: false,
        layer2: readiness::Layer2State::default(),
        announces: true,
        acted: false,
        planned_members: BTreeMap::new(),
        announced: BTreeSet::new(),
        failures: step::FailureLog::default(),
        bgp: bgp::Bgp::new(
            metrics.clone(),
            client.clone(),
            args.namespace.clone(),
            args.node_name.clone(),
            &args.bgp_listen,
            events.clone(),
        ),
        metrics,
        args,
    };
    let shutdown = ferrolb_runtime::shutdown_signal();
    tokio::pin!(shutdown);
    let mut server = server;
    loop {
        let now = Instant::now();
        let wake = [gossip.next_silence(now), speaker.gate.wake_at(now)]
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
        // Between steps, the mandate to answer is renewed every heartbeat interval while the
        // plan still holds.
        let check = tokio::time::sleep(speaker.args.heartbeat_interval);
        pulse.beat();
        tokio::select! {
            _ = changed.notified() => gossip.tell_changes().await,
            _ = sleep => gossip.tell_changes().await,
            _ = check => {
                if stores.synced() {
                    let links = links.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    let valid = speaker.still_valid(&stores, &gossip, &links).await;
                    ready.set_result(speaker.readiness());
                    if valid {
                        continue;
                    }
                }
            }
            signal = &mut shutdown => {
                tracing::info!("{}: handing over and shutting down", signal.unwrap_or("signal"));
                break;
            }
            r = &mut server => return Err(anyhow::anyhow!("metrics server stopped: {r:?}")),
        }
        if !stores.synced() {
            continue;
        }
        let links = links.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let desired = speaker.step(&stores, &gossip, &links, &events).await;
        ready.set_result(speaker.readiness());
        status_tx.send_replace(desired);
    }
    // Clean shutdown: stop answering, then say so; the others take over at once (within a
    // few milliseconds). Answering until they have would be two owners for that moment. When
    // this speaker is being replaced (a rolling update), it asks them instead to keep its IPs
    // with this node for the restart hold: its successor takes them up, and the connections
    // kube-proxy tracks here survive. Its presence Lease and status objects stay for the
    // successor.
    let replaced = !speaker.args.restart_hold.is_zero()
        && restart::is_replacement(
            &client,
            &speaker.args.namespace,
            speaker.args.pod_name.as_deref(),
            speaker.args.restart_hold_when,
        )
        .await;
    speaker.announcer.apply(&BTreeMap::new(), &BTreeMap::new());
    gossip.leave(replaced).await;
    renewing.abort();
    if replaced {
        tracing::info!(hold = ?speaker.args.restart_hold, "being replaced: the other speakers keep this node's IPs for its successor");
    } else {
        presence.remove().await;
    }
    speaker.bgp.shutdown().await;
    if !replaced {
        status_tx.send_replace(status::Desired::new());
    }
    drop(status_tx);
    let _ = tokio::time::timeout(Duration::from_secs(5), status_task).await;
    Ok(())
}

/// How long answering stays allowed after a check (`gate::Timing::mandate`): the failure
/// timeout minus two heartbeat intervals, at least one interval.
fn mandate_for(failure_timeout: Duration, heartbeat_interval: Duration) -> Duration {
    failure_timeout
        .saturating_sub(heartbeat_interval * 2)
        .max(heartbeat_interval)
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

/// Who may own IPs, from [`Speaker::membership`].
struct Membership {
    usable: BTreeMap<String, Interface>,
    nodes: BTreeMap<String, NodeView>,
    members: BTreeMap<String, Member>,
    claims: bool,
    /// Until when this node may answer for what it owns: the mandate after this check, cut
    /// short by the tenure (`ferrolb_layer2::tenure`); `None`: not at all now.
    answer_until: Option<Instant>,
}

/// The work loop's state.
struct Speaker {
    args: Args,
    announcer: announce::Announcer,
    /// The configuration, recomputed when a configuration object changes.
    config: Option<Arc<ferrolb_config::model::Config>>,
    /// Who may own IPs, and until when this node may answer (ferrolb_speaker::l2::gate).
    gate: gate::Gate,
    /// Whether the last check claimed with a lapsed tenure (to log the changes).
    tenure_lapsed: bool,
    /// What the last membership check found, for `/readyz` (and to log changes).
    layer2: readiness::Layer2State,
    /// Whether an L2Advertisement selects this node, as of the last membership check.
    announces: bool,
    /// Whether the last step acted (for logging the changes).
    acted: bool,
    /// The members the last plan was made with.
    planned_members: BTreeMap<String, Member>,
    /// `metallb_speaker_announced` label sets currently set.
    announced: BTreeSet<(ServiceKey, IpAddr)>,
    /// Announcement failures already reported with an Event.
    failures: step::FailureLog,
    /// BGP sessions and their routes.
    bgp: bgp::Bgp,
    metrics: Metrics,
}

impl Speaker {
    /// Who may own IPs now (the quorum rule, settling and the claim delay), and the inputs
    /// that go with it. Cheap: no planning.
    async fn membership(
        &mut self,
        stores: &watch::Stores,
        gossip: &gossip::Gossip,
        links: &BTreeMap<String, Interface>,
        now: Instant,
    ) -> Membership {
        let usable: BTreeMap<String, Interface> = links
            .iter()
            .filter(|(_, i)| i.usable(&self.args.ignore_interfaces))
            .map(|(n, i)| (n.clone(), i.clone()))
            .collect();
        let usable_names: BTreeSet<String> = usable.keys().cloned().collect();

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
        // Heartbeat state is kept for Nodes only: a deleted Node's entry goes, and junk names
        // cannot grow the table (ferrolb_layer2::liveness::Membership::set_nodes).
        gossip.set_nodes(nodes.keys().cloned().collect());
        // Who may own IPs, this node included, and until when it may answer: the gate's rules
        // (ferrolb_speaker::l2::gate), from the known speakers, the heartbeat table and the
        // acknowledgements (one read serves the tenure and the claim rule).
        let known = known_speakers(&stores.presence.state());
        let reports = gossip.reports(now);
        let acks = gossip.acks();
        let tenure = gossip.tenure(&known, &acks);
        let o = self.gate.check(
            gate::Inputs {
                me: &self.args.node_name,
                known: &known,
                reports: &reports,
                acks: &acks,
                tenure,
                usable: &usable_names,
            },
            now,
        );
        if o.starved {
            tracing::warn!(
                "this node's heartbeats reach the other speakers too late to prove it is heard: handing its layer 2 IPs over"
            );
        }
        if o.held_until.is_some() != self.layer2.held {
            match o.held_until {
                Some(until) => tracing::warn!(
                    hold = ?until.saturating_duration_since(now),
                    "quorum regained after a loss: holding back from owning layer 2 IPs for a while (flap damping)"
                ),
                None => tracing::info!("flap damping over: this node may own layer 2 IPs again"),
            }
        }
        self.metrics.damped.set(i64::from(o.held_until.is_some()));
        if self.gate.waiting_to_claim() {
            tracing::debug!("waiting for every candidate to hear this node ready before claiming");
        }
        if o.acts != self.acted {
            if o.acts {
                tracing::info!(
                    known = known.len(),
                    heard = reports.len(),
                    "quorum: this node may own layer 2 IPs"
                );
            } else if o.state.settled {
                tracing::warn!(
                    known = known.len(),
                    heard = reports.len(),
                    quorum = o.verdict.quorum,
                    heard_by_majority = o.verdict.up,
                    "no quorum: this node gives up its layer 2 IPs until it hears, and is heard by, a majority of the known speakers"
                );
            }
            self.acted = o.acts;
        }
        gossip.set_local(o.acts, usable_names.clone()).await;
        self.metrics.quorum.set(i64::from(o.verdict.acts()));
        self.metrics
            .speakers_known
            .set(i64::try_from(known.len()).unwrap_or(i64::MAX));
        self.metrics
            .peers_alive
            .set(i64::try_from(reports.len()).unwrap_or(i64::MAX));
        if o.tenure_lapsed() {
            self.metrics.tenure_lapsed.inc();
        }
        if o.tenure_lapsed() != self.tenure_lapsed {
            if o.tenure_lapsed() {
                // Debug: under lossy heartbeats this changes many times a second; the metric
                // counts it.
                tracing::debug!(
                    "tenure lapsed: not answering for this node's layer 2 IPs until the other speakers' acknowledgements of its heartbeats catch up"
                );
            } else {
                tracing::debug!("tenure back: answering for this node's layer 2 IPs again");
            }
            self.tenure_lapsed = o.tenure_lapsed();
        }
        self.layer2 = o.state;
        // Before the first configuration is read, count layer 2 as announcing here: the doubt
        // goes the way that keeps a rolling update waiting.
        self.announces = self.config.as_ref().is_none_or(|config| {
            readiness::announces_here(config, nodes.get(&self.args.node_name))
        });
        let (members, claims, answer_until) = (o.members, o.claims, o.answer_until);
        Membership {
            usable,
            nodes,
            members,
            claims,
            answer_until,
        }
    }

    /// What `/readyz` says now (ferrolb_speaker::l2::readiness); called once the caches are
    /// synced.
    fn readiness(&self) -> Result<(), &'static str> {
        readiness::readiness(true, self.announces, self.layer2)
    }

    /// The periodic check between steps: when the members are still those the last plan was
    /// made with, renews the mandate to answer (see [`announce::Mandate`]) and returns false;
    /// otherwise returns true, and the loop plans again.
    async fn still_valid(
        &mut self,
        stores: &watch::Stores,
        gossip: &gossip::Gossip,
        links: &BTreeMap<String, Interface>,
    ) -> bool {
        let now = Instant::now();
        let m = self.membership(stores, gossip, links, now).await;
        if m.members != self.planned_members {
            return false;
        }
        if m.claims {
            self.announcer.renew(m.answer_until.unwrap_or(now));
        }
        true
    }

    async fn step(
        &mut self,
        stores: &watch::Stores,
        gossip: &gossip::Gossip,
        links: &BTreeMap<String, Interface>,
        events: &EventQueue,
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
        let Membership {
            usable,
            nodes,
            members,
            claims,
            answer_until,
        } = self.membership(stores, gossip, links, now).await;
        let step::Views {
            services: views,
            uids,
        } = step::views(
            &stores.services.state(),
            &stores.slices.state(),
            self.args.lb_class.as_deref(),
        );
        let plan = plan::plan(
            Inputs {
                config: &config,
                nodes: &nodes,
                members: &members,
                me: &self.args.node_name,
            },
            &views,
        );

        if claims {
            self.bgp
                .sweep_departed(&self.args.node_name, &nodes, members.keys());
        }
        // BGP: every eligible node advertises (ECMP), independent of the layer 2 owner choice.
        stores
            .secrets
            .want(&watch::password_secrets(&config, &self.args.namespace));
        let bgp_plan = self
            .bgp
            .apply(&config, &nodes, &self.args.node_name, &views, |name| {
                stores.secrets.get(name)
            });

        if claims {
            self.announcer.renew(answer_until.unwrap_or(now));
        }
        self.planned_members = members.clone();
        let failures: Vec<(String, String)> = self
            .announcer
            .apply(&plan.announce, &usable)
            .into_iter()
            .map(|f| {
                tracing::warn!(interface = %f.interface, error = %f.error, "cannot announce");
                (f.interface, f.error)
            })
            .collect();
        for report in self.failures.new_reports(&plan, &failures) {
            status::announce_failed(
                events,
                &report.service,
                uids.get(&report.service).cloned().flatten(),
                report.message,
            );
        }

        // Metrics and status: what this node announces, by Service.
        let desired = step::reported(&plan, &uids);
        let announced = step::announced(&plan);
        for (key, ip) in self.announced.difference(&announced) {
            self.metrics
                .announced
                .remove(&self.announced_labels(key, *ip));
        }
        for (key, ip) in &announced {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mandate_lapses_before_the_others_take_over() {
        let ms = Duration::from_millis;
        // Defaults: peers take over 500 ms after the last heartbeat, which is at most one
        // interval older than the last renewal.
        assert_eq!(mandate_for(ms(500), ms(100)), ms(300));
        assert!(mandate_for(ms(500), ms(100)) + ms(100) < ms(500));
        // Never shorter than one interval, so the checks between steps can keep it.
        assert_eq!(mandate_for(ms(300), ms(100)), ms(100));
    }
}
