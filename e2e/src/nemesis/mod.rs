//! The nemesis (issue #36): faults at random from a seed, overlapping, for minutes or hours,
//! and checkers over the recorded history. docs/plans/nemesis.md has the plan. The schedule
//! ([`schedule`]) and the checkers ([`check`]) are pure; [`observe`] is the client's view (run
//! in its namespace), [`record`] gathers the history, [`inject`] applies the schedule to a
//! lab, [`workload`] edits Services meanwhile, [`broken`] builds the binaries the checkers
//! are shown to fail on, [`summary`] prints a run's figures.

pub mod broken;
pub mod check;
pub mod inject;
pub mod observe;
pub mod record;
pub mod schedule;
pub mod summary;
pub mod workload;
