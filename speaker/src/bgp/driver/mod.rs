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

mod listen;
mod session;
pub mod socket;

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ferrolb_config::model::{Peer, PeerAsn, PeerPassword, PeerTarget};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

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
    /// `interface` (unnumbered BGP) is not supported yet.
    #[error("BGP unnumbered (spec.interface {0}) is not supported")]
    Unnumbered(String),
    /// No `routerID` and the node has no IPv4 address to use instead.
    #[error("no routerID set and the node has no IPv4 address to use as BGP identifier")]
    NoRouterId,
    /// `passwordSecret` must be resolved by the caller first.
    #[error("passwordSecret {0} is not resolved")]
    SecretUnresolved(String),
    /// VRFs are not supported yet.
    #[error("vrf {0} is not supported")]
    Vrf(String),
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
        let address = match &peer.target {
            PeerTarget::Address(a) => *a,
            PeerTarget::Interface(i) => return Err(SettingsError::Unnumbered(i.clone())),
        };
        if let Some(vrf) = peer.vrf.as_ref().filter(|v| !v.is_empty()) {
            return Err(SettingsError::Vrf(vrf.clone()));
        }
        let node_ipv4 = node_addresses.iter().find_map(|a| match a {
            IpAddr::V4(v4) if !v4.is_loopback() => Some(*v4),
            _ => None,
        });
        let node_ipv6 = node_addresses.iter().find_map(|a| match a {
            IpAddr::V6(v6) if !v6.is_loopback() && !v6.is_unicast_link_local() => Some(*v6),
            _ => None,
        });
        let bgp_id = peer
            .router_id
            .or(match peer.source_address {
                Some(IpAddr::V4(v4)) => Some(v4),
                _ => None,
            })
            .or(node_ipv4)
            .ok_or(SettingsError::NoRouterId)?;
        let password = match &peer.password {
            None => None,
            Some(PeerPassword::Plain(p)) => Some(p.clone()),
            Some(PeerPassword::Secret { name, .. }) => Some(
                secret
                    .ok_or_else(|| SettingsError::SecretUnresolved(name.clone()))?
                    .to_string(),
            ),
        };
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
            families: vec![AfiSafi::IPV4_UNICAST, AfiSafi::IPV6_UNICAST],
            graceful_restart_time: peer.graceful_restart.then_some(GRACEFUL_RESTART_TIME),
        };
        fsm.validate()?;
        Ok(Self {
            name: peer.name.clone(),
            connect: ConnectOptions {
                peer: SocketAddr::new(address, peer.port),
                source: peer.source_address,
                ttl,
                password,
            },
            fsm,
            node_ipv4,
            node_ipv6,
        })
    }
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
    routes: watch::Sender<Arc<AdjRibOut>>,
    status: watch::Receiver<PeerStatus>,
    stop: watch::Sender<bool>,
    /// Connections the peer opened to our listener.
    incoming: mpsc::Sender<tokio::net::TcpStream>,
    task: JoinHandle<()>,
}

/// All sessions of this node.
pub struct Driver {
    peers: BTreeMap<String, Handle>,
    observer: Arc<dyn Observer>,
    listener: listen::Listener,
}

impl Driver {
    /// A driver without sessions. It only connects to its peers until [`Driver::listen`].
    pub fn new(observer: Arc<dyn Observer>) -> Self {
        Self {
            peers: BTreeMap::new(),
            observer,
            listener: listen::Listener::new(),
        }
    }

