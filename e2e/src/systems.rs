//! The systems a bench measures side by side: ferrolb or MetalLB running in the lab, behind one
//! interface, and the layer 2 failover trial both go through the same way.

use std::time::Duration;

use crate::Lab;
use crate::bench::{finish_probe, start_probe};
use crate::ferrolb::Deployment;
use crate::metallb::MetalLb;

/// One system running in the lab.
pub enum Running {
    /// MetalLB's controller and speakers.
    MetalLb(MetalLb),
    /// ferrolb's controller and speakers.
    Ferrolb(Deployment),
}

impl Running {
    /// The system's name, as the benches print it.
    pub fn name(&self) -> &'static str {
        match self {
            Running::MetalLb(_) => "MetalLB",
            Running::Ferrolb(_) => "ferrolb",
        }
    }

    /// The controller's process ID.
    pub fn controller_pid(&self) -> i32 {
        match self {
            Running::MetalLb(m) => m.controller.pid,
            Running::Ferrolb(f) => f.controller.pid,
        }
    }

    /// The process ID of `node`'s speaker, if it runs.
    pub fn speaker_pid(&self, node: &str) -> Option<i32> {
        match self {
            Running::MetalLb(m) => m.speaker(node).map(|p| p.pid),
            Running::Ferrolb(f) => f.speakers.process(node).map(|p| p.pid),
        }
    }

    /// The (node, process ID) of every running speaker among `nodes`.
    pub fn speaker_pids(&self, nodes: &[String]) -> Vec<(String, i32)> {
        nodes
            .iter()
            .filter_map(|n| Some((n.clone(), self.speaker_pid(n)?)))
            .collect()
    }

    /// SIGKILLs `node`'s speaker.
    pub fn kill_speaker(&self, node: &str) {
        match self {
            Running::MetalLb(m) => m.kill_speaker(node),
            Running::Ferrolb(f) => f.speakers.kill(node),
        }
    }

    /// Starts `node`'s speaker again.
    pub async fn start_speaker(&self, node: &str) -> anyhow::Result<()> {
        match self {
            Running::MetalLb(m) => m.start_speaker(node).await,
            Running::Ferrolb(f) => f.speakers.start(node),
        }
    }

    /// Stops everything it started.
    pub fn stop(&self) {
        match self {
            Running::MetalLb(m) => m.stop(),
            Running::Ferrolb(f) => f.stop(),
        }
    }
}

/// The layer 2 faults measured on the owner.
#[derive(Clone, Copy, Debug)]
pub enum Fault {
    /// Its lab link goes down: the node is gone for the client.
    LinkCut,
    /// SIGKILL of its speaker: the node still forwards, so the client's neighbour entry keeps
    /// working until a new owner announces itself.
    SpeakerKill,
}

/// One failover trial, the same for every system: waits (at most 180 s) until `first_owner`
/// answers the client for `ip` again (ferrolb and MetalLB both hand an IP back to its first
/// owner once it is healthy: rendezvous or consistent hashing, ferrolb after flap damping),
/// probes `ip` from the client every 10 ms for `window`, injects `fault` on the owner `before`
/// into it, and undoes the fault once the probe is over. Returns the longest gap between
/// answers, in milliseconds. The Service's pods should be away from the owner, so that the
/// outage measures the announcement, not kube-proxy's handling of a dead endpoint.
pub async fn failover_trial(
    lab: &Lab,
    running: &Running,
    fault: Fault,
    ip: &str,
    first_owner: &str,
    window: Duration,
    before: Duration,
) -> anyhow::Result<f64> {
    let owner = crate::cluster::wait_for(
        &format!("{first_owner} to answer for {ip} again"),
        Duration::from_secs(180),
        || async {
            let now = lab
                .answering_node("client", ip)
                .await
                .map_err(|e| e.to_string())?;
            if now == first_owner {
                Ok(Some(now))
            } else {
                Err(now)
            }
        },
    )
    .await?;
    let probe = start_probe(lab, "client", ip, window)?;
    tokio::time::sleep(before).await;
    let injected = match fault {
        Fault::LinkCut => lab.set_link(&owner, false),
        Fault::SpeakerKill => {
            running.kill_speaker(&owner);
            Ok(())
        }
    };
    let report = tokio::task::spawn_blocking(move || finish_probe(probe)).await;
    match fault {
        Fault::LinkCut => lab.set_link(&owner, true)?,
        Fault::SpeakerKill => running.start_speaker(&owner).await?,
    }
    injected?;
    Ok(report??.max_gap_ms)
}
