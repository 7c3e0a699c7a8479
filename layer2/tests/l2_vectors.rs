//! ARP and NDP frames captured from real implementations: what they send must parse as they
//! meant it, and where Linux answers a request our builders must produce the same bytes.
//!
//! Captured with `tcpdump -xx` on one end of a veth pair between two network namespaces, A
//! (02:00:00:00:00:0a, 192.0.2.1, 2001:db8::1) and B (02:00:00:00:00:0b, 192.0.2.2,
//! 2001:db8::2), Linux 6.18, arping 2.23 (Thomas Habets'), ndisc6 1.0.5:
//!
//! ```sh
//! ip netns add flb-t-vec-a; ip netns add flb-t-vec-b
//! ip link add veth-a netns flb-t-vec-a type veth peer name veth-b netns flb-t-vec-b
//! # addresses as above (IPv6 with `nodad`), links up, then in A:
//! arping -c 1 -I veth-a 192.0.2.2              # request, B's kernel replies
//! arping -U -c 1 -I veth-a 192.0.2.1           # gratuitous request
//! arping -A -c 1 -I veth-a 192.0.2.1           # a plain request for its own address
//! arping -U -P -c 1 -i veth-a 192.0.2.1        # gratuitous reply
//! ndisc6 -1 2001:db8::2 veth-a                 # NS, B's kernel answers with an NA
//! sysctl net.ipv6.conf.veth-a.ndisc_notify=1
//! ip addr add 2001:db8::5/64 dev veth-a        # DAD NS, then an unsolicited NA
//! ip addr add 2001:db8::2/128 dev veth-a       # DAD NS for B's address: B defends it
//! ip netns del flb-t-vec-a; ip netns del flb-t-vec-b
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{Ipv4Addr, Ipv6Addr};

use ferrolb_layer2::packet::{
    ArpRequest, MacAddr, NeighborSolicitation, ParseError, Request, arp_reply,
    gratuitous_arp_reply, gratuitous_arp_request, ndp::icmpv6_checksum, neighbor_advertisement,
    parse, solicited_node_multicast, unsolicited_neighbor_advertisement,
};

const MAC_A: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x0a]);
const MAC_B: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x0b]);

/// arping's request for 192.0.2.2 (arping pads to 58 octets).
const ARP_REQUEST: &str = "\
    ffffffffffff02000000000a0806000108000604000102000000000ac0000201\
    000000000000c000020200000000000000000000000000000000";
/// Linux's reply to it (unpadded: veth does not pad).
const ARP_REPLY_LINUX: &str = "\
    02000000000a02000000000b0806000108000604000202000000000bc0000202\
    02000000000ac0000201";
/// `arping -U`: gratuitous request, target hardware address broadcast.
const GRATUITOUS_REQUEST_ARPING: &str = "\
    ffffffffffff02000000000a0806000108000604000102000000000ac0000201\
    ffffffffffffc000020100000000000000000000000000000000";
/// `arping -U -P`: gratuitous reply, target hardware address broadcast.
const GRATUITOUS_REPLY_ARPING: &str = "\
    ffffffffffff02000000000a0806000108000604000202000000000ac0000201\
    ffffffffffffc000020100000000000000000000000000000000";
/// arping's request for its own address: the form of an RFC 5227 announcement.
const ARP_ANNOUNCEMENT_ARPING: &str = "\
    ffffffffffff02000000000a0806000108000604000102000000000ac0000201\
    000000000000c000020100000000000000000000000000000000";
/// ndisc6's NS for 2001:db8::2 from fe80::ff:fe00:a to ff02::1:ff00:2, with SLLAO, flow label
/// 0x9f411.
const NS_NDISC6: &str = "\
    3333ff00000202000000000a86dd6009f41100203afffe800000000000000000\
    00fffe00000aff0200000000000000000001ff00000287004c4d000000002001\
    0db8000000000000000000000002010102000000000a";
/// Linux's NA answering it: Solicited and Override, TLLAO, source 2001:db8::2.
const NA_LINUX: &str = "\
    02000000000a02000000000b86dd6000000000203aff20010db8000000000000\
    000000000002fe80000000000000000000fffe00000a8800ba97600000002001\
    0db8000000000000000000000002020102000000000b";
