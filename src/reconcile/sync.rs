//! Carrying out one sync: read the caches, ask [`decide`] what to do, make
//! the plan's writes, publish its events (its safety nets, deadline, panics
//! and retries: [`crate::reconcile::guard`]). The only decisions here are
//! about requests: a create
//! that finds the name taken reads the Deployment once and asks `decide`
//! again; a delete or status write whose object is already gone is done.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use tracing::{info, warn};

use crate::api::constants::*;
use crate::api::deployment_view::DeploymentView;
use crate::api::foo::Foo;
use crate::api::shard::FollowedLabels;
use crate::api::wire::FooWire;
use crate::cache::by_name;
use crate::client::retry::BACKOFF_BASE;
use crate::client::{apply_params, patch_params, post_params, send_streamed};
use crate::observe::queue_metrics::queue_key;
use crate::reconcile::context::Context;
use crate::reconcile::decision::{
    DeploymentAction, Outcome, Plan, decide, left_the_shard, not_adopted, shard_move_to_confirm,
};
use crate::reconcile::error::{ApiAction, SyncError as Error, SyncResult as Result};
use kube_lease_fence::may_write;

impl Context {
    /// `Err` once this replica may no longer write as the leader, or while
    /// a refusal by the API server's fence is being checked.
    fn gate_open(&self, target: &Target) -> Result<()> {
        let foo = || target.key.clone();
        match self.gate.as_deref() {
            Some(gate) if gate.in_doubt() => Err(Error::FenceInDoubt { foo: foo() }),
            gate if !may_write(gate) => Err(Error::NotLeading { foo: foo() }),
            _ => Ok(()),
        }
    }
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
        Ok(Target { key: queue_key(&ObjectRef::from_obj(foo)), namespace, name })
    }

    fn api_error(&self, action: ApiAction) -> impl FnOnce(kube::Error) -> Error + use<> {
        let foo = self.key.clone();
        move |source| Error::Api { foo, action, source }
    }
}

/// Test builds only (the `test-hooks` feature, which the tests' builds turn
/// on and the release build never has): the sync of a Foo whose name starts
/// with this panics, so a test can show a panic fails that sync alone.
#[cfg(feature = "test-hooks")]
pub const PANICS_IN_SYNC: &str = "test-panics-in-sync-";

/// One sync, in the order of upstream's `syncHandler`: read the Foo, get or
/// create its Deployment (refusing one the Foo does not control), match its
/// replicas, write the Foo's status, record the Event. [`decide`] makes
/// every choice; this makes the writes. An in-sync Foo makes no request.
pub(crate) async fn sync(foo: Arc<Foo>, ctx: &Context) -> Result<Action> {
    // The Foo: the cache's copy, or what the API server returned to our
    // last status write if the cache has not seen it yet.
    let foo = ctx.caches.foos.latest(foo);
    let target = Target::of(&foo)?;
    #[cfg(feature = "test-hooks")]
    assert!(!target.name.starts_with(PANICS_IN_SYNC), "Foo {}: a test asked this sync to panic", target.key);
    // Upstream's Deployments are labelled (adopted) before any sync acts.
    ctx.adoption.finished().await;
    for name in ctx.adoption.take_left_alone(&by_name(&*foo)) {
        ctx.events.publish(not_adopted(&name), foo.object_ref(&()));
    }
    let observed = Observed::from_caches(&foo, &target, ctx);
    let plan = decide(&foo, observed.current.as_deref(), &observed.owned, &observed.followed, &observed.now);
    log_plan(&target, &plan);
    let Some(plan) = get_or_create_deployment(&foo, &target, &observed, plan, ctx).await? else {
        return Ok(Action::requeue(BACKOFF_BASE));
    };
    delete_stale(&target, &observed.deployments, &plan, &observed.owned, ctx).await?;
    write_status(&target, &foo, &plan, ctx).await?;
    if plan.writes()
        && let Some(gate) = &ctx.gate
    {
        gate.admitted();
    }
    record_events(&foo, &plan, ctx);
    finish(target, plan.outcome)
}

