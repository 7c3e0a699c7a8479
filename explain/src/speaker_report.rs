//! What a speaker says about itself, live: the JSON document its read-only endpoint
//! ([`PATH`], on the metrics port) serves and `kubectl ferrolb explain` reads through the API
//! server's proxy to the speaker's Pod. The speaker writes it, the CLI reads it; both use these
//! types, so they cannot drift apart. Additions keep the [`SCHEMA`]; anything else bumps it.
//!
//! It holds what the API does not: whether this speaker hears a quorum of the others (layer 2
//! ownership needs it), which node owns each layer 2 IP as this speaker computes it and who
//! would take over in what order, and each BGP session's state with the routes and attributes
//! sent on it.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// The version of the document.
pub const SCHEMA: &str = "speaker.explain.ferrolb.io/v1alpha1";

/// Where the speaker serves it (HTTP GET, `application/json`).
pub const PATH: &str = "/explain/v1alpha1";

/// The header that carries the caller's credentials, `Bearer <token>`, when the report is read
/// through the API server's proxy: the API server takes `Authorization` for itself and does not
/// pass it on. The speaker also accepts `Authorization: Bearer` from a direct caller; either way
/// it answers only callers allowed `get` on its Pod's `pods/proxy` (docs/explain.md).
pub const TOKEN_HEADER: &str = "x-ferrolb-authorization";

/// One speaker's report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpeakerReport {
    /// [`SCHEMA`].
    pub schema: String,
    /// The speaker's node.
    pub node: String,
    /// Whether the speaker has planned at least once (its caches are synced); until then the
    /// rest is empty.
    pub planned: bool,
    /// The node as the speaker sees it.
    pub node_state: NodeState,
    /// Layer 2.
    pub layer2: Layer2Report,
    /// BGP.
    pub bgp: BgpReport,
}

/// Whether the node may attract traffic at all.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeState {
    /// The Node object exists.
    pub known: bool,
    /// It carries `node.kubernetes.io/exclude-from-external-load-balancers`.
    pub excluded: bool,
    /// Its condition `NetworkUnavailable` is `True`.
    pub network_unavailable: bool,
}

/// Layer 2, as this speaker sees the cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Layer2Report {
    /// This node may own layer 2 IPs now (it hears, and is heard by, a majority of the known
    /// speakers, and is not held back by flap damping).
    pub may_own: bool,
    /// The quorum rule's verdict alone.
    pub quorum: bool,
    /// Speakers known (presence Leases).
    pub speakers_known: usize,
    /// Speakers whose heartbeats it hears.
    pub speakers_heard: usize,
    /// Held back after a quorum loss (flap damping).
    pub held_back: bool,
    /// The speakers it counts as candidates for ownership, this one included when it may own.
    pub members: Vec<String>,
    /// This node's interfaces usable for ARP/NDP.
    pub interfaces: Vec<String>,
    /// Their MAC addresses (the one clients learn for an IP this node owns), by interface.
    #[serde(default)]
    pub macs: std::collections::BTreeMap<String, String>,
    /// Every Service in layer 2 mode.
    pub services: Vec<Layer2Service>,
}

/// One layer 2 Service.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Layer2Service {
    /// `namespace/name`.
    pub service: String,
    /// Its IPs.
    pub ips: Vec<IpAddr>,
    /// The owner node, when announced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Why nobody announces it (`no-serving-endpoints`, `no-eligible-node`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unannounced: Option<String>,
    /// The nodes that may own it, in the order they would: the owner first, then who takes
    /// over if it goes.
    #[serde(default)]
    pub takeover: Vec<String>,
    /// When this node owns it: the interfaces it answers on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<String>,
}

/// BGP on this node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BgpReport {
    /// Every BGPPeer selected for this node.
    pub peers: Vec<PeerReport>,
}

/// One BGP session.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PeerReport {
    /// BGPPeer name.
    pub name: String,
    /// The peer's address, or `interface IF` for an unnumbered peer (with its link-local
    /// address once found).
    pub address: String,
    /// The session's FSM state (`Idle`, `Connect`, `Active`, `OpenSent`, `OpenConfirm`,
    /// `Established`), or `NotStarted`.
    pub state: String,
    /// Why the session is not started, when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_started: Option<String>,
    /// The last error of the session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Prefixes the peer holds from us.
    pub announced: usize,
    /// UPDATE messages sent since the session task started.
    pub updates_sent: u64,
    /// What is advertised to this peer.
    pub routes: Vec<RouteReport>,
}

impl PeerReport {
    /// The session is up.
    pub fn established(&self) -> bool {
        self.state == "Established"
    }
}

/// One prefix advertised to a peer, with its attributes and the Services behind it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteReport {
    /// The prefix (the Service IP, or its aggregate).
    pub prefix: String,
    /// LOCAL_PREF (iBGP only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_pref: Option<u32>,
    /// Standard communities, `AS:value`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub communities: Vec<String>,
    /// Large communities, `global:local1:local2`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub large_communities: Vec<String>,
    /// The Services (`namespace/name`) whose IPs the prefix covers.
    pub services: Vec<String>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// The document keeps its field names: a change breaks older CLIs reading newer
    /// speakers (and the other way round).
    #[test]
    fn the_document_reads_back_and_keeps_its_names() {
        let r = SpeakerReport {
            schema: SCHEMA.into(),
            node: "node1".into(),
            planned: true,
            layer2: Layer2Report {
                may_own: true,
                services: vec![Layer2Service {
                    service: "web/web".into(),
                    ips: vec!["198.18.200.0".parse().unwrap()],
                    owner: Some("node1".into()),
                    takeover: vec!["node1".into(), "node3".into()],
                    interfaces: vec!["eth0".into()],
                    ..Default::default()
                }],
                ..Default::default()
            },
            bgp: BgpReport {
                peers: vec![PeerReport {
                    name: "router".into(),
                    address: "198.18.0.254".into(),
                    state: "Established".into(),
                    routes: vec![RouteReport {
                        prefix: "198.18.200.0/32".into(),
                        local_pref: Some(100),
                        communities: vec!["64500:1".into()],
                        services: vec!["web/web".into()],
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
            },
            ..Default::default()
        };
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["layer2"]["mayOwn"], true);
        assert_eq!(json["layer2"]["services"][0]["takeover"][1], "node3");
        assert_eq!(json["bgp"]["peers"][0]["routes"][0]["localPref"], 100);
        assert_eq!(json["nodeState"]["networkUnavailable"], false);
        let back: SpeakerReport = serde_json::from_value(json).unwrap();
        assert_eq!(back, r);
        assert!(back.bgp.peers[0].established());
    }
}
