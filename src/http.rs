//! The metrics and probe endpoints, on axum: `/metrics` (Prometheus text),
//! `/healthz` (the process serves requests) and `/readyz` (ready to work:
//! a standby is ready, a leader once its Foo cache has synced).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;

use crate::metrics::Metrics;
use crate::{Error, Result};

/// What `/readyz` reports: ready once the caches are filled, on every
/// replica — a standby keeps them warm too, so a ready standby can take over
/// at once, and a rolling update or a drain waits for that.
#[derive(Default)]
pub struct Readiness {
    caches_synced: AtomicBool,
}

impl Readiness {
    pub fn caches_synced(&self) {
        self.caches_synced.store(true, Ordering::SeqCst);
    }

    pub fn is_ready(&self) -> bool {
        self.caches_synced.load(Ordering::SeqCst)
    }
}

/// Bind `addr` now (so a bad address fails start-up) and serve `router`
/// (`what` it serves, for the log) in the background.
pub async fn serve(addr: SocketAddr, what: &'static str, router: Router) -> Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(addr).await.map_err(|source| Error::Http { addr, source })?;
    // The bound address: with port 0 the kernel picks one, and this says which.
    let bound = listener.local_addr().map_err(|source| Error::Http { addr, source })?;
    tracing::info!(addr = %bound, endpoints = %what, "serving HTTP");
    Ok(tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            tracing::error!(addr = %bound, error = %e, "HTTP server stopped");
        }
    }))
}

/// What each listener serves, as its start-up log line says.
pub const METRICS_ENDPOINTS: &str = "/metrics";
pub const PROBE_ENDPOINTS: &str = "/healthz,/readyz";

pub fn metrics_router(metrics: Arc<Metrics>) -> Router {
    Router::new().route("/metrics", get(metrics_handler)).with_state(metrics)
}

pub fn probes_router(readiness: Arc<Readiness>) -> Router {
    Router::new().route("/healthz", get(|| async { "ok" })).route("/readyz", get(readyz)).with_state(readiness)
}

async fn metrics_handler(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], metrics.encode())
}

async fn readyz(State(readiness): State<Arc<Readiness>>) -> impl IntoResponse {
    if readiness.is_ready() { (StatusCode::OK, "ok") } else { (StatusCode::SERVICE_UNAVAILABLE, "caches not synced") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_once_the_caches_are_synced() {
        let r = Readiness::default();
        assert!(!r.is_ready(), "not before the caches are filled, standby or leader");
        r.caches_synced();
        assert!(r.is_ready());
    }
}
