//! deploy/ installed as a cluster runs it: the operator's pods (kwok runs
//! them; they are real API objects) and, for each, a ServiceAccount token
//! bound to it as the kubelet mounts one, so that the API server sees the
//! pod in every request of a replica run with it — which deploy/'s leader
//! fence (11-leader-fence-policy.yaml) checks against the Lease's holder.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use sample_controller::testing::api::POD_NAME_ENV;
use serde_json::json;

use super::{Operator, TIMEOUT, admin_client, kubeconfig_variant, kubectl, kubectl_ok, operator_command, start_logged};
use super::{lease_args, wait_until};

/// deploy/'s namespace, ServiceAccount and the Lease its `--leader-elect`
/// contends for (named after `--leader-election-id`, as the LeaderFence the
/// fence reads, which names its holder under the Lease's name).
pub const DEPLOY_NS: &str = "sample-controller";
pub const DEPLOY_SA: &str = "sample-controller";
pub const DEPLOY_LEASE: &str = "sample-controller";
/// The ServiceAccount's user name, as the API server and its audit log
/// know it.
pub const DEPLOY_USER: &str = "system:serviceaccount:sample-controller:sample-controller";
/// The leader fence's binding: what a user without --leader-elect deletes
/// (docs/install.md), and applies again to go back to two replicas.
pub const FENCE_BINDING: &str = "deploy/12-leader-fence-binding.yaml";
/// Whether a replica leads on deploy/'s Lease, as its metrics say.
pub const DEPLOY_LEADER_SERIES: &str = "leader_election_master_status{name=\"sample-controller\"}";
const POD_SELECTOR: &str = "app.kubernetes.io/name=sample-controller";

/// `kubectl apply -f deploy/`, as the README installs it; then the
/// operator's two pods, once any rollout (another test's image, say) is
/// done.
pub async fn install_deploy() -> Vec<Pod> {
    kubectl_ok(&["apply", "-f", "deploy/"]);
    kubectl_ok(&["wait", "--for=condition=established", "crd/leaderfences.samplecontroller.k8s.io", "--timeout=60s"]);
    kubectl_ok(&["rollout", "status", "deployment/sample-controller", "-n", DEPLOY_NS, "--timeout=180s"]);
    deploy_pods().await
}

/// deploy/'s two pods, not being deleted, once there are two.
pub async fn deploy_pods() -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(admin_client().await, DEPLOY_NS);
    wait_until("deploy/'s two pods", TIMEOUT, || async {
        let list = pods.list(&ListParams::default().labels(POD_SELECTOR)).await.ok()?;
        let live: Vec<Pod> = list.items.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
        (live.len() == 2).then_some(live)
    })
    .await
}

/// A token of deploy/'s ServiceAccount bound to `pod` (a TokenRequest with
/// the pod as its bound object, for an hour), as the kubelet mounts one.
pub async fn pod_bound_token(pod: &Pod) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(admin_client().await, DEPLOY_NS);
    let request: TokenRequest = serde_json::from_value(json!({
        "spec": {
            "audiences": [],
            "expirationSeconds": 3600,
            "boundObjectRef": { "apiVersion": "v1", "kind": "Pod", "name": pod.name_any(), "uid": pod.uid() }
        }
    }))
    .unwrap();
    let answer = accounts
        .create_token_request(DEPLOY_SA, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("a token bound to pod {}: {e}", pod.name_any()));
    answer.status.expect("a TokenRequest answers with a token").token
}

/// A kubeconfig for the control plane that authenticates with `token`
/// alone (no client certificate); its path.
pub fn token_kubeconfig(name: &str, token: &str) -> String {
    kubeconfig_variant(name, |kc| kc["users"][0]["user"] = json!({ "token": token }))
}

/// A client authenticating with `token` alone.
pub async fn token_client(name: &str, token: &str) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(token_kubeconfig(name, token)).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
    kube::Client::try_from(cfg).unwrap()
}

/// A client as the replica in `pod` is: its bound token.
pub async fn pod_client(pod: &Pod) -> kube::Client {
    token_client(&format!("client-{}", pod.name_any()), &pod_bound_token(pod).await).await
}

/// A replica as deploy/ runs it in `pod` — its bound token, POD_NAME from
/// the downward API, `--leader-elect` on deploy/'s Lease — but with the
/// tests' short Lease timings, and watching only `ns`, so that Foos other
/// tests left elsewhere do not slow it.
pub async fn spawn_replica(ns: &str, pod: &Pod, lease_duration: Duration) -> Operator {
    spawn_replica_with(ns, pod, lease_duration, &[]).await
}

/// [`spawn_replica`], with flags of its own besides.
pub async fn spawn_replica_with(ns: &str, pod: &Pod, lease_duration: Duration, extra: &[&str]) -> Operator {
    let name = pod.name_any();
    let kubeconfig = token_kubeconfig(&format!("replica-{name}"), &pod_bound_token(pod).await);
    let args = lease_args(DEPLOY_NS, DEPLOY_LEASE, lease_duration);
    let args: Vec<&str> = args.iter().map(String::as_str).chain(extra.iter().copied()).collect();
    let mut cmd = operator_command(ns, &kubeconfig, &args);
    cmd.env(POD_NAME_ENV, &name);
    start_logged(cmd, &format!("{ns}-{name}")).await
}

/// deploy/'s Lease and its LeaderFence, absent while this lives and once it
/// is dropped: a test's replicas start without an earlier holder's to wait
/// out, and leave none to the next.
pub struct FreshLease;

impl FreshLease {
    pub fn new() -> Self {
        delete_deploy_lease();
        FreshLease
    }
}

impl Drop for FreshLease {
    fn drop(&mut self) {
        delete_deploy_lease();
    }
}

fn delete_deploy_lease() {
    kubectl(&["delete", "lease", DEPLOY_LEASE, "-n", DEPLOY_NS, "--ignore-not-found"]);
    kubectl(&["delete", "leaderfences.samplecontroller.k8s.io", DEPLOY_LEASE, "-n", DEPLOY_NS, "--ignore-not-found"]);
}

/// deploy/'s LeaderFence's spec naming `holder` as the leader of deploy/'s
/// Lease, as its leader writes it.
pub fn naming_leader(holder: &str) -> sample_controller::LeaderFenceSpec {
    sample_controller::LeaderFenceSpec { holders: [(DEPLOY_LEASE.to_owned(), holder.to_owned())].into() }
}

/// `kubectl apply -f` of a file of deploy/ when dropped: what a test
/// deleted, put back for the tests after it, whichever way it ends.
pub struct ApplyOnDrop(pub &'static str);

impl Drop for ApplyOnDrop {
    fn drop(&mut self) {
        kubectl(&["apply", "-f", self.0]);
    }
}

/// deploy/'s Lease as it is now.
pub async fn deploy_lease() -> Option<Lease> {
    Api::<Lease>::namespaced(admin_client().await, DEPLOY_NS).get_opt(DEPLOY_LEASE).await.ok()?
}

/// The pod whose replica holds deploy/'s Lease, if any: its holder
/// identity is the pod name, `_`, a per-process suffix.
pub async fn holding_pod() -> Option<String> {
    let holder = deploy_lease().await?.spec?.holder_identity?;
    Some(holder.split_once('_')?.0.to_owned())
}
