//! IPAddressPool rules: address syntax, overlaps inside and across pools, serviceAllocation.

use std::collections::{BTreeMap, BTreeSet};

use super::{Kind, ObjectRef, Report, by_age, compile_selectors};
use crate::address::IpRange;
use crate::crd::IPAddressPool;
use crate::model::{Pool, PoolAllocation};

/// Validates the pools; a pool overlapping an older accepted pool is left out.
pub(super) fn validate(report: &mut Report, pools: &[IPAddressPool]) -> BTreeMap<String, Pool> {
    let mut accepted: BTreeMap<String, Pool> = BTreeMap::new();
    for object in by_age(pools) {
        let me = ObjectRef::of(Kind::IPAddressPool, &object.metadata);
        let mark = report.mark();
        let Some(pool) = validate_one(report, &me, object) else {
            continue;
        };
        for other in accepted.values() {
            for (i, range) in pool.ranges.iter().enumerate() {
                if let Some(theirs) = other.ranges.iter().find(|r| r.overlaps(range)) {
                    report.error(
                        &me,
                        format!("spec.addresses[{i}]"),
                        format!("{range} overlaps {theirs} of the older pool {:?}; addresses may belong to one pool only", other.name),
                    );
                }
            }
        }
        if !report.failed_since(mark) {
            accepted.insert(pool.name.clone(), pool);
        }
    }
    accepted
}

