//! One peer's task: the TCP connection, the timers and the Adj-RIB-Out around a pure
//! [`Session`].

use std::collections::{BTreeMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::watch;
use tokio::time::Instant;

use super::{Observer, PeerSettings, PeerStatus, socket};
use crate::bgp::adj_out::{self, AdjRibOut, SessionContext};
use crate::bgp::fsm::{Action, Event, Session, State, Timer};
use crate::bgp::packet::{AfiSafi, CodecContext, Message, Update};

type Connecting = Pin<Box<dyn Future<Output = std::io::Result<TcpStream>> + Send>>;

struct Conn {
    reader: OwnedReadHalf,
    writer: OwnedWriteHalf,
    local: SocketAddr,
    buf: Vec<u8>,
}

struct Task {
    settings: PeerSettings,
    session: Session,
    conn: Option<Conn>,
    connecting: Option<Connecting>,
    timers: BTreeMap<TimerKey, Instant>,
    codec: CodecContext,
    /// Set while Established.
    context: Option<SessionContext>,
    sent: AdjRibOut,
    status: watch::Sender<PeerStatus>,
    observer: Arc<dyn Observer>,
    pending: VecDeque<Event>,
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

/// Runs the session until `stop` turns true.
pub(super) async fn run(
    settings: PeerSettings,
    mut routes: watch::Receiver<Arc<AdjRibOut>>,
    status: watch::Sender<PeerStatus>,
    mut stop: watch::Receiver<bool>,
    observer: Arc<dyn Observer>,
) {
    let session = match Session::new(settings.fsm.clone()) {
        Ok(s) => s,
        Err(e) => {
            // PeerSettings::from_peer validated it already; report rather than panic.
            status.send_modify(|s| s.last_error = Some(e.to_string()));
            return;
        }
    };
    let mut t = Task {
        settings,
        session,
        conn: None,
        connecting: None,
        timers: BTreeMap::new(),
        codec: CodecContext::default(),
        context: None,
        sent: AdjRibOut::new(),
        status,
        observer,
        pending: VecDeque::from([Event::ManualStart]),
        pending_eor: Vec::new(),
    };
    loop {
        let desired: Arc<AdjRibOut> = routes.borrow_and_update().clone();
        t.process(&desired).await;
        if *stop.borrow() {
            t.pending.push_back(Event::ManualStop);
            t.process(&AdjRibOut::new()).await;
            return;
        }
        let deadline = t
            .timers
            .iter()
            .min_by_key(|(_, at)| **at)
            .map(|(k, at)| (*k, *at));
        let sleep = async {
            match deadline {
                Some((_, at)) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let connecting = async {
            match t.connecting.as_mut() {
                Some(c) => c.await,
                None => std::future::pending().await,
            }
        };
        let read = async {
            match t.conn.as_mut() {
                Some(c) => {
                    let mut chunk = [0u8; 4096];
                    c.reader.read(&mut chunk).await.map(|n| chunk[..n].to_vec())
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = stop.changed() => {}
            r = routes.changed() => {
                if r.is_err() {
                    // The driver is gone: stop.
                    t.pending.push_back(Event::ManualStop);
                    t.process(&AdjRibOut::new()).await;
                    return;
                }
            }
            () = sleep => {
                if let Some((key, _)) = deadline {
                    t.timers.remove(&key);
                    t.pending.push_back(key.event());
                }
            }
            r = connecting => {
                t.connecting = None;
                match r.and_then(|s| {
                    let local = s.local_addr()?;
                    Ok((s, local))
                }) {
                    Ok((stream, local)) => {
                        let (reader, writer) = stream.into_split();
                        t.conn = Some(Conn { reader, writer, local, buf: Vec::new() });
                        t.pending.push_back(Event::TcpCRAcked);
                    }
                    Err(e) => {
                        tracing::debug!(peer = %t.settings.name, error = %e, "BGP connect failed");
                        t.status.send_modify(|s| s.last_error = Some(format!("connect: {e}")));
                        t.pending.push_back(Event::TcpConnectionFails);
                    }
                }
            }
            r = read => match r {
                Ok(bytes) if !bytes.is_empty() => t.received(&bytes),
                Ok(_) => t.connection_lost("connection closed by peer".into()),
                Err(e) => t.connection_lost(format!("read: {e}")),
            }
        }
    }
}

impl Task {
    fn connection_lost(&mut self, why: String) {
        tracing::debug!(peer = %self.settings.name, why, "BGP connection lost");
        self.status.send_modify(|s| s.last_error = Some(why));
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

    /// Feeds pending events to the state machine and carries out its actions; then, when
    /// established, brings the peer to `desired`.
    async fn process(&mut self, desired: &AdjRibOut) {
        loop {
            while let Some(event) = self.pending.pop_front() {
                let actions = self.session.handle(event);
                for a in actions {
                    self.act(a).await;
                }
            }
            if self.session.state() == State::Established
                && let Some(ctx) = self.context.clone()
            {
                if self.sent != *desired {
                    self.send_routes(&ctx, desired);
                }
                for family in std::mem::take(&mut self.pending_eor) {
                    self.pending
                        .push_back(Event::Announce(Update::end_of_rib_marker(family)));
                }
            }
            if self.pending.is_empty() {
                break;
            }
        }
        let state = self.session.state();
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
                self.pending
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
                tracing::error!(peer = %self.settings.name, error = %e, "cannot encode UPDATE");
            }
        }
    }

    async fn write(&mut self, message: Message) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        let bytes = match message.to_bytes(&self.codec) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(peer = %self.settings.name, error = %e, "cannot encode message");
                return;
            }
        };
        if let Err(e) = conn.writer.write_all(&bytes).await {
            self.connection_lost(format!("write: {e}"));
        }
    }

    async fn act(&mut self, action: Action) {
        match action {
            Action::ConnectTcp => {
                self.conn = None;
                let options = self.settings.connect.clone();
                self.connecting = Some(Box::pin(async move { socket::connect(&options).await }));
            }
            Action::DropTcp => {
                if let Some(mut c) = self.conn.take() {
                    let _ = c.writer.shutdown().await;
                }
                self.connecting = None;
                self.codec = CodecContext::default();
            }
            Action::SendOpen(open) => self.write(Message::Open(open)).await,
            Action::SendKeepalive => self.write(Message::Keepalive).await,
            Action::SendNotification(n) => {
                tracing::info!(peer = %self.settings.name, code = n.code, subcode = n.subcode, "sending NOTIFICATION");
                self.write(Message::Notification(n)).await;
            }
            Action::SendUpdate(u) => self.write(Message::Update(u)).await,
            Action::StartTimer(timer, after) => {
                self.timers.insert(timer.into(), Instant::now() + after);
            }
            Action::StopTimer(timer) => {
                self.timers.remove(&timer.into());
            }
            Action::SessionEstablished(n) => {
                self.codec = n.codec;
                let local = self.conn.as_ref().map(|c| c.local.ip());
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
                    codec: n.codec,
                };
                tracing::info!(peer = %self.settings.name, peer_as = n.peer_as, peer_id = %n.peer_bgp_id, "BGP session established");
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
                tracing::info!(peer = %self.settings.name, ?reason, "BGP session down");
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
                    self.pending
                        .extend(updates.into_iter().map(Event::Announce));
                    self.pending
                        .push_back(Event::Announce(Update::end_of_rib_marker(family)));
                }
            }
        }
    }
}

fn family_of(p: &ipnet::IpNet) -> AfiSafi {
    match p {
        ipnet::IpNet::V4(_) => AfiSafi::IPV4_UNICAST,
        ipnet::IpNet::V6(_) => AfiSafi::IPV6_UNICAST,
    }
}
