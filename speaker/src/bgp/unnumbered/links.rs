//! Unnumbered BGP peers in the work loop: peer discovery (router advertisements) running on
//! every interface a BGPPeer of this node names, and what it found, for the BGP plan.
//!
//! Discovery starts when a BGPPeer names the interface and stops when none does. It is told the
//! state of the sessions on its link ([`Links::follow_sessions`]), so that an Established
//! session keeps its peer whatever else advertises (`Follow`'s rule). It restarts
//! when the interface's index, MAC or link-local address changes (the interface was recreated
//! or renumbered). A new peer address wakes the work loop, which plans the BGP sessions again;
//! so does a change of the interfaces themselves, checked every second (an address removed or
//! added does not show in the layer 2 interface poll), which also retries an interface that was
//! not usable.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv6Addr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::bgp::driver::{OnLink, PeerStatus};
use crate::bgp::unnumbered::Timers;
use crate::bgp::unnumbered::discovery::{Discovery, Found, Link};
use crate::l2::interfaces::parse_mac;
use ferrolb_bgp::fsm::State;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

/// Where an interface named by an unnumbered BGPPeer stands on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkState {
    /// The peer was found on the link.
    Found(OnLink),
    /// Discovery runs and has heard no router advertisement yet.
    Searching,
    /// The interface cannot be used; why, naming it.
    Unusable(String),
}

/// The status of the sessions running on one link, read by its discovery thread.
#[derive(Clone, Default)]
struct Sessions(Arc<Mutex<Vec<watch::Receiver<PeerStatus>>>>);

impl Sessions {
    /// Whether a session on the link is Established.
    fn established(&self) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|s| s.borrow().state == State::Established)
    }

    fn set(&self, sessions: Vec<watch::Receiver<PeerStatus>>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = sessions;
    }
}

struct Running {
    link: Link,
    discovery: Discovery,
    /// The sessions on the link, whose state decides whether its peer may change.
    sessions: Sessions,
    /// Wakes the work loop on each find.
    waker: JoinHandle<()>,
}

/// How often the named interfaces are read again.
const RECHECK: Duration = Duration::from_secs(1);

/// What each named interface looked like when last planned (`Err`: why it was not usable).
type Seen = Arc<Mutex<BTreeMap<String, Result<Link, String>>>>;

/// Discovery on the interfaces the node's unnumbered BGPPeers name.
pub struct Links {
    running: BTreeMap<String, Running>,
    /// The work loop's wake-up.
    changed: Arc<Notify>,
    /// The interfaces as planned, for the recheck.
    seen: Seen,
    /// Reads the interfaces every [`RECHECK`] and wakes the loop when one changed.
    recheck: Option<JoinHandle<()>>,
}

impl Links {
    /// No discovery yet; finds will notify `changed`.
    pub fn new(changed: Arc<Notify>) -> Self {
        Self {
            running: BTreeMap::new(),
            changed,
            seen: Seen::default(),
            recheck: None,
        }
    }

    /// Runs discovery on exactly `interfaces` and says where each stands.
    pub fn apply(&mut self, interfaces: &BTreeSet<String>) -> BTreeMap<String, LinkState> {
        let gone: Vec<String> = self
            .running
            .keys()
            .filter(|name| !interfaces.contains(*name))
            .cloned()
            .collect();
        for name in gone {
            tracing::info!(interface = %name, "no unnumbered BGP peer on this interface any more: discovery stopped");
            self.stop(&name);
        }
        let mut seen = BTreeMap::new();
        let states = interfaces
            .iter()
            .map(|name| {
                let read = link(name);
                seen.insert(name.clone(), read.clone());
                (name.clone(), self.state(name, read))
            })
            .collect();
        *self.seen.lock().unwrap_or_else(|p| p.into_inner()) = seen;
        match (&self.recheck, interfaces.is_empty()) {
            (None, false) => {
                self.recheck = Some(tokio::spawn(recheck(
                    self.seen.clone(),
                    self.changed.clone(),
                )));
            }
            (Some(_), true) => {
                if let Some(task) = self.recheck.take() {
                    task.abort();
                }
            }
            _ => {}
        }
        states
    }

