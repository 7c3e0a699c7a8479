//! ferrolb's configuration core: the MetalLB-compatible CRD types, validation of a namespace's
//! objects into one internal model, and the IP allocator. Pure: no I/O, no async.

pub mod crd;
