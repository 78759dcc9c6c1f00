//! Leader election on a `coordination.k8s.io/v1` Lease, with client-go's
//! semantics: a standby takes over once the Lease has not changed for the
//! lease duration (timed on its own clock, so clock skew between nodes does
//! not matter); the leader renews every retry period and gives up leading
//! when it has not renewed within the renew deadline, which is shorter than
//! the lease duration, so it stops before anyone else can start. On graceful
//! shutdown the Lease is released, and a standby watching it takes over at
//! once instead of waiting for it to expire.
//!
//! Written here rather than taken from a crate: kube-leader-election
//! requires kube 4, and kube-lease-manager's standby only re-reads the Lease
//! after the expiry it last saw (a released Lease waits out the full
//! duration) and its leader never reports a failed renewal as lost
//! leadership.

pub mod leader_fence;

use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use parking_lot::Mutex;
use tokio::sync::Notify;
use tracing::{debug, info, warn};

use crate::client::post_params;
use crate::client::retry::BACKOFF_MAX;
use crate::leader::leader_fence::{FenceState, LeaderFence, no_such_kind};

/// The pod's name, set from the downward API in deploy/: the start of the
/// Lease's holder identity, which the fence matches with the pod the
/// request's token is bound to.
pub const POD_NAME_ENV: &str = "POD_NAME";

/// Timing and identity of one candidate.
#[derive(Clone, Debug)]
pub struct LeaderConfig {
    pub lease_name: String,
    pub namespace: String,
    /// Unique per process: see [`default_identity`].
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

/// Why leadership ended.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Lost {
    /// Another candidate holds the Lease now.
    #[error("{0} holds it now")]
    TakenOver(String),
    /// No renewal succeeded within the renew deadline.
    #[error("no renewal succeeded within the renew deadline")]
    RenewDeadline,
}

/// Whether this replica may still write as the leader: until the renew
/// deadline after the start of its last successful acquire or renewal. A
/// standby takes over only a lease duration (longer) after it saw that
/// renewal, so a write allowed here never meets another leader's. Checked
/// before every write: a leader that was paused past its deadline (a
/// stopped process, a frozen VM) writes nothing when it resumes, even before
/// its elector has noticed and the process has exited.
///
/// Where the API server fences too (deploy/11-leader-fence-policy.yaml), a
/// sync's write it refuses as not the Lease holder's puts the fence in
/// doubt: nothing is written until the elector, woken early (half a retry
/// period after its last attempt, at the soonest), has renewed the Lease
/// (the refusal came from the policy's view of the Lease lagging behind
/// our acquire) or found it taken (the process ends).
#[derive(Debug, Default)]
pub struct Fence {
    valid_until: Mutex<Option<Instant>>,
    in_doubt: AtomicBool,
    check_now: Notify,
    /// Since when the API server's fence has refused this leader's writes,
    /// none admitted since.
    refusals: Mutex<Option<Refusals>>,
    /// Since when this leader has failed to claim the API server's fence,
    /// until a renewal claims it.
    unclaimed_since: Mutex<Option<Instant>>,
    /// Woken by each renewal: [`Fence::held`].
    renewals: Notify,
    /// The Lease's duration: a refusal that lasts longer is no lag of the
    /// API server's view behind a takeover.
    lease_duration: Duration,
    /// Whether the API server's fence names this leader ([`FenceState`]).
    state: Mutex<FenceState>,
}

impl Fence {
    /// A fence that holds from the first renewal on (never, for a
    /// candidate that never led).
    pub fn new() -> Self {
        Fence::default()
    }

    /// A fence as a renewal just now leaves it: holding for `deadline`.
    #[cfg(any(test, feature = "test-fixtures"))]
    pub fn holding_for(deadline: Duration) -> Self {
        let fence = Fence::new();
        fence.renewed(Instant::now(), deadline);
        fence
    }

