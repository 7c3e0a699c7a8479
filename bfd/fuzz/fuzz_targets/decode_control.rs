//! Any datagram: decoding returns, never panics; what decodes encodes to itself.
#![no_main]

use ferrolb_bfd::packet::ControlPacket;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(packet) = ControlPacket::decode(data) {
        assert_eq!(ControlPacket::decode(&packet.encode()), Ok(packet));
    }
});
