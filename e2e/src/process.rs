//! Lab processes: started detached in a namespace, logged to a file, recorded by PID, and stopped
//! by PID (never by name pattern).
//!
//! Every process runs under a small supervisor (`ferrolb-lab supervise`, the lab's own binary):
//! the supervisor leads the process group, waits for the program and writes how it ended (exit
//! status or signal) next to its log. A process outlives whoever started it, so nobody else could
//! tell afterwards why a crashed speaker is gone; with the record, `e2e/lab status` can.

use std::fs::File;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

/// What a process is to the lab: its infrastructure, or ferrolb running in it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// etcd, kube-apiserver, kube-controller-manager, kube-proxies, routers, the node agent: the
    /// lab is up only while all of these run.
    #[default]
    Infrastructure,
    /// A ferrolb controller or speaker (or MetalLB's): the system under test. One that dies is
    /// reported, never makes the lab unusable, and can be restarted.
    Ferrolb,
}

/// A process the lab started.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabProcess {
    /// What it is (`kube-apiserver`, `kube-proxy@node1`, ...).
    pub name: String,
    /// The program's PID.
    pub pid: i32,
    /// Its log file.
    pub log: String,
    /// The kernel's start time of the process (clock ticks since boot): a signal goes to `pid`
    /// only while the process there is still this one, not a later one that reuses the PID.
    #[serde(default)]
    pub start_time: Option<u64>,
    /// The process group (the supervisor's PID; absent for processes recorded before the
    /// supervisor existed, whose group is `pid`).
    #[serde(default)]
    pub group: Option<i32>,
    /// Infrastructure or the system under test.
    #[serde(default)]
    pub kind: Kind,
    /// How to start it again: network namespace, program and arguments.
    #[serde(default)]
    pub command: Option<Spec>,
}

/// Everything needed to start a process (again).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spec {
    /// Network namespace (`None`: the host's).
    pub netns: Option<String>,
    /// The program.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
}

/// Starts `program args` in `netns` (or the host namespace when `None`), in a new session so it
/// outlives the caller, with stdout and stderr appended to `log`, under the supervisor
/// `supervisor` (the `ferrolb-lab` binary).
pub fn spawn(
    supervisor: &Path,
    name: &str,
    netns: Option<&str>,
    program: &str,
    args: &[String],
    log: &Path,
) -> anyhow::Result<LabProcess> {
    spawn_kind(
        supervisor,
        name,
        Kind::Infrastructure,
        netns,
        program,
        args,
        log,
    )
}

/// [`spawn`] with the process's [`Kind`].
pub fn spawn_kind(
    supervisor: &Path,
    name: &str,
    kind: Kind,
    netns: Option<&str>,
    program: &str,
    args: &[String],
    log: &Path,
) -> anyhow::Result<LabProcess> {
    let spec = Spec {
        netns: netns.map(str::to_string),
        program: program.to_string(),
        args: args.to_vec(),
    };
    start(supervisor, name, kind, &spec, log)
}

