//! Observability: the Prometheus metrics under controller-runtime's and
//! client-go's names ([`metrics`], [`queue_metrics`], [`process`]) and the
//! logs ([`telemetry`]). Knows no Foo.

pub mod metrics;
pub mod process;
pub mod queue_metrics;
pub mod telemetry;
