//! Reconciler tests against a mocked API server (tower-test), after
//! upstream's controller_test.go: each scenario fills the controller's caches,
//! lists the API requests one sync must make, in order, answers them, and
//! fails on any request it did not expect — so "does nothing" is proven to
//! make no request at all, and reads come from the caches, never the API.

use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::client::Body;
use kube::core::PartialObjectMetaExt;
use kube::runtime::controller::Action;
use kube::{Api, Client};
use kube_lease_fence::WriteGate;
use sample_controller::Foo;
use sample_controller::testing::api::DeploymentView;
use sample_controller::testing::api::desired_deployment;
use sample_controller::testing::api::{Shard, UNSHARDED};
use sample_controller::testing::app::start_adoption;
use sample_controller::testing::observe::Metrics;
use sample_controller::testing::reconcile::Adoption;
use sample_controller::testing::reconcile::Context;
use sample_controller::testing::reconcile::Publisher;
use sample_controller::testing::reconcile::decide;
use sample_controller::testing::reconcile::{ApiAction, SyncError as Error};
use sample_controller::testing::reconcile::{error_policy, reconcile};
use sample_controller::testing::{DeploymentFixture, FooFixture, metric_value};
use serde_json::{Value, json};
use tower_test::mock::{Handle, SendResponse};

mod common;

use common::caches_of_shard;

type ApiHandle = Handle<Request<Body>, Response<Body>>;

const DEPLOYMENT: &str = "/apis/apps/v1/namespaces/default/deployments/example-foo";
const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/default/deployments";
const FOO_STATUS: &str = "/apis/samplecontroller.k8s.io/v1alpha1/namespaces/default/foos/example-foo/status";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";
const FOOS: &str = "/apis/samplecontroller.k8s.io/v1alpha1/namespaces/default/foos";

/// A check of a request's JSON body.
type BodyCheck = Box<dyn Fn(&Value) + Send>;

/// One request the sync must make: method and path first, then what it must
/// carry, then the answer.
struct Expect {
    method: Method,
    path: &'static str,
    query: Option<&'static str>,
    body: Option<BodyCheck>,
    reply: (StatusCode, Value),
    /// How long the API server takes to answer.
    delay: Duration,
}

fn expect(method: Method, path: &'static str) -> Expect {
    Expect { method, path, query: None, body: None, reply: (StatusCode::OK, json!({})), delay: Duration::ZERO }
}

impl Expect {
    /// The query string must contain `fragment`.
    fn query(mut self, fragment: &'static str) -> Self {
        self.query = Some(fragment);
        self
    }

    /// The answer comes after `delay`.
    fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// The JSON body must pass `check` (and any check given before).
    fn body(mut self, check: impl Fn(&Value) + Send + 'static) -> Self {
        let before = self.body.take();
        self.body = Some(Box::new(move |body| {
            if let Some(before) = &before {
                before(body);
            }
            check(body);
        }));
        self
    }

    fn reply(mut self, code: StatusCode, body: impl serde::Serialize) -> Self {
        self.reply = (code, serde_json::to_value(body).unwrap());
        self
    }

    /// A Normal or Warning event about the example Foo with this reason.
    fn event(kind: &'static str, reason: &'static str) -> Self {
        expect(Method::POST, EVENTS)
            .body(move |ev| {
                assert_eq!(ev["type"], kind);
                assert_eq!(ev["reason"], reason);
                assert_eq!(ev["regarding"]["kind"], "Foo");
                assert_eq!(ev["regarding"]["name"], "example-foo");
            })
            .reply(StatusCode::CREATED, json!({}))
    }
}

fn status(code: StatusCode, reason: &str, message: &str) -> Value {
    json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason,
        "message": message, "code": code.as_u16() })
}

/// A controller context whose caches hold `foos` and `deployments`, talking
/// to a mocked API server.
struct Mock {
    ctx: Arc<Context>,
    handle: ApiHandle,
    /// The context's fence, for each sync's Event publisher.
    fence: Option<Arc<WriteGate>>,
}

impl Mock {
    async fn new(foos: &[Foo], deployments: &[Deployment]) -> Self {
        Self::adopting(foos, deployments, false).await
    }

