//! What the API server itself enforces with our CRD: invalid Foos are
//! refused at admission with a message a user can act on, and nothing is
//! created for them.

mod common;

use std::collections::BTreeSet;

use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{DynamicObject, ListParams};
use sample_controller::Foo;
use serde_json::{Value, json};

/// Create `object` as a Foo the way `kubectl apply` creates a new object:
/// a POST with strict field validation (unknown fields are errors, not
/// silently dropped).
async fn apply_raw(ns: &TestNamespace, object: Value) -> Result<DynamicObject, kube::Error> {
    let uri = format!("/apis/samplecontroller.k8s.io/v1alpha1/namespaces/{}/foos?fieldValidation=Strict", ns.name);
    let request = http::Request::post(uri)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(&object).unwrap())
        .unwrap();
    ns.client.request(request).await
}

/// A Foo named `bad-foo` with `spec` (anything, even not an object).
fn foo_with_spec(spec: Value) -> Value {
    json!({ "apiVersion": "samplecontroller.k8s.io/v1alpha1", "kind": "Foo", "metadata": { "name": "bad-foo" }, "spec": spec })
}

/// The API server's message for a refused Foo (422 Invalid, or 400 for a
/// body that does not decode under strict validation).
fn rejection(result: Result<DynamicObject, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(s)) => {
            assert!(s.code == 422 || s.code == 400, "expected 422 Invalid or 400 BadRequest, got {s:?}");
            with_cel_values_as_type(&s.message)
        }
        Err(e) => panic!("expected a validation error, got {e}"),
        Ok(o) => panic!("the API server accepted an invalid Foo: {:?}", o.data),
    }
}

/// A CEL rule's refusal names the value that failed from Kubernetes 1.37 on
/// (`Invalid value: "Bad_Name": ...`) and only its type before
/// (`Invalid value: "string": ...`): read both as the latter, so one
/// expectation holds on every supported minor.
fn with_cel_values_as_type(message: &str) -> String {
    const MARK: &str = "Invalid value: \"";
    let mut out = String::new();
    let mut rest = message;
    while let Some(at) = rest.find(MARK) {
        out.push_str(&rest[..at + MARK.len()]);
        rest = &rest[at + MARK.len()..];
        let end = rest.find("\": must be a valid Deployment name");
        // The value ends there, unless another refusal starts first.
        if let Some(end) = end.filter(|end| !rest[..*end].contains(MARK)) {
            out.push_str("string");
            rest = &rest[end..];
        }
    }
    out.push_str(rest);
    out
}

