//! The AF_PACKET socket in real network namespaces: a responder on our end of a veth answers
//! arping and ndisc6 on the other, defends an address against DAD, and sees nothing but requests
//! from the other end (not its own frames, not other traffic).
//!
//! Needs root (network namespaces) and arping and ndisc6 (`e2e/install-deps`); without them the
//! test is reported as ignored, never as passed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ferrolb_layer2::packet::{
    self, MacAddr, Request, arp_reply, gratuitous_arp_request, neighbor_advertisement,
    solicited_node_multicast,
};
use ferrolb_speaker::l2::socket::{MulticastMembership, PacketSocket};

/// Two network namespaces of this test's own joined by a veth pair; both are deleted on
/// drop, so also when the test fails.
struct Lab {
    client: String,
    ours: String,
}

impl Lab {
    /// `None` when namespaces cannot be made (not root, say).
    fn create() -> Option<Lab> {
        let pid = std::process::id();
        let client = format!("flb-t-sock-{pid}-a");
        let ours = format!("flb-t-sock-{pid}-b");
        if !ip(&["netns", "add", &client]) {
            return None;
        }
        let lab = Lab { client, ours };
        if !ip(&["netns", "add", &lab.ours]) {
            return None;
        }
        let (a, b) = (lab.client.as_str(), lab.ours.as_str());
        for args in [
            &[
                "link", "add", "veth-a", "netns", a, "type", "veth", "peer", "name", "veth-b",
                "netns", b,
            ][..],
            &[
                "-n",
                a,
                "link",
                "set",
                "veth-a",
                "address",
                "02:00:00:00:00:0a",
            ],
            &[
                "-n",
                b,
                "link",
                "set",
                "veth-b",
                "address",
                "02:00:00:00:00:0b",
            ],
            &["-n", a, "addr", "add", "192.0.2.1/24", "dev", "veth-a"],
            &[
                "-n",
                a,
                "addr",
                "add",
                "2001:db8::1/64",
                "dev",
                "veth-a",
                "nodad",
            ],
            &["-n", a, "link", "set", "veth-a", "up"],
            &["-n", b, "link", "set", "veth-b", "up"],
        ] {
            assert!(ip(args), "ip {args:?}");
        }
        Some(lab)
    }

    fn ifindex_of_ours(&self) -> u32 {
        let out = output("ip", &["-n", &self.ours, "-o", "link", "show", "veth-b"]);
        out.split(':').next().unwrap().trim().parse().unwrap()
    }

    /// Runs `f` on a thread inside our namespace: sockets it opens stay there.
    fn in_ours<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let netns = std::fs::File::open(format!("/run/netns/{}", self.ours)).unwrap();
        std::thread::spawn(move || {
            nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            f()
        })
        .join()
        .unwrap()
    }

    fn client_runs(&self, program: &str, args: &[&str]) -> (bool, String) {
        let mut all = vec!["netns", "exec", self.client.as_str(), program];
        all.extend_from_slice(args);
        let out = Command::new("ip").args(&all).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        ip(&["netns", "del", &self.client]);
        ip(&["netns", "del", &self.ours]);
    }
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

