#!/usr/bin/env bash
# The peer benchmark (MODE=peers hack/bench.sh): this operator beside the
# operator a user would otherwise scaffold, the controller-runtime reference
# (hack/tools/controller-runtime, built from its Go module like the plane),
# beside upstream's controller on client-go with its rate limit lifted (the
# client-go reference, hack/tools/client-go; its 30 s resync off, CG_RESYNC,
# or it is never quiet), and beside the floor holding the controller's two watches (benches/floor.rs,
# the limit a controller can reach), on the benchmark plane. Every request is
# counted from the API server's audit log by User-Agent. Prints numbers;
# asserts nothing; not part of the tests.
#
#   MODE=peers hack/bench.sh                     # N=10000 Foos, RUNS=2
#   MODE=peers N=100000 RUNS=1 hack/bench.sh
#   MODE=peers N=100000 RUNS=1 PEERS=ours WATCHING=0 hack/bench.sh   # ours alone
#
#  1. RUNS rounds, who goes first alternating from round to round: for each
#     client, N Foos created in a namespace of its own, then the client
#     started (each operator with --workers WORKERS / MaxConcurrentReconciles,
#     scoped to that namespace): time to converge (every Foo has its
#     Deployment and a status), and each round's ratio to the watching
#     floor's; requests until it is quiet; resident memory once quiet and
#     its peak. In the last round, each operator then sits through a WINDOW
#     with nothing to do (its requests counted) and EDITS spec.replicas
#     edits timed from a watch (benches/edit_latency.rs).
#  2. Restart: each operator started cold on the Foos it converged, with
#     STORM_EDITS edits made by kubectl, one every SPREAD/STORM_EDITS
#     seconds from its start. From each edit, or from the caches being
#     ready if that is later (the operator's log), to its Deployment's
#     write (the audit log): p50, p99, max.
#  3. Failover: a leader and a standby of each operator, leader election on
#     and the Lease released on SIGTERM; once the standby is ready (ours:
#     its caches filled; controller-runtime's manager and the client-go
#     reference start their watches only once they lead, so their standbys
#     are cold), the leader is stopped
#     and, once it has exited, the same edits are made. From each edit, or
#     from the standby's taking the Lease if that is later (its log), to
#     its Deployment's write.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"
N="${N:-10000}"
RUNS="${RUNS:-2}"
WINDOW="${WINDOW:-60}"
EDITS="${EDITS:-20}"
STORM_EDITS="${STORM_EDITS:-20}"
SPREAD="${SPREAD:-10}"
WORKERS="${WORKERS:-16}"
SCALE="${SCALE:-$(( N >= 5000 ))}"
CR_REFERENCE="$CACHE_ROOT/reference/controller-runtime-reference"
CG_REFERENCE="$CACHE_ROOT/reference/client-go-controller-reference"
CG_RESYNC="${CG_RESYNC:-0}" # the client-go reference's resync period; upstream's is 30s
PEERS="${PEERS:-ours controller-runtime client-go}" # the operators run, in this order
WATCHING="${WATCHING:-1}" # the floor holding the controller's two watches; 0: none
read -r -a OPERATORS <<<"$PEERS"
declare -A NAME_OF=([ours]="sample-controller" [controller-runtime]="controller-runtime v0.25.2"
  [client-go]="upstream's, client-go unthrottled")
declare -A UA_OF=([ours]="$UA" [controller-runtime]="controller-runtime-reference/"
  [client-go]="client-go-controller-reference/" [wfloor]="sample-controller-floor/")
# The log lines that say an operator's caches are ready (its syncs start),
# and that it took the Lease.
declare -A READY_LINE=([ours]="caches synced" [controller-runtime]="Starting workers" [client-go]="Starting workers")
declare -A LEADING_LINE=([ours]="leading" [controller-runtime]="Successfully acquired lease"
  [client-go]="Successfully acquired lease")
EDITOR_UA="kubectl/"
code=(src benches Cargo.toml Cargo.lock hack/tools/controller-runtime hack/tools/client-go)
build=$(git log -1 --format=%h -- "${code[@]}")
git diff --quiet HEAD -- "${code[@]}" || build+=-modified

pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; hack/local-down.sh' EXIT
bench_plane "$SCALE"
if [[ " $PEERS " == *" controller-runtime "* ]]; then
  log "controller-runtime reference build"
  mkdir -p "$(dirname "$CR_REFERENCE")"
  (cd hack/tools/controller-runtime && go_build -o "$CR_REFERENCE" .)
