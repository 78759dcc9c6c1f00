//! deploy/ against the real API server: it is admitted (server-side dry run,
//! Pod Security "restricted"), and its RBAC is enough for every behaviour of
//! the controller — run here as the ServiceAccount through impersonation —
//! and no more. Its own test binary, so the all-namespaces controller below
//! runs alone.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use sample_controller::error::{ApiAction, SyncError};
use sample_controller::leader::{Elector, LeaderConfig};
use sample_controller::leader_fence::LeaderFence;
use sample_controller::metrics_auth::{Access, MetricsAuth};
use sample_controller::{Foo, FooSpec};
use serde_json::json;

const NS: &str = DEPLOY_NS;
/// Waits of the controller that watches every namespace (see its test).
const AS_DEPLOYED_TIMEOUT: Duration = Duration::from_secs(180);
const SA: &str = DEPLOY_SA;

const SA_USER: &str = DEPLOY_USER;

/// `kubectl auth can-i` as the ServiceAccount: yes or no, and nothing else
/// (an error is not a "no").
fn can_i(args: &[&str]) -> bool {
    let who = format!("--as={SA_USER}");
    let mut all = vec!["auth", "can-i", who.as_str()];
    all.extend_from_slice(args);
    let out = kubectl(&all);
    match String::from_utf8_lossy(&out.stdout).trim() {
        "yes" => true,
        "no" => false,
        other => panic!("kubectl auth can-i {args:?}: {other:?}, {}", String::from_utf8_lossy(&out.stderr)),
    }
}

/// What `user` may do on resources in `namespace`, from `kubectl auth
/// can-i --list`: "resource verb" pairs.
fn granted_to(user: &str, namespace: &str) -> BTreeSet<String> {
    let who = format!("--as={user}");
    let list = kubectl_ok(&["auth", "can-i", "--list", &who, "-n", namespace]);
    let mut granted = BTreeSet::new();
    for line in list.lines().skip(1) {
        let resource = line.split_whitespace().next().unwrap_or_default();
        if resource.is_empty() || resource.starts_with('[') {
            continue; // a non-resource URL
        }
        let verbs = &line[line.rfind('[').unwrap_or(0)..];
        for verb in verbs.trim_matches(|c| c == '[' || c == ']').split_whitespace() {
            granted.insert(format!("{resource} {verb}"));
        }
    }
    granted
}

/// What the ServiceAccount may do in `namespace` beyond what every
/// ServiceAccount may (self-reviews, and what each Kubernetes minor grants
/// all authenticated users): what deploy/ grants.
fn granted(namespace: &str) -> BTreeSet<String> {
    let everyone = granted_to("system:serviceaccount:default:no-bindings", namespace);
    assert!(everyone.contains("selfsubjectaccessreviews.authorization.k8s.io create"), "{everyone:?}");
    granted_to(SA_USER, namespace).difference(&everyone).cloned().collect()
}

/// deploy/'s grants, exactly: docs/design.md's RBAC section.
const CONTROLLER: [&str; 14] = [
    "deployments.apps create",
    "deployments.apps delete",
    "deployments.apps get",
    "deployments.apps list",
    "deployments.apps patch",
    "deployments.apps watch",
    "events.events.k8s.io create",
    "events.events.k8s.io patch",
    "foos.samplecontroller.k8s.io list",
    "foos.samplecontroller.k8s.io watch",
    "foos.samplecontroller.k8s.io/finalizers update",
    "foos.samplecontroller.k8s.io/status patch",
    "subjectaccessreviews.authorization.k8s.io create",
    "tokenreviews.authentication.k8s.io create",
];
const LEADER_ELECTION: [&str; 8] = [
    "leaderfences.samplecontroller.k8s.io create",
    "leaderfences.samplecontroller.k8s.io get",
    "leaderfences.samplecontroller.k8s.io update",
    "leases.coordination.k8s.io create",
    "leases.coordination.k8s.io get",
    "leases.coordination.k8s.io list",
    "leases.coordination.k8s.io update",
    "leases.coordination.k8s.io watch",
];

/// `kubectl apply -f deploy/`, once for all the tests here (once per test
/// under cargo-nextest, which runs them one at a time: .config/nextest.toml).
fn installed() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        kubectl_ok(&["apply", "-f", "deploy/"]);
    });
}

#[tokio::test]
async fn deploy_manifests_pass_a_server_side_dry_run_as_files_and_as_kustomization() {
    // The namespace must exist for the namespaced objects to be checked.
    kubectl_ok(&["apply", "-f", "deploy/00-namespace.yaml"]);
    kubectl_ok(&["apply", "--dry-run=server", "-f", "deploy/"]);
    kubectl_ok(&["apply", "--dry-run=server", "-k", "deploy/"]);
}

