//! Swapping upstream's Go sample-controller for this one on a running
//! cluster, and back. Going over, upstream's state is written by the test:
//! its Deployments exactly as its `newDeployment` makes them (no labels of
//! their own; `app` and `controller` on the selector and pods; a controller
//! ownerReference) and its status as `updateFooStatus` writes it; then ours
//! is started with upstream's README command line. Going back, upstream's
//! controller logic runs for real: hack/tools/client-go, upstream's
//! controller.go on client-go (the peer benchmark's reference), is built and
//! pointed at our Deployments.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Instant;

use common::*;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Event as CoreEvent, Pod};
use kube::ResourceExt;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use sample_controller::testing::api::{
    LABEL_MANAGED_BY, LABEL_MANAGED_BY_VALUE, REASON_NOT_ADOPTED, message_not_adopted,
};
use sample_controller::testing::client::USER_AGENT;
use sample_controller::{Foo, FooSpec};
use serde_json::json;

const FOOS: usize = 20;

/// Upstream's `newDeployment(foo)`, as its controller sends it: transcribed
/// from kubernetes/sample-controller's controller.go (lines 388-421 at
/// 7e64d481a698ac8669377460e1fd32a31763246e, 2026-07-01; the field manager
/// its writes name is `sample-controller`).
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

/// A Foo whose `deploymentName` was changed while upstream ran: upstream
/// created the new Deployment and left the old one serving (it deletes
/// nothing). Switching to ours must not delete it: the old one stays as it
/// was, unlabelled, and the Foo gets one Warning saying so; the new one is
/// adopted as usual.
#[tokio::test]
async fn a_deployment_a_foo_renamed_under_upstream_keeps_serving_after_the_swap_and_is_reported_once() {
    let ns = TestNamespace::new("swap-renamed").await;
    let spec = FooSpec { deployment_name: "renamed-old".into(), replicas: Some(1) };
    let foo = ns.api::<Foo>().create(&PostParams::default(), &Foo::new("renamed", spec)).await.expect("create Foo");
    ns.api::<Deployment>().create(&PostParams::default(), &upstreams_deployment(&foo)).await.expect("create old");
    let rename = json!({ "spec": { "deploymentName": "renamed-new" } });
    let foo = ns.api::<Foo>().patch("renamed", &PatchParams::default(), &Patch::Merge(&rename)).await.unwrap();
    ns.api::<Deployment>().create(&PostParams::default(), &upstreams_deployment(&foo)).await.expect("create new");
    let old = wait_for_available(&ns, "renamed-old", 1).await;
    wait_for_available(&ns, "renamed-new", 1).await;

    let _ours = started_like_upstream(&ns).await;
    wait_until("the Foo's Deployment adopted", TIMEOUT, || async {
        deployment(&ns, "renamed-new").await.filter(managed)
    })
    .await;
    let warning = format!("Warning {REASON_NOT_ADOPTED}: {}", message_not_adopted("renamed-old"));
    wait_until("the Warning about the Deployment left alone", TIMEOUT, || async {
        ns.events_for("renamed").await.contains(&warning).then_some(())
    })
    .await;
    // A sync deletes stale Deployments before it writes the Foo's status:
    // once the status is written for this generation, a delete would have
    // been made.
    wait_until("the Foo's status written", TIMEOUT, || async {
        let f = ns.api::<Foo>().get("renamed").await.ok()?;
        let status = f.status?;
        let ready = status.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True");
        (ready && status.observed_generation == f.metadata.generation).then_some(())
    })
    .await;
    let kept = deployment(&ns, "renamed-old").await.expect("the old Deployment is not deleted");
    assert_eq!((kept.uid(), kept.metadata.generation), (old.uid(), old.metadata.generation));
    assert!(!managed(&kept), "the old Deployment is not labelled ours");
    let deletes: Vec<_> = audited(&ns.name, USER_AGENT)
        .into_iter()
        .filter(|r| r.resource == "deployments" && r.verb == "delete")
        .collect();
    assert!(deletes.is_empty(), "{deletes:?}");
    let warnings = ns.events_for("renamed").await.into_iter().filter(|e| *e == warning).count();
    assert_eq!(warnings, 1, "one Warning per takeover");
}

/// The User-Agent of the client-go reference's requests.
const REFERENCE_AGENT: &str = "client-go-controller-reference/";

