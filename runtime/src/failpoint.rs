//! Failpoints: named places where a test makes a running binary misbehave on purpose, to prove
//! that the safety nets catch it (a stalled work loop must give up the leader Lease and fail its
//! health check; a panicked one must end the process and hand the Lease over). Armed by creating a file named after the failpoint in the directory given to
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

    /// Panics here when failpoint `name` is armed, as a bug in the code around it would: the
    /// nets that catch a panicked task are what a test of this proves.
    pub fn panic_if_armed(&self, name: &str) {
        if self.armed(name) {
            tracing::error!(failpoint = name, "failpoint armed: panicking here");
            // A deliberate panic is what this failpoint is for.
            #[allow(clippy::panic)]
            {
                panic!("failpoint {name} armed");
            }
        }
    }

    /// Returns once failpoint `name` is armed; never in a release build (a branch of a
    /// `select!` that only a test can take).
    pub async fn armed_later(&self, name: &str) {
        if !cfg!(debug_assertions) || self.dir.is_none() {
            return std::future::pending().await;
        }
        while !self.armed(name) {
            tokio::time::sleep(POLL).await;
        }
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
        // Armed, the panic failpoint panics; disarmed, it does nothing.
        f.panic_if_armed("loop");
        std::fs::write(dir.join("crash"), "").unwrap();
        let crash = std::panic::catch_unwind(|| f.panic_if_armed("crash"));
        assert!(crash.is_err(), "an armed panic failpoint returned");
        std::fs::remove_file(dir.join("crash")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
