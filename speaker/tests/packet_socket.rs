//! The AF_PACKET socket in real network namespaces: a responder on our end of a veth answers
//! arping and ndisc6 on the other, defends an address against DAD, and sees nothing but requests
//! from the other end (not its own frames, not other traffic).
//!
//! The namespaces use the lab's ranges only (198.19.78.0/24, fd00:78::/64). Needs root (network
//! namespaces) and arping and ndisc6 (`e2e/install-deps`); without them the test is reported as
//! ignored, never as passed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ferrolb_layer2::packet::{
    self, MacAddr, Request, arp_reply, gratuitous_arp_request, neighbor_advertisement,
    solicited_node_multicast,
};
use ferrolb_speaker::l2::socket::{MulticastMembership, PacketSocket};
use ferrolb_testkit::netns::{self, Netns};
use ferrolb_testkit::trial;

/// Two network namespaces of this test's own joined by a veth pair: the client's `veth-a`
/// (02:00:00:00:00:0a, 198.19.78.1/24, fd00:78::1/64) and our `veth-b` (02:00:00:00:00:0b, no
/// addresses); both are deleted on drop, so also when the test fails.
struct Lab {
    _lab: netns::Lab,
    client: Netns,
    ours: Netns,
}

impl Lab {
    fn create() -> Lab {
        let mut lab = netns::Lab::new("flb-t-sock", "l2");
        let (client, ours) = lab.pair(
            ("a", "veth-a", &["198.19.78.1", "fd00:78::1"]),
            ("b", "veth-b", &[]),
        );
        client.ip(&["link", "set", "veth-a", "address", "02:00:00:00:00:0a"]);
        ours.ip(&["link", "set", "veth-b", "address", "02:00:00:00:00:0b"]);
        Lab {
            _lab: lab,
            client,
            ours,
        }
    }

    fn ifindex_of_ours(&self) -> u32 {
        let out = self.ours.ip(&["-o", "link", "show", "veth-b"]);
        out.split(':').next().unwrap().trim().parse().unwrap()
    }

    /// Runs `f` on a thread inside our namespace: sockets it opens stay there.
    fn in_ours<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        self.ours.on_thread(f)
    }

    fn client_runs(&self, program: &str, args: &[&str]) -> (bool, String) {
        let out = self.client.output(program, args);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }
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

/// A responder on our end of a veth answers arping and ndisc6 on the other, defends an address
/// against DAD, and sees nothing but requests from the other end (not its own frames, not other
/// traffic). `main` runs it only with root and both tools.
fn answers_arping_and_ndisc6_in_network_namespaces() {
    let lab = Lab::create();
    const OURS: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x0b]);
    const CLIENT: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x0a]);
    let vip4 = Ipv4Addr::new(198, 19, 78, 99);
    let vip6: Ipv6Addr = "fd00:78::99".parse().unwrap();
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
    let maddr = || lab.ours.ip(&["-6", "maddr", "show", "dev", "veth-b"]);
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
        &["-c", "1", "-w", "3", "-I", "veth-a", "198.19.78.99"],
    );
    assert!(ok, "arping got no reply: {out}");
    let (ok, out) = lab.client_runs(
        "ndisc6",
        &["-1", "-r", "3", "-w", "1000", "fd00:78::99", "veth-a"],
    );
    assert!(ok && out.contains("02:00:00:00:00:0B"), "ndisc6: {out}");
    // The client's kernel resolves both addresses through us (a UDP datagram makes it
    // ask; the datagram itself, unicast to our MAC, must not pass the filter), and loses
    // DAD for vip6.
    for vip in ["198.19.78.99", "fd00:78::99"] {
        let send = format!("echo > /dev/udp/{vip}/9");
        lab.client_runs("bash", &["-c", &send]);
    }
    let neighbours = || lab.client.ip(&["neigh", "show", "dev", "veth-a"]);
    let resolved = wait_for(|| {
        let n = neighbours();
        n.contains("198.19.78.99 lladdr 02:00:00:00:00:0b")
            && n.contains("fd00:78::99 lladdr 02:00:00:00:00:0b")
    });
    assert!(resolved, "{}", neighbours());
    // With duplicate address detection (not `add_address`, which skips it).
    lab.client
        .ip(&["addr", "add", "fd00:78::99/64", "dev", "veth-a"]);
    let dad_failed = wait_for(|| {
        lab.client
            .ip(&["-6", "addr", "show", "dev", "veth-a"])
            .contains("dadfailed")
    });
    assert!(
        dad_failed,
        "the client took fd00:78::99 despite our defence"
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
    trial::run(vec![trial::needs(
        "answers_arping_and_ndisc6_in_network_namespaces",
        &["arping", "ndisc6"],
        answers_arping_and_ndisc6_in_network_namespaces,
    )])
}
