//! The lab's API server through kubectl: applying manifests, the CRDs, ServiceAccount
//! credentials.

use std::path::PathBuf;

use super::*;
use crate::cmd::run;
use crate::pki::Pki;

impl Lab {
    /// Runs the lab's kubectl as admin; fails with kubectl's message.
    pub fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        let kubectl = bin_dir().join("kubectl");
        let kubeconfig = self.admin_kubeconfig().display().to_string();
        let mut full = vec!["--kubeconfig", kubeconfig.as_str()];
        full.extend_from_slice(args);
        run(&kubectl.display().to_string(), &full)
    }

    /// A guard that deletes `objects` (`kind/name`, in `namespace`) when dropped, so a test's
    /// objects go also when it fails.
    pub fn delete_on_drop(&self, namespace: &str, objects: &[&str]) -> DeleteOnDrop<'_> {
        DeleteOnDrop {
            lab: self,
            namespace: namespace.to_string(),
            objects: objects.iter().map(|o| (*o).to_string()).collect(),
        }
    }

    /// Applies a YAML text with kubectl (server-side, so repeated applies are idempotent).
    pub fn apply(&self, yaml: &str) -> anyhow::Result<()> {
        let file = self.dir.join(format!("apply-{}.yaml", std::process::id()));
        std::fs::write(&file, yaml)?;
        let result = self.kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &file.display().to_string(),
        ]);
        let _ = std::fs::remove_file(&file);
        result.map(|_| ())
    }

    /// Installs ferrolb's CRDs (from charts/ferrolb/crds) and waits until they are served.
    pub fn install_crds(&self) -> anyhow::Result<()> {
        let dir = repo_root().join("charts/ferrolb/crds");
        self.kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &dir.display().to_string(),
        ])?;
        self.kubectl(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd",
            "-l",
            "",
            "--all",
        ])
        .map(|_| ())
    }

    /// A kubeconfig file for a ServiceAccount, with a fresh token (TokenRequest, 24 h).
    pub fn service_account_kubeconfig(
        &self,
        namespace: &str,
        account: &str,
    ) -> anyhow::Result<PathBuf> {
        let token = self.kubectl(&[
            "create",
            "token",
            account,
            "-n",
            namespace,
            "--duration=24h",
        ])?;
        let pki = Pki {
            dir: self.dir.join("pki"),
        };
        let server = format!("https://{}:6443", self.topology.apiserver_address());
        let path = self.dir.join(format!("{namespace}-{account}.kubeconfig"));
        std::fs::write(&path, pki.token_kubeconfig(&server, account, token.trim()))?;
        Ok(path)
    }
}

/// See [`Lab::delete_on_drop`].
pub struct DeleteOnDrop<'a> {
    lab: &'a Lab,
    namespace: String,
    objects: Vec<String>,
}

impl Drop for DeleteOnDrop<'_> {
    fn drop(&mut self) {
        for object in &self.objects {
            let _ = self.lab.kubectl(&[
                "delete",
                "-n",
                &self.namespace,
                object,
                "--ignore-not-found",
            ]);
        }
    }
}
