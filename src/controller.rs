//! The kube-runtime wiring: watch Foos and the Deployments they own, read
//! what a sync needs, ask [`decide`] what to do, carry out its plan. No
//! decision is made here — only API calls, events, logs and metrics.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, error, info, warn};

use crate::constants::*;
use crate::decision::{DeploymentAction, Outcome, Plan, decide};
use crate::deployment::{foo_selector, managed_selector};
use crate::foo::Foo;
use crate::metrics::Metrics;
use crate::{Error, Result};

/// Per-object retry delay after a failed sync: upstream's workqueue default,
/// 5 ms doubling up to 1000 s.
pub const BACKOFF_BASE: Duration = Duration::from_millis(5);
pub const BACKOFF_MAX: Duration = Duration::from_secs(1000);

/// Shared by all reconciles.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// Consecutive failures per Foo, for exponential backoff; cleared by the
    /// next successful sync.
    failures: Mutex<HashMap<ObjectRef<Foo>, u32>>,
}

impl Context {
    pub fn new(client: Client, metrics: Arc<Metrics>, instance: Option<String>) -> Self {
        let reporter = Reporter { controller: CONTROLLER_NAME.into(), instance };
        Context { recorder: Recorder::new(client.clone(), reporter), client, metrics, failures: Mutex::default() }
    }

    /// The delay before the next retry of `foo`, counting this failure.
    fn next_backoff(&self, foo: ObjectRef<Foo>) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
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
    /// Foos reconciled at once (upstream's `threadiness`, default 2).
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

/// Build the controller: Foos, and the Deployments labelled as made by it.
/// Its store turns ready once the Foo cache is filled (for `/readyz`).
pub fn build(client: &Client, settings: &Settings) -> Controller<Foo> {
    let foos: Api<Foo> = api(client, settings.namespace.as_deref());
    let deployments: Api<Deployment> = api(client, settings.namespace.as_deref());
    Controller::new(foos, watcher::Config::default())
        // Only our Deployments: upstream's informer caches every Deployment
        // in the cluster. Owned ones are not cached here either — a sync
        // reads the one it needs fresh — so memory grows with Foos alone.
        .owns(deployments, watcher::Config::default().labels(&managed_selector()))
        .with_config(ControllerConfig::default().concurrency(settings.workers))
}

/// Run `controller` until `shutdown` resolves, then let in-flight syncs
/// finish.
pub async fn run(
    controller: Controller<Foo>,
    ctx: Arc<Context>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    controller
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => debug!(foo = %obj, "synced"),
                // Sync failures are logged by error_policy; what is left are
                // watch errors, which the watcher retries by itself.
                Err(kube::runtime::controller::Error::ReconcilerFailed(..)) => {}
                Err(e) => warn!(error = %e, "controller stream"),
            }
        })
        .await;
    info!("controller stopped");
}

/// One sync of one Foo, timed and counted the way controller-runtime does.
pub async fn reconcile(foo: Arc<Foo>, ctx: Arc<Context>) -> Result<Action> {
    let _active = ctx.metrics.worker_started();
    let started = Instant::now();
    let result = sync(&foo, &ctx).await;
    ctx.metrics.observe_reconcile(started.elapsed(), result.as_ref().err());
    if result.is_ok() {
        ctx.reset_backoff(&ObjectRef::from_obj(&*foo));
    }
    result
}

/// Retry a failed sync after a per-object exponential backoff.
pub fn error_policy(foo: Arc<Foo>, err: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.next_backoff(ObjectRef::from_obj(&*foo));
    match err {
        Error::ResourceExists { .. } => warn!(error = %err, retry_in = ?delay, "sync refused"),
        _ => error!(error = %err, retry_in = ?delay, "sync failed"),
    }
    Action::requeue(delay)
}

