//! The operator's image (hack/build-image.sh), run with runc (hack/run-image.sh)
//! as deploy/ runs it: in-cluster configuration from the ServiceAccount's
//! token, the container arguments and memory limit of
//! deploy/05-deployment.yaml, uid 65532 and a read-only root filesystem.

mod common;

use std::process::Command;

use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, Pod};
use kube::ResourceExt;
use sample_controller::constants::POD_NAME_ENV;
use sample_controller::testing::metric_value;

const IMAGE_ENV: &str = "SAMPLE_CONTROLLER_TEST_IMAGE";
const DEPLOYMENT: &str = "deploy/05-deployment.yaml";
/// deploy/'s namespace.
const NS: &str = DEPLOY_NS;

fn image() -> String {
    match std::env::var(IMAGE_ENV) {
        Ok(image) if !image.is_empty() => image,
        _ => panic!(
            "{IMAGE_ENV} is not set: build the image with `hack/build-image.sh` and set {IMAGE_ENV} to the \
             reference it prints (hack/test.sh does both)"
        ),
    }
}

/// The operator's container as deploy/ declares it.
fn deployed_container() -> Container {
    let text = std::fs::read_to_string(DEPLOYMENT).expect("read the deployment manifest");
    let deployment: Deployment = serde_saphyr::from_str(&text).expect("parse the deployment manifest");
    deployment.spec.and_then(|s| s.template.spec).map(|s| s.containers[0].clone()).expect("a container")
}

/// Its arguments, but with the ports chosen by the kernel: the container
/// shares the host's network, where 8080 may be taken.
fn container_args(container: &Container) -> Vec<String> {
    let args = container.args.clone().unwrap_or_default();
    for flag in ["--metrics-bind-address=", "--health-probe-bind-address="] {
        assert!(args.iter().any(|a| a.starts_with(flag)), "{DEPLOYMENT} no longer sets {flag}");
    }
    args.into_iter()
        .map(|a| match a.split_once('=') {
            Some((flag, _)) if flag.ends_with("-bind-address") => format!("{flag}=127.0.0.1:0"),
            _ => a,
        })
        .collect()
}

/// A memory quantity in bytes (the binary suffixes deploy/ uses).
fn bytes(quantity: &str) -> u64 {
    let (number, unit) = quantity.split_at(quantity.trim_end_matches(char::is_alphabetic).len());
    let scale = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => panic!("unexpected memory unit in {quantity:?}"),
    };
    number.parse::<u64>().expect("a whole number") * scale
}

/// What the kubelet mounts at /var/run/secrets/kubernetes.io/serviceaccount
/// in `pod` (hack/run-image.sh mounts it there): a token for the
/// ServiceAccount bound to the pod, the cluster's CA and the namespace.
async fn service_account_files(pod: &Pod) -> String {
    let dir = format!("{}/image-serviceaccount", env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&dir).unwrap();
    let token = pod_bound_token(pod).await;
    let plane = std::env::var("LOCAL_UP_DIR").expect("LOCAL_UP_DIR names the local control plane (hack/test.sh)");
    let ca = std::fs::read(format!("{plane}/pki/ca.crt")).expect("the local control plane's CA");
    std::fs::write(format!("{dir}/token"), token.trim()).unwrap();
    std::fs::write(format!("{dir}/ca.crt"), ca).unwrap();
    std::fs::write(format!("{dir}/namespace"), NS).unwrap();
    // Readable by the container's user, 65532.
    Command::new("chmod").args(["-R", "a+rX", &dir]).status().unwrap();
    dir
}