fi
if [[ " $PEERS " == *" client-go "* ]]; then
  log "client-go reference build"
  mkdir -p "$(dirname "$CG_REFERENCE")"
  (cd hack/tools/client-go && go_build -o "$CG_REFERENCE" .)
fi
cargo bench --locked --quiet --no-run --bench floor --bench edit_latency

start_operator() { # who namespace logfile probe-address [flags...]; sets $cpid
  local who=$1 ns=$2 out=$3 probe=$4
  shift 4
  case $who in
    ours) "$BIN" --namespace "$ns" --workers "$WORKERS" --log-format json --metrics-bind-address 0 \
            --health-probe-bind-address "$probe" "$@" > "$out" 2>&1 & ;;
    controller-runtime) "$CR_REFERENCE" --namespace "$ns" --workers "$WORKERS" \
            --health-probe-bind-address "$probe" "$@" > "$out" 2>&1 & ;;
    client-go) "$CG_REFERENCE" --namespace "$ns" --workers "$WORKERS" --resync-period "$CG_RESYNC" \
            --health-probe-bind-address "$probe" "$@" > "$out" 2>&1 & ;;
  esac
  cpid=$!
  pids+=("$cpid")
}
stop_operator() { # pid: as SIGTERM does
  kill -TERM "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  local p kept=()
  for p in "${pids[@]}"; do [[ $p == "$1" ]] || kept+=("$p"); done
  pids=("${kept[@]}")
}
# Run a command that waits for operator PID's work while PID runs: if PID
# exits first (a crash), fail with the end of its LOG at once, rather than
# when the command's own timeout (up to 30 min) runs out.
while_alive() { # pid log command...
  local pid=$1 out=$2 waiter
  shift 2
  "$@" &
  waiter=$!
  while kill -0 "$waiter" 2>/dev/null; do
    # An exited child stays a zombie until waited for: read its state.
    if [[ ! -e /proc/$pid || $(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null) == Z ]]; then
      kill "$waiter" 2>/dev/null || true
      echo "the operator (pid $pid) exited while the benchmark waited; the end of $out:" >&2
      tail -n 20 "$out" >&2
      return 1
    fi
    sleep 1
  done
  wait "$waiter"
}
leader_flags() { # namespace lease
  echo --leader-elect --leader-election-namespace "$1" --leader-election-id "$2"
}
# When a line containing TEXT first shows in a JSON log (ours: "timestamp";
# controller-runtime's zap and the client-go reference: "ts"; all RFC 3339 to
# the nanosecond), in epoch
# seconds; waits for it up to TIMEOUT seconds.
log_time() { # file text timeout
  python3 - "$@" <<'PY'
import datetime, json, sys, time
path, text, deadline = sys.argv[1], sys.argv[2], time.time() + float(sys.argv[3])
while time.time() < deadline:
    for line in open(path, encoding="utf-8", errors="replace"):
        if text not in line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        at = entry.get("ts") or entry.get("timestamp")
        if isinstance(at, str):
            at = datetime.datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()
        print(f"{at:.6f}")
        sys.exit(0)
    time.sleep(0.2)
sys.exit(f"no {text!r} in {path}")
PY
}
# STORM_EDITS edits of spec.replicas to REPLICAS, foo-100 onwards, one every
# SPREAD/STORM_EDITS seconds, each by its own kubectl (the audit log times them).
edit_storm() { # namespace replicas
  local i gap editors=()
  gap=$(calc %.3f "$SPREAD / $STORM_EDITS")
  for i in $(seq 100 $((100 + STORM_EDITS - 1))); do
    kubectl -n "$1" patch foo "foo-$i" --type merge -p "{\"spec\":{\"replicas\":$2}}" >/dev/null &
    editors+=($!)
    sleep "$gap"
  done
  wait "${editors[@]}"
}
# The edit storm to REPLICAS while the operator ($cpid) starts or takes
# over, timed: prints the seconds from FROM to LINE in its LOG (its caches
# ready, or the Lease taken), then each edit's latency from the edit or that
# line, the later (audit.py edits).
storm_timed() { # who namespace replicas from log line
  local at
  edit_storm "$2" "$3"
  at=$(while_alive "$cpid" "$5" log_time "$5" "$6" 1800)
  elapsed "$4" "$at"
  while_alive "$cpid" "$5" audit edits "$EDITOR_UA" "${UA_OF[$1]}" "$2" "$4" "$at" "$STORM_EDITS" 1800
}
declare -A requests request_lines rss_quiet rss_peak idle idle_lines edit_latency

