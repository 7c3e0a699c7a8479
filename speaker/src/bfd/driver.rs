//! The BFD driver: one tokio task that owns this node's BFD sessions ([`Table`]), their sending
//! sockets and their timers, fed by one reader task per listening socket.
//!
//! [`Bfd::apply`] takes the whole desired set of sessions: new ones start, changed profiles are
//! applied with a poll sequence (the session stays Up), removed ones say AdminDown once and go.
//! Each session's [`Status`] is published on a watch channel ([`Bfd::status`]), which the BGP
//! sessions follow ([`super::follow`]).

use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrolb_bfd::packet::{Diagnostic, State};
use ferrolb_bfd::session::Action;
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::socket::{self, Listener};
use super::table::{Datagram, Refused, Table};
use super::{SessionKey, Settings, Status, state_name};

/// Where the driver listens and sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Addresses to listen on (each on both ports); usually every IPv4 and every IPv6 address.
    pub listen: Vec<IpAddr>,
    /// Single-hop port (RFC 5881: 3784).
    pub single_hop_port: u16,
    /// Multihop port (RFC 5883: 4784).
    pub multihop_port: u16,
    /// The ports sessions send from (RFC 5881: 49152–65535).
    pub source_ports: RangeInclusive<u16>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            listen: vec![
                IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            ],
            single_hop_port: ferrolb_bfd::SINGLE_HOP_PORT,
            multihop_port: ferrolb_bfd::MULTIHOP_PORT,
            source_ports: ferrolb_bfd::SOURCE_PORTS,
        }
    }
}

/// Told about packets and state changes (the binary turns them into metrics and Events).
pub trait Observer: Send + Sync + 'static {
    /// A control packet of `key` was accepted.
    fn packet_in(&self, key: &SessionKey);
    /// A control packet of `key` was sent.
    fn packet_out(&self, key: &SessionKey);
    /// The session of `key` changed state.
    fn state_changed(&self, key: &SessionKey, from: State, to: State, diagnostic: Diagnostic);
    /// A datagram was dropped before reaching a session.
    fn refused(&self, from: IpAddr, why: &Refused);
}

/// An observer that ignores everything.
pub struct NoObserver;

impl Observer for NoObserver {
    fn packet_in(&self, _: &SessionKey) {}
    fn packet_out(&self, _: &SessionKey) {}
    fn state_changed(&self, _: &SessionKey, _: State, _: State, _: Diagnostic) {}
    fn refused(&self, _: IpAddr, _: &Refused) {}
}

enum Command {
    Apply {
        desired: BTreeMap<SessionKey, Settings>,
        /// The status channels of the sessions new in `desired`.
        new: Vec<(SessionKey, watch::Sender<Status>)>,
    },
    Shutdown,
}

/// A datagram from a reader task.
struct Received {
    bytes: Vec<u8>,
    from: SocketAddr,
    ttl: Option<u8>,
    interface: Option<u32>,
    multihop: bool,
}

/// This node's BFD sessions.
pub struct Bfd {
    commands: mpsc::UnboundedSender<Command>,
    sessions: BTreeMap<SessionKey, (Settings, watch::Receiver<Status>)>,
    listening: Vec<SocketAddr>,
    task: JoinHandle<()>,
    readers: Vec<JoinHandle<()>>,
}

impl Bfd {
    /// Starts the driver, listening on `options.listen` on both ports. Returns the addresses
    /// that could not be bound (logged; sessions to peers on the others still work). Must be
    /// called within a tokio runtime.
    pub fn start(
        options: Options,
        observer: Arc<dyn Observer>,
    ) -> (Bfd, Vec<(SocketAddr, io::Error)>) {
        let (datagrams_tx, datagrams_rx) = mpsc::channel(1024);
        let mut failed = Vec::new();
        let mut readers = Vec::new();
        let mut listening = Vec::new();
        for ip in &options.listen {
            for (port, multihop) in [
                (options.single_hop_port, false),
                (options.multihop_port, true),
            ] {
                let address = SocketAddr::new(*ip, port);
                match Listener::bind(address) {
                    Ok(l) => {
                        listening.push(l.local_addr().unwrap_or(address));
                        readers.push(tokio::spawn(read(l, multihop, datagrams_tx.clone())));
                    }
                    Err(e) => {
                        tracing::warn!(%address, error = %e, "cannot listen for BFD");
                        failed.push((address, e));
                    }
                }
            }
        }
        let seed = std::collections::hash_map::RandomState::new().hash_one(Instant::now());
        let (commands, commands_rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(
            Task {
                table: Table::new(seed),
                out: BTreeMap::new(),
                options,
                observer,
                next_port: seed as u16,
            },
            commands_rx,
            datagrams_rx,
        ));
        (
            Bfd {
                commands,
                sessions: BTreeMap::new(),
                listening,
                task,
                readers,
            },
            failed,
        )
    }

