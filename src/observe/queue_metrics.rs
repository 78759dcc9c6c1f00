//! client-go's workqueue metrics, as kubebuilder's dashboards and alerts
//! read them (`workqueue_depth`, `workqueue_adds_total`,
//! `workqueue_queue_duration_seconds`, `workqueue_work_duration_seconds`,
//! `workqueue_retries_total`, `workqueue_unfinished_work_seconds`,
//! `workqueue_longest_running_processor_seconds`, labels `name` and
//! `controller`; the depth also `priority`, as controller-runtime's priority
//! queue labels it since v0.23: [`Priority`]).
//!
//! kube-runtime's scheduler is not a client-go workqueue and does not expose
//! itself, so the queue is observed from outside: an *add* is a trigger the
//! controller receives (a Foo changed, a Deployment it owns changed or went,
//! a retry fell due), *depth* is the number of distinct Foos triggered and
//! not yet started (as client-go counts keys, not triggers), the *queue
//! duration* runs from a Foo's first pending trigger (a retry: from when it
//! fell due) to the start of its sync. Approximate: a trigger that arrives
//! while the same Foo is being synced counts as an add, as in client-go, but
//! kube-runtime may fold it into the running sync's successor differently.
//!
//! The same bookkeeping tells the Event publisher when syncs are backed up
//! ([`QueueMetrics::backed_up`]): an entry left behind here would hold
//! Events back, not only skew a gauge.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kube::Resource;
use kube::runtime::reflector::ObjectRef;
use parking_lot::Mutex;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// A queued Foo: `namespace/name`.
pub(crate) type Key = String;

/// Why a Foo waits, as controller-runtime's priority queue ranks it in
/// `workqueue_depth{priority}`: `0` for a change, `-100`
/// (`handler.LowPriority`, which it gives the objects of an initial list)
/// for the first sync of a Foo already in sync when this replica started,
/// relisted or took the Lease ([`crate::controller::backlog`]'s later lane). A
/// dashboard tells the start-up flood from changes waiting by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Priority {
    Change,
    FirstSync,
}

impl Priority {
    /// The `priority` label's value, controller-runtime's number.
    fn label(self) -> &'static str {
        match self {
            Priority::Change => "0",
            Priority::FirstSync => "-100",
        }
    }
}

/// A Foo waiting for a sync.
#[derive(Debug)]
struct Waiting {
    /// When it was (or falls) due.
    due: Instant,
    priority: Priority,
}

/// Slots the pending table keeps once empty; a larger one is let go.
const PENDING_KEPT: usize = 64;

/// The key of `obj` in the queue: `namespace/name`, as client-go's
/// `MetaNamespaceKeyFunc`.
pub(crate) fn queue_key<K: Resource>(obj: &ObjectRef<K>) -> Key {
    format!("{}/{}", obj.namespace.as_deref().unwrap_or_default(), obj.name)
}

/// client-go's buckets for queue and work durations: 10 ns .. 1000 s.
fn duration_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(1e-8, 10.0, 12)
}

/// The workqueue's metrics and the bookkeeping behind them.
#[derive(Debug)]
pub struct QueueMetrics {
    adds: Counter,
    retries: Counter,
    queue_duration: Histogram,
    work_duration: Histogram,
    /// Syncs that run at once (`--workers`); 0 until set.
    workers: AtomicUsize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Foos waiting for a sync.
    pending: HashMap<Key, Waiting>,
    /// Syncs running, with their start.
    running: HashMap<u64, Instant>,
    next_id: u64,
}

impl State {
    /// Take `key` off the pending table. Once a burst (a restore, a relist)
    /// has drained, its table goes too, even if a few Foos still wait out a
    /// retry.
    fn take(&mut self, key: &str) -> Option<Instant> {
        let due = self.pending.remove(key).map(|waiting| waiting.due);
        let (len, capacity) = (self.pending.len(), self.pending.capacity());
        if capacity > PENDING_KEPT && len * 4 < capacity {
            self.pending.shrink_to((len * 2).max(PENDING_KEPT / 2));
        }
        due
    }
}

/// Held while a sync runs; records its work duration when dropped.
pub(crate) struct Working<'a> {
    queue: &'a QueueMetrics,
    id: u64,
    started: Instant,
}

impl Drop for Working<'_> {
    fn drop(&mut self) {
        self.queue.work_duration.observe(self.started.elapsed().as_secs_f64());
        self.queue.state().running.remove(&self.id);
    }
}

impl Default for QueueMetrics {
    fn default() -> Self {
        QueueMetrics {
            adds: Counter::default(),
            retries: Counter::default(),
            queue_duration: Histogram::new(duration_buckets()),
            work_duration: Histogram::new(duration_buckets()),
            workers: AtomicUsize::new(0),
            state: Mutex::default(),
        }
    }
}

