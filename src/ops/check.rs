//! `sample-controller check`: a preflight of the cluster the operator is
//! pointed at, as `flux check --pre` or `cmctl check api` give their users.
//! One line per check, `ok` or `FAIL` with what to do, and a non-zero exit
//! on any failure:
//! - the Kubernetes minor against the supported ones;
//! - the installed Foo CRD against this binary's;
//! - what the operator's ServiceAccount may do against what it needs
//!   (SubjectAccessReviews, which the operator's own ClusterRole allows);
//! - whether the API server serves streaming lists (`--streaming-lists`);
//! - whether the API server's leader fence follows the Lease: its policy
//!   reads a LeaderFence, its binding the operator's, and that names the
//!   Lease's holder;
//! - whether the API server confines the ServiceAccount: the probe the
//!   leader runs ([`confinement_probe`]), as the ServiceAccount
//!   (impersonated: the user running the check needs `impersonate`, as a
//!   cluster admin has).

use std::fmt;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use kube::{Client, CustomResourceExt, Resource};
use serde_json::Value;

use crate::api::constants::FENCE_POLICY;
use crate::api::foo::Foo;
use crate::api::leader_fence::LeaderFence;
use crate::api::shard::Shard;
use crate::client;
use crate::ops::confinement_probe;

/// The Kubernetes minors this release supports (docs/install.md, "Supported
/// Kubernetes versions").
pub(crate) const SUPPORTED_MINORS: std::ops::RangeInclusive<u32> = 35..=37;

/// Where the check looks: the operator's ServiceAccount, the namespace it
/// watches (`None`: all), its Lease and its LeaderFence (in the Lease's
/// namespace), and the shard whose Deployments the confinement must admit.
#[derive(Clone, Debug)]
pub(crate) struct Scope {
    pub(crate) service_account: (String, String),
    pub(crate) namespace: Option<String>,
    pub(crate) lease: (String, String),
    pub(crate) fence: String,
    pub(crate) shard: Shard,
}

/// What one check found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Finding {
    pub(crate) name: &'static str,
    pub(crate) ok: bool,
    pub(crate) detail: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:<4}  {}: {}", if self.ok { "ok" } else { "FAIL" }, self.name, self.detail)
    }
}

fn finding(name: &'static str, result: Result<String, String>) -> Finding {
    match result {
        Ok(detail) => Finding { name, ok: true, detail },
        Err(detail) => Finding { name, ok: false, detail },
    }
}

/// Every check, in order; each runs whatever the others found. `config`
/// is the client's, for the one check made as the ServiceAccount.
pub(crate) async fn run(client: &Client, config: &kube::Config, scope: &Scope) -> Vec<Finding> {
    vec![
        finding("Kubernetes version", version(client).await),
        finding("Foo CRD", crd(client).await),
        finding("RBAC", rbac(client, scope).await),
        finding("streaming lists", streaming_lists(client, scope).await),
        finding("leader fence", fence(client, scope).await),
        finding("confinement", confinement(client, config, scope).await),
    ]
}

async fn version(client: &Client) -> Result<String, String> {
    let info = client.apiserver_version().await.map_err(|e| format!("cannot read /version: {e}"))?;
    let minor: u32 =
        info.minor.trim_end_matches('+').parse().map_err(|_| format!("unreadable minor {:?}", info.minor))?;
    let (low, high) = (SUPPORTED_MINORS.start(), SUPPORTED_MINORS.end());
    if info.major == "1" && SUPPORTED_MINORS.contains(&minor) {
        Ok(format!("{} (supported: 1.{low} to 1.{high})", info.git_version))
    } else {
        Err(format!("{} is not supported (1.{low} to 1.{high})", info.git_version))
    }
}

async fn crd(client: &Client) -> Result<String, String> {
    let ours = Foo::crd();
    let name = ours.metadata.name.clone().unwrap_or_default();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let installed = crds.get_opt(&name).await.map_err(|e| format!("cannot read {name}: {e}"))?;
    let installed = installed.ok_or_else(|| format!("{name} is not installed: kubectl apply -f crds/"))?;
    let (want, have) = (json(&ours.spec), json(&installed.spec));
    match first_difference(&want, &have, "spec") {
        None => Ok(format!("{name} matches this binary's")),
        Some(path) => Err(format!("{name} differs from this binary's at {path}: kubectl apply -f crds/")),
    }
}

fn json(value: &impl serde::Serialize) -> Value {
    serde_json::to_value(value).unwrap_or_default()
}

