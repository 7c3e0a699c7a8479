//! Process wiring shared by ferrolb's binaries, so that nothing is copied between them:
//!
//! - [`args`]: the options both take (namespace, class, kubeconfig, listen address, logs) and
//!   the duration parser; [`init_logs`]; [`kube_client`]; [`shutdown_signal`];
//!   [`block_on_main`].
//! - [`server`]: `/metrics`, `/healthz`, `/readyz` and JSON pages, with health that follows the
//!   work loop's pulse ([`health`]) and TLS as an option ([`tls`]).
//! - [`watch`]: watches into caches and the one watch of the configuration; [`events`]: a
//!   de-duplicating Event recorder behind a bounded queue; [`owner`]: the owner references that
//!   let the garbage collector remove what a component wrote.
//! - [`failpoint`]: failpoints that tests arm to stall a live process.
//!
//! Each binary keeps its own metrics and logic.

pub mod args;
pub mod events;
pub mod failpoint;
pub mod health;
pub mod owner;
pub mod rate;
pub mod reduced;
pub mod server;
pub mod tls;
pub mod voters;
pub mod watch;

use std::path::Path;

use anyhow::Context;

/// Log output format.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Sets up logging to standard error. `RUST_LOG` overrides `level`.
pub fn init_logs(format: LogFormat, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.init(),
    }
}

/// A Kubernetes client from a kubeconfig file, or the in-cluster configuration (falling back to
/// `$KUBECONFIG` / `~/.kube/config`) when no file is given.
pub async fn kube_client(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Client> {
    Ok(kube::Client::try_from(kube_config(kubeconfig).await?)?)
}

/// The configuration [`kube_client`] builds its client from (the CLI also reads the user's
/// credentials from it).
pub async fn kube_config(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Config> {
    Ok(match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .with_context(|| format!("loading {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("finding the cluster (in-cluster config or kubeconfig)")?,
    })
}

/// Resolves when the process gets SIGTERM or SIGINT.
pub async fn shutdown_signal() -> anyhow::Result<&'static str> {
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        _ = sigterm.recv() => Ok("SIGTERM"),
        _ = tokio::signal::ctrl_c() => Ok("SIGINT"),
    }
}

/// Runs a binary's async main on the runtime both binaries use (two worker threads: the work is
/// I/O, and a node's cores belong to its workloads) and turns the outcome into the exit code: 0,
/// 1 with the error logged (with its context chain), or 2 when the runtime cannot start.
pub fn block_on_main<F>(main: F) -> std::process::ExitCode
where
    F: std::future::Future<Output = anyhow::Result<()>>,
{
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    match runtime.block_on(main) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            std::process::ExitCode::from(1)
        }
    }
}
