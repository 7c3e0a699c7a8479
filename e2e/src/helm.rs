//! Helm against the lab: the binary `e2e/install-deps` builds, with the lab's admin kubeconfig.

use std::process::Command;

use anyhow::{Context, bail};

use crate::lab::{Lab, bin_dir, repo_root};

/// The release name `demo --helm` and the chart's lab tests install.
pub const RELEASE: &str = "ferrolb";

/// Runs `helm ARGS` as the lab's admin; its stdout, or an error with its stderr.
pub fn helm(lab: &Lab, args: &[&str]) -> anyhow::Result<String> {
    let helm = bin_dir().join("helm");
    let out = Command::new(&helm)
        .arg("--kubeconfig")
        .arg(lab.admin_kubeconfig())
        .args(args)
        .output()
        .with_context(|| format!("running {}", helm.display()))?;
    if !out.status.success() {
        // helm warns about the chart's symlinked files on every command: not the error.
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stderr: Vec<&str> = stderr
            .lines()
            .filter(|l| !l.contains("found symbolic link in path"))
            .collect();
        bail!(
            "helm {} failed ({}): {}",
            args.join(" "),
            out.status,
            stderr.join("\n")
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `helm upgrade --install` of the repository's chart into `namespace` as `release`, with the
/// images imported into the nodes (their tag, never pulled) and `extra` arguments (a later
/// `--set` wins); waits until every workload is rolled out.
pub fn install(
    lab: &Lab,
    release: &str,
    namespace: &str,
    extra: &[&str],
) -> anyhow::Result<String> {
    let chart = repo_root().join("charts/ferrolb").display().to_string();
    // The tag the images were built with, not the chart's appVersion, which could drift.
    let oci = crate::lab::images::oci_dir();
    let controller_tag = format!(
        "controller.image.tag={}",
        crate::lab::images::layout_tag(&oci.join("ferrolb-controller"))?
    );
    let speaker_tag = format!(
        "speaker.image.tag={}",
        crate::lab::images::layout_tag(&oci.join("ferrolb-speaker"))?
    );
    let mut args = vec![
        "upgrade",
        "--install",
        release,
        chart.as_str(),
        "--set",
        controller_tag.as_str(),
        "--set",
        speaker_tag.as_str(),
        "--namespace",
        namespace,
        "--create-namespace",
        "--set",
        "controller.image.pullPolicy=Never",
        "--set",
        "speaker.image.pullPolicy=Never",
        "--wait",
        "--timeout",
        "5m",
    ];
    args.extend_from_slice(extra);
    helm(lab, &args)
}
