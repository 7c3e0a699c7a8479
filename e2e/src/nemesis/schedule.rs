//! The nemesis's timeline: from a seed, which faults start when, on which node, for how long.
//! Pure: the same seed and parameters give the same schedule on any machine (the generator is
//! the layer 2 simulator's SplitMix64, not a crate whose streams may change between versions),
//! so a failing run replays with its seed.

use std::time::Duration;

use ferrolb_layer2::sim::Rng;
use serde::{Deserialize, Serialize};

/// A fault the nemesis injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum FaultKind {
    /// The node's link to the lab segment goes down.
    LinkCut,
    /// The node's heartbeat port dropped both ways.
    HeartbeatBlocked,
    /// The node's incoming heartbeats dropped (it still sends).
    HeartbeatInLost,
    /// The node's outgoing heartbeats delayed.
    HeartbeatDelayed,
    /// The node's speaker SIGKILLed, started again when the window ends.
    SpeakerKilled,
    /// The node's speaker SIGSTOPped, resumed when the window ends.
    SpeakerFrozen,
    /// The node's speaker started again with its wall clock stepped ahead.
    ClockStepped,
    /// The node reported NotReady.
    NodeNotReady,
    /// The controller's leader SIGKILLed.
    LeaderKilled,
    /// The API server stopped.
    ApiServerStopped,
    /// etcd stopped.
    EtcdStopped,
    /// The gossip key rotated node by node.
    KeyRotated,
}

/// Whose IPs a fault can leave unanswered: the checker's outage attribution reads this.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// None: answering goes on (the API server's faults, a key rotation, a killed leader).
    Nothing,
    /// The IPs its target node answers for.
    TargetsIps,
}

impl FaultKind {
    /// Every kind, in the order a schedule draws from.
    pub const ALL: [FaultKind; 12] = [
        FaultKind::LinkCut,
        FaultKind::HeartbeatBlocked,
        FaultKind::HeartbeatInLost,
        FaultKind::HeartbeatDelayed,
        FaultKind::SpeakerKilled,
        FaultKind::SpeakerFrozen,
        FaultKind::ClockStepped,
        FaultKind::NodeNotReady,
        FaultKind::LeaderKilled,
        FaultKind::ApiServerStopped,
        FaultKind::EtcdStopped,
        FaultKind::KeyRotated,
    ];

    /// Whether the fault is on one node (else on the cluster).
    pub fn on_a_node(self) -> bool {
        !matches!(
            self,
            FaultKind::LeaderKilled
                | FaultKind::ApiServerStopped
                | FaultKind::EtcdStopped
                | FaultKind::KeyRotated
        )
    }

    /// Whose IPs it can leave unanswered. A killed speaker's node still forwards (its
    /// neighbours keep its MAC), but the IP moves: a short gap is possible, so it counts.
    pub fn reach(self) -> Reach {
        match self {
            FaultKind::LeaderKilled
            | FaultKind::ApiServerStopped
            | FaultKind::EtcdStopped
            | FaultKind::KeyRotated => Reach::Nothing,
            _ => Reach::TargetsIps,
        }
    }

    /// The shortest and longest window of this kind.
    pub fn lengths(self) -> (Duration, Duration) {
        let s = Duration::from_secs;
        match self {
            FaultKind::SpeakerKilled | FaultKind::LeaderKilled => (s(1), s(5)),
            // Three stages, each re-read by every speaker (every 5 s) before the next.
            FaultKind::KeyRotated => (s(12), s(24)),
            FaultKind::ClockStepped => (s(10), s(30)),
            _ => (Duration::from_millis(500), s(20)),
        }
    }
}

/// One fault: what, where, from when, for how long (from the start of the run).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    /// The fault.
    pub kind: FaultKind,
    /// Its node, for a fault on a node.
    pub target: Option<String>,
    /// When it starts.
    pub start: Duration,
    /// How long it lasts.
    pub length: Duration,
}

impl Window {
    /// When it is undone.
    pub fn end(&self) -> Duration {
        self.start + self.length
    }

    /// Whether it is in force at `t`.
    pub fn active_at(&self, t: Duration) -> bool {
        self.start <= t && t < self.end()
    }
}

/// The shortest window of any kind.
const SHORTEST: Duration = Duration::from_millis(500);

