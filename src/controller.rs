//! The kube-runtime wiring: watch Foos and the Deployments they own into
//! caches, ask [`decide`] what a sync does, carry out its plan. No decision
//! is made here — only cache reads, API writes, events, logs and metrics.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, ExponentialBackoff};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, error, info, warn};

use crate::adoption::Adoption;
use crate::cache::{Cache, relisting_watcher, trim_deployment, trim_foo};
use crate::constants::*;
use crate::decision::{DeploymentAction, Outcome, Plan, decide};
use crate::deployment::{DeploymentView, managed_selector};
use crate::events::Publisher;
use crate::foo::Foo;
use crate::leader::{Fence, may_write};
use crate::metrics::Metrics;
use crate::workqueue::Workqueue;
use crate::{Error, Result};

/// Per-object retry delay after a failed sync: upstream's workqueue default,
/// 5 ms doubling up to 1000 s.
pub const BACKOFF_BASE: Duration = Duration::from_millis(5);
pub const BACKOFF_MAX: Duration = Duration::from_secs(1000);

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
    async fn ready(&self, fence: Option<&Fence>) {
        self.synced().await;
        let foo_uid = |foo: &ObjectRef<Foo>| self.foos.get(foo).and_then(|f| f.uid());
        let may_write = || may_write(fence);
        self.adoption.ensure(foo_uid, may_write, |adopted| self.deployments.wrote(None, Some(adopted))).await;
    }
}

/// Shared by all reconciles.
pub struct Context {
    pub client: Client,
    pub caches: Caches,
    pub events: Publisher,
    pub metrics: Arc<Metrics>,
    /// Under leader election: whether this replica may still write.
    fence: Option<Arc<Fence>>,
    /// Consecutive failures per Foo, for exponential backoff; cleared by the
    /// next successful sync.
    failures: Mutex<HashMap<ObjectRef<Foo>, u32>>,
}

impl Context {
    /// `instance` is the Events' `reportingInstance`; a `fence`, under
    /// leader election, is checked before every write.
    pub fn new(
        client: Client,
        caches: Caches,
        metrics: Arc<Metrics>,
        instance: Option<String>,
        fence: Option<Arc<Fence>>,
    ) -> Self {
        let events = Publisher::start(client.clone(), instance, fence.clone());
        Context { client, caches, events, metrics, fence, failures: Mutex::default() }
    }

    /// `Err` once this replica may no longer write as the leader.
    fn may_write(&self, target: &Target) -> Result<()> {
        if may_write(self.fence.as_deref()) { Ok(()) } else { Err(Error::NotLeading { foo: target.key.clone() }) }
    }

    /// The delay before the next retry of `foo`, counting this failure.
    fn next_backoff(&self, foo: ObjectRef<Foo>) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if !failures.contains_key(&foo) {
            // Forget Foos deleted while failing, so the map stays as small as
            // the set of failing Foos.
            failures.retain(|f, _| self.caches.foos.get(f).is_some());
        }
        let n = failures.entry(foo).or_insert(0);
        let delay = backoff_delay(*n);
        *n = n.saturating_add(1);
        delay
    }

    fn reset_backoff(&self, foo: &ObjectRef<Foo>) {
        self.failures.lock().unwrap_or_else(|e| e.into_inner()).remove(foo);
    }
}

/// `BACKOFF_BASE * 2^failures`, capped at `BACKOFF_MAX`.
pub fn backoff_delay(failures: u32) -> Duration {
    BACKOFF_BASE.checked_mul(1u32.checked_shl(failures).unwrap_or(u32::MAX)).map_or(BACKOFF_MAX, |d| d.min(BACKOFF_MAX))
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

/// Reconnect delay of each watch after an error: 100 ms doubling to
/// 500 ms, each with up to as much again of random jitter; back to 100 ms
/// after any success (kube-runtime's `StreamBackoff` resets it). A returning
/// API server is noticed within a second; one that stays down sees about one
/// attempt a second per watch, spread out by the jitter. kube-runtime's
/// default (client-go's reflector: 800 ms doubling to 30 s, applied to all
/// watches together, so each watch's errors also paused the others) left the
/// controller idle for up to 30 s after an outage.
pub fn watch_backoff() -> ExponentialBackoff {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_millis(500))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .into()
}

