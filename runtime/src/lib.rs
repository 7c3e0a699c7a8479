//! Process wiring shared by ferrolb's binaries: logs, the `/metrics` `/healthz` `/readyz`
//! server with health that reflects the work loop ([`health`]), the Kubernetes client, watches into caches and the one watch of the configuration
//! ([`watch`]), and Events ([`events`]: a de-duplicating recorder behind a bounded queue), and failpoints that tests arm to
//! stall a live process ([`failpoint`]), TLS for that server as an option ([`tls`]), and the owner references that let the garbage collector remove what a component wrote ([`owner`]). Each binary keeps its own metrics and logic; this crate holds only what would
//! otherwise be copied between them.

pub mod events;
pub mod failpoint;
pub mod health;
pub mod owner;
pub mod tls;
pub mod watch;

use std::net::SocketAddr;
use std::path::Path;
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

/// Log output format.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Sets up logging to standard error. `RUST_LOG` overrides `level`.
pub fn init_logs(format: LogFormat, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.init(),
    }
}

/// A Kubernetes client from a kubeconfig file, or the in-cluster configuration (falling back to
/// `$KUBECONFIG` / `~/.kube/config`) when no file is given.
pub async fn kube_client(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .with_context(|| format!("loading {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("finding the cluster (in-cluster config or kubeconfig)")?,
    };
    Ok(kube::Client::try_from(config)?)
}

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

type Shared = (Arc<Registry>, Ready, &'static str, health::Pulse);

async fn metrics_page(State((registry, _, _, _)): State<Shared>) -> impl IntoResponse {
    let mut body = String::new();
    match encode(&mut body, &registry) {
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

async fn healthz(State((_, _, _, pulse)): State<Shared>) -> impl IntoResponse {
    match pulse.check() {
        Ok(()) => (StatusCode::OK, "ok\n".to_string()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

async fn readyz(State((_, ready, why_not, pulse)): State<Shared>) -> impl IntoResponse {
    if let Err(why) = pulse.check() {
        return (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n"));
    }
    if ready.get() {
        (StatusCode::OK, "ok\n".to_string())
    } else {
        let why = ready.why_not().unwrap_or(why_not);
        (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n"))
    }
}

/// Read-only JSON documents served next to `/metrics`: each path with the function that
/// renders its body when asked (the speaker's live report for `kubectl ferrolb explain`).
pub type JsonPages = Vec<(&'static str, Arc<dyn Fn() -> String + Send + Sync>)>;

/// Serves `/metrics` (OpenMetrics text of `registry`), `/healthz` (503 when the work loop's
/// `pulse` has stopped), `/readyz` (503 with `not_ready_reason` until `ready` is set, and
/// while the pulse is stopped) and the `pages` until the task is dropped; over TLS when `tls`
/// is given.
pub async fn serve(
    addr: SocketAddr,
    registry: Arc<Registry>,
    ready: Ready,
    not_ready_reason: &'static str,
    pulse: health::Pulse,
    tls: Option<tls::TlsFiles>,
    pages: JsonPages,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    serve_on(
        listener,
        registry,
        ready,
        not_ready_reason,
        pulse,
        tls,
        pages,
    )
    .await
}

/// [`serve`] on a listener already bound.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    registry: Arc<Registry>,
    ready: Ready,
    not_ready_reason: &'static str,
    pulse: health::Pulse,
    tls: Option<tls::TlsFiles>,
    pages: JsonPages,
) -> anyhow::Result<()> {
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
        .with_state((registry, ready, not_ready_reason, pulse));
    match tls {
        Some(files) => axum::serve(tls::TlsListener::new(listener, files)?, app).await?,
        None => axum::serve(listener, app).await?,
    }
    Ok(())
}

/// Resolves when the process gets SIGTERM or SIGINT.
pub async fn shutdown_signal() -> anyhow::Result<&'static str> {
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        _ = sigterm.recv() => Ok("SIGTERM"),
        _ = tokio::signal::ctrl_c() => Ok("SIGINT"),
    }
}

/// Runs a binary's async main on the runtime both binaries use (two worker threads: the work is
/// I/O, and a node's cores belong to its workloads) and turns the outcome into the exit code: 0,
/// 1 with the error logged (with its context chain), or 2 when the runtime cannot start.
pub fn block_on_main<F>(main: F) -> std::process::ExitCode
where
    F: std::future::Future<Output = anyhow::Result<()>>,
{
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    match runtime.block_on(main) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            std::process::ExitCode::from(1)
        }
    }
}
