//! A kube-runtime `Controller` run under the elector. Of several replicas,
//! one leads: it stamps each ConfigMap labelled `example=leader-controller`
//! in its namespace with its own name (`data.leader`), checking the write
//! gate before each write. It stops on the loss of leadership (exit 1: a
//! restart stands again, as with client-go's `OnStoppedLeading`) and
//! releases the Lease on SIGTERM, so that a standby takes over at once.
//!
//! ```text
//! cargo run -p kube-lease-fence --example leader_controller -- <namespace> <identity>
//! ```
//!
//! `LEASE_SECONDS` sets the lease duration (15 by default); the renew
//! deadline is two thirds of it, the retry period a sixth. Its RBAC: get,
//! list, watch, create and update on `leases` (coordination.k8s.io), and
//! get, list, watch and patch on `configmaps`, in the namespace.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Client, Config, ResourceExt};
use kube_lease_fence::{Elector, LeaderConfig, WriteGate};
use tokio::signal::unix::{SignalKind, signal};

const USAGE: &str = "usage: leader_controller <namespace> <identity>";
/// The ConfigMaps this controller stamps.
const SELECTOR: &str = "example=leader-controller";

struct Ctx {
    api: Api<ConfigMap>,
    gate: Arc<WriteGate>,
    identity: String,
}

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("not the Lease holder: no write")]
    NotLeading,
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    if cm.data.as_ref().and_then(|d| d.get("leader")) == Some(&ctx.identity) {
        return Ok(Action::await_change());
    }
    // Before each write: a replica whose Lease may have passed to another
    // writes nothing, even while its controller still runs.
    if !ctx.gate.holds() {
        return Err(Error::NotLeading);
    }
    let stamp = serde_json::json!({ "apiVersion": "v1", "kind": "ConfigMap", "data": { "leader": ctx.identity } });
    let params = PatchParams::apply("leader-controller").force();
    ctx.api.patch(&cm.name_any(), &params, &Patch::Apply(&stamp)).await?;
    Ok(Action::await_change())
}

fn error_policy(cm: Arc<ConfigMap>, error: &Error, _: Arc<Ctx>) -> Action {
    tracing::warn!(configmap = %cm.name_any(), %error, "sync failed; retrying in 1 s");
    Action::requeue(Duration::from_secs(1))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_max_level(tracing::Level::INFO).init();
    let mut args = std::env::args().skip(1);
    let (namespace, identity) = (args.next().ok_or(USAGE)?, args.next().ok_or(USAGE)?);
    let lease = Duration::from_secs(std::env::var("LEASE_SECONDS").map_or(Ok(15), |s| s.parse())?);

    let mut config = Config::infer().await?;
    // The API server's audit log tells the replicas apart by it.
    config.headers.push((http::header::USER_AGENT, format!("leader-controller/{identity}").parse()?));
    let client = Client::try_from(config)?;
    let cfg =
        LeaderConfig::new("leader-controller", &namespace, &identity).with_timing(lease, lease * 2 / 3, lease / 6);
    let leadership = Elector::new(client.clone(), cfg)?.run();
    let mut leading = leadership.leading();
    let mut sigterm = signal(SignalKind::terminate())?;

    tokio::select! {
        led = leading.wait_for(|l| *l) => { led?; }
        _ = sigterm.recv() => {
            leadership.stop().await;
            return Ok(());
        }
    }
    tracing::info!(%identity, "leading: the controller starts");
    let api = Api::namespaced(client, &namespace);
    let ctx = Arc::new(Ctx { api: api.clone(), gate: leadership.gate(), identity });
    let controller = Controller::new(api, watcher::Config::default().labels(SELECTOR))
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {});
    tokio::select! {
        () = controller => {}
        _ = leading.wait_for(|l| !*l) => {
            let lost = leadership.stop().await;
            tracing::error!(?lost, "stopped leading; exiting");
            std::process::exit(1);
        }
        _ = sigterm.recv() => {}
    }
    // The gate is shut before the Lease is released: no write after.
    leadership.stop().await;
    Ok(())
}
