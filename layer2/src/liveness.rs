//! The table of live speakers: the peers this speaker hears, what each reports hearing, and who
//! is held for a restart; what the quorum rule ([`crate::quorum`]) and the tenure
//! ([`crate::tenure`]) count.
//!
//! Every speaker sends a heartbeat ([`crate::heartbeat`]) to every other node every interval
//! (100 ms by default) and counts a peer alive while its last heartbeat that counts (not a
//! replay: [`crate::replay`]) is younger than the failure timeout (500 ms): a dead node, speaker
//! or link is seen within about half a second, without any API write. Pure: time comes in as
//! arguments. The reasoning, rule by rule: docs/decisions/0015-layer2-quorum.md ("Heartbeats",
//! "Replay protection").

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::heartbeat::{Heard, Heartbeat, HeartbeatError};
use crate::replay::{self, History};

/// Most peers the table tracks while the node list is not known ([`Membership::set_nodes`]):
/// the largest cluster Kubernetes supports. Once the node list is known, only its names are
/// tracked.
pub const MAX_PEERS: usize = 5_000;

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
    /// What tells its new heartbeats from replays.
    history: History,
}

impl Peer {
    /// The entry for a peer first heard with `beat` at `now` (our wall clock: `unix_ms`).
    fn first(beat: Heartbeat, now: Instant, unix_ms: u64, hold: Duration) -> Self {
        Peer {
            heard: now,
            heard_since: now,
            held_until: hold_of(None, &beat, now, hold),
            last: (beat.boot, beat.seq),
            history: History::first((&beat).into(), now, unix_ms),
            ready: beat.ready,
            leaving: beat.leaving,
            interfaces: beat.interfaces,
            hears: beat.hears,
        }
    }

    /// Takes in `beat`, once the replay rule has admitted it, heard at `now`. Returns whether
    /// what planning reads of the peer changed (the restart hold aside).
    fn heard_again(
        &mut self,
        beat: Heartbeat,
        now: Instant,
        timeout: Duration,
        hold: Duration,
    ) -> bool {
        let changed = self.ready != beat.ready
            || self.leaving != beat.leaving
            || self.interfaces != beat.interfaces
            // Acknowledgements move with every heartbeat; only who is heard, and ready,
            // changes a plan.
            || !same_hearing(&self.hears, &beat.hears);
        self.held_until = hold_of(self.held_until, &beat, now, hold);
        if now.saturating_duration_since(self.heard) > timeout || self.leaving {
            // Heard again after a silence: its reports without this peer may still be in
            // use elsewhere, so acknowledging starts over.
            self.heard_since = now;
        }
        self.heard = now;
        self.last = (beat.boot, beat.seq);
        self.ready = beat.ready;
        self.leaving = beat.leaving;
        self.interfaces = beat.interfaces;
        self.hears = beat.hears;
        changed
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
        replay::check_window(beat.unix_ms, unix_ms)?;
        let was_alive = self.is_alive(&beat.node, now);
        if let Some(peer) = self.peers.get_mut(&beat.node) {
            peer.history.admit((&beat).into(), now)?;
            let hold_before = peer.held_until;
            let changed = peer.heard_again(beat, now, self.timeout, self.restart_hold);
            return Ok(changed || !was_alive || hold_before != peer.held_until);
        }
        if self.nodes.is_none() && self.peers.len() >= MAX_PEERS {
            return Err(HeartbeatError::TableFull(beat.node));
        }
        let name = beat.node.clone();
        self.peers
            .insert(name, Peer::first(beat, now, unix_ms, self.restart_hold));
        Ok(true)
    }

    fn is_alive(&self, node: &str, now: Instant) -> bool {
        self.peers.get(node).is_some_and(|p| {
            p.ready && !p.leaving && now.saturating_duration_since(p.heard) <= self.timeout
        })
    }

    /// Peers alive at `now`: heard within the timeout, ready, not leaving. This speaker is not
    /// in it. Tests only: planning counts [`Membership::reports`] through the quorum rule.
    #[cfg(test)]
    pub(crate) fn alive(&self, now: Instant) -> BTreeMap<String, Member> {
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

    /// The earliest instant at which a live peer times out. Tests only: the driver waits for
    /// [`Membership::next_silence`].
    #[cfg(test)]
    pub(crate) fn next_expiry(&self, now: Instant) -> Option<Instant> {
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
    use crate::heartbeat::fixtures::{beat, beat_at, heard};

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
}