/// Linux's DAD probe for 2001:db8::2: source ::, no SLLAO, a nonce option (RFC 7527).
const DAD_NS_LINUX: &str = "\
    3333ff00000202000000000a86dd6000000000203aff00000000000000000000\
    000000000000ff0200000000000000000001ff00000287001c04000000002001\
    0db80000000000000000000000020e013af11904cee8";
/// Linux (B) defending 2001:db8::2 against that probe: to ff02::1, Override only.
const NA_LINUX_DAD_DEFENCE: &str = "\
    33330000000102000000000b86dd6000000000203aff20010db8000000000000\
    000000000002ff0200000000000000000000000000018800f91e200000002001\
    0db8000000000000000000000002020102000000000b";
/// Linux's DAD probe for 2001:db8::5.
const DAD_NS_LINUX_5: &str = "\
    3333ff00000502000000000a86dd6000000000203aff00000000000000000000\
    000000000000ff0200000000000000000001ff00000587009d1a000000002001\
    0db80000000000000000000000050e01d442dee6ee97";
/// Linux's unsolicited NA for 2001:db8::5 once DAD passed (`ndisc_notify`).
const UNSOLICITED_NA_LINUX: &str = "\
    33330000000102000000000a86dd6000000000203aff20010db8000000000000\
    000000000005ff0200000000000000000000000000018800f919200000002001\
    0db8000000000000000000000005020102000000000a";
/// Linux's unicast reachability probe (NUD) from fe80::ff:fe00:b to fe80::ff:fe00:a, with SLLAO.
const NS_LINUX_UNICAST: &str = "\
    02000000000a02000000000b86dd6000000000203afffe800000000000000000\
    00fffe00000bfe80000000000000000000fffe00000a87007cf700000000fe80\
    000000000000000000fffe00000a010102000000000b";
/// Linux's answer to it: Solicited only, no option (the probe was unicast).
const NA_LINUX_UNICAST: &str = "\
    02000000000b02000000000a86dd6000000000183afffe800000000000000000\
    00fffe00000afe80000000000000000000fffe00000b88003f0b40000000fe80\
    000000000000000000fffe00000a";
/// A router solicitation: ICMPv6, but not ours.
const RS_LINUX: &str = "\
    33330000000202000000000b86dd6000000000103afffe800000000000000000\
    00fffe00000bff02000000000000000000000000000285007b18000000000101\
    02000000000b";
/// An MLDv2 report: hop-by-hop header before ICMPv6.
const MLD_REPORT_LINUX: &str = "\
    33330000001602000000000b86dd6000000000380001fe800000000000000000\
    00fffe00000bff0200000000000000000000000000163a000502000001008f00\
    6fd70000000204000000ff0200000000000000000001ff00000b04000000ff02\
    00000000000000000001ff000002";

fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(u8::is_ascii_hexdigit).collect();
    assert_eq!(digits.len() % 2, 0, "odd number of hex digits");
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
        .collect()
}

fn v6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

/// `ours` equals `theirs` followed by zero padding to 60 octets (we pad ARP frames; veth and
/// arping pad differently or not at all).
fn assert_equal_but_padding(ours: &[u8], theirs: &[u8]) {
    assert_eq!(ours.len(), 60);
    assert_eq!(&ours[..theirs.len()], theirs);
    assert!(ours[theirs.len()..].iter().all(|&b| b == 0));
}

fn arp_request(frame: &str) -> ArpRequest {
    match parse(&hex(frame)) {
        Ok(Some(Request::Arp(r))) => r,
        other => panic!("not an ARP request: {other:?}"),
    }
}

fn solicitation(frame: &str) -> NeighborSolicitation {
    match parse(&hex(frame)) {
        Ok(Some(Request::NeighborSolicitation(ns))) => ns,
        other => panic!("not a neighbor solicitation: {other:?}"),
    }
}

#[test]
fn arp_request_and_linux_reply() {
    let request = arp_request(ARP_REQUEST);
    assert_eq!(
        request,
        ArpRequest {
            eth_source: MAC_A,
            sender_mac: MAC_A,
            sender_ip: Ipv4Addr::new(192, 0, 2, 1),
            target_ip: Ipv4Addr::new(192, 0, 2, 2),
        }
    );
    assert!(!request.is_gratuitous() && !request.is_probe());
    assert_eq!(parse(&hex(ARP_REPLY_LINUX)), Ok(None));
    // Answering for 192.0.2.2 from B's MAC, we send what B's kernel sent.
    assert_equal_but_padding(&arp_reply(&request, MAC_B), &hex(ARP_REPLY_LINUX));
}

