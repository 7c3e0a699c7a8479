//! Any bytes as a received ICMPv6 message, as is and with the checksum made right (so the
//! fuzzer gets past it), typed as a Router Solicitation or Advertisement or not: parsing
//! returns, never panics; what it accepts passed the RFC 4861 §6.1 checks, and building it
//! again gives a message that parses to the same thing.
#![no_main]

use std::net::Ipv6Addr;

use ferrolb_layer2::packet::ndp::{ALL_NODES, icmpv6_checksum};
use ferrolb_layer2::packet::router_discovery::{ALL_ROUTERS, is_link_local};
use ferrolb_layer2::packet::{
    Envelope, RouterDiscovery, parse_router_advertisement, parse_router_discovery,
    parse_router_solicitation, router_advertisement, router_solicitation,
};
use libfuzzer_sys::fuzz_target;

const PEER: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0xa);

fuzz_target!(|data: &[u8]| {
    // The first octet picks the envelope; the rest is the message.
    let Some((&selector, message)) = data.split_first() else {
        return;
    };
    let source = match selector & 0x3 {
        0 => PEER,
        1 => Ipv6Addr::UNSPECIFIED,
        2 => Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1),
        _ => ALL_NODES,
    };
    let destination = if selector & 0x4 == 0 {
        ALL_NODES
    } else {
        ALL_ROUTERS
    };
    let hop_limit = match selector >> 6 {
        0 => None,
        1 => Some(64),
        _ => Some(255),
    };
    let envelope = Envelope {
        source,
        destination,
        hop_limit,
    };

    let _ = parse_router_discovery(message, &envelope);
    let mut message = message.to_vec();
    if message.len() >= 4 {
        message[2..4].copy_from_slice(&[0, 0]);
        let checksum = icmpv6_checksum(&source, &destination, &message);
        message[2..4].copy_from_slice(&checksum.to_be_bytes());
    }
    match parse_router_discovery(&message, &envelope) {
        Ok(Some(RouterDiscovery::Advertisement(ra))) => {
            assert_eq!(hop_limit.unwrap_or(255), 255);
            assert!(is_link_local(source));
            assert_eq!(message.get(1), Some(&0));
            assert!(message.len() >= 16);
            let again = router_advertisement(&ra, source, destination);
            assert_eq!(parse_router_advertisement(&again, &envelope), Ok(ra));
        }
        Ok(Some(RouterDiscovery::Solicitation(rs))) => {
            assert_eq!(hop_limit.unwrap_or(255), 255);
            assert!(!source.is_multicast());
            assert!(!(source.is_unspecified() && rs.source_link_addr.is_some()));
            assert!(message.len() >= 8);
            let again = router_solicitation(&rs, source, destination);
            assert_eq!(parse_router_solicitation(&again, &envelope), Ok(rs));
        }
        Ok(None) => assert!(!matches!(message.first(), Some(133 | 134))),
        Err(e) => {
            let _ = e.kind();
        }
    }
});
