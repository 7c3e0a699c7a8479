//! ferrolb-speaker: makes the network deliver each Service IP to a node (layer 2 or BGP).
//!
//! Not implemented yet: the layer 2 and BGP speakers are the next milestones (see README).

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!(
        "ferrolb-speaker {}: not implemented yet; see README.md",
        env!("CARGO_PKG_VERSION")
    );
    ExitCode::from(2)
}