#[test]
fn gratuitous_arp() {
    let ip = Ipv4Addr::new(192, 0, 2, 1);
    let g = arp_request(GRATUITOUS_REQUEST_ARPING);
    assert!(g.is_gratuitous());
    assert_eq!((g.sender_mac, g.target_ip), (MAC_A, ip));
    assert_eq!(parse(&hex(GRATUITOUS_REPLY_ARPING)), Ok(None));

    // Our request is an RFC 5227 announcement (target hardware address zero), which is what
    // arping sends for its own address.
    let a = arp_request(ARP_ANNOUNCEMENT_ARPING);
    assert!(a.is_gratuitous());
    assert_equal_but_padding(
        &gratuitous_arp_request(MAC_A, ip),
        &hex(ARP_ANNOUNCEMENT_ARPING)[..58],
    );
    // Our reply differs from arping's only in the target hardware address: ours is our own
    // (RFC 2002 §4.6), arping's broadcast. Receivers do not read it.
    let mut expected = hex(GRATUITOUS_REPLY_ARPING);
    expected[32..38].copy_from_slice(&MAC_A.0);
    assert_equal_but_padding(&gratuitous_arp_reply(MAC_A, ip), &expected);
}

#[test]
fn ndisc6_solicitation_and_linux_advertisement() {
    let ns = solicitation(NS_NDISC6);
    assert_eq!(
        ns,
        NeighborSolicitation {
            eth_source: MAC_A,
            source: v6("fe80::ff:fe00:a"),
            destination: v6("ff02::1:ff00:2"),
            target: v6("2001:db8::2"),
            source_link_addr: Some(MAC_A),
        }
    );
    assert_eq!(ns.destination, solicited_node_multicast(ns.target));
    assert_eq!(parse(&hex(NA_LINUX)), Ok(None));
    // Linux sends its NA from the target address; given the same, ours is byte for byte.
    assert_eq!(
        neighbor_advertisement(&ns, MAC_B, v6("2001:db8::2")),
        hex(NA_LINUX)
    );
}

#[test]
fn dad_probe_and_linux_defence() {
    let ns = solicitation(DAD_NS_LINUX);
    assert_eq!(
        ns,
        NeighborSolicitation {
            eth_source: MAC_A,
            source: Ipv6Addr::UNSPECIFIED,
            destination: v6("ff02::1:ff00:2"),
            target: v6("2001:db8::2"),
            source_link_addr: None,
        }
    );
    assert!(ns.is_dad());
    assert_eq!(
        neighbor_advertisement(&ns, MAC_B, v6("2001:db8::2")),
        hex(NA_LINUX_DAD_DEFENCE)
    );
    assert_eq!(solicitation(DAD_NS_LINUX_5).target, v6("2001:db8::5"));
}

#[test]
fn unsolicited_advertisement_as_linux_sends_it() {
    let target = v6("2001:db8::5");
    assert_eq!(
        unsolicited_neighbor_advertisement(MAC_A, target, target),
        hex(UNSOLICITED_NA_LINUX)
    );
    assert_eq!(parse(&hex(UNSOLICITED_NA_LINUX)), Ok(None));
}

#[test]
fn unicast_probe() {
    let ns = solicitation(NS_LINUX_UNICAST);
    assert_eq!(ns.source, v6("fe80::ff:fe00:b"));
    assert_eq!(ns.destination, v6("fe80::ff:fe00:a"));
    assert_eq!(ns.source_link_addr, Some(MAC_B));
    assert_eq!(parse(&hex(NA_LINUX_UNICAST)), Ok(None));
    // We always add the target link-layer address option and the Override flag, where Linux
    // leaves both out for a unicast probe; the rest is the same.
    let ours = neighbor_advertisement(&ns, MAC_A, v6("fe80::ff:fe00:a"));
    let theirs = hex(NA_LINUX_UNICAST);
    assert_eq!(ours.len(), theirs.len() + 8);
    assert_eq!(ours[..18], theirs[..18]);
    assert_eq!(ours[20..54], theirs[20..54]);
    assert_eq!(ours[54], 136);
    assert_eq!(ours[58], 0x60);
    assert_eq!(ours[62..78], theirs[62..78]);
}