#[tokio::test]
async fn operator_pods_are_admitted_where_pod_security_restricted_is_enforced() {
    installed();
    // The ReplicaSet controller could create them (kwok runs them on simulated nodes).
    let admin = admin_client().await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    wait_until("the operator's 2 pods to be admitted", TIMEOUT, || async {
        let n = pods
            .list(&ListParams::default().labels("app.kubernetes.io/name=sample-controller"))
            .await
            .ok()?
            .items
            .len();
        (n == 2).then_some(())
    })
    .await;
    let rs: Api<ReplicaSet> = Api::namespaced(admin.clone(), NS);
    let rs = rs.list(&ListParams::default()).await.unwrap().items;
    let failure = rs
        .iter()
        .flat_map(|r| r.status.iter().flat_map(|s| s.conditions.iter().flatten()))
        .find(|c| c.type_ == "ReplicaFailure");
    assert!(failure.is_none(), "pods refused: {failure:?}");
    // ...and the namespace really enforces it: a plain pod (root allowed,
    // no seccomp profile, capabilities kept) is refused there.
    let privileged: Pod = serde_json::from_value(json!({
        "metadata": { "name": "not-restricted" },
        "spec": { "containers": [{ "name": "c", "image": "busybox:1" }] }
    }))
    .unwrap();
    let refused = pods.create(&PostParams::default(), &privileged).await.expect_err("PodSecurity must refuse it");
    assert!(refused.to_string().contains("violates PodSecurity \"restricted:latest\""), "{refused}");
}

