//! Community aliases and community values.

use std::collections::BTreeMap;

use super::{Kind, ObjectRef, Report, by_age};
use crate::crd::Community;
use crate::model::CommunityValue;

/// A text that is not a community value; each variant holds the text as given.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CommunityError {
    /// `large:` followed by something other than three 32-bit numbers.
    #[error("{0:?} is not a large community large:a:b:c with each part 0-4294967295")]
    Large(String),
    /// Neither `a:b` with two 16-bit numbers nor a `large:` value.
    #[error("{0:?} is not a community a:b with each part 0-65535, nor large:a:b:c")]
    Standard(String),
}

/// Parses `a:b` (16-bit parts) or `large:a:b:c` (32-bit parts).
pub fn parse_community(text: &str) -> Result<CommunityValue, CommunityError> {
    if let Some(rest) = text.strip_prefix("large:") {
        let parts: Vec<&str> = rest.split(':').collect();
        let parsed: Option<Vec<u32>> = parts.iter().map(|p| p.parse::<u32>().ok()).collect();
        return match parsed.as_deref() {
            Some([a, b, c]) => Ok(CommunityValue::Large(*a, *b, *c)),
            _ => Err(CommunityError::Large(text.to_string())),
        };
    }
    let parsed: Option<Vec<u16>> = text.split(':').map(|p| p.parse::<u16>().ok()).collect();
    match parsed.as_deref() {
        Some([a, b]) => Ok(CommunityValue::Standard(*a, *b)),
        _ => Err(CommunityError::Standard(text.to_string())),
    }
}

/// Validates Community objects into an alias map. An alias defined twice in one object rejects
/// that object; an alias already defined by an older object rejects the newer one.
pub(super) fn validate(
    report: &mut Report,
    objects: &[Community],
) -> BTreeMap<String, CommunityValue> {
    let mut aliases: BTreeMap<String, (CommunityValue, String)> = BTreeMap::new();
    for object in by_age(objects) {
        let me = ObjectRef::of(Kind::Community, &object.metadata);
        let mark = report.mark();
        let mut mine: BTreeMap<String, CommunityValue> = BTreeMap::new();
        for (i, alias) in object.spec.communities.iter().enumerate() {
            if alias.name.is_empty() {
                report.error(
                    &me,
                    format!("spec.communities[{i}].name"),
                    "must not be empty",
                );
            }
            match parse_community(&alias.value) {
                Ok(value) => {
                    if mine.insert(alias.name.clone(), value).is_some() {
                        report.error(
                            &me,
                            format!("spec.communities[{i}].name"),
                            format!("alias {:?} is defined twice in this object", alias.name),
                        );
                    }
                }
                Err(e) => report.error(&me, format!("spec.communities[{i}].value"), e.to_string()),
            }
            if let Some((_, owner)) = aliases.get(&alias.name) {
                report.error(
                    &me,
                    format!("spec.communities[{i}].name"),
                    format!(
                        "alias {:?} is already defined by the older Community {owner:?}",
                        alias.name
                    ),
                );
            }
        }
        if !report.failed_since(mark) {
            for (name, value) in mine {
                aliases.insert(name, (value, me.name.clone()));
            }
        }
    }
    aliases.into_iter().map(|(k, (v, _))| (k, v)).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::crd::{CommunityAlias, CommunitySpec};
    use crate::validate::testing::meta;

    fn community(name: &str, age: i64, aliases: &[(&str, &str)]) -> Community {
        Community {
            metadata: meta(name, age),
            spec: CommunitySpec {
                communities: aliases
                    .iter()
                    .map(|(n, v)| CommunityAlias {
                        name: n.to_string(),
                        value: v.to_string(),
                    })
                    .collect(),
            },
        }
    }

    #[test]
    fn parses_standard_and_large_values() {
        assert_eq!(
            parse_community("65535:65282"),
            Ok(CommunityValue::Standard(65535, 65282))
        );
        assert_eq!(
            parse_community("large:1:2:4294967295"),
            Ok(CommunityValue::Large(1, 2, 4294967295))
        );
        for bad in [
            "65536:1",
            "1:2:3",
            "a:b",
            "large:1:2",
            "large:1:2:4294967296",
            "",
        ] {
            assert!(parse_community(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_community("large:1:2"),
            Err(CommunityError::Large("large:1:2".to_string()))
        );
        assert_eq!(
            parse_community("1:2:3"),
            Err(CommunityError::Standard("1:2:3".to_string()))
        );
    }

    #[test]
    fn bad_values_and_duplicate_aliases_are_rejected() {
        let mut report = Report::default();
        let aliases = validate(
            &mut report,
            &[
                community("good", 0, &[("no-export", "65535:65281")]),
                community("dup", 1, &[("a", "1:1"), ("a", "1:2")]),
                community("bad", 2, &[("b", "70000:1")]),
                community("again", 3, &[("no-export", "1:1")]),
            ],
        );
        assert_eq!(aliases.keys().collect::<Vec<_>>(), ["no-export"]);
        let errors: Vec<String> = report.errors.iter().map(|e| e.to_string()).collect();
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(errors[0].starts_with(
            "Community metallb-system/dup: spec.communities[1].name: alias \"a\" is defined twice"
        ));
        assert!(errors[1].starts_with("Community metallb-system/bad: spec.communities[0].value: \"70000:1\" is not a community"));
        assert!(errors[2].contains("already defined by the older Community \"good\""));
    }
}
