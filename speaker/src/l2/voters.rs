//! Layer 2 membership by voters (`--membership=voters`; issue #34, decision record 0023): this
//! speaker beats to a few voter nodes, takes their reports, and acts on a majority of them;
//! on a voter node it also runs the voter, which answers every node's beats. The rules are
//! `ferrolb_layer2::voters` ([`Member`], [`Seat`]); this is their I/O.
//!
//! The v4 datagrams share the heartbeat port and keys with [`super::gossip`], whose receive
//! loop hands them over by their version byte (`ferrolb_layer2::wire::version`), so a node
//! needs one open port whichever membership it runs.
//!
//! - **The presence set** is the cluster's Nodes (decision 0023, *The presence set*): a Node
//!   that comes or goes changes it, and the member's keep rule holds a departing node while a
//!   fresh report may still list it. No presence Lease is read.
//! - **The voters** come from `--voters` (generation 1, confirmed at every check while it is
//!   the flag's), or from the controller's voter configuration (`--voters-object`,
//!   [`super::voter_object`]): the member adopts every newer configuration it reads, and the
//!   seat starts, moves, retires and is confirmed only through the duty loop's reads
//!   ([`Link::duty_plan`], [`Link::duty_apply`]; `ferrolb_layer2::voters::duty`).
//! - **A voter answers each beat at once** from the receive task, under the one lock that
//!   guards the member and the seat (a report costs a copy of the voter's bitmap).
//! - **Interfaces** are not reported by the voters: every other candidate counts as able to
//!   announce anywhere (`interfaces_unknown`), the doubt that keeps owner choice the same on
//!   every node.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ferrolb_layer2::gate::Decision;
use ferrolb_layer2::heartbeat::KeyRing;
use ferrolb_layer2::voters::duty::{self, Mark, Planned, SeatAction, SeatState};
use ferrolb_layer2::voters::{Member, Roster, Seat, Timers, VoterConfig};
use ferrolb_layer2::wire::{self, Message, heard};
use tokio::net::UdpSocket;
use tokio::sync::Notify;

use ferrolb_layer2::voters::member::MemberError;
use ferrolb_layer2::voters::voter::VoterError;

use crate::l2::gossip;
use crate::metrics::Metrics;

/// What the voters membership is started with.
#[derive(Clone, Debug)]
pub struct Settings {
    /// This node's name.
    pub node: String,
    /// The voter configuration of `--voters`; `None`: the controller's, read from its object.
    pub config: Option<VoterConfig>,
    /// The timers every speaker shares.
    pub timers: Timers,
    /// A random number of this process.
    pub boot: u64,
}

/// What one check found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Checked {
    /// The shared gate's decision (settling, quorum, damping, claim, tenure).
    pub decision: Decision,
    /// The candidates for owner choice, by name (this node only when it claims).
    pub candidates: BTreeSet<String>,
    /// Nodes in the presence set.
    pub roster: usize,
    /// Voters whose latest report is fresh.
    pub voters_heard: usize,
    /// The other speakers the fresh reports list (what the heartbeats count as peers alive).
    pub peers_alive: usize,
}

/// The member (and, on a voter node, the seat) between beats, reports and checks.
struct State {
    settings: Settings,
    /// Created at the first check that finds this node among the Nodes.
    member: Option<Member>,
    seat: Option<Seat>,
    /// A presence set seen and not yet fully taken on (the keep rule holds a node that goes).
    wanted: Option<Arc<Roster>>,
    /// Where each voter is: its Node's first address.
    addresses: BTreeMap<String, IpAddr>,
    /// The usable interfaces, as the beats say them.
    interfaces: Vec<String>,
    /// When a speaker on today's heartbeats (`--membership=legacy`) was last heard.
    legacy_heard: Option<Instant>,
    /// The newest voter configuration read (the flag's, or the controller's).
    latest: Option<VoterConfig>,
    /// Seats started by this process, so that each has a boot of its own.
    seats_started: u64,
    /// The speaker is shutting down ([`Link::leave`]): no seat starts again.
    left: bool,
}

