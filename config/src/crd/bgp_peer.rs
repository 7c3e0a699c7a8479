use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::LabelSelector;
use super::schema;

/// A BGP session that speakers on the selected nodes open (the stored version, v1beta2).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "metallb.io",
    version = "v1beta2",
    kind = "BGPPeer",
    namespaced,
    printcolumn = r#"{"name":"Address","type":"string","jsonPath":".spec.peerAddress"}"#,
    printcolumn = r#"{"name":"Interface","type":"string","jsonPath":".spec.interface","priority":10}"#,
    printcolumn = r#"{"name":"ASN","type":"integer","jsonPath":".spec.peerASN"}"#,
    printcolumn = r#"{"name":"Dynamic ASN","type":"string","jsonPath":".spec.dynamicASN","priority":10}"#,
    printcolumn = r#"{"name":"BFD Profile","type":"string","jsonPath":".spec.bfdProfile"}"#,
    printcolumn = r#"{"name":"Multi Hops","type":"boolean","jsonPath":".spec.ebgpMultiHop"}"#
)]
#[x_kube(
    validation = kube::core::Rule::new("has(self.peerASN) != has(self.dynamicASN)").message("exactly one of peerASN and dynamicASN must be set"),
    validation = kube::core::Rule::new("has(self.peerAddress) != has(self.interface)").message("exactly one of peerAddress and interface must be set"),
    validation = kube::core::Rule::new("!has(self.password) || !has(self.passwordSecret)").message("password and passwordSecret cannot both be set"),
    validation = kube::core::Rule::new("!has(self.ebgpMultiHop) || !self.ebgpMultiHop || !((has(self.peerASN) && self.peerASN == self.myASN) || (has(self.dynamicASN) && self.dynamicASN == 'internal'))").message("ebgpMultiHop is for eBGP sessions; this session is iBGP (peer ASN equals myASN)"),
    validation = kube::core::Rule::new("!has(self.holdTime) || duration(self.holdTime) == duration('0s') || duration(self.holdTime) >= duration('3s')").message("holdTime must be 0 or at least 3s"),
    validation = kube::core::Rule::new("!has(self.holdTime) || !has(self.keepaliveTime) || duration(self.keepaliveTime) <= duration(self.holdTime)").message("keepaliveTime must not exceed holdTime"),
    validation = kube::core::Rule::new("!has(self.connectTime) || (duration(self.connectTime) >= duration('1s') && duration(self.connectTime) <= duration('65535s'))").message("connectTime must be between 1s and 65535s"),
)]
#[serde(rename_all = "camelCase")]
pub struct BGPPeerSpec {
    /// Our AS number on this session.
    #[serde(rename = "myASN")]
    #[schemars(range(min = 1))]
    pub my_asn: u32,
    /// The peer's AS number. Exclusive with `dynamicASN`.
    #[serde(default, rename = "peerASN", skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub peer_asn: Option<u32>,
    /// Accept the peer's AS from its OPEN: `internal` (same as ours) or `external` (different).
    #[serde(
        default,
        rename = "dynamicASN",
        skip_serializing_if = "Option::is_none"
    )]
    pub dynamic_asn: Option<DynamicAsn>,
    /// The peer's address. Exclusive with `interface`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_ip")]
    pub peer_address: Option<String>,
    /// Open an unnumbered session over this interface (IPv6 link-local). Exclusive with `peerAddress`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 15))]
    pub interface: Option<String>,
    /// Local address to open the session from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_ip")]
    pub source_address: Option<String>,
    /// The peer's TCP port. Default 179.
    #[serde(default = "default_port")]
    #[schemars(schema_with = "port_schema")]
    pub peer_port: u16,
    /// Proposed hold time (Go duration); 0 or at least 3s. Default 90s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_duration")]
    pub hold_time: Option<String>,
    /// Keepalive interval (Go duration); at most the hold time. Default hold/3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_duration")]
    pub keepalive_time: Option<String>,
    /// Time between connection attempts (Go duration), 1s–65535s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_duration")]
    pub connect_time: Option<String>,
    /// BGP router ID (dotted IPv4). Default: the node's IPv4 address.
    #[serde(default, rename = "routerID", skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_router_id")]
    pub router_id: Option<String>,
    /// Nodes that open this session. Empty: every node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_selectors: Vec<LabelSelector>,
    /// TCP MD5 password, in clear. Prefer `passwordSecret`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 80))]
    pub password: Option<String>,
    /// A `kubernetes.io/basic-auth` Secret holding the TCP MD5 password under key `password`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret: Option<SecretReference>,
    /// Name of a BFDProfile to run BFD on this session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub bfd_profile: Option<String>,
    /// The eBGP peer is more than one hop away.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ebgp_multi_hop: Option<bool>,
    /// VRF to open the session in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 15))]
    pub vrf: Option<String>,
    /// Advertise the BGP graceful restart capability. Immutable.
    #[serde(default)]
    #[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("enableGracefulRestart cannot be changed after creation"))]
    pub enable_graceful_restart: bool,
    /// Local AS to present to this peer instead of `myASN` (local-as).
    #[serde(default, rename = "localASN", skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub local_asn: Option<u32>,
    /// Advertise IPv4 and IPv6 prefixes over this one session (multiprotocol).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dual_stack_address_family: Option<bool>,
    /// Deprecated: use separate sessions per family. Kept so old manifests apply.
    #[serde(default, rename = "disableMP", skip_serializing_if = "Option::is_none")]
    pub disable_mp: Option<bool>,
}

