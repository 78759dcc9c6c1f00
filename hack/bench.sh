#!/usr/bin/env bash
# Benchmark: the controller's memory as Deployments it does not own pile up,
# and its API writes in steady state. Prints numbers; asserts nothing.
#
#   hack/bench.sh                 # 50 Foos; 0, 1000 and 3000 foreign Deployments
#   FOOS=100 FOREIGN="0 5000" hack/bench.sh
#
# Runs on the local control plane (hack/local-up.sh), with a release build.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
FOOS="${FOOS:-50}"
FOREIGN="${FOREIGN:-0 1000 3000}"
WINDOW="${WINDOW:-60}"

export LOCAL_UP_DIR="$REPO_ROOT/.local/bench-control-plane"
trap 'kill "${pid:-}" 2>/dev/null || true; hack/local-down.sh' EXIT
eval "$(hack/local-up.sh)"
kubectl apply -f crds/ >/dev/null
kubectl wait --for condition=established --timeout=60s crd/foos.samplecontroller.k8s.io >/dev/null
log "release build"
cargo build --locked --release --quiet --bin sample-controller
BIN="$REPO_ROOT/target/release/sample-controller"

kubectl create namespace bench-foos >/dev/null
kubectl create namespace bench-foreign >/dev/null
python3 - "$FOOS" <<'PY' | kubectl create -f - >/dev/null
import json, sys
n = int(sys.argv[1])
items = [{"apiVersion": "samplecontroller.k8s.io/v1alpha1", "kind": "Foo",
          "metadata": {"name": f"foo-{i}", "namespace": "bench-foos"},
          "spec": {"deploymentName": f"foo-{i}", "replicas": 1}} for i in range(n)]
print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
PY

have=0
add_foreign() { # up to $1 Deployments of someone else's (replicas 0: no pods)
  local want=$1
  (( want > have )) || return 0
  python3 - "$have" "$want" <<'PY' | kubectl create -f - >/dev/null
import json, sys
lo, hi = int(sys.argv[1]), int(sys.argv[2])
labels = {"app": "other-team"}
items = [{"apiVersion": "apps/v1", "kind": "Deployment",
          "metadata": {"name": f"other-{i}", "namespace": "bench-foreign", "labels": labels,
                       "annotations": {"note": "x" * 512}},
          "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                   "template": {"metadata": {"labels": labels},
                                "spec": {"containers": [{"name": "c", "image": "busybox:1"}]}}}}
         for i in range(lo, hi)]
print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
PY
  have=$want
}

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
start_controller() {
  "$BIN" --metrics-bind-address "127.0.0.1:$port" --health-probe-bind-address 0 > "$LOCAL_UP_DIR/logs/bench-controller.log" 2>&1 &
  pid=$!
  # Synced: every Foo reconciled at least once.
  for _ in $(seq 1 600); do
    local synced
    synced=$(curl -fsS "127.0.0.1:$port/metrics" 2>/dev/null | awk '/^controller_runtime_reconcile_total\{controller="foo",result="success"\}/ {print $2}')
    (( ${synced:-0} >= FOOS )) && return 0
    sleep 0.2
  done
  die "the controller did not sync $FOOS Foos"
}
stop_controller() { kill -TERM "$pid"; wait "$pid" 2>/dev/null || true; pid=; }
kib() { awk -v k="$1" '$1 == k":" {print $2}' "/proc/$pid/status"; }
snapshot() { # what the controller may write in the Foos' namespace, one line per object version
  kubectl get foos,deployments,events.events.k8s.io -n bench-foos -o json | python3 -c '
import json, sys
for o in json.load(sys.stdin)["items"]:
    m, kind = o["metadata"], o["kind"]
    if kind == "Foo":  # only the controller writes Foos (status)
        version = m["resourceVersion"]
    elif kind == "Deployment":  # the Deployment controller keeps writing status: compare our fields only
        ours = [f.get("time") for f in m.get("managedFields", []) if f.get("manager") == "sample-controller"]
        version = "%s/%s" % (m.get("generation"), ours)
    elif o.get("reportingController") == "sample-controller":
        version = m["resourceVersion"]
    else:
        continue
    print(m["uid"], version.replace(" ", ""), kind + "/" + m["name"])
' | sort
}

printf '\n%-22s %-20s %-20s %s\n' "foreign Deployments" "RSS after sync MiB" "peak RSS MiB" "Foos"
for n in $FOREIGN; do
  add_foreign "$n"
  start_controller
  sleep 3
  awk -v n="$n" -v rss="$(kib VmRSS)" -v hwm="$(kib VmHWM)" -v foos="$FOOS" \
    'BEGIN {printf "%-22s %-20.1f %-20.1f %s\n", n, rss / 1024, hwm / 1024, foos}'
  stop_controller
done

# Objects the controller created or changed across a restart (a full
# resync of every Foo, all already in sync) and the window after it.
snapshot > "$LOCAL_UP_DIR/before"
start_controller
sleep "$WINDOW"
snapshot > "$LOCAL_UP_DIR/after"
stop_controller
written=$(comm -13 "$LOCAL_UP_DIR/before" "$LOCAL_UP_DIR/after" | wc -l)
comm -13 "$LOCAL_UP_DIR/before" "$LOCAL_UP_DIR/after" | cut -d' ' -f3 | sed 's/^/  written: /'
echo
echo "Objects written (Foos, Deployments, Events) by a restart that resyncs $FOOS in-sync Foos, and ${WINDOW}s after: $written"
echo "(upstream sample-controller writes each Foo's status and a Synced event on every 30 s resync:"
echo " $((FOOS * 2 * WINDOW / 30)) writes in the same window)"
