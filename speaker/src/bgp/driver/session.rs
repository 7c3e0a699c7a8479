//! One peer's task: the TCP connections, the timers and the Adj-RIB-Out around pure
//! [`Session`]s.
//!
//! The task runs one [`Link`] (a `Session` with its connection and timers) that carries the
//! BGP session, and while that one is in OpenSent or OpenConfirm possibly a second one for a
//! connection the peer opened at the same time. As soon as one of them knows the peer's BGP
//! identifier, [`fsm::collision_survivor`] picks the connection to keep (RFC 4271 §6.8) and
//! the other gets [`Event::OpenCollisionDump`]; so at most one connection ever reaches
//! Established.

use std::collections::{BTreeMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{Observer, PeerSettings, PeerStatus, socket};
use crate::bfd::follow::{self, Verdict};
use ferrolb_bgp::adj_out::{self, AdjRibOut, SessionContext};
use ferrolb_bgp::fsm::{self, Action, Event, Initiator, OPEN_HOLD_TIME, Session, State, Timer};
use ferrolb_bgp::packet::{AfiSafi, CodecContext, Message, Update};

type Connecting = Pin<Box<dyn Future<Output = std::io::Result<TcpStream>> + Send>>;

struct Conn {
    reader: OwnedReadHalf,
    writer: OwnedWriteHalf,
    local: SocketAddr,
    buf: Vec<u8>,
}

impl Conn {
    fn new(stream: TcpStream) -> std::io::Result<Self> {
        let local = stream.local_addr()?;
        let (reader, writer) = stream.into_split();
        Ok(Self {
            reader,
            writer,
            local,
            buf: Vec::new(),
        })
    }
}

/// One TCP connection with the state machine that runs it and that machine's timers.
struct Link {
    session: Session,
    /// Who opened the connection: we (also while still connecting) or the peer.
    initiator: Initiator,
    conn: Option<Conn>,
    connecting: Option<Connecting>,
    timers: BTreeMap<TimerKey, Instant>,
    codec: CodecContext,
    pending: VecDeque<Event>,
    /// The task is ending: a dropped connection waits for the peer to close its side (see
    /// [`close_and_wait`]).
    linger: bool,
}

impl Link {
    fn new(session: Session, initiator: Initiator) -> Self {
        Self {
            session,
            initiator,
            conn: None,
            connecting: None,
            timers: BTreeMap::new(),
            codec: CodecContext::default(),
            pending: VecDeque::new(),
            linger: false,
        }
    }

    fn connection_lost(&mut self, status: &watch::Sender<PeerStatus>, why: String) {
        tracing::debug!(why, "BGP connection lost");
        status.send_modify(|s| s.last_error = Some(why));
        self.conn = None;
        self.pending.push_back(Event::TcpConnectionFails);
    }

    /// Frames and decodes what arrived; each message becomes one event.
    fn received(&mut self, bytes: &[u8]) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        conn.buf.extend_from_slice(bytes);
        loop {
            match Message::frame_len(&conn.buf) {
                Ok(Some(len)) if len <= conn.buf.len() => {
                    let frame: Vec<u8> = conn.buf.drain(..len).collect();
                    self.pending
                        .push_back(Event::from_decoded(Message::decode(&frame, &self.codec)));
                }
                Ok(_) => break,
                Err(e) => {
                    // A bad header poisons the stream: nothing after it can be framed.
                    conn.buf.clear();
                    self.pending.push_back(Event::from_decoded(Err(e)));
                    break;
                }
            }
        }
    }

    async fn write(&mut self, status: &watch::Sender<PeerStatus>, message: Message) {
        // A peer that stops reading (while its kernel still acknowledges) must not block the
        // task: past the hold time the session would have ended anyway.
        let limit = self
            .session
            .negotiated()
            .map(|n| n.hold_time)
            .filter(|h| !h.is_zero())
            .unwrap_or(OPEN_HOLD_TIME);
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        let bytes = match message.to_bytes(&self.codec) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "cannot encode message");
                return;
            }
        };
        match tokio::time::timeout(limit, conn.writer.write_all(&bytes)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => self.connection_lost(status, format!("write: {e}")),
            Err(_) => self.connection_lost(
                status,
                format!("write: the peer read nothing for {limit:?}"),
            ),
        }
    }

    /// Carries out the actions that concern this connection; returns the others (session up
    /// or down, route refresh) for the task.
    async fn io(
        &mut self,
        action: Action,
        settings: &PeerSettings,
        status: &watch::Sender<PeerStatus>,
    ) -> Option<Action> {
        match action {
            Action::ConnectTcp => {
                self.conn = None;
                self.initiator = Initiator::Local;
                let options = settings.connect.clone();
                self.connecting = Some(Box::pin(async move { socket::connect(&options).await }));
            }
            Action::DropTcp => {
                if let Some(mut c) = self.conn.take() {
                    if self.linger {
                        close_and_wait(c).await;
                    } else {
                        let _ = c.writer.shutdown().await;
                    }
                }
                self.connecting = None;
                self.codec = CodecContext::default();
            }
            Action::SendOpen(open) => self.write(status, Message::Open(open)).await,
            Action::SendKeepalive => self.write(status, Message::Keepalive).await,
            Action::SendNotification(n) => {
                tracing::info!(code = n.code, subcode = n.subcode, "sending NOTIFICATION");
                self.write(status, Message::Notification(n)).await;
            }
            Action::SendUpdate(u) => self.write(status, Message::Update(u)).await,
            Action::StartTimer(timer, after) => {
                self.timers.insert(timer.into(), Instant::now() + after);
            }
            Action::StopTimer(timer) => {
                self.timers.remove(&timer.into());
            }
            Action::SessionEstablished(n) => {
                self.codec = n.codec;
                return Some(Action::SessionEstablished(n));
            }
            other @ (Action::SessionDown(_) | Action::RouteRefreshRequested(_)) => {
                return Some(other);
            }
        }
        None
    }
}

