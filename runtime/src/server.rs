//! The HTTP server both binaries run beside their work loop: `/metrics` (OpenMetrics text),
//! `/healthz` (503 when the work loop's pulse has stopped), `/readyz` (503 with the reason until
//! the loop says it is ready, and while the pulse is stopped), and read-only JSON pages (the
//! speaker's live report); over TLS when configured.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
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

/// Read-only JSON documents served next to `/metrics`: each path with the function that
/// renders its body when asked (the speaker's live report for `kubectl ferrolb explain`).
pub type JsonPages = Vec<(&'static str, Arc<dyn Fn() -> String + Send + Sync>)>;

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

/// Serves `server` on `addr` until the task is dropped.
pub async fn serve(addr: SocketAddr, server: Server) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    serve_on(listener, server).await
}

/// [`serve`] on a listener already bound.
pub async fn serve_on(listener: tokio::net::TcpListener, server: Server) -> anyhow::Result<()> {
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
            get(move || {
                let body = render();
                async move { ([(header::CONTENT_TYPE, "application/json")], body) }
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
        Some(files) => axum::serve(tls::TlsListener::new(listener, files)?, app).await?,
        None => axum::serve(listener, app).await?,
    }
    Ok(())
}
