//! BFD authentication (RFC 5880 sections 4.3, 4.4 and 6.7): Keyed MD5, Meticulous Keyed MD5,
//! Keyed SHA1 and Meticulous Keyed SHA1.
//!
//! The authentication section of these four types is: Auth Type, Auth Len, Auth Key ID, a
//! reserved octet, a 32-bit sequence number, then the digest (16 octets for MD5, 20 for SHA1).
//! The digest is the hash of the whole control packet with the key, padded with zeros to the
//! digest's size, in the digest's place (6.7.3, 6.7.4).
//!
//! The sequence number is what stops a recorded packet from being played again: a meticulous
//! type's must grow with every packet; a keyed type's may repeat, within a window (6.7.3). The
//! window is checked by the session ([`crate::session`]), which knows what it received last.
//!
//! Simple Password (type 1) is not offered: it sends the key in clear to every host on the
//! segment, which is the attacker this protects against.

use digest::Digest;

use crate::packet::ControlPacket;

/// An authentication type this system runs (RFC 5880 section 4.1, Auth Type).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AuthType {
    /// Keyed MD5 (type 2): the sequence number may repeat.
    KeyedMd5,
    /// Meticulous Keyed MD5 (type 3): the sequence number grows with every packet.
    MeticulousKeyedMd5,
    /// Keyed SHA1 (type 4): the sequence number may repeat.
    KeyedSha1,
    /// Meticulous Keyed SHA1 (type 5): the sequence number grows with every packet.
    MeticulousKeyedSha1,
}

impl AuthType {
    /// All types, in the order of their codes.
    pub const ALL: [AuthType; 4] = [
        AuthType::KeyedMd5,
        AuthType::MeticulousKeyedMd5,
        AuthType::KeyedSha1,
        AuthType::MeticulousKeyedSha1,
    ];

    /// The Auth Type code.
    pub fn code(self) -> u8 {
        match self {
            AuthType::KeyedMd5 => 2,
            AuthType::MeticulousKeyedMd5 => 3,
            AuthType::KeyedSha1 => 4,
            AuthType::MeticulousKeyedSha1 => 5,
        }
    }

    /// The name used in configuration (`meticulous-keyed-sha1`, ...).
    pub fn name(self) -> &'static str {
        match self {
            AuthType::KeyedMd5 => "keyed-md5",
            AuthType::MeticulousKeyedMd5 => "meticulous-keyed-md5",
            AuthType::KeyedSha1 => "keyed-sha1",
            AuthType::MeticulousKeyedSha1 => "meticulous-keyed-sha1",
        }
    }

    /// The type configured by `name` ([`AuthType::name`]).
    pub fn from_name(name: &str) -> Option<AuthType> {
        AuthType::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Whether every packet must carry a larger sequence number than the last.
    pub fn meticulous(self) -> bool {
        matches!(
            self,
            AuthType::MeticulousKeyedMd5 | AuthType::MeticulousKeyedSha1
        )
    }

    /// The digest's size, which is also the longest key: 16 octets for MD5, 20 for SHA1.
    pub fn digest_len(self) -> usize {
        match self {
            AuthType::KeyedMd5 | AuthType::MeticulousKeyedMd5 => 16,
            AuthType::KeyedSha1 | AuthType::MeticulousKeyedSha1 => 20,
        }
    }

    /// The Auth Len field: type, length, key ID, reserved, sequence number, digest.
    pub fn section_len(self) -> usize {
        8 + self.digest_len()
    }
}

/// Why a key cannot be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The key is empty or longer than the digest.
    #[error("a {kind} key must be 1 to {max} octets long, not {len}", kind = kind.name())]
    Length {
        /// The type the key is for.
        kind: AuthType,
        /// The key's length.
        len: usize,
        /// The longest key of that type.
        max: usize,
    },
}

/// One configured key: the type, the Auth Key ID both ends agree on, and the secret.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Authentication {
    kind: AuthType,
    key_id: u8,
    /// The key padded with zeros to 20 octets; only the first `digest_len` are used.
    key: [u8; 20],
}

impl std::fmt::Debug for Authentication {
    /// Never prints the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authentication")
            .field("kind", &self.kind)
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

/// Why an authenticated packet is refused (RFC 5880 6.7.3, 6.7.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// The packet has no authentication section but authentication is configured.
    #[error("it is not authenticated")]
    Missing,
    /// Another Auth Type than the configured one.
    #[error("it uses authentication type {0}")]
    Type(u8),
    /// Auth Len is not the type's.
    #[error("its authentication section has length {0}")]
    Length(u8),
    /// Another key ID than the configured one.
    #[error("it uses key ID {0}")]
    KeyId(u8),
    /// The digest does not match: another key, or a changed packet.
    #[error("its digest does not match")]
    Digest,
}

