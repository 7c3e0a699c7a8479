//! A nemesis run's figures and violations as text: what the bench prints at the end and what
//! `ferrolb-lab nemesis-check` prints for a saved history.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::check::{self, Bounds, History, Observation};
use super::schedule::FaultKind;

/// The faults by kind, the outages (echo) and ARP/NDP silences by the faults in force when
/// they began (p50/p99/max), the observations kept, memory at the start and end per process,
/// and every violation of the default bounds.
pub fn summary(history: &History, ips: usize) -> String {
    let bounds = Bounds::default();
    let mut out = String::new();
    let mut by_kind: BTreeMap<FaultKind, usize> = BTreeMap::new();
    for w in &history.faults {
        *by_kind.entry(w.kind).or_default() += 1;
    }
    let _ = writeln!(out, "nemesis: faults injected by kind");
    for (kind, n) in &by_kind {
        let _ = writeln!(out, "  {kind:?}: {n}");
    }
    for (what, gaps) in [
        ("outages (echo)", check::outages(history, &bounds)),
        ("ARP/NDP silences", check::silences(history, &bounds)),
    ] {
        let _ = writeln!(
            out,
            "nemesis: {what} over {} ms, by the faults in force, milliseconds",
            bounds.outage.as_millis()
        );
        for (label, lengths) in by_faults(history, &bounds, gaps.values().flatten()) {
            if let Some(line) = crate::bench::percentiles(&label, lengths) {
                let _ = writeln!(out, "  {line}");
            }
        }
    }
    let mut rss: BTreeMap<&str, Vec<(u64, u64)>> = BTreeMap::new();
    let (mut neighbour, mut echo) = (0usize, 0usize);
    for o in &history.observations {
        match o {
            Observation::Rss { at, process, bytes } => {
                rss.entry(process).or_default().push((*at, *bytes))
            }
            Observation::Neighbour { .. } => neighbour += 1,
            Observation::Echo { .. } => echo += 1,
            _ => {}
        }
    }
    let _ = writeln!(
        out,
        "nemesis: {ips} IPs observed, {neighbour} neighbour and {echo} echo observations kept"
    );
    let _ = writeln!(out, "nemesis: RSS at start and end, MiB");
    for (process, mut samples) in rss {
        samples.sort_unstable();
        let mib = |b: Option<&(u64, u64)>| b.map_or(0.0, |(_, b)| *b as f64 / (1 << 20) as f64);
        let _ = writeln!(
            out,
            "  {process}: {:.1} -> {:.1}",
            mib(samples.first()),
            mib(samples.last())
        );
    }
    let violations = check::check(history, &bounds);
    let _ = writeln!(out, "nemesis: {} violations", violations.len());
    // By kind: how many, and the first few of each (a broken build makes thousands).
    let mut by_kind: BTreeMap<&str, Vec<&check::Violation>> = BTreeMap::new();
    for v in &violations {
        by_kind.entry(v.kind()).or_default().push(v);
    }
    for (kind, all) in by_kind {
        let _ = writeln!(out, "  {kind}: {}", all.len());
        for v in all.iter().take(SHOWN) {
            let _ = writeln!(out, "    {v:?}");
        }
        if all.len() > SHOWN {
            let _ = writeln!(out, "    ... and {} more", all.len() - SHOWN);
        }
    }
    out
}

/// Violations shown per kind.
const SHOWN: usize = 5;

/// The lengths of `gaps` grouped by the kinds of fault in force (or undone less than
/// [`Bounds::after_heal`] before) when they began: `LinkCut+SpeakerFrozen`, or `no fault`.
fn by_faults<'a>(
    history: &History,
    bounds: &Bounds,
    gaps: impl Iterator<Item = &'a (u64, u64)>,
) -> BTreeMap<String, Vec<f64>> {
    let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let slack = ms(bounds.after_heal);
    let mut grouped: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (from, to) in gaps {
        let mut kinds: Vec<String> = history
            .faults
            .iter()
            .filter(|w| ms(w.start) <= *to && *from <= ms(w.end()) + slack)
            .map(|w| format!("{:?}", w.kind))
            .collect();
        kinds.sort();
        kinds.dedup();
        let label = if kinds.is_empty() {
            "no fault".to_string()
        } else {
            kinds.join("+")
        };
        grouped
            .entry(label)
            .or_default()
            .push(to.saturating_sub(*from) as f64);
    }
    grouped
}
