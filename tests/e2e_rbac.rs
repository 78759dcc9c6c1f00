//! deploy/ against the real API server: it is admitted (server-side dry run,
//! Pod Security "restricted"), and its RBAC is enough for every behaviour of
//! the controller — run here through impersonation, as a ServiceAccount
//! bound as deploy/ binds its own — and no more. Its own test binary, so the
//! all-namespaces controller below runs alone.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::*;
use futures::TryStreamExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube_lease_fence::Elector;
use kube_secure_metrics::{Access, MetricsAuth};
use sample_controller::testing::api::UNSHARDED;
use sample_controller::testing::api::desired_deployment;
use sample_controller::testing::app::leader_config;
use sample_controller::testing::client::Paced;
use sample_controller::testing::reconcile::{ApiAction, SyncError};
use sample_controller::{Foo, FooSpec};
use sample_controller::{LeaderFence, LeaderFenceSpec};
use serde_json::{Value, json};

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

/// What the API server grants `user` in `namespace` beyond what every
/// ServiceAccount may (self-reviews, and what each Kubernetes minor grants
/// all authenticated users): what its bindings grant it.
fn granted(user: &str, namespace: &str) -> BTreeSet<String> {
    let everyone = granted_to("system:serviceaccount:default:no-bindings", namespace);
    assert!(everyone.contains("selfsubjectaccessreviews.authorization.k8s.io create"), "{everyone:?}");
    granted_to(user, namespace).difference(&everyone).cloned().collect()
}

/// The objects of a YAML file of one or more documents.
fn yaml_objects(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let objects: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    objects.into_iter().filter(|o| !o.is_null()).collect()
}

/// Every object of deploy/'s files, as `kubectl apply -f deploy/` reads them.
fn deploy_objects() -> Vec<Value> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("read deploy/")
        .map(|entry| entry.expect("a file of deploy/").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    files.iter().flat_map(|path| yaml_objects(&path.to_string_lossy())).collect()
}

/// Whether `object` is a binding of deploy/'s ServiceAccount.
fn binds_deploy_sa(object: &Value) -> bool {
    let is_binding = matches!(object["kind"].as_str(), Some("ClusterRoleBinding" | "RoleBinding"));
    let its_namespace = object["metadata"]["namespace"].as_str();
    is_binding
        && object["subjects"].as_array().is_some_and(|subjects| {
            subjects.iter().any(|s| {
                s["kind"] == "ServiceAccount"
                    && s["name"] == SA
                    && s["namespace"].as_str().or(its_namespace) == Some(DEPLOY_NS)
            })
        })
}

/// The verbs an RBAC rule can name.
const VERBS: [&str; 11] = [
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
    "bind",
    "escalate",
    "impersonate",
];

/// A piece of Markdown prose: a `code` span, or a plain word.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Piece<'a> {
    Code(&'a str),
    Word(&'a str),
}

fn pieces(text: &str) -> Vec<Piece<'_>> {
    assert!(text.matches('`').count().is_multiple_of(2), "an unclosed ` in {text:?}");
    let mut pieces = Vec::new();
    for (i, part) in text.split('`').enumerate() {
        if i % 2 == 1 {
            pieces.push(Piece::Code(part));
        } else {
            let words = part.split(|c: char| !(c.is_alphanumeric() || c == '\'' || c == '-'));
            pieces.extend(words.filter(|w| !w.is_empty()).map(Piece::Word));
        }
    }
    pieces
}

/// The API resource `name` names in prose ("Foos", `foos/status`,
/// `tokenreviews`), as `kubectl auth can-i --list` names it
/// ("foos.samplecontroller.k8s.io/status"), if any: a plural of
/// `resources` (`kubectl api-resources -o name`), of `group` when the group
/// came just before it ("`events.k8s.io` Events").
fn resource_named(name: &str, group: Option<&str>, resources: &BTreeSet<String>) -> Option<String> {
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '-')) {
        return None;
    }
    let lower = name.to_ascii_lowercase();
    let (plural, sub) = lower.split_once('/').map_or((lower.as_str(), None), |(p, s)| (p, Some(s)));
    let found: Vec<&String> = resources
        .iter()
        .filter(|r| match group {
            Some(group) => **r == format!("{plural}.{group}"),
            None => r.as_str() == plural || r.split('.').next() == Some(plural),
        })
        .collect();
    match found[..] {
        [] => None,
        [one] => Some(sub.map_or_else(|| one.clone(), |sub| format!("{one}/{sub}"))),
        _ => panic!("docs/design.md's RBAC section: {name:?} is any of {found:?}; name its group before it"),
    }
}

