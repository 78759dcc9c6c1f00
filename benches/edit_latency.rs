//! Edit latency for `hack/bench.sh`: on an idle plane, change the
//! `spec.replicas` of Foos one at a time and time each edit until a watch on
//! the Deployments shows the new replicas — what a user waits for after
//! `kubectl scale foo`. Prints p50, p99 and max.
//!
//!   cargo bench --bench edit_latency -- <namespace> <edits>
//!
//! Edits `foo-0` .. `foo-<edits-1>`, each from its current replicas to the
//! next value in 1..=10.

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Api, ResourceExt};
use sample_controller::Foo;
use tokio::sync::mpsc;

mod support;

const USER_AGENT: &str = "sample-controller-bench/0";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let [namespace, edits] = support::args("edit_latency <namespace> <edits>")?;
    let edits: usize = edits.parse()?;
    let client = support::client(USER_AGENT).await?;
    let foos: Api<Foo> = Api::namespaced(client.clone(), &namespace);

    // Deployment replicas as the watch reports them, sent to the timer.
    let (tx, mut seen) = mpsc::unbounded_channel::<(String, i32, Instant)>();
    let (ready_tx, ready) = tokio::sync::oneshot::channel();
    let deployments: Api<Deployment> = Api::namespaced(client, &namespace);
    tokio::spawn(async move {
        let mut ready_tx = Some(ready_tx);
        let mut events = std::pin::pin!(watcher(deployments, watcher::Config::default()));
        while let Some(event) = events.next().await {
            match event {
                Ok(Event::Apply(d)) => {
                    let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                    let _ = tx.send((d.name_any(), replicas, Instant::now()));
                }
                Ok(Event::InitDone) => {
                    ready_tx.take().map(|r| r.send(()));
                }
                _ => {}
            }
        }
    });
    ready.await?;

    let mut latencies = Vec::with_capacity(edits);
    for i in 0..edits {
        let name = format!("foo-{i}");
        let replicas = foos.get(&name).await?.spec.replicas.unwrap_or(1);
        let want = replicas % 10 + 1;
        tokio::time::sleep(Duration::from_millis(100)).await; // idle between edits
        while seen.try_recv().is_ok() {} // drop what came before the edit
        let sent = Instant::now();
        let patch = serde_json::json!({ "spec": { "replicas": want } });
        foos.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        let arrived = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some((d, r, at)) = seen.recv().await {
                if d == name && r == want {
                    return Some(at);
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
        .ok_or_else(|| format!("Deployment {name} never showed replicas {want}"))?;
        latencies.push(arrived - sent);
    }
    latencies.sort();
    let pick = |q: f64| latencies[((latencies.len() as f64 * q).ceil() as usize).saturating_sub(1)];
    println!(
        "edit latency over {edits} edits: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        pick(0.50).as_secs_f64() * 1e3,
        pick(0.99).as_secs_f64() * 1e3,
        latencies.last().unwrap().as_secs_f64() * 1e3
    );
    Ok(())
}
