//! The nemesis's hands: each [`Window`] of a schedule applied to a lab with ferrolb running on
//! process nodes, through the same helpers the one-fault tests use (docs/plans/nemesis.md has
//! the table), and undone when it ends. Every fault in force is held as a guard, so a run that
//! fails or panics leaves the lab whole: links up, rules removed, components started again.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use super::schedule::{FaultKind, Window};
use crate::Lab;
use crate::faults::{HeartbeatDelay, HeartbeatFault};
use crate::ferrolb::Deployment;
use crate::lab::Outage;

/// How far a stepped clock is off: past the speakers' heartbeat freshness and a Lease's
/// duration, so that a speaker which trusted wall time would misjudge both.
pub const CLOCK_STEP: &str = "+90s";

/// How long the heartbeat delay holds each heartbeat: longer than the failure timeout's
/// share of it, so peers see the node late.
pub const HEARTBEAT_DELAY: Duration = Duration::from_millis(600);

/// The two gossip keys rotations move between (the first rotation from the lab's key to the
/// first of them).
const KEYS: [&str; 2] = [
    "nemesis-gossip-key-one-0123456789abcdef0123456789",
    "nemesis-gossip-key-two-0123456789abcdef0123456789",
];

/// The kinds this injector applies: all of them.
pub const SUPPORTED: [FaultKind; 12] = FaultKind::ALL;

