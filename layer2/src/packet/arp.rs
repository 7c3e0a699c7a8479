//! ARP (RFC 826) for IPv4 over Ethernet: requests in, replies and gratuitous announcements out.

use std::net::Ipv4Addr;

use super::{
    ETHERNET_MIN_FRAME_LEN, ETHERTYPE_ARP, MacAddr, ParseError, array_at, ethernet_header,
};

/// Length of an Ethernet/IPv4 ARP packet.
pub const ARP_LEN: usize = 28;
/// `ar$op` of a request.
pub const OP_REQUEST: u16 = 1;
/// `ar$op` of a reply.
pub const OP_REPLY: u16 = 2;

const HARDWARE_ETHERNET: u16 = 1;
/// IEEE 802 networks; Linux accepts it on Ethernet devices as well, so we do.
const HARDWARE_IEEE802: u16 = 6;
const PROTOCOL_IPV4: u16 = 0x0800;

/// A parsed ARP request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ArpRequest {
    /// Source address of the Ethernet frame.
    pub eth_source: MacAddr,
    /// Sender hardware address (`ar$sha`): where the reply goes.
    pub sender_mac: MacAddr,
    /// Sender protocol address (`ar$spa`); 0.0.0.0 for an RFC 5227 probe.
    pub sender_ip: Ipv4Addr,
    /// Target protocol address (`ar$tpa`): the address asked about.
    pub target_ip: Ipv4Addr,
}

impl ArpRequest {
    /// A gratuitous request (sender and target protocol address equal): an announcement by
    /// the sender, which needs no reply.
    pub fn is_gratuitous(&self) -> bool {
        self.sender_ip == self.target_ip
    }

    /// An RFC 5227 probe (sender protocol address 0.0.0.0): a host checking that the target
    /// address is free before using it.
    pub fn is_probe(&self) -> bool {
        self.sender_ip.is_unspecified()
    }
}

/// Parses the ARP packet after the Ethernet header. `Ok(None)` for anything but a request.
pub(super) fn parse(eth_source: MacAddr, arp: &[u8]) -> Result<Option<ArpRequest>, ParseError> {
    // Frames are padded to 60 octets, so more than 28 is normal; less is not.
    if arp.len() < ARP_LEN {
        return Err(ParseError::TruncatedArp { len: arp.len() });
    }
    let hardware_type = u16::from_be_bytes(array_at(arp, 0));
    let protocol_type = u16::from_be_bytes(array_at(arp, 2));
    let hardware_len = arp[4];
    let protocol_len = arp[5];
    if !matches!(hardware_type, HARDWARE_ETHERNET | HARDWARE_IEEE802)
        || protocol_type != PROTOCOL_IPV4
        || hardware_len != 6
        || protocol_len != 4
    {
        return Err(ParseError::ArpFormat {
            hardware_type,
            protocol_type,
            hardware_len,
            protocol_len,
        });
    }
    if u16::from_be_bytes(array_at(arp, 6)) != OP_REQUEST {
        return Ok(None);
    }
    let sender_mac = MacAddr(array_at(arp, 8));
    if !sender_mac.is_unicast() {
        return Err(ParseError::ArpSenderNotUnicast { sender_mac });
    }
    Ok(Some(ArpRequest {
        eth_source,
        sender_mac,
        sender_ip: Ipv4Addr::from(array_at::<4>(arp, 14)),
        target_ip: Ipv4Addr::from(array_at::<4>(arp, 24)),
    }))
}

/// The reply to `request` from `our_mac`: "`request.target_ip` is at `our_mac`", sent to the
/// requester's hardware address. The frame is padded to 60 octets.
pub fn arp_reply(request: &ArpRequest, our_mac: MacAddr) -> Vec<u8> {
    // Like Linux, answer to ar$sha rather than the frame's source: they differ only behind
    // proxies and bridges that rewrite one but not the other, and ar$sha is what ARP means.
    build(
        request.sender_mac,
        OP_REPLY,
        our_mac,
        request.target_ip,
        request.sender_mac,
        request.sender_ip,
    )
}

/// A gratuitous ARP request announcing `ip` at `our_mac`, broadcast; target hardware address
/// all zeros (an RFC 5227 §2.3 ARP Announcement). The frame is padded to 60 octets.
pub fn gratuitous_arp_request(our_mac: MacAddr, ip: Ipv4Addr) -> Vec<u8> {
    build(
        MacAddr::BROADCAST,
        OP_REQUEST,
        our_mac,
        ip,
        MacAddr::ZERO,
        ip,
    )
}

