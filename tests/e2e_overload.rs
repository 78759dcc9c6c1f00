//! A struggling API server: the operator's requests go through a
//! fault-injecting proxy (tests/common/fault_proxy.rs) that cuts its watches
//! and refuses what follows, or the API server's own API Priority and
//! Fairness refuses the operator's flow. The operator must wait as it is
//! told, never relist on a refusal, and watch again within seconds of the
//! fault's end; and its status writes must keep another writer's condition.
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::fault_proxy::{Fault, FaultProxy, Seen, count};
use common::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, Patch, PatchParams};
use sample_controller::Foo;
use sample_controller::testing::api::CONDITION_READY;
use sample_controller::testing::observe::Metrics;
use sample_controller::testing::reconcile::reconcile;
use serde_json::json;

/// How long each fault lasts here (the benchmark holds one for a minute).
const FAULT: Duration = Duration::from_secs(12);
/// The longest the operator may stay deaf after a fault ends: the 3 s target
/// (its watches' longest wait is 2 s plus a quarter of jitter), and a second
/// of margin for a loaded 2-core machine.
const REWATCH: Duration = Duration::from_secs(4);
/// The longest from a fault's end until an edit made during it is in its
/// Deployment: watching again, and a sync (the chaos suite's 6 s target for
/// an outage, and 2 s of margin).
const CONVERGED: Duration = Duration::from_secs(8);

/// What the operator did under `fault` and after it.
struct Outcome {
    /// Its requests while the fault held.
    during: Vec<Seen>,
    /// Its requests from the fault's end until the edit converged and both
    /// watches went through again.
    after: Vec<Seen>,
    /// From the fault's end until its watches of Foos and of Deployments had
    /// both gone through again.
    rewatch: Duration,
    /// From the fault's end to an edit made during it reaching the Deployment.
    converged: Duration,
}

/// Three synced Foos; their watches cut and `fault` applied for [`FAULT`]
/// while one of them is edited; then the fault lifted.
async fn through(fault: Fault) -> Outcome {
    let ns = TestNamespace::new("overload").await;
    let proxy = FaultProxy::start(config().await, &[]).await;
    let _operator = start_controller(proxy.config(), Some(&ns.name));
    let foos: Api<Foo> = ns.api();
    for i in 0..3 {
        create_foo(&foos, &format!("foo-{i}"), &format!("deploy-{i}"), Some(1)).await;
    }
    for i in 0..3 {
        wait_available(&foos, &format!("foo-{i}"), 1, TIMEOUT).await;
    }

    let started = Instant::now();
    proxy.set(fault.clone());
    proxy.cut_watches();
    let scale = json!({ "spec": { "replicas": 2 } });
    foos.patch("foo-0", &PatchParams::default(), &Patch::Merge(&scale)).await.unwrap();
    // Time under test: the fault lasts this long.
    tokio::time::sleep(FAULT).await;
    let ended = Instant::now();
    proxy.set(Fault::None);
    wait_until("the edit made during the fault to reach its Deployment", TIMEOUT, || async {
        (replicas(&deployment(&ns, "deploy-0").await?) == Some(2)).then_some(())
    })
    .await;
    let converged = ended.elapsed();
    let back = |resource: &'static str| {
        let seen = proxy.seen();
        seen.iter().find(|s| s.at >= ended && s.passed && s.is_watch() && s.resource == resource).map(|s| s.at - ended)
    };
    let rewatch = wait_until("both watches to go through again", TIMEOUT, || async {
        Some(back("foos")?.max(back("deployments")?))
    })
    .await;
    let seen = proxy.seen();
    let after = seen.iter().filter(|s| s.at >= ended).cloned().collect();
    let during = seen.into_iter().filter(|s| s.at >= started && s.at < ended).collect();
    let outcome = Outcome { during, after, rewatch, converged };
    println!(
        "{fault:?}: {} requests during {FAULT:?} ({} LIST), watching again {:?} after, edit converged {:?} after",
        outcome.during.len(),
        outcome.during.iter().filter(|s| s.is_full_list()).count(),
        outcome.rewatch,
        outcome.converged
    );
    outcome
}

