//! Layer 2 mode: answering ARP and NDP for the Service IPs this node owns, around the pure core
//! `ferrolb-layer2` (frames, owner choice, liveness, quorum; no async runtime, no Kubernetes:
//! docs/decisions/0010, 0011, 0015).
//!
//! Who may own, decided from the same inputs on every node:
//! - [`presence`]: the known speakers, from their presence Leases (the set the quorum rule
//!   counts majorities of), and this speaker's own Lease kept renewed.
//! - [`gossip`]: the heartbeats between speakers over UDP, signed with the keys [`keys`]
//!   reloads; [`gate`]: who may own IPs and until when this node may answer.
//! - [`voters`]: with `--membership=voters`, beats to a few voter nodes and their reports in
//!   place of the heartbeats (on gossip's socket and keys; the presence set is the Nodes).
//! - [`plan`]: which node owns each IP (rendezvous hashing over the live members);
//!   [`planner`]: that plan kept between steps and replanned only where a change can move an
//!   owner; [`step`]:
//!   the work loop's layer 2 step as pure code; [`readiness`]: what `/readyz` says (it paces
//!   rolling updates); [`restart`]: whether a stopping speaker is being replaced.
//!
//! Answering:
//! - [`interfaces`]: the node's interfaces and which of them may announce; [`socket`]: the
//!   AF_PACKET socket; [`announce`]: one responder per interface answering for the owned IPs.
//! - [`status`]: what this node announces, written into ServiceL2Status objects.
//!
//! [`work`] is layer 2's part of the work loop: the membership check and the layer 2 step.

pub(crate) mod announce;
pub mod gate;
pub(crate) mod gossip;
pub mod interfaces;
pub(crate) mod keys;
pub mod plan;
pub mod planner;
pub mod presence;
pub mod readiness;
pub mod restart;
pub mod socket;
pub(crate) mod status;
pub mod step;
pub(crate) mod voter_object;
pub(crate) mod voters;
pub(crate) mod work;
