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
    })
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
    let _ = killpg(Pid::from_raw(process.pid), Signal::SIGKILL);
    reap(process.pid);
}

fn reap(pid: i32) {
    use nix::sys::wait::{WaitPidFlag, waitpid};
    let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
}
