//! The arithmetic of waiting before trying again, shared by the syncs and
//! the watches:
//! - a failed sync of a Foo waits by its own exponential backoff, the
//!   per-item part of client-go's default controller rate limiter (5 ms
//!   doubling to 1000 s), reset by its next success ([`Failures`]). The
//!   other part, one token bucket over all items (10 per second, bursts of
//!   100), is left out: it delays the retries of Foos that failed for their
//!   own reasons behind each other, and when the API server fails, every
//!   retry already waits at least [`FIRST_RETRY`] ([`retry_delay`]) and the
//!   client waits out any `Retry-After` first;
//! - waits are stretched by [`with_jitter`], so that clients refused together
//!   do not come back in step.

use std::collections::HashMap;
use std::time::Duration;

use kube::Resource;
use kube::runtime::reflector::ObjectRef;
use parking_lot::Mutex;

/// The first retry after the API server failed or refused a request (a
/// sync's, a watch's): answering a failing server within milliseconds would
/// add to its load.
pub(crate) const FIRST_RETRY: Duration = Duration::from_secs(1);

/// Per-object retry delay after a failed sync: upstream's workqueue default,
/// 5 ms doubling up to 1000 s.
pub(crate) const BACKOFF_BASE: Duration = Duration::from_millis(5);
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(1000);

/// Consecutive failures per object (a Foo, for the syncs); an object leaves
/// the map with its next success, or once it is deleted.
pub(crate) struct Failures<K: Resource<DynamicType = ()>> {
    counts: Mutex<HashMap<ObjectRef<K>, u32>>,
}

impl<K: Resource<DynamicType = ()>> Default for Failures<K> {
    fn default() -> Self {
        Failures { counts: Mutex::default() }
    }
}

impl<K: Resource<DynamicType = ()>> Failures<K> {
    /// The delay before the next retry of `obj`, counting this failure;
    /// `exists` says whether an object is still cached.
    pub(crate) fn next_delay(&self, obj: ObjectRef<K>, exists: impl Fn(&ObjectRef<K>) -> bool) -> Duration {
        let mut counts = self.counts.lock();
        if !counts.contains_key(&obj) {
            // Forget objects deleted while failing, so the map stays as small
            // as the set of failing objects.
            counts.retain(|o, _| exists(o));
        }
        let n = counts.entry(obj).or_insert(0);
        let delay = backoff_delay(*n);
        *n = n.saturating_add(1);
        delay
    }

    pub(crate) fn reset(&self, obj: &ObjectRef<K>) {
        self.counts.lock().remove(obj);
    }
}

/// `BACKOFF_BASE * 2^failures`, capped at `BACKOFF_MAX`.
pub(crate) fn backoff_delay(failures: u32) -> Duration {
    BACKOFF_BASE.checked_mul(1u32.checked_shl(failures).unwrap_or(u32::MAX)).map_or(BACKOFF_MAX, |d| d.min(BACKOFF_MAX))
}

/// The wait before a retry, given the Foo's `backoff`: no less than
/// [`FIRST_RETRY`] when the server failed the request or its leader fence
/// refused it (`slowly`).
pub(crate) fn retry_delay(backoff: Duration, slowly: bool) -> Duration {
    if slowly { backoff.max(FIRST_RETRY) } else { backoff }
}

/// `delay` lengthened by up to a quarter at random (`random` in [0, 1)), so
/// that clients refused together do not come back in step.
pub(crate) fn with_jitter(delay: Duration, random: f64) -> Duration {
    delay.mul_f64(1.0 + 0.25 * random.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    #[test]
    fn a_sync_the_server_failed_waits_at_least_a_second_and_others_their_backoff() {
        assert_eq!(retry_delay(backoff_delay(0), true), Duration::from_secs(1));
        assert_eq!(retry_delay(backoff_delay(0), false), Duration::from_millis(5), "a conflict: at once");
        assert_eq!(retry_delay(backoff_delay(12), true), backoff_delay(12), "a longer backoff stands");
    }

    fn foo(name: &str) -> ObjectRef<ConfigMap> {
        ObjectRef::new(name).within("default")
    }

    /// Each object backs off on its own failures, starts over after a success,
    /// and one deleted while failing is forgotten when another starts
    /// failing (cargo-mutants: no test noticed a zero delay, a reset that
    /// did nothing or a map that never forgot).
    #[test]
    fn each_foo_backs_off_on_its_own_failures_and_starts_over_after_a_success() {
        let failures = Failures::default();
        let all = |_: &ObjectRef<ConfigMap>| true;
        let ms = Duration::from_millis;
        let a: Vec<_> = (0..3).map(|_| failures.next_delay(foo("a"), all)).collect();
        assert_eq!(a, [ms(5), ms(10), ms(20)]);
        assert_eq!(failures.next_delay(foo("b"), all), ms(5), "b's first failure");
        failures.reset(&foo("a"));
        assert_eq!(failures.next_delay(foo("a"), all), ms(5), "a succeeded in between");
        // a is deleted; c's first failure sweeps it out.
        assert_eq!(failures.next_delay(foo("c"), |f: &ObjectRef<ConfigMap>| f.name != "a"), ms(5));
        assert_eq!(failures.counts.lock().len(), 2, "b and c");
        assert_eq!(failures.next_delay(foo("a"), all), ms(5), "a, back, starts over");
    }

    #[test]
    fn backoff_doubles_from_5ms_and_caps_at_1000s() {
        assert_eq!(backoff_delay(0), Duration::from_millis(5));
        assert_eq!(backoff_delay(1), Duration::from_millis(10));
        assert_eq!(backoff_delay(10), Duration::from_millis(5 * 1024));
        assert_eq!(backoff_delay(18), Duration::from_secs(1000));
        assert_eq!(backoff_delay(40), Duration::from_secs(1000));
        assert_eq!(backoff_delay(u32::MAX), Duration::from_secs(1000));
    }
}
