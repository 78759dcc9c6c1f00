//! What the API server itself enforces with our CRD: invalid Foos are
//! refused at admission with a message a user can act on, and nothing is
//! created for them.

mod common;

use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use sample_controller::Foo;
use serde_json::{Value, json};

fn foo_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("samplecontroller.k8s.io", "v1alpha1", "Foo"))
}

async fn create_raw(ns: &TestNamespace, spec: Value) -> Result<DynamicObject, kube::Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(ns.client.clone(), &ns.name, &foo_resource());
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "samplecontroller.k8s.io/v1alpha1",
        "kind": "Foo",
        "metadata": { "name": "bad-foo" },
        "spec": spec,
    }))
    .unwrap();
    api.create(&PostParams::default(), &obj).await
}

fn rejection(result: Result<DynamicObject, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422, "expected 422 Invalid, got {s:?}");
            s.message
        }
        Err(e) => panic!("expected a validation error, got {e}"),
        Ok(o) => panic!("the API server accepted an invalid Foo: {:?}", o.data),
    }
}

#[tokio::test]
async fn invalid_foos_are_rejected_with_a_clear_message() {
    let ns = TestNamespace::new("invalid").await;
    let _controller = start_controller(ns.client.clone(), Some(&ns.name));
    let cases = [
        (
            json!({ "deploymentName": "d", "replicas": 0 }),
            "spec.replicas: Invalid value: 0: spec.replicas in body should be greater than or equal to 1",
        ),
        (
            json!({ "deploymentName": "d", "replicas": 11 }),
            "spec.replicas: Invalid value: 11: spec.replicas in body should be less than or equal to 10",
        ),
        (json!({ "replicas": 1 }), "spec.deploymentName: Required value"),
        (
            json!({ "deploymentName": "", "replicas": 1 }),
            "spec.deploymentName: Invalid value: \"\": spec.deploymentName in body should be at least 1 chars long",
        ),
        (
            json!({ "deploymentName": "Bad_Name", "replicas": 1 }),
            "must be a valid Deployment name: a DNS-1123 subdomain",
        ),
        (json!({ "deploymentName": "-leading-dash" }), "must be a valid Deployment name"),
        (json!({ "deploymentName": "a".repeat(254) }), "spec.deploymentName: Too long"),
        (
            json!({ "deploymentName": "d", "replicas": "three" }),
            "spec.replicas: Invalid value: \"string\": spec.replicas in body must be of type integer",
        ),
        (
            json!({ "deploymentName": 5 }),
            "spec.deploymentName: Invalid value: \"integer\": spec.deploymentName in body must be of type string",
        ),
    ];
    for (spec, want) in cases {
        let message = rejection(create_raw(&ns, spec.clone()).await);
        assert!(message.contains(want), "spec {spec}: message {message:?} lacks {want:?}");
    }
    // Missing spec altogether.
    let api: Api<DynamicObject> = Api::namespaced_with(ns.client.clone(), &ns.name, &foo_resource());
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "samplecontroller.k8s.io/v1alpha1", "kind": "Foo", "metadata": { "name": "no-spec" }
    }))
    .unwrap();
    let message = rejection(api.create(&PostParams::default(), &obj).await);
    assert!(message.contains("spec: Required value"), "{message}");

    // A valid one goes through, so the failures above were about validity.
    create_raw(&ns, json!({ "deploymentName": "fine.name-1", "replicas": 10 })).await.expect("valid Foo");
    let foos = ns.api::<Foo>().list(&ListParams::default()).await.unwrap().items;
    assert_eq!(foos.len(), 1, "only the valid Foo exists");
    wait_until("the valid Foo's Deployment", TIMEOUT, || async { deployment(&ns, "fine.name-1").await }).await;
    let deployments = ns.api::<Deployment>().list(&ListParams::default()).await.unwrap().items;
    assert_eq!(deployments.len(), 1, "nothing was created for the invalid Foos");
}

#[tokio::test]
async fn kubectl_explains_the_rejection() {
    let ns = TestNamespace::new("kubectl-invalid").await;
    let bad = "apiVersion: samplecontroller.k8s.io/v1alpha1\nkind: Foo\nmetadata:\n  name: bad\nspec:\n  deploymentName: Example_Foo\n  replicas: 1\n";
    let path = std::env::temp_dir().join(format!("{}-bad-foo.yaml", ns.name));
    std::fs::write(&path, bad).unwrap();
    let out = ns.kubectl(&["apply", "-f", path.to_str().unwrap()]);
    let _ = std::fs::remove_file(&path);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("The Foo \"bad\" is invalid"), "{stderr}");
    assert!(stderr.contains("must be a valid Deployment name"), "{stderr}");
}
