//! The metrics and probe endpoints, on axum: `/metrics` (OpenMetrics text),
//! `/healthz` (the process serves requests) and `/readyz` (ready to work:
//! its Foo and Deployment caches are filled, on a leader and a standby
//! alike); `/metrics` over HTTPS for reviewed tokens when secure.

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
use crate::metrics_auth::{Access, MetricsAuth};
/// A listener that could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("cannot serve HTTP on {addr}: {source}")]
pub struct BindError {
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

type Result<T> = std::result::Result<T, BindError>;

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
    let (listener, bound) = bind(addr).await?;
    tracing::info!(addr = %bound, endpoints = %what, "serving HTTP");
    Ok(tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            tracing::error!(addr = %bound, error = %e, "HTTP server stopped");
        }
    }))
}

/// Like [`serve`], over TLS with `tls`, each connection HTTP/1.1 only
/// unless `http2`; a handshake or a request header slower than
/// [`SLOW_CLIENT`] is dropped.
pub async fn serve_tls(
    addr: SocketAddr,
    what: &'static str,
    router: Router,
    tls: Arc<tokio_rustls::rustls::ServerConfig>,
    http2: bool,
) -> Result<tokio::task::JoinHandle<()>> {
    let (listener, bound) = bind(addr).await?;
    tracing::info!(addr = %bound, tls = true, http2, endpoints = %what, "serving HTTP");
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    Ok(tokio::spawn(async move {
        loop {
            let (tcp, _) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(addr = %bound, error = %e, "cannot accept a connection");
                    continue;
                }
            };
            let (acceptor, router) = (acceptor.clone(), router.clone());
            tokio::spawn(async move {
                let Ok(Ok(stream)) = tokio::time::timeout(SLOW_CLIENT, acceptor.accept(tcp)).await else { return };
                let io = hyper_util::rt::TokioIo::new(stream);
                let service = hyper_util::service::TowerToHyperService::new(router);
                let mut builder = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
                if !http2 {
                    builder = builder.http1_only();
                }
                builder.http1().timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(SLOW_CLIENT);
                if let Err(e) = builder.serve_connection(io, service).await {
                    tracing::debug!(error = %e, "metrics connection ended");
                }
            });
        }
    }))
}

/// Bind `addr`; also returns the bound address (with port 0 the kernel
/// picks one, and the start-up log says which).
async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr).await.map_err(|source| BindError { addr, source })?;
    let bound = listener.local_addr().map_err(|source| BindError { addr, source })?;
    Ok((listener, bound))
}

/// How long a client may take over its TLS handshake or request header.
const SLOW_CLIENT: std::time::Duration = std::time::Duration::from_secs(10);

/// What each listener serves, as its start-up log line says.
pub const METRICS_ENDPOINTS: &str = "/metrics";
pub const PROBE_ENDPOINTS: &str = "/healthz,/readyz";

pub fn metrics_router(metrics: Arc<Metrics>) -> Router {
    Router::new().route("/metrics", get(metrics_handler)).with_state(metrics)
}

/// The metrics router, each request first checked by `auth`: 401 without
/// a valid token, 403 for a user without `get` on `/metrics`, 500 if the
/// API server could not be asked.
pub fn secure_metrics_router(metrics: Arc<Metrics>, auth: Arc<MetricsAuth>) -> Router {
    metrics_router(metrics).layer(axum::middleware::from_fn_with_state(auth, authorize))
}

async fn authorize(
    State(auth): State<Arc<MetricsAuth>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let header = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    match auth.check(header).await {
        Ok(Access::Allowed) => next.run(request).await,
        Ok(Access::Unauthenticated) => {
            (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer")], "Unauthorized").into_response()
        }
        Ok(Access::Forbidden) => (StatusCode::FORBIDDEN, "Forbidden").into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot review a metrics scraper's token");
            (StatusCode::INTERNAL_SERVER_ERROR, "cannot review the token").into_response()
        }
    }
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
    use axum::body::Body;
    use tower::ServiceExt;

    async fn get(router: &Router, path: &str) -> StatusCode {
        let request = axum::http::Request::get(path).body(Body::empty()).unwrap();
        router.clone().oneshot(request).await.unwrap().status()
    }

    #[tokio::test]
    async fn readyz_answers_503_until_the_caches_are_synced_and_healthz_always_200() {
        let readiness = Arc::new(Readiness::default());
        let router = probes_router(readiness.clone());
        assert_eq!(get(&router, "/readyz").await, StatusCode::SERVICE_UNAVAILABLE, "standby or leader alike");
        assert_eq!(get(&router, "/healthz").await, StatusCode::OK);
        readiness.caches_synced();
        assert_eq!(get(&router, "/readyz").await, StatusCode::OK);
        assert_eq!(get(&router, "/metrics").await, StatusCode::NOT_FOUND, "metrics are on their own listener");
    }
}
