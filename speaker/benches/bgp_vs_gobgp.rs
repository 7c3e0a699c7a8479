//! ferrolb's BGP driver against GoBGP, both sending to the same FRR 8 router, side by side.
//!
//! Two network namespaces joined by a veth pair (198.19.0.1 sender, 198.19.0.2 FRR); FRR runs
//! zebra and bgpd, so received routes go into the router namespace's kernel table. Every
//! scenario gets a fresh lab (new namespaces, new FRR, same FRR configuration), so every session
//! is new. What is measured:
//!
//! * **(a) one more /32:** the driver is handed a plan with one prefix more; time until bgpd
//!   counts it (`pfxRcd`, polled every 2 ms over bgpd's vty socket) and until zebra has put it
//!   into the kernel (a netlink listener in the router namespace sees the `RTM_NEWROUTE`; exact
//!   to the millisecond). Done with few other routes and with 10,000 others. GoBGP, for
//!   reference: from starting `gobgp global rib add` (so including the CLI's own start).
//! * **(b) 10,000 prefixes:** cold: the sender's table is loaded before the session exists
//!   (ferrolb: the plan; GoBGP: `gobgp mrt inject global` of an MRT file while the neighbour is
//!   admin-down, then `gobgp neighbor ... enable`), timed from Established (bgpd's own log line,
//!   microsecond timestamps) to bgpd counting 10,000 (`pfxRcd` polled every 10 ms) and to the
//!   kernel holding all 10,000. Warm: the session is up, then 10,000 new prefixes are handed
//!   over at once (ferrolb: one new plan; GoBGP: `gobgp mrt inject global`, timed from the start
//!   of the command).
//! * **(c) memory:** RSS / peak RSS of a process that runs only the driver (this bench
//!   re-executed as a child in the sender namespace) holding 10,000 advertised prefixes, and of
//!   gobgpd holding the same.
//!
//! Needs root, FRR (`/usr/lib/frr/{zebra,bgpd}`), `gobgpd` and `gobgp`; says so and stops
//! otherwise. Everything it starts (namespaces, processes, files) is removed on drop, also on
//! panic. Environment: `FERROLB_BENCH_PREFIXES` (10000), `FERROLB_BENCH_SAMPLES` (50),
//! `FERROLB_BENCH_RUNS` (3).
//!
//! Run: `cargo bench -p ferrolb-speaker --bench bgp_vs_gobgp` (as root)
#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_precision_loss
)]

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferrolb_bgp::adj_out::RouteAttributes;
use ferrolb_bgp::adj_out::{self, AdjRibOut, SessionContext};
use ferrolb_bgp::fsm::State;
use ferrolb_bgp::packet::{AfiSafi, CodecContext, Community, LargeCommunity, Message};
use ferrolb_config::model::Peer;
use ferrolb_speaker::bgp::driver::{Driver, NoObserver, PeerSettings};
use ferrolb_testkit::netns::{self, Netns};
use ferrolb_testkit::{model, trial};
use ipnet::{IpNet, Ipv4Net};

const SPEAKER_V4: &str = "198.19.0.1";
const ROUTER_V4: &str = "198.19.0.2";
const CHILD_ENV: &str = "FERROLB_BGP_BENCH_CHILD";
const ZEBRA: &str = "/usr/lib/frr/zebra";
const BGPD: &str = "/usr/lib/frr/bgpd";
const GOBGPD: &str = "/usr/bin/gobgpd";
const GOBGP: &str = "/usr/bin/gobgp";
/// How long FRR runs before a sender may connect.
const FRR_SETTLE: Duration = Duration::from_secs(3);
/// Repeats of the first prefix after the real ones in the MRT file (see `mrt_file`).
const MRT_PADDING: usize = 1000;

// ---------------------------------------------------------------------------------------------
// Small helpers

/// Wall clock in seconds: bgpd's log has wall-clock timestamps, so everything uses it.
fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Polls `f` every `every` until it returns `Some`, or panics after `limit`.
fn wait_for<T>(
    what: &str,
    limit: Duration,
    every: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> T {
    let until = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < until, "timed out after {limit:?}: {what}");
        std::thread::sleep(every);
    }
}

/// Nearest-rank percentile of `xs` (sorted here), in the unit of `xs`.
fn pct(xs: &[f64], p: f64) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    v[rank.min(v.len()) - 1]
}

fn ms(secs: f64) -> String {
    format!("{:.1} ms", secs * 1000.0)
}

fn summary(xs: &[f64]) -> String {
    format!(
        "p50 {} p99 {} min {} max {} (n={})",
        ms(pct(xs, 50.0)),
        ms(pct(xs, 99.0)),
        ms(pct(xs, 0.0)),
        ms(pct(xs, 100.0)),
        xs.len()
    )
}

/// `VmRSS` and `VmHWM` of a process, in KiB.
fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

// ---------------------------------------------------------------------------------------------
// The routes

fn attributes() -> RouteAttributes {
    RouteAttributes {
        local_pref: None,
        communities: [Community::new(64512, 100)].into(),
        large_communities: [LargeCommunity {
            global_admin: 64512,
            local_data_1: 1,
            local_data_2: 2,
        }]
        .into(),
    }
}

/// The i-th of the bulk prefixes: 198.18.0.0/32 upwards (10,000 end at 198.18.39.15).
fn bulk_prefix(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(0xc612_0000 + u32::try_from(i).unwrap())
}

/// The k-th single prefix of the latency samples: 198.18.200.0 upwards.
fn single_prefix(k: usize) -> Ipv4Addr {
    Ipv4Addr::from(0xc612_c800 + u32::try_from(k).unwrap())
}

