//! BGP in the work loop: the plan of this node turned into sessions and routes for the driver,
//! the driver's reports turned into MetalLB's metrics, and what the node advertises into
//! ServiceBGPStatus objects and `metallb_speaker_announced{protocol="bgp"}`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use crate::bgp::driver::{Driver, Observer, PeerSettings, SettingsError};
use crate::bgp::plan::{self, Inputs};
use crate::service_views::ViewMap;
use crate::view::NodeView;
use ferrolb_config::model::{Config, Peer, PeerPassword, PeerTarget};
use ferrolb_runtime::events::{EventQueue, Queued};
use k8s_openapi::api::core::v1::{ObjectReference, Secret};
use tokio::sync::watch;

use crate::bgp::status as bgp_status;
use crate::bgp::unnumbered::links::LinkState;
use crate::metrics::{AnnouncedLabels, Metrics, peer_label};

/// Why a BGPPeer is not running on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
struct NotStarted {
    /// What kind of trouble, which decides how loudly it is reported.
    problem: Problem,
    /// The reason, for the log and the Event.
    why: String,
}

/// The kinds of [`NotStarted`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Problem {
    /// Its TCP MD5 key cannot be used: an error and an `MD5KeyFailed` Event, since the peer
    /// would otherwise have run without the signatures the operator asked for.
    Md5,
    /// An unnumbered peer's interface is missing or unusable on this node: an error and a
    /// `BGPInterfaceNotUsable` Event, so the missing routes are never a silent surprise.
    Interface,
    /// An unnumbered peer not heard on its link yet: the normal first seconds, logged.
    Searching,
    /// Anything else (a `passwordSecret` not usable, no router ID): a warning in the log.
    Other,
}

/// The BGP half of the speaker.
pub struct Bgp {
    driver: Driver,
    /// The BFD sessions the BGP sessions follow.
    bfd: crate::bfd::sessions::BfdSessions,
    /// Peers already reported as unusable, with the reason, so each is reported once while it
    /// lasts.
    reported: BTreeSet<(String, String)>,
    /// BGPPeers whose `vrf` this node lacks, with the VRF, each reported once while it lasts.
    missing_vrfs: BTreeSet<(String, String)>,
    /// Unnumbered BGPPeers without a password, with their interface, each warned about once
    /// while it lasts.
    unsigned_links: BTreeSet<(String, String)>,
    /// Peer discovery on the interfaces of unnumbered BGPPeers.
    links: crate::bgp::unnumbered::links::Links,
    /// Where the Events about BGPPeers go.
    events: EventQueue,
    /// The namespace of the BGPPeers (the speaker's).
    namespace: String,
    /// This node, named in the Events.
    node: String,
    metrics: Metrics,
    /// `metallb_speaker_announced{protocol="bgp"}` label sets currently set.
    announced: BTreeSet<AnnouncedLabels>,
    /// The ServiceBGPStatus writer.
    status: watch::Sender<bgp_status::Desired>,
    /// Whether ServiceBGPStatus objects are written (`--bgp-status-objects`); if not, the
    /// writer is kept with nothing wanted, which deletes what an earlier run wrote.
    status_objects: bool,
    status_task: tokio::task::JoinHandle<()>,
    /// The sweeper of departed nodes' ServiceBGPStatus objects (fed only while this speaker is
    /// the sweeper).
    sweeper: watch::Sender<Option<BTreeSet<String>>>,
    sweeper_task: tokio::task::JoinHandle<()>,
    /// The live report `kubectl ferrolb explain` reads.
    live: crate::report::live::Live,
}