#[test]
fn solicitation_without_source_link_address_is_answered_to_the_frame_source() {
    // The unicast probe with its SLLAO taken off (and the lengths and checksum fixed).
    let mut frame = hex(NS_LINUX_UNICAST);
    frame.truncate(frame.len() - 8);
    frame[18..20].copy_from_slice(&24u16.to_be_bytes());
    frame[56..58].copy_from_slice(&[0, 0]);
    let source = v6("fe80::ff:fe00:b");
    let destination = v6("fe80::ff:fe00:a");
    let checksum = icmpv6_checksum(&source, &destination, &frame[54..]);
    frame[56..58].copy_from_slice(&checksum.to_be_bytes());
    let Ok(Some(Request::NeighborSolicitation(ns))) = parse(&frame) else {
        panic!("not parsed");
    };
    assert_eq!(ns.source_link_addr, None);
    assert_eq!(ns.reply_mac(), MAC_B);
    let na = neighbor_advertisement(&ns, MAC_A, destination);
    assert_eq!(na[..6], MAC_B.0);
    assert_eq!(na[38..54], source.octets());
}

#[test]
fn other_icmpv6_is_not_a_request() {
    assert_eq!(parse(&hex(RS_LINUX)), Ok(None));
    assert_eq!(parse(&hex(MLD_REPORT_LINUX)), Ok(None));
}

/// Recomputes the ICMPv6 checksum of an untagged IPv6 frame after an edit.
fn with_checksum(mut frame: Vec<u8>) -> Vec<u8> {
    let source = Ipv6Addr::from(<[u8; 16]>::try_from(&frame[22..38]).unwrap());
    let destination = Ipv6Addr::from(<[u8; 16]>::try_from(&frame[38..54]).unwrap());
    let len = usize::from(u16::from_be_bytes([frame[18], frame[19]]));
    let checksum = icmpv6_checksum(&source, &destination, &frame[54..54 + len]);
    frame[56..58].copy_from_slice(&checksum.to_be_bytes());
    frame
}

#[test]
fn damaged_captures_fail_by_kind() {
    let ns = hex(NS_NDISC6);
    assert_eq!(with_checksum(ns.clone()), ns);
    let edit = |i: usize, v: u8| {
        let mut f = ns.clone();
        f[i] = v;
        f
    };
    assert_eq!(
        parse(&edit(21, 64)),
        Err(ParseError::HopLimit { hop_limit: 64 })
    );
    assert_eq!(parse(&edit(55, 1)), Err(ParseError::IcmpCode { code: 1 }));
    assert_eq!(
        parse(&edit(57, 0)),
        Err(ParseError::Checksum {
            found: 0x4c00,
            expected: 0x4c4d
        })
    );
    assert_eq!(
        parse(&edit(14, 0x40)),
        Err(ParseError::Ipv6Version { version: 4 })
    );
    assert!(matches!(
        parse(&ns[..ns.len() - 1]),
        Err(ParseError::TruncatedIpv6 { .. })
    ));
    // Past the checksum, edits need it recomputed to reach the check they aim at.
    let parse_fixed = |i: usize, v: u8| parse(&with_checksum(edit(i, v)));
    assert_eq!(
        parse_fixed(79, 0),
        Err(ParseError::OptionZeroLength { option_type: 1 })
    );
    assert_eq!(
        parse_fixed(79, 2),
        Err(ParseError::OptionTruncated { option_type: 1 })
    );
    assert_eq!(parse_fixed(62, 0xff), Err(ParseError::TargetMulticast));
    assert_eq!(parse_fixed(22, 0xff), Err(ParseError::SourceMulticast));

    // A DAD probe sent to all nodes instead of the solicited-node group.
    let mut dad = hex(DAD_NS_LINUX);
    dad[0..6].copy_from_slice(&[0x33, 0x33, 0, 0, 0, 1]);
    dad[38..54].copy_from_slice(&v6("ff02::1").octets());
    assert_eq!(
        parse(&with_checksum(dad)),
        Err(ParseError::UnspecifiedSourceNotSolicitedNode)
    );
    // A DAD probe with a source link-layer address option (its nonce option retyped).
    let mut dad = hex(DAD_NS_LINUX);
    dad[78] = 1;
    assert_eq!(
        parse(&with_checksum(dad)),
        Err(ParseError::UnspecifiedSourceWithLinkAddress)
    );
}
