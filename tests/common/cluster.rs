//! The control plane the tests run against: its kubeconfig, clients, a
//! namespace per test, kubectl, and waits.

use std::future::Future;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{Condition, await_condition};
use kube::{Client, Config, Resource, ResourceExt};
use sample_controller::testing::api::CONTROLLER_NAME;
use sample_controller::{Foo, FooSpec};
use serde::de::DeserializeOwned;
use serde_json::json;

use super::{RunningController, start_controller};

pub const KUBECONFIG_ENV: &str = "SAMPLE_CONTROLLER_TEST_KUBECONFIG";

/// The control plane's kubeconfig. Integration tests never skip: without
/// one they fail, saying how to get one.
pub fn kubeconfig_path() -> String {
    match std::env::var(KUBECONFIG_ENV) {
        Ok(p) if !p.is_empty() => p,
        _ => panic!(
            "integration tests need a Kubernetes control plane and {KUBECONFIG_ENV} is not set.\n\
             Run them with `hack/test.sh` (it builds and starts a local control plane), or start one with\n\
             `eval \"$(hack/local-up.sh)\" && kubectl apply -f crds/` and set {KUBECONFIG_ENV}=\"$KUBECONFIG\"."
        ),
    }
}

pub async fn config() -> Config {
    let path = kubeconfig_path();
    let kc = Kubeconfig::read_from(&path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
    Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("bad kubeconfig {path}: {e}"))
}

pub async fn admin_client() -> Client {
    Client::try_from(config().await).expect("client")
}

/// A client acting as the operator's ServiceAccount from deploy/.
pub async fn service_account_client(namespace: &str, name: &str) -> Client {
    Client::try_from(service_account_config(namespace, name).await).expect("client")
}

/// The control plane's configuration, impersonating the operator's
/// ServiceAccount from deploy/.
pub async fn service_account_config(namespace: &str, name: &str) -> Config {
    let mut cfg = config().await;
    cfg.auth_info.impersonate = Some(format!("system:serviceaccount:{namespace}:{name}"));
    cfg.auth_info.impersonate_groups = Some(vec![
        "system:serviceaccounts".into(),
        format!("system:serviceaccounts:{namespace}"),
        "system:authenticated".into(),
    ]);
    cfg
}

/// A fresh namespace for one test, deleted when dropped.
pub struct TestNamespace {
    pub name: String,
    pub client: Client,
}

impl TestNamespace {
    pub async fn new(prefix: &str) -> Self {
        let client = admin_client().await;
        let api: Api<Namespace> = Api::all(client.clone());
        let ns: Namespace = serde_json::from_value(json!({
            "metadata": { "generateName": format!("{prefix}-"), "labels": { "sample-controller-test": "true" } }
        }))
        .unwrap();
        let created = api.create(&PostParams::default(), &ns).await.expect("create test namespace");
        let name = created.name_any();
        // Pods need the "default" ServiceAccount, which the controller
        // manager creates shortly after the namespace.
        let sa: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
        wait_for(&sa, "default", "the default ServiceAccount", TIMEOUT, |sa: Option<&ServiceAccount>| sa.is_some())
            .await;
        TestNamespace { name, client }
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// A controller in this process watching this namespace, with the
    /// operator's client: the audit log tells its requests from the test's.
    pub async fn controller(&self) -> RunningController {
        start_controller(config().await, Some(&self.name))
    }

    /// `kubectl` against the control plane, in this namespace.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        let mut all = vec!["-n", &self.name];
        all.extend_from_slice(args);
        kubectl(&all)
    }

    /// `kubectl` in this namespace that must succeed; returns its stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        kubectl_ok(&all)
    }

    /// A copy of the control plane's kubeconfig changed by `edit`, written
    /// under the test's target directory; returns its path.
    pub fn kubeconfig_variant(&self, tag: &str, edit: impl FnOnce(&mut serde_json::Value)) -> String {
        kubeconfig_variant(&format!("{}-{tag}", self.name), edit)
    }

    /// The Events this controller wrote here (the scheduler reports its pod
    /// bindings in the same namespace).
    pub async fn controller_events(&self) -> Vec<Event> {
        let list = self.api::<Event>().list(&ListParams::default()).await.expect("list events");
        list.items.into_iter().filter(|e| e.reporting_controller.as_deref() == Some(CONTROLLER_NAME)).collect()
    }

    /// Events about the object named `name`, as "Type Reason: note".
    pub async fn events_for(&self, name: &str) -> Vec<String> {
        let api: Api<Event> = self.api();
        let list = api.list(&ListParams::default()).await.expect("list events");
        list.items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .map(|e| {
                format!(
                    "{} {}: {}",
                    e.type_.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.note.unwrap_or_default()
                )
            })
            .collect()
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        // Best effort, without blocking the runtime: the namespace
        // controller removes what is left.
        let _ = kubectl(&["delete", "namespace", &self.name, "--wait=false"]);
    }
}

