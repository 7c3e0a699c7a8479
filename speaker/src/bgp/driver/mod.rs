//! The BGP driver: one tokio task per peer that owns the TCP connection, runs the timers the
//! state machine asks for and feeds it decoded messages; the pure parts (`fsm`, `plan`,
//! `adj_out`) decide everything else.
//!
//! [`Driver::apply`] takes the whole desired set of sessions with their routes. A peer whose
//! [`PeerSettings`] are unchanged keeps its session and only gets the new routes; a changed one
//! is stopped (Cease) and started again; a removed one is stopped. So editing one BGPPeer never
//! resets the others.
//!
//! [`Driver::listen`] also accepts the peers' connections (port 179 by default): each goes to
//! the session of the peer with that address, others are closed at once, and a connection that
//! collides with our own is settled as RFC 4271 §6.8 says (see `session`).
//!
//! TCP MD5 fails closed: a peer whose key the kernel refuses, on the listening sockets or on a
//! socket we connect from, is not started (nor dialled, nor accepted) and [`Driver::apply`]
//! returns it with the reason; every later `apply` tries again.

mod listen;
mod session;
pub mod socket;

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::sync::Arc;
use std::time::Duration;

use ferrolb_config::model::{Peer, PeerAsn, PeerPassword, PeerTarget};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::Instrument;

use ferrolb_bgp::adj_out::AdjRibOut;
use ferrolb_bgp::fsm::{self, Backoff, PeerAs, State};
use ferrolb_bgp::packet::AfiSafi;
pub use socket::ConnectOptions;

/// Connect retry wait when BGPPeer sets no `connectTime`.
const DEFAULT_CONNECT_TIME: Duration = Duration::from_secs(5);
/// Cap of the exponential backoff between failed attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(120);
/// Restart time advertised with `enableGracefulRestart` (FRR's and MetalLB's default).
const GRACEFUL_RESTART_TIME: u16 = 120;

/// Where [`Driver::listen`] usually listens: port 179 on every IPv4 and every IPv6 address.
pub const DEFAULT_LISTEN: [SocketAddr; 2] = [
    SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 179),
    SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 179),
];

/// Everything that defines one session; a change of any field restarts that session only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerSettings {
    /// BGPPeer name.
    pub name: String,
    /// Where and how to connect.
    pub connect: ConnectOptions,
    /// The state machine's configuration.
    pub fsm: fsm::Config,
    /// Next hop of IPv4 prefixes when the session runs over IPv6 (the node's IPv4 address).
    pub node_ipv4: Option<Ipv4Addr>,
    /// Next hop of IPv6 prefixes when the session runs over IPv4 (the node's IPv6 address).
    pub node_ipv6: Option<Ipv6Addr>,
}

/// Why a BGPPeer cannot become a session on this node.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    /// An unnumbered peer (`interface`) whose address is not known yet: it is found on the
    /// link by [`crate::bgp::unnumbered::discovery`], then given to [`PeerSettings::from_peer_on_link`].
    #[error("no BGP peer found on interface {0} yet (no router advertisement heard)")]
    NotFoundOnLink(String),
    /// No `routerID` and the node has no IPv4 address to use instead.
    #[error("no routerID set and the node has no IPv4 address to use as BGP identifier")]
    NoRouterId,
    /// `passwordSecret` must be resolved by the caller first.
    #[error("passwordSecret {0} is not resolved")]
    SecretUnresolved(String),
    /// The password is longer than a TCP MD5 key can be.
    #[error(
        "{what} is {len} bytes; a TCP MD5 key is at most {max} bytes (Linux TCP_MD5SIG_MAXKEYLEN)",
        max = socket::MD5_MAX_KEY_LEN
    )]
    PasswordTooLong {
        /// Where the password comes from: `spec.password` or the `passwordSecret`.
        what: String,
        /// Its length in bytes.
        len: usize,
    },
    /// The timers or ASNs do not make a valid session.
    #[error("{0}")]
    Fsm(#[from] fsm::ConfigError),
}

impl PeerSettings {
    /// The session settings of `peer` on a node with `node_addresses`. `secret` is the
    /// content of the `passwordSecret`, when the caller could read it.
    pub fn from_peer(
        peer: &Peer,
        node_addresses: &[IpAddr],
        secret: Option<&str>,
    ) -> Result<Self, SettingsError> {
        match &peer.target {
            PeerTarget::Address(a) => Self::build(
                peer,
                SocketAddr::new(*a, peer.port),
                next_hops(node_addresses),
                node_addresses,
                secret,
            ),
            PeerTarget::Interface(i) => Err(SettingsError::NotFoundOnLink(i.clone())),
        }
    }

    /// The settings of an unnumbered `peer` (BGPPeer `interface`) found on its link at
    /// `on_link`. The session runs between the two link-local addresses and carries both
    /// families with only link-local next hops: IPv4 prefixes with an IPv6 next hop (RFC 8950,
    /// the extended next hop capability), as FRR's `neighbor IF interface` does. The node's
    /// global addresses are no next hop here: the link has none, and the peer reaches us
    /// through it.
    pub fn from_peer_on_link(
        peer: &Peer,
        on_link: OnLink,
        node_addresses: &[IpAddr],
        secret: Option<&str>,
    ) -> Result<Self, SettingsError> {
        let address = SocketAddr::V6(SocketAddrV6::new(
            on_link.address,
            peer.port,
            0,
            on_link.interface_index,
        ));
        Self::build(peer, address, (None, None), node_addresses, secret)
    }

