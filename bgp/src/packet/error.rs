//! Decode and encode errors, and how each maps onto a NOTIFICATION (RFC 4271 §6) or onto an
//! RFC 7606 action.

use super::iana::{error_code, header_subcode, open_subcode};
use super::message::Notification;

/// What RFC 7606 says to do about a malformed UPDATE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorAction {
    /// Send a NOTIFICATION and close the session (RFC 7606 §2 "session reset").
    SessionReset,
    /// Keep the session, but treat every route the UPDATE announces as withdrawn.
    TreatAsWithdraw,
    /// Keep the session and the routes; ignore the malformed attribute.
    AttributeDiscard,
}

/// A malformed path attribute that did not end the session: the UPDATE was still decoded.
///
/// [`Update::errors`](super::Update::errors) lists them; the attribute itself is left out of the
/// decoded [`PathAttributes`](super::PathAttributes).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AttributeError {
    /// Type code of the offending attribute.
    pub type_code: u8,
    /// The UPDATE Message Error subcode RFC 4271 would have sent (see
    /// [`update_subcode`](super::iana::update_subcode)).
    pub subcode: u8,
    /// [`ErrorAction::TreatAsWithdraw`] or [`ErrorAction::AttributeDiscard`].
    pub action: ErrorAction,
}

/// Why a message could not be decoded. Every variant is a session reset and maps onto exactly
/// one NOTIFICATION through [`DecodeError::notification`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
pub enum DecodeError {
    /// The marker is not sixteen 0xff octets (Message Header Error / Connection Not Synchronized).
    #[error("message header: the marker is not all ones")]
    ConnectionNotSynchronized,
    /// The length field is below 19, above 4096 or wrong for the message type (Message Header
    /// Error / Bad Message Length); `length` is the field as received.
    #[error("message header: bad message length {length}")]
    BadMessageLength {
        /// The length field as received.
        length: u16,
    },
    /// An unknown message type (Message Header Error / Bad Message Type).
    #[error("message header: bad message type {message_type}")]
    BadMessageType {
        /// The type octet as received.
        message_type: u8,
    },
    /// OPEN with a version other than 4 (OPEN Message Error / Unsupported Version Number).
    #[error("OPEN: unsupported version {version}")]
    UnsupportedVersion {
        /// The version octet as received.
        version: u8,
    },
    /// OPEN with an optional parameter other than capabilities (OPEN Message Error /
    /// Unsupported Optional Parameter).
    #[error("OPEN: unsupported optional parameter type {parameter_type}")]
    UnsupportedOptionalParameter {
        /// The parameter type as received.
        parameter_type: u8,
    },
    /// OPEN whose optional parameters or a capability do not parse (OPEN Message Error /
    /// Unspecific, as RFC 9072 §3 uses it).
    #[error("OPEN: malformed {what}")]
    MalformedOpen {
        /// Which part did not parse.
        what: &'static str,
    },
    /// UPDATE that RFC 7606 says ends the session (UPDATE Message Error / `subcode`).
    #[error("UPDATE: {what} (subcode {subcode})")]
    Update {
        /// The UPDATE Message Error subcode ([`update_subcode`](super::iana::update_subcode)).
        subcode: u8,
        /// The NOTIFICATION data RFC 4271 §6.3 asks for (often the attribute as received).
        data: Vec<u8>,
        /// What was wrong, for logs.
        what: &'static str,
    },
}

impl DecodeError {
    /// The NOTIFICATION to send before closing the session.
    pub fn notification(&self) -> Notification {
        match self {
            Self::ConnectionNotSynchronized => Notification::new(
                error_code::MESSAGE_HEADER,
                header_subcode::CONNECTION_NOT_SYNCHRONIZED,
                Vec::new(),
            ),
            Self::BadMessageLength { length } => Notification::new(
                error_code::MESSAGE_HEADER,
                header_subcode::BAD_MESSAGE_LENGTH,
                length.to_be_bytes().to_vec(),
            ),
            Self::BadMessageType { message_type } => Notification::new(
                error_code::MESSAGE_HEADER,
                header_subcode::BAD_MESSAGE_TYPE,
                vec![*message_type],
            ),
            Self::UnsupportedVersion { .. } => Notification::new(
                error_code::OPEN_MESSAGE,
                open_subcode::UNSUPPORTED_VERSION_NUMBER,
                4u16.to_be_bytes().to_vec(),
            ),
            Self::UnsupportedOptionalParameter { .. } => Notification::new(
                error_code::OPEN_MESSAGE,
                open_subcode::UNSUPPORTED_OPTIONAL_PARAMETER,
                Vec::new(),
            ),
            Self::MalformedOpen { .. } => Notification::new(
                error_code::OPEN_MESSAGE,
                open_subcode::UNSPECIFIC,
                Vec::new(),
            ),
            Self::Update { subcode, data, .. } => {
                Notification::new(error_code::UPDATE_MESSAGE, *subcode, data.clone())
            }
        }
    }

    /// True for errors in the 19-octet header, which the FSM sees as `BGPHeaderErr`.
    pub fn is_header_error(&self) -> bool {
        matches!(
            self,
            Self::ConnectionNotSynchronized
                | Self::BadMessageLength { .. }
                | Self::BadMessageType { .. }
        )
    }

    /// True for errors in an OPEN, which the FSM sees as `BGPOpenMsgErr`.
    pub fn is_open_error(&self) -> bool {
        matches!(
            self,
            Self::UnsupportedVersion { .. }
                | Self::UnsupportedOptionalParameter { .. }
                | Self::MalformedOpen { .. }
        )
    }
}

/// Why a message could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
pub enum EncodeError {
    /// The message would exceed 4096 octets.
    #[error("message of {length} octets exceeds the 4096-octet maximum")]
    MessageTooLong {
        /// The length it would have had.
        length: usize,
    },
    /// A path attribute value would exceed 65535 octets.
    #[error("path attribute {type_code} exceeds 65535 octets")]
    AttributeTooLong {
        /// Its type code.
        type_code: u8,
    },
    /// A capability value would exceed 255 octets.
    #[error("capability {code} exceeds 255 octets")]
    CapabilityTooLong {
        /// Its code.
        code: u8,
    },
    /// The NOTIFICATION data would not fit in one message.
    #[error("NOTIFICATION data too long")]
    NotificationTooLong,
}
