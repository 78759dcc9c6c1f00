//! deploy/ against the real API server: it is admitted (server-side dry run,
//! Pod Security "restricted"), and its RBAC is enough for every behaviour of
//! the controller — run here as the ServiceAccount through impersonation —
//! and no more. Its own test binary, so the all-namespaces controller below
//! runs alone.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use sample_controller::leader::{Elector, LeaderConfig};
use sample_controller::{Foo, FooSpec};
use serde_json::json;

const NS: &str = "sample-controller";
const SA: &str = "sample-controller";

fn can_i(args: &[&str]) -> bool {
    let who = format!("--as=system:serviceaccount:{NS}:{SA}");
    let mut all = vec!["auth", "can-i", who.as_str()];
    all.extend_from_slice(args);
    let out = kubectl(&all);
    String::from_utf8_lossy(&out.stdout).trim() == "yes"
}

/// `kubectl apply -f deploy/`, once for all the tests here.
fn installed() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        kubectl_ok(&["apply", "-f", "deploy/"]);
    });
}

#[tokio::test]
async fn deploy_manifests_pass_a_server_side_dry_run_as_files_and_as_kustomization() {
    // The namespace must exist for the namespaced objects to be checked.
    kubectl_ok(&["apply", "-f", "deploy/00-namespace.yaml"]);
    kubectl_ok(&["apply", "--dry-run=server", "-f", "deploy/"]);
    kubectl_ok(&["apply", "--dry-run=server", "-k", "deploy/"]);
}

#[tokio::test]
async fn operator_pods_are_admitted_where_pod_security_restricted_is_enforced() {
    installed();
    // The ReplicaSet controller could create them (kwok runs them on simulated nodes).
    let admin = admin_client().await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    wait_until("the operator's 2 pods to be admitted", TIMEOUT, || async {
        let n = pods
            .list(&ListParams::default().labels("app.kubernetes.io/name=sample-controller"))
            .await
            .ok()?
            .items
            .len();
        (n == 2).then_some(())
    })
    .await;
    let rs: Api<ReplicaSet> = Api::namespaced(admin.clone(), NS);
    let rs = rs.list(&ListParams::default()).await.unwrap().items;
    let failure = rs
        .iter()
        .flat_map(|r| r.status.iter().flat_map(|s| s.conditions.iter().flatten()))
        .find(|c| c.type_ == "ReplicaFailure");
    assert!(failure.is_none(), "pods refused: {failure:?}");
    // ...and the namespace really enforces it: a plain pod (root allowed,
    // no seccomp profile, capabilities kept) is refused there.
    let privileged: Pod = serde_json::from_value(json!({
        "metadata": { "name": "not-restricted" },
        "spec": { "containers": [{ "name": "c", "image": "busybox:1" }] }
    }))
    .unwrap();
    let refused = pods.create(&PostParams::default(), &privileged).await.expect_err("PodSecurity must refuse it");
    assert!(refused.to_string().contains("violates PodSecurity \"restricted:latest\""), "{refused}");
}

#[tokio::test]
async fn the_service_account_can_run_the_whole_controller() {
    installed();
    // Watching all namespaces, as deployed.
    let controller = start_controller(service_account_client(NS, SA).await, None);
    let ns = TestNamespace::new("rbac").await;
    let foos: Api<Foo> = ns.api();
    foos.create(
        &PostParams::default(),
        &Foo::new("example-foo", FooSpec { deployment_name: "first".into(), replicas: Some(1) }),
    )
    .await
    .unwrap();
    // Create (with blockOwnerDeletion, which OwnerReferencesPermissionEnforcement
    // checks against foos/finalizers), status, events.
    wait_until("status written by the ServiceAccount", TIMEOUT, || async {
        let foo = foos.get("example-foo").await.ok()?;
        (foo.status?.available_replicas == 1).then_some(())
    })
    .await;
    wait_until("a Synced event", TIMEOUT, || async {
        ns.events_for("example-foo").await.into_iter().find(|e| e.starts_with("Normal Synced"))
    })
    .await;
    // Patch replicas, then rename: delete of the old Deployment.
    let patch = json!({ "spec": { "replicas": 2, "deploymentName": "second" } });
    foos.patch("example-foo", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    wait_until("the renamed Deployment with 2 replicas, the old one gone", TIMEOUT, || async {
        let new = deployment(&ns, "second").await?;
        (replicas(&new) == Some(2) && deployment(&ns, "first").await.is_none()).then_some(())
    })
    .await;
    let foo = wait_until("status of the renamed Deployment", TIMEOUT, || async {
        let foo = foos.get("example-foo").await.ok()?;
        (foo.status.as_ref()?.available_replicas == 2).then_some(foo)
    })
    .await;
    assert_eq!(foo.status.unwrap().observed_generation, Some(2));
    // (Not the global error counter: this controller also sees Foos that
    // other test binaries left in namespaces being deleted.)
    let warnings: Vec<_> =
        ns.events_for("example-foo").await.into_iter().filter(|e| e.starts_with("Warning")).collect();
    assert!(warnings.is_empty(), "{warnings:?}");
    drop(controller);
}

#[tokio::test]
async fn the_service_account_can_hold_the_leader_lease_in_its_namespace() {
    installed();
    let mut elector = Elector::new(
        service_account_client(NS, SA).await,
        LeaderConfig {
            lease_name: "rbac-test".into(),
            namespace: NS.into(),
            identity: "rbac-test-candidate".into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        },
    );
    tokio::time::timeout(TIMEOUT, elector.acquire()).await.expect("acquire the lease as the ServiceAccount");
    elector.release().await;
}

#[tokio::test]
async fn the_service_account_has_the_verbs_the_controller_uses() {
    installed();
    let missing: Vec<_> = [
        &["list", "foos.samplecontroller.k8s.io", "-A"][..],
        &["watch", "deployments.apps", "-A"],
        &["patch", "foos.samplecontroller.k8s.io", "--subresource=status", "-n", "default"],
        &["create", "events.events.k8s.io", "-n", "default"],
        &["update", "leases.coordination.k8s.io", "-n", NS],
    ]
    .into_iter()
    .filter(|verb| !can_i(verb))
    .collect();
    assert!(missing.is_empty(), "the ServiceAccount must be able to {missing:?}");
}

#[tokio::test]
async fn the_service_account_has_no_verb_the_controller_does_not_use() {
    installed();
    let extra: Vec<_> = [
        &["update", "deployments.apps", "-n", "default"][..],
        &["delete", "foos.samplecontroller.k8s.io", "-n", "default"],
        &["create", "foos.samplecontroller.k8s.io", "-n", "default"],
        &["update", "foos.samplecontroller.k8s.io", "-n", "default"],
        &["get", "secrets", "-n", NS],
        &["create", "pods", "-n", "default"],
        &["delete", "namespaces"],
        &["create", "leases.coordination.k8s.io", "-n", "default"],
        &["create", "events", "-n", "default"],
    ]
    .into_iter()
    .filter(|verb| can_i(verb))
    .collect();
    assert!(extra.is_empty(), "the ServiceAccount must not be able to {extra:?}");
}
