//! Speaker liveness: authenticated heartbeats between speakers and the table of who is alive.
//!
//! Every speaker sends a small UDP datagram to every other node every `interval` (100 ms by
//! default) and counts a peer alive while its last valid heartbeat is younger than `timeout`
//! (500 ms). That detects a dead node, a dead speaker or a cut link within about half a second,
//! directly between speakers and without any API write; MetalLB's memberlist needs seconds.
//!
//! A heartbeat says who sends it, whether it may own IPs (`ready`), whether it is leaving (clean
//! shutdown: the others take over at once instead of waiting for the timeout), and which of its
//! interfaces can announce, so the others know whether an advertisement limited to some
//! interfaces can use it. It is authenticated with HMAC-SHA-256 under a key shared through a
//! Secret; replays are refused by a per-boot sequence number and a timestamp window (the rule
//! and its reasoning are below).
//!
//! Everything here is pure: time comes in as arguments, bytes in and out as slices.
//!
//! # Keys
//!
//! A speaker holds one or more keys ([`KeyRing`]): it signs with the first and accepts a
//! heartbeat that verifies under any of them. That is what lets an operator rotate the key
//! without a moment where two nodes refuse each other: add the next key everywhere, make it the
//! first everywhere, then remove the old one (docs/architecture.md, "Rotating the gossip key").
//!
//! # Replays, and why one forged datagram cannot lock a sender out
//!
//! Anyone on the path can capture a heartbeat and send it again; anyone holding the key can also
//! send heartbeats in any node's name. The rule refuses the first and bounds what the second can
//! do to the real sender's heartbeats, per peer (docs/decisions/0015, "Replay protection"):
//!
//! 1. **Window.** A timestamp further than [`CLOCK_WINDOW_MS`] from our clock is refused
//!    (`Clock`): captures older than that never count, whatever the table holds or forgot.
//! 2. **Same boot.** A heartbeat of a boot already heard counts when its sequence number is above
//!    every one accepted from that boot, or else when its timestamp is later than every timestamp
//!    recorded for the node. A captured datagram is older on both counts: `Replay`.
//! 3. **Another boot** (a restart, or a boot heard before) counts only when its timestamp is no
//!    older than the newest recorded for the node minus [`BOOT_TOLERANCE_MS`], and, for a boot
//!    heard before, when rule 2 holds against that boot's own sequence. The last [`MAX_BOOTS`]
//!    boots are remembered, so the captures of a boot the sender has left stay replays.
//! 4. **Recorded time is capped.** The timestamp the table records (what rules 2 and 3 compare
//!    with) is at most [`MAX_LEAD_MS`] ahead of the table's estimate of the sender's clock. The
//!    estimate starts from our wall clock at the first heartbeat, runs on our monotonic clock,
//!    and moves on by the lead with each heartbeat accepted beyond it. Such a heartbeat is
//!    remembered until the recorded time passes its timestamp, and refused if it comes again.
//!
//! Why a forged heartbeat cannot poison the table: a sequence number of `u64::MAX` closes rule
//! 2's first arm for that boot, but the second takes the real heartbeats as soon as their
//! timestamps pass the recorded one, which the cap keeps within the lead of the estimate. A
//! forged boot stamped far in the future is recorded the same way, so the real boot passes rule 3
//! at once and is judged by its own sequence. Each forged datagram can thus move the estimate,
//! and what the real sender must pass, [`MAX_LEAD_MS`] further: one costs the real sender at most
//! that much of refused heartbeats (less than the failure timeout); `n` of them, sent at any
//! times, at most `n` times that after the last one (the estimate does not fall back), never more
//! than the clock window; nothing lasts until a restart. Sending the forged datagram again adds
//! nothing: it is remembered. (If the first heartbeat the table hears from a node is forged, our
//! clock stands in for the estimate, and a real sender whose clock is behind ours pays that
//! difference once more.) A key holder who keeps sending can keep a node out, as it could by
//! speaking in the node's name: the key is the boundary; this rule only keeps a single datagram
//! from having a lasting effect. The property test
//! `forged_heartbeats_lock_the_sender_out_only_briefly` checks the bound over arbitrary
//! interleavings of real, forged and replayed heartbeats.
//!
//! Clock steps. The sender's clock stepping back within a boot: its sequence still grows, so
//! nothing is refused. Stepping forward: accepted by sequence (recorded at the cap, which the
//! estimate follows, a lead per heartbeat). A restart after the clock stepped back by `d`: heard
//! at once when `d` is at most [`BOOT_TOLERANCE_MS`] plus the time the restart took; otherwise
//! refused as a replay for `d` minus those at most (beyond the clock window the `Clock` rule
//! refuses it anyway, as before). Our own wall clock stepping moves only the window; the
//! estimate runs on the monotonic clock. Without NTP the estimate drifts from the sender's clock,
//! and what a forged datagram costs grows by that drift, still never past the window.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// First bytes of every heartbeat: protocol name and version (3: each peer the sender hears
/// with the boot and sequence number last heard from it, which [`crate::tenure`] needs; 2 listed
/// names only. Speakers of other versions refuse each other's heartbeats as malformed, so a
/// rolling upgrade across versions is a partition that the quorum rule resolves: the side with
/// the majority keeps or takes the IPs, the other owns none).
const MAGIC: &[u8; 4] = b"FLB\x03";
/// Bytes of the truncated HMAC tag (128 bits, as RFC 2104 allows).
const TAG_LEN: usize = 16;
/// Flag: the sender may own IPs.
const FLAG_READY: u8 = 0x1;
/// Flag: the sender is shutting down.
const FLAG_LEAVING: u8 = 0x2;
/// Flag, with [`FLAG_LEAVING`]: the sender is being replaced by a new process on the same node
/// (a rolling update); keep it as the owner of its IPs for the restart hold.
const FLAG_RESTARTING: u8 = 0x4;
/// Heartbeats whose timestamp is further than this from ours are refused: replays of old
/// captures fail, while nodes kept within seconds by NTP pass.
pub const CLOCK_WINDOW_MS: u64 = 30_000;
/// How far ahead of the sender's clock, as the table estimates it, a recorded timestamp may be:
/// what one forged heartbeat can cost the real sender (module docs, rule 4), well under the
/// default failure timeout. Real heartbeats are not ahead of the estimate unless the sender's
/// clock jumped forward; they still count, and the estimate catches up by this much a heartbeat.
pub const MAX_LEAD_MS: u64 = 250;
/// A boot other than the last heard counts when its timestamp is no older than the newest
/// recorded for the node minus this (module docs, rule 3): a restart after a clock step back of
/// up to this much is heard at once, while the captures of an earlier boot that were not
/// remembered stay refused once the sender has run this long.
pub const BOOT_TOLERANCE_MS: u64 = 10_000;
/// Boots remembered per peer, each with its highest sequence number: a restarted sender's old
/// boot stays refused; more boots in one clock window (forged ones) push the oldest out, which
/// then falls back to rule 3's timestamp check.
pub const MAX_BOOTS: usize = 4;
/// Most peers the table tracks while the node list is not known ([`Membership::set_nodes`]):
/// the largest cluster Kubernetes supports. Once the node list is known, only its names are
/// tracked.
pub const MAX_PEERS: usize = 5_000;
/// Shortest key accepted, in bytes: 128 bits, the length of the tag.
pub const MIN_KEY_LEN: usize = 16;

/// The keys a speaker holds: it signs with the first and accepts a heartbeat that verifies
/// under any of them (during a key rotation, the current and the next key).
#[derive(Clone, PartialEq, Eq)]
pub struct KeyRing {
    keys: Vec<Vec<u8>>,
}

/// Why a set of keys is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    /// No key at all.
    #[error("no gossip key")]
    Empty,
    /// A key too short to authenticate anything.
    #[error("gossip key {index} is {len} bytes long; at least {MIN_KEY_LEN} are needed")]
    TooShort {
        /// Position of the key in the ring (0: the signing key).
        index: usize,
        /// Its length in bytes.
        len: usize,
    },
}

impl KeyRing {
    /// The ring of `keys`, the first signing. A key that repeats an earlier one is dropped (a
    /// next key equal to the current one is no second key).
    pub fn new(keys: impl IntoIterator<Item = Vec<u8>>) -> Result<Self, KeyError> {
        let mut ring: Vec<Vec<u8>> = Vec::new();
        for (index, key) in keys.into_iter().enumerate() {
            if key.len() < MIN_KEY_LEN {
                return Err(KeyError::TooShort {
                    index,
                    len: key.len(),
                });
            }
            if !ring.contains(&key) {
                ring.push(key);
            }
        }
        if ring.is_empty() {
            return Err(KeyError::Empty);
        }
        Ok(KeyRing { keys: ring })
    }

