//! The controller against a real control plane (kube-apiserver, etcd,
//! kube-controller-manager from hack/local-up.sh): admission, subresources,
//! ownerReferences, garbage collection and the Deployment → ReplicaSet →
//! Pod chain are the real ones. Each test has its own namespace and its own
//! controller watching only that namespace.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use sample_controller::Foo;
use sample_controller::testing::metric_value;
use serde_json::json;

/// How soon the Foo's status follows a change of its Deployment's pods: the
/// ReplicaSet and Deployment controllers count them, and the Deployment's
/// watch brings the Foo to a sync. Normally within a second; ten seconds
/// allow for a loaded machine and stay short of a periodic resync's 30 s
/// (upstream's), which would also "follow".
const FOLLOWS_WITHIN: Duration = Duration::from_secs(10);

async fn wait_for_deployment(ns: &TestNamespace, name: &str, want: impl Fn(&Deployment) -> bool) -> Deployment {
    wait_until(&format!("Deployment {name} in the wanted state"), TIMEOUT, || async {
        deployment(ns, name).await.filter(|d| want(d))
    })
    .await
}

#[tokio::test]
async fn example_foo_gets_its_deployment_and_a_synced_event() {
    let ns = TestNamespace::new("example").await;
    let _controller = ns.controller().await;
    // Upstream's example manifest, applied unchanged.
    ns.kubectl_ok(&["apply", "-f", "artifacts/examples/example-foo.yaml"]);
    let foo = ns.api::<Foo>().get("example-foo").await.unwrap();

    let d = wait_for_deployment(&ns, "example-foo", |_| true).await;
    let labels = d.metadata.labels.clone().unwrap();
    assert_eq!(labels["app"], "nginx");
    assert_eq!(labels["controller"], "example-foo");
    let spec = d.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(1));
    let selector = spec.selector.match_labels.clone().unwrap();
    assert_eq!(selector.len(), 2);
    assert_eq!(selector["app"], "nginx");
    assert_eq!(selector["controller"], "example-foo");
    assert_eq!(spec.template.metadata.as_ref().unwrap().labels.as_ref(), Some(&selector));
    let containers = &spec.template.spec.as_ref().unwrap().containers;
    assert_eq!(containers.len(), 1);
    assert_eq!(containers[0].name, "nginx");
    assert_eq!(containers[0].image.as_deref(), Some("nginx:latest"));
    let owner = &d.owner_references()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Foo", "example-foo"));
    assert_eq!(owner.uid, foo.uid().unwrap());
    assert_eq!((owner.controller, owner.block_owner_deletion), (Some(true), Some(true)));
    let managers: Vec<_> = d.managed_fields().iter().filter_map(|m| m.manager.clone()).collect();
    assert!(managers.contains(&"sample-controller".to_owned()), "{managers:?}");

    let events = wait_until("a Synced event", TIMEOUT, || async {
        let evs = ns.events_for("example-foo").await;
        evs.iter().any(|e| e == "Normal Synced: Foo synced successfully").then_some(evs)
    })
    .await;
    assert!(!events.iter().any(|e| e.starts_with("Warning")), "{events:?}");
    let got = ns.kubectl(&["get", "foo", "example-foo", "-o", "jsonpath={.status.observedGeneration}"]);
    assert_eq!(String::from_utf8_lossy(&got.stdout), "1");
}

/// Set the `Ready` condition of pod `name`'s status, as a kubelet does when
/// a readiness probe fails or passes again. kwok leaves it alone: its stage
/// readies only pods that have no IP yet (hack/kwok/stages.yaml).
async fn set_ready(ns: &TestNamespace, name: &str, ready: bool) {
    let status = if ready { "True" } else { "False" };
    let patch = json!({ "status": { "conditions": [{ "type": "Ready", "status": status }] } });
    ns.api::<Pod>().patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch)).await.expect("pod status");
}

