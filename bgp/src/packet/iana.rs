//! Numbers assigned by IANA that the codec reads and writes.
//!
//! Only the values a speaker needs are named; anything else is kept as a raw number.

/// BGP message types (RFC 4271 §4.1, RFC 2918).
pub mod message_type {
    /// OPEN.
    pub const OPEN: u8 = 1;
    /// UPDATE.
    pub const UPDATE: u8 = 2;
    /// NOTIFICATION.
    pub const NOTIFICATION: u8 = 3;
    /// KEEPALIVE.
    pub const KEEPALIVE: u8 = 4;
    /// ROUTE-REFRESH (RFC 2918).
    pub const ROUTE_REFRESH: u8 = 5;
}

/// Address family identifiers.
pub mod afi {
    /// IPv4.
    pub const IPV4: u16 = 1;
    /// IPv6.
    pub const IPV6: u16 = 2;
}

/// Subsequent address family identifiers.
pub mod safi {
    /// Unicast forwarding.
    pub const UNICAST: u8 = 1;
}

/// OPEN optional parameter types (RFC 5492, RFC 9072).
pub mod optional_parameter {
    /// Capabilities (RFC 5492).
    pub const CAPABILITIES: u8 = 2;
    /// Marks the extended optional parameters length format (RFC 9072).
    pub const EXTENDED_LENGTH: u8 = 255;
}

/// Capability codes (RFC 5492 registry).
pub mod capability {
    /// Multiprotocol extensions (RFC 4760).
    pub const MULTIPROTOCOL: u8 = 1;
    /// Route refresh (RFC 2918).
    pub const ROUTE_REFRESH: u8 = 2;
    /// Extended next hop encoding (RFC 8950).
    pub const EXTENDED_NEXT_HOP: u8 = 5;
    /// Graceful restart (RFC 4724).
    pub const GRACEFUL_RESTART: u8 = 64;
    /// Support for 4-octet AS numbers (RFC 6793).
    pub const FOUR_OCTET_AS: u8 = 65;
    /// Hostname / FQDN (draft-walton-bgp-hostname-capability), sent by FRR and GoBGP.
    pub const FQDN: u8 = 73;
}

/// Path attribute type codes.
pub mod attribute {
    /// ORIGIN (well-known mandatory).
    pub const ORIGIN: u8 = 1;
    /// AS_PATH (well-known mandatory).
    pub const AS_PATH: u8 = 2;
    /// NEXT_HOP (well-known mandatory for IPv4 NLRI).
    pub const NEXT_HOP: u8 = 3;
    /// MULTI_EXIT_DISC (optional non-transitive).
    pub const MULTI_EXIT_DISC: u8 = 4;
    /// LOCAL_PREF (well-known, iBGP only).
    pub const LOCAL_PREF: u8 = 5;
    /// ATOMIC_AGGREGATE (well-known discretionary).
    pub const ATOMIC_AGGREGATE: u8 = 6;
    /// AGGREGATOR (optional transitive).
    pub const AGGREGATOR: u8 = 7;
    /// COMMUNITIES (RFC 1997, optional transitive).
    pub const COMMUNITIES: u8 = 8;
    /// MP_REACH_NLRI (RFC 4760, optional non-transitive).
    pub const MP_REACH_NLRI: u8 = 14;
    /// MP_UNREACH_NLRI (RFC 4760, optional non-transitive).
    pub const MP_UNREACH_NLRI: u8 = 15;
    /// AS4_PATH (RFC 6793, optional transitive).
    pub const AS4_PATH: u8 = 17;
    /// AS4_AGGREGATOR (RFC 6793, optional transitive).
    pub const AS4_AGGREGATOR: u8 = 18;
    /// LARGE_COMMUNITY (RFC 8092, optional transitive).
    pub const LARGE_COMMUNITY: u8 = 32;
}

/// Path attribute flag bits (RFC 4271 §4.3).
pub mod attribute_flags {
    /// The attribute is optional (not well-known).
    pub const OPTIONAL: u8 = 0x80;
    /// The attribute is transitive.
    pub const TRANSITIVE: u8 = 0x40;
    /// An optional transitive attribute was not understood by some speaker on the path.
    pub const PARTIAL: u8 = 0x20;
    /// The attribute length is two octets.
    pub const EXTENDED_LENGTH: u8 = 0x10;
}

/// AS_PATH segment types (RFC 4271, RFC 5065).
pub mod as_path_segment {
    /// AS_SET: unordered.
    pub const AS_SET: u8 = 1;
    /// AS_SEQUENCE: ordered, nearest AS first.
    pub const AS_SEQUENCE: u8 = 2;
    /// AS_CONFED_SEQUENCE (RFC 5065).
    pub const AS_CONFED_SEQUENCE: u8 = 3;
    /// AS_CONFED_SET (RFC 5065).
    pub const AS_CONFED_SET: u8 = 4;
}

/// The 2-octet AS placeholder for 4-octet AS numbers (RFC 6793).
pub const AS_TRANS: u16 = 23456;