#[tokio::test]
async fn the_service_account_can_run_the_whole_controller_and_uses_every_verb_it_is_granted() {
    installed();
    // One replica without --leader-elect, as a user runs it with deploy/
    // (docs/install.md, "One replica"): without the leader fence's binding, for the
    // fence refuses the writes of a replica that does not hold the Lease.
    // Applied again after the test, as a user goes back to two replicas.
    kubectl_ok(&["delete", "-f", FENCE_BINDING, "--ignore-not-found"]);
    let _fence_back = ApplyOnDrop(FENCE_BINDING);
    // Watching all namespaces with the default workers, as deployed. It
    // also meets every Foo the suites before it left in namespaces still
    // being deleted (hundreds, after the chaos suite), so its waits are long.
    let workers = sample_controller::cli::DEFAULT_WORKERS;
    let controller = start_controller_with(service_account_config(NS, SA).await, None, workers);
    let ns = TestNamespace::new("rbac").await;
    let foos: Api<Foo> = ns.api();
    // A Deployment of someone else's under the name a Foo asks for: the
    // create meets it and reads it (get), and refuses.
    let theirs: Deployment = serde_json::from_value(json!({
        "metadata": { "name": "taken" },
        "spec": { "replicas": 0, "selector": { "matchLabels": { "app": "other" } },
            "template": { "metadata": { "labels": { "app": "other" } },
                "spec": { "containers": [{ "name": "c", "image": "busybox:1" }] } } }
    }))
    .unwrap();
    ns.api::<Deployment>().create(&PostParams::default(), &theirs).await.unwrap();
    create_foo(&foos, "blocked", "taken", Some(1)).await;
    wait_until("the refusal", AS_DEPLOYED_TIMEOUT, || async {
        ns.events_for("blocked").await.into_iter().find(|e| e.starts_with("Warning ErrResourceExists"))
    })
    .await;

    // Create (with blockOwnerDeletion, which OwnerReferencesPermissionEnforcement
    // checks against foos/finalizers), status, events; the pod available:
    // status again, and the Synced event repeated into a series (patch).
    create_foo(&foos, "example-foo", "first", Some(1)).await;
    wait_available(&foos, "example-foo", 1, AS_DEPLOYED_TIMEOUT).await;
    // Replicas alone: a Deployment patch.
    let scale = json!({ "spec": { "replicas": 2 } });
    foos.patch("example-foo", &PatchParams::default(), &Patch::Merge(&scale)).await.unwrap();
    wait_until("the Deployment scaled to 2", AS_DEPLOYED_TIMEOUT, || async {
        deployment(&ns, "first").await.filter(|d| replicas(d) == Some(2))
    })
    .await;
    // The rename: a create and the old Deployment's delete.
    let rename = json!({ "spec": { "deploymentName": "second" } });
    foos.patch("example-foo", &PatchParams::default(), &Patch::Merge(&rename)).await.unwrap();
    wait_until("the renamed Deployment, the old one gone", AS_DEPLOYED_TIMEOUT, || async {
        let new = deployment(&ns, "second").await?;
        (replicas(&new) == Some(2) && deployment(&ns, "first").await.is_none()).then_some(())
    })
    .await;
    let foo = wait_available(&foos, "example-foo", 2, AS_DEPLOYED_TIMEOUT).await;
    assert_eq!(foo.status.unwrap().observed_generation, Some(3));
    // (Not the global error counter: this controller also sees Foos that
    // other test binaries left in namespaces being deleted.)
    let warnings: Vec<_> =
        ns.events_for("example-foo").await.into_iter().filter(|e| e.starts_with("Warning")).collect();
    assert!(warnings.is_empty(), "{warnings:?}");
    drop(controller);

    // The leader-election Lease in its namespace: the leader creates it
    // and renews it (an update); someone else's edit makes a renewal
    // conflict, and the leader reads the Lease once (a get) before renewing
    // from it; a standby lists and watches it while waiting; the leader's
    // release (an update) hands it over at once. Each new leader reads its
    // LeaderFence (a get) and claims it: the first creates it, the next
    // updates it, and a release names nobody (an update).
    let candidate = |identity: &'static str| async move {
        Elector::new(
            service_account_client(NS, SA).await,
            LeaderConfig {
                lease_name: "rbac-test".into(),
                namespace: NS.into(),
                identity: identity.into(),
                lease_duration: Duration::from_secs(15),
                renew_deadline: Duration::from_secs(10),
                retry_period: Duration::from_secs(2),
            },
        )
    };
    let mut leader = candidate("rbac-test-leader").await;
    tokio::time::timeout(TIMEOUT, leader.acquire()).await.expect("acquire the lease as the ServiceAccount");
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(admin_client().await, NS);
    let label = json!({ "metadata": { "labels": { "edited-by": "an-admin" } } });
    leases.patch("rbac-test", &PatchParams::default(), &Patch::Merge(&label)).await.unwrap();
    let held = tokio::time::timeout(Duration::from_secs(5), leader.hold()).await;
    assert!(held.is_err(), "an edit of the Lease under its leader cost the leadership: {held:?}");
    let lease = leases.get("rbac-test").await.unwrap();
    assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some("rbac-test-leader"));
    assert_eq!(lease.metadata.labels.unwrap()["edited-by"], "an-admin", "the renewal kept the edit");
    let mut standby = candidate("rbac-test-standby").await;
    let waiting = tokio::spawn(async move {
        tokio::time::timeout(TIMEOUT, standby.acquire()).await.expect("the standby takes over");
        standby.release().await;
    });
    // The standby must be waiting before the release, so that the release
    // and not the Lease's expiry hands over; it has no signal for that.
    tokio::time::sleep(Duration::from_secs(1)).await;
    leader.release().await;
    waiting.await.unwrap();

    // A secure-metrics scrape, reviewed as the ServiceAccount: a
    // TokenReview of the scraper's token, a SubjectAccessReview of its user.
    let scraper = kubectl_ok(&["create", "token", SA, "-n", NS]);
    let auth = MetricsAuth::new(service_account_client(NS, SA).await);
    let access = auth.check(Some(&format!("Bearer {}", scraper.trim()))).await.expect("review the scraper");
    assert_eq!(access, Access::Forbidden, "the operator's own ServiceAccount may not read metrics");

    // Every verb granted was used, as the API server's audit log shows. Not
    // foos/finalizers: an admission check on the Deployment create, never a
    // request of its own (the creates above would have been refused).
    let used: BTreeSet<String> = audited_as(SA_USER)
        .into_iter()
        .map(|r| format!("{}{} {}", r.resource, r.subresource.map(|s| format!("/{s}")).unwrap_or_default(), r.verb))
        .collect();
    let unused: Vec<_> = CONTROLLER
        .iter()
        .chain(&LEADER_ELECTION)
        .filter(|grant| !grant.contains("/finalizers") && !used.contains(&as_audited(grant)))
        .collect();
    assert!(unused.is_empty(), "granted but never used by the ServiceAccount: {unused:?}\nused: {used:?}");
}

/// A grant as the audit log names it: "deployments.apps patch" is
/// "deployments patch", "foos.samplecontroller.k8s.io/status patch" is
/// "foos/status patch".
fn as_audited(grant: &str) -> String {
    let (resource, verb) = grant.split_once(' ').unwrap();
    let (name, sub) = resource.split_once('/').map_or((resource, None), |(n, s)| (n, Some(s)));
    let plain = name.split('.').next().unwrap();
    format!("{plain}{} {verb}", sub.map(|s| format!("/{s}")).unwrap_or_default())
}

#[tokio::test]
async fn the_service_account_is_granted_exactly_what_the_readme_lists() {
    installed();
    let want = |sets: &[&[&str]]| sets.concat().into_iter().map(str::to_owned).collect();
    assert_eq!(granted("default"), want(&[&CONTROLLER]), "in any namespace");
    assert_eq!(granted(NS), want(&[&CONTROLLER, &LEADER_ELECTION]), "in its own namespace");
}

