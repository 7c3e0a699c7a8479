//! Layer 2 mode: answering ARP and NDP for the Service IPs this node owns.
//!
//! [`plan`] decides which node owns each IP from the same inputs on every node, with
//! [`owner`]'s rendezvous hashing over the live speakers that [`liveness`] tracks; [`interfaces`]
//! says which interfaces may announce; [`packet`] reads requests and builds replies.

pub mod interfaces;
pub mod liveness;
pub mod owner;
pub mod packet;
pub mod plan;
pub mod socket;
