//! The socket filter, run by a small classic-BPF interpreter written from `linux/filter.h`
//! (not from the filter's source): it must pass exactly the frames that are ARP requests or
//! Neighbor Solicitations, arriving for this host, outside any VLAN, and pass them whole.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{Ipv4Addr, Ipv6Addr};

use ferrolb_layer2::packet::filter::{Instruction, program};
use ferrolb_layer2::packet::{
    ArpRequest, MacAddr, NeighborSolicitation, arp_reply, gratuitous_arp_reply,
    gratuitous_arp_request, ndp::icmpv6_checksum, neighbor_advertisement, parse,
    solicited_node_multicast, unsolicited_neighbor_advertisement,
};
use proptest::prelude::*;

// linux/if_packet.h
const PACKET_HOST: u32 = 0;
const PACKET_BROADCAST: u32 = 1;
const PACKET_MULTICAST: u32 = 2;
const PACKET_OTHERHOST: u32 = 3;
const PACKET_OUTGOING: u32 = 4;

/// What the kernel knows about a frame besides its bytes.
#[derive(Debug, Clone, Copy)]
struct Meta {
    pkttype: u32,
    /// The 802.1Q TCI the kernel took off the frame, if any.
    vlan_tci: Option<u16>,
}

impl Meta {
    /// How a frame arriving from the wire, untagged, is classified.
    fn incoming(frame: &[u8]) -> Meta {
        let pkttype = match frame.first() {
            Some(_) if frame.get(..6) == Some(&[0xff; 6]) => PACKET_BROADCAST,
            Some(b) if b & 1 == 1 => PACKET_MULTICAST,
            _ => PACKET_HOST,
        };
        Meta {
            pkttype,
            vlan_tci: None,
        }
    }
}

/// Runs a classic BPF program as the kernel does for a socket filter; returns its result (the
/// number of octets to keep; 0 drops the frame). Panics on opcodes it does not know, so a
/// filter that starts using one fails here rather than passing untested.
fn run(program: &[Instruction], frame: &[u8], meta: Meta) -> u32 {
    const SKF_AD_OFF: u32 = 0xffff_f000;
    let (mut a, mut x) = (0u32, 0u32);
    let mut mem = [0u32; 16];
    let mut pc = 0usize;
    let load = |k: u32, size: usize| -> Option<u32> {
        if k >= SKF_AD_OFF {
            assert_eq!(size, 4, "ancillary loads are words");
            return Some(match k - SKF_AD_OFF {
                0 => u32::from(u16::from_be_bytes([frame[12], frame[13]])), // SKF_AD_PROTOCOL
                4 => meta.pkttype,                                          // SKF_AD_PKTTYPE
                44 => u32::from(meta.vlan_tci.unwrap_or(0)),                // SKF_AD_VLAN_TAG
                48 => u32::from(meta.vlan_tci.is_some()), // SKF_AD_VLAN_TAG_PRESENT
                other => panic!("ancillary offset {other} not interpreted"),
            });
        }
        let k = usize::try_from(k).ok()?;
        let bytes = frame.get(k..k.checked_add(size)?)?;
        Some(bytes.iter().fold(0u32, |acc, &b| acc << 8 | u32::from(b)))
    };
    loop {
        let Instruction { code, jt, jf, k } = program[pc];
        pc += 1;
        match code {
            // BPF_LD | BPF_W/H/B | BPF_ABS: out of bounds ends the program with 0.
            0x20 | 0x28 | 0x30 => {
                let size = match code {
                    0x20 => 4,
                    0x28 => 2,
                    _ => 1,
                };
                match load(k, size) {
                    Some(v) => a = v,
                    None => return 0,
                }
            }
            0x00 => a = k,                 // BPF_LD | BPF_IMM
            0x01 => x = k,                 // BPF_LDX | BPF_IMM
            0x02 => mem[k as usize] = a,   // BPF_ST
            0x03 => mem[k as usize] = x,   // BPF_STX
            0x60 => a = mem[k as usize],   // BPF_LD | BPF_MEM
            0x54 => a &= k,                // BPF_ALU | BPF_AND | BPF_K
            0x44 => a |= k,                // BPF_ALU | BPF_OR | BPF_K
            0x04 => a = a.wrapping_add(k), // BPF_ALU | BPF_ADD | BPF_K
            0x07 => x = a,                 // BPF_MISC | BPF_TAX
            0x87 => a = x,                 // BPF_MISC | BPF_TXA
            0x05 => pc += k as usize,      // BPF_JMP | BPF_JA
            // BPF_JMP | BPF_JEQ/JGT/JGE/JSET | BPF_K
            0x15 | 0x25 | 0x35 | 0x45 => {
                let taken = match code {
                    0x15 => a == k,
                    0x25 => a > k,
                    0x35 => a >= k,
                    _ => a & k != 0,
                };
                pc += usize::from(if taken { jt } else { jf });
            }
            0x06 => return k, // BPF_RET | BPF_K
            0x16 => return a, // BPF_RET | BPF_A
            other => panic!("opcode {other:#04x} not interpreted"),
        }
        assert!(pc < program.len(), "ran off the end of the program");
    }
}

