//! ferrolb-controller: allocates external IPs from IPAddressPools to LoadBalancer Services.
//!
//! `run` is the controller (several replicas, one Lease-elected leader writes); `check-config`
//! validates manifests offline.

mod check_config;
mod core;
mod gossip_secret;
mod leader;
mod node_addresses;
mod owner;
mod presence;
mod run;
mod schedule;
mod slim;
mod telemetry;
mod voters;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use ferrolb_runtime::args::CommonArgs;

/// ferrolb's controller: IP allocation for LoadBalancer Services, MetalLB-compatible.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the controller: allocate IPs to LoadBalancer Services.
    ///
    /// Every replica watches Services, Namespaces, Nodes and the metallb.io objects of its
    /// namespace and keeps them cached; only the replica holding the Lease writes. Every option
    /// can also be set through the environment variable shown.
    Run(Box<RunArgs>),
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

/// Options of `run`.
#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Namespace, class, kubeconfig, listen address and logs: as the speaker's.
    #[command(flatten)]
    common: CommonArgs,
    /// Elect a leader through a Lease; turn off only for a single replica.
    #[arg(long, env = "FERROLB_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// Name of the leader Lease (in --namespace).
    #[arg(long, env = "FERROLB_LEASE_NAME", default_value = "ferrolb-controller")]
    lease_name: String,
    /// How long the Lease holds without renewal (Go duration).
    #[arg(long, env = "FERROLB_LEASE_DURATION", default_value = "15s", value_parser = ferrolb_runtime::args::duration)]
    lease_duration: Duration,
    /// How long the leader keeps writing after its last successful renewal began; shorter than
    /// the lease duration, so a cut-off leader stops before anyone else can lead.
    #[arg(long, env = "FERROLB_RENEW_DEADLINE", default_value = "10s", value_parser = ferrolb_runtime::args::duration)]
    renew_deadline: Duration,
    /// How often to renew or try to acquire the Lease.
    #[arg(long, env = "FERROLB_RETRY_PERIOD", default_value = "2s", value_parser = ferrolb_runtime::args::duration)]
    retry_period: Duration,
    /// This replica's identity in the Lease and in Events (default: hostname and PID).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// The controller's ServiceAccount (in --namespace; the chart passes it from the downward
    /// API): it becomes the owner of the leader Lease, ConfigurationState `controller` and a
    /// gossip key Secret the controller creates, so they go with the release. Needs `get` on
    /// it. Unset (outside a pod): they have no owner.
    #[arg(long, env = "SERVICE_ACCOUNT_NAME")]
    service_account: Option<String>,
    /// TLS for /metrics, /healthz and /readyz (off unless both files are given).
    #[command(flatten)]
    pub metrics_tls: ferrolb_runtime::tls::TlsArgs,
    /// Create the speakers' gossip key Secret of this name in --namespace if it does not exist
    /// (a random 256-bit key; an existing Secret is never changed). For charts rendered by
    /// GitOps tools, where a key in the template would change on every render.
    #[arg(long, env = "FERROLB_GOSSIP_SECRET_NAME")]
    gossip_secret_name: Option<String>,
    /// A work loop that makes no progress for this long is stuck: /healthz fails and the
    /// replica gives up the Lease (Go duration).
    #[arg(long, env = "FERROLB_STALL_TIMEOUT", default_value = "30s", value_parser = ferrolb_runtime::args::duration)]
    stall_timeout: Duration,
    /// Directory of failpoint files (tests only; debug builds).
    #[arg(long, hide = true)]
    failpoints: Option<PathBuf>,
    /// Layer 2 voters (speakers on `--membership=voters` with `--voters-object`): publish the
    /// voter configuration in this ConfigMap of --namespace, and change it as nodes come and
    /// go (decision record 0023, *Changing the voters*). Unset: no voters are managed.
    #[arg(long, env = "FERROLB_VOTERS_OBJECT")]
    voters_object: Option<String>,
    /// How many voters to aim for (an odd number up to 7; fewer while fewer nodes run a
    /// speaker).
    #[arg(long, env = "FERROLB_VOTER_COUNT", default_value_t = 5, value_parser = clap::value_parser!(u8).range(1..=7))]
    voter_count: u8,
    /// How long a voter must be gone (its speaker's presence Lease expired), or room for more
    /// voters must last, before the voters change (Go duration).
    #[arg(long, env = "FERROLB_VOTER_REPLACE_AFTER", default_value = "30s", value_parser = ferrolb_runtime::args::duration)]
    voter_replace_after: Duration,
    /// The speakers' presence Lease group (their `--presence-group`): whose speakers are alive.
    #[arg(
        long,
        env = "FERROLB_PRESENCE_GROUP",
        default_value = "ferrolb-speaker"
    )]
    presence_group: String,
    /// The speakers' `--heartbeat-interval` and `--failure-timeout`: a change waits out their
    /// reports before it ends (Go durations).
    #[arg(long, env = "FERROLB_HEARTBEAT_INTERVAL", default_value = "100ms", value_parser = ferrolb_runtime::args::duration)]
    heartbeat_interval: Duration,
    /// See --heartbeat-interval.
    #[arg(long, env = "FERROLB_FAILURE_TIMEOUT", default_value = "500ms", value_parser = ferrolb_runtime::args::duration)]
    failure_timeout: Duration,
    /// Node addresses (decision record 0024, k3s ServiceLB's job): a LoadBalancer Service that
    /// no pool serves, or that asks for them (class `ferrolb.io/node-addresses`, annotation
    /// `ferrolb.io/node-addresses: "true"`), gets the addresses of the Ready nodes whose speaker
    /// is alive (--presence-group), by ServiceLB's rules. Works with no pool at all.
    #[arg(long, env = "FERROLB_NODE_ADDRESSES")]
    node_addresses: bool,
}

