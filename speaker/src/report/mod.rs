//! The speaker's live report (`ferrolb_explain::speaker_report`) from what one step of the work
//! loop decided: the layer 2 plan with its takeover order, the quorum verdict, and the BGP plan
//! with what each peer gets and why. Pure, so what `kubectl ferrolb explain` is told is tested
//! against the plans themselves. [`live`] keeps the latest step's decisions and renders the
//! report when someone asks; [`auth`] decides who may ask.

pub(crate) mod auth;
pub(crate) mod live;

use std::collections::{BTreeMap, BTreeSet};

use ferrolb_config::allocator::ServiceKey;
use ferrolb_config::model::{Config, PeerTarget};
use ferrolb_explain::speaker_report::{
    Layer2Report, Layer2Service, NodeState, PeerReport, RouteReport,
};

use crate::bgp::plan::Plan as BgpPlan;
use crate::l2::interfaces::Interface;
use crate::l2::plan::{Plan as Layer2Plan, ServiceOutcome, Unannounced};
use crate::service_views::ViewMap;
use crate::view::{NodeView, ServiceView};

/// The node as the speaker sees it.
pub fn node_state(node: Option<&NodeView>) -> NodeState {
    NodeState {
        known: node.is_some(),
        excluded: node.is_some_and(|n| n.excluded),
        network_unavailable: node.is_some_and(|n| n.network_unavailable),
    }
}

/// What the membership check found, for [`layer2`].
#[derive(Clone, Debug, Default)]
pub struct Standing {
    /// This node may own IPs now.
    pub may_own: bool,
    /// The quorum rule's verdict.
    pub quorum: bool,
    /// Known speakers.
    pub known: usize,
    /// Speakers heard.
    pub heard: usize,
    /// Held back by flap damping.
    pub held_back: bool,
}

/// The layer 2 part: the standing, the candidates, and each Service's owner and takeover
/// order (`plan::takeover`), with the interfaces where this node answers.
pub fn layer2(
    plan: &Layer2Plan,
    takeover: &BTreeMap<ServiceKey, Vec<String>>,
    standing: &Standing,
    members: impl IntoIterator<Item = String>,
    interfaces: &BTreeMap<String, Interface>,
    ips: &ViewMap,
) -> Layer2Report {
    let services = plan
        .services
        .iter()
        .map(|(key, outcome)| {
            let ips = ips.get(key).map(|v| v.ips.clone()).unwrap_or_default();
            let (owner, unannounced) = match outcome {
                ServiceOutcome::Owner(node) => (Some(node.to_string()), None),
                ServiceOutcome::Unannounced(why) => (
                    None,
                    Some(
                        match why {
                            Unannounced::NoServingEndpoints => "no-serving-endpoints",
                            Unannounced::NoEligibleNode => "no-eligible-node",
                        }
                        .to_string(),
                    ),
                ),
            };
            let here: BTreeSet<String> = ips
                .iter()
                .filter_map(|ip| plan.announce.get(ip))
                .filter(|a| a.services.contains(key))
                .flat_map(|a| a.interfaces.iter().cloned())
                .collect();
            Layer2Service {
                service: key.to_string(),
                ips,
                owner,
                unannounced,
                takeover: takeover.get(key).cloned().unwrap_or_default(),
                interfaces: here.into_iter().collect(),
            }
        })
        .collect();
    Layer2Report {
        may_own: standing.may_own,
        quorum: standing.quorum,
        speakers_known: standing.known,
        speakers_heard: standing.heard,
        held_back: standing.held_back,
        members: members.into_iter().collect(),
        interfaces: interfaces.keys().cloned().collect(),
        macs: interfaces
            .iter()
            .filter_map(|(name, i)| Some((name.clone(), mac_text(i.mac?))))
            .collect(),
        services,
    }
}

