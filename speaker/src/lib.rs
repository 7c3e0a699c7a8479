//! ferrolb-speaker as a library: the parts of the speaker that the binary drives, around the
//! protocol cores `ferrolb-bgp`, `ferrolb-bfd` and `ferrolb-layer2` (which need no async runtime
//! and no Kubernetes, docs/decisions/0010).
//!
//! [`bgp`] holds advertisement planning and the tokio driver that owns each session's socket and
//! timers, running `ferrolb-bgp`'s codec and state machine. [`l2`] holds layer 2 planning, the
//! interface list and the AF_PACKET socket, around `ferrolb-layer2`'s frames, owner choice and
//! liveness; [`view`] reduces Kubernetes objects to what planning reads. [`bfd`] runs the BFD
//! sessions of BGPPeers with a `bfdProfile` around `ferrolb-bfd`, and tells their BGP sessions
//! when the path fails.

pub mod bfd;
pub mod bgp;
pub mod l2;
pub mod report;
pub mod view;
