//! The Lease elector: takes, renews and releases the Lease.

use std::pin::pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use parking_lot::Mutex;
use tracing::{debug, info, warn};

use crate::fence::Claim;
use crate::gate::WriteGate;
use crate::timing::{LeaseVerdict, TimingError, check_timing, lease_verdict};
use crate::watch::{DefaultBackoff, Watches, states};

/// The API server's fence: the custom resource its policy reads the
/// leaders from (its CRD and policy: the crate's README), and the one object
/// of it, in the Lease's namespace, where each leader names itself under
/// its Lease's name (`spec.holders`). Several Leases fenced together (the
/// shards of one operator) share it, so that the policy admits the holder
/// of any of them and nobody else.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Fence {
    /// The custom resource.
    pub resource: ApiResource,
    /// The object's name.
    pub name: String,
}

impl Fence {
    /// The object `name` of the custom resource `resource`.
    pub fn new(resource: ApiResource, name: impl Into<String>) -> Self {
        Fence { resource, name: name.into() }
    }
}

/// The Lease contended for, the candidate's identity and timing, and the
/// API server's fence: [`LeaderConfig::new`], then the `with_` methods.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct LeaderConfig {
    /// The Lease's name: the key under which the fence's object names its
    /// holder.
    pub lease_name: String,
    /// The namespace of the Lease and of the fence's object.
    pub namespace: String,
    /// Unique per process: see [`default_identity`](crate::default_identity).
    pub identity: String,
    /// How long a standby waits, on its own clock, after the Lease last
    /// changed before it takes it over (client-go's `LeaseDuration`).
    pub lease_duration: Duration,
    /// How long the leader keeps leading without a successful renewal
    /// (client-go's `RenewDeadline`); shorter than the lease duration.
    pub renew_deadline: Duration,
    /// How often the leader renews (client-go's `RetryPeriod`).
    pub retry_period: Duration,
    /// The field manager of the elector's writes.
    pub field_manager: String,
    /// The API server's fence, or `None` for none.
    pub fence: Option<Fence>,
    /// The longest the user's writes wait between retries (a workqueue's
    /// backoff cap): a refusal by the fence not repeated for longer than
    /// this and a lease duration is over.
    pub retry_cap: Duration,
}

impl LeaderConfig {
    /// `identity`'s candidacy for the Lease `namespace/lease_name`, with
    /// client-go's timings (a lease duration of 15 s, a renew deadline of
    /// 10 s, a retry period of 2 s), no fence, the Lease's name as the field
    /// manager of its writes, and a retry cap of 1000 s (client-go's
    /// workqueue's).
    pub fn new(lease_name: impl Into<String>, namespace: impl Into<String>, identity: impl Into<String>) -> Self {
        let lease_name = lease_name.into();
        LeaderConfig {
            field_manager: lease_name.clone(),
            lease_name,
            namespace: namespace.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            fence: None,
            retry_cap: Duration::from_secs(1000),
        }
    }

    /// Other timings ([`check_timing`] says which are refused).
    pub fn with_timing(mut self, lease_duration: Duration, renew_deadline: Duration, retry_period: Duration) -> Self {
        (self.lease_duration, self.renew_deadline, self.retry_period) = (lease_duration, renew_deadline, retry_period);
        self
    }

    /// The API server's fence to claim.
    pub fn with_fence(mut self, fence: Fence) -> Self {
        self.fence = Some(fence);
        self
    }

    /// The field manager of the elector's writes.
    pub fn with_field_manager(mut self, field_manager: impl Into<String>) -> Self {
        self.field_manager = field_manager.into();
        self
    }

    /// The longest the user's writes wait between retries.
    pub fn with_retry_cap(mut self, retry_cap: Duration) -> Self {
        self.retry_cap = retry_cap;
        self
    }
}

