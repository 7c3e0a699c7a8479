//! IPv6 Neighbor Discovery (RFC 4861): Neighbor Solicitations in, Neighbor Advertisements out.

use std::net::Ipv6Addr;

use super::{ETHERTYPE_IPV6, MacAddr, ParseError, array_at, ethernet_header};

/// Length of the fixed IPv6 header.
pub const IPV6_HEADER_LEN: usize = 40;
/// IPv6 next header value of ICMPv6.
pub const NEXT_HEADER_ICMPV6: u8 = 58;
/// ICMPv6 type of a Neighbor Solicitation.
pub const TYPE_NEIGHBOR_SOLICITATION: u8 = 135;
/// ICMPv6 type of a Neighbor Advertisement.
pub const TYPE_NEIGHBOR_ADVERTISEMENT: u8 = 136;
/// The hop limit every ND message is sent with and must arrive with.
pub const ND_HOP_LIMIT: u8 = 255;

/// NDP option type: Source Link-Layer Address.
pub(super) const OPTION_SOURCE_LINK_ADDR: u8 = 1;
/// NDP option type: Target Link-Layer Address.
const OPTION_TARGET_LINK_ADDR: u8 = 2;
/// Type, code, checksum, reserved, target address.
const NS_FIXED_LEN: usize = 24;
/// An NA with one target link-layer address option.
const NA_LEN: usize = 24 + 8;

const FLAG_SOLICITED: u8 = 0x40;
const FLAG_OVERRIDE: u8 = 0x20;

/// ff02::1, all nodes on the link.
pub const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

/// A parsed, valid Neighbor Solicitation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NeighborSolicitation {
    /// Source address of the Ethernet frame.
    pub eth_source: MacAddr,
    /// IPv6 source; `::` for Duplicate Address Detection.
    pub source: Ipv6Addr,
    /// IPv6 destination: the target's solicited-node group, or the target itself (unicast
    /// reachability checks).
    pub destination: Ipv6Addr,
    /// The address asked about.
    pub target: Ipv6Addr,
    /// The Source Link-Layer Address option, if present (never for DAD).
    pub source_link_addr: Option<MacAddr>,
}

impl NeighborSolicitation {
    /// A Duplicate Address Detection probe (source `::`): someone wants to use `target`.
    pub fn is_dad(&self) -> bool {
        self.source.is_unspecified()
    }

    /// Where a unicast answer goes on the link: the Source Link-Layer Address option, else
    /// the frame's source.
    pub fn reply_mac(&self) -> MacAddr {
        self.source_link_addr.unwrap_or(self.eth_source)
    }
}

/// Parses the IPv6 packet after the Ethernet header. `Ok(None)` for anything but an NS
/// directly after the fixed header.
pub(super) fn parse(
    eth_source: MacAddr,
    ip: &[u8],
) -> Result<Option<NeighborSolicitation>, ParseError> {
    if ip.len() < IPV6_HEADER_LEN {
        return Err(ParseError::TruncatedIpv6 {
            len: ip.len(),
            payload_len: if ip.len() >= 6 {
                u16::from_be_bytes(array_at(ip, 4))
            } else {
                0
            },
        });
    }
    let version = ip[0] >> 4;
    if version != 6 {
        return Err(ParseError::Ipv6Version { version });
    }
    let payload_len = u16::from_be_bytes(array_at(ip, 4));
    // Octets past the payload length are Ethernet padding.
    let Some(icmp) = ip.get(IPV6_HEADER_LEN..IPV6_HEADER_LEN + usize::from(payload_len)) else {
        return Err(ParseError::TruncatedIpv6 {
            len: ip.len(),
            payload_len,
        });
    };
    // Extension headers (hop-by-hop on MLD reports, say) mean it is not an NS we answer; RFC
    // 4861 allows them before an NS but no implementation sends one, and the filter drops them.
    if ip[6] != NEXT_HEADER_ICMPV6 {
        return Ok(None);
    }
    let hop_limit = ip[7];
    let source = Ipv6Addr::from(array_at::<16>(ip, 8));
    let destination = Ipv6Addr::from(array_at::<16>(ip, 24));

    let Some(&icmp_type) = icmp.first() else {
        return Err(ParseError::TruncatedIcmpv6);
    };
    if icmp_type != TYPE_NEIGHBOR_SOLICITATION {
        return Ok(None);
    }
    // RFC 4861 §7.1.1, in its order.
    if hop_limit != ND_HOP_LIMIT {
        return Err(ParseError::HopLimit { hop_limit });
    }
    if icmp.len() >= 2 && icmp[1] != 0 {
        return Err(ParseError::IcmpCode { code: icmp[1] });
    }
    if icmp.len() < NS_FIXED_LEN {
        return Err(ParseError::NsTooShort { len: icmp.len() });
    }
    let found = u16::from_be_bytes(array_at(icmp, 2));
    if !checksum_ok(&source, &destination, icmp) {
        return Err(ParseError::Checksum {
            found,
            expected: checksum_with_field_zeroed(&source, &destination, icmp),
        });
    }
    let target = Ipv6Addr::from(array_at::<16>(icmp, 8));
    if target.is_multicast() {
        return Err(ParseError::TargetMulticast);
    }
    if source.is_multicast() {
        return Err(ParseError::SourceMulticast);
    }

    // Other options (a DAD nonce, say) are ignored, as RFC 4861 §4.6 asks.
    let source_link_addr = source_link_addr(&icmp[NS_FIXED_LEN..])?;

    if source.is_unspecified() {
        if source_link_addr.is_some() {
            return Err(ParseError::UnspecifiedSourceWithLinkAddress);
        }
        if !is_solicited_node_multicast(destination) {
            return Err(ParseError::UnspecifiedSourceNotSolicitedNode);
        }
    }
    Ok(Some(NeighborSolicitation {
        eth_source,
        source,
        destination,
        target,
        source_link_addr,
    }))
}

