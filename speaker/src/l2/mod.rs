//! Layer 2 mode: answering ARP and NDP for the Service IPs this node owns.
//!
//! The frames, the owner choice and the liveness table are in the `ferrolb-layer2` crate, which
//! depends on no async runtime and no Kubernetes crate (docs/decisions/0010, 0011). This module
//! holds what does: [`plan`] decides which node owns each IP from the same inputs on every node
//! (reading ferrolb-config's model and the speaker's view of Kubernetes objects), with
//! [`owner`]'s rendezvous hashing over the live speakers that [`liveness`] tracks;
//! [`presence`] reads the known speakers from their presence Leases, the set the quorum rule
//! (`ferrolb_layer2::quorum`) counts majorities of; [`step`] is the work loop's step as pure
//! code; [`readiness`] is what `/readyz` says (it paces rolling updates); [`interfaces`] says
//! which interfaces may announce; [`socket`] is the AF_PACKET socket that reads requests and
//! sends the replies [`packet`] builds.
//!
//! [`packet`], [`owner`] and [`liveness`] re-export `ferrolb-layer2`'s modules, so the speaker's
//! paths (`ferrolb_speaker::l2::packet`, ...) keep working; new code should use
//! `ferrolb_layer2` directly.

pub mod gate;
pub mod interfaces;
pub mod plan;
pub mod presence;
pub mod readiness;
pub mod socket;
pub mod step;

pub use ferrolb_layer2::{liveness, owner, packet};