    /// The addresses listened on (with the ports the kernel chose for 0).
    pub fn listening(&self) -> &[SocketAddr] {
        &self.listening
    }

    /// Brings the sessions to `desired`.
    pub fn apply(&mut self, desired: BTreeMap<SessionKey, Settings>) {
        let unchanged = desired.len() == self.sessions.len()
            && desired
                .iter()
                .all(|(k, s)| self.sessions.get(k).is_some_and(|(have, _)| have == s));
        if unchanged {
            return;
        }
        self.sessions.retain(|k, _| desired.contains_key(k));
        let mut new = Vec::new();
        for (key, settings) in &desired {
            match self.sessions.get_mut(key) {
                Some((have, _)) => *have = *settings,
                None => {
                    let (tx, rx) = watch::channel(Status::default());
                    new.push((*key, tx));
                    self.sessions.insert(*key, (*settings, rx));
                }
            }
        }
        let _ = self.commands.send(Command::Apply { desired, new });
    }

    /// The status channel of the session of `key`.
    pub fn status(&self, key: &SessionKey) -> Option<watch::Receiver<Status>> {
        self.sessions.get(key).map(|(_, rx)| rx.clone())
    }

    /// Every session's status now.
    pub fn statuses(&self) -> BTreeMap<SessionKey, Status> {
        self.sessions
            .iter()
            .map(|(k, (_, rx))| (*k, *rx.borrow()))
            .collect()
    }

    /// Says AdminDown on every session (so that peers do not take it for a failure) and
    /// stops, waiting at most `limit`.
    pub async fn shutdown(self, limit: Duration) {
        let _ = self.commands.send(Command::Shutdown);
        let _ = tokio::time::timeout(limit, self.task).await;
        for r in self.readers {
            r.abort();
        }
    }
}

