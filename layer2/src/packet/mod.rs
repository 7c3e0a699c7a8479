//! ARP and NDP frames: parsing requests, building replies and gratuitous announcements.
//!
//! Pure: no sockets, no clocks. [`parse`] turns a received Ethernet frame into the one
//! [`Request`] a layer-2 responder acts on (an ARP request or an IPv6 Neighbor Solicitation) or
//! `None` for any other frame; the builders in [`arp`] and [`ndp`] return complete Ethernet
//! frames ready to send (the speaker's AF_PACKET socket, `l2/socket.rs`). [`filter`] is the
//! classic BPF program that lets only requests reach the socket in the first place.
//! [`router_discovery`] is apart: Router Solicitations and Advertisements as bare ICMPv6
//! messages, for the raw ICMPv6 socket that finds BGP unnumbered peers (decision record 0020).
//!
//! Only untagged Ethernet II frames are handled: the speaker listens on the interface that
//! carries the Service network, and a VLAN is its own interface on Linux (the socket filter
//! drops frames whose tag the NIC stripped into metadata, see [`filter`]). A tagged frame
//! (ethertype 0x8100 or 0x88a8 in the frame) is `Ok(None)`.
//!
//! The codec is our own rather than `pnet_packet`'s (decision record 0011): the frames are
//! small and fixed, and pnet's NDP option parser overflows on option lengths of 32 and more.

pub mod arp;
pub mod filter;
pub mod ndp;
pub mod router_discovery;

use std::fmt;
use std::net::IpAddr;

pub use arp::{ArpRequest, arp_reply, gratuitous_arp_reply, gratuitous_arp_request};
pub use ndp::{
    NeighborSolicitation, is_solicited_node_multicast, neighbor_advertisement, solicited_node_mac,
    solicited_node_multicast, unsolicited_neighbor_advertisement,
};
pub use router_discovery::{
    Envelope, RouterAdvertisement, RouterDiscovery, RouterDiscoveryError, RouterSolicitation,
    parse_router_advertisement, parse_router_discovery, parse_router_solicitation,
    router_advertisement, router_solicitation,
};

/// Ethertype of ARP.
pub const ETHERTYPE_ARP: u16 = 0x0806;
/// Ethertype of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// Length of an untagged Ethernet header (destination, source, ethertype).
pub const ETHERNET_HEADER_LEN: usize = 14;
/// The shortest Ethernet frame without its FCS; shorter frames are padded with zeros.
pub const ETHERNET_MIN_FRAME_LEN: usize = 60;

/// A 48-bit IEEE 802 MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// ff:ff:ff:ff:ff:ff.
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);
    /// 00:00:00:00:00:00.
    pub const ZERO: MacAddr = MacAddr([0; 6]);

    /// The six octets.
    pub const fn octets(self) -> [u8; 6] {
        self.0
    }

    /// Whether the group bit is set (multicast, including broadcast).
    pub const fn is_multicast(self) -> bool {
        self.0[0] & 0x01 != 0
    }

    /// Whether this can be the address of one station: not multicast, not all zeros.
    pub fn is_unicast(self) -> bool {
        !self.is_multicast() && self != Self::ZERO
    }
}

impl From<[u8; 6]> for MacAddr {
    fn from(octets: [u8; 6]) -> Self {
        MacAddr(octets)
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

/// A request a layer-2 responder may have to answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Request {
    /// An ARP request (RFC 826), including probes (sender IP 0.0.0.0) and gratuitous requests.
    Arp(ArpRequest),
    /// An IPv6 Neighbor Solicitation (RFC 4861 §4.3), including DAD probes (source `::`).
    NeighborSolicitation(NeighborSolicitation),
}

impl Request {
    /// The address asked about: ARP's target protocol address or the NS target address.
    pub fn target(&self) -> IpAddr {
        match self {
            Request::Arp(r) => IpAddr::V4(r.target_ip),
            Request::NeighborSolicitation(ns) => IpAddr::V6(ns.target),
        }
    }

