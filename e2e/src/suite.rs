//! One runner for the lab's test suites (`e2e/tests/*.rs`, `harness = false`): the root check,
//! bringing the lab up only when a selected test needs it, the suite's setup, running the tests
//! (one at a time where they share state), logs on failure, and taking the lab down.
//!
//! A test that cannot run here (not root, a tool missing) is reported as ignored with the
//! reason, never as passed; `scripts/test` fails in CI when any test was ignored.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use libtest_mimic::{Arguments, Conclusion, Failed, Trial};

use crate::lab::{Lab, repo_root};
use crate::topology::Options;

/// The future a test or a setup returns.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = anyhow::Result<T>>>>;

/// A lab test: gets the suite's fixture (cloned), runs in a runtime of its own.
pub type LabBody<F> = fn(F) -> BoxFuture<()>;

/// What a suite's setup makes once for all its tests, and takes down after them.
pub trait Fixture: Clone + Send + 'static {
    /// Stops what the setup started (controllers, speakers); the lab itself goes down after.
    fn teardown(&self) {}
}

impl Fixture for Lab {}

enum Body<F> {
    Lab(LabBody<F>),
    Offline {
        run: fn() -> anyhow::Result<()>,
        unmet: Option<String>,
    },
}

/// A suite of tests that share one lab and one fixture.
pub struct Suite<F> {
    name: String,
    options: Options,
    one_at_a_time: bool,
    keep_lab: bool,
    requirement: Result<(), String>,
    tests: Vec<(String, Body<F>)>,
}

impl<F: Fixture> Suite<F> {
    /// A suite named `name` (in messages and in `target/lab-logs/<name>/`), in the standard lab.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            options: Options::default(),
            one_at_a_time: false,
            keep_lab: false,
            requirement: Ok(()),
            tests: Vec::new(),
        }
    }

    /// The lab's options (default: [`Options::default`]).
    pub fn options(mut self, options: Options) -> Self {
        self.options = options;
        self
    }

    /// Runs the tests one at a time (they share speakers, links or the router).
    pub fn one_at_a_time(mut self) -> Self {
        self.one_at_a_time = true;
        self
    }

    /// Leaves the lab up after the suite, for a next suite with the same options to reuse.
    pub fn keep_lab(mut self) -> Self {
        self.keep_lab = true;
        self
    }

    /// A requirement of the lab tests besides root (e.g. helm installed): when `Err`, they are
    /// reported as ignored with that reason.
    pub fn requires(mut self, requirement: Result<(), String>) -> Self {
        self.requirement = requirement;
        self
    }

    /// Adds a test that runs in the lab with the fixture.
    pub fn test(mut self, name: &str, body: LabBody<F>) -> Self {
        self.tests.push((name.to_string(), Body::Lab(body)));
        self
    }

    /// Adds a test that needs no lab; `unmet` says what it lacks here (then it is reported as
    /// ignored, with that reason).
    pub fn offline(
        mut self,
        name: &str,
        unmet: Option<String>,
        run: fn() -> anyhow::Result<()>,
    ) -> Self {
        self.tests
            .push((name.to_string(), Body::Offline { run, unmet }));
        self
    }

    /// Runs the suite: brings the lab up (if a selected lab test needs it), runs `setup` in it,
    /// then the tests; reports every test, and the lab's logs on failure.
    pub fn run<S>(self, args: &Arguments, setup: S) -> Conclusion
    where
        S: FnOnce(Lab) -> BoxFuture<F>,
    {
        let root = crate::is_root();
        let lab_ready = if !root {
            Err(format!("{}: needs root (network namespaces)", self.name))
        } else {
            self.requirement
                .clone()
                .map_err(|e| format!("{}: {e}", self.name))
        };
        let wanted = |name: &str| {
            args.filter.as_ref().is_none_or(|f| {
                if args.exact {
                    name == f
                } else {
                    name.contains(f.as_str())
                }
            }) && !args.skip.iter().any(|s| name.contains(s.as_str()))
        };
        let needs_lab = lab_ready.is_ok()
            && !args.list
            && self
                .tests
                .iter()
                .any(|(n, b)| matches!(b, Body::Lab(_)) && wanted(n));
        if let Err(reason) = &lab_ready {
            eprintln!("{reason}: its lab tests are reported as ignored");
        }

        let fixture: Option<Result<F, String>> = needs_lab.then(|| self.set_up(setup));
        let failures = Failures::default();
        let mut trials = Vec::new();
        for (name, body) in self.tests {
            let record = failures.recorder(&name);
            let trial = match body {
                Body::Offline { run, unmet } => {
                    if let Some(reason) = &unmet {
                        eprintln!("{}: {name} is reported as ignored: {reason}", self.name);
                    }
                    Trial::test(name, move || {
                        record(run().map_err(|e| Failed::from(format!("{e:#}"))))
                    })
                    .with_ignored_flag(unmet.is_some())
                }
                Body::Lab(body) => {
                    let fixture = fixture.clone();
                    Trial::test(name, move || {
                        record(match fixture {
                            Some(Ok(f)) => block_on(body(f)),
                            Some(Err(e)) => Err(Failed::from(e)),
                            None => Err(Failed::from("the lab was not brought up")),
                        })
                    })
                    .with_ignored_flag(lab_ready.is_err())
                }
            };
            trials.push(trial);
        }
        let mut args = args.clone();
        if self.one_at_a_time {
            args.test_threads = Some(1);
        }
        let conclusion = libtest_mimic::run(&args, trials);
        if let Some(fixture) = &fixture {
            if let Ok(f) = fixture {
                f.teardown();
            }
            if conclusion.has_failed() || fixture.is_err() {
                save_logs(&crate::lab_dir(), &self.name);
                // Again after the logs' tails, so that the end of a CI log says why.
                failures.print(&self.name);
            }
            if !self.keep_lab
                && std::env::var_os("FERROLB_KEEP_LAB").is_none()
                && let Err(e) = crate::down()
            {
                eprintln!("{}: lab down failed: {e:#}", self.name);
                return Conclusion {
                    num_failed: conclusion.num_failed.max(1),
                    ..conclusion
                };
            }
        }
        conclusion
    }

    fn set_up<S>(&self, setup: S) -> Result<F, String>
    where
        S: FnOnce(Lab) -> BoxFuture<F>,
    {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| format!("runtime: {e}"))?;
        let options = self.options;
        let result = rt.block_on(async move {
            let lab = Lab::up(options, &lab_exe()?).await?;
            setup(lab).await
        });
        result.map_err(|e| {
            eprintln!("{}: setup failed: {e:#}", self.name);
            format!("setup failed: {e:#}")
        })
    }
}

