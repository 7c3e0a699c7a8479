//! The BGP-4 message codec: pure functions over byte slices, no I/O.
//!
//! [`Message::frame_len`] delimits a message in a byte stream, [`Message::decode`] decodes it,
//! [`Message::encode`] appends one to a buffer. Decoding never panics, never loops and never
//! allocates more than a small multiple of its input; a message that cannot be decoded yields a
//! [`DecodeError`] whose [`DecodeError::notification`] is the NOTIFICATION RFC 4271 §6 asks for.
//! Malformed UPDATE attributes that RFC 7606 lets the session survive are reported in
//! [`Update::errors`] instead.
//!
//! Layout follows holo's `packet/` module: [`iana`] numbers, [`message`] header and small
//! messages, [`capability`], [`attribute`], [`update`], [`error`].

pub mod attribute;
pub mod capability;
pub mod error;
pub mod iana;
pub mod message;
mod reader;
pub mod update;

pub use attribute::{
    Aggregator, AsPath, AsSegment, Community, LargeCommunity, MpNextHop, MpReach, MpUnreach, Nlri,
    Origin, PathAttributes, RawAttribute, SegmentKind,
};
pub use capability::{
    AfiSafi, Capability, ExtendedNextHop, GracefulRestart, GracefulRestartFamily,
};
pub use error::{AttributeError, DecodeError, EncodeError, ErrorAction};
pub use message::{
    CodecContext, HEADER_LEN, MARKER, MAX_MESSAGE_LEN, Message, Notification, Open, RouteRefresh,
};
pub use update::Update;
