//! The layer 2 simulator (issue #34): many speakers in one process, running the real rules of
//! this crate over a simulated network, with faults, and the one-owner invariants checked at
//! every event.
//!
//! **Event-driven, time passed in.** Nothing here reads a clock, opens a socket or starts a
//! thread: simulated time is a count of microseconds ([`Micros`]) from the start of a run, which
//! the rules see as `base + t` for an [`Instant`] the caller passes in. A priority queue holds
//! what happens next: heartbeat datagrams in flight (by delivery time), each speaker's next timer,
//! the end of an owner's mandate to answer, and the faults' starts and heals. A run is a function
//! of its [`Cluster`] (seed included) and its faults, so any failure replays exactly.
//!
//! **Designs.** How a speaker behaves is a [`Design`]: today's membership (every speaker
//! heartbeats every other, [`Legacy`]) is one; the voters of issue #34 ([`VotersDesign`]) are
//! another.
//! The engine owns the network, the faults, the speakers' lifecycles (start, freeze, leave,
//! restart) and the invariants; a design owns what a speaker does with its timers and datagrams,
//! and says which IPs it answers for and until when.
//!
//! **Invariants**, checked exactly at every event (not sampled: answering only ever starts at an
//! event, and the end of a mandate is an event of its own):
//! 1. at most one node answers for any IP at any instant ([`Violation::TwoAnswer`]);
//! 2. after a fault heals, every IP is answered again within the failure timeout plus two
//!    heartbeat intervals ([`Violation::NotAnsweredAfterHeal`]; the bound is
//!    [`Cluster::heal_bound`]; after a restart, counted from the end of the design's start-up,
//!    [`Design::startup`]);
//! 3. no IP moves without a fault: once every IP is answered, owners do not change before the
//!    first fault ([`Violation::MovedWithoutFault`]).
//!
//! **Faults** ([`FaultKind`]): nodes cut off both ways (one node, a rack), splits into groups
//! (50/50, three ways), one-way loss of a fraction of datagrams (per Ethernet frame: a fragmented
//! heartbeat is lost when any of its fragments is), added one-way delay, a frozen process (stops,
//! then resumes with stale state and the datagrams queued meanwhile), a restart (state lost;
//! crashed, or leaving gracefully with or without asking for the restart hold) and a rolling
//! restart of every node ([`rolling_restart`]).

mod legacy;
mod rng;
mod voters;

use std::cmp::Ordering;
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::rc::Rc;
use std::time::{Duration, Instant};

pub use legacy::{Legacy, LegacyNode};
pub use rng::Rng;
pub use voters::{VoterMessage, VotersDesign, VotersNode};

/// Simulated time: microseconds since the start of a run.
pub type Micros = u64;

/// One simulated millisecond.
pub const MS: Micros = 1_000;

/// One simulated second.
pub const SECOND: Micros = 1_000_000;

/// Most bytes of a UDP datagram over IPv4 (65,535 less the IP and UDP headers): a longer
/// heartbeat cannot be sent at all (`send_to` fails).
pub const MAX_DATAGRAM: usize = 65_507;

/// Most bytes of UDP payload in one 1,500-byte Ethernet frame; a longer datagram is fragmented.
pub const FRAME_PAYLOAD: usize = 1_472;

/// Ethernet frames (IP fragments) a UDP datagram of `bytes` of payload takes at MTU 1,500: each
/// fragment carries 1,480 bytes of the UDP datagram (its 8-byte header included).
pub fn frames(bytes: usize) -> usize {
    (bytes + 8).div_ceil(1_480).max(1)
}

fn micros(d: Duration) -> Micros {
    Micros::try_from(d.as_micros()).unwrap_or(Micros::MAX)
}

/// The speakers' timers, as their flags set them (the speaker's defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// Between two heartbeats (`--heartbeat-interval`).
    pub interval: Duration,
    /// A peer silent this long is gone (`--failure-timeout`).
    pub timeout: Duration,
    /// How long a peer that leaves to be replaced keeps its IPs (`--restart-hold`).
    pub restart_hold: Duration,
    /// Flap damping (`--flap-damping`).
    pub flap_damping: bool,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            interval: Duration::from_millis(100),
            timeout: Duration::from_millis(500),
            restart_hold: Duration::from_secs(10),
            flap_damping: true,
        }
    }
}

impl Timing {
    /// How long answering stays allowed after a check: the failure timeout minus two
    /// intervals, at least one interval (the speaker's `gate::mandate_for`).
    pub fn mandate(&self) -> Duration {
        self.timeout
            .saturating_sub(self.interval * 2)
            .max(self.interval)
    }

    /// Invariant 2's bound: the failure timeout plus two heartbeat intervals.
    pub fn heal_bound(&self) -> Micros {
        micros(self.timeout + self.interval * 2)
    }
}

/// A rule deliberately broken, to show that the invariants catch it (tests only in spirit: a
/// design applies it where the rule sits).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mutation {
    /// The real rules.
    #[default]
    None,
    /// Answer for the whole mandate after each check, whatever the others acknowledged, and
    /// claim without waiting for them to hear this node ready (no tenure, no `seen_ready`).
    NoTenure,
    /// Act without a quorum (as if every node heard, and were heard by, a majority).
    IgnoreQuorum,
    /// Both of the above: the rules before decision 0015.
    IgnoreQuorumAndTenure,
    /// Voters only: a voter's reports say its acknowledgements are mature from the first beat
    /// it hears of a node, not after 1.5 failure timeouts without a silence.
    ImmatureAcks,
    /// Voters only: a member claims without being told by a majority of the voters that every
    /// member holds a report listing it ready.
    NoTold,
    /// Voters only: a change of the voters goes straight to the new set, without the joint
    /// phase in which members need a majority of both sets.
    SkipJoint,
    /// Voters only: a member drops a node that leaves the presence set at once, while a report
    /// may still list it.
    DropAtOnce,
}

impl Mutation {
    /// Whether the tenure (and `seen_ready`) is ignored.
    pub fn no_tenure(self) -> bool {
        matches!(self, Mutation::NoTenure | Mutation::IgnoreQuorumAndTenure)
    }

    /// Whether the quorum rule is ignored.
    pub fn ignore_quorum(self) -> bool {
        matches!(
            self,
            Mutation::IgnoreQuorum | Mutation::IgnoreQuorumAndTenure
        )
    }
}

/// A simulated cluster.
#[derive(Clone, Debug)]
pub struct Cluster {
    /// Speakers (one per node).
    pub nodes: usize,
    /// Racks, the nodes spread over them in order (node `i` in rack `i * racks / nodes`).
    pub racks: usize,
    /// Service IPs.
    pub ips: usize,
    /// Seed of everything random in the run.
    pub seed: u64,
    /// One-way latency of a datagram, uniformly between these.
    pub latency: (Micros, Micros),
    /// The speakers' timers.
    pub timing: Timing,
    /// A rule deliberately broken ([`Mutation::None`]: none).
    pub mutation: Mutation,
    /// Traffic is counted from this instant on (after start-up, say).
    pub measure_from: Micros,
    /// Invariant 2's bound: every IP answered again this long after a fault heals (the
    /// issue's: the failure timeout plus two heartbeat intervals, [`Timing::heal_bound`]).
    pub heal_bound: Micros,
}

