//! Layer 2 announcing: one responder thread per interface answers ARP requests and Neighbor
//! Solicitations for the IPs this node owns; taking an IP sends gratuitous ARP / unsolicited NA
//! at once and in a short burst, then every refresh interval, re-checking ownership and the
//! mandate before every send (one task per IP and interface).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crate::l2::interfaces::Interface;
use crate::l2::plan::Announcement;
use crate::l2::socket::{MulticastMembership, PacketSocket};
use ferrolb_layer2::packet::{
    self, MacAddr, Request, arp_reply, gratuitous_arp_reply, gratuitous_arp_request,
    neighbor_advertisement, solicited_node_multicast, unsolicited_neighbor_advertisement,
};

use crate::metrics::{Metrics, ip_label};

/// When the takeover burst sends, counted from the takeover: at once, then while switches and
/// hosts that missed the first frames still matter.
const BURST: [Duration; 6] = [
    Duration::ZERO,
    Duration::from_millis(200),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
];

/// IPs owned, each with the interfaces it is answered on. Read by every responder thread.
type Owned = HashMap<IpAddr, BTreeSet<String>>;

/// Until when the owned IPs may be answered for: the work loop renews it while it still acts
/// (quorum, fresh heartbeats); a process that was frozen (SIGSTOP, a stalled VM, a stuck loop)
/// finds it lapsed when it runs again and answers nothing until the loop has decided anew, so it
/// never answers next to the node that took its IPs over meanwhile.
#[derive(Debug)]
pub struct Mandate {
    base: Instant,
    /// Nanoseconds after `base`; 0: never renewed.
    until: AtomicU64,
}

impl Mandate {
    fn new() -> Self {
        Mandate {
            base: Instant::now(),
            until: AtomicU64::new(0),
        }
    }

    /// Lets the owned IPs be answered for until `until`.
    fn renew(&self, until: Instant) {
        let nanos = until.saturating_duration_since(self.base).as_nanos();
        self.until
            .store(u64::try_from(nanos).unwrap_or(u64::MAX), Ordering::Release);
    }

    /// Whether answering is allowed at `now`.
    fn valid(&self, now: Instant) -> bool {
        let nanos = now.saturating_duration_since(self.base).as_nanos();
        u128::from(self.until.load(Ordering::Acquire)) > nanos
    }
}

/// An interface the node answers on.
struct Responder {
    index: u32,
    mac: MacAddr,
    socket: Arc<PacketSocket>,
    stop: Arc<AtomicBool>,
    multicast: MulticastMembership,
    joined: BTreeSet<Ipv6Addr>,
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The announcer: the owned table, the responders and the takeover bursts.
pub struct Announcer {
    owned: Arc<RwLock<Owned>>,
    mandate: Arc<Mandate>,
    responders: BTreeMap<String, Responder>,
    /// The takeover burst and refresh task of each owned (IP, interface).
    announcing: Announcing,
    metrics: Metrics,
    refresh: Duration,
}

/// One task per owned (IP, interface) that sends its takeover burst and then re-announces it:
/// a new takeover replaces the task, an IP given up stops it. A task alone would stop only when
/// it finds the IP not owned at one of its wake-ups, so an IP lost and taken again within a
/// refresh interval kept its old task next to the new one, each re-announcing for ever.
#[derive(Debug, Default)]
struct Announcing {
    tasks: BTreeMap<(IpAddr, String), tokio::task::AbortHandle>,
}

impl Announcing {
    /// `task` announces `ip` on `interface` from now on, in place of any before it.
    fn start(&mut self, ip: IpAddr, interface: String, task: tokio::task::AbortHandle) {
        if let Some(old) = self.tasks.insert((ip, interface), task) {
            old.abort();
        }
    }