/// The voters membership of one speaker.
pub struct Link {
    state: Mutex<State>,
    port: u16,
    changed: Arc<Notify>,
    /// Woken when a newer voter configuration is read, so the duty loop reads it at once.
    duty: Notify,
    metrics: Metrics,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere must not stop the beats; the state stays consistent per call.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Why a datagram was refused, as the `reason` label of `heartbeats_refused`.
fn refused_reason(e: &wire::WireError) -> &'static str {
    match e {
        wire::WireError::BadTag => "authentication",
        wire::WireError::TooLarge { .. } => "too_large",
        _ => "malformed",
    }
}

impl Link {
    /// The membership of `settings.node`; `changed` is notified when a check may decide
    /// otherwise (a report that changed what a check reads).
    pub fn new(settings: Settings, port: u16, changed: Arc<Notify>, metrics: Metrics) -> Self {
        Link {
            state: Mutex::new(State {
                latest: settings.config.clone(),
                seats_started: 0,
                left: false,
                settings,
                member: None,
                seat: None,
                wanted: None,
                addresses: BTreeMap::new(),
                interfaces: Vec::new(),
                legacy_heard: None,
            }),
            port,
            changed,
            duty: Notify::new(),
            metrics,
        }
    }

    fn refused(&self, reason: &'static str) {
        self.metrics
            .heartbeats_refused
            .get_or_create(&vec![("reason", reason.to_string())])
            .inc();
    }

    /// One check at `now` over the cluster's Nodes `nodes` (name → addresses), with the
    /// node's usable interfaces: takes on the presence set as far as the keep rule lets it,
    /// and runs the member's rules.
    pub fn check(
        &self,
        nodes: &BTreeMap<String, Vec<IpAddr>>,
        usable: &BTreeSet<String>,
        now: Instant,
    ) -> Checked {
        let mut state = lock(&self.state);
        let state = &mut *state;
        state.interfaces = usable.iter().cloned().collect();
        state.addresses = state
            .latest
            .iter()
            .flat_map(VoterConfig::voters)
            .filter_map(|v| Some((v.to_string(), *nodes.get(v)?.first()?)))
            .collect();
        // The set (a digest over every name) is built again only when the Node names differ
        // from the set being read or taken on: the check runs every heartbeat interval.
        let current = state
            .wanted
            .as_ref()
            .or(state.member.as_ref().map(|m| m.roster()));
        if current.is_none_or(|r| !r.names().eq(nodes.keys().map(String::as_str))) {
            match Roster::new(nodes.keys().map(String::as_str)) {
                Ok(r) => state.wanted = Some(Arc::new(r)),
                Err(e) => {
                    tracing::warn!(error = %e, "the Nodes cannot make a presence set: keeping the last one");
                }
            }
        }
        state.follow_roster(now);
        let Some(member) = state.member.as_mut() else {
            return Checked::default();
        };
        // Speakers on the two memberships do not see each other: while a legacy speaker is
        // heard (a roll from one to the other), it may act on its own majority, so this one
        // does not. Its checks stop, so its beats stop saying ready within the mandate and its
        // answering ends with the mandate it holds (decision 0023, *In the speaker*: switch
        // every speaker at once).
        let timeout = member.timers().timeout;
        if state
            .legacy_heard
            .is_some_and(|at| now.saturating_duration_since(at) < timeout)
        {
            return Checked::default();
        }
        let check = member.check(now, !usable.is_empty());
        if let Some(seat) = state.seat.as_mut() {
            // The flag's configuration: nothing can have replaced it. The controller's is
            // confirmed by the duty loop's reads only.
            if state.settings.config.is_some() {
                seat.confirm(now);
            }
            if let Some(g) = seat.pending()
                && member.ready_for(g, now)
            {
                seat.ready();
            }
        }
        let roster = member.roster();
        let me = state.settings.node.as_str();
        let candidates: BTreeSet<String> = roster
            .names()
            .enumerate()
            .filter(|(i, _)| heard(&check.candidates, *i))
            .map(|(_, n)| n.to_string())
            .collect();
        let voters_heard = member
            .held()
            .filter(|(_, _, at)| now.saturating_duration_since(*at) < timeout)
            .count();
        Checked {
            decision: check.decision,
            peers_alive: candidates.iter().filter(|n| n.as_str() != me).count(),
            candidates,
            roster: roster.len(),
            voters_heard,
        }
    }

