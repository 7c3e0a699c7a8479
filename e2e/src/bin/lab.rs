//! `ferrolb-lab` (run through `e2e/lab`): brings the lab up and down, and runs commands in it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use ferrolb_e2e::lab::{State, bin_dir, lab_dir};
use ferrolb_e2e::{Families, Lab, Options, ProxyMode, Topology, cluster, containerlab, process};

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
        /// Real nodes: a containerd and a kubelet in every node, running the pods the API
        /// server schedules (docs/lab.md, "Kubelet nodes").
        #[arg(long)]
        kubelet: bool,
    },
    /// The main job: lab up, ferrolb-controller, a LoadBalancer Service with two pods, and
    /// requests through its IPs from the client.
    Demo {
        /// BGP mode: peers with the lab router (with BFD), requests from the external client
        /// behind it.
        #[arg(long, conflicts_with = "helm")]
        bgp: bool,
        /// The way an operator deploys: kubelet nodes, ferrolb's images imported into them,
        /// `helm install` of charts/ferrolb, and pods that the kubelets run.
        #[arg(long, conflicts_with = "servicelb")]
        helm: bool,
        /// k3s ServiceLB's job: no pool at all, the controller with node addresses on, and a
        /// Service reached on every node's address (docs/k3s.md).
        #[arg(long, conflicts_with = "bgp")]
        servicelb: bool,
    },
    /// Take the lab down: every namespace, link, route and process it made.
    Down,
    /// Print the lab as a containerlab topology (YAML): a kind cluster with the lab's nodes, the
    /// client, the FRR router and the external client, with the lab's addresses
    /// (docs/containerlab.md). Needs no root and touches nothing.
    Containerlab {
        /// Number of nodes (at most 60).
        #[arg(long, default_value_t = 3)]
        nodes: u8,
        /// kube-proxy mode.
        #[arg(long, value_enum, default_value_t = ProxyMode::Iptables)]
        proxy_mode: ProxyMode,
        /// IP families of the cluster.
        #[arg(long, value_enum, default_value_t = Families::Dual)]
        families: Families,
        /// kind's node image (default: the one the kind library in containerlab was made for).
        #[arg(long)]
        kind_image: Option<String>,
    },
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
    /// Start a lab process again (`restart speaker@node1`, `restart controller-demo`) with the
    /// command it was started with, stopping it first if it still runs; its log goes on.
    Restart {
        /// The process's name, as `status` lists it.
        name: String,
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
    /// (internal) Hold one TCP connection to the pods' stream endpoint (`GET /stream` on port
    /// 80 of the Service), a line every --interval-ms, until stdin closes or --limit-ms passes;
    /// then print the report as JSON.
    #[command(hide = true)]
    Hold {
        /// IP of the Service.
        #[arg(long)]
        ip: std::net::IpAddr,
        /// Milliseconds between lines.
        #[arg(long, default_value_t = 50)]
        interval_ms: u64,
        /// The longest it holds, milliseconds.
        #[arg(long, default_value_t = 120_000)]
        limit_ms: u64,
    },
    /// (internal) Relay datagrams with a delay, each --route LISTEN=TO (the heartbeat delay
    /// fault, e2e/src/faults.rs), until stdin closes or --limit-ms passes.
    #[command(hide = true)]
    DelayRelay {
        /// Milliseconds each datagram is held.
        #[arg(long)]
        delay_ms: u64,
        /// LISTEN=TO socket addresses.
        #[arg(long, required = true)]
        route: Vec<String>,
        /// The longest it runs, milliseconds.
        #[arg(long, default_value_t = 300_000)]
        limit_ms: u64,
    },
    /// (internal) Ask NDP who has --target on --interface: --count Neighbor Solicitations, each
    /// followed by --wait-ms of listening; prints every answer's MAC, whatever its source address
    /// (e2e/src/ndp.rs: ndisc6 drops answers from link-local sources, MetalLB's among them).
    #[command(hide = true)]
    NdpSolicit {
        /// Interface to ask on.
        #[arg(long, default_value = "eth0")]
        interface: String,
        /// The IPv6 address asked for.
        #[arg(long)]
        target: std::net::Ipv6Addr,
        /// Solicitations sent.
        #[arg(long, default_value_t = 3)]
        count: u32,
        /// Listening after each, milliseconds.
        #[arg(long, default_value_t = 300)]
        wait_ms: u64,
    },
    /// (internal) What a client sees of --ip during a nemesis run: every --interval-ms an
    /// ARP/NDP request with every MAC answering it and a datagram to the echo port; prints JSON
    /// lines (e2e/src/nemesis/observe.rs) for --duration-ms.
    #[command(hide = true)]
    NemesisObserve {
        /// The IPs observed.
        #[arg(long, required = true)]
        ip: Vec<std::net::IpAddr>,
        /// Interface to ask on.
        #[arg(long, default_value = "eth0")]
        interface: String,
        /// Milliseconds between two probes of one IP.
        #[arg(long, default_value_t = 10)]
        interval_ms: u64,
        /// How long to observe, milliseconds.
        #[arg(long)]
        duration_ms: u64,
    },
    /// Read a nemesis run's saved history (`target/nemesis/seed-<S>.json`) and print its
    /// figures and every violation the checkers find; exit 1 when there is one.
    NemesisCheck {
        /// The history file.
        history: PathBuf,
    },
    /// (internal) Send one UDP datagram (hex bytes) to --to from --from-port with IP TTL --ttl
    /// (the BFD tests' hand-made control packets, e2e/src/faults.rs `send_udp`).
    #[command(hide = true)]
    SendUdp {
        /// Destination socket address (IPv4).
        #[arg(long)]
        to: std::net::SocketAddr,
        /// Source port.
        #[arg(long, default_value_t = 49999)]
        from_port: u16,
        /// IP TTL.
        #[arg(long, default_value_t = 255)]
        ttl: u32,
        /// The payload, hex.
        #[arg(long)]
        hex: String,
    },
    /// (internal) Send valid Router Advertisements (hop limit 255, lifetime 0) from --from, a
    /// link-local address of --interface, to all nodes: the forger of the unnumbered BGP test
    /// (e2e/src/faults.rs `send_router_advertisements`).
    #[command(hide = true)]
    SendRa {
        /// Interface to send on.
        #[arg(long)]
        interface: String,
        /// Source link-local address (must be on the interface, not tentative).
        #[arg(long)]
        from: std::net::Ipv6Addr,
        /// Advertisements sent.
        #[arg(long, default_value_t = 10)]
        count: u32,
        /// Between two, milliseconds.
        #[arg(long, default_value_t = 200)]
        interval_ms: u64,
    },
    /// (internal) Run a lab process and record how it ended (see e2e/src/process.rs).
    #[command(hide = true)]
    Supervise {
        /// The process's name in the lab.
        #[arg(long)]
        name: String,
        /// Where to write how it ended.
        #[arg(long)]
        exit_file: PathBuf,
        /// The program and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
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
        // Bounded: with etcd down the API server holds a request for up to a minute, and a
        // renewal waiting that long lets kube-controller-manager mark every node not ready after
        // etcd is back (it then takes the pods' endpoints away). A kubelet times its renewal out
        // the same way and tries again soon.
        let pause = match tokio::time::timeout(
            Duration::from_secs(5),
            cluster::renew_leases(&client, &topology),
        )
        .await
        {
            Ok(Ok(())) => Duration::from_secs(5),
            Ok(Err(e)) => {
                eprintln!("agent: {e:#}");
                Duration::from_secs(1)
            }
            Err(_) => {
                eprintln!("agent: renewing the node Leases took over 5 s; trying again");
                Duration::from_secs(1)
            }
        };
        tokio::time::sleep(pause).await;
    }
}

