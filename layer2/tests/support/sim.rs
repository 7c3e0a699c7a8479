//! What the simulator's test files share: running a design, the cases a property test searches,
//! the cluster sizes it draws and the splits a report holds.

use std::time::Instant;

use ferrolb_layer2::sim::{Cluster, Design, Engine, Fault, Micros, Report, Violation};
use proptest::prelude::*;

/// Cases a property test searches: `SIM_CASES` or `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("SIM_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `design` on `cluster` with `faults` until `end`.
pub fn run<D: Design>(design: D, cluster: &Cluster, faults: &[Fault], end: Micros) -> Report {
    let mut engine = Engine::new(design, cluster, Instant::now());
    for f in faults {
        engine.add_fault(f.clone());
    }
    engine.run_until(end);
    engine.report()
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