    /// The settings of a session to `address`; `(node_ipv4, node_ipv6)` are the next hops of
    /// the family the session does not run over.
    fn build(
        peer: &Peer,
        address: SocketAddr,
        (node_ipv4, node_ipv6): (Option<Ipv4Addr>, Option<Ipv6Addr>),
        node_addresses: &[IpAddr],
        secret: Option<&str>,
    ) -> Result<Self, SettingsError> {
        let unnumbered = matches!(peer.target, PeerTarget::Interface(_));
        let (node_v4_id, _) = next_hops(node_addresses);
        let bgp_id = peer
            .router_id
            .or(match peer.source_address {
                Some(IpAddr::V4(v4)) => Some(v4),
                _ => None,
            })
            .or(node_v4_id)
            .ok_or(SettingsError::NoRouterId)?;
        let password = match &peer.password {
            None => None,
            // An empty password is no password, as in MetalLB (its FRR configuration leaves
            // `neighbor ... password` out); a zero-length key would delete, not set, a key.
            Some(PeerPassword::Plain(p)) if p.is_empty() => None,
            Some(PeerPassword::Plain(p)) => Some((p.clone(), "spec.password".to_string())),
            Some(PeerPassword::Secret { name, .. }) => Some((
                secret
                    .ok_or_else(|| SettingsError::SecretUnresolved(name.clone()))?
                    .to_string(),
                format!("the password of passwordSecret {name:?}"),
            )),
        };
        if let Some((p, what)) = &password
            && p.len() > socket::MD5_MAX_KEY_LEN
        {
            return Err(SettingsError::PasswordTooLong {
                what: what.clone(),
                len: p.len(),
            });
        }
        let password = password.map(|(p, _)| p);
        let internal = peer.is_ibgp();
        // Directly connected eBGP sends TTL 1 (as FRR and MetalLB do); multi-hop eBGP and iBGP 255.
        let ttl = if internal || peer.ebgp_multi_hop {
            255
        } else {
            1
        };
        let hold = u16::try_from(peer.hold_time.as_secs()).unwrap_or(u16::MAX);
        let keepalive = u16::try_from(peer.keepalive_time.as_secs()).unwrap_or(u16::MAX);
        let fsm = fsm::Config {
            local_as: peer.local_asn.unwrap_or(peer.my_asn),
            peer_as: match peer.peer_asn {
                PeerAsn::Fixed(a) => PeerAs::Fixed(a),
                PeerAsn::Internal => PeerAs::Internal,
                PeerAsn::External => PeerAs::External,
            },
            bgp_id,
            hold_time: hold,
            keepalive_time: (hold != 0).then_some(keepalive.min(hold)),
            connect_retry: Backoff {
                initial: peer.connect_time.unwrap_or(DEFAULT_CONNECT_TIME),
                max: MAX_BACKOFF.max(peer.connect_time.unwrap_or_default()),
            },
            // An unnumbered session is the only way to the peer: both families, as FRR
            // activates them for `neighbor IF interface`.
            families: families(address.ip(), peer.dual_stack_address_family || unnumbered),
            graceful_restart_time: peer.graceful_restart.then_some(GRACEFUL_RESTART_TIME),
            // IPv4 routes with an IPv6 next hop (RFC 8950): only unnumbered sessions, whose
            // link has no IPv4 address, need them; FRR offers it there by itself.
            extended_next_hop: unnumbered,
        };
        fsm.validate()?;
        Ok(Self {
            name: peer.name.clone(),
            connect: ConnectOptions {
                peer: address,
                // An unnumbered session runs from the interface's link-local address, which the
                // peer learnt from our advertisements: `sourceAddress` does not apply.
                source: peer.source_address.filter(|_| !unnumbered),
                ttl,
                password,
                vrf: peer.vrf.clone().filter(|v| !v.is_empty()),
            },
            fsm,
            node_ipv4,
            node_ipv6,
        })
    }
}

/// The first usable IPv4 and IPv6 address of `addresses` (not loopback, not link-local): the
/// next hops of the family the session does not run over.
fn next_hops(addresses: &[IpAddr]) -> (Option<Ipv4Addr>, Option<Ipv6Addr>) {
    let v4 = addresses.iter().find_map(|a| match a {
        IpAddr::V4(v4) if !v4.is_loopback() && !v4.is_link_local() => Some(*v4),
        _ => None,
    });
    let v6 = addresses.iter().find_map(|a| match a {
        IpAddr::V6(v6) if !v6.is_loopback() && !v6.is_unicast_link_local() => Some(*v6),
        _ => None,
    });
    (v4, v6)
}

