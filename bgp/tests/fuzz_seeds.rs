//! The fuzz targets' seed corpus (bgp/fuzz/seeds/<target>/): valid messages taken from the
//! byte-exact vectors of bgp_vectors.rs and bgp_extended_next_hop.rs, wrapped in each target's
//! input format. Coverage-guided fuzzing starts from them, so it mutates real OPENs and UPDATEs
//! instead of guessing the 16-octet marker (scripts/fuzz).
//!
//! This test fails when the committed files differ from what the vectors give; to rewrite them:
//! `FERROLB_WRITE_FUZZ_SEEDS=1 cargo test -p ferrolb-bgp --test fuzz_seeds`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

// Std only: shared with the other protocol crates without a dependency on testkit, which pulls
// Kubernetes types (scripts/check-protocol-deps).
#[path = "../../testkit/src/seed_corpus.rs"]
mod seed_corpus;

use std::collections::BTreeMap;
use std::path::Path;

use seed_corpus::{Corpus, check_or_write, hex_consts};

use ferrolb_bgp::packet::{CodecContext, HEADER_LEN, MARKER, Message};

/// The whole BGP messages among the vectors (the error tests' fragments have no marker).
fn messages() -> Vec<(String, Vec<u8>)> {
    let ctx = CodecContext::default();
    let mut out: Vec<_> = [
        include_str!("bgp_vectors.rs"),
        include_str!("bgp_extended_next_hop.rs"),
    ]
    .into_iter()
    .flat_map(hex_consts)
    .filter(|(_, bytes)| bytes.starts_with(&MARKER) && Message::decode(bytes, &ctx).is_ok())
    .collect();
    out.sort();
    out.dedup_by(|a, b| a.1 == b.1);
    out
}

fn seeds() -> BTreeMap<&'static str, Corpus> {
    let messages = messages();
    assert!(
        messages.len() >= 20,
        "the vectors give only {} messages: did a vector file change form?",
        messages.len()
    );
    let find = |name: &str| {
        messages
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, bytes)| bytes.clone())
            .unwrap_or_else(|| panic!("no vector {name}"))
    };
    // Targets read a first byte of flags; 0 is a 4-octet-AS session, as the vectors are.
    let prefixed = |bytes: &[u8]| [&[0u8][..], bytes].concat();
    let mut decode: Corpus = messages
        .iter()
        .map(|(name, bytes)| (name.clone(), prefixed(bytes)))
        .collect();
    // A stream of several messages, as the framing loop reads it.
    decode.insert(
        "stream_gobgp".into(),
        prefixed(
            &[
                find("gobgp_open_v4"),
                find("keepalive"),
                find("gobgp_update_v4"),
                find("gobgp_withdraw_v4"),
                find("gobgp_notification_shutdown"),
            ]
            .concat(),
        ),
    );
    let round_trip = messages
        .iter()
        .map(|(name, bytes)| (name.clone(), prefixed(bytes)))
        .collect();

    // fsm_events: a setup byte, then one op byte per event; op 11 is a message, followed by its
    // type, body length and body (fuzz_targets/fsm_events.rs). Setup 1: iBGP (the captures'
    // GoBGP is AS 64512, the target's local AS), hold time 90, 4-octet AS.
    let message_event = |bytes: &[u8]| {
        let body = &bytes[HEADER_LEN..];
        let len = u8::try_from(body.len()).unwrap();
        [&[11, bytes[HEADER_LEN - 1], len][..], body].concat()
    };
    let session = |messages: &[&str]| {
        let mut input = vec![1, 0 /* ManualStart */, 7 /* TcpCRAcked */];
        for name in messages {
            input.extend(message_event(&find(name)));
            input.push(5); // KeepaliveTimerExpires
        }
        input.push(4); // HoldTimerExpires
        input
    };
    let fsm = [
        (
            "established_v4",
            session(&[
                "gobgp_open_v4",
                "keepalive",
                "gobgp_update_v4",
                "gobgp_update_v4_as_sequence",
                "gobgp_withdraw_v4",
                "gobgp_notification_shutdown",
            ]),
        ),
        (
            "established_v6",
            session(&[
                "gobgp_open_v6",
                "keepalive",
                "gobgp_update_v6",
                "gobgp_withdraw_v6",
            ]),
        ),
        (
            "refresh",
            session(&[
                "gobgp_open_v4",
                "keepalive",
                "frr_route_refresh_v4",
                "frr_notification_bad_peer_as",
            ]),
        ),
        ("open_enhe", {
            let mut input = session(&["open_enhe", "keepalive", "update_v4_link_local"]);
            input[0] = 1 | 0x20; // extended next hop on
            input
        }),
    ]
    .into_iter()
    .map(|(name, input)| (name.to_string(), input))
    .collect();

    BTreeMap::from([
        ("decode_message", decode),
        ("round_trip", round_trip),
        ("fsm_events", fsm),
    ])
}

#[test]
fn fuzz_seeds_are_the_vectors() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    check_or_write(&dir, seeds());
}

#[test]
fn seeds_decode_as_the_targets_read_them() {
    let ctx = CodecContext::default();
    for (name, input) in &seeds()["round_trip"] {
        let message =
            Message::decode(&input[1..], &ctx).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        assert_eq!(
            Message::decode(&message.to_bytes(&ctx).unwrap(), &ctx).unwrap(),
            message,
            "{name}"
        );
    }
}
