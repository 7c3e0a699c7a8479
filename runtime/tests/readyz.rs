//! `/readyz` answers what the work loop last said: the server's default reason until the loop
//! speaks, then the loop's own reason while not ready, and ok once ready.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use ferrolb_runtime::health;
use ferrolb_runtime::server::{Ready, Server};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn readyz(addr: std::net::SocketAddr) -> String {
    let mut plain = TcpStream::connect(addr).await.unwrap();
    plain
        .write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    plain.read_to_string(&mut response).await.unwrap();
    response
}

#[tokio::test]
async fn readyz_says_why_not_as_the_loop_last_said() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let ready = Ready::default();
    tokio::spawn(ferrolb_runtime::server::serve_on(
        listener,
        Server {
            registry: Arc::new(Registry::default()),
            ready: ready.clone(),
            not_ready_reason: "caches not synced",
            pulse: health::Pulse::new(Duration::from_secs(60)),
            tls: None,
            pages: Vec::new(),
        },
    ));
    let first = readyz(addr).await;
    assert!(first.starts_with("HTTP/1.1 503"), "{first}");
    assert!(first.ends_with("caches not synced\n"), "{first}");
    ready.set_result(Err("layer 2: out of the quorum"));
    let out = readyz(addr).await;
    assert!(out.starts_with("HTTP/1.1 503"), "{out}");
    assert!(out.ends_with("layer 2: out of the quorum\n"), "{out}");
    ready.set_result(Ok(()));
    let ok = readyz(addr).await;
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    ready.set_result(Err(
        "layer 2: held back by flap damping after a loss of quorum",
    ));
    let held = readyz(addr).await;
    assert!(
        held.ends_with("flap damping after a loss of quorum\n"),
        "{held}"
    );
}
