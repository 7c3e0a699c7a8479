//! The heartbeat wire format, and the keys that sign it.
//!
//! A heartbeat says who sends it, whether it may own IPs (`ready`), whether it is leaving or being
//! replaced, which of its interfaces can announce, and which peers it hears. It is authenticated
//! with HMAC-SHA-256 under a [`KeyRing`]: signed with the first key, accepted under any, which is
//! how the key is rotated without a moment where two nodes refuse each other. Bytes come in and go
//! out as slices, and decoding never panics. What counts once decoded is
//! [`crate::replay`]'s and [`crate::liveness`]'s business; why the format says what it says:
//! docs/decisions/0015-layer2-quorum.md ("Heartbeats").

use std::collections::{BTreeMap, BTreeSet};

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// First bytes of every heartbeat: protocol name and version (3: each peer the sender hears
/// with the boot and sequence number last heard from it, which [`crate::tenure`] needs; 2 listed
/// names only. Speakers of other versions refuse each other's heartbeats as malformed, so a
/// rolling upgrade across versions is a partition that the quorum rule resolves: the side with
/// the majority keeps or takes the IPs, the other owns none).
const MAGIC: &[u8; 4] = b"FLB\x03";
/// Bytes of the truncated HMAC tag (128 bits, as RFC 2104 allows); [`crate::wire`] uses it too.
pub(crate) const TAG_LEN: usize = 16;
/// Flag: the sender may own IPs.
const FLAG_READY: u8 = 0x1;
/// Flag: the sender is shutting down.
const FLAG_LEAVING: u8 = 0x2;
/// Flag, with [`FLAG_LEAVING`]: the sender is being replaced by a new process on the same node
/// (a rolling update); keep it as the owner of its IPs for the restart hold.
const FLAG_RESTARTING: u8 = 0x4;
/// Shortest key accepted, in bytes: 128 bits, the length of the tag.
pub const MIN_KEY_LEN: usize = 16;
/// Longest node or peer name: a Node's name is a DNS subdomain.
pub const MAX_NAME_LEN: usize = 253;
/// Longest interface name: Linux's `IFNAMSIZ` less the terminating zero.
pub const MAX_INTERFACE_LEN: usize = 15;
/// Bytes of a heartbeat before its names: magic, flags, boot, sequence number, clock.
const FIXED_LEN: usize = 4 + 1 + 8 + 8 + 8;
/// Bytes of one peer heard, besides its name: ready, boot, sequence number, name length.
const HEARD_LEN: usize = 1 + 8 + 8 + 1;

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

    /// The ring's keys, the signing key first ([`crate::wire`] verifies under each in turn).
    pub(crate) fn keys(&self) -> impl Iterator<Item = &[u8]> {
        self.keys.iter().map(Vec::as_slice)
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
    /// ([`crate::liveness::Membership::set_restart_hold`]) instead of taking them over.
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
    /// to acknowledge ([`crate::liveness::Membership::hears`]).
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
    /// Longer than any heartbeat listing at most the peers allowed can be: refused before the
    /// tag is computed, so a flood of large datagrams costs a length comparison each.
    #[error("heartbeat of {len} bytes; at most {max} are possible")]
    TooLarge {
        /// The datagram's length.
        len: usize,
        /// The longest heartbeat possible ([`Heartbeat::max_len`]).
        max: usize,
    },
    /// From a name that is not a node of the cluster (once the node list is known).
    #[error("heartbeat from {0:?}, which is not a node of the cluster")]
    UnknownNode(String),
    /// From a new name while the table holds [`crate::liveness::MAX_PEERS`] and the node list
    /// is not known yet.
    #[error("heartbeat from {0:?}: the peer table is full until the node list is known")]
    TableFull(String),
}

