//! The BGP session state machine (RFC 4271 §8) as a pure function.
//!
//! [`Session::handle`] takes one [`Event`] and returns the [`Action`]s the driver must carry out,
//! in order. The whole state is the [`Session`] value: there is no clock, no socket and no task
//! inside. Timers are [`Action::StartTimer`] / [`Action::StopTimer`]; the driver owns time and
//! feeds the matching `...TimerExpires` event back. TCP is [`Action::ConnectTcp`] /
//! [`Action::DropTcp`] and the `Tcp...` events.
//!
//! One `Session` drives one TCP connection, as in RFC 4271 §8. When a peer connects while our
//! own connection attempt is under way, the driver runs a second `Session` for the incoming
//! connection and settles the race with [`collision_survivor`] (RFC 4271 §6.8): the loser gets
//! [`Event::OpenCollisionDump`].
//!
//! Deliberate simplifications, all allowed by RFC 4271 §8.1: no DelayOpen timer, no peer
//! oscillation damping, and automatic restart after a failure is the IdleHold timer with capped
//! exponential backoff; while that timer runs, Idle takes a connection from the peer (as RFC
//! 4271's Active state would), so the backoff only spaces our own attempts. Timer expiries that
//! arrive in a state where that timer is not running (a race in the driver) are ignored instead
//! of being treated as FSM errors.

use std::net::Ipv4Addr;
use std::time::Duration;

use crate::packet::iana::{cease_subcode, error_code, fsm_subcode, open_subcode};
use crate::packet::{
    AfiSafi, Capability, CodecContext, DecodeError, ExtendedNextHop, GracefulRestart,
    GracefulRestartFamily, Message, Notification, Open, RouteRefresh, Update,
};

/// Hold time while waiting for the peer's OPEN (RFC 4271 §8.2.2 suggests four minutes).
pub const OPEN_HOLD_TIME: Duration = Duration::from_secs(240);

/// Session states (RFC 4271 §8.2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Refuses connections; waits for a start event.
    Idle,
    /// Waiting for our outgoing TCP connection to complete.
    Connect,
    /// Waiting for the peer to connect to us; retries our own connection when the timer fires.
    Active,
    /// OPEN sent, waiting for the peer's OPEN.
    OpenSent,
    /// OPENs exchanged, waiting for the peer's first KEEPALIVE.
    OpenConfirm,
    /// The session is up: UPDATEs flow.
    Established,
}

/// The peer's AS, as BGPPeer configures it (`peerASN` or `dynamicASN`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerAs {
    /// Exactly this AS (`peerASN`).
    Fixed(u32),
    /// Any AS equal to ours: iBGP (`dynamicASN: internal`).
    Internal,
    /// Any AS other than ours: eBGP (`dynamicASN: external`).
    External,
}

/// Connect retry timing: the first wait, doubled after each consecutive failure, never above
/// `max`. Reset when a session reaches Established.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Backoff {
    /// First wait (`connectTime` in BGPPeer).
    pub initial: Duration,
    /// Cap on the wait.
    pub max: Duration,
}

impl Backoff {
    /// The wait after `failures` consecutive failures.
    pub fn delay(&self, failures: u32) -> Duration {
        let factor = 1u32.checked_shl(failures.min(31)).unwrap_or(u32::MAX);
        self.initial
            .checked_mul(factor)
            .unwrap_or(self.max)
            .min(self.max)
    }
}

/// What the session is configured with.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Config {
    /// Our AS (`myASN`, or `localASN` when set).
    pub local_as: u32,
    /// The AS we accept from the peer.
    pub peer_as: PeerAs,
    /// Our BGP identifier (`routerID`).
    pub bgp_id: Ipv4Addr,
    /// Hold time we propose, in seconds: 0 (no keepalives, no hold timer) or at least 3.
    pub hold_time: u16,
    /// Keepalive interval in seconds; `None` for a third of the negotiated hold time.
    pub keepalive_time: Option<u16>,
    /// Connect retry timing.
    pub connect_retry: Backoff,
    /// Families we advertise in multiprotocol capabilities.
    pub families: Vec<AfiSafi>,
    /// Advertise graceful restart with this restart time, in seconds (`enableGracefulRestart`),
    /// with the forwarding state preserved for every family: the speaker forwards nothing
    /// itself, the node's data path (kube-proxy) keeps working while it restarts. So a peer keeps
    /// the routes it had until the restarted speaker's End-of-RIB replaces them (make before
    /// break), as MetalLB's FRR mode does with `preserve-fw-state`.
    pub graceful_restart_time: Option<u16>,
    /// Advertise the extended next hop capability (RFC 8950) for IPv4 unicast with IPv6 next
    /// hops, so that IPv4 prefixes can be announced over a session that has no IPv4 next hop
    /// (BGP unnumbered: the peer is known only by its IPv6 link-local address). Only sent when
    /// `families` has IPv4 unicast. `false` keeps the OPEN as it was before RFC 8950 support.
    pub extended_next_hop: bool,
}

/// A configuration the session cannot run with.
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
pub enum ConfigError {
    /// Hold time of 1 or 2 seconds (RFC 4271 §4.2).
    #[error("hold time {0} s: must be 0 or at least 3 s")]
    HoldTime(u16),
    /// Keepalive longer than the hold time, or zero with a non-zero hold time.
    #[error("keepalive time {keepalive} s does not fit hold time {hold} s")]
    KeepaliveTime {
        /// The keepalive time.
        keepalive: u16,
        /// The hold time.
        hold: u16,
    },
    /// No family to advertise.
    #[error("no address family to advertise")]
    NoFamily,
    /// AS 0 is reserved (RFC 7607).
    #[error("AS 0 is reserved")]
    AsZero,
}

impl Config {
    /// Checks the timer rules of BGPPeer: hold is 0 or ≥ 3 s, keepalive ≤ hold.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if matches!(self.hold_time, 1 | 2) {
            return Err(ConfigError::HoldTime(self.hold_time));
        }
        if let Some(keepalive) = self.keepalive_time
            && (keepalive > self.hold_time || (keepalive == 0 && self.hold_time != 0))
        {
            return Err(ConfigError::KeepaliveTime {
                keepalive,
                hold: self.hold_time,
            });
        }
        if self.families.is_empty() {
            return Err(ConfigError::NoFamily);
        }
        if self.local_as == 0 || self.peer_as == PeerAs::Fixed(0) {
            return Err(ConfigError::AsZero);
        }
        Ok(())
    }
}

/// The timers the driver runs for a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Timer {
    /// ConnectRetryTimer: retry the TCP connection.
    ConnectRetry,
    /// HoldTimer: the peer has been silent too long.
    Hold,
    /// KeepaliveTimer: time to send a KEEPALIVE.
    Keepalive,
    /// IdleHoldTimer: wait in Idle before restarting automatically after a failure.
    IdleHold,
}

/// What was agreed with the peer when the OPENs were exchanged.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Negotiated {
    /// The peer's AS.
    pub peer_as: u32,
    /// The peer's BGP identifier.
    pub peer_bgp_id: Ipv4Addr,
    /// True when the peer is in our AS.
    pub internal: bool,
    /// Negotiated hold time: the smaller of both proposals; zero disables keepalives.
    pub hold_time: Duration,
    /// Interval between our KEEPALIVEs; `None` when the hold time is zero.
    pub keepalive: Option<Duration>,
    /// Families both sides advertised.
    pub families: Vec<AfiSafi>,
    /// The peer accepts ROUTE-REFRESH.
    pub route_refresh: bool,
    /// The peer's graceful restart capability, if it sent one.
    pub peer_graceful_restart: Option<GracefulRestart>,
    /// The peer's host name from its FQDN capability, if it sent one.
    pub peer_hostname: Option<String>,
    /// Both sides advertised the extended next hop capability for IPv4 unicast with IPv6 next
    /// hops (AFI 1, SAFI 1, next hop AFI 2; RFC 8950 §3), and IPv4 unicast was negotiated: IPv4
    /// prefixes may be sent in MP_REACH_NLRI with an IPv6 next hop
    /// ([`SessionContext::extended_next_hop`](crate::adj_out::SessionContext::extended_next_hop)).
    pub extended_next_hop: bool,
    /// How UPDATEs to and from this peer are laid out.
    pub codec: CodecContext,
}

/// Why an established session went down.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DownReason {
    /// ManualStop.
    Stopped,
    /// We sent this NOTIFICATION.
    NotificationSent(Notification),
    /// The peer sent this NOTIFICATION.
    NotificationReceived(Notification),
    /// The TCP connection failed.
    ConnectionLost,
}