/// The failed tests' messages, kept to be printed once more after the logs.
#[derive(Clone, Default)]
struct Failures(Arc<Mutex<Vec<(String, String)>>>);

impl Failures {
    /// Passes a test's outcome through, noting a failure under `name`.
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

    fn print(&self, suite: &str) {
        let Ok(list) = self.0.lock() else { return };
        for (name, message) in list.iter() {
            eprintln!("{suite}: FAILED {name}: {message}");
        }
    }
}

/// Runs a future in a runtime of its own (each test gets one).
pub fn block_on(f: BoxFuture<()>) -> Result<(), Failed> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failed::from(e.to_string()))?;
    rt.block_on(f).map_err(|e| Failed::from(format!("{e:#}")))
}

/// The `ferrolb-lab` binary (it runs the lab's pods, agent and supervisors).
pub fn lab_exe() -> anyhow::Result<PathBuf> {
    crate::ferrolb::workspace_binary("ferrolb-lab")
}

/// The exit code for a run of one or more suites.
pub fn exit_code(conclusions: &[Conclusion]) -> ExitCode {
    if conclusions.iter().any(Conclusion::has_failed) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Lines of each log printed on failure.
const TAIL: usize = 15;

/// Copies the lab's logs to `target/lab-logs/<suite>/` (the lab's directory goes with `down`)
/// and prints the tail of each.
pub fn save_logs(lab_dir: &Path, suite: &str) {
    let target = repo_root().join("target/lab-logs").join(suite);
    let _ = std::fs::create_dir_all(&target);
    let Ok(entries) = std::fs::read_dir(lab_dir.join("logs")) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    paths.sort();
    for path in paths {
        let Some(file) = path.file_name() else {
            continue;
        };
        let _ = std::fs::copy(&path, target.join(file));
        if let Ok(text) = std::fs::read_to_string(&path) {
            let lines: Vec<&str> = text.lines().collect();
            eprintln!("---- {} (last lines) ----", path.display());
            for line in &lines[lines.len().saturating_sub(TAIL)..] {
                eprintln!("{line}");
            }
        }
    }
    eprintln!("{suite}: lab logs copied to {}", target.display());
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let kept = failures.0.lock().map(|l| l.clone()).unwrap_or_default();
        assert_eq!(
            kept,
            vec![("fails".to_string(), "the router said no".to_string())]
        );
    }
}
