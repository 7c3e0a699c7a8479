//! The speaker's start-up and work loop: the tasks started once (metrics server, watches,
//! heartbeats, key reload, presence Lease, interface poll, Event queue, status writer), then one
//! loop that steps when something changed ([`speaker::Speaker`]), checks between steps that
//! the plan still holds, and hands over on SIGTERM. What a step reads and does is
//! [`loop_io::LoopIo`].

pub(crate) mod loop_io;
pub(crate) mod speaker;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use ferrolb_runtime::events::{Always, EventQueue, Recorder};
use ferrolb_runtime::owner::{Owner, OwnerCell};
use ferrolb_runtime::server::{self, Ready, Server};
use tokio::sync::Notify;

use crate::args::Args;
use crate::bgp::step::Bgp;
use crate::l2::announce::Announcer;
use crate::l2::gossip::{self, Gossip};
use crate::l2::interfaces::Interface;
use crate::l2::presence::Presence;
use crate::l2::{gate, interfaces, keys, restart, status, voter_object, voters};
use crate::metrics::Metrics;
use crate::report::auth::{Authorizer, CachePolicy, KubeReviewer};
use crate::report::live::Live;
use crate::status_objects::{self, Scope};
use crate::watch;
use ferrolb_runtime::rate::{Pacer, Rate};
use loop_io::World;
use speaker::Speaker;

/// Runs the speaker until SIGTERM or SIGINT.
pub async fn run(args: Args) -> anyhow::Result<()> {
    check_start(&args)?;
    let mut running = start(args).await?;
    // The metrics server stopping ends the process at once; a signal hands over first.
    running.work().await?;
    running.hand_over().await;
    Ok(())
}

/// What start-up leaves running: the work loop's state and the tasks it talks to.
struct Running {
    speaker: Speaker<World>,
    client: kube::Client,
    gossip: Arc<Gossip>,
    /// Notified when something the loop reads changed.
    changed: Arc<Notify>,
    /// The node's interfaces, kept current by the poll task.
    links: Arc<std::sync::Mutex<BTreeMap<String, Interface>>>,
    ready: Ready,
    pulse: ferrolb_runtime::health::Pulse,
    /// The metrics server; the speaker stops if it does.
    server: tokio::task::JoinHandle<anyhow::Result<()>>,
    /// This speaker's presence Lease, and the task renewing it.
    presence: Presence,
    renewing: tokio::task::JoinHandle<()>,
    /// What this node reports in ServiceL2Status, to the writer task.
    status_tx: tokio::sync::watch::Sender<status::Desired>,
    status_task: tokio::task::JoinHandle<()>,
}

