//! `ferrolb-lab` (run through `e2e/lab`): brings the lab up and down, and runs commands in it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use ferrolb_e2e::lab::{State, bin_dir, lab_dir};
use ferrolb_e2e::{Families, Lab, Options, ProxyMode, cluster, process};

/// The ferrolb lab: a real Kubernetes control plane, nodes with kube-proxy, pods, a client and an
/// FRR router, in network namespaces on this machine. Needs root.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Bring the lab up (reuses a running lab with the same options).
    Up {
        /// Number of nodes (at most 60).
        #[arg(long, default_value_t = 3)]
        nodes: u8,
        /// kube-proxy mode.
        #[arg(long, value_enum, default_value_t = ProxyMode::Iptables)]
        proxy_mode: ProxyMode,
        /// IP families of the cluster.
        #[arg(long, value_enum, default_value_t = Families::Dual)]
        families: Families,
    },
    /// The main job: lab up, ferrolb-controller, a LoadBalancer Service with two pods, and
    /// requests through its IPs from the client.
    Demo,
    /// Take the lab down: every namespace, link, route and process it made.
    Down,
    /// Show what runs.
    Status,
    /// Run a command in a host: `exec node1 -- ip addr`.
    Exec {
        /// Host name (cp, node1.., client, router, ext) or a pod's namespace (flb-podN).
        host: String,
        /// The command.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Run kubectl against the lab's API server as admin.
    Kubectl {
        /// kubectl arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// (internal) Keep node Leases fresh, as kubelets would.
    #[command(hide = true)]
    Agent,
    /// (internal) Measure an outage from a client: UDP to the echo port every --interval-ms for
    /// --duration-ms, then print the report as JSON.
    #[command(hide = true)]
    Probe {
        /// IP of the Service.
        #[arg(long)]
        ip: std::net::IpAddr,
        /// Milliseconds between datagrams.
        #[arg(long, default_value_t = 10)]
        interval_ms: u64,
        /// How long to probe, milliseconds.
        #[arg(long, default_value_t = 5000)]
        duration_ms: u64,
    },
    /// (internal) A pod's echo server.
    #[command(hide = true)]
    Echo {
        /// Pod name to answer with.
        #[arg(long)]
        name: String,
    },
}

fn exe() -> anyhow::Result<PathBuf> {
    std::env::current_exe().context("locating ferrolb-lab")
}

async fn agent() -> anyhow::Result<()> {
    let dir = lab_dir();
    let state = State::load(&dir)?.context("no lab state")?;
    let topology = state.topology.context("no topology")?;
    let client = cluster::client_from(&dir.join("pki/admin.kubeconfig")).await?;
    loop {
        if State::load(&dir)?.is_none() {
            return Ok(());
        }
        if let Err(e) = cluster::renew_leases(&client, &topology).await {
            eprintln!("agent: {e:#}");
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
}

fn status() -> anyhow::Result<()> {
    let dir = lab_dir();
    let Some(state) = State::load(&dir)? else {
        println!("lab: down");
        return Ok(());
    };
    let Some(t) = &state.topology else {
        println!("lab: down (state without topology)");
        return Ok(());
    };
    println!(
        "lab: {} ({} nodes, kube-proxy {}, {:?})",
        if state.ready { "up" } else { "incomplete" },
        t.options.nodes,
        t.options.proxy_mode.as_str(),
        t.options.families
    );
    println!("state: {}", dir.display());
    println!("\nhosts:");
    for h in &t.hosts {
        let addrs: Vec<String> = h
            .interfaces
            .iter()
            .map(|i| format!("{} {} {}", i.name, i.ipv4, i.ipv6))
            .collect();
        println!("  {:8} {:12} {}", h.name, h.netns, addrs.join("; "));
    }
    println!("\nprocesses:");
    for p in &state.processes {
        println!(
            "  {:28} pid {:7} {}  {}",
            p.name,
            p.pid,
            if process::alive(p.pid) {
                "running"
            } else {
                "DEAD"
            },
            p.log
        );
    }
    if !state.pods.is_empty() {
        println!("\npods:");
        for p in &state.pods {
            println!(
                "  {}/{} on {} {} {}",
                p.namespace,
                p.name,
                p.node,
                p.netns,
                p.ips.join(",")
            );
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result: anyhow::Result<i32> = (|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        match cli.command {
            Command::Up {
                nodes,
                proxy_mode,
                families,
            } => {
                let lab = rt.block_on(Lab::up(
                    Options {
                        nodes,
                        proxy_mode,
                        families,
                    },
                    &exe()?,
                ))?;
                println!(
                    "lab up: kubectl --kubeconfig {}",
                    lab.admin_kubeconfig().display()
                );
                Ok(0)
            }
            Command::Demo => rt.block_on(ferrolb_e2e::demo::run(&exe()?)).map(|_| 0),
            Command::Down => {
                ferrolb_e2e::down()?;
                println!("lab down");
                Ok(0)
            }
            Command::Status => status().map(|_| 0),
            Command::Exec { host, command } => {
                let lab = Lab::running(&exe()?)?.context("the lab is not up: run `e2e/lab up`")?;
                let netns = lab.netns_of(&host)?;
                let status = std::process::Command::new("ip")
                    .args(["netns", "exec", &netns])
                    .args(&command)
                    .status()?;
                Ok(status.code().unwrap_or(1))
            }
            Command::Kubectl { args } => {
                let kubeconfig = lab_dir().join("pki/admin.kubeconfig");
                let status = std::process::Command::new(bin_dir().join("kubectl"))
                    .arg("--kubeconfig")
                    .arg(kubeconfig)
                    .args(&args)
                    .status()
                    .context("running kubectl")?;
                Ok(status.code().unwrap_or(1))
            }
            Command::Agent => rt.block_on(agent()).map(|_| 0),
            Command::Echo { name } => ferrolb_e2e::echo::serve(&name).map(|_| 0),
            Command::Probe {
                ip,
                interval_ms,
                duration_ms,
            } => ferrolb_e2e::probe::run(
                std::net::SocketAddr::new(ip, ferrolb_e2e::echo::UDP_PORT),
                std::time::Duration::from_millis(interval_ms),
                std::time::Duration::from_millis(duration_ms),
            )
            .and_then(|r| {
                println!("{}", serde_json::to_string(&r)?);
                Ok(0)
            }),
        }
    })();
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
