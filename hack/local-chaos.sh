#!/usr/bin/env bash
# Fault injection on a running local control plane (hack/local-up.sh, same
# LOCAL_UP_DIR), for the chaos tests and for trying failures by hand:
#
#   hack/local-chaos.sh kill  COMPONENT   SIGKILL it: no clean shutdown
#   hack/local-chaos.sh start COMPONENT   start it again with the same flags
#                                          and data; return once it serves
#
# COMPONENT: one of hack/lib.sh's PLANE_BINARIES (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kwok).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DIR="$PLANE_DIR"
(( $# == 2 )) || die "usage: $0 kill|start $(IFS='|'; echo "${PLANE_BINARIES[*]}")"
action=$1 name=$2
[[ -f "$DIR/$name.cmd" ]] || die "no $name in $DIR (start the plane with hack/local-up.sh)"
# shellcheck source=/dev/null
source "$DIR/env"

case $action in
  kill)
    pid="$(cat "$DIR/$name.pid")"
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
    ;;
  start)
    setsid bash -c "exec $(cat "$DIR/$name.cmd")" >>"$DIR/logs/$name.log" 2>&1 < /dev/null &
    echo $! > "$DIR/$name.pid"
    for _ in $(seq 1 1200); do
      component_serving "$name" >/dev/null 2>&1 && exit 0
      sleep 0.05
    done
    die "$name did not serve within 60s after restart (log: $DIR/logs/$name.log)"
    ;;
  *) die "unknown action $action (kill or start)" ;;
esac
