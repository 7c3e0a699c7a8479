//! The BFD control packet (RFC 5880 section 4.1): 24 bytes, then an authentication section when
//! the A bit is set.
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! |Vers |  Diag   |Sta|P|F|C|A|D|M|  Detect Mult  |    Length     |
//! |                       My Discriminator                        |
//! |                      Your Discriminator                       |
//! |                    Desired Min TX Interval                    |
//! |                   Required Min RX Interval                    |
//! |                 Required Min Echo RX Interval                 |
//! ```
//!
//! [`ControlPacket::decode`] applies the checks of RFC 5880 section 6.8.6 that need no session
//! (version, length, detect multiplier, multipoint, my discriminator); the session applies the
//! rest.

use std::fmt;

/// The protocol version this codec speaks.
pub const VERSION: u8 = 1;
/// Length of a control packet without authentication.
pub const LENGTH: usize = 24;
/// Shortest control packet with the A bit set (24 bytes and a 2-byte authentication header).
pub const MIN_AUTH_LENGTH: usize = 26;

/// A session state (RFC 5880 section 4.1, `Sta`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum State {
    /// Administratively down: the session is held down on purpose.
    AdminDown,
    /// Down (or just created).
    Down,
    /// Initialising: the remote system is heard, which has not yet heard us.
    Init,
    /// Up: both systems hear each other.
    Up,
}

impl State {
    fn from_bits(bits: u8) -> State {
        match bits & 0b11 {
            0 => State::AdminDown,
            1 => State::Down,
            2 => State::Init,
            _ => State::Up,
        }
    }

    fn bits(self) -> u8 {
        match self {
            State::AdminDown => 0,
            State::Down => 1,
            State::Init => 2,
            State::Up => 3,
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            State::AdminDown => "AdminDown",
            State::Down => "Down",
            State::Init => "Init",
            State::Up => "Up",
        })
    }
}

/// Why a session last went down (RFC 5880 section 4.1, `Diag`). Unknown codes are kept as
/// they came.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Diagnostic {
    /// 0: no diagnostic.
    None,
    /// 1: control detection time expired.
    DetectionTimeExpired,
    /// 2: echo function failed.
    EchoFailed,
    /// 3: neighbor signaled session down.
    NeighborSignaledDown,
    /// 4: forwarding plane reset.
    ForwardingPlaneReset,
    /// 5: path down.
    PathDown,
    /// 6: concatenated path down.
    ConcatenatedPathDown,
    /// 7: administratively down.
    AdminDown,
    /// 8: reverse concatenated path down.
    ReverseConcatenatedPathDown,
    /// 9-31: reserved.
    Reserved(u8),
}

impl Diagnostic {
    fn from_bits(bits: u8) -> Diagnostic {
        match bits & 0x1f {
            0 => Diagnostic::None,
            1 => Diagnostic::DetectionTimeExpired,
            2 => Diagnostic::EchoFailed,
            3 => Diagnostic::NeighborSignaledDown,
            4 => Diagnostic::ForwardingPlaneReset,
            5 => Diagnostic::PathDown,
            6 => Diagnostic::ConcatenatedPathDown,
            7 => Diagnostic::AdminDown,
            8 => Diagnostic::ReverseConcatenatedPathDown,
            other => Diagnostic::Reserved(other),
        }
    }

    /// The code on the wire.
    pub fn code(self) -> u8 {
        match self {
            Diagnostic::None => 0,
            Diagnostic::DetectionTimeExpired => 1,
            Diagnostic::EchoFailed => 2,
            Diagnostic::NeighborSignaledDown => 3,
            Diagnostic::ForwardingPlaneReset => 4,
            Diagnostic::PathDown => 5,
            Diagnostic::ConcatenatedPathDown => 6,
            Diagnostic::AdminDown => 7,
            Diagnostic::ReverseConcatenatedPathDown => 8,
            Diagnostic::Reserved(code) => code & 0x1f,
        }
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Diagnostic::None => f.write_str("no diagnostic"),
            Diagnostic::DetectionTimeExpired => f.write_str("control detection time expired"),
            Diagnostic::EchoFailed => f.write_str("echo function failed"),
            Diagnostic::NeighborSignaledDown => f.write_str("neighbor signaled session down"),
            Diagnostic::ForwardingPlaneReset => f.write_str("forwarding plane reset"),
            Diagnostic::PathDown => f.write_str("path down"),
            Diagnostic::ConcatenatedPathDown => f.write_str("concatenated path down"),
            Diagnostic::AdminDown => f.write_str("administratively down"),
            Diagnostic::ReverseConcatenatedPathDown => {
                f.write_str("reverse concatenated path down")
            }
            Diagnostic::Reserved(code) => write!(f, "reserved diagnostic {code}"),
        }
    }
}