/// Invalid Foos, each with what the refusal must say: the field it names
/// and why.
fn invalid_foos() -> Vec<(&'static str, Value, &'static str)> {
    let spec = |s: Value| foo_with_spec(s);
    let many_unknown: serde_json::Map<String, Value> = (0..500)
        .map(|i| (format!("extra{i}"), json!("x".repeat(100))))
        .chain([("deploymentName".into(), json!("d"))])
        .collect();
    vec![
        (
            "replicas 0",
            spec(json!({ "deploymentName": "d", "replicas": 0 })),
            "spec.replicas: Invalid value: 0: spec.replicas in body should be greater than or equal to 1",
        ),
        (
            "replicas 11",
            spec(json!({ "deploymentName": "d", "replicas": 11 })),
            "spec.replicas: Invalid value: 11: spec.replicas in body should be less than or equal to 10",
        ),
        (
            "negative replicas",
            spec(json!({ "deploymentName": "d", "replicas": -1 })),
            "spec.replicas: Invalid value: -1",
        ),
        ("huge replicas", spec(json!({ "deploymentName": "d", "replicas": 1_i64 << 40 })), "spec.replicas"),
        (
            "replicas as a string",
            spec(json!({ "deploymentName": "d", "replicas": "three" })),
            "spec.replicas: Invalid value: \"string\": spec.replicas in body must be of type integer",
        ),
        ("replicas as an empty string", spec(json!({ "deploymentName": "d", "replicas": "" })), "spec.replicas"),
        ("fractional replicas", spec(json!({ "deploymentName": "d", "replicas": 1.5 })), "spec.replicas"),
        ("replicas as a boolean", spec(json!({ "deploymentName": "d", "replicas": true })), "spec.replicas"),
        ("replicas as an object", spec(json!({ "deploymentName": "d", "replicas": { "count": 2 } })), "spec.replicas"),
        ("no deploymentName", spec(json!({ "replicas": 1 })), "spec.deploymentName: Required value"),
        (
            "empty deploymentName",
            spec(json!({ "deploymentName": "", "replicas": 1 })),
            "spec.deploymentName: Invalid value: \"\": spec.deploymentName in body should be at least 1 chars long",
        ),
        (
            "underscore and capitals",
            spec(json!({ "deploymentName": "Bad_Name" })),
            "spec.deploymentName: Invalid value: \"string\": must be a valid Deployment name: a DNS-1123 subdomain",
        ),
        (
            "leading dash",
            spec(json!({ "deploymentName": "-leading-dash" })),
            "spec.deploymentName: Invalid value: \"string\": must be a valid Deployment name",
        ),
        (
            "trailing dash",
            spec(json!({ "deploymentName": "trailing-" })),
            "spec.deploymentName: Invalid value: \"string\": must be a valid Deployment name",
        ),
        (
            "upper case",
            spec(json!({ "deploymentName": "EXAMPLE" })),
            "spec.deploymentName: Invalid value: \"string\": must be a valid Deployment name",
        ),
        (
            "a space",
            spec(json!({ "deploymentName": "example foo" })),
            "spec.deploymentName: Invalid value: \"string\": must be a valid Deployment name",
        ),
        (
            "an empty DNS label",
            spec(json!({ "deploymentName": "a..b" })),
            "spec.deploymentName: Invalid value: \"string\": must be a valid Deployment name",
        ),
        (
            "non-ASCII",
            spec(json!({ "deploymentName": "exämple" })),
            "spec.deploymentName: Invalid value: \"string\": must be a valid Deployment name",
        ),
        (
            "deploymentName of 254 characters",
            spec(json!({ "deploymentName": "a".repeat(254) })),
            "spec.deploymentName: Too long",
        ),
        (
            "deploymentName of 100 000 characters",
            spec(json!({ "deploymentName": "a".repeat(100_000) })),
            "spec.deploymentName: Too long",
        ),
        (
            "deploymentName as a number",
            spec(json!({ "deploymentName": 5 })),
            "spec.deploymentName: Invalid value: \"integer\": spec.deploymentName in body must be of type string",
        ),
        (
            "deploymentName as a list",
            spec(json!({ "deploymentName": ["a"] })),
            "spec.deploymentName: Invalid value: \"array\": spec.deploymentName in body must be of type string",
        ),
        (
            "deploymentName as an object",
            spec(json!({ "deploymentName": { "name": "a" } })),
            "unknown field \"spec.deploymentName.name\"",
        ),
        ("deploymentName null", spec(json!({ "deploymentName": null })), "spec.deploymentName: Required value"),
        (
            "spec as a string",
            spec(json!("example-foo")),
            "spec: Invalid value: \"string\": spec in body must be of type object",
        ),
        ("spec as a list", spec(json!([{ "deploymentName": "d" }])), "unknown field \"spec[0].deploymentName\""),
        (
            "unknown spec field",
            spec(json!({ "deploymentName": "d", "image": "httpd" })),
            "unknown field \"spec.image\"",
        ),
        ("misspelt field", spec(json!({ "deploymentname": "d" })), "unknown field \"spec.deploymentname\""),
        ("a huge spec of unknown fields", spec(Value::Object(many_unknown)), "unknown field \"spec.extra0\""),
        (
            "unknown top-level field",
            json!({ "apiVersion": "samplecontroller.k8s.io/v1alpha1", "kind": "Foo",
            "metadata": { "name": "bad-foo" }, "spec": { "deploymentName": "d" }, "owner": "me" }),
            "unknown field \"owner\"",
        ),
        (
            "no spec",
            json!({ "apiVersion": "samplecontroller.k8s.io/v1alpha1", "kind": "Foo", "metadata": { "name": "bad-foo" } }),
            "spec: Required value",
        ),
        (
            "name of 64 characters",
            json!({ "apiVersion": "samplecontroller.k8s.io/v1alpha1", "kind": "Foo",
            "metadata": { "name": "a".repeat(64) }, "spec": { "deploymentName": "d" } }),
            "metadata.name must be at most 63 characters",
        ),
    ]
}

