//! Finding a BGP unnumbered peer on its link (docs/decisions/0020-bgp-unnumbered.md): a raw
//! ICMPv6 socket bound to the interface sends our Router Advertisements (lifetime 0: FRR learns
//! its neighbour only from RAs, and we must be nobody's default router) and one Router
//! Solicitation, answers solicitations, and hears the link-local source of every valid Router
//! Advertisement. Which of them is the peer, given the session's state, is [`super::Follow`]'s
//! rule; the messages are in `ferrolb_layer2::packet::router_discovery`.

use std::io::{self, IoSliceMut};
use std::net::Ipv6Addr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferrolb_layer2::packet::MacAddr;
use ferrolb_layer2::packet::ndp::ALL_NODES;
use ferrolb_layer2::packet::router_discovery::{
    ALL_ROUTERS, Envelope, RouterAdvertisement, RouterDiscovery, RouterSolicitation,
    parse_router_discovery, router_advertisement, router_solicitation,
};
use nix::sys::socket::{self as nix_socket, ControlMessageOwned, MsgFlags, SockaddrIn6};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use tokio::sync::watch;

use super::{Follow, Heard, Schedule, Timers};

/// The link a peer is looked for on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    /// Interface name (BGPPeer `interface`).
    pub name: String,
    /// Its index (the scope of link-local addresses).
    pub index: u32,
    /// Its MAC address, in our advertisements' Source Link-Layer Address option.
    pub mac: MacAddr,
    /// Our link-local address on it: the source of what we send, the address FRR then dials
    /// and accepts.
    pub link_local: Ipv6Addr,
}

/// What discovery found so far on a link.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Found {
    /// The peer's link-local address, once an advertisement was heard.
    pub peer: Option<Ipv6Addr>,
    /// How often the peer changed (each time after its session failed).
    pub replacements: u32,
    /// The latest advertiser other than the peer: a second router on a link meant to be point
    /// to point, or a host forging advertisements. Followed only should the session fail.
    pub other: Option<Ipv6Addr>,
    /// Advertisements heard from other sources than the peer.
    pub others_heard: u64,
    /// Messages dropped by the RFC 4861 checks (wrong hop limit, bad checksum, ...).
    pub refused: u64,
}

/// Longest a receive waits, so a dropped [`Discovery`] stops within it.
const POLL: Duration = Duration::from_millis(250);

/// Discovery running on one link, on a thread of its own (as the layer 2 responders), until
/// dropped.
pub struct Discovery {
    found: watch::Receiver<Found>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Discovery {
    /// Opens the socket on `link` (in the calling thread's network namespace) and starts
    /// advertising and listening, with a session that is never Established: the first
    /// advertiser is the peer, another one only after [`super::FAILED_AFTER`].
    pub fn start(link: Link) -> io::Result<Discovery> {
        Self::start_following(link, || false, Timers::default())
    }

    /// As [`Discovery::start`], with the state of the link's session: `established` is asked
    /// a few times a second and keeps the peer while it says so ([`Follow`]'s rule, with
    /// `timers`).
    pub fn start_following(
        link: Link,
        established: impl Fn() -> bool + Send + 'static,
        timers: Timers,
    ) -> io::Result<Discovery> {
        let socket = open(&link)?;
        let (tx, found) = watch::channel(Found::default());
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("discovery-{}", link.name))
            .spawn(move || {
                run(
                    &socket,
                    &link,
                    &tx,
                    &flag,
                    &established,
                    Follow::new(timers),
                );
            })?;
        Ok(Discovery {
            found,
            stop,
            thread: Some(thread),
        })
    }

    /// What was found, updated as advertisements arrive.
    pub fn found(&self) -> watch::Receiver<Found> {
        self.found.clone()
    }
}

impl Drop for Discovery {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The raw ICMPv6 socket of `link`: bound to it, hop limit 255 both ways (RFC 4861 §6.1 makes
/// receivers drop anything else), the received hop limit and destination reported, joined to
/// all-routers so solicitations arrive, our own multicast not looped back.
fn open(link: &Link) -> io::Result<Socket> {
    let socket = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6))?;
    socket.bind_device(Some(link.name.as_bytes()))?;
    socket.set_multicast_hops_v6(255)?;
    socket.set_unicast_hops_v6(255)?;
    socket.set_multicast_if_v6(link.index)?;
    socket.set_multicast_loop_v6(false)?;
    socket.join_multicast_v6(&ALL_ROUTERS, link.index)?;
    nix_socket::setsockopt(&socket, nix_socket::sockopt::Ipv6RecvHopLimit, &true)?;
    nix_socket::setsockopt(&socket, nix_socket::sockopt::Ipv6RecvPacketInfo, &true)?;
    socket.set_read_timeout(Some(POLL))?;
    Ok(socket)
}

/// Least time between two log lines about advertisers that are not followed: a host forging
/// advertisements from ever new addresses must not flood the log.
const OTHER_LOG_INTERVAL: Duration = Duration::from_secs(60);

