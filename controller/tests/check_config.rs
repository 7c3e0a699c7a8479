//! The `check-config` command as operators run it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn manifests() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/tests/manifests")
}

fn run(args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferrolb-controller"))
        .arg("check-config")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start ferrolb-controller");
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().expect("wait");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn valid_manifests_print_valid_and_exit_zero() {
    let l2 = manifests().join("metallb-docs-l2.yaml");
    let bgp = manifests().join("metallb-docs-bgp.yaml");
    let (code, out, err) = run(&[l2.to_str().unwrap(), bgp.to_str().unwrap()], None);
    assert_eq!((code, out.as_str()), (0, "valid\n"), "stderr: {err}");
    assert!(
        err.contains("warning: BGPPeer metallb-system/sample: spec.passwordSecret"),
        "{err}"
    );
}

#[test]
fn errors_print_one_line_each_and_exit_one() {
    let yaml = "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: p}\nspec: {addresses: [198.18.0.0/33]}\n---\napiVersion: metallb.io/v1beta2\nkind: BGPPeer\nmetadata: {name: q}\nspec: {myASN: 64500, peerAddress: 198.18.0.1}\n";
    let (code, out, _) = run(&["-"], Some(yaml));
    assert_eq!(code, 1);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(lines.contains(&"BGPPeer metallb-system/q: spec.peerASN: set either peerASN or dynamicASN (internal or external)"));
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("IPAddressPool metallb-system/p: spec.addresses[0]: "))
    );
}

#[test]
fn namespace_option_places_objects() {
    let yaml = "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: p, namespace: lb}\nspec: {addresses: [198.18.0.0/24]}\n";
    let (code, out, err) = run(&["--namespace", "lb", "-"], Some(yaml));
    assert_eq!((code, out.as_str(), err.as_str()), (0, "valid\n", ""));
    let (code, _, err) = run(&["-"], Some(yaml));
    assert_eq!(code, 0);
    assert!(
        err.contains("IPAddressPool lb/p: metadata.namespace: ignored"),
        "{err}"
    );
}

#[test]
fn unreadable_file_exits_two_with_the_path() {
    let (code, _, err) = run(&["/nonexistent/ferrolb.yaml"], None);
    assert_eq!(code, 2);
    assert!(err.contains("reading /nonexistent/ferrolb.yaml"), "{err}");
}