impl Cluster {
    /// `nodes` speakers in 3 racks (one when fewer than 3 nodes), 4 IPs per node (at least 16),
    /// 100-500 µs of latency, the speaker's default timers.
    pub fn new(nodes: usize, seed: u64) -> Self {
        Cluster {
            nodes,
            racks: nodes.clamp(1, 3),
            ips: (nodes * 4).max(16),
            seed,
            latency: (100, 500),
            timing: Timing::default(),
            mutation: Mutation::None,
            measure_from: 0,
            heal_bound: Timing::default().heal_bound(),
        }
    }
}

/// What every speaker of a run shares: the names, racks, IPs and timers.
#[derive(Debug)]
pub struct Env {
    /// Node names, 30 characters each (the size estimates assume 30), in name order.
    pub names: Vec<String>,
    /// Index of each name.
    pub index: HashMap<String, usize>,
    /// The known speakers (every node's presence Lease).
    pub known: BTreeSet<String>,
    /// The rack of each node.
    pub racks: Vec<usize>,
    /// The Service IPs, as the owner choice keys them.
    pub ips: Vec<String>,
    /// `scores[ip][node]`: [`crate::owner::score`], computed once.
    scores: Vec<Vec<u64>>,
    /// `ranked[ip]`: the [`RANKED`] nodes that win IP `ip` first, best first: the owner among
    /// almost any set of members is one of them, found without scanning every node.
    ranked: Vec<Vec<u32>>,
    /// The timers.
    pub timing: Timing,
    /// The rule deliberately broken, if any.
    pub mutation: Mutation,
    /// Invariant 2's bound ([`Cluster::heal_bound`]).
    pub heal_bound: Micros,
    base: Instant,
}

/// How often a node reads the voter configuration again (a watch's resync, its presence Lease
/// renewal): what confirms a voter's configuration while the API server answers.
pub const RESYNC: Micros = SECOND;

/// Nodes ranked per IP in [`Env`] (the owner among members is almost always one of them).
const RANKED: usize = 8;

/// Unix time, in milliseconds, of the start of every run: the heartbeats' timestamps.
const EPOCH_MS: u64 = 1_800_000_000_000;

impl Env {
    fn new(cluster: &Cluster, base: Instant) -> Self {
        let racks: Vec<usize> = (0..cluster.nodes)
            .map(|i| i * cluster.racks.max(1) / cluster.nodes.max(1))
            .collect();
        let names: Vec<String> = (0..cluster.nodes)
            .map(|i| format!("r{:03}-worker-{i:05}.k8s.internal", racks[i]))
            .collect();
        let ips: Vec<String> = (0..cluster.ips)
            .map(|k| format!("198.18.{}.{}", k / 250, 1 + k % 250))
            .collect();
        let scores: Vec<Vec<u64>> = ips
            .iter()
            .map(|ip| names.iter().map(|n| crate::owner::score(n, ip)).collect())
            .collect();
        let ranked = scores
            .iter()
            .map(|row| {
                let mut order: Vec<u32> = (0..names.len() as u32).collect();
                // Higher score first, ties to the higher name, as `owner::choose` breaks them.
                let key = |&i: &u32| std::cmp::Reverse((row[i as usize], i));
                if order.len() > RANKED {
                    order.select_nth_unstable_by_key(RANKED, key);
                    order.truncate(RANKED);
                }
                order.sort_unstable_by_key(key);
                order
            })
            .collect();
        Env {
            index: names
                .iter()
                .cloned()
                .enumerate()
                .map(|(i, n)| (n, i))
                .collect(),
            known: names.iter().cloned().collect(),
            names,
            racks,
            ips,
            scores,
            ranked,
            timing: cluster.timing,
            mutation: cluster.mutation,
            heal_bound: cluster.heal_bound,
            base,
        }
    }

    /// The instant the rules see for simulated time `t`.
    pub fn instant(&self, t: Micros) -> Instant {
        self.base + Duration::from_micros(t)
    }

    /// Simulated time of `at` (0 before the start).
    pub fn micros(&self, at: Instant) -> Micros {
        micros(at.saturating_duration_since(self.base))
    }

    /// Every node's wall clock at `t`, in Unix milliseconds (clocks agree in these runs).
    pub fn unix_ms(&self, t: Micros) -> u64 {
        EPOCH_MS + t / MS
    }

    /// The owner of IP `ip` among `members` (indices of nodes): exactly
    /// [`crate::owner::choose`] over their names, from the scores computed once.
    pub fn owner(&self, ip: usize, members: impl IntoIterator<Item = usize>) -> Option<usize> {
        let scores = &self.scores[ip];
        members.into_iter().max_by(|&a, &b| {
            scores[a]
                .cmp(&scores[b])
                .then_with(|| self.names[a].cmp(&self.names[b]))
        })
    }

    /// [`Env::owner`] among the nodes for which `member` is true: the first of the IP's best
    /// ranked nodes that is a member, else a scan of every node.
    pub fn owner_among(&self, ip: usize, member: impl Fn(usize) -> bool) -> Option<usize> {
        if let Some(&best) = self.ranked[ip].iter().find(|&&i| member(i as usize)) {
            return Some(best as usize);
        }
        self.owner(ip, (0..self.names.len()).filter(|&i| member(i)))
    }

    /// The nodes of rack `rack`.
    pub fn rack(&self, rack: usize) -> Vec<usize> {
        (0..self.names.len())
            .filter(|&i| self.racks[i] == rack)
            .collect()
    }
}

/// Where a datagram goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dest {
    /// Every other node.
    All,
    /// One node.
    One(usize),
}

/// A datagram a speaker sends.
#[derive(Debug)]
pub struct Send<M> {
    /// To whom.
    pub to: Dest,
    /// What (shared by every copy in flight).
    pub msg: Rc<M>,
    /// Its encoded size, in bytes of UDP payload.
    pub bytes: usize,
    /// Sent this long after now (0: now).
    pub after: Micros,
}

/// What a speaker sends in answer to an event.
#[derive(Debug)]
pub struct Outbox<M> {
    sends: Vec<Send<M>>,
}

impl<M> Default for Outbox<M> {
    fn default() -> Self {
        Outbox { sends: Vec::new() }
    }
}

impl<M> Outbox<M> {
    /// Sends `msg`, `bytes` long, to `to`, `after` from now.
    pub fn send(&mut self, to: Dest, msg: M, bytes: usize, after: Micros) {
        self.sends.push(Send {
            to,
            msg: Rc::new(msg),
            bytes,
            after,
        });
    }
}