/// One control packet. Intervals are in microseconds, as on the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControlPacket {
    /// Why the sender's session last went down.
    pub diagnostic: Diagnostic,
    /// The sender's session state.
    pub state: State,
    /// Poll: the sender asks for a packet with Final (a parameter change).
    pub poll: bool,
    /// Final: the answer to a Poll.
    pub final_: bool,
    /// Control plane independent: the sender's BFD does not share fate with its control plane.
    pub control_plane_independent: bool,
    /// Demand: the sender runs demand mode (RFC 5880 section 6.6; this system never asks for
    /// it, but stops its periodic packets when a peer in demand mode asks).
    pub demand: bool,
    /// Detection time multiplier.
    pub detect_mult: u8,
    /// The sender's discriminator, never zero.
    pub my_discriminator: u32,
    /// The receiver's discriminator as the sender knows it; zero when it does not.
    pub your_discriminator: u32,
    /// The shortest interval the sender wants between the packets it sends (µs).
    pub desired_min_tx: u32,
    /// The shortest interval the sender can receive packets at (µs).
    pub required_min_rx: u32,
    /// The shortest interval the sender can receive echo packets at (µs); zero: none.
    pub required_min_echo_rx: u32,
    /// The authentication section (type, length, data), when the A bit is set: kept whole so
    /// that a session can refuse it (no authentication is configured, RFC 5880 6.8.6).
    pub auth: Option<Vec<u8>>,
}

/// Why a datagram is not a control packet this system may accept (RFC 5880 section 6.8.6,
/// the checks that need no session).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Shorter than the fixed part, or than the authentication header when A is set.
    #[error("control packet too short: {0} bytes")]
    TooShort(usize),
    /// Not version 1.
    #[error("unsupported BFD version {0}")]
    Version(u8),
    /// The Length field is below the minimum or beyond the datagram.
    #[error("bad length field {field} in a datagram of {datagram} bytes")]
    Length {
        /// The Length field.
        field: u8,
        /// The datagram's size.
        datagram: usize,
    },
    /// Detect Mult is zero.
    #[error("detect multiplier of zero")]
    DetectMult,
    /// The Multipoint bit is set (reserved for future point-to-multipoint extensions).
    #[error("multipoint bit set")]
    Multipoint,
    /// My Discriminator is zero.
    #[error("my discriminator of zero")]
    MyDiscriminator,
    /// The authentication section's length does not fit the packet.
    #[error("authentication section of {field} bytes does not fit the packet")]
    AuthLength {
        /// The Auth Len field.
        field: u8,
    },
}

const FLAG_POLL: u8 = 0x20;
const FLAG_FINAL: u8 = 0x10;
const FLAG_CPI: u8 = 0x08;
const FLAG_AUTH: u8 = 0x04;
const FLAG_DEMAND: u8 = 0x02;
const FLAG_MULTIPOINT: u8 = 0x01;

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_be_bytes(word)
}

impl ControlPacket {
    /// Decodes a datagram's payload. Bytes past the Length field are ignored (RFC 5880 does
    /// not forbid padding below UDP).
    pub fn decode(datagram: &[u8]) -> Result<ControlPacket, DecodeError> {
        if datagram.len() < LENGTH {
            return Err(DecodeError::TooShort(datagram.len()));
        }
        let version = datagram[0] >> 5;
        if version != VERSION {
            return Err(DecodeError::Version(version));
        }
        let flags = datagram[1];
        let auth_present = flags & FLAG_AUTH != 0;
        let length = datagram[3];
        let minimum = if auth_present {
            MIN_AUTH_LENGTH
        } else {
            LENGTH
        };
        if usize::from(length) < minimum || usize::from(length) > datagram.len() {
            return Err(DecodeError::Length {
                field: length,
                datagram: datagram.len(),
            });
        }
        let detect_mult = datagram[2];
        if detect_mult == 0 {
            return Err(DecodeError::DetectMult);
        }
        if flags & FLAG_MULTIPOINT != 0 {
            return Err(DecodeError::Multipoint);
        }
        let my_discriminator = u32_at(datagram, 4);
        if my_discriminator == 0 {
            return Err(DecodeError::MyDiscriminator);
        }
        let auth = if auth_present {
            // Auth Type, Auth Len (which counts the type and length bytes), data.
            let auth_len = datagram[LENGTH + 1];
            if usize::from(auth_len) < 2 || LENGTH + usize::from(auth_len) > usize::from(length) {
                return Err(DecodeError::AuthLength { field: auth_len });
            }
            Some(datagram[LENGTH..LENGTH + usize::from(auth_len)].to_vec())
        } else {
            None
        };
        Ok(ControlPacket {
            diagnostic: Diagnostic::from_bits(datagram[0]),
            state: State::from_bits(flags >> 6),
            poll: flags & FLAG_POLL != 0,
            final_: flags & FLAG_FINAL != 0,
            control_plane_independent: flags & FLAG_CPI != 0,
            demand: flags & FLAG_DEMAND != 0,
            detect_mult,
            my_discriminator,
            your_discriminator: u32_at(datagram, 8),
            desired_min_tx: u32_at(datagram, 12),
            required_min_rx: u32_at(datagram, 16),
            required_min_echo_rx: u32_at(datagram, 20),
            auth,
        })
    }

