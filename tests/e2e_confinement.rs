//! deploy/'s confinement of the operator's ServiceAccount
//! (13-deployment-writes-policy.yaml and its binding) against the real API
//! server: as that ServiceAccount, from a pod of deploy/'s Deployment
//! (impersonated, with the pod the API server would name in a pod-bound
//! token's user info, so that deploy/'s leader fence admits it), the writes
//! the operator makes are admitted — built by the crate's own code, so the
//! tests follow it — and any other write to a Deployment is refused, with
//! the policy's reason. Its own test binary, run one test at a time
//! (.config/nextest.toml, and a lock under `cargo test`): the tests share
//! deploy/'s LeaderFence.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use sample_controller::Foo;
use sample_controller::LeaderFence;
use sample_controller::testing::api::UNSHARDED;
use sample_controller::testing::api::desired_deployment;
use sample_controller::testing::api::{CONTAINER_IMAGE, LABEL_MANAGED_BY, LABEL_MANAGED_BY_VALUE};
use sample_controller::testing::reconcile::DeploymentPatch;
use serde_json::json;

/// The policy's name, which the API server puts in each of its refusals.
const POLICY: &str = sample_controller::CONFINEMENT_POLICY;

/// What the tests install: deploy/'s namespace, ServiceAccount and RBAC, its
/// leader fence, and the confinement. Not the operator's Deployment: no
/// replica runs here.
const FILES: [&str; 9] = [
    "deploy/00-namespace.yaml",
    "deploy/01-serviceaccount.yaml",
    "deploy/02-clusterrole.yaml",
    "deploy/03-clusterrolebinding.yaml",
    "deploy/11-leader-fence-crd.yaml",
    "deploy/11-leader-fence-policy.yaml",
    "deploy/12-leader-fence-binding.yaml",
    "deploy/13-deployment-writes-policy.yaml",
    "deploy/14-deployment-writes-binding.yaml",
];

/// The pods the tests' writes come from, named as replicas of deploy/'s
/// Deployment are (`<deployment>-<hash>-<suffix>`): the LeaderFence names
/// the first, so deploy/'s leader fence admits its writes and refuses the
/// other's.
const HOLDER_POD: &str = "sample-controller-6b8f9d7c5-holdr";
const STANDBY_POD: &str = "sample-controller-6b8f9d7c5-stndb";

/// The API server's policy refresh (a second) and its informer of the
/// LeaderFence (milliseconds), with room for a loaded machine.
const IN_EFFECT: Duration = Duration::from_secs(20);

/// A client acting as deploy/'s ServiceAccount from `pod`, as the API
/// server sees a replica's pod-bound token: the user, its groups, and the
/// pod's name in its extra.
async fn operator_in(pod: &str) -> kube::Client {
    let mut cfg = service_account_config(DEPLOY_NS, DEPLOY_SA).await;
    cfg.auth_info.impersonate_user_extra =
        Some([("authentication.kubernetes.io/pod-name".to_owned(), vec![pod.to_owned()])].into());
    kube::Client::try_from(cfg).expect("client")
}

/// One test at a time in this process (cargo test runs a binary's tests on
/// threads; cargo-nextest runs each in a process of its own, one at a time).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// deploy/'s confinement and leader fence installed, the LeaderFence
/// naming [`HOLDER_POD`], and a namespace for one test with a Foo of its
/// own (`example-foo`, naming Deployment `example-foo`). deploy/'s Lease
/// and LeaderFence are deleted again when it is dropped.
struct Confined {
    ns: TestNamespace,
    foo: Foo,
    /// As deploy/'s ServiceAccount from the pod the LeaderFence names.
    operator: Api<Deployment>,
    _lease: FreshLease,
    /// Dropped last: the next test starts once this one's LeaderFence is gone.
    _alone: tokio::sync::MutexGuard<'static, ()>,
}

