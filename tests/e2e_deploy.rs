//! deploy/ as a cluster runs it, on the local control plane's scheduler and
//! kwok's three simulated nodes: its two replicas land on different nodes,
//! and a drain of both nodes is held by the PodDisruptionBudget until the
//! first replica's replacement is Ready elsewhere. Its own test binary: it
//! cordons nodes, which no other test may meet.

mod common;

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

const NS: &str = "sample-controller";
const SELECTOR: &str = "app.kubernetes.io/name=sample-controller";
/// An image reference set as a user would, with kustomize.
const IMAGE: &str = "registry.example.com/platform/sample-controller:0.1.0-test";
const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);

/// Every node schedulable again when the test ends, however it ends.
struct UncordonAll;

impl Drop for UncordonAll {
    fn drop(&mut self) {
        let nodes = kubectl_ok(&["get", "nodes", "-o", "name"]);
        for node in nodes.lines() {
            kubectl(&["uncordon", node]);
        }
    }
}

/// deploy/ applied through a kustomization that sets the image, as a user
/// pointing it at their registry would.
fn apply_with_image() {
    let dir = scratch("deploy-overlay");
    std::fs::create_dir_all(&dir).unwrap();
    // kustomize takes a base by relative path only.
    let deploy = relative(&dir, &format!("{}/deploy", env!("CARGO_MANIFEST_DIR")));
    let (name, tag) = IMAGE.rsplit_once(':').unwrap();
    let kustomization = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {deploy}\n\
         images:\n  - name: sample-controller\n    newName: {name}\n    newTag: {tag}\n"
    );
    std::fs::write(format!("{dir}/kustomization.yaml"), kustomization).unwrap();
    kubectl_ok(&["apply", "-k", &dir]);
}

/// The path of `to` seen from the directory `from`.
fn relative(from: &str, to: &str) -> String {
    let (from, to) = (std::fs::canonicalize(from).unwrap(), std::fs::canonicalize(to).unwrap());
    let common = from.components().zip(to.components()).take_while(|(a, b)| a == b).count();
    let up = from.components().skip(common).map(|_| "..".to_owned());
    let down = to.components().skip(common).map(|c| c.as_os_str().to_string_lossy().into_owned());
    up.chain(down).collect::<Vec<_>>().join("/")
}

fn is_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn ready_since(pod: &Pod) -> Option<Timestamp> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    let ready = conditions.iter().find(|c| c.type_ == "Ready" && c.status == "True")?;
    Some(ready.last_transition_time.as_ref()?.0)
}

/// The scheduler's message, when it found no node for `pod`.
fn unschedulable_because(pod: &Pod) -> Option<String> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    let scheduled = conditions.iter().find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
    (scheduled.reason.as_deref() == Some("Unschedulable")).then(|| scheduled.message.clone().unwrap_or_default())
}

fn node_of(pod: &Pod) -> Option<String> {
    pod.spec.as_ref()?.node_name.clone()
}

async fn operator_pods(pods: &Api<Pod>) -> Vec<Pod> {
    pods.list(&ListParams::default().labels(SELECTOR)).await.map(|l| l.items).unwrap_or_default()
}

/// Poll `probe` until it returns `Some`; after GC_TIMEOUT, panic with what
/// the cluster shows of the operator's pods, ReplicaSets, nodes and events.
async fn wait_or_explain<T, F, Fut>(what: &str, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    // wait_until's own deadline is set past ours, so ours is the one met.
    let found = tokio::time::timeout(GC_TIMEOUT, wait_until(what, GC_TIMEOUT * 2, probe)).await;
    found.unwrap_or_else(|_| panic!("timed out after {GC_TIMEOUT:?} waiting for {what}; {}", cluster_state()))
}

/// What the cluster shows of the operator's pods, ReplicaSets and budget,
/// the nodes, and the namespace's events: for a failure's message.
fn cluster_state() -> String {
    let state = [
        kubectl(&["get", "pods,replicasets,poddisruptionbudgets", "-n", NS, "-o", "wide"]),
        kubectl(&["get", "nodes", "-o", "wide"]),
        kubectl(&["get", "events", "-n", NS, "--sort-by=.lastTimestamp"]),
    ]
    .map(|out| format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)));
    format!("the cluster shows:\n{}", state.join("\n"))
}