fn default_port() -> u16 {
    179
}

/// `peerPort`: an integer 1–16384 (MetalLB's range), default 179. Written by hand because the
/// derived schema says `format: uint16`, which the API server does not know.
fn port_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "integer", "format": "int32", "minimum": 1, "maximum": 16384, "default": 179})
}

fn optional_ip(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schema::ip_address(generator)
}

fn optional_duration(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schema::duration(generator)
}

fn optional_router_id(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schema::router_id(generator)
}

/// How the peer's AS number is learned when `peerASN` is not given.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DynamicAsn {
    /// The peer is in our AS (iBGP).
    Internal,
    /// The peer is in another AS (eBGP).
    External,
}

/// Reference to a Secret by name (and namespace, which must be the ferrolb namespace).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SecretReference {
    /// Name of the Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Namespace of the Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// The older BGPPeer version, still served so that old manifests apply.
pub mod v1beta1 {
    use kube::{CustomResource, KubeSchema};
    use serde::{Deserialize, Serialize};

    use super::super::LabelSelector;
    use super::{default_port, optional_duration, optional_ip, optional_router_id, port_schema};

    /// A BGP session (v1beta1: a subset of v1beta2's fields, same names and shapes).
    #[derive(
        CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq,
    )]
    #[kube(
        group = "metallb.io",
        version = "v1beta1",
        kind = "BGPPeer",
        namespaced,
        printcolumn = r#"{"name":"Address","type":"string","jsonPath":".spec.peerAddress"}"#,
        printcolumn = r#"{"name":"ASN","type":"integer","jsonPath":".spec.peerASN"}"#,
        printcolumn = r#"{"name":"BFD Profile","type":"string","jsonPath":".spec.bfdProfile"}"#,
        printcolumn = r#"{"name":"Multi Hops","type":"boolean","jsonPath":".spec.ebgpMultiHop"}"#
    )]
    #[serde(rename_all = "camelCase")]
    pub struct BGPPeerSpec {
        /// Our AS number on this session.
        #[serde(rename = "myASN")]
        #[schemars(range(min = 1))]
        pub my_asn: u32,
        /// The peer's AS number.
        #[serde(rename = "peerASN")]
        #[schemars(range(min = 1))]
        pub peer_asn: u32,
        /// The peer's address.
        #[schemars(schema_with = "optional_ip")]
        pub peer_address: String,
        /// Local address to open the session from.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(schema_with = "optional_ip")]
        pub source_address: Option<String>,
        /// The peer's TCP port. Default 179.
        #[serde(default = "default_port")]
        #[schemars(schema_with = "port_schema")]
        pub peer_port: u16,
        /// Proposed hold time (Go duration).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(schema_with = "optional_duration")]
        pub hold_time: Option<String>,
        /// Keepalive interval (Go duration).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(schema_with = "optional_duration")]
        pub keepalive_time: Option<String>,
        /// BGP router ID.
        #[serde(default, rename = "routerID", skip_serializing_if = "Option::is_none")]
        #[schemars(schema_with = "optional_router_id")]
        pub router_id: Option<String>,
        /// Nodes that open this session.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub node_selectors: Vec<LabelSelector>,
        /// TCP MD5 password.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub password: Option<String>,
        /// Name of a BFDProfile.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub bfd_profile: Option<String>,
        /// The eBGP peer is more than one hop away.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub ebgp_multi_hop: Option<bool>,
    }
}
