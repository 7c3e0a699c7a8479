//! ferrolb's test kit, for tests, benches and the lab tool (`ferrolb-lab`) only, never a
//! dependency of a shipped binary:
//!
//! * [`netns`]: a lab of network namespaces of a test's own, joined by veth pairs, with the
//!   processes started in them; all of it removed on drop, also when the test panics.
//! * [`trial`]: the libtest-mimic glue for tests that need root and tools: a trial that cannot
//!   run here is reported as ignored (with the reason), never as passed; a panic is a failure.
//! * [`frr`]: FRR (zebra, bgpd) started in a lab's namespace, the real router of the speaker's
//!   lab tests, and vtysh to read its view.
//! * [`model`]: builders for `ferrolb_config::model` objects with plain defaults, so a test
//!   states only what matters to it.
//! * [`objects`]: builders for the Kubernetes objects ferrolb reads (Service, Node,
//!   EndpointSlice, Lease) instead of JSON fixtures.
// A kit for tests: a failed step is a failed test, so it panics with what went wrong.
#![allow(clippy::expect_used)]

pub mod frr;
pub mod heap;
pub mod model;
pub mod netns;
pub mod objects;
pub mod seed_corpus;
pub mod trial;