/// `kubectl drain` of `node`, evicting only the operator's pods (other
/// tests' pods may be on it), retrying refused evictions until it times out.
fn drain(node: &str) -> Child {
    Command::new("kubectl")
        .args(["drain", node, "--pod-selector", SELECTOR, "--timeout", &format!("{}s", DRAIN_TIMEOUT.as_secs())])
        .env("KUBECONFIG", kubeconfig_path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kubectl drain")
}

fn finished(drain: Child) -> (bool, String) {
    let out = drain.wait_with_output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[tokio::test]
async fn replicas_spread_over_nodes_and_a_drain_waits_for_the_replacement_to_be_ready() {
    let _uncordon = UncordonAll;
    apply_with_image();
    kubectl_ok(&["rollout", "status", "deployment/sample-controller", "-n", NS, "--timeout=180s"]);
    let pods: Api<Pod> = Api::namespaced(admin_client().await, NS);
    let running = wait_until("two ready replicas of the new revision", TIMEOUT, || async {
        let ready: Vec<Pod> = operator_pods(&pods).await.into_iter().filter(is_ready).collect();
        (ready.len() == 2).then_some(ready)
    })
    .await;
    let image = running[0].spec.as_ref().unwrap().containers[0].image.clone();
    assert_eq!(image.as_deref(), Some(IMAGE), "the image set with kustomize");
    let nodes: BTreeSet<String> = running.iter().filter_map(node_of).collect();
    assert_eq!(nodes.len(), 2, "both replicas on one node: {nodes:?}");
    let (first, second) = (&running[0], &running[1]);
    let (first_node, second_node) = (node_of(first).unwrap(), node_of(second).unwrap());

    // The third node cordoned too: the first replica's replacement has
    // nowhere to go — not the third node, and not beside the second replica
    // (the spread allows one per node). The first node is cordoned before
    // the drain (which would cordon it itself) and the scheduler given a
    // moment to see both: a replacement that came first could go there.
    let all: Api<Node> = Api::all(admin_client().await);
    let names: Vec<String> =
        all.list(&ListParams::default()).await.unwrap().items.iter().map(|n| n.name_any()).collect();
    let third = names.iter().find(|n| !nodes.contains(*n)).expect("a third node").clone();
    kubectl_ok(&["cordon", &third]);
    kubectl_ok(&["cordon", &first_node]);
    // The scheduler's cache has no signal for "saw the cordon": give it time.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (drained, out) = finished(drain(&first_node));
    assert!(drained, "one replica may go while the other is Ready: {out}");
    let replaced = [first.name_any(), second.name_any()];
    let pending =
        wait_or_explain("the first replica's replacement to be placed or refused by the scheduler", || async {
            let pods = operator_pods(&pods).await.into_iter();
            let mut new = pods.filter(|p| p.metadata.deletion_timestamp.is_none() && !replaced.contains(&p.name_any()));
            new.find(|p| node_of(p).is_some() || unschedulable_because(p).is_some())
        })
        .await;
    assert_eq!(
        node_of(&pending),
        None,
        "the replacement was scheduled (first replica was on {first_node}, second on {second_node}, {third} cordoned); {}",
        cluster_state()
    );
    let why = unschedulable_because(&pending).unwrap();
    assert!(why.contains("topology spread"), "not the spread that keeps it off {second_node}: {why}");

    // Draining the second replica's node is held: evicting it would leave
    // none Ready.
    let second_drain = drain(&second_node);
    // Time under test: the drain is still held after eight seconds.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let survivor = pods.get_opt(&second.name_any()).await.unwrap();
    assert!(survivor.as_ref().is_some_and(is_ready), "the last Ready replica was evicted");

    // Room for the replacement: once it is Ready, the drain goes on.
    kubectl_ok(&["uncordon", &third]);
    let (drained, out) = finished(second_drain);
    assert!(drained, "the drain did not finish once the replacement was Ready: {out}");
    assert!(out.contains("disruption budget"), "the drain was never refused by the budget: {out}");
    let replacement = pods.get(&pending.name_any()).await.unwrap();
    assert_eq!(node_of(&replacement).as_deref(), Some(third.as_str()));
    let ready_at = ready_since(&replacement).expect("the replacement Ready");
    let evicted_at = audited(NS, "kubectl")
        .into_iter()
        .filter(|r| r.resource == "pods" && r.subresource.as_deref() == Some("eviction"))
        .filter(|r| r.name.as_deref() == Some(second.name_any().as_str()) && r.code == Some(201))
        .map(|r| r.at)
        .max()
        .expect("the second replica's eviction in the audit log");
    // Seconds-resolution condition time: allow its rounding down.
    assert!(
        evicted_at.as_second() >= ready_at.as_second(),
        "the second replica was evicted at {evicted_at}, before its peer was Ready at {ready_at}"
    );
}

/// The labels Kubernetes recommends, on every object deploy/ and
/// deploy/monitoring/ make (and
/// the version being this build's, as the image tag is).
#[test]
fn every_object_in_deploy_carries_the_recommended_labels_of_this_version() {
    let version = env!("CARGO_PKG_VERSION");
    let mut files: Vec<_> = ["deploy", "deploy/monitoring"]
        .into_iter()
        .flat_map(|dir| std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 14, "{files:?}");
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let objects: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).unwrap();
        for object in objects {
            let what = format!("{} {} in {}", object["kind"], object["metadata"]["name"], path.display());
            let labels = &object["metadata"]["labels"];
            for (label, want) in [
                ("name", "sample-controller"),
                ("instance", "sample-controller"),
                ("version", version),
                ("part-of", "sample-controller"),
                ("managed-by", "kubectl"),
            ] {
                assert_eq!(labels[format!("app.kubernetes.io/{label}")], want, "{what}: app.kubernetes.io/{label}");
            }
            assert!(labels["app.kubernetes.io/component"].is_string(), "{what}: app.kubernetes.io/component");
        }
    }
}
