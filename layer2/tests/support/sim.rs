//! What the simulator's test files and bench share: running a design, the voters a cluster
//! chooses, the cases a property test searches, the cluster sizes it draws and the splits a
//! report holds. Each file uses part of it.

#![allow(dead_code)]

use std::time::Instant;

use ferrolb_layer2::sim::{
    Cluster, Design, Engine, Fault, Micros, Report, Violation, VotersDesign,
};
use proptest::prelude::*;

/// Cases a property test searches: `SIM_CASES` or `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("SIM_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `design` on `cluster` with `faults` until `end`, and returns the engine: its report,
/// nodes, names and design to read, and it can run on. With `end` 0, the engine as it starts.
pub fn run<D: Design>(design: D, cluster: &Cluster, faults: &[Fault], end: Micros) -> Engine<D> {
    let mut engine = Engine::new(design, cluster, Instant::now());
    for f in faults {
        engine.add_fault(f.clone());
    }
    engine.run_until(end);
    engine
}

/// The voters chosen for a cluster of `n` (node indexes).
pub fn voter_nodes(n: usize) -> Vec<usize> {
    let engine = run(VotersDesign::default(), &Cluster::new(n, 1), &[], 0);
    engine.design().voter_nodes(engine.env())
}

/// The times two nodes answered one IP.
pub fn splits(report: &Report) -> Vec<&Violation> {
    report
        .violations
        .iter()
        .filter(|v| matches!(v, Violation::TwoAnswer { .. }))
        .collect()
}

/// Cluster sizes: mostly small (fast), some up to 50.
pub fn sizes() -> impl Strategy<Value = usize> {
    prop_oneof![4 => 5usize..=9, 1 => 10usize..=50]
}
