//! The membership wire format v4 (issue #34): members beat to a few voters, voters answer with
//! compact reports.
//!
//! The v3 heartbeat ([`crate::heartbeat`]) lists every peer its sender hears, so it grows with
//! the cluster: IP-fragmented past about 30 nodes, too large for a datagram past about 1,360.
//! In v4 (docs/plans/layer2-at-scale.md) every node sends a [`Beat`] to each voter of a small
//! odd set, and each voter answers with a [`Report`]: a bitmap over the sorted presence set of
//! the ready nodes it hears, with that bitmap's version, and two flags about the recipient
//! ([`Report::mature`], [`Report::told`]). **Every message fits one Ethernet frame**
//! ([`MAX_DATAGRAM`] = 1,472 bytes of UDP payload, 1,500 less the IPv4 and UDP headers) at any
//! cluster size the format allows:
//!
//! | message | worst case (253-byte names, [`MAX_INTERFACES`], [`MAX_ACKS`]) |
//! |---|---|
//! | [`Beat`] | [`MAX_BEAT_LEN`] = 1,248 bytes, whatever the cluster size |
//! | [`Report`] | 116 bytes + ⌈N/8⌉ up to N = [`INLINE_MAX_NODES`] (10,848): 741 at N = 5,000 |
//! | [`Report`] leaving its bitmap out ([`Report::same`]) | 116 bytes, whatever the cluster size |
//! | [`Part`] | at most 1,472 bytes, only past [`INLINE_MAX_NODES`] |
//!
//! A bitmap rarely changes, and a voter answers every beat (at 5,000 nodes, 50,000 reports a
//! second: 37.1 MB/s if each carried its 625-byte bitmap). So a report leaves the bitmap out
//! ([`Report::same`]) when the recipient has acknowledged a report carrying that version of
//! it: 5.8 MB/s at rest.
//!
//! A report's bitmap travels inside it up to [`INLINE_MAX_NODES`] nodes, so at 5,000 nodes a
//! report is one datagram and no [`Part`] is sent. Past that, up to the format's node limit of
//! [`MAX_NODES`] (65,535: node indexes are 16 bits), the report goes without its bitmap and
//! [`Report::split`] cuts the bitmap into at most six [`Part`]s of [`PART_BYTES`] each, which
//! [`Report::join`] puts back together.
//!
//! **Signing** is v3's: HMAC-SHA-256 truncated to 16 bytes, under the same [`KeyRing`] (signed
//! with the first key, accepted under any, so the gossip key rotates as it does for v3). The
//! version octet is inside what is signed, so a v3 heartbeat can never be taken for a v4
//! message or the other way round, and one socket can carry both during a rolling upgrade
//! ([`version`] tells them apart; a v3 decoder refuses `FLB\x04` as malformed).
//!
//! **Decoding** never panics and computes no tag for a datagram that is longer than
//! [`MAX_DATAGRAM`] or whose shape is wrong: lengths, names (1 to 253 bytes of UTF-8), lists in
//! strictly ascending order, indexes inside the presence set, a bitmap exactly as long as the
//! set needs with its padding bits clear (or none at all when the report says [`Report::same`]
//! or its set is past [`INLINE_MAX_NODES`]), unknown flags (a beat's or a report's) or kinds. A
//! datagram is at most 1,472 bytes, so the whole parse is bounded and done before the tag is
//! computed; a flood of junk costs a parse each, never a hash. Every message has exactly one
//! encoding: decoding then encoding gives back the same bytes (the `wire` fuzz target checks it).
//!
//! **Byte order** is big-endian; a bitmap's node `i` is bit `7 - i % 8` of byte `i / 8` (the
//! first node is the top bit of the first byte).

use std::collections::BTreeSet;

use sha2::{Digest, Sha256};

use crate::heartbeat::{KeyRing, MAX_INTERFACE_LEN, MAX_NAME_LEN, TAG_LEN, mac, verifies};
use hmac::Mac;

/// First bytes of every v4 message: `FLB` and the version. v3 heartbeats start `FLB\x03`.
pub const MAGIC: [u8; 4] = *b"FLB\x04";
/// The version octet of this format (the fourth byte of [`MAGIC`]).
pub const VERSION: u8 = 4;
/// Longest datagram of the format: 1,500 bytes of Ethernet payload less 20 of IPv4 and 8 of
/// UDP. Anything longer is refused before it is parsed.
pub const MAX_DATAGRAM: usize = 1472;
/// Most nodes a presence set can hold: a node is named by a 16-bit index into it.
pub const MAX_NODES: usize = u16::MAX as usize;
/// Most interfaces a beat lists. v3 allows 255, which alone would take 4 KB; a node announces
/// from a few interfaces, and 32 keeps the worst beat within a frame.
pub const MAX_INTERFACES: usize = 32;
/// Most acknowledgements a beat carries: one per voter of the current and the next voter set
/// (7 + 7 during a change) and a couple of learners.
pub const MAX_ACKS: usize = 16;
/// Bytes of a presence set's digest (truncated SHA-256).
pub const SET_DIGEST_LEN: usize = 16;
/// Bytes of a node name's check (truncated SHA-256).
pub const NAME_CHECK_LEN: usize = 8;

const KIND_BEAT: u8 = 1;
const KIND_REPORT: u8 = 2;
const KIND_PART: u8 = 3;

/// Flag of a beat: the sender may own IPs.
const FLAG_READY: u8 = 0x1;
/// Flag of a beat: the sender is shutting down.
const FLAG_LEAVING: u8 = 0x2;
/// Flag of a beat, with leaving: a new process replaces the sender on the same node.
const FLAG_RESTARTING: u8 = 0x4;

/// Flag of a report: its `ack` is mature ([`Report::mature`]).
const FLAG_MATURE: u8 = 0x1;
/// Flag of a report: the recipient is told ready everywhere ([`Report::told`]).
const FLAG_TOLD: u8 = 0x2;
/// Flag of a report: the bitmap is left out, the recipient holds it ([`Report::same`]).
const FLAG_SAME: u8 = 0x4;

/// Bytes of a [`NodeRef`]: index and name check.
const NODE_REF_LEN: usize = 2 + NAME_CHECK_LEN;
/// Bytes of a [`SetId`]: digest and node count.
const SET_ID_LEN: usize = SET_DIGEST_LEN + 2;
/// Bytes of a [`Seen`]: boot and sequence number.
const SEEN_LEN: usize = 16;
/// Bytes of a beat before its name: magic, kind, flags, boot, sequence number, clock, set.
const BEAT_FIXED: usize = 4 + 1 + 1 + 8 + 8 + 8 + SET_ID_LEN;
/// Bytes of one acknowledgement in a beat.
const ACK_LEN: usize = NODE_REF_LEN + SEEN_LEN;
/// Longest beat possible: longest name, [`MAX_INTERFACES`] of the longest interface names and
/// [`MAX_ACKS`] acknowledgements, with the tag. Independent of the cluster's size.
pub const MAX_BEAT_LEN: usize = BEAT_FIXED
    + 1
    + MAX_NAME_LEN
    + 1
    + MAX_INTERFACES * (1 + MAX_INTERFACE_LEN)
    + 1
    + MAX_ACKS * ACK_LEN
    + TAG_LEN;
/// Bytes of a report besides its bitmap: magic, kind, voter, recipient, boot, sequence number,
/// clock, set, acknowledgement, flags, bitmap version, generation, tag. Also the whole length of
/// a report that leaves its bitmap out ([`Report::same`]), whatever the cluster size.
const REPORT_OVERHEAD: usize =
    4 + 1 + 2 * NODE_REF_LEN + 8 + 8 + 8 + SET_ID_LEN + SEEN_LEN + 1 + 8 + 8 + TAG_LEN;
/// Longest bitmap a report carries itself.
pub const INLINE_BITMAP_BYTES: usize = MAX_DATAGRAM - REPORT_OVERHEAD;
/// Largest presence set whose bitmap a report carries itself (10,848 nodes); a larger set's
/// bitmap goes in [`Part`]s.
pub const INLINE_MAX_NODES: usize = INLINE_BITMAP_BYTES * 8;
/// Bytes of a part besides its slice: magic, kind, voter, boot, sequence number, set, offset,
/// slice length, tag.
const PART_OVERHEAD: usize = 4 + 1 + NODE_REF_LEN + 8 + 8 + SET_ID_LEN + 2 + 2 + TAG_LEN;
/// Bytes of bitmap a part carries (the last part of a bitmap carries what is left).
pub const PART_BYTES: usize = MAX_DATAGRAM - PART_OVERHEAD;

const SET_DOMAIN: &[u8] = b"ferrolb presence set v4\0";
const NAME_DOMAIN: &[u8] = b"ferrolb node name v4\0";

// The format's promise, checked when the crate compiles.
const _: () = assert!(MAX_BEAT_LEN <= MAX_DATAGRAM);
const _: () = assert!(INLINE_MAX_NODES >= 5000);
const _: () = assert!(MAX_NODES.div_ceil(8).div_ceil(PART_BYTES) <= u8::MAX as usize);

/// Why a message was refused, or could not be encoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    /// Longer than any message of the format: refused before it is parsed.
    #[error("membership datagram of {len} bytes; at most {max} are possible")]
    TooLarge {
        /// The datagram's length.
        len: usize,
        /// [`MAX_DATAGRAM`].
        max: usize,
    },
    /// A ferrolb heartbeat of another version (3: the per-peer heartbeat of
    /// [`crate::heartbeat`]).
    #[error("ferrolb heartbeat of version {0}, not {VERSION}")]
    Version(u8),
    /// A shape the format does not allow (the reason says which); refused before the tag is
    /// computed, and never encoded.
    #[error("malformed membership message: {0}")]
    Malformed(#[from] Shape),
    /// The tag matches no key of the ring: another key, or forged.
    #[error("membership message fails authentication (is the gossip key the same on every node?)")]
    BadTag,
}

