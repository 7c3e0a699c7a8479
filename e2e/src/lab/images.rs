//! ferrolb's images on kubelet nodes: built as OCI layouts by `images/build-oci.sh` (no daemon,
//! no registry) and imported into every node's containerd under the names the chart uses, so a
//! pod with `imagePullPolicy: Never` finds them and nothing is ever pulled.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use super::kubelet::{self, NodeRuntime};
use super::*;

/// The lab pods' image on kubelet nodes (the echo server, `e2e/echo`).
pub const ECHO_IMAGE: &str = "localhost/ferrolb-echo";

/// The images the lab imports: OCI layout (under the build's output directory) and the name it
/// gets in containerd (the layout's tag is appended).
pub const IMAGES: &[(&str, &str)] = &[
    ("ferrolb-controller", "ghcr.io/ferrolb/ferrolb-controller"),
    ("ferrolb-speaker", "ghcr.io/ferrolb/ferrolb-speaker"),
    ("ferrolb-echo", ECHO_IMAGE),
];

/// Where `images/build-oci.sh` writes the layouts for the lab.
pub fn oci_dir() -> PathBuf {
    repo_root().join("target/oci")
}

/// Builds the controller, speaker and echo images (`images/build-oci.sh --lab`: cargo for the
/// musl target, then umoci; incremental, so a second run takes about a second).
pub fn build() -> anyhow::Result<PathBuf> {
    let script = repo_root().join("images/build-oci.sh");
    let out = Command::new("bash")
        .arg(&script)
        .args(["--lab", "--out", &oci_dir().display().to_string()])
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "images/build-oci.sh --lab failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(oci_dir())
}

/// The tag of a layout built by `images/build-oci.sh` (its one reference name).
pub fn layout_tag(layout: &Path) -> anyhow::Result<String> {
    let index: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(layout.join("index.json"))
            .with_context(|| format!("reading {}/index.json", layout.display()))?,
    )?;
    index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"]
        .as_str()
        .map(str::to_string)
        .with_context(|| format!("{}: no reference name in index.json", layout.display()))
}

impl Lab {
    /// Imports every image of [`IMAGES`] from `oci` into every kubelet node's containerd.
    pub fn import_images(&self, oci: &Path) -> anyhow::Result<()> {
        let archives = self.dir.join("images");
        std::fs::create_dir_all(&archives)?;
        for (layout, name) in IMAGES {
            let dir = oci.join(layout);
            let archive = archives.join(format!("{layout}.tar"));
            crate::cmd::run(
                "tar",
                &[
                    "-C",
                    &dir.display().to_string(),
                    "-cf",
                    &archive.display().to_string(),
                    "oci-layout",
                    "index.json",
                    "blobs",
                ],
            )
            .with_context(|| {
                format!(
                    "packing {} (build it with images/build-oci.sh --lab)",
                    dir.display()
                )
            })?;
            for rt in self.kubelet_nodes() {
                kubelet::import_image(&rt, &archive, name)?;
            }
        }
        Ok(())
    }

    /// Gives image `image` (`name:tag`) a second tag `tag` on every kubelet node: the same
    /// content under a new name, as a release with a new tag would bring.
    pub fn tag_image(&self, image: &str, tag: &str) -> anyhow::Result<String> {
        let base = image.rsplit_once(':').map_or(image, |(b, _)| b);
        let new = format!("{base}:{tag}");
        for rt in self.kubelet_nodes() {
            kubelet::ctr(&rt, &["images", "tag", "--force", image, &new])
                .with_context(|| format!("tagging {image} as {new} on {}", rt.node))?;
        }
        Ok(new)
    }

    /// The kubelet nodes' runtimes (none unless the lab runs with `--kubelet`).
    pub fn kubelet_nodes(&self) -> Vec<NodeRuntime> {
        if !self.topology.options.kubelet {
            return Vec::new();
        }
        self.topology
            .nodes()
            .map(|h| NodeRuntime::new(&self.dir, h))
            .collect()
    }
}
