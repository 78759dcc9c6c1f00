//! The operator process: endpoints, client, leader election, controller,
//! the adoption pass and shutdown, put together. `main.rs` only parses flags
//! and calls [`run`].

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use kube::api::ApiResource;
use kube::runtime::Controller;
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};
use kube_lease_fence::{Elector, Fence, LeaderConfig, Lost, WriteGate, check_timing, default_identity, may_write};
use kube_secure_metrics::{self as endpoints, BindError, MetricsAuth, Readiness, TlsError};
use tokio::task::JoinHandle;
use tracing::{debug, info};

use crate::api::constants::POD_NAME_ENV;
use crate::api::foo::Foo;
use crate::api::leader_fence::LeaderFence;
use crate::api::shard::Shard;
use crate::cache::Caches;
use crate::client::retry::BACKOFF_MAX;
use crate::client::watch::Paced;
use crate::client::{self, ConfigError};
use crate::controller::backlog::Backlog;
use crate::controller::{self, Settings};
use crate::observe::metrics::Metrics;
use crate::ops::cli::{Cli, Command};
use crate::ops::watchdog;
use crate::ops::{check, confinement_probe};
use crate::reconcile::adoption::{Adoption, CachedFoo};
use crate::reconcile::context::Context;

/// How long a graceful shutdown waits for queued Events to be sent.
const EVENT_FLUSH_GRACE: Duration = Duration::from_secs(5);

/// Why the process ends with a failure: it could not start, or it stopped
/// leading. (A sync's failures are [`crate::reconcile::error::SyncError`]s, retried.)
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),

    /// The Kubernetes client could not be built.
    #[error("cannot build the Kubernetes client: {0}")]
    Client(#[source] kube::Error),

    /// The leader-election timing flags would allow two leaders or a tight
    /// loop; refused at start with client-go's message.
    #[error(
        "invalid leader election timing: {0} (--leader-elect-lease-duration, --leader-elect-renew-deadline, --leader-elect-retry-period)"
    )]
    LeaderTiming(String),

    /// The metrics listener's certificate cannot be read or made.
    #[error("metrics TLS: {0}")]
    Tls(#[from] TlsError),

    /// The shard selector and the Lease name give no valid Lease name.
    #[error("--shard-selector: {0}")]
    Shard(String),

    /// A listener for metrics or probes could not be bound.
    #[error(transparent)]
    Http(#[from] BindError),

    /// `sample-controller check` found faults (it printed them).
    #[error("{0} of the checks failed")]
    CheckFailed(usize),

    /// This replica stopped leading; it exits so that it restarts as a
    /// standby, as client-go and controller-runtime do.
    #[error("lost the lease {lease}: {reason}")]
    LostLease { lease: String, reason: Lost },
}

/// Run the operator until shutdown (returns `Ok`) or lost leadership
/// (returns an error, so the process exits non-zero and is restarted as a
/// standby — as client-go and controller-runtime do).
pub async fn run(cli: Cli) -> Result<(), Error> {
    if let Some(Command::Check { service_account }) = &cli.command {
        return preflight(&cli, service_account.clone()).await;
    }
    if cli.leader_elect {
        check_timing(cli.leader_elect_lease_duration, cli.leader_elect_renew_deadline, cli.leader_elect_retry_period)
            .map_err(|e| Error::LeaderTiming(e.to_string()))?;
    }
    let metrics = Arc::new(Metrics::new());
    let config = client::config(cli.kubeconfig.as_deref(), cli.master.as_ref()).await?;
    let client = client::build(config, metrics.rest_requests.clone()).map_err(Error::Client)?;
    metrics.set_max_workers(cli.workers);
    let readiness = Arc::new(Readiness::default());
    serve_endpoints(&cli, &client, &metrics, &readiness).await?;

    let shard = cli.shard_selector.clone().unwrap_or_default();
    let lease_name = shard.lease_name(&cli.leader_election_id).map_err(Error::Shard);
    let settings = Settings {
        namespace: cli.namespace.clone(),
        workers: cli.workers,
        shard,
        streaming_lists: cli.streaming_lists,
    };
    let (controller, caches, backlog) = controller::build(&client, &settings, metrics.queue.clone());
    let adoption = Arc::new(Adoption::new(client::api(&client, settings.namespace.as_deref()), cli.workers.into()));
    let identity = default_identity(POD_NAME_ENV, "sample-controller");
    let parts = Parts {
        client: client.clone(),
        caches,
        backlog,
        adoption,
        metrics,
        instance: identity.clone(),
        readiness,
        reconcile_timeout: cli.reconcile_timeout,
        memory_limit: cli.memory_limit,
    };
    let namespace = cli.leader_election_namespace.clone().unwrap_or_else(|| client.default_namespace().to_owned());
    let probe = probe_confinement(&cli, &client, &parts.metrics, &namespace, &settings.shard);
    if !cli.leader_elect {
        start_adoption(&parts.caches, &parts.adoption, None);
        let probe = tokio::spawn(probe);
        run_controller(controller, parts, None).await;
        probe.abort();
        return Ok(());
    }
    let timing = (cli.leader_elect_lease_duration, cli.leader_elect_renew_deadline, cli.leader_elect_retry_period);
    let lease = leader_config(lease_name?, &cli.leader_election_id, namespace, identity, timing);
    // The timing was checked above, before connecting to anything.
    let elector = Elector::with_watches(client, lease, Paced).map_err(|e| Error::LeaderTiming(e.to_string()))?;
    lead(controller, parts, elector, probe).await
}

/// The probe of the ServiceAccount's confinement, while this replica
/// writes: in the namespace it watches (where its RBAC lets it create
/// Deployments), else its own (`lease_namespace`, the Lease's).
fn probe_confinement(
    cli: &Cli,
    client: &Client,
    metrics: &Arc<Metrics>,
    lease_namespace: &str,
    shard: &Shard,
) -> impl Future<Output = ()> + Send + 'static {
    let namespace = cli.namespace.clone().unwrap_or_else(|| lease_namespace.to_owned());
    let metrics = metrics.clone();
    let report = move |state: &confinement_probe::State| {
        metrics.set_confinement(state.label(), &confinement_probe::State::LABELS);
    };
    confinement_probe::keep_probing(client.clone(), namespace, shard.clone(), cli.confinement_check_period, report)
}

