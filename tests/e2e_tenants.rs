//! A tenant cannot make the operator's memory grow with what it writes: a
//! user with the built-in `edit` role in one namespace (which
//! deploy/10-foo-roles.yaml extends to Foos) fills Foos with finalizers and
//! Deployments with annotations, as much as the API server takes. The
//! caches keep only what a sync reads of each object, and the adoption pass
//! decodes its list as it streams in (src/cache.rs, src/adoption.rs), so
//! two replicas watching every namespace hold no more at their peak than
//! without those objects, and the takeover between them completes.
//!
//! Its operators watch every namespace, so this binary runs alone
//! (.config/nextest.toml).

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use sample_controller::constants::{LABEL_MANAGED_BY, LABEL_MANAGED_BY_VALUE};
use sample_controller::{Foo, FooSpec};
use serde_json::json;

/// Foos, each with about [`FINALIZER_BYTES`] of finalizer names.
const HOSTILE_FOOS: usize = 150;
const FINALIZER_BYTES: usize = 1 << 20;
/// Deployments with [`ANNOTATION_BYTES`] of annotations each, half of them
/// labelled as ours (so the operator's watch sees them), half not (so the
/// adoption pass lists them).
const HOSTILE_DEPLOYMENTS: usize = 300;
/// The API server's limit on all of an object's annotations is 256 KiB.
const ANNOTATION_BYTES: usize = 250 * 1024;
/// How much higher a replica's peak may be than without those objects
/// (about 225 MiB of content in all): the objects as cached (150 Foos and
/// 450 Deployments, a few hundred bytes each), the buffers that grow to the
/// largest event and response seen and stay grown (the watch's line buffer,
/// the pooled connections' read buffers: the leader's sixteen workers
/// received two-megabyte status write responses), and allocator slack.
/// Measured: the leader +16.0 to +16.4 MiB, the standby +6.5; before the
/// caches and the adoption pass read only what they keep, +321 and +264.
const MARGIN_MIB: f64 = 20.0;
/// Objects the tenant creates at once.
const CONCURRENCY: usize = 8;
/// A Foo's sync may wait for a worker behind the tenant's Foos, each of
/// whose status writes the API server takes a second or more over.
const CONVERGED_WITHIN: Duration = Duration::from_secs(180);

/// The most memory `op` has held since it started (VmHWM), in MiB.
fn peak_mib(op: &Operator) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", op.child.id())).expect("the operator's status");
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status");
    kib / 1024.0
}

/// A client acting as `user`, authenticated, with no group of note.
async fn user_client(user: &str) -> kube::Client {
    let mut cfg = config().await;
    cfg.auth_info.impersonate = Some(user.into());
    cfg.auth_info.impersonate_groups = Some(vec!["system:authenticated".into()]);
    kube::Client::try_from(cfg).expect("client")
}

/// The user `tenant-<ns>`, given `edit` in `ns` alone, and a client as it.
async fn tenant_of(ns: &TestNamespace) -> kube::Client {
    kubectl_ok(&["apply", "-f", "deploy/10-foo-roles.yaml"]);
    let user = format!("tenant-{}", ns.name);
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": { "name": "tenant-edit" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit" },
        "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user }],
    }))
    .unwrap();
    ns.api::<RoleBinding>().create(&PostParams::default(), &binding).await.expect("bind edit");
    user_client(&user).await
}

/// A Foo whose finalizers take about [`FINALIZER_BYTES`], in names as long
/// as the API server takes (a 253-character domain, a 63-character name):
/// the fewer entries, the less work for the API server, the same bytes.
fn finalized_foo(i: usize) -> Foo {
    let mut foo = Foo::new(&format!("hoard-{i}"), FooSpec { deployment_name: format!("hoard-{i}"), replicas: Some(1) });
    let domain = ["a", "b", "c"].map(|l| l.repeat(63)).join(".") + "." + &"d".repeat(61);
    let finalizer = |n: usize| format!("{domain}/{}{n:06}", "f".repeat(57));
    let count = FINALIZER_BYTES / finalizer(0).len();
    foo.metadata.finalizers = Some((0..count).map(finalizer).collect());
    foo
}

