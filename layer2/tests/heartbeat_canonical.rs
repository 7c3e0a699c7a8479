//! A heartbeat has one encoding: names in any order other than the one encoding writes are
//! refused, so decoding then encoding never changes the bytes. Found by coverage-guided fuzzing
//! (layer2/fuzz heartbeat target, scripts/fuzz): a signed heartbeat listing its peers out of
//! order decoded, and encoded again to other bytes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use ferrolb_layer2::heartbeat::{Heartbeat, HeartbeatError};
use hmac::{Hmac, Mac};
use sha2::Sha256;

const KEY: &[u8] = b"a test key of 16+ bytes";

fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(u8::is_ascii_hexdigit).collect();
    digits
        .chunks(2)
        .map(|d| u8::from_str_radix(std::str::from_utf8(d).unwrap(), 16).unwrap())
        .collect()
}

/// `body` with its tag: HMAC-SHA256 truncated to 16 bytes (layer2/src/heartbeat.rs).
fn signed(body: &str) -> Vec<u8> {
    let mut body = hex(body);
    let mut mac = Hmac::<Sha256>::new_from_slice(KEY).unwrap();
    mac.update(&body);
    body.extend_from_slice(&mac.finalize().into_bytes()[..16]);
    body
}

/// Magic, flags (ready), boot 1, seq 2, clock, node "n0".
const HEAD: &str = "464c4203 01 0000000000000001 0000000000000002 0000019ae0000000 02 6e30";
/// One interface, "eth0".
const ONE_INTERFACE: &str = "01 04 65746830";
/// Peers "n1" then "n2": ready, boot, seq, name.
const PEERS_IN_ORDER: &str = "0002
    01 0000000000000003 0000000000000004 02 6e31
    00 0000000000000005 0000000000000006 02 6e32";
/// The same peers, "n2" first.
const PEERS_OUT_OF_ORDER: &str = "0002
    00 0000000000000005 0000000000000006 02 6e32
    01 0000000000000003 0000000000000004 02 6e31";

#[test]
fn a_heartbeat_in_encoding_order_decodes_and_encodes_to_the_same_bytes() {
    let datagram = signed(&format!("{HEAD} {ONE_INTERFACE} {PEERS_IN_ORDER}"));
    let beat = Heartbeat::decode(&datagram, KEY).unwrap();
    assert_eq!(beat.hears.len(), 2);
    assert_eq!(beat.encode(KEY).unwrap(), datagram);
}

#[test]
fn peers_out_of_order_are_refused() {
    let datagram = signed(&format!("{HEAD} {ONE_INTERFACE} {PEERS_OUT_OF_ORDER}"));
    assert_eq!(
        Heartbeat::decode(&datagram, KEY),
        Err(HeartbeatError::Malformed)
    );
}

#[test]
fn interfaces_out_of_order_are_refused() {
    let in_order = signed(&format!(
        "{HEAD} 02 04 65746830 04 65746831 {PEERS_IN_ORDER}"
    ));
    assert_eq!(
        Heartbeat::decode(&in_order, KEY)
            .unwrap()
            .encode(KEY)
            .unwrap(),
        in_order
    );
    let out_of_order = signed(&format!(
        "{HEAD} 02 04 65746831 04 65746830 {PEERS_IN_ORDER}"
    ));
    assert_eq!(
        Heartbeat::decode(&out_of_order, KEY),
        Err(HeartbeatError::Malformed)
    );
}