impl Bgp {
    /// No sessions yet; starts the ServiceBGPStatus writer in `scope` (writing objects only
    /// with `status_objects`), and
    /// accepts peers' connections on `listen` (an address that cannot be bound is logged and
    /// left out: the speaker still connects out). An unnumbered peer found on its link
    /// notifies `changed`, so the work loop plans again.
    pub fn new(
        metrics: Metrics,
        scope: crate::status_objects::Scope,
        listen: &[SocketAddr],
        changed: Arc<tokio::sync::Notify>,
        status_objects: bool,
    ) -> Self {
        let (namespace, node, events) = (
            scope.namespace.clone(),
            scope.node.clone(),
            scope.events.clone(),
        );
        let (sweeper, sweeper_task) =
            bgp_status::spawn_sweeper(scope.client.clone(), namespace.clone());
        let (status, status_task) = crate::status_objects::spawn::<bgp_status::Bgp>(scope);
        let mut driver = Driver::new(Arc::new(MetricsObserver(metrics.clone())));
        if !listen.is_empty() {
            let failed = driver.listen(listen);
            tracing::info!(listening = ?driver.listening(), failed = failed.len(), "accepting BGP connections from configured peers");
        }
        let bfd = crate::bfd::sessions::BfdSessions::new(
            metrics.clone(),
            events.clone(),
            namespace.clone(),
            node.clone(),
        );
        Self {
            driver,
            bfd,
            reported: BTreeSet::new(),
            missing_vrfs: BTreeSet::new(),
            unsigned_links: BTreeSet::new(),
            links: crate::bgp::unnumbered::links::Links::new(changed),
            events,
            namespace,
            node,
            metrics,
            announced: BTreeSet::new(),
            status,
            status_objects,
            status_task,
            sweeper,
            sweeper_task,
            live: crate::report::live::Live::new(""),
        }
    }

    /// Reports what it plans and the sessions' states to `live` (the speaker's live report).
    pub fn reporting_to(mut self, live: crate::report::live::Live) -> Self {
        self.live = live;
        self
    }

