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
//! Secret; replays are refused by a per-boot sequence number and a timestamp window.
//!
//! Everything here is pure: time comes in as arguments, bytes in and out as slices.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// First bytes of every heartbeat: protocol name and version (2: with the peers the sender
/// hears; version 1 speakers and this one refuse each other's heartbeats as malformed).
const MAGIC: &[u8; 4] = b"FLB\x02";
/// Bytes of the truncated HMAC tag (128 bits, as RFC 2104 allows).
const TAG_LEN: usize = 16;
/// Flag: the sender may own IPs.
const FLAG_READY: u8 = 0x1;
/// Flag: the sender is shutting down.
const FLAG_LEAVING: u8 = 0x2;
/// Heartbeats whose timestamp is further than this from ours are refused: replays of old
/// captures fail, while nodes kept within seconds by NTP pass.
pub const CLOCK_WINDOW_MS: u64 = 30_000;

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
    /// Names of the sender's interfaces that can announce.
    pub interfaces: BTreeSet<String>,
    /// The peers the sender hears now, each with whether its heartbeat said `ready`: what the
    /// quorum rule ([`crate::quorum`]) counts.
    pub hears: BTreeMap<String, bool>,
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
}

impl Heartbeat {
    /// Encodes and signs the heartbeat.
    pub fn encode(&self, key: &[u8]) -> Result<Vec<u8>, HeartbeatError> {
        let mut out = Vec::with_capacity(64 + self.node.len());
        out.extend_from_slice(MAGIC);
        let flags =
            if self.ready { FLAG_READY } else { 0 } | if self.leaving { FLAG_LEAVING } else { 0 };
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
        for (name, ready) in &self.hears {
            out.push(u8::from(*ready));
            push_str(&mut out, name, "peer name")?;
        }
        let tag = mac(key).chain_update(&out).finalize().into_bytes();
        out.extend_from_slice(&tag[..TAG_LEN]);
        Ok(out)
    }

    /// Checks the tag, then decodes. Never panics, whatever the bytes.
    pub fn decode(bytes: &[u8], key: &[u8]) -> Result<Self, HeartbeatError> {
        let body_len = bytes
            .len()
            .checked_sub(TAG_LEN)
            .ok_or(HeartbeatError::Malformed)?;
        let (body, tag) = bytes.split_at(body_len);
        mac(key)
            .chain_update(body)
            .verify_truncated_left(tag)
            .map_err(|_| HeartbeatError::BadTag)?;
        let mut r = Reader(body);
        if r.take(4)? != MAGIC {
            return Err(HeartbeatError::Malformed);
        }
        let flags = r.u8()?;
        let boot = r.u64()?;
        let seq = r.u64()?;
        let unix_ms = r.u64()?;
        let node = r.string()?;
        let count = r.u8()?;
        let mut interfaces = BTreeSet::new();
        for _ in 0..count {
            interfaces.insert(r.string()?);
        }
        let count = u16::from_be_bytes([r.u8()?, r.u8()?]);
        let mut hears = BTreeMap::new();
        for _ in 0..count {
            let ready = match r.u8()? {
                0 => false,
                1 => true,
                _ => return Err(HeartbeatError::Malformed),
            };
            let name = r.string()?;
            if name.is_empty() || hears.insert(name, ready).is_some() {
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
            interfaces,
            hears,
        })
    }
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
    boot: u64,
    seq: u64,
    unix_ms: u64,
    ready: bool,
    leaving: bool,
    interfaces: BTreeSet<String>,
    hears: BTreeMap<String, bool>,
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
    peers: BTreeMap<String, Peer>,
}

