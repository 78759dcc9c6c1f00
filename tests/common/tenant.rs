//! A tenant filling what it may write to the API server's limits: a user
//! with the built-in `edit` role in one namespace (which
//! deploy/10-foo-roles.yaml extends to Foos) creates Foos with a megabyte
//! of finalizers each and Deployments with 250 KiB of annotations, some
//! labelled as the operator's. tests/e2e_tenants.rs and tests/e2e_image.rs
//! run the operator through them.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use sample_controller::testing::api::{LABEL_MANAGED_BY, LABEL_MANAGED_BY_VALUE};
use sample_controller::{Foo, FooSpec};
use serde_json::json;

use super::{GC_TIMEOUT, TestNamespace, admin_client, config, create_foo, deployment, kubeconfig_path, kubectl_ok};
use super::{wait_for, wait_until};

/// How much the tenant writes: Foos, each with about [`FINALIZER_BYTES`] of
/// finalizer names, and Deployments with [`ANNOTATION_BYTES`] of
/// annotations each, half of them labelled as ours (so the operator's watch
/// sees them), half not (so the adoption pass lists them).
#[derive(Clone, Copy, Debug)]
pub struct Hoard {
    pub foos: usize,
    pub deployments: usize,
}

impl Hoard {
    /// About 225 MiB of content: past deploy/'s memory limit of 128 MiB, had
    /// the operator kept it (tests/e2e_image.rs).
    pub const PAST_THE_LIMIT: Hoard = Hoard { foos: 150, deployments: 300 };
    /// A third of it, about 75 MiB: still several times the growth a test
    /// allows (tests/e2e_tenants.rs), in a third of the API server's time.
    pub const A_THIRD: Hoard = Hoard { foos: 50, deployments: 100 };
}

pub const FINALIZER_BYTES: usize = 1 << 20;
/// The API server's limit on all of an object's annotations is 256 KiB.
pub const ANNOTATION_BYTES: usize = 250 * 1024;
/// Objects the tenant creates at once.
pub const CONCURRENCY: usize = 8;
/// A Foo's sync may wait for a worker behind the tenant's Foos, each of
/// whose status writes the API server takes a second or more over.
pub const CONVERGED_WITHIN: Duration = Duration::from_secs(180);

/// A client acting as `user`, authenticated, with no group of note.
async fn user_client(user: &str) -> kube::Client {
    let mut cfg = config().await;
    cfg.auth_info.impersonate = Some(user.into());
    cfg.auth_info.impersonate_groups = Some(vec!["system:authenticated".into()]);
    kube::Client::try_from(cfg).expect("client")
}

/// The user `tenant-<ns>`, given `edit` in `ns` alone, and a client as it.
pub async fn tenant_of(ns: &TestNamespace) -> kube::Client {
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
pub fn finalized_foo(i: usize) -> Foo {
    let mut foo = Foo::new(&format!("hoard-{i}"), FooSpec { deployment_name: format!("hoard-{i}"), replicas: Some(1) });
    let domain = ["a", "b", "c"].map(|l| l.repeat(63)).join(".") + "." + &"d".repeat(61);
    let finalizer = |n: usize| format!("{domain}/{}{n:06}", "f".repeat(57));
    let count = FINALIZER_BYTES / finalizer(0).len();
    foo.metadata.finalizers = Some((0..count).map(finalizer).collect());
    foo
}

/// A Deployment of no one's, with [`ANNOTATION_BYTES`] of annotations, and
/// our managed-by label if `labelled`.
pub fn annotated_deployment(i: usize, labelled: bool) -> Deployment {
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

/// As the tenant: `how_much`'s Foos and Deployments, [`CONCURRENCY`] at a
/// time.
pub async fn hoard(tenant: kube::Client, ns: &str, how_much: Hoard) {
    use futures::StreamExt;
    let (foos, deployments): (Api<Foo>, Api<Deployment>) =
        (Api::namespaced(tenant.clone(), ns), Api::namespaced(tenant, ns));
    let pp = PostParams::default();
    futures::stream::iter(0..how_much.foos)
        .map(|i| {
            let (foos, pp) = (&foos, &pp);
            async move { foos.create(pp, &finalized_foo(i)).await.map(drop) }
        })
        .buffer_unordered(CONCURRENCY)
        .for_each(|r| async { r.expect("the tenant may create a Foo") })
        .await;
    futures::stream::iter(0..how_much.deployments)
        .map(|i| {
            let (deployments, pp) = (&deployments, &pp);
            async move { deployments.create(pp, &annotated_deployment(i, i % 2 == 0)).await.map(drop) }
        })
        .buffer_unordered(CONCURRENCY)
        .for_each(|r| async { r.expect("the tenant may create a Deployment") })
        .await;
}

/// A new Foo in `control` gets its Deployment and its status for its
/// generation: the operator did its part (its pods are the plane's, slow
/// while it runs the tenant's too).
pub async fn converges(control: &TestNamespace, name: &str) {
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
pub struct TenantNamespace(pub TestNamespace);

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
pub async fn remove(tenant_ns: TenantNamespace) {
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
