//! The metrics and health server over TLS: a client that trusts the certificate gets the pages,
//! plain HTTP gets nothing, a client that never finishes its handshake does not hold up the
//! others, and a bad key pair is refused at start with the file named.
//!
//! `tests/fixtures/metrics-{cert,key}.pem` is a self-signed P-256 pair for 127.0.0.1, made for
//! these tests only (`openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes
//! -days 36500 -subj /CN=ferrolb-test -addext subjectAltName=IP:127.0.0.1,DNS:localhost
//! -addext basicConstraints=critical,CA:FALSE -addext extendedKeyUsage=serverAuth`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ferrolb_runtime::health;
use ferrolb_runtime::server::{Ready, Server};
use ferrolb_runtime::tls::TlsFiles;
use prometheus_client::registry::Registry;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn files() -> TlsFiles {
    TlsFiles {
        cert: fixture("metrics-cert.pem"),
        key: fixture("metrics-key.pem"),
    }
}

async fn start(tls: Option<TlsFiles>) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let ready = Ready::default();
    ready.set(true);
    tokio::spawn(ferrolb_runtime::server::serve_on(
        listener,
        Server {
            registry: Arc::new(Registry::default()),
            ready,
            not_ready_reason: "not ready",
            pulse: health::Pulse::new(Duration::from_secs(60)),
            tls,
            pages: Vec::new(),
        },
    ));
    addr
}

async fn get_tls(addr: std::net::SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(fixture("metrics-cert.pem"))? {
        roots.add(cert?)?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await?;
    let mut tls = connector
        .connect(ServerName::try_from("127.0.0.1")?, tcp)
        .await?;
    tls.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut response = String::new();
    tls.read_to_string(&mut response).await?;
    Ok(response)
}

#[tokio::test]
async fn pages_are_served_over_tls_only() {
    let addr = start(Some(files())).await;
    let health = get_tls(addr, "/healthz").await.unwrap();
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let metrics = get_tls(addr, "/metrics").await.unwrap();
    assert!(metrics.contains("# EOF"), "{metrics}");
    // Plain HTTP on the TLS port gets no page.
    let mut plain = TcpStream::connect(addr).await.unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut response)).await;
    assert!(
        !String::from_utf8_lossy(&response).contains("200 OK"),
        "{response:?}"
    );
}

#[tokio::test]
async fn a_stalled_handshake_does_not_hold_up_the_probes() {
    let addr = start(Some(files())).await;
    // Connections that never send a ClientHello.
    let mut idle = Vec::new();
    for _ in 0..8 {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    // Were handshakes run one at a time, this would wait for ever: bounded, it fails instead.
    let health = tokio::time::timeout(Duration::from_secs(60), get_tls(addr, "/healthz"))
        .await
        .expect("the probe waited behind stalled handshakes")
        .unwrap();
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
}

#[tokio::test]
async fn plain_http_stays_the_default() {
    let addr = start(None).await;
    let mut plain = TcpStream::connect(addr).await.unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    plain.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
}

#[test]
fn a_bad_pair_is_refused_naming_the_file() {
    let swapped = TlsFiles {
        cert: fixture("metrics-key.pem"),
        key: fixture("metrics-cert.pem"),
    };
    let error = format!("{:#}", swapped.load().unwrap_err());
    assert!(error.contains("metrics-key.pem"), "{error}");
    let missing = TlsFiles {
        cert: fixture("nowhere.pem"),
        key: fixture("metrics-key.pem"),
    };
    let error = format!("{:#}", missing.load().unwrap_err());
    assert!(error.contains("nowhere.pem"), "{error}");
    assert!(TlsFiles::from_args(Some("c".into()), None).is_err());
    assert_eq!(TlsFiles::from_args(None, None).unwrap(), None);
}