/// A copy of the control plane's kubeconfig changed by `edit`, written
/// under the test's target directory as `{name}-kubeconfig`; its path.
/// A path of `name` in the tests' scratch directory, this plane's own:
/// hack/test.sh runs the suites of two planes at once, so a file of fixed
/// name written by a test on one would be read by the same test on the
/// other.
pub fn scratch(name: &str) -> String {
    let plane = std::env::var("KUBE_MINOR").unwrap_or_else(|_| "plane".into());
    format!("{}/{plane}-{name}", env!("CARGO_TARGET_TMPDIR"))
}

pub fn kubeconfig_variant(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> String {
    let mut kubeconfig: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(kubeconfig_path()).unwrap()).unwrap();
    edit(&mut kubeconfig);
    let path = scratch(&format!("{name}-kubeconfig"));
    std::fs::write(&path, serde_saphyr::to_string(&kubeconfig).unwrap()).unwrap();
    path
}

pub fn kubectl(args: &[&str]) -> Output {
    Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", kubeconfig_path())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run kubectl")
}

pub fn kubectl_ok(args: &[&str]) -> String {
    let mut out = kubectl(args);
    // `kubectl apply` creates what it does not find: of two tests applying
    // the same file at once, both try, and the second create fails with
    // AlreadyExists. Applied again, it patches what the other one made.
    if args.first() == Some(&"apply")
        && !out.status.success()
        && String::from_utf8_lossy(&out.stderr).contains("AlreadyExists")
    {
        out = kubectl(args);
    }
    assert!(
        out.status.success(),
        "kubectl {} failed:\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Create a Foo in `foos`' namespace naming `deployment`.
pub async fn create_foo(foos: &Api<Foo>, name: &str, deployment: &str, replicas: Option<i32>) -> Foo {
    let foo = Foo::new(name, FooSpec { deployment_name: deployment.into(), replicas });
    foos.create(&PostParams::default(), &foo).await.unwrap_or_else(|e| panic!("create Foo {name}: {e}"))
}

/// Wait until the Foo's status reports `available` replicas; returns it.
pub async fn wait_available(foos: &Api<Foo>, name: &str, available: i32, timeout: Duration) -> Foo {
    let what = format!("Foo {name} with {available} available replicas");
    let reports =
        move |foo: Option<&Foo>| foo.and_then(|f| f.status.as_ref()).is_some_and(|s| s.available_replicas == available);
    wait_for(foos, name, &what, timeout, reports).await.expect("a Foo")
}

/// Wait, on a watch, until the object `name` meets `condition` (kube-runtime's
/// `await_condition`); returns it as it then was (`None`: absent).
pub async fn wait_for<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    timeout: Duration,
    condition: impl Condition<K>,
) -> Option<K>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    match tokio::time::timeout(timeout, await_condition(api.clone(), name, condition)).await {
        Ok(Ok(object)) => object,
        Ok(Err(e)) => panic!("watching for {what}: {e}"),
        Err(_) => panic!("timed out after {timeout:?} waiting for {what}"),
    }
}

/// Poll `probe` every 200 ms until it returns `Some`, or panic after
/// `timeout`: for what has no watch (a process's log or endpoint, the audit
/// log, several objects at once); one object waits on a watch ([`wait_for`]).
pub async fn wait_until<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub const TIMEOUT: Duration = Duration::from_secs(60);
/// The garbage collector picks up a new CRD's owners on its periodic
/// discovery resync (30 s), so GC waits get longer.
pub const GC_TIMEOUT: Duration = Duration::from_secs(120);

pub async fn deployment(ns: &TestNamespace, name: &str) -> Option<Deployment> {
    ns.api::<Deployment>().get_opt(name).await.expect("get deployment")
}

pub fn replicas(d: &Deployment) -> Option<i32> {
    d.spec.as_ref().and_then(|s| s.replicas)
}

pub async fn delete_deployment(ns: &TestNamespace, name: &str) {
    ns.api::<Deployment>().delete(name, &DeleteParams::default()).await.expect("delete deployment");
}