#[tokio::test]
async fn the_service_account_has_the_verbs_the_controller_uses() {
    installed();
    let missing: Vec<_> = [
        &["list", "foos.samplecontroller.k8s.io", "-A"][..],
        &["patch", "deployments.apps", "-n", "default"],
        &["watch", "deployments.apps", "-A"],
        &["patch", "foos.samplecontroller.k8s.io", "--subresource=status", "-n", "default"],
        &["create", "events.events.k8s.io", "-n", "default"],
        &["update", "leases.coordination.k8s.io", "-n", NS],
    ]
    .into_iter()
    .filter(|verb| !can_i(verb))
    .collect();
    assert!(missing.is_empty(), "the ServiceAccount must be able to {missing:?}");
}

#[tokio::test]
async fn the_service_account_has_no_verb_the_controller_does_not_use() {
    installed();
    let extra: Vec<_> = [
        &["update", "deployments.apps", "-n", "default"][..],
        &["delete", "foos.samplecontroller.k8s.io", "-n", "default"],
        &["get", "foos.samplecontroller.k8s.io", "-n", "default"],
        &["create", "foos.samplecontroller.k8s.io", "-n", "default"],
        &["update", "foos.samplecontroller.k8s.io", "-n", "default"],
        &["get", "secrets", "-n", NS],
        &["create", "pods", "-n", "default"],
        &["delete", "namespaces"],
        &["create", "leases.coordination.k8s.io", "-n", "default"],
        &["create", "events", "-n", "default"],
    ]
    .into_iter()
    .filter(|verb| can_i(verb))
    .collect();
    assert!(extra.is_empty(), "the ServiceAccount must not be able to {extra:?}");
}

/// The writes deploy/'s leader fence guards, made with `client` in `ns`:
/// a Deployment create, patch and delete, a Foo status patch, an Event
/// create and patch. The patches and the delete are of objects an admin
/// made ([`fenced_targets`]); the delete is a dry run, which admission sees
/// as a delete but which leaves the object for the next caller. Each one's
/// refusal, if any.
async fn guarded_writes(client: &kube::Client, ns: &TestNamespace, tag: &str) -> Vec<Option<kube::Error>> {
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": { "generateName": format!("{tag}-") },
        "spec": { "replicas": 0, "selector": { "matchLabels": { "app": tag } },
            "template": { "metadata": { "labels": { "app": tag } },
                "spec": { "containers": [{ "name": "c", "image": "busybox:1" }] } } }
    }))
    .unwrap();
    let status = json!({ "status": { "availableReplicas": 0 } });
    let event = fence_event(ns, tag);
    let labelled = json!({ "metadata": { "labels": { "written-by": tag } } });
    let (pp, patch) = (PostParams::default(), PatchParams::default());
    let dry_run = kube::api::DeleteParams { dry_run: true, ..Default::default() };
    let (deployments, events) =
        (Api::<Deployment>::namespaced(client.clone(), &ns.name), Api::<Event>::namespaced(client.clone(), &ns.name));
    vec![
        deployments.create(&pp, &deployment).await.err(),
        deployments.patch(FENCED, &patch, &Patch::Merge(&labelled)).await.err(),
        deployments.delete(FENCED, &dry_run).await.err(),
        Api::<Foo>::namespaced(client.clone(), &ns.name)
            .patch_status(FENCED, &patch, &Patch::Merge(&status))
            .await
            .err(),
        events.create(&pp, &event).await.err(),
        events.patch(FENCED, &patch, &Patch::Merge(&labelled)).await.err(),
    ]
}

/// The name of the Foo, Deployment and Event the fence tests write to.
const FENCED: &str = "fenced";

fn fence_event(ns: &TestNamespace, tag: &str) -> Event {
    serde_json::from_value(json!({
        "metadata": { "generateName": format!("{tag}-") },
        "eventTime": Timestamp::now().to_string(), "reportingController": "sample-controller",
        "reportingInstance": tag, "action": "Reconcile", "reason": "Synced", "type": "Normal",
        "regarding": { "apiVersion": "samplecontroller.k8s.io/v1alpha1", "kind": "Foo", "name": FENCED,
            "namespace": ns.name }
    }))
    .unwrap()
}

/// What the guarded writes patch and delete, made by an admin.
async fn fenced_targets(ns: &TestNamespace) {
    create_foo(&ns.api(), FENCED, FENCED, Some(1)).await;
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": { "name": FENCED },
        "spec": { "replicas": 0, "selector": { "matchLabels": { "app": FENCED } },
            "template": { "metadata": { "labels": { "app": FENCED } },
                "spec": { "containers": [{ "name": "c", "image": "busybox:1" }] } } }
    }))
    .unwrap();
    ns.api::<Deployment>().create(&PostParams::default(), &deployment).await.unwrap();
    let mut event = fence_event(ns, FENCED);
    event.metadata = kube::api::ObjectMeta { name: Some(FENCED.into()), ..Default::default() };
    ns.api::<Event>().create(&PostParams::default(), &event).await.unwrap();
}