/// A Deployment of no one's, with [`ANNOTATION_BYTES`] of annotations, and
/// our managed-by label if `labelled`.
fn annotated_deployment(i: usize, labelled: bool) -> Deployment {
    let labels = if labelled { json!({ LABEL_MANAGED_BY: LABEL_MANAGED_BY_VALUE }) } else { json!({}) };
    let pods = json!({ "app": format!("bulk-{i}") });
    serde_json::from_value(json!({
        "metadata": {
            "name": format!("bulk-{i}"),
            "labels": labels,
            "annotations": { "tenant.example.com/notes": "n".repeat(ANNOTATION_BYTES) },
        },
        "spec": {
            "replicas": 0,
            "selector": { "matchLabels": pods },
            "template": {
                "metadata": { "labels": pods },
                "spec": { "containers": [{ "name": "app", "image": "nginx:latest" }] },
            },
        },
    }))
    .unwrap()
}

/// As the tenant: the Foos and the Deployments, [`CONCURRENCY`] at a time.
async fn hoard(tenant: kube::Client, ns: &str) {
    use futures::StreamExt;
    let (foos, deployments): (Api<Foo>, Api<Deployment>) =
        (Api::namespaced(tenant.clone(), ns), Api::namespaced(tenant, ns));
    let pp = PostParams::default();
    futures::stream::iter(0..HOSTILE_FOOS)
        .map(|i| {
            let (foos, pp) = (&foos, &pp);
            async move { foos.create(pp, &finalized_foo(i)).await.map(drop) }
        })
        .buffer_unordered(CONCURRENCY)
        .for_each(|r| async { r.expect("the tenant may create a Foo") })
        .await;
    futures::stream::iter(0..HOSTILE_DEPLOYMENTS)
        .map(|i| {
            let (deployments, pp) = (&deployments, &pp);
            async move { deployments.create(pp, &annotated_deployment(i, i % 2 == 0)).await.map(drop) }
        })
        .buffer_unordered(CONCURRENCY)
        .for_each(|r| async { r.expect("the tenant may create a Deployment") })
        .await;
}

