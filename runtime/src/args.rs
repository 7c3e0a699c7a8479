//! The command-line options both binaries take, with the same names, environment variables and
//! defaults (flattened into each binary's own options), and the parser of their Go-style
//! duration flags.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ferrolb_config::validate::{DurationError, parse_go_duration};

use crate::LogFormat;

/// Options of every long-running ferrolb binary.
#[derive(clap::Args, Clone, Debug)]
pub struct CommonArgs {
    /// Namespace of the metallb.io configuration objects, and of the objects this component
    /// writes there (its Leases and status objects).
    #[arg(
        long,
        short = 'n',
        env = "FERROLB_NAMESPACE",
        default_value = "metallb-system"
    )]
    pub namespace: String,
    /// Serve only Services with this spec.loadBalancerClass (default: Services without a class).
    #[arg(long, env = "FERROLB_LB_CLASS")]
    pub lb_class: Option<String>,
    /// Kubeconfig file (default: in-cluster config, or $KUBECONFIG / ~/.kube/config).
    #[arg(long, env = "FERROLB_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "FERROLB_LISTEN", default_value = "0.0.0.0:7472")]
    pub listen: SocketAddr,
    /// Log format.
    #[arg(long, env = "FERROLB_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log level (or a tracing filter); RUST_LOG overrides it.
    #[arg(long, env = "FERROLB_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
}

impl CommonArgs {
    /// Sets up logging as these options say ([`crate::init_logs`]).
    pub fn init_logs(&self) {
        crate::init_logs(self.log_format, &self.log_level);
    }
}

/// Parses a duration flag as Go writes durations (`100ms`, `1m30s`), the notation MetalLB's
/// flags and objects use; for clap's `value_parser`.
pub fn duration(text: &str) -> Result<Duration, DurationError> {
    parse_go_duration(text)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        common: CommonArgs,
        #[arg(long, value_parser = duration, default_value = "500ms")]
        timeout: Duration,
    }

    #[test]
    fn defaults_are_those_both_binaries_had() {
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!(cli.common.namespace, "metallb-system");
        assert_eq!(cli.common.listen, "0.0.0.0:7472".parse().unwrap());
        assert_eq!(cli.common.log_format, LogFormat::Text);
        assert_eq!(cli.common.log_level, "info");
        assert!(cli.common.lb_class.is_none() && cli.common.kubeconfig.is_none());
        assert_eq!(cli.timeout, Duration::from_millis(500));
    }

    #[test]
    fn a_bad_duration_is_refused_with_the_flag_and_the_reason() {
        let err = Cli::try_parse_from(["x", "--timeout", "5 parsecs"])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("--timeout"), "{err}");
        assert!(err.contains("5 parsecs"), "{err}");
        let cli = Cli::try_parse_from(["x", "-n", "lb", "--timeout", "1m30s"]).unwrap();
        assert_eq!(cli.common.namespace, "lb");
        assert_eq!(cli.timeout, Duration::from_secs(90));
    }
}