/// A pod of another Deployment run as deploy/'s ServiceAccount, as another
/// shard's operator is (artifacts/shards); its pods are not labelled as
/// deploy/'s, which the other tests count, and pass the namespace's Pod
/// Security level (restricted).
async fn pod_of_another_deployment(name: &str) -> Pod {
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": NS },
        "spec": { "replicas": 1, "selector": { "matchLabels": { "fence-test": name } },
            "template": { "metadata": { "labels": { "fence-test": name } },
                "spec": { "serviceAccountName": SA,
                    "securityContext": { "runAsNonRoot": true, "runAsUser": 65532,
                        "seccompProfile": { "type": "RuntimeDefault" } },
                    "containers": [{ "name": "c", "image": "busybox:1",
                        "securityContext": { "allowPrivilegeEscalation": false,
                            "capabilities": { "drop": ["ALL"] } } }] } } }
    }))
    .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(admin_client().await, NS);
    deployments.patch(name, &PatchParams::apply("e2e-rbac").force(), &Patch::Apply(&deployment)).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(admin_client().await, NS);
    wait_until("the other Deployment's pod", AS_DEPLOYED_TIMEOUT, || async {
        let list = pods.list(&ListParams::default().labels(&format!("fence-test={name}"))).await.ok()?;
        list.items.into_iter().find(|p| p.metadata.deletion_timestamp.is_none())
    })
    .await
}

/// What the replica in `pod` writes when it takes the lead
/// (`leader::Elector`): the Lease, then its LeaderFence, both naming it.
async fn take_lead(client: &kube::Client, pod: &Pod) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), DEPLOY_NS);
    let holder = format!("{}_{}", pod.name_any(), std::process::id());
    let spec = json!({ "holderIdentity": holder, "leaseDurationSeconds": 15,
        "renewTime": MicroTime(Timestamp::now()) });
    match leases.get_opt(DEPLOY_LEASE).await.unwrap() {
        Some(mut lease) => {
            lease.spec = Some(serde_json::from_value(spec).unwrap());
            leases.replace(DEPLOY_LEASE, &PostParams::default(), &lease).await.unwrap();
        }
        None => {
            let lease = json!({ "metadata": { "name": DEPLOY_LEASE }, "spec": spec });
            leases.create(&PostParams::default(), &serde_json::from_value(lease).unwrap()).await.unwrap();
        }
    }
    let fences: Api<LeaderFence> = Api::namespaced(client.clone(), DEPLOY_NS);
    let current = fences.get_opt(DEPLOY_LEASE).await.unwrap();
    let existed = current.is_some();
    let ours = LeaderFence::naming(current, DEPLOY_LEASE, Some(&holder));
    let written = if existed {
        fences.replace(DEPLOY_LEASE, &PostParams::default(), &ours).await
    } else {
        fences.create(&PostParams::default(), &ours).await
    };
    written.unwrap_or_else(|e| panic!("{holder} claims the LeaderFence: {e}"));
}

fn all_admitted(writes: &[Option<kube::Error>]) -> bool {
    writes.iter().all(Option::is_none)
}

/// Whether the operator takes `e` for a refusal by the fence.
fn is_fence_refusal(e: &kube::Error) -> bool {
    let source = kube::Error::Api(match e {
        kube::Error::Api(status) => status.clone(),
        _ => return false,
    });
    SyncError::Api { foo: "fenced".into(), action: ApiAction::CreateDeployment, source }.is_fence_refusal()
}

/// Every write refused by the fence, as the operator recognises it.
fn assert_fenced(writes: Vec<Option<kube::Error>>, who: &str) {
    for (i, refusal) in writes.into_iter().enumerate() {
        let refusal = refusal.unwrap_or_else(|| panic!("{who}: write #{i} was admitted"));
        assert!(is_fence_refusal(&refusal), "{who}: write #{i}: {refusal}");
    }
}

