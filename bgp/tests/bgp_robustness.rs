//! The no-panic, no-hang property on the stable toolchain: replays truncated, bit-flipped and
//! random inputs through framing and decoding, and round-trips whatever decodes. The nightly
//! fuzz targets in `bgp/fuzz` explore the same property far more widely.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::mpsc;
use std::time::Duration;

use ferrolb_bgp::packet::{CodecContext, EncodeError, Message};

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Captured messages (see bgp_vectors.rs for how) plus the inputs that break zettabgp 0.6.0.
const SEEDS: &[&str] = &[
    // FRR OPEN with hostname, GR, LLGR, add-path capabilities.
    "ffffffffffffffffffffffffffffffff006c01045ba000b4c612fa014f020601040001000102028000020202000202460002064104fa56ea0102020600020645040001010102144912056672722d610b6c61622e6578616d706c6502044002c0780209470700010180000000",
    // GoBGP OPEN.
    "ffffffffffffffffffffffffffffffff003b0104fc00005ac612fa021e021c0200490402766d0001040001000141040000fc000506000100010002",
    // GoBGP UPDATE with communities and large communities.
    "ffffffffffffffffffffffffffffffff005102000000354001010040020602010000fc00400304c612fa028004040000000ac00808fc000064ffffff01c0200cfa56ea01000000010000000220c612fa64",
    // GoBGP UPDATE, IPv6 MP_REACH_NLRI.
    "ffffffffffffffffffffffffffffffff0064020000004d40010100400200400504000000c8c00804fc0000c8800e2600020110fd00001800fa000000000000000000020080fd00001800fa00000000000000000200c0200cfa56ea010000000300000004",
    // FRR UPDATE, IPv6 with link-local next hop.
    "ffffffffffffffffffffffffffffffff00670200000050900e003600020120fd00001800fa00000000000000000001fe800000000000002c68eafffed95dc20080fd00001800fa0000000000000000010040010100500200008004040000000040050400000064",
    // RFC 8950 (bgp_extended_next_hop.rs): IPv4 in MP_REACH_NLRI with a link-local next hop
    // twice, and in MP_UNREACH_NLRI.
    "ffffffffffffffffffffffffffffffff0051020000003a4001010040020602010000fc00800e2a00010120fe800000000000000000000000000001fe8000000000000000000000000000010020c612c901",
    "ffffffffffffffffffffffffffffffff0022020000000b800f0800010120c612c901",
    // GoBGP MP_UNREACH_NLRI, FRR ROUTE-REFRESH, GoBGP NOTIFICATION, KEEPALIVE.
    "ffffffffffffffffffffffffffffffff002e0200000017800f1400020180fd00001800fa00000000000000000200",
    "ffffffffffffffffffffffffffffffff00170500010001",
    "ffffffffffffffffffffffffffffffff00240306020e666572726f6c6220766563746f72",
    "ffffffffffffffffffffffffffffffff001304",
    // zettabgp: endless loop (AS_PATH with a stray octet), index panic, subtract overflow.
    "ffffffffffffffffffffffffffffffff0021020000000a40010100400203020000",
    "ffffffffffffffffffffffffffffffff0018020000000140",
    "ffffffffffffffffffffffffffffffff001204",
];

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn inputs() -> Vec<Vec<u8>> {
    let seeds: Vec<Vec<u8>> = SEEDS.iter().map(|s| hex(s)).collect();
    let mut out = Vec::new();
    let mut rng = Rng(0x5eed_f00d_cafe_0001);
    for seed in &seeds {
        for cut in 0..seed.len() {
            // As a reader would see a short read...
            out.push(seed[..cut].to_vec());
            // ...and as a well-framed message that ends early.
            if cut >= 19 {
                let mut m = seed[..cut].to_vec();
                m[16..18].copy_from_slice(&(cut as u16).to_be_bytes());
                out.push(m);
            }
        }
        for _ in 0..40 {
            let mut m = seed.clone();
            for _ in 0..1 + rng.below(4) {
                let i = 16 + rng.below(m.len() - 16);
                m[i] ^= 1 << rng.below(8);
            }
            out.push(m);
        }
    }
    for _ in 0..400 {
        let len = 19 + rng.below(120);
        let mut m: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        m[..16].fill(0xff);
        m[16..18].copy_from_slice(&(len as u16).to_be_bytes());
        m[18] = 1 + rng.below(5) as u8;
        // Plausible UPDATE field lengths now and then, to get past the framing checks.
        if m[18] == 2 && len > 23 && rng.below(2) == 0 {
            m[19..21].copy_from_slice(&[0, 0]);
            m[21..23].copy_from_slice(&((len - 23) as u16).to_be_bytes());
        }
        out.push(m);
    }
    // Pure garbage.
    for _ in 0..50 {
        let len = rng.below(64);
        out.push((0..len).map(|_| rng.next() as u8).collect());
    }
    out
}

fn exercise(input: &[u8]) {
    for ctx in [
        CodecContext {
            four_octet_as: true,
        },
        CodecContext {
            four_octet_as: false,
        },
    ] {
        let _ = Message::frame_len(input);
        match Message::decode(input, &ctx) {
            Err(e) => {
                let n = e.notification();
                assert!(Message::Notification(n).to_bytes(&ctx).is_ok(), "{e:?}");
            }
            Ok(first) => {
                let bytes = match first.to_bytes(&ctx) {
                    Ok(b) => b,
                    Err(EncodeError::MessageTooLong { .. }) if input.len() > 4000 => continue,
                    Err(e) => panic!("{e:?} for {input:02x?}"),
                };
                let mut second = Message::decode(&bytes, &ctx).unwrap();
                let mut first = first;
                for m in [&mut first, &mut second] {
                    if let Message::Update(u) = m {
                        u.errors.clear();
                    }
                }
                assert_eq!(first, second, "round trip of {input:02x?}");
            }
        }
    }
}

#[test]
fn decoding_never_panics_or_hangs_on_damaged_input() {
    let inputs = inputs();
    assert!(inputs.len() > 1000);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for input in &inputs {
            exercise(input);
        }
        let _ = tx.send(inputs.len());
    });
    // A hang shows up as a failure, not as a stuck CI job.
    let done = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("decoding hung, or a panic ended the worker");
    assert!(done > 1000);
}
