//! Finding a BGP unnumbered peer (docs/decisions/0020) in real network namespaces: discovery on
//! both ends of a veth with nothing but the kernel's link-local addresses finds the other end;
//! a Router Advertisement that arrives with a hop limit other than 255 (so it may come from off
//! the link, RFC 4861 §6.1.2) is refused and finds nothing; one forged by another host on the
//! link does not take the peer of an Established session (issue #33 item 3).
//!
//! The namespaces hold no lab address at all (link-local only) and are deleted on drop. Needs
//! root (network namespaces); without it the test is reported as ignored, never as passed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::Ipv6Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ferrolb_bgp::adj_out::{AdjRibOut, RouteAttributes};
use ferrolb_bgp::fsm::State;
use ferrolb_config::model::{PeerAsn, PeerTarget};

use ferrolb_layer2::packet::ndp::ALL_NODES;
use ferrolb_layer2::packet::{MacAddr, RouterAdvertisement, router_advertisement};
use ferrolb_speaker::bgp::driver::{DEFAULT_LISTEN, Driver, NoObserver, OnLink, PeerSettings};
use ferrolb_speaker::bgp::unnumbered::Timers;
use ferrolb_speaker::bgp::unnumbered::discovery::{Discovery, Found, Link};
use ferrolb_testkit::frr::{self, Frr};
use ferrolb_testkit::model;
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

/// Issue #33 item 3: another host on the link (here a second link-local address on the
/// router's end) sends valid Router Advertisements, hop limit 255, while the session with the
/// router is Established: the peer stays the router, the forger is only remembered. Once the
/// session has failed for `failed_after`, the link moves to the other advertiser, as it must
/// for a router replaced on the link. Timers shortened to seconds.
fn a_forged_advertisement_does_not_take_an_established_session() {
    let mut lab = netns::Lab::new("flb-t-rd", "forged");
    let (router, ours) = lab.pair(("a", "veth-a", &[]), ("b", "veth-b", &[]));
    let (la, lb) = (link(&router, "veth-a"), link(&ours, "veth-b"));
    let router_ll = la.link_local;
    let advertiser = la.clone();
    let _router = router
        .on_thread(move || Discovery::start(advertiser))
        .unwrap();
    let established = Arc::new(AtomicBool::new(false));
    let timers = Timers {
        failed_after: Duration::from_secs(2),
        fresh: Duration::from_secs(5),
        hold_min: Duration::from_secs(1),
        hold_max: Duration::from_secs(8),
    };
    let session = established.clone();
    let discovery = ours
        .on_thread(move || {
            Discovery::start_following(lb, move || session.load(Ordering::Relaxed), timers)
        })
        .unwrap();
    let found = discovery.found();
    wait_found("we hear the router", &found, |f| f.peer == Some(router_ll));
    established.store(true, Ordering::Relaxed);

    // The forger: valid advertisements from its own link-local address, every 200 ms.
    let forged: Ipv6Addr = "fe80::66".parse().unwrap();
    router.ip(&["-6", "addr", "add", "fe80::66/64", "dev", "veth-a", "nodad"]);
    let message = router_advertisement(
        &RouterAdvertisement::not_a_default_router(MacAddr([2, 0, 0, 0, 0, 0x66])),
        forged,
        ALL_NODES,
    );
    let stop = Arc::new(AtomicBool::new(false));
    let stop_forger = stop.clone();
    let index = la.index;
    let forger = router.thread(move || {
        let s = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6)).unwrap();
        s.bind_device(Some(b"veth-a")).unwrap();
        s.bind(&SockAddr::from(std::net::SocketAddrV6::new(
            forged, 0, 0, index,
        )))
        .unwrap();
        s.set_multicast_hops_v6(255).unwrap();
        s.set_multicast_if_v6(index).unwrap();
        let to = SockAddr::from(std::net::SocketAddrV6::new(ALL_NODES, 0, 0, index));
        let mut sent = 0u32;
        while !stop_forger.load(Ordering::Relaxed) {
            s.send_to(&message, &to).unwrap();
            sent += 1;
            std::thread::sleep(Duration::from_millis(200));
        }
        sent
    });
    wait_found("we hear the forger", &found, |f| {
        f.other == Some(forged) && f.others_heard >= 5
    });
    // Longer than failed_after and the damping hold: the Established session keeps its peer.
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let f = found.borrow().clone();
        assert_eq!(
            (f.peer, f.replacements),
            (Some(router_ll), 0),
            "a forged advertisement took the Established session: {f:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // The session fails: only after failed_after does the link follow the other advertiser.
    established.store(false, Ordering::Relaxed);
    let failed = Instant::now();
    wait_found("the link follows the other advertiser", &found, |f| {
        f.peer == Some(forged)
    });
    let after = failed.elapsed();
    stop.store(true, Ordering::Relaxed);
    assert!(forger.join().unwrap() > 0);
    assert!(
        after >= Duration::from_secs(2),
        "moved {after:?} after the session failed, before failed_after"
    );
    assert_eq!(found.borrow().replacements, 1);
}