fn output(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Polls `condition` for up to five seconds.
fn wait_for(condition: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !condition() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    true
}

fn installed(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A responder on our end of a veth answers arping and ndisc6 on the other, defends an address
/// against DAD, and sees nothing but requests from the other end (not its own frames, not other
/// traffic). `main` runs it only with root and both tools.
fn answers_arping_and_ndisc6_in_network_namespaces() {
    let lab = Lab::create().expect("network namespaces (root is checked by main)");
    const OURS: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x0b]);
    const CLIENT: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x0a]);
    let vip4 = Ipv4Addr::new(192, 0, 2, 99);
    let vip6: Ipv6Addr = "2001:db8::99".parse().unwrap();
    let group = solicited_node_multicast(vip6);

    let ifindex = lab.ifindex_of_ours();
    let (socket, mut membership) = lab.in_ours(move || {
        (
            PacketSocket::open(ifindex).unwrap(),
            MulticastMembership::new(ifindex).unwrap(),
        )
    });
    assert_eq!(socket.ifindex(), ifindex);
    membership.join(group).unwrap();
    membership.join(group).unwrap();
    let maddr = || {
        output(
            "ip",
            &["-n", &lab.ours, "-6", "maddr", "show", "dev", "veth-b"],
        )
    };
    assert!(maddr().contains("ff02::1:ff00:99"), "{}", maddr());

    let socket = Arc::new(socket);
    socket.set_recv_timeout(Duration::from_millis(50)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let responder = {
        let (socket, stop) = (Arc::clone(&socket), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            let mut buf = [0u8; 2048];
            while !stop.load(Ordering::Relaxed) {
                let Some(len) = socket.recv(&mut buf).unwrap() else {
                    continue;
                };
                let request = packet::parse(&buf[..len]);
                let reply = match &request {
                    Ok(Some(Request::Arp(r))) if r.target_ip == vip4 => Some(arp_reply(r, OURS)),
                    Ok(Some(Request::NeighborSolicitation(ns))) if ns.target == vip6 => {
                        Some(neighbor_advertisement(ns, OURS, vip6))
                    }
                    _ => None,
                };
                if let Some(reply) = reply {
                    socket.send(&reply).unwrap();
                }
                seen.push(request);
            }
            seen
        })
    };
    // Our own announcement goes out but must not come back in.
    socket.send(&gratuitous_arp_request(OURS, vip4)).unwrap();

    let (ok, out) = lab.client_runs(
        "arping",
        &["-c", "1", "-w", "3", "-I", "veth-a", "192.0.2.99"],
    );
    assert!(ok, "arping got no reply: {out}");
    let (ok, out) = lab.client_runs(
        "ndisc6",
        &["-1", "-r", "3", "-w", "1000", "2001:db8::99", "veth-a"],
    );
    assert!(ok && out.contains("02:00:00:00:00:0B"), "ndisc6: {out}");
    // The client's kernel resolves both addresses through us (a UDP datagram makes it
    // ask; the datagram itself, unicast to our MAC, must not pass the filter), and loses
    // DAD for vip6.
    for vip in ["192.0.2.99", "2001:db8::99"] {
        let send = format!("echo > /dev/udp/{vip}/9");
        lab.client_runs("bash", &["-c", &send]);
    }
    let neighbours = || output("ip", &["-n", &lab.client, "neigh", "show", "dev", "veth-a"]);
    let resolved = wait_for(|| {
        let n = neighbours();
        n.contains("192.0.2.99 lladdr 02:00:00:00:00:0b")
            && n.contains("2001:db8::99 lladdr 02:00:00:00:00:0b")
    });
    assert!(resolved, "{}", neighbours());
    let add = [
        "-n",
        &lab.client,
        "addr",
        "add",
        "2001:db8::99/64",
        "dev",
        "veth-a",
    ];
    assert!(ip(&add));
    let dad_failed = wait_for(|| {
        output(
            "ip",
            &["-n", &lab.client, "-6", "addr", "show", "dev", "veth-a"],
        )
        .contains("dadfailed")
    });
    assert!(
        dad_failed,
        "the client took 2001:db8::99 despite our defence"
    );

    stop.store(true, Ordering::Relaxed);
    let seen = responder.join().unwrap();
    let targets: Vec<IpAddr> = seen
        .iter()
        .map(|r| match r {
            Ok(Some(request)) => {
                assert_eq!(request.eth_source(), CLIENT, "{request:?}");
                request.target()
            }
            other => panic!("the filter passed {other:?}"),
        })
        .collect();
    assert!(targets.contains(&IpAddr::V4(vip4)), "{targets:?}");
    assert!(targets.contains(&IpAddr::V6(vip6)), "{targets:?}");

    membership.leave(group).unwrap();
    assert!(membership.is_joined(group));
    membership.leave(group).unwrap();
    assert!(!membership.is_joined(group));
    assert!(!maddr().contains("ff02::1:ff00:99"), "{}", maddr());
}

fn main() -> std::process::ExitCode {
    let args = libtest_mimic::Arguments::from_args();
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    let unmet = if !root {
        Some("needs root (network namespaces)".to_string())
    } else {
        ["arping", "ndisc6"]
            .into_iter()
            .find(|p| !installed(p))
            .map(|p| format!("{p} is not installed (e2e/install-deps)"))
    };
    const NAME: &str = "answers_arping_and_ndisc6_in_network_namespaces";
    if let Some(reason) = &unmet {
        eprintln!("{NAME} is reported as ignored: {reason}");
    }
    let trial = libtest_mimic::Trial::test(NAME, || {
        std::panic::catch_unwind(answers_arping_and_ndisc6_in_network_namespaces).map_err(|panic| {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panicked".to_string());
            libtest_mimic::Failed::from(message)
        })
    })
    .with_ignored_flag(unmet.is_some());
    libtest_mimic::run(&args, vec![trial]).exit_code()
}
