//! The BGP driver against real routers: FRR 8, BIRD 2 and GoBGP 3, each in a network namespace
//! of its own, the driver in another one joined by a veth pair. Each test checks the routes in
//! the router's own table (vtysh JSON, `birdc show route all`, `gobgp global rib -j`): IPv4 and
//! IPv6 prefixes, next hops, AS_PATH and communities; then withdraws them. The namespaces use
//! the lab's ranges only (198.19.77.0/24, fd00:77::/64) and are joined to nothing else.
//!
//! Needs root and the routers (`e2e/install-deps` installs frr, bird2, gobgpd); a test whose
//! tools are missing, or that runs without root, is reported as ignored (never as passed), and
//! `scripts/test` fails in CI when a test was ignored. Namespaces and processes are removed on
//! drop, also when an assertion fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrolb_bgp::adj_out::AdjRibOut;
use ferrolb_bgp::adj_out::RouteAttributes;
use ferrolb_bgp::fsm::State;
use ferrolb_bgp::packet::{
    AfiSafi, Capability, CodecContext, Community, LargeCommunity, Message, Notification, Open,
};
use ferrolb_config::model::Peer;
use ferrolb_speaker::bgp::driver::{DEFAULT_LISTEN, Driver, NoObserver, PeerSettings};
use ferrolb_testkit::frr::{self, Frr};
use ferrolb_testkit::netns::{self, Netns};
use ferrolb_testkit::{model, trial};

const SPEAKER_V4: &str = "198.19.77.1";
const ROUTER_V4: &str = "198.19.77.2";
const SPEAKER_V6: &str = "fd00:77::1";
const ROUTER_V6: &str = "fd00:77::2";
const PREFIX_V4: &str = "198.51.100.10/32";
const PREFIX_V6: &str = "2001:db8:77::10/128";

/// Two namespaces joined by a veth pair (`s0` in the speaker's, `r0` in the router's), the
/// router's processes, and a scratch directory; all removed on drop.
struct Lab {
    lab: netns::Lab,
    speaker: Netns,
    router: Netns,
}

impl Lab {
    /// Two fresh namespaces for test `name`. Whether root and `tools` are there is checked by
    /// `main` before (a trial that cannot run is reported as ignored), so here it is a failure.
    fn new(name: &str, tools: &[&str]) -> Self {
        trial::require(tools);
        let mut lab = netns::Lab::new("flbbgp", name);
        let (speaker, router) = lab.pair(
            ("s", "s0", &[SPEAKER_V4, SPEAKER_V6]),
            ("r", "r0", &[ROUTER_V4, ROUTER_V6]),
        );
        Lab {
            lab,
            speaker,
            router,
        }
    }

    fn dir(&self) -> &Path {
        self.lab.dir()
    }

    fn spawn_in_router(&mut self, program: &str, args: &[&str]) {
        self.lab.spawn(&self.router, program, args);
    }

