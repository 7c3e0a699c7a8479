//! BGP-4 for the speaker: a sans-IO codec and session state machine.
//!
//! - [`packet`] encodes and decodes every message a speaker exchanges (RFC 4271, 4760, 6793,
//!   1997, 8092, 2918, 5492, 4724, 8950, 9072) and classifies malformed input into the
//!   NOTIFICATION to send or the RFC 7606 action to take. It never panics, never loops and
//!   allocates at most a small multiple of its input on any input.
//! - [`fsm`] is the RFC 4271 §8 finite state machine as a pure function from (state, event) to
//!   (state, actions). Timers and TCP are actions for the driver; there is no clock inside.
//! - [`plan`] decides what this node advertises to each peer; [`adj_out`] turns a change of
//!   plan into UPDATEs for one session. Both pure.
//! - [`driver`] is the I/O: one tokio task per peer owning its TCP connection, timers and
//!   socket options (TTL, TCP MD5).
//!
//! The decision to write our own codec rather than use a crate is recorded in
//! `docs/decisions/0010-bgp-codec.md`.

pub mod adj_out;
pub mod driver;
pub mod fsm;
pub mod packet;
pub mod plan;
