#!/usr/bin/env bash
# The overload benchmark (MODE=overload hack/bench.sh): this operator and the
# client-go reference (hack/tools/reference: upstream's informers on Foos and
# Deployments), each in turn behind the tests' fault-injecting proxy
# (benches/overload.rs), on one plane with N Foos. For each fault the proxy
# cuts the client's watches, then answers every request with it for FAULT
# seconds, then lets everything through. Prints, per client and fault, the
# requests made during the fault (full lists among them: a LIST, or a watch
# that sends every object first, as client-go's informers do), the most in any one
# second, and how long after the fault both watches went through again.
# Asserts nothing; not part of the tests.
#
#   MODE=overload hack/bench.sh
#   MODE=overload N=20 FAULT=60 FAULTS="429 500 503" hack/bench.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"
N="${N:-20}"
FAULT="${FAULT:-60}"
FAULTS="${FAULTS:-429 500 503}"
NS=overload
REFERENCE="$CACHE_ROOT/reference/client-go-reference"

trap 'hack/local-down.sh' EXIT
bench_plane 0
log "client-go reference build"
mkdir -p "$(dirname "$REFERENCE")"
(cd hack/tools/reference && go_build -o "$REFERENCE" .)
cargo bench --locked --quiet --no-run --bench overload
driver() { cargo bench --locked --quiet --bench overload -- "$@"; }
create_foos "$NS" "$N"
settle

ours=("$BIN" --kubeconfig '{kubeconfig}' --namespace "$NS"
  --metrics-bind-address 127.0.0.1:0 --metrics-secure=false --health-probe-bind-address 127.0.0.1:0)
theirs=("$REFERENCE" --kubeconfig '{kubeconfig}' --namespace "$NS")
rows=()
for fault in $FAULTS; do
  log "fault $fault for ${FAULT}s: sample-controller"
  rows+=("$(driver --kubeconfig "$KUBECONFIG" --fault "$fault" --seconds "$FAULT" --label sample-controller -- "${ours[@]}")")
  log "fault $fault for ${FAULT}s: client-go"
  rows+=("$(driver --kubeconfig "$KUBECONFIG" --fault "$fault" --seconds "$FAULT" --label client-go -- "${theirs[@]}")")
done

echo
echo "sample-controller benchmark, overload mode: N=$N Foos; every request refused for ${FAULT}s after the watches are cut"
echo
printf '%-18s %-6s %9s %6s %11s %18s\n' client fault requests LISTs "most in 1s" "watching again (s)"
for row in "${rows[@]}"; do
  read -r client fault requests lists most rewatch <<<"$row"
  printf '%-18s %-6s %9s %6s %11s %18s\n' "$client" "$fault" "${requests#*=}" "${lists#*=}" "${most#*=}" "${rewatch#*=}"
done
