# What hack/bench.sh and hack/bench-ha.sh share: the benchmark plane (with
# an audit log), the release build, and the helpers that read the audit log.
# Sourced, not run.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
UA="sample-controller/"
KCM_UA="kube-controller-manager/"
AUDIT="$REPO_ROOT/.local/bench-audit.log"
BIN="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release/sample-controller"
export LOCAL_UP_DIR="$REPO_ROOT/.local/bench-control-plane"

# Start the plane with an empty audit log, the CRD installed, and the
# release build made. Scale mode (argument 1) runs no Deployment/ReplicaSet
# controllers: a run measures this controller, not the controller-manager's
# own rate limits creating ReplicaSets and Pods.
bench_plane() { # scale
  if (( $1 )); then
    export LOCAL_UP_CONTROLLERS='*,-deployment-controller,-replicaset-controller'
    # etcd's largest recommended quota (its default is 2 GiB), as a large
    # cluster runs: 100 000 Foos, their Deployments and Events, and the
    # history of the runs before, outgrow the default.
    export LOCAL_UP_ETCD_QUOTA=$((8 << 30))
  fi
  mkdir -p .local
  rm -f "$AUDIT"
  export LOCAL_UP_AUDIT_LOG="$AUDIT"
  eval "$(hack/local-up.sh)"
  install_crds 2>/dev/null
  log "release build"
  cargo build --locked --release --quiet --bin sample-controller
}

audit() { local cmd=$1; shift; python3 hack/audit.py "$cmd" "$AUDIT" "$@"; }

create_foos() { # namespace count [shards: label Foo i shard=s<i mod shards>]
  kubectl create namespace "$1" >/dev/null
  python3 - "$1" "$2" "${3:-0}" <<'PY' | kubectl create -f - >/dev/null
import json, sys
ns, n, shards = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def labels(i):
    return {"labels": {"shard": f"s{i % shards}"}} if shards else {}
items = [{"apiVersion": "samplecontroller.k8s.io/v1alpha1", "kind": "Foo",
          "metadata": {"name": f"foo-{i}", "namespace": ns, **labels(i)},
          "spec": {"deploymentName": f"foo-{i}", "replicas": 1}} for i in range(n)]
print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
PY
}

settle() { # until the controller-manager has stopped writing
  audit quiet "$KCM_UA" 5 1800 >/dev/null
}

# Each run starts on an equal plane: without the Deployments of the runs
# before, and their ReplicaSets and Pods, for the scheduler, kwok and the
# controller-manager to carry.
clear_run() { # namespace
  kubectl delete namespace "$1" --timeout=1800s >/dev/null
  settle
}

# A run's time in seconds, kept by what ran: all its runs, the last, the best.
declare -A best runs last
record() { # what seconds
  runs[$1]+="${runs[$1]:+, }${2}s"
  last[$1]=$2
  best[$1]=$(least "$2" ${best[$1]:+"${best[$1]}"})
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Arithmetic on fractional numbers (bash has integers only), by awk:
# calc FORMAT EXPRESSION, e.g. calc %.2f "3 / 2".
sync_quantile() { # metrics-url q: the bucket bound the q-quantile of the syncs' times falls under, "<= X s (of N syncs)"
  curl -fs "$1" | python3 -c '
import re, sys
q, buckets = float(sys.argv[1]), []
for line in sys.stdin:
    m = re.match(r"controller_runtime_reconcile_time_seconds_bucket\{.*le=\"([^\"]+)\".*\} (\S+)", line)
    if m:
        buckets.append((float(m[1]), float(m[2])))
total = buckets[-1][1]
bound = next(le for le, n in buckets if n >= q * total)
print(f"<= {bound:g} s (of {total:.0f} syncs)")' "$2"
}
calc() { awk "BEGIN { printf \"$1\n\", $2 }"; }
elapsed() { calc %.2f "$2 - $1"; } # from to: seconds between, to 10 ms
least() { printf '%s\n' "$@" | sort -g | head -n 1; }   # numbers...
greatest() { printf '%s\n' "$@" | sort -g | tail -n 1; } # numbers...
median() { # numbers...: the middle one, or the mean of the middle two
  printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { printf "%.2f\n", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

rss() { # pid: resident memory in MiB
  awk '$1 == "VmRSS:" {printf "%.1f", $2 / 1024}' "/proc/$1/status"
}
hwm() { # pid: the most resident memory it has had, in MiB
  awk '$1 == "VmHWM:" {printf "%.1f", $2 / 1024}' "/proc/$1/status"
}
