//! Shared harness of the integration tests: a client for the control plane
//! that `hack/test.sh` started, a namespace per test, an in-process
//! controller per test, and polling helpers.
#![allow(dead_code)] // each test binary uses its own subset

pub mod fault_proxy;

use std::future::Future;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher::Event as WatchEvent;
use kube::{Client, Config, ResourceExt};
use sample_controller::adoption::Adoption;
use sample_controller::app::start_adoption;
use sample_controller::cache::{Cache, Caches, trim_deployment, trim_foo};
use sample_controller::constants::{CONTROLLER_NAME, USER_AGENT};
use sample_controller::controller::{self, Settings};
use sample_controller::deployment::DeploymentView;
use sample_controller::http::{METRICS_ENDPOINTS, PROBE_ENDPOINTS};
use sample_controller::metrics::Metrics;
use sample_controller::sync::Context;
use sample_controller::{Foo, FooSpec};
use serde_json::json;

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
        let sa: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), &name);
        wait_until("default ServiceAccount", Duration::from_secs(60), || async {
            sa.get_opt("default").await.ok().flatten()
        })
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
        let mut kubeconfig: serde_json::Value =
            serde_saphyr::from_str(&std::fs::read_to_string(kubeconfig_path()).unwrap()).unwrap();
        edit(&mut kubeconfig);
        let path = format!("{}/{}-{tag}-kubeconfig", env!("CARGO_TARGET_TMPDIR"), self.name);
        std::fs::write(&path, serde_saphyr::to_string(&kubeconfig).unwrap()).unwrap();
        path
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

pub fn kubectl(args: &[&str]) -> Output {
    Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", kubeconfig_path())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run kubectl")
}

