#!/usr/bin/env bash
# Stop the control plane started by hack/local-up.sh (same LOCAL_UP_DIR) and
# remove its state. Leaves no process behind.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DIR="$PLANE_DIR"
[[ -d "$DIR" ]] || exit 0

# Reverse start order, so nothing logs errors about what went first.
for name in kwok kube-scheduler kube-controller-manager kube-apiserver etcd; do
  pidfile="$DIR/$name.pid"
  [[ -f "$pidfile" ]] || continue
  pid="$(cat "$pidfile")"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
done
rm -rf "$DIR"
log "control plane stopped"