/// What every fault must leave true: no list, during the fault or once it
/// ends (the watches resume from where they were), at most a request a
/// second per watch, and watching again within [`REWATCH`].
fn assert_polite(outcome: &Outcome) {
    let lists: Vec<_> = outcome.during.iter().filter(|s| s.is_full_list()).collect();
    assert!(lists.is_empty(), "listed during the fault: {lists:?}");
    let relists: Vec<_> = outcome.after.iter().filter(|s| s.is_full_list()).collect();
    assert!(relists.is_empty(), "listed again once the fault ended: {relists:?}");
    let per_second = FAULT.as_secs() as usize + 1;
    for resource in ["foos", "deployments"] {
        let watches = count(&outcome.during, "watch", resource);
        assert!(watches <= per_second, "{watches} watch requests for {resource} in {FAULT:?}");
        assert!(watches >= 2, "only {watches} tries to watch {resource} again: was the fault seen at all?");
    }
    assert!(outcome.rewatch <= REWATCH, "watching again only {:?} after the fault", outcome.rewatch);
    assert!(
        outcome.converged <= CONVERGED,
        "the edit made during the fault converged {:?} after it",
        outcome.converged
    );
}

#[tokio::test]
async fn on_500s_the_watches_resume_at_most_once_a_second_and_never_relist() {
    assert_polite(&through(Fault::Refuse { code: 500, retry_after: None }).await);
}

#[tokio::test]
async fn on_503s_without_retry_after_the_watches_back_off_and_come_back_within_seconds() {
    assert_polite(&through(Fault::Refuse { code: 503, retry_after: None }).await);
}

#[tokio::test]
async fn on_429s_the_retry_after_is_waited_out_and_no_longer() {
    let outcome = through(Fault::Refuse { code: 429, retry_after: Some(1) }).await;
    assert_polite(&outcome);
    // Each try waited the second it was told to: about one a second, not a
    // backoff grown past it.
    let watches = count(&outcome.during, "watch", "foos");
    assert!(watches * 2 >= FAULT.as_secs() as usize, "{watches} tries in {FAULT:?}: waited longer than told");
}

#[tokio::test]
async fn on_dropped_connections_the_watches_resume_without_a_relist() {
    assert_polite(&through(Fault::Reset).await);
}

#[tokio::test]
async fn the_api_servers_own_priority_and_fairness_refusals_are_waited_out() {
    let ns = TestNamespace::new("apf").await;
    let sa = "overloaded";
    ns.kubectl_ok(&["create", "serviceaccount", sa]);
    let subject = format!("--serviceaccount={}:{sa}", ns.name);
    ns.kubectl_ok(&["create", "rolebinding", "operator", "--clusterrole=cluster-admin", &subject]);
    let flow = Apf::reject(&format!("{}-reject", ns.name), &ns.name, sa);
    let identity = service_account_config(&ns.name, sa).await;
    let seat = SeatHolder::take(&ns, identity.clone()).await;
    let foos: Api<Foo> = ns.api();
    create_foo(&foos, "example-foo", "example-foo", Some(1)).await;

    let started = k8s_openapi::jiff::Timestamp::now();
    let _operator = start_controller(identity, Some(&ns.name));
    // Time under test: the fault lasts this long.
    tokio::time::sleep(FAULT).await;
    let user = format!("system:serviceaccount:{}:{sa}", ns.name);
    let until = started + k8s_openapi::jiff::SignedDuration::try_from(FAULT).unwrap();
    let ours: Vec<_> = audited_as(&user)
        .into_iter()
        .filter(|r| r.at >= started && r.at < until && r.resource != "configmaps")
        .collect();
    assert!(deployment(&ns, "example-foo").await.is_none(), "a request got through the reject-all flow: {ours:?}");
    assert!(ours.iter().all(|r| r.code == Some(429)), "{ours:?}");
    let lists = ours.iter().filter(|r| r.verb == "list").count();
    let per_second = 2 * (FAULT.as_secs() as usize + 1);
    assert!(lists <= per_second, "{lists} lists refused in {FAULT:?}: more than one a second per watch");
    assert!(lists >= 2, "the operator's lists were never refused: was the flow schema matched?");

    drop(seat);
    drop(flow);
    let ended = Instant::now();
    wait_available(&foos, "example-foo", 1, TIMEOUT).await;
    println!(
        "APF: {} requests refused in {FAULT:?}; converged {:?} after the flow was let through",
        ours.len(),
        ended.elapsed()
    );
}

/// The one seat of [`Apf`]'s priority level, held: a priority level with no
/// seats still runs one request at a time, so a list that is never read
/// (the API server blocks writing it) keeps every other request out.
struct SeatHolder {
    _response: http::Response<kube::client::Body>,
}