/// The solicited Neighbor Advertisement answering `ns` for its target at `our_mac`, with the
/// Override flag and a Target Link-Layer Address option, hop limit 255, from IPv6 `source`
/// (the interface's link-local address if it has one, else the target).
///
/// A solicitation from a node (`ns.source` set) is answered unicast with the Solicited flag,
/// to [`NeighborSolicitation::reply_mac`]: MetalLB drops solicitations without a source
/// link-layer address option, but RFC 4861 §7.2.4 allows them and the frame's source is as
/// good. A DAD probe (source `::`) is answered to all nodes (ff02::1) without the Solicited
/// flag (§7.2.4), which tells the prober the address is taken.
pub fn neighbor_advertisement(
    ns: &NeighborSolicitation,
    our_mac: MacAddr,
    source: Ipv6Addr,
) -> Vec<u8> {
    if ns.is_dad() {
        build_na(
            our_mac,
            source,
            ALL_NODES,
            ipv6_multicast_mac(ALL_NODES),
            ns.target,
            FLAG_OVERRIDE,
        )
    } else {
        build_na(
            our_mac,
            source,
            ns.source,
            ns.reply_mac(),
            ns.target,
            FLAG_SOLICITED | FLAG_OVERRIDE,
        )
    }
}

/// An unsolicited Neighbor Advertisement (RFC 4861 §7.2.6) announcing `target` at `our_mac`
/// to all nodes (ff02::1): Override set, Solicited clear, with a Target Link-Layer Address
/// option, from IPv6 `source` (as for [`neighbor_advertisement`]).
pub fn unsolicited_neighbor_advertisement(
    our_mac: MacAddr,
    target: Ipv6Addr,
    source: Ipv6Addr,
) -> Vec<u8> {
    build_na(
        our_mac,
        source,
        ALL_NODES,
        ipv6_multicast_mac(ALL_NODES),
        target,
        FLAG_OVERRIDE,
    )
}

/// The solicited-node multicast group of `addr` (RFC 4291 §2.7.1): ff02::1:ffXX:XXXX with the
/// low 24 bits of `addr`. Solicitations for `addr` are sent there.
pub fn solicited_node_multicast(addr: Ipv6Addr) -> Ipv6Addr {
    let o = addr.octets();
    Ipv6Addr::from([
        0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0xff, o[13], o[14], o[15],
    ])
}

/// Whether `addr` is in ff02::1:ff00:0/104.
pub fn is_solicited_node_multicast(addr: Ipv6Addr) -> bool {
    addr.octets()[..13] == [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0xff]
}

/// The Ethernet address frames to `addr`'s solicited-node group are sent to: 33:33:ff:XX:XX:XX.
pub fn solicited_node_mac(addr: Ipv6Addr) -> MacAddr {
    ipv6_multicast_mac(solicited_node_multicast(addr))
}