fn accepts(frame: &[u8], meta: Meta) -> bool {
    let kept = run(&program(), frame, meta);
    assert!(
        kept == 0 || kept as usize >= frame.len(),
        "frame cut to {kept} octets"
    );
    kept != 0
}

fn accepts_incoming(frame: &[u8]) -> bool {
    accepts(frame, Meta::incoming(frame))
}

const OURS: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x0b]);
const THEIRS: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x0a]);

fn v6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

fn arp_request_frame() -> Vec<u8> {
    // A request is a gratuitous request with another target; build it from one.
    let mut frame = gratuitous_arp_request(THEIRS, Ipv4Addr::new(192, 0, 2, 1));
    frame[38..42].copy_from_slice(&[192, 0, 2, 2]);
    frame
}

fn arp_request() -> ArpRequest {
    ArpRequest {
        eth_source: THEIRS,
        sender_mac: THEIRS,
        sender_ip: Ipv4Addr::new(192, 0, 2, 1),
        target_ip: Ipv4Addr::new(192, 0, 2, 2),
    }
}

/// An NS built by hand: from `source` (with SLLAO unless `::`) for `target`.
fn ns_frame(source: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
    let destination = solicited_node_multicast(target);
    let mut icmp = vec![135, 0, 0, 0, 0, 0, 0, 0];
    icmp.extend_from_slice(&target.octets());
    if !source.is_unspecified() {
        icmp.extend_from_slice(&[1, 1]);
        icmp.extend_from_slice(&THEIRS.0);
    }
    let checksum = icmpv6_checksum(&source, &destination, &icmp);
    icmp[2..4].copy_from_slice(&checksum.to_be_bytes());
    let mut frame = vec![0x33, 0x33, 0xff];
    frame.extend_from_slice(&target.octets()[13..]);
    frame.extend_from_slice(&THEIRS.0);
    frame.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
    frame.extend_from_slice(&u16::try_from(icmp.len()).unwrap().to_be_bytes());
    frame.extend_from_slice(&[58, 255]);
    frame.extend_from_slice(&source.octets());
    frame.extend_from_slice(&destination.octets());
    frame.extend_from_slice(&icmp);
    frame
}

fn ns() -> NeighborSolicitation {
    let target = v6("2001:db8::2");
    NeighborSolicitation {
        eth_source: THEIRS,
        source: v6("fe80::ff:fe00:a"),
        destination: solicited_node_multicast(target),
        target,
        source_link_addr: Some(THEIRS),
    }
}

