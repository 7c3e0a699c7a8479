//! One BFD session as a state machine (RFC 5880 section 6), asynchronous mode, sans I/O: the
//! driver hands it received control packets ([`Session::receive`]) and the time
//! ([`Session::on_timer`], at [`Session::next_deadline`]); it returns [`Action`]s: packets to
//! send and state changes.
//!
//! The rules, with their sections:
//! * States Down → Init → Up by the three-way handshake, Up → Down when the peer says Down or
//!   AdminDown or the detection time expires (6.2, 6.8.6).
//! * The packet interval is the slower of this system's Desired Min TX and the peer's Required
//!   Min RX, less 0–25 % jitter (0–10 % more with a detect multiplier of 1) (6.8.7); the
//!   detection time is the peer's multiplier times the slower of this system's Required Min RX
//!   and the peer's Desired Min TX (6.8.4). So the slower side wins, both ways.
//! * While not Up, Desired Min TX is at least one second (6.8.3).
//! * A timer change while Up starts a poll sequence: packets carry P until one with F comes
//!   back; a longer transmit interval is used, and a shorter receive interval counted, only once
//!   it ends (6.5, 6.8.3). A packet with P is answered at once with F (6.8.6).
//! * Passive: no packet is sent before one was received (6.1).
//! * A peer in demand mode with both sides Up stops this system's periodic packets (6.6).
//! * Packets are refused when they name another discriminator, when they name none but say Init
//!   or Up, when they carry authentication and none is configured, or none when it is, and while
//!   AdminDown (6.8.6).
//! * With authentication configured ([`Config::auth`], [`crate::auth`]), every packet sent is
//!   signed, with a sequence number that starts at a random value and grows by one per packet
//!   (what the meticulous types require; the keyed types allow it); a packet received must have
//!   the configured type, key ID and a right digest, and once a packet was accepted its
//!   sequence number must be within 3 × Detect Mult ahead of the last accepted one (ahead and
//!   not equal, for the meticulous types), until the peer was silent for twice the detection
//!   time (6.7.3, 6.7.4, 6.8.1). A forger on the segment without the key can then neither make
//!   a packet nor replay one of the peer's (meticulous types).
//! * Once Up, a packet must come from the peer's session this one came Up with: its My
//!   Discriminator must be the one recorded ([`Refusal::OtherPeerSession`]). RFC 5880 lets a
//!   packet with Your Discriminator 0 be matched by its source address alone; taken at an Up
//!   session, one forged packet from the segment (the peer's address, TTL 255, State Down)
//!   would take it down. The peer's own packets keep their My Discriminator, also the Down it
//!   sends with Your Discriminator 0 once its detection time expired (6.8.1), so that notice
//!   still takes effect at once; a forger must know the peer's discriminator, which only
//!   crosses the segment in the unicast packets between the two. A peer that restarted (a new
//!   discriminator) is noticed by the detection time, and the handshake then starts again.

use std::time::{Duration, Instant};

use crate::auth::{self, AuthError, Authentication};
use crate::packet::{ControlPacket, Diagnostic, State};

/// Why a session refuses a control packet (RFC 5880 6.8.6, and the rule for Up sessions in the
/// module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Its Your Discriminator is another session's.
    #[error("it names another session")]
    OtherSession,
    /// It names no session but says Init or Up.
    #[error("it names no session but is not Down")]
    NoDiscriminator,
    /// It carries authentication, and none is configured for this session.
    #[error("it is authenticated, and no authentication is configured")]
    Authentication,
    /// Authentication is configured, and the packet has none or fails it.
    #[error("authentication: {0}")]
    AuthenticationFailed(AuthError),
    /// Its sequence number is outside the window after the last accepted one: a replay.
    #[error("authentication: sequence number {sequence} is not within the window after {last}")]
    AuthenticationSequence {
        /// The packet's sequence number.
        sequence: u32,
        /// The last accepted sequence number.
        last: u32,
    },
    /// Its My Discriminator is not that of the peer's session this one came Up with.
    #[error("it comes from another session of the peer than the one this session is Up with")]
    OtherPeerSession,
}

/// The slowest Desired Min TX while not Up (RFC 5880 6.8.3).
pub const SLOW_TX: Duration = Duration::from_secs(1);

/// A session's timers and role: a BFDProfile's fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// The shortest interval this system wants between the packets it sends
    /// (`transmitInterval`).
    pub desired_min_tx: Duration,
    /// The shortest interval this system can receive packets at (`receiveInterval`).
    pub required_min_rx: Duration,
    /// Detection time multiplier (`detectMultiplier`).
    pub detect_mult: u8,
    /// Passive role (`passiveMode`): speak only once spoken to.
    pub passive: bool,
    /// Authentication (a ferrolb extension of the BFDProfile); `None`: none.
    pub auth: Option<Authentication>,
}

impl Default for Config {
    /// MetalLB's BFDProfile defaults: 300 ms both ways, multiplier 3, active.
    fn default() -> Self {
        Config {
            desired_min_tx: Duration::from_millis(300),
            required_min_rx: Duration::from_millis(300),
            detect_mult: 3,
            passive: false,
            auth: None,
        }
    }
}

