//! The layer 2 voters' objects in the API (decision 0023, *Changing the voters*), as the
//! controller writes them and the speakers and `kubectl ferrolb voters` read them:
//!
//! * **The voter configuration**: a ConfigMap in the speakers' namespace, written only by the
//!   controller's leader (`data`: `generation`, `current`, `next`;
//!   [`VoterConfig::to_data`]).
//! * **A duty record per voter node**: a Lease `<configuration>-<node>` holding the node's
//!   [`Mark`] (annotation [`MARK`]), written by the node's speaker on the version it last saw,
//!   and the controller's fence (annotation [`FENCE`]), written on the version it read.
//!
//! Every write of a duty record is conditional (`metadata.resourceVersion`): that is what makes
//! a fence final (`ferrolb_layer2::voters::duty`).

use std::collections::BTreeMap;

use ferrolb_layer2::voters::VoterConfig;
use ferrolb_layer2::voters::duty::Mark;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;

/// Annotation holding a duty record's [`Mark`].
pub const MARK: &str = "ferrolb.io/voter";
/// Annotation holding a duty record's fence: seats serving a generation below it end.
pub const FENCE: &str = "ferrolb.io/voter-fence";
/// Label on every duty record, valued with the configuration's name.
pub const DUTY_LABEL: &str = "ferrolb.io/voter-duty";
/// Label on every speaker's presence Lease, valued with the speakers' group (the speaker's
/// `--presence-group`).
pub const PRESENCE_LABEL: &str = "ferrolb.io/speaker-presence";
/// Label on the configuration object.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "ferrolb-controller");

/// The name of node `node`'s duty record for the configuration `object`.
pub fn record_name(object: &str, node: &str) -> String {
    format!("{object}-{node}")
}

/// The label selector of `object`'s duty records.
pub fn record_selector(object: &str) -> String {
    format!("{DUTY_LABEL}={object}")
}

/// Reads the voter configuration from its object; the error names the object and the field.
pub fn config_of(map: &ConfigMap) -> anyhow::Result<VoterConfig> {
    let name = map.metadata.name.as_deref().unwrap_or("");
    let namespace = map.metadata.namespace.as_deref().unwrap_or("");
    let empty = BTreeMap::new();
    VoterConfig::from_data(map.data.as_ref().unwrap_or(&empty))
        .map_err(|e| anyhow::anyhow!("voter configuration ConfigMap {namespace}/{name}: {e}"))
}

/// The configuration object `name` holding `config`, on `version` (`None`: to be created).
pub fn config_object(
    name: &str,
    namespace: &str,
    config: &VoterConfig,
    version: Option<String>,
    owner: Option<&crate::owner::Owner>,
) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            resource_version: version,
            owner_references: owner.map(|o| vec![o.reference()]),
            labels: Some(BTreeMap::from([(
                MANAGED_BY.0.to_string(),
                MANAGED_BY.1.to_string(),
            )])),
            ..Default::default()
        },
        data: Some(config.to_data()),
        ..Default::default()
    }
}

/// What a duty record says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// Its `resourceVersion`.
    pub version: Option<String>,
    /// Its mark, if it holds a valid one.
    pub mark: Option<Mark>,
    /// Its fence (0: none).
    pub fence: u64,
}

/// Reads a duty record. An unreadable mark counts as none (the controller then waits or
/// fences); an unreadable fence as none (only the controller writes it).
pub fn record_of(lease: &Lease) -> Record {
    let annotations = lease.metadata.annotations.as_ref();
    let get = |key: &str| annotations.and_then(|a| a.get(key));
    let name = lease.metadata.name.as_deref().unwrap_or("");
    let mark = get(MARK).and_then(|m| {
        m.parse::<Mark>()
            .inspect_err(|e| tracing::warn!(lease = name, error = %e, "unreadable voter mark"))
            .ok()
    });
    let fence = get(FENCE)
        .and_then(|f| {
            f.parse::<u64>()
                .inspect_err(|_| tracing::warn!(lease = name, fence = %f, "unreadable voter fence"))
                .ok()
        })
        .unwrap_or(0);
    Record {
        version: lease.metadata.resource_version.clone(),
        mark,
        fence,
    }
}

/// The duty record of `node` for `object` saying `record` (its version the precondition of a
/// replace; `None`: to be created).
pub fn record_object(object: &str, namespace: &str, node: &str, record: &Record) -> Lease {
    let mut annotations = BTreeMap::new();
    if let Some(mark) = record.mark {
        annotations.insert(MARK.to_string(), mark.to_string());
    }
    if record.fence > 0 {
        annotations.insert(FENCE.to_string(), record.fence.to_string());
    }
    Lease {
        metadata: ObjectMeta {
            name: Some(record_name(object, node)),
            namespace: Some(namespace.to_string()),
            resource_version: record.version.clone(),
            labels: Some(BTreeMap::from([(
                DUTY_LABEL.to_string(),
                object.to_string(),
            )])),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(node.to_string()),
            ..Default::default()
        }),
    }
}

/// How long one API call of the voters' protocol (a read of the configuration or of a duty
/// record, a fenced write) may take before it counts as failed: a late answer is worse than
/// none, as the protocol acts on what it read.
pub const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// `call` within [`CALL_TIMEOUT`], its error or the timeout as an error.
pub async fn timed<T>(call: impl Future<Output = kube::Result<T>>) -> anyhow::Result<T> {
    Ok(tokio::time::timeout(CALL_TIMEOUT, call)
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {CALL_TIMEOUT:?}"))??)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn a_record_reads_back_as_written() {
        let record = Record {
            version: Some("42".into()),
            mark: Some(Mark {
                read: 3,
                serves: Some(2),
            }),
            fence: 2,
        };
        let lease = record_object("ferrolb-voters", "ns", "node-a", &record);
        assert_eq!(
            lease.metadata.name.as_deref(),
            Some("ferrolb-voters-node-a")
        );
        assert_eq!(record_of(&lease), record);
        let bare = record_object("v", "ns", "a", &Record::default());
        assert_eq!(record_of(&bare), Record::default());
    }

    #[test]
    fn a_bad_configuration_names_its_object_and_field() {
        let config = VoterConfig::new(2, ["a", "b", "c"], Vec::<&str>::new()).unwrap();
        let map = config_object("ferrolb-voters", "ferrolb", &config, None, None);
        assert_eq!(config_of(&map).unwrap(), config);
        let mut broken = map.clone();
        broken
            .data
            .as_mut()
            .unwrap()
            .insert("generation".into(), "two".into());
        let e = config_of(&broken).unwrap_err().to_string();
        assert!(e.contains("ferrolb/ferrolb-voters"), "{e}");
        assert!(e.contains("data.generation"), "{e}");
    }
}
