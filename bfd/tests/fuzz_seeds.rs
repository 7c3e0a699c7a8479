//! The fuzz targets' seed corpus (bfd/fuzz/seeds/<target>/): the control packets captured from
//! FRR's bfdd (frr_vectors.rs), as datagrams and as a session's conversation in the
//! session_events target's record format, so coverage-guided fuzzing (scripts/fuzz) starts from
//! valid packets.
//!
//! This test fails when the committed files differ from what it would write; to rewrite them:
//! `FERROLB_WRITE_FUZZ_SEEDS=1 cargo test -p ferrolb-bfd --test fuzz_seeds`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

// Std only: shared with the other protocol crates without a dependency on testkit, which pulls
// Kubernetes types (scripts/check-protocol-deps).
#[path = "../../testkit/src/seed_corpus.rs"]
mod seed_corpus;

use std::collections::BTreeMap;
use std::path::Path;

use seed_corpus::{Corpus, check_or_write, hex_consts};

use ferrolb_bfd::packet::ControlPacket;

/// One session_events record: kind (1: a packet addressed to the session), milliseconds since
/// the previous record, payload length, payload.
fn record(kind: u8, step_ms: u16, payload: &[u8]) -> Vec<u8> {
    let len = u8::try_from(payload.len()).unwrap();
    [&[kind][..], &step_ms.to_be_bytes(), &[len], payload].concat()
}

fn seeds() -> BTreeMap<&'static str, Corpus> {
    let packets: Vec<_> = hex_consts(include_str!("frr_vectors.rs"))
        .into_iter()
        .filter(|(_, bytes)| ControlPacket::decode(bytes).is_ok())
        .collect();
    assert!(
        packets.len() >= 5,
        "frr_vectors.rs gives {} packets",
        packets.len()
    );
    let find = |name: &str| {
        packets
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, bytes)| bytes.clone())
            .unwrap_or_else(|| panic!("no vector {name}"))
    };
    let decode_control = packets.iter().cloned().collect();

    // FRR's side of a session's life: Down, Init, Up with Poll, Up, timers running, our
    // AdminDown and back, FRR signalling Down. First octet: 0 active, 1 passive.
    let conversation = |passive: u8| {
        let mut input = vec![passive];
        input.extend(record(1, 100, &find("down")));
        input.extend(record(1, 100, &find("init")));
        input.extend(record(2, 1000, &[]));
        input.extend(record(1, 100, &find("up_poll")));
        input.extend(record(1, 300, &find("up")));
        input.extend(record(2, 300, &[]));
        input.extend(record(1, 300, &find("up")));
        input.extend(record(3, 10, &[1]));
        input.extend(record(2, 1000, &[]));
        input.extend(record(3, 10, &[0]));
        input.extend(record(1, 100, &find("signaled_down")));
        input.extend(record(2, 3000, &[]));
        input
    };
    let session_events = [
        ("active".to_string(), conversation(0)),
        ("passive".to_string(), conversation(1)),
        // The same packets unaddressed (kind 0: as sent, Your Discriminator as captured).
        ("unaddressed".to_string(), {
            let mut input = vec![0];
            for (_, bytes) in &packets {
                input.extend(record(0, 100, bytes));
            }
            input
        }),
    ]
    .into_iter()
    .collect();

    BTreeMap::from([
        ("decode_control", decode_control),
        ("session_events", session_events),
    ])
}

#[test]
fn fuzz_seeds_are_the_vectors() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    check_or_write(&dir, seeds());
}
