//! The report of an applied configuration, written while leading: ConfigurationState
//! `controller` (its result, its owner) and a Warning Event on each left-out object, and the
//! finalizer that keeps a BFDProfile in use from being deleted.

use std::collections::BTreeSet;

use ferrolb_config::crd::{
    BFDProfile, BGPPeer, ConfigurationResult, ConfigurationState, ConfigurationStateSpec,
};
use ferrolb_config::validate::{ConfigError, Kind, Validated};
use ferrolb_runtime::events;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};

use super::ApiWrites;

/// Finalizer that keeps a BFDProfile in use from being deleted.
const BFD_FINALIZER: &str = "metallb.io/bfdprofile-in-use";

/// The name of the ConfigurationState the controller writes.
const STATE_NAME: &str = "controller";

impl ApiWrites {
    /// Writes ConfigurationState `controller` and Events on left-out objects, when they change.
    pub(super) async fn report_state(&mut self, validated: &Validated) {
        if !self.writer.leadership.is_leading() {
            return;
        }
        self.write_configuration_state(validated).await;
        self.set_state_owner().await;
        self.record_left_out(validated).await;
    }

    /// Writes the result and the error summary to ConfigurationState `controller` (creating it),
    /// unless this term already wrote the same.
    async fn write_configuration_state(&mut self, validated: &Validated) {
        let result = if validated.is_valid() {
            ConfigurationResult::Valid
        } else {
            ConfigurationResult::Invalid
        };
        let summary = validated
            .errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n");
        if self.written_state.as_ref() == Some(&(result, summary.clone())) {
            return;
        }
        let api: Api<ConfigurationState> =
            Api::namespaced(self.writer.client.clone(), &self.namespace);
        let object = ConfigurationState {
            metadata: ObjectMeta {
                name: Some(STATE_NAME.into()),
                ..Default::default()
            },
            spec: ConfigurationStateSpec {},
            status: None,
        };
        let created = match api.create(&PostParams::default(), &object).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(e) => Err(e),
        };
        let patch = serde_json::json!({"status": {"result": result, "errorSummary": summary}});
        match created.and(
            api.patch_status(STATE_NAME, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| ()),
        ) {
            Ok(()) => self.written_state = Some((result, summary)),
            Err(e) => {
                tracing::warn!(error = %e, "writing ConfigurationState controller failed")
            }
        }
    }

    /// Sets the owner on ConfigurationState `controller`, in a write of its own, once per run and
    /// owner, whenever a report passes (so also when the owner is learnt after the first one): a
    /// refusal (OwnerReferencesPermissionEnforcement without `delete`) never stops the report. A
    /// merge patch replaces the list whole.
    async fn set_state_owner(&mut self) {
        if self.written_state.is_none() {
            return;
        }
        let Some(owner) = self.owner.get() else {
            return;
        };
        if self.state_owner.as_deref() == Some(owner.reference().uid.as_str()) {
            return;
        }
        let api: Api<ConfigurationState> =
            Api::namespaced(self.writer.client.clone(), &self.namespace);
        match api
            .patch(STATE_NAME, &PatchParams::default(), &owner.merge_patch())
            .await
        {
            Ok(_) => self.state_owner = Some(owner.reference().uid),
            Err(kube::Error::Api(e)) if e.code == 403 => {
                self.state_owner = Some(owner.reference().uid);
                tracing::warn!(error = %e, "setting the owner of ConfigurationState controller was refused: it stays after uninstall (needs patch and delete on it)");
            }
            Err(e) => {
                tracing::debug!(error = %e, "setting the owner of ConfigurationState controller failed")
            }
        }
    }

    /// Records a Warning Event on each object left out of the configuration, once per error
    /// while it lasts (an error that goes and comes back is recorded again).
    async fn record_left_out(&mut self, validated: &Validated) {
        for e in &validated.errors {
            let line = e.to_string();
            if self.reported_errors.contains(&line) {
                continue;
            }
            let message = format!(
                "{}: {} (left out of the running configuration)",
                e.field, e.message
            );
            let note = events::Note {
                warning: true,
                reason: "InvalidConfiguration",
                message: &message,
                action: "Validate",
            };
            if self
                .recorder
                .publish(&note, &left_out_reference(e))
                .await
                .is_ok()
            {
                self.reported_errors.insert(line);
            }
        }
        let current: BTreeSet<String> = validated.errors.iter().map(ToString::to_string).collect();
        self.reported_errors.retain(|l| current.contains(l));
    }

    /// Keeps a finalizer on every BFDProfile a BGPPeer refers to, so deleting a profile in use
    /// waits until no peer refers to it (MetalLB's webhook refuses such a deletion).
    pub(super) async fn protect_bfd_profiles(&self, peers: &[BGPPeer], profiles: &[BFDProfile]) {
        if !self.writer.leadership.is_leading() {
            return;
        }
        let referenced: BTreeSet<&str> = peers
            .iter()
            .filter_map(|p| p.spec.bfd_profile.as_deref())
            .collect();
        let api: Api<BFDProfile> = Api::namespaced(self.writer.client.clone(), &self.namespace);
        for profile in profiles {
            let name = profile.metadata.name.as_deref().unwrap_or_default();
            let finalizers = profile.metadata.finalizers.clone().unwrap_or_default();
            let has = finalizers.iter().any(|f| f == BFD_FINALIZER);
            let wanted = referenced.contains(name);
            if has == wanted {
                if wanted && profile.metadata.deletion_timestamp.is_some() {
                    tracing::warn!(
                        profile = name,
                        "BFDProfile is being deleted but a BGPPeer still refers to it; the deletion waits"
                    );
                }
                continue;
            }
            let mut next: Vec<String> = finalizers
                .into_iter()
                .filter(|f| f != BFD_FINALIZER)
                .collect();
            if wanted {
                next.push(BFD_FINALIZER.to_string());
            }
            // The resourceVersion makes the update fail rather than drop another finalizer
            // written meanwhile; the next pass retries.
            let patch = serde_json::json!({"metadata": {"finalizers": next, "resourceVersion": profile.metadata.resource_version}});
            if let Err(e) = api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                tracing::warn!(profile = name, error = %e, "updating the BFDProfile finalizer failed");
            }
        }
    }
}

/// The object an error left out, as an Event's subject.
fn left_out_reference(error: &ConfigError) -> ObjectReference {
    let api_version = if error.object.kind == Kind::BGPPeer {
        "metallb.io/v1beta2"
    } else {
        "metallb.io/v1beta1"
    };
    ObjectReference {
        api_version: Some(api_version.into()),
        kind: Some(error.object.kind.as_str().into()),
        name: Some(error.object.name.clone()),
        namespace: Some(error.object.namespace.clone()),
        ..Default::default()
    }
}
