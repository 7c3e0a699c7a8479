//! Path attributes (RFC 4271 §4.3, §5) and their RFC 7606 error handling.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};

use super::capability::AfiSafi;
use super::error::{AttributeError, DecodeError, EncodeError, ErrorAction};
use super::iana::{
    AS_TRANS, as_path_segment, attribute as code, attribute_flags as flag, update_subcode,
};
use super::message::CodecContext;
use super::reader::Reader;
use super::update::{
    decode_ipv4_prefixes, decode_ipv6_prefixes, encode_ipv4_prefix, encode_ipv6_prefix,
};

/// ORIGIN (RFC 4271 §5.1.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Origin {
    /// Learned from an interior protocol, or configured.
    Igp = 0,
    /// Learned through EGP.
    Egp = 1,
    /// Learned some other way.
    Incomplete = 2,
}

/// The type of an AS_PATH segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SegmentKind {
    /// AS_SET (1): unordered.
    Set,
    /// AS_SEQUENCE (2): ordered, nearest AS first.
    Sequence,
    /// AS_CONFED_SEQUENCE (3, RFC 5065).
    ConfedSequence,
    /// AS_CONFED_SET (4, RFC 5065).
    ConfedSet,
}

impl SegmentKind {
    fn code(self) -> u8 {
        match self {
            Self::Set => as_path_segment::AS_SET,
            Self::Sequence => as_path_segment::AS_SEQUENCE,
            Self::ConfedSequence => as_path_segment::AS_CONFED_SEQUENCE,
            Self::ConfedSet => as_path_segment::AS_CONFED_SET,
        }
    }

    fn from_code(c: u8) -> Option<Self> {
        match c {
            as_path_segment::AS_SET => Some(Self::Set),
            as_path_segment::AS_SEQUENCE => Some(Self::Sequence),
            as_path_segment::AS_CONFED_SEQUENCE => Some(Self::ConfedSequence),
            as_path_segment::AS_CONFED_SET => Some(Self::ConfedSet),
            _ => None,
        }
    }
}

/// One AS_PATH segment.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AsSegment {
    /// Segment type.
    pub kind: SegmentKind,
    /// AS numbers, never empty once decoded.
    pub asns: Vec<u32>,
}

/// AS_PATH (RFC 4271 §5.1.2) with 4-octet AS numbers (RFC 6793).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct AsPath {
    /// Segments in wire order. The encoder splits segments longer than 255 AS numbers.
    pub segments: Vec<AsSegment>,
}

impl AsPath {
    /// An AS_PATH of one AS_SEQUENCE; empty for an empty slice (what iBGP peers send).
    pub fn sequence(asns: &[u32]) -> Self {
        let segments = if asns.is_empty() {
            Vec::new()
        } else {
            vec![AsSegment {
                kind: SegmentKind::Sequence,
                asns: asns.to_vec(),
            }]
        };
        Self { segments }
    }

    /// Path length for route selection (RFC 4271 §9.1.2.2): a set counts as one, confederation
    /// segments count as zero.
    pub fn path_len(&self) -> usize {
        self.segments
            .iter()
            .map(|s| match s.kind {
                SegmentKind::Sequence => s.asns.len(),
                SegmentKind::Set => 1,
                SegmentKind::ConfedSequence | SegmentKind::ConfedSet => 0,
            })
            .sum()
    }

    /// True when `asn` appears anywhere in the path (loop detection).
    pub fn contains(&self, asn: u32) -> bool {
        self.segments.iter().any(|s| s.asns.contains(&asn))
    }

    /// Decodes segments of `as_len`-octet AS numbers; `None` when malformed (RFC 7606 §7.2).
    fn decode(value: &[u8], as_len: usize) -> Option<Self> {
        let mut r = Reader::new(value);
        let mut segments = Vec::new();
        while !r.is_empty() {
            let kind = SegmentKind::from_code(r.u8()?)?;
            let count = usize::from(r.u8()?);
            if count == 0 {
                return None;
            }
            let raw = r.take(count * as_len)?;
            let asns = raw
                .chunks_exact(as_len)
                .map(|c| match *c {
                    [a, b] => u32::from(u16::from_be_bytes([a, b])),
                    [a, b, c, d] => u32::from_be_bytes([a, b, c, d]),
                    _ => 0,
                })
                .collect();
            segments.push(AsSegment { kind, asns });
        }
        Some(Self { segments })
    }

