//! IPv6 Router Discovery (RFC 4861 §4.1, §4.2, §6.1): Router Solicitations and Router
//! Advertisements, for finding a BGP unnumbered peer on a link (decision record 0020).
//!
//! Unlike [`super::ndp`], these are ICMPv6 messages without Ethernet or IPv6 headers: the
//! speaker sends and receives them on a raw ICMPv6 socket bound to the interface, which hands
//! over the ICMPv6 message and reports the IPv6 source, destination and hop limit apart
//! ([`Envelope`]). The builders fill in the checksum over the IPv6 pseudo-header (RFC 4443 §2.3),
//! so their bytes are complete; Linux recomputes it on raw ICMPv6 sockets anyway.
//!
//! Our advertisements say Router Lifetime 0 ([`RouterAdvertisement::not_a_default_router`]):
//! they only tell the peer our link-local address and must make us nobody's default router.

use std::net::Ipv6Addr;

use super::MacAddr;
use super::ndp::{
    ND_HOP_LIMIT, OPTION_SOURCE_LINK_ADDR, OptionError, checksum_ok, icmpv6_checksum,
    source_link_addr,
};

/// ICMPv6 type of a Router Solicitation.
pub const TYPE_ROUTER_SOLICITATION: u8 = 133;
/// ICMPv6 type of a Router Advertisement.
pub const TYPE_ROUTER_ADVERTISEMENT: u8 = 134;
/// ff02::2, all routers on the link: where solicitations are sent.
pub const ALL_ROUTERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 2);
/// Type, code, checksum, reserved.
pub const RS_FIXED_LEN: usize = 8;
/// Type, code, checksum, Cur Hop Limit, flags, Router Lifetime, Reachable Time, Retrans Timer.
pub const RA_FIXED_LEN: usize = 16;
/// The M (Managed address configuration) flag of an advertisement's flag octet.
pub const RA_FLAG_MANAGED: u8 = 0x80;
/// The O (Other configuration) flag of an advertisement's flag octet.
pub const RA_FLAG_OTHER_CONFIG: u8 = 0x40;

/// One option of 8 octets holding an Ethernet address.
const SLLA_OPTION_LEN: usize = 8;

/// The IPv6 header fields a received message is checked against (RFC 4861 §6.1), as a raw
/// ICMPv6 socket reports them (`recvmsg` source, `IPV6_PKTINFO`, `IPV6_HOPLIMIT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Envelope {
    /// IPv6 source address.
    pub source: Ipv6Addr,
    /// IPv6 destination address (for the checksum's pseudo-header).
    pub destination: Ipv6Addr,
    /// The IPv6 hop limit as received, if the socket reported it; when given it must be 255.
    pub hop_limit: Option<u8>,
}

/// A parsed, valid Router Solicitation (RFC 4861 §4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RouterSolicitation {
    /// The Source Link-Layer Address option, if present (never from `::`).
    pub source_link_addr: Option<MacAddr>,
}

/// A parsed, valid Router Advertisement (RFC 4861 §4.2). Options other than the Source
/// Link-Layer Address (prefixes, MTU, RDNSS...) are skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RouterAdvertisement {
    /// Cur Hop Limit: the hop limit hosts should use, 0 for unspecified.
    pub cur_hop_limit: u8,
    /// The whole flag octet: [`RA_FLAG_MANAGED`], [`RA_FLAG_OTHER_CONFIG`] and the bits later
    /// RFCs define (Home Agent, router preference, proxy), kept as received.
    pub flags: u8,
    /// Router Lifetime in seconds; 0 means the sender is not a default router.
    pub router_lifetime: u16,
    /// Reachable Time in milliseconds, 0 for unspecified.
    pub reachable_time: u32,
    /// Retrans Timer in milliseconds, 0 for unspecified.
    pub retrans_timer: u32,
    /// The Source Link-Layer Address option, if present.
    pub source_link_addr: Option<MacAddr>,
}

impl RouterAdvertisement {
    /// What the speaker sends on an unnumbered interface: Router Lifetime 0 (not a default
    /// router, §4.2), every other field 0 (unspecified, so FRR's zebra finds nothing to warn
    /// about), and our link-layer address.
    pub fn not_a_default_router(our_mac: MacAddr) -> Self {
        RouterAdvertisement {
            cur_hop_limit: 0,
            flags: 0,
            router_lifetime: 0,
            reachable_time: 0,
            retrans_timer: 0,
            source_link_addr: Some(our_mac),
        }
    }

    /// Whether the sender offers itself as a default router (Router Lifetime not 0).
    pub fn is_default_router(&self) -> bool {
        self.router_lifetime != 0
    }

    /// The M flag: addresses are available from DHCPv6.
    pub fn managed(&self) -> bool {
        self.flags & RA_FLAG_MANAGED != 0
    }

    /// The O flag: other configuration is available from DHCPv6.
    pub fn other_config(&self) -> bool {
        self.flags & RA_FLAG_OTHER_CONFIG != 0
    }
}