/// The sequence number and key ID of a packet whose digest was found right.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verified {
    /// The packet's sequence number.
    pub sequence: u32,
}

impl Authentication {
    /// A key of `kind` with `key_id`. The key is 1 to 16 octets for MD5, 1 to 20 for SHA1.
    pub fn new(kind: AuthType, key_id: u8, key: &[u8]) -> Result<Authentication, KeyError> {
        if key.is_empty() || key.len() > kind.digest_len() {
            return Err(KeyError::Length {
                kind,
                len: key.len(),
                max: kind.digest_len(),
            });
        }
        let mut padded = [0u8; 20];
        padded[..key.len()].copy_from_slice(key);
        Ok(Authentication {
            kind,
            key_id,
            key: padded,
        })
    }

    /// The type.
    pub fn kind(&self) -> AuthType {
        self.kind
    }

    /// The Auth Key ID.
    pub fn key_id(&self) -> u8 {
        self.key_id
    }

    /// Sets `packet`'s authentication section for `sequence`: its digest over the packet with
    /// the key in the digest's place.
    pub fn sign(&self, packet: &mut ControlPacket, sequence: u32) {
        packet.auth = Some(self.section(sequence, &self.key[..self.kind.digest_len()]));
        let digest = self.digest(&packet.encode());
        if let Some(section) = packet.auth.as_mut() {
            section[8..].copy_from_slice(&digest);
        }
    }

    /// Checks `packet`'s authentication section: type, length, key ID and digest. The
    /// sequence number is returned for the session to check against what it received before.
    pub fn verify(&self, packet: &ControlPacket) -> Result<Verified, AuthError> {
        let section = packet.auth.as_deref().ok_or(AuthError::Missing)?;
        // The decoder keeps the section whole and at least the two octets of type and length.
        let (kind, len) = match section {
            [kind, len, ..] => (*kind, *len),
            _ => return Err(AuthError::Length(0)),
        };
        if kind != self.kind.code() {
            return Err(AuthError::Type(kind));
        }
        if usize::from(len) != self.kind.section_len() || section.len() != usize::from(len) {
            return Err(AuthError::Length(len));
        }
        if section[2] != self.key_id {
            return Err(AuthError::KeyId(section[2]));
        }
        let sequence = u32::from_be_bytes([section[4], section[5], section[6], section[7]]);
        let mut keyed = packet.clone();
        keyed.auth = Some(self.section(sequence, &self.key[..self.kind.digest_len()]));
        let expected = self.digest(&keyed.encode());
        if !constant_time_eq(&expected, &section[8..]) {
            return Err(AuthError::Digest);
        }
        Ok(Verified { sequence })
    }

    /// A section of this type with `sequence` and `tail` as the digest field.
    fn section(&self, sequence: u32, tail: &[u8]) -> Vec<u8> {
        let mut section = Vec::with_capacity(self.kind.section_len());
        // section_len is 24 or 28: it fits the octet.
        section.push(self.kind.code());
        section.push(u8::try_from(self.kind.section_len()).unwrap_or(u8::MAX));
        section.push(self.key_id);
        section.push(0);
        section.extend_from_slice(&sequence.to_be_bytes());
        section.extend_from_slice(tail);
        section
    }

    fn digest(&self, bytes: &[u8]) -> Vec<u8> {
        match self.kind {
            AuthType::KeyedMd5 | AuthType::MeticulousKeyedMd5 => md5::Md5::digest(bytes).to_vec(),
            AuthType::KeyedSha1 | AuthType::MeticulousKeyedSha1 => {
                sha1::Sha1::digest(bytes).to_vec()
            }
        }
    }
}

