//! The `ferrolb` binary as a user runs it, without a cluster: help, version, usage mistakes and
//! an unreachable cluster each get the documented exit status (0 help and version, 1 failures;
//! 2 is kept for "problems found"). The lab tests (e2e/tests/explain.rs) run it against a real
//! API server. Being an integration test, this also makes `cargo test` build both binaries.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn run(binary: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(binary).args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn help_and_version_exit_0() {
    for binary in [
        env!("CARGO_BIN_EXE_ferrolb"),
        env!("CARGO_BIN_EXE_kubectl-ferrolb"),
    ] {
        let (code, out, _) = run(binary, &["--help"]);
        assert_eq!(code, Some(0));
        assert!(out.contains("explain") && out.contains("status"), "{out}");
        let (code, out, _) = run(binary, &["--version"]);
        assert_eq!(code, Some(0));
        assert!(out.contains(env!("CARGO_PKG_VERSION")), "{out}");
    }
}

#[test]
fn usage_mistakes_exit_1_not_2() {
    let (code, _, err) = run(env!("CARGO_BIN_EXE_ferrolb"), &["explain", "nonsense"]);
    assert_eq!(code, Some(1), "{err}");
    let (code, _, err) = run(
        env!("CARGO_BIN_EXE_ferrolb"),
        &["explain", "ip", "not-an-ip"],
    );
    assert_eq!(code, Some(1), "{err}");
}

#[test]
fn a_missing_kubeconfig_is_a_clear_failure() {
    let (code, out, err) = run(
        env!("CARGO_BIN_EXE_ferrolb"),
        &["--kubeconfig", "/nonexistent/ferrolb-kubeconfig", "status"],
    );
    assert_eq!(code, Some(1));
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("/nonexistent/ferrolb-kubeconfig"), "{err}");
}