/// Two replicas watching every namespace with streaming lists, as deploy/
/// runs them, contend for a Lease in `lease_ns`; `meanwhile` runs once one
/// leads (the tenant at work); once a Foo in `control` converges, the
/// leader is stopped and the standby must take over and converge another.
/// Each replica's peak memory, leader first.
async fn two_replicas_and_a_takeover(
    lease_ns: &TestNamespace,
    control: &TestNamespace,
    run: &str,
    meanwhile: impl Future<Output = ()>,
) -> [f64; 2] {
    let mut args = election_args(&lease_ns.name, LEASE);
    args.push("--streaming-lists".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let kubeconfig = kubeconfig_path();
    let mut ops = Vec::new();
    for name in ["a", "b"] {
        let log = format!("{}-{run}-{name}", lease_ns.name);
        ops.push(start_logged(cluster_wide_command(&kubeconfig, &args), &log).await);
    }
    let ops: [Operator; 2] = ops.try_into().unwrap_or_else(|_| unreachable!("two replicas"));
    let leader = one_leader(&[&ops[0], &ops[1]]).await;
    let [first, second] = ops;
    let (mut leader_op, standby_op) = if leader == 0 { (first, second) } else { (second, first) };
    meanwhile.await;
    converges(control, &format!("{run}-before")).await;
    let leader_peak = peak_mib(&leader_op);
    signal(&leader_op, "-TERM");
    exited_within(&mut leader_op, Duration::from_secs(10), "the leader to hand over and exit").await;
    wait_until("the standby to lead", TIMEOUT, || async {
        (metric(&standby_op, LEADER_SERIES).await? == 1.0).then_some(())
    })
    .await;
    // Its syncs wait for its adoption pass: a new Foo converging means the
    // pass is through.
    converges(control, &format!("{run}-after")).await;
    let standby_peak = peak_mib(&standby_op);
    // Handed over, so that the next pair finds the Lease released.
    let mut new_leader = standby_op;
    signal(&new_leader, "-TERM");
    exited_within(&mut new_leader, Duration::from_secs(10), "the new leader to hand over and exit").await;
    [leader_peak, standby_peak]
}

/// A new Foo in `control` gets its Deployment and its status for its
/// generation: the operator did its part (its pods are the plane's, slow
/// while it runs the tenant's too).
async fn converges(control: &TestNamespace, name: &str) {
    let foos = control.api::<Foo>();
    create_foo(&foos, name, name, Some(1)).await;
    wait_until(&format!("Foo {name} to converge"), CONVERGED_WITHIN, || async {
        let foo = foos.get(name).await.ok()?;
        let synced = foo.status?.observed_generation == foo.metadata.generation;
        (synced && deployment(control, name).await.is_some()).then_some(())
    })
    .await;
}

/// The tenant's namespace: when dropped, whichever way the test ends, its
/// Foos' finalizers are taken off and it is deleted, so that it goes.
struct TenantNamespace(TestNamespace);

impl Drop for TenantNamespace {
    fn drop(&mut self) {
        let (ns, kubeconfig) = (&self.0.name, kubeconfig_path());
        let unfinalize = r#"{"metadata":{"finalizers":null}}"#;
        let script = format!(
            "kubectl --kubeconfig {kubeconfig} -n {ns} get foos -o name | \
             xargs -r -n1 kubectl --kubeconfig {kubeconfig} -n {ns} patch --type=merge -p '{unfinalize}'"
        );
        let _ = std::process::Command::new("sh").args(["-c", &script]).status();
    }
}

/// Take the tenant's finalizers off and wait until its namespace is gone,
/// so that later tests' operators do not cache what it left.
async fn remove(tenant_ns: TenantNamespace) {
    let admin = admin_client().await;
    let foos: Api<Foo> = Api::namespaced(admin.clone(), &tenant_ns.0.name);
    let unfinalize = json!({ "metadata": { "finalizers": null } });
    for foo in foos.list_metadata(&ListParams::default()).await.expect("list Foos").items {
        let name = foo.metadata.name.unwrap_or_default();
        foos.patch(&name, &PatchParams::default(), &Patch::Merge(&unfinalize)).await.expect("remove finalizers");
    }
    let name = tenant_ns.0.name.clone();
    drop(tenant_ns);
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin);
    wait_for(&namespaces, &name, "the tenant's namespace to be gone", GC_TIMEOUT, |ns: Option<&_>| ns.is_none()).await;
}

#[tokio::test]
async fn a_tenants_finalizers_and_annotations_leave_both_replicas_peak_memory_where_it_was() {
    let (lease_ns, control) = (TestNamespace::new("tenants-lease").await, TestNamespace::new("tenants-control").await);
    let baseline = two_replicas_and_a_takeover(&lease_ns, &control, "baseline", async {}).await;

    let tenant_ns = TenantNamespace(TestNamespace::new("tenant").await);
    let tenant = tenant_of(&tenant_ns.0).await;
    let hoarded = two_replicas_and_a_takeover(&lease_ns, &control, "hoarded", hoard(tenant, &tenant_ns.0.name)).await;
    remove(tenant_ns).await;

    println!("peak RSS, leader / standby: baseline {baseline:.1?} MiB, with the tenant's objects {hoarded:.1?} MiB");
    for (role, (before, after)) in ["leader", "standby"].iter().zip(baseline.iter().zip(&hoarded)) {
        assert!(
            after - before <= MARGIN_MIB,
            "the {role}'s peak grew from {before:.1} to {after:.1} MiB with the tenant's objects (at most +{MARGIN_MIB} MiB)"
        );
    }
}
