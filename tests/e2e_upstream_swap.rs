//! Swapping upstream's Go sample-controller for this one on a running
//! cluster, and back. Upstream's controller cannot be built here, so its
//! Deployments are made exactly as its `newDeployment` makes them (no labels
//! of their own; `app` and `controller` on the selector and pods; a
//! controller ownerReference) and its status as `updateFooStatus` writes it;
//! then ours is started with upstream's README command line.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use common::*;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use sample_controller::constants::{LABEL_MANAGED_BY, LABEL_MANAGED_BY_VALUE, USER_AGENT};
use sample_controller::{Foo, FooSpec};
use serde_json::json;

const FOOS: usize = 20;

/// Upstream's `newDeployment(foo)`, as its controller sends it.
fn upstreams_deployment(foo: &Foo) -> Deployment {
    let name = foo.name_any();
    let labels = json!({ "app": "nginx", "controller": name });
    serde_json::from_value(json!({
        "metadata": {
            "name": foo.spec.deployment_name,
            "ownerReferences": [{
                "apiVersion": "samplecontroller.k8s.io/v1alpha1", "kind": "Foo", "name": name,
                "uid": foo.uid().unwrap(), "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "replicas": foo.spec.replicas,
            "selector": { "matchLabels": labels },
            "template": {
                "metadata": { "labels": labels },
                "spec": { "containers": [{ "name": "nginx", "image": "nginx:latest" }] },
            },
        },
    }))
    .unwrap()
}

/// The namespace as upstream's controller left it: `FOOS` Foos, each with
/// its Deployment's pods available and `status.availableReplicas` written.
async fn left_by_upstream(ns: &TestNamespace) -> Vec<Foo> {
    let mut foos = Vec::new();
    for i in 0..FOOS {
        let name = format!("foo-{i}");
        let foo = Foo::new(&name, FooSpec { deployment_name: format!("{name}-nginx"), replicas: Some(1) });
        let foo = ns.api::<Foo>().create(&PostParams::default(), &foo).await.expect("create Foo");
        ns.api::<Deployment>().create(&PostParams::default(), &upstreams_deployment(&foo)).await.expect("create");
        foos.push(foo);
    }
    for foo in &foos {
        wait_for_available(ns, &foo.spec.deployment_name, 1).await;
        let status = json!({ "status": { "availableReplicas": 1 } });
        let pp = PatchParams { field_manager: Some("sample-controller".into()), ..Default::default() };
        ns.api::<Foo>().patch_status(&foo.name_any(), &pp, &Patch::Merge(&status)).await.expect("status");
    }
    foos
}

async fn wait_for_available(ns: &TestNamespace, name: &str, replicas: i32) -> Deployment {
    wait_until(&format!("Deployment {name} with {replicas} available"), TIMEOUT, || async {
        let d = deployment(ns, name).await?;
        let available = d.status.as_ref()?.available_replicas.unwrap_or(0);
        (common::replicas(&d) == Some(replicas) && available == replicas).then_some(d)
    })
    .await
}

fn managed(d: &Deployment) -> bool {
    d.labels().get(LABEL_MANAGED_BY).map(String::as_str) == Some(LABEL_MANAGED_BY_VALUE)
}

/// Everything a rollout or a re-creation would change: each Deployment's uid
/// and generation, and the uids of all ReplicaSets and pods.
async fn workload(ns: &TestNamespace) -> (BTreeMap<String, (String, i64)>, BTreeSet<String>, BTreeSet<String>) {
    let lp = ListParams::default();
    let deployments = ns.api::<Deployment>().list(&lp).await.unwrap().items;
    let deployments =
        deployments.iter().map(|d| (d.name_any(), (d.uid().unwrap(), d.metadata.generation.unwrap()))).collect();
    let replica_sets = ns.api::<ReplicaSet>().list(&lp).await.unwrap().items.iter().map(|r| r.uid().unwrap()).collect();
    let pods = ns.api::<Pod>().list(&lp).await.unwrap().items.iter().map(|p| p.uid().unwrap()).collect();
    (deployments, replica_sets, pods)
}

/// Our binary started with upstream's README command line
/// (`./sample-controller -kubeconfig=$HOME/.kube/config`), klog flags and all.
async fn started_like_upstream(ns: &TestNamespace) -> Operator {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sample-controller"));
    cmd.arg(format!("-kubeconfig={}", kubeconfig_path()))
        .args(["-v=2", "-logtostderr", "-alsologtostderr"])
        .arg(format!("-namespace={}", ns.name))
        .args(["--metrics-bind-address", "127.0.0.1:0", "--health-probe-bind-address", "127.0.0.1:0"])
        .env_remove("RUST_LOG")
        .env_remove("SAMPLE_CONTROLLER_KUBECONFIG");
    start_logged(cmd, &format!("{}-swap", ns.name)).await
}

#[tokio::test]
async fn swapping_upstream_for_ours_adopts_its_deployments_without_touching_a_pod() {
    let ns = TestNamespace::new("swap").await;
    let foos = left_by_upstream(&ns).await;
    let before = workload(&ns).await;
    assert_eq!((before.0.len(), before.2.len()), (FOOS, FOOS), "one Deployment and one pod per Foo");

    let _ours = started_like_upstream(&ns).await;
    for foo in &foos {
        wait_until(&format!("Foo {} adopted and Ready", foo.name_any()), TIMEOUT, || async {
            let d = deployment(&ns, &foo.spec.deployment_name).await?;
            let f = ns.api::<Foo>().get(&foo.name_any()).await.ok()?;
            let status = f.status?;
            let ready = status.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True");
            (managed(&d) && ready && status.observed_generation == f.metadata.generation).then_some(())
        })
        .await;
    }

    // Nothing re-created, nothing rolled: same Deployments at the same
    // generation (a spec change bumps it), same ReplicaSets, same pods.
    assert_eq!(workload(&ns).await, before);
    // One label patch per Deployment, and no other Deployment request: no
    // create attempt, no read (the one list is of all namespaces' metadata
    // when cluster-wide; here, namespaced, it is this namespace's).
    let requests = audited(&ns.name, USER_AGENT);
    let on_deployments: Vec<_> = requests.iter().filter(|r| r.resource == "deployments").collect();
    let patched: BTreeSet<_> =
        on_deployments.iter().filter(|r| r.verb == "patch").filter_map(|r| r.name.clone()).collect();
    let patches = on_deployments.iter().filter(|r| r.verb == "patch").count();
    assert_eq!((patches, patched.len()), (FOOS, FOOS), "one patch per Deployment: {on_deployments:?}");
    let lists = on_deployments.iter().filter(|r| r.verb == "list" && r.name.is_none()).count();
    assert!(lists <= 2, "the adoption list and the watch's list: {on_deployments:?}");
    let others: Vec<_> =
        on_deployments.iter().filter(|r| !["patch", "list", "watch"].contains(&r.verb.as_str())).collect();
    assert!(others.is_empty(), "no create attempt or read: {others:?}");

    // Adopted means everything holds, as for our own Deployments.
    let scaled = &foos[0].spec.deployment_name;
    ns.kubectl_ok(&["scale", "deployment", scaled, "--replicas=4"]);
    wait_for_available(&ns, scaled, 1).await;
    let deleted = &foos[1].spec.deployment_name;
    let old_uid = before.0[deleted].0.clone();
    delete_deployment(&ns, deleted).await;
    wait_until("the deleted Deployment re-created", TIMEOUT, || async {
        deployment(&ns, deleted).await.filter(|d| d.uid().as_deref() != Some(&old_uid))
    })
    .await;
    let unlabelled = &foos[2].spec.deployment_name;
    ns.kubectl_ok(&["label", "deployment", unlabelled, &format!("{LABEL_MANAGED_BY}-")]);
    let relabelled =
        wait_until("our label put back", TIMEOUT, || async { deployment(&ns, unlabelled).await.filter(managed) }).await;
    assert_eq!(relabelled.uid(), Some(before.0[unlabelled].0.clone()), "labelled again, not re-created");
    let edited = &foos[3];
    let spec = json!({ "spec": { "replicas": 2 } });
    ns.api::<Foo>().patch(&edited.name_any(), &PatchParams::default(), &Patch::Merge(&spec)).await.unwrap();
    wait_for_available(&ns, &edited.spec.deployment_name, 2).await;

    let log = std::fs::read_to_string(format!("{}/{}-swap.log", env!("CARGO_TARGET_TMPDIR"), ns.name)).unwrap();
    assert!(log.contains("-v=2 (klog) maps to RUST_LOG="), "the klog flag's notice:\n{log}");
    assert!(log.contains("-logtostderr (klog) ignored"), "{log}");
}

#[tokio::test]
async fn our_deployments_stay_what_upstreams_controller_accepts_as_its_own() {
    // Swapping back: upstream's syncHandler takes a Deployment as its Foo's
    // when `metav1.IsControlledBy(deployment, foo)` (a controller
    // ownerReference with the Foo's uid), and compares replicas only; its
    // informer maps it back through an ownerReference of kind Foo. Its pods
    // must be selected by upstream's labels, or a swap back would orphan them.
    let ns = TestNamespace::new("swapback").await;
    let _controller = ns.controller().await;
    let foo = Foo::new("back", FooSpec { deployment_name: "back-nginx".into(), replicas: Some(2) });
    let foo = ns.api::<Foo>().create(&PostParams::default(), &foo).await.unwrap();
    let ours = wait_for_available(&ns, "back-nginx", 2).await;

    let controllers: Vec<_> = ours.owner_references().iter().filter(|o| o.controller == Some(true)).collect();
    assert_eq!(controllers.len(), 1, "{controllers:?}");
    let owner = controllers[0];
    assert_eq!(owner.uid, foo.uid().unwrap());
    assert_eq!((owner.api_version.as_str(), owner.kind.as_str()), ("samplecontroller.k8s.io/v1alpha1", "Foo"));
    assert_eq!((owner.name.as_str(), owner.block_owner_deletion), ("back", Some(true)));
    let upstream = upstreams_deployment(&foo);
    let (spec, want) = (ours.spec.as_ref().unwrap(), upstream.spec.as_ref().unwrap());
    assert_eq!(spec.selector, want.selector);
    assert_eq!(spec.template.metadata.as_ref().unwrap().labels, want.template.metadata.as_ref().unwrap().labels);
    assert_eq!(spec.replicas, want.replicas);
    let containers = |spec: &k8s_openapi::api::apps::v1::DeploymentSpec| {
        let c = &spec.template.spec.as_ref().unwrap().containers;
        c.iter().map(|c| (c.name.clone(), c.image.clone())).collect::<Vec<_>>()
    };
    assert_eq!(containers(spec), containers(want));
    assert_eq!(spec.replicas, want.replicas);
    // Upstream's pods list (by its selector) finds ours.
    let pods = ns.api::<Pod>().list(&ListParams::default().labels("app=nginx,controller=back")).await.unwrap();
    assert_eq!(pods.items.len(), 2);
}
