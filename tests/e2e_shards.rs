//! Label shards (`--shard-selector`): several operators split one cluster's
//! Foos by a label, each electing its own leader. Three operator binaries,
//! each acting as a user of its own, granted what deploy/ grants the
//! operator (so the API server's audit log tells their requests apart, and
//! a request deploy/'s RBAC does not allow fails the test), run against the
//! local control plane in one namespace.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams, PostParams};
use sample_controller::Foo;
use sample_controller::FooSpec;
use sample_controller::testing::api::Shard;
use serde_json::json;

/// The shards of these tests, as artifacts/shards has them: a selector, and
/// the value of the `shard` label its Foos carry (none for the rest).
const SHARDS: [(&str, Option<&str>); 3] = [("shard=a", Some("a")), ("shard=b", Some("b")), ("shard notin (a,b)", None)];

/// Foos per shard.
const PER_SHARD: usize = 100;

/// A shard's operator, acting as the user `shard-<name>.<namespace>`.
struct ShardOperator {
    user: String,
    process: Operator,
}

/// A Foo of a shard that is up is not stalled: its sync starts at once on
/// an idle shard and takes a few requests. 10 s for a loaded 2-core machine
/// (a stalled shard never syncs it at all).
const NOT_STALLED: Duration = Duration::from_secs(10);

/// Changes and first syncs waiting.
const DEPTH_SERIES: [&str; 2] = [
    "workqueue_depth{name=\"foo\",controller=\"foo\",priority=\"0\"}",
    "workqueue_depth{name=\"foo\",controller=\"foo\",priority=\"-100\"}",
];
const ACTIVE_WORKERS_SERIES: &str = "controller_runtime_active_workers{controller=\"foo\"}";

/// Grant `user` deploy/'s ClusterRole, and in `ns` deploy/'s leader-election
/// Role as it ships (04-leader-election-role.yaml, moved to `ns`). Again
/// for the same user: no-ops.
fn grant_operator_rights(ns: &TestNamespace, user: &str) {
    kubectl_ok(&["apply", "-f", "deploy/02-clusterrole.yaml"]);
    let binding = format!("{}-{}", ns.name, user.split('.').next().unwrap());
    let _ = kubectl(&["create", "clusterrolebinding", &binding, "--clusterrole=sample-controller", "--user", user]);
    let shipped = std::fs::read_to_string("deploy/04-leader-election-role.yaml").unwrap();
    let role = shipped.split("\n---\n").find(|doc| doc.contains("\nkind: Role\n")).expect("deploy/04's Role");
    let role = role.replace("namespace: sample-controller", &format!("namespace: {}", ns.name));
    let file = format!("{}/{}-leader-election-role.yaml", env!("CARGO_TARGET_TMPDIR"), ns.name);
    std::fs::write(&file, role).unwrap();
    kubectl_ok(&["apply", "-f", &file]);
    let role = "--role=sample-controller-leader-election";
    let _ = ns.kubectl(&["create", "rolebinding", &binding, role, "--user", user]);
}