/// The first path at which `want` is not in `have`: every field `want` sets
/// must be there with the same value (the API server adds defaults, which
/// are not differences); lists must match item by item.
pub(crate) fn first_difference(want: &Value, have: &Value, path: &str) -> Option<String> {
    match (want, have) {
        (Value::Object(w), Value::Object(h)) => w.iter().find_map(|(key, value)| {
            first_difference(value, h.get(key).unwrap_or(&Value::Null), &format!("{path}.{key}"))
        }),
        (Value::Array(w), Value::Array(h)) if w.len() == h.len() => {
            w.iter().zip(h).enumerate().find_map(|(i, (w, h))| first_difference(w, h, &format!("{path}[{i}]")))
        }
        (w, h) if w == h => None,
        _ => Some(path.to_owned()),
    }
}

/// What the operator does with the API, as deploy/'s RBAC grants it: (verb,
/// group, resource, subresource) in the namespaces it watches, then in the
/// Lease's namespace, then cluster-scoped.
const WATCHED: &[(&str, &str, &str, &str)] = &[
    ("list", "samplecontroller.k8s.io", "foos", ""),
    ("watch", "samplecontroller.k8s.io", "foos", ""),
    ("patch", "samplecontroller.k8s.io", "foos", "status"),
    ("update", "samplecontroller.k8s.io", "foos", "finalizers"),
    ("get", "apps", "deployments", ""),
    ("list", "apps", "deployments", ""),
    ("watch", "apps", "deployments", ""),
    ("create", "apps", "deployments", ""),
    ("patch", "apps", "deployments", ""),
    ("delete", "apps", "deployments", ""),
    ("create", "events.k8s.io", "events", ""),
    ("patch", "events.k8s.io", "events", ""),
];
const LEADER_ELECTION: &[(&str, &str, &str, &str)] = &[
    ("get", "coordination.k8s.io", "leases", ""),
    ("list", "coordination.k8s.io", "leases", ""),
    ("watch", "coordination.k8s.io", "leases", ""),
    ("create", "coordination.k8s.io", "leases", ""),
    ("update", "coordination.k8s.io", "leases", ""),
    ("get", "samplecontroller.k8s.io", "leaderfences", ""),
    ("list", "samplecontroller.k8s.io", "leaderfences", ""),
    ("watch", "samplecontroller.k8s.io", "leaderfences", ""),
    ("create", "samplecontroller.k8s.io", "leaderfences", ""),
    ("update", "samplecontroller.k8s.io", "leaderfences", ""),
];
const CLUSTER: &[(&str, &str, &str, &str)] = &[
    ("create", "authentication.k8s.io", "tokenreviews", ""),
    ("create", "authorization.k8s.io", "subjectaccessreviews", ""),
];

async fn rbac(client: &Client, scope: &Scope) -> Result<String, String> {
    let (sa_ns, sa) = &scope.service_account;
    let user = format!("system:serviceaccount:{sa_ns}:{sa}");
    let groups =
        vec!["system:serviceaccounts".into(), format!("system:serviceaccounts:{sa_ns}"), "system:authenticated".into()];
    let watched = scope.namespace.clone().unwrap_or_default();
    let needs = WATCHED
        .iter()
        .map(|n| (n, watched.as_str()))
        .chain(LEADER_ELECTION.iter().map(|n| (n, scope.lease.0.as_str())))
        .chain(CLUSTER.iter().map(|n| (n, "")));
    let reviews: Api<SubjectAccessReview> = Api::all(client.clone());
    let mut missing = Vec::new();
    let mut count = 0;
    for (&(verb, group, resource, subresource), namespace) in needs {
        count += 1;
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.clone()),
                groups: Some(groups.clone()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.into()),
                    group: Some(group.into()),
                    resource: Some(resource.into()),
                    subresource: (!subresource.is_empty()).then(|| subresource.into()),
                    namespace: (!namespace.is_empty()).then(|| namespace.into()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let answer = reviews
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| format!("cannot review {user}'s access: {e}"))?;
        if !answer.status.is_some_and(|s| s.allowed) {
            let sub = if subresource.is_empty() { String::new() } else { format!("/{subresource}") };
            let at = if namespace.is_empty() { "cluster-wide".to_owned() } else { format!("in {namespace}") };
            missing.push(format!("{verb} {resource}{sub}.{group} {at}"));
        }
    }
    if missing.is_empty() {
        Ok(format!("{user} may do all {count} things the operator does"))
    } else {
        Err(format!("{user} may not: {}; apply deploy/'s RBAC (02, 03, 04)", missing.join(", ")))
    }
}