/// A Router Solicitation or a Router Advertisement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RouterDiscovery {
    /// A Router Solicitation: answer with an advertisement.
    Solicitation(RouterSolicitation),
    /// A Router Advertisement: its source is a router on the link.
    Advertisement(RouterAdvertisement),
}

/// Why a Router Solicitation or Advertisement was dropped (RFC 4861 §6.1.1, §6.1.2). One variant
/// per kind so the caller can count them ([`RouterDiscoveryError::kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum RouterDiscoveryError {
    /// An empty ICMPv6 message.
    #[error("empty ICMPv6 message")]
    Empty,
    /// A message of another ICMPv6 type given to a parser of one type.
    #[error("ICMPv6 type {found}, expected {expected}")]
    UnexpectedType {
        /// The type as received.
        found: u8,
        /// The type the parser reads.
        expected: u8,
    },
    /// An IPv6 hop limit other than 255: the message crossed a router.
    #[error("router discovery message with hop limit {hop_limit}, expected 255")]
    HopLimit {
        /// The hop limit as received.
        hop_limit: u8,
    },
    /// An advertisement whose IPv6 source is not link-local (§6.1.2).
    #[error("router advertisement from {address}, which is not link-local")]
    SourceNotLinkLocal {
        /// The IPv6 source as received (not named `source`, which thiserror takes for a cause).
        address: Ipv6Addr,
    },
    /// A solicitation from a multicast source (never valid as a source, RFC 4291 §2.7).
    #[error("router solicitation from multicast source {address}")]
    SourceMulticast {
        /// The IPv6 source as received.
        address: Ipv6Addr,
    },
    /// ICMPv6 code other than 0.
    #[error("router discovery message with ICMPv6 code {code}")]
    IcmpCode {
        /// The code as received.
        code: u8,
    },
    /// Shorter than the fixed part of its type (8 octets for RS, 16 for RA).
    #[error("ICMPv6 type {message_type} of {len} octets, expected at least {min}")]
    Truncated {
        /// The ICMPv6 type.
        message_type: u8,
        /// The message's length.
        len: usize,
        /// The fixed part's length.
        min: usize,
    },
    /// The ICMPv6 checksum does not match.
    #[error("ICMPv6 checksum {found:#06x}, expected {expected:#06x}")]
    Checksum {
        /// The checksum field as received.
        found: u16,
        /// The checksum of the message as received.
        expected: u16,
    },
    /// An option with length 0.
    #[error("NDP option of type {option_type} with length 0")]
    OptionZeroLength {
        /// The option type.
        option_type: u8,
    },
    /// An option that runs past the end of the message.
    #[error("NDP option of type {option_type} runs past the message")]
    OptionTruncated {
        /// The option type.
        option_type: u8,
    },
    /// A Source Link-Layer Address option that is not one Ethernet address (length other than
    /// 1 unit of 8 octets); Linux drops such advertisements too.
    #[error("source link-layer address option of length {len} (units of 8 octets), expected 1")]
    LinkLayerAddressLength {
        /// The option length field.
        len: u8,
    },
    /// A solicitation from `::` with a Source Link-Layer Address option (§6.1.1).
    #[error("router solicitation from :: with a source link-layer address option")]
    UnspecifiedSourceWithLinkAddress,
}

impl RouterDiscoveryError {
    /// A short stable label for this kind of error, e.g. for a metric's label value.
    pub fn kind(&self) -> &'static str {
        match self {
            RouterDiscoveryError::Empty => "empty",
            RouterDiscoveryError::UnexpectedType { .. } => "unexpected_type",
            RouterDiscoveryError::HopLimit { .. } => "hop_limit",
            RouterDiscoveryError::SourceNotLinkLocal { .. } => "source_not_link_local",
            RouterDiscoveryError::SourceMulticast { .. } => "source_multicast",
            RouterDiscoveryError::IcmpCode { .. } => "icmp_code",
            RouterDiscoveryError::Truncated { .. } => "truncated",
            RouterDiscoveryError::Checksum { .. } => "checksum",
            RouterDiscoveryError::OptionZeroLength { .. } => "option_zero_length",
            RouterDiscoveryError::OptionTruncated { .. } => "option_truncated",
            RouterDiscoveryError::LinkLayerAddressLength { .. } => "link_layer_address_length",
            RouterDiscoveryError::UnspecifiedSourceWithLinkAddress => {
                "unspecified_source_with_link_address"
            }
        }
    }
}

/// Whether `addr` is in fe80::/10.
pub fn is_link_local(addr: Ipv6Addr) -> bool {
    addr.segments()[0] & 0xffc0 == 0xfe80
}