    /// Hands each link the status of the sessions running on it (by interface name; a link
    /// left out has none), so that its discovery keeps the peer of an Established session.
    pub fn follow_sessions(
        &self,
        mut sessions: BTreeMap<String, Vec<watch::Receiver<PeerStatus>>>,
    ) {
        for (name, r) in &self.running {
            r.sessions.set(sessions.remove(name).unwrap_or_default());
        }
    }

    fn state(&mut self, name: &str, read: Result<Link, String>) -> LinkState {
        let link = match read {
            Ok(l) => l,
            Err(why) => {
                self.stop(name);
                return LinkState::Unusable(why);
            }
        };
        if self.running.get(name).is_some_and(|r| r.link != link) {
            tracing::info!(interface = %name, "interface changed: discovery restarted");
            self.stop(name);
        }
        if !self.running.contains_key(name) {
            let sessions = Sessions::default();
            let established = {
                let sessions = sessions.clone();
                move || sessions.established()
            };
            let discovery =
                match Discovery::start_following(link.clone(), established, Timers::default()) {
                    Ok(d) => d,
                    Err(e) => {
                        return LinkState::Unusable(format!(
                            "cannot look for the BGP peer on interface {name}: {e}"
                        ));
                    }
                };
            tracing::info!(interface = %name, link_local = %link.link_local, "looking for the unnumbered BGP peer");
            let mut found = discovery.found();
            let peer = found.borrow_and_update().peer;
            let waker = tokio::spawn(wake_on_new_peer(found, peer, self.changed.clone()));
            self.running.insert(
                name.to_string(),
                Running {
                    link,
                    discovery,
                    sessions,
                    waker,
                },
            );
        }
        let Some(r) = self.running.get(name) else {
            return LinkState::Searching;
        };
        match r.discovery.found().borrow().peer {
            Some(address) => LinkState::Found(OnLink {
                address,
                interface_index: r.link.index,
            }),
            None => LinkState::Searching,
        }
    }

    /// Stops discovery on `name`. Its thread takes up to a receive timeout to end: it is
    /// joined off the work loop.
    fn stop(&mut self, name: &str) {
        if let Some(r) = self.running.remove(name) {
            r.waker.abort();
            let discovery = r.discovery;
            tokio::task::spawn_blocking(move || drop(discovery));
        }
    }
}

impl Drop for Links {
    fn drop(&mut self) {
        if let Some(task) = self.recheck.take() {
            task.abort();
        }
    }
}

/// Wakes the loop (`changed`) whenever discovery's peer differs from the last one the loop was
/// told of, starting from `peer`: what the plan read when discovery started, not what this task
/// reads once it first runs, or a peer found in between would wake no one and the session
/// would wait for an unrelated event (seen in the bgp suite: 40 s after a link came back up).
/// Only a new peer matters to the plan, not the counters of refused messages.
async fn wake_on_new_peer(
    mut found: watch::Receiver<Found>,
    mut peer: Option<Ipv6Addr>,
    changed: Arc<Notify>,
) {
    loop {
        let now = found.borrow_and_update().peer;
        if now != peer {
            peer = now;
            changed.notify_one();
        }
        if found.changed().await.is_err() {
            return;
        }
    }
}

/// Reads the planned interfaces every [`RECHECK`]; wakes the loop when one is not as planned.
async fn recheck(seen: Seen, changed: Arc<Notify>) {
    let mut tick = tokio::time::interval(RECHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let planned = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if planned.iter().any(|(name, was)| link(name) != *was) {
            changed.notify_one();
        }
    }
}

