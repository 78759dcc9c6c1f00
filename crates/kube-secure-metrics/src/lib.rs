//! A controller's `/metrics` over TLS for reviewed tokens only, its probes,
//! and client-go's process metrics.
#![doc = ""]
#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![warn(clippy::too_many_lines)]

mod auth;
mod http;
mod process;
mod tls;

pub use auth::{Access, MetricsAuth, REVIEW_BURST, REVIEWS_PER_SECOND, STALE_FOR};
/// The HTTP framework of the routers ([`metrics_router`] and the others
/// return its `Router`, which a user may extend), at the version this
/// crate builds with.
pub use axum;
pub use http::{
    BindError, Exposition, Limits, METRICS_ENDPOINTS, PROBE_ENDPOINTS, Readiness, Server, metrics_router,
    probes_router, secure_metrics_router, serve, serve_tls, serve_tls_with, serve_with,
};
pub use process::ProcessMetrics;
/// The metrics library of [`Exposition`]'s text and [`ProcessMetrics`]'
/// collector, at the version this crate builds with.
pub use prometheus_client;
pub use tls::{CERT_FILE, KEY_FILE, TlsError, server_config};
/// The TLS library of [`server_config`]'s and [`serve_tls`]'s
/// `ServerConfig`, at the version this crate builds with.
pub use tokio_rustls::rustls;
