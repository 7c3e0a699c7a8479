//! The BFD driver against BIRD 2 with authentication (RFC 5880 6.7), each in a network
//! namespace of its own, joined by a veth pair (198.19.78.0/24, the lab's range, joined to
//! nothing else). FRR's bfdd has no authentication, so BIRD is the router here.
//!
//! For each authentication type BIRD and ferrolb both run: the session comes Up on both sides;
//! control packets forged from the segment (the router's address, TTL 255, State Down),
//! unsigned or signed with a guessed key, are refused and the session stays Up; a changed key
//! on our side takes the session down on both sides, and the right key brings it back; a
//! restart of BIRD (a new discriminator and a new sequence number) comes back Up.
//!
//! Needs root and BIRD (`e2e/install-deps` installs bird2); without them each test is reported
//! as ignored, never as passed, and `scripts/test` fails in CI when a test was ignored.
//! Namespaces and processes are removed on drop, also when an assertion fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferrolb_bfd::auth::{AuthType, Authentication};
use ferrolb_bfd::packet::{ControlPacket, Diagnostic, State};
use ferrolb_bfd::session::Config;
use ferrolb_speaker::bfd::driver::{Bfd, Observer, Options};
use ferrolb_speaker::bfd::table::Refused;
use ferrolb_speaker::bfd::{SessionKey, Settings, Status};
use ferrolb_testkit::netns::{self, Netns};
use ferrolb_testkit::trial;

const SPEAKER: &str = "198.19.78.1";
const ROUTER: &str = "198.19.78.2";
const BIRD_TOOLS: &[&str] = &["/usr/sbin/bird", "/usr/sbin/birdc"];
const KEY: &[u8] = b"ferrolb-bfd-key";

/// Refusals and state changes, as the speaker's metrics count them.
#[derive(Default)]
struct Seen {
    refused: Mutex<Vec<String>>,
    downs: Mutex<usize>,
}

impl Observer for Seen {
    fn packet_in(&self, _: &SessionKey) {}
    fn packet_out(&self, _: &SessionKey) {}
    fn state_changed(&self, _: &SessionKey, from: State, to: State, _: Diagnostic) {
        if from == State::Up && to != State::Up {
            *self.downs.lock().unwrap() += 1;
        }
    }
    fn refused(&self, _: IpAddr, why: &Refused) {
        self.refused.lock().unwrap().push(why.to_string());
    }
}

impl Seen {
    fn refused_with(&self, words: &str) -> usize {
        self.refused
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.contains(words))
            .count()
    }
}

/// The two namespaces, BIRD, and its files.
struct Lab {
    lab: netns::Lab,
    speaker: Netns,
    router: Netns,
    bird: Option<u32>,
}

impl Lab {
    fn new(name: &str) -> Lab {
        trial::require(BIRD_TOOLS);
        let mut lab = netns::Lab::new("flbbfd", name);
        let (speaker, router) = lab.pair(("s", "s0", &[SPEAKER]), ("r", "r0", &[ROUTER]));
        Lab {
            lab,
            speaker,
            router,
            bird: None,
        }
    }

    fn sock(&self) -> String {
        self.lab.dir().join("bird.ctl").display().to_string()
    }

    /// Starts BIRD with one BFD neighbour, the speaker, authenticated with `kind` and [`KEY`].
    fn start_bird(&mut self, kind: AuthType) {
        let conf = self.lab.dir().join("bird.conf");
        let authentication = match kind {
            AuthType::KeyedMd5 => "keyed md5",
            AuthType::MeticulousKeyedMd5 => "meticulous keyed md5",
            AuthType::KeyedSha1 => "keyed sha1",
            AuthType::MeticulousKeyedSha1 => "meticulous keyed sha1",
        };
        let key = String::from_utf8(KEY.to_vec()).unwrap();
        std::fs::write(
            &conf,
            format!(
                "router id {ROUTER};\nprotocol device {{}}\n\
                 protocol bfd {{\n  interface \"r0\" {{\n    min rx interval 100 ms;\n    min tx interval 100 ms;\n    multiplier 3;\n\
                     authentication {authentication};\n    password \"{key}\" {{ id 1; }};\n  }};\n\
                   neighbor {SPEAKER} dev \"r0\" local {ROUTER};\n}}\n"
            ),
        )
        .unwrap();
        let conf = conf.display().to_string();
        let sock = self.sock();
        let pid = self.lab.dir().join("bird.pid").display().to_string();
        let router = self.router.clone();
        self.bird = Some(self.lab.spawn(
            &router,
            "/usr/sbin/bird",
            &["-f", "-c", &conf, "-s", &sock, "-P", &pid],
        ));
    }

