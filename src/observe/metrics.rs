//! Prometheus metrics under controller-runtime's names, so dashboards and
//! alerts written for kubebuilder operators work unchanged:
//! `controller_runtime_reconcile_total{controller,result}`,
//! `controller_runtime_reconcile_errors_total{controller}` and, of those
//! errors, `controller_runtime_reconcile_timeouts_total`,
//! `controller_runtime_reconcile_panics_total` and
//! `controller_runtime_terminal_reconcile_errors_total`,
//! `controller_runtime_reconcile_time_seconds{controller}`,
//! `controller_runtime_active_workers{controller}`,
//! `controller_runtime_max_concurrent_reconciles{controller}`, and
//! client-go's leader gauge `leader_election_master_status{name}`, and
//! `sample_controller_build_info{version,revision}` (always 1), which says
//! what runs; and what says the operator cannot do its job, whatever the
//! cause (`watchdog`): `sample_controller_unsynced_foos`,
//! `sample_controller_unsynced_foo_oldest_seconds`,
//! `sample_controller_leader_fence_refused_seconds` and
//! `sample_controller_leader_fence{state}`; whether the API server confines
//! the ServiceAccount, `sample_controller_confinement{state}`
//! (`confinement_probe`); and
//! `sample_controller_metrics_auth_throttled_total`, the scrapes refused
//! with 429 because the token reviews were over their limit.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use kube::runtime::controller::Action;

use crate::observe::queue_metrics::QueueMetrics;

/// The commit this binary was built from: hack/build-image.sh sets
/// `SAMPLE_CONTROLLER_REVISION` for the image's build (the commit, with
/// `-modified` when the tree differed from it); any other build says
/// `unknown`. The `revision` label of `sample_controller_build_info`.
pub(crate) const REVISION: &str = match option_env!("SAMPLE_CONTROLLER_REVISION") {
    Some(revision) => revision,
    None => "unknown",
};

/// Name used for the controller in metrics labels (`controller="foo"`), as
/// controller-runtime names a controller after the kind it reconciles.
pub(crate) const METRICS_CONTROLLER_LABEL: &str = "foo";

/// The states of `sample_controller_leader_fence{state}` a leader reports
/// (the elector's `FenceState` labels; a standby reports none).
pub(crate) const FENCE_STATES: [&str; 3] = ["in_place", "open", "not_installed"];

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
struct BuildLabels {
    version: String,
    revision: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LeaseLabels {
    name: String,
}

/// The `state` of a gauge that is 1 for the state it is in.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

/// Where a replica's memory limit comes from: `cgroup` or `flag`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    source: &'static str,
}

/// client-go's `rest_client_requests_total` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RestLabels {
    pub(crate) code: String,
    pub(crate) method: String,
    pub(crate) host: String,
}

/// Result label values, as controller-runtime's. `requeue` (an immediate,
/// rate-limited requeue) has no kube-runtime equivalent and stays at zero;
/// it is registered so dashboards find the series.
pub(crate) const RESULT_SUCCESS: &str = "success";
pub(crate) const RESULT_ERROR: &str = "error";
pub(crate) const RESULT_REQUEUE: &str = "requeue";
pub(crate) const RESULT_REQUEUE_AFTER: &str = "requeue_after";

/// controller-runtime's reconcile-time buckets: 5 ms .. 60 s.
const RECONCILE_TIME_BUCKETS: [f64; 40] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5,
    1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0,
];

