//! The README's promises about a cluster's life with the operator, as a user
//! goes through them: the upgrade from upstream's CRD (its Foos kept, then
//! reconciled), the uninstall (`kubectl delete -f deploy/` leaves the Foos
//! and their Deployments) and the reinstall (applying deploy/ again takes
//! them back without writing a Deployment), and a Foo's deletion (the
//! garbage collector deletes its Deployment). The first replaces the
//! cluster's Foo CRD and the second deletes deploy/, so the binary runs its
//! tests one at a time (.config/nextest.toml).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use sample_controller::testing::client::USER_AGENT;
use sample_controller::{Foo, FooSpec};
use serde_json::json;

const CRD: &str = "foos.samplecontroller.k8s.io";
/// upstream's artifacts/examples/crd-status-subresource.yaml.
const UPSTREAM_CRD: &str = "tests/fixtures/upstream/crd-status-subresource.yaml";

/// Each object's name, uid and a version that any write changes: of a Foo
/// its resourceVersion, of a Deployment its generation (its status moves
/// with its pods; a write by a controller moves its spec).
type Versions = BTreeMap<String, (String, String)>;

fn foo_versions(foos: &[Foo]) -> Versions {
    foos.iter().map(|f| (f.name_any(), (f.uid().unwrap(), f.resource_version().unwrap()))).collect()
}

async fn deployment_versions(ns: &TestNamespace) -> Versions {
    let list = ns.api::<Deployment>().list(&ListParams::default()).await.expect("list Deployments");
    list.items.iter().map(|d| (d.name_any(), (d.uid().unwrap(), d.metadata.generation.unwrap().to_string()))).collect()
}

async fn foos_in(ns: &TestNamespace) -> Vec<Foo> {
    ns.api::<Foo>().list(&ListParams::default()).await.expect("list Foos").items
}

/// The served Foo CRD is crds/', not upstream's: the scale subresource is
/// ours alone.
fn serves_ours() -> bool {
    let scale = kubectl_ok(&["get", "crd", CRD, "-o", "jsonpath={.spec.versions[0].subresources.scale}"]);
    !scale.trim().is_empty()
}

#[tokio::test]
async fn crds_applied_over_upstreams_crd_keep_its_foos_as_they_are_and_the_controller_reconciles_them() {
    // Whichever way the test ends, the binaries after it find crds/.
    let _crds_back = ApplyOnDrop("crds/");
    // The cluster as upstream's README leaves it: its CRD created, then Foos.
    kubectl_ok(&["delete", "crd", CRD, "--wait=true", "--timeout=120s"]);
    kubectl_ok(&["create", "-f", UPSTREAM_CRD]);
    kubectl_ok(&["wait", "--for=condition=established", &format!("crd/{CRD}"), "--timeout=60s"]);
    assert!(!serves_ours(), "the fixture is not upstream's CRD");
    let ns = TestNamespace::new("upgrade").await;
    let foos: Api<Foo> = ns.api();
    // Upstream's controller reads no replicas as 1; its updateFooStatus
    // writes availableReplicas alone.
    let written = [("with-replicas", Some(2)), ("without-replicas", None)];
    for (name, replicas) in written {
        let foo = Foo::new(name, FooSpec { deployment_name: format!("{name}-nginx"), replicas });
        // The new CRD's storage may take a moment to serve writes.
        wait_until(&format!("Foo {name} created under upstream's CRD"), TIMEOUT, || async {
            foos.create(&PostParams::default(), &foo).await.ok()
        })
        .await;
        let status = json!({ "status": { "availableReplicas": 0 } });
        foos.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.expect("upstream's status");
    }
    let stored = foo_versions(&foos_in(&ns).await);

    // README, "Upgrade from upstream's Go controller", step 2.
    kubectl_ok(&["apply", "-f", "crds/"]);
    kubectl_ok(&["wait", "--for=condition=established", &format!("crd/{CRD}"), "--timeout=60s"]);
    wait_until("the API server to serve crds/' Foo CRD", TIMEOUT, || async { serves_ours().then_some(()) }).await;
    assert_eq!(foo_versions(&foos_in(&ns).await), stored, "the upgrade rewrote or lost stored Foos");

    // Step 3: the controller reconciles them as any Foo.
    let _controller = ns.controller().await;
    for (name, replicas) in written {
        let foo = wait_available(&foos, name, replicas.unwrap_or(1), TIMEOUT).await;
        let status = foo.status.expect("a status");
        assert_eq!(status.observed_generation, foo.metadata.generation, "Foo {name}: {status:?}");
        let d = deployment(&ns, &format!("{name}-nginx")).await.expect("its Deployment");
        assert_eq!(replicas_of(&d), replicas.unwrap_or(1), "Deployment of {name}");
    }
}

fn replicas_of(d: &Deployment) -> i32 {
    common::replicas(d).expect("spec.replicas")
}

const FOOS: usize = 5;