    /// The key heartbeats are signed with.
    pub fn signing(&self) -> &[u8] {
        // `new` refuses an empty ring.
        self.keys.first().map_or(&[], Vec::as_slice)
    }

    /// Whether `key` is one of the ring's keys.
    pub fn contains(&self, key: &[u8]) -> bool {
        self.keys.iter().any(|k| k == key)
    }

    /// How many keys the ring holds (at least one).
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Never true: a ring holds at least one key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

impl std::fmt::Debug for KeyRing {
    // Keys never reach a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyRing({} keys)", self.keys.len())
    }
}

/// One speaker's heartbeat.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Heartbeat {
    /// Sender's node name.
    pub node: String,
    /// Random per process start; a restarted speaker starts a new sequence.
    pub boot: u64,
    /// Increases with every heartbeat of one boot.
    pub seq: u64,
    /// Sender's wall clock, milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// The sender may own IPs (caches synced, settled, an interface usable).
    pub ready: bool,
    /// The sender is shutting down and gives its IPs up.
    pub leaving: bool,
    /// With `leaving`: the sender is being replaced by a new process on the same node, and asks
    /// the others to keep it the owner of its IPs for their restart hold
    /// ([`Membership::set_restart_hold`]) instead of taking them over.
    pub restarting: bool,
    /// Names of the sender's interfaces that can announce.
    pub interfaces: BTreeSet<String>,
    /// The peers the sender hears now, each with whether its heartbeat said `ready` (what the
    /// quorum rule, [`crate::quorum`], counts) and which heartbeat of it was heard last (what
    /// [`crate::tenure`] turns into how long the sender keeps hearing it).
    pub hears: BTreeMap<String, Heard>,
}

/// What a heartbeat says of one peer its sender hears.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Heard {
    /// The peer's last heartbeat said `ready`.
    pub ready: bool,
    /// The boot of the peer's last heartbeat heard.
    pub boot: u64,
    /// Its sequence number: the peer knows when it sent it, hence the earliest instant the
    /// sender can stop hearing it. 0 (no heartbeat has it): heard, but not yet for long enough
    /// to acknowledge (`Membership::hears`).
    pub seq: u64,
}

/// Most peers a heartbeat can list (the count is 16 bits; a datagram stays under 64 KiB with
/// names of up to 253 bytes only for far fewer, so the speaker's buffer is sized for the
/// datagram, not this).
pub const MAX_HEARS: usize = u16::MAX as usize;

/// Why a datagram was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HeartbeatError {
    /// Too short, wrong magic, or lengths that do not add up.
    #[error("malformed heartbeat")]
    Malformed,
    /// The tag does not match: another key, or forged.
    #[error("heartbeat fails authentication (is the gossip key the same on every node?)")]
    BadTag,
    /// Sent too long ago or in the future: a replay, or clocks far apart.
    #[error("heartbeat timestamp {skew_ms} ms away from ours")]
    Clock {
        /// Distance between the two clocks, milliseconds.
        skew_ms: u64,
    },
    /// Not newer than one already accepted from the same sender.
    #[error("replayed heartbeat")]
    Replay,
    /// A name or list too long for the format.
    #[error("heartbeat field too long: {0}")]
    TooLong(&'static str),
    /// From a name that is not a node of the cluster (once the node list is known).
    #[error("heartbeat from {0:?}, which is not a node of the cluster")]
    UnknownNode(String),
    /// From a new name while the table holds [`MAX_PEERS`] and the node list is not known yet.
    #[error("heartbeat from {0:?}: the peer table is full until the node list is known")]
    TableFull(String),
}

impl Heartbeat {
    /// Encodes and signs the heartbeat.
    pub fn encode(&self, key: &[u8]) -> Result<Vec<u8>, HeartbeatError> {
        let mut out = Vec::with_capacity(64 + self.node.len());
        out.extend_from_slice(MAGIC);
        let flags = if self.ready { FLAG_READY } else { 0 }
            | if self.leaving { FLAG_LEAVING } else { 0 }
            | if self.restarting { FLAG_RESTARTING } else { 0 };
        out.push(flags);
        out.extend_from_slice(&self.boot.to_be_bytes());
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.extend_from_slice(&self.unix_ms.to_be_bytes());
        push_str(&mut out, &self.node, "node name")?;
        let count = u8::try_from(self.interfaces.len())
            .map_err(|_| HeartbeatError::TooLong("interfaces"))?;
        out.push(count);
        for name in &self.interfaces {
            push_str(&mut out, name, "interface name")?;
        }
        let count =
            u16::try_from(self.hears.len()).map_err(|_| HeartbeatError::TooLong("hears"))?;
        out.extend_from_slice(&count.to_be_bytes());
        for (name, heard) in &self.hears {
            out.push(u8::from(heard.ready));
            out.extend_from_slice(&heard.boot.to_be_bytes());
            out.extend_from_slice(&heard.seq.to_be_bytes());
            push_str(&mut out, name, "peer name")?;
        }
        let tag = mac(key).chain_update(&out).finalize().into_bytes();
        out.extend_from_slice(&tag[..TAG_LEN]);
        Ok(out)
    }

    /// Checks the tag, then decodes. Never panics, whatever the bytes.
    pub fn decode(bytes: &[u8], key: &[u8]) -> Result<Self, HeartbeatError> {
        let (body, tag) = split_tag(bytes)?;
        if !verifies(key, body, tag) {
            return Err(HeartbeatError::BadTag);
        }
        Self::parse(body)
    }

    /// Checks the tag against each key of `keys` in turn, then decodes; also returns the
    /// position of the key that verified (0: the signing key). Never panics, whatever the bytes.
    pub fn decode_with(bytes: &[u8], keys: &KeyRing) -> Result<(Self, usize), HeartbeatError> {
        let (body, tag) = split_tag(bytes)?;
        let index = keys
            .keys
            .iter()
            .position(|key| verifies(key, body, tag))
            .ok_or(HeartbeatError::BadTag)?;
        Ok((Self::parse(body)?, index))
    }

    fn parse(body: &[u8]) -> Result<Self, HeartbeatError> {
        let mut r = Reader(body);
        if r.take(4)? != MAGIC {
            return Err(HeartbeatError::Malformed);
        }
        let flags = r.u8()?;
        // Unknown flags are refused, not ignored: a heartbeat means exactly what its bytes say
        // (a new flag comes with a new version byte), and decoding then encoding gives the same
        // bytes (the fuzz target checks it).
        if flags & !(FLAG_READY | FLAG_LEAVING | FLAG_RESTARTING) != 0 {
            return Err(HeartbeatError::Malformed);
        }
        let boot = r.u64()?;
        let seq = r.u64()?;
        let unix_ms = r.u64()?;
        let node = r.string()?;
        let count = r.u8()?;
        let mut interfaces = BTreeSet::new();
        for _ in 0..count {
            if !interfaces.insert(r.string()?) {
                return Err(HeartbeatError::Malformed);
            }
        }
        let count = u16::from_be_bytes([r.u8()?, r.u8()?]);
        let mut hears = BTreeMap::new();
        for _ in 0..count {
            let ready = match r.u8()? {
                0 => false,
                1 => true,
                _ => return Err(HeartbeatError::Malformed),
            };
            let heard = Heard {
                ready,
                boot: r.u64()?,
                seq: r.u64()?,
            };
            let name = r.string()?;
            if name.is_empty() || hears.insert(name, heard).is_some() {
                return Err(HeartbeatError::Malformed);
            }
        }
        if !r.0.is_empty() || node.is_empty() {
            return Err(HeartbeatError::Malformed);
        }
        Ok(Heartbeat {
            node,
            boot,
            seq,
            unix_ms,
            ready: flags & FLAG_READY != 0,
            leaving: flags & FLAG_LEAVING != 0,
            restarting: flags & FLAG_RESTARTING != 0,
            interfaces,
            hears,
        })
    }
}

fn split_tag(bytes: &[u8]) -> Result<(&[u8], &[u8]), HeartbeatError> {
    let body_len = bytes
        .len()
        .checked_sub(TAG_LEN)
        .ok_or(HeartbeatError::Malformed)?;
    Ok(bytes.split_at(body_len))
}