/// What a sync reads, all of it from the caches (upstream's listers), and the
/// Deployments' API its writes go to.
struct Observed {
    /// The Deployment the Foo names, if the cache has it.
    current: Option<Arc<DeploymentView>>,
    /// The Deployments the Foo controls, by ownerReference.
    owned: Vec<Arc<DeploymentView>>,
    /// The shard labels the Foo's Deployment must carry.
    followed: FollowedLabels,
    now: Time,
    deployments: Api<Deployment>,
}

impl Observed {
    fn from_caches(foo: &Foo, target: &Target, ctx: &Context) -> Self {
        let name = &foo.spec.deployment_name;
        let current = (!name.is_empty())
            .then(|| ctx.caches.deployments.get(&ObjectRef::new(name).within(&target.namespace)))
            .flatten();
        Observed {
            current,
            owned: foo.uid().map(|uid| ctx.caches.deployments.controlled_by(&uid)).unwrap_or_default(),
            followed: ctx.caches.shard.follow_cached(foo.metadata.labels.as_ref()),
            now: Time(Timestamp::now()),
            deployments: Api::namespaced(ctx.client.clone(), &target.namespace),
        }
    }
}

/// The plan's write to the Deployment the Foo names. A create that finds
/// the name taken by a Deployment the cache lacks (someone else's, without
/// our label, or ours before the watch reported it) reads it once and
/// decides again, as upstream's lister miss does. Returns the plan the rest
/// of the sync carries out, or `None` to start over after a short wait.
async fn get_or_create_deployment(
    foo: &Foo,
    target: &Target,
    observed: &Observed,
    plan: Plan,
    ctx: &Context,
) -> Result<Option<Plan>> {
    let api = &observed.deployments;
    if write_deployment(target, api, &plan.deployment, observed.current.as_deref(), ctx).await? == DeploymentWrite::Done
    {
        return Ok(Some(plan));
    }
    let existing = api
        .get_opt(&foo.spec.deployment_name)
        .await
        .map_err(target.api_error(ApiAction::GetDeployment))?
        .map(DeploymentView::from);
    let followed = &observed.followed;
    if existing.as_ref().is_some_and(|d| shard_move_to_confirm(foo, d, followed)) {
        let fresh = read_afresh(target, ctx).await?;
        if left_the_shard(foo, fresh.as_ref(), &ctx.caches.shard, followed) {
            // Our watch is about to say so; moving the Deployment back
            // would undo the new shard's work.
            return Ok(None);
        }
    }
    let plan = decide(foo, existing.as_ref(), &observed.owned, followed, &observed.now);
    log_plan(target, &plan);
    match write_deployment(target, api, &plan.deployment, existing.as_ref(), ctx).await? {
        DeploymentWrite::Done => Ok(Some(plan)),
        // Deleted again in between: start over.
        DeploymentWrite::NameTaken => Ok(None),
    }
}

/// Queue the plan's Events; a background task sends them (events.rs).
fn record_events(foo: &Foo, plan: &Plan, ctx: &Context) {
    for ev in &plan.events {
        ctx.events.publish(ev.clone(), foo.object_ref(&()));
    }
}

/// How the sync ends: done until the next change, retried with backoff, or
/// (an invalid spec) not retried, since only an edit can help.
fn finish(target: Target, outcome: Outcome) -> Result<Action> {
    match outcome {
        Outcome::Synced => Ok(Action::await_change()),
        Outcome::ResourceExists { deployment } => Err(Error::ResourceExists { foo: target.key, deployment }),
        Outcome::InvalidSpec => {
            warn!(foo = %target.key, "{MESSAGE_EMPTY_DEPLOYMENT_NAME}");
            Ok(Action::await_change())
        }
    }
}

/// The Foo as the API server has it now, to confirm a shard move
/// ([`shard_move_to_confirm`]): a LIST narrowed to its name, which the
/// operator's ClusterRole grants (a GET it does not: nothing else reads a
/// single Foo).
async fn read_afresh(target: &Target, ctx: &Context) -> Result<Option<Foo>> {
    let foos: Api<Foo> = Api::namespaced(ctx.client.clone(), &target.namespace);
    let by_name = ListParams::default().fields(&format!("metadata.name={}", target.name));
    let listed = foos.list(&by_name).await.map_err(target.api_error(ApiAction::ListFoo))?;
    Ok(listed.items.into_iter().next())
}

