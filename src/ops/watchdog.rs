//! What tells on-call that the operator cannot do its job, whatever the
//! cause — no replica leading, writes refused, a failing API server, a sync
//! that never ends: every [`PERIOD`], on every replica (a standby's caches
//! see the same Foos), the Foos whose newest generation has no status
//! written for it yet, and how long the oldest of them has waited
//! (`sample_controller_unsynced_foos`, `..._unsynced_foo_oldest_seconds`,
//! alerted on by SampleControllerFoosNotSynced); and, on the leader, how
//! long the API server's leader fence has refused its writes
//! (`sample_controller_leader_fence_refused_seconds`), an ERROR once it
//! lasts past a lease duration (SampleControllerLeaderFenceRefuses).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::ObjectRef;
use tokio::task::JoinHandle;
use tracing::error;

use crate::api::foo::{Foo, status_caught_up};
use crate::cache::{Caches, by_name};
use crate::observe::metrics::Metrics;
use kube_lease_fence::WriteGate;

/// How often the gauges are brought up to date: well within a scrape
/// interval, and a pass over 100 000 cached Foos takes milliseconds.
pub const PERIOD: Duration = Duration::from_secs(10);

/// Where in docs/operations.md the fence's ERROR sends on-call.
const FENCE_RUNBOOK: &str = "docs/operations.md#the-leader-fence-refuses-writes";

/// The unsynced Foos, each with when this replica first saw it unsynced.
#[derive(Debug, Default)]
pub(crate) struct Unsynced {
    waiting: HashMap<ObjectRef<Foo>, Instant>,
}

impl Unsynced {
    /// Bring the backlog up to `foos` (every unsynced cached Foo, at least)
    /// at `now` (`wall`
    /// on the wall clock): how many are unsynced, and the longest wait. A
    /// Foo never synced has waited since its creation, also across
    /// restarts of the operator; an edited one since this replica first saw
    /// it unsynced, however often it is edited again meanwhile (a restart
    /// of the replica starts that count again).
    pub(crate) fn tally<'a>(
        &mut self,
        foos: impl IntoIterator<Item = &'a Foo>,
        now: Instant,
        wall: Timestamp,
    ) -> (usize, Duration) {
        let mut waiting = HashMap::new();
        for foo in foos.into_iter().filter(|f| !synced(f)) {
            let key = by_name(foo);
            let since = match self.waiting.get(&key) {
                Some(&since) => since,
                None => now.checked_sub(never_synced_for(foo, wall)).unwrap_or(now),
            };
            waiting.insert(key, since);
        }
        self.waiting = waiting;
        let oldest = self.waiting.values().map(|since| now.saturating_duration_since(*since)).max();
        (self.waiting.len(), oldest.unwrap_or_default())
    }
}

/// Whether `foo`'s newest generation has its status written: its
/// `status.observedGeneration` has caught up (a Foo being deleted has
/// nothing left to sync).
pub(crate) fn synced(foo: &Foo) -> bool {
    let observed = foo.status.as_ref().and_then(|s| s.observed_generation);
    status_caught_up(foo.metadata.generation, observed, foo.metadata.deletion_timestamp.is_some())
}

/// How long a Foo that no sync ever wrote status for has existed; zero for
/// one synced before (its edit's time is not recorded in the object).
fn never_synced_for(foo: &Foo, wall: Timestamp) -> Duration {
    let never = foo.status.as_ref().and_then(|s| s.observed_generation).is_none();
    match &foo.metadata.creation_timestamp {
        Some(created) if never => wall.duration_since(created.0).try_into().unwrap_or_default(),
        _ => Duration::ZERO,
    }
}

/// Keep the gauges up to date until the returned task is aborted; with a
/// `gate` (leader election), report a refusal that lasts past a lease
/// duration, once each time it starts.
pub(crate) fn spawn(caches: Caches, metrics: Arc<Metrics>, gate: Option<Arc<WriteGate>>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut backlog = Unsynced::default();
        let mut reported = false;
        let mut tick = tokio::time::interval(PERIOD);
        loop {
            tick.tick().await;
            let foos = caches.foos.unsynced();
            let (count, oldest) = backlog.tally(foos.iter().map(|f| &**f), Instant::now(), Timestamp::now());
            metrics.set_unsynced(count, oldest);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FooFixture;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn foo(name: &str, generation: i64, observed: Option<i64>) -> Foo {
        let mut foo = Foo::test(name);
        foo.metadata.generation = Some(generation);
        foo.status.get_or_insert_with(Default::default).observed_generation = observed;
        foo
    }

    #[test]
    fn a_foo_is_synced_once_its_status_observed_its_newest_generation() {
        assert!(synced(&foo("a", 2, Some(2))));
        assert!(!synced(&foo("a", 3, Some(2))), "edited since");
        assert!(!synced(&foo("a", 1, None)), "never synced");
        let mut deleted = foo("a", 3, Some(2));
        deleted.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
        assert!(synced(&deleted), "being deleted: nothing to sync");
    }

    #[test]
    fn the_oldest_wait_grows_until_the_foo_is_synced_and_restarts_with_the_next_edit() {
        let (mut backlog, start, wall) = (Unsynced::default(), Instant::now(), Timestamp::now());
        let edited = foo("edited", 3, Some(2));
        assert_eq!(backlog.tally([&edited], start, wall), (1, Duration::ZERO));
        let later = start + Duration::from_secs(30);
        assert_eq!(backlog.tally([&edited, &foo("fine", 1, Some(1))], later, wall), (1, Duration::from_secs(30)));
        let edited_meanwhile = foo("edited", 4, Some(2));
        let (_, waited) = backlog.tally([&edited_meanwhile], later, wall);
        assert_eq!(waited, Duration::from_secs(30), "another edit while it waits does not start the wait again");
        assert_eq!(backlog.tally([&foo("edited", 4, Some(4))], later, wall), (0, Duration::ZERO), "synced");
        let edited_again = foo("edited", 5, Some(4));
        let (count, waited) = backlog.tally([&edited_again], later + Duration::from_secs(5), wall);
        assert_eq!((count, waited), (1, Duration::ZERO), "a new edit waits from when it was seen");
    }

    #[test]
    fn a_foo_never_synced_has_waited_since_its_creation_across_restarts() {
        let mut new = foo("new", 1, None);
        let wall = Timestamp::now();
        new.metadata.creation_timestamp = Some(Time(wall - jiff_seconds(120)));
        // A fresh backlog, as after a restart of the operator.
        let (count, waited) = Unsynced::default().tally([&new], Instant::now(), wall);
        assert_eq!(count, 1);
        assert_eq!(waited, Duration::from_secs(120));
    }

    #[test]
    fn an_edit_of_a_foo_synced_before_waits_from_when_it_is_seen_not_from_the_foos_creation() {
        let mut edited = foo("old", 2, Some(1));
        let wall = Timestamp::now();
        edited.metadata.creation_timestamp = Some(Time(wall - jiff_seconds(3600)));
        assert_eq!(Unsynced::default().tally([&edited], Instant::now(), wall), (1, Duration::ZERO));
    }

    fn jiff_seconds(s: i64) -> k8s_openapi::jiff::SignedDuration {
        k8s_openapi::jiff::SignedDuration::from_secs(s)
    }
}