    /// Sweeps the ServiceBGPStatus objects of nodes that no longer exist, when this speaker is
    /// the first live one by name and the set of Nodes changed (or it just became the sweeper).
    pub fn sweep_departed<'a>(
        &self,
        me: &str,
        nodes: &BTreeMap<String, NodeView>,
        alive: impl IntoIterator<Item = &'a String>,
    ) {
        let wanted = bgp_status::is_sweeper(me, alive).then(|| nodes.keys().cloned().collect());
        self.sweeper.send_if_modified(|current| {
            if *current == wanted {
                false
            } else {
                *current = wanted;
                true
            }
        });
    }

    /// Plans this node's advertisements and hands them to the driver. Returns the plan, whose
    /// `services` say which peers each Service is advertised to. `secret` finds a Secret of
    /// the speaker's namespace by name (for `passwordSecret`).
    pub fn apply(
        &mut self,
        config: &Config,
        nodes: &BTreeMap<String, NodeView>,
        me: &str,
        services: &ViewMap,
        secret: impl Fn(&str) -> Option<Arc<Secret>>,
    ) -> plan::Plan {
        let plan = plan::plan(
            Inputs { config, nodes, me },
            services.values().map(Arc::as_ref),
        );
        let addresses = nodes
            .get(me)
            .map(|n| n.addresses.clone())
            .unwrap_or_default();
        let mut desired = BTreeMap::new();
        let mut not_started: BTreeMap<String, NotStarted> = BTreeMap::new();
        let mut missing_vrfs = BTreeSet::new();
        let links = self.links.apply(&unnumbered_interfaces(config, &plan));
        for (name, peer_plan) in &plan.peers {
            let Some(peer) = config.peers.get(name) else {
                continue;
            };
            match session_settings(peer, &links, &addresses, &secret) {
                Ok((settings, missing_vrf)) => {
                    if let Some(vrf) = missing_vrf {
                        missing_vrfs.insert((name.clone(), vrf));
                    }
                    desired.insert(name.clone(), (settings, peer_plan.routes.clone()));
                }
                Err(n) => {
                    not_started.insert(name.clone(), n);
                }
            }
        }
        let wanted: Vec<String> = desired.keys().cloned().collect();
        // The driver refuses peers whose MD5 key the kernel does not take (and tries them
        // again on the next call, so a corrected BGPPeer or Secret starts them).
        for (name, e) in self.driver.apply(desired) {
            not_started.insert(
                name,
                NotStarted {
                    problem: Problem::Md5,
                    why: e.to_string(),
                },
            );
        }
        let running: Vec<&String> = wanted
            .iter()
            .filter(|n| !not_started.contains_key(*n))
            .collect();
        // Each link's discovery keeps the peer of an Established session on it.
        let mut on_links: BTreeMap<String, Vec<_>> = BTreeMap::new();
        for name in &running {
            if let Some(PeerTarget::Interface(i)) = config.peers.get(*name).map(|p| &p.target)
                && let Some(status) = self.driver.watch_status(name)
            {
                on_links.entry(i.clone()).or_default().push(status);
            }
        }
        self.links.follow_sessions(on_links);
        self.report_unsigned_links(unsigned_links(config, &plan));
        self.bfd
            .apply(config, running.iter().copied(), &mut self.driver, &secret);
        self.report_live(config, &plan, &not_started, &links, &running, services);
        self.report_not_started(&not_started);
        self.report_missing_vrfs(missing_vrfs);
        self.report(&plan, me, services);
        plan
    }

    /// Hands the live report what goes to each peer, why a peer is not started, and the
    /// status channels of the sessions that run.
    fn report_live(
        &self,
        config: &Config,
        plan: &plan::Plan,
        not_started: &BTreeMap<String, NotStarted>,
        links: &BTreeMap<String, LinkState>,
        running: &[&String],
        services: &ViewMap,
    ) {
        let why: BTreeMap<String, String> = not_started
            .iter()
            .map(|(name, n)| (name.clone(), n.why.clone()))
            .collect();
        let mut peers =
            crate::report::bgp_peers(config, plan, &why, |key| services.get(key).map(Arc::as_ref));
        for p in &mut peers {
            if let Some(PeerTarget::Interface(i)) = config.peers.get(&p.name).map(|p| &p.target)
                && let Some(LinkState::Found(on_link)) = links.get(i)
            {
                p.address = format!("interface {i} ({})", on_link.address);
            }
        }
        let sessions = running
            .iter()
            .filter_map(|name| Some(((*name).clone(), self.driver.watch_status(name)?)))
            .collect();
        self.live.set_bgp(peers, sessions);
    }

    /// Logs each peer that is not running, and records an `MD5KeyFailed` Event on the BGPPeer
    /// when its MD5 key is at fault.
    fn report_not_started(&mut self, not_started: &BTreeMap<String, NotStarted>) {
        for (name, n) in newly_not_started(&mut self.reported, not_started) {
            let _peer = crate::bgp::peer_span(name).entered();
            match n.problem {
                Problem::Md5 => {
                    tracing::error!(error = %n.why, "BGP peer not started: its TCP MD5 key cannot be installed, and it is never run without it");
                    self.events
                        .push(md5_key_failed(&self.namespace, name, &self.node, &n.why));
                }
                Problem::Interface => {
                    tracing::error!(error = %n.why, "unnumbered BGP peer not started");
                    self.events.push(Queued {
                        warning: true,
                        reason: "BGPInterfaceNotUsable",
                        message: format!(
                            "BGP session not started on node {}: {}",
                            self.node, n.why
                        ),
                        action: "StartSession",
                        regarding: bgp_peer_ref(&self.namespace, name),
                    });
                }
                Problem::Searching => {
                    tracing::info!(why = %n.why, "unnumbered BGP peer: waiting to hear it on its link");
                }
                Problem::Other => {
                    tracing::warn!(error = %n.why, "BGP peer not started")
                }
            }
            // Dashboards and alerts watch this gauge: a peer that never ran would otherwise
            // have no series at all.
            self.metrics
                .bgp_session_up
                .get_or_create(&peer_label(name))
                .set(0);
        }
    }

    /// Warns (log and a Warning Event `VRFNotFound` on the BGPPeer) about each peer whose VRF
    /// has no device or no address on this node, once while it lasts.
    fn report_missing_vrfs(&mut self, now: BTreeSet<(String, String)>) {
        for (name, vrf) in now.difference(&self.missing_vrfs) {
            let why = format!(
                "vrf {vrf:?} has no device or no address on this node; the session is retried until it has"
            );
            tracing::warn!(peer = %name, %vrf, "BGP peer's VRF not found on this node");
            self.events.push(Queued {
                warning: true,
                reason: "VRFNotFound",
                message: format!("BGP session on node {}: {why}", self.node),
                action: "StartSession",
                regarding: bgp_peer_ref(&self.namespace, name),
            });
        }
        self.missing_vrfs = now;
    }

    /// Warns (log and a Warning Event `UnnumberedPeerWithoutPassword` on the BGPPeer) about
    /// each planned unnumbered peer without a password, once while it lasts.
    fn report_unsigned_links(&mut self, now: BTreeSet<(String, String)>) {
        for (name, interface) in now.difference(&self.unsigned_links) {
            tracing::warn!(peer = %name, %interface, "unnumbered BGP peer without a password: a host on the link can become the peer when the session fails");
            self.events
                .push(unsigned_link(&self.namespace, name, interface, &self.node));
        }
        self.unsigned_links = now;
    }

    /// Metrics and ServiceBGPStatus objects for what `plan` advertises.
    fn report(&mut self, plan: &plan::Plan, me: &str, services: &ViewMap) {
        let mut announced = BTreeSet::new();
        for key in plan.services.keys() {
            let Some(view) = services.get(key) else {
                continue;
            };
            // An IP is announced when some peer gets a prefix holding it.
            for ip in view.ips.iter().filter(|ip| {
                plan.peers
                    .values()
                    .any(|p| p.routes.keys().any(|prefix| prefix.contains(*ip)))
            }) {
                announced.insert(vec![
                    ("service", key.to_string()),
                    ("protocol", "bgp".to_string()),
                    ("node", me.to_string()),
                    ("ip", ip.to_string()),
                ]);
            }
        }
        for gone in self.announced.difference(&announced) {
            self.metrics.announced.remove(gone);
        }
        for labels in &announced {
            self.metrics.announced.get_or_create(labels).set(1);
        }
        self.announced = announced;
        let desired = if self.status_objects {
            plan.services.clone()
        } else {
            bgp_status::Desired::new()
        };
        self.status.send_if_modified(|current| {
            if *current == desired {
                false
            } else {
                *current = desired;
                true
            }
        });
    }

    /// Closes every session with a Cease NOTIFICATION and deletes this node's ServiceBGPStatus
    /// objects (it advertises nothing any more).
    pub async fn shutdown(self) {
        self.driver.shutdown(Duration::from_secs(2)).await;
        self.bfd.shutdown().await;
        self.sweeper_task.abort();
        self.status.send_replace(bgp_status::Desired::new());
        drop(self.status);
        let _ = tokio::time::timeout(Duration::from_secs(5), self.status_task).await;
    }
}

