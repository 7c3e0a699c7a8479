//! The fuzz targets' seed corpora, shared by the protocol crates' `tests/fuzz_seeds.rs`: hex
//! vectors read from the crates' test sources, and the committed seed files checked against what
//! the vectors give (or written, with `FERROLB_WRITE_FUZZ_SEEDS=1`). Std only, so the protocol
//! crates include it by path (`#[path]`) without depending on this crate.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::collections::BTreeMap;
use std::path::Path;

/// Files of one target: name -> bytes.
pub type Corpus = BTreeMap<String, Vec<u8>>;

/// `const NAME: &str = "<hex>";` items of a Rust source, as (lowercase name, bytes); consts
/// that are not all hex digits are skipped.
pub fn hex_consts(source: &str) -> Vec<(String, Vec<u8>)> {
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
pub fn check_or_write(dir: &Path, want: BTreeMap<&'static str, Corpus>) {
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
