//! The heartbeat decoder alone, as a datagram at the heartbeat port reaches it: decoding must
//! return, never panic, and what decodes must encode back to the same bytes. The `heartbeat`
//! target drives the membership table too, which makes it slow (up to 64 heartbeats per input);
//! this one runs only the decoder, so a campaign reaches millions of inputs.
//!
//! Inputs as the `heartbeat` target's first two kinds, by the first byte (the seeds are shared):
//! a raw datagram (mode % 3 == 0: the tag check refuses nearly all), or a body signed here with
//! the fuzzer's key (mode bit 4: with the magic added first), which reaches the parser.
#![no_main]

use ferrolb_layer2::heartbeat::{Heartbeat, KeyRing};
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
});
