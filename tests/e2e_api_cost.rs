//! What the operator costs the API server, counted where every request is
//! seen — the API server's audit log, by the operator's User-Agent — rather
//! than inferred from resourceVersions that did not move. docs/api-cost.md's API
//! cost section states the budget: 3 requests per new Foo (Deployment
//! create, status write, `Synced` event), 2 more each time a change shows in
//! its status (its pod becoming available: status write, event), a few
//! lists and watches for the whole set, and none while idle.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use sample_controller::Foo;
use sample_controller::testing::client::USER_AGENT;

const FOOS: usize = 20;

/// Requests by "verb resource[/subresource]", "dry-run " before a dry run's.
fn by_kind(requests: Vec<Audited>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for r in requests {
        let resource = match r.subresource {
            Some(sub) => format!("{}/{sub}", r.resource),
            None => r.resource,
        };
        let dry_run = if r.dry_run { "dry-run " } else { "" };
        *counts.entry(format!("{dry_run}{} {resource}", r.verb)).or_default() += 1;
    }
    counts
}

fn total(counts: &BTreeMap<String, usize>) -> usize {
    counts.values().sum()
}

#[tokio::test]
async fn new_foos_cost_the_stated_budget_and_an_idle_operator_makes_no_request() {
    let ns = TestNamespace::new("cost").await;
    let op = spawn_operator(&ns.name, &kubeconfig_path(), &[], &format!("{}-op", ns.name)).await;
    wait_until("the operator ready", TIMEOUT, || async {
        http_get(op.probes, "/readyz").await.filter(|(code, _)| *code == 200)
    })
    .await;
    for i in 0..FOOS {
        let name = format!("foo-{i}");
        create_foo(&ns.api(), &name, &name, Some(1)).await;
    }
    wait_until("every Foo's pod available in its status", TIMEOUT, || async {
        let foos = ns.api::<Foo>().list(&Default::default()).await.ok()?;
        let ready = foos.items.iter().filter(|f| f.status.as_ref().is_some_and(|s| s.available_replicas == 1));
        (ready.count() == FOOS).then_some(())
    })
    .await;
    let converged = by_kind(settled_requests(&ns.name, Duration::from_secs(3)).await);

    let count = |kind: &str| converged.get(kind).copied().unwrap_or(0);
    assert_eq!(count("create deployments"), FOOS, "{converged:?}");
    // Created (0 available), then its pod available: two status writes.
    assert_eq!(count("patch foos/status"), 2 * FOOS, "{converged:?}");
    // A `Synced` event for each: a new Event, or a repeat counted into a series.
    assert_eq!(count("create events") + count("patch events"), 2 * FOOS, "{converged:?}");
    // No read of a single object, no Deployment patch, no update.
    for verb in ["get", "update", "delete"] {
        assert!(!converged.keys().any(|k| k.starts_with(&format!("{verb} "))), "{verb}: {converged:?}");
    }
    assert_eq!(count("patch deployments"), 0, "{converged:?}");
    // The Foo and Deployment watches' lists, and the adoption pass's.
    let lists_and_watches =
        count("list foos") + count("list deployments") + count("watch foos") + count("watch deployments");
    assert!(lists_and_watches <= 5, "{converged:?}");
    assert_eq!(total(&converged), 5 * FOOS + lists_and_watches, "nothing else: {converged:?}");

    // Idle: nothing at all, not even a read. (A watch the API server closes
    // after its timeout, minutes from now, would be re-opened: not in this window.)
    // Time itself is under test: ten seconds of silence.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let idle = by_kind(audited(&ns.name, USER_AGENT));
    assert_eq!(idle, converged, "requests while idle");
}
