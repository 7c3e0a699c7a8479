//! Partial faults on a lab node's speaker heartbeats, undone when dropped (also when the test
//! fails): what the layer 2 safety tests and the failover bench inject.

use anyhow::Context as _;

use crate::Lab;

/// The speakers' heartbeat port (their default, as MetalLB's memberlist).
pub const HEARTBEAT_PORT: &str = "7946";
/// [`HEARTBEAT_PORT`] as a number.
pub const HEARTBEAT_PORT_NUMBER: u16 = 7946;

/// iptables rules inserted in one node's namespace, deleted (last first) by
/// [`Rules::remove_all`] or on drop.
struct Rules<'a> {
    lab: &'a Lab,
    node: String,
    /// The program (`iptables`, `ip6tables`) and the rule, as inserted with `-I`.
    inserted: Vec<(&'static str, Vec<String>)>,
}

impl<'a> Rules<'a> {
    fn new(lab: &'a Lab, node: &str) -> Self {
        Self {
            lab,
            node: node.to_string(),
            inserted: Vec::new(),
        }
    }

    /// Inserts `rule` with each of `programs`.
    fn insert(&mut self, programs: &[&'static str], rule: &[&str]) -> anyhow::Result<()> {
        for program in programs {
            let mut args = vec!["-I"];
            args.extend_from_slice(rule);
            self.lab.exec(&self.node, program, &args)?;
            self.inserted
                .push((program, rule.iter().map(|s| s.to_string()).collect()));
        }
        Ok(())
    }

    fn remove_all(&mut self) {
        while let Some((program, rule)) = self.inserted.pop() {
            let mut args = vec!["-D"];
            args.extend(rule.iter().map(String::as_str));
            let _ = self.lab.exec(&self.node, program, &args);
        }
    }
}

impl Drop for Rules<'_> {
    fn drop(&mut self) {
        self.remove_all();
    }
}

/// Heartbeats dropped in one node's namespace (both families), until dropped.
pub struct HeartbeatFault<'a> {
    _rules: Rules<'a>,
}

impl<'a> HeartbeatFault<'a> {
    /// Heartbeats (UDP to port 7946) dropped in `chains` of `node`: `INPUT` drops what it hears,
    /// `OUTPUT` what it sends.
    pub fn block(lab: &'a Lab, node: &str, chains: &[&str]) -> anyhow::Result<Self> {
        let mut rules = Rules::new(lab, node);
        for chain in chains {
            rules.insert(
                &["iptables", "ip6tables"],
                &[chain, "-p", "udp", "--dport", HEARTBEAT_PORT, "-j", "DROP"],
            )?;
        }
        Ok(Self { _rules: rules })
    }

    /// A share (`probability`, such as `"0.8"`) of the heartbeats `node` sends dropped at random
    /// (iptables' statistic match: the lab's kernel has no netem).
    pub fn loss(lab: &'a Lab, node: &str, probability: &str) -> anyhow::Result<Self> {
        let mut rules = Rules::new(lab, node);
        rules.insert(
            &["iptables", "ip6tables"],
            &[
                "OUTPUT",
                "-p",
                "udp",
                "--dport",
                HEARTBEAT_PORT,
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                probability,
                "-j",
                "DROP",
            ],
        )?;
        Ok(Self { _rules: rules })
    }
}

/// First port of the delay relay's listeners in a node (one per peer).
const RELAY_FIRST_PORT: u16 = 17946;

/// A one-way delay on the heartbeats one node sends, without netem (the lab's kernel has no
/// `sch_netem`): each heartbeat to a peer is DNATed to a relay in the node's namespace
/// (`ferrolb-lab delay-relay`, [`relay`]) that sends it on to the peer `delay` later. Undone on
/// drop: rules deleted, the NAT state of the heartbeat flows flushed, the relay stopped.
pub struct HeartbeatDelay<'a> {
    rules: Rules<'a>,
    relay: Option<std::process::Child>,
}

