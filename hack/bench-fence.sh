#!/usr/bin/env bash
# What deploy/'s leader fence costs everyone else: another user's writes
# that its policy matches (benches/fence_cost.rs: N Deployment creates and N
# Event creates, one after the other, each timed), with the fence's binding
# applied and deleted in turns, ROUNDS rounds of each, each round in a new
# namespace; and the requests the API server made about LeaderFences during
# each round (its policy's look-ups, were they requests), from its audit log.
#
#   N=500 ROUNDS=3 hack/bench-fence.sh
#
# On the benchmark plane (hack/bench-lib.sh), with deploy/ applied and a
# LeaderFence naming one of its pods, so the policy runs in full for each
# write; the binding is applied and deleted between rounds, which the
# LeaderFence parameter allows (docs/design.md, "The leader fence").
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"
N="${N:-500}"
ROUNDS="${ROUNDS:-3}"
BINDING=deploy/12-leader-fence-binding.yaml

mkdir -p .local
rm -f "$AUDIT"
export LOCAL_UP_AUDIT_LOG="$AUDIT"
eval "$(hack/local-up.sh)"
install_crds 2>/dev/null
kubectl apply -f deploy/ >/dev/null
kubectl wait --for=condition=established crd/leaderfences.samplecontroller.k8s.io --timeout=60s >/dev/null
kubectl -n sample-controller rollout status deployment/sample-controller --timeout=180s >/dev/null
pod="$(kubectl -n sample-controller get pods -l app.kubernetes.io/name=sample-controller -o jsonpath='{.items[0].metadata.name}')"
kubectl apply -f - >/dev/null <<YAML
apiVersion: samplecontroller.k8s.io/v1alpha1
kind: LeaderFence
metadata: { name: sample-controller, namespace: sample-controller }
spec: { holderIdentity: "${pod}_1" }
YAML
log "release build of the client"
cargo bench --locked --quiet --bench fence_cost --no-run 2>/dev/null

# Requests about LeaderFences between two audit timestamps, by anyone.
lookups() { # from to
  python3 - "$AUDIT" "$1" "$2" <<'PY'
import json, sys
path, start, end = sys.argv[1], sys.argv[2], sys.argv[3]
n = 0
with open(path, encoding="utf-8") as f:
    for line in f:
        if "leaderfences" not in line:
            continue
        e = json.loads(line)
        if e.get("stage") == "ResponseComplete" and start <= e["requestReceivedTimestamp"] <= end:
            n += (e.get("objectRef") or {}).get("resource") == "leaderfences"
print(n)
PY
}

declare -A deploy event
printf '%-8s %5s %28s %28s %10s\n' fence round "Deployment create p50/p90/p99" "Event create p50/p90/p99" lookups
for round in $(seq 1 "$ROUNDS"); do
  for fence in bound unbound; do
    if [[ $fence == bound ]]; then kubectl apply -f "$BINDING" >/dev/null; else kubectl delete -f "$BINDING" --ignore-not-found >/dev/null; fi
    sleep 3 # the API server's policy refresh (a second)
    ns="fence-cost-$fence-$round"
    kubectl create namespace "$ns" >/dev/null
    from="$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ)"
    out="$(cargo bench --locked --quiet --bench fence_cost -- "$ns" "$N" 2>/dev/null)"
    to="$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ)"
    read -r _ _ d50 d90 d99 < <(grep '^deployment ' <<<"$out")
    read -r _ _ e50 e90 e99 < <(grep '^event ' <<<"$out")
    deploy[$fence]+="$d50 " event[$fence]+="$e50 "
    printf '%-8s %5s %28s %28s %10s\n' "$fence" "$round" "$d50 / $d90 / $d99 ms" "$e50 / $e90 / $e99 ms" "$(lookups "$from" "$to")"
    kubectl delete namespace "$ns" --wait=false >/dev/null
  done
done
# shellcheck disable=SC2086
printf 'median of the rounds p50, ms: Deployment create %s bound, %s unbound; Event create %s bound, %s unbound\n' \
  "$(median ${deploy[bound]})" "$(median ${deploy[unbound]})" "$(median ${event[bound]})" "$(median ${event[unbound]})"
kubectl apply -f "$BINDING" >/dev/null
hack/local-down.sh >/dev/null
