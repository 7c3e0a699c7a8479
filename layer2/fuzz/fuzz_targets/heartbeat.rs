//! Any datagram at the heartbeat port: decoding must return, never panic; what decodes must
//! encode back to the same bytes; and any sequence of heartbeats (any boots, sequence numbers and
//! clocks, from any key holder) must be refused or taken by the membership table without a panic,
//! the table holding only the cluster's nodes once it knows them.
//!
//! Three kinds of input, by the first byte: raw datagrams (the tag check refuses nearly all);
//! datagrams signed here with the fuzzer's key and optionally given the magic, which reach the
//! parser behind the tag check; and a sequence of structured heartbeats fed to one table.
#![no_main]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use ferrolb_layer2::heartbeat::{Heard, Heartbeat, KeyRing};
use ferrolb_layer2::liveness::Membership;
use ferrolb_layer2::quorum;
use ferrolb_layer2::tenure::{self, SentLog};
use hmac::{Hmac, Mac};
use libfuzzer_sys::fuzz_target;
use sha2::Sha256;

const KEY: &[u8] = b"fuzz key, at least 16 bytes";
/// The current key of a rotation whose next key is [`KEY`].
const OTHER: &[u8] = b"another fuzz key, 16 bytes";
/// Bytes of the truncated tag (layer2/src/heartbeat.rs).
const TAG_LEN: usize = 16;

fn signed(body: Vec<u8>) -> Vec<u8> {
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(KEY) else {
        return body;
    };
    mac.update(&body);
    let tag = mac.finalize().into_bytes();
    let mut out = body;
    out.extend_from_slice(&tag[..TAG_LEN]);
    out
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    if let Some(s) = bytes.get(at..at + 8) {
        b.copy_from_slice(s);
    }
    u64::from_be_bytes(b)
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    let start = Instant::now();
    let mut members = Membership::new("self", Duration::from_millis(500));
    // Peers that leave to be replaced are held: the hold's paths run too.
    members.set_restart_hold(Duration::from_secs(10));
    let Ok(ring) = KeyRing::new([OTHER.to_vec(), KEY.to_vec()]) else {
        return;
    };
    if mode % 3 == 2 {
        // 26 bytes a heartbeat: sender, flags, boot, seq, sender's clock; ours is near it.
        for (i, chunk) in body.chunks(26).take(64).enumerate() {
            let beat = Heartbeat {
                node: format!("node{}", chunk.first().copied().unwrap_or(0) % 4),
                boot: u64_at(chunk, 2),
                seq: u64_at(chunk, 10),
                unix_ms: u64_at(chunk, 18),
                ready: chunk.get(1).is_some_and(|f| f & 1 == 1),
                leaving: chunk.get(1).is_some_and(|f| f & 2 == 2),
                restarting: chunk.get(1).is_some_and(|f| f & 0x40 == 0x40),
                interfaces: BTreeSet::from(["eth0".to_string()]),
                // Who the sender hears, from the flag bits: the quorum rule runs on these.
                hears: (0..4u8)
                    .filter(|n| chunk.get(1).is_some_and(|f| f & (4 << n) != 0))
                    .map(|n| {
                        (
                            format!("node{n}"),
                            Heard {
                                ready: n % 2 == 0,
                                boot: u64_at(chunk, 2) ^ u64::from(n),
                                seq: u64_at(chunk, 10) >> n,
                            },
                        )
                    })
                    .collect(),
            };
            let Ok(bytes) = beat.encode(KEY) else {
                continue;
            };
            assert_eq!(Heartbeat::decode(&bytes, KEY).as_ref(), Ok(&beat));
            assert_eq!(Heartbeat::decode_with(&bytes, &ring), Ok((beat.clone(), 1)));
            // Now and then the node list arrives or changes: only its names stay in the table.
            let first = chunk.first().copied().unwrap_or(0);
            if first & 0x80 != 0 {
                let listed = usize::from((first >> 4) & 3) + 1;
                members.set_nodes(
                    (0..listed)
                        .map(|n| format!("node{n}"))
                        .chain(["self".to_string()])
                        .collect(),
                );
                assert!(members.known() <= listed);
            }
            let now = start + Duration::from_millis(10 * i as u64);
            let skew = u64::from(chunk.get(1).copied().unwrap_or(0));
            let _ = members.receive(beat.clone(), now, beat.unix_ms.wrapping_add(skew * 1000));
            let _ = members.hears(now);
            let _ = members.next_silence(now);
            let known = (0..4)
                .map(|n| format!("node{n}"))
                .chain(["self".to_string()])
                .collect();
            let verdict = quorum::decide(
                "self",
                &known,
                &members.reports(now),
                true,
                &BTreeSet::new(),
            );
            assert!(verdict.acts() || !verdict.candidates.contains_key("self"));
            // Acknowledgements of any values: the tenure and the claim rule take them.
            let mut sent = SentLog::new(u64_at(chunk, 2));
            sent.record(u64_at(chunk, 10), start);
            let acks = members.acks(u64_at(chunk, 2));
            let _ = tenure::tenure("self", &known, &acks, &sent, Duration::from_millis(500));
            let _ = quorum::seen_ready("self", &verdict, &acks);
        }
        return;
    }
    let datagram = if mode % 3 == 0 {
        body.to_vec()
    } else if mode & 4 == 0 {
        signed(body.to_vec())
    } else {
        // The current version's magic (layer2/src/heartbeat.rs), so the body reaches the parser.
        signed([b"FLB\x03".as_slice(), body].concat())
    };
    let Ok(beat) = Heartbeat::decode(&datagram, KEY) else {
        assert!(Heartbeat::decode_with(&datagram, &ring).is_err());
        return;
    };
    assert_eq!(
        Heartbeat::decode_with(&datagram, &ring),
        Ok((beat.clone(), 1))
    );
    assert_eq!(
        beat.encode(KEY).as_deref(),
        Ok(&datagram[..]),
        "decode then encode changed the bytes"
    );
    let _ = members.receive(beat.clone(), start, beat.unix_ms);
    let _ = members.hears(start);
});
