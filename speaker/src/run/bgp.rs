//! BGP in the work loop: the plan of this node turned into sessions and routes for the driver,
//! and the driver's reports turned into MetalLB's metrics.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use ferrolb_config::model::Config;
use ferrolb_speaker::bgp::driver::{Driver, Observer, PeerSettings};
use ferrolb_speaker::bgp::plan::{self, Inputs};
use ferrolb_speaker::view::{NodeView, ServiceView};

use super::metrics::{Metrics, peer_label};

/// The BGP half of the speaker.
pub struct Bgp {
    driver: Driver,
    /// Peers already reported as unusable, with the reason, so each is logged once.
    reported: BTreeSet<(String, String)>,
}

impl Bgp {
    /// No sessions yet.
    pub fn new(metrics: Metrics) -> Self {
        Self {
            driver: Driver::new(Arc::new(MetricsObserver(metrics))),
            reported: BTreeSet::new(),
        }
    }

    /// Plans this node's advertisements and hands them to the driver. Returns the plan, whose
    /// `services` say which peers each Service is advertised to.
    pub fn apply(
        &mut self,
        config: &Config,
        nodes: &BTreeMap<String, NodeView>,
        me: &str,
        services: &[ServiceView],
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
            // passwordSecret is not read yet: such a peer stays down and is reported once.
            match PeerSettings::from_peer(peer, &addresses, None) {
                Ok(settings) => {
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
        plan
    }

    /// Closes every session with a Cease NOTIFICATION.
    pub async fn shutdown(self) {
        self.driver.shutdown(Duration::from_secs(2)).await;
    }
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
