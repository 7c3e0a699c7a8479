//! TLS for the `/metrics` `/healthz` `/readyz` server, as an option (`--metrics-tls-cert` and
//! `--metrics-tls-key`, PEM files; the chart mounts them from a Secret).
//!
//! Handshakes run in their own tasks, each bounded in time, and only finished connections reach
//! the HTTP server: a client that opens a connection and never completes its handshake cannot
//! hold up the kubelet's probes. The files are read again when they change (cert-manager renews
//! them in place); a pair that fails to load is logged and the pair in use is kept.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// Longest a handshake may take before the connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once; more connections wait in the kernel's backlog.
const MAX_HANDSHAKES: usize = 64;
/// How often the files are checked for a change.
const RELOAD_EVERY: Duration = Duration::from_secs(30);

/// The command-line options both binaries take.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct TlsArgs {
    /// Serve /metrics, /healthz and /readyz over TLS with this PEM certificate chain (with
    /// --metrics-tls-key; both files are read again when they change).
    #[arg(long = "metrics-tls-cert", env = "FERROLB_METRICS_TLS_CERT")]
    pub cert: Option<PathBuf>,
    /// The PEM private key of --metrics-tls-cert.
    #[arg(long = "metrics-tls-key", env = "FERROLB_METRICS_TLS_KEY")]
    pub key: Option<PathBuf>,
}

impl TlsArgs {
    /// The pair, when TLS is asked for: both options or neither.
    pub fn files(&self) -> anyhow::Result<Option<TlsFiles>> {
        TlsFiles::from_args(self.cert.clone(), self.key.clone())
    }
}

/// Where the server's certificate chain and private key are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain, the server's certificate first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

impl TlsFiles {
    /// The pair from the two command-line options: both or neither.
    pub fn from_args(cert: Option<PathBuf>, key: Option<PathBuf>) -> anyhow::Result<Option<Self>> {
        match (cert, key) {
            (Some(cert), Some(key)) => Ok(Some(TlsFiles { cert, key })),
            (None, None) => Ok(None),
            (Some(_), None) => anyhow::bail!("--metrics-tls-cert needs --metrics-tls-key"),
            (None, Some(_)) => anyhow::bail!("--metrics-tls-key needs --metrics-tls-cert"),
        }
    }

    fn modified(&self) -> Option<(SystemTime, SystemTime)> {
        let at = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        Some((at(&self.cert)?, at(&self.key)?))
    }

    /// Reads and checks the pair.
    pub fn load(&self) -> anyhow::Result<Arc<ServerConfig>> {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&self.cert)
            .with_context(|| format!("reading {}", self.cert.display()))?
            .collect::<Result<_, _>>()
            .with_context(|| format!("parsing {}", self.cert.display()))?;
        if certs.is_empty() {
            anyhow::bail!("{} holds no certificate", self.cert.display());
        }
        let key = PrivateKeyDer::from_pem_file(&self.key)
            .with_context(|| format!("reading a private key from {}", self.key.display()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .with_context(|| {
                format!(
                    "{} and {} do not make a usable certificate and key",
                    self.cert.display(),
                    self.key.display()
                )
            })?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// A listener that hands the HTTP server only connections whose TLS handshake finished.
pub struct TlsListener {
    connections: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Serves TLS with `files` on `tcp`. Fails when the files do not load now; later changes
    /// that fail to load keep the pair in use.
    pub fn new(tcp: TcpListener, files: TlsFiles) -> anyhow::Result<Self> {
        let config = Arc::new(RwLock::new(files.load()?));
        let local = tcp.local_addr().context("the metrics listener's address")?;
        tokio::spawn(keep_reloading(files, config.clone()));
        let (tx, connections) = mpsc::channel(MAX_HANDSHAKES);
        tokio::spawn(accept(tcp, config, tx));
        Ok(TlsListener { connections, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.connections.recv().await {
            Some(connection) => connection,
            // The accepting task ended (it does not, short of a panic): serve nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}

async fn accept(
    tcp: TcpListener,
    config: Arc<RwLock<Arc<ServerConfig>>>,
    ready: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        let Ok(permit) = handshakes.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match tcp.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: wait instead of spinning.
                tracing::warn!(error = %e, "metrics server: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let acceptor = TlsAcceptor::from(config.read().unwrap_or_else(|p| p.into_inner()).clone());
        let ready = ready.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => {
                    let _ = ready.send((tls, peer)).await;
                }
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "metrics server: TLS handshake failed")
                }
                Err(_) => tracing::debug!(%peer, "metrics server: TLS handshake timed out"),
            }
        });
    }
}

async fn keep_reloading(files: TlsFiles, config: Arc<RwLock<Arc<ServerConfig>>>) {
    let mut seen = files.modified();
    loop {
        tokio::time::sleep(RELOAD_EVERY).await;
        let now = files.modified();
        if now == seen {
            continue;
        }
        seen = now;
        match files.load() {
            Ok(loaded) => {
                *config.write().unwrap_or_else(|p| p.into_inner()) = loaded;
                tracing::info!(cert = %files.cert.display(), "metrics server: certificate reloaded");
            }
            Err(e) => tracing::warn!(
                error = format!("{e:#}"),
                "metrics server: the changed certificate does not load; keeping the one in use"
            ),
        }
    }
}
