//! When a failed sync is tried again: per Foo, an exponential backoff
//! from upstream's workqueue defaults (its per-item part), reset by the next
//! success; never sooner than a second when the API server failed or refused
//! the request, as the watches wait ([`crate::watch`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use parking_lot::Mutex;
use tracing::{error, info, warn};

use crate::Error;
use crate::controller::queue_key;
use crate::foo::Foo;
use crate::sync::Context;
use crate::watch::FIRST_RETRY;

/// Per-object retry delay after a failed sync: upstream's workqueue default,
/// 5 ms doubling up to 1000 s.
pub const BACKOFF_BASE: Duration = Duration::from_millis(5);
pub const BACKOFF_MAX: Duration = Duration::from_secs(1000);

/// Consecutive failures per Foo; a Foo leaves the map with its next
/// success, or once it is deleted.
#[derive(Default)]
pub struct Failures {
    counts: Mutex<HashMap<ObjectRef<Foo>, u32>>,
}

impl Failures {
    /// The delay before the next retry of `foo`, counting this failure;
    /// `exists` says whether a Foo is still cached.
    pub fn next_delay(&self, foo: ObjectRef<Foo>, exists: impl Fn(&ObjectRef<Foo>) -> bool) -> Duration {
        let mut counts = self.counts.lock();
        if !counts.contains_key(&foo) {
            // Forget Foos deleted while failing, so the map stays as small as
            // the set of failing Foos.
            counts.retain(|f, _| exists(f));
        }
        let n = counts.entry(foo).or_insert(0);
        let delay = backoff_delay(*n);
        *n = n.saturating_add(1);
        delay
    }

    pub fn reset(&self, foo: &ObjectRef<Foo>) {
        self.counts.lock().remove(foo);
    }
}

/// `BACKOFF_BASE * 2^failures`, capped at `BACKOFF_MAX`.
pub fn backoff_delay(failures: u32) -> Duration {
    BACKOFF_BASE.checked_mul(1u32.checked_shl(failures).unwrap_or(u32::MAX)).map_or(BACKOFF_MAX, |d| d.min(BACKOFF_MAX))
}

/// The wait before a retry after `err`, given the Foo's `backoff`: no less
/// than a second when the server failed the request. (The client's own
/// retries waited out any Retry-After; answering a failing server within
/// milliseconds would add to its load.)
pub fn retry_delay(backoff: Duration, err: &Error) -> Duration {
    if err.is_server_failure() { backoff.max(FIRST_RETRY) } else { backoff }
}

/// Retry a failed sync after a per-object exponential backoff.
pub fn error_policy(foo: Arc<Foo>, err: &Error, ctx: Arc<Context>) -> Action {
    let obj = ObjectRef::from_obj(&*foo);
    let delay = retry_delay(ctx.failures.next_delay(obj.clone(), |f| ctx.caches.foos.get(f).is_some()), err);
    ctx.metrics.queue.retried(queue_key(&obj), delay);
    match err {
        Error::ResourceExists { .. } => warn!(error = %err, retry_in = ?delay, "sync refused"),
        // Our cached copy was behind; the retry reads the newer one.
        e if e.is_conflict() => info!(error = %err, retry_in = ?delay, "object changed since cached; retrying"),
        _ => error!(error = %err, retry_in = ?delay, "sync failed"),
    }
    Action::requeue(delay)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sync_the_server_failed_waits_at_least_a_second_and_others_their_backoff() {
        let failed = |code: u16| Error::Api {
            foo: "default/f".into(),
            action: crate::ApiAction::CreateDeployment,
            source: kube::Error::Api(kube::core::Status::failure("", "").with_code(code).boxed()),
        };
        assert_eq!(retry_delay(backoff_delay(0), &failed(503)), Duration::from_secs(1));
        assert_eq!(retry_delay(backoff_delay(0), &failed(429)), Duration::from_secs(1));
        assert_eq!(retry_delay(backoff_delay(0), &failed(409)), Duration::from_millis(5), "a conflict: at once");
        assert_eq!(retry_delay(backoff_delay(12), &failed(500)), backoff_delay(12), "a longer backoff stands");
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
