//! Failpoints: named places where a test makes a running binary misbehave on purpose, to prove
//! that the safety nets catch it (a stalled work loop must give up the leader Lease and fail its
//! health check). Armed by creating a file named after the failpoint in the directory given to
//! [`Failpoints::new`] (the binaries' hidden `--failpoints` flag), and disarmed by removing it, so
//! a test can stall a live process and release it. Compiled into debug builds only: in a release
//! build [`Failpoints::hold`] returns at once.

use std::path::PathBuf;
use std::time::Duration;

/// How often a held failpoint looks whether it has been disarmed.
const POLL: Duration = Duration::from_millis(100);

/// The failpoints of one process.
#[derive(Clone, Debug, Default)]
pub struct Failpoints {
    dir: Option<PathBuf>,
}

impl Failpoints {
    /// Failpoints armed by files in `dir` (`None`: none, the default).
    pub fn new(dir: Option<PathBuf>) -> Self {
        if dir.is_some() && !cfg!(debug_assertions) {
            tracing::warn!(
                "--failpoints is ignored: failpoints are compiled into debug builds only"
            );
        }
        Self { dir }
    }

    /// Whether failpoint `name` is armed now.
    pub fn armed(&self, name: &str) -> bool {
        cfg!(debug_assertions) && self.dir.as_ref().is_some_and(|dir| dir.join(name).exists())
    }

    /// Waits here while failpoint `name` is armed (a stall, as a deadlock or a call that never
    /// returns would cause).
    pub async fn hold(&self, name: &str) {
        if !self.armed(name) {
            return;
        }
        tracing::warn!(
            failpoint = name,
            "failpoint armed: stalling here until it is removed"
        );
        while self.armed(name) {
            tokio::time::sleep(POLL).await;
        }
        tracing::warn!(failpoint = name, "failpoint removed: going on");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[tokio::test]
    async fn a_failpoint_holds_while_its_file_exists() {
        let dir = std::env::temp_dir().join(format!("ferrolb-failpoints-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = Failpoints::new(Some(dir.clone()));
        assert!(!f.armed("loop"));
        f.hold("loop").await;
        std::fs::write(dir.join("loop"), "").unwrap();
        assert!(f.armed("loop"));
        let held = tokio::spawn({
            let f = f.clone();
            async move { f.hold("loop").await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!held.is_finished(), "released while armed");
        std::fs::remove_file(dir.join("loop")).unwrap();
        tokio::time::timeout(Duration::from_secs(5), held)
            .await
            .unwrap()
            .unwrap();
        assert!(!Failpoints::default().armed("loop"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
