//! VRF peers (`BGPPeer.spec.vrf`) for real: the BGP driver and FRR in a User-Mode Linux guest,
//! whose kernel (Debian's `user-mode-linux`, 6.1) has the VRF driver as a module, where this
//! machine's kernel has none (docs/decisions/0020-bgp-unnumbered.md).
//!
//! The one test runs twice. On the host it boots the guest (`linux.uml`, the host's `/` as a
//! read-only hostfs root, no network device: nothing the guest sends leaves it), whose init
//! script loads `vrf` and `veth` from the package's own modules and runs this same test binary
//! again, inside, with [`GUEST_ENV`] set. Inside, two namespaces (router, node) are joined by two
//! veth pairs, one of them enslaved on both sides to a VRF `red` (table 1001); FRR runs
//! `router bgp 64500` and `router bgp 64500 vrf red`, the driver one peer in each and a third in
//! a VRF `blue` the node does not have. It checks that both sessions are Established, that the
//! VRF session's socket is bound to `red` (ss shows `%red`), that the `blue` peer never dials
//! (although its address answers in the default VRF), the routes and next hops in each of the
//! router's tables, and a TCP connection in the router's VRF to a listener bound to the node's
//! VRF. Its exit status comes back on the guest's console.
//!
//! On the host the test is skipped, with the reason printed, when it cannot run: not root, no
//! `linux.uml` or its modules (`apt-get install user-mode-linux`), no FRR, or a guest that never
//! reaches its init script; with `FERROLB_REQUIRE_UML` set (CI) those are failures. Needs the
//! Debian packages `user-mode-linux`, `kmod` (the guest's modprobe) and `frr`. The guest is one
//! host process group: it is killed by that group's id on every path, and bounded in time
//! ([`GUEST_TIMEOUT`]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ferrolb_bgp::adj_out::{AdjRibOut, RouteAttributes};
use ferrolb_bgp::fsm::State;
use ferrolb_speaker::bgp::driver::socket::bind_to_vrf;
use ferrolb_speaker::bgp::driver::{Driver, NoObserver, PeerSettings, PeerStatus};
use ferrolb_testkit::frr::{self, Frr};
use ferrolb_testkit::model;
use ferrolb_testkit::netns::{self, Lab, Netns};

/// Set in the guest: the test runs its guest half.
const GUEST_ENV: &str = "FERROLB_UML_GUEST";
/// The test's name, which the guest runs with `--exact`.
const TEST_NAME: &str = "vrf_and_default_vrf_sessions_with_frr_in_a_uml_guest";
/// Debian's user-mode-linux kernel and the directory of its modules (one per kernel version).
const UML_KERNEL: &str = "/usr/bin/linux.uml";
const UML_MODULES: &str = "/usr/lib/uml/modules";
/// What the guest runs from the host's files: FRR, and modprobe (Debian's `kmod`).
const GUEST_TOOLS: &[&str] = &[
    "/usr/lib/frr/bgpd",
    "/usr/lib/frr/zebra",
    "/usr/bin/vtysh",
    "/usr/sbin/modprobe",
];
/// From the guest's start to its result: boot (~3 s), sessions, checks.
const GUEST_TIMEOUT: Duration = Duration::from_secs(150);
/// The guest's console lines this test's init script and guest half print.
const MARK_INIT: &str = "FLB-UML-INIT";
const MARK_RESULT: &str = "FLB-UML-RESULT exit=";

// Inside the guest: the default-VRF link (r0 -- n0), the VRF link (r1 -- n1, both in `red`),
// the source of the `blue` peer (on n0), and a Service IP per VRF. Lab ranges only.
const ROUTER_DEFAULT: &str = "198.19.77.2";
const NODE_DEFAULT: &str = "198.19.77.1";
const NODE_BLUE_SOURCE: &str = "198.19.77.3";
const ROUTER_RED: &str = "198.19.78.2";
const NODE_RED: &str = "198.19.78.1";
const SERVICE_RED: &str = "198.18.100.10";
const SERVICE_DEFAULT: &str = "198.18.100.20";
const RED_TABLE: &str = "1001";
const LISTENER_PORT: u16 = 8080;

#[test]
fn vrf_and_default_vrf_sessions_with_frr_in_a_uml_guest() {
    if std::env::var_os(GUEST_ENV).is_some() {
        guest();
    } else {
        host();
    }
}

// ---- host half ----------------------------------------------------------------------------

