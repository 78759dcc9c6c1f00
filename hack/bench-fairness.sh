#!/usr/bin/env bash
# Benchmark: what a start of N new Foos holds at its peak against what it
# holds at rest, and what one namespace's burst costs another's changes —
# this build beside BASELINE's (a git revision), in the same run, in turns.
# Prints numbers; asserts nothing; not part of the tests.
#
#   MODE=fairness hack/bench.sh                       # N=10000, BASELINE=HEAD~1
#   N=100000 BURST=10000 BASELINE=a518230 MODE=fairness hack/bench.sh
#   PARTS=fairness MODE=fairness hack/bench.sh        # the burst only
#
# On one local control plane in scale mode (no Deployment controllers), for
# each build, in turns (who goes first alternating from round to round, RUNS
# rounds):
#  1. memory: N Foos created, then the operator started on their namespace
#     (release build): once they converged and it has written nothing for
#     10 s, and 30 s more (jemalloc returns freed pages over about ten), its
#     resident memory at rest and its peak (VmHWM), and their ratio;
#  2. fairness: an operator of every namespace, a synced Foo `steady` in a
#     quiet namespace; BURST Foos created in another, 64 at a time, and
#     every EVERY_MS a Foo created in the quiet namespace and `steady`
#     edited, each timed until its Deployment shows it
#     (benches/burst_fairness.rs), until the burst has converged.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"
N="${N:-10000}"
BURST="${BURST:-10000}"
EVERY_MS="${EVERY_MS:-500}"
RUNS="${RUNS:-1}"
# Which of the two parts below to run: a part's latencies are only as good
# as the machine is quiet, so each can be run on its own.
PARTS="${PARTS:-memory fairness}"
BASELINE="${BASELINE:-HEAD~1}"
baseline_rev=$(git rev-parse --short "$BASELINE")
build=$(git log -1 --format=%h -- src Cargo.toml Cargo.lock)
git diff --quiet HEAD -- src Cargo.toml Cargo.lock || build+=-modified

trap 'kill "${pid:-}" 2>/dev/null || true; hack/local-down.sh' EXIT
bench_plane 1
cargo bench --locked --quiet --no-run --bench burst_fairness
# The baseline, built from its own checkout into a target directory of its own.
baseline_dir="$REPO_ROOT/.local/bench-baseline"
if [[ "$(cat "$baseline_dir/rev" 2>/dev/null)" != "$baseline_rev" ]]; then
  rm -rf "$baseline_dir/src"
  git worktree prune
  git worktree add --detach "$baseline_dir/src" "$baseline_rev" >/dev/null
  echo "$baseline_rev" >"$baseline_dir/rev"
fi
log "release build of $baseline_rev (the baseline)"
(cd "$baseline_dir/src" && CARGO_TARGET_DIR="$baseline_dir/target" cargo build --locked --release --quiet --bin sample-controller)
declare -A bin=([this]="$BIN" [baseline]="$baseline_dir/target/release/sample-controller")

start() { # who log [flags...]: the operator, in the background ($pid)
  local who=$1 log=$2
  shift 2
  "${bin[$who]}" "$@" --metrics-bind-address 0 --health-probe-bind-address 0 >"$log" 2>&1 &
  pid=$!
}
stop() { kill -TERM "$pid"; wait "$pid" 2>/dev/null || true; pid=; }

declare -A rest peak ratio fair
memory_run() { # who run
  local ns="mem-$1-$2" t0 t1
  log "$1: memory, $N new Foos"
  create_foos "$ns" "$N"
  settle
  start "$1" ".local/bench-fairness-$ns.log" --namespace "$ns"
  read -r t0 t1 < <(audit wait-converged "$UA" "$ns" "$N" 3600)
  audit quiet "$UA" 10 1800 >/dev/null
  sleep 30
  rest[$1]+="${rest[$1]:+, }$(rss "$pid")"
  peak[$1]+="${peak[$1]:+, }$(hwm "$pid")"
  ratio[$1]+="${ratio[$1]:+, }$(calc %.2f "$(hwm "$pid") / $(rss "$pid")")"
  log "$1: converged in $(elapsed "$t0" "$t1") s; at rest $(rss "$pid") MiB, peak $(hwm "$pid") MiB"
  stop
  clear_run "$ns"
}
fairness_run() { # who run
  local busy="busy-$1-$2" quiet="quiet-$1-$2"
  log "$1: a burst of $BURST Foos in one namespace, another's changes timed"
  kubectl create namespace "$busy" >/dev/null
  kubectl create namespace "$quiet" >/dev/null
  kubectl -n "$quiet" apply -f - >/dev/null <<EOF
apiVersion: samplecontroller.k8s.io/v1alpha1
kind: Foo
metadata: { name: steady }
spec: { deploymentName: steady, replicas: 1 }
EOF
  start "$1" ".local/bench-fairness-$busy.log"
  until kubectl -n "$quiet" get deployment steady >/dev/null 2>&1; do sleep 0.5; done
  fair[$1]+="${fair[$1]:+$'\n'    }$(cargo bench --locked --quiet --bench burst_fairness -- "$busy" "$BURST" "$quiet" "$EVERY_MS")"
  log "$1: ${fair[$1]##*$'\n'    }"
  stop
  kubectl delete namespace "$quiet" --wait=false >/dev/null
  clear_run "$busy"
}

for run in $(seq 1 "$RUNS"); do
  order=(this baseline)
  (( run % 2 )) || order=(baseline this)
  for part in $PARTS; do
    for who in "${order[@]}"; do "${part}_run" "$who" "$run"; done
  done
done

summary() {
  echo "== fairness and memory, this build ($build) beside $baseline_rev, $(date -u +%F), $RUNS round(s)"
  for who in this baseline; do
    local name=$build
    [[ $who == baseline ]] && name=$baseline_rev
    echo "$name:"
    if [[ $PARTS == *memory* ]]; then
      echo "  $N new Foos: at rest ${rest[$who]} MiB, peak ${peak[$who]} MiB: peak / rest ${ratio[$who]}"
    fi
    if [[ $PARTS == *fairness* ]]; then
      echo "  a burst of $BURST in another namespace: ${fair[$who]}"
    fi
  done
}
summary | tee ".local/bench-fairness-${PARTS// /-}-$N-$build.txt"