fn verifies(key: &[u8], body: &[u8], tag: &[u8]) -> bool {
    // Constant-time comparison (the hmac crate's).
    mac(key)
        .chain_update(body)
        .verify_truncated_left(tag)
        .is_ok()
}

fn mac(key: &[u8]) -> HmacSha256 {
    // HMAC takes keys of any length; the error case cannot happen for HMAC.
    <HmacSha256 as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!())
}

fn push_str(out: &mut Vec<u8>, s: &str, what: &'static str) -> Result<(), HeartbeatError> {
    let len = u8::try_from(s.len()).map_err(|_| HeartbeatError::TooLong(what))?;
    out.push(len);
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], HeartbeatError> {
        if self.0.len() < n {
            return Err(HeartbeatError::Malformed);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, HeartbeatError> {
        Ok(self.take(1)?[0])
    }
    fn u64(&mut self) -> Result<u64, HeartbeatError> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_be_bytes(b))
    }
    fn string(&mut self) -> Result<String, HeartbeatError> {
        let len = usize::from(self.u8()?);
        String::from_utf8(self.take(len)?.to_vec()).map_err(|_| HeartbeatError::Malformed)
    }
}

/// What the table keeps of a peer.
#[derive(Clone, Debug)]
struct Peer {
    heard: Instant,
    ready: bool,
    leaving: bool,
    interfaces: BTreeSet<String>,
    hears: BTreeMap<String, Heard>,
    /// Since when it has been heard without a silence of the failure timeout.
    heard_since: Instant,
    /// Kept as a candidate until then: it said it is being replaced (restart hold), and its
    /// successor has not said `ready` yet.
    held_until: Option<Instant>,
    /// Boot and sequence number of the heartbeat that set `heard`: what this node's own
    /// heartbeats say it heard last from the peer.
    last: (u64, u64),
    order: Order,
}

/// What the table remembers of a peer's heartbeats to tell new ones from replays (module docs,
/// rules 2 to 4).
#[derive(Clone, Debug)]
struct Order {
    /// Boots heard, each with the highest sequence number accepted from it; the boot heard last
    /// is at the end. At most [`MAX_BOOTS`].
    boots: Vec<(u64, u64)>,
    /// The highest timestamp recorded (capped, rule 4) for the node, any boot.
    newest_ms: u64,
    /// The estimate of the sender's clock: `clock_ms` at `clock_at`, advancing with our
    /// monotonic clock.
    clock_ms: u64,
    clock_at: Instant,
    /// Heartbeats accepted with a timestamp beyond the cap, as (boot, seq, timestamp), while
    /// their timestamp is above `newest_ms`: the time rule alone would take them again. At most
    /// [`MAX_AHEAD`], oldest first.
    ahead: VecDeque<(u64, u64, u64)>,
}

/// Heartbeats remembered per peer as accepted ahead of the clock estimate: enough for the
/// estimate to catch up with a sender whose clock jumped a whole clock window forward, one
/// heartbeat at a time.
const MAX_AHEAD: usize = 128;

impl Order {
    /// The state after the first heartbeat heard from a peer. With nothing known of its clock,
    /// ours stands in for it (rule 4).
    fn first(beat: &Heartbeat, now: Instant, unix_ms: u64) -> Self {
        let mut order = Order {
            boots: Vec::new(),
            newest_ms: 0,
            clock_ms: unix_ms,
            clock_at: now,
            ahead: VecDeque::new(),
        };
        order.record(beat, now);
        order
    }

    /// The sender's clock at `now`, as estimated.
    fn clock(&self, now: Instant) -> u64 {
        let elapsed = u64::try_from(now.saturating_duration_since(self.clock_at).as_millis())
            .unwrap_or(u64::MAX);
        self.clock_ms.saturating_add(elapsed)
    }

    /// Decides whether `beat` is new (rules 2 and 3) and, if so, records it (rule 4).
    fn admit(&mut self, beat: &Heartbeat, now: Instant) -> Result<(), HeartbeatError> {
        if self.ahead.contains(&(beat.boot, beat.seq, beat.unix_ms)) {
            // Accepted before with a capped timestamp: the time rule alone would take it again.
            return Err(HeartbeatError::Replay);
        }
        let current = self
            .boots
            .last()
            .is_some_and(|&(boot, _)| boot == beat.boot);
        if !current && beat.unix_ms.saturating_add(BOOT_TOLERANCE_MS) < self.newest_ms {
            // An earlier boot's capture, or a restart after a clock step back beyond the
            // tolerance (refused until the sender's clock catches up).
            return Err(HeartbeatError::Replay);
        }
        let known = self.boots.iter().find(|&&(boot, _)| boot == beat.boot);
        // The second arm is what a forged `seq` cannot close for good: real heartbeats pass it
        // once their timestamps pass the (capped) newest.
        if known.is_some_and(|&(_, seq)| beat.seq <= seq && beat.unix_ms <= self.newest_ms) {
            return Err(HeartbeatError::Replay);
        }
        self.record(beat, now);
        Ok(())
    }

    /// Records an accepted heartbeat: its sequence for its boot, its timestamp capped at the
    /// clock estimate plus [`MAX_LEAD_MS`]. A capped one moves the estimate on by the lead and is
    /// remembered until the recorded time passes it.
    fn record(&mut self, beat: &Heartbeat, now: Instant) {
        let cap = self.clock(now).saturating_add(MAX_LEAD_MS);
        if beat.unix_ms > cap {
            self.clock_ms = cap;
            self.clock_at = now;
            if self.ahead.len() >= MAX_AHEAD {
                self.ahead.pop_front();
            }
            self.ahead.push_back((beat.boot, beat.seq, beat.unix_ms));
        }
        self.newest_ms = self.newest_ms.max(beat.unix_ms.min(cap));
        let newest = self.newest_ms;
        self.ahead.retain(|&(_, _, ts)| ts > newest);
        let seq = match self.boots.iter().position(|&(boot, _)| boot == beat.boot) {
            Some(i) => self.boots.remove(i).1.max(beat.seq),
            None => {
                if self.boots.len() >= MAX_BOOTS {
                    self.boots.remove(0);
                }
                beat.seq
            }
        };
        self.boots.push((beat.boot, seq));
    }
}

/// The restart hold of a peer after its heartbeat `beat` (the hold it had: `held`): set when it
/// leaves to be replaced, kept while its successor is not ready yet, ended when a heartbeat says
/// `ready` (the successor has taken over, or the old process did not leave after all).
fn hold_of(
    held: Option<Instant>,
    beat: &Heartbeat,
    now: Instant,
    hold: Duration,
) -> Option<Instant> {
    if beat.leaving && beat.restarting && !hold.is_zero() {
        Some(held.filter(|until| *until > now).unwrap_or(now + hold))
    } else if beat.ready && !beat.leaving {
        None
    } else {
        held
    }
}

/// Whether two reports name the same peers with the same `ready`.
fn same_hearing(a: &BTreeMap<String, Heard>, b: &BTreeMap<String, Heard>) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|((na, ha), (nb, hb))| na == nb && ha.ready == hb.ready)
}

/// A live speaker as planning sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Member {
    /// Interfaces that can announce.
    pub interfaces: BTreeSet<String>,
    /// Not heard directly, only reported by others: its interfaces are not known, so planning
    /// counts it able to announce anywhere (see [`crate::quorum`] on why doubt goes that way).
    pub interfaces_unknown: bool,
}

/// The speakers this one hears, with the rules that make a heartbeat count.
#[derive(Debug)]
pub struct Membership {
    me: String,
    timeout: Duration,
    /// How long a peer that leaves to be replaced stays a candidate (0: not at all).
    restart_hold: Duration,
    peers: BTreeMap<String, Peer>,
    /// The cluster's nodes once known: only they are tracked.
    nodes: Option<BTreeSet<String>>,
}

impl Membership {
    /// A table for speaker `me`, counting a peer dead `timeout` after its last heartbeat.
    pub fn new(me: impl Into<String>, timeout: Duration) -> Self {
        Membership {
            me: me.into(),
            timeout,
            restart_hold: Duration::ZERO,
            peers: BTreeMap::new(),
            nodes: None,
        }
    }