/// The IPv6 header checks of RFC 4861 §6.1.2 for a Router Advertisement: hop limit 255 (when
/// known) and a link-local source. Pure: the rest of §6.1.2 needs the message
/// ([`parse_router_advertisement`] runs this first).
pub fn check_advertisement_envelope(
    hop_limit: Option<u8>,
    source: Ipv6Addr,
) -> Result<(), RouterDiscoveryError> {
    check_hop_limit(hop_limit)?;
    if !is_link_local(source) {
        return Err(RouterDiscoveryError::SourceNotLinkLocal { address: source });
    }
    Ok(())
}

/// The IPv6 header checks of RFC 4861 §6.1.1 for a Router Solicitation: hop limit 255 (when
/// known) and a source that is not multicast (`::` is allowed; the option check that goes with
/// it needs the message, [`parse_router_solicitation`]).
pub fn check_solicitation_envelope(
    hop_limit: Option<u8>,
    source: Ipv6Addr,
) -> Result<(), RouterDiscoveryError> {
    check_hop_limit(hop_limit)?;
    if source.is_multicast() {
        return Err(RouterDiscoveryError::SourceMulticast { address: source });
    }
    Ok(())
}

fn check_hop_limit(hop_limit: Option<u8>) -> Result<(), RouterDiscoveryError> {
    match hop_limit {
        Some(hop_limit) if hop_limit != ND_HOP_LIMIT => {
            Err(RouterDiscoveryError::HopLimit { hop_limit })
        }
        _ => Ok(()),
    }
}

/// Parses a received ICMPv6 message: `Ok(Some(_))` for a valid Router Solicitation or Router
/// Advertisement, `Ok(None)` for any other ICMPv6 type, an error for an RS or RA that fails a
/// check of RFC 4861 §6.1. Never panics.
pub fn parse_router_discovery(
    icmp: &[u8],
    envelope: &Envelope,
) -> Result<Option<RouterDiscovery>, RouterDiscoveryError> {
    match icmp.first() {
        None => Err(RouterDiscoveryError::Empty),
        Some(&TYPE_ROUTER_SOLICITATION) => parse_router_solicitation(icmp, envelope)
            .map(|rs| Some(RouterDiscovery::Solicitation(rs))),
        Some(&TYPE_ROUTER_ADVERTISEMENT) => parse_router_advertisement(icmp, envelope)
            .map(|ra| Some(RouterDiscovery::Advertisement(ra))),
        Some(_) => Ok(None),
    }
}

/// Parses and validates a Router Advertisement (RFC 4861 §4.2, checks of §6.1.2 in its order:
/// hop limit 255, link-local source, checksum, code 0, at least 16 octets, options of non-zero
/// length within the message). Unknown options are skipped (§4.6); of several Source
/// Link-Layer Address options the first counts, as in Linux.
pub fn parse_router_advertisement(
    icmp: &[u8],
    envelope: &Envelope,
) -> Result<RouterAdvertisement, RouterDiscoveryError> {
    let fixed = common_checks(icmp, envelope, TYPE_ROUTER_ADVERTISEMENT, RA_FIXED_LEN)?;
    let source_link_addr = source_link_addr(fixed.options)?;
    let [cur_hop_limit, flags, l0, l1] = word_at(fixed.body, 0);
    Ok(RouterAdvertisement {
        cur_hop_limit,
        flags,
        router_lifetime: u16::from_be_bytes([l0, l1]),
        reachable_time: u32::from_be_bytes(word_at(fixed.body, 4)),
        retrans_timer: u32::from_be_bytes(word_at(fixed.body, 8)),
        source_link_addr,
    })
}

/// Parses and validates a Router Solicitation (RFC 4861 §4.1, checks of §6.1.1: hop limit 255,
/// source not multicast, checksum, code 0, at least 8 octets, options of non-zero length within
/// the message, no Source Link-Layer Address option from `::`).
pub fn parse_router_solicitation(
    icmp: &[u8],
    envelope: &Envelope,
) -> Result<RouterSolicitation, RouterDiscoveryError> {
    let fixed = common_checks(icmp, envelope, TYPE_ROUTER_SOLICITATION, RS_FIXED_LEN)?;
    let source_link_addr = source_link_addr(fixed.options)?;
    if envelope.source.is_unspecified() && source_link_addr.is_some() {
        return Err(RouterDiscoveryError::UnspecifiedSourceWithLinkAddress);
    }
    Ok(RouterSolicitation { source_link_addr })
}

/// A Router Advertisement as an ICMPv6 message (checksum filled in) from `source` to
/// `destination` ([`super::ndp::ALL_NODES`] for periodic ones, RFC 4861 §6.2.6), with a Source
/// Link-Layer Address option when `ra` has one. Send it with hop limit 255.
pub fn router_advertisement(
    ra: &RouterAdvertisement,
    source: Ipv6Addr,
    destination: Ipv6Addr,
) -> Vec<u8> {
    let mut icmp = Vec::with_capacity(RA_FIXED_LEN + SLLA_OPTION_LEN);
    icmp.extend_from_slice(&[TYPE_ROUTER_ADVERTISEMENT, 0, 0, 0]);
    icmp.extend_from_slice(&[ra.cur_hop_limit, ra.flags]);
    icmp.extend_from_slice(&ra.router_lifetime.to_be_bytes());
    icmp.extend_from_slice(&ra.reachable_time.to_be_bytes());
    icmp.extend_from_slice(&ra.retrans_timer.to_be_bytes());
    finish(icmp, ra.source_link_addr, source, destination)
}

