//! client-go's workqueue example, the kube-runtime way.
//!
//! A controller over the Pods of a namespace (or all): for a Pod it has, it
//! prints `Sync/Add/Update for Pod <name>`; for one that is gone,
//! `Pod <namespace/name> does not exist anymore`. A failing sync is retried
//! five times with client-go's per-item rate limiting (5 ms doubling), each
//! failure logged as `Error syncing pod <key>: <error>`, then dropped with
//! `Dropping pod "<key>" out of the queue: <error>`.
//!
//! The original's sync cannot fail; `--fail <pod>` makes every sync of that
//! Pod fail, to show the retries.
//!
//! ```sh
//! cargo run --example workqueue -- --namespace default --fail broken
//! ```
//!
//! What kube-runtime gives for free: the reflector is the informer's
//! indexer, the Controller's scheduler is the workqueue (a key is never
//! synced twice at once, and triggers for a key being synced wait for it),
//! `concurrency` is the number of workers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::controller::{Action, Config, Controller, Error as ControllerError};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};

/// client-go's `handleErr`: retry a key this many times, then drop it.
const MAX_RETRIES: u32 = 5;
/// client-go's default item rate limiter: 5 ms, doubling per failure.
const BASE_DELAY: Duration = Duration::from_millis(5);

#[derive(Debug, thiserror::Error)]
#[error("sync of Pod {0} failed on purpose (--fail)")]
struct SyncError(String);

struct Context {
    /// The Pod whose syncs fail (`--fail`).
    fail: Option<String>,
    /// client-go's `NumRequeues`, per key.
    requeues: Mutex<HashMap<String, u32>>,
}

fn key(pod: &Pod) -> String {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

async fn sync(pod: Arc<Pod>, ctx: Arc<Context>) -> Result<Action, SyncError> {
    if ctx.fail.as_deref() == Some(pod.name_any().as_str()) {
        return Err(SyncError(pod.name_any()));
    }
    // client-go's `Forget`: a success resets the key's rate limiting.
    ctx.requeues.lock().unwrap().remove(&key(&pod));
    println!("Sync/Add/Update for Pod {}", pod.name_any());
    Ok(Action::await_change())
}

fn handle_error(pod: Arc<Pod>, err: &SyncError, ctx: Arc<Context>) -> Action {
    let key = key(&pod);
    let mut requeues = ctx.requeues.lock().unwrap();
    let n = requeues.entry(key.clone()).or_insert(0);
    if *n < MAX_RETRIES {
        eprintln!("Error syncing pod {key}: {err}");
        let delay = BASE_DELAY * 2u32.pow(*n);
        *n += 1;
        return Action::requeue(delay);
    }
    requeues.remove(&key);
    eprintln!("Dropping pod {key:?} out of the queue: {err}");
    Action::await_change()
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

#[tokio::main]
async fn main() -> Result<(), kube::Error> {
    let client = Client::try_default().await?;
    let pods: Api<Pod> = match arg("--namespace") {
        Some(ns) => Api::namespaced(client, &ns),
        None => Api::all(client),
    };
    let ctx = Arc::new(Context { fail: arg("--fail"), requeues: Mutex::default() });

    // The informer: a reflector, whose deletions also reach the controller,
    // so a Pod that is gone is reported as such.
    let (reader, writer) = reflector::store();
    let events = watcher(pods, watcher::Config::default()).default_backoff().reflect(writer).touched_objects();
    Controller::for_stream(events, reader)
        .with_config(Config::default().concurrency(1))
        .shutdown_on_signal()
        .run(sync, handle_error, ctx)
        .for_each(|outcome| async move {
            if let Err(ControllerError::ObjectNotFound(pod)) = outcome {
                println!("Pod {}/{} does not exist anymore", pod.namespace.as_deref().unwrap_or_default(), pod.name);
            }
        })
        .await;
    Ok(())
}