    /// Stops the tasks of what is no longer owned, and forgets those that ended.
    fn keep_only(&mut self, owned: &Owned) {
        self.tasks.retain(|(ip, interface), task| {
            let keep = owned.get(ip).is_some_and(|i| i.contains(interface));
            if !keep {
                task.abort();
            }
            keep && !task.is_finished()
        });
    }
}

/// Failure to announce on an interface.
#[derive(Debug)]
pub struct Failure {
    /// The interface.
    pub interface: String,
    /// What went wrong.
    pub error: String,
}

impl Announcer {
    /// An announcer that owns nothing yet. `refresh` > 0 re-sends announcements that often.
    pub fn new(metrics: Metrics, refresh: Duration) -> Self {
        Announcer {
            owned: Arc::new(RwLock::new(Owned::new())),
            mandate: Arc::new(Mandate::new()),
            responders: BTreeMap::new(),
            announcing: Announcing::default(),
            metrics,
            refresh,
        }
    }

    /// Makes the node answer for exactly `plan` on the interfaces named there. Returns the
    /// interfaces that could not be set up.
    pub fn apply(
        &mut self,
        plan: &BTreeMap<IpAddr, Announcement>,
        interfaces: &BTreeMap<String, Interface>,
    ) -> Vec<Failure> {
        let mut failures = Vec::new();
        let wanted: BTreeSet<&String> = plan.values().flat_map(|a| &a.interfaces).collect();
        // Responders: one per interface in use; a changed index or MAC means a new device.
        self.responders.retain(|name, r| {
            wanted.contains(name)
                && interfaces
                    .get(name)
                    .is_some_and(|i| i.index == r.index && i.mac == Some(r.mac.0))
        });
        // Interfaces whose responder starts now: their IPs are announced afresh (a recreated
        // device has a new MAC to announce, and the old task's socket is gone).
        let mut started = BTreeSet::new();
        for name in &wanted {
            if self.responders.contains_key(*name) {
                continue;
            }
            let Some(iface) = interfaces.get(*name) else {
                continue;
            };
            match self.start_responder(iface) {
                Ok(r) => {
                    self.responders.insert((*name).clone(), r);
                    started.insert((*name).clone());
                }
                Err(error) => failures.push(Failure {
                    interface: (*name).clone(),
                    error,
                }),
            }
        }
        let new: Owned = plan
            .iter()
            .map(|(ip, a)| {
                let ifaces = a
                    .interfaces
                    .iter()
                    .filter(|i| self.responders.contains_key(*i))
                    .cloned()
                    .collect();
                (*ip, ifaces)
            })
            .collect();
        // NDP: be in the solicited-node group of every owned IPv6 address, so the NIC lets
        // the solicitations in. Join before taking the IP, leave after giving it up.
        for (name, r) in &mut self.responders {
            let groups: BTreeSet<Ipv6Addr> = new
                .iter()
                .filter(|(_, ifaces)| ifaces.contains(name))
                .filter_map(|(ip, _)| match ip {
                    IpAddr::V6(v6) => Some(solicited_node_multicast(*v6)),
                    IpAddr::V4(_) => None,
                })
                .collect();
            for group in groups.difference(&r.joined.clone()) {
                match r.multicast.join(*group) {
                    Ok(()) => {
                        r.joined.insert(*group);
                    }
                    Err(e) => failures.push(Failure {
                        interface: name.clone(),
                        error: format!("joining {group}: {e}"),
                    }),
                }
            }
            for group in r.joined.clone().difference(&groups) {
                // A group shared by two owned addresses stays joined (it is in `groups`).
                let _ = r.multicast.leave(*group);
                r.joined.remove(group);
            }
        }
        // What to announce afresh: IPs taken now, and owned IPs on a recreated interface
        // (`true`: already owned, not a takeover).
        let fresh: Vec<(IpAddr, String, bool)> = {
            let mut owned = self.owned.write().unwrap_or_else(|p| p.into_inner());
            let fresh = new
                .iter()
                .flat_map(|(ip, ifaces)| ifaces.iter().map(move |i| (*ip, i.clone())))
                .map(|(ip, i)| {
                    let had = owned.get(&ip).is_some_and(|old| old.contains(&i));
                    (ip, i, had)
                })
                .filter(|(_, i, had)| !had || started.contains(i))
                .collect();
            self.announcing.keep_only(&new);
            *owned = new;
            fresh
        };
        for (ip, name, had) in fresh {
            if let Some(r) = self.responders.get(&name) {
                if had {
                    tracing::info!(%ip, interface = %name, "interface recreated: announcing again");
                } else {
                    self.metrics.takeovers.inc();
                    tracing::info!(%ip, interface = %name, "taking over");
                }
                let task = self.spawn_burst(ip, name.clone(), r);
                self.announcing.start(ip, name, task);
            }
        }
        failures
    }