#[tokio::test]
async fn the_api_server_admits_the_operators_writes_only_from_the_pod_that_holds_its_lease() {
    let pods = install_deploy().await;
    let _lease = FreshLease::new();
    let ns = TestNamespace::new("fence").await;
    fenced_targets(&ns).await;
    let (a, b) = (pod_client(&pods[0]).await, pod_client(&pods[1]).await);
    // No LeaderFence: the fence is open, for every user (the API server
    // looks it up before it checks who writes; `Deny` there would refuse
    // every user's Deployment writes in the cluster).
    assert!(all_admitted(&guarded_writes(&ns.client, &ns, "admin-no-lease").await), "an admin's writes, no fence");
    assert!(all_admitted(&guarded_writes(&a, &ns, "no-lease").await), "the operator's writes, no fence");

    // Lease and LeaderFence writes are never fenced: a's replica takes both.
    take_lead(&a, &pods[0]).await;
    // The API server reads the LeaderFence through an informer: it admits
    // a's writes once that has the new holder (no watch shows when).
    wait_until("the holder's writes admitted", TIMEOUT, || async {
        all_admitted(&guarded_writes(&a, &ns, "holder").await).then_some(())
    })
    .await;
    assert_fenced(guarded_writes(&b, &ns, "standby").await, "the standby's pod");
    // A token bound to no pod (`kubectl create token`) names no pod.
    let unbound = kubectl_ok(&["create", "token", SA, "-n", NS]);
    let unbound = token_client("unbound", unbound.trim()).await;
    assert_fenced(guarded_writes(&unbound, &ns, "unbound").await, "a token bound to no pod");
    // Everyone else is left alone.
    assert!(all_admitted(&guarded_writes(&ns.client, &ns, "admin").await), "an admin's writes");

    // b takes over: the API server follows.
    take_lead(&b, &pods[1]).await;
    wait_until("the new holder's writes admitted", TIMEOUT, || async {
        all_admitted(&guarded_writes(&b, &ns, "new-holder").await).then_some(())
    })
    .await;
    assert_fenced(guarded_writes(&a, &ns, "deposed").await, "the deposed holder's pod");
    // The Lease fences the replicas of the Deployment that holds it; another
    // shard's operator answers to its own Lease.
    let other = pod_of_another_deployment("sample-controller-other-shard").await;
    let other_client = pod_client(&other).await;
    assert!(all_admitted(&guarded_writes(&other_client, &ns, "other-shard").await), "another Deployment's pod");
    kubectl_ok(&["delete", "deployment", "sample-controller-other-shard", "-n", NS, "--wait=false"]);
}

/// The ordinary operations that take the leader fence away and put it
/// back, each as a user runs it; deploy/ is applied again after each.
#[derive(Clone, Copy, Debug)]
enum Churn {
    /// The binding deleted, past the API server's policy refresh (a
    /// second), and applied again: the fence turned off and on.
    BindingAppliedAgain,
    /// `kubectl delete -f deploy/` and `kubectl apply -f deploy/`: an
    /// uninstall and a reinstall, or a GitOps prune and its re-creation.
    Reinstalled,
    /// docs/install.md's one replica without leader election, and back to
    /// two replicas by applying deploy/.
    OneReplicaAndBack,
}

impl Churn {
    async fn run(self) {
        match self {
            Churn::BindingAppliedAgain => {
                kubectl_ok(&["delete", "-f", FENCE_BINDING]);
                tokio::time::sleep(Duration::from_secs(3)).await;
            }
            Churn::Reinstalled => {
                kubectl_ok(&["delete", "-f", "deploy/", "--wait=true", "--timeout=180s"]);
            }
            Churn::OneReplicaAndBack => {
                kubectl_ok(&["delete", "-f", FENCE_BINDING, "-f", "deploy/06-pod-disruption-budget.yaml"]);
                kubectl_ok(&["-n", NS, "scale", "deployment/sample-controller", "--replicas=0"]);
                let pods: Api<Pod> = Api::namespaced(admin_client().await, NS);
                wait_until("the operator's pods gone", AS_DEPLOYED_TIMEOUT, || async {
                    let operator = ListParams::default().labels("app.kubernetes.io/name=sample-controller");
                    pods.list(&operator).await.ok()?.items.is_empty().then_some(())
                })
                .await;
                let one = r#"[{"op":"replace","path":"/spec/replicas","value":1},{"op":"replace","path":"/spec/template/spec/containers/0/args/0","value":"--leader-elect=false"}]"#;
                kubectl_ok(&["-n", NS, "patch", "deployment", "sample-controller", "--type=json", "-p", one]);
                kubectl_ok(&["-n", NS, "rollout", "status", "deployment/sample-controller", "--timeout=180s"]);
            }
        }
        install_deploy().await;
    }
}

