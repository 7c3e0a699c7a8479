//! Deliberately broken builds, to show that the checkers fail when a promise is broken (issue
//! #36: "each shown to fail on a deliberately broken build"). Each is a cargo feature of a
//! binary, off by default, built into a target directory of its own so that the binaries the
//! lab and the images use are never replaced.

use std::path::PathBuf;

use anyhow::{Context, ensure};

/// A broken build and the checker it must trip.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Broken {
    /// The speaker without the layer 2 quorum and tenure rules (feature
    /// `nemesis-broken-quorum`): a node cut off from the others goes on answering, so two nodes
    /// answer for one IP. Legacy membership only (the voters membership decides elsewhere).
    Quorum,
}

impl Broken {
    /// Every broken build, by the name `FERROLB_NEMESIS_BROKEN` takes.
    pub const ALL: [(&'static str, Broken); 1] = [("quorum", Broken::Quorum)];

    /// The build named `name`.
    pub fn named(name: &str) -> anyhow::Result<Self> {
        Self::ALL
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, b)| *b)
            .with_context(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|(n, _)| *n).collect();
                format!("no broken build {name:?} (there are: {})", names.join(", "))
            })
    }

    /// The package, binary and feature that make it.
    fn parts(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Broken::Quorum => (
                "ferrolb-speaker",
                "ferrolb-speaker",
                "nemesis-broken-quorum",
            ),
        }
    }

    /// Builds it (release profile, `target/nemesis-broken/`) and returns the binary's path.
    pub fn build(self) -> anyhow::Result<PathBuf> {
        let (package, binary, feature) = self.parts();
        let target = crate::lab::repo_root()
            .join("target")
            .join("nemesis-broken");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let feature = format!("{package}/{feature}");
        let args = [
            "build",
            "--release",
            "--locked",
            "-p",
            package,
            "--bin",
            binary,
            "--features",
            feature.as_str(),
        ];
        eprintln!(
            "building the broken {binary} (cargo {}, into {})",
            args.join(" "),
            target.display()
        );
        let mut command = std::process::Command::new(cargo);
        command
            .args(args)
            .env("CARGO_TARGET_DIR", &target)
            .current_dir(crate::lab::repo_root());
        crate::ferrolb::without_running_package_env(&mut command);
        let status = command.status().context("running cargo")?;
        ensure!(
            status.success(),
            "`cargo {}` failed: {status}",
            args.join(" ")
        );
        Ok(target.join("release").join(binary))
    }
}
