//! The passive side: listening sockets (port 179 by default) that hand each connection to the
//! session of the peer it comes from, by source address, and close any other at once.
//!
//! TCP MD5 keys are installed on each listening socket per peer address (`TCP_MD5SIG` with the
//! peer's address), so the kernel checks the peer's SYN before anything is accepted and the
//! accepted socket inherits the key.

use std::collections::BTreeMap;
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
    /// The session's task.
    pub tx: mpsc::Sender<TcpStream>,
}

type Targets = Arc<Mutex<BTreeMap<IpAddr, Target>>>;

/// All listening sockets of a driver.
pub(super) struct Listener {
    sockets: Vec<(SocketAddr, Arc<TcpListener>, JoinHandle<()>)>,
    targets: Targets,
    /// MD5 keys installed on the sockets, by peer address.
    keys: BTreeMap<IpAddr, String>,
}

impl Listener {
    pub(super) fn new() -> Self {
        Self {
            sockets: Vec::new(),
            targets: Arc::default(),
            keys: BTreeMap::new(),
        }
    }

    /// Opens a listening socket on `address` (IPv6 sockets take IPv6 only: list one address
    /// per family) and starts accepting. Must be called within a tokio runtime.
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
        for (peer, key) in &self.keys {
            if peer.is_ipv4() == address.is_ipv4() {
                socket::set_md5(&*listener, *peer, key)?;
            }
        }
        let task = tokio::spawn(accept_loop(listener.clone(), self.targets.clone()));
        self.sockets.push((address, listener, task));
        Ok(())
    }

    /// Sets who may connect (peer address → session) and the MD5 key of each peer address.
    pub(super) fn update(
        &mut self,
        targets: BTreeMap<IpAddr, Target>,
        keys: BTreeMap<IpAddr, String>,
    ) {
        if let Ok(mut t) = self.targets.lock() {
            *t = targets;
        }
        for (address, listener, _) in &self.sockets {
            let same_family = |peer: &IpAddr| peer.is_ipv4() == address.is_ipv4();
            for (peer, key) in keys.iter().filter(|(p, _)| same_family(p)) {
                if self.keys.get(peer) != Some(key)
                    && let Err(e) = socket::set_md5(&**listener, *peer, key)
                {
                    tracing::warn!(%address, %peer, error = %e, "cannot set the TCP MD5 key on the BGP listener");
                }
            }
            for peer in self
                .keys
                .keys()
                .filter(|p| same_family(p) && !keys.contains_key(p))
            {
                // A zero-length key deletes the peer's key.
                if let Err(e) = socket::set_md5(&**listener, *peer, "") {
                    tracing::debug!(%address, %peer, error = %e, "cannot remove a TCP MD5 key from the BGP listener");
                }
            }
        }
        self.keys = keys;
    }

    /// The addresses listened on.
    pub(super) fn addresses(&self) -> Vec<SocketAddr> {
        self.sockets
            .iter()
            .filter_map(|(_, l, _)| l.local_addr().ok())
            .collect()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        for (_, _, task) in &self.sockets {
            task.abort();
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
        let peer = from.ip().to_canonical();
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
            socket::set_ttl(&stream, peer, target.ttl).and_then(|()| stream.set_nodelay(true))
        {
            tracing::debug!(%from, error = %e, "accepted BGP connection is gone");
            continue;
        }
        if target.tx.try_send(stream).is_err() {
            tracing::debug!(%from, peer = %target.name, "the session is not taking connections");
        }
    }
}
