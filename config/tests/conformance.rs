//! Configuration conformance with MetalLB: MetalLB v0.15.2's own configuration test cases
//! (`internal/config/*_test.go`, its webhooks' tests and its BGPPeer conversion tests) and the
//! ones v0.16.1 added (see [`TRANSLATED`]), translated into manifests in `tests/conformance/*.yaml`
//! (see the README there), each run through ferrolb's validator, the code
//! `ferrolb-controller check-config` runs. ferrolb must reach MetalLB's verdict, and a reject
//! must name the object at fault, unless the case records a deliberate difference that
//! `docs/metallb-differences.md` explains. The objects of every case MetalLB accepts must also
//! pass the CEL rules of ferrolb's CRDs, so that the API server admits them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use ferrolb_config::manifest::read_manifests;
use ferrolb_config::validate::{NodeInfo, Objects, validate};
use serde::Deserialize;

const NS: &str = "metallb-system";

/// One translated MetalLB test case.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    #[serde(default = "default_from")]
    from: String,
    verdict: Verdict,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    culprits: Vec<String>,
    #[serde(default)]
    nodes: Option<Vec<Node>>,
    #[serde(default)]
    #[expect(
        dead_code,
        reason = "read by people tracing the translation, not by the test"
    )]
    note: Option<String>,
    #[serde(default)]
    difference: Option<String>,
    /// MetalLB admits every object of this rejected case (its webhook leaves references out), and
    /// refuses the configuration only when its controller loads it: ferrolb's CRDs must admit
    /// the objects too.
    #[serde(default)]
    admitted: bool,
    manifests: String,
}

/// MetalLB v0.15.2's configuration tests and how many of their cases are translated.
const TRANSLATED: &[(&str, usize)] = &[
    // internal/config/config_test.go
    ("TestParse", 91),
    // internal/config/validation_test.go: native-mode and FRR-mode restrictions.
    ("TestValidate", 15),
    ("TestValidateFRR", 13),
    // internal/config/validator_test.go (its other test, TestResetTransientErrorsFields,
    // transforms objects and decides no verdict).
    ("TestValidator", 1),
    // internal/k8s/webhooks/webhookv1beta1 and webhookv1beta2.
    ("TestValidateBFDProfile", 2),
    ("TestValidateBGPAdvertisement", 3),
    ("TestValidateCommunity", 3),
    ("TestValidateIPAddressPool", 1),
    ("TestValidateL2Advertisement", 3),
    ("TestValidateBGPPeer", 1),
    // api/v1beta1/bgppeer_conversion_test.go: the object and its conversion.
    ("TestValidateBGPPeerConvertTo", 2),
    ("TestValidateBGPPeerConvertFrom", 2),
    // e2etest/webhookstests/webhooks.go (Ginkgo): one case per step of each test.
    ("e2e:Webhooks", 19),
    ("e2e:Webhooks namespace validation", 6),
    // MetalLB v0.16.1's additions (tests/conformance/v0.16.yaml).
    ("v0.16.1:TestServiceSelectors", 9),
    ("v0.16.1:TestParse", 2),
    ("v0.16.1:TestValidate", 1),
];

fn default_from() -> String {
    "TestParse".into()
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Verdict {
    Accept,
    Reject,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Node {
    name: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

/// A finding of ferrolb about one object, from reading the manifest or from validation.
struct Finding {
    kind: String,
    name: String,
    field: String,
    text: String,
}

fn case_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/conformance")
}

fn load_cases() -> Vec<(String, Case)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(case_dir())
        .expect("read tests/conformance")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut cases = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read case file");
        let file_name = file.file_name().unwrap().to_string_lossy().into_owned();
        let parsed: Vec<Case> = serde_saphyr::from_str(&text)
            .unwrap_or_else(|e| panic!("{file_name} is not a list of cases: {e}"));
        cases.extend(parsed.into_iter().map(|c| (file_name.clone(), c)));
    }
    cases
}

/// ferrolb's findings for a case: manifest errors first, then validation errors.
fn run(case: &Case) -> Vec<Finding> {
    let mut objects = Objects {
        namespace: NS.into(),
        nodes: case.nodes.as_ref().map(|nodes| {
            nodes
                .iter()
                .map(|n| NodeInfo {
                    name: n.name.clone(),
                    labels: n.labels.clone(),
                })
                .collect()
        }),
        ..Default::default()
    };
    let mut findings: Vec<Finding> = read_manifests(&case.manifests, &case.name, &mut objects)
        .into_iter()
        .map(|e| Finding {
            kind: e.kind.clone(),
            name: e.name.clone(),
            field: e.field.clone(),
            text: e.to_string(),
        })
        .collect();
    let validated = validate(&objects);
    // An object outside ferrolb's namespace is left out with a warning on `metadata.namespace`:
    // ferrolb's form of the refusal MetalLB's webhooks give (docs/metallb-compat.md). Other
    // warnings (e.g. a Secret an offline check cannot see) leave the object in.
    let left_out_elsewhere = validated
        .warnings
        .into_iter()
        .filter(|w| w.field == "metadata.namespace");
    findings.extend(
        validated
            .errors
            .into_iter()
            .chain(left_out_elsewhere)
            .map(|e| Finding {
                kind: e.object.kind.to_string(),
                name: e.object.name.clone(),
                field: e.field.clone(),
                text: e.to_string(),
            }),
    );
    findings
}

