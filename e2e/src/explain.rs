//! Running the `ferrolb` CLI (`kubectl ferrolb explain`) against the lab, as a user would: the
//! workspace's binary with a kubeconfig, its exit status and output kept apart.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::Lab;
use crate::ferrolb;

/// What one run of the CLI gave.
#[derive(Clone, Debug)]
pub struct Run {
    /// Exit status (none: killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Run {
    /// Standard output as JSON (for `-o json`).
    pub fn json(&self) -> anyhow::Result<serde_json::Value> {
        serde_json::from_str(&self.stdout)
            .with_context(|| format!("not JSON: {}\n{}", self.stdout, self.stderr))
    }

    /// The run as a golden file holds it: the command (`args`), its exit status, its output.
    pub fn transcript(&self, args: &[&str]) -> String {
        format!(
            "$ kubectl ferrolb {}\n# exit {}\n{}",
            args.join(" "),
            self.code.map_or("signal".to_string(), |c| c.to_string()),
            self.stdout
        )
    }

    /// The diagnosis codes of a JSON report.
    pub fn codes(report: &serde_json::Value) -> Vec<String> {
        report["diagnoses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| d["code"].as_str().map(str::to_owned))
            .collect()
    }
}

/// Runs `binary` (`ferrolb` or `kubectl-ferrolb`) with `kubeconfig` and `args`.
pub fn run_with(kubeconfig: &Path, binary: &str, args: &[&str]) -> anyhow::Result<Run> {
    let exe = ferrolb::workspace_binary(binary)?;
    let out = std::process::Command::new(&exe)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .with_context(|| format!("running {}", exe.display()))?;
    Ok(Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// Runs `ferrolb` as the lab's admin, with a token ([`admin_token_kubeconfig`]).
pub fn run(lab: &Lab, args: &[&str]) -> anyhow::Result<Run> {
    run_with(&admin_token_kubeconfig(lab)?, "ferrolb", args)
}

/// The ServiceAccount that stands for the lab's admin with a token.
const ADMIN_ACCOUNT: &str = "ferrolb-lab-admin";

/// A kubeconfig of a cluster-admin ServiceAccount's token. The speakers give their live reports
/// only to callers that send a bearer token, and the lab's admin kubeconfig holds a client
/// certificate, which cannot be passed on (docs/explain.md); explain run with it answers from
/// the objects alone.
pub fn admin_token_kubeconfig(lab: &Lab) -> anyhow::Result<PathBuf> {
    lab.apply(&format!(
        "apiVersion: v1
kind: ServiceAccount
metadata: {{name: {ADMIN_ACCOUNT}, namespace: kube-system}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {ADMIN_ACCOUNT}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}}
subjects: [{{kind: ServiceAccount, name: {ADMIN_ACCOUNT}, namespace: kube-system}}]
"
    ))?;
    lab.service_account_kubeconfig("kube-system", ADMIN_ACCOUNT)
}