/// What is wrong with a message's shape.
#[derive(Clone, Copy, Debug, thiserror::Error, PartialEq, Eq)]
pub enum Shape {
    /// Shorter than its lengths say.
    #[error("truncated")]
    Truncated,
    /// Bytes left after the last field.
    #[error("bytes after the last field")]
    Trailing,
    /// Not a ferrolb heartbeat at all.
    #[error("wrong magic")]
    Magic,
    /// A message kind this version does not know.
    #[error("unknown kind {0}")]
    Kind(u8),
    /// Flag bits this version does not know (refused, not ignored: one meaning, one encoding).
    #[error("unknown flags {0:#04x}")]
    Flags(u8),
    /// A node name empty or longer than [`MAX_NAME_LEN`].
    #[error("node name of a length not in 1..=253")]
    NameLength,
    /// An interface name empty or longer than [`MAX_INTERFACE_LEN`].
    #[error("interface name of a length not in 1..=15")]
    InterfaceLength,
    /// A name that is not UTF-8.
    #[error("name not UTF-8")]
    NotUtf8,
    /// More than [`MAX_INTERFACES`] interfaces.
    #[error("more than {MAX_INTERFACES} interfaces")]
    TooManyInterfaces,
    /// More than [`MAX_ACKS`] acknowledgements.
    #[error("more than {MAX_ACKS} acknowledgements")]
    TooManyAcks,
    /// A list that must be strictly ascending is not (interfaces by name, acknowledgements by
    /// voter index, presence set names).
    #[error("list not in strictly ascending order")]
    NotAscending,
    /// A node index at or past the presence set's size.
    #[error("node index outside the presence set")]
    IndexOutOfSet,
    /// A presence set with more than [`MAX_NODES`] names.
    #[error("presence set of more than {MAX_NODES} nodes")]
    SetTooLarge,
    /// A bitmap not exactly as long as the set needs (or present when the set is too large for
    /// it to be carried inline).
    #[error("bitmap length does not match the presence set")]
    BitmapLength,
    /// Bits set past the last node of the set.
    #[error("bitmap bits set past the last node")]
    Padding,
    /// A part whose offset is not a multiple of [`PART_BYTES`] inside the bitmap, whose slice is
    /// not exactly what that offset needs, or a part of a bitmap a report carries itself.
    #[error("bitmap part at a wrong offset or of a wrong length")]
    PartSlice,
    /// Parts that do not make up one report's bitmap: another voter, report or set, a part
    /// missing or repeated.
    #[error("parts do not match the report")]
    PartsMismatch,
    /// A report that says it leaves its bitmap out ([`Report::same`]) and carries bitmap bytes
    /// all the same (refused: one encoding per report).
    #[error("report marked same carries a bitmap")]
    SameWithBitmap,
    /// [`Report::join`] of a report that leaves its bitmap out ([`Report::same`]): the bitmap
    /// is the one of [`Report::version`] the recipient holds, not in the report or any part.
    #[error("report leaves its bitmap out (same): use the bitmap of its version")]
    BitmapLeftOut,
}

/// The digest of a presence set: which names, in which order, a bitmap's bits stand for, and
/// how many. A member reads a report's bitmap only when its own set has the same [`SetId`]:
/// two nodes whose views of the set differ (a node joined or left, a watch lags) would read bit
/// `i` as two different nodes, and counting a node heard that the voter never heard is how two
/// nodes end up owning one IP.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SetId {
    /// SHA-256 of the set (a domain string, the count, then each name with its length),
    /// truncated to [`SET_DIGEST_LEN`] bytes: an accidental match is a 2^-128 chance. It does
    /// not authenticate anything; the message's tag does.
    pub digest: [u8; SET_DIGEST_LEN],
    /// Number of nodes in the set.
    pub len: u16,
}

impl SetId {
    /// The id of the presence set `names`, given in strictly ascending (byte) order, as a
    /// `BTreeSet<String>` iterates.
    pub fn of<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<Self, WireError> {
        let names: Vec<&str> = names.into_iter().collect();
        let len = u16::try_from(names.len()).map_err(|_| Shape::SetTooLarge)?;
        let mut hash = Sha256::new();
        hash.update(SET_DOMAIN);
        hash.update(len.to_be_bytes());
        for (i, name) in names.iter().enumerate() {
            if name.is_empty() || name.len() > MAX_NAME_LEN {
                return Err(Shape::NameLength.into());
            }
            if i > 0 && names[i - 1] >= *name {
                return Err(Shape::NotAscending.into());
            }
            // Length-prefixed, so no two different sets hash the same bytes.
            hash.update([name.len() as u8]);
            hash.update(name.as_bytes());
        }
        let mut digest = [0; SET_DIGEST_LEN];
        digest.copy_from_slice(&hash.finalize()[..SET_DIGEST_LEN]);
        Ok(SetId { digest, len })
    }

    /// Bytes of the bitmap over this set.
    pub fn bitmap_bytes(&self) -> usize {
        usize::from(self.len).div_ceil(8)
    }

    /// Whether a report over this set carries its bitmap itself (up to [`INLINE_MAX_NODES`]),
    /// rather than in [`Part`]s.
    pub fn inline(&self) -> bool {
        usize::from(self.len) <= INLINE_MAX_NODES
    }
}

/// A node named by its index in the sorted presence set and a check of its name.
///
/// The index alone is compact (2 bytes instead of up to 254) but means a node only within one
/// set; the check lets the receiver tell whether its own set has the same node at that index,
/// so an acknowledgement still counts for the right voter while two nodes' sets differ (during
/// churn the set ids differ, but the voters rarely move).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeRef {
    /// Position of the node in the sorted presence set.
    pub index: u16,
    /// [`name_check`] of its name.
    pub check: [u8; NAME_CHECK_LEN],
}

impl NodeRef {
    /// The node `name` at `index` of the set.
    pub fn new(index: u16, name: &str) -> Self {
        NodeRef {
            index,
            check: name_check(name),
        }
    }

    /// Whether this names `name` (at any index).
    pub fn names(&self, name: &str) -> bool {
        self.check == name_check(name)
    }
}

/// SHA-256 of a node name, truncated to [`NAME_CHECK_LEN`] bytes (64 bits: against mistaken
/// indexes, not forgery, which the tag stops).
pub fn name_check(name: &str) -> [u8; NAME_CHECK_LEN] {
    let hash = Sha256::new()
        .chain_update(NAME_DOMAIN)
        .chain_update(name.as_bytes())
        .finalize();
    let mut check = [0; NAME_CHECK_LEN];
    check.copy_from_slice(&hash[..NAME_CHECK_LEN]);
    check
}

/// Which message of a speaker was received last: its boot and sequence number, as v3's
/// [`crate::heartbeat::Heard`] and the replay rule ([`crate::replay`]) use them. `(0, 0)`:
/// none yet (no message has sequence number 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Seen {
    /// The boot (random per process start) of the message received.
    pub boot: u64,
    /// Its sequence number.
    pub seq: u64,
}

/// A member's acknowledgement of a voter's reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ack {
    /// The voter, in the set of the beat that carries the acknowledgement.
    pub voter: NodeRef,
    /// The voter's last report the member received.
    pub seen: Seen,
}

/// Member → voter: "I am alive, this is what I use and what I heard from you". One beat,
/// signed once, goes to every voter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Beat {
    /// The sender's node name (a name, not an index: a node new to the cluster is not yet in
    /// every voter's set).
    pub node: String,
    /// Random per process start; a restarted speaker starts a new sequence.
    pub boot: u64,
    /// Increases with every beat of one boot (the replay rule's, [`crate::replay`]).
    pub seq: u64,
    /// The sender's wall clock, milliseconds since the Unix epoch (the replay rule's window).
    pub unix_ms: u64,
    /// The sender may own IPs (caches synced, settled, an interface usable).
    pub ready: bool,
    /// The sender is shutting down and gives its IPs up.
    pub leaving: bool,
    /// With `leaving`: a new process replaces the sender on the same node (restart hold).
    pub restarting: bool,
    /// The presence set the sender indexes nodes in (its acknowledgements' voters); a voter
    /// whose set differs learns that the sender's view lags or leads its own. `len` 0: the
    /// sender knows no set yet (then no acknowledgements).
    pub set: SetId,
    /// Names of the sender's interfaces that can announce: strictly ascending (a `BTreeSet`),
    /// each 1 to [`MAX_INTERFACE_LEN`] bytes, at most [`MAX_INTERFACES`].
    pub interfaces: BTreeSet<String>,
    /// Per voter, the last report received from it: strictly ascending by voter index, at most
    /// [`MAX_ACKS`]. A voter uses them to know which of its reports, and so which bitmap
    /// version, the sender holds (for `told`, and to leave an unchanged bitmap out).
    pub acks: Vec<Ack>,
}