/// Starts everything the work loop needs: the metrics server, the watches, the heartbeats and
/// key reload, the presence Lease, the interface poll, the Event queue and the status writer.
async fn start(args: Args) -> anyhow::Result<Running> {
    // At start a missing or short key is fatal; later changes that break it keep the last good
    // keys instead (l2/keys.rs).
    let key_files = keys::KeyFiles {
        key: args.gossip_key_file.clone(),
        next: args.gossip_next_key_file.clone(),
    };
    let key_ring = key_files.read()?;
    let client = ferrolb_runtime::kube_client(args.common.kubeconfig.as_deref()).await?;
    let (metrics, registry) = Metrics::new();
    let ready = Ready::default();
    // The loop wakes at least every heartbeat interval; silent for this long, it is stuck.
    let pulse = ferrolb_runtime::health::Pulse::new(Duration::from_secs(10));
    // What `kubectl ferrolb explain` reads through the API server's proxy to this Pod.
    let live = Live::new(&args.node_name);
    let server = tokio::spawn(server::serve(
        listen_address(&args),
        Server {
            registry: Arc::new(registry),
            ready: ready.clone(),
            not_ready_reason: "caches not synced",
            pulse: pulse.clone(),
            tls: args.metrics_tls.files()?,
            // Only for callers allowed get on this Pod's pods/proxy (report/auth.rs).
            pages: if args.explain_report {
                live.page(Arc::new(Authorizer::new(
                    KubeReviewer::new(
                        client.clone(),
                        &args.common.namespace,
                        args.pod_name.as_deref(),
                    ),
                    CachePolicy::default(),
                )))
            } else {
                Vec::new()
            },
        },
    ));
    let changed = Arc::new(Notify::new());
    // With the voters membership the presence set is the Nodes: no speaker watches the others'
    // presence Leases (N/10 renewals a second cluster-wide, each delivered to every speaker).
    let legacy = args.membership == crate::args::Membership::Legacy;
    let stores = watch::start(
        &client,
        &args.common.namespace,
        legacy.then_some(args.presence_group.as_str()),
        args.common.lb_class.as_deref(),
        changed.clone(),
    );
    let gossip = start_gossip(&args, key_ring, changed.clone(), metrics.clone()).await?;
    if let Some(object) = args.voters_object.as_deref()
        && args.membership == crate::args::Membership::Voters
    {
        voter_object::Object::new(&client, &args.common.namespace, object, &args.node_name)
            .start(gossip.clone());
    }
    tokio::spawn(keys::keep_reloading(
        key_files,
        gossip.clone(),
        metrics.clone(),
    ));
    let owner = learn_owner(&client, &args);
    let presence = |c: &kube::Client| {
        Presence::new(
            c,
            &args.common.namespace,
            &args.presence_group,
            &args.node_name,
            owner.clone(),
        )
    };
    let renewing = tokio::spawn(presence(&client).keep(metrics.clone()));
    let presence = presence(&client);
    let links = Arc::new(std::sync::Mutex::new(interfaces::read()));
    tokio::spawn(interfaces::poll(links.clone(), changed.clone()));
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
    let scope = Scope {
        client: client.clone(),
        namespace: args.common.namespace.clone(),
        node: args.node_name.clone(),
        owner: owner.clone(),
        events: events.clone(),
        pace: Pacer::new(Rate {
            per_second: args.status_writes_per_second,
            burst: args.status_writes_burst,
        }),
    };
    let (status_tx, status_task) = status_objects::spawn::<status::Layer2>(scope.clone());
    tracing::info!(node = %args.node_name, namespace = %args.common.namespace, "ferrolb-speaker starting");

    let world = World {
        stores,
        gossip: gossip.clone(),
        announcer: Announcer::new(metrics.clone(), args.garp_refresh),
        bgp: Bgp::new(
            metrics.clone(),
            scope,
            &args.bgp_listen,
            changed.clone(),
            args.bgp_status_objects,
        )
        .reporting_to(live.clone()),
        events,
        namespace: args.common.namespace.clone(),
    };
    Ok(Running {
        speaker: Speaker::new(args, world, metrics, live),
        client,
        gossip,
        changed,
        links,
        ready,
        pulse,
        server,
        presence,
        renewing,
        status_tx,
        status_task,
    })
}