    /// Also accepts the peers' connections on `addresses` (usually [`DEFAULT_LISTEN`]; an IPv6
    /// address listens for IPv6 only). An address that cannot be bound (port 179 taken, no
    /// such address) is logged and skipped: the sessions then rely on their own connections.
    /// Returns those failures. Must be called within a tokio runtime.
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
        self.update_listener();
        failed
    }

    /// The addresses [`Driver::listen`] listens on (with the port the kernel chose for 0).
    pub fn listening(&self) -> Vec<SocketAddr> {
        self.listener.addresses()
    }

    /// Tells the listener who may connect and with which MD5 key. With several peers at one
    /// address, connections go to the first by name.
    fn update_listener(&mut self) {
        let mut targets = BTreeMap::new();
        let mut keys = BTreeMap::new();
        for (name, h) in &self.peers {
            let c = &h.settings.connect;
            let address = c.peer.ip().to_canonical();
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
                    tx: h.incoming.clone(),
                },
            );
            if let Some(password) = &c.password {
                keys.insert(address, password.clone());
            }
        }
        self.listener.update(targets, keys);
    }

    /// Brings the sessions to `desired` (by BGPPeer name: settings and routes). Must be called
    /// within a tokio runtime.
    pub fn apply(&mut self, desired: BTreeMap<String, (PeerSettings, AdjRibOut)>) {
        let gone: Vec<String> = self
            .peers
            .iter()
            .filter(|(name, h)| desired.get(*name).is_none_or(|(s, _)| *s != h.settings))
            .map(|(name, _)| name.clone())
            .collect();
        for name in gone {
            if let Some(h) = self.peers.remove(&name) {
                tracing::info!(peer = %name, "stopping BGP session");
                let _ = h.stop.send(true);
                self.observer.session_up(&name, false);
            }
        }
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
            tracing::info!(peer = %name, address = %settings.connect.peer, "starting BGP session");
            let (routes_tx, routes_rx) = watch::channel(routes);
            let (status_tx, status_rx) = watch::channel(PeerStatus::default());
            let (stop_tx, stop_rx) = watch::channel(false);
            let (incoming_tx, incoming_rx) = mpsc::channel(4);
            let task = tokio::spawn(session::run(
                settings.clone(),
                routes_rx,
                status_tx,
                stop_rx,
                incoming_rx,
                self.observer.clone(),
            ));
            self.peers.insert(
                name,
                Handle {
                    settings,
                    routes: routes_tx,
                    status: status_rx,
                    stop: stop_tx,
                    incoming: incoming_tx,
                    task,
                },
            );
        }
        self.update_listener();
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
        let mut tasks = Vec::new();
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
        d.apply(
            [
                ("a".to_string(), (settings(&a), AdjRibOut::new())),
                ("b".to_string(), (settings(&b), AdjRibOut::new())),
            ]
            .into(),
        );
        let ids = |d: &Driver| -> Vec<tokio::task::Id> {
            d.peers.values().map(|h| h.task.id()).collect()
        };
        let before = ids(&d);
        let routes: AdjRibOut = [("192.0.2.1/32".parse().unwrap(), Default::default())].into();
        b.hold_time = Duration::from_secs(30);
        b.keepalive_time = Duration::from_secs(10);
        d.apply(
            [
                ("a".to_string(), (settings(&a), routes)),
                ("b".to_string(), (settings(&b), AdjRibOut::new())),
            ]
            .into(),
        );
        let after = ids(&d);
        assert_eq!(before[0], after[0], "peer a was restarted");
        assert_ne!(before[1], after[1], "peer b kept its old settings");
        d.apply(BTreeMap::new());
        assert!(d.status().is_empty());
        d.shutdown(Duration::from_secs(1)).await;
    }

    /// Connects to `to` from `from` and reads what the other side sends first (at most 2 s).
    async fn connect_from(from: &str, to: SocketAddr) -> Vec<u8> {
        use tokio::io::AsyncReadExt as _;
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(SocketAddr::new(from.parse().unwrap(), 0))
            .unwrap();
        let mut stream = socket.connect(to).await.unwrap();
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut buf))
            .await
            .expect("neither data nor close")
            .unwrap_or(0);
        buf.truncate(n);
        buf
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
        d.apply(
            [(
                "r".to_string(),
                (
                    PeerSettings::from_peer(&p, &[], None).unwrap(),
                    AdjRibOut::new(),
                ),
            )]
            .into(),
        );
        assert!(
            connect_from("127.0.0.3", at).await.is_empty(),
            "a stranger was not closed"
        );
        let first = connect_from("127.0.0.2", at).await;
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
        d.apply(
            [(
                "r".to_string(),
                (
                    PeerSettings::from_peer(&p, &[], None).unwrap(),
                    AdjRibOut::new(),
                ),
            )]
            .into(),
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
            PeerSettings::from_peer(&p, &addrs, Some("x"))
                .unwrap()
                .connect
                .password
                .as_deref(),
            Some("x")
        );
    }
}
