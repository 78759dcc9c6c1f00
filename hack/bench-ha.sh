#!/usr/bin/env bash
# Benchmark, high-availability mode: two replicas with --leader-elect, as
# deploy/ runs them, every request counted from the API server's audit log.
# Prints numbers; asserts nothing; not part of the tests.
#
#   MODE=ha hack/bench.sh                 # N=10000 Foos, IDLE=300 s
#   N=1000 IDLE=60 FENCES=on hack/bench-ha.sh
#
# In scale mode (no Deployment/ReplicaSet controllers), on one plane, with
# deploy/ applied (its ServiceAccount, RBAC and leader fence) and two bare
# pods of its ServiceAccount: each replica runs with a token bound to its
# pod and POD_NAME, as in a cluster, so the fence sees which pod writes.
# For each of FENCES (default "on off": deploy/'s leader fence, then without
# its binding, deploy/12-leader-fence-binding.yaml), in a namespace of its own:
#  1. N Foos, then replicas a and b started; time until every Foo converged;
#  2. kill -9 of the leader, 10 Foos edited at once during the outage: the
#     seconds from the standby taking the Lease (its acquireTime) to the last
#     edit reaching its Deployment (its patch, in the audit log);
#  3. the killed replica back as a standby (ready: caches filled), then
#     SIGTERM of the leader (a graceful hand-over) and 10 more edits: the
#     seconds from the SIGTERM to the last edit reaching its Deployment.
# In the last run, between 1 and 2: both idle for IDLE seconds (requests per
# minute by verb and resource), and the memory of the leader and standby.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"
N="${N:-10000}"
IDLE="${IDLE:-300}"
FENCES="${FENCES:-on off}"
DEPLOY_NS=sample-controller
LEASE=sample-controller
FENCE=deploy/12-leader-fence-binding.yaml
declare -A pids probes kubeconfigs converged took_lease after_kill after_term rss_new_standby

trap 'kill "${pids[@]}" 2>/dev/null || true; hack/local-down.sh' EXIT
bench_plane 1

# deploy/'s ServiceAccount, RBAC and fence, and a pod of that account for
# each replica (never started: no Deployment controller; a token needs only
# the pod object).
kubectl apply -f deploy/ >/dev/null
for r in a b; do
  kubectl apply -f - >/dev/null <<POD
apiVersion: v1
kind: Pod
metadata: { name: replica-$r, namespace: $DEPLOY_NS }
spec:
  serviceAccountName: sample-controller
  securityContext: { runAsNonRoot: true, runAsUser: 65532, seccompProfile: { type: RuntimeDefault } }
  containers:
    - name: controller
      image: sample-controller:0.1.0
      securityContext: { allowPrivilegeEscalation: false, capabilities: { drop: ["ALL"] } }
POD
  # A kubeconfig whose user is a token bound to the pod, as the kubelet
  # mounts one.
  kubeconfigs[$r]=".local/bench-ha-$r.kubeconfig"
  kubectl config view --raw > "${kubeconfigs[$r]}"
  token=$(kubectl create token sample-controller -n "$DEPLOY_NS" --duration=2h \
    --bound-object-kind=Pod --bound-object-name="replica-$r")
  KUBECONFIG=${kubeconfigs[$r]} kubectl config set-credentials "replica-$r" --token="$token" >/dev/null
  KUBECONFIG=${kubeconfigs[$r]} kubectl config set-context --current --user="replica-$r" >/dev/null
done

port_logged() { [[ -n "$(bound_port "$1" /healthz,/readyz)" ]]; } # log