/// Reads datagrams from one listener into the driver's queue (dropped when it is full: BFD
/// takes losses, and a flood must not grow memory).
async fn read(listener: Listener, multihop: bool, to: mpsc::Sender<Received>) {
    let mut buf = vec![0u8; 512];
    loop {
        match listener.recv(&mut buf).await {
            Ok((n, from, arrival)) => {
                let r = Received {
                    bytes: buf[..n.min(buf.len())].to_vec(),
                    from,
                    ttl: arrival.ttl,
                    interface: arrival.interface,
                    multihop,
                };
                if let Err(mpsc::error::TrySendError::Closed(_)) = to.try_send(r) {
                    return;
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "BFD receive failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// A session's sending side.
struct Out {
    /// None until opened (or after it failed: tried again at the next packet).
    socket: Option<UdpSocket>,
    status: watch::Sender<Status>,
    ups: u64,
}

struct Task {
    table: Table,
    out: BTreeMap<SessionKey, Out>,
    options: Options,
    observer: Arc<dyn Observer>,
    /// Where the search for a free source port starts.
    next_port: u16,
}

async fn run(
    mut t: Task,
    mut commands: mpsc::UnboundedReceiver<Command>,
    mut datagrams: mpsc::Receiver<Received>,
) {
    loop {
        let deadline = t.table.next_deadline();
        let sleep = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            c = commands.recv() => match c {
                Some(Command::Apply { desired, new }) => t.apply(desired, new),
                None | Some(Command::Shutdown) => {
                    t.apply(BTreeMap::new(), Vec::new());
                    return;
                }
            },
            Some(d) = datagrams.recv() => t.received(d),
            () = sleep => {
                for (key, actions) in t.table.on_timer(Instant::now()) {
                    t.act(&key, actions);
                }
            }
        }
    }
}

impl Task {
    fn apply(
        &mut self,
        desired: BTreeMap<SessionKey, Settings>,
        new: Vec<(SessionKey, watch::Sender<Status>)>,
    ) {
        let now = Instant::now();
        let gone: Vec<SessionKey> = self
            .out
            .keys()
            .filter(|k| !desired.contains_key(k))
            .copied()
            .collect();
        for key in gone {
            tracing::info!(peer = %key.peer, multihop = key.multihop, "stopping BFD session");
            let last = self.table.remove(&key, now);
            // Only the AdminDown packet: the status channel goes with the session.
            let sends: Vec<Action> = last
                .into_iter()
                .filter(|a| matches!(a, Action::Send(_)))
                .collect();
            self.act(&key, sends);
            self.out.remove(&key);
        }
        for (key, status) in new {
            self.out.insert(
                key,
                Out {
                    socket: None,
                    status,
                    ups: 0,
                },
            );
        }
        for (key, settings) in desired {
            if !self.out.contains_key(&key) {
                continue;
            }
            if self.table.get(&key).is_none() {
                tracing::info!(peer = %key.peer, multihop = key.multihop, ?settings, "starting BFD session");
            }
            let actions = self.table.upsert(key, settings, now);
            self.act(&key, actions);
            self.publish(&key);
        }
    }

    fn received(&mut self, d: Received) {
        let datagram = Datagram {
            bytes: &d.bytes,
            from: d.from.ip(),
            multihop: d.multihop,
            ttl: d.ttl,
            interface: d.interface,
        };
        match self.table.receive(datagram, Instant::now()) {
            Ok((key, actions)) => {
                self.observer.packet_in(&key);
                self.act(&key, actions);
                self.publish(&key);
            }
            Err(why) => {
                tracing::debug!(from = %d.from, error = %why, "BFD datagram dropped");
                self.observer.refused(d.from.ip(), &why);
            }
        }
    }

    /// Carries out a session's actions: packets out, state changes reported. Its log lines
    /// carry the session's peer from the span (at ERROR level so that it is enabled whenever a
    /// line inside is); none is made for no actions, the common case of a received packet.
    fn act(&mut self, key: &SessionKey, actions: Vec<Action>) {
        if actions.is_empty() {
            return;
        }
        let _peer = tracing::error_span!("bfd_session", peer = %key.peer).entered();
        for action in actions {
            match action {
                Action::Send(packet) => self.send(key, &packet.encode()),
                Action::StateChanged {
                    from,
                    to,
                    diagnostic,
                } => {
                    if to == State::Up {
                        tracing::info!(from = state_name(from), "BFD session up");
                        if let Some(o) = self.out.get_mut(key) {
                            o.ups += 1;
                        }
                    } else {
                        tracing::info!(from = state_name(from), to = state_name(to), %diagnostic, "BFD session state changed");
                    }
                    self.observer.state_changed(key, from, to, diagnostic);
                    self.publish(key);
                }
            }
        }
    }

    fn send(&mut self, key: &SessionKey, bytes: &[u8]) {
        let port = if key.multihop {
            self.options.multihop_port
        } else {
            self.options.single_hop_port
        };
        let Some(out) = self.out.get_mut(key) else {
            return;
        };
        if out.socket.is_none() {
            match socket::open_sender(
                key.local,
                SocketAddr::new(key.peer, port),
                self.options.source_ports.clone(),
                self.next_port,
            ) {
                Ok(s) => {
                    self.next_port = s
                        .local_addr()
                        .map(|a| a.port().wrapping_add(1))
                        .unwrap_or(self.next_port);
                    out.socket = Some(s);
                }
                Err(e) => {
                    tracing::warn!(local = ?key.local, error = %e, "cannot open the BFD socket; trying again at the next packet");
                    return;
                }
            }
        }
        let Some(s) = out.socket.as_ref() else {
            return;
        };
        match s.try_send(bytes) {
            Ok(_) => self.observer.packet_out(key),
            // A full buffer loses this packet (BFD tolerates loss); an ICMP error from the
            // peer (nothing listens yet) is reported on the next send and means nothing.
            Err(e) => tracing::trace!(error = %e, "BFD packet not sent"),
        }
    }

    fn publish(&self, key: &SessionKey) {
        let (Some(e), Some(o)) = (self.table.get(key), self.out.get(key)) else {
            return;
        };
        let s = &e.session;
        let status = Status {
            state: s.state(),
            remote_state: s.remote_state(),
            diagnostic: s.diagnostic(),
            transmit_interval: s.transmit_interval(),
            detection_time: s.detection_time(),
            ups: o.ups,
        };
        o.status.send_if_modified(|current| {
            let changed = *current != status;
            *current = status;
            changed
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::Mutex;

    use ferrolb_bfd::session::Config;

    use super::*;

    /// Records refusals.
    #[derive(Default)]
    struct Refusals(Mutex<Vec<String>>);

    impl Observer for Refusals {
        fn packet_in(&self, _: &SessionKey) {}
        fn packet_out(&self, _: &SessionKey) {}
        fn state_changed(&self, _: &SessionKey, _: State, _: State, _: Diagnostic) {}
        fn refused(&self, _: IpAddr, why: &Refused) {
            self.0.lock().unwrap().push(why.to_string());
        }
    }

    fn fast() -> Settings {
        Settings {
            config: Config {
                desired_min_tx: Duration::from_millis(20),
                required_min_rx: Duration::from_millis(20),
                detect_mult: 3,
                passive: false,
                auth: None,
            },
            minimum_ttl: 255,
        }
    }

    /// Two drivers on two loopback addresses (the same ports) talking to each other.
    fn pair(port: u16) -> (Bfd, Bfd, SessionKey, SessionKey, Arc<Refusals>) {
        let options = |ip: &str| Options {
            listen: vec![ip.parse().unwrap()],
            single_hop_port: port,
            multihop_port: port + 1,
            source_ports: 49152..=65535,
        };
        let refusals = Arc::new(Refusals::default());
        let (a, failed) = Bfd::start(options("127.0.0.1"), refusals.clone());
        assert!(failed.is_empty(), "{failed:?}");
        let (b, failed) = Bfd::start(options("127.0.0.2"), Arc::new(NoObserver));
        assert!(failed.is_empty(), "{failed:?}");
        let to_b = SessionKey {
            peer: "127.0.0.2".parse().unwrap(),
            local: Some("127.0.0.1".parse().unwrap()),
            multihop: false,
        };
        let to_a = SessionKey {
            peer: "127.0.0.1".parse().unwrap(),
            local: Some("127.0.0.2".parse().unwrap()),
            multihop: false,
        };
        (a, b, to_b, to_a, refusals)
    }

    async fn wait_state(rx: &mut watch::Receiver<Status>, state: State) -> Status {
        tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                let s = *rx.borrow_and_update();
                if s.state == state {
                    return s;
                }
                rx.changed().await.expect("session gone");
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no {state:?} in 20 s: {:?}", *rx.borrow()))
    }

    /// Two of our own sessions come Up; the slower side's timers win; when one side stops
    /// sending (its session removed: AdminDown) the other goes Down saying so; junk on the
    /// port is refused and harms nothing.
    #[tokio::test]
    async fn two_drivers_come_up_and_down() {
        let (mut a, mut b, to_b, to_a, refusals) = pair(13784);
        let mut slow = fast();
        slow.config.required_min_rx = Duration::from_millis(50);
        a.apply([(to_b, fast())].into());
        b.apply([(to_a, slow)].into());
        let mut ra = a.status(&to_b).unwrap();
        let mut rb = b.status(&to_a).unwrap();
        wait_state(&mut ra, State::Up).await;
        wait_state(&mut rb, State::Up).await;
        // a sends no faster than b can receive, once b's poll sequence has ended.
        let s = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let s = *ra.borrow_and_update();
                if s.transmit_interval == Duration::from_millis(50) {
                    return s;
                }
                ra.changed().await.unwrap();
            }
        })
        .await
        .expect("the transmit interval never became b's 50 ms");
        assert_eq!(s.ups, 1);

        // Junk from the peer's address: refused, the session stays Up.
        let junk = std::net::UdpSocket::bind("127.0.0.2:0").unwrap();
        junk.send_to(&[0xff; 24], "127.0.0.1:13784").unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(ra.borrow().state, State::Up);
        assert!(
            refusals
                .0
                .lock()
                .unwrap()
                .iter()
                .any(|r| r.contains("malformed")),
            "{:?}",
            refusals.0.lock().unwrap()
        );

        b.apply(BTreeMap::new());
        let s = wait_state(&mut ra, State::Down).await;
        assert_eq!(s.remote_state, State::AdminDown);
        assert_eq!(s.diagnostic, Diagnostic::NeighborSignaledDown);
        a.shutdown(Duration::from_secs(1)).await;
        b.shutdown(Duration::from_secs(1)).await;
    }

    /// Multihop (RFC 5883): the sessions meet on the multihop port and take packets from their
    /// `minimumTtl` up (loopback packets keep TTL 255); a single-hop session with the same
    /// peer would be another session.
    #[tokio::test]
    async fn multihop_sessions_use_their_own_port() {
        let (mut a, mut b, mut to_b, mut to_a, _) = pair(15784);
        to_b.multihop = true;
        to_a.multihop = true;
        let mut multihop = fast();
        multihop.minimum_ttl = 254;
        a.apply([(to_b, multihop)].into());
        b.apply([(to_a, multihop)].into());
        let mut ra = a.status(&to_b).unwrap();
        wait_state(&mut ra, State::Up).await;
        let mut single = to_b;
        single.multihop = false;
        assert!(a.status(&single).is_none());
        a.shutdown(Duration::from_secs(1)).await;
        b.shutdown(Duration::from_secs(1)).await;
    }

    /// A peer that goes silent is detected after the detection time (3 × 20 ms here).
    #[tokio::test]
    async fn silence_is_detected() {
        let (mut a, b, to_b, to_a, _) = pair(14784);
        let mut b = b;
        a.apply([(to_b, fast())].into());
        b.apply([(to_a, fast())].into());
        let mut ra = a.status(&to_b).unwrap();
        wait_state(&mut ra, State::Up).await;
        // b dies without a word.
        b.task.abort();
        for r in std::mem::take(&mut b.readers) {
            r.abort();
        }
        let s = wait_state(&mut ra, State::Down).await;
        assert_eq!(s.diagnostic, Diagnostic::DetectionTimeExpired);
        assert_eq!(s.ups, 1);
        a.shutdown(Duration::from_secs(1)).await;
    }
}
