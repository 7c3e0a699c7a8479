//! Any byte string: framing and decoding must return, never panic, never hang.
#![no_main]

use ferrolb_bgp::packet::{CodecContext, Message};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the negotiated AS number width; the rest is a byte stream.
    let Some((&flags, stream)) = data.split_first() else {
        return;
    };
    let ctx = CodecContext {
        four_octet_as: flags & 1 == 0,
    };
    // Decode the whole input as one message, as a careless caller would...
    let _ = Message::decode(stream, &ctx);
    // ...and as a stream reader does: frame, then decode each frame.
    let mut rest = stream;
    while let Ok(Some(len)) = Message::frame_len(rest) {
        let Some(frame) = rest.get(..len) else { break };
        if let Err(e) = Message::decode(frame, &ctx) {
            let _ = e.notification();
        }
        rest = &rest[len..];
    }
});
