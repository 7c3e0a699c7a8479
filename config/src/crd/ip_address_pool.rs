use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::LabelSelector;
use super::schema;

/// A pool of addresses the controller may give to LoadBalancer Services.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "metallb.io",
    version = "v1beta1",
    kind = "IPAddressPool",
    namespaced,
    status = "IPAddressPoolStatus",
    printcolumn = r#"{"name":"Auto Assign","type":"boolean","jsonPath":".spec.autoAssign"}"#,
    printcolumn = r#"{"name":"Avoid Buggy IPs","type":"boolean","jsonPath":".spec.avoidBuggyIPs"}"#,
    printcolumn = r#"{"name":"Addresses","type":"string","jsonPath":".spec.addresses"}"#,
    printcolumn = r#"{"name":"IPv4 Used","type":"integer","jsonPath":".status.assignedIPv4","priority":1}"#,
    printcolumn = r#"{"name":"IPv4 Free","type":"integer","jsonPath":".status.availableIPv4","priority":1}"#,
    printcolumn = r#"{"name":"IPv6 Used","type":"integer","jsonPath":".status.assignedIPv6","priority":1}"#,
    printcolumn = r#"{"name":"IPv6 Free","type":"integer","jsonPath":".status.availableIPv6","priority":1}"#
)]
#[serde(rename_all = "camelCase")]
pub struct IPAddressPoolSpec {
    /// CIDRs or `first-last` ranges, IPv4 or IPv6.
    #[schemars(schema_with = "schema::pool_addresses")]
    pub addresses: Vec<String>,
    /// Whether Services get addresses from this pool without asking for it. Default true.
    #[serde(default = "default_true")]
    pub auto_assign: bool,
    /// Skip IPv4 addresses ending in .0 or .255, which some buggy devices drop.
    #[serde(default, rename = "avoidBuggyIPs")]
    pub avoid_buggy_ips: bool,
    /// Which Services may use the pool, and with what priority.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_allocation: Option<ServiceAllocation>,
}

fn default_true() -> bool {
    true
}

/// Restricts a pool to some Services and orders pools by priority.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ServiceAllocation {
    /// Lower numbers are tried first; 0 (unset) comes after every positive priority.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub priority: Option<i32>,
    /// Namespaces whose Services may use the pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::name_set")]
    pub namespaces: Vec<String>,
    /// Label selectors of namespaces whose Services may use the pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespace_selectors: Vec<LabelSelector>,
    /// Label selectors of Services that may use the pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_selectors: Vec<LabelSelector>,
}

/// Usage counters of a pool, written by the controller.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct IPAddressPoolStatus {
    /// IPv4 addresses held by Services.
    #[serde(default, rename = "assignedIPv4")]
    pub assigned_ipv4: i64,
    /// IPv6 addresses held by Services (saturates at i64::MAX).
    #[serde(default, rename = "assignedIPv6")]
    pub assigned_ipv6: i64,
    /// IPv4 addresses still free.
    #[serde(default, rename = "availableIPv4")]
    pub available_ipv4: i64,
    /// IPv6 addresses still free (saturates at i64::MAX).
    #[serde(default, rename = "availableIPv6")]
    pub available_ipv6: i64,
}
