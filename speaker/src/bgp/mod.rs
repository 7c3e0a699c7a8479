//! BGP for the speaker: everything around the pure protocol core `ferrolb-bgp` (codec, session
//! state machine, Adj-RIB-Out; no async runtime, no Kubernetes: docs/decisions/0010).
//!
//! - [`plan`] decides, from the configuration, the Services and the Nodes, what this node
//!   advertises to each peer. Pure, but it reads ferrolb-config's model and the speaker's view
//!   of Kubernetes objects, so it stays here.
//! - [`driver`] is the I/O: one tokio task per peer owning its TCP connection, timers and
//!   socket options (TTL, TCP MD5), and the listener for incoming sessions.
//! - [`unnumbered`] finds the peer of a BGPPeer that names an interface: the rules (pure), the
//!   Router Advertisement socket, and the discovery tasks the work loop runs per link.
//! - [`vrf`] reads a VRF's addresses, for the next hops of a BGPPeer in a VRF.
//! - [`step`] is BGP's step in the work loop: the plan turned into sessions and routes for the
//!   driver, each session's BFD wired in ([`crate::bfd`]), metrics, and the live report.
//! - [`status`] writes what this node advertises into ServiceBGPStatus objects.

pub mod driver;
pub mod plan;
pub(crate) mod status;
pub(crate) mod step;
pub mod unnumbered;
pub(crate) mod vrf;

/// The span of what works for one BGPPeer alone (its session task, the report that it cannot
/// start): each line inside carries `peer` without naming it. At ERROR level so that it is
/// enabled whenever a line inside is: a span the filter disables loses its fields.
pub(crate) fn peer_span(name: &str) -> tracing::Span {
    tracing::error_span!("bgp_peer", peer = %name)
}
