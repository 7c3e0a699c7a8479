//! The committed CRD manifests match the Rust types, and their CEL rules compile and behave.
//!
//! Regenerate the manifests with `UPDATE_CRDS=1 cargo test -p ferrolb-config --test crds`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use ferrolb_config::crd::crd_manifests;

fn crd_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../charts/ferrolb/crds")
}

#[test]
fn committed_crds_match_the_types() {
    let manifests = crd_manifests().expect("CRDs render");
    let dir = crd_dir();
    if std::env::var_os("UPDATE_CRDS").is_some() {
        std::fs::create_dir_all(&dir).expect("create crd dir");
        for (file, yaml) in &manifests {
            std::fs::write(dir.join(file), yaml).expect("write crd");
        }
    }
    let mut stale = Vec::new();
    for (file, yaml) in &manifests {
        match std::fs::read_to_string(dir.join(file)) {
            Ok(committed) if &committed == yaml => {}
            Ok(_) => stale.push(format!("{file} differs")),
            Err(e) => stale.push(format!("{file}: {e}")),
        }
    }
    let mut committed: Vec<String> = std::fs::read_dir(&dir)
        .expect("read crd dir")
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    committed.sort();
    let mut generated: Vec<String> = manifests.iter().map(|(f, _)| f.clone()).collect();
    generated.sort();
    assert_eq!(committed, generated, "files in charts/ferrolb/crds");
    assert!(
        stale.is_empty(),
        "CRD manifests are stale ({stale:?}); run `UPDATE_CRDS=1 cargo test -p ferrolb-config --test crds`"
    );
}

#[test]
fn spec_is_optional_where_metallb_leaves_it_optional() {
    // MetalLB's quickstart applies an L2Advertisement with metadata only; the API server must
    // take it and store `spec: {}`, so that readers always find a spec.
    for crd in ferrolb_config::crd::crds().expect("crds") {
        let kind = crd.spec.names.kind.clone();
        let optional = ferrolb_config::crd::KINDS_WITH_OPTIONAL_SPEC.contains(&kind.as_str());
        for version in crd.spec.versions {
            let schema = version
                .schema
                .and_then(|s| s.open_api_v3_schema)
                .expect("schema");
            let required = schema.required.unwrap_or_default();
            let default = schema
                .properties
                .as_ref()
                .and_then(|p| p.get("spec"))
                .and_then(|s| s.default.clone());
            if optional {
                assert!(
                    !required.contains(&"spec".to_string()),
                    "{kind}: {required:?}"
                );
                assert_eq!(default.map(|d| d.0), Some(serde_json::json!({})), "{kind}");
            } else if kind == "IPAddressPool" || kind == "BGPPeer" {
                assert!(
                    required.contains(&"spec".to_string()),
                    "{kind}: {required:?}"
                );
            }
        }
    }
}

mod cel {
    //! The CEL rules, evaluated client-side with kube's CEL engine (the same functions the API
    //! server registers). The lab applies the same manifests to a real API server.

    use ferrolb_config::crd::crds;
    use kube::core::cel::{Validator, compile_schema};
    use serde_json::{Value, json};

    fn schema(plural: &str, version: &str) -> Value {
        let crd = crds()
            .expect("crds")
            .into_iter()
            .find(|c| c.spec.names.plural == plural)
            .expect("crd exists");
        let v = crd
            .spec
            .versions
            .into_iter()
            .find(|v| v.name == version)
            .expect("version exists");
        serde_json::to_value(v.schema.and_then(|s| s.open_api_v3_schema).expect("schema"))
            .expect("json")
    }

    /// Error messages of the rules `spec` breaks (empty when it is accepted).
    fn broken(plural: &str, version: &str, spec: Value, old: Option<Value>) -> Vec<String> {
        let object = json!({"apiVersion": format!("metallb.io/{version}"), "kind": "X", "metadata": {"name": "x", "namespace": "metallb-system"}, "spec": spec});
        let old = old.map(|spec| json!({"apiVersion": "metallb.io/v1beta2", "kind": "X", "metadata": {"name": "x"}, "spec": spec}));
        match Validator::new().validate(&schema(plural, version), &object, old.as_ref()) {
            Ok(()) => Vec::new(),
            Err(errors) => errors.into_vec().into_iter().map(|e| e.message).collect(),
        }
    }

    #[test]
    fn every_rule_compiles() {
        for crd in crds().expect("crds") {
            for version in crd.spec.versions {
                let schema =
                    serde_json::to_value(version.schema.and_then(|s| s.open_api_v3_schema))
                        .expect("json");
                let compiled = compile_schema(&schema);
                assert!(
                    !compiled.has_errors(),
                    "{} {}: {:?}",
                    crd.spec.names.kind,
                    version.name,
                    compiled.compilation_errors()
                );
            }
        }
    }

    fn pool(addresses: &[&str]) -> Vec<String> {
        broken(
            "ipaddresspools",
            "v1beta1",
            json!({"addresses": addresses}),
            None,
        )
    }

    #[test]
    fn pool_addresses_accept_cidrs_and_ranges() {
        let ok: &[&str] = &[
            "198.18.10.0/24",
            "198.18.10.7/32",
            "fd00:10::/64",
            "198.18.11.10-198.18.11.20",
            "198.18.11.30 - 198.18.11.30",
            "fd00:11::10-fd00:11::ff",
        ];
        assert_eq!(pool(ok), Vec::<String>::new());
    }