fn plan_of(prefixes: impl IntoIterator<Item = Ipv4Addr>) -> AdjRibOut {
    let attrs = attributes();
    prefixes
        .into_iter()
        .map(|a| (IpNet::V4(Ipv4Net::new(a, 32).unwrap()), attrs.clone()))
        .collect()
}

fn peer() -> Peer {
    model::peer("frr", ROUTER_V4)
        .hold_time(Duration::from_secs(9))
        .keepalive_time(Duration::from_secs(3))
        .connect_time(Duration::from_secs(1))
        .router_id(SPEAKER_V4)
        .build()
}

fn desired(routes: AdjRibOut) -> BTreeMap<String, (PeerSettings, AdjRibOut)> {
    let node = vec![SPEAKER_V4.parse().unwrap()];
    let settings = PeerSettings::from_peer(&peer(), &node, None).unwrap();
    [("frr".to_string(), (settings, routes))].into()
}

/// The same prefixes and attributes as an MRT TABLE_DUMP_V2 file (RFC 6396) for
/// `gobgp mrt inject global`: empty AS_PATH (GoBGP prepends its AS towards the eBGP peer as
/// ferrolb does), ORIGIN IGP, NEXT_HOP, community 64512:100, large community 64512:1:2.
fn mrt_file(prefixes: &[Ipv4Addr]) -> Vec<u8> {
    fn record(out: &mut Vec<u8>, subtype: u16, body: &[u8]) {
        out.extend_from_slice(&0u32.to_be_bytes());
        out.extend_from_slice(&13u16.to_be_bytes()); // TABLE_DUMP_V2
        out.extend_from_slice(&subtype.to_be_bytes());
        out.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes());
        out.extend_from_slice(body);
    }
    let me: Ipv4Addr = SPEAKER_V4.parse().unwrap();
    let mut out = Vec::new();
    // PEER_INDEX_TABLE: collector id, empty view name, one peer (IPv4 address, 4-octet AS).
    let mut body = Vec::new();
    body.extend_from_slice(&me.octets());
    body.extend_from_slice(&0u16.to_be_bytes());
    body.extend_from_slice(&1u16.to_be_bytes());
    body.push(0x02);
    body.extend_from_slice(&me.octets());
    body.extend_from_slice(&me.octets());
    body.extend_from_slice(&64512u32.to_be_bytes());
    record(&mut out, 1, &body);
    let mut attrs = vec![0x40, 1, 1, 0, 0x40, 2, 0, 0x40, 3, 4];
    attrs.extend_from_slice(&me.octets());
    attrs.extend_from_slice(&[0xc0, 8, 4]);
    attrs.extend_from_slice(&64512u16.to_be_bytes());
    attrs.extend_from_slice(&100u16.to_be_bytes());
    attrs.extend_from_slice(&[0xc0, 32, 12]);
    for v in [64512u32, 1, 2] {
        attrs.extend_from_slice(&v.to_be_bytes());
    }
    // gobgp 3.10's `mrt inject` exits without closing its gRPC stream, so the last paths it
    // sent are lost (about 130 of 10,000 here): the real prefixes are followed by repeats of the
    // first one, which may be lost instead (and change nothing where they are not).
    let padding = std::iter::repeat_n(prefixes[0], MRT_PADDING);
    for (seq, p) in prefixes.iter().copied().chain(padding).enumerate() {
        let mut body = Vec::new();
        body.extend_from_slice(&u32::try_from(seq).unwrap().to_be_bytes());
        body.push(32);
        body.extend_from_slice(&p.octets());
        body.extend_from_slice(&1u16.to_be_bytes());
        body.extend_from_slice(&0u16.to_be_bytes()); // peer index
        body.extend_from_slice(&0u32.to_be_bytes()); // originated time
        body.extend_from_slice(&u16::try_from(attrs.len()).unwrap().to_be_bytes());
        body.extend_from_slice(&attrs);
        record(&mut out, 2, &body); // RIB_IPV4_UNICAST
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The lab: two namespaces, FRR, and whatever runs in them

/// Two namespaces joined by a veth pair (`s0` in the sender's, `r0` in the router's), the
/// processes in them and a scratch directory; all removed on drop.
struct Lab {
    lab: netns::Lab,
    speaker: Netns,
    router: Netns,
}

impl Lab {
    fn new(tag: &str) -> Self {
        let mut lab = netns::Lab::new("flbvs", tag);
        let (speaker, router) = lab.pair(("s", "s0", &[SPEAKER_V4]), ("r", "r0", &[ROUTER_V4]));
        Lab {
            lab,
            speaker,
            router,
        }
    }

    fn dir(&self) -> &Path {
        self.lab.dir()
    }

    /// Starts `program` in `ns` (with TZ=UTC: bgpd's log timestamps are read as UTC); its PID.
    fn spawn_in(&mut self, ns: &Netns, program: &str, args: &[&str]) -> u32 {
        self.lab.spawn_env(ns, program, args, &[("TZ", "UTC")])
    }

    fn in_speaker(&self, program: &str, args: &[&str]) -> std::process::Output {
        self.speaker.output(program, args)
    }

    /// Starts zebra and bgpd in the router namespace (the same configuration for every
    /// sender) and returns a vty connection to bgpd.
    fn start_frr(&mut self) -> Vty {
        let d = self.dir().display().to_string();
        std::fs::write(
            self.dir().join("zebra.conf"),
            "frr defaults traditional\nhostname r\n!\n",
        )
        .unwrap();
        std::fs::write(
            self.dir().join("bgpd.conf"),
            format!(
                "frr defaults traditional\nhostname r\nlog file {d}/bgpd.log\nlog timestamp precision 6\n!\n\
                 router bgp 64500\n bgp router-id {ROUTER_V4}\n bgp log-neighbor-changes\n \
                 no bgp ebgp-requires-policy\n \
                 neighbor {SPEAKER_V4} remote-as 64512\n neighbor {SPEAKER_V4} timers 3 9\n \
                 neighbor {SPEAKER_V4} timers connect 1\n \
                 address-family ipv4 unicast\n  neighbor {SPEAKER_V4} activate\n exit-address-family\n!\n"
            ),
        )
        .unwrap();
        netns::run("chown", &["-R", "frr:frr", &d]);
        let router = self.router.clone();
        for daemon in ["zebra", "bgpd"] {
            let mut args = vec![
                "-N".to_string(),
                router.name().to_string(),
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
            self.spawn_in(&router, &format!("/usr/lib/frr/{daemon}"), &args);
            if daemon == "zebra" {
                let api = self.dir().join("zserv.api");
                wait_for(
                    "zebra socket",
                    Duration::from_secs(20),
                    Duration::from_millis(20),
                    || api.exists().then_some(()),
                );
            }
        }
        let path = self.dir().join("bgpd.vty");
        let vty = wait_for(
            "bgpd vty",
            Duration::from_secs(20),
            Duration::from_millis(20),
            || {
                let mut v = Vty::connect(&path)?;
                v.cmd("show version").contains("FRRouting").then_some(v)
            },
        );
        // Routes that arrive within about a second of bgpd's start reach the kernel only
        // after about a second (seen in trial runs: 0.93 s for 1,000 routes against 0.08 s
        // later), which would charge FRR's start-up to whichever sender comes first.
        std::thread::sleep(FRR_SETTLE);
        vty
    }

    /// When bgpd logged the session with the sender as up (`%ADJCHANGE ... Up`), wall clock.
    fn established_at(&self) -> f64 {
        let log = self.dir().join("bgpd.log");
        wait_for(
            "bgpd: session up",
            Duration::from_secs(60),
            Duration::from_millis(20),
            || {
                let text = std::fs::read_to_string(&log).ok()?;
                let line = text.lines().find(|l| {
                    l.contains("%ADJCHANGE") && l.contains(SPEAKER_V4) && l.contains(" Up")
                })?;
                Some(parse_frr_time(line).expect("bgpd log timestamp"))
            },
        )
    }

    /// Starts gobgpd in the sender namespace; with a (passive) neighbour FRR when `neighbor`,
    /// admin-down when `admin_down`. Returns its PID once its API answers.
    fn start_gobgpd(&mut self, admin_down: bool) -> u32 {
        let conf = self.dir().join("gobgpd.toml");
        std::fs::write(
            &conf,
            format!(
                "[global.config]\n  as = 64512\n  router-id = \"{SPEAKER_V4}\"\n  port = 179\n\
                 [[neighbors]]\n  [neighbors.config]\n    neighbor-address = \"{ROUTER_V4}\"\n    peer-as = 64500\n    admin-down = {admin_down}\n\
                   [neighbors.transport.config]\n    passive-mode = true\n\
                   [neighbors.timers.config]\n    hold-time = 9\n    keepalive-interval = 3\n\
                   [[neighbors.afi-safis]]\n    [neighbors.afi-safis.config]\n      afi-safi-name = \"ipv4-unicast\"\n"
            ),
        )
        .unwrap();
        let conf = conf.display().to_string();
        let speaker = self.speaker.clone();
        let pid = self.spawn_in(
            &speaker,
            GOBGPD,
            &[
                "-f",
                &conf,
                "-t",
                "toml",
                "--api-hosts",
                "127.0.0.1:50051",
                "-l",
                "warn",
            ],
        );
        wait_for(
            "gobgpd API",
            Duration::from_secs(20),
            Duration::from_millis(50),
            || {
                self.in_speaker(GOBGP, &["neighbor"])
                    .stdout
                    .windows(ROUTER_V4.len())
                    .any(|w| w == ROUTER_V4.as_bytes())
                    .then_some(())
            },
        );
        pid
    }

    fn gobgp(&self, args: &[&str]) -> String {
        let out = self.in_speaker(GOBGP, args);
        assert!(
            out.status.success(),
            "gobgp {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// `2026/11/30 14:35:01.123456 BGP: ...` (bgpd runs with TZ=UTC) as seconds since the epoch.
fn parse_frr_time(line: &str) -> Option<f64> {
    let mut it = line.split_whitespace();
    let date: Vec<i64> = it
        .next()?
        .split('/')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    let time = it.next()?;
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let hms: Vec<i64> = hms
        .split(':')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    if date.len() != 3 || hms.len() != 3 {
        return None;
    }
    // Days from civil (H. Hinnant's algorithm).
    let (y, m, d) = (date[0] - i64::from(date[1] <= 2), date[1], date[2]);
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hms[0] * 3600 + hms[1] * 60 + hms[2];
    let frac: f64 = format!("0.{frac}").parse().ok()?;
    Some(secs as f64 + frac)
}

/// A connection to bgpd's vty socket, as vtysh uses it: a command ends with NUL, the answer
/// with three NULs and a status octet. One query costs well under a millisecond, where
/// starting vtysh costs tens.
struct Vty(UnixStream);

impl Vty {
    fn connect(path: &Path) -> Option<Self> {
        let s = UnixStream::connect(path).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        Some(Self(s))
    }

    fn cmd(&mut self, command: &str) -> String {
        let mut msg = command.as_bytes().to_vec();
        msg.push(0);
        self.0.write_all(&msg).unwrap();
        let mut out = Vec::new();
        let mut buf = [0u8; 65536];
        loop {
            let n = self.0.read(&mut buf).expect("bgpd vty read");
            assert!(n > 0, "bgpd closed its vty");
            out.extend_from_slice(&buf[..n]);
            let len = out.len();
            if len >= 4 && out[len - 4..len - 1] == [0, 0, 0] {
                out.truncate(len - 4);
                return String::from_utf8_lossy(&out).into_owned();
            }
        }
    }

    /// Prefixes bgpd has accepted from the sender (0 while the session is not up).
    fn pfx_rcd(&mut self) -> usize {
        let s = self.cmd("show bgp ipv4 unicast summary json");
        s.split_once("\"pfxRcd\":")
            .and_then(|(_, rest)| {
                rest.trim_start()
                    .split(|c: char| !c.is_ascii_digit())
                    .next()
                    .and_then(|d| d.parse().ok())
            })
            .unwrap_or(0)
    }

    /// Polls `pfx_rcd` every `every` until it reaches `n`; the wall-clock time it was seen.
    fn wait_pfx(&mut self, n: usize, every: Duration) -> f64 {
        let until = Instant::now() + Duration::from_secs(120);
        loop {
            let got = self.pfx_rcd();
            let t = now();
            if got >= n {
                return t;
            }
            assert!(Instant::now() < until, "bgpd has {got} of {n} prefixes");
            std::thread::sleep(every);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The router namespace's kernel table, watched over rtnetlink

struct FibWatch {
    seen: Arc<Mutex<HashMap<Ipv4Addr, f64>>>,
    overflow: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FibWatch {
    fn start(ns: &Netns) -> Self {
        use nix::sys::socket::{
            AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv,
            setsockopt, socket, sockopt,
        };
        use nix::sys::time::{TimeVal, TimeValLike};
        let seen = Arc::new(Mutex::new(HashMap::new()));
        let overflow = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel();
        let (seen2, overflow2, stop2) = (seen.clone(), overflow.clone(), stop.clone());
        let thread = ns.thread(move || {
            let fd = socket(
                AddressFamily::Netlink,
                SockType::Raw,
                SockFlag::SOCK_CLOEXEC,
                SockProtocol::NetlinkRoute,
            )
            .unwrap();
            setsockopt(&fd, sockopt::RcvBufForce, &(64 << 20)).unwrap();
            setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::milliseconds(50)).unwrap();
            // RTMGRP_IPV4_ROUTE
            bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0x40)).unwrap();
            ready_tx.send(()).unwrap();
            let mut buf = vec![0u8; 1 << 20];
            while !stop2.load(Ordering::Relaxed) {
                match recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()) {
                    Ok(n) => {
                        let t = now();
                        let mut seen = seen2.lock().unwrap();
                        for dst in new_routes(&buf[..n]) {
                            seen.entry(dst).or_insert(t);
                        }
                    }
                    Err(nix::errno::Errno::ENOBUFS) => overflow2.store(true, Ordering::Relaxed),
                    Err(_) => {}
                }
            }
        });
        ready_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        Self {
            seen,
            overflow,
            stop,
            thread: Some(thread),
        }
    }

    fn at(&self, p: Ipv4Addr) -> Option<f64> {
        self.seen.lock().unwrap().get(&p).copied()
    }

    /// Waits until every prefix is in the kernel; the time the last one arrived.
    fn wait_all(&self, prefixes: &[Ipv4Addr]) -> f64 {
        wait_for(
            "kernel routes",
            Duration::from_secs(120),
            Duration::from_millis(10),
            || {
                assert!(
                    !self.overflow.load(Ordering::Relaxed),
                    "netlink listener overflowed"
                );
                let seen = self.seen.lock().unwrap();
                prefixes
                    .iter()
                    .map(|p| seen.get(p).copied())
                    .collect::<Option<Vec<f64>>>()
                    .map(|ts| ts.into_iter().fold(0.0, f64::max))
            },
        )
    }
}

impl Drop for FibWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The /32 destinations of the `RTM_NEWROUTE` messages in one netlink datagram.
fn new_routes(mut buf: &[u8]) -> Vec<Ipv4Addr> {
    let mut out = Vec::new();
    while buf.len() >= 16 {
        let len = u32::from_ne_bytes(buf[0..4].try_into().unwrap()) as usize;
        let kind = u16::from_ne_bytes(buf[4..6].try_into().unwrap());
        if len < 16 || len > buf.len() {
            break;
        }
        // RTM_NEWROUTE, struct rtmsg (12 octets): family AF_INET, dst_len 32.
        if kind == 24 && len >= 28 && buf[16] == 2 && buf[17] == 32 {
            let mut attrs = &buf[28..len];
            while attrs.len() >= 4 {
                let alen = u16::from_ne_bytes(attrs[0..2].try_into().unwrap()) as usize;
                let atype = u16::from_ne_bytes(attrs[2..4].try_into().unwrap());
                if alen < 4 || alen > attrs.len() {
                    break;
                }
                if atype == 1 && alen == 8 {
                    let o: [u8; 4] = attrs[4..8].try_into().unwrap();
                    out.push(Ipv4Addr::from(o));
                }
                attrs = &attrs[(alen + 3) & !3..];
            }
        }
        let next = (len + 3) & !3;
        buf = if next >= buf.len() { &[] } else { &buf[next..] };
    }
    out
}

// ---------------------------------------------------------------------------------------------
// ferrolb's driver in a thread of its own, inside the sender namespace

enum Cmd {
    /// New routes; answers with when `Driver::apply` started and how long it took.
    Apply(AdjRibOut, mpsc::Sender<(f64, Duration)>),
    Stop,
}

struct DriverThread {
    tx: tokio::sync::mpsc::UnboundedSender<Cmd>,
    established: Arc<Mutex<Option<f64>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DriverThread {
    fn start(ns: &Netns) -> Self {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Cmd>();
        let established = Arc::new(Mutex::new(None));
        let est = established.clone();
        let thread = ns.thread(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let mut driver = Driver::new(Arc::new(NoObserver));
                while let Some(cmd) = rx.recv().await {
                    match cmd {
                        Cmd::Apply(routes, reply) => {
                            let first = driver.status().is_empty();
                            let t = now();
                            let start = Instant::now();
                            let refused = driver.apply(desired(routes));
                            let took = start.elapsed();
                            assert!(refused.is_empty(), "MD5 keys refused: {refused:?}");
                            let _ = reply.send((t, took));
                            if first {
                                let mut w = driver.watch_status("frr").unwrap();
                                let est = est.clone();
                                tokio::spawn(async move {
                                    while w.borrow_and_update().state != State::Established {
                                        if w.changed().await.is_err() {
                                            return;
                                        }
                                    }
                                    *est.lock().unwrap() = Some(now());
                                });
                            }
                        }
                        Cmd::Stop => break,
                    }
                }
                driver.shutdown(Duration::from_secs(2)).await;
            });
        });
        Self {
            tx,
            established,
            thread: Some(thread),
        }
    }

    fn apply(&self, routes: AdjRibOut) -> (f64, Duration) {
        let (tx, rx) = mpsc::channel();
        self.tx.send(Cmd::Apply(routes, tx)).unwrap();
        rx.recv_timeout(Duration::from_secs(30)).unwrap()
    }

    fn established(&self) -> f64 {
        wait_for(
            "ferrolb session up",
            Duration::from_secs(60),
            Duration::from_millis(5),
            || *self.established.lock().unwrap(),
        )
    }
}

impl Drop for DriverThread {
    fn drop(&mut self) {
        let _ = self.tx.send(Cmd::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The scenarios

#[derive(Default)]
struct Results {
    // (a), seconds
    one_small_bgp: Vec<f64>,
    one_small_fib: Vec<f64>,
    one_large_bgp: Vec<f64>,
    one_large_fib: Vec<f64>,
    gobgp_one_cli: Vec<f64>,
    gobgp_one_bgp: Vec<f64>,
    gobgp_one_fib: Vec<f64>,
    // (b), seconds: (from Established / from hand-over to bgpd count, to kernel)
    ferrolb_cold: Vec<(f64, f64)>,
    gobgp_cold: Vec<(f64, f64)>,
    ferrolb_warm: Vec<(f64, f64)>,
    gobgp_warm: Vec<(f64, f64)>,
    ferrolb_apply: Vec<Duration>,
    gobgp_inject_cold: Vec<f64>,
    ferrolb_connect_to_est: Vec<f64>,
    // (c), KiB
    ferrolb_rss: Option<(u64, u64, u64)>,
    gobgp_rss: Option<(u64, u64, u64, u64)>,
}

/// One more /32 in the plan, `samples` times; pauses between samples vary (70-150 ms) so
/// they do not line up with the keepalive timer.
fn single_samples(
    driver: &DriverThread,
    vty: &mut Vty,
    fib: &FibWatch,
    plan: &mut AdjRibOut,
    samples: usize,
    bgp: &mut Vec<f64>,
    kernel: &mut Vec<f64>,
) {
    for k in 0..samples {
        let p = single_prefix(k);
        let before = plan.len();
        plan.extend(plan_of([p]));
        let (t0, _) = driver.apply(plan.clone());
        let t_bgp = vty.wait_pfx(before + 1, Duration::from_millis(2));
        let t_fib = wait_for(
            "kernel route",
            Duration::from_secs(10),
            Duration::from_millis(1),
            || fib.at(p),
        );
        bgp.push(t_bgp - t0);
        kernel.push(t_fib - t0);
        std::thread::sleep(Duration::from_millis(70 + (k as u64 * 37) % 80));
    }
}

fn ferrolb_cold(run: usize, n: usize, samples: usize, r: &mut Results) {
    let mut lab = Lab::new(&format!("fc{run}"));
    let mut vty = lab.start_frr();
    let fib = FibWatch::start(&lab.router);
    let bulk: Vec<Ipv4Addr> = (0..n).map(bulk_prefix).collect();
    let mut plan = plan_of(bulk.iter().copied());
    let driver = DriverThread::start(&lab.speaker);
    let (t_apply, took) = driver.apply(plan.clone());
    r.ferrolb_apply.push(took);
    let t_rcv = vty.wait_pfx(n, Duration::from_millis(10));
    let t_fib = fib.wait_all(&bulk);
    let est = lab.established_at();
    let own = driver.established();
    r.ferrolb_connect_to_est.push(own - t_apply);
    r.ferrolb_cold.push((t_rcv - est, t_fib - est));
    println!(
        "ferrolb cold run {run}: Established (bgpd log) {:.1} ms after apply (driver's own view {:.1} ms); \
         bgpd has {n} {} later, kernel {}",
        (est - t_apply) * 1e3,
        (own - t_apply) * 1e3,
        ms(t_rcv - est),
        ms(t_fib - est)
    );
    if run == 0 {
        std::thread::sleep(Duration::from_secs(1));
        let (mut b, mut k) = (Vec::new(), Vec::new());
        single_samples(&driver, &mut vty, &fib, &mut plan, samples, &mut b, &mut k);
        println!(
            "  one more /32 on top of {n}: bgpd {}; kernel {}",
            summary(&b),
            summary(&k)
        );
        r.one_large_bgp = b;
        r.one_large_fib = k;
    }
    drop(driver);
    drop(fib);
    drop(lab);
}

fn ferrolb_warm(run: usize, n: usize, samples: usize, r: &mut Results) {
    let mut lab = Lab::new(&format!("fw{run}"));
    let mut vty = lab.start_frr();
    let fib = FibWatch::start(&lab.router);
    let driver = DriverThread::start(&lab.speaker);
    let mut plan = AdjRibOut::new();
    driver.apply(plan.clone());
    lab.established_at();
    std::thread::sleep(Duration::from_millis(1500));
    if run == 0 {
        let (mut b, mut k) = (Vec::new(), Vec::new());
        single_samples(&driver, &mut vty, &fib, &mut plan, samples, &mut b, &mut k);
        println!(
            "ferrolb one more /32 (up to {samples} others): bgpd {}; kernel {}",
            summary(&b),
            summary(&k)
        );
        r.one_small_bgp = b;
        r.one_small_fib = k;
        std::thread::sleep(Duration::from_millis(500));
    }
    let bulk: Vec<Ipv4Addr> = (0..n).map(bulk_prefix).collect();
    plan.extend(plan_of(bulk.iter().copied()));
    let (t0, took) = driver.apply(plan.clone());
    r.ferrolb_apply.push(took);
    let t_rcv = vty.wait_pfx(plan.len(), Duration::from_millis(10));
    let t_fib = fib.wait_all(&bulk);
    r.ferrolb_warm.push((t_rcv - t0, t_fib - t0));
    println!(
        "ferrolb warm run {run}: {n} new prefixes in one plan ({} in Driver::apply): bgpd has them {} later, kernel {}",
        ms(took.as_secs_f64()),
        ms(t_rcv - t0),
        ms(t_fib - t0)
    );
    drop(driver);
    drop(fib);
    drop(lab);
}

fn gobgp_cold(run: usize, n: usize, r: &mut Results) {
    let mut lab = Lab::new(&format!("gc{run}"));
    let mut vty = lab.start_frr();
    let fib = FibWatch::start(&lab.router);
    let bulk: Vec<Ipv4Addr> = (0..n).map(bulk_prefix).collect();
    let mrt = lab.dir().join("routes.mrt");
    std::fs::write(&mrt, mrt_file(&bulk)).unwrap();
    let mrt = mrt.display().to_string();
    let pid = lab.start_gobgpd(true);
    let rss_empty = rss_kib(pid);
    let t = now();
    lab.gobgp(&["mrt", "inject", "global", &mrt]);
    let want = format!("Destination: {n},");
    wait_for(
        "gobgp rib loaded",
        Duration::from_secs(60),
        Duration::from_millis(20),
        || {
            lab.gobgp(&["global", "rib", "summary", "-a", "ipv4"])
                .contains(&want)
                .then_some(())
        },
    );
    let inject = now() - t;
    r.gobgp_inject_cold.push(inject);
    let rss_loaded = rss_kib(pid);
    let t_enable = now();
    lab.gobgp(&["neighbor", ROUTER_V4, "enable"]);
    let t_rcv = vty.wait_pfx(n, Duration::from_millis(10));
    let t_fib = fib.wait_all(&bulk);
    let est = lab.established_at();
    r.gobgp_cold.push((t_rcv - est, t_fib - est));
    std::thread::sleep(Duration::from_millis(500));
    let rss_sent = rss_kib(pid);
    if run == 0 {
        r.gobgp_rss = Some((rss_empty.0, rss_loaded.0, rss_sent.0, rss_sent.1));
    }
    println!(
        "gobgp cold run {run}: inject into its RIB {}; Established {:.1} ms after enable; bgpd has {n} {} later, kernel {}; \
         gobgpd RSS empty {} / loaded {} / after sending {} (peak {})",
        ms(inject),
        (est - t_enable) * 1e3,
        ms(t_rcv - est),
        ms(t_fib - est),
        mib(rss_empty.0),
        mib(rss_loaded.0),
        mib(rss_sent.0),
        mib(rss_sent.1)
    );
    drop(fib);
    drop(lab);
}

fn gobgp_warm(run: usize, n: usize, samples: usize, r: &mut Results) {
    let mut lab = Lab::new(&format!("gw{run}"));
    let mut vty = lab.start_frr();
    let fib = FibWatch::start(&lab.router);
    let bulk: Vec<Ipv4Addr> = (0..n).map(bulk_prefix).collect();
    let mrt = lab.dir().join("routes.mrt");
    std::fs::write(&mrt, mrt_file(&bulk)).unwrap();
    let mrt = mrt.display().to_string();
    lab.start_gobgpd(false);
    lab.established_at();
    std::thread::sleep(Duration::from_millis(1500));
    let mut have = 0;
    if run == 0 {
        for k in 0..samples {
            let p = single_prefix(k).to_string() + "/32";
            let t0 = now();
            lab.gobgp(&[
                "global",
                "rib",
                "add",
                "-a",
                "ipv4",
                &p,
                "origin",
                "igp",
                "community",
                "64512:100",
                "large-community",
                "64512:1:2",
            ]);
            let t_cli = now();
            let t_bgp = vty.wait_pfx(k + 1, Duration::from_millis(2));
            let t_fib = wait_for(
                "kernel route",
                Duration::from_secs(10),
                Duration::from_millis(1),
                || fib.at(single_prefix(k)),
            );
            r.gobgp_one_cli.push(t_cli - t0);
            r.gobgp_one_bgp.push(t_bgp - t0);
            r.gobgp_one_fib.push(t_fib - t0);
            std::thread::sleep(Duration::from_millis(70 + (k as u64 * 37) % 80));
        }
        have = samples;
        println!(
            "gobgp one more /32 (from starting `gobgp global rib add`): CLI {}; bgpd {}; kernel {}",
            summary(&r.gobgp_one_cli),
            summary(&r.gobgp_one_bgp),
            summary(&r.gobgp_one_fib)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let t0 = now();
    lab.gobgp(&["mrt", "inject", "global", &mrt]);
    let t_cli = now();
    let t_rcv = vty.wait_pfx(have + n, Duration::from_millis(10));
    let t_fib = fib.wait_all(&bulk);
    r.gobgp_warm.push((t_rcv - t0, t_fib - t0));
    println!(
        "gobgp warm run {run}: `gobgp mrt inject global` of {n} took {}; bgpd has them {} after its start, kernel {}",
        ms(t_cli - t0),
        ms(t_rcv - t0),
        ms(t_fib - t0)
    );
    drop(fib);
    drop(lab);
}

/// RSS of a process that runs only the driver: this bench again, as a child.
fn ferrolb_rss(n: usize, r: &mut Results) {
    let mut lab = Lab::new("rss");
    let mut vty = lab.start_frr();
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .env(CHILD_ENV, lab.speaker.name())
        .env("FERROLB_BENCH_PREFIXES", n.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut stdin: ChildStdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    lab.lab.adopt(child);
    let (line_tx, line_rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line_tx.send(line).is_err() {
                return;
            }
        }
    });
    let expect = |want: &str| {
        let got = line_rx.recv_timeout(Duration::from_secs(60)).unwrap();
        assert_eq!(got, want, "child driver");
    };
    expect("established");
    std::thread::sleep(Duration::from_millis(500));
    let idle = rss_kib(pid);
    writeln!(stdin, "go").unwrap();
    expect("applied");
    vty.wait_pfx(n, Duration::from_millis(10));
    std::thread::sleep(Duration::from_millis(500));
    let loaded = rss_kib(pid);
    writeln!(stdin, "stop").unwrap();
    let _ = line_rx.recv_timeout(Duration::from_secs(10));
    println!(
        "ferrolb driver process: RSS with the session up and no routes {}, holding {n} {} (peak {})",
        mib(idle.0),
        mib(loaded.0),
        mib(loaded.1)
    );
    r.ferrolb_rss = Some((idle.0, loaded.0, loaded.1));
    drop(lab);
}

/// The child of `ferrolb_rss`: the driver alone, in the sender namespace; `go` on stdin hands
/// it the 10,000 prefixes, `stop` (or EOF) ends it.
fn child_main(ns: &str) {
    Netns::named(ns).enter();
    let n = env_usize("FERROLB_BENCH_PREFIXES", 10_000);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let mut driver = Driver::new(Arc::new(NoObserver));
        let refused = driver.apply(desired(AdjRibOut::new()));
        assert!(refused.is_empty(), "MD5 keys refused: {refused:?}");
        let mut w = driver.watch_status("frr").unwrap();
        let up = tokio::time::timeout(Duration::from_secs(60), async {
            while w.borrow_and_update().state != State::Established {
                if w.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
        if up.is_err() {
            eprintln!("child: no session: {:?}", driver.status());
            return;
        }
        println!("established");
        let _ = tokio::time::timeout(Duration::from_secs(300), async {
            while let Some(line) = rx.recv().await {
                match line.as_str() {
                    "go" => {
                        let refused = driver.apply(desired(plan_of((0..n).map(bulk_prefix))));
                        assert!(refused.is_empty(), "MD5 keys refused: {refused:?}");
                        println!("applied");
                    }
                    _ => break,
                }
            }
        })
        .await;
        driver.shutdown(Duration::from_secs(2)).await;
        println!("stopped");
    });
}

/// Where the driver's time goes, without sockets: the pure steps of sending 10,000 prefixes.
fn driver_steps(n: usize) {
    /// Median of 7 timings of `f`.
    fn time<T>(mut f: impl FnMut() -> T) -> f64 {
        let mut xs: Vec<f64> = (0..7)
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(f());
                t.elapsed().as_secs_f64()
            })
            .collect();
        xs.sort_by(f64::total_cmp);
        xs[3]
    }
    let plan = plan_of((0..n).map(bulk_prefix));
    let ctx = SessionContext {
        local_as: 64512,
        internal: false,
        families: vec![AfiSafi::IPV4_UNICAST, AfiSafi::IPV6_UNICAST],
        next_hop_v4: Some(SPEAKER_V4.parse().unwrap()),
        next_hop_v6: None,
        next_hop_v6_link_local: None,
        extended_next_hop: false,
        codec: CodecContext::default(),
    };
    let empty = AdjRibOut::new();
    let (updates, sent) = adj_out::diff(&empty, &plan, &ctx).unwrap();
    let bytes: usize = updates
        .iter()
        .map(|u| {
            Message::Update(u.clone())
                .to_bytes(&ctx.codec)
                .unwrap()
                .len()
        })
        .sum();
    let diff = time(|| adj_out::diff(&empty, &plan, &ctx).unwrap());
    let encode = time(|| {
        updates
            .iter()
            .map(|u| {
                Message::Update(u.clone())
                    .to_bytes(&ctx.codec)
                    .unwrap()
                    .len()
            })
            .sum::<usize>()
    });
    let compare = time(|| sent == plan);
    let clone = time(|| plan.clone());
    let mut plus_one = plan.clone();
    plus_one.extend(plan_of([single_prefix(0)]));
    let diff_one = time(|| adj_out::diff(&sent, &plus_one, &ctx).unwrap());
    // The same without communities: RouteAttributes without heap parts.
    let bare: AdjRibOut = plan
        .keys()
        .map(|p| (*p, RouteAttributes::default()))
        .collect();
    let diff_bare = time(|| adj_out::diff(&empty, &bare, &ctx).unwrap());
    println!(
        "driver steps for {n} prefixes (median of 7): adj_out::diff from nothing {} -> {} UPDATEs, {bytes} octets; \
         encoding them {}; comparing two equal {n}-prefix plans {}; cloning the plan {}; \
         adj_out::diff for one more prefix on top of {n}: {}; adj_out::diff from nothing without communities {}",
        ms(diff),
        updates.len(),
        ms(encode),
        ms(compare),
        ms(clone),
        ms(diff_one),
        ms(diff_bare)
    );
}

fn main() {
    if let Ok(ns) = std::env::var(CHILD_ENV) {
        child_main(&ns);
        return;
    }
    // `cargo test --all-targets` runs bench targets too, without `--bench`: measure only when
    // asked to (the run takes minutes).
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    if let Some(reason) = trial::unmet(&[ZEBRA, BGPD, GOBGPD, GOBGP]) {
        println!("bgp_vs_gobgp: skipped, {reason}");
        return;
    }
    let n = env_usize("FERROLB_BENCH_PREFIXES", 10_000);
    let samples = env_usize("FERROLB_BENCH_SAMPLES", 50);
    let runs = env_usize("FERROLB_BENCH_RUNS", 3);
    println!(
        "bgp_vs_gobgp: {n} prefixes, {samples} single-prefix samples, {runs} runs; FRR {}, GoBGP {}",
        netns::run(BGPD, &["--version"])
            .lines()
            .next()
            .unwrap_or("?"),
        netns::run(GOBGP, &["--version"]).trim()
    );
    driver_steps(n);
    let mut r = Results::default();
    for i in 0..runs {
        ferrolb_cold(i, n, samples, &mut r);
        gobgp_cold(i, n, &mut r);
        ferrolb_warm(i, n, samples, &mut r);
        gobgp_warm(i, n, samples, &mut r);
    }
    ferrolb_rss(n, &mut r);

    let col =
        |xs: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| -> Vec<f64> { xs.iter().map(f).collect() };
    let med = |xs: Vec<f64>| ms(pct(&xs, 50.0));
    let range = |xs: Vec<f64>| format!("{}..{}", ms(pct(&xs, 0.0)), ms(pct(&xs, 100.0)));
    println!("\n## Summary ({runs} runs; median, range)\n");
    println!("| {n} prefixes | sender | to bgpd's count | to the kernel |");
    println!("|---|---|---|---|");
    for (what, who, xs) in [
        ("cold, from Established", "ferrolb", &r.ferrolb_cold),
        ("cold, from Established", "GoBGP", &r.gobgp_cold),
        ("warm, from hand-over", "ferrolb", &r.ferrolb_warm),
        ("warm, from hand-over", "GoBGP", &r.gobgp_warm),
    ] {
        println!(
            "| {what} | {who} | {} ({}) | {} ({}) |",
            med(col(xs, |x| x.0)),
            range(col(xs, |x| x.0)),
            med(col(xs, |x| x.1)),
            range(col(xs, |x| x.1)),
        );
    }
    let applies: Vec<f64> = r.ferrolb_apply.iter().map(Duration::as_secs_f64).collect();
    println!(
        "\nDriver::apply with {n} prefixes: {}; ferrolb apply to Established: {}; gobgp mrt inject (cold, until in its RIB): {}",
        summary(&applies),
        summary(&r.ferrolb_connect_to_est),
        summary(&r.gobgp_inject_cold)
    );
    println!("\n| one more /32 | to bgpd's count | to the kernel |");
    println!("|---|---|---|");
    for (what, b, k) in [
        (
            format!("ferrolb, up to {samples} other prefixes"),
            &r.one_small_bgp,
            &r.one_small_fib,
        ),
        (
            format!("ferrolb, {n} other prefixes"),
            &r.one_large_bgp,
            &r.one_large_fib,
        ),
        (
            "GoBGP, from `gobgp global rib add` start".to_string(),
            &r.gobgp_one_bgp,
            &r.gobgp_one_fib,
        ),
    ] {
        if !b.is_empty() {
            println!(
                "| {what} | p50 {} p99 {} | p50 {} p99 {} |",
                ms(pct(b, 50.0)),
                ms(pct(b, 99.0)),
                ms(pct(k, 50.0)),
                ms(pct(k, 99.0))
            );
        }
    }
    if !r.gobgp_one_cli.is_empty() {
        println!("(the gobgp CLI itself: {})", summary(&r.gobgp_one_cli));
    }
    if let (Some(f), Some(g)) = (r.ferrolb_rss, r.gobgp_rss) {
        println!(
            "\nRSS: ferrolb driver process idle {} / holding {n} {} (peak {}); gobgpd empty {} / {n} in RIB {} / after sending {} (peak {})",
            mib(f.0),
            mib(f.1),
            mib(f.2),
            mib(g.0),
            mib(g.1),
            mib(g.2),
            mib(g.3)
        );
    }
}
