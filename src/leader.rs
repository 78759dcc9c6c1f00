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

use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tracing::{debug, info, warn};

use crate::constants::FIELD_MANAGER;

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
#[derive(Debug)]
pub struct Fence {
    valid_until: Mutex<Option<Instant>>,
}

impl Fence {
    fn new() -> Self {
        Fence { valid_until: Mutex::new(None) }
    }

    /// True while the last renewal is within the renew deadline.
    pub fn holds(&self) -> bool {
        self.valid_until.lock().unwrap_or_else(|e| e.into_inner()).is_some_and(|until| Instant::now() < until)
    }

    fn renewed(&self, attempt: Instant, deadline: Duration) {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner()) = Some(attempt + deadline);
    }
}

/// One candidate for the Lease.
pub struct Elector {
    api: Api<Lease>,
    cfg: LeaderConfig,
    fence: Arc<Fence>,
    /// The last Lease record seen and when it was first seen, on our clock.
    observed: Option<(Option<String>, Option<MicroTime>, Instant)>,
}

impl Elector {
    pub fn new(client: Client, cfg: LeaderConfig) -> Self {
        Elector { api: Api::namespaced(client, &cfg.namespace), cfg, fence: Arc::new(Fence::new()), observed: None }
    }

    /// The fence this elector keeps up to date while it leads.
    pub fn fence(&self) -> Arc<Fence> {
        self.fence.clone()
    }

    pub fn identity(&self) -> &str {
        &self.cfg.identity
    }

    /// Wait until this candidate holds the Lease.
    pub async fn acquire(&mut self) {
        let wc = watcher::Config::default().fields(&format!("metadata.name={}", self.cfg.lease_name));
        // Any change of the Lease (a release above all) wakes us at once.
        let mut changes = pin!(lease_changes(self.api.clone(), wc));
        info!(lease = %self.cfg.lease_name, identity = %self.cfg.identity, "waiting to lead");
        loop {
            let attempt = Instant::now();
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    self.fence.renewed(attempt, self.cfg.renew_deadline);
                    info!(lease = %self.cfg.lease_name, identity = %self.cfg.identity, "leading");
                    return;
                }
                Ok(false) => {}
                Err(e) => warn!(lease = %self.cfg.lease_name, error = %e, "cannot acquire lease"),
            }
            let wait = self.until_expiry().min(self.cfg.retry_period);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = changes.next() => {}
            }
        }
    }

    /// Renew the Lease until leadership is lost. Never returns while leading.
    pub async fn hold(&mut self) -> Lost {
        let mut last_renew = Instant::now();
        loop {
            tokio::time::sleep(self.cfg.retry_period).await;
            let attempt = Instant::now();
            let left = self.cfg.renew_deadline.saturating_sub(attempt - last_renew);
            match tokio::time::timeout(left, self.try_acquire_or_renew()).await {
                Ok(Ok(true)) => {
                    last_renew = attempt;
                    self.fence.renewed(attempt, self.cfg.renew_deadline);
                }
                Ok(Ok(false)) => {
                    let holder = self.observed.as_ref().and_then(|o| o.0.clone()).unwrap_or_default();
                    return Lost::TakenOver(holder);
                }
                Ok(Err(e)) => warn!(lease = %self.cfg.lease_name, error = %e, "cannot renew lease"),
                Err(_) => warn!(lease = %self.cfg.lease_name, "lease renewal timed out"),
            }
            if last_renew.elapsed() >= self.cfg.renew_deadline {
                return Lost::RenewDeadline;
            }
        }
    }

    /// Give the Lease up so a standby can take over at once. Only if we
    /// still hold it; errors are logged, as the Lease expires anyway.
    pub async fn release(&mut self) {
        let result = async {
            let Some(mut lease) = self.api.get_opt(&self.cfg.lease_name).await? else {
                return Ok(false);
            };
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            if spec.holder_identity.as_deref() != Some(self.cfg.identity.as_str()) {
                return Ok(false);
            }
            // As client-go: no holder, a 1 s duration.
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(MicroTime(Timestamp::now()));
            self.api.replace(&self.cfg.lease_name, &post_params(), &lease).await?;
            Ok::<_, kube::Error>(true)
        }
        .await;
        match result {
            Ok(true) => info!(lease = %self.cfg.lease_name, "lease released"),
            Ok(false) => debug!(lease = %self.cfg.lease_name, "lease not ours; nothing to release"),
            Err(e) => warn!(lease = %self.cfg.lease_name, error = %e, "cannot release lease; it will expire"),
        }
    }

    /// client-go's tryAcquireOrRenew: take the Lease if it is free, expired
    /// or ours; `Ok(false)` if someone else holds it (or won a race for it).
    async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let now = MicroTime(Timestamp::now());
        let duration_secs = i32::try_from(self.cfg.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX);
        let Some(mut lease) = self.api.get_opt(&self.cfg.lease_name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.cfg.lease_name.clone()),
                    namespace: Some(self.cfg.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.cfg.identity.clone()),
                    lease_duration_seconds: Some(duration_secs),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&post_params(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(false),
                Err(e) => Err(e),
            };
        };

        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        self.observe(&holder, &spec.renew_time);
        let ours = holder.as_deref() == Some(self.cfg.identity.as_str());
        if let Some(other) = &holder
            && !ours
            && self.until_expiry() > Duration::ZERO
        {
            debug!(lease = %lease.name_any(), holder = %other, "lease held by another candidate");
            return Ok(false);
        }

        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if !ours {
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + i32::from(holder.is_some()));
        }
        spec.holder_identity = Some(self.cfg.identity.clone());
        spec.lease_duration_seconds = Some(duration_secs);
        spec.renew_time = Some(now);
        // `replace` carries the resourceVersion we read: if anyone wrote the
        // Lease since, this fails with Conflict and nobody gets two leaders.
        match self.api.replace(&self.cfg.lease_name, &post_params(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.is_conflict() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Remember when the Lease record last changed, on our clock.
    fn observe(&mut self, holder: &Option<String>, renew: &Option<MicroTime>) {
        let changed = match &self.observed {
            Some((h, r, _)) => h != holder || r != renew,
            None => true,
        };
        if changed {
            self.observed = Some((holder.clone(), renew.clone(), Instant::now()));
        }
    }

    /// Time left before the last observed record expires (zero if it has,
    /// or if none was seen).
    fn until_expiry(&self) -> Duration {
        match &self.observed {
            Some((Some(_), _, seen)) => self.cfg.lease_duration.saturating_sub(seen.elapsed()),
            _ => Duration::ZERO,
        }
    }
}

fn post_params() -> PostParams {
    PostParams { field_manager: Some(FIELD_MANAGER.into()), ..PostParams::default() }
}

/// A stream that yields whenever the Lease changes; watch errors are retried
/// by the watcher's backoff and only logged.
fn lease_changes(api: Api<Lease>, wc: watcher::Config) -> impl Stream<Item = ()> {
    use kube::runtime::WatchStreamExt;
    watcher(api, wc).default_backoff().filter_map(|ev| async move {
        match ev {
            Ok(_) => Some(()),
            Err(e) => {
                debug!(error = %e, "lease watch");
                None
            }
        }
    })
}

/// A process-unique identity: the pod name (HOSTNAME in a pod), the process
/// id and the start time, so a restarted container never mistakes its
/// predecessor's Lease for its own.
pub fn default_identity() -> String {
    let host = std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()).unwrap_or_else(|| "sample-controller".into());
    let nanos = Timestamp::now().as_nanosecond();
    format!("{host}_{:x}{:x}", std::process::id(), nanos & 0xffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
