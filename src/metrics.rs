//! Prometheus metrics under controller-runtime's names, so dashboards and
//! alerts written for kubebuilder operators work unchanged:
//! `controller_runtime_reconcile_total{controller,result}`,
//! `controller_runtime_reconcile_errors_total{controller}`,
//! `controller_runtime_reconcile_time_seconds{controller}`,
//! `controller_runtime_active_workers{controller}`,
//! `controller_runtime_max_concurrent_reconciles{controller}`, and
//! client-go's leader gauge `leader_election_master_status{name}`.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::Error;
use crate::constants::METRICS_CONTROLLER_LABEL;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    controller: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LeaseLabels {
    name: String,
}

/// Result label values, as controller-runtime's.
pub const RESULT_SUCCESS: &str = "success";
pub const RESULT_ERROR: &str = "error";
pub const RESULT_REQUEUE: &str = "requeue";

/// The registry and the handles the controller updates.
pub struct Metrics {
    registry: Registry,
    reconcile_total: Family<ResultLabels, Counter>,
    reconcile_errors: Family<ControllerLabels, Counter>,
    reconcile_time: Family<ControllerLabels, Histogram>,
    active_workers: Family<ControllerLabels, Gauge>,
    max_workers: Family<ControllerLabels, Gauge>,
    leader: Family<LeaseLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let reconcile_total = Family::<ResultLabels, Counter>::default();
        let reconcile_errors = Family::<ControllerLabels, Counter>::default();
        // controller-runtime's buckets: 5 ms .. 60 s.
        let reconcile_time = Family::<ControllerLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([
                0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0,
                1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0, 25.0, 30.0,
                40.0, 50.0, 60.0,
            ])
        });
        let active_workers = Family::<ControllerLabels, Gauge>::default();
        let max_workers = Family::<ControllerLabels, Gauge>::default();
        let leader = Family::<LeaseLabels, Gauge>::default();
        // prometheus-client appends `_total` to counters.
        registry.register(
            "controller_runtime_reconcile",
            "Total number of reconciliations per controller",
            reconcile_total.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_errors",
            "Total number of reconciliation errors per controller",
            reconcile_errors.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            reconcile_time.clone(),
        );
        registry.register(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            active_workers.clone(),
        );
        registry.register(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller",
            max_workers.clone(),
        );
        registry.register(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master",
            leader.clone(),
        );
        let m = Metrics {
            registry,
            reconcile_total,
            reconcile_errors,
            reconcile_time,
            active_workers,
            max_workers,
            leader,
        };
        // Start every series at zero so rate() and alerts see them before
        // the first reconcile.
        for result in [RESULT_SUCCESS, RESULT_ERROR, RESULT_REQUEUE] {
            let _ = m.reconcile_total.get_or_create(&result_labels(result));
        }
        let _ = m.reconcile_errors.get_or_create(&controller_labels());
        let _ = m.active_workers.get_or_create(&controller_labels());
        let _ = m.reconcile_time.get_or_create(&controller_labels());
        m
    }

    /// Record one finished reconcile.
    pub fn observe_reconcile(&self, took: Duration, error: Option<&Error>) {
        let result = if error.is_some() { RESULT_ERROR } else { RESULT_SUCCESS };
        self.reconcile_total.get_or_create(&result_labels(result)).inc();
        if error.is_some() {
            self.reconcile_errors.get_or_create(&controller_labels()).inc();
        }
        self.reconcile_time.get_or_create(&controller_labels()).observe(took.as_secs_f64());
    }

    /// Count a worker busy until the returned guard is dropped — also when a
    /// reconcile is cancelled, so the gauge never leaks.
    pub fn worker_started(&self) -> WorkerGuard {
        let gauge = self.active_workers.get_or_create(&controller_labels()).clone();
        gauge.inc();
        WorkerGuard(gauge)
    }

    pub fn set_max_workers(&self, workers: u16) {
        self.max_workers.get_or_create(&controller_labels()).set(i64::from(workers));
    }

    pub fn set_leader(&self, lease: &str, leading: bool) {
        self.leader.get_or_create(&LeaseLabels { name: lease.into() }).set(i64::from(leading));
    }

    /// The registry in Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Decrements `controller_runtime_active_workers` on drop.
pub struct WorkerGuard(Gauge);

impl Drop for WorkerGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

fn controller_labels() -> ControllerLabels {
    ControllerLabels { controller: METRICS_CONTROLLER_LABEL.into() }
}

fn result_labels(result: &str) -> ResultLabels {
    ResultLabels { controller: METRICS_CONTROLLER_LABEL.into(), result: result.into() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
        text.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
    }

    #[test]
    fn reconcile_metrics_use_controller_runtime_names() {
        let m = Metrics::new();
        m.observe_reconcile(Duration::from_millis(20), None);
        m.observe_reconcile(
            Duration::from_millis(20),
            Some(&Error::ResourceExists { foo: "default/f".into(), deployment: "d".into() }),
        );
        let text = m.encode();
        assert_eq!(
            line(&text, r#"controller_runtime_reconcile_total{controller="foo",result="success"}"#).rsplit(' ').next(),
            Some("1")
        );
        assert_eq!(
            line(&text, r#"controller_runtime_reconcile_total{controller="foo",result="error"}"#).rsplit(' ').next(),
            Some("1")
        );
        assert_eq!(
            line(&text, r#"controller_runtime_reconcile_total{controller="foo",result="requeue"}"#).rsplit(' ').next(),
            Some("0")
        );
        assert_eq!(
            line(&text, r#"controller_runtime_reconcile_errors_total{controller="foo"}"#).rsplit(' ').next(),
            Some("1")
        );
        assert_eq!(
            line(&text, r#"controller_runtime_reconcile_time_seconds_count{controller="foo"}"#).rsplit(' ').next(),
            Some("2")
        );
    }

    #[test]
    fn active_workers_drop_back_when_the_guard_goes() {
        let m = Metrics::new();
        let g = m.worker_started();
        assert!(m.encode().contains("controller_runtime_active_workers{controller=\"foo\"} 1"));
        drop(g);
        assert!(m.encode().contains("controller_runtime_active_workers{controller=\"foo\"} 0"));
        m.set_leader("sample-controller", true);
        assert!(m.encode().contains("leader_election_master_status{name=\"sample-controller\"} 1"));
    }
}
