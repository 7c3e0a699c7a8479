//! A flood of maximum-size datagrams at the heartbeat port (issue #33, item 10): how many a
//! second one core refuses, by kind of refusal. Oversize and impossible-length datagrams are
//! refused before the tag is computed; a well-formed datagram with a wrong tag costs one
//! HMAC-SHA-256 over its length per key. Prints the figures (`--nocapture`); the assertion is
//! that the cheap refusals are much cheaper than a tag.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use ferrolb_layer2::heartbeat::{Heard, Heartbeat, HeartbeatError, KeyRing, MAX_NAME_LEN};

/// The largest UDP payload over IPv4: the largest datagram a flood can send.
const MAX_DATAGRAM: usize = 65_507;

/// Refusals a second of `datagram`, each refused as `want`, measured over 300 ms.
fn rate(datagram: &[u8], ring: &KeyRing, max_hears: usize, want: &HeartbeatError) -> f64 {
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < Duration::from_millis(300) {
        for _ in 0..64 {
            let refused = Heartbeat::decode_within(std::hint::black_box(datagram), ring, max_hears);
            assert_eq!(refused.as_ref().err(), Some(want));
            n += 1;
        }
    }
    n as f64 / start.elapsed().as_secs_f64()
}

#[test]
fn maximum_size_floods_are_refused_cheaply() {
    let key = b"0123456789abcdef0123456789abcdef";
    let ring = KeyRing::new([key.to_vec()]).unwrap();
    // A well-formed heartbeat as long as a datagram allows: peers with the longest names.
    let mut beat = Heartbeat {
        node: "n".repeat(MAX_NAME_LEN),
        boot: 1,
        seq: 1,
        unix_ms: 1,
        ready: true,
        leaving: false,
        restarting: false,
        interfaces: ["eth0".to_string()].into(),
        hears: Default::default(),
    };
    let mut i = 0;
    loop {
        let mut next = beat.clone();
        next.hears.insert(format!("{i:0>253}"), Heard::default());
        if next.encode(key).unwrap().len() > MAX_DATAGRAM {
            break;
        }
        beat = next;
        i += 1;
    }
    let forged = beat.encode(b"not the key, but 16 bytes").unwrap();
    let peers = beat.hears.len();
    let large = rate(
        &forged,
        &ring,
        8,
        &HeartbeatError::TooLarge {
            len: forged.len(),
            max: Heartbeat::max_len(8),
        },
    );
    let mut impossible = forged.clone();
    // The count of peers one more than the datagram holds.
    let at = 4 + 1 + 24 + 1 + MAX_NAME_LEN + 1 + 1 + 4;
    impossible[at..at + 2].copy_from_slice(&u16::try_from(peers + 1).unwrap().to_be_bytes());
    let malformed = rate(&impossible, &ring, usize::MAX, &HeartbeatError::Malformed);
    let tagged = rate(&forged, &ring, usize::MAX, &HeartbeatError::BadTag);
    let line_rate = 10e9 / 8.0 / (forged.len() as f64 + 28.0 + 38.0);
    println!(
        "max-size heartbeat flood ({} B, {peers} peers): refused per second on one core: \
         too large {large:.0}, impossible lengths {malformed:.0}, wrong tag (HMAC computed) \
         {tagged:.0}; 10 Gb/s line rate is {line_rate:.0} datagrams/s",
        forged.len()
    );
    assert!(
        large > 20.0 * tagged,
        "too large {large:.0}/s vs tag {tagged:.0}/s"
    );
    assert!(
        malformed > 2.0 * tagged,
        "impossible {malformed:.0}/s vs tag {tagged:.0}/s"
    );
}