/// Why the case fails, if it does.
fn check(case: &Case, differences_doc: &str) -> Option<String> {
    let findings = run(case);
    let ferrolb = if findings.is_empty() {
        Verdict::Accept
    } else {
        Verdict::Reject
    };
    let listing = || {
        findings
            .iter()
            .map(|f| format!("\n      {}", f.text))
            .collect::<String>()
    };
    if let Some(reason) = &case.difference {
        if ferrolb == case.verdict {
            return Some(format!(
                "listed as a deliberate difference ({reason}) but ferrolb now agrees ({ferrolb:?}); drop `difference:`"
            ));
        }
        if !differences_doc.contains(&case.name) {
            return Some(format!(
                "deliberate difference not written up: docs/metallb-differences.md must name the case {:?}",
                case.name
            ));
        }
        return None;
    }
    if ferrolb != case.verdict {
        return Some(format!(
            "MetalLB: {:?}{}, ferrolb: {ferrolb:?}{}",
            case.verdict,
            case.reason
                .as_deref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default(),
            listing()
        ));
    }
    if ferrolb == Verdict::Reject {
        let missing: Vec<&String> = case
            .culprits
            .iter()
            .filter(|culprit| {
                let (kind, name) = culprit.split_once('/').expect("culprit is Kind/name");
                !findings.iter().any(|f| {
                    f.kind == kind
                        && f.name == name
                        && !f.field.is_empty()
                        && (name.is_empty() || f.text.contains(name))
                })
            })
            .collect();
        if !missing.is_empty() {
            return Some(format!(
                "both reject, but no error names {missing:?} and a field; ferrolb said:{}",
                listing()
            ));
        }
    }
    None
}

/// Error messages of the CRD's CEL rules that `doc` (one `metallb.io` object) breaks.
fn broken_cel_rules(
    crds: &[k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition],
    doc: &serde_json::Value,
) -> Vec<String> {
    let api_version = doc["apiVersion"].as_str().unwrap_or_default();
    let kind = doc["kind"].as_str().unwrap_or_default();
    let Some(crd) = crds.iter().find(|c| c.spec.names.kind == kind) else {
        return vec![format!("no CRD for kind {kind:?}")];
    };
    let Some(version) = crd
        .spec
        .versions
        .iter()
        .find(|v| format!("{}/{}", crd.spec.group, v.name) == api_version)
    else {
        return vec![format!("{kind} is not served as {api_version}")];
    };
    let schema = serde_json::to_value(
        version
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref()),
    )
    .expect("schema as json");
    match kube::core::cel::Validator::new().validate(&schema, doc, None) {
        Ok(()) => Vec::new(),
        Err(errors) => errors.into_vec().into_iter().map(|e| e.message).collect(),
    }
}

/// What MetalLB accepts must also pass the API server's admission of ferrolb's CRDs: their CEL
/// rules are checked here client-side (the lab applies the same CRDs to a real API server).
#[test]
fn objects_metallb_accepts_pass_the_crds_cel_rules() {
    let crds = ferrolb_config::crd::crds().expect("crds");
    let mut failures = Vec::new();
    let mut checked = 0;
    // Objects of cases MetalLB rejects that the rules refuse: proof that the check is live.
    let mut refused_rejects = 0;
    for (file, case) in load_cases() {
        let docs: Vec<serde_json::Value> =
            serde_saphyr::from_multiple(&case.manifests).expect("manifests are YAML");
        for doc in docs.iter().filter(|d| {
            d["apiVersion"]
                .as_str()
                .is_some_and(|v| v.starts_with("metallb.io/"))
        }) {
            let broken = broken_cel_rules(&crds, doc);
            if case.verdict == Verdict::Reject && !case.admitted {
                refused_rejects += usize::from(!broken.is_empty());
                continue;
            }
            checked += 1;
            if !broken.is_empty() {
                failures.push(format!(
                    "{file}: {:?}: {} {}: {broken:?}",
                    case.name, doc["kind"], doc["metadata"]["name"]
                ));
            }
        }
    }
    assert!(checked > 80, "only {checked} objects checked");
    assert!(
        refused_rejects >= 5,
        "the CEL rules refuse only {refused_rejects} objects of rejected cases"
    );
    assert!(
        failures.is_empty(),
        "CEL rules refuse objects MetalLB accepts:\n  {}",
        failures.join("\n  ")
    );
}

#[test]
fn metallb_configuration_test_cases_get_metallbs_verdict() {
    let cases = load_cases();
    let differences_doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/metallb-differences.md"),
    )
    .expect("read docs/metallb-differences.md");

    let mut seen = BTreeSet::new();
    let mut failures = Vec::new();
    for (file, case) in &cases {
        assert!(
            seen.insert((case.from.clone(), case.name.clone())),
            "{file}: case {:?} appears twice",
            case.name
        );
        if case.verdict == Verdict::Reject {
            assert!(
                case.reason.is_some() && !case.culprits.is_empty(),
                "{file}: reject case {:?} needs a reason and culprits",
                case.name
            );
        }
        if let Some(why) = check(case, &differences_doc) {
            failures.push(format!("{file}: {}/{:?}: {why}", case.from, case.name));
        }
    }
    // Every case of these MetalLB tests is translated, except the webhook tests' cases whose
    // verdict a mock forces (see tests/conformance/webhooks.yaml).
    for (from, count) in TRANSLATED {
        let found = cases.iter().filter(|(_, c)| c.from == *from).count();
        assert_eq!(found, *count, "{from} cases translated");
    }
    let unknown: BTreeSet<&str> = cases
        .iter()
        .map(|(_, c)| c.from.as_str())
        .filter(|from| !TRANSLATED.iter().any(|(f, _)| f == from))
        .collect();
    assert!(unknown.is_empty(), "cases from unknown tests: {unknown:?}");
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from MetalLB:\n  {}",
        failures.len(),
        cases.len(),
        failures.join("\n  ")
    );
}