    /// Sets how long a peer that leaves to be replaced (`restarting`) stays a candidate for its
    /// IPs, so a rolling update does not move them away and back (0: it does not).
    pub fn set_restart_hold(&mut self, hold: Duration) {
        self.restart_hold = hold;
    }

    /// Sets the names of the cluster's nodes: peers that are not among them are forgotten, and
    /// from now on heartbeats from other names are refused, so the table holds at most one
    /// entry per node whatever arrives. Returns how many peers were forgotten.
    pub fn set_nodes(&mut self, nodes: BTreeSet<String>) -> usize {
        if self.nodes.as_ref() == Some(&nodes) {
            return 0;
        }
        let before = self.peers.len();
        self.peers.retain(|name, _| nodes.contains(name));
        self.nodes = Some(nodes);
        before - self.peers.len()
    }

    /// Takes in a decoded heartbeat received at `now` (monotonic) when our wall clock read
    /// `unix_ms`. Returns whether the set of live members may have changed.
    pub fn receive(
        &mut self,
        beat: Heartbeat,
        now: Instant,
        unix_ms: u64,
    ) -> Result<bool, HeartbeatError> {
        if beat.node == self.me {
            // Our own datagram, looped back or sent by a clone with our name: never trusted.
            return Ok(false);
        }
        if self
            .nodes
            .as_ref()
            .is_some_and(|nodes| !nodes.contains(&beat.node))
        {
            return Err(HeartbeatError::UnknownNode(beat.node));
        }
        let skew_ms = unix_ms.abs_diff(beat.unix_ms);
        if skew_ms > CLOCK_WINDOW_MS {
            return Err(HeartbeatError::Clock { skew_ms });
        }
        let was_alive = self.is_alive(&beat.node, now);
        if let Some(peer) = self.peers.get_mut(&beat.node) {
            peer.order.admit(&beat, now)?;
            let changed = peer.ready != beat.ready
                || peer.leaving != beat.leaving
                || peer.interfaces != beat.interfaces
                // Acknowledgements move with every heartbeat; only who is heard, and ready,
                // changes a plan.
                || !same_hearing(&peer.hears, &beat.hears);
            let hold_before = peer.held_until;
            peer.held_until = hold_of(peer.held_until, &beat, now, self.restart_hold);
            if now.saturating_duration_since(peer.heard) > self.timeout || peer.leaving {
                // Heard again after a silence: its reports without this peer may still be in
                // use elsewhere, so acknowledging starts over.
                peer.heard_since = now;
            }
            peer.heard = now;
            peer.last = (beat.boot, beat.seq);
            peer.ready = beat.ready;
            peer.leaving = beat.leaving;
            peer.interfaces = beat.interfaces;
            peer.hears = beat.hears;
            return Ok(changed || !was_alive || hold_before != peer.held_until);
        }
        if self.nodes.is_none() && self.peers.len() >= MAX_PEERS {
            return Err(HeartbeatError::TableFull(beat.node));
        }
        let order = Order::first(&beat, now, unix_ms);
        let held_until = hold_of(None, &beat, now, self.restart_hold);
        self.peers.insert(
            beat.node,
            Peer {
                heard: now,
                heard_since: now,
                held_until,
                last: (beat.boot, beat.seq),
                ready: beat.ready,
                leaving: beat.leaving,
                interfaces: beat.interfaces,
                hears: beat.hears,
                order,
            },
        );
        Ok(true)
    }

    fn is_alive(&self, node: &str, now: Instant) -> bool {
        self.peers.get(node).is_some_and(|p| {
            p.ready && !p.leaving && now.saturating_duration_since(p.heard) <= self.timeout
        })
    }

    /// Peers alive at `now`: heard within the timeout, ready, not leaving. This speaker is not
    /// in it; the caller adds itself when it is ready.
    pub fn alive(&self, now: Instant) -> BTreeMap<String, Member> {
        self.peers
            .iter()
            .filter(|(name, _)| self.is_alive(name, now))
            .map(|(name, p)| {
                (
                    name.clone(),
                    Member {
                        interfaces: p.interfaces.clone(),
                        interfaces_unknown: false,
                    },
                )
            })
            .collect()
    }

    fn is_fresh(&self, peer: &Peer, now: Instant) -> bool {
        !peer.leaving && now.saturating_duration_since(peer.heard) <= self.timeout
    }

    /// The peers heard now (within the timeout, not leaving), each with whether it said
    /// `ready` and the heartbeat heard last: what this speaker's own heartbeat reports.
    pub fn hears(&self, now: Instant) -> BTreeMap<String, Heard> {
        self.peers
            .iter()
            .filter_map(|(name, p)| {
                let heard = if self.is_fresh(p, now) {
                    let acknowledged =
                        now.saturating_duration_since(p.heard_since) >= self.ack_after();
                    Heard {
                        ready: p.ready,
                        boot: p.last.0,
                        seq: if acknowledged { p.last.1 } else { 0 },
                    }
                } else if self.is_held(p, now) {
                    // Gone to be replaced: reported ready so that peers that missed its
                    // `restarting` keep it a candidate too; nothing is acknowledged.
                    Heard {
                        ready: true,
                        boot: p.last.0,
                        seq: 0,
                    }
                } else {
                    return None;
                };
                Some((name.clone(), heard))
            })
            .collect()
    }

    fn is_held(&self, peer: &Peer, now: Instant) -> bool {
        peer.held_until.is_some_and(|until| now < until)
    }

    /// How long a peer must have been heard without a silence before this node's heartbeats
    /// acknowledge it: one and a half failure timeouts. Before that, reports of ours that do
    /// not list the peer may still be the latest some other node holds of us (for up to a
    /// failure timeout after they arrived there, half a timeout allowed for delivery); an
    /// acknowledgement would let the peer count on us hearing it while they still say we do
    /// not ([`crate::tenure`]).
    fn ack_after(&self) -> Duration {
        self.timeout + self.timeout / 2
    }

    /// For each peer whose last heartbeat (however old) names this speaker under boot `boot`
    /// (ours), what it said of us: the sequence number of ours it heard last (what
    /// [`crate::tenure`] counts) and whether that said `ready` (what
    /// [`crate::quorum::seen_ready`] counts). A peer's earlier boots' reports were replaced by
    /// its later ones.
    pub fn acks(&self, boot: u64) -> BTreeMap<String, Heard> {
        self.peers
            .iter()
            .filter_map(|(name, p)| {
                let heard = p.hears.get(&self.me)?;
                (heard.boot == boot).then(|| (name.clone(), *heard))
            })
            .collect()
    }

    /// What every peer heard now said last, and every peer held for a restart, for the quorum
    /// rule.
    pub fn reports(&self, now: Instant) -> BTreeMap<String, crate::quorum::Report> {
        self.peers
            .iter()
            .filter(|(_, p)| self.is_fresh(p, now) || self.is_held(p, now))
            .map(|(name, p)| {
                let fresh = self.is_fresh(p, now);
                (
                    name.clone(),
                    crate::quorum::Report {
                        fresh,
                        ready: p.ready,
                        held: self.is_held(p, now),
                        hears: if fresh {
                            p.hears.iter().map(|(n, h)| (n.clone(), h.ready)).collect()
                        } else {
                            BTreeMap::new()
                        },
                        interfaces: p.interfaces.clone(),
                    },
                )
            })
            .collect()
    }

    /// The earliest instant at which a heard peer times out or a restart hold ends, for the
    /// driver's next check.
    pub fn next_silence(&self, now: Instant) -> Option<Instant> {
        self.peers
            .values()
            .filter(|p| self.is_fresh(p, now))
            .map(|p| p.heard + self.timeout)
            .chain(
                self.peers
                    .values()
                    .filter_map(|p| p.held_until.filter(|until| *until > now)),
            )
            .min()
    }

    /// The earliest instant at which a live peer times out, for the driver's next check.
    pub fn next_expiry(&self, now: Instant) -> Option<Instant> {
        self.peers
            .keys()
            .filter(|name| self.is_alive(name, now))
            .filter_map(|name| self.peers.get(name))
            .map(|p| p.heard + self.timeout)
            .min()
    }

