//! Whether a stopping speaker is being replaced (a rolling update), so that it asks the others
//! to keep it the owner of its IPs for the restart hold instead of taking them over
//! (`ferrolb_layer2::liveness::Membership::set_restart_hold`, decision record 0015, "Restarts").
//!
//! A DaemonSet's rolling update, and `kubectl delete pod`, delete the Pod through the API
//! before the kubelet stops the container: the Pod has a deletion timestamp when the speaker gets
//! SIGTERM, and a successor comes. A node shutting down or rebooting stops its pods without
//! deleting them: no deletion timestamp, no successor soon, and its IPs should move at once.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

/// When a stop counts as a replacement.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum HoldWhen {
    /// When this speaker's Pod (`--pod-name`) is being deleted.
    PodDeleted,
    /// On every SIGTERM (a speaker run by a supervisor that restarts it, not by Kubernetes).
    Always,
}

/// Whether the stop is a replacement, from the mode and this speaker's Pod as the API server
/// has it (`None`: not found, or not asked).
pub fn replaced(when: HoldWhen, pod: Option<&Pod>) -> bool {
    match when {
        HoldWhen::Always => true,
        HoldWhen::PodDeleted => pod.is_some_and(|p| p.metadata.deletion_timestamp.is_some()),
    }
}

/// Asks the API server about this speaker's Pod (at most two seconds: a stop must not wait on
/// an API server that is away, and without an answer the IPs move, as on any stop).
pub async fn is_replacement(
    client: &kube::Client,
    namespace: &str,
    pod_name: Option<&str>,
    when: HoldWhen,
) -> bool {
    if when == HoldWhen::Always {
        return true;
    }
    let Some(name) = pod_name else {
        return false;
    };
    let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), namespace);
    match tokio::time::timeout(Duration::from_secs(2), pods.get_opt(name)).await {
        Ok(Ok(pod)) => replaced(when, pod.as_ref()),
        Ok(Err(e)) => {
            tracing::warn!(pod = name, error = %e, "cannot read this speaker's Pod: stopping without a restart hold");
            false
        }
        Err(_) => {
            tracing::warn!(
                pod = name,
                "reading this speaker's Pod timed out: stopping without a restart hold"
            );
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn only_a_pod_being_deleted_is_a_replacement() {
        let mut pod = Pod::default();
        assert!(!replaced(HoldWhen::PodDeleted, Some(&pod)));
        assert!(!replaced(HoldWhen::PodDeleted, None));
        pod.metadata.deletion_timestamp = Some(Time(Default::default()));
        assert!(replaced(HoldWhen::PodDeleted, Some(&pod)));
        assert!(replaced(HoldWhen::Always, None));
    }
}