    /// Encodes with `as_len`-octet AS numbers (AS_TRANS for those that need four when two are
    /// used), splitting segments into at most 255 AS numbers each.
    fn encode(&self, as_len: usize, out: &mut Vec<u8>) {
        for segment in &self.segments {
            for chunk in segment.asns.chunks(255) {
                out.push(segment.kind.code());
                out.push(chunk.len() as u8);
                for asn in chunk {
                    if as_len == 4 {
                        out.extend_from_slice(&asn.to_be_bytes());
                    } else {
                        let two = u16::try_from(*asn).unwrap_or(AS_TRANS);
                        out.extend_from_slice(&two.to_be_bytes());
                    }
                }
            }
        }
    }

    /// The AS4_PATH attribute (RFC 6793 §4.2.2) to send with this path to a peer without
    /// 4-octet AS support, or `None` when every AS fits in two octets.
    pub fn as4_path_attribute(&self) -> Option<RawAttribute> {
        if !self
            .segments
            .iter()
            .flat_map(|s| &s.asns)
            .any(|&a| a > 0xffff)
        {
            return None;
        }
        let mut value = Vec::new();
        self.encode(4, &mut value);
        Some(RawAttribute {
            flags: flag::OPTIONAL | flag::TRANSITIVE,
            type_code: code::AS4_PATH,
            value,
        })
    }
}

/// AGGREGATOR (RFC 4271 §5.1.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Aggregator {
    /// The AS that aggregated.
    pub asn: u32,
    /// The BGP identifier of the speaker that aggregated.
    pub address: Ipv4Addr,
}

/// A community (RFC 1997): two 16-bit halves, `asn:value`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Community(pub u32);

impl Community {
    /// NO_EXPORT (65535:65281).
    pub const NO_EXPORT: Self = Self(0xffff_ff01);
    /// NO_ADVERTISE (65535:65282).
    pub const NO_ADVERTISE: Self = Self(0xffff_ff02);
    /// NO_EXPORT_SUBCONFED (65535:65283).
    pub const NO_EXPORT_SUBCONFED: Self = Self(0xffff_ff03);

    /// The community `asn:value`.
    pub fn new(asn: u16, value: u16) -> Self {
        Self((u32::from(asn) << 16) | u32::from(value))
    }
}

impl fmt::Display for Community {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.0 >> 16, self.0 & 0xffff)
    }
}

/// A large community (RFC 8092): `global:local1:local2`, 32 bits each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LargeCommunity {
    /// Global administrator, usually an AS.
    pub global_admin: u32,
    /// First local data part.
    pub local_data_1: u32,
    /// Second local data part.
    pub local_data_2: u32,
}

impl fmt::Display for LargeCommunity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}",
            self.global_admin, self.local_data_1, self.local_data_2
        )
    }
}

/// Network layer reachability information of one family.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Nlri {
    /// IPv4 unicast prefixes.
    Ipv4Unicast(Vec<Ipv4Net>),
    /// IPv6 unicast prefixes.
    Ipv6Unicast(Vec<Ipv6Net>),
    /// Any other family, kept as received.
    Other {
        /// The family.
        afi_safi: AfiSafi,
        /// The NLRI octets.
        data: Vec<u8>,
    },
}

impl Nlri {
    /// The family.
    pub fn afi_safi(&self) -> AfiSafi {
        match self {
            Self::Ipv4Unicast(_) => AfiSafi::IPV4_UNICAST,
            Self::Ipv6Unicast(_) => AfiSafi::IPV6_UNICAST,
            Self::Other { afi_safi, .. } => *afi_safi,
        }
    }

    /// True when it holds no prefix.
    pub fn is_empty(&self) -> bool {
        match self {
            Self::Ipv4Unicast(p) => p.is_empty(),
            Self::Ipv6Unicast(p) => p.is_empty(),
            Self::Other { data, .. } => data.is_empty(),
        }
    }