impl Running {
    /// The work loop: a step when something changed (or a timer of the gate or the heartbeat
    /// table is due), and between steps a check every heartbeat interval that renews the
    /// mandate while the plan holds. Returns at SIGTERM or SIGINT, or with an error when the
    /// metrics server stops.
    async fn work(&mut self) -> anyhow::Result<()> {
        let shutdown = ferrolb_runtime::shutdown_signal();
        tokio::pin!(shutdown);
        loop {
            let now = Instant::now();
            let wake = [
                self.gossip.next_silence(now),
                self.speaker.layer2.wake_at(now),
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
            // Between steps, the mandate to answer is renewed every heartbeat interval while
            // the plan still holds.
            let check = tokio::time::sleep(self.speaker.args.heartbeat_interval);
            self.pulse.beat();
            tokio::select! {
                _ = self.changed.notified() => self.gossip.tell_changes().await,
                _ = sleep => self.gossip.tell_changes().await,
                _ = check => {
                    if self.speaker.io.stores.synced() {
                        let links = self.links();
                        let valid = self.speaker.still_valid(&links).await;
                        self.ready.set_result(self.speaker.readiness());
                        if valid {
                            continue;
                        }
                    }
                }
                signal = &mut shutdown => {
                    tracing::info!("{}: handing over and shutting down", signal.unwrap_or("signal"));
                    return Ok(());
                }
                r = &mut self.server => return Err(anyhow::anyhow!("metrics server stopped: {r:?}")),
            }
            if !self.speaker.io.stores.synced() {
                continue;
            }
            let links = self.links();
            let desired = self.speaker.step(&links).await;
            self.ready.set_result(self.speaker.readiness());
            if let Some(desired) = desired {
                self.status_tx.send_replace(desired);
            }
        }
    }

    /// The interfaces as last polled.
    fn links(&self) -> BTreeMap<String, Interface> {
        self.links.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Clean shutdown: stop answering, then say so; the others take over at once (within a
    /// few milliseconds). Answering until they have would be two owners for that moment. When
    /// this speaker is being replaced (a rolling update), it asks them instead to keep its IPs
    /// with this node for the restart hold: its successor takes them up, and the connections
    /// kube-proxy tracks here survive. Its presence Lease and status objects stay for the
    /// successor.
    async fn hand_over(self) {
        let Running {
            mut speaker,
            client,
            gossip,
            presence,
            renewing,
            status_tx,
            status_task,
            ..
        } = self;
        let args = &speaker.args;
        let replaced = !args.restart_hold.is_zero()
            && restart::is_replacement(
                &client,
                &args.common.namespace,
                args.pod_name.as_deref(),
                args.restart_hold_when,
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
    }
}

/// What must hold before anything starts: a usable presence group, and the capability to send
/// ARP and NDP.
fn check_start(args: &Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        crate::l2::presence::valid_group(&args.presence_group),
        "--presence-group {:?}: must be at most 63 lowercase letters, digits, '-' or '.', starting and ending with a letter or digit",
        args.presence_group
    );
    // Without CAP_NET_RAW no ARP or NDP answer could ever be sent: say so and stop, so the pod
    // shows it (CrashLoopBackOff with this message) instead of running Ready and silent.
    crate::l2::socket::check_packet_access()
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context(
            "the speaker needs the capability NET_RAW for ARP and NDP (AF_PACKET sockets): add it to \
             the container's securityContext.capabilities.add (the Helm chart does), or run it as \
             root with that capability",
        )?;
    Ok(())
}

/// Where /metrics, /healthz, /readyz (and the live report) are served.
fn listen_address(args: &Args) -> SocketAddr {
    args.listen_ip.map_or(args.common.listen, |ip| {
        SocketAddr::new(ip, args.common.listen.port())
    })
}

/// Binds the heartbeat port and starts the heartbeats with the flags' timings.
async fn start_gossip(
    args: &Args,
    keys: ferrolb_layer2::heartbeat::KeyRing,
    changed: Arc<Notify>,
    metrics: Metrics,
) -> anyhow::Result<Arc<Gossip>> {
    Gossip::start(
        args.node_name.clone(),
        keys,
        args.gossip_port,
        gossip::Timing {
            interval: args.heartbeat_interval,
            timeout: args.failure_timeout,
            confirm_within: gate::mandate_for(args.failure_timeout, args.heartbeat_interval),
            restart_hold: args.restart_hold,
        },
        changed,
        metrics,
        voters_settings(args)?,
    )
    .await
}

/// The voters membership's settings, with `--membership=voters`.
fn voters_settings(args: &Args) -> anyhow::Result<Option<voters::Settings>> {
    if args.membership != crate::args::Membership::Voters {
        anyhow::ensure!(
            args.voters.is_empty() && args.voters_object.is_none(),
            "--voters and --voters-object are only read with --membership=voters"
        );
        return Ok(None);
    }
    let config = match (&args.voters_object, args.voters.is_empty()) {
        (Some(_), false) => anyhow::bail!(
            "--voters and --voters-object exclude each other: the voters come from the flag or from the controller"
        ),
        (Some(_), true) => None,
        (None, _) => Some(voters::config_from_flag(&args.voters)?),
    };
    Ok(Some(voters::Settings {
        node: args.node_name.clone(),
        config,
        timers: voters::timers(
            args.heartbeat_interval,
            args.failure_timeout,
            args.restart_hold,
            args.flap_damping,
        ),
        boot: gossip::boot_id(),
    }))
}

/// The Pod's DaemonSet owns what this speaker writes for itself (presence Lease, status
/// objects), learnt in the background; outside a pod (no `--pod-name`) nobody is learnt.
fn learn_owner(client: &kube::Client, args: &Args) -> OwnerCell {
    let owner = OwnerCell::default();
    if let Some(pod) = args.pod_name.clone() {
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(client.clone(), &args.common.namespace);
        tokio::spawn(ferrolb_runtime::owner::learn(
            owner.clone(),
            "the speaker's Pod",
            move || {
                let (pods, pod) = (pods.clone(), pod.clone());
                async move {
                    let meta = pods.get_metadata(&pod).await?;
                    Ok(Owner::for_pod(&meta.metadata))
                }
            },
        ));
    }
    owner
}