# One client converging N new Foos in its own namespace. The floor runs to
# its end; an operator is stopped after, except in the last round, where
# it first sits through the idle window and the edits.
converge() { # who run
  local who=$1 run=$2 ns="peer-$1-$2" ua=${UA_OF[$1]} t0 t1 quiet_at
  log "$who: $N Foos (run $run of $RUNS)"
  create_foos "$ns" "$N"
  settle
  local converged
  if [[ $who == wfloor ]]; then
    FLOOR_WATCHES=1 cargo bench --locked --quiet --bench floor -- "$ns" "$WORKERS" >&2
    converged=$(audit wait-converged "$ua" "$ns" "$N" 1800)
  else
    start_operator "$who" "$ns" ".local/peers-$who-$run.log" 0
    converged=$(while_alive "$cpid" ".local/peers-$who-$run.log" audit wait-converged "$ua" "$ns" "$N" 1800)
  fi
  read -r t0 t1 <<<"$converged"
  record "$who" "$(elapsed "$t0" "$t1")"
  audit curve "$ua" "$ns" > ".local/bench-curve-$ns.txt"
  [[ $who == wfloor ]] && { clear_run "$ns"; return; }
  quiet_at=$(audit quiet "$ua" 10 1800)
  mapfile -t counted < <(audit count "$ua" "$ns" "$t0" "$(calc %.3f "$quiet_at + 1")")
  requests[$who]=${counted[0]}
  request_lines[$who]=$(printf '    %s\n' "${counted[@]:1}")
  rss_quiet[$who]=$(rss "$cpid")
  rss_peak[$who]=$(hwm "$cpid")
  # As it comes, so that a run cut short still says what it measured.
  log "$who: converged in ${last[$who]}s; ${requests[$who]} requests until quiet; RSS quiet / peak ${rss_quiet[$who]} / ${rss_peak[$who]} MiB"
  if (( run == RUNS )); then
    local from
    from=$(date +%s.%N)
    log "$who: idle for ${WINDOW}s"
    sleep "$WINDOW"
    mapfile -t counted < <(audit count "$ua" "" "$from" "$(calc %.3f "$from + $WINDOW")")
    idle[$who]=${counted[0]}
    idle_lines[$who]=$(printf '    %s\n' "${counted[@]:1}")
    log "$who: $EDITS edits"
    edit_latency[$who]=$(cargo bench --locked --quiet --bench edit_latency -- "$ns" "$EDITS")
    log "$who: ${idle[$who]} requests idle; edits: ${edit_latency[$who]}"
  fi
  stop_operator "$cpid"
  (( run == RUNS )) || clear_run "$ns"
}

