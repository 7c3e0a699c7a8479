//! Properties of the codec and the session over arbitrary inputs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use ferrolb_bfd::packet::{ControlPacket, Diagnostic, State};
use ferrolb_bfd::session::{Action, Config, Session};

/// Two sessions brought Up by the handshake: `a` (discriminator 0x1234) and its peer `b`
/// (0x5678), with the time after it.
fn up_pair() -> (Session, Session, Instant) {
    let mut now = Instant::now();
    let mut a = Session::new(Config::default(), 0x1234, 9, now);
    let mut b = Session::new(Config::default(), 0x5678, 7, now);
    for _ in 0..10 {
        now += Duration::from_millis(1000);
        // Packets in flight, each with whether a sent it; delivered until none is left.
        let mut wire: Vec<(bool, ControlPacket)> = a
            .on_timer(now)
            .into_iter()
            .filter_map(sent)
            .map(|p| (true, p))
            .chain(
                b.on_timer(now)
                    .into_iter()
                    .filter_map(sent)
                    .map(|p| (false, p)),
            )
            .collect();
        while let Some((from_a, p)) = wire.pop() {
            let to = if from_a { &mut b } else { &mut a };
            wire.extend(
                to.receive(&p, now)
                    .into_iter()
                    .filter_map(sent)
                    .map(|q| (!from_a, q)),
            );
        }
        if (a.state(), b.state()) == (State::Up, State::Up) {
            return (a, b, now);
        }
    }
    panic!("no handshake: {:?} {:?}", a.state(), b.state());
}

fn sent(action: Action) -> Option<ControlPacket> {
    match action {
        Action::Send(p) => Some(p),
        Action::StateChanged { .. } => None,
    }
}
use proptest::prelude::*;

fn state() -> impl Strategy<Value = State> {
    prop_oneof![
        Just(State::AdminDown),
        Just(State::Down),
        Just(State::Init),
        Just(State::Up)
    ]
}

prop_compose! {
    fn packet()(
        diag in 0u8..32,
        state in state(),
        flags in any::<[bool; 4]>(),
        detect_mult in 1u8..,
        my in 1u32..,
        your in any::<u32>(),
        times in any::<[u32; 3]>(),
        auth in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..20)),
    ) -> ControlPacket {
        let auth = auth.map(|mut a| {
            // Auth Type, Auth Len counting itself and the type.
            a.insert(0, 1);
            let len = u8::try_from(a.len() + 1).unwrap();
            a.insert(1, len);
            a
        });
        let diagnostic = match ControlPacket::decode(&{
            let mut b = vec![(1 << 5) | diag, 0x40, 1, 24];
            b.extend_from_slice(&[0, 0, 0, 1]);
            b.extend_from_slice(&[0; 16]);
            b
        }) {
            Ok(p) => p.diagnostic,
            Err(_) => Diagnostic::None,
        };
        ControlPacket {
            diagnostic,
            state,
            poll: flags[0] && !flags[1],
            final_: flags[1],
            control_plane_independent: flags[2],
            demand: flags[3],
            detect_mult,
            my_discriminator: my,
            your_discriminator: your,
            desired_min_tx: times[0],
            required_min_rx: times[1],
            required_min_echo_rx: times[2],
            auth,
        }
    }
}

proptest! {
    #[test]
    fn every_packet_round_trips(p in packet()) {
        prop_assert_eq!(ControlPacket::decode(&p.encode()), Ok(p));
    }

    #[test]
    fn decoding_any_bytes_returns(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        if let Ok(p) = ControlPacket::decode(&bytes) {
            // What decodes encodes to itself (bytes past the fixed part and the authentication
            // section, within the Length field, are ignored, as RFC 5880 allows).
            prop_assert_eq!(ControlPacket::decode(&p.encode()), Ok(p));
        }
    }

    /// Any sequence of packets, timer ticks and admin changes: the session never skips the
    /// handshake (Down never goes straight to Up unless the peer said Init), and the time it
    /// asks to be woken at is never in the past of the last event.
    #[test]
    fn sessions_only_take_rfc_transitions(
        events in proptest::collection::vec(
            prop_oneof![
                packet().prop_map(Some),
                Just(None),
            ],
            1..60,
        ),
        steps in proptest::collection::vec(0u64..2000, 60),
        admin in proptest::collection::vec(any::<bool>(), 60),
    ) {
        let t0 = Instant::now();
        let mut now = t0;
        let mut s = Session::new(Config::default(), 0x1234, 9, t0);
        for (i, event) in events.iter().enumerate() {
            now += Duration::from_millis(steps[i]);
            let before = s.state();
            let actions = match event {
                Some(p) => {
                    let mut p = p.clone();
                    // Half the packets name this session.
                    if i % 2 == 0 {
                        p.your_discriminator = 0x1234;
                    }
                    s.receive(&p, now)
                }
                None if admin[i] && i % 7 == 3 => s.set_admin_down(before != State::AdminDown, now),
                None => s.on_timer(now),
            };
            let heard = event.as_ref().map(|p| p.state);
            for action in &actions {
                match action {
                    Action::StateChanged { from, to, .. } => {
                        // Up only through the handshake: from Down on the peer's Init, from
                        // Init on the peer's Init or Up.
                        if *to == State::Up {
                            let via = match from {
                                State::Down => heard == Some(State::Init),
                                State::Init => matches!(heard, Some(State::Init | State::Up)),
                                _ => false,
                            };
                            prop_assert!(via, "{:?} → Up on {:?}", from, heard);
                        }
                        let allowed = matches!(
                            (from, to),
                            (State::Down, State::Init)
                                | (State::Down, State::Up)
                                | (State::Init, State::Up)
                                | (State::Init | State::Up, State::Down)
                                | (_, State::AdminDown)
                                | (State::AdminDown, State::Down)
                        );
                        prop_assert!(allowed, "{:?} → {:?}", from, to);
                    }
                    Action::Send(p) => {
                        prop_assert!(p.auth.is_none() && !(p.poll && p.final_));
                        prop_assert_eq!(p.required_min_echo_rx, 0);
                        if p.state != State::Up {
                            prop_assert!(p.desired_min_tx >= 1_000_000, "fast while not Up");
                        }
                    }
                }
            }
        }
    }

    /// Forged packets from the segment: whatever they say, packets that name no session or come
    /// from another session of the peer never change an Up session's state or its peer.
    #[test]
    fn an_up_session_is_moved_only_by_its_peer_session(
        packets in proptest::collection::vec(packet(), 1..40),
        name_us in proptest::collection::vec(any::<bool>(), 40),
    ) {
        let (mut a, _b, mut now) = up_pair();
        for (i, mut p) in packets.into_iter().enumerate() {
            now += Duration::from_millis(10);
            p.your_discriminator = if name_us[i] { 0x1234 } else { 0 };
            if p.my_discriminator == 0x5678 {
                p.my_discriminator = 0x5679;
            }
            let actions = a.receive(&p, now);
            prop_assert!(
                actions.iter().all(|a| !matches!(a, Action::StateChanged { .. })),
                "{:?} moved the session: {:?}", p, actions
            );
            prop_assert_eq!(a.state(), State::Up);
            prop_assert_eq!(a.remote_discriminator(), 0x5678);
        }
    }
}
