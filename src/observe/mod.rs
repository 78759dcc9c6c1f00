//! Observability: the Prometheus metrics under controller-runtime's and
//! client-go's names ([`metrics`], [`queue_metrics`]; the process's come
//! from crates/kube-secure-metrics) and the logs ([`telemetry`]). Knows no
//! Foo.

pub(crate) mod metrics;
pub(crate) mod queue_metrics;
pub mod telemetry;
