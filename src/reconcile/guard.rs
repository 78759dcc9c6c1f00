//! The safety nets around a sync, as controller-runtime gives them: a
//! standby or a gate in doubt syncs nothing, a sync has a deadline, a panic
//! fails that sync alone, and a failed sync is retried after its Foo's own
//! backoff ([`error_policy`]).

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use futures::FutureExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube_lease_fence::{WriteGate, may_write};
use tracing::{error, info, warn};

use crate::api::foo::Foo;
use crate::client::retry::{FIRST_RETRY, retry_delay};
use crate::observe::queue_metrics::queue_key;
use crate::reconcile::context::Context;
use crate::reconcile::error::{SyncError as Error, SyncResult as Result};
use crate::reconcile::sync::sync;

/// One sync of one Foo, timed and counted the way controller-runtime does.
pub async fn reconcile(foo: Arc<Foo>, ctx: Arc<Context>) -> Result<Action> {
    let obj = ObjectRef::from_obj(&*foo);
    if ctx.gate.as_deref().is_some_and(WriteGate::interrupted) {
        // A leader whose renewal is late, or whose elector is checking the
        // Lease after a refusal by the API server's fence: come back once
        // it has renewed, without dropping the Foo. Dropped, it would wait
        // for its next change: the gate reopening syncs nothing.
        return Ok(Action::requeue(FIRST_RETRY));
    }
    if !may_write(ctx.gate.as_deref()) {
        // A standby: nothing to do until it takes the Lease, which syncs
        // every Foo. What triggered this is no work waiting, so the queue
        // metrics do not count it.
        ctx.metrics.queue.forget(&queue_key(&obj));
        ctx.caches.foos.done(&foo);
        return Ok(Action::await_change());
    }
    let _active = ctx.metrics.worker_started();
    let _working = ctx.metrics.queue.started(&queue_key(&obj));
    let started = Instant::now();
    let result = guarded(sync(foo.clone(), &ctx), &queue_key(&obj), &ctx).await;
    if result.as_ref().is_ok_and(|action| *action == Action::await_change()) {
        ctx.caches.foos.done(&foo);
    }
    ctx.metrics.observe_reconcile(started.elapsed(), result.as_ref());
    match &result {
        Ok(_) => ctx.failures.reset(&obj),
        Err(e) if e.is_terminal() => ctx.metrics.count_terminal(),
        Err(_) => {}
    }
    result
}

/// `sync` within the context's deadline, a panic in it caught: a sync that
/// hangs or panics fails alone, and is retried like any failed sync, as
/// controller-runtime does (`ReconciliationTimeout`, `RecoverPanic`).
/// Without this a request never answered would hold its Foo for good (the
/// client sets no read timeout), and a panic would end the controller's
/// stream, every Foo with it.
async fn guarded(sync: impl Future<Output = Result<Action>>, foo: &str, ctx: &Context) -> Result<Action> {
    let deadline = ctx.reconcile_timeout;
    match tokio::time::timeout(deadline, AssertUnwindSafe(sync).catch_unwind()).await {
        Ok(Ok(result)) => result,
        Ok(Err(panic)) => {
            ctx.metrics.count_panic();
            Err(Error::Panicked { foo: foo.to_owned(), message: panic_message(panic.as_ref()) })
        }
        Err(_) => {
            ctx.metrics.count_timeout();
            Err(Error::TimedOut { foo: foo.to_owned(), after: deadline })
        }
    }
}

/// What `panic!` was given, when it was text (it almost always is).
fn panic_message(panic: &(dyn Any + Send)) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(text), _) => (*text).to_owned(),
        (_, Some(text)) => text.clone(),
        _ => "(a panic with no message)".to_owned(),
    }
}

/// Retry a failed sync after a per-Foo exponential backoff, no sooner than
/// a second when the API server failed it or its leader fence refused it.
pub fn error_policy(foo: Arc<Foo>, err: &Error, ctx: Arc<Context>) -> Action {
    let obj = ObjectRef::from_obj(&*foo);
    let backoff = ctx.failures.next_delay(obj.clone(), |f| ctx.caches.foos.contains(f));
    let delay = retry_delay(backoff, err.retries_slowly());
    ctx.metrics.queue.retried(queue_key(&obj), delay);
    match err {
        Error::ResourceExists { .. } => warn!(error = %err, retry_in = ?delay, "sync refused"),
        Error::FenceInDoubt { .. } => info!(error = %err, retry_in = ?delay, "sync held"),
        // Stop writing and let the elector decide: it renews (the policy's
        // view of the Lease lagged) or finds the Lease taken (we exit).
        e if e.is_fence_refusal() => {
            if let Some(gate) = &ctx.gate {
                gate.doubt();
            }
            warn!(error = %err, retry_in = ?delay, "write refused by the API server's leader fence");
        }
        // Our cached copy was behind; the retry reads the newer one.
        e if e.is_conflict() => info!(error = %err, retry_in = ?delay, "object changed since cached; retrying"),
        Error::TimedOut { .. } => error!(error = %err, retry_in = ?delay, "sync timed out"),
        Error::Panicked { .. } => error!(error = %err, retry_in = ?delay, "sync panicked"),
        _ => error!(error = %err, retry_in = ?delay, "sync failed"),
    }
    Action::requeue(delay)
}
