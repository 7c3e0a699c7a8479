//! Control packets captured from FRR's bfdd, byte for byte, decoded, encoded again, and fed to
//! a [`Session`] that plays FRR's peer.
//!
//! Captured 2026-12-02 from FRR 8.4.4 (Debian 12, `frr 8.4.4-1.1~deb12u2`): zebra and bfdd in
//! one network namespace, configured with `peer 198.19.250.2 local-address 198.19.250.1`,
//! `receive-interval 300`, `transmit-interval 300`, `detect-multiplier 3`; a UDP socket on
//! 198.19.250.2:3784 in a second namespace (veth between them) recorded each payload and
//! answered with hand-made packets (TTL 255, source port 49200, discriminator 0xabcd) to walk
//! bfdd through Down → Init → Up, a poll, and our AdminDown.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use ferrolb_bfd::packet::{ControlPacket, Diagnostic, State};
use ferrolb_bfd::session::{Action, Config, Session};

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// bfdd's discriminator in the capture.
const FRR: u32 = 0xf326_b947;
/// The capturing side's discriminator.
const OURS: u32 = 0xabcd;

/// bfdd's first packet: Down, knowing no peer, at the slow rate (1 s both ways, RFC 5880 6.8.3),
/// echo receive 50 ms (FRR's default echo capability).
const DOWN: &str = "20400318f326b94700000000000f4240000f42400000c350";
/// After our Down: Init, naming us.
const INIT: &str = "20800318f326b9470000abcd000f4240000f42400000c350";
/// After our Up: Up with Poll, announcing the configured 300 ms both ways.
const UP_POLL: &str = "20e00318f326b9470000abcd000493e0000493e00000c350";
/// Steady state: Up.
const UP: &str = "20c00318f326b9470000abcd000493e0000493e00000c350";
/// After our AdminDown: Down, diagnostic 3 (neighbor signaled session down); bfdd forgets our
/// discriminator at once.
const SIGNALED_DOWN: &str = "23400318f326b94700000000000493e0000493e00000c350";

fn packet(
    state: State,
    diagnostic: Diagnostic,
    poll: bool,
    your: u32,
    tx: u32,
    rx: u32,
) -> ControlPacket {
    ControlPacket {
        diagnostic,
        state,
        poll,
        final_: false,
        control_plane_independent: false,
        demand: false,
        detect_mult: 3,
        my_discriminator: FRR,
        your_discriminator: your,
        desired_min_tx: tx,
        required_min_rx: rx,
        required_min_echo_rx: 50_000,
        auth: None,
    }
}

#[test]
fn frr_packets_decode_to_their_fields_and_encode_to_the_same_bytes() {
    let none = Diagnostic::None;
    let cases = [
        (
            DOWN,
            packet(State::Down, none, false, 0, 1_000_000, 1_000_000),
        ),
        (
            INIT,
            packet(State::Init, none, false, OURS, 1_000_000, 1_000_000),
        ),
        (
            UP_POLL,
            packet(State::Up, none, true, OURS, 300_000, 300_000),
        ),
        (UP, packet(State::Up, none, false, OURS, 300_000, 300_000)),
        (
            SIGNALED_DOWN,
            packet(
                State::Down,
                Diagnostic::NeighborSignaledDown,
                false,
                0,
                300_000,
                300_000,
            ),
        ),
    ];
    for (bytes, want) in cases {
        let decoded = ControlPacket::decode(&hex(bytes)).unwrap();
        assert_eq!(decoded, want, "{bytes}");
        assert_eq!(decoded.encode(), hex(bytes), "{bytes}");
    }
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

#[test]
fn a_session_follows_frr_through_the_captured_exchange() {
    let t0 = Instant::now();
    let mut s = Session::new(Config::default(), OURS, 7, t0);
    let first = sent(&s.on_timer(t0));
    assert_eq!(first[0].state, State::Down);
    assert_eq!(first[0].required_min_echo_rx, 0, "echo is not run");
    // FRR's Down names nobody: we go Init and tell it at once.
    let actions = s.receive(&ControlPacket::decode(&hex(DOWN)).unwrap(), t0);
    assert_eq!(s.state(), State::Init);
    assert_eq!(sent(&actions)[0].your_discriminator, FRR);
    // FRR's Init: Up.
    s.receive(
        &ControlPacket::decode(&hex(INIT)).unwrap(),
        t0 + Duration::from_millis(5),
    );
    assert_eq!(s.state(), State::Up);
    // FRR's poll is answered at once with Final.
    let answer = sent(&s.receive(
        &ControlPacket::decode(&hex(UP_POLL)).unwrap(),
        t0 + Duration::from_millis(10),
    ));
    assert!(answer[0].final_ && !answer[0].poll);
    assert_eq!(s.transmit_interval(), Duration::from_millis(300));
    assert_eq!(s.detection_time(), Some(Duration::from_millis(900)));
    s.receive(
        &ControlPacket::decode(&hex(UP)).unwrap(),
        t0 + Duration::from_millis(20),
    );
    assert_eq!(s.state(), State::Up);
    // FRR going down (diagnostic 3, naming nobody): so do we.
    let actions = s.receive(
        &ControlPacket::decode(&hex(SIGNALED_DOWN)).unwrap(),
        t0 + Duration::from_millis(30),
    );
    assert!(actions.contains(&Action::StateChanged {
        from: State::Up,
        to: State::Down,
        diagnostic: Diagnostic::NeighborSignaledDown,
    }));
}
