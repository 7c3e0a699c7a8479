//! Golden files: a command's whole output checked against a file under `e2e/tests/golden/`, so
//! a change in wording, order or content shows up as a diff a reviewer reads, not as a field
//! test that still passes. What differs between runs by nature is masked first: MAC addresses
//! (the lab's veths get random ones), pod addresses (the lowest free one on the node), the pod
//! veths' numbers and the KUBE-SEP chain names made from the addresses (`e2e/tests/explain.rs` checks those against
//! kube-proxy's own chains). `FERROLB_BLESS=1` writes the files instead of checking them.

use std::path::PathBuf;

use anyhow::Context as _;
use regex::Regex;

/// The directory of the golden files.
pub fn dir() -> PathBuf {
    crate::lab::repo_root().join("e2e/tests/golden")
}

/// `text` with what differs between runs masked.
pub fn mask(text: &str) -> String {
    let rules = [
        (r"\b[0-9a-f]{2}(:[0-9a-f]{2}){5}\b", "<mac>"),
        (
            r"\b198\.19\.([0-9]|[1-5][0-9]|6[0-3])\.[0-9]{1,3}\b",
            "198.19.$1.<pod>",
        ),
        (
            r"\bfd00:19:([0-9a-f]{1,4})::[0-9a-f]{1,4}\b",
            "fd00:19:$1::<pod>",
        ),
        (r"\bKUBE-SEP-[A-Z0-9]{16}\b", "KUBE-SEP-<endpoint>"),
        // The host ends of the lab's pod veths, numbered in the order pods were made.
        (r"\bpv[0-9]+\b", "pv<n>"),
    ];
    let mut out = text.to_string();
    for (pattern, with) in rules {
        // The patterns are constants: a bad one fails every golden test at once.
        if let Ok(re) = Regex::new(pattern) {
            out = re.replace_all(&out, with).into_owned();
        }
    }
    out
}

/// Checks `actual` (masked) against golden file `name`, or writes it with `FERROLB_BLESS=1`.
pub fn check(name: &str, actual: &str) -> anyhow::Result<()> {
    let path = dir().join(name);
    let actual = mask(actual);
    if std::env::var_os("FERROLB_BLESS").is_some_and(|v| v == "1") {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, &actual).with_context(|| format!("writing {}", path.display()))?;
        return Ok(());
    }
    let want = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "reading golden file {} (FERROLB_BLESS=1 writes it)",
            path.display()
        )
    })?;
    if want == actual {
        return Ok(());
    }
    anyhow::bail!(
        "output differs from {} (FERROLB_BLESS=1 rewrites it after review):\n{}",
        path.display(),
        diff(&want, &actual)
    )
}

/// The lines that differ, `-` golden and `+` actual, with their line numbers.
fn diff(want: &str, actual: &str) -> String {
    let (w, a): (Vec<&str>, Vec<&str>) = (want.lines().collect(), actual.lines().collect());
    let mut out = String::new();
    for i in 0..w.len().max(a.len()) {
        match (w.get(i), a.get(i)) {
            (Some(x), Some(y)) if x == y => {}
            (x, y) => {
                if let Some(x) = x {
                    out.push_str(&format!("{:>4} - {x}\n", i + 1));
                }
                if let Some(y) = y {
                    out.push_str(&format!("{:>4} + {y}\n", i + 1));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_differs_between_runs_is_masked_and_nothing_else() {
        let text = "on eth0 (MAC 02:ab:00:00:00:01), pv12 -> KUBE-SEP-ABCDEFGHIJKLMNOP -> 198.19.2.10:8080 and [fd00:19:2::a]:8080 via 198.18.200.128 and 198.19.254.10";
        assert_eq!(
            mask(text),
            "on eth0 (MAC <mac>), pv<n> -> KUBE-SEP-<endpoint> -> 198.19.2.<pod>:8080 and [fd00:19:2::<pod>]:8080 via 198.18.200.128 and 198.19.254.10"
        );
    }

    #[test]
    fn a_difference_is_shown_by_line() {
        assert_eq!(diff("a\nb\n", "a\nc\n"), "   2 - b\n   2 + c\n");
    }
}