/// The address families a session to `peer` negotiates: the family of the session's own
/// address, and with `dualStackAddressFamily` the other one too, as MetalLB configures FRR
/// (`address-family ... activate` for the session's family only unless that field is set).
/// `disableMP` has no effect, as in MetalLB 0.15 where it is deprecated.
fn families(peer: IpAddr, dual_stack: bool) -> Vec<AfiSafi> {
    match (dual_stack, peer.to_canonical()) {
        (true, _) => vec![AfiSafi::IPV4_UNICAST, AfiSafi::IPV6_UNICAST],
        (false, IpAddr::V4(_)) => vec![AfiSafi::IPV4_UNICAST],
        (false, IpAddr::V6(_)) => vec![AfiSafi::IPV6_UNICAST],
    }
}

impl PeerSettings {
    /// For a peer in a VRF: the next hops of the other family come from `vrf_addresses` (the
    /// addresses of the VRF's interfaces), not from the Node object, whose addresses are in
    /// the default VRF and unreachable from the VRF's routers.
    pub fn use_vrf_addresses(&mut self, vrf_addresses: &[IpAddr]) {
        (self.node_ipv4, self.node_ipv6) = next_hops(vrf_addresses);
    }
}

/// Where an unnumbered peer was found: its link-local address on the interface with this
/// index (the address's scope).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OnLink {
    /// The peer's IPv6 link-local address (the source of its router advertisements).
    pub address: Ipv6Addr,
    /// The index of the interface it is on.
    pub interface_index: u32,
}

/// What a session reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerStatus {
    /// FSM state.
    pub state: State,
    /// Prefixes the peer holds from us.
    pub announced: usize,
    /// UPDATEs sent since the task started.
    pub updates_sent: u64,
    /// The last failure, for logs and tests.
    pub last_error: Option<String>,
    /// Connection collisions resolved (RFC 4271 §6.8) since the task started.
    pub collisions: u64,
}

impl Default for PeerStatus {
    fn default() -> Self {
        Self {
            state: State::Idle,
            announced: 0,
            updates_sent: 0,
            last_error: None,
            collisions: 0,
        }
    }
}

/// Why a peer's TCP MD5 key could not be installed. The peer is then not started: without its
/// key the kernel would send and accept unsigned segments for it.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// A socket to connect from refused the key.
    #[error("cannot set the TCP MD5 key for {peer} on an outgoing socket: {source}")]
    Connect {
        /// The peer's address.
        peer: IpAddr,
        /// What the kernel said.
        source: io::Error,
    },
    /// A listening socket refused the key.
    #[error("cannot set the TCP MD5 key for {peer} on the BGP listener {listener}: {source}")]
    Listener {
        /// The peer's address.
        peer: IpAddr,
        /// The listening socket.
        listener: SocketAddr,
        /// What the kernel said.
        source: io::Error,
    },
}

/// Notified of session changes (the binary turns them into metrics).
pub trait Observer: Send + Sync + 'static {
    /// The session with `peer` went up or down.
    fn session_up(&self, peer: &str, up: bool);
    /// `count` UPDATEs were sent to `peer`.
    fn updates_sent(&self, peer: &str, count: u64);
    /// `peer` now holds `count` prefixes from us.
    fn announced(&self, peer: &str, count: usize);
}

/// An observer that ignores everything.
pub struct NoObserver;

impl Observer for NoObserver {
    fn session_up(&self, _: &str, _: bool) {}
    fn updates_sent(&self, _: &str, _: u64) {}
    fn announced(&self, _: &str, _: usize) {}
}

struct Handle {
    settings: PeerSettings,
    /// The BFD session the BGP session follows (see [`Driver::follow_bfd`]).
    bfd: watch::Sender<Option<watch::Receiver<crate::bfd::Status>>>,
    bfd_key: Option<crate::bfd::SessionKey>,
    routes: watch::Sender<Arc<AdjRibOut>>,
    status: watch::Receiver<PeerStatus>,
    stop: watch::Sender<bool>,
    /// Connections the peer opened to our listener.
    incoming: mpsc::Sender<tokio::net::TcpStream>,
    task: JoinHandle<()>,
}

/// A peer about to start: its settings, routes and the channel for its peer's connections.
struct Starting {
    settings: PeerSettings,
    routes: Arc<AdjRibOut>,
    incoming: (
        mpsc::Sender<tokio::net::TcpStream>,
        mpsc::Receiver<tokio::net::TcpStream>,
    ),
}

/// All sessions of this node.
pub struct Driver {
    peers: BTreeMap<String, Handle>,
    /// Stopped sessions that may still be closing their connection, by peer address: a new
    /// session with the same peer waits for them (see `session::after`).
    closing: Vec<(IpAddr, JoinHandle<()>)>,
    observer: Arc<dyn Observer>,
    listener: listen::Listener,
}

impl Driver {
    /// A driver without sessions. It only connects to its peers until [`Driver::listen`].
    pub fn new(observer: Arc<dyn Observer>) -> Self {
        Self {
            peers: BTreeMap::new(),
            closing: Vec::new(),
            observer,
            listener: listen::Listener::new(),
        }
    }

