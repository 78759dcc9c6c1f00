//! What tells on-call that the operator cannot do its job, whatever the
//! cause — no replica leading, writes refused, a failing API server, a sync
//! that never ends: every [`PERIOD`], on every replica (a standby's caches
//! see the same Foos), the Foos whose newest generation has no status
//! written for it yet, and how long the oldest of them has waited
//! (`sample_controller_unsynced_foos`, `..._unsynced_foo_oldest_seconds`,
//! alerted on by SampleControllerFoosNotSynced); and, on the leader, how
//! long the API server's leader fence has refused its writes
//! (`sample_controller_leader_fence_refused_seconds`), an ERROR once it
//! lasts past a lease duration (SampleControllerLeaderFenceRefuses); and
//! the Foos cached against those the memory limit holds ([`sizing`]), a
//! WARN once past them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

use crate::cache::{Behind, Caches};
use crate::observe::metrics::Metrics;
use crate::ops::sizing::{self, Fit};
use kube_lease_fence::WriteGate;

/// How often the gauges are brought up to date: well within a scrape
/// interval, and a pass over 100 000 cached Foos takes milliseconds.
pub const PERIOD: Duration = Duration::from_secs(10);

/// Where in docs/operations.md the fence's ERROR sends on-call.
const FENCE_RUNBOOK: &str = "docs/operations.md#the-leader-fence-refuses-writes";

/// The unsynced Foos, each with when this replica first saw it unsynced.
#[derive(Debug, Default)]
pub(crate) struct Unsynced {
    /// By the cache's key of each, shared with it: at a start, every Foo.
    waiting: HashMap<Arc<str>, Instant>,
}

impl Unsynced {
    /// Bring the backlog up to `behind` (every unsynced cached Foo) at
    /// `now` (`wall` on the wall clock): how many are unsynced, and the
    /// longest wait. A Foo never synced has waited since its creation, also
    /// across restarts of the operator; an edited one since this replica
    /// first saw it unsynced, however often it is edited again meanwhile (a
    /// restart of the replica starts that count again).
    pub(crate) fn tally(
        &mut self,
        behind: impl IntoIterator<Item = Behind>,
        now: Instant,
        wall: Timestamp,
    ) -> (usize, Duration) {
        let mut waiting = HashMap::new();
        for foo in behind {
            let since = match self.waiting.get(&foo.key) {
                Some(&since) => since,
                None => now.checked_sub(never_synced_for(&foo, wall)).unwrap_or(now),
            };
            waiting.insert(foo.key, since);
        }
        self.waiting = waiting;
        let oldest = self.waiting.values().map(|since| now.saturating_duration_since(*since)).max();
        (self.waiting.len(), oldest.unwrap_or_default())
    }
}

/// How long a Foo that no sync ever wrote status for has existed; zero for
/// one synced before (its edit's time is not recorded in the object).
fn never_synced_for(foo: &Behind, wall: Timestamp) -> Duration {
    match &foo.never_synced_since {
        Some(created) => wall.duration_since(created.0).try_into().unwrap_or_default(),
        None => Duration::ZERO,
    }
}

/// Where the WARN sends on-call: what to do when the limit is too low.
const SIZING_RUNBOOK: &str = "docs/operations.md#more-foos-than-the-memory-limit-holds";

/// Keep the gauges up to date until the returned task is aborted; with a
/// `gate` (leader election), report a refusal that lasts past a lease
/// duration, once each time it starts. `memory_limit` is `--memory-limit`,
/// else the cgroup's is read at each tick (a pod resized in place).
pub(crate) fn spawn(
    caches: Caches,
    metrics: Arc<Metrics>,
    gate: Option<Arc<WriteGate>>,
    memory_limit: Option<u64>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut backlog = Unsynced::default();
        let (mut reported, mut over) = (false, false);
        let mut tick = tokio::time::interval(PERIOD);
        loop {
            tick.tick().await;
            let (count, oldest) = backlog.tally(caches.foos.unsynced(), Instant::now(), Timestamp::now());
            metrics.set_unsynced(count, oldest);
            over = size_up(&caches, &metrics, memory_limit, over);
            let Some(gate) = &gate else { continue };
            let refused = gate.refused_for();
            metrics.set_fence_refused(refused);
            metrics.set_fence_state(gate.state().label());
            if !gate.refusal_lasts() {
                reported = false;
            } else if !reported {
                reported = true;
                error!(
                    refused_for = ?refused,
                    runbook = FENCE_RUNBOOK,
                    "the API server's leader fence has refused every write of this leader for longer than a lease duration: \
                     its LeaderFence names another replica and this one cannot claim it (see the WARN lines of the claim), \
                     or the fence's policy or binding was changed; Foos do not converge until it is fixed"
                );
            }
        }
    })
}

