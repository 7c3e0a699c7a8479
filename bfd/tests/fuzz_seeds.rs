//! The fuzz targets' seed corpus (bfd/fuzz/seeds/<target>/): the control packets captured from
//! FRR's bfdd (frr_vectors.rs), as datagrams and as a session's conversation in the
//! session_events target's record format, so coverage-guided fuzzing (scripts/fuzz) starts from
//! valid packets.
//!
//! This test fails when the committed files differ from what it would write; to rewrite them:
//! `FERROLB_WRITE_FUZZ_SEEDS=1 cargo test -p ferrolb-bfd --test fuzz_seeds`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;

use ferrolb_bfd::packet::ControlPacket;

/// Files of one target: name -> bytes.
type Corpus = BTreeMap<String, Vec<u8>>;

/// `const NAME: &str = "<hex>";` items of a Rust source, as (lowercase name, bytes); consts
/// that are not all hex digits are skipped.
fn hex_consts(source: &str) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut rest = source;
    while let Some(at) = rest.find("\nconst ") {
        rest = &rest[at + "\nconst ".len()..];
        let Some((name, after)) = rest.split_once(": &str = \"") else {
            break;
        };
        if name.contains(char::is_whitespace) {
            continue;
        }
        let Some((body, _)) = after.split_once('"') else {
            break;
        };
        let digits: String = body
            .chars()
            .filter(|c| !c.is_whitespace() && *c != '\\')
            .collect();
        if digits.is_empty()
            || !digits.len().is_multiple_of(2)
            || !digits.bytes().all(|b| b.is_ascii_hexdigit())
        {
            continue;
        }
        let bytes = (0..digits.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).unwrap())
            .collect();
        out.push((name.to_lowercase(), bytes));
    }
    out
}

/// Compares the committed seeds with `want`, or writes them when FERROLB_WRITE_FUZZ_SEEDS=1.
fn check_or_write(dir: &Path, want: BTreeMap<&'static str, Corpus>) {
    let write = std::env::var_os("FERROLB_WRITE_FUZZ_SEEDS").is_some_and(|v| v == "1");
    if write {
        let _ = std::fs::remove_dir_all(dir);
    }
    for (target, corpus) in &want {
        let target_dir = dir.join(target);
        if write {
            std::fs::create_dir_all(&target_dir).unwrap();
            for (name, bytes) in corpus {
                std::fs::write(target_dir.join(name), bytes).unwrap();
            }
        }
        let have: Corpus = std::fs::read_dir(&target_dir)
            .unwrap_or_else(|e| {
                panic!(
                    "{}: {e} (FERROLB_WRITE_FUZZ_SEEDS=1 writes it)",
                    target_dir.display()
                )
            })
            .map(|entry| {
                let entry = entry.unwrap();
                let name = entry.file_name().into_string().unwrap();
                (name, std::fs::read(entry.path()).unwrap())
            })
            .collect();
        assert!(
            &have == corpus,
            "{} differs from what the vectors give ({} files committed, {} expected); \
             rewrite with FERROLB_WRITE_FUZZ_SEEDS=1 cargo test --test fuzz_seeds",
            target_dir.display(),
            have.len(),
            corpus.len()
        );
    }
    let targets: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| !want.contains_key(name.as_str()))
        .collect();
    assert!(targets.is_empty(), "seeds of unknown targets: {targets:?}");
}

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