async fn streaming_lists(client: &Client, scope: &Scope) -> Result<String, String> {
    // As the operator's watcher asks (resource version "0"), for one Foo
    // name that cannot exist: no initial events, then the bookmark that
    // ends them, or the refusal.
    let foos: Api<Foo> = match &scope.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let wp = WatchParams::streaming_lists().fields("metadata.name=sample-controller-check.invalid").timeout(10);
    let mut events = foos.watch(&wp, "0").await.map_err(|e| streaming_refused(&e))?.boxed();
    match tokio::time::timeout(Duration::from_secs(15), events.next()).await {
        Ok(Some(Ok(WatchEvent::Bookmark(b))))
            if b.metadata.annotations.get(INITIAL_EVENTS_END).is_some_and(|v| v == "true") =>
        {
            Ok("served: --streaming-lists works here".into())
        }
        Ok(Some(Ok(WatchEvent::Error(e)))) => Err(not_served(&e.message)),
        Ok(Some(Err(e))) => Err(streaming_refused(&e)),
        Ok(Some(Ok(_)) | None) => Err(not_served("the watch did not end its initial events with a bookmark")),
        Err(_) => Err("no answer within 15 s to a streaming list: cannot tell".into()),
    }
}

/// The annotation of the bookmark that ends a streaming list's initial
/// events.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// A watch that failed: not served when the API server says it does not
/// serve `sendInitialEvents`, else what failed.
fn streaming_refused(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 403 => format!("may not watch Foos ({}): cannot tell", s.message),
        kube::Error::Api(s) if s.code == 400 || s.code == 422 => not_served(&s.message),
        e => format!("cannot tell: {e}"),
    }
}

fn not_served(why: &str) -> String {
    format!(
        "not served ({why}): keep --streaming-lists off (deploy/ turns it on; docs/operations.md, \"Pods never become Ready with --streaming-lists\")"
    )
}

/// The fence's binding, found by what its policy reads, not by name (an
/// overlay may prefix or suffix them); `Err` with what to say when there is
/// none, and an error when the fence is broken.
async fn fence_binding(client: &Client) -> Result<Result<ValidatingAdmissionPolicyBinding, &'static str>, String> {
    let read = |e: kube::Error| format!("cannot read the fence: {e}");
    let policies =
        Api::<ValidatingAdmissionPolicy>::all(client.clone()).list(&Default::default()).await.map_err(read)?;
    let Some(policy) =
        policies.items.into_iter().find(|p| p.metadata.name.as_deref().is_some_and(|n| n.contains(FENCE_POLICY)))
    else {
        return Ok(Err("not installed (the operator's own fence stands alone)"));
    };
    let policy_name = policy.metadata.name.clone().unwrap_or_default();
    let kind = policy.spec.as_ref().and_then(|s| s.param_kind.as_ref());
    let (api_version, kind) = kind
        .map(|k| (k.api_version.clone().unwrap_or_default(), k.kind.clone().unwrap_or_default()))
        .unwrap_or_default();
    if api_version != LeaderFence::api_version(&()) || kind != LeaderFence::kind(&()) {
        return Err(format!(
            "its policy {policy_name} reads a {kind} ({api_version}), which the API server stops reading once a binding goes (Kubernetes issue 130887): kubectl apply -f deploy/"
        ));
    }
    let crd = LeaderFence::crd().metadata.name.unwrap_or_default();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    if crds.get_opt(&crd).await.map_err(read)?.is_none() {
        return Err(format!(
            "its parameter's CRD {crd} is missing, so the policy fails open: kubectl apply -f deploy/"
        ));
    }
    let bindings =
        Api::<ValidatingAdmissionPolicyBinding>::all(client.clone()).list(&Default::default()).await.map_err(read)?;
    let Some(binding) = bindings
        .items
        .into_iter()
        .find(|b| b.spec.as_ref().and_then(|s| s.policy_name.as_deref()) == Some(&policy_name))
    else {
        return Ok(Err("installed, but off: no binding (as in one-replica mode)"));
    };
    Ok(Ok(binding))
}