/// The interfaces of the planned unnumbered peers, where their peers are looked for.
fn unnumbered_interfaces(config: &Config, plan: &plan::Plan) -> BTreeSet<String> {
    plan.peers
        .keys()
        .filter_map(|name| match &config.peers.get(name)?.target {
            PeerTarget::Interface(i) => Some(i.clone()),
            PeerTarget::Address(_) => None,
        })
        .collect()
}

/// The planned unnumbered peers (with their interface) that have no password: any host on
/// their link can send Router Advertisements, and becomes the peer should the session fail.
fn unsigned_links(config: &Config, plan: &plan::Plan) -> BTreeSet<(String, String)> {
    plan.peers
        .keys()
        .filter_map(|name| {
            let peer = config.peers.get(name)?;
            let PeerTarget::Interface(i) = &peer.target else {
                return None;
            };
            // An empty password is none (see `PeerSettings`).
            let signed = match &peer.password {
                None => false,
                Some(PeerPassword::Plain(p)) => !p.is_empty(),
                Some(PeerPassword::Secret { .. }) => true,
            };
            (!signed).then(|| (name.clone(), i.clone()))
        })
        .collect()
}

/// The `UnnumberedPeerWithoutPassword` Event on BGPPeer `namespace/name`, whose link is
/// `interface` on `node`.
fn unsigned_link(namespace: &str, name: &str, interface: &str, node: &str) -> Queued {
    Queued {
        warning: true,
        reason: "UnnumberedPeerWithoutPassword",
        message: format!(
            "unnumbered BGP peer on interface {interface} of node {node} has no password: any host on that link can send Router Advertisements, and would become the BGP peer should the session fail; set password or passwordSecret (TCP MD5) on both ends"
        ),
        action: "StartSession",
        regarding: bgp_peer_ref(namespace, name),
    }
}