/// Voter → member: which ready nodes the voter hears, over the sorted presence set, and what the
/// voter's acknowledgement of the recipient is worth.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The voter, in [`Report::set`].
    pub voter: NodeRef,
    /// The member the report is for, in [`Report::set`]: a report captured on its way to one
    /// node and sent to another is not taken as that node's.
    pub to: NodeRef,
    /// Random per voter process start.
    pub boot: u64,
    /// Increases with every report the voter sends, to any member: `(voter, boot, seq)` names
    /// one report, which its parts repeat.
    pub seq: u64,
    /// The voter's wall clock, milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// The presence set the bitmap indexes.
    pub set: SetId,
    /// The recipient's last beat the voter received: what tells the member the voter hears it.
    pub ack: Seen,
    /// The voter has heard the recipient without a silence for 1.5 failure timeouts, so `ack`
    /// may be used as an acknowledgement bounding when the voter can stop hearing it (the
    /// tenure, decision 0015 "Acknowledgements mature"). Without it `ack` only says the voter
    /// hears the recipient now. Flag bit 0x01, in the octet after `ack`.
    pub mature: bool,
    /// Every member that may hold one of this voter's reports (one sent within the last 1.5
    /// failure timeouts) holds one that lists the recipient ready: the recipient may start
    /// claiming on a majority of such reports. Flag bit 0x02, in the octet after `ack`.
    pub told: bool,
    /// The bitmap is left out: it is the one of `version`, which the recipient acknowledged
    /// holding. A member that does not hold that version's bitmap cannot read the report and
    /// ignores it (without acknowledging it), so the voter sends the bitmap again. Flag bit
    /// 0x04, in the octet after `ack`; `bitmap` is then empty whatever the set's size, and the
    /// report has no [`Part`]s.
    pub same: bool,
    /// The voter's listing version (per boot) the bitmap is of: it increases whenever the
    /// voter's bitmap changes. A member keeps the last bitmap it received from each voter with
    /// its version. Eight bytes after the flags octet.
    pub version: u64,
    /// The voter configuration the voter serves (decision 0023, "The voter set"): a member
    /// counts a report only toward the rules of that generation, so members on two
    /// configurations never count one report toward both. A voter serves one generation per
    /// process. Eight bytes after the version, before the bitmap.
    pub generation: u64,
    /// Bit `i`: the voter hears node `i` of the set (a beat arrived within the failure timeout,
    /// or the node is held through its restart hold) and its last beat said ready and not
    /// leaving. [`SetId::bitmap_bytes`] long with the bits past the last node clear; empty when
    /// the report is `same`, or when the set is larger than [`INLINE_MAX_NODES`] (the bitmap
    /// then travels in [`Part`]s, see [`Report::split`], which keeps the flags and version in
    /// the report).
    pub bitmap: Vec<u8>,
}

/// Voter → member: a slice of a report's bitmap, for sets larger than [`INLINE_MAX_NODES`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    /// The voter, as in its report.
    pub voter: NodeRef,
    /// The report's boot.
    pub boot: u64,
    /// The report's sequence number.
    pub seq: u64,
    /// The report's set.
    pub set: SetId,
    /// Byte offset of the slice in the bitmap: a multiple of [`PART_BYTES`].
    pub offset: u16,
    /// The slice: [`PART_BYTES`], or what is left for the last part.
    pub bytes: Vec<u8>,
}

/// A v4 message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// Member → voter.
    Beat(Beat),
    /// Voter → member.
    Report(Report),
    /// Voter → member, a slice of a large report's bitmap.
    Part(Part),
}

impl From<Beat> for Message {
    fn from(beat: Beat) -> Self {
        Message::Beat(beat)
    }
}

impl From<Report> for Message {
    fn from(report: Report) -> Self {
        Message::Report(report)
    }
}

impl From<Part> for Message {
    fn from(part: Part) -> Self {
        Message::Part(part)
    }
}

/// Who sent a message, as [`sender`] reads it without checking the tag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sender {
    /// A member's beat, by node name.
    Node(String),
    /// A voter's report or part.
    Voter(NodeRef),
}

/// The ferrolb heartbeat version of `datagram` (3 or 4 today), from its first four bytes, or
/// `None` if it is not a ferrolb heartbeat: a speaker that takes both formats on one socket
/// during a rolling upgrade sends each to its decoder.
pub fn version(datagram: &[u8]) -> Option<u8> {
    match datagram {
        [b'F', b'L', b'B', v, ..] => Some(*v),
        _ => None,
    }
}

/// Who sent `datagram`, once its length and shape are right, without computing its tag: for a
/// cheap refusal (a node not in the cluster, a rate limit per sender) before the HMAC. The
/// sender is not authenticated until [`Message::decode`].
pub fn sender(datagram: &[u8]) -> Result<Sender, WireError> {
    let (body, _) = checked_body(datagram)?;
    Ok(match parse(body)? {
        Message::Beat(beat) => Sender::Node(beat.node),
        Message::Report(report) => Sender::Voter(report.voter),
        Message::Part(part) => Sender::Voter(part.voter),
    })
}

impl Message {
    /// Encodes the message and signs it with the ring's signing key. A message the format does
    /// not allow (a name too long, a list out of order, a bitmap of the wrong length...) is
    /// refused with the [`Shape`] the decoder would refuse it with.
    pub fn encode(&self, keys: &KeyRing) -> Result<Vec<u8>, WireError> {
        self.encode_with(keys.signing())
    }

    /// [`Message::encode`] with one key.
    pub fn encode_with(&self, key: &[u8]) -> Result<Vec<u8>, WireError> {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(&MAGIC);
        match self {
            Message::Beat(b) => write_beat(&mut out, b)?,
            Message::Report(r) => write_report(&mut out, r)?,
            Message::Part(p) => write_part(&mut out, p)?,
        }
        // One set of rules: what the decoder refuses is never sent.
        parse(&out)?;
        let tag = mac(key).chain_update(&out).finalize().into_bytes();
        out.extend_from_slice(&tag[..TAG_LEN]);
        if out.len() > MAX_DATAGRAM {
            // Cannot happen within the limits above (checked when the crate compiles).
            return Err(WireError::TooLarge {
                len: out.len(),
                max: MAX_DATAGRAM,
            });
        }
        Ok(out)
    }

    /// Checks the length and the shape, then the tag under each key of `keys` in turn, and
    /// returns the message and the position of the key that verified (0: the signing key).
    /// Never panics, whatever the bytes; computes no tag for a datagram refused on its length or
    /// shape.
    pub fn decode(datagram: &[u8], keys: &KeyRing) -> Result<(Self, usize), WireError> {
        let (body, tag) = checked_body(datagram)?;
        let message = parse(body)?;
        let index = keys
            .keys()
            .position(|key| verifies(key, body, tag))
            .ok_or(WireError::BadTag)?;
        Ok((message, index))
    }
}

impl Report {
    /// The datagrams' messages for this report: the report itself when its set is at most
    /// [`INLINE_MAX_NODES`] or it leaves its bitmap out ([`Report::same`], whatever the set's
    /// size), else the report without its bitmap and the parts that carry it. `bitmap` must be
    /// [`SetId::bitmap_bytes`] long, or empty for a `same` report.
    pub fn split(mut self) -> Result<(Report, Vec<Part>), WireError> {
        if self.same {
            return if self.bitmap.is_empty() {
                Ok((self, Vec::new()))
            } else {
                Err(Shape::SameWithBitmap.into())
            };
        }
        check_bitmap(&self.bitmap, self.set.len)?;
        if self.set.inline() {
            return Ok((self, Vec::new()));
        }
        let bitmap = std::mem::take(&mut self.bitmap);
        let mut parts = Vec::new();
        for (i, slice) in bitmap.chunks(PART_BYTES).enumerate() {
            let offset = u16::try_from(i * PART_BYTES).map_err(|_| Shape::PartSlice)?;
            parts.push(Part {
                voter: self.voter,
                boot: self.boot,
                seq: self.seq,
                set: self.set,
                offset,
                bytes: slice.to_vec(),
            });
        }
        Ok((self, parts))
    }

    /// The whole bitmap of this report: its own, or for a set larger than
    /// [`INLINE_MAX_NODES`], the slices of `parts`, which must be this report's (same voter,
    /// boot, sequence number and set), each offset once, in any order. A report that leaves its
    /// bitmap out ([`Report::same`]) has none to give: [`Shape::BitmapLeftOut`], and the caller
    /// uses the bitmap of [`Report::version`] it keeps from an earlier report.
    pub fn join<'a>(
        &self,
        parts: impl IntoIterator<Item = &'a Part>,
    ) -> Result<Vec<u8>, WireError> {
        if self.same {
            return Err(Shape::BitmapLeftOut.into());
        }
        let mut parts: Vec<&Part> = parts.into_iter().collect();
        if self.set.inline() {
            return if parts.is_empty() {
                Ok(self.bitmap.clone())
            } else {
                Err(Shape::PartsMismatch.into())
            };
        }
        parts.sort_by_key(|p| p.offset);
        let mut bitmap = Vec::with_capacity(self.set.bitmap_bytes());
        for part in parts {
            if part.voter != self.voter
                || part.boot != self.boot
                || part.seq != self.seq
                || part.set != self.set
                || usize::from(part.offset) != bitmap.len()
            {
                return Err(Shape::PartsMismatch.into());
            }
            bitmap.extend_from_slice(&part.bytes);
        }
        if bitmap.len() != self.set.bitmap_bytes() {
            return Err(Shape::PartsMismatch.into());
        }
        Ok(bitmap)
    }
}

/// A bitmap over a set of `len` nodes with the nodes of `heard` set (indexes past `len` are
/// left out).
pub fn bitmap(len: u16, heard: impl IntoIterator<Item = usize>) -> Vec<u8> {
    let len = usize::from(len);
    let mut bits = vec![0; len.div_ceil(8)];
    for i in heard.into_iter().filter(|i| *i < len) {
        bits[i / 8] |= 0x80 >> (i % 8);
    }
    bits
}

