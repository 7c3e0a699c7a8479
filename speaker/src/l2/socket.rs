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

/// Whether this process may open `AF_PACKET` sockets (it holds `CAP_NET_RAW`): creates one
/// with protocol 0 (it receives nothing) and closes it. The speaker checks this once at start,
/// so a container without the capability fails at once with a clear error instead of running
/// without ever answering ARP or NDP.
pub fn check_packet_access() -> Result<(), SocketError> {
    Socket::new(Domain::PACKET, Type::RAW, None)
        .map(drop)
        .map_err(SocketError::Create)
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
    use super::*;

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
}
