//! The owner of the records the controller writes for itself (the leader Lease, ConfigurationState
//! `controller`, a gossip key Secret it creates): its ServiceAccount, which the release creates
//! and `helm uninstall` deletes, so the garbage collector removes them with it. They outlive any
//! one replica, so a Pod cannot own them.

use std::time::Duration;

use ferrolb_runtime::owner::Owner;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::{Api, Client};

/// Reads to try before going on without an owner: the API server may not answer at once.
const ATTEMPTS: u32 = 5;

/// The ServiceAccount `name` in `namespace` as an owner. `None`, after a warning, when it cannot
/// be read: the records are then written without an owner, as before, and are left behind on
/// uninstall; nothing else changes.
pub async fn service_account(client: &Client, namespace: &str, name: &str) -> Option<Owner> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    for attempt in 1..=ATTEMPTS {
        match api.get_metadata(name).await {
            Ok(account) => {
                let Some(uid) = account.metadata.uid else {
                    break;
                };
                return Some(Owner::service_account(name, &uid));
            }
            // Missing or forbidden: asking again will not change it.
            Err(kube::Error::Api(e)) if e.code == 403 || e.code == 404 => {
                tracing::warn!(
                    service_account = %name, %namespace, error = %e,
                    "cannot read the controller's ServiceAccount (needs get on serviceaccounts, resourceNames: [{name}]): its Lease and ConfigurationState get no owner and stay after uninstall"
                );
                return None;
            }
            Err(e) if attempt < ATTEMPTS => {
                tracing::debug!(service_account = %name, error = %e, attempt, "reading the ServiceAccount");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => {
                tracing::warn!(service_account = %name, %namespace, error = %e, "reading the controller's ServiceAccount failed: its records get no owner");
                return None;
            }
        }
    }
    tracing::warn!(service_account = %name, "the ServiceAccount has no UID: its records get no owner");
    None
}
