//! The passive side: listening sockets (port 179 by default) that hand each connection to the
//! session of the peer it comes from, by source address (and interface, for a link-local one),
//! and close any other at once.
//!
//! TCP MD5 keys are installed on each listening socket per peer address (`TCP_MD5SIG` with the
//! peer's address), so the kernel checks the peer's SYN before anything is accepted and the
//! accepted socket inherits the key.
//!
//! Fail closed: a socket hands a peer's connections on only while that peer's key is installed
//! on that very socket. A key the kernel refuses (longer than 80 bytes, kernel without TCP MD5,
//! out of option memory) would otherwise leave the socket accepting the peer's *unsigned*
//! connections; instead the peer is reported back to the driver, which does not run it.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::socket;

/// Where a connection from one peer address goes.
#[derive(Clone, Debug)]
pub(super) struct Target {
    /// BGPPeer name, for logs.
    pub name: String,
    /// TTL / hop limit of our packets on that connection.
    pub ttl: u8,
    /// The local address the peer must have connected to (`sourceAddress`), if set.
    pub source: Option<IpAddr>,
    /// The peer's TCP MD5 key, if it has one.
    pub key: Option<String>,
    /// The session's task.
    pub tx: mpsc::Sender<TcpStream>,
}

/// Who a connection comes from: the peer's address and, for a link-local address (an
/// unnumbered peer), the interface it is on, since the same `fe80::` address may be on
/// several links. IPv4-mapped IPv6 addresses count as IPv4.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct PeerKey {
    /// The address.
    pub ip: IpAddr,
    /// The interface index of a link-local address; 0 otherwise.
    pub scope: u32,
}

impl PeerKey {
    /// The key of a peer at `address` (its scope id names the interface of a link-local one).
    pub(super) fn of(address: SocketAddr) -> Self {
        match address {
            SocketAddr::V6(v6) if v6.ip().is_unicast_link_local() => PeerKey {
                ip: IpAddr::V6(*v6.ip()),
                scope: v6.scope_id(),
            },
            other => PeerKey {
                ip: other.ip().to_canonical(),
                scope: 0,
            },
        }
    }
}

impl fmt::Display for PeerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.scope {
            0 => write!(f, "{}", self.ip),
            scope => write!(f, "{}%{scope}", self.ip),
        }
    }
}

type Targets = Arc<Mutex<BTreeMap<PeerKey, Target>>>;

/// One listening socket.
struct Sock {
    address: SocketAddr,
    listener: Arc<TcpListener>,
    /// Who this socket hands connections to: only peers whose key, if they have one, is
    /// installed on this socket.
    targets: Targets,
    /// MD5 keys installed on this socket, by peer.
    keys: BTreeMap<PeerKey, String>,
    task: JoinHandle<()>,
}

/// A peer's key that a listening socket refused.
#[derive(Debug)]
pub(super) struct Refused {
    /// The listening socket.
    pub listener: SocketAddr,
    /// What `setsockopt` said.
    pub error: io::Error,
}

/// All listening sockets of a driver.
pub(super) struct Listener {
    sockets: Vec<Sock>,
}

impl Listener {
    pub(super) fn new() -> Self {
        Self {
            sockets: Vec::new(),
        }
    }

    /// Opens a listening socket on `address` (IPv6 sockets take IPv6 only: list one address
    /// per family) and starts accepting. It hands nothing on until the next [`Self::update`]
    /// has installed the peers' keys on it. Must be called within a tokio runtime.
    pub(super) fn bind(&mut self, address: SocketAddr) -> io::Result<()> {
        let socket = Socket::new(
            Domain::for_address(address),
            Type::STREAM,
            Some(Protocol::TCP),
        )?;
        if address.is_ipv6() {
            socket.set_only_v6(true)?;
        }
        socket.set_reuse_address(true)?;
        socket.set_nonblocking(true)?;
        socket.bind(&address.into())?;
        socket.listen(128)?;
        let listener = Arc::new(TcpListener::from_std(socket.into())?);
        let targets = Targets::default();
        let task = tokio::spawn(accept_loop(listener.clone(), targets.clone()));
        self.sockets.push(Sock {
            address,
            listener,
            targets,
            keys: BTreeMap::new(),
            task,
        });
        Ok(())
    }

