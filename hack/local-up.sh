#!/usr/bin/env bash
# Start a local Kubernetes control plane on loopback: etcd, kube-apiserver
# (RBAC, admission, status/scale subresources), kube-controller-manager
# (garbage collector, Deployment/ReplicaSet controllers), kube-scheduler, and
# kwok simulating LOCAL_UP_NODES nodes (default 3): pods are scheduled onto
# them and become Running and Ready through the stages in hack/kwok/, as a
# kubelet would report them, without running any container.
#
#   eval "$(hack/local-up.sh)"   # last line printed: export KUBECONFIG=...
#   kubectl get ns
#   hack/local-down.sh
#
# LOCAL_UP_DIR chooses where state, logs and the kubeconfig go (default
# .local/control-plane in the repo), so several planes can run side by side.
# LOCAL_UP_AUDIT_LOG=PATH makes the API server write an audit log (Metadata
# level, one JSON line per request: verb, resource, user, User-Agent), for
# counting each client's requests. LOCAL_UP_CONTROLLERS sets
# kube-controller-manager's --controllers (default '*'), and
# LOCAL_UP_ETCD_QUOTA etcd's --quota-backend-bytes (default etcd's, 2 GiB).
# The binaries come from hack/build-control-plane.sh (or KUBEBUILDER_ASSETS).
# All output but the final export line goes to stderr.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DIR="$PLANE_DIR"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
KUBECONFIG_OUT="$DIR/kubeconfig"

alive() { [[ -f "$DIR/$1.pid" ]] && kill -0 "$(cat "$DIR/$1.pid")" 2>/dev/null; }

all_alive() {
  local name
  for name in "${PLANE_BINARIES[@]}"; do alive "$name" || return 1; done
}
if all_alive && [[ -f "$KUBECONFIG_OUT" ]]; then
  log "control plane already running in $DIR"
  echo "export KUBECONFIG=$KUBECONFIG_OUT"
  exit 0
fi
# Half-started or stale: clear it first.
"$REPO_ROOT/hack/local-down.sh" >/dev/null 2>&1 || true
mkdir -p "$DIR"/{pki,logs,etcd}

need_command openssl openssl "the control plane's certificates"
ASSETS="$("$REPO_ROOT/hack/build-control-plane.sh")"

# Free loopback ports, chosen by the kernel.
read -r ETCD_PORT ETCD_PEER_PORT APISERVER_PORT < <(python3 - <<'PY'
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])
PY
)

# --- certificates: a CA, the API server's serving cert, an admin client cert
# (group system:masters) and the service-account signing key.
PKI="$DIR/pki"
ssl() { openssl "$@" >/dev/null 2>&1 || die "openssl $1 failed"; }
ssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=sample-controller-local-ca" \
  -keyout "$PKI/ca.key" -out "$PKI/ca.crt" -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign"
sign() { # name subject extensions
  ssl req -newkey rsa:2048 -nodes -subj "$2" -keyout "$PKI/$1.key" -out "$PKI/$1.csr"
  printf '%s\n' "$3" > "$PKI/$1.ext"
  ssl x509 -req -in "$PKI/$1.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days 3650 -out "$PKI/$1.crt" -extfile "$PKI/$1.ext"
}
sign apiserver "/CN=kube-apiserver" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default.svc"
sign admin "/O=system:masters/CN=admin" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
ssl genrsa -out "$PKI/sa.key" 2048
ssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub"

# Ports and paths hack/local-chaos.sh needs to check a restarted component.
cat > "$DIR/env" <<ENV
ETCD_PORT=$ETCD_PORT
APISERVER_PORT=$APISERVER_PORT
PKI=$DIR/pki
ENV

b64() { base64 -w0 < "$1"; }
write_kubeconfig() { # path
  cat > "$1" <<KC
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority-data: $(b64 "$PKI/ca.crt")
users:
- name: admin
  user:
    client-certificate-data: $(b64 "$PKI/admin.crt")
    client-key-data: $(b64 "$PKI/admin.key")
contexts:
- name: local
  context: {cluster: local, user: admin, namespace: default}
current-context: local
KC
}

start() { # name args...
  local name=$1; shift
  # The command line, for hack/local-chaos.sh to start it again.
  printf '%q ' "$ASSETS/$name" "$@" > "$DIR/$name.cmd"
  # setsid: the process outlives this script and its terminal.
  setsid "$ASSETS/$name" "$@" >"$DIR/logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$DIR/$name.pid"
}
plane_wait() { # what seconds command...: or stop the plane, showing its logs
  wait_for "$@" && return 0
  tail -n 30 "$DIR/logs/"*.log >&2 || true
  "$REPO_ROOT/hack/local-down.sh" >/dev/null 2>&1 || true
  die "$1 did not become ready"
}

