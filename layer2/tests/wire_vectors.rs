//! The membership wire format v4 (layer2/src/wire.rs), pinned byte for byte: speakers of two
//! builds must read each other's beats and reports.
//!
//! The expected bytes were built independently of the Rust code, by a Python script that follows
//! the format's description (hashlib for the set digest and name checks, hmac for the tag):
//!
//! ```python
//! import hashlib, hmac, struct
//! KEY = b"0123456789abcdef0123456789abcdef"
//! def set_id(names):      # the SetId: digest and count
//!     h = hashlib.sha256(b"ferrolb presence set v4\0" + struct.pack(">H", len(names)))
//!     for n in names: h.update(bytes([len(n)]) + n)
//!     return h.digest()[:16] + struct.pack(">H", len(names))
//! def check(name): return hashlib.sha256(b"ferrolb node name v4\0" + name).digest()[:8]
//! def ref(i, name): return struct.pack(">H", i) + check(name)
//! def sign(body): return body + hmac.new(KEY, body, hashlib.sha256).digest()[:16]
//! # beat: b"FLB\x04", kind 1, flags, boot, seq, clock, set, name, interfaces, acks
//! # report: b"FLB\x04", kind 2, voter ref, recipient ref, boot, seq, clock, set, ack,
//! #   flags (one octet: 0x01 mature, 0x02 told, 0x04 same), bitmap version (8 bytes),
//! #   voter configuration generation (8 bytes),
//! #   bitmap (none when same, or when the set is past 10,848 nodes)
//! # part: b"FLB\x04", kind 3, voter ref, boot, seq, set, offset, length, slice
//! ```
//!
//! These vectors are also the `wire` fuzz target's seeds (tests/fuzz_seeds.rs reads them).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use ferrolb_layer2::heartbeat::{Heartbeat, HeartbeatError, KeyRing};
use ferrolb_layer2::wire::{
    Ack, Beat, Message, NodeRef, Report, Seen, Sender, SetId, WireError, bitmap, heard, name_check,
    sender, version,
};

const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

/// n1's beat over the set {n0, n1, n2}: ready, boot 0x0102030405060708, sequence 9, clock
/// 0x190_0000_0000 ms, interface e0, acknowledging n0's report (0x11, 0x100) and n2's (0x22, 3). 124 bytes.
const BEAT: &str = "\
    464c4204010101020304050607080000000000000009000001900000000077ec\
    47d1e8566ca98cd4d7ac6f3b721e0003026e31010265300200001f6d68e718d1\
    10b3000000000000001100000000000001000002555ad8f7802575ec00000000\
    00000022000000000000000315fdd74427b3d16106b35f0735fa116f";
/// n2's beat while it is replaced (leaving and restarting, not ready), knowing no set yet:
/// no interface, no acknowledgement. 69 bytes.
const BEAT_LEAVING: &str = "\
    464c4204010600000000feedface000000000000000100000190000000640000\
    00000000000000000000000000000000026e320000a482dc966814110626cffb\
    02adbbba9a";
/// n0's report to n1 over {n0, n1, n2}: boot 0x11, sequence 0x100, clock 0x190_0000_0032 ms,
/// acknowledging n1's beat (0x0102030405060708, 9), mature and not told (flags 0x01), bitmap
/// version 7, voter configuration 2, hearing n0 and n1 (bitmap 0xc0). 117 bytes.
const REPORT: &str = "\
    464c42040200001f6d68e718d110b300010a5a19ab9d11a21a00000000000000\
    110000000000000100000001900000003277ec47d1e8566ca98cd4d7ac6f3b72\
    1e00030102030405060708000000000000000901000000000000000700000000\
    00000002c035663f13ec7713d932920b57584acc65";
/// n0's next report, over a set of 12,000 nodes (digest 0xab…, a set too large for the bitmap
/// to travel inline), mature and told (flags 0x03, kept in the head report when the bitmap goes
/// in parts), bitmap version 8, configuration 2: no bitmap. 116 bytes.
const REPORT_SPLIT: &str = "\
    464c42040200001f6d68e718d110b300010a5a19ab9d11a21a00000000000000\
    1100000000000001010000019000000032ababababababababababababababab\
    ab2ee00102030405060708000000000000000903000000000000000800000000\
    00000002f6068dc88f5d087a24433b3b54d9d233";
/// n0's next report to n1 over {n0, n1, n2} (sequence 0x101), leaving its bitmap out: n1
/// acknowledged holding version 7 (flags 0x07: mature, told, same). 116 bytes at any set size.
const REPORT_SAME: &str = "\
    464c42040200001f6d68e718d110b300010a5a19ab9d11a21a00000000000000\
    110000000000000101000001900000003277ec47d1e8566ca98cd4d7ac6f3b72\
    1e00030102030405060708000000000000000907000000000000000700000000\
    00000002b1a8eb534a06b31f8a124fdd26af7d70";