/// A Router Solicitation as an ICMPv6 message (checksum filled in) from `source` to
/// `destination` (usually [`ALL_ROUTERS`]). The Source Link-Layer Address option is left out when
/// `source` is `::`, as RFC 4861 §4.1 requires. Send it with hop limit 255.
pub fn router_solicitation(
    rs: &RouterSolicitation,
    source: Ipv6Addr,
    destination: Ipv6Addr,
) -> Vec<u8> {
    let mut icmp = Vec::with_capacity(RS_FIXED_LEN + SLLA_OPTION_LEN);
    icmp.extend_from_slice(&[TYPE_ROUTER_SOLICITATION, 0, 0, 0, 0, 0, 0, 0]);
    let option = rs.source_link_addr.filter(|_| !source.is_unspecified());
    finish(icmp, option, source, destination)
}

/// Appends the Source Link-Layer Address option, if any, and writes the checksum.
fn finish(
    mut icmp: Vec<u8>,
    source_link_addr: Option<MacAddr>,
    source: Ipv6Addr,
    destination: Ipv6Addr,
) -> Vec<u8> {
    if let Some(mac) = source_link_addr {
        icmp.extend_from_slice(&[OPTION_SOURCE_LINK_ADDR, 1]);
        icmp.extend_from_slice(&mac.0);
    }
    let checksum = icmpv6_checksum(&source, &destination, &icmp);
    if let Some(field) = icmp.get_mut(2..4) {
        field.copy_from_slice(&checksum.to_be_bytes());
    }
    icmp
}

/// The parts of a message that passed the checks both types share.
struct Checked<'a> {
    /// The fixed part after type, code and checksum.
    body: &'a [u8],
    /// What follows the fixed part.
    options: &'a [u8],
}

fn common_checks<'a>(
    icmp: &'a [u8],
    envelope: &Envelope,
    message_type: u8,
    min: usize,
) -> Result<Checked<'a>, RouterDiscoveryError> {
    let Some(&found) = icmp.first() else {
        return Err(RouterDiscoveryError::Empty);
    };
    if found != message_type {
        return Err(RouterDiscoveryError::UnexpectedType {
            found,
            expected: message_type,
        });
    }
    if message_type == TYPE_ROUTER_ADVERTISEMENT {
        check_advertisement_envelope(envelope.hop_limit, envelope.source)?;
    } else {
        check_solicitation_envelope(envelope.hop_limit, envelope.source)?;
    }
    let truncated = RouterDiscoveryError::Truncated {
        message_type,
        len: icmp.len(),
        min,
    };
    // The checksum field must be there to be checked at all.
    let Some(&[_, code, hi, lo]) = icmp.get(..4) else {
        return Err(truncated);
    };
    if !checksum_ok(&envelope.source, &envelope.destination, icmp) {
        return Err(RouterDiscoveryError::Checksum {
            found: u16::from_be_bytes([hi, lo]),
            expected: icmpv6_checksum(&envelope.source, &envelope.destination, icmp),
        });
    }
    if code != 0 {
        return Err(RouterDiscoveryError::IcmpCode { code });
    }
    let Some((fixed, options)) = icmp.split_at_checked(min) else {
        return Err(truncated);
    };
    Ok(Checked {
        body: fixed.get(4..).unwrap_or(&[]),
        options,
    })
}

impl From<OptionError> for RouterDiscoveryError {
    fn from(e: OptionError) -> Self {
        match e {
            OptionError::Truncated { option_type } => {
                RouterDiscoveryError::OptionTruncated { option_type }
            }
            OptionError::ZeroLength { option_type } => {
                RouterDiscoveryError::OptionZeroLength { option_type }
            }
            OptionError::LinkLayerAddressLength { len } => {
                RouterDiscoveryError::LinkLayerAddressLength { len }
            }
        }
    }
}

/// Four octets at `offset`, zeros where `bytes` is too short (callers check lengths first).
fn word_at(bytes: &[u8], offset: usize) -> [u8; 4] {
    super::array_at(bytes, offset)
}

#[cfg(test)]
mod tests {
    use super::super::ndp::ALL_NODES;
    use super::*;
    use proptest::prelude::*;

