//! A client that measures outages: it sends a UDP datagram to the pods' echo port every
//! `interval` for a fixed time and records when answers arrive. The longest gap between answers
//! is the outage a user of the Service saw. Runs inside the client's namespace (`ferrolb-lab
//! probe`), bounded in time, and stops by itself.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// What a probe run saw.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Datagrams sent.
    pub sent: u64,
    /// Answers received.
    pub received: u64,
    /// Longest time without an answer, milliseconds: between two answers, from the start to the
    /// first answer, or from the last answer to the end.
    pub max_gap_ms: f64,
    /// Milliseconds from the start to the beginning of the longest gap.
    pub gap_start_ms: f64,
    /// Answers by pod name.
    pub answers: std::collections::BTreeMap<String, u64>,
}

/// Probes `target` every `interval` for `duration`.
pub fn run(target: SocketAddr, interval: Duration, duration: Duration) -> anyhow::Result<Report> {
    let bind: SocketAddr = if target.is_ipv6() {
        "[::]:0".parse()?
    } else {
        "0.0.0.0:0".parse()?
    };
    let socket = UdpSocket::bind(bind).context("binding the probe socket")?;
    socket.connect(target)?;
    socket.set_read_timeout(Some(Duration::from_millis(5)))?;
    let socket = Arc::new(socket);
    let done = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let sender = {
        let socket = socket.clone();
        let done = done.clone();
        std::thread::spawn(move || {
            let mut sent = 0u64;
            let mut next = start;
            while !done.load(Ordering::Relaxed) {
                // Send errors (no route, unreachable) are part of an outage, not a failure.
                let _ = socket.send(&sent.to_be_bytes());
                sent += 1;
                next += interval;
                if let Some(wait) = next.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
            sent
        })
    };
    let mut report = Report::default();
    let mut last = start;
    let mut buf = [0u8; 512];
    let end = start + duration;
    while Instant::now() < end {
        if let Ok(len) = socket.recv(&mut buf) {
            let now = Instant::now();
            let gap = now.duration_since(last);
            if gap.as_secs_f64() * 1000.0 > report.max_gap_ms {
                report.max_gap_ms = gap.as_secs_f64() * 1000.0;
                report.gap_start_ms = last.duration_since(start).as_secs_f64() * 1000.0;
            }
            last = now;
            report.received += 1;
            let name = String::from_utf8_lossy(&buf[..len]).trim().to_string();
            *report.answers.entry(name).or_default() += 1;
        }
    }
    let tail = end.saturating_duration_since(last).as_secs_f64() * 1000.0;
    if tail > report.max_gap_ms {
        report.max_gap_ms = tail;
        report.gap_start_ms = last.duration_since(start).as_secs_f64() * 1000.0;
    }
    done.store(true, Ordering::Relaxed);
    report.sent = sender
        .join()
        .map_err(|_| anyhow::anyhow!("probe sender panicked"))?;
    Ok(report)
}

/// What a held connection saw ([`hold`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HoldReport {
    /// Lines sent.
    pub sent: u64,
    /// Answers received.
    pub received: u64,
    /// Longest time without an answer, milliseconds.
    pub max_gap_ms: f64,
    /// Answers by pod name (one pod for a connection that held: kube-proxy's DNAT is per flow).
    pub answers: std::collections::BTreeMap<String, u64>,
    /// How the connection broke, and when (milliseconds from the start), if it did.
    pub broken: Option<String>,
}

/// Holds one TCP connection to the pods' stream endpoint behind `target` (`GET /stream`, see
/// [`crate::echo::STREAM_PATH`]), sending a line every `interval`, until `stop` says so or
/// `limit` has passed; records the answers and whether the connection broke (a reset, the
/// other side closing, a failed write). A connection that breaks is not reopened: the point is
/// whether one long-lived connection survives.
pub fn hold(
    target: SocketAddr,
    interval: Duration,
    limit: Duration,
    stop: impl Fn() -> bool,
) -> anyhow::Result<HoldReport> {
    use std::io::{BufRead, BufReader, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&target, Duration::from_secs(3))
        .with_context(|| format!("connecting to {target}"))?;
    stream.set_nodelay(true)?;
    write!(
        stream,
        "GET {} HTTP/1.1\r\nHost: lab\r\n\r\n",
        crate::echo::STREAM_PATH
    )?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut head = String::new();
    while reader.read_line(&mut head)? > 2 {
        head.clear();
    }
    let start = Instant::now();
    let done = Arc::new(AtomicBool::new(false));
    // Answers arrive on their own thread, so that a slow answer is a gap, not a lost line.
    let receiver = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut report = HoldReport::default();
            let mut last = start;
            let mut line = String::new();
            loop {
                line.clear();
                match reader.read_line(&mut line) {
                    Ok(0) => {
                        if !done.load(Ordering::Relaxed) {
                            report.broken = Some(format!(
                                "closed by the other side at {:.0} ms",
                                start.elapsed().as_secs_f64() * 1000.0
                            ));
                        }
                        break;
                    }
                    Ok(_) => {
                        let now = Instant::now();
                        report.max_gap_ms = report
                            .max_gap_ms
                            .max(now.duration_since(last).as_secs_f64() * 1000.0);
                        last = now;
                        report.received += 1;
                        *report.answers.entry(line.trim().to_string()).or_default() += 1;
                    }
                    Err(e) => {
                        if !done.load(Ordering::Relaxed) {
                            report.broken = Some(format!(
                                "{e} at {:.0} ms",
                                start.elapsed().as_secs_f64() * 1000.0
                            ));
                        }
                        break;
                    }
                }
            }
            report
        })
    };
    let mut sent = 0u64;
    let mut write_error = None;
    let mut next = start;
    while !stop() && start.elapsed() < limit {
        if let Err(e) = stream.write_all(b"ping\n") {
            write_error = Some(format!(
                "writing: {e} at {:.0} ms",
                start.elapsed().as_secs_f64() * 1000.0
            ));
            break;
        }
        sent += 1;
        next += interval;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    // Let the last answers arrive, then close our side; the receiver ends at the close.
    std::thread::sleep(Duration::from_millis(200));
    done.store(true, Ordering::Relaxed);
    let _ = stream.shutdown(std::net::Shutdown::Both);
    let mut report = receiver
        .join()
        .map_err(|_| anyhow::anyhow!("hold receiver panicked"))?;
    report.sent = sent;
    if report.broken.is_none() {
        report.broken = write_error;
    }
    Ok(report)
}

/// A connection held from a lab host ([`hold`] in `ferrolb-lab hold`, in the host's namespace)
/// while a test does something to the cluster; [`Held::finish`] ends it. Dropped unfinished, the
/// process is killed.
pub struct Held {
    child: Option<std::process::Child>,
}

impl Held {
    /// Starts holding a connection from `from` to port 80 of `ip`.
    pub fn start(lab: &crate::Lab, from: &str, ip: &str) -> anyhow::Result<Self> {
        let child = lab
            .lab_command(from, &["hold", "--ip", ip])?
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .context("starting ferrolb-lab hold")?;
        Ok(Self { child: Some(child) })
    }

    /// Closes the connection and returns what it saw.
    pub fn finish(mut self) -> anyhow::Result<HoldReport> {
        let mut child = self.child.take().context("already finished")?;
        // Closing its stdin is the signal to stop.
        drop(child.stdin.take());
        let out = child.wait_with_output()?;
        anyhow::ensure!(
            out.status.success(),
            "ferrolb-lab hold failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(serde_json::from_slice(&out.stdout)?)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