/// Why leadership ended. The gate is shut before it is reported.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Lost {
    /// Another candidate holds the Lease now (empty: the Lease names no
    /// holder, as someone else's write left it).
    #[error("{0} holds it now")]
    TakenOver(String),
    /// The Lease was deleted: a standby takes it over only a lease duration
    /// after it saw the deletion.
    #[error("the Lease was deleted")]
    Deleted,
    /// No renewal succeeded within the renew deadline.
    #[error("no renewal succeeded within the renew deadline")]
    RenewDeadline,
}

/// One candidate for the Lease, watching it through `W`.
pub struct Elector<W: Watches = DefaultBackoff> {
    api: Api<Lease>,
    /// The API server's fence's parameter objects (`None`: no fence).
    pub(crate) fences: Option<Api<DynamicObject>>,
    /// The fence's object as this replica wrote it, naming it, since it last
    /// took the Lease; `Pending` until then and after a refusal, when it
    /// is read and written again.
    pub(crate) claim: Claim,
    /// A fence object was claimed since this replica took the Lease: one
    /// missing now was deleted, not never installed.
    pub(crate) claimed_once: bool,
    pub(crate) cfg: LeaderConfig,
    pub(crate) gate: Arc<WriteGate>,
    pub(crate) watches: W,
    /// The Lease as last written by us or reported by the watch: a write is
    /// made from it, so it carries the resourceVersion that makes the write
    /// conditional (no read before a write).
    lease: Option<Lease>,
    /// Whether `lease` says anything yet: the watch's first list (or a read
    /// while the watch fails) has come.
    known: bool,
    observed: Option<LeaseSeen>,
    /// The watch of the Lease, opened once and kept from the first
    /// `acquire` on: a standby times expiry by it, a leader sees a deletion
    /// or another holder by it. In a mutex only so that the elector is
    /// `Sync` (it is taken out with `get_mut`, never locked).
    lease_watch: Mutex<Option<LeaseWatch>>,
    /// When the last successful acquire or renewal began: the renew
    /// deadline runs from it.
    last_renew: Option<Instant>,
}

/// The last Lease record a candidate saw, and when it first saw it, on its
/// own clock: a Lease expires when its record has not changed for the lease
/// duration as the candidate measures it, never by comparing the holder's
/// `renewTime` with the local clock (clock skew between nodes).
#[derive(Clone, Debug, PartialEq)]
struct LeaseSeen {
    holder: Option<String>,
    renew_time: Option<MicroTime>,
    /// The record's `leaseDurationSeconds`.
    duration: Option<Duration>,
    /// The Lease was deleted: this is when the deletion was seen, and the
    /// rest is the record it deleted.
    deleted: bool,
    /// On tokio's clock, which tests may pause.
    since: tokio::time::Instant,
}

impl<W: Watches> std::fmt::Debug for Elector<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("cfg", &self.cfg)
            .field("holder", &self.lease.as_ref().and_then(holder))
            .field("gate", &self.gate)
            .finish_non_exhaustive()
    }
}

impl Elector {
    /// A candidate watching with kube-runtime's default backoff; `Err` if
    /// its timing is one [`check_timing`] refuses.
    pub fn new(client: Client, cfg: LeaderConfig) -> Result<Self, TimingError> {
        Elector::with_watches(client, cfg, DefaultBackoff)
    }
}

impl<W: Watches> Elector<W> {
    /// A candidate whose watches `watches` opens and paces; `Err` if its
    /// timing is one [`check_timing`] refuses.
    pub fn with_watches(client: Client, cfg: LeaderConfig, watches: W) -> Result<Self, TimingError> {
        check_timing(cfg.lease_duration, cfg.renew_deadline, cfg.retry_period)?;
        let fences = cfg.fence.as_ref().map(|f| Api::namespaced_with(client.clone(), &cfg.namespace, &f.resource));
        Ok(Elector {
            api: Api::namespaced(client, &cfg.namespace),
            fences,
            claim: Claim::Pending,
            claimed_once: false,
            gate: Arc::new(WriteGate::for_lease(cfg.lease_duration, cfg.retry_cap)),
            watches,
            cfg,
            lease: None,
            known: false,
            observed: None,
            lease_watch: Mutex::new(None),
            last_renew: None,
        })
    }