/// Set the sizing gauges; say so when the Foos cached pass what the memory
/// limit holds (`was_over`: they had at the last tick), and when they no
/// longer do. Whether they are past it now.
fn size_up(caches: &Caches, metrics: &Metrics, flag: Option<u64>, was_over: bool) -> bool {
    let (limit, source) = match flag {
        Some(limit) => (Some(limit), "flag"),
        None => (sizing::cgroup_memory_limit(), "cgroup"),
    };
    let cached = caches.foos.count();
    let fit = Fit::of(cached, limit);
    let held = match fit {
        Fit::Unlimited => None,
        Fit::Holds(held) | Fit::Over(held) => Some((held, source)),
    };
    metrics.set_sizing(cached, held);
    let over = matches!(fit, Fit::Over(_));
    if over && !was_over {
        warn!(
            foos = cached,
            held = held.map(|(h, _)| h),
            limit_mib = limit.map(|l| l >> 20),
            runbook = SIZING_RUNBOOK,
            "more Foos cached than this replica's memory limit holds at its peak: it runs, but its next start or \
             takeover syncs every Foo and may be killed for memory; raise the limit, or shard"
        );
    } else if !over && was_over {
        info!(foos = cached, held = held.map(|(h, _)| h), "the Foos cached fit this replica's memory limit again");
    }
    over
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    /// The Foo `name`, behind: edited since its last sync, or never synced
    /// since its creation at `created`.
    fn behind(name: &str, created: Option<Timestamp>) -> Behind {
        Behind { key: format!("default/{name}").into(), never_synced_since: created.map(Time) }
    }

    #[test]
    fn the_oldest_wait_grows_until_the_foo_is_synced_and_restarts_with_the_next_edit() {
        let (mut backlog, start, wall) = (Unsynced::default(), Instant::now(), Timestamp::now());
        assert_eq!(backlog.tally([behind("edited", None)], start, wall), (1, Duration::ZERO));
        let later = start + Duration::from_secs(30);
        assert_eq!(backlog.tally([behind("edited", None)], later, wall), (1, Duration::from_secs(30)));
        assert_eq!(backlog.tally([], later, wall), (0, Duration::ZERO), "synced");
        let (count, waited) = backlog.tally([behind("edited", None)], later + Duration::from_secs(5), wall);
        assert_eq!((count, waited), (1, Duration::ZERO), "a new edit waits from when it was seen");
    }

    #[test]
    fn a_foo_never_synced_has_waited_since_its_creation_across_restarts() {
        let wall = Timestamp::now();
        let new = behind("new", Some(wall - jiff_seconds(120)));
        // A fresh backlog, as after a restart of the operator.
        let (count, waited) = Unsynced::default().tally([new], Instant::now(), wall);
        assert_eq!(count, 1);
        assert_eq!(waited, Duration::from_secs(120));
    }

    #[test]
    fn an_edit_of_a_foo_synced_before_waits_from_when_it_is_seen_not_from_the_foos_creation() {
        let wall = Timestamp::now();
        assert_eq!(Unsynced::default().tally([behind("old", None)], Instant::now(), wall), (1, Duration::ZERO));
    }

    fn jiff_seconds(s: i64) -> k8s_openapi::jiff::SignedDuration {
        k8s_openapi::jiff::SignedDuration::from_secs(s)
    }
}
