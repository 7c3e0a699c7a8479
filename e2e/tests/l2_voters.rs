//! The layer 2 suite's safety faults with `--membership=voters` (decision record 0023): one
//! owner per IP under link cuts, kills, blocked and lossy beats, a frozen owner, and hitless
//! rolling restarts, as tests/l2.rs runs them with today's heartbeats.

#[path = "l2.rs"]
mod l2;

fn main() -> std::process::ExitCode {
    l2::main()
}
