//! The message header and the OPEN, NOTIFICATION, KEEPALIVE and ROUTE-REFRESH messages.

use std::net::Ipv4Addr;

use super::capability::{AfiSafi, Capability, ExtendedNextHop};
use super::error::{DecodeError, EncodeError};
use super::iana::{self, cease_subcode, error_code, message_type, optional_parameter};
use super::reader::Reader;
use super::update::Update;

/// The 16-octet marker that starts every message.
pub const MARKER: [u8; 16] = [0xff; 16];
/// Length of the message header: marker, length and type.
pub const HEADER_LEN: usize = 19;
/// The largest message without the extended message capability (RFC 4271 §4.1).
pub const MAX_MESSAGE_LEN: usize = 4096;
/// The only BGP version there is.
pub const BGP_VERSION: u8 = 4;

/// What the session negotiated that changes how messages are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CodecContext {
    /// Both sides advertised the 4-octet AS capability (RFC 6793): AS numbers in AS_PATH and
    /// AGGREGATOR are four octets, and AS4_PATH / AS4_AGGREGATOR are discarded on receipt.
    pub four_octet_as: bool,
}

impl Default for CodecContext {
    /// A session with 4-octet AS numbers, as every current implementation negotiates.
    fn default() -> Self {
        Self {
            four_octet_as: true,
        }
    }
}

/// A BGP message.
// An UPDATE is a few hundred bytes inline; messages are decoded and handled one at a time, so
// boxing it would cost an allocation per message for no gain.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// OPEN (type 1).
    Open(Open),
    /// UPDATE (type 2).
    Update(Update),
    /// NOTIFICATION (type 3).
    Notification(Notification),
    /// KEEPALIVE (type 4).
    Keepalive,
    /// ROUTE-REFRESH (type 5).
    RouteRefresh(RouteRefresh),
}

impl Message {
    /// The message type octet.
    pub fn message_type(&self) -> u8 {
        match self {
            Self::Open(_) => message_type::OPEN,
            Self::Update(_) => message_type::UPDATE,
            Self::Notification(_) => message_type::NOTIFICATION,
            Self::Keepalive => message_type::KEEPALIVE,
            Self::RouteRefresh(_) => message_type::ROUTE_REFRESH,
        }
    }

    /// Checks the header at the front of `buf` and returns the length of the whole message, or
    /// `None` if fewer than 19 octets have arrived. A stream reader calls this, waits until that
    /// many octets are buffered, and hands exactly them to [`Message::decode`].
    pub fn frame_len(buf: &[u8]) -> Result<Option<usize>, DecodeError> {
        let Some(header) = buf.get(..HEADER_LEN) else {
            return Ok(None);
        };
        if header[..16] != MARKER {
            return Err(DecodeError::ConnectionNotSynchronized);
        }
        let length = u16::from_be_bytes([header[16], header[17]]);
        let len = usize::from(length);
        let bad_length = DecodeError::BadMessageLength { length };
        if !(HEADER_LEN..=MAX_MESSAGE_LEN).contains(&len) {
            return Err(bad_length);
        }
        let ok = match header[18] {
            message_type::OPEN => len >= HEADER_LEN + 10,
            message_type::UPDATE => len >= HEADER_LEN + 4,
            message_type::NOTIFICATION => len >= HEADER_LEN + 2,
            message_type::KEEPALIVE => len == HEADER_LEN,
            message_type::ROUTE_REFRESH => len == HEADER_LEN + 4,
            other => {
                return Err(DecodeError::BadMessageType {
                    message_type: other,
                });
            }
        };
        if ok { Ok(Some(len)) } else { Err(bad_length) }
    }

