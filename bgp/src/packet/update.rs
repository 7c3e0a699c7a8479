//! The UPDATE message (RFC 4271 §4.3), NLRI prefixes, and packing many prefixes into messages.

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};

use super::attribute::{MpNextHop, MpReach, MpUnreach, Nlri, PathAttributes};
use super::capability::AfiSafi;
use super::error::{AttributeError, DecodeError, EncodeError, ErrorAction};
use super::iana::update_subcode;
use super::message::{CodecContext, HEADER_LEN, MAX_MESSAGE_LEN, Message};
use super::reader::Reader;

/// An UPDATE message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Update {
    /// IPv4 unicast prefixes withdrawn in the Withdrawn Routes field.
    pub withdrawn: Vec<Ipv4Net>,
    /// Path attributes, including MP_REACH_NLRI and MP_UNREACH_NLRI.
    pub attributes: PathAttributes,
    /// IPv4 unicast prefixes announced in the NLRI field.
    pub nlri: Vec<Ipv4Net>,
    /// Malformed attributes the session survives (RFC 7606), found while decoding. Never
    /// encoded; empty on every UPDATE built by hand.
    pub errors: Vec<AttributeError>,
}

impl Update {
    /// True when RFC 7606 says to treat every route this UPDATE announces as withdrawn.
    pub fn treat_as_withdraw(&self) -> bool {
        self.errors
            .iter()
            .any(|e| e.action == ErrorAction::TreatAsWithdraw)
    }

    /// The family this UPDATE marks as End-of-RIB (RFC 4724 §2), if it is such a marker.
    pub fn end_of_rib(&self) -> Option<AfiSafi> {
        if !self.withdrawn.is_empty() || !self.nlri.is_empty() {
            return None;
        }
        let a = &self.attributes;
        if *a == PathAttributes::default() {
            return Some(AfiSafi::IPV4_UNICAST);
        }
        match &a.mp_unreach {
            Some(MpUnreach { withdrawn }) if withdrawn.is_empty() => {
                let only = PathAttributes {
                    mp_unreach: a.mp_unreach.clone(),
                    ..PathAttributes::default()
                };
                (*a == only).then(|| withdrawn.afi_safi())
            }
            _ => None,
        }
    }

    /// The End-of-RIB marker for `afi_safi` (RFC 4724 §2).
    pub fn end_of_rib_marker(afi_safi: AfiSafi) -> Self {
        if afi_safi == AfiSafi::IPV4_UNICAST {
            return Self::default();
        }
        let withdrawn = match afi_safi {
            AfiSafi::IPV6_UNICAST => Nlri::Ipv6Unicast(Vec::new()),
            _ => Nlri::Other {
                afi_safi,
                data: Vec::new(),
            },
        };
        let attributes = PathAttributes {
            mp_unreach: Some(MpUnreach { withdrawn }),
            ..PathAttributes::default()
        };
        Self {
            attributes,
            ..Self::default()
        }
    }

    pub(crate) fn decode(body: &[u8], ctx: &CodecContext) -> Result<Self, DecodeError> {
        let mut r = Reader::new(body);
        let framing = |what| DecodeError::Update {
            subcode: update_subcode::MALFORMED_ATTRIBUTE_LIST,
            data: Vec::new(),
            what,
        };
        let invalid_network = |what| DecodeError::Update {
            subcode: update_subcode::INVALID_NETWORK_FIELD,
            data: Vec::new(),
            what,
        };
        let withdrawn_len = r.u16().ok_or(framing("withdrawn routes length"))?;
        let withdrawn = r
            .take(usize::from(withdrawn_len))
            .ok_or(framing("withdrawn routes length"))?;
        let attrs_len = r.u16().ok_or(framing("total path attribute length"))?;
        let attrs = r
            .take(usize::from(attrs_len))
            .ok_or(framing("total path attribute length"))?;
        let withdrawn =
            decode_ipv4_prefixes(withdrawn).ok_or(invalid_network("withdrawn routes"))?;
        let mut errors = Vec::new();
        let attributes = PathAttributes::decode(attrs, ctx, &mut errors)?;
        let nlri = decode_ipv4_prefixes(r.rest()).ok_or(invalid_network("NLRI"))?;
        let announces = !nlri.is_empty()
            || attributes
                .mp_reach
                .as_ref()
                .is_some_and(|m| !m.nlri.is_empty());
        if announces {
            for type_code in attributes.missing_mandatory(!nlri.is_empty()) {
                errors.push(AttributeError {
                    type_code,
                    subcode: update_subcode::MISSING_WELL_KNOWN_ATTRIBUTE,
                    action: ErrorAction::TreatAsWithdraw,
                });
            }
        }
        Ok(Self {
            withdrawn,
            attributes,
            nlri,
            errors,
        })
    }

