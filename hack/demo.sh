#!/usr/bin/env bash
# The demo: Foo → Deployment, end to end. With a cluster configured
# (KUBECONFIG or ~/.kube/config has a current context) it uses that, and
# stops if it does not answer; with none it brings up the local control
# plane (building it on first use). KUBECONFIG=/dev/null forces the latter. Then it installs crds/,
# runs the controller over a namespace of its own (DEMO_NAMESPACE, default
# sample-controller-demo), applies artifacts/examples/example-foo.yaml there
# and shows the Foo, its Deployment and its events. KEEP=1 leaves everything
# running. DEMO_CONTROLLER names a controller binary to run instead of
# building one (the tests run their own: a build here would replace the
# binary the other suites run, which has their test hooks).
#
# On a cluster of yours it touches nothing outside that namespace (the
# controller watches, adopts and writes in it only), and it refuses to start
# while an operator holds a sample-controller Lease: two controllers would
# race over the demo's Foo.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
NS="${DEMO_NAMESPACE:-sample-controller-demo}"
# How long each wait for the Foo may take before the demo fails.
TIMEOUT="${DEMO_TIMEOUT:-60}"

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

# Step timing: `step WHAT` ends the step before it, printing its time.
demo_start=$SECONDS step_name="" step_start=$SECONDS
step() {
  [[ -z "$step_name" ]] || log "  ($step_name: $((SECONDS - step_start))s)"
  step_name=$1 step_start=$SECONDS
  [[ -z "$1" ]] || log "$1"
}

local_plane=false
if context="$(kubectl config current-context 2>/dev/null)"; then
  # A cluster is configured: use it, or say it did not answer. Starting a
  # local plane instead would hide that.
  kubectl version --request-timeout=5s >/dev/null 2>&1 ||
    die "the cluster of kubeconfig context \"$context\" did not answer within 5 s. Fix the kubeconfig or the cluster, or run the demo on a local control plane: KUBECONFIG=/dev/null hack/demo.sh"
  step "using the cluster of kubeconfig context \"$context\""
  leases="$(held_leases)" || die "cannot list Leases to tell whether an operator already runs on this cluster"
  [[ -z "$leases" ]] || die "an operator is running on this cluster (Lease ${leases}); the demo's controller would race it over the demo's Foo. Try the demo on the local plane (KUBECONFIG=/dev/null hack/demo.sh), or stop that operator first"
else
  step "no cluster configured: starting the local control plane (compiled from Go modules on first use)"
  export LOCAL_UP_DIR="$REPO_ROOT/.local/demo-control-plane"
  eval "$(hack/local-up.sh)"
  local_plane=true
fi

cleanup() {
  [[ -n "${controller_pid:-}" ]] && kill -TERM "$controller_pid" 2>/dev/null && wait "$controller_pid" 2>/dev/null
  if $local_plane; then hack/local-down.sh; fi
}
[[ "${KEEP:-}" == 1 ]] || trap cleanup EXIT

if [[ -n "${DEMO_CONTROLLER:-}" ]]; then
  controller=$DEMO_CONTROLLER
else
  step "building the controller"
  cargo build --locked --quiet --bin sample-controller
  controller="${CARGO_TARGET_DIR:-target}/debug/sample-controller"
fi
step "installing the Foo CRD"
install_crds

mkdir -p .local
controller_log=.local/demo-controller.log
step "starting the controller (log: $controller_log)"
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
"$controller" --namespace "$NS" --health-probe-bind-address 127.0.0.1:0 \
  > "$controller_log" 2>&1 &
controller_pid=$!

k() { kubectl -n "$NS" "$@"; }
# The demo's verdict: the Foo reached WHAT within TIMEOUT, or the demo fails
# showing the Foo and what the controller logged.
converged() { # what kubectl-wait-args...
  local what=$1; shift
  k wait --timeout="${TIMEOUT}s" "$@" >/dev/null 2>&1 && return 0
  k get foo,deploy >&2 || true
  log "the controller's log (last 30 lines of $controller_log):"
  tail -n 30 "$controller_log" >&2
  kill -0 "$controller_pid" 2>/dev/null || log "the controller is not running"
  die "the Foo did not converge: $what within ${TIMEOUT}s"
}

step "applying artifacts/examples/example-foo.yaml in namespace $NS"
k apply -f artifacts/examples/example-foo.yaml
converged "its Deployment example-foo created" --for=create deployment/example-foo
# On the local plane the pod is scheduled onto a kwok node and reported Ready.
converged "status.availableReplicas 1" --for=jsonpath='{.status.availableReplicas}'=1 foo/example-foo

echo
echo "\$ kubectl -n $NS get foo,deploy"
k get foo,deploy
echo
echo "\$ kubectl -n $NS scale foo/example-foo --replicas=3"
step "scaling the Foo to 3"
k scale foo/example-foo --replicas=3
converged "status.availableReplicas 3" --for=jsonpath='{.status.availableReplicas}'=3 foo/example-foo
step ""
echo
echo "\$ kubectl -n $NS get foo,pods -o wide"
k get foo,pods -o wide
echo
echo "\$ kubectl -n $NS events --for foo/example-foo"
k events --for foo/example-foo
echo
echo "\$ kubectl -n $NS get foo example-foo -o jsonpath='{.status}'"
k get foo example-foo -o jsonpath='{.status}'; echo
echo
log "converged; the demo took $((SECONDS - demo_start))s"
if [[ "${KEEP:-}" == 1 ]]; then
  echo
  echo "Left running (controller pid $controller_pid). Stop with: kill $controller_pid$($local_plane && echo "; LOCAL_UP_DIR=$LOCAL_UP_DIR hack/local-down.sh")"
  $local_plane && echo "export KUBECONFIG=$KUBECONFIG"
fi