    const FE80_1: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
    const FE80_2: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 2);
    const MAC_1: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x01]);
    const MAC_2: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x02]);

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap_or(0xee))
            .collect()
    }

    fn envelope(source: Ipv6Addr, destination: Ipv6Addr) -> Envelope {
        Envelope {
            source,
            destination,
            hop_limit: Some(255),
        }
    }

    /// The RFC 4443 §2.3 checksum written out the long way, apart from `ndp`'s code: 32-bit sum
    /// of the pseudo-header and message as 16-bit words, carries folded, complemented.
    fn independent_checksum(source: Ipv6Addr, destination: Ipv6Addr, icmp: &[u8]) -> u16 {
        let mut data = Vec::new();
        data.extend_from_slice(&source.octets());
        data.extend_from_slice(&destination.octets());
        data.extend_from_slice(&(icmp.len() as u32).to_be_bytes());
        data.extend_from_slice(&[0, 0, 0, 58]);
        data.extend_from_slice(icmp);
        data[40 + 2] = 0;
        data[40 + 3] = 0;
        if data.len() % 2 == 1 {
            data.push(0);
        }
        let mut sum: u32 = 0;
        for i in (0..data.len()).step_by(2) {
            sum += (u32::from(data[i]) << 8) | u32::from(data[i + 1]);
        }
        while sum >> 16 != 0 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    /// RFC 4861 §4.2 layout, by hand: an RA from fe80::1 to ff02::1, lifetime 0, everything
    /// else 0, SLLA 02:00:00:00:00:01. The checksum 0x7925 was summed by hand: fe80 + 0001 +
    /// ff02 + 0001 (addresses) + 0018 (length) + 003a (next header) + 8600 + 0101 + 0200 + 0001
    /// (message) = 0x286d8, folded 0x86da, complemented 0x7925.
    const RA_LIFETIME_0: &str = concat!(
        "86",
        "00",
        "7925", // type 134, code 0, checksum
        "00",
        "00",
        "0000",     // Cur Hop Limit, flags, Router Lifetime
        "00000000", // Reachable Time
        "00000000", // Retrans Timer
        "01",
        "01",
        "020000000001", // SLLA option, 1 unit, 02:00:00:00:00:01
    );

    /// An RA as a real router sends it: fe80::2 to ff02::1, Cur Hop Limit 64, M and O, lifetime
    /// 1800 s, Reachable Time 30000 ms, Retrans Timer 1000 ms, an MTU option (type 5, skipped)
    /// before the SLLA option.
    const RA_DEFAULT_ROUTER: &str = concat!(
        "86",
        "00",
        "ad5d",
        "40",
        "c0",
        "0708",
        "00007530",
        "000003e8",
        "05",
        "01",
        "0000",
        "000005dc", // MTU 1500
        "01",
        "01",
        "020000000002",
    );

    /// RFC 4861 §4.1 layout: an RS from fe80::2 to ff02::2 with SLLA 02:00:00:00:00:02.
    const RS_WITH_SLLA: &str = concat!("85", "00", "7a2a", "00000000", "01", "01", "020000000002",);

    #[test]
    fn hand_written_checksums_agree_with_the_independent_sum() {
        for (vector, source, destination) in [
            (RA_LIFETIME_0, FE80_1, ALL_NODES),
            (RA_DEFAULT_ROUTER, FE80_2, ALL_NODES),
            (RS_WITH_SLLA, FE80_2, ALL_ROUTERS),
        ] {
            let bytes = hex(vector);
            let field = u16::from_be_bytes([bytes[2], bytes[3]]);
            assert_eq!(independent_checksum(source, destination, &bytes), field);
        }
    }

    #[test]
    fn our_advertisement_is_byte_exact() {
        let ra = RouterAdvertisement::not_a_default_router(MAC_1);
        assert_eq!(
            router_advertisement(&ra, FE80_1, ALL_NODES),
            hex(RA_LIFETIME_0)
        );
        assert!(!ra.is_default_router());
        assert_eq!(
            parse_router_advertisement(&hex(RA_LIFETIME_0), &envelope(FE80_1, ALL_NODES)),
            Ok(ra)
        );
    }

    #[test]
    fn a_default_router_advertisement_parses_skipping_the_mtu_option() {
        let ra = parse_router_advertisement(&hex(RA_DEFAULT_ROUTER), &envelope(FE80_2, ALL_NODES));
        let expected = RouterAdvertisement {
            cur_hop_limit: 64,
            flags: 0xc0,
            router_lifetime: 1800,
            reachable_time: 30_000,
            retrans_timer: 1000,
            source_link_addr: Some(MAC_2),
        };
        assert_eq!(ra, Ok(expected));
        assert!(expected.managed() && expected.other_config() && expected.is_default_router());
        assert_eq!(
            parse_router_discovery(&hex(RA_DEFAULT_ROUTER), &envelope(FE80_2, ALL_NODES)),
            Ok(Some(RouterDiscovery::Advertisement(expected)))
        );
    }

    #[test]
    fn solicitation_is_byte_exact() {
        let rs = RouterSolicitation {
            source_link_addr: Some(MAC_2),
        };
        assert_eq!(
            router_solicitation(&rs, FE80_2, ALL_ROUTERS),
            hex(RS_WITH_SLLA)
        );
        assert_eq!(
            parse_router_solicitation(&hex(RS_WITH_SLLA), &envelope(FE80_2, ALL_ROUTERS)),
            Ok(rs)
        );
        // From ::, the option is left out (§4.1): type, code, checksum 0x7bb8, reserved.
        let from_unspecified = router_solicitation(&rs, Ipv6Addr::UNSPECIFIED, ALL_ROUTERS);
        assert_eq!(from_unspecified, hex("85007bb800000000"));
        assert_eq!(
            parse_router_solicitation(
                &from_unspecified,
                &envelope(Ipv6Addr::UNSPECIFIED, ALL_ROUTERS)
            ),
            Ok(RouterSolicitation {
                source_link_addr: None
            })
        );
    }

    #[test]
    fn solicitation_from_unspecified_with_slla_is_refused() {
        // The RS_WITH_SLLA message re-summed for source ::.
        let mut bytes = hex(RS_WITH_SLLA);
        let c = independent_checksum(Ipv6Addr::UNSPECIFIED, ALL_ROUTERS, &bytes);
        bytes[2..4].copy_from_slice(&c.to_be_bytes());
        assert_eq!(
            parse_router_solicitation(&bytes, &envelope(Ipv6Addr::UNSPECIFIED, ALL_ROUTERS)),
            Err(RouterDiscoveryError::UnspecifiedSourceWithLinkAddress)
        );
    }

    #[test]
    fn envelope_checks() {
        assert_eq!(check_advertisement_envelope(Some(255), FE80_1), Ok(()));
        assert_eq!(check_advertisement_envelope(None, FE80_1), Ok(()));
        assert_eq!(
            check_advertisement_envelope(Some(254), FE80_1),
            Err(RouterDiscoveryError::HopLimit { hop_limit: 254 })
        );
        let global = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
        assert_eq!(
            check_advertisement_envelope(Some(255), global),
            Err(RouterDiscoveryError::SourceNotLinkLocal { address: global })
        );
        // fe80::/10 reaches febf:..., not fec0::.
        assert!(is_link_local(Ipv6Addr::new(0xfebf, 0, 0, 0, 0, 0, 0, 1)));
        assert!(!is_link_local(Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 1)));
        assert_eq!(
            check_solicitation_envelope(Some(255), Ipv6Addr::UNSPECIFIED),
            Ok(())
        );
        assert_eq!(
            check_solicitation_envelope(Some(255), ALL_NODES),
            Err(RouterDiscoveryError::SourceMulticast { address: ALL_NODES })
        );
        assert_eq!(
            check_solicitation_envelope(Some(64), FE80_1),
            Err(RouterDiscoveryError::HopLimit { hop_limit: 64 })
        );
        // The parsers apply them.
        let mut env = envelope(FE80_1, ALL_NODES);
        env.hop_limit = Some(1);
        assert_eq!(
            parse_router_advertisement(&hex(RA_LIFETIME_0), &env),
            Err(RouterDiscoveryError::HopLimit { hop_limit: 1 })
        );
        env.hop_limit = None;
        assert!(parse_router_advertisement(&hex(RA_LIFETIME_0), &env).is_ok());
    }

    #[test]
    fn checksum_and_code_are_checked() {
        let mut bytes = hex(RA_LIFETIME_0);
        bytes[5] ^= 0x01;
        assert!(matches!(
            parse_router_advertisement(&bytes, &envelope(FE80_1, ALL_NODES)),
            Err(RouterDiscoveryError::Checksum { found: 0x7925, .. })
        ));
        // The same bytes from another source do not verify either.
        assert!(matches!(
            parse_router_advertisement(&hex(RA_LIFETIME_0), &envelope(FE80_2, ALL_NODES)),
            Err(RouterDiscoveryError::Checksum { .. })
        ));
        let mut bytes = hex(RA_LIFETIME_0);
        bytes[1] = 1;
        let c = independent_checksum(FE80_1, ALL_NODES, &bytes);
        bytes[2..4].copy_from_slice(&c.to_be_bytes());
        assert_eq!(
            parse_router_advertisement(&bytes, &envelope(FE80_1, ALL_NODES)),
            Err(RouterDiscoveryError::IcmpCode { code: 1 })
        );
    }

    /// Re-sums `bytes` (which may be too short to hold a checksum) from fe80::1 to ff02::1.
    fn resummed(mut bytes: Vec<u8>) -> Vec<u8> {
        if bytes.len() >= 4 {
            let c = independent_checksum(FE80_1, ALL_NODES, &bytes);
            bytes[2..4].copy_from_slice(&c.to_be_bytes());
        }
        bytes
    }

    #[test]
    fn truncated_messages_are_refused() {
        let full = hex(RA_LIFETIME_0);
        let env = envelope(FE80_1, ALL_NODES);
        assert_eq!(
            parse_router_advertisement(&[], &env),
            Err(RouterDiscoveryError::Empty)
        );
        for len in 1..RA_FIXED_LEN {
            assert_eq!(
                parse_router_advertisement(&resummed(full[..len].to_vec()), &env),
                Err(RouterDiscoveryError::Truncated {
                    message_type: TYPE_ROUTER_ADVERTISEMENT,
                    len,
                    min: RA_FIXED_LEN
                }),
                "{len} octets"
            );
        }
        // Cut inside the option: its length says 8 octets, fewer are there.
        for len in RA_FIXED_LEN + 1..full.len() {
            let cut = resummed(full[..len].to_vec());
            assert_eq!(
                parse_router_advertisement(&cut, &env),
                Err(RouterDiscoveryError::OptionTruncated { option_type: 1 }),
                "{len} octets"
            );
        }
        // Just the fixed part: valid, no link-layer address.
        let bare = resummed(full[..RA_FIXED_LEN].to_vec());
        assert_eq!(
            parse_router_advertisement(&bare, &env).map(|ra| ra.source_link_addr),
            Ok(None)
        );
        let rs = hex("85000000000000");
        assert!(matches!(
            parse_router_solicitation(&resummed(rs), &env),
            Err(RouterDiscoveryError::Truncated { len: 7, min: 8, .. })
        ));
    }

    #[test]
    fn option_lengths_are_checked_and_unknown_options_skipped() {
        let env = envelope(FE80_1, ALL_NODES);
        let fixed = &hex(RA_LIFETIME_0)[..RA_FIXED_LEN];
        let with = |options: &str| resummed([fixed, &hex(options)].concat());
        assert_eq!(
            parse_router_advertisement(&with("0500000000000000"), &env),
            Err(RouterDiscoveryError::OptionZeroLength { option_type: 5 })
        );
        assert_eq!(
            parse_router_advertisement(&with("01010200000000010100000000000000"), &env),
            Err(RouterDiscoveryError::OptionZeroLength { option_type: 1 })
        );
        assert_eq!(
            parse_router_advertisement(&with("01020200000000010000000000000000"), &env),
            Err(RouterDiscoveryError::LinkLayerAddressLength { len: 2 })
        );
        // An unknown option of 2 units, then two SLLA options: the first counts.
        let options = format!(
            "fe02{}{}{}",
            "00".repeat(14),
            "0101020000000001",
            "0101020000000002"
        );
        let ra = parse_router_advertisement(&with(&options), &env);
        assert_eq!(ra.map(|ra| ra.source_link_addr), Ok(Some(MAC_1)));
        // An option of 32 units (256 octets, where pnet overflowed) is skipped whole.
        let mut long = String::from("1920");
        long.push_str(&"00".repeat(254));
        long.push_str("0101020000000002");
        let ra = parse_router_advertisement(&with(&long), &env);
        assert_eq!(ra.map(|ra| ra.source_link_addr), Ok(Some(MAC_2)));
    }

    #[test]
    fn other_types_are_not_router_discovery() {
        let env = envelope(FE80_1, ALL_NODES);
        // An echo request (type 128).
        assert_eq!(parse_router_discovery(&hex("80000000"), &env), Ok(None));
        assert_eq!(
            parse_router_discovery(&[], &env),
            Err(RouterDiscoveryError::Empty)
        );
        assert_eq!(
            parse_router_solicitation(&hex(RA_LIFETIME_0), &env),
            Err(RouterDiscoveryError::UnexpectedType {
                found: 134,
                expected: 133
            })
        );
        let rs = parse_router_discovery(&hex(RS_WITH_SLLA), &envelope(FE80_2, ALL_ROUTERS));
        assert!(matches!(rs, Ok(Some(RouterDiscovery::Solicitation(_)))));
    }

    #[test]
    fn error_kinds_are_distinct() {
        let errors = [
            RouterDiscoveryError::Empty,
            RouterDiscoveryError::UnexpectedType {
                found: 0,
                expected: 0,
            },
            RouterDiscoveryError::HopLimit { hop_limit: 0 },
            RouterDiscoveryError::SourceNotLinkLocal {
                address: Ipv6Addr::UNSPECIFIED,
            },
            RouterDiscoveryError::SourceMulticast { address: ALL_NODES },
            RouterDiscoveryError::IcmpCode { code: 1 },
            RouterDiscoveryError::Truncated {
                message_type: 0,
                len: 0,
                min: 0,
            },
            RouterDiscoveryError::Checksum {
                found: 0,
                expected: 0,
            },
            RouterDiscoveryError::OptionZeroLength { option_type: 0 },
            RouterDiscoveryError::OptionTruncated { option_type: 0 },
            RouterDiscoveryError::LinkLayerAddressLength { len: 0 },
            RouterDiscoveryError::UnspecifiedSourceWithLinkAddress,
        ];
        let kinds: std::collections::HashSet<_> = errors.iter().map(|e| e.kind()).collect();
        assert_eq!(kinds.len(), errors.len());
    }

    fn mac() -> impl Strategy<Value = MacAddr> {
        any::<[u8; 6]>().prop_map(MacAddr)
    }

    fn link_local() -> impl Strategy<Value = Ipv6Addr> {
        any::<u64>().prop_map(|iid| Ipv6Addr::from((0xfe80u128 << 112) | u128::from(iid)))
    }

    fn advertisement() -> impl Strategy<Value = RouterAdvertisement> {
        (
            any::<u8>(),
            any::<u8>(),
            any::<u16>(),
            any::<u32>(),
            any::<u32>(),
            proptest::option::of(mac()),
        )
            .prop_map(
                |(
                    cur_hop_limit,
                    flags,
                    router_lifetime,
                    reachable_time,
                    retrans_timer,
                    source_link_addr,
                )| {
                    RouterAdvertisement {
                        cur_hop_limit,
                        flags,
                        router_lifetime,
                        reachable_time,
                        retrans_timer,
                        source_link_addr,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn advertisements_round_trip(
            ra in advertisement(),
            source in link_local(),
            destination in prop_oneof![Just(ALL_NODES), link_local()],
        ) {
            let bytes = router_advertisement(&ra, source, destination);
            let field = u16::from_be_bytes([bytes[2], bytes[3]]);
            prop_assert_eq!(field, independent_checksum(source, destination, &bytes));
            prop_assert_eq!(
                parse_router_advertisement(&bytes, &envelope(source, destination)),
                Ok(ra)
            );
        }

        #[test]
        fn solicitations_round_trip(
            slla in proptest::option::of(mac()),
            source in prop_oneof![Just(Ipv6Addr::UNSPECIFIED), link_local()],
        ) {
            let rs = RouterSolicitation { source_link_addr: slla };
            let bytes = router_solicitation(&rs, source, ALL_ROUTERS);
            let expected = RouterSolicitation {
                source_link_addr: slla.filter(|_| !source.is_unspecified()),
            };
            prop_assert_eq!(
                parse_router_solicitation(&bytes, &envelope(source, ALL_ROUTERS)),
                Ok(expected)
            );
        }

        /// Any bytes typed RS or RA: parsing returns, never accepts a hop limit other than 255,
        /// and what it accepts encodes back to the same bytes when its options were only the one
        /// SLLA option or none.
        #[test]
        fn any_message_parses_or_fails(
            mut bytes in proptest::collection::vec(any::<u8>(), 0..80),
            rs in any::<bool>(),
            hop_limit in proptest::option::of(any::<u8>()),
        ) {
            if let Some(t) = bytes.first_mut() {
                *t = if rs { TYPE_ROUTER_SOLICITATION } else { TYPE_ROUTER_ADVERTISEMENT };
            }
            // Code 0 mostly, so that the option walk is reached.
            if let Some(code) = bytes.get_mut(1) {
                *code &= 0x01;
            }
            let bytes = resummed(bytes);
            let env = Envelope { source: FE80_1, destination: ALL_NODES, hop_limit };
            match parse_router_discovery(&bytes, &env) {
                Ok(Some(RouterDiscovery::Advertisement(ra))) => {
                    prop_assert!(hop_limit.is_none_or(|h| h == 255));
                    let fixed_and_slla = RA_FIXED_LEN + if ra.source_link_addr.is_some() { 8 } else { 0 };
                    if bytes.len() == fixed_and_slla {
                        prop_assert_eq!(router_advertisement(&ra, FE80_1, ALL_NODES), bytes);
                    }
                }
                Ok(Some(RouterDiscovery::Solicitation(rs))) => {
                    prop_assert!(hop_limit.is_none_or(|h| h == 255));
                    let with_slla = RS_FIXED_LEN + if rs.source_link_addr.is_some() { 8 } else { 0 };
                    // The reserved field is ignored on input and zero on output.
                    if bytes.len() == with_slla && bytes[4..8] == [0; 4] {
                        prop_assert_eq!(router_solicitation(&rs, FE80_1, ALL_NODES), bytes);
                    }
                }
                Ok(None) => return Err(TestCaseError::fail("an RS or RA ignored")),
                Err(e) => {
                    let _ = e.kind();
                }
            }
        }

        /// Any hop limit but 255 is refused for a valid advertisement.
        #[test]
        fn hop_limit_other_than_255_is_refused(hop_limit in any::<u8>()) {
            let mut env = envelope(FE80_1, ALL_NODES);
            env.hop_limit = Some(hop_limit);
            let parsed = parse_router_advertisement(&hex(RA_LIFETIME_0), &env);
            if hop_limit == 255 {
                prop_assert!(parsed.is_ok());
            } else {
                prop_assert_eq!(parsed, Err(RouterDiscoveryError::HopLimit { hop_limit }));
            }
        }
    }
}