    /// Lets what is owned be answered for until `until` (see [`Mandate`]).
    pub fn renew(&self, until: Instant) {
        self.mandate.renew(until);
    }

    fn start_responder(&self, iface: &Interface) -> Result<Responder, String> {
        let mac = MacAddr(iface.mac.ok_or("no MAC address")?);
        let socket = Arc::new(PacketSocket::open(iface.index).map_err(|e| e.to_string())?);
        let multicast = MulticastMembership::new(iface.index).map_err(|e| e.to_string())?;
        let stop = Arc::new(AtomicBool::new(false));
        let ctx = ResponderThread {
            name: iface.name.clone(),
            mac,
            socket: socket.clone(),
            stop: stop.clone(),
            owned: self.owned.clone(),
            mandate: self.mandate.clone(),
            metrics: self.metrics.clone(),
        };
        std::thread::Builder::new()
            .name(format!("l2-{}", iface.name))
            .spawn(move || ctx.run())
            .map_err(|e| e.to_string())?;
        tracing::info!(interface = %iface.name, "answering ARP and NDP");
        Ok(Responder {
            index: iface.index,
            mac,
            socket,
            stop,
            multicast,
            joined: BTreeSet::new(),
        })
    }

    /// Starts the takeover burst of `ip` on `interface`, then its refresh; returns its task.
    fn spawn_burst(
        &self,
        ip: IpAddr,
        interface: String,
        r: &Responder,
    ) -> tokio::task::AbortHandle {
        let owned = self.owned.clone();
        let mandate = self.mandate.clone();
        let socket = r.socket.clone();
        let mac = r.mac;
        let metrics = self.metrics.clone();
        let refresh = self.refresh;
        let task = tokio::spawn(async move {
            let still_owned = || {
                owned
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&ip)
                    .is_some_and(|i| i.contains(&interface))
            };
            let started = tokio::time::Instant::now();
            let mut offsets = BURST
                .iter()
                .copied()
                .map(|d| started + d)
                .collect::<Vec<_>>();
            let mut next_refresh = started + BURST[BURST.len() - 1];
            loop {
                let at = if let Some(first) = offsets.first().copied() {
                    offsets.remove(0);
                    first
                } else if refresh.is_zero() {
                    return;
                } else {
                    next_refresh += refresh;
                    next_refresh
                };
                tokio::time::sleep_until(at).await;
                if !still_owned() {
                    return;
                }
                // Not allowed to answer now (tenure lapsed, a frozen process waking): skip this
                // send, keep the task; the next one is sent if the mandate is back by then.
                if !mandate.valid(Instant::now()) {
                    continue;
                }
                let frames = match ip {
                    IpAddr::V4(v4) => vec![
                        gratuitous_arp_request(mac, v4),
                        gratuitous_arp_reply(mac, v4),
                    ],
                    // From the target itself, as Linux does: some hosts (ndisc6, for one)
                    // ignore advertisements from another source.
                    IpAddr::V6(v6) => vec![unsolicited_neighbor_advertisement(mac, v6, v6)],
                };
                for frame in frames {
                    match socket.send(&frame) {
                        Ok(()) => {
                            metrics.gratuitous_sent.get_or_create(&ip_label(ip)).inc();
                        }
                        Err(e) => {
                            tracing::warn!(%ip, %interface, error = %e, "announcement not sent")
                        }
                    }
                }
            }
        });
        task.abort_handle()
    }
}