    fn in_router(&self, program: &str, args: &[&str]) -> String {
        self.router.stdout(program, args)
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

/// A single-threaded runtime, so the driver and the checks interleave.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A BGPPeer carrying both families (`dualStackAddressFamily`), so each session is checked with
/// IPv4 and IPv6 prefixes.
fn peer(name: &str, address: &str, password: Option<&str>) -> Peer {
    let mut p = model::peer(name, address)
        .hold_time(Duration::from_secs(9))
        .keepalive_time(Duration::from_secs(3))
        .connect_time(Duration::from_secs(1))
        .router_id(SPEAKER_V4)
        .password(password)
        .build();
    p.dual_stack_address_family = true;
    p
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
    lab.speaker.thread(move || {
        runtime().block_on(async move {
            let mut driver = Driver::new(Arc::new(NoObserver));
            let refused = driver.apply(desired.clone());
            assert!(refused.is_empty(), "MD5 keys refused: {refused:?}");
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
            let refused = driver.apply(withdrawn);
            assert!(refused.is_empty(), "MD5 keys refused: {refused:?}");
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

const FRR_TOOLS: &[&str] = &["/usr/lib/frr/bgpd", "/usr/lib/frr/zebra", "/usr/bin/vtysh"];
const BIRD_TOOLS: &[&str] = &["/usr/sbin/bird", "/usr/sbin/birdc"];
const GOBGP_TOOLS: &[&str] = &["/usr/bin/gobgpd", "/usr/bin/gobgp"];

/// Starts zebra and bgpd in the router namespace, bgpd with `router bgp 64500` and
/// `neighbours` inside.
fn start_frr(lab: &mut Lab, neighbours: &str) -> Router {
    let bgpd = frr::bgpd_conf(
        lab.dir(),
        &format!(
            "router bgp 64500\n bgp router-id {ROUTER_V4}\n \
             no bgp ebgp-requires-policy\n no bgp default ipv4-unicast\n {neighbours}!\n"
        ),
    );
    let frr = Frr::start(
        &mut lab.lab,
        &lab.router,
        &frr::Config {
            zebra: frr::ZEBRA_CONF,
            bgpd: Some(&bgpd),
            zebra_wait: Duration::from_secs(30),
        },
    );
    Router {
        ns: lab.router.clone(),
        frr: Some(frr),
    }
}

/// A namespace, usable from the speaker's thread; the router's with its FRR.
#[derive(Clone)]
struct Router {
    ns: Netns,
    frr: Option<Frr>,
}

impl Router {
    fn exec(&self, program: &str, args: &[&str]) -> String {
        self.ns.stdout(program, args)
    }

    fn vtysh(&self, cmd: &str) -> String {
        self.frr.as_ref().expect("FRR runs here").vtysh(cmd)
    }

    /// FRR's view of its neighbour `address`.
    fn frr_neighbour(&self, address: &str) -> String {
        self.vtysh(&format!("show bgp neighbors {address} json"))
    }

    fn frr_established(&self, address: &str) -> bool {
        self.frr_neighbour(address)
            .contains("\"bgpState\":\"Established\"")
    }

    /// FRR holds `prefix` with the speaker as next hop.
    fn frr_has_route(&self, prefix: &str) -> Result<(), String> {
        let out = self.vtysh(&format!("show bgp ipv4 unicast {prefix} json"));
        contains_all(&out, &[&format!("\"ip\":\"{SPEAKER_V4}\"")])
    }

    /// Loads an nftables ruleset (`nft -f -`) in the router namespace.
    fn nft(&self, ruleset: &str) {
        use std::io::Write as _;
        let mut child = self
            .ns
            .command("nft", &["-f", "-"])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(ruleset.as_bytes())
            .unwrap();
        assert!(child.wait().unwrap().success(), "nft: {ruleset}");
    }

    /// A kernel TCP counter of the router namespace (`nstat`), 0 when absent.
    fn tcp_counter(&self, name: &str) -> u64 {
        self.exec("nstat", &["-asz", name])
            .lines()
            .find_map(|l| {
                let mut f = l.split_whitespace();
                (f.next() == Some(name)).then(|| f.next()?.parse().ok())?
            })
            .unwrap_or(0)
    }
}

impl Lab {
    /// Runs `body` on a thread of its own in the speaker's namespace, on a single-threaded
    /// runtime (so the driver and the checks interleave), and returns its result; a panic in
    /// `body` fails the test after the lab is removed.
    fn in_speaker<T, F>(&self, body: impl FnOnce() -> F + Send + 'static) -> T
    where
        T: Send + 'static,
        F: Future<Output = T>,
    {
        self.speaker.on_thread(move || runtime().block_on(body()))
    }

    /// A listening socket in the router namespace.
    fn listen_in_router(&self, address: std::net::SocketAddr) -> std::net::TcpListener {
        self.router
            .on_thread(move || std::net::TcpListener::bind(address).unwrap())
    }
}

/// Polls `check` every 200 ms without blocking the runtime; panics after `limit`.
async fn wait_for(what: &str, limit: Duration, mut check: impl FnMut() -> Result<(), String>) {
    let until = Instant::now() + limit;
    loop {
        match check() {
            Ok(()) => return,
            Err(e) if Instant::now() > until => panic!("{what} (after {limit:?}): {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Waits until the driver's session `peer` is in a state `want` accepts; returns when it got
/// there.
async fn wait_state(
    driver: &Driver,
    peer: &str,
    limit: Duration,
    want: impl Fn(State) -> bool,
) -> Instant {
    let mut rx = driver.watch_status(peer).unwrap();
    let until = tokio::time::Instant::now() + limit;
    loop {
        if want(rx.borrow_and_update().state) {
            return Instant::now();
        }
        match tokio::time::timeout_at(until, rx.changed()).await {
            Ok(r) => r.unwrap(),
            Err(_) => panic!(
                "session {peer} did not reach the wanted state within {limit:?}: {:?}",
                driver.status().get(peer)
            ),
        }
    }
}

fn established(s: State) -> bool {
    s == State::Established
}

/// A peer with short timers: hold 3 s, keepalive 1 s, `connect` as first retry wait.
fn fast_peer(name: &str, address: &str, password: Option<&str>, connect: Duration) -> Peer {
    let mut p = peer(name, address, password);
    p.hold_time = Duration::from_secs(3);
    p.keepalive_time = Duration::from_secs(1);
    p.connect_time = Some(connect);
    p
}

/// FRR configuration for one IPv4 neighbour (the speaker) with short timers.
fn frr_neighbour_conf(extra: &str) -> String {
    format!(
        "neighbor {SPEAKER_V4} remote-as 64512\n neighbor {SPEAKER_V4} timers 1 3\n \
         neighbor {SPEAKER_V4} timers connect 1\n {extra}\
         address-family ipv4 unicast\n  neighbor {SPEAKER_V4} activate\n exit-address-family\n"
    )
}

/// MD5 with the wrong key: no session on either side (and the router's kernel counted MD5
/// failures, so that is why); with the right key it comes up.
fn frr_md5_mismatch_keeps_the_session_down() {
    let mut lab = Lab::new("md5", FRR_TOOLS);
    let router = start_frr(
        &mut lab,
        &frr_neighbour_conf(&format!("neighbor {SPEAKER_V4} password s3cret\n ")),
    );
    lab.in_speaker(move || async move {
        let mut driver = Driver::new(Arc::new(NoObserver));
        let wrong = fast_peer("frr", ROUTER_V4, Some("wrong"), Duration::from_secs(1));
        let refused = driver.apply(settings(&[wrong]));
        assert!(refused.is_empty(), "MD5 keys refused: {refused:?}");
        let until = Instant::now() + Duration::from_secs(8);
        let mut last_router_check = Instant::now();
        while Instant::now() < until {
            let state = driver.status()["frr"].state;
            assert_ne!(state, State::Established, "session up with the wrong key");
            if last_router_check.elapsed() > Duration::from_secs(1) {
                assert!(
                    !router.frr_established(SPEAKER_V4),
                    "FRR established with the wrong key"
                );
                last_router_check = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let failures = router.tcp_counter("TcpExtTCPMD5Failure");
        assert!(
            failures > 0,
            "no MD5 failure counted by the router's kernel"
        );
        let right = fast_peer("frr", ROUTER_V4, Some("s3cret"), Duration::from_secs(1));
        let refused = driver.apply(settings(&[right]));
        assert!(refused.is_empty(), "MD5 keys refused: {refused:?}");
        wait_state(&driver, "frr", Duration::from_secs(30), established).await;
        wait_for("FRR established", Duration::from_secs(10), || {
            router
                .frr_established(SPEAKER_V4)
                .then_some(())
                .ok_or_else(|| router.frr_neighbour(SPEAKER_V4))
        })
        .await;
        wait_for("route in FRR", Duration::from_secs(10), || {
            router.frr_has_route(PREFIX_V4)
        })
        .await;
        driver.shutdown(Duration::from_secs(2)).await;
    });
}

/// The router goes silent (all BGP traffic dropped in its namespace): the driver's hold timer
/// (3 s) ends the session with a Hold Timer Expired NOTIFICATION; while the router stays silent
/// the driver retries with a doubling wait (counted as distinct SYN source ports at the router),
/// and after the traffic flows again the session and the routes come back.
fn frr_silent_peer_hold_timer_expires_and_session_recovers() {
    let mut lab = Lab::new("hold", FRR_TOOLS);
    let router = start_frr(&mut lab, &frr_neighbour_conf(""));
    lab.in_speaker(move || async move {
        let mut driver = Driver::new(Arc::new(NoObserver));
        let refused = driver.apply(settings(&[fast_peer(
            "frr",
            ROUTER_V4,
            None,
            Duration::from_secs(1),
        )]));
        assert!(refused.is_empty(), "MD5 keys refused: {refused:?}");
        wait_state(&driver, "frr", Duration::from_secs(30), established).await;
        wait_for("route in FRR", Duration::from_secs(10), || {
            router.frr_has_route(PREFIX_V4)
        })
        .await;
        let silent_from = Instant::now();
        router.nft(
            "table inet flbtest {\n\
               set attempts { type inet_service; flags dynamic; size 4096; }\n\
               chain in { type filter hook input priority 0; policy accept;\n\
                 tcp dport 179 tcp flags & (syn | ack) == syn add @attempts { tcp sport }\n\
                 tcp dport 179 drop\n tcp sport 179 drop\n }\n\
               chain out { type filter hook output priority 0; policy accept;\n\
                 tcp dport 179 drop\n tcp sport 179 drop\n }\n\
             }\n",
        );
        let down = wait_state(&driver, "frr", Duration::from_secs(10), |s| {
            s != State::Established
        })
        .await;
        let after = down - silent_from;
        // The last KEEPALIVE arrived at most 1 s before the silence began.
        assert!(
            after >= Duration::from_millis(1900) && after <= Duration::from_millis(4500),
            "session down {after:?} after the peer went silent, hold time is 3 s"
        );
        let why = driver.status()["frr"].last_error.clone().unwrap_or_default();
        assert!(
            why.contains("NotificationSent") && why.contains("code: 4,"),
            "not a Hold Timer Expired NOTIFICATION: {why}"
        );
        // Stay silent 7 s: with a 1 s connect time doubling per failure the attempts start
        // about 1, 2, 4 s after the loss (the next one at 8 s); without backoff there would be 7.
        tokio::time::sleep_until((down + Duration::from_secs(7)).into()).await;
        let set = router.exec(
            "nft",
            &["-j", "list", "set", "inet", "flbtest", "attempts"],
        );
        let ports: Vec<u64> = set
            .split("\"elem\": [")
            .nth(1)
            .map(|e| {
                e.split(']')
                    .next()
                    .unwrap_or_default()
                    .split(',')
                    .filter_map(|p| p.trim().parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        assert!(
            (2..=4).contains(&ports.len()),
            "{} connection attempts in 7 s of silence, want 2 to 4 (backoff 1, 2, 4 s): {set}",
            ports.len()
        );
        let restored = Instant::now();
        router.nft("delete table inet flbtest\n");
        let up = wait_state(&driver, "frr", Duration::from_secs(20), established).await;
        eprintln!(
            "hold: down after {after:?}, {} attempts while silent, up again {:?} after the traffic returned",
            ports.len(),
            up - restored
        );
        wait_for("route in FRR again", Duration::from_secs(10), || {
            router.frr_has_route(PREFIX_V4)
        })
        .await;
        driver.shutdown(Duration::from_secs(2)).await;
    });
}

/// The address of the test's own BGP "router" (a second address in the router namespace).
const RAW_V4: &str = "198.19.77.3";
/// Its port (FRR holds 179 on every address).
const RAW_PORT: u16 = 1790;

/// Reads whole BGP messages from a raw socket.
struct RawPeer {
    stream: tokio::net::TcpStream,
    buf: Vec<u8>,
    /// When the speaker's connection was accepted.
    accepted: Instant,
}

impl RawPeer {
    /// The next message, `None` at end of stream.
    async fn next(&mut self) -> Option<Message> {
        use tokio::io::AsyncReadExt as _;
        loop {
            if let Some(len) = Message::frame_len(&self.buf).unwrap()
                && len <= self.buf.len()
            {
                let frame: Vec<u8> = self.buf.drain(..len).collect();
                let ctx = CodecContext {
                    four_octet_as: true,
                };
                return Some(Message::decode(&frame, &ctx).unwrap());
            }
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        use tokio::io::AsyncWriteExt as _;
        self.stream.write_all(bytes).await.unwrap();
    }

    /// Accepts the speaker's connection and runs OPEN / KEEPALIVE until the driver reports the
    /// session Established.
    async fn accept(listener: &tokio::net::TcpListener, driver: &Driver, name: &str) -> Self {
        let (stream, _) = tokio::time::timeout(Duration::from_secs(30), listener.accept())
            .await
            .expect("the speaker did not connect")
            .unwrap();
        let mut peer = RawPeer {
            stream,
            buf: Vec::new(),
            accepted: Instant::now(),
        };
        let Some(Message::Open(_)) = peer.next().await else {
            panic!("no OPEN from the speaker");
        };
        let caps = vec![
            Capability::Multiprotocol(AfiSafi::IPV4_UNICAST),
            Capability::Multiprotocol(AfiSafi::IPV6_UNICAST),
        ];
        let open = Open::new(64500, 9, RAW_V4.parse().unwrap(), caps);
        let ctx = CodecContext::default();
        peer.send(&Message::Open(open).to_bytes(&ctx).unwrap())
            .await;
        peer.send(&Message::Keepalive.to_bytes(&ctx).unwrap()).await;
        loop {
            match peer.next().await {
                Some(Message::Keepalive) => break,
                Some(_) => {}
                None => panic!("the speaker closed during the handshake"),
            }
        }
        wait_state(driver, name, Duration::from_secs(10), established).await;
        peer
    }

    /// Reads to the end of the stream and returns the NOTIFICATIONs the speaker sent.
    async fn notifications_until_closed(&mut self) -> Vec<Notification> {
        let mut out = Vec::new();
        let read_all = async {
            while let Some(m) = self.next().await {
                if let Message::Notification(n) = m {
                    out.push(n);
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), read_all)
            .await
            .expect("the speaker did not close the connection");
        out
    }
}

/// A header with the given marker byte, length and type, then `body`.
fn raw_message(marker: u8, length: u16, message_type: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![0xff; 16];
    m[15] = marker;
    m.extend_from_slice(&length.to_be_bytes());
    m.push(message_type);
    m.extend_from_slice(body);
    m
}

/// A test-controlled peer sends a malformed message after the session is up: the speaker
/// answers with the NOTIFICATION RFC 4271 §6 names, closes, and connects again only after the
/// connect time (2 s); a second session of the same driver, with FRR, stays Established with
/// its routes the whole time.
fn malformed_messages_get_the_right_notification_and_spare_other_sessions() {
    let mut lab = Lab::new("malformed", FRR_TOOLS);
    lab.router.add_address("r0", RAW_V4);
    let router = start_frr(&mut lab, &frr_neighbour_conf(""));
    let listener = lab.listen_in_router(format!("{RAW_V4}:{RAW_PORT}").parse().unwrap());
    lab.in_speaker(move || async move {
        listener.set_nonblocking(true).unwrap();
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let connect = Duration::from_secs(2);
        let mut raw = fast_peer("raw", RAW_V4, None, connect);
        raw.port = RAW_PORT;
        // The raw peer proposes 9 s and sends no KEEPALIVEs of its own; each case takes less.
        raw.hold_time = Duration::from_secs(9);
        raw.keepalive_time = Duration::from_secs(3);
        let frr = fast_peer("frr", ROUTER_V4, None, Duration::from_secs(1));
        let mut driver = Driver::new(Arc::new(NoObserver));
        let refused = driver.apply(settings(&[frr, raw]));
        assert!(refused.is_empty(), "MD5 keys refused: {refused:?}");
        wait_state(&driver, "frr", Duration::from_secs(30), established).await;
        wait_for("route in FRR", Duration::from_secs(10), || {
            router.frr_has_route(PREFIX_V4)
        })
        .await;
        // Any change of the FRR session's state from here on is a failure.
        let mut frr_status = driver.watch_status("frr").unwrap();
        frr_status.mark_unchanged();
        let frr_changes = tokio::spawn(async move {
            let mut seen = Vec::new();
            while frr_status.changed().await.is_ok() {
                let s = frr_status.borrow_and_update().clone();
                if s.state != State::Established {
                    seen.push(s);
                }
            }
            seen
        });
        use ferrolb_bgp::packet::iana::{error_code, header_subcode, message_type, update_subcode};
        let cases = [
            (
                "bad marker",
                raw_message(0xfe, 19, message_type::KEEPALIVE, &[]),
                (
                    error_code::MESSAGE_HEADER,
                    header_subcode::CONNECTION_NOT_SYNCHRONIZED,
                    vec![],
                ),
            ),
            (
                "bad length (KEEPALIVE of 20 octets)",
                raw_message(0xff, 20, message_type::KEEPALIVE, &[0]),
                (
                    error_code::MESSAGE_HEADER,
                    header_subcode::BAD_MESSAGE_LENGTH,
                    vec![0, 20],
                ),
            ),
            (
                "UPDATE whose total path attribute length overruns the message",
                // Withdrawn routes length 0, total path attribute length 100, four octets.
                raw_message(
                    0xff,
                    27,
                    message_type::UPDATE,
                    &[0, 0, 0, 100, 0x40, 1, 1, 0],
                ),
                (
                    error_code::UPDATE_MESSAGE,
                    update_subcode::MALFORMED_ATTRIBUTE_LIST,
                    vec![],
                ),
            ),
        ];
        let mut peer = RawPeer::accept(&listener, &driver, "raw").await;
        for (i, (what, bytes, (code, subcode, data))) in cases.iter().enumerate() {
            let sent = Instant::now();
            peer.send(bytes).await;
            let notifications = peer.notifications_until_closed().await;
            assert_eq!(
                notifications
                    .iter()
                    .map(|n| (n.code, n.subcode, n.data.clone()))
                    .collect::<Vec<_>>(),
                vec![(*code, *subcode, data.clone())],
                "{what}: NOTIFICATIONs sent by the speaker"
            );
            assert_ne!(driver.status()["raw"].state, State::Established, "{what}");
            if i + 1 == cases.len() {
                break;
            }
            peer = RawPeer::accept(&listener, &driver, "raw").await;
            let gap = peer.accepted - sent;
            assert!(
                gap >= connect,
                "{what}: reconnected {gap:?} after the error, connect time is {connect:?}"
            );
            assert!(gap < connect + Duration::from_secs(3), "{what}: {gap:?}");
            eprintln!("{what}: NOTIFICATION {code}/{subcode}, reconnected after {gap:?}");
        }
        // Nothing came back yet within the connect time after the last error.
        let early =
            tokio::time::timeout(connect - Duration::from_millis(300), listener.accept()).await;
        assert!(early.is_err(), "reconnected before the connect time");
        router.frr_has_route(PREFIX_V4).unwrap();
        let frr = router.frr_neighbour(SPEAKER_V4);
        contains_all(
            &frr,
            &[
                "\"bgpState\":\"Established\"",
                "\"connectionsEstablished\":1,",
            ],
        )
        .unwrap();
        assert_eq!(driver.status()["frr"].state, State::Established);
        // FRR negotiates IPv4 unicast only here: the IPv4 prefix.
        assert_eq!(driver.status()["frr"].announced, 1);
        driver.shutdown(Duration::from_secs(2)).await;
        let changes = frr_changes.await.unwrap();
        // Shutdown itself takes the session down; nothing before it may have.
        assert!(
            changes
                .iter()
                .all(|s| s.last_error.as_deref() == Some("Stopped")),
            "the FRR session changed: {changes:?}"
        );
    });
}

impl Lab {
    /// The speaker's namespace, for `ss` and `nstat`.
    fn speaker_ctl(&self) -> Router {
        Router {
            ns: self.speaker.clone(),
            frr: None,
        }
    }
}

/// Established TCP connections on port 179 in a namespace (`ss`), as "local peer" lines.
fn bgp_connections(ns: &Router) -> Vec<String> {
    ns.exec(
        "ss",
        &[
            "-Htn",
            "state",
            "established",
            "( sport = :179 or dport = :179 )",
        ],
    )
    .lines()
    .map(|l| l.split_whitespace().skip(2).collect::<Vec<_>>().join(" "))
    .filter(|l| !l.is_empty())
    .collect()
}

/// FRR connects to the speaker's listener (the speaker's own attempts go to a closed port), with
/// TCP MD5: with the wrong key on the listener nothing is accepted (the speaker's kernel counts
/// MD5 failures), with the right one the session comes up on FRR's connection.
fn frr_connects_to_the_speakers_listener_with_md5() {
    let mut lab = Lab::new("incoming", FRR_TOOLS);
    let router = start_frr(
        &mut lab,
        &frr_neighbour_conf(&format!("neighbor {SPEAKER_V4} password s3cret\n ")),
    );
    let speaker = lab.speaker_ctl();
    lab.in_speaker(move || async move {
        let mut driver = Driver::new(Arc::new(NoObserver));
        assert!(driver.listen(&DEFAULT_LISTEN).is_empty());
        let peer = |password| {
            let mut p = fast_peer("frr", ROUTER_V4, Some(password), Duration::from_secs(1));
            // Nothing listens there: only FRR's connections can carry the session.
            p.port = 1790;
            p
        };
        let refused = driver.apply(settings(&[peer("wrong")]));
        assert!(refused.is_empty(), "MD5 keys refused: {refused:?}");
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_ne!(driver.status()["frr"].state, State::Established);
        assert!(!router.frr_established(SPEAKER_V4));
        let failures = speaker.tcp_counter("TcpExtTCPMD5Failure");
        assert!(failures > 0, "the listener's kernel saw no MD5 failure");
        let refused = driver.apply(settings(&[peer("s3cret")]));
        assert!(refused.is_empty(), "MD5 keys refused: {refused:?}");
        let started = Instant::now();
        wait_state(&driver, "frr", Duration::from_secs(30), established).await;
        eprintln!(
            "incoming: established {:?} after the right key",
            started.elapsed()
        );
        wait_for("route in FRR", Duration::from_secs(10), || {
            router.frr_has_route(PREFIX_V4)
        })
        .await;
        // FRR opened the connection: its far end is our port 179.
        let conns = bgp_connections(&speaker);
        assert!(
            conns.len() == 1 && conns[0].starts_with(&format!("{SPEAKER_V4}:179 {ROUTER_V4}:")),
            "want one connection from FRR to our port 179: {conns:?}"
        );
        driver.shutdown(Duration::from_secs(2)).await;
    });
}

/// Both sides connect at once. FRR's answer on the speaker's connection is held back (nft
/// drops FRR's data from port 179) until FRR's own connection has reached the speaker, so both
/// connections are open together; RFC 4271 §6.8 must then keep exactly the one opened by the
/// side with the higher BGP identifier, on both sides.
fn collision(speaker_id: &str, keeps: &str) {
    let mut lab = Lab::new(&format!("coll-{keeps}"), FRR_TOOLS);
    let router = start_frr(&mut lab, &frr_neighbour_conf(""));
    let speaker = lab.speaker_ctl();
    let speaker_id: std::net::Ipv4Addr = speaker_id.parse().unwrap();
    let keeps = keeps.to_string();
    lab.in_speaker(move || async move {
        // FRR's data on connections the speaker opened (FRR's port 179) waits, and FRR's own
        // connections wait until the speaker's one is open.
        const HOLD_FRR_DATA: &str = "add rule inet flbtest out tcp sport 179 ip length > 80 drop\n";
        router.nft(&format!(
            "table inet flbtest {{\n\
               chain out {{ type filter hook output priority 0; policy accept; }}\n\
             }}\n\
             add rule inet flbtest out tcp dport 179 drop\n{HOLD_FRR_DATA}"
        ));
        let mut driver = Driver::new(Arc::new(NoObserver));
        assert!(driver.listen(&DEFAULT_LISTEN).is_empty());
        let mut p = fast_peer("frr", ROUTER_V4, None, Duration::from_secs(1));
        p.router_id = Some(speaker_id);
        let refused = driver.apply(settings(&[p]));
        assert!(refused.is_empty(), "MD5 keys refused: {refused:?}");
        wait_state(&driver, "frr", Duration::from_secs(10), |s| {
            s == State::OpenSent
        })
        .await;
        router.nft(&format!("flush chain inet flbtest out\n{HOLD_FRR_DATA}"));
        let mut status = driver.watch_status("frr").unwrap();
        tokio::time::timeout(Duration::from_secs(30), async {
            while status.borrow_and_update().collisions == 0 {
                status.changed().await.unwrap();
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no collision: {:?}", driver.status()["frr"]));
        router.nft("delete table inet flbtest\n");
        let up = wait_state(&driver, "frr", Duration::from_secs(30), established).await;
        wait_for("FRR established", Duration::from_secs(10), || {
            router
                .frr_established(SPEAKER_V4)
                .then_some(())
                .ok_or_else(|| router.frr_neighbour(SPEAKER_V4))
        })
        .await;
        wait_for("route in FRR", Duration::from_secs(10), || {
            router.frr_has_route(PREFIX_V4)
        })
        .await;
        // Settled: one connection, the same session for 4 s.
        tokio::time::sleep_until((up + Duration::from_secs(4)).into()).await;
        let s = driver.status()["frr"].clone();
        assert_eq!(s.state, State::Established);
        assert_eq!(s.collisions, 1, "{s:?}");
        let conns = bgp_connections(&speaker);
        assert_eq!(conns.len(), 1, "connections: {conns:?}");
        let ours = format!("{ROUTER_V4}:179");
        let opened_by_speaker = conns[0].ends_with(&ours);
        assert_eq!(
            opened_by_speaker,
            keeps == "speaker",
            "kept {conns:?}, want the one opened by the {keeps}"
        );
        contains_all(
            &router.frr_neighbour(SPEAKER_V4),
            &[
                "\"bgpState\":\"Established\"",
                "\"connectionsEstablished\":1,",
            ],
        )
        .unwrap();
        eprintln!("collision: kept {conns:?} (opened by the {keeps})");
        driver.shutdown(Duration::from_secs(2)).await;
    });
}

fn collision_keeps_frrs_connection_when_frr_has_the_higher_identifier() {
    // FRR's identifier is 198.19.77.2.
    collision("198.19.77.1", "router");
}

fn collision_keeps_the_speakers_connection_when_it_has_the_higher_identifier() {
    collision("198.19.77.9", "speaker");
}

fn frr_ipv4_session_with_md5_and_ipv6_session() {
    let mut lab = Lab::new("frr", FRR_TOOLS);
    let router = start_frr(
        &mut lab,
        &format!(
            "neighbor {SPEAKER_V4} remote-as 64512\n neighbor {SPEAKER_V4} password s3cret\n \
             neighbor {SPEAKER_V4} timers 3 9\n neighbor {SPEAKER_V6} remote-as 64512\n \
             neighbor {SPEAKER_V6} timers 3 9\n \
             address-family ipv4 unicast\n  neighbor {SPEAKER_V4} activate\n exit-address-family\n \
             address-family ipv6 unicast\n  neighbor {SPEAKER_V4} activate\n  neighbor {SPEAKER_V6} activate\n exit-address-family\n"
        ),
    );
    let router2 = router.clone();
    exercise(
        &lab,
        vec![
            peer("frr-v4", ROUTER_V4, Some("s3cret")),
            peer("frr-v6", ROUTER_V6, None),
        ],
        move |_| {
            let v4 = router.vtysh(&format!("show bgp ipv4 unicast {PREFIX_V4} json"));
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
            let v6 = router.vtysh(&format!("show bgp ipv6 unicast {PREFIX_V6} json"));
            // Received twice: over the IPv4 session (next hop = the node's IPv6 address) and
            // over the IPv6 session (next hop = the session's local address); both fd00:77::1.
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
        move |_| {
            let all = router2.vtysh("show bgp ipv4 unicast json")
                + &router2.vtysh("show bgp ipv6 unicast json");
            contains_none(&all, &["198.51.100.10", "2001:db8:77::10"])
        },
    );
}

fn bird_receives_both_families_over_ipv4() {
    let mut lab = Lab::new("bird", BIRD_TOOLS);
    let conf = lab.dir().join("bird.conf");
    std::fs::write(
        &conf,
        format!(
            "router id {ROUTER_V4};\nprotocol device {{}}\n\
             protocol bgp ferrolb {{\n  local {ROUTER_V4} as 64500;\n  neighbor {SPEAKER_V4} as 64512;\n  passive on;\n  hold time 9;\n\
               ipv4 {{ import all; export none; }};\n  ipv6 {{ import all; export none; }};\n}}\n"
        ),
    )
    .unwrap();
    let sock = lab.dir().join("bird.ctl").display().to_string();
    let conf = conf.display().to_string();
    let pid = lab.dir().join("bird.pid").display().to_string();
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

fn gobgp_receives_both_families_over_ipv4() {
    let mut lab = Lab::new("gobgp", GOBGP_TOOLS);
    let conf = lab.dir().join("gobgpd.toml");
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

/// A test: its name, the tools it needs, its body (panics on failure).
type Test = (&'static str, &'static [&'static str], fn());

fn main() -> std::process::ExitCode {
    let tests: Vec<Test> = vec![
        (
            "frr_md5_mismatch_keeps_the_session_down",
            FRR_TOOLS,
            frr_md5_mismatch_keeps_the_session_down,
        ),
        (
            "frr_silent_peer_hold_timer_expires_and_session_recovers",
            FRR_TOOLS,
            frr_silent_peer_hold_timer_expires_and_session_recovers,
        ),
        (
            "malformed_messages_get_the_right_notification_and_spare_other_sessions",
            FRR_TOOLS,
            malformed_messages_get_the_right_notification_and_spare_other_sessions,
        ),
        (
            "frr_connects_to_the_speakers_listener_with_md5",
            FRR_TOOLS,
            frr_connects_to_the_speakers_listener_with_md5,
        ),
        (
            "collision_keeps_frrs_connection_when_frr_has_the_higher_identifier",
            FRR_TOOLS,
            collision_keeps_frrs_connection_when_frr_has_the_higher_identifier,
        ),
        (
            "collision_keeps_the_speakers_connection_when_it_has_the_higher_identifier",
            FRR_TOOLS,
            collision_keeps_the_speakers_connection_when_it_has_the_higher_identifier,
        ),
        (
            "frr_ipv4_session_with_md5_and_ipv6_session",
            FRR_TOOLS,
            frr_ipv4_session_with_md5_and_ipv6_session,
        ),
        (
            "bird_receives_both_families_over_ipv4",
            BIRD_TOOLS,
            bird_receives_both_families_over_ipv4,
        ),
        (
            "gobgp_receives_both_families_over_ipv4",
            GOBGP_TOOLS,
            gobgp_receives_both_families_over_ipv4,
        ),
    ];
    trial::run(
        tests
            .into_iter()
            .map(|(name, tools, body)| trial::needs(name, tools, body))
            .collect(),
    )
}
