//! BFD, Bidirectional Forwarding Detection (RFC 5880), as the speaker runs it next to its BGP
//! sessions: single hop over UDP 3784 (RFC 5881) and multihop over UDP 4784 (RFC 5883).
//!
//! Pure, like the BGP core: [`packet`] encodes and decodes control packets; [`session`] is the
//! state machine of one session, fed received packets and the time, returning what to send and
//! when its state changed. The driver (sockets, TTL checks, timers) lives in the speaker.
//!
//! Choices (docs/decisions/0018-bfd.md): asynchronous mode only (no demand mode, as FRR's bfdd);
//! keyed and meticulous keyed MD5 and SHA1 authentication ([`auth`]) when configured (MetalLB's
//! BFDProfile has no field for it: a ferrolb extension), and without it packets with the A bit
//! are discarded, as RFC 5880 6.8.6 requires;
//! the echo function is not run (the profile's `echoMode` is reported as not supported, and
//! packets advertise a Required Min Echo RX Interval of zero, so no peer sends echoes to us).

pub mod auth;
pub mod packet;
pub mod session;

/// UDP port of single-hop control packets (RFC 5881).
pub const SINGLE_HOP_PORT: u16 = 3784;
/// UDP port of multihop control packets (RFC 5883).
pub const MULTIHOP_PORT: u16 = 4784;
/// First UDP source port a control packet may come from (RFC 5881 section 4).
pub const SOURCE_PORTS: std::ops::RangeInclusive<u16> = 49152..=65535;
