//! What a client on the lab segment sees of every LoadBalancer IP during a nemesis run
//! (`ferrolb-lab nemesis-observe`, run in the client's namespace): every `interval`, per IP,
//! one ARP request (IPv4, through `arping`) or Neighbor Solicitation (IPv6) with every MAC
//! that answers it, and one datagram to the pods' echo port, answered or not. Bounded in time;
//! stops by itself.
//!
//! It prints [`Observation`]s as JSON lines, times in milliseconds of the Unix epoch (the
//! recorder rebases them on the run's start: namespaces share the clock). At 100 probes a
//! second per IP a full record would be about 25 MB per IP per hour, so each stream is thinned
//! ([`EchoThinner`], [`NeighbourThinner`]) in a way the checkers cannot tell apart: every gap
//! longer than [`EchoThinner::GAP`] keeps its two ends, every change of the answering MACs and
//! every request with two MACs is kept, and one observation a second marks the steady state.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv6Addr, SocketAddr, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;

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
    for ip in ips.iter().filter(|ip| ip.is_ipv4()) {
        // arping (Thomas Habets's) numbers its requests: every reply line carries the index of
        // the request it answers, so two MACs for one request are two owners at once.
        let seconds = format!("{:.3}", interval.as_secs_f64());
        let mut child = Command::new("arping")
            .args(["-i", interface, "-W", &seconds, &ip.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting arping")?;
        let stdout = child.stdout.take().context("arping's stdout")?;
        arpings.push(child);
        let (ip, out) = (*ip, out.clone());
        threads.push(std::thread::spawn(move || {
            arping_lines(ip, BufReader::new(stdout), &out)
        }));
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

/// One arping reply line: the request's index and the MAC that answered it.
pub fn arping_reply(line: &str) -> Option<(u64, String)> {
    // "60 bytes from 82:24:ad:bd:37:ba (198.18.200.0): index=0 time=38.251 usec"
    let rest = line.split(" bytes from ").nth(1)?;
    let mac = rest.split_whitespace().next()?.to_ascii_lowercase();
    let index = rest
        .split_whitespace()
        .find_map(|w| w.strip_prefix("index="))?
        .parse()
        .ok()?;
    Some((index, mac))
}

/// Groups arping's replies by request and keeps them through a [`NeighbourThinner`]. A
/// request nobody answered prints "Timeout": kept as a request with no MAC.
fn arping_lines(ip: IpAddr, lines: impl BufRead, out: &Out) -> anyhow::Result<()> {
    let mut thin = NeighbourThinner::default();
    let mut current: Option<(u64, u64, BTreeSet<String>)> = None;
    let flush = |group: (u64, u64, BTreeSet<String>), thin: &mut NeighbourThinner| {
        let (at, _, macs) = group;
        if thin.request(at, &macs) {
            out.write(&Observation::Neighbour {
                at,
                ip,
                answered_by: macs.into_iter().collect(),
            });
        }
    };
    for line in lines.lines() {
        let line = line?;
        let now = epoch_ms();
        if let Some((index, mac)) = arping_reply(&line) {
            match &mut current {
                Some((_, i, macs)) if *i == index => {
                    macs.insert(mac);
                }
                _ => {
                    if let Some(group) = current.take() {
                        flush(group, &mut thin);
                    }
                    current = Some((now, index, BTreeSet::from([mac])));
                }
            }
        } else if line.trim() == "Timeout" {
            if let Some(group) = current.take() {
                flush(group, &mut thin);
            }
            flush((now, u64::MAX, BTreeSet::new()), &mut thin);
        }
    }
    if let Some(group) = current.take() {
        flush(group, &mut thin);
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
    fn reads_arping_replies() {
        assert_eq!(
            arping_reply(
                "60 bytes from 82:24:AD:bd:37:ba (198.18.200.0): index=17 time=38.251 usec"
            ),
            Some((17, "82:24:ad:bd:37:ba".to_string()))
        );
        assert_eq!(arping_reply("Timeout"), None);
        assert_eq!(arping_reply("ARPING 198.18.200.0"), None);
    }
}
