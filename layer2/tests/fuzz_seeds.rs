//! The fuzz targets' seed corpus (layer2/fuzz/seeds/<target>/): the frames of l2_vectors.rs
//! (captured from Linux, arping and ndisc6), signed heartbeats and the v4 membership messages of
//! wire_vectors.rs, wrapped in each target's input format, so coverage-guided fuzzing (scripts/fuzz) starts from valid messages.
//!
//! This test fails when the committed files differ from what it would write; to rewrite them:
//! `FERROLB_WRITE_FUZZ_SEEDS=1 cargo test -p ferrolb-layer2 --test fuzz_seeds`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

// Std only: shared with the other protocol crates without a dependency on testkit, which pulls
// Kubernetes types (scripts/check-protocol-deps).
#[path = "../../testkit/src/seed_corpus.rs"]
mod seed_corpus;

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv6Addr;
use std::path::Path;

use seed_corpus::{Corpus, check_or_write, hex_consts};

use ferrolb_layer2::heartbeat::{Heard, Heartbeat, KeyRing};
use ferrolb_layer2::packet::ndp::ALL_NODES;
use ferrolb_layer2::packet::router_discovery::ALL_ROUTERS;
use ferrolb_layer2::packet::{
    ETHERTYPE_ARP, ETHERTYPE_IPV6, MacAddr, RouterAdvertisement, RouterSolicitation,
    router_advertisement, router_solicitation,
};
use ferrolb_layer2::wire::{self, Ack, Beat, Message, NodeRef, Report, Seen, SetId};

/// The heartbeat target's key (layer2/fuzz/fuzz_targets/heartbeat.rs).
const FUZZ_KEY: &[u8] = b"fuzz key, at least 16 bytes";
/// The key wire_vectors.rs signs its vectors with.
const VECTOR_KEY: &[u8] = b"0123456789abcdef0123456789abcdef";
/// Bytes of the heartbeat's truncated tag and of its magic.
const TAG_LEN: usize = 16;
const MAGIC_LEN: usize = 4;
/// The router_discovery target's link-local source for selector 0 (its `PEER`).
const PEER: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0xa);
const MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x0b]);

fn ethertype(frame: &[u8]) -> u16 {
    u16::from_be_bytes([frame[12], frame[13]])
}

fn beat(node: &str, hears: usize, name_len: usize) -> Heartbeat {
    Heartbeat {
        node: node.to_string(),
        boot: 0x1234_5678_9abc_def0,
        seq: 42,
        unix_ms: 1_796_000_000_000,
        ready: true,
        leaving: false,
        restarting: false,
        interfaces: BTreeSet::from(["eth0".to_string(), "bond0.100".to_string()]),
        hears: (0..hears)
            .map(|i| {
                let name = format!("node-{i:0>width$}", width = name_len.saturating_sub(5));
                let heard = Heard {
                    ready: i % 3 != 0,
                    boot: 7 + i as u64,
                    seq: 1000 + i as u64,
                };
                (name, heard)
            })
            .collect(),
    }
}

fn seeds() -> BTreeMap<&'static str, Corpus> {
    let frames = hex_consts(include_str!("l2_vectors.rs"));
    assert!(
        frames.len() >= 14,
        "l2_vectors.rs gives {} frames",
        frames.len()
    );
    let of_type = |t: u16| frames.iter().filter(move |(_, f)| ethertype(f) == t);

    // arp and ndp: whole frames, and the payload after the Ethernet header (the targets also
    // parse the input behind a header of their ethertype).
    let arp = of_type(ETHERTYPE_ARP)
        .flat_map(|(name, frame)| {
            [
                (name.clone(), frame.clone()),
                (format!("{name}.payload"), frame[14..].to_vec()),
            ]
        })
        .collect();
    let ndp = of_type(ETHERTYPE_IPV6)
        .flat_map(|(name, frame)| {
            [
                (name.clone(), frame.clone()),
                (format!("{name}.payload"), frame[14..].to_vec()),
            ]
        })
        .collect();

    // router_discovery: a selector octet (bits 0-1 source, bit 2 destination all-routers,
    // bits 6-7 hop limit 255), then the ICMPv6 message.
    let from_peer_to_nodes = 0xc0;
    let from_peer_to_routers = 0xc4;
    let rs_linux = frames.iter().find(|(n, _)| n == "rs_linux").unwrap();
    let ra = RouterAdvertisement {
        cur_hop_limit: 64,
        flags: 0x08,
        router_lifetime: 1800,
        reachable_time: 30_000,
        retrans_timer: 1000,
        source_link_addr: Some(MAC),
    };
    let router_discovery = [
        (
            "rs_linux",
            [&[from_peer_to_routers][..], &rs_linux.1[54..]].concat(),
        ),
        (
            "rs_ours",
            [
                &[from_peer_to_routers][..],
                &router_solicitation(
                    &RouterSolicitation {
                        source_link_addr: Some(MAC),
                    },
                    PEER,
                    ALL_ROUTERS,
                ),
            ]
            .concat(),
        ),
        (
            "ra",
            [
                &[from_peer_to_nodes][..],
                &router_advertisement(&ra, PEER, ALL_NODES),
            ]
            .concat(),
        ),
        (
            "ra_not_a_default_router",
            [
                &[from_peer_to_nodes][..],
                &router_advertisement(
                    &RouterAdvertisement::not_a_default_router(MAC),
                    PEER,
                    ALL_NODES,
                ),
            ]
            .concat(),
        ),
    ]
    .into_iter()
    .map(|(name, bytes)| (name.to_string(), bytes))
    .collect();

    // heartbeat: mode 0 is a raw datagram (signed with the target's key); mode 1 is signed by
    // the target (here without its tag); mode 4 also gets the magic from the target; mode 2 is
    // records of 26 octets fed to the membership table. The large ones reach the 64 KiB a
    // datagram can hold.
    let mut heartbeat = Corpus::new();
    for (name, beat) in [
        ("alone", beat("node0", 0, 5)),
        ("three", beat("node1", 3, 5)),
        ("hundreds", beat("node2", 300, 40)),
        ("near_64k", beat("node3", 240, 253)),
    ] {
        let signed = beat.encode(FUZZ_KEY).unwrap();
        assert!(signed.len() < 65_536, "{name}: {} bytes", signed.len());
        let body = &signed[..signed.len() - TAG_LEN];
        heartbeat.insert(format!("{name}.raw"), [&[0u8][..], &signed].concat());
        heartbeat.insert(format!("{name}.unsigned"), [&[1u8][..], body].concat());
        heartbeat.insert(
            format!("{name}.no_magic"),
            [&[4u8][..], &body[MAGIC_LEN..]].concat(),
        );
    }
    // Records: node, flags (ready, leaving, hears bits, restarting), boot, seq, clock.
    let record = |node: u8, flags: u8, boot: u64, seq: u64, ms: u64| {
        let mut r = vec![node, flags];
        r.extend_from_slice(&boot.to_be_bytes());
        r.extend_from_slice(&seq.to_be_bytes());
        r.extend_from_slice(&ms.to_be_bytes());
        r
    };
    let mut table = vec![2u8];
    for seq in 1..=4 {
        for node in 0..3u8 {
            table.extend(record(node | 0x80 | 0x20, 0x1d, 9, seq, 1_796_000_000_000));
        }
    }
    table.extend(record(1, 0x42, 9, 5, 1_796_000_000_500)); // node1 leaving, restarting

    // heartbeat_decode: the datagrams alone (its modes are the heartbeat target's first two).
    let heartbeat_decode: Corpus = heartbeat
        .iter()
        .filter(|(name, _)| name.as_str() != "table")
        .map(|(name, bytes)| (name.clone(), bytes.clone()))
        .collect();
    heartbeat.insert("table".into(), table);

    BTreeMap::from([
        ("wire", wire_seeds()),
        ("arp", arp),
        ("ndp", ndp),
        ("router_discovery", router_discovery),
        ("heartbeat", heartbeat),
        ("heartbeat_decode", heartbeat_decode),
    ])
}

