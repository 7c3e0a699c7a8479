use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// BFD session parameters that BGPPeers refer to by name.
#[derive(
    CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq,
)]
#[kube(
    group = "metallb.io",
    version = "v1beta1",
    kind = "BFDProfile",
    namespaced,
    printcolumn = r#"{"name":"Passive Mode","type":"boolean","jsonPath":".spec.passiveMode"}"#,
    printcolumn = r#"{"name":"Transmit Interval","type":"integer","jsonPath":".spec.transmitInterval"}"#,
    printcolumn = r#"{"name":"Receive Interval","type":"integer","jsonPath":".spec.receiveInterval"}"#,
    printcolumn = r#"{"name":"Multiplier","type":"integer","jsonPath":".spec.detectMultiplier"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct BFDProfileSpec {
    /// Minimum interval between received control packets, in ms (10–60000, default 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 60000))]
    pub receive_interval: Option<u32>,
    /// Minimum interval between sent control packets, in ms (10–60000, default 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 60000))]
    pub transmit_interval: Option<u32>,
    /// Lost packets before the session is declared down (2–255, default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 2, max = 255))]
    pub detect_multiplier: Option<u32>,
    /// Minimum interval between echo packets, in ms (10–60000, default 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 60000))]
    pub echo_interval: Option<u32>,
    /// Enables echo packets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub echo_mode: Option<bool>,
    /// Wait for the peer to start the session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passive_mode: Option<bool>,
    /// Minimum TTL of incoming packets (1–254), for multi-hop sessions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 254))]
    pub minimum_ttl: Option<u32>,
}
