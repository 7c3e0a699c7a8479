//! Custom resource types of the `metallb.io` API group, shaped exactly like MetalLB's so that
//! existing manifests apply unchanged.
//!
//! Per-object rules live in the schema (ranges, patterns, list types) and in CEL rules
//! (`x-kubernetes-validations`), so the API server rejects bad objects without any webhook.
//! Rules that span objects are checked by [`crate::validate`].

mod bfd_profile;
mod bgp_advertisement;
mod bgp_peer;
mod community;
mod ip_address_pool;
mod l2_advertisement;
mod schema;
mod status;

pub use bfd_profile::{BFDProfile, BFDProfileSpec};
pub use bgp_advertisement::{BGPAdvertisement, BGPAdvertisementSpec};
pub use bgp_peer::{BGPPeer, BGPPeerSpec, DynamicAsn, SecretReference, v1beta1};
pub use community::{Community, CommunityAlias, CommunitySpec};
pub use ip_address_pool::{
    IPAddressPool, IPAddressPoolSpec, IPAddressPoolStatus, ServiceAllocation,
};
pub use l2_advertisement::{L2Advertisement, L2AdvertisementSpec};
pub use status::{
    ConfigurationResult, ConfigurationState, ConfigurationStateSpec, ConfigurationStateStatus,
    InterfaceInfo, ServiceBGPStatus, ServiceBGPStatusSpec, ServiceBGPStatusStatus, ServiceL2Status,
    ServiceL2StatusSpec, ServiceL2StatusStatus,
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSON,
};
use kube::CustomResourceExt;

/// The API group shared with MetalLB.
pub const GROUP: &str = "metallb.io";

/// Label selector type used by every selector field (same JSON shape as MetalLB's).
pub type LabelSelector = k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Kinds whose `spec` may be left out, as in MetalLB (`json:"spec,omitempty"`): MetalLB's own
/// quickstart applies an L2Advertisement with metadata only. Every field of these specs is
/// optional, so a missing `spec` means `spec: {}`, which is what the API server stores for it.
pub const KINDS_WITH_OPTIONAL_SPEC: [&str; 4] = [
    "BFDProfile",
    "BGPAdvertisement",
    "Community",
    "L2Advertisement",
];

/// Lets the API server accept an object without `spec` and store it with `spec: {}` (and so with
/// the spec's own defaults), so that readers never see an object without one. kube's derive
/// always makes `spec` required, hence this edit of the generated schema.
fn make_spec_optional(crd: &mut CustomResourceDefinition) {
    for version in &mut crd.spec.versions {
        let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        else {
            continue;
        };
        if let Some(required) = schema.required.as_mut() {
            required.retain(|field| field != "spec");
        }
        if schema.required.as_ref().is_some_and(Vec::is_empty) {
            schema.required = None;
        }
        if let Some(spec) = schema
            .properties
            .as_mut()
            .and_then(|properties| properties.get_mut("spec"))
        {
            spec.default = Some(JSON(serde_json::json!({})));
        }
    }
}

/// Every CustomResourceDefinition ferrolb ships, in a stable order.
///
/// BGPPeer carries two versions: v1beta2 (stored) and v1beta1 (served). v1beta1's fields are a
/// subset of v1beta2's with the same names and shapes, so the API server converts between them
/// with the `None` strategy and no conversion webhook is needed.
pub fn crds() -> Result<Vec<CustomResourceDefinition>, kube::core::crd::MergeError> {
    let bgp_peer =
        kube::core::crd::merge_crds(vec![BGPPeer::crd(), v1beta1::BGPPeer::crd()], "v1beta2")?;
    let mut all = vec![
        BFDProfile::crd(),
        BGPAdvertisement::crd(),
        bgp_peer,
        Community::crd(),
        ConfigurationState::crd(),
        IPAddressPool::crd(),
        L2Advertisement::crd(),
        ServiceBGPStatus::crd(),
        ServiceL2Status::crd(),
    ];
    for crd in &mut all {
        if KINDS_WITH_OPTIONAL_SPEC.contains(&crd.spec.names.kind.as_str()) {
            make_spec_optional(crd);
        }
    }
    Ok(all)
}

/// Errors while rendering the CRD manifests.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// Two versions of one CRD could not be merged.
    #[error("merging CRD versions: {0}")]
    Merge(#[from] kube::core::crd::MergeError),
    /// A CRD could not be written as YAML.
    #[error("rendering {name} as YAML: {message}")]
    Yaml {
        /// The CRD's name.
        name: String,
        /// What the YAML writer said.
        message: String,
    },
}

/// The CRD manifests as committed in `charts/ferrolb/crds/`: (file name, YAML text).
pub fn crd_manifests() -> Result<Vec<(String, String)>, ManifestError> {
    crds()?
        .into_iter()
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let yaml = serde_saphyr::to_string(&crd)
                .map_err(|e| ManifestError::Yaml { name: name.clone(), message: e.to_string() })?;
            let (plural, group) = name.split_once('.').unwrap_or((name.as_str(), GROUP));
            let header = "# Generated from the Rust types in config/src/crd by\n# `UPDATE_CRDS=1 cargo test -p ferrolb-config --test crds`. Do not edit.\n";
            Ok((format!("{group}_{plural}.yaml"), format!("{header}---\n{yaml}")))
        })
        .collect()
}
