//! Reading multi-document YAML manifests (as `kubectl apply -f` takes them) into [`Objects`].
//!
//! Documents of other API groups are skipped: a manifest may hold Namespaces, Deployments and
//! Services next to the ferrolb objects. BGPPeer v1beta1 documents are converted to v1beta2,
//! whose fields are a superset with the same names.

use std::fmt;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::crd::GROUP;
use crate::validate::Objects;

/// A document that could not be read as a ferrolb object: `Kind namespace/name: field: message`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestError {
    /// File or other source the document came from.
    pub source: String,
    /// 1-based index of the document in the source.
    pub document: usize,
    /// `kind` of the document, if it has one.
    pub kind: String,
    /// Namespace of the object, if known.
    pub namespace: String,
    /// Name of the object, if known.
    pub name: String,
    /// Field at fault.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.kind.is_empty() && self.name.is_empty() {
            write!(
                f,
                "{} document {}: {}: {}",
                self.source, self.document, self.field, self.message
            )
        } else {
            write!(
                f,
                "{} {}/{}: {}: {}",
                self.kind, self.namespace, self.name, self.field, self.message
            )
        }
    }
}

impl std::error::Error for ManifestError {}

fn text_at<'a>(value: &'a Value, path: &[&str]) -> &'a str {
    path.iter()
        .try_fold(value, |v, key| v.get(key))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// Adds the ferrolb objects of a YAML text to `objects`; returns the documents that could not be
/// read. Objects without a namespace land in `objects.namespace`, as with `kubectl apply -n`.
pub fn read_manifests(text: &str, source: &str, objects: &mut Objects) -> Vec<ManifestError> {
    let documents: Vec<Value> = match serde_saphyr::from_multiple(text) {
        Ok(docs) => docs,
        Err(e) => {
            return vec![ManifestError {
                source: source.into(),
                document: 0,
                kind: String::new(),
                namespace: String::new(),
                name: String::new(),
                field: "yaml".into(),
                message: e.to_string(),
            }];
        }
    };
    let mut errors = Vec::new();
    for (index, mut doc) in documents.into_iter().enumerate() {
        if doc.is_null() {
            continue;
        }
        let api_version = text_at(&doc, &["apiVersion"]).to_string();
        let Some((group, version)) = api_version.split_once('/') else {
            continue;
        };
        if group != GROUP {
            continue;
        }
        if let Some(meta) = doc.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.entry("namespace")
                .or_insert_with(|| Value::String(objects.namespace.clone()));
        }
        let kind = text_at(&doc, &["kind"]).to_string();
        // What the API server stores for these kinds when `spec` is left out (see the CRDs).
        if crate::crd::KINDS_WITH_OPTIONAL_SPEC.contains(&kind.as_str())
            && let Some(object) = doc.as_object_mut()
            && object.get("spec").is_none_or(Value::is_null)
        {
            object.insert("spec".into(), Value::Object(serde_json::Map::new()));
        }
        let error = |field: String, message: String| ManifestError {
            source: source.into(),
            document: index + 1,
            kind: kind.clone(),
            namespace: text_at(&doc, &["metadata", "namespace"]).into(),
            name: text_at(&doc, &["metadata", "name"]).into(),
            field,
            message,
        };
        if text_at(&doc, &["metadata", "name"]).is_empty() {
            errors.push(error(
                "metadata.name".into(),
                "every object needs a name".into(),
            ));
            continue;
        }
        let result = match (kind.as_str(), version) {
            ("IPAddressPool", "v1beta1") => parse(&doc).map(|o| objects.pools.push(o)),
            ("L2Advertisement", "v1beta1") => {
                parse(&doc).map(|o| objects.l2_advertisements.push(o))
            }
            ("BGPAdvertisement", "v1beta1") => {
                parse(&doc).map(|o| objects.bgp_advertisements.push(o))
            }
            ("BGPPeer", "v1beta2") => parse(&doc).map(|o| objects.peers.push(o)),
            ("BGPPeer", "v1beta1") => parse::<crate::crd::v1beta1::BGPPeer>(&doc).and_then(|_| {
                let mut converted = doc.clone();
                converted["apiVersion"] = Value::String(format!("{GROUP}/v1beta2"));
                parse(&converted).map(|o| objects.peers.push(o))
            }),
            ("Community", "v1beta1") => parse(&doc).map(|o| objects.communities.push(o)),
            ("BFDProfile", "v1beta1") => parse(&doc).map(|o| objects.bfd_profiles.push(o)),
            ("ServiceL2Status" | "ServiceBGPStatus" | "ConfigurationState", _) => Ok(()),
            _ => Err((
                "apiVersion".to_string(),
                format!("{api_version} {kind} is not a kind ferrolb serves"),
            )),
        };
        if let Err((field, message)) = result {
            errors.push(error(field, message));
        }
    }
    errors
}

