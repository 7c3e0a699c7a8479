//! Capabilities advertised in OPEN (RFC 5492).

use super::error::{DecodeError, EncodeError};
use super::iana::{afi, capability as code, safi};
use super::reader::Reader;

/// An address family and subsequent address family pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AfiSafi {
    /// Address family identifier ([`afi`]).
    pub afi: u16,
    /// Subsequent address family identifier ([`safi`]).
    pub safi: u8,
}

impl AfiSafi {
    /// IPv4 unicast.
    pub const IPV4_UNICAST: Self = Self {
        afi: afi::IPV4,
        safi: safi::UNICAST,
    };
    /// IPv6 unicast.
    pub const IPV6_UNICAST: Self = Self {
        afi: afi::IPV6,
        safi: safi::UNICAST,
    };
}

/// One entry of the extended next hop capability (RFC 8950 §3): NLRI of `afi`/`safi` may carry
/// a next hop of `next_hop_afi`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExtendedNextHop {
    /// NLRI address family.
    pub afi: u16,
    /// NLRI subsequent address family (two octets in this capability).
    pub safi: u16,
    /// Address family of the next hop.
    pub next_hop_afi: u16,
}

impl ExtendedNextHop {
    /// IPv4 unicast NLRI with an IPv6 next hop (`00 01 00 01 00 02` on the wire): what a
    /// session needs to carry IPv4 prefixes when it has no IPv4 next hop, as on an unnumbered
    /// (IPv6 link-local) session.
    pub const IPV4_UNICAST_OVER_IPV6: Self = Self {
        afi: afi::IPV4,
        // Widening a u8 to u16; `u16::from` is not usable in a constant.
        safi: safi::UNICAST as u16,
        next_hop_afi: afi::IPV6,
    };
}

/// One address family in the graceful restart capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GracefulRestartFamily {
    /// The family.
    pub afi_safi: AfiSafi,
    /// The F bit: forwarding state was preserved across the restart.
    pub forwarding_preserved: bool,
}

/// The graceful restart capability (RFC 4724 §3, N bit from RFC 8538).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GracefulRestart {
    /// The R bit: the sender has restarted.
    pub restart_state: bool,
    /// The N bit: the sender supports graceful restart for NOTIFICATION (RFC 8538).
    pub notification: bool,
    /// Seconds the peer should keep our routes after the session drops (12 bits).
    pub restart_time: u16,
    /// Families for which graceful restart is supported.
    pub families: Vec<GracefulRestartFamily>,
}

/// A capability in an OPEN message.
///
/// Capabilities a speaker does not use, and malformed instances of the ones that are safe to
/// ignore (route refresh, extended next hop, graceful restart, FQDN), are kept as
/// [`Capability::Unknown`] so that decoding never fails on them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Capability {
    /// Multiprotocol extensions for one family (code 1, RFC 4760).
    Multiprotocol(AfiSafi),
    /// Route refresh (code 2, RFC 2918).
    RouteRefresh,
    /// Extended next hop encoding (code 5, RFC 8950).
    ExtendedNextHop(Vec<ExtendedNextHop>),
    /// Graceful restart (code 64, RFC 4724).
    GracefulRestart(GracefulRestart),
    /// Support for 4-octet AS numbers, with the sender's AS (code 65, RFC 6793).
    FourOctetAs(u32),
    /// Hostname and domain name (code 73), as FRR and GoBGP send them. Informational only.
    Fqdn {
        /// Host name.
        hostname: String,
        /// Domain name (often empty).
        domain: String,
    },
    /// Any other capability, or a malformed one that is safe to ignore, kept as received.
    Unknown {
        /// Capability code.
        code: u8,
        /// Capability value.
        value: Vec<u8>,
    },
}

impl Capability {
    /// The capability code.
    pub fn code(&self) -> u8 {
        match self {
            Self::Multiprotocol(_) => code::MULTIPROTOCOL,
            Self::RouteRefresh => code::ROUTE_REFRESH,
            Self::ExtendedNextHop(_) => code::EXTENDED_NEXT_HOP,
            Self::GracefulRestart(_) => code::GRACEFUL_RESTART,
            Self::FourOctetAs(_) => code::FOUR_OCTET_AS,
            Self::Fqdn { .. } => code::FQDN,
            Self::Unknown { code, .. } => *code,
        }
    }

