#!/usr/bin/env bash
# What the test command's integration tests need from Go, built one after
# the other in the background while the Rust side builds and tests:
#
#   hack/build-planes.sh DIR MINOR...
#
# the control plane of the first MINOR, the test registry, then the planes of
# the other minors, each at a lower CPU priority (nice 10) because the first
# plane's test suites run beside it. Each item writes DIR/<item>.done when it
# ends: "<exit code> <wall seconds> <CPU seconds>", so hack/test.sh can start a
# minor's suites as soon as its plane is there and print what each build cost;
# its output goes to DIR/<item>.log. Items: plane-<minor>, registry. It
# writes its process id to DIR/pid first: hack/test.sh starts it with
# `setsid -f`, which does not say it.
set -uo pipefail
dir=$1; shift
echo $$ >"$dir/pid"
hack="$(dirname "${BASH_SOURCE[0]}")"

# CPU seconds (user + system) this shell's finished children have used.
children_cpu() {
  local -a t
  mapfile -t t < <(times)
  awk '{ for (i = 1; i <= NF; i++) { split($i, p, /[ms]/); s += p[1] * 60 + p[2] } } END { printf "%d", s }' <<<"${t[1]}"
}

build() { # item niceness command...
  local item=$1 niceness=$2; shift 2
  local start=$SECONDS cpu0 rc=0
  cpu0=$(children_cpu)
  nice -n "$niceness" "$@" >"$dir/$item.log" 2>&1 || rc=$?
  echo "$rc $((SECONDS - start)) $(($(children_cpu) - cpu0))" >"$dir/$item.done.tmp"
  mv "$dir/$item.done.tmp" "$dir/$item.done"
}

first=$1; shift
KUBE_MINOR=$first build "plane-$first" 0 "$hack/build-control-plane.sh"
build registry 0 "$hack/build-registry.sh"
for minor in "$@"; do
  KUBE_MINOR=$minor build "plane-$minor" 10 "$hack/build-control-plane.sh"
done