/// Compares two digests in time independent of where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether `sequence` is in the window after `last` (RFC 5880 6.7.3, 6.7.4): at most
/// 3 × Detect Mult ahead, modulo 2^32; a meticulous type's must also differ from `last`.
pub fn in_window(kind: AuthType, last: u32, sequence: u32, detect_mult: u8) -> bool {
    let ahead = sequence.wrapping_sub(last);
    let window = 3 * u32::from(detect_mult);
    if kind.meticulous() {
        (1..=window).contains(&ahead)
    } else {
        ahead <= window
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::packet::{Diagnostic, State};

    fn packet() -> ControlPacket {
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
    fn a_signed_packet_verifies_and_survives_the_wire() {
        for kind in AuthType::ALL {
            let auth = Authentication::new(kind, 7, b"secret").unwrap();
            let mut p = packet();
            auth.sign(&mut p, 0x0102_0304);
            let wire = p.encode();
            assert_eq!(wire.len(), 24 + kind.section_len());
            assert_eq!(
                usize::from(wire[3]),
                wire.len(),
                "Length counts the section"
            );
            assert_eq!(wire[1] & 0x04, 0x04, "A bit");
            let back = ControlPacket::decode(&wire).unwrap();
            assert_eq!(
                auth.verify(&back),
                Ok(Verified {
                    sequence: 0x0102_0304
                })
            );
        }
    }

    /// Vectors from an independent implementation (Python's hashlib over the RFC 5880 layout),
    /// byte for byte: Meticulous Keyed SHA1 and Keyed MD5, key ID 7, key "secret", sequence
    /// number 0x01020304.
    #[test]
    fn signatures_match_independent_vectors() {
        for (kind, hex) in [
            (
                AuthType::MeticulousKeyedSha1,
                "20c403340000000100000002000493e0000493e000000000051c070001020304\
                 f8e827a9f892051af9674ee9dda618a315759c4c",
            ),
            (
                AuthType::KeyedMd5,
                "20c403300000000100000002000493e0000493e0000000000218070001020304\
                 d26e262882de8b0d03c5c8051e66510d",
            ),
        ] {
            let auth = Authentication::new(kind, 7, b"secret").unwrap();
            let mut p = packet();
            auth.sign(&mut p, 0x0102_0304);
            let wire: String = p.encode().iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(wire, hex, "{kind:?}");
        }
    }

    #[test]
    fn any_change_to_the_packet_or_key_is_refused() {
        let auth = Authentication::new(AuthType::MeticulousKeyedSha1, 1, b"k").unwrap();
        let mut p = packet();
        auth.sign(&mut p, 9);
        let mut changed = p.clone();
        changed.state = State::Down;
        assert_eq!(auth.verify(&changed), Err(AuthError::Digest));
        let mut sequence = p.clone();
        sequence.auth.as_mut().unwrap()[7] ^= 1;
        assert_eq!(auth.verify(&sequence), Err(AuthError::Digest));
        let other_key = Authentication::new(AuthType::MeticulousKeyedSha1, 1, b"K").unwrap();
        assert_eq!(other_key.verify(&p), Err(AuthError::Digest));
        let other_id = Authentication::new(AuthType::MeticulousKeyedSha1, 2, b"k").unwrap();
        assert_eq!(other_id.verify(&p), Err(AuthError::KeyId(1)));
        let other_type = Authentication::new(AuthType::KeyedSha1, 1, b"k").unwrap();
        assert_eq!(other_type.verify(&p), Err(AuthError::Type(5)));
        assert_eq!(auth.verify(&packet()), Err(AuthError::Missing));
        let mut short = p.clone();
        short.auth.as_mut().unwrap().truncate(20);
        short.auth.as_mut().unwrap()[1] = 20;
        assert_eq!(auth.verify(&short), Err(AuthError::Length(20)));
    }

    #[test]
    fn keys_are_one_octet_to_the_digest_size() {
        assert!(Authentication::new(AuthType::KeyedMd5, 1, &[7; 16]).is_ok());
        assert_eq!(
            Authentication::new(AuthType::KeyedMd5, 1, &[7; 17]),
            Err(KeyError::Length {
                kind: AuthType::KeyedMd5,
                len: 17,
                max: 16
            })
        );
        assert!(Authentication::new(AuthType::KeyedSha1, 1, &[7; 20]).is_ok());
        assert!(Authentication::new(AuthType::KeyedSha1, 1, &[7; 21]).is_err());
        assert!(Authentication::new(AuthType::KeyedSha1, 1, b"").is_err());
    }

    #[test]
    fn the_key_is_never_printed() {
        let auth = Authentication::new(AuthType::KeyedSha1, 1, b"hunter2").unwrap();
        assert!(!format!("{auth:?}").contains("hunter2"));
    }

    #[test]
    fn the_window_is_three_detect_mults_and_wraps() {
        use AuthType::*;
        assert!(in_window(KeyedSha1, 10, 10, 3));
        assert!(!in_window(MeticulousKeyedSha1, 10, 10, 3), "a replay");
        assert!(in_window(MeticulousKeyedSha1, 10, 19, 3));
        assert!(!in_window(MeticulousKeyedSha1, 10, 20, 3));
        assert!(!in_window(KeyedSha1, 10, 9, 3), "behind");
        assert!(in_window(MeticulousKeyedMd5, u32::MAX, 2, 1), "wraps");
        assert!(!in_window(KeyedMd5, 5, u32::MAX, 255));
    }

    #[test]
    fn names_round_trip() {
        for kind in AuthType::ALL {
            assert_eq!(AuthType::from_name(kind.name()), Some(kind));
        }
        assert_eq!(AuthType::from_name("simple"), None);
    }
}