/// Whether node `i` is set in `bitmap` (false past its end).
pub fn heard(bitmap: &[u8], i: usize) -> bool {
    bitmap
        .get(i / 8)
        .is_some_and(|b| b & (0x80 >> (i % 8)) != 0)
}

/// `bitmap` is exactly as long as a set of `len` nodes needs, with no bit set past the last.
fn check_bitmap(bitmap: &[u8], len: u16) -> Result<(), Shape> {
    let len = usize::from(len);
    if bitmap.len() != len.div_ceil(8) {
        return Err(Shape::BitmapLength);
    }
    check_padding(bitmap, len)
}

/// No bit set past node `len - 1` in the last byte of `bitmap` (which ends at node `len`).
fn check_padding(bitmap: &[u8], len: usize) -> Result<(), Shape> {
    let used = len % 8;
    match bitmap.last() {
        Some(last) if used != 0 && last & (0xff >> used) != 0 => Err(Shape::Padding),
        _ => Ok(()),
    }
}

/// The body and tag of `datagram`, if it is no longer than the format allows (the first check,
/// one comparison) and long enough for a tag.
fn checked_body(datagram: &[u8]) -> Result<(&[u8], &[u8]), WireError> {
    if datagram.len() > MAX_DATAGRAM {
        return Err(WireError::TooLarge {
            len: datagram.len(),
            max: MAX_DATAGRAM,
        });
    }
    let body_len = datagram
        .len()
        .checked_sub(TAG_LEN)
        .ok_or(Shape::Truncated)?;
    Ok(datagram.split_at(body_len))
}

fn write_name(out: &mut Vec<u8>, name: &str, max: usize, shape: Shape) -> Result<(), Shape> {
    if name.is_empty() || name.len() > max {
        return Err(shape);
    }
    // max is at most 253, so the length fits its octet.
    out.push(name.len() as u8);
    out.extend_from_slice(name.as_bytes());
    Ok(())
}

fn write_node_ref(out: &mut Vec<u8>, node: &NodeRef) {
    out.extend_from_slice(&node.index.to_be_bytes());
    out.extend_from_slice(&node.check);
}

fn write_set(out: &mut Vec<u8>, set: &SetId) {
    out.extend_from_slice(&set.digest);
    out.extend_from_slice(&set.len.to_be_bytes());
}

fn write_seen(out: &mut Vec<u8>, seen: &Seen) {
    out.extend_from_slice(&seen.boot.to_be_bytes());
    out.extend_from_slice(&seen.seq.to_be_bytes());
}

fn write_beat(out: &mut Vec<u8>, b: &Beat) -> Result<(), Shape> {
    out.push(KIND_BEAT);
    out.push(
        if b.ready { FLAG_READY } else { 0 }
            | if b.leaving { FLAG_LEAVING } else { 0 }
            | if b.restarting { FLAG_RESTARTING } else { 0 },
    );
    out.extend_from_slice(&b.boot.to_be_bytes());
    out.extend_from_slice(&b.seq.to_be_bytes());
    out.extend_from_slice(&b.unix_ms.to_be_bytes());
    write_set(out, &b.set);
    write_name(out, &b.node, MAX_NAME_LEN, Shape::NameLength)?;
    if b.interfaces.len() > MAX_INTERFACES {
        return Err(Shape::TooManyInterfaces);
    }
    out.push(b.interfaces.len() as u8);
    for name in &b.interfaces {
        write_name(out, name, MAX_INTERFACE_LEN, Shape::InterfaceLength)?;
    }
    if b.acks.len() > MAX_ACKS {
        return Err(Shape::TooManyAcks);
    }
    out.push(b.acks.len() as u8);
    for ack in &b.acks {
        write_node_ref(out, &ack.voter);
        write_seen(out, &ack.seen);
    }
    Ok(())
}

fn write_report(out: &mut Vec<u8>, r: &Report) -> Result<(), Shape> {
    out.push(KIND_REPORT);
    write_node_ref(out, &r.voter);
    write_node_ref(out, &r.to);
    out.extend_from_slice(&r.boot.to_be_bytes());
    out.extend_from_slice(&r.seq.to_be_bytes());
    out.extend_from_slice(&r.unix_ms.to_be_bytes());
    write_set(out, &r.set);
    write_seen(out, &r.ack);
    out.push(
        if r.mature { FLAG_MATURE } else { 0 }
            | if r.told { FLAG_TOLD } else { 0 }
            | if r.same { FLAG_SAME } else { 0 },
    );
    out.extend_from_slice(&r.version.to_be_bytes());
    out.extend_from_slice(&r.generation.to_be_bytes());
    if r.same && !r.bitmap.is_empty() {
        return Err(Shape::SameWithBitmap);
    }
    if r.bitmap.len() > INLINE_BITMAP_BYTES {
        return Err(Shape::BitmapLength);
    }
    out.extend_from_slice(&r.bitmap);
    Ok(())
}

fn write_part(out: &mut Vec<u8>, p: &Part) -> Result<(), Shape> {
    out.push(KIND_PART);
    write_node_ref(out, &p.voter);
    out.extend_from_slice(&p.boot.to_be_bytes());
    out.extend_from_slice(&p.seq.to_be_bytes());
    write_set(out, &p.set);
    out.extend_from_slice(&p.offset.to_be_bytes());
    let len = u16::try_from(p.bytes.len()).map_err(|_| Shape::PartSlice)?;
    if p.bytes.len() > PART_BYTES {
        return Err(Shape::PartSlice);
    }
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&p.bytes);
    Ok(())
}

/// Parses a body (tag removed), checking every rule of the format's shape. Bounded by
/// [`MAX_DATAGRAM`], so it runs before the tag is computed.
fn parse(body: &[u8]) -> Result<Message, WireError> {
    let mut r = Reader(body);
    let magic = r.take(4)?;
    if magic[..3] != MAGIC[..3] {
        return Err(Shape::Magic.into());
    }
    if magic[3] != VERSION {
        return Err(WireError::Version(magic[3]));
    }
    let message = match r.u8()? {
        KIND_BEAT => Message::Beat(parse_beat(&mut r)?),
        KIND_REPORT => Message::Report(parse_report(&mut r)?),
        KIND_PART => Message::Part(parse_part(&mut r)?),
        kind => return Err(Shape::Kind(kind).into()),
    };
    if !r.0.is_empty() {
        return Err(Shape::Trailing.into());
    }
    Ok(message)
}

fn parse_beat(r: &mut Reader<'_>) -> Result<Beat, Shape> {
    let flags = r.u8()?;
    if flags & !(FLAG_READY | FLAG_LEAVING | FLAG_RESTARTING) != 0 {
        return Err(Shape::Flags(flags));
    }
    let boot = r.u64()?;
    let seq = r.u64()?;
    let unix_ms = r.u64()?;
    let set = r.set()?;
    let node = r.name(MAX_NAME_LEN, Shape::NameLength)?;
    let count = usize::from(r.u8()?);
    if count > MAX_INTERFACES {
        return Err(Shape::TooManyInterfaces);
    }
    let mut interfaces = BTreeSet::new();
    for _ in 0..count {
        let name = r.name(MAX_INTERFACE_LEN, Shape::InterfaceLength)?;
        // Strictly ascending, as a BTreeSet iterates: one encoding per beat.
        if interfaces.last().is_some_and(|last| *last >= name) {
            return Err(Shape::NotAscending);
        }
        interfaces.insert(name);
    }
    let count = usize::from(r.u8()?);
    if count > MAX_ACKS {
        return Err(Shape::TooManyAcks);
    }
    let mut acks: Vec<Ack> = Vec::with_capacity(count);
    for _ in 0..count {
        let voter = r.node_ref(set.len)?;
        let seen = r.seen()?;
        if acks
            .last()
            .is_some_and(|last| last.voter.index >= voter.index)
        {
            return Err(Shape::NotAscending);
        }
        acks.push(Ack { voter, seen });
    }
    Ok(Beat {
        node,
        boot,
        seq,
        unix_ms,
        ready: flags & FLAG_READY != 0,
        leaving: flags & FLAG_LEAVING != 0,
        restarting: flags & FLAG_RESTARTING != 0,
        set,
        interfaces,
        acks,
    })
}

fn parse_report(r: &mut Reader<'_>) -> Result<Report, Shape> {
    // The indexes come before the set they index: read them raw, check them once it is known.
    let voter = r.raw_node_ref()?;
    let to = r.raw_node_ref()?;
    let boot = r.u64()?;
    let seq = r.u64()?;
    let unix_ms = r.u64()?;
    let set = r.set()?;
    if voter.index >= set.len || to.index >= set.len {
        return Err(Shape::IndexOutOfSet);
    }
    let ack = r.seen()?;
    let flags = r.u8()?;
    if flags & !(FLAG_MATURE | FLAG_TOLD | FLAG_SAME) != 0 {
        return Err(Shape::Flags(flags));
    }
    let same = flags & FLAG_SAME != 0;
    let version = r.u64()?;
    let generation = r.u64()?;
    // The bitmap is the rest of the body: nothing when the report leaves it out, else exactly
    // the set's, or nothing when parts carry it.
    let bitmap = r.take(r.0.len())?.to_vec();
    if same {
        if !bitmap.is_empty() {
            return Err(Shape::SameWithBitmap);
        }
    } else if set.inline() {
        check_bitmap(&bitmap, set.len)?;
    } else if !bitmap.is_empty() {
        return Err(Shape::BitmapLength);
    }
    Ok(Report {
        voter,
        to,
        boot,
        seq,
        unix_ms,
        set,
        ack,
        mature: flags & FLAG_MATURE != 0,
        told: flags & FLAG_TOLD != 0,
        same,
        version,
        generation,
        bitmap,
    })
}

