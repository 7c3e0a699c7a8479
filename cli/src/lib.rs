//! The `ferrolb` command (also `kubectl ferrolb`): reads the cluster with the user's kubeconfig
//! and read access only, and lets `ferrolb_explain` decide. This crate is the I/O around it:
//! the arguments, the listing, the printing.

pub mod colour;
pub mod live;
pub mod voters;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use ferrolb_config::allocator::ServiceKey;
use ferrolb_config::crd::{
    BFDProfile, BGPAdvertisement, BGPPeer, Community, IPAddressPool, L2Advertisement,
    ServiceBGPStatus, ServiceL2Status,
};
use ferrolb_config::validate::{NodeInfo, Objects, validate};
use ferrolb_explain::live::NodeFacts;
use ferrolb_explain::service::{self, ServiceReport, Snapshot};
use ferrolb_explain::status;
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};

/// Exit status when the explanation found problems (0: none; 1: the command itself failed).
pub const PROBLEMS_FOUND: u8 = 2;

/// ferrolb's command line: where traffic to a LoadBalancer IP goes, and why it does not arrive.
#[derive(Debug, Parser)]
#[command(name = "ferrolb", version)]
pub struct Cli {
    /// Kubeconfig to use (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The namespace of the configuration objects (IPAddressPools, advertisements, peers).
    #[arg(long, global = true, default_value = "metallb-system")]
    pub config_namespace: String,
    /// The LoadBalancer class the cluster's ferrolb serves, if it was given one.
    #[arg(long, global = true)]
    pub lb_class: Option<String>,
    /// The labels of the speaker Pods, whose live reports are read through the API server's
    /// proxy (in the configuration namespace).
    #[arg(long, global = true, default_value = live::SPEAKER_POD_LABELS)]
    pub speaker_selector: String,
    /// Output format.
    #[arg(short, long, global = true, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// Colour in text output: on a terminal (auto, unless NO_COLOR is set), always, never.
    #[arg(long, global = true, value_enum, default_value_t = colour::When::Auto)]
    pub color: colour::When,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Output formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// For people.
    Text,
    /// For scripts: the schema `explain.ferrolb.io/v1alpha1` (docs/explain.md).
    Json,
}

/// Commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The whole path of a Service's IPs, and what is wrong with it.
    Explain {
        /// What to explain.
        #[command(subcommand)]
        what: Explain,
    },
    /// The cluster at a glance: pools and their usage, Services, speakers, every problem.
    Status,
    /// The layer 2 voters the controller chose (speaker.membership=voters), and where each
    /// voter node is in a change.
    Voters {
        /// The voter configuration's ConfigMap, in the configuration namespace (the chart's:
        /// `<release>-voters`).
        #[arg(long, default_value = "ferrolb-voters")]
        object: String,
    },
}

/// What `explain` explains.
#[derive(Debug, Subcommand)]
pub enum Explain {
    /// A LoadBalancer Service, as NAMESPACE/NAME.
    Service {
        /// NAMESPACE/NAME.
        service: String,
    },
    /// The Service holding this IP.
    Ip {
        /// The LoadBalancer IP.
        address: IpAddr,
    },
}

/// Runs the command line of this process.
pub fn main() -> ExitCode {
    // Usage errors exit 1 (as any failure), not clap's 2, which means "problems found" here.
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ferrolb: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ferrolb: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: &Cli) -> anyhow::Result<ExitCode> {
    let config = ferrolb_runtime::kube_config(cli.kubeconfig.as_deref()).await?;
    // The speakers answer only callers whose token allows it (docs/explain.md).
    let token = live::bearer_token(&config).await;
    let client = kube::Client::try_from(config)?;
    if let Command::Voters { object } = &cli.command {
        let v = voters::read(&client, &cli.config_namespace, object).await?;
        let text = match cli.output {
            Output::Text => painted(voters::render_text(&v), cli.color),
            Output::Json => serde_json::to_string_pretty(&v)? + "\n",
        };
        std::io::stdout().lock().write_all(text.as_bytes())?;
        return Ok(ExitCode::SUCCESS);
    }
    let snapshot = read(
        &client,
        token.as_deref(),
        &cli.config_namespace,
        cli.lb_class.clone(),
        &cli.speaker_selector,
    )
    .await?;
    let what = match &cli.command {
        Command::Explain { what } => what,
        Command::Voters { .. } => return Ok(ExitCode::SUCCESS),
        Command::Status => {
            let report = status::status(&snapshot);
            let text = match cli.output {
                Output::Text => painted(status::render_text(&report), cli.color),
                Output::Json => serde_json::to_string_pretty(&report)? + "\n",
            };
            std::io::stdout().lock().write_all(text.as_bytes())?;
            return Ok(exit_code(report.diagnoses.is_empty()));
        }
    };
    let key = match what {
        Explain::Service { service } => {
            let key = parse_key(service)?;
            let known = snapshot.services.iter().any(|s| {
                s.metadata.namespace.as_deref() == Some(key.namespace())
                    && s.metadata.name.as_deref() == Some(key.name())
                    && ferrolb_config::allocator::is_ours(s, cli.lb_class.as_deref())
            });
            anyhow::ensure!(
                known,
                "no LoadBalancer Service {key} served by this ferrolb (check the name, spec.type and spec.loadBalancerClass{})",
                cli.lb_class
                    .as_deref()
                    .map(|c| format!(", which must be {c:?}"))
                    .unwrap_or_default()
            );
            key
        }
        Explain::Ip { address } => {
            service::service_of_ip(&snapshot, *address).with_context(|| {
                format!("no Service has {address} in its status.loadBalancer.ingress")
            })?
        }
    };
    let report = service::explain(&snapshot, &key);
    print(&report, cli.output, cli.color)?;
    Ok(exit_code(report.diagnoses.is_empty()))
}

