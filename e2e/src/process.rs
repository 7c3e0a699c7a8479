//! Lab processes: started detached in a namespace, logged to a file, recorded by PID, and stopped
//! by PID (never by name pattern).

use std::fs::File;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

/// A process the lab started.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabProcess {
    /// What it is (`kube-apiserver`, `kube-proxy@node1`, ...).
    pub name: String,
    /// Its PID (also its process group: it runs in its own session).
    pub pid: i32,
    /// Its log file.
    pub log: String,
    /// The kernel's start time of the process (clock ticks since boot): a signal goes to `pid`
    /// only while the process there is still this one, not a later one that reuses the PID.
    #[serde(default)]
    pub start_time: Option<u64>,
}

/// Starts `program args` in `netns` (or the host namespace when `None`), in a new session so it
/// outlives the caller, with stdout and stderr appended to `log`.
pub fn spawn(
    name: &str,
    netns: Option<&str>,
    program: &str,
    args: &[String],
    log: &Path,
) -> anyhow::Result<LabProcess> {
    let out = File::options()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let err = out.try_clone()?;
    // `setsid` execs in place (we are not a group leader) and `ip netns exec` execs too, so the
    // PID we get is the program's own.
    let mut cmd = Command::new("setsid");
    if let Some(ns) = netns {
        cmd.args(["ip", "netns", "exec", ns]);
    }
    cmd.arg(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {name} ({program})"))?;
    let pid = i32::try_from(child.id()).context("PID out of range")?;
    // The child is reaped by `stop` (or by init once we exit); dropping `Child` does not kill it.
    drop(child);
    Ok(LabProcess {
        name: name.into(),
        pid,
        log: log.display().to_string(),
        start_time: start_time(pid),
    })
}

/// The start time of `pid` from /proc (field 22 of `stat`).
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count after the last ')'.
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the process at `process.pid` is still the one the lab started.
fn is_ours(process: &LabProcess) -> bool {
    match process.start_time {
        Some(t) => start_time(process.pid) == Some(t),
        // Recorded before start times were: trust the PID, as before.
        None => true,
    }
}

/// Whether a PID is alive (and not a zombie).
pub fn alive(pid: i32) -> bool {
    if kill(Pid::from_raw(pid), None).is_err() {
        return false;
    }
    // A zombie still answers signal 0; its state in /proc says Z.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|rest| !rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// Stops a lab process: SIGTERM to its process group, then SIGKILL after `grace`.
pub fn stop(process: &LabProcess, grace: Duration) {
    if !is_ours(process) {
        // Gone already (stopped by a test, or by itself); the PID may belong to another now.
        reap(process.pid);
        return;
    }
    let pid = Pid::from_raw(process.pid);
    let _ = killpg(pid, Signal::SIGTERM);
    let _ = kill(pid, Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while alive(process.pid) && Instant::now() < deadline {
        reap(process.pid);
        std::thread::sleep(Duration::from_millis(50));
    }
    if alive(process.pid) {
        let _ = killpg(pid, Signal::SIGKILL);
        let _ = kill(pid, Signal::SIGKILL);
    }
    reap(process.pid);
}

/// Sends SIGKILL to a process group at once (failure injection).
pub fn kill_now(process: &LabProcess) {
    if !is_ours(process) {
        reap(process.pid);
        return;
    }
    let _ = killpg(Pid::from_raw(process.pid), Signal::SIGKILL);
    reap(process.pid);
}

fn reap(pid: i32) {
    use nix::sys::wait::{WaitPidFlag, waitpid};
    let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
}
