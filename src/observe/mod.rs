//! Observability: the Prometheus metrics under controller-runtime's and
//! client-go's names ([`metrics`], [`workqueue`], [`process`]) and the
//! logs ([`telemetry`]). Knows no Foo.

pub mod metrics;
pub mod process;
pub mod telemetry;
pub mod workqueue;