    /// Peers heard at any time (alive or not), for metrics and logs.
    pub fn known(&self) -> usize {
        self.peers.len()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use proptest::prelude::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn beat(node: &str, seq: u64) -> Heartbeat {
        Heartbeat {
            node: node.into(),
            boot: 7,
            seq,
            unix_ms: 1_000_000,
            ready: true,
            leaving: false,
            restarting: false,
            interfaces: ["eth0".to_string()].into(),
            hears: [
                ("node3".to_string(), heard(true, 3, 40)),
                ("node4".to_string(), heard(false, 4, 50)),
            ]
            .into(),
        }
    }

    fn heard(ready: bool, boot: u64, seq: u64) -> Heard {
        Heard { ready, boot, seq }
    }

    #[test]
    fn round_trips_and_authenticates() {
        let b = beat("node2", 1);
        let bytes = b.encode(KEY).unwrap();
        assert_eq!(Heartbeat::decode(&bytes, KEY).unwrap(), b);
        assert_eq!(
            Heartbeat::decode(&bytes, b"another key"),
            Err(HeartbeatError::BadTag)
        );
        let mut flipped = bytes.clone();
        flipped[10] ^= 1;
        assert_eq!(
            Heartbeat::decode(&flipped, KEY),
            Err(HeartbeatError::BadTag)
        );
        assert_eq!(
            Heartbeat::decode(&bytes[..30], KEY),
            Err(HeartbeatError::BadTag)
        );
        assert_eq!(
            Heartbeat::decode(&bytes[..10], KEY),
            Err(HeartbeatError::Malformed)
        );
        assert_eq!(Heartbeat::decode(&[], KEY), Err(HeartbeatError::Malformed));
    }

    /// The wire format, pinned: speakers of two builds must read each other's heartbeats.
    #[test]
    fn encodes_byte_exact() {
        let b = Heartbeat {
            node: "n1".into(),
            boot: 0x0102_0304_0506_0708,
            seq: 9,
            unix_ms: 0x0000_0190_0000_0000,
            ready: true,
            leaving: false,
            restarting: false,
            interfaces: ["e0".to_string()].into(),
            hears: [
                ("n2".to_string(), heard(true, 0x11, 0x0100)),
                ("n3".to_string(), heard(false, 0x22, 3)),
            ]
            .into(),
        };
        let bytes = b.encode(KEY).unwrap();
        let body = [
            &b"FLB\x03"[..],
            &[0x01],
            &[1, 2, 3, 4, 5, 6, 7, 8],
            &[0, 0, 0, 0, 0, 0, 0, 9],
            &[0, 0, 1, 0x90, 0, 0, 0, 0],
            &[2, b'n', b'1'],
            &[1, 2, b'e', b'0'],
            // Two peers heard: ready, boot, sequence number, name.
            &[0, 2],
            &[1, 0, 0, 0, 0, 0, 0, 0, 0x11, 0, 0, 0, 0, 0, 0, 1, 0],
            &[2, b'n', b'2'],
            &[0, 0, 0, 0, 0, 0, 0, 0, 0x22, 0, 0, 0, 0, 0, 0, 0, 3],
            &[2, b'n', b'3'],
        ]
        .concat();
        assert_eq!(&bytes[..body.len()], &body[..]);
        assert_eq!(bytes.len(), body.len() + TAG_LEN);
        // HMAC-SHA-256 of the body, first 16 bytes (checked with Python's hmac module).
        assert_eq!(
            hex(&bytes[body.len()..]),
            "fe10aea4429d885cab738fedadffd787"
        );
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn hears_and_reports_list_fresh_peers_only() {
        let t0 = Instant::now();
        let mut m = Membership::new("node1", Duration::from_millis(500));
        m.receive(beat("node2", 1), t0, 1_000_000).unwrap();
        let mut b = beat("node3", 1);
        b.ready = false;
        m.receive(b, t0 + Duration::from_millis(300), 1_000_000)
            .unwrap();
        let now = t0 + Duration::from_millis(400);
        // Each with the boot heard last (7); not heard long enough yet to acknowledge a
        // sequence number.
        assert_eq!(
            m.hears(now),
            [
                ("node2".to_string(), heard(true, 7, 0)),
                ("node3".to_string(), heard(false, 7, 0)),
            ]
            .into()
        );
        let reports = m.reports(now);
        assert_eq!(
            reports["node2"].hears,
            [("node3".to_string(), true), ("node4".to_string(), false)].into()
        );
        assert!(!reports["node3"].ready);
        assert_eq!(m.next_silence(now), Some(t0 + Duration::from_millis(500)));
        // node2 falls silent; a leaving node3 is not heard either.
        let later = t0 + Duration::from_millis(501);
        assert_eq!(m.hears(later).keys().collect::<Vec<_>>(), ["node3"]);
        let mut leaving = beat("node3", 2);
        leaving.leaving = true;
        m.receive(leaving, later, 1_000_000).unwrap();
        assert!(m.hears(later).is_empty());
        assert!(m.reports(later).is_empty());
    }

    #[test]
    fn acks_name_our_heartbeats_heard_last_under_our_boot_only() {
        let t0 = Instant::now();
        let mut m = Membership::new("node1", Duration::from_millis(500));
        let mut b = beat("node2", 1);
        b.hears.insert("node1".into(), heard(true, 5, 41));
        m.receive(b, t0, 1_000_000).unwrap();
        // node3 last heard a heartbeat of our previous boot.
        let mut b = beat("node3", 1);
        b.hears.insert("node1".into(), heard(true, 4, 900));
        m.receive(b, t0, 1_000_000).unwrap();
        assert_eq!(
            m.acks(5),
            [("node2".to_string(), heard(true, 5, 41))].into()
        );
        // Its next heartbeat replaces the acknowledgement; one that no longer names us drops it.
        let mut b = beat("node2", 2);
        b.hears.insert("node1".into(), heard(true, 5, 43));
        m.receive(b, t0 + Duration::from_millis(100), 1_000_100)
            .unwrap();
        assert_eq!(m.acks(5)["node2"].seq, 43);
        m.receive(beat("node2", 3), t0 + Duration::from_millis(200), 1_000_200)
            .unwrap();
        assert!(m.acks(5).is_empty());
    }

    #[test]
    fn a_peer_is_acknowledged_only_once_heard_without_a_silence_for_a_while() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut m = Membership::new("node1", ms(500));
        let mut receive = |seq: u64, at: u64| {
            m.receive(beat("node2", seq), t0 + ms(at), 1_000_000 + at)
                .unwrap();
            m.hears(t0 + ms(at))["node2"].seq
        };
        // Heard every 100 ms: acknowledged from 750 ms on, with the sequence heard last.
        for seq in 0..8 {
            assert_eq!(receive(seq + 1, 100 * seq), 0);
        }
        assert_eq!(receive(9, 800), 9);
        // A silence longer than the timeout starts it over.
        assert_eq!(receive(10, 1_400), 0);
        for seq in 11..18 {
            assert_eq!(receive(seq, 100 * (seq + 4)), 0, "{seq}");
        }
        assert_eq!(receive(18, 2_200), 18);
    }

    #[test]
    fn a_peer_leaving_to_be_replaced_is_held_until_its_successor_is_ready() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut m = Membership::new("node1", ms(500));
        m.set_restart_hold(Duration::from_secs(10));
        m.receive(beat("node2", 1), t0, 1_000_000).unwrap();
        let mut leaving = beat("node2", 2);
        leaving.leaving = true;
        leaving.restarting = true;
        leaving.ready = false;
        assert!(m.receive(leaving, t0 + ms(100), 1_000_100).unwrap());
        // Not heard, but held: reported (ready, unacknowledged) and a candidate.
        let at = t0 + ms(2_000);
        assert_eq!(m.hears(at)["node2"], heard(true, 7, 0));
        let report = &m.reports(at)["node2"];
        assert!(report.held && !report.fresh);
        assert_eq!(m.next_silence(at), Some(t0 + ms(10_100)));
        // The successor (another boot) starts not ready: still held, now heard.
        let mut successor = beat_at("node2", 8, 1, 1_003_000);
        successor.ready = false;
        m.receive(successor.clone(), t0 + ms(3_000), 1_003_000)
            .unwrap();
        let report = &m.reports(t0 + ms(3_000))["node2"];
        assert!(report.held && report.fresh && !report.ready);
        // Ready: the hold ends.
        let ready = Heartbeat {
            seq: 2,
            ready: true,
            ..successor
        };
        assert!(m.receive(ready, t0 + ms(3_100), 1_003_100).unwrap());
        assert!(!m.reports(t0 + ms(3_100))["node2"].held);
    }

