//! `hack/demo.sh` pointed at a cluster of the user's — the plane, named by a
//! kubeconfig as any cluster is: it refuses to start while deploy/'s
//! operator holds its Lease, and otherwise works in a namespace of its own,
//! leaving a Foo and the Deployment it controls elsewhere as they were.

mod common;

use std::process::{Command, Output};

use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use kube::ResourceExt;
use kube::api::PostParams;
use sample_controller::Foo;
use sample_controller::testing::api::LABEL_MANAGED_BY;
use sample_controller::testing::api::UNSHARDED;
use sample_controller::testing::api::desired_deployment;
use sample_controller::testing::client::FIELD_MANAGER;

/// The demo, on the plane as a user's cluster, in namespace `ns`.
fn demo(ns: &str) -> Output {
    demo_with(&kubeconfig_path(), ns, &[])
}

/// `hack/demo.sh` running the tests' build of the controller
/// (`DEMO_CONTROLLER`), so that it runs no cargo: its own build, of the
/// binary alone, would replace `target/debug/sample-controller` with one
/// without the test hooks while the other suites run it (the panic test
/// then saw no panic), and with the variables cargo sets for a test
/// (`CARGO_PKG_NAME`, ...) would judge ring's build script changed.
fn demo_command() -> Command {
    let mut cmd = Command::new("hack/demo.sh");
    cmd.env("DEMO_CONTROLLER", env!("CARGO_BIN_EXE_sample-controller"));
    cmd
}

/// The demo against the cluster of `kubeconfig`, in namespace `ns`, with
/// more of its variables set.
fn demo_with(kubeconfig: &str, ns: &str, vars: &[(&str, &str)]) -> Output {
    demo_command()
        .env("KUBECONFIG", kubeconfig)
        .env("DEMO_NAMESPACE", ns)
        .envs(vars.iter().copied())
        .env_remove("KEEP")
        .output()
        .expect("run hack/demo.sh")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test]
async fn the_demo_refuses_to_start_while_an_operator_holds_its_lease() {
    let pods = install_deploy().await;
    let _lease = FreshLease::new();
    let ns = TestNamespace::new("demo-refused").await;
    let _replica = spawn_replica(&ns.name, &pods[0], LEASE).await;
    wait_until("deploy/'s replica to hold its Lease", TIMEOUT, || async {
        (holding_pod().await? == pods[0].name_any()).then_some(())
    })
    .await;
    // A namespace name of its own, that the refusal must not create.
    let demo_ns = format!("{}-demo", ns.name);

    let out = demo(&demo_ns);
    let err = stderr(&out);
    assert!(!out.status.success(), "the demo started beside a running operator:\n{err}");
    assert!(err.contains(&format!("Lease {DEPLOY_NS}/{DEPLOY_LEASE} held by {}", pods[0].name_any())), "{err}");
    let found = kubectl(&["get", "namespace", &demo_ns]);
    assert!(!found.status.success(), "the refused demo created its namespace");
}

/// What upstream's controller leaves in a namespace: a Foo and the
/// Deployment it controls, without our managed-by label — what an adoption
/// pass labels, if it looks there.
async fn left_by_upstream(ns: &TestNamespace) -> (Foo, Deployment) {
    let foo = create_foo(&ns.api(), "theirs", "theirs", Some(1)).await;
    let mut desired = desired_deployment(&foo, UNSHARDED).expect("a valid Foo");
    desired.metadata.labels.as_mut().unwrap().remove(LABEL_MANAGED_BY);
    let deployment = ns.api::<Deployment>().create(&PostParams::default(), &desired).await.unwrap();
    (foo, deployment)
}

#[tokio::test]
async fn the_demo_on_a_users_cluster_stays_in_its_own_namespace() {
    // No operator holds deploy/'s Lease (another test's replica may have).
    let _lease = FreshLease::new();
    let elsewhere = TestNamespace::new("demo-elsewhere").await;
    let (foo, deployment) = left_by_upstream(&elsewhere).await;
    let demo_ns = TestNamespace::new("demo").await;

    let out = demo(&demo_ns.name);
    assert!(out.status.success(), "the demo failed:\n{}", stderr(&out));
    let example =
        demo_ns.api::<Deployment>().get("example-foo").await.expect("the demo's Deployment, in its namespace");
    assert_eq!(replicas(&example), Some(3), "the demo scales its Foo to 3");

    // The demo's writes are ours: its field manager would be in what it
    // wrote (the deployment controller writes the Deployment's status too).
    let foo_after = elsewhere.api::<Foo>().get("theirs").await.unwrap();
    let deployment_after = elsewhere.api::<Deployment>().get("theirs").await.unwrap();
    assert!(!written_by_us(&foo_after), "a Foo outside the demo's namespace was written");
    assert!(!written_by_us(&deployment_after), "a Deployment outside the demo's namespace was written");
    assert_eq!(deployment_after.labels(), deployment.labels(), "a Deployment outside the demo's namespace was adopted");
    assert_eq!(foo_after.status, foo.status);
}