/// The Ethernet address of IPv6 multicast group `group` (RFC 2464 §7): 33:33 and its low 32 bits.
pub fn ipv6_multicast_mac(group: Ipv6Addr) -> MacAddr {
    let o = group.octets();
    MacAddr([0x33, 0x33, o[12], o[13], o[14], o[15]])
}

/// The ICMPv6 checksum (RFC 4443 §2.3) of `icmp` between `source` and `destination`, computed
/// with the message's checksum field taken as zero.
pub fn icmpv6_checksum(source: &Ipv6Addr, destination: &Ipv6Addr, icmp: &[u8]) -> u16 {
    checksum_with_field_zeroed(source, destination, icmp)
}

fn build_na(
    our_mac: MacAddr,
    source: Ipv6Addr,
    destination: Ipv6Addr,
    eth_destination: MacAddr,
    target: Ipv6Addr,
    flags: u8,
) -> Vec<u8> {
    let mut icmp = [0u8; NA_LEN];
    icmp[0] = TYPE_NEIGHBOR_ADVERTISEMENT;
    icmp[4] = flags;
    icmp[8..24].copy_from_slice(&target.octets());
    icmp[24] = OPTION_TARGET_LINK_ADDR;
    icmp[25] = 1;
    icmp[26..32].copy_from_slice(&our_mac.0);
    let checksum = checksum_with_field_zeroed(&source, &destination, &icmp);
    icmp[2..4].copy_from_slice(&checksum.to_be_bytes());

    let mut frame = ethernet_header(
        eth_destination,
        our_mac,
        ETHERTYPE_IPV6,
        IPV6_HEADER_LEN + NA_LEN,
    );
    // Version 6, traffic class 0, flow label 0 (as Linux sends ND messages).
    frame.extend_from_slice(&[0x60, 0, 0, 0]);
    // NA_LEN is a small constant.
    frame.extend_from_slice(&(NA_LEN as u16).to_be_bytes());
    frame.extend_from_slice(&[NEXT_HEADER_ICMPV6, ND_HOP_LIMIT]);
    frame.extend_from_slice(&source.octets());
    frame.extend_from_slice(&destination.octets());
    frame.extend_from_slice(&icmp);
    frame
}

/// Why an NDP option list is malformed (RFC 4861 §4.6); each message's parser reports it in its
/// own error type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OptionError {
    /// An option that runs past the end of the message.
    Truncated { option_type: u8 },
    /// An option with length 0.
    ZeroLength { option_type: u8 },
    /// A Source Link-Layer Address option that is not one Ethernet address.
    LinkLayerAddressLength { len: u8 },
}

impl From<OptionError> for ParseError {
    fn from(e: OptionError) -> Self {
        match e {
            OptionError::Truncated { option_type } => ParseError::OptionTruncated { option_type },
            OptionError::ZeroLength { option_type } => ParseError::OptionZeroLength { option_type },
            OptionError::LinkLayerAddressLength { len } => {
                ParseError::LinkLayerAddressLength { len }
            }
        }
    }
}

/// Walks the options of an NDP message (RFC 4861 §4.6): every one must have a non-zero length
/// and end within the message; the first Source Link-Layer Address option is returned (Linux
/// keeps the first of duplicated options; so do we), the others are skipped.
pub(super) fn source_link_addr(mut options: &[u8]) -> Result<Option<MacAddr>, OptionError> {
    let mut found = None;
    while let Some(&option_type) = options.first() {
        let Some(&units) = options.get(1) else {
            return Err(OptionError::Truncated { option_type });
        };
        if units == 0 {
            return Err(OptionError::ZeroLength { option_type });
        }
        let Some((option, rest)) = options.split_at_checked(usize::from(units) * 8) else {
            return Err(OptionError::Truncated { option_type });
        };
        if option_type == OPTION_SOURCE_LINK_ADDR {
            if units != 1 {
                return Err(OptionError::LinkLayerAddressLength { len: units });
            }
            found.get_or_insert(MacAddr(array_at(option, 2)));
        }
        options = rest;
    }
    Ok(found)
}

/// Whether the checksum of `icmp` as received is right: the one's-complement sum of the
/// pseudo-header and the whole message (its checksum field included) is all ones.
pub(super) fn checksum_ok(source: &Ipv6Addr, destination: &Ipv6Addr, icmp: &[u8]) -> bool {
    fold(pseudo_header_sum(source, destination, icmp.len()) + word_sum(icmp)) == 0xffff
}

