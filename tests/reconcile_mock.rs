//! Reconciler tests against a mocked API server (tower-test), after
//! upstream's controller_test.go: each scenario lists the API requests one
//! sync must make, in order, answers them, and fails on any request it did
//! not expect — so "does nothing" is proven to make no write at all.

use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::client::Body;
use sample_controller::controller::{Context, reconcile};
use sample_controller::decision::decide;
use sample_controller::deployment::desired_deployment;
use sample_controller::metrics::Metrics;
use sample_controller::testing::{foo, foreign_deployment, owned_deployment};
use sample_controller::{Error, Foo};
use serde_json::{Value, json};
use tower_test::mock::{Handle, SendResponse};

type ApiHandle = Handle<Request<Body>, Response<Body>>;

fn example_foo(replicas: i32) -> Foo {
    foo("example-foo", "example-foo", Some(replicas))
}

fn list(items: Vec<Deployment>) -> Value {
    json!({ "apiVersion": "apps/v1", "kind": "DeploymentList", "metadata": { "resourceVersion": "50" }, "items": items })
}

fn not_found() -> (StatusCode, Value) {
    let status = json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
        "message": "deployments.apps \"example-foo\" not found", "code": 404 });
    (StatusCode::NOT_FOUND, status)
}

/// A check of a write's JSON body.
type BodyCheck = Box<dyn Fn(&Value) + Send>;

/// One request the sync must make, checked and answered.
struct Expect {
    method: Method,
    path: &'static str,
    /// A query-string fragment the request must carry.
    query: Option<&'static str>,
    /// Checks the JSON body of a write.
    body: Option<BodyCheck>,
    reply: (StatusCode, Value),
}

fn expect(method: Method, path: &'static str, reply: (StatusCode, Value)) -> Expect {
    Expect { method, path, query: None, body: None, reply }
}

async fn serve(handle: &mut ApiHandle, scenario: Vec<Expect>) {
    for (i, want) in scenario.into_iter().enumerate() {
        let (request, send): (Request<Body>, SendResponse<Response<Body>>) =
            tokio::time::timeout(Duration::from_secs(5), handle.next_request())
                .await
                .unwrap_or_else(|_| panic!("request #{i} ({} {}) was never made", want.method, want.path))
                .expect("service dropped before all expected requests");
        assert_eq!(request.method(), want.method, "request #{i}: {}", request.uri());
        assert_eq!(request.uri().path(), want.path, "request #{i}");
        if let Some(q) = want.query {
            let query = request.uri().query().unwrap_or_default();
            assert!(query.contains(q), "request #{i}: query {query:?} lacks {q:?}");
        }
        if let Some(check) = want.body {
            let bytes = request.into_body().collect_bytes().await.unwrap();
            let body: Value = serde_json::from_slice(&bytes).unwrap();
            check(&body);
        }
        let (code, body) = want.reply;
        send.send_response(
            Response::builder().status(code).body(Body::from(serde_json::to_vec(&body).unwrap())).unwrap(),
        );
    }
}

/// Run one sync of `foo` against `scenario`; return its result once every
/// expected request was made, and fail if it made any other.
async fn sync_once(foo: Foo, scenario: Vec<Expect>) -> Result<(), Error> {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let ctx = Arc::new(Context::new(client, Arc::new(Metrics::new()), None));
    let sync = tokio::spawn(reconcile(Arc::new(foo), ctx));
    serve(&mut handle, scenario).await;
    let result = tokio::time::timeout(Duration::from_secs(5), sync).await.expect("sync did not finish").unwrap();
    // The Context (and so the client) is gone with the finished sync; any
    // request made after the last expected one is still queued here.
    if let Ok(Some((extra, _))) = tokio::time::timeout(Duration::from_millis(200), handle.next_request()).await {
        panic!("unexpected request {} {}", extra.method(), extra.uri());
    }
    result.map(|_| ())
}

const DEPLOYMENT: &str = "/apis/apps/v1/namespaces/default/deployments/example-foo";
const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/default/deployments";
const FOO_STATUS: &str = "/apis/samplecontroller.k8s.io/v1alpha1/namespaces/default/foos/example-foo/status";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";

fn list_request(items: Vec<Deployment>) -> Expect {
    Expect { query: Some("labelSelector="), ..expect(Method::GET, DEPLOYMENTS, (StatusCode::OK, list(items))) }
}

fn event_with(reason: &'static str, kind: &'static str) -> Expect {
    Expect {
        body: Some(Box::new(move |ev: &Value| {
            assert_eq!(ev["reason"], reason);
            assert_eq!(ev["type"], kind);
            assert_eq!(ev["regarding"]["kind"], "Foo");
            assert_eq!(ev["regarding"]["name"], "example-foo");
        })),
        ..expect(Method::POST, EVENTS, (StatusCode::CREATED, json!({})))
    }
}