    /// Decodes one whole message, header included. `frame` must be exactly one message, as
    /// [`Message::frame_len`] delimits it.
    pub fn decode(frame: &[u8], ctx: &CodecContext) -> Result<Self, DecodeError> {
        let len = match Self::frame_len(frame)? {
            Some(len) => len,
            None => {
                let length = u16::try_from(frame.len()).unwrap_or(u16::MAX);
                return Err(DecodeError::BadMessageLength { length });
            }
        };
        if frame.len() != len {
            let length = u16::try_from(len).unwrap_or(u16::MAX);
            return Err(DecodeError::BadMessageLength { length });
        }
        let body = &frame[HEADER_LEN..];
        Ok(match frame[18] {
            message_type::OPEN => Self::Open(Open::decode(body)?),
            message_type::UPDATE => Self::Update(Update::decode(body, ctx)?),
            message_type::NOTIFICATION => Self::Notification(Notification::decode(body)),
            message_type::KEEPALIVE => Self::Keepalive,
            // frame_len only lets the five types through.
            _ => Self::RouteRefresh(RouteRefresh::decode(body)),
        })
    }

    /// Appends the encoded message, header included, to `out`. On error `out` is left as it was.
    pub fn encode(&self, ctx: &CodecContext, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let start = out.len();
        out.extend_from_slice(&MARKER);
        out.extend_from_slice(&[0, 0, self.message_type()]);
        let result = match self {
            Self::Open(open) => open.encode_body(out),
            Self::Update(update) => update.encode_body(ctx, out),
            Self::Notification(n) => {
                out.extend_from_slice(&[n.code, n.subcode]);
                out.extend_from_slice(&n.data);
                Ok(())
            }
            Self::Keepalive => Ok(()),
            Self::RouteRefresh(rr) => {
                out.extend_from_slice(&rr.afi_safi.afi.to_be_bytes());
                out.extend_from_slice(&[rr.subtype, rr.afi_safi.safi]);
                Ok(())
            }
        };
        let result = result.and_then(|()| finish_header(out, start));
        if result.is_err() {
            out.truncate(start);
        }
        result
    }

    /// The encoded message as a new buffer.
    pub fn to_bytes(&self, ctx: &CodecContext) -> Result<Vec<u8>, EncodeError> {
        let mut out = Vec::new();
        self.encode(ctx, &mut out)?;
        Ok(out)
    }
}

/// Writes the length of the message that starts at `start` into its header.
pub(crate) fn finish_header(out: &mut [u8], start: usize) -> Result<(), EncodeError> {
    let length = out.len() - start;
    if length > MAX_MESSAGE_LEN {
        return Err(EncodeError::MessageTooLong { length });
    }
    // length <= 4096 fits.
    let field = (length as u16).to_be_bytes();
    out[start + 16] = field[0];
    out[start + 17] = field[1];
    Ok(())
}

/// An OPEN message (RFC 4271 §4.2). The version is always 4.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Open {
    /// The "My Autonomous System" field: the AS, or AS_TRANS (23456) when it needs 4 octets.
    pub my_as: u16,
    /// Proposed hold time in seconds: 0, or at least 3.
    pub hold_time: u16,
    /// BGP Identifier.
    pub bgp_id: Ipv4Addr,
    /// Capabilities in the order received, from every capabilities optional parameter.
    pub capabilities: Vec<Capability>,
}

impl Open {
    /// An OPEN for `asn`: sets "My Autonomous System" to AS_TRANS when `asn` needs 4 octets and
    /// adds the 4-octet AS capability when `capabilities` lacks it.
    pub fn new(
        asn: u32,
        hold_time: u16,
        bgp_id: Ipv4Addr,
        mut capabilities: Vec<Capability>,
    ) -> Self {
        if !capabilities
            .iter()
            .any(|c| matches!(c, Capability::FourOctetAs(_)))
        {
            capabilities.push(Capability::FourOctetAs(asn));
        }
        Self {
            my_as: u16::try_from(asn).unwrap_or(iana::AS_TRANS),
            hold_time,
            bgp_id,
            capabilities,
        }
    }

    /// The 4-octet AS the peer advertised, if it supports 4-octet AS numbers.
    pub fn four_octet_as(&self) -> Option<u32> {
        self.capabilities.iter().find_map(|c| match c {
            Capability::FourOctetAs(asn) => Some(*asn),
            _ => None,
        })
    }

