#!/usr/bin/env bash
# The demo: Foo → Deployment, end to end. With a reachable cluster
# (KUBECONFIG or ~/.kube/config) it uses that; otherwise it brings up the
# local control plane (building it on first use). Then it installs crds/,
# runs the controller, applies artifacts/examples/example-foo.yaml and shows
# the Foo, its Deployment and its events. KEEP=1 leaves everything running.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"

local_plane=false
if kubectl version --request-timeout=5s >/dev/null 2>&1; then
  log "using the cluster of the current kubeconfig: $(kubectl config current-context 2>/dev/null || echo '?')"
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
./target/debug/sample-controller \
  --metrics-bind-address 127.0.0.1:0 --health-probe-bind-address 127.0.0.1:0 \
  > .local/demo-controller.log 2>&1 &
controller_pid=$!

log "applying artifacts/examples/example-foo.yaml"
kubectl apply -f artifacts/examples/example-foo.yaml
kubectl wait --for=create --timeout=60s deployment/example-foo >/dev/null 2>&1 \
  || kubectl wait --for=jsonpath='{.metadata.name}'=example-foo --timeout=60s deployment/example-foo >/dev/null

# On the local plane the pod is scheduled onto a kwok node and reported Ready.
kubectl wait --for=jsonpath='{.status.availableReplicas}'=1 --timeout=60s foo/example-foo >/dev/null || true

echo
echo "\$ kubectl get foo,deploy"
kubectl get foo,deploy
echo
echo "\$ kubectl scale foo/example-foo --replicas=3"
kubectl scale foo/example-foo --replicas=3
kubectl wait --for=jsonpath='{.status.availableReplicas}'=3 --timeout=60s foo/example-foo >/dev/null || true
echo
echo "\$ kubectl get foo,pods -o wide"
kubectl get foo,pods -o wide
echo
echo "\$ kubectl events --for foo/example-foo"
kubectl events --for foo/example-foo
echo
echo "\$ kubectl get foo example-foo -o jsonpath='{.status}'"
kubectl get foo example-foo -o jsonpath='{.status}'; echo
if [[ "${KEEP:-}" == 1 ]]; then
  echo
  echo "Left running (controller pid $controller_pid). Stop with: kill $controller_pid$($local_plane && echo "; LOCAL_UP_DIR=$LOCAL_UP_DIR hack/local-down.sh")"
  $local_plane && echo "export KUBECONFIG=$KUBECONFIG"
fi