async fn fence(client: &Client, scope: &Scope) -> Result<String, String> {
    let binding = match fence_binding(client).await? {
        Err(state) => return Ok(state.into()),
        Ok(binding) => binding,
    };
    let (ns, lease_name) = &scope.lease;
    let param = binding.spec.as_ref().and_then(|s| s.param_ref.as_ref());
    let reads = param.map(|p| (p.namespace.clone().unwrap_or_default(), p.name.clone().unwrap_or_default()));
    if reads.as_ref() != Some(&(ns.clone(), scope.fence.clone())) {
        let (pns, pname) = reads.unwrap_or_default();
        return Err(format!(
            "its binding {} reads the LeaderFence {pns}/{pname}, but the operator writes {ns}/{}: every write is admitted or refused by the wrong one; set the binding's paramRef (docs/install.md)",
            binding.metadata.name.unwrap_or_default(),
            scope.fence
        ));
    }
    let read = |e: kube::Error| format!("cannot read the Lease {ns}/{lease_name}: {e}");
    let lease = Api::<Lease>::namespaced(client.clone(), ns).get_opt(lease_name).await.map_err(read)?;
    let holder = lease.and_then(|l| l.spec?.holder_identity).filter(|h| !h.is_empty());
    let fences: Api<LeaderFence> = Api::namespaced(client.clone(), ns);
    let fence_name = &scope.fence;
    let fence =
        fences.get_opt(fence_name).await.map_err(|e| format!("cannot read the LeaderFence {ns}/{fence_name}: {e}"))?;
    let named = fence.as_ref().and_then(|f| f.holder(lease_name)).map(str::to_owned);
    match (holder, named) {
        (None, _) => Ok(format!("on; no replica holds the Lease {ns}/{lease_name}")),
        (Some(h), Some(f)) if h == f => Ok(format!("on, and follows the Lease {ns}/{lease_name}: both name {h}")),
        (Some(h), f) => Err(format!(
            "the Lease {ns}/{lease_name} names {h}, but the LeaderFence {fence_name} names {} for it: the leader's writes are refused; its log says why (docs/operations.md, \"The leader fence refuses writes\")",
            f.as_deref().unwrap_or("nobody")
        )),
    }
}

/// The leader's probe, as the ServiceAccount, from the pod that holds the
/// Lease (so that the leader fence admits it; with no holder, the fence
/// may refuse the create the confinement must admit).
async fn confinement(client: &Client, config: &kube::Config, scope: &Scope) -> Result<String, String> {
    let (sa_ns, sa) = &scope.service_account;
    let (lease_ns, lease_name) = &scope.lease;
    let lease = Api::<Lease>::namespaced(client.clone(), lease_ns).get_opt(lease_name).await.ok().flatten();
    let holder = lease.and_then(|l| l.spec?.holder_identity).filter(|h| !h.is_empty());
    let pod = holder.as_deref().and_then(|h| h.split_once('_')).map(|(pod, _)| pod.to_owned());
    let mut config = config.clone();
    config.auth_info.impersonate = Some(format!("system:serviceaccount:{sa_ns}:{sa}"));
    config.auth_info.impersonate_groups = Some(vec![
        "system:serviceaccounts".into(),
        format!("system:serviceaccounts:{sa_ns}"),
        "system:authenticated".into(),
    ]);
    config.auth_info.impersonate_user_extra =
        pod.map(|pod| [("authentication.kubernetes.io/pod-name".to_owned(), vec![pod])].into());
    let impersonating = client::build(config, Default::default()).map_err(|e| format!("cannot tell: {e}"))?;
    let namespace = scope.namespace.clone().unwrap_or_else(|| sa_ns.clone());
    let api = Api::namespaced(impersonating, &namespace);
    match confinement_probe::probe(&api, &namespace, &scope.shard).await {
        confinement_probe::State::Enforced => Ok(format!("enforced for {sa_ns}:{sa} in {namespace}")),
        state => Err(state.describe()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_crd_matches_when_the_api_server_only_added_defaults() {
        let want = json!({ "group": "g", "versions": [{ "name": "v1", "served": true }] });
        let have = json!({ "group": "g", "conversion": { "strategy": "None" },
            "versions": [{ "name": "v1", "served": true, "storage": true }] });
        assert_eq!(first_difference(&want, &have, "spec"), None);
    }

    #[test]
    fn a_crd_differs_at_the_first_field_it_changes_or_lacks() {
        let want = json!({ "versions": [{ "name": "v1", "schema": { "max": 10 } }] });
        let changed = json!({ "versions": [{ "name": "v1", "schema": { "max": 5 } }] });
        assert_eq!(first_difference(&want, &changed, "spec").as_deref(), Some("spec.versions[0].schema.max"));
        let lacking = json!({ "versions": [{ "name": "v1" }] });
        assert_eq!(first_difference(&want, &lacking, "spec").as_deref(), Some("spec.versions[0].schema"));
        let more = json!({ "versions": [{ "name": "v1", "schema": { "max": 10 } }, { "name": "v2" }] });
        assert_eq!(first_difference(&want, &more, "spec").as_deref(), Some("spec.versions"));
    }

    #[test]
    fn a_check_prints_one_line_saying_ok_or_fail() {
        let ok = finding("RBAC", Ok("fine".into()));
        let failed = finding("Foo CRD", Err("not installed".into()));
        assert_eq!(ok.to_string(), "ok    RBAC: fine");
        assert_eq!(failed.to_string(), "FAIL  Foo CRD: not installed");
        assert!(ok.ok && !failed.ok);
    }
}
