//! What the lab benchmarks share: the lab brought up for them (as root, with every binary
//! they run built first) and taken down after, their trial count, and one line of percentiles
//! per series of measurements.

use crate::{Lab, Options, ferrolb};

/// Brings the lab up for a bench: fails unless root; builds the binaries first (a bench must
/// run the current ones).
pub async fn lab_up() -> anyhow::Result<Lab> {
    anyhow::ensure!(crate::is_root(), "the bench needs root (the lab)");
    let lab_exe = ferrolb::workspace_binary("ferrolb-lab")?;
    ferrolb::workspace_binary("ferrolb-controller")?;
    ferrolb::workspace_binary("ferrolb-speaker")?;
    Lab::up(Options::default(), &lab_exe).await
}

/// Deploys pods of app `probe` on every node of `nodes` but `away_from`, points Service
/// `service` at them and waits for their endpoints: a fault on `away_from` then measures the
/// announcement, not kube-proxy's handling of a dead endpoint. Returns the nodes with pods.
pub async fn serve_away_from<'a>(
    scope: &mut crate::scope::TestScope,
    api: &kube::Api<k8s_openapi::api::core::v1::Service>,
    service: &str,
    nodes: &[&'a str],
    away_from: &str,
) -> anyhow::Result<Vec<&'a str>> {
    let others: Vec<&str> = nodes.iter().copied().filter(|n| *n != away_from).collect();
    scope.deploy("probe", &others).await?;
    api.patch(
        service,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({"spec": {"selector": {"app": "probe"}}})),
    )
    .await?;
    scope.wait_ready_endpoints(service, others.len()).await?;
    Ok(others)
}

/// Starts `ferrolb-lab probe` in `host`: a UDP datagram to `ip`'s echo port every 10 ms for
/// `duration`; [`finish_probe`] reads its report.
pub fn start_probe(
    lab: &Lab,
    host: &str,
    ip: &str,
    duration: std::time::Duration,
) -> anyhow::Result<std::process::Child> {
    Ok(lab
        .lab_command(
            host,
            &[
                "probe",
                "--ip",
                ip,
                "--interval-ms",
                "10",
                "--duration-ms",
                &duration.as_millis().to_string(),
            ],
        )?
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()?)
}

/// Waits for a probe started by [`start_probe`] and returns what it saw.
pub fn finish_probe(child: std::process::Child) -> anyhow::Result<crate::probe::Report> {
    let out = child.wait_with_output()?;
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// Takes the lab down after a bench, unless `FERROLB_KEEP_LAB` is set.
pub fn lab_done() -> anyhow::Result<()> {
    if std::env::var_os("FERROLB_KEEP_LAB").is_none() {
        crate::down()?;
    }
    Ok(())
}

/// `label n= p50 p99 max min` (milliseconds) of `values`; `None` when there are none.
pub fn percentiles(label: &str, mut values: Vec<f64>) -> Option<String> {
    values.sort_by(f64::total_cmp);
    let last = *values.last()?;
    let pct = |p: f64| {
        let i = ((p * values.len() as f64).ceil() as usize).clamp(1, values.len()) - 1;
        values[i]
    };
    Some(format!(
        "{label:32} n={:3}  p50 {:7.0} ms  p99 {:7.0} ms  max {:7.0} ms  min {:7.0} ms",
        values.len(),
        pct(0.5),
        pct(0.99),
        last,
        values[0]
    ))
}

/// The trials per case a bench runs: `FERROLB_BENCH_TRIALS`, else `default`.
pub fn trials(default: usize) -> usize {
    std::env::var("FERROLB_BENCH_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn percentiles_of_a_series() {
        let line = percentiles("x", vec![30.0, 10.0, 20.0, 40.0]).unwrap();
        assert!(line.contains("n=  4"), "{line}");
        assert!(line.contains("p50      20 ms"), "{line}");
        assert!(line.contains("p99      40 ms"), "{line}");
        assert!(line.contains("min      10 ms"), "{line}");
        assert_eq!(percentiles("x", Vec::new()), None);
    }
}
