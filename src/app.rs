//! The operator process: endpoints, client, leader election, controller and
//! shutdown, put together. `main.rs` only parses flags and calls [`run`].

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::Shared;
use kube::Client;
use kube::runtime::Controller;
use tracing::info;

use crate::cli::Cli;
use crate::client;
use crate::controller::{self, Caches, Settings};
use crate::foo::Foo;
use crate::http::{self, Readiness};
use crate::leader::{Elector, Fence, LeaderConfig, check_timing, default_identity};
use crate::metrics::Metrics;
use crate::metrics_auth::MetricsAuth;
use crate::sync::Context;
use crate::tls;
use crate::{Error, Result};

/// How long a graceful shutdown waits for queued Events to be sent.
const EVENT_FLUSH_GRACE: Duration = Duration::from_secs(5);

/// A future that resolves once SIGTERM or SIGINT arrives; cloneable.
pub type Shutdown = Shared<futures::future::BoxFuture<'static, ()>>;

/// Resolves on the first SIGTERM/SIGINT; a second one exits at once.
pub fn shutdown_signal() -> Shutdown {
    let (tx, rx) = futures::channel::oneshot::channel::<()>();
    tokio::spawn(async move {
        wait_for_signal().await;
        info!("shutdown requested; finishing in-flight syncs (signal again to exit at once)");
        let _ = tx.send(());
        wait_for_signal().await;
        std::process::exit(130);
    });
    rx.map(|_| ()).boxed().shared()
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            },
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Run the operator until shutdown (returns `Ok`) or lost leadership
/// (returns an error, so the process exits non-zero and is restarted as a
/// standby — as client-go and controller-runtime do).
pub async fn run(cli: Cli) -> Result<()> {
    if cli.leader_elect {
        check_timing(cli.leader_elect_lease_duration, cli.leader_elect_renew_deadline, cli.leader_elect_retry_period)
            .map_err(Error::LeaderTiming)?;
    }
    let metrics = Arc::new(Metrics::new());
    let client = client::build(cli.kube_config().await?, metrics.rest_requests.clone())?;
    metrics.set_max_workers(cli.workers);
    let readiness = Arc::new(Readiness::default());
    if let Some(addr) = cli.metrics_bind_address.0 {
        if cli.metrics_secure {
            let tls = tls::server_config(cli.metrics_cert_dir.as_deref(), cli.enable_http2)?;
            let router = http::secure_metrics_router(metrics.clone(), Arc::new(MetricsAuth::new(client.clone())));
            http::serve_tls(addr, http::METRICS_ENDPOINTS, router, tls, cli.enable_http2).await?;
        } else {
            http::serve(addr, http::METRICS_ENDPOINTS, http::metrics_router(metrics.clone())).await?;
        }
    }
    if let Some(addr) = cli.health_probe_bind_address.0 {
        http::serve(addr, http::PROBE_ENDPOINTS, http::probes_router(readiness.clone())).await?;
    }
    let shutdown = shutdown_signal();
    let settings = Settings { namespace: cli.namespace.clone(), workers: cli.workers };
    let identity = default_identity();
    let (controller, caches) = controller::build(&client, &settings, metrics.queue.clone());
    let parts =
        Parts { client: &client, caches, metrics: &metrics, instance: Some(identity.clone()), readiness: &readiness };

    if !cli.leader_elect {
        run_controller(controller, parts, None, shutdown).await;
        return Ok(());
    }

    let lease = cli.leader_election_id.clone();
    let mut elector = Elector::new(
        client.clone(),
        LeaderConfig {
            lease_name: lease.clone(),
            namespace: cli.lease_namespace(),
            identity,
            lease_duration: cli.leader_elect_lease_duration,
            renew_deadline: cli.leader_elect_renew_deadline,
            retry_period: cli.leader_elect_retry_period,
        },
    );
    // A hot standby, as controller-runtime's manager: the watches and caches
    // run on every replica, and only the syncs wait for the Lease (they do
    // nothing while the fence does not hold). Taking the Lease syncs every
    // cached Foo at once, with no list first.
    let (took_lease, on_took_lease) = futures::channel::mpsc::unbounded();
    let controller = controller.reconcile_all_on(on_took_lease);
    let mut controller = pin!(run_controller(controller, parts, Some(elector.fence()), shutdown));
    metrics.set_leader(&lease, false);
    tokio::select! {
        _ = elector.acquire() => {}
        // Shut down while standing by.
        _ = &mut controller => return Ok(()),
    }
    metrics.set_leader(&lease, true);
    let _ = took_lease.unbounded_send(());
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
    };
    metrics.set_leader(&lease, false);
    result
}

/// What a controller run is made of, besides the controller itself.
struct Parts<'a> {
    client: &'a Client,
    caches: Caches,
    metrics: &'a Arc<Metrics>,
    /// The Events' `reportingInstance`.
    instance: Option<String>,
    readiness: &'a Arc<Readiness>,
}

/// Run the controller until `shutdown`, reporting readiness once its caches
/// are filled; then send the Events still queued. If the future is dropped
/// instead (lost leadership), queued Events are dropped with it.
async fn run_controller(
    controller: Controller<Foo>,
    parts: Parts<'_>,
    fence: Option<Arc<Fence>>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let Parts { client, caches, metrics, instance, readiness } = parts;
    let ctx = Arc::new(Context::new(client.clone(), caches.clone(), metrics.clone(), instance, fence));
    let readiness = readiness.clone();
    let synced = tokio::spawn(async move {
        caches.synced().await;
        info!("caches synced");
        readiness.caches_synced();
    });
    controller::run(controller, ctx.clone(), shutdown).await;
    synced.abort();
    ctx.events.flush(EVENT_FLUSH_GRACE).await;
}
