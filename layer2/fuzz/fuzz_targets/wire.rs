//! Any datagram at the membership port, format v4 (layer2/src/wire.rs): decoding must return,
//! never panic; what decodes must encode back to the same bytes; the cheap `sender()` peek must
//! agree with the full decode on every datagram whose shape it refuses and on the sender of every
//! message it accepts; and a report's bitmap must survive a split into parts and a join (a report
//! that leaves its bitmap out, `same`, splits into itself alone and has nothing to join).
//!
//! Three kinds of input, by the first byte (mode % 3): a raw datagram (the tag check refuses
//! nearly all, so this mostly exercises the shape checks); a body signed here with the fuzzer's
//! key, which reaches the decoder behind the tag check; and a body given the v4 magic, then
//! signed.
#![no_main]

use ferrolb_layer2::heartbeat::KeyRing;
use ferrolb_layer2::wire::{MAGIC, MAX_DATAGRAM, Message, Sender, WireError, sender};
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

fuzz_target!(|data: &[u8]| {
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    let Ok(ring) = KeyRing::new([OTHER.to_vec(), KEY.to_vec()]) else {
        return;
    };
    let datagram = match mode % 3 {
        0 => body.to_vec(),
        1 => signed(body.to_vec()),
        _ => signed([MAGIC.as_slice(), body].concat()),
    };
    let peek = sender(&datagram);
    let (message, key) = match Message::decode(&datagram, &ring) {
        Ok(decoded) => decoded,
        Err(WireError::BadTag) => {
            // Only the tag is wrong: the shape passed, so the peek read a sender.
            assert!(
                peek.is_ok(),
                "shape accepted by decode, refused by sender()"
            );
            return;
        }
        Err(err) => {
            assert_eq!(peek, Err(err), "sender() and decode disagree");
            return;
        }
    };
    assert_eq!(key, 1);
    assert!(datagram.len() <= MAX_DATAGRAM);
    assert_eq!(
        message.encode_with(KEY).as_deref(),
        Ok(&datagram[..]),
        "decode then encode changed the bytes"
    );
    let want = match &message {
        Message::Beat(beat) => Sender::Node(beat.node.clone()),
        Message::Report(report) => Sender::Voter(report.voter),
        Message::Part(part) => Sender::Voter(part.voter),
    };
    assert_eq!(peek, Ok(want));
    if let Message::Report(report) = message {
        if report.same {
            // A report that leaves its bitmap out splits into itself alone, whatever the set,
            // and has no bitmap to join: the recipient uses the one it kept.
            let Ok((head, parts)) = report.clone().split() else {
                panic!("a decoded same report does not split");
            };
            assert!(parts.is_empty() && head == report);
            assert!(head.join(&parts).is_err());
        } else if report.set.inline() {
            // A report over a set small enough carries its bitmap: split gives it back alone.
            let Ok((head, parts)) = report.clone().split() else {
                panic!("a decoded report does not split");
            };
            assert!(parts.is_empty());
            assert_eq!(head.join(&parts).as_ref(), Ok(&report.bitmap));
        }
    }
});