    fn decode(afi_safi: AfiSafi, data: &[u8]) -> Option<Self> {
        Some(match afi_safi {
            AfiSafi::IPV4_UNICAST => Self::Ipv4Unicast(decode_ipv4_prefixes(data)?),
            AfiSafi::IPV6_UNICAST => Self::Ipv6Unicast(decode_ipv6_prefixes(data)?),
            _ => Self::Other {
                afi_safi,
                data: data.to_vec(),
            },
        })
    }

    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Self::Ipv4Unicast(prefixes) => prefixes.iter().for_each(|p| encode_ipv4_prefix(p, out)),
            Self::Ipv6Unicast(prefixes) => prefixes.iter().for_each(|p| encode_ipv6_prefix(p, out)),
            Self::Other { data, .. } => out.extend_from_slice(data),
        }
    }
}

/// The next hop in MP_REACH_NLRI.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MpNextHop {
    /// An IPv4 next hop (4 octets).
    Ipv4(Ipv4Addr),
    /// An IPv6 next hop: global (16 octets), optionally followed by link-local (32 octets in all,
    /// RFC 2545 §3). Also valid for IPv4 NLRI with the extended next hop capability (RFC 8950).
    Ipv6 {
        /// Global address.
        global: Ipv6Addr,
        /// Link-local address of the same interface, when the peer shares a link.
        link_local: Option<Ipv6Addr>,
    },
    /// The next hop of a family this codec does not interpret.
    Other(Vec<u8>),
}

impl MpNextHop {
    /// The IPv6 next hop to send for our own routes (IPv6 prefixes, or IPv4 prefixes with the
    /// extended next hop capability, RFC 8950 §4), or `None` when there is no address at all.
    ///
    /// - `global` alone: 16 octets (RFC 2545 §3).
    /// - `global` and `link_local`: 32 octets, global first.
    /// - `link_local` alone, as on an unnumbered session: 32 octets with the link-local address
    ///   in both fields. A `global` that is itself link-local counts as `link_local`.
    ///
    /// Why the link-local-only case is 32 octets with the address twice, rather than 16 octets
    /// with the link-local address or 32 octets with `::` as global: it is exactly what FRR
    /// sends on an unnumbered session whose interface has no global address (bgpd/bgp_zebra.c,
    /// `bgp_nexthop_set`: "Set link-local address as global"), and what FRR handles best on
    /// receipt:
    /// - FRR ≥ 7.5 tracks the second (link-local) address for both "LL(LL)" and "::(LL)"
    ///   (bgpd/bgp_nht.c `make_prefix`, commit 606fdbb1), and since 7.4 exempts a 32-octet
    ///   next hop's global part from the martian check (bgpd/bgp_route.c, commit 0355b41d).
    /// - With `set ipv6 next-hop prefer-global` FRR installs the first address
    ///   (bgpd/bgp_zebra.c `bgp_path_info_to_ipv6_nexthop`): a link-local one gets the
    ///   interface and works, `::` would not.
    /// - FRR ≥ 10.4 logs "received IPv6 global next-hop as Link-Local, but no capability
    ///   exchanged" for a 16-octet link-local next hop unless the Link-Local Next Hop capability
    ///   (draft-ietf-idr-linklocal-capability), which we do not send, was negotiated.
    pub fn ipv6(global: Option<Ipv6Addr>, link_local: Option<Ipv6Addr>) -> Option<Self> {
        let (global, stray) = match global {
            Some(g) if g.is_unicast_link_local() => (None, Some(g)),
            g => (g, None),
        };
        match (global, link_local.or(stray)) {
            (Some(global), link_local) => Some(Self::Ipv6 { global, link_local }),
            (None, Some(ll)) => Some(Self::Ipv6 {
                global: ll,
                link_local: Some(ll),
            }),
            (None, None) => None,
        }
    }

    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Self::Ipv4(a) => {
                out.push(4);
                out.extend_from_slice(&a.octets());
            }
            Self::Ipv6 { global, link_local } => {
                out.push(if link_local.is_some() { 32 } else { 16 });
                out.extend_from_slice(&global.octets());
                if let Some(ll) = link_local {
                    out.extend_from_slice(&ll.octets());
                }
            }
            Self::Other(raw) => {
                // Decoding bounds it to 255 octets; a longer one built by hand is cut.
                let raw = &raw[..raw.len().min(255)];
                out.push(raw.len() as u8);
                out.extend_from_slice(raw);
            }
        }
    }
}