/// The controller's own backoff over all its triggers: none, as each watch
/// backs off by itself.
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
pub fn build(client: &Client, settings: &Settings, queue: Arc<Workqueue>) -> (Controller<Foo>, Caches) {
    // Lists in pages of 500 (kube-runtime's default); kube sends no
    // resourceVersion=0 with a page size, so they are consistent reads.
    let foo_watch = watcher::Config::default();
    let deployment_watch = watcher::Config::default().labels(&managed_selector());
    let (foos, foo_writer) = Cache::new(trim_foo);
    let (deployments, deployment_writer) = Cache::new(trim_deployment);
    let foo_events =
        relisting_watcher(api::<Foo>(client, settings.namespace.as_deref()), foo_watch).backoff(watch_backoff());
    let (freed, freed_names) = futures::channel::mpsc::unbounded();
    let deployment_events =
        relisting_watcher(api::<DeploymentView>(client, settings.namespace.as_deref()), deployment_watch)
            .backoff(watch_backoff())
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
fn queue_key<K: Resource>(obj: &ObjectRef<K>) -> String {
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
fn report(outcome: StreamItem, queue: &Workqueue) {
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

/// One sync of one Foo, timed and counted the way controller-runtime does.
pub async fn reconcile(foo: Arc<Foo>, ctx: Arc<Context>) -> Result<Action> {
    if !may_write(ctx.fence.as_deref()) {
        // A standby (or a leader past its renew deadline): nothing to do
        // until it takes the Lease, which syncs every Foo.
        return Ok(Action::await_change());
    }
    let obj = ObjectRef::from_obj(&*foo);
    let _active = ctx.metrics.worker_started();
    let _working = ctx.metrics.queue.started(&queue_key(&obj));
    let started = Instant::now();
    let result = sync(foo, &ctx).await;
    ctx.metrics.observe_reconcile(started.elapsed(), result.as_ref());
    if result.is_ok() {
        ctx.reset_backoff(&obj);
    }
    result
}

/// Retry a failed sync after a per-object exponential backoff.
pub fn error_policy(foo: Arc<Foo>, err: &Error, ctx: Arc<Context>) -> Action {
    let obj = ObjectRef::from_obj(&*foo);
    let delay = ctx.next_backoff(obj.clone());
    ctx.metrics.queue.retried(queue_key(&obj), delay);
    match err {
        Error::ResourceExists { .. } => warn!(error = %err, retry_in = ?delay, "sync refused"),
        // Our cached copy was behind; the retry reads the newer one.
        e if e.is_conflict() => info!(error = %err, retry_in = ?delay, "object changed since cached; retrying"),
        _ => error!(error = %err, retry_in = ?delay, "sync failed"),
    }
    Action::requeue(delay)
}

/// Which Foo a sync is about, worked out once.
struct Target {
    namespace: String,
    name: String,
    /// `namespace/name`, for logs and errors.
    key: String,
}

impl Target {
    fn of(foo: &Foo) -> Result<Self> {
        let name = foo.name_any();
        let namespace = foo.namespace().ok_or_else(|| Error::MissingNamespace(name.clone()))?;
        Ok(Target { key: format!("{namespace}/{name}"), namespace, name })
    }

    fn api_error(&self, action: &'static str) -> impl FnOnce(kube::Error) -> Error + use<> {
        let foo = self.key.clone();
        move |source| Error::Api { foo, action, source }
    }
}

/// Read the caches, decide, act. An in-sync Foo makes no request.
async fn sync(foo: Arc<Foo>, ctx: &Context) -> Result<Action> {
    // If the cache has not yet seen our last status write, use what it returned.
    let foo = ctx.caches.foos.latest(foo);
    let target = Target::of(&foo)?;
    ctx.caches.ready(ctx.fence.as_deref()).await;
    let name = &foo.spec.deployment_name;
    let current = (!name.is_empty())
        .then(|| ctx.caches.deployments.get(&ObjectRef::new(name).within(&target.namespace)))
        .flatten();
    let owned = foo.uid().map(|uid| ctx.caches.deployments.controlled_by(&uid)).unwrap_or_default();
    let now = Time(Timestamp::now());
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &target.namespace);

    let mut plan = decide(&foo, current.as_deref(), &owned, &now);
    log_plan(&target, &plan);
    if write_deployment(&target, &deployments, &plan.deployment, current.as_deref(), ctx).await? == Written::NameTaken {
        // Not in our cache, yet there: someone else's (without our label),
        // or ours before the watch reported it. Read it once, decide again.
        let existing =
            deployments.get_opt(name).await.map_err(target.api_error("get Deployment"))?.map(DeploymentView::from);
        plan = decide(&foo, existing.as_ref(), &owned, &now);
        log_plan(&target, &plan);
        if write_deployment(&target, &deployments, &plan.deployment, existing.as_ref(), ctx).await? != Written::Done {
            // Deleted again in between: start over.
            return Ok(Action::requeue(BACKOFF_BASE));
        }
    }
    delete_stale(&target, &deployments, &plan, &owned, ctx).await?;
    write_status(&target, &foo, &plan, ctx).await?;
    for ev in &plan.events {
        ctx.events.publish(ev.clone(), foo.object_ref(&()));
    }

    match plan.outcome {
        Outcome::Synced => Ok(Action::await_change()),
        Outcome::ResourceExists { deployment } => Err(Error::ResourceExists { foo: target.key, deployment }),
        Outcome::InvalidSpec => {
            warn!(foo = %target.key, "{MESSAGE_EMPTY_DEPLOYMENT_NAME}");
            // Retrying cannot help; the next edit of the Foo triggers a sync.
            Ok(Action::await_change())
        }
    }
}

fn log_plan(target: &Target, plan: &Plan) {
    if plan.writes() {
        info!(foo = %target.key, plan = %summary(plan), "syncing");
    }
}

/// Every patch's parameters: our field manager.
pub(crate) fn field_manager() -> PatchParams {
    PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..PatchParams::default() }
}

/// How the Deployment write went.
#[derive(Debug, PartialEq)]
enum Written {
    Done,
    /// A create found a Deployment of that name that the cache lacks.
    NameTaken,
}

/// The plan's one write to the Deployment named by the Foo, recorded in the
/// cache so the syncs it triggers do not repeat it.
async fn write_deployment(
    target: &Target,
    api: &Api<Deployment>,
    action: &DeploymentAction,
    current: Option<&DeploymentView>,
    ctx: &Context,
) -> Result<Written> {
    if *action != DeploymentAction::None {
        ctx.may_write(target)?;
    }
    let written = match action {
        DeploymentAction::None => return Ok(Written::Done),
        DeploymentAction::Create(d) => {
            let pp = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..PostParams::default() };
            // A create, not an apply: a Deployment of that name that we do
            // not know is never taken over.
            match api.create(&pp, d).await {
                Ok(created) => created,
                Err(kube::Error::Api(s)) if s.is_already_exists() => return Ok(Written::NameTaken),
                Err(e) => return Err(target.api_error("create Deployment")(e)),
            }
        }
        DeploymentAction::Patch(patch) => {
            // Only what differs is written, so fields set by other tools
            // survive (upstream replaces the whole object). The uid and
            // resourceVersion make it conditional on the object we checked:
            // if the cache was behind, this is a conflict and a retry.
            api.patch(&patch.name, &field_manager(), &Patch::Merge(patch.body()))
                .await
                .map_err(target.api_error("patch Deployment"))?
        }
    };
    ctx.caches.deployments.wrote(current, Some(written.into()));
    Ok(Written::Done)
}

