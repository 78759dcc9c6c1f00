//! What one namespace's burst costs another, for `hack/bench-fairness.sh`:
//! create `burst` Foos in `busy`, as fast as a client may (64 at a time),
//! and meanwhile, every `every_ms`, create a Foo in `quiet` and edit the
//! synced Foo `quiet/steady`, timing each until a watch shows its
//! Deployment (created; showing the new replicas), until every Foo of the
//! burst has its Deployment — what a user of a shared cluster waits for
//! while a neighbour restores 10 000 Foos. Prints each latency's p50 and
//! max, and when the burst was created and converged, from its first
//! create.
//!
//!   cargo bench --bench burst_fairness -- <busy> <burst> <quiet> <every_ms>

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event, watcher};
use sample_controller::{Foo, FooSpec};
use tokio::sync::watch;

mod support;

const USER_AGENT: &str = "sample-controller-bench/0";
/// Creates of the burst in flight at once.
const BURST_AT_ONCE: usize = 64;
/// The longest a probe may wait before the run is called failed.
const PROBE_TIMEOUT: Duration = Duration::from_secs(120);

type Error = Box<dyn std::error::Error + Send + Sync>;

fn foo(name: &str, replicas: i32) -> Foo {
    Foo::new(name, FooSpec { deployment_name: name.into(), replicas: Some(replicas) })
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let [busy, burst, quiet, every_ms] = support::args("burst_fairness <busy> <burst> <quiet> <every_ms>")?;
    let (burst, every) = (burst.parse::<usize>()?, Duration::from_millis(every_ms.parse()?));
    let client = support::client(USER_AGENT).await.map_err(|e| e.to_string())?;
    let quiet_deployments = Deployments::watch(Api::namespaced(client.clone(), &quiet)).await?;
    let busy_deployments: Api<Deployment> = Api::namespaced(client.clone(), &busy);
    let (busy_foos, quiet_foos): (Api<Foo>, Api<Foo>) =
        (Api::namespaced(client.clone(), &busy), Api::namespaced(client, &quiet));

    let started = Instant::now();
    let creating = tokio::spawn(create_burst(busy_foos, burst));
    let (mut created, mut edited) = (Vec::new(), Vec::new());
    // Until the operator is through the burst: each probe waits behind it.
    while created.is_empty() || count(&busy_deployments).await? < burst {
        tokio::time::sleep(every).await;
        let probe = created.len();
        created.push(quiet_deployments.create_timed(&quiet_foos, &format!("probe-{probe}")).await?);
        edited.push(quiet_deployments.edit_timed(&quiet_foos, "steady", (probe % 9 + 2) as i32).await?);
    }
    let created_in = creating.await??;
    println!(
        "new Foo in the quiet namespace: {}; edit there: {}; {} probes while the burst converged; the burst of \
         {burst} created in {:.1} s, converged in {:.1} s",
        summary(&mut created),
        summary(&mut edited),
        created.len(),
        created_in.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The burst's creates, [`BURST_AT_ONCE`] at a time: how long they took.
async fn create_burst(foos: Api<Foo>, burst: usize) -> Result<Duration, Error> {
    let (pp, started) = (PostParams::default(), Instant::now());
    futures::stream::iter(0..burst)
        .map(|i| {
            let (foos, pp) = (&foos, &pp);
            async move { foos.create(pp, &foo(&format!("foo-{i}"), 1)).await.map(drop) }
        })
        .buffer_unordered(BURST_AT_ONCE)
        .try_collect::<()>()
        .await?;
    Ok(started.elapsed())
}

/// How many Deployments `api` holds (metadata only: a page of names).
async fn count(api: &Api<Deployment>) -> Result<usize, Error> {
    let mut n = 0;
    let mut lp = ListParams::default().limit(5000);
    loop {
        let page = api.list_metadata(&lp).await?;
        n += page.items.len();
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => lp = lp.continue_token(&token),
            _ => return Ok(n),
        }
    }
}

/// p50 and max of `latencies`, in ms.
fn summary(latencies: &mut [Duration]) -> String {
    latencies.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let p50 = latencies.get(latencies.len() / 2).copied().unwrap_or_default();
    let max = latencies.last().copied().unwrap_or_default();
    format!("p50 {:.0} ms, max {:.0} ms", ms(p50), ms(max))
}

/// The quiet namespace's Deployments as a watch reports them: each name's
/// replicas, the moment it changes.
struct Deployments {
    seen: watch::Receiver<HashMap<String, i32>>,
}

impl Deployments {
    async fn watch(api: Api<Deployment>) -> Result<Self, Error> {
        let (tx, seen) = watch::channel(HashMap::new());
        let mut events = Box::pin(watcher(api, watcher::Config::default()));
        // Ready once the first list is in.
        loop {
            match events.try_next().await? {
                Some(Event::InitDone) => break,
                Some(Event::InitApply(d)) => record(&tx, &d),
                _ => {}
            }
        }
        tokio::spawn(async move {
            while let Some(event) = events.next().await {
                if let Ok(Event::Apply(d)) = event {
                    record(&tx, &d);
                }
            }
        });
        Ok(Deployments { seen })
    }

    /// Create the Foo `name` and time until its Deployment is seen.
    async fn create_timed(&self, foos: &Api<Foo>, name: &str) -> Result<Duration, Error> {
        let sent = Instant::now();
        foos.create(&PostParams::default(), &foo(name, 1)).await?;
        self.until(name, |replicas| replicas.is_some()).await?;
        Ok(sent.elapsed())
    }

    /// Set `name`'s replicas to `want` and time until its Deployment shows it.
    async fn edit_timed(&self, foos: &Api<Foo>, name: &str, want: i32) -> Result<Duration, Error> {
        let sent = Instant::now();
        let patch = serde_json::json!({ "spec": { "replicas": want } });
        foos.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        self.until(name, |replicas| replicas == Some(want)).await?;
        Ok(sent.elapsed())
    }

    async fn until(&self, name: &str, done: impl Fn(Option<i32>) -> bool) -> Result<(), Error> {
        let mut seen = self.seen.clone();
        let wait = seen.wait_for(|by_name| done(by_name.get(name).copied()));
        tokio::time::timeout(PROBE_TIMEOUT, wait)
            .await
            .map_err(|_| format!("Deployment {name} not as expected after {PROBE_TIMEOUT:?}"))??;
        Ok(())
    }
}

fn record(seen: &watch::Sender<HashMap<String, i32>>, d: &Deployment) {
    let (Some(name), Some(replicas)) = (d.metadata.name.clone(), d.spec.as_ref().and_then(|s| s.replicas)) else {
        return;
    };
    seen.send_modify(|by_name| {
        by_name.insert(name, replicas);
    });
}
