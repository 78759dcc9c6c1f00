//! The seeds' examples (`examples/`), run against the local control plane
//! with real Pods, their output checked line by line.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// A running example, its stdout and stderr collected line by line.
struct Example {
    child: Process,
    lines: Arc<Mutex<Vec<String>>>,
}

/// The example binaries sit next to the test binaries' directory
/// (`target/<profile>/examples`), built by `cargo build --all-targets`.
fn example_path(name: &str) -> PathBuf {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_owned();
    let path = deps.parent().unwrap().join("examples").join(name);
    assert!(path.exists(), "{} is missing: build the examples first (`cargo build --examples`)", path.display());
    path
}

fn run_example(name: &str, args: &[&str]) -> Example {
    let mut cmd = Command::new(example_path(name));
    cmd.args(args).env("KUBECONFIG", kubeconfig_path()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = Process::start(&mut cmd, name);
    let lines = Arc::new(Mutex::new(Vec::new()));
    for stream in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let lines = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        });
    }
    Example { child, lines }
}

impl Example {
    /// Wait until the output holds `count` lines equal to `line`.
    async fn prints(&self, line: &str, count: usize) {
        wait_until(&format!("{count} line(s) {line:?}"), TIMEOUT, || async {
            let lines = self.lines.lock().unwrap();
            (lines.iter().filter(|l| l.as_str() == line).count() >= count).then_some(())
        })
        .await;
    }

    /// Wait until a line starting with `prefix` is printed, within `within`.
    async fn prints_starting(&self, prefix: &str, within: Duration) {
        wait_until(&format!("a line starting {prefix:?}"), within, || async { (self.count(prefix) > 0).then_some(()) })
            .await;
    }

    fn count(&self, prefix: &str) -> usize {
        self.lines.lock().unwrap().iter().filter(|l| l.starts_with(prefix)).count()
    }

    /// Lines starting with `prefix` printed before the first line starting
    /// with `marker` (both on one stream, so in order).
    fn count_before(&self, prefix: &str, marker: &str) -> usize {
        let lines = self.lines.lock().unwrap();
        lines.iter().take_while(|l| !l.starts_with(marker)).filter(|l| l.starts_with(prefix)).count()
    }
}

async fn create_pod(ns: &TestNamespace, name: &str) -> Pod {
    create_pod_with(ns, name, json!({})).await
}

/// A Pod the scheduler leaves Pending until `release` removes its gate, so
/// that a watcher sees it added before kwok starts it.
async fn create_gated_pod(ns: &TestNamespace, name: &str) -> Pod {
    create_pod_with(ns, name, json!({ "schedulingGates": [{ "name": HOLD }] })).await
}

const HOLD: &str = "samplecontroller.k8s.io/test-hold";

async fn release(ns: &TestNamespace, name: &str) {
    let patch = json!({ "spec": { "schedulingGates": null } });
    ns.api::<Pod>().patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("remove the gate");
}

async fn create_pod_with(ns: &TestNamespace, name: &str, mut spec: Value) -> Pod {
    spec["containers"] = json!([{ "name": "c", "image": "busybox:1" }]);
    let pod: Pod = serde_json::from_value(json!({ "metadata": { "name": name }, "spec": spec })).unwrap();
    ns.api::<Pod>().create(&PostParams::default(), &pod).await.expect("create Pod")
}

#[tokio::test]
async fn workqueue_example_syncs_retries_five_times_then_drops_and_reports_deletions() {
    let ns = TestNamespace::new("example-workqueue").await;
    let example = run_example("workqueue", &["--namespace", &ns.name, "--fail", "broken"]);
    create_pod(&ns, "hello").await;
    example.prints("Sync/Add/Update for Pod hello", 1).await;

    create_pod(&ns, "broken").await;
    let key = format!("{}/broken", ns.name);
    example
        .prints(&format!("Dropping pod {key:?} out of the queue: sync of Pod broken failed on purpose (--fail)"), 1)
        .await;
    // Counted up to the drop: a later update of the Pod (kwok starting it)
    // starts its syncs over, as in client-go.
    let errors = example.count_before(&format!("Error syncing pod {key}: "), &format!("Dropping pod {key:?}"));
    assert_eq!(errors, 5, "five retries before dropping");

    // A graceful delete, finished by kwok as a kubelet would once the
    // containers stopped.
    ns.api::<Pod>().delete("hello", &DeleteParams::default()).await.unwrap();
    example.prints(&format!("Pod {}/hello does not exist anymore", ns.name), 1).await;
}