impl QueueMetrics {
    /// Register the families under `registry`'s prefix-free names with the
    /// labels `name` and `controller` set to `controller`.
    pub(crate) fn register(self: &std::sync::Arc<Self>, registry: &mut Registry, controller: &str) {
        let labels =
            [("name".into(), controller.to_owned().into()), ("controller".into(), controller.to_owned().into())];
        let sub = registry.sub_registry_with_labels(labels.into_iter());
        sub.register("workqueue_adds", "Total number of adds handled by workqueue", self.adds.clone());
        sub.register("workqueue_retries", "Total number of retries handled by workqueue", self.retries.clone());
        sub.register(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            self.queue_duration.clone(),
        );
        sub.register(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes",
            self.work_duration.clone(),
        );
        sub.register_collector(Box::new(self.clone()));
    }

    /// A trigger for `key` arrived: a change (the backlog counts each with
    /// its priority: [`QueueMetrics::added_as`]).
    #[cfg(any(test, feature = "test-fixtures"))]
    pub fn added(&self, key: Key) {
        self.added_as(key, Priority::Change);
    }

    /// A trigger for `key` arrived, as `priority`; a change raises a Foo
    /// already waiting for its first sync, as controller-runtime raises an
    /// item added again with a higher priority.
    pub(crate) fn added_as(&self, key: Key, priority: Priority) {
        self.adds.inc();
        let mut state = self.state();
        let waiting = state.pending.entry(key).or_insert_with(|| Waiting { due: Instant::now(), priority });
        if priority == Priority::Change {
            waiting.priority = Priority::Change;
        }
    }

    /// A failed sync of `key` is retried after `delay`.
    pub(crate) fn retried(&self, key: Key, delay: Duration) {
        self.retries.inc();
        self.adds.inc();
        let due = Instant::now() + delay;
        self.state().pending.entry(key).or_insert(Waiting { due, priority: Priority::Change });
    }

    /// `key` will not be synced (it was deleted, or a standby passed it by).
    pub(crate) fn forget(&self, key: &str) {
        self.state().take(key);
    }

    /// A sync of `key` starts; hold the guard until it ends.
    pub(crate) fn started(&self, key: &str) -> Working<'_> {
        let now = Instant::now();
        let mut state = self.state();
        let waited = state.take(key).map_or(Duration::ZERO, |due| now.saturating_duration_since(due));
        let id = state.next_id;
        state.next_id += 1;
        state.running.insert(id, now);
        drop(state);
        self.queue_duration.observe(waited.as_secs_f64());
        Working { queue: self, id, started: now }
    }

    /// How many syncs run at once, for [`QueueMetrics::backed_up`].
    pub(crate) fn set_workers(&self, workers: usize) {
        self.workers.store(workers, Ordering::Relaxed);
    }

    /// Whether syncs are backed up: every worker busy and another Foo due
    /// (one backing off after a failure is not waiting for a worker). What
    /// waits behind syncs (Events) goes slower then; once the syncs stop (a
    /// shutdown), nothing runs and nothing is backed up.
    pub(crate) fn backed_up(&self) -> bool {
        let workers = self.workers.load(Ordering::Relaxed);
        let state = self.state();
        let now = Instant::now();
        // In a burst nearly every entry is due, so the scan stops at one of
        // the first; only when every waiting Foo backs off does it read all.
        workers > 0 && state.running.len() >= workers && state.pending.values().any(|waiting| waiting.due <= now)
    }

    fn state(&self) -> parking_lot::MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Depth (changes, first syncs), unfinished work and the longest
    /// running sync, now.
    fn snapshot(&self) -> Snapshot {
        let now = Instant::now();
        let state = self.state();
        let due = state.pending.values().filter(|waiting| waiting.due <= now);
        let (changes, first_syncs) = due.fold((0, 0), |(c, f), waiting| match waiting.priority {
            Priority::Change => (c + 1, f),
            Priority::FirstSync => (c, f + 1),
        });
        let running = state.running.values().map(|start| now.duration_since(*start).as_secs_f64());
        let (unfinished, longest) = running.fold((0.0, 0.0_f64), |(sum, max), s| (sum + s, max.max(s)));
        Snapshot { changes, first_syncs, unfinished, longest }
    }
}

/// The gauges' values at one scrape.
#[derive(Debug, PartialEq)]
struct Snapshot {
    /// Due Foos waiting for a sync, by [`Priority`].
    changes: u32,
    first_syncs: u32,
    unfinished: f64,
    longest: f64,
}

#[cfg(test)]
impl Snapshot {
    fn depth(&self) -> u32 {
        self.changes + self.first_syncs
    }
}