/// What a speaker answers for: the IPs it owns (indices into [`Env::ips`], ascending), while
/// simulated time is before `until`.
#[derive(Clone, Copy, Debug)]
pub struct Answer<'a> {
    /// The IPs it owns.
    pub ips: &'a [u32],
    /// It answers for them while the time is before this (0: not at all).
    pub until: Micros,
}

/// A membership design: what one speaker does with its timers and the datagrams it receives.
pub trait Design {
    /// One speaker's state (one process: a restart starts a new one).
    type Node;
    /// What speakers send each other.
    type Message;

    /// The design's name, for reports.
    fn name(&self) -> &'static str;

    /// A process starting on node `me` at `now`, `boot` its random per-process identifier.
    fn start(&self, env: &Env, me: usize, boot: u64, now: Micros) -> Self::Node;

    /// Its timers are due at `now` ([`Design::next_wake`]).
    fn wake(&self, env: &Env, node: &mut Self::Node, now: Micros, out: &mut Outbox<Self::Message>);

    /// A datagram arrives at `now`.
    fn receive(
        &self,
        env: &Env,
        node: &mut Self::Node,
        msg: &Self::Message,
        now: Micros,
        out: &mut Outbox<Self::Message>,
    );

    /// The process is stopped gracefully at `now` (`replaced`: a successor follows, as in a
    /// rolling update). It stops answering at once; what it sends on the way out goes in `out`.
    fn leave(
        &self,
        env: &Env,
        node: &mut Self::Node,
        replaced: bool,
        now: Micros,
        out: &mut Outbox<Self::Message>,
    );

    /// When its timers are next due.
    fn next_wake(&self, node: &Self::Node) -> Micros;

    /// What it answers for.
    fn answer<'a>(&self, node: &'a Self::Node) -> Answer<'a>;

    /// Whether the speaker counts itself among the owners (it has joined): the run has
    /// converged once every running speaker does and every IP is answered.
    fn claims(&self, node: &Self::Node) -> bool;

    /// The longest a process takes, from its start in a healthy cluster, to answer for what it
    /// owns: invariant 2 after a restart counts from the end of it.
    fn startup(&self, env: &Env) -> Micros;

    /// The controller publishes a change of the voters to `next` (node indexes)
    /// ([`FaultKind::ChangeVoters`]). Returns the generation every voter must move to before
    /// the change can finish ([`Design::finish_change`]), or `None` when it is complete (or the
    /// design has no voters).
    fn change_voters(&self, _env: &Env, _next: &[usize]) -> Option<u64> {
        None
    }

    /// Whether the process on a node serves no generation older than `generation` at `now`
    /// (the controller's condition for finishing a change).
    fn moved_on(&self, _env: &Env, _node: &Self::Node, _generation: u64, _now: Micros) -> bool {
        true
    }

    /// The presence set of the process on a node is every node but `absent` from `now` on
    /// (designs whose membership does not depend on it ignore this).
    fn set_roster(
        &self,
        _env: &Env,
        _node: &mut Self::Node,
        _absent: &BTreeSet<usize>,
        _now: Micros,
    ) {
    }

    /// How long after every voter moved on the controller waits before it finishes a change.
    fn drain(&self, _env: &Env) -> Micros {
        0
    }

    /// The controller finishes the change whose joint phase is `generation`.
    fn finish_change(&self, _env: &Env, _generation: u64) {}

    /// The process on a node reads the latest voter configuration at `now`.
    fn adopt(
        &self,
        _env: &Env,
        _node: &mut Self::Node,
        _now: Micros,
        _out: &mut Outbox<Self::Message>,
    ) {
    }
}

/// What can go wrong.
#[derive(Clone, Debug, PartialEq)]
pub enum FaultKind {
    /// These nodes are cut off from the others, both ways (one node, a rack).
    Cut(Vec<usize>),
    /// The nodes are split into groups (one group number per node): datagrams cross no group
    /// boundary.
    Split(Vec<u8>),
    /// This fraction of the frames from `from` to `to` (`None`: any node) is lost, one way.
    Loss {
        /// Sender, or any.
        from: Option<usize>,
        /// Receiver, or any.
        to: Option<usize>,
        /// Fraction of frames lost, 0 to 1.
        fraction: f64,
    },
    /// Datagrams from `from` take this much longer, one way.
    Delay {
        /// The sender.
        from: usize,
        /// Added latency.
        extra: Micros,
    },
    /// The process on this node stops (SIGSTOP, a stall): no timer, no datagram handled or sent;
    /// it resumes at the heal with its stale state and the datagrams queued meanwhile.
    Freeze(usize),
    /// The process on `node` stops and a new one (state lost) starts at the heal: crashed
    /// (`graceful: None`), or stopped gracefully (`Some(replaced)`: asking the others to hold
    /// its IPs for it, or not).
    Restart {
        /// The node.
        node: usize,
        /// How it stops.
        graceful: Option<bool>,
    },
    /// These nodes cannot reach the API server: they read no new voter configuration and
    /// cannot confirm the one they have (a voter among them stops reporting after
    /// [`crate::voters::Timers::confirm_within`]); they read it again after the heal.
    ApiCut(Vec<usize>),
    /// The node's process crashes and its Node goes: every other node drops it from its
    /// presence set at a random time between `after` and `after + within` from the start (its
    /// presence Lease expires: never before it stopped); at the heal it comes back, every node
    /// adds it within `within`, and its process starts.
    Leave {
        /// The node.
        node: usize,
        /// How long after the crash the others may drop it, at the earliest.
        after: Micros,
        /// The spread of the others' updates.
        within: Micros,
    },
    /// Not a fault: the controller changes the voters to `next` (node indexes) through the
    /// joint phase ([`crate::voters::VoterConfig`]); every node reads each new configuration at
    /// a random time within `adopt_within` of its publication (as a watch delivers it), the
    /// controller finishes once every voter has moved on and [`Design::drain`] has passed.
    ChangeVoters {
        /// The voters after the change.
        next: Vec<usize>,
        /// Each node reads a configuration this long after its publication, at most.
        adopt_within: Micros,
    },
}

/// A fault from `at` until `heal`.
#[derive(Clone, Debug, PartialEq)]
pub struct Fault {
    /// When it starts.
    pub at: Micros,
    /// When it ends.
    pub heal: Micros,
    /// What it is.
    pub kind: FaultKind,
}

impl FaultKind {
    /// A 50/50 split of `n` nodes (the first half against the second).
    pub fn halves(n: usize) -> Self {
        FaultKind::Split((0..n).map(|i| u8::from(i >= n / 2)).collect())
    }

