//! ferrolb-speaker: makes the network send each Service IP's traffic to a node.
//!
//! One speaker runs on every node (host network). In layer 2 mode the speakers agree on one
//! owner per IP through heartbeats and rendezvous hashing, and the owner answers ARP and NDP for
//! it; in BGP mode every eligible node advertises routes. Everything is in the library
//! (`ferrolb_speaker::run`); this is the command line around it.

use std::process::ExitCode;

use clap::Parser;
use ferrolb_speaker::args::Args;

fn main() -> ExitCode {
    let args = Args::parse();
    args.common.init_logs();
    if args.failure_timeout < args.heartbeat_interval * 3 {
        tracing::error!(
            "--failure-timeout ({:?}) must be at least three --heartbeat-interval ({:?})",
            args.failure_timeout,
            args.heartbeat_interval
        );
        return ExitCode::from(2);
    }
    ferrolb_runtime::block_on_main(ferrolb_speaker::run::run(args))
}