/// How long FRR's zebra may take to open its socket.
const ZEBRA_WAIT: Duration = Duration::from_secs(10);

/// FRR's zebra advertising on its end (as bgpd has it do for `neighbor IF interface`): our
/// discovery finds zebra's link-local address, and zebra learns ours from our advertisements,
/// which is what FRR needs before it dials or accepts an unnumbered session.
fn frr_and_discovery_find_each_other() {
    let mut lab = netns::Lab::new("flb-t-rd", "frr");
    let (router, ours) = lab.pair(("r", "veth-r", &[]), ("b", "veth-b", &[]));
    let (lr, lb) = (link(&router, "veth-r"), link(&ours, "veth-b"));
    let frr = Frr::start(
        &mut lab,
        &router,
        &frr::Config {
            zebra: "frr defaults traditional\nhostname r\n!\ninterface veth-r\n ipv6 nd ra-interval 1\n no ipv6 nd suppress-ra\n!\n",
            bgpd: None,
            zebra_wait: ZEBRA_WAIT,
        },
    );
    let (r_ll, b_ll) = (lr.link_local, lb.link_local);
    let db = ours.on_thread(move || Discovery::start(lb)).unwrap();
    wait_found("we hear zebra", &db.found(), |f| f.peer == Some(r_ll));
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let shown = frr.vtysh("show interface veth-r");
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

/// Prefixes the unnumbered session carries (lab ranges, in namespaces of this test only).
const UNNUMBERED_V4: &str = "198.18.200.77";
const UNNUMBERED_V6: &str = "fd00:18::c8:77";

/// Issue #19 item 1 against FRR: `neighbor veth-r interface remote-as external` on a link with
/// nothing but link-local addresses. Discovery finds FRR, the driver runs the session between
/// the link-local addresses with our AS learnt by FRR (`remote-as external`, and our side
/// `dynamicASN: external`), the extended next hop capability is negotiated, and FRR installs
/// the IPv4 prefix in the kernel via our link-local address (RFC 8950) and the IPv6 one too.
fn frr_runs_an_unnumbered_session_with_us() {
    let mut lab = netns::Lab::new("flb-t-rd", "bgp");
    let (router, ours) = lab.pair(("r", "veth-r", &[]), ("b", "veth-b", &[]));
    let (lr, lb) = (link(&router, "veth-r"), link(&ours, "veth-b"));
    let frr = Frr::start(
        &mut lab,
        &router,
        &frr::Config {
            zebra: frr::ZEBRA_CONF,
            bgpd: Some(
                "frr defaults traditional\nhostname r\n!\nrouter bgp 64500\n bgp router-id 198.18.0.254\n \
                 no bgp ebgp-requires-policy\n no bgp default ipv4-unicast\n \
                 neighbor veth-r interface remote-as external\n neighbor veth-r timers 3 9\n \
                 neighbor veth-r timers connect 1\n address-family ipv4 unicast\n  neighbor veth-r activate\n \
                 exit-address-family\n address-family ipv6 unicast\n  neighbor veth-r activate\n \
                 exit-address-family\n!\n",
            ),
            zebra_wait: ZEBRA_WAIT,
        },
    );
    let (r_ll, b_ll) = (lr.link_local, lb.link_local);
    let index = lb.index;
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let (up_tx, up_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let speaker = ours.thread(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let discovery = Discovery::start(lb).unwrap();
            let mut found = discovery.found();
            let peer_ll = tokio::time::timeout(Duration::from_secs(20), async {
                loop {
                    if let Some(p) = found.borrow_and_update().peer {
                        return p;
                    }
                    found.changed().await.unwrap();
                }
            })
            .await
            .expect("FRR not heard on the link");
            let mut peer = model::peer("link", "198.18.0.254")
                .peer_asn(PeerAsn::External)
                .hold_time(Duration::from_secs(9))
                .keepalive_time(Duration::from_secs(3))
                .connect_time(Duration::from_secs(1))
                .router_id("198.18.0.11")
                .build();
            peer.target = PeerTarget::Interface("veth-b".into());
            let settings = PeerSettings::from_peer_on_link(
                &peer,
                OnLink {
                    address: peer_ll,
                    interface_index: index,
                },
                &[],
                None,
            )
            .unwrap();
            let routes: AdjRibOut = [
                (
                    format!("{UNNUMBERED_V4}/32").parse().unwrap(),
                    RouteAttributes::default(),
                ),
                (
                    format!("{UNNUMBERED_V6}/128").parse().unwrap(),
                    RouteAttributes::default(),
                ),
            ]
            .into();
            let mut driver = Driver::new(Arc::new(NoObserver));
            assert!(driver.listen(&DEFAULT_LISTEN).is_empty());
            assert!(
                driver
                    .apply([("link".to_string(), (settings, routes))].into())
                    .is_empty()
            );
            let mut status = driver.watch_status("link").unwrap();
            let up = tokio::time::timeout(Duration::from_secs(40), async {
                while status.borrow_and_update().state != State::Established {
                    status.changed().await.unwrap();
                }
            })
            .await
            .map_err(|_| format!("no session: {:?}", driver.status()));
            up_tx.send(up).unwrap();
            while done_rx.try_recv().is_err() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            driver.shutdown(Duration::from_secs(1)).await;
            drop(discovery);
        });
    });
    let up = up_rx.recv_timeout(Duration::from_secs(90));
    if !matches!(up, Ok(Ok(()))) {
        let _ = done_tx.send(());
        let _ = speaker.join();
        panic!("{up:?}\n{}", frr.vtysh("show bgp neighbors veth-r"));
    }
    let neighbour = frr.vtysh("show bgp neighbors veth-r json");
    assert!(
        neighbour.contains("\"extendedNexthop\":\"advertisedAndReceived\""),
        "extended next hop not negotiated:\n{neighbour}"
    );
    assert!(
        neighbour.contains("\"remoteAs\":64512"),
        "FRR did not learn our AS:\n{neighbour}"
    );
    // The kernel routes: IPv4 via our link-local address (RFC 8950), IPv6 likewise.
    let deadline = Instant::now() + Duration::from_secs(20);
    let want4 = format!("via inet6 {b_ll} dev veth-r");
    let want6 = format!("via {b_ll} dev veth-r");
    loop {
        let v4 = router.ip(&["route", "show", UNNUMBERED_V4]);
        let v6 = router.ip(&["-6", "route", "show", UNNUMBERED_V6]);
        if v4.contains(&want4) && v6.contains(&want6) {
            break;
        }
        if Instant::now() > deadline {
            let _ = done_tx.send(());
            let _ = speaker.join();
            panic!(
                "routes not installed via {b_ll} (router {r_ll}):\n{v4}\n{v6}\n{}",
                frr.vtysh("show bgp ipv4 unicast")
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    done_tx.send(()).unwrap();
    speaker.join().unwrap();
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
            "a_forged_advertisement_does_not_take_an_established_session",
            &["ip"],
            a_forged_advertisement_does_not_take_an_established_session,
        ),
        trial::needs(
            "frr_runs_an_unnumbered_session_with_us",
            &[
                "ip",
                "/usr/lib/frr/zebra",
                "/usr/lib/frr/bgpd",
                "/usr/bin/vtysh",
            ],
            frr_runs_an_unnumbered_session_with_us,
        ),
        trial::needs(
            "frr_and_discovery_find_each_other",
            &["ip", "/usr/lib/frr/zebra", "/usr/bin/vtysh"],
            frr_and_discovery_find_each_other,
        ),
    ])
}