/// IPv4 TCP SYN, IPv4 ICMP echo, ICMPv6 echo request, and an IPv6 UDP datagram.
fn other_traffic() -> Vec<Vec<u8>> {
    let eth = |ethertype: [u8; 2]| {
        let mut f = OURS.0.to_vec();
        f.extend_from_slice(&THEIRS.0);
        f.extend_from_slice(&ethertype);
        f
    };
    let mut tcp = eth([0x08, 0x00]);
    tcp.extend_from_slice(&[
        0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0, 192, 0, 2, 1, 192, 0, 2, 2,
    ]);
    tcp.extend_from_slice(&[
        0x9c, 0x40, 0, 80, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0,
    ]);
    let mut icmp4 = eth([0x08, 0x00]);
    icmp4.extend_from_slice(&[
        0x45, 0, 0, 28, 0, 0, 0x40, 0, 64, 1, 0, 0, 192, 0, 2, 1, 192, 0, 2, 2,
    ]);
    icmp4.extend_from_slice(&[8, 0, 0xf7, 0xff, 0, 0, 0, 0]);
    let ipv6 = |next_header: u8, payload: &[u8]| {
        let mut f = eth([0x86, 0xdd]);
        f.extend_from_slice(&[0x60, 0, 0, 0]);
        f.extend_from_slice(&u16::try_from(payload.len()).unwrap().to_be_bytes());
        f.extend_from_slice(&[next_header, 64]);
        f.extend_from_slice(&v6("2001:db8::1").octets());
        f.extend_from_slice(&v6("2001:db8::2").octets());
        f.extend_from_slice(payload);
        f
    };
    let echo6 = ipv6(58, &[128, 0, 0, 0, 0, 1, 0, 1]);
    let udp6 = ipv6(17, &[0x9c, 0x40, 0, 53, 0, 8, 0, 0]);
    // Hop-by-hop header (padding) before an NS: RFC-legal, but we do not answer it.
    let mut hbh = vec![58, 0, 1, 4, 0, 0, 0, 0];
    hbh.extend_from_slice(&ns_frame(v6("fe80::1"), v6("2001:db8::2"))[54..]);
    let hbh_ns = ipv6(0, &hbh);
    vec![tcp, icmp4, echo6, udp6, hbh_ns]
}

#[test]
fn accepts_requests() {
    let requests = [
        arp_request_frame(),
        gratuitous_arp_request(OURS, Ipv4Addr::new(192, 0, 2, 9)),
        ns_frame(v6("fe80::ff:fe00:a"), v6("2001:db8::2")),
        ns_frame(Ipv6Addr::UNSPECIFIED, v6("2001:db8::2")),
    ];
    for frame in &requests {
        assert!(matches!(parse(frame), Ok(Some(_))), "{frame:02x?}");
        assert!(accepts_incoming(frame), "{frame:02x?}");
        // Unicast to us as well as broadcast or multicast.
        let host = Meta {
            pkttype: PACKET_HOST,
            vlan_tci: None,
        };
        assert!(accepts(frame, host));
        // Priority-tagged (VLAN ID 0) frames are untagged to Linux, and to us.
        let priority = Meta {
            vlan_tci: Some(0x6000),
            ..host
        };
        assert!(accepts(frame, priority));
    }
    // Whole frames, whatever their length.
    let mut long = arp_request_frame();
    long.resize(1514, 0);
    assert_eq!(run(&program(), &long, Meta::incoming(&long)), u32::MAX);
}

#[test]
fn rejects_replies_and_other_traffic() {
    let target = v6("2001:db8::2");
    let mut rejected = vec![
        arp_reply(&arp_request(), OURS),
        gratuitous_arp_reply(OURS, Ipv4Addr::new(192, 0, 2, 9)),
        neighbor_advertisement(&ns(), OURS, target),
        unsolicited_neighbor_advertisement(OURS, target, target),
    ];
    rejected.extend(other_traffic());
    for frame in &rejected {
        assert!(!accepts_incoming(frame), "{frame:02x?}");
        assert!(!matches!(parse(frame), Ok(Some(_))), "{frame:02x?}");
    }
}