/// The grants prose lists, by the file of deploy/ whose role grants them:
/// the prose names the file (`deploy/02-clusterrole.yaml`), then
/// resources each followed by their verbs ("Foos `list/watch`",
/// "`tokenreviews` and `subjectaccessreviews` `create`"). Verbs that follow
/// "never" or "not", or no resource, are not grants ("(never `update`)").
fn grants_in_prose(text: &str, resources: &BTreeSet<String>) -> BTreeMap<String, BTreeSet<String>> {
    let groups: BTreeSet<&str> = resources.iter().filter_map(|r| r.split_once('.').map(|(_, g)| g)).collect();
    let mut grants: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let (mut file, mut named, mut group, mut denied) = (None, Vec::new(), None, false);
    for piece in pieces(text) {
        let qualifier = group.take();
        match piece {
            Piece::Code(path) if path.starts_with("deploy/") && path.ends_with(".yaml") => {
                assert!(named.is_empty(), "docs/design.md's RBAC section: {named:?} named without verbs");
                file = Some(path);
            }
            Piece::Code(verbs) if verbs.split('/').all(|v| VERBS.contains(&v)) => {
                if !denied && !named.is_empty() {
                    let file =
                        file.unwrap_or_else(|| panic!("docs/design.md's RBAC section: {named:?} before any file"));
                    let of_file = grants.entry(file.to_owned()).or_default();
                    for resource in named.drain(..) {
                        of_file.extend(verbs.split('/').map(|verb| format!("{resource} {verb}")));
                    }
                }
            }
            Piece::Code(code) => match resource_named(code, qualifier, resources) {
                Some(resource) => named.push(resource),
                None if groups.contains(code) => group = Some(code),
                None => {}
            },
            Piece::Word(word) => named.extend(resource_named(word, qualifier, resources)),
        }
        denied = matches!(piece, Piece::Word("never" | "not"));
    }
    assert!(named.is_empty(), "docs/design.md's RBAC section: {named:?} named without verbs");
    grants
}

/// The first paragraph of docs/design.md's RBAC section: what deploy/
/// grants its ServiceAccount.
fn design_rbac_paragraph() -> String {
    let design = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/design.md")).unwrap();
    let section = design.split("\n## RBAC\n").nth(1).expect("docs/design.md has a section \"## RBAC\"");
    let lines = section.lines().skip_while(|l| l.trim().is_empty()).take_while(|l| !l.trim().is_empty());
    lines.collect::<Vec<_>>().join(" ")
}

/// A role of deploy/ with the grants docs/design.md's RBAC section lists
/// for it.
struct DocumentedRole {
    /// "ClusterRole name" or "Role name", as its file declares it.
    role: String,
    grants: BTreeSet<String>,
    /// Where deploy/ binds it to its ServiceAccount: `None`, every
    /// namespace (a ClusterRoleBinding).
    bound_in: Vec<Option<String>>,
}

/// docs/design.md's RBAC section, read against deploy/: each file it names,
/// the role there, the grants it lists for it, and where deploy/ binds it.
fn documented_roles() -> Vec<DocumentedRole> {
    let resources: BTreeSet<String> = kubectl_ok(&["api-resources", "-o", "name"]).lines().map(str::to_owned).collect();
    let bindings: Vec<Value> = deploy_objects().into_iter().filter(binds_deploy_sa).collect();
    let roles: Vec<DocumentedRole> = grants_in_prose(&design_rbac_paragraph(), &resources)
        .into_iter()
        .map(|(file, grants)| {
            let objects = yaml_objects(&format!("{}/{file}", env!("CARGO_MANIFEST_DIR")));
            let role = objects
                .iter()
                .find(|o| matches!(o["kind"].as_str(), Some("Role" | "ClusterRole")))
                .unwrap_or_else(|| panic!("{file}, named in docs/design.md's RBAC section, holds no role"));
            let (kind, name) = (&role["kind"], &role["metadata"]["name"]);
            let bound_in: Vec<Option<String>> = bindings
                .iter()
                .filter(|b| b["roleRef"]["kind"] == *kind && b["roleRef"]["name"] == *name)
                .map(|b| match b["kind"].as_str() {
                    Some("ClusterRoleBinding") => None,
                    _ => Some(b["metadata"]["namespace"].as_str().unwrap_or("default").to_owned()),
                })
                .collect();
            assert!(!bound_in.is_empty(), "deploy/ binds {kind} {name} ({file}) to no ServiceAccount of its own");
            let role = format!("{} {}", kind.as_str().unwrap_or_default(), name.as_str().unwrap_or_default());
            DocumentedRole { role, grants, bound_in }
        })
        .collect();
    assert!(!roles.is_empty(), "docs/design.md's RBAC section lists no grant: {}", design_rbac_paragraph());
    roles
}

/// What `roles` grant the ServiceAccount in `namespace`.
fn documented_in(roles: &[DocumentedRole], namespace: &str) -> BTreeSet<String> {
    roles
        .iter()
        .filter(|r| r.bound_in.iter().any(|n| n.as_deref().is_none_or(|n| n == namespace)))
        .flat_map(|r| r.grants.iter().cloned())
        .collect()
}

/// A ServiceAccount of one test's own in deploy/'s namespace, bound to
/// deploy/'s roles by copies of deploy/'s bindings of its ServiceAccount:
/// the API server grants it what it grants deploy/'s, and the audit log
/// tells its requests from those the other tests make as deploy/'s (their
/// replicas, the fence's writes). Its bindings, its Lease and LeaderFence
/// (named as it) and itself are deleted when it is dropped.
struct OwnServiceAccount {
    name: String,
    /// As the API server and its audit log know it.
    user: String,
    /// Each binding made, as `kubectl delete` names it.
    bindings: Vec<Vec<String>>,
}

