//! This node's BFD sessions as a table, without I/O: which session a received datagram belongs
//! to (RFC 5880 6.8.6 demultiplexing, RFC 5881/5883 TTL checks), the sessions' timers, and
//! sessions added, retuned and removed as the configuration changes. The driver
//! ([`super::driver`]) owns the sockets and the clock around it.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Instant;

use ferrolb_bfd::packet::{ControlPacket, DecodeError};
use ferrolb_bfd::session::{Action, Refusal, Session};

use super::{SessionKey, Settings};

/// A datagram as it arrived on a BFD port.
#[derive(Clone, Copy, Debug)]
pub struct Datagram<'a> {
    /// Its bytes.
    pub bytes: &'a [u8],
    /// Its source address.
    pub from: IpAddr,
    /// Whether it came to the multihop port (4784) rather than the single-hop one (3784).
    pub multihop: bool,
    /// Its IP TTL / hop limit, when the socket could tell.
    pub ttl: Option<u8>,
    /// The index of the interface it arrived on, when the socket could tell.
    pub interface: Option<u32>,
}

/// Why a datagram was dropped before reaching a session.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Not a valid control packet.
    #[error("malformed control packet: {0}")]
    Malformed(#[from] DecodeError),
    /// Its TTL is below the session's minimum (255 for single hop, RFC 5881 section 5).
    #[error("TTL {ttl} below the minimum {minimum}")]
    Ttl {
        /// The TTL it arrived with (0: unknown).
        ttl: u8,
        /// The minimum the session takes.
        minimum: u8,
    },
    /// A single-hop session that is Init or Up takes packets from the interface its peer was
    /// heard on when it left Down; this one came in on another (RFC 5881 section 3: a
    /// single-hop session is bound to its interface).
    #[error("arrived on interface {got:?}, the session's is {expected}")]
    Interface {
        /// The session's interface.
        expected: u32,
        /// The one it arrived on (`None`: the kernel did not say).
        got: Option<u32>,
    },
    /// No session of this node has that discriminator or that peer.
    #[error("no session for it")]
    NoSession,
    /// Its session refuses it (RFC 5880 6.8.6, and an Up session takes packets only from the
    /// peer's session it came Up with: `ferrolb_bfd::session`).
    #[error("refused by its session: {0}")]
    Session(#[from] Refusal),
}

/// One session with its settings.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The state machine.
    pub session: Session,
    /// What it was configured with.
    pub settings: Settings,
    /// Single hop: the interface the peer was heard on when the session left Down; held while
    /// it is Init or Up, released when it is Down again.
    pub interface: Option<u32>,
}

impl Entry {
    /// Holds the interface a single-hop session's peer is heard on while the session is Init
    /// or Up (the first one, `heard_on`), releases it once the session is Down.
    fn pin_interface(&mut self, single_hop: bool, heard_on: Option<u32>) {
        use ferrolb_bfd::packet::State;
        match self.session.state() {
            State::Init | State::Up if single_hop => {
                self.interface = self.interface.or(heard_on);
            }
            _ => self.interface = None,
        }
    }
}

/// The sessions of this node.
#[derive(Debug)]
pub struct Table {
    entries: BTreeMap<SessionKey, Entry>,
    /// Sessions by their local discriminator.
    by_discriminator: BTreeMap<u32, SessionKey>,
    /// The discriminator the next session gets (skipping any in use and zero).
    next_discriminator: u32,
    /// Seeds the sessions' transmit jitter.
    seed: u64,
}

impl Table {
    /// An empty table. `seed` picks the first discriminator and the jitter seeds: a random
    /// value, so that a restarted speaker does not reuse its previous discriminators (RFC 5880
    /// 6.3 asks for them to be unique, and a peer still holding the old session would otherwise
    /// take our new packets for it).
    pub fn new(seed: u64) -> Table {
        Table {
            entries: BTreeMap::new(),
            by_discriminator: BTreeMap::new(),
            next_discriminator: (seed as u32).max(1),
            seed,
        }
    }

    /// The session of `key`.
    pub fn get(&self, key: &SessionKey) -> Option<&Entry> {
        self.entries.get(key)
    }

    /// Every session.
    pub fn iter(&self) -> impl Iterator<Item = (&SessionKey, &Entry)> {
        self.entries.iter()
    }

    /// Adds a session, or retunes an existing one (a poll sequence when Up). Returns what to
    /// send.
    pub fn upsert(&mut self, key: SessionKey, settings: Settings, now: Instant) -> Vec<Action> {
        if let Some(e) = self.entries.get_mut(&key) {
            if e.settings == settings {
                return Vec::new();
            }
            e.settings = settings;
            return e.session.reconfigure(settings.config, now);
        }
        let discriminator = self.allocate_discriminator();
        self.seed = self
            .seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let session = Session::new(settings.config, discriminator, self.seed, now);
        self.by_discriminator.insert(discriminator, key);
        self.entries.insert(
            key,
            Entry {
                session,
                settings,
                interface: None,
            },
        );
        Vec::new()
    }

