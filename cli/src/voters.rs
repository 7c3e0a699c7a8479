//! `ferrolb voters`: the layer 2 voters the controller publishes (decision record 0023,
//! *Changing the voters*), and where each voter node is: the generation its seat serves, the
//! newest it read, and the controller's fence, from its duty record.

use std::collections::BTreeMap;

use anyhow::Context as _;
use ferrolb_layer2::voters::VoterConfig;
use ferrolb_runtime::voters::{Record, config_of, record_name, record_of, record_selector};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams};
use serde::Serialize;

/// What `ferrolb voters` shows.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct Voters {
    /// The configuration object, as namespace/name.
    pub object: String,
    /// Its generation.
    pub generation: u64,
    /// Whether a change is under way (a joint phase).
    pub changing: bool,
    /// The voters.
    pub current: Vec<String>,
    /// During a change, the voters that replace them.
    pub next: Vec<String>,
    /// Every node with a duty record, or named by the configuration.
    pub nodes: Vec<VoterNode>,
}

/// One voter node's duty record.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct VoterNode {
    /// The node.
    pub node: String,
    /// Named by `current`, `next`, both, or neither (a former voter).
    pub role: &'static str,
    /// The newest generation it read (none: no valid mark).
    pub read: Option<u64>,
    /// The generation its seat serves (none: no seat).
    pub serves: Option<u64>,
    /// The controller's fence (0: none): seats below it ended.
    pub fence: u64,
}

/// Reads the configuration `object` in `namespace` and its duty records.
pub async fn read(client: &kube::Client, namespace: &str, object: &str) -> anyhow::Result<Voters> {
    let map = Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get_opt(object)
        .await
        .with_context(|| format!("reading ConfigMap {namespace}/{object}"))?
        .with_context(|| {
            format!(
                "no voter configuration {namespace}/{object}: the controller publishes it when the speakers run with speaker.membership=voters and no fixed speaker.voters"
            )
        })?;
    let config = config_of(&map)?;
    let records: Vec<Lease> = Api::<Lease>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&record_selector(object)))
        .await
        .with_context(|| format!("listing the voters' duty records in {namespace}"))?
        .items;
    Ok(summary(namespace, object, &config, &records))
}

/// The summary of `config` with its duty `records`.
pub fn summary(namespace: &str, object: &str, config: &VoterConfig, records: &[Lease]) -> Voters {
    let mut by_node: BTreeMap<String, Record> = BTreeMap::new();
    for lease in records {
        let Some(node) = lease.spec.as_ref().and_then(|s| s.holder_identity.clone()) else {
            continue;
        };
        // Only the record named for its holder counts.
        if lease.metadata.name.as_deref() == Some(record_name(object, &node).as_str()) {
            by_node.insert(node, record_of(lease));
        }
    }
    for voter in config.voters() {
        by_node.entry(voter.to_string()).or_default();
    }
    let nodes = by_node
        .into_iter()
        .map(|(node, record)| {
            let current = config.current.contains(&node);
            let next = config.next.contains(&node);
            VoterNode {
                role: match (current, next) {
                    (true, true) => "current+next",
                    (true, false) if config.joint() => "current (leaving)",
                    (true, false) => "current",
                    (false, true) => "next (joining)",
                    (false, false) => "former",
                },
                read: record.mark.map(|m| m.read),
                serves: record.mark.and_then(|m| m.serves),
                fence: record.fence,
                node,
            }
        })
        .collect();
    Voters {
        object: format!("{namespace}/{object}"),
        generation: config.generation,
        changing: config.joint(),
        current: config.current.clone(),
        next: config.next.clone(),
        nodes,
    }
}

/// The summary as text.
pub fn render_text(v: &Voters) -> String {
    let mut out = format!(
        "Voter configuration {} at generation {}: {}\n  voters: {}\n",
        v.object,
        v.generation,
        if v.changing {
            "a change is under way"
        } else {
            "stable"
        },
        v.current.join(", ")
    );
    if v.changing {
        out += &format!("  replaced by: {}\n", v.next.join(", "));
    }
    let generation = |g: Option<u64>| g.map_or("-".to_string(), |g| g.to_string());
    out += &format!(
        "\n  {:<24} {:<18} {:>6} {:>6} {:>6}\n",
        "NODE", "ROLE", "SERVES", "READ", "FENCE"
    );
    for n in &v.nodes {
        out += &format!(
            "  {:<24} {:<18} {:>6} {:>6} {:>6}\n",
            n.node,
            n.role,
            generation(n.serves),
            generation(n.read),
            if n.fence == 0 {
                "-".to_string()
            } else {
                n.fence.to_string()
            }
        );
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use ferrolb_layer2::voters::duty::Mark;
    use ferrolb_runtime::voters::record_object;

    #[test]
    fn a_change_shows_who_joins_who_leaves_and_where_each_is() {
        let config = VoterConfig::new(4, ["a", "b", "c"], ["a", "b", "d"]).unwrap();
        let record = |node: &str, read, serves, fence| {
            record_object(
                "ferrolb-voters",
                "ns",
                node,
                &Record {
                    version: Some("1".into()),
                    mark: Some(Mark { read, serves }),
                    fence,
                },
            )
        };
        let records = [
            record("a", 4, Some(4), 0),
            record("c", 3, Some(3), 4),
            record("e", 2, None, 0),
        ];
        let v = summary("ns", "ferrolb-voters", &config, &records);
        assert!(v.changing);
        let rows: Vec<(&str, &str, Option<u64>, u64)> = v
            .nodes
            .iter()
            .map(|n| (n.node.as_str(), n.role, n.serves, n.fence))
            .collect();
        assert_eq!(
            rows,
            [
                ("a", "current+next", Some(4), 0),
                ("b", "current+next", None, 0),
                ("c", "current (leaving)", Some(3), 4),
                ("d", "next (joining)", None, 0),
                ("e", "former", None, 0),
            ]
        );
        let text = render_text(&v);
        assert!(text.contains("a change is under way"), "{text}");
        assert!(text.contains("replaced by: a, b, d"), "{text}");
    }
}
