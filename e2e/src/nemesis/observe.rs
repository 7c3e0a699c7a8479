//! What a client on the lab segment sees of every LoadBalancer IP during a nemesis run
//! (`ferrolb-lab nemesis-observe`, run in the client's namespace): every `interval`, per IP,
//! one ARP request (IPv4: sent by `arping`, read back with every reply on a packet socket)
//! or Neighbor Solicitation (IPv6) with every MAC that answers it, and one datagram to the
//! pods' echo port, answered or not. Bounded in time; stops by itself.
//!
//! It prints [`Observation`]s as JSON lines, times in milliseconds of the Unix epoch (the
//! recorder rebases them on the run's start: namespaces share the clock). At 100 probes a
//! second per IP a full record would be about 25 MB per IP per hour, so each stream is thinned
//! ([`EchoThinner`], [`NeighbourThinner`]) in a way the checkers cannot tell apart: every gap
//! longer than [`EchoThinner::GAP`] keeps its two ends, every change of the answering MACs and
//! every request with two MACs is kept, and one observation a second marks the steady state.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use socket2::{Domain, Protocol, Socket, Type};

use super::check::Observation;

/// Milliseconds of the Unix epoch now.
pub fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// How often a steady stream is still marked.
const STEADY: u64 = 1000;

/// Thins one IP's echo answers into runs: answers no more than [`Self::GAP`] apart make one
/// run, kept as its first and last answer (a run is closed after a second, so the steady state
/// is marked once a second); while nothing answers, one "unanswered" a second.
#[derive(Debug, Default)]
pub struct EchoThinner {
    /// The open run: its first and last answer.
    run: Option<(u64, u64)>,
    /// The last answer (of the open run or the last closed one).
    last_answer: Option<u64>,
    /// The last "unanswered" kept.
    last_silence: Option<u64>,
}

/// One kept echo observation: (first, last, answered); first == last for a single probe.
pub type Kept = (u64, u64, bool);

impl EchoThinner {
    /// Answers closer than this are one run (the checkers' outage bound is longer).
    pub const GAP: u64 = 20;

    /// An answer at `t`: what to keep.
    pub fn answer(&mut self, t: u64) -> Vec<Kept> {
        let mut keep = Vec::new();
        match self.run {
            Some((first, last)) if t.saturating_sub(last) <= Self::GAP => {
                if t.saturating_sub(first) >= STEADY {
                    // Closed at its last answer; the next opens at this one, within GAP of it.
                    keep.push((first, last, true));
                    self.run = Some((t, t));
                } else {
                    self.run = Some((first, t));
                }
            }
            Some((first, last)) => {
                keep.push((first, last, true));
                self.run = Some((t, t));
            }
            None => self.run = Some((t, t)),
        }
        self.last_answer = Some(t);
        keep
    }

    /// A probe sent at `t`: an "unanswered" to keep when the IP has been silent for longer
    /// than [`Self::GAP`] and none was kept in the last second (the open run is closed first).
    pub fn probe(&mut self, t: u64) -> Vec<Kept> {
        // Silent: two thinning gaps without an answer (one may pass between a probe's send
        // and the answer to the one before it on a busy machine).
        let silent = self
            .last_answer
            .is_none_or(|last| t.saturating_sub(last) > 2 * Self::GAP);
        let due = self
            .last_silence
            .is_none_or(|s| t.saturating_sub(s) >= STEADY);
        let mut keep = Vec::new();
        if silent && due {
            if let Some((first, last)) = self.run.take() {
                keep.push((first, last, true));
            }
            self.last_silence = Some(t);
            keep.push((t, t, false));
        }
        keep
    }

    /// The end of the stream at `t`: the open run, and an "unanswered" at `t` when the IP was
    /// silent at the end (so the last gap is measured to the end).
    pub fn finish(&mut self, t: u64) -> Vec<Kept> {
        let mut keep = Vec::new();
        if let Some((first, last)) = self.run.take() {
            keep.push((first, last, true));
        }
        let answered = self
            .last_answer
            .is_some_and(|last| t.saturating_sub(last) <= Self::GAP);
        if !answered {
            keep.push((t, t, false));
        }
        keep
    }
}

