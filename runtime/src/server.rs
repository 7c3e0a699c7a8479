//! The HTTP server both binaries run beside their work loop: `/metrics` (OpenMetrics text),
//! `/healthz` (503 when the work loop's pulse has stopped), `/readyz` (503 with the reason until
//! the loop says it is ready, and while the pulse is stopped), and read-only JSON pages (the
//! speaker's live report); over TLS when configured.
//!
//! Connections are bounded ([`Limits`]): a client that sends its headers slowly (a slow-loris)
//! or holds a connection idle is closed after the header-read timeout, and at most
//! [`Limits::max_connections`] are served at once (the others wait in the kernel's backlog), so
//! no client can hold the kubelet's probes or Prometheus away for long, or take the process's
//! file descriptors.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;

use crate::{health, tls};

/// A readiness flag shared between the work loop and `/readyz`, with why it is not ready.
#[derive(Clone, Default)]
pub struct Ready(Arc<ReadyState>);

#[derive(Default)]
struct ReadyState {
    ready: AtomicBool,
    /// Why not, when the loop said so (else `serve`'s `not_ready_reason`).
    why_not: std::sync::Mutex<Option<&'static str>>,
}

impl Ready {
    /// Sets readiness.
    pub fn set(&self, ready: bool) {
        self.0.ready.store(ready, Ordering::Relaxed);
    }

    /// Sets readiness from `Ok` or the reason it is not ready (what `/readyz` then answers).
    pub fn set_result(&self, result: Result<(), &'static str>) {
        if let Err(why) = result {
            *self.0.why_not.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
        }
        self.set(result.is_ok());
    }

    /// Current readiness.
    pub fn get(&self) -> bool {
        self.0.ready.load(Ordering::Relaxed)
    }

    /// Why it is not ready, when the loop said so.
    fn why_not(&self) -> Option<&'static str> {
        *self.0.why_not.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What the handlers share: the parts of [`Server`] they answer from.
#[derive(Clone)]
struct Probes {
    registry: Arc<Registry>,
    ready: Ready,
    not_ready_reason: &'static str,
    pulse: health::Pulse,
}

async fn metrics_page(State(probes): State<Probes>) -> impl IntoResponse {
    let mut body = String::new();
    match encode(&mut body, &probes.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

async fn healthz(State(probes): State<Probes>) -> impl IntoResponse {
    match probes.pulse.check() {
        Ok(()) => (StatusCode::OK, "ok\n".to_string()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

async fn readyz(State(probes): State<Probes>) -> impl IntoResponse {
    if let Err(why) = probes.pulse.check() {
        return (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n"));
    }
    if probes.ready.get() {
        (StatusCode::OK, "ok\n".to_string())
    } else {
        let why = probes.ready.why_not().unwrap_or(probes.not_ready_reason);
        (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n"))
    }
}

/// How a page answers one request, from its headers: the status and the body, JSON when the
/// status is 200 and plain text otherwise (the speaker's report checks the caller's token first).
pub type JsonPage = Arc<
    dyn Fn(axum::http::HeaderMap) -> futures::future::BoxFuture<'static, (StatusCode, String)>
        + Send
        + Sync,
>;

/// Read-only JSON documents served next to `/metrics`: each path with how it answers (the
/// speaker's live report for `kubectl ferrolb explain`).
pub type JsonPages = Vec<(&'static str, JsonPage)>;

/// What the server serves.
pub struct Server {
    /// The metrics `/metrics` encodes.
    pub registry: Arc<Registry>,
    /// Whether `/readyz` answers 200.
    pub ready: Ready,
    /// What `/readyz` says until the work loop gives its own reason (or is ready).
    pub not_ready_reason: &'static str,
    /// The work loop's heartbeat: silent past its limit, `/healthz` and `/readyz` fail.
    pub pulse: health::Pulse,
    /// TLS certificate and key; `None`: plain HTTP.
    pub tls: Option<tls::TlsFiles>,
    /// Read-only JSON documents served next to `/metrics`.
    pub pages: JsonPages,
}

/// What one client can hold of the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest a connection may take to send a request's headers, counted from when the server
    /// waits for them (a new connection, or one idle between requests): then it is closed.
    pub header_read_timeout: Duration,
    /// Connections served at once; further ones wait in the kernel's backlog until one closes.
    pub max_connections: usize,
}

impl Default for Limits {
    /// 5 s for headers (a probe or a scrape sends them in one packet), 64 connections (the
    /// kubelet's probes and a few scrapers need a handful).
    fn default() -> Self {
        Limits {
            header_read_timeout: Duration::from_secs(5),
            max_connections: 64,
        }
    }
}

/// Serves `server` on `addr` until the task is dropped.
pub async fn serve(addr: SocketAddr, server: Server) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    serve_on(listener, server).await
}

/// [`serve`] on a listener already bound.
pub async fn serve_on(listener: tokio::net::TcpListener, server: Server) -> anyhow::Result<()> {
    serve_limited(listener, server, Limits::default()).await
}

/// [`serve_on`] with other [`Limits`] than the default.
pub async fn serve_limited(
    listener: tokio::net::TcpListener,
    server: Server,
    limits: Limits,
) -> anyhow::Result<()> {
    let Server {
        registry,
        ready,
        not_ready_reason,
        pulse,
        tls,
        pages,
    } = server;
    let mut app = Router::new();
    for (path, render) in pages {
        app = app.route(
            path,
            get(move |headers| {
                let answer = render(headers);
                async move {
                    let (status, body) = answer.await;
                    let json = status == StatusCode::OK;
                    let kind = if json {
                        "application/json"
                    } else {
                        "text/plain"
                    };
                    (status, [(header::CONTENT_TYPE, kind)], body)
                }
            }),
        );
    }
    let app = app
        .route("/metrics", get(metrics_page))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(Probes {
            registry,
            ready,
            not_ready_reason,
            pulse,
        });
    match tls {
        Some(files) => {
            serve_connections(tls::TlsListener::new(listener, files)?, app, limits).await
        }
        None => serve_connections(listener, app, limits).await,
    }
    Ok(())
}

/// Accepts connections from `listener` while fewer than `limits.max_connections` are open,
/// and serves each over HTTP/1.1 with the header-read timeout. Returns only if the slots are
/// closed, which does not happen.
async fn serve_connections<L: axum::serve::Listener>(mut listener: L, app: Router, limits: Limits) {
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let mut http = hyper::server::conn::http1::Builder::new();
    // The timer is what makes hyper enforce the header-read timeout (without one it has none).
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        // The listener retries failed accepts itself (axum's `Listener`, and `TlsListener`).
        let (io, _) = listener.accept().await;
        let connection =
            http.serve_connection(TokioIo::new(io), TowerToHyperService::new(app.clone()));
        tokio::spawn(async move {
            // Held until the connection ends, whichever way.
            let _slot = slot;
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "metrics server: connection ended");
            }
        });
    }
}
