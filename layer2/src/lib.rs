//! ferrolb's layer 2 protocol core: the parts of layer 2 mode that are pure functions of their
//! inputs.
//!
//! **The rule** (docs/decisions/0010 and 0011): this crate depends on std and a few small crates
//! only (hmac, sha2, thiserror). No async runtime (tokio, futures), no sockets, no clocks (time
//! comes in as arguments), no global state and no Kubernetes crate (kube, k8s-openapi,
//! ferrolb-config). Cargo enforces it: the crate simply has no such dependency, and
//! `scripts/check-protocol-deps` checks that none creeps in through another one. The AF_PACKET
//! socket, the interface list, the heartbeat UDP loop and the planning from Kubernetes objects
//! live in the speaker (`ferrolb-speaker`'s `l2` module and `run`).
//!
//! - [`packet`] reads ARP requests and Neighbor Solicitations and builds replies and gratuitous
//!   announcements; [`packet::filter`] is the classic BPF program the speaker attaches to its
//!   packet socket.
//! - [`owner`] chooses the node that owns a Service IP by rendezvous hashing, the same on every
//!   node.
//! - [`gate`] decides, at each membership check, whether this node acts, claims and until when
//!   it answers (settling, damping, starvation, claim delay, resignation), for both memberships.
//! - [`damping`] holds a node that lost its quorum and got it back out of ownership for a while,
//!   longer each time it flaps.
//! - [`quorum`] decides whether this node may own IPs and who the candidates are;
//!   [`tenure`] how long an owner may keep answering, from the others' acknowledgements.
//! - [`heartbeat`] encodes, signs and checks the speakers' heartbeats, under a ring of keys;
//!   [`replay`] tells a new heartbeat from a replayed or forged one; [`liveness`] keeps the
//!   table of live speakers that the quorum rule and owner choice run over.
//! - [`wire`] is the membership wire format v4 (issue #34): member beats to voters, voters'
//!   reports, sized to one Ethernet frame at any cluster size.
//! - [`voters`] is the membership of issue #34: members beat to a few voters, act on a
//!   majority of their reports, at a cost per node that does not grow with the cluster;
//!   [`settling`] the waits (settle, claim delay) both designs share.
//! - [`sim`] is the event-driven simulator of many speakers over these rules, with
//!   faults and the one-owner invariants checked at every event.

pub mod damping;
pub mod gate;
pub mod heartbeat;
pub mod liveness;
pub mod owner;
pub mod packet;
pub mod quorum;
pub mod replay;
pub mod settling;
pub mod sim;
pub mod tenure;
pub mod voters;
pub mod wire;