/// What a schedule is drawn from.
#[derive(Clone, Debug)]
pub struct Params {
    /// The run's length.
    pub run: Duration,
    /// The nodes faults on a node may hit.
    pub nodes: Vec<String>,
    /// The kinds drawn from (each equally likely).
    pub kinds: Vec<FaultKind>,
    /// At most this many faults at once.
    pub at_once: usize,
    /// The shortest and longest time between two fault starts.
    pub gap: (Duration, Duration),
    /// The end of the run stays free of faults this long, so recovery can be checked.
    pub quiet_end: Duration,
}

/// The schedule of `seed`: windows in order of start, each within the run and before its
/// quiet end, never more than `at_once` in force together, never two of one kind on one target
/// at once.
pub fn schedule(seed: u64, params: &Params) -> Vec<Window> {
    let mut rng = Rng::new(seed);
    let mut windows: Vec<Window> = Vec::new();
    let last_end = params.run.saturating_sub(params.quiet_end);
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let mut t = Duration::ZERO;
    if params.kinds.is_empty() || params.at_once == 0 {
        return windows;
    }
    loop {
        // At least a millisecond, so that the run always moves on.
        t += Duration::from_millis(rng.between(ms(params.gap.0), ms(params.gap.1)).max(1));
        // Wait for a slot.
        let in_force: Vec<&Window> = windows.iter().filter(|w| w.active_at(t)).collect();
        if in_force.len() >= params.at_once
            && let Some(first_end) = in_force.iter().map(|w| w.end()).min()
        {
            t = first_end;
        }
        if t + SHORTEST > last_end {
            return windows;
        }
        let kind = params.kinds[rng.below(params.kinds.len() as u64) as usize];
        let target = if kind.on_a_node() {
            if params.nodes.is_empty() {
                continue;
            }
            Some(params.nodes[rng.below(params.nodes.len() as u64) as usize].clone())
        } else {
            None
        };
        let (lo, hi) = kind.lengths();
        let hi = hi.min(last_end.saturating_sub(t));
        if hi < lo {
            continue;
        }
        let length = Duration::from_millis(rng.between(ms(lo), ms(hi)));
        let window = Window {
            kind,
            target,
            start: t,
            length,
        };
        let clashes = windows.iter().any(|w| {
            w.kind == window.kind
                && w.target == window.target
                && w.start < window.end()
                && window.start < w.end()
        });
        if !clashes {
            windows.push(window);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn params(run_s: u64, nodes: usize, at_once: usize) -> Params {
        Params {
            run: Duration::from_secs(run_s),
            nodes: (1..=nodes).map(|i| format!("node{i}")).collect(),
            kinds: FaultKind::ALL.to_vec(),
            at_once,
            gap: (Duration::from_millis(200), Duration::from_secs(8)),
            quiet_end: Duration::from_secs(30),
        }
    }

    #[test]
    fn a_seed_gives_one_schedule_and_another_seed_another() {
        let p = params(600, 3, 2);
        let a = schedule(7, &p);
        assert_eq!(a, schedule(7, &p));
        assert_ne!(a, schedule(8, &p));
        // Ten minutes hold a good number of faults, of most kinds.
        assert!(a.len() > 40, "{} windows", a.len());
        let kinds: std::collections::BTreeSet<_> = a.iter().map(|w| w.kind).collect();
        assert!(kinds.len() >= 10, "{kinds:?}");
    }

    proptest! {
        #[test]
        fn every_schedule_keeps_its_bounds(
            seed in any::<u64>(),
            run_s in 40u64..900,
            nodes in 1usize..6,
            at_once in 1usize..4,
        ) {
            let p = params(run_s, nodes, at_once);
            let windows = schedule(seed, &p);
            let last_end = p.run - p.quiet_end;
            for (i, w) in windows.iter().enumerate() {
                let (lo, hi) = w.kind.lengths();
                prop_assert!(w.end() <= last_end, "{w:?} ends in the quiet end");
                prop_assert!(w.length >= lo && w.length <= hi, "{w:?}");
                prop_assert_eq!(w.target.is_some(), w.kind.on_a_node());
                if let Some(t) = &w.target {
                    prop_assert!(p.nodes.contains(t));
                }
                if i > 0 {
                    prop_assert!(windows[i - 1].start <= w.start);
                }
                let together = windows.iter().filter(|o| o.active_at(w.start)).count();
                prop_assert!(together <= at_once, "{together} at {:?}", w.start);
                let twin = windows.iter().enumerate().any(|(j, o)| {
                    j != i && o.kind == w.kind && o.target == w.target
                        && o.start < w.end() && w.start < o.end()
                });
                prop_assert!(!twin, "{w:?} overlaps a fault of its kind on its target");
            }
        }
    }
}