/// What the session asks of its driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send this control packet to the peer.
    Send(ControlPacket),
    /// The session state changed.
    StateChanged {
        /// The state before.
        from: State,
        /// The state now.
        to: State,
        /// Why, as this system will tell the peer.
        diagnostic: Diagnostic,
    },
}

/// One BFD session.
#[derive(Clone, Debug)]
pub struct Session {
    config: Config,
    state: State,
    diagnostic: Diagnostic,
    local_discriminator: u32,
    remote_discriminator: u32,
    remote_state: State,
    remote_demand: bool,
    /// The peer's Required Min RX (µs); 1 until heard (6.8.1).
    remote_min_rx: u32,
    /// The peer's Desired Min TX (µs) in its last packet.
    remote_desired_tx: u32,
    remote_detect_mult: u8,
    /// Desired Min TX and Required Min RX as this system's packets say them (µs).
    advertised_tx: u32,
    advertised_rx: u32,
    /// The values in effect for the transmit interval and the detection time: behind the
    /// advertised ones during a poll sequence (6.8.3).
    tx_in_effect: u32,
    rx_in_effect: u32,
    /// A poll sequence is in progress: packets carry P until a packet with F arrives.
    polling: bool,
    next_tx: Option<Instant>,
    detect_at: Option<Instant>,
    jitter: u64,
    /// The sequence number of the next authenticated packet sent (bfd.XmitAuthSeq).
    xmit_auth_seq: u32,
    /// The last accepted sequence number and until when it is known (bfd.RcvAuthSeq and
    /// bfd.AuthSeqKnown: twice the detection time after the packet, 6.8.1).
    rcv_auth: Option<(u32, Instant)>,
}

fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

impl Session {
    /// A new session in state Down. `local_discriminator` must be non-zero and unique among
    /// this system's sessions (the driver finds sessions by it); `seed` seeds the transmit
    /// jitter (any value; sessions started together should get different ones).
    pub fn new(config: Config, local_discriminator: u32, seed: u64, now: Instant) -> Session {
        let advertised_tx = micros(config.desired_min_tx.max(SLOW_TX));
        let advertised_rx = micros(config.required_min_rx);
        Session {
            config,
            state: State::Down,
            diagnostic: Diagnostic::None,
            local_discriminator: local_discriminator.max(1),
            remote_discriminator: 0,
            remote_state: State::Down,
            remote_demand: false,
            remote_min_rx: 1,
            remote_desired_tx: 0,
            remote_detect_mult: 0,
            advertised_tx,
            advertised_rx,
            tx_in_effect: advertised_tx,
            rx_in_effect: advertised_rx,
            polling: false,
            next_tx: (!config.passive).then_some(now),
            detect_at: None,
            jitter: seed | 1,
            // Random at the start (6.8.1), so a restarted session does not repeat numbers a
            // peer may still hold; splitmix64 of the seed is enough, the digest is the secret.
            xmit_auth_seq: splitmix(seed) as u32,
            rcv_auth: None,
        }
    }

    /// The session state.
    pub fn state(&self) -> State {
        self.state
    }

    /// Why the session last went down.
    pub fn diagnostic(&self) -> Diagnostic {
        self.diagnostic
    }

    /// The peer's session state, as its last packet said.
    pub fn remote_state(&self) -> State {
        self.remote_state
    }

    /// This session's discriminator.
    pub fn local_discriminator(&self) -> u32 {
        self.local_discriminator
    }

    /// The peer's discriminator; zero until heard, and again after the detection time.
    pub fn remote_discriminator(&self) -> u32 {
        self.remote_discriminator
    }

    /// The session's configuration.
    pub fn config(&self) -> Config {
        self.config
    }

    /// The interval between this system's packets, before jitter: the slower of its Desired
    /// Min TX (in effect) and the peer's Required Min RX.
    pub fn transmit_interval(&self) -> Duration {
        Duration::from_micros(u64::from(self.tx_in_effect.max(self.remote_min_rx)))
    }

    /// How long the peer may stay silent before the session goes down; `None` before the peer
    /// was heard.
    pub fn detection_time(&self) -> Option<Duration> {
        (self.remote_detect_mult > 0).then(|| {
            Duration::from_micros(
                u64::from(self.remote_detect_mult)
                    * u64::from(self.rx_in_effect.max(self.remote_desired_tx)),
            )
        })
    }

    /// The next instant [`Session::on_timer`] has work to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        match (self.next_tx, self.detect_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether this session takes `packet` at `now` (already decoded, so the
    /// session-independent checks passed), or why not.
    pub fn accepts(&self, packet: &ControlPacket, now: Instant) -> Result<(), Refusal> {
        self.authenticate(packet, now)?;
        if packet.your_discriminator != 0 && packet.your_discriminator != self.local_discriminator {
            return Err(Refusal::OtherSession);
        }
        if packet.your_discriminator == 0 && !matches!(packet.state, State::Down | State::AdminDown)
        {
            return Err(Refusal::NoDiscriminator);
        }
        if self.state == State::Up && packet.my_discriminator != self.remote_discriminator {
            return Err(Refusal::OtherPeerSession);
        }
        Ok(())
    }