/// Session inputs (RFC 4271 §8.1), each with its RFC event number.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)]
pub enum Event {
    /// Event 1: ManualStart. Connect to the peer.
    ManualStart,
    /// Event 2: ManualStop. Close the session for good.
    ManualStop,
    /// The peer's BFD session went down (RFC 5882 section 4.3): as ManualStop, with Cease /
    /// BFD Down (RFC 9384) when a NOTIFICATION goes out. The driver starts the session again
    /// (ManualStart) once BFD is Up.
    BfdDown,
    /// Event 4: ManualStart_with_PassiveTcpEstablishment. Wait for the peer to connect first.
    ManualStartWithPassiveTcpEstablishment,
    /// Event 9: ConnectRetryTimer_Expires.
    ConnectRetryTimerExpires,
    /// Event 10: HoldTimer_Expires.
    HoldTimerExpires,
    /// Event 11: KeepaliveTimer_Expires.
    KeepaliveTimerExpires,
    /// Event 13: IdleHoldTimer_Expires. Automatic restart after a failure.
    IdleHoldTimerExpires,
    /// Event 16: Tcp_CR_Acked. Our outgoing connection is up.
    TcpCRAcked,
    /// Event 17: TcpConnectionConfirmed. We accepted the peer's connection.
    TcpConnectionConfirmed,
    /// Event 18: TcpConnectionFails.
    TcpConnectionFails,
    /// Event 19: BGPOpen. A valid OPEN arrived.
    BGPOpen(Open),
    /// Event 21: BGPHeaderErr. The header was malformed; send this NOTIFICATION.
    BGPHeaderErr(Notification),
    /// Event 22: BGPOpenMsgErr. The OPEN was malformed; send this NOTIFICATION.
    BGPOpenMsgErr(Notification),
    /// Event 23: OpenCollisionDump. This connection lost collision resolution (RFC 4271 §6.8).
    OpenCollisionDump,
    /// Event 24: NotifMsgVerErr. A NOTIFICATION about the version arrived.
    NotifMsgVerErr(Notification),
    /// Event 25: NotifMsg. Any other NOTIFICATION arrived.
    NotifMsg(Notification),
    /// Event 26: KeepAliveMsg.
    KeepAliveMsg,
    /// Event 27: UpdateMsg. A valid UPDATE arrived (possibly with RFC 7606 diagnostics).
    UpdateMsg(Update),
    /// Event 28: UpdateMsgErr. The UPDATE was malformed; send this NOTIFICATION.
    UpdateMsgErr(Notification),
    /// A ROUTE-REFRESH arrived (RFC 2918; not numbered in RFC 4271).
    RouteRefreshMsg(RouteRefresh),
    /// Local: send this UPDATE if the session is established (restarts the KeepaliveTimer).
    Announce(Update),
}

impl Event {
    /// The event for a decoded message or a decode error, as the driver gets them from
    /// [`Message::decode`].
    pub fn from_decoded(decoded: Result<Message, DecodeError>) -> Self {
        match decoded {
            Ok(Message::Open(open)) => Self::BGPOpen(open),
            Ok(Message::Update(update)) => Self::UpdateMsg(update),
            Ok(Message::Notification(n))
                if n.code == error_code::OPEN_MESSAGE
                    && n.subcode == open_subcode::UNSUPPORTED_VERSION_NUMBER =>
            {
                Self::NotifMsgVerErr(n)
            }
            Ok(Message::Notification(n)) => Self::NotifMsg(n),
            Ok(Message::Keepalive) => Self::KeepAliveMsg,
            Ok(Message::RouteRefresh(rr)) => Self::RouteRefreshMsg(rr),
            Err(e) if e.is_header_error() => Self::BGPHeaderErr(e.notification()),
            Err(e) if e.is_open_error() => Self::BGPOpenMsgErr(e.notification()),
            Err(e) => Self::UpdateMsgErr(e.notification()),
        }
    }
}

/// What the driver must do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)]
pub enum Action {
    /// Open a TCP connection to the peer.
    ConnectTcp,
    /// Close the TCP connection, after sending what is queued.
    DropTcp,
    /// Send this OPEN.
    SendOpen(Open),
    /// Send a KEEPALIVE.
    SendKeepalive,
    /// Send this NOTIFICATION.
    SendNotification(Notification),
    /// Send this UPDATE.
    SendUpdate(Update),
    /// (Re)start a timer: it fires after the duration unless stopped or restarted first.
    StartTimer(Timer, Duration),
    /// Stop a timer.
    StopTimer(Timer),
    /// The session is up: send the whole table, then keep the peer up to date.
    SessionEstablished(Negotiated),
    /// The established session went down: forget what was sent to the peer.
    SessionDown(DownReason),
    /// The peer asked for our routes of this family again (RFC 2918).
    RouteRefreshRequested(AfiSafi),
}

/// Which side opened the connection that survives a collision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Initiator {
    /// The connection we opened.
    Local,
    /// The connection the peer opened.
    Remote,
}

/// RFC 4271 §6.8: of two connections to the same peer, keep the one opened by the speaker with
/// the higher BGP identifier (compared as unsigned 32-bit numbers); with equal identifiers, the
/// one opened by the speaker with the higher AS (RFC 6286 §2.3). A connection that is already
/// Established always survives a new one: the driver checks that first.
pub fn collision_survivor(local: (Ipv4Addr, u32), remote: (Ipv4Addr, u32)) -> Initiator {
    let key = |(id, asn): (Ipv4Addr, u32)| (u32::from(id), asn);
    if key(local) > key(remote) {
        Initiator::Local
    } else {
        Initiator::Remote
    }
}

/// How the session was started, so that automatic restarts start it the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Start {
    /// ManualStart: connect to the peer.
    Active,
    /// ManualStart_with_PassiveTcpEstablishment: wait for the peer.
    Passive,
}

/// One BGP session over one TCP connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    config: Config,
    state: State,
    /// `None` after ManualStop (or before any start): no automatic restart.
    start: Option<Start>,
    /// ConnectRetryCounter: consecutive failures, for the backoff.
    connect_retry_counter: u32,
    /// The peer's OPEN, once received (OpenConfirm and Established).
    peer_open: Option<Open>,
    negotiated: Option<Negotiated>,
}