/// What a responder thread needs.
struct ResponderThread {
    name: String,
    mac: MacAddr,
    socket: Arc<PacketSocket>,
    stop: Arc<AtomicBool>,
    owned: Arc<RwLock<Owned>>,
    mandate: Arc<Mandate>,
    metrics: Metrics,
}

impl ResponderThread {
    fn run(self) {
        let mut buf = vec![0u8; 2048];
        while !self.stop.load(Ordering::Relaxed) {
            let len = match self.socket.recv(&mut buf) {
                Ok(Some(len)) => len,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(interface = %self.name, error = %e, "receive failed");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            let request = match packet::parse(&buf[..len]) {
                Ok(Some(r)) => r,
                Ok(None) => continue,
                Err(e) => {
                    self.metrics
                        .malformed_frames
                        .get_or_create(&vec![("reason", e.kind().to_string())])
                        .inc();
                    continue;
                }
            };
            let ip = request.target();
            let ours = self
                .owned
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .get(&ip)
                .is_some_and(|i| i.contains(&self.name));
            // Checked after the frame arrived: a request queued while the process was frozen
            // is not answered from a lapsed mandate.
            if !ours || !self.mandate.valid(Instant::now()) {
                continue;
            }
            self.metrics
                .requests_received
                .get_or_create(&ip_label(ip))
                .inc();
            let reply = match &request {
                // A gratuitous request announces the sender; it asks nothing.
                Request::Arp(arp) if arp.is_gratuitous() => continue,
                Request::Arp(arp) => arp_reply(arp, self.mac),
                Request::NeighborSolicitation(ns) => {
                    neighbor_advertisement(ns, self.mac, ns.target)
                }
            };
            match self.socket.send(&reply) {
                Ok(()) => {
                    self.metrics
                        .responses_sent
                        .get_or_create(&ip_label(ip))
                        .inc();
                }
                Err(e) => tracing::warn!(interface = %self.name, %ip, error = %e, "reply not sent"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn a_mandate_holds_until_its_deadline_and_starts_lapsed() {
        let m = Mandate::new();
        let t0 = Instant::now();
        assert!(!m.valid(t0));
        m.renew(t0 + Duration::from_millis(300));
        assert!(m.valid(t0 + Duration::from_millis(299)));
        assert!(!m.valid(t0 + Duration::from_millis(300)));
        // A renewal into the past (the loop gave up) lapses it at once.
        m.renew(t0);
        assert!(!m.valid(t0 + Duration::from_millis(1)));
    }

    fn pending() -> tokio::task::AbortHandle {
        tokio::spawn(std::future::pending::<()>()).abort_handle()
    }

    /// Issue 33: an IP lost and taken again within a refresh interval kept a second endless
    /// refresh task; now a takeover replaces the task and giving the IP up stops it.
    #[tokio::test]
    async fn one_announcing_task_per_ip_and_interface() {
        let ip: IpAddr = "198.18.200.1".parse().unwrap();
        let mut a = Announcing::default();
        let first = pending();
        a.start(ip, "eth0".into(), first.clone());
        let second = pending();
        a.start(ip, "eth0".into(), second.clone());
        tokio::task::yield_now().await;
        assert!(
            first.is_finished(),
            "the first task still runs next to the second"
        );
        assert!(!second.is_finished());
        let other = pending();
        a.start(ip, "eth1".into(), other.clone());
        a.keep_only(&Owned::from([(ip, BTreeSet::from(["eth1".to_string()]))]));
        tokio::task::yield_now().await;
        assert!(second.is_finished(), "eth0 given up, its task runs on");
        assert!(!other.is_finished());
        assert_eq!(a.tasks.len(), 1);
        a.keep_only(&Owned::new());
        tokio::task::yield_now().await;
        assert!(other.is_finished() && a.tasks.is_empty());
    }
}