    #[test]
    fn the_hold_ends_after_its_time_and_is_off_by_default() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut leaving = beat("node2", 2);
        leaving.leaving = true;
        leaving.restarting = true;
        let mut m = Membership::new("node1", ms(500));
        m.set_restart_hold(Duration::from_secs(10));
        m.receive(leaving.clone(), t0, 1_000_000).unwrap();
        assert!(m.reports(t0 + ms(9_999)).contains_key("node2"));
        assert!(m.reports(t0 + ms(10_000)).is_empty());
        assert!(m.hears(t0 + ms(10_000)).is_empty());
        // Without a hold (the default), leaving to be replaced is leaving.
        let mut m = Membership::new("node1", ms(500));
        m.receive(leaving, t0, 1_000_000).unwrap();
        assert!(m.reports(t0).is_empty());
    }

    #[test]
    fn a_new_acknowledgement_alone_does_not_wake_planning() {
        let t0 = Instant::now();
        let mut m = Membership::new("node1", Duration::from_millis(500));
        assert!(m.receive(beat("node2", 1), t0, 1_000_000).unwrap());
        let mut b = beat("node2", 2);
        b.hears.get_mut("node3").unwrap().seq += 1;
        assert!(!m.receive(b, t0, 1_000_000).unwrap());
        let mut b = beat("node2", 3);
        b.hears.get_mut("node3").unwrap().ready = false;
        assert!(m.receive(b, t0, 1_000_000).unwrap());
    }

    #[test]
    fn malformed_hears_lists_are_refused() {
        let mut b = beat("node2", 1);
        b.hears.clear();
        let bytes = b.encode(KEY).unwrap();
        // Replace the empty list with one entry whose ready byte is 2, and sign again.
        let body_len = bytes.len() - TAG_LEN;
        let mut body = bytes[..body_len - 2].to_vec();
        body.extend_from_slice(&[0, 1, 2]);
        body.extend_from_slice(&[0; 16]);
        body.extend_from_slice(&[1, b'x']);
        let tag = mac(KEY).chain_update(&body).finalize().into_bytes();
        body.extend_from_slice(&tag[..TAG_LEN]);
        assert_eq!(
            Heartbeat::decode(&body, KEY),
            Err(HeartbeatError::Malformed)
        );
    }

    #[test]
    fn unknown_flags_are_refused_so_decoding_gives_back_the_same_bytes() {
        // Found by the fuzz target: a flag bit the decoder ignored made decode-then-encode
        // change the bytes.
        let bytes = beat("node2", 1).encode(KEY).unwrap();
        let body_len = bytes.len() - TAG_LEN;
        for flag in [0x08u8, 0x80] {
            let mut body = bytes[..body_len].to_vec();
            body[4] |= flag;
            let tag = mac(KEY).chain_update(&body).finalize().into_bytes();
            body.extend_from_slice(&tag[..TAG_LEN]);
            assert_eq!(
                Heartbeat::decode(&body, KEY),
                Err(HeartbeatError::Malformed),
                "flag {flag:#x}"
            );
        }
    }

    #[test]
    fn peers_live_until_timeout_and_leave_at_once() {
        let t0 = Instant::now();
        let mut m = Membership::new("node1", Duration::from_millis(500));
        assert!(m.receive(beat("node2", 1), t0, 1_000_000).unwrap());
        assert!(
            !m.receive(beat("node2", 2), t0 + Duration::from_millis(100), 1_000_100)
                .unwrap()
        );
        assert_eq!(
            m.alive(t0 + Duration::from_millis(600))
                .keys()
                .collect::<Vec<_>>(),
            ["node2"]
        );
        assert!(m.alive(t0 + Duration::from_millis(601)).is_empty());
        let mut leaving = beat("node2", 3);
        leaving.leaving = true;
        assert!(
            m.receive(leaving, t0 + Duration::from_millis(200), 1_000_200)
                .unwrap()
        );
        assert!(m.alive(t0 + Duration::from_millis(200)).is_empty());
    }

    #[test]
    fn refuses_replays_clock_skew_and_itself() {
        let t0 = Instant::now();
        let mut m = Membership::new("node1", Duration::from_millis(500));
        m.receive(beat("node2", 5), t0, 1_000_000).unwrap();
        assert_eq!(
            m.receive(beat("node2", 5), t0, 1_000_000),
            Err(HeartbeatError::Replay)
        );
        assert_eq!(
            m.receive(beat("node2", 4), t0, 1_000_000),
            Err(HeartbeatError::Replay)
        );
        // An older boot's capture replayed: new boot id, old timestamp.
        let mut old_boot = beat("node2", 99);
        old_boot.boot = 3;
        old_boot.unix_ms = 1_000_000 - BOOT_TOLERANCE_MS - 1;
        assert_eq!(
            m.receive(old_boot, t0, 1_000_000),
            Err(HeartbeatError::Replay)
        );
        // A real restart: new boot, later time, sequence starting over.
        let mut restarted = beat("node2", 1);
        restarted.boot = 8;
        restarted.unix_ms = 1_000_500;
        assert!(m.receive(restarted, t0, 1_000_500).is_ok());
        assert!(matches!(
            m.receive(beat("node3", 1), t0, 1_000_000 + CLOCK_WINDOW_MS + 1),
            Err(HeartbeatError::Clock { .. })
        ));
        assert!(!m.receive(beat("node1", 1), t0, 1_000_000).unwrap());
        assert!(!m.alive(t0).contains_key("node1"));
    }

    #[test]
    fn not_ready_peers_do_not_count() {
        let t0 = Instant::now();
        let mut m = Membership::new("node1", Duration::from_millis(500));
        let mut b = beat("node2", 1);
        b.ready = false;
        m.receive(b, t0, 1_000_000).unwrap();
        assert!(m.alive(t0).is_empty());
        assert_eq!(m.known(), 1);
        assert!(m.receive(beat("node2", 2), t0, 1_000_000).unwrap());
        assert_eq!(m.next_expiry(t0), Some(t0 + Duration::from_millis(500)));
    }

    fn beat_at(node: &str, boot: u64, seq: u64, unix_ms: u64) -> Heartbeat {
        Heartbeat {
            boot,
            unix_ms,
            ..beat(node, seq)
        }
    }

    /// One authenticated datagram with the highest sequence number (anyone holding the key can
    /// send it) must not make the sender's real heartbeats replays until it restarts.
    #[test]
    fn a_forged_sequence_number_does_not_lock_the_sender_out() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut m = Membership::new("node1", ms(500));
        m.receive(beat_at("node2", 7, 1, 1_000_000), t0, 1_000_000)
            .unwrap();
        m.receive(
            beat_at("node2", 7, u64::MAX, 1_000_050),
            t0 + ms(50),
            1_000_050,
        )
        .unwrap();
        // The real sender goes on, one heartbeat every 100 ms: accepted again within a second
        // and a heartbeat.
        assert_real_sender_heard_again(&mut m, t0);
    }

    /// The real node2 (boot 7) goes on sending one heartbeat every 100 ms from `t0`: it must be
    /// heard again within about a second, and from then on every heartbeat counts.
    fn assert_real_sender_heard_again(m: &mut Membership, t0: Instant) {
        let accepted: Vec<u64> = (2..40)
            .filter(|&seq| {
                let at = 100 * (seq - 1);
                m.receive(
                    beat_at("node2", 7, seq, 1_000_000 + at),
                    t0 + Duration::from_millis(at),
                    1_000_000 + at,
                )
                .is_ok()
            })
            .collect();
        assert!(accepted.first().is_some_and(|&s| s <= 12), "{accepted:?}");
        assert!((12..40).all(|s| accepted.contains(&s)), "{accepted:?}");
    }

    /// A forged new boot stamped at the far edge of the clock window must not make the real
    /// boot's heartbeats replays for the rest of the window.
    #[test]
    fn a_forged_boot_from_the_future_does_not_lock_the_sender_out() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut m = Membership::new("node1", ms(500));
        m.receive(beat_at("node2", 7, 1, 1_000_000), t0, 1_000_000)
            .unwrap();
        m.receive(
            beat_at("node2", 99, 1, 1_000_000 + CLOCK_WINDOW_MS),
            t0 + ms(10),
            1_000_010,
        )
        .unwrap();
        assert_real_sender_heard_again(&mut m, t0);
    }

    /// A speaker restarted after its clock stepped back a few seconds is heard at once.
    #[test]
    fn a_restart_after_the_clock_stepped_back_is_accepted() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut m = Membership::new("node1", ms(500));
        m.receive(beat_at("node2", 7, 500, 1_000_000), t0, 1_000_000)
            .unwrap();
        // Clock stepped back 5 s, process restarted 1 s later.
        m.receive(beat_at("node2", 8, 1, 996_000), t0 + ms(1_000), 1_001_000)
            .unwrap();
        m.receive(beat_at("node2", 8, 2, 996_100), t0 + ms(1_100), 1_001_100)
            .unwrap();
        // Within a boot a backward step is no replay either: the sequence grows.
        m.receive(beat_at("node2", 8, 3, 990_000), t0 + ms(1_200), 1_001_200)
            .unwrap();
        assert_eq!(
            m.alive(t0 + ms(1_200)).keys().collect::<Vec<_>>(),
            ["node2"]
        );
    }

    /// What replay protection is for: captured datagrams sent again, inside and outside the
    /// clock window, never count.
    #[test]
    fn captured_heartbeats_sent_again_are_refused() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut m = Membership::new("node1", ms(500));
        let mut captured = Vec::new();
        for seq in 1..=50 {
            let at = 100 * seq;
            let b = beat_at("node2", 7, seq, 1_000_000 + at);
            m.receive(b.clone(), t0 + ms(at), 1_000_000 + at).unwrap();
            captured.push(b);
        }
        // The sender restarts (a new boot); the old boot's captures stay refused.
        for seq in 1..=50 {
            let at = 6_000 + 100 * seq;
            let b = beat_at("node2", 8, seq, 1_000_000 + at);
            m.receive(b.clone(), t0 + ms(at), 1_000_000 + at).unwrap();
            captured.push(b);
        }
        let now_ms = 1_011_000;
        for b in &captured {
            assert_eq!(
                m.receive(b.clone(), t0 + ms(11_000), now_ms),
                Err(HeartbeatError::Replay),
                "{b:?}"
            );
        }
        // Later than the window: refused for the clock, whatever the table holds.
        let mut fresh = Membership::new("node1", ms(500));
        assert!(matches!(
            fresh.receive(captured[0].clone(), t0, 1_000_100 + CLOCK_WINDOW_MS + 1),
            Err(HeartbeatError::Clock { .. })
        ));
    }

    /// The real sender's heartbeats from `from` (seq, timestamp and our clock advancing 100 ms
    /// each), fed to `m`; returns the sequence numbers accepted.
    fn run_sender(
        m: &mut Membership,
        t0: Instant,
        boot: u64,
        seqs: std::ops::Range<u64>,
        clock_step_ms: i64,
    ) -> Vec<u64> {
        seqs.filter(|&seq| {
            let at = 100 * seq;
            let ts = (1_000_000 + at).saturating_add_signed(clock_step_ms);
            m.receive(
                beat_at("node2", boot, seq, ts),
                t0 + Duration::from_millis(at),
                1_000_000 + at,
            )
            .is_ok()
        })
        .collect()
    }

    /// A forged maximal sequence number, then the real sender's clock jumps forward: its
    /// heartbeats pass neither the sequence nor (at first) the timestamp cap, but each one moves
    /// the clock estimate on, so they are heard again within a couple of seconds.
    #[test]
    fn a_clock_jump_after_a_forged_sequence_number_is_heard_again() {
        let t0 = Instant::now();
        let mut m = Membership::new("node1", Duration::from_millis(500));
        assert_eq!(run_sender(&mut m, t0, 7, 1..10, 0).len(), 9);
        m.receive(
            beat_at("node2", 7, u64::MAX, 1_000_950),
            t0 + Duration::from_millis(950),
            1_000_950,
        )
        .unwrap();
        let accepted = run_sender(&mut m, t0, 7, 10..60, 10_000);
        // 10 s ahead, caught up at 500 ms a heartbeat: 20 heartbeats.
        assert!(accepted.first().is_some_and(|&s| s <= 32), "{accepted:?}");
        assert!((32..60).all(|s| accepted.contains(&s)), "{accepted:?}");
    }

    /// More forged boots than the table remembers push the real boot out; it comes back as a
    /// new boot at once (its timestamp is current), and its captures stay refused.
    #[test]
    fn a_flood_of_forged_boots_does_not_lock_the_sender_out() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut m = Membership::new("node1", ms(500));
        assert_eq!(run_sender(&mut m, t0, 7, 1..10, 0).len(), 9);
        for boot in 0..(2 * MAX_BOOTS as u64) {
            m.receive(
                beat_at("node2", 100 + boot, u64::MAX, 1_000_000 + CLOCK_WINDOW_MS),
                t0 + ms(950),
                1_000_950,
            )
            .unwrap();
        }
        assert_eq!(run_sender(&mut m, t0, 7, 10..30, 0).len(), 20);
        assert_eq!(
            m.receive(
                beat_at("node2", 7, 25, 1_002_500),
                t0 + ms(3_000),
                1_003_000
            ),
            Err(HeartbeatError::Replay)
        );
    }

    #[test]
    fn a_key_ring_signs_with_the_first_key_and_accepts_any() {
        let next = b"fedcba9876543210fedcba9876543210".to_vec();
        let ring = KeyRing::new([KEY.to_vec(), next.clone()]).unwrap();
        assert_eq!(ring.len(), 2);
        assert_eq!(ring.signing(), KEY);
        assert!(ring.contains(&next) && !ring.contains(b"0123456789abcdef"));
        let b = beat("node2", 1);
        assert_eq!(
            Heartbeat::decode_with(&b.encode(KEY).unwrap(), &ring),
            Ok((b.clone(), 0))
        );
        assert_eq!(
            Heartbeat::decode_with(&b.encode(&next).unwrap(), &ring),
            Ok((b.clone(), 1))
        );
        let other = b"0000000000000000000000".to_vec();
        assert_eq!(
            Heartbeat::decode_with(&b.encode(&other).unwrap(), &ring),
            Err(HeartbeatError::BadTag)
        );
        assert_eq!(
            Heartbeat::decode_with(&[1, 2, 3], &ring),
            Err(HeartbeatError::Malformed)
        );
        // A next key equal to the current one is one key; keys never reach a log.
        assert_eq!(KeyRing::new([KEY.to_vec(), KEY.to_vec()]).unwrap().len(), 1);
        assert_eq!(format!("{ring:?}"), "KeyRing(2 keys)");
    }

    #[test]
    fn short_keys_and_empty_rings_are_refused() {
        assert_eq!(
            KeyRing::new([KEY.to_vec(), b"short".to_vec()]),
            Err(KeyError::TooShort { index: 1, len: 5 })
        );
        assert_eq!(
            KeyRing::new([vec![7; MIN_KEY_LEN - 1]]),
            Err(KeyError::TooShort {
                index: 0,
                len: MIN_KEY_LEN - 1
            })
        );
        assert_eq!(KeyRing::new(Vec::<Vec<u8>>::new()), Err(KeyError::Empty));
        assert!(KeyRing::new([vec![7; MIN_KEY_LEN]]).is_ok());
    }

    /// Once the node list is known the table holds only nodes: junk names cannot grow it, and
    /// a node that left the cluster is forgotten.
    #[test]
    fn the_table_holds_only_the_nodes_of_the_cluster() {
        let t0 = Instant::now();
        let mut m = Membership::new("node1", Duration::from_millis(500));
        m.receive(beat("node2", 1), t0, 1_000_000).unwrap();
        m.receive(beat("node3", 1), t0, 1_000_000).unwrap();
        let nodes = |names: &[&str]| names.iter().map(|n| n.to_string()).collect();
        assert_eq!(m.set_nodes(nodes(&["node1", "node2"])), 1);
        assert_eq!(m.known(), 1);
        assert!(!m.hears(t0).contains_key("node3"));
        assert_eq!(
            m.receive(beat("node3", 2), t0, 1_000_000),
            Err(HeartbeatError::UnknownNode("node3".into()))
        );
        for i in 0..100 {
            assert!(
                m.receive(beat(&format!("junk{i}"), 1), t0, 1_000_000)
                    .is_err()
            );
        }
        assert_eq!(m.known(), 1);
        // The same list again changes nothing; a node that joins is heard.
        assert_eq!(m.set_nodes(nodes(&["node1", "node2"])), 0);
        assert_eq!(m.set_nodes(nodes(&["node1", "node2", "node3"])), 0);
        assert!(m.receive(beat("node3", 3), t0, 1_000_000).unwrap());
        assert_eq!(m.known(), 2);
    }

    /// Before the node list is known, the table stops at [`MAX_PEERS`] names.
    #[test]
    fn the_table_is_bounded_before_the_node_list_is_known() {
        let t0 = Instant::now();
        let mut m = Membership::new("node1", Duration::from_millis(500));
        for i in 0..MAX_PEERS {
            m.receive(beat(&format!("n{i}"), 1), t0, 1_000_000).unwrap();
        }
        assert_eq!(
            m.receive(beat("one-more", 1), t0, 1_000_000),
            Err(HeartbeatError::TableFull("one-more".into()))
        );
        // Those already held are still heard.
        assert!(m.receive(beat("n0", 2), t0, 1_000_000).is_ok());
        assert_eq!(m.known(), MAX_PEERS);
    }

    /// What the adversary sends in [`forged_heartbeats_lock_the_sender_out_only_briefly`].
    #[derive(Clone, Debug)]
    enum Evil {
        /// A heartbeat signed with the key: boot 0 and 1 are the real sender's two boots,
        /// others are made up; the timestamp is relative to the receiver's clock.
        Forge { boot: u64, seq: u64, ts_off: i64 },
        /// Any datagram sent so far, real or forged, sent again.
        Replay(usize),
    }

    fn evil() -> impl Strategy<Value = Evil> {
        prop_oneof![
            (
                0u64..6,
                prop_oneof![Just(u64::MAX), any::<u64>(), 0u64..400],
                prop_oneof![
                    Just(CLOCK_WINDOW_MS as i64),
                    -(CLOCK_WINDOW_MS as i64) - 1_000..CLOCK_WINDOW_MS as i64 + 1_000
                ],
            )
                .prop_map(|(boot, seq, ts_off)| Evil::Forge { boot, seq, ts_off }),
            any::<usize>().prop_map(Evil::Replay),
        ]
    }

    /// Our wall clock at `at` ms into a simulation.
    const SIM_EPOCH_MS: u64 = 1_700_000_000_000;

    proptest! {
        /// Arbitrary interleavings of the real sender's heartbeats (one every 100 ms, a restart
        /// with a new boot somewhere, its clock `skew` from ours) with forged heartbeats and
        /// replays: a real heartbeat is refused only shortly after a forged one, never until a
        /// restart: at most [`MAX_LEAD_MS`] per forged datagram sent so far (module docs).
        #[test]
        fn forged_heartbeats_lock_the_sender_out_only_briefly(
            skew in -5_000i64..5_000,
            restart_at in 2u64..200,
            attacks in prop::collection::vec((0u64..200, 0u64..10, evil()), 0..16),
        ) {
            let t0 = Instant::now();
            let mut m = Membership::new("node1", Duration::from_millis(500));
            let mut sent: Vec<(Heartbeat, bool)> = Vec::new();
            let mut forged_seen = 0u64;
            let mut last_forged: Option<u64> = None;
            let mut attacks = attacks;
            attacks.sort_by_key(|(slot, sub, _)| (*slot, *sub));
            let mut attacks = attacks.into_iter().peekable();
            for slot in 0..200u64 {
                // The real heartbeat of this slot (none in slot 0, so forgeries can come first;
                // none for 500 ms around the restart).
                let at = 100 * slot;
                let restarting = (restart_at..restart_at + 5).contains(&slot);
                if slot > 0 && !restarting {
                    let (boot, seq) = if slot < restart_at { (7, slot) } else { (8, slot - restart_at) };
                    let b = beat_at("node2", boot, seq, (SIM_EPOCH_MS + at).saturating_add_signed(skew));
                    let result = m.receive(b.clone(), t0 + Duration::from_millis(at), SIM_EPOCH_MS + at);
                    if result.is_err() {
                        // The lead per forged datagram so far (module docs), what a forged
                        // first contact adds when the sender's clock is behind ours, and one
                        // heartbeat interval.
                        let bound = MAX_LEAD_MS * forged_seen + (-skew).max(0) as u64 + 100;
                        prop_assert!(
                            last_forged.is_some_and(|f| at - f <= bound),
                            "real heartbeat {:?} refused at {} ms ({:?}), last forged at {:?}, bound {}",
                            b, at, result, last_forged, bound
                        );
                    }
                    sent.push((b, false));
                }
                while let Some((_, sub, evil)) = attacks.next_if(|(s, _, _)| *s == slot) {
                    let at = at + 1 + 9 * sub;
                    let (b, forged) = match evil {
                        Evil::Forge { boot, seq, ts_off } => {
                            let boot = [7, 8].get(boot as usize).copied().unwrap_or(100 + boot);
                            let ts = (SIM_EPOCH_MS + at).saturating_add_signed(ts_off);
                            (beat_at("node2", boot, seq, ts), true)
                        }
                        Evil::Replay(i) if !sent.is_empty() => sent[i % sent.len()].clone(),
                        Evil::Replay(_) => continue,
                    };
                    let accepted = m.receive(b.clone(), t0 + Duration::from_millis(at), SIM_EPOCH_MS + at).is_ok();
                    if forged {
                        forged_seen += 1;
                    }
                    // A replayed forged datagram can count again (once); a replayed real one
                    // is what the rule exists to refuse.
                    if forged || (accepted && b.seq != 0 && sent.iter().any(|(s, f)| *f && s == &b)) {
                        last_forged = Some(at);
                        forged_seen += u64::from(!forged);
                    }
                    sent.push((b, forged));
                }
            }
        }

        /// The real sender's heartbeats (a restart, its clock stepping back within a boot or
        /// before the restart, some lost) interleaved with replays of any earlier one: every
        /// real heartbeat that arrives counts, no replay of one that counted does.
        #[test]
        fn replays_never_count_and_real_heartbeats_always_do(
            skew in -5_000i64..5_000,
            restart_at in 2u64..150,
            step_at in 1u64..150,
            step_back in 0u64..BOOT_TOLERANCE_MS,
            lost in prop::collection::btree_set(1u64..150, 0..20),
            replays in prop::collection::vec((1u64..150, any::<usize>()), 0..60),
        ) {
            let t0 = Instant::now();
            let mut m = Membership::new("node1", Duration::from_millis(500));
            let mut accepted: Vec<Heartbeat> = Vec::new();
            for slot in 1..150u64 {
                let at = 100 * slot;
                if !(restart_at..restart_at + 5).contains(&slot) {
                    let (boot, seq) = if slot < restart_at { (7, slot) } else { (8, slot - restart_at) };
                    let stepped = if slot >= step_at { step_back } else { 0 };
                    let ts = (SIM_EPOCH_MS + at).saturating_add_signed(skew) - stepped;
                    let b = beat_at("node2", boot, seq, ts);
                    if !lost.contains(&slot) {
                        let r = m.receive(b.clone(), t0 + Duration::from_millis(at), SIM_EPOCH_MS + at);
                        prop_assert!(r.is_ok(), "{:?} refused: {:?}", b, r);
                        accepted.push(b);
                    }
                }
                for (_, i) in replays.iter().filter(|(s, _)| *s == slot) {
                    if accepted.is_empty() {
                        continue;
                    }
                    let b = accepted[i % accepted.len()].clone();
                    let at = at + 50;
                    let r = m.receive(b.clone(), t0 + Duration::from_millis(at), SIM_EPOCH_MS + at);
                    prop_assert_eq!(r, Err(HeartbeatError::Replay), "{:?}", b);
                }
            }
        }
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = Heartbeat::decode(&bytes, KEY);
        }

        #[test]
        fn round_trip(node in "[a-z0-9.-]{1,60}", boot: u64, seq: u64, unix_ms: u64, ready: bool, leaving: bool, restarting: bool,
                      ifs in prop::collection::btree_set("[a-z0-9]{1,15}", 0..5),
                      hears in prop::collection::btree_map(
                          "[a-z0-9.-]{1,60}",
                          (any::<bool>(), any::<u64>(), any::<u64>()).prop_map(|(ready, boot, seq)| Heard { ready, boot, seq }),
                          0..20)) {
            let b = Heartbeat { node, boot, seq, unix_ms, ready, leaving, restarting, interfaces: ifs, hears };
            prop_assert_eq!(Heartbeat::decode(&b.encode(KEY).unwrap(), KEY).unwrap(), b);
        }
    }
}
