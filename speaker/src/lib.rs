//! ferrolb-speaker as a library: the pure parts of the speaker that the binary drives.
//!
//! [`bgp`] holds the BGP-4 message codec and the session state machine; both are free of I/O,
//! clocks and global state, so the tokio driver that owns sockets and timers stays thin.
//! [`l2`] holds layer 2 planning, owner choice, speaker liveness and the ARP/NDP frames;
//! [`view`] reduces Kubernetes objects to what planning reads.

pub mod bgp;
pub mod l2;
pub mod view;
