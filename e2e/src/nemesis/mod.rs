//! The nemesis (issue #36): faults at random from a seed, overlapping, for minutes or hours,
//! and checkers over the recorded history. docs/plans/nemesis.md has the plan; built so far:
//! the schedule ([`schedule`]) and the checkers ([`check`]), both pure. The recorder and the
//! injector that run them in the lab come next.

pub mod check;
pub mod schedule;