    /// The authentication checks of [`Session::accepts`]; the accepted sequence number.
    fn authenticate(&self, packet: &ControlPacket, now: Instant) -> Result<Option<u32>, Refusal> {
        if packet.your_discriminator != 0 && packet.your_discriminator != self.local_discriminator {
            // Another session's packet: its own session checks it.
            return Err(Refusal::OtherSession);
        }
        let Some(auth) = &self.config.auth else {
            return match packet.auth {
                Some(_) => Err(Refusal::Authentication),
                None => Ok(None),
            };
        };
        let verified = auth.verify(packet).map_err(Refusal::AuthenticationFailed)?;
        if let Some((last, until)) = self.rcv_auth
            && now < until
            && !auth::in_window(auth.kind(), last, verified.sequence, packet.detect_mult)
        {
            return Err(Refusal::AuthenticationSequence {
                sequence: verified.sequence,
                last,
            });
        }
        Ok(Some(verified.sequence))
    }

    /// Handles a received control packet (already decoded, so the session-independent checks
    /// passed). Returns nothing when the packet is refused ([`Session::accepts`]).
    pub fn receive(&mut self, packet: &ControlPacket, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        if self.accepts(packet, now).is_err() {
            return actions;
        }
        let sequence = self.authenticate(packet, now).ok().flatten();
        let heard_first = self.remote_discriminator == 0;
        let remote_min_rx_changed = self.remote_min_rx != packet.required_min_rx;
        self.remote_discriminator = packet.my_discriminator;
        self.remote_state = packet.state;
        self.remote_demand = packet.demand;
        self.remote_min_rx = packet.required_min_rx;
        self.remote_desired_tx = packet.desired_min_tx;
        self.remote_detect_mult = packet.detect_mult;
        if packet.final_ && self.polling {
            self.polling = false;
            self.tx_in_effect = self.advertised_tx;
            self.rx_in_effect = self.advertised_rx;
        }
        // Every packet accepted restarts the detection time, also while AdminDown (a packet
        // then only tells the peer's state).
        self.detect_at = self.detection_time().map(|d| now + d);
        if let (Some(sequence), Some(detection)) = (sequence, self.detection_time()) {
            self.rcv_auth = Some((sequence, now + 2 * detection));
        }
        if self.state == State::AdminDown {
            return actions;
        }
        let to = if packet.state == State::AdminDown {
            (self.state != State::Down).then_some((State::Down, Diagnostic::NeighborSignaledDown))
        } else {
            match (self.state, packet.state) {
                (State::Down, State::Down) => Some((State::Init, Diagnostic::None)),
                (State::Down, State::Init) => Some((State::Up, Diagnostic::None)),
                (State::Init, State::Init | State::Up) => Some((State::Up, Diagnostic::None)),
                (State::Up, State::Down) => Some((State::Down, Diagnostic::NeighborSignaledDown)),
                _ => None,
            }
        };
        let changed = if let Some((to, diagnostic)) = to {
            self.set_state(to, diagnostic, &mut actions);
            true
        } else {
            false
        };
        if packet.poll {
            // The Final goes out at once, whatever the transmit timer says (6.8.6), with P
            // clear; a poll of ours resumes with the next periodic packet.
            actions.push(Action::Send(self.packet(false, true)));
        } else if changed && self.may_transmit() {
            // A change goes out at once too: the handshake takes one round trip per step
            // instead of one transmit interval.
            actions.push(Action::Send(self.packet(self.polling, false)));
        }
        if (heard_first || remote_min_rx_changed || changed) && self.may_transmit() {
            // Whenever the interval changed, or a passive session may now speak.
            self.next_tx = Some(now + self.jittered());
        } else if !self.may_transmit() {
            self.next_tx = None;
        }
        actions
    }

    /// Handles the time `now`: the detection time's expiry and the periodic packet.
    pub fn on_timer(&mut self, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        if self.detect_at.is_some_and(|at| now >= at) {
            self.detect_at = None;
            self.remote_discriminator = 0;
            self.remote_state = State::Down;
            self.remote_demand = false;
            self.remote_min_rx = 1;
            self.remote_desired_tx = 0;
            self.remote_detect_mult = 0;
            if matches!(self.state, State::Init | State::Up) {
                self.set_state(State::Down, Diagnostic::DetectionTimeExpired, &mut actions);
                actions.push(Action::Send(self.packet(false, false)));
            }
            if !self.may_transmit() {
                self.next_tx = None;
            }
        }
        if self.next_tx.is_some_and(|at| now >= at) {
            if self.may_transmit() {
                actions.push(Action::Send(self.packet(self.polling, false)));
                self.next_tx = Some(now + self.jittered());
            } else {
                self.next_tx = None;
            }
        }
        actions
    }

    /// Holds the session administratively down (`true`) or lets it come up again.
    pub fn set_admin_down(&mut self, down: bool, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        match (down, self.state) {
            (true, State::AdminDown) | (false, State::Down | State::Init | State::Up) => {}
            (true, _) => {
                self.set_state(State::AdminDown, Diagnostic::AdminDown, &mut actions);
                if self.may_transmit() {
                    actions.push(Action::Send(self.packet(false, false)));
                }
            }
            (false, State::AdminDown) => {
                self.set_state(State::Down, Diagnostic::None, &mut actions);
                if self.may_transmit() {
                    self.next_tx = Some(now);
                }
            }
        }
        actions
    }

