//! Any frame, and any bytes after an ARP Ethernet header: parsing returns, never panics; every
//! request it accepts gets a well-formed reply that says what was asked.
#![no_main]

use ferrolb_layer2::packet::{
    ArpRequest, MacAddr, Request, arp_reply, gratuitous_arp_reply, gratuitous_arp_request, parse,
};
use libfuzzer_sys::fuzz_target;

const OURS: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x0b]);

fuzz_target!(|data: &[u8]| {
    let _ = parse(data);
    // Most of the input space is other ethertypes: also try the bytes as an ARP packet.
    let mut frame = vec![
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0, 0, 0, 0, 0x0a, 0x08, 0x06,
    ];
    frame.extend_from_slice(data);
    let Ok(Some(request)) = parse(&frame) else {
        return;
    };
    let Request::Arp(r) = request else {
        panic!("an ARP frame parsed as {request:?}");
    };
    assert!(r.sender_mac.is_unicast());

    let reply = arp_reply(&r, OURS);
    assert_eq!(reply.len(), 60);
    assert_eq!(parse(&reply), Ok(None), "our reply parses as a request");
    // The reply is the request turned around: as a request it asks back.
    let mut turned = reply.clone();
    turned[21] = 1;
    assert_eq!(
        parse(&turned),
        Ok(Some(Request::Arp(ArpRequest {
            eth_source: OURS,
            sender_mac: OURS,
            sender_ip: r.target_ip,
            target_ip: r.sender_ip,
        })))
    );
    assert_eq!(reply[..6], r.sender_mac.0);
    assert_eq!(reply[32..38], r.sender_mac.0);

    let announcement = ArpRequest {
        eth_source: OURS,
        sender_mac: OURS,
        sender_ip: r.target_ip,
        target_ip: r.target_ip,
    };
    assert_eq!(
        parse(&gratuitous_arp_request(OURS, r.target_ip)),
        Ok(Some(Request::Arp(announcement)))
    );
    assert_eq!(parse(&gratuitous_arp_reply(OURS, r.target_ip)), Ok(None));
});
