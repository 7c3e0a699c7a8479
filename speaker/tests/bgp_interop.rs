//! The BGP driver against real routers: FRR 8, BIRD 2 and GoBGP 3, each in a network namespace
//! of its own, the driver in another one joined by a veth pair. Each test checks the routes in
//! the router's own table (vtysh JSON, `birdc show route all`, `gobgp global rib -j`): IPv4 and
//! IPv6 prefixes, next hops, AS_PATH and communities; then withdraws them.
//!
//! Needs root and the routers (`e2e/install-deps` installs frr, bird2, gobgpd); a test whose
//! tools are missing says so and passes. Namespaces and processes are removed on drop, also
//! when an assertion fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrolb_config::model::{Peer, PeerAsn, PeerPassword, PeerTarget};
use ferrolb_speaker::bgp::adj_out::AdjRibOut;
use ferrolb_speaker::bgp::driver::{Driver, NoObserver, PeerSettings};
use ferrolb_speaker::bgp::fsm::State;
use ferrolb_speaker::bgp::packet::{Community, LargeCommunity};
use ferrolb_speaker::bgp::plan::RouteAttributes;

const SPEAKER_V4: &str = "10.77.0.1";
const ROUTER_V4: &str = "10.77.0.2";
const SPEAKER_V6: &str = "fd77::1";
const ROUTER_V6: &str = "fd77::2";
const PREFIX_V4: &str = "198.51.100.10/32";
const PREFIX_V6: &str = "2001:db8:77::10/128";

fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Two namespaces joined by a veth pair, the router's processes, and a scratch directory.
struct Lab {
    speaker: String,
    router: String,
    dir: PathBuf,
    children: Vec<Child>,
}

impl Lab {
    /// `None` (with a note) when not root or a tool is missing.
    fn new(name: &str, tools: &[&str]) -> Option<Self> {
        if !nix_is_root() {
            eprintln!("skipping {name}: needs root");
            return None;
        }
        for t in tools {
            if !Path::new(t).exists() {
                eprintln!("skipping {name}: {t} is not installed (e2e/install-deps)");
                return None;
            }
        }
        let id = format!("flbbgp-{}-{name}", std::process::id());
        let lab = Lab {
            speaker: format!("{id}-s"),
            router: format!("{id}-r"),
            dir: std::env::temp_dir().join(&id),
            children: Vec::new(),
        };
        let _ = std::fs::remove_dir_all(&lab.dir);
        std::fs::create_dir_all(&lab.dir).unwrap();
        for ns in [&lab.speaker, &lab.router] {
            run("ip", &["netns", "add", ns]);
        }
        run(
            "ip",
            &[
                "-n",
                &lab.speaker,
                "link",
                "add",
                "s0",
                "type",
                "veth",
                "peer",
                "name",
                "r0",
                "netns",
                &lab.router,
            ],
        );
        for (ns, ifname, v4, v6) in [
            (&lab.speaker, "s0", SPEAKER_V4, SPEAKER_V6),
            (&lab.router, "r0", ROUTER_V4, ROUTER_V6),
        ] {
            run(
                "ip",
                &[
                    "netns",
                    "exec",
                    ns,
                    "sysctl",
                    "-qw",
                    "net.ipv6.conf.all.accept_dad=0",
                ],
            );
            run(
                "ip",
                &[
                    "netns",
                    "exec",
                    ns,
                    "sysctl",
                    "-qw",
                    "net.ipv6.conf.default.accept_dad=0",
                ],
            );
            run("ip", &["-n", ns, "link", "set", "lo", "up"]);
            run(
                "ip",
                &["-n", ns, "addr", "add", &format!("{v4}/24"), "dev", ifname],
            );
            run(
                "ip",
                &[
                    "-n",
                    ns,
                    "addr",
                    "add",
                    &format!("{v6}/64"),
                    "dev",
                    ifname,
                    "nodad",
                ],
            );
            run("ip", &["-n", ns, "link", "set", ifname, "up"]);
        }
        Some(lab)
    }