/// The registry and the handles the controller updates.
pub struct Metrics {
    registry: Registry,
    reconcile_total: Family<ResultLabels, Counter>,
    reconcile_errors: Family<ControllerLabels, Counter>,
    reconcile_timeouts: Family<ControllerLabels, Counter>,
    reconcile_panics: Family<ControllerLabels, Counter>,
    terminal_errors: Family<ControllerLabels, Counter>,
    reconcile_time: Family<ControllerLabels, Histogram>,
    active_workers: Family<ControllerLabels, Gauge>,
    max_workers: Family<ControllerLabels, Gauge>,
    leader: Family<LeaseLabels, Gauge>,
    build_info: Family<BuildLabels, Gauge>,
    unsynced_foos: Gauge,
    unsynced_oldest: Gauge,
    cached_foos: Gauge,
    limit_foos: Family<SourceLabels, Gauge>,
    fence_refused: Gauge,
    fence_state: Family<StateLabels, Gauge>,
    confinement: Family<StateLabels, Gauge>,
    metrics_auth_throttled: Counter,
    /// The reconcile queue, as client-go's workqueue metrics.
    pub queue: Arc<QueueMetrics>,
    /// Every API request, by code, method and host.
    pub rest_requests: Family<RestLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let m = Metrics {
            registry: Registry::default(),
            reconcile_total: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_timeouts: Family::default(),
            reconcile_panics: Family::default(),
            terminal_errors: Family::default(),
            reconcile_time: Family::new_with_constructor(|| Histogram::new(RECONCILE_TIME_BUCKETS)),
            active_workers: Family::default(),
            max_workers: Family::default(),
            leader: Family::default(),
            build_info: Family::default(),
            unsynced_foos: Gauge::default(),
            unsynced_oldest: Gauge::default(),
            cached_foos: Gauge::default(),
            limit_foos: Family::default(),
            fence_refused: Gauge::default(),
            fence_state: Family::default(),
            confinement: Family::default(),
            metrics_auth_throttled: Counter::default(),
            queue: Arc::default(),
            rest_requests: Family::default(),
        };
        m.registered().zeroed()
    }

    /// Every family under its controller-runtime or client-go name
    /// (prometheus-client appends `_total` to counters), then the
    /// operator's own.
    fn registered(mut self) -> Self {
        let mut registry = std::mem::take(&mut self.registry);
        self.register_controller_runtimes(&mut registry);
        self.register_own(&mut registry);
        registry.register(
            "rest_client_requests",
            "Number of HTTP requests, partitioned by status code, method, and host.",
            self.rest_requests.clone(),
        );
        registry.register_collector(Box::new(kube_secure_metrics::ProcessMetrics));
        self.queue.register(&mut registry, METRICS_CONTROLLER_LABEL);
        self.registry = registry;
        self
    }

    /// controller-runtime's controller and leader-election families.
    fn register_controller_runtimes(&self, r: &mut Registry) {
        r.register(
            "controller_runtime_reconcile",
            "Total number of reconciliations per controller",
            self.reconcile_total.clone(),
        );
        r.register(
            "controller_runtime_reconcile_errors",
            "Total number of reconciliation errors per controller",
            self.reconcile_errors.clone(),
        );
        r.register(
            "controller_runtime_reconcile_timeouts",
            "Total number of reconciliation timeouts per controller",
            self.reconcile_timeouts.clone(),
        );
        r.register(
            "controller_runtime_reconcile_panics",
            "Total number of reconciliation panics per controller",
            self.reconcile_panics.clone(),
        );
        r.register(
            "controller_runtime_terminal_reconcile_errors",
            "Total number of terminal reconciliation errors per controller",
            self.terminal_errors.clone(),
        );
        r.register(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            self.reconcile_time.clone(),
        );
        r.register(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            self.active_workers.clone(),
        );
        r.register(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller",
            self.max_workers.clone(),
        );
        r.register(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master",
            self.leader.clone(),
        );
    }

    /// The families of this operator's own, `sample_controller_*`.
    fn register_own(&self, r: &mut Registry) {
        r.register(
            "sample_controller_build_info",
            "A metric with a constant '1' value labeled by the version and the commit the binary was built from",
            self.build_info.clone(),
        );
        r.register(
            "sample_controller_unsynced_foos",
            "Foos of this instance whose newest generation has no status written for it yet (status.observedGeneration behind metadata.generation)",
            self.unsynced_foos.clone(),
        );
        r.register(
            "sample_controller_unsynced_foo_oldest_seconds",
            "How long the longest-waiting of the unsynced Foos has waited, as this replica saw it (0: none)",
            self.unsynced_oldest.clone(),
        );
        r.register(
            "sample_controller_cached_foos",
            "Foos in this replica's cache: those of its namespace and shard",
            self.cached_foos.clone(),
        );
        r.register(
            "sample_controller_memory_limit_foos",
            "The Foos this replica's memory limit holds at its peak (docs/sizing.md), by where the limit comes from (its cgroup, or --memory-limit); absent without a limit",
            self.limit_foos.clone(),
        );
        r.register(
            "sample_controller_leader_fence_refused_seconds",
            "How long the API server's leader fence has refused this leader's writes, none admitted since (0: not refusing)",
            self.fence_refused.clone(),
        );
        r.register(
            "sample_controller_leader_fence",
            "The leader's API server fence: 1 for its state, in_place (the LeaderFence names it), open (deleted, its CRD deleted, or naming another replica, not yet claimed again) or not_installed (no fence to claim when it took the Lease); all 0 on a standby",
            self.fence_state.clone(),
        );
        r.register(
            "sample_controller_confinement",
            "Whether the API server confines the operator's ServiceAccount to the Deployment writes it makes, as the leader's last dry runs found: 1 for its state, enforced, open (a write it must refuse was admitted), refuses_own_writes (the operator's own create was refused) or unknown (the dry runs failed); all 0 on a standby or before the first check",
            self.confinement.clone(),
        );
        r.register(
            "sample_controller_metrics_auth_throttled",
            "Scrapes of the secure metrics refused with 429: a token not yet reviewed while the token reviews were over their limit",
            self.metrics_auth_throttled.clone(),
        );
    }

    /// Start every series at zero so rate() and alerts see them before the
    /// first reconcile.
    fn zeroed(self) -> Self {
        for result in [RESULT_SUCCESS, RESULT_ERROR, RESULT_REQUEUE, RESULT_REQUEUE_AFTER] {
            let _ = self.reconcile_total.get_or_create(&result_labels(result));
        }
        for counter in [&self.reconcile_errors, &self.reconcile_timeouts, &self.reconcile_panics, &self.terminal_errors]
        {
            let _ = counter.get_or_create(&controller_labels());
        }
        let _ = self.active_workers.get_or_create(&controller_labels());
        let _ = self.reconcile_time.get_or_create(&controller_labels());
        let build = BuildLabels { version: env!("CARGO_PKG_VERSION").into(), revision: REVISION.into() };
        self.build_info.get_or_create(&build).set(1);
        self
    }

    /// Record one finished reconcile: an error, a requeue after a delay, or
    /// a success (nothing more to do until something changes).
    pub(crate) fn observe_reconcile<E>(&self, took: Duration, outcome: Result<&Action, &E>) {
        let result = match outcome {
            Err(_) => RESULT_ERROR,
            Ok(action) if *action == Action::await_change() => RESULT_SUCCESS,
            Ok(_) => RESULT_REQUEUE_AFTER,
        };
        self.reconcile_total.get_or_create(&result_labels(result)).inc();
        if outcome.is_err() {
            self.reconcile_errors.get_or_create(&controller_labels()).inc();
        }
        self.reconcile_time.get_or_create(&controller_labels()).observe(took.as_secs_f64());
    }

    /// Count a sync abandoned at its deadline (also counted as an error).
    pub(crate) fn count_timeout(&self) {
        self.reconcile_timeouts.get_or_create(&controller_labels()).inc();
    }

    /// Count a sync that panicked (also counted as an error).
    pub(crate) fn count_panic(&self) {
        self.reconcile_panics.get_or_create(&controller_labels()).inc();
    }

    /// Count an error retrying alone cannot fix (also counted as an error).
    pub(crate) fn count_terminal(&self) {
        self.terminal_errors.get_or_create(&controller_labels()).inc();
    }

    /// Count a worker busy until the returned guard is dropped — also when a
    /// reconcile is cancelled, so the gauge never leaks.
    pub(crate) fn worker_started(&self) -> WorkerGuard {
        let gauge = self.active_workers.get_or_create(&controller_labels()).clone();
        gauge.inc();
        WorkerGuard(gauge)
    }

    pub(crate) fn set_max_workers(&self, workers: u16) {
        self.max_workers.get_or_create(&controller_labels()).set(i64::from(workers));
    }

    pub(crate) fn set_leader(&self, lease: &str, leading: bool) {
        self.leader.get_or_create(&LeaseLabels { name: lease.into() }).set(i64::from(leading));
    }

    /// The Foos not yet synced: how many, and the longest wait.
    pub(crate) fn set_unsynced(&self, foos: usize, oldest: Duration) {
        self.unsynced_foos.set(i64::try_from(foos).unwrap_or(i64::MAX));
        self.unsynced_oldest.set(seconds(oldest));
    }

    /// The Foos cached, and those the memory limit from `source` holds
    /// (`None`: no limit known).
    pub(crate) fn set_sizing(&self, cached: usize, held: Option<(u64, &'static str)>) {
        self.cached_foos.set(i64::try_from(cached).unwrap_or(i64::MAX));
        self.limit_foos.clear();
        if let Some((held, source)) = held {
            self.limit_foos.get_or_create(&SourceLabels { source }).set(i64::try_from(held).unwrap_or(i64::MAX));
        }
    }

    /// How long the API server's fence has refused this leader's writes.
    pub(crate) fn set_fence_refused(&self, refused_for: Duration) {
        self.fence_refused.set(seconds(refused_for));
    }

    /// Where the leader's API server fence stands: 1 for `state` (one of
    /// [`FENCE_STATES`]), 0 for the others (all 0 on a standby).
    pub(crate) fn set_fence_state(&self, state: &str) {
        for each in FENCE_STATES {
            self.fence_state.get_or_create(&StateLabels { state: each }).set(i64::from(each == state));
        }
    }

    /// What the leader's last probe of the ServiceAccount's confinement
    /// found: 1 for `state` (one of `labels`), 0 for the others.
    pub(crate) fn set_confinement(&self, state: &str, labels: &[&'static str]) {
        for each in labels {
            self.confinement.get_or_create(&StateLabels { state: each }).set(i64::from(*each == state));
        }
    }

    /// The count of scrapes refused because the token reviews were over
    /// their limit, for the metrics server to increment.
    pub(crate) fn auth_throttled(&self) -> Counter {
        self.metrics_auth_throttled.clone()
    }

    /// A registry with a series in every family, each of its labels set:
    /// what tests/docs.rs checks docs/metrics.md against.
    #[cfg(any(test, feature = "test-fixtures"))]
    pub fn with_every_family() -> Self {
        let m = Metrics::new();
        m.observe_reconcile::<()>(Duration::ZERO, Ok(&Action::await_change()));
        m.count_timeout();
        m.count_panic();
        m.count_terminal();
        drop(m.worker_started());
        m.set_max_workers(1);
        m.set_leader("sample-controller", true);
        m.set_unsynced(0, Duration::ZERO);
        m.set_sizing(0, Some((1, "cgroup")));
        m.set_fence_refused(Duration::ZERO);
        m.set_fence_state(FENCE_STATES[0]);
        m.set_confinement("enforced", &["enforced"]);
        m.auth_throttled().inc();
        let request = RestLabels { code: "200".into(), method: "GET".into(), host: "api".into() };
        m.rest_requests.get_or_create(&request).inc();
        m
    }

    /// The registry in Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Whole seconds, as the gauges count them.
fn seconds(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

/// Decrements `controller_runtime_active_workers` on drop.
pub(crate) struct WorkerGuard(Gauge);

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
    use crate::testing::metric_value;

    fn value(m: &Metrics, series: &str) -> f64 {
        let text = m.encode();
        metric_value(&text, series).unwrap_or_else(|| panic!("no {series} in\n{text}"))
    }

    #[test]
    fn reconcile_metrics_use_controller_runtime_names() {
        let m = Metrics::new();
        m.observe_reconcile::<&str>(Duration::from_millis(20), Ok(&Action::await_change()));
        m.observe_reconcile::<&str>(Duration::from_millis(20), Ok(&Action::requeue(Duration::from_millis(5))));
        m.observe_reconcile(Duration::from_millis(20), Err(&"refused"));
        let total = |result: &str| {
            value(&m, &format!(r#"controller_runtime_reconcile_total{{controller="foo",result="{result}"}}"#))
        };
        assert_eq!([total("success"), total("error"), total("requeue"), total("requeue_after")], [1.0, 1.0, 0.0, 1.0]);
        assert_eq!(value(&m, r#"controller_runtime_reconcile_errors_total{controller="foo"}"#), 1.0);
        assert_eq!(value(&m, r#"controller_runtime_reconcile_time_seconds_count{controller="foo"}"#), 3.0);
    }

    #[test]
    fn timeouts_panics_and_terminal_errors_start_at_zero_and_count_apart() {
        let m = Metrics::new();
        let series = |name: &str| format!(r#"controller_runtime_{name}_total{{controller="foo"}}"#);
        let counts = |m: &Metrics| {
            ["reconcile_timeouts", "reconcile_panics", "terminal_reconcile_errors"].map(|n| value(m, &series(n)))
        };
        assert_eq!(counts(&m), [0.0; 3], "dashboards find them before the first failure");
        m.count_timeout();
        m.count_panic();
        m.count_panic();
        m.count_terminal();
        m.count_terminal();
        m.count_terminal();
        assert_eq!(counts(&m), [1.0, 2.0, 3.0]);
    }

    #[test]
    fn dashboards_find_workqueue_process_and_rest_client_metrics() {
        let m = Metrics::new();
        m.queue.added("default/f".into());
        m.rest_requests
            .get_or_create(&RestLabels { code: "200".into(), method: "GET".into(), host: "h:1".into() })
            .inc();
        assert_eq!(value(&m, r#"workqueue_depth{name="foo",controller="foo",priority="0"}"#), 1.0);
        assert_eq!(value(&m, r#"workqueue_depth{name="foo",controller="foo",priority="-100"}"#), 0.0);
        assert_eq!(value(&m, r#"workqueue_adds_total{name="foo",controller="foo"}"#), 1.0);
        assert_eq!(value(&m, r#"rest_client_requests_total{code="200",method="GET",host="h:1"}"#), 1.0);
        assert!(value(&m, "process_resident_memory_bytes") > 1e6);
        // CPU time is counted in ticks of 10 ms: use some first.
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_millis(50) {
            std::hint::black_box((0..1000u64).sum::<u64>());
        }
        assert!(value(&m, "process_cpu_seconds_total") > 0.0);
    }

    #[test]
    fn active_workers_drop_back_when_the_guard_goes() {
        let m = Metrics::new();
        let g = m.worker_started();
        assert_eq!(value(&m, r#"controller_runtime_active_workers{controller="foo"}"#), 1.0);
        drop(g);
        assert_eq!(value(&m, r#"controller_runtime_active_workers{controller="foo"}"#), 0.0);
        m.set_leader("sample-controller", true);
        assert_eq!(value(&m, r#"leader_election_master_status{name="sample-controller"}"#), 1.0);
    }

    #[test]
    fn build_info_says_which_version_and_commit_runs() {
        let m = Metrics::new();
        let series =
            format!(r#"sample_controller_build_info{{version="{}",revision="{REVISION}"}}"#, env!("CARGO_PKG_VERSION"));
        assert_eq!(value(&m, &series), 1.0);
    }
}