fn checksum_with_field_zeroed(source: &Ipv6Addr, destination: &Ipv6Addr, icmp: &[u8]) -> u16 {
    // The field sits at offsets 2..4; the parts before and after it both start at even
    // offsets, so summing them apart pairs the octets as one pass over the message would.
    let before = icmp.get(..2).unwrap_or(icmp);
    let after = icmp.get(4..).unwrap_or(&[]);
    !fold(pseudo_header_sum(source, destination, icmp.len()) + word_sum(before) + word_sum(after))
}

fn pseudo_header_sum(source: &Ipv6Addr, destination: &Ipv6Addr, len: usize) -> u64 {
    // The upper-layer length is a 32-bit field; ours come from a 16-bit payload length.
    let len = u32::try_from(len).unwrap_or(u32::MAX);
    word_sum(&source.octets())
        + word_sum(&destination.octets())
        + word_sum(&len.to_be_bytes())
        + u64::from(NEXT_HEADER_ICMPV6)
}

/// Sum of big-endian 16-bit words, an odd last octet padded with zero.
fn word_sum(bytes: &[u8]) -> u64 {
    bytes
        .chunks(2)
        .map(|pair| match *pair {
            [hi, lo] => u64::from(u16::from_be_bytes([hi, lo])),
            [hi] => u64::from(hi) << 8,
            _ => 0,
        })
        .sum()
}

/// Folds carries back in (end-around carry) down to 16 bits.
fn fold(mut sum: u64) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    // The loop leaves at most 0xffff.
    u16::try_from(sum).unwrap_or(0xffff)
}

#[cfg(test)]
mod tests {
    use super::super::{Request, parse as parse_frame};
    use super::*;

    const OURS: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x0b]);

    #[test]
    fn solicited_node() {
        let addr: Ipv6Addr = "2001:db8::12:3456".parse().unwrap_or(Ipv6Addr::UNSPECIFIED);
        let group = solicited_node_multicast(addr);
        assert_eq!(group.to_string(), "ff02::1:ff12:3456");
        assert!(is_solicited_node_multicast(group));
        assert!(!is_solicited_node_multicast(ALL_NODES));
        assert_eq!(solicited_node_mac(addr).to_string(), "33:33:ff:12:34:56");
        assert_eq!(
            ipv6_multicast_mac(ALL_NODES).to_string(),
            "33:33:00:00:00:01"
        );
    }

    #[test]
    fn our_advertisements_verify() {
        let target = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 7);
        let frame = unsolicited_neighbor_advertisement(OURS, target, target);
        let icmp = &frame[14 + IPV6_HEADER_LEN..];
        assert!(checksum_ok(&target, &ALL_NODES, icmp));
        assert_eq!(parse_frame(&frame), Ok(None));
    }

    #[test]
    fn checksum_arithmetic() {
        assert_eq!(word_sum(&[0x01]), 0x0100);
        assert_eq!(word_sum(&[0x01, 0x02, 0x03]), 0x0102 + 0x0300);
        assert_eq!(fold(0x1_fffe), 0xffff);
        assert_eq!(fold(0x2_0001), 0x0003);
        // A message whose checksum field is right verifies, and a wrong field is reported.
        let a = Ipv6Addr::LOCALHOST;
        let mut icmp = [135u8, 0, 0, 0, 1, 2, 3];
        let c = checksum_with_field_zeroed(&a, &a, &icmp);
        icmp[2..4].copy_from_slice(&c.to_be_bytes());
        assert!(checksum_ok(&a, &a, &icmp));
        assert_eq!(checksum_with_field_zeroed(&a, &a, &icmp), c);
        icmp[6] ^= 1;
        assert!(!checksum_ok(&a, &a, &icmp));
    }

    #[test]
    fn dad_solicitation_answered_to_all_nodes() {
        let target = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 7);
        let ns = NeighborSolicitation {
            eth_source: MacAddr([0x02, 0, 0, 0, 0, 0x0a]),
            source: Ipv6Addr::UNSPECIFIED,
            destination: solicited_node_multicast(target),
            target,
            source_link_addr: None,
        };
        let na = neighbor_advertisement(&ns, OURS, target);
        assert_eq!(na, unsolicited_neighbor_advertisement(OURS, target, target));
        assert!(matches!(
            parse_frame(&na),
            Ok(None) | Ok(Some(Request::Arp(_)))
        ));
    }
}
