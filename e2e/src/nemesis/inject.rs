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
                // Killed, so the speaker must run again whatever happens: a stepped start that
                // fails for good falls back to a normal one.
                if let Err(e) = until_it_works(|| speakers.start_clocked(&n, CLOCK_STEP)).await {
                    until_it_works(|| speakers.start(&n)).await?;
                    return Err(e);
                }
                Undo::Clock(n)
            }
            FaultKind::NodeNotReady => {
                let n = node()?;
                crate::cluster::set_node_ready(&self.client, &lab.topology, &n, false).await?;
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

    /// Undoes `window`'s fault (nothing if it is not in force).
    pub async fn undo(&mut self, window: &Window) -> anyhow::Result<()> {
        let Some(i) = self.in_force.iter().position(|(w, _)| w == window) else {
            return Ok(());
        };
        let (_, undo) = self.in_force.remove(i);
        self.undo_one(undo).await
    }

    async fn undo_one(&self, undo: Undo<'a>) -> anyhow::Result<()> {
        let speakers = &self.deployment.speakers;
        match undo {
            Undo::Link(n) => self.lab.set_link(&n, true)?,
            Undo::Heartbeat(guard) => drop(guard),
            Undo::Delay(guard) => drop(guard),
            Undo::Speaker(n) => until_it_works(|| speakers.start(&n)).await?,
            Undo::Frozen(n) => speakers.freeze(&n, false)?,
            Undo::Clock(n) => {
                speakers.kill(&n);
                until_it_works(|| speakers.start(&n)).await?;
            }
            Undo::NotReady(n) => {
                // The API server may be down by now (another fault): retry until it answers.
                let mut tries = 0;
                while let Err(e) =
                    crate::cluster::set_node_ready(&self.client, &self.lab.topology, &n, true).await
                {
                    tries += 1;
                    if tries > RETRIES {
                        return Err(e);
                    }
                    tokio::time::sleep(RETRY_EVERY).await;
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
        Ok(())
    }

    /// Undoes every fault still in force, the latest first; the first error is returned after
    /// all were tried.
    pub async fn undo_all(&mut self) -> anyhow::Result<()> {
        let mut first = Ok(());
        while let Some((_, undo)) = self.in_force.pop() {
            let r = self.undo_one(undo).await;
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

/// How often a step that needs the API server is tried again while it is down, and how
/// many times: longer than the longest outage of the API server and etcd together.
const RETRY_EVERY: Duration = Duration::from_millis(500);
const RETRIES: u32 = 120;

/// Runs `start` until it works: a speaker's start writes its Pod object, so it fails while the
/// API server or etcd is one of the faults in force.
async fn until_it_works(start: impl Fn() -> anyhow::Result<()>) -> anyhow::Result<()> {
    let mut tries = 0;
    loop {
        match start() {
            Ok(()) => return Ok(()),
            Err(e) if tries >= RETRIES => return Err(e),
            Err(_) => {
                tries += 1;
                tokio::time::sleep(RETRY_EVERY).await;
            }
        }
    }
}

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