start_replica() { # name: as deploy/ runs it, in pod replica-NAME
  local log=".local/bench-ha-$1.log"
  POD_NAME="replica-$1" "$BIN" --kubeconfig "${kubeconfigs[$1]}" --namespace "$ns" --leader-elect \
    --leader-election-namespace "$DEPLOY_NS" \
    --metrics-bind-address 127.0.0.1:0 --metrics-secure=false --health-probe-bind-address 127.0.0.1:0 > "$log" 2>&1 &
  pids[$1]=$!
  wait_for "replica $1's probe port" 60 port_logged "$log" || die "replica $1 did not start"
  probes[$1]=$(bound_port "$log" /healthz,/readyz)
}
lease() { kubectl get lease "$LEASE" -n "$DEPLOY_NS" -o "jsonpath={.spec.$1}"; }
leader() { local h; h=$(lease holderIdentity); h=${h#replica-}; echo "${h%%_*}"; }
other() { [[ $1 == a ]] && echo b || echo a; }
now() { date +%s.%N; }
await() { wait_for "$1" 300 "${@:2}" || die "timed out waiting for $1"; } # what command...
ready() { curl -fsS "http://127.0.0.1:${probes[$1]}/readyz"; }
new_holder() { [[ -n "$(lease holderIdentity)" && "$(lease holderIdentity)" != "$1" ]]; }
edit() { # replicas names...: one request for all of them
  local replicas=$1; shift
  kubectl patch foo -n "$ns" "$@" --type merge -p "{\"spec\":{\"replicas\":$replicas}}" >/dev/null
}
edited_deployments() { # since names...: when the last of them was written
  local since=$1; shift
  audit written "$UA" "$ns" "$since" 120 deployments "$@"
}
both_ready() { ready a && ready b; }

converge() { # fence
  log "fence $1: $N Foos, two replicas"
  create_foos "$ns" "$N"
  settle
  start_replica a
  start_replica b
  local start end
  read -r start end < <(audit wait-converged "$UA" "$ns" "$N" 1800)
  converged[$1]=$(elapsed "$start" "$end")
  await "both replicas ready" both_ready
  audit quiet "$UA" 10 1800 >/dev/null
}

idle_and_memory() {
  log "idle: ${IDLE}s"
  local from
  from=$(now)
  sleep "$IDLE"
  mapfile -t idle < <(audit count "$UA" "" "$from" "$(now)")
  rss_leader=$(rss "${pids[$(leader)]}")
  rss_standby=$(rss "${pids[$(other "$(leader)")]}")
}

failover() { # fence
  local first second old killed took termed
  first=$(leader)
  second=$(other "$first")
  log "fence $1: kill -9 of the leader ($first), 10 edits during the outage"
  old=$(lease holderIdentity)
  kill -KILL "${pids[$first]}"
  killed=$(now)
  edit 2 foo-{0..9}
  await "the standby to take the Lease" new_holder "$old"
  took=$(date -d "$(lease acquireTime)" +%s.%N)
  took_lease[$1]=$(elapsed "$killed" "$took")
  after_kill[$1]=$(elapsed "$took" "$(edited_deployments "$killed" foo-{0..9})")

  log "fence $1: replica $first back as a standby; SIGTERM of the leader ($second), 10 edits"
  start_replica "$first"
  await "replica $first ready" ready "$first"
  rss_new_standby[$1]=$(rss "${pids[$first]}")
  kill -TERM "${pids[$second]}"
  termed=$(now)
  edit 3 foo-{10..19}
  after_term[$1]=$(elapsed "$termed" "$(edited_deployments "$termed" foo-{10..19})")
  wait "${pids[$second]}" 2>/dev/null || true
  kill "${pids[$first]}" 2>/dev/null || true
  wait "${pids[$first]}" 2>/dev/null || true
}

last_fence=${FENCES##* }
for fence in $FENCES; do
  if [[ $fence == on ]]; then
    kubectl apply -f "$FENCE" >/dev/null
  else
    kubectl delete -f "$FENCE" --ignore-not-found >/dev/null
  fi
  # Each run in a namespace of its own, the runs before it left in place
  # (their deletion would load the plane), and with no Lease to wait out.
  ns="ha-fence-$fence"
  kubectl delete lease "$LEASE" -n "$DEPLOY_NS" --ignore-not-found >/dev/null
  converge "$fence"
  [[ $fence == "$last_fence" ]] && idle_and_memory
  failover "$fence"
done

per_minute() { calc %.1f "$1 * 60 / $2"; }
row() { # label array: the array's value for each fence
  local -n values=$2
  printf '%-66s' "$1"
  for fence in $FENCES; do printf ' %12s' "${values[$fence]}"; done
  echo
}
echo
echo "sample-controller benchmark, HA mode: N=$N Foos, two replicas with --leader-elect (default timing)"
echo
printf '%-66s' "leader fence (its binding, deploy/12-leader-fence-binding.yaml)"
for fence in $FENCES; do printf ' %12s' "$fence"; done
echo
row "converged (every Foo has its Deployment and status), s" converged
row "kill -9 of the leader -> standby takes the Lease, s" took_lease
row "new leader takes the Lease -> last of 10 edits in its Deployment, s" after_kill
row "SIGTERM of the leader -> last of 10 edits in its Deployment, s" after_term
row "RSS of a restarted standby, caches filled, MiB" rss_new_standby
if [[ " $FENCES " == *" on "* && " $FENCES " == *" off "* ]]; then
  printf '%-66s %s\n' "convergence with the fence / without" "$(calc %.3f "${converged[on]} / ${converged[off]}")x"
fi
echo
echo "with the fence $last_fence:"
printf '%-66s %s\n' "idle requests of both replicas, per minute (${IDLE}s)" "$(per_minute "${idle[0]}" "$IDLE")"
for line in "${idle[@]:1}"; do
  read -r n verb resource <<<"$line"
  printf '    %-62s %s\n' "$verb $resource" "$(per_minute "$n" "$IDLE")"
done
printf '%-66s %s\n' "RSS of the leader / of the standby" "$rss_leader / $rss_standby MiB"