    /// One fault of every kind the simulator has on a cluster of `n` (the property tests'
    /// generator): `pick` chooses the kind (9 kinds), `node` the node it strikes (modulo `n`),
    /// `p` (0 to 999) its parameter: the fraction lost, 0.2 to 1, or the delay in
    /// milliseconds, or for a graceful stop whether it asks for the restart hold.
    pub fn pick(n: usize, pick: u8, node: usize, p: u64) -> Self {
        let node = node % n.max(1);
        let fraction = 0.2 + 0.8 * p as f64 / 1_000.0;
        match pick % 9 {
            0 => FaultKind::Cut(vec![node]),
            1 => FaultKind::Cut((0..n).filter(|i| i * 3 / n == node % 3).collect()),
            2 => FaultKind::halves(n),
            3 => FaultKind::Loss {
                from: Some(node),
                to: None,
                fraction,
            },
            4 => FaultKind::Loss {
                from: None,
                to: Some(node),
                fraction,
            },
            5 => FaultKind::Delay {
                from: node,
                extra: p * MS,
            },
            6 => FaultKind::Freeze(node),
            7 => FaultKind::Restart {
                node,
                graceful: None,
            },
            _ => FaultKind::Restart {
                node,
                graceful: Some(p.is_multiple_of(2)),
            },
        }
    }

    /// A three-way split of `n` nodes into thirds.
    pub fn thirds(n: usize) -> Self {
        FaultKind::Split(
            (0..n)
                .map(|i| u8::try_from(i * 3 / n.max(1)).unwrap_or(2))
                .collect(),
        )
    }
}

/// A rolling restart of every node of `n`, in order from `from`: each is replaced (leaves asking
/// for the restart hold), is down for `downtime`, and the next one starts `spacing` after it.
pub fn rolling_restart(n: usize, from: Micros, spacing: Micros, downtime: Micros) -> Vec<Fault> {
    (0..n)
        .map(|node| {
            let at = from + spacing * node as Micros;
            Fault {
                at,
                heal: at + downtime,
                kind: FaultKind::Restart {
                    node,
                    graceful: Some(true),
                },
            }
        })
        .collect()
}

/// An invariant broken, with the time and the nodes involved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Invariant 1: two nodes (or more) answered for one IP at once.
    TwoAnswer {
        /// When.
        at: Micros,
        /// The IP (index into [`Env::ips`]).
        ip: usize,
        /// The nodes answering.
        nodes: Vec<usize>,
    },
    /// Invariant 2: an IP not answered at the deadline after a fault healed, unanswered since
    /// before the heal (an outage that began after the heal is a hand-back, counted in
    /// [`Metrics::handbacks`]).
    NotAnsweredAfterHeal {
        /// The deadline.
        at: Micros,
        /// The IP.
        ip: usize,
        /// The fault (index in the order faults were added).
        fault: usize,
        /// When it healed.
        healed_at: Micros,
        /// The node that answered the IP last, if any.
        last_owner: Option<usize>,
    },
    /// Invariant 3: an IP moved from one node to another before any fault.
    MovedWithoutFault {
        /// When.
        at: Micros,
        /// The IP.
        ip: usize,
        /// Who answered it before.
        from: usize,
        /// Who answers it now.
        to: usize,
    },
}

/// Figures of a run.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// Speakers.
    pub nodes: usize,
    /// Simulated time over which traffic was counted.
    pub measured: Micros,
    /// Failover times: from the start of the fault to the IP answered again, one per IP that
    /// went unanswered after the fault started.
    pub failovers: Vec<Micros>,
    /// Outages that began after the fault before them healed (a node taking its IPs back
    /// leaves them unanswered until it claims): their lengths.
    pub handbacks: Vec<Micros>,
    /// Times an IP's answering node changed (after start-up).
    pub moved: u64,
    /// Datagrams each node sent while measured (a broadcast to N − 1 peers counts N − 1).
    pub datagrams: Vec<u64>,
    /// Bytes of UDP payload each node sent while measured.
    pub bytes: Vec<u64>,
    /// The largest datagram a node tried to send.
    pub largest: usize,
    /// Datagrams that could not be sent at all (longer than [`MAX_DATAGRAM`]).
    pub send_failures: u64,
    /// When every IP was first answered at once (start-up over), if it was.
    pub converged_at: Option<Micros>,
    /// IP outages (answered, then not) that began before any fault.
    pub outages_without_fault: u64,
    /// Events handled.
    pub events: u64,
    /// Datagrams delivered.
    pub delivered: u64,
}

impl Metrics {
    /// The `q`-quantile (0 to 1) of the failover times, nearest rank.
    pub fn failover(&self, q: f64) -> Option<Micros> {
        quantile(&self.failovers, q)
    }

    /// The `q`-quantile of the hand-back outages.
    pub fn handback(&self, q: f64) -> Option<Micros> {
        quantile(&self.handbacks, q)
    }

    fn per_node_per_second(&self, counts: &[u64]) -> f64 {
        if self.measured == 0 || counts.is_empty() {
            return 0.0;
        }
        let total: u64 = counts.iter().sum();
        total as f64 / counts.len() as f64 / (self.measured as f64 / SECOND as f64)
    }

    /// Datagrams sent per node per simulated second, on average.
    pub fn datagrams_per_node_second(&self) -> f64 {
        self.per_node_per_second(&self.datagrams)
    }

    /// Bytes sent per node per simulated second, on average.
    pub fn bytes_per_node_second(&self) -> f64 {
        self.per_node_per_second(&self.bytes)
    }
}

/// The `q`-quantile (0 to 1) of `values`, nearest rank.
pub fn quantile(values: &[Micros], q: f64) -> Option<Micros> {
    let mut v = values.to_vec();
    v.sort_unstable();
    if v.is_empty() {
        return None;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v.get(rank - 1).copied()
}

/// A run's outcome.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Invariants broken (at most [`Report::KEPT`] kept; [`Report::violation_count`] counts all).
    pub violations: Vec<Violation>,
    /// How many invariants were broken in all.
    pub violation_count: u64,
    /// The figures.
    pub metrics: Metrics,
}

impl Report {
    /// Most violations kept in a report.
    pub const KEPT: usize = 64;
}

enum Ev<M> {
    Deliver {
        to: usize,
        msg: Rc<M>,
    },
    Transmit {
        from: usize,
        send: Send<M>,
    },
    Wake {
        node: usize,
        generation: u64,
    },
    Expire {
        node: usize,
        generation: u64,
    },
    FaultStart(usize),
    FaultEnd(usize),
    Deadline(usize),
    /// A node reads the latest voter configuration.
    Adopt(usize),
    /// A node reads its configuration again, as it does every [`RESYNC`].
    Resync(usize),
    /// A node sees the presence set change: every node but these (the number orders them: a
    /// watch delivers changes in order).
    Roster(usize, u64, Rc<BTreeSet<usize>>),
    /// The controller checks whether every voter moved on to this generation.
    Advance(u64),
    /// The controller finishes the change whose joint phase is this generation.
    Finish(u64),
}

