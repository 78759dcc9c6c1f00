//! The floor for `hack/bench.sh`: the least any Foo controller must send to
//! bring N new Foos to "Deployment created, status written" — one create
//! and one status write per Foo, nothing else — at a given concurrency.
//! The benchmark compares the controller's convergence time with this one's,
//! on the same control plane, both timed from the API server's audit log.
//!
//!   cargo bench --bench floor -- <namespace> <concurrency>
//!
//! With `FLOOR_WATCHES=1` it also holds the two watches the controller holds
//! (the namespace's Foos, and the Deployments labelled as the controller's),
//! from its list on, reading their bytes and decoding none: the floor of a
//! client that must watch, which tells what serving the watches costs the
//! API server apart from what the controller does with them. They ask for
//! an hour, longer than any run, and are not re-opened.

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams, PostParams, WatchParams};
use kube::{Api, Client, Resource, ResourceExt};
use sample_controller::Foo;
use sample_controller::testing::api::UNSHARDED;
use sample_controller::testing::api::{desired_deployment, managed_selector};
use sample_controller::testing::reconcile::decide;

mod support;

/// Its own User-Agent, so the audit log tells it from the controller.
const USER_AGENT: &str = "sample-controller-floor/0";

/// On one thread, as the controller runs, so the two differ only in what
/// they send and watch.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let [namespace, concurrency] = support::args("floor <namespace> <concurrency>")?;
    let concurrency: usize = concurrency.parse()?;
    let client = support::client(USER_AGENT).await?;
    let foos: Api<Foo> = Api::namespaced(client.clone(), &namespace);
    let deployments = Api::namespaced(client.clone(), &namespace);

    let started = Instant::now();
    let list = foos.list(&ListParams::default()).await?;
    if std::env::var_os("FLOOR_WATCHES").is_some_and(|v| v == "1") {
        let from = list.metadata.resource_version.clone().unwrap_or_default();
        let everything = WatchParams::default().timeout(WATCH_SECONDS);
        hold_watch(&client, Foo::url_path(&(), Some(&namespace)), &everything, &from).await?;
        let ours = WatchParams::default().timeout(WATCH_SECONDS).labels(&managed_selector());
        hold_watch(&client, Deployment::url_path(&(), Some(&namespace)), &ours, &from).await?;
    }
    let all = list.items;
    let count = all.len();
    let foos = Arc::new(foos);
    futures::stream::iter(all)
        .for_each_concurrent(concurrency, |foo| {
            let (foos, deployments) = (foos.clone(), deployments.clone());
            async move {
                if let Err(e) = converge(&foos, &deployments, &foo).await {
                    eprintln!("floor: Foo {}: {e}", foo.name_any());
                }
            }
        })
        .await;
    println!("floor: {count} Foos at concurrency {concurrency} in {:.2}s", started.elapsed().as_secs_f64());
    Ok(())
}

/// How long the watches ask to be held: longer than any run. kube's default,
/// 290 s, would end them in the middle of a slow run at 100 000 Foos.
const WATCH_SECONDS: u32 = 3600;

/// Opens a watch of `path` from resourceVersion `from` and reads it in the
/// background until the server ends it, decoding nothing.
async fn hold_watch(
    client: &Client,
    path: String,
    params: &WatchParams,
    from: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let request = kube::core::Request::new(path).watch(params, from)?;
    let stream = client.request_stream(request).await?;
    tokio::spawn(async move {
        use futures::AsyncBufReadExt;
        let mut stream = std::pin::pin!(stream);
        while let Ok(read) = stream.as_mut().fill_buf().await {
            let n = read.len();
            if n == 0 {
                break;
            }
            stream.as_mut().consume_unpin(n);
        }
    });
    Ok(())
}

/// The two writes: the Deployment the controller would create, and the
/// status it would write with it.
async fn converge(foos: &Api<Foo>, deployments: &Api<Deployment>, foo: &Foo) -> kube::Result<()> {
    let plan = decide(foo, None, &[], UNSHARDED, &Time(Timestamp::now()));
    let desired = desired_deployment(foo, UNSHARDED).expect("a valid Foo");
    let pp = PostParams { field_manager: Some("sample-controller-floor".into()), ..PostParams::default() };
    deployments.create(&pp, &desired).await?;
    let patch = serde_json::json!({ "status": plan.status });
    foos.patch_status(&foo.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}