impl Session {
    /// A session in Idle.
    pub fn new(config: Config) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self {
            config,
            state: State::Idle,
            start: None,
            connect_retry_counter: 0,
            peer_open: None,
            negotiated: None,
        })
    }

    /// The current state.
    pub fn state(&self) -> State {
        self.state
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// What was negotiated, in OpenConfirm and Established.
    pub fn negotiated(&self) -> Option<&Negotiated> {
        self.negotiated.as_ref()
    }

    /// The peer's BGP identifier and AS once its OPEN was accepted, for collision resolution.
    pub fn peer_identity(&self) -> Option<(Ipv4Addr, u32)> {
        self.peer_open.as_ref().map(|o| (o.bgp_id, o.asn()))
    }

    /// Consecutive failures since the last Established (the ConnectRetryCounter).
    pub fn connect_retry_counter(&self) -> u32 {
        self.connect_retry_counter
    }

    /// The OPEN we send.
    pub fn open_message(&self) -> Open {
        let c = &self.config;
        let mut caps: Vec<Capability> = c
            .families
            .iter()
            .map(|f| Capability::Multiprotocol(*f))
            .collect();
        caps.push(Capability::RouteRefresh);
        if c.extended_next_hop && c.families.contains(&AfiSafi::IPV4_UNICAST) {
            caps.push(Capability::ExtendedNextHop(vec![
                ExtendedNextHop::IPV4_UNICAST_OVER_IPV6,
            ]));
        }
        if let Some(restart_time) = c.graceful_restart_time {
            caps.push(Capability::GracefulRestart(GracefulRestart {
                restart_state: false,
                notification: false,
                restart_time: restart_time.min(0x0fff),
                families: c
                    .families
                    .iter()
                    .map(|f| GracefulRestartFamily {
                        afi_safi: *f,
                        // RFC 4724 §4.2: with F unset, the peer drops the stale routes as soon
                        // as the new session opens, before our UPDATEs arrive.
                        forwarding_preserved: true,
                    })
                    .collect(),
            }));
        }
        Open::new(c.local_as, c.hold_time, c.bgp_id, caps)
    }

    /// Applies one event and returns the actions to carry out, in order.
    pub fn handle(&mut self, event: Event) -> Vec<Action> {
        let mut out = Vec::new();
        match self.state {
            State::Idle => self.idle(event, &mut out),
            State::Connect | State::Active => self.connecting(event, &mut out),
            State::OpenSent => self.open_sent(event, &mut out),
            State::OpenConfirm => self.open_confirm(event, &mut out),
            State::Established => self.established(event, &mut out),
        }
        out
    }

    /// The wait before the next attempt: `initial` after none or one failure, doubling after
    /// each further one.
    fn retry_delay(&self) -> Duration {
        self.config
            .connect_retry
            .delay(self.connect_retry_counter.saturating_sub(1))
    }

    fn idle(&mut self, event: Event, out: &mut Vec<Action>) {
        match event {
            Event::ManualStart | Event::ManualStartWithPassiveTcpEstablishment => {
                let start = if event == Event::ManualStart {
                    Start::Active
                } else {
                    Start::Passive
                };
                self.start = Some(start);
                self.connect_retry_counter = 0;
                out.push(Action::StopTimer(Timer::IdleHold));
                self.restart(start, out);
            }
            // Automatic restart, unless a ManualStop came in between.
            Event::IdleHoldTimerExpires => {
                if let Some(start) = self.start {
                    self.restart(start, out);
                }
            }
            Event::ManualStop | Event::BfdDown => {
                self.start = None;
                self.connect_retry_counter = 0;
                out.push(Action::StopTimer(Timer::IdleHold));
            }
            // Waiting for the automatic restart (our stand-in for RFC 4271's Active state after
            // a failure): a connection from the peer is taken, as Active would. The backoff
            // only spaces our own attempts.
            Event::TcpConnectionConfirmed if self.start.is_some() => {
                out.push(Action::StopTimer(Timer::IdleHold));
                out.push(Action::SendOpen(self.open_message()));
                out.push(Action::StartTimer(Timer::Hold, OPEN_HOLD_TIME));
                self.state = State::OpenSent;
            }
            // Idle after a ManualStop (or before any start) refuses connections.
            Event::TcpCRAcked | Event::TcpConnectionConfirmed => out.push(Action::DropTcp),
            _ => {}
        }
    }

    fn restart(&mut self, start: Start, out: &mut Vec<Action>) {
        out.push(Action::StartTimer(Timer::ConnectRetry, self.retry_delay()));
        if start == Start::Active {
            out.push(Action::ConnectTcp);
            self.state = State::Connect;
        } else {
            self.state = State::Active;
        }
    }

    /// Connect and Active: no BGP message is expected yet.
    fn connecting(&mut self, event: Event, out: &mut Vec<Action>) {
        match event {
            Event::ManualStart | Event::ManualStartWithPassiveTcpEstablishment => {}
            Event::ManualStop | Event::BfdDown => {
                out.push(Action::DropTcp);
                out.push(Action::StopTimer(Timer::ConnectRetry));
                self.start = None;
                self.connect_retry_counter = 0;
                self.state = State::Idle;
            }
            Event::ConnectRetryTimerExpires => {
                // The attempt took too long: count it, and try again after a longer wait.
                self.connect_retry_counter = self.connect_retry_counter.saturating_add(1);
                if self.state == State::Connect {
                    out.push(Action::DropTcp);
                }
                out.push(Action::StartTimer(Timer::ConnectRetry, self.retry_delay()));
                out.push(Action::ConnectTcp);
                self.state = State::Connect;
            }
            Event::TcpCRAcked | Event::TcpConnectionConfirmed => {
                out.push(Action::StopTimer(Timer::ConnectRetry));
                out.push(Action::SendOpen(self.open_message()));
                out.push(Action::StartTimer(Timer::Hold, OPEN_HOLD_TIME));
                self.state = State::OpenSent;
            }
            Event::TcpConnectionFails => {
                out.push(Action::StopTimer(Timer::ConnectRetry));
                self.fail(out);
            }
            // Stale timers.
            Event::HoldTimerExpires
            | Event::KeepaliveTimerExpires
            | Event::IdleHoldTimerExpires => {}
            Event::Announce(_) => {}
            // Anything else (a BGP message before our OPEN went out) is an FSM error.
            _ => {
                out.push(Action::StopTimer(Timer::ConnectRetry));
                out.push(Action::DropTcp);
                self.fail(out);
            }
        }
    }

    fn open_sent(&mut self, event: Event, out: &mut Vec<Action>) {
        match event {
            Event::ManualStart | Event::ManualStartWithPassiveTcpEstablishment => {}
            Event::ManualStop => self.stop(cease_subcode::ADMINISTRATIVE_SHUTDOWN, out),
            Event::BfdDown => self.stop(cease_subcode::BFD_DOWN, out),
            Event::HoldTimerExpires => {
                self.notify_and_fail(
                    Notification::new(error_code::HOLD_TIMER_EXPIRED, 0, Vec::new()),
                    out,
                );
            }
            Event::TcpConnectionFails => {
                // RFC 4271: close, restart the ConnectRetryTimer and wait in Active.
                self.connect_retry_counter = self.connect_retry_counter.saturating_add(1);
                out.push(Action::DropTcp);
                out.push(Action::StopTimer(Timer::Hold));
                out.push(Action::StartTimer(Timer::ConnectRetry, self.retry_delay()));
                self.state = State::Active;
            }
            Event::BGPOpen(open) => match self.negotiate(&open) {
                Ok(negotiated) => {
                    out.push(Action::StopTimer(Timer::ConnectRetry));
                    out.push(Action::SendKeepalive);
                    match negotiated.keepalive {
                        Some(keepalive) => {
                            out.push(Action::StartTimer(Timer::Keepalive, keepalive));
                            out.push(Action::StartTimer(Timer::Hold, negotiated.hold_time));
                        }
                        None => out.push(Action::StopTimer(Timer::Hold)),
                    }
                    self.peer_open = Some(open);
                    self.negotiated = Some(negotiated);
                    self.state = State::OpenConfirm;
                }
                Err(notification) => self.notify_and_fail(notification, out),
            },
            Event::BGPHeaderErr(n) | Event::BGPOpenMsgErr(n) => self.notify_and_fail(n, out),
            Event::OpenCollisionDump => self.collision_dump(out),
            Event::NotifMsgVerErr(_) | Event::NotifMsg(_) => {
                out.push(Action::DropTcp);
                self.fail(out);
            }
            // Stale timers, a second connection (handled by another Session), local UPDATEs.
            Event::ConnectRetryTimerExpires
            | Event::KeepaliveTimerExpires
            | Event::IdleHoldTimerExpires
            | Event::TcpCRAcked
            | Event::TcpConnectionConfirmed
            | Event::Announce(_) => {}
            Event::KeepAliveMsg
            | Event::UpdateMsg(_)
            | Event::UpdateMsgErr(_)
            | Event::RouteRefreshMsg(_) => {
                self.fsm_error(fsm_subcode::UNEXPECTED_IN_OPEN_SENT, out);
            }
        }
    }

    fn open_confirm(&mut self, event: Event, out: &mut Vec<Action>) {
        match event {
            Event::ManualStart | Event::ManualStartWithPassiveTcpEstablishment => {}
            Event::ManualStop => self.stop(cease_subcode::ADMINISTRATIVE_SHUTDOWN, out),
            Event::BfdDown => self.stop(cease_subcode::BFD_DOWN, out),
            Event::HoldTimerExpires => {
                self.notify_and_fail(
                    Notification::new(error_code::HOLD_TIMER_EXPIRED, 0, Vec::new()),
                    out,
                );
            }
            Event::KeepaliveTimerExpires => self.send_keepalive(out),
            Event::TcpConnectionFails | Event::NotifMsgVerErr(_) | Event::NotifMsg(_) => {
                out.push(Action::DropTcp);
                self.fail(out);
            }
            Event::BGPHeaderErr(n) | Event::BGPOpenMsgErr(n) => self.notify_and_fail(n, out),
            Event::OpenCollisionDump => self.collision_dump(out),
            Event::KeepAliveMsg => {
                self.restart_hold_timer(out);
                self.connect_retry_counter = 0;
                if let Some(negotiated) = &self.negotiated {
                    out.push(Action::SessionEstablished(negotiated.clone()));
                }
                self.state = State::Established;
            }
            Event::ConnectRetryTimerExpires
            | Event::IdleHoldTimerExpires
            | Event::TcpCRAcked
            | Event::TcpConnectionConfirmed
            | Event::Announce(_) => {}
            Event::BGPOpen(_)
            | Event::UpdateMsg(_)
            | Event::UpdateMsgErr(_)
            | Event::RouteRefreshMsg(_) => {
                self.fsm_error(fsm_subcode::UNEXPECTED_IN_OPEN_CONFIRM, out);
            }
        }
    }

    fn established(&mut self, event: Event, out: &mut Vec<Action>) {
        match event {
            Event::ManualStart | Event::ManualStartWithPassiveTcpEstablishment => {}
            Event::ManualStop => self.stop(cease_subcode::ADMINISTRATIVE_SHUTDOWN, out),
            Event::BfdDown => self.stop(cease_subcode::BFD_DOWN, out),
            Event::HoldTimerExpires => {
                self.notify_and_fail(
                    Notification::new(error_code::HOLD_TIMER_EXPIRED, 0, Vec::new()),
                    out,
                );
            }
            Event::KeepaliveTimerExpires => self.send_keepalive(out),
            Event::KeepAliveMsg | Event::UpdateMsg(_) => self.restart_hold_timer(out),
            Event::RouteRefreshMsg(rr) => {
                self.restart_hold_timer(out);
                let negotiated = self
                    .negotiated
                    .as_ref()
                    .is_some_and(|n| n.families.contains(&rr.afi_safi));
                // RFC 2918 §4: ignore a refresh for a family that was not negotiated.
                if negotiated && rr.subtype == 0 {
                    out.push(Action::RouteRefreshRequested(rr.afi_safi));
                }
            }
            Event::Announce(update) => {
                out.push(Action::SendUpdate(update));
                // RFC 4271 §4.4: sending an UPDATE restarts the KeepaliveTimer.
                if let Some(keepalive) = self.negotiated.as_ref().and_then(|n| n.keepalive) {
                    out.push(Action::StartTimer(Timer::Keepalive, keepalive));
                }
            }
            Event::TcpConnectionFails => {
                out.push(Action::DropTcp);
                self.fail_with(DownReason::ConnectionLost, out);
            }
            Event::NotifMsgVerErr(n) | Event::NotifMsg(n) => {
                out.push(Action::DropTcp);
                self.fail_with(DownReason::NotificationReceived(n), out);
            }
            Event::BGPHeaderErr(n) | Event::BGPOpenMsgErr(n) | Event::UpdateMsgErr(n) => {
                self.notify_and_fail(n, out);
            }
            Event::OpenCollisionDump => self.collision_dump(out),
            Event::BGPOpen(_) => self.fsm_error(fsm_subcode::UNEXPECTED_IN_ESTABLISHED, out),
            Event::ConnectRetryTimerExpires
            | Event::IdleHoldTimerExpires
            | Event::TcpCRAcked
            | Event::TcpConnectionConfirmed => {}
        }
    }

    /// Checks the peer's OPEN against our configuration and negotiates (RFC 4271 §6.2).
    fn negotiate(&self, open: &Open) -> Result<Negotiated, Notification> {
        let c = &self.config;
        let open_error = |subcode, data| Notification::new(error_code::OPEN_MESSAGE, subcode, data);
        let peer_as = open.asn();
        let as_ok = match c.peer_as {
            _ if peer_as == 0 => false,
            PeerAs::Fixed(asn) => peer_as == asn,
            PeerAs::Internal => peer_as == c.local_as,
            PeerAs::External => peer_as != c.local_as,
        };
        if !as_ok {
            return Err(open_error(
                open_subcode::BAD_PEER_AS,
                open.my_as.to_be_bytes().to_vec(),
            ));
        }
        let internal = peer_as == c.local_as;
        // RFC 6286: non-zero; different from ours within an AS.
        if open.bgp_id.is_unspecified() || (internal && open.bgp_id == c.bgp_id) {
            return Err(open_error(
                open_subcode::BAD_BGP_IDENTIFIER,
                open.bgp_id.octets().to_vec(),
            ));
        }
        if matches!(open.hold_time, 1 | 2) {
            return Err(open_error(open_subcode::UNACCEPTABLE_HOLD_TIME, Vec::new()));
        }
        let peer_families = open.families();
        let families: Vec<AfiSafi> = c
            .families
            .iter()
            .copied()
            .filter(|f| peer_families.contains(f))
            .collect();
        if families.is_empty() {
            // RFC 5492 §5: data is the capabilities we need and the peer lacks.
            let data = c
                .families
                .iter()
                .filter_map(|f| Capability::Multiprotocol(*f).to_bytes().ok())
                .flatten()
                .collect();
            return Err(open_error(open_subcode::UNSUPPORTED_CAPABILITY, data));
        }
        let hold = c.hold_time.min(open.hold_time);
        let keepalive = (hold != 0).then(|| {
            let third = hold / 3;
            Duration::from_secs(u64::from(
                c.keepalive_time.map_or(third, |k| k.min(third)).max(1),
            ))
        });
        Ok(Negotiated {
            peer_as,
            peer_bgp_id: open.bgp_id,
            internal,
            hold_time: Duration::from_secs(u64::from(hold)),
            keepalive,
            // RFC 8950 §2: a speaker may send IPv4 NLRI with an IPv6 next hop only to a peer
            // that advertised the capability for that family, and we only announce what we
            // advertised ourselves.
            extended_next_hop: c.extended_next_hop
                && families.contains(&AfiSafi::IPV4_UNICAST)
                && open
                    .extended_next_hops()
                    .any(|e| e == ExtendedNextHop::IPV4_UNICAST_OVER_IPV6),
            families,
            route_refresh: open.supports_route_refresh(),
            peer_graceful_restart: open.capabilities.iter().find_map(|cap| match cap {
                Capability::GracefulRestart(gr) => Some(gr.clone()),
                _ => None,
            }),
            peer_hostname: open.capabilities.iter().find_map(|cap| match cap {
                Capability::Fqdn { hostname, .. } => Some(hostname.clone()),
                _ => None,
            }),
            codec: CodecContext {
                four_octet_as: open.four_octet_as().is_some(),
            },
        })
    }

    fn send_keepalive(&self, out: &mut Vec<Action>) {
        if let Some(keepalive) = self.negotiated.as_ref().and_then(|n| n.keepalive) {
            out.push(Action::SendKeepalive);
            out.push(Action::StartTimer(Timer::Keepalive, keepalive));
        }
    }

    fn restart_hold_timer(&self, out: &mut Vec<Action>) {
        if let Some(n) = &self.negotiated
            && n.keepalive.is_some()
        {
            out.push(Action::StartTimer(Timer::Hold, n.hold_time));
        }
    }

    /// ManualStop (or BfdDown) after the OPEN went out: Cease with `subcode`, no restart.
    fn stop(&mut self, subcode: u8, out: &mut Vec<Action>) {
        out.push(Action::SendNotification(Notification::cease(subcode)));
        out.push(Action::DropTcp);
        self.stop_timers(out);
        if self.state == State::Established {
            out.push(Action::SessionDown(DownReason::Stopped));
        }
        self.start = None;
        self.connect_retry_counter = 0;
        self.peer_open = None;
        self.negotiated = None;
        self.state = State::Idle;
    }

    fn collision_dump(&mut self, out: &mut Vec<Action>) {
        self.notify_and_fail(
            Notification::cease(cease_subcode::CONNECTION_COLLISION_RESOLUTION),
            out,
        );
    }

    fn fsm_error(&mut self, subcode: u8, out: &mut Vec<Action>) {
        self.notify_and_fail(Notification::new(error_code::FSM, subcode, Vec::new()), out);
    }

    fn notify_and_fail(&mut self, notification: Notification, out: &mut Vec<Action>) {
        out.push(Action::SendNotification(notification.clone()));
        out.push(Action::DropTcp);
        self.fail_with(DownReason::NotificationSent(notification), out);
    }

    fn fail(&mut self, out: &mut Vec<Action>) {
        self.fail_with(DownReason::ConnectionLost, out);
    }

    /// Any failure: stop timers, report a lost session, count the failure and schedule an
    /// automatic restart after the backoff.
    fn fail_with(&mut self, reason: DownReason, out: &mut Vec<Action>) {
        if self.state != State::Connect && self.state != State::Active {
            self.stop_timers(out);
        }
        if self.state == State::Established {
            out.push(Action::SessionDown(reason));
        }
        self.connect_retry_counter = self.connect_retry_counter.saturating_add(1);
        self.peer_open = None;
        self.negotiated = None;
        self.state = State::Idle;
        out.push(Action::StartTimer(Timer::IdleHold, self.retry_delay()));
    }

    fn stop_timers(&self, out: &mut Vec<Action>) {
        out.extend([Timer::ConnectRetry, Timer::Hold, Timer::Keepalive].map(Action::StopTimer));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::packet::{AsPath, Origin, PathAttributes};

    const LOCAL_ID: Ipv4Addr = Ipv4Addr::new(198, 18, 250, 10);
    const PEER_ID: Ipv4Addr = Ipv4Addr::new(198, 18, 250, 1);

    fn config() -> Config {
        Config {
            local_as: 64512,
            peer_as: PeerAs::Fixed(64513),
            bgp_id: LOCAL_ID,
            hold_time: 90,
            keepalive_time: None,
            connect_retry: Backoff {
                initial: Duration::from_secs(5),
                max: Duration::from_secs(120),
            },
            families: vec![AfiSafi::IPV4_UNICAST, AfiSafi::IPV6_UNICAST],
            graceful_restart_time: None,
            extended_next_hop: false,
        }
    }

    fn peer_open(asn: u32, hold_time: u16) -> Open {
        Open::new(
            asn,
            hold_time,
            PEER_ID,
            vec![
                Capability::Multiprotocol(AfiSafi::IPV4_UNICAST),
                Capability::Multiprotocol(AfiSafi::IPV6_UNICAST),
                Capability::RouteRefresh,
            ],
        )
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn session_in(config: Config, state: State) -> Session {
        let mut s = Session::new(config).unwrap();
        let peer_as = match s.config.peer_as {
            PeerAs::Fixed(a) => a,
            PeerAs::Internal => s.config.local_as,
            PeerAs::External => 65000,
        };
        let steps: &[Event] = match state {
            State::Idle => &[],
            State::Connect => &[Event::ManualStart],
            State::Active => &[Event::ManualStartWithPassiveTcpEstablishment],
            State::OpenSent => &[Event::ManualStart, Event::TcpCRAcked],
            State::OpenConfirm => &[
                Event::ManualStart,
                Event::TcpCRAcked,
                Event::BGPOpen(peer_open(peer_as, 90)),
            ],
            State::Established => &[
                Event::ManualStart,
                Event::TcpCRAcked,
                Event::BGPOpen(peer_open(peer_as, 90)),
                Event::KeepAliveMsg,
            ],
        };
        for e in steps {
            s.handle(e.clone());
        }
        assert_eq!(s.state(), state);
        s
    }

    fn sent_notification(actions: &[Action]) -> Option<&Notification> {
        actions.iter().find_map(|a| match a {
            Action::SendNotification(n) => Some(n),
            _ => None,
        })
    }

    fn timer_started(actions: &[Action], timer: Timer) -> Option<Duration> {
        actions.iter().find_map(|a| match a {
            Action::StartTimer(t, d) if *t == timer => Some(*d),
            _ => None,
        })
    }

    fn update() -> Update {
        Update {
            nlri: vec!["198.18.250.100/32".parse().unwrap()],
            attributes: PathAttributes {
                origin: Some(Origin::Igp),
                as_path: Some(AsPath::sequence(&[64512])),
                next_hop: Some(LOCAL_ID),
                ..PathAttributes::default()
            },
            ..Update::default()
        }
    }

    // ------------------------------------------------------------ configuration

    #[test]
    fn hold_time_of_one_or_two_seconds_is_rejected_in_config() {
        for hold in [1, 2] {
            let c = Config {
                hold_time: hold,
                ..config()
            };
            assert_eq!(Session::new(c).unwrap_err(), ConfigError::HoldTime(hold));
        }
    }

    #[test]
    fn keepalive_longer_than_hold_is_rejected_in_config() {
        let c = Config {
            hold_time: 9,
            keepalive_time: Some(10),
            ..config()
        };
        assert!(matches!(
            Session::new(c),
            Err(ConfigError::KeepaliveTime { .. })
        ));
    }

    #[test]
    fn our_open_carries_as_trans_and_four_octet_as_for_large_asn() {
        let s = Session::new(Config {
            local_as: 4_200_000_001,
            ..config()
        })
        .unwrap();
        let open = s.open_message();
        assert_eq!(open.my_as, 23456);
        assert_eq!(open.four_octet_as(), Some(4_200_000_001));
        assert_eq!(
            open.families(),
            vec![AfiSafi::IPV4_UNICAST, AfiSafi::IPV6_UNICAST]
        );
        assert!(open.supports_route_refresh());
    }

    #[test]
    fn graceful_restart_is_advertised_when_enabled() {
        let s = Session::new(Config {
            graceful_restart_time: Some(120),
            ..config()
        })
        .unwrap();
        let gr = s
            .open_message()
            .capabilities
            .into_iter()
            .find_map(|c| match c {
                Capability::GracefulRestart(gr) => Some(gr),
                _ => None,
            });
        let gr = gr.unwrap();
        assert_eq!((gr.restart_time, gr.families.len()), (120, 2));
        assert!(
            gr.families.iter().all(|f| f.forwarding_preserved),
            "the node's data path survives a speaker restart: {gr:?}"
        );
    }

    // ------------------------------------------------------------ Idle, Connect, Active

    #[test]
    fn manual_start_connects_and_starts_connect_retry_timer() {
        let mut s = Session::new(config()).unwrap();
        let actions = s.handle(Event::ManualStart);
        assert_eq!(s.state(), State::Connect);
        assert!(actions.contains(&Action::ConnectTcp));
        assert_eq!(timer_started(&actions, Timer::ConnectRetry), Some(secs(5)));
    }

    #[test]
    fn idle_refuses_incoming_connections() {
        let mut s = Session::new(config()).unwrap();
        assert_eq!(
            s.handle(Event::TcpConnectionConfirmed),
            vec![Action::DropTcp]
        );
        assert_eq!(s.state(), State::Idle);
    }

    #[test]
    fn idle_waiting_for_restart_takes_the_peers_connection() {
        let mut s = session_in(config(), State::Connect);
        s.handle(Event::TcpConnectionFails);
        assert_eq!(s.state(), State::Idle);
        let actions = s.handle(Event::TcpConnectionConfirmed);
        assert_eq!(s.state(), State::OpenSent);
        assert!(actions.contains(&Action::StopTimer(Timer::IdleHold)));
        assert!(actions.contains(&Action::SendOpen(s.open_message())));
        assert_eq!(timer_started(&actions, Timer::Hold), Some(OPEN_HOLD_TIME));
        // After a ManualStop it refuses again.
        s.handle(Event::ManualStop);
        assert_eq!(
            s.handle(Event::TcpConnectionConfirmed),
            vec![Action::DropTcp]
        );
    }

    #[test]
    fn idle_ignores_messages_and_timers() {
        let mut s = Session::new(config()).unwrap();
        for e in [
            Event::KeepAliveMsg,
            Event::HoldTimerExpires,
            Event::UpdateMsg(update()),
        ] {
            assert!(s.handle(e).is_empty());
        }
        assert_eq!(s.state(), State::Idle);
    }

    #[test]
    fn connection_up_sends_open_and_waits_with_a_four_minute_hold_timer() {
        let mut s = session_in(config(), State::Connect);
        let actions = s.handle(Event::TcpCRAcked);
        assert_eq!(s.state(), State::OpenSent);
        assert!(actions.contains(&Action::SendOpen(s.open_message())));
        assert_eq!(timer_started(&actions, Timer::Hold), Some(OPEN_HOLD_TIME));
        assert!(actions.contains(&Action::StopTimer(Timer::ConnectRetry)));
    }

    #[test]
    fn accepted_connection_in_connect_is_used_too() {
        let mut s = session_in(config(), State::Connect);
        s.handle(Event::TcpConnectionConfirmed);
        assert_eq!(s.state(), State::OpenSent);
    }

    #[test]
    fn connect_retry_expiry_retries_with_exponential_backoff() {
        let mut s = session_in(config(), State::Connect);
        let waits: Vec<Duration> = (0..7)
            .map(|_| {
                let actions = s.handle(Event::ConnectRetryTimerExpires);
                assert!(actions.contains(&Action::ConnectTcp));
                assert_eq!(actions.first(), Some(&Action::DropTcp));
                timer_started(&actions, Timer::ConnectRetry).unwrap()
            })
            .collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 120, 120].map(secs));
        assert_eq!(s.state(), State::Connect);
    }

    #[test]
    fn backoff_never_overflows() {
        let b = Backoff {
            initial: secs(5),
            max: secs(300),
        };
        assert_eq!(b.delay(0), secs(5));
        assert_eq!(b.delay(40), secs(300));
        assert_eq!(b.delay(u32::MAX), secs(300));
    }

    #[test]
    fn tcp_failure_in_connect_goes_idle_and_schedules_a_restart() {
        let mut s = session_in(config(), State::Connect);
        let actions = s.handle(Event::TcpConnectionFails);
        assert_eq!(s.state(), State::Idle);
        assert_eq!(timer_started(&actions, Timer::IdleHold), Some(secs(5)));
        let actions = s.handle(Event::IdleHoldTimerExpires);
        assert_eq!(s.state(), State::Connect);
        assert!(actions.contains(&Action::ConnectTcp));
    }

    #[test]
    fn manual_stop_in_connect_goes_idle_without_restart() {
        let mut s = session_in(config(), State::Connect);
        let actions = s.handle(Event::ManualStop);
        assert_eq!(s.state(), State::Idle);
        assert!(actions.contains(&Action::DropTcp));
        assert_eq!(timer_started(&actions, Timer::IdleHold), None);
    }

    #[test]
    fn passive_start_waits_in_active_then_connects_on_retry() {
        let mut s = session_in(config(), State::Active);
        let actions = s.handle(Event::ConnectRetryTimerExpires);
        assert_eq!(s.state(), State::Connect);
        assert!(actions.contains(&Action::ConnectTcp));
        assert!(!actions.contains(&Action::DropTcp));
    }

    #[test]
    fn passive_session_accepts_the_peer_connection() {
        let mut s = session_in(config(), State::Active);
        let actions = s.handle(Event::TcpConnectionConfirmed);
        assert_eq!(s.state(), State::OpenSent);
        assert!(matches!(actions[1], Action::SendOpen(_)));
    }

    // ------------------------------------------------------------ OpenSent

    #[test]
    fn open_exchange_reaches_established() {
        let mut s = session_in(config(), State::OpenSent);
        let actions = s.handle(Event::BGPOpen(peer_open(64513, 90)));
        assert_eq!(s.state(), State::OpenConfirm);
        assert!(actions.contains(&Action::SendKeepalive));
        let actions = s.handle(Event::KeepAliveMsg);
        assert_eq!(s.state(), State::Established);
        let Some(Action::SessionEstablished(n)) = actions.last() else {
            panic!("{actions:?}")
        };
        assert_eq!(n.peer_as, 64513);
        assert_eq!(n.peer_bgp_id, PEER_ID);
        assert!(!n.internal);
        assert!(n.route_refresh);
        assert!(!n.extended_next_hop);
        assert_eq!(
            n.families,
            vec![AfiSafi::IPV4_UNICAST, AfiSafi::IPV6_UNICAST]
        );
        assert_eq!(
            n.codec,
            CodecContext {
                four_octet_as: true
            }
        );
    }

    #[test]
    fn hold_time_is_the_smaller_proposal_and_keepalive_a_third_of_it() {
        let mut s = session_in(config(), State::OpenSent);
        let actions = s.handle(Event::BGPOpen(peer_open(64513, 30)));
        assert_eq!(timer_started(&actions, Timer::Hold), Some(secs(30)));
        assert_eq!(timer_started(&actions, Timer::Keepalive), Some(secs(10)));
        assert_eq!(s.negotiated().unwrap().hold_time, secs(30));
    }

    #[test]
    fn configured_keepalive_is_used_when_it_fits() {
        let mut s = session_in(
            Config {
                keepalive_time: Some(5),
                ..config()
            },
            State::OpenSent,
        );
        let actions = s.handle(Event::BGPOpen(peer_open(64513, 90)));
        assert_eq!(timer_started(&actions, Timer::Keepalive), Some(secs(5)));
    }

    #[test]
    fn configured_keepalive_is_shortened_to_a_third_of_a_smaller_negotiated_hold() {
        let mut s = session_in(
            Config {
                keepalive_time: Some(20),
                ..config()
            },
            State::OpenSent,
        );
        let actions = s.handle(Event::BGPOpen(peer_open(64513, 9)));
        assert_eq!(timer_started(&actions, Timer::Keepalive), Some(secs(3)));
    }

    #[test]
    fn zero_hold_time_disables_keepalives() {
        let mut s = session_in(config(), State::OpenSent);
        let actions = s.handle(Event::BGPOpen(peer_open(64513, 0)));
        assert_eq!(s.state(), State::OpenConfirm);
        assert_eq!(timer_started(&actions, Timer::Keepalive), None);
        assert!(actions.contains(&Action::StopTimer(Timer::Hold)));
        assert_eq!(s.negotiated().unwrap().keepalive, None);
        let actions = s.handle(Event::KeepAliveMsg);
        assert_eq!(timer_started(&actions, Timer::Hold), None);
        assert!(s.handle(Event::KeepaliveTimerExpires).is_empty());
        assert!(s.handle(Event::UpdateMsg(update())).is_empty());
    }

    #[test]
    fn hold_time_of_one_or_two_seconds_sends_unacceptable_hold_time() {
        for hold in [1, 2] {
            let mut s = session_in(config(), State::OpenSent);
            let actions = s.handle(Event::BGPOpen(peer_open(64513, hold)));
            let n = sent_notification(&actions).unwrap();
            assert_eq!(
                (n.code, n.subcode),
                (
                    error_code::OPEN_MESSAGE,
                    open_subcode::UNACCEPTABLE_HOLD_TIME
                )
            );
            assert_eq!(s.state(), State::Idle);
        }
    }

    #[test]
    fn asn_mismatch_sends_notification_bad_peer_as() {
        let mut s = session_in(config(), State::OpenSent);
        let actions = s.handle(Event::BGPOpen(peer_open(64999, 90)));
        let n = sent_notification(&actions).unwrap();
        assert_eq!(
            (n.code, n.subcode),
            (error_code::OPEN_MESSAGE, open_subcode::BAD_PEER_AS)
        );
        assert_eq!(n.data, 64999u16.to_be_bytes());
        assert!(actions.contains(&Action::DropTcp));
        assert_eq!(s.state(), State::Idle);
    }

    #[test]
    fn four_octet_peer_as_is_read_from_the_capability() {
        let mut s = session_in(
            Config {
                peer_as: PeerAs::Fixed(4_200_000_001),
                ..config()
            },
            State::OpenSent,
        );
        let open = peer_open(4_200_000_001, 90);
        assert_eq!(open.my_as, 23456);
        s.handle(Event::BGPOpen(open));
        assert_eq!(s.state(), State::OpenConfirm);
    }

    #[test]
    fn peer_without_four_octet_capability_gets_a_two_octet_codec() {
        let mut s = session_in(config(), State::OpenSent);
        let mut open = peer_open(64513, 90);
        open.capabilities
            .retain(|c| !matches!(c, Capability::FourOctetAs(_)));
        s.handle(Event::BGPOpen(open));
        assert_eq!(
            s.negotiated().unwrap().codec,
            CodecContext {
                four_octet_as: false
            }
        );
    }

    #[test]
    fn dynamic_internal_accepts_only_our_own_as() {
        let c = Config {
            peer_as: PeerAs::Internal,
            ..config()
        };
        let mut s = session_in(c.clone(), State::OpenSent);
        s.handle(Event::BGPOpen(peer_open(64512, 90)));
        assert_eq!(s.state(), State::OpenConfirm);
        assert!(s.negotiated().unwrap().internal);
        let mut s = session_in(c, State::OpenSent);
        let actions = s.handle(Event::BGPOpen(peer_open(64513, 90)));
        assert_eq!(
            sent_notification(&actions).unwrap().subcode,
            open_subcode::BAD_PEER_AS
        );
    }

    #[test]
    fn dynamic_external_accepts_any_other_as() {
        let c = Config {
            peer_as: PeerAs::External,
            ..config()
        };
        let mut s = session_in(c.clone(), State::OpenSent);
        s.handle(Event::BGPOpen(peer_open(65001, 90)));
        assert_eq!(s.state(), State::OpenConfirm);
        let mut s = session_in(c, State::OpenSent);
        let actions = s.handle(Event::BGPOpen(peer_open(64512, 90)));
        assert_eq!(
            sent_notification(&actions).unwrap().subcode,
            open_subcode::BAD_PEER_AS
        );
    }

    #[test]
    fn peer_as_zero_is_bad_peer_as() {
        let mut s = session_in(
            Config {
                peer_as: PeerAs::External,
                ..config()
            },
            State::OpenSent,
        );
        let actions = s.handle(Event::BGPOpen(peer_open(0, 90)));
        assert_eq!(
            sent_notification(&actions).unwrap().subcode,
            open_subcode::BAD_PEER_AS
        );
    }

    #[test]
    fn zero_bgp_identifier_sends_bad_bgp_identifier() {
        let mut s = session_in(config(), State::OpenSent);
        let mut open = peer_open(64513, 90);
        open.bgp_id = Ipv4Addr::UNSPECIFIED;
        let actions = s.handle(Event::BGPOpen(open));
        assert_eq!(
            sent_notification(&actions).unwrap().subcode,
            open_subcode::BAD_BGP_IDENTIFIER
        );
    }

    #[test]
    fn ibgp_peer_with_our_identifier_sends_bad_bgp_identifier() {
        let mut s = session_in(
            Config {
                peer_as: PeerAs::Internal,
                ..config()
            },
            State::OpenSent,
        );
        let mut open = peer_open(64512, 90);
        open.bgp_id = LOCAL_ID;
        let actions = s.handle(Event::BGPOpen(open));
        assert_eq!(
            sent_notification(&actions).unwrap().subcode,
            open_subcode::BAD_BGP_IDENTIFIER
        );
    }

    #[test]
    fn capability_negotiation_keeps_only_common_families() {
        let mut s = session_in(config(), State::OpenSent);
        let open = Open::new(
            64513,
            90,
            PEER_ID,
            vec![Capability::Multiprotocol(AfiSafi::IPV6_UNICAST)],
        );
        s.handle(Event::BGPOpen(open));
        assert_eq!(
            s.negotiated().unwrap().families,
            vec![AfiSafi::IPV6_UNICAST]
        );
        assert!(!s.negotiated().unwrap().route_refresh);
    }

    #[test]
    fn peer_without_multiprotocol_capability_speaks_ipv4_unicast() {
        let mut s = session_in(config(), State::OpenSent);
        s.handle(Event::BGPOpen(Open::new(64513, 90, PEER_ID, vec![])));
        assert_eq!(
            s.negotiated().unwrap().families,
            vec![AfiSafi::IPV4_UNICAST]
        );
    }

    #[test]
    fn no_common_family_sends_unsupported_capability() {
        let mut s = session_in(
            Config {
                families: vec![AfiSafi::IPV6_UNICAST],
                ..config()
            },
            State::OpenSent,
        );
        let actions = s.handle(Event::BGPOpen(Open::new(64513, 90, PEER_ID, vec![])));
        let n = sent_notification(&actions).unwrap();
        assert_eq!(n.subcode, open_subcode::UNSUPPORTED_CAPABILITY);
        assert_eq!(n.data, [1, 4, 0, 2, 0, 1]);
    }

    #[test]
    fn peer_hostname_and_graceful_restart_are_recorded() {
        let mut s = session_in(config(), State::OpenSent);
        let mut open = peer_open(64513, 90);
        open.capabilities.push(Capability::Fqdn {
            hostname: "frr-a".into(),
            domain: "lab.example".into(),
        });
        open.capabilities
            .push(Capability::GracefulRestart(GracefulRestart {
                restart_state: false,
                notification: true,
                restart_time: 120,
                families: vec![],
            }));
        s.handle(Event::BGPOpen(open));
        let n = s.negotiated().unwrap();
        assert_eq!(n.peer_hostname.as_deref(), Some("frr-a"));
        assert_eq!(
            n.peer_graceful_restart.as_ref().map(|g| g.restart_time),
            Some(120)
        );
    }

    /// The peer's OPEN of `peer_open` with an extended next hop capability of `entries`.
    fn peer_open_with_enhe(entries: Vec<ExtendedNextHop>) -> Open {
        let mut open = peer_open(64513, 90);
        open.capabilities.push(Capability::ExtendedNextHop(entries));
        open
    }

    fn negotiated_enhe(config: Config, open: Open) -> bool {
        let mut s = session_in(config, State::OpenSent);
        s.handle(Event::BGPOpen(open));
        s.negotiated().unwrap().extended_next_hop
    }

    fn enhe_config() -> Config {
        Config {
            extended_next_hop: true,
            ..config()
        }
    }

    #[test]
    fn extended_next_hop_is_advertised_only_when_configured() {
        let caps = |c: Config| Session::new(c).unwrap().open_message().capabilities;
        assert!(
            !caps(config())
                .iter()
                .any(|c| matches!(c, Capability::ExtendedNextHop(_)))
        );
        let ours = caps(enhe_config());
        assert!(ours.contains(&Capability::ExtendedNextHop(vec![
            ExtendedNextHop::IPV4_UNICAST_OVER_IPV6
        ])));
        // On the wire: code 5, length 6, AFI 1, SAFI 1, next hop AFI 2.
        let bytes = Capability::ExtendedNextHop(vec![ExtendedNextHop::IPV4_UNICAST_OVER_IPV6])
            .to_bytes()
            .unwrap();
        assert_eq!(bytes, [5, 6, 0, 1, 0, 1, 0, 2]);
        // Without IPv4 unicast there is nothing to carry.
        let v6_only = Config {
            families: vec![AfiSafi::IPV6_UNICAST],
            ..enhe_config()
        };
        assert!(
            !caps(v6_only)
                .iter()
                .any(|c| matches!(c, Capability::ExtendedNextHop(_)))
        );
    }

    #[test]
    fn extended_next_hop_is_negotiated_when_both_sides_send_it() {
        let ipv4_over_ipv6 = ExtendedNextHop::IPV4_UNICAST_OVER_IPV6;
        assert!(negotiated_enhe(
            enhe_config(),
            peer_open_with_enhe(vec![ipv4_over_ipv6])
        ));
        // Among other entries (FRR also lists IPv4 VPN), and in a capability of its own.
        let vpn = ExtendedNextHop {
            afi: 1,
            safi: 128,
            next_hop_afi: 2,
        };
        assert!(negotiated_enhe(
            enhe_config(),
            peer_open_with_enhe(vec![vpn, ipv4_over_ipv6])
        ));
        let mut split = peer_open_with_enhe(vec![vpn]);
        split
            .capabilities
            .push(Capability::ExtendedNextHop(vec![ipv4_over_ipv6]));
        assert!(negotiated_enhe(enhe_config(), split));
    }

    #[test]
    fn extended_next_hop_is_not_negotiated_when_only_one_side_sends_it() {
        let ipv4_over_ipv6 = ExtendedNextHop::IPV4_UNICAST_OVER_IPV6;
        // Only we send it.
        assert!(!negotiated_enhe(enhe_config(), peer_open(64513, 90)));
        // Only the peer sends it.
        assert!(!negotiated_enhe(
            config(),
            peer_open_with_enhe(vec![ipv4_over_ipv6])
        ));
        // The peer sends it for other families only.
        for other in [
            ExtendedNextHop {
                afi: 1,
                safi: 128,
                next_hop_afi: 2,
            },
            ExtendedNextHop {
                afi: 2,
                safi: 1,
                next_hop_afi: 1,
            },
            ExtendedNextHop {
                afi: 1,
                safi: 1,
                next_hop_afi: 1,
            },
        ] {
            assert!(!negotiated_enhe(
                enhe_config(),
                peer_open_with_enhe(vec![other])
            ));
        }
        // A malformed capability (not a multiple of six octets) is kept as unknown and means
        // nothing.
        let mut open = peer_open(64513, 90);
        open.capabilities.push(Capability::Unknown {
            code: 5,
            value: vec![0, 1, 0, 1, 0],
        });
        assert!(!negotiated_enhe(enhe_config(), open));
        // Both send it, but IPv4 unicast is not a common family.
        let v6_peer = Open::new(
            64513,
            90,
            PEER_ID,
            vec![
                Capability::Multiprotocol(AfiSafi::IPV6_UNICAST),
                Capability::ExtendedNextHop(vec![ipv4_over_ipv6]),
            ],
        );
        assert!(!negotiated_enhe(enhe_config(), v6_peer));
    }

    #[test]
    fn hold_timer_expiry_in_open_sent_sends_hold_timer_expired() {
        let mut s = session_in(config(), State::OpenSent);
        let actions = s.handle(Event::HoldTimerExpires);
        assert_eq!(
            sent_notification(&actions).unwrap().code,
            error_code::HOLD_TIMER_EXPIRED
        );
        assert_eq!(s.state(), State::Idle);
    }

    #[test]
    fn tcp_failure_in_open_sent_waits_in_active() {
        let mut s = session_in(config(), State::OpenSent);
        let actions = s.handle(Event::TcpConnectionFails);
        assert_eq!(s.state(), State::Active);
        assert!(timer_started(&actions, Timer::ConnectRetry).is_some());
    }

    #[test]
    fn keepalive_before_open_is_an_fsm_error() {
        let mut s = session_in(config(), State::OpenSent);
        let actions = s.handle(Event::KeepAliveMsg);
        let n = sent_notification(&actions).unwrap();
        assert_eq!(
            (n.code, n.subcode),
            (error_code::FSM, fsm_subcode::UNEXPECTED_IN_OPEN_SENT)
        );
        assert_eq!(s.state(), State::Idle);
    }

    #[test]
    fn malformed_open_sends_the_decoders_notification() {
        let mut s = session_in(config(), State::OpenSent);
        let event = Event::from_decoded(Err(DecodeError::UnsupportedVersion { version: 3 }));
        let actions = s.handle(event);
        let n = sent_notification(&actions).unwrap();
        assert_eq!((n.code, n.subcode, n.data.as_slice()), (2, 1, &[0, 4][..]));
        assert_eq!(s.state(), State::Idle);
    }

    #[test]
    fn notification_in_open_sent_closes_without_answering() {
        let mut s = session_in(config(), State::OpenSent);
        let actions = s.handle(Event::NotifMsg(Notification::cease(
            cease_subcode::CONNECTION_REJECTED,
        )));
        assert_eq!(sent_notification(&actions), None);
        assert!(actions.contains(&Action::DropTcp));
        assert_eq!(s.state(), State::Idle);
    }

    // ------------------------------------------------------------ OpenConfirm

    #[test]
    fn keepalive_timer_in_open_confirm_sends_keepalive() {
        let mut s = session_in(config(), State::OpenConfirm);
        let actions = s.handle(Event::KeepaliveTimerExpires);
        assert_eq!(
            actions,
            vec![
                Action::SendKeepalive,
                Action::StartTimer(Timer::Keepalive, secs(30))
            ]
        );
    }

    #[test]
    fn update_in_open_confirm_is_an_fsm_error() {
        let mut s = session_in(config(), State::OpenConfirm);
        let actions = s.handle(Event::UpdateMsg(update()));
        assert_eq!(
            sent_notification(&actions).unwrap().subcode,
            fsm_subcode::UNEXPECTED_IN_OPEN_CONFIRM
        );
        assert_eq!(s.state(), State::Idle);
    }

    #[test]
    fn manual_stop_in_open_confirm_sends_cease() {
        let mut s = session_in(config(), State::OpenConfirm);
        let actions = s.handle(Event::ManualStop);
        let n = sent_notification(&actions).unwrap();
        assert_eq!(
            (n.code, n.subcode),
            (error_code::CEASE, cease_subcode::ADMINISTRATIVE_SHUTDOWN)
        );
        assert!(!actions.iter().any(|a| matches!(a, Action::SessionDown(_))));
        assert_eq!(s.state(), State::Idle);
    }

    // ------------------------------------------------------------ Established

    #[test]
    fn keepalive_and_update_restart_the_hold_timer() {
        let mut s = session_in(config(), State::Established);
        assert_eq!(
            s.handle(Event::KeepAliveMsg),
            vec![Action::StartTimer(Timer::Hold, secs(90))]
        );
        assert_eq!(
            s.handle(Event::UpdateMsg(update())),
            vec![Action::StartTimer(Timer::Hold, secs(90))]
        );
    }

    #[test]
    fn keepalive_timer_sends_keepalive_and_restarts() {
        let mut s = session_in(config(), State::Established);
        let actions = s.handle(Event::KeepaliveTimerExpires);
        assert_eq!(
            actions,
            vec![
                Action::SendKeepalive,
                Action::StartTimer(Timer::Keepalive, secs(30))
            ]
        );
    }

    #[test]
    fn announce_sends_update_and_restarts_keepalive_timer() {
        let mut s = session_in(config(), State::Established);
        let actions = s.handle(Event::Announce(update()));
        assert_eq!(
            actions,
            vec![
                Action::SendUpdate(update()),
                Action::StartTimer(Timer::Keepalive, secs(30))
            ]
        );
    }

    #[test]
    fn announce_before_established_is_dropped() {
        let mut s = session_in(config(), State::OpenConfirm);
        assert!(s.handle(Event::Announce(update())).is_empty());
    }

    #[test]
    fn hold_timer_expiry_sends_notification_and_goes_idle() {
        let mut s = session_in(config(), State::Established);
        let actions = s.handle(Event::HoldTimerExpires);
        let expired = Notification::new(error_code::HOLD_TIMER_EXPIRED, 0, Vec::new());
        assert_eq!(actions[0], Action::SendNotification(expired.clone()));
        assert_eq!(actions[1], Action::DropTcp);
        assert!(actions.contains(&Action::SessionDown(DownReason::NotificationSent(expired))));
        assert!(actions.contains(&Action::StopTimer(Timer::Keepalive)));
        assert_eq!(timer_started(&actions, Timer::IdleHold), Some(secs(5)));
        assert_eq!(s.state(), State::Idle);
        assert_eq!(s.negotiated(), None);
    }

    #[test]
    fn malformed_update_sends_update_message_error() {
        let mut s = session_in(config(), State::Established);
        let err = DecodeError::Update {
            subcode: 1,
            data: vec![],
            what: "test",
        };
        let actions = s.handle(Event::from_decoded(Err(err)));
        let n = sent_notification(&actions).unwrap();
        assert_eq!((n.code, n.subcode), (error_code::UPDATE_MESSAGE, 1));
        assert_eq!(s.state(), State::Idle);
    }

    #[test]
    fn notification_from_peer_takes_the_session_down() {
        let mut s = session_in(config(), State::Established);
        let n = Notification::administrative_shutdown("maintenance");
        let actions = s.handle(Event::from_decoded(Ok(Message::Notification(n.clone()))));
        assert!(actions.contains(&Action::SessionDown(DownReason::NotificationReceived(n))));
        assert_eq!(sent_notification(&actions), None);
        assert_eq!(s.state(), State::Idle);
    }

    #[test]
    fn version_notification_is_its_own_event() {
        let n = Notification::new(
            error_code::OPEN_MESSAGE,
            open_subcode::UNSUPPORTED_VERSION_NUMBER,
            vec![0, 4],
        );
        assert_eq!(
            Event::from_decoded(Ok(Message::Notification(n.clone()))),
            Event::NotifMsgVerErr(n)
        );
    }

    #[test]
    fn tcp_failure_in_established_reports_connection_lost() {
        let mut s = session_in(config(), State::Established);
        let actions = s.handle(Event::TcpConnectionFails);
        assert!(actions.contains(&Action::SessionDown(DownReason::ConnectionLost)));
        assert_eq!(s.state(), State::Idle);
    }

    #[test]
    fn second_open_in_established_is_an_fsm_error() {
        let mut s = session_in(config(), State::Established);
        let actions = s.handle(Event::BGPOpen(peer_open(64513, 90)));
        assert_eq!(
            sent_notification(&actions).unwrap().subcode,
            fsm_subcode::UNEXPECTED_IN_ESTABLISHED
        );
    }

    #[test]
    fn manual_stop_in_established_sends_cease_and_reports_down() {
        let mut s = session_in(config(), State::Established);
        let actions = s.handle(Event::ManualStop);
        assert_eq!(
            actions[0],
            Action::SendNotification(Notification::cease(cease_subcode::ADMINISTRATIVE_SHUTDOWN))
        );
        assert!(actions.contains(&Action::SessionDown(DownReason::Stopped)));
        assert_eq!(timer_started(&actions, Timer::IdleHold), None);
        assert_eq!(s.state(), State::Idle);
    }

    /// BFD down (RFC 9384): Cease / BFD Down, session down, no automatic restart; a
    /// ManualStart brings it back; in Connect it just stops.
    #[test]
    fn bfd_down_stops_with_cease_bfd_down_until_started_again() {
        let mut s = session_in(config(), State::Established);
        let actions = s.handle(Event::BfdDown);
        assert_eq!(
            actions[0],
            Action::SendNotification(Notification::cease(cease_subcode::BFD_DOWN))
        );
        assert!(actions.contains(&Action::SessionDown(DownReason::Stopped)));
        assert_eq!(timer_started(&actions, Timer::IdleHold), None);
        assert_eq!(s.state(), State::Idle);
        assert!(s.handle(Event::IdleHoldTimerExpires).is_empty());
        assert!(s.handle(Event::ManualStart).contains(&Action::ConnectTcp));
        let actions = s.handle(Event::BfdDown);
        assert!(sent_notification(&actions).is_none());
        assert_eq!(s.state(), State::Idle);
    }

    #[test]
    fn route_refresh_for_a_negotiated_family_is_passed_on() {
        let mut s = session_in(config(), State::Established);
        let actions = s.handle(Event::RouteRefreshMsg(RouteRefresh::new(
            AfiSafi::IPV6_UNICAST,
        )));
        assert!(actions.contains(&Action::RouteRefreshRequested(AfiSafi::IPV6_UNICAST)));
        let other = AfiSafi { afi: 25, safi: 65 };
        let actions = s.handle(Event::RouteRefreshMsg(RouteRefresh::new(other)));
        assert!(
            !actions
                .iter()
                .any(|a| matches!(a, Action::RouteRefreshRequested(_)))
        );
    }

    #[test]
    fn stale_timer_events_are_ignored() {
        let mut s = session_in(config(), State::Established);
        assert!(s.handle(Event::ConnectRetryTimerExpires).is_empty());
        assert!(s.handle(Event::IdleHoldTimerExpires).is_empty());
        assert_eq!(s.state(), State::Established);
    }

    // ------------------------------------------------------------ restarts and backoff

    #[test]
    fn repeated_failures_back_off_and_established_resets_the_counter() {
        let mut s = session_in(config(), State::Established);
        let mut waits = Vec::new();
        for _ in 0..3 {
            let actions = s.handle(Event::HoldTimerExpires);
            waits.push(timer_started(&actions, Timer::IdleHold).unwrap());
            s.handle(Event::IdleHoldTimerExpires);
            s.handle(Event::TcpConnectionFails);
            let actions = s.handle(Event::IdleHoldTimerExpires);
            assert!(actions.contains(&Action::ConnectTcp));
            s.handle(Event::TcpCRAcked);
            s.handle(Event::BGPOpen(peer_open(64513, 90)));
            s.handle(Event::KeepAliveMsg);
            assert_eq!(s.state(), State::Established);
            assert_eq!(s.connect_retry_counter(), 0);
        }
        assert_eq!(waits, [secs(5); 3]);
        s.handle(Event::TcpConnectionFails);
        s.handle(Event::IdleHoldTimerExpires);
        let actions = s.handle(Event::TcpConnectionFails);
        assert_eq!(timer_started(&actions, Timer::IdleHold), Some(secs(10)));
    }

    #[test]
    fn idle_hold_expiry_after_manual_stop_does_not_restart() {
        let mut s = session_in(config(), State::Connect);
        s.handle(Event::TcpConnectionFails);
        s.handle(Event::ManualStop);
        assert!(s.handle(Event::IdleHoldTimerExpires).is_empty());
        assert_eq!(s.state(), State::Idle);
    }

    #[test]
    fn passive_session_restarts_passive() {
        let mut s = session_in(config(), State::Active);
        s.handle(Event::TcpConnectionConfirmed);
        s.handle(Event::NotifMsg(Notification::cease(
            cease_subcode::PEER_DECONFIGURED,
        )));
        let actions = s.handle(Event::IdleHoldTimerExpires);
        assert_eq!(s.state(), State::Active);
        assert!(!actions.contains(&Action::ConnectTcp));
    }

    #[test]
    fn manual_start_after_failures_starts_afresh() {
        let mut s = session_in(config(), State::Connect);
        s.handle(Event::TcpConnectionFails);
        s.handle(Event::ManualStop);
        let actions = s.handle(Event::ManualStart);
        assert_eq!(timer_started(&actions, Timer::ConnectRetry), Some(secs(5)));
    }

    // ------------------------------------------------------------ collisions

    #[test]
    fn collision_keeps_connection_of_higher_identifier() {
        let high = Ipv4Addr::new(198, 18, 250, 200);
        let low = Ipv4Addr::new(198, 18, 250, 3);
        assert_eq!(
            collision_survivor((high, 64512), (low, 64513)),
            Initiator::Local
        );
        assert_eq!(
            collision_survivor((low, 64512), (high, 64513)),
            Initiator::Remote
        );
    }

    #[test]
    fn collision_compares_identifiers_as_numbers() {
        // 10.0.0.1 > 9.255.255.255 numerically.
        let a = Ipv4Addr::new(10, 0, 0, 1);
        let b = Ipv4Addr::new(9, 255, 255, 255);
        assert_eq!(collision_survivor((a, 1), (b, 2)), Initiator::Local);
    }

    #[test]
    fn collision_with_equal_identifiers_keeps_connection_of_higher_as() {
        assert_eq!(
            collision_survivor((LOCAL_ID, 65001), (LOCAL_ID, 65000)),
            Initiator::Local
        );
        assert_eq!(
            collision_survivor((LOCAL_ID, 65000), (LOCAL_ID, 65001)),
            Initiator::Remote
        );
    }

    #[test]
    fn collision_dump_sends_cease_connection_collision_resolution() {
        for state in [State::OpenSent, State::OpenConfirm] {
            let mut s = session_in(config(), state);
            let actions = s.handle(Event::OpenCollisionDump);
            let n = sent_notification(&actions).unwrap();
            assert_eq!(
                (n.code, n.subcode),
                (
                    error_code::CEASE,
                    cease_subcode::CONNECTION_COLLISION_RESOLUTION
                )
            );
            assert_eq!(s.state(), State::Idle);
        }
    }

    #[test]
    fn colliding_connections_resolve_to_one_established_session() {
        // Our outgoing connection reached OpenConfirm; the peer's incoming one just got its OPEN.
        let peer = (PEER_ID, 64513);
        let mut outgoing = session_in(config(), State::OpenConfirm);
        let mut incoming = Session::new(config()).unwrap();
        incoming.handle(Event::ManualStartWithPassiveTcpEstablishment);
        incoming.handle(Event::TcpConnectionConfirmed);
        assert_eq!(outgoing.peer_identity(), Some(peer));
        // Our identifier 198.18.250.10 is higher than the peer's 198.18.250.1: keep ours.
        assert_eq!(
            collision_survivor((LOCAL_ID, 64512), peer),
            Initiator::Local
        );
        incoming.handle(Event::OpenCollisionDump);
        outgoing.handle(Event::KeepAliveMsg);
        assert_eq!(
            (outgoing.state(), incoming.state()),
            (State::Established, State::Idle)
        );
    }
}