/// A gratuitous ARP reply announcing `ip` at `our_mac`, broadcast; target hardware address
/// `our_mac` (RFC 2002 §4.6), for hosts that update their caches only from replies. The frame
/// is padded to 60 octets.
pub fn gratuitous_arp_reply(our_mac: MacAddr, ip: Ipv4Addr) -> Vec<u8> {
    build(MacAddr::BROADCAST, OP_REPLY, our_mac, ip, our_mac, ip)
}

fn build(
    eth_destination: MacAddr,
    op: u16,
    sender_mac: MacAddr,
    sender_ip: Ipv4Addr,
    target_mac: MacAddr,
    target_ip: Ipv4Addr,
) -> Vec<u8> {
    let mut frame = ethernet_header(eth_destination, sender_mac, ETHERTYPE_ARP, ARP_LEN);
    frame.extend_from_slice(&HARDWARE_ETHERNET.to_be_bytes());
    frame.extend_from_slice(&PROTOCOL_IPV4.to_be_bytes());
    frame.extend_from_slice(&[6, 4]);
    frame.extend_from_slice(&op.to_be_bytes());
    frame.extend_from_slice(&sender_mac.0);
    frame.extend_from_slice(&sender_ip.octets());
    frame.extend_from_slice(&target_mac.0);
    frame.extend_from_slice(&target_ip.octets());
    // Pad here rather than trusting every driver to: some virtual switches drop runts.
    frame.resize(ETHERNET_MIN_FRAME_LEN, 0);
    frame
}

#[cfg(test)]
mod tests {
    use super::super::{Request, parse as parse_frame};
    use super::*;

    const OURS: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x0b]);
    const THEIRS: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x0a]);

    fn request() -> ArpRequest {
        ArpRequest {
            eth_source: THEIRS,
            sender_mac: THEIRS,
            sender_ip: Ipv4Addr::new(192, 0, 2, 1),
            target_ip: Ipv4Addr::new(192, 0, 2, 2),
        }
    }

    #[test]
    fn request_round_trip() {
        let frame = build(
            MacAddr::BROADCAST,
            OP_REQUEST,
            THEIRS,
            Ipv4Addr::new(192, 0, 2, 1),
            MacAddr::ZERO,
            Ipv4Addr::new(192, 0, 2, 2),
        );
        assert_eq!(parse_frame(&frame), Ok(Some(Request::Arp(request()))));
    }

    #[test]
    fn reply_is_not_a_request() {
        let reply = arp_reply(&request(), OURS);
        assert_eq!(reply.len(), 60);
        assert_eq!(parse_frame(&reply), Ok(None));
        assert_eq!(
            parse_frame(&gratuitous_arp_reply(OURS, request().target_ip)),
            Ok(None)
        );
    }

    #[test]
    fn gratuitous_request_parses_as_gratuitous() {
        let ip = Ipv4Addr::new(192, 0, 2, 9);
        let Ok(Some(Request::Arp(r))) = parse_frame(&gratuitous_arp_request(OURS, ip)) else {
            panic!("not a request");
        };
        assert!(r.is_gratuitous());
        assert!(!r.is_probe());
        assert_eq!(r.target_ip, ip);
    }

    #[test]
    fn malformed() {
        let good = gratuitous_arp_request(OURS, Ipv4Addr::new(192, 0, 2, 9));
        for len in 14..14 + ARP_LEN {
            assert_eq!(
                parse_frame(&good[..len]),
                Err(ParseError::TruncatedArp { len: len - 14 })
            );
        }
        let mut bad = good.clone();
        bad[14 + 4] = 8;
        assert!(matches!(
            parse_frame(&bad),
            Err(ParseError::ArpFormat {
                hardware_len: 8,
                ..
            })
        ));
        let mut bad = good.clone();
        bad[14 + 2] = 0x86;
        assert!(matches!(
            parse_frame(&bad),
            Err(ParseError::ArpFormat { .. })
        ));
        let mut ieee802 = good.clone();
        ieee802[14 + 1] = 6;
        assert!(matches!(parse_frame(&ieee802), Ok(Some(_))));
        let mut bad = good;
        bad[14 + 8..14 + 14].copy_from_slice(&[0xff; 6]);
        assert_eq!(
            parse_frame(&bad),
            Err(ParseError::ArpSenderNotUnicast {
                sender_mac: MacAddr::BROADCAST
            })
        );
    }
}