    /// Stops BIRD (SIGKILL: no AdminDown goes out, as when a router restarts hard).
    fn kill_bird(&mut self) {
        if let Some(pid) = self.bird.take() {
            netns::run("kill", &["-KILL", &pid.to_string()]);
        }
    }

    /// BIRD's state of its session with the speaker (`Up`, `Down`, `Init`), or its output.
    fn bird_state(&self) -> Result<String, String> {
        let out = self
            .router
            .output("birdc", &["-s", &self.sock(), "show", "bfd", "sessions"]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        text.lines()
            .find(|l| l.starts_with(SPEAKER))
            .and_then(|l| l.split_whitespace().nth(2))
            .map(str::to_string)
            .ok_or(text)
    }

    /// Waits until BIRD says `state` for the speaker's session.
    fn wait_bird(&self, state: &str) {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            match self.bird_state() {
                Ok(s) if s == state => return,
                other if Instant::now() > until => {
                    panic!("BIRD's session never became {state}: {other:?}")
                }
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Sends `packets` to the speaker's single-hop port from the router's address at TTL 255,
    /// as any host on the segment can.
    fn forge(&self, packets: Vec<Vec<u8>>) {
        self.router.on_thread(move || {
            let socket = std::net::UdpSocket::bind(format!("{ROUTER}:0")).unwrap();
            socket.set_ttl(255).unwrap();
            for p in packets {
                socket
                    .send_to(&p, format!("{SPEAKER}:{}", ferrolb_bfd::SINGLE_HOP_PORT))
                    .unwrap();
            }
        });
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.kill_bird();
    }
}

fn key() -> SessionKey {
    SessionKey {
        peer: ROUTER.parse().unwrap(),
        local: Some(SPEAKER.parse().unwrap()),
        multihop: false,
    }
}

fn settings(kind: AuthType, key: &[u8]) -> Settings {
    Settings {
        config: Config {
            desired_min_tx: Duration::from_millis(100),
            required_min_rx: Duration::from_millis(100),
            detect_mult: 3,
            passive: false,
            auth: Some(Authentication::new(kind, 1, key).unwrap()),
        },
        minimum_ttl: 255,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// What the test asks of the driver's thread.
enum Command {
    /// Run the session with these settings.
    Apply(Settings),
    /// Wait until the session is in this state, having come Up more than this many times.
    Wait(State, u64),
    /// Report how often it went down from Up and how many packets failed authentication.
    Counts,
}

/// The driver's thread's answer.
#[derive(Debug)]
enum Reply {
    Done,
    Status(Status),
    Counts {
        downs: usize,
        refused: usize,
        state: State,
    },
    Failed(String),
}

/// The driver, on a current-thread runtime in the speaker's namespace, listening on the
/// speaker's address and taking [`Command`]s until the sender is dropped.
struct Driver {
    commands: Option<std::sync::mpsc::Sender<Command>>,
    replies: std::sync::mpsc::Receiver<Reply>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Driver {
    fn start(speaker: &Netns) -> Driver {
        let (commands, rx) = std::sync::mpsc::channel::<Command>();
        let (tx, replies) = std::sync::mpsc::channel();
        let thread = speaker.thread(move || {
            runtime().block_on(async move {
                let seen = Arc::new(Seen::default());
                let (mut driver, failed) = Bfd::start(
                    Options {
                        listen: vec![SPEAKER.parse().unwrap()],
                        ..Options::default()
                    },
                    seen.clone(),
                );
                if !failed.is_empty() {
                    let _ = tx.send(Reply::Failed(format!("{failed:?}")));
                    return;
                }
                loop {
                    let command = match rx.try_recv() {
                        Ok(c) => c,
                        Err(std::sync::mpsc::TryRecvError::Empty) => {
                            // The driver's task runs while this one sleeps.
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            continue;
                        }
                        Err(std::sync::mpsc::TryRecvError::Disconnected) => break,
                    };
                    let reply = match command {
                        Command::Apply(settings) => {
                            driver.apply(BTreeMap::from([(key(), settings)]));
                            Reply::Done
                        }
                        Command::Wait(state, ups) => match driver.status(&key()) {
                            None => Reply::Failed("no session".into()),
                            Some(mut rx) => {
                                let wait = async {
                                    loop {
                                        let s = *rx.borrow_and_update();
                                        if s.state == state && s.ups > ups {
                                            return s;
                                        }
                                        if rx.changed().await.is_err() {
                                            return s;
                                        }
                                    }
                                };
                                match tokio::time::timeout(Duration::from_secs(30), wait).await {
                                    Ok(s) if s.state == state => Reply::Status(s),
                                    _ => Reply::Failed(format!(
                                        "never {state:?} with more than {ups} Ups: {:?}",
                                        *rx.borrow()
                                    )),
                                }
                            }
                        },
                        Command::Counts => Reply::Counts {
                            downs: *seen.downs.lock().unwrap(),
                            refused: seen.refused_with("authentication"),
                            state: driver
                                .statuses()
                                .get(&key())
                                .map_or(State::Down, |s| s.state),
                        },
                    };
                    if tx.send(reply).is_err() {
                        break;
                    }
                }
                driver.shutdown(Duration::from_secs(1)).await;
            });
        });
        Driver {
            commands: Some(commands),
            replies,
            thread: Some(thread),
        }
    }

    fn ask(&self, command: Command) -> Reply {
        self.commands
            .as_ref()
            .expect("driver running")
            .send(command)
            .expect("driver thread gone");
        match self.replies.recv_timeout(Duration::from_secs(60)) {
            Ok(Reply::Failed(why)) => panic!("driver: {why}"),
            Ok(reply) => reply,
            Err(e) => panic!("driver thread: {e}"),
        }
    }

    fn wait(&self, state: State, ups: u64) -> Status {
        match self.ask(Command::Wait(state, ups)) {
            Reply::Status(s) => s,
            other => panic!("{other:?}"),
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.commands = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A Down packet as a forger would make it: the router's side of the session, naming ours.
fn forged_down(your_discriminator: u32) -> ControlPacket {
    ControlPacket {
        diagnostic: Diagnostic::NeighborSignaledDown,
        state: State::Down,
        poll: false,
        final_: false,
        control_plane_independent: false,
        demand: false,
        detect_mult: 3,
        my_discriminator: 0x0bad_cafe,
        your_discriminator,
        desired_min_tx: 100_000,
        required_min_rx: 100_000,
        required_min_echo_rx: 0,
        auth: None,
    }
}

fn authenticated_session_with_bird(kind: AuthType) {
    let mut lab = Lab::new(&kind.code().to_string());
    lab.start_bird(kind);
    // Declared after the lab: dropped (stopped) before BIRD and the namespaces go.
    let driver = Driver::start(&lab.speaker);
    driver.ask(Command::Apply(settings(kind, KEY)));
    driver.wait(State::Up, 0);
    lab.wait_bird("Up");

    // Forged Downs at TTL 255 from the router's address: unsigned, and signed with a guessed
    // key; naming no session, or guessing ours.
    let mut packets = Vec::new();
    for your in [0, 1, 2, 3, u32::MAX] {
        packets.push(forged_down(your).encode());
        let mut guessed = forged_down(your);
        Authentication::new(kind, 1, b"a guess")
            .unwrap()
            .sign(&mut guessed, 1);
        packets.push(guessed.encode());
    }
    for _ in 0..20 {
        lab.forge(packets.clone());
    }
    std::thread::sleep(Duration::from_secs(1));
    match driver.ask(Command::Counts) {
        Reply::Counts {
            downs,
            refused,
            state,
        } => {
            assert_eq!(state, State::Up);
            assert_eq!(downs, 0, "a forged packet took the session down");
            // The ones naming no session reach ours by the address and fail authentication;
            // those naming a discriminator we do not have are refused before (no session).
            assert!(
                refused >= 20 * 2,
                "only {refused} refused for authentication"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(lab.bird_state(), Ok("Up".to_string()));

    // Another key on our side: each side refuses the other's packets and both go Down; the
    // right key brings the session back.
    driver.ask(Command::Apply(settings(kind, b"another key")));
    driver.wait(State::Down, 0);
    lab.wait_bird("Down");
    let ups = driver.wait(State::Down, 0).ups;
    driver.ask(Command::Apply(settings(kind, KEY)));
    driver.wait(State::Up, ups);
    lab.wait_bird("Up");

    // BIRD restarts hard (SIGKILL, no AdminDown): a new discriminator and a new sequence
    // number. Our side notices by the detection time and comes back Up with the new session.
    let ups = driver.wait(State::Up, 0).ups;
    lab.kill_bird();
    lab.start_bird(kind);
    driver.wait(State::Up, ups);
    lab.wait_bird("Up");
    drop(driver);
}

fn main() -> std::process::ExitCode {
    trial::run(
        AuthType::ALL
            .into_iter()
            .map(|kind| {
                trial::needs(
                    format!("{}_session_with_bird", kind.name().replace('-', "_")),
                    BIRD_TOOLS,
                    move || authenticated_session_with_bird(kind),
                )
            })
            .collect(),
    )
}