log "starting etcd on 127.0.0.1:$ETCD_PORT"
start etcd --name local --data-dir "$DIR/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster "local=http://127.0.0.1:$ETCD_PEER_PORT" \
  --unsafe-no-fsync --listen-metrics-urls "" --log-level warn ${LOCAL_UP_ETCD_QUOTA:+--quota-backend-bytes "$LOCAL_UP_ETCD_QUOTA"}
plane_wait etcd 60 component_serving etcd

audit_flags=()
if [[ -n "${LOCAL_UP_AUDIT_LOG:-}" ]]; then
  cat > "$DIR/audit-policy.yaml" <<'POLICY'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
POLICY
  audit_flags=(--audit-policy-file "$DIR/audit-policy.yaml" --audit-log-path "$LOCAL_UP_AUDIT_LOG" --audit-log-format json
    --audit-log-maxsize 1000000)  # MB: never rotated (the default rotates at 100 MB)
fi

log "starting kube-apiserver on https://127.0.0.1:$APISERVER_PORT"
# OwnerReferencesPermissionEnforcement is off by default but on in some
# distributions; enabling it proves the RBAC in deploy/ covers it.
start kube-apiserver \
  --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$APISERVER_PORT" \
  --cert-dir "$DIR/pki" --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
  --client-ca-file "$PKI/ca.crt" \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
  --service-cluster-ip-range 10.0.0.0/24 \
  --authorization-mode RBAC \
  --enable-admission-plugins OwnerReferencesPermissionEnforcement \
  --endpoint-reconciler-type none \
  "${audit_flags[@]}" \
  --v 1
plane_wait kube-apiserver 120 component_serving kube-apiserver
write_kubeconfig "$DIR/admin.kubeconfig"

# Its client's default rate limit (20 requests/s) would make a few hundred
# Deployments' ReplicaSets and Pods take minutes on this plane (one control
# plane, three kwok nodes, two cores).
log "starting kube-controller-manager"
start kube-controller-manager \
  --kubeconfig "$DIR/admin.kubeconfig" \
  --authentication-kubeconfig "$DIR/admin.kubeconfig" --authorization-kubeconfig "$DIR/admin.kubeconfig" \
  --secure-port 0 --leader-elect=false \
  --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
  --controllers "${LOCAL_UP_CONTROLLERS:-*}" \
  --kube-api-qps 200 --kube-api-burst 400 \
  --v 1
# The ServiceAccount controller creating "default" proves the controller
# manager is running its loops; pods cannot be created before it.
plane_wait kube-controller-manager 120 kubectl --kubeconfig "$DIR/admin.kubeconfig" get serviceaccount default -n default

log "starting kube-scheduler"
cat > "$DIR/scheduler.yaml" <<CONFIG
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: $DIR/admin.kubeconfig
  qps: 200
  burst: 400
leaderElection:
  leaderElect: false
CONFIG
start kube-scheduler --config "$DIR/scheduler.yaml" --secure-port 0 \
  --authentication-kubeconfig "$DIR/admin.kubeconfig" --authorization-kubeconfig "$DIR/admin.kubeconfig" \
  --v 1

NODES="${LOCAL_UP_NODES:-3}"
# The nodes' architecture is the image's (hack/build-image.sh builds for
# this machine's), so the image runs on them as on a real node.
ARCH="$(image_arch)"
log "starting kwok with $NODES simulated nodes"
# Node leases are the heartbeat the controller-manager checks (kwok's default
# only applies without a --config). A pod CIDR large enough for the
# benchmark's scale mode.
start kwok --kubeconfig "$DIR/admin.kubeconfig" --config "$REPO_ROOT/hack/kwok/stages.yaml" \
  --manage-all-nodes=true --node-lease-duration-seconds 40 --cidr 10.128.0.0/12 --node-ip 10.64.0.1 \
  --server-address ""
for i in $(seq 0 $((NODES - 1))); do
  cat <<NODE
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-$i
  annotations:
    kwok.x-k8s.io/node: fake
  labels:
    kubernetes.io/hostname: kwok-node-$i
    kubernetes.io/os: linux
    kubernetes.io/arch: $ARCH
    type: kwok
---
NODE
done | kubectl --kubeconfig "$DIR/admin.kubeconfig" apply -f - >/dev/null
plane_wait "kwok's nodes" 60 kubectl --kubeconfig "$DIR/admin.kubeconfig" wait --for=condition=Ready node --all --timeout=1s

cp "$DIR/admin.kubeconfig" "$KUBECONFIG_OUT"
log "control plane ready (state and logs in $DIR)"
echo "export KUBECONFIG=$KUBECONFIG_OUT"