    pub(crate) fn encode_body(
        &self,
        ctx: &CodecContext,
        out: &mut Vec<u8>,
    ) -> Result<(), EncodeError> {
        let at = out.len();
        out.extend_from_slice(&[0, 0]);
        self.withdrawn
            .iter()
            .for_each(|p| encode_ipv4_prefix(p, out));
        write_len_u16(out, at)?;
        let at = out.len();
        out.extend_from_slice(&[0, 0]);
        self.attributes.encode(ctx, out)?;
        write_len_u16(out, at)?;
        self.nlri.iter().for_each(|p| encode_ipv4_prefix(p, out));
        Ok(())
    }

    /// UPDATEs announcing `prefixes` with `attributes` (whose NEXT_HOP must be set), as few as
    /// fit in 4096 octets each.
    pub fn announce_ipv4(
        attributes: &PathAttributes,
        prefixes: &[Ipv4Net],
        ctx: &CodecContext,
    ) -> Result<Vec<Self>, EncodeError> {
        let budget = nlri_budget(attributes, ctx, 0)?;
        Ok(chunks(prefixes, budget, ipv4_prefix_len)
            .map(|chunk| Self {
                attributes: attributes.clone(),
                nlri: chunk.to_vec(),
                ..Self::default()
            })
            .collect())
    }

    /// UPDATEs announcing IPv6 unicast `prefixes` in MP_REACH_NLRI with `next_hop`, alongside
    /// `attributes` without their NEXT_HOP (RFC 4760 §3: an UPDATE whose only NLRI is in
    /// MP_REACH_NLRI should not carry one), as few as fit in 4096 octets each.
    pub fn announce_ipv6(
        attributes: &PathAttributes,
        next_hop: MpNextHop,
        prefixes: &[Ipv6Net],
        ctx: &CodecContext,
    ) -> Result<Vec<Self>, EncodeError> {
        announce_mp(
            attributes,
            next_hop,
            prefixes,
            ctx,
            Nlri::Ipv6Unicast,
            ipv6_prefix_len,
        )
    }

    /// UPDATEs announcing IPv4 unicast `prefixes` in MP_REACH_NLRI (AFI 1, SAFI 1) with
    /// `next_hop`, alongside `attributes` without their NEXT_HOP, as few as fit in 4096 octets
    /// each. This is how IPv4 prefixes travel with an IPv6 next hop once the extended next hop
    /// capability is negotiated (RFC 8950 §4); a NEXT_HOP attribute would only contradict it
    /// (RFC 4760 §3 says not to send one with no NLRI outside MP_REACH_NLRI).
    pub fn announce_ipv4_mp(
        attributes: &PathAttributes,
        next_hop: MpNextHop,
        prefixes: &[Ipv4Net],
        ctx: &CodecContext,
    ) -> Result<Vec<Self>, EncodeError> {
        announce_mp(
            attributes,
            next_hop,
            prefixes,
            ctx,
            Nlri::Ipv4Unicast,
            ipv4_prefix_len,
        )
    }

    /// UPDATEs withdrawing IPv4 unicast `prefixes`, as few as fit in 4096 octets each.
    pub fn withdraw_ipv4(prefixes: &[Ipv4Net]) -> Vec<Self> {
        let budget = MAX_MESSAGE_LEN - HEADER_LEN - 4;
        chunks(prefixes, budget, ipv4_prefix_len)
            .map(|chunk| Self {
                withdrawn: chunk.to_vec(),
                ..Self::default()
            })
            .collect()
    }

    /// UPDATEs withdrawing IPv6 unicast `prefixes` in MP_UNREACH_NLRI, as few as fit in 4096
    /// octets each.
    pub fn withdraw_ipv6(prefixes: &[Ipv6Net]) -> Vec<Self> {
        withdraw_mp(prefixes, Nlri::Ipv6Unicast, ipv6_prefix_len)
    }

    /// UPDATEs withdrawing IPv4 unicast `prefixes` in MP_UNREACH_NLRI (AFI 1, SAFI 1), as few
    /// as fit in 4096 octets each: the counterpart of [`Update::announce_ipv4_mp`], so that a
    /// session that announces IPv4 in MP_REACH_NLRI also withdraws it there.
    pub fn withdraw_ipv4_mp(prefixes: &[Ipv4Net]) -> Vec<Self> {
        withdraw_mp(prefixes, Nlri::Ipv4Unicast, ipv4_prefix_len)
    }
}

/// UPDATEs announcing `prefixes` in MP_REACH_NLRI, the family given by `nlri`.
fn announce_mp<T: Clone>(
    attributes: &PathAttributes,
    next_hop: MpNextHop,
    prefixes: &[T],
    ctx: &CodecContext,
    nlri: fn(Vec<T>) -> Nlri,
    size: fn(&T) -> usize,
) -> Result<Vec<Update>, EncodeError> {
    let mut with_reach = attributes.clone();
    with_reach.next_hop = None;
    with_reach.mp_reach = Some(MpReach {
        next_hop,
        nlri: nlri(Vec::new()),
    });
    // One more octet in case MP_REACH_NLRI grows past 255 octets and needs extended length.
    let budget = nlri_budget(&with_reach, ctx, 1)?;
    Ok(chunks(prefixes, budget, size)
        .map(|chunk| {
            let mut attrs = with_reach.clone();
            if let Some(reach) = &mut attrs.mp_reach {
                reach.nlri = nlri(chunk.to_vec());
            }
            Update {
                attributes: attrs,
                ..Update::default()
            }
        })
        .collect())
}

