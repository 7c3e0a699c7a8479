//! BGP in the work loop: the plan of this node turned into sessions and routes for the driver,
//! the driver's reports turned into MetalLB's metrics, and what the node advertises into
//! ServiceBGPStatus objects and `metallb_speaker_announced{protocol="bgp"}`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ferrolb_config::model::{Config, PeerPassword};
use ferrolb_speaker::bgp::driver::{Driver, Observer, PeerSettings};
use ferrolb_speaker::bgp::plan::{self, Inputs};
use ferrolb_speaker::view::{NodeView, ServiceView};
use k8s_openapi::api::core::v1::Secret;
use tokio::sync::watch;

use super::bgp_status;
use super::metrics::{AnnouncedLabels, Metrics, peer_label};

/// The BGP half of the speaker.
pub struct Bgp {
    driver: Driver,
    /// Peers already reported as unusable, with the reason, so each is logged once.
    reported: BTreeSet<(String, String)>,
    metrics: Metrics,
    /// `metallb_speaker_announced{protocol="bgp"}` label sets currently set.
    announced: BTreeSet<AnnouncedLabels>,
    /// The ServiceBGPStatus writer.
    status: watch::Sender<bgp_status::Desired>,
    status_task: tokio::task::JoinHandle<()>,
    /// The sweeper of departed nodes' ServiceBGPStatus objects (fed only while this speaker is
    /// the sweeper).
    sweeper: watch::Sender<Option<BTreeSet<String>>>,
    sweeper_task: tokio::task::JoinHandle<()>,
}

impl Bgp {
    /// No sessions yet; starts the ServiceBGPStatus writer for `node` in `namespace`, and
    /// accepts peers' connections on `listen` (an address that cannot be bound is logged and
    /// left out: the speaker still connects out).
    pub fn new(
        metrics: Metrics,
        client: kube::Client,
        namespace: String,
        node: String,
        listen: &[SocketAddr],
        events: ferrolb_runtime::events::EventQueue,
    ) -> Self {
        let (sweeper, sweeper_task) = bgp_status::spawn_sweeper(client.clone(), namespace.clone());
        let (status, status_task) =
            super::status_objects::spawn::<bgp_status::Bgp>(client, namespace, node, events);
        let mut driver = Driver::new(Arc::new(MetricsObserver(metrics.clone())));
        if !listen.is_empty() {
            let failed = driver.listen(listen);
            tracing::info!(listening = ?driver.listening(), failed = failed.len(), "accepting BGP connections from configured peers");
        }
        Self {
            driver,
            reported: BTreeSet::new(),
            metrics,
            announced: BTreeSet::new(),
            status,
            status_task,
            sweeper,
            sweeper_task,
        }
    }

    /// Sweeps the ServiceBGPStatus objects of nodes that no longer exist, when this speaker is
    /// the first live one by name and the set of Nodes changed (or it just became the sweeper).
    pub fn sweep_departed<'a>(
        &self,
        me: &str,
        nodes: &BTreeMap<String, NodeView>,
        alive: impl IntoIterator<Item = &'a String>,
    ) {
        let wanted = bgp_status::is_sweeper(me, alive).then(|| nodes.keys().cloned().collect());
        self.sweeper.send_if_modified(|current| {
            if *current == wanted {
                false
            } else {
                *current = wanted;
                true
            }
        });
    }

    /// Plans this node's advertisements and hands them to the driver. Returns the plan, whose
    /// `services` say which peers each Service is advertised to. `secret` finds a Secret of
    /// the speaker's namespace by name (for `passwordSecret`).
    pub fn apply(
        &mut self,
        config: &Config,
        nodes: &BTreeMap<String, NodeView>,
        me: &str,
        services: &[ServiceView],
        secret: impl Fn(&str) -> Option<Arc<Secret>>,
    ) -> plan::Plan {
        let plan = plan::plan(Inputs { config, nodes, me }, services);
        let addresses = nodes
            .get(me)
            .map(|n| n.addresses.clone())
            .unwrap_or_default();
        let mut desired = BTreeMap::new();
        for (name, peer_plan) in &plan.peers {
            let Some(peer) = config.peers.get(name) else {
                continue;
            };
            // A passwordSecret that is missing or unusable keeps only this peer down; the
            // Secret's watch brings the loop back here when it changes.
            let password = match &peer.password {
                Some(PeerPassword::Secret {
                    name: secret_name, ..
                }) => match secret_password(secret_name, secret(secret_name).as_deref()) {
                    Ok(p) => Some(p),
                    Err(e) => {
                        if self.reported.insert((name.clone(), e.clone())) {
                            tracing::warn!(peer = %name, error = %e, "BGP peer not started");
                        }
                        continue;
                    }
                },
                _ => None,
            };
            match PeerSettings::from_peer(peer, &addresses, password.as_deref()) {
                Ok(settings) => {
                    // Report again should it break again.
                    self.reported.retain(|(peer, _)| peer != name);
                    desired.insert(name.clone(), (settings, peer_plan.routes.clone()));
                }
                Err(e) => {
                    if self.reported.insert((name.clone(), e.to_string())) {
                        tracing::warn!(peer = %name, error = %e, "BGP peer not started");
                    }
                }
            }
        }
        self.driver.apply(desired);
        self.report(&plan, me, services);
        plan
    }

    /// Metrics and ServiceBGPStatus objects for what `plan` advertises.
    fn report(&mut self, plan: &plan::Plan, me: &str, services: &[ServiceView]) {
        let views: BTreeMap<_, _> = services.iter().map(|s| (&s.key, s)).collect();
        let mut announced = BTreeSet::new();
        for key in plan.services.keys() {
            let Some(view) = views.get(key) else {
                continue;
            };
            // An IP is announced when some peer gets a prefix holding it.
            for ip in view.ips.iter().filter(|ip| {
                plan.peers
                    .values()
                    .any(|p| p.routes.keys().any(|prefix| prefix.contains(*ip)))
            }) {
                announced.insert(vec![
                    ("service", key.to_string()),
                    ("protocol", "bgp".to_string()),
                    ("node", me.to_string()),
                    ("ip", ip.to_string()),
                ]);
            }
        }
        for gone in self.announced.difference(&announced) {
            self.metrics.announced.remove(gone);
        }
        for labels in &announced {
            self.metrics.announced.get_or_create(labels).set(1);
        }
        self.announced = announced;
        let desired = plan.services.clone();
        self.status.send_if_modified(|current| {
            if *current == desired {
                false
            } else {
                *current = desired;
                true
            }
        });
    }

    /// Closes every session with a Cease NOTIFICATION and deletes this node's ServiceBGPStatus
    /// objects (it advertises nothing any more).
    pub async fn shutdown(self) {
        self.driver.shutdown(Duration::from_secs(2)).await;
        self.sweeper_task.abort();
        self.status.send_replace(bgp_status::Desired::new());
        drop(self.status);
        let _ = tokio::time::timeout(Duration::from_secs(5), self.status_task).await;
    }
}

