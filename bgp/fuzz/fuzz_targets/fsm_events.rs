//! Any sequence of events, in any state: the session state machine must answer each with actions
//! and never panic. Timer, TCP and local events come from one byte each; message events carry a
//! framed body that goes through the codec first, as the driver feeds them.
#![no_main]

use std::net::Ipv4Addr;
use std::time::Duration;

use ferrolb_bgp::fsm::{Backoff, Config, Event, PeerAs, Session};
use ferrolb_bgp::packet::{AfiSafi, CodecContext, HEADER_LEN, MARKER, Message};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&setup, mut rest)) = data.split_first() else {
        return;
    };
    // The first byte picks the peer AS rule, hold time, graceful restart and extended next hop.
    let config = Config {
        local_as: 64512,
        peer_as: match setup % 3 {
            0 => PeerAs::Fixed(64513),
            1 => PeerAs::Internal,
            _ => PeerAs::External,
        },
        bgp_id: Ipv4Addr::new(198, 18, 250, 10),
        hold_time: if setup & 0x4 == 0 { 90 } else { 0 },
        keepalive_time: None,
        connect_retry: Backoff {
            initial: Duration::from_secs(5),
            max: Duration::from_secs(120),
        },
        families: vec![AfiSafi::IPV4_UNICAST, AfiSafi::IPV6_UNICAST],
        graceful_restart_time: (setup & 0x8 != 0).then_some(120),
        // Lets the peer's extended next hop capability reach negotiation.
        extended_next_hop: setup & 0x20 != 0,
    };
    let Ok(mut session) = Session::new(config) else {
        return;
    };
    let ctx = CodecContext {
        four_octet_as: setup & 0x10 == 0,
    };
    // Bounded, so one input cannot run for long.
    for _ in 0..256 {
        let Some((&op, tail)) = rest.split_first() else {
            break;
        };
        rest = tail;
        let event = match op % 13 {
            0 => Event::ManualStart,
            1 => Event::ManualStop,
            2 => Event::ManualStartWithPassiveTcpEstablishment,
            3 => Event::ConnectRetryTimerExpires,
            4 => Event::HoldTimerExpires,
            5 => Event::KeepaliveTimerExpires,
            6 => Event::IdleHoldTimerExpires,
            7 => Event::TcpCRAcked,
            8 => Event::TcpConnectionConfirmed,
            9 => Event::TcpConnectionFails,
            10 => Event::OpenCollisionDump,
            _ => {
                // A message: a type byte and a length byte, then that many bytes of body, framed
                // with a valid marker and length so most reach the message decoders (a fuzzer
                // without coverage feedback would rarely guess the 16-byte marker).
                let Some((&[kind, len], tail)) = rest.split_first_chunk::<2>() else {
                    break;
                };
                let len = usize::from(len).min(tail.len());
                let (body, tail) = tail.split_at(len);
                rest = tail;
                let mut frame = MARKER.to_vec();
                let total = u16::try_from(HEADER_LEN + body.len()).unwrap_or(u16::MAX);
                frame.extend_from_slice(&total.to_be_bytes());
                frame.push(kind % 6);
                frame.extend_from_slice(body);
                Event::from_decoded(Message::decode(&frame, &ctx))
            }
        };
        let _ = session.handle(event);
        let _ = session.state();
    }
});