/// UPDATEs withdrawing `prefixes` in MP_UNREACH_NLRI, the family given by `nlri`.
fn withdraw_mp<T: Clone>(
    prefixes: &[T],
    nlri: fn(Vec<T>) -> Nlri,
    size: fn(&T) -> usize,
) -> Vec<Update> {
    // Header, two length fields, attribute header with extended length, AFI/SAFI.
    let budget = MAX_MESSAGE_LEN - HEADER_LEN - 4 - 4 - 3;
    chunks(prefixes, budget, size)
        .map(|chunk| Update {
            attributes: PathAttributes {
                mp_unreach: Some(MpUnreach {
                    withdrawn: nlri(chunk.to_vec()),
                }),
                ..PathAttributes::default()
            },
            ..Update::default()
        })
        .collect()
}

/// Octets left for NLRI in a message carrying `attributes`, minus `slack`.
fn nlri_budget(
    attributes: &PathAttributes,
    ctx: &CodecContext,
    slack: usize,
) -> Result<usize, EncodeError> {
    let mut scratch = Vec::new();
    attributes.encode(ctx, &mut scratch)?;
    let fixed = HEADER_LEN + 4 + scratch.len() + slack;
    MAX_MESSAGE_LEN
        .checked_sub(fixed)
        .filter(|b| *b >= 17)
        .ok_or(EncodeError::MessageTooLong { length: fixed })
}

/// Splits `items` greedily into runs whose encoded sizes add up to at most `budget`.
fn chunks<T>(items: &[T], budget: usize, size: fn(&T) -> usize) -> impl Iterator<Item = &[T]> {
    let mut rest = items;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut used = 0;
        let n = rest
            .iter()
            .take_while(|p| {
                used += size(p);
                used <= budget
            })
            .count()
            .max(1);
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Some(head)
    })
}

fn write_len_u16(out: &mut [u8], at: usize) -> Result<(), EncodeError> {
    let len = out.len() - at - 2;
    let len = u16::try_from(len).map_err(|_| EncodeError::MessageTooLong { length: len })?;
    let [hi, lo] = len.to_be_bytes();
    out[at] = hi;
    out[at + 1] = lo;
    Ok(())
}

fn ipv4_prefix_len(p: &Ipv4Net) -> usize {
    1 + usize::from(p.prefix_len()).div_ceil(8)
}

fn ipv6_prefix_len(p: &Ipv6Net) -> usize {
    1 + usize::from(p.prefix_len()).div_ceil(8)
}

/// Decodes a run of (length, prefix) pairs; `None` when a length exceeds `MAX` bits or a prefix
/// overruns. Bits past the prefix length are cleared.
fn decode_prefixes<const BYTES: usize, T>(
    buf: &[u8],
    make: impl Fn([u8; BYTES], u8) -> Option<T>,
) -> Option<Vec<T>> {
    let mut r = Reader::new(buf);
    let mut out = Vec::new();
    while !r.is_empty() {
        let len = r.u8()?;
        if usize::from(len) > BYTES * 8 {
            return None;
        }
        let bytes = r.take(usize::from(len).div_ceil(8))?;
        let mut addr = [0u8; BYTES];
        addr[..bytes.len()].copy_from_slice(bytes);
        out.push(make(addr, len)?);
    }
    Some(out)
}

pub(crate) fn decode_ipv4_prefixes(buf: &[u8]) -> Option<Vec<Ipv4Net>> {
    decode_prefixes::<4, _>(buf, |a, len| {
        Ipv4Net::new(Ipv4Addr::from(a), len).ok().map(|n| n.trunc())
    })
}

pub(crate) fn decode_ipv6_prefixes(buf: &[u8]) -> Option<Vec<Ipv6Net>> {
    decode_prefixes::<16, _>(buf, |a, len| {
        Ipv6Net::new(Ipv6Addr::from(a), len).ok().map(|n| n.trunc())
    })
}

pub(crate) fn encode_ipv4_prefix(p: &Ipv4Net, out: &mut Vec<u8>) {
    let p = p.trunc();
    out.push(p.prefix_len());
    out.extend_from_slice(&p.addr().octets()[..usize::from(p.prefix_len()).div_ceil(8)]);
}

pub(crate) fn encode_ipv6_prefix(p: &Ipv6Net, out: &mut Vec<u8>) {
    let p = p.trunc();
    out.push(p.prefix_len());
    out.extend_from_slice(&p.addr().octets()[..usize::from(p.prefix_len()).div_ceil(8)]);
}

impl From<Update> for Message {
    fn from(update: Update) -> Self {
        Self::Update(update)
    }
}
