//! The lab pods' workload: an HTTP server on TCP 8080 and a UDP echo on 8081 that answer with the
//! pod's name (and, for HTTP, the client address the pod saw); `GET /stream` keeps its connection
//! and answers each line sent on it.

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv6Addr, SocketAddr, TcpListener, UdpSocket};

use anyhow::Context;

/// TCP port of the HTTP server.
pub const HTTP_PORT: u16 = 8080;
/// UDP port of the echo server.
pub const UDP_PORT: u16 = 8081;
/// The HTTP path that keeps its connection open and answers every line with the pod's name:
/// a long-lived connection, as a database client's, for tests that must not break one.
pub const STREAM_PATH: &str = "/stream";

/// Serves until killed. Both listeners bind `[::]`, which also accepts IPv4.
pub fn serve(name: &str) -> anyhow::Result<()> {
    let any = SocketAddr::from((Ipv6Addr::UNSPECIFIED, HTTP_PORT));
    let tcp = TcpListener::bind(any).context("binding TCP 8080")?;
    let udp = UdpSocket::bind(SocketAddr::from((Ipv6Addr::UNSPECIFIED, UDP_PORT)))
        .context("binding UDP 8081")?;
    let udp_name = name.to_string();
    std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while let Ok((_, peer)) = udp.recv_from(&mut buf) {
            let _ = udp.send_to(format!("{udp_name}\n").as_bytes(), peer);
        }
    });
    for stream in tcp.incoming() {
        let Ok(mut stream) = stream else { continue };
        let name = name.to_string();
        std::thread::spawn(move || {
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
        });
    }
    Ok(())
}