#[tokio::test]
async fn status_available_replicas_follows_ready_pods_down_and_up() {
    let ns = TestNamespace::new("status").await;
    let _controller = ns.controller().await;
    create_foo(&ns.api(), "example-foo", "example-foo", Some(2)).await;

    let foo = wait_available(&ns.api(), "example-foo", 2, TIMEOUT).await;
    let ready = foo.status.unwrap().conditions.into_iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("True", "Available"));
    // The chain was the real one: a ReplicaSet owned by the Deployment, whose
    // pods were made by the ReplicaSet controller.
    let rs = ns.api::<ReplicaSet>().list(&ListParams::default()).await.unwrap().items;
    assert_eq!(rs.len(), 1);
    assert_eq!(rs[0].owner_references()[0].name, "example-foo");
    assert_eq!(rs[0].status.as_ref().unwrap().ready_replicas, Some(2));
    // ...and its pods were bound by the scheduler to kwok's simulated nodes.
    let pods = ns.api::<Pod>().list(&ListParams::default()).await.unwrap().items;
    let nodes: Vec<_> = pods.iter().filter_map(|p| p.spec.as_ref()?.node_name.as_deref()).collect();
    assert!(nodes.len() == 2 && nodes.iter().all(|n| n.starts_with("kwok-node-")), "{nodes:?}");
    // `kubectl get foo`: the printer columns and their values.
    let table = ns.kubectl_ok(&["get", "foo", "example-foo"]);
    let rows: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows[0], ["NAME", "DEPLOYMENT", "DESIRED", "AVAILABLE", "AGE"], "{table}");
    assert_eq!(rows[1][..4], ["example-foo", "example-foo", "2", "2"], "{table}");

    // One pod stops being ready: one fewer available, on the Foo too; and
    // back once it is ready again. The pods stay the same two throughout.
    let unready = pods[0].name_any();
    set_ready(&ns, &unready, false).await;
    let foo = wait_available(&ns.api(), "example-foo", 1, FOLLOWS_WITHIN).await;
    let ready = foo.status.unwrap().conditions.into_iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(ready.status, "False", "{ready:?}");
    set_ready(&ns, &unready, true).await;
    wait_available(&ns.api(), "example-foo", 2, FOLLOWS_WITHIN).await;
    let now = ns.api::<Pod>().list(&ListParams::default()).await.unwrap().items;
    let uids = |pods: &[Pod]| pods.iter().map(|p| p.uid()).collect::<std::collections::BTreeSet<_>>();
    assert_eq!(uids(&now), uids(&pods), "readiness changed, not the pods");
}

