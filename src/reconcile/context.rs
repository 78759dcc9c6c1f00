//! What every sync shares: the client, the caches, the adoption pass, the
//! Event publisher, the metrics, the write gate, the retry counts and the
//! deadline.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube_lease_fence::WriteGate;

use crate::api::foo::Foo;
use crate::cache::Caches;
use crate::client::retry::Failures;
use crate::observe::metrics::Metrics;
use crate::reconcile::adoption::Adoption;
use crate::reconcile::events::Publisher;

/// Shared by all reconciles.
pub struct Context {
    pub client: Client,
    pub(crate) caches: Caches,
    /// The adoption pass, which the first syncs wait for.
    pub(crate) adoption: Arc<Adoption>,
    pub events: Publisher,
    pub metrics: Arc<Metrics>,
    /// Under leader election: whether this replica may still write.
    pub(crate) gate: Option<Arc<WriteGate>>,
    /// Consecutive failures per Foo, for the retry backoff.
    pub(crate) failures: Failures<Foo>,
    /// How long one sync may take (`--reconcile-timeout`).
    pub(crate) reconcile_timeout: Duration,
}

/// `--reconcile-timeout`'s default, [`Context::new`]'s too.
pub const DEFAULT_RECONCILE_TIMEOUT: Duration = Duration::from_secs(120);

impl Context {
    /// `instance` is the Events' `reportingInstance`; a `gate`, under
    /// leader election, is checked before every write.
    pub fn new(
        client: Client,
        caches: Caches,
        adoption: Arc<Adoption>,
        metrics: Arc<Metrics>,
        instance: Option<String>,
        gate: Option<Arc<WriteGate>>,
    ) -> Self {
        let events = Publisher::start(client.clone(), instance, gate.clone(), metrics.queue.clone());
        let failures = Failures::default();
        Context {
            client,
            caches,
            adoption,
            events,
            metrics,
            gate,
            failures,
            reconcile_timeout: DEFAULT_RECONCILE_TIMEOUT,
        }
    }

    /// This context with syncs abandoned after `deadline`.
    pub fn with_reconcile_timeout(self, deadline: Duration) -> Self {
        Context { reconcile_timeout: deadline, ..self }
    }
}
