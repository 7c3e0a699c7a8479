//! BGP-4 for the speaker: the I/O and the planning around the pure protocol core.
//!
//! The codec, the session state machine and the Adj-RIB-Out are in the `ferrolb-bgp` crate,
//! which depends on no async runtime and no Kubernetes crate (docs/decisions/0010). This module
//! holds what does:
//!
//! - [`plan`] decides, from the configuration, the Services and the Nodes, what this node
//!   advertises to each peer. Pure, but it reads ferrolb-config's model and the speaker's view of
//!   Kubernetes objects, so it stays here.
//! - [`driver`] is the I/O: one tokio task per peer owning its TCP connection, timers and
//!   socket options (TTL, TCP MD5), and `driver::discovery`, which finds an unnumbered peer on
//!   its link.
//! - [`unnumbered`] decides when to advertise ourselves on an unnumbered link and who the peer
//!   is (pure).
//!
//! [`packet`], [`fsm`] and [`adj_out`] re-export `ferrolb-bgp`'s modules, so the speaker's paths
//! (`ferrolb_speaker::bgp::packet`, ...) keep working; new code should use `ferrolb_bgp` directly.

pub mod driver;
pub mod plan;
pub mod unnumbered;

pub use ferrolb_bgp::{adj_out, fsm, packet};