#[tokio::test]
async fn replicas_change_and_kubectl_scale_reach_the_deployment() {
    let ns = TestNamespace::new("scale").await;
    let _controller = ns.controller().await;
    create_foo(&ns.api(), "example-foo", "example-foo", Some(1)).await;
    wait_for_deployment(&ns, "example-foo", |d| replicas(d) == Some(1)).await;

    let patch = json!({ "spec": { "replicas": 3 } });
    ns.api::<Foo>().patch("example-foo", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    wait_for_deployment(&ns, "example-foo", |d| replicas(d) == Some(3)).await;

    // Through the scale subresource of the Foo.
    ns.kubectl_ok(&["scale", "foo/example-foo", "--replicas=4"]);
    wait_for_deployment(&ns, "example-foo", |d| replicas(d) == Some(4)).await;
    // The scale subresource respects the CRD's maximum.
    let out = ns.kubectl(&["scale", "foo/example-foo", "--replicas=11"]);
    assert!(!out.status.success(), "scale to 11 must be refused");
}

#[tokio::test]
async fn deployment_scaled_or_deleted_by_hand_is_put_back() {
    let ns = TestNamespace::new("restore").await;
    let _controller = ns.controller().await;
    create_foo(&ns.api(), "example-foo", "example-foo", Some(2)).await;
    let first = wait_for_deployment(&ns, "example-foo", |d| replicas(d) == Some(2)).await;

    // Someone scales it: the owns() watch brings the Foo back to a sync.
    ns.kubectl_ok(&["scale", "deployment/example-foo", "--replicas=5"]);
    wait_for_deployment(&ns, "example-foo", |d| replicas(d) == Some(2) && d.metadata.generation >= Some(3)).await;

    // Someone adds a field the Foo does not own: it survives the next sync.
    let annotate = json!({ "metadata": { "annotations": { "team": "web" } }, "spec": { "replicas": 1 } });
    ns.api::<Deployment>().patch("example-foo", &PatchParams::default(), &Patch::Merge(&annotate)).await.unwrap();
    let d = wait_for_deployment(&ns, "example-foo", |d| replicas(d) == Some(2)).await;
    assert_eq!(d.annotations().get("team").map(String::as_str), Some("web"));

    // Someone deletes it: a new one is created.
    delete_deployment(&ns, "example-foo").await;
    let second = wait_for_deployment(&ns, "example-foo", |d| d.uid() != first.uid()).await;
    assert_eq!(replicas(&second), Some(2));
}

#[tokio::test]
async fn foreign_deployment_is_never_modified() {
    let ns = TestNamespace::new("foreign").await;
    let foreign: Deployment = serde_json::from_value(json!({
        "metadata": { "name": "example-foo", "labels": { "app": "mine" } },
        "spec": {
            "replicas": 1,
            "selector": { "matchLabels": { "app": "mine" } },
            "template": {
                "metadata": { "labels": { "app": "mine" } },
                "spec": { "containers": [{ "name": "web", "image": "httpd:2" }] }
            }
        }
    }))
    .unwrap();
    ns.api::<Deployment>().create(&PostParams::default(), &foreign).await.unwrap();
    // Let the Deployment controller finish its rollout (the ReplicaSet, its
    // pod available) before the snapshot: its last status write says the
    // new ReplicaSet is available, and a finished rollout's status is not
    // written again while nothing changes.
    wait_until("the foreign Deployment's rollout to finish", TIMEOUT, || async {
        let d = deployment(&ns, "example-foo").await?;
        let status = d.status?;
        let done = status.conditions.iter().flatten().any(|c| {
            c.type_ == "Progressing" && c.status == "True" && c.reason.as_deref() == Some("NewReplicaSetAvailable")
        });
        let counted = [status.replicas, status.updated_replicas, status.ready_replicas, status.available_replicas];
        (status.observed_generation == Some(1) && counted == [Some(1); 4] && done).then_some(())
    })
    .await;
    let before = ns.kubectl_ok(&["get", "deployment", "example-foo", "-o", "json"]);

    let controller = ns.controller().await;
    create_foo(&ns.api(), "example-foo", "example-foo", Some(3)).await;
    wait_until("an ErrResourceExists warning", TIMEOUT, || async {
        ns.events_for("example-foo").await.into_iter().find(|e| {
            e == r#"Warning ErrResourceExists: Resource "example-foo" already exists and is not managed by Foo"#
        })
    })
    .await;
    let foo = wait_until("Ready=False ErrResourceExists on the Foo", TIMEOUT, || async {
        let foo = ns.api::<Foo>().get("example-foo").await.ok()?;
        let cond = foo.status.as_ref()?.conditions.iter().find(|c| c.type_ == "Ready")?.clone();
        (cond.reason == "ErrResourceExists" && cond.status == "False").then_some(foo)
    })
    .await;
    assert_eq!(foo.status.unwrap().available_replicas, 0);
    // Several retries (5 ms backoff, doubling) later, compare.
    wait_until("the refused sync to be retried", TIMEOUT, || async {
        let failed = metric_value(&controller.metrics.encode(), RECONCILE_ERRORS_SERIES)?;
        (failed >= 5.0).then_some(())
    })
    .await;
    let after = ns.kubectl_ok(&["get", "deployment", "example-foo", "-o", "json"]);
    assert_eq!(before, after, "the foreign Deployment must stay byte-for-byte unchanged");
}

#[tokio::test]
async fn deployment_name_change_moves_to_the_new_deployment() {
    let ns = TestNamespace::new("rename").await;
    let _controller = ns.controller().await;
    create_foo(&ns.api(), "example-foo", "old-name", Some(1)).await;
    wait_for_deployment(&ns, "old-name", |_| true).await;
    // A look-alike this Foo does not control must survive the move.
    let mut lookalike: Deployment = deployment(&ns, "old-name").await.unwrap();
    lookalike.metadata = kube::api::ObjectMeta {
        name: Some("bystander".into()),
        labels: lookalike.metadata.labels.clone(),
        ..Default::default()
    };
    lookalike.status = None;
    ns.api::<Deployment>().create(&PostParams::default(), &lookalike).await.unwrap();

    let patch = json!({ "spec": { "deploymentName": "new-name" } });
    ns.api::<Foo>().patch("example-foo", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    wait_for_deployment(&ns, "new-name", |_| true).await;
    wait_until("the old Deployment to go", TIMEOUT, || async {
        deployment(&ns, "old-name").await.is_none().then_some(())
    })
    .await;
    assert!(deployment(&ns, "bystander").await.is_some(), "a Deployment the Foo does not control is never deleted");
    wait_until("a DeletedOldDeployment event", TIMEOUT, || async {
        ns.events_for("example-foo").await.into_iter().find(|e| e.starts_with("Normal DeletedOldDeployment"))
    })
    .await;
}

#[tokio::test]
async fn in_sync_foo_causes_no_writes() {
    let ns = TestNamespace::new("quiet").await;
    let controller = ns.controller().await;
    create_foo(&ns.api(), "example-foo", "example-foo", Some(1)).await;
    wait_available(&ns.api(), "example-foo", 1, TIMEOUT).await;
    let before = settled_requests(&ns.name, Duration::from_secs(2)).await.len();

    // Restarting the controller syncs every Foo again: it lists and watches,
    // and writes nothing — counted in the API server's audit log, where a
    // status patch that changes nothing shows too.
    drop(controller);
    let restarted = ns.controller().await;
    wait_until("a sync after the restart", TIMEOUT, || async {
        let synced = metric_value(&restarted.metrics.encode(), SUCCESS_SERIES)?;
        (synced >= 1.0).then_some(())
    })
    .await;
    let after = settled_requests(&ns.name, Duration::from_secs(2)).await;
    let writes: Vec<_> = after[before..].iter().filter(|r| WRITES.contains(&r.verb.as_str())).collect();
    assert!(writes.is_empty(), "an in-sync Foo was written: {writes:?}");
    assert!(after.len() > before, "the restarted controller's lists show in the log");
    // Nothing is left to come later: no sync asked to run again after a
    // while, none failed to be retried, none waits or runs.
    let encoded = restarted.metrics.encode();
    let value =
        |series: &str| metric_value(&encoded, series).unwrap_or_else(|| panic!("no series {series}:\n{encoded}"));
    let later = "controller_runtime_reconcile_total{controller=\"foo\",result=\"requeue_after\"}";
    assert_eq!(value(later), 0.0, "a sync asked to run again later");
    assert_eq!(value("controller_runtime_reconcile_errors_total{controller=\"foo\"}"), 0.0, "a sync failed");
    for priority in ["0", "-100"] {
        let depth = format!("workqueue_depth{{name=\"foo\",controller=\"foo\",priority=\"{priority}\"}}");
        assert_eq!(value(&depth), 0.0, "a Foo waits to be synced ({depth})");
    }
    assert_eq!(value("controller_runtime_active_workers{controller=\"foo\"}"), 0.0, "a sync runs");
}

#[tokio::test]
async fn a_deployment_scaled_by_hand_while_the_cache_lags_is_never_blindly_overwritten() {
    // No running controller: single syncs over caches the test fills, so the
    // Deployment cache can lag behind the API server for as long as needed.
    let ns = TestNamespace::new("lag").await;
    let metrics = std::sync::Arc::new(sample_controller::testing::observe::Metrics::new());
    let sync = |foo: Foo, cached: Vec<Deployment>| {
        let (client, metrics) = (ns.client.clone(), metrics.clone());
        async move {
            let caches = caches_holding(std::slice::from_ref(&foo), &cached).await;
            let ctx = context(client, caches, metrics);
            sample_controller::testing::reconcile::reconcile(std::sync::Arc::new(foo), ctx).await
        }
    };
    let foos: Api<Foo> = ns.api();
    create_foo(&ns.api(), "example-foo", "example-foo", Some(1)).await;
    sync(foos.get("example-foo").await.unwrap(), vec![]).await.expect("first sync creates the Deployment");
    let seen = deployment(&ns, "example-foo").await.expect("created");

    // Between two syncs, someone scales the Deployment and the Foo asks for 2.
    ns.kubectl_ok(&["scale", "deployment/example-foo", "--replicas=5"]);
    let patch = json!({ "spec": { "replicas": 2 } });
    let foo = foos.patch("example-foo", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();

    // The cache still holds the version before the hand scaling: the write
    // based on it is refused, and nothing is written.
    let err = sync(foo.clone(), vec![seen]).await.expect_err("a write based on a stale copy must fail");
    assert!(err.is_conflict(), "{err}");
    assert_eq!(replicas(&deployment(&ns, "example-foo").await.unwrap()), Some(5), "written blindly");

    // The retry reads the caught-up cache and restores the Foo's replicas.
    // (The Deployment controller may update the Deployment between the read
    // and the patch: that is one more conflict and retry, as in the
    // controller's own error policy.)
    wait_until("a retry from a caught-up cache to restore the replicas", TIMEOUT, || async {
        let current = deployment(&ns, "example-foo").await.unwrap();
        match sync(foo.clone(), vec![current]).await {
            Ok(_) => Some(()),
            Err(e) if e.is_conflict() => None,
            Err(e) => panic!("the retry failed: {e}"),
        }
    })
    .await;
    assert_eq!(replicas(&deployment(&ns, "example-foo").await.unwrap()), Some(2));
}

/// The `Ready` condition's reason, once the Foo has one.
async fn ready_reason(ns: &TestNamespace, foo: &str) -> Option<String> {
    let foo = ns.api::<Foo>().get(foo).await.ok()?;
    Some(foo.status?.conditions.into_iter().find(|c| c.type_ == "Ready")?.reason)
}

#[tokio::test]
async fn two_foos_naming_one_deployment_the_second_waits_until_the_first_is_gone() {
    let ns = TestNamespace::new("shared").await;
    let _controller = ns.controller().await;
    let first = create_foo(&ns.api(), "first", "shared", Some(1)).await;
    let theirs = wait_for_deployment(&ns, "shared", |_| true).await;
    create_foo(&ns.api(), "second", "shared", Some(3)).await;
    wait_until("the second Foo to be refused", TIMEOUT, || async {
        (ready_reason(&ns, "second").await? == "ErrResourceExists").then_some(())
    })
    .await;
    let d = deployment(&ns, "shared").await.unwrap();
    assert_eq!((replicas(&d), d.owner_references()[0].uid.clone()), (Some(1), first.uid().unwrap()));
    assert_eq!(d.metadata.generation, theirs.metadata.generation, "the owner's Deployment was modified");

    // Only once the garbage collector removed the first one's Deployment
    // does the second get its own (a new object, not a takeover).
    ns.api::<Foo>().delete("first", &DeleteParams::background()).await.unwrap();
    let second = ns.api::<Foo>().get("second").await.unwrap();
    let mine = wait_for_deployment(&ns, "shared", |d| d.owner_references()[0].uid == second.uid().unwrap()).await;
    assert_ne!(mine.uid(), theirs.uid());
    assert_eq!(replicas(&mine), Some(3));
}

#[tokio::test]
async fn a_foo_recreated_under_the_same_name_never_adopts_the_old_deployment() {
    let ns = TestNamespace::new("recreate").await;
    let _controller = ns.controller().await;
    let old = create_foo(&ns.api(), "example-foo", "example-foo", Some(1)).await;
    wait_for_deployment(&ns, "example-foo", |_| true).await;
    // Hold the old Deployment while it is being collected.
    let hold = json!({ "metadata": { "finalizers": ["sample-controller.test/hold"] } });
    let deployments = ns.api::<Deployment>();
    deployments.patch("example-foo", &PatchParams::default(), &Patch::Merge(&hold)).await.unwrap();
    ns.api::<Foo>().delete("example-foo", &DeleteParams::background()).await.unwrap();
    wait_until("the old Foo to be gone", TIMEOUT, || async {
        ns.api::<Foo>().get_opt("example-foo").await.ok()?.is_none().then_some(())
    })
    .await;
    let new = create_foo(&ns.api(), "example-foo", "example-foo", Some(2)).await;
    assert_ne!(new.uid(), old.uid());

    wait_until("the new Foo to be refused the old Deployment", TIMEOUT, || async {
        (ready_reason(&ns, "example-foo").await? == "ErrResourceExists").then_some(())
    })
    .await;
    let held = wait_for_deployment(&ns, "example-foo", |d| d.metadata.deletion_timestamp.is_some()).await;
    assert_eq!(held.owner_references()[0].uid, old.uid().unwrap(), "adopted by the new Foo");
    assert_eq!(replicas(&held), Some(1), "scaled for the new Foo");

    let release = json!({ "metadata": { "finalizers": null } });
    deployments.patch("example-foo", &PatchParams::default(), &Patch::Merge(&release)).await.unwrap();
    let fresh = wait_for_deployment(&ns, "example-foo", |d| d.owner_references()[0].uid == new.uid().unwrap()).await;
    assert_eq!(replicas(&fresh), Some(2));
}