    /// Sets who may connect (peer address → session, with the peer's MD5 key) and installs,
    /// changes or deletes the keys on every socket of the peer's family. Returns the peer
    /// addresses whose key some socket refused: those are taken off every socket (no socket
    /// accepts them, signed or not) until a later update installs their key.
    pub(super) fn update(
        &mut self,
        targets: &BTreeMap<PeerKey, Target>,
    ) -> BTreeMap<PeerKey, Refused> {
        let mut refused: BTreeMap<PeerKey, Refused> = BTreeMap::new();
        for sock in &mut self.sockets {
            let same_family = sock.address.is_ipv4();
            for (peer, target) in targets
                .iter()
                .filter(|(p, _)| p.ip.is_ipv4() == same_family)
            {
                let Some(key) = &target.key else {
                    continue;
                };
                if refused.contains_key(peer) || sock.keys.get(peer) == Some(key) {
                    continue;
                }
                // The kernel matches a key by address on any interface.
                match socket::set_md5(&*sock.listener, peer.ip, key) {
                    Ok(()) => {
                        sock.keys.insert(*peer, key.clone());
                    }
                    Err(error) => {
                        refused.insert(
                            *peer,
                            Refused {
                                listener: sock.address,
                                error,
                            },
                        );
                    }
                }
            }
        }
        for sock in &mut self.sockets {
            // Keys of peers that are gone, have no key any more, or were refused elsewhere
            // (so no socket keeps half of a refused peer's keys).
            let stale: Vec<PeerKey> = sock
                .keys
                .keys()
                .filter(|p| {
                    refused.contains_key(p) || targets.get(p).is_none_or(|t| t.key.is_none())
                })
                .copied()
                .collect();
            for peer in stale {
                // A zero-length key deletes the peer's key.
                if let Err(e) = socket::set_md5(&*sock.listener, peer.ip, "") {
                    tracing::debug!(address = %sock.address, %peer, error = %e, "cannot remove a TCP MD5 key from the BGP listener");
                }
                sock.keys.remove(&peer);
            }
            let taken: BTreeMap<PeerKey, Target> = targets
                .iter()
                .filter(|(p, t)| {
                    p.ip.is_ipv4() == sock.address.is_ipv4()
                        && !refused.contains_key(p)
                        && t.key.as_ref().is_none_or(|k| sock.keys.get(p) == Some(k))
                })
                .map(|(p, t)| (*p, t.clone()))
                .collect();
            if let Ok(mut t) = sock.targets.lock() {
                *t = taken;
            }
        }
        refused
    }

    /// The addresses listened on.
    pub(super) fn addresses(&self) -> Vec<SocketAddr> {
        self.sockets
            .iter()
            .filter_map(|s| s.listener.local_addr().ok())
            .collect()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        for sock in &self.sockets {
            sock.task.abort();
        }
    }
}