/// What discovery needs of interface `name`: index, MAC and IPv6 link-local address. The error
/// names the interface and what it lacks.
fn link(name: &str) -> Result<Link, String> {
    let dir = Path::new("/sys/class/net").join(name);
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).ok();
    let index: u32 = read("ifindex")
        .and_then(|i| i.trim().parse().ok())
        .ok_or_else(|| format!("interface {name} does not exist on this node"))?;
    let mac = read("address")
        .as_deref()
        .and_then(parse_mac)
        .ok_or_else(|| format!("interface {name} has no MAC address"))?;
    let link_local = link_local(name).ok_or_else(|| {
        format!("interface {name} has no IPv6 link-local address (is it up, with IPv6 enabled?)")
    })?;
    Ok(Link {
        name: name.to_string(),
        index,
        mac: ferrolb_layer2::packet::MacAddr(mac),
        link_local,
    })
}

/// The interface's first IPv6 link-local address (in kernel order).
fn link_local(name: &str) -> Option<Ipv6Addr> {
    nix::ifaddrs::getifaddrs()
        .ok()?
        .filter(|a| a.interface_name == name)
        .filter_map(|a| a.address?.as_sockaddr_in6().map(|v6| v6.ip()))
        .find(Ipv6Addr::is_unicast_link_local)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]

    use super::*;

    /// What discovery is told: a link is Established while any of its sessions is, and
    /// follows the channels it is handed last (a restarted session brings new ones).
    #[test]
    fn a_link_is_established_while_one_of_its_sessions_is() {
        let status = |state| {
            watch::channel(PeerStatus {
                state,
                ..PeerStatus::default()
            })
        };
        let sessions = Sessions::default();
        assert!(!sessions.established(), "no session");
        let (a, a_rx) = status(State::Active);
        let (b, b_rx) = status(State::Idle);
        sessions.set(vec![a_rx, b_rx]);
        assert!(!sessions.established());
        b.send_modify(|s| s.state = State::Established);
        assert!(sessions.established());
        a.send_modify(|s| s.state = State::Established);
        b.send_modify(|s| s.state = State::Idle);
        assert!(sessions.established());
        sessions.set(Vec::new());
        assert!(!sessions.established(), "the sessions were taken away");
    }

    /// A peer found between the plan's read and the waker's first run still wakes the loop.
    #[tokio::test]
    async fn a_peer_found_before_the_waker_runs_wakes_the_loop() {
        let (tx, rx) = watch::channel(Found::default());
        let changed = Arc::new(Notify::new());
        // The plan read "no peer"; discovery finds one before the waker is first polled.
        let planned = rx.borrow().peer;
        tx.send_modify(|f| f.peer = Some(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1)));
        let waker = tokio::spawn(wake_on_new_peer(rx, planned, changed.clone()));
        tokio::time::timeout(std::time::Duration::from_secs(10), changed.notified())
            .await
            .expect("the loop was not woken for the peer found");
        // A later peer wakes it again.
        tx.send_modify(|f| f.replacements += 1);
        tx.send_modify(|f| f.peer = Some(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 2)));
        tokio::time::timeout(std::time::Duration::from_secs(10), changed.notified())
            .await
            .expect("the loop was not woken for the new peer");
        waker.abort();
    }

    /// A missing interface is unusable, named, and starts nothing.
    #[tokio::test]
    async fn a_missing_interface_is_named() {
        let mut links = Links::new(Arc::new(Notify::new()));
        let states = links.apply(&BTreeSet::from(["flb-no-such-if".to_string()]));
        assert_eq!(
            states.get("flb-no-such-if"),
            Some(&LinkState::Unusable(
                "interface flb-no-such-if does not exist on this node".into()
            ))
        );
        assert!(links.running.is_empty());
    }

    /// The loopback has no MAC: unusable, said so.
    #[tokio::test]
    async fn an_interface_without_a_mac_is_refused() {
        let mut links = Links::new(Arc::new(Notify::new()));
        let states = links.apply(&BTreeSet::from(["lo".to_string()]));
        assert!(
            matches!(states.get("lo"), Some(LinkState::Unusable(why)) if why.contains("lo")),
            "{states:?}"
        );
    }
}
