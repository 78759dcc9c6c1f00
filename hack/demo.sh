#!/usr/bin/env bash
# The demo: Foo → Deployment, end to end. With a reachable cluster
# (KUBECONFIG or ~/.kube/config) it uses that; otherwise it brings up the
# local control plane (building it on first use). Then it installs crds/,
# runs the controller over a namespace of its own (DEMO_NAMESPACE, default
# sample-controller-demo), applies artifacts/examples/example-foo.yaml there
# and shows the Foo, its Deployment and its events. KEEP=1 leaves everything
# running.
#
# On a cluster of yours it touches nothing outside that namespace (the
# controller watches, adopts and writes in it only), and it refuses to start
# while an operator holds a sample-controller Lease: two controllers would
# race over the demo's Foo.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
NS="${DEMO_NAMESPACE:-sample-controller-demo}"

# The Leases of running operators: named --leader-election-id
# (sample-controller, deploy/'s), or with --shard-selector that name and a
# suffix; held while renewed within their duration. Prints "ns/name holder".
held_leases() {
  kubectl get leases --all-namespaces -o json | python3 -c '
import datetime, json, sys
now = datetime.datetime.now(datetime.timezone.utc)
for lease in json.load(sys.stdin)["items"]:
    meta, spec = lease["metadata"], lease.get("spec", {})
    if not (meta["name"] == "sample-controller" or meta["name"].startswith("sample-controller-shard-")):
        continue
    renewed, holder = spec.get("renewTime"), spec.get("holderIdentity")
    if not (renewed and holder):
        continue
    renewed = datetime.datetime.fromisoformat(renewed.replace("Z", "+00:00"))
    if (now - renewed).total_seconds() < spec.get("leaseDurationSeconds", 15):
        namespace, name = meta["namespace"], meta["name"]
        print(f"{namespace}/{name} held by {holder}")
'
}

local_plane=false
if kubectl version --request-timeout=5s >/dev/null 2>&1; then
  log "using the cluster of the current kubeconfig: $(kubectl config current-context 2>/dev/null || echo '?')"
  leases="$(held_leases)" || die "cannot list Leases to tell whether an operator already runs on this cluster"
  [[ -z "$leases" ]] || die "an operator is running on this cluster (Lease ${leases}); the demo's controller would race it over the demo's Foo. Try the demo on the local plane (KUBECONFIG=/dev/null hack/demo.sh), or stop that operator first"
else
  log "no cluster configured: starting the local control plane"
  export LOCAL_UP_DIR="$REPO_ROOT/.local/demo-control-plane"
  eval "$(hack/local-up.sh)"
  local_plane=true
fi

cleanup() {
  [[ -n "${controller_pid:-}" ]] && kill -TERM "$controller_pid" 2>/dev/null && wait "$controller_pid" 2>/dev/null
  if $local_plane; then hack/local-down.sh; fi
}
[[ "${KEEP:-}" == 1 ]] || trap cleanup EXIT

log "building the controller"
cargo build --locked --quiet --bin sample-controller
log "installing the Foo CRD"
install_crds

mkdir -p .local
log "starting the controller (log: .local/demo-controller.log)"
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
./target/debug/sample-controller --namespace "$NS" --health-probe-bind-address 127.0.0.1:0 \
  > .local/demo-controller.log 2>&1 &
controller_pid=$!

log "applying artifacts/examples/example-foo.yaml in namespace $NS"
k() { kubectl -n "$NS" "$@"; }
k apply -f artifacts/examples/example-foo.yaml
k wait --for=create --timeout=60s deployment/example-foo >/dev/null 2>&1 \
  || k wait --for=jsonpath='{.metadata.name}'=example-foo --timeout=60s deployment/example-foo >/dev/null

# On the local plane the pod is scheduled onto a kwok node and reported Ready.
k wait --for=jsonpath='{.status.availableReplicas}'=1 --timeout=60s foo/example-foo >/dev/null || true

echo
echo "\$ kubectl -n $NS get foo,deploy"
k get foo,deploy
echo
echo "\$ kubectl -n $NS scale foo/example-foo --replicas=3"
k scale foo/example-foo --replicas=3
k wait --for=jsonpath='{.status.availableReplicas}'=3 --timeout=60s foo/example-foo >/dev/null || true
echo
echo "\$ kubectl -n $NS get foo,pods -o wide"
k get foo,pods -o wide
echo
echo "\$ kubectl -n $NS events --for foo/example-foo"
k events --for foo/example-foo
echo
echo "\$ kubectl -n $NS get foo example-foo -o jsonpath='{.status}'"
k get foo example-foo -o jsonpath='{.status}'; echo
if [[ "${KEEP:-}" == 1 ]]; then
  echo
  echo "Left running (controller pid $controller_pid). Stop with: kill $controller_pid$($local_plane && echo "; LOCAL_UP_DIR=$LOCAL_UP_DIR hack/local-down.sh")"
  $local_plane && echo "export KUBECONFIG=$KUBECONFIG"
fi