/// A fault in force, and how it is undone.
enum Undo<'a> {
    /// The node's link is down.
    Link(String),
    /// iptables rules or a relay in the node: removed on drop.
    Heartbeat(#[allow(dead_code)] HeartbeatFault<'a>),
    Delay(#[allow(dead_code)] HeartbeatDelay<'a>),
    /// The node's speaker is dead: started again.
    Speaker(String),
    /// The node's speaker is frozen: resumed.
    Frozen(String),
    /// The node's speaker runs with a stepped clock: started again without.
    Clock(String),
    /// The node is NotReady: Ready again.
    NotReady(String),
    /// A lab component stopped: started again (also on drop).
    Component(Outage<'a>),
    /// A key rotation under way: its second stage (sign with the new key) runs in this task.
    Key(tokio::task::JoinHandle<anyhow::Result<()>>),
}

/// Applies and undoes faults on a lab where `deployment` runs.
pub struct Injector<'a> {
    lab: &'a Lab,
    deployment: &'a Deployment,
    client: kube::Client,
    /// The controller's name in the lab (`controller-<identity>`).
    controller: String,
    /// The gossip key files every speaker reads (every 5 s): the key it signs with and the
    /// next one it accepts too (`--gossip-next-key-file`, read while it exists).
    keys: (PathBuf, PathBuf),
    in_force: Vec<(Window, Undo<'a>)>,
}

impl<'a> Injector<'a> {
    /// An injector for `deployment` (its controller started as `controller-<identity>`, its
    /// speakers with `--gossip-next-key-file` [`Injector::next_key_file`]).
    pub async fn new(
        lab: &'a Lab,
        deployment: &'a Deployment,
        identity: &str,
    ) -> anyhow::Result<Self> {
        let keys = (
            deployment.speakers.credentials().gossip_key.clone(),
            Self::next_key_file(lab),
        );
        Ok(Self {
            lab,
            deployment,
            client: lab.client().await?,
            controller: format!("controller-{identity}"),
            keys,
            in_force: Vec::new(),
        })
    }

    /// The next-key file the speakers must be started with for key rotations.
    pub fn next_key_file(lab: &Lab) -> PathBuf {
        lab.dir.join("nemesis-gossip-next.key")
    }

    /// Applies `window`'s fault.
    pub async fn apply(&mut self, window: &Window) -> anyhow::Result<()> {
        let node = || {
            window
                .target
                .clone()
                .with_context(|| format!("{:?} needs a node", window.kind))
        };
        let speakers = &self.deployment.speakers;
        let lab = self.lab;
        let undo = match window.kind {
            FaultKind::LinkCut => {
                let n = node()?;
                lab.set_link(&n, false)?;
                Undo::Link(n)
            }
            FaultKind::HeartbeatBlocked => {
                Undo::Heartbeat(HeartbeatFault::block(lab, &node()?, &["INPUT", "OUTPUT"])?)
            }
            FaultKind::HeartbeatInLost => {
                Undo::Heartbeat(HeartbeatFault::block(lab, &node()?, &["INPUT"])?)
            }
            FaultKind::HeartbeatDelayed => {
                let n = node()?;
                let peers = lab
                    .topology
                    .nodes()
                    .filter(|h| h.name != n)
                    .map(|h| lab.ipv4_of(&h.name))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                Undo::Delay(HeartbeatDelay::start(lab, &n, &peers, HEARTBEAT_DELAY)?)
            }
            FaultKind::SpeakerKilled => {
                let n = node()?;
                speakers.kill(&n);
                Undo::Speaker(n)
            }
            FaultKind::SpeakerFrozen => {
                let n = node()?;
                speakers.freeze(&n, true)?;
                Undo::Frozen(n)
            }
            FaultKind::ClockStepped => {
                let n = node()?;
                speakers.kill(&n);
                // Killed, so the speaker must run again whatever happens: if the stepped start
                // fails (its Pod write needs the API server, which may be one of the faults),
                // the window goes on as a kill, whose undo starts it normally.
                match speakers.start_clocked(&n, CLOCK_STEP) {
                    Ok(()) => Undo::Clock(n),
                    Err(_) => Undo::Speaker(n),
                }
            }
            FaultKind::NodeNotReady => {
                let n = node()?;
                // Bounded: with etcd down the API server holds the write, and the fault
                // whose undo restarts etcd must not wait behind it. A write that timed out
                // may still land, so the window is kept either way: its undo writes Ready,
                // which is harmless when the node never left it.
                let not_ready =
                    crate::cluster::set_node_ready(&self.client, &lab.topology, &n, false);
                if !matches!(tokio::time::timeout(API_WAIT, not_ready).await, Ok(Ok(()))) {
                    eprintln!("nemesis: {n} NotReady may not have been written (API server down)");
                }
                Undo::NotReady(n)
            }
            FaultKind::LeaderKilled => Undo::Component(lab.kill_keeping(&self.controller)?),
            FaultKind::ApiServerStopped => Undo::Component(lab.stop_keeping("kube-apiserver")?),
            FaultKind::EtcdStopped => Undo::Component(lab.stop_keeping("etcd")?),
            FaultKind::KeyRotated => {
                // Stage 1 now: every node accepts the new key. Stage 2 halfway (the window is
                // 12 s at least, and the speakers re-read their files every 5 s, so all
                // accept it before any signs with it): sign with the new key, accept the old.
                // Stage 3 when the window ends, 6 s or more later: the old key is no longer
                // accepted.
                let (key, next) = self.keys.clone();
                let old = std::fs::read_to_string(&key)?;
                let new = if old.trim() == KEYS[0] {
                    KEYS[1]
                } else {
                    KEYS[0]
                };
                std::fs::write(&next, new)?;
                let half = window.length / 2;
                Undo::Key(tokio::spawn(async move {
                    tokio::time::sleep(half).await;
                    std::fs::write(&key, new)?;
                    std::fs::write(&next, old)?;
                    Ok(())
                }))
            }
        };
        self.in_force.push((window.clone(), undo));
        Ok(())
    }

    /// Undoes `window`'s fault (nothing if it is not in force). `Ok(false)`: not yet, because
    /// its undo needs the API server, which another fault holds down; the fault stays in
    /// force and the caller tries again a little later. An undo never waits for the API server
    /// itself: the undo that restarts it (or etcd) may be the next one due.
    pub async fn undo(&mut self, window: &Window) -> anyhow::Result<bool> {
        let Some(i) = self.in_force.iter().position(|(w, _)| w == window) else {
            return Ok(true);
        };
        let (w, undo) = self.in_force.remove(i);
        match self.undo_one(undo).await? {
            None => Ok(true),
            Some(left) => {
                self.in_force.insert(i, (w, left));
                Ok(false)
            }
        }
    }

    /// Undoes one fault; what is left to undo when that needs the API server and it did not
    /// answer.
    async fn undo_one(&self, undo: Undo<'a>) -> anyhow::Result<Option<Undo<'a>>> {
        let speakers = &self.deployment.speakers;
        match undo {
            Undo::Link(n) => self.lab.set_link(&n, true)?,
            Undo::Heartbeat(guard) => drop(guard),
            Undo::Delay(guard) => drop(guard),
            // A speaker's start writes its Pod object through the API server.
            Undo::Speaker(n) => {
                if speakers.start(&n).is_err() {
                    return Ok(Some(Undo::Speaker(n)));
                }
            }
            Undo::Frozen(n) => speakers.freeze(&n, false)?,
            Undo::Clock(n) => {
                speakers.kill(&n);
                if speakers.start(&n).is_err() {
                    return Ok(Some(Undo::Speaker(n)));
                }
            }
            Undo::NotReady(n) => {
                let ready =
                    crate::cluster::set_node_ready(&self.client, &self.lab.topology, &n, true);
                if !matches!(tokio::time::timeout(API_WAIT, ready).await, Ok(Ok(()))) {
                    return Ok(Some(Undo::NotReady(n)));
                }
            }
            Undo::Component(outage) => outage.end()?,
            Undo::Key(stage_two) => {
                // Stage 2 ran at least 6 s ago (the window is 12 s at least): every node
                // signs with the new key by now.
                stage_two.await??;
                std::fs::remove_file(&self.keys.1)?;
            }
        }
        Ok(None)
    }

    /// Undoes every fault still in force, the latest first; the first error is returned after
    /// all were tried.
    /// The faults that needed the API server are tried again every [`RETRY_EVERY`] for
    /// [`UNDO_FOR`].
    pub async fn undo_all(&mut self) -> anyhow::Result<()> {
        let mut first = Ok(());
        let until = std::time::Instant::now() + UNDO_FOR;
        while !self.in_force.is_empty() {
            let mut left = Vec::new();
            while let Some((w, undo)) = self.in_force.pop() {
                match self.undo_one(undo).await {
                    Ok(None) => {}
                    Ok(Some(undo)) => left.push((w, undo)),
                    Err(e) => {
                        if first.is_ok() {
                            first = Err(e);
                        }
                    }
                }
            }
            left.reverse();
            self.in_force = left;
            if self.in_force.is_empty() {
                break;
            }
            if std::time::Instant::now() > until {
                anyhow::bail!(
                    "the API server did not answer for {UNDO_FOR:?}: could not undo {:?}",
                    self.in_force.iter().map(|(w, _)| w).collect::<Vec<_>>()
                );
            }
            tokio::time::sleep(RETRY_EVERY).await;
        }
        first
    }
}

/// How long one request of an undo may wait for the API server (it hangs, not fails, while
/// etcd is down).
const API_WAIT: Duration = Duration::from_secs(3);

/// How often an undo that needs the API server is tried again.
pub const RETRY_EVERY: Duration = Duration::from_secs(1);

/// How long [`Injector::undo_all`] tries: longer than any outage of the API server and etcd.
const UNDO_FOR: Duration = Duration::from_secs(120);

impl Drop for Injector<'_> {
    /// A run that ended early still leaves the lab whole: links up, speakers running and
    /// resumed (the guards of rules and components undo themselves).
    fn drop(&mut self) {
        let speakers = &self.deployment.speakers;
        while let Some((_, undo)) = self.in_force.pop() {
            match undo {
                Undo::Link(n) => {
                    let _ = self.lab.set_link(&n, true);
                }
                Undo::Speaker(n) | Undo::Clock(n) => {
                    speakers.kill(&n);
                    let _ = speakers.start(&n);
                }
                Undo::Frozen(n) => {
                    let _ = speakers.freeze(&n, false);
                }
                // Node readiness is an API object: the lab is taken down after a run anyway.
                // A rotation stopped at any stage leaves keys every node accepts.
                Undo::NotReady(_)
                | Undo::Heartbeat(_)
                | Undo::Delay(_)
                | Undo::Component(_)
                | Undo::Key(_) => {}
            }
        }
    }
}