async fn accept_loop(listener: Arc<TcpListener>, targets: Targets) {
    loop {
        let (stream, from) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors and the like: wait a little instead of spinning.
                tracing::warn!(error = %e, "BGP listener cannot accept");
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                continue;
            }
        };
        let peer = PeerKey::of(from);
        let target = targets.lock().ok().and_then(|t| t.get(&peer).cloned());
        let Some(target) = target else {
            tracing::debug!(%from, "closing a BGP connection from an address that is no peer");
            continue;
        };
        let local = stream.local_addr().map(|a| a.ip().to_canonical());
        if let Some(source) = target.source
            && local.as_ref().ok() != Some(&source)
        {
            tracing::debug!(%from, peer = %target.name, ?local, %source, "closing a BGP connection to another address than the peer's sourceAddress");
            continue;
        }
        if let Err(e) =
            socket::set_ttl(&stream, peer.ip, target.ttl).and_then(|()| stream.set_nodelay(true))
        {
            tracing::debug!(%from, error = %e, "accepted BGP connection is gone");
            continue;
        }
        if target.tx.try_send(stream).is_err() {
            tracing::debug!(%from, peer = %target.name, "the session is not taking connections");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Duration;

    use super::*;

    const PEER: &str = "127.0.0.2";

    fn target(key: Option<String>) -> (Target, mpsc::Receiver<TcpStream>) {
        let (tx, rx) = mpsc::channel(4);
        let target = Target {
            name: "r".into(),
            ttl: 255,
            source: None,
            key,
            tx,
        };
        (target, rx)
    }

    /// Connects from the peer's address to `to`, signed with `key` if any. None: the
    /// connection did not come up within 300 ms (the kernel dropped the SYN).
    async fn connect(to: SocketAddr, key: Option<&str>) -> Option<TcpStream> {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(SocketAddr::new(PEER.parse().unwrap(), 0))
            .unwrap();
        if let Some(key) = key {
            socket::set_md5(&socket, to.ip(), key).unwrap();
        }
        tokio::time::timeout(Duration::from_millis(300), socket.connect(to))
            .await
            .ok()
            .map(Result::unwrap)
    }

    /// Whether the listener handed a connection to the session within 300 ms.
    async fn handed_on(rx: &mut mpsc::Receiver<TcpStream>) -> bool {
        tokio::time::timeout(Duration::from_millis(300), rx.recv())
            .await
            .is_ok_and(|s| s.is_some())
    }

    /// A key the socket refuses is reported and the peer's connections, unsigned as they then
    /// are, go nowhere; a key it takes is installed and only signed connections get through.
    #[tokio::test]
    async fn a_refused_key_takes_the_peer_off_the_socket() {
        let mut l = Listener::new();
        l.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let at = l.addresses()[0];
        let peer = PeerKey::of(SocketAddr::new(PEER.parse().unwrap(), 0));

        let (t, mut rx) = target(Some("k".repeat(socket::MD5_MAX_KEY_LEN + 1)));
        let refused = l.update(&[(peer, t)].into());
        let r = refused.get(&peer).expect("an 81-byte key was taken");
        assert_eq!(r.listener, "127.0.0.1:0".parse().unwrap());
        let _unsigned = connect(at, None).await.expect("no key: the kernel accepts");
        assert!(
            !handed_on(&mut rx).await,
            "an unsigned connection was handed on"
        );

        let (t, mut rx) = target(Some("pw".into()));
        assert!(l.update(&[(peer, t)].into()).is_empty());
        assert!(
            connect(at, None).await.is_none(),
            "the kernel took an unsigned SYN despite the key"
        );
        let _signed = connect(at, Some("pw")).await.expect("signed SYN dropped");
        assert!(
            handed_on(&mut rx).await,
            "the signed connection was not handed on"
        );

        // The peer drops its password: the key goes, unsigned connections are taken again.
        let (t, mut rx) = target(None);
        assert!(l.update(&[(peer, t)].into()).is_empty());
        let _unsigned = connect(at, None).await.expect("the old key is still there");
        assert!(handed_on(&mut rx).await);
    }

    /// A socket bound after the keys were set hands nothing on until an update has installed
    /// the keys on it too.
    #[tokio::test]
    async fn a_new_socket_takes_the_peer_only_with_its_key() {
        let mut l = Listener::new();
        l.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let peer = PeerKey::of(SocketAddr::new(PEER.parse().unwrap(), 0));
        let (t, mut rx) = target(Some("pw".into()));
        let targets = BTreeMap::from([(peer, t)]);
        assert!(l.update(&targets).is_empty());
        l.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let second = l.addresses()[1];
        // No key on the new socket yet: the unsigned connection comes up but is closed.
        let _unsigned = connect(second, None)
            .await
            .expect("no key yet on the new socket");
        assert!(!handed_on(&mut rx).await);
        assert!(l.update(&targets).is_empty());
        assert!(connect(second, None).await.is_none());
        let _signed = connect(second, Some("pw"))
            .await
            .expect("signed SYN dropped");
        assert!(handed_on(&mut rx).await);
    }

    /// A link-local peer is known by its address and interface; others by their address, an
    /// IPv4-mapped one as IPv4.
    #[test]
    fn peers_are_told_apart_by_address_and_link() {
        let on = |s: &str| PeerKey::of(s.parse().unwrap());
        assert_eq!(on("[fe80::1%3]:179").to_string(), "fe80::1%3");
        assert_ne!(on("[fe80::1%3]:179"), on("[fe80::1%4]:179"));
        assert_eq!(on("[fe80::1%3]:179"), on("[fe80::1%3]:40000"));
        assert_eq!(on("[::ffff:192.0.2.1]:179"), on("192.0.2.1:1"));
        assert_eq!(on("[fd00::1%3]:179").scope, 0);
        assert_eq!(on("[fd00::1%3]:179").to_string(), "fd00::1");
    }
}
