//! Edit latency for `hack/bench.sh`: on an idle plane, change the
//! `spec.replicas` of Foos one at a time and time each edit until a watch on
//! its Deployment shows the new replicas — what a user waits for after
//! `kubectl scale foo`. Prints p50, p99 and max.
//!
//!   cargo bench --bench edit_latency -- <namespace> <edits>
//!
//! Edits `foo-0` .. `foo-<edits-1>`, each from its current replicas to the
//! next value in 1..=10, each once the previous one's rollout and status
//! update are over.

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher::{self, Event, watcher};
use sample_controller::Foo;

mod support;

const USER_AGENT: &str = "sample-controller-bench/0";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let [namespace, edits] = support::args("edit_latency <namespace> <edits>")?;
    let edits: usize = edits.parse()?;
    let client = support::client(USER_AGENT).await?;
    let foos: Api<Foo> = Api::namespaced(client.clone(), &namespace);

    let deployments: Api<Deployment> = Api::namespaced(client, &namespace);
    let mut latencies = Vec::with_capacity(edits);
    for i in 0..edits {
        let name = format!("foo-{i}");
        let replicas = foos.get(&name).await?.spec.replicas.unwrap_or(1);
        let want = replicas % 10 + 1;
        // A watch on this one Deployment (not all of them: at 10 000 Foos the
        // probe would spend its time decoding), open before the edit.
        let only = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut events = std::pin::pin!(watcher(deployments.clone(), only));
        while !matches!(events.next().await.transpose()?, Some(Event::InitDone)) {}
        let sent = Instant::now();
        let patch = serde_json::json!({ "spec": { "replicas": want } });
        foos.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        let shows_want = |d: &Deployment| d.spec.as_ref().and_then(|s| s.replicas) == Some(want);
        let (arrived, edited) = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(event) = events.next().await {
                if let Ok(Event::Apply(d)) = event
                    && shows_want(&d)
                {
                    return Some((Instant::now(), d));
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
        .ok_or_else(|| format!("Deployment {name} never showed replicas {want}"))?;
        latencies.push(arrived - sent);
        settle(&foos, edited, &mut events).await?;
    }
    if latencies.is_empty() {
        // EDITS=0: hack/bench.sh asked for none.
        println!("edit latency: no edits");
        return Ok(());
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

/// Wait until the edit's consequences are over, so that the next edit meets
/// an idle plane: the Deployment's rollout (where a Deployment controller
/// runs; in the scale mode nothing writes its status) and the Foo's status
/// written from it. Then a short pause.
async fn settle(
    foos: &Api<Foo>,
    edited: Deployment,
    events: &mut (impl futures::Stream<Item = watcher::Result<Event<Deployment>>> + Unpin),
) -> Result<(), Box<dyn std::error::Error>> {
    let rolled_out = |d: &Deployment| {
        let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let Some(status) = d.status.as_ref().filter(|s| s.observed_generation.is_some()) else {
            return true; // no Deployment controller: nothing more will happen
        };
        status.observed_generation >= d.metadata.generation
            && status.available_replicas.unwrap_or(0) == want
            && status.replicas.unwrap_or(0) == want
    };
    let available = |d: &Deployment| d.status.as_ref().and_then(|s| s.available_replicas).unwrap_or(0);
    let name = edited.metadata.name.clone().unwrap_or_default();
    let deadline = Duration::from_secs(60);
    let shown = tokio::time::timeout(deadline, async {
        if rolled_out(&edited) {
            return Ok(available(&edited));
        }
        while let Some(event) = events.next().await {
            if let Ok(Event::Apply(d)) = event
                && rolled_out(&d)
            {
                return Ok(available(&d));
            }
        }
        Err(format!("the watch of Deployment {name} ended"))
    })
    .await
    .map_err(|_| format!("Deployment {name} did not roll out within {deadline:?}"))??;
    let started = Instant::now();
    while foos.get(&name).await?.status.map_or(0, |s| s.available_replicas) != shown {
        if started.elapsed() > deadline {
            return Err(format!("Foo {name} never showed {shown} available replicas").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(())
}