/// Set (CI, where the guest must run): a skip is a failure.
const REQUIRE_ENV: &str = "FERROLB_REQUIRE_UML";

/// Prints why the test does not run, so a skip is never silent; fails instead when
/// [`REQUIRE_ENV`] is set.
fn skip(reason: &str) {
    assert!(
        std::env::var_os(REQUIRE_ENV).is_none(),
        "{TEST_NAME} cannot run and {REQUIRE_ENV} is set: {reason}"
    );
    // Straight to stderr: libtest captures `println!` and `eprintln!` of a passing test.
    let _ = writeln!(std::io::stderr(), "SKIPPED {TEST_NAME}: {reason}");
}

/// The UML guest: one process group, killed by its id when dropped.
struct Guest {
    child: Child,
    dir: PathBuf,
}

impl Drop for Guest {
    fn drop(&mut self) {
        // The kernel process leads its group (process_group(0)); its guest processes are
        // host processes of that group.
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill")
            .args(["-KILL", "--", &group])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
        if netns::KEEP_ENV
            .iter()
            .all(|k| std::env::var_os(k).is_none())
        {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The modules directory of the only kernel version the package ships.
fn uml_modules() -> Option<(String, PathBuf)> {
    let mut versions: Vec<_> = std::fs::read_dir(UML_MODULES)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    versions.sort();
    let version = versions.pop()?;
    let dir = Path::new(UML_MODULES).join(&version);
    dir.join("kernel/drivers/net/vrf.ko")
        .exists()
        .then_some((version, dir))
}

/// The guest's init: mounts what a fresh kernel lacks over the read-only root, loads the
/// modules with modprobe (its `-d` tree links to the package's modules), runs the guest half
/// and powers off.
fn init_script(exe: &Path, dir: &Path) -> String {
    let (exe, dir) = (exe.display(), dir.display());
    format!(
        "#!/bin/sh\n\
         export PATH=/usr/sbin:/usr/bin:/sbin:/bin\n\
         mount -t proc proc /proc\n\
         mount -t sysfs sys /sys\n\
         mount -t tmpfs run /run\n\
         mount -t tmpfs vartmp /var/tmp\n\
         echo {MARK_INIT} uptime=$(cut -d' ' -f1 /proc/uptime)\n\
         for m in vrf veth; do modprobe -d {dir}/modules $m || echo \"modprobe $m failed\"; done\n\
         mkdir -p /run/tmp /run/frr && chown frr:frr /run/frr\n\
         {GUEST_ENV}=1 TMPDIR=/run/tmp RUST_BACKTRACE=1 {exe} --exact {TEST_NAME} --nocapture --test-threads=1 2>&1\n\
         echo {MARK_RESULT}$? uptime=$(cut -d' ' -f1 /proc/uptime)\n\
         echo o > /proc/sysrq-trigger\n\
         sleep 60\n"
    )
}

fn host() {
    if !ferrolb_testkit::trial::is_root() {
        return skip(
            "needs root (hostfs gives the guest this user's rights on the host's files, FRR's among them)",
        );
    }
    if !Path::new(UML_KERNEL).exists() {
        return skip(&format!("no {UML_KERNEL}: apt-get install user-mode-linux"));
    }
    let Some((version, modules)) = uml_modules() else {
        return skip(&format!(
            "no vrf.ko under {UML_MODULES}/<version>: apt-get install user-mode-linux"
        ));
    };
    if let Some(tool) = ferrolb_testkit::trial::missing(GUEST_TOOLS) {
        return skip(&format!(
            "{tool} is not installed (apt-get install frr kmod)"
        ));
    }
    let exe = std::env::current_exe().unwrap();
    let dir = std::env::temp_dir().join(format!("flb-uml-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("modules/lib/modules")).unwrap();
    std::os::unix::fs::symlink(&modules, dir.join("modules/lib/modules").join(&version)).unwrap();
    let init = dir.join("init.sh");
    std::fs::write(&init, init_script(&exe, &dir)).unwrap();
    std::fs::set_permissions(&init, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let stderr = std::fs::File::create(dir.join("uml.stderr")).unwrap();

    let started = Instant::now();
    let spawned = Command::new(UML_KERNEL)
        .args([
            "mem=384M",
            "root=/dev/root",
            "rootfstype=hostfs",
            "rootflags=/",
            "ro",
            &format!("init={}", init.display()),
            "con=null",
            "con0=fd:0,fd:1",
        ])
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            return skip(&format!("{UML_KERNEL} does not start: {e}"));
        }
    };
    let stdout = child.stdout.take().unwrap();
    let mut guest = Guest { child, dir };

    // The console, line by line, to this test's output and to the loop below.
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut console = Vec::new();
    let mut booted = None;
    let mut result = None;
    let until = started + GUEST_TIMEOUT;
    while result.is_none() {
        let left = until.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                eprintln!("guest| {line}");
                if line.starts_with(MARK_INIT) {
                    booted = Some(started.elapsed());
                }
                if let Some(rest) = line.strip_prefix(MARK_RESULT) {
                    result = rest.split_whitespace().next().map(str::to_string);
                }
                console.push(line);
            }
            Err(_) => break,
        }
    }
    let elapsed = started.elapsed();
    // Powered off by the init script after its result: the kernel exits by itself; killed on
    // drop otherwise (at once when there is no result).
    let exit_until = Instant::now() + Duration::from_secs(10);
    while result.is_some() && Instant::now() < exit_until {
        if let Ok(Some(_)) = guest.child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let uml_stderr = std::fs::read_to_string(guest.dir.join("uml.stderr")).unwrap_or_default();
    drop(guest);
    let _ = reader.join();

    let Some(booted) = booted else {
        let tail: Vec<_> = console.iter().rev().take(20).rev().cloned().collect();
        return skip(&format!(
            "the UML guest never ran its init script within {GUEST_TIMEOUT:?}; console tail:\n{}\nstderr:\n{uml_stderr}",
            tail.join("\n")
        ));
    };
    let _ = writeln!(
        std::io::stderr(),
        "UML guest: init after {:.1} s, whole run {:.1} s",
        booted.as_secs_f64(),
        elapsed.as_secs_f64()
    );
    match result.as_deref() {
        Some("0") => {}
        Some(code) => panic!("the guest half failed (exit status {code}); its output is above"),
        None => panic!(
            "the guest gave no result within {GUEST_TIMEOUT:?} (stderr: {uml_stderr}); its output is above"
        ),
    }
}

// ---- guest half ---------------------------------------------------------------------------

/// Progress, with the guest's uptime, on the console.
fn step(what: &str) {
    let uptime = std::fs::read_to_string("/proc/uptime").unwrap_or_default();
    let uptime = uptime.split_whitespace().next().unwrap_or("?");
    println!("FLB-UML-STEP [{uptime}] {what}");
}

/// Polls `check` until it holds, or fails after `limit` with the last error.
fn wait_for(what: &str, limit: Duration, mut check: impl FnMut() -> Result<(), String>) {
    let until = Instant::now() + limit;
    loop {
        match check() {
            Ok(()) => return step(&format!("ok: {what}")),
            Err(e) if Instant::now() > until => panic!("{what}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// Starts zebra and bgpd in the router namespace: `router bgp 64500` with the node's
/// default-VRF peer and (passive) the `blue` peer's source, `router bgp 64500 vrf red` with the
/// node's VRF peer.
fn start_frr(lab: &mut Lab, router: &Netns) -> Frr {
    let bgpd = frr::bgpd_conf(
        lab.dir(),
        &format!(
            "router bgp 64500\n bgp router-id {ROUTER_DEFAULT}\n no bgp ebgp-requires-policy\n \
             neighbor {NODE_DEFAULT} remote-as 64512\n neighbor {NODE_BLUE_SOURCE} remote-as 64512\n \
             neighbor {NODE_BLUE_SOURCE} passive\n!\n\
             router bgp 64500 vrf red\n bgp router-id {ROUTER_RED}\n no bgp ebgp-requires-policy\n \
             neighbor {NODE_RED} remote-as 64512\n!\n"
        ),
    );
    Frr::start(
        lab,
        router,
        &frr::Config {
            zebra: frr::ZEBRA_CONF,
            bgpd: Some(&bgpd),
            zebra_wait: Duration::from_secs(20),
        },
    )
}

/// A BGPPeer of the node (AS 64512) to the router (AS 64500), fast timers.
fn peer(
    name: &str,
    address: &str,
    vrf: Option<&str>,
    source: Option<&str>,
) -> ferrolb_config::model::Peer {
    let mut p = model::peer(name, address)
        .hold_time(Duration::from_secs(9))
        .keepalive_time(Duration::from_secs(3))
        .connect_time(Duration::from_secs(1))
        .router_id(NODE_DEFAULT)
        .build();
    p.vrf = vrf.map(str::to_string);
    p.source_address = source.map(|s| s.parse().unwrap());
    p
}

fn routes(service: &str) -> AdjRibOut {
    [(
        format!("{service}/32").parse().unwrap(),
        RouteAttributes::default(),
    )]
    .into()
}

fn guest() {
    step("guest half started");
    let mut lab = Lab::new("flbvrf", "uml");
    let (router, node) = lab.pair(
        ("r", "r0", &[ROUTER_DEFAULT]),
        ("n", "n0", &[NODE_DEFAULT, NODE_BLUE_SOURCE]),
    );
    lab.veth((&router, "r1"), (&node, "n1"));
    for (ns, ifname, address) in [(&router, "r1", ROUTER_RED), (&node, "n1", NODE_RED)] {
        ns.ip(&["link", "add", "red", "type", "vrf", "table", RED_TABLE]);
        ns.ip(&["link", "set", "red", "up"]);
        ns.ip(&["link", "set", ifname, "master", "red"]);
        ns.add_address(ifname, address);
    }
    node.ip(&["addr", "add", &format!("{SERVICE_RED}/32"), "dev", "red"]);
    node.ip(&["addr", "add", &format!("{SERVICE_DEFAULT}/32"), "dev", "lo"]);
    step("namespaces, veth pairs and VRF red (table 1001) on both sides");
    let frr = start_frr(&mut lab, &router);
    step("FRR started");

    // The driver, in the node's namespace: default-VRF peer, VRF red peer, VRF blue peer (no
    // such device on the node; its address answers in the default VRF).
    let node_addresses: Vec<IpAddr> = vec![NODE_DEFAULT.parse().unwrap()];
    let mut desired = BTreeMap::new();
    for (p, service) in [
        (peer("default", ROUTER_DEFAULT, None, None), SERVICE_DEFAULT),
        (peer("red", ROUTER_RED, Some("red"), None), SERVICE_RED),
        (
            peer("blue", ROUTER_DEFAULT, Some("blue"), Some(NODE_BLUE_SOURCE)),
            SERVICE_RED,
        ),
    ] {
        let mut settings = PeerSettings::from_peer(&p, &node_addresses, None).unwrap();
        if p.vrf.is_some() {
            settings.use_vrf_addresses(&[NODE_RED.parse().unwrap()]);
        }
        desired.insert(p.name.clone(), (settings, routes(service)));
    }
    let (status_tx, status_rx) = mpsc::channel::<BTreeMap<String, PeerStatus>>();
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let driver = node.thread(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async move {
                let mut driver = Driver::new(Arc::new(NoObserver));
                let refused = driver.apply(desired);
                assert!(refused.is_empty(), "refused: {refused:?}");
                while let Err(mpsc::TryRecvError::Empty) = stop_rx.try_recv() {
                    let _ = status_tx.send(driver.status());
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                driver.shutdown(Duration::from_secs(2)).await;
            })
    });

    let mut status = BTreeMap::new();
    wait_for(
        "sessions default and red Established",
        Duration::from_secs(60),
        || {
            while let Ok(s) = status_rx.try_recv() {
                status = s;
            }
            let up = |n: &str| status.get(n).is_some_and(|s| s.state == State::Established);
            (up("default") && up("red"))
                .then_some(())
                .ok_or(format!("{status:#?}"))
        },
    );

    // The VRF session's socket is bound to `red`; the default one to no device.
    let sockets = node.stdout("ss", &["-tnH", "state", "established"]);
    step(&format!("node's established TCP sockets:\n{sockets}"));
    let line_to = |peer: &str| {
        sockets
            .lines()
            .find(|l| l.contains(&format!("{peer}:179")))
            .unwrap_or_else(|| panic!("no socket to {peer}:179 in:\n{sockets}"))
            .to_string()
    };
    assert!(
        line_to(ROUTER_RED).contains(&format!("{NODE_RED}%red:")),
        "the VRF session's socket is not bound to red:\n{sockets}"
    );
    assert!(
        !line_to(ROUTER_DEFAULT).contains('%'),
        "the default-VRF session's socket is bound to a device:\n{sockets}"
    );
    step("ok: the VRF session runs through the VRF device red");

    // The `blue` peer fails closed: no connection from its source, an error naming the VRF,
    // and FRR's (passive) neighbour for that source never comes up.
    while let Ok(s) = status_rx.try_recv() {
        status = s;
    }
    let blue = status.get("blue").cloned().unwrap_or_default();
    assert_ne!(blue.state, State::Established, "{blue:?}");
    let error = blue.last_error.clone().unwrap_or_default();
    assert!(
        error.contains("cannot bind to vrf \"blue\"") && error.contains("No such device"),
        "the blue peer's error: {blue:?}"
    );
    assert!(
        !sockets.contains(NODE_BLUE_SOURCE),
        "a connection from the blue peer's source, outside its VRF:\n{sockets}"
    );
    let frr_blue = frr.vtysh(&format!("show bgp neighbors {NODE_BLUE_SOURCE} json"));
    let compact: String = frr_blue.split_whitespace().collect();
    assert!(
        !compact.contains("\"bgpState\":\"Established\""),
        "FRR's neighbour for the blue peer is up:\n{frr_blue}"
    );
    step(&format!(
        "ok: the blue peer (no VRF blue on the node) fails closed: {error}"
    ));

    // Routes and next hops in each of the router's tables.
    let exact = |table: &str, service: &str| {
        router.stdout(
            "ip",
            &[
                "-4",
                "route",
                "show",
                "table",
                table,
                "exact",
                &format!("{service}/32"),
            ],
        )
    };
    wait_for(
        "routes in the router's tables",
        Duration::from_secs(30),
        || {
            let red = exact(RED_TABLE, SERVICE_RED);
            let main = exact("main", SERVICE_DEFAULT);
            (red.contains(&format!("via {NODE_RED} dev r1"))
                && main.contains(&format!("via {NODE_DEFAULT} dev r0")))
            .then_some(())
            .ok_or(format!("table {RED_TABLE}: {red:?}; main: {main:?}"))
        },
    );
    assert_eq!(
        exact("main", SERVICE_RED).trim(),
        "",
        "the VRF's route leaked into main"
    );
    assert_eq!(
        exact(RED_TABLE, SERVICE_DEFAULT).trim(),
        "",
        "the default VRF's route leaked into red"
    );
    let bgp_red = frr.vtysh(&format!(
        "show bgp vrf red ipv4 unicast {SERVICE_RED}/32 json"
    ));
    assert!(
        bgp_red.contains(NODE_RED),
        "BGP table of vrf red:\n{bgp_red}"
    );
    let bgp_default = frr.vtysh(&format!("show bgp ipv4 unicast {SERVICE_DEFAULT}/32 json"));
    assert!(
        bgp_default.contains(NODE_DEFAULT),
        "BGP table of the default VRF:\n{bgp_default}"
    );
    step(&format!(
        "ok: router table {RED_TABLE}: {}; main: {}",
        exact(RED_TABLE, SERVICE_RED).trim(),
        exact("main", SERVICE_DEFAULT).trim()
    ));

    // Traffic in the VRF: from the router's VRF red to a listener bound to the node's VRF red.
    let listener = node.on_thread(|| {
        // The address is the VRF's: the socket joins the VRF before it binds.
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        bind_to_vrf(&s, "red").unwrap();
        let address: SocketAddr = format!("{SERVICE_RED}:{LISTENER_PORT}").parse().unwrap();
        s.bind(&address.into()).unwrap();
        s.listen(4).unwrap();
        let l: TcpListener = s.into();
        l.set_nonblocking(true).unwrap();
        l
    });
    let server = std::thread::spawn(move || {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            match listener.accept() {
                Ok((mut stream, from)) => {
                    stream.set_nonblocking(false).unwrap();
                    stream.write_all(b"ferrolb vrf red\n").unwrap();
                    return from;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("accept: {e}"),
            }
        }
    });
    let service: SocketAddr = format!("{SERVICE_RED}:{LISTENER_PORT}").parse().unwrap();
    let reply = router.on_thread(move || {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        bind_to_vrf(&s, "red").unwrap();
        s.connect_timeout(&service.into(), Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("connect to {service} in vrf red: {e}"));
        let mut stream: std::net::TcpStream = s.into();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        reply
    });
    let from = server.join().unwrap();
    assert_eq!(reply, "ferrolb vrf red\n");
    assert_eq!(from.ip().to_string(), ROUTER_RED);
    // Outside the VRF the Service IP has no route on the router.
    let outside = router.on_thread(move || {
        std::net::TcpStream::connect_timeout(&service, Duration::from_secs(2)).map(|_| ())
    });
    assert!(outside.is_err(), "{service} reachable outside vrf red");
    step(&format!(
        "ok: TCP in vrf red from {from} to {service} answered; from the default VRF: {}",
        outside.unwrap_err()
    ));

    let _ = stop_tx.send(());
    driver.join().unwrap();
    step("guest half passed");
}