fn validate_one(report: &mut Report, me: &ObjectRef, object: &IPAddressPool) -> Option<Pool> {
    let mark = report.mark();
    let spec = &object.spec;
    if spec.addresses.is_empty() {
        report.error(me, "spec.addresses", "must list at least one CIDR or range");
    }
    let mut ranges: Vec<(usize, IpRange)> = Vec::new();
    for (i, text) in spec.addresses.iter().enumerate() {
        match IpRange::parse(text) {
            Ok(range) => {
                if let Some((j, other)) = ranges.iter().find(|(_, r)| r.overlaps(&range)) {
                    report.error(
                        me,
                        format!("spec.addresses[{i}]"),
                        format!("{range} overlaps {other} (spec.addresses[{j}]) of the same pool"),
                    );
                }
                ranges.push((i, range));
            }
            Err(e) => report.error(me, format!("spec.addresses[{i}]"), e.to_string()),
        }
    }
    let allocation = spec.service_allocation.as_ref().map(|a| {
        let mut namespaces = BTreeSet::new();
        for (i, ns) in a.namespaces.iter().enumerate() {
            if !namespaces.insert(ns.clone()) {
                report.error(
                    me,
                    format!("spec.serviceAllocation.namespaces[{i}]"),
                    format!("duplicate namespace {ns:?}"),
                );
            }
        }
        let priority = match a.priority {
            Some(p) if p < 0 => {
                report.error(
                    me,
                    "spec.serviceAllocation.priority",
                    format!("{p} is negative; use 0 or more"),
                );
                None
            }
            Some(0) | None => None,
            Some(p) => Some(p.unsigned_abs()),
        };
        PoolAllocation {
            priority,
            namespaces,
            namespace_selectors: compile_selectors(
                report,
                me,
                "spec.serviceAllocation.namespaceSelectors",
                &a.namespace_selectors,
            ),
            service_selectors: compile_selectors(
                report,
                me,
                "spec.serviceAllocation.serviceSelectors",
                &a.service_selectors,
            ),
        }
    });
    if report.failed_since(mark) {
        return None;
    }
    let mut ranges: Vec<IpRange> = ranges.into_iter().map(|(_, r)| r).collect();
    ranges.sort();
    Some(Pool {
        name: me.name.clone(),
        labels: object.metadata.labels.clone().unwrap_or_default(),
        ranges,
        auto_assign: spec.auto_assign,
        avoid_buggy_ips: spec.avoid_buggy_ips,
        allocation,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::crd::{IPAddressPoolSpec, LabelSelector, ServiceAllocation};
    use crate::validate::testing::meta;

    fn pool(name: &str, age: i64, addresses: &[&str]) -> IPAddressPool {
        IPAddressPool {
            metadata: meta(name, age),
            spec: IPAddressPoolSpec {
                addresses: addresses.iter().map(|s| s.to_string()).collect(),
                auto_assign: true,
                ..Default::default()
            },
            status: None,
        }
    }

    fn run(pools: &[IPAddressPool]) -> (BTreeMap<String, Pool>, Vec<String>) {
        let mut report = Report::default();
        let accepted = validate(&mut report, pools);
        (
            accepted,
            report.errors.iter().map(|e| e.to_string()).collect(),
        )
    }

    #[test]
    fn accepts_cidrs_and_ranges_of_both_families() {
        let (accepted, errors) =
            run(&[pool("p", 0, &["198.18.10.0/24", "fd00:10::1-fd00:10::ff"])]);
        assert_eq!(errors, Vec::<String>::new());
        assert_eq!(accepted["p"].ranges.len(), 2);
    }

    #[test]
    fn rejects_empty_addresses() {
        let (accepted, errors) = run(&[pool("p", 0, &[])]);
        assert!(accepted.is_empty());
        assert_eq!(
            errors,
            [
                "IPAddressPool metallb-system/p: spec.addresses: must list at least one CIDR or range"
            ]
        );
    }

    #[test]
    fn rejects_unparsable_and_reversed_entries_naming_the_index() {
        let (_, errors) = run(&[pool(
            "p",
            0,
            &[
                "198.18.10.0/24",
                "198.18.11.0/33",
                "198.18.12.9-198.18.12.1",
            ],
        )]);
        assert_eq!(errors.len(), 2);
        assert!(errors[0].starts_with("IPAddressPool metallb-system/p: spec.addresses[1]: \"198.18.11.0/33\" is neither a CIDR"));
        assert!(
            errors[1]
                .contains("spec.addresses[2]: \"198.18.12.9-198.18.12.1\" starts after it ends")
        );
    }

    #[test]
    fn rejects_overlap_inside_one_pool() {
        let (accepted, errors) = run(&[pool(
            "p",
            0,
            &["198.18.10.0/24", "198.18.10.128-198.18.10.130"],
        )]);
        assert!(accepted.is_empty());
        assert!(errors[0].contains("spec.addresses[1]: 198.18.10.128-198.18.10.130 overlaps 198.18.10.0-198.18.10.255 (spec.addresses[0]) of the same pool"));
    }

    #[test]
    fn overlap_across_pools_leaves_out_the_newer_and_keeps_the_older() {
        let (accepted, errors) = run(&[
            pool("new", 5, &["198.18.10.100/32"]),
            pool("old", 1, &["198.18.10.0/24"]),
        ]);
        assert!(accepted.contains_key("old") && !accepted.contains_key("new"));
        assert_eq!(errors.len(), 1);
        assert!(errors[0].starts_with(
            "IPAddressPool metallb-system/new: spec.addresses[0]: 198.18.10.100 overlaps"
        ));
        assert!(errors[0].contains("older pool \"old\""));
    }

    #[test]
    fn rejects_duplicate_namespaces_and_selectors() {
        let mut p = pool("p", 0, &["198.18.10.0/24"]);
        let sel = LabelSelector {
            match_labels: Some([("a".to_string(), "b".to_string())].into()),
            ..Default::default()
        };
        p.spec.service_allocation = Some(ServiceAllocation {
            priority: Some(1),
            namespaces: vec!["a".into(), "a".into()],
            namespace_selectors: vec![sel.clone(), sel.clone()],
            service_selectors: vec![sel.clone(), sel],
        });
        let (accepted, errors) = run(&[p]);
        assert!(accepted.is_empty());
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(errors.iter().any(|e| {
            e.contains("spec.serviceAllocation.namespaces[1]: duplicate namespace \"a\"")
        }));
        assert!(errors.iter().any(|e| {
            e.contains("spec.serviceAllocation.namespaceSelectors[1]: duplicate selector")
        }));
        assert!(
            errors
                .iter()
                .any(|e| e
                    .contains("spec.serviceAllocation.serviceSelectors[1]: duplicate selector"))
        );
    }

    #[test]
    fn priority_zero_means_unset() {
        let mut p = pool("p", 0, &["198.18.10.0/24"]);
        p.spec.service_allocation = Some(ServiceAllocation {
            priority: Some(0),
            ..Default::default()
        });
        let (accepted, _) = run(&[p]);
        assert_eq!(
            accepted["p"].allocation.as_ref().and_then(|a| a.priority),
            None
        );
    }
}