    /// Encodes the packet (24 bytes, more with an authentication section).
    pub fn encode(&self) -> Vec<u8> {
        let auth = self.auth.as_deref().unwrap_or_default();
        let length = LENGTH + auth.len();
        let mut out = Vec::with_capacity(length);
        out.push((VERSION << 5) | self.diagnostic.code());
        let mut flags = self.state.bits() << 6;
        for (set, bit) in [
            (self.poll, FLAG_POLL),
            (self.final_, FLAG_FINAL),
            (self.control_plane_independent, FLAG_CPI),
            (self.auth.is_some(), FLAG_AUTH),
            (self.demand, FLAG_DEMAND),
        ] {
            if set {
                flags |= bit;
            }
        }
        out.push(flags);
        out.push(self.detect_mult);
        out.push(u8::try_from(length).unwrap_or(u8::MAX));
        for word in [
            self.my_discriminator,
            self.your_discriminator,
            self.desired_min_tx,
            self.required_min_rx,
            self.required_min_echo_rx,
        ] {
            out.extend_from_slice(&word.to_be_bytes());
        }
        out.extend_from_slice(auth);
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn up() -> ControlPacket {
        ControlPacket {
            diagnostic: Diagnostic::None,
            state: State::Up,
            poll: false,
            final_: false,
            control_plane_independent: false,
            demand: false,
            detect_mult: 3,
            my_discriminator: 1,
            your_discriminator: 2,
            desired_min_tx: 300_000,
            required_min_rx: 300_000,
            required_min_echo_rx: 0,
            auth: None,
        }
    }

    #[test]
    fn every_session_independent_check_refuses_its_packet() {
        let good = up().encode();
        assert_eq!(ControlPacket::decode(&good), Ok(up()));
        let mut bad = good.clone();
        bad[0] = (2 << 5) | (bad[0] & 0x1f);
        assert_eq!(ControlPacket::decode(&bad), Err(DecodeError::Version(2)));
        assert_eq!(
            ControlPacket::decode(&good[..23]),
            Err(DecodeError::TooShort(23))
        );
        let mut bad = good.clone();
        bad[3] = 25;
        assert!(matches!(
            ControlPacket::decode(&bad),
            Err(DecodeError::Length { field: 25, .. })
        ));
        let mut bad = good.clone();
        bad[2] = 0;
        assert_eq!(ControlPacket::decode(&bad), Err(DecodeError::DetectMult));
        let mut bad = good.clone();
        bad[1] |= FLAG_MULTIPOINT;
        assert_eq!(ControlPacket::decode(&bad), Err(DecodeError::Multipoint));
        let mut bad = good.clone();
        bad[4..8].copy_from_slice(&[0; 4]);
        assert_eq!(
            ControlPacket::decode(&bad),
            Err(DecodeError::MyDiscriminator)
        );
        // The A bit with no room for the authentication header.
        let mut bad = good;
        bad[1] |= FLAG_AUTH;
        assert!(matches!(
            ControlPacket::decode(&bad),
            Err(DecodeError::Length { field: 24, .. })
        ));
    }

    #[test]
    fn an_authentication_section_is_kept_whole() {
        // Simple password (type 1), length 7, key ID 1, password "abc".
        let mut packet = up();
        packet.auth = Some(vec![1, 7, 1, b'a', b'b', b'c', 0]);
        let bytes = packet.encode();
        assert_eq!(bytes[3], 31);
        assert_eq!(ControlPacket::decode(&bytes), Ok(packet));
        // An Auth Len that runs past the Length field.
        let mut bad = bytes;
        bad[25] = 9;
        assert_eq!(
            ControlPacket::decode(&bad),
            Err(DecodeError::AuthLength { field: 9 })
        );
    }

    #[test]
    fn padding_past_the_length_field_is_ignored() {
        let mut bytes = up().encode();
        bytes.extend_from_slice(&[0xff; 8]);
        assert_eq!(ControlPacket::decode(&bytes), Ok(up()));
    }
}