fn exit_code(healthy: bool) -> ExitCode {
    if healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(PROBLEMS_FOUND)
    }
}

/// `NAMESPACE/NAME` as a Service key.
pub fn parse_key(text: &str) -> anyhow::Result<ServiceKey> {
    match text.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok(ServiceKey::new(ns, name))
        }
        _ => anyhow::bail!("{text:?}: give the Service as NAMESPACE/NAME"),
    }
}

/// `text`, in colour when `when` says so. Control characters other than newlines (a speaker's
/// error text could carry them) never reach the terminal.
fn painted(text: String, when: colour::When) -> String {
    let text: String = text
        .chars()
        .filter(|c| *c == '\n' || !c.is_control())
        .collect();
    if when.paints() {
        colour::paint(&text)
    } else {
        text
    }
}

fn print(report: &ServiceReport, output: Output, when: colour::When) -> anyhow::Result<()> {
    let text = match output {
        Output::Text => painted(service::render_text(report), when),
        Output::Json => serde_json::to_string_pretty(report)? + "\n",
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    Ok(())
}

/// Lists what the explanation reads (read access only).
async fn read(
    client: &kube::Client,
    token: Option<&str>,
    namespace: &str,
    lb_class: Option<String>,
    speaker_selector: &str,
) -> anyhow::Result<Snapshot> {
    let lp = ListParams::default();
    macro_rules! list {
        ($api:expr, $what:literal) => {
            $api.list(&lp)
                .await
                .with_context(|| format!("listing {}", $what))?
                .items
        };
    }
    let services: Vec<Service> = list!(Api::<Service>::all(client.clone()), "Services");
    let namespaces: BTreeMap<String, _> =
        list!(Api::<Namespace>::all(client.clone()), "Namespaces")
            .into_iter()
            .filter_map(|n| Some((n.metadata.name?, n.metadata.labels.unwrap_or_default())))
            .collect();
    let slices: Vec<EndpointSlice> =
        list!(Api::<EndpointSlice>::all(client.clone()), "EndpointSlices");
    let node_objects: Vec<Node> = list!(Api::<Node>::all(client.clone()), "Nodes");
    let nodes: Vec<NodeInfo> = node_objects
        .iter()
        .filter(|n| n.metadata.name.is_some())
        .map(|n| NodeInfo::from_metadata(&n.metadata))
        .collect();
    let speakers = live::read(client, token, namespace, speaker_selector).await?;
    let ns = |c: &kube::Client| c.clone();
    let objects = Objects {
        namespace: namespace.to_string(),
        pools: list!(
            Api::<IPAddressPool>::namespaced(ns(client), namespace),
            "IPAddressPools"
        ),
        l2_advertisements: list!(
            Api::<L2Advertisement>::namespaced(ns(client), namespace),
            "L2Advertisements"
        ),
        bgp_advertisements: list!(
            Api::<BGPAdvertisement>::namespaced(ns(client), namespace),
            "BGPAdvertisements"
        ),
        peers: list!(
            Api::<BGPPeer>::namespaced(ns(client), namespace),
            "BGPPeers"
        ),
        communities: list!(
            Api::<Community>::namespaced(ns(client), namespace),
            "Communities"
        ),
        bfd_profiles: list!(
            Api::<BFDProfile>::namespaced(ns(client), namespace),
            "BFDProfiles"
        ),
        nodes: Some(nodes),
    };
    let validated = validate(&objects);
    Ok(Snapshot {
        namespace: namespace.to_string(),
        config: validated.config,
        services,
        namespaces,
        slices,
        l2_statuses: list!(
            Api::<ServiceL2Status>::namespaced(ns(client), namespace),
            "ServiceL2Statuses"
        ),
        bgp_statuses: list!(
            Api::<ServiceBGPStatus>::namespaced(ns(client), namespace),
            "ServiceBGPStatuses"
        ),
        lb_class,
        config_errors: validated.errors,
        nodes: node_objects
            .iter()
            .filter_map(NodeFacts::from_node)
            .collect(),
        speakers: speakers.speakers,
        live_unavailable: speakers.unavailable,
        speakers_unknown: speakers.unknown,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_keys_are_namespace_slash_name() {
        assert_eq!(
            parse_key("web/app").ok(),
            Some(ServiceKey::new("web", "app"))
        );
        for bad in ["app", "/app", "web/", "a/b/c"] {
            let e = parse_key(bad)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains("NAMESPACE/NAME"), "{bad}: {e}");
        }
    }

    #[test]
    fn status_parses() {
        let cli = Cli::try_parse_from(["kubectl-ferrolb", "status", "-o", "json"]);
        assert!(
            matches!(
                cli.as_ref().map(|c| (&c.command, c.output)),
                Ok((Command::Status, Output::Json))
            ),
            "{cli:?}"
        );
    }

    #[test]
    fn the_command_line_parses() {
        let cli = Cli::try_parse_from(["ferrolb", "explain", "ip", "198.18.200.1", "-o", "json"]);
        assert!(
            matches!(
                cli.as_ref().map(|c| (&c.command, c.output)),
                Ok((
                    Command::Explain {
                        what: Explain::Ip { .. }
                    },
                    Output::Json
                ))
            ),
            "{cli:?}"
        );
    }
}
