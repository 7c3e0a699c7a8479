//! The speakers' gossip key Secret, created by the controller when the chart does not render it
//! (`speaker.gossipSecret.createdBy: controller`, for GitOps tools such as Argo CD that render the
//! chart with `helm template` on every sync: a key generated in the template would change each
//! time, and speakers restarted after a sync would refuse the others' heartbeats).
//!
//! Created once and never changed: a create that finds the Secret (409 Conflict) leaves it as it
//! is, so the key survives restarts, upgrades and every other replica doing the same. The
//! controller may create Secrets in its namespace but not read them: it never sees the key
//! after creating it. MetalLB's controller creates its memberlist Secret the same way.

use std::collections::BTreeMap;
use std::io::Read;
use std::time::Duration;

use anyhow::Context;
use ferrolb_runtime::owner::{Owner, OwnerCell};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};

/// How long the Secret waits for its owner to be learnt before it is created without one.
const OWNER_WAIT: Duration = Duration::from_secs(15);

/// Random bytes in a key: 256 bits, written as 64 hexadecimal characters.
const KEY_BYTES: usize = 32;

/// A new random key, as the speakers read it from the Secret's `secretkey`.
pub fn new_key() -> anyhow::Result<String> {
    let mut bytes = [0u8; KEY_BYTES];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("reading /dev/urandom for the gossip key")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The Secret `name` with a new key, owned by `owner` (the controller's ServiceAccount).
pub fn secret(name: &str, namespace: &str, key: String, owner: Option<&Owner>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            owner_references: owner.map(|o| vec![o.reference()]),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                "ferrolb-controller".to_string(),
            )])),
            ..Default::default()
        },
        type_: Some("Opaque".to_string()),
        string_data: Some(BTreeMap::from([("secretkey".to_string(), key)])),
        ..Default::default()
    }
}

/// Creates the Secret in the background, once: with its owner if that is learnt soon
/// (`learning`: the owner is being learnt), since speakers of a first install wait for the
/// Secret.
pub fn spawn(
    client: kube::Client,
    namespace: String,
    name: String,
    owner: OwnerCell,
    learning: bool,
) {
    tokio::spawn(async move {
        if learning {
            let _ = tokio::time::timeout(OWNER_WAIT, owner.settled()).await;
        }
        ensure(client, namespace, name, owner.get()).await;
    });
}

/// Creates the Secret unless it exists; retries every 5 s until the API server has answered
/// either way (the speakers wait for it to start). An existing Secret keeps its owner, if any.
/// Where setting an owner is refused (OwnerReferencesPermissionEnforcement asks for `delete`
/// on the Secret, which the controller does not have), the Secret is created without one.
pub async fn ensure(client: kube::Client, namespace: String, name: String, owner: Option<Owner>) {
    let api: Api<Secret> = Api::namespaced(client, &namespace);
    let mut owner = owner;
    loop {
        let attempt = async {
            let key = new_key()?;
            match api
                .create(
                    &PostParams::default(),
                    &secret(&name, &namespace, key, owner.as_ref()),
                )
                .await
            {
                Ok(_) => {
                    tracing::info!(secret = %name, "created the speakers' gossip key Secret");
                    Ok(())
                }
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 403 && owner.is_some() => {
                    tracing::warn!(secret = %name, error = %e, "creating the gossip key Secret with an owner was refused: creating it without one (it stays after uninstall)");
                    owner = None;
                    Err(anyhow::anyhow!("owner refused"))
                }
                Err(e) => Err(anyhow::Error::new(e).context(format!(
                    "creating the speakers' gossip key Secret {namespace}/{name}"
                ))),
            }
        };
        match attempt.await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(error = format!("{e:#}"), "retrying in 5 s");
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn keys_are_long_random_and_different() {
        let a = new_key().unwrap();
        let b = new_key().unwrap();
        assert_eq!(a.len(), 2 * KEY_BYTES);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        let s = secret("ferrolb-memberlist", "metallb-system", a.clone(), None);
        assert_eq!(s.string_data.unwrap()["secretkey"], a);
        assert_eq!(s.metadata.namespace.as_deref(), Some("metallb-system"));
        assert_eq!(s.metadata.owner_references, None);
        let account = Owner::service_account("ferrolb-controller", "uid-7");
        let s = secret("ferrolb-memberlist", "metallb-system", a, Some(&account));
        assert_eq!(s.metadata.owner_references, Some(vec![account.reference()]));
    }
}
