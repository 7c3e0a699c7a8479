//! Who owns the records a component writes for itself (Leases, status objects): Kubernetes'
//! garbage collector deletes them with their owner, so that `helm uninstall` leaves none behind
//! and a departed Pod's records do not linger.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

/// An owner for the objects a component writes.
#[derive(Clone, Debug, PartialEq)]
pub struct Owner(OwnerReference);

impl Owner {
    /// An object of `kind` in the core API group (`v1`).
    fn core(kind: &str, name: &str, uid: &str) -> Self {
        Owner(OwnerReference {
            api_version: "v1".into(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
            // Not the managing controller, and no blockOwnerDeletion: that would need the
            // permission to set finalizers on the owner, and nothing here must hold an owner's
            // deletion up.
            controller: None,
            block_owner_deletion: None,
        })
    }

    /// The Pod this component runs in, from the downward API (`metadata.name`,
    /// `metadata.uid`); `None` outside a pod, where either is unset or empty.
    pub fn pod(name: Option<&str>, uid: Option<&str>) -> Option<Self> {
        match (name, uid) {
            (Some(name), Some(uid)) if !name.is_empty() && !uid.is_empty() => {
                Some(Self::core("Pod", name, uid))
            }
            _ => None,
        }
    }

    /// A Node (cluster-scoped: it may own objects in any namespace).
    pub fn node(name: &str, uid: &str) -> Self {
        Self::core("Node", name, uid)
    }

    /// A ServiceAccount (owns objects in its own namespace only).
    pub fn service_account(name: &str, uid: &str) -> Self {
        Self::core("ServiceAccount", name, uid)
    }

    /// The owner reference to write into `metadata.ownerReferences`.
    pub fn reference(&self) -> OwnerReference {
        self.0.clone()
    }

    /// `metadata.ownerReferences` as JSON, for patches and server-side apply.
    pub fn references_json(&self) -> serde_json::Value {
        serde_json::json!([{
            "apiVersion": self.0.api_version,
            "kind": self.0.kind,
            "name": self.0.name,
            "uid": self.0.uid,
        }])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_owner_needs_both_name_and_uid() {
        assert_eq!(Owner::pod(None, Some("u")), None);
        assert_eq!(Owner::pod(Some("p"), None), None);
        assert_eq!(Owner::pod(Some(""), Some("u")), None);
        assert_eq!(Owner::pod(Some("p"), Some("")), None);
        let owner = Owner::pod(Some("speaker-x"), Some("1234")).map(|o| o.reference());
        assert_eq!(
            owner
                .as_ref()
                .map(|r| (r.kind.as_str(), r.name.as_str(), r.uid.as_str())),
            Some(("Pod", "speaker-x", "1234"))
        );
        assert_eq!(owner.map(|r| r.api_version), Some("v1".to_string()));
    }

    #[test]
    fn the_json_form_names_the_same_object_and_nothing_that_blocks_deletion() {
        let owner = Owner::service_account("ferrolb-controller", "abc");
        let json = owner.references_json();
        assert_eq!(
            json,
            serde_json::json!([{
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "name": "ferrolb-controller",
                "uid": "abc",
            }])
        );
        let parsed: Vec<OwnerReference> = serde_json::from_value(json).unwrap_or_default();
        assert_eq!(parsed, vec![owner.reference()]);
    }
}
