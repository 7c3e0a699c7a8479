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
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

/// Runs trials with given arguments (a runner that changes them, e.g. one thread).
pub use libtest_mimic::run as run_with;
pub use libtest_mimic::{Arguments, Conclusion, Failed, Trial};

/// Whether this process runs as root (its effective user ID is 0).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
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
    ignored_for(test(name, body), unmet(tools).as_deref())
}

/// `trial`, reported as ignored when there is a `reason` it cannot run here (printed on
/// stderr with the trial's name).
pub fn ignored_for(trial: Trial, reason: Option<&str>) -> Trial {
    if let Some(reason) = reason {
        eprintln!("{} is reported as ignored: {reason}", trial.name());
    }
    trial.with_ignored_flag(reason.is_some())
}

/// Whether `args` select a trial named `name` (the name filter, `--exact`, `--skip`): for a
/// runner that prepares something costly only when a trial that needs it is to run.
pub fn selected(args: &Arguments, name: &str) -> bool {
    !args.is_filtered_out(&Trial::test(name, || Ok(())))
}

/// Runs `trials` with the command line's arguments (filters, `--list`, `--ignored`, ...).
pub fn run(trials: Vec<Trial>) -> ExitCode {
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

/// The exit code of a run of one or more sets of trials: failure when any of them failed.
pub fn exit_code(conclusions: &[Conclusion]) -> ExitCode {
    if conclusions.iter().any(Conclusion::has_failed) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The failed trials' messages, kept so that a runner can print them once more after long
/// output of its own (logs), where the end of a CI log shows why the run failed.
#[derive(Clone, Debug, Default)]
pub struct Failures(Arc<Mutex<Vec<(String, String)>>>);

impl Failures {
    /// A trial running `body` whose failure is also kept here.
    pub fn trial(
        &self,
        name: impl Into<String>,
        body: impl FnOnce() -> Result<(), Failed> + Send + 'static,
    ) -> Trial {
        let name = name.into();
        let record = self.recorder(&name);
        Trial::test(name, move || record(body()))
    }

    /// Passes a trial's outcome through, keeping a failure under `name`.
    fn recorder(&self, name: &str) -> impl Fn(Result<(), Failed>) -> Result<(), Failed> + use<> {
        let (list, name) = (self.0.clone(), name.to_string());
        move |outcome| {
            if let Err(failed) = &outcome
                && let Ok(mut list) = list.lock()
            {
                let message = failed.message().unwrap_or("(no message)").to_string();
                list.push((name.clone(), message));
            }
            outcome
        }
    }

    /// The failures so far: (trial, message), in the order they happened.
    pub fn list(&self) -> Vec<(String, String)> {
        self.0.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Prints each failure on stderr as `<prefix>: FAILED <trial>: <message>`.
    pub fn print(&self, prefix: &str) {
        for (name, message) in self.list() {
            eprintln!("{prefix}: FAILED {name}: {message}");
        }
    }
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
    fn failures_are_kept_with_their_test_and_outcomes_pass_through() {
        let failures = Failures::default();
        let ok = failures.recorder("passes")(Ok(()));
        let failed = failures.recorder("fails")(Err(Failed::from("the router said no")));
        assert!(ok.is_ok());
        assert_eq!(
            failed.err().and_then(|f| f.message().map(str::to_string)),
            Some("the router said no".to_string())
        );
        assert_eq!(
            failures.list(),
            vec![("fails".to_string(), "the router said no".to_string())]
        );
    }

    #[test]
    fn any_failed_run_fails_the_exit_code() {
        let run = |num_failed| Conclusion {
            num_filtered_out: 0,
            num_passed: 2,
            num_failed,
            num_ignored: 1,
            num_measured: 0,
        };
        assert_eq!(exit_code(&[run(0), run(0)]), ExitCode::SUCCESS);
        assert_eq!(exit_code(&[run(0), run(1)]), ExitCode::FAILURE);
    }

    #[test]
    fn selection_follows_the_filter_exact_and_skip() {
        let all = Arguments::default();
        assert!(selected(&all, "l2_failover"));
        let filtered = Arguments {
            filter: Some("l2".into()),
            skip: vec!["failover".into()],
            ..Arguments::default()
        };
        assert!(selected(&filtered, "l2_spread"));
        assert!(!selected(&filtered, "l2_failover"));
        assert!(!selected(&filtered, "bgp_spread"));
        let exact = Arguments {
            filter: Some("l2".into()),
            exact: true,
            ..Arguments::default()
        };
        assert!(selected(&exact, "l2") && !selected(&exact, "l2_spread"));
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