struct Entry<M> {
    at: Micros,
    /// 0 for the end of a mandate, 1 for anything else: a mandate that ends at `t` no longer
    /// answers at `t`, so it ends before anything else at `t` is checked.
    class: u8,
    seq: u64,
    ev: Ev<M>,
}

impl<M> Entry<M> {
    fn key(&self) -> (Micros, u8, u64) {
        (self.at, self.class, self.seq)
    }
}

impl<M> PartialEq for Entry<M> {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl<M> Eq for Entry<M> {}

impl<M> PartialOrd for Entry<M> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<M> Ord for Entry<M> {
    // Earliest first (BinaryHeap is a max-heap); ties in the order queued.
    fn cmp(&self, other: &Self) -> Ordering {
        other.key().cmp(&self.key())
    }
}

struct Slot<N, M> {
    /// The running process (`None`: down).
    node: Option<N>,
    frozen: bool,
    /// Datagrams that arrived while frozen, handled when it resumes.
    queued: Vec<Rc<M>>,
    wake_at: Micros,
    wake_generation: u64,
    until: Micros,
    expire_generation: u64,
    /// The IPs it answers for now.
    answering: Vec<u32>,
    /// Its speaker claims ([`Design::claims`]).
    claims: bool,
    boots: u64,
    /// A configuration was published while it was frozen: it reads it when it resumes.
    adopt_pending: bool,
    /// Faults in force that cut it from the API server.
    api_cut: u32,
    /// A presence set seen while it was frozen: applied when it resumes.
    roster_pending: Option<Rc<BTreeSet<usize>>>,
    /// The number of the last presence set it saw.
    roster_seen: u64,
}

#[derive(Clone, Debug, Default)]
struct IpState {
    answerers: Vec<u32>,
    last_owner: Option<u32>,
    unanswered_since: Option<Micros>,
}

/// A fault while it is active, as links see it.
enum Active {
    Cut(Vec<bool>),
    Split(Vec<u8>),
    Loss {
        from: Option<usize>,
        to: Option<usize>,
        fraction: f64,
    },
    Delay {
        from: usize,
        extra: Micros,
    },
}

/// The simulator: a cluster of speakers of design `D`, a network, faults and the invariants.
pub struct Engine<D: Design> {
    design: D,
    env: Env,
    rng: Rng,
    now: Micros,
    seq: u64,
    queue: BinaryHeap<Entry<D::Message>>,
    slots: Vec<Slot<D::Node, D::Message>>,
    faults: Vec<Fault>,
    active: Vec<(usize, Active)>,
    ips: Vec<IpState>,
    answered: usize,
    claiming: usize,
    first_fault: Option<Micros>,
    measure_from: Micros,
    latency: (Micros, Micros),
    /// The window of the voter change under way ([`FaultKind::ChangeVoters`]).
    adopt_within: Micros,
    /// The nodes out of the presence set now ([`FaultKind::Leave`]).
    absent: BTreeSet<usize>,
    /// Presence sets published so far.
    roster_number: u64,
    metrics: Metrics,
    violations: Vec<Violation>,
    violation_count: u64,
}

impl<D: Design> Engine<D> {
    /// A cluster of `design` speakers, every one starting at time 0 (at a random point of its
    /// heartbeat interval). `base` is the instant the rules see for time 0.
    pub fn new(design: D, cluster: &Cluster, base: Instant) -> Self {
        let env = Env::new(cluster, base);
        let mut rng = Rng::new(cluster.seed);
        let n = cluster.nodes;
        let mut engine = Engine {
            design,
            rng: Rng::new(rng.next_u64()),
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            slots: Vec::with_capacity(n),
            faults: Vec::new(),
            active: Vec::new(),
            ips: vec![IpState::default(); env.ips.len()],
            answered: 0,
            claiming: 0,
            first_fault: None,
            measure_from: cluster.measure_from,
            latency: cluster.latency,
            adopt_within: 0,
            absent: BTreeSet::new(),
            roster_number: 0,
            metrics: Metrics {
                nodes: n,
                datagrams: vec![0; n],
                bytes: vec![0; n],
                ..Metrics::default()
            },
            violations: Vec::new(),
            violation_count: 0,
            env,
        };
        let interval = micros(cluster.timing.interval);
        for i in 0..n {
            let boot = rng.next_u64();
            // Processes start spread over one interval, so heartbeats do not all go at once.
            let at = rng.below(interval);
            engine.slots.push(Slot {
                node: None,
                frozen: false,
                queued: Vec::new(),
                wake_at: Micros::MAX,
                wake_generation: 0,
                until: 0,
                expire_generation: 0,
                answering: Vec::new(),
                claims: false,
                boots: 0,
                adopt_pending: false,
                api_cut: 0,
                roster_pending: None,
                roster_seen: 0,
            });
            // Spread over the period without drawing from the run's random stream, so runs
            // without a voter change replay as before.
            let resync = (i as Micros * 7_919 * MS) % RESYNC;
            engine.push(resync, Ev::Resync(i));
            let node = engine.design.start(&engine.env, i, boot, at);
            engine.slots[i].node = Some(node);
            engine.schedule_wake(i);
        }
        engine
    }

    /// The shared names, racks, IPs and timers.
    pub fn env(&self) -> &Env {
        &self.env
    }

    /// The design.
    pub fn design(&self) -> &D {
        &self.design
    }

    /// Simulated time now.
    pub fn now(&self) -> Micros {
        self.now
    }

    /// The nodes answering for IP `ip` now.
    pub fn answering(&self, ip: usize) -> &[u32] {
        &self.ips[ip].answerers
    }

    /// The speaker on node `i`, if its process runs.
    pub fn node(&self, i: usize) -> Option<&D::Node> {
        self.slots.get(i).and_then(|s| s.node.as_ref())
    }

    /// Adds a fault (its start must not be in the past). Returns its index, as violations name
    /// it.
    pub fn add_fault(&mut self, fault: Fault) -> usize {
        let k = self.faults.len();
        let at = fault.at.max(self.now);
        let heal = fault.heal.max(at);
        self.faults.push(Fault { at, heal, ..fault });
        self.push(at, Ev::FaultStart(k));
        self.push(heal, Ev::FaultEnd(k));
        k
    }

    /// Runs until simulated time `end` (events at `end` included).
    pub fn run_until(&mut self, end: Micros) {
        while self.queue.peek().is_some_and(|e| e.at <= end) {
            let Some(Entry { at, ev, .. }) = self.queue.pop() else {
                break;
            };
            self.now = self.now.max(at);
            self.metrics.events += 1;
            self.handle(ev);
        }
        self.now = self.now.max(end);
    }

    /// What the run found so far.
    pub fn report(&self) -> Report {
        let mut metrics = self.metrics.clone();
        metrics.measured = self.now.saturating_sub(self.measure_from);
        Report {
            violations: self.violations.clone(),
            violation_count: self.violation_count,
            metrics,
        }
    }