/// Starts `spec` as [`spawn_kind`] does.
pub fn start(
    supervisor: &Path,
    name: &str,
    kind: Kind,
    spec: &Spec,
    log: &Path,
) -> anyhow::Result<LabProcess> {
    let out = File::options()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let exit_file = exit_file(log);
    let _ = std::fs::remove_file(&exit_file);
    // `setsid` execs in place (we are not a group leader), so the supervisor leads a new session
    // and process group; `ip netns exec` execs too, so the PID it reports is the program's own.
    let mut cmd = Command::new("setsid");
    cmd.arg(supervisor)
        .arg("supervise")
        .arg("--name")
        .arg(name)
        .arg("--exit-file")
        .arg(&exit_file)
        .arg("--");
    if let Some(ns) = &spec.netns {
        cmd.args(["ip", "netns", "exec", ns]);
    }
    cmd.arg(&spec.program)
        .args(&spec.args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(out);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {name} ({})", spec.program))?;
    let group = i32::try_from(child.id()).context("PID out of range")?;
    // The supervisor's first line is the program's PID (or why it could not start it).
    let mut line = String::new();
    if let Some(stdout) = child.stdout.take() {
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .with_context(|| format!("reading {name}'s PID from its supervisor"))?;
    }
    let Ok(pid) = line.trim().parse::<i32>() else {
        let _ = child.wait();
        bail!(
            "starting {name} ({}): {}; see {}",
            spec.program,
            if line.trim().is_empty() {
                "the supervisor exited"
            } else {
                line.trim()
            },
            log.display()
        );
    };
    // The supervisor is reaped by init once we exit (or by `stop`); dropping `Child` does not
    // kill it.
    drop(child);
    Ok(LabProcess {
        name: name.into(),
        pid,
        log: log.display().to_string(),
        start_time: start_time(pid),
        group: Some(group),
        kind,
        command: Some(spec.clone()),
    })
}

/// Where the supervisor records how the process behind `log` ended.
pub fn exit_file(log: &Path) -> PathBuf {
    let mut name = log.as_os_str().to_owned();
    name.push(".exit");
    PathBuf::from(name)
}

/// How long a reader waits for a live supervisor to record the end of its program: the program
/// is seen gone (a zombie) a moment before the supervisor has reaped it and written the record.
const RECORD_WAIT: Duration = Duration::from_secs(2);

/// How the process ended, as its supervisor recorded it (`exited with status 101`, `killed by
/// signal SIGSEGV`), or `None` while it runs or when nothing was recorded (its supervisor was
/// killed with it). When the program has ended but its supervisor still runs, waits (at most
/// [`RECORD_WAIT`]) for the record rather than report a crash as unexplained.
pub fn exit_record(process: &LabProcess) -> Option<String> {
    let read = || {
        std::fs::read_to_string(exit_file(Path::new(&process.log)))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let deadline = Instant::now() + RECORD_WAIT;
    loop {
        let record = read();
        let recording =
            !running(process) && process.group.is_some_and(|g| g != process.pid && alive(g));
        if record.is_some() || !recording || Instant::now() >= deadline {
            return record;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The last `n` lines of a process's log.
pub fn log_tail(process: &LabProcess, n: usize) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(&process.log) else {
        return Vec::new();
    };
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| l.to_string())
        .collect()
}

/// `ferrolb-lab supervise`: runs `command` (its first element is the program), prints its PID on
/// stdout, waits for it and writes how it ended to `exit_file` and to the log (stderr). Must run
/// before the process starts any thread: it blocks the termination signals for itself, so a
/// SIGTERM to the group stops the program while the supervisor stays to record it.
pub fn supervise(name: &str, exit_file: &Path, command: &[String]) -> anyhow::Result<i32> {
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::os::unix::process::ExitStatusExt;

    let (program, args) = command.split_first().context("no command to supervise")?;
    let log = std::io::stderr().as_fd().try_clone_to_owned()?;
    let spawned = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::inherit())
        .spawn();
    let mut stdout = std::io::stdout();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            let _ = writeln!(stdout, "cannot start {program}: {e}");
            let _ = std::fs::write(exit_file, format!("could not start: {e}\n"));
            return Ok(127);
        }
    };
    // The child is started: from now on only it reacts to SIGTERM, SIGINT and SIGHUP. (std resets
    // the signal mask in the children it spawns, and this mask is set after the spawn anyway.)
    let mut set = nix::sys::signal::SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        set.add(s);
    }
    let _ = set.thread_block();
    writeln!(stdout, "{}", child.id())?;
    stdout.flush()?;
    let status = child.wait()?;
    let record = match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(sig)) => format!(
            "killed by signal {}",
            Signal::try_from(sig).map_or_else(|_| sig.to_string(), |s| s.as_str().to_string())
        ),
        _ => format!("ended: {status}"),
    };
    let _ = std::fs::write(exit_file, format!("{record}\n"));
    eprintln!("[ferrolb-lab] {name} {record}");
    Ok(status.code().unwrap_or(128))
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

/// The PIDs of the children of process `pid` (every thread's), as `/proc` lists them; none when
/// it is gone.
pub fn children(pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|c| c.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}

/// Whether the lab's process is still running (alive, not a zombie, and not a later process that
/// reuses its PID).
pub fn running(process: &LabProcess) -> bool {
    alive(process.pid) && is_ours(process)
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

/// How long [`stop`] and [`kill_now`] wait for a process to be gone after SIGKILL.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// Stops a lab process: SIGTERM to its process group, then SIGKILL after `grace`; returns once
/// the program and its supervisor have exited (or [`KILL_WAIT`] after SIGKILL), so a caller
/// that starts the same thing again never races the old one.
pub fn stop(process: &LabProcess, grace: Duration) {
    let group = process.group.unwrap_or(process.pid);
    if !is_ours(process) {
        // Gone already (stopped by a test, or by itself); the PID may belong to another now.
        reap(process.pid);
        wait_gone(group, KILL_WAIT);
        return;
    }
    let pid = Pid::from_raw(process.pid);
    let _ = killpg(Pid::from_raw(group), Signal::SIGTERM);
    let _ = kill(pid, Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while alive(process.pid) && Instant::now() < deadline {
        reap(process.pid);
        std::thread::sleep(Duration::from_millis(20));
    }
    if alive(process.pid) {
        let _ = killpg(Pid::from_raw(group), Signal::SIGKILL);
        let _ = kill(pid, Signal::SIGKILL);
    }
    wait_gone(process.pid, KILL_WAIT);
    // The supervisor records the end and exits right after the program.
    wait_gone(group, KILL_WAIT);
}

/// Sends SIGKILL to the program at once (failure injection, a crash); its supervisor records
/// the signal. Returns once the program is gone and its end recorded (or its supervisor gone).
pub fn kill_now(process: &LabProcess) {
    if !is_ours(process) {
        reap(process.pid);
        return;
    }
    let _ = kill(Pid::from_raw(process.pid), Signal::SIGKILL);
    if process.group.is_none() {
        let _ = killpg(Pid::from_raw(process.pid), Signal::SIGKILL);
    }
    wait_gone(process.pid, KILL_WAIT);
    let _ = exit_record(process);
}

/// Waits until `pid` is gone (reaping it if it is our child), at most `limit`.
fn wait_gone(pid: i32, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        reap(pid);
        if !alive(pid) || Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn reap(pid: i32) {
    use nix::sys::wait::{WaitPidFlag, waitpid};
    let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_the_children_of_a_process() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap_or_else(|e| panic!("{e}"));
        let pid = i32::try_from(child.id()).unwrap_or_default();
        let me = i32::try_from(std::process::id()).unwrap_or_default();
        assert!(children(me).contains(&pid), "{:?}", children(me));
        assert!(children(pid).is_empty());
        let _ = child.kill();
        let _ = child.wait();
        assert!(children(-1).is_empty());
    }
}