#[test]
fn rejects_requests_not_for_this_host_or_of_a_vlan() {
    for frame in [
        arp_request_frame(),
        ns_frame(v6("fe80::1"), v6("2001:db8::2")),
    ] {
        let incoming = Meta::incoming(&frame);
        // Our own frames, seen on the way out, and unicast for others (promiscuous NIC).
        for pkttype in [PACKET_OTHERHOST, PACKET_OUTGOING, 5, 7] {
            assert!(
                !accepts(
                    &frame,
                    Meta {
                        pkttype,
                        ..incoming
                    }
                ),
                "pkttype {pkttype}"
            );
        }
        // VLAN 100, tag taken off by the kernel; VLAN 100 with priority bits.
        for tci in [100, 0x2064, 0x0fff] {
            let tagged = Meta {
                vlan_tci: Some(tci),
                ..incoming
            };
            assert!(!accepts(&frame, tagged), "tci {tci:#x}");
        }
        // The tag still in the frame (802.1Q and 802.1ad).
        for tpid in [[0x81, 0x00], [0x88, 0xa8]] {
            let mut tagged = frame[..12].to_vec();
            tagged.extend_from_slice(&tpid);
            tagged.extend_from_slice(&[0, 100]);
            tagged.extend_from_slice(&frame[12..]);
            assert!(!accepts_incoming(&tagged));
            assert_eq!(parse(&tagged), Ok(None));
        }
    }
}

#[test]
fn short_frames_are_dropped() {
    let arp = arp_request_frame();
    let ns = ns_frame(v6("fe80::1"), v6("2001:db8::2"));
    // The filter reads the ARP operation at 20..22 and the ICMPv6 type at 54.
    for frame in [&arp[..21], &ns[..54], &arp[..13], &[][..]] {
        assert!(!accepts_incoming(frame), "{} octets", frame.len());
    }
    assert!(accepts_incoming(&arp[..22]));
    assert!(accepts_incoming(&ns[..55]));
}

/// Frames near valid requests: one to three octets changed, maybe cut short.
fn mutated() -> impl Strategy<Value = Vec<u8>> {
    let seeds = vec![
        arp_request_frame(),
        arp_reply(&arp_request(), OURS),
        ns_frame(v6("fe80::ff:fe00:a"), v6("2001:db8::2")),
        ns_frame(Ipv6Addr::UNSPECIFIED, v6("2001:db8::2")),
        neighbor_advertisement(&ns(), OURS, v6("2001:db8::2")),
    ];
    (
        proptest::sample::select(seeds),
        proptest::collection::vec((0usize..90, any::<u8>()), 0..4),
        proptest::option::of(0usize..90),
    )
        .prop_map(|(mut frame, edits, cut)| {
            for (at, value) in edits {
                if let Some(b) = frame.get_mut(at) {
                    *b = value;
                }
            }
            if let Some(len) = cut {
                frame.truncate(len);
            }
            frame
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20_000))]

    /// No request the parser accepts is lost in the kernel, and nothing the parser dismisses
    /// reaches it: what passes the filter is a request, valid or malformed (so malformed ones
    /// are counted). The filter also drops some malformed frames outright, those too short for
    /// it to read the ethertype, the ARP operation or the ICMPv6 type.
    #[test]
    fn filter_agrees_with_parser(frame in mutated()) {
        check_agreement(&frame)?;
    }

    #[test]
    fn filter_agrees_with_parser_on_any_bytes(frame in proptest::collection::vec(any::<u8>(), 0..100)) {
        check_agreement(&frame)?;
    }
}

fn check_agreement(frame: &[u8]) -> Result<(), TestCaseError> {
    let parsed = parse(frame);
    if matches!(parsed, Ok(Some(_))) {
        prop_assert!(accepts_incoming(frame), "request dropped by the filter");
    }
    if accepts_incoming(frame) {
        prop_assert!(!matches!(parsed, Ok(None)), "filter passed a non-request");
    }
    Ok(())
}