    pub(crate) fn post_params(&self) -> PostParams {
        PostParams { field_manager: Some(self.cfg.field_manager.clone()), ..PostParams::default() }
    }

    /// The name of the Lease contended for.
    pub fn lease_name(&self) -> &str {
        &self.cfg.lease_name
    }

    /// The write gate this elector keeps up to date while it leads.
    pub fn gate(&self) -> Arc<WriteGate> {
        self.gate.clone()
    }

    /// Wait until this candidate holds the Lease. A standby reads nothing:
    /// it watches the Lease and times its expiry on its own clock, so
    /// waiting costs no request beyond the watch's. A Lease deleted under
    /// its holder counts as a change of record: it is taken only a lease
    /// duration after the deletion was seen (the holder's watch sees it
    /// too, and stops writing at once). While the watch fails (no right to
    /// list or watch Leases, say), each failure is a WARN and the Lease is
    /// read every retry period instead.
    pub async fn acquire(&mut self) {
        let mut changes = self.take_lease_watch();
        info!(lease = %self.cfg.lease_name, identity = %self.cfg.identity, "waiting to lead");
        // Nothing is known until the watch's first list, or a read.
        let (mut wait, mut failing) = (None, false);
        loop {
            tokio::select! {
                state = changes.next() => match state {
                    Some(Ok(lease)) => {
                        failing = false;
                        self.saw(lease);
                    }
                    Some(Err(e)) => {
                        warn!(lease = %self.cfg.lease_name, error = %e, "cannot watch the Lease; reading it every retry period meanwhile");
                        failing = true;
                        wait = Some(self.cfg.retry_period);
                        continue;
                    }
                    // The watcher retries for ever; it never ends.
                    None => return std::future::pending().await,
                },
                _ = sleep_or_pending(wait) => if failing {
                    match self.api.get_opt(&self.cfg.lease_name).await {
                        Ok(lease) => self.saw(lease),
                        Err(e) => {
                            warn!(lease = %self.cfg.lease_name, error = %e, "cannot read the Lease");
                            wait = Some(self.cfg.retry_period);
                            continue;
                        }
                    }
                },
            }
            if !self.known {
                continue;
            }
            let attempt = Instant::now();
            wait = match self.try_acquire().await {
                Ok(Attempt::Won) => {
                    self.last_renew = Some(attempt);
                    self.start_claim();
                    self.renewed_and_claimed(attempt).await;
                    info!(lease = %self.cfg.lease_name, identity = %self.cfg.identity, "leading");
                    *self.lease_watch.get_mut() = Some(changes);
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
            }
            .map(|w| if failing { w.min(self.cfg.retry_period) } else { w });
        }
    }

    /// The Lease's watch, opened on first use.
    fn take_lease_watch(&mut self) -> LeaseWatch {
        self.lease_watch.get_mut().take().unwrap_or_else(|| {
            let wc = watcher::Config::default().fields(&format!("metadata.name={}", self.cfg.lease_name));
            states(&self.watches, self.api.clone(), wc).boxed()
        })
    }

    /// Renew the Lease until leadership is lost. Never returns while
    /// leading. The renew deadline runs from the start of the last
    /// successful acquire or renewal: call it right after
    /// [`Elector::acquire`]. A deletion of the Lease, or another holder,
    /// seen by its watch shuts the gate at once; a renewal then settles it
    /// (a stale event of the watch reopens the gate, a real one is
    /// reported).
    pub async fn hold(&mut self) -> Lost {
        let mut changes = self.take_lease_watch();
        let lost = self.renew_until_lost(&mut changes).await;
        *self.lease_watch.get_mut() = Some(changes);
        self.gate.revoke();
        lost
    }

    async fn renew_until_lost(&mut self, changes: &mut LeaseWatch) -> Lost {
        let mut last_renew = self.last_renew.unwrap_or_else(Instant::now);
        let mut last_attempt = last_renew;
        let mut fence_changes = self.fence_changes();
        loop {
            tokio::select! {
                () = self.until_next_attempt(last_attempt) => {}
                Some(seen) = fence_changes.next() => {
                    self.saw_fence(seen);
                    continue;
                }
                Some(state) = changes.next() => match state {
                    Ok(lease) if lease.as_ref().and_then(holder).as_deref() != Some(&self.cfg.identity) => {
                        // Deleted, or someone else's: write nothing until a
                        // renewal says whether it is still ours.
                        self.gate.suspend();
                        warn!(lease = %self.cfg.lease_name, holder = ?lease.as_ref().and_then(holder), "the Lease was deleted or names another holder; writes stop until it is renewed");
                    }
                    Ok(_) => continue,
                    Err(e) => {
                        warn!(lease = %self.cfg.lease_name, error = %e, "cannot watch the Lease while leading");
                        continue;
                    }
                },
            }
            let attempt = Instant::now();
            last_attempt = attempt;
            // A refusal may come from a LeaderFence that names someone
            // else (edited, or written by a deposed leader that resumed):
            // read and claim it again after this renewal.
            if self.gate.in_doubt() {
                self.start_claim();
            }
            let left = self.cfg.renew_deadline.saturating_sub(attempt - last_renew);
            match tokio::time::timeout(left, self.renew()).await {
                Ok(Ok(Renewal::Renewed)) => {
                    last_renew = attempt;
                    self.last_renew = Some(attempt);
                    self.renewed_and_claimed(attempt).await;
                }
                Ok(Ok(Renewal::Changed)) => {
                    info!(lease = %self.cfg.lease_name, "lease changed under its leader; renewing from the current copy")
                }
                Ok(Ok(Renewal::TakenOver(holder))) => return Lost::TakenOver(holder),
                Ok(Ok(Renewal::Gone)) => return Lost::Deleted,
                Ok(Err(e)) => warn!(lease = %self.cfg.lease_name, error = %e, "cannot renew lease"),
                Err(_) => warn!(lease = %self.cfg.lease_name, "lease renewal timed out"),
            }
            if last_renew.elapsed() >= self.cfg.renew_deadline {
                return Lost::RenewDeadline;
            }
        }
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
                _ = self.gate.check_now.notified() => if self.gate.in_doubt() {
                    info!(lease = %self.cfg.lease_name, "the API server refused a write as not the Lease holder's; checking the Lease");
                    tokio::time::sleep_until((last_attempt + self.cfg.retry_period / 2).into()).await;
                    return;
                },
            }
        }
    }

    /// [`Elector::release`] after an `acquire` cut short: its write may have
    /// taken the Lease without this elector knowing, so the Lease is read
    /// first.
    pub(crate) async fn release_after_cut_acquire(&mut self) {
        self.gate.revoke();
        match self.api.get_opt(&self.cfg.lease_name).await {
            Ok(current) => {
                self.lease = current;
                self.release().await;
            }
            Err(e) => {
                warn!(lease = %self.cfg.lease_name, error = %e, "cannot read the lease after stopping; if it names this replica, it will expire")
            }
        }
    }

    /// Give the Lease up so a standby can take over at once: one write from
    /// our last one, as client-go's (no holder, a 1 s duration). Errors are
    /// logged, as the Lease expires anyway.
    pub async fn release(&mut self) {
        // Nothing of this replica writes once the Lease may be someone
        // else's: not a sync still running after a forced shutdown.
        self.gate.revoke();
        // The LeaderFence first: cleared after the Lease, it could race the
        // next leader's claim and cost it a retry period.
        self.release_fence().await;
        let mut ours = self.lease.clone();
        for _ in 0..RELEASE_TRIES {
            let Some(mut lease) = ours.filter(|l| holder(l).as_deref() == Some(&self.cfg.identity)) else {
                debug!(lease = %self.cfg.lease_name, "lease not ours; nothing to release");
                return;
            };
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(MicroTime(Timestamp::now()));
            match self.api.replace(&self.cfg.lease_name, &self.post_params(), &lease).await {
                Ok(_) => return info!(lease = %self.cfg.lease_name, "lease released"),
                // Written since (a label, say): released from the copy read,
                // if it still names us.
                Err(kube::Error::Api(s)) if s.is_conflict() => {
                    ours = match self.api.get_opt(&self.cfg.lease_name).await {
                        Ok(current) => current,
                        Err(e) => {
                            return warn!(lease = %self.cfg.lease_name, error = %e, "cannot release lease; it will expire");
                        }
                    }
                }
                Err(e) => {
                    return warn!(lease = %self.cfg.lease_name, error = %e, "cannot release lease; it will expire");
                }
            }
        }
        warn!(lease = %self.cfg.lease_name, "cannot release lease: written by others each time; it will expire");
    }

    /// What the watch (or a read) reports: the Lease as it is now (`None`:
    /// there is none). A Lease seen and then gone was deleted: its record
    /// changed, now.
    fn saw(&mut self, lease: Option<Lease>) {
        match &lease {
            Some(l) => self.observe(LeaseSeen::of(l)),
            None => {
                if let Some(seen) = self.observed.clone().filter(|o| !o.deleted) {
                    self.observed = Some(LeaseSeen { deleted: true, since: tokio::time::Instant::now(), ..seen });
                }
            }
        }
        self.lease = lease;
        self.known = true;
    }

    /// One write, if the rule says the Lease is ours to take: created if
    /// there is none, else replaced from the watched copy. Its
    /// resourceVersion makes the write fail with Conflict if anyone wrote
    /// the Lease since, so two candidates never both win.
    async fn try_acquire(&mut self) -> Result<Attempt, kube::Error> {
        let Some(current) = self.lease.clone() else {
            if let Some(left) = self.deleted_for() {
                debug!(lease = %self.cfg.lease_name, "lease deleted; taking it once a lease duration has passed");
                return Ok(Attempt::HeldFor(left));
            }
            return match self.api.create(&self.post_params(), &self.record(None)).await {
                Ok(created) => self.won(created),
                Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(Attempt::Lost),
                Err(e) => Err(e),
            };
        };
        match lease_verdict(
            holder(&current).as_deref(),
            &self.cfg.identity,
            self.unchanged_for(),
            self.takeover_after(),
        ) {
            LeaseVerdict::Wait(left) => {
                debug!(lease = %current.name_any(), holder = ?holder(&current), "lease held by another candidate");
                Ok(Attempt::HeldFor(left))
            }
            LeaseVerdict::Renew | LeaseVerdict::Acquire => {
                match self.api.replace(&self.cfg.lease_name, &self.post_params(), &self.record(Some(current))).await {
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
        match self.api.replace(&self.cfg.lease_name, &self.post_params(), &self.record(ours)).await {
            Ok(written) => {
                self.lease = Some(written);
                return Ok(Renewal::Renewed);
            }
            Err(kube::Error::Api(s)) if s.is_conflict() || s.is_not_found() => {}
            Err(e) => return Err(e),
        }
        let Some(current) = self.api.get_opt(&self.cfg.lease_name).await? else {
            return Ok(Renewal::Gone);
        };
        let held_by = holder(&current);
        if held_by.as_deref() == Some(&self.cfg.identity) {
            self.lease = Some(current);
            return Ok(Renewal::Changed);
        }
        Ok(Renewal::TakenOver(held_by.unwrap_or_default()))
    }

    /// The Lease record with us as its holder, renewed now: `current` as read (or
    /// last written), or a new one.
    ///
    /// As client-go counts `leaseTransitions`: every acquisition of an
    /// existing Lease by a new holder, a released one included.
    pub(crate) fn record(&self, current: Option<Lease>) -> Lease {
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

    /// How long a record must stay unchanged before it is taken over: our
    /// lease duration, or the record's if longer (client-go waits the
    /// record's: a rollout that shortens the timings must not let a new
    /// replica take over while the old leader's gate is still open).
    fn takeover_after(&self) -> Duration {
        let record = self.observed.as_ref().and_then(|o| o.duration);
        record.map_or(self.cfg.lease_duration, |d| d.max(self.cfg.lease_duration))
    }

    /// How much longer a deleted Lease must stay deleted before it is made
    /// again; `None` when it may be made now (never seen, or long enough).
    fn deleted_for(&self) -> Option<Duration> {
        let deleted = self.observed.as_ref().filter(|o| o.deleted)?;
        self.takeover_after().checked_sub(deleted.since.elapsed()).filter(|left| !left.is_zero())
    }

    /// Remember when the Lease record last changed, on our clock.
    fn observe(&mut self, seen: LeaseSeen) {
        let changed = self.observed.as_ref().is_none_or(|o| {
            o.deleted || o.holder != seen.holder || o.renew_time != seen.renew_time || o.duration != seen.duration
        });
        if changed {
            self.observed = Some(seen);
        }
    }
}

impl LeaseSeen {
    /// `lease`'s record, seen now.
    fn of(lease: &Lease) -> LeaseSeen {
        let spec = lease.spec.as_ref();
        let duration = spec.and_then(|s| s.lease_duration_seconds).and_then(|d| u64::try_from(d).ok());
        LeaseSeen {
            holder: holder(lease),
            renew_time: spec.and_then(|s| s.renew_time.clone()),
            duration: duration.map(Duration::from_secs),
            deleted: false,
            since: tokio::time::Instant::now(),
        }
    }
}

/// The Lease as its watch reports it, after each change.
type LeaseWatch = BoxStream<'static, Result<Option<Lease>, watcher::Error>>;

/// Tries of a release whose conditional write meets a newer copy.
const RELEASE_TRIES: usize = 3;

/// How an attempt to take the Lease went.
#[derive(Debug, PartialEq)]
enum Attempt {
    Won,
    /// Someone else holds it; it expires after this long, unless renewed.
    HeldFor(Duration),
    /// Someone else wrote it first.
    Lost,
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
    /// There is no Lease: it was deleted.
    Gone,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{LEASE, config, dummy_client};

    #[tokio::test]
    async fn expiry_is_timed_on_our_clock_whatever_the_holders_clock_says() {
        // A holder whose clock is an hour behind (or ahead) writes a renewTime
        // far from ours: what counts is when we saw the record change.
        for skew in [-3600, 3600] {
            let mut e = Elector::new(dummy_client(), config("me")).unwrap();
            let renew =
                MicroTime(Timestamp::now().checked_add(k8s_openapi::jiff::SignedDuration::from_secs(skew)).unwrap());
            e.saw(Some(held_by("other", 15, Some(renew.clone()))));
            assert!(e.unchanged_for() < Duration::from_secs(1), "skew {skew}: a record just seen is fresh");
            // The same record seen again: unchanged, its time keeps running.
            let first = e.observed.clone().unwrap().since;
            e.saw(Some(held_by("other", 15, Some(renew))));
            assert_eq!(e.observed.as_ref().unwrap().since, first);
        }
    }

    fn spec(lease: &Lease) -> LeaseSpec {
        lease.spec.clone().unwrap()
    }

    /// A Lease held by `holder` for `seconds`, renewed at `renew`.
    fn held_by(holder: &str, seconds: i32, renew: Option<MicroTime>) -> Lease {
        Lease {
            metadata: ObjectMeta { name: Some("l".into()), ..ObjectMeta::default() },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(seconds),
                renew_time: renew,
                ..LeaseSpec::default()
            }),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_deleted_under_its_holder_is_made_again_only_a_lease_duration_after_the_deletion_was_seen() {
        let mut e = Elector::new(dummy_client(), config("me")).unwrap();
        e.saw(Some(held_by("other", 15, None)));
        tokio::time::advance(Duration::from_secs(10)).await;
        e.saw(None);
        assert_eq!(e.deleted_for(), Some(LEASE), "the full duration, from the deletion");
        tokio::time::advance(Duration::from_secs(14)).await;
        assert_eq!(e.deleted_for(), Some(Duration::from_secs(1)));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(e.deleted_for(), None, "then made again");
        // Seen missing again: still the same deletion, not a new one.
        e.saw(None);
        assert_eq!(e.deleted_for(), None);
        // A candidate that never saw a Lease makes one at once.
        let mut fresh = Elector::new(dummy_client(), config("me")).unwrap();
        fresh.saw(None);
        assert_eq!(fresh.deleted_for(), None);
        assert!(fresh.known, "known to be missing");
    }

    #[tokio::test(start_paused = true)]
    async fn hold_called_late_counts_the_renew_deadline_from_the_acquire_and_shuts_the_gate_before_reporting() {
        // The API server never answers (the mock's handle is dropped with
        // the client): no renewal succeeds.
        let mut e = Elector::new(dummy_client(), config("me")).unwrap();
        let acquired = Instant::now() - Duration::from_secs(10);
        e.last_renew = Some(acquired);
        e.gate.renewed(acquired, Duration::from_secs(10));
        let t0 = tokio::time::Instant::now();
        assert_eq!(e.hold().await, Lost::RenewDeadline);
        assert!(t0.elapsed() < Duration::from_secs(1), "the deadline was already past: {:?}", t0.elapsed());
        assert!(!e.gate.holds() && !e.gate.interrupted(), "the gate shut for good");
    }

    #[tokio::test(start_paused = true)]
    async fn a_takeover_waits_the_records_lease_duration_when_it_is_longer_than_ours() {
        let mut e = Elector::new(dummy_client(), config("me")).unwrap();
        e.saw(Some(held_by("other", 60, None)));
        assert_eq!(e.takeover_after(), Duration::from_secs(60), "a longer record's");
        e.saw(Some(held_by("other", 5, None)));
        assert_eq!(e.takeover_after(), LEASE, "never shorter than ours");
        // A deleted record's duration counts as the record's.
        e.saw(Some(held_by("other", 40, None)));
        e.saw(None);
        assert_eq!(e.deleted_for(), Some(Duration::from_secs(40)));
    }

    #[tokio::test]
    async fn a_lease_record_names_the_lease_and_counts_a_transition_on_each_change_of_holder() {
        let e = Elector::new(dummy_client(), config("me")).unwrap();
        let new = e.record(None);
        assert_eq!((new.metadata.name.as_deref(), new.metadata.namespace.as_deref()), (Some("l"), Some("ns")));
        let first = spec(&new);
        assert_eq!(first.holder_identity.as_deref(), Some("me"));
        assert_eq!(first.lease_duration_seconds, Some(15));
        assert_eq!(first.lease_transitions, Some(0), "a new Lease has had no transitions");
        assert_eq!(first.acquire_time, first.renew_time);

        let renewed = spec(&e.record(Some(new.clone())));
        assert_eq!((renewed.lease_transitions, &renewed.acquire_time), (Some(0), &first.acquire_time), "a renewal");

        let mut theirs = new;
        theirs.spec.as_mut().unwrap().holder_identity = Some("other".into());
        let taken = spec(&e.record(Some(theirs.clone())));
        assert_eq!(taken.lease_transitions, Some(1), "taken from someone else");
        theirs.spec.as_mut().unwrap().holder_identity = None;
        let released = spec(&e.record(Some(theirs)));
        assert_eq!(released.lease_transitions, Some(1), "a released Lease taken: a transition, as client-go counts");
    }

    #[tokio::test]
    async fn an_elector_whose_leader_could_outlive_its_lease_is_refused() {
        let mut cfg = config("me");
        cfg.renew_deadline = cfg.lease_duration;
        let refused = Elector::new(dummy_client(), cfg).err().map(|e| e.to_string());
        assert_eq!(refused.as_deref(), Some("leaseDuration must be greater than renewDeadline"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_wakes_the_elector_early_but_no_sooner_than_half_a_retry_period() {
        let e = Elector::new(dummy_client(), config("me")).unwrap();
        let waited = |doubt: bool| {
            let (fence, e) = (e.gate(), &e);
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
        e.gate.doubt();
        e.gate.renewed(Instant::now(), Duration::from_secs(10));
        assert!(about(2).contains(&waited(false).await), "a settled doubt wakes no early renewal");
    }
}