    /// A speaker on today's heartbeats was heard at `now`: while one is, this node does not act
    /// ([`Link::check`]).
    /// Takes in a voter configuration read from the controller's object (its watch, or a duty
    /// read): the member adopts it if it is newer. The seat follows only duty reads.
    pub fn adopt(&self, config: VoterConfig) {
        let mut state = lock(&self.state);
        if state
            .latest
            .as_ref()
            .is_some_and(|l| l.generation >= config.generation)
        {
            return;
        }
        if let Some(member) = state.member.as_mut()
            && member.adopt(config.clone())
        {
            self.changed.notify_one();
        }
        state.latest = Some(config);
        // Every voter reads it afresh now rather than at its next tick: a voter that stays
        // moves 1.5 failure timeouts after its read, and voters moving further apart than a
        // failure timeout leave the members without a quorum in either generation for the
        // difference (found in the lab: duty ticks a second apart cost a node its quorum at
        // every change).
        self.duty.notify_one();
    }

    /// Waits until a newer voter configuration is read ([`Link::adopt`]).
    pub async fn newer_config(&self) {
        self.duty.notified().await;
    }

    /// What a duty read of `config` means for this node's seat at `now`, its duty record
    /// holding `last` and `fence` (`ferrolb_layer2::voters::duty::plan`).
    pub fn duty_plan(
        &self,
        config: &VoterConfig,
        last: Option<Mark>,
        fence: u64,
        now: Instant,
    ) -> Planned {
        let state = lock(&self.state);
        duty::plan(
            &state.settings.node,
            config,
            last,
            fence,
            state.seat_state(now),
        )
    }

    /// The duty record now says what [`Link::duty_plan`] planned for the read of `config`
    /// sent at `started`: the member adopts it, the seat does `action`, and the seat's
    /// configuration counts as confirmed at `started` when `confirm`.
    pub fn duty_apply(
        &self,
        config: VoterConfig,
        action: SeatAction,
        confirm: bool,
        started: Instant,
    ) {
        self.adopt(config);
        let now = Instant::now();
        let mut state = lock(&self.state);
        let state = &mut *state;
        match action {
            SeatAction::Keep => {}
            SeatAction::Start(generation) => {
                // A seat starts confirmed when it is made: only on a read answered quickly,
                // so that confirmation is not much later than the read (the controller's
                // margin covers it).
                let Some(member) = state.member.as_ref() else {
                    return;
                };
                if state.left || now.saturating_duration_since(started) > START_WITHIN {
                    return;
                }
                state.seats_started += 1;
                let boot = state.settings.boot ^ 0x766f_7465 ^ state.seats_started.rotate_left(32);
                state.seat = Some(Seat::new(
                    member.roster().clone(),
                    member.me(),
                    boot,
                    generation,
                    state.settings.timers,
                    now,
                ));
            }
            SeatAction::MoveTo(generation) => {
                if let Some(seat) = state.seat.as_mut() {
                    seat.move_to(generation, now);
                }
            }
            SeatAction::Retire => {
                if let Some(seat) = state.seat.as_mut() {
                    seat.retire(now);
                }
            }
            SeatAction::Drop => state.seat = None,
        }
        if confirm && let Some(seat) = state.seat.as_mut() {
            seat.confirm(started);
        }
    }

