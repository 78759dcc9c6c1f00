//! The operator process: endpoints, client, leader election, controller and
//! shutdown, put together. `main.rs` only parses flags and calls [`run`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::Shared;
use kube::Client;
use tracing::{error, info};

use crate::cli::{Cli, parse_bind_address};
use crate::controller::{self, Context, Settings};
use crate::http::{self, Readiness};
use crate::leader::{Elector, LeaderConfig, default_identity};
use crate::metrics::Metrics;
use crate::{Error, Result};

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
    let client = Client::try_from(cli.kube_config().await?).map_err(Error::Client)?;
    let metrics = Arc::new(Metrics::new());
    metrics.set_max_workers(cli.workers);
    let readiness = Arc::new(Readiness::default());
    if let Some(addr) = parse_bind_address(&cli.metrics_bind_address)? {
        http::serve(addr, http::metrics_router(metrics.clone())).await?;
    }
    if let Some(addr) = parse_bind_address(&cli.health_probe_bind_address)? {
        http::serve(addr, http::probes_router(readiness.clone())).await?;
    }
    let shutdown = shutdown_signal();
    let settings = Settings { namespace: cli.namespace.clone(), workers: cli.workers };
    let identity = default_identity();
    let ctx = Arc::new(Context::new(client.clone(), metrics.clone(), Some(identity.clone())));

    if !cli.leader_elect {
        run_controller(&client, &settings, ctx, &readiness, shutdown).await;
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
    metrics.set_leader(&lease, false);
    tokio::select! {
        _ = elector.acquire() => {}
        _ = shutdown.clone() => return Ok(()),
    }
    metrics.set_leader(&lease, true);
    let result = tokio::select! {
        // Graceful shutdown: in-flight syncs finished, then hand over.
        _ = run_controller(&client, &settings, ctx, &readiness, shutdown) => {
            elector.release().await;
            Ok(())
        }
        // Dropping the controller future cancels its syncs: a replica that
        // is no longer sure to lead must not write again.
        lost = elector.hold() => {
            error!(lease = %lease, identity = %elector.identity(), ?lost, "leadership lost; exiting");
            Err(Error::Leader(format!("lost the lease {lease}: {lost:?}")))
        }
    };
    metrics.set_leader(&lease, false);
    result
}

/// Start the controller and report readiness once its Foo cache is filled.
async fn run_controller(
    client: &Client,
    settings: &Settings,
    ctx: Arc<Context>,
    readiness: &Arc<Readiness>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let controller = controller::build(client, settings);
    let store = controller.store();
    readiness.controller_starting();
    let readiness = readiness.clone();
    let synced = tokio::spawn(async move {
        // Re-poll rather than wait once: the store's readiness is a oneshot
        // that keeps a single waker, and the controller's own runner, which
        // waits on it too, takes that waker — a lone waiter here would
        // never be woken (kube-runtime 5.0).
        loop {
            match tokio::time::timeout(Duration::from_millis(250), store.wait_until_ready()).await {
                Ok(Ok(())) => {
                    info!("caches synced");
                    readiness.caches_synced();
                    return;
                }
                Ok(Err(_)) => return, // controller gone
                Err(_) => {}
            }
        }
    });
    controller::run(controller, ctx, shutdown).await;
    synced.abort();
}