/// The session of `peer` on this node, with the VRF it names when that VRF has no address
/// here (the session still starts: it retries, and says why, until the VRF appears); or why
/// it cannot run. `links` says where each unnumbered peer's link stands, `addresses` are the
/// node's, `secret` finds a Secret for `passwordSecret`.
fn session_settings(
    peer: &Peer,
    links: &BTreeMap<String, LinkState>,
    addresses: &[IpAddr],
    secret: impl Fn(&str) -> Option<Arc<Secret>>,
) -> Result<(PeerSettings, Option<String>), NotStarted> {
    let on_link = match &peer.target {
        PeerTarget::Address(_) => None,
        PeerTarget::Interface(i) => match links.get(i) {
            Some(LinkState::Found(on_link)) => Some(*on_link),
            Some(LinkState::Unusable(why)) => {
                return Err(NotStarted {
                    problem: Problem::Interface,
                    why: why.clone(),
                });
            }
            _ => {
                return Err(NotStarted {
                    problem: Problem::Searching,
                    why: SettingsError::NotFoundOnLink(i.clone()).to_string(),
                });
            }
        },
    };
    // A passwordSecret that is missing or unusable keeps only this peer down; the Secret's
    // watch brings the loop back here when it changes.
    let password = match &peer.password {
        Some(PeerPassword::Secret {
            name: secret_name, ..
        }) => match secret_password(secret_name, secret(secret_name).as_deref()) {
            Ok(p) => Some(p),
            Err(why) => {
                return Err(NotStarted {
                    problem: Problem::Other,
                    why,
                });
            }
        },
        _ => None,
    };
    let settings = match on_link {
        Some(on_link) => {
            PeerSettings::from_peer_on_link(peer, on_link, addresses, password.as_deref())
        }
        None => PeerSettings::from_peer(peer, addresses, password.as_deref()),
    };
    let mut settings = settings.map_err(|e| NotStarted {
        problem: match e {
            SettingsError::PasswordTooLong { .. } => Problem::Md5,
            _ => Problem::Other,
        },
        why: e.to_string(),
    })?;
    let mut missing_vrf = None;
    // An unnumbered session's next hops are link-local whatever its VRF.
    if let Some(vrf) = settings.connect.vrf.clone().filter(|_| on_link.is_none()) {
        let in_vrf = crate::bgp::vrf::addresses(&vrf);
        if in_vrf.is_empty() {
            missing_vrf = Some(vrf);
        }
        settings.use_vrf_addresses(&in_vrf);
    }
    Ok((settings, missing_vrf))
}

/// The password in a BGPPeer's `passwordSecret`, read as MetalLB reads it: the `password` key
/// of a `kubernetes.io/basic-auth` Secret. The error names the Secret and what is wrong.
fn secret_password(name: &str, secret: Option<&Secret>) -> Result<String, String> {
    let secret = secret.ok_or_else(|| format!("passwordSecret {name:?} does not exist"))?;
    let kind = secret.type_.as_deref().unwrap_or("Opaque");
    if kind != "kubernetes.io/basic-auth" {
        return Err(format!(
            "passwordSecret {name:?} has type {kind:?}, not \"kubernetes.io/basic-auth\""
        ));
    }
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get("password"))
        .ok_or_else(|| format!("passwordSecret {name:?} has no key \"password\""))?;
    let password = String::from_utf8(bytes.0.clone())
        .map_err(|_| format!("passwordSecret {name:?}: key \"password\" is not UTF-8"))?;
    if password.is_empty() {
        return Err(format!(
            "passwordSecret {name:?}: key \"password\" is empty"
        ));
    }
    Ok(password)
}

