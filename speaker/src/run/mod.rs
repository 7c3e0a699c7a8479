//! The speaker's I/O: watches, heartbeats, interfaces, the announcer and the status writer,
//! around the pure planning of the library.

mod announce;
mod bfd;
mod bgp;
mod bgp_status;
mod gossip;
mod interfaces;
mod keys;
mod live;
mod loop_io;
mod metrics;
mod presence;
pub mod restart;
mod status;
mod status_objects;
mod unnumbered;
mod vrf;
mod watch;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use ferrolb_config::allocator::ServiceKey;
use ferrolb_layer2::liveness::Member;
use ferrolb_runtime::events::{Always, EventQueue, Recorder};
use ferrolb_speaker::l2::interfaces::Interface;
use ferrolb_speaker::l2::plan::{self, Inputs, ServiceOutcome};
use ferrolb_speaker::l2::presence::known as known_speakers;
use ferrolb_speaker::l2::{gate, readiness, step};
use ferrolb_speaker::report;
use ferrolb_speaker::view::NodeView;
use loop_io::LoopIo;
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
    // Without CAP_NET_RAW no ARP or NDP answer could ever be sent: say so and stop, so the pod
    // shows it (CrashLoopBackOff with this message) instead of running Ready and silent.
    ferrolb_speaker::l2::socket::check_packet_access()
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context(
        "the speaker needs the capability NET_RAW for ARP and NDP (AF_PACKET sockets): add it to \
         the container's securityContext.capabilities.add (the Helm chart does), or run it as \
         root with that capability",
    )?;
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
    // What `kubectl ferrolb explain` reads through the API server's proxy to this Pod.
    let live = live::Live::new(&args.node_name);
    let server = tokio::spawn(ferrolb_runtime::serve(
        listen,
        Arc::new(registry),
        ready.clone(),
        "caches not synced",
        pulse.clone(),
        args.metrics_tls.files()?,
        if args.explain_report {
            live.page()
        } else {
            Vec::new()
        },
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
    // The Pod's DaemonSet owns what this speaker writes for itself (presence Lease, status
    // objects), learnt in the background.
    let owner = ferrolb_runtime::owner::OwnerCell::default();
    if let Some(pod) = args.pod_name.clone() {
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(client.clone(), &args.namespace);
        tokio::spawn(ferrolb_runtime::owner::learn(
            owner.clone(),
            "the speaker's Pod",
            move || {
                let (pods, pod) = (pods.clone(), pod.clone());
                async move {
                    let meta = pods.get_metadata(&pod).await?;
                    Ok(ferrolb_runtime::owner::Owner::for_pod(&meta.metadata))
                }
            },
        ));
    }
    let presence = |c: &kube::Client| {
        presence::Presence::new(
            c,
            &args.namespace,
            &args.presence_group,
            &args.node_name,
            owner.clone(),
        )
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
    let scope = status_objects::Scope {
        client: client.clone(),
        namespace: args.namespace.clone(),
        node: args.node_name.clone(),
        owner: owner.clone(),
        events: events.clone(),
    };
    let (status_tx, status_task) = status_objects::spawn::<status::Layer2>(scope.clone());
    tracing::info!(node = %args.node_name, namespace = %args.namespace, "ferrolb-speaker starting");

    let world = loop_io::World {
        stores,
        gossip: gossip.clone(),
        announcer: announce::Announcer::new(metrics.clone(), args.garp_refresh),
        bgp: bgp::Bgp::new(metrics.clone(), scope, &args.bgp_listen, changed.clone())
            .reporting_to(live.clone()),
        events: events.clone(),
        namespace: args.namespace.clone(),
    };
    let mut speaker = Speaker::new(args, world, metrics, live);
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
                if speaker.io.stores.synced() {
                    let links = links.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    let valid = speaker.still_valid(&links).await;
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
        if !speaker.io.stores.synced() {
            continue;
        }
        let links = links.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let desired = speaker.step(&links).await;
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
    speaker
        .io
        .announcer
        .apply(&BTreeMap::new(), &BTreeMap::new());
    gossip.leave(replaced).await;
    renewing.abort();
    if replaced {
        tracing::info!(hold = ?speaker.args.restart_hold, "being replaced: the other speakers keep this node's IPs for its successor");
    } else {
        presence.remove().await;
    }
    speaker.io.bgp.shutdown().await;
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
    /// What the check found, for the live report.
    standing: report::Standing,
}

/// The work loop's state; `io` is what it reads and does outside itself ([`loop_io::LoopIo`]).
struct Speaker<Io> {
    args: Args,
    io: Io,
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
    metrics: Metrics,
    /// The live report `kubectl ferrolb explain` reads.
    live: live::Live,
}

impl<Io> Speaker<Io> {
    /// The loop's state for a speaker that has just started.
    fn new(args: Args, io: Io, metrics: Metrics, live: live::Live) -> Self {
        Speaker {
            gate: gate::Gate::new(gate::Timing {
                heartbeat_interval: args.heartbeat_interval,
                failure_timeout: args.failure_timeout,
                mandate: mandate_for(args.failure_timeout, args.heartbeat_interval),
                flap_damping: args.flap_damping,
            }),
            io,
            config: None,
            tenure_lapsed: false,
            layer2: readiness::Layer2State::default(),
            announces: true,
            acted: false,
            planned_members: BTreeMap::new(),
            announced: BTreeSet::new(),
            failures: step::FailureLog::default(),
            metrics,
            live,
            args,
        }
    }
}

impl<Io: LoopIo> Speaker<Io> {
    /// Who may own IPs now (the quorum rule, settling and the claim delay), and the inputs
    /// that go with it. Cheap: no planning.
    async fn membership(
        &mut self,
        links: &BTreeMap<String, Interface>,
        now: Instant,
    ) -> Membership {
        let usable: BTreeMap<String, Interface> = links
            .iter()
            .filter(|(_, i)| i.usable(&self.args.ignore_interfaces))
            .map(|(n, i)| (n.clone(), i.clone()))
            .collect();
        let usable_names: BTreeSet<String> = usable.keys().cloned().collect();

        let nodes: BTreeMap<String, NodeView> = self
            .io
            .nodes()
            .iter()
            .map(|n| NodeView::from_node(n))
            .map(|v| (v.name.clone(), v))
            .collect();
        // Heartbeat state is kept for Nodes only: a deleted Node's entry goes, and junk names
        // cannot grow the table (ferrolb_layer2::liveness::Membership::set_nodes).
        self.io.set_peers(
            nodes
                .values()
                .filter(|n| n.name != self.args.node_name)
                .filter_map(|n| n.addresses.first().copied())
                .collect(),
            nodes.keys().cloned().collect(),
        );
        // Who may own IPs, this node included, and until when it may answer: the gate's rules
        // (ferrolb_speaker::l2::gate), from the known speakers, the heartbeat table and the
        // acknowledgements.
        let known = known_speakers(&self.io.presence());
        let loop_io::Heartbeats {
            reports,
            acks,
            tenure,
        } = self.io.heartbeats(&known, now);
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
        self.io.say(o.acts, usable_names.clone()).await;
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
        let standing = report::Standing {
            may_own: o.acts,
            quorum: o.verdict.quorum,
            known: known.len(),
            heard: reports.len(),
            held_back: o.held_until.is_some(),
        };
        let (members, claims, answer_until) = (o.members, o.claims, o.answer_until);
        Membership {
            usable,
            nodes,
            members,
            claims,
            answer_until,
            standing,
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
    async fn still_valid(&mut self, links: &BTreeMap<String, Interface>) -> bool {
        self.still_valid_at(links, Instant::now()).await
    }

    async fn still_valid_at(&mut self, links: &BTreeMap<String, Interface>, now: Instant) -> bool {
        let m = self.membership(links, now).await;
        if m.members != self.planned_members {
            return false;
        }
        if m.claims {
            self.io.renew(m.answer_until.unwrap_or(now));
        }
        true
    }

    /// One step: the configuration, who may own, the plan, and carrying it out (responders,
    /// BGP, Events, metrics). Returns what this node reports in ServiceL2Status.
    async fn step(&mut self, links: &BTreeMap<String, Interface>) -> status::Desired {
        self.step_at(links, Instant::now()).await
    }

    async fn step_at(
        &mut self,
        links: &BTreeMap<String, Interface>,
        now: Instant,
    ) -> status::Desired {
        if self.io.take_config_dirty() || self.config.is_none() {
            let validated = self.io.validated(&self.args.namespace);
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
            standing,
        } = self.membership(links, now).await;
        let step::Views {
            services: views,
            uids,
        } = step::views(
            &self.io.services(),
            &self.io.slices(),
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

        // BGP: every eligible node advertises (ECMP), independent of the layer 2 owner choice.
        let bgp_services = self.io.advertise(
            &config,
            &nodes,
            &self.args.node_name,
            &views,
            claims.then_some(&members),
        );

        if claims {
            self.io.renew(answer_until.unwrap_or(now));
        }
        self.planned_members = members.clone();
        let failures = self.io.announce(&plan.announce, &usable);
        for (interface, error) in &failures {
            tracing::warn!(%interface, %error, "cannot announce");
        }
        for report in self.failures.new_reports(&plan, &failures) {
            self.io.announce_failed(
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
            bgp_services,
            members = members.len(),
            "planned"
        );
        // Handed over as they are: the report is built only when someone asks for it.
        self.live.set_layer2(live::Layer2Step {
            node: report::node_state(nodes.get(&self.args.node_name)),
            plan,
            standing,
            members: members.into_keys().collect(),
            interfaces: usable,
            services: views,
        });
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
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use std::cell::{Cell, RefCell};

    use clap::Parser;
    use ferrolb_config::model::Config;
    use ferrolb_config::validate::{Objects, Validated};
    use ferrolb_layer2::liveness::Heard;
    use ferrolb_layer2::quorum::Report;
    use ferrolb_layer2::tenure::Tenure;
    use ferrolb_speaker::l2::plan::Announcement;
    use ferrolb_speaker::view::ServiceView;
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::{Node, Service};
    use k8s_openapi::api::discovery::v1::EndpointSlice;

    const NODES: [&str; 3] = ["node1", "node2", "node3"];
    const IP: &str = "198.18.200.0";

    fn from_json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Arc<T> {
        Arc::new(serde_json::from_value(v).unwrap())
    }

    fn node(name: &str, address: &str) -> Arc<Node> {
        from_json(serde_json::json!({
            "metadata": {"name": name},
            "status": {"addresses": [{"type": "InternalIP", "address": address}]}
        }))
    }

    fn presence(name: &str) -> Arc<Lease> {
        from_json(serde_json::json!({
            "metadata": {"name": format!("ferrolb-speaker-{name}"), "namespace": "metallb-system"},
            "spec": {
                "holderIdentity": name,
                "leaseDurationSeconds": 40,
                "renewTime": "2026-12-02T12:00:00.000000Z"
            }
        }))
    }

    /// Service `web` holding [`IP`], traffic policy Local: only nodes with a ready endpoint
    /// may announce it.
    fn web() -> Arc<Service> {
        from_json(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "uid-web"},
            "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local",
                     "ports": [{"port": 80, "protocol": "TCP"}]},
            "status": {"loadBalancer": {"ingress": [{"ip": IP}]}}
        }))
    }

    /// `web`'s endpoints: one ready pod on each of `nodes`.
    fn endpoints_on(nodes: &[&str]) -> Arc<EndpointSlice> {
        let endpoints: Vec<serde_json::Value> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                serde_json::json!({
                    "addresses": [format!("10.0.{i}.1")],
                    "conditions": {"ready": true},
                    "nodeName": n
                })
            })
            .collect();
        from_json(serde_json::json!({
            "metadata": {"name": "web-1", "namespace": "default",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": endpoints,
            "ports": [{"port": 8080, "protocol": "TCP"}]
        }))
    }

    fn validated() -> Validated {
        let mut objects = Objects {
            namespace: "metallb-system".into(),
            ..Default::default()
        };
        let errors = ferrolb_config::manifest::read_manifests(
            "apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: lab, namespace: metallb-system}
spec: {addresses: [198.18.200.0/24]}
---
apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {name: l2, namespace: metallb-system}
",
            "test.yaml",
            &mut objects,
        );
        assert!(errors.is_empty(), "{errors:?}");
        ferrolb_config::validate::validate(&objects)
    }

    fn eth0() -> BTreeMap<String, Interface> {
        BTreeMap::from([(
            "eth0".to_string(),
            Interface {
                name: "eth0".into(),
                index: 2,
                mac: Some([2, 0, 0, 0, 0, 1]),
                flags: 1,
                oper_up: true,
                enslaved: false,
            },
        )])
    }

    /// The world as node1 sees it: three speakers, `web` served from `endpoints`, and the
    /// peers it hears (each hearing every node, node1 as ready as node1 says it is).
    struct Fake {
        nodes: Vec<Arc<Node>>,
        services: Vec<Arc<Service>>,
        slices: Vec<Arc<EndpointSlice>>,
        heard: Vec<&'static str>,
        config_dirty: Cell<bool>,
        validations: Cell<usize>,
        /// What node1's heartbeats said, in order.
        said: RefCell<Vec<bool>>,
        /// Every announcement plan handed to the responders.
        announced: Vec<BTreeMap<IpAddr, Announcement>>,
        /// Interfaces the responders cannot set up.
        broken: Vec<String>,
        renewed: Cell<usize>,
        events: RefCell<Vec<(ServiceKey, Option<String>, String)>>,
    }

    impl Fake {
        fn new(heard: &[&'static str], endpoints: &[&str]) -> Self {
            Fake {
                nodes: NODES
                    .iter()
                    .enumerate()
                    .map(|(i, n)| node(n, &format!("198.18.0.{}", 11 + i)))
                    .collect(),
                services: vec![web()],
                slices: vec![endpoints_on(endpoints)],
                heard: heard.to_vec(),
                config_dirty: Cell::new(false),
                validations: Cell::new(0),
                said: RefCell::new(Vec::new()),
                announced: Vec::new(),
                broken: Vec::new(),
                renewed: Cell::new(0),
                events: RefCell::new(Vec::new()),
            }
        }

        /// Whether the last plan handed to the responders answers for [`IP`].
        fn answers(&self) -> bool {
            self.announced
                .last()
                .is_some_and(|plan| plan.contains_key(&IP.parse::<IpAddr>().unwrap()))
        }
    }

    impl LoopIo for Fake {
        fn nodes(&self) -> Vec<Arc<Node>> {
            self.nodes.clone()
        }
        fn services(&self) -> Vec<Arc<Service>> {
            self.services.clone()
        }
        fn slices(&self) -> Vec<Arc<EndpointSlice>> {
            self.slices.clone()
        }
        fn presence(&self) -> Vec<Arc<Lease>> {
            NODES.iter().map(|n| presence(n)).collect()
        }
        fn take_config_dirty(&self) -> bool {
            self.config_dirty.replace(false)
        }
        fn validated(&self, _namespace: &str) -> Validated {
            self.validations.set(self.validations.get() + 1);
            validated()
        }
        fn set_peers(&self, _addresses: Vec<IpAddr>, _nodes: BTreeSet<String>) {}
        fn heartbeats(&self, _known: &BTreeSet<String>, _now: Instant) -> loop_io::Heartbeats {
            let me_ready = self.said.borrow().last().copied().unwrap_or(false);
            let reports = self
                .heard
                .iter()
                .map(|peer| {
                    let hears = NODES
                        .iter()
                        .filter(|n| *n != peer)
                        .map(|n| (n.to_string(), *n != "node1" || me_ready))
                        .collect();
                    let report = Report {
                        fresh: true,
                        ready: true,
                        held: false,
                        hears,
                        interfaces: ["eth0".to_string()].into(),
                    };
                    (peer.to_string(), report)
                })
                .collect();
            let acks = self
                .heard
                .iter()
                .map(|p| {
                    let heard = Heard {
                        ready: me_ready,
                        boot: 1,
                        seq: 10,
                    };
                    (p.to_string(), heard)
                })
                .collect();
            let tenure = if self.heard.is_empty() {
                Tenure::Lapsed
            } else {
                Tenure::Unbounded
            };
            loop_io::Heartbeats {
                reports,
                acks,
                tenure,
            }
        }
        async fn say(&self, acts: bool, _interfaces: BTreeSet<String>) {
            self.said.borrow_mut().push(acts);
        }
        fn announce(
            &mut self,
            plan: &BTreeMap<IpAddr, Announcement>,
            _usable: &BTreeMap<String, Interface>,
        ) -> Vec<(String, String)> {
            self.announced.push(plan.clone());
            plan.values()
                .flat_map(|a| &a.interfaces)
                .filter(|i| self.broken.contains(i))
                .map(|i| (i.clone(), "no responder".to_string()))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect()
        }
        fn renew(&self, _until: Instant) {
            self.renewed.set(self.renewed.get() + 1);
        }
        fn advertise(
            &mut self,
            _config: &Config,
            _nodes: &BTreeMap<String, NodeView>,
            _me: &str,
            _services: &[ServiceView],
            _alive: Option<&BTreeMap<String, Member>>,
        ) -> usize {
            0
        }
        fn announce_failed(&self, key: &ServiceKey, uid: Option<String>, why: String) {
            self.events.borrow_mut().push((key.clone(), uid, why));
        }
    }

    fn speaker(io: Fake) -> Speaker<Fake> {
        let args = Args::try_parse_from([
            "ferrolb-speaker",
            "--node-name",
            "node1",
            "--gossip-key-file",
            "unread-in-tests",
        ])
        .unwrap();
        Speaker::new(args, io, Metrics::new().0, live::Live::new("node1"))
    }

    /// Steps every 100 ms for `steps` steps from `t0`; returns the last step's report.
    async fn run_steps(s: &mut Speaker<Fake>, t0: Instant, steps: u32) -> status::Desired {
        let mut desired = status::Desired::new();
        for i in 0..steps {
            desired = s
                .step_at(&eth0(), t0 + Duration::from_millis(100) * i)
                .await;
        }
        desired
    }

    #[tokio::test]
    async fn a_node_hearing_a_majority_announces_what_only_it_can_serve_and_reports_it() {
        let mut s = speaker(Fake::new(&["node2", "node3"], &["node1"]));
        let t0 = Instant::now();
        // Before the settle time (the failure timeout) nothing is claimed.
        run_steps(&mut s, t0, 3).await;
        assert!(
            !s.io.answers(),
            "claimed before hearing the others for a failure timeout"
        );
        let desired = run_steps(&mut s, t0, 15).await;
        assert!(s.io.answers(), "plans: {:?}", s.io.announced.last());
        assert_eq!(s.io.said.borrow().last(), Some(&true));
        assert!(
            desired.contains_key(&ServiceKey::new("default", "web")),
            "{desired:?}"
        );
        assert_eq!(s.readiness(), Ok(()));
        assert!(s.io.renewed.get() > 0, "the mandate was never given");
        assert_eq!(s.io.validations.get(), 1, "validated again with no change");
        // A configuration change is read at the next step.
        s.io.config_dirty.set(true);
        s.step_at(&eth0(), t0 + Duration::from_secs(2)).await;
        assert_eq!(s.io.validations.get(), 2);
    }

    #[tokio::test]
    async fn a_node_cut_off_from_the_others_never_announces_and_says_so() {
        // node1 hears nobody while the API server knows three speakers: the minority.
        let mut s = speaker(Fake::new(&[], &["node1"]));
        let desired = run_steps(&mut s, Instant::now(), 30).await;
        assert!(
            s.io.announced.iter().all(|plan| plan.is_empty()),
            "a cut-off node answered: {:?}",
            s.io.announced
        );
        assert!(s.io.said.borrow().iter().all(|acts| !acts));
        assert!(desired.is_empty());
        assert!(s.readiness().is_err(), "a cut-off speaker reported ready");
    }

    #[tokio::test]
    async fn the_node_stops_announcing_when_its_endpoints_leave() {
        let mut s = speaker(Fake::new(&["node2", "node3"], &["node1"]));
        let t0 = Instant::now();
        run_steps(&mut s, t0, 15).await;
        assert!(s.io.answers());
        // The pod moved to node2 (traffic policy Local): node2 answers now, node1 not at all.
        s.io.slices = vec![endpoints_on(&["node2"])];
        let desired = s.step_at(&eth0(), t0 + Duration::from_secs(2)).await;
        assert!(
            !s.io.answers(),
            "still answering: {:?}",
            s.io.announced.last()
        );
        assert!(desired.is_empty(), "still reported: {desired:?}");
        assert!(
            s.announced.is_empty(),
            "the announced metric kept {:?}",
            s.announced
        );
    }

    #[tokio::test]
    async fn an_announcement_failure_is_one_event_not_one_per_step() {
        let mut fake = Fake::new(&["node2", "node3"], &["node1"]);
        fake.broken = vec!["eth0".into()];
        let mut s = speaker(fake);
        run_steps(&mut s, Instant::now(), 30).await;
        let events = s.io.events.borrow();
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].0, ServiceKey::new("default", "web"));
        assert_eq!(events[0].1.as_deref(), Some("uid-web"));
    }

    #[tokio::test]
    async fn checks_between_steps_renew_the_mandate_until_the_members_change() {
        let mut s = speaker(Fake::new(&["node2", "node3"], &["node1"]));
        let t0 = Instant::now();
        run_steps(&mut s, t0, 15).await;
        let renewed = s.io.renewed.get();
        assert!(
            s.still_valid_at(&eth0(), t0 + Duration::from_millis(1500))
                .await
        );
        assert_eq!(s.io.renewed.get(), renewed + 1);
        // node3 falls silent: node1 still holds a majority with node2, but the members it
        // planned with changed, so it must plan again.
        s.io.heard = vec!["node2"];
        assert!(
            !s.still_valid_at(&eth0(), t0 + Duration::from_millis(1600))
                .await
        );
    }

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
