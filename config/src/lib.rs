//! ferrolb's configuration core and IP allocator.
//!
//! The MetalLB-compatible CRD types, validation of a namespace's objects into one internal model,
//! and the allocator that assigns Services their addresses from the validated pools. Pure: no
//! I/O, no async.

pub mod address;
pub mod allocator;
pub mod crd;
pub mod manifest;
pub mod model;
pub mod node_address_inputs;
pub mod node_addresses;
pub mod selector;
pub mod validate;
