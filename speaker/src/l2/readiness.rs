//! What the speaker's `/readyz` says: ready once its caches are synced and, on a node that layer 2
//! announces from, once it is back among the nodes that may own IPs.
//!
//! Readiness paces a DaemonSet rolling update: with `maxUnavailable: 1` the next node's speaker
//! is stopped only once the previous node's new pod is ready. Were a speaker ready as soon as its
//! caches are synced, a fast roll could stop a second speaker while the first successor is still
//! listening, waiting for acknowledgements or held back: on three nodes that is two of three away,
//! the quorum lost on the remaining node, and its IPs unanswered or moved. Ready here means the
//! successor hears and is heard by a majority, is not held back, and claims IPs, so the roll never
//! takes more than one speaker out of the quorum at a time.
//!
//! A node that layer 2 does not announce from (no L2Advertisement selects it, or the cluster runs
//! BGP only) is ready once synced: its quorum plays no part, and its heartbeats may be filtered on
//! purpose.

use ferrolb_config::model::Config;
use ferrolb_config::selector::any_matches;

use crate::view::NodeView;

/// The layer 2 state of this speaker that readiness depends on, from one membership check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Layer2State {
    /// It has a usable interface and has listened for its settle time.
    pub settled: bool,
    /// It hears a majority of the known speakers and a majority hears it (the quorum rule).
    pub acts: bool,
    /// Flap damping holds it back after a loss of quorum.
    pub held: bool,
    /// It handed its IPs over: its heartbeats reach the others too late to prove it is heard.
    pub starved: bool,
    /// It claims IPs: past the claim delay, heard ready by every other candidate, with a tenure.
    pub claims: bool,
}

/// Whether some L2Advertisement selects `node` (no Node object yet counts as selected: the doubt
/// goes the way that keeps a roll waiting).
pub fn announces_here(config: &Config, node: Option<&NodeView>) -> bool {
    match node {
        None => !config.l2_advertisements.is_empty(),
        Some(node) => config
            .l2_advertisements
            .values()
            .any(|adv| any_matches(&adv.node_selectors, &node.labels)),
    }
}

/// `Ok` when ready, otherwise why not (the `/readyz` body).
pub fn readiness(synced: bool, announces: bool, l2: Layer2State) -> Result<(), &'static str> {
    if !synced {
        return Err("caches not synced");
    }
    if !announces {
        return Ok(());
    }
    if !l2.settled {
        return Err("layer 2: settling (no usable interface yet, or listening after the start)");
    }
    if !l2.acts {
        return Err(
            "layer 2: out of the quorum (this node does not hear, or is not heard by, a majority of the known speakers)",
        );
    }
    if l2.starved {
        return Err(
            "layer 2: handing over (this node's heartbeats reach the others too late to prove it is heard)",
        );
    }
    if l2.held {
        return Err("layer 2: held back by flap damping after a loss of quorum");
    }
    if !l2.claims {
        return Err("layer 2: waiting for the other speakers to hear this node ready");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::collections::BTreeMap;

    use ferrolb_config::model::L2Advertisement;
    use ferrolb_config::selector::Selector;

    use super::*;

    fn in_quorum() -> Layer2State {
        Layer2State {
            settled: true,
            acts: true,
            held: false,
            starved: false,
            claims: true,
        }
    }

    fn node(labels: &[(&str, &str)]) -> NodeView {
        NodeView {
            name: "n1".into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            network_unavailable: false,
            excluded: false,
            addresses: vec![],
        }
    }

    fn config_selecting(zone: Option<&str>) -> Config {
        let mut adv = L2Advertisement::default();
        if let Some(zone) = zone {
            adv.node_selectors = vec![Selector::from_labels([("zone", zone)])];
        }
        Config {
            l2_advertisements: BTreeMap::from([("l2".to_string(), adv)]),
            ..Config::default()
        }
    }

    #[test]
    fn ready_only_when_synced_and_claiming_where_layer2_announces() {
        assert_eq!(readiness(true, true, in_quorum()), Ok(()));
        assert_eq!(
            readiness(false, true, in_quorum()),
            Err("caches not synced")
        );
        for broken in [
            Layer2State {
                settled: false,
                ..in_quorum()
            },
            Layer2State {
                acts: false,
                ..in_quorum()
            },
            Layer2State {
                held: true,
                ..in_quorum()
            },
            Layer2State {
                starved: true,
                ..in_quorum()
            },
            Layer2State {
                claims: false,
                ..in_quorum()
            },
        ] {
            let why = readiness(true, true, broken).expect_err("not ready");
            assert!(why.starts_with("layer 2: "), "{broken:?}: {why}");
            // Where layer 2 does not announce, its quorum plays no part.
            assert_eq!(readiness(true, false, broken), Ok(()));
        }
    }

    #[test]
    fn layer2_announces_where_an_advertisement_selects_the_node() {
        let zone_a = node(&[("zone", "a")]);
        assert!(announces_here(&config_selecting(None), Some(&zone_a)));
        assert!(announces_here(&config_selecting(Some("a")), Some(&zone_a)));
        assert!(!announces_here(&config_selecting(Some("b")), Some(&zone_a)));
        assert!(!announces_here(&Config::default(), Some(&zone_a)));
        // No Node object yet: selected while any advertisement exists.
        assert!(announces_here(&config_selecting(Some("b")), None));
        assert!(!announces_here(&Config::default(), None));
    }
}