#[tokio::test]
async fn deleting_deploy_leaves_foos_and_deployments_and_applying_it_again_takes_them_back_unwritten() {
    let _deploy_back = ApplyOnDrop("deploy/");
    let _lease = FreshLease::new();
    let pods = install_deploy().await;
    let ns = TestNamespace::new("reinstall").await;
    let foos: Api<Foo> = ns.api();
    let replica = spawn_replica(&ns.name, &pods[0], LEASE).await;
    for i in 0..FOOS {
        create_foo(&foos, &format!("foo-{i}"), &format!("foo-{i}"), Some(1)).await;
    }
    for i in 0..FOOS {
        wait_available(&foos, &format!("foo-{i}"), 1, TIMEOUT).await;
    }
    let deployments = deployment_versions(&ns).await;
    let stored = foo_versions(&foos_in(&ns).await);
    assert_eq!(deployments.len(), FOOS, "{deployments:?}");

    // README, "Uninstall": the operator removed, crds/ kept.
    drop(replica);
    kubectl_ok(&["delete", "-f", "deploy/", "--wait=true", "--timeout=180s"]);
    let gone = kubectl(&["get", "namespace", DEPLOY_NS]);
    assert!(!gone.status.success(), "deploy/'s namespace is still there");
    assert_eq!(foo_versions(&foos_in(&ns).await), stored, "the uninstall changed or deleted Foos");
    assert_eq!(deployment_versions(&ns).await, deployments, "the uninstall changed or deleted Deployments");

    // Applied again: the new leader syncs every Foo, and finds nothing to
    // write: no Deployment write and no status write of its in the audit
    // log (a write that changes nothing leaves the objects as they were, so
    // only the log tells), no Foo or Deployment changed.
    let reinstalled = Timestamp::now();
    let pods = install_deploy().await;
    let replica = spawn_replica(&ns.name, &pods[0], LEASE).await;
    wait_until("the reinstalled operator to sync every Foo", TIMEOUT, || async {
        (metric(&replica, SUCCESS_SERIES).await? >= FOOS as f64).then_some(())
    })
    .await;
    let since_reinstall = settled_requests(&ns.name, Duration::from_secs(3)).await;
    let writes: Vec<_> = since_reinstall
        .iter()
        .filter(|r| r.at >= reinstalled && WRITES.contains(&r.verb.as_str()) && !r.dry_run)
        .filter(|r| r.resource == "deployments" || (r.resource == "foos" && r.subresource.as_deref() == Some("status")))
        .collect();
    assert!(writes.is_empty(), "the reinstalled operator wrote Deployments or Foo statuses: {writes:?}");
    assert_eq!(deployment_versions(&ns).await, deployments, "the reinstall wrote Deployments");
    assert_eq!(foo_versions(&foos_in(&ns).await), stored, "the reinstall wrote Foos");
    // ...and it reconciles them: an edit reaches the Deployment, and only
    // that one is written.
    let scale = json!({ "spec": { "replicas": 2 } });
    foos.patch("foo-0", &PatchParams::default(), &Patch::Merge(&scale)).await.unwrap();
    wait_until("foo-0's Deployment scaled to 2", TIMEOUT, || async {
        deployment(&ns, "foo-0").await.filter(|d| replicas_of(d) == 2)
    })
    .await;
    let mut expected = deployments.clone();
    let scaled = expected.get_mut("foo-0").unwrap();
    scaled.1 = (scaled.1.parse::<i64>().unwrap() + 1).to_string();
    assert_eq!(deployment_versions(&ns).await, expected, "written beside foo-0's Deployment");
}

#[tokio::test]
async fn deleting_a_foo_deletes_its_deployment_through_the_garbage_collector() {
    let ns = TestNamespace::new("foo-deleted").await;
    let foos: Api<Foo> = ns.api();
    let _controller = ns.controller().await;
    create_foo(&foos, "doomed", "doomed", Some(1)).await;
    wait_available(&foos, "doomed", 1, TIMEOUT).await;
    foos.delete("doomed", &DeleteParams::default()).await.expect("delete the Foo");
    // The garbage collector notices a new CRD's owners on its discovery
    // resync (GC_TIMEOUT); the controller deletes no Deployment of a Foo
    // that is gone.
    wait_until("the Deployment of the deleted Foo to go", GC_TIMEOUT, || async {
        deployment(&ns, "doomed").await.is_none().then_some(())
    })
    .await;
    let deletes = |user_agent: &str| {
        audited(&ns.name, user_agent)
            .into_iter()
            .filter(|r| r.verb == "delete" && r.resource == "deployments" && r.name.as_deref() == Some("doomed"))
            .count()
    };
    assert_eq!(deletes(USER_AGENT), 0, "the operator deleted the Deployment itself");
    // kube-controller-manager/<version> (...) .../generic-garbage-collector
    assert_eq!(deletes("kube-controller-manager"), 1, "the garbage collector did not delete the Deployment");
}