/// A MAC address as `ip link` shows it.
fn mac_text(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The BGP part, before the sessions' live state is filled in: every peer of the plan with
/// its address, why it is not started (`not_started`, by peer), and each route with its
/// attributes and the Services it carries.
pub fn bgp_peers<'a>(
    config: &Config,
    plan: &BgpPlan,
    not_started: &BTreeMap<String, String>,
    view: impl Fn(&ServiceKey) -> Option<&'a ServiceView>,
) -> Vec<PeerReport> {
    // (peer, prefix) -> the Services whose IPs it covers.
    let mut behind: BTreeMap<(&str, ipnet::IpNet), BTreeSet<String>> = BTreeMap::new();
    for (key, peers) in &plan.services {
        let Some(view) = view(key) else { continue };
        for peer in peers {
            let Some(peer_plan) = plan.peers.get(peer) else {
                continue;
            };
            for ip in &view.ips {
                for prefix in peer_plan.routes.keys().filter(|p| p.contains(ip)) {
                    behind
                        .entry((peer.as_str(), *prefix))
                        .or_default()
                        .insert(key.to_string());
                }
            }
        }
    }
    plan.peers
        .iter()
        .map(|(name, peer_plan)| {
            let address = match config.peers.get(name).map(|p| &p.target) {
                Some(PeerTarget::Address(ip)) => ip.to_string(),
                Some(PeerTarget::Interface(i)) => format!("interface {i}"),
                None => String::new(),
            };
            let routes = peer_plan
                .routes
                .iter()
                .map(|(prefix, attrs)| RouteReport {
                    prefix: prefix.to_string(),
                    local_pref: attrs.local_pref,
                    communities: attrs.communities.iter().map(|c| c.to_string()).collect(),
                    large_communities: attrs
                        .large_communities
                        .iter()
                        .map(|c| c.to_string())
                        .collect(),
                    services: behind
                        .get(&(name.as_str(), *prefix))
                        .map(|s| s.iter().cloned().collect())
                        .unwrap_or_default(),
                })
                .collect();
            PeerReport {
                name: name.clone(),
                address,
                state: if not_started.contains_key(name) {
                    "NotStarted".into()
                } else {
                    "Idle".into()
                },
                not_started: not_started.get(name).cloned(),
                routes,
                ..PeerReport::default()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::bgp::plan::{PeerPlan, RouteAttributes};
    use crate::l2::plan::Announcement;
    use crate::view::ServiceObject;
    use ferrolb_bgp::packet::Community;
    use ipnet::IpNet;
    use std::sync::Arc;

    fn view(name: &str, ip: &str) -> ServiceView {
        ServiceView {
            service: Arc::new(ServiceObject {
                key: ServiceKey::new("web", name),
                labels: Default::default(),
                ips: vec![ip.parse().unwrap()],
                local_traffic: false,
                uid: None,
            }),
            serving_nodes: BTreeSet::new(),
            any_serving: true,
        }
    }

    #[test]
    fn layer2_says_owner_order_and_where_it_answers() {
        let key = ServiceKey::new("web", "a");
        let mut plan = Layer2Plan::default();
        plan.services
            .insert(key.clone(), ServiceOutcome::Owner("node1".into()));
        plan.services.insert(
            ServiceKey::new("web", "b"),
            ServiceOutcome::Unannounced(Unannounced::NoServingEndpoints),
        );
        let takeover = BTreeMap::from([(key.clone(), vec!["node1".into(), "node3".into()])]);
        plan.announce.insert(
            "198.18.200.1".parse().unwrap(),
            Announcement {
                interfaces: ["eth0".to_string()].into(),
                services: [key.clone()].into(),
            },
        );
        let standing = Standing {
            may_own: true,
            quorum: true,
            known: 3,
            heard: 2,
            held_back: false,
        };
        let r = layer2(
            &plan,
            &takeover,
            &standing,
            ["node1".to_string(), "node3".to_string()],
            &BTreeMap::from([(
                "eth0".to_string(),
                Interface {
                    name: "eth0".into(),
                    index: 2,
                    mac: Some([2, 0, 0, 0, 0, 0xa1]),
                    flags: 1,
                    oper_up: true,
                    enslaved: false,
                },
            )]),
            &[view("a", "198.18.200.1"), view("b", "198.18.200.2")]
                .into_iter()
                .map(|v| (v.key.clone(), std::sync::Arc::new(v)))
                .collect(),
        );
        assert_eq!((r.speakers_known, r.speakers_heard), (3, 2));
        assert_eq!(r.macs["eth0"], "02:00:00:00:00:a1");
        let a = &r.services[0];
        assert_eq!(a.owner.as_deref(), Some("node1"));
        assert_eq!(a.takeover, ["node1", "node3"]);
        assert_eq!(a.interfaces, ["eth0"]);
        let b = &r.services[1];
        assert_eq!(b.owner, None);
        assert_eq!(b.unannounced.as_deref(), Some("no-serving-endpoints"));
        assert_eq!(b.ips[0].to_string(), "198.18.200.2");
    }

    #[test]
    fn bgp_says_what_goes_to_each_peer_and_for_whom() {
        let mut config = Config::default();
        let mut peer = ferrolb_testkit::model::peer("router", "198.18.0.254").build();
        config.peers.insert("router".into(), peer.clone());
        peer.name = "down".into();
        peer.target = PeerTarget::Interface("eth1".into());
        config.peers.insert("down".into(), peer);
        let prefix: IpNet = "198.18.200.0/24".parse().unwrap();
        let mut plan = BgpPlan::default();
        plan.peers.insert(
            "router".into(),
            PeerPlan {
                routes: [(
                    prefix,
                    RouteAttributes {
                        local_pref: Some(50),
                        communities: [Community(64500 << 16 | 7)].into(),
                        large_communities: BTreeSet::new(),
                    },
                )]
                .into(),
            },
        );
        plan.peers.insert("down".into(), PeerPlan::default());
        for s in ["a", "b"] {
            plan.services
                .insert(ServiceKey::new("web", s), ["router".to_string()].into());
        }
        let not_started = BTreeMap::from([("down".to_string(), "eth1 missing".to_string())]);
        let views = [view("a", "198.18.200.1"), view("b", "198.18.200.2")];
        let peers = bgp_peers(&config, &plan, &not_started, |key| {
            views.iter().find(|v| v.key == *key)
        });
        let down = &peers[0];
        assert_eq!(
            (down.name.as_str(), down.address.as_str()),
            ("down", "interface eth1")
        );
        assert_eq!(down.state, "NotStarted");
        assert_eq!(down.not_started.as_deref(), Some("eth1 missing"));
        let router = &peers[1];
        assert_eq!(router.address, "198.18.0.254");
        let route = &router.routes[0];
        assert_eq!(route.prefix, "198.18.200.0/24");
        assert_eq!(route.local_pref, Some(50));
        assert_eq!(route.communities, ["64500:7"]);
        assert_eq!(route.services, ["web/a", "web/b"]);
    }
}