    /// Also accepts the peers' connections on `addresses` (usually [`DEFAULT_LISTEN`]; an IPv6
    /// address listens for IPv6 only). An address that cannot be bound (port 179 taken, no
    /// such address) is logged and skipped: the sessions then rely on their own connections.
    /// Returns those failures. A running peer whose MD5 key a new socket refuses is stopped
    /// (logged as an error; the next [`Driver::apply`] tries it again and reports it). Must be
    /// called within a tokio runtime.
    pub fn listen(&mut self, addresses: &[SocketAddr]) -> Vec<(SocketAddr, io::Error)> {
        let mut failed = Vec::new();
        for address in addresses {
            match self.listener.bind(*address) {
                Ok(()) => tracing::info!(%address, "listening for BGP connections"),
                Err(e) => {
                    tracing::warn!(%address, error = %e, "cannot listen for BGP connections; connecting to the peers only");
                    failed.push((*address, e));
                }
            }
        }
        let (_, refused) = self.update_listener(BTreeMap::new());
        for (name, e) in refused {
            tracing::error!(peer = %name, error = %e, "BGP peer stopped: its TCP MD5 key cannot be installed");
        }
        failed
    }

    /// The addresses [`Driver::listen`] listens on (with the port the kernel chose for 0).
    pub fn listening(&self) -> Vec<SocketAddr> {
        self.listener.addresses()
    }

    /// Tells the listener who may connect (the running peers and `starting`) and with which
    /// MD5 key. With several peers at one address, connections go to the first by name. A peer
    /// whose key a listening socket refuses is taken out of `starting`, or stopped when
    /// running, and returned; the next peer by name at that address is tried in its place.
    fn update_listener(
        &mut self,
        mut starting: BTreeMap<String, Starting>,
    ) -> (BTreeMap<String, Starting>, BTreeMap<String, KeyError>) {
        let mut refused = BTreeMap::new();
        loop {
            let mut candidates: BTreeMap<&String, (&PeerSettings, &mpsc::Sender<_>)> = self
                .peers
                .iter()
                .map(|(n, h)| (n, (&h.settings, &h.incoming)))
                .collect();
            candidates.extend(
                starting
                    .iter()
                    .map(|(n, s)| (n, (&s.settings, &s.incoming.0))),
            );
            let mut targets = BTreeMap::new();
            for (name, (settings, tx)) in candidates {
                let c = &settings.connect;
                // The listeners are in the default VRF: a VRF peer's connections never reach
                // them (unless the node sets tcp_l3mdev_accept), and its address may be one a
                // default-VRF peer also has. Such peers are only dialled.
                if c.vrf.is_some() {
                    continue;
                }
                let address = listen::PeerKey::of(c.peer);
                if targets.contains_key(&address) {
                    tracing::warn!(peer = %name, %address, "another BGPPeer has this address: its connections go to that one");
                    continue;
                }
                targets.insert(
                    address,
                    listen::Target {
                        name: name.clone(),
                        ttl: c.ttl,
                        source: c.source.map(|s| s.to_canonical()),
                        key: c.password.clone(),
                        tx: tx.clone(),
                    },
                );
            }
            let failed = self.listener.update(&targets);
            if failed.is_empty() {
                return (starting, refused);
            }
            // Each round drops at least one peer, so this ends.
            for (address, r) in failed {
                let Some(name) = targets.get(&address).map(|t| t.name.clone()) else {
                    continue;
                };
                starting.remove(&name);
                if let Some(h) = self.peers.remove(&name) {
                    let _ = h.stop.send(true);
                }
                self.observer.session_up(&name, false);
                refused.insert(
                    name,
                    KeyError::Listener {
                        peer: address.ip,
                        listener: r.listener,
                        source: r.error,
                    },
                );
            }
        }
    }

