//! The metrics server against slow-loris clients (issue #33, item 10): connections that send
//! their headers a byte at a time, or nothing, are closed after the header-read timeout, no more
//! than the connection cap are served at once, and a normal client is served once they are gone.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrolb_runtime::health;
use ferrolb_runtime::server::{Limits, Ready, Server};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TIMEOUT: Duration = Duration::from_millis(600);
const CAP: usize = 8;

async fn start() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let ready = Ready::default();
    ready.set(true);
    tokio::spawn(ferrolb_runtime::server::serve_limited(
        listener,
        Server {
            registry: Arc::new(Registry::default()),
            ready,
            not_ready_reason: "not yet",
            pulse: health::Pulse::new(Duration::from_secs(60)),
            tls: None,
            pages: Vec::new(),
        },
        Limits {
            header_read_timeout: TIMEOUT,
            max_connections: CAP,
        },
    ));
    addr
}

/// A normal client's `/readyz`, or `None` if no answer came within `within`.
async fn readyz(addr: SocketAddr, within: Duration) -> Option<String> {
    tokio::time::timeout(within, async {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut response = String::new();
        c.read_to_string(&mut response).await.unwrap();
        response
    })
    .await
    .ok()
}

/// A slow-loris: connects, then sends a request's headers one byte every 50 ms and never ends
/// them. Returns how long after connecting the server closed the connection (`None`: still
/// open after `give_up`).
async fn slow_loris(addr: SocketAddr, give_up: Duration) -> Option<Duration> {
    let mut c = TcpStream::connect(addr).await.unwrap();
    let start = Instant::now();
    let headers = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Padding: ".repeat(10);
    let mut buf = [0u8; 64];
    for byte in headers.iter().cycle() {
        if start.elapsed() > give_up {
            return None;
        }
        // A write fails, or a read sees the end, once the server has closed the connection.
        if c.write_all(&[*byte]).await.is_err() {
            return Some(start.elapsed());
        }
        match tokio::time::timeout(Duration::from_millis(50), c.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return Some(start.elapsed()),
            // A 408 or the like before the close: keep reading until the end.
            Ok(Ok(_)) => {}
            Err(_) => {}
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_loris_clients_are_closed_after_the_header_timeout() {
    let addr = start().await;
    // Five times the cap: the first CAP are served (and timed out), the others wait their turn.
    let lorises: Vec<_> = (0..5 * CAP)
        .map(|_| tokio::spawn(slow_loris(addr, Duration::from_secs(20))))
        .collect();
    // Closed once its turn came and its headers were not in within the timeout: each wave of
    // CAP takes about TIMEOUT, so every one is closed within about five timeouts.
    let started = Instant::now();
    for loris in lorises {
        let closed = loris.await.unwrap();
        assert!(
            closed.is_some(),
            "a slow-loris connection was still open after 20 s"
        );
    }
    let all_closed = started.elapsed();
    println!(
        "{} slow-loris connections, cap {CAP}, header timeout {TIMEOUT:?}: all closed in {all_closed:?}",
        5 * CAP
    );
    assert!(
        all_closed < TIMEOUT * 5 + Duration::from_secs(3),
        "{all_closed:?}"
    );
    // And a normal client is served at once.
    let out = readyz(addr, Duration::from_secs(2))
        .await
        .expect("no answer");
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_closed_after_the_header_timeout() {
    let addr = start().await;
    let mut idle = TcpStream::connect(addr).await.unwrap();
    let start = Instant::now();
    let mut buf = [0u8; 256];
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match idle.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(read.is_ok(), "an idle connection was still open after 10 s");
    let closed = start.elapsed();
    assert!(
        closed >= TIMEOUT - Duration::from_millis(50) && closed < TIMEOUT * 4,
        "{closed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_more_than_the_cap_are_served_at_once() {
    let addr = start().await;
    // CAP connections that say nothing hold every slot until the header timeout closes them.
    let mut holders = Vec::new();
    for _ in 0..CAP {
        holders.push(TcpStream::connect(addr).await.unwrap());
    }
    // Let the server accept them all.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let held = Instant::now();
    // The next client waits in the backlog: no answer while the slots are held ...
    let waiting = tokio::spawn(readyz(addr, Duration::from_secs(10)));
    tokio::time::sleep(TIMEOUT / 3).await;
    assert!(!waiting.is_finished(), "served beyond the connection cap");
    // ... and is served once the holders are timed out.
    let out = waiting
        .await
        .unwrap()
        .expect("not served after the holders closed");
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let waited = held.elapsed();
    assert!(
        waited >= TIMEOUT / 2 && waited < TIMEOUT * 4,
        "served after {waited:?}"
    );
    drop(holders);
}