/// The container's process, as runc reports it: (uid, root mounted read-only).
fn container_process(script_pid: u32) -> (String, bool) {
    let state = Command::new("runc").args(["state", &format!("sample-controller-{script_pid}")]).output().unwrap();
    let state: serde_json::Value = serde_json::from_slice(&state.stdout).expect("runc state");
    let pid = state["pid"].as_u64().expect("a running container");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid = status.lines().find_map(|l| l.strip_prefix("Uid:")).unwrap().split_whitespace().next().unwrap();
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root = mounts.lines().find(|l| l.split_whitespace().nth(4) == Some("/")).expect("a root mount");
    let read_only = root.split_whitespace().nth(5).unwrap().split(',').any(|o| o == "ro");
    (uid.to_owned(), read_only)
}

/// The operator in its container; TERM makes hack/run-image.sh kill it.
struct Contained(Operator);

impl Drop for Contained {
    fn drop(&mut self) {
        signal(&self.0, "-TERM");
        let _ = self.0.child.wait();
    }
}

#[tokio::test]
async fn the_image_runs_in_cluster_as_deployed_reconciles_the_example_foo_and_answers_probes() {
    let image = image();
    // Run as one of deploy/'s pods would be: its token, its name.
    let pods = install_deploy().await;
    let _lease = FreshLease::new();
    let container = deployed_container();
    let memory = container.resources.as_ref().and_then(|r| r.limits.as_ref()?.get("memory").cloned()).unwrap();
    let server = config().await.cluster_url;

    let mut run = Command::new("hack/run-image.sh");
    run.arg(&image)
        .arg(service_account_files(&pods[0]).await)
        .args(container_args(&container))
        .env(POD_NAME_ENV, pods[0].name_any())
        .env("KUBERNETES_SERVICE_HOST", server.host().unwrap())
        .env("KUBERNETES_SERVICE_PORT", server.port_u16().unwrap().to_string())
        .env("MEMORY_LIMIT", bytes(&memory.0).to_string());
    let op = Contained(start_logged(run, "image").await);
    let (uid, read_only) = container_process(op.0.child.id());
    assert_eq!((uid.as_str(), read_only), ("65532", true), "user and root filesystem of the container");

    let ns = TestNamespace::new("image").await;
    ns.kubectl_ok(&["apply", "-f", "artifacts/examples/example-foo.yaml"]);
    wait_available(&ns.api(), "example-foo", 1, GC_TIMEOUT).await;
    let deployment = deployment(&ns, "example-foo").await.expect("its Deployment");
    assert_eq!(deployment.owner_references()[0].name, "example-foo");
    // Events go out in the background, behind those of every Foo this
    // all-namespace operator found (other tests' leftovers included).
    wait_until("a Synced event from the container", TIMEOUT, || async {
        ns.controller_events().await.into_iter().find(|e| e.reason.as_deref() == Some("Synced"))
    })
    .await;

    for path in ["/healthz", "/readyz"] {
        assert_eq!(http_get(op.0.probes, path).await.map(|r| r.0), Some(200), "{path}");
    }
    // Secure metrics, as deploy/ serves them: HTTPS, for a token allowed to
    // read them (and no one else).
    let scraper = TestNamespace::new("image-scraper").await;
    let token = metrics_reader_token(&scraper.name, "scraper");
    assert_eq!(https_get(op.0.metrics, "/metrics", None, &[]).0, 401, "metrics without a token");
    let metrics = wait_until("the scraper's token to be allowed", TIMEOUT, || async {
        let (code, _, body) = https_get(op.0.metrics, "/metrics", Some(&token), &[]);
        (code == 200).then_some(body)
    })
    .await;
    let leading = metric_value(&metrics, "leader_election_master_status{name=\"sample-controller\"}");
    assert_eq!(leading, Some(1.0), "it leads with deploy/'s --leader-elect");
    let synced = metric_value(&metrics, SUCCESS_SERIES).unwrap_or_default();
    assert!(synced >= 1.0, "{SUCCESS_SERIES} = {synced}");
    // Configured in-cluster: its Lease is in the namespace it read from the
    // mounted files.
    assert_eq!(holding_pod().await, Some(pods[0].name_any()), "its Lease, held in its pod's name");
}