/// NOTIFICATION error codes (RFC 4271 §4.5, RFC 7313).
pub mod error_code {
    /// Message Header Error.
    pub const MESSAGE_HEADER: u8 = 1;
    /// OPEN Message Error.
    pub const OPEN_MESSAGE: u8 = 2;
    /// UPDATE Message Error.
    pub const UPDATE_MESSAGE: u8 = 3;
    /// Hold Timer Expired.
    pub const HOLD_TIMER_EXPIRED: u8 = 4;
    /// Finite State Machine Error.
    pub const FSM: u8 = 5;
    /// Cease.
    pub const CEASE: u8 = 6;
    /// ROUTE-REFRESH Message Error (RFC 7313).
    pub const ROUTE_REFRESH_MESSAGE: u8 = 7;
}

/// Message Header Error subcodes (RFC 4271 §6.1).
pub mod header_subcode {
    /// The marker is not all ones.
    pub const CONNECTION_NOT_SYNCHRONIZED: u8 = 1;
    /// The length field is out of range for the message type; data: the length field.
    pub const BAD_MESSAGE_LENGTH: u8 = 2;
    /// Unknown message type; data: the type octet.
    pub const BAD_MESSAGE_TYPE: u8 = 3;
}

/// OPEN Message Error subcodes (RFC 4271 §6.2, RFC 5492).
pub mod open_subcode {
    /// No more specific subcode applies (RFC 9072 uses it for malformed parameters).
    pub const UNSPECIFIC: u8 = 0;
    /// Version other than 4; data: the highest version we support, two octets.
    pub const UNSUPPORTED_VERSION_NUMBER: u8 = 1;
    /// The peer's AS is not the one configured.
    pub const BAD_PEER_AS: u8 = 2;
    /// The BGP Identifier is not acceptable.
    pub const BAD_BGP_IDENTIFIER: u8 = 3;
    /// An optional parameter other than capabilities.
    pub const UNSUPPORTED_OPTIONAL_PARAMETER: u8 = 4;
    /// Hold time of 1 or 2 seconds.
    pub const UNACCEPTABLE_HOLD_TIME: u8 = 6;
    /// A capability we require is missing (RFC 5492).
    pub const UNSUPPORTED_CAPABILITY: u8 = 7;
}

/// UPDATE Message Error subcodes (RFC 4271 §6.3).
pub mod update_subcode {
    /// Lengths do not add up.
    pub const MALFORMED_ATTRIBUTE_LIST: u8 = 1;
    /// A well-known attribute we do not know; data: the attribute.
    pub const UNRECOGNIZED_WELL_KNOWN_ATTRIBUTE: u8 = 2;
    /// A mandatory attribute is absent; data: its type code.
    pub const MISSING_WELL_KNOWN_ATTRIBUTE: u8 = 3;
    /// Flags conflict with the type; data: the attribute.
    pub const ATTRIBUTE_FLAGS_ERROR: u8 = 4;
    /// Length is wrong for the type; data: the attribute.
    pub const ATTRIBUTE_LENGTH_ERROR: u8 = 5;
    /// ORIGIN value undefined; data: the attribute.
    pub const INVALID_ORIGIN_ATTRIBUTE: u8 = 6;
    /// NEXT_HOP is not a valid address; data: the attribute.
    pub const INVALID_NEXT_HOP_ATTRIBUTE: u8 = 8;
    /// An optional attribute is malformed; data: the attribute.
    pub const OPTIONAL_ATTRIBUTE_ERROR: u8 = 9;
    /// NLRI is syntactically wrong.
    pub const INVALID_NETWORK_FIELD: u8 = 10;
    /// AS_PATH is malformed.
    pub const MALFORMED_AS_PATH: u8 = 11;
}

/// Finite State Machine Error subcodes (RFC 6608).
pub mod fsm_subcode {
    /// No more specific subcode applies.
    pub const UNSPECIFIED: u8 = 0;
    /// Unexpected message in OpenSent.
    pub const UNEXPECTED_IN_OPEN_SENT: u8 = 1;
    /// Unexpected message in OpenConfirm.
    pub const UNEXPECTED_IN_OPEN_CONFIRM: u8 = 2;
    /// Unexpected message in Established.
    pub const UNEXPECTED_IN_ESTABLISHED: u8 = 3;
}

/// Cease subcodes (RFC 4486, RFC 8538).
pub mod cease_subcode {
    /// Maximum number of prefixes reached.
    pub const MAXIMUM_PREFIXES_REACHED: u8 = 1;
    /// Administrative shutdown (data: optional shutdown communication, RFC 9003).
    pub const ADMINISTRATIVE_SHUTDOWN: u8 = 2;
    /// Peer de-configured.
    pub const PEER_DECONFIGURED: u8 = 3;
    /// Administrative reset.
    pub const ADMINISTRATIVE_RESET: u8 = 4;
    /// Connection rejected.
    pub const CONNECTION_REJECTED: u8 = 5;
    /// Other configuration change.
    pub const OTHER_CONFIGURATION_CHANGE: u8 = 6;
    /// Connection collision resolution (RFC 4271 §6.8).
    pub const CONNECTION_COLLISION_RESOLUTION: u8 = 7;
    /// Out of resources.
    pub const OUT_OF_RESOURCES: u8 = 8;
    /// Hard reset (RFC 8538).
    pub const HARD_RESET: u8 = 9;
    /// BFD Down (RFC 9384): the session's BFD session went down.
    pub const BFD_DOWN: u8 = 10;
}

/// ROUTE-REFRESH Message Error subcodes (RFC 7313).
pub mod route_refresh_subcode {
    /// Length other than 4 octets of body.
    pub const INVALID_MESSAGE_LENGTH: u8 = 1;
}