#[tokio::test]
async fn invalid_foos_are_rejected_with_a_message_that_names_the_field() {
    let ns = TestNamespace::new("invalid").await;
    let _controller = ns.controller().await;
    let cases = invalid_foos();
    let mut wrong = Vec::new();
    for (what, object, want) in cases {
        let message = rejection(apply_raw(&ns, object).await);
        if !message.contains(want) {
            wrong.push(format!("{what}: {message:?} lacks {want:?}"));
        }
    }
    assert!(wrong.is_empty(), "refusals without the expected message:\n{}", wrong.join("\n"));

    // A valid one goes through, so the failures above were about validity;
    // the longest allowed name included.
    let longest = "a".repeat(63);
    let valid = json!({ "apiVersion": "samplecontroller.k8s.io/v1alpha1", "kind": "Foo",
        "metadata": { "name": longest }, "spec": { "deploymentName": "fine.name-1", "replicas": 10 } });
    apply_raw(&ns, valid).await.expect("valid Foo");
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

/// `cargo run --bin crdgen > crd.yaml`, as the README has users make the
/// CRD: what it prints is `crds/` byte for byte, and the API server takes it
/// unchanged: put in place of the installed CRD (a server-side dry run: the
/// schema compiled, the CEL rules checked, the object defaulted as it would
/// be stored), it comes back with every field as crdgen printed it, nothing
/// dropped or altered, and nothing added but the API server's own defaults
/// for a CRD.
#[tokio::test]
async fn crdgen_prints_the_crd_of_crds_and_the_api_server_takes_it_unchanged() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_crdgen")).output().expect("run crdgen");
    assert!(out.status.success(), "crdgen failed: {}", String::from_utf8_lossy(&out.stderr));
    let printed = String::from_utf8(out.stdout).expect("crdgen prints UTF-8");
    let shipped =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/crds/samplecontroller.k8s.io_foos.yaml"))
            .expect("read crds/");
    assert_eq!(printed, shipped, "crds/ is not crdgen's output: run hack/update-crds.sh");

    // A replace, not an apply: an apply merges with what is installed, and
    // what comes back would be the installed CRD's as much as crdgen's.
    let mut crd: Value = serde_saphyr::from_str(&printed).expect("crdgen prints YAML");
    let name = crd["metadata"]["name"].as_str().expect("a named CRD").to_owned();
    let version = kubectl_ok(&["get", "crd", &name, "-o", "jsonpath={.metadata.resourceVersion}"]);
    crd["metadata"]["resourceVersion"] = json!(version.trim());
    let uri =
        format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}?dryRun=All&fieldValidation=Strict");
    let request = http::Request::put(uri)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(&crd).unwrap())
        .unwrap();
    let taken: Value = admin_client().await.request(request).await.expect("the API server takes crdgen's CRD");

    let mut found = BTreeSet::new();
    differences("spec", &crd["spec"], &taken["spec"], &mut found);
    for (key, value) in crd["metadata"].as_object().unwrap() {
        let taken = &taken["metadata"][key];
        differences(&format!("metadata.{key}"), value, taken, &mut found);
    }
    // apiextensions.k8s.io/v1's defaults for what crdgen leaves out.
    let defaults = BTreeSet::from([
        "added spec.conversion: {\"strategy\":\"None\"}".to_owned(),
        "added spec.names.listKind: \"FooList\"".to_owned(),
    ]);
    assert_eq!(found, defaults, "crdgen's CRD as the API server would store it, against what crdgen printed");
}