/// Thins one IP's neighbour answers: keeps a request answered by two MACs or more, every
/// change of the MACs answering, and one a second otherwise.
#[derive(Debug, Default)]
pub struct NeighbourThinner {
    last: Option<BTreeSet<String>>,
    last_kept: Option<u64>,
}

impl NeighbourThinner {
    /// The MACs that answered the request sent at `t`: whether to keep it.
    pub fn request(&mut self, t: u64, macs: &BTreeSet<String>) -> bool {
        let keep = macs.len() > 1
            || self.last.as_ref() != Some(macs)
            || self.last_kept.is_none_or(|k| t.saturating_sub(k) >= STEADY);
        if keep {
            self.last_kept = Some(t);
        }
        self.last = Some(macs.clone());
        keep
    }
}

/// Where observations go: one JSON line each, whole lines from any thread.
#[derive(Clone)]
struct Out(Arc<Mutex<std::io::Stdout>>);

impl Out {
    fn write(&self, o: &Observation) {
        if let Ok(line) = serde_json::to_string(o)
            && let Ok(mut out) = self.0.lock()
        {
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
    }

    fn echo(&self, ip: IpAddr, kept: impl IntoIterator<Item = Kept>) {
        for (at, last, answered) in kept {
            self.write(&Observation::Echo {
                at,
                ip,
                answered,
                until: (last != at).then_some(last),
            });
        }
    }
}

/// Observes `ips` on `interface` every `interval` for `duration`; prints the observations.
pub fn run(
    ips: &[IpAddr],
    interface: &str,
    interval: Duration,
    duration: Duration,
) -> anyhow::Result<()> {
    let out = Out(Arc::new(Mutex::new(std::io::stdout())));
    let done = Arc::new(AtomicBool::new(false));
    let end = Instant::now() + duration;
    let mut threads = Vec::new();
    let mut arpings: Vec<Child> = Vec::new();
    for ip in ips {
        let (ip, out, done) = (*ip, out.clone(), done.clone());
        threads.push(std::thread::spawn(move || echo(ip, interval, &done, &out)));
    }
    let v6: Vec<Ipv6Addr> = ips
        .iter()
        .filter_map(|ip| match ip {
            IpAddr::V6(v6) => Some(*v6),
            IpAddr::V4(_) => None,
        })
        .collect();
    if !v6.is_empty() {
        let asker = crate::ndp::Asker::open(interface)?;
        let (out, done) = (out.clone(), done.clone());
        threads.push(std::thread::spawn(move || {
            ndp(&asker, &v6, interval, &done, &out)
        }));
    }
    let v4: Vec<Ipv4Addr> = ips
        .iter()
        .filter_map(|ip| match ip {
            IpAddr::V4(v4) => Some(*v4),
            IpAddr::V6(_) => None,
        })
        .collect();
    if !v4.is_empty() {
        // arping sends the requests (one every interval per IP); a packet socket reads them
        // as they leave and every reply to them, so the replies are grouped by the request
        // they answer from the wire itself (arping's own `index=` counts replies, not
        // requests).
        // ETH_P_ALL: the kernel hands outgoing frames only to sockets of every protocol.
        let socket = Socket::new(
            Domain::PACKET,
            Type::RAW,
            Some(Protocol::from(i32::from(ETH_P_ALL.to_be()))),
        )
        .context("opening the ARP packet socket")?;
        socket.set_read_timeout(Some(Duration::from_millis(100)))?;
        let seconds = format!("{:.3}", interval.as_secs_f64());
        for ip in &v4 {
            arpings.push(
                Command::new("arping")
                    .args(["-q", "-i", interface, "-W", &seconds, &ip.to_string()])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .context("starting arping")?,
            );
        }
        let (out, done) = (out.clone(), done.clone());
        threads.push(std::thread::spawn(move || arp(&socket, &v4, &done, &out)));
    }
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(100).min(end - Instant::now().min(end)));
    }
    done.store(true, Ordering::Relaxed);
    for mut child in arpings {
        let _ = child.kill();
        let _ = child.wait();
    }
    for t in threads {
        t.join()
            .map_err(|_| anyhow::anyhow!("an observer thread panicked"))??;
    }
    Ok(())
}