    /// The Ethernet source address of the frame.
    pub fn eth_source(&self) -> MacAddr {
        match self {
            Request::Arp(r) => r.eth_source,
            Request::NeighborSolicitation(ns) => ns.eth_source,
        }
    }
}

/// Why a frame that looked like a request was dropped. One variant per kind so the caller can
/// count them ([`ParseError::kind`] is a stable label for metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum ParseError {
    /// Shorter than an Ethernet header.
    #[error("frame of {len} octets is shorter than an Ethernet header")]
    TruncatedEthernet {
        /// Frame length.
        len: usize,
    },
    /// An ARP packet shorter than its 28 octets.
    #[error("ARP packet of {len} octets, expected 28")]
    TruncatedArp {
        /// Octets after the Ethernet header.
        len: usize,
    },
    /// An ARP packet that is not Ethernet/IPv4 with 6- and 4-octet addresses.
    #[error(
        "ARP hardware type {hardware_type} protocol {protocol_type:#06x} with address lengths \
         {hardware_len}/{protocol_len}: not Ethernet/IPv4"
    )]
    ArpFormat {
        /// `ar$hrd` (1 = Ethernet; 6 = IEEE 802, which Linux also accepts on Ethernet).
        hardware_type: u16,
        /// `ar$pro`.
        protocol_type: u16,
        /// `ar$hln`.
        hardware_len: u8,
        /// `ar$pln`.
        protocol_len: u8,
    },
    /// An ARP request whose sender hardware address is multicast or zero: nobody to reply to.
    #[error("ARP request from non-unicast sender hardware address {sender_mac}")]
    ArpSenderNotUnicast {
        /// `ar$sha`.
        sender_mac: MacAddr,
    },
    /// An IPv6 packet shorter than its header, or whose payload length runs past the frame.
    #[error(
        "IPv6 packet truncated: {len} octets after the Ethernet header, payload length {payload_len}"
    )]
    TruncatedIpv6 {
        /// Octets after the Ethernet header.
        len: usize,
        /// The payload length field (0 when the header itself is cut).
        payload_len: u16,
    },
    /// Ethertype IPv6 but the version field is not 6.
    #[error("IPv6 header with version {version}")]
    Ipv6Version {
        /// The version field.
        version: u8,
    },
    /// ICMPv6 message too short to hold its type (an empty payload).
    #[error("empty ICMPv6 message")]
    TruncatedIcmpv6,
    /// NS with an IP hop limit other than 255: it crossed a router (RFC 4861 §7.1.1).
    #[error("neighbor solicitation with hop limit {hop_limit}, expected 255")]
    HopLimit {
        /// The hop limit as received.
        hop_limit: u8,
    },
    /// NS with ICMPv6 code other than 0.
    #[error("neighbor solicitation with ICMPv6 code {code}")]
    IcmpCode {
        /// The code as received.
        code: u8,
    },
    /// NS shorter than 24 octets of ICMPv6.
    #[error("neighbor solicitation of {len} octets, expected at least 24")]
    NsTooShort {
        /// ICMPv6 length (from the IPv6 payload length).
        len: usize,
    },
    /// The ICMPv6 checksum does not match.
    #[error("ICMPv6 checksum {found:#06x}, expected {expected:#06x}")]
    Checksum {
        /// The checksum field as received.
        found: u16,
        /// The checksum of the message as received.
        expected: u16,
    },
    /// NS whose target address is multicast.
    #[error("neighbor solicitation for multicast target")]
    TargetMulticast,
    /// NS whose IPv6 source address is multicast (never valid as a source, RFC 4291 §2.7).
    #[error("neighbor solicitation from a multicast source")]
    SourceMulticast,
    /// An NDP option with length 0.
    #[error("NDP option of type {option_type} with length 0")]
    OptionZeroLength {
        /// The option type.
        option_type: u8,
    },
    /// An NDP option that runs past the end of the message.
    #[error("NDP option of type {option_type} runs past the message")]
    OptionTruncated {
        /// The option type.
        option_type: u8,
    },
    /// A source link-layer address option that does not hold exactly one Ethernet address
    /// (length other than 1 unit of 8 octets). Linux drops such solicitations too.
    #[error("source link-layer address option of length {len} (units of 8 octets), expected 1")]
    LinkLayerAddressLength {
        /// The option length field.
        len: u8,
    },
    /// A DAD probe (source `::`) carrying a source link-layer address option (RFC 4861 §7.1.1).
    #[error("neighbor solicitation from :: with a source link-layer address option")]
    UnspecifiedSourceWithLinkAddress,
    /// A DAD probe (source `::`) not sent to a solicited-node multicast address (RFC 4861 §7.1.1).
    #[error("neighbor solicitation from :: to a destination that is not solicited-node multicast")]
    UnspecifiedSourceNotSolicitedNode,
}