declare -A in_turns # who: its ratios to the watching floor, round by round
for run in $(seq 1 "$RUNS"); do
  order=()
  (( WATCHING )) && order+=(wfloor)
  order+=("${OPERATORS[@]}")
  if (( run % 2 == 0 )); then
    for ((i = ${#order[@]} - 1; i >= 0; i--)); do converge "${order[i]}" "$run"; done
  else
    for who in "${order[@]}"; do converge "$who" "$run"; done
  fi
  if (( WATCHING )); then
    for who in "${OPERATORS[@]}"; do in_turns[$who]+="$(calc %.2f "${last[$who]} / ${last[wfloor]}") "; done
  fi
done

declare -A restart_ready restart_edits failover_taken failover_edits
for who in "${OPERATORS[@]}"; do
  ns="peer-$who-$RUNS"
  ua=${UA_OF[$who]}
  log "$who: a cold start with $STORM_EDITS edits"
  from=$(date +%s.%N)
  start_operator "$who" "$ns" ".local/peers-$who-restart.log" 0
  timed=$(storm_timed "$who" "$ns" 7 "$from" ".local/peers-$who-restart.log" "${READY_LINE[$who]}")
  restart_ready[$who]=${timed%%$'\n'*}
  restart_edits[$who]=${timed#*$'\n'}
  log "$who: cold start: caches ready after ${restart_ready[$who]}s; edits (p50 p99 max from ready, then from the edit): ${restart_edits[$who]}"
  stop_operator "$cpid"

  log "$who: a failover with $STORM_EDITS edits"
  lease="peer-failover-$who"
  # shellcheck disable=SC2046 # leader_flags prints separate flags
  start_operator "$who" "$ns" ".local/peers-$who-leader.log" 0 $(leader_flags "$ns" "$lease")
  leader=$cpid
  log_time ".local/peers-$who-leader.log" "${LEADING_LINE[$who]}" 600 >/dev/null
  log_time ".local/peers-$who-leader.log" "${READY_LINE[$who]}" 1800 >/dev/null
  audit quiet "$ua" 5 1800 >/dev/null
  port=$(free_port)
  # shellcheck disable=SC2046
  start_operator "$who" "$ns" ".local/peers-$who-standby.log" "127.0.0.1:$port" $(leader_flags "$ns" "$lease")
  wait_for "the $who standby ready" 1800 curl -fs "http://127.0.0.1:$port/readyz"
  # From the leader's exit (it releases the Lease first), so that every
  # Deployment write after it is the standby's.
  stop_operator "$leader"
  from=$(date +%s.%N)
  timed=$(storm_timed "$who" "$ns" 8 "$from" ".local/peers-$who-standby.log" "${LEADING_LINE[$who]}")
  failover_taken[$who]=${timed%%$'\n'*}
  failover_edits[$who]=${timed#*$'\n'}
  log "$who: failover: Lease taken after ${failover_taken[$who]}s; edits (p50 p99 max from taken, then from the edit): ${failover_edits[$who]}"
  stop_operator "$cpid"
done

# Of 20 edits the p99 is the slowest: p50 and max only.
ms() { # "p50 p99 max p50 p99 max" (audit.py edits) offset -> "p50 X ms, max Z ms"
  awk -v o="$2" '{ printf "p50 %.0f ms, max %.0f ms", $(o + 1) * 1000, $(o + 3) * 1000 }' <<<"$1"
}
# One line: a label, then for each operator what CELL (a function of it) prints.
row() { # label cell
  local line who
  line=$(printf '%-46s' "$1")
  for who in "${OPERATORS[@]}"; do line+=$(printf ' %-36s' "$("$2" "$who")"); done
  echo "$line"
}
name() { echo "${NAME_OF[$1]}"; }
converged() { echo "${best[$1]}s (${runs[$1]})"; }
to_floor() { echo "${in_turns[$1]}(median $(median ${in_turns[$1]})x)"; }
until_quiet() { echo "${requests[$1]} ($(calc %.2f "${requests[$1]} / $N"))"; }
idle_requests() { echo "${idle[$1]}"; }
memory() { echo "${rss_quiet[$1]} / ${rss_peak[$1]}"; }
idle_edit() { echo "${edit_latency[$1]#*: }"; }
ready_after() { echo "$(calc %.2f "${restart_ready[$1]}")s"; }
restart_from_ready() { ms "${restart_edits[$1]}" 0; }
restart_from_edit() { ms "${restart_edits[$1]}" 3; }
taken_after() { echo "$(calc %.2f "${failover_taken[$1]}")s"; }
failover_from_taken() { ms "${failover_edits[$1]}" 0; }
failover_from_edit() { ms "${failover_edits[$1]}" 3; }
summary=".local/bench-peers-$build-N$N.txt"
{
echo
echo "peer benchmark (build $build, $(date -u +%F)): N=$N Foos, $WORKERS workers each$( ((SCALE)) && echo ', scale mode (no Deployment/ReplicaSet controllers)')"
echo
row "" name
row "converged (best of $RUNS; runs)" converged
if (( WATCHING )); then
  echo "the floor holding the two watches: ${best[wfloor]}s (runs: ${runs[wfloor]})"
  row "  / that floor, round by round" to_floor
fi
row "requests until quiet (per Foo)" until_quiet
row "requests in ${WINDOW}s with nothing to do" idle_requests
row "RSS once quiet / peak (MiB)" memory
row "spec.replicas edit -> Deployment ($EDITS, idle)" idle_edit
row "cold start: caches ready after" ready_after
row "  $STORM_EDITS edits -> Deployment, from ready" restart_from_ready
row "  the same, from the edit" restart_from_edit
row "failover: Lease taken after the leader exited" taken_after
row "  $STORM_EDITS edits -> Deployment, from taken" failover_from_taken
row "  the same, from the edit" failover_from_edit
for who in "${OPERATORS[@]}"; do
  echo
  echo "$who: requests until quiet, by verb and resource"
  echo "${request_lines[$who]}"
  echo "$who: requests in the idle window"
  echo "${idle_lines[$who]}"
done
} | tee "$summary"