/// The Lease's election, started unless `--leader-elect=false` (then this replica always
/// leads); with the election's task, to wait for on shutdown (it releases the Lease).
fn start_election(
    args: &RunArgs,
    client: &kube::Client,
    identity: &str,
    owner: &ferrolb_runtime::owner::OwnerCell,
    shutdown: tokio::sync::watch::Receiver<bool>,
    pulse: ferrolb_runtime::health::Pulse,
) -> anyhow::Result<(leader::Leadership, Option<tokio::task::JoinHandle<()>>)> {
    if !args.leader_elect {
        return Ok((leader::Leadership::always(), None));
    }
    let timing = leader::Timing {
        lease_duration: args.lease_duration,
        renew_deadline: args.renew_deadline,
        retry_period: args.retry_period,
    };
    timing.validate().map_err(anyhow::Error::msg)?;
    let lease = leader::LeaseRef {
        api: kube::Api::namespaced(client.clone(), &args.common.namespace),
        name: args.lease_name.clone(),
        owner: owner.clone(),
    };
    let (leadership, task) = leader::spawn(lease, identity.to_string(), timing, shutdown, pulse);
    Ok((leadership, Some(task)))
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let client = ferrolb_runtime::kube_client(args.common.kubeconfig.as_deref()).await?;
    let identity = args.identity.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let (metrics, registry) = telemetry::Metrics::new();
    let metrics = std::sync::Arc::new(metrics);
    let ready = ferrolb_runtime::server::Ready::default();
    // The work loop beats every second; a loop silent for the stall timeout is stuck (a
    // rebuild of 100,000 Services takes seconds, not the default 30).
    let pulse = ferrolb_runtime::health::Pulse::new(args.stall_timeout);
    let server = tokio::spawn(ferrolb_runtime::server::serve(
        args.common.listen,
        ferrolb_runtime::server::Server {
            registry: std::sync::Arc::new(registry),
            ready: ready.clone(),
            not_ready_reason: "caches not synced",
            pulse: pulse.clone(),
            tls: args.metrics_tls.files()?,
            pages: Vec::new(),
        },
    ));
    // The owner of the records the controller writes, learnt in the background.
    let owner = ferrolb_runtime::owner::OwnerCell::default();
    if let Some(account) = args.service_account.as_deref() {
        owner::learn(&client, &args.common.namespace, account, owner.clone());
    }
    if let Some(name) = args.gossip_secret_name.clone() {
        gossip_secret::spawn(
            client.clone(),
            args.common.namespace.clone(),
            name,
            owner.clone(),
            args.service_account.is_some(),
        );
    }
    let (leadership, lease_task) = start_election(
        &args,
        &client,
        &identity,
        &owner,
        shutdown_rx.clone(),
        pulse.clone(),
    )?;
    tracing::info!(%identity, namespace = %args.common.namespace, lb_class = ?args.common.lb_class, "ferrolb-controller starting");
    if let Some(object) = args.voters_object.clone() {
        voters::spawn(
            client.clone(),
            voters::Settings {
                namespace: args.common.namespace.clone(),
                object,
                presence_group: args.presence_group.clone(),
                rules: ferrolb_layer2::voters::steward::Settings {
                    count: usize::from(args.voter_count),
                    replace_after: args.voter_replace_after,
                    timers: ferrolb_layer2::voters::Timers {
                        interval: args.heartbeat_interval,
                        timeout: args.failure_timeout,
                        ..Default::default()
                    },
                    ..Default::default()
                },
            },
            leadership.clone(),
            owner.clone(),
            metrics.clone(),
        );
    }
    let settings = run::Settings {
        namespace: args.common.namespace.clone(),
        lb_class: args.common.lb_class.clone(),
        identity,
        failpoints: ferrolb_runtime::failpoint::Failpoints::new(args.failpoints.clone()),
        owner,
        node_addresses: args.node_addresses.then(|| args.presence_group.clone()),
    };
    let mut controller = tokio::spawn(run::run(
        client,
        settings,
        metrics,
        ready,
        leadership,
        shutdown_rx,
        pulse,
    ));
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = sigterm.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted: shutting down"),
        r = server => return Err(anyhow::anyhow!("metrics server stopped: {r:?}")),
        // A loop that ends or panics is not left behind a process that looks alive: the
        // process exits (the Lease task has already stopped renewing) and is restarted.
        r = &mut controller => {
            let _ = shutdown_tx.send(true);
            if let Some(task) = lease_task {
                let _ = task.await;
            }
            return match r {
                Ok(Ok(())) => Err(anyhow::anyhow!("the work loop ended")),
                Ok(Err(e)) => Err(e.context("the work loop failed")),
                Err(e) => Err(anyhow::anyhow!("the work loop panicked: {e}")),
            };
        }
    }
    // Stop writing first, then release the Lease so a standby takes over at once.
    let _ = shutdown_tx.send(true);
    let _ = controller.await;
    if let Some(task) = lease_task {
        let _ = task.await;
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => {
            args.common.init_logs();
            ferrolb_runtime::block_on_main(run(*args))
        }
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