fn parse_part(r: &mut Reader<'_>) -> Result<Part, Shape> {
    let voter = r.raw_node_ref()?;
    let boot = r.u64()?;
    let seq = r.u64()?;
    let set = r.set()?;
    if voter.index >= set.len {
        return Err(Shape::IndexOutOfSet);
    }
    let offset = r.u16()?;
    let len = usize::from(r.u16()?);
    let bytes = r.take(len)?.to_vec();
    // Parts exist only for bitmaps a report cannot carry, cut at fixed offsets: one way to
    // split a bitmap, so one encoding.
    let total = set.bitmap_bytes();
    let at = usize::from(offset);
    if set.inline() || at % PART_BYTES != 0 || at >= total || len != PART_BYTES.min(total - at) {
        return Err(Shape::PartSlice);
    }
    if at + len == total {
        check_padding(&bytes, usize::from(set.len))?;
    }
    Ok(Part {
        voter,
        boot,
        seq,
        set,
        offset,
        bytes,
    })
}

/// Reads a body front to back; running out is [`Shape::Truncated`], never a panic.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Shape> {
        if self.0.len() < n {
            return Err(Shape::Truncated);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Shape> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, Shape> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, Shape> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, Shape> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    fn name(&mut self, max: usize, shape: Shape) -> Result<String, Shape> {
        let len = usize::from(self.u8()?);
        if len == 0 || len > max {
            return Err(shape);
        }
        String::from_utf8(self.take(len)?.to_vec()).map_err(|_| Shape::NotUtf8)
    }

    fn set(&mut self) -> Result<SetId, Shape> {
        Ok(SetId {
            digest: self.array()?,
            len: self.u16()?,
        })
    }

    fn raw_node_ref(&mut self) -> Result<NodeRef, Shape> {
        Ok(NodeRef {
            index: self.u16()?,
            check: self.array()?,
        })
    }

    fn node_ref(&mut self, set_len: u16) -> Result<NodeRef, Shape> {
        let node = self.raw_node_ref()?;
        if node.index >= set_len {
            return Err(Shape::IndexOutOfSet);
        }
        Ok(node)
    }

    fn seen(&mut self) -> Result<Seen, Shape> {
        Ok(Seen {
            boot: self.u64()?,
            seq: self.u64()?,
        })
    }
}

