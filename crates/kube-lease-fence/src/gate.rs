//! The write gate: whether this replica may write as the leader, checked by
//! the user before every write it makes as the leader.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::fence::FenceState;

/// Whether this replica may still write as the leader: until the renew
/// deadline after the start of its last successful acquire or renewal. A
/// standby takes over only a lease duration (longer) after it saw that
/// renewal, so a write allowed here never meets another leader's. Checked
/// before every write: a leader that was paused past its deadline (a
/// stopped process, a frozen VM) writes nothing when it resumes, even before
/// its elector has noticed and the process has exited.
///
/// Where the API server fences too (the crate's README), a write it
/// refuses as not the Lease holder's puts the gate in doubt
/// ([`WriteGate::doubt`]): nothing is written until the elector, woken
/// early (half a retry period after its last attempt, at the soonest), has
/// renewed the Lease (the refusal came from the policy's view of the Lease
/// lagging behind our acquire) and claimed the fence's object again, or
/// found the Lease taken.
#[derive(Debug, Default)]
pub struct WriteGate {
    valid_until: Mutex<Option<Instant>>,
    in_doubt: AtomicBool,
    pub(crate) check_now: Notify,
    /// Since when the API server's fence has refused this leader's writes,
    /// none admitted since.
    refusals: Mutex<Option<Refusals>>,
    /// Since when this leader has failed to claim the API server's fence,
    /// until a renewal claims it.
    unclaimed_since: Mutex<Option<Instant>>,
    /// Woken by each renewal: [`WriteGate::held`].
    renewals: Notify,
    /// The Lease's duration: a refusal that lasts longer is no lag of the
    /// API server's view behind a takeover.
    lease_duration: Duration,
    /// A refused write is tried again at least this often (the user's retry
    /// cap): a refusal not repeated for longer is over.
    retry_cap: Duration,
    /// Whether the API server's fence names this leader ([`FenceState`]).
    state: Mutex<FenceState>,
}

impl WriteGate {
    /// A gate that holds from the first renewal on (never, for a
    /// candidate that never led).
    pub fn new() -> Self {
        WriteGate::default()
    }

    /// A gate for an elector of `lease_duration` and `retry_cap`.
    pub(crate) fn for_lease(lease_duration: Duration, retry_cap: Duration) -> Self {
        WriteGate { lease_duration, retry_cap, ..WriteGate::default() }
    }

    /// A gate as a renewal just now leaves it: holding for `deadline`, for
    /// the tests of what writes through it (the `testing` feature).
    #[cfg(any(test, feature = "testing"))]
    pub fn holding_for(deadline: Duration) -> Self {
        let fence = WriteGate::new();
        fence.renewed(Instant::now(), deadline);
        fence
    }

    /// True while the last renewal is within the renew deadline and no
    /// refusal by the API server is being checked.
    pub fn holds(&self) -> bool {
        !self.in_doubt() && self.valid_until.lock().is_some_and(|until| Instant::now() < until)
    }

    /// True while this replica leads but may not write for now: it held
    /// since it last acquired the Lease, and either its last renewal is past
    /// the renew deadline (a late renewal: the next one reopens the gate,
    /// or the elector reports the Lease lost) or a refusal by the API
    /// server's fence is being checked. Work it had should wait for the
    /// gate, not be dropped as a standby drops it: nothing else brings that
    /// work back once the gate reopens.
    pub fn interrupted(&self) -> bool {
        !self.holds() && self.valid_until.lock().is_some()
    }

    /// True from a refusal by the API server's fence until the elector's
    /// next renewal.
    pub fn in_doubt(&self) -> bool {
        self.in_doubt.load(Ordering::Acquire)
    }

    /// The API server refused a write as not the Lease holder's: write
    /// nothing until the elector has checked the Lease.
    pub fn doubt(&self) {
        self.refused();
        if !self.in_doubt.swap(true, Ordering::AcqRel) {
            self.check_now.notify_one();
        }
    }

    /// A sync's writes were admitted: the API server's fence lets this
    /// replica through.
    pub fn admitted(&self) {
        *self.refusals.lock() = None;
    }

    /// How long the API server's fence has refused this replica's writes,
    /// none admitted since, or this leader has failed to claim the fence,
    /// whichever is longer; zero when neither. A refused Foo is retried at least every
    /// the retry cap ([`LeaderConfig::retry_cap`](crate::LeaderConfig::retry_cap)): no refusal for longer than that (and a lease
    /// duration) means none is being refused any more, though no write was
    /// admitted (the refused Foo needed none after all, or went).
    pub fn refused_for(&self) -> Duration {
        let refused = match *self.refusals.lock() {
            Some(r) if r.last.elapsed() <= self.retry_cap + self.lease_duration => r.since.elapsed(),
            _ => Duration::ZERO,
        };
        let unclaimed = self.unclaimed_since.lock().map_or(Duration::ZERO, |since| since.elapsed());
        refused.max(unclaimed)
    }

    fn refused(&self) {
        let now = Instant::now();
        self.refusals.lock().get_or_insert(Refusals { since: now, last: now }).last = now;
    }