pub fn kubectl_ok(args: &[&str]) -> String {
    let out = kubectl(args);
    assert!(
        out.status.success(),
        "kubectl {} failed:\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A controller running in this test process, stopped when dropped.
pub struct RunningController {
    tasks: [tokio::task::JoinHandle<()>; 2],
    pub metrics: Arc<Metrics>,
}

impl Drop for RunningController {
    fn drop(&mut self) {
        self.tasks.iter().for_each(|t| t.abort());
    }
}

/// Start the controller with a client for `config` built as the operator
/// builds it (its User-Agent, its request counting), watching `namespace`
/// (all when None).
pub fn start_controller(config: Config, namespace: Option<&str>) -> RunningController {
    start_controller_with(config, namespace, 2)
}

/// [`start_controller`] with `workers` concurrent syncs.
pub fn start_controller_with(config: Config, namespace: Option<&str>, workers: u16) -> RunningController {
    let metrics = Arc::new(Metrics::new());
    let client = sample_controller::client::build(config, metrics.rest_requests.clone()).expect("client");
    let settings = Settings { namespace: namespace.map(str::to_owned), workers };
    let (controller, caches) = controller::build(&client, &settings, metrics.queue.clone());
    let adoption = Arc::new(Adoption::new(sample_controller::client::api(&client, namespace), workers.into()));
    let adopting = start_adoption(&caches, &adoption, None);
    let ctx = Context::new(client.clone(), caches, adoption, metrics.clone(), Some("integration-test".into()), None);
    let task = tokio::spawn(controller::run(controller, Arc::new(ctx)));
    RunningController { tasks: [task, adopting], metrics }
}

/// What a single sync (with no controller around it) runs with: `caches`,
/// no adoption pass, no leader election.
pub fn context(client: Client, caches: Caches, metrics: Arc<Metrics>) -> Arc<Context> {
    Arc::new(Context::new(client, caches, Arc::new(Adoption::none()), metrics, None, None))
}

/// Controller caches holding `foos` and `deployments`, as a watch's first
/// list would fill them; they change only when the test says so, so a test
/// can make them lag behind the API server.
pub async fn caches_holding(foos: &[Foo], deployments: &[Deployment]) -> Caches {
    let views: Vec<DeploymentView> = deployments.iter().cloned().map(DeploymentView::from).collect();
    Caches { foos: filled(foos, trim_foo).await, deployments: filled(&views, trim_deployment).await }
}

async fn filled<K>(objects: &[K], trim: fn(&mut K)) -> Arc<Cache<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
{
    let (cache, writer) = Cache::new(trim);
    let mut events = vec![Ok(WatchEvent::Init)];
    events.extend(objects.iter().cloned().map(|o| Ok(WatchEvent::InitApply(o))));
    events.push(Ok(WatchEvent::InitDone));
    cache.reflect(writer, futures::stream::iter(events)).for_each(|_| async {}).await;
    cache
}

/// A `sample-controller` process; killed when dropped.
pub struct Operator {
    pub child: Child,
    pub metrics: u16,
    pub probes: u16,
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Send `signal` (`-TERM`, `-STOP`, `-CONT`) to the operator process.
pub fn signal(op: &Operator, signal: &str) {
    let pid = op.child.id().to_string();
    assert!(Command::new("kill").args([signal, &pid]).status().unwrap().success(), "kill {signal} {pid}");
}

/// Lease timings short enough for tests: 5 s lease, 3 s renew deadline,
/// 1 s retry.
pub const LEASE: Duration = Duration::from_secs(5);

pub async fn spawn_operator(ns: &str, kubeconfig: &str, extra: &[&str], log_name: &str) -> Operator {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sample-controller"));
    // Port 0: the operator binds free ports itself and logs which.
    cmd.args(["--kubeconfig", kubeconfig, "--namespace", ns])
        .args(["--metrics-bind-address", "127.0.0.1:0", "--health-probe-bind-address", "127.0.0.1:0"])
        .args(extra)
        .env("RUST_LOG", "info,sample_controller=debug")
        .env_remove("SAMPLE_CONTROLLER_KUBECONFIG");
    start_logged(cmd, log_name).await
}

/// Start an operator (the binary, or the image under runc) with its log in
/// a file under the test's target directory, and wait until it has logged
/// the ports it bound.
pub async fn start_logged(mut cmd: Command, log_name: &str) -> Operator {
    let log_path = format!("{}/{log_name}.log", env!("CARGO_TARGET_TMPDIR"));
    let log = std::fs::File::create(&log_path).unwrap();
    let child = cmd.stdout(Stdio::null()).stderr(log).spawn().expect("start the operator");
    let (metrics, probes) = wait_until("the operator to report its ports", TIMEOUT, || async {
        let log = std::fs::read_to_string(&log_path).ok()?;
        Some((bound_port(&log, METRICS_ENDPOINTS)?, bound_port(&log, PROBE_ENDPOINTS)?))
    })
    .await;
    Operator { child, metrics, probes }
}

/// The port of the listener serving `endpoints`, from its start-up log line,
/// as text (`serving HTTP addr=127.0.0.1:PORT endpoints=...`) or JSON
/// (`{"message":"serving HTTP","addr":"...","endpoints":"..."}`).
fn bound_port(log: &str, endpoints: &str) -> Option<u16> {
    let addr = log.lines().find_map(|line| match serde_json::from_str::<serde_json::Value>(line) {
        Ok(json) => (json["message"] == "serving HTTP" && json["endpoints"] == endpoints)
            .then(|| json["addr"].as_str().map(str::to_owned))?,
        Err(_) => (line.contains("serving HTTP") && line.ends_with(&format!("endpoints={endpoints}")))
            .then(|| line.split_whitespace().find_map(|w| w.strip_prefix("addr=")).map(str::to_owned))?,
    })?;
    addr.rsplit(':').next()?.parse().ok()
}

/// Leader-election flags for a candidate in `ns`: the renew deadline is 3/5
/// of the lease, the retry period 1 s.
pub fn election_args(ns: &str, lease_duration: Duration) -> Vec<String> {
    let secs = lease_duration.as_secs();
    vec![
        "--leader-elect".into(),
        "--leader-election-id=sample-controller-test".into(),
        format!("--leader-election-namespace={ns}"),
        format!("--leader-elect-lease-duration={secs}s"),
        format!("--leader-elect-renew-deadline={}s", (secs * 3 / 5).max(1)),
        "--leader-elect-retry-period=1s".into(),
    ]
}

pub async fn spawn_candidate(ns: &str, lease_duration: Duration, name: &str) -> Operator {
    let args = election_args(ns, lease_duration);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    spawn_operator(ns, &kubeconfig_path(), &args, &format!("{ns}-{name}")).await
}

pub const SUCCESS_SERIES: &str = "controller_runtime_reconcile_total{controller=\"foo\",result=\"success\"}";
pub const RECONCILE_ERRORS_SERIES: &str = "controller_runtime_reconcile_errors_total{controller=\"foo\"}";
pub const LEADER_SERIES: &str = "leader_election_master_status{name=\"sample-controller-test\"}";

/// The identity holding the test Lease, if any.
pub async fn holder(ns: &TestNamespace) -> Option<String> {
    let lease = ns.api::<Lease>().get_opt("sample-controller-test").await.ok()??;
    lease.spec?.holder_identity.filter(|h| !h.is_empty())
}

/// Wait until exactly one of `ops` reports itself leader; return its index.
pub async fn one_leader(ops: &[&Operator]) -> usize {
    wait_until("exactly one leader", TIMEOUT, || async {
        let mut leaders = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            match metric(op, LEADER_SERIES).await {
                Some(1.0) => leaders.push(i),
                Some(_) => {}
                None => return None, // not up yet
            }
        }
        (leaders.len() == 1).then(|| leaders[0])
    })
    .await
}

/// GET a path on localhost: (status code, body); None if nothing listens.
pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let code = text.split(' ').nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    Some((code, body))
}

/// Create a Foo in `foos`' namespace naming `deployment`.
pub async fn create_foo(foos: &Api<Foo>, name: &str, deployment: &str, replicas: Option<i32>) -> Foo {
    let foo = Foo::new(name, FooSpec { deployment_name: deployment.into(), replicas });
    foos.create(&PostParams::default(), &foo).await.unwrap_or_else(|e| panic!("create Foo {name}: {e}"))
}

/// Wait until the Foo's status reports `available` replicas; returns it.
pub async fn wait_available(foos: &Api<Foo>, name: &str, available: i32, timeout: Duration) -> Foo {
    wait_until(&format!("Foo {name} with {available} available replicas"), timeout, || async {
        let foo = foos.get(name).await.ok()?;
        (foo.status.as_ref()?.available_replicas == available).then_some(foo)
    })
    .await
}

/// GET over HTTPS with curl (the certificate is self-signed), with a
/// bearer token if any: (status code, HTTP version, body).
pub fn https_get(port: u16, path: &str, token: Option<&str>, extra: &[&str]) -> (u16, String, String) {
    let url = format!("https://127.0.0.1:{port}{path}");
    let mut curl = Command::new("curl");
    curl.args(["-sk", "-w", "\n%{http_code} %{http_version}", &url]).args(extra);
    if let Some(token) = token {
        curl.args(["-H", &format!("Authorization: Bearer {token}")]);
    }
    let out = curl.output().expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or_default();
    let (code, version) = status.split_once(' ').unwrap_or_default();
    (code.parse().unwrap_or_default(), version.to_owned(), body.to_owned())
}

/// A ServiceAccount `name` in `namespace` bound to deploy/'s metrics-reader
/// ClusterRole, and a token for it.
pub fn metrics_reader_token(namespace: &str, name: &str) -> String {
    kubectl_ok(&["apply", "-f", "deploy/08-metrics-reader-role.yaml"]);
    kubectl_ok(&["create", "serviceaccount", name, "-n", namespace]);
    let binding = format!("{namespace}-{name}");
    let subject = format!("--serviceaccount={namespace}:{name}");
    kubectl_ok(&["create", "clusterrolebinding", &binding, "--clusterrole=sample-controller-metrics-reader", &subject]);
    kubectl_ok(&["create", "token", name, "-n", namespace]).trim().to_owned()
}

/// The value of the first sample whose line starts with `series`.
pub async fn metric(op: &Operator, series: &str) -> Option<f64> {
    let (_, body) = http_get(op.metrics, "/metrics").await?;
    sample_controller::testing::metric_value(&body, series)
}

/// Poll `probe` every 200 ms until it returns `Some`, or panic after `timeout`.
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

pub const AUDIT_LOG_ENV: &str = "SAMPLE_CONTROLLER_TEST_AUDIT_LOG";

/// One request as the API server's audit log records it.
#[derive(Debug, Clone, PartialEq)]
pub struct Audited {
    /// Who, as the API server saw it: the impersonated user if any.
    pub user: String,
    /// When the API server received it.
    pub at: k8s_openapi::jiff::Timestamp,
    pub verb: String,
    pub resource: String,
    pub subresource: Option<String>,
    pub name: Option<String>,
    /// The HTTP status of the answer (none for a watch that only started).
    pub code: Option<u16>,
}

/// The requests clients whose User-Agent starts with `user_agent` made in
/// `namespace`, from the audit log hack/test.sh has the API server write
/// (one JSON line per request stage). Counting there sees every request a
/// client makes, not only the ones a test expects.
pub fn audited(namespace: &str, user_agent: &str) -> Vec<Audited> {
    audit_log(|e| {
        e["objectRef"]["namespace"] == namespace && e["userAgent"].as_str().is_some_and(|ua| ua.starts_with(user_agent))
    })
}

/// Every request `user` made (or someone impersonating it), in any namespace.
pub fn audited_as(user: &str) -> Vec<Audited> {
    audit_log(|e| e["impersonatedUser"]["username"] == user || e["user"]["username"] == user)
}

fn audit_log(keep: impl Fn(&serde_json::Value) -> bool) -> Vec<Audited> {
    let path = std::env::var(AUDIT_LOG_ENV).unwrap_or_else(|_| {
        panic!("{AUDIT_LOG_ENV} is not set: run the tests with hack/test.sh, whose control plane writes an audit log")
    });
    let log = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read the audit log {path}: {e}"));
    let mut seen = std::collections::HashSet::new();
    log.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        // Once per request: when complete, or a watch when it started.
        .filter(|e| e["stage"] == "ResponseComplete" || e["stage"] == "ResponseStarted")
        .filter(|e| keep(e) && seen.insert(e["auditID"].as_str().unwrap_or_default().to_owned()))
        .map(|e| {
            let text = |v: &serde_json::Value| v.as_str().map(str::to_owned);
            let user = text(&e["impersonatedUser"]["username"]).or_else(|| text(&e["user"]["username"]));
            Audited {
                user: user.unwrap_or_default(),
                at: e["requestReceivedTimestamp"].as_str().and_then(|t| t.parse().ok()).unwrap_or_default(),
                verb: text(&e["verb"]).unwrap_or_default(),
                resource: text(&e["objectRef"]["resource"]).unwrap_or_default(),
                subresource: text(&e["objectRef"]["subresource"]),
                name: text(&e["objectRef"]["name"]),
                code: e["responseStatus"]["code"].as_u64().and_then(|c| u16::try_from(c).ok()),
            }
        })
        .collect()
}

/// The operator's requests in `ns` once their count has not moved for
/// `still` (its Events go out in the background, after the syncs).
pub async fn settled_requests(ns: &str, still: Duration) -> Vec<Audited> {
    let (mut last, mut since) = (audited(ns, USER_AGENT), Instant::now());
    let deadline = Instant::now() + TIMEOUT;
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = audited(ns, USER_AGENT);
        if now.len() != last.len() {
            (last, since) = (now, Instant::now());
        } else if since.elapsed() >= still {
            return last;
        }
        assert!(Instant::now() < deadline, "the operator kept making requests: {last:?}");
    }
}

/// Verbs that change something.
pub const WRITES: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];
