use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::LabelSelector;
use super::schema;

/// Announces the IPs of some pools in layer 2 mode (ARP and NDP) from some nodes.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "metallb.io",
    version = "v1beta1",
    kind = "L2Advertisement",
    namespaced,
    printcolumn = r#"{"name":"IPAddressPools","type":"string","jsonPath":".spec.ipAddressPools"}"#,
    printcolumn = r#"{"name":"IPAddressPool Selectors","type":"string","jsonPath":".spec.ipAddressPoolSelectors","priority":10}"#,
    printcolumn = r#"{"name":"Interfaces","type":"string","jsonPath":".spec.interfaces"}"#,
    printcolumn = r#"{"name":"Node Selectors","type":"string","jsonPath":".spec.nodeSelectors","priority":10}"#
)]
#[serde(rename_all = "camelCase")]
pub struct L2AdvertisementSpec {
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
    /// Nodes that may announce. Empty: every node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_selectors: Vec<LabelSelector>,
    /// Interfaces to announce from. Empty: every eligible interface.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::name_set")]
    pub interfaces: Vec<String>,
    /// Services this advertisement applies to. Empty: every Service.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_selectors: Vec<LabelSelector>,
}
