//! ferrolb-speaker as a library: the pure parts of the speaker that the binary drives.
//!
//! [`bgp`] holds the BGP-4 message codec and the session state machine; both are free of I/O,
//! clocks and global state, so the tokio driver that owns sockets and timers stays thin.

pub mod bgp;
pub mod l2;
