//! The libtest-mimic glue for tests with `harness = false` that need root and installed tools.
//!
//! A trial whose needs are not met here is reported as *ignored* (and the reason printed),
//! never as passed; a panic in a trial's body is a failure carrying the panic message.
//!
//! ```no_run
//! use ferrolb_testkit::trial;
//!
//! fn frr_session_comes_up() { /* panics on failure */ }
//!
//! fn main() -> std::process::ExitCode {
//!     trial::run(vec![trial::needs(
//!         "frr_session_comes_up",
//!         &["/usr/lib/frr/bgpd"],
//!         frr_session_comes_up,
//!     )])
//! }
//! ```

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::process::{Command, ExitCode};

pub use libtest_mimic::{Failed, Trial};

/// Whether this process runs as root (`id -u` is 0).
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// Whether `tool` is installed: a path (with a `/`) must exist; a bare name must be an
/// executable file in a `PATH` directory.
pub fn installed(tool: &str) -> bool {
    if tool.contains('/') {
        return Path::new(tool).exists();
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|dir| {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::metadata(dir.join(tool))
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// The first of `tools` that is not installed.
pub fn missing<'a>(tools: &[&'a str]) -> Option<&'a str> {
    tools.iter().copied().find(|t| !installed(t))
}

/// Why a test that needs root and `tools` cannot run here; `None` when it can.
pub fn unmet(tools: &[&str]) -> Option<String> {
    if !is_root() {
        return Some("needs root (network namespaces)".to_string());
    }
    missing(tools).map(|t| format!("{t} is not installed (e2e/install-deps)"))
}

/// Panics (fails the test) unless root and `tools` are there: for a body that `main` has
/// already let run, so that a missing tool is a failure, not a confusing error later.
pub fn require(tools: &[&str]) {
    if let Some(reason) = unmet(tools) {
        panic!("{reason}");
    }
}

/// The message of a panic payload (`panic!` with a literal or a formatted message).
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panicked".to_string())
}

/// Runs `body`: a panic is a failure with the panic's message.
pub fn catch(body: impl FnOnce()) -> Result<(), Failed> {
    // The body's state is dropped after a panic, never looked at again.
    std::panic::catch_unwind(AssertUnwindSafe(body))
        .map_err(|panic| Failed::from(panic_message(&*panic)))
}

/// A trial that runs `body` and fails with the panic message if it panics.
pub fn test(name: impl Into<String>, body: impl FnOnce() + Send + 'static) -> Trial {
    Trial::test(name, move || catch(body))
}

/// [`test`], reported as ignored (with the reason on stderr) unless this runs as root and
/// every one of `tools` is installed (see [`installed`]).
pub fn needs(
    name: impl Into<String>,
    tools: &[&str],
    body: impl FnOnce() + Send + 'static,
) -> Trial {
    let name = name.into();
    let unmet = unmet(tools);
    if let Some(reason) = &unmet {
        eprintln!("{name} is reported as ignored: {reason}");
    }
    test(name, body).with_ignored_flag(unmet.is_some())
}

/// Runs `trials` with the command line's arguments (filters, `--list`, `--ignored`, ...).
pub fn run(trials: Vec<Trial>) -> ExitCode {
    libtest_mimic::run(&libtest_mimic::Arguments::from_args(), trials).exit_code()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_panic_is_a_failure_with_its_message() {
        let payload = std::panic::catch_unwind(|| panic!("boom {}", 7)).unwrap_err();
        assert_eq!(panic_message(&*payload), "boom 7");
        let payload = std::panic::catch_unwind(|| panic!("plain")).unwrap_err();
        assert_eq!(panic_message(&*payload), "plain");
        let failed = catch(|| panic!("{} failed", "check")).unwrap_err();
        assert_eq!(failed.message(), Some("check failed"));
        assert!(catch(|| {}).is_ok());
    }

    #[test]
    fn tools_by_path_and_by_name() {
        assert!(installed("/bin/sh"));
        assert!(installed("sh"));
        assert!(!installed("/nonexistent/ferrolb-tool"));
        assert!(!installed("ferrolb-no-such-tool"));
        assert_eq!(
            missing(&["sh", "ferrolb-no-such-tool", "also-missing"]),
            Some("ferrolb-no-such-tool")
        );
        assert_eq!(missing(&["sh"]), None);
    }

    #[test]
    fn a_missing_tool_is_a_reason() {
        let reason = unmet(&["ferrolb-no-such-tool"]).unwrap();
        if is_root() {
            assert_eq!(
                reason,
                "ferrolb-no-such-tool is not installed (e2e/install-deps)"
            );
        } else {
            assert_eq!(reason, "needs root (network namespaces)");
        }
    }
}
