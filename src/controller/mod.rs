//! Watches into triggers: Foos and the Deployments they own are watched
//! into caches, and each change ([`triggers`]) becomes a sync of the Foo it
//! concerns, run by kube-runtime's `Controller` ([`crate::reconcile::sync`]
//! carries a sync out).

pub(crate) mod backlog;
pub(crate) mod triggers;

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kube::Client;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::utils::Backoff;
use kube::runtime::watcher;
use tracing::{debug, info};

use crate::api::deployment::{controlling_foo, managed_selector};
use crate::api::deployment_view::DeploymentView;
use crate::api::foo::Foo;
use crate::api::shard::Shard;
use crate::api::wire::{FooWire, foo_event};
use crate::cache::{Caches, DeploymentCache, FooCache, by_name, trim_deployment, trim_foo};
use crate::client::api;
use crate::client::lists::decoding_lists;
use crate::client::watch::watch;
use crate::controller::backlog::{Backlog, Lane};
use crate::controller::triggers::{changed_deployments, changed_foos, waiting_for};
use crate::observe::queue_metrics::{QueueMetrics, queue_key};
use crate::reconcile::context::Context;
use crate::reconcile::error::SyncError;
use crate::reconcile::guard::{error_policy, reconcile};

/// What to watch, and how hard to work.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Watch only this namespace; all namespaces when `None`.
    pub namespace: Option<String>,
    /// Foos reconciled at once (upstream's `threadiness`; `--workers`).
    pub workers: u16,
    /// The Foos this instance owns (`--shard-selector`), and with them the
    /// Deployments that follow them.
    pub shard: Shard,
    /// Fill the caches by streaming lists (`--streaming-lists`): a watch that
    /// starts with every object (`sendInitialEvents`), not a paged LIST.
    pub streaming_lists: bool,
}

/// The controller's own backoff over all its triggers: none, as each watch
/// paces itself ([`crate::client::watch`]); kube-runtime's default would pause every
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

/// Put the Foo `foo` names in `backlog`, by `lane`; the Controller hears of
/// it when the backlog lets it in, so its trigger stream gets nothing.
fn wait<T>(backlog: &Backlog, foo: ObjectRef<Foo>, lane: Lane) -> Option<T> {
    backlog.push(foo, lane);
    None
}

/// Build the controller, the caches its syncs read, and the backlog every
/// sync waits in (see [`crate::controller::backlog`]; taking the Lease fills
/// it too). Only the Deployments labelled as made by this controller are
/// watched: upstream's informer caches every Deployment in the cluster;
/// other people's never reach this one.
pub fn build(
    client: &Client,
    settings: &Settings,
    queue: Arc<QueueMetrics>,
) -> (Controller<Foo>, Caches, Arc<Backlog>) {
    // Paged lists come in pages of 500 (kube-runtime's default); kube sends
    // no resourceVersion=0 with a page size, so they are consistent reads.
    let base = if settings.streaming_lists {
        watcher::Config::default().streaming_lists()
    } else {
        watcher::Config::default()
    };
    let shard = &settings.shard;
    let foo_watch = match shard.selector() {
        Some(selector) => base.clone().labels(&selector),
        None => base.clone(),
    };
    let deployment_watch = base.labels(&shard.narrow(&managed_selector()));
    let foos = FooCache::new(trim_foo(shard));
    let deployments = DeploymentCache::new(trim_deployment(shard));
    // Decoded without what a sync never reads (`wire`), paged lists too
    // (`decoding_lists`).
    let (foo_client, deployment_client) = (decoding_lists::<FooWire>(client), decoding_lists::<DeploymentView>(client));
    let foo_events = watch(api::<FooWire>(&foo_client, settings.namespace.as_deref()), foo_watch).map_ok(foo_event);
    let (freed, freed_names) = futures::channel::mpsc::unbounded();
    let deployment_events =
        watch(api::<DeploymentView>(&deployment_client, settings.namespace.as_deref()), deployment_watch).inspect(
            move |event| {
                if let Ok(watcher::Event::Delete(d)) = event {
                    let _ = freed.unbounded_send(ObjectRef::from_obj(d));
                }
            },
        );
    // Every trigger waits in the backlog, which counts it as the
    // workqueue's add; the Controller hears only of what it lets in, and of
    // the watches' errors. A Foo's own status write changes its
    // resourceVersion, not its generation: it wakes no sync (the first
    // sight of each Foo does, and a change of the labels its Deployment
    // follows: `changed_foos`).
    queue.set_workers(settings.workers.into());
    let backlog = Arc::new(Backlog::new(settings.workers, queue));
    let (b1, b2, b3, f4) = (backlog.clone(), backlog.clone(), backlog.clone(), foos.clone());
    let foo_triggers = changed_foos(foos.reflect(foo_events))
        .try_filter_map(move |(foo, lane)| std::future::ready(Ok(wait(&b1, by_name(&foo), lane))));
    // Deletions too: a Deployment deleted by hand is put back.
    let owned_triggers =
        changed_deployments(deployments.reflect(deployment_events), b2.clone()).try_filter_map(move |d| {
            std::future::ready(Ok(controlling_foo(&d).and_then(|foo| wait::<DeploymentView>(&b2, foo, Lane::Now))))
        });
    let freed_triggers =
        waiting_for(foos.clone(), freed_names).filter_map(move |foo| std::future::ready(wait(&b3, foo, Lane::Now)));
    let let_in = backlog.clone().stream().inspect(move |foo| f4.schedule(foo));

    let controller = Controller::for_stream(foo_triggers, foos.store())
        .owns_stream(owned_triggers)
        .reconcile_on(freed_triggers)
        .reconcile_on(let_in)
        .trigger_backoff(EachWatchBacksOff)
        .with_config(ControllerConfig::default().concurrency(settings.workers));
    (controller, Caches { foos, deployments, shard: shard.clone() }, backlog)
}

