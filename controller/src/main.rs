//! ferrolb-controller: allocates external IPs from IPAddressPools to LoadBalancer Services.
//!
//! This binary currently offers the offline configuration check; the reconciler follows.

mod check_config;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// ferrolb's controller: IP allocation for LoadBalancer Services, MetalLB-compatible.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Validate metallb.io manifests offline, as the controller would.
    ///
    /// Reads multi-document YAML files (other API groups are skipped), prints `valid` or one
    /// line per error (`Kind namespace/name: field: message`), and exits 1 on errors.
    /// Warnings (objects in another namespace, Secrets that only the cluster can check) go to
    /// standard error and do not fail the check.
    CheckConfig {
        /// Namespace ferrolb reads its configuration from; objects without one are placed there.
        #[arg(
            long,
            short = 'n',
            env = "FERROLB_NAMESPACE",
            default_value = "metallb-system"
        )]
        namespace: String,
        /// Manifest files; `-` reads standard input.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { namespace, files } => {
            let stdout = std::io::stdout();
            let stderr = std::io::stderr();
            match check_config::run(&namespace, &files, &mut stdout.lock(), &mut stderr.lock()) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::from(1),
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::from(2)
                }
            }
        }
    }
}
