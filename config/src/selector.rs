//! Kubernetes label selectors, compiled once from their API form and matched as plain data.

use std::collections::{BTreeMap, BTreeSet};

use crate::crd::LabelSelector;

/// Labels of an object (node, namespace, Service, pool).
pub type Labels = BTreeMap<String, String>;

/// A compiled label selector. The empty selector matches everything, as in Kubernetes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

/// One requirement on one label key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Requirement {
    key: String,
    op: Operator,
}

/// What a requirement asks of its key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Operator {
    /// The label is one of these values.
    In(BTreeSet<String>),
    /// The label is absent or not one of these values.
    NotIn(BTreeSet<String>),
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
}

/// Why a selector could not be compiled: the message names the field inside the selector.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SelectorError {
    /// Path inside the selector, e.g. `matchExpressions[0].operator`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl Selector {
    /// A selector that matches every object.
    pub fn everything() -> Self {
        Self::default()
    }

    /// A selector from `matchLabels` only.
    pub fn from_labels<I, K, V>(labels: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        let requirements = labels
            .into_iter()
            .map(|(k, v)| Requirement {
                key: k.into(),
                op: Operator::In(BTreeSet::from([v.into()])),
            })
            .collect();
        Self { requirements }
    }

    /// Compiles a selector as written in an object, rejecting what Kubernetes would reject.
    pub fn compile(selector: &LabelSelector) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        for (key, value) in selector.match_labels.iter().flatten() {
            requirements.push(Requirement {
                key: key.clone(),
                op: Operator::In(BTreeSet::from([value.clone()])),
            });
        }
        for (i, expr) in selector.match_expressions.iter().flatten().enumerate() {
            let field = |f: &str| format!("matchExpressions[{i}].{f}");
            if expr.key.is_empty() {
                return Err(SelectorError {
                    field: field("key"),
                    message: "must not be empty".into(),
                });
            }
            let values: BTreeSet<String> = expr.values.iter().flatten().cloned().collect();
            let op = match expr.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(SelectorError {
                        field: field("values"),
                        message: format!("operator {} needs at least one value", expr.operator),
                    });
                }
                "In" => Operator::In(values),
                "NotIn" => Operator::NotIn(values),
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(SelectorError {
                        field: field("values"),
                        message: format!("operator {} takes no values", expr.operator),
                    });
                }
                "Exists" => Operator::Exists,
                "DoesNotExist" => Operator::DoesNotExist,
                other => {
                    return Err(SelectorError {
                        field: field("operator"),
                        message: format!(
                            "unknown operator {other:?}; use In, NotIn, Exists or DoesNotExist"
                        ),
                    });
                }
            };
            requirements.push(Requirement {
                key: expr.key.clone(),
                op,
            });
        }
        requirements.sort();
        Ok(Self { requirements })
    }

    /// Whether the selector matches these labels.
    pub fn matches(&self, labels: &Labels) -> bool {
        self.requirements.iter().all(|r| {
            let value = labels.get(&r.key);
            match &r.op {
                Operator::In(values) => value.is_some_and(|v| values.contains(v)),
                Operator::NotIn(values) => value.is_none_or(|v| !values.contains(v)),
                Operator::Exists => value.is_some(),
                Operator::DoesNotExist => value.is_none(),
            }
        })
    }

    /// Whether this selector matches everything.
    pub fn is_everything(&self) -> bool {
        self.requirements.is_empty()
    }
}

/// Matches when the list is empty or any selector of it matches (MetalLB's rule for selector lists).
pub fn any_matches(selectors: &[Selector], labels: &Labels) -> bool {
    selectors.is_empty() || selectors.iter().any(|s| s.matches(labels))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelector {
        LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: key.into(),
                operator: op.into(),
                values: (!values.is_empty())
                    .then(|| values.iter().map(|v| v.to_string()).collect()),
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn empty_selector_matches_everything() {
        let s = Selector::compile(&LabelSelector::default()).expect("valid");
        assert!(s.is_everything());
        assert!(s.matches(&labels(&[])));
    }

    #[test]
    fn match_labels_and_expressions() {
        let s = Selector::from_labels([("zone", "a")]);
        assert!(s.matches(&labels(&[("zone", "a"), ("x", "y")])));
        assert!(!s.matches(&labels(&[("zone", "b")])));
        let not_in = Selector::compile(&expr("zone", "NotIn", &["a"])).expect("valid");
        assert!(not_in.matches(&labels(&[])));
        assert!(!not_in.matches(&labels(&[("zone", "a")])));
        let exists = Selector::compile(&expr("gpu", "Exists", &[])).expect("valid");
        assert!(exists.matches(&labels(&[("gpu", "")])));
        let absent = Selector::compile(&expr("gpu", "DoesNotExist", &[])).expect("valid");
        assert!(!absent.matches(&labels(&[("gpu", "")])));
    }

    #[test]
    fn bad_selectors_name_the_field() {
        let e = Selector::compile(&expr("zone", "Like", &["a"])).expect_err("invalid");
        assert_eq!(e.field, "matchExpressions[0].operator");
        let e = Selector::compile(&expr("zone", "In", &[])).expect_err("invalid");
        assert_eq!(e.field, "matchExpressions[0].values");
        let e = Selector::compile(&expr("zone", "Exists", &["a"])).expect_err("invalid");
        assert!(e.message.contains("takes no values"));
    }
}