    /// Resolves once this replica may write as the leader (at once if it
    /// may already).
    pub async fn held(&self) {
        loop {
            let renewed = self.renewals.notified();
            if self.holds() {
                return;
            }
            renewed.await;
        }
    }

    /// Where the API server's fence stands for this replica.
    pub fn state(&self) -> FenceState {
        *self.state.lock()
    }

    pub(crate) fn set_state(&self, state: FenceState) {
        *self.state.lock() = state;
    }

    /// True once the API server's fence has refused this replica's writes
    /// for longer than a lease duration, none admitted since.
    pub fn refusal_lasts(&self) -> bool {
        self.refused_for() > self.lease_duration
    }

    /// Holding the Lease, but the API server's fence does not name this
    /// replica: no write, and it counts as refused. A new leader's syncs
    /// start only once a renewal has claimed it ([`WriteGate::held`]); one in
    /// doubt after a refusal stays so.
    pub(crate) fn unclaimed(&self) {
        self.unclaimed_since.lock().get_or_insert_with(Instant::now);
    }

    pub(crate) fn renewed(&self, attempt: Instant, deadline: Duration) {
        *self.valid_until.lock() = Some(attempt + deadline);
        self.in_doubt.store(false, Ordering::Release);
        *self.unclaimed_since.lock() = None;
        self.renewals.notify_waiters();
    }

    /// Hold no more until the next renewal: something (the Lease deleted
    /// or naming another holder, as the watch saw it) that the renewal
    /// settles. A leader stays interrupted, not a standby.
    pub(crate) fn suspend(&self) {
        let mut until = self.valid_until.lock();
        if until.is_some() {
            *until = Some(Instant::now());
        }
    }

    /// Hold no more: this replica is handing the Lease over.
    pub(crate) fn revoke(&self) {
        self.set_state(FenceState::NotLeading);
        *self.valid_until.lock() = None;
        *self.refusals.lock() = None;
        *self.unclaimed_since.lock() = None;
    }
}

/// The first and the latest refusal of a run of them.
#[derive(Clone, Copy, Debug)]
struct Refusals {
    since: Instant,
    last: Instant,
}

/// Whether a replica may write: always without leader election (`None`),
/// else while its fence holds.
pub fn may_write(fence: Option<&WriteGate>) -> bool {
    fence.is_none_or(WriteGate::holds)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn the_gate_holds_from_a_renewal_until_the_renew_deadline() {
        let fence = WriteGate::new();
        assert!(!fence.holds(), "not before the first acquire");
        fence.renewed(Instant::now(), Duration::from_millis(50));
        assert!(fence.holds());
        std::thread::sleep(Duration::from_millis(60));
        assert!(!fence.holds(), "past the deadline, as a paused leader is when it resumes");
        assert!(fence.interrupted(), "a late renewal interrupts a leader, not a standby");
        fence.renewed(Instant::now(), Duration::from_secs(10));
        assert!(fence.holds() && !fence.interrupted());
        fence.revoke();
        assert!(!fence.holds() && !fence.interrupted(), "handed over: no leader any more");
    }

    #[test]
    fn a_refusal_by_the_api_servers_fence_holds_every_write_until_the_next_renewal() {
        let fence = WriteGate::holding_for(Duration::from_secs(10));
        fence.doubt();
        assert!(fence.in_doubt() && !fence.holds(), "in doubt, within the renew deadline");
        fence.doubt();
        fence.renewed(Instant::now(), Duration::from_secs(10));
        assert!(!fence.in_doubt() && fence.holds(), "a renewal settles the doubt");
    }

    #[test]
    fn a_refusal_counts_until_a_write_is_admitted_not_until_the_next_renewal() {
        let fence =
            WriteGate { lease_duration: Duration::from_millis(20), ..WriteGate::holding_for(Duration::from_secs(10)) };
        assert_eq!(fence.refused_for(), Duration::ZERO);
        fence.doubt();
        std::thread::sleep(Duration::from_millis(30));
        fence.renewed(Instant::now(), Duration::from_secs(10));
        fence.doubt();
        assert!(fence.refused_for() >= Duration::from_millis(30), "counted from the first refusal");
        assert!(fence.refusal_lasts(), "past a lease duration");
        fence.admitted();
        assert_eq!(fence.refused_for(), Duration::ZERO);
        assert!(!fence.refusal_lasts());
    }

    #[test]
    fn a_failed_claim_counts_as_refused_until_a_renewal_claims_the_fence() {
        let fence = WriteGate::new();
        fence.unclaimed();
        std::thread::sleep(Duration::from_millis(5));
        assert!(fence.refused_for() >= Duration::from_millis(5));
        assert!(!fence.holds(), "no write while unclaimed");
        fence.renewed(Instant::now(), Duration::from_secs(10));
        assert_eq!(fence.refused_for(), Duration::ZERO, "claimed");
        assert!(fence.holds());
    }

    #[tokio::test]
    async fn writers_wait_for_the_gate_to_hold() {
        let fence = Arc::new(WriteGate::new());
        let waiting = tokio::spawn({
            let fence = fence.clone();
            async move { fence.held().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "not before a renewal");
        fence.renewed(Instant::now(), Duration::from_secs(10));
        tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("held after the renewal").unwrap();
    }
}
