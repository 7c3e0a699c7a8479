//! The namespace lab itself, in real namespaces: needs root (reported as ignored otherwise,
//! never as passed).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;

use ferrolb_testkit::netns::{KEEP_ENV, Lab, run};
use ferrolb_testkit::trial;

/// Two namespaces joined by a veth pair reach each other over IPv4 and IPv6 (a listener in
/// one, a connection from the other); a process lives in one of them; after the drop the
/// namespaces, the process and the directory are gone.
fn a_lab_joins_two_namespaces_and_removes_everything_on_drop() {
    let mut lab = Lab::new("flbkit", "selftest");
    let (a, b) = (lab.namespace("a"), lab.namespace("b"));
    lab.veth((&a, "a0"), (&b, "b0"));
    a.add_address("a0", "198.19.79.1");
    a.add_address("a0", "fd00:79::1");
    b.add_address("b0", "198.19.79.2");
    b.add_address("b0", "fd00:79::2");
    let sleeper = lab.spawn(&b, "sleep", &["600"]);
    assert_eq!(b.pids(), vec![sleeper]);
    for peer in ["198.19.79.2", "fd00:79::2"] {
        let listener = b.on_thread(move || std::net::TcpListener::bind((peer, 0)).unwrap());
        let port = listener.local_addr().unwrap().port();
        let connect = move || std::net::TcpStream::connect((peer, port)).map(|_| ());
        a.on_thread(connect).unwrap();
    }
    // The test's own namespace has no such address.
    assert!(std::net::TcpListener::bind("198.19.79.2:0").is_err());
    let panic = std::panic::catch_unwind(|| a.on_thread(|| panic!("inside"))).unwrap_err();
    assert_eq!(trial::panic_message(&*panic), "inside");
    let dir = lab.dir().to_path_buf();
    assert!(dir.is_dir());
    let names = [a.name().to_string(), b.name().to_string()];
    drop(lab);
    let list = run("ip", &["netns", "list"]);
    for n in &names {
        assert!(
            !list.lines().any(|l| l.split_whitespace().next() == Some(n)),
            "{n} is left: {list}"
        );
    }
    assert!(!Path::new(&format!("/proc/{sleeper}")).exists());
    if KEEP_ENV.iter().all(|k| std::env::var_os(k).is_none()) {
        assert!(!dir.exists());
    }
}

fn main() -> std::process::ExitCode {
    trial::run(vec![trial::needs(
        "a_lab_joins_two_namespaces_and_removes_everything_on_drop",
        &["ip", "sleep"],
        a_lab_joins_two_namespaces_and_removes_everything_on_drop,
    )])
}
