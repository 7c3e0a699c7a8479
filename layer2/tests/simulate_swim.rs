//! MetalLB's membership (SWIM, through `foca`) in the simulator, for decision record 0023's
//! comparison: its view is eventually consistent, so a partition leaves both sides answering.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/sim.rs"]
mod support;
#[path = "support/swim.rs"]
mod swim;

use ferrolb_layer2::sim::{Cluster, Fault, FaultKind, SECOND, Violation, VotersDesign};
use support::run;

/// Two answering nodes after `from`.
fn splits_from(violations: &[Violation], from: u64) -> usize {
    violations
        .iter()
        .filter(|v| matches!(v, Violation::TwoAnswer { at, .. } if *at >= from))
        .count()
}

/// Once SWIM has converged, a 50/50 partition of 10 s: each side declares the other down and
/// takes its IPs, so every IP has two answering nodes until the heal. ferrolb's designs give
/// the IPs to the side with a majority (of the nodes, or of the voters) and none to the other.
#[test]
fn swim_splits_every_ip_under_a_partition() {
    let n = 6;
    let cluster = Cluster::new(n, 5);
    let mut engine = run(swim::Swim, &cluster, &[], 8 * SECOND);
    let converged = engine.report();
    assert!(converged.metrics.converged_at.is_some());
    let before = converged.violation_count;
    engine.add_fault(Fault {
        at: 8 * SECOND,
        heal: 18 * SECOND,
        kind: FaultKind::halves(n),
    });
    engine.run_until(17 * SECOND);
    for ip in 0..cluster.ips {
        assert_eq!(engine.answering(ip).len(), 2, "IP {ip} at 17 s");
    }
    engine.run_until(30 * SECOND);
    let report = engine.report();
    assert!(report.violation_count > before);
    assert!(splits_from(&report.violations, 8 * SECOND) > 0);
    // The same partition under the voters' rules: never two.
    let partition = Fault {
        at: 8 * SECOND,
        heal: 18 * SECOND,
        kind: FaultKind::halves(n),
    };
    let voters = run(VotersDesign::default(), &cluster, &[partition], 30 * SECOND).report();
    assert_eq!(splits_from(&voters.violations, 0), 0);
}