/// One datagram to `ip`'s echo port every `interval`, until `done`.
fn echo(ip: IpAddr, interval: Duration, done: &AtomicBool, out: &Out) -> anyhow::Result<()> {
    let target = SocketAddr::new(ip, crate::echo::UDP_PORT);
    let bind: SocketAddr = if ip.is_ipv6() {
        "[::]:0".parse()?
    } else {
        "0.0.0.0:0".parse()?
    };
    let socket = UdpSocket::bind(bind).context("binding the echo socket")?;
    socket.connect(target)?;
    let mut thin = EchoThinner::default();
    let mut next = Instant::now();
    let mut buf = [0u8; 512];
    let mut sent = 0u64;
    while !done.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= next {
            // Send errors (no route, unreachable) are part of an outage.
            let _ = socket.send(&sent.to_be_bytes());
            sent += 1;
            out.echo(ip, thin.probe(epoch_ms()));
            next += interval;
            continue;
        }
        socket.set_read_timeout(Some(next - now))?;
        if socket.recv(&mut buf).is_ok() {
            out.echo(ip, thin.answer(epoch_ms()));
        }
    }
    out.echo(ip, thin.finish(epoch_ms()));
    Ok(())
}

/// One solicitation per IPv6 address every `interval`; the answers to each, grouped.
fn ndp(
    asker: &crate::ndp::Asker,
    targets: &[Ipv6Addr],
    interval: Duration,
    done: &AtomicBool,
    out: &Out,
) -> anyhow::Result<()> {
    let mut thin: BTreeMap<Ipv6Addr, NeighbourThinner> = BTreeMap::new();
    let mut next = Instant::now();
    while !done.load(Ordering::Relaxed) {
        let at = epoch_ms();
        for t in targets {
            asker.ask(*t)?;
        }
        // Every round listens for half an interval at least: a round that fell behind (a busy
        // machine) must not send the next at once and take its answers for the next round's.
        next = (next + interval).max(Instant::now() + interval / 2);
        let mut answers: BTreeMap<Ipv6Addr, BTreeSet<String>> = BTreeMap::new();
        while let Some((target, mac)) = asker.answer_before(next)? {
            answers
                .entry(target)
                .or_default()
                .insert(crate::ndp::mac_text(mac).to_ascii_lowercase());
        }
        for t in targets {
            let macs = answers.remove(t).unwrap_or_default();
            if thin.entry(*t).or_default().request(at, &macs) {
                out.write(&Observation::Neighbour {
                    at,
                    ip: IpAddr::V6(*t),
                    answered_by: macs.into_iter().collect(),
                });
            }
        }
    }
    Ok(())
}

/// The ethertype of ARP.
const ETH_P_ARP: u16 = 0x0806;

/// Every ethertype (`ETH_P_ALL`).
const ETH_P_ALL: u16 = 0x0003;

/// One ARP frame as a packet socket reads it (Ethernet header included): a request or a reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArpFrame {
    /// Who has `target`? Tell `sender`.
    Request {
        /// The asker's IP.
        sender: Ipv4Addr,
        /// The IP asked for.
        target: Ipv4Addr,
    },
    /// `sender` is at `mac`, told to `target`.
    Reply {
        /// The IP answered for.
        sender: Ipv4Addr,
        /// The MAC it is at.
        mac: String,
        /// Whom the reply is for.
        target: Ipv4Addr,
    },
}

