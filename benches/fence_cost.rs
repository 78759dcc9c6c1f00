//! What the leader fence costs everyone else, for `hack/bench-fence.sh`:
//! another user's writes that the fence's policy matches — Deployment
//! creates and `events.k8s.io` Event creates, made one after the other by
//! a cluster admin — timed one by one. The script runs it with the fence's
//! binding applied and deleted, in turns, and compares.
//!
//!   cargo bench --bench fence_cost -- <namespace> <writes of each kind>
//!
//! Prints one line per kind: `<kind> <count> <p50 ms> <p90 ms> <p99 ms>`.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

mod support;

/// Its own User-Agent, so the audit log tells it from the rest.
const USER_AGENT: &str = "sample-controller-fence-cost/0";

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let [namespace, count] = support::args("fence_cost <namespace> <writes of each kind>")?;
    let count: usize = count.parse()?;
    let client = support::client(USER_AGENT).await?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
    let events: Api<Event> = Api::namespaced(client, &namespace);
    let params = PostParams::default();

    let mut took = Vec::with_capacity(count);
    for i in 0..count {
        let deployment = serde_json::from_value(json!({
            "metadata": { "name": format!("other-{i}") },
            "spec": { "replicas": 0, "selector": { "matchLabels": { "app": "other" } },
                "template": { "metadata": { "labels": { "app": "other" } },
                    "spec": { "containers": [{ "name": "c", "image": "busybox:1" }] } } }
        }))?;
        let start = Instant::now();
        deployments.create(&params, &deployment).await?;
        took.push(start.elapsed());
    }
    report("deployment", &mut took);

    took.clear();
    for i in 0..count {
        let event = serde_json::from_value(json!({
            "metadata": { "name": format!("other-{i}") },
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "reportingController": "example.com/other", "reportingInstance": "other-1",
            "action": "Tested", "reason": "Tested", "type": "Normal", "note": "another user's event",
            "regarding": { "apiVersion": "apps/v1", "kind": "Deployment", "namespace": namespace,
                "name": format!("other-{i}") }
        }))?;
        let start = Instant::now();
        events.create(&params, &event).await?;
        took.push(start.elapsed());
    }
    report("event", &mut took);
    Ok(())
}

fn report(kind: &str, took: &mut [Duration]) {
    took.sort();
    let at = |q: f64| {
        let i = ((took.len() as f64 - 1.0) * q).round() as usize;
        took.get(i).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    println!("{kind} {} {:.2} {:.2} {:.2}", took.len(), at(0.5), at(0.9), at(0.99));
}