/// The elector's configuration: the Lease `name` in `namespace`, contended
/// for as `identity` with `(lease duration, renew deadline, retry period)`;
/// its writes under the operator's field manager, its fence the
/// [`LeaderFence`] named `election_id` (`--leader-election-id`, which every
/// shard's Lease is named after: the shards share it), a refused sync
/// retried at least every [`BACKOFF_MAX`].
pub fn leader_config(
    name: String,
    election_id: &str,
    namespace: String,
    identity: String,
    (lease_duration, renew_deadline, retry_period): (Duration, Duration, Duration),
) -> LeaderConfig {
    LeaderConfig::new(name, namespace, identity)
        .with_timing(lease_duration, renew_deadline, retry_period)
        .with_field_manager(client::FIELD_MANAGER)
        .with_fence(Fence::new(ApiResource::erase::<LeaderFence>(&()), election_id))
        .with_retry_cap(BACKOFF_MAX)
}

/// `sample-controller check`: each check's line on stdout; an error if any
/// failed. The Lease is looked for in the ServiceAccount's namespace unless
/// --leader-election-namespace says otherwise.
async fn preflight(cli: &Cli, service_account: (String, String)) -> Result<(), Error> {
    let config = client::config(cli.kubeconfig.as_deref(), cli.master.as_ref()).await?;
    let client = client::build(config.clone(), Default::default()).map_err(Error::Client)?;
    let shard = cli.shard_selector.clone().unwrap_or_default();
    let lease_namespace = cli.leader_election_namespace.clone().unwrap_or_else(|| service_account.0.clone());
    let scope = check::Scope {
        lease: (lease_namespace, shard.lease_name(&cli.leader_election_id).map_err(Error::Shard)?),
        fence: cli.leader_election_id.clone(),
        namespace: cli.namespace.clone(),
        service_account,
        shard,
    };
    let findings = check::run(&client, &config, &scope).await;
    for finding in &findings {
        println!("{finding}");
    }
    match findings.iter().filter(|f| !f.ok).count() {
        0 => Ok(()),
        failed => Err(Error::CheckFailed(failed)),
    }
}

/// The metrics listener (over HTTPS with authentication when
/// `--metrics-secure`) and the probes, each unless disabled.
async fn serve_endpoints(
    cli: &Cli,
    client: &Client,
    metrics: &Arc<Metrics>,
    readiness: &Arc<Readiness>,
) -> Result<(), Error> {
    if let Some(addr) = cli.metrics_bind_address.0 {
        if cli.metrics_secure {
            let tls = endpoints::server_config(cli.metrics_cert_dir.as_deref(), cli.enable_http2)?;
            let auth = Arc::new(MetricsAuth::new(client.clone()));
            let router = endpoints::secure_metrics_router(exposition(metrics), auth, metrics.auth_throttled());
            endpoints::serve_tls(addr, endpoints::METRICS_ENDPOINTS, router, tls).await?;
        } else {
            endpoints::serve(addr, endpoints::METRICS_ENDPOINTS, endpoints::metrics_router(exposition(metrics)))
                .await?;
        }
    }
    if let Some(addr) = cli.health_probe_bind_address.0 {
        endpoints::serve(addr, endpoints::PROBE_ENDPOINTS, endpoints::probes_router(readiness.clone())).await?;
    }
    Ok(())
}

/// What `/metrics` answers: the operator's registry, encoded at each scrape.
fn exposition(metrics: &Arc<Metrics>) -> endpoints::Exposition {
    let metrics = metrics.clone();
    Arc::new(move || metrics.encode())
}