/// MP_REACH_NLRI (RFC 4760 §3).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MpReach {
    /// Next hop for every prefix.
    pub next_hop: MpNextHop,
    /// Reachable prefixes; their family is the attribute's AFI/SAFI.
    pub nlri: Nlri,
}

impl MpReach {
    fn decode(value: &[u8]) -> Option<Self> {
        let mut r = Reader::new(value);
        let afi_safi = AfiSafi {
            afi: r.u16()?,
            safi: r.u8()?,
        };
        let nh_len = usize::from(r.u8()?);
        let nh = r.take(nh_len)?;
        let _reserved = r.u8()?;
        let v6 = |nh: &[u8]| -> Option<MpNextHop> {
            let global = Ipv6Addr::from(<[u8; 16]>::try_from(nh.get(..16)?).ok()?);
            let link_local = match nh.get(16..) {
                Some([]) => None,
                Some(ll) => Some(Ipv6Addr::from(<[u8; 16]>::try_from(ll).ok()?)),
                None => return None,
            };
            Some(MpNextHop::Ipv6 { global, link_local })
        };
        let next_hop = match (afi_safi, nh_len) {
            (AfiSafi::IPV4_UNICAST, 4) => {
                MpNextHop::Ipv4(Ipv4Addr::from(<[u8; 4]>::try_from(nh).ok()?))
            }
            (AfiSafi::IPV4_UNICAST | AfiSafi::IPV6_UNICAST, 16 | 32) => v6(nh)?,
            (AfiSafi::IPV4_UNICAST | AfiSafi::IPV6_UNICAST, _) => return None,
            _ => MpNextHop::Other(nh.to_vec()),
        };
        Some(Self {
            next_hop,
            nlri: Nlri::decode(afi_safi, r.rest())?,
        })
    }

    fn encode(&self, out: &mut Vec<u8>) {
        let AfiSafi { afi, safi } = self.nlri.afi_safi();
        out.extend_from_slice(&afi.to_be_bytes());
        out.push(safi);
        self.next_hop.encode(out);
        out.push(0);
        self.nlri.encode(out);
    }
}

/// MP_UNREACH_NLRI (RFC 4760 §4).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MpUnreach {
    /// Withdrawn prefixes; empty for an End-of-RIB marker (RFC 4724 §2).
    pub withdrawn: Nlri,
}

impl MpUnreach {
    fn decode(value: &[u8]) -> Option<Self> {
        let mut r = Reader::new(value);
        let afi_safi = AfiSafi {
            afi: r.u16()?,
            safi: r.u8()?,
        };
        Some(Self {
            withdrawn: Nlri::decode(afi_safi, r.rest())?,
        })
    }

    fn encode(&self, out: &mut Vec<u8>) {
        let AfiSafi { afi, safi } = self.withdrawn.afi_safi();
        out.extend_from_slice(&afi.to_be_bytes());
        out.push(safi);
        self.withdrawn.encode(out);
    }
}

/// A path attribute this codec does not interpret, kept as received so it can be passed on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RawAttribute {
    /// Flags as received, without the extended length bit (the encoder sets it when needed).
    pub flags: u8,
    /// Type code.
    pub type_code: u8,
    /// Value.
    pub value: Vec<u8>,
}

/// The path attributes of an UPDATE.
///
/// The encoder writes them in type code order, with the extended length flag only on values
/// longer than 255 octets, as GoBGP does; FRR's encoding differs (it always sets extended length
/// on AS_PATH and MP_REACH_NLRI) and decodes to the same value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct PathAttributes {
    /// ORIGIN (1).
    pub origin: Option<Origin>,
    /// AS_PATH (2).
    pub as_path: Option<AsPath>,
    /// NEXT_HOP (3), for IPv4 NLRI in the UPDATE's own NLRI field.
    pub next_hop: Option<Ipv4Addr>,
    /// MULTI_EXIT_DISC (4).
    pub med: Option<u32>,
    /// LOCAL_PREF (5), iBGP only.
    pub local_pref: Option<u32>,
    /// ATOMIC_AGGREGATE (6).
    pub atomic_aggregate: bool,
    /// AGGREGATOR (7).
    pub aggregator: Option<Aggregator>,
    /// COMMUNITIES (8); empty means absent.
    pub communities: Vec<Community>,
    /// MP_REACH_NLRI (14).
    pub mp_reach: Option<MpReach>,
    /// MP_UNREACH_NLRI (15).
    pub mp_unreach: Option<MpUnreach>,
    /// LARGE_COMMUNITY (32); empty means absent.
    pub large_communities: Vec<LargeCommunity>,
    /// Every other optional attribute, in the order received.
    pub other: Vec<RawAttribute>,
}