impl Confined {
    async fn new(prefix: &str) -> Self {
        let alone = ONE_AT_A_TIME.lock().await;
        let lease = FreshLease::new();
        let mut apply = vec!["apply"];
        for file in FILES {
            apply.extend(["-f", file]);
        }
        kubectl_ok(&apply);
        kubectl_ok(&[
            "wait",
            "--for=condition=established",
            "crd/leaderfences.samplecontroller.k8s.io",
            "--timeout=60s",
        ]);
        let fences: Api<LeaderFence> = Api::namespaced(admin_client().await, DEPLOY_NS);
        let holder = LeaderFence::new(DEPLOY_LEASE, naming_leader(&format!("{HOLDER_POD}_1")));
        fences.create(&PostParams::default(), &holder).await.expect("a LeaderFence naming the holder's pod");

        let ns = TestNamespace::new(prefix).await;
        let foo = create_foo(&ns.api(), "example-foo", "example-foo", Some(1)).await;
        let operator = Api::namespaced(operator_in(HOLDER_POD).await, &ns.name);
        let confined = Confined { ns, foo, operator, _lease: lease, _alone: alone };
        // In effect once the API server refuses what only the confinement
        // refuses, and admits the holder's own writes.
        wait_until("the confinement in effect, the holder's writes admitted", IN_EFFECT, || async {
            let theirs = confined.operator.create(&dry_run(), &unowned("in-effect")).await;
            let own = confined.operator.create(&dry_run(), &confined.as_the_operator_builds_it()).await;
            (is_confinement_refusal(&theirs, "") && own.is_ok()).then_some(())
        })
        .await;
        confined
    }

    /// The Deployment the operator creates for the Foo: the crate's own
    /// builder, as a sync calls it.
    fn as_the_operator_builds_it(&self) -> Deployment {
        desired_deployment(&self.foo, UNSHARDED).expect("a Foo with a uid and a deploymentName")
    }

    /// The Foo's Deployment, created by the operator (as the ServiceAccount).
    async fn owned(&self) -> Deployment {
        let created = self.operator.create(&PostParams::default(), &self.as_the_operator_builds_it()).await;
        created.expect("the operator creates its Foo's Deployment")
    }

    /// A Deployment no Foo controls, made by an admin.
    async fn unowned(&self, name: &str) -> Deployment {
        let admin: Api<Deployment> = self.ns.api();
        admin.create(&PostParams::default(), &unowned(name)).await.expect("an admin creates a Deployment")
    }
}

fn dry_run() -> PostParams {
    PostParams { dry_run: true, ..PostParams::default() }
}

/// A Deployment of someone else's: no owner, its own image.
fn unowned(name: &str) -> Deployment {
    serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": { "replicas": 0, "selector": { "matchLabels": { "app": name } },
            "template": { "metadata": { "labels": { "app": name } },
                "spec": { "containers": [{ "name": "c", "image": "busybox:1" }] } } }
    }))
    .unwrap()
}

/// Whether `result` is this policy's refusal, the API server's 403 whose
/// message names the policy and says `reason`.
fn is_confinement_refusal<T>(result: &kube::Result<T>, reason: &str) -> bool {
    matches!(result, Err(kube::Error::Api(s)) if s.code == 403
        && s.message.contains(&format!("ValidatingAdmissionPolicy '{POLICY}'"))
        && s.message.contains(reason))
}

/// `result` must be this policy's refusal for `reason`.
#[track_caller]
fn assert_refused<T: std::fmt::Debug>(result: &kube::Result<T>, reason: &str) {
    assert!(is_confinement_refusal(result, reason), "expected a 403 of {POLICY} saying {reason:?}, got {result:?}");
}

/// The merge patch a sync makes (src/reconcile/decision.rs), conditional on `d` as
/// read.
fn operator_patch(
    d: &Deployment,
    replicas: Option<i32>,
    adopt: bool,
    relabel: &[(&str, Option<&str>)],
) -> serde_json::Value {
    let patch = DeploymentPatch {
        name: d.name_any(),
        uid: d.uid(),
        resource_version: d.resource_version(),
        replicas,
        adopt,
        relabel: relabel.iter().map(|(k, v)| ((*k).to_owned(), v.map(str::to_owned))).collect(),
    };
    patch.body()
}

