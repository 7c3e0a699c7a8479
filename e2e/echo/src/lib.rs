//! The lab pods' workload: an HTTP server on TCP 8080 and a UDP echo on 8081 that answer with the
//! pod's name (and, for HTTP, the client address the pod saw); `GET /stream` keeps its connection
//! and answers each line sent on it.
//!
//! std only: the same code runs in the lab's network namespaces (`ferrolb-lab echo`) and as the
//! `ferrolb-echo` container image in pods on kubelet nodes (`images/build-oci.sh --lab`). The
//! tests parse the answers, so their bytes must not change:
//!
//! * HTTP: `HTTP/1.1 200 OK`, `Content-Type: text/plain`, `Content-Length`, `Connection: close`,
//!   body `NAME CLIENT_IP\n` (IPv4-mapped addresses shown as IPv4);
//! * UDP: one datagram `NAME\n` per datagram received;
//! * `GET /stream`: `HTTP/1.1 200 OK`, `Content-Type: text/plain`, no length, then `NAME\n` per
//!   line received, until the client closes.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};

/// TCP port of the HTTP server.
pub const HTTP_PORT: u16 = 8080;
/// UDP port of the echo server.
pub const UDP_PORT: u16 = 8081;
/// The HTTP path that keeps its connection open and answers every line with the pod's name:
/// a long-lived connection, as a database client's, for tests that must not break one.
pub const STREAM_PATH: &str = "/stream";

/// Serves until killed. Both listeners bind `[::]` ([`HTTP_PORT`] and [`UDP_PORT`]), which also
/// accepts IPv4.
///
/// Returns an error when a port cannot be bound (the message names it); otherwise never returns.
pub fn serve(name: &str) -> io::Result<()> {
    let tcp = TcpListener::bind(SocketAddr::from((Ipv6Addr::UNSPECIFIED, HTTP_PORT)))
        .map_err(|e| context(e, &format!("binding TCP {HTTP_PORT}")))?;
    let udp = UdpSocket::bind(SocketAddr::from((Ipv6Addr::UNSPECIFIED, UDP_PORT)))
        .map_err(|e| context(e, &format!("binding UDP {UDP_PORT}")))?;
    serve_on(tcp, udp, name)
}

/// Serves on sockets already bound (any ports), until killed: the UDP echo on a thread of its
/// own, each TCP connection on a thread of its own.
pub fn serve_on(tcp: TcpListener, udp: UdpSocket, name: &str) -> io::Result<()> {
    let udp_name = name.to_string();
    std::thread::Builder::new()
        .name("udp-echo".into())
        .spawn(move || {
            let mut buf = [0u8; 2048];
            while let Ok((_, peer)) = udp.recv_from(&mut buf) {
                let _ = udp.send_to(format!("{udp_name}\n").as_bytes(), peer);
            }
        })?;
    for stream in tcp.incoming() {
        let Ok(stream) = stream else { continue };
        let name = name.to_string();
        std::thread::spawn(move || answer(stream, &name));
    }
    Ok(())
}

/// Answers one HTTP connection; errors end it silently (the client sees the connection close).
fn answer(mut stream: TcpStream, name: &str) {
    let peer = stream
        .peer_addr()
        .map(|a| a.ip().to_canonical().to_string())
        .unwrap_or_default();
    // Read the request head; the answer does not depend on it.
    let mut reader = BufReader::new(match stream.try_clone() {
        Ok(s) => s,
        Err(_) => return,
    });
    let mut first = String::new();
    if reader.read_line(&mut first).is_err() {
        return;
    }
    let mut line = String::new();
    if first.len() > 2 {
        while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
            line.clear();
        }
    }
    if first.starts_with(&format!("GET {STREAM_PATH} ")) {
        // A long-lived connection: one answer line per line received, until closed.
        let _ = write!(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n"
        );
        let mut ping = String::new();
        while reader.read_line(&mut ping).is_ok_and(|n| n > 0) {
            if writeln!(stream, "{name}").is_err() {
                break;
            }
            ping.clear();
        }
        return;
    }
    let body = format!("{name} {peer}\n");
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// `what: error`, keeping the error's kind.
fn context(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use std::io::Read;
    use std::net::Ipv4Addr;
    use std::time::Duration;

    /// Starts the server on ephemeral loopback ports; returns (TCP, UDP) addresses.
    fn start(name: &str) -> (SocketAddr, SocketAddr) {
        let tcp = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let udp = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addrs = (tcp.local_addr().unwrap(), udp.local_addr().unwrap());
        let name = name.to_string();
        std::thread::spawn(move || serve_on(tcp, udp, &name));
        addrs
    }

    fn connect(addr: SocketAddr) -> TcpStream {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s
    }

    #[test]
    fn http_answers_name_and_client_address() {
        let (tcp, _) = start("pod-a");
        let mut s = connect(tcp);
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut got = String::new();
        s.read_to_string(&mut got).unwrap();
        assert_eq!(
            got,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 16\r\nConnection: close\r\n\r\npod-a 127.0.0.1\n"
        );
    }

    #[test]
    fn stream_answers_every_line() {
        let (tcp, _) = start("pod-b");
        let mut s = connect(tcp);
        s.write_all(format!("GET {STREAM_PATH} HTTP/1.1\r\n\r\n").as_bytes())
            .unwrap();
        let mut reader = BufReader::new(s.try_clone().unwrap());
        let mut head = String::new();
        for _ in 0..3 {
            reader.read_line(&mut head).unwrap();
        }
        assert_eq!(head, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n");
        for _ in 0..2 {
            s.write_all(b"ping\n").unwrap();
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            assert_eq!(line, "pod-b\n");
        }
    }

    #[test]
    fn udp_echoes_the_name() {
        let (_, udp) = start("pod-c");
        let client = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        client.send_to(b"x", udp).unwrap();
        let mut buf = [0u8; 64];
        let (n, _) = client.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"pod-c\n");
    }
}