struct Task {
    settings: PeerSettings,
    /// The connection that carries (or will carry) the session.
    primary: Link,
    /// A connection the peer opened while `primary` was in OpenSent or OpenConfirm, until the
    /// collision is resolved.
    secondary: Option<Link>,
    /// Set while Established.
    context: Option<SessionContext>,
    sent: AdjRibOut,
    status: watch::Sender<PeerStatus>,
    observer: Arc<dyn Observer>,
    /// Families whose End-of-RIB marker follows the initial table.
    pending_eor: Vec<AfiSafi>,
}

/// `Timer` as a map key (it is not `Ord`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum TimerKey {
    ConnectRetry,
    Hold,
    Keepalive,
    IdleHold,
}

impl From<Timer> for TimerKey {
    fn from(t: Timer) -> Self {
        match t {
            Timer::ConnectRetry => Self::ConnectRetry,
            Timer::Hold => Self::Hold,
            Timer::Keepalive => Self::Keepalive,
            Timer::IdleHold => Self::IdleHold,
        }
    }
}

impl TimerKey {
    fn event(self) -> Event {
        match self {
            Self::ConnectRetry => Event::ConnectRetryTimerExpires,
            Self::Hold => Event::HoldTimerExpires,
            Self::Keepalive => Event::KeepaliveTimerExpires,
            Self::IdleHold => Event::IdleHoldTimerExpires,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Which {
    Primary,
    Secondary,
}

async fn read(conn: Option<&mut Conn>) -> std::io::Result<Vec<u8>> {
    match conn {
        Some(c) => {
            let mut chunk = [0u8; 4096];
            c.reader.read(&mut chunk).await.map(|n| chunk[..n].to_vec())
        }
        None => std::future::pending().await,
    }
}

/// How long a stopping session waits for the peer to close the connection after our Cease.
pub(super) const LINGER: Duration = Duration::from_secs(2);

/// How long a new session waits for the previous session with the same peer to end.
pub(super) const PREDECESSOR_WAIT: Duration = Duration::from_secs(3);

/// Half-closes `conn` after our last message and waits (at most [`LINGER`]) until the peer
/// closes its side. A peer closes once it has read our NOTIFICATION (RFC 4271 §6.4), so when
/// this returns the peer has taken the session down. A new connection opened before that
/// looks like a connection collision with an Established session, which FRR 8.4 with dynamic
/// neighbours could leave half-dead for minutes: it refused every new connection (Cease /
/// Connection Collision Resolution) while the old session, already closed here, stayed
/// Established there (seen in the lab's `bgp` suite after a BGPPeer change).
async fn close_and_wait(mut conn: Conn) {
    let _ = conn.writer.shutdown().await;
    let drained = async {
        let mut chunk = [0u8; 4096];
        // Whatever the peer still sends is of no use any more: read until its FIN or an error.
        while let Ok(n) = conn.reader.read(&mut chunk).await {
            if n == 0 {
                break;
            }
        }
    };
    if tokio::time::timeout(LINGER, drained).await.is_err() {
        tracing::debug!("the peer did not close the connection after our Cease: dropping it");
    }
}

/// Runs `session` once `predecessors` (the tasks of stopped sessions with the same peer) have
/// ended, or after [`PREDECESSOR_WAIT`]: connecting while one of them is still saying goodbye
/// to the peer would collide with it there (see [`close_and_wait`]).
pub(super) async fn after(predecessors: Vec<JoinHandle<()>>, session: impl Future<Output = ()>) {
    if !predecessors.is_empty() {
        let ended = futures::future::join_all(predecessors);
        if tokio::time::timeout(PREDECESSOR_WAIT, ended).await.is_err() {
            tracing::debug!("the previous session with this peer is still ending: starting anyway");
        }
    }
    session.await;
}

/// Runs the session until `stop` turns true. `incoming` delivers the connections the peer
/// opened to our listener; `bfd` the BFD session the BGP session follows.
pub(super) async fn run(
    settings: PeerSettings,
    mut routes: watch::Receiver<Arc<AdjRibOut>>,
    status: watch::Sender<PeerStatus>,
    mut stop: watch::Receiver<bool>,
    mut incoming: mpsc::Receiver<TcpStream>,
    bfd: follow::Link,
    observer: Arc<dyn Observer>,
) {
    let mut bfd = follow::Follower::new(bfd);
    let Some(mut t) = Task::new(settings, status, observer) else {
        return;
    };
    let mut incoming_open = true;
    loop {
        let desired: Arc<AdjRibOut> = routes.borrow_and_update().clone();
        t.process(&desired).await;
        if *stop.borrow() {
            t.stop().await;
            return;
        }
        bfd.bgp_established(t.primary.session.state() == State::Established);
        let deadline = t.next_timer();
        let sleep = async {
            match deadline {
                Some((_, _, at)) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let connecting = async {
            match t.primary.connecting.as_mut() {
                Some(c) => c.await,
                None => std::future::pending().await,
            }
        };
        let read_primary = read(t.primary.conn.as_mut());
        let read_secondary = read(t.secondary.as_mut().and_then(|l| l.conn.as_mut()));
        let accept = async {
            if incoming_open {
                incoming.recv().await
            } else {
                std::future::pending().await
            }
        };
        tokio::select! {
            _ = stop.changed() => {}
            r = routes.changed() => {
                if r.is_err() {
                    // The driver is gone: stop.
                    t.stop().await;
                    return;
                }
            }
            () = sleep => {
                if let Some((which, key, _)) = deadline
                    && let Some(link) = t.link(which)
                {
                    link.timers.remove(&key);
                    link.pending.push_back(key.event());
                }
            }
            r = connecting => t.connected(r),
            r = read_primary => t.read_result(Which::Primary, r),
            r = read_secondary => t.read_result(Which::Secondary, r),
            s = accept => match s {
                Some(stream) => t.accepted(stream).await,
                None => incoming_open = false,
            },
            v = bfd.next() => t.bfd(v),
        }
    }
}

impl Task {
    /// The task of a session about to start (ManualStart is pending); none when the state
    /// machine refuses its configuration, which is then reported in the status.
    fn new(
        settings: PeerSettings,
        status: watch::Sender<PeerStatus>,
        observer: Arc<dyn Observer>,
    ) -> Option<Self> {
        let session = match Session::new(settings.fsm.clone()) {
            Ok(s) => s,
            Err(e) => {
                // PeerSettings::from_peer validated it already; report rather than panic.
                status.send_modify(|s| s.last_error = Some(e.to_string()));
                return None;
            }
        };
        let mut primary = Link::new(session, Initiator::Local);
        primary.pending.push_back(Event::ManualStart);
        Some(Task {
            settings,
            primary,
            secondary: None,
            context: None,
            sent: AdjRibOut::new(),
            status,
            observer,
            pending_eor: Vec::new(),
        })
    }

    /// The timer of either connection that expires first.
    fn next_timer(&self) -> Option<(Which, TimerKey, Instant)> {
        [
            (Which::Primary, Some(&self.primary)),
            (Which::Secondary, self.secondary.as_ref()),
        ]
        .into_iter()
        .filter_map(|(w, l)| l.map(|l| (w, l)))
        .flat_map(|(w, l)| l.timers.iter().map(move |(k, at)| (w, *k, *at)))
        .min_by_key(|(_, _, at)| *at)
    }

    /// Our connect attempt ended: the connection, or why not.
    fn connected(&mut self, r: std::io::Result<TcpStream>) {
        self.primary.connecting = None;
        match r.and_then(Conn::new) {
            Ok(conn) => {
                self.primary.conn = Some(conn);
                self.primary.pending.push_back(Event::TcpCRAcked);
            }
            Err(e) => {
                tracing::debug!(error = %e, "BGP connect failed");
                self.status
                    .send_modify(|s| s.last_error = Some(format!("connect: {e}")));
                self.primary.pending.push_back(Event::TcpConnectionFails);
            }
        }
    }

    fn link(&mut self, which: Which) -> Option<&mut Link> {
        match which {
            Which::Primary => Some(&mut self.primary),
            Which::Secondary => self.secondary.as_mut(),
        }
    }

    fn read_result(&mut self, which: Which, r: std::io::Result<Vec<u8>>) {
        let status = self.status.clone();
        let Some(link) = self.link(which) else {
            return;
        };
        match r {
            Ok(bytes) if !bytes.is_empty() => link.received(&bytes),
            Ok(_) => link.connection_lost(&status, "connection closed by peer".into()),
            Err(e) => link.connection_lost(&status, format!("read: {e}")),
        }
    }

    /// Follows the BFD session: down at once (Cease / BFD Down) when it failed, started again
    /// when it is Up.
    fn bfd(&mut self, verdict: Verdict) {
        match verdict {
            Verdict::Stop => {
                tracing::warn!("BFD session down: stopping the BGP session until BFD is up again");
                self.status
                    .send_modify(|s| s.last_error = Some("BFD session down".into()));
                self.primary.pending.push_back(Event::BfdDown);
                if let Some(l) = self.secondary.as_mut() {
                    l.pending.push_back(Event::BfdDown);
                }
            }
            Verdict::Start => {
                tracing::info!(
                    "BFD session up (or no longer configured): starting the BGP session again"
                );
                self.primary.pending.push_back(Event::ManualStart);
            }
            Verdict::WaitOver => {
                tracing::info!(
                    "BFD still down after the wait: starting the BGP session again anyway"
                );
                self.primary.pending.push_back(Event::ManualStart);
            }
        }
    }

    /// ManualStop on every connection, then Cease goes out on each.
    /// The task ends only once the peer has closed its side too (bounded by [`LINGER`]), so
    /// that a session started next for the same peer never meets this one's connection there.
    async fn stop(&mut self) {
        self.primary.pending.push_back(Event::ManualStop);
        self.primary.linger = true;
        if let Some(l) = self.secondary.as_mut() {
            l.pending.push_back(Event::ManualStop);
            l.linger = true;
        }
        self.process(&AdjRibOut::new()).await;
    }

    /// A connection the peer opened to our listener.
    async fn accepted(&mut self, stream: TcpStream) {
        let conn = match Conn::new(stream) {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "accepted BGP connection is gone");
                return;
            }
        };
        match self.primary.session.state() {
            State::Established => {
                // RFC 4271 §6.8: an Established session survives; the new connection is closed.
                tracing::info!("closing the peer's connection: session already established");
            }
            State::Idle | State::Connect | State::Active => {
                // No connection of ours yet: the peer's one carries the session (the state
                // machine refuses it when stopped).
                tracing::info!("accepted BGP connection from the peer");
                self.primary.connecting = None;
                self.primary.conn = Some(conn);
                self.primary.initiator = Initiator::Remote;
                self.primary.codec = CodecContext::default();
                self.primary
                    .pending
                    .push_back(Event::TcpConnectionConfirmed);
            }
            State::OpenSent | State::OpenConfirm => {
                // A collision: run the peer's connection beside ours until one is chosen.
                if let Some(old) = self.secondary.take() {
                    self.dump(old).await;
                }
                let Ok(mut session) = Session::new(self.settings.fsm.clone()) else {
                    return;
                };
                // Started like ours (so that it reconnects itself should it become the session
                // and fail later), but on the peer's connection instead of a connect.
                let _ = session.handle(Event::ManualStart);
                let mut link = Link::new(session, Initiator::Remote);
                link.conn = Some(conn);
                link.pending.push_back(Event::TcpConnectionConfirmed);
                tracing::info!("accepted BGP connection from the peer while ours is opening");
                self.secondary = Some(link);
            }
        }
    }

    /// Ends a connection that lost a collision: Cease / Connection Collision Resolution.
    async fn dump(&mut self, mut link: Link) {
        let actions = link.session.handle(Event::OpenCollisionDump);
        for a in actions {
            // Only the NOTIFICATION and the close matter: the link is dropped afterwards.
            if matches!(a, Action::SendNotification(_) | Action::DropTcp) {
                let _ = link.io(a, &self.settings, &self.status).await;
            }
        }
    }

    /// RFC 4271 §6.8 between the two connections, once the peer's identifier is known.
    async fn settle(&mut self) {
        let Some(second) = self.secondary.as_ref() else {
            return;
        };
        let (p, s) = (self.primary.session.state(), second.session.state());
        match s {
            // It failed (its actions already ran): forget it.
            State::Idle => {
                self.secondary = None;
                return;
            }
            State::OpenSent | State::OpenConfirm => {}
            // Its OPEN has not gone out yet.
            State::Connect | State::Active | State::Established => return,
        }
        if p == State::Established {
            if let Some(second) = self.secondary.take() {
                self.dump(second).await;
            }
            return;
        }
        if matches!(p, State::Idle | State::Connect | State::Active) {
            // Ours failed meanwhile: the peer's connection carries the session now.
            if let Some(second) = self.secondary.take() {
                self.primary = second;
            }
            return;
        }
        let Some(peer) = self
            .primary
            .session
            .peer_identity()
            .or_else(|| second.session.peer_identity())
        else {
            return;
        };
        // The identifier is the peer's whichever connection brought it, so a connection still
        // in OpenSent is settled too (§6.8 allows that when the identifier is known).
        let keep_primary = if self.primary.initiator == second.initiator {
            // The peer opened both: it gave up on the older one.
            false
        } else {
            let local = (self.settings.fsm.bgp_id, self.settings.fsm.local_as);
            fsm::collision_survivor(local, peer) == self.primary.initiator
        };
        let Some(second) = self.secondary.take() else {
            return;
        };
        let kept = if keep_primary {
            self.primary.initiator
        } else {
            second.initiator
        };
        tracing::info!(?kept, "connection collision resolved");
        self.status.send_modify(|s| s.collisions += 1);
        if keep_primary {
            self.dump(second).await;
        } else {
            let old = std::mem::replace(&mut self.primary, second);
            self.dump(old).await;
        }
    }

    /// Feeds one pending event of `which` to its state machine and carries out the actions.
    /// False when it had none.
    async fn step(&mut self, which: Which) -> bool {
        let Some(link) = self.link(which) else {
            return false;
        };
        let Some(event) = link.pending.pop_front() else {
            return false;
        };
        let actions = link.session.handle(event);
        for a in actions {
            let link = match which {
                Which::Primary => &mut self.primary,
                Which::Secondary => match self.secondary.as_mut() {
                    Some(l) => l,
                    None => break,
                },
            };
            if let Some(task_action) = link.io(a, &self.settings, &self.status).await {
                self.act(which, task_action);
            }
        }
        self.settle().await;
        true
    }

    /// Feeds pending events to the state machines and carries out their actions; then, when
    /// established, brings the peer to `desired`.
    async fn process(&mut self, desired: &AdjRibOut) {
        loop {
            while self.step(Which::Primary).await || self.step(Which::Secondary).await {}
            if self.primary.session.state() == State::Established
                && let Some(ctx) = self.context.clone()
            {
                if self.sent != *desired {
                    self.send_routes(&ctx, desired);
                }
                for family in std::mem::take(&mut self.pending_eor) {
                    self.primary
                        .pending
                        .push_back(Event::Announce(Update::end_of_rib_marker(family)));
                }
            }
            let idle = self.primary.pending.is_empty()
                && self.secondary.as_ref().is_none_or(|l| l.pending.is_empty());
            if idle {
                break;
            }
        }
        let state = self.primary.session.state();
        self.status.send_if_modified(|s| {
            let changed = s.state != state;
            s.state = state;
            changed
        });
    }

    fn send_routes(&mut self, ctx: &SessionContext, desired: &AdjRibOut) {
        match adj_out::diff(&self.sent, desired, ctx) {
            Ok((updates, next)) => {
                let n = updates.len() as u64;
                self.primary
                    .pending
                    .extend(updates.into_iter().map(Event::Announce));
                self.sent = next;
                self.observer.updates_sent(&self.settings.name, n);
                self.observer
                    .announced(&self.settings.name, self.sent.len());
                let announced = self.sent.len();
                self.status.send_modify(|s| {
                    s.announced = announced;
                    s.updates_sent += n;
                });
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot encode UPDATE");
            }
        }
    }

    /// The actions that concern the session rather than one connection.
    fn act(&mut self, which: Which, action: Action) {
        match action {
            Action::SessionEstablished(n) => {
                if which == Which::Secondary {
                    // `settle` never lets the peer's second connection get this far.
                    tracing::error!("second connection established");
                }
                let local = self
                    .link(which)
                    .and_then(|l| l.conn.as_ref())
                    .map(|c| c.local.ip());
                let ctx = SessionContext {
                    local_as: self.settings.fsm.local_as,
                    internal: n.internal,
                    families: n.families.clone(),
                    next_hop_v4: match local {
                        Some(IpAddr::V4(a)) => Some(a),
                        _ => self.settings.node_ipv4,
                    },
                    next_hop_v6: match local {
                        Some(IpAddr::V6(a)) if !a.is_unicast_link_local() => Some(a),
                        _ => self.settings.node_ipv6,
                    },
                    // A session over link-local addresses sends ours beside the global one.
                    next_hop_v6_link_local: match local {
                        Some(IpAddr::V6(a)) if a.is_unicast_link_local() => Some(a),
                        _ => None,
                    },
                    extended_next_hop: n.extended_next_hop,
                    codec: n.codec,
                };
                tracing::info!(peer_as = n.peer_as, peer_id = %n.peer_bgp_id, "BGP session established");
                if ctx.next_hop_v4.is_none()
                    && !ctx.extended_next_hop
                    && ctx.families.contains(&AfiSafi::IPV4_UNICAST)
                {
                    // An unnumbered peer that did not take RFC 8950: IPv4 has no next hop here.
                    tracing::warn!(
                        "the peer did not negotiate the extended next hop capability and this session has no IPv4 next hop: IPv4 prefixes are not sent to it"
                    );
                }
                self.sent.clear();
                self.context = Some(ctx);
                self.observer.session_up(&self.settings.name, true);
                self.status.send_modify(|s| {
                    s.state = State::Established;
                    s.last_error = None;
                });
                // The table goes out in `process`; End-of-RIB follows it (RFC 4724).
                self.pending_eor = n.families;
            }
            Action::SessionDown(reason) => {
                tracing::info!(?reason, "BGP session down");
                self.context = None;
                self.sent.clear();
                self.observer.session_up(&self.settings.name, false);
                self.observer.announced(&self.settings.name, 0);
                self.status.send_modify(|s| {
                    s.announced = 0;
                    s.last_error = Some(format!("{reason:?}"));
                });
            }
            Action::RouteRefreshRequested(family) => {
                let again: AdjRibOut = self
                    .sent
                    .iter()
                    .filter(|(p, _)| family_of(p) == family)
                    .map(|(p, a)| (*p, a.clone()))
                    .collect();
                if let Some(ctx) = self.context.clone()
                    && let Ok((updates, _)) = adj_out::diff(&AdjRibOut::new(), &again, &ctx)
                {
                    self.primary
                        .pending
                        .extend(updates.into_iter().map(Event::Announce));
                    self.primary
                        .pending
                        .push_back(Event::Announce(Update::end_of_rib_marker(family)));
                }
            }
            // Connection-level actions never reach here.
            _ => {}
        }
    }
}

fn family_of(p: &ipnet::IpNet) -> AfiSafi {
    match p {
        ipnet::IpNet::V4(_) => AfiSafi::IPV4_UNICAST,
        ipnet::IpNet::V6(_) => AfiSafi::IPV6_UNICAST,
    }
}