impl ParseError {
    /// A short stable label for this kind of error, e.g. for a metric's label value.
    pub fn kind(&self) -> &'static str {
        match self {
            ParseError::TruncatedEthernet { .. } => "truncated_ethernet",
            ParseError::TruncatedArp { .. } => "truncated_arp",
            ParseError::ArpFormat { .. } => "arp_format",
            ParseError::ArpSenderNotUnicast { .. } => "arp_sender_not_unicast",
            ParseError::TruncatedIpv6 { .. } => "truncated_ipv6",
            ParseError::Ipv6Version { .. } => "ipv6_version",
            ParseError::TruncatedIcmpv6 => "truncated_icmpv6",
            ParseError::HopLimit { .. } => "hop_limit",
            ParseError::IcmpCode { .. } => "icmp_code",
            ParseError::NsTooShort { .. } => "ns_too_short",
            ParseError::Checksum { .. } => "checksum",
            ParseError::TargetMulticast => "target_multicast",
            ParseError::SourceMulticast => "source_multicast",
            ParseError::OptionZeroLength { .. } => "option_zero_length",
            ParseError::OptionTruncated { .. } => "option_truncated",
            ParseError::LinkLayerAddressLength { .. } => "link_layer_address_length",
            ParseError::UnspecifiedSourceWithLinkAddress => "unspecified_source_with_link_address",
            ParseError::UnspecifiedSourceNotSolicitedNode => {
                "unspecified_source_not_solicited_node"
            }
        }
    }
}

/// Parses an untagged Ethernet II frame (without FCS; trailing padding is ignored).
///
/// Returns `Ok(Some(_))` for a valid ARP request or Neighbor Solicitation, `Ok(None)` for any
/// other frame (ARP replies, other ICMPv6 messages, IPv6 with extension headers, other
/// ethertypes, tagged frames), and an error for a frame that is an ARP packet or an NS but is
/// malformed or fails a validity check of RFC 826 / RFC 4861 §7.1.1. Never panics.
pub fn parse(frame: &[u8]) -> Result<Option<Request>, ParseError> {
    let Some((header, payload)) = frame.split_at_checked(ETHERNET_HEADER_LEN) else {
        return Err(ParseError::TruncatedEthernet { len: frame.len() });
    };
    let eth_source = MacAddr(array_at(header, 6));
    match u16::from_be_bytes(array_at(header, 12)) {
        ETHERTYPE_ARP => arp::parse(eth_source, payload).map(|r| r.map(Request::Arp)),
        ETHERTYPE_IPV6 => {
            ndp::parse(eth_source, payload).map(|r| r.map(Request::NeighborSolicitation))
        }
        _ => Ok(None),
    }
}

/// Copies `N` octets at `offset`, zeros where `bytes` is too short. Callers check lengths
/// first; the zero fill only keeps this total so no index can panic.
pub(crate) fn array_at<const N: usize>(bytes: &[u8], offset: usize) -> [u8; N] {
    let mut out = [0u8; N];
    if let Some(src) = bytes.get(offset..).and_then(|rest| rest.get(..N)) {
        out.copy_from_slice(src);
    }
    out
}

/// Starts a frame: Ethernet header with room for `payload_len` more octets.
pub(crate) fn ethernet_header(
    destination: MacAddr,
    source: MacAddr,
    ethertype: u16,
    payload_len: usize,
) -> Vec<u8> {
    let mut frame =
        Vec::with_capacity((ETHERNET_HEADER_LEN + payload_len).max(ETHERNET_MIN_FRAME_LEN));
    frame.extend_from_slice(&destination.0);
    frame.extend_from_slice(&source.0);
    frame.extend_from_slice(&ethertype.to_be_bytes());
    frame
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_display_and_kinds() {
        let mac = MacAddr([0x02, 0, 0, 0, 0, 0x0b]);
        assert_eq!(mac.to_string(), "02:00:00:00:00:0b");
        assert!(mac.is_unicast());
        assert!(!MacAddr::BROADCAST.is_unicast());
        assert!(!MacAddr::ZERO.is_unicast());
        assert!(MacAddr([0x33, 0x33, 0, 0, 0, 1]).is_multicast());
    }

    #[test]
    fn short_and_foreign_frames() {
        for len in 0..ETHERNET_HEADER_LEN {
            assert_eq!(
                parse(&vec![0; len]),
                Err(ParseError::TruncatedEthernet { len })
            );
        }
        let mut ipv4 = vec![0u8; 60];
        ipv4[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        assert_eq!(parse(&ipv4), Ok(None));
        let mut tagged = vec![0u8; 64];
        tagged[12..14].copy_from_slice(&0x8100u16.to_be_bytes());
        tagged[16..18].copy_from_slice(&ETHERTYPE_ARP.to_be_bytes());
        assert_eq!(parse(&tagged), Ok(None));
    }

    #[test]
    fn array_at_is_total() {
        assert_eq!(array_at::<4>(&[1, 2, 3], 0), [0; 4]);
        assert_eq!(array_at::<2>(&[1, 2, 3], 1), [2, 3]);
        assert_eq!(array_at::<2>(&[1, 2, 3], usize::MAX), [0; 2]);
    }
}