    /// With `adopt`, the adoption pass runs over the `default` namespace
    /// (as the operator starts it), and the syncs wait for it.
    async fn adopting(foos: &[Foo], deployments: &[Deployment], adopt: bool) -> Self {
        Self::with(foos, deployments, adopt, None).await
    }

    /// Under leader election, with `fence`: adopting once it leads, as the
    /// operator starts the pass when it takes the Lease.
    async fn fenced(foos: &[Foo], fence: Arc<WriteGate>) -> Self {
        Self::with(foos, &[], fence.holds(), Some(fence)).await
    }

    /// As the operator of `shard` is, with `foos` in its cache.
    async fn sharded(shard: &str, foos: &[Foo]) -> Self {
        Self::of_shard(&Shard::parse(shard).unwrap(), foos, &[], false, None).await
    }

    async fn with(foos: &[Foo], deployments: &[Deployment], adopt: bool, fence: Option<Arc<WriteGate>>) -> Self {
        Self::of_shard(&Shard::all(), foos, deployments, adopt, fence).await
    }

    async fn of_shard(
        shard: &Shard,
        foos: &[Foo],
        deployments: &[Deployment],
        adopt: bool,
        fence: Option<Arc<WriteGate>>,
    ) -> Self {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let caches = caches_of_shard(shard, foos, deployments).await;
        let adoption = if adopt {
            let adoption = Arc::new(Adoption::new(Api::namespaced(client.clone(), "default"), 1));
            start_adoption(&caches, &adoption, fence.clone());
            adoption
        } else {
            Arc::new(Adoption::none())
        };
        let ctx = Context::new(client, caches, adoption, Arc::new(Metrics::new()), None, fence.clone());
        Mock { ctx: Arc::new(ctx), handle, fence }
    }

    /// Run one sync of `foo` against `scenario`; return its result once
    /// every expected request was made, and fail if it made any other —
    /// its Events included, on every sync of this mock: they are sent in the
    /// background, so each sync gets a publisher of its own, flushed (and so
    /// closed) once the sync is done. A later sync that repeats an Event
    /// sends it as a new one (POST), where the operator's one publisher
    /// would count it into the first one's series (PATCH): either is a
    /// request the scenario must list.
    async fn sync(&mut self, foo: &Foo, scenario: Vec<Expect>) -> Result<Action, Error> {
        let events =
            Publisher::start(self.ctx.client.clone(), None, self.fence.clone(), self.ctx.metrics.queue.clone());
        // The last sync's task and flush are over: only the mock holds the
        // context.
        Arc::get_mut(&mut self.ctx).expect("a sync still holds the context").events = events;
        let sync = tokio::spawn(reconcile(Arc::new(foo.clone()), self.ctx.clone()));
        for (i, want) in scenario.into_iter().enumerate() {
            let (request, send): (Request<Body>, SendResponse<Response<Body>>) =
                tokio::time::timeout(Duration::from_secs(5), self.handle.next_request())
                    .await
                    .unwrap_or_else(|_| panic!("request #{i} ({} {}) was never made", want.method, want.path))
                    .expect("client dropped before all expected requests");
            assert_eq!((request.method(), request.uri().path()), (&want.method, want.path), "request #{i}");
            if let Some(q) = want.query {
                let query = request.uri().query().unwrap_or_default();
                assert!(query.contains(q), "request #{i}: query {query:?} lacks {q:?}");
            }
            if want.method == Method::PATCH {
                // The status is applied (server-side, forced, as our field
                // manager); every other patch is a merge patch: the API server
                // reads a strategic patch differently.
                let status = want.path.ends_with("/status");
                let content_type = request.headers().get(http::header::CONTENT_TYPE);
                let want_type = if status { "application/apply-patch+yaml" } else { "application/merge-patch+json" };
                assert_eq!(content_type.and_then(|v| v.to_str().ok()), Some(want_type), "request #{i}");
                let query = request.uri().query().unwrap_or_default();
                if status {
                    // Without field validation: the API server would parse
                    // the patch twice to warn of fields ours never sends.
                    assert!(
                        query.contains("fieldManager=sample-controller")
                            && query.contains("force=true")
                            && query.contains("fieldValidation=Ignore"),
                        "{query}"
                    );
                }
            }
            if let Some(check) = want.body {
                let bytes = request.into_body().collect_bytes().await.unwrap();
                check(&serde_json::from_slice(&bytes).unwrap());
            }
            let (code, body) = want.reply;
            tokio::time::sleep(want.delay).await;
            let response = Response::builder().status(code).body(Body::from(serde_json::to_vec(&body).unwrap()));
            send.send_response(response.unwrap());
        }
        let result = tokio::time::timeout(Duration::from_secs(5), sync).await.expect("sync did not finish").unwrap();
        let flushed = self.ctx.events.flush(Duration::from_secs(5));
        tokio::select! {
            Some((extra, _)) = self.handle.next_request() => {
                panic!("unexpected request {} {}", extra.method(), extra.uri());
            }
            _ = flushed => {}
        }
        result
    }
}

