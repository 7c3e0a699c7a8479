//! Finding a BGP unnumbered peer (docs/decisions/0020) in real network namespaces: discovery on
//! both ends of a veth with nothing but the kernel's link-local addresses finds the other end;
//! a Router Advertisement that arrives with a hop limit other than 255 (so it may come from off
//! the link, RFC 4861 §6.1.2) is refused and finds nothing.
//!
//! The namespaces hold no lab address at all (link-local only) and are deleted on drop. Needs
//! root (network namespaces); without it the test is reported as ignored, never as passed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::Ipv6Addr;
use std::time::{Duration, Instant};

use ferrolb_layer2::packet::ndp::ALL_NODES;
use ferrolb_layer2::packet::{MacAddr, RouterAdvertisement, router_advertisement};
use ferrolb_speaker::bgp::driver::discovery::{Discovery, Found, Link};
use ferrolb_testkit::netns::{self, Netns};
use ferrolb_testkit::trial;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// `ifname` in `ns` once its link-local address is usable (not tentative).
fn link(ns: &Netns, ifname: &str) -> Link {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = ns.ip(&["-6", "-o", "addr", "show", "dev", ifname, "scope", "link"]);
        if let Some(addr) = out
            .split_whitespace()
            .skip_while(|w| *w != "inet6")
            .nth(1)
            .filter(|_| !out.contains("tentative"))
        {
            let link_local: Ipv6Addr = addr.split('/').next().unwrap().parse().unwrap();
            let shown = ns.ip(&["-o", "link", "show", ifname]);
            let index: u32 = shown.split(':').next().unwrap().trim().parse().unwrap();
            let mac = shown
                .split_whitespace()
                .skip_while(|w| *w != "link/ether")
                .nth(1)
                .unwrap();
            let octets: Vec<u8> = mac
                .split(':')
                .map(|h| u8::from_str_radix(h, 16).unwrap())
                .collect();
            return Link {
                name: ifname.to_string(),
                index,
                mac: MacAddr(octets.try_into().unwrap()),
                link_local,
            };
        }
        assert!(
            Instant::now() < deadline,
            "{ifname}: no usable link-local address: {out}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn wait_found(
    what: &str,
    found: &tokio::sync::watch::Receiver<Found>,
    want: impl Fn(&Found) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !want(&found.borrow()) {
        assert!(
            Instant::now() < deadline,
            "{what}: found {:?}",
            *found.borrow()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn each_end_finds_the_other() {
    let mut lab = netns::Lab::new("flb-t-rd", "peers");
    let (a, b) = lab.pair(("a", "veth-a", &[]), ("b", "veth-b", &[]));
    let (la, lb) = (link(&a, "veth-a"), link(&b, "veth-b"));
    let (a_ll, b_ll) = (la.link_local, lb.link_local);
    let da = a.on_thread(move || Discovery::start(la)).unwrap();
    let db = b.on_thread(move || Discovery::start(lb)).unwrap();
    wait_found("a hears b", &da.found(), |f| f.peer == Some(b_ll));
    wait_found("b hears a", &db.found(), |f| f.peer == Some(a_ll));
    assert_eq!(da.found().borrow().replacements, 0);
    drop(da);
    drop(db);
}

fn an_advertisement_not_sent_with_hop_limit_255_is_refused() {
    let mut lab = netns::Lab::new("flb-t-rd", "hops");
    let (a, b) = lab.pair(("a", "veth-a", &[]), ("b", "veth-b", &[]));
    let (la, lb) = (link(&a, "veth-a"), link(&b, "veth-b"));
    let db = b.on_thread(move || Discovery::start(lb)).unwrap();
    // From a's link-local address, as a router off the link could not: but with hop limit 64.
    let message = router_advertisement(
        &RouterAdvertisement::not_a_default_router(la.mac),
        la.link_local,
        ALL_NODES,
    );
    a.on_thread(move || {
        let s = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6)).unwrap();
        s.bind_device(Some(la.name.as_bytes())).unwrap();
        s.set_multicast_hops_v6(64).unwrap();
        s.set_multicast_if_v6(la.index).unwrap();
        let to = SockAddr::from(std::net::SocketAddrV6::new(ALL_NODES, 0, 0, la.index));
        for _ in 0..3 {
            s.send_to(&message, &to).unwrap();
        }
    });
    wait_found(
        "b refuses a's hop-limit-64 advertisements",
        &db.found(),
        |f| f.refused >= 3,
    );
    assert_eq!(db.found().borrow().peer, None);
}

/// FRR's zebra advertising on its end (as bgpd has it do for `neighbor IF interface`): our
/// discovery finds zebra's link-local address, and zebra learns ours from our advertisements,
/// which is what FRR needs before it dials or accepts an unnumbered session.
fn frr_and_discovery_find_each_other() {
    let mut lab = netns::Lab::new("flb-t-rd", "frr");
    let (router, ours) = lab.pair(("r", "veth-r", &[]), ("b", "veth-b", &[]));
    let (lr, lb) = (link(&router, "veth-r"), link(&ours, "veth-b"));
    let d = lab.dir().display().to_string();
    std::fs::write(
        lab.dir().join("zebra.conf"),
        "frr defaults traditional\nhostname r\n!\ninterface veth-r\n ipv6 nd ra-interval 1\n no ipv6 nd suppress-ra\n!\n",
    )
    .unwrap();
    netns::run("chown", &["-R", "frr:frr", &d]);
    let pathspace = router.name().to_string();
    let conf = format!("{d}/zebra.conf");
    let pid = format!("{d}/zebra.pid");
    let api = format!("{d}/zserv.api");
    lab.spawn(
        &router,
        "/usr/lib/frr/zebra",
        &[
            "-N",
            &pathspace,
            "-f",
            &conf,
            "-i",
            &pid,
            "-z",
            &api,
            "--vty_socket",
            &d,
        ],
    );
    let (r_ll, b_ll) = (lr.link_local, lb.link_local);
    let db = ours.on_thread(move || Discovery::start(lb)).unwrap();
    wait_found("we hear zebra", &db.found(), |f| f.peer == Some(r_ll));
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let shown = router.stdout(
            "vtysh",
            &["--vty_socket", &d, "-c", "show interface veth-r"],
        );
        if shown.contains(&b_ll.to_string()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "zebra did not learn our {b_ll}:\n{shown}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn main() -> std::process::ExitCode {
    trial::run(vec![
        trial::needs(
            "each_end_finds_the_other",
            &["ip"],
            each_end_finds_the_other,
        ),
        trial::needs(
            "an_advertisement_not_sent_with_hop_limit_255_is_refused",
            &["ip"],
            an_advertisement_not_sent_with_hop_limit_255_is_refused,
        ),
        trial::needs(
            "frr_and_discovery_find_each_other",
            &["ip", "/usr/lib/frr/zebra", "/usr/bin/vtysh"],
            frr_and_discovery_find_each_other,
        ),
    ])
}