/// The operator's merge patch built by `patch` from the Deployment `name`
/// as read now, sent as the operator from the holder's pod; built and sent
/// again while the API server answers Conflict (the Deployment controller
/// writes the Deployment meanwhile), as a sync tries again from its newer
/// copy. A write must reach admission to be judged: the API server checks a
/// patch's resourceVersion first, so a patch from a stale copy is a 409
/// whoever sends it.
async fn patched_from_current(
    confined: &Confined,
    name: &str,
    patch: impl Fn(&Deployment) -> serde_json::Value,
) -> kube::Result<Deployment> {
    patched_from_current_by(&confined.operator, confined, name, patch).await
}

/// [`patched_from_current`], sent through `by`.
async fn patched_from_current_by(
    by: &Api<Deployment>,
    confined: &Confined,
    name: &str,
    patch: impl Fn(&Deployment) -> serde_json::Value,
) -> kube::Result<Deployment> {
    for _ in 0..10 {
        let current = confined.ns.api::<Deployment>().get(name).await.expect("read the Deployment");
        match by.patch(name, &PatchParams::default(), &Patch::Merge(&patch(&current))).await {
            Err(kube::Error::Api(s)) if s.is_conflict() => continue,
            result => return result,
        }
    }
    panic!("the Deployment {name} changed under ten patches in a row");
}

#[tokio::test]
async fn the_operators_service_account_may_create_a_deployment_as_the_operator_builds_it() {
    let confined = Confined::new("confined-create").await;
    let created = confined.owned().await;
    let containers = &created.spec.unwrap().template.spec.unwrap().containers;
    assert_eq!(containers[0].image.as_deref(), Some(CONTAINER_IMAGE));
}

#[tokio::test]
async fn the_operators_service_account_may_scale_a_deployment_a_foo_controls() {
    let confined = Confined::new("confined-scale").await;
    let d = confined.owned().await;
    let scaled = patched_from_current(&confined, &d.name_any(), |d| operator_patch(d, Some(3), false, &[])).await;
    assert_eq!(replicas(&scaled.expect("the operator scales its Foo's Deployment")), Some(3));
}

#[tokio::test]
async fn the_operators_service_account_may_label_a_deployment_a_foo_controls_as_managed_by_it_and_no_other_label() {
    let confined = Confined::new("confined-relabel").await;
    let d = confined.owned().await;
    // Its managed-by label, what an adoption writes...
    let adopt = |d: &Deployment| operator_patch(d, None, true, &[]);
    let adopted = patched_from_current(&confined, &d.name_any(), adopt).await;
    let labels = adopted.expect("the operator labels its Foo's Deployment as managed by it").labels().clone();
    assert_eq!(labels.get(LABEL_MANAGED_BY).map(String::as_str), Some(LABEL_MANAGED_BY_VALUE));
    // ...but no label deploy/'s operator does not own: it follows no shard.
    let shard = |d: &Deployment| operator_patch(d, None, false, &[("shard", Some("a"))]);
    let refused = patched_from_current(&confined, &d.name_any(), shard).await;
    assert_refused(&refused, "this sets metadata.labels.shard=a");
    let other_manager = |d: &Deployment| operator_patch(d, None, false, &[(LABEL_MANAGED_BY, Some("someone-else"))]);
    let refused = patched_from_current(&confined, &d.name_any(), other_manager).await;
    assert_refused(&refused, &format!("this sets metadata.labels.{LABEL_MANAGED_BY}=someone-else"));
    let unmanaged = |d: &Deployment| operator_patch(d, None, false, &[(LABEL_MANAGED_BY, None)]);
    let refused = patched_from_current(&confined, &d.name_any(), unmanaged).await;
    assert_refused(&refused, &format!("this sets metadata.labels.{LABEL_MANAGED_BY}=(removed)"));
}

/// The confinement as artifacts/shards patches it: its first variable
/// lists the label the shards follow.
struct ShardsPolicy;

