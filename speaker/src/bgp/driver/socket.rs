//! The session's TCP socket: source address, TTL and TCP MD5 signatures (RFC 2385).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;

use socket2::{Domain, Protocol, SockRef, Socket, Type};
use tokio::net::{TcpSocket, TcpStream};

/// Linux `TCP_MD5SIG` (include/uapi/linux/tcp.h); libc does not export it for Linux.
const TCP_MD5SIG: libc::c_int = 14;
/// Linux `TCP_MD5SIG_MAXKEYLEN`.
pub const MD5_MAX_KEY_LEN: usize = 80;
/// Size of `struct __kernel_sockaddr_storage`.
const SOCKADDR_STORAGE_LEN: usize = 128;

/// How to open the connection to a peer.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConnectOptions {
    /// The peer's address and port.
    pub peer: SocketAddr,
    /// Local address to bind before connecting.
    pub source: Option<IpAddr>,
    /// IP TTL / IPv6 hop limit of our packets: 1 for directly connected eBGP, 255 otherwise.
    pub ttl: u8,
    /// TCP MD5 key, if any.
    pub password: Option<String>,
    /// The VRF device the socket is bound to (`SO_BINDTODEVICE`), so the connection uses that
    /// VRF's routing table and addresses; `None` is the default VRF.
    pub vrf: Option<String>,
}