impl OwnServiceAccount {
    async fn new(prefix: &str) -> Self {
        // Unique in the control plane's life, which its audit log covers.
        let name = format!("{prefix}-{}", Timestamp::now().as_millisecond());
        kubectl_ok(&["create", "serviceaccount", &name, "-n", NS]);
        let user = format!("system:serviceaccount:{NS}:{name}");
        let mut account = OwnServiceAccount { name, user, bindings: Vec::new() };
        let admin = admin_client().await;
        let pp = PostParams::default();
        for binding in deploy_objects().into_iter().filter(binds_deploy_sa) {
            let name = format!("{}-{}", binding["metadata"]["name"].as_str().unwrap_or_default(), account.name);
            let copy = json!({ "metadata": { "name": name }, "roleRef": binding["roleRef"],
                "subjects": [{ "kind": "ServiceAccount", "name": account.name, "namespace": NS }] });
            let made = if binding["kind"] == "ClusterRoleBinding" {
                account.bindings.push(vec!["clusterrolebinding".into(), name]);
                let copy: ClusterRoleBinding = serde_json::from_value(copy).unwrap();
                Api::all(admin.clone()).create(&pp, &copy).await.map(drop)
            } else {
                let ns = binding["metadata"]["namespace"].as_str().unwrap_or("default").to_owned();
                account.bindings.push(vec!["rolebinding".into(), name, "-n".into(), ns.clone()]);
                let copy: RoleBinding = serde_json::from_value(copy).unwrap();
                Api::namespaced(admin.clone(), &ns).create(&pp, &copy).await.map(drop)
            };
            made.unwrap_or_else(|e| panic!("a copy of {binding} for {}: {e}", account.user));
        }
        assert!(!account.bindings.is_empty(), "deploy/ binds its ServiceAccount to no role");
        // The authorizer reads bindings through an informer: in effect
        // within milliseconds.
        wait_until(&format!("{} granted what deploy/'s ServiceAccount is", account.user), SOON, || async {
            (granted(&account.user, NS) == granted(SA_USER, NS)).then_some(())
        })
        .await;
        account
    }
}

impl Drop for OwnServiceAccount {
    fn drop(&mut self) {
        for binding in &self.bindings {
            let mut args = vec!["delete", "--ignore-not-found"];
            args.extend(binding.iter().map(String::as_str));
            kubectl(&args);
        }
        for kind in ["serviceaccount", "lease", "leaderfences.samplecontroller.k8s.io"] {
            kubectl(&["delete", kind, &self.name, "-n", NS, "--ignore-not-found"]);
        }
    }
}

/// A wait for what takes milliseconds (the API server's authorizer taking
/// new bindings, a new Lease taken, a watch started), with room for a
/// loaded machine.
const SOON: Duration = Duration::from_secs(10);

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

/// The test candidates' Lease duration, and how soon after the leader's
/// release its standby must lead: a third of it, so that a standby that
/// waited out the Lease's expiry instead fails.
const CANDIDATE_LEASE: Duration = Duration::from_secs(15);
const HANDOVER: Duration = Duration::from_secs(5);