/// Read, decide, act.
async fn sync(foo: &Foo, ctx: &Context) -> Result<Action> {
    let key = foo_key(foo);
    let ns = foo.namespace().ok_or_else(|| Error::MissingNamespace(foo.name_any()))?;
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    let name = &foo.spec.deployment_name;
    let api_err = |action| api_error(&key, action);

    // Read fresh rather than from a cache, so no write is ever based on a
    // stale copy (a cache of owned Deployments would also cost memory).
    let (current, labelled) = if name.is_empty() {
        (None, Vec::new())
    } else {
        let current = deployments.get_opt(name).await.map_err(api_err("get Deployment"))?;
        // `match_any` lets the API server answer from its watch cache.
        let lp = ListParams::default().labels(&foo_selector(&foo.name_any())).match_any();
        let labelled = deployments.list(&lp).await.map_err(api_err("list Deployments"))?.items;
        (current, labelled)
    };

    let plan = decide(foo, current.as_ref(), &labelled, &Time(Timestamp::now()));
    if plan.writes() {
        info!(foo = %key, plan = %summary(&plan), "syncing");
    }
    execute(foo, &key, &deployments, &plan, ctx).await?;

    match plan.outcome {
        Outcome::Synced => Ok(Action::await_change()),
        Outcome::ResourceExists { deployment } => Err(Error::ResourceExists { foo: key, deployment }),
        Outcome::InvalidSpec => {
            error!(foo = %key, "{MESSAGE_EMPTY_DEPLOYMENT_NAME}");
            // Retrying cannot help; the next edit of the Foo triggers a sync.
            Ok(Action::await_change())
        }
    }
}

/// Carry out a plan: Deployment write, deletions, status, events.
async fn execute(foo: &Foo, key: &str, deployments: &Api<Deployment>, plan: &Plan, ctx: &Context) -> Result<()> {
    let api_err = |action| api_error(key, action);
    let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..PatchParams::default() };

    match &plan.deployment {
        DeploymentAction::None => {}
        DeploymentAction::Create(d) => {
            let pp = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..PostParams::default() };
            // A create, not an apply: if someone made a Deployment of that
            // name since we looked, this fails with AlreadyExists instead of
            // taking it over; the retry then sees it and refuses it.
            deployments.create(&pp, d).await.map_err(api_err("create Deployment"))?;
        }
        DeploymentAction::Scale { name, resource_version, replicas } => {
            // Only `spec.replicas` is written, so fields set by other tools
            // survive (upstream replaces the whole object). The
            // resourceVersion makes it conditional on the object we checked.
            let patch = json!({
                "metadata": { "resourceVersion": resource_version },
                "spec": { "replicas": replicas },
            });
            deployments.patch(name, &params, &Patch::Merge(&patch)).await.map_err(api_err("scale Deployment"))?;
        }
    }

    for stale in &plan.delete {
        let dp = DeleteParams {
            preconditions: Some(Preconditions { uid: stale.uid.clone(), resource_version: None }),
            ..DeleteParams::background()
        };
        match deployments.delete(&stale.name, &dp).await {
            Ok(_) => {}
            // Already gone, or replaced by an object we did not check: leave it.
            Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => {}
            Err(e) => return Err(api_err("delete old Deployment")(e)),
        }
    }

    if let Some(status) = &plan.status {
        let foos: Api<Foo> = Api::namespaced(ctx.client.clone(), &foo.namespace().unwrap_or_default());
        let patch = json!({ "status": status });
        match foos.patch_status(&foo.name_any(), &params, &Patch::Merge(&patch)).await {
            Ok(_) => {}
            // Deleted meanwhile: the garbage collector takes it from here.
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(e) => return Err(api_err("update Foo status")(e)),
        }
    }

    let reference = foo.object_ref(&());
    for ev in &plan.events {
        let event = Event {
            type_: if ev.warning { EventType::Warning } else { EventType::Normal },
            reason: ev.reason.into(),
            note: Some(ev.message.clone()),
            action: ACTION_RECONCILE.into(),
            secondary: None,
        };
        // Events are best effort, as in client-go's recorder: failing to
        // publish one must not fail or repeat the sync.
        if let Err(e) = ctx.recorder.publish(&event, &reference).await {
            warn!(foo = %key, reason = ev.reason, error = %e, "cannot publish event");
        }
    }
    Ok(())
}

/// Wraps a failed API call of a Foo's sync as [`Error::Api`].
fn api_error(foo: &str, action: &'static str) -> impl FnOnce(kube::Error) -> Error + use<> {
    let foo = foo.to_owned();
    move |source| Error::Api { foo, action, source }
}

fn foo_key(foo: &Foo) -> String {
    format!("{}/{}", foo.namespace().unwrap_or_default(), foo.name_any())
}

/// One line for the log: what the plan writes.
fn summary(plan: &Plan) -> String {
    let mut parts = Vec::new();
    match &plan.deployment {
        DeploymentAction::Create(d) => parts.push(format!("create Deployment {}", d.name_any())),
        DeploymentAction::Scale { name, replicas, .. } => parts.push(format!("scale Deployment {name} to {replicas}")),
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