    /// Whether this node has voter duty at `now`: a voter of the newest configuration read,
    /// or holding a seat that has not retired.
    pub fn on_duty(&self, now: Instant) -> bool {
        let state = lock(&self.state);
        if state.left {
            return false;
        }
        let seat = state.seat_state(now);
        state
            .latest
            .as_ref()
            .is_some_and(|c| duty::on_duty(&state.settings.node, c, seat))
            || seat.is_some_and(|s| !s.retired)
    }

    pub fn heard_legacy(&self, now: Instant) {
        lock(&self.state).legacy_heard = Some(now);
    }

    /// When a check must run without any report or beat (a wait ending, a report going stale).
    pub fn next_wake(&self, now: Instant) -> Option<Instant> {
        lock(&self.state)
            .member
            .as_ref()
            .and_then(|m| m.next_wake(now))
    }

    /// The process stops (`replaced`: a successor follows on this node): it stops claiming at
    /// once, its voter falls silent, and its next beats say leaving.
    pub fn leave(&self, replaced: bool) {
        let mut state = lock(&self.state);
        if let Some(m) = state.member.as_mut() {
            m.leave(replaced);
        }
        state.seat = None;
        // The duty loop runs on until the process ends: it must not start a seat again.
        state.left = true;
    }

    /// Sends this node's beat to every voter (its own voter takes it directly), and ages the
    /// voter's table.
    pub async fn beat(&self, socket: &UdpSocket, keys: &KeyRing, unix_ms: u64) {
        let now = Instant::now();
        let (bytes, targets) = {
            let mut state = lock(&self.state);
            let state = &mut *state;
            if let Some(seat) = state.seat.as_mut() {
                seat.sweep(now);
            }
            let Some(member) = state.member.as_mut() else {
                return;
            };
            let beat = member.beat(now, unix_ms, &state.interfaces);
            if let Some(seat) = state.seat.as_mut()
                && let Ok(Some(report)) = seat.receive(&beat, now, unix_ms)
                && let Ok(true) = member.receive_local(report, now)
            {
                self.changed.notify_one();
            }
            let me = state.settings.node.as_str();
            let targets: Vec<IpAddr> = member
                .voters()
                .iter()
                .filter(|v| v.as_str() != me)
                .filter_map(|v| state.addresses.get(v).copied())
                .collect();
            match Message::Beat(beat).encode(keys) {
                Ok(b) => (b, targets),
                Err(e) => {
                    tracing::error!(error = %e, "cannot encode a beat");
                    return;
                }
            }
        };
        for ip in targets {
            self.send(socket, &bytes, SocketAddr::new(ip, self.port))
                .await;
        }
    }

    async fn send(&self, socket: &UdpSocket, bytes: &[u8], to: SocketAddr) {
        let target = match to {
            SocketAddr::V4(v4) if socket.local_addr().is_ok_and(|a| a.is_ipv6()) => {
                SocketAddr::new(IpAddr::V6(v4.ip().to_ipv6_mapped()), v4.port())
            }
            other => other,
        };
        if let Err(e) = socket.send_to(bytes, target).await {
            tracing::debug!(%to, error = %e, "beat or report not sent");
        }
    }

