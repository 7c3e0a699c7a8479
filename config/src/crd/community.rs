use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::schema;

/// Named BGP community values that BGPAdvertisements can refer to by name.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "metallb.io",
    version = "v1beta1",
    kind = "Community",
    namespaced
)]
#[serde(rename_all = "camelCase")]
pub struct CommunitySpec {
    /// The aliases.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(validation = kube::core::Rule::new("self.all(c, self.exists_one(d, d.name == c.name))").message("each alias name may appear only once"))]
    #[schemars(length(max = 1024))]
    pub communities: Vec<CommunityAlias>,
}

/// One alias: a name and the community value it stands for.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CommunityAlias {
    /// The alias.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// `a:b` or `large:a:b:c`.
    #[schemars(schema_with = "schema::community_value")]
    pub value: String,
}