/// Delete the Deployments the Foo controlled under a former name.
async fn delete_stale(
    target: &Target,
    api: &Api<Deployment>,
    plan: &Plan,
    owned: &[Arc<DeploymentView>],
    ctx: &Context,
) -> Result<()> {
    for stale in &plan.delete {
        ctx.may_write(target)?;
        let dp = DeleteParams {
            preconditions: Some(Preconditions { uid: stale.uid.clone(), resource_version: None }),
            ..DeleteParams::background()
        };
        match api.delete(&stale.name, &dp).await {
            Ok(_) => {}
            // Already gone, or replaced by an object we did not check: leave it.
            Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => {}
            Err(e) => return Err(target.api_error("delete old Deployment")(e)),
        }
        if let Some(before) = owned.iter().find(|d| d.name_any() == stale.name) {
            ctx.caches.deployments.wrote(Some(before), None);
        }
    }
    Ok(())
}

/// Write the plan's status, if any, through the status subresource.
async fn write_status(target: &Target, foo: &Foo, plan: &Plan, ctx: &Context) -> Result<()> {
    let Some(status) = &plan.status else { return Ok(()) };
    ctx.may_write(target)?;
    let foos: Api<Foo> = Api::namespaced(ctx.client.clone(), &target.namespace);
    let patch = json!({ "status": status });
    match foos.patch_status(&target.name, &field_manager(), &Patch::Merge(&patch)).await {
        Ok(updated) => ctx.caches.foos.wrote(Some(foo), Some(updated)),
        // Deleted meanwhile: the garbage collector takes it from here.
        Err(kube::Error::Api(s)) if s.is_not_found() => {}
        Err(e) => return Err(target.api_error("update Foo status")(e)),
    }
    Ok(())
}

/// One line for the log: what the plan writes.
fn summary(plan: &Plan) -> String {
    let mut parts = Vec::new();
    match &plan.deployment {
        DeploymentAction::Create(d) => parts.push(format!("create Deployment {}", d.name_any())),
        DeploymentAction::Patch(p) => {
            if p.adopt {
                parts.push(format!("adopt Deployment {}", p.name));
            }
            if let Some(replicas) = p.replicas {
                parts.push(format!("scale Deployment {} to {replicas}", p.name));
            }
        }
        DeploymentAction::None => {}
    }
    parts.extend(plan.delete.iter().map(|s| format!("delete Deployment {}", s.name)));
    if plan.status.is_some() {
        parts.push("update status".into());
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_5ms_and_caps_at_1000s() {
        assert_eq!(backoff_delay(0), Duration::from_millis(5));
        assert_eq!(backoff_delay(1), Duration::from_millis(10));
        assert_eq!(backoff_delay(10), Duration::from_millis(5 * 1024));
        assert_eq!(backoff_delay(18), Duration::from_secs(1000));
        assert_eq!(backoff_delay(40), Duration::from_secs(1000));
        assert_eq!(backoff_delay(u32::MAX), Duration::from_secs(1000));
    }
}
