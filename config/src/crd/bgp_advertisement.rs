use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::LabelSelector;
use super::schema;

/// Advertises the IPs of some pools over BGP from some nodes to some peers.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "metallb.io",
    version = "v1beta1",
    kind = "BGPAdvertisement",
    namespaced,
    printcolumn = r#"{"name":"IPAddressPools","type":"string","jsonPath":".spec.ipAddressPools"}"#,
    printcolumn = r#"{"name":"IPAddressPool Selectors","type":"string","jsonPath":".spec.ipAddressPoolSelectors","priority":10}"#,
    printcolumn = r#"{"name":"Peers","type":"string","jsonPath":".spec.peers"}"#,
    printcolumn = r#"{"name":"Node Selectors","type":"string","jsonPath":".spec.nodeSelectors","priority":10}"#
)]
#[x_kube(validation = kube::core::Rule::new(
    "!has(self.serviceSelectors) || size(self.serviceSelectors) == 0 || ((!has(self.aggregationLength) || self.aggregationLength == 32) && (!has(self.aggregationLengthV6) || self.aggregationLengthV6 == 128))"
).message("serviceSelectors cannot be combined with an aggregationLength other than 32 / aggregationLengthV6 other than 128"))]
#[serde(rename_all = "camelCase")]
pub struct BGPAdvertisementSpec {
    /// Prefix length IPv4 routes are aggregated to. Default 32 (one route per IP).
    #[serde(default = "default_v4_len")]
    #[schemars(range(min = 0, max = 32))]
    pub aggregation_length: i32,
    /// Prefix length IPv6 routes are aggregated to. Default 128.
    #[serde(default = "default_v6_len", rename = "aggregationLengthV6")]
    #[schemars(range(min = 0, max = 128))]
    pub aggregation_length_v6: i32,
    /// BGP LOCAL_PREF attribute (iBGP only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_pref: Option<u32>,
    /// Communities: `a:b`, `large:a:b:c`, or the name of an alias from a Community object.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::community_refs")]
    pub communities: Vec<String>,
    /// Pools by name. With neither this nor `ipAddressPoolSelectors`, every pool.
    #[serde(
        default,
        rename = "ipAddressPools",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(schema_with = "schema::name_set")]
    pub ip_address_pools: Vec<String>,
    /// Pools by label.
    #[serde(
        default,
        rename = "ipAddressPoolSelectors",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub ip_address_pool_selectors: Vec<LabelSelector>,
    /// Nodes that advertise. Empty: every node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_selectors: Vec<LabelSelector>,
    /// BGPPeer names to advertise to. Empty: every peer of the node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::name_set")]
    pub peers: Vec<String>,
    /// Services this advertisement applies to. Empty: every Service.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_selectors: Vec<LabelSelector>,
}

impl Default for BGPAdvertisementSpec {
    fn default() -> Self {
        Self {
            aggregation_length: default_v4_len(),
            aggregation_length_v6: default_v6_len(),
            local_pref: None,
            communities: Vec::new(),
            ip_address_pools: Vec::new(),
            ip_address_pool_selectors: Vec::new(),
            node_selectors: Vec::new(),
            peers: Vec::new(),
            service_selectors: Vec::new(),
        }
    }
}

fn default_v4_len() -> i32 {
    32
}

fn default_v6_len() -> i32 {
    128
}
