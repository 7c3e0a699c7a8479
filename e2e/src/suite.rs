//! The lab's test suites (`e2e/tests/*.rs`, `harness = false`) on the test kit's runner
//! (`ferrolb_testkit::trial`): the root check, bringing the lab up only when a selected test
//! needs it, the suite's setup, running the tests (one at a time where they share state), logs
//! on failure (then the failures once more), and taking the lab down.
//!
//! A test that cannot run here (not root, a tool missing) is reported as ignored with the
//! reason, never as passed; `scripts/test` fails in CI when any test was ignored.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;

use ferrolb_testkit::trial::{self, Arguments, Conclusion, Failed, Failures};

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
        let lab_ready = if !crate::is_root() {
            Err(format!("{}: needs root (network namespaces)", self.name))
        } else {
            self.requirement
                .clone()
                .map_err(|e| format!("{}: {e}", self.name))
        };
        let needs_lab = lab_ready.is_ok()
            && !args.list
            && self
                .tests
                .iter()
                .any(|(n, b)| matches!(b, Body::Lab(_)) && trial::selected(args, n));
        if let Err(reason) = &lab_ready {
            eprintln!("{reason}: its lab tests are reported as ignored");
        }

        let fixture: Option<Result<F, String>> = needs_lab.then(|| self.set_up(setup));
        let failures = Failures::default();
        let trials = self
            .tests
            .into_iter()
            .map(|(name, body)| match body {
                Body::Offline { run, unmet } => trial::ignored_for(
                    failures.trial(name, move || {
                        run().map_err(|e| Failed::from(format!("{e:#}")))
                    }),
                    unmet.as_deref(),
                ),
                Body::Lab(body) => {
                    let fixture = fixture.clone();
                    failures
                        .trial(name, move || match fixture {
                            Some(Ok(f)) => block_on(body(f)),
                            Some(Err(e)) => Err(Failed::from(e)),
                            None => Err(Failed::from("the lab was not brought up")),
                        })
                        .with_ignored_flag(lab_ready.is_err())
                }
            })
            .collect();
        let mut args = args.clone();
        if self.one_at_a_time {
            args.test_threads = Some(1);
        }
        let conclusion = trial::run_with(&args, trials);
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
pub use ferrolb_testkit::trial::exit_code;

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