    fn push(&mut self, at: Micros, ev: Ev<D::Message>) {
        self.seq += 1;
        self.queue.push(Entry {
            at,
            class: u8::from(!matches!(ev, Ev::Expire { .. })),
            seq: self.seq,
            ev,
        });
    }

    fn violate(&mut self, v: Violation) {
        self.violation_count += 1;
        if self.violations.len() < Report::KEPT {
            self.violations.push(v);
        }
    }

    fn handle(&mut self, ev: Ev<D::Message>) {
        match ev {
            Ev::Deliver { to, msg } => self.deliver(to, msg),
            Ev::Transmit { from, send } => self.transmit(from, send),
            Ev::Wake { node, generation } => {
                let slot = &self.slots[node];
                if slot.wake_generation != generation || slot.frozen {
                    return;
                }
                let mut out = Outbox::default();
                if let Some(n) = self.slots[node].node.as_mut() {
                    self.design.wake(&self.env, n, self.now, &mut out);
                }
                self.after_event(node, out);
            }
            Ev::Expire { node, generation } => {
                if self.slots[node].expire_generation == generation {
                    self.refresh(node);
                }
            }
            Ev::FaultStart(k) => self.fault_start(k),
            Ev::FaultEnd(k) => self.fault_end(k),
            Ev::Deadline(k) => self.deadline(k),
            Ev::Adopt(i) => self.adopt(i),
            Ev::Roster(i, number, absent) => {
                if number > self.slots[i].roster_seen {
                    self.slots[i].roster_seen = number;
                    self.roster(i, absent);
                }
            }
            Ev::Resync(i) => {
                self.adopt(i);
                self.push(self.now + RESYNC, Ev::Resync(i));
            }
            Ev::Advance(generation) => self.advance(generation),
            Ev::Finish(generation) => {
                self.design.finish_change(&self.env, generation);
                self.publish();
            }
        }
    }

    /// Every node reads the configuration just published within the change's window.
    fn publish(&mut self) {
        let within = self.adopt_within;
        for i in 0..self.slots.len() {
            let at = self.now + self.rng.below(within + 1);
            self.push(at, Ev::Adopt(i));
        }
    }

    fn adopt(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        if slot.api_cut > 0 {
            return;
        }
        if slot.frozen {
            slot.adopt_pending = true;
            return;
        }
        let mut out = Outbox::default();
        if let Some(n) = self.slots[i].node.as_mut() {
            self.design.adopt(&self.env, n, self.now, &mut out);
            self.after_event(i, out);
        }
    }

    /// Node `i` sees the presence set without `absent`.
    fn roster(&mut self, i: usize, absent: Rc<BTreeSet<usize>>) {
        let slot = &mut self.slots[i];
        if slot.frozen {
            slot.roster_pending = Some(absent);
            return;
        }
        if let Some(n) = self.slots[i].node.as_mut() {
            self.design.set_roster(&self.env, n, &absent, self.now);
            self.after_event(i, Outbox::default());
        }
    }

    /// Every node but `skip` sees the presence set as it is now, at a random time between
    /// `after` and `after + within` from now.
    fn spread_roster(&mut self, skip: usize, after: Micros, within: Micros) {
        let absent = Rc::new(self.absent.clone());
        self.roster_number += 1;
        let number = self.roster_number;
        for i in (0..self.slots.len()).filter(|&i| i != skip) {
            let at = self.now + after + self.rng.below(within + 1);
            self.push(at, Ev::Roster(i, number, absent.clone()));
        }
    }

    /// The controller's rule: finish the change only once no voter serves the generation
    /// before `generation`, and the drain has passed.
    fn advance(&mut self, generation: u64) {
        let now = self.now;
        let all = self.slots.iter().all(|s| {
            s.node
                .as_ref()
                .is_none_or(|n| self.design.moved_on(&self.env, n, generation, now))
        });
        if all {
            let at = now + self.design.drain(&self.env);
            self.push(at, Ev::Finish(generation));
        } else {
            self.push(now + 10 * MS, Ev::Advance(generation));
        }
    }

    fn deliver(&mut self, to: usize, msg: Rc<D::Message>) {
        let slot = &mut self.slots[to];
        if slot.node.is_none() {
            return;
        }
        if slot.frozen {
            slot.queued.push(msg);
            return;
        }
        self.metrics.delivered += 1;
        let mut out = Outbox::default();
        if let Some(n) = self.slots[to].node.as_mut() {
            self.design.receive(&self.env, n, &msg, self.now, &mut out);
        }
        self.after_event(to, out);
    }

    /// After node `i` handled an event: sends what it sent, reschedules its timer and updates
    /// what it answers for (the invariants' checks).
    fn after_event(&mut self, i: usize, out: Outbox<D::Message>) {
        for send in out.sends {
            if send.after == 0 {
                self.transmit(i, send);
            } else {
                let at = self.now + send.after;
                self.push(at, Ev::Transmit { from: i, send });
            }
        }
        self.schedule_wake(i);
        self.refresh(i);
    }

    fn schedule_wake(&mut self, i: usize) {
        let Some(n) = self.slots[i].node.as_ref() else {
            return;
        };
        let at = self.design.next_wake(n).max(self.now);
        let slot = &mut self.slots[i];
        if slot.wake_at == at && at > self.now {
            return;
        }
        slot.wake_at = at;
        slot.wake_generation += 1;
        let generation = slot.wake_generation;
        if at != Micros::MAX {
            self.push(
                at,
                Ev::Wake {
                    node: i,
                    generation,
                },
            );
        }
    }

    fn transmit(&mut self, from: usize, send: Send<D::Message>) {
        self.metrics.largest = self.metrics.largest.max(send.bytes);
        if send.bytes > MAX_DATAGRAM {
            self.metrics.send_failures += 1;
            return;
        }
        let n = self.slots.len();
        let frames = frames(send.bytes);
        let measured = self.now >= self.measure_from;
        let targets = |to: usize, engine: &mut Self| {
            if to == from {
                return;
            }
            if measured {
                engine.metrics.datagrams[from] += 1;
                engine.metrics.bytes[from] += send.bytes as u64;
            }
            if let Some(delay) = engine.link(from, to, frames) {
                let at = engine.now + delay;
                engine.push(
                    at,
                    Ev::Deliver {
                        to,
                        msg: send.msg.clone(),
                    },
                );
            }
        };
        match send.to {
            Dest::All => {
                for to in 0..n {
                    targets(to, self);
                }
            }
            Dest::One(to) if to < n => targets(to, self),
            Dest::One(_) => {}
        }
    }

