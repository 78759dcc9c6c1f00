#!/usr/bin/env bash
# Benchmark, high-availability mode: two replicas with --leader-elect, as
# deploy/ runs them, every request counted from the API server's audit log.
# Prints numbers; asserts nothing; not part of the tests.
#
#   MODE=ha hack/bench.sh                 # N=10000 Foos, IDLE=300 s
#   N=1000 IDLE=60 hack/bench-ha.sh
#
# In scale mode (no Deployment/ReplicaSet controllers), on one plane:
#  1. N Foos, then replicas a and b started; time until every Foo converged;
#  2. both idle for IDLE seconds: requests per minute by verb and resource;
#  3. memory of the leader and of the standby;
#  4. kill -9 of the leader, 10 Foos edited at once during the outage: the
#     seconds from the standby taking the Lease (its acquireTime) to the last
#     edit reaching its Deployment (its patch, in the audit log);
#  5. the killed replica back as a standby (ready: caches filled), then
#     SIGTERM of the leader (a graceful hand-over) and 10 more edits: the
#     seconds from the SIGTERM to the last edit reaching its Deployment.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"
N="${N:-10000}"
IDLE="${IDLE:-300}"
NS=ha
LEASE=sample-controller
declare -A pids probes

trap 'kill "${pids[@]}" 2>/dev/null || true; hack/local-down.sh' EXIT
bench_plane 1

port_logged() { [[ -n "$(bound_port "$1" /healthz,/readyz)" ]]; } # log

start_replica() { # name: as deploy/ runs it, identity prefixed with its name
  local log=".local/bench-ha-$1.log"
  HOSTNAME="replica-$1" "$BIN" --namespace "$NS" --leader-elect --leader-election-namespace "$NS" \
    --metrics-bind-address 127.0.0.1:0 --health-probe-bind-address 127.0.0.1:0 > "$log" 2>&1 &
  pids[$1]=$!
  wait_for "replica $1's probe port" 60 port_logged "$log" || die "replica $1 did not start"
  probes[$1]=$(bound_port "$log" /healthz,/readyz)
}
lease() { kubectl get lease "$LEASE" -n "$NS" -o "jsonpath={.spec.$1}"; }
leader() { local h; h=$(lease holderIdentity); h=${h#replica-}; echo "${h%%_*}"; }
other() { [[ $1 == a ]] && echo b || echo a; }
now() { date +%s.%N; }
await() { wait_for "$1" 300 "${@:2}" || die "timed out waiting for $1"; } # what command...
ready() { curl -fsS "http://127.0.0.1:${probes[$1]}/readyz"; }
new_holder() { [[ -n "$(lease holderIdentity)" && "$(lease holderIdentity)" != "$1" ]]; }
edit() { # replicas names...: one request for all of them
  local replicas=$1; shift
  kubectl patch foo -n "$NS" "$@" --type merge -p "{\"spec\":{\"replicas\":$replicas}}" >/dev/null
}
edited_deployments() { # since names...: when the last of them was written
  local since=$1; shift
  audit written "$UA" "$NS" "$since" 120 deployments "$@"
}
both_ready() { ready a && ready b; }

log "$N Foos, two replicas"
create_foos "$NS" "$N"
settle
start_replica a
start_replica b
read -r start converged < <(audit wait-converged "$UA" "$NS" "$N" 1800)
await "both replicas ready" both_ready
audit quiet "$UA" 10 1800 >/dev/null

log "idle: ${IDLE}s"
idle_from=$(now)
sleep "$IDLE"
mapfile -t idle < <(audit count "$UA" "" "$idle_from" "$(now)")
first=$(leader)
second=$(other "$first")
rss_leader=$(rss "${pids[$first]}")
rss_standby=$(rss "${pids[$second]}")

log "kill -9 of the leader ($first), 10 edits during the outage"
old=$(lease holderIdentity)
kill -KILL "${pids[$first]}"
killed=$(now)
edit 2 foo-{0..9}
await "the standby to take the Lease" new_holder "$old"
took=$(date -d "$(lease acquireTime)" +%s.%N)
last=$(edited_deployments "$killed" foo-{0..9})

log "replica $first back as a standby; SIGTERM of the leader ($second), 10 edits"
start_replica "$first"
await "replica $first ready" ready "$first"
rss_new_standby=$(rss "${pids[$first]}")
kill -TERM "${pids[$second]}"
termed=$(now)
edit 3 foo-{10..19}
last_term=$(edited_deployments "$termed" foo-{10..19})
wait "${pids[$second]}" 2>/dev/null || true

per_minute() { calc %.1f "$1 * 60 / $2"; }
echo
echo "sample-controller benchmark, HA mode: N=$N Foos, two replicas with --leader-elect (default timing)"
echo
printf '%-66s %s\n' "converged (every Foo has its Deployment and status)" "$(elapsed "$start" "$converged")s"
printf '%-66s %s\n' "idle requests of both replicas, per minute (${IDLE}s)" "$(per_minute "${idle[0]}" "$IDLE")"
for line in "${idle[@]:1}"; do
  read -r n verb resource <<<"$line"
  printf '    %-62s %s\n' "$verb $resource" "$(per_minute "$n" "$IDLE")"
done
printf '%-66s %s\n' "RSS of the leader / of the standby" "$rss_leader / $rss_standby MiB"
printf '%-66s %s\n' "kill -9 of the leader -> standby takes the Lease" "$(elapsed "$killed" "$took")s"
printf '%-66s %s\n' "new leader takes the Lease -> last of 10 edits in its Deployment" "$(elapsed "$took" "$last")s"
printf '%-66s %s\n' "SIGTERM of the leader -> last of 10 edits in its Deployment" "$(elapsed "$termed" "$last_term")s"
printf '%-66s %s\n' "RSS of a restarted standby, caches filled" "$rss_new_standby MiB"
