//! The owner of the records the controller writes for itself (the leader Lease, ConfigurationState
//! `controller`, a gossip key Secret it creates): its ServiceAccount, which the release creates
//! and `helm uninstall` deletes, so the garbage collector removes them with it. They outlive any
//! one replica, so a Pod cannot own them.

use ferrolb_runtime::owner::{Owner, OwnerCell};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::{Api, Client};

/// Keeps `cell` holding the ServiceAccount `name` in `namespace`, in the background (see
/// [`ferrolb_runtime::owner::learn`]).
pub fn learn(client: &Client, namespace: &str, name: &str, cell: OwnerCell) {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let name = name.to_string();
    tokio::spawn(async move {
        let what = format!("the controller's ServiceAccount {name} (needs get on it)");
        ferrolb_runtime::owner::learn(cell, &what, || {
            let (api, name) = (api.clone(), name.clone());
            async move {
                let account = api.get_metadata(&name).await?;
                Ok(account
                    .metadata
                    .uid
                    .map(|uid| Owner::service_account(&name, &uid)))
            }
        })
        .await;
    });
}