    /// The sender's AS: from the 4-octet AS capability when present, else "My Autonomous System".
    pub fn asn(&self) -> u32 {
        self.four_octet_as().unwrap_or(u32::from(self.my_as))
    }

    /// The entries of the sender's extended next hop capabilities (RFC 8950 §3); empty when it
    /// sent none.
    pub fn extended_next_hops(&self) -> impl Iterator<Item = ExtendedNextHop> + '_ {
        self.capabilities
            .iter()
            .filter_map(|c| match c {
                Capability::ExtendedNextHop(entries) => Some(entries.iter().copied()),
                _ => None,
            })
            .flatten()
    }

    /// The families the sender advertised; IPv4 unicast alone when it sent no multiprotocol
    /// capability (RFC 4760 §8).
    pub fn families(&self) -> Vec<AfiSafi> {
        let mut families: Vec<AfiSafi> = self
            .capabilities
            .iter()
            .filter_map(|c| match c {
                Capability::Multiprotocol(f) => Some(*f),
                _ => None,
            })
            .collect();
        if families.is_empty() {
            families.push(AfiSafi::IPV4_UNICAST);
        }
        families.sort_unstable();
        families.dedup();
        families
    }

    /// True when the sender advertised the route refresh capability.
    pub fn supports_route_refresh(&self) -> bool {
        self.capabilities
            .iter()
            .any(|c| matches!(c, Capability::RouteRefresh))
    }

    fn decode(body: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(body);
        let malformed = |what| DecodeError::MalformedOpen { what };
        let version = r.u8().ok_or(malformed("header"))?;
        if version != BGP_VERSION {
            return Err(DecodeError::UnsupportedVersion { version });
        }
        let (Some(my_as), Some(hold_time), Some(id), Some(opt_len)) =
            (r.u16(), r.u16(), r.array::<4>(), r.u8())
        else {
            return Err(malformed("header"));
        };
        // RFC 9072: a non-extended length of 255 followed by parameter type 255 announces
        // two-octet lengths.
        let extended = opt_len == optional_parameter::EXTENDED_LENGTH
            && r.rest().first() == Some(&optional_parameter::EXTENDED_LENGTH);
        let params_len = if extended {
            r.u8();
            usize::from(r.u16().ok_or(malformed("optional parameters length"))?)
        } else {
            usize::from(opt_len)
        };
        if params_len != r.remaining() {
            return Err(malformed("optional parameters length"));
        }
        let mut capabilities = Vec::new();
        while !r.is_empty() {
            let param_type = r.u8().ok_or(malformed("optional parameter"))?;
            let len = if extended {
                r.u16()
            } else {
                r.u8().map(u16::from)
            };
            let value = len
                .and_then(|len| r.take(usize::from(len)))
                .ok_or(malformed("optional parameter"))?;
            if param_type != optional_parameter::CAPABILITIES {
                return Err(DecodeError::UnsupportedOptionalParameter {
                    parameter_type: param_type,
                });
            }
            let mut caps = Reader::new(value);
            while !caps.is_empty() {
                let (Some(code), Some(len)) = (caps.u8(), caps.u8()) else {
                    return Err(malformed("capability"));
                };
                let value = caps.take(usize::from(len)).ok_or(malformed("capability"))?;
                capabilities.push(Capability::decode(code, value)?);
            }
        }
        Ok(Self {
            my_as,
            hold_time,
            bgp_id: Ipv4Addr::from(id),
            capabilities,
        })
    }

    fn encode_body(&self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        out.push(BGP_VERSION);
        out.extend_from_slice(&self.my_as.to_be_bytes());
        out.extend_from_slice(&self.hold_time.to_be_bytes());
        out.extend_from_slice(&self.bgp_id.octets());
        let mut caps = Vec::new();
        for cap in &self.capabilities {
            cap.encode(&mut caps)?;
        }
        if caps.is_empty() {
            out.push(0);
        } else if caps.len() + 2 <= 255 {
            // One capabilities parameter, as GoBGP and BIRD send it.
            out.extend_from_slice(&[(caps.len() + 2) as u8, optional_parameter::CAPABILITIES]);
            out.push(caps.len() as u8);
            out.extend_from_slice(&caps);
        } else {
            // RFC 9072 extended optional parameters; one parameter holds every capability.
            let param_len = u16::try_from(caps.len())
                .map_err(|_| EncodeError::MessageTooLong { length: caps.len() })?;
            let params_len = param_len.saturating_add(3);
            out.extend_from_slice(&[255, 255]);
            out.extend_from_slice(&params_len.to_be_bytes());
            out.push(optional_parameter::CAPABILITIES);
            out.extend_from_slice(&param_len.to_be_bytes());
            out.extend_from_slice(&caps);
        }
        Ok(())
    }
}