    /// Takes in a v4 datagram from `from`: a beat (this node's voter answers it at once) or a
    /// voter's report (the member takes it in).
    pub async fn receive(
        &self,
        socket: &UdpSocket,
        keys: &KeyRing,
        datagram: &[u8],
        from: SocketAddr,
        unix_ms: u64,
    ) {
        let now = Instant::now();
        let message = match Message::decode(datagram, keys) {
            Ok((m, key)) => {
                if key > 0 {
                    self.metrics.heartbeats_other_key.inc();
                }
                m
            }
            Err(e) => return self.refused(refused_reason(&e)),
        };
        let reply = {
            let mut state = lock(&self.state);
            match message {
                Message::Beat(beat) => {
                    let Some(seat) = state.seat.as_mut() else {
                        // Not a voter (any more): a node that has not read the change yet.
                        return self.refused("not_a_voter");
                    };
                    match seat.receive(&beat, now, unix_ms) {
                        Ok(Some(report)) => report.split(),
                        Ok(None) => return,
                        Err(VoterError::UnknownNode(_)) => {
                            return self.refused("unknown_node");
                        }
                        Err(VoterError::Replay { source, .. }) => {
                            return self.refused(gossip::refused_reason(&source));
                        }
                    }
                }
                Message::Report(report) => {
                    let Some(member) = state.member.as_mut() else {
                        return;
                    };
                    match member.receive(report, now, unix_ms) {
                        Ok(true) => self.changed.notify_one(),
                        Ok(false) => {}
                        Err(e) => {
                            self.refused(match &e {
                                MemberError::Replay(source) => gossip::refused_reason(source),
                                MemberError::MissingBitmap(_) => "missing_bitmap",
                                MemberError::NotOurs | MemberError::OtherGeneration(_) => {
                                    "not_ours"
                                }
                            });
                        }
                    }
                    return;
                }
                // A report's bitmap in parts: only past wire::INLINE_MAX_NODES Nodes, which
                // this speaker does not take yet (docs/architecture.md, layer 2 at scale).
                Message::Part(_) => return self.refused("too_large"),
            }
        };
        let (report, parts) = match reply {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "cannot split a report");
                return;
            }
        };
        let messages =
            std::iter::once(Message::Report(report)).chain(parts.into_iter().map(Message::Part));
        for m in messages {
            match m.encode(keys) {
                Ok(bytes) => self.send(socket, &bytes, from).await,
                Err(e) => tracing::error!(error = %e, "cannot encode a report"),
            }
        }
    }
}

/// How soon after its read a seat must be started, so that its confirmation at start is not
/// later than the read by more than this.
const START_WITHIN: Duration = Duration::from_millis(500);

impl State {
    fn seat_state(&self, now: Instant) -> Option<SeatState> {
        self.seat.as_ref().map(|s| SeatState {
            serves: s.serving().generation(),
            retired: s.retired(now),
        })
    }

    /// Moves the member and the seat toward the presence set last seen, creating them once
    /// this node is in it.
    fn follow_roster(&mut self, now: Instant) {
        let Some(wanted) = self.wanted.clone() else {
            return;
        };
        let Some(member) = self.member.as_mut() else {
            let Some(me) = wanted.index(&self.settings.node) else {
                // Our Node is not seen yet: nothing to beat as.
                return;
            };
            let Some(config) = self.latest.clone() else {
                // No voter configuration read yet: nothing to beat to.
                return;
            };
            let s = &self.settings;
            self.member = Some(Member::new(
                wanted.clone(),
                me,
                s.boot,
                config.clone(),
                s.timers,
            ));
            // With the flag the seat starts with the member; with the controller's
            // configuration only through the duty loop.
            if s.config.as_ref().is_some_and(|c| c.has(&s.node)) {
                // Another boot than the member's: reports of the two never mix up.
                let boot = s.boot ^ 0x766f_7465;
                self.seat = Some(Seat::new(
                    wanted,
                    me,
                    boot,
                    config.generation,
                    s.timers,
                    now,
                ));
            }
            self.wanted = None;
            return;
        };
        if ferrolb_layer2::voters::follow_roster(member, self.seat.as_mut(), &wanted, now) {
            self.wanted = None;
        }
    }
}

/// The voter configuration from `--voters`: generation 1.
pub fn config_from_flag(voters: &[String]) -> anyhow::Result<VoterConfig> {
    anyhow::ensure!(
        !voters.is_empty(),
        "--membership=voters needs --voters: the names of 1 to {} nodes (5 spread over failure domains is the usual choice)",
        ferrolb_layer2::voters::MAX_VOTERS
    );
    VoterConfig::new(1, voters.iter().cloned(), Vec::<String>::new())
        .map_err(|e| anyhow::anyhow!("--voters: {e}"))
}

