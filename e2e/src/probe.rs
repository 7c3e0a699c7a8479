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