/// The gauges computed at scrape time.
impl prometheus_client::collector::Collector for QueueMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let now = self.snapshot();
        let help = "Current depth of workqueue by workqueue and priority";
        let mut family = encoder.encode_descriptor("workqueue_depth", help, None, MetricType::Gauge)?;
        for (priority, waiting) in [(Priority::Change, now.changes), (Priority::FirstSync, now.first_syncs)] {
            let labels = [("priority", priority.label())];
            ConstGauge::new(f64::from(waiting)).encode(family.encode_family(&labels)?)?;
        }
        let gauges: [(&str, &str, ConstGauge<f64>); 2] = [
            (
                "workqueue_unfinished_work_seconds",
                "How many seconds of work has been done that is in progress and hasn't been observed by work_duration",
                ConstGauge::new(now.unfinished),
            ),
            (
                "workqueue_longest_running_processor_seconds",
                "How many seconds has the longest running processor for workqueue been running",
                ConstGauge::new(now.longest),
            ),
        ];
        for (name, help, gauge) in gauges {
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_counts_distinct_due_foos_and_a_sync_takes_one_off() {
        let q = QueueMetrics::default();
        q.added("ns/a".into());
        q.added("ns/a".into());
        q.added("ns/b".into());
        q.retried("ns/c".into(), Duration::from_secs(60)); // not due yet
        assert_eq!(q.snapshot().depth(), 2);
        assert_eq!(q.adds.get(), 4);
        let working = q.started("ns/a");
        std::thread::sleep(Duration::from_millis(30));
        let Snapshot { changes: depth, unfinished, longest, .. } = q.snapshot();
        assert_eq!(depth, 1);
        assert!(unfinished >= 0.03 && longest >= 0.03, "a sync running for 30 ms: {unfinished}, {longest}");
        drop(working);
        assert_eq!(q.state().running.len(), 0);
        assert_eq!((q.snapshot().unfinished, q.snapshot().longest), (0.0, 0.0), "nothing running");
        q.forget("ns/b");
        assert_eq!(q.snapshot().depth(), 0);
        assert_eq!(q.retries.get(), 1);
    }

    #[test]
    fn first_syncs_and_changes_are_told_apart_and_a_change_raises_a_waiting_first_sync() {
        let q = QueueMetrics::default();
        q.added_as("ns/listed".into(), Priority::FirstSync);
        q.added_as("ns/listed-then-edited".into(), Priority::FirstSync);
        q.added("ns/edited".into());
        q.added("ns/listed-then-edited".into()); // an edit while it waited
        q.added_as("ns/edited".into(), Priority::FirstSync); // a relist finds it: still a change
        let now = q.snapshot();
        assert_eq!((now.changes, now.first_syncs), (2, 1));
        let text = {
            let mut registry = Registry::default();
            std::sync::Arc::new(q).register(&mut registry, "foo");
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
            text
        };
        for (priority, depth) in [("0", 2), ("-100", 1)] {
            let series = format!(r#"workqueue_depth{{name="foo",controller="foo",priority="{priority}"}} {depth}"#);
            assert!(text.contains(&series), "no {series} in\n{text}");
        }
    }

    #[test]
    fn syncs_are_backed_up_while_every_worker_is_busy_and_another_foo_waits() {
        let q = QueueMetrics::default();
        q.added("ns/a".into());
        q.added("ns/b".into());
        let a = q.started("ns/a");
        assert!(!q.backed_up(), "the number of workers is not known yet");
        q.set_workers(2);
        assert!(!q.backed_up(), "a worker is free for b");
        let b = q.started("ns/b");
        assert!(!q.backed_up(), "both busy, none waiting");
        q.retried("ns/c".into(), Duration::from_secs(60));
        assert!(!q.backed_up(), "c backs off: it waits for its time, not for a worker");
        q.added("ns/d".into());
        assert!(q.backed_up(), "both busy and d is due");
        drop((a, b));
        assert!(!q.backed_up(), "no sync running (a shutdown): nothing to yield to");
    }

    #[test]
    fn a_drained_burst_lets_its_table_go() {
        let q = QueueMetrics::default();
        let keys: Vec<Key> = (0..10_000).map(|i| format!("ns/foo-{i}")).collect();
        keys.iter().for_each(|k| q.added(k.clone()));
        keys[..5_000].iter().for_each(|k| drop(q.started(k)));
        assert!(q.state().pending.capacity() >= 10_000, "half still waiting: the table stays");
        q.retried("ns/failing".into(), Duration::from_secs(600));
        keys[5_000..9_000].iter().for_each(|k| drop(q.started(k)));
        keys[9_000..].iter().for_each(|k| q.forget(k)); // a standby passes them by
        let state = q.state();
        assert_eq!(state.pending.len(), 1, "the retry still waits");
        assert!(state.pending.capacity() <= PENDING_KEPT, "{} slots kept", state.pending.capacity());
    }
}