    #[test]
    fn pool_addresses_reject_bad_syntax_mixed_families_and_reversed_ranges() {
        assert!(pool(&["198.18.10.0/33"])[0].contains("must be a CIDR"));
        assert!(pool(&["not-an-ip"])[0].contains("must be a CIDR"));
        assert!(pool(&["198.18.10.1"])[0].contains("must be a CIDR"));
        assert!(pool(&["198.18.11.10-fd00::1"])[0].contains("same IP family"));
        assert!(pool(&["198.18.11.20-198.18.11.10"])[0].contains("must not be after"));
    }

    fn peer(spec: Value) -> Vec<String> {
        broken("bgppeers", "v1beta2", spec, None)
    }

    #[test]
    fn peer_accepts_a_documented_manifest() {
        assert_eq!(
            peer(
                json!({"myASN": 64500, "peerASN": 64501, "peerAddress": "198.18.0.1", "holdTime": "90s", "keepaliveTime": "30s", "routerID": "198.18.0.10"})
            ),
            Vec::<String>::new()
        );
        assert_eq!(
            peer(json!({"myASN": 64500, "dynamicASN": "external", "interface": "eth0"})),
            Vec::<String>::new()
        );
    }

    #[test]
    fn peer_rejects_exclusive_fields_and_bad_timers() {
        let base = |extra: Value| {
            let mut spec = json!({"myASN": 64500, "peerASN": 64501, "peerAddress": "198.18.0.1"});
            for (k, v) in extra.as_object().expect("object") {
                spec[k] = v.clone();
            }
            peer(spec)
        };
        assert!(
            base(json!({"dynamicASN": "internal"}))
                .iter()
                .any(|m| m.contains("peerASN and dynamicASN"))
        );
        assert!(
            base(json!({"interface": "eth0"}))
                .iter()
                .any(|m| m.contains("peerAddress and interface"))
        );
        assert!(
            base(json!({"password": "a", "passwordSecret": {"name": "s"}}))
                .iter()
                .any(|m| m.contains("password and passwordSecret"))
        );
        assert!(
            base(json!({"holdTime": "2s"}))
                .iter()
                .any(|m| m.contains("holdTime must be 0 or at least 3s"))
        );
        assert_eq!(base(json!({"holdTime": "0s"})), Vec::<String>::new());
        assert!(
            base(json!({"holdTime": "9s", "keepaliveTime": "10s"}))
                .iter()
                .any(|m| m.contains("keepaliveTime must not exceed"))
        );
        assert!(
            base(json!({"connectTime": "0s"}))
                .iter()
                .any(|m| m.contains("connectTime"))
        );
        assert!(
            base(json!({"routerID": "fd00::1"}))
                .iter()
                .any(|m| m.contains("IPv4 address"))
        );
        assert!(
            base(json!({"peerAddress": "198.18.0.300"}))
                .iter()
                .any(|m| m.contains("IPv4 or IPv6"))
        );
        let ibgp = peer(
            json!({"myASN": 64500, "peerASN": 64500, "peerAddress": "198.18.0.1", "ebgpMultiHop": true}),
        );
        assert!(ibgp.iter().any(|m| m.contains("ebgpMultiHop")), "{ibgp:?}");
    }

    #[test]
    fn graceful_restart_is_immutable() {
        let old = json!({"myASN": 64500, "peerASN": 64501, "peerAddress": "198.18.0.1", "enableGracefulRestart": false});
        let new = json!({"myASN": 64500, "peerASN": 64501, "peerAddress": "198.18.0.1", "enableGracefulRestart": true});
        let errors = broken("bgppeers", "v1beta2", new, Some(old.clone()));
        assert!(
            errors.iter().any(|m| m.contains("cannot be changed")),
            "{errors:?}"
        );
        assert_eq!(
            broken("bgppeers", "v1beta2", old.clone(), Some(old)),
            Vec::<String>::new()
        );
    }

    #[test]
    fn community_values_and_duplicate_aliases() {
        let c = |list: Value| broken("communities", "v1beta1", json!({"communities": list}), None);
        assert_eq!(
            c(
                json!([{"name": "a", "value": "65535:65282"}, {"name": "b", "value": "large:1:2:3"}])
            ),
            Vec::<String>::new()
        );
        assert!(
            c(json!([{"name": "a", "value": "65536:1"}]))
                .iter()
                .any(|m| m.contains("at most 65535"))
        );
        assert!(
            c(json!([{"name": "a", "value": "large:4294967296:1:1"}]))
                .iter()
                .any(|m| m.contains("4294967295"))
        );
    }

    #[test]
    fn community_aliases_are_a_list_map_keyed_by_name() {
        // The API server refuses a repeated key of a list map itself, at no CEL cost (a CEL
        // uniqueness rule exceeded the API server's cost budget).
        let schema = schema("communities", "v1beta1");
        let list = &schema["properties"]["spec"]["properties"]["communities"];
        assert_eq!(list["x-kubernetes-list-type"], "map");
        assert_eq!(list["x-kubernetes-list-map-keys"], json!(["name"]));
        assert!(list["maxItems"].as_u64().is_some_and(|n| n <= 256));
    }

    #[test]
    fn bgp_advertisement_service_selectors_need_default_aggregation() {
        let a = |spec: Value| broken("bgpadvertisements", "v1beta1", spec, None);
        assert_eq!(
            a(json!({"serviceSelectors": [{"matchLabels": {"a": "b"}}]})),
            Vec::<String>::new()
        );
        assert!(
            !a(json!({"aggregationLength": 24, "serviceSelectors": [{"matchLabels": {"a": "b"}}]}))
                .is_empty()
        );
    }
}