#[tokio::test]
async fn pod_events_example_reports_add_update_and_delete_with_resource_versions() {
    let ns = TestNamespace::new("example-pod-events").await;
    let example = run_example("pod_events", &["--namespace", &ns.name]);
    let created = create_gated_pod(&ns, "watched").await;
    example.prints("Find a Pod add event.", 1).await;
    example.prints("\tName: watched", 1).await;
    let created_version = created.metadata.resource_version.clone().expect("a created Pod has a resourceVersion");
    example.prints(&format!("\tResource Version: {created_version}"), 1).await;

    // The scheduler binds it to a kwok node, and kwok reports it started.
    release(&ns, "watched").await;
    example.prints("\tNew Status: Running", 1).await;
    let running = ns.api::<Pod>().get("watched").await.unwrap();
    let node = running.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
    assert!(node.starts_with("kwok-node-"), "scheduled onto {node:?}");
    example.prints("Find a Pod update event.", 1).await;
    example.prints(&format!("\tResource Version: {}", running.metadata.resource_version.unwrap()), 1).await;
    example.prints("\tOld Status: Pending", 1).await;

    ns.api::<Pod>().delete("watched", &DeleteParams::default()).await.unwrap();
    example.prints("Find a Pod delete event.", 1).await;
    assert_eq!(example.count("\tName: watched"), 2, "named in the add and the delete");
}

#[tokio::test]
async fn pod_events_example_under_leader_election_reports_from_the_leader_alone_and_hands_over_on_sigterm() {
    let ns = TestNamespace::new("example-pod-leader").await;
    let elect = ["--namespace", ns.name.as_str(), "--leader-elect"];
    let mut first = run_example("pod_events", &elect);
    first.prints_starting("leading as ", TIMEOUT).await;
    // The requests to the namespace's Leases and Pods so far (the API
    // server's audit log: every client's): the leader's.
    let reads = |resource: &'static str| {
        let ns = ns.name.clone();
        move || {
            let all = audited(&ns, "-");
            all.iter().filter(|r| r.resource == resource && (r.verb == "list" || r.verb == "watch")).count()
        }
    };
    let (lease_reads, pod_reads) = (reads("leases"), reads("pods"));
    // The leader watches the Pods: it reports one.
    create_gated_pod(&ns, "watched").await;
    first.prints("\tName: watched", 1).await;
    let (leases_before, pods_before) = (lease_reads(), pod_reads());
    let second = run_example("pod_events", &elect);
    // The standby runs: it reads the Lease, waiting for it.
    wait_until("the standby to watch the Lease", TIMEOUT, || async { (lease_reads() > leases_before).then_some(()) })
        .await;
    create_gated_pod(&ns, "watched-later").await;
    first.prints("\tName: watched-later", 1).await;
    // It reads no Pod, and reports nothing.
    assert_eq!(pod_reads(), pods_before, "the standby lists or watches Pods");
    assert_eq!((second.count("leading as "), second.count("\tName: ")), (0, 0), "the standby reports nothing");

    // SIGTERM: the leader releases the Lease, and the standby, watching it,
    // takes it well within the 15 s lease duration it would wait otherwise.
    let pid = first.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let exited = tokio::task::spawn_blocking(move || first.child.wait()).await.unwrap().unwrap();
    assert!(exited.success(), "the leader exits cleanly on SIGTERM: {exited}");
    second.prints_starting("leading as ", Duration::from_secs(8)).await;
    second.prints("\tName: watched", 1).await;
    let lease = ns.api::<Lease>().get("pod-events").await.unwrap();
    let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
    assert_eq!(second.count(&format!("leading as {holder}")), 1, "the Lease names the new leader");
}