/// Reads an Ethernet/IPv4 ARP frame; `None` for anything else.
pub fn arp_frame(frame: &[u8]) -> Option<ArpFrame> {
    if frame.len() < 42 || frame[12..14] != ETH_P_ARP.to_be_bytes() {
        return None;
    }
    let arp = &frame[14..42];
    // Ethernet hardware, IPv4 protocol, 6- and 4-octet addresses.
    if arp[0..6] != [0, 1, 8, 0, 6, 4] {
        return None;
    }
    let ip = |b: &[u8]| Ipv4Addr::new(b[0], b[1], b[2], b[3]);
    let (sender, target) = (ip(&arp[14..18]), ip(&arp[24..28]));
    match arp[6..8] {
        [0, 1] => Some(ArpFrame::Request { sender, target }),
        [0, 2] => Some(ArpFrame::Reply {
            sender,
            mac: arp[8..14]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(":"),
            target,
        }),
        _ => None,
    }
}

/// One request for an IP and the MACs that answered it so far.
struct Round {
    at: u64,
    asker: Ipv4Addr,
    macs: BTreeSet<String>,
}

/// Groups the ARP replies to the client by the request they answer: each request the client
/// sends for one of `targets` closes the round of the one before. Gratuitous announcements
/// (addressed to the IP itself) are not answers.
fn arp(socket: &Socket, targets: &[Ipv4Addr], done: &AtomicBool, out: &Out) -> anyhow::Result<()> {
    let mut rounds: BTreeMap<Ipv4Addr, Round> = BTreeMap::new();
    let mut thin: BTreeMap<Ipv4Addr, NeighbourThinner> = BTreeMap::new();
    let mut keep = |ip: Ipv4Addr, round: Round| {
        if thin.entry(ip).or_default().request(round.at, &round.macs) {
            out.write(&Observation::Neighbour {
                at: round.at,
                ip: IpAddr::V4(ip),
                answered_by: round.macs.into_iter().collect(),
            });
        }
    };
    let mut buf = [0u8; 1514];
    while !done.load(Ordering::Relaxed) {
        let n = match (&*socket).read(&mut buf) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        match arp_frame(&buf[..n]) {
            Some(ArpFrame::Request { sender, target })
                if targets.contains(&target) && sender != target =>
            {
                let next = Round {
                    at: epoch_ms(),
                    asker: sender,
                    macs: BTreeSet::new(),
                };
                if let Some(done_round) = rounds.insert(target, next) {
                    keep(target, done_round);
                }
            }
            Some(ArpFrame::Reply {
                sender,
                mac,
                target,
            }) => {
                if let Some(round) = rounds.get_mut(&sender)
                    && round.asker == target
                {
                    round.macs.insert(mac);
                }
            }
            _ => {}
        }
    }
    for (ip, round) in std::mem::take(&mut rounds) {
        keep(ip, round);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds answers at `times` (a probe every 10 ms from 0 to `end`) through the thinner
    /// and the checkers' outage measure: the kept observations and the outages over 50 ms.
    fn thinned(times: &[u64], end: u64) -> (Vec<Observation>, Vec<(u64, u64)>) {
        let mut thin = EchoThinner::default();
        let mut kept = Vec::new();
        let mut answers = times.iter().peekable();
        let mut t = 0;
        while t <= end {
            kept.extend(thin.probe(t));
            while let Some(a) = answers.next_if(|a| **a < t + 10) {
                kept.extend(thin.answer(*a));
            }
            t += 10;
        }
        kept.extend(thin.finish(end));
        let ip = IpAddr::V4(std::net::Ipv4Addr::new(198, 18, 200, 0));
        let observations: Vec<Observation> = kept
            .into_iter()
            .map(|(at, last, answered)| Observation::Echo {
                at,
                ip,
                answered,
                until: (last != at).then_some(last),
            })
            .collect();
        let history = super::super::check::History {
            faults: Vec::new(),
            observations: observations.clone(),
            run: end,
            nodes: Vec::new(),
        };
        let gaps = super::super::check::outages(&history, &Default::default())
            .remove(&ip)
            .unwrap_or_default();
        (observations, gaps)
    }

    #[test]
    fn thinning_keeps_every_gap_the_checkers_see() {
        // Answers every 10 ms for 5 s, with a 300 ms gap from 2,000 to 2,300: one outage, and
        // few observations.
        let times: Vec<u64> = (0..500)
            .map(|i| i * 10 + 1)
            .filter(|t| !(2000..2300).contains(t))
            .collect();
        let (kept, gaps) = thinned(&times, 5000);
        assert!(kept.len() < 30, "{} kept of {}", kept.len(), times.len());
        assert_eq!(gaps, vec![(1991, 2301)]);
        // Steady answers: no outage at all, although a second lies between observations.
        let (kept, gaps) = thinned(&(0..500).map(|i| i * 10).collect::<Vec<_>>(), 4995);
        assert!(kept.len() < 10, "{kept:?}");
        assert_eq!(gaps, vec![]);
        // Silence kept as "unanswered", once a second at most.
        let (silent, _) = thinned(&[], 3000);
        let unanswered = silent
            .iter()
            .filter(|o| {
                matches!(
                    o,
                    Observation::Echo {
                        answered: false,
                        ..
                    }
                )
            })
            .count();
        assert_eq!(unanswered, 5, "{silent:?}");
        // An outage to the end: measured to the end.
        let (_, gaps) = thinned(&(0..100).map(|i| i * 10).collect::<Vec<_>>(), 3000);
        assert_eq!(gaps, vec![(990, 3000)]);
        // Answers 40 ms apart (below the checkers' bound, above the thinning gap): each gap
        // kept, none an outage.
        let (_, gaps) = thinned(&(0..50).map(|i| i * 40).collect::<Vec<_>>(), 1990);
        assert_eq!(gaps, vec![]);
    }

    #[test]
    fn neighbour_thinning_keeps_changes_and_splits() {
        let mut thin = NeighbourThinner::default();
        let a = BTreeSet::from(["aa".to_string()]);
        let b = BTreeSet::from(["bb".to_string()]);
        let both: BTreeSet<String> = a.union(&b).cloned().collect();
        assert!(thin.request(0, &a));
        assert!(!thin.request(10, &a));
        assert!(thin.request(20, &both));
        assert!(thin.request(30, &both), "every split is kept");
        assert!(thin.request(40, &b));
        assert!(thin.request(50, &BTreeSet::new()));
        assert!(!thin.request(60, &BTreeSet::new()));
        assert!(thin.request(1060, &BTreeSet::new()), "one a second");
    }

    #[test]
    fn reads_arp_requests_and_replies() {
        // A reply from 82:24:ad:bd:37:ba: 198.18.200.0 is at it, told to 198.18.0.5.
        let mut reply = vec![0xff; 6];
        reply.extend([0x82, 0x24, 0xad, 0xbd, 0x37, 0xba, 0x08, 0x06]);
        reply.extend([0, 1, 8, 0, 6, 4, 0, 2]);
        reply.extend([0x82, 0x24, 0xad, 0xbd, 0x37, 0xba, 198, 18, 200, 0]);
        reply.extend([2, 0, 0, 0, 0, 1, 198, 18, 0, 5]);
        assert_eq!(
            arp_frame(&reply),
            Some(ArpFrame::Reply {
                sender: Ipv4Addr::new(198, 18, 200, 0),
                mac: "82:24:ad:bd:37:ba".into(),
                target: Ipv4Addr::new(198, 18, 0, 5),
            })
        );
        let mut request = reply.clone();
        request[21] = 1;
        request[28..32].copy_from_slice(&[198, 18, 0, 5]);
        request[38..42].copy_from_slice(&[198, 18, 200, 0]);
        assert_eq!(
            arp_frame(&request),
            Some(ArpFrame::Request {
                sender: Ipv4Addr::new(198, 18, 0, 5),
                target: Ipv4Addr::new(198, 18, 200, 0),
            })
        );
        // Short, another ethertype, another protocol: nothing.
        assert_eq!(arp_frame(&reply[..41]), None);
        let mut ipv6 = reply.clone();
        ipv6[12..14].copy_from_slice(&[0x86, 0xdd]);
        assert_eq!(arp_frame(&ipv6), None);
        let mut other = reply;
        other[16] = 0x86;
        assert_eq!(arp_frame(&other), None);
    }
}