    /// The delay of a datagram of `frames` frames from `from` to `to` now, or `None` when it is
    /// lost.
    fn link(&mut self, from: usize, to: usize, frames: usize) -> Option<Micros> {
        let mut kept = 1.0f64;
        let mut extra = 0;
        for (_, a) in &self.active {
            match a {
                Active::Cut(mask) => {
                    if mask[from] != mask[to] {
                        return None;
                    }
                }
                Active::Split(groups) => {
                    if groups.get(from) != groups.get(to) {
                        return None;
                    }
                }
                Active::Loss {
                    from: f,
                    to: t,
                    fraction,
                } => {
                    if f.is_none_or(|f| f == from) && t.is_none_or(|t| t == to) {
                        kept *= (1.0 - fraction).clamp(0.0, 1.0);
                    }
                }
                Active::Delay { from: f, extra: e } => {
                    if *f == from {
                        extra += e;
                    }
                }
            }
        }
        if kept < 1.0 {
            // A datagram arrives only when every one of its frames does.
            let survives = kept.powi(i32::try_from(frames).unwrap_or(i32::MAX));
            if !self.rng.chance(survives) {
                return None;
            }
        }
        Some(self.rng.between(self.latency.0, self.latency.1) + extra)
    }

    /// Re-reads what node `i` answers for, and checks the invariants on what changed.
    fn refresh(&mut self, i: usize) {
        let now = self.now;
        let slot = &self.slots[i];
        let claims = slot.node.as_ref().is_some_and(|n| self.design.claims(n));
        if claims != slot.claims {
            self.slots[i].claims = claims;
            if claims {
                self.claiming += 1;
            } else {
                self.claiming -= 1;
            }
            self.check_converged();
        }
        let slot = &self.slots[i];
        let (ips, until): (Vec<u32>, Micros) = match slot.node.as_ref() {
            Some(n) if !slot.frozen => {
                let a = self.design.answer(n);
                if a.until > now {
                    (a.ips.to_vec(), a.until)
                } else {
                    (Vec::new(), a.until)
                }
            }
            _ => (Vec::new(), 0),
        };
        if until != self.slots[i].until {
            let slot = &mut self.slots[i];
            slot.until = until;
            slot.expire_generation += 1;
            let generation = slot.expire_generation;
            if until > now {
                self.push(
                    until,
                    Ev::Expire {
                        node: i,
                        generation,
                    },
                );
            }
        }
        if ips == self.slots[i].answering {
            return;
        }
        let old = std::mem::replace(&mut self.slots[i].answering, ips.clone());
        let node = u32::try_from(i).unwrap_or(u32::MAX);
        // Both ascending: a merge gives what stopped and what started.
        let (mut a, mut b) = (0, 0);
        while a < old.len() || b < ips.len() {
            match (old.get(a), ips.get(b)) {
                (Some(x), Some(y)) if x == y => {
                    a += 1;
                    b += 1;
                }
                (Some(x), Some(y)) if x < y => {
                    self.ip_stops(*x as usize, node);
                    a += 1;
                }
                (Some(x), None) => {
                    self.ip_stops(*x as usize, node);
                    a += 1;
                }
                (_, Some(y)) => {
                    self.ip_starts(*y as usize, node);
                    b += 1;
                }
                (None, None) => break,
            }
        }
    }

    fn ip_starts(&mut self, ip: usize, node: u32) {
        let now = self.now;
        let state = &mut self.ips[ip];
        state.answerers.push(node);
        if state.answerers.len() > 1 {
            let nodes = state.answerers.iter().map(|&n| n as usize).collect();
            self.violate(Violation::TwoAnswer { at: now, ip, nodes });
            return;
        }
        self.answered += 1;
        if let Some(since) = self.ips[ip].unanswered_since.take() {
            // The latest fault that started before the outage began: a failover if it was
            // still on then (counted from its start), a hand-back after it healed otherwise.
            let fault = self
                .faults
                .iter()
                .filter(|f| f.at <= since)
                .max_by_key(|f| f.at);
            match fault {
                Some(f) if f.heal >= since => self.metrics.failovers.push(now - f.at),
                Some(_) => self.metrics.handbacks.push(now - since),
                None => {}
            }
        }
        self.check_converged();
        self.settle_owner(ip);
    }

    /// Start-up is over once every speaker claims and every IP is answered.
    fn check_converged(&mut self) {
        if self.metrics.converged_at.is_none()
            && self.answered == self.ips.len()
            && self.claiming == self.slots.len()
        {
            self.metrics.converged_at = Some(self.now);
            // Owners seen so far were start-up's: moves count from here.
            for ip in &mut self.ips {
                ip.last_owner = ip.answerers.first().copied();
            }
        }
    }

    fn ip_stops(&mut self, ip: usize, node: u32) {
        let now = self.now;
        let converged = self.metrics.converged_at.is_some();
        let state = &mut self.ips[ip];
        state.answerers.retain(|&n| n != node);
        match state.answerers.len() {
            0 => {
                self.answered -= 1;
                if converged {
                    state.unanswered_since = Some(now);
                    if self.first_fault.is_none() {
                        self.metrics.outages_without_fault += 1;
                    }
                }
            }
            1 => self.settle_owner(ip),
            _ => {}
        }
    }

    /// One node answers `ip`: counts a move if it is not the one that answered it last.
    fn settle_owner(&mut self, ip: usize) {
        let now = self.now;
        let converged = self.metrics.converged_at.is_some();
        let state = &mut self.ips[ip];
        let [owner] = state.answerers[..] else {
            return;
        };
        let before = state.last_owner.replace(owner);
        if let Some(from) = before.filter(|&b| b != owner)
            && converged
        {
            self.metrics.moved += 1;
            if self.first_fault.is_none() {
                self.violate(Violation::MovedWithoutFault {
                    at: now,
                    ip,
                    from: from as usize,
                    to: owner as usize,
                });
            }
        }
    }

    fn fault_start(&mut self, k: usize) {
        let now = self.now;
        self.first_fault.get_or_insert(now);
        let n = self.slots.len();
        match self.faults[k].kind.clone() {
            FaultKind::Cut(nodes) => {
                let mut mask = vec![false; n];
                for i in nodes.into_iter().filter(|&i| i < n) {
                    mask[i] = true;
                }
                self.active.push((k, Active::Cut(mask)));
            }
            FaultKind::Split(groups) => self.active.push((k, Active::Split(groups))),
            FaultKind::Loss { from, to, fraction } => {
                self.active.push((k, Active::Loss { from, to, fraction }))
            }
            FaultKind::Delay { from, extra } => {
                self.active.push((k, Active::Delay { from, extra }))
            }
            FaultKind::Freeze(i) if i < n => {
                self.slots[i].frozen = true;
                self.refresh(i);
            }
            FaultKind::Restart { node: i, graceful } if i < n => {
                let mut out = Outbox::default();
                if let (Some(replaced), Some(node)) = (graceful, self.slots[i].node.as_mut()) {
                    self.design.leave(&self.env, node, replaced, now, &mut out);
                }
                for send in out.sends {
                    let at = now + send.after;
                    self.push(at, Ev::Transmit { from: i, send });
                }
                let slot = &mut self.slots[i];
                slot.node = None;
                slot.frozen = false;
                slot.queued.clear();
                slot.adopt_pending = false;
                slot.wake_generation += 1;
                slot.wake_at = Micros::MAX;
                self.refresh(i);
            }
            FaultKind::ApiCut(nodes) => {
                for i in nodes.into_iter().filter(|&i| i < n) {
                    self.slots[i].api_cut += 1;
                }
            }
            FaultKind::Leave {
                node: i,
                after,
                within,
            } if i < n => {
                let slot = &mut self.slots[i];
                slot.node = None;
                slot.frozen = false;
                slot.queued.clear();
                slot.roster_pending = None;
                slot.wake_generation += 1;
                slot.wake_at = Micros::MAX;
                self.refresh(i);
                self.absent.insert(i);
                self.spread_roster(i, after, within);
            }
            FaultKind::ChangeVoters { next, adopt_within } => {
                self.adopt_within = adopt_within;
                if let Some(generation) = self.design.change_voters(&self.env, &next) {
                    self.push(now + 10 * MS, Ev::Advance(generation));
                }
                self.publish();
            }
            FaultKind::Freeze(_) | FaultKind::Restart { .. } | FaultKind::Leave { .. } => {}
        }
    }