    /// Removes a session; returns its last packet (AdminDown, so that the peer does not take
    /// the end of the session for a failure of the path, RFC 5880 6.8.16).
    pub fn remove(&mut self, key: &SessionKey, now: Instant) -> Vec<Action> {
        match self.entries.remove(key) {
            Some(mut e) => {
                self.by_discriminator
                    .remove(&e.session.local_discriminator());
                e.session.set_admin_down(true, now)
            }
            None => Vec::new(),
        }
    }

    fn allocate_discriminator(&mut self) -> u32 {
        loop {
            let d = self.next_discriminator;
            self.next_discriminator = self.next_discriminator.wrapping_add(1).max(1);
            if d != 0 && !self.by_discriminator.contains_key(&d) {
                return d;
            }
        }
    }

    /// Hands a datagram to its session: the one its Your Discriminator names, or, when that is
    /// zero, the session with its source address on its port (RFC 5880 6.8.6; single hop and
    /// multihop sessions are told apart by port). Packets below the session's TTL minimum, and
    /// packets the session refuses (a forged one from the peer's address among them), are
    /// dropped with the reason.
    pub fn receive(
        &mut self,
        datagram: Datagram<'_>,
        now: Instant,
    ) -> Result<(SessionKey, Vec<Action>), Refused> {
        let packet = ControlPacket::decode(datagram.bytes)?;
        let from = datagram.from.to_canonical();
        let key = if packet.your_discriminator != 0 {
            self.by_discriminator
                .get(&packet.your_discriminator)
                .copied()
                .filter(|k| k.peer == from && k.multihop == datagram.multihop)
        } else {
            self.entries
                .keys()
                .find(|k| k.peer == from && k.multihop == datagram.multihop)
                .copied()
        }
        .ok_or(Refused::NoSession)?;
        let entry = self.entries.get_mut(&key).ok_or(Refused::NoSession)?;
        let minimum = entry.settings.minimum_ttl;
        let ttl = datagram.ttl.unwrap_or(0);
        if ttl < minimum {
            return Err(Refused::Ttl { ttl, minimum });
        }
        if let Some(expected) = entry.interface
            && datagram.interface != Some(expected)
        {
            return Err(Refused::Interface {
                expected,
                got: datagram.interface,
            });
        }
        entry.session.accepts(&packet, now)?;
        let actions = entry.session.receive(&packet, now);
        entry.pin_interface(!key.multihop, datagram.interface);
        Ok((key, actions))
    }

    /// The sessions' timers at `now`: what each must send, and state changes by detection time.
    pub fn on_timer(&mut self, now: Instant) -> Vec<(SessionKey, Vec<Action>)> {
        self.entries
            .iter_mut()
            .filter(|(_, e)| e.session.next_deadline().is_some_and(|at| at <= now))
            .map(|(k, e)| {
                let actions = e.session.on_timer(now);
                e.pin_interface(!k.multihop, None);
                (*k, actions)
            })
            .filter(|(_, a)| !a.is_empty())
            .collect()
    }

    /// The earliest instant a session has work to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.entries
            .values()
            .filter_map(|e| e.session.next_deadline())
            .min()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Duration;

    use ferrolb_bfd::packet::{Diagnostic, State};
    use ferrolb_bfd::session::Config;

    use super::*;

    fn key(peer: &str, multihop: bool) -> SessionKey {
        SessionKey {
            peer: peer.parse().unwrap(),
            local: None,
            multihop,
        }
    }

    fn settings(minimum_ttl: u8) -> Settings {
        Settings {
            config: Config::default(),
            minimum_ttl,
        }
    }

    fn packet(state: State, mine: u32, yours: u32) -> Vec<u8> {
        ControlPacket {
            diagnostic: Diagnostic::None,
            state,
            poll: false,
            final_: false,
            control_plane_independent: false,
            demand: false,
            detect_mult: 3,
            my_discriminator: mine,
            your_discriminator: yours,
            desired_min_tx: 300_000,
            required_min_rx: 300_000,
            required_min_echo_rx: 0,
            auth: None,
        }
        .encode()
    }