/// Expected optional/transitive flag bits of the attributes we interpret.
fn expected_flags(type_code: u8) -> Option<u8> {
    const WELL_KNOWN: u8 = flag::TRANSITIVE;
    const OPT_TRANS: u8 = flag::OPTIONAL | flag::TRANSITIVE;
    Some(match type_code {
        code::ORIGIN
        | code::AS_PATH
        | code::NEXT_HOP
        | code::LOCAL_PREF
        | code::ATOMIC_AGGREGATE => WELL_KNOWN,
        code::MULTI_EXIT_DISC | code::MP_REACH_NLRI | code::MP_UNREACH_NLRI => flag::OPTIONAL,
        code::AGGREGATOR | code::COMMUNITIES | code::LARGE_COMMUNITY => OPT_TRANS,
        _ => return None,
    })
}

fn u32_value(value: &[u8]) -> Option<u32> {
    <[u8; 4]>::try_from(value).ok().map(u32::from_be_bytes)
}

/// The checks before an attribute's value is looked at: RFC 7606 §3 g (a repeated
/// MP_(UN)REACH_NLRI ends the session; any other repeated attribute is discarded), then the
/// optional and transitive flags of the attributes we interpret.
fn screen(seen: &mut SeenCodes, flags: u8, type_code: u8) -> Result<(), Fault> {
    // RFC 7606 resets the session for these errors in MP_(UN)REACH_NLRI only.
    let mp = matches!(type_code, code::MP_REACH_NLRI | code::MP_UNREACH_NLRI);
    let fault = |subcode, action, what| {
        if mp {
            Fault::Reset(subcode, what)
        } else {
            Fault::Soft(subcode, action)
        }
    };
    if !seen.insert(type_code) {
        return Err(fault(
            update_subcode::MALFORMED_ATTRIBUTE_LIST,
            ErrorAction::AttributeDiscard,
            "repeated MP_(UN)REACH_NLRI",
        ));
    }
    if let Some(expected) = expected_flags(type_code)
        && flags & (flag::OPTIONAL | flag::TRANSITIVE) != expected
    {
        return Err(fault(
            update_subcode::ATTRIBUTE_FLAGS_ERROR,
            ErrorAction::TreatAsWithdraw,
            "MP_(UN)REACH_NLRI flags",
        ));
    }
    Ok(())
}

/// AGGREGATOR: an AS number of the session's width and an IPv4 address.
fn decode_aggregator(value: &[u8], ctx: &CodecContext) -> Option<Aggregator> {
    let mut v = Reader::new(value);
    let asn = match (ctx.four_octet_as, value.len()) {
        (true, 8) => v.u32(),
        (false, 6) => v.u16().map(u32::from),
        _ => None,
    }?;
    let a = v.array::<4>()?;
    Some(Aggregator {
        asn,
        address: Ipv4Addr::from(a),
    })
}

/// A list attribute (COMMUNITIES, LARGE_COMMUNITY): one or more values of `width` octets.
fn decode_list<T>(value: &[u8], width: usize, one: impl Fn(&[u8]) -> T) -> Option<Vec<T>> {
    if value.is_empty() || !value.len().is_multiple_of(width) {
        return None;
    }
    Some(value.chunks_exact(width).map(one).collect())
}

/// The big-endian 32-bit word at `at` of a value whose length was checked.
fn word(c: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([c[at], c[at + 1], c[at + 2], c[at + 3]])
}

/// One 12-octet LARGE_COMMUNITY value.
fn large_community(c: &[u8]) -> LargeCommunity {
    LargeCommunity {
        global_admin: word(c, 0),
        local_data_1: word(c, 4),
        local_data_2: word(c, 8),
    }
}