/// The second and last part of that report's bitmap (all 0x5a): offset 1,403, 97 bytes. 166 bytes.
const PART: &str = "\
    464c42040300001f6d68e718d110b300000000000000110000000000000101ab\
    ababababababababababababababab2ee0057b00615a5a5a5a5a5a5a5a5a5a5a\
    5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a\
    5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a\
    5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a3cd733167e710687ef71\
    0ed7f40d2548";

fn unhex(s: &str) -> Vec<u8> {
    let digits: String = s.chars().filter(char::is_ascii_hexdigit).collect();
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).unwrap())
        .collect()
}

fn ring() -> KeyRing {
    KeyRing::new([KEY.to_vec()]).unwrap()
}

fn three() -> SetId {
    SetId::of(["n0", "n1", "n2"]).unwrap()
}

/// A set of 12,000 nodes, by its id alone (its names do not matter to the format).
fn big() -> SetId {
    SetId {
        digest: [0xab; 16],
        len: 12_000,
    }
}

fn beat() -> Beat {
    Beat {
        node: "n1".into(),
        boot: 0x0102_0304_0506_0708,
        seq: 9,
        unix_ms: 0x0190_0000_0000,
        ready: true,
        leaving: false,
        restarting: false,
        set: three(),
        interfaces: ["e0".to_string()].into(),
        acks: vec![
            Ack {
                voter: NodeRef::new(0, "n0"),
                seen: Seen {
                    boot: 0x11,
                    seq: 0x100,
                },
            },
            Ack {
                voter: NodeRef::new(2, "n2"),
                seen: Seen { boot: 0x22, seq: 3 },
            },
        ],
    }
}

fn beat_leaving() -> Beat {
    Beat {
        node: "n2".into(),
        boot: 0xfeed_face,
        seq: 1,
        unix_ms: 0x0190_0000_0064,
        ready: false,
        leaving: true,
        restarting: true,
        set: SetId::default(),
        interfaces: Default::default(),
        acks: vec![],
    }
}

fn report() -> Report {
    Report {
        voter: NodeRef::new(0, "n0"),
        to: NodeRef::new(1, "n1"),
        boot: 0x11,
        seq: 0x100,
        unix_ms: 0x0190_0000_0032,
        set: three(),
        ack: Seen {
            boot: 0x0102_0304_0506_0708,
            seq: 9,
        },
        mature: true,
        told: false,
        same: false,
        version: 7,
        generation: 2,
        bitmap: bitmap(3, [0, 1]),
    }
}

/// [`report`]'s successor to the same member, which holds its bitmap: left out.
fn report_same() -> Report {
    Report {
        seq: 0x101,
        told: true,
        same: true,
        bitmap: vec![],
        ..report()
    }
}

/// The 12,000-node report with its whole bitmap, before [`Report::split`].
fn big_report() -> Report {
    Report {
        seq: 0x101,
        told: true,
        version: 8,
        set: big(),
        bitmap: vec![0x5a; 1500],
        ..report()
    }
}

fn vectors() -> Vec<(&'static str, Message)> {
    let (head, parts) = big_report().split().unwrap();
    vec![
        ("BEAT", beat().into()),
        ("BEAT_LEAVING", beat_leaving().into()),
        ("REPORT", report().into()),
        ("REPORT_SPLIT", head.into()),
        ("REPORT_SAME", report_same().into()),
        ("PART", parts[1].clone().into()),
    ]
}

fn hex_of(name: &str) -> &'static str {
    match name {
        "BEAT" => BEAT,
        "BEAT_LEAVING" => BEAT_LEAVING,
        "REPORT" => REPORT,
        "REPORT_SPLIT" => REPORT_SPLIT,
        "REPORT_SAME" => REPORT_SAME,
        "PART" => PART,
        _ => unreachable!(),
    }
}

#[test]
fn messages_encode_byte_exact_and_decode_back() {
    for (name, message) in vectors() {
        let want = unhex(hex_of(name));
        assert_eq!(message.encode(&ring()).unwrap(), want, "{name}");
        assert_eq!(Message::decode(&want, &ring()), Ok((message, 0)), "{name}");
        assert_eq!(version(&want), Some(4));
    }
}

#[test]
fn digests_and_checks_are_pinned() {
    // From the Python script above.
    let set = three();
    assert_eq!(set.len, 3);
    assert_eq!(
        set.digest,
        unhex("77ec47d1e8566ca98cd4d7ac6f3b721e").as_slice()
    );
    assert_eq!(name_check("n0"), unhex("1f6d68e718d110b3").as_slice());
}

