//! `ferrolb-controller check-config`: the controller's validation, offline.

use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::Context;
use ferrolb_config::manifest::read_manifests;
use ferrolb_config::model::PeerPassword;
use ferrolb_config::validate::{Objects, validate};

/// Reads and validates the files; writes the verdict to `out` and warnings to `err`.
/// Returns whether the configuration is valid.
pub fn run(
    namespace: &str,
    files: &[PathBuf],
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<bool> {
    let mut objects = Objects {
        namespace: namespace.to_string(),
        ..Default::default()
    };
    let mut lines = Vec::new();
    for file in files {
        let (source, text) = if file.as_os_str() == "-" {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .context("reading standard input")?;
            ("<stdin>".to_string(), text)
        } else {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("reading {}", file.display()))?;
            (file.display().to_string(), text)
        };
        lines.extend(
            read_manifests(&text, &source, &mut objects)
                .iter()
                .map(ToString::to_string),
        );
    }
    let validated = validate(&objects);
    lines.extend(validated.errors.iter().map(ToString::to_string));
    for warning in &validated.warnings {
        writeln!(err, "warning: {warning}")?;
    }
    for peer in validated.config.peers.values() {
        if let Some(PeerPassword::Secret { name, namespace }) = &peer.password {
            writeln!(
                err,
                "warning: BGPPeer {namespace}/{}: spec.passwordSecret: Secret {namespace}/{name} must exist with key \"password\"; only the cluster can check that",
                peer.name
            )?;
        }
    }
    if lines.is_empty() {
        writeln!(out, "valid")?;
        return Ok(true);
    }
    for line in &lines {
        writeln!(out, "{line}")?;
    }
    Ok(false)
}