/// What became of one attribute that could not be taken in.
enum Fault {
    /// RFC 7606 lets the session survive: the attribute is left out, with this UPDATE Message
    /// Error subcode and action.
    Soft(u8, ErrorAction),
    /// The session is reset with this UPDATE Message Error subcode; the text says what was wrong.
    Reset(u8, &'static str),
}

/// The type codes already seen in one UPDATE: one bit per code.
#[derive(Default)]
struct SeenCodes([u64; 4]);

impl SeenCodes {
    /// Marks `type_code` seen; false if it was already.
    fn insert(&mut self, type_code: u8) -> bool {
        let (word, bit) = (usize::from(type_code / 64), type_code % 64);
        let fresh = self.0[word] & (1 << bit) == 0;
        self.0[word] |= 1 << bit;
        fresh
    }
}

impl PathAttributes {
    /// Decodes the path attributes field of an UPDATE. Errors that RFC 7606 lets the session
    /// survive are pushed onto `errors` and the attribute is left out; the others are returned.
    pub(crate) fn decode(
        block: &[u8],
        ctx: &CodecContext,
        errors: &mut Vec<AttributeError>,
    ) -> Result<Self, DecodeError> {
        let mut attrs = Self::default();
        let mut seen = SeenCodes::default();
        let mut r = Reader::new(block);
        while !r.is_empty() {
            let whole_start = r.rest();
            let header = (r.u8(), r.u8());
            let (Some(flags), Some(type_code)) = header else {
                // Fewer than three octets left: RFC 7606 §4, treat-as-withdraw.
                errors.push(AttributeError {
                    type_code: 0,
                    subcode: update_subcode::MALFORMED_ATTRIBUTE_LIST,
                    action: ErrorAction::TreatAsWithdraw,
                });
                break;
            };
            let len = if flags & flag::EXTENDED_LENGTH != 0 {
                r.u16()
            } else {
                r.u8().map(u16::from)
            };
            let Some(value) = len.and_then(|len| r.take(usize::from(len))) else {
                // The attribute overruns the field: RFC 7606 §4, treat-as-withdraw, and the
                // total attribute length still locates the NLRI.
                errors.push(AttributeError {
                    type_code,
                    subcode: update_subcode::ATTRIBUTE_LENGTH_ERROR,
                    action: ErrorAction::TreatAsWithdraw,
                });
                break;
            };
            let outcome = screen(&mut seen, flags, type_code)
                .and_then(|()| attrs.take_in(flags, type_code, value, ctx));
            match outcome {
                Ok(()) => {}
                Err(Fault::Soft(subcode, action)) => errors.push(AttributeError {
                    type_code,
                    subcode,
                    action,
                }),
                Err(Fault::Reset(subcode, what)) => {
                    let whole = &whole_start[..whole_start.len() - r.remaining()];
                    return Err(DecodeError::Update {
                        subcode,
                        data: whole.to_vec(),
                        what,
                    });
                }
            }
        }
        // The encoder writes attributes in type code order; keep `other` in that order too so
        // that decode(encode(x)) == x. Type codes are unique: repeats were discarded above.
        attrs.other.sort_by_key(|a| a.type_code);
        Ok(attrs)
    }