fn example_foo(replicas: i32) -> Foo {
    Foo::test("example-foo").replicas(replicas)
}

/// `foo` with the status an earlier sync wrote for `d`.
fn synced_with(mut foo: Foo, d: &Deployment) -> Foo {
    foo.status = decide(&foo, Some(&DeploymentView::from(d.clone())), &[], UNSHARDED, &Time(Timestamp::now())).status;
    foo
}

#[tokio::test]
async fn creates_deployment() {
    let foo = example_foo(1);
    let want = serde_json::to_value(desired_deployment(&foo, UNSHARDED).unwrap()).unwrap();
    let mut mock = Mock::new(std::slice::from_ref(&foo), &[]).await;
    let scenario = vec![
        expect(Method::POST, DEPLOYMENTS)
            .query("fieldManager=sample-controller")
            .body(move |body| assert_eq!(*body, want))
            .reply(StatusCode::CREATED, Deployment::owned_by(&foo).replicas(1).available(0)),
        expect(Method::PATCH, FOO_STATUS)
            .body(|body| {
                assert_eq!(body["status"]["availableReplicas"], 0);
                assert_eq!(body["status"]["observedGeneration"], 1);
            })
            .reply(StatusCode::OK, example_foo(1)),
        Expect::event("Normal", "Synced"),
    ];
    mock.sync(&foo, scenario).await.unwrap();
}

#[tokio::test]
async fn the_syncs_our_own_writes_trigger_make_no_request() {
    // The watches report the new Deployment and the new status only after
    // the writes return; syncs in between must not repeat them.
    let foo = example_foo(1);
    let mut mock = Mock::new(std::slice::from_ref(&foo), &[]).await;
    let mut written = foo.clone();
    written.metadata.resource_version = Some("101".into());
    written.status = synced_with(foo.clone(), &Deployment::owned_by(&foo).replicas(1).available(0)).status;
    let scenario = vec![
        expect(Method::POST, DEPLOYMENTS)
            .reply(StatusCode::CREATED, Deployment::owned_by(&foo).replicas(1).available(0)),
        expect(Method::PATCH, FOO_STATUS).reply(StatusCode::OK, written),
        Expect::event("Normal", "Synced"),
    ];
    mock.sync(&foo, scenario).await.unwrap();
    // The caches still hold the Foo without status and no Deployment.
    mock.sync(&foo, vec![]).await.unwrap();
}

#[tokio::test]
async fn does_nothing_when_in_sync() {
    let d = Deployment::owned_by(&example_foo(1)).replicas(1).available(1);
    let foo = synced_with(example_foo(1), &d);
    let mut mock = Mock::new(std::slice::from_ref(&foo), &[d]).await;
    // No request at all: no read, no Deployment write, no status, no event.
    mock.sync(&foo, vec![]).await.unwrap();
}

