//! ferrolb-speaker: makes the network send each Service IP's traffic to a node. One module per
//! protocol, each holding its planning, its I/O tasks and its status writing, around the pure
//! protocol cores `ferrolb-layer2`, `ferrolb-bgp` and `ferrolb-bfd` (which need no async runtime
//! and no Kubernetes, docs/decisions/0010):
//!
//! - [`l2`]: layer 2 mode. Presence, heartbeats and the quorum gate decide who may own; the
//!   plan picks one owner per IP; the responders answer ARP and NDP; ServiceL2Status says so.
//! - [`bgp`]: BGP mode. The plan of what each peer gets, the session driver, unnumbered peers,
//!   VRFs, and ServiceBGPStatus.
//! - [`bfd`]: the BFD sessions of BGPPeers with a `bfdProfile`, and how a BGP session follows
//!   its BFD session.
//!
//! Shared by them: [`run`] (start-up, the select loop and what one step reads and does),
//! [`args`] (the command line), [`view`] (Kubernetes objects reduced to what planning reads),
//! [`service_views`] (those views kept between steps, rebuilt for the Services that changed),
//! [`report`] (the live report `kubectl ferrolb explain` reads), and the crate's watches,
//! metrics and status object writer.

pub mod args;
pub mod bfd;
pub mod bgp;
pub mod l2;
pub(crate) mod metrics;
pub mod report;
pub mod run;
pub mod service_views;
pub(crate) mod status_objects;
pub mod view;
pub(crate) mod watch;