fn parse<T: DeserializeOwned>(doc: &Value) -> Result<T, (String, String)> {
    serde_path_to_error::deserialize(doc).map_err(|e| {
        let path = e.path().to_string();
        let message = e.into_inner().to_string();
        // serde names a missing field in the message, not in the path.
        let field = match message.split('`').nth(1) {
            Some(missing) if message.starts_with("missing field") && path != "." => {
                format!("{path}.{missing}")
            }
            Some(missing) if message.starts_with("missing field") => missing.to_string(),
            _ => path,
        };
        (field, message)
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn read(text: &str) -> (Objects, Vec<String>) {
        let mut objects = Objects {
            namespace: "metallb-system".into(),
            ..Default::default()
        };
        let errors = read_manifests(text, "test.yaml", &mut objects);
        (objects, errors.iter().map(|e| e.to_string()).collect())
    }

    #[test]
    fn skips_other_groups_and_empty_documents() {
        let (objects, errors) = read(
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: metallb-system}\n---\n---\napiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: p}\nspec: {addresses: [198.18.10.0/24]}\n",
        );
        assert_eq!(errors, Vec::<String>::new());
        assert_eq!(objects.pools.len(), 1);
        assert_eq!(
            objects.pools[0].metadata.namespace.as_deref(),
            Some("metallb-system")
        );
        assert!(
            objects.pools[0].spec.auto_assign,
            "autoAssign defaults to true"
        );
    }

    #[test]
    fn type_errors_name_the_field() {
        let (_, errors) = read(
            "apiVersion: metallb.io/v1beta2\nkind: BGPPeer\nmetadata: {name: p}\nspec: {peerASN: 64501, peerAddress: 198.18.0.1}\n---\napiVersion: metallb.io/v1beta1\nkind: BFDProfile\nmetadata: {name: b}\nspec: {receiveInterval: fast}\n",
        );
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(
            errors[0].starts_with("BGPPeer metallb-system/p: spec.myASN: missing field `myASN`"),
            "{}",
            errors[0]
        );
        assert!(
            errors[1].starts_with("BFDProfile metallb-system/b: spec.receiveInterval: "),
            "{}",
            errors[1]
        );
    }

    #[test]
    fn v1beta1_peers_are_read_as_v1beta2() {
        let (objects, errors) = read(
            "apiVersion: metallb.io/v1beta1\nkind: BGPPeer\nmetadata: {name: old}\nspec: {myASN: 64500, peerASN: 64501, peerAddress: 198.18.0.1, holdTime: 90s}\n",
        );
        assert_eq!(errors, Vec::<String>::new());
        assert_eq!(objects.peers[0].spec.peer_asn, Some(64501));
        assert_eq!(objects.peers[0].spec.hold_time.as_deref(), Some("90s"));
    }

    #[test]
    fn objects_without_spec_read_as_an_empty_spec_where_metallb_allows_it() {
        // MetalLB's quickstart L2Advertisement: metadata only.
        let (objects, errors) = read(
            "apiVersion: metallb.io/v1beta1\nkind: L2Advertisement\nmetadata: {name: example, namespace: metallb-system}\n---\napiVersion: metallb.io/v1beta1\nkind: BGPAdvertisement\nmetadata: {name: b}\nspec:\n---\napiVersion: metallb.io/v1beta1\nkind: BFDProfile\nmetadata: {name: f}\n---\napiVersion: metallb.io/v1beta1\nkind: Community\nmetadata: {name: c}\n",
        );
        assert_eq!(errors, Vec::<String>::new());
        assert_eq!(objects.l2_advertisements[0].spec, Default::default());
        assert_eq!(
            objects.bgp_advertisements[0].spec.aggregation_length, 32,
            "the spec's defaults apply"
        );
        assert_eq!(objects.bfd_profiles.len(), 1);
        assert_eq!(objects.communities.len(), 1);
        // A pool without addresses means nothing: MetalLB requires its spec, and so do we.
        let (_, errors) =
            read("apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: p}\n");
        assert_eq!(
            errors,
            ["IPAddressPool metallb-system/p: spec: missing field `spec`"]
        );
    }

    #[test]
    fn unknown_kinds_of_our_group_are_reported() {
        let (_, errors) = read(
            "apiVersion: metallb.io/v1beta1\nkind: AddressPool\nmetadata: {name: legacy}\nspec: {}\n",
        );
        assert_eq!(
            errors,
            [
                "AddressPool metallb-system/legacy: apiVersion: metallb.io/v1beta1 AddressPool is not a kind ferrolb serves"
            ]
        );
    }
}
