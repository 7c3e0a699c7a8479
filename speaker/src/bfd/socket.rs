//! BFD's UDP sockets: the listeners on 3784/4784 that report each datagram's TTL, and each
//! session's own sending socket (TTL 255, a source port of its own in 49152–65535, RFC 5881
//! section 4).

use std::io::{self, IoSliceMut};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;

use nix::sys::socket::{self as nix_socket, ControlMessageOwned, MsgFlags, SockaddrStorage};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::Interest;
use tokio::net::UdpSocket;

/// What the kernel said of how a datagram arrived.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Arrival {
    /// Its IP TTL / hop limit.
    pub ttl: Option<u8>,
    /// The index of the interface it arrived on.
    pub interface: Option<u32>,
}

/// A listening socket on a BFD port.
pub struct Listener {
    socket: UdpSocket,
}

impl Listener {
    /// Binds `address` and asks the kernel for each datagram's TTL / hop limit. An IPv6
    /// address listens for IPv6 only (the IPv4 listener takes IPv4). Must be called within a
    /// tokio runtime.
    pub fn bind(address: SocketAddr) -> io::Result<Listener> {
        let domain = Domain::for_address(address);
        let socket = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
        match address {
            SocketAddr::V4(_) => {
                nix_socket::setsockopt(&socket, nix_socket::sockopt::Ipv4RecvTtl, &true)?;
                nix_socket::setsockopt(&socket, nix_socket::sockopt::Ipv4PacketInfo, &true)?;
            }
            SocketAddr::V6(_) => {
                socket.set_only_v6(true)?;
                nix_socket::setsockopt(&socket, nix_socket::sockopt::Ipv6RecvHopLimit, &true)?;
                nix_socket::setsockopt(&socket, nix_socket::sockopt::Ipv6RecvPacketInfo, &true)?;
            }
        }
        socket.set_reuse_address(true)?;
        socket.set_nonblocking(true)?;
        socket.bind(&address.into())?;
        Ok(Listener {
            socket: UdpSocket::from_std(socket.into())?,
        })
    }

    /// The address it is bound to.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    /// Receives one datagram into `buf`: its length, its source, and its TTL and the index of
    /// the interface it arrived on (when the kernel said).
    pub async fn recv(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr, Arrival)> {
        self.socket
            .async_io(Interest::READABLE, || {
                let mut iov = [IoSliceMut::new(buf)];
                let mut cmsg = nix::cmsg_space!(libc::c_int, libc::in6_pktinfo);
                let msg = nix_socket::recvmsg::<SockaddrStorage>(
                    self.socket.as_raw_fd(),
                    &mut iov,
                    Some(&mut cmsg),
                    MsgFlags::MSG_DONTWAIT,
                )
                .map_err(io::Error::from)?;
                let mut arrival = Arrival::default();
                for c in msg.cmsgs().map_err(io::Error::from)? {
                    match c {
                        ControlMessageOwned::Ipv4Ttl(t) | ControlMessageOwned::Ipv6HopLimit(t) => {
                            arrival.ttl = u8::try_from(t).ok();
                        }
                        ControlMessageOwned::Ipv4PacketInfo(info) => {
                            arrival.interface = u32::try_from(info.ipi_ifindex).ok();
                        }
                        ControlMessageOwned::Ipv6PacketInfo(info) => {
                            arrival.interface = Some(info.ipi6_ifindex);
                        }
                        _ => {}
                    }
                }
                let from = msg
                    .address
                    .and_then(|a| {
                        a.as_sockaddr_in()
                            .map(|v4| SocketAddr::from((v4.ip(), v4.port())))
                            .or_else(|| {
                                a.as_sockaddr_in6()
                                    .map(|v6| SocketAddr::from((v6.ip(), v6.port())))
                            })
                    })
                    .ok_or_else(|| io::Error::other("datagram without a source address"))?;
                Ok((msg.bytes, from, arrival))
            })
            .await
    }
}

/// Opens the socket a session sends from: bound to `local` (or any address) and a free port in
/// `ports`, trying them from `start`; TTL / hop limit 255; connected to `peer`.
pub fn open_sender(
    local: Option<IpAddr>,
    peer: SocketAddr,
    ports: std::ops::RangeInclusive<u16>,
    start: u16,
) -> io::Result<UdpSocket> {
    let socket = Socket::new(Domain::for_address(peer), Type::DGRAM, Some(Protocol::UDP))?;
    match peer {
        SocketAddr::V4(_) => socket.set_ttl_v4(255)?,
        SocketAddr::V6(_) => socket.set_unicast_hops_v6(255)?,
    }
    socket.set_nonblocking(true)?;
    let ip = local.unwrap_or(match peer {
        SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        SocketAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    });
    let (first, last) = (*ports.start(), *ports.end());
    let span = u32::from(last - first) + 1;
    let offset = u32::from(start.clamp(first, last) - first);
    let mut last_error = io::Error::new(io::ErrorKind::AddrInUse, "no free source port");
    for i in 0..span {
        let port = first + u16::try_from((offset + i) % span).unwrap_or(0);
        match socket.bind(&SocketAddr::new(ip, port).into()) {
            Ok(()) => {
                socket.connect(&peer.into())?;
                return UdpSocket::from_std(socket.into());
            }
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => last_error = e,
            Err(e) => return Err(e),
        }
    }
    Err(last_error)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A datagram sent from a session's socket arrives with its TTL (255) and from a source
    /// port in the range; a second sender gets another port.
    #[tokio::test]
    async fn sender_to_listener_with_ttl() {
        let l = Listener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let at = l.local_addr().unwrap();
        let a = open_sender(None, at, 49152..=65535, 60000).unwrap();
        let b = open_sender(None, at, 60000..=60001, 60000).unwrap();
        let pa = a.local_addr().unwrap().port();
        let pb = b.local_addr().unwrap().port();
        assert!(pa >= 49152);
        assert_ne!(pa, pb);
        a.send(b"hello").await.unwrap();
        let mut buf = [0u8; 64];
        let (n, from, arrival) = l.recv(&mut buf).await.unwrap();
        let ttl = arrival.ttl;
        assert!(
            arrival.interface.is_some(),
            "the kernel names the interface"
        );
        assert_eq!(&buf[..n], b"hello");
        assert_eq!(from.port(), pa);
        assert_eq!(ttl, Some(255));
    }

    #[tokio::test]
    async fn ipv6_hop_limit_is_reported() {
        let Ok(l) = Listener::bind("[::1]:0".parse().unwrap()) else {
            // No IPv6 loopback here.
            return;
        };
        let at = l.local_addr().unwrap();
        let a = open_sender(None, at, 49152..=65535, 50000).unwrap();
        a.send(b"x").await.unwrap();
        let mut buf = [0u8; 8];
        let (_, _, arrival) = l.recv(&mut buf).await.unwrap();
        let ttl = arrival.ttl;
        assert_eq!(ttl, Some(255));
    }
}
