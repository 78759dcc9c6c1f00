#!/usr/bin/env bash
# What the test command's integration tests need from Go, built one after
# the other in the background while the Rust side builds and tests:
#
#   hack/build-planes.sh DIR MINOR...
#
# the control plane of the first MINOR, then the planes of the other minors
# and last the test registry (needed by the image tests only, which run
# last), these at a lower CPU priority (nice 10), because the first plane's
# test suites run beside them. Each item is run by
# hack/background.sh (items plane-<minor>, registry: DIR/<item>.done says
# how it went), so hack/test.sh can start a minor's suites as soon as its
# plane is there. Writes its own process group to DIR/planes.pid.
set -uo pipefail
dir=$1 first=$2; shift 2
echo $$ >"$dir/planes.pid"
hack="$(dirname "${BASH_SOURCE[0]}")"
KUBE_MINOR=$first "$hack/background.sh" "$dir" "plane-$first" 0 "$hack/build-control-plane.sh"
for minor in "$@"; do
  KUBE_MINOR=$minor "$hack/background.sh" "$dir" "plane-$minor" 10 "$hack/build-control-plane.sh"
done
"$hack/background.sh" "$dir" registry 10 "$hack/build-registry.sh"