/// The shared timers from the speaker's flags.
pub fn timers(
    interval: Duration,
    timeout: Duration,
    restart_hold: Duration,
    flap_damping: bool,
) -> Timers {
    Timers {
        interval,
        timeout,
        restart_hold,
        flap_damping,
        ..Timers::default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    const NAMES: [&str; 3] = ["node-a", "node-b", "node-c"];

    /// One speaker's voters membership on a loopback address, with its receive task.
    struct Node {
        link: Arc<Link>,
        socket: Arc<UdpSocket>,
        receiving: tokio::task::JoinHandle<()>,
    }

    fn keys() -> KeyRing {
        KeyRing::new([b"a key of at least sixteen bytes".to_vec()]).unwrap()
    }

    fn timers() -> Timers {
        timers_for(Duration::from_millis(20))
    }

    fn timers_for(interval: Duration) -> Timers {
        super::timers(interval, interval * 5, Duration::ZERO, false)
    }

    /// Three speakers on 127.0.0.1-3 sharing one port, every one a voter.
    async fn cluster() -> (Vec<Node>, BTreeMap<String, Vec<IpAddr>>) {
        let ip = |i: u8| IpAddr::from([127, 0, 0, i + 1]);
        let first = UdpSocket::bind(SocketAddr::new(ip(0), 0)).await.unwrap();
        let port = first.local_addr().unwrap().port();
        let mut sockets = vec![first];
        for i in 1..3u8 {
            sockets.push(UdpSocket::bind(SocketAddr::new(ip(i), port)).await.unwrap());
        }
        let config = config_from_flag(&NAMES.map(String::from)).unwrap();
        let nodes = (0..3u8)
            .map(|i| (NAMES[usize::from(i)].to_string(), vec![ip(i)]))
            .collect();
        let nodes_list = sockets
            .into_iter()
            .enumerate()
            .map(|(i, socket)| {
                let settings = Settings {
                    node: NAMES[i].to_string(),
                    config: Some(config.clone()),
                    timers: timers(),
                    boot: 1000 + i as u64,
                };
                let (metrics, _) = Metrics::new();
                let link = Arc::new(Link::new(settings, port, Arc::new(Notify::new()), metrics));
                let socket = Arc::new(socket);
                let receiving = tokio::spawn({
                    let (link, socket) = (link.clone(), socket.clone());
                    async move {
                        let mut buf = vec![0u8; 2048];
                        let keys = keys();
                        while let Ok((len, from)) = socket.recv_from(&mut buf).await {
                            link.receive(&socket, &keys, &buf[..len], from, unix_ms())
                                .await;
                        }
                    }
                });
                Node {
                    link,
                    socket,
                    receiving,
                }
            })
            .collect();
        (nodes_list, nodes)
    }

    fn unix_ms() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    }

    /// Beats and checks every live node for `rounds` heartbeat intervals; returns the last
    /// checks.
    async fn run(
        nodes: &[Node],
        live: &[bool],
        addresses: &BTreeMap<String, Vec<IpAddr>>,
        rounds: usize,
    ) -> Vec<Checked> {
        let usable: BTreeSet<String> = ["eth0".to_string()].into();
        let keys = keys();
        let mut last = vec![Checked::default(); nodes.len()];
        for _ in 0..rounds {
            for (i, n) in nodes.iter().enumerate().filter(|(i, _)| live[*i]) {
                n.link.beat(&n.socket, &keys, unix_ms()).await;
                last[i] = n.link.check(addresses, &usable, Instant::now());
            }
            tokio::time::sleep(timers().interval).await;
        }
        last
    }

    /// Over real UDP sockets: three speakers, every one a voter, come to claim together; a
    /// silenced one is dropped by the other two and stops acting itself; one that hears a
    /// speaker on the heartbeats of `--membership=legacy` holds back.
    #[tokio::test]
    async fn three_speakers_agree_drop_a_silent_one_and_hold_back_beside_legacy() {
        let (nodes, addresses) = cluster().await;
        let all: BTreeSet<String> = NAMES.iter().map(|s| s.to_string()).collect();
        // Settling (a failure timeout), the claim delay and the told rule: well within 3 s.
        let mut checks = Vec::new();
        for _ in 0..30 {
            checks = run(&nodes, &[true; 3], &addresses, 5).await;
            if checks
                .iter()
                .all(|c| c.decision.claims && c.candidates == all)
            {
                break;
            }
        }
        for (n, c) in NAMES.iter().zip(&checks) {
            assert!(c.decision.claims, "{n} does not claim: {c:?}");
            assert_eq!(c.candidates, all, "{n}'s candidates");
            assert_eq!((c.roster, c.voters_heard, c.peers_alive), (3, 3, 2), "{n}");
        }

        // node-c falls silent (no beats, no reports): the others drop it within the failure
        // timeout, and node-c, hearing no voter but its own, stops acting.
        nodes[2].receiving.abort();
        let checks = run(&nodes, &[true, true, false], &addresses, 15).await;
        let two: BTreeSet<String> = NAMES[..2].iter().map(|s| s.to_string()).collect();
        assert_eq!(checks[0].candidates, two);
        assert_eq!(checks[1].candidates, two);
        let usable: BTreeSet<String> = ["eth0".to_string()].into();
        let c = nodes[2].link.check(&addresses, &usable, Instant::now());
        assert!(
            !c.decision.acts && !c.decision.claims,
            "node-c still acts: {c:?}"
        );

        // A legacy speaker heard: node-a holds back at once.
        nodes[0].link.heard_legacy(Instant::now());
        let c = nodes[0].link.check(&addresses, &usable, Instant::now());
        assert_eq!(c, Checked::default());
    }

    /// With the controller's configuration: no member until one is read; the seat starts only
    /// through a duty read, is confirmed as of the read, and never starts again once the
    /// speaker is leaving.
    #[test]
    fn with_the_controllers_configuration_the_seat_follows_duty_reads_only() {
        let settings = Settings {
            node: "node-a".to_string(),
            config: None,
            timers: timers(),
            boot: 7,
        };
        let (metrics, _) = Metrics::new();
        let link = Link::new(settings, 7946, Arc::new(Notify::new()), metrics);
        let nodes: BTreeMap<String, Vec<IpAddr>> = NAMES
            .iter()
            .map(|n| (n.to_string(), vec![IpAddr::from([127, 0, 0, 1])]))
            .collect();
        let usable = BTreeSet::from(["eth0".to_string()]);
        let now = Instant::now();
        assert_eq!(link.check(&nodes, &usable, now), Checked::default());
        assert!(!link.on_duty(now), "no configuration read yet");
        let config = VoterConfig::new(3, ["node-a", "node-b"], Vec::<&str>::new()).unwrap();
        link.adopt(config.clone());
        link.check(&nodes, &usable, now);
        assert!(
            lock(&link.state).member.is_some(),
            "the member starts on the read"
        );
        assert!(
            lock(&link.state).seat.is_none(),
            "the seat waits for a duty read"
        );
        assert!(link.on_duty(now));
        let Planned::Write {
            mark,
            action,
            confirm,
        } = link.duty_plan(&config, None, 0, now)
        else {
            panic!("a fresh read is never stale");
        };
        assert_eq!(mark.serves, Some(3));
        assert_eq!(action, SeatAction::Start(3));
        link.duty_apply(config.clone(), action, confirm, Instant::now());
        assert_eq!(
            lock(&link.state)
                .seat
                .as_ref()
                .map(|s| s.serving().generation()),
            Some(3)
        );
        // A check does not confirm the controller's configuration: only duty reads do.
        let later = Instant::now() + Timers::default().confirm_within;
        link.check(&nodes, &usable, later);
        assert!(
            lock(&link.state)
                .seat
                .as_ref()
                .is_some_and(|s| s.serving().fenced(later)),
            "unconfirmed past the window"
        );
        // Leaving: the seat ends and no duty read starts it again.
        link.leave(true);
        assert!(!link.on_duty(Instant::now()));
        link.duty_apply(config, SeatAction::Start(3), true, Instant::now());
        assert!(lock(&link.state).seat.is_none());
    }
}