    /// Brings the sessions to `desired` (by BGPPeer name: settings and routes). Must be called
    /// within a tokio runtime.
    ///
    /// Returns the peers that were not started because their TCP MD5 key cannot be installed
    /// (see [`KeyError`]): no connection goes to them and none from them is accepted. They are
    /// tried again on every call, so a corrected BGPPeer or Secret starts them.
    #[must_use = "peers whose TCP MD5 key cannot be installed are not started: report them"]
    pub fn apply(
        &mut self,
        desired: BTreeMap<String, (PeerSettings, AdjRibOut)>,
    ) -> BTreeMap<String, KeyError> {
        let gone: Vec<String> = self
            .peers
            .iter()
            .filter(|(name, h)| desired.get(*name).is_none_or(|(s, _)| *s != h.settings))
            .map(|(name, _)| name.clone())
            .collect();
        self.closing.retain(|(_, task)| !task.is_finished());
        for name in gone {
            if let Some(h) = self.peers.remove(&name) {
                tracing::info!(peer = %name, "stopping BGP session");
                let _ = h.stop.send(true);
                self.observer.session_up(&name, false);
                self.closing.push((h.settings.connect.peer.ip(), h.task));
            }
        }
        let mut refused = BTreeMap::new();
        let mut starting = BTreeMap::new();
        for (name, (settings, routes)) in desired {
            let routes = Arc::new(routes);
            if let Some(h) = self.peers.get(&name) {
                h.routes.send_if_modified(|r| {
                    let changed = **r != *routes;
                    if changed {
                        *r = routes.clone();
                    }
                    changed
                });
                continue;
            }
            // Every connect sets the key before its SYN and gives up when that fails, so a
            // key the kernel refuses would only show as endless failed attempts: try it on a
            // spare socket first, and do not start the peer at all when it is refused.
            if let Some(password) = &settings.connect.password
                && let Err(source) = socket::check_md5(settings.connect.peer.ip(), password)
            {
                self.observer.session_up(&name, false);
                refused.insert(
                    name,
                    KeyError::Connect {
                        peer: settings.connect.peer.ip(),
                        source,
                    },
                );
                continue;
            }
            starting.insert(
                name,
                Starting {
                    settings,
                    routes,
                    incoming: mpsc::channel(4),
                },
            );
        }
        // Keys go on the listener before any session starts, so no session of a refused peer
        // ever dials or takes a connection.
        let (starting, on_listener) = self.update_listener(starting);
        refused.extend(on_listener);
        for (name, s) in starting {
            tracing::info!(peer = %name, address = %s.settings.connect.peer, "starting BGP session");
            let (routes_tx, routes_rx) = watch::channel(s.routes);
            let (status_tx, status_rx) = watch::channel(PeerStatus::default());
            let (stop_tx, stop_rx) = watch::channel(false);
            let (incoming_tx, incoming_rx) = s.incoming;
            let (bfd_tx, bfd_rx) = watch::channel(None);
            let peer = s.settings.connect.peer.ip();
            let (predecessors, others) = std::mem::take(&mut self.closing)
                .into_iter()
                .partition(|(address, _)| *address == peer);
            self.closing = others;
            let session = session::run(
                s.settings.clone(),
                routes_rx,
                status_tx,
                stop_rx,
                incoming_rx,
                bfd_rx,
                self.observer.clone(),
            );
            let predecessors = predecessors.into_iter().map(|(_, task)| task).collect();
            let task = tokio::spawn(
                session::after(predecessors, session).instrument(super::peer_span(&name)),
            );
            self.peers.insert(
                name,
                Handle {
                    settings: s.settings,
                    bfd: bfd_tx,
                    bfd_key: None,
                    routes: routes_tx,
                    status: status_rx,
                    stop: stop_tx,
                    incoming: incoming_tx,
                    task,
                },
            );
        }
        refused
    }

    /// Makes `peer`'s BGP session follow the BFD session `bfd` (its key and status channel;
    /// none: no BFD): stopped at once when BFD goes down, started again when it is Up
    /// ([`crate::bfd::follow`]). Changing it does not restart the BGP session.
    pub fn follow_bfd(
        &mut self,
        peer: &str,
        bfd: Option<(crate::bfd::SessionKey, watch::Receiver<crate::bfd::Status>)>,
    ) {
        let Some(h) = self.peers.get_mut(peer) else {
            return;
        };
        let key = bfd.as_ref().map(|(k, _)| *k);
        if h.bfd_key == key {
            return;
        }
        h.bfd_key = key;
        h.bfd.send_replace(bfd.map(|(_, rx)| rx));
    }

    /// The status of every session.
    pub fn status(&self) -> BTreeMap<String, PeerStatus> {
        self.peers
            .iter()
            .map(|(n, h)| (n.clone(), h.status.borrow().clone()))
            .collect()
    }

    /// A receiver of one session's status, to wait for a change.
    pub fn watch_status(&self, peer: &str) -> Option<watch::Receiver<PeerStatus>> {
        self.peers.get(peer).map(|h| h.status.clone())
    }