impl SeatHolder {
    async fn take(ns: &TestNamespace, identity: kube::Config) -> Self {
        // More than the loopback socket buffers hold: 20 ConfigMaps of 900 kB.
        let api: Api<k8s_openapi::api::core::v1::ConfigMap> = ns.api();
        for i in 0..20 {
            let cm = serde_json::from_value(json!({
                "metadata": { "name": format!("ballast-{i}") }, "data": { "d": "x".repeat(900_000) }
            }))
            .unwrap();
            api.create(&Default::default(), &cm).await.expect("create a ballast ConfigMap");
        }
        let client = kube::Client::try_from(identity).unwrap();
        let list = http::Request::get(format!("/api/v1/namespaces/{}/configmaps", ns.name)).body(Vec::new()).unwrap();
        let response = client.send(list.map(kube::client::Body::from)).await.expect("the ballast list");
        assert!(response.status().is_success(), "the ballast list was refused: {}", response.status());
        SeatHolder { _response: response }
    }
}

/// A FlowSchema sending every request of one ServiceAccount to a priority
/// level with no seats that rejects what it cannot seat; removed on drop.
struct Apf {
    name: String,
}

impl Apf {
    fn reject(name: &str, namespace: &str, sa: &str) -> Self {
        let manifest = json!({ "apiVersion": "v1", "kind": "List", "items": [
            { "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "PriorityLevelConfiguration",
              "metadata": { "name": name },
              "spec": { "type": "Limited", "limited": {
                  "nominalConcurrencyShares": 0, "lendablePercent": 0, "borrowingLimitPercent": 0,
                  "limitResponse": { "type": "Reject" } } } },
            { "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
              "metadata": { "name": name },
              "spec": { "priorityLevelConfiguration": { "name": name }, "matchingPrecedence": 100,
                  "distinguisherMethod": { "type": "ByUser" },
                  "rules": [{ "subjects": [{ "kind": "ServiceAccount", "serviceAccount": { "name": sa, "namespace": namespace } }],
                              "resourceRules": [{ "verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "namespaces": ["*"] }] }] } },
        ]});
        let path = format!("{}/{name}-apf.json", env!("CARGO_TARGET_TMPDIR"));
        std::fs::write(&path, manifest.to_string()).unwrap();
        kubectl_ok(&["apply", "-f", &path]);
        // The API server's APF controller takes the new objects up shortly
        // after they are stored; its status condition says when.
        let flowschema = format!("flowschema/{name}");
        kubectl_ok(&["wait", "--for=condition=Dangling=False", &flowschema, "--timeout=60s"]);
        Apf { name: name.to_owned() }
    }
}

impl Drop for Apf {
    fn drop(&mut self) {
        let _ = kubectl(&["delete", "flowschema,prioritylevelconfiguration", &self.name, "--wait=false"]);
    }
}

#[tokio::test]
async fn another_writers_condition_written_after_our_cache_saw_the_foo_survives_our_status_write() {
    let ns = TestNamespace::new("other-condition").await;
    let foos: Api<Foo> = ns.api();
    let cached = create_foo(&foos, "example-foo", "example-foo", Some(1)).await;
    // Another tool adds its condition; our cache (frozen) never sees it.
    let theirs = Condition {
        type_: "BackedUp".into(),
        status: "True".into(),
        reason: "Snapshot".into(),
        message: "snapshot taken".into(),
        observed_generation: Some(1),
        last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()),
    };
    let status = json!({ "status": { "conditions": [theirs] } });
    foos.patch_status(
        "example-foo",
        &PatchParams::apply("backup-tool"),
        &Patch::Apply(&json!({
            "apiVersion": "samplecontroller.k8s.io/v1alpha1", "kind": "Foo", "metadata": { "name": "example-foo" },
            "status": status["status"],
        })),
    )
    .await
    .expect("the other tool's status write");

    let caches = caches_holding(std::slice::from_ref(&cached), &[]).await;
    let ctx = context(ns.client.clone(), caches, Arc::new(Metrics::new()));
    reconcile(Arc::new(cached), ctx).await.expect("the sync creates the Deployment and writes status");

    let foo = foos.get("example-foo").await.unwrap();
    let types: Vec<_> = foo.status.as_ref().unwrap().conditions.iter().map(|c| c.type_.as_str()).collect();
    assert!(types.contains(&"BackedUp"), "the other writer's condition was erased: {types:?}");
    assert!(types.contains(&CONDITION_READY), "{types:?}");
}

const TIMEOUTS: &str = "controller_runtime_reconcile_timeouts_total{controller=\"foo\"}";

/// The sync deadline the test gives `--reconcile-timeout`, and how late
/// past it a timeout may be counted on a loaded machine.
const DEADLINE: Duration = Duration::from_secs(2);
const DEADLINE_SLACK: Duration = Duration::from_secs(3);

/// A Foo whose status write the API server never answers (the proxy holds
/// it, as a wedged connection would): the operator binary, given
/// `--reconcile-timeout`, abandons the sync at that deadline from its
/// start, counts it, and schedules its retry a second away, not at once (a
/// deadline met is the API server not answering); the other Foos converge
/// meanwhile on the remaining worker. (A change of the Foo's Deployment may
/// bring its next sync sooner, as a change does: the log says when the
/// retry was scheduled.)
#[tokio::test]
async fn a_sync_whose_write_is_never_answered_is_abandoned_at_its_deadline_counted_and_retried_while_others_converge() {
    let ns = TestNamespace::new("hung-sync").await;
    let proxy = FaultProxy::start(config().await, &[]).await;
    proxy.hang(&format!("/namespaces/{}/foos/hung/status", ns.name));
    // Plain HTTP to the proxy, which adds the plane's credentials.
    let kubeconfig = ns.kubeconfig_variant("proxied", |kc| {
        kc["clusters"][0]["cluster"] = json!({ "server": proxy.url });
        kc["users"][0]["user"] = json!({});
    });
    let flag = format!("--reconcile-timeout={}s", DEADLINE.as_secs());
    let operator = spawn_operator(&ns.name, &kubeconfig, &[&flag, "--workers=2"], &format!("{}-op", ns.name)).await;
    let log_path = format!("{}/{}-op.log", env!("CARGO_TARGET_TMPDIR"), ns.name);
    // The deadline covers the whole sync, which first waits for the
    // adoption pass (a list through the proxy): the Foo comes once that is
    // over, so that the sync's first request, its Deployment's create,
    // marks when its deadline started.
    wait_until("the adoption pass", TIMEOUT, || async {
        std::fs::read_to_string(&log_path).ok()?.contains("adoption pass finished").then_some(())
    })
    .await;
    let foos: Api<Foo> = ns.api();
    create_foo(&foos, "hung", "hung", Some(1)).await;
    let held = |n: usize| {
        let proxy = &proxy;
        async move {
            let held: Vec<_> = proxy
                .seen()
                .into_iter()
                .filter(|s| s.resource == "foos/status" && s.verb == "patch" && !s.passed)
                .collect();
            (held.len() >= n).then_some(held)
        }
    };
    wait_until("the hung status write at the proxy", TIMEOUT, || held(1)).await;
    let first = proxy
        .seen()
        .into_iter()
        .find(|s| s.resource == "deployments" && s.verb == "create")
        .expect("the hung Foo's Deployment created before its status write")
        .at;
    // Counted at its deadline from the hang: not later than the slack.
    let counted = wait_until("the hung sync timed out", DEADLINE + DEADLINE_SLACK, || async {
        (metric(&operator, TIMEOUTS).await? >= 1.0).then(std::time::Instant::now)
    })
    .await;
    let after = counted.duration_since(first);
    println!("the hung sync's timeout counted {after:?} after its first request (deadline {DEADLINE:?})");
    assert!(
        after >= DEADLINE - Duration::from_millis(100),
        "counted {after:?} after the sync began, before the deadline"
    );
    for i in 0..3 {
        create_foo(&foos, &format!("foo-{i}"), &format!("foo-{i}"), Some(1)).await;
    }
    for i in 0..3 {
        wait_available(&foos, &format!("foo-{i}"), 1, TIMEOUT).await;
    }
    wait_until("the hung write tried again", TIMEOUT, || held(2)).await;
    let log = std::fs::read_to_string(&log_path).unwrap();
    let timed_out = log.lines().find(|l| l.contains("sync timed out")).expect("the timeout's ERROR");
    assert!(timed_out.contains("ERROR") && timed_out.contains("--reconcile-timeout"), "{timed_out}");
    assert!(timed_out.contains("retry_in=1s"), "its retry not scheduled a second away: {timed_out}");
    let errors = "controller_runtime_reconcile_errors_total{controller=\"foo\"}";
    assert!(metric(&operator, errors).await >= metric(&operator, TIMEOUTS).await, "a timeout is also an error");
    assert_eq!(deployment(&ns, "hung").await.as_ref().and_then(replicas), Some(1), "its Deployment was made");
}
