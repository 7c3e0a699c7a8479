//! Any sequence of datagrams, clock steps and admin changes fed to one session: it never
//! panics, and never sends a packet that does not decode.
#![no_main]

use std::time::{Duration, Instant};

use ferrolb_bfd::packet::ControlPacket;
use ferrolb_bfd::session::{Action, Config, Session};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let t0 = Instant::now();
    let mut now = t0;
    let passive = data.first().is_some_and(|b| b & 1 == 1);
    let config = Config {
        passive,
        ..Config::default()
    };
    let mut session = Session::new(config, 0x0102_0304, 1, t0);
    // Records: [kind, step ms (2 bytes), length, payload...].
    let mut rest = data.get(1..).unwrap_or_default();
    while let [kind, hi, lo, len, tail @ ..] = rest {
        now += Duration::from_millis(u64::from(u16::from_be_bytes([*hi, *lo])));
        let take = usize::from(*len).min(tail.len());
        let (payload, next) = tail.split_at(take);
        rest = next;
        let actions = match kind % 4 {
            0 | 1 => match ControlPacket::decode(payload) {
                Ok(mut packet) => {
                    if kind % 4 == 1 {
                        packet.your_discriminator = 0x0102_0304;
                    }
                    session.receive(&packet, now)
                }
                Err(_) => Vec::new(),
            },
            2 => session.on_timer(now),
            _ => session.set_admin_down(payload.first().is_some_and(|b| b & 1 == 1), now),
        };
        for action in actions {
            if let Action::Send(packet) = action {
                assert_eq!(ControlPacket::decode(&packet.encode()), Ok(packet));
            }
        }
    }
});