/// Kubernetes issue 130887: with a built-in parameter kind (the Lease, as
/// the fence had it), each of these operations left the API server's view
/// of the holder frozen, so after the next change of leader it refused the
/// new leader's writes (and admitted the deposed one's) until
/// kube-apiserver restarted. Fails on that policy; the LeaderFence's
/// informer starts again with the binding.
#[tokio::test]
async fn the_fence_follows_the_leader_after_the_binding_is_applied_again_a_reinstall_and_one_replica_mode() {
    install_deploy().await;
    let _lease = FreshLease::new();
    let ns = TestNamespace::new("fence-churn").await;
    fenced_targets(&ns).await;
    for churn in [Churn::BindingAppliedAgain, Churn::Reinstalled, Churn::OneReplicaAndBack] {
        // A leader the API server knows, before the operation.
        let pods = deploy_pods().await;
        let leader = pod_client(&pods[0]).await;
        take_lead(&leader, &pods[0]).await;
        wait_until(&format!("the leader's writes admitted before {churn:?}"), TIMEOUT, || async {
            all_admitted(&guarded_writes(&leader, &ns, "before").await).then_some(())
        })
        .await;

        churn.run().await;

        // The other replica takes over (new pods, after a reinstall).
        let pods = deploy_pods().await;
        let (deposed, new) = (pod_client(&pods[0]).await, pod_client(&pods[1]).await);
        take_lead(&deposed, &pods[0]).await;
        take_lead(&new, &pods[1]).await;
        // Both at once: until the API server has the binding (a second) and
        // the LeaderFence, the policy fails open and admits everyone.
        let what = format!("the new leader admitted and the deposed one refused after {churn:?}");
        wait_until(&what, TIMEOUT, || async {
            let refused = guarded_writes(&deposed, &ns, "deposed").await;
            let fenced = refused.iter().all(|r| r.as_ref().is_some_and(is_fence_refusal));
            (fenced && all_admitted(&guarded_writes(&new, &ns, "after").await)).then_some(())
        })
        .await;
        assert!(all_admitted(&guarded_writes(&ns.client, &ns, "admin").await), "an admin's writes, after {churn:?}");
    }
}

/// `sample-controller check`, as a user runs it against the cluster of
/// their kubeconfig: whether it passed, and its lines.
fn preflight() -> (bool, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sample-controller"));
    cmd.args(["check", "--kubeconfig", &kubeconfig_path()]).env_remove("SAMPLE_CONTROLLER_KUBECONFIG");
    for proxy in ["HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy"] {
        cmd.env_remove(proxy);
    }
    let out = cmd.output().expect("run sample-controller check");
    let lines = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("{lines}{}", String::from_utf8_lossy(&out.stderr));
    (out.status.success(), lines)
}

/// The line of check `name`, which must have failed.
fn failed_check(lines: &str, name: &str) -> String {
    let line = lines.lines().find(|l| l.contains(&format!(" {name}: "))).unwrap_or_else(|| panic!("no {name} line"));
    assert!(line.starts_with("FAIL"), "{line}");
    line.to_owned()
}

/// The Foo CRD deleted while this lives (every Foo in the cluster with
/// it), and applied again, established, once it is dropped.
struct NoFooCrd;

impl NoFooCrd {
    fn new() -> Self {
        kubectl_ok(&["delete", "-f", "crds/", "--wait=true", "--timeout=180s"]);
        NoFooCrd
    }
}

impl Drop for NoFooCrd {
    fn drop(&mut self) {
        kubectl(&["apply", "-f", "crds/"]);
        kubectl(&["wait", "--for=condition=established", "crd/foos.samplecontroller.k8s.io", "--timeout=60s"]);
    }
}

#[tokio::test]
async fn check_passes_on_a_good_install_and_names_a_removed_rbac_rule_a_broken_fence_and_a_missing_crd() {
    let pods = install_deploy().await;
    let _lease = FreshLease::new();
    take_lead(&pod_client(&pods[0]).await, &pods[0]).await;
    let (passed, lines) = preflight();
    assert!(passed, "a good install: {lines}");
    assert_eq!(lines.lines().filter(|l| l.starts_with("ok ")).count(), 5, "{lines}");
    assert!(lines.contains("follows the Lease"), "{lines}");

    {
        let _role_back = ApplyOnDrop("deploy/02-clusterrole.yaml");
        let no_patch = r#"[{"op":"test","path":"/rules/3/resources/0","value":"deployments"},{"op":"test","path":"/rules/3/verbs/4","value":"patch"},{"op":"remove","path":"/rules/3/verbs/4"}]"#;
        kubectl_ok(&["patch", "clusterrole", "sample-controller", "--type=json", "-p", no_patch]);
        let (passed, lines) = preflight();
        assert!(!passed, "{lines}");
        assert!(failed_check(&lines, "RBAC").contains("patch deployments.apps"), "{lines}");
    }

    let other = format!("{}_1", pods[1].name_any());
    let fences: Api<LeaderFence> = Api::namespaced(admin_client().await, DEPLOY_NS);
    let mut fence = fences.get(DEPLOY_LEASE).await.unwrap();
    fence.spec.holder_identity = Some(other.clone());
    fences.replace(DEPLOY_LEASE, &PostParams::default(), &fence).await.unwrap();
    let (passed, lines) = preflight();
    assert!(!passed, "{lines}");
    let line = failed_check(&lines, "leader fence");
    assert!(line.contains(&other) && line.contains(&pods[0].name_any()), "{line}");

    let _no_crd = NoFooCrd::new();
    let (passed, lines) = preflight();
    assert!(!passed, "{lines}");
    assert!(failed_check(&lines, "Foo CRD").contains("not installed"), "{lines}");
}