    /// Interprets one attribute's value into `self`, or keeps it as received if it is not one we
    /// interpret.
    fn take_in(
        &mut self,
        flags: u8,
        type_code: u8,
        value: &[u8],
        ctx: &CodecContext,
    ) -> Result<(), Fault> {
        let taw = Fault::Soft(
            update_subcode::ATTRIBUTE_LENGTH_ERROR,
            ErrorAction::TreatAsWithdraw,
        );
        let discard = Fault::Soft(
            update_subcode::ATTRIBUTE_LENGTH_ERROR,
            ErrorAction::AttributeDiscard,
        );
        match type_code {
            code::ORIGIN => {
                self.origin = Some(match value {
                    [0] => Origin::Igp,
                    [1] => Origin::Egp,
                    [2] => Origin::Incomplete,
                    [_] => {
                        return Err(Fault::Soft(
                            update_subcode::INVALID_ORIGIN_ATTRIBUTE,
                            ErrorAction::TreatAsWithdraw,
                        ));
                    }
                    _ => return Err(taw),
                });
            }
            code::AS_PATH => {
                let path = AsPath::decode(value, if ctx.four_octet_as { 4 } else { 2 });
                self.as_path = Some(path.ok_or(Fault::Soft(
                    update_subcode::MALFORMED_AS_PATH,
                    ErrorAction::TreatAsWithdraw,
                ))?);
            }
            code::NEXT_HOP => {
                let a = <[u8; 4]>::try_from(value).map_err(|_| taw)?;
                self.next_hop = Some(Ipv4Addr::from(a));
            }
            code::MULTI_EXIT_DISC => self.med = Some(u32_value(value).ok_or(taw)?),
            code::LOCAL_PREF => self.local_pref = Some(u32_value(value).ok_or(taw)?),
            code::ATOMIC_AGGREGATE => {
                if !value.is_empty() {
                    return Err(discard);
                }
                self.atomic_aggregate = true;
            }
            code::AGGREGATOR => {
                self.aggregator = Some(decode_aggregator(value, ctx).ok_or(discard)?);
            }
            code::COMMUNITIES => {
                self.communities = decode_list(value, 4, |c| Community(word(c, 0))).ok_or(taw)?;
            }
            code::LARGE_COMMUNITY => {
                self.large_communities = decode_list(value, 12, large_community).ok_or(taw)?;
            }
            code::MP_REACH_NLRI => {
                self.mp_reach = Some(MpReach::decode(value).ok_or(Fault::Reset(
                    update_subcode::OPTIONAL_ATTRIBUTE_ERROR,
                    "malformed MP_REACH_NLRI",
                ))?);
            }
            code::MP_UNREACH_NLRI => {
                self.mp_unreach = Some(MpUnreach::decode(value).ok_or(Fault::Reset(
                    update_subcode::OPTIONAL_ATTRIBUTE_ERROR,
                    "malformed MP_UNREACH_NLRI",
                ))?);
            }
            code::AS4_PATH | code::AS4_AGGREGATOR if ctx.four_octet_as => {
                // RFC 6793 §6: a NEW speaker discards these from another NEW speaker.
                return Err(Fault::Soft(
                    update_subcode::OPTIONAL_ATTRIBUTE_ERROR,
                    ErrorAction::AttributeDiscard,
                ));
            }
            code::AS4_PATH | code::AS4_AGGREGATOR => self.other.push(RawAttribute {
                flags: (flags | flag::OPTIONAL | flag::TRANSITIVE) & !flag::EXTENDED_LENGTH,
                type_code,
                value: value.to_vec(),
            }),
            _ if flags & flag::OPTIONAL == 0 && expected_flags(type_code).is_none() => {
                return Err(Fault::Reset(
                    update_subcode::UNRECOGNIZED_WELL_KNOWN_ATTRIBUTE,
                    "unrecognized well-known attribute",
                ));
            }
            _ => self.other.push(RawAttribute {
                flags: flags & !flag::EXTENDED_LENGTH,
                type_code,
                value: value.to_vec(),
            }),
        }
        Ok(())
    }

