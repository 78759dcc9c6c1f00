//! Observability: the Prometheus metrics under controller-runtime's and
//! client-go's names ([`metrics`], [`queue_metrics`], [`process`]) and the
//! logs ([`telemetry`]). Knows no Foo.

pub(crate) mod metrics;
pub(crate) mod process;
pub(crate) mod queue_metrics;
pub mod telemetry;