/// A hot standby: the watches and caches run on every replica, and only the
/// syncs wait for the Lease (they do nothing while the fence does not hold).
/// Taking the Lease adopts, then syncs every cached Foo, with no list
/// first, through the backlog (those a change left unobserved first), so
/// that edits made meanwhile overtake them. (controller-runtime's
/// manager, by default, starts its watches only once it leads: its standby
/// lists everything after taking the Lease.)
async fn lead(
    controller: Controller<Foo>,
    parts: Parts,
    mut elector: Elector<Paced>,
    probe: impl Future<Output = ()>,
) -> Result<(), Error> {
    let (metrics, lease) = (parts.metrics.clone(), elector.lease_name().to_owned());
    let (caches, backlog, adoption) = (parts.caches.clone(), parts.backlog.clone(), parts.adoption.clone());
    let gate = elector.gate();
    let mut controller = pin!(run_controller(controller, parts, Some(gate.clone())));
    metrics.set_leader(&lease, false);
    tokio::select! {
        _ = elector.acquire() => {}
        // Shut down while standing by, or just after taking the Lease
        // (claiming the fence): then it is handed over at once.
        _ = &mut controller => {
            elector.release().await;
            return Ok(());
        }
    }
    metrics.set_leader(&lease, true);
    // Once the API server's fence names this replica (at once, unless its
    // claim failed and is retried at the next renewal): adopt, then sync
    // every Foo, and probe the ServiceAccount's confinement. Never ends on
    // its own.
    let start_writing = async {
        gate.held().await;
        start_adoption(&caches, &adoption, Some(gate.clone()));
        backlog.push_all(&caches.foos);
        probe.await;
    };
    let result = tokio::select! {
        // Graceful shutdown: in-flight syncs finished, then hand over.
        _ = &mut controller => {
            elector.release().await;
            Ok(())
        }
        // Dropping the controller future cancels its syncs: a replica that
        // is no longer sure to lead must not write again.
        // Logged once, by main, as the reason for exiting.
        reason = elector.hold() => Err(Error::LostLease { lease: lease.clone(), reason }),
        () = start_writing => unreachable!("it never ends"),
    };
    metrics.set_leader(&lease, false);
    result
}

/// Run the adoption pass in the background once the caches are synced,
/// writing only while `gate` holds; the syncs wait for it to finish.
pub fn start_adoption(caches: &Caches, adoption: &Arc<Adoption>, gate: Option<Arc<WriteGate>>) -> JoinHandle<()> {
    let (caches, adoption) = (caches.clone(), adoption.clone());
    tokio::spawn(async move {
        if !caches.synced().await {
            debug!("a watch ended before its first list; no adoption pass");
            return;
        }
        debug!("caches synced; adoption pass starting");
        let cached_foo = |foo: &ObjectRef<Foo>| {
            let foo = caches.foos.get(foo)?;
            Some(CachedFoo {
                uid: foo.uid()?,
                deployment_name: foo.spec.deployment_name.clone(),
                followed: caches.shard.follow_cached(foo.metadata.labels.as_ref()),
            })
        };
        let writable = || may_write(gate.as_deref());
        adoption.run(cached_foo, writable, |adopted| caches.deployments.wrote(None, Some(adopted))).await;
    })
}

/// What a controller run is made of, besides the controller itself.
struct Parts {
    client: Client,
    caches: Caches,
    /// Where the first syncs wait ([`crate::controller::backlog`]).
    backlog: Arc<Backlog>,
    adoption: Arc<Adoption>,
    metrics: Arc<Metrics>,
    /// The Events' `reportingInstance`.
    instance: String,
    readiness: Arc<Readiness>,
    /// `--reconcile-timeout`.
    reconcile_timeout: Duration,
    /// `--memory-limit`.
    memory_limit: Option<u64>,
}

/// Run the controller until shutdown, reporting readiness once its caches
/// are filled; then send the Events still queued. If the future is dropped
/// instead (lost leadership), queued Events are dropped with it.
async fn run_controller(controller: Controller<Foo>, parts: Parts, gate: Option<Arc<WriteGate>>) {
    let Parts { client, caches, backlog, adoption, metrics, instance, readiness, reconcile_timeout, memory_limit } =
        parts;
    let watchdog = watchdog::spawn(caches.clone(), metrics.clone(), gate.clone(), memory_limit);
    let ctx = Context::new(client, caches.clone(), adoption, metrics, Some(instance), gate);
    let ctx = Arc::new(ctx.with_reconcile_timeout(reconcile_timeout));
    let synced = tokio::spawn(async move {
        if caches.synced().await {
            info!("caches synced");
            readiness.caches_synced();
        }
    });
    controller::run(controller, ctx.clone(), backlog).await;
    synced.abort();
    watchdog.abort();
    ctx.events.flush(EVENT_FLUSH_GRACE).await;
}
