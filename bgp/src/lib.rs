//! ferrolb's BGP-4 protocol core: everything about BGP that is a pure function of its inputs.
//!
//! **The rule** (docs/decisions/0010): this crate depends on std and a few small crates only. No
//! async runtime (tokio, futures), no sockets, no clocks, no global state and no Kubernetes crate
//! (kube, k8s-openapi, ferrolb-config). Cargo enforces it: the crate simply has no such
//! dependency, and `scripts/check-protocol-deps` checks that none creeps in through another one.
//! The I/O (one tokio task per peer owning its TCP connection and timers) and the planning from
//! Kubernetes objects live in the speaker (`ferrolb-speaker`'s `bgp::driver` and `bgp::plan`).
//!
//! - [`packet`] encodes and decodes every message a speaker exchanges (RFC 4271, 4760, 6793,
//!   1997, 8092, 2918, 5492, 4724, 8950, 9072) and classifies malformed input into the
//!   NOTIFICATION to send or the RFC 7606 action to take. It never panics, never loops and
//!   allocates at most a small multiple of its input on any input.
//! - [`fsm`] is the RFC 4271 §8 finite state machine as a pure function from (state, event) to
//!   (state, actions). Timers and TCP are actions for the driver; there is no clock inside.
//! - [`adj_out`] is what was sent to one peer (Adj-RIB-Out) and turns a change of plan into the
//!   UPDATEs for one session.
//!
//! The decision to write our own codec rather than use a crate is recorded in
//! `docs/decisions/0010-bgp-codec.md`.

pub mod adj_out;
pub mod fsm;
pub mod packet;