impl Membership {
    /// A table for speaker `me`, counting a peer dead `timeout` after its last heartbeat.
    pub fn new(me: impl Into<String>, timeout: Duration) -> Self {
        Membership {
            me: me.into(),
            timeout,
            peers: BTreeMap::new(),
        }
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
        let skew_ms = unix_ms.abs_diff(beat.unix_ms);
        if skew_ms > CLOCK_WINDOW_MS {
            return Err(HeartbeatError::Clock { skew_ms });
        }
        let was_alive = self.is_alive(&beat.node, now);
        if let Some(peer) = self.peers.get(&beat.node) {
            let newer = if peer.boot == beat.boot {
                beat.seq > peer.seq
            } else {
                // A new boot must also be newer in time, or an old boot's capture could replay.
                beat.unix_ms > peer.unix_ms
            };
            if !newer {
                return Err(HeartbeatError::Replay);
            }
        }
        let changed = self.peers.get(&beat.node).is_none_or(|p| {
            p.ready != beat.ready
                || p.leaving != beat.leaving
                || p.interfaces != beat.interfaces
                || p.hears != beat.hears
        });
        self.peers.insert(
            beat.node,
            Peer {
                heard: now,
                boot: beat.boot,
                seq: beat.seq,
                unix_ms: beat.unix_ms,
                ready: beat.ready,
                leaving: beat.leaving,
                interfaces: beat.interfaces,
                hears: beat.hears,
            },
        );
        Ok(changed || !was_alive)
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
    /// `ready`: what this speaker's own heartbeat reports.
    pub fn hears(&self, now: Instant) -> BTreeMap<String, bool> {
        self.peers
            .iter()
            .filter(|(_, p)| self.is_fresh(p, now))
            .map(|(name, p)| (name.clone(), p.ready))
            .collect()
    }

    /// What every peer heard now said last, for the quorum rule.
    pub fn reports(&self, now: Instant) -> BTreeMap<String, crate::quorum::Report> {
        self.peers
            .iter()
            .filter(|(_, p)| self.is_fresh(p, now))
            .map(|(name, p)| {
                (
                    name.clone(),
                    crate::quorum::Report {
                        fresh: true,
                        ready: p.ready,
                        hears: p.hears.clone(),
                        interfaces: p.interfaces.clone(),
                    },
                )
            })
            .collect()
    }

    /// The earliest instant at which a heard peer times out, for the driver's next check.
    pub fn next_silence(&self, now: Instant) -> Option<Instant> {
        self.peers
            .values()
            .filter(|p| self.is_fresh(p, now))
            .map(|p| p.heard + self.timeout)
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
            interfaces: ["eth0".to_string()].into(),
            hears: [("node3".to_string(), true), ("node4".to_string(), false)].into(),
        }
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
            interfaces: ["e0".to_string()].into(),
            hears: [("n2".to_string(), true), ("n3".to_string(), false)].into(),
        };
        let bytes = b.encode(KEY).unwrap();
        let body = [
            &b"FLB\x02"[..],
            &[0x01],
            &[1, 2, 3, 4, 5, 6, 7, 8],
            &[0, 0, 0, 0, 0, 0, 0, 9],
            &[0, 0, 1, 0x90, 0, 0, 0, 0],
            &[2, b'n', b'1'],
            &[1, 2, b'e', b'0'],
            &[0, 2, 1, 2, b'n', b'2', 0, 2, b'n', b'3'],
        ]
        .concat();
        assert_eq!(&bytes[..body.len()], &body[..]);
        assert_eq!(bytes.len(), body.len() + TAG_LEN);
        // HMAC-SHA-256 of the body, first 16 bytes (checked with Python's hmac module).
        assert_eq!(
            hex(&bytes[body.len()..]),
            "afe39536b769b3cf525ae0681cfa42af"
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
        assert_eq!(
            m.hears(now),
            [("node2".to_string(), true), ("node3".to_string(), false)].into()
        );
        let reports = m.reports(now);
        assert_eq!(reports["node2"].hears, beat("node2", 1).hears);
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
    fn malformed_hears_lists_are_refused() {
        let mut b = beat("node2", 1);
        b.hears.clear();
        let bytes = b.encode(KEY).unwrap();
        // Replace the empty list with one entry whose ready byte is 2, and sign again.
        let body_len = bytes.len() - TAG_LEN;
        let mut body = bytes[..body_len - 2].to_vec();
        body.extend_from_slice(&[0, 1, 2, 1, b'x']);
        let tag = mac(KEY).chain_update(&body).finalize().into_bytes();
        body.extend_from_slice(&tag[..TAG_LEN]);
        assert_eq!(
            Heartbeat::decode(&body, KEY),
            Err(HeartbeatError::Malformed)
        );
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
        old_boot.unix_ms = 999_000;
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

    proptest! {
        #[test]
        fn decode_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = Heartbeat::decode(&bytes, KEY);
        }

        #[test]
        fn round_trip(node in "[a-z0-9.-]{1,60}", boot: u64, seq: u64, unix_ms: u64, ready: bool, leaving: bool,
                      ifs in prop::collection::btree_set("[a-z0-9]{1,15}", 0..5),
                      hears in prop::collection::btree_map("[a-z0-9.-]{1,60}", any::<bool>(), 0..20)) {
            let b = Heartbeat { node, boot, seq, unix_ms, ready, leaving, interfaces: ifs, hears };
            prop_assert_eq!(Heartbeat::decode(&b.encode(KEY).unwrap(), KEY).unwrap(), b);
        }
    }
}