#[tokio::test]
async fn the_service_account_can_run_the_whole_controller_and_uses_every_verb_it_is_granted() {
    installed();
    // deploy/'s ServiceAccount is what the other tests run as too, and the
    // audit log holds the control plane's whole life: every request this
    // one checks is made as a ServiceAccount of its own, with deploy/'s
    // bindings. deploy/'s leader fence matches deploy/'s ServiceAccount by
    // name only (11-leader-fence-policy.yaml), so it leaves this one's
    // replica without --leader-elect alone, its binding in place.
    let account = OwnServiceAccount::new("rbac-verbs").await;
    // Watching all namespaces with the default workers, as deployed. It
    // also meets every Foo the suites before it left in namespaces still
    // being deleted (hundreds, after the chaos suite), so its waits are long.
    let workers = sample_controller::testing::ops::DEFAULT_WORKERS;
    let controller = start_controller_with(service_account_config(NS, &account.name).await, None, workers);
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
    // status again.
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

    // An Event repeated into a series (a patch): the Recorder counts a
    // repeat only for the same Foo at the same resourceVersion, which a
    // status write changes. A Foo whose Deployment never gets a pod (its
    // namespace's quota allows none) keeps its status, so each sync that
    // creates its deleted Deployment again writes nothing else, and the
    // second one repeats the first one's Synced Event.
    let no_pods = TestNamespace::new("rbac-series").await;
    no_pods.kubectl_ok(&["create", "quota", "no-pods", "--hard=pods=0"]);
    let stuck: Api<Foo> = no_pods.api();
    create_foo(&stuck, "stuck", "stuck", Some(1)).await;
    let what = "the stuck Foo's status written";
    wait_for(&stuck, "stuck", what, AS_DEPLOYED_TIMEOUT, |f: Option<&Foo>| f.is_some_and(|f| f.status.is_some())).await;
    let mut uid = None;
    for round in ["created", "created again"] {
        let what = format!("the stuck Foo's Deployment {round}");
        let now = wait_until(&what, AS_DEPLOYED_TIMEOUT, || async {
            deployment(&no_pods, "stuck").await.and_then(|d| d.uid()).filter(|u| Some(u) != uid.as_ref())
        })
        .await;
        no_pods.api::<Deployment>().delete("stuck", &DeleteParams::default()).await.unwrap();
        uid = Some(now);
    }
    wait_until("the stuck Foo's Synced Event counted into a series", AS_DEPLOYED_TIMEOUT, || async {
        let events = no_pods.controller_events().await;
        events
            .into_iter()
            .find(|e| e.series.is_some() && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("stuck"))
    })
    .await;
    drop(controller);

    // The leader-election Lease in its namespace: the leader creates it
    // and renews it (an update); someone else's edit makes a renewal
    // conflict, and the leader reads the Lease once (a get) before renewing
    // from it; a standby lists and watches it while waiting; the leader's
    // release (an update) hands it over at once. Each new leader reads its
    // LeaderFence (a get) and claims it: the first creates it, the next
    // updates it, and a release names nobody (an update).
    let lease_name = account.name.clone();
    let candidate = |client: kube::Client, identity: &str| {
        let timing = (CANDIDATE_LEASE, Duration::from_secs(10), Duration::from_secs(2));
        let lease = leader_config(lease_name.clone(), &lease_name, NS.into(), identity.into(), timing);
        Elector::with_watches(client, lease, Paced).expect("client-go's timing")
    };
    let mut leader = candidate(service_account_client(NS, &account.name).await, "rbac-test-leader");
    // A Lease of its own, new: taken at once.
    tokio::time::timeout(SOON, leader.acquire()).await.expect("acquire the lease as the ServiceAccount");
    let leases: Api<Lease> = Api::namespaced(admin_client().await, NS);
    let label = json!({ "metadata": { "labels": { "edited-by": "an-admin" } } });
    leases.patch(&lease_name, &PatchParams::default(), &Patch::Merge(&label)).await.unwrap();
    let held = tokio::time::timeout(Duration::from_secs(5), leader.hold()).await;
    assert!(held.is_err(), "an edit of the Lease under its leader cost the leadership: {held:?}");
    let lease = leases.get(&lease_name).await.unwrap();
    assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some("rbac-test-leader"));
    assert_eq!(lease.metadata.labels.unwrap()["edited-by"], "an-admin", "the renewal kept the edit");
    // The standby under a User-Agent of its own: the audit log shows when
    // it watches the Lease, so the release comes while it waits.
    let standby_agent = format!("rbac-test-standby/{}", account.name);
    let mut cfg = service_account_config(NS, &account.name).await;
    cfg.headers.push((http::header::USER_AGENT, http::HeaderValue::from_str(&standby_agent).unwrap()));
    let mut standby = candidate(kube::Client::try_from(cfg).unwrap(), "rbac-test-standby");
    let waiting = tokio::spawn(async move {
        standby.acquire().await;
        standby
    });
    wait_until("the standby to watch the Lease", SOON, || async {
        let requests = audited(NS, &standby_agent);
        requests.iter().any(|r| r.resource == "leases" && r.verb == "watch").then_some(())
    })
    .await;
    // The leader renewed last before the standby first saw the Lease, so
    // the Lease expires a full duration after that: a standby that takes
    // over within HANDOVER of the release took it because of the release.
    let released = Instant::now();
    leader.release().await;
    let mut standby = tokio::time::timeout(HANDOVER, waiting)
        .await
        .unwrap_or_else(|_| {
            panic!("no hand-over within {HANDOVER:?} of the release (the Lease lasts {CANDIDATE_LEASE:?})")
        })
        .expect("the standby's task");
    println!("the standby led {:?} after the release", released.elapsed());
    standby.release().await;

    // A secure-metrics scrape, reviewed as the ServiceAccount: a
    // TokenReview of the scraper's token, a SubjectAccessReview of its user.
    let scraper = kubectl_ok(&["create", "token", &account.name, "-n", NS]);
    let auth = MetricsAuth::new(service_account_client(NS, &account.name).await);
    let access = auth.check(Some(&format!("Bearer {}", scraper.trim()))).await.expect("review the scraper");
    assert_eq!(access, Access::Forbidden, "deploy/'s ServiceAccount's grants do not include reading metrics");

    // Every verb granted was used, as the API server's audit log shows. Not
    // foos/finalizers: an admission check on the Deployment create, never a
    // request of its own (the creates above would have been refused).
    let granted = granted(&account.user, NS);
    assert!(!granted.is_empty(), "{} is granted nothing", account.user);
    let used: BTreeSet<String> = audited_as(&account.user)
        .into_iter()
        .map(|r| format!("{}{} {}", r.resource, r.subresource.map(|s| format!("/{s}")).unwrap_or_default(), r.verb))
        .collect();
    let unused: Vec<_> =
        granted.iter().filter(|grant| !grant.contains("/finalizers") && !used.contains(&as_audited(grant))).collect();
    assert!(unused.is_empty(), "granted to {} but never used: {unused:?}\nused: {used:?}", account.user);
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