    fn spawn_in_router(&mut self, program: &str, args: &[&str]) {
        let mut all = vec!["netns", "exec", self.router.as_str(), program];
        all.extend_from_slice(args);
        let log = std::fs::File::create(self.dir.join(format!(
            "{}.log",
            Path::new(program).file_name().unwrap().to_string_lossy()
        )))
        .unwrap();
        let child = Command::new("ip")
            .args(&all)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.children.push(child);
    }

    fn in_router(&self, program: &str, args: &[&str]) -> String {
        let mut all = vec!["netns", "exec", self.router.as_str(), program];
        all.extend_from_slice(args);
        let out = Command::new("ip").args(&all).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Polls `check` in the router until it holds, or fails after 30 s with the last output.
    fn wait_router(&self, what: &str, mut check: impl FnMut() -> Result<(), String>) {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            match check() {
                Ok(()) => return,
                Err(e) if Instant::now() > until => panic!("{what}: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(250)),
            }
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Daemons that fork or outlive `ip netns exec` go with their namespace's processes.
        let pids = Command::new("ip")
            .args(["netns", "pids", &self.router])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        for pid in pids.split_whitespace() {
            let _ = Command::new("kill").arg(pid).status();
        }
        for ns in [&self.speaker, &self.router] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        if std::env::var_os("KEEP_BGP_LAB").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn nix_is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0\n"))
        .unwrap_or(false)
}

fn peer(name: &str, address: &str, password: Option<&str>) -> Peer {
    Peer {
        name: name.into(),
        my_asn: 64512,
        peer_asn: PeerAsn::Fixed(64500),
        target: PeerTarget::Address(address.parse().unwrap()),
        source_address: None,
        port: 179,
        hold_time: Duration::from_secs(9),
        keepalive_time: Duration::from_secs(3),
        connect_time: Some(Duration::from_secs(1)),
        router_id: Some(SPEAKER_V4.parse().unwrap()),
        node_selectors: vec![],
        password: password.map(|p| PeerPassword::Plain(p.into())),
        bfd_profile: None,
        ebgp_multi_hop: false,
        vrf: None,
        graceful_restart: false,
        local_asn: None,
        dual_stack_address_family: false,
        disable_mp: false,
    }
}

fn routes() -> AdjRibOut {
    let attrs = RouteAttributes {
        local_pref: None,
        communities: [Community::new(64512, 100)].into(),
        large_communities: [LargeCommunity {
            global_admin: 64512,
            local_data_1: 1,
            local_data_2: 2,
        }]
        .into(),
    };
    [
        (PREFIX_V4.parse().unwrap(), attrs.clone()),
        (PREFIX_V6.parse().unwrap(), attrs),
    ]
    .into()
}

fn settings(peers: &[Peer]) -> BTreeMap<String, (PeerSettings, AdjRibOut)> {
    let node: Vec<std::net::IpAddr> =
        vec![SPEAKER_V4.parse().unwrap(), SPEAKER_V6.parse().unwrap()];
    peers
        .iter()
        .map(|p| {
            (
                p.name.clone(),
                (PeerSettings::from_peer(p, &node, None).unwrap(), routes()),
            )
        })
        .collect()
}

/// Waits until every session is Established, then runs `check_announced`, withdraws and runs
/// `check_withdrawn`.
fn exercise(
    lab: &Lab,
    peers: Vec<Peer>,
    check_announced: impl Fn(&Lab) -> Result<(), String> + Send + 'static,
    check_withdrawn: impl Fn(&Lab) -> Result<(), String> + Send + 'static,
) {
    let desired = settings(&peers);
    let names: Vec<String> = desired.keys().cloned().collect();
    let (tx, rx) = std::sync::mpsc::channel::<&'static str>();
    let (back_tx, back_rx) = std::sync::mpsc::channel::<()>();
    // The driver runs in its namespace's thread; the checks run here, in step with it.
    let driver = lab_thread(lab, desired, names, tx, back_rx);
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(60)),
        Ok("established"),
        "sessions did not come up"
    );
    lab.wait_router("routes announced", || check_announced(lab));
    back_tx.send(()).unwrap();
    assert_eq!(rx.recv_timeout(Duration::from_secs(30)), Ok("withdrawn"));
    lab.wait_router("routes withdrawn", || check_withdrawn(lab));
    back_tx.send(()).unwrap();
    driver.join().unwrap();
}

fn lab_thread(
    lab: &Lab,
    desired: BTreeMap<String, (PeerSettings, AdjRibOut)>,
    names: Vec<String>,
    tx: std::sync::mpsc::Sender<&'static str>,
    back: std::sync::mpsc::Receiver<()>,
) -> std::thread::JoinHandle<()> {
    let netns = std::fs::File::open(format!("/run/netns/{}", lab.speaker)).unwrap();
    std::thread::spawn(move || {
        nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let mut driver = Driver::new(Arc::new(NoObserver));
            driver.apply(desired.clone());
            let until = Instant::now() + Duration::from_secs(45);
            loop {
                let status = driver.status();
                if names
                    .iter()
                    .all(|n| status.get(n).is_some_and(|s| s.state == State::Established))
                {
                    break;
                }
                if Instant::now() > until {
                    eprintln!("sessions: {status:#?}");
                    let _ = tx.send("timeout");
                    driver.shutdown(Duration::from_secs(1)).await;
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let _ = tx.send("established");
            // Keep the sessions running while the router is checked.
            wait_blocking(&back).await;
            let withdrawn = desired
                .into_iter()
                .map(|(n, (s, _))| (n, (s, AdjRibOut::new())))
                .collect();
            driver.apply(withdrawn);
            tokio::time::sleep(Duration::from_millis(200)).await;
            let _ = tx.send("withdrawn");
            wait_blocking(&back).await;
            driver.shutdown(Duration::from_secs(2)).await;
        });
    })
}

/// Waits for the main thread without stopping the runtime's timers and sockets.
async fn wait_blocking(rx: &std::sync::mpsc::Receiver<()>) {
    loop {
        match rx.try_recv() {
            Ok(()) | Err(std::sync::mpsc::TryRecvError::Disconnected) => return,
            Err(std::sync::mpsc::TryRecvError::Empty) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

fn contains_all(text: &str, needles: &[&str]) -> Result<(), String> {
    match needles.iter().find(|n| !text.contains(**n)) {
        None => Ok(()),
        Some(n) => Err(format!("missing {n:?} in:\n{text}")),
    }
}

fn contains_none(text: &str, needles: &[&str]) -> Result<(), String> {
    match needles.iter().find(|n| text.contains(**n)) {
        None => Ok(()),
        Some(n) => Err(format!("still {n:?} in:\n{text}")),
    }
}

#[test]
fn frr_ipv4_session_with_md5_and_ipv6_session() {
    let Some(mut lab) = Lab::new(
        "frr",
        &["/usr/lib/frr/bgpd", "/usr/lib/frr/zebra", "/usr/bin/vtysh"],
    ) else {
        return;
    };
    let d = lab.dir.display().to_string();
    std::fs::write(
        lab.dir.join("zebra.conf"),
        "frr defaults traditional\nhostname r\n!\n",
    )
    .unwrap();
    std::fs::write(
        lab.dir.join("bgpd.conf"),
        format!(
            "frr defaults traditional\nhostname r\n!\nrouter bgp 64500\n bgp router-id {ROUTER_V4}\n \
             no bgp ebgp-requires-policy\n no bgp default ipv4-unicast\n \
             neighbor {SPEAKER_V4} remote-as 64512\n neighbor {SPEAKER_V4} password s3cret\n \
             neighbor {SPEAKER_V4} timers 3 9\n neighbor {SPEAKER_V6} remote-as 64512\n \
             neighbor {SPEAKER_V6} timers 3 9\n \
             address-family ipv4 unicast\n  neighbor {SPEAKER_V4} activate\n exit-address-family\n \
             address-family ipv6 unicast\n  neighbor {SPEAKER_V4} activate\n  neighbor {SPEAKER_V6} activate\n exit-address-family\n!\n"
        ),
    )
    .unwrap();
    run("chown", &["-R", "frr:frr", &d]);
    let pathspace = lab.router.clone();
    for daemon in ["zebra", "bgpd"] {
        let mut args = vec![
            "-N".to_string(),
            pathspace.clone(),
            "-f".into(),
            format!("{d}/{daemon}.conf"),
            "-i".into(),
            format!("{d}/{daemon}.pid"),
            "-z".into(),
            format!("{d}/zserv.api"),
            "--vty_socket".into(),
            d.clone(),
        ];
        if daemon == "bgpd" {
            args.extend(["-p".into(), "179".into()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        lab.spawn_in_router(&format!("/usr/lib/frr/{daemon}"), &args);
        if daemon == "zebra" {
            let api = lab.dir.join("zserv.api");
            lab.wait_router("zebra socket", || {
                api.exists().then_some(()).ok_or("no zserv.api".into())
            });
        }
    }
    let vtysh =
        move |lab: &Lab, cmd: &str| lab.in_router("vtysh", &["--vty_socket", &d, "-c", cmd]);
    let vtysh2 = vtysh.clone();
    exercise(
        &lab,
        vec![
            peer("frr-v4", ROUTER_V4, Some("s3cret")),
            peer("frr-v6", ROUTER_V6, None),
        ],
        move |lab| {
            let v4 = vtysh(lab, &format!("show bgp ipv4 unicast {PREFIX_V4} json"));
            contains_all(
                &v4,
                &[
                    "\"aspath\"",
                    "\"string\":\"64512\"",
                    &format!("\"ip\":\"{SPEAKER_V4}\""),
                    "\"string\":\"64512:100\"",
                    "\"string\":\"64512:1:2\"",
                ],
            )?;
            let v6 = vtysh(lab, &format!("show bgp ipv6 unicast {PREFIX_V6} json"));
            // Received twice: over the IPv4 session (next hop = the node's IPv6 address) and
            // over the IPv6 session (next hop = the session's local address); both fd77::1.
            contains_all(
                &v6,
                &[
                    &format!("\"ip\":\"{SPEAKER_V6}\""),
                    "\"string\":\"64512:100\"",
                ],
            )?;
            let n = v6.matches("\"peerId\"").count();
            if n < 2 {
                return Err(format!("IPv6 prefix from {n} sessions, want 2:\n{v6}"));
            }
            Ok(())
        },
        move |lab| {
            let all = vtysh2(lab, "show bgp ipv4 unicast json")
                + &vtysh2(lab, "show bgp ipv6 unicast json");
            contains_none(&all, &["198.51.100.10", "2001:db8:77::10"])
        },
    );
}

#[test]
fn bird_receives_both_families_over_ipv4() {
    let Some(mut lab) = Lab::new("bird", &["/usr/sbin/bird", "/usr/sbin/birdc"]) else {
        return;
    };
    let conf = lab.dir.join("bird.conf");
    std::fs::write(
        &conf,
        format!(
            "router id {ROUTER_V4};\nprotocol device {{}}\n\
             protocol bgp ferrolb {{\n  local {ROUTER_V4} as 64500;\n  neighbor {SPEAKER_V4} as 64512;\n  passive on;\n  hold time 9;\n\
               ipv4 {{ import all; export none; }};\n  ipv6 {{ import all; export none; }};\n}}\n"
        ),
    )
    .unwrap();
    let sock = lab.dir.join("bird.ctl").display().to_string();
    let conf = conf.display().to_string();
    let pid = lab.dir.join("bird.pid").display().to_string();
    lab.spawn_in_router(
        "/usr/sbin/bird",
        &["-f", "-c", &conf, "-s", &sock, "-P", &pid],
    );
    let sock2 = sock.clone();
    exercise(
        &lab,
        vec![peer("bird", ROUTER_V4, None)],
        move |lab| {
            let out = lab.in_router("birdc", &["-s", &sock, "show", "route", "all"]);
            contains_all(
                &out,
                &[
                    PREFIX_V4,
                    PREFIX_V6,
                    "BGP.as_path: 64512",
                    &format!("BGP.next_hop: {SPEAKER_V4}"),
                    &format!("BGP.next_hop: {SPEAKER_V6}"),
                    "BGP.community: (64512,100)",
                    "BGP.large_community: (64512, 1, 2)",
                ],
            )
        },
        move |lab| {
            let out = lab.in_router("birdc", &["-s", &sock2, "show", "route", "all"]);
            contains_none(&out, &[PREFIX_V4, PREFIX_V6])
        },
    );
}

#[test]
fn gobgp_receives_both_families_over_ipv4() {
    let Some(mut lab) = Lab::new("gobgp", &["/usr/bin/gobgpd", "/usr/bin/gobgp"]) else {
        return;
    };
    let conf = lab.dir.join("gobgpd.toml");
    std::fs::write(
        &conf,
        format!(
            "[global.config]\n  as = 64500\n  router-id = \"{ROUTER_V4}\"\n  port = 179\n\
             [[neighbors]]\n  [neighbors.config]\n    neighbor-address = \"{SPEAKER_V4}\"\n    peer-as = 64512\n\
               [neighbors.transport.config]\n    passive-mode = true\n\
               [neighbors.timers.config]\n    hold-time = 9\n    keepalive-interval = 3\n\
               [[neighbors.afi-safis]]\n    [neighbors.afi-safis.config]\n      afi-safi-name = \"ipv4-unicast\"\n\
               [[neighbors.afi-safis]]\n    [neighbors.afi-safis.config]\n      afi-safi-name = \"ipv6-unicast\"\n"
        ),
    )
    .unwrap();
    let conf = conf.display().to_string();
    lab.spawn_in_router(
        "/usr/bin/gobgpd",
        &["-f", &conf, "-t", "toml", "--api-hosts", "127.0.0.1:50051"],
    );
    let rib = |lab: &Lab, family: &str| {
        lab.in_router(
            "gobgp",
            &[
                "-u",
                "127.0.0.1",
                "-p",
                "50051",
                "global",
                "rib",
                "-a",
                family,
                "-j",
            ],
        )
    };
    // 64512:100 and the large community as GoBGP prints them in JSON.
    let community = (64512u32 << 16 | 100).to_string();
    exercise(
        &lab,
        vec![peer("gobgp", ROUTER_V4, None)],
        move |lab| {
            let v4 = rib(lab, "ipv4");
            contains_all(
                &v4,
                &[
                    &format!("\"{PREFIX_V4}\""),
                    &format!("\"nexthop\":\"{SPEAKER_V4}\""),
                    "\"as_paths\":[{\"segment_type\":2,\"num\":1,\"asns\":[64512]}]",
                    &community,
                    "{\"ASN\":64512,\"LocalData1\":1,\"LocalData2\":2}",
                ],
            )?;
            let v6 = rib(lab, "ipv6");
            contains_all(
                &v6,
                &[
                    &format!("\"{PREFIX_V6}\""),
                    &format!("\"nexthop\":\"{SPEAKER_V6}\""),
                ],
            )
        },
        move |lab| {
            let all = rib(lab, "ipv4") + &rib(lab, "ipv6");
            contains_none(&all, &[PREFIX_V4, PREFIX_V6])
        },
    );
}