    /// Stops every session with a Cease NOTIFICATION and waits (at most `limit`) for the tasks.
    pub async fn shutdown(self, limit: Duration) {
        let mut tasks: Vec<JoinHandle<()>> = self.closing.into_iter().map(|(_, t)| t).collect();
        for (name, h) in self.peers {
            let _ = h.stop.send(true);
            self.observer.session_up(&name, false);
            tasks.push(h.task);
        }
        let _ = tokio::time::timeout(limit, futures::future::join_all(tasks)).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn peer() -> Peer {
        ferrolb_testkit::model::peer("r", "198.18.0.254")
            .password("pw")
            .build()
    }

    /// Changing one peer restarts only its task; route changes restart nothing.
    #[tokio::test]
    async fn changing_one_peer_keeps_the_others() {
        let addrs: Vec<IpAddr> = vec!["127.0.0.1".parse().unwrap()];
        let mut a = peer();
        a.name = "a".into();
        a.target = PeerTarget::Address("127.0.0.1".parse().unwrap());
        // Port 9 (discard) is closed: the sessions keep retrying, which is all this test needs.
        a.port = 9;
        a.router_id = Some("192.0.2.254".parse().unwrap());
        let mut b = a.clone();
        b.name = "b".into();
        let settings = |p: &Peer| PeerSettings::from_peer(p, &addrs, None).unwrap();
        let mut d = Driver::new(Arc::new(NoObserver));
        assert!(
            d.apply(
                [
                    ("a".to_string(), (settings(&a), AdjRibOut::new())),
                    ("b".to_string(), (settings(&b), AdjRibOut::new())),
                ]
                .into(),
            )
            .is_empty()
        );
        let ids = |d: &Driver| -> Vec<tokio::task::Id> {
            d.peers.values().map(|h| h.task.id()).collect()
        };
        let before = ids(&d);
        let routes: AdjRibOut = [("192.0.2.1/32".parse().unwrap(), Default::default())].into();
        b.hold_time = Duration::from_secs(30);
        b.keepalive_time = Duration::from_secs(10);
        assert!(
            d.apply(
                [
                    ("a".to_string(), (settings(&a), routes)),
                    ("b".to_string(), (settings(&b), AdjRibOut::new())),
                ]
                .into(),
            )
            .is_empty()
        );
        let after = ids(&d);
        assert_eq!(before[0], after[0], "peer a was restarted");
        assert_ne!(before[1], after[1], "peer b kept its old settings");
        assert!(d.apply(BTreeMap::new()).is_empty());
        assert!(d.status().is_empty());
        d.shutdown(Duration::from_secs(1)).await;
    }

    /// A BGPPeer edit replaces the session; the new one connects only once the peer has closed
    /// the old connection (after reading its Cease), so the peer never sees the new connection
    /// beside an Established one: that looks like a connection collision, which FRR 8.4 with
    /// dynamic neighbours left half-dead for minutes in the lab.
    #[tokio::test]
    async fn a_replaced_session_connects_once_the_old_connection_is_closed() {
        use tokio::io::AsyncReadExt as _;
        let router = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut p = peer();
        p.password = None;
        p.target = PeerTarget::Address("127.0.0.1".parse().unwrap());
        p.port = router.local_addr().unwrap().port();
        p.router_id = Some("192.0.2.254".parse().unwrap());
        let addrs: Vec<IpAddr> = vec!["127.0.0.1".parse().unwrap()];
        let desired = |p: &Peer| {
            let settings = PeerSettings::from_peer(p, &addrs, None).unwrap();
            BTreeMap::from([("r".to_string(), (settings, AdjRibOut::new()))])
        };
        let accept = || async {
            tokio::time::timeout(Duration::from_secs(10), router.accept())
                .await
                .expect("no connection from the session")
                .unwrap()
                .0
        };
        let mut d = Driver::new(Arc::new(NoObserver));
        assert!(d.apply(desired(&p)).is_empty());
        let mut old = accept().await;
        // Our OPEN, then (after the edit) our Cease and our half-close.
        let mut seen = Vec::new();
        let mut chunk = [0u8; 4096];
        let mut edited = false;
        loop {
            let n = tokio::time::timeout(Duration::from_secs(10), old.read(&mut chunk))
                .await
                .expect("the old session neither sent nor closed")
                .unwrap();
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&chunk[..n]);
            if !edited && seen.len() >= 19 {
                edited = true;
                p.hold_time = Duration::from_secs(30);
                p.keepalive_time = Duration::from_secs(10);
                assert!(d.apply(desired(&p)).is_empty());
            }
        }
        assert!(edited, "no OPEN: {seen:?}");
        let open_len = usize::from(u16::from_be_bytes([seen[16], seen[17]]));
        assert_eq!(
            seen.get(open_len + 18),
            Some(&3),
            "no NOTIFICATION: {seen:?}"
        );
        // The old connection is still open on our side: the new session waits.
        let early = tokio::time::timeout(Duration::from_millis(500), router.accept()).await;
        assert!(
            early.is_err(),
            "the new session connected beside the old connection"
        );
        drop(old);
        let mut new = accept().await;
        let n = tokio::time::timeout(Duration::from_secs(10), new.read(&mut chunk))
            .await
            .expect("no OPEN on the new connection")
            .unwrap();
        assert!(n >= 19 && chunk[18] == 1, "no OPEN: {:?}", &chunk[..n]);
        d.shutdown(Duration::from_secs(1)).await;
    }