async fn start_shard(ns: &TestNamespace, selector: &str, name: &str) -> ShardOperator {
    let user = format!("shard-{name}.{}", ns.name);
    grant_operator_rights(ns, &user);
    let kubeconfig = ns.kubeconfig_variant(&format!("shard-{name}"), |kc| {
        kc["users"][0]["user"]["as"] = json!(user);
        kc["users"][0]["user"]["as-groups"] = json!(["system:authenticated"]);
    });
    let mut args = lease_args(&ns.name, "sample-controller-test", LEASE);
    args.push(format!("--shard-selector={selector}"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let process = spawn_operator(&ns.name, &kubeconfig, &args, &format!("{}-shard-{name}", ns.name)).await;
    ShardOperator { user, process }
}

fn shard_name(label: Option<&str>) -> &str {
    label.unwrap_or("rest")
}

async fn create_labelled_foo(ns: &TestNamespace, name: &str, shard: Option<&str>) {
    let mut foo = Foo::new(name, FooSpec { deployment_name: name.into(), replicas: Some(1) });
    if let Some(shard) = shard {
        foo.metadata.labels = Some(BTreeMap::from([("shard".to_owned(), shard.to_owned())]));
    }
    ns.api::<Foo>().create(&PostParams::default(), &foo).await.unwrap_or_else(|e| panic!("create Foo {name}: {e}"));
}

/// The `shard` label of the Deployment `name`, once it exists.
async fn deployment_shard(ns: &TestNamespace, name: &str) -> Option<Option<String>> {
    deployment(ns, name).await.map(|d| d.labels().get("shard").cloned())
}

/// The Foos whose status `user` patched, from the audit log.
fn status_written_by(user: &str) -> BTreeSet<String> {
    audited_as(user)
        .into_iter()
        .filter(|r| r.resource == "foos" && r.subresource.as_deref() == Some("status") && r.verb == "patch")
        .filter_map(|r| r.name)
        .collect()
}

#[tokio::test]
async fn three_shards_reconcile_each_foo_exactly_once_a_relabelled_foo_moves_and_a_lost_shard_stalls_only_its_own() {
    let ns = TestNamespace::new("shards").await;
    let mut operators = Vec::new();
    for (selector, label) in SHARDS {
        operators.push(start_shard(&ns, selector, shard_name(label)).await);
    }
    let mut expected: BTreeMap<String, String> = BTreeMap::new();
    for (_, label) in SHARDS {
        for i in 0..PER_SHARD {
            let name = format!("{}-{i}", shard_name(label));
            create_labelled_foo(&ns, &name, label).await;
            expected.insert(name, shard_name(label).to_owned());
        }
    }

    // Every Foo's Deployment exists, in its Foo's shard.
    let foos: Vec<(String, Option<String>)> = SHARDS
        .iter()
        .flat_map(|(_, label)| {
            (0..PER_SHARD).map(move |i| (format!("{}-{i}", shard_name(*label)), label.map(str::to_owned)))
        })
        .collect();
    wait_until("every Foo's Deployment, labelled with its shard", TIMEOUT, || async {
        let list = ns.api::<k8s_openapi::api::apps::v1::Deployment>().list(&Default::default()).await.ok()?;
        let labelled: BTreeMap<String, Option<String>> =
            list.items.iter().map(|d| (d.name_any(), d.labels().get("shard").cloned())).collect();
        foos.iter().all(|(name, label)| labelled.get(name) == Some(label)).then_some(())
    })
    .await;
    // Each shard elected its own leader, through a Lease named after it.
    let leases: Vec<String> =
        ns.api::<Lease>().list(&Default::default()).await.unwrap().items.iter().map(|l| l.name_any()).collect();
    for (selector, _) in SHARDS {
        let lease = Shard::parse(selector).unwrap().lease_name("sample-controller-test").unwrap();
        assert!(leases.contains(&lease), "no Lease {lease} among {leases:?}");
    }
    // Each Foo's status was written by its shard's operator, and only by it.
    let settled = settled_requests(&ns.name, Duration::from_secs(2)).await;
    assert!(!settled.is_empty());
    let mut writers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for op in &operators {
        for foo in status_written_by(&op.user) {
            writers.entry(foo).or_default().push(op.user.clone());
        }
    }
    for (foo, shard) in &expected {
        let want = format!("shard-{shard}.{}", ns.name);
        assert_eq!(writers.get(foo), Some(&vec![want]), "the writers of Foo {foo}'s status");
    }

    // A Foo relabelled from a to b moves: b relabels its Deployment, and
    // then reconciles it; a forgets it.
    let moved = "a-0";
    let relabelled_at = k8s_openapi::jiff::Timestamp::now();
    let relabel = json!({ "metadata": { "labels": { "shard": "b" } } });
    ns.api::<Foo>().patch(moved, &PatchParams::default(), &Patch::Merge(&relabel)).await.unwrap();
    wait_until("the moved Foo's Deployment in shard b", TIMEOUT, || async {
        (deployment_shard(&ns, moved).await == Some(Some("b".into()))).then_some(())
    })
    .await;
    let scaled_at = k8s_openapi::jiff::Timestamp::now();
    let scale = json!({ "spec": { "replicas": 3 } });
    ns.api::<Foo>().patch(moved, &PatchParams::default(), &Patch::Merge(&scale)).await.unwrap();
    wait_until("the moved Foo's Deployment scaled", TIMEOUT, || async {
        deployment(&ns, moved).await.filter(|d| replicas(d) == Some(3))
    })
    .await;
    settled_requests(&ns.name, Duration::from_secs(2)).await;
    let naming_moved = |user: &str, since| -> Vec<Audited> {
        audited_as(user).into_iter().filter(|r| r.name.as_deref() == Some(moved) && r.at > since).collect()
    };
    let by_a = naming_moved(&operators[0].user, relabelled_at);
    assert!(
        by_a.iter().all(|r| !WRITES.contains(&r.verb.as_str()) || r.code.is_none_or(|c| c >= 300)),
        "shard a changed what it no longer owns: {by_a:?}"
    );
    let after_edit = naming_moved(&operators[0].user, scaled_at);
    assert!(after_edit.is_empty(), "shard a still syncs the Foo it lost: {after_edit:?}");
    let by_b = naming_moved(&operators[1].user, relabelled_at);
    assert!(
        by_b.iter().any(|r| r.resource == "deployments" && r.verb == "patch" && r.code == Some(200)),
        "shard b did not take the Deployment over: {by_b:?}"
    );

    // Shard b lost: its Foos wait, the others' do not. late-b first: each
    // shard's watch of Foos delivers in the order they were written, so a
    // shard that has its own late Foo has been sent late-b before it, if its
    // selector lets late-b through.
    let b = operators.remove(1);
    drop(b);
    let late_b_at = k8s_openapi::jiff::Timestamp::now();
    create_labelled_foo(&ns, "late-b", Some("b")).await;
    create_labelled_foo(&ns, "late-a", Some("a")).await;
    create_labelled_foo(&ns, "late-rest", None).await;
    let synced = |foo: Option<Foo>| foo.and_then(|f| f.status?.observed_generation).is_some();
    for (op, name) in operators.iter().zip(["late-a", "late-rest"]) {
        // Its own late Foo synced, and nothing it was sent waiting or
        // running: a sync of late-b, had it been sent late-b, has run.
        wait_until(&format!("{name} synced and shard {} idle", op.user), NOT_STALLED, || async {
            synced(ns.api::<Foo>().get_opt(name).await.ok()?).then_some(())?;
            let depth = metric(&op.process, DEPTH_SERIES[0]).await? + metric(&op.process, DEPTH_SERIES[1]).await?;
            let active = metric(&op.process, ACTIVE_WORKERS_SERIES).await?;
            (depth == 0.0 && active == 0.0).then_some(())
        })
        .await;
    }
    for op in &operators {
        let took: Vec<Audited> = audited_as(&op.user)
            .into_iter()
            .filter(|r| r.at > late_b_at && r.name.as_deref() == Some("late-b"))
            .collect();
        assert!(took.is_empty(), "shard {} acted on shard b's Foo: {took:?}", op.user);
    }
    assert!(deployment(&ns, "late-b").await.is_none(), "another shard reconciled shard b's Foo");
    // Back, it catches up.
    let _b = start_shard(&ns, SHARDS[1].0, "b").await;
    wait_until("shard b, restarted, to create its Foo's Deployment", TIMEOUT, || async {
        deployment(&ns, "late-b").await
    })
    .await;
    // A Foo that leaves shard a and comes back unchanged is shard a's again:
    // a forgot it when it left, so its return is news.
    for (to, want) in [("b", "shard b"), ("a", "shard a again")] {
        let label = json!({ "metadata": { "labels": { "shard": to } } });
        ns.api::<Foo>().patch("a-1", &PatchParams::default(), &Patch::Merge(&label)).await.unwrap();
        wait_until(&format!("Foo a-1's Deployment in {want}"), TIMEOUT, || async {
            (deployment_shard(&ns, "a-1").await == Some(Some(to.into()))).then_some(())
        })
        .await;
    }
    // deploy/'s RBAC allowed every request each shard made.
    for name in ["a", "b", "rest"] {
        let user = format!("shard-{name}.{}", ns.name);
        let refused: Vec<_> = audited_as(&user).into_iter().filter(|r| r.code == Some(403)).collect();
        assert!(refused.is_empty(), "{user} was refused what deploy/'s RBAC does not grant: {refused:?}");
    }
    for name in ["a", "b", "rest"] {
        let _ = kubectl(&["delete", "clusterrolebinding", &format!("{}-shard-{name}", ns.name)]);
    }
}

#[test]
fn the_shards_example_fences_every_shards_leader_through_one_leaderfence_and_confines_them_with_the_shard_label() {
    let built = kubectl_ok(&["kustomize", "artifacts/shards"]);
    let objects: Vec<serde_json::Value> =
        built.split("\n---\n").map(|doc| serde_saphyr::from_str(doc).expect("a YAML document")).collect();
    let of_kind = |kind: &'static str| objects.iter().filter(move |o| o["kind"] == kind);
    // One fence binding, reading the one LeaderFence every shard's leader
    // names itself in: named after --leader-election-id, which no shard
    // changes.
    let fence_bindings: Vec<_> = of_kind("ValidatingAdmissionPolicyBinding")
        .filter(|b| b["spec"]["policyName"] == sample_controller::testing::api::FENCE_POLICY)
        .collect();
    assert_eq!(fence_bindings.len(), 1, "one fence binding for the three shards");
    assert_eq!(fence_bindings[0]["spec"]["paramRef"]["name"], "sample-controller");
    let mut leases = BTreeSet::new();
    let mut keys = BTreeSet::new();
    for d in of_kind("Deployment") {
        let args = d["spec"]["template"]["spec"]["containers"][0]["args"].as_array().unwrap();
        let arg = |prefix: &str| args.iter().find_map(|a| a.as_str()?.strip_prefix(prefix).map(str::to_owned));
        assert_eq!(arg("--leader-election-id="), None, "a shard that names its LeaderFence otherwise is not fenced");
        let selector = arg("--shard-selector=")
            .unwrap_or_else(|| panic!("Deployment {} has no --shard-selector", d["metadata"]["name"]));
        let shard = Shard::parse(&selector).unwrap();
        keys.extend(shard.keys().map(str::to_owned));
        leases.insert(shard.lease_name("sample-controller").unwrap());
    }
    assert_eq!(leases.len(), 3, "three shards, three Leases");
    // The confinement admits the label the shards' Deployments follow.
    let confinement = of_kind("ValidatingAdmissionPolicy")
        .find(|p| p["metadata"]["name"] == sample_controller::CONFINEMENT_POLICY)
        .expect("the confinement");
    assert_eq!(confinement["spec"]["variables"][0]["name"], "followedLabelKeys");
    let followed: Vec<String> =
        serde_json::from_str(confinement["spec"]["variables"][0]["expression"].as_str().unwrap()).unwrap();
    assert_eq!(keys, followed.into_iter().collect(), "the label keys the selectors name");
    // No two shards' pods are selected by the same Deployment or budget.
    let selectors: BTreeSet<String> = of_kind("Deployment")
        .chain(of_kind("PodDisruptionBudget"))
        .map(|o| format!("{}{}", o["kind"], o["spec"]["selector"]))
        .collect();
    assert_eq!(selectors.len(), 6);
    assert_eq!(of_kind("ValidatingAdmissionPolicy").count(), 2, "one fence policy and one confinement, shared");
    assert_eq!(of_kind("ValidatingAdmissionPolicyBinding").count(), 2, "the fence's binding and the confinement's");
    assert_eq!(of_kind("Namespace").count(), 1);
}