/// A client acting as `user`, an ordinary authenticated user.
async fn user_client(user: &str) -> kube::Client {
    let mut cfg = config().await;
    cfg.auth_info.impersonate = Some(user.into());
    cfg.auth_info.impersonate_groups = Some(vec!["system:authenticated".into()]);
    kube::Client::try_from(cfg).expect("client")
}

#[tokio::test]
async fn a_namespace_editor_can_create_foos_and_a_viewer_can_only_read_them() {
    installed();
    let ns = TestNamespace::new("foo-roles").await;
    ns.kubectl_ok(&["create", "rolebinding", "jane-edits", "--clusterrole=edit", "--user=jane"]);
    ns.kubectl_ok(&["create", "rolebinding", "joe-views", "--clusterrole=view", "--user=joe"]);
    let as_jane: Api<Foo> = Api::namespaced(user_client("jane").await, &ns.name);
    let as_joe: Api<Foo> = Api::namespaced(user_client("joe").await, &ns.name);
    let foo = Foo::new("by-jane", FooSpec { deployment_name: "by-jane".into(), replicas: Some(1) });
    // The controller-manager folds the Foo roles into edit and view.
    wait_until("an editor to create a Foo", TIMEOUT, || async {
        as_jane.create(&PostParams::default(), &foo).await.ok()
    })
    .await;
    let read = wait_until("a viewer to read it", TIMEOUT, || async { as_joe.get("by-jane").await.ok() }).await;
    assert_eq!(read.spec.deployment_name, "by-jane");
    let joes = Foo::new("by-joe", FooSpec { deployment_name: "by-joe".into(), replicas: Some(1) });
    let refused = as_joe.create(&PostParams::default(), &joes).await.unwrap_err();
    assert!(matches!(&refused, kube::Error::Api(s) if s.code == 403), "a viewer created a Foo: {refused}");
    let scaled =
        as_jane.patch("by-jane", &PatchParams::default(), &Patch::Merge(json!({ "spec": { "replicas": 2 } }))).await;
    assert!(scaled.is_ok(), "an editor cannot change a Foo: {scaled:?}");
}

/// artifacts/namespaced's namespace, where its operator may work.
const CONFINED_NS: &str = "team-a";

/// artifacts/namespaced applied as its comment says (deploy/'s
/// cluster-wide binding deleted); deploy/ and no team-a again when dropped,
/// so the tests after find deploy/ as installed.
struct NamespacedInstall;

impl NamespacedInstall {
    fn apply() -> Self {
        let installed = NamespacedInstall;
        kubectl_ok(&["apply", "-k", "artifacts/namespaced"]);
        kubectl_ok(&["delete", "clusterrolebinding", "sample-controller"]);
        installed
    }
}

impl Drop for NamespacedInstall {
    fn drop(&mut self) {
        for args in [
            &["delete", "-f", "artifacts/namespaced/rbac.yaml", "--ignore-not-found", "--wait=false"][..],
            &["apply", "-f", "deploy/"],
        ] {
            let out = kubectl(args);
            if !out.status.success() {
                eprintln!("kubectl {args:?} after the namespaced install: {}", String::from_utf8_lossy(&out.stderr));
            }
        }
    }
}

#[tokio::test]
async fn the_namespaced_install_grants_its_namespace_only_and_reconciles_there() {
    installed();
    let _install = NamespacedInstall::apply();
    let elsewhere = TestNamespace::new("not-confined").await;
    let granted_in = granted(CONFINED_NS);
    let want: BTreeSet<String> = CONTROLLER.iter().map(|g| g.to_string()).collect();
    assert_eq!(granted_in, want, "its namespace: deploy/'s grants");
    let metrics_auth: BTreeSet<String> =
        CONTROLLER.iter().filter(|g| g.contains("reviews")).map(|g| g.to_string()).collect();
    assert_eq!(granted(&elsewhere.name), metrics_auth, "another namespace: the reviews of secure metrics only");
    assert!(!can_i(&["list", "foos.samplecontroller.k8s.io", "--all-namespaces"]), "Foos of every namespace");

    // Its replica, run as deploy/ runs it with the overlay's --namespace.
    kubectl_ok(&["rollout", "status", "deployment/sample-controller", "-n", NS, "--timeout=180s"]);
    let pods = deploy_pods().await;
    let args = pods[0].spec.as_ref().and_then(|s| s.containers[0].args.clone()).unwrap_or_default();
    assert!(args.iter().any(|a| a == "--namespace=team-a"), "{args:?}");
    let _lease = FreshLease::new();
    let _replica = spawn_replica(CONFINED_NS, &pods[0], LEASE).await;
    let foos: Api<Foo> = Api::namespaced(admin_client().await, CONFINED_NS);
    create_foo(&foos, "confined", "confined", Some(1)).await;
    wait_available(&foos, "confined", 1, AS_DEPLOYED_TIMEOUT).await;
}