    /// Takes new timers (a changed BFDProfile). While Up this starts a poll sequence; a longer
    /// transmit interval, or a shorter receive interval, takes effect once it ends.
    pub fn reconfigure(&mut self, config: Config, now: Instant) -> Vec<Action> {
        let passive_before = self.config.passive;
        self.config = config;
        self.advertise();
        if passive_before && !config.passive && self.next_tx.is_none() && self.may_transmit() {
            self.next_tx = Some(now);
        }
        Vec::new()
    }

    fn may_transmit(&self) -> bool {
        let spoken_to = !self.config.passive || self.remote_discriminator != 0;
        // A peer asking for no packets at all (Required Min RX 0) gets none (6.8.3).
        let wanted = self.remote_min_rx != 0;
        let demand_quiet =
            self.remote_demand && self.state == State::Up && self.remote_state == State::Up;
        spoken_to && wanted && !demand_quiet
    }

    fn set_state(&mut self, to: State, diagnostic: Diagnostic, actions: &mut Vec<Action>) {
        let from = self.state;
        self.state = to;
        if to != State::Up {
            self.diagnostic = diagnostic;
        } else {
            // Up: a new session's packets say nothing went wrong.
            self.diagnostic = Diagnostic::None;
        }
        actions.push(Action::StateChanged {
            from,
            to,
            diagnostic: self.diagnostic,
        });
        self.advertise_on_state_change(from);
    }

    /// The timers a state change implies: slow while not Up, the configured ones once Up (a
    /// change while Up is announced by a poll sequence).
    fn advertise_on_state_change(&mut self, from: State) {
        let (tx, rx) = self.configured_timers();
        self.advertised_tx = tx;
        self.advertised_rx = rx;
        if self.state == State::Up && from != State::Up {
            // Coming up from the slow rate: faster at once is safe (only a longer interval
            // must wait); the peer hears the new values through a poll.
            self.tx_in_effect = tx.min(self.tx_in_effect);
            self.rx_in_effect = rx;
            self.polling = true;
        } else if self.state != State::Up {
            self.tx_in_effect = tx;
            self.rx_in_effect = rx;
            self.polling = false;
        }
    }

    /// Advertises the configured timers after a reconfiguration.
    fn advertise(&mut self) {
        let (tx, rx) = self.configured_timers();
        if tx == self.advertised_tx && rx == self.advertised_rx {
            return;
        }
        self.advertised_tx = tx;
        self.advertised_rx = rx;
        if self.state == State::Up {
            // A shorter transmit interval and a longer receive interval are safe at once.
            self.tx_in_effect = self.tx_in_effect.min(tx);
            self.rx_in_effect = self.rx_in_effect.max(rx);
            self.polling = true;
        } else {
            self.tx_in_effect = tx;
            self.rx_in_effect = rx;
        }
    }

    /// Desired Min TX and Required Min RX (µs) the configuration gives in the current state:
    /// the transmit interval is at least a second while not Up (6.8.3).
    fn configured_timers(&self) -> (u32, u32) {
        let tx = if self.state == State::Up {
            self.config.desired_min_tx
        } else {
            self.config.desired_min_tx.max(SLOW_TX)
        };
        (micros(tx), micros(self.config.required_min_rx))
    }

    /// The next transmit interval with jitter: 75–100 % of the interval, 75–90 % with a
    /// detect multiplier of 1 (6.8.7).
    fn jittered(&mut self) -> Duration {
        // xorshift64: jitter needs spread, not secrecy.
        self.jitter ^= self.jitter << 13;
        self.jitter ^= self.jitter >> 7;
        self.jitter ^= self.jitter << 17;
        let span = if self.config.detect_mult == 1 { 15 } else { 25 };
        let percent = 75 + (self.jitter % (span + 1));
        self.transmit_interval() * u32::try_from(percent).unwrap_or(100) / 100
    }

    fn packet(&mut self, poll: bool, final_: bool) -> ControlPacket {
        let mut packet = ControlPacket {
            diagnostic: self.diagnostic,
            state: self.state,
            poll: poll && !final_,
            final_,
            control_plane_independent: false,
            demand: false,
            detect_mult: self.config.detect_mult,
            my_discriminator: self.local_discriminator,
            your_discriminator: self.remote_discriminator,
            desired_min_tx: self.advertised_tx,
            required_min_rx: self.advertised_rx,
            required_min_echo_rx: 0,
            auth: None,
        };
        if let Some(auth) = &self.config.auth {
            auth.sign(&mut packet, self.xmit_auth_seq);
            self.xmit_auth_seq = self.xmit_auth_seq.wrapping_add(1);
        }
        packet
    }
}

