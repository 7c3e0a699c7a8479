//! Sends and receives the speakers' heartbeats over UDP (see `ferrolb_layer2::liveness`
//! for the protocol and the rules).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use ferrolb_layer2::heartbeat::{Heartbeat, HeartbeatError, KeyRing};
use ferrolb_layer2::liveness::Membership;
use ferrolb_layer2::quorum::Report;
use ferrolb_layer2::tenure::{SentLog, Tenure};
use tokio::net::UdpSocket;
use tokio::sync::Notify;

use crate::l2::voters;
use crate::metrics::Metrics;

/// What this speaker says about itself.
#[derive(Clone, Debug, Default)]
struct Local {
    ready: bool,
    leaving: bool,
    /// Leaving to be replaced: the others keep this node's IPs for their restart hold.
    restarting: bool,
    interfaces: BTreeSet<String>,
    /// When the work loop last said what it is (each step and each check between steps).
    confirmed: Option<Instant>,
}

/// The heartbeat exchange: the live peers, and what this speaker announces about itself.
pub struct Gossip {
    node: String,
    /// The keys: heartbeats are signed with the first and accepted under any. Replaced whole
    /// when the key files change (`keys.rs`); the table of peers is untouched.
    keys: Mutex<Arc<KeyRing>>,
    port: u16,
    boot: u64,
    seq: Mutex<u64>,
    /// The sequence number of this boot's latest heartbeat that said `ready: false` (0: none):
    /// the gate reads it as a resignation ([`Gossip::last_unready_seq`]).
    last_unready_seq: std::sync::atomic::AtomicU64,
    /// When this boot's recent heartbeats went out, for the tenure (`ferrolb_layer2::tenure`).
    sent: Mutex<SentLog>,
    /// No heartbeat goes out before this: a starting speaker listens for one failure timeout
    /// first, so it never reports "not heard" for a peer it has not had the time to hear (the
    /// tenure's second assumption).
    speaks_from: Instant,
    timeout: Duration,
    local: Mutex<Local>,
    peers: Mutex<Vec<SocketAddr>>,
    membership: Mutex<Membership>,
    /// Most peers a heartbeat may list, from the number of Nodes: a longer datagram is refused
    /// before its tag is computed (`Heartbeat::decode_within`).
    max_hears: std::sync::atomic::AtomicUsize,
    /// The peers the last heartbeat said this speaker hears, each with its `ready`: a change
    /// goes out at once ([`Gossip::tell_changes`]).
    told: Mutex<BTreeMap<String, bool>>,
    /// `ready` goes out only while the work loop confirmed it this recently: a stuck or frozen
    /// loop stops being counted before its mandate to answer has lapsed.
    confirm_within: Duration,
    socket: UdpSocket,
    changed: Arc<Notify>,
    metrics: Metrics,
    /// With `--membership=voters`: the voters membership, which takes this socket's v4
    /// datagrams and sends its beats in place of the heartbeats.
    voters: Option<voters::Link>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere must not stop the heartbeats; the data stays consistent per field.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The key metrics for a ring just put in use.
fn note_keys(metrics: &Metrics, keys: &KeyRing) {
    metrics
        .gossip_keys
        .set(i64::try_from(keys.len()).unwrap_or(i64::MAX));
    metrics
        .gossip_keys_loaded
        .set(i64::try_from(unix_ms() / 1000).unwrap_or(i64::MAX));
}

/// A random number per process start, from the kernel.
pub(crate) fn boot_id() -> u64 {
    let uuid = std::fs::read_to_string("/proc/sys/kernel/random/uuid").unwrap_or_default();
    let hex: String = uuid
        .chars()
        .filter(char::is_ascii_hexdigit)
        .take(16)
        .collect();
    u64::from_str_radix(&hex, 16).unwrap_or_else(|_| unix_ms() ^ u64::from(std::process::id()))
}

/// Who a heartbeat says its sender hears, and whether each said `ready` (not the sequence
/// numbers, which move with every heartbeat).
fn heard_summary(
    hears: &BTreeMap<String, ferrolb_layer2::heartbeat::Heard>,
) -> BTreeMap<String, bool> {
    hears.iter().map(|(n, h)| (n.clone(), h.ready)).collect()
}

/// Most peers a heartbeat from a cluster of `nodes` Nodes may list: a sender hears only Nodes
/// besides itself, and twice the count plus 16 leaves room for Nodes added faster than this
/// speaker's Node watch sees them.
fn max_hears(nodes: usize) -> usize {
    nodes
        .saturating_mul(2)
        .saturating_add(16)
        .min(ferrolb_layer2::heartbeat::MAX_HEARS)
}

/// Why a heartbeat (or, with voters, a beat or report) was refused, as the `reason` label of
/// `ferrolb_speaker_heartbeats_refused`: the same labels whichever membership runs.
pub(crate) fn refused_reason(e: &HeartbeatError) -> &'static str {
    match e {
        HeartbeatError::Malformed | HeartbeatError::TooLong(_) => "malformed",
        HeartbeatError::TooLarge { .. } => "too_large",
        HeartbeatError::BadTag => "authentication",
        HeartbeatError::Clock { .. } => "clock",
        HeartbeatError::Replay => "replay",
        HeartbeatError::UnknownNode(_) => "unknown_node",
        HeartbeatError::TableFull(_) => "table_full",
    }
}