/// The wire target's seeds: the vectors of wire_vectors.rs and the longest beat and a 5,000-node
/// report, each as a raw datagram signed with the target's key (mode 0), a body the target signs
/// (mode 1) and a body the target also gives the magic (mode 2).
fn wire_seeds() -> Corpus {
    let vectors = hex_consts(include_str!("wire_vectors.rs"));
    assert!(
        vectors.len() >= 5,
        "wire_vectors.rs gives {} vectors",
        vectors.len()
    );
    let ring = KeyRing::new([VECTOR_KEY.to_vec()]).unwrap();
    let mut messages: Vec<(String, Message)> = vectors
        .iter()
        .map(|(name, bytes)| (name.clone(), Message::decode(bytes, &ring).unwrap().0))
        .collect();
    // The worst cases the format allows at 5,000 nodes with 253-byte names.
    let names: Vec<String> = (0..5000).map(|i| format!("{i:0>253}")).collect();
    let set = SetId::of(names.iter().map(String::as_str)).unwrap();
    let longest = Beat {
        node: names[4999].clone(),
        boot: 0x1234_5678_9abc_def0,
        seq: 42,
        unix_ms: 1_796_000_000_000,
        ready: true,
        leaving: false,
        restarting: false,
        set,
        interfaces: (0..wire::MAX_INTERFACES)
            .map(|i| format!("{i:0>15}"))
            .collect(),
        acks: (0..wire::MAX_ACKS as u16)
            .map(|i| Ack {
                voter: NodeRef::new(i * 7, &names[usize::from(i) * 7]),
                seen: Seen {
                    boot: 9,
                    seq: 1000 + u64::from(i),
                },
            })
            .collect(),
    };
    let report = Report {
        voter: NodeRef::new(3, &names[3]),
        to: NodeRef::new(4999, &names[4999]),
        boot: 9,
        seq: 1001,
        unix_ms: 1_796_000_000_050,
        set,
        ack: Seen {
            boot: 0x1234_5678_9abc_def0,
            seq: 42,
        },
        mature: true,
        told: true,
        same: false,
        version: 0x0102_0304_0506_0708,
        generation: 3,
        bitmap: wire::bitmap(5000, (0..5000).filter(|i| i % 7 != 0)),
    };
    messages.push(("beat_longest".into(), longest.into()));
    messages.push(("report_5000".into(), report.into()));
    let mut corpus = Corpus::new();
    for (name, message) in messages {
        let signed = message.encode_with(FUZZ_KEY).unwrap();
        assert!(
            signed.len() <= wire::MAX_DATAGRAM,
            "{name}: {} bytes",
            signed.len()
        );
        let body = &signed[..signed.len() - TAG_LEN];
        corpus.insert(format!("{name}.raw"), [&[0u8][..], &signed].concat());
        corpus.insert(format!("{name}.unsigned"), [&[1u8][..], body].concat());
        corpus.insert(
            format!("{name}.no_magic"),
            [&[2u8][..], &body[MAGIC_LEN..]].concat(),
        );
    }
    corpus
}

#[test]
fn fuzz_seeds_are_the_vectors() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    check_or_write(&dir, seeds());
}