impl<'a> HeartbeatDelay<'a> {
    /// Delays every heartbeat `node` sends to `peers` (their IPv4 addresses) by `delay`.
    pub fn start(
        lab: &'a Lab,
        node: &str,
        peers: &[std::net::Ipv4Addr],
        delay: std::time::Duration,
    ) -> anyhow::Result<Self> {
        use anyhow::Context;
        let own = lab.ipv4_of(node)?;
        let mut fault = Self {
            rules: Rules::new(lab, node),
            relay: None,
        };
        // The peers' heartbeats come from port 7946 to port 7946 too: tracked, the first of
        // them after the flush below would make our heartbeats the replies of its flow, which
        // NAT rules never see. Untracked, ours open flows of their own.
        fault.rules.insert(
            &["iptables"],
            &[
                "PREROUTING",
                "-t",
                "raw",
                "-p",
                "udp",
                "--dport",
                HEARTBEAT_PORT,
                "-j",
                "NOTRACK",
            ],
        )?;
        let mut routes = Vec::new();
        for (i, peer) in peers.iter().enumerate() {
            let port = RELAY_FIRST_PORT + u16::try_from(i)?;
            routes.push(format!("{own}:{port}={peer}:{HEARTBEAT_PORT}"));
            // Only the speaker's own datagrams (source port 7946): the relay sends from
            // another port, so its output is not caught again.
            fault.rules.insert(
                &["iptables"],
                &[
                    "OUTPUT",
                    "-t",
                    "nat",
                    "-p",
                    "udp",
                    "--sport",
                    HEARTBEAT_PORT,
                    "-d",
                    &peer.to_string(),
                    "--dport",
                    HEARTBEAT_PORT,
                    "-j",
                    "DNAT",
                    "--to-destination",
                    &format!("{own}:{port}"),
                ],
            )?;
        }
        let mut command = lab.lab_command(
            node,
            &["delay-relay", "--delay-ms", &delay.as_millis().to_string()],
        )?;
        for route in &routes {
            command.args(["--route", route]);
        }
        fault.relay = Some(
            command
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::inherit())
                .spawn()
                .context("starting ferrolb-lab delay-relay")?,
        );
        // Give the relay a moment to bind, then send the flows through the new rules: NAT
        // applies to a flow's first packet, and the heartbeat flows are long established.
        std::thread::sleep(std::time::Duration::from_millis(200));
        fault.flush_heartbeat_flows();
        Ok(fault)
    }

    fn flush_heartbeat_flows(&self) {
        let _ = self.rules.lab.exec_output(
            &self.rules.node,
            "conntrack",
            &["-D", "-p", "udp", "--orig-port-dst", HEARTBEAT_PORT],
        );
    }
}

impl Drop for HeartbeatDelay<'_> {
    fn drop(&mut self) {
        // Rules first, then the NAT state they left in the flows, then the relay.
        self.rules.remove_all();
        self.flush_heartbeat_flows();
        if let Some(mut relay) = self.relay.take() {
            drop(relay.stdin.take());
            let _ = relay.kill();
            let _ = relay.wait();
        }
    }
}

/// The delay relay (`ferrolb-lab delay-relay`): for each `(listen, to)` route, every datagram
/// received on `listen` is sent to `to` `delay` after it arrived, in order. Runs until `stop`
/// says so or `limit` has passed.
pub fn relay(
    routes: &[(std::net::SocketAddr, std::net::SocketAddr)],
    delay: std::time::Duration,
    limit: std::time::Duration,
    stop: impl Fn() -> bool,
) -> anyhow::Result<()> {
    use std::net::UdpSocket;
    use std::time::{Duration, Instant};
    let (tx, rx) = std::sync::mpsc::channel::<(Instant, Vec<u8>, std::net::SocketAddr)>();
    let out = UdpSocket::bind("0.0.0.0:0")?;
    std::thread::spawn(move || {
        while let Ok((due, datagram, to)) = rx.recv() {
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let _ = out.send_to(&datagram, to);
        }
    });
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut listeners = Vec::new();
    for (listen, to) in routes {
        let socket = UdpSocket::bind(listen)?;
        socket.set_read_timeout(Some(Duration::from_millis(50)))?;
        let (tx, to, done) = (tx.clone(), *to, done.clone());
        // A thread per route, so that one route's wait never delays another's datagrams.
        listeners.push(std::thread::spawn(move || {
            let mut buf = vec![0u8; 65_536];
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(len) = socket.recv(&mut buf) {
                    let _ = tx.send((Instant::now() + delay, buf[..len].to_vec(), to));
                }
            }
        }));
    }
    let start = Instant::now();
    while !stop() && start.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(50));
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    for listener in listeners {
        let _ = listener.join();
    }
    Ok(())
}