/// splitmix64: a well-spread value from any seed.
fn splitmix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn sent(actions: &[Action]) -> Vec<ControlPacket> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Send(p) => Some(p.clone()),
                Action::StateChanged { .. } => None,
            })
            .collect()
    }

    fn changes(actions: &[Action]) -> Vec<(State, State, Diagnostic)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::StateChanged {
                    from,
                    to,
                    diagnostic,
                } => Some((*from, *to, *diagnostic)),
                Action::Send(_) => None,
            })
            .collect()
    }

    /// Two sessions joined by a lossless wire with a 1 ms delay, run to `until`.
    struct Pair {
        a: Session,
        b: Session,
        now: Instant,
        /// (deliver at, to b?, packet)
        wire: Vec<(Instant, bool, ControlPacket)>,
        /// Whether packets from a (to b) get through, and from b (to a).
        a_to_b: bool,
        b_to_a: bool,
        log: Vec<(bool, Action)>,
    }

    impl Pair {
        fn new(a: Config, b: Config) -> Pair {
            let now = Instant::now();
            Pair {
                a: Session::new(a, 0x1111, 1, now),
                b: Session::new(b, 0x2222, 2, now),
                now,
                wire: Vec::new(),
                a_to_b: true,
                b_to_a: true,
                log: Vec::new(),
            }
        }

        fn take(&mut self, from_a: bool, actions: Vec<Action>) {
            for action in actions {
                if let Action::Send(p) = &action
                    && (if from_a { self.a_to_b } else { self.b_to_a })
                {
                    self.wire.push((self.now + ms(1), from_a, p.clone()));
                }
                self.log.push((from_a, action));
            }
        }

        fn run(&mut self, for_: Duration) {
            let end = self.now + for_;
            loop {
                let next = [
                    self.a.next_deadline(),
                    self.b.next_deadline(),
                    self.wire.iter().map(|w| w.0).min(),
                ]
                .into_iter()
                .flatten()
                .min();
                let Some(next) = next.filter(|n| *n <= end) else {
                    self.now = end;
                    return;
                };
                self.now = self.now.max(next);
                let now = self.now;
                let due: Vec<_> = self.wire.iter().filter(|w| w.0 <= now).cloned().collect();
                self.wire.retain(|w| w.0 > now);
                for (_, from_a, packet) in due {
                    let bytes = packet.encode();
                    let packet = ControlPacket::decode(&bytes).unwrap();
                    if from_a {
                        let actions = self.b.receive(&packet, now);
                        self.take(false, actions);
                    } else {
                        let actions = self.a.receive(&packet, now);
                        self.take(true, actions);
                    }
                }
                let actions = self.a.on_timer(now);
                self.take(true, actions);
                let actions = self.b.on_timer(now);
                self.take(false, actions);
            }
        }

        fn sent_by(&self, a: bool) -> Vec<ControlPacket> {
            self.log
                .iter()
                .filter(|(from_a, _)| *from_a == a)
                .filter_map(|(_, action)| match action {
                    Action::Send(p) => Some(p.clone()),
                    Action::StateChanged { .. } => None,
                })
                .collect()
        }
    }

    #[test]
    fn two_sessions_come_up_by_the_three_way_handshake() {
        let mut pair = Pair::new(Config::default(), Config::default());
        pair.run(ms(50));
        assert_eq!(pair.a.state(), State::Up);
        assert_eq!(pair.b.state(), State::Up);
        assert_eq!(pair.a.remote_discriminator(), 0x2222);
        // Each side went Down → Init → Up or Down → Up, never skipping the handshake.
        for side in [true, false] {
            let steps: Vec<_> = pair
                .log
                .iter()
                .filter(|(a, _)| *a == side)
                .flat_map(|(_, action)| changes(std::slice::from_ref(action)))
                .collect();
            assert!(
                steps.iter().all(|(from, to, _)| matches!(
                    (from, to),
                    (State::Down, State::Init)
                        | (State::Init, State::Up)
                        | (State::Down, State::Up)
                )),
                "{steps:?}"
            );
        }
    }

    #[test]
    fn the_slower_side_wins_both_ways() {
        let fast = Config {
            desired_min_tx: ms(100),
            required_min_rx: ms(100),
            detect_mult: 3,
            passive: false,
            auth: None,
        };
        let slow = Config {
            desired_min_tx: ms(500),
            required_min_rx: ms(400),
            detect_mult: 5,
            passive: false,
            auth: None,
        };
        let mut pair = Pair::new(fast, slow);
        pair.run(ms(5000));
        assert_eq!(pair.a.state(), State::Up);
        // a sends no faster than b can receive; b no faster than it wants.
        assert_eq!(pair.a.transmit_interval(), ms(400));
        assert_eq!(pair.b.transmit_interval(), ms(500));
        // a detects b's silence after b's multiplier × b's (slower) transmit interval.
        assert_eq!(pair.a.detection_time(), Some(ms(5 * 500)));
        assert_eq!(pair.b.detection_time(), Some(ms(3 * 400)));
    }

    #[test]
    fn sessions_not_up_send_at_most_once_a_second() {
        let mut s = Session::new(Config::default(), 7, 3, Instant::now());
        let t0 = Instant::now();
        let first = sent(&s.on_timer(t0));
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].desired_min_tx, 1_000_000);
        assert_eq!(first[0].required_min_rx, 300_000);
        assert_eq!(first[0].state, State::Down);
        let next = s.next_deadline().unwrap();
        assert!(
            next >= t0 + ms(750) && next <= t0 + ms(1000),
            "{:?}",
            next - t0
        );
    }

    #[test]
    fn silence_past_the_detection_time_brings_the_session_down() {
        let mut pair = Pair::new(Config::default(), Config::default());
        pair.run(ms(2000));
        assert_eq!(pair.a.state(), State::Up);
        pair.b_to_a = false;
        let cut = pair.now;
        pair.run(ms(899));
        assert_eq!(pair.a.state(), State::Up, "down before 3 × 300 ms");
        pair.run(ms(2));
        assert_eq!(pair.a.state(), State::Down);
        assert_eq!(pair.a.diagnostic(), Diagnostic::DetectionTimeExpired);
        assert_eq!(pair.a.remote_discriminator(), 0);
        // a tells b at once; b goes down on hearing it (and may already be starting over,
        // Down → Init, on a's next packet).
        assert!(pair.now - cut <= ms(902));
        pair.run(ms(5));
        assert!(
            pair.log.iter().any(|(a, action)| !a
                && *action
                    == Action::StateChanged {
                        from: State::Up,
                        to: State::Down,
                        diagnostic: Diagnostic::NeighborSignaledDown
                    }),
            "b never went down"
        );
        assert_ne!(pair.b.state(), State::Up);
        // The path back: both come up again.
        pair.b_to_a = true;
        pair.run(ms(3000));
        assert_eq!((pair.a.state(), pair.b.state()), (State::Up, State::Up));
    }

    #[test]
    fn admin_down_takes_the_peer_down_and_back_up() {
        let mut pair = Pair::new(Config::default(), Config::default());
        pair.run(ms(2000));
        let now = pair.now;
        let actions = pair.a.set_admin_down(true, now);
        assert_eq!(sent(&actions)[0].state, State::AdminDown);
        assert_eq!(sent(&actions)[0].diagnostic, Diagnostic::AdminDown);
        pair.take(true, actions);
        pair.run(ms(10));
        assert_eq!(pair.b.state(), State::Down);
        assert_eq!(pair.b.diagnostic(), Diagnostic::NeighborSignaledDown);
        // Held down: b's packets do not bring a up.
        pair.run(ms(3000));
        assert_eq!(pair.a.state(), State::AdminDown);
        let now = pair.now;
        let actions = pair.a.set_admin_down(false, now);
        pair.take(true, actions);
        pair.run(ms(3000));
        assert_eq!((pair.a.state(), pair.b.state()), (State::Up, State::Up));
    }

    #[test]
    fn a_poll_is_answered_at_once_with_final() {
        let mut pair = Pair::new(Config::default(), Config::default());
        pair.run(ms(2000));
        let now = pair.now;
        let mut poll = pair.b.packet(true, false);
        poll.poll = true;
        let answer = sent(&pair.a.receive(&poll, now));
        assert_eq!(answer.len(), 1);
        assert!(answer[0].final_ && !answer[0].poll);
    }

    #[test]
    fn coming_up_polls_the_faster_timers_and_the_poll_ends_on_final() {
        let mut pair = Pair::new(Config::default(), Config::default());
        pair.run(ms(2000));
        // Up: both advertise 300 ms now, and a poll told the other (which answered F).
        let after_up: Vec<_> = pair.sent_by(true);
        assert!(
            after_up
                .iter()
                .any(|p| p.poll && p.desired_min_tx == 300_000)
        );
        assert!(!pair.a.polling && !pair.b.polling, "a poll never ended");
        assert_eq!(pair.a.transmit_interval(), ms(300));
    }

    #[test]
    fn a_longer_transmit_interval_waits_for_the_poll_to_end() {
        let mut pair = Pair::new(Config::default(), Config::default());
        pair.run(ms(2000));
        let slower = Config {
            desired_min_tx: ms(600),
            ..Config::default()
        };
        // b does not answer for now: the poll cannot end.
        pair.b_to_a = false;
        let now = pair.now;
        pair.a.reconfigure(slower, now);
        pair.run(ms(200));
        assert_eq!(
            pair.a.transmit_interval(),
            ms(300),
            "slowed before the peer knew"
        );
        assert!(pair.sent_by(true).last().unwrap().poll);
        pair.b_to_a = true;
        pair.run(ms(700));
        assert_eq!(pair.a.transmit_interval(), ms(600));
        assert!(!pair.a.polling);
        // b now detects a with a's slower interval.
        assert_eq!(pair.b.detection_time(), Some(ms(3 * 600)));
    }

    #[test]
    fn a_passive_session_speaks_only_once_spoken_to() {
        let passive = Config {
            passive: true,
            ..Config::default()
        };
        let mut lone = Session::new(passive, 9, 4, Instant::now());
        assert_eq!(lone.next_deadline(), None);
        assert!(lone.on_timer(Instant::now() + ms(5000)).is_empty());
        let mut pair = Pair::new(Config::default(), passive);
        pair.run(ms(3000));
        assert_eq!((pair.a.state(), pair.b.state()), (State::Up, State::Up));
        // Both passive: nobody ever speaks.
        let mut pair = Pair::new(passive, passive);
        pair.run(ms(3000));
        assert!(pair.log.is_empty());
    }

    #[test]
    fn packets_naming_another_session_or_none_while_up_or_authenticated_are_refused() {
        let now = Instant::now();
        let mut s = Session::new(Config::default(), 5, 1, now);
        let mut p = ControlPacket {
            diagnostic: Diagnostic::None,
            state: State::Down,
            poll: false,
            final_: false,
            control_plane_independent: false,
            demand: false,
            detect_mult: 3,
            my_discriminator: 77,
            your_discriminator: 6,
            desired_min_tx: 1_000_000,
            required_min_rx: 300_000,
            required_min_echo_rx: 0,
            auth: None,
        };
        assert!(s.receive(&p, now).is_empty(), "another session's packet");
        p.your_discriminator = 0;
        p.state = State::Up;
        assert!(s.receive(&p, now).is_empty(), "Up naming no session");
        p.state = State::Down;
        p.auth = Some(vec![1, 4, 1, b'x']);
        assert!(s.receive(&p, now).is_empty(), "authenticated");
        assert_eq!(s.remote_discriminator(), 0);
        p.auth = None;
        assert_eq!(
            changes(&s.receive(&p, now)),
            vec![(State::Down, State::Init, Diagnostic::None)]
        );
        assert_eq!(s.remote_discriminator(), 77);
    }

    fn authenticated(kind: crate::auth::AuthType, key: &[u8]) -> Config {
        Config {
            auth: Some(Authentication::new(kind, 1, key).unwrap()),
            ..Config::default()
        }
    }

    fn downs(log: &[(bool, Action)], of_a: bool) -> usize {
        log.iter()
            .filter(|(from_a, a)| {
                *from_a == of_a
                    && matches!(
                        a,
                        Action::StateChanged {
                            to: State::Down,
                            from: State::Up,
                            ..
                        }
                    )
            })
            .count()
    }

    #[test]
    fn authenticated_sessions_come_up_and_refuse_forged_and_replayed_packets() {
        use crate::auth::AuthType;
        for kind in AuthType::ALL {
            let config = authenticated(kind, b"both ends");
            let mut pair = Pair::new(config, config);
            pair.run(ms(3000));
            assert_eq!(pair.a.state(), State::Up, "{kind:?}");
            assert!(pair.log.iter().all(|(_, a)| match a {
                Action::Send(p) => config.auth.unwrap().verify(p).is_ok(),
                _ => true,
            }));
            // A forged Down naming both discriminators (say the forger saw them), unsigned,
            // signed with another key, or with another key ID.
            let mut forged = pair.b.packet(false, false);
            forged.state = State::Down;
            forged.auth = None;
            assert_eq!(
                pair.a.accepts(&forged, pair.now),
                Err(Refusal::AuthenticationFailed(AuthError::Missing))
            );
            Authentication::new(kind, 1, b"a guess")
                .unwrap()
                .sign(&mut forged, 1);
            assert_eq!(
                pair.a.accepts(&forged, pair.now),
                Err(Refusal::AuthenticationFailed(AuthError::Digest))
            );
            Authentication::new(kind, 2, b"both ends")
                .unwrap()
                .sign(&mut forged, 1);
            assert_eq!(
                pair.a.accepts(&forged, pair.now),
                Err(Refusal::AuthenticationFailed(AuthError::KeyId(2)))
            );
            // A packet the peer really sent, recorded and played again: the meticulous types
            // refuse it; the keyed ones take it while within the window (RFC 5880 6.7.3).
            let recorded = pair.b.packet(false, false);
            assert!(pair.a.receive(&recorded, pair.now).is_empty());
            let replay = pair.a.accepts(&recorded, pair.now);
            if kind.meticulous() {
                assert!(
                    matches!(replay, Err(Refusal::AuthenticationSequence { .. })),
                    "{kind:?}: {replay:?}"
                );
            } else {
                assert_eq!(replay, Ok(()), "{kind:?}");
            }
            // Far ahead of the window: refused by both.
            let mut ahead = pair.b.clone();
            ahead.xmit_auth_seq = ahead.xmit_auth_seq.wrapping_add(1000);
            assert!(matches!(
                pair.a.accepts(&ahead.packet(false, false), pair.now),
                Err(Refusal::AuthenticationSequence { .. })
            ));
            assert_eq!(pair.a.state(), State::Up);
            pair.run(ms(3000));
            assert_eq!(pair.a.state(), State::Up);
            assert_eq!(downs(&pair.log, true), 0, "{kind:?}");
        }
    }

    #[test]
    fn authentication_on_one_side_only_or_different_keys_never_come_up() {
        use crate::auth::AuthType;
        let signed = authenticated(AuthType::MeticulousKeyedSha1, b"one");
        for (a, b) in [
            (signed, Config::default()),
            (Config::default(), signed),
            (signed, authenticated(AuthType::MeticulousKeyedSha1, b"two")),
            (signed, authenticated(AuthType::KeyedSha1, b"one")),
        ] {
            let mut pair = Pair::new(a, b);
            pair.run(ms(5000));
            assert_eq!(pair.a.state(), State::Down);
            assert_eq!(pair.b.state(), State::Down);
        }
    }

    #[test]
    fn an_authenticated_peer_that_restarts_comes_back_up() {
        use crate::auth::AuthType;
        let config = authenticated(AuthType::MeticulousKeyedSha1, b"k");
        let mut pair = Pair::new(config, config);
        pair.run(ms(3000));
        assert_eq!(pair.a.state(), State::Up);
        // The peer restarts: a new discriminator and a new random sequence number, which a
        // still remembers its old one against until twice the detection time passed.
        pair.b = Session::new(config, 0x3333, 99, pair.now);
        pair.wire.clear();
        pair.run(ms(10_000));
        assert_eq!(pair.a.state(), State::Up);
        assert_eq!(pair.b.state(), State::Up);
        assert_eq!(pair.a.remote_discriminator(), 0x3333);
    }

    #[test]
    fn an_up_session_ignores_packets_not_from_the_peer_session_it_is_up_with() {
        let mut pair = Pair::new(Config::default(), Config::default());
        pair.run(ms(50));
        assert_eq!(pair.a.state(), State::Up);
        // A forged Down from the segment: the peer's address and TTL 255 pass the table, but
        // the forger knows neither session's discriminator.
        let mut forged = pair.b.packet(false, false);
        forged.state = State::Down;
        forged.diagnostic = Diagnostic::NeighborSignaledDown;
        forged.your_discriminator = 0;
        forged.my_discriminator = 0x9999;
        assert_eq!(
            pair.a.accepts(&forged, pair.now),
            Err(Refusal::OtherPeerSession)
        );
        assert!(pair.a.receive(&forged, pair.now).is_empty());
        // Naming this session (a guessed discriminator), still from another session of the peer.
        forged.your_discriminator = pair.a.local_discriminator();
        assert_eq!(
            pair.a.accepts(&forged, pair.now),
            Err(Refusal::OtherPeerSession)
        );
        assert!(pair.a.receive(&forged, pair.now).is_empty());
        assert_eq!(pair.a.state(), State::Up);
        assert_eq!(pair.a.remote_discriminator(), 0x2222);
        // The peer's own Down still takes it down at once.
        let mut real = pair.b.packet(false, false);
        real.state = State::Down;
        assert_eq!(
            changes(&pair.a.receive(&real, pair.now)),
            vec![(State::Up, State::Down, Diagnostic::NeighborSignaledDown)]
        );
    }

    #[test]
    fn a_peer_that_restarts_is_found_again_after_the_detection_time() {
        let mut pair = Pair::new(Config::default(), Config::default());
        pair.run(ms(2000));
        assert_eq!(pair.a.state(), State::Up);
        // b restarts: a new session with a new discriminator, Down, naming no session.
        pair.b = Session::new(Config::default(), 0x3333, 5, pair.now);
        pair.wire.clear();
        pair.log.clear();
        pair.run(ms(5000));
        assert_eq!(pair.a.state(), State::Up);
        assert_eq!(pair.b.state(), State::Up);
        assert_eq!(pair.a.remote_discriminator(), 0x3333);
        // a noticed by the detection time, not by the new session's packets.
        let a_changes: Vec<_> = pair
            .log
            .iter()
            .filter(|(a, _)| *a)
            .flat_map(|(_, action)| changes(std::slice::from_ref(action)))
            .collect();
        assert_eq!(
            a_changes.first(),
            Some(&(State::Up, State::Down, Diagnostic::DetectionTimeExpired)),
            "{a_changes:?}"
        );
    }

    #[test]
    fn a_peer_in_demand_mode_stops_the_periodic_packets_once_both_are_up() {
        let mut pair = Pair::new(Config::default(), Config::default());
        pair.run(ms(2000));
        let now = pair.now;
        let mut p = pair.b.packet(false, false);
        p.demand = true;
        pair.a.receive(&p, now);
        let before = pair.sent_by(true).len();
        // a no longer sends on its own; b (not in demand mode itself here) keeps a alive.
        pair.b_to_a = false;
        pair.run(ms(800));
        assert_eq!(pair.sent_by(true).len(), before);
    }

    #[test]
    fn a_peer_asking_for_no_packets_gets_none() {
        let now = Instant::now();
        let mut s = Session::new(Config::default(), 5, 1, now);
        let mut p = Session::new(Config::default(), 6, 2, now).packet(false, false);
        p.required_min_rx = 0;
        assert!(sent(&s.receive(&p, now)).is_empty());
        // Within the detection time (3 × 1 s): nothing; the peer is still heard as asking so.
        assert!(sent(&s.on_timer(now + ms(2900))).is_empty());
        assert_eq!(s.state(), State::Init);
    }

    #[test]
    fn jitter_stays_within_the_rfc_bounds() {
        for mult in [1u8, 3] {
            let config = Config {
                detect_mult: mult,
                ..Config::default()
            };
            let mut s = Session::new(config, 5, 12345, Instant::now());
            let (low, high) = if mult == 1 { (75, 90) } else { (75, 100) };
            let mut seen = std::collections::BTreeSet::new();
            for _ in 0..2000 {
                let d = s.jittered();
                let percent = d.as_micros() * 100 / s.transmit_interval().as_micros();
                assert!(
                    (low..=high).contains(&percent),
                    "{percent} % with mult {mult}"
                );
                seen.insert(percent);
            }
            assert!(seen.len() > 10, "no spread: {seen:?}");
        }
    }
}