impl ShardsPolicy {
    fn new() -> Self {
        let policy = kubectl_ok(&["kustomize", "artifacts/shards/shared"]);
        let shards_policy = policy
            .split("\n---\n")
            .find(|doc| doc.contains("kind: ValidatingAdmissionPolicy\n") && doc.contains(&format!("name: {POLICY}\n")))
            .expect("artifacts/shards' confinement policy")
            .to_owned();
        assert!(shards_policy.contains(r#"'["shard"]'"#) || shards_policy.contains(r#"["shard"]"#), "{shards_policy}");
        let file = scratch("shards-policy.yaml");
        std::fs::write(&file, shards_policy).unwrap();
        kubectl_ok(&["apply", "-f", &file]);
        ShardsPolicy
    }
}

impl Drop for ShardsPolicy {
    fn drop(&mut self) {
        kubectl(&["apply", "-f", "deploy/13-deployment-writes-policy.yaml"]);
    }
}

#[tokio::test]
async fn under_the_shards_layout_the_operators_service_account_may_set_and_remove_the_shard_label() {
    let confined = Confined::new("confined-shard-label").await;
    let d = confined.owned().await;
    let _shards = ShardsPolicy::new();
    let shard_a = |d: &Deployment| operator_patch(d, None, true, &[("shard", Some("a"))]);
    let relabelled = wait_until("artifacts/shards' policy in effect", IN_EFFECT, || async {
        patched_from_current(&confined, &d.name_any(), shard_a).await.ok()
    })
    .await;
    assert_eq!(relabelled.labels().get("shard").map(String::as_str), Some("a"));
    let no_shard = |d: &Deployment| operator_patch(d, None, false, &[("shard", None)]);
    let relabelled = patched_from_current(&confined, &d.name_any(), no_shard).await;
    assert!(!relabelled.expect("the operator removes a shard label").labels().contains_key("shard"));
    let other = |d: &Deployment| operator_patch(d, None, false, &[("team", Some("a"))]);
    assert_refused(&patched_from_current(&confined, &d.name_any(), other).await, "this sets metadata.labels.team=a");
}

#[tokio::test]
async fn the_operators_service_account_may_delete_a_deployment_a_foo_controls() {
    let confined = Confined::new("confined-delete").await;
    let d = confined.owned().await;
    // As a sync deletes a Foo's Deployment under a former name
    // (src/reconcile/sync.rs): in the background, only this very object.
    let dp = DeleteParams {
        preconditions: Some(Preconditions { uid: d.uid(), resource_version: None }),
        ..DeleteParams::background()
    };
    confined.operator.delete(&d.name_any(), &dp).await.expect("the operator deletes its Foo's Deployment");
}

/// A merge patch giving a Deployment's pod another image.
fn another_template() -> serde_json::Value {
    json!({ "spec": { "template": { "spec": {
        "containers": [{ "name": "nginx", "image": "registry.example.com/not-nginx:1" }] } } } })
}

#[tokio::test]
async fn the_operators_service_account_may_not_change_the_pod_template_of_a_deployment_a_foo_controls() {
    let confined = Confined::new("confined-template").await;
    let d = confined.owned().await;
    let template = another_template();
    let patched = confined.operator.patch(&d.name_any(), &PatchParams::default(), &Patch::Merge(&template)).await;
    assert_refused(&patched, "may only change a Deployment's metadata.labels and spec.replicas, not spec.template");
    // Nor its ownerReferences, even along with a change it may make.
    let disowned = |d: &Deployment| {
        let mut patch = operator_patch(d, Some(2), false, &[]);
        patch["metadata"]["ownerReferences"] = json!(null);
        patch
    };
    let patched = patched_from_current(&confined, &d.name_any(), disowned).await;
    assert_refused(&patched, "not metadata.ownerReferences");
}

#[tokio::test]
async fn the_operators_service_account_may_not_scale_or_relabel_a_deployment_no_foo_controls() {
    let confined = Confined::new("confined-unowned-patch").await;
    confined.unowned("theirs").await;
    let scale = |d: &Deployment| operator_patch(d, Some(3), false, &[]);
    let relabel = |d: &Deployment| operator_patch(d, None, true, &[("shard", Some("a"))]);
    for patched in [
        patched_from_current(&confined, "theirs", scale).await,
        patched_from_current(&confined, "theirs", relabel).await,
    ] {
        assert_refused(&patched, "may only update a Deployment that has a controller ownerReference to a Foo");
    }
}

#[tokio::test]
async fn the_operators_service_account_may_not_delete_a_deployment_no_foo_controls() {
    let confined = Confined::new("confined-unowned-delete").await;
    confined.unowned("theirs").await;
    let deleted = confined.operator.delete("theirs", &DeleteParams::background()).await;
    assert_refused(&deleted, "may only delete a Deployment that has a controller ownerReference to a Foo");
    assert!(deployment(&confined.ns, "theirs").await.is_some(), "refused, yet deleted");
}

#[tokio::test]
async fn the_operators_service_account_may_not_create_a_deployment_no_foo_controls() {
    let confined = Confined::new("confined-unowned-create").await;
    let created = confined.operator.create(&PostParams::default(), &unowned("theirs")).await;
    assert_refused(&created, "may only create a Deployment with a controller ownerReference to a Foo");
    // Nor the operator's own template without its owner.
    let mut orphan = confined.as_the_operator_builds_it();
    orphan.metadata.owner_references = None;
    let created = confined.operator.create(&PostParams::default(), &orphan).await;
    assert_refused(&created, "may only create a Deployment with a controller ownerReference to a Foo");
}

#[tokio::test]
async fn the_operators_service_account_may_not_create_a_deployment_of_another_image_under_a_made_up_foo() {
    let confined = Confined::new("confined-made-up-owner").await;
    let mut d = made_up_foos(&confined);
    let pod = d.spec.as_mut().unwrap().template.spec.as_mut().unwrap();
    pod.containers[0].image = Some("registry.example.com/not-nginx:1".into());
    let created = confined.operator.create(&PostParams::default(), &d).await;
    assert_refused(&created, "may only create a Deployment of one container, nginx, of image nginx:latest");
}

/// The operator's Deployment for a Foo that does not exist (admission
/// does not look owners up), as a stolen token would make one.
fn made_up_foos(confined: &Confined) -> Deployment {
    let mut made_up = confined.foo.clone();
    made_up.metadata.name = Some("made-up".into());
    made_up.metadata.uid = Some("00000000-0000-4000-8000-00000000f00f".into());
    made_up.spec.deployment_name = "made-up".into();
    desired_deployment(&made_up, UNSHARDED).unwrap()
}

#[tokio::test]
async fn the_operators_service_account_may_not_create_more_replicas_than_a_foo_may_ask_for_even_under_a_made_up_foo() {
    let confined = Confined::new("confined-replicas").await;
    let mut d = made_up_foos(&confined);
    let admitted = confined.operator.create(&dry_run(), &d).await;
    assert!(admitted.is_ok(), "a made-up owner buys one nginx Deployment of a Foo's bounds: {admitted:?}");
    for replicas in [11, 100_000, 0] {
        d.spec.as_mut().unwrap().replicas = Some(replicas);
        let created = confined.operator.create(&dry_run(), &d).await;
        assert_refused(
            &created,
            &format!(
                "may only create a Deployment of 1 to 10 replicas, a Foo's bounds; this one sets spec.replicas={replicas}"
            ),
        );
    }
}

#[tokio::test]
async fn the_operators_service_account_may_not_create_a_deployment_with_resources_finalizers_annotations_or_other_defaults()
 {
    let confined = Confined::new("confined-values").await;
    // Each: what the refusal names, and where the field is set (its
    // parent, as a JSON pointer, its key and its value).
    let pod = "/spec/template/spec";
    let nginx = "/spec/template/spec/containers/0";
    let cases = [
        (
            "spec.template.spec.containers[nginx].resources={requests}",
            nginx,
            "resources",
            json!({ "requests": { "cpu": "64", "memory": "256Gi" } }),
        ),
        ("metadata.finalizers=[example.com/keep]", "/metadata", "finalizers", json!(["example.com/keep"])),
        ("metadata.annotations={note}", "/metadata", "annotations", json!({ "note": "x" })),
        ("metadata.labels.team=a", "/metadata/labels", "team", json!("a")),
        ("spec.template.spec.terminationGracePeriodSeconds=86400", pod, "terminationGracePeriodSeconds", json!(86400)),
        ("spec.template.spec.dnsPolicy=Default", pod, "dnsPolicy", json!("Default")),
        ("spec.template.spec.containers[nginx].imagePullPolicy=Never", nginx, "imagePullPolicy", json!("Never")),
        ("spec.revisionHistoryLimit=100000", "/spec", "revisionHistoryLimit", json!(100_000)),
    ];
    for (named, parent, key, value) in cases {
        let mut d = serde_json::to_value(made_up_foos(&confined)).unwrap();
        d.pointer_mut(parent).unwrap_or_else(|| panic!("{parent}"))[key] = value;
        let created = confined.operator.create(&dry_run(), &serde_json::from_value(d).unwrap()).await;
        assert_refused(
            &created,
            &format!("may only create a Deployment as the operator builds it; this one sets {named}"),
        );
    }
}

#[tokio::test]
async fn the_operators_service_account_may_not_scale_a_deployment_a_foo_controls_beyond_a_foos_bounds() {
    let confined = Confined::new("confined-scale-bounds").await;
    let d = confined.owned().await;
    for replicas in [11, 100_000, 0] {
        let scale = |d: &Deployment| operator_patch(d, Some(replicas), false, &[]);
        let scaled = patched_from_current(&confined, &d.name_any(), scale).await;
        assert_refused(
            &scaled,
            &format!(
                "may only scale a Deployment to 1 to 10 replicas, a Foo's bounds; this sets spec.replicas={replicas}"
            ),
        );
    }
}

#[tokio::test]
async fn the_operators_service_account_may_not_create_a_foo_deployment_with_host_access_a_command_or_another_account() {
    let confined = Confined::new("confined-host").await;
    let mut d = confined.as_the_operator_builds_it();
    let mut pod = serde_json::to_value(d.spec.as_ref().unwrap().template.spec.as_ref().unwrap()).unwrap();
    pod["hostPID"] = json!(true);
    pod["serviceAccountName"] = json!("default");
    pod["volumes"] = json!([{ "name": "root", "hostPath": { "path": "/" } }]);
    pod["containers"][0]["command"] = json!(["sh", "-c", "cat /host/etc/shadow"]);
    pod["containers"][0]["securityContext"] = json!({ "capabilities": { "add": ["SYS_ADMIN"] } });
    d.spec.as_mut().unwrap().template.spec = Some(serde_json::from_value(pod).unwrap());
    let created = confined.operator.create(&PostParams::default(), &d).await;
    assert_refused(&created, "may only create a Deployment as the operator builds it; this one sets");
    let Err(kube::Error::Api(refusal)) = &created else { unreachable!() };
    for field in [
        "spec.template.spec.hostPID",
        "spec.template.spec.serviceAccountName",
        "spec.template.spec.volumes",
        "spec.template.spec.containers[nginx].command",
        "spec.template.spec.containers[nginx].securityContext",
    ] {
        assert!(refusal.message.contains(field), "the refusal does not name {field}: {}", refusal.message);
    }
}

/// Other users' Deployment writes pass: an admin's (`system:masters`), a
/// namespace editor's (`edit`), and a ServiceAccount's of another name run
/// with `edit` there; each changes a Foo's Deployment's template, and
/// creates and deletes a Deployment of its own.
#[tokio::test]
async fn other_users_writes_to_deployments_are_not_confined() {
    let confined = Confined::new("confined-others").await;
    let d = confined.owned().await;
    let template = another_template();
    let ns = &confined.ns;
    ns.kubectl_ok(&["create", "serviceaccount", "builder"]);
    ns.kubectl_ok(&[
        "create",
        "rolebinding",
        "builder-edit",
        "--clusterrole=edit",
        &format!("--serviceaccount={}:builder", ns.name),
    ]);
    let users = [
        ("an admin", ns.client.clone()),
        ("an edit user", common::tenant::tenant_of(ns).await),
        ("another ServiceAccount", service_account_client(&ns.name, "builder").await),
    ];
    for (who, client) in users {
        let api: Api<Deployment> = Api::namespaced(client, &ns.name);
        // RBAC may take a moment to see the new binding.
        wait_until(&format!("{who}'s patch of a Foo's Deployment"), IN_EFFECT, || async {
            api.patch(&d.name_any(), &PatchParams::default(), &Patch::Merge(&template)).await.ok()
        })
        .await;
        let theirs = format!("theirs-{}", who.to_lowercase().replace(' ', "-"));
        api.create(&PostParams::default(), &unowned(&theirs)).await.unwrap_or_else(|e| panic!("{who}'s create: {e}"));
        api.delete(&theirs, &DeleteParams::background()).await.unwrap_or_else(|e| panic!("{who}'s delete: {e}"));
    }
}

#[tokio::test]
async fn the_leader_fence_still_refuses_the_operators_own_writes_from_a_pod_that_does_not_hold_the_lease() {
    let confined = Confined::new("confined-fence").await;
    let standby: Api<Deployment> = Api::namespaced(operator_in(STANDBY_POD).await, &confined.ns.name);
    let fence = format!("ValidatingAdmissionPolicy '{}'", sample_controller::testing::api::FENCE_POLICY);
    let by_the_fence = |what: &str, result: kube::Result<Deployment>| match result {
        Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains(&fence) => {}
        other => panic!("{what} from the standby's pod: expected the fence's refusal, got {other:?}"),
    };
    // The fence follows the LeaderFence through an informer: in effect
    // within milliseconds of its write.
    let ours = confined.as_the_operator_builds_it();
    wait_until("the fence to refuse the standby's pod", IN_EFFECT, || async {
        let created = standby.create(&dry_run(), &ours).await;
        matches!(&created, Err(kube::Error::Api(s)) if s.message.contains(&fence)).then_some(())
    })
    .await;
    by_the_fence("a create", standby.create(&PostParams::default(), &ours).await);
    // The holder's same writes pass both policies.
    let d = confined.owned().await;
    let scale = |d: &Deployment| operator_patch(d, Some(2), false, &[]);
    by_the_fence("a scale", patched_from_current_by(&standby, &confined, &d.name_any(), scale).await);
    let scaled = patched_from_current(&confined, &d.name_any(), scale).await;
    assert_eq!(replicas(&scaled.expect("the holder's scale")), Some(2));
}

/// deploy/ applied through a kustomize overlay that moves it to another
/// namespace and prefixes its names, as a user's first customization does;
/// deleted again when dropped, and deploy/'s own bindings off meanwhile, so
/// that only the overlay's policies judge. The overlay leaves out the
/// LeaderFence CRD (kustomize prefixes no CRD's name: it is deploy/'s own,
/// installed already): deleting it with the overlay would delete every
/// LeaderFence on the plane under the other suites' leaders running beside.
struct Overlaid {
    dir: String,
}

/// The overlay's patch leaving deploy/'s LeaderFence CRD out.
const WITHOUT_FENCE_CRD: &str = "patches:
- patch: |-
    $patch: delete
    apiVersion: apiextensions.k8s.io/v1
    kind: CustomResourceDefinition
    metadata:
      name: leaderfences.samplecontroller.k8s.io
";

/// The overlay's namespace, prefix and ServiceAccount.
const OVERLAY_NS: &str = "confined-overlay-ops";
const OVERLAY_PREFIX: &str = "x-";
const OVERLAY_SA: &str = "x-sample-controller";

impl Overlaid {
    fn new() -> Self {
        // In the repository, where `../../deploy` is deploy/; this plane's own.
        let dir = format!(".local/test-overlay-{}", std::env::var("KUBE_MINOR").unwrap_or_default());
        std::fs::create_dir_all(&dir).unwrap();
        let kustomization = format!(
            "resources: [../../deploy]\nnamespace: {OVERLAY_NS}\nnamePrefix: {OVERLAY_PREFIX}\n{WITHOUT_FENCE_CRD}"
        );
        std::fs::write(format!("{dir}/kustomization.yaml"), kustomization).unwrap();
        kubectl_ok(&[
            "delete",
            "-f",
            "deploy/12-leader-fence-binding.yaml",
            "-f",
            "deploy/14-deployment-writes-binding.yaml",
        ]);
        kubectl_ok(&["apply", "-k", &dir]);
        Overlaid { dir }
    }
}

impl Drop for Overlaid {
    fn drop(&mut self) {
        kubectl(&["delete", "-k", &self.dir, "--wait=false"]);
        kubectl(&[
            "apply",
            "-f",
            "deploy/12-leader-fence-binding.yaml",
            "-f",
            "deploy/14-deployment-writes-binding.yaml",
        ]);
    }
}

/// A client acting as the overlay's ServiceAccount from `pod`.
async fn overlay_operator_in(pod: &str) -> kube::Client {
    let mut cfg = service_account_config(OVERLAY_NS, OVERLAY_SA).await;
    cfg.auth_info.impersonate_user_extra =
        Some([("authentication.kubernetes.io/pod-name".to_owned(), vec![pod.to_owned()])].into());
    kube::Client::try_from(cfg).expect("client")
}

#[tokio::test]
async fn deploy_under_an_overlay_of_another_namespace_and_a_name_prefix_confines_and_fences_as_deploy_does() {
    let confined = Confined::new("confined-overlay").await;
    let overlaid = Overlaid::new();
    // The overlay's leader, named in the overlay's LeaderFence (in its
    // namespace, after --leader-election-id, which the overlay keeps).
    let holder = format!("{OVERLAY_PREFIX}sample-controller-5c9d8f7b6-holdr");
    let fences: Api<LeaderFence> = Api::namespaced(admin_client().await, OVERLAY_NS);
    wait_until("the overlay's namespace", IN_EFFECT, || async {
        let fence = LeaderFence::new(DEPLOY_LEASE, naming_leader(&format!("{holder}_1")));
        fences.create(&PostParams::default(), &fence).await.ok()
    })
    .await;
    let ns = &confined.ns.name;
    let operator: Api<Deployment> = Api::namespaced(overlay_operator_in(&holder).await, ns);
    let bare: Api<Deployment> = Api::namespaced(overlay_operator_in("evil").await, ns);
    let policy = |name: &str| format!("ValidatingAdmissionPolicy '{OVERLAY_PREFIX}{name}'");
    let by = |result: &kube::Result<Deployment>, name: &str, reason: &str| matches!(result, Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains(&policy(name)) && s.message.contains(reason));
    let mut too_many = made_up_foos(&confined);
    too_many.spec.as_mut().unwrap().replicas = Some(100_000);
    wait_until("the overlay's confinement and fence in effect", IN_EFFECT, || async {
        let refused = operator.create(&dry_run(), &too_many).await;
        let fenced = bare.create(&dry_run(), &confined.as_the_operator_builds_it()).await;
        let admitted = operator.create(&dry_run(), &confined.as_the_operator_builds_it()).await;
        (by(&refused, POLICY, "spec.replicas=100000")
            && by(&fenced, sample_controller::testing::api::FENCE_POLICY, "pod evil holds no Lease")
            && admitted.is_ok())
        .then_some(())
    })
    .await;
    // A Deployment no Foo owns: its template not patched, as on deploy/.
    confined.unowned("theirs").await;
    let template = another_template();
    let patched = operator.patch("theirs", &PatchParams::default(), &Patch::Merge(&template)).await;
    assert!(
        by(&patched, POLICY, "may only update a Deployment that has a controller ownerReference to a Foo"),
        "{patched:?}"
    );
    // The Foo's own Deployment: scaled within a Foo's bounds, not beyond.
    let d = confined.owned().await;
    let scale = |replicas| move |d: &Deployment| operator_patch(d, Some(replicas), false, &[]);
    let refused = patched_from_current_by(&operator, &confined, &d.name_any(), scale(100_000)).await;
    assert!(by(&refused, POLICY, "this sets spec.replicas=100000"), "{refused:?}");
    let scaled = patched_from_current_by(&operator, &confined, &d.name_any(), scale(3)).await;
    assert_eq!(replicas(&scaled.expect("the overlay's leader scales its Foo's Deployment")), Some(3));
    drop(overlaid);
}