/// Opens the TCP connection with the options applied before the SYN leaves.
pub async fn connect(options: &ConnectOptions) -> io::Result<TcpStream> {
    let socket = match options.peer {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    set_ttl(&socket, options.peer.ip(), options.ttl)?;
    if let Some(password) = &options.password {
        set_md5(&socket, options.peer.ip(), password)?;
    }
    socket.set_nodelay(true)?;
    if let Some(vrf) = &options.vrf {
        bind_to_vrf(&socket, vrf)?;
    }
    if let Some(source) = options.source {
        socket.bind(SocketAddr::new(source, 0))?;
    }
    socket.connect(options.peer).await
}

/// Binds a socket to the VRF device `vrf` (`SO_BINDTODEVICE`; needs CAP_NET_RAW, which the
/// speaker has). The error names the device: "No such device" means the node has no such VRF.
pub fn bind_to_vrf(socket: &impl std::os::fd::AsFd, vrf: &str) -> io::Result<()> {
    SockRef::from(socket)
        .bind_device(Some(vrf.as_bytes()))
        .map_err(|e| io::Error::new(e.kind(), format!("cannot bind to vrf {vrf:?}: {e}")))
}

/// Sets the TTL (IPv4) or hop limit (IPv6) of a socket talking to `peer`.
pub fn set_ttl(socket: &impl std::os::fd::AsFd, peer: IpAddr, ttl: u8) -> io::Result<()> {
    let s = SockRef::from(socket);
    match peer {
        IpAddr::V4(_) => s.set_ttl_v4(u32::from(ttl)),
        IpAddr::V6(_) => s.set_unicast_hops_v6(u32::from(ttl)),
    }
}

/// The bytes of `struct tcp_md5sig` for `peer` and `key` (include/uapi/linux/tcp.h):
/// `__kernel_sockaddr_storage tcpm_addr; u8 flags; u8 prefixlen; u16 keylen; int ifindex;
/// u8 key[80]`. Built by hand so no `unsafe` is needed to fill it.
pub fn md5sig_bytes(peer: IpAddr, key: &[u8]) -> io::Result<Vec<u8>> {
    if key.len() > MD5_MAX_KEY_LEN {
        // The kernel would answer EINVAL; say why instead.
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "the TCP MD5 password is {} bytes, more than the {MD5_MAX_KEY_LEN} Linux allows",
                key.len()
            ),
        ));
    }
    let mut b = vec![0u8; SOCKADDR_STORAGE_LEN + 8 + MD5_MAX_KEY_LEN];
    match peer {
        IpAddr::V4(a) => {
            b[0..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
            // sin_port stays 0; sin_addr at offset 4.
            b[4..8].copy_from_slice(&a.octets());
        }
        IpAddr::V6(a) => {
            b[0..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
            // sin6_port, sin6_flowinfo stay 0; sin6_addr at offset 8.
            b[8..24].copy_from_slice(&a.octets());
        }
    }
    let at = SOCKADDR_STORAGE_LEN;
    // tcpm_flags 0, tcpm_prefixlen 0: the key applies to exactly this address.
    b[at + 2..at + 4].copy_from_slice(&(key.len() as u16).to_ne_bytes());
    // tcpm_ifindex 0: any interface.
    b[at + 8..at + 8 + key.len()].copy_from_slice(key);
    Ok(b)
}

/// Installs a TCP MD5 key for `peer` on a socket (connecting or listening).
pub fn set_md5(socket: &impl AsRawFd, peer: IpAddr, password: &str) -> io::Result<()> {
    let value = md5sig_bytes(peer, password.as_bytes())?;
    let len = libc::socklen_t::try_from(value.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "tcp_md5sig too long"))?;
    // SAFETY: `value` is a live buffer of exactly `len` bytes laid out as `struct tcp_md5sig`;
    // the kernel copies it (no alignment requirement) and keeps no pointer to it. The fd is
    // open for the duration of the call because `socket` is borrowed. Neither socket2, nix
    // nor libc offers TCP_MD5SIG safely (docs/decisions/0013-bgp-driver.md).
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            TCP_MD5SIG,
            value.as_ptr().cast(),
            len,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether the kernel takes `password` as the TCP MD5 key for `peer`: tried on a spare socket
/// of the peer's family that is never connected, so a key that would be refused on every
/// connect is known before the session starts.
pub fn check_md5(peer: IpAddr, password: &str) -> io::Result<()> {
    let socket = Socket::new(
        Domain::for_address(SocketAddr::new(peer, 0)),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    set_md5(&socket, peer, password)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn md5sig_layout() {
        let b = md5sig_bytes("192.0.2.1".parse().unwrap(), b"secret").unwrap();
        assert_eq!(b.len(), 216);
        assert_eq!(&b[4..8], &[192, 0, 2, 1]);
        assert_eq!(u16::from_ne_bytes([b[130], b[131]]), 6);
        assert_eq!(&b[136..142], b"secret");
        assert!(md5sig_bytes("::1".parse().unwrap(), &[0; 81]).is_err());
    }

    #[tokio::test]
    async fn md5_and_ttl_are_accepted_by_the_kernel() {
        let socket = TcpSocket::new_v4().unwrap();
        set_ttl(&socket, "127.0.0.1".parse().unwrap(), 1).unwrap();
        set_md5(&socket, "127.0.0.1".parse().unwrap(), "secret").unwrap();
        assert_eq!(SockRef::from(&socket).ttl_v4().unwrap(), 1);
        let socket = TcpSocket::new_v6().unwrap();
        set_ttl(&socket, "::1".parse().unwrap(), 255).unwrap();
        set_md5(&socket, "::1".parse().unwrap(), "secret").unwrap();
    }

    /// The longest key Linux takes is accepted; one byte more is refused, on either family.
    #[test]
    fn check_md5_refuses_what_the_kernel_refuses() {
        for peer in ["192.0.2.1", "2001:db8::1"] {
            let peer: IpAddr = peer.parse().unwrap();
            check_md5(peer, &"k".repeat(MD5_MAX_KEY_LEN)).unwrap();
            let e = check_md5(peer, &"k".repeat(MD5_MAX_KEY_LEN + 1)).unwrap_err();
            assert!(e.to_string().contains("81 bytes"), "{e}");
        }
    }

    /// The kernel's own check, past our length check: a key for an IPv4 address on an IPv6
    /// socket is refused with EINVAL, and that error reaches the caller.
    #[tokio::test]
    async fn binding_to_a_missing_vrf_names_it() {
        let socket = TcpSocket::new_v4().unwrap();
        let e = bind_to_vrf(&socket, "flb-no-such-vrf").unwrap_err();
        assert!(e.to_string().contains("\"flb-no-such-vrf\""), "{e}");
        // With CAP_NET_RAW (as the speaker runs) the kernel looks the device up; without it,
        // EPERM comes first.
        let m = e.to_string();
        assert!(
            m.contains("No such device") || m.contains("Operation not permitted"),
            "{e}"
        );
    }

    #[test]
    fn a_key_the_kernel_refuses_is_an_error() {
        let socket = Socket::new(Domain::IPV6, Type::STREAM, Some(Protocol::TCP)).unwrap();
        let e = set_md5(&socket, "192.0.2.1".parse().unwrap(), "secret").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
    }
}
