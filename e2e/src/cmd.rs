//! Running commands on the host or inside a lab namespace, with errors that say what ran.

use std::process::{Command, Output};

use anyhow::{Context, bail};

/// Runs a command to completion; fails with its stderr when it exits non-zero.
pub fn run(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = output(program, args)?;
    if !out.status.success() {
        bail!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a command and returns its output whatever the exit status.
pub fn output(program: &str, args: &[&str]) -> anyhow::Result<Output> {
    Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("starting `{program}`"))
}

/// Runs a command inside a network namespace.
pub fn run_in(netns: &str, program: &str, args: &[&str]) -> anyhow::Result<String> {
    let mut full = vec!["netns", "exec", netns, program];
    full.extend_from_slice(args);
    run("ip", &full)
}

/// Runs a command inside a network namespace and returns its output whatever the status.
pub fn output_in(netns: &str, program: &str, args: &[&str]) -> anyhow::Result<Output> {
    let mut full = vec!["netns", "exec", netns, program];
    full.extend_from_slice(args);
    output("ip", &full)
}

/// `ip ARGS` inside a namespace (`ip -n NS ...`).
pub fn ip_in(netns: &str, args: &[&str]) -> anyhow::Result<String> {
    let mut full = vec!["-n", netns];
    full.extend_from_slice(args);
    run("ip", &full)
}

/// Writes a sysctl inside a namespace (network sysctls are per namespace).
pub fn sysctl_in(netns: &str, key: &str, value: &str) -> anyhow::Result<()> {
    run_in(netns, "sysctl", &["-qw", &format!("{key}={value}")]).map(|_| ())
}
