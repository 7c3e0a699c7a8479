//! The pure core of `ferrolb explain` (issue #20): from a snapshot of the cluster's objects
//! (and what the speakers report), the whole path of a LoadBalancer IP and what is wrong with
//! it. No I/O and no async runtime: the CLI reads, this crate decides, so every answer is unit
//! tested without a cluster.

pub mod allocation;
pub mod diagnosis;
pub mod kube_proxy;
pub mod live;
pub mod node_addresses;
pub mod service;
pub mod speaker_report;
pub mod status;