#[test]
fn a_large_report_splits_into_the_pinned_parts_and_joins_back() {
    let whole = big_report();
    let (head, parts) = whole.clone().split().unwrap();
    assert_eq!(parts.len(), 2);
    assert_eq!((parts[0].offset, parts[0].bytes.len()), (0, 1403));
    assert_eq!((parts[1].offset, parts[1].bytes.len()), (1403, 97));
    let Message::Part(last) = Message::decode(&unhex(PART), &ring()).unwrap().0 else {
        panic!("PART is not a part");
    };
    let Message::Report(got) = Message::decode(&unhex(REPORT_SPLIT), &ring()).unwrap().0 else {
        panic!("REPORT_SPLIT is not a report");
    };
    assert_eq!(got, head);
    // The head keeps the report's flags; the parts do not carry them.
    assert!(got.mature && got.told);
    assert_eq!(got.join([&parts[0], &last]).unwrap(), whole.bitmap);
    assert!(heard(&whole.bitmap, 1) && !heard(&whole.bitmap, 0));
}

#[test]
fn a_same_report_names_the_bitmap_of_the_report_before() {
    let decode = |hex| match Message::decode(&unhex(hex), &ring()).unwrap().0 {
        Message::Report(r) => r,
        other => panic!("not a report: {other:?}"),
    };
    let (before, same) = (decode(REPORT), decode(REPORT_SAME));
    assert_eq!(same, report_same());
    assert!(same.same && same.bitmap.is_empty() && !before.same);
    // Same voter, boot and version: the recipient reads the bitmap it kept from REPORT.
    assert_eq!(
        (same.voter, same.boot, same.version),
        (before.voter, before.boot, before.version)
    );
    // Nothing to split or join: the report alone, and no bitmap of its own.
    let (head, parts) = same.clone().split().unwrap();
    assert_eq!((head, parts.len()), (same.clone(), 0));
    assert!(same.join([]).is_err());
}

#[test]
fn any_changed_byte_is_refused() {
    for (name, _) in vectors() {
        let good = unhex(hex_of(name));
        for at in 0..good.len() {
            for flip in [0x01u8, 0x80] {
                let mut bad = good.clone();
                bad[at] ^= flip;
                let err = Message::decode(&bad, &ring()).unwrap_err();
                // A shape refusal says so without a tag; sender() agrees on those.
                if err != WireError::BadTag {
                    assert_eq!(sender(&bad), Err(err), "{name} byte {at}");
                }
            }
        }
        // Cut short or lengthened at every length: never accepted.
        for len in 0..good.len() {
            assert!(
                Message::decode(&good[..len], &ring()).is_err(),
                "{name} cut to {len}"
            );
        }
        let mut longer = good.clone();
        longer.push(0);
        assert!(Message::decode(&longer, &ring()).is_err());
    }
}

#[test]
fn senders_are_read_before_the_tag() {
    assert_eq!(sender(&unhex(BEAT)), Ok(Sender::Node("n1".into())));
    for v in [REPORT, REPORT_SPLIT, REPORT_SAME, PART] {
        assert_eq!(sender(&unhex(v)), Ok(Sender::Voter(NodeRef::new(0, "n0"))));
    }
    // Even under a key nobody holds: the sender is a hint, not an authenticated fact.
    let forged = Message::from(beat())
        .encode_with(b"a key nobody holds, 16 bytes")
        .unwrap();
    assert_eq!(sender(&forged), Ok(Sender::Node("n1".into())));
    assert_eq!(Message::decode(&forged, &ring()), Err(WireError::BadTag));
}

#[test]
fn v3_decoders_refuse_v4_and_v4_decoders_refuse_v3() {
    for (name, _) in vectors() {
        assert_eq!(
            Heartbeat::decode(&unhex(hex_of(name)), KEY),
            Err(HeartbeatError::Malformed),
            "{name}"
        );
    }
    let v3 = Heartbeat {
        node: "n1".into(),
        boot: 1,
        seq: 1,
        unix_ms: 1,
        ready: true,
        leaving: false,
        restarting: false,
        interfaces: Default::default(),
        hears: Default::default(),
    }
    .encode(KEY)
    .unwrap();
    assert_eq!(version(&v3), Some(3));
    assert_eq!(Message::decode(&v3, &ring()), Err(WireError::Version(3)));
}

#[test]
fn parts_are_checked_against_their_report() {
    let (head, parts) = big_report().split().unwrap();
    let mut foreign = parts[1].clone();
    foreign.voter = NodeRef::new(1, "n1");
    assert!(head.join([&parts[0], &foreign]).is_err());
    let mut other_set = parts[1].clone();
    other_set.set.digest[0] ^= 1;
    assert!(head.join([&parts[0], &other_set]).is_err());
}