    /// True while the last renewal is within the renew deadline and no
    /// refusal by the API server is being checked.
    pub fn holds(&self) -> bool {
        !self.in_doubt() && self.valid_until.lock().is_some_and(|until| Instant::now() < until)
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
    /// [`BACKOFF_MAX`]: no refusal for longer than that (and a lease
    /// duration) means none is being refused any more, though no write was
    /// admitted (the refused Foo needed none after all, or went).
    pub fn refused_for(&self) -> Duration {
        let refused = match *self.refusals.lock() {
            Some(r) if r.last.elapsed() <= BACKOFF_MAX + self.lease_duration => r.since.elapsed(),
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

    fn set_state(&self, state: FenceState) {
        *self.state.lock() = state;
    }

    /// True once the API server's fence has refused this replica's writes
    /// for longer than a lease duration, none admitted since.
    pub fn refusal_lasts(&self) -> bool {
        self.refused_for() > self.lease_duration
    }

    /// Holding the Lease, but the API server's fence does not name this
    /// replica: no write, and it counts as refused. A new leader's syncs
    /// start only once a renewal has claimed it ([`Fence::held`]); one in
    /// doubt after a refusal stays so.
    fn unclaimed(&self) {
        self.unclaimed_since.lock().get_or_insert_with(Instant::now);
    }

    fn renewed(&self, attempt: Instant, deadline: Duration) {
        *self.valid_until.lock() = Some(attempt + deadline);
        self.in_doubt.store(false, Ordering::Release);
        *self.unclaimed_since.lock() = None;
        self.renewals.notify_waiters();
    }

    /// Hold no more: this replica is handing the Lease over.
    fn revoke(&self) {
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
pub fn may_write(fence: Option<&Fence>) -> bool {
    fence.is_none_or(Fence::holds)
}

/// One candidate for the Lease.
pub struct Elector {
    api: Api<Lease>,
    /// The API server's fence's parameter ([`LeaderFence`]), of the
    /// Lease's name.
    fences: Api<LeaderFence>,
    /// The LeaderFence as this replica wrote it, naming it, since it last
    /// took the Lease; `Pending` until then and after a refusal, when it
    /// is read and written again.
    claim: Claim,
    /// A LeaderFence was claimed since this replica took the Lease: one
    /// missing now was deleted, not never installed.
    claimed_once: bool,
    cfg: LeaderConfig,
    fence: Arc<Fence>,
    /// The Lease as last written by us or reported by the watch: a write is
    /// made from it, so it carries the resourceVersion that makes the write
    /// conditional (no read before a write).
    lease: Option<Lease>,
    observed: Option<Observed>,
}

/// The last Lease record a candidate saw, and when it first saw it, on its
/// own clock: a Lease expires when its record has not changed for the lease
/// duration as the candidate measures it, never by comparing the holder's
/// `renewTime` with the local clock (clock skew between nodes).
#[derive(Clone, Debug, PartialEq)]
struct Observed {
    holder: Option<String>,
    renew_time: Option<MicroTime>,
    since: Instant,
}

/// What a candidate does about the Lease it just read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It holds the Lease: renew it.
    Renew,
    /// Nobody holds it (never held, released, or expired): take it.
    Acquire,
    /// Someone else holds it; it expires after this long, unless renewed.
    Wait(Duration),
}

/// The takeover rule, client-go's: `holder` of the Lease as read (empty
/// means released), `unchanged_for` how long its record has been the same
/// on our clock.
pub fn verdict(holder: Option<&str>, me: &str, unchanged_for: Duration, lease_duration: Duration) -> Verdict {
    match holder.filter(|h| !h.is_empty()) {
        Some(h) if h == me => Verdict::Renew,
        Some(_) if unchanged_for < lease_duration => Verdict::Wait(lease_duration - unchanged_for),
        _ => Verdict::Acquire,
    }
}

/// client-go's checks of the election timing (`NewLeaderElector`): the
/// leader must give up before a standby may take over, and retry more than
/// once before giving up; zero would be a tight loop.
pub fn check_timing(lease_duration: Duration, renew_deadline: Duration, retry_period: Duration) -> Result<(), String> {
    // client-go's JitterFactor: a retry waits up to 1.2 retry periods.
    const JITTER_FACTOR: f64 = 1.2;
    if lease_duration.is_zero() {
        return Err("leaseDuration must be greater than zero".into());
    }
    if renew_deadline.is_zero() {
        return Err("renewDeadline must be greater than zero".into());
    }
    if retry_period.is_zero() {
        return Err("retryPeriod must be greater than zero".into());
    }
    if lease_duration <= renew_deadline {
        return Err("leaseDuration must be greater than renewDeadline".into());
    }
    if renew_deadline.as_secs_f64() <= JITTER_FACTOR * retry_period.as_secs_f64() {
        return Err("renewDeadline must be greater than retryPeriod*JitterFactor".into());
    }
    Ok(())
}

impl Elector {
    pub fn new(client: Client, cfg: LeaderConfig) -> Self {
        Elector {
            api: Api::namespaced(client.clone(), &cfg.namespace),
            fences: Api::namespaced(client, &cfg.namespace),
            claim: Claim::Pending,
            claimed_once: false,
            fence: Arc::new(Fence { lease_duration: cfg.lease_duration, ..Fence::default() }),
            cfg,
            lease: None,
            observed: None,
        }
    }

    /// The name of the Lease contended for.
    pub fn lease_name(&self) -> &str {
        &self.cfg.lease_name
    }

    /// The fence this elector keeps up to date while it leads.
    pub fn fence(&self) -> Arc<Fence> {
        self.fence.clone()
    }

    /// Wait until this candidate holds the Lease. A standby reads nothing:
    /// it watches the Lease and times its expiry on its own clock, so
    /// waiting costs no request beyond the watch's.
    pub async fn acquire(&mut self) {
        let wc = watcher::Config::default().fields(&format!("metadata.name={}", self.cfg.lease_name));
        let mut changes = pin!(lease_states(self.api.clone(), wc));
        info!(lease = %self.cfg.lease_name, identity = %self.cfg.identity, "waiting to lead");
        // Nothing is known until the watch's first list.
        let mut wait = None;
        loop {
            tokio::select! {
                state = changes.next() => match state {
                    Some(lease) => self.saw(lease),
                    // The watcher retries for ever; it never ends.
                    None => return std::future::pending().await,
                },
                _ = sleep_or_pending(wait) => {}
            }
            let attempt = Instant::now();
            wait = match self.try_acquire().await {
                Ok(Attempt::Won) => {
                    self.claim = Claim::Pending;
                    self.renewed_and_claimed(attempt).await;
                    info!(lease = %self.cfg.lease_name, identity = %self.cfg.identity, "leading");
                    return;
                }
                // Wake when it expires, or earlier if the watch reports a
                // change (a release above all).
                Ok(Attempt::HeldFor(left)) => Some(left),
                // Lost a race: the watch brings the winner's record.
                Ok(Attempt::Lost) => Some(self.cfg.retry_period),
                Err(e) => {
                    warn!(lease = %self.cfg.lease_name, error = %e, "cannot acquire lease");
                    Some(self.cfg.retry_period)
                }
            };
        }
    }

    /// Renew the Lease until leadership is lost. Never returns while leading.
    pub async fn hold(&mut self) -> Lost {
        let mut last_renew = Instant::now();
        let mut last_attempt = last_renew;
        let mut fence_changes = self.fence_changes();
        loop {
            tokio::select! {
                () = self.until_next_attempt(last_attempt) => {}
                Some(seen) = fence_changes.next() => {
                    self.saw_fence(seen);
                    continue;
                }
            }
            let attempt = Instant::now();
            last_attempt = attempt;
            // A refusal may come from a LeaderFence that names someone
            // else (edited, or written by a deposed leader that resumed):
            // read and claim it again after this renewal.
            if self.fence.in_doubt() {
                self.claim = Claim::Pending;
            }
            let left = self.cfg.renew_deadline.saturating_sub(attempt - last_renew);
            match tokio::time::timeout(left, self.renew()).await {
                Ok(Ok(Renewal::Renewed)) => {
                    last_renew = attempt;
                    self.renewed_and_claimed(attempt).await;
                }
                Ok(Ok(Renewal::Changed)) => {
                    info!(lease = %self.cfg.lease_name, "lease changed under its leader; renewing from the current copy")
                }
                Ok(Ok(Renewal::TakenOver(holder))) => return Lost::TakenOver(holder),
                Ok(Err(e)) => warn!(lease = %self.cfg.lease_name, error = %e, "cannot renew lease"),
                Err(_) => warn!(lease = %self.cfg.lease_name, "lease renewal timed out"),
            }
            if last_renew.elapsed() >= self.cfg.renew_deadline {
                return Lost::RenewDeadline;
            }
        }
    }

    /// The LeaderFence as a watch of it reports it, while a fence is
    /// installed: none to watch (and no request made) where there was none
    /// to claim.
    fn fence_changes(&self) -> futures::stream::BoxStream<'static, FenceSeen> {
        if matches!(self.claim, Claim::NoFence) {
            return futures::stream::pending().boxed();
        }
        let wc = watcher::Config::default().fields(&format!("metadata.name={}", self.cfg.lease_name));
        fence_states(self.fences.clone(), wc).boxed()
    }

    /// What the fence watch reports, while leading: a LeaderFence that no
    /// longer names this leader (deleted, or edited to name another
    /// replica) is claimed again at the next renewal, within a retry
    /// period; one whose CRD was deleted, once the CRD is served again.
    /// Until then the gauge says the fence is open.
    fn saw_fence(&mut self, seen: FenceSeen) {
        let name = &self.cfg.lease_name;
        match (&self.claim, seen) {
            (Claim::Written(_), FenceSeen::Names(Some(h))) if h == self.cfg.identity => return,
            (Claim::Written(_), FenceSeen::Names(Some(other))) => {
                warn!(fence = %name, holder = %other, "the LeaderFence names another replica; claiming it again at the next renewal")
            }
            (Claim::Written(_), FenceSeen::Names(None)) => {
                warn!(fence = %name, "the LeaderFence was deleted or released; claiming it again at the next renewal")
            }
            (Claim::Written(_), FenceSeen::NoKind) => {
                warn!(fence = %name, "the LeaderFence CRD was deleted: the API server's fence is open until it is installed again")
            }
            // Its CRD, deleted since this leader claimed it, is served again.
            (Claim::NoFence, FenceSeen::Names(_)) if self.claimed_once => {
                info!(fence = %name, "the LeaderFence CRD is installed again; claiming it at the next renewal")
            }
            _ => return,
        }
        self.claim = Claim::Pending;
        self.fence.set_state(FenceState::Open);
    }

    /// A retry period after the last attempt, or sooner when the fence is
    /// in doubt: then half a retry period after it, at the soonest, so that
    /// a fence refusing every write (a misconfigured policy) costs at most
    /// two renewals a retry period, not one per refusal. A wake-up left from
    /// a doubt that the last renewal already settled is ignored.
    async fn until_next_attempt(&self, last_attempt: Instant) {
        let mut regular = pin!(tokio::time::sleep_until((last_attempt + self.cfg.retry_period).into()));
        loop {
            tokio::select! {
                _ = &mut regular => return,
                _ = self.fence.check_now.notified() => if self.fence.in_doubt() {
                    info!(lease = %self.cfg.lease_name, "the API server refused a write as not the Lease holder's; checking the Lease");
                    tokio::time::sleep_until((last_attempt + self.cfg.retry_period / 2).into()).await;
                    return;
                },
            }
        }
    }

    /// Give the Lease up so a standby can take over at once: one write from
    /// our last one, as client-go's (no holder, a 1 s duration). Errors are
    /// logged, as the Lease expires anyway.
    pub async fn release(&mut self) {
        // Nothing of this replica writes once the Lease may be someone
        // else's: not a sync still running after a forced shutdown.
        self.fence.revoke();
        // The LeaderFence first: cleared after the Lease, it could race the
        // next leader's claim and cost it a retry period.
        self.release_fence().await;
        let Some(mut lease) = self.lease.clone().filter(|l| holder(l).as_deref() == Some(&self.cfg.identity)) else {
            debug!(lease = %self.cfg.lease_name, "lease not ours; nothing to release");
            return;
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match self.api.replace(&self.cfg.lease_name, &post_params(), &lease).await {
            Ok(_) => info!(lease = %self.cfg.lease_name, "lease released"),
            Err(e) => warn!(lease = %self.cfg.lease_name, error = %e, "cannot release lease; it will expire"),
        }
    }

    /// After the Lease was taken or renewed at `attempt`: the fence holds
    /// once the API server's fence names this replica too, and no write is
    /// made before.
    async fn renewed_and_claimed(&mut self, attempt: Instant) {
        if self.claim_fence(attempt).await {
            self.fence.renewed(attempt, self.cfg.renew_deadline);
        } else {
            self.fence.unclaimed();
        }
    }

    /// Make the API server's fence name this replica, which holds the
    /// Lease, before its first write as the leader: the LeaderFence is read
    /// and written with the resourceVersion read, so a deposed leader that
    /// resumes between the two cannot overwrite a newer claim (its write
    /// fails with Conflict, and ours is tried again at the next renewal).
    /// Both requests are made within the renew deadline of `attempt` (the
    /// renewal they follow), as every write of a leader is. True once
    /// claimed, or when there is nothing to claim: no LeaderFence CRD (no
    /// fence installed), or no right to write one (an install without
    /// deploy/'s fence; if a fence is bound after all, its refusals say so).
    /// False, logged, while a claim fails: the replica holds the Lease and
    /// writes nothing.
    async fn claim_fence(&mut self, attempt: Instant) -> bool {
        if !matches!(self.claim, Claim::Pending) {
            return true;
        }
        let name = self.cfg.lease_name.clone();
        let left = self.cfg.renew_deadline.saturating_sub(attempt.elapsed());
        let Ok(outcome) = tokio::time::timeout(left, self.write_claim(&name)).await else {
            warn!(fence = %name, "claiming the LeaderFence took past the renew deadline; claiming again at the next renewal");
            return false;
        };
        match outcome {
            Ok(written) => {
                info!(fence = %name, identity = %self.cfg.identity, "leader fence names this replica");
                self.claim = Claim::Written(Box::new(written));
                self.claimed_once = true;
                self.fence.set_state(FenceState::InPlace);
                true
            }
            Err(kube::Error::Api(s)) if no_such_kind(&s) => {
                info!(fence = %name, "no LeaderFence CRD in the cluster: no API server fence to claim");
                self.no_fence();
                true
            }
            Err(kube::Error::Api(s)) if s.code == 403 => {
                warn!(fence = %name, error = %s.message, "may not write the LeaderFence: if the API server's leader fence is bound, it stays open while no LeaderFence exists, and refuses this replica's writes while one names another replica");
                self.no_fence();
                true
            }
            Err(kube::Error::Api(s)) if s.is_conflict() || s.is_already_exists() || s.is_not_found() => {
                warn!(fence = %name, "the LeaderFence changed while this replica claimed it; claiming again at the next renewal");
                self.fence.set_state(FenceState::Open);
                false
            }
            Err(e) => {
                warn!(fence = %name, error = %e, "cannot claim the LeaderFence; writing nothing until it names this replica");
                self.fence.set_state(FenceState::Open);
                false
            }
        }
    }

    /// Nothing to claim: never installed, or gone since this leader claimed
    /// it (which the gauge reports as open).
    fn no_fence(&mut self) {
        self.claim = Claim::NoFence;
        let state = if self.claimed_once { FenceState::Open } else { FenceState::NotInstalled };
        self.fence.set_state(state);
    }

    /// The LeaderFence read, then written naming this replica: replaced
    /// from the copy read (conditional on its resourceVersion), or created.
    async fn write_claim(&self, name: &str) -> Result<LeaderFence, kube::Error> {
        let current = self.fences.get_opt(name).await?;
        let exists = current.is_some();
        let ours = LeaderFence::naming(current, name, Some(&self.cfg.identity));
        if exists {
            self.fences.replace(name, &post_params(), &ours).await
        } else {
            self.fences.create(&post_params(), &ours).await
        }
    }

    /// After a release: the LeaderFence names nobody, as the Lease, unless
    /// the next leader claimed it already (the write is conditional on our
    /// claim's resourceVersion). Errors are only logged: the next leader
    /// claims it anyway.
    async fn release_fence(&mut self) {
        let Claim::Written(ours) = std::mem::replace(&mut self.claim, Claim::Pending) else { return };
        let released = LeaderFence::naming(Some(*ours), &self.cfg.lease_name, None);
        match self.fences.replace(&self.cfg.lease_name, &post_params(), &released).await {
            Ok(_) => debug!(fence = %self.cfg.lease_name, "leader fence released"),
            Err(e) => {
                debug!(fence = %self.cfg.lease_name, error = %e, "leader fence not released (claimed since, or gone)")
            }
        }
    }

    /// What the watch reports: the Lease as it is now (`None`: there is none).
    fn saw(&mut self, lease: Option<Lease>) {
        if let Some(l) = &lease {
            self.observe(&holder(l), &l.spec.as_ref().and_then(|s| s.renew_time.clone()));
        }
        self.lease = lease;
    }

    /// One write, if the rule says the Lease is ours to take: created if
    /// there is none, else replaced from the watched copy. Its
    /// resourceVersion makes the write fail with Conflict if anyone wrote
    /// the Lease since, so two candidates never both win.
    async fn try_acquire(&mut self) -> Result<Attempt, kube::Error> {
        let Some(current) = self.lease.clone() else {
            return match self.api.create(&post_params(), &self.claim(None)).await {
                Ok(created) => self.won(created),
                Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(Attempt::Lost),
                Err(e) => Err(e),
            };
        };
        match verdict(holder(&current).as_deref(), &self.cfg.identity, self.unchanged_for(), self.cfg.lease_duration) {
            Verdict::Wait(left) => {
                debug!(lease = %current.name_any(), holder = ?holder(&current), "lease held by another candidate");
                Ok(Attempt::HeldFor(left))
            }
            Verdict::Renew | Verdict::Acquire => {
                match self.api.replace(&self.cfg.lease_name, &post_params(), &self.claim(Some(current))).await {
                    Ok(written) => self.won(written),
                    Err(kube::Error::Api(s)) if s.is_conflict() => Ok(Attempt::Lost),
                    Err(e) => Err(e),
                }
            }
        }
    }

    fn won(&mut self, written: Lease) -> Result<Attempt, kube::Error> {
        self.lease = Some(written);
        Ok(Attempt::Won)
    }

    /// One renewal, from the Lease as we last wrote it. Only a conflict
    /// (someone wrote the Lease since, which a leader never expects) costs a
    /// read.
    async fn renew(&mut self) -> Result<Renewal, kube::Error> {
        let ours = self.lease.clone();
        match self.api.replace(&self.cfg.lease_name, &post_params(), &self.claim(ours)).await {
            Ok(written) => {
                self.lease = Some(written);
                return Ok(Renewal::Renewed);
            }
            Err(kube::Error::Api(s)) if s.is_conflict() || s.is_not_found() => {}
            Err(e) => return Err(e),
        }
        let current = self.api.get_opt(&self.cfg.lease_name).await?;
        let held_by = current.as_ref().and_then(holder);
        if held_by.as_deref() == Some(&self.cfg.identity) {
            self.lease = current;
            return Ok(Renewal::Changed);
        }
        Ok(Renewal::TakenOver(held_by.unwrap_or_default()))
    }

    /// The Lease with us as its holder, renewed now: `current` as read (or
    /// last written), or a new one.
    ///
    /// As client-go counts `leaseTransitions`: every acquisition of an
    /// existing Lease by a new holder, a released one included.
    fn claim(&self, current: Option<Lease>) -> Lease {
        let now = MicroTime(Timestamp::now());
        let existed = current.is_some();
        let mut lease = current.unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(self.cfg.lease_name.clone()),
                namespace: Some(self.cfg.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec::default()),
        });
        let previous = holder(&lease);
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if previous.as_deref() != Some(&self.cfg.identity) {
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + i32::from(existed));
        }
        spec.holder_identity = Some(self.cfg.identity.clone());
        spec.lease_duration_seconds = Some(i32::try_from(self.cfg.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX));
        spec.renew_time = Some(now);
        lease
    }

    /// How long the Lease record has been the same, on our clock.
    fn unchanged_for(&self) -> Duration {
        self.observed.as_ref().map_or(Duration::ZERO, |o| o.since.elapsed())
    }

    /// Remember when the Lease record last changed, on our clock.
    fn observe(&mut self, holder: &Option<String>, renew: &Option<MicroTime>) {
        let changed = self.observed.as_ref().is_none_or(|o| o.holder != *holder || o.renew_time != *renew);
        if changed {
            self.observed = Some(Observed { holder: holder.clone(), renew_time: renew.clone(), since: Instant::now() });
        }
    }
}

/// How an attempt to take the Lease went.
#[derive(Debug, PartialEq)]
enum Attempt {
    Won,
    /// Someone else holds it; it expires after this long, unless renewed.
    HeldFor(Duration),
    /// Someone else wrote it first.
    Lost,
}

/// Where this replica's claim on the LeaderFence stands.
#[derive(Debug)]
enum Claim {
    Pending,
    /// As the API server answered our write: what a release writes from.
    Written(Box<LeaderFence>),
    /// No LeaderFence to claim, or no right to claim it.
    NoFence,
}

/// How a renewal went.
#[derive(Debug, PartialEq)]
enum Renewal {
    Renewed,
    /// Still ours, but written by someone else (a label edited, say): the
    /// next renewal starts from the copy just read.
    Changed,
    /// Someone else holds it now (empty: nobody).
    TakenOver(String),
}

/// The holder a Lease names; empty (released) counts as none.
fn holder(lease: &Lease) -> Option<String> {
    lease.spec.as_ref()?.holder_identity.clone().filter(|h| !h.is_empty())
}

async fn sleep_or_pending(wait: Option<Duration>) {
    match wait {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// The one object a watch narrowed to a name follows, after each change:
/// `Ok(None)` while there is none. Nothing is yielded before the watch's
/// first full list; errors are passed on (the watch retries them, as
/// [`crate::client::watch`] paces them).
fn states<K>(api: Api<K>, wc: watcher::Config) -> impl Stream<Item = Result<Option<K>, watcher::Error>> + Send
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let mut listing = None;
    crate::client::watch::watch(api, wc).filter_map(move |ev| {
        let state = match ev {
            Ok(watcher::Event::Init) => {
                listing = None;
                None
            }
            Ok(watcher::Event::InitApply(obj)) => {
                listing = Some(obj);
                None
            }
            Ok(watcher::Event::InitDone) => Some(Ok(listing.take())),
            Ok(watcher::Event::Apply(obj)) => Some(Ok(Some(obj))),
            Ok(watcher::Event::Delete(_)) => Some(Ok(None)),
            Err(e) => Some(Err(e)),
        };
        std::future::ready(state)
    })
}

/// The Lease as the watch sees it ([`states`]); errors only logged.
fn lease_states(api: Api<Lease>, wc: watcher::Config) -> impl Stream<Item = Option<Lease>> {
    states(api, wc)
        .filter_map(|state| std::future::ready(state.inspect_err(|e| debug!(error = %e, "lease watch")).ok()))
}

/// What the leader's watch of its LeaderFence reports.
#[derive(Clone, Debug, PartialEq)]
enum FenceSeen {
    /// The holder it names (`None`: deleted, or released).
    Names(Option<String>),
    /// The API server serves no LeaderFences: the CRD is gone.
    NoKind,
}

/// The LeaderFence as the watch sees it ([`states`]); errors other than a
/// missing CRD only logged.
fn fence_states(api: Api<LeaderFence>, wc: watcher::Config) -> impl Stream<Item = FenceSeen> {
    states(api, wc).filter_map(|state| {
        std::future::ready(match state {
            Ok(fence) => Some(FenceSeen::Names(fence.as_ref().and_then(LeaderFence::holder).map(str::to_owned))),
            Err(watcher::Error::InitialListFailed(kube::Error::Api(s))) if no_such_kind(&s) => Some(FenceSeen::NoKind),
            Err(e) => {
                debug!(error = %e, "leader fence watch");
                None
            }
        })
    })
}

/// A process-unique identity: the pod name ([`POD_NAME_ENV`] from the
/// downward API, which the API server's fence needs; else HOSTNAME, the pod
/// name in most pods, but not with `hostNetwork`, `spec.hostname` or a name
/// over 63 characters), then `_`,
/// the process id and the start time, so a restarted container never
/// mistakes its predecessor's Lease for its own. Pod names have no `_`, so
/// the API server's fence can tell the pod from the rest.
pub fn default_identity() -> String {
    let named = |var: &str| std::env::var(var).ok().filter(|h| !h.is_empty());
    let pod = named(POD_NAME_ENV).or_else(|| named("HOSTNAME")).unwrap_or_else(|| "sample-controller".into());
    let nanos = Timestamp::now().as_nanosecond();
    format!("{pod}_{:x}{:x}", std::process::id(), nanos & 0xffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(15);

    #[test]
    fn takeover_rule() {
        let s = Duration::from_secs;
        let table = [
            // (what, holder, unchanged for, verdict)
            ("free: never held", None, s(0), Verdict::Acquire),
            ("released: holder emptied", Some(""), s(0), Verdict::Acquire),
            ("ours", Some("me"), s(0), Verdict::Renew),
            ("ours, even if we have not renewed for long", Some("me"), s(60), Verdict::Renew),
            ("someone else's, just renewed", Some("other"), s(0), Verdict::Wait(s(15))),
            ("someone else's, 10 s unchanged", Some("other"), s(10), Verdict::Wait(s(5))),
            ("someone else's, expired on our clock", Some("other"), s(15), Verdict::Acquire),
            ("someone else's, long expired", Some("other"), s(600), Verdict::Acquire),
        ];
        for (what, holder, unchanged_for, want) in table {
            assert_eq!(verdict(holder, "me", unchanged_for, LEASE), want, "{what}");
        }
    }

    #[tokio::test]
    async fn expiry_is_timed_on_our_clock_whatever_the_holders_clock_says() {
        // A holder whose clock is an hour behind (or ahead) writes a renewTime
        // far from ours: what counts is when we saw the record change.
        for skew in [-3600, 3600] {
            let mut e = Elector::new(dummy_client(), config("me"));
            let renew =
                MicroTime(Timestamp::now().checked_add(k8s_openapi::jiff::SignedDuration::from_secs(skew)).unwrap());
            e.observe(&Some("other".into()), &Some(renew.clone()));
            assert!(e.unchanged_for() < Duration::from_secs(1), "skew {skew}: a record just seen is fresh");
            // The same record seen again: unchanged, its time keeps running.
            let first = e.observed.clone().unwrap().since;
            e.observe(&Some("other".into()), &Some(renew));
            assert_eq!(e.observed.as_ref().unwrap().since, first);
        }
    }

    #[test]
    fn timing_flags_are_checked_as_client_go_checks_them() {
        let s = Duration::from_secs;
        assert_eq!(check_timing(s(15), s(10), s(2)), Ok(()), "the defaults");
        assert_eq!(check_timing(s(15), s(3), s(2)), Ok(()), "a deadline just over 1.2 retry periods");
        let refused = [
            (s(10), s(10), s(2), "leaseDuration must be greater than renewDeadline"),
            (s(10), s(15), s(2), "leaseDuration must be greater than renewDeadline"),
            (s(15), s(10), s(0), "retryPeriod must be greater than zero"),
            (s(15), s(0), s(2), "renewDeadline must be greater than zero"),
            (s(0), s(10), s(2), "leaseDuration must be greater than zero"),
            (s(15), s(2), s(2), "renewDeadline must be greater than retryPeriod*JitterFactor"),
        ];
        for (lease, renew, retry, message) in refused {
            assert_eq!(check_timing(lease, renew, retry), Err(message.to_owned()), "{lease:?} {renew:?} {retry:?}");
        }
    }

    fn config(identity: &str) -> LeaderConfig {
        LeaderConfig {
            lease_name: "l".into(),
            namespace: "ns".into(),
            identity: identity.into(),
            lease_duration: LEASE,
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// A client that is never called: these tests exercise no request.
    fn dummy_client() -> Client {
        let (service, _handle) =
            tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<kube::client::Body>>();
        Client::new(service, "default")
    }

    #[tokio::test]
    async fn a_leader_of_a_cluster_with_the_foo_crd_alone_claims_no_fence_and_writes() {
        // `kubectl apply -f crds/` installs the Foo CRD only: the API server
        // serves samplecontroller.k8s.io but no leaderfences, and answers
        // the claim with a bare "404 page not found", no Status.
        let (service, mut handle) =
            tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<kube::client::Body>>();
        let server = tokio::spawn(async move {
            let mut paths = Vec::new();
            while let Some((request, reply)) = handle.next_request().await {
                paths.push(request.uri().path().to_owned());
                let body = kube::client::Body::from(b"404 page not found\n".to_vec());
                reply.send_response(http::Response::builder().status(404).body(body).unwrap());
            }
            paths
        });
        let mut e = Elector::new(Client::new(service, "default"), config("me"));
        assert!(e.claim_fence(Instant::now()).await, "nothing to claim: the leader writes");
        assert!(matches!(e.claim, Claim::NoFence));
        assert!(e.claim_fence(Instant::now()).await, "and it asks no more");
        drop(e);
        let paths = server.await.unwrap();
        assert!(paths.iter().all(|p| p.ends_with("/leaderfences/l") || p.ends_with("/leaderfences")), "{paths:?}");
        assert!(!paths.is_empty() && paths.len() <= 2, "one claim's requests, not one per renewal: {paths:?}");
    }

    fn spec(lease: &Lease) -> LeaseSpec {
        lease.spec.clone().unwrap()
    }

    #[tokio::test]
    async fn a_claim_names_the_lease_and_counts_a_transition_on_each_change_of_holder() {
        let e = Elector::new(dummy_client(), config("me"));
        let new = e.claim(None);
        assert_eq!((new.metadata.name.as_deref(), new.metadata.namespace.as_deref()), (Some("l"), Some("ns")));
        let first = spec(&new);
        assert_eq!(first.holder_identity.as_deref(), Some("me"));
        assert_eq!(first.lease_duration_seconds, Some(15));
        assert_eq!(first.lease_transitions, Some(0), "a new Lease has had no transitions");
        assert_eq!(first.acquire_time, first.renew_time);

        let renewed = spec(&e.claim(Some(new.clone())));
        assert_eq!((renewed.lease_transitions, &renewed.acquire_time), (Some(0), &first.acquire_time), "a renewal");

        let mut theirs = new;
        theirs.spec.as_mut().unwrap().holder_identity = Some("other".into());
        let taken = spec(&e.claim(Some(theirs.clone())));
        assert_eq!(taken.lease_transitions, Some(1), "taken from someone else");
        theirs.spec.as_mut().unwrap().holder_identity = None;
        let released = spec(&e.claim(Some(theirs)));
        assert_eq!(released.lease_transitions, Some(1), "a released Lease taken: a transition, as client-go counts");
    }

    /// An elector whose claim on the LeaderFence was written.
    fn claimed(identity: &str) -> Elector {
        let mut e = Elector::new(dummy_client(), config(identity));
        let written = LeaderFence::naming(None, "l", Some(identity));
        e.claim = Claim::Written(Box::new(written));
        e.claimed_once = true;
        e.fence.set_state(FenceState::InPlace);
        e
    }

    #[tokio::test]
    async fn a_leaderfence_deleted_or_naming_another_is_claimed_again_and_reported_open_meanwhile() {
        for seen in [FenceSeen::Names(None), FenceSeen::Names(Some("other_1".into())), FenceSeen::NoKind] {
            let mut e = claimed("me");
            e.saw_fence(seen.clone());
            assert!(matches!(e.claim, Claim::Pending), "{seen:?}: claimed again at the next renewal");
            assert_eq!(e.fence.state(), FenceState::Open, "{seen:?}");
        }
        let mut e = claimed("me");
        e.saw_fence(FenceSeen::Names(Some("me".into())));
        assert!(matches!(e.claim, Claim::Written(_)), "our own claim, as the watch delivers it");
        assert_eq!(e.fence.state(), FenceState::InPlace);
    }

    #[tokio::test]
    async fn a_fence_whose_crd_came_back_is_claimed_again_but_one_never_installed_is_not_an_alarm() {
        let mut deleted = claimed("me");
        deleted.no_fence();
        assert_eq!(deleted.fence.state(), FenceState::Open, "deleted since it was claimed");
        deleted.saw_fence(FenceSeen::NoKind);
        assert!(matches!(deleted.claim, Claim::NoFence), "still gone: nothing to claim yet");
        deleted.saw_fence(FenceSeen::Names(None));
        assert!(matches!(deleted.claim, Claim::Pending), "served again: claimed at the next renewal");

        let mut never = Elector::new(dummy_client(), config("me"));
        never.no_fence();
        assert_eq!(never.fence.state(), FenceState::NotInstalled);
        never.saw_fence(FenceSeen::Names(None));
        assert!(matches!(never.claim, Claim::NoFence));
    }

    #[test]
    fn the_fence_holds_from_a_renewal_until_the_renew_deadline() {
        let fence = Fence::new();
        assert!(!fence.holds(), "not before the first acquire");
        fence.renewed(Instant::now(), Duration::from_millis(50));
        assert!(fence.holds());
        std::thread::sleep(Duration::from_millis(60));
        assert!(!fence.holds(), "past the deadline, as a paused leader is when it resumes");
        fence.renewed(Instant::now(), Duration::from_secs(10));
        assert!(fence.holds());
    }

    #[test]
    fn a_refusal_by_the_api_servers_fence_holds_every_write_until_the_next_renewal() {
        let fence = Fence::holding_for(Duration::from_secs(10));
        fence.doubt();
        assert!(fence.in_doubt() && !fence.holds(), "in doubt, within the renew deadline");
        fence.doubt();
        fence.renewed(Instant::now(), Duration::from_secs(10));
        assert!(!fence.in_doubt() && fence.holds(), "a renewal settles the doubt");
    }

    #[test]
    fn a_refusal_counts_until_a_write_is_admitted_not_until_the_next_renewal() {
        let fence = Fence { lease_duration: Duration::from_millis(20), ..Fence::holding_for(Duration::from_secs(10)) };
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
        let fence = Fence::new();
        fence.unclaimed();
        std::thread::sleep(Duration::from_millis(5));
        assert!(fence.refused_for() >= Duration::from_millis(5));
        assert!(!fence.holds(), "no write while unclaimed");
        fence.renewed(Instant::now(), Duration::from_secs(10));
        assert_eq!(fence.refused_for(), Duration::ZERO, "claimed");
        assert!(fence.holds());
    }

    #[tokio::test]
    async fn the_syncs_wait_for_the_fence_to_hold() {
        let fence = Arc::new(Fence::new());
        let waiting = tokio::spawn({
            let fence = fence.clone();
            async move { fence.held().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "not before a renewal");
        fence.renewed(Instant::now(), Duration::from_secs(10));
        tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("held after the renewal").unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_wakes_the_elector_early_but_no_sooner_than_half_a_retry_period() {
        let e = Elector::new(dummy_client(), config("me"));
        let waited = |doubt: bool| {
            let (fence, e) = (e.fence(), &e);
            async move {
                let t0 = tokio::time::Instant::now();
                let start = t0.into_std();
                if doubt {
                    fence.doubt();
                }
                e.until_next_attempt(start).await;
                t0.elapsed()
            }
        };
        // Timers fire on the millisecond after their deadline.
        let about = |secs: u64| Duration::from_secs(secs)..Duration::from_secs(secs) + Duration::from_millis(10);
        assert!(about(2).contains(&waited(false).await), "a retry period");
        assert!(about(1).contains(&waited(true).await), "half of it, after a refusal");
        // A doubt wakes the elector once: no permit is left for the next wait.
        assert!(about(2).contains(&waited(false).await), "no stale wake-up");
        // A doubt settled by a renewal in flight leaves a wake-up behind,
        // which the next wait ignores.
        e.fence.doubt();
        e.fence.renewed(Instant::now(), Duration::from_secs(10));
        assert!(about(2).contains(&waited(false).await), "a settled doubt wakes no early renewal");
    }
}
