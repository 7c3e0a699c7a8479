//! Any frame, and any bytes after an IPv6 Ethernet header (with the ICMPv6 checksum made right,
//! so the fuzzer gets past it): parsing returns, never panics; every solicitation it accepts
//! meets RFC 4861 §7.1.1 and gets a well-formed advertisement, sent where it should go.
#![no_main]

use std::net::Ipv6Addr;

use ferrolb_layer2::packet::ndp::{ALL_NODES, icmpv6_checksum, ipv6_multicast_mac};
use ferrolb_layer2::packet::{
    MacAddr, Request, is_solicited_node_multicast, neighbor_advertisement, parse,
};
use libfuzzer_sys::fuzz_target;

const OURS: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x0b]);
const SOURCE: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0xb);

fn addr(frame: &[u8], at: usize) -> Ipv6Addr {
    let mut octets = [0u8; 16];
    octets.copy_from_slice(&frame[at..at + 16]);
    Ipv6Addr::from(octets)
}

/// Writes the right ICMPv6 checksum into an IPv6 frame, when it is long enough to hold one.
fn fix_checksum(frame: &mut [u8]) {
    if frame.len() < 58 {
        return;
    }
    let len = usize::from(u16::from_be_bytes([frame[18], frame[19]]));
    let Some(icmp) = frame.get(54..54 + len) else {
        return;
    };
    if icmp.len() < 4 {
        return;
    }
    let checksum = icmpv6_checksum(&addr(frame, 22), &addr(frame, 38), icmp);
    frame[56..58].copy_from_slice(&checksum.to_be_bytes());
}

fuzz_target!(|data: &[u8]| {
    let _ = parse(data);
    let mut frame = vec![
        0x33, 0x33, 0xff, 0, 0, 1, 0x02, 0, 0, 0, 0, 0x0a, 0x86, 0xdd,
    ];
    frame.extend_from_slice(data);
    let _ = parse(&frame);
    fix_checksum(&mut frame);
    let Ok(Some(request)) = parse(&frame) else {
        return;
    };
    let Request::NeighborSolicitation(ns) = request else {
        panic!("an IPv6 frame parsed as {request:?}");
    };
    // What §7.1.1 promises about an accepted solicitation.
    assert!(!ns.target.is_multicast());
    assert!(!ns.source.is_multicast());
    if ns.is_dad() {
        assert!(ns.source_link_addr.is_none());
        assert!(is_solicited_node_multicast(ns.destination));
    }

    let na = neighbor_advertisement(&ns, OURS, SOURCE);
    assert_eq!(na.len(), 86);
    assert_eq!(
        parse(&na),
        Ok(None),
        "our advertisement parses as a request"
    );
    let (eth_destination, destination, flags) = if ns.is_dad() {
        (ipv6_multicast_mac(ALL_NODES), ALL_NODES, 0x20)
    } else {
        (ns.reply_mac(), ns.source, 0x60)
    };
    assert_eq!(na[..6], eth_destination.0);
    assert_eq!(addr(&na, 22), SOURCE);
    assert_eq!(addr(&na, 38), destination);
    assert_eq!(na[21], 255);
    assert_eq!(na[58], flags);
    assert_eq!(addr(&na, 62), ns.target);
    assert_eq!(na[78..80], [2, 1]);
    assert_eq!(na[80..86], OURS.0);
    let checksum = u16::from_be_bytes([na[56], na[57]]);
    assert_eq!(icmpv6_checksum(&SOURCE, &destination, &na[54..]), checksum);
    // Retyped as a solicitation (checksum fixed), it asks for the same target.
    let mut turned = na.clone();
    turned[54] = 135;
    fix_checksum(&mut turned);
    match parse(&turned) {
        Ok(Some(Request::NeighborSolicitation(back))) => {
            assert_eq!(back.target, ns.target);
            assert_eq!(back.source, SOURCE);
            assert_eq!(back.source_link_addr, None);
        }
        other => panic!("our advertisement retyped: {other:?}"),
    }
});