    /// Appends every attribute, in type code order.
    pub(crate) fn encode(&self, ctx: &CodecContext, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        const WK: u8 = flag::TRANSITIVE;
        const OPT: u8 = flag::OPTIONAL;
        const OPT_TRANS: u8 = flag::OPTIONAL | flag::TRANSITIVE;
        let mut other: Vec<&RawAttribute> = self.other.iter().collect();
        other.sort_by_key(|a| a.type_code);
        let mut other = other.into_iter().peekable();
        let mut flush_other_below = |limit: u16, out: &mut Vec<u8>| -> Result<(), EncodeError> {
            while let Some(a) = other.next_if(|a| u16::from(a.type_code) < limit) {
                write_attribute(out, a.flags, a.type_code, |o| o.extend_from_slice(&a.value))?;
            }
            Ok(())
        };
        flush_other_below(u16::from(code::ORIGIN), out)?;
        if let Some(origin) = self.origin {
            write_attribute(out, WK, code::ORIGIN, |o| o.push(origin as u8))?;
        }
        flush_other_below(u16::from(code::AS_PATH), out)?;
        if let Some(path) = &self.as_path {
            let as_len = if ctx.four_octet_as { 4 } else { 2 };
            write_attribute(out, WK, code::AS_PATH, |o| path.encode(as_len, o))?;
        }
        flush_other_below(u16::from(code::NEXT_HOP), out)?;
        if let Some(nh) = self.next_hop {
            write_attribute(out, WK, code::NEXT_HOP, |o| {
                o.extend_from_slice(&nh.octets())
            })?;
        }
        flush_other_below(u16::from(code::MULTI_EXIT_DISC), out)?;
        if let Some(med) = self.med {
            write_attribute(out, OPT, code::MULTI_EXIT_DISC, |o| {
                o.extend_from_slice(&med.to_be_bytes())
            })?;
        }
        flush_other_below(u16::from(code::LOCAL_PREF), out)?;
        if let Some(lp) = self.local_pref {
            write_attribute(out, WK, code::LOCAL_PREF, |o| {
                o.extend_from_slice(&lp.to_be_bytes())
            })?;
        }
        flush_other_below(u16::from(code::ATOMIC_AGGREGATE), out)?;
        if self.atomic_aggregate {
            write_attribute(out, WK, code::ATOMIC_AGGREGATE, |_| {})?;
        }
        flush_other_below(u16::from(code::AGGREGATOR), out)?;
        if let Some(agg) = self.aggregator {
            write_attribute(out, OPT_TRANS, code::AGGREGATOR, |o| {
                if ctx.four_octet_as {
                    o.extend_from_slice(&agg.asn.to_be_bytes());
                } else {
                    o.extend_from_slice(&u16::try_from(agg.asn).unwrap_or(AS_TRANS).to_be_bytes());
                }
                o.extend_from_slice(&agg.address.octets());
            })?;
        }
        flush_other_below(u16::from(code::COMMUNITIES), out)?;
        if !self.communities.is_empty() {
            write_attribute(out, OPT_TRANS, code::COMMUNITIES, |o| {
                self.communities
                    .iter()
                    .for_each(|c| o.extend_from_slice(&c.0.to_be_bytes()));
            })?;
        }
        flush_other_below(u16::from(code::MP_REACH_NLRI), out)?;
        if let Some(reach) = &self.mp_reach {
            write_attribute(out, OPT, code::MP_REACH_NLRI, |o| reach.encode(o))?;
        }
        flush_other_below(u16::from(code::MP_UNREACH_NLRI), out)?;
        if let Some(unreach) = &self.mp_unreach {
            write_attribute(out, OPT, code::MP_UNREACH_NLRI, |o| unreach.encode(o))?;
        }
        flush_other_below(u16::from(code::LARGE_COMMUNITY), out)?;
        if !self.large_communities.is_empty() {
            write_attribute(out, OPT_TRANS, code::LARGE_COMMUNITY, |o| {
                for c in &self.large_communities {
                    o.extend_from_slice(&c.global_admin.to_be_bytes());
                    o.extend_from_slice(&c.local_data_1.to_be_bytes());
                    o.extend_from_slice(&c.local_data_2.to_be_bytes());
                }
            })?;
        }
        flush_other_below(256, out)
    }

    /// Attributes that must be present when the UPDATE announces routes, and are not
    /// (RFC 7606 §3 d: treat-as-withdraw). NEXT_HOP is needed only for the NLRI field.
    pub(crate) fn missing_mandatory(&self, has_ipv4_nlri: bool) -> impl Iterator<Item = u8> {
        [
            (code::ORIGIN, self.origin.is_none()),
            (code::AS_PATH, self.as_path.is_none()),
            (code::NEXT_HOP, has_ipv4_nlri && self.next_hop.is_none()),
        ]
        .into_iter()
        .filter_map(|(c, missing)| missing.then_some(c))
    }
}

/// Appends flags, type, length and the value `write` produces, with the extended length flag
/// only when the value exceeds 255 octets.
fn write_attribute(
    out: &mut Vec<u8>,
    flags: u8,
    type_code: u8,
    write: impl FnOnce(&mut Vec<u8>),
) -> Result<(), EncodeError> {
    let start = out.len();
    out.extend_from_slice(&[flags & !flag::EXTENDED_LENGTH, type_code, 0]);
    write(out);
    let len = out.len() - start - 3;
    if len > 255 {
        let len = u16::try_from(len).map_err(|_| EncodeError::AttributeTooLong { type_code })?;
        out[start] |= flag::EXTENDED_LENGTH;
        let [hi, lo] = len.to_be_bytes();
        out[start + 2] = hi;
        out.insert(start + 3, lo);
    } else {
        out[start + 2] = len as u8;
    }
    Ok(())
}
