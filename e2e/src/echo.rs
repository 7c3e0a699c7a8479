//! The lab pods' workload: an HTTP server on TCP 8080 and a UDP echo on 8081 that answer with the
//! pod's name (and, for HTTP, the client address the pod saw); `GET /stream` keeps its connection
//! and answers each line sent on it.
//!
//! The server lives in the std-only crate `ferrolb-echo` (e2e/echo), which is also the lab's
//! container image for pods on kubelet nodes; this module re-exports it for the lab.

pub use ferrolb_echo::{HTTP_PORT, STREAM_PATH, UDP_PORT};

/// Serves until killed. Both listeners bind `[::]`, which also accepts IPv4.
pub fn serve(name: &str) -> anyhow::Result<()> {
    Ok(ferrolb_echo::serve(name)?)
}