    fn fault_end(&mut self, k: usize) {
        let now = self.now;
        let n = self.slots.len();
        self.active.retain(|(j, _)| *j != k);
        let mut bound = self.env.heal_bound;
        match self.faults[k].kind {
            FaultKind::Freeze(i) if i < n => {
                self.slots[i].frozen = false;
                // The datagrams queued in its socket first, then its overdue timers.
                let queued = std::mem::take(&mut self.slots[i].queued);
                for msg in queued {
                    self.deliver(i, msg);
                }
                if std::mem::take(&mut self.slots[i].adopt_pending) {
                    self.adopt(i);
                }
                if let Some(absent) = self.slots[i].roster_pending.take() {
                    self.roster(i, absent);
                }
                self.slots[i].wake_at = Micros::MAX;
                self.schedule_wake(i);
                self.refresh(i);
            }
            FaultKind::Leave {
                node: i, within, ..
            } if i < n => {
                self.absent.remove(&i);
                self.spread_roster(i, 0, within);
                self.start_process(i);
                bound += self.design.startup(&self.env) + within;
            }
            FaultKind::ApiCut(ref nodes) => {
                for &i in nodes.iter().filter(|&&i| i < n) {
                    self.slots[i].api_cut = self.slots[i].api_cut.saturating_sub(1);
                }
            }
            // A node out of the presence set has no process to restart: it starts when it
            // comes back.
            FaultKind::Restart { node: i, .. } if i < n && !self.absent.contains(&i) => {
                self.start_process(i);
                bound += self.design.startup(&self.env);
            }
            _ => {}
        }
        self.push(now + bound, Ev::Deadline(k));
    }

    /// A new process starts on node `i` now, reading the presence set as it is.
    fn start_process(&mut self, i: usize) {
        let now = self.now;
        self.slots[i].boots += 1;
        let boot = self.rng.next_u64();
        let node = self.design.start(&self.env, i, boot, now);
        self.slots[i].node = Some(node);
        self.slots[i].roster_seen = self.roster_number;
        if !self.absent.is_empty() {
            let absent = self.absent.clone();
            if let Some(n) = self.slots[i].node.as_mut() {
                self.design.set_roster(&self.env, n, &absent, now);
            }
        }
        self.slots[i].wake_at = Micros::MAX;
        self.schedule_wake(i);
        self.refresh(i);
    }

    /// Invariant 2 for fault `k`: every IP answered at its deadline, unless another fault
    /// started since it healed (that one's own deadline applies).
    fn deadline(&mut self, k: usize) {
        let healed_at = self.faults[k].heal;
        let now = self.now;
        let overlapped = self
            .faults
            .iter()
            .enumerate()
            .any(|(j, f)| j != k && f.at <= now && f.heal > healed_at && f.at < now);
        if overlapped {
            return;
        }
        for ip in 0..self.ips.len() {
            let state = &self.ips[ip];
            // An outage that began after the heal is another one (a node taking its IPs back,
            // say): the hand-backs count it.
            let since_heal = state.unanswered_since.is_some_and(|s| s > healed_at);
            if state.answerers.is_empty() && !since_heal {
                let last_owner = self.ips[ip].last_owner.map(|o| o as usize);
                self.violate(Violation::NotAnsweredAfterHeal {
                    at: now,
                    ip,
                    fault: k,
                    healed_at,
                    last_owner,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn the_owner_from_scores_is_owner_choose() {
        let env = Env::new(&Cluster::new(7, 1), Instant::now());
        for ip in 0..env.ips.len() {
            for skip in 0..7 {
                let members: Vec<usize> = (0..7).filter(|&i| i != skip).collect();
                let expected = crate::owner::choose(
                    &env.ips[ip],
                    members.iter().map(|&i| env.names[i].as_str()),
                );
                assert_eq!(
                    env.owner(ip, members.iter().copied())
                        .map(|i| env.names[i].as_str()),
                    expected
                );
            }
        }
        // Thirty nodes: the eight ranked ones, and past them (every ranked one left out).
        let wide = Env::new(&Cluster::new(30, 2), Instant::now());
        for ip in 0..wide.ips.len() {
            let ranked: Vec<usize> = wide.ranked[ip].iter().map(|&i| i as usize).collect();
            for skip in [
                vec![],
                ranked[..3].to_vec(),
                ranked.clone(),
                (0..29).collect(),
            ] {
                let member = |i: usize| !skip.contains(&i);
                assert_eq!(
                    wide.owner_among(ip, member),
                    wide.owner(ip, (0..30).filter(|&i| member(i)))
                );
            }
        }
        assert!(env.names.iter().all(|n| n.len() == 30));
        let mut sorted = env.names.clone();
        sorted.sort();
        assert_eq!(sorted, env.names, "index order is name order");
    }

    #[test]
    fn frames_follow_the_mtu() {
        assert_eq!(frames(100), 1);
        assert_eq!(frames(FRAME_PAYLOAD), 1);
        assert_eq!(frames(FRAME_PAYLOAD + 1), 2);
        assert_eq!(frames(48_000), 33);
    }

    #[test]
    fn splits_and_rolling_restarts_cover_every_node() {
        let FaultKind::Split(g) = FaultKind::thirds(7) else {
            unreachable!()
        };
        assert_eq!(g, [0, 0, 0, 1, 1, 2, 2]);
        let FaultKind::Split(g) = FaultKind::halves(4) else {
            unreachable!()
        };
        assert_eq!(g, [0, 0, 1, 1]);
        let r = rolling_restart(3, 1_000, 500, 100);
        assert_eq!(r.len(), 3);
        assert_eq!((r[2].at, r[2].heal), (2_000, 2_100));
    }
}