/// Sends `count` junk datagrams to `address`:7946 from the host over the lab's bridge: random
/// bytes of random lengths, some starting like a heartbeat (`FLB` and a version byte), spread over
/// about `over`.
pub fn junk_flood(
    address: std::net::IpAddr,
    count: usize,
    over: std::time::Duration,
) -> anyhow::Result<()> {
    use std::hash::{BuildHasher, Hasher};
    let bind: std::net::SocketAddr = if address.is_ipv4() {
        "0.0.0.0:0".parse()?
    } else {
        "[::]:0".parse()?
    };
    let socket = std::net::UdpSocket::bind(bind)?;
    let seed = std::collections::hash_map::RandomState::new();
    let word = |i: u64| {
        let mut h = seed.build_hasher();
        h.write_u64(i);
        h.finish()
    };
    let pause = over / u32::try_from(count.max(1)).unwrap_or(u32::MAX);
    for i in 0..count {
        let len = 1 + (word(i as u64) % 1400) as usize;
        let mut datagram: Vec<u8> = (0..len)
            .map(|j| word((i * 2000 + j) as u64) as u8)
            .collect();
        if i % 3 == 0 && len > 4 {
            datagram[..4].copy_from_slice(b"FLB\x03");
        }
        socket.send_to(&datagram, (address, HEARTBEAT_PORT_NUMBER))?;
        if i % 100 == 0 {
            std::thread::sleep(pause * 100);
        }
    }
    Ok(())
}

/// Sends `count` valid Router Advertisements (hop limit 255, Router Lifetime 0), `interval`
/// apart, from link-local address `from` of `interface` to all nodes: what any host on a link
/// can send (run in a lab host by `ferrolb-lab send-ra`). Not looped back to the sending host.
pub fn send_router_advertisements(
    interface: &str,
    from: std::net::Ipv6Addr,
    count: u32,
    interval: std::time::Duration,
) -> anyhow::Result<()> {
    use ferrolb_layer2::packet::ndp::ALL_NODES;
    use ferrolb_layer2::packet::{MacAddr, RouterAdvertisement, router_advertisement};
    use socket2::{Domain, Protocol, SockAddr, Socket, Type};
    let index: u32 = std::fs::read_to_string(format!("/sys/class/net/{interface}/ifindex"))
        .with_context(|| format!("interface {interface}"))?
        .trim()
        .parse()?;
    let message = router_advertisement(
        &RouterAdvertisement::not_a_default_router(MacAddr([2, 0, 0, 0, 0, 0x66])),
        from,
        ALL_NODES,
    );
    let socket = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6))?;
    socket.bind_device(Some(interface.as_bytes()))?;
    socket
        .bind(&SockAddr::from(std::net::SocketAddrV6::new(
            from, 0, 0, index,
        )))
        .with_context(|| format!("binding to {from}%{interface}"))?;
    socket.set_multicast_hops_v6(255)?;
    socket.set_multicast_if_v6(index)?;
    socket.set_multicast_loop_v6(false)?;
    let to = SockAddr::from(std::net::SocketAddrV6::new(ALL_NODES, 0, 0, index));
    for _ in 0..count {
        socket.send_to(&message, &to).context("sending")?;
        std::thread::sleep(interval);
    }
    Ok(())
}

/// Sends one datagram, `hex` bytes, to `to` from port `from_port` with IP TTL `ttl` (run in a
/// lab host by `ferrolb-lab send-udp`: the BFD tests' hand-made control packets).
pub fn send_udp(
    to: std::net::SocketAddr,
    from_port: u16,
    ttl: u32,
    hex: &str,
) -> anyhow::Result<()> {
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| {
            hex.get(i..i + 2)
                .and_then(|b| u8::from_str_radix(b, 16).ok())
                .with_context(|| format!("--hex: not hex at {i}"))
        })
        .collect::<anyhow::Result<Vec<u8>>>()?;
    let bind: std::net::SocketAddr = if to.is_ipv4() {
        std::net::SocketAddr::from(([0, 0, 0, 0], from_port))
    } else {
        std::net::SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, from_port))
    };
    let socket = std::net::UdpSocket::bind(bind).context("binding the source port")?;
    if to.is_ipv4() {
        socket.set_ttl(ttl)?;
    }
    socket.send_to(&bytes, to).context("sending")?;
    Ok(())
}
