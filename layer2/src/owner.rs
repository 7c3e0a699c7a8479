//! Owner choice by rendezvous (highest random weight) hashing.
//!
//! Every speaker scores each candidate node for a key and picks the highest score. Speakers that
//! see the same candidates pick the same owner without talking to each other or to the API
//! server; keys spread evenly over nodes; and when a node joins or leaves, only the keys it wins
//! or held move. The score is SHA-256, so it is the same on every node, architecture and build
//! (a rolling upgrade must not move IPs).

use sha2::{Digest, Sha256};

/// The score of `node` for `key`.
pub fn score(node: &str, key: &str) -> u64 {
    let mut hasher = Sha256::new();
    hasher.update(node.as_bytes());
    // A separator keeps ("ab", "c") and ("a", "bc") apart.
    hasher.update([0]);
    hasher.update(key.as_bytes());
    let digest = hasher.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// The owner of `key` among `candidates`: the highest score, ties broken by the name (so the
/// result never depends on the order candidates come in).
pub fn choose<'a>(key: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|node| (score(node, key), node))
        .max()
        .map(|(_, node)| node)
}

/// `candidates` in the order they would own `key`: the owner first, then the node that takes
/// over if it goes, and so on (the same rule as [`choose`], applied to what is left). What
/// `kubectl ferrolb explain` shows as the takeover order.
pub fn rank<'a>(key: &str, candidates: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut scored: Vec<(u64, &str)> = candidates
        .into_iter()
        .map(|node| (score(node, key), node))
        .collect();
    scored.sort_unstable_by(|a, b| b.cmp(a));
    scored.dedup();
    scored.into_iter().map(|(_, node)| node).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn nodes(n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("node{i}")).collect()
    }

    #[test]
    fn score_is_stable_across_builds() {
        // Pinned: a change here moves every IP of every cluster on upgrade.
        assert_eq!(
            score("node1", "198.18.200.1"),
            score("node1", "198.18.200.1")
        );
        assert_eq!(score("node1", "198.18.200.1"), 0x1069_8fd1_f86f_e163);
        assert_ne!(score("ab", "c"), score("a", "bc"));
    }

    #[test]
    fn empty_candidates_have_no_owner() {
        assert_eq!(choose("198.18.200.1", []), None);
    }

    #[test]
    fn spreads_keys_evenly() {
        let nodes = nodes(3);
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for i in 0..3000 {
            let key = format!("198.18.{}.{}", i / 256, i % 256);
            let owner = choose(&key, nodes.iter().map(String::as_str)).unwrap();
            *counts.entry(owner).or_default() += 1;
        }
        for (node, count) in counts {
            assert!((850..=1150).contains(&count), "{node} owns {count} of 3000");
        }
    }

    proptest! {
        #[test]
        fn order_of_candidates_does_not_matter(key in "[0-9a-f:.]{1,40}", n in 1usize..8, rot in 0usize..8) {
            let mut list = nodes(n);
            let a = choose(&key, list.iter().map(String::as_str)).map(str::to_owned);
            list.rotate_left(rot % n);
            list.reverse();
            let b = choose(&key, list.iter().map(String::as_str)).map(str::to_owned);
            prop_assert_eq!(a, b);
        }

        /// The ranking's head is the owner, and without it the next one owns: the order
        /// `explain` shows is the order takeovers happen in.
        #[test]
        fn rank_is_the_order_of_takeovers(key in "[0-9a-f:.]{1,40}", n in 1usize..8) {
            let all = nodes(n);
            let mut left: Vec<&str> = all.iter().map(String::as_str).collect();
            let ranked = rank(&key, left.iter().copied());
            prop_assert_eq!(ranked.len(), n);
            for expected in ranked {
                prop_assert_eq!(choose(&key, left.iter().copied()), Some(expected));
                left.retain(|m| *m != expected);
            }
        }

        #[test]
        fn removing_a_node_moves_only_its_keys(keys in prop::collection::vec("[0-9a-f:.]{1,40}", 1..50), n in 2usize..8, gone in 0usize..8) {
            let all = nodes(n);
            let gone = &all[gone % n];
            let rest: Vec<&str> = all.iter().map(String::as_str).filter(|m| m != gone).collect();
            for key in &keys {
                let before = choose(key, all.iter().map(String::as_str)).unwrap();
                let after = choose(key, rest.iter().copied()).unwrap();
                if before != gone {
                    prop_assert_eq!(before, after);
                }
            }
        }
    }
}