/// Of the peers `not_started`, those to report now: each once per reason while it lasts, and
/// again should it break again after running. `reported` remembers what was reported.
fn newly_not_started<'a>(
    reported: &mut BTreeSet<(String, String)>,
    not_started: &'a BTreeMap<String, NotStarted>,
) -> Vec<(&'a String, &'a NotStarted)> {
    reported.retain(|(name, why)| not_started.get(name).is_some_and(|n| n.why == *why));
    not_started
        .iter()
        .filter(|(name, n)| reported.insert(((*name).clone(), n.why.clone())))
        .collect()
}

/// The `MD5KeyFailed` Event on BGPPeer `namespace/name`: the peer is not started on `node`
/// because its TCP MD5 key cannot be installed (`why`).
fn md5_key_failed(namespace: &str, name: &str, node: &str, why: &str) -> Queued {
    Queued {
        warning: true,
        reason: "MD5KeyFailed",
        message: format!("BGP session not started on node {node}: {why}"),
        action: "StartSession",
        regarding: bgp_peer_ref(namespace, name),
    }
}

/// BGPPeer `namespace/name`, for Events about it.
pub fn bgp_peer_ref(namespace: &str, name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("metallb.io/v1beta2".into()),
        kind: Some("BGPPeer".into()),
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        ..Default::default()
    }
}

/// Session reports into `metallb_bgp_*`.
struct MetricsObserver(Metrics);

impl Observer for MetricsObserver {
    fn session_up(&self, peer: &str, up: bool) {
        self.0
            .bgp_session_up
            .get_or_create(&peer_label(peer))
            .set(i64::from(up));
    }

    fn updates_sent(&self, peer: &str, count: u64) {
        self.0
            .bgp_updates
            .get_or_create(&peer_label(peer))
            .inc_by(count);
    }

