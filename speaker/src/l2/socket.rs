//! The layer-2 sockets: an `AF_PACKET` socket per interface that receives only ARP requests and
//! Neighbor Solicitations and sends whole Ethernet frames, and the IPv6 multicast membership
//! that makes the interface accept solicitations for our addresses.
//!
//! Blocking by design: one thread per interface loops on [`PacketSocket::recv`], whose timeout
//! ([`RECV_TIMEOUT`]) lets it notice shutdown. Decision record 0011 says why `socket2` rather
//! than `pnet_datalink`, and why this module has the crate's one `unsafe` block.

use std::collections::HashMap;
use std::io::{self, Read};
use std::net::Ipv6Addr;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

use socket2::{Domain, Protocol, SockAddr, SockAddrStorage, SockFilter, Socket, Type};

use ferrolb_layer2::packet::filter;

/// How long [`PacketSocket::recv`] waits for a frame before it returns `None`.
pub const RECV_TIMEOUT: Duration = Duration::from_millis(250);
/// How long [`PacketSocket::send`] may block on a full transmit queue before it fails.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(1);

/// `ETH_P_ALL`: the socket needs two ethertypes (ARP and IPv6), so it takes all and the filter
/// chooses.
const ETH_P_ALL: u16 = 0x0003;

/// Errors of the layer-2 sockets. The I/O ones carry the system's error.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// Interface index 0 (which would mean "every interface" to a packet socket) or one too
    /// large for the kernel's `int`.
    #[error("invalid interface index {ifindex}")]
    InvalidIfindex {
        /// The index given.
        ifindex: u32,
    },
    /// `socket(AF_PACKET, SOCK_RAW, 0)` failed (without `CAP_NET_RAW`, say).
    #[error("creating the packet socket: {0}")]
    Create(#[source] io::Error),
    /// The kernel refused the BPF filter.
    #[error("attaching the BPF filter: {0}")]
    AttachFilter(#[source] io::Error),
    /// Setting a socket option failed.
    #[error("setting {option}: {source}")]
    SetOption {
        /// Which option.
        option: &'static str,
        /// The system's error.
        source: io::Error,
    },
    /// Binding the packet socket to the interface failed (no such interface, say).
    #[error("binding the packet socket to interface {ifindex}: {source}")]
    Bind {
        /// The interface index.
        ifindex: u32,
        /// The system's error.
        source: io::Error,
    },
    /// Receiving failed (the interface went away, say).
    #[error("receiving: {0}")]
    Recv(#[source] io::Error),
    /// Sending failed (the interface is down, or the queue stayed full for [`SEND_TIMEOUT`]).
    #[error("sending: {0}")]
    Send(#[source] io::Error),
    /// The kernel took only part of the frame.
    #[error("sent {sent} of {len} octets")]
    ShortSend {
        /// Octets sent.
        sent: usize,
        /// Frame length.
        len: usize,
    },
    /// Creating the socket that holds multicast memberships failed.
    #[error("creating the multicast membership socket: {0}")]
    MulticastSocket(#[source] io::Error),
    /// Joining a multicast group failed. `ENOBUFS` means the per-socket limit
    /// (`net.core.optmem_max`) is reached.
    #[error("joining {group} on interface {ifindex}: {source}")]
    Join {
        /// The group.
        group: Ipv6Addr,
        /// The interface index.
        ifindex: u32,
        /// The system's error.
        source: io::Error,
    },
    /// Leaving a multicast group failed.
    #[error("leaving {group} on interface {ifindex}: {source}")]
    Leave {
        /// The group.
        group: Ipv6Addr,
        /// The interface index.
        ifindex: u32,
        /// The system's error.
        source: io::Error,
    },
}

/// An `AF_PACKET` raw socket bound to one interface, not promiscuous, with the
/// [`filter`] program attached: it receives whole ARP-request and Neighbor-Solicitation frames
/// addressed to this host (unicast, broadcast or multicast) and sends whole Ethernet frames out
/// of that interface. Safe to share between a receiving and a sending thread.
#[derive(Debug)]
pub struct PacketSocket {
    socket: Socket,
    ifindex: u32,
}

impl PacketSocket {
    /// Opens the socket on interface `ifindex`. Needs `CAP_NET_RAW`.
    ///
    /// The socket is created with protocol 0, to which the kernel delivers nothing, and starts
    /// receiving only when bound, after the filter is attached: no unfiltered frame can be
    /// queued, so there is nothing to drain.
    pub fn open(ifindex: u32) -> Result<Self, SocketError> {
        let index = i32::try_from(ifindex)
            .ok()
            .filter(|&i| i > 0)
            .ok_or(SocketError::InvalidIfindex { ifindex })?;
        let socket = Socket::new(Domain::PACKET, Type::RAW, None).map_err(SocketError::Create)?;
        let program: Vec<SockFilter> = filter::program()
            .iter()
            .map(|i| SockFilter::new(i.code, i.jt, i.jf, i.k))
            .collect();
        socket
            .attach_filter(&program)
            .map_err(SocketError::AttachFilter)?;
        socket
            .set_read_timeout(Some(RECV_TIMEOUT))
            .map_err(|source| SocketError::SetOption {
                option: "SO_RCVTIMEO",
                source,
            })?;
        socket
            .set_write_timeout(Some(SEND_TIMEOUT))
            .map_err(|source| SocketError::SetOption {
                option: "SO_SNDTIMEO",
                source,
            })?;
        socket
            .bind(&link_layer_address(index, ETH_P_ALL))
            .map_err(|source| SocketError::Bind { ifindex, source })?;
        Ok(PacketSocket { socket, ifindex })
    }

    /// The interface this socket is bound to.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// Changes how long [`recv`](Self::recv) waits (default [`RECV_TIMEOUT`]).
    pub fn set_recv_timeout(&self, timeout: Duration) -> Result<(), SocketError> {
        self.socket
            .set_read_timeout(Some(timeout))
            .map_err(|source| SocketError::SetOption {
                option: "SO_RCVTIMEO",
                source,
            })
    }

    /// Waits up to the receive timeout for one frame and copies it into `buf`, returning its
    /// length, or `None` when the timeout passed (or a signal interrupted the wait).
    ///
    /// A frame longer than `buf` is cut to `buf.len()`; a buffer of the interface's MTU plus 14
    /// octets holds any frame.
    pub fn recv(&self, buf: &mut [u8]) -> Result<Option<usize>, SocketError> {
        match (&self.socket).read(buf) {
            Ok(len) => Ok(Some(len)),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(SocketError::Recv(e)),
        }
    }

    /// Sends one complete Ethernet frame (destination, source, ethertype, payload; no FCS)
    /// out of the interface as it is.
    pub fn send(&self, frame: &[u8]) -> Result<(), SocketError> {
        let sent = self.socket.send(frame).map_err(SocketError::Send)?;
        if sent != frame.len() {
            return Err(SocketError::ShortSend {
                sent,
                len: frame.len(),
            });
        }
        Ok(())
    }
}

impl AsFd for PacketSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

/// A `sockaddr_ll` naming interface `ifindex` and ethertype `protocol`.
///
/// socket2 has no safe constructor for link-layer addresses (nor do nix or rustix), so this is
/// the one place the speaker builds a C socket address itself.
#[allow(unsafe_code)]
fn link_layer_address(ifindex: i32, protocol: u16) -> SockAddr {
    let mut storage = SockAddrStorage::zeroed();
    // SAFETY: `sockaddr_ll` is one of this platform's `sockaddr_*` types, as `view_as`
    // requires (it also asserts that it fits in the storage). All zeros is a valid
    // `sockaddr_ll`, and only plain integer fields are written.
    let ll = unsafe { storage.view_as::<libc::sockaddr_ll>() };
    ll.sll_family = libc::AF_PACKET as libc::c_ushort;
    ll.sll_protocol = protocol.to_be();
    ll.sll_ifindex = ifindex;
    let len = std::mem::size_of::<libc::sockaddr_ll>() as socket2::socklen_t;
    // SAFETY: the family is AF_PACKET, the storage holds an initialised `sockaddr_ll`, and
    // `len` is exactly its size, which is what `SockAddr::new` asks of its caller.
    unsafe { SockAddr::new(storage, len) }
}

/// IPv6 multicast groups joined on one interface, so that the NIC accepts frames sent to them
/// and MLD-snooping switches forward them to us (the kernel sends the MLD reports).
///
/// Joins are counted: several addresses share a solicited-node group when their low 24 bits
/// are equal, so call [`join`](Self::join) once per address that needs the group and
/// [`leave`](Self::leave) once per address that no longer does; the group is left when the
/// last one goes. Dropping the membership leaves every group.
///
/// One UDP socket holds the memberships. The kernel charges each against the socket's option
/// memory (`net.core.optmem_max`), which allows some hundreds of groups per socket on older
/// kernels and thousands on current ones; past it, joining fails with `ENOBUFS`.
#[derive(Debug)]
pub struct MulticastMembership {
    socket: Socket,
    ifindex: u32,
    joined: HashMap<Ipv6Addr, usize>,
}

impl MulticastMembership {
    /// A membership holder for interface `ifindex`, with no group joined.
    pub fn new(ifindex: u32) -> Result<Self, SocketError> {
        if ifindex == 0 {
            return Err(SocketError::InvalidIfindex { ifindex });
        }
        let socket = Socket::new(Domain::IPV6, Type::DGRAM, Some(Protocol::UDP))
            .map_err(SocketError::MulticastSocket)?;
        Ok(MulticastMembership {
            socket,
            ifindex,
            joined: HashMap::new(),
        })
    }

    /// The interface the groups are joined on.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// Joins `group`, or counts one more user of it if already joined.
    pub fn join(&mut self, group: Ipv6Addr) -> Result<(), SocketError> {
        if let Some(users) = self.joined.get_mut(&group) {
            *users += 1;
            return Ok(());
        }
        self.socket
            .join_multicast_v6(&group, self.ifindex)
            .map_err(|source| SocketError::Join {
                group,
                ifindex: self.ifindex,
                source,
            })?;
        self.joined.insert(group, 1);
        Ok(())
    }

    /// Counts one user of `group` less, and leaves the group when none is left. A group that
    /// was not joined is ignored.
    pub fn leave(&mut self, group: Ipv6Addr) -> Result<(), SocketError> {
        let Some(users) = self.joined.get_mut(&group) else {
            return Ok(());
        };
        if *users > 1 {
            *users -= 1;
            return Ok(());
        }
        self.socket
            .leave_multicast_v6(&group, self.ifindex)
            .map_err(|source| SocketError::Leave {
                group,
                ifindex: self.ifindex,
                source,
            })?;
        self.joined.remove(&group);
        Ok(())
    }

    /// Whether `group` is joined.
    pub fn is_joined(&self, group: Ipv6Addr) -> bool {
        self.joined.contains_key(&group)
    }

    /// The groups joined, in no particular order.
    pub fn groups(&self) -> impl Iterator<Item = Ipv6Addr> + '_ {
        self.joined.keys().copied()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};
    use std::process::Command;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;

    use super::*;
    use ferrolb_layer2::packet::{
        self, MacAddr, Request, arp_reply, gratuitous_arp_request, neighbor_advertisement,
        solicited_node_multicast,
    };

    #[test]
    fn invalid_interface_indexes() {
        for ifindex in [0, u32::MAX, 1 << 31] {
            assert!(matches!(
                PacketSocket::open(ifindex),
                Err(SocketError::InvalidIfindex { .. })
            ));
        }
        assert!(matches!(
            MulticastMembership::new(0),
            Err(SocketError::InvalidIfindex { ifindex: 0 })
        ));
    }

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

    /// Root only (skipped otherwise): a responder on our end of a veth answers arping and
    /// ndisc6 on the other, defends an address against DAD, and sees nothing but requests
    /// from the other end (not its own frames, not other traffic).
    #[test]
    fn answers_arping_and_ndisc6_in_network_namespaces() {
        let Some(lab) = Lab::create() else {
            eprintln!("skipped: cannot create network namespaces (needs root)");
            return;
        };
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
                        Ok(Some(Request::Arp(r))) if r.target_ip == vip4 => {
                            Some(arp_reply(r, OURS))
                        }
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

        let tools = installed("arping") && installed("ndisc6");
        if tools {
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
        } else {
            eprintln!("arping or ndisc6 missing: only the kernel's own requests are checked");
        }
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
}