/// The running lab, or an error that says why there is none.
fn running_lab() -> anyhow::Result<Lab> {
    if let Some(lab) = Lab::running(&exe()?)? {
        return Ok(lab);
    }
    let dead: Vec<String> = State::load(&lab_dir())?
        .map(|s| {
            s.dead_infrastructure()
                .iter()
                .map(|p| p.name.clone())
                .collect()
        })
        .unwrap_or_default();
    if dead.is_empty() {
        anyhow::bail!("the lab is not up: run `e2e/lab up`")
    }
    anyhow::bail!(
        "the lab is broken: {} died (`e2e/lab status` shows why); `e2e/lab up` rebuilds it and keeps these logs",
        dead.join(", ")
    )
}

/// Lines of a dead ferrolb process's log that `status` shows.
const TAIL_LINES: usize = 8;

/// Writes `status`; a reader that stops early (`| head`) ends it quietly instead of a panic.
fn status() -> anyhow::Result<()> {
    let mut out = String::new();
    write_status(&mut out)?;
    match std::io::Write::write_all(&mut std::io::stdout().lock(), out.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("writing the status"),
    }
}

fn write_status(out: &mut String) -> anyhow::Result<()> {
    use std::fmt::Write;
    let dir = lab_dir();
    let Some(state) = State::load(&dir)? else {
        writeln!(out, "lab: down")?;
        return Ok(());
    };
    let Some(t) = &state.topology else {
        writeln!(out, "lab: down (state without topology)")?;
        return Ok(());
    };
    let dead_infra = state.dead_infrastructure();
    let condition = match (state.ready, dead_infra.is_empty()) {
        (false, _) => "incomplete".to_string(),
        (true, true) => "up".to_string(),
        (true, false) => format!(
            "broken ({} died; `e2e/lab up` rebuilds it)",
            dead_infra
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    writeln!(
        out,
        "lab: {condition} ({} nodes, kube-proxy {}, {:?})",
        t.options.nodes,
        t.options.proxy_mode.as_str(),
        t.options.families
    )?;
    writeln!(out, "state: {}", dir.display())?;
    write_hosts(out, t)?;
    write_processes(out, &state)?;
    if !state.pods.is_empty() {
        writeln!(out, "\npods:")?;
        for p in &state.pods {
            writeln!(
                out,
                "  {}/{} on {} {} {}",
                p.namespace,
                p.name,
                p.node,
                p.netns,
                p.ips.join(",")
            )?;
        }
    }
    Ok(())
}

/// The status's hosts with their addresses, and the unnumbered links.
fn write_hosts(out: &mut String, t: &Topology) -> anyhow::Result<()> {
    use std::fmt::Write;
    writeln!(out, "\nhosts:")?;
    for h in &t.hosts {
        let addrs: Vec<String> = h
            .interfaces
            .iter()
            .map(|i| format!("{} {} {}", i.name, i.ipv4, i.ipv6))
            .collect();
        writeln!(out, "  {:8} {:12} {}", h.name, h.netns, addrs.join("; "))?;
    }
    if !t.links.is_empty() {
        writeln!(
            out,
            "\nunnumbered links (IPv6 link-local addresses only: `ip -6 addr show dev IF`):"
        )?;
        for l in &t.links {
            let [a, b] = &l.ends;
            writeln!(
                out,
                "  {}:{} <-> {}:{}",
                a.host, a.interface, b.host, b.interface
            )?;
        }
    }
    Ok(())
}

/// The status's processes, and the last lines of each dead one.
fn write_processes(out: &mut String, state: &State) -> anyhow::Result<()> {
    use std::fmt::Write;
    writeln!(out, "\nprocesses:")?;
    for p in &state.processes {
        let running = process::running(p);
        let kind = match p.kind {
            process::Kind::Infrastructure => "lab",
            process::Kind::Ferrolb => "ferrolb",
        };
        let condition = if running {
            "running".to_string()
        } else {
            format!(
                "DEAD ({})",
                process::exit_record(p).unwrap_or_else(|| "no exit status recorded".into())
            )
        };
        writeln!(
            out,
            "  {:28} {kind:8} pid {:7} {condition}  {}",
            p.name, p.pid, p.log
        )?;
    }
    for p in state.processes.iter().filter(|p| !process::running(p)) {
        writeln!(
            out,
            "\nlast lines of {} ({}); `e2e/lab restart {}` starts it again:",
            p.name, p.log, p.name
        )?;
        for line in process::log_tail(p, TAIL_LINES) {
            writeln!(out, "  | {line}")?;
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The supervisor blocks signals for itself, which holds only in a process with one thread:
    // it runs before the runtime starts any.
    if let Command::Supervise {
        name,
        exit_file,
        command,
    } = &cli.command
    {
        return match process::supervise(name, exit_file, command) {
            Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
            Err(e) => {
                eprintln!("[ferrolb-lab] supervising {name}: {e:#}");
                ExitCode::from(1)
            }
        };
    }
    match run(cli.command) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Runs a command (but `supervise`): its exit code.
fn run(command: Command) -> anyhow::Result<i32> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    match command {
        Command::Up {
            nodes,
            proxy_mode,
            families,
            kubelet,
        } => {
            let lab = rt.block_on(Lab::up(
                Options {
                    nodes,
                    proxy_mode,
                    families,
                    kubelet,
                },
                &exe()?,
            ))?;
            println!(
                "lab up: kubectl --kubeconfig {}",
                lab.admin_kubeconfig().display()
            );
            Ok(0)
        }
        Command::Demo {
            bgp,
            helm,
            servicelb,
        } => {
            let mode = match (bgp, helm, servicelb) {
                (true, _, _) => ferrolb_e2e::demo::Mode::Bgp,
                (_, true, _) => ferrolb_e2e::demo::Mode::Helm,
                (_, _, true) => ferrolb_e2e::demo::Mode::ServiceLb,
                _ => ferrolb_e2e::demo::Mode::Layer2,
            };
            rt.block_on(ferrolb_e2e::demo::run(&exe()?, mode))
                .map(|_| 0)
        }
        Command::Down => {
            ferrolb_e2e::down()?;
            println!("lab down");
            Ok(0)
        }
        Command::Status => status().map(|_| 0),
        Command::Containerlab {
            nodes,
            proxy_mode,
            families,
            kind_image,
        } => print_containerlab(nodes, proxy_mode, families, kind_image),
        Command::Exec { host, command } => exec(&host, &command),
        Command::Kubectl { args } => kubectl(&args),
        Command::Restart { name } => {
            let lab = running_lab()?;
            let p = lab.restart(&name)?;
            println!("{} restarted: pid {}, log {}", p.name, p.pid, p.log);
            Ok(0)
        }
        Command::Supervise { .. } => Ok(1), // handled above, before the runtime
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
        Command::NdpSolicit {
            interface,
            target,
            count,
            wait_ms,
        } => ferrolb_e2e::ndp::solicit(&interface, target, count, Duration::from_millis(wait_ms))
            .map(|_| 0),
        Command::NemesisObserve {
            ip,
            interface,
            interval_ms,
            duration_ms,
        } => ferrolb_e2e::nemesis::observe::run(
            &ip,
            &interface,
            Duration::from_millis(interval_ms),
            Duration::from_millis(duration_ms),
        )
        .map(|_| 0),
        Command::NemesisCheck { history } => nemesis_check(&history),
        Command::SendUdp {
            to,
            from_port,
            ttl,
            hex,
        } => ferrolb_e2e::faults::send_udp(to, from_port, ttl, &hex).map(|_| 0),
        Command::SendRa {
            interface,
            from,
            count,
            interval_ms,
        } => ferrolb_e2e::faults::send_router_advertisements(
            &interface,
            from,
            count,
            Duration::from_millis(interval_ms),
        )
        .map(|_| 0),
        Command::DelayRelay {
            delay_ms,
            route,
            limit_ms,
        } => delay_relay(delay_ms, &route, limit_ms),
        Command::Hold {
            ip,
            interval_ms,
            limit_ms,
        } => hold(ip, interval_ms, limit_ms),
    }
}

/// `nemesis-check`: the figures and violations of a saved nemesis history.
fn nemesis_check(file: &std::path::Path) -> anyhow::Result<i32> {
    use ferrolb_e2e::nemesis::{check, summary};
    let text = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let history: check::History = serde_json::from_slice(&text)
        .with_context(|| format!("{} is no nemesis history", file.display()))?;
    let ips: std::collections::BTreeSet<std::net::IpAddr> = history
        .observations
        .iter()
        .filter_map(|o| match o {
            check::Observation::Echo { ip, .. } => Some(*ip),
            _ => None,
        })
        .collect();
    print!("{}", summary::summary(&history, ips.len()));
    Ok(i32::from(
        !check::check(&history, &check::Bounds::default()).is_empty(),
    ))
}

/// `containerlab`: the lab's topology as a containerlab topology on stdout.
fn print_containerlab(
    nodes: u8,
    proxy_mode: ProxyMode,
    families: Families,
    kind_image: Option<String>,
) -> anyhow::Result<i32> {
    let topology = Topology::standard(Options {
        nodes,
        proxy_mode,
        families,
        kubelet: false,
    });
    let settings = containerlab::Settings {
        kind_image,
        ..containerlab::Settings::default()
    };
    let yaml = containerlab::generate(&topology, &settings)?;
    // A reader that stops early (`| head`) ends it quietly, as for `status`.
    match std::io::Write::write_all(&mut std::io::stdout().lock(), yaml.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(0),
        other => other.context("writing the topology")?,
    }
    for bridge in containerlab::bridges(&topology) {
        eprintln!(
            "containerlab does not create bridges: before `containerlab deploy`, run\n  ip link add {bridge} type bridge && ip link set {bridge} up"
        );
    }
    Ok(0)
}

/// `exec HOST -- CMD`: runs CMD in the host's namespace; its exit code.
fn exec(host: &str, command: &[String]) -> anyhow::Result<i32> {
    let lab = running_lab()?;
    let netns = lab.netns_of(host)?;
    let status = std::process::Command::new("ip")
        .args(["netns", "exec", &netns])
        .args(command)
        .status()?;
    Ok(status.code().unwrap_or(1))
}

/// `kubectl ARGS` with the lab's admin credentials; its exit code.
fn kubectl(args: &[String]) -> anyhow::Result<i32> {
    let kubeconfig = lab_dir().join("pki/admin.kubeconfig");
    let status = std::process::Command::new(bin_dir().join("kubectl"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .status()
        .context("running kubectl")?;
    Ok(status.code().unwrap_or(1))
}

/// `delay-relay`: relays datagrams with a delay until stdin closes or the limit passes.
fn delay_relay(delay_ms: u64, route: &[String], limit_ms: u64) -> anyhow::Result<i32> {
    let routes = route
        .iter()
        .map(|r| {
            let (listen, to) = r
                .split_once('=')
                .with_context(|| format!("--route {r}: LISTEN=TO"))?;
            Ok((listen.parse()?, to.parse()?))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let closed = stdin_closed();
    ferrolb_e2e::faults::relay(
        &routes,
        std::time::Duration::from_millis(delay_ms),
        std::time::Duration::from_millis(limit_ms),
        || closed.load(std::sync::atomic::Ordering::Relaxed),
    )
    .map(|_| 0)
}

/// Set once stdin is closed: how a test stops a helper it started (`hold`, `delay-relay`).
fn stdin_closed() -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    let closed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = closed.clone();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        flag.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    closed
}

/// `hold`: a long-lived TCP connection to the IP's port 80, until stdin closes or the limit
/// passes; what happened to it, as JSON on stdout.
fn hold(ip: std::net::IpAddr, interval_ms: u64, limit_ms: u64) -> anyhow::Result<i32> {
    let closed = stdin_closed();
    ferrolb_e2e::probe::hold(
        std::net::SocketAddr::new(ip, 80),
        std::time::Duration::from_millis(interval_ms),
        std::time::Duration::from_millis(limit_ms),
        || closed.load(std::sync::atomic::Ordering::Relaxed),
    )
    .and_then(|r| {
        println!("{}", serde_json::to_string(&r)?);
        Ok(0)
    })
}
