use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Which node announces a Service in layer 2 mode; written by that node's speaker.
#[derive(
    CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq,
)]
#[kube(
    group = "metallb.io",
    version = "v1beta1",
    kind = "ServiceL2Status",
    namespaced,
    status = "ServiceL2StatusStatus",
    printcolumn = r#"{"name":"Allocated Node","type":"string","jsonPath":".status.node"}"#,
    printcolumn = r#"{"name":"Service Name","type":"string","jsonPath":".status.serviceName"}"#,
    printcolumn = r#"{"name":"Service Namespace","type":"string","jsonPath":".status.serviceNamespace"}"#
)]
pub struct ServiceL2StatusSpec {}

/// Status of a [`ServiceL2Status`].
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServiceL2StatusStatus {
    /// The announcing node.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node: String,
    /// Name of the Service.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service_name: String,
    /// Namespace of the Service.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service_namespace: String,
    /// Interfaces the IPs are announced on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<InterfaceInfo>,
}

/// An interface a Service is announced on.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct InterfaceInfo {
    /// Interface name.
    #[serde(default)]
    pub name: String,
}

/// Which peers a node advertises a Service to; one per (Service, node).
#[derive(
    CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq,
)]
#[kube(
    group = "metallb.io",
    version = "v1beta1",
    kind = "ServiceBGPStatus",
    namespaced,
    status = "ServiceBGPStatusStatus",
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".status.node"}"#,
    printcolumn = r#"{"name":"Service Name","type":"string","jsonPath":".status.serviceName"}"#,
    printcolumn = r#"{"name":"Service Namespace","type":"string","jsonPath":".status.serviceNamespace"}"#
)]
pub struct ServiceBGPStatusSpec {}

/// Status of a [`ServiceBGPStatus`].
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServiceBGPStatusStatus {
    /// The advertising node.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node: String,
    /// Name of the Service.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service_name: String,
    /// Namespace of the Service.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service_namespace: String,
    /// BGPPeer names the Service is advertised to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<String>,
}

/// Whether the configuration a component loaded is valid: `controller`, or `speaker-<node>`.
#[derive(
    CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq,
)]
#[kube(
    group = "metallb.io",
    version = "v1beta1",
    kind = "ConfigurationState",
    namespaced,
    status = "ConfigurationStateStatus",
    printcolumn = r#"{"name":"Result","type":"string","jsonPath":".status.result"}"#,
    printcolumn = r#"{"name":"Errors","type":"string","jsonPath":".status.errorSummary"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
pub struct ConfigurationStateSpec {}

/// Status of a [`ConfigurationState`].
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConfigurationStateStatus {
    /// Valid, Invalid or Unknown.
    #[serde(default)]
    pub result: ConfigurationResult,
    /// One line per error, empty when valid.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error_summary: String,
    /// Standard conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Outcome of loading a configuration.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub enum ConfigurationResult {
    /// Every object was accepted.
    Valid,
    /// Some objects were left out; see `errorSummary`.
    Invalid,
    /// Not evaluated yet.
    #[default]
    Unknown,
}