/// Run `controller` until SIGTERM or SIGINT, then let in-flight syncs
/// finish; a second signal stops waiting for them (kube-runtime's shutdown
/// handling). Each Foo a worker takes leaves `backlog` room for the next.
pub async fn run(controller: Controller<Foo>, ctx: Arc<Context>, backlog: Arc<Backlog>) {
    let queue = ctx.metrics.queue.clone();
    let taken = backlog.clone();
    controller
        .shutdown_on_signal()
        .run(
            move |foo, ctx| {
                taken.taken(&queue_key(&ObjectRef::from_obj(&*foo)));
                reconcile(foo, ctx)
            },
            error_policy,
            ctx,
        )
        .for_each(|outcome| {
            report(outcome, &queue, &backlog);
            std::future::ready(())
        })
        .await;
    info!("controller stopped");
}

/// One item of the controller's output stream.
type StreamItem = Result<(ObjectRef<Foo>, Action), kube::runtime::controller::Error<SyncError, watcher::Error>>;

/// Log what the controller's stream says, at the level it deserves.
fn report(outcome: StreamItem, queue: &QueueMetrics, backlog: &Backlog) {
    use kube::runtime::controller::Error as ControllerError;
    match outcome {
        Ok((obj, _)) => debug!(foo = %obj, "synced"),
        // Sync failures are logged by error_policy.
        Err(ControllerError::ReconcilerFailed(..)) => {}
        // A Deployment of a deleted Foo went away (the garbage collector at
        // work): nothing to sync, nothing to report.
        Err(ControllerError::ObjectNotFound(obj)) => {
            let key = queue_key(&obj);
            backlog.taken(&key);
            queue.forget(&key);
            debug!(foo = %obj, "Foo deleted");
        }
        // The watches retry by themselves, with backoff.
        Err(e) => info!(error = %e, "watch interrupted; reconnecting"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FooFixture;
    use futures::FutureExt;

    /// What `backlog` lets in now, without waiting.
    fn let_in(backlog: &Arc<Backlog>) -> Vec<String> {
        let mut stream = Box::pin(backlog.clone().stream());
        std::iter::from_fn(|| stream.next().now_or_never().flatten()).map(|foo| foo.name).collect()
    }

    #[test]
    fn a_foo_the_backlog_let_in_and_found_deleted_makes_room_for_the_next() {
        let backlog = Arc::new(Backlog::new(1, Arc::new(QueueMetrics::default())));
        let names: Vec<String> = (0..10).map(|i| format!("foo-{i}")).collect();
        for name in &names {
            backlog.push(by_name(&Foo::test(name)), Lane::Later);
        }
        let first = let_in(&backlog);
        assert!(!first.is_empty() && first.len() < names.len(), "one room's worth: {first:?}");
        let deleted = ObjectRef::<Foo>::new(&first[0]).within("default").erase();
        let queue = QueueMetrics::default();
        report(Err(kube::runtime::controller::Error::ObjectNotFound(Box::new(deleted))), &queue, &backlog);
        assert_eq!(let_in(&backlog), [names[first.len()].clone()]);
    }
}