/// A NOTIFICATION message (RFC 4271 §4.5).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Notification {
    /// Error code ([`error_code`]).
    pub code: u8,
    /// Error subcode; its meaning depends on `code` (see [`iana`]).
    pub subcode: u8,
    /// Diagnostic data.
    pub data: Vec<u8>,
}

impl Notification {
    /// A NOTIFICATION with the given code, subcode and data.
    pub fn new(code: u8, subcode: u8, data: Vec<u8>) -> Self {
        Self {
            code,
            subcode,
            data,
        }
    }

    /// A Cease NOTIFICATION with no data.
    pub fn cease(subcode: u8) -> Self {
        Self::new(error_code::CEASE, subcode, Vec::new())
    }

    /// Cease / Administrative Shutdown carrying a shutdown communication (RFC 9003), cut to 255
    /// octets at a character boundary.
    pub fn administrative_shutdown(message: &str) -> Self {
        let mut end = message.len().min(255);
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        let mut data = Vec::with_capacity(end + 1);
        data.push(end as u8);
        data.extend_from_slice(&message.as_bytes()[..end]);
        Self::new(
            error_code::CEASE,
            cease_subcode::ADMINISTRATIVE_SHUTDOWN,
            data,
        )
    }

    /// The shutdown communication (RFC 9003) of a Cease / Administrative Shutdown or Reset.
    pub fn shutdown_communication(&self) -> Option<&str> {
        let is_shutdown = self.code == error_code::CEASE
            && matches!(
                self.subcode,
                cease_subcode::ADMINISTRATIVE_SHUTDOWN | cease_subcode::ADMINISTRATIVE_RESET
            );
        let (len, rest) = self.data.split_first()?;
        let text = rest.get(..usize::from(*len))?;
        if is_shutdown {
            std::str::from_utf8(text).ok()
        } else {
            None
        }
    }

    fn decode(body: &[u8]) -> Self {
        // frame_len guarantees at least two octets.
        let (code, subcode) = (
            body.first().copied().unwrap_or(0),
            body.get(1).copied().unwrap_or(0),
        );
        Self {
            code,
            subcode,
            data: body.get(2..).unwrap_or_default().to_vec(),
        }
    }
}

/// A ROUTE-REFRESH message (RFC 2918; subtype from RFC 7313).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RouteRefresh {
    /// The family to refresh.
    pub afi_safi: AfiSafi,
    /// 0 for a normal request; 1 and 2 mark the beginning and end of an enhanced refresh.
    pub subtype: u8,
}

impl RouteRefresh {
    /// A normal route refresh request for `afi_safi`.
    pub fn new(afi_safi: AfiSafi) -> Self {
        Self {
            afi_safi,
            subtype: 0,
        }
    }

    fn decode(body: &[u8]) -> Self {
        // frame_len guarantees exactly four octets.
        let b = |i: usize| body.get(i).copied().unwrap_or(0);
        Self {
            afi_safi: AfiSafi {
                afi: u16::from_be_bytes([b(0), b(1)]),
                safi: b(3),
            },
            subtype: b(2),
        }
    }
}