impl Heartbeat {
    /// The longest heartbeat, tag included, of a sender that lists at most `hears` peers:
    /// every name as long as allowed, 255 interfaces.
    pub fn max_len(hears: usize) -> usize {
        let hears = hears.min(MAX_HEARS);
        FIXED_LEN
            + 1
            + MAX_NAME_LEN
            + 1
            + usize::from(u8::MAX) * (1 + MAX_INTERFACE_LEN)
            + 2
            + hears * (HEARD_LEN + MAX_NAME_LEN)
            + TAG_LEN
    }

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
        push_name(&mut out, &self.node, MAX_NAME_LEN, "node name")?;
        let count = u8::try_from(self.interfaces.len())
            .map_err(|_| HeartbeatError::TooLong("interfaces"))?;
        out.push(count);
        for name in &self.interfaces {
            push_name(&mut out, name, MAX_INTERFACE_LEN, "interface name")?;
        }
        let count =
            u16::try_from(self.hears.len()).map_err(|_| HeartbeatError::TooLong("hears"))?;
        out.extend_from_slice(&count.to_be_bytes());
        for (name, heard) in &self.hears {
            out.push(u8::from(heard.ready));
            out.extend_from_slice(&heard.boot.to_be_bytes());
            out.extend_from_slice(&heard.seq.to_be_bytes());
            push_name(&mut out, name, MAX_NAME_LEN, "peer name")?;
        }
        let tag = mac(key).chain_update(&out).finalize().into_bytes();
        out.extend_from_slice(&tag[..TAG_LEN]);
        Ok(out)
    }

    /// Checks the length and the lengths inside, then the tag, then decodes. Never panics,
    /// whatever the bytes.
    pub fn decode(bytes: &[u8], key: &[u8]) -> Result<Self, HeartbeatError> {
        let (body, tag) = checked_body(bytes, MAX_HEARS)?;
        if !verifies(key, body, tag) {
            return Err(HeartbeatError::BadTag);
        }
        Self::parse(body)
    }

    /// Checks the length and the lengths inside, then the tag against each key of `keys` in
    /// turn, then decodes; also returns the position of the key that verified (0: the signing
    /// key). Never panics, whatever the bytes.
    pub fn decode_with(bytes: &[u8], keys: &KeyRing) -> Result<(Self, usize), HeartbeatError> {
        Self::decode_within(bytes, keys, MAX_HEARS)
    }

    /// [`Heartbeat::decode_with`] for a sender that can list at most `max_hears` peers (what the
    /// cluster's size allows): a longer datagram is refused as [`HeartbeatError::TooLarge`], and
    /// one whose lengths do not add up as [`HeartbeatError::Malformed`], both before any tag is
    /// computed, so a flood of either costs no hashing.
    pub fn decode_within(
        bytes: &[u8],
        keys: &KeyRing,
        max_hears: usize,
    ) -> Result<(Self, usize), HeartbeatError> {
        let (body, tag) = checked_body(bytes, max_hears)?;
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
        // Names come in strictly increasing order, as encoding writes them (from a BTreeSet and
        // a BTreeMap): in another order the same heartbeat would have a second encoding, and
        // decoding then encoding would change its bytes (found by the heartbeat fuzz target).
        let mut interfaces = BTreeSet::new();
        for _ in 0..count {
            let name = r.string()?;
            if interfaces.last().is_some_and(|last| *last >= name) {
                return Err(HeartbeatError::Malformed);
            }
            interfaces.insert(name);
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
            if name.is_empty()
                || hears
                    .last_key_value()
                    .is_some_and(|(last, _)| *last >= name)
            {
                return Err(HeartbeatError::Malformed);
            }
            hears.insert(name, heard);
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

/// The body and the tag of `bytes`, once its length is possible for a sender listing at most
/// `max_hears` peers and the lengths inside it add up to the body exactly (cheap checks, made
/// before the tag is computed).
fn checked_body(bytes: &[u8], max_hears: usize) -> Result<(&[u8], &[u8]), HeartbeatError> {
    let max = Heartbeat::max_len(max_hears);
    if bytes.len() > max {
        return Err(HeartbeatError::TooLarge {
            len: bytes.len(),
            max,
        });
    }
    let body_len = bytes
        .len()
        .checked_sub(TAG_LEN)
        .ok_or(HeartbeatError::Malformed)?;
    let (body, tag) = bytes.split_at(body_len);
    shape(body, max_hears).ok_or(HeartbeatError::Malformed)?;
    Ok((body, tag))
}

/// Walks the body's lengths without decoding anything: `Some` if they are within the format's
/// bounds, list at most `max_hears` peers and end exactly at the body's end.
fn shape(body: &[u8], max_hears: usize) -> Option<()> {
    let mut r = Reader(body);
    if r.take(4).ok()? != MAGIC {
        return None;
    }
    r.take(FIXED_LEN - 4).ok()?;
    let name = |r: &mut Reader<'_>, max: usize| -> Option<()> {
        let len = usize::from(r.u8().ok()?);
        (len <= max).then_some(())?;
        r.take(len).ok().map(|_| ())
    };
    name(&mut r, MAX_NAME_LEN)?;
    for _ in 0..r.u8().ok()? {
        name(&mut r, MAX_INTERFACE_LEN)?;
    }
    let count = u16::from_be_bytes([r.u8().ok()?, r.u8().ok()?]);
    if usize::from(count) > max_hears {
        return None;
    }
    for _ in 0..count {
        r.take(HEARD_LEN - 1).ok()?;
        name(&mut r, MAX_NAME_LEN)?;
    }
    r.0.is_empty().then_some(())
}

#[cfg(test)]
thread_local! {
    /// Tags computed by this thread, so tests can tell that a refusal computed none.
    static TAGS_COMPUTED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Tags computed by this thread so far, for tests (here and in [`crate::wire`]) that check a
/// refusal computed none.
#[cfg(test)]
pub(crate) fn tag_count() -> u64 {
    TAGS_COMPUTED.with(std::cell::Cell::get)
}

/// Whether `tag` is the truncated HMAC-SHA-256 of `body` under `key` (compared in constant
/// time). Shared with [`crate::wire`], so v3 and v4 are signed alike.
pub(crate) fn verifies(key: &[u8], body: &[u8], tag: &[u8]) -> bool {
    #[cfg(test)]
    TAGS_COMPUTED.with(|n| n.set(n.get() + 1));
    // Constant-time comparison (the hmac crate's).
    mac(key)
        .chain_update(body)
        .verify_truncated_left(tag)
        .is_ok()
}

/// HMAC-SHA-256 keyed with `key`.
pub(crate) fn mac(key: &[u8]) -> HmacSha256 {
    // HMAC takes keys of any length; the error case cannot happen for HMAC.
    <HmacSha256 as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!())
}

fn push_name(
    out: &mut Vec<u8>,
    s: &str,
    max: usize,
    what: &'static str,
) -> Result<(), HeartbeatError> {
    if s.len() > max {
        return Err(HeartbeatError::TooLong(what));
    }
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

/// Sample heartbeats for the tests of this module, [`crate::liveness`] and [`crate::replay`].
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;

    /// A ready heartbeat of `node`, boot 7, at 1,000,000 ms, hearing node3 (ready) and node4.
    pub(crate) fn beat(node: &str, seq: u64) -> Heartbeat {
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

    /// What a heartbeat says of a peer it hears.
    pub(crate) fn heard(ready: bool, boot: u64, seq: u64) -> Heard {
        Heard { ready, boot, seq }
    }

    /// [`beat`] with another boot and timestamp.
    pub(crate) fn beat_at(node: &str, boot: u64, seq: u64, unix_ms: u64) -> Heartbeat {
        Heartbeat {
            boot,
            unix_ms,
            ..beat(node, seq)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::fixtures::{beat, heard};
    use super::*;
    use proptest::prelude::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

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
        // Cut short: the lengths inside no longer add up, refused before the tag is computed.
        assert_eq!(
            Heartbeat::decode(&bytes[..30], KEY),
            Err(HeartbeatError::Malformed)
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

    fn tags_computed() -> u64 {
        TAGS_COMPUTED.with(std::cell::Cell::get)
    }

    /// A heartbeat hearing `peers` peers with names of the longest length allowed.
    fn long_beat(peers: usize) -> Heartbeat {
        let mut b = beat("node2", 1);
        b.hears = (0..peers)
            .map(|i| (format!("{i:0>253}"), heard(true, 1, 1)))
            .collect();
        b
    }

    #[test]
    fn oversize_and_impossible_lengths_are_refused_before_any_tag_is_computed() {
        let ring = KeyRing::new([KEY.to_vec()]).unwrap();
        // The counter counts: a good heartbeat costs one tag.
        let good = beat("node2", 1).encode(KEY).unwrap();
        let before = tags_computed();
        assert!(Heartbeat::decode_within(&good, &ring, 2).is_ok());
        assert_eq!(tags_computed(), before + 1);

        let before = tags_computed();
        // Longer than a sender listing at most 3 peers can send.
        let max = Heartbeat::max_len(3);
        let long = long_beat(20).encode(KEY).unwrap();
        assert!(long.len() > max);
        assert_eq!(
            Heartbeat::decode_within(&long, &ring, 3),
            Err(HeartbeatError::TooLarge {
                len: long.len(),
                max
            })
        );
        // A maximum-size datagram (the largest UDP payload over IPv4) with the magic and
        // lengths that do not add up: the rest of it zeros.
        let mut flood = good[..good.len() - TAG_LEN].to_vec();
        flood.resize(65_507, 0);
        assert_eq!(
            Heartbeat::decode_with(&flood, &ring),
            Err(HeartbeatError::Malformed)
        );
        // Lengths that add up, but a count of peers above the allowed, or a name too long.
        let b = long_beat(5).encode(KEY).unwrap();
        assert_eq!(
            Heartbeat::decode_within(&b, &ring, 4),
            Err(HeartbeatError::Malformed)
        );
        let mut named = beat("node2", 1);
        named.node = "n".repeat(MAX_NAME_LEN);
        let mut body = named.encode(KEY).unwrap();
        body.truncate(body.len() - TAG_LEN);
        let at = FIXED_LEN;
        assert_eq!(usize::from(body[at]), MAX_NAME_LEN);
        body[at] = 254;
        body.insert(at + 1, b'n');
        body.extend_from_slice(&[0; TAG_LEN]);
        assert_eq!(
            Heartbeat::decode(&body, KEY),
            Err(HeartbeatError::Malformed)
        );
        // Random bytes, magic or not.
        assert_eq!(
            Heartbeat::decode_with(&[0xa5; 65_507], &ring),
            Err(HeartbeatError::Malformed)
        );
        assert_eq!(tags_computed(), before, "a tag was computed for a refusal");
        // Within the bounds, the tag is checked.
        assert_eq!(
            Heartbeat::decode_within(
                &long_beat(5).encode(b"another key, 16 bytes").unwrap(),
                &ring,
                5
            ),
            Err(HeartbeatError::BadTag)
        );
        assert_eq!(tags_computed(), before + 1);
    }

    #[test]
    fn names_longer_than_the_format_allows_are_not_encoded() {
        let mut b = beat("node2", 1);
        b.interfaces.insert("i".repeat(MAX_INTERFACE_LEN + 1));
        assert_eq!(
            b.encode(KEY),
            Err(HeartbeatError::TooLong("interface name"))
        );
        let mut b = beat("node2", 1);
        b.node = "n".repeat(MAX_NAME_LEN + 1);
        assert_eq!(b.encode(KEY), Err(HeartbeatError::TooLong("node name")));
        // The longest of each round-trips, and the longest heartbeat fits max_len.
        let mut b = long_beat(3);
        b.node = "n".repeat(MAX_NAME_LEN);
        b.interfaces = (0..255).map(|i| format!("{i:0>15}")).collect();
        let bytes = b.encode(KEY).unwrap();
        assert_eq!(bytes.len(), Heartbeat::max_len(3));
        assert_eq!(Heartbeat::decode(&bytes, KEY), Ok(b));
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