#[tokio::test]
async fn updates_deployment_replicas() {
    let foo = example_foo(3);
    let d = Deployment::owned_by(&foo).replicas(1).available(1);
    let mut scaled = d.clone();
    scaled.spec.as_mut().unwrap().replicas = Some(3);
    let mut mock = Mock::new(std::slice::from_ref(&foo), &[d]).await;
    let scenario = vec![
        expect(Method::PATCH, DEPLOYMENT)
            .query("fieldManager=sample-controller")
            // Only replicas, conditional on the version checked for ownership.
            .body(|body| {
                let metadata = json!({ "uid": "uid-deploy-example-foo", "resourceVersion": "200" });
                assert_eq!(*body, json!({ "metadata": metadata, "spec": { "replicas": 3 } }))
            })
            .reply(StatusCode::OK, scaled),
        expect(Method::PATCH, FOO_STATUS).reply(StatusCode::OK, example_foo(3)),
        Expect::event("Normal", "Synced"),
    ];
    mock.sync(&foo, scenario).await.unwrap();
}

#[tokio::test]
async fn a_stale_cached_version_ends_in_a_conflict_and_a_retry_never_a_blind_write() {
    let foo = example_foo(3);
    let cached = Deployment::owned_by(&foo).replicas(1).available(1); // resourceVersion 200
    let mut mock = Mock::new(std::slice::from_ref(&foo), &[cached]).await;
    let scenario = vec![
        expect(Method::PATCH, DEPLOYMENT)
            .body(|body| assert_eq!(body["metadata"]["resourceVersion"], "200"))
            .reply(StatusCode::CONFLICT, status(StatusCode::CONFLICT, "Conflict", "the object has been modified")),
        // Nothing else: no status, no event from a sync that did not happen.
    ];
    let err = mock.sync(&foo, scenario).await.unwrap_err();
    assert!(err.is_conflict(), "{err}");
    let retry = error_policy(Arc::new(foo), &err, mock.ctx.clone());
    assert_eq!(retry, Action::requeue(Duration::from_millis(5)));
}