/// What docs/design.md's RBAC section lists, read from the doc itself: an
/// edit of the doc alone, or of deploy/'s RBAC alone, fails this.
#[tokio::test]
async fn the_service_account_is_granted_exactly_what_the_design_doc_lists() {
    installed();
    let roles = documented_roles();
    assert_eq!(granted(SA_USER, "default"), documented_in(&roles, "default"), "in any namespace");
    assert_eq!(granted(SA_USER, NS), documented_in(&roles, NS), "in its own namespace");
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
/// refusal, if any. The Deployment writes are the operator's own, of the
/// Deployments of Foo `fenced`, which deploy/'s confinement of the
/// ServiceAccount (13-deployment-writes-policy.yaml) admits, so that only
/// the fence decides (of two policies refusing a write, the API server names
/// one, in no set order): the create a dry run of the operator's own
/// Deployment under another name (admission sees it as a create; nothing is
/// left for a replica leading in `ns` to find), the patch one that sets the
/// replicas the Foo asks for, as they are whether or not a replica leading
/// in `ns` has synced it.
async fn guarded_writes(client: &kube::Client, ns: &TestNamespace, tag: &str) -> Vec<Option<kube::Error>> {
    let mut deployment = fenced_deployment(ns).await;
    deployment.metadata.name = Some(format!("{tag}-created"));
    let status = json!({ "status": { "availableReplicas": 0 } });
    let event = fence_event(ns, tag);
    let labelled = json!({ "metadata": { "labels": { "written-by": tag } } });
    let same_replicas = json!({ "spec": { "replicas": FENCED_REPLICAS } });
    let (pp, patch) = (PostParams::default(), PatchParams::default());
    let dry_run_create = PostParams { dry_run: true, ..PostParams::default() };
    let dry_run = kube::api::DeleteParams { dry_run: true, ..Default::default() };
    let (deployments, events) =
        (Api::<Deployment>::namespaced(client.clone(), &ns.name), Api::<Event>::namespaced(client.clone(), &ns.name));
    vec![
        deployments.create(&dry_run_create, &deployment).await.err(),
        deployments.patch(FENCED, &patch, &Patch::Merge(&same_replicas)).await.err(),
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

/// The Deployment of Foo `fenced`, as the operator builds it
/// (src/api/deployment.rs).
async fn fenced_deployment(ns: &TestNamespace) -> Deployment {
    let foo: Foo = ns.api().get(FENCED).await.expect("Foo fenced");
    desired_deployment(&foo, UNSHARDED).expect("the Deployment of Foo fenced")
}

/// Foo `fenced`'s replicas.
const FENCED_REPLICAS: i32 = 1;

/// What the guarded writes patch and delete, made by an admin.
async fn fenced_targets(ns: &TestNamespace) {
    create_foo(&ns.api(), FENCED, FENCED, Some(FENCED_REPLICAS)).await;
    let deployment = fenced_deployment(ns).await;
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
/// (kube-lease-fence's `Elector`): the Lease, then its LeaderFence, both naming it.
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
    let mut ours = current.unwrap_or_else(|| LeaderFence::new(DEPLOY_LEASE, LeaderFenceSpec::default()));
    ours.spec.holders.insert(DEPLOY_LEASE.to_owned(), holder.clone());
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

/// Each of [`guarded_writes`]' outcomes in a word: admitted, fenced, or
/// the refusal's message.
fn verdicts(writes: &[Option<kube::Error>]) -> String {
    let verdict = |w: &Option<kube::Error>| match w {
        None => "admitted".to_owned(),
        Some(e) if is_fence_refusal(e) => "fenced".to_owned(),
        Some(e) => format!("refused: {e}"),
    };
    writes.iter().map(verdict).collect::<Vec<_>>().join("; ")
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
    wait_until("the new holder's writes admitted", FENCE_FOLLOWS, || async {
        all_admitted(&guarded_writes(&b, &ns, "new-holder").await).then_some(())
    })
    .await;
    assert_fenced(guarded_writes(&a, &ns, "deposed").await, "the deposed holder's pod");
    // A pod of a Deployment that holds no Lease of the operator, and a bare
    // pod, both run as the ServiceAccount: refused.
    let other = pod_of_another_deployment("sample-controller-other-shard").await;
    let other_client = pod_client(&other).await;
    assert_fenced(guarded_writes(&other_client, &ns, "no-lease").await, "a pod of a Deployment holding no Lease");
    let bare = bare_pod("evil").await;
    assert_fenced(guarded_writes(&pod_client(&bare).await, &ns, "bare").await, "a bare pod");
    // The same Deployment's pod once it leads another shard, named under
    // that shard's Lease in the one LeaderFence: admitted, b's still.
    name_leader_of("sample-controller-shard-other", &other).await;
    wait_until("another shard's leader admitted", FENCE_FOLLOWS, || async {
        all_admitted(&guarded_writes(&other_client, &ns, "other-shard").await).then_some(())
    })
    .await;
    assert!(all_admitted(&guarded_writes(&b, &ns, "holder-beside-shard").await), "the holder beside another shard");
    assert_fenced(guarded_writes(&a, &ns, "deposed-again").await, "the deposed holder's pod, beside another shard");
    kubectl_ok(&["delete", "deployment", "sample-controller-other-shard", "-n", NS, "--wait=false"]);
    kubectl_ok(&["delete", "pod", "evil", "-n", NS, "--wait=false"]);
}

/// A bare pod `name` run as deploy/'s ServiceAccount in its namespace, with
/// the name of no Deployment's pod, once the scheduler placed it.
async fn bare_pod(name: &str) -> Pod {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": NS },
        "spec": { "serviceAccountName": SA,
            "securityContext": { "runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": { "type": "RuntimeDefault" } },
            "containers": [{ "name": "c", "image": "busybox:1",
                "securityContext": { "allowPrivilegeEscalation": false, "capabilities": { "drop": ["ALL"] } } }] }
    }))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(admin_client().await, NS);
    pods.patch(name, &PatchParams::apply("e2e-rbac").force(), &Patch::Apply(&pod)).await.unwrap();
    wait_until("the bare pod scheduled", AS_DEPLOYED_TIMEOUT, || async {
        let pod = pods.get_opt(name).await.ok()??;
        pod.spec.as_ref()?.node_name.is_some().then_some(pod)
    })
    .await
}

/// Name `pod`'s replica the leader of the Lease `lease` in deploy/'s
/// LeaderFence, as another shard's leader names itself there.
async fn name_leader_of(lease: &str, pod: &Pod) {
    let fences: Api<LeaderFence> = Api::namespaced(admin_client().await, DEPLOY_NS);
    let holder = json!({ "spec": { "holders": { lease: format!("{}_1", pod.name_any()) } } });
    fences
        .patch(DEPLOY_LEASE, &PatchParams::default(), &Patch::Merge(&holder))
        .await
        .expect("name another shard's leader");
}

/// How soon the API server's fence follows a change of its LeaderFence or
/// its binding, where the LeaderFence CRD stays: its policy refresh (a
/// second) and its informer of the LeaderFence (milliseconds behind a
/// takeover: docs/design.md), with room for a loaded machine.
const FENCE_FOLLOWS: Duration = Duration::from_secs(10);

/// Wait until the API server admits every guarded write of `refused`, a
/// replica whose writes the fence refused: its policy refresh has run
/// without the binding, the refresh that stopped a built-in parameter
/// kind's informer for good (Kubernetes issue 130887).
async fn until_the_binding_is_gone(ns: &TestNamespace, refused: &kube::Client) {
    wait_until("the API server to admit the writes the deleted binding refused", FENCE_FOLLOWS, || async {
        all_admitted(&guarded_writes(refused, ns, "unbound").await).then_some(())
    })
    .await;
}

/// The ordinary operations that take the leader fence away and put it
/// back, each as a user runs it; deploy/ is applied again after each.
#[derive(Clone, Copy, Debug)]
enum Churn {
    /// The binding deleted until the API server admits what it refused
    /// (past its policy refresh), and applied again: the fence turned off
    /// and on.
    BindingAppliedAgain,
    /// `kubectl delete -f deploy/` and `kubectl apply -f deploy/`: an
    /// uninstall and a reinstall, or a GitOps prune and its re-creation.
    Reinstalled,
    /// docs/install.md's one replica without leader election, and back to
    /// two replicas by applying deploy/.
    OneReplicaAndBack,
}

impl Churn {
    /// The operation, then deploy/ applied again. `refused`: a replica
    /// whose writes the fence refuses now, which the API server admits
    /// once it no longer enforces the binding.
    async fn run(self, ns: &TestNamespace, refused: &kube::Client) {
        match self {
            Churn::BindingAppliedAgain => {
                kubectl_ok(&["delete", "-f", FENCE_BINDING]);
                until_the_binding_is_gone(ns, refused).await;
            }
            Churn::Reinstalled => {
                kubectl_ok(&["delete", "-f", "deploy/", "--wait=true", "--timeout=180s"]);
            }
            Churn::OneReplicaAndBack => {
                kubectl_ok(&["delete", "-f", FENCE_BINDING, "-f", "deploy/06-pod-disruption-budget.yaml"]);
                until_the_binding_is_gone(ns, refused).await;
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

    /// How soon after it the fence must follow a new leader.
    fn followed_within(self) -> Duration {
        match self {
            Churn::BindingAppliedAgain | Churn::OneReplicaAndBack => FENCE_FOLLOWS,
            // The LeaderFence CRD deleted and created again too, which the
            // API server's admission must discover again: not measured.
            Churn::Reinstalled => TIMEOUT,
        }
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
        // A leader the API server knows, before the operation, and a
        // standby it refuses.
        let pods = deploy_pods().await;
        let (leader, standby) = (pod_client(&pods[0]).await, pod_client(&pods[1]).await);
        take_lead(&leader, &pods[0]).await;
        wait_until(&format!("the leader's writes admitted before {churn:?}"), TIMEOUT, || async {
            all_admitted(&guarded_writes(&leader, &ns, "before").await).then_some(())
        })
        .await;
        assert_fenced(guarded_writes(&standby, &ns, "standby").await, &format!("the standby before {churn:?}"));

        churn.run(&ns, &standby).await;

        // The other replica takes over (new pods, after a reinstall).
        let pods = deploy_pods().await;
        let (deposed, new) = (pod_client(&pods[0]).await, pod_client(&pods[1]).await);
        take_lead(&deposed, &pods[0]).await;
        take_lead(&new, &pods[1]).await;
        // Both at once: until the API server has the binding and the
        // LeaderFence, the policy fails open and admits everyone.
        let what = format!("the new leader admitted and the deposed one refused after {churn:?}");
        wait_until(&what, churn.followed_within(), || async {
            let refused = guarded_writes(&deposed, &ns, "deposed").await;
            let fenced = refused.iter().all(|r| r.as_ref().is_some_and(is_fence_refusal));
            (fenced && all_admitted(&guarded_writes(&new, &ns, "after").await)).then_some(())
        })
        .await;
        assert!(all_admitted(&guarded_writes(&ns.client, &ns, "admin").await), "an admin's writes, after {churn:?}");
    }
}

/// How soon the leader claims its LeaderFence again once it is deleted or
/// names another replica: its next renewal, within a retry period (1 s
/// here, [`LEASE`]'s timings), after the watch delivers the change, plus
/// the claim's two requests.
const RECLAIMED_WITHIN: Duration = Duration::from_secs(2);

/// The leader watches its LeaderFence: deleted, or edited to name the
/// standby (whose writes the API server then admits), it is claimed again
/// within a retry period, the standby is refused again, and the leader's
/// gauge says the fence is in place.
#[tokio::test]
async fn a_deleted_or_edited_leaderfence_is_claimed_again_within_a_retry_period_and_fences_the_standby_again() {
    let pods = install_deploy().await;
    let start = Instant::now();
    let _lease = FreshLease::new();
    let ns = TestNamespace::new("fence-watch").await;
    fenced_targets(&ns).await;
    let replicas = [spawn_replica(&ns.name, &pods[0], LEASE).await, spawn_replica(&ns.name, &pods[1], LEASE).await];
    let leader = wait_until("one replica to lead", TIMEOUT, || async {
        let mut leading = Vec::new();
        for (i, op) in replicas.iter().enumerate() {
            leading.extend((metric(op, DEPLOY_LEADER_SERIES).await? == 1.0).then_some(i));
        }
        (leading.len() == 1).then(|| leading[0])
    })
    .await;
    let (standby_pod, leader_op) = (&pods[1 - leader], &replicas[leader]);
    let standby = pod_client(standby_pod).await;
    let fences: Api<LeaderFence> = Api::namespaced(admin_client().await, NS);
    let identity = wait_until("the leader's LeaderFence", TIMEOUT, || async {
        let fence = fences.get_opt(DEPLOY_LEASE).await.ok()??;
        fence.holder(DEPLOY_LEASE).filter(|h| h.starts_with(&pods[leader].name_any())).map(str::to_owned)
    })
    .await;
    // What the standby's writes got, printed when it changes: a timeout
    // below says which write was let through or refused by what.
    let seen = std::cell::RefCell::new(String::new());
    let fenced_out = || async {
        let writes = guarded_writes(&standby, &ns, "standby").await;
        let verdicts = verdicts(&writes);
        if *seen.borrow() != verdicts {
            println!("{:.1} s: the standby's writes: {verdicts}", start.elapsed().as_secs_f64());
            seen.replace(verdicts);
        }
        writes.iter().all(|r| r.as_ref().is_some_and(is_fence_refusal))
    };
    // The first time after the install, allowing for the API server to
    // load the policies and start its informer of LeaderFences (the CRD
    // may be new: other suites delete deploy/); what is timed is below.
    wait_until("the standby refused", TIMEOUT, || async { fenced_out().await.then_some(()) }).await;

    let to_standby = json!({ "spec": { "holders": { DEPLOY_LEASE: format!("{}_0", standby_pod.name_any()) } } });
    for edit in ["deleted", "naming the standby"] {
        let changed = Timestamp::now();
        if edit == "deleted" {
            fences.delete(DEPLOY_LEASE, &DeleteParams::default()).await.expect("delete the LeaderFence");
        } else {
            fences.patch(DEPLOY_LEASE, &PatchParams::default(), &Patch::Merge(&to_standby)).await.expect("edit");
        }
        wait_until(&format!("the LeaderFence, {edit}, claimed again"), TIMEOUT, || async {
            let fence = fences.get_opt(DEPLOY_LEASE).await.ok()??;
            (fence.holder(DEPLOY_LEASE) == Some(identity.as_str())).then_some(())
        })
        .await;
        // Timed by the API server, to the claim's write: not by this
        // test's polling on a loaded machine.
        let claimed = audited_as(DEPLOY_USER)
            .into_iter()
            .filter(|r| r.resource == "leaderfences" && WRITES.contains(&r.verb.as_str()) && r.at > changed)
            .filter(Audited::admitted)
            .map(|r| r.at)
            .min()
            .expect("the leader's claim in the audit log");
        let after = claimed.duration_since(changed);
        println!("LeaderFence {edit}: claimed again after {:.2} s", after.as_secs_f64());
        assert!(after.as_secs_f64() < RECLAIMED_WITHIN.as_secs_f64(), "{edit}: claimed again after {after:?}");
        wait_until(&format!("the standby refused again after the LeaderFence was {edit}"), FENCE_FOLLOWS, || async {
            fenced_out().await.then_some(())
        })
        .await;
    }
    let in_place = "sample_controller_leader_fence{state=\"in_place\"}";
    wait_until("the leader's gauge to say its fence is in place", TIMEOUT, || async {
        (metric(leader_op, in_place).await? == 1.0).then_some(())
    })
    .await;
}

/// How often the test's leader checks the confinement.
const CHECK_PERIOD: Duration = Duration::from_secs(2);

/// The leader checks, by two dry runs, that the API server confines its
/// ServiceAccount: the gauge says so; with the confinement's binding
/// deleted, within a check period (and the API server's policy refresh)
/// the gauge says open and an ERROR says why; applied again, enforced.
#[tokio::test]
async fn the_leader_reports_within_a_check_period_when_the_api_server_stops_confining_its_service_account() {
    let pods = install_deploy().await;
    let _lease = FreshLease::new();
    let ns = TestNamespace::new("confinement-probe").await;
    let period = format!("--confinement-check-period={}s", CHECK_PERIOD.as_secs());
    let leader = spawn_replica_with(&ns.name, &pods[0], LEASE, &[&period]).await;
    let state = |state: &str| format!("sample_controller_confinement{{state=\"{state}\"}}");
    let says = |wanted: &'static str| {
        let (leader, series) = (&leader, state(wanted));
        async move { (metric(leader, &series).await? == 1.0).then_some(()) }
    };
    wait_until("the leader's gauge to say enforced", TIMEOUT, || says("enforced")).await;
    {
        let _binding_back = ApplyOnDrop("deploy/14-deployment-writes-binding.yaml");
        kubectl_ok(&["delete", "-f", "deploy/14-deployment-writes-binding.yaml"]);
        let deleted = Instant::now();
        // A check period, the API server's policy refresh (a second), a
        // scrape, and room for a loaded machine.
        wait_until("the leader's gauge to say open", CHECK_PERIOD + FENCE_FOLLOWS, || says("open")).await;
        println!("the confinement's binding deleted: the gauge said open after {:?}", deleted.elapsed());
        let log = format!("{}/{}-{}.log", env!("CARGO_TARGET_TMPDIR"), ns.name, pods[0].name_any());
        let log = std::fs::read_to_string(&log).unwrap();
        let error = log.lines().find(|l| l.contains("ERROR") && l.contains("confinement NOT enforced"));
        assert!(error.is_some_and(|l| l.contains("runbook")), "no ERROR naming the runbook:\n{log}");
    }
    wait_until("the leader's gauge to say enforced again", CHECK_PERIOD + FENCE_FOLLOWS, || says("enforced")).await;
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
    assert_eq!(lines.lines().filter(|l| l.starts_with("ok ")).count(), 6, "{lines}");
    assert!(lines.contains("follows the Lease"), "{lines}");
    assert!(lines.contains("confinement: enforced"), "{lines}");

    {
        let _binding_back = ApplyOnDrop("deploy/14-deployment-writes-binding.yaml");
        kubectl_ok(&["delete", "-f", "deploy/14-deployment-writes-binding.yaml"]);
        // The API server's policy refresh: a second or so.
        let line = wait_until("check to find the confinement off", TIMEOUT, || async {
            let (passed, lines) = preflight();
            (!passed).then(|| failed_check(&lines, "confinement"))
        })
        .await;
        assert!(line.contains("NOT enforced"), "{line}");
    }

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
    fence.spec.holders.insert(DEPLOY_LEASE.to_owned(), other.clone());
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

/// `None` when `result` is the API server's 403 Forbidden; else what
/// `what` got instead.
fn unless_forbidden<T: std::fmt::Debug>(what: &str, result: kube::Result<T>) -> Option<String> {
    match result {
        Err(kube::Error::Api(s)) if s.code == 403 => None,
        other => Some(format!("{what}: {other:?}")),
    }
}

#[tokio::test]
async fn a_namespace_editor_can_create_change_and_delete_foos_and_a_viewer_can_only_read_them() {
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

    // The viewer reads: get, list, watch.
    let read = wait_until("a viewer to read it", TIMEOUT, || async { as_joe.get("by-jane").await.ok() }).await;
    assert_eq!(read.spec.deployment_name, "by-jane");
    let listed = as_joe.list(&ListParams::default()).await.expect("a viewer lists Foos");
    assert_eq!(listed.items.iter().map(ResourceExt::name_any).collect::<Vec<_>>(), ["by-jane"]);
    let watch = as_joe.watch(&WatchParams::default().timeout(10), "0").await.expect("a viewer watches Foos");
    let first = tokio::time::timeout(SOON, Box::pin(watch).try_next()).await.expect("the watch's first event");
    let first = first.expect("a watch event");
    assert!(matches!(&first, Some(WatchEvent::Added(f)) if f.name_any() == "by-jane"), "{first:?}");

    // ...and writes nothing: no create, update, patch, status patch or delete.
    let joes = Foo::new("by-joe", FooSpec { deployment_name: "by-joe".into(), replicas: Some(1) });
    let (pp, patch) = (PostParams::default(), PatchParams::default());
    let scale = json!({ "spec": { "replicas": 2 } });
    let status = json!({ "status": { "availableReplicas": 1 } });
    let admitted: Vec<String> = [
        unless_forbidden("create", as_joe.create(&pp, &joes).await),
        unless_forbidden("update", as_joe.replace("by-jane", &pp, &read).await),
        unless_forbidden("patch", as_joe.patch("by-jane", &patch, &Patch::Merge(&scale)).await),
        unless_forbidden("status patch", as_joe.patch_status("by-jane", &patch, &Patch::Merge(&status)).await),
        unless_forbidden("delete", as_joe.delete("by-jane", &DeleteParams::default()).await),
    ]
    .into_iter()
    .flatten()
    .collect();
    assert!(admitted.is_empty(), "a viewer's writes not refused: {admitted:#?}");

    // The editor changes it (patch, update) and deletes it.
    let scaled = as_jane.patch("by-jane", &patch, &Patch::Merge(&scale)).await.expect("an editor patches a Foo");
    assert_eq!(scaled.spec.replicas, Some(2));
    let mut renamed = scaled.clone();
    renamed.spec.deployment_name = "by-jane-renamed".into();
    let updated = as_jane.replace("by-jane", &pp, &renamed).await.expect("an editor updates a Foo");
    assert_eq!(updated.spec.deployment_name, "by-jane-renamed");
    as_jane.delete("by-jane", &DeleteParams::default()).await.expect("an editor deletes a Foo");
    assert!(ns.api::<Foo>().get_opt("by-jane").await.unwrap().is_none(), "the editor's delete left the Foo");
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
    let granted_in = granted(SA_USER, CONFINED_NS);
    // deploy/'s ClusterRole, as docs/design.md lists it.
    let documented = documented_roles();
    let cluster_role = documented.iter().filter(|r| r.role.starts_with("ClusterRole "));
    let want: BTreeSet<String> = cluster_role.flat_map(|r| r.grants.iter().cloned()).collect();
    assert_eq!(granted_in, want, "its namespace: deploy/'s grants");
    let metrics_auth: BTreeSet<String> = want.iter().filter(|g| g.contains("reviews")).cloned().collect();
    assert_eq!(
        granted(SA_USER, &elsewhere.name),
        metrics_auth,
        "another namespace: the reviews of secure metrics only"
    );
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