/// Sample messages for this module's tests.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;

    /// A presence set of `n` names of `len` bytes each (at least 6), sorted.
    pub(crate) fn names(n: usize, len: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("node-{i:0>width$}", width = len.saturating_sub(5)))
            .collect()
    }

    /// The id of [`names`].
    pub(crate) fn set_of(names: &[String]) -> SetId {
        SetId::of(names.iter().map(String::as_str)).unwrap_or_default()
    }

    /// A ready beat of `node`, over `set`, acknowledging voters 0 and 2 of `names`.
    pub(crate) fn beat(node: &str, names: &[String]) -> Beat {
        Beat {
            node: node.into(),
            boot: 7,
            seq: 11,
            unix_ms: 1_000_000,
            ready: true,
            leaving: false,
            restarting: false,
            set: set_of(names),
            interfaces: ["eth0".to_string()].into(),
            acks: [0u16, 2]
                .iter()
                .filter(|i| usize::from(**i) < names.len())
                .map(|i| Ack {
                    voter: NodeRef::new(*i, &names[usize::from(*i)]),
                    seen: Seen { boot: 9, seq: 40 },
                })
                .collect(),
        }
    }

    /// Voter 0's report of `names` to node 1, hearing every even node (bitmap version 3, carried);
    /// its ack mature, the recipient not yet told ready everywhere.
    pub(crate) fn report(names: &[String]) -> Report {
        let set = set_of(names);
        Report {
            voter: NodeRef::new(0, &names[0]),
            to: NodeRef::new(1, &names[1]),
            boot: 9,
            seq: 40,
            unix_ms: 1_000_050,
            set,
            ack: Seen { boot: 7, seq: 11 },
            mature: true,
            told: false,
            same: false,
            version: 3,
            generation: 2,
            bitmap: bitmap(set.len, (0..names.len()).step_by(2)),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::fixtures::{beat, names, report, set_of};
    use super::*;
    use crate::heartbeat::{Heartbeat, HeartbeatError, tag_count};
    use proptest::prelude::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";
    const NEXT: &[u8] = b"fedcba9876543210fedcba9876543210";

    fn ring() -> KeyRing {
        KeyRing::new([KEY.to_vec()]).unwrap()
    }

    /// Re-signs `body` (a message without its tag) with [`KEY`].
    fn signed(body: &[u8]) -> Vec<u8> {
        let tag = mac(KEY).chain_update(body).finalize().into_bytes();
        [body, &tag[..TAG_LEN]].concat()
    }

    /// The body of `m` encoded, passed through `edit`, signed again: a malformed message with a
    /// good tag, so only the shape check can refuse it.
    fn edited(m: impl Into<Message>, edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let bytes = m.into().encode(&ring()).unwrap();
        let mut body = bytes[..bytes.len() - TAG_LEN].to_vec();
        edit(&mut body);
        signed(&body)
    }

    fn refused(datagram: &[u8]) -> WireError {
        let before = tag_count();
        let err = Message::decode(datagram, &ring()).unwrap_err();
        assert_eq!(sender(datagram).unwrap_err(), err, "sender() disagrees");
        assert_eq!(tag_count(), before, "a tag was computed for {err:?}");
        err
    }

    /// A presence set's worst case: 5,000 nodes, every name 253 bytes.
    fn worst_names() -> Vec<String> {
        names(5000, MAX_NAME_LEN)
    }

    #[test]
    fn every_message_fits_one_frame_at_5000_nodes_with_the_longest_names() {
        let names = worst_names();
        let set = set_of(&names);
        assert_eq!(set.len, 5000);
        // Beat: the longest name, the most interfaces of the longest names, the most acks.
        let mut b = beat(&names[4999], &names);
        b.interfaces = (0..MAX_INTERFACES).map(|i| format!("{i:0>15}")).collect();
        b.acks = (0..MAX_ACKS as u16)
            .map(|i| Ack {
                voter: NodeRef::new(i * 300, &names[usize::from(i) * 300]),
                seen: Seen {
                    boot: u64::MAX,
                    seq: u64::MAX,
                },
            })
            .collect();
        let beat_len = Message::from(b).encode(&ring()).unwrap().len();
        assert_eq!(beat_len, MAX_BEAT_LEN);
        // Report: every node heard, the bitmap inline (no part needed at 5,000).
        let mut r = report(&names);
        r.bitmap = bitmap(set.len, 0..5000);
        let (r, parts) = r.split().unwrap();
        assert!(parts.is_empty());
        let report_len = Message::from(r.clone()).encode(&ring()).unwrap().len();
        assert_eq!(report_len, REPORT_OVERHEAD + 625);
        // The same report leaving its bitmap out: its length does not depend on the set.
        let same = Report {
            same: true,
            bitmap: Vec::new(),
            ..r
        };
        let same_len = Message::from(same.clone()).encode(&ring()).unwrap().len();
        assert_eq!(same_len, REPORT_OVERHEAD);
        for len in [3, 5000, INLINE_MAX_NODES as u16 + 1, u16::MAX] {
            let other = Report {
                set: SetId {
                    digest: [6; 16],
                    len,
                },
                ..same.clone()
            };
            assert_eq!(
                Message::from(other).encode(&ring()).unwrap().len(),
                same_len
            );
        }
        // The figures the module's documentation gives.
        assert_eq!(
            (beat_len, report_len, same_len, INLINE_MAX_NODES, PART_BYTES),
            (1248, 741, 116, 10_848, 1403)
        );
        for len in [beat_len, report_len, same_len] {
            assert!(len <= MAX_DATAGRAM, "{len} bytes");
        }
        // Beyond 5,000: the largest inline report and the largest set's parts also fit.
        let big = SetId {
            digest: [1; 16],
            len: u16::MAX,
        };
        let r = Report {
            set: big,
            bitmap: vec![0xff; big.bitmap_bytes() - 1]
                .into_iter()
                .chain([0xfe])
                .collect(),
            ..report(&names)
        };
        let (head, parts) = r.clone().split().unwrap();
        assert_eq!(parts.len(), 6);
        assert!(head.bitmap.is_empty());
        for m in std::iter::once(Message::from(head.clone()))
            .chain(parts.iter().cloned().map(Message::from))
        {
            assert!(m.encode(&ring()).unwrap().len() <= MAX_DATAGRAM);
        }
        assert_eq!(head.join(&parts).unwrap(), r.bitmap);
        let inline = SetId {
            digest: [2; 16],
            len: INLINE_MAX_NODES as u16,
        };
        let r = Report {
            set: inline,
            bitmap: vec![0; inline.bitmap_bytes()],
            ..report(&names)
        };
        assert_eq!(
            Message::from(r).encode(&ring()).unwrap().len(),
            MAX_DATAGRAM
        );
    }

    #[test]
    fn round_trips_under_a_key_ring() {
        let names = names(10, 8);
        let ring = KeyRing::new([KEY.to_vec(), NEXT.to_vec()]).unwrap();
        let next_first = KeyRing::new([NEXT.to_vec(), KEY.to_vec()]).unwrap();
        for m in [
            Message::from(beat("node-002", &names)),
            Message::from(report(&names)),
        ] {
            let bytes = m.encode(&ring).unwrap();
            assert_eq!(Message::decode(&bytes, &ring), Ok((m.clone(), 0)));
            // Signed with the other key of a rotation: accepted, and which key says so.
            assert_eq!(Message::decode(&bytes, &next_first), Ok((m.clone(), 1)));
            let other = KeyRing::new([b"another key, 16 bytes".to_vec()]).unwrap();
            assert_eq!(Message::decode(&bytes, &other), Err(WireError::BadTag));
            let mut flipped = bytes.clone();
            flipped[12] ^= 1;
            assert_eq!(Message::decode(&flipped, &ring), Err(WireError::BadTag));
        }
    }

    /// Offset of a report's flags in its body: magic, kind, voter, recipient, boot, sequence
    /// number, clock, set, acknowledgement.
    const REPORT_FLAGS_AT: usize = 5 + 2 * NODE_REF_LEN + 24 + SET_ID_LEN + SEEN_LEN;

    #[test]
    fn report_flags_round_trip_in_one_octet_after_the_ack() {
        let names = names(10, 8);
        for (mature, told, octet) in [
            (false, false, 0x00),
            (true, false, 0x01),
            (false, true, 0x02),
            (true, true, 0x03),
        ] {
            let r = Report {
                mature,
                told,
                ..report(&names)
            };
            let bytes = Message::from(r.clone()).encode(&ring()).unwrap();
            assert_eq!(
                bytes[REPORT_FLAGS_AT], octet,
                "mature {mature}, told {told}"
            );
            // The version follows the flags, then the generation, then the bitmap.
            assert_eq!(
                bytes[REPORT_FLAGS_AT + 1..REPORT_FLAGS_AT + 9],
                3u64.to_be_bytes()
            );
            assert_eq!(
                bytes[REPORT_FLAGS_AT + 9..REPORT_FLAGS_AT + 17],
                2u64.to_be_bytes()
            );
            assert_eq!(bytes[REPORT_FLAGS_AT + 17..bytes.len() - TAG_LEN], r.bitmap);
            assert_eq!(bytes.len(), REPORT_OVERHEAD + r.bitmap.len());
            assert_eq!(
                Message::decode(&bytes, &ring()),
                Ok((Message::from(r.clone()), 0))
            );
            // A report split into parts keeps its flags in the head.
            let big = Report {
                set: SetId {
                    digest: [4; 16],
                    len: 20_000,
                },
                bitmap: vec![0; 2500],
                ..r
            };
            let (head, parts) = big.clone().split().unwrap();
            assert!(!parts.is_empty());
            assert_eq!((head.mature, head.told), (mature, told));
            let bytes = Message::from(head.clone()).encode(&ring()).unwrap();
            assert_eq!(bytes[REPORT_FLAGS_AT], octet);
            let Message::Report(back) = Message::decode(&bytes, &ring()).unwrap().0 else {
                panic!("not a report");
            };
            assert_eq!((back.mature, back.told, back.version), (mature, told, 3));
            assert_eq!(back.join(&parts).unwrap(), big.bitmap);
        }
    }

    /// `report` leaving its bitmap out, with `version`.
    fn same_report(names: &[String], version: u64) -> Report {
        Report {
            same: true,
            version,
            bitmap: Vec::new(),
            ..report(names)
        }
    }

    #[test]
    fn a_same_report_round_trips_without_its_bitmap_whatever_the_set() {
        let names = names(10, 8);
        let small = same_report(&names, 0x0102_0304_0506_0708);
        let big = Report {
            set: SetId {
                digest: [4; 16],
                len: 20_000,
            },
            ..small.clone()
        };
        for r in [small, big] {
            let bytes = Message::from(r.clone()).encode(&ring()).unwrap();
            assert_eq!(bytes.len(), REPORT_OVERHEAD);
            // Flags: mature and same; then the version, the generation and the tag, nothing
            // between.
            assert_eq!(bytes[REPORT_FLAGS_AT], 0x05);
            assert_eq!(
                bytes[REPORT_FLAGS_AT + 1..bytes.len() - TAG_LEN],
                [1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0, 2]
            );
            assert_eq!(
                Message::decode(&bytes, &ring()),
                Ok((Message::from(r.clone()), 0))
            );
            assert_eq!(sender(&bytes), Ok(Sender::Voter(r.voter)));
        }
    }

    #[test]
    fn a_same_report_carrying_bitmap_bytes_is_refused() {
        let names = names(10, 8);
        // Marked same with its bitmap still in: refused before any tag, whatever the set.
        let datagram = edited(report(&names), |body| body[REPORT_FLAGS_AT] |= FLAG_SAME);
        assert_eq!(refused(&datagram), Shape::SameWithBitmap.into());
        let datagram = edited(same_report(&names, 3), |body| body.push(0));
        assert_eq!(refused(&datagram), Shape::SameWithBitmap.into());
        let big = Report {
            set: SetId {
                digest: [4; 16],
                len: 20_000,
            },
            ..same_report(&names, 3)
        };
        let datagram = edited(big, |body| body.extend_from_slice(&[0; 100]));
        assert_eq!(refused(&datagram), Shape::SameWithBitmap.into());
        // Cut inside its version.
        let datagram = edited(same_report(&names, 3), |body| {
            body.truncate(REPORT_FLAGS_AT + 5)
        });
        assert_eq!(refused(&datagram), Shape::Truncated.into());
        // Never encoded either, nor split.
        let wrong = Report {
            same: true,
            ..report(&names)
        };
        assert_eq!(
            Message::from(wrong.clone()).encode(&ring()),
            Err(Shape::SameWithBitmap.into())
        );
        assert_eq!(wrong.split(), Err(Shape::SameWithBitmap.into()));
    }

    #[test]
    fn a_same_report_has_no_parts_and_nothing_to_join() {
        let names = names(10, 8);
        for len in [10, 20_000, u16::MAX] {
            let r = Report {
                set: SetId {
                    digest: [4; 16],
                    len,
                },
                ..same_report(&names, 9)
            };
            // No bitmap needed, none made up: the report alone.
            let (head, parts) = r.clone().split().unwrap();
            assert_eq!(head, r);
            assert!(parts.is_empty());
            // Its bitmap is the recipient's kept one: join has none to give.
            assert_eq!(head.join([]), Err(Shape::BitmapLeftOut.into()));
        }
        // Not even with the parts of a report over the same set.
        let (_, parts) = big_report().split().unwrap();
        let r = Report {
            set: big_report().set,
            ..same_report(&names, 9)
        };
        assert_eq!(r.join(&parts), Err(Shape::BitmapLeftOut.into()));
    }

    #[test]
    fn reports_with_unknown_flags_are_refused_before_any_tag() {
        let names = names(10, 8);
        for bit in [0x08u8, 0x10, 0x20, 0x40, 0x80] {
            let datagram = edited(report(&names), |body| body[REPORT_FLAGS_AT] |= bit);
            assert_eq!(refused(&datagram), Shape::Flags(0x01 | bit).into());
            let datagram = edited(same_report(&names, 3), |body| body[REPORT_FLAGS_AT] |= bit);
            assert_eq!(refused(&datagram), Shape::Flags(0x05 | bit).into());
        }
        // The flags octet missing (a report cut right after its ack).
        let datagram = edited(report(&names), |body| body.truncate(REPORT_FLAGS_AT));
        assert_eq!(refused(&datagram), Shape::Truncated.into());
    }

    #[test]
    fn v3_and_v4_refuse_each_other_and_are_told_apart() {
        let hb = crate::heartbeat::fixtures::beat("node-002", 3)
            .encode(KEY)
            .unwrap();
        let v4 = Message::from(beat("node-002", &names(4, 8)))
            .encode(&ring())
            .unwrap();
        assert_eq!((version(&hb), version(&v4)), (Some(3), Some(4)));
        assert_eq!(version(b"XYZ\x04"), None);
        assert_eq!(version(b"FL"), None);
        assert_eq!(Heartbeat::decode(&v4, KEY), Err(HeartbeatError::Malformed));
        assert_eq!(refused(&hb), WireError::Version(3));
        assert_eq!(
            refused(b"junk and more junk, long enough"),
            Shape::Magic.into()
        );
    }

    #[test]
    fn sender_is_read_without_a_tag() {
        let names = names(4, 8);
        let before = tag_count();
        let b = Message::from(beat("node-002", &names))
            .encode(&ring())
            .unwrap();
        assert_eq!(sender(&b), Ok(Sender::Node("node-002".into())));
        let r = Message::from(report(&names)).encode(&ring()).unwrap();
        assert_eq!(sender(&r), Ok(Sender::Voter(NodeRef::new(0, "node-000"))));
        assert!(NodeRef::new(0, "node-000").names("node-000"));
        assert!(!NodeRef::new(0, "node-000").names("node-001"));
        assert_eq!(tag_count(), before);
    }

    #[test]
    fn oversize_datagrams_are_refused_before_parsing() {
        let mut big = Message::from(report(&names(4, 8))).encode(&ring()).unwrap();
        big.resize(MAX_DATAGRAM + 1, 0);
        assert_eq!(
            refused(&big),
            WireError::TooLarge {
                len: MAX_DATAGRAM + 1,
                max: MAX_DATAGRAM
            }
        );
        assert_eq!(
            refused(&[0xa5; 65_507]),
            WireError::TooLarge {
                len: 65_507,
                max: MAX_DATAGRAM
            }
        );
        assert_eq!(refused(&[]), Shape::Truncated.into());
        assert_eq!(refused(&[1; TAG_LEN - 1]), Shape::Truncated.into());
    }

    /// Offsets in a beat's body: after the fixed part, the name's length octet.
    const BEAT_NAME_AT: usize = BEAT_FIXED;

    #[test]
    fn malformed_beats_are_refused_before_any_tag() {
        let names = names(4, 8);
        let b = || beat("node-002", &names);
        // The interfaces' count comes after the name (1 + 8 bytes).
        let ifs_at = BEAT_NAME_AT + 1 + 8;
        let cases: Vec<(Vec<u8>, WireError)> = vec![
            (edited(b(), |body| body[4] = 9), Shape::Kind(9).into()),
            (
                edited(b(), |body| body[5] |= 0x08),
                Shape::Flags(0x09).into(),
            ),
            (
                edited(b(), |body| body.truncate(body.len() - 1)),
                Shape::Truncated.into(),
            ),
            (edited(b(), |body| body.push(0)), Shape::Trailing.into()),
            // Name length 0, then 254 (one more byte inserted to keep the rest in place).
            (
                edited(b(), |body| {
                    body[BEAT_NAME_AT] = 0;
                    body.drain(BEAT_NAME_AT + 1..BEAT_NAME_AT + 9);
                }),
                Shape::NameLength.into(),
            ),
            (
                edited(b(), |body| {
                    body[BEAT_NAME_AT] = 254;
                    let pad = vec![b'n'; 254 - 8];
                    body.splice(BEAT_NAME_AT + 1..BEAT_NAME_AT + 1, pad);
                }),
                Shape::NameLength.into(),
            ),
            (
                edited(b(), |body| body[BEAT_NAME_AT + 1] = 0xff),
                Shape::NotUtf8.into(),
            ),
            (
                edited(b(), |body| body[ifs_at] = MAX_INTERFACES as u8 + 1),
                Shape::TooManyInterfaces.into(),
            ),
            // "eth0" made 16 bytes long.
            (
                edited(b(), |body| {
                    body[ifs_at + 1] = 16;
                    body.splice(ifs_at + 2..ifs_at + 2, [b'x'; 12]);
                }),
                Shape::InterfaceLength.into(),
            ),
            (
                edited(b(), |body| {
                    body[ifs_at + 1] = 0;
                    body.drain(ifs_at + 2..ifs_at + 6);
                }),
                Shape::InterfaceLength.into(),
            ),
        ];
        for (datagram, want) in cases {
            assert_eq!(refused(&datagram), want);
        }
        // Two interfaces out of order, and equal.
        for ifs in [["eth1", "eth0"], ["eth0", "eth0"]] {
            let datagram = edited(b(), |body| {
                body[ifs_at] = 2;
                let mut list = Vec::new();
                for name in ifs {
                    list.push(4);
                    list.extend_from_slice(name.as_bytes());
                }
                body.splice(ifs_at + 1..ifs_at + 6, list);
            });
            assert_eq!(refused(&datagram), Shape::NotAscending.into());
        }
        // Acks: the count after the interfaces; too many, out of order, outside the set.
        let acks_at = ifs_at + 1 + 5;
        assert_eq!(
            refused(&edited(b(), |body| body[acks_at] = MAX_ACKS as u8 + 1)),
            Shape::TooManyAcks.into()
        );
        let mut swapped = b();
        swapped.acks.reverse();
        assert_eq!(
            Message::from(swapped.clone()).encode(&ring()),
            Err(Shape::NotAscending.into())
        );
        let mut dup = b();
        dup.acks[1].voter.index = 0;
        assert_eq!(
            Message::from(dup).encode(&ring()),
            Err(Shape::NotAscending.into())
        );
        let bytes = edited(b(), |body| {
            // Second ack's index: 4, the set has 4 nodes.
            body[acks_at + 1 + ACK_LEN..acks_at + 3 + ACK_LEN].copy_from_slice(&4u16.to_be_bytes());
        });
        assert_eq!(refused(&bytes), Shape::IndexOutOfSet.into());
        // A beat that knows no set cannot acknowledge anyone.
        let mut no_set = b();
        no_set.set = SetId::default();
        assert_eq!(
            Message::from(no_set.clone()).encode(&ring()),
            Err(Shape::IndexOutOfSet.into())
        );
        no_set.acks.clear();
        assert!(Message::from(no_set).encode(&ring()).is_ok());
    }

    #[test]
    fn beats_the_format_cannot_carry_are_not_encoded() {
        let names = names(4, 8);
        let mut b = beat("node-002", &names);
        b.node = "n".repeat(MAX_NAME_LEN + 1);
        assert_eq!(
            Message::from(b).encode(&ring()),
            Err(Shape::NameLength.into())
        );
        let mut b = beat("node-002", &names);
        b.node.clear();
        assert_eq!(
            Message::from(b).encode(&ring()),
            Err(Shape::NameLength.into())
        );
        let mut b = beat("node-002", &names);
        b.interfaces = (0..=MAX_INTERFACES).map(|i| format!("if{i}")).collect();
        assert_eq!(
            Message::from(b).encode(&ring()),
            Err(Shape::TooManyInterfaces.into())
        );
        let mut b = beat("node-002", &names);
        b.interfaces.insert("x".repeat(MAX_INTERFACE_LEN + 1));
        assert_eq!(
            Message::from(b).encode(&ring()),
            Err(Shape::InterfaceLength.into())
        );
        let mut b = beat("node-002", &names);
        b.acks = vec![b.acks[0]; MAX_ACKS + 1];
        assert_eq!(
            Message::from(b).encode(&ring()),
            Err(Shape::TooManyAcks.into())
        );
    }

    #[test]
    fn malformed_reports_are_refused_before_any_tag() {
        let names = names(10, 8);
        let r = || report(&names);
        // Set length at: magic, kind, voter, to, boot, seq, clock, digest.
        let set_len_at = 5 + 2 * NODE_REF_LEN + 24 + SET_DIGEST_LEN;
        let cases: Vec<(Vec<u8>, WireError)> = vec![
            // Bitmap one byte short, one byte long.
            (
                edited(r(), |body| {
                    body.pop();
                }),
                Shape::BitmapLength.into(),
            ),
            (edited(r(), |body| body.push(0)), Shape::BitmapLength.into()),
            // 10 nodes: bits 10 to 15 are padding.
            (
                edited(r(), |body| *body.last_mut().unwrap() |= 0x01),
                Shape::Padding.into(),
            ),
            // Voter index 10 in a set of 10; then the recipient's.
            (
                edited(r(), |body| body[5..7].copy_from_slice(&10u16.to_be_bytes())),
                Shape::IndexOutOfSet.into(),
            ),
            (
                edited(r(), |body| {
                    body[5 + NODE_REF_LEN..7 + NODE_REF_LEN].copy_from_slice(&10u16.to_be_bytes())
                }),
                Shape::IndexOutOfSet.into(),
            ),
            // A set of 17 nodes needs 3 bytes, the report has 2.
            (
                edited(r(), |body| {
                    body[set_len_at..set_len_at + 2].copy_from_slice(&17u16.to_be_bytes())
                }),
                Shape::BitmapLength.into(),
            ),
            // A set too large to inline: the report must carry no bitmap.
            (
                edited(r(), |body| {
                    body[set_len_at..set_len_at + 2].copy_from_slice(&u16::MAX.to_be_bytes())
                }),
                Shape::BitmapLength.into(),
            ),
            (
                edited(r(), |body| body.truncate(set_len_at + 1)),
                Shape::Truncated.into(),
            ),
        ];
        for (datagram, want) in cases {
            assert_eq!(refused(&datagram), want);
        }
        let mut wrong = r();
        wrong.bitmap.push(0);
        assert_eq!(
            Message::from(wrong.clone()).encode(&ring()),
            Err(Shape::BitmapLength.into())
        );
        assert_eq!(wrong.split(), Err(Shape::BitmapLength.into()));
        // An empty set has no voter.
        let mut empty = r();
        empty.set = SetId::default();
        empty.bitmap.clear();
        assert_eq!(
            Message::from(empty).encode(&ring()),
            Err(Shape::IndexOutOfSet.into())
        );
    }

    fn big_report() -> Report {
        let names = names(4, 8);
        let set = SetId {
            digest: [3; 16],
            len: 20_000,
        };
        Report {
            set,
            bitmap: bitmap(set.len, (0..20_000).step_by(3)),
            ..report(&names)
        }
    }

    #[test]
    fn large_bitmaps_travel_in_parts_and_come_back_whole() {
        let r = big_report();
        let (head, parts) = r.clone().split().unwrap();
        assert_eq!(parts.len(), 2500usize.div_ceil(PART_BYTES));
        assert_eq!(parts[1].bytes.len(), 2500 - PART_BYTES);
        let mut got = Vec::new();
        for m in std::iter::once(Message::from(head.clone()))
            .chain(parts.iter().cloned().map(Message::from))
        {
            let bytes = m.encode(&ring()).unwrap();
            got.push(Message::decode(&bytes, &ring()).unwrap().0);
            assert_eq!(got.last(), Some(&m));
        }
        // In any order.
        let rev: Vec<&Part> = parts.iter().rev().collect();
        assert_eq!(head.join(rev).unwrap(), r.bitmap);
        assert!(heard(&r.bitmap, 19_998) && !heard(&r.bitmap, 19_999) && !heard(&r.bitmap, 20_000));
        // Missing, repeated, or another report's parts.
        assert_eq!(head.join(&parts[..1]), Err(Shape::PartsMismatch.into()));
        assert_eq!(
            head.join([&parts[0], &parts[0], &parts[1]]),
            Err(Shape::PartsMismatch.into())
        );
        let mut other = parts[1].clone();
        other.seq += 1;
        assert_eq!(
            head.join([&parts[0], &other]),
            Err(Shape::PartsMismatch.into())
        );
        // A small report takes no parts.
        let small = report(&names(4, 8));
        assert_eq!(small.join(&parts), Err(Shape::PartsMismatch.into()));
        assert_eq!(small.join([]).unwrap(), small.bitmap);
    }

    #[test]
    fn malformed_parts_are_refused_before_any_tag() {
        let (_, parts) = big_report().split().unwrap();
        let (first, last) = (parts[0].clone(), parts[1].clone());
        let offset_at = 5 + NODE_REF_LEN + 16 + SET_ID_LEN;
        let cases: Vec<(Vec<u8>, WireError)> = vec![
            // Off the grid of offsets, and past the bitmap.
            (
                edited(first.clone(), |b| b[offset_at + 1] = 1),
                Shape::PartSlice.into(),
            ),
            (
                edited(last.clone(), |b| {
                    b[offset_at..offset_at + 2]
                        .copy_from_slice(&(2 * PART_BYTES as u16).to_be_bytes())
                }),
                Shape::PartSlice.into(),
            ),
            // A first part shorter than PART_BYTES (its length says so, the bytes agree).
            (
                edited(first.clone(), |b| {
                    let at = offset_at + 2;
                    b[at..at + 2].copy_from_slice(&((PART_BYTES - 1) as u16).to_be_bytes());
                    b.pop();
                }),
                Shape::PartSlice.into(),
            ),
            (
                edited(first.clone(), |b| {
                    b.pop();
                }),
                Shape::Truncated.into(),
            ),
            (edited(last.clone(), |b| b.push(0)), Shape::Trailing.into()),
            // 20,000 nodes end on a byte boundary: make it 19,999 and the last bit is padding.
            (
                edited(last.clone(), |b| {
                    let at = 5 + NODE_REF_LEN + 16 + SET_DIGEST_LEN;
                    b[at..at + 2].copy_from_slice(&19_999u16.to_be_bytes());
                    *b.last_mut().unwrap() = 1;
                }),
                Shape::Padding.into(),
            ),
            // A part of a set small enough for the report to carry.
            (
                edited(last.clone(), |b| {
                    let at = 5 + NODE_REF_LEN + 16 + SET_DIGEST_LEN;
                    b[at..at + 2].copy_from_slice(&100u16.to_be_bytes());
                }),
                Shape::PartSlice.into(),
            ),
            (
                edited(last.clone(), |b| {
                    b[5..7].copy_from_slice(&20_000u16.to_be_bytes())
                }),
                Shape::IndexOutOfSet.into(),
            ),
        ];
        for (datagram, want) in cases {
            assert_eq!(refused(&datagram), want);
        }
        let mut long = first;
        long.bytes.push(0);
        assert_eq!(
            Message::from(long).encode(&ring()),
            Err(Shape::PartSlice.into())
        );
    }

    #[test]
    fn set_ids_need_sorted_names_and_tell_sets_apart() {
        let a = SetId::of(["a", "b", "c"]).unwrap();
        assert_eq!(a.len, 3);
        assert_ne!(a, SetId::of(["a", "b", "d"]).unwrap());
        assert_ne!(a, SetId::of(["a", "b"]).unwrap());
        // Length prefixes: "ab","c" is not "a","bc".
        assert_ne!(
            SetId::of(["ab", "c"]).unwrap(),
            SetId::of(["a", "bc"]).unwrap()
        );
        assert_eq!(SetId::of(["b", "a"]), Err(Shape::NotAscending.into()));
        assert_eq!(SetId::of(["a", "a"]), Err(Shape::NotAscending.into()));
        assert_eq!(SetId::of([""]), Err(Shape::NameLength.into()));
        let long = "n".repeat(MAX_NAME_LEN + 1);
        assert_eq!(SetId::of([long.as_str()]), Err(Shape::NameLength.into()));
        let many: Vec<String> = (0..=MAX_NODES).map(|i| format!("{i:06}")).collect();
        assert_eq!(
            SetId::of(many.iter().map(String::as_str)),
            Err(Shape::SetTooLarge.into())
        );
        assert_eq!(
            SetId::of(many[..MAX_NODES].iter().map(String::as_str))
                .unwrap()
                .len,
            u16::MAX
        );
    }

    fn arb_names() -> impl Strategy<Value = Vec<String>> {
        prop::collection::btree_set("[a-z0-9.-]{1,40}", 2..40).prop_map(|s| s.into_iter().collect())
    }

    fn arb_beat() -> impl Strategy<Value = Beat> {
        (
            arb_names(),
            "[a-z0-9.-]{1,60}",
            any::<(u64, u64, u64, bool, bool, bool)>(),
            prop::collection::btree_set("[a-z0-9]{1,15}", 0..MAX_INTERFACES),
            prop::collection::btree_map(any::<u16>(), any::<(u64, u64)>(), 0..MAX_ACKS),
        )
            .prop_map(
                |(
                    names,
                    node,
                    (boot, seq, unix_ms, ready, leaving, restarting),
                    interfaces,
                    acks,
                )| {
                    let set = set_of(&names);
                    let acks = acks
                        .into_iter()
                        .map(|(i, seen)| (i % set.len, seen))
                        .collect::<std::collections::BTreeMap<_, _>>()
                        .into_iter()
                        .map(|(i, (boot, seq))| Ack {
                            voter: NodeRef::new(i, &names[usize::from(i)]),
                            seen: Seen { boot, seq },
                        })
                        .collect();
                    Beat {
                        node,
                        boot,
                        seq,
                        unix_ms,
                        ready,
                        leaving,
                        restarting,
                        set,
                        interfaces,
                        acks,
                    }
                },
            )
    }

    fn arb_report() -> impl Strategy<Value = Report> {
        (
            arb_names(),
            any::<(u16, u16, u64, u64, u64, u64, u64)>(),
            any::<(bool, bool, bool, u64, u64)>(),
            prop::collection::vec(any::<u16>(), 0..40),
        )
            .prop_map(
                |(
                    names,
                    (v, t, boot, seq, unix_ms, aboot, aseq),
                    (mature, told, same, version, generation),
                    heard_nodes,
                )| {
                    let set = set_of(&names);
                    Report {
                        voter: NodeRef::new(v % set.len, &names[usize::from(v % set.len)]),
                        to: NodeRef::new(t % set.len, &names[usize::from(t % set.len)]),
                        boot,
                        seq,
                        unix_ms,
                        set,
                        ack: Seen {
                            boot: aboot,
                            seq: aseq,
                        },
                        mature,
                        told,
                        same,
                        version,
                        generation,
                        // A same report leaves its bitmap out.
                        bitmap: if same {
                            Vec::new()
                        } else {
                            bitmap(set.len, heard_nodes.into_iter().map(usize::from))
                        },
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn beats_round_trip(b in arb_beat()) {
            let m = Message::from(b);
            let bytes = m.encode(&ring()).unwrap();
            prop_assert!(bytes.len() <= MAX_DATAGRAM);
            prop_assert_eq!(Message::decode(&bytes, &ring()).unwrap(), (m.clone(), 0));
        }

        #[test]
        fn reports_round_trip(r in arb_report()) {
            let m = Message::from(r);
            let bytes = m.encode(&ring()).unwrap();
            prop_assert_eq!(Message::decode(&bytes, &ring()).unwrap(), (m.clone(), 0));
        }

        #[test]
        fn large_reports_round_trip_in_parts(len in (INLINE_MAX_NODES as u16 + 1)..=u16::MAX,
                                             heard_nodes in prop::collection::vec(any::<u16>(), 0..200)) {
            let set = SetId { digest: [5; 16], len };
            let r = Report { set, bitmap: bitmap(len, heard_nodes.into_iter().map(usize::from)), ..report(&names(4, 8)) };
            let (head, parts) = r.clone().split().unwrap();
            let mut decoded = Vec::new();
            for p in &parts {
                let bytes = Message::from(p.clone()).encode(&ring()).unwrap();
                prop_assert!(bytes.len() <= MAX_DATAGRAM);
                match Message::decode(&bytes, &ring()).unwrap().0 {
                    Message::Part(p) => decoded.push(p),
                    other => prop_assert!(false, "{:?}", other),
                }
            }
            prop_assert_eq!(head.join(&decoded).unwrap(), r.bitmap);
        }

        #[test]
        fn decode_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..1600)) {
            let _ = Message::decode(&bytes, &ring());
            let _ = sender(&bytes);
        }

        /// Past the magic and kind, so the shape checks see every kind of body.
        #[test]
        fn decode_never_panics_on_signed_bodies(kind in 0u8..5, rest in prop::collection::vec(any::<u8>(), 0..1500)) {
            let body = [&MAGIC[..], &[kind], &rest].concat();
            let datagram = signed(&body);
            if let Ok((m, _)) = Message::decode(&datagram, &ring()) {
                // What decodes encodes back to the same bytes.
                prop_assert_eq!(m.encode(&ring()).unwrap(), datagram);
            }
        }
    }
}