    fn dgram<'a>(bytes: &'a [u8], from: &str, multihop: bool, ttl: u8) -> Datagram<'a> {
        Datagram {
            bytes,
            from: from.parse().unwrap(),
            multihop,
            ttl: Some(ttl),
            interface: Some(2),
        }
    }

    fn states(actions: &[Action]) -> Vec<State> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::StateChanged { to, .. } => Some(*to),
                Action::Send(_) => None,
            })
            .collect()
    }

    /// The first packet (no Your Discriminator) finds its session by source address and port;
    /// later ones by discriminator; a discriminator that names a session of another peer is
    /// refused.
    #[test]
    fn demultiplexed_by_address_then_discriminator() {
        let now = Instant::now();
        let mut t = Table::new(7);
        let a = key("198.18.0.254", false);
        let b = key("198.18.0.253", false);
        t.upsert(a, settings(255), now);
        t.upsert(b, settings(255), now);
        let mine_a = t.get(&a).unwrap().session.local_discriminator();
        let mine_b = t.get(&b).unwrap().session.local_discriminator();
        assert_ne!(mine_a, mine_b);

        let first = packet(State::Down, 99, 0);
        let (k, actions) = t
            .receive(dgram(&first, "198.18.0.254", false, 255), now)
            .unwrap();
        assert_eq!(k, a);
        assert_eq!(states(&actions), vec![State::Init]);
        let second = packet(State::Up, 99, mine_a);
        let (k, actions) = t
            .receive(dgram(&second, "198.18.0.254", false, 255), now)
            .unwrap();
        assert_eq!(k, a);
        assert_eq!(states(&actions), vec![State::Up]);
        // b's discriminator from a's address: not b's peer.
        let wrong = packet(State::Up, 99, mine_b);
        assert_eq!(
            t.receive(dgram(&wrong, "198.18.0.254", false, 255), now)
                .unwrap_err(),
            Refused::NoSession
        );
        // The single-hop session does not take packets that came to the multihop port.
        assert_eq!(
            t.receive(dgram(&first, "198.18.0.254", true, 255), now)
                .unwrap_err(),
            Refused::NoSession
        );
        // An IPv4-mapped IPv6 source is the IPv4 peer.
        let (k, _) = t
            .receive(dgram(&second, "::ffff:198.18.0.254", false, 255), now)
            .unwrap();
        assert_eq!(k, a);
    }

    /// A forged Down from the peer's address at TTL 255 naming no session (RFC 5880 lets the
    /// address alone pick the session then) does not take an Up session down: its sender is
    /// not the peer's session the session came Up with.
    #[test]
    fn a_forged_down_from_the_peers_address_is_refused_once_up() {
        let now = Instant::now();
        let mut t = Table::new(7);
        let a = key("198.18.0.254", false);
        t.upsert(a, settings(255), now);
        let mine = t.get(&a).unwrap().session.local_discriminator();
        let from = "198.18.0.254";
        t.receive(dgram(&packet(State::Down, 99, 0), from, false, 255), now)
            .unwrap();
        let (_, actions) = t
            .receive(dgram(&packet(State::Up, 99, mine), from, false, 255), now)
            .unwrap();
        assert_eq!(states(&actions), vec![State::Up]);
        for forged in [
            packet(State::Down, 0xdead_beef, 0),
            packet(State::Down, 0xdead_beef, mine),
        ] {
            assert_eq!(
                t.receive(dgram(&forged, from, false, 255), now)
                    .unwrap_err(),
                Refused::Session(Refusal::OtherPeerSession)
            );
        }
        assert_eq!(t.get(&a).unwrap().session.state(), State::Up);
        // The peer's own Down, also naming no session (its detection time expired), is taken.
        let (_, actions) = t
            .receive(dgram(&packet(State::Down, 99, 0), from, false, 255), now)
            .unwrap();
        assert_eq!(states(&actions), vec![State::Down]);
    }

    /// A single-hop session that left Down takes packets only from the interface its peer was
    /// heard on then (a host on another segment can forge the peer's address at TTL 255 too);
    /// once Down again, any interface may start it.
    #[test]
    fn a_single_hop_session_is_bound_to_its_interface_while_not_down() {
        let now = Instant::now();
        let mut t = Table::new(7);
        let a = key("198.18.0.254", false);
        t.upsert(a, settings(255), now);
        let mine = t.get(&a).unwrap().session.local_discriminator();
        let from = "198.18.0.254";
        let on = |bytes: &'static [u8], interface: Option<u32>| Datagram {
            interface,
            ..dgram(bytes, from, false, 255)
        };
        let down: &'static [u8] = packet(State::Down, 99, 0).leak();
        let up: &'static [u8] = packet(State::Up, 99, mine).leak();
        t.receive(on(down, Some(2)), now).unwrap();
        assert_eq!(t.get(&a).unwrap().interface, Some(2));
        for other in [Some(3), None] {
            assert_eq!(
                t.receive(on(up, other), now).unwrap_err(),
                Refused::Interface {
                    expected: 2,
                    got: other
                }
            );
        }
        let (_, actions) = t.receive(on(up, Some(2)), now).unwrap();
        assert_eq!(states(&actions), vec![State::Up]);
        // The peer's Down ends it; then another interface may start a session again.
        let (_, actions) = t
            .receive(on(packet(State::Down, 99, mine).leak(), Some(2)), now)
            .unwrap();
        assert_eq!(states(&actions), vec![State::Down]);
        assert_eq!(t.get(&a).unwrap().interface, None);
        t.receive(on(down, Some(3)), now).unwrap();
        assert_eq!(t.get(&a).unwrap().interface, Some(3));
        // Silence: the detection time takes it Down and releases the interface.
        t.on_timer(now + Duration::from_secs(60));
        assert_eq!(t.get(&a).unwrap().session.state(), State::Down);
        assert_eq!(t.get(&a).unwrap().interface, None);
        // Multihop sessions are not bound to an interface.
        let m = key("198.18.5.1", true);
        t.upsert(m, settings(250), now);
        let far = |interface| Datagram {
            interface,
            ..dgram(down, "198.18.5.1", true, 250)
        };
        t.receive(far(Some(4)), now).unwrap();
        assert_eq!(t.get(&m).unwrap().interface, None);
    }

    /// Single hop takes TTL 255 only (GTSM); multihop takes anything from its minimum up; an
    /// unknown TTL is taken as 0.
    #[test]
    fn ttl_below_the_minimum_is_refused() {
        let now = Instant::now();
        let mut t = Table::new(1);
        t.upsert(key("198.18.0.254", false), settings(255), now);
        t.upsert(key("198.18.5.1", true), settings(250), now);
        let p = packet(State::Down, 5, 0);
        assert_eq!(
            t.receive(dgram(&p, "198.18.0.254", false, 254), now)
                .unwrap_err(),
            Refused::Ttl {
                ttl: 254,
                minimum: 255
            }
        );
        assert!(
            t.receive(dgram(&p, "198.18.0.254", false, 255), now)
                .is_ok()
        );
        assert!(t.receive(dgram(&p, "198.18.5.1", true, 250), now).is_ok());
        assert!(matches!(
            t.receive(dgram(&p, "198.18.5.1", true, 249), now),
            Err(Refused::Ttl { .. })
        ));
        let mut unknown = dgram(&p, "198.18.0.254", false, 255);
        unknown.ttl = None;
        assert!(matches!(
            t.receive(unknown, now),
            Err(Refused::Ttl { ttl: 0, .. })
        ));
    }

    /// Junk is refused without touching any session.
    #[test]
    fn malformed_datagrams_are_refused() {
        let now = Instant::now();
        let mut t = Table::new(1);
        let k = key("198.18.0.254", false);
        t.upsert(k, settings(255), now);
        for junk in [&b""[..], &[0u8; 3][..], &[0xffu8; 24][..]] {
            assert!(matches!(
                t.receive(dgram(junk, "198.18.0.254", false, 255), now),
                Err(Refused::Malformed(_))
            ));
        }
        assert_eq!(t.get(&k).unwrap().session.state(), State::Down);
    }

    /// Retuning an existing session keeps its discriminator; removing it says AdminDown and
    /// frees the discriminator; an unchanged profile changes nothing.
    #[test]
    fn upsert_and_remove() {
        let now = Instant::now();
        let mut t = Table::new(u64::from(u32::MAX));
        let k = key("fd00:18::fe", false);
        t.upsert(k, settings(255), now);
        let d = t.get(&k).unwrap().session.local_discriminator();
        assert_ne!(d, 0);
        assert!(t.upsert(k, settings(255), now).is_empty());
        let mut faster = settings(255);
        faster.config.desired_min_tx = Duration::from_millis(100);
        t.upsert(k, faster, now);
        assert_eq!(t.get(&k).unwrap().session.local_discriminator(), d);
        assert_eq!(t.get(&k).unwrap().settings, faster);
        let last = t.remove(&k, now);
        assert!(last.iter().any(
            |a| matches!(a, Action::Send(p) if p.state == State::AdminDown && p.my_discriminator == d)
        ));
        assert!(t.get(&k).is_none());
        assert!(t.next_deadline().is_none());
        assert!(t.remove(&k, now).is_empty());
    }

    /// Timers: an active session sends at once, then goes quiet until its next interval.
    #[test]
    fn timers_drive_transmission() {
        let now = Instant::now();
        let mut t = Table::new(3);
        let k = key("198.18.0.254", false);
        t.upsert(k, settings(255), now);
        assert_eq!(t.next_deadline(), Some(now));
        let due = t.on_timer(now);
        assert_eq!(due.len(), 1);
        assert!(matches!(due[0].1[0], Action::Send(_)));
        assert!(t.next_deadline().unwrap() > now);
        assert!(t.on_timer(now).is_empty());
    }
}