fn run(
    socket: &Socket,
    link: &Link,
    tx: &watch::Sender<Found>,
    stop: &AtomicBool,
    established: &dyn Fn() -> bool,
    mut follow: Follow,
) {
    // Every line of this thread is about its link: the span names it once (at ERROR level so
    // that it is enabled whenever a line inside is).
    let _link = tracing::error_span!("unnumbered_link", interface = %link.name).entered();
    let ra = RouterAdvertisement::not_a_default_router(link.mac);
    let advertisement = router_advertisement(&ra, link.link_local, ALL_NODES);
    let solicitation = router_solicitation(
        &RouterSolicitation {
            source_link_addr: Some(link.mac),
        },
        link.link_local,
        ALL_ROUTERS,
    );
    let advertise = |why: &str| {
        if let Err(e) = send(socket, &advertisement, ALL_NODES, link.index) {
            tracing::warn!(error = %e, why, "router advertisement not sent");
        }
    };
    // One solicitation gets FRR's advertisement now rather than within its 10 s.
    if let Err(e) = send(socket, &solicitation, ALL_ROUTERS, link.index) {
        tracing::warn!(error = %e, "router solicitation not sent");
    }
    let mut schedule = Schedule::new(Instant::now());
    let mut buf = vec![0u8; 1500];
    let mut other_logged: Option<Instant> = None;
    let publish = |follow: &Follow| {
        tx.send_modify(|f| {
            f.peer = follow.peer();
            f.replacements = follow.changes();
            f.other = follow.other();
            f.others_heard = follow.others_heard();
        });
    };
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if schedule.due(now) {
            advertise("periodic");
            schedule.sent(now);
        }
        // At least every receive timeout: a failed session moves the link on time.
        if let Some(left) = follow.tick(now, established()) {
            tracing::warn!(
                peer = ?follow.peer(),
                previous = %left,
                "BGP unnumbered peer changed: the session with the previous one failed and another router advertises on this link"
            );
            publish(&follow);
        }
        let (len, envelope) = match receive(socket, &mut buf) {
            Ok(r) => r,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "receive failed");
                std::thread::sleep(POLL);
                continue;
            }
        };
        match parse_router_discovery(&buf[..len], &envelope) {
            Ok(Some(RouterDiscovery::Advertisement(_))) => {
                let now = Instant::now();
                match follow.heard(envelope.source, now) {
                    Heard::New => {
                        tracing::info!(peer = %envelope.source, "BGP unnumbered peer found");
                    }
                    Heard::Same => continue,
                    Heard::Other => {
                        if other_logged
                            .is_none_or(|t| now.saturating_duration_since(t) >= OTHER_LOG_INTERVAL)
                        {
                            other_logged = Some(now);
                            tracing::warn!(
                                from = %envelope.source,
                                peer = ?follow.peer(),
                                "router advertisement from another source than the BGP peer: ignored while the session runs (a second router, or a forged advertisement, on a link meant to be point to point)"
                            );
                        }
                    }
                }
                if let Some(left) = follow.tick(now, established()) {
                    tracing::warn!(peer = ?follow.peer(), previous = %left, "BGP unnumbered peer changed: the session with the previous one failed and another router advertises on this link");
                }
                publish(&follow);
            }
            Ok(Some(RouterDiscovery::Solicitation(_))) => {
                let now = Instant::now();
                if schedule.answer_solicitation(now) {
                    advertise("solicited");
                    schedule.sent(now);
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(from = %envelope.source, error = %e, "router discovery message refused");
                tx.send_modify(|f| f.refused += 1);
            }
        }
    }
}

fn send(socket: &Socket, message: &[u8], to: Ipv6Addr, index: u32) -> io::Result<()> {
    let address = SockAddr::from(std::net::SocketAddrV6::new(to, 0, 0, index));
    socket.send_to(message, &address).map(|_| ())
}

/// One ICMPv6 message into `buf` (waiting at most [`POLL`]): its length and the IPv6 header
/// fields it is checked against.
fn receive(socket: &Socket, buf: &mut [u8]) -> io::Result<(usize, Envelope)> {
    let mut iov = [IoSliceMut::new(buf)];
    let mut cmsg = nix::cmsg_space!(libc::c_int, libc::in6_pktinfo);
    let msg = nix_socket::recvmsg::<SockaddrIn6>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::empty(),
    )
    .map_err(io::Error::from)?;
    let mut hop_limit = None;
    let mut destination = None;
    for c in msg.cmsgs().map_err(io::Error::from)? {
        match c {
            ControlMessageOwned::Ipv6HopLimit(h) => hop_limit = u8::try_from(h).ok(),
            ControlMessageOwned::Ipv6PacketInfo(info) => {
                destination = Some(Ipv6Addr::from(info.ipi6_addr.s6_addr));
            }
            _ => {}
        }
    }
    let source = msg
        .address
        .map(|a| a.ip())
        .ok_or_else(|| io::Error::other("message without a source address"))?;
    let envelope = Envelope {
        source,
        destination: destination.unwrap_or(ALL_NODES),
        // Without the hop limit the RFC 4861 §6.1 check cannot be made: refuse, not trust.
        hop_limit: Some(hop_limit.unwrap_or(0)),
    };
    Ok((msg.bytes, envelope))
}