/// The client-go reference of upstream's controller (hack/tools/client-go),
/// built as the control plane and hack/bench-peers.sh build Go (hack/lib.sh's
/// `go_build`): the client-go packages it shares with kube-apiserver come
/// from Go's build cache. Its path.
fn built_reference() -> String {
    let out = scratch("client-go-controller-reference");
    let started = Instant::now();
    let build = Command::new("bash")
        .args(["-c", r#"source hack/lib.sh && cd hack/tools/client-go && go_build -o "$1" ."#, "go_build", &out])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run bash, which builds hack/tools/client-go as it builds the plane: {e}"));
    assert!(build.status.success(), "go build hack/tools/client-go:\n{}", String::from_utf8_lossy(&build.stderr));
    eprintln!("built the client-go reference in {:.1?}", started.elapsed());
    out
}

/// The reference's requests in `ns` that wrote a Deployment.
fn reference_deployment_writes(ns: &TestNamespace) -> Vec<Audited> {
    let requests = audited(&ns.name, REFERENCE_AGENT);
    requests.into_iter().filter(|r| r.resource == "deployments" && WRITES.contains(&r.verb.as_str())).collect()
}

/// Fail at once if a refusal of upstream's is among `ns`'s Events.
async fn no_refusal(ns: &TestNamespace) {
    let events = ns.api::<CoreEvent>().list(&ListParams::default()).await.expect("list events").items;
    if let Some(e) = events.iter().find(|e| e.reason.as_deref() == Some("ErrResourceExists")) {
        panic!("upstream's sync refused our Deployment: {:?}", e.message);
    }
}

#[tokio::test]
async fn upstreams_controller_run_on_client_go_takes_our_deployment_as_its_own_without_a_rollout() {
    // Swapping back: upstream's syncHandler takes a Deployment as its Foo's
    // when `metav1.IsControlledBy(deployment, foo)`, and compares replicas
    // only; its informer maps a Deployment back to its Foo through a
    // controller ownerReference of kind Foo; a replica change makes it send
    // its whole `newDeployment`, whose selector must be ours (it cannot
    // change) and whose pod template, if it differed from ours, would roll
    // every pod. Built first: nothing else runs on this thread yet.
    let reference = built_reference();
    let ns = TestNamespace::new("swapback").await;
    let ours = ns.controller().await;
    let foo = Foo::new("back", FooSpec { deployment_name: "back-nginx".into(), replicas: Some(2) });
    ns.api::<Foo>().create(&PostParams::default(), &foo).await.unwrap();
    wait_for_available(&ns, "back-nginx", 2).await;
    // Upstream's pods list (by the labels of its `newDeployment`) finds ours.
    let pods = ns.api::<Pod>().list(&ListParams::default().labels("app=nginx,controller=back")).await.unwrap();
    assert_eq!(pods.items.len(), 2);
    drop(ours);
    let before = workload(&ns).await;

    let log = format!("{}/{}-reference.log", env!("CARGO_TARGET_TMPDIR"), ns.name);
    let mut run = Command::new(&reference);
    run.args(["--kubeconfig", &kubeconfig_path(), "--namespace", &ns.name, "--resync-period", "0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let _upstream = Process::start(&mut run, "the client-go reference");
    // Its first sync of the Foo ends in a status update, which it makes only
    // once it has taken the Deployment as the Foo's (a refusal returns
    // before it).
    wait_until(&format!("upstream's sync of Foo back to update its status (log: {log})"), TIMEOUT, || async {
        no_refusal(&ns).await;
        let requests = audited(&ns.name, REFERENCE_AGENT);
        requests
            .iter()
            .any(|r| r.verb == "update" && r.subresource.as_deref() == Some("status") && r.code == Some(200))
            .then_some(())
    })
    .await;
    let writes = reference_deployment_writes(&ns);
    assert!(writes.is_empty(), "upstream's sync wrote our Deployment: {writes:?}");
    assert_eq!(workload(&ns).await, before, "nothing re-created, rolled or restarted");

    // Scaled by hand: its informer maps the Deployment to the Foo, and its
    // update of the replicas leaves the pods' template (and ReplicaSet) as
    // ours made them.
    ns.kubectl_ok(&["scale", "deployment", "back-nginx", "--replicas=3"]);
    let scaled_back = wait_until(&format!("upstream to put back 2 replicas (log: {log})"), TIMEOUT, || async {
        let d = deployment(&ns, "back-nginx").await?;
        let observed = d.status.as_ref()?.observed_generation == d.metadata.generation;
        let updated = reference_deployment_writes(&ns).iter().any(|r| r.verb == "update" && r.code == Some(200));
        (updated && observed && common::replicas(&d) == Some(2)).then_some(d)
    })
    .await;
    no_refusal(&ns).await;
    assert_eq!(scaled_back.uid().as_ref(), before.0.get("back-nginx").map(|(uid, _)| uid), "the same Deployment");
    let (_, replica_sets, _) = workload(&ns).await;
    assert_eq!(replica_sets, before.1, "upstream's update rolled the pods: its pod template is not ours");
}
