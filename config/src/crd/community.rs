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
    /// The aliases. A list map keyed by `name`: the API server itself refuses a name twice.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "alias_list")]
    pub communities: Vec<CommunityAlias>,
}

fn alias_list(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = generator.subschema_for::<Vec<CommunityAlias>>();
    schema.insert("x-kubernetes-list-type".into(), "map".into());
    schema.insert(
        "x-kubernetes-list-map-keys".into(),
        serde_json::json!(["name"]),
    );
    schema.insert("maxItems".into(), 256.into());
    schema
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