#[tokio::test]
async fn not_controlled_by_us() {
    // Someone else's Deployment, without our label: not in the cache. The
    // create finds it; it is read once and never written.
    let foo = example_foo(3);
    let mut mock = Mock::new(std::slice::from_ref(&foo), &[]).await;
    let scenario = vec![
        expect(Method::POST, DEPLOYMENTS)
            .reply(StatusCode::CONFLICT, status(StatusCode::CONFLICT, "AlreadyExists", "already exists")),
        expect(Method::GET, DEPLOYMENT).reply(StatusCode::OK, Deployment::foreign("example-foo").replicas(1)),
        expect(Method::PATCH, FOO_STATUS)
            .body(|body| assert_eq!(body["status"]["conditions"][0]["reason"], "ErrResourceExists"))
            .reply(StatusCode::OK, example_foo(3)),
        Expect::event("Warning", "ErrResourceExists")
            .body(|ev| assert_eq!(ev["note"], r#"Resource "example-foo" already exists and is not managed by Foo"#)),
    ];
    let err = mock.sync(&foo, scenario).await.unwrap_err();
    assert!(matches!(err, Error::ResourceExists { ref deployment, .. } if deployment == "example-foo"), "{err}");
}

/// The label-only adoption patch of the example Foo's Deployment.
fn adoption_patch() -> Expect {
    expect(Method::PATCH, DEPLOYMENT).query("fieldManager=sample-controller").body(|body| {
        let labels = json!({ "app.kubernetes.io/managed-by": "sample-controller" });
        let metadata = json!({ "uid": "uid-deploy-example-foo", "resourceVersion": "200", "labels": labels });
        assert_eq!(*body, json!({ "metadata": metadata }), "metadata only: no rollout");
    })
}

#[tokio::test]
async fn the_first_sync_adopts_upstreams_deployments_with_one_list_and_a_label_patch_each() {
    // Upstream's controller made the Deployment: our watch cannot see it.
    let foo = example_foo(2);
    let upstreams = Deployment::made_by_upstream(&foo).replicas(2).available(2);
    let mut adopted = upstreams.clone();
    adopted.metadata.labels = Some([("app.kubernetes.io/managed-by".into(), "sample-controller".into())].into());
    adopted.metadata.resource_version = Some("201".into());
    let list = json!({ "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList", "metadata": {},
        "items": [serde_json::to_value(PartialObjectMetaExt::into_response_partial::<Deployment>(upstreams.metadata.clone())).unwrap()] });
    let synced = synced_with(foo.clone(), &adopted);
    let mut mock = Mock::adopting(std::slice::from_ref(&foo), &[], true).await;
    let scenario = vec![
        expect(Method::GET, DEPLOYMENTS)
            .query("labelSelector=%21app.kubernetes.io%2Fmanaged-by")
            .reply(StatusCode::OK, list),
        adoption_patch().reply(StatusCode::OK, adopted),
        // No create attempt: the sync finds it adopted, and only writes status.
        expect(Method::PATCH, FOO_STATUS)
            .body(|body| assert_eq!(body["status"]["availableReplicas"], 2))
            .reply(StatusCode::OK, synced.clone()),
        Expect::event("Normal", "Synced"),
    ];
    mock.sync(&foo, scenario).await.unwrap();
    // The pass ran once, and the adopted Deployment is cached: the next
    // sync makes no request at all.
    mock.sync(&synced, vec![]).await.unwrap();
}

#[tokio::test]
async fn the_adoption_pass_reads_page_after_page_and_leaves_alone_a_deployment_its_foo_no_longer_names() {
    // Upstream ran while the Foo's deploymentName changed: it made the new
    // Deployment and left the old one serving.
    let foo = example_foo(2);
    let upstreams = Deployment::made_by_upstream(&foo).replicas(2).available(2);
    let mut old = Deployment::made_by_upstream(&foo.clone().deployment("old-name"));
    old.metadata.uid = Some("uid-old-name".into());
    let mut adopted = upstreams.clone();
    adopted.metadata.labels = Some([("app.kubernetes.io/managed-by".into(), "sample-controller".into())].into());
    adopted.metadata.resource_version = Some("201".into());
    let page = |d: &Deployment, next: &str| {
        let item = serde_json::to_value(PartialObjectMetaExt::into_response_partial::<Deployment>(d.metadata.clone()));
        json!({ "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
            "metadata": { "continue": next }, "items": [item.unwrap()] })
    };
    let synced = synced_with(foo.clone(), &adopted);
    let mut mock = Mock::adopting(std::slice::from_ref(&foo), &[], true).await;
    let scenario = vec![
        expect(Method::GET, DEPLOYMENTS).query("limit=500").reply(StatusCode::OK, page(&old, "page-2")),
        expect(Method::GET, DEPLOYMENTS).query("continue=page-2").reply(StatusCode::OK, page(&upstreams, "")),
        // One patch, of the Deployment the Foo names; none of the old one.
        adoption_patch().reply(StatusCode::OK, adopted),
        expect(Method::PATCH, FOO_STATUS).reply(StatusCode::OK, synced.clone()),
        Expect::event("Warning", "OldDeploymentNotAdopted"),
        Expect::event("Normal", "Synced"),
    ];
    mock.sync(&foo, scenario).await.unwrap();
    // Reported once: the next sync makes no request, the Warning included.
    mock.sync(&synced, vec![]).await.unwrap();
}

#[tokio::test]
async fn a_sync_that_meets_an_unlabelled_deployment_of_its_foo_adopts_it() {
    // Made by upstream after the adoption pass, or our label removed by hand.
    let foo = example_foo(2);
    let upstreams = Deployment::made_by_upstream(&foo).replicas(2).available(2);
    let mut mock = Mock::new(std::slice::from_ref(&foo), &[]).await;
    let scenario = vec![
        expect(Method::POST, DEPLOYMENTS)
            .reply(StatusCode::CONFLICT, status(StatusCode::CONFLICT, "AlreadyExists", "already exists")),
        expect(Method::GET, DEPLOYMENT).reply(StatusCode::OK, upstreams.clone()),
        adoption_patch().reply(StatusCode::OK, Deployment::owned_by(&foo).replicas(2).available(2)),
        expect(Method::PATCH, FOO_STATUS).reply(StatusCode::OK, foo.clone()),
        Expect::event("Normal", "Synced"),
    ];
    mock.sync(&foo, scenario).await.unwrap();
}

#[tokio::test]
async fn a_cached_lookalike_we_do_not_control_is_refused_without_a_request_to_it() {
    let foo = example_foo(3);
    let mut lookalike = Deployment::owned_by(&foo).replicas(1).available(1);
    lookalike.metadata.owner_references.as_mut().unwrap()[0].uid = "uid-someone-else".into();
    let mut mock = Mock::new(std::slice::from_ref(&foo), &[lookalike]).await;
    let scenario = vec![
        expect(Method::PATCH, FOO_STATUS).reply(StatusCode::OK, example_foo(3)),
        Expect::event("Warning", "ErrResourceExists"),
    ];
    let err = mock.sync(&foo, scenario).await.unwrap_err();
    assert!(matches!(err, Error::ResourceExists { .. }), "{err}");
}

#[tokio::test]
async fn api_errors_fail_the_sync_without_panicking() {
    let foo = example_foo(1);
    let mut mock = Mock::new(std::slice::from_ref(&foo), &[]).await;
    let boom = status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", "etcdserver: request timed out");
    let scenario = vec![expect(Method::POST, DEPLOYMENTS).reply(StatusCode::INTERNAL_SERVER_ERROR, boom)];
    let err = mock.sync(&foo, scenario).await.unwrap_err();
    assert!(matches!(err, Error::Api { action: ApiAction::CreateDeployment, .. }), "{err}");
    assert!(err.to_string().starts_with("Foo default/example-foo: create Deployment"), "{err}");
}

#[tokio::test]
async fn a_sync_retried_after_a_server_error_records_its_event_then() {
    // The failed sync wrote nothing and said nothing; the retry does both,
    // its Event checked as the first sync's would be.
    let foo = example_foo(1);
    let mut mock = Mock::new(std::slice::from_ref(&foo), &[]).await;
    let boom = status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", "etcdserver: request timed out");
    let failed = vec![expect(Method::POST, DEPLOYMENTS).reply(StatusCode::INTERNAL_SERVER_ERROR, boom)];
    mock.sync(&foo, failed).await.unwrap_err();
    let retried = vec![
        expect(Method::POST, DEPLOYMENTS)
            .reply(StatusCode::CREATED, Deployment::owned_by(&foo).replicas(1).available(0)),
        expect(Method::PATCH, FOO_STATUS).reply(StatusCode::OK, example_foo(1)),
        Expect::event("Normal", "Synced"),
    ];
    mock.sync(&foo, retried).await.unwrap();
}

#[tokio::test]
async fn a_renamed_foo_deletes_its_old_deployment_only_if_it_is_still_that_very_object() {
    let before = Foo::test("example-foo").deployment("old-name").replicas(1);
    let old = Deployment::owned_by(&before).replicas(1).available(1);
    let foo = before.deployment("new-name").generation(2);
    let mut mock = Mock::new(std::slice::from_ref(&foo), &[old]).await;
    let scenario = vec![
        expect(Method::POST, DEPLOYMENTS)
            .body(|body| assert_eq!(body["metadata"]["name"], "new-name"))
            .reply(StatusCode::CREATED, Deployment::owned_by(&foo).replicas(1)),
        expect(Method::DELETE, "/apis/apps/v1/namespaces/default/deployments/old-name")
            .body(|body| {
                // The uid precondition: a successor under that name is not ours to delete.
                assert_eq!(body["preconditions"]["uid"], "uid-deploy-old-name");
                assert_eq!(body["propagationPolicy"], "Background");
            })
            .reply(StatusCode::OK, status(StatusCode::OK, "", "")),
        expect(Method::PATCH, FOO_STATUS).reply(StatusCode::OK, foo.clone()),
        Expect::event("Normal", "DeletedOldDeployment"),
        Expect::event("Normal", "Synced"),
    ];
    mock.sync(&foo, scenario).await.unwrap();
}

#[tokio::test]
async fn an_invalid_spec_is_reported_once_and_not_retried() {
    // An empty deploymentName: only an older CRD without validation admits it.
    let foo = Foo::test("example-foo").deployment("");
    let mut mock = Mock::new(std::slice::from_ref(&foo), &[]).await;
    let refused = Arc::new(std::sync::Mutex::new(None));
    let seen = refused.clone();
    let scenario = vec![
        expect(Method::PATCH, FOO_STATUS)
            .body(move |body| {
                assert_eq!(body["status"]["conditions"][0]["reason"], "InvalidSpec");
                *seen.lock().unwrap() = Some(body["status"].clone());
            })
            .reply(StatusCode::OK, foo.clone()),
        Expect::event("Warning", "InvalidSpec"),
    ];
    // Done, not failed: no backoff retry loop; the next change of the Foo
    // triggers a sync.
    assert_eq!(mock.sync(&foo, scenario).await.unwrap(), Action::await_change());
    let mut reported = foo.clone();
    reported.status = Some(serde_json::from_value(refused.lock().unwrap().clone().unwrap()).unwrap());
    let mut again = Mock::new(std::slice::from_ref(&reported), &[]).await;
    assert_eq!(again.sync(&reported, vec![]).await.unwrap(), Action::await_change(), "said once");
}

#[tokio::test]
async fn a_standby_syncs_nothing() {
    // A replica that does not hold the Lease (its fence never held) keeps
    // its caches but makes no request for a Foo, not even a read.
    let foo = example_foo(1);
    let mut mock = Mock::fenced(std::slice::from_ref(&foo), Arc::new(WriteGate::new())).await;
    mock.ctx.metrics.queue.added("default/example-foo".into());
    let action = mock.sync(&foo, vec![]).await.unwrap();
    assert_eq!(action, Action::await_change());
    // Nor does it report the Foo as waiting (the backlog alert reads this).
    let depth =
        metric_value(&mock.ctx.metrics.encode(), r#"workqueue_depth{name="foo",controller="foo",priority="0"}"#);
    assert_eq!(depth, Some(0.0), "a standby's queue depth grows with every trigger");
}

#[tokio::test]
async fn a_leader_paused_mid_sync_past_its_renew_deadline_writes_nothing() {
    // The fence holds when the sync starts and lapses while it waits for the
    // API server (as a leader paused mid-sync finds on resuming): no write
    // follows — not the create, not the status (its queued events:
    // src/reconcile/events/mod.rs).
    let foo = example_foo(1);
    let fence = Arc::new(WriteGate::holding_for(Duration::from_millis(200)));
    let mut mock = Mock::fenced(std::slice::from_ref(&foo), fence).await;
    let list =
        json!({ "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList", "metadata": {}, "items": null });
    // The adoption pass's list is a read, and reads are harmless.
    let scenario = vec![expect(Method::GET, DEPLOYMENTS).reply(StatusCode::OK, list).after(Duration::from_millis(400))];
    let err = mock.sync(&foo, scenario).await.unwrap_err();
    assert!(matches!(err, Error::NotLeading { .. }), "{err}");
}

#[tokio::test]
async fn a_leader_whose_renewal_is_late_keeps_every_foo_for_when_it_renews() {
    // Past its renew deadline without having lost the Lease (a renewal slow
    // on a loaded machine): a sync writes nothing and comes back, rather
    // than being dropped as a standby's is — nothing would bring it back
    // once the next renewal reopens the gate.
    let foo = example_foo(1);
    let fence = Arc::new(WriteGate::holding_for(Duration::from_millis(20)));
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert!(fence.interrupted(), "the renewal is late");
    let mut mock = Mock::fenced(std::slice::from_ref(&foo), fence.clone()).await;
    let action = mock.sync(&foo, vec![]).await.unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(1)), "kept, making no request");
}

#[tokio::test]
async fn a_write_refused_by_the_api_servers_leader_fence_stops_every_write_until_the_lease_is_checked() {
    // The API server's fence (deploy/11-leader-fence-policy.yaml) refuses the
    // create: the sync fails, its retry waits a second, and the fence is in
    // doubt, so the next sync of any Foo writes nothing and comes back later
    // instead of being dropped.
    let foo = example_foo(1);
    let mut other = Foo::test("another-foo").deployment("another-foo").replicas(1);
    other.metadata.namespace = foo.metadata.namespace.clone();
    let fence = Arc::new(WriteGate::holding_for(Duration::from_secs(10)));
    let mut mock = Mock::fenced(&[foo.clone(), other.clone()], fence.clone()).await;
    let list =
        json!({ "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList", "metadata": {}, "items": null });
    let denied = status(
        StatusCode::FORBIDDEN,
        "Forbidden",
        "ValidatingAdmissionPolicy 'sample-controller-leader-fence' with binding 'sample-controller-leader-fence' \
         denied request: pod a holds no Lease of the operator: its LeaderFence sample-controller/sample-controller \
         names sample-controller held by b_2a",
    );
    let scenario = vec![
        expect(Method::GET, DEPLOYMENTS).reply(StatusCode::OK, list),
        expect(Method::POST, DEPLOYMENTS).reply(StatusCode::FORBIDDEN, denied),
    ];
    let err = mock.sync(&foo, scenario).await.unwrap_err();
    assert!(err.is_fence_refusal(), "{err}");
    let retry = error_policy(Arc::new(foo.clone()), &err, mock.ctx.clone());
    assert_eq!(retry, Action::requeue(Duration::from_secs(1)), "a second, not the 5 ms of a first failure");
    assert!(fence.in_doubt() && !fence.holds(), "the fence is in doubt");
    let again = mock.sync(&foo, vec![]).await.unwrap();
    assert_eq!(again, Action::requeue(Duration::from_secs(1)), "held, not dropped, while the Lease is checked");
    // Every Foo's, not only the refused one's: the doubt is the leader's.
    let others = mock.sync(&other, vec![]).await.unwrap();
    assert_eq!(others, Action::requeue(Duration::from_secs(1)), "another Foo's sync held too, making no request");
}

/// The example Foo's Deployment, synced, as the shard `label` made it.
fn in_shard(foo: &Foo, label: &str) -> Deployment {
    let mut d = Deployment::owned_by(foo).replicas(1).available(1);
    d.metadata.labels.get_or_insert_default().insert("shard".into(), label.into());
    d
}

/// The create that meets the Deployment its cache lacks, and the read of it.
fn create_meets(d: &Deployment) -> Vec<Expect> {
    vec![
        expect(Method::POST, DEPLOYMENTS)
            .reply(StatusCode::CONFLICT, status(StatusCode::CONFLICT, "AlreadyExists", "already exists")),
        expect(Method::GET, DEPLOYMENT).reply(StatusCode::OK, d),
    ]
}

/// The Foo read afresh: a list narrowed to its name (`get` is not granted).
fn foo_listed(foo: &Foo) -> Expect {
    let list = json!({ "apiVersion": "samplecontroller.k8s.io/v1alpha1", "kind": "FooList", "metadata": {},
        "items": [foo] });
    expect(Method::GET, FOOS).query("fieldSelector=metadata.name%3Dexample-foo").reply(StatusCode::OK, list)
}

#[tokio::test]
async fn a_foo_moved_into_the_shard_has_its_deployment_relabelled_after_one_fresh_read() {
    let foo = example_foo(1).label("shard", "b");
    let d = in_shard(&foo, "a");
    let foo = synced_with(foo, &d);
    let mut mock = Mock::sharded("shard=b", std::slice::from_ref(&foo)).await;
    let mut scenario = create_meets(&d);
    scenario.push(foo_listed(&foo));
    scenario.push(
        expect(Method::PATCH, DEPLOYMENT)
            .body(|body| {
                assert_eq!(body["metadata"]["labels"], json!({ "shard": "b" }));
                assert_eq!(body.get("spec"), None, "metadata only: no rollout");
            })
            .reply(StatusCode::OK, in_shard(&foo, "b")),
    );
    scenario.push(Expect::event("Normal", "Synced"));
    assert_eq!(mock.sync(&foo, scenario).await.unwrap(), Action::await_change());
}

#[tokio::test]
async fn a_shard_whose_copy_of_a_foo_is_older_than_its_move_writes_nothing() {
    // Shard a still caches the Foo as it was; the Foo, now in shard b, had
    // its Deployment relabelled by b.
    let cached = example_foo(1).label("shard", "a");
    let d = in_shard(&cached, "b");
    let cached = synced_with(cached, &d);
    let mut moved = cached.clone();
    moved.metadata.labels = Some([("shard".to_owned(), "b".to_owned())].into());
    let mut mock = Mock::sharded("shard=a", std::slice::from_ref(&cached)).await;
    let mut scenario = create_meets(&d);
    scenario.push(foo_listed(&moved));
    let retry = mock.sync(&cached, scenario).await.unwrap();
    assert_ne!(retry, Action::await_change(), "looked at again later, when the watch has caught up");
}
