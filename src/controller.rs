//! Watches into triggers: Foos and the Deployments they own are watched
//! into caches, and each change becomes a sync of the Foo it concerns, run
//! by kube-runtime's `Controller` ([`crate::sync`] carries a sync out,
//! [`crate::retry`] times a failed one's retry).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::utils::Backoff;
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use tracing::{debug, info};

use crate::Error;
use crate::adoption::Adoption;
use crate::cache::{Cache, trim_deployment, trim_foo};
use crate::deployment::{DeploymentView, managed_selector};
use crate::foo::Foo;
use crate::leader::{Fence, may_write};
use crate::retry::error_policy;
use crate::sync::{Context, reconcile};
use crate::watch::watch;
use crate::workqueue::QueueMetrics;

/// What the controller knows of the cluster, filled by its watches.
#[derive(Clone)]
pub struct Caches {
    pub foos: Arc<Cache<Foo>>,
    /// Only the Deployments labelled as made by this controller.
    pub deployments: Arc<Cache<DeploymentView>>,
    /// Brings the Deployments an earlier controller made into `deployments`.
    pub adoption: Arc<Adoption>,
}

impl Caches {
    /// Resolves once both caches hold their first full list.
    pub async fn synced(&self) {
        self.foos.synced().await;
        self.deployments.synced().await;
    }

    /// Resolves once the caches are synced and the Deployments our Foos
    /// control all carry our label (the adoption pass ran): until then a
    /// Deployment would look missing.
    pub(crate) async fn ready(&self, fence: Option<&Fence>) {
        self.synced().await;
        let foo_uid = |foo: &ObjectRef<Foo>| self.foos.get(foo).and_then(|f| f.uid());
        let may_write = || may_write(fence);
        self.adoption.ensure(foo_uid, may_write, |adopted| self.deployments.wrote(None, Some(adopted))).await;
    }
}

/// What to watch, and how hard to work.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Watch only this namespace; all namespaces when `None`.
    pub namespace: Option<String>,
    /// Foos reconciled at once (upstream's `threadiness`; `--workers`).
    pub workers: u16,
}

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The controller's own backoff over all its triggers: none, as each watch
/// paces itself ([`crate::watch`]); kube-runtime's default would pause every
/// watch for one's errors.
struct EachWatchBacksOff;

impl Iterator for EachWatchBacksOff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(Duration::ZERO)
    }
}

impl Backoff for EachWatchBacksOff {
    fn reset(&mut self) {}
}

/// Build the controller and the caches its syncs read: Foos, and the
/// Deployments labelled as made by it (upstream's informer caches every
/// Deployment in the cluster; other people's never reach this one).
pub fn build(client: &Client, settings: &Settings, queue: Arc<QueueMetrics>) -> (Controller<Foo>, Caches) {
    // Lists in pages of 500 (kube-runtime's default); kube sends no
    // resourceVersion=0 with a page size, so they are consistent reads.
    let foo_watch = watcher::Config::default();
    let deployment_watch = watcher::Config::default().labels(&managed_selector());
    let (foos, foo_writer) = Cache::new(trim_foo);
    let (deployments, deployment_writer) = Cache::new(trim_deployment);
    let foo_events = watch(api::<Foo>(client, settings.namespace.as_deref()), foo_watch);
    let (freed, freed_names) = futures::channel::mpsc::unbounded();
    let deployment_events = watch(api::<DeploymentView>(client, settings.namespace.as_deref()), deployment_watch)
        .inspect(move |event| {
            if let Ok(watcher::Event::Delete(d)) = event {
                let _ = freed.unbounded_send(ObjectRef::from_obj(d));
            }
        });
    // What triggers a sync, counted as the workqueue's adds.
    let (q1, q2, q3) = (queue.clone(), queue.clone(), queue);
    let foo_triggers = foos.reflect(foo_writer, foo_events).applied_objects().inspect(move |foo| {
        if let Ok(foo) = foo {
            q1.added(queue_key(&ObjectRef::from_obj(foo)));
        }
    });
    // Deletions too: a Deployment deleted by hand is put back.
    let owned_triggers =
        deployments.reflect(deployment_writer, deployment_events).touched_objects().inspect(move |d| {
            if let Ok(d) = d {
                owners(d).for_each(|foo| q2.added(queue_key(&foo)));
            }
        });
    let freed_triggers = waiting_for(foos.clone(), freed_names).inspect(move |foo| q3.added(queue_key(foo)));

    let controller = Controller::for_stream(foo_triggers, foos.store())
        .owns_stream(owned_triggers)
        .reconcile_on(freed_triggers)
        .trigger_backoff(EachWatchBacksOff)
        .with_config(ControllerConfig::default().concurrency(settings.workers));
    let adoption = Arc::new(Adoption::new(api(client, settings.namespace.as_deref()), settings.workers.into()));
    (controller, Caches { foos, deployments, adoption })
}

/// The Foos controlling `d` (as kube-runtime maps owned objects to owners).
fn owners(d: &DeploymentView) -> impl Iterator<Item = ObjectRef<Foo>> + '_ {
    d.owner_references()
        .iter()
        .filter(|o| o.controller == Some(true) && o.kind == "Foo")
        .map(|o| ObjectRef::new(&o.name).within(d.namespace().as_deref().unwrap_or_default()))
}

/// A Foo's key in the workqueue metrics: `namespace/name`.
pub(crate) fn queue_key<K: Resource>(obj: &ObjectRef<K>) -> String {
    format!("{}/{}", obj.namespace.as_deref().unwrap_or_default(), obj.name)
}

/// The Foos that name a Deployment of ours which was just deleted: one
/// refused because another Foo held the name can take it now, rather than
/// when its error backoff (up to 1000 s) runs out.
fn waiting_for(
    foos: Arc<Cache<Foo>>,
    freed: impl futures::Stream<Item = ObjectRef<DeploymentView>> + Send + 'static,
) -> impl futures::Stream<Item = ObjectRef<Foo>> + Send + 'static {
    freed.flat_map(move |d| {
        let naming = foos.filter(|f| f.namespace() == d.namespace && f.spec.deployment_name == d.name);
        futures::stream::iter(naming.into_iter().map(|f| ObjectRef::from_obj(&*f)))
    })
}

/// Run `controller` until `shutdown` resolves, then let in-flight syncs
/// finish.
pub async fn run(
    controller: Controller<Foo>,
    ctx: Arc<Context>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let queue = ctx.metrics.queue.clone();
    controller
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|outcome| {
            report(outcome, &queue);
            std::future::ready(())
        })
        .await;
    info!("controller stopped");
}

/// One item of the controller's output stream.
type StreamItem =
    std::result::Result<(ObjectRef<Foo>, Action), kube::runtime::controller::Error<Error, watcher::Error>>;

/// Log what the controller's stream says, at the level it deserves.
fn report(outcome: StreamItem, queue: &QueueMetrics) {
    use kube::runtime::controller::Error as ControllerError;
    match outcome {
        Ok((obj, _)) => debug!(foo = %obj, "synced"),
        // Sync failures are logged by error_policy.
        Err(ControllerError::ReconcilerFailed(..)) => {}
        // A Deployment of a deleted Foo went away (the garbage collector at
        // work): nothing to sync, nothing to report.
        Err(ControllerError::ObjectNotFound(obj)) => {
            queue.forget(&queue_key(&obj));
            debug!(foo = %obj, "Foo deleted");
        }
        // The watches retry by themselves, with backoff.
        Err(e) => info!(error = %e, "watch interrupted; reconnecting"),
    }
}