/// How `taken` differs from `printed` at `path`, into `found`: "dropped",
/// "changed" or "added" and the path. Numbers compare by value (YAML's
/// `10.0` is JSON's `10`).
fn differences(path: &str, printed: &Value, taken: &Value, found: &mut BTreeSet<String>) {
    match (printed, taken) {
        (Value::Object(printed), Value::Object(taken)) => {
            for (key, value) in printed {
                match taken.get(key) {
                    Some(taken) => differences(&format!("{path}.{key}"), value, taken, found),
                    None => {
                        found.insert(format!("dropped {path}.{key}: {value}"));
                    }
                }
            }
            for (key, value) in taken.iter().filter(|(key, _)| !printed.contains_key(*key)) {
                found.insert(format!("added {path}.{key}: {value}"));
            }
        }
        (Value::Array(printed), Value::Array(taken)) if printed.len() == taken.len() => {
            for (i, (printed, taken)) in printed.iter().zip(taken).enumerate() {
                differences(&format!("{path}[{i}]"), printed, taken, found);
            }
        }
        (Value::Number(printed), Value::Number(taken)) if printed.as_f64() == taken.as_f64() => {}
        (printed, taken) if printed == taken => {}
        (printed, taken) => {
            found.insert(format!("changed {path}: {printed} to {taken}"));
        }
    }
}

/// deploy/tenant/foo-quota.yaml, as install.md tells an admin to apply it
/// to a tenant's namespace: the API server counts that namespace's Foos
/// under it, and past the count refuses a create, saying which quota.
#[tokio::test]
async fn the_example_tenant_quota_counts_foos_and_refuses_one_past_its_count_naming_the_quota() {
    use k8s_openapi::api::core::v1::ResourceQuota;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let ns = TestNamespace::new("tenant-quota").await;
    ns.kubectl_ok(&["apply", "-f", "deploy/tenant/foo-quota.yaml"]);
    let resource = "count/foos.samplecontroller.k8s.io";
    let quotas = ns.api::<ResourceQuota>();
    // The quota's status for Foos: what it counts as used, and its count.
    let counted = || async {
        let status = quotas.get("foos").await.ok()?.status?;
        let of = |m: Option<std::collections::BTreeMap<_, _>>| m?.get(resource).map(|q: &Quantity| q.0.clone());
        Some((of(status.used), of(status.hard)))
    };
    let set_hard = |count: &str| {
        let patch = format!(r#"{{"spec":{{"hard":{{"{resource}":"{count}"}}}}}}"#);
        ns.kubectl_ok(&["patch", "resourcequota", "foos", "--type=merge", "-p", &patch]);
    };
    create_foo(&ns.api(), "first", "first", Some(1)).await;
    // The quota controller counts a custom resource once its discovery
    // (every 30 s) has found it, and a quota made before that only at its
    // next full pass (5 minutes) or a change of the quota's counts: on a
    // plane whose Foo CRD is seconds old, the count is changed every 10 s
    // until the Foo is counted.
    let started = std::time::Instant::now();
    for nudge in 1.. {
        if counted().await.and_then(|(used, _)| used).as_deref() == Some("1") {
            break;
        }
        assert!(started.elapsed() < TIMEOUT * 2, "the quota never counted the Foo");
        if nudge % 50 == 0 {
            set_hard(&(5000 - nudge / 50 % 2).to_string());
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    set_hard("1");
    wait_until("the quota's new count in force", TIMEOUT, || async {
        (counted().await?.1.as_deref() == Some("1")).then_some(())
    })
    .await;
    let refused = ns.kubectl(&["create", "-f", "artifacts/examples/example-foo.yaml"]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "a Foo past the quota was created");
    assert!(said.contains("exceeded quota: foos") && said.contains(resource), "{said}");
}