/// The heartbeat timings.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Between two heartbeats.
    pub interval: Duration,
    /// A peer silent this long is no longer heard.
    pub timeout: Duration,
    /// `ready` goes out only while the work loop confirmed it this recently.
    pub confirm_within: Duration,
    /// How long a peer that leaves to be replaced keeps its IPs.
    pub restart_hold: Duration,
}

impl Gossip {
    /// Binds the heartbeat port and starts sending and receiving. `changed` is notified when
    /// the live peers may have changed.
    pub async fn start(
        node: String,
        keys: KeyRing,
        port: u16,
        timing: Timing,
        changed: Arc<Notify>,
        metrics: Metrics,
        voters: Option<voters::Settings>,
    ) -> anyhow::Result<Arc<Self>> {
        // One dual-stack socket takes IPv4 heartbeats as mapped addresses; nodes without IPv6
        // fall back to IPv4 only.
        let socket =
            match UdpSocket::bind(SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port)).await {
                Ok(s) => s,
                Err(_) => UdpSocket::bind(SocketAddr::new(IpAddr::from([0, 0, 0, 0]), port))
                    .await
                    .with_context(|| format!("binding heartbeat port {port}"))?,
            };
        note_keys(&metrics, &keys);
        let boot = boot_id();
        let voters = voters.map(|v| voters::Link::new(v, port, changed.clone(), metrics.clone()));
        let gossip = Arc::new(Gossip {
            voters,
            membership: Mutex::new({
                let mut m = Membership::new(node.clone(), timing.timeout);
                m.set_restart_hold(timing.restart_hold);
                m
            }),
            max_hears: std::sync::atomic::AtomicUsize::new(ferrolb_layer2::heartbeat::MAX_HEARS),
            node,
            keys: Mutex::new(Arc::new(keys)),
            port,
            boot,
            seq: Mutex::new(0),
            last_unready_seq: std::sync::atomic::AtomicU64::new(0),
            sent: Mutex::new(SentLog::new(boot)),
            speaks_from: Instant::now() + timing.timeout,
            timeout: timing.timeout,
            local: Mutex::new(Local::default()),
            peers: Mutex::new(Vec::new()),
            told: Mutex::new(BTreeMap::new()),
            confirm_within: timing.confirm_within,
            socket,
            changed,
            metrics,
        });
        let sender = gossip.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(timing.interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                sender.beat().await;
            }
        });
        let receiver = gossip.clone();
        tokio::spawn(async move { receiver.receive().await });
        Ok(gossip)
    }

    /// The voters membership, with `--membership=voters`.
    pub fn voters(&self) -> Option<&voters::Link> {
        self.voters.as_ref()
    }

    /// Sets where the other speakers are (their nodes' addresses).
    pub fn set_peers(&self, addresses: impl IntoIterator<Item = IpAddr>) {
        let mut list: Vec<SocketAddr> = addresses
            .into_iter()
            .map(|ip| SocketAddr::new(ip, self.port))
            .collect();
        list.sort();
        list.dedup();
        *lock(&self.peers) = list;
    }

    /// Sets the names of the cluster's Nodes: the table of peers forgets the others and stops
    /// tracking names that are not Nodes (a heartbeat from one is refused).
    pub fn set_nodes(&self, names: BTreeSet<String>) {
        self.max_hears
            .store(max_hears(names.len()), std::sync::atomic::Ordering::Relaxed);
        let forgotten = lock(&self.membership).set_nodes(names);
        if forgotten > 0 {
            tracing::info!(
                forgotten,
                "forgot the heartbeat state of peers that are no longer Nodes"
            );
        }
    }

    /// The keys in use.
    pub fn keys(&self) -> Arc<KeyRing> {
        lock(&self.keys).clone()
    }

    /// Replaces the keys; the next heartbeat is signed with the new first key.
    pub fn set_keys(&self, keys: KeyRing) {
        note_keys(&self.metrics, &keys);
        *lock(&self.keys) = Arc::new(keys);
    }

    /// Sets what this speaker says about itself (and confirms the work loop is alive); a
    /// change goes out at once.
    pub async fn set_local(&self, ready: bool, interfaces: BTreeSet<String>) {
        let changed = {
            let mut local = lock(&self.local);
            let changed = local.ready != ready || local.interfaces != interfaces;
            local.ready = ready;
            local.interfaces = interfaces;
            local.confirmed = Some(Instant::now());
            changed
        };
        if changed {
            self.beat().await;
        }
    }

    /// Tells the others this speaker leaves, so they take its IPs over without waiting for the
    /// failure timeout, or, `replaced`, keep them for its successor. Sent three times: UDP may
    /// drop one.
    pub async fn leave(&self, replaced: bool) {
        if let Some(v) = &self.voters {
            v.leave(replaced);
        }
        {
            let mut local = lock(&self.local);
            local.leaving = true;
            local.restarting = replaced;
        }
        for _ in 0..3 {
            self.beat().await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// What each peer heard at `now` said last, for the quorum rule.
    pub fn reports(&self, now: Instant) -> BTreeMap<String, Report> {
        lock(&self.membership).reports(now)
    }

    /// Until when this speaker may answer for its IPs, from `acks`, the acknowledgements of its
    /// heartbeats ([`Gossip::acks`]; `ferrolb_layer2::tenure`): `known` are the known speakers.
    pub fn tenure(
        &self,
        known: &BTreeSet<String>,
        acks: &BTreeMap<String, ferrolb_layer2::heartbeat::Heard>,
    ) -> Tenure {
        let sent = lock(&self.sent);
        ferrolb_layer2::tenure::tenure(&self.node, known, acks, &sent, self.timeout)
    }

    /// What each peer's latest heartbeat says of this boot's heartbeats.
    pub fn acks(&self) -> BTreeMap<String, ferrolb_layer2::heartbeat::Heard> {
        lock(&self.membership).acks(self.boot)
    }

    /// The sequence number of this boot's latest heartbeat that said `ready: false` (0: none).
    /// Such a heartbeat is a resignation: the others drop this node as a candidate at once, so
    /// the gate stops claiming and earns the claim again (`gate::Gate::check`). Read it after
    /// [`Gossip::acks`], so that no acknowledgement read is of a heartbeat later than it.
    pub fn last_unready_seq(&self) -> u64 {
        self.last_unready_seq
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// When the next heard peer would fall silent.
    pub fn next_silence(&self, now: Instant) -> Option<Instant> {
        if let Some(v) = &self.voters {
            return v.next_wake(now);
        }
        lock(&self.membership).next_silence(now)
    }

    /// Sends a heartbeat now if the peers this speaker hears (or their `ready`) changed since
    /// the last one. A peer falling silent then reaches the others at once instead of up to a
    /// heartbeat interval later: while one of them still reports the silent owner ready it
    /// stays a candidate, so the taker waits for that news (measured: about 40 ms of a link-cut
    /// failover's median). Safe: taking over still needs the taker itself to have stopped
    /// hearing the owner for the failure timeout, which bounds the owner's tenure.
    pub async fn tell_changes(&self) {
        if self.voters.is_some() {
            // Members report nobody: a voter's report goes out with every beat it answers.
            return;
        }
        let now = heard_summary(&lock(&self.membership).hears(Instant::now()));
        if *lock(&self.told) != now {
            self.beat().await;
        }
    }

    async fn beat(&self) {
        if let Some(v) = &self.voters {
            // A member's beat says nothing about others, so it needs no listening first (its
            // gate settles; a voter reports only once it has listened: `Voter::listening`).
            return v.beat(&self.socket, &self.keys(), unix_ms()).await;
        }
        if Instant::now() < self.speaks_from {
            return;
        }
        let beat = {
            let local = lock(&self.local).clone();
            let mut seq = lock(&self.seq);
            *seq += 1;
            // Logged before it is sent: a bound taken early is safe.
            lock(&self.sent).record(*seq, Instant::now());
            let ready = local.ready
                && !local.leaving
                && local
                    .confirmed
                    .is_some_and(|t| t.elapsed() <= self.confirm_within);
            if !ready {
                // Recorded before it is sent (under the `seq` lock, so it only grows): the work
                // loop must not claim on acknowledgements older than it.
                self.last_unready_seq
                    .store(*seq, std::sync::atomic::Ordering::SeqCst);
            }
            Heartbeat {
                node: self.node.clone(),
                boot: self.boot,
                seq: *seq,
                unix_ms: unix_ms(),
                ready,
                leaving: local.leaving,
                restarting: local.leaving && local.restarting,
                interfaces: local.interfaces,
                hears: lock(&self.membership).hears(Instant::now()),
            }
        };
        *lock(&self.told) = heard_summary(&beat.hears);
        let bytes = match beat.encode(self.keys().signing()) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "cannot encode a heartbeat");
                return;
            }
        };
        let peers = lock(&self.peers).clone();
        for peer in peers {
            let target = match peer {
                SocketAddr::V4(v4) if self.socket.local_addr().is_ok_and(|a| a.is_ipv6()) => {
                    SocketAddr::new(IpAddr::V6(v4.ip().to_ipv6_mapped()), v4.port())
                }
                other => other,
            };
            if let Err(e) = self.socket.send_to(&bytes, target).await {
                tracing::debug!(%peer, error = %e, "heartbeat not sent");
            }
        }
    }

    async fn receive(&self) {
        // A heartbeat lists the peers its sender hears: room for the largest datagram.
        let mut buf = vec![0u8; 65_536];
        let mut last_warning: Option<Instant> = None;
        loop {
            let (len, from) = match self.socket.recv_from(&mut buf).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "heartbeat receive failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let now = Instant::now();
            let keys = self.keys();
            let datagram = &buf[..len];
            match (ferrolb_layer2::wire::version(datagram), &self.voters) {
                (Some(4), Some(v)) => {
                    v.receive(&self.socket, &keys, datagram, from, unix_ms())
                        .await;
                    continue;
                }
                (Some(_), Some(v)) => {
                    // A speaker on today's heartbeats (a roll from one membership to the
                    // other): authenticated, it holds this node back (voters::Link::check).
                    let max_hears = self.max_hears.load(std::sync::atomic::Ordering::Relaxed);
                    if Heartbeat::decode_within(datagram, &keys, max_hears).is_ok() {
                        v.heard_legacy(now);
                    }
                    self.metrics
                        .heartbeats_refused
                        .get_or_create(&vec![("reason", "other_membership".to_string())])
                        .inc();
                    continue;
                }
                // A speaker started with --membership=voters: it holds itself back while it
                // hears this one, and this one needs nothing from it.
                (Some(4), None) => {
                    self.metrics
                        .heartbeats_refused
                        .get_or_create(&vec![("reason", "other_membership".to_string())])
                        .inc();
                    continue;
                }
                _ => {}
            }
            let max_hears = self.max_hears.load(std::sync::atomic::Ordering::Relaxed);
            let result =
                Heartbeat::decode_within(&buf[..len], &keys, max_hears).and_then(|(beat, key)| {
                    if key > 0 {
                        // During a rotation: a peer signing with a key other than ours.
                        self.metrics.heartbeats_other_key.inc();
                    }
                    lock(&self.membership).receive(beat, now, unix_ms())
                });
            match result {
                Ok(true) => self.changed.notify_one(),
                Ok(false) => {}
                Err(e) => {
                    let reason = refused_reason(&e);
                    self.metrics
                        .heartbeats_refused
                        .get_or_create(&vec![("reason", reason.to_string())])
                        .inc();
                    // Duplicates are normal, and so are heartbeats from a node just added or
                    // deleted (the Node watch lags); everything else is worth a (rate-limited)
                    // warning.
                    if !matches!(reason, "replay" | "unknown_node")
                        && last_warning
                            .is_none_or(|t| now.duration_since(t) > Duration::from_secs(30))
                    {
                        last_warning = Some(now);
                        tracing::warn!(%from, error = %e, "heartbeat refused");
                    }
                }
            }
        }
    }
}