    /// Decodes one capability value.
    pub(crate) fn decode(cap_code: u8, value: &[u8]) -> Result<Self, DecodeError> {
        let malformed = DecodeError::MalformedOpen { what: "capability" };
        let mut r = Reader::new(value);
        let decoded = match cap_code {
            code::MULTIPROTOCOL => {
                let (Some(afi), Some(_reserved), Some(safi), true) =
                    (r.u16(), r.u8(), r.u8(), value.len() == 4)
                else {
                    return Err(malformed);
                };
                Some(Self::Multiprotocol(AfiSafi { afi, safi }))
            }
            code::FOUR_OCTET_AS => match (r.u32(), value.len()) {
                (Some(asn), 4) => Some(Self::FourOctetAs(asn)),
                _ => return Err(malformed),
            },
            code::ROUTE_REFRESH => value.is_empty().then_some(Self::RouteRefresh),
            code::EXTENDED_NEXT_HOP => decode_extended_next_hop(value),
            code::GRACEFUL_RESTART => decode_graceful_restart(value),
            code::FQDN => decode_fqdn(value),
            _ => None,
        };
        Ok(decoded.unwrap_or_else(|| Self::Unknown {
            code: cap_code,
            value: value.to_vec(),
        }))
    }

    /// Code, length and value, as in an OPEN (or in the data of an Unsupported Capability
    /// NOTIFICATION, RFC 5492 §5).
    pub fn to_bytes(&self) -> Result<Vec<u8>, EncodeError> {
        let mut out = Vec::new();
        self.encode(&mut out)?;
        Ok(out)
    }

    /// Appends code, length and value.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        out.push(self.code());
        let len_at = out.len();
        out.push(0);
        match self {
            Self::Multiprotocol(AfiSafi { afi, safi }) => {
                out.extend_from_slice(&afi.to_be_bytes());
                out.push(0);
                out.push(*safi);
            }
            Self::RouteRefresh => {}
            Self::ExtendedNextHop(entries) => {
                for e in entries {
                    out.extend_from_slice(&e.afi.to_be_bytes());
                    out.extend_from_slice(&e.safi.to_be_bytes());
                    out.extend_from_slice(&e.next_hop_afi.to_be_bytes());
                }
            }
            Self::GracefulRestart(gr) => {
                let mut head = gr.restart_time & 0x0fff;
                if gr.restart_state {
                    head |= 0x8000;
                }
                if gr.notification {
                    head |= 0x4000;
                }
                out.extend_from_slice(&head.to_be_bytes());
                for f in &gr.families {
                    out.extend_from_slice(&f.afi_safi.afi.to_be_bytes());
                    out.push(f.afi_safi.safi);
                    out.push(if f.forwarding_preserved { 0x80 } else { 0 });
                }
            }
            Self::FourOctetAs(asn) => out.extend_from_slice(&asn.to_be_bytes()),
            Self::Fqdn { hostname, domain } => {
                for s in [hostname, domain] {
                    let len = u8::try_from(s.len())
                        .map_err(|_| EncodeError::CapabilityTooLong { code: code::FQDN })?;
                    out.push(len);
                    out.extend_from_slice(s.as_bytes());
                }
            }
            Self::Unknown { value, .. } => out.extend_from_slice(value),
        }
        let len = u8::try_from(out.len() - len_at - 1)
            .map_err(|_| EncodeError::CapabilityTooLong { code: self.code() })?;
        out[len_at] = len;
        Ok(())
    }
}

/// Entries of six octets (RFC 8950 §3), at least one; anything else is malformed, and kept as
/// [`Capability::Unknown`] (ignoring it only means IPv4 keeps IPv4 next hops).
fn decode_extended_next_hop(value: &[u8]) -> Option<Capability> {
    if value.is_empty() || !value.len().is_multiple_of(6) {
        return None;
    }
    let entries = value
        .chunks_exact(6)
        .map(|c| ExtendedNextHop {
            afi: u16::from_be_bytes([c[0], c[1]]),
            safi: u16::from_be_bytes([c[2], c[3]]),
            next_hop_afi: u16::from_be_bytes([c[4], c[5]]),
        })
        .collect();
    Some(Capability::ExtendedNextHop(entries))
}

fn decode_graceful_restart(value: &[u8]) -> Option<Capability> {
    let mut r = Reader::new(value);
    let head = r.u16()?;
    if !r.remaining().is_multiple_of(4) {
        return None;
    }
    let families = r
        .rest()
        .chunks_exact(4)
        .map(|c| GracefulRestartFamily {
            afi_safi: AfiSafi {
                afi: u16::from_be_bytes([c[0], c[1]]),
                safi: c[2],
            },
            forwarding_preserved: c[3] & 0x80 != 0,
        })
        .collect();
    Some(Capability::GracefulRestart(GracefulRestart {
        restart_state: head & 0x8000 != 0,
        notification: head & 0x4000 != 0,
        restart_time: head & 0x0fff,
        families,
    }))
}

fn decode_fqdn(value: &[u8]) -> Option<Capability> {
    let mut r = Reader::new(value);
    let host_len = r.u8()?;
    let hostname = std::str::from_utf8(r.take(usize::from(host_len))?).ok()?;
    // Some old implementations send only the host name.
    let domain = match r.u8() {
        None => "",
        Some(len) => std::str::from_utf8(r.take(usize::from(len))?).ok()?,
    };
    if !r.is_empty() {
        return None;
    }
    Some(Capability::Fqdn {
        hostname: hostname.to_owned(),
        domain: domain.to_owned(),
    })
}