    fn announced(&self, peer: &str, count: usize) {
        self.0
            .bgp_announced_prefixes
            .get_or_create(&peer_label(peer))
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;

    use super::*;

    fn secret(kind: Option<&str>, data: &[(&str, &[u8])]) -> Secret {
        Secret {
            type_: kind.map(Into::into),
            data: Some(
                data.iter()
                    .map(|(k, v)| ((*k).to_string(), ByteString(v.to_vec())))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Secret::default()
        }
    }

    fn not_started(entries: &[(&str, bool, &str)]) -> BTreeMap<String, NotStarted> {
        entries
            .iter()
            .map(|(name, md5, why)| {
                (
                    (*name).to_string(),
                    NotStarted {
                        problem: if *md5 { Problem::Md5 } else { Problem::Other },
                        why: (*why).to_string(),
                    },
                )
            })
            .collect()
    }

    /// Each peer is reported once per reason while it lasts, and again after it ran.
    #[test]
    fn a_peer_that_cannot_start_is_reported_once_per_reason() {
        let mut reported = BTreeSet::new();
        let names = |v: Vec<(&String, &NotStarted)>| -> Vec<String> {
            v.into_iter().map(|(n, _)| n.clone()).collect()
        };
        let now = not_started(&[("a", true, "key refused"), ("b", false, "no Secret")]);
        assert_eq!(names(newly_not_started(&mut reported, &now)), ["a", "b"]);
        assert!(newly_not_started(&mut reported, &now).is_empty());
        let now = not_started(&[("a", true, "key too long"), ("b", false, "no Secret")]);
        assert_eq!(names(newly_not_started(&mut reported, &now)), ["a"]);
        // a starts, then breaks again the same way: reported again.
        let now = not_started(&[("b", false, "no Secret")]);
        assert!(newly_not_started(&mut reported, &now).is_empty());
        let now = not_started(&[("a", true, "key too long"), ("b", false, "no Secret")]);
        assert_eq!(names(newly_not_started(&mut reported, &now)), ["a"]);
    }

    /// The Event names the BGPPeer (so `kubectl describe bgppeer` shows it), the node and why.
    #[test]
    fn the_md5_event_is_on_the_bgppeer() {
        let e = md5_key_failed("metallb-system", "tor", "node1", "too long");
        assert!(e.warning);
        assert_eq!(e.reason, "MD5KeyFailed");
        assert_eq!(e.message, "BGP session not started on node node1: too long");
        assert_eq!(e.regarding.kind.as_deref(), Some("BGPPeer"));
        assert_eq!(
            e.regarding.api_version.as_deref(),
            Some("metallb.io/v1beta2")
        );
        assert_eq!(e.regarding.namespace.as_deref(), Some("metallb-system"));
        assert_eq!(e.regarding.name.as_deref(), Some("tor"));
    }

    /// Issue #33 item 3: an unnumbered peer with no password (or an empty one) is warned
    /// about, on the BGPPeer, naming the link; a numbered one, a signed one or one not planned
    /// on this node is not.
    #[test]
    fn unnumbered_peers_without_password_are_warned_about() {
        let mut config = Config::default();
        let mut add = |name: &str, interface: Option<&str>, password: Option<PeerPassword>| {
            let mut p = ferrolb_testkit::model::peer(name, "198.18.0.254").build();
            if let Some(i) = interface {
                p.target = PeerTarget::Interface(i.into());
            }
            p.password = password;
            config.peers.insert(name.into(), p);
        };
        add("open", Some("eth1"), None);
        add(
            "empty",
            Some("eth2"),
            Some(PeerPassword::Plain(String::new())),
        );
        add(
            "signed",
            Some("eth3"),
            Some(PeerPassword::Plain("pw".into())),
        );
        add(
            "secret",
            Some("eth4"),
            Some(PeerPassword::Secret {
                name: "s".into(),
                namespace: "n".into(),
            }),
        );
        add("numbered", None, None);
        add("elsewhere", Some("eth5"), None);
        let mut plan = plan::Plan::default();
        for name in ["open", "empty", "signed", "secret", "numbered"] {
            plan.peers.insert(name.into(), plan::PeerPlan::default());
        }
        let pairs = |v: &[(&str, &str)]| -> BTreeSet<(String, String)> {
            v.iter()
                .map(|(a, b)| ((*a).to_string(), (*b).to_string()))
                .collect()
        };
        assert_eq!(
            unsigned_links(&config, &plan),
            pairs(&[("empty", "eth2"), ("open", "eth1")])
        );
        let e = unsigned_link("metallb-system", "open", "eth1", "node1");
        assert!(e.warning);
        assert_eq!(e.reason, "UnnumberedPeerWithoutPassword");
        assert!(
            e.message.contains("eth1")
                && e.message.contains("node1")
                && e.message.contains("password"),
            "{}",
            e.message
        );
        assert_eq!(e.regarding.kind.as_deref(), Some("BGPPeer"));
        assert_eq!(e.regarding.name.as_deref(), Some("open"));
    }

    #[test]
    fn a_basic_auth_secret_gives_its_password() {
        let s = secret(Some("kubernetes.io/basic-auth"), &[("password", b"s3cret")]);
        assert_eq!(secret_password("bgp", Some(&s)).unwrap(), "s3cret");
    }

    #[test]
    fn unusable_secrets_are_refused_with_the_reason() {
        let cases = [
            (None, "does not exist"),
            (
                Some(secret(Some("Opaque"), &[("password", b"x")])),
                "has type \"Opaque\"",
            ),
            (
                Some(secret(None, &[("password", b"x")])),
                "has type \"Opaque\"",
            ),
            (
                Some(secret(
                    Some("kubernetes.io/basic-auth"),
                    &[("username", b"x")],
                )),
                "no key \"password\"",
            ),
            (
                Some(secret(
                    Some("kubernetes.io/basic-auth"),
                    &[("password", b"\xff")],
                )),
                "not UTF-8",
            ),
            (
                Some(secret(
                    Some("kubernetes.io/basic-auth"),
                    &[("password", b"")],
                )),
                "is empty",
            ),
        ];
        for (s, want) in cases {
            let e = secret_password("bgp", s.as_ref()).unwrap_err();
            assert!(e.contains("\"bgp\"") && e.contains(want), "{e}");
        }
    }
}