fn log_plan(target: &Target, plan: &Plan) {
    if plan.writes() {
        info!(foo = %target.key, plan = %summary(plan), "syncing");
    }
}

/// How the Deployment write went.
#[derive(Debug, PartialEq)]
enum DeploymentWrite {
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
) -> Result<DeploymentWrite> {
    if *action != DeploymentAction::Keep {
        ctx.gate_open(target)?;
    }
    let written = match action {
        DeploymentAction::Keep => return Ok(DeploymentWrite::Done),
        DeploymentAction::Create(d) => {
            // A create, not an apply: a Deployment of that name that we do
            // not know is never taken over.
            match api.create(&post_params(), d).await {
                Ok(created) => created,
                Err(kube::Error::Api(s)) if s.is_already_exists() => return Ok(DeploymentWrite::NameTaken),
                Err(e) => return Err(target.api_error(ApiAction::CreateDeployment)(e)),
            }
        }
        DeploymentAction::Patch(patch) => {
            // Only what differs is written, so fields set by other tools
            // survive (upstream replaces the whole object). The uid and
            // resourceVersion make it conditional on the object we checked:
            // if the cache was behind, this is a conflict and a retry.
            api.patch(&patch.name, &patch_params(), &Patch::Merge(patch.body()))
                .await
                .map_err(target.api_error(ApiAction::PatchDeployment))?
        }
    };
    ctx.caches.deployments.wrote(current, Some(written.into()));
    Ok(DeploymentWrite::Done)
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
        ctx.gate_open(target)?;
        let dp = DeleteParams {
            preconditions: Some(Preconditions { uid: stale.uid.clone(), resource_version: None }),
            ..DeleteParams::background()
        };
        match api.delete(&stale.name, &dp).await {
            Ok(_) => {}
            // Already gone, or replaced by an object we did not check: leave it.
            Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => {}
            Err(e) => return Err(target.api_error(ApiAction::DeleteOldDeployment)(e)),
        }
        if let Some(before) = owned.iter().find(|d| d.name_any() == stale.name) {
            ctx.caches.deployments.wrote(Some(before), None);
        }
    }
    Ok(())
}

/// Write the plan's status, if any, through the status subresource, by
/// server-side apply: only the fields this controller owns are sent, so a
/// condition another writer added since our cache saw the Foo stays (a
/// merge patch would replace the `conditions` list whole).
async fn write_status(target: &Target, foo: &Foo, plan: &Plan, ctx: &Context) -> Result<()> {
    let Some(status) = &plan.status else { return Ok(()) };
    ctx.gate_open(target)?;
    let foos: Api<Foo> = Api::namespaced(ctx.client.clone(), &target.namespace);
    let patch = Foo::status_apply(&target.name, status.owned_by_controller());
    // The response is the whole Foo, whatever its users put in it: decoded
    // as the cache keeps it (`wire`), never held whole.
    let request = kube::core::Request::new(foos.resource_url())
        .patch_subresource("status", &target.name, &apply_params(), &Patch::Apply(&patch))
        .map_err(|e| target.api_error(ApiAction::ApplyFooStatus)(kube::Error::BuildRequest(e)))?;
    match send_streamed::<FooWire>(&ctx.client, request).await {
        Ok(updated) => ctx.caches.foos.wrote(Some(foo), Some(updated.into())),
        // Deleted meanwhile: the garbage collector takes it from here.
        Err(kube::Error::Api(s)) if s.is_not_found() => {}
        Err(e) => return Err(target.api_error(ApiAction::ApplyFooStatus)(e)),
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
            if !p.relabel.is_empty() {
                parts.push(format!("move Deployment {} into this shard", p.name));
            }
            if let Some(replicas) = p.replicas {
                parts.push(format!("scale Deployment {} to {replicas}", p.name));
            }
        }
        DeploymentAction::Keep => {}
    }
    parts.extend(plan.delete.iter().map(|s| format!("delete Deployment {}", s.name)));
    if plan.status.is_some() {
        parts.push("apply status".into());
    }
    parts.join(", ")
}