#[tokio::test]
async fn creates_deployment() {
    let foo = example_foo(1);
    let want = serde_json::to_value(desired_deployment(&foo).unwrap()).unwrap();
    let created = serde_json::to_value(owned_deployment(&foo, 1, 0)).unwrap();
    let scenario = vec![
        expect(Method::GET, DEPLOYMENT, not_found()),
        list_request(vec![]),
        Expect {
            query: Some("fieldManager=sample-controller"),
            body: Some(Box::new(move |body: &Value| assert_eq!(*body, want))),
            ..expect(Method::POST, DEPLOYMENTS, (StatusCode::CREATED, created))
        },
        Expect {
            body: Some(Box::new(|body: &Value| {
                assert_eq!(body["status"]["availableReplicas"], 0);
                assert_eq!(body["status"]["observedGeneration"], 1);
            })),
            ..expect(Method::PATCH, FOO_STATUS, (StatusCode::OK, serde_json::to_value(example_foo(1)).unwrap()))
        },
        event_with("Synced", "Normal"),
    ];
    sync_once(foo, scenario).await.unwrap();
}

#[tokio::test]
async fn does_nothing_when_in_sync() {
    let mut foo = example_foo(1);
    let d = owned_deployment(&foo, 1, 1);
    // The status a previous sync wrote.
    foo.status = decide(&foo, Some(&d), &[], &Time(Timestamp::now())).status;
    let scenario = vec![
        expect(Method::GET, DEPLOYMENT, (StatusCode::OK, serde_json::to_value(&d).unwrap())),
        list_request(vec![d.clone()]),
        // Nothing else: no Deployment write, no status write, no event.
    ];
    sync_once(foo, scenario).await.unwrap();
}

#[tokio::test]
async fn updates_deployment_replicas() {
    let foo = example_foo(3);
    let d = owned_deployment(&foo, 1, 1);
    let mut scaled = d.clone();
    scaled.spec.as_mut().unwrap().replicas = Some(3);
    let scenario = vec![
        expect(Method::GET, DEPLOYMENT, (StatusCode::OK, serde_json::to_value(&d).unwrap())),
        list_request(vec![d.clone()]),
        Expect {
            query: Some("fieldManager=sample-controller"),
            // Only replicas, conditional on the version checked for ownership.
            body: Some(Box::new(|body: &Value| {
                assert_eq!(*body, json!({ "metadata": { "resourceVersion": "200" }, "spec": { "replicas": 3 } }));
            })),
            ..expect(Method::PATCH, DEPLOYMENT, (StatusCode::OK, serde_json::to_value(&scaled).unwrap()))
        },
        expect(Method::PATCH, FOO_STATUS, (StatusCode::OK, serde_json::to_value(example_foo(3)).unwrap())),
        event_with("Synced", "Normal"),
    ];
    sync_once(foo, scenario).await.unwrap();
}

#[tokio::test]
async fn not_controlled_by_us() {
    let foo = example_foo(3);
    let d = foreign_deployment("example-foo", 1);
    let scenario = vec![
        expect(Method::GET, DEPLOYMENT, (StatusCode::OK, serde_json::to_value(&d).unwrap())),
        list_request(vec![]),
        Expect {
            body: Some(Box::new(|body: &Value| {
                assert_eq!(body["status"]["conditions"][0]["reason"], "ErrResourceExists");
            })),
            ..expect(Method::PATCH, FOO_STATUS, (StatusCode::OK, serde_json::to_value(example_foo(3)).unwrap()))
        },
        Expect {
            body: Some(Box::new(|ev: &Value| {
                assert_eq!(ev["type"], "Warning");
                assert_eq!(ev["reason"], "ErrResourceExists");
                assert_eq!(ev["note"], r#"Resource "example-foo" already exists and is not managed by Foo"#);
            })),
            ..expect(Method::POST, EVENTS, (StatusCode::CREATED, json!({})))
        },
        // No request to the Deployment beyond the read.
    ];
    let err = sync_once(foo, scenario).await.unwrap_err();
    assert!(matches!(err, Error::ResourceExists { ref deployment, .. } if deployment == "example-foo"), "{err}");
}

#[tokio::test]
async fn api_errors_fail_the_sync_without_panicking() {
    let foo = example_foo(1);
    let boom = json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "InternalError",
        "message": "etcdserver: request timed out", "code": 500 });
    let scenario = vec![expect(Method::GET, DEPLOYMENT, (StatusCode::INTERNAL_SERVER_ERROR, boom))];
    let err = sync_once(foo, scenario).await.unwrap_err();
    assert!(matches!(err, Error::Api { action: "get Deployment", .. }), "{err}");
    assert!(err.to_string().starts_with("Foo default/example-foo: get Deployment"), "{err}");
}