    /// Connects to `to` from `from` (signed with the TCP MD5 `key`, if any) and reads what the
    /// other side sends first (at most 2 s each for connecting and reading).
    async fn connect(from: &str, to: SocketAddr, key: Option<&str>) -> Vec<u8> {
        use tokio::io::AsyncReadExt as _;
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(SocketAddr::new(from.parse().unwrap(), 0))
            .unwrap();
        if let Some(key) = key {
            socket::set_md5(&socket, to.ip(), key).unwrap();
        }
        let mut stream = tokio::time::timeout(Duration::from_secs(2), socket.connect(to))
            .await
            .expect("the connection was not accepted")
            .unwrap();
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut buf))
            .await
            .expect("neither data nor close")
            .unwrap_or(0);
        buf.truncate(n);
        buf
    }

    /// Connects unsigned (see [`connect`]).
    async fn connect_from(from: &str, to: SocketAddr) -> Vec<u8> {
        connect(from, to, None).await
    }

    /// A connection from the peer's address gets our OPEN; one from any other address is
    /// closed at once.
    #[tokio::test]
    async fn listener_takes_connections_from_peers_only() {
        let mut p = peer();
        p.target = PeerTarget::Address("127.0.0.2".parse().unwrap());
        // Nothing listens there: our own attempts fail, only the peer's connection works.
        p.port = 9;
        p.router_id = Some("192.0.2.254".parse().unwrap());
        p.password = None;
        let mut d = Driver::new(Arc::new(NoObserver));
        assert!(d.listen(&["127.0.0.1:0".parse().unwrap()]).is_empty());
        let at = d.listening()[0];
        assert!(
            d.apply(
                [(
                    "r".to_string(),
                    (
                        PeerSettings::from_peer(&p, &[], None).unwrap(),
                        AdjRibOut::new(),
                    ),
                )]
                .into(),
            )
            .is_empty()
        );
        assert!(
            connect_from("127.0.0.3", at).await.is_empty(),
            "a stranger was not closed"
        );
        let first = connect_from("127.0.0.2", at).await;
        assert_eq!(first.get(18), Some(&1), "no OPEN for the peer: {first:?}");
        d.shutdown(Duration::from_secs(1)).await;
    }

    /// Connects signed with the TCP MD5 `key` (see [`connect`]).
    async fn connect_signed(from: &str, to: SocketAddr, key: &str) -> Vec<u8> {
        connect(from, to, Some(key)).await
    }

    /// Issue #14 item 5: a peer whose MD5 key cannot be installed (81 bytes: Linux takes 80)
    /// is not started, not dialled, and its unsigned connections are closed; once its key is
    /// fixed, the next `apply` starts it and its signed connection gets our OPEN.
    #[tokio::test]
    async fn a_key_that_cannot_be_installed_keeps_the_peer_out() {
        // The "router": it must never see a connection from the refused peer.
        let router = std::net::TcpListener::bind("127.0.0.2:0").unwrap();
        router.set_nonblocking(true).unwrap();
        let mut p = peer();
        p.target = PeerTarget::Address("127.0.0.2".parse().unwrap());
        p.port = router.local_addr().unwrap().port();
        p.router_id = Some("192.0.2.254".parse().unwrap());
        let good = PeerSettings::from_peer(&p, &[], None).unwrap();
        // What a Secret could bring or a kernel could refuse, past `from_peer`'s own check.
        let mut bad = good.clone();
        bad.connect.password = Some("k".repeat(socket::MD5_MAX_KEY_LEN + 1));
        let mut d = Driver::new(Arc::new(NoObserver));
        assert!(d.listen(&["127.0.0.1:0".parse().unwrap()]).is_empty());
        let at = d.listening()[0];

        let refused = d.apply([("r".to_string(), (bad, AdjRibOut::new()))].into());
        let e = refused.get("r").expect("the peer was started");
        assert!(
            e.to_string().contains("127.0.0.2") && e.to_string().contains("81 bytes"),
            "{e}"
        );
        assert!(d.status().is_empty(), "a session runs for the refused peer");
        assert!(
            connect_from("127.0.0.2", at).await.is_empty(),
            "the refused peer's unsigned connection was taken"
        );
        assert_eq!(
            router.accept().map_err(|e| e.kind()).err(),
            Some(io::ErrorKind::WouldBlock),
            "the refused peer was dialled"
        );

        // The configuration changes: tried again, installed, started.
        assert!(
            d.apply([("r".to_string(), (good, AdjRibOut::new()))].into())
                .is_empty()
        );
        assert!(d.status().contains_key("r"));
        let first = connect_signed("127.0.0.2", at, "pw").await;
        assert_eq!(first.get(18), Some(&1), "no OPEN for the peer: {first:?}");
        d.shutdown(Duration::from_secs(1)).await;
    }

    /// A taken port is reported and the driver keeps working without a listener.
    #[tokio::test]
    async fn listen_on_a_taken_port_is_reported() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let at = taken.local_addr().unwrap();
        let mut d = Driver::new(Arc::new(NoObserver));
        let failed = d.listen(&[at]);
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].1.kind(), io::ErrorKind::AddrInUse);
        assert!(d.listening().is_empty());
        let mut p = peer();
        p.target = PeerTarget::Address("127.0.0.1".parse().unwrap());
        p.port = at.port();
        p.router_id = Some("192.0.2.254".parse().unwrap());
        p.password = None;
        assert!(
            d.apply(
                [(
                    "r".to_string(),
                    (
                        PeerSettings::from_peer(&p, &[], None).unwrap(),
                        AdjRibOut::new(),
                    ),
                )]
                .into(),
            )
            .is_empty()
        );
        // Our own connection still goes out (to the listener that holds the port).
        let (_conn, _) = tokio::time::timeout(Duration::from_secs(5), async {
            taken.set_nonblocking(true).unwrap();
            let l = tokio::net::TcpListener::from_std(taken).unwrap();
            l.accept().await.unwrap()
        })
        .await
        .expect("the driver did not connect");
        d.shutdown(Duration::from_secs(1)).await;
    }

    /// An unnumbered peer needs its link-local address first; found, its session dials that
    /// address on that interface, carries both families with the extended next hop and no
    /// global next hop, and keeps `dynamicASN`.
    #[test]
    fn settings_of_an_unnumbered_peer() {
        let addrs: Vec<IpAddr> = vec![
            "198.18.0.11".parse().unwrap(),
            "fd00:18::b".parse().unwrap(),
        ];
        let mut p = peer();
        p.target = PeerTarget::Interface("eth1".into());
        p.peer_asn = PeerAsn::External;
        assert_eq!(
            PeerSettings::from_peer(&p, &addrs, None),
            Err(SettingsError::NotFoundOnLink("eth1".into()))
        );
        let on_link = OnLink {
            address: "fe80::1".parse().unwrap(),
            interface_index: 7,
        };
        let s = PeerSettings::from_peer_on_link(&p, on_link, &addrs, None).unwrap();
        assert_eq!(s.connect.peer, "[fe80::1%7]:179".parse().unwrap());
        assert_eq!(s.connect.ttl, 1, "directly connected eBGP");
        assert_eq!(
            s.fsm.families,
            vec![AfiSafi::IPV4_UNICAST, AfiSafi::IPV6_UNICAST]
        );
        assert!(s.fsm.extended_next_hop);
        assert_eq!(s.fsm.peer_as, PeerAs::External);
        assert_eq!(s.fsm.bgp_id, "198.18.0.11".parse::<Ipv4Addr>().unwrap());
        assert_eq!((s.node_ipv4, s.node_ipv6), (None, None));
        // sourceAddress does not apply: the session runs from the link-local address.
        p.source_address = Some("198.18.0.11".parse().unwrap());
        let s = PeerSettings::from_peer_on_link(&p, on_link, &addrs, None).unwrap();
        assert_eq!(s.connect.source, None);
        // A numbered peer never offers the extended next hop.
        assert!(
            !PeerSettings::from_peer(&peer(), &addrs, None)
                .unwrap()
                .fsm
                .extended_next_hop
        );
    }

    #[test]
    fn settings_from_peer() {
        let addrs: Vec<IpAddr> = vec!["198.18.0.1".parse().unwrap(), "fd00:18::1".parse().unwrap()];
        let s = PeerSettings::from_peer(&peer(), &addrs, None).unwrap();
        assert_eq!(s.connect.ttl, 1);
        assert_eq!(s.fsm.bgp_id, "198.18.0.1".parse::<Ipv4Addr>().unwrap());
        assert_eq!(s.connect.password.as_deref(), Some("pw"));
        assert_eq!(s.node_ipv6, Some("fd00:18::1".parse().unwrap()));
        let mut p = peer();
        p.ebgp_multi_hop = true;
        p.router_id = Some("10.0.0.1".parse().unwrap());
        p.local_asn = Some(65000);
        let s = PeerSettings::from_peer(&p, &[], None).unwrap();
        assert_eq!(s.connect.ttl, 255);
        assert_eq!(s.fsm.local_as, 65000);
        assert_eq!(
            PeerSettings::from_peer(&peer(), &[], None),
            Err(SettingsError::NoRouterId)
        );
        let mut p = peer();
        p.password = Some(PeerPassword::Secret {
            name: "s".into(),
            namespace: "n".into(),
        });
        assert!(matches!(
            PeerSettings::from_peer(&p, &addrs, None),
            Err(SettingsError::SecretUnresolved(_))
        ));
        assert_eq!(
            PeerSettings::from_peer(&p, &addrs, Some(&"x".repeat(81))),
            Err(SettingsError::PasswordTooLong {
                what: "the password of passwordSecret \"s\"".into(),
                len: 81
            })
        );
        assert!(
            PeerSettings::from_peer(&p, &addrs, Some(&"x".repeat(80))).is_ok(),
            "80 bytes is the longest key Linux takes"
        );
        // Families as MetalLB sets them in FRR: the session's own, both with
        // dualStackAddressFamily.
        assert_eq!(
            PeerSettings::from_peer(&peer(), &addrs, None)
                .unwrap()
                .fsm
                .families,
            vec![AfiSafi::IPV4_UNICAST]
        );
        let mut v6 = peer();
        v6.target = PeerTarget::Address("fd00:18::fe".parse().unwrap());
        assert_eq!(
            PeerSettings::from_peer(&v6, &addrs, None)
                .unwrap()
                .fsm
                .families,
            vec![AfiSafi::IPV6_UNICAST]
        );
        v6.dual_stack_address_family = true;
        assert_eq!(
            PeerSettings::from_peer(&v6, &addrs, None)
                .unwrap()
                .fsm
                .families,
            vec![AfiSafi::IPV4_UNICAST, AfiSafi::IPV6_UNICAST]
        );
        // A VRF binds the socket; an empty name is the default VRF.
        let mut red = peer();
        red.vrf = Some("red".into());
        assert_eq!(
            PeerSettings::from_peer(&red, &addrs, None)
                .unwrap()
                .connect
                .vrf
                .as_deref(),
            Some("red")
        );
        red.vrf = Some(String::new());
        assert_eq!(
            PeerSettings::from_peer(&red, &addrs, None)
                .unwrap()
                .connect
                .vrf,
            None
        );
        let mut p2 = peer();
        p2.password = Some(PeerPassword::Plain("é".repeat(41)));
        let e = PeerSettings::from_peer(&p2, &addrs, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "spec.password is 82 bytes; a TCP MD5 key is at most 80 bytes (Linux TCP_MD5SIG_MAXKEYLEN)"
        );
        // An empty password is none (as MetalLB), not a zero-length key.
        p2.password = Some(PeerPassword::Plain(String::new()));
        assert_eq!(
            PeerSettings::from_peer(&p2, &addrs, None)
                .unwrap()
                .connect
                .password,
            None
        );
        assert_eq!(
            PeerSettings::from_peer(&p, &addrs, Some("x"))
                .unwrap()
                .connect
                .password
                .as_deref(),
            Some("x")
        );
    }
}