/// The password in a BGPPeer's `passwordSecret`, read as MetalLB reads it: the `password` key
/// of a `kubernetes.io/basic-auth` Secret. The error names the Secret and what is wrong.
fn secret_password(name: &str, secret: Option<&Secret>) -> Result<String, String> {
    let secret = secret.ok_or_else(|| format!("passwordSecret {name:?} does not exist"))?;
    let kind = secret.type_.as_deref().unwrap_or("Opaque");
    if kind != "kubernetes.io/basic-auth" {
        return Err(format!(
            "passwordSecret {name:?} has type {kind:?}, not \"kubernetes.io/basic-auth\""
        ));
    }
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get("password"))
        .ok_or_else(|| format!("passwordSecret {name:?} has no key \"password\""))?;
    let password = String::from_utf8(bytes.0.clone())
        .map_err(|_| format!("passwordSecret {name:?}: key \"password\" is not UTF-8"))?;
    if password.is_empty() {
        return Err(format!(
            "passwordSecret {name:?}: key \"password\" is empty"
        ));
    }
    Ok(password)
}

/// Session reports into `metallb_bgp_*`.
struct MetricsObserver(Metrics);

impl Observer for MetricsObserver {
    fn session_up(&self, peer: &str, up: bool) {
        self.0
            .bgp_session_up
            .get_or_create(&peer_label(peer))
            .set(i64::from(up));
    }

    fn updates_sent(&self, peer: &str, count: u64) {
        self.0
            .bgp_updates
            .get_or_create(&peer_label(peer))
            .inc_by(count);
    }

    fn announced(&self, peer: &str, count: usize) {
        self.0
            .bgp_announced_prefixes
            .get_or_create(&peer_label(peer))
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;

    use super::*;

    fn secret(kind: Option<&str>, data: &[(&str, &[u8])]) -> Secret {
        Secret {
            type_: kind.map(Into::into),
            data: Some(
                data.iter()
                    .map(|(k, v)| ((*k).to_string(), ByteString(v.to_vec())))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Secret::default()
        }
    }

    #[test]
    fn a_basic_auth_secret_gives_its_password() {
        let s = secret(Some("kubernetes.io/basic-auth"), &[("password", b"s3cret")]);
        assert_eq!(secret_password("bgp", Some(&s)).unwrap(), "s3cret");
    }

    #[test]
    fn unusable_secrets_are_refused_with_the_reason() {
        let cases = [
            (None, "does not exist"),
            (
                Some(secret(Some("Opaque"), &[("password", b"x")])),
                "has type \"Opaque\"",
            ),
            (
                Some(secret(None, &[("password", b"x")])),
                "has type \"Opaque\"",
            ),
            (
                Some(secret(
                    Some("kubernetes.io/basic-auth"),
                    &[("username", b"x")],
                )),
                "no key \"password\"",
            ),
            (
                Some(secret(
                    Some("kubernetes.io/basic-auth"),
                    &[("password", b"\xff")],
                )),
                "not UTF-8",
            ),
            (
                Some(secret(
                    Some("kubernetes.io/basic-auth"),
                    &[("password", b"")],
                )),
                "is empty",
            ),
        ];
        for (s, want) in cases {
            let e = secret_password("bgp", s.as_ref()).unwrap_err();
            assert!(e.contains("\"bgp\"") && e.contains(want), "{e}");
        }
    }
}
