//! `e2e/lab demo --helm`: the main job done the way an operator does it. The lab comes up with
//! kubelet nodes (containerd and a kubelet in every node) and ferrolb's images imported into
//! them; `helm install` of charts/ferrolb runs the controller Deployment and the speaker
//! DaemonSet as real pods; then the layer 2 demonstration of `e2e/lab demo`, over two real
//! pods of the lab's echo image.

use std::path::Path;
use std::time::Duration;

use crate::cluster::wait_for;
use crate::ferrolb::NAMESPACE;
use crate::helm;
use crate::lab::Lab;
use crate::topology::Options;

/// Runs the Helm demonstration; leaves the lab up.
pub async fn run(lab_exe: &Path) -> anyhow::Result<()> {
    println!(
        "==> bringing the lab up with kubelet nodes (3 nodes, each a containerd and a kubelet; \
         ferrolb's images built with images/build-oci.sh and imported into every node)"
    );
    let lab = Lab::up(
        Options {
            kubelet: true,
            ..Options::default()
        },
        lab_exe,
    )
    .await?;
    println!(
        "{}",
        lab.kubectl(&["get", "nodes", "-o", "wide"])?.trim_end()
    );
    println!(
        "\n==> helm install {} charts/ferrolb --namespace {NAMESPACE} --create-namespace \
         --set controller.image.pullPolicy=Never --set speaker.image.pullPolicy=Never --wait",
        helm::RELEASE
    );
    let out = helm::install(&lab, helm::RELEASE, NAMESPACE, &[])?;
    for line in out.lines().take_while(|l| !l.starts_with("NOTES:")) {
        println!("  {line}");
    }
    let pods = running_and_ready(&lab).await?;
    println!("\nkubectl get pods -n {NAMESPACE} -o wide:\n{pods}");
    crate::demo::run_l2(&lab).await
}

/// Waits until the controller and one speaker per node run and are Ready (pods being deleted
/// do not count); `kubectl get pods -o wide` of the release's namespace.
pub async fn running_and_ready(lab: &Lab) -> anyhow::Result<String> {
    let nodes = lab.topology.nodes().count();
    wait_for(
        &format!("ferrolb's controller and {nodes} speakers to be Running and Ready"),
        Duration::from_secs(180),
        || async {
            let out = lab
                .kubectl(&["get", "pods", "-n", NAMESPACE, "-o", "json"])
                .map_err(|e| e.to_string())?;
            let list: serde_json::Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
            let pods = list["items"].as_array().cloned().unwrap_or_default();
            let of = |component: &str| {
                pods.iter()
                    .filter(|p| {
                        p["metadata"]["labels"]["app.kubernetes.io/component"] == component
                            && p["metadata"]["deletionTimestamp"].is_null()
                    })
                    .cloned()
                    .collect::<Vec<_>>()
            };
            let ready = |component: &str| {
                of(component)
                    .iter()
                    .filter(|p| {
                        p["status"]["phase"] == "Running"
                            && p["status"]["conditions"].as_array().is_some_and(|c| {
                                c.iter()
                                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
                            })
                    })
                    .count()
            };
            let speakers = of("speaker").len();
            if ready("controller") >= 1 && ready("speaker") == nodes && speakers == nodes {
                Ok(Some(()))
            } else {
                Err(format!(
                    "controllers Ready {}, speakers Ready {} of {speakers} for {nodes} nodes",
                    ready("controller"),
                    ready("speaker"),
                ))
            }
        },
    )
    .await?;
    let wide = lab.kubectl(&["get", "pods", "-n", NAMESPACE, "-o", "wide"])?;
    Ok(wide.trim_end().to_string())
}