fn written_by_us<K: ResourceExt>(obj: &K) -> bool {
    obj.meta().managed_fields.iter().flatten().any(|m| m.manager.as_deref() == Some(FIELD_MANAGER))
}

/// A demo that cannot converge says so: a Deployment `example-foo` that no
/// Foo controls holds the example's name in the demo's namespace, so the
/// controller refuses to touch it (`ErrResourceExists`) and the Foo never
/// has a pod. The demo exits non-zero, naming the wait that ran out, with
/// the controller's log, which says why.
#[tokio::test]
async fn the_demo_fails_with_the_controllers_log_when_its_foo_does_not_converge() {
    let _lease = FreshLease::new();
    let demo_ns = TestNamespace::new("demo-stuck").await;
    let theirs: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "example-foo" },
        "spec": {
            "selector": { "matchLabels": { "app": "theirs" } },
            "template": {
                "metadata": { "labels": { "app": "theirs" } },
                "spec": { "containers": [{ "name": "web", "image": "nginx:latest" }] }
            }
        }
    }))
    .unwrap();
    demo_ns.api::<Deployment>().create(&PostParams::default(), &theirs).await.unwrap();

    let out = demo_with(&kubeconfig_path(), &demo_ns.name, &[("DEMO_TIMEOUT", "10")]);
    let err = stderr(&out);
    assert!(!out.status.success(), "the demo succeeded without its Foo converging:\n{err}");
    assert!(err.contains("the Foo did not converge: status.availableReplicas 1 within 10s"), "{err}");
    assert!(err.contains("the controller's log"), "{err}");
    assert!(err.contains("sync refused"), "the controller's log tail does not say why:\n{err}");
}

/// A kubeconfig naming a cluster that does not answer is not "no cluster":
/// the demo says which context did not answer, and does not start a local
/// control plane in its place.
#[tokio::test]
async fn the_demo_says_when_the_configured_cluster_does_not_answer() {
    let unreachable = kubeconfig_variant("demo-unreachable", |kubeconfig| {
        for cluster in kubeconfig["clusters"].as_array_mut().unwrap() {
            cluster["cluster"]["server"] = "https://127.0.0.1:9".into();
        }
    });
    let out = demo_with(&unreachable, "demo-unreachable", &[]);
    let err = stderr(&out);
    assert!(!out.status.success(), "the demo succeeded against a cluster that does not answer:\n{err}");
    assert!(err.contains("did not answer within 5 s"), "{err}");
    assert!(!err.contains("starting the local control plane"), "{err}");
}

/// README's "two commands" on a machine with no cluster: no KUBECONFIG, no
/// ~/.kube/config, and no local plane running in the demo's directory. The
/// demo starts one there, converges on it, and stops it when done.
#[tokio::test]
async fn the_demo_with_no_kubeconfig_starts_a_local_control_plane_converges_on_it_and_stops_it() {
    let plane_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/.local/demo-control-plane");
    let down = Command::new("hack/local-down.sh").env("LOCAL_UP_DIR", plane_dir).status().expect("local-down");
    assert!(down.success(), "no demo plane may run before the test");
    // A home of its own, with no kubeconfig; cargo, rustup and the planes'
    // build cache are where this machine keeps them.
    let real_home = std::env::var("HOME").expect("HOME");
    let home = format!("{}/demo-home", env!("CARGO_TARGET_TMPDIR"));
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(&home).unwrap();
    let or_home = |var: &str, under: &str| std::env::var(var).unwrap_or_else(|_| format!("{real_home}/{under}"));
    let cache = std::env::var("SAMPLE_CONTROLLER_CACHE")
        .unwrap_or_else(|_| format!("{}/sample-controller-rs", or_home("XDG_CACHE_HOME", ".cache")));
    let out = demo_command()
        .env("HOME", &home)
        .env("CARGO_HOME", or_home("CARGO_HOME", ".cargo"))
        .env("RUSTUP_HOME", or_home("RUSTUP_HOME", ".rustup"))
        .env("SAMPLE_CONTROLLER_CACHE", cache)
        .env("DEMO_NAMESPACE", "demo-local")
        // Not the test plane's: its directory, kubeconfig and audit log.
        .env_remove("KUBECONFIG")
        .env_remove("LOCAL_UP_DIR")
        .env_remove("LOCAL_UP_AUDIT_LOG")
        .env_remove("KEEP")
        .output()
        .expect("run hack/demo.sh");
    let err = stderr(&out);
    assert!(out.status.success(), "the demo failed without a kubeconfig:\n{err}");
    assert!(err.contains("no cluster configured: starting the local control plane"), "{err}");
    assert!(err.contains("converged; the demo took"), "{err}");
    // Stopped: its directory removed, and no process left that was started
    // from it (every component's command line names a file in it).
    assert!(!std::path::Path::new(plane_dir).exists(), "the demo left {plane_dir}");
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(plane_dir))
        .collect();
    assert!(left.is_empty(), "the demo left its control plane running: {left:?}");
}
